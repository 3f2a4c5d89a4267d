//! The core API every op builds on: descriptors, buffers, handles and errors.

mod common;

use oxidnn::*;

#[test]
fn descriptors_validate_their_shape() {
    assert!(matches!(
        TensorDescriptor::new(DataType::F32, &[], &[]),
        Err(Error::BadParam { arg: "dims", .. })
    ));
    assert!(matches!(
        TensorDescriptor::packed(DataType::F32, &[1; 9]),
        Err(Error::BadParam { arg: "dims", .. })
    ));
    assert!(matches!(
        TensorDescriptor::new(DataType::F32, &[2, 0], &[1, 1]),
        Err(Error::BadParam { arg: "dims", .. })
    ));
    assert!(matches!(
        TensorDescriptor::new(DataType::F32, &[2, 3], &[1]),
        Err(Error::BadParam { arg: "strides", .. })
    ));
    assert!(matches!(
        TensorDescriptor::new(DataType::F32, &[2, 3], &[0, 1]),
        Err(Error::BadParam { arg: "strides", .. })
    ));
    assert!(matches!(
        TensorDescriptor::new(DataType::F32, &[usize::MAX, 2], &[1, 1]),
        Err(Error::BadParam { .. })
    ));
    let d = TensorDescriptor::packed(DataType::BF16, &[2, 3, 4]).unwrap();
    assert_eq!(
        (d.strides(), d.size_bytes(), d.element_count()),
        (&[12, 4, 1][..], 48, 24)
    );
    assert!(d.is_dense() && d.is_non_overlapping());
}

#[test]
fn layouts_have_the_strides_cudnn_uses() {
    let nchw = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5).unwrap();
    let nhwc = TensorDescriptor::nhwc(DataType::F32, 2, 3, 4, 5).unwrap();
    assert_eq!(nchw.strides(), &[60, 20, 5, 1]);
    assert_eq!(nhwc.strides(), &[60, 1, 15, 3]);
    let ndhwc =
        TensorDescriptor::spatial(DataType::F16, 2, 3, &[4, 5, 6], Layout::ChannelsLast).unwrap();
    assert_eq!(ndhwc.strides(), &[360, 1, 90, 18, 3]);
    assert_eq!(ndhwc.problem_string(), "f16:2x3x4x5x6:360x1x90x18x3");
}

#[test]
fn overlap_is_detected_and_gaps_are_not_overlap() {
    let overlapping = TensorDescriptor::new(DataType::F32, &[3, 4], &[2, 1]).unwrap();
    assert!(!overlapping.is_non_overlapping());
    let padded = TensorDescriptor::new(DataType::F32, &[3, 4], &[5, 1]).unwrap();
    assert!(padded.is_non_overlapping() && !padded.is_dense());
    let broadcast_like = TensorDescriptor::new(DataType::F32, &[1, 4], &[1, 1]).unwrap();
    assert!(broadcast_like.is_non_overlapping());
}

#[test]
fn buffers_round_trip_every_dtype_through_the_cpu_handle() {
    let h = Handle::cpu();
    for dt in DataType::ALL {
        let d = TensorDescriptor::new(dt, &[2, 3], &[1, 3]).unwrap();
        let t = HostTensor::from_fn(d, |i| (i[0] * 3 + i[1]) as f64 * 0.5 - 1.0);
        let buf = h.upload_tensor(&t).unwrap();
        assert_eq!(buf.len_bytes(), d.size_bytes());
        assert_eq!(h.download_tensor(&d, &buf).unwrap().logical(), t.logical());
    }
    let short = h.alloc_bytes(3).unwrap();
    let d = TensorDescriptor::packed(DataType::F32, &[1]).unwrap();
    assert!(matches!(
        h.download_tensor(&d, &short),
        Err(Error::BufferTooSmall { .. })
    ));
    let mut small = h.alloc_bytes(2).unwrap();
    assert!(matches!(
        h.write(&mut small, &[1.0f32]),
        Err(Error::BufferTooSmall { .. })
    ));
}

