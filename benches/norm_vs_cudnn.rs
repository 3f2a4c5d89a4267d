//! oxidnn's softmax against cuDNN's (cudnnSoftmaxForward / cudnnSoftmaxBackward), and
//! oxidnn's layer and RMS norm against PyTorch's kernels (cuDNN's classic API has no layer
//! norm), on transformer shapes: rows x normalized size `8192x1024`, `8192x4096` and
//! `196608x512` (32 x 12 heads x 512 attention rows), f32 and f16.
//!
//! ```text
//! python3 benches/torch_norms.py torch_norms.csv        # PyTorch's times (optional)
//! OXIDNN_TORCH_CSV=torch_norms.csv cargo bench --features cudnn-bench --bench norm_vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `op dtype shape` contains it, e.g.
//!   `softmax_fwd`, `layer_norm`, `f16`, `8192x4096`.
//! * `OXIDNN_BENCH_QUICK=1`: a handful of rows only (smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `norm-results.csv` in the cwd).
//! * `OXIDNN_TORCH_CSV=path`: PyTorch's times from `benches/torch_norms.py` (same machine,
//!   same shapes and dtypes), printed beside oxidnn's with the ratio.
//!
//! Softmax rows: channel mode with the row as C (N = rows, C = D, H = W = 1) and instance
//! mode on the same tensor, accurate and log algorithms, forward and backward. Norm rows:
//! forward with scale and bias (RMS: scale) of the data's dtype, saving mean/rstd;
//! backward computing dx, dscale and dbias (RMS: dx, dscale).
//!
//! Method (as `benches/vs_cudnn.rs`): both libraries run in this process on the same device
//! buffers and stream; each output is checked first (softmax against cuDNN's; the norms
//! against the f64 CPU reference on the first rows), then every timed call is bracketed by
//! its own pair of CUDA events: 5 warm-up calls, then 30 timed calls per library, queued
//! behind a host-side stream gate and released together (device time, not launch
//! overhead), libraries alternating call by call, median reported. Shapes rotate over
//! several buffer sets (at least 200 MiB and 4x the L2 in all) so no call reads what the
//! previous one left in cache. "Bytes moved" is the minimum traffic: each input read once,
//! each output written once. The roofline reference is the device-to-device copy
//! bandwidth (cuMemcpyDtoDAsync of 1 GiB, read + write bytes). PyTorch's times are taken
//! by `benches/torch_norms.py` with the same method (its header says what it times).
//!
//! Without libcudnn only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::cudnn::{
    copy_bandwidth, cudnn_check, cudnn_sys, gb_per_s, version_string, Cudnn, TensorDesc,
};
use common::{
    dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes, Args,
    Check, Context, Res, Timer,
};
use cudarc::driver::CudaStream;
use oxidnn::{
    layer_norm_backward, layer_norm_backward_workspace_size, layer_norm_forward, softmax_backward,
    softmax_forward, Buffer, DataType, Handle, HostTensor, LayerNormDescriptor, NormMode,
    SoftmaxAlgorithm, SoftmaxMode, TensorDescriptor,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Untimed calls per library before the timed ones.
const WARMUP: usize = 5;
/// Timed calls per library; the median is reported.
const RUNS: usize = 30;
/// Libraries timed side by side (oxidnn, cuDNN).
const MAX_SIDES: usize = 2;
/// Buffer sets of one shape together span at least this much (and 4x the L2).
const ROTATION_MIN_BYTES: usize = 200 << 20;
/// Inputs are uniform in `[-INPUT_RANGE, INPUT_RANGE]`, never closer to 0 than
/// `INPUT_MIN_MAGNITUDE`.
const INPUT_RANGE: f32 = 2.0;
const INPUT_MIN_MAGNITUDE: f32 = 1.0 / 1024.0;
/// The norms' epsilon (PyTorch's default).
const EPSILON: f64 = 1e-5;
/// Rows of a norm's output checked against the CPU reference.
const CHECK_ROWS: usize = 64;

const DTYPES: [DataType; 2] = [DataType::F32, DataType::F16];

/// Rows x normalized size.
const SHAPES: [[usize; 2]; 3] = [[8192, 1024], [8192, 4096], [32 * 12 * 512, 512]];

const QUICK_SHAPE: [usize; 2] = [8192, 1024];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("norm_vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    SoftmaxFwd(SoftmaxAlgorithm, SoftmaxMode),
    SoftmaxBwd(SoftmaxAlgorithm, SoftmaxMode),
    NormFwd(NormMode),
    NormBwd(NormMode),
}

use SoftmaxAlgorithm::{Accurate, Log};
use SoftmaxMode::{Channel, Instance};

const OPS: [Op; 12] = [
    Op::SoftmaxFwd(Accurate, Channel),
    Op::SoftmaxFwd(Log, Channel),
    Op::SoftmaxFwd(Accurate, Instance),
    Op::SoftmaxFwd(Log, Instance),
    Op::SoftmaxBwd(Accurate, Channel),
    Op::SoftmaxBwd(Log, Channel),
    Op::SoftmaxBwd(Accurate, Instance),
    Op::SoftmaxBwd(Log, Instance),
    Op::NormFwd(NormMode::LayerNorm),
    Op::NormBwd(NormMode::LayerNorm),
    Op::NormFwd(NormMode::RmsNorm),
    Op::NormBwd(NormMode::RmsNorm),
];

/// The rows of `OXIDNN_BENCH_QUICK=1` (on `QUICK_SHAPE`, both dtypes).
const QUICK_OPS: [Op; 6] = [
    Op::SoftmaxFwd(Accurate, Channel),
    Op::SoftmaxBwd(Log, Channel),
    Op::NormFwd(NormMode::LayerNorm),
    Op::NormBwd(NormMode::LayerNorm),
    Op::NormFwd(NormMode::RmsNorm),
    Op::NormBwd(NormMode::RmsNorm),
];

fn algo_name(a: SoftmaxAlgorithm) -> &'static str {
    match a {
        SoftmaxAlgorithm::Fast => "fast",
        SoftmaxAlgorithm::Accurate => "accurate",
        SoftmaxAlgorithm::Log => "log",
    }
}

