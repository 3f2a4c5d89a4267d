//! Batch normalization: the reference against hand-computed values and finite
//! differences, the running averages over several calls, the GPU against the reference
//! (forward training, inference and backward, plain and fused with add + relu) on drawn
//! modes, shapes, layouts, dtypes, blend factors, averaging factors, epsilons and optional
//! outputs, ResNet-like shapes on both thread mappings, numerically hard statistics,
//! determinism, and every kind of bad input on the CPU and GPU handles.

mod common;

use common::*;
use oxidnn::reference::batch_norm as reference;
use oxidnn::*;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Problems and runners
// ---------------------------------------------------------------------------------------

/// Descriptors of one problem: the data tensors `[x, y, z or dy, dx, dz]` and the
/// per-feature tensors.
#[derive(Clone, Debug)]
struct Problem {
    mode: BatchNormMode,
    data: Vec<TensorDescriptor>,
    params: TensorDescriptor,
}

impl Problem {
    /// Every data tensor laid out as `x`, per-feature tensors packed.
    fn dense(mode: BatchNormMode, x: TensorDescriptor) -> Self {
        Self {
            mode,
            data: vec![x; 5],
            params: derive_batch_norm_descriptor(&x, mode).unwrap(),
        }
    }

    fn x(&self) -> TensorDescriptor {
        self.data[0]
    }

    fn dtype(&self) -> DataType {
        self.data[0].dtype()
    }
}

fn mode() -> impl Strategy<Value = BatchNormMode> {
    prop_oneof![
        Just(BatchNormMode::Spatial),
        Just(BatchNormMode::PerActivation)
    ]
}

fn ops() -> impl Strategy<Value = BatchNormOps> {
    prop_oneof![
        2 => Just(BatchNormOps::Bn),
        1 => Just(BatchNormOps::BnActivation),
        1 => Just(BatchNormOps::BnAddActivation)
    ]
}

/// 4-D or 5-D dims of awkward extents, at most about `max_elems` elements, `N >= 3`:
/// training needs two values per feature, and with exactly two (per-activation, `N = 2`)
/// `dx` cancels to rounding noise, which no relative error can judge.
fn data_dims(max_elems: usize) -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![Just(4usize), Just(5)]
        .prop_flat_map(|rank| prop::collection::vec(extent(), rank))
        .prop_map(move |mut d| {
            d[0] = d[0].max(3);
            while d.iter().product::<usize>() > max_elems {
                let i = (1..d.len()).max_by_key(|&i| d[i]).unwrap_or(1);
                d[i] = (d[i] / 2).max(1);
            }
            d
        })
}

/// A drawn problem: each data tensor in its own random layout (dim order and padding), or
/// (half the time) all of them laid out like `x`, so the vector paths run too.
fn problem(max_elems: usize) -> impl Strategy<Value = Problem> {
    (mode(), data_dims(max_elems), gpu_dtype(), any::<bool>()).prop_flat_map(
        |(mode, dims, dt, same)| {
            let x0 = TensorDescriptor::packed(dt, &dims).unwrap();
            let pdims = derive_batch_norm_descriptor(&x0, mode)
                .unwrap()
                .dims()
                .to_vec();
            (
                Just(mode),
                prop::collection::vec(layout(dims, dt), 5),
                layout(pdims, DataType::F32),
                Just(same),
            )
                .prop_map(|(mode, mut data, params, same)| {
                    if same {
                        data = vec![data[0]; 5];
                    }
                    Problem { mode, data, params }
                })
        },
    )
}

/// Tolerance on the relative error norm of data outputs computed from f32 statistics.
fn data_tol(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 5e-5,
        other => bound(other),
    }
}

/// Tolerance of per-feature outputs (f32, accumulated in f32, combined in f64).
const PARAM_TOL: f64 = 2e-5;

fn descriptor(mode: BatchNormMode, ops: BatchNormOps, epsilon: f64) -> BatchNormDescriptor {
    BatchNormDescriptor::new(mode, epsilon)
        .unwrap()
        .with_ops(ops, &ActivationDescriptor::relu())
        .unwrap()
}

/// A workspace of `bytes`, filled with 0xFF so nothing can rely on zeros.
fn poisoned_workspace(h: &Handle, bytes: usize) -> Buffer {
    let mut ws = h.alloc_bytes(bytes).unwrap();
    h.fill_bytes(&mut ws, 0xFF).unwrap();
    ws
}

/// The inputs of a forward pass: `x` around a per-feature offset, `z`, scale, bias.
struct ForwardInputs {
    x: HostTensor,
    z: HostTensor,
    scale: HostTensor,
    bias: HostTensor,
}

fn forward_inputs(p: &Problem, seed: u64) -> ForwardInputs {
    let mut r = rng(seed);
    let offsets = random(p.params, -2.0, 2.0, &mut r);
    let mut x = random(p.x(), -1.5, 1.5, &mut r);
    let desc = x.desc;
    for_each_index(desc.dims(), |i| {
        let f = reference::feature_of(p.mode, i);
        let v = x.get(i) + offsets.get(&f);
        x.set(i, v);
    });
    ForwardInputs {
        x,
        z: random(p.data[2], -1.0, 1.0, &mut r),
        scale: random(p.params, 0.5, 1.5, &mut r),
        bias: random(p.params, -0.5, 0.5, &mut r),
    }
}

/// What a forward-training run varies.
#[derive(Clone, Copy, Debug)]
struct Training {
    ops: BatchNormOps,
    alpha_beta: (f64, f64),
    /// `Some(factor)`: update running statistics.
    factor: Option<f64>,
    epsilon: f64,
    saved: bool,
}

