//! op_tensor, add_tensor, scale_tensor, set_tensor and transform_tensor: exact CPU
//! examples, the GPU against the reference on drawn shapes/layouts/broadcasts/dtypes, and
//! bad inputs.

mod common;

use common::*;
use oxidnn::reference::tensor_ops as reference;
use oxidnn::*;
use proptest::prelude::*;

#[test]
fn cpu_add_tensor_broadcasts_a_per_channel_bias() {
    let h = Handle::cpu();
    let yd = TensorDescriptor::nchw(DataType::F32, 2, 3, 2, 2).unwrap();
    let bd = TensorDescriptor::nchw(DataType::F32, 1, 3, 1, 1).unwrap();
    let b = h.upload(&[10.0f32, 20.0, 30.0]).unwrap();
    let mut y = h
        .upload_tensor(&HostTensor::from_fn(yd, |i| i[3] as f64))
        .unwrap();
    add_tensor(&h, 1.0, &bd, &b, 2.0, &yd, &mut y).unwrap();
    let out = h.download_tensor(&yd, &y).unwrap();
    assert_eq!(out.get(&[1, 2, 1, 1]), 32.0);
    assert_eq!(out.get(&[0, 0, 0, 0]), 10.0);
}

#[test]
fn cpu_transform_round_trips_nchw_nhwc_exactly() {
    let h = Handle::cpu();
    let a = TensorDescriptor::nchw(DataType::F32, 2, 5, 3, 7).unwrap();
    let b = TensorDescriptor::nhwc(DataType::F16, 2, 5, 3, 7).unwrap();
    let t = HostTensor::from_fn(a, |i| (i[0] * 105 + i[1] * 21 + i[2] * 7 + i[3]) as f64);
    let x = h.upload_tensor(&t).unwrap();
    let mut mid = h.alloc(&b).unwrap();
    let mut back = h.alloc(&a).unwrap();
    transform_tensor(&h, 1.0, &a, &x, 0.0, &b, &mut mid).unwrap();
    transform_tensor(&h, 1.0, &b, &mid, 0.0, &a, &mut back).unwrap();
    assert_eq!(h.download_tensor(&a, &back).unwrap(), t);
}

#[test]
fn cpu_op_tensor_computes_each_op() {
    let h = Handle::cpu();
    let d = TensorDescriptor::packed(DataType::F32, &[3]).unwrap();
    let a = h.upload(&[1.0f32, 4.0, 9.0]).unwrap();
    let b = h.upload(&[2.0f32, 2.0, 2.0]).unwrap();
    let want: [(OpTensorOp, [f32; 3]); 6] = [
        (OpTensorOp::Add, [3.0, 6.0, 11.0]),
        (OpTensorOp::Mul, [2.0, 8.0, 18.0]),
        (OpTensorOp::Min, [1.0, 2.0, 2.0]),
        (OpTensorOp::Max, [2.0, 4.0, 9.0]),
        (OpTensorOp::Sqrt, [1.0, 2.0, 3.0]),
        (OpTensorOp::Not, [0.0, -3.0, -8.0]),
    ];
    for (op, w) in want {
        let mut c = h.alloc(&d).unwrap();
        op_tensor(&h, op, 1.0, &d, &a, 1.0, &d, &b, 0.0, &d, &mut c).unwrap();
        assert_eq!(h.read::<f32>(&c).unwrap(), w, "{op:?}");
    }
    let mut y = h.upload(&[1.0f32, -2.0, 3.0]).unwrap();
    scale_tensor(&h, &d, &mut y, -0.5).unwrap();
    assert_eq!(h.read::<f32>(&y).unwrap(), [-0.5, 1.0, -1.5]);
    set_tensor(&h, &d, &mut y, 7.25).unwrap();
    assert_eq!(h.read::<f32>(&y).unwrap(), [7.25; 3]);
}

/// `b`'s dims: each of `dims` kept or broadcast (1) by the mask bits.
fn broadcast_dims(dims: &[usize], mask: u8) -> Vec<usize> {
    dims.iter()
        .enumerate()
        .map(|(i, &n)| if mask >> i & 1 == 1 { 1 } else { n })
        .collect()
}

