//! Tensor ops: `op_tensor`, `add_tensor`, `scale_tensor`, `set_tensor` and
//! `transform_tensor` (cuDNN semantics; any strides; broadcasting of the second operand).
//!
//! ```
//! use oxidnn::{add_tensor, DataType, Handle, HostTensor, TensorDescriptor};
//! let (handle, _) = Handle::gpu_or_cpu();
//! // Add a per-channel bias to an NCHW tensor.
//! let y_desc = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 4)?;
//! let b_desc = TensorDescriptor::nchw(DataType::F32, 1, 3, 1, 1)?;
//! let bias = handle.upload(&[1.0f32, 2.0, 3.0])?;
//! let mut y = handle.alloc(&y_desc)?; // zeros
//! add_tensor(&handle, 1.0, &b_desc, &bias, 1.0, &y_desc, &mut y)?;
//! let out = handle.download_tensor(&y_desc, &y)?;
//! assert_eq!(out.get(&[1, 2, 3, 3]), 3.0);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::layout::{broadcast_strides, fold};
use super::{host_read, host_write, packed_config, scale_factor, ElementwisePlan};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference;
use oxidnn_params::{
    FastDivisor, PointwiseOp, TensorOpParams, TransformParams, TransposeParams, BLOCK_THREADS,
    TRANSPOSE_TILE,
};

/// The operations of [`op_tensor`] (cuDNN's `cudnnOpTensorOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpTensorOp {
    /// `alpha1 * a + alpha2 * b`
    Add,
    /// `(alpha1 * a) * (alpha2 * b)`
    Mul,
    /// `min(alpha1 * a, alpha2 * b)`
    Min,
    /// `max(alpha1 * a, alpha2 * b)`
    Max,
    /// `sqrt(alpha1 * a)` (b unused)
    Sqrt,
    /// `1 - alpha1 * a` (b unused)
    Not,
}

impl OpTensorOp {
    pub const ALL: [OpTensorOp; 6] = [
        Self::Add,
        Self::Mul,
        Self::Min,
        Self::Max,
        Self::Sqrt,
        Self::Not,
    ];

    pub(crate) fn pointwise(self) -> PointwiseOp {
        match self {
            Self::Add => PointwiseOp::Add,
            Self::Mul => PointwiseOp::Mul,
            Self::Min => PointwiseOp::Min,
            Self::Max => PointwiseOp::Max,
            Self::Sqrt => PointwiseOp::Sqrt,
            Self::Not => PointwiseOp::Not,
        }
    }

    /// Whether the op reads its second operand.
    pub fn is_binary(self) -> bool {
        self.pointwise().reads_b()
    }
}

/// `c = op(alpha1 * a, alpha2 * b) + beta * c`. `a` has `c`'s dims; `b` has `c`'s dims or 1
/// in any dim (broadcast); all three share one dtype. Unary ops ignore `b` (any descriptor
/// and buffer are accepted there, as in cuDNN). With `beta == 0`, `c` is not read.
#[allow(clippy::too_many_arguments)]
pub fn op_tensor(
    handle: &Handle,
    op: OpTensorOp,
    alpha1: f64,
    a_desc: &TensorDescriptor,
    a: &Buffer,
    alpha2: f64,
    b_desc: &TensorDescriptor,
    b: &Buffer,
    beta: f64,
    c_desc: &TensorDescriptor,
    c: &mut Buffer,
) -> Result<()> {
    check_same_dims("a_desc", c_desc, a_desc)?;
    check_same_dtype("a_desc", c_desc, a_desc)?;
    check_output("c_desc", c_desc)?;
    handle.check_tensor("a", a_desc, a)?;
    handle.check_tensor("c", c_desc, c)?;
    let b_strides = if op.is_binary() {
        check_same_dtype("b_desc", c_desc, b_desc)?;
        handle.check_tensor("b", b_desc, b)?;
        broadcast_strides("b_desc", b_desc, c_desc)?
    } else {
        c_desc.strides().to_vec()
    };
    let scalars = [
        scale_factor("alpha1", alpha1)?,
        scale_factor("alpha2", alpha2)?,
        scale_factor("beta", beta)?,
    ];
    match &handle.backend {
        Backend::Cpu => {
            let at = host_read(a_desc, a)?;
            let bt = if op.is_binary() {
                Some(host_read(b_desc, b)?)
            } else {
                None
            };
            let mut ct = host_read(c_desc, c)?;
            reference::tensor_ops::op_tensor(op, alpha1, &at, alpha2, bt.as_ref(), beta, &mut ct);
            host_write(&ct, c)
        }
        Backend::Gpu(gpu) => {
            let ptrs = [
                device_ptr(gpu, a)?,
                device_ptr(gpu, b)?,
                device_ptr_mut(gpu, c)?,
            ];
            let strides = [a_desc.strides(), &b_strides[..], c_desc.strides()];
            // SAFETY: a and c hold their spans; b's broadcast strides stay inside its span.
            unsafe { launch_tensor_op(gpu, op.pointwise(), scalars, c_desc, strides, ptrs) }
        }
    }
}

