//! Softmax: the reference against known values, row sums and finite differences; the GPU
//! against the reference over drawn shapes, layouts, dtypes, algorithms, modes and
//! alpha/beta, forward and backward, on every kernel path (vectors and mapped elements in
//! registers, streamed long rows, a thread per row for strided channels); large inputs;
//! bad inputs on both handles.

mod common;

use common::*;
use oxidnn::reference::softmax as reference;
use oxidnn::*;
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
struct Case {
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    x: TensorDescriptor,
    y: TensorDescriptor,
    alpha: f64,
    beta: f64,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "{:?} {:?} alpha {} beta {} x {} y {}",
            self.algo,
            self.mode,
            self.alpha,
            self.beta,
            self.x.problem_string(),
            self.y.problem_string()
        )
    }
}

/// Inputs in `[-range, range]`: the fast algorithm overflows beyond ~88 (f32), as cuDNN's.
fn run_forward(h: &Handle, c: &Case, range: f64, seed: u64) -> HostTensor {
    let mut r = rng(seed);
    let xt = random(c.x, -range, range, &mut r);
    let y0 = random(c.y, -1.0, 1.0, &mut r);
    let x = upload_poisoned(h, &xt, false);
    let mut y = upload_poisoned(h, &y0, c.beta == 0.0);
    softmax_forward(h, c.algo, c.mode, c.alpha, &c.x, &x, c.beta, &c.y, &mut y)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name()));
    let mut want = y0.clone();
    reference::forward(c.algo, c.mode, c.alpha, &xt, c.beta, &mut want);
    check(h, &c.y, &y, &want, bound(c.x.dtype()), &c.name());
    h.download_tensor(&c.y, &y).unwrap()
}

/// `y` is a real (log-)softmax output, as the backward expects; dy, dx in x's and y's
/// layouts.
fn run_backward(h: &Handle, c: &Case, seed: u64) {
    let mut r = rng(seed);
    let xt = random(c.x, -3.0, 3.0, &mut r);
    let mut yt = HostTensor::filled(c.y, 0.0);
    reference::forward(c.algo, c.mode, 1.0, &xt, 0.0, &mut yt);
    let dyt = random(c.x, -1.0, 1.0, &mut r);
    let dx0 = random(c.y, -1.0, 1.0, &mut r);
    let y = upload_poisoned(h, &yt, false);
    let dy = upload_poisoned(h, &dyt, false);
    let mut dx = upload_poisoned(h, &dx0, c.beta == 0.0);
    softmax_backward(
        h, c.algo, c.mode, c.alpha, &c.y, &y, &c.x, &dy, c.beta, &c.y, &mut dx,
    )
    .unwrap_or_else(|e| panic!("backward {}: {e}", c.name()));
    let mut want = dx0.clone();
    reference::backward(c.algo, c.mode, c.alpha, &yt, &dyt, c.beta, &mut want);
    // dx = y (dy - sum dy y) cancels where dy is near the weighted mean.
    check(
        h,
        &c.y,
        &dx,
        &want,
        4.0 * bound(c.x.dtype()),
        &format!("backward {}", c.name()),
    );
}

// ---------------------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------------------