proptest! {
    #![proptest_config(gpu_cases(96))]

    #[test]
    fn gpu_op_tensor_matches_reference(
        (ad, cd) in two_layouts(5, 4096), mask in any::<u8>(), op in prop::sample::select(OpTensorOp::ALL.to_vec()),
        (alpha1, beta) in alpha_beta(), alpha2 in prop_oneof![Just(1.0f64), Just(-0.75)], seed in any::<u64>(),
    ) {
        with_gpu("gpu_op_tensor_matches_reference", |h| {
            let bd = TensorDescriptor::packed(cd.dtype(), &broadcast_dims(cd.dims(), mask)).unwrap();
            let mut r = rng(seed);
            // sqrt needs alpha1 * a >= 0.
            let (lo, hi) = if op == OpTensorOp::Sqrt { (0.0, 4.0) } else { (-3.0, 3.0) };
            let alpha1 = if op == OpTensorOp::Sqrt { alpha1.abs() } else { alpha1 };
            let (at, bt, c0) = (random(ad, lo, hi, &mut r), random(bd, -3.0, 3.0, &mut r), random(cd, -1.0, 1.0, &mut r));
            let (a, b) = (upload_poisoned(h, &at, false), upload_poisoned(h, &bt, false));
            let mut c = upload_poisoned(h, &c0, beta == 0.0);
            op_tensor(h, op, alpha1, &ad, &a, alpha2, &bd, &b, beta, &cd, &mut c).unwrap();
            let mut want = c0.clone();
            reference::op_tensor(op, alpha1, &at, alpha2, op.is_binary().then_some(&bt), beta, &mut want);
            check(h, &cd, &c, &want, bound(cd.dtype()), &format!("{op:?}"));
        });
    }

    #[test]
    fn gpu_add_scale_set_match_reference((_, cd) in two_layouts(5, 4096), mask in any::<u8>(), (alpha, beta) in alpha_beta(), seed in any::<u64>()) {
        with_gpu("gpu_add_scale_set_match_reference", |h| {
            let ad = TensorDescriptor::packed(cd.dtype(), &broadcast_dims(cd.dims(), mask)).unwrap();
            let mut r = rng(seed);
            let (at, c0) = (random(ad, -3.0, 3.0, &mut r), random(cd, -1.0, 1.0, &mut r));
            let a = upload_poisoned(h, &at, false);
            let mut c = upload_poisoned(h, &c0, beta == 0.0);
            add_tensor(h, alpha, &ad, &a, beta, &cd, &mut c).unwrap();
            let mut want = c0.clone();
            reference::add_tensor(alpha, &at, beta, &mut want);
            check(h, &cd, &c, &want, bound(cd.dtype()), "add_tensor");

            let mut y = upload_poisoned(h, &c0, false);
            scale_tensor(h, &cd, &mut y, alpha).unwrap();
            let mut want = c0.clone();
            reference::scale_tensor(&mut want, alpha);
            check(h, &cd, &y, &want, bound(cd.dtype()), "scale_tensor");

            let mut y = upload_poisoned(h, &c0, true);
            set_tensor(h, &cd, &mut y, alpha + 0.125).unwrap();
            let mut want = c0.clone();
            reference::set_tensor(&mut want, alpha + 0.125);
            check(h, &cd, &y, &want, 0.0, "set_tensor");
        });
    }

    #[test]
    fn gpu_transform_matches_reference(
        (xd, yd) in two_layouts(5, 8192), to in gpu_dtype(), (alpha, beta) in alpha_beta(), seed in any::<u64>(),
    ) {
        with_gpu("gpu_transform_matches_reference", |h| {
            let yd = yd.with_dtype(to).unwrap();
            let mut r = rng(seed);
            let (xt, y0) = (random(xd, -3.0, 3.0, &mut r), random(yd, -1.0, 1.0, &mut r));
            let x = upload_poisoned(h, &xt, false);
            let mut y = upload_poisoned(h, &y0, beta == 0.0);
            transform_tensor(h, alpha, &xd, &x, beta, &yd, &mut y).unwrap();
            let mut want = y0.clone();
            reference::transform_tensor(alpha, &xt, beta, &mut want);
            // A plain conversion (alpha 1, beta 0) rounds once, exactly as the reference.
            let tol = if (alpha, beta) == (1.0, 0.0) { 0.0 } else { bound(xd.dtype()).max(bound(to)) };
            check(h, &yd, &y, &want, tol, "transform");
        });
    }
}