/// Runs forward training on `h` and checks every output against the reference.
fn check_forward_training(h: &Handle, p: &Problem, t: Training, seed: u64) {
    let what = format!("{t:?} {:?} {p:?}", p.mode);
    let bn = descriptor(p.mode, t.ops, t.epsilon);
    let (xd, yd, zd, pd) = (p.data[0], p.data[1], p.data[2], p.params);
    let (alpha, beta) = t.alpha_beta;
    let inputs = forward_inputs(p, seed);
    let mut r = rng(seed ^ 0x5EED);
    let y0 = random(yd, -1.0, 1.0, &mut r);
    let (rm0, rv0) = (random(pd, -1.0, 1.0, &mut r), random(pd, 0.5, 2.0, &mut r));
    let x = upload_poisoned(h, &inputs.x, false);
    let z = upload_poisoned(h, &inputs.z, false);
    let scale = upload_poisoned(h, &inputs.scale, false);
    let bias = upload_poisoned(h, &inputs.bias, false);
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    // With factor 1 the running statistics are overwritten: poison proves they are not read.
    let overwrite = t.factor == Some(1.0);
    let mut rm = upload_poisoned(h, &rm0, overwrite);
    let mut rv = upload_poisoned(h, &rv0, overwrite);
    let zeros = HostTensor::filled(pd, 0.0);
    let mut sm = upload_poisoned(h, &zeros, true);
    let mut si = upload_poisoned(h, &zeros, true);
    let ws_bytes = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
    let mut ws = poisoned_workspace(h, ws_bytes);
    let res_bytes = batch_norm_training_reserve_space_size(h, &bn, &xd).unwrap();
    let mut reserve = poisoned_workspace(h, res_bytes.max(1));
    let add = t.ops == BatchNormOps::BnAddActivation;
    batch_norm_forward_training(
        h,
        &bn,
        alpha,
        beta,
        &xd,
        &x,
        add.then_some((&zd, &z)),
        &yd,
        &mut y,
        &pd,
        &scale,
        &bias,
        t.factor.map(|factor| RunningStats {
            factor,
            mean: &mut rm,
            variance: &mut rv,
        }),
        t.saved.then_some(SavedStats {
            mean: &mut sm,
            inv_std: &mut si,
        }),
        &mut ws,
        Some(&mut reserve),
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    if t.ops != BatchNormOps::Bn && h.is_gpu() {
        check_relu_mask(h, &xd, &reserve, &yd, &y, &what);
    }

    let mut want_y = y0.clone();
    let (mut want_rm, mut want_rv) = (rm0.clone(), rv0.clone());
    let (mut want_sm, mut want_si) = (zeros.clone(), zeros.clone());
    reference::forward_training(
        p.mode,
        t.ops,
        alpha,
        beta,
        &inputs.x,
        add.then_some(&inputs.z),
        &mut want_y,
        &inputs.scale,
        &inputs.bias,
        t.epsilon,
        t.factor.map(|f| (f, &mut want_rm, &mut want_rv)),
        Some((&mut want_sm, &mut want_si)),
    );
    // The means' magnitudes: the same statistics of |x| and |running mean| (a mean of
    // values of either sign, and the running blend, may cancel to near zero).
    let abs = |t: &HostTensor| HostTensor::from_fn(t.desc, |i| t.get(i).abs());
    let (mut mag_rm, mut mag_rv) = (abs(&rm0), rv0.clone());
    let (mut mag_sm, mut mag_si) = (zeros.clone(), zeros.clone());
    reference::forward_training(
        p.mode,
        BatchNormOps::Bn,
        1.0,
        0.0,
        &abs(&inputs.x),
        None,
        &mut y0.clone(),
        &inputs.scale,
        &inputs.bias,
        t.epsilon,
        t.factor.map(|f| (f, &mut mag_rm, &mut mag_rv)),
        Some((&mut mag_sm, &mut mag_si)),
    );
    check(
        h,
        &yd,
        &y,
        &want_y,
        data_tol(p.dtype()),
        &format!("y of {what}"),
    );
    if t.factor.is_some() {
        check_scaled(
            h,
            &pd,
            &rm,
            &want_rm,
            &mag_rm,
            PARAM_TOL,
            &format!("running mean of {what}"),
        );
        check(
            h,
            &pd,
            &rv,
            &want_rv,
            PARAM_TOL,
            &format!("running var of {what}"),
        );
    }
    if t.saved {
        check_scaled(
            h,
            &pd,
            &sm,
            &want_sm,
            &mag_sm,
            PARAM_TOL,
            &format!("saved mean of {what}"),
        );
        check(
            h,
            &pd,
            &si,
            &want_si,
            PARAM_TOL,
            &format!("saved inv std of {what}"),
        );
    }
}

/// Runs inference on `h` and checks `y` against the reference.
fn check_forward_inference(
    h: &Handle,
    p: &Problem,
    ops: BatchNormOps,
    (alpha, beta): (f64, f64),
    epsilon: f64,
    seed: u64,
) {
    let what = format!("inference {ops:?} {p:?}");
    let bn = descriptor(p.mode, ops, epsilon);
    let (xd, yd, zd, pd) = (p.data[0], p.data[1], p.data[2], p.params);
    let inputs = forward_inputs(p, seed);
    let mut r = rng(seed ^ 0x1F);
    let y0 = random(yd, -1.0, 1.0, &mut r);
    let (mean, var) = (random(pd, -2.0, 2.0, &mut r), random(pd, 0.2, 3.0, &mut r));
    let x = upload_poisoned(h, &inputs.x, false);
    let z = upload_poisoned(h, &inputs.z, false);
    let up = |t: &HostTensor| upload_poisoned(h, t, false);
    let (scale, bias, mb, vb) = (up(&inputs.scale), up(&inputs.bias), up(&mean), up(&var));
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    let add = ops == BatchNormOps::BnAddActivation;
    batch_norm_forward_inference(
        h,
        &bn,
        alpha,
        beta,
        &xd,
        &x,
        add.then_some((&zd, &z)),
        &yd,
        &mut y,
        &pd,
        &scale,
        &bias,
        EstimatedStats {
            mean: &mb,
            variance: &vb,
        },
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut want = y0;
    reference::forward_inference(
        p.mode,
        ops,
        alpha,
        beta,
        &inputs.x,
        add.then_some(&inputs.z),
        &mut want,
        &inputs.scale,
        &inputs.bias,
        &mean,
        &var,
        epsilon,
    );
    check(h, &yd, &y, &want, data_tol(p.dtype()), &what);
}

/// The relu mask a GPU forward training pass left in `reserve`: bit `i` (at `x`'s element
/// offset `i`) set exactly where the stored `y` is positive.
fn check_relu_mask(
    h: &Handle,
    xd: &TensorDescriptor,
    reserve: &Buffer,
    yd: &TensorDescriptor,
    y: &Buffer,
    what: &str,
) {
    let bits = h.read_bytes(reserve).unwrap();
    let y = HostTensor::from_bytes(*yd, &h.read_bytes(y).unwrap());
    for_each_index(xd.dims(), |i| {
        let o = xd.offset_of(i);
        let bit = (bits[o / 8] >> (o % 8)) & 1 == 1;
        assert_eq!(bit, y.get(i) > 0.0, "{what}: relu mask bit of {i:?}");
    });
}

/// What a backward run varies.
#[derive(Clone, Copy, Debug)]
struct Backward {
    ops: BatchNormOps,
    data: (f64, f64),
    param: (f64, f64),
    epsilon: f64,
    /// Use the saved statistics (else they are recomputed from `x`).
    saved: bool,
    /// Behind a relu on the GPU: `y` and the reserve space's relu mask from a forward
    /// training pass (else any `y` and no reserve space).
    reserve: bool,
}

/// Runs backward on `h` and checks `dx`, `dz`, `dscale`, `dbias` against the reference.
fn check_backward(h: &Handle, p: &Problem, b: Backward, seed: u64) {
    let what = format!("{b:?} {p:?}");
    let bn = descriptor(p.mode, b.ops, b.epsilon);
    let [xd, yd, dyd, dxd, dzd] = [0, 1, 2, 3, 4].map(|i| p.data[i]);
    let pd = p.params;
    let inputs = forward_inputs(p, seed);
    let mut r = rng(seed ^ 0xB0);
    // Any y works as the relu mask; about half of it positive.
    let mut yt = random(yd, -1.0, 1.0, &mut r);
    let dyt = random(dyd, -1.0, 1.0, &mut r);
    let (dx0, dz0) = (
        random(dxd, -1.0, 1.0, &mut r),
        random(dzd, -1.0, 1.0, &mut r),
    );
    let (ds0, db0) = (random(pd, -1.0, 1.0, &mut r), random(pd, -1.0, 1.0, &mut r));
    // The saved statistics as forward training leaves them.
    let (mut sm, mut si) = (HostTensor::filled(pd, 0.0), HostTensor::filled(pd, 0.0));
    let mut scratch = HostTensor::filled(dxd, 0.0);
    reference::forward_training(
        p.mode,
        BatchNormOps::Bn,
        1.0,
        0.0,
        &inputs.x,
        None,
        &mut scratch,
        &inputs.scale,
        &inputs.bias,
        b.epsilon,
        None,
        Some((&mut sm, &mut si)),
    );
    let up = |t: &HostTensor| upload_poisoned(h, t, false);
    let (x, mut y, dy, scale) = (up(&inputs.x), up(&yt), up(&dyt), up(&inputs.scale));
    let relu = b.ops != BatchNormOps::Bn;
    let reserve = (b.reserve && relu && h.is_gpu()).then(|| {
        let res_bytes = batch_norm_training_reserve_space_size(h, &bn, &xd).unwrap();
        let mut reserve = poisoned_workspace(h, res_bytes);
        let fwd_ws = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
        let z = up(&random(dyd, -1.0, 1.0, &mut r));
        batch_norm_forward_training(
            h,
            &bn,
            1.0,
            0.0,
            &xd,
            &x,
            (b.ops == BatchNormOps::BnAddActivation).then_some((&dyd, &z)),
            &yd,
            &mut y,
            &pd,
            &scale,
            &up(&inputs.bias),
            None,
            None,
            &mut poisoned_workspace(h, fwd_ws),
            Some(&mut reserve),
        )
        .unwrap_or_else(|e| panic!("{what}: forward: {e}"));
        yt = HostTensor::from_bytes(yd, &h.read_bytes(&y).unwrap());
        reserve
    });
    let (smb, sib) = (up(&sm), up(&si));
    let (alpha_d, beta_d) = b.data;
    let (alpha_p, beta_p) = b.param;
    let mut dx = upload_poisoned(h, &dx0, beta_d == 0.0);
    let mut dz = upload_poisoned(h, &dz0, beta_d == 0.0);
    let mut ds = upload_poisoned(h, &ds0, beta_p == 0.0);
    let mut db = upload_poisoned(h, &db0, beta_p == 0.0);
    let ws_bytes = batch_norm_backward_workspace_size(h, &bn, &xd).unwrap();
    let mut ws = poisoned_workspace(h, ws_bytes);
    let add = b.ops == BatchNormOps::BnAddActivation;
    batch_norm_backward(
        h,
        &bn,
        alpha_d,
        beta_d,
        alpha_p,
        beta_p,
        &xd,
        &x,
        relu.then_some((&yd, &y)),
        &dyd,
        &dy,
        if add { Some((&dzd, &mut dz)) } else { None },
        &dxd,
        &mut dx,
        &pd,
        &scale,
        &mut ds,
        &mut db,
        b.saved.then_some(SavedStatsRef {
            mean: &smb,
            inv_std: &sib,
        }),
        &mut ws,
        reserve.as_ref(),
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (mut want_dx, mut want_dz) = (dx0.clone(), dz0.clone());
    let (mut want_ds, mut want_db) = (ds0.clone(), db0.clone());
    reference::backward(
        p.mode,
        b.ops,
        b.data,
        b.param,
        &inputs.x,
        relu.then_some(&yt),
        &dyt,
        reference::DataGrads {
            dx: &mut want_dx,
            dz: if add { Some(&mut want_dz) } else { None },
        },
        &inputs.scale,
        reference::ParamGrads {
            dscale: &mut want_ds,
            dbias: &mut want_db,
        },
        b.epsilon,
        b.saved.then_some((&sm, &si)),
    );
    let dx_tol = match p.dtype() {
        DataType::F32 => 2e-4,
        other => bound(other),
    };
    check(h, &dxd, &dx, &want_dx, dx_tol, &format!("dx of {what}"));
    if add {
        check(
            h,
            &dzd,
            &dz,
            &want_dz,
            data_tol(p.dtype()),
            &format!("dz of {what}"),
        );
    }
    check(h, &pd, &ds, &want_ds, 1e-4, &format!("dscale of {what}"));
    check(h, &pd, &db, &want_db, 1e-4, &format!("dbias of {what}"));
}

// ---------------------------------------------------------------------------------------
// The reference
// ---------------------------------------------------------------------------------------

#[test]
fn reference_normalizes_and_updates_running_statistics_as_cudnn_defines() {
    let h = Handle::cpu();
    // One channel, four values: mean 4, biased variance 5, unbiased 20/3.
    let xd = TensorDescriptor::nchw(DataType::F64, 2, 1, 1, 2).unwrap();
    let pd = derive_batch_norm_descriptor(&xd, BatchNormMode::Spatial).unwrap();
    assert_eq!((pd.dims(), pd.dtype()), (&[1, 1, 1, 1][..], DataType::F64));
    let x = h.upload(&[1.0f64, 3.0, 5.0, 7.0]).unwrap();
    let mut y = h.alloc(&xd).unwrap();
    let (scale, bias) = (h.upload(&[2.0f64]).unwrap(), h.upload(&[0.5f64]).unwrap());
    let (mut rm, mut rv) = (h.upload(&[1.0f64]).unwrap(), h.upload(&[2.0f64]).unwrap());
    let (mut sm, mut si) = (h.alloc(&pd).unwrap(), h.alloc(&pd).unwrap());
    let mut ws = h.alloc_bytes(0).unwrap();
    let eps = 1e-3;
    let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, eps).unwrap();
    batch_norm_forward_training(
        &h,
        &bn,
        1.0,
        0.0,
        &xd,
        &x,
        None,
        &xd,
        &mut y,
        &pd,
        &scale,
        &bias,
        Some(RunningStats {
            factor: 0.25,
            mean: &mut rm,
            variance: &mut rv,
        }),
        Some(SavedStats {
            mean: &mut sm,
            inv_std: &mut si,
        }),
        &mut ws,
        None,
    )
    .unwrap();
    let inv = 1.0 / (5.0f64 + eps).sqrt();
    let want: Vec<f64> = [1.0, 3.0, 5.0, 7.0]
        .iter()
        .map(|v| 2.0 * (v - 4.0) * inv + 0.5)
        .collect();
    let got = h.read::<f64>(&y).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
    }
    assert_eq!(h.read::<f64>(&rm).unwrap(), [0.75 * 1.0 + 0.25 * 4.0]);
    let rv_got = h.read::<f64>(&rv).unwrap()[0];
    assert!((rv_got - (0.75 * 2.0 + 0.25 * 20.0 / 3.0)).abs() < 1e-12);
    assert_eq!(h.read::<f64>(&sm).unwrap(), [4.0]);
    assert!((h.read::<f64>(&si).unwrap()[0] - inv).abs() < 1e-15);
}

/// `sum(w * y)` of forward training with weights `w`, for finite differences.
fn weighted_output(p: &Problem, ops: BatchNormOps, i: &ForwardInputs, w: &HostTensor) -> f64 {
    let mut y = HostTensor::filled(p.data[1], 0.0);
    let add = ops == BatchNormOps::BnAddActivation;
    reference::forward_training(
        p.mode,
        ops,
        1.0,
        0.0,
        &i.x,
        add.then_some(&i.z),
        &mut y,
        &i.scale,
        &i.bias,
        1e-3,
        None,
        None,
    );
    let mut s = 0.0;
    for_each_index(p.data[1].dims(), |idx| s += w.get(idx) * y.get(idx));
    s
}

#[test]
fn reference_backward_matches_finite_differences_of_forward_training() {
    for mode in [BatchNormMode::Spatial, BatchNormMode::PerActivation] {
        for ops in [
            BatchNormOps::Bn,
            BatchNormOps::BnActivation,
            BatchNormOps::BnAddActivation,
        ] {
            let xd = TensorDescriptor::nchw(DataType::F64, 3, 2, 2, 3).unwrap();
            let p = Problem::dense(mode, xd);
            let inputs = forward_inputs(&p, 7);
            let w = random(xd, -1.0, 1.0, &mut rng(8));
            // y of the forward pass: the relu mask.
            let mut y = HostTensor::filled(xd, 0.0);
            let add = ops == BatchNormOps::BnAddActivation;
            reference::forward_training(
                mode,
                ops,
                1.0,
                0.0,
                &inputs.x,
                add.then_some(&inputs.z),
                &mut y,
                &inputs.scale,
                &inputs.bias,
                1e-3,
                None,
                None,
            );
            let mut dx = HostTensor::filled(xd, 0.0);
            let mut dz = HostTensor::filled(xd, 0.0);
            let mut ds = HostTensor::filled(p.params, 0.0);
            let mut db = HostTensor::filled(p.params, 0.0);
            reference::backward(
                mode,
                ops,
                (1.0, 0.0),
                (1.0, 0.0),
                &inputs.x,
                Some(&y),
                &w,
                reference::DataGrads {
                    dx: &mut dx,
                    dz: Some(&mut dz),
                },
                &inputs.scale,
                reference::ParamGrads {
                    dscale: &mut ds,
                    dbias: &mut db,
                },
                1e-3,
                None,
            );
            let hstep = 1e-6;
            // d/dx, d/dz at every element; d/dscale, d/dbias at every feature.
            let numeric = |perturb: &dyn Fn(&mut ForwardInputs, f64)| {
                let mut plus = clone_inputs(&inputs);
                perturb(&mut plus, hstep);
                let mut minus = clone_inputs(&inputs);
                perturb(&mut minus, -hstep);
                (weighted_output(&p, ops, &plus, &w) - weighted_output(&p, ops, &minus, &w))
                    / (2.0 * hstep)
            };
            for_each_index(xd.dims(), |i| {
                let n = numeric(&|t, d| {
                    let v = t.x.get(i);
                    t.x.set(i, v + d)
                });
                assert!(
                    (n - dx.get(i)).abs() < 1e-5,
                    "{mode:?} {ops:?} dx{i:?}: {n} vs {}",
                    dx.get(i)
                );
                if add {
                    let n = numeric(&|t, d| {
                        let v = t.z.get(i);
                        t.z.set(i, v + d)
                    });
                    assert!(
                        (n - dz.get(i)).abs() < 1e-5,
                        "dz{i:?}: {n} vs {}",
                        dz.get(i)
                    );
                }
            });
            for_each_index(p.params.dims(), |f| {
                let n = numeric(&|t, d| {
                    let v = t.scale.get(f);
                    t.scale.set(f, v + d)
                });
                assert!(
                    (n - ds.get(f)).abs() < 1e-5,
                    "{mode:?} {ops:?} dscale{f:?}: {n} vs {}",
                    ds.get(f)
                );
                let n = numeric(&|t, d| {
                    let v = t.bias.get(f);
                    t.bias.set(f, v + d)
                });
                assert!(
                    (n - db.get(f)).abs() < 1e-5,
                    "dbias{f:?}: {n} vs {}",
                    db.get(f)
                );
            });
        }
    }
}

fn clone_inputs(i: &ForwardInputs) -> ForwardInputs {
    ForwardInputs {
        x: i.x.clone(),
        z: i.z.clone(),
        scale: i.scale.clone(),
        bias: i.bias.clone(),
    }
}

#[test]
fn running_statistics_become_the_cumulative_average_with_factor_one_over_n() {
    for h in handles() {
        for dt in [DataType::F32, DataType::F16] {
            if dt != DataType::F32 && !h.is_gpu() {
                continue;
            }
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                let xd = TensorDescriptor::nchw_with(dt, 4, 3, 5, 6, layout).unwrap();
                let pd = derive_batch_norm_descriptor(&xd, BatchNormMode::Spatial).unwrap();
                let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5).unwrap();
                let ones = HostTensor::filled(pd, 1.0);
                let (scale, bias) = (
                    h.upload_tensor(&ones).unwrap(),
                    h.upload_tensor(&ones).unwrap(),
                );
                // Garbage in the running buffers: the first call (factor 1) must not read it.
                let mut rm = h.alloc(&pd).unwrap();
                let mut rv = h.alloc(&pd).unwrap();
                h.fill_bytes(&mut rm, 0xFF).unwrap();
                h.fill_bytes(&mut rv, 0xFF).unwrap();
                let mut y = h.alloc(&xd).unwrap();
                let bytes = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
                let mut ws = h.alloc_bytes(bytes).unwrap();
                let (mut want_m, mut want_v) = (vec![0.0; 3], vec![0.0; 3]);
                let calls = 4;
                for n in 0..calls {
                    let xt = random(xd, -1.0 + n as f64, 2.0 + n as f64, &mut rng(100 + n));
                    let stats = reference::BatchStats::of(BatchNormMode::Spatial, &xt);
                    let m = stats.count as f64;
                    for c in 0..3 {
                        want_m[c] += stats.mean(&[0, c, 0, 0]) / calls as f64;
                        want_v[c] += stats.variance(&[0, c, 0, 0]) * m / (m - 1.0) / calls as f64;
                    }
                    let x = h.upload_tensor(&xt).unwrap();
                    batch_norm_forward_training(
                        h,
                        &bn,
                        1.0,
                        0.0,
                        &xd,
                        &x,
                        None,
                        &xd,
                        &mut y,
                        &pd,
                        &scale,
                        &bias,
                        Some(RunningStats {
                            factor: 1.0 / (1.0 + n as f64),
                            mean: &mut rm,
                            variance: &mut rv,
                        }),
                        None,
                        &mut ws,
                        None,
                    )
                    .unwrap();
                }
                let (gm, gv) = (h.read::<f32>(&rm).unwrap(), h.read::<f32>(&rv).unwrap());
                for c in 0..3 {
                    assert!(
                        (gm[c] as f64 - want_m[c]).abs() < 1e-5,
                        "{h:?} {dt} mean {gm:?} vs {want_m:?}"
                    );
                    assert!(
                        (gv[c] as f64 - want_v[c]).abs() < 1e-5,
                        "{h:?} {dt} var {gv:?} vs {want_v:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn cpu_handle_runs_every_pass_on_f64_with_any_layout() {
    let h = Handle::cpu();
    let x = TensorDescriptor::nchw_with(DataType::F64, 3, 4, 2, 5, Layout::ChannelsLast).unwrap();
    for mode in [BatchNormMode::Spatial, BatchNormMode::PerActivation] {
        let p = Problem::dense(mode, x);
        for ops in [BatchNormOps::Bn, BatchNormOps::BnAddActivation] {
            let t = Training {
                ops,
                alpha_beta: (0.5, 0.25),
                factor: Some(0.1),
                epsilon: 1e-5,
                saved: true,
            };
            check_forward_training(&h, &p, t, 1);
            check_forward_inference(&h, &p, ops, (1.0, 0.0), 1e-5, 2);
            let b = Backward {
                ops,
                data: (1.0, 0.5),
                param: (1.0, 1.0),
                epsilon: 1e-5,
                saved: false,
                reserve: true,
            };
            check_backward(&h, &p, b, 3);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The GPU against the reference
// ---------------------------------------------------------------------------------------

fn factor() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        Just(Some(1.0)),
        Just(Some(0.1)),
        Just(Some(0.0))
    ]
}

fn epsilon() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(1e-5),
        Just(1e-3),
        Just(0.1),
        Just(BN_MIN_EPSILON + 1e-9)
    ]
}

proptest! {
    #![proptest_config(gpu_cases(64))]

    #[test]
    fn gpu_forward_training_matches_reference(
        p in problem(6000), ops in ops(), alpha_beta in alpha_beta(), factor in factor(),
        epsilon in epsilon(), saved in any::<bool>(), seed in any::<u64>(),
    ) {
        with_gpu("gpu_forward_training_matches_reference", |h| {
            check_forward_training(h, &p, Training { ops, alpha_beta, factor, epsilon, saved }, seed);
        });
    }

    #[test]
    fn gpu_forward_inference_matches_reference(
        p in problem(6000), ops in ops(), ab in alpha_beta(), epsilon in epsilon(),
        seed in any::<u64>(),
    ) {
        with_gpu("gpu_forward_inference_matches_reference", |h| {
            check_forward_inference(h, &p, ops, ab, epsilon, seed);
        });
    }

    #[test]
    fn gpu_backward_matches_reference(
        p in problem(6000), ops in ops(), data in alpha_beta(), param in alpha_beta(),
        epsilon in epsilon(), saved in any::<bool>(), reserve in any::<bool>(),
        seed in any::<u64>(),
    ) {
        with_gpu("gpu_backward_matches_reference", |h| {
            let b = Backward { ops, data, param, epsilon, saved, reserve };
            check_backward(h, &p, b, seed);
        });
    }
}

/// Smaller ResNet-50 activations, and long reductions split into many chunks, in NCHW
/// (rows mapping) and NHWC (cols mapping), every dtype: every pass and fused variant.
#[test]
fn gpu_resnet_like_shapes_in_nchw_and_nhwc() {
    with_gpu("gpu_resnet_like_shapes_in_nchw_and_nhwc", |h| {
        let shapes = [
            [4, 64, 28, 28],
            [4, 256, 14, 14],
            [2, 2048, 7, 7],
            [64, 8, 32, 32],
            [3, 24, 17, 19],
        ];
        for dims in shapes {
            for dt in DataType::GPU {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let [n, c, hh, w] = dims;
                    let x = TensorDescriptor::nchw_with(dt, n, c, hh, w, layout).unwrap();
                    let p = Problem::dense(BatchNormMode::Spatial, x);
                    let seed = (n * c * hh * w) as u64;
                    for ops in [BatchNormOps::Bn, BatchNormOps::BnAddActivation] {
                        let t = Training {
                            ops,
                            alpha_beta: (1.0, 0.0),
                            factor: Some(0.1),
                            epsilon: 1e-5,
                            saved: true,
                        };
                        check_forward_training(h, &p, t, seed);
                        let b = Backward {
                            ops,
                            data: (1.0, 0.0),
                            param: (1.0, 0.0),
                            epsilon: 1e-5,
                            saved: ops == BatchNormOps::Bn,
                            reserve: true,
                        };
                        check_backward(h, &p, b, seed + 1);
                    }
                    // Plain (the cols mapping's plain-epilogue kernel) and with a relu.
                    for ops in [BatchNormOps::Bn, BatchNormOps::BnActivation] {
                        check_forward_inference(h, &p, ops, (1.0, 0.0), 1e-5, seed);
                    }
                }
            }
        }
    });
}

/// Training forward then backward (saved statistics) of `p`: plain, fused with add + relu
/// as a network runs it (alpha 1, beta 0: the kernels' constant epilogue; the backward
/// reads the relu mask from the reserve space), and fused with blended outputs and
/// parameter gradients (the backward reads `y`); seeds `seed` and `seed + 1`.
fn check_training_plain_and_fused(h: &Handle, p: &Problem, seed: u64) {
    for (ops, blend) in [
        (BatchNormOps::Bn, (1.0, 0.0)),
        (BatchNormOps::BnAddActivation, (1.0, 0.0)),
        (BatchNormOps::BnAddActivation, (0.75, 0.5)),
    ] {
        let t = Training {
            ops,
            alpha_beta: blend,
            factor: Some(0.25),
            epsilon: 1e-5,
            saved: true,
        };
        check_forward_training(h, p, t, seed);
        let b = Backward {
            ops,
            data: blend,
            param: (0.5, 0.25),
            epsilon: 1e-5,
            saved: true,
            // The mask as a network's reserve space carries it, and y, blended.
            reserve: blend == (1.0, 0.0),
        };
        check_backward(h, p, b, seed + 1);
    }
}

/// Many channels of short reductions (NCHW 2048x7x7, 1024x14x14): a block per channel
/// reduces, finalizes and normalizes its channel in one launch, forward and backward
/// (with the saved statistics), plain and fused with add + relu, blended outputs, every
/// dtype; NHWC runs the three-pass kernels on the same problems.
#[test]
fn gpu_one_launch_training_of_many_short_channels() {
    with_gpu("gpu_one_launch_training_of_many_short_channels", |h| {
        // The third's channels (50 KB of f32 each) take more than the default 48 KB of
        // shared memory in the staged forward; the last's (100 KB of f32) leave room for
        // two blocks an SM, where the masked forward takes its unrolled kernel.
        for dims in [
            [16, 2048, 7, 7],
            [8, 1024, 14, 14],
            [16, 512, 28, 28],
            [32, 192, 28, 28],
        ] {
            for dt in DataType::GPU {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let [n, c, hh, w] = dims;
                    let x = TensorDescriptor::nchw_with(dt, n, c, hh, w, layout).unwrap();
                    let p = Problem::dense(BatchNormMode::Spatial, x);
                    check_training_plain_and_fused(h, &p, 21);
                }
            }
        }
        // Channels of 48 KB of f32 exactly: they fit the default dynamic shared memory
        // alone, not beside the staged forward's static shared memory.
        let x = TensorDescriptor::nchw(DataType::F32, 12, 256, 32, 32).unwrap();
        check_training_plain_and_fused(h, &Problem::dense(BatchNormMode::Spatial, x), 21);
    });
}

/// NHWC training in one cooperative launch that keeps each block's first rows in shared
/// memory: 26-51 MB tensors (half stays on chip, the rest is read twice; the grid walks
/// the streamed rows together, a block-wide step of rows a block in turn) and 6 MB ones
/// (all on chip), forward and backward, plain and fused with add + relu, blended outputs.
/// (`OXIDNN_BN_RESIDENT=0` runs the whole suite on the three-launch path instead, `=1` on
/// the resident kernels wherever they can run.)
#[test]
fn gpu_resident_training_on_and_off_chip() {
    with_gpu("gpu_resident_training_on_and_off_chip", |h| {
        for (dims, dt) in [
            ([32, 64, 112, 112], DataType::F16),
            ([8, 64, 112, 112], DataType::F32),
            ([2, 2048, 24, 32], DataType::BF16),
        ] {
            let [n, c, hh, w] = dims;
            let x = TensorDescriptor::nchw_with(dt, n, c, hh, w, Layout::ChannelsLast).unwrap();
            let p = Problem::dense(BatchNormMode::Spatial, x);
            check_training_plain_and_fused(h, &p, 31);
        }
    });
}

/// The resident kernels' interleaved walk over a row count of no round size (5 * 211 *
/// 229 rows of 64 features, 31 MB in f16): forward and backward stream part of their rows,
/// the last block-wide step of rows is short and the chunks do not divide the steps, so
/// chunks get different numbers of steps and one of them a partial step. (Its own test:
/// the CPU reference of a tensor this size takes minutes, so it runs beside the others.)
#[test]
fn gpu_resident_training_over_an_odd_row_count() {
    with_gpu("gpu_resident_training_over_an_odd_row_count", |h| {
        let x = TensorDescriptor::nchw_with(DataType::F16, 5, 64, 211, 229, Layout::ChannelsLast)
            .unwrap();
        let p = Problem::dense(BatchNormMode::Spatial, x);
        check_training_plain_and_fused(h, &p, 37);
    });
}

/// NCHW training over tensors larger than L2 (40 MiB and more) runs as one cooperative
/// launch whose blocks take each channel's statistics, finalize it and apply it a few
/// channels later, while the channel is still in L2: the plain forward, and the backward
/// (saved statistics) plain, with add + relu (reading the relu mask) and with blended
/// outputs, on one handle, so each launch finds the counters the one before left (the
/// fused forwards run three launches). Here f32 in 16-byte vectors (14x64x112x112, 45 MB).
/// (`OXIDNN_BN_PIPELINE=1` runs the whole suite's NCHW training on the pipelined kernels,
/// the fused forward's too, `=0` on the three launches.)
#[test]
fn gpu_pipelined_training_of_channels_larger_than_l2() {
    with_gpu("gpu_pipelined_training_of_channels_larger_than_l2", |h| {
        let x = TensorDescriptor::nchw(DataType::F32, 14, 64, 112, 112).unwrap();
        check_training_plain_and_fused(h, &Problem::dense(BatchNormMode::Spatial, x), 41);
    });
}

/// The pipelined training over an odd plane (8x48x163x167 f32, 42 MB), read element by
/// element: chunks cross the planes' ends and the relu mask's words are shared between
/// channels. (Its own test, beside the other: each CPU reference takes seconds.)
#[test]
fn gpu_pipelined_training_over_an_odd_plane() {
    with_gpu("gpu_pipelined_training_over_an_odd_plane", |h| {
        let x = TensorDescriptor::nchw(DataType::F32, 8, 48, 163, 167).unwrap();
        check_training_plain_and_fused(h, &Problem::dense(BatchNormMode::Spatial, x), 43);
    });
}

/// Per-activation mode on 4-D and 5-D tensors in both layouts.
#[test]
fn gpu_per_activation_mode_in_every_layout() {
    with_gpu("gpu_per_activation_mode_in_every_layout", |h| {
        for dt in DataType::GPU {
            for dims in [vec![16, 32, 4, 4], vec![33, 3, 5, 7], vec![5, 8, 2, 4, 6]] {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    let x = TensorDescriptor::spatial(dt, dims[0], dims[1], &dims[2..], layout)
                        .unwrap();
                    let p = Problem::dense(BatchNormMode::PerActivation, x);
                    let t = Training {
                        ops: BatchNormOps::BnActivation,
                        alpha_beta: (1.0, 0.0),
                        factor: Some(0.5),
                        epsilon: 1e-4,
                        saved: true,
                    };
                    check_forward_training(h, &p, t, 11);
                    let b = Backward {
                        ops: BatchNormOps::BnActivation,
                        data: (1.0, 0.0),
                        param: (1.0, 0.0),
                        epsilon: 1e-4,
                        saved: false,
                        reserve: true,
                    };
                    check_backward(h, &p, b, 12);
                }
            }
        }
    });
}

