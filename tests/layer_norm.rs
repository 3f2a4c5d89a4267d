//! Layer norm and RMS norm: the reference against hand-computed values and finite
//! differences; the GPU against the reference over drawn shapes, normalized ranks,
//! layouts, dtypes (data and weights), affine parameters and epsilons, forward (output and
//! saved statistics) and backward (dx, dscale, dbias), on every kernel path (vectors and
//! mapped elements in registers, streamed long rows, many rows); bad inputs on both
//! handles.

mod common;

use common::*;
use oxidnn::reference::layer_norm as reference;
use oxidnn::*;
use proptest::prelude::*;
use rand::Rng;

/// One layer-norm problem.
#[derive(Clone, Debug)]
struct Case {
    norm: LayerNormDescriptor,
    x: TensorDescriptor,
    y: TensorDescriptor,
    /// The weights' descriptor, and whether scale and bias are passed.
    weights: Option<TensorDescriptor>,
    scale: bool,
    bias: bool,
}

impl Case {
    fn packed(norm: LayerNormDescriptor, dtype: DataType, dims: &[usize], affine: bool) -> Self {
        let x = TensorDescriptor::packed(dtype, dims).unwrap();
        let k = norm.normalized_rank();
        let rms = norm.mode() == NormMode::RmsNorm;
        Case {
            norm,
            x,
            y: x,
            weights: affine
                .then(|| TensorDescriptor::packed(dtype, &dims[dims.len() - k..]).unwrap()),
            scale: affine,
            bias: affine && !rms,
        }
    }

    /// f32 statistics of x's dims with the normalized dims set to 1.
    fn stats(&self) -> TensorDescriptor {
        let mut dims = self.x.dims().to_vec();
        let rank = dims.len();
        for d in &mut dims[rank - self.norm.normalized_rank()..] {
            *d = 1;
        }
        TensorDescriptor::packed(DataType::F32, &dims).unwrap()
    }

    fn rows(&self) -> usize {
        self.stats().element_count()
    }

    fn name(&self) -> String {
        format!(
            "{:?} k={} eps={} x {} y {} weights {:?} scale {} bias {}",
            self.norm.mode(),
            self.norm.normalized_rank(),
            self.norm.epsilon(),
            self.x.problem_string(),
            self.y.problem_string(),
            self.weights.map(|w| w.problem_string()),
            self.scale,
            self.bias
        )
    }
}

/// Inputs as tests draw them: each row around its own offset (so the mean matters), the
/// scale around 1, the bias around 0.
struct Inputs {
    x: HostTensor,
    scale: Option<HostTensor>,
    bias: Option<HostTensor>,
}

fn inputs(c: &Case, seed: u64) -> Inputs {
    let mut r = rng(seed);
    let k = c.norm.normalized_rank();
    let rank = c.x.rank();
    let offsets: Vec<f64> = (0..c.rows()).map(|_| r.gen_range(-3.0..3.0)).collect();
    let outer_dims = c.x.dims()[..rank - k].to_vec();
    let x = HostTensor::from_fn(c.x, |i| {
        let row = i[..rank - k]
            .iter()
            .zip(&outer_dims)
            .fold(0, |acc, (&i, &n)| acc * n + i);
        offsets[row] + r.gen_range(-2.0..2.0)
    });
    let w = |lo: f64, hi: f64, r: &mut rand::rngs::StdRng| c.weights.map(|d| random(d, lo, hi, r));
    let scale = if c.scale { w(0.5, 1.5, &mut r) } else { None };
    let bias = if c.bias { w(-1.0, 1.0, &mut r) } else { None };
    Inputs { x, scale, bias }
}

/// The bound for a norm's output: the dtype's, and a few f32 roundings per element for
/// f32 (the statistics and the normalisation each round).
fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 2e-5,
        d => bound(d),
    }
}