#[test]
fn reference_matches_known_values_and_rows_sum_to_one() {
    let p = reference::softmax(SoftmaxAlgorithm::Accurate, &[1.0, 2.0, 3.0]);
    let e: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let s: f64 = e.iter().sum();
    for (a, b) in p.iter().zip(&e) {
        assert!((a - b / s).abs() < 1e-15);
    }
    let fast = reference::softmax(SoftmaxAlgorithm::Fast, &[1.0, 2.0, 3.0]);
    assert!(fast.iter().zip(&p).all(|(a, b)| (a - b).abs() < 1e-15));
    let log = reference::softmax(SoftmaxAlgorithm::Log, &[1.0, 2.0, 3.0]);
    assert!(log.iter().zip(&p).all(|(a, b)| (a - b.ln()).abs() < 1e-14));
    // Large inputs: the accurate and log forms stay finite.
    let big = reference::softmax(SoftmaxAlgorithm::Accurate, &[1000.0, 1001.0]);
    assert!((big[1] - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-15);
    assert!(reference::softmax(SoftmaxAlgorithm::Log, &[1000.0, 0.0])[1].is_finite());
}

/// Instance mode reduces C*H*W per n; channel mode C per pixel.
#[test]
fn reference_modes_pick_their_rows() {
    let mut rows = vec![];
    reference::for_each_row(SoftmaxMode::Channel, &[2, 3, 1, 2], |r| {
        rows.push(r.to_vec())
    });
    assert_eq!(rows.len(), 4);
    assert_eq!(
        rows[1],
        [vec![0, 0, 0, 1], vec![0, 1, 0, 1], vec![0, 2, 0, 1]]
    );
    let mut count = 0;
    reference::for_each_row(SoftmaxMode::Instance, &[2, 3, 1, 2], |r| {
        assert_eq!(r.len(), 6);
        count += 1;
    });
    assert_eq!(count, 2);
}

/// The backward is the gradient of `sum(dy * softmax(x))` with respect to x.
#[test]
fn reference_backward_matches_finite_differences() {
    let d = TensorDescriptor::packed(DataType::F64, &[2, 5, 1, 3]).unwrap();
    let mut r = rng(3);
    let x = random(d, -2.0, 2.0, &mut r);
    let dy = random(d, -1.0, 1.0, &mut r);
    for algo in SoftmaxAlgorithm::ALL {
        for mode in SoftmaxMode::ALL {
            let loss = |x: &HostTensor| {
                let mut y = HostTensor::filled(d, 0.0);
                reference::forward(algo, mode, 1.0, x, 0.0, &mut y);
                y.logical()
                    .iter()
                    .zip(dy.logical())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            };
            let mut y = HostTensor::filled(d, 0.0);
            reference::forward(algo, mode, 1.0, &x, 0.0, &mut y);
            let mut dx = HostTensor::filled(d, 0.0);
            reference::backward(algo, mode, 1.0, &y, &dy, 0.0, &mut dx);
            for_each_index(d.dims(), |i| {
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp.set(i, x.get(i) + 1e-6);
                xm.set(i, x.get(i) - 1e-6);
                let numeric = (loss(&xp) - loss(&xm)) / 2e-6;
                assert!(
                    (numeric - dx.get(i)).abs() < 1e-7,
                    "{algo:?} {mode:?} dx{i:?}: {numeric} vs {}",
                    dx.get(i)
                );
            });
        }
    }
}

#[test]
fn cpu_handle_blends_and_runs_backward() {
    let h = Handle::cpu();
    let d = TensorDescriptor::nchw(DataType::F64, 2, 7, 3, 2).unwrap();
    for algo in SoftmaxAlgorithm::ALL {
        for mode in SoftmaxMode::ALL {
            let c = Case {
                algo,
                mode,
                x: d,
                y: d,
                alpha: 0.5,
                beta: 0.25,
            };
            run_forward(&h, &c, 3.0, 1);
            run_backward(&h, &c, 2);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The GPU against the reference
// ---------------------------------------------------------------------------------------

fn any_algo() -> impl Strategy<Value = SoftmaxAlgorithm> {
    prop::sample::select(SoftmaxAlgorithm::ALL.to_vec())
}

fn any_mode() -> impl Strategy<Value = SoftmaxMode> {
    prop::sample::select(SoftmaxMode::ALL.to_vec())
}

/// Rank 2 to 5 (a leading extent is added to rank-1 draws), two layouts.
fn any_case() -> impl Strategy<Value = Case> {
    (
        dims(4, 6000),
        extent(),
        gpu_dtype(),
        any_algo(),
        any_mode(),
        alpha_beta(),
    )
        .prop_flat_map(|(mut dims, n, dt, algo, mode, ab)| {
            dims.insert(0, n);
            (
                layout(dims.clone(), dt),
                layout(dims, dt),
                Just((algo, mode, ab)),
            )
        })
        .prop_map(|(x, y, (algo, mode, (alpha, beta)))| Case {
            algo,
            mode,
            x,
            y,
            alpha,
            beta,
        })
}

proptest! {
    #![proptest_config(gpu_cases(96))]

    #[test]
    fn gpu_forward_matches_reference(c in any_case(), seed in any::<u64>()) {
        with_gpu("gpu_forward_matches_reference", |h| {
            run_forward(h, &c, 4.0, seed);
        });
    }

    #[test]
    fn gpu_backward_matches_reference(c in any_case(), seed in any::<u64>()) {
        with_gpu("gpu_backward_matches_reference", |h| run_backward(h, &c, seed));
    }
}

/// Rows of every length class in both modes and layouts: channel mode on NHWC and instance
/// mode on NCHW (dense rows: vectors in registers, or streamed when long), channel mode on
/// NCHW (a thread per pixel), odd lengths (mapped elements).
#[test]
fn gpu_every_kernel_path_matches_reference() {
    with_gpu("gpu_every_kernel_path_matches_reference", |h| {
        let shapes: [[usize; 4]; 8] = [
            [64, 1024, 1, 1],
            [16, 4096, 1, 1],
            [3, 40_000, 1, 1],
            [33, 97, 1, 1],
            [2, 9999, 1, 1],
            [5, 5000, 1, 3],
            [4, 64, 7, 7],
            [2, 3, 11, 13],
        ];
        for dt in DataType::GPU {
            for (i, [n, c, hh, w]) in shapes.into_iter().enumerate() {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let d = TensorDescriptor::nchw_with(dt, n, c, hh, w, layout).unwrap();
                    for algo in SoftmaxAlgorithm::ALL {
                        for mode in SoftmaxMode::ALL {
                            let (alpha, beta) = if i % 2 == 0 { (1.0, 0.0) } else { (0.75, 0.5) };
                            let case = Case {
                                algo,
                                mode,
                                x: d,
                                y: d,
                                alpha,
                                beta,
                            };
                            run_forward(h, &case, 4.0, (i * 7) as u64);
                            run_backward(h, &case, (i * 7 + 1) as u64);
                        }
                    }
                }
            }
        }
    });
}

/// The outputs of each row sum to 1 (accurate, fast) or their exponentials do (log); with
/// inputs around 100, the accurate and log algorithms neither overflow nor lose the row.
#[test]
fn gpu_rows_sum_to_one_and_large_inputs_stay_finite() {
    with_gpu("gpu_rows_sum_to_one", |h| {
        for dt in DataType::GPU {
            for (d, mode) in [
                (
                    TensorDescriptor::nchw(dt, 8, 1000, 1, 1).unwrap(),
                    SoftmaxMode::Channel,
                ),
                (
                    TensorDescriptor::nchw(dt, 4, 16, 5, 5).unwrap(),
                    SoftmaxMode::Channel,
                ),
                (
                    TensorDescriptor::nchw(dt, 4, 16, 5, 5).unwrap(),
                    SoftmaxMode::Instance,
                ),
            ] {
                for (algo, center) in [
                    (SoftmaxAlgorithm::Fast, 0.0),
                    (SoftmaxAlgorithm::Accurate, 100.0),
                    (SoftmaxAlgorithm::Log, 100.0),
                ] {
                    let mut r = rng(11);
                    let xt = random(d, center - 4.0, center + 4.0, &mut r);
                    let x = h.upload_tensor(&xt).unwrap();
                    let mut y = h.alloc(&d).unwrap();
                    softmax_forward(h, algo, mode, 1.0, &d, &x, 0.0, &d, &mut y).unwrap();
                    let yt = h.download_tensor(&d, &y).unwrap();
                    let mut want = HostTensor::filled(d, 0.0);
                    reference::forward(algo, mode, 1.0, &xt, 0.0, &mut want);
                    check(
                        h,
                        &d,
                        &y,
                        &want,
                        bound(dt),
                        &format!("{algo:?} around {center}"),
                    );
                    reference::for_each_row(mode, d.dims(), |row| {
                        let sum: f64 = row
                            .iter()
                            .map(|i| {
                                let v = yt.get(i);
                                if algo == SoftmaxAlgorithm::Log {
                                    v.exp()
                                } else {
                                    v
                                }
                            })
                            .sum();
                        let tol = if dt == DataType::F32 { 1e-5 } else { 2e-2 };
                        assert!((sum - 1.0).abs() < tol, "{algo:?} {dt}: row sums to {sum}");
                    });
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------------

#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    use SoftmaxAlgorithm::Accurate;
    use SoftmaxMode::Channel;
    for h in handles() {
        let d = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let is_bad =
            |e: &Error, want: &str| matches!(e, Error::BadParam { arg, .. } if *arg == want);

        let other = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 6).unwrap();
        let e =
            softmax_forward(h, Accurate, Channel, 1.0, &d, &x, 0.0, &other, &mut y).unwrap_err();
        assert!(is_bad(&e, "y_desc"), "{e}");
        let half = d.with_dtype(DataType::F16).unwrap();
        let e = softmax_forward(h, Accurate, Channel, 1.0, &d, &x, 0.0, &half, &mut y).unwrap_err();
        assert!(is_bad(&e, "y_desc"), "{e}");
        let rank1 = TensorDescriptor::packed(DataType::F32, &[8]).unwrap();
        let e = softmax_forward(h, Accurate, Channel, 1.0, &rank1, &x, 0.0, &rank1, &mut y)
            .unwrap_err();
        assert!(is_bad(&e, "x_desc"), "{e}");
        let mut short = h.alloc_bytes(d.size_bytes() - 1).unwrap();
        let e =
            softmax_forward(h, Accurate, Channel, 1.0, &d, &x, 0.0, &d, &mut short).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "y", .. }), "{e}");
        let e =
            softmax_forward(h, Accurate, Channel, f64::NAN, &d, &x, 0.0, &d, &mut y).unwrap_err();
        assert!(is_bad(&e, "alpha"), "{e}");
        let e = softmax_forward(h, Accurate, Channel, 1.0, &d, &x, f64::INFINITY, &d, &mut y)
            .unwrap_err();
        assert!(is_bad(&e, "beta"), "{e}");
        let overlapping =
            TensorDescriptor::new(DataType::F32, &[2, 3, 4, 5], &[1, 1, 1, 1]).unwrap();
        let e = softmax_forward(
            h,
            Accurate,
            Channel,
            1.0,
            &overlapping,
            &x,
            0.0,
            &overlapping,
            &mut y,
        )
        .unwrap_err();
        assert!(is_bad(&e, "y_desc"), "{e}");
        let stranger = Handle::cpu().alloc(&d).unwrap();
        let e =
            softmax_forward(h, Accurate, Channel, 1.0, &d, &stranger, 0.0, &d, &mut y).unwrap_err();
        assert!(is_bad(&e, "x"), "{e}");

        let e = softmax_backward(
            h, Accurate, Channel, 1.0, &d, &x, &other, &x, 0.0, &d, &mut y,
        )
        .unwrap_err();
        assert!(is_bad(&e, "dy_desc"), "{e}");
        let e = softmax_backward(
            h, Accurate, Channel, 1.0, &d, &x, &d, &x, 0.0, &half, &mut y,
        )
        .unwrap_err();
        assert!(is_bad(&e, "dx_desc"), "{e}");
        let e = softmax_backward(
            h, Accurate, Channel, 1.0, &d, &x, &d, &short, 0.0, &d, &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "dy", .. }), "{e}");
    }
}

#[test]
fn gpu_rejects_f64_as_not_supported() {
    with_gpu("gpu_rejects_f64_as_not_supported", |h| {
        let d = TensorDescriptor::nchw(DataType::F64, 2, 8, 1, 1).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let e = softmax_forward(
            h,
            SoftmaxAlgorithm::Accurate,
            SoftmaxMode::Instance,
            1.0,
            &d,
            &x,
            0.0,
            &d,
            &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    });
}
