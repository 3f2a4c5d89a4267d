//! oxidnn against cuDNN: the activation, tensor and reduction ops, run by both libraries on
//! the same device buffers and stream, checked against each other, then timed.
//!
//! ```text
//! cargo bench --features cudnn-bench --bench vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `op dtype shape` contains it, e.g.
//!   `act_fwd`, `reduce`, `f16`, `32x256x56x56`, `relu f32`.
//! * `OXIDNN_BENCH_QUICK=1`: a handful of rows only (smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `bench-results.csv` in the cwd).
//!
//! Method: every timed call is bracketed by its own pair of CUDA events on the handle's
//! stream; 5 warm-up calls, then 30 timed calls per library, median reported. The timed
//! calls are queued behind a host-side stream gate and released together, so the events
//! measure device time, not host launch overhead. oxidnn and cuDNN alternate call by call,
//! and shapes small enough to live in L2 rotate over several buffer sets (at least 200 MiB
//! and 4x the L2 in all) so no call reads what the previous one left in cache. "Bytes
//! moved" is the minimum traffic: each input read once and each output written once. The
//! roofline reference is the device-to-device copy bandwidth (cuMemcpyDtoDAsync of 1 GiB,
//! read + write bytes).
//!
//! Without libcudnn only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::cudnn::{
    copy_bandwidth, cudnn_check, cudnn_sys, gb_per_s, version_string, ActDesc, Cudnn, OpDesc,
    ReduceDesc, TensorDesc,
};
use common::{
    copy_async, dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async,
    random_bytes, Args, Check, Context, Res, Timer,
};
use cudarc::driver::CudaStream;
use oxidnn::{
    activation_backward, activation_forward, add_tensor, op_tensor, reduce_tensor,
    reduce_tensor_workspace_size, scale_tensor, set_tensor, transform_tensor, ActivationDescriptor,
    Buffer, DataType, Handle, OpTensorOp, ReduceOp, ReduceTensorDescriptor, TensorDescriptor,
};
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
/// `scale_tensor`'s alpha: exact, keeps values bounded over repeated in-place runs.
const SCALE_ALPHA: f64 = -1.0;
/// `set_tensor`'s value (exact in every dtype).
const SET_VALUE: f64 = 0.5;
/// Clipped relu's ceiling: inside the input range, so the check sees clipping.
const CLIP_CEILING: f64 = 1.0;

const DTYPES: [DataType; 2] = [DataType::F32, DataType::F16];

/// Logical NCHW dims of the problems: ResNet-50 activations (N = 32), then 2^26 and 2^28
/// elements.
const SHAPES: [[usize; 4]; 7] = [
    [32, 64, 112, 112],
    [32, 256, 56, 56],
    [32, 512, 28, 28],
    [32, 1024, 14, 14],
    [32, 2048, 7, 7],
    [64, 256, 64, 64],
    [256, 256, 64, 64],
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Relu,
    Sigmoid,
    Tanh,
    Elu,
    ClippedRelu,
    Swish,
    Gelu,
    Softplus,
    LeakyRelu,
}