fn run_forward(h: &Handle, c: &Case, with_stats: bool, seed: u64) {
    let inp = inputs(c, seed);
    let x = upload_poisoned(h, &inp.x, false);
    let y0 = random(c.y, -1.0, 1.0, &mut rng(seed ^ 1));
    let mut y = upload_poisoned(h, &y0, true);
    let scale = inp.scale.as_ref().map(|t| upload_poisoned(h, t, false));
    let bias = inp.bias.as_ref().map(|t| upload_poisoned(h, t, false));
    let sd = c.stats();
    let s0 = HostTensor::filled(sd, 0.0);
    let rms = c.norm.mode() == NormMode::RmsNorm;
    let mut mean = (with_stats && !rms).then(|| upload_poisoned(h, &s0, true));
    let mut rstd = with_stats.then(|| upload_poisoned(h, &s0, true));
    layer_norm_forward(
        h,
        &c.norm,
        &c.x,
        &x,
        c.weights.as_ref(),
        scale.as_ref(),
        bias.as_ref(),
        &c.y,
        &mut y,
        with_stats.then_some(&sd),
        mean.as_mut(),
        rstd.as_mut(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", c.name()));
    let mut want = y0.clone();
    let stats = reference::forward(
        &c.norm,
        &inp.x,
        inp.scale.as_ref(),
        inp.bias.as_ref(),
        &mut want,
    );
    check(h, &c.y, &y, &want, tolerance(c.x.dtype()), &c.name());
    let per_row = |v: &[f64]| {
        let mut i = 0;
        HostTensor::from_fn(sd, |_| {
            i += 1;
            v[i - 1]
        })
    };
    if let Some(m) = &mean {
        check(
            h,
            &sd,
            m,
            &per_row(&stats.mean),
            1e-5,
            &format!("mean of {}", c.name()),
        );
    }
    if let Some(r) = &rstd {
        check(
            h,
            &sd,
            r,
            &per_row(&stats.rstd),
            1e-5,
            &format!("rstd of {}", c.name()),
        );
    }
}

fn run_backward(h: &Handle, c: &Case, grads: bool, seed: u64) {
    let inp = inputs(c, seed);
    let mut r = rng(seed ^ 2);
    let dtype = c.x.dtype();
    // dy and dx share x's dims; dy takes y's layout, dx x's.
    let dyt = random(c.y, -1.0, 1.0, &mut r);
    let dd = c.x;
    let sd = c.stats();
    // The saved statistics as the forward leaves them: f32.
    let mut y_scratch = HostTensor::filled(
        TensorDescriptor::packed(DataType::F64, c.x.dims()).unwrap(),
        0.0,
    );
    let x64 = HostTensor::from_fn(
        TensorDescriptor::packed(DataType::F64, c.x.dims()).unwrap(),
        |i| inp.x.get(i),
    );
    let stats = reference::forward(&c.norm, &x64, None, None, &mut y_scratch);
    let rms = c.norm.mode() == NormMode::RmsNorm;
    let (mut mi, mut ri) = (0, 0);
    let mean_t = HostTensor::from_fn(sd, |_| {
        mi += 1;
        stats.mean[mi - 1]
    });
    let rstd_t = HostTensor::from_fn(sd, |_| {
        ri += 1;
        stats.rstd[ri - 1]
    });
    let x = upload_poisoned(h, &inp.x, false);
    let dy = upload_poisoned(h, &dyt, false);
    let scale = inp.scale.as_ref().map(|t| upload_poisoned(h, t, false));
    let mean = (!rms).then(|| upload_poisoned(h, &mean_t, false));
    let rstd = upload_poisoned(h, &rstd_t, false);
    let dx0 = random(dd, -1.0, 1.0, &mut r);
    let mut dx = upload_poisoned(h, &dx0, true);
    let wd = c.weights;
    let w0 = wd.map(|d| HostTensor::filled(d, 0.0));
    let mut dscale =
        (grads && wd.is_some()).then(|| upload_poisoned(h, w0.as_ref().unwrap(), true));
    let mut dbias =
        (grads && wd.is_some() && !rms).then(|| upload_poisoned(h, w0.as_ref().unwrap(), true));
    let ws_bytes =
        layer_norm_backward_workspace_size(h, &c.norm, &c.x, &c.y, &dd, wd.as_ref()).unwrap();
    let mut ws = h.alloc_bytes(ws_bytes).unwrap();
    layer_norm_backward(
        h,
        &c.norm,
        &c.x,
        &x,
        &c.y,
        &dy,
        wd.as_ref(),
        scale.as_ref(),
        &sd,
        mean.as_ref(),
        &rstd,
        &dd,
        &mut dx,
        dscale.as_mut(),
        dbias.as_mut(),
        &mut ws,
    )
    .unwrap_or_else(|e| panic!("backward {}: {e}", c.name()));
    let mut want = dx0.clone();
    let (mean_rows, rstd_rows) = (mean_t.logical(), rstd_t.logical());
    let g = reference::backward(
        &c.norm,
        &inp.x,
        &dyt,
        inp.scale.as_ref(),
        &mean_rows,
        &rstd_rows,
        &mut want,
    );
    let name = format!("backward {}", c.name());
    // dx = rstd (g - mean(g) - xhat mean(g xhat)) cancels, completely where g is nearly
    // parallel to xhat (e.g. RMS norm of one element: dx = rstd g (1 - xhat^2) with xhat^2
    // = x^2 / (x^2 + eps)). f32 arithmetic is good relative to the terms' size, so the
    // bound is relative to the larger of |dx| and |rstd g|.
    let norm2 = |v: &mut dyn Iterator<Item = f64>| v.map(|t| t * t).sum::<f64>().sqrt();
    let k = c.norm.normalized_rank();
    let per_row = |i: &[usize]| {
        let outer = &c.x.dims()[..c.x.rank() - k];
        i[..c.x.rank() - k]
            .iter()
            .zip(outer)
            .fold(0, |a, (&i, &n)| a * n + i)
    };
    let mut terms = vec![];
    for_each_index(c.x.dims(), |i| {
        let gamma = inp.scale.as_ref().map_or(1.0, |s| s.get(&i[i.len() - k..]));
        terms.push(rstd_rows[per_row(i)] * dyt.get(i) * gamma);
    });
    let want_norm = norm2(&mut want.logical().into_iter());
    let conditioning = if want_norm > 0.0 {
        (norm2(&mut terms.into_iter()) / want_norm).clamp(1.0, 1e6)
    } else {
        1.0
    };
    check(
        h,
        &dd,
        &dx,
        &want,
        4.0 * tolerance(dtype) * conditioning,
        &name,
    );
    let per_elem = |d: TensorDescriptor, v: &[f64]| {
        let mut i = 0;
        HostTensor::from_fn(d, |_| {
            i += 1;
            v[i - 1]
        })
    };
    if let (Some(d), Some(b)) = (wd, &dscale) {
        // Sums over all rows in f32: the bound grows with the row count.
        let tol = tolerance(d.dtype()).max(1e-6 * (c.rows() as f64).sqrt());
        check(
            h,
            &d,
            b,
            &per_elem(d, &g.dscale),
            tol,
            &format!("dscale of {name}"),
        );
    }
    if let (Some(d), Some(b)) = (wd, &dbias) {
        let tol = tolerance(d.dtype()).max(1e-6 * (c.rows() as f64).sqrt());
        check(
            h,
            &d,
            b,
            &per_elem(d, &g.dbias),
            tol,
            &format!("dbias of {name}"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------------------

#[test]
fn reference_normalizes_rows_by_hand() {
    let d = TensorDescriptor::packed(DataType::F64, &[2, 4]).unwrap();
    let x = HostTensor::from_fn(d, |i| {
        [[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]][i[0]][i[1]]
    });
    let mut y = HostTensor::filled(d, 0.0);
    let ln = LayerNormDescriptor::layer_norm(1, 1e-5).unwrap();
    let stats = reference::forward(&ln, &x, None, None, &mut y);
    assert_eq!(stats.mean, [2.5, 2.0]);
    let rstd0 = 1.0 / (1.25f64 + 1e-5).sqrt();
    assert!((stats.rstd[0] - rstd0).abs() < 1e-15);
    assert!((y.get(&[0, 0]) + 1.5 * rstd0).abs() < 1e-15);
    assert_eq!(y.get(&[1, 2]), 0.0, "a constant row normalizes to 0");
    let rms = LayerNormDescriptor::rms_norm(1, 1e-6).unwrap();
    let stats = reference::forward(&rms, &x, None, None, &mut y);
    assert_eq!(stats.mean, [0.0, 0.0]);
    let want = 1.0 / (7.5f64 + 1e-6).sqrt();
    assert!((stats.rstd[0] - want).abs() < 1e-15);
    assert!((y.get(&[0, 3]) - 4.0 * want).abs() < 1e-14);
}

/// The backward is the gradient of `sum(dy * y)` (y including the affine parameters), with
/// respect to x, scale and bias.
#[test]
fn reference_backward_matches_finite_differences() {
    let dims = [3usize, 2, 5];
    let f64d = |dims: &[usize]| TensorDescriptor::packed(DataType::F64, dims).unwrap();
    let mut r = rng(5);
    for norm in [
        LayerNormDescriptor::layer_norm(2, 1e-3).unwrap(),
        LayerNormDescriptor::rms_norm(1, 1e-3).unwrap(),
    ] {
        let k = norm.normalized_rank();
        let wd = f64d(&dims[3 - k..]);
        let x = random(f64d(&dims), -2.0, 2.0, &mut r);
        let dy = random(f64d(&dims), -1.0, 1.0, &mut r);
        let scale = random(wd, 0.5, 1.5, &mut r);
        let bias = random(wd, -1.0, 1.0, &mut r);
        let bias = (norm.mode() == NormMode::LayerNorm).then_some(bias);
        let loss = |x: &HostTensor, s: &HostTensor, b: Option<&HostTensor>| {
            let mut y = HostTensor::filled(x.desc, 0.0);
            reference::forward(&norm, x, Some(s), b, &mut y);
            y.logical()
                .iter()
                .zip(dy.logical())
                .map(|(a, b)| a * b)
                .sum::<f64>()
        };
        let mut y = HostTensor::filled(x.desc, 0.0);
        let stats = reference::forward(&norm, &x, Some(&scale), bias.as_ref(), &mut y);
        let mut dx = HostTensor::filled(x.desc, 0.0);
        let g = reference::backward(
            &norm,
            &x,
            &dy,
            Some(&scale),
            &stats.mean,
            &stats.rstd,
            &mut dx,
        );
        let eps = 1e-6;
        for_each_index(&dims, |i| {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp.set(i, x.get(i) + eps);
            xm.set(i, x.get(i) - eps);
            let numeric =
                (loss(&xp, &scale, bias.as_ref()) - loss(&xm, &scale, bias.as_ref())) / (2.0 * eps);
            assert!(
                (numeric - dx.get(i)).abs() < 1e-6,
                "{norm:?} dx{i:?}: {numeric} vs {}",
                dx.get(i)
            );
        });
        for (e, idx) in (0..).zip({
            let mut v = vec![];
            for_each_index(wd.dims(), |i| v.push(i.to_vec()));
            v
        }) {
            let (mut sp, mut sm) = (scale.clone(), scale.clone());
            sp.set(&idx, scale.get(&idx) + eps);
            sm.set(&idx, scale.get(&idx) - eps);
            let numeric =
                (loss(&x, &sp, bias.as_ref()) - loss(&x, &sm, bias.as_ref())) / (2.0 * eps);
            assert!(
                (numeric - g.dscale[e]).abs() < 1e-6,
                "{norm:?} dscale{idx:?}"
            );
            if let Some(b) = &bias {
                let (mut bp, mut bm) = (b.clone(), b.clone());
                bp.set(&idx, b.get(&idx) + eps);
                bm.set(&idx, b.get(&idx) - eps);
                let numeric =
                    (loss(&x, &scale, Some(&bp)) - loss(&x, &scale, Some(&bm))) / (2.0 * eps);
                assert!((numeric - g.dbias[e]).abs() < 1e-6, "{norm:?} dbias{idx:?}");
            }
        }
    }
}

/// The CPU handle runs the same API: forward, statistics and backward in f64.
#[test]
fn cpu_handle_runs_forward_and_backward() {
    for norm in [
        LayerNormDescriptor::layer_norm(2, 1e-5).unwrap(),
        LayerNormDescriptor::rms_norm(1, 1e-5).unwrap(),
    ] {
        let c = Case::packed(norm, DataType::F64, &[3, 4, 5], true);
        let h = Handle::cpu();
        run_forward(&h, &c, true, 1);
        run_backward(&h, &c, true, 2);
        // f32 weights with f64 data.
        let mut c32 = c.clone();
        c32.weights = c.weights.map(|w| w.with_dtype(DataType::F32).unwrap());
        run_forward(&h, &c32, false, 3);
    }
}

// ---------------------------------------------------------------------------------------
// The GPU against the reference
// ---------------------------------------------------------------------------------------

fn any_norm() -> impl Strategy<Value = (NormMode, f64)> {
    (
        prop_oneof![Just(NormMode::LayerNorm), Just(NormMode::RmsNorm)],
        prop_oneof![Just(1e-5), Just(1e-3), Just(0.25)],
    )
}

/// Dims, a normalized rank, two layouts of the dims, a weight layout and dtype.
fn any_case() -> impl Strategy<Value = Case> {
    (
        dims(4, 6000),
        gpu_dtype(),
        any_norm(),
        any::<(u8, bool, bool)>(),
    )
        .prop_flat_map(|(dims, dt, (mode, eps), (k_pick, affine, f32_weights))| {
            let rank = dims.len();
            let k = 1 + k_pick as usize % rank;
            let wdt = if f32_weights { DataType::F32 } else { dt };
            let inner = dims[rank - k..].to_vec();
            (
                layout(dims.clone(), dt),
                layout(dims, dt),
                layout(inner, wdt),
                Just((mode, eps, k, affine)),
            )
        })
        .prop_map(|(x, y, w, (mode, eps, k, affine))| Case {
            norm: LayerNormDescriptor::new(mode, k, eps).unwrap(),
            x,
            y,
            weights: affine.then_some(w),
            scale: affine,
            bias: affine && mode == NormMode::LayerNorm,
        })
}

proptest! {
    #![proptest_config(gpu_cases(64))]

    #[test]
    fn gpu_forward_matches_reference(c in any_case(), stats in any::<bool>(), seed in any::<u64>()) {
        with_gpu("gpu_forward_matches_reference", |h| run_forward(h, &c, stats, seed));
    }

    #[test]
    fn gpu_backward_matches_reference(c in any_case(), grads in any::<bool>(), seed in any::<u64>()) {
        with_gpu("gpu_backward_matches_reference", |h| run_backward(h, &c, grads, seed));
    }
}

/// Dense rows of every length class: vectors in registers (one to many warps per row, one
/// to eight vectors per thread), odd lengths through the mapped kernels, rows too long
/// for registers streamed; each dtype, f32 or same-type weights, both modes.
#[test]
fn gpu_every_kernel_path_matches_reference() {
    with_gpu("gpu_every_kernel_path_matches_reference", |h| {
        let lens = [
            8usize, 64, 96, 256, 1000, 1024, 2048, 4096, 5000, 20_000, 40_000, 97, 4099, 12_345,
        ];
        for dt in DataType::GPU {
            for (i, &d) in lens.iter().enumerate() {
                let rows = (200_000 / d).clamp(3, 64);
                for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
                    let norm = LayerNormDescriptor::new(mode, 1, 1e-5).unwrap();
                    let mut c = Case::packed(norm, dt, &[rows, d], true);
                    if i % 2 == 1 {
                        c.weights = c.weights.map(|w| w.with_dtype(DataType::F32).unwrap());
                    }
                    run_forward(h, &c, true, d as u64);
                    run_backward(h, &c, true, d as u64 + 1);
                }
            }
        }
    });
}

/// Every combination of scale, bias and weight type in both modes (RMS norm has no
/// bias): the forward kernels compile their output pass once per usual combination and
/// share one for the rest (layer norm with a bias alone). Rows in registers as vectors
/// (4096: several warps; 1000: one) and through the element map (97).
#[test]
fn gpu_every_affine_combination_matches_reference() {
    with_gpu("gpu_every_affine_combination_matches_reference", |h| {
        for dt in [DataType::F16, DataType::F32] {
            for dims in [[300usize, 4096], [77, 1000], [5, 97]] {
                for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
                    let norm = LayerNormDescriptor::new(mode, 1, 1e-5).unwrap();
                    for (scale, bias) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        if bias && mode == NormMode::RmsNorm {
                            continue;
                        }
                        for f32_weights in [false, true] {
                            let mut c = Case::packed(norm, dt, &dims, scale || bias);
                            c.scale = scale;
                            c.bias = bias;
                            if f32_weights {
                                c.weights = c.weights.map(|w| w.with_dtype(DataType::F32).unwrap());
                            }
                            run_forward(h, &c, true, dims[1] as u64);
                        }
                    }
                }
            }
        }
    });
}

/// Many rows, and a row count below the GPU's resident blocks, in both modes. With weight
/// gradients the backward's grid fills the GPU once, so with many rows each group works
/// through many, its two register sets taking turns (one-warp groups of 256 and 512
/// elements, multi-warp groups of 4096), and the weight gradients sum thousands of per-row
/// terms through the workspace.
#[test]
fn gpu_many_rows_and_few_rows() {
    with_gpu("gpu_many_rows_and_few_rows", |h| {
        for dt in [DataType::F16, DataType::F32] {
            for dims in [
                [8192usize, 512],
                [50_000, 256],
                [2000, 4096],
                [1, 768],
                [3, 4096],
            ] {
                for mode in [NormMode::LayerNorm, NormMode::RmsNorm] {
                    let norm = LayerNormDescriptor::new(mode, 1, 1e-5).unwrap();
                    let c = Case::packed(norm, dt, &dims, true);
                    run_forward(h, &c, true, 7);
                    run_backward(h, &c, true, 8);
                }
            }
        }
    });
}

/// Rows far from zero and constant rows: the two-pass statistics keep their precision,
/// and a constant row normalizes to the bias.
#[test]
fn gpu_statistics_are_stable() {
    with_gpu("gpu_statistics_are_stable", |h| {
        let d = TensorDescriptor::packed(DataType::F32, &[4, 1024]).unwrap();
        let x = HostTensor::from_fn(d, |i| match i[0] {
            0 => 1000.0 + (i[1] % 7) as f64 * 0.01,
            1 => 3.0,
            _ => (i[1] as f64).sin(),
        });
        let norm = LayerNormDescriptor::layer_norm(1, 1e-5).unwrap();
        let xb = h.upload_tensor(&x).unwrap();
        let mut y = h.alloc(&d).unwrap();
        layer_norm_forward(
            h, &norm, &d, &xb, None, None, None, &d, &mut y, None, None, None,
        )
        .unwrap();
        let mut want = HostTensor::filled(d, 0.0);
        reference::forward(&norm, &x, None, None, &mut want);
        check(h, &d, &y, &want, 1e-4, "rows far from zero");
    });
}

// ---------------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------------

#[test]
fn descriptors_reject_bad_epsilon_and_rank() {
    for eps in [0.0, -1e-5, f64::NAN, f64::INFINITY] {
        let e = LayerNormDescriptor::layer_norm(1, eps).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "epsilon", .. }), "{e}");
    }
    for k in [0, 9] {
        let e = LayerNormDescriptor::rms_norm(k, 1e-5).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadParam {
                    arg: "normalized_rank",
                    ..
                }
            ),
            "{e}"
        );
    }
    // Zero-size tensors cannot be described.
    let e = TensorDescriptor::packed(DataType::F32, &[0, 8]).unwrap_err();
    assert!(matches!(e, Error::BadParam { arg: "dims", .. }), "{e}");
}

