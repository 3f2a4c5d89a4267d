//! Cross-channel LRN: cuDNN's window placement and parameter limits, the reference
//! backward against finite differences of the reference forward, the GPU against the
//! reference over drawn shapes (C = 1, primes), window widths (odd and even), layouts
//! (NCHW, NHWC, padded, permuted), dtypes and blending, both GPU algorithms, and bad inputs.

mod common;

use common::*;
use oxidnn::reference::lrn::window;
use oxidnn::*;
use proptest::prelude::*;

#[test]
fn the_window_is_placed_as_cudnn_places_it() {
    // lookBehind = floor((n - 1) / 2), lookAhead = n - lookBehind - 1.
    for n in LRN_MIN_N..=LRN_MAX_N {
        let lrn = LrnDescriptor::new(n, 1.0, 1.0, 1.0).unwrap();
        assert_eq!(lrn.look_behind(), (n - 1) / 2);
        assert_eq!(lrn.look_behind() + 1 + lrn.look_ahead(), n);
    }
    // n = 6 (even): [c - 2, c + 3]; n = 5: [c - 2, c + 2]; clipped at the ends.
    let six = LrnDescriptor::new(6, 1.0, 1.0, 1.0).unwrap();
    assert_eq!(window(&six, 10, 20), 8..=13);
    assert_eq!(window(&six, 0, 20), 0..=3);
    assert_eq!(window(&six, 19, 20), 17..=19);
    let five = LrnDescriptor::default();
    assert_eq!(
        (five.n(), five.alpha(), five.beta(), five.k()),
        (5, 1e-4, 0.75, 2.0)
    );
    assert_eq!(window(&five, 10, 20), 8..=12);
}

#[test]
fn cpu_forward_is_the_formula() {
    // One channel set per pixel: y_c = x_c (k + alpha / n * sum x^2)^-beta.
    let h = Handle::cpu();
    let d = TensorDescriptor::packed(DataType::F64, &[1, 4, 1]).unwrap();
    let x = h.upload(&[1.0f64, -2.0, 3.0, 0.5]).unwrap();
    let mut y = h.alloc(&d).unwrap();
    let lrn = LrnDescriptor::new(2, 0.5, 0.75, 2.0).unwrap(); // window [c, c + 1]
    lrn_cross_channel_forward(&h, &lrn, 1.0, &d, &x, 0.0, &d, &mut y).unwrap();
    let xs = [1.0f64, -2.0, 3.0, 0.5];
    let want: Vec<f64> = (0..4)
        .map(|c| {
            let sum: f64 = xs[c..(c + 2).min(4)].iter().map(|v| v * v).sum();
            xs[c] * (2.0 + 0.25 * sum).powf(-0.75)
        })
        .collect();
    let got = h.read::<f64>(&y).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-15, "{got:?} vs {want:?}");
    }
}

/// The reference backward is the gradient of the reference forward: `<dy, dy/dx e_i>`
/// by central differences, for odd and even windows.
#[test]
fn reference_backward_is_the_gradient_of_the_forward() {
    let d = TensorDescriptor::packed(DataType::F64, &[2, 9, 3]).unwrap();
    let mut r = rng(7);
    let xt = random(d, -2.0, 2.0, &mut r);
    let dyt = random(d, -1.0, 1.0, &mut r);
    for (n, alpha, beta, k) in [
        (5, 1.0, 0.75, 2.0),
        (4, 2.0, 1.3, 0.5),
        (1, 0.5, 0.3, 1.0),
        (16, 3.0, 0.9, 1.0),
    ] {
        let lrn = LrnDescriptor::new(n, alpha, beta, k).unwrap();
        let loss = |x: &HostTensor| {
            let mut y = HostTensor::filled(d, 0.0);
            oxidnn::reference::lrn::forward(&lrn, 1.0, x, 0.0, &mut y);
            y.logical()
                .iter()
                .zip(dyt.logical())
                .map(|(a, b)| a * b)
                .sum::<f64>()
        };
        let mut dx = HostTensor::filled(d, 0.0);
        oxidnn::reference::lrn::backward(&lrn, 1.0, &dyt, &xt, 0.0, &mut dx);
        let eps = 1e-6;
        for_each_index(d.dims(), |idx| {
            let (mut plus, mut minus) = (xt.clone(), xt.clone());
            plus.set(idx, xt.get(idx) + eps);
            minus.set(idx, xt.get(idx) - eps);
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * eps);
            let analytic = dx.get(idx);
            assert!(
                (numeric - analytic).abs() < 1e-7 * (1.0 + analytic.abs()),
                "n {n} at {idx:?}: numeric {numeric}, analytic {analytic}"
            );
        });
    }
}