/// Values with a large common offset: a one-pass `E[x^2] - E[x]^2` in f32 would lose every
/// digit of the variance; Welford/Chan moments keep it.
#[test]
fn gpu_statistics_stay_accurate_on_a_large_offset() {
    with_gpu("gpu_statistics_stay_accurate_on_a_large_offset", |h| {
        for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
            let xd = TensorDescriptor::nchw_with(DataType::F32, 16, 4, 32, 32, layout).unwrap();
            let pd = derive_batch_norm_descriptor(&xd, BatchNormMode::Spatial).unwrap();
            let xt = random(xd, 1e3 - 1.0, 1e3 + 1.0, &mut rng(5));
            let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 0.0).unwrap();
            let x = h.upload_tensor(&xt).unwrap();
            let ones = h.upload_tensor(&HostTensor::filled(pd, 1.0)).unwrap();
            let zeros = h.upload_tensor(&HostTensor::filled(pd, 0.0)).unwrap();
            let mut y = h.alloc(&xd).unwrap();
            let (mut sm, mut si) = (h.alloc(&pd).unwrap(), h.alloc(&pd).unwrap());
            let bytes = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
            let mut ws = h.alloc_bytes(bytes).unwrap();
            batch_norm_forward_training(
                h,
                &bn,
                1.0,
                0.0,
                &xd,
                &x,
                None,
                &xd,
                &mut y,
                &pd,
                &ones,
                &zeros,
                None,
                Some(SavedStats {
                    mean: &mut sm,
                    inv_std: &mut si,
                }),
                &mut ws,
                None,
            )
            .unwrap();
            let stats = reference::BatchStats::of(BatchNormMode::Spatial, &xt);
            let inv = h.read::<f32>(&si).unwrap();
            for (c, got) in inv.iter().enumerate() {
                let want = 1.0 / stats.variance(&[0, c, 0, 0]).sqrt();
                assert!(
                    ((*got as f64) - want).abs() < 1e-5 * want,
                    "{layout:?} channel {c}: {got} vs {want}"
                );
            }
            let mut want_y = HostTensor::filled(xd, 0.0);
            let s = HostTensor::filled(pd, 1.0);
            let b = HostTensor::filled(pd, 0.0);
            reference::forward_training(
                BatchNormMode::Spatial,
                BatchNormOps::Bn,
                1.0,
                0.0,
                &xt,
                None,
                &mut want_y,
                &s,
                &b,
                0.0,
                None,
                None,
            );
            let got = h.download_tensor(&xd, &y).unwrap();
            // x itself carries f32 rounding of about 1e-3 relative to its deviations.
            assert!(
                rel_error(&got, &want_y) < 1e-3,
                "{layout:?}: {}",
                rel_error(&got, &want_y)
            );
        }
    });
}

