//! oxidnn against cuDNN: batch normalization (spatial) on ResNet-50 activations at N = 32,
//! f32 NCHW and f16 NHWC: training forward, inference forward, backward, and the fused
//! BN + add + relu training forward and backward (cuDNN's `Ex` calls), run by both
//! libraries on the same device buffers and stream, checked against each other, then
//! timed.
//!
//! ```text
//! cargo bench --features cudnn-bench --bench batch_norm_vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `pass dtype shape` contains it, e.g.
//!   `bn.fwd_train`, `f16`, `32x64x112x112`.
//! * `OXIDNN_BENCH_QUICK=1`: one shape only (smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `batch-norm-results.csv`).
//!
//! Method (as `benches/vs_cudnn.rs`): every timed call is bracketed by its own pair of
//! CUDA events on the handle's stream; 5 warm-up calls, then 30 timed calls per library,
//! median reported. The timed calls are queued behind a host-side stream gate and released
//! together, so the events measure device time, not host launch overhead. oxidnn and
//! cuDNN alternate call by call, and buffer sets rotate (at least 200 MiB and 4x the L2 in
//! all) so no call reads what the previous one left in cache. "Bytes moved" is the
//! minimum traffic: each tensor the API reads once and each it writes once (the
//! per-channel vectors included). The roofline reference is the device-to-device copy
//! bandwidth (cuMemcpyDtoDAsync of 1 GiB, read + write bytes).
//!
//! cuDNN runs its `Ex` calls (workspace and reserve space as it asks) in
//! `CUDNN_BATCHNORM_SPATIAL_PERSISTENT` mode where it accepts the problem (its fastest
//! spatial mode), else `CUDNN_BATCHNORM_SPATIAL`; inference uses
//! cudnnBatchNormalizationForwardInference. Training updates running statistics (factor
//! 0.1) and saves the batch statistics; backward uses the saved statistics. oxidnn gets
//! its own reserve space, so both fused backward passes read their forward's relu mask
//! there (bytes moved still count `y`, which the API takes).
//!
//! Without libcudnn only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::cudnn::{
    copy_bandwidth, cudnn_check, cudnn_sys, gb_per_s, version_string, ActDesc, Cudnn, TensorDesc,
};
use common::{
    dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes, Args,
    Check, Context, Res, Timer,
};
use cudarc::driver::CudaStream;
use oxidnn::{
    batch_norm_backward, batch_norm_backward_workspace_size, batch_norm_forward_inference,
    batch_norm_forward_training, batch_norm_forward_training_workspace_size,
    batch_norm_training_reserve_space_size, derive_batch_norm_descriptor, BatchNormDescriptor,
    BatchNormMode, Buffer, DataType, EstimatedStats, Handle, Layout, RunningStats, SavedStats,
    SavedStatsRef, TensorDescriptor,
};
use std::ffi::c_void;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

const WARMUP: usize = 5;
const RUNS: usize = 30;
const MAX_SIDES: usize = 2;
const ROTATION_MIN_BYTES: usize = 200 << 20;
const EPSILON: f64 = 1e-5;
/// The running statistics' exponential-average factor.
const FACTOR: f64 = 0.1;
const INPUT_RANGE: f32 = 2.0;
const INPUT_MIN_MAGNITUDE: f32 = 1.0 / 1024.0;

/// ResNet-50's batch-norm inputs at N = 32 (NCHW logical dims).
const SHAPES: [[usize; 4]; 5] = [
    [32, 64, 112, 112],
    [32, 256, 56, 56],
    [32, 512, 28, 28],
    [32, 1024, 14, 14],
    [32, 2048, 7, 7],
];
const QUICK_SHAPE: [usize; 4] = [32, 256, 56, 56];