/// Forward and backward on `h` against the reference, with fresh inputs, poisoned outputs
/// (or random ones to blend with) and gap checks.
#[allow(clippy::too_many_arguments)]
fn run(
    h: &Handle,
    lrn: &LrnDescriptor,
    xd: TensorDescriptor,
    od: TensorDescriptor,
    (alpha, beta): (f64, f64),
    seed: u64,
) {
    let mut r = rng(seed);
    let what = format!(
        "n {} alpha {} beta {} k {} blend ({alpha}, {beta}) {} -> {}",
        lrn.n(),
        lrn.alpha(),
        lrn.beta(),
        lrn.k(),
        xd.problem_string(),
        od.problem_string()
    );
    let xt = random(xd, -2.0, 2.0, &mut r);
    let x = upload_poisoned(h, &xt, false);
    let y0 = random(od, -1.0, 1.0, &mut r);
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    lrn_cross_channel_forward(h, lrn, alpha, &xd, &x, beta, &od, &mut y).unwrap();
    let mut want = y0.clone();
    oxidnn::reference::lrn::forward(lrn, alpha, &xt, beta, &mut want);
    check(
        h,
        &od,
        &y,
        &want,
        2.0 * bound(xd.dtype()),
        &format!("forward {what}"),
    );

    // Backward: y (true forward output, unblended) as cuDNN would pass it, dy random.
    let mut yt = HostTensor::filled(od, 0.0);
    oxidnn::reference::lrn::forward(lrn, 1.0, &xt, 0.0, &mut yt);
    let yb = upload_poisoned(h, &yt, false);
    let dyt = random(od, -1.0, 1.0, &mut r);
    let dy = upload_poisoned(h, &dyt, false);
    let dx0 = random(xd, -1.0, 1.0, &mut r);
    let mut dx = upload_poisoned(h, &dx0, beta == 0.0);
    lrn_cross_channel_backward(
        h, lrn, alpha, &od, &yb, &od, &dy, &xd, &x, beta, &xd, &mut dx,
    )
    .unwrap();
    let mut want_dx = dx0.clone();
    oxidnn::reference::lrn::backward(lrn, alpha, &dyt, &xt, beta, &mut want_dx);
    check(
        h,
        &xd,
        &dx,
        &want_dx,
        4.0 * bound(xd.dtype()),
        &format!("backward {what}"),
    );
}

/// LRN descriptors as the property tests draw them: every width, alpha from AlexNet's
/// 1e-4 to values where the normalisation dominates.
fn lrn_descriptor() -> impl Strategy<Value = LrnDescriptor> {
    (
        LRN_MIN_N..=LRN_MAX_N,
        prop_oneof![Just(1e-4), Just(0.1), Just(1.0), Just(4.0)],
        prop_oneof![Just(LRN_MIN_BETA), Just(0.75), Just(1.0), Just(1.7)],
        prop_oneof![Just(2.0), Just(1.0), Just(0.3)],
    )
        .prop_map(|(n, a, b, k)| LrnDescriptor::new(n, a, b, k).unwrap())
}