fn mode_name(m: SoftmaxMode) -> &'static str {
    match m {
        SoftmaxMode::Instance => "instance",
        SoftmaxMode::Channel => "channel",
    }
}

fn norm_name(m: NormMode) -> &'static str {
    match m {
        NormMode::LayerNorm => "layer_norm",
        NormMode::RmsNorm => "rms_norm",
    }
}

impl Op {
    fn name(self) -> String {
        match self {
            Op::SoftmaxFwd(a, m) => format!("softmax_fwd.{}.{}", algo_name(a), mode_name(m)),
            Op::SoftmaxBwd(a, m) => format!("softmax_bwd.{}.{}", algo_name(a), mode_name(m)),
            Op::NormFwd(m) => format!("{}.fwd", norm_name(m)),
            Op::NormBwd(m) => format!("{}.bwd", norm_name(m)),
        }
    }

    /// The group the summary's geomean is taken over.
    fn family(self) -> String {
        match self {
            Op::SoftmaxFwd(..) => "softmax_fwd".into(),
            Op::SoftmaxBwd(..) => "softmax_bwd".into(),
            Op::NormFwd(_) | Op::NormBwd(_) => self.name(),
        }
    }

    fn is_softmax(self) -> bool {
        matches!(self, Op::SoftmaxFwd(..) | Op::SoftmaxBwd(..))
    }

    fn norm(self) -> Option<LayerNormDescriptor> {
        match self {
            Op::NormFwd(m) | Op::NormBwd(m) => LayerNormDescriptor::new(m, 1, EPSILON).ok(),
            _ => None,
        }
    }

    /// Minimum bytes the op must move: each input read once, each output written once.
    /// Softmax forward: x, y; backward: y, dy, dx. Norm forward: x, y, the weights, the
    /// statistics; backward: x, dy, dx, the scale, the statistics, the weight gradients.
    fn bytes_moved(self, p: &Problem) -> u64 {
        let tensor = p.x.size_bytes() as u64;
        let weights = p.w.size_bytes() as u64;
        let stats = p.stats.size_bytes() as u64;
        match self {
            Op::SoftmaxFwd(..) => 2 * tensor,
            Op::SoftmaxBwd(..) => 3 * tensor,
            Op::NormFwd(NormMode::LayerNorm) => 2 * tensor + 2 * weights + 2 * stats,
            Op::NormFwd(NormMode::RmsNorm) => 2 * tensor + weights + stats,
            Op::NormBwd(NormMode::LayerNorm) => 3 * tensor + 3 * weights + 2 * stats,
            Op::NormBwd(NormMode::RmsNorm) => 3 * tensor + 2 * weights + stats,
        }
    }
}