#[test]
fn gpu_bias_broadcasts_match_reference_in_every_layout() {
    with_gpu("gpu_bias_broadcasts_match_reference_in_every_layout", |h| {
        for dt in DataType::GPU {
            for (n, c, hw) in [(2, 64, 8), (2, 3, 5), (3, 64, 7), (1, 16, 1)] {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let cd = TensorDescriptor::nchw_with(dt, n, c, hw, hw, layout).unwrap();
                    let bd = TensorDescriptor::nchw(dt, 1, c, 1, 1).unwrap();
                    let mut r = rng((n * c * hw) as u64);
                    let (bt, c0, at) = (
                        random(bd, -2.0, 2.0, &mut r),
                        random(cd, -1.0, 1.0, &mut r),
                        random(cd, -1.0, 1.0, &mut r),
                    );
                    let b = upload_poisoned(h, &bt, false);
                    let mut y = upload_poisoned(h, &c0, false);
                    add_tensor(h, 1.0, &bd, &b, 1.0, &cd, &mut y).unwrap();
                    let mut want = c0.clone();
                    reference::add_tensor(1.0, &bt, 1.0, &mut want);
                    check(h, &cd, &y, &want, bound(dt), "bias add");

                    let a = upload_poisoned(h, &at, false);
                    let mut y = upload_poisoned(h, &c0, true);
                    op_tensor(
                        h,
                        OpTensorOp::Mul,
                        1.0,
                        &cd,
                        &a,
                        2.0,
                        &bd,
                        &b,
                        0.0,
                        &cd,
                        &mut y,
                    )
                    .unwrap();
                    let mut want = c0.clone();
                    reference::op_tensor(OpTensorOp::Mul, 1.0, &at, 2.0, Some(&bt), 0.0, &mut want);
                    check(h, &cd, &y, &want, bound(dt), "broadcast mul");
                }
            }
        }
    });
}

#[test]
fn gpu_transposes_resnet_like_shapes_exactly() {
    with_gpu("gpu_transposes_resnet_like_shapes_exactly", |h| {
        for (n, c, hw) in [
            (2, 64, 56),
            (3, 3, 33),
            (1, 256, 7),
            (2, 37, 41),
            (2, 10, 14),
        ] {
            for (from, to) in [
                (DataType::F32, DataType::F32),
                (DataType::F32, DataType::F16),
                (DataType::BF16, DataType::F32),
                (DataType::F16, DataType::F16),
                (DataType::BF16, DataType::F16),
            ] {
                let xd = TensorDescriptor::nchw(from, n, c, hw, hw).unwrap();
                let yd = TensorDescriptor::nhwc(to, n, c, hw, hw).unwrap();
                for (a, b) in [
                    (xd, yd),
                    (yd.with_dtype(from).unwrap(), xd.with_dtype(to).unwrap()),
                ] {
                    let xt = random(a, -8.0, 8.0, &mut rng(c as u64));
                    let x = upload_poisoned(h, &xt, false);
                    let mut y = upload_poisoned(h, &HostTensor::filled(b, 0.0), true);
                    transform_tensor(h, 1.0, &a, &x, 0.0, &b, &mut y).unwrap();
                    let mut want = HostTensor::filled(b, 0.0);
                    reference::transform_tensor(1.0, &xt, 0.0, &mut want);
                    check(h, &b, &y, &want, 0.0, "nchw<->nhwc");
                }
            }
        }
    });
}

#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for h in handles() {
        let d = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5).unwrap();
        let a = h.alloc(&d).unwrap();
        let mut c = h.alloc(&d).unwrap();
        let not_broadcastable = TensorDescriptor::nchw(DataType::F32, 1, 2, 1, 1).unwrap();
        let small = h.alloc(&not_broadcastable).unwrap();
        let e = add_tensor(h, 1.0, &not_broadcastable, &small, 0.0, &d, &mut c).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "a_desc", .. }), "{e}");
        let e = op_tensor(
            h,
            OpTensorOp::Add,
            1.0,
            &d,
            &a,
            1.0,
            &not_broadcastable,
            &small,
            0.0,
            &d,
            &mut c,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "b_desc", .. }), "{e}");
        let half = d.with_dtype(DataType::F16).unwrap();
        let e = op_tensor(
            h,
            OpTensorOp::Mul,
            1.0,
            &d,
            &a,
            1.0,
            &half,
            &a,
            0.0,
            &d,
            &mut c,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "b_desc", .. }), "{e}");
        let mut short = h.alloc_bytes(10).unwrap();
        let e = scale_tensor(h, &d, &mut short, 2.0).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "y", .. }), "{e}");
        let e = set_tensor(h, &d, &mut c, f64::INFINITY).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "value", .. }), "{e}");
        let other = TensorDescriptor::nchw(DataType::F32, 2, 3, 5, 4).unwrap();
        let e = transform_tensor(h, 1.0, &d, &a, 0.0, &other, &mut c).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let overlapping =
            TensorDescriptor::new(DataType::F32, &[2, 3, 4, 5], &[1, 1, 1, 1]).unwrap();
        let e = transform_tensor(h, 1.0, &overlapping, &a, 0.0, &overlapping, &mut c).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
    }
}