/// The data types and layouts the bench runs.
const FORMATS: [(DataType, Layout); 2] = [
    (DataType::F32, Layout::ChannelsFirst),
    (DataType::F16, Layout::ChannelsLast),
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("batch_norm_vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The passes
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pass {
    /// y = bn(x) with batch statistics; running and saved statistics updated.
    FwdTrain,
    /// y = bn(x) with the running statistics.
    FwdInfer,
    /// dx, dscale, dbias from x, dy and the saved statistics.
    Bwd,
    /// y = relu(bn(x) + z), training.
    FwdAddRelu,
    /// dx, dz, dscale, dbias of the fused forward (relu mask from y).
    BwdAddRelu,
}

const PASSES: [Pass; 5] = [
    Pass::FwdTrain,
    Pass::FwdInfer,
    Pass::Bwd,
    Pass::FwdAddRelu,
    Pass::BwdAddRelu,
];

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::FwdTrain => "bn.fwd_train",
            Pass::FwdInfer => "bn.fwd_infer",
            Pass::Bwd => "bn.bwd",
            Pass::FwdAddRelu => "bn_add_relu.fwd",
            Pass::BwdAddRelu => "bn_add_relu.bwd",
        }
    }

    fn fused(self) -> bool {
        matches!(self, Pass::FwdAddRelu | Pass::BwdAddRelu)
    }

    fn backward(self) -> bool {
        matches!(self, Pass::Bwd | Pass::BwdAddRelu)
    }

    /// Minimum bytes: data tensors and per-channel f32 vectors each read or written once.
    fn bytes_moved(self, p: &Problem) -> u64 {
        let t = p.x.size_bytes() as u64;
        let c = p.params.size_bytes() as u64;
        match self {
            // x, y; scale, bias, running mean/var read and written, saved mean/inv std.
            Pass::FwdTrain => 2 * t + 8 * c,
            // x, y; scale, bias, mean, variance.
            Pass::FwdInfer => 2 * t + 4 * c,
            // x, dy, dx; scale, saved mean/inv std, dscale, dbias.
            Pass::Bwd => 3 * t + 5 * c,
            // x, z, y; as training.
            Pass::FwdAddRelu => 3 * t + 8 * c,
            // x, y, dy, dx, dz; as backward.
            Pass::BwdAddRelu => 5 * t + 5 * c,
        }
    }
}

fn shape_string(dims: &[usize]) -> String {
    dims.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// The descriptors of one shape and format.
struct Problem {
    dims: [usize; 4],
    dtype: DataType,
    layout: Layout,
    x: TensorDescriptor,
    params: TensorDescriptor,
}

impl Problem {
    fn new(dtype: DataType, layout: Layout, dims: [usize; 4]) -> oxidnn::Result<Self> {
        let [n, c, h, w] = dims;
        let x = TensorDescriptor::nchw_with(dtype, n, c, h, w, layout)?;
        Ok(Self {
            dims,
            dtype,
            layout,
            params: derive_batch_norm_descriptor(&x, BatchNormMode::Spatial)?,
            x,
        })
    }

    fn label(&self) -> String {
        let layout = match self.layout {
            Layout::ChannelsFirst => "nchw",
            Layout::ChannelsLast => "nhwc",
        };
        format!("{}.{layout}", self.dtype)
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// One set of buffers. Invariant (from `alloc`): the data buffers hold `p.x`'s span, the
/// per-channel ones `p.params`'s, the workspaces and reserve what each library asked for.
struct Set {
    x: Buffer,
    /// The residual z (forward) or dy (backward).
    z: Buffer,
    /// The forward output; the backward's y input.
    y: Buffer,
    dx: Buffer,
    dz: Buffer,
    scale: Buffer,
    bias: Buffer,
    running_mean: Buffer,
    running_var: Buffer,
    saved_mean: Buffer,
    saved_inv_std: Buffer,
    dscale: Buffer,
    dbias: Buffer,
    ox_workspace: Buffer,
    /// oxidnn's reserve space (the relu mask of its fused forward).
    ox_reserve: Buffer,
    cu_workspace: Buffer,
    reserve: Buffer,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem, ox: (usize, usize), cu: (usize, usize)) -> Res<Self> {
        let a = |bytes: usize| h.alloc_bytes(bytes).context("allocating a buffer");
        let (t, c) = (p.x.size_bytes(), p.params.size_bytes());
        Ok(Self {
            x: a(t)?,
            z: a(t)?,
            y: a(t)?,
            dx: a(t)?,
            dz: a(t)?,
            scale: a(c)?,
            bias: a(c)?,
            running_mean: a(c)?,
            running_var: a(c)?,
            saved_mean: a(c)?,
            saved_inv_std: a(c)?,
            dscale: a(c)?,
            dbias: a(c)?,
            ox_workspace: a(ox.0)?,
            ox_reserve: a(ox.1)?,
            cu_workspace: a(cu.0)?,
            reserve: a(cu.1)?,
        })
    }

    fn bytes(&self) -> usize {
        [&self.x, &self.z, &self.y, &self.dx, &self.dz]
            .iter()
            .map(|b| b.len_bytes())
            .sum()
    }
}

fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 | DataType::F64 => 1e-4,
        DataType::F16 | DataType::BF16 => 1e-2,
    }
}

// ---------------------------------------------------------------------------------------
// cuDNN
// ---------------------------------------------------------------------------------------