/// Dims `N, C, spatial..` (3 to 5 dims) with C drawn from awkward extents, and two layouts.
fn lrn_layouts() -> impl Strategy<Value = (TensorDescriptor, TensorDescriptor)> {
    (
        prop::collection::vec(extent(), 2..=4),
        prop_oneof![
            Just(1usize),
            Just(2),
            Just(3),
            Just(5),
            Just(13),
            Just(16),
            Just(17),
            Just(31),
            Just(64),
            Just(97)
        ],
        gpu_dtype(),
    )
        .prop_flat_map(|(rest, c, dt)| {
            let mut dims = vec![rest[0], c];
            dims.extend_from_slice(&rest[1..]);
            while dims.iter().product::<usize>() > 12_000 {
                let i = (0..dims.len())
                    .filter(|&i| i != 1)
                    .max_by_key(|&i| dims[i])
                    .unwrap_or(0);
                dims[i] = (dims[i] / 2).max(1);
            }
            (layout(dims.clone(), dt), layout(dims, dt))
        })
}

proptest! {
    #![proptest_config(gpu_cases(64))]

    #[test]
    fn gpu_lrn_matches_reference(
        (xd, od) in lrn_layouts(), lrn in lrn_descriptor(), ab in alpha_beta(), seed in any::<u64>(),
    ) {
        with_gpu("gpu_lrn_matches_reference", |h| run(h, &lrn, xd, od, ab, seed));
    }
}

#[test]
fn gpu_nchw_and_nhwc_at_alexnet_like_shapes() {
    with_gpu("gpu_nchw_and_nhwc_at_alexnet_like_shapes", |h| {
        let lrn = LrnDescriptor::default();
        for dt in DataType::GPU {
            for (c, hw) in [(96, 13), (256, 7), (97, 5), (4, 31)] {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let d = TensorDescriptor::nchw_with(dt, 3, c, hw, hw, layout).unwrap();
                    for ab in [(1.0, 0.0), (0.5, -1.5)] {
                        run(h, &lrn, d, d, ab, c as u64);
                    }
                }
            }
        }
    });
}

/// The kernels with the width n = 5 compiled in, the walk (layouts whose channels are not
/// at unit stride) and the channels-last kernels: channel counts around the window, the
/// walk's 8-channel groups and the 16-byte runs (windows clipped at both ends, groups and
/// runs cut short, whole and partial vectors), walks split into segments that start and end
/// mid-tensor (3 pixels, 3000 channels), channels-last pixels wider than their 32 lanes'
/// runs, gapped and permuted layouts, every dtype, blending. Widths 4 and 6 keep the ring
/// walk and the staged channels-last kernels.
#[test]
fn gpu_fixed_width_kernels_match_the_reference() {
    with_gpu("gpu_fixed_width_kernels_match_the_reference", |h| {
        for dt in DataType::GPU {
            let mut cases = Vec::new();
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                for c in [1, 2, 4, 5, 7, 8, 9, 16, 17, 3000] {
                    let (n, hw) = if c == 3000 { (1, 1) } else { (2, 3) };
                    cases.push(TensorDescriptor::nchw_with(dt, n, c, hw, 5, layout).unwrap());
                }
            }
            // Rows of 5 padded to 7, planes of 3 rows padded by 2, batches by 1.
            cases
                .push(TensorDescriptor::new(dt, &[2, 11, 3, 5], &[11 * 23 + 1, 23, 7, 1]).unwrap());
            // N, H, C, W order: channels 5 elements apart.
            cases.push(TensorDescriptor::new(dt, &[2, 11, 3, 5], &[165, 5, 55, 1]).unwrap());
            // Channels last with pixels 9 elements apart (no 16-byte runs).
            cases.push(TensorDescriptor::new(dt, &[2, 8, 3, 5], &[135, 1, 45, 9]).unwrap());
            for (i, d) in cases.into_iter().enumerate() {
                let channels_last = d.dims()[1] == 1 || d.strides()[1] == 1;
                let fixed = if channels_last {
                    "channels_last_n5"
                } else {
                    "walk_n5"
                };
                for n in [5, 4, 6] {
                    let lrn = LrnDescriptor::new(n, 1.0, 0.75, 1.0).unwrap();
                    for backward in [false, true] {
                        let dir = if backward { "bwd" } else { "fwd" };
                        let kernel = lrn_kernel(h, &lrn, backward, &d, &d).unwrap();
                        if n == 5 {
                            assert_eq!(kernel, format!("lrn_{dir}_{fixed}_{dt}"), "{d:?}");
                        } else {
                            assert!(!kernel.contains("_n5_"), "n {n} {d:?}: {kernel}");
                        }
                    }
                    for ab in [(1.0, 0.0), (0.5, -1.5)] {
                        run(h, &lrn, d, d, ab, i as u64);
                    }
                }
            }
        }
    });
}