/// `c = alpha * a + beta * c`, `a` broadcast to `c` (each dim of `a` equal to `c`'s or 1),
/// as cudnnAddTensor; e.g. adding a `1xCx1x1` bias.
pub fn add_tensor(
    handle: &Handle,
    alpha: f64,
    a_desc: &TensorDescriptor,
    a: &Buffer,
    beta: f64,
    c_desc: &TensorDescriptor,
    c: &mut Buffer,
) -> Result<()> {
    check_same_dtype("a_desc", c_desc, a_desc)?;
    check_output("c_desc", c_desc)?;
    let a_strides = broadcast_strides("a_desc", a_desc, c_desc)?;
    handle.check_tensor("a", a_desc, a)?;
    handle.check_tensor("c", c_desc, c)?;
    let scalars = [
        scale_factor("alpha", alpha)?,
        0.0,
        scale_factor("beta", beta)?,
    ];
    match &handle.backend {
        Backend::Cpu => {
            let at = host_read(a_desc, a)?;
            let mut ct = host_read(c_desc, c)?;
            reference::tensor_ops::add_tensor(alpha, &at, beta, &mut ct);
            host_write(&ct, c)
        }
        Backend::Gpu(gpu) => {
            let ptrs = [device_ptr(gpu, a)?, 0, device_ptr_mut(gpu, c)?];
            let strides = [&a_strides[..], c_desc.strides(), c_desc.strides()];
            // SAFETY: as in `op_tensor`; b is not read by CopyA.
            unsafe { launch_tensor_op(gpu, PointwiseOp::CopyA, scalars, c_desc, strides, ptrs) }
        }
    }
}

/// `y = alpha * y` (cudnnScaleTensor).
pub fn scale_tensor(
    handle: &Handle,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    alpha: f64,
) -> Result<()> {
    check_output("y_desc", y_desc)?;
    handle.check_tensor("y", y_desc, y)?;
    let scalars = [scale_factor("alpha", alpha)?, 0.0, 0.0];
    match &handle.backend {
        Backend::Cpu => {
            let mut yt = host_read(y_desc, y)?;
            reference::tensor_ops::scale_tensor(&mut yt, alpha);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let p = device_ptr_mut(gpu, y)?;
            let s = y_desc.strides();
            // SAFETY: y holds its span; each element is read and written by one thread.
            unsafe {
                launch_tensor_op(
                    gpu,
                    PointwiseOp::CopyA,
                    scalars,
                    y_desc,
                    [s, s, s],
                    [p, 0, p],
                )
            }
        }
    }
}

/// Sets every element of `y` to `value` (cudnnSetTensor); gaps between strided elements
/// are left alone.
pub fn set_tensor(
    handle: &Handle,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    value: f64,
) -> Result<()> {
    check_output("y_desc", y_desc)?;
    handle.check_tensor("y", y_desc, y)?;
    let v = scale_factor("value", value)?;
    match &handle.backend {
        Backend::Cpu => {
            let mut yt = host_read(y_desc, y)?;
            reference::tensor_ops::set_tensor(&mut yt, value);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let p = device_ptr_mut(gpu, y)?;
            let s = y_desc.strides();
            // SAFETY: y holds its span; Fill reads nothing.
            unsafe {
                launch_tensor_op(
                    gpu,
                    PointwiseOp::Fill,
                    [v, 0.0, 0.0],
                    y_desc,
                    [s, s, s],
                    [0, 0, p],
                )
            }
        }
    }
}