/// The same call twice gives the same bytes: no atomics, a fixed combination order.
#[test]
fn gpu_results_are_bitwise_reproducible() {
    with_gpu("gpu_results_are_bitwise_reproducible", |h| {
        for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
            let xd = TensorDescriptor::nchw_with(DataType::F16, 32, 64, 16, 16, layout).unwrap();
            let pd = derive_batch_norm_descriptor(&xd, BatchNormMode::Spatial).unwrap();
            let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5).unwrap();
            let mut r = rng(9);
            let x = h.upload_tensor(&random(xd, -3.0, 3.0, &mut r)).unwrap();
            let dy = h.upload_tensor(&random(xd, -1.0, 1.0, &mut r)).unwrap();
            let scale = h.upload_tensor(&random(pd, 0.5, 1.5, &mut r)).unwrap();
            let bias = h.upload_tensor(&random(pd, -1.0, 1.0, &mut r)).unwrap();
            let fwd_bytes = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
            let bwd_bytes = batch_norm_backward_workspace_size(h, &bn, &xd).unwrap();
            let mut ws = h.alloc_bytes(fwd_bytes.max(bwd_bytes)).unwrap();
            let mut run = || {
                let mut y = h.alloc(&xd).unwrap();
                let (mut rm, mut rv) = (h.alloc(&pd).unwrap(), h.alloc(&pd).unwrap());
                let (mut dx, mut ds, mut db) = (
                    h.alloc(&xd).unwrap(),
                    h.alloc(&pd).unwrap(),
                    h.alloc(&pd).unwrap(),
                );
                let (mut sm, mut si) = (h.alloc(&pd).unwrap(), h.alloc(&pd).unwrap());
                batch_norm_forward_training(
                    h,
                    &bn,
                    1.0,
                    0.0,
                    &xd,
                    &x,
                    None,
                    &xd,
                    &mut y,
                    &pd,
                    &scale,
                    &bias,
                    Some(RunningStats {
                        factor: 1.0,
                        mean: &mut rm,
                        variance: &mut rv,
                    }),
                    Some(SavedStats {
                        mean: &mut sm,
                        inv_std: &mut si,
                    }),
                    &mut ws,
                    None,
                )
                .unwrap();
                // Statistics recomputed from x, then the saved ones.
                batch_norm_backward(
                    h, &bn, 1.0, 0.0, 1.0, 0.0, &xd, &x, None, &xd, &dy, None, &xd, &mut dx, &pd,
                    &scale, &mut ds, &mut db, None, &mut ws, None,
                )
                .unwrap();
                let (mut dx2, mut ds2, mut db2) = (
                    h.alloc(&xd).unwrap(),
                    h.alloc(&pd).unwrap(),
                    h.alloc(&pd).unwrap(),
                );
                let saved = SavedStatsRef {
                    mean: &sm,
                    inv_std: &si,
                };
                batch_norm_backward(
                    h,
                    &bn,
                    1.0,
                    0.0,
                    1.0,
                    0.0,
                    &xd,
                    &x,
                    None,
                    &xd,
                    &dy,
                    None,
                    &xd,
                    &mut dx2,
                    &pd,
                    &scale,
                    &mut ds2,
                    &mut db2,
                    Some(saved),
                    &mut ws,
                    None,
                )
                .unwrap();
                [&y, &rm, &rv, &sm, &si, &dx, &ds, &db, &dx2, &ds2, &db2]
                    .map(|b| h.read_bytes(b).unwrap())
            };
            let first = run();
            let second = run();
            assert!(first == second, "{layout:?}: two runs differ");
        }
    });
}