use cudnn_sys::cudnnBatchNormMode_t as CuMode;
use cudnn_sys::cudnnBatchNormOps_t as CuOps;

/// cuDNN's view of a problem: descriptors, the relu, the mode its `Ex` calls use, the
/// workspace and reserve sizes it asked for, and why it cannot fuse add + relu (if so).
struct CudnnProblem {
    x: TensorDesc,
    params: TensorDesc,
    relu: ActDesc,
    mode: CuMode,
    workspace: usize,
    reserve: usize,
    no_fusion: Option<String>,
}

/// cuDNN's workspace and reserve sizes for `ops` (the fused ones with `act` and `z`).
fn cudnn_sizes(
    cu: &Cudnn,
    mode: CuMode,
    ops: CuOps,
    x: &TensorDesc,
    params: &TensorDesc,
    act: cudnn_sys::cudnnActivationDescriptor_t,
    z: cudnn_sys::cudnnTensorDescriptor_t,
) -> Res<(usize, usize)> {
    let (mut fwd, mut bwd, mut res) = (0usize, 0usize, 0usize);
    // SAFETY: every descriptor is live (or null where cuDNN allows it); the out-pointers
    // are valid.
    unsafe {
        cudnn_check(
            cudnn_sys::cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                cu.handle.0,
                mode,
                ops,
                x.0,
                z,
                x.0,
                params.0,
                act,
                &mut fwd,
            ),
            "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
        )?;
        cudnn_check(
            cudnn_sys::cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                cu.handle.0,
                mode,
                ops,
                x.0,
                x.0,
                x.0,
                z,
                x.0,
                params.0,
                act,
                &mut bwd,
            ),
            "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
        )?;
        cudnn_check(
            cudnn_sys::cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                cu.handle.0,
                mode,
                ops,
                act,
                x.0,
                &mut res,
            ),
            "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
        )?;
    }
    Ok((fwd.max(bwd), res))
}