impl Act {
    fn name(self) -> &'static str {
        match self {
            Act::Relu => "relu",
            Act::Sigmoid => "sigmoid",
            Act::Tanh => "tanh",
            Act::Elu => "elu",
            Act::ClippedRelu => "clipped_relu",
            Act::Swish => "swish",
            Act::Gelu => "gelu",
            Act::Softplus => "softplus",
            Act::LeakyRelu => "leaky_relu",
        }
    }

    fn oxidnn(self) -> oxidnn::Result<ActivationDescriptor> {
        Ok(match self {
            Act::Relu => ActivationDescriptor::relu(),
            Act::Sigmoid => ActivationDescriptor::sigmoid(),
            Act::Tanh => ActivationDescriptor::tanh(),
            Act::Elu => ActivationDescriptor::elu(1.0)?,
            Act::ClippedRelu => ActivationDescriptor::clipped_relu(CLIP_CEILING)?,
            Act::Swish => ActivationDescriptor::swish(1.0)?,
            Act::Gelu => ActivationDescriptor::gelu(),
            Act::Softplus => ActivationDescriptor::softplus(),
            Act::LeakyRelu => ActivationDescriptor::leaky_relu(0.01)?,
        })
    }

    /// cuDNN's mode and coefficient for the same function; `None` where cuDNN has none.
    fn cudnn(self) -> Option<(cudnn_sys::cudnnActivationMode_t, f64)> {
        use cudnn_sys::cudnnActivationMode_t as M;
        match self {
            Act::Relu => Some((M::CUDNN_ACTIVATION_RELU, 0.0)),
            Act::Sigmoid => Some((M::CUDNN_ACTIVATION_SIGMOID, 0.0)),
            Act::Tanh => Some((M::CUDNN_ACTIVATION_TANH, 0.0)),
            Act::Elu => Some((M::CUDNN_ACTIVATION_ELU, 1.0)),
            Act::ClippedRelu => Some((M::CUDNN_ACTIVATION_CLIPPED_RELU, CLIP_CEILING)),
            // The swish beta is set separately (cudnnSetActivationDescriptorSwishBeta).
            Act::Swish => Some((M::CUDNN_ACTIVATION_SWISH, 1.0)),
            Act::Gelu | Act::Softplus | Act::LeakyRelu => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    /// y = f(x)
    Fwd(Act),
    /// dx = f'(x) * dy
    Bwd(Act),
    /// c += bias (1xCx1x1 broadcast)
    AddBias,
    /// c += a (same shape)
    AddSame,
    /// c = a + b
    TensorAdd,
    /// c = a * b
    TensorMul,
    /// `y = SCALE_ALPHA * y`, in place
    Scale,
    /// `y = SET_VALUE`
    Set,
    /// NCHW -> NHWC, same dtype
    ToNhwc,
    /// f32 -> f16, same layout
    ToF16,
    /// per-channel sum (over N, H, W), scaled by 1/(N*H*W) so f16 cannot overflow
    SumPerChannel,
    /// max over W
    MaxLastDim,
}

const OPS: [Op; 21] = [
    Op::Fwd(Act::Relu),
    Op::Fwd(Act::Sigmoid),
    Op::Fwd(Act::Tanh),
    Op::Fwd(Act::Elu),
    Op::Fwd(Act::ClippedRelu),
    Op::Fwd(Act::Swish),
    Op::Fwd(Act::Gelu),
    Op::Fwd(Act::Softplus),
    Op::Fwd(Act::LeakyRelu),
    Op::Bwd(Act::Relu),
    Op::Bwd(Act::Sigmoid),
    Op::AddBias,
    Op::AddSame,
    Op::TensorAdd,
    Op::TensorMul,
    Op::Scale,
    Op::Set,
    Op::ToNhwc,
    Op::ToF16,
    Op::SumPerChannel,
    Op::MaxLastDim,
];

/// The rows of `OXIDNN_BENCH_QUICK=1` (on `QUICK_SHAPE`, both dtypes).
const QUICK_OPS: [Op; 7] = [
    Op::Fwd(Act::Relu),
    Op::Bwd(Act::Sigmoid),
    Op::AddBias,
    Op::TensorMul,
    Op::ToNhwc,
    Op::ToF16,
    Op::SumPerChannel,
];
const QUICK_SHAPE: [usize; 4] = [32, 256, 56, 56];

/// Where an op writes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Slot {
    Out,
    Small,
}

impl Op {
    fn name(self) -> String {
        match self {
            Op::Fwd(a) => format!("act_fwd.{}", a.name()),
            Op::Bwd(a) => format!("act_bwd.{}", a.name()),
            Op::AddBias => "add_tensor.bias".into(),
            Op::AddSame => "add_tensor.same".into(),
            Op::TensorAdd => "op_tensor.add".into(),
            Op::TensorMul => "op_tensor.mul".into(),
            Op::Scale => "scale_tensor".into(),
            Op::Set => "set_tensor".into(),
            Op::ToNhwc => "transform.to_nhwc".into(),
            Op::ToF16 => "transform.to_f16".into(),
            Op::SumPerChannel => "reduce.sum_per_c".into(),
            Op::MaxLastDim => "reduce.max_last".into(),
        }
    }