// ---------------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------------

#[test]
fn epsilon_below_the_cudnn_minimum_is_rejected() {
    assert_eq!(BN_MIN_EPSILON, 0.0);
    for eps in [-1e-5, f64::NAN, f64::INFINITY] {
        let e = BatchNormDescriptor::new(BatchNormMode::Spatial, eps).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "epsilon", .. }), "{e}");
    }
    assert!(BatchNormDescriptor::new(BatchNormMode::Spatial, BN_MIN_EPSILON).is_ok());
    let e = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5)
        .unwrap()
        .with_ops(BatchNormOps::BnActivation, &ActivationDescriptor::sigmoid())
        .unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }), "{e}");
}

/// The buffers of a small valid training problem on one handle.
struct Fixture {
    xd: TensorDescriptor,
    pd: TensorDescriptor,
    x: Buffer,
    y: Buffer,
    scale: Buffer,
    bias: Buffer,
    rm: Buffer,
    rv: Buffer,
    sm: Buffer,
    si: Buffer,
    dx: Buffer,
    ds: Buffer,
    db: Buffer,
    ws: Buffer,
    bn: BatchNormDescriptor,
}

impl Fixture {
    fn new(h: &Handle, dt: DataType) -> Self {
        let xd = TensorDescriptor::nchw(dt, 4, 8, 16, 16).unwrap();
        let pd = derive_batch_norm_descriptor(&xd, BatchNormMode::Spatial).unwrap();
        let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5).unwrap();
        let fwd = batch_norm_forward_training_workspace_size(h, &bn, &xd).unwrap();
        let bwd = batch_norm_backward_workspace_size(h, &bn, &xd).unwrap();
        let a = |d: &TensorDescriptor| h.alloc(d).unwrap();
        Self {
            x: a(&xd),
            y: a(&xd),
            scale: a(&pd),
            bias: a(&pd),
            rm: a(&pd),
            rv: a(&pd),
            sm: a(&pd),
            si: a(&pd),
            dx: a(&xd),
            ds: a(&pd),
            db: a(&pd),
            ws: h.alloc_bytes(fwd.max(bwd)).unwrap(),
            xd,
            pd,
            bn,
        }
    }

    /// Forward training with the fixture's buffers and the given descriptors.
    fn train(
        &mut self,
        h: &Handle,
        xd: &TensorDescriptor,
        yd: &TensorDescriptor,
        pd: &TensorDescriptor,
        factor: f64,
    ) -> Result<()> {
        batch_norm_forward_training(
            h,
            &self.bn,
            1.0,
            0.0,
            xd,
            &self.x,
            None,
            yd,
            &mut self.y,
            pd,
            &self.scale,
            &self.bias,
            Some(RunningStats {
                factor,
                mean: &mut self.rm,
                variance: &mut self.rv,
            }),
            Some(SavedStats {
                mean: &mut self.sm,
                inv_std: &mut self.si,
            }),
            &mut self.ws,
            None,
        )
    }

    /// Forward training of `bn` without statistics outputs: x as the residual with
    /// `with_z`, the relu mask into `reserve`.
    fn train_ops(
        &mut self,
        h: &Handle,
        bn: &BatchNormDescriptor,
        with_z: bool,
        reserve: Option<&mut Buffer>,
    ) -> Result<()> {
        let (xd, pd) = (self.xd, self.pd);
        batch_norm_forward_training(
            h,
            bn,
            1.0,
            0.0,
            &xd,
            &self.x,
            with_z.then_some((&xd, &self.x)),
            &xd,
            &mut self.y,
            &pd,
            &self.scale,
            &self.bias,
            None,
            None,
            &mut self.ws,
            reserve,
        )
    }

    /// Backward of `bn` with dy = x and `dx` blended by `beta_data`: x as the forward's
    /// output with `with_y`, the add's gradient into `dz`, the relu mask from `reserve`.
    fn backward_ops(
        &mut self,
        h: &Handle,
        bn: &BatchNormDescriptor,
        beta_data: f64,
        with_y: bool,
        dz: Option<&mut Buffer>,
        reserve: Option<&Buffer>,
    ) -> Result<()> {
        let (xd, pd) = (self.xd, self.pd);
        batch_norm_backward(
            h,
            bn,
            1.0,
            beta_data,
            1.0,
            0.0,
            &xd,
            &self.x,
            with_y.then_some((&xd, &self.x)),
            &xd,
            &self.x,
            dz.map(|b| (&xd, b)),
            &xd,
            &mut self.dx,
            &pd,
            &self.scale,
            &mut self.ds,
            &mut self.db,
            None,
            &mut self.ws,
            reserve,
        )
    }
}