#[test]
fn gpu_long_channel_runs_and_extreme_parameters() {
    with_gpu("gpu_long_channel_runs_and_extreme_parameters", |h| {
        // Many channels: several walk segments per pixel (NCHW), and NHWC too wide to
        // stage in shared memory (the walk kernel takes it, but at n = 5 the channels-last
        // kernel, which stages nothing); the smallest k and beta.
        for (n, alpha, beta, k) in [
            (16, 1.0, 0.75, 1.0),
            (5, 1e-4, 0.75, 2.0),
            (3, 0.5, LRN_MIN_BETA, LRN_MIN_K),
            (6, 2.0, 3.0, 1.0),
        ] {
            let lrn = LrnDescriptor::new(n, alpha, beta, k).unwrap();
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                let d = TensorDescriptor::nchw_with(DataType::F32, 2, 3000, 2, 3, layout).unwrap();
                run(h, &lrn, d, d, (1.0, 0.0), n as u64);
            }
        }
    });
}

#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for (n, a, b, k, arg) in [
        (0, 1e-4, 0.75, 2.0, "lrn_n"),
        (17, 1e-4, 0.75, 2.0, "lrn_n"),
        (5, f64::NAN, 0.75, 2.0, "lrn_alpha"),
        (5, 1e-4, 0.009, 2.0, "lrn_beta"),
        (5, 1e-4, f64::NAN, 2.0, "lrn_beta"),
        (5, 1e-4, 0.75, 9e-6, "lrn_k"),
        (5, 1e-4, 0.75, f64::INFINITY, "lrn_k"),
    ] {
        let e = LrnDescriptor::new(n, a, b, k).unwrap_err();
        assert!(
            matches!(e, Error::BadParam { arg: a, .. } if a == arg),
            "{e}"
        );
    }
    let lrn = LrnDescriptor::default();
    for h in handles() {
        let d = TensorDescriptor::nchw(DataType::F32, 2, 8, 3, 3).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let flat = TensorDescriptor::packed(DataType::F32, &[2, 72]).unwrap();
        let e = lrn_cross_channel_forward(h, &lrn, 1.0, &flat, &x, 0.0, &flat, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "x_desc", .. }), "{e}");
        let other = TensorDescriptor::nchw(DataType::F32, 2, 9, 3, 3).unwrap();
        let mut big = h.alloc(&other).unwrap();
        let e = lrn_cross_channel_forward(h, &lrn, 1.0, &d, &x, 0.0, &other, &mut big).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let half = d.with_dtype(DataType::F16).unwrap();
        let e = lrn_cross_channel_forward(h, &lrn, 1.0, &d, &x, 0.0, &half, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let e = lrn_cross_channel_forward(h, &lrn, f64::NAN, &d, &x, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "alpha", .. }), "{e}");
        let short = h.alloc_bytes(d.size_bytes() - 4).unwrap();
        let e = lrn_cross_channel_forward(h, &lrn, 1.0, &d, &short, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "x", .. }), "{e}");
        let dy = h.alloc(&d).unwrap();
        let mut dx = h.alloc(&d).unwrap();
        let e = lrn_cross_channel_backward(
            h, &lrn, 1.0, &d, &y, &other, &big, &d, &x, 0.0, &d, &mut dx,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "dy_desc", .. }), "{e}");
        let e =
            lrn_cross_channel_backward(h, &lrn, 1.0, &d, &short, &d, &dy, &d, &x, 0.0, &d, &mut dx)
                .unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "y", .. }), "{e}");
        let e = lrn_cross_channel_backward(
            h,
            &lrn,
            1.0,
            &d,
            &y,
            &d,
            &dy,
            &d,
            &x,
            f64::INFINITY,
            &d,
            &mut dx,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "beta", .. }), "{e}");
        let overlapping =
            TensorDescriptor::new(DataType::F32, &[2, 8, 3, 3], &[1, 1, 1, 1]).unwrap();
        let e =
            lrn_cross_channel_forward(h, &lrn, 1.0, &d, &x, 0.0, &overlapping, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let stranger = Handle::cpu();
        let foreign = stranger.alloc(&d).unwrap();
        let e = lrn_cross_channel_forward(h, &lrn, 1.0, &d, &foreign, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "x", .. }), "{e}");
        // The kernel query validates as the calls do, and names no kernel on the CPU.
        let e = lrn_kernel(h, &lrn, false, &d, &other).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let e = lrn_kernel(h, &lrn, true, &flat, &flat).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "x_desc", .. }), "{e}");
        if !h.is_gpu() {
            let e = lrn_kernel(h, &lrn, false, &d, &d).unwrap_err();
            assert!(matches!(e, Error::BadParam { arg: "handle", .. }), "{e}");
        }
    }
}