/// Every way to call the norms wrongly, on the CPU handle and (where present) the GPU
/// handle: each returns its typed error naming the argument.
#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for h in handles() {
        let dt = DataType::F32;
        let xd = TensorDescriptor::packed(dt, &[4, 6, 8]).unwrap();
        let wd = TensorDescriptor::packed(dt, &[8]).unwrap();
        let sd = TensorDescriptor::packed(DataType::F32, &[4, 6, 1]).unwrap();
        let ln = LayerNormDescriptor::layer_norm(1, 1e-5).unwrap();
        let rms = LayerNormDescriptor::rms_norm(1, 1e-5).unwrap();
        let x = h.alloc(&xd).unwrap();
        let mut y = h.alloc(&xd).unwrap();
        let w = h.alloc(&wd).unwrap();
        let mut m = h.alloc(&sd).unwrap();
        let mut r = h.alloc(&sd).unwrap();
        let fwd = |norm: &LayerNormDescriptor,
                   xd: &TensorDescriptor,
                   x: &Buffer,
                   wd: Option<&TensorDescriptor>,
                   scale: Option<&Buffer>,
                   bias: Option<&Buffer>,
                   y: &mut Buffer,
                   sd: Option<&TensorDescriptor>,
                   m: Option<&mut Buffer>,
                   r: Option<&mut Buffer>| {
            layer_norm_forward(h, norm, xd, x, wd, scale, bias, xd, y, sd, m, r).unwrap_err()
        };
        let is_bad =
            |e: &Error, want: &str| matches!(e, Error::BadParam { arg, .. } if *arg == want);

        // Weights whose dims are not the normalized dims.
        let wrong_w = TensorDescriptor::packed(dt, &[6, 8]).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            Some(&wrong_w),
            Some(&w),
            None,
            &mut y,
            None,
            None,
            None,
        );
        assert!(is_bad(&e, "weight_desc"), "{e}");
        // Weights of a third dtype.
        let bf = wd.with_dtype(DataType::BF16).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            Some(&bf),
            Some(&w),
            None,
            &mut y,
            None,
            None,
            None,
        );
        assert!(is_bad(&e, "weight_desc"), "{e}");
        // A scale without its descriptor.
        let e = fwd(&ln, &xd, &x, None, Some(&w), None, &mut y, None, None, None);
        assert!(is_bad(&e, "weight_desc"), "{e}");
        // RMS norm has no bias and saves no mean.
        let e = fwd(
            &rms,
            &xd,
            &x,
            Some(&wd),
            Some(&w),
            Some(&w),
            &mut y,
            None,
            None,
            None,
        );
        assert!(is_bad(&e, "bias"), "{e}");
        let e = fwd(
            &rms,
            &xd,
            &x,
            None,
            None,
            None,
            &mut y,
            Some(&sd),
            Some(&mut m),
            Some(&mut r),
        );
        assert!(is_bad(&e, "mean"), "{e}");
        // Statistics of the wrong shape or type; a mean without rstd.
        let wrong_s = TensorDescriptor::packed(DataType::F32, &[4, 1, 1]).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            None,
            None,
            None,
            &mut y,
            Some(&wrong_s),
            Some(&mut m),
            Some(&mut r),
        );
        assert!(is_bad(&e, "stats_desc"), "{e}");
        let s16 = sd.with_dtype(DataType::F16).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            None,
            None,
            None,
            &mut y,
            Some(&s16),
            Some(&mut m),
            Some(&mut r),
        );
        assert!(is_bad(&e, "stats_desc"), "{e}");
        let e = fwd(
            &ln,
            &xd,
            &x,
            None,
            None,
            None,
            &mut y,
            Some(&sd),
            Some(&mut m),
            None,
        );
        assert!(is_bad(&e, "rstd"), "{e}");
        // Normalizing more dims than x has.
        let ln4 = LayerNormDescriptor::layer_norm(4, 1e-5).unwrap();
        let e = fwd(&ln4, &xd, &x, None, None, None, &mut y, None, None, None);
        assert!(is_bad(&e, "x_desc"), "{e}");
        // y of other dims or dtype.
        let y16 = xd.with_dtype(DataType::F16).unwrap();
        let e = layer_norm_forward(
            h, &ln, &xd, &x, None, None, None, &y16, &mut y, None, None, None,
        )
        .unwrap_err();
        assert!(is_bad(&e, "y_desc"), "{e}");
        // Short buffers.
        let short = h.alloc_bytes(xd.size_bytes() - 4).unwrap();
        let e = fwd(&ln, &xd, &short, None, None, None, &mut y, None, None, None);
        assert!(matches!(e, Error::BufferTooSmall { arg: "x", .. }), "{e}");
        let short_w = h.alloc_bytes(wd.size_bytes() - 4).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            Some(&wd),
            Some(&short_w),
            None,
            &mut y,
            None,
            None,
            None,
        );
        assert!(
            matches!(e, Error::BufferTooSmall { arg: "scale", .. }),
            "{e}"
        );
        let mut short_s = h.alloc_bytes(sd.size_bytes() - 4).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            None,
            None,
            None,
            &mut y,
            Some(&sd),
            Some(&mut m),
            Some(&mut short_s),
        );
        assert!(
            matches!(e, Error::BufferTooSmall { arg: "rstd", .. }),
            "{e}"
        );

        // Backward: mean missing for layer norm, short workspace, mismatched dy.
        let dy = h.alloc(&xd).unwrap();
        let mut dx = h.alloc(&xd).unwrap();
        let mut ds = h.alloc(&wd).unwrap();
        let mut ws = h.alloc_bytes(0).unwrap();
        let e = layer_norm_backward(
            h,
            &ln,
            &xd,
            &x,
            &xd,
            &dy,
            Some(&wd),
            Some(&w),
            &sd,
            None,
            &r,
            &xd,
            &mut dx,
            None,
            None,
            &mut ws,
        )
        .unwrap_err();
        assert!(is_bad(&e, "mean"), "{e}");
        let other = TensorDescriptor::packed(dt, &[4, 6, 9]).unwrap();
        let e = layer_norm_backward(
            h,
            &ln,
            &xd,
            &x,
            &other,
            &dy,
            None,
            None,
            &sd,
            Some(&m),
            &r,
            &xd,
            &mut dx,
            None,
            None,
            &mut ws,
        )
        .unwrap_err();
        assert!(is_bad(&e, "dy_desc"), "{e}");
        let e = layer_norm_backward(
            h,
            &rms,
            &xd,
            &x,
            &xd,
            &dy,
            Some(&wd),
            None,
            &sd,
            None,
            &r,
            &xd,
            &mut dx,
            None,
            Some(&mut ds),
            &mut ws,
        )
        .unwrap_err();
        assert!(is_bad(&e, "dbias"), "{e}");
        let need = layer_norm_backward_workspace_size(h, &ln, &xd, &xd, &xd, Some(&wd)).unwrap();
        if need > 0 {
            let e = layer_norm_backward(
                h,
                &ln,
                &xd,
                &x,
                &xd,
                &dy,
                Some(&wd),
                Some(&w),
                &sd,
                Some(&m),
                &r,
                &xd,
                &mut dx,
                Some(&mut ds),
                None,
                &mut ws,
            )
            .unwrap_err();
            assert!(matches!(e, Error::WorkspaceTooSmall { .. }), "{e}");
        }
        let stranger = Handle::cpu().alloc(&wd).unwrap();
        let e = fwd(
            &ln,
            &xd,
            &x,
            Some(&wd),
            Some(&stranger),
            None,
            &mut y,
            None,
            None,
            None,
        );
        assert!(is_bad(&e, "scale"), "{e}");
    }
}

#[test]
fn gpu_rejects_f64_as_not_supported() {
    with_gpu("gpu_rejects_f64_as_not_supported", |h| {
        let d = TensorDescriptor::packed(DataType::F64, &[2, 8]).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let norm = LayerNormDescriptor::layer_norm(1, 1e-5).unwrap();
        let e = layer_norm_forward(
            h, &norm, &d, &x, None, None, None, &d, &mut y, None, None, None,
        )
        .unwrap_err();
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    });
}