fn assert_bad(r: Result<()>, arg: &str) {
    match r {
        Err(Error::BadParam { arg: a, .. }) if a == arg => {}
        other => panic!("expected BadParam({arg}), got {other:?}"),
    }
}

fn assert_short(r: Result<()>, arg: &str) {
    match r {
        Err(Error::BufferTooSmall { arg: a, .. }) if a == arg => {}
        other => panic!("expected BufferTooSmall({arg}), got {other:?}"),
    }
}

#[test]
fn bad_descriptors_are_rejected_with_typed_errors() {
    for h in handles() {
        let mut f = Fixture::new(h, DataType::F32);
        let (xd, pd) = (f.xd, f.pd);
        assert!(f.train(h, &xd, &xd, &pd, 0.1).is_ok());
        // x / y mismatch: dims, dtype.
        let other = TensorDescriptor::nchw(DataType::F32, 4, 8, 16, 8).unwrap();
        assert_bad(f.train(h, &xd, &other, &pd, 0.1), "y_desc");
        let half = xd.with_dtype(DataType::F16).unwrap();
        assert_bad(f.train(h, &xd, &half, &pd, 0.1), "y_desc");
        // The per-feature descriptor: wrong dims (per-activation's), wrong dtype.
        let per_act = derive_batch_norm_descriptor(&xd, BatchNormMode::PerActivation).unwrap();
        assert_bad(f.train(h, &xd, &xd, &per_act, 0.1), "bn_desc");
        let f16_params = pd.with_dtype(DataType::F16).unwrap();
        assert_bad(f.train(h, &xd, &xd, &f16_params, 0.1), "bn_desc");
        // Rank 3 data.
        let rank3 = TensorDescriptor::packed(DataType::F32, &[4, 8, 256]).unwrap();
        assert_bad(f.train(h, &rank3, &rank3, &pd, 0.1), "x_desc");
        // A factor outside [0, 1].
        assert_bad(f.train(h, &xd, &xd, &pd, 1.5), "exponential_average_factor");
        // One value per feature cannot be trained on.
        let single = TensorDescriptor::nchw(DataType::F32, 1, 8, 1, 1).unwrap();
        assert_bad(f.train(h, &single, &single, &pd, 0.1), "x_desc");
        // f16 data wants f32 per-feature tensors: its derived descriptor.
        let fd = TensorDescriptor::nchw(DataType::F16, 4, 8, 16, 16).unwrap();
        let fpd = derive_batch_norm_descriptor(&fd, BatchNormMode::Spatial).unwrap();
        assert_eq!(fpd.dtype(), DataType::F32);
        assert_bad(f.train(h, &fd, &fd, &fd_params_f16(&fpd), 0.1), "bn_desc");
    }
}