/// Folds, picks the packed or strided `tensor_op` kernel and launches it.
///
/// # Safety
/// `ptrs` = `[a, b, c]` device addresses valid for every offset `strides` produce over
/// `c_desc`'s dims, for the operands `op` reads; c's strides do not overlap.
unsafe fn launch_tensor_op(
    gpu: &Gpu,
    op: PointwiseOp,
    [alpha1, alpha2, beta]: [f32; 3],
    c_desc: &TensorDescriptor,
    strides: [&[usize]; 3],
    ptrs: [u64; 3],
) -> Result<()> {
    let dtype = c_desc.dtype();
    let what = || format!("tensor ops on {dtype} tensors on the GPU");
    let folded = fold(c_desc.dims(), strides, 2);
    let len = folded.len() as u64;
    let mut p = TensorOpParams {
        op: op as u32,
        alpha1,
        alpha2,
        beta,
        len,
        ..Default::default()
    };
    if let (false, Some(operand)) = (folded.is_packed(), broadcast_operand(&folded)) {
        // One operand broadcast (e.g. a bias): packed kernel with an offset per vector.
        let last = |v: &[usize], empty: usize| v.last().copied().unwrap_or(empty);
        p.broadcast = operand;
        p.broadcast_inner_stride = last(&folded.strides[operand as usize], 0) as u64;
        p.broadcast_inner_len = FastDivisor::new(last(&folded.dims, 1) as u32);
        p.map = folded.index_map()?;
        let kernel =
            kernels::tensor_op_broadcast(dtype).ok_or_else(|| Error::unsupported(what()))?;
        return gpu.launch(kernel, packed_config(len, dtype.size_bytes())?, &p, &ptrs);
    }
    let plan = ElementwisePlan::new(&folded, dtype.size_bytes(), gpu.sm_count)?;
    let kernel = plan.kernel(
        kernels::tensor_op_packed(dtype),
        kernels::tensor_op_strided(dtype),
        what,
    )?;
    p.map = plan.map.unwrap_or_default();
    gpu.launch(kernel, plan.cfg, &p, &ptrs)
}

/// The input (0 = a, 1 = b) that alone is not laid out like a dense, row-major `c`, when
/// the broadcast kernel can take the problem (the other input matches `c`).
fn broadcast_operand(f: &super::layout::Folded<3>) -> Option<u32> {
    let mut dense = vec![0usize; f.dims.len()];
    let mut s = 1;
    for d in (0..f.dims.len()).rev() {
        dense[d] = s;
        s *= f.dims[d];
    }
    if f.strides[2] != dense {
        return None;
    }
    match (f.strides[0] == dense, f.strides[1] == dense) {
        (true, false) => Some(1),
        (false, true) => Some(0),
        _ => None,
    }
}

/// `y = alpha * x + beta * y` between any two layouts of the same dims, converting the
/// element type (cudnnTransformTensor; e.g. NCHW f32 -> NHWC f16).
pub fn transform_tensor(
    handle: &Handle,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    check_same_dims("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            reference::tensor_ops::transform_tensor(alpha, &xt, beta, &mut yt);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let (xp, yp) = (device_ptr(gpu, x)?, device_ptr_mut(gpu, y)?);
            // SAFETY: both buffers were checked to hold their descriptors' spans.
            unsafe { transform_on_gpu(gpu, alpha32, x_desc, xp, beta32, y_desc, yp) }
        }
    }
}

