//! Softmax forward and backward (cudnnSoftmaxForward / cudnnSoftmaxBackward).
//!
//! A tensor of dims `N, C, spatial..` (rank 2 to 8, any strides) splits into rows by the
//! mode: [`SoftmaxMode::Instance`] takes the softmax over `C * spatial` for each `n`,
//! [`SoftmaxMode::Channel`] over `C` for each `(n, spatial..)`. The algorithm is
//! [`SoftmaxAlgorithm::Fast`] (no max subtraction: overflows for large inputs, as cuDNN's),
//! [`SoftmaxAlgorithm::Accurate`] (max-subtracted) or [`SoftmaxAlgorithm::Log`] (log
//! softmax, max-subtracted). Results blend as cuDNN's: `y = alpha * softmax(x) + beta * y`.
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! // Two images of three channels: the softmax over the channels of each.
//! let desc = TensorDescriptor::nchw(DataType::F32, 2, 3, 1, 1)?;
//! let x = handle.upload(&[0.0f32, 0.0, 0.0, 1.0, 2.0, 3.0])?;
//! let mut y = handle.alloc(&desc)?;
//! softmax_forward(
//!     &handle, SoftmaxAlgorithm::Accurate, SoftmaxMode::Channel, 1.0, &desc, &x, 0.0, &desc, &mut y,
//! )?;
//! let y = handle.read::<f32>(&y)?;
//! assert!((y[0] - 1.0 / 3.0).abs() < 1e-6 && (y[5] - 0.665241).abs() < 1e-5);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::rows::{block_limit, Budget, RowKernel, RowPlan, Split};
use super::{host_read, host_write, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut};
use crate::reference;
pub use oxidnn_params::SoftmaxAlgorithm;
use oxidnn_params::{SoftmaxBwdParams, SoftmaxFwdParams};

/// Which elements one softmax covers (cuDNN's `cudnnSoftmaxMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxMode {
    /// Over `C * spatial..` for each image `n`.
    Instance,
    /// Over `C` for each `(n, spatial..)`.
    Channel,
}

impl SoftmaxMode {
    pub const ALL: [SoftmaxMode; 2] = [SoftmaxMode::Instance, SoftmaxMode::Channel];

    /// The reduced dims of a tensor of `rank` dims (`N, C, spatial..`).
    pub fn reduced_dims(self, rank: usize) -> std::ops::Range<usize> {
        match self {
            SoftmaxMode::Instance => 1..rank,
            SoftmaxMode::Channel => 1..2,
        }
    }
}

/// Registers per thread the kernels hold a row in (per operand; rows held as loaded).
const BUDGET: Budget = Budget {
    max_values: 32,
    packed: true,
    columns: true,
    groups_share_blocks: false,
};

fn check_rank(arg: &'static str, desc: &TensorDescriptor) -> Result<()> {
    if desc.rank() < 2 {
        return Err(Error::bad(
            arg,
            format!(
                "softmax takes dims N, C, spatial.. (rank 2 to 8), got rank {}",
                desc.rank()
            ),
        ));
    }
    Ok(())
}

/// `dims` and each operand's strides split into rows (outer) and row elements (inner).
fn split<const N: usize>(mode: SoftmaxMode, dims: &[usize], strides: [&[usize]; N]) -> Split<N, N> {
    let reduced = mode.reduced_dims(dims.len());
    let pick = |v: &[usize], inside: bool| -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|(d, _)| reduced.contains(d) == inside)
            .map(|(_, &s)| s)
            .collect()
    };
    Split {
        outer_dims: pick(dims, false),
        outer_strides: strides.map(|s| pick(s, false)),
        inner_dims: pick(dims, true),
        inner_strides: strides.map(|s| pick(s, true)),
    }
}

/// Forward: `y = alpha * softmax(x) + beta * y` over the rows `mode` picks; with
/// `beta == 0`, `y` is not read. `x` and `y` have the same dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn softmax_forward(
    handle: &Handle,
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    check_rank("x_desc", x_desc)?;
    check_same_dims("y_desc", x_desc, y_desc)?;
    check_same_dtype("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            reference::softmax::forward(algo, mode, alpha, &xt, beta, &mut yt);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let s = split(mode, x_desc.dims(), [x_desc.strides(), y_desc.strides()]);
            let limit = block_limit(gpu, |k| fwd_kernel(k, dtype));
            let plan = RowPlan::new(&s, [true, true], dtype.size_bytes(), BUDGET, &limit)?;
            let kernel = fwd_kernel(plan.kernel, dtype).ok_or_else(|| {
                Error::unsupported(format!("softmax on {dtype} tensors on the GPU"))
            })?;
            let p = SoftmaxFwdParams {
                rows: plan.rows,
                row_len: plan.row_len,
                warps: plan.warps,
                chunks: plan.chunks,
                algo: algo as u32,
                alpha: alpha32,
                beta: beta32,
                _pad: 0,
                outer: plan.outer,
                inner: plan.inner,
            };
            let ptrs = [device_ptr(gpu, x)?, device_ptr_mut(gpu, y)?];
            let grid = grid(&plan, gpu.sm_count);
            // SAFETY: both buffers hold their descriptors' spans (checked above); the row
            // and element maps only produce offsets inside them; the `vec` kernels run only
            // on dense rows with vector-aligned row bases (the plan checks).
            unsafe { gpu.launch(kernel, plan.config(grid), &p, &ptrs) }
        }
    }
}