fn fd_params_f16(pd: &TensorDescriptor) -> TensorDescriptor {
    pd.with_dtype(DataType::F16).unwrap()
}

#[test]
fn fused_operands_must_match_the_ops() {
    for h in handles() {
        let mut f = Fixture::new(h, DataType::F32);
        let xd = f.xd;
        let add = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5)
            .unwrap()
            .with_add_relu();
        let plain = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5).unwrap();
        // The add needs z; plain bn takes none.
        assert_bad(f.train_ops(h, &add, false, None), "z");
        assert_bad(f.train_ops(h, &plain, true, None), "z");
        // Backward with relu needs y; with the add, dz.
        assert_bad(
            f.backward_ops(h, &add.with_relu(), 0.0, false, None, None),
            "y",
        );
        assert_bad(f.backward_ops(h, &add, 0.0, true, None, None), "dz");
        // The reserve space holds the relu mask, a bit per element of x's span; short,
        // it is refused by the forward and the backward.
        let need = batch_norm_training_reserve_space_size(h, &add, &xd).unwrap();
        assert_eq!(need, xd.span_elements().div_ceil(32) * 4);
        assert_eq!(
            batch_norm_training_reserve_space_size(h, &plain, &xd).unwrap(),
            0
        );
        let mut short = h.alloc_bytes(need - 4).unwrap();
        assert_short(f.train_ops(h, &add, true, Some(&mut short)), "reserve");
        let mut dz = h.alloc(&xd).unwrap();
        let r = f.backward_ops(h, &add, 0.0, true, Some(&mut dz), Some(&short));
        assert_short(r, "reserve");
        // A reserve space of another handle, long enough, is refused by both too.
        let mut foreign = Handle::cpu().alloc_bytes(need).unwrap();
        assert_bad(f.train_ops(h, &add, true, Some(&mut foreign)), "reserve");
        let r = f.backward_ops(h, &add, 0.0, true, Some(&mut dz), Some(&foreign));
        assert_bad(r, "reserve");
        // Non-finite blend factors.
        assert_bad(
            f.backward_ops(h, &plain, f64::NAN, false, None, None),
            "beta_data",
        );
    }
}