    /// The group the summary's geomean is taken over.
    fn family(self) -> &'static str {
        match self {
            Op::Fwd(_) => "act_fwd",
            Op::Bwd(_) => "act_bwd",
            Op::AddBias | Op::AddSame => "add_tensor",
            Op::TensorAdd | Op::TensorMul => "op_tensor",
            Op::Scale => "scale_tensor",
            Op::Set => "set_tensor",
            Op::ToNhwc | Op::ToF16 => "transform",
            Op::SumPerChannel | Op::MaxLastDim => "reduce",
        }
    }

    fn applies_to(self, dtype: DataType) -> bool {
        self != Op::ToF16 || dtype == DataType::F32
    }

    fn dtype_label(self, dtype: DataType) -> String {
        match self {
            Op::ToF16 => format!("{dtype}->f16"),
            _ => dtype.to_string(),
        }
    }

    /// Where the result lands and how it is laid out.
    fn output(self, p: &Problem) -> (Slot, TensorDescriptor) {
        match self {
            Op::ToNhwc => (Slot::Out, p.nhwc),
            Op::ToF16 => (Slot::Out, p.half),
            Op::SumPerChannel => (Slot::Small, p.channel),
            Op::MaxLastDim => (Slot::Small, p.last_reduced),
            _ => (Slot::Out, p.x),
        }
    }

    /// Minimum bytes the op must move: each input read once, each output written once.
    /// `add_tensor` accumulates (beta = 1, its defining use), so it also reads `c`; every
    /// other op runs with beta = 0. Activation backward needs dy and x (or y), not both.
    fn bytes_moved(self, p: &Problem) -> u64 {
        let tensor = p.x.size_bytes() as u64;
        match self {
            Op::Fwd(_) | Op::Scale | Op::ToNhwc => 2 * tensor,
            Op::Set => tensor,
            Op::Bwd(_) | Op::AddSame | Op::TensorAdd | Op::TensorMul => 3 * tensor,
            Op::AddBias => 2 * tensor + p.channel.size_bytes() as u64,
            Op::ToF16 => tensor + p.half.size_bytes() as u64,
            Op::SumPerChannel => tensor + p.channel.size_bytes() as u64,
            Op::MaxLastDim => tensor + p.last_reduced.size_bytes() as u64,
        }
    }

    fn reduction(self) -> Option<ReduceOp> {
        match self {
            Op::SumPerChannel => Some(ReduceOp::Add),
            Op::MaxLastDim => Some(ReduceOp::Max),
            _ => None,
        }
    }

    /// The reduction's alpha.
    fn alpha(self, p: &Problem) -> f64 {
        if self == Op::SumPerChannel {
            p.mean_alpha
        } else {
            1.0
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
    dims: [usize; 4],
    dtype: DataType,
    /// NCHW input and (for most ops) output.
    x: TensorDescriptor,
    /// 1xCx1x1: the bias, and the per-channel reduction's output.
    channel: TensorDescriptor,
    /// x's dims stored NHWC.
    nhwc: TensorDescriptor,
    /// x as f16.
    half: TensorDescriptor,
    /// `NxCxHx1`: the max-over-W output.
    last_reduced: TensorDescriptor,
    /// 1 / (N*H*W): makes the per-channel sum a mean.
    mean_alpha: f64,
}

impl Problem {
    fn new(dtype: DataType, dims: [usize; 4]) -> oxidnn::Result<Self> {
        let [n, c, h, w] = dims;
        Ok(Self {
            dims,
            dtype,
            x: TensorDescriptor::nchw(dtype, n, c, h, w)?,
            channel: TensorDescriptor::nchw(dtype, 1, c, 1, 1)?,
            nhwc: TensorDescriptor::nhwc(dtype, n, c, h, w)?,
            half: TensorDescriptor::nchw(DataType::F16, n, c, h, w)?,
            last_reduced: TensorDescriptor::nchw(dtype, n, c, h, 1)?,
            mean_alpha: 1.0 / (n * h * w) as f64,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// Device addresses of a set's buffers, for cuDNN.
#[derive(Clone, Copy)]
struct Addrs {
    x: u64,
    x2: u64,
    aux: u64,
    out: u64,
    small: u64,
    bias: u64,
}

/// One set of buffers for a problem. Invariant (checked in `alloc`): `x`, `x2`, `aux` and
/// `out` hold `p.x`'s span (which covers `p.nhwc` and `p.half` too), `small` holds
/// `p.channel`'s and `p.last_reduced`'s, `bias` holds `p.channel`'s.
struct Set {
    /// Input a / x (random).
    x: Buffer,
    /// Input b / dy (random).
    x2: Buffer,
    /// The forward output y for activation backward.
    aux: Buffer,
    /// Full-size output.
    out: Buffer,
    /// Reduction output.
    small: Buffer,
    /// 1xCx1x1 bias (random).
    bias: Buffer,
    addr: Addrs,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem) -> Res<Self> {
        let full = p.x.size_bytes();
        let small = p.channel.size_bytes().max(p.last_reduced.size_bytes());
        assert!(full >= p.nhwc.size_bytes() && full >= p.half.size_bytes());
        let alloc = |bytes: usize| h.alloc_bytes(bytes).context("allocating a buffer");
        let (x, x2, aux, out) = (alloc(full)?, alloc(full)?, alloc(full)?, alloc(full)?);
        let (small, bias) = (alloc(small)?, alloc(p.channel.size_bytes())?);
        let addr = Addrs {
            x: device_address(&x)?,
            x2: device_address(&x2)?,
            aux: device_address(&aux)?,
            out: device_address(&out)?,
            small: device_address(&small)?,
            bias: device_address(&bias)?,
        };
        Ok(Self {
            x,
            x2,
            aux,
            out,
            small,
            bias,
            addr,
        })
    }

    fn bytes(&self) -> usize {
        [
            &self.x,
            &self.x2,
            &self.aux,
            &self.out,
            &self.small,
            &self.bias,
        ]
        .iter()
        .map(|b| b.len_bytes())
        .sum()
    }

    fn slot(&self, slot: Slot) -> &Buffer {
        match slot {
            Slot::Out => &self.out,
            Slot::Small => &self.small,
        }
    }

    fn slot_mut(&mut self, slot: Slot) -> &mut Buffer {
        match slot {
            Slot::Out => &mut self.out,
            Slot::Small => &mut self.small,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Host data
// ---------------------------------------------------------------------------------------

fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 | DataType::F64 => 1e-5,
        DataType::F16 | DataType::BF16 => 1e-2,
    }
}

// ---------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// cuDNN
// ---------------------------------------------------------------------------------------

/// cuDNN's descriptors of a [`Problem`].
struct CudnnProblem {
    x: TensorDesc,
    channel: TensorDesc,
    nhwc: TensorDesc,
    half: TensorDesc,
    last_reduced: TensorDesc,
}

impl CudnnProblem {
    fn new(p: &Problem) -> Res<Self> {
        Ok(Self {
            x: TensorDesc::new(&p.x)?,
            channel: TensorDesc::new(&p.channel)?,
            nhwc: TensorDesc::new(&p.nhwc)?,
            half: TensorDesc::new(&p.half)?,
            last_reduced: TensorDesc::new(&p.last_reduced)?,
        })
    }

    fn output(&self, op: Op) -> &TensorDesc {
        match op {
            Op::ToNhwc => &self.nhwc,
            Op::ToF16 => &self.half,
            Op::SumPerChannel => &self.channel,
            Op::MaxLastDim => &self.last_reduced,
            _ => &self.x,
        }
    }
}

/// What cuDNN needs for one op beyond the tensor descriptors.
enum CudnnPlan {
    Activation(ActDesc),
    OpTensor(OpDesc),
    Reduce {
        desc: ReduceDesc,
        workspace: Buffer,
    },
    /// add, scale, set and transform take only tensor descriptors.
    Plain,
}

/// cuDNN's plan for `op`, or `None` if cuDNN has no such op.
fn cudnn_plan(cu: &Cudnn, h: &Handle, d: &CudnnProblem, op: Op) -> Res<Option<CudnnPlan>> {
    use cudnn_sys::cudnnNanPropagation_t::{CUDNN_NOT_PROPAGATE_NAN, CUDNN_PROPAGATE_NAN};
    Ok(Some(match op {
        Op::Fwd(a) | Op::Bwd(a) => {
            let Some((mode, coef)) = a.cudnn() else {
                return Ok(None);
            };
            let desc = ActDesc::create()?;
            // SAFETY: `desc` is live.
            let status = unsafe {
                cudnn_sys::cudnnSetActivationDescriptor(desc.0, mode, CUDNN_NOT_PROPAGATE_NAN, coef)
            };
            cudnn_check(status, "cudnnSetActivationDescriptor")?;
            if a == Act::Swish {
                // SAFETY: `desc` is live.
                let status =
                    unsafe { cudnn_sys::cudnnSetActivationDescriptorSwishBeta(desc.0, coef) };
                cudnn_check(status, "cudnnSetActivationDescriptorSwishBeta")?;
            }
            CudnnPlan::Activation(desc)
        }
        Op::TensorAdd | Op::TensorMul => {
            use cudnn_sys::cudnnOpTensorOp_t::{CUDNN_OP_TENSOR_ADD, CUDNN_OP_TENSOR_MUL};
            let kind = if op == Op::TensorAdd {
                CUDNN_OP_TENSOR_ADD
            } else {
                CUDNN_OP_TENSOR_MUL
            };
            let desc = OpDesc::create()?;
            // SAFETY: `desc` is live. Compute type float, as oxidnn computes (f16 data too).
            let status = unsafe {
                cudnn_sys::cudnnSetOpTensorDescriptor(
                    desc.0,
                    kind,
                    cudnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                    CUDNN_NOT_PROPAGATE_NAN,
                )
            };
            cudnn_check(status, "cudnnSetOpTensorDescriptor")?;
            CudnnPlan::OpTensor(desc)
        }
        Op::SumPerChannel | Op::MaxLastDim => {
            use cudnn_sys::cudnnReduceTensorOp_t::{
                CUDNN_REDUCE_TENSOR_ADD, CUDNN_REDUCE_TENSOR_MAX,
            };
            let kind = if op == Op::SumPerChannel {
                CUDNN_REDUCE_TENSOR_ADD
            } else {
                CUDNN_REDUCE_TENSOR_MAX
            };
            let desc = ReduceDesc::create()?;
            // SAFETY: `desc` is live. Float compute, NaN propagated, no indices: oxidnn's
            // reduce_tensor semantics, called without indices.
            let status = unsafe {
                cudnn_sys::cudnnSetReduceTensorDescriptor(
                    desc.0,
                    kind,
                    cudnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                    CUDNN_PROPAGATE_NAN,
                    cudnn_sys::cudnnReduceTensorIndices_t::CUDNN_REDUCE_TENSOR_NO_INDICES,
                    cudnn_sys::cudnnIndicesType_t::CUDNN_32BIT_INDICES,
                )
            };
            cudnn_check(status, "cudnnSetReduceTensorDescriptor")?;
            let mut bytes = 0usize;
            // SAFETY: every descriptor is live; `bytes` is a valid out-pointer.
            let status = unsafe {
                cudnn_sys::cudnnGetReductionWorkspaceSize(
                    cu.handle.0,
                    desc.0,
                    d.x.0,
                    d.output(op).0,
                    &mut bytes,
                )
            };
            cudnn_check(status, "cudnnGetReductionWorkspaceSize")?;
            let workspace = h
                .alloc_bytes(bytes)
                .context("allocating cuDNN's reduction workspace")?;
            CudnnPlan::Reduce { desc, workspace }
        }
        Op::AddBias | Op::AddSame | Op::Scale | Op::Set | Op::ToNhwc | Op::ToF16 => {
            CudnnPlan::Plain
        }
    }))
}

/// A host scalar for cuDNN, aligned for any element type.
#[repr(C, align(8))]
struct Scalar([u8; 8]);

impl Scalar {
    /// alpha / beta: float for f32 and f16 data (cuDNN's rule for non-double tensors).
    fn f32(v: f64) -> Self {
        let mut s = Scalar([0; 8]);
        s.0[..4].copy_from_slice(&(v as f32).to_ne_bytes());
        s
    }

    /// cudnnSetTensor's fill value for a `dtype` tensor: double for double tensors, else
    /// float. (Half bits are read as a float too: cuDNN 9.14 filled zeros when given them.)
    fn fill_value(dtype: DataType, v: f64) -> Self {
        if dtype == DataType::F64 {
            Scalar(v.to_ne_bytes())
        } else {
            Scalar::f32(v)
        }
    }

    fn ptr(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// Runs `op` through cuDNN on `set`'s buffers.
///
/// Invariant behind every unsafe call below: the descriptors in `d` and `plan` are live
/// and describe `p`; the addresses are `set`'s live buffers, which hold the spans of those
/// descriptors (`Set::alloc`); cuDNN issues on the oxidnn handle's stream, the only stream
/// that touches these buffers; the scalars live on the host for the whole call.
fn run_cudnn(
    cu: &Cudnn,
    d: &CudnnProblem,
    plan: &CudnnPlan,
    op: Op,
    p: &Problem,
    set: &mut Set,
) -> Res<()> {
    let h = cu.handle.0;
    let a = set.addr;
    let (one, zero) = (Scalar::f32(1.0), Scalar::f32(0.0));
    let status = match (op, plan) {
        (Op::Fwd(_), CudnnPlan::Activation(act)) => {
            // SAFETY: see the invariant above; y = f(x).
            unsafe {
                cudnn_sys::cudnnActivationForward(
                    h,
                    act.0,
                    one.ptr(),
                    d.x.0,
                    dev(a.x),
                    zero.ptr(),
                    d.x.0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::Bwd(_), CudnnPlan::Activation(act)) => {
            // SAFETY: see the invariant above; y = aux, dy = x2, x = x, dx = out.
            unsafe {
                cudnn_sys::cudnnActivationBackward(
                    h,
                    act.0,
                    one.ptr(),
                    d.x.0,
                    dev(a.aux),
                    d.x.0,
                    dev(a.x2),
                    d.x.0,
                    dev(a.x),
                    zero.ptr(),
                    d.x.0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::AddBias, CudnnPlan::Plain) => {
            // SAFETY: see the invariant above; out += bias.
            unsafe {
                cudnn_sys::cudnnAddTensor(
                    h,
                    one.ptr(),
                    d.channel.0,
                    dev(a.bias),
                    one.ptr(),
                    d.x.0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::AddSame, CudnnPlan::Plain) => {
            // SAFETY: see the invariant above; out += x.
            unsafe {
                cudnn_sys::cudnnAddTensor(
                    h,
                    one.ptr(),
                    d.x.0,
                    dev(a.x),
                    one.ptr(),
                    d.x.0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::TensorAdd | Op::TensorMul, CudnnPlan::OpTensor(desc)) => {
            // SAFETY: see the invariant above; out = x op x2.
            unsafe {
                cudnn_sys::cudnnOpTensor(
                    h,
                    desc.0,
                    one.ptr(),
                    d.x.0,
                    dev(a.x),
                    one.ptr(),
                    d.x.0,
                    dev(a.x2),
                    zero.ptr(),
                    d.x.0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::Scale, CudnnPlan::Plain) => {
            let alpha = Scalar::f32(SCALE_ALPHA);
            // SAFETY: see the invariant above; out *= alpha in place.
            unsafe { cudnn_sys::cudnnScaleTensor(h, d.x.0, dev_mut(a.out), alpha.ptr()) }
        }
        (Op::Set, CudnnPlan::Plain) => {
            let value = Scalar::fill_value(p.dtype, SET_VALUE);
            // SAFETY: see the invariant above; `value` is a host scalar of the type cuDNN reads.
            unsafe { cudnn_sys::cudnnSetTensor(h, d.x.0, dev_mut(a.out), value.ptr()) }
        }
        (Op::ToNhwc | Op::ToF16, CudnnPlan::Plain) => {
            // SAFETY: see the invariant above; out (NHWC, or f16) = x.
            unsafe {
                cudnn_sys::cudnnTransformTensor(
                    h,
                    one.ptr(),
                    d.x.0,
                    dev(a.x),
                    zero.ptr(),
                    d.output(op).0,
                    dev_mut(a.out),
                )
            }
        }
        (Op::SumPerChannel | Op::MaxLastDim, CudnnPlan::Reduce { desc, workspace }) => {
            let alpha = Scalar::f32(op.alpha(p));
            let ws = device_address(workspace)?;
            // SAFETY: see the invariant above; small = alpha * reduce(x); the workspace
            // holds the size cuDNN asked for; no indices are requested.
            unsafe {
                cudnn_sys::cudnnReduceTensor(
                    h,
                    desc.0,
                    std::ptr::null_mut(),
                    0,
                    dev_mut(ws),
                    workspace.len_bytes(),
                    alpha.ptr(),
                    d.x.0,
                    dev(a.x),
                    zero.ptr(),
                    d.output(op).0,
                    dev_mut(a.small),
                )
            }
        }
        _ => return Err(format!("internal: no cuDNN call for {op:?} with this plan")),
    };
    cudnn_check(status, &op.name())
}

// ---------------------------------------------------------------------------------------
// oxidnn
// ---------------------------------------------------------------------------------------

/// What oxidnn needs for one op beyond the problem.
struct OxidnnPlan {
    act: Option<ActivationDescriptor>,
    reduce: Option<ReduceTensorDescriptor>,
    workspace: Buffer,
}

fn oxidnn_plan(h: &Handle, p: &Problem, op: Op) -> oxidnn::Result<OxidnnPlan> {
    let act = match op {
        Op::Fwd(a) | Op::Bwd(a) => Some(a.oxidnn()?),
        _ => None,
    };
    let reduce = op.reduction().map(ReduceTensorDescriptor::new);
    let ws_bytes = match &reduce {
        Some(r) => reduce_tensor_workspace_size(h, r, &p.x, &op.output(p).1)?,
        None => 0,
    };
    Ok(OxidnnPlan {
        act,
        reduce,
        workspace: h.alloc_bytes(ws_bytes)?,
    })
}

/// Runs `op` through oxidnn on `set`'s buffers (the same calls `run_cudnn` makes).
fn run_oxidnn(
    h: &Handle,
    plan: &mut OxidnnPlan,
    op: Op,
    p: &Problem,
    set: &mut Set,
) -> oxidnn::Result<()> {
    let x = &p.x;
    let missing = || oxidnn::Error::NotSupported {
        message: "internal: plan lacks a descriptor".into(),
    };
    match op {
        Op::Fwd(_) => {
            let act = plan.act.as_ref().ok_or_else(missing)?;
            activation_forward(h, act, 1.0, x, &set.x, 0.0, x, &mut set.out)
        }
        Op::Bwd(_) => {
            let act = plan.act.as_ref().ok_or_else(missing)?;
            activation_backward(
                h,
                act,
                1.0,
                x,
                &set.aux,
                x,
                &set.x2,
                x,
                &set.x,
                0.0,
                x,
                &mut set.out,
            )
        }
        Op::AddBias => add_tensor(h, 1.0, &p.channel, &set.bias, 1.0, x, &mut set.out),
        Op::AddSame => add_tensor(h, 1.0, x, &set.x, 1.0, x, &mut set.out),
        Op::TensorAdd | Op::TensorMul => {
            let kind = if op == Op::TensorAdd {
                OpTensorOp::Add
            } else {
                OpTensorOp::Mul
            };
            op_tensor(
                h,
                kind,
                1.0,
                x,
                &set.x,
                1.0,
                x,
                &set.x2,
                0.0,
                x,
                &mut set.out,
            )
        }
        Op::Scale => scale_tensor(h, x, &mut set.out, SCALE_ALPHA),
        Op::Set => set_tensor(h, x, &mut set.out, SET_VALUE),
        Op::ToNhwc => transform_tensor(h, 1.0, x, &set.x, 0.0, &p.nhwc, &mut set.out),
        Op::ToF16 => transform_tensor(h, 1.0, x, &set.x, 0.0, &p.half, &mut set.out),
        Op::SumPerChannel | Op::MaxLastDim => {
            let red = plan.reduce.as_ref().ok_or_else(missing)?;
            let y = op.output(p).1;
            reduce_tensor(
                h,
                red,
                None,
                &mut plan.workspace,
                op.alpha(p),
                x,
                &set.x,
                0.0,
                &y,
                &mut set.small,
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
}

/// The buffers of one shape and dtype: `sets` rotate so that small problems miss L2.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    /// cuDNN's descriptors, or why there are none.
    cudnn: Result<CudnnProblem, String>,
}

impl Group {
    fn new(b: &Bench, dtype: DataType, dims: [usize; 4]) -> Res<Self> {
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
        let x = random(elements, seed);
        let x2 = random(elements, seed ^ 0x5555);
        let bias = random(p.channel.element_count(), seed ^ 0xAAAA);
        for set in &mut sets {
            b.handle
                .write_bytes(&mut set.x, &x)
                .context("uploading x")?;
            b.handle
                .write_bytes(&mut set.x2, &x2)
                .context("uploading x2")?;
            b.handle
                .write_bytes(&mut set.bias, &bias)
                .context("uploading the bias")?;
        }
        let cudnn = match &b.cudnn {
            Some(_) => CudnnProblem::new(&p),
            None => Err("cuDNN not loaded".into()),
        };
        Ok(Self { p, sets, cudnn })
    }
}

/// A library's time for one row.
enum Timing {
    Us(f64),
    /// The library has no such op, or could not run it (reason in the row's notes).
    Missing,
}

struct Row {
    op: Op,
    dtype: String,
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

/// Resets what `op` reads or accumulates into, and poisons what it overwrites.
fn prepare(b: &Bench, op: Op, p: &Problem, set: &mut Set, ox: &OxidnnPlan) -> Res<()> {
    let s = &b.stream;
    let bytes = p.x.size_bytes();
    match op {
        Op::AddBias | Op::AddSame => copy_async(s, &mut set.out, &set.x2, bytes),
        Op::Scale => copy_async(s, &mut set.out, &set.x, bytes),
        Op::Bwd(_) => {
            let act = ox.act.as_ref().ok_or("internal: no activation")?;
            activation_forward(&b.handle, act, 1.0, &p.x, &set.x, 0.0, &p.x, &mut set.aux)
                .context("computing y for backward")?;
            poison_async(s, &mut set.out)
        }
        _ => poison_async(s, set.slot_mut(op.output(p).0)),
    }
}

/// The output of one run on set 0, as bytes.
fn output_bytes(b: &Bench, op: Op, p: &Problem, set: &Set) -> Res<Vec<u8>> {
    let (slot, desc) = op.output(p);
    let mut bytes = b
        .handle
        .read_bytes(set.slot(slot))
        .context("reading the output")?;
    bytes.truncate(desc.size_bytes());
    Ok(bytes)
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

fn run_case(b: &Bench, g: &mut Group, op: Op) -> Row {
    let p = &g.p;
    let mut row = Row {
        op,
        dtype: op.dtype_label(p.dtype),
        shape: shape_string(&p.dims),
        bytes: op.bytes_moved(p),
        oxidnn: Timing::Missing,
        cudnn: Timing::Missing,
        check: Check::Error,
        notes: vec![],
    };
    let mut ox = match oxidnn_plan(&b.handle, p, op) {
        Ok(plan) => plan,
        Err(e) => {
            row.notes.push(format!("oxidnn: {e}"));
            return row;
        }
    };
    let cu = match (&b.cudnn, &g.cudnn) {
        (Some(cu), Ok(d)) => match cudnn_plan(cu, &b.handle, d, op) {
            Ok(Some(plan)) => Some((cu, d, plan)),
            Ok(None) => None,
            Err(e) => {
                row.notes.push(format!("cuDNN: {e}"));
                None
            }
        },
        (Some(_), Err(e)) => {
            row.notes.push(format!("cuDNN: {e}"));
            None
        }
        (None, _) => None,
    };

    // Check: one run of each library on set 0, from the same starting state.
    let set0 = &mut g.sets[0];
    let ox_out = prepare(b, op, p, set0, &ox)
        .and_then(|()| run_oxidnn(&b.handle, &mut ox, op, p, set0).context("oxidnn"))
        .and_then(|()| output_bytes(b, op, p, set0));
    let cu_out = cu.as_ref().map(|(cu, d, plan)| {
        prepare(b, op, p, set0, &ox)
            .and_then(|()| run_cudnn(cu, d, plan, op, p, set0).context("cuDNN"))
            .and_then(|()| output_bytes(b, op, p, set0))
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
    let dtype = op.output(p).1.dtype();
    row.check = Check::compare(&ox_out, cu_out.as_ref(), dtype, tolerance(dtype));
    if sides.is_empty() {
        return row;
    }

    // Time: both libraries alternate call by call, each call on the next buffer set.
    let timed = g
        .sets
        .iter_mut()
        .try_for_each(|set| prepare(b, op, p, set, &ox))
        .and_then(|()| {
            let count = g.sets.len();
            b.timer
                .measure(sides.len(), WARMUP, RUNS, |side, invocation| {
                    let set = &mut g.sets[invocation % count];
                    match (sides[side], &cu) {
                        (Side::Oxidnn, _) => {
                            run_oxidnn(&b.handle, &mut ox, op, p, set).context("oxidnn")
                        }
                        (Side::Cudnn, Some((cu, d, plan))) => run_cudnn(cu, d, plan, op, p, set),
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
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str =
    "op,dtype,shape,bytes_moved,oxidnn_us,oxidnn_gbps,pct_copy_bw,cudnn_us,cudnn_gbps,ratio_cudnn_over_oxidnn,check,rel_err";

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
    copy_gbps: f64,
}

impl Report {
    fn new(copy_gbps: f64) -> Self {
        let csv = open_csv("vs_cudnn", "bench-results.csv", CSV_HEADER);
        Self {
            rows: vec![],
            csv,
            copy_gbps,
        }
    }

    fn print_header(&self) {
        println!(
            "{:<20} {:<8} {:<15} {:>9} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  check",
            "op",
            "dtype",
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
            "{:<20} {:<8} {:<15} {:>9.1} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  {check} {err_text}",
            row.op.name(),
            row.dtype,
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
                row.op.name(),
                row.dtype,
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
                eprintln!("vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: geometric mean of cuDNN time / oxidnn time (> 1: oxidnn faster), rows that passed the check");
        let mut families: Vec<&str> = vec![];
        for row in &self.rows {
            if !families.contains(&row.op.family()) {
                families.push(row.op.family());
            }
        }
        let ratios = |family: Option<&str>| -> Vec<f64> {
            self.rows
                .iter()
                .filter(|r| {
                    family.is_none_or(|f| r.op.family() == f) && matches!(r.check, Check::Ok(_))
                })
                .filter_map(Row::ratio)
                .collect()
        };
        let line = |name: &str, v: &[f64]| {
            if v.is_empty() {
                println!("  {name:<14} {:>4} rows   n/a", 0);
            } else {
                let geomean = (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp();
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "  {name:<14} {:>4} rows   geomean {geomean:.3}   (min {min:.2}, max {max:.2})",
                    v.len()
                );
            }
        };
        for family in &families {
            line(family, &ratios(Some(family)));
        }
        line("all", &ratios(None));
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
    fn selects(&self, dims: &[usize; 4], dtype: DataType, op: Op) -> bool {
        if !op.applies_to(dtype) {
            return false;
        }
        if self.quick && (*dims != QUICK_SHAPE || !QUICK_OPS.contains(&op)) {
            return false;
        }
        let key = format!(
            "{} {} {}",
            op.name(),
            op.dtype_label(dtype),
            shape_string(dims)
        );
        self.filter
            .as_ref()
            .is_none_or(|f| key.contains(f.as_str()))
    }
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let Some(gpu) = open_gpu("vs_cudnn")? else {
        return Ok(());
    };
    let (handle, stream, device, l2) = (gpu.handle, gpu.stream, gpu.name, gpu.l2_bytes);
    println!("oxidnn vs cuDNN");
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