/// [`transform_tensor`]'s GPU work on device addresses (for ops that stage a tensor in
/// their workspace): `y = alpha * x + beta * y` elementwise, dims equal.
///
/// # Safety
/// `x` and `y` are device addresses in `gpu`'s context holding every element their
/// descriptors reach; y's elements are distinct.
pub(crate) unsafe fn transform_on_gpu(
    gpu: &Gpu,
    alpha32: f32,
    x_desc: &TensorDescriptor,
    x: u64,
    beta32: f32,
    y_desc: &TensorDescriptor,
    y: u64,
) -> Result<()> {
    let (src, dst) = (x_desc.dtype(), y_desc.dtype());
    let unsupported = || Error::unsupported(format!("transform from {src} to {dst} on the GPU"));
    let folded = fold(x_desc.dims(), [x_desc.strides(), y_desc.strides()], 1);
    let ptrs = [x, y];
    if let (false, Some(p)) = (
        folded.is_packed(),
        transpose_plan(&folded, alpha32, beta32)?,
    ) {
        let blocks = p.tiles_a.divisor as u64 * p.tiles_b.divisor as u64 * batch_len(&p) as u64;
        let cfg = LaunchConfig::for_threads(blocks * BLOCK_THREADS as u64, BLOCK_THREADS)?;
        let kernel = kernels::transpose(src, dst).ok_or_else(unsupported)?;
        // SAFETY: the plan's offsets stay inside both spans (same dims, own strides).
        return unsafe { gpu.launch(kernel, cfg, &p, &ptrs) };
    }
    let widest = src.size_bytes().max(dst.size_bytes());
    let plan = ElementwisePlan::new(&folded, widest, gpu.sm_count)?;
    let kernel = plan.kernel(
        kernels::transform_packed(src, dst),
        kernels::transform_strided(src, dst),
        || format!("transform from {src} to {dst} on the GPU"),
    )?;
    let p = TransformParams {
        alpha: alpha32,
        beta: beta32,
        len: folded.len() as u64,
        map: plan.map.unwrap_or_default(),
    };
    // SAFETY: dense operands hold `len` elements; otherwise the folded map's offsets
    // stay inside both spans.
    unsafe { gpu.launch(kernel, plan.cfg, &p, &ptrs) }
}

fn batch_len(p: &TransposeParams) -> usize {
    p.batch.dims[..p.batch.rank as usize]
        .iter()
        .map(|d| d.divisor as usize)
        .product()
}

/// A tiled-transpose plan when y's innermost folded dim (`b`) is not x's unit-stride dim
/// (`a`), and both are long enough for tiles to pay.
fn transpose_plan(
    f: &super::layout::Folded<2>,
    alpha: f32,
    beta: f32,
) -> Result<Option<TransposeParams>> {
    const MIN_EXTENT: usize = 8;
    let Some(b) = f.dims.len().checked_sub(1) else {
        return Ok(None);
    };
    if f.strides[1][b] != 1 {
        return Ok(None);
    }
    let Some(a) = (0..b).find(|&d| f.strides[0][d] == 1) else {
        return Ok(None);
    };
    if f.dims[a] < MIN_EXTENT
        || f.dims[b] < MIN_EXTENT
        || f.dims[a] > u32::MAX as usize
        || f.dims[b] > u32::MAX as usize
    {
        return Ok(None);
    }
    let rest: Vec<usize> = (0..b).filter(|&d| d != a).collect();
    let dims: Vec<usize> = rest.iter().map(|&d| f.dims[d]).collect();
    let strides: [Vec<usize>; 2] = [
        rest.iter().map(|&d| f.strides[0][d]).collect(),
        rest.iter().map(|&d| f.strides[1][d]).collect(),
    ];
    let tile = TRANSPOSE_TILE as usize;
    let even = |v: &[usize]| v.iter().all(|s| s.is_multiple_of(2));
    let load_pairs =
        f.dims[a].is_multiple_of(2) && f.strides[0][b].is_multiple_of(2) && even(&strides[0]);
    let store_pairs =
        f.dims[b].is_multiple_of(2) && f.strides[1][a].is_multiple_of(2) && even(&strides[1]);
    let (tiles_a, tiles_b) = (f.dims[a].div_ceil(tile), f.dims[b].div_ceil(tile));
    let batch_blocks = dims.iter().product::<usize>();
    if tiles_a.saturating_mul(tiles_b).saturating_mul(batch_blocks) > i32::MAX as usize {
        return Ok(None);
    }
    Ok(Some(TransposeParams {
        alpha,
        beta,
        len_a: f.dims[a] as u32,
        len_b: f.dims[b] as u32,
        tiles_a: FastDivisor::new(tiles_a as u32),
        tiles_b: FastDivisor::new(tiles_b as u32),
        x_stride_b: f.strides[0][b] as u64,
        y_stride_a: f.strides[1][a] as u64,
        pairs: load_pairs as u32 | (store_pairs as u32) << 1,
        _pad: 0,
        batch: super::layout::index_map(&dims, &strides)?,
    }))
}