#[test]
fn short_buffers_and_a_short_workspace_are_rejected() {
    for h in handles() {
        let mut f = Fixture::new(h, DataType::F32);
        let (xd, pd) = (f.xd, f.pd);
        let short_param = h.alloc_bytes(pd.size_bytes() - 4).unwrap();
        let short_data = h.alloc_bytes(xd.size_bytes() - 4).unwrap();
        let x = std::mem::replace(&mut f.x, short_data);
        assert_short(f.train(h, &xd, &xd, &pd, 0.1), "x");
        f.x = x;
        let rm = std::mem::replace(&mut f.rm, short_param);
        assert_short(f.train(h, &xd, &xd, &pd, 0.1), "running_mean");
        f.rm = rm;
        let short_param = h.alloc_bytes(pd.size_bytes() - 4).unwrap();
        let si = std::mem::replace(&mut f.si, short_param);
        assert_short(f.train(h, &xd, &xd, &pd, 0.1), "saved_inv_std");
        f.si = si;
        let short_param = h.alloc_bytes(pd.size_bytes() - 4).unwrap();
        let scale = std::mem::replace(&mut f.scale, short_param);
        assert_short(f.train(h, &xd, &xd, &pd, 0.1), "scale");
        f.scale = scale;
        assert!(f.train(h, &xd, &xd, &pd, 0.1).is_ok());
        // The GPU needs a workspace; one byte short is a typed error.
        let need = batch_norm_forward_training_workspace_size(h, &f.bn, &xd).unwrap();
        assert_eq!(need == 0, !h.is_gpu());
        if need > 0 {
            f.ws = h.alloc_bytes(need - 1).unwrap();
            match f.train(h, &xd, &xd, &pd, 0.1) {
                Err(Error::WorkspaceTooSmall {
                    required_bytes,
                    got_bytes,
                }) => {
                    assert_eq!((required_bytes, got_bytes), (need, need - 1))
                }
                other => panic!("expected WorkspaceTooSmall, got {other:?}"),
            }
            let need = batch_norm_backward_workspace_size(h, &f.bn, &xd).unwrap();
            let mut ws = h.alloc_bytes(need - 1).unwrap();
            let (mut dx, mut ds, mut db) = (
                h.alloc(&xd).unwrap(),
                h.alloc(&pd).unwrap(),
                h.alloc(&pd).unwrap(),
            );
            let r = batch_norm_backward(
                h, &f.bn, 1.0, 0.0, 1.0, 0.0, &xd, &f.x, None, &xd, &f.x, None, &xd, &mut dx, &pd,
                &f.scale, &mut ds, &mut db, None, &mut ws, None,
            );
            assert!(matches!(r, Err(Error::WorkspaceTooSmall { .. })), "{r:?}");
        }
    }
}

#[test]
fn f64_data_runs_on_the_cpu_only() {
    with_gpu("f64_data_runs_on_the_cpu_only", |h| {
        let xd = TensorDescriptor::nchw(DataType::F64, 2, 3, 4, 4).unwrap();
        let p = Problem::dense(BatchNormMode::Spatial, xd);
        let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 1e-5).unwrap();
        let x = h.alloc(&xd).unwrap();
        let mut y = h.alloc(&xd).unwrap();
        let s = h.alloc(&p.params).unwrap();
        let r = batch_norm_forward_inference(
            h,
            &bn,
            1.0,
            0.0,
            &xd,
            &x,
            None,
            &xd,
            &mut y,
            &p.params,
            &s,
            &s,
            EstimatedStats {
                mean: &s,
                variance: &s,
            },
        );
        assert!(matches!(r, Err(Error::NotSupported { .. })), "{r:?}");
    });
}