fn shape_string(dims: &[usize]) -> String {
    dims.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// The descriptors of one shape and dtype.
struct Problem {
    dims: [usize; 2],
    dtype: DataType,
    /// The softmax tensor: N = rows, C = D, H = W = 1.
    x: TensorDescriptor,
    /// The same memory as rows x D, normalized over D.
    rows: TensorDescriptor,
    /// Scale and bias (the data's dtype).
    w: TensorDescriptor,
    /// Mean and rstd: f32, one per row.
    stats: TensorDescriptor,
}

impl Problem {
    fn new(dtype: DataType, dims: [usize; 2]) -> oxidnn::Result<Self> {
        let [rows, d] = dims;
        Ok(Self {
            dims,
            dtype,
            x: TensorDescriptor::nchw(dtype, rows, d, 1, 1)?,
            rows: TensorDescriptor::packed(dtype, &[rows, d])?,
            w: TensorDescriptor::packed(dtype, &[d])?,
            stats: TensorDescriptor::packed(DataType::F32, &[rows, 1])?,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// One set of buffers for a problem. Invariant (checked in `alloc`): `x`, `dy`, `y` and
/// `out` hold `p.x`'s span, `w`, `b`, `dw`, `db` hold `p.w`'s, `mean` and `rstd` `p.stats`'s.
struct Set {
    /// x (random).
    x: Buffer,
    /// dy (random).
    dy: Buffer,
    /// The forward output a backward reads (softmax's y).
    y: Buffer,
    /// The output (y, dx).
    out: Buffer,
    w: Buffer,
    b: Buffer,
    dw: Buffer,
    db: Buffer,
    mean: Buffer,
    rstd: Buffer,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem) -> Res<Self> {
        let alloc = |bytes: usize| h.alloc_bytes(bytes).context("allocating a buffer");
        let (full, w, s) = (p.x.size_bytes(), p.w.size_bytes(), p.stats.size_bytes());
        assert_eq!(full, p.rows.size_bytes());
        Ok(Self {
            x: alloc(full)?,
            dy: alloc(full)?,
            y: alloc(full)?,
            out: alloc(full)?,
            w: alloc(w)?,
            b: alloc(w)?,
            dw: alloc(w)?,
            db: alloc(w)?,
            mean: alloc(s)?,
            rstd: alloc(s)?,
        })
    }

    fn bytes(&self) -> usize {
        [
            &self.x, &self.dy, &self.y, &self.out, &self.w, &self.b, &self.dw, &self.db,
            &self.mean, &self.rstd,
        ]
        .iter()
        .map(|b| b.len_bytes())
        .sum()
    }
}

fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 | DataType::F64 => 1e-5,
        DataType::F16 | DataType::BF16 => 1e-2,
    }
}

// ---------------------------------------------------------------------------------------
// cuDNN (softmax only)
// ---------------------------------------------------------------------------------------

/// A host scalar for cuDNN: float for f32 and f16 data.
#[repr(C, align(8))]
struct Scalar([u8; 8]);

impl Scalar {
    fn f32(v: f64) -> Self {
        let mut s = Scalar([0; 8]);
        s.0[..4].copy_from_slice(&(v as f32).to_ne_bytes());
        s
    }

    fn ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

fn cudnn_algo(a: SoftmaxAlgorithm) -> cudnn_sys::cudnnSoftmaxAlgorithm_t {
    use cudnn_sys::cudnnSoftmaxAlgorithm_t as A;
    match a {
        SoftmaxAlgorithm::Fast => A::CUDNN_SOFTMAX_FAST,
        SoftmaxAlgorithm::Accurate => A::CUDNN_SOFTMAX_ACCURATE,
        SoftmaxAlgorithm::Log => A::CUDNN_SOFTMAX_LOG,
    }
}

fn cudnn_mode(m: SoftmaxMode) -> cudnn_sys::cudnnSoftmaxMode_t {
    use cudnn_sys::cudnnSoftmaxMode_t as M;
    match m {
        SoftmaxMode::Instance => M::CUDNN_SOFTMAX_MODE_INSTANCE,
        SoftmaxMode::Channel => M::CUDNN_SOFTMAX_MODE_CHANNEL,
    }
}

/// Runs a softmax op through cuDNN on `set`'s buffers.
///
/// Invariant behind the unsafe calls: `x` is live and describes `p.x`; the addresses are
/// `set`'s live buffers, which hold that span (`Set::alloc`); cuDNN issues on the oxidnn
/// handle's stream, the only stream that touches them; the scalars outlive the call.
fn run_cudnn(cu: &Cudnn, x: &TensorDesc, op: Op, set: &mut Set) -> Res<()> {
    let h = cu.handle.0;
    let (one, zero) = (Scalar::f32(1.0), Scalar::f32(0.0));
    let (xa, dya, ya, outa) = (
        device_address(&set.x)?,
        device_address(&set.dy)?,
        device_address(&set.y)?,
        device_address(&set.out)?,
    );
    let status = match op {
        // SAFETY: see the invariant above; out = softmax(x).
        Op::SoftmaxFwd(a, m) => unsafe {
            cudnn_sys::cudnnSoftmaxForward(
                h,
                cudnn_algo(a),
                cudnn_mode(m),
                one.ptr(),
                x.0,
                dev(xa),
                zero.ptr(),
                x.0,
                dev_mut(outa),
            )
        },
        // SAFETY: see the invariant above; out = dx from y and dy.
        Op::SoftmaxBwd(a, m) => unsafe {
            cudnn_sys::cudnnSoftmaxBackward(
                h,
                cudnn_algo(a),
                cudnn_mode(m),
                one.ptr(),
                x.0,
                dev(ya),
                x.0,
                dev(dya),
                zero.ptr(),
                x.0,
                dev_mut(outa),
            )
        },
        _ => return Err(format!("internal: cuDNN has no {}", op.name())),
    };
    cudnn_check(status, &op.name())
}

// ---------------------------------------------------------------------------------------
// oxidnn
// ---------------------------------------------------------------------------------------

/// Runs `op` through oxidnn on `set`'s buffers; `workspace` holds what the norm backward
/// asks for.
fn run_oxidnn(
    h: &Handle,
    op: Op,
    p: &Problem,
    set: &mut Set,
    workspace: &mut Buffer,
) -> oxidnn::Result<()> {
    let (x, r) = (&p.x, &p.rows);
    match op {
        Op::SoftmaxFwd(a, m) => softmax_forward(h, a, m, 1.0, x, &set.x, 0.0, x, &mut set.out),
        Op::SoftmaxBwd(a, m) => {
            softmax_backward(h, a, m, 1.0, x, &set.y, x, &set.dy, 0.0, x, &mut set.out)
        }
        Op::NormFwd(m) => {
            let layer = m == NormMode::LayerNorm;
            let norm = LayerNormDescriptor::new(m, 1, EPSILON)?;
            layer_norm_forward(
                h,
                &norm,
                r,
                &set.x,
                Some(&p.w),
                Some(&set.w),
                layer.then_some(&set.b),
                r,
                &mut set.out,
                Some(&p.stats),
                layer.then_some(&mut set.mean),
                Some(&mut set.rstd),
            )
        }
        Op::NormBwd(m) => {
            let layer = m == NormMode::LayerNorm;
            let norm = LayerNormDescriptor::new(m, 1, EPSILON)?;
            layer_norm_backward(
                h,
                &norm,
                r,
                &set.x,
                r,
                &set.dy,
                Some(&p.w),
                Some(&set.w),
                &p.stats,
                layer.then_some(&set.mean),
                &set.rstd,
                r,
                &mut set.out,
                Some(&mut set.dw),
                layer.then_some(&mut set.db),
                workspace,
            )
        }
    }
}

// ---------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------

/// Everything that lives for the whole run. cuDNN comes first so its handle is destroyed
/// before the stream and context it uses.
struct Bench {
    cudnn: Option<Cudnn>,
    timer: Timer,
    handle: Handle,
    stream: Arc<CudaStream>,
    copy_gbps: f64,
    rotation_bytes: usize,
    torch: TorchTimes,
}

/// The buffers of one shape and dtype: `sets` rotate so that small problems miss L2.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    /// cuDNN's descriptor of `p.x`, or why there is none.
    cudnn: Result<TensorDesc, String>,
    /// The inputs of every set, as uploaded (for the reference check).
    x: Vec<u8>,
    dy: Vec<u8>,
    w: Vec<u8>,
    b: Vec<u8>,
}

impl Group {
    fn new(b: &Bench, dtype: DataType, dims: [usize; 2]) -> Res<Self> {
        let p = Problem::new(dtype, dims).context("describing the problem")?;
        let first = Set::alloc(&b.handle, &p)?;
        let count = b.rotation_bytes.div_ceil(first.bytes()).max(1);
        let mut sets = vec![first];
        for _ in 1..count {
            sets.push(Set::alloc(&b.handle, &p)?);
        }
        let seed = dims.iter().fold(dtype.size_bytes() as u64, |s, &d| {
            s.wrapping_mul(31).wrapping_add(d as u64)
        });
        let elements = p.x.element_count();
        let random =
            |count, seed| random_bytes(dtype, count, seed, INPUT_RANGE, INPUT_MIN_MAGNITUDE);
        let (x, dy) = (random(elements, seed), random(elements, seed ^ 0x5555));
        let (w, bias) = (
            random(dims[1], seed ^ 0xAAAA),
            random(dims[1], seed ^ 0x3333),
        );
        for set in &mut sets {
            let h = &b.handle;
            h.write_bytes(&mut set.x, &x).context("uploading x")?;
            h.write_bytes(&mut set.dy, &dy).context("uploading dy")?;
            h.write_bytes(&mut set.w, &w)
                .context("uploading the scale")?;
            h.write_bytes(&mut set.b, &bias)
                .context("uploading the bias")?;
        }
        let cudnn = match &b.cudnn {
            Some(_) => TensorDesc::new(&p.x),
            None => Err("cuDNN not loaded".into()),
        };
        Ok(Self {
            p,
            sets,
            cudnn,
            x,
            dy,
            w,
            b: bias,
        })
    }
}

enum Timing {
    Us(f64),
    Missing,
}

impl Timing {
    fn us(&self) -> Option<f64> {
        match self {
            Timing::Us(us) => Some(*us),
            Timing::Missing => None,
        }
    }
}

struct Row {
    op: Op,
    dtype: String,
    shape: String,
    bytes: u64,
    oxidnn: Timing,
    cudnn: Timing,
    torch: Option<f64>,
    check: Check,
    notes: Vec<String>,
}

impl Row {
    fn cudnn_ratio(&self) -> Option<f64> {
        Some(self.cudnn.us()? / self.oxidnn.us()?)
    }
    fn torch_ratio(&self) -> Option<f64> {
        Some(self.torch? / self.oxidnn.us()?)
    }
}

/// Resets what `op` reads, and poisons what it writes: a backward's forward output
/// (softmax's y; the norms' statistics) comes from oxidnn's forward on the same set.
fn prepare(b: &Bench, op: Op, p: &Problem, set: &mut Set) -> Res<()> {
    let s = &b.stream;
    match op {
        Op::SoftmaxBwd(a, m) => {
            softmax_forward(&b.handle, a, m, 1.0, &p.x, &set.x, 0.0, &p.x, &mut set.y)
                .context("computing y for backward")?;
        }
        Op::NormBwd(m) => {
            let mut ws = b.handle.alloc_bytes(0).context("allocating")?;
            run_oxidnn(&b.handle, Op::NormFwd(m), p, set, &mut ws)
                .context("computing the statistics for backward")?;
            poison_async(s, &mut set.dw)?;
            poison_async(s, &mut set.db)?;
        }
        Op::NormFwd(_) => {
            poison_async(s, &mut set.mean)?;
            poison_async(s, &mut set.rstd)?;
        }
        Op::SoftmaxFwd(..) => {}
    }
    poison_async(s, &mut set.out)
}

/// The first `CHECK_ROWS` rows of the output of one run on set 0, as bytes.
fn output_bytes(b: &Bench, p: &Problem, set: &Set, rows: usize) -> Res<Vec<u8>> {
    let mut bytes = b
        .handle
        .read_bytes(&set.out)
        .context("reading the output")?;
    bytes.truncate(rows * p.dims[1] * p.dtype.size_bytes());
    Ok(bytes)
}

/// The CPU reference's output of a norm op on the first `CHECK_ROWS` rows of set 0.
fn norm_reference(b: &Bench, g: &Group, op: Op) -> Res<Vec<u8>> {
    let p = &g.p;
    let rows = CHECK_ROWS.min(p.dims[0]);
    let d = p.dims[1];
    let desc = TensorDescriptor::packed(p.dtype, &[rows, d]).context("describing")?;
    let head = |bytes: &[u8]| HostTensor::from_bytes(desc, bytes);
    let x = head(&g.x);
    let weight = |bytes: &[u8]| HostTensor::from_bytes(p.w, bytes);
    let norm = op.norm().ok_or("internal: not a norm")?;
    let layer = norm.mode() == NormMode::LayerNorm;
    let scale = weight(&g.w);
    let bias = layer.then(|| weight(&g.b));
    let mut out = HostTensor::filled(desc, 0.0);
    match op {
        Op::NormFwd(_) => {
            oxidnn::reference::layer_norm::forward(
                &norm,
                &x,
                Some(&scale),
                bias.as_ref(),
                &mut out,
            );
        }
        Op::NormBwd(_) => {
            // The statistics the forward saved (f32), as the backward reads them.
            let read_f32 = |buf: &Buffer| -> Res<Vec<f64>> {
                let bytes = b.handle.read_bytes(buf).context("reading statistics")?;
                Ok(bytes[..rows * 4]
                    .chunks_exact(4)
                    .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect())
            };
            let set = &g.sets[0];
            let mean = if layer {
                read_f32(&set.mean)?
            } else {
                vec![0.0; rows]
            };
            let rstd = read_f32(&set.rstd)?;
            let dy = head(&g.dy);
            oxidnn::reference::layer_norm::backward(
                &norm,
                &x,
                &dy,
                Some(&scale),
                &mean,
                &rstd,
                &mut out,
            );
        }
        _ => return Err("internal: not a norm".into()),
    }
    Ok(out.to_bytes())
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

fn run_case(b: &Bench, g: &mut Group, op: Op) -> Row {
    let p = &g.p;
    let shape = shape_string(&p.dims);
    let mut row = Row {
        op,
        dtype: p.dtype.to_string(),
        shape: shape.clone(),
        bytes: op.bytes_moved(p),
        oxidnn: Timing::Missing,
        cudnn: Timing::Missing,
        torch: None,
        check: Check::Error,
        notes: vec![],
    };
    if !op.is_softmax() {
        match b.torch.get(&op.name(), &row.dtype, &shape) {
            Some((us, what)) => {
                row.torch = *us;
                if us.is_none() {
                    row.notes.push(format!("PyTorch: {what}"));
                }
            }
            None if b.torch.loaded => row.notes.push("PyTorch: no row in the CSV".into()),
            None => {}
        }
    }
    let mut workspace = match op {
        Op::NormBwd(m) => LayerNormDescriptor::new(m, 1, EPSILON)
            .and_then(|n| {
                layer_norm_backward_workspace_size(
                    &b.handle,
                    &n,
                    &p.rows,
                    &p.rows,
                    &p.rows,
                    Some(&p.w),
                )
            })
            .and_then(|bytes| b.handle.alloc_bytes(bytes)),
        _ => b.handle.alloc_bytes(0),
    };
    let workspace = match &mut workspace {
        Ok(w) => w,
        Err(e) => {
            row.notes.push(format!("oxidnn: {e}"));
            return row;
        }
    };
    let cu = match (&b.cudnn, &g.cudnn, op.is_softmax()) {
        (Some(cu), Ok(d), true) => Some((cu, d)),
        (Some(_), Err(e), true) => {
            row.notes.push(format!("cuDNN: {e}"));
            None
        }
        _ => None,
    };

    // Check: one run of each library on set 0, from the same starting state (the norms:
    // the first rows against the CPU reference).
    let check_rows = if op.is_softmax() {
        p.dims[0]
    } else {
        CHECK_ROWS.min(p.dims[0])
    };
    let set0 = &mut g.sets[0];
    let ox_out = prepare(b, op, p, set0)
        .and_then(|()| run_oxidnn(&b.handle, op, p, set0, workspace).context("oxidnn"))
        .and_then(|()| output_bytes(b, p, set0, check_rows));
    let vendor_out = match &cu {
        Some((cu, d)) => Some(
            prepare(b, op, p, set0)
                .and_then(|()| run_cudnn(cu, d, op, set0).context("cuDNN"))
                .and_then(|()| output_bytes(b, p, set0, check_rows)),
        ),
        None if !op.is_softmax() => Some(norm_reference(b, g, op)),
        None => None,
    };
    let mut sides = vec![];
    match &ox_out {
        Ok(_) => sides.push(Side::Oxidnn),
        Err(e) => row.notes.push(e.clone()),
    }
    match (&vendor_out, &cu) {
        (Some(Ok(_)), Some(_)) => sides.push(Side::Cudnn),
        (Some(Err(e)), _) => row.notes.push(e.clone()),
        _ => {}
    }
    row.check = Check::compare(&ox_out, vendor_out.as_ref(), p.dtype, tolerance(p.dtype));
    if sides.is_empty() {
        return row;
    }

    // Time: the libraries alternate call by call, each call on the next buffer set.
    let timed = g
        .sets
        .iter_mut()
        .try_for_each(|set| prepare(b, op, p, set))
        .and_then(|()| {
            let count = g.sets.len();
            b.timer
                .measure(sides.len(), WARMUP, RUNS, |side, invocation| {
                    let set = &mut g.sets[invocation % count];
                    match (sides[side], &cu) {
                        (Side::Oxidnn, _) => {
                            run_oxidnn(&b.handle, op, p, set, workspace).context("oxidnn")
                        }
                        (Side::Cudnn, Some((cu, d))) => run_cudnn(cu, d, op, set),
                        (Side::Cudnn, None) => Err("internal: cuDNN side without a plan".into()),
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
// PyTorch's times
// ---------------------------------------------------------------------------------------

/// Rows of `benches/torch_norms.py`'s CSV: (op, dtype, shape) -> (us, what was timed).
#[derive(Default)]
struct TorchTimes {
    loaded: bool,
    version: String,
    rows: HashMap<(String, String, String), (Option<f64>, String)>,
}

impl TorchTimes {
    /// Reads `OXIDNN_TORCH_CSV` if set; says why not otherwise.
    fn load() -> Self {
        let Ok(path) = std::env::var("OXIDNN_TORCH_CSV") else {
            println!("PyTorch: OXIDNN_TORCH_CSV not set; norms timed for oxidnn only");
            return Self::default();
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                println!("PyTorch: reading {path}: {e}; norms timed for oxidnn only");
                return Self::default();
            }
        };
        let mut t = Self {
            loaded: true,
            ..Self::default()
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() < 6 {
                continue;
            }
            t.version = f[5].to_string();
            t.rows.insert(
                (f[0].into(), f[1].into(), f[2].into()),
                (f[3].parse().ok(), f[4].to_string()),
            );
        }
        println!(
            "PyTorch {}: {} rows from {path} (benches/torch_norms.py)",
            t.version,
            t.rows.len()
        );
        t
    }

    fn get(&self, op: &str, dtype: &str, shape: &str) -> Option<&(Option<f64>, String)> {
        self.rows.get(&(op.into(), dtype.into(), shape.into()))
    }
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str = "op,dtype,shape,bytes_moved,oxidnn_us,oxidnn_gbps,pct_copy_bw,cudnn_us,cudnn_gbps,ratio_cudnn_over_oxidnn,torch_us,torch_gbps,ratio_torch_over_oxidnn,check,rel_err";

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
    copy_gbps: f64,
}

impl Report {
    fn new(copy_gbps: f64) -> Self {
        let csv = open_csv("norm_vs_cudnn", "norm-results.csv", CSV_HEADER);
        Self {
            rows: vec![],
            csv,
            copy_gbps,
        }
    }

    fn print_header(&self) {
        println!(
            "{:<28} {:<5} {:<11} {:>8} {:>9} {:>6} {:>6} {:>9} {:>6} {:>9} {:>6}  check",
            "op",
            "dtype",
            "shape",
            "MB",
            "oxidnn us",
            "GB/s",
            "%copy",
            "cuDNN us",
            "cu/ox",
            "torch us",
            "pt/ox"
        );
    }

    fn add(&mut self, row: Row) {
        let ox_us = row.oxidnn.us();
        let cu_us = row.cudnn.us();
        let gbps = |t: Option<f64>| t.map(|t| gb_per_s(row.bytes, t));
        let pct = gbps(ox_us).map(|g| 100.0 * g / self.copy_gbps);
        let (check, err) = row.check.label();
        let err_text = err.map_or_else(String::new, |e| format!("{e:.1e}"));
        println!(
            "{:<28} {:<5} {:<11} {:>8.1} {:>9} {:>6} {:>6} {:>9} {:>6} {:>9} {:>6}  {check} {err_text}",
            row.op.name(),
            row.dtype,
            row.shape,
            row.bytes as f64 / 1e6,
            fmt_opt(ox_us, 1),
            fmt_opt(gbps(ox_us), 0),
            fmt_opt(pct, 1),
            fmt_opt(cu_us, 1),
            fmt_opt(row.cudnn_ratio(), 2),
            fmt_opt(row.torch, 1),
            fmt_opt(row.torch_ratio(), 2),
        );
        for note in &row.notes {
            println!("    ! {note}");
        }
        if let Some((path, w)) = &mut self.csv {
            let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
            let line = format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                row.op.name(),
                row.dtype,
                row.shape,
                row.bytes,
                cell(ox_us),
                cell(gbps(ox_us)),
                cell(pct),
                cell(cu_us),
                cell(gbps(cu_us)),
                cell(row.cudnn_ratio()),
                cell(row.torch),
                cell(gbps(row.torch)),
                cell(row.torch_ratio()),
                check,
                err.map_or_else(String::new, |e| format!("{e:e}")),
            );
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
                eprintln!("norm_vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: geometric mean of reference time / oxidnn time (> 1: oxidnn faster), rows that passed the check");
        let mut families: Vec<String> = vec![];
        for row in &self.rows {
            if !families.contains(&row.op.family()) {
                families.push(row.op.family());
            }
        }
        let line = |name: &str, who: &str, v: &[f64]| {
            if v.is_empty() {
                println!("  {name:<14} vs {who:<7} {:>4} rows   n/a", 0);
            } else {
                let geomean = (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp();
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "  {name:<14} vs {who:<7} {:>4} rows   geomean {geomean:.3}   (min {min:.2}, max {max:.2})",
                    v.len()
                );
            }
        };
        for family in &families {
            let passed = || {
                self.rows
                    .iter()
                    .filter(|r| &r.op.family() == family && matches!(r.check, Check::Ok(_)))
            };
            if family.starts_with("softmax") {
                let v: Vec<f64> = passed().filter_map(Row::cudnn_ratio).collect();
                line(family, "cuDNN", &v);
            } else {
                let v: Vec<f64> = passed().filter_map(Row::torch_ratio).collect();
                line(family, "PyTorch", &v);
            }
        }
        let count = |f: fn(&Check) -> bool| self.rows.iter().filter(|r| f(&r.check)).count();
        let mismatches = count(|c| matches!(c, Check::Mismatch(_)));
        let errors = count(|c| matches!(c, Check::Error));
        println!(
            "  rows: {}, MISMATCH: {mismatches}, oxidnn errors: {errors}",
            self.rows.len()
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

impl Args {
    fn selects(&self, dims: &[usize; 2], dtype: DataType, op: Op) -> bool {
        if self.quick && (*dims != QUICK_SHAPE || !QUICK_OPS.contains(&op)) {
            return false;
        }
        let key = format!("{} {} {}", op.name(), dtype, shape_string(dims));
        self.filter
            .as_ref()
            .is_none_or(|f| key.contains(f.as_str()))
    }
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let Some(gpu) = open_gpu("norm_vs_cudnn")? else {
        return Ok(());
    };
    let (handle, stream, device, l2) = (gpu.handle, gpu.stream, gpu.name, gpu.l2_bytes);
    println!("oxidnn softmax vs cuDNN, layer/RMS norm vs PyTorch");
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
            println!("cuDNN: NOT AVAILABLE ({why}); timing oxidnn only, softmax unchecked");
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
        torch: TorchTimes::load(),
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
        println!("OXIDNN_BENCH_QUICK: a few rows only");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    println!();

    let mut report = Report::new(bench.copy_gbps);
    report.print_header();
    for dims in SHAPES {
        for dtype in DTYPES {
            let ops: Vec<Op> = OPS
                .iter()
                .copied()
                .filter(|&op| args.selects(&dims, dtype, op))
                .collect();
            if ops.is_empty() {
                continue;
            }
            let mut group = match Group::new(&bench, dtype, dims) {
                Ok(g) => g,
                Err(e) => {
                    println!("    ! {dtype} {}: skipped: {e}", shape_string(&dims));
                    continue;
                }
            };
            for op in ops {
                report.add(run_case(&bench, &mut group, op));
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