#[test]
fn gpu_buffers_round_trip_and_streams_can_be_set() {
    common::with_gpu("gpu_buffers_round_trip_and_streams_can_be_set", |_| {
        let mut h = Handle::new().unwrap();
        let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25).collect();
        let buf = h.upload(&data).unwrap();
        assert!(buf.is_device() && buf.device_address().is_some());
        assert_eq!(h.read::<f32>(&buf).unwrap(), data);
        let s = h.new_stream().unwrap();
        h.set_stream(s).unwrap();
        let d = TensorDescriptor::packed(DataType::F32, &[1000]).unwrap();
        let mut y = h.alloc(&d).unwrap();
        activation_forward(
            &h,
            &ActivationDescriptor::relu(),
            1.0,
            &d,
            &buf,
            0.0,
            &d,
            &mut y,
        )
        .unwrap();
        assert_eq!(h.read::<f32>(&y).unwrap(), data);
        // Buffers of another handle are refused.
        let other = Handle::cpu();
        let foreign = other.alloc(&d).unwrap();
        assert!(matches!(
            activation_forward(
                &h,
                &ActivationDescriptor::relu(),
                1.0,
                &d,
                &foreign,
                0.0,
                &d,
                &mut y
            ),
            Err(Error::BadParam { arg: "x", .. })
        ));
    });
}

#[test]
fn cpu_handle_has_no_stream() {
    let mut h = Handle::cpu();
    assert!(h.stream().is_none() && !h.is_gpu());
    assert!(h.new_stream().is_err());
    if let Some(g) = common::gpu() {
        let s = g.new_stream().unwrap();
        assert!(matches!(
            h.set_stream(s),
            Err(Error::BadParam { arg: "stream", .. })
        ));
    }
}

#[test]
fn errors_name_the_argument_and_the_mismatch() {
    let e = Error::BufferTooSmall {
        arg: "x",
        required_bytes: 40,
        got_bytes: 39,
    };
    assert_eq!(
        e.to_string(),
        "buffer `x` is too small: its descriptor spans 40 bytes, the buffer holds 39"
    );
    let d = TensorDescriptor::packed(DataType::F32, &[2]).unwrap();
    let h = Handle::cpu();
    let x = h.alloc(&d).unwrap();
    let mut y = h.alloc(&d.with_dtype(DataType::F16).unwrap()).unwrap();
    let e = transform_tensor(
        &h,
        1.0,
        &d,
        &x,
        0.0,
        &TensorDescriptor::packed(DataType::F16, &[3]).unwrap(),
        &mut y,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("[3]") && e.to_string().contains("[2]"),
        "{e}"
    );
}

#[test]
fn every_kernel_the_host_names_is_in_its_family_module() {
    assert!(!kernels::ALL.is_empty());
    for name in kernels::ALL {
        let family = name.split('_').next().unwrap();
        let modules: Vec<_> = ptx_modules().iter().filter(|(f, _)| *f == family).collect();
        assert_eq!(modules.len(), 1, "{name}: one module per family");
        assert!(modules[0].1.contains(&format!(".entry {name}(")), "{name}");
    }
    // Every module holds only its own family's entries.
    for (family, ptx) in ptx_modules() {
        for line in ptx
            .lines()
            .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        {
            assert!(line.starts_with(&format!("{family}_")), "{family}: {line}");
        }
    }
    // The Hopper family comes from the sm_90a build, every other from the main target's.
    for (family, ptx) in ptx_modules() {
        let sm90a = ptx.lines().any(|l| l.trim() == ".target sm_90a");
        if *family == "wgmma" {
            assert!(sm90a, "the wgmma module targets sm_90a");
        } else if kernels::PTX_ARCH != "sm_90a" {
            assert!(!sm90a, "{family} targets {}", kernels::PTX_ARCH);
        }
    }
    assert!(kernels::lookup("wgmma_matmul_128x256_kn_f16").is_some());
    // Dispatch covers every GPU dtype for every family.
    for dt in DataType::GPU {
        assert!(
            kernels::activation_fwd_packed(dt).is_some() && kernels::reduce_block(dt).is_some()
        );
        for to in DataType::GPU {
            assert!(kernels::transpose(dt, to).is_some());
        }
    }
    assert!(kernels::activation_fwd_packed(DataType::F64).is_none());
}