/// Backward: `dx = alpha * y * (dy - sum(dy * y)) + beta * dx` over each row; for
/// [`SoftmaxAlgorithm::Log`] (`y` the log-softmax output),
/// `dx = alpha * (dy - exp(y) * sum(dy)) + beta * dx`. With `beta == 0`, `dx` is not read.
/// `y`, `dy` and `dx` have the same dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn softmax_backward(
    handle: &Handle,
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: f64,
    y_desc: &TensorDescriptor,
    y: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    beta: f64,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
) -> Result<()> {
    check_rank("y_desc", y_desc)?;
    for (arg, d) in [("dy_desc", dy_desc), ("dx_desc", dx_desc)] {
        check_same_dims(arg, y_desc, d)?;
        check_same_dtype(arg, y_desc, d)?;
    }
    check_output("dx_desc", dx_desc)?;
    handle.check_tensor("y", y_desc, y)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let (yt, dyt) = (host_read(y_desc, y)?, host_read(dy_desc, dy)?);
            let mut dxt = host_read(dx_desc, dx)?;
            reference::softmax::backward(algo, mode, alpha, &yt, &dyt, beta, &mut dxt);
            host_write(&dxt, dx)
        }
        Backend::Gpu(gpu) => {
            let dtype = y_desc.dtype();
            let s = split(
                mode,
                y_desc.dims(),
                [y_desc.strides(), dy_desc.strides(), dx_desc.strides()],
            );
            let limit = block_limit(gpu, |k| bwd_kernel(k, dtype));
            let plan = RowPlan::new(&s, [true, true, true], dtype.size_bytes(), BUDGET, &limit)?;
            let kernel = bwd_kernel(plan.kernel, dtype).ok_or_else(|| {
                Error::unsupported(format!("softmax backward on {dtype} tensors on the GPU"))
            })?;
            let p = SoftmaxBwdParams {
                rows: plan.rows,
                row_len: plan.row_len,
                warps: plan.warps,
                chunks: plan.chunks,
                algo: algo as u32,
                alpha: alpha32,
                beta: beta32,
                _pad: 0,
                outer: plan.outer,
                inner: plan.inner,
            };
            let ptrs = [
                device_ptr(gpu, y)?,
                device_ptr(gpu, dy)?,
                device_ptr_mut(gpu, dx)?,
            ];
            let grid = grid(&plan, gpu.sm_count);
            // SAFETY: as in `softmax_forward`, for the three operands.
            unsafe { gpu.launch(kernel, plan.config(grid), &p, &ptrs) }
        }
    }
}

/// The grid: a group per row for the row kernels; the `column` kernel strides over rows
/// with enough blocks to fill the GPU.
fn grid<const N: usize, const M: usize>(plan: &RowPlan<N, M>, sm_count: u32) -> u32 {
    match plan.kernel {
        RowKernel::Column => plan.blocks.min(sm_count.max(1) * 32),
        _ => plan.blocks,
    }
}

fn fwd_kernel(kernel: RowKernel, dtype: DataType) -> Option<&'static str> {
    match kernel {
        RowKernel::Vectors { slots: 1 } => kernels::softmax_fwd_vec1(dtype),
        RowKernel::Vectors { slots: 2 } => kernels::softmax_fwd_vec2(dtype),
        RowKernel::Vectors { slots: 4 } => kernels::softmax_fwd_vec4(dtype),
        RowKernel::Vectors { slots: 8 } => kernels::softmax_fwd_vec8(dtype),
        RowKernel::Mapped { slots: 4 } => kernels::softmax_fwd_map4(dtype),
        RowKernel::Streamed { vectors: true } => kernels::softmax_fwd_long_vec(dtype),
        RowKernel::Streamed { vectors: false } => kernels::softmax_fwd_long_map(dtype),
        RowKernel::Column => kernels::softmax_fwd_column(dtype),
        _ => None,
    }
}

fn bwd_kernel(kernel: RowKernel, dtype: DataType) -> Option<&'static str> {
    match kernel {
        RowKernel::Vectors { slots: 1 } => kernels::softmax_bwd_vec1(dtype),
        RowKernel::Vectors { slots: 2 } => kernels::softmax_bwd_vec2(dtype),
        RowKernel::Vectors { slots: 4 } => kernels::softmax_bwd_vec4(dtype),
        RowKernel::Vectors { slots: 8 } => kernels::softmax_bwd_vec8(dtype),
        RowKernel::Mapped { slots: 4 } => kernels::softmax_bwd_map4(dtype),
        RowKernel::Streamed { vectors: true } => kernels::softmax_bwd_long_vec(dtype),
        RowKernel::Streamed { vectors: false } => kernels::softmax_bwd_long_map(dtype),
        RowKernel::Column => kernels::softmax_bwd_column(dtype),
        _ => None,
    }
}