impl CudnnProblem {
    /// cuDNN's fastest spatial mode that takes the problem: persistent, else plain.
    fn new(cu: &Cudnn, p: &Problem) -> Res<Self> {
        Self::with_mode(cu, p, CuMode::CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
            .or_else(|_| Self::with_mode(cu, p, CuMode::CUDNN_BATCHNORM_SPATIAL))
    }

    fn with_mode(cu: &Cudnn, p: &Problem, mode: CuMode) -> Res<Self> {
        let x = TensorDesc::new(&p.x)?;
        let params = TensorDesc::new(&p.params)?;
        let relu = ActDesc::create()?;
        // SAFETY: `relu` is live.
        let status = unsafe {
            cudnn_sys::cudnnSetActivationDescriptor(
                relu.0,
                cudnn_sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                cudnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                0.0,
            )
        };
        cudnn_check(status, "cudnnSetActivationDescriptor")?;
        let null = std::ptr::null_mut();
        let (mut workspace, mut reserve) = cudnn_sizes(
            cu,
            mode,
            CuOps::CUDNN_BATCHNORM_OPS_BN,
            &x,
            &params,
            null,
            null.cast(),
        )?;
        let fused = cudnn_sizes(
            cu,
            mode,
            CuOps::CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
            &x,
            &params,
            relu.0,
            x.0,
        );
        let no_fusion = match fused {
            Ok((w, r)) => {
                workspace = workspace.max(w);
                reserve = reserve.max(r);
                None
            }
            Err(e) => Some(e),
        };
        Ok(Self {
            x,
            params,
            relu,
            mode,
            workspace,
            reserve,
            no_fusion,
        })
    }
}

/// A host scalar (float: cuDNN's scaling factors for non-double data).
#[repr(C, align(8))]
struct Scalar(f32);

impl Scalar {
    fn ptr(&self) -> *const c_void {
        (&self.0 as *const f32).cast()
    }
}

/// Runs `pass` through cuDNN on `set`'s buffers.
///
/// Invariant behind every unsafe call below: the descriptors in `d` are live and describe
/// the problem; the addresses are `set`'s live buffers, which hold those descriptors' spans
/// and the workspace / reserve sizes `d` asked for (`Set::alloc`); cuDNN issues on the
/// oxidnn handle's stream, the only stream that touches these buffers; the scalars live on
/// the host for the whole call.
fn run_cudnn(cu: &Cudnn, d: &CudnnProblem, pass: Pass, set: &mut Set) -> Res<()> {
    let h = cu.handle.0;
    let (one, zero) = (Scalar(1.0), Scalar(0.0));
    let a = |b: &Buffer| device_address(b);
    let (x, z, y, dx, dz) = (a(&set.x)?, a(&set.z)?, a(&set.y)?, a(&set.dx)?, a(&set.dz)?);
    let (scale, bias) = (a(&set.scale)?, a(&set.bias)?);
    let (rm, rv) = (a(&set.running_mean)?, a(&set.running_var)?);
    let (sm, si) = (a(&set.saved_mean)?, a(&set.saved_inv_std)?);
    let (ds, db) = (a(&set.dscale)?, a(&set.dbias)?);
    let (ws, res) = (a(&set.cu_workspace)?, a(&set.reserve)?);
    let (ws_len, res_len) = (set.cu_workspace.len_bytes(), set.reserve.len_bytes());
    let null: *mut c_void = std::ptr::null_mut();
    let nothing: *const c_void = std::ptr::null();
    let fused = pass.fused();
    let ops = if fused {
        CuOps::CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
    } else {
        CuOps::CUDNN_BATCHNORM_OPS_BN
    };
    let act = if fused { d.relu.0 } else { null.cast() };
    let side = |desc: &TensorDesc| if fused { desc.0 } else { null.cast() };
    let status = match pass {
        Pass::FwdTrain | Pass::FwdAddRelu => {
            // SAFETY: see the invariant above; y = [relu](bn(x) [+ z]), statistics updated.
            unsafe {
                cudnn_sys::cudnnBatchNormalizationForwardTrainingEx(
                    h,
                    d.mode,
                    ops,
                    one.ptr(),
                    zero.ptr(),
                    d.x.0,
                    dev(x),
                    side(&d.x),
                    if fused { dev(z) } else { nothing },
                    d.x.0,
                    dev_mut(y),
                    d.params.0,
                    dev(scale),
                    dev(bias),
                    FACTOR,
                    dev_mut(rm),
                    dev_mut(rv),
                    EPSILON,
                    dev_mut(sm),
                    dev_mut(si),
                    act,
                    dev_mut(ws),
                    ws_len,
                    dev_mut(res),
                    res_len,
                )
            }
        }
        Pass::FwdInfer => {
            // SAFETY: see the invariant above; y = bn(x) with the running statistics.
            unsafe {
                cudnn_sys::cudnnBatchNormalizationForwardInference(
                    h,
                    CuMode::CUDNN_BATCHNORM_SPATIAL,
                    one.ptr(),
                    zero.ptr(),
                    d.x.0,
                    dev(x),
                    d.x.0,
                    dev_mut(y),
                    d.params.0,
                    dev(scale),
                    dev(bias),
                    dev(rm),
                    dev(rv),
                    EPSILON,
                )
            }
        }
        Pass::Bwd | Pass::BwdAddRelu => {
            // SAFETY: see the invariant above; dx [, dz], dscale, dbias from x, dy = z
            // [, y and the reserve of the fused forward] and the saved statistics.
            unsafe {
                cudnn_sys::cudnnBatchNormalizationBackwardEx(
                    h,
                    d.mode,
                    ops,
                    one.ptr(),
                    zero.ptr(),
                    one.ptr(),
                    zero.ptr(),
                    d.x.0,
                    dev(x),
                    side(&d.x),
                    if fused { dev(y) } else { nothing },
                    d.x.0,
                    dev(z),
                    side(&d.x),
                    if fused { dev_mut(dz) } else { null },
                    d.x.0,
                    dev_mut(dx),
                    d.params.0,
                    dev(scale),
                    dev(bias),
                    dev_mut(ds),
                    dev_mut(db),
                    EPSILON,
                    dev(sm),
                    dev(si),
                    act,
                    dev_mut(ws),
                    ws_len,
                    dev_mut(res),
                    res_len,
                )
            }
        }
    };
    cudnn_check(status, pass.name())
}

// ---------------------------------------------------------------------------------------
// oxidnn
// ---------------------------------------------------------------------------------------

/// Runs `pass` through oxidnn on `set`'s buffers (the calls `run_cudnn` makes).
fn run_oxidnn(h: &Handle, p: &Problem, pass: Pass, set: &mut Set) -> oxidnn::Result<()> {
    let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, EPSILON)?;
    let bn = if pass.fused() { bn.with_add_relu() } else { bn };
    let (x, pd) = (&p.x, &p.params);
    match pass {
        Pass::FwdTrain | Pass::FwdAddRelu => batch_norm_forward_training(
            h,
            &bn,
            1.0,
            0.0,
            x,
            &set.x,
            pass.fused().then_some((x, &set.z)),
            x,
            &mut set.y,
            pd,
            &set.scale,
            &set.bias,
            Some(RunningStats {
                factor: FACTOR,
                mean: &mut set.running_mean,
                variance: &mut set.running_var,
            }),
            Some(SavedStats {
                mean: &mut set.saved_mean,
                inv_std: &mut set.saved_inv_std,
            }),
            &mut set.ox_workspace,
            Some(&mut set.ox_reserve),
        ),
        Pass::FwdInfer => batch_norm_forward_inference(
            h,
            &bn,
            1.0,
            0.0,
            x,
            &set.x,
            None,
            x,
            &mut set.y,
            pd,
            &set.scale,
            &set.bias,
            EstimatedStats {
                mean: &set.running_mean,
                variance: &set.running_var,
            },
        ),
        Pass::Bwd | Pass::BwdAddRelu => batch_norm_backward(
            h,
            &bn,
            1.0,
            0.0,
            1.0,
            0.0,
            x,
            &set.x,
            pass.fused().then_some((x, &set.y)),
            x,
            &set.z,
            if pass.fused() {
                Some((x, &mut set.dz))
            } else {
                None
            },
            x,
            &mut set.dx,
            pd,
            &set.scale,
            &mut set.dscale,
            &mut set.dbias,
            Some(SavedStatsRef {
                mean: &set.saved_mean,
                inv_std: &set.saved_inv_std,
            }),
            &mut set.ox_workspace,
            Some(&set.ox_reserve),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------

struct Bench {
    cudnn: Option<Cudnn>,
    timer: Timer,
    handle: Handle,
    stream: Arc<CudaStream>,
    copy_gbps: f64,
    rotation_bytes: usize,
}

/// The buffers of one shape and format; `sets` rotate so that small problems miss L2.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    cudnn: Result<CudnnProblem, String>,
}

impl Group {
    fn new(b: &Bench, dtype: DataType, layout: Layout, dims: [usize; 4]) -> Res<Self> {
        let p = Problem::new(dtype, layout, dims).context("describing the problem")?;
        let h = &b.handle;
        let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, EPSILON)
            .context("the batch-norm descriptor")?;
        let ox_ws = batch_norm_forward_training_workspace_size(h, &bn, &p.x)
            .and_then(|f| Ok(f.max(batch_norm_backward_workspace_size(h, &bn, &p.x)?)))
            .context("oxidnn's workspace size")?;
        let ox_res = batch_norm_training_reserve_space_size(h, &bn.with_add_relu(), &p.x)
            .context("oxidnn's reserve space size")?;
        let mut cudnn = match &b.cudnn {
            Some(cu) => CudnnProblem::new(cu, &p),
            None => Err("cuDNN not loaded".into()),
        };
        let cu_sizes = cudnn.as_ref().map_or((0, 0), |d| (d.workspace, d.reserve));
        let first = Set::alloc(h, &p, (ox_ws, ox_res), cu_sizes)?;
        let count = b.rotation_bytes.div_ceil(first.bytes()).max(1);
        let mut sets = vec![first];
        for _ in 1..count {
            sets.push(Set::alloc(h, &p, (ox_ws, ox_res), cu_sizes)?);
        }
        let seed = dims.iter().fold(dtype.size_bytes() as u64, |s, &d| {
            s.wrapping_mul(31).wrapping_add(d as u64)
        });
        let (elements, channels) = (p.x.element_count(), p.params.element_count());
        let data = |seed| random_bytes(dtype, elements, seed, INPUT_RANGE, INPUT_MIN_MAGNITUDE);
        let per_channel = |seed, lo: f32, hi: f32| -> Vec<u8> {
            random_bytes(DataType::F32, channels, seed, 1.0, 0.0)
                .chunks_exact(4)
                .flat_map(|b| {
                    let u = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * 0.5 + 0.5;
                    (lo + (hi - lo) * u).to_le_bytes()
                })
                .collect()
        };
        let (x, z) = (data(seed), data(seed ^ 0x5555));
        let (scale, bias) = (
            per_channel(seed ^ 1, 0.5, 1.5),
            per_channel(seed ^ 2, -0.5, 0.5),
        );
        let (rm, rv) = (
            per_channel(seed ^ 3, -0.5, 0.5),
            per_channel(seed ^ 4, 0.5, 2.0),
        );
        for set in &mut sets {
            let w = |buf: &mut Buffer, bytes: &[u8]| h.write_bytes(buf, bytes).context("uploading");
            w(&mut set.x, &x)?;
            w(&mut set.z, &z)?;
            w(&mut set.scale, &scale)?;
            w(&mut set.bias, &bias)?;
            w(&mut set.running_mean, &rm)?;
            w(&mut set.running_var, &rv)?;
        }
        // The persistent mode may still decline at run time: then plain spatial.
        if let (Some(cu), Ok(d)) = (&b.cudnn, &cudnn) {
            if d.mode != CuMode::CUDNN_BATCHNORM_SPATIAL
                && run_cudnn(cu, d, Pass::FwdTrain, &mut sets[0]).is_err()
            {
                cudnn = CudnnProblem::with_mode(cu, &p, CuMode::CUDNN_BATCHNORM_SPATIAL);
            }
        }
        b.timer.synchronize()?;
        Ok(Self { p, sets, cudnn })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

/// Resets what `pass` reads and poisons what it writes. Backward passes get the saved
/// statistics (and for the fused pass y and cuDNN's reserve) from a forward pass of
/// cuDNN's where it runs, else of oxidnn's; the fused one also gets oxidnn's reserve
/// (its relu mask) from a forward pass of oxidnn's on the same inputs, run first.
fn prepare(
    b: &Bench,
    p: &Problem,
    cudnn: &Result<CudnnProblem, String>,
    pass: Pass,
    set: &mut Set,
) -> Res<()> {
    let s = &b.stream;
    if pass.backward() {
        let fwd = if pass.fused() {
            Pass::FwdAddRelu
        } else {
            Pass::FwdTrain
        };
        match (&b.cudnn, cudnn) {
            (Some(cu), Ok(d)) if !(pass.fused() && d.no_fusion.is_some()) => {
                if pass.fused() {
                    run_oxidnn(&b.handle, p, fwd, set).context("oxidnn forward")?;
                }
                run_cudnn(cu, d, fwd, set)?
            }
            _ => run_oxidnn(&b.handle, p, fwd, set).context("oxidnn forward")?,
        }
        poison_async(s, &mut set.dx)?;
        poison_async(s, &mut set.dz)
    } else {
        poison_async(s, &mut set.y)
    }
}

/// The output of one run on set 0: y (forward) or dx [and dz] (backward).
fn output_bytes(b: &Bench, p: &Problem, pass: Pass, set: &Set) -> Res<Vec<u8>> {
    let read = |buf: &Buffer| -> Res<Vec<u8>> {
        let mut v = b.handle.read_bytes(buf).context("reading the output")?;
        v.truncate(p.x.size_bytes());
        Ok(v)
    };
    Ok(match pass {
        Pass::FwdTrain | Pass::FwdInfer | Pass::FwdAddRelu => read(&set.y)?,
        Pass::Bwd => read(&set.dx)?,
        Pass::BwdAddRelu => [read(&set.dx)?, read(&set.dz)?].concat(),
    })
}

enum Timing {
    Us(f64),
    Missing,
}

struct Row {
    pass: Pass,
    format: String,
    shape: String,
    bytes: u64,
    oxidnn: Timing,
    cudnn: Timing,
    check: Check,
    notes: Vec<String>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        match (&self.oxidnn, &self.cudnn) {
            (Timing::Us(o), Timing::Us(c)) => Some(c / o),
            _ => None,
        }
    }
}

fn run_case(b: &Bench, g: &mut Group, pass: Pass) -> Row {
    let (p, cudnn, sets) = (&g.p, &g.cudnn, &mut g.sets);
    let mut row = Row {
        pass,
        format: p.label(),
        shape: shape_string(&p.dims),
        bytes: pass.bytes_moved(p),
        oxidnn: Timing::Missing,
        cudnn: Timing::Missing,
        check: Check::Error,
        notes: vec![],
    };
    let cu = match (&b.cudnn, cudnn) {
        (Some(cu), Ok(d)) => match (&d.no_fusion, pass.fused()) {
            (Some(why), true) => {
                row.notes
                    .push(format!("cuDNN: no fused add + relu here ({why})"));
                None
            }
            _ => {
                if d.mode == CuMode::CUDNN_BATCHNORM_SPATIAL && pass != Pass::FwdInfer {
                    row.notes
                        .push("cuDNN: SPATIAL mode (PERSISTENT declined the problem)".into());
                }
                Some((cu, d))
            }
        },
        (Some(_), Err(e)) => {
            row.notes.push(format!("cuDNN: {e}"));
            None
        }
        (None, _) => None,
    };

    // Check: one run of each library on set 0, from the same starting state.
    let set0 = &mut sets[0];
    let ox_out = prepare(b, p, cudnn, pass, set0)
        .and_then(|()| run_oxidnn(&b.handle, p, pass, set0).context("oxidnn"))
        .and_then(|()| output_bytes(b, p, pass, set0));
    let cu_out = cu.map(|(cu, d)| {
        prepare(b, p, cudnn, pass, set0)
            .and_then(|()| run_cudnn(cu, d, pass, set0).context("cuDNN"))
            .and_then(|()| output_bytes(b, p, pass, set0))
    });
    let mut sides = vec![];
    match &ox_out {
        Ok(_) => sides.push(Side::Oxidnn),
        Err(e) => row.notes.push(e.clone()),
    }
    match &cu_out {
        Some(Ok(_)) => sides.push(Side::Cudnn),
        Some(Err(e)) => row.notes.push(e.clone()),
        None => {}
    }
    row.check = Check::compare(&ox_out, cu_out.as_ref(), p.dtype, tolerance(p.dtype));
    if sides.is_empty() {
        return row;
    }

    // Time: both libraries alternate call by call, each call on the next buffer set.
    let timed = sets
        .iter_mut()
        .try_for_each(|set| prepare(b, p, cudnn, pass, set))
        .and_then(|()| {
            let count = sets.len();
            b.timer
                .measure(sides.len(), WARMUP, RUNS, |side, invocation| {
                    let set = &mut sets[invocation % count];
                    match (sides[side], cu) {
                        (Side::Oxidnn, _) => run_oxidnn(&b.handle, p, pass, set).context("oxidnn"),
                        (Side::Cudnn, Some((cu, d))) => run_cudnn(cu, d, pass, set),
                        (Side::Cudnn, None) => Err("internal: cuDNN side without cuDNN".into()),
                    }
                })
        });
    match timed {
        Ok(m) => {
            for (side, us) in sides.iter().zip(&m.median_us) {
                match side {
                    Side::Oxidnn => row.oxidnn = Timing::Us(*us),
                    Side::Cudnn => row.cudnn = Timing::Us(*us),
                }
            }
            if !m.gated {
                row.notes
                    .push("stream gate timed out: times may include host launch overhead".into());
            }
        }
        Err(e) => row.notes.push(format!("timing failed: {e}")),
    }
    row
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str =
    "pass,format,shape,bytes_moved,oxidnn_us,oxidnn_gbps,pct_copy_bw,cudnn_us,cudnn_gbps,ratio_cudnn_over_oxidnn,check,rel_err";

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
    copy_gbps: f64,
}

impl Report {
    fn new(copy_gbps: f64) -> Self {
        Self {
            rows: vec![],
            csv: open_csv("batch_norm_vs_cudnn", "batch-norm-results.csv", CSV_HEADER),
            copy_gbps,
        }
    }

    fn print_header(&self) {
        println!(
            "{:<16} {:<9} {:<15} {:>9} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  check",
            "pass",
            "format",
            "shape",
            "MB moved",
            "oxidnn us",
            "GB/s",
            "%copy",
            "cuDNN us",
            "GB/s",
            "cu/ox"
        );
    }

    fn add(&mut self, row: Row) {
        let us = |t: &Timing| match t {
            Timing::Us(us) => Some(*us),
            Timing::Missing => None,
        };
        let (ox_us, cu_us) = (us(&row.oxidnn), us(&row.cudnn));
        let ox_gbps = ox_us.map(|t| gb_per_s(row.bytes, t));
        let cu_gbps = cu_us.map(|t| gb_per_s(row.bytes, t));
        let pct = ox_gbps.map(|g| 100.0 * g / self.copy_gbps);
        let (check, err) = row.check.label();
        let err_text = err.map_or_else(String::new, |e| format!("{e:.1e}"));
        println!(
            "{:<16} {:<9} {:<15} {:>9.1} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  {check} {err_text}",
            row.pass.name(),
            row.format,
            row.shape,
            row.bytes as f64 / 1e6,
            fmt_opt(ox_us, 1),
            fmt_opt(ox_gbps, 0),
            fmt_opt(pct, 1),
            fmt_opt(cu_us, 1),
            fmt_opt(cu_gbps, 0),
            fmt_opt(row.ratio(), 2),
        );
        for note in &row.notes {
            println!("    ! {note}");
        }
        if let Some((path, w)) = &mut self.csv {
            let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
            let line = format!(
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                row.pass.name(),
                row.format,
                row.shape,
                row.bytes,
                cell(ox_us),
                cell(ox_gbps),
                cell(pct),
                cell(cu_us),
                cell(cu_gbps),
                cell(row.ratio()),
                check,
                err.map_or_else(String::new, |e| format!("{e:e}")),
            );
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
                eprintln!("batch_norm_vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: geometric mean of cuDNN time / oxidnn time (> 1: oxidnn faster), rows that passed the check");
        let ratios = |pass: Option<Pass>| -> Vec<f64> {
            self.rows
                .iter()
                .filter(|r| pass.is_none_or(|p| r.pass == p) && matches!(r.check, Check::Ok(_)))
                .filter_map(Row::ratio)
                .collect()
        };
        let line = |name: &str, v: &[f64]| {
            if v.is_empty() {
                println!("  {name:<16} {:>4} rows   n/a", 0);
            } else {
                let geomean = (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp();
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "  {name:<16} {:>4} rows   geomean {geomean:.3}   (min {min:.2}, max {max:.2})",
                    v.len()
                );
            }
        };
        for pass in PASSES {
            if self.rows.iter().any(|r| r.pass == pass) {
                line(pass.name(), &ratios(Some(pass)));
            }
        }
        line("all", &ratios(None));
        let count = |f: fn(&Check) -> bool| self.rows.iter().filter(|r| f(&r.check)).count();
        println!(
            "  rows: {}, MISMATCH: {}, oxidnn errors: {}",
            self.rows.len(),
            count(|c| matches!(c, Check::Mismatch(_))),
            count(|c| matches!(c, Check::Error))
        );
        println!("  copy bandwidth: {:.0} GB/s", self.copy_gbps);
        println!("  device: {device}");
        if let Some((path, _)) = &self.csv {
            println!("  CSV: {path}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

fn selects(args: &Args, dims: &[usize; 4], p_label: &str, pass: Pass) -> bool {
    if args.quick && *dims != QUICK_SHAPE {
        return false;
    }
    let key = format!("{} {} {}", pass.name(), p_label, shape_string(dims));
    args.filter
        .as_ref()
        .is_none_or(|f| key.contains(f.as_str()))
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let Some(gpu) = open_gpu("batch_norm_vs_cudnn")? else {
        return Ok(());
    };
    let (handle, stream, device, l2) = (gpu.handle, gpu.stream, gpu.name, gpu.l2_bytes);
    println!("oxidnn vs cuDNN: batch normalization");
    println!("{}", gpu.summary);
    let cudnn = match Cudnn::open(&stream) {
        Ok(cu) => {
            println!(
                "cuDNN {} (built for CUDA runtime {}.{})",
                version_string(cu.version),
                cu.cudart_version / 1000,
                cu.cudart_version % 1000 / 10
            );
            Some(cu)
        }
        Err(why) => {
            println!("cuDNN: NOT AVAILABLE ({why}); timing oxidnn only, outputs unchecked");
            None
        }
    };
    let timer = Timer::new(&stream, MAX_SIDES * RUNS)?;
    let mut bench = Bench {
        cudnn,
        timer,
        handle,
        stream,
        copy_gbps: 0.0,
        rotation_bytes: ROTATION_MIN_BYTES.max(4 * l2),
    };
    bench.copy_gbps = copy_bandwidth(&bench.handle, &bench.timer, WARMUP, RUNS)?;
    println!(
        "timing: CUDA events per call on the handle's stream; {WARMUP} warm-up + {RUNS} timed calls per library, median; \
         calls queued behind a stream gate (device time); oxidnn and cuDNN alternate; buffer sets rotate over >= {} MiB",
        bench.rotation_bytes >> 20
    );
    println!(
        "copy bandwidth (cuMemcpyDtoDAsync, 1 GiB, read + write bytes): {:.0} GB/s",
        bench.copy_gbps
    );
    if args.quick {
        println!("OXIDNN_BENCH_QUICK: one shape only");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    println!();

    let mut report = Report::new(bench.copy_gbps);
    report.print_header();
    for dims in SHAPES {
        for (dtype, layout) in FORMATS {
            let label = Problem::new(dtype, layout, dims)
                .map(|p| p.label())
                .unwrap_or_default();
            let passes: Vec<Pass> = PASSES
                .iter()
                .copied()
                .filter(|&pass| selects(&args, &dims, &label, pass))
                .collect();
            if passes.is_empty() {
                continue;
            }
            let mut group = match Group::new(&bench, dtype, layout, dims) {
                Ok(g) => g,
                Err(e) => {
                    println!("    ! {label} {}: skipped: {e}", shape_string(&dims));
                    continue;
                }
            };
            for pass in passes {
                report.add(run_case(&bench, &mut group, pass));
            }
            // Outstanding work must finish before the buffers are freed.
            bench.timer.synchronize()?;
        }
    }
    if report.rows.is_empty() {
        println!("no rows match the filter");
    }
    report.print_summary(&device);
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