/// One small call of each GPU algorithm, announced and synchronized one by one, so that a
/// hang or a fault names its kernel (the channels-last kernels once hung: LLVM had
/// duplicated an aligned barrier into both arms of a branch on pixel validity, see
/// `device::sync_threads_divergent`); 18 pixels in blocks of 128 leave invalid lanes in a
/// warp. `OXIDNN_LRN_SMOKE` picks one: walk_fwd, walk_bwd, cl_fwd, cl_bwd (n = 5 compiled
/// in), ring_fwd, ring_bwd, staged_fwd, staged_bwd (n = 4).
#[test]
fn gpu_smoke_each_kernel_once() {
    with_gpu("gpu_smoke_each_kernel_once", |h| {
        let pick = std::env::var("OXIDNN_LRN_SMOKE").unwrap_or_default();
        for (name, n, layout, backward) in [
            ("walk_fwd", 5, Layout::ChannelsFirst, false),
            ("walk_bwd", 5, Layout::ChannelsFirst, true),
            ("ring_fwd", 4, Layout::ChannelsFirst, false),
            ("ring_bwd", 4, Layout::ChannelsFirst, true),
            ("cl_fwd", 5, Layout::ChannelsLast, false),
            ("cl_bwd", 5, Layout::ChannelsLast, true),
            ("staged_fwd", 4, Layout::ChannelsLast, false),
            ("staged_bwd", 4, Layout::ChannelsLast, true),
        ] {
            if !pick.is_empty() && pick != name {
                continue;
            }
            let lrn = LrnDescriptor::new(n, 1e-4, 0.75, 2.0).unwrap();
            let d = TensorDescriptor::nchw_with(DataType::F32, 2, 8, 3, 3, layout).unwrap();
            let xt = random(d, -2.0, 2.0, &mut rng(1));
            let x = h.upload_tensor(&xt).unwrap();
            let mut out = h.alloc(&d).unwrap();
            eprintln!("smoke {name}: calling");
            if backward {
                lrn_cross_channel_backward(h, &lrn, 1.0, &d, &x, &d, &x, &d, &x, 0.0, &d, &mut out)
                    .unwrap();
            } else {
                lrn_cross_channel_forward(h, &lrn, 1.0, &d, &x, 0.0, &d, &mut out).unwrap();
            }
            eprintln!("smoke {name}: returned");
            h.synchronize().unwrap();
            eprintln!("smoke {name}: synchronized");
        }
    });
}
