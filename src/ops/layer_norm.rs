//! Layer normalization and RMS normalization over the trailing dims of a tensor (PyTorch's
//! `layer_norm` / `rms_norm` with a `normalized_shape`; the cuDNN graph API's layer and RMS
//! norm), forward and backward.
//!
//! With `k` normalized dims, every index of the other (leading) dims names a *row*: the
//! `D` elements of the last `k` dims. Forward:
//! `y = (x - mean) * rstd * scale + bias` with `rstd = 1 / sqrt(var + epsilon)` (biased
//! variance); RMS norm drops the mean (`y = x * rstd * scale`, `rstd = 1 / sqrt(E[x^2] +
//! epsilon)`) and has no bias. The optional affine parameters `scale` (gamma) and `bias`
//! (beta) have the normalized dims and are f32 or the data's type (f32 for f16/bf16 data,
//! as cuDNN; the data's type, as PyTorch users pass). The forward can save, per row, the
//! `mean` (layer norm) and `rstd` (f32, in a tensor of `x`'s dims with the normalized dims
//! set to 1) for the backward, which computes `dx`, and optionally `dscale` and `dbias`
//! (sums over all rows: per-block partials in a workspace, then a fixed-order sum, so the
//! result is deterministic).
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! // Two rows of four: layer norm over the last dim, no affine parameters.
//! let x_desc = TensorDescriptor::packed(DataType::F32, &[2, 4])?;
//! let x = handle.upload(&[1.0f32, 2.0, 3.0, 4.0, -1.0, -1.0, 1.0, 1.0])?;
//! let mut y = handle.alloc(&x_desc)?;
//! let norm = LayerNormDescriptor::layer_norm(1, 1e-5)?;
//! let stats_desc = TensorDescriptor::packed(DataType::F32, &[2, 1])?;
//! let (mut mean, mut rstd) = (handle.alloc(&stats_desc)?, handle.alloc(&stats_desc)?);
//! layer_norm_forward(
//!     &handle, &norm, &x_desc, &x, None, None, None, &x_desc, &mut y,
//!     Some(&stats_desc), Some(&mut mean), Some(&mut rstd),
//! )?;
//! let y = handle.read::<f32>(&y)?;
//! assert!((y[0] + 1.3416).abs() < 1e-3 && (y[7] - 0.99999).abs() < 1e-3);
//! assert_eq!(handle.read::<f32>(&mean)?, [2.5, 0.0]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::rows::{block_limit, operand_map, per_row_strides, Budget, RowKernel, RowPlan, Split};
use super::{host_read, host_write};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::host_tensor::HostTensor;
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference;
use oxidnn_params::{
    layer_norm_bwd_shared_bytes, LayerNormBwdParams, LayerNormFwdParams, LayerNormWeightsParams,
    NORM_BIAS, NORM_BWD_GROUPS_SHARE_BLOCKS, NORM_DBIAS, NORM_DSCALE, NORM_F32_WEIGHTS,
    NORM_FINALIZE_THREADS, NORM_SCALE, NORM_WRITE_STATS,
};

/// Layer norm or RMS norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormMode {
    /// `(x - mean) * rstd`, with scale and bias.
    LayerNorm,
    /// `x * rstd` with `rstd = 1 / sqrt(E[x^2] + epsilon)`, with scale only.
    RmsNorm,
}

/// Which normalization, over how many trailing dims, with which epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNormDescriptor {
    mode: NormMode,
    normalized_rank: usize,
    epsilon: f64,
}

impl LayerNormDescriptor {
    /// `mode` over the last `normalized_rank` dims (1 to 8) with `epsilon` (finite, > 0).
    pub fn new(mode: NormMode, normalized_rank: usize, epsilon: f64) -> Result<Self> {
        if !(1..=oxidnn_params::MAX_DIMS).contains(&normalized_rank) {
            return Err(Error::bad(
                "normalized_rank",
                format!(
                    "normalizes 1 to {} trailing dims, got {normalized_rank}",
                    oxidnn_params::MAX_DIMS
                ),
            ));
        }
        if !(epsilon.is_finite() && epsilon > 0.0) {
            return Err(Error::bad(
                "epsilon",
                format!("must be finite and > 0, got {epsilon}"),
            ));
        }
        Ok(Self {
            mode,
            normalized_rank,
            epsilon,
        })
    }

    /// Layer norm over the last `normalized_rank` dims.
    pub fn layer_norm(normalized_rank: usize, epsilon: f64) -> Result<Self> {
        Self::new(NormMode::LayerNorm, normalized_rank, epsilon)
    }

    /// RMS norm over the last `normalized_rank` dims.
    pub fn rms_norm(normalized_rank: usize, epsilon: f64) -> Result<Self> {
        Self::new(NormMode::RmsNorm, normalized_rank, epsilon)
    }

    pub fn mode(&self) -> NormMode {
        self.mode
    }
    pub fn normalized_rank(&self) -> usize {
        self.normalized_rank
    }
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }
    fn rms(&self) -> bool {
        self.mode == NormMode::RmsNorm
    }
}

/// A validated problem: `x`'s dims split into rows and row elements, with the strides of
/// the weights and statistics over them.
struct Problem {
    /// Leading (row) dims of x and the normalized dims.
    outer_dims: Vec<usize>,
    inner_dims: Vec<usize>,
    /// The weights' strides over the normalized dims (x's, as placeholders, without weights).
    weight_strides: Vec<usize>,
    weights_f32: bool,
    /// The statistics' strides over the row dims (0s without statistics).
    stats_strides: Vec<usize>,
}

impl Problem {
    fn new(
        norm: &LayerNormDescriptor,
        x_desc: &TensorDescriptor,
        weight_desc: Option<&TensorDescriptor>,
        stats_desc: Option<&TensorDescriptor>,
    ) -> Result<Self> {
        let k = norm.normalized_rank;
        let rank = x_desc.rank();
        if k > rank {
            return Err(Error::bad(
                "x_desc",
                format!("normalizing the last {k} dims of a rank-{rank} tensor"),
            ));
        }
        let split = rank - k;
        let outer_dims = x_desc.dims()[..split].to_vec();
        let inner_dims = x_desc.dims()[split..].to_vec();
        let dtype = x_desc.dtype();
        let mut weight_strides = x_desc.strides()[split..].to_vec();
        let mut weights_f32 = dtype == DataType::F32;
        if let Some(w) = weight_desc {
            if w.dtype() != dtype && w.dtype() != DataType::F32 {
                return Err(Error::bad(
                    "weight_desc",
                    format!("data type {} must be f32 or the data's {dtype}", w.dtype()),
                ));
            }
            weights_f32 = w.dtype() == DataType::F32;
            let lead = w.rank().checked_sub(k).filter(|&l| {
                w.dims()[..l].iter().all(|&n| n == 1) && w.dims()[l..] == inner_dims[..]
            });
            let Some(lead) = lead else {
                return Err(Error::bad(
                    "weight_desc",
                    format!(
                        "dims {:?} must be the normalized dims {inner_dims:?} (optionally after 1s)",
                        w.dims()
                    ),
                ));
            };
            weight_strides = w.strides()[lead..].to_vec();
            check_output("weight_desc", w)?;
        }
        let mut stats_strides = vec![0; outer_dims.len()];
        if let Some(s) = stats_desc {
            let ok = s.dtype() == DataType::F32
                || (s.dtype() == DataType::F64 && dtype == DataType::F64);
            if !ok {
                return Err(Error::bad(
                    "stats_desc",
                    format!(
                        "statistics are f32 (f64 also for f64 data), got {}",
                        s.dtype()
                    ),
                ));
            }
            check_output("stats_desc", s)?;
            stats_strides = per_row_strides("stats_desc", &outer_dims, s.dims(), s.strides())?;
        }
        Ok(Self {
            outer_dims,
            inner_dims,
            weight_strides,
            weights_f32,
            stats_strides,
        })
    }

    fn rows(&self) -> usize {
        self.outer_dims.iter().product()
    }
}

/// Checks an optional buffer against its (required) descriptor.
fn check_optional(
    handle: &Handle,
    arg: &'static str,
    desc_arg: &'static str,
    desc: Option<&TensorDescriptor>,
    buf: Option<&Buffer>,
) -> Result<()> {
    match (desc, buf) {
        (_, None) => Ok(()),
        (Some(d), Some(b)) => handle.check_tensor(arg, d, b),
        (None, Some(_)) => Err(Error::bad(
            desc_arg,
            format!("`{arg}` is given, so its descriptor `{desc_arg}` is required"),
        )),
    }
}

/// Forward: `y = normalize(x) * scale + bias` over the trailing dims (see the module
/// docs). `scale` and `bias` (layer norm only) are optional and need `weight_desc`;
/// `mean` (layer norm only) and `rstd` are optional outputs that need `stats_desc`.
/// `x` and `y` have the same dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_forward(
    handle: &Handle,
    norm: &LayerNormDescriptor,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    weight_desc: Option<&TensorDescriptor>,
    scale: Option<&Buffer>,
    bias: Option<&Buffer>,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    stats_desc: Option<&TensorDescriptor>,
    mean: Option<&mut Buffer>,
    rstd: Option<&mut Buffer>,
) -> Result<()> {
    check_same_dims("y_desc", x_desc, y_desc)?;
    check_same_dtype("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    let problem = Problem::new(norm, x_desc, weight_desc, stats_desc)?;
    if norm.rms() && bias.is_some() {
        return Err(Error::bad("bias", "RMS norm has no bias"));
    }
    if norm.rms() && mean.is_some() {
        return Err(Error::bad("mean", "RMS norm saves no mean"));
    }
    if mean.is_some() != rstd.is_some() && !norm.rms() {
        return Err(Error::bad(
            "rstd",
            "layer norm saves both statistics (mean and rstd) or neither",
        ));
    }
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    check_optional(handle, "scale", "weight_desc", weight_desc, scale)?;
    check_optional(handle, "bias", "weight_desc", weight_desc, bias)?;
    check_optional(handle, "mean", "stats_desc", stats_desc, mean.as_deref())?;
    check_optional(handle, "rstd", "stats_desc", stats_desc, rstd.as_deref())?;
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let read_weight = |b: Option<&Buffer>| -> Result<Option<HostTensor>> {
                match (weight_desc, b) {
                    (Some(d), Some(b)) => Ok(Some(host_read(d, b)?)),
                    _ => Ok(None),
                }
            };
            let (st, bt) = (read_weight(scale)?, read_weight(bias)?);
            let mut yt = host_read(y_desc, y)?;
            let stats =
                reference::layer_norm::forward(norm, &xt, st.as_ref(), bt.as_ref(), &mut yt);
            host_write(&yt, y)?;
            if let Some(sd) = stats_desc {
                for (buf, values) in [(mean, &stats.mean), (rstd, &stats.rstd)] {
                    if let Some(buf) = buf {
                        let mut t = host_read(sd, buf)?;
                        write_rows(&mut t, values);
                        host_write(&t, buf)?;
                    }
                }
            }
            Ok(())
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let split = Split {
                outer_dims: problem.outer_dims.clone(),
                outer_strides: [
                    row_strides(x_desc, &problem),
                    row_strides(y_desc, &problem),
                    problem.stats_strides.clone(),
                ],
                inner_dims: problem.inner_dims.clone(),
                inner_strides: [
                    elem_strides(x_desc, &problem),
                    elem_strides(y_desc, &problem),
                    problem.weight_strides.clone(),
                    problem.weight_strides.clone(),
                ],
            };
            // The forward holds its rows as loaded, but its output pass also takes gamma and
            // beta per value: 32 values, whatever their size (64 16-bit values measured
            // slower, at 120 registers).
            let budget = Budget {
                max_values: 32,
                packed: false,
                columns: false,
                groups_share_blocks: false,
            };
            let limit = block_limit(gpu, |k| fwd_kernel(k, dtype));
            let plan = RowPlan::new(
                &split,
                [true, true, false],
                dtype.size_bytes(),
                budget,
                &limit,
            )?;
            let kernel = fwd_kernel(plan.kernel, dtype).ok_or_else(|| {
                Error::unsupported(format!("layer norm on {dtype} tensors on the GPU"))
            })?;
            let mut flags = 0;
            if scale.is_some() {
                flags |= NORM_SCALE;
            }
            if bias.is_some() {
                flags |= NORM_BIAS;
            }
            if rstd.is_some() {
                flags |= NORM_WRITE_STATS;
            }
            if problem.weights_f32 {
                flags |= NORM_F32_WEIGHTS;
            }
            let p = LayerNormFwdParams {
                rows: plan.rows,
                row_len: plan.row_len,
                warps: plan.warps,
                chunks: plan.chunks,
                epsilon: norm.epsilon as f32,
                rms: norm.rms() as u32,
                flags,
                _pad: 0,
                outer: plan.outer,
                inner: plan.inner,
            };
            let opt = |b: Option<&Buffer>| b.map_or(Ok(0), |b| device_ptr(gpu, b));
            let opt_mut = |b: Option<&mut Buffer>| b.map_or(Ok(0), |b| device_ptr_mut(gpu, b));
            let ptrs = [
                device_ptr(gpu, x)?,
                device_ptr_mut(gpu, y)?,
                opt(scale)?,
                opt(bias)?,
                opt_mut(mean)?,
                opt_mut(rstd)?,
            ];
            // SAFETY: every buffer holds its descriptor's span (checked above); the row and
            // element maps only produce offsets inside those spans; the `vec` kernels run
            // only on dense rows with vector-aligned row bases (the plan checks); null
            // pointers are never read (their flags are off, or RMS skips the mean).
            unsafe { gpu.launch(kernel, plan.config(plan.blocks), &p, &ptrs) }
        }
    }
}

/// Strides of `desc` over the row dims of `problem`.
fn row_strides(desc: &TensorDescriptor, problem: &Problem) -> Vec<usize> {
    desc.strides()[..problem.outer_dims.len()].to_vec()
}

/// Strides of `desc` over the normalized dims.
fn elem_strides(desc: &TensorDescriptor, problem: &Problem) -> Vec<usize> {
    desc.strides()[problem.outer_dims.len()..].to_vec()
}

/// Writes per-row (or per-element) values, in row-major order, into the logical elements
/// of `t` (whose dims are the rows' (elements') dims with extra 1s, so the orders agree).
fn write_rows(t: &mut HostTensor, values: &[f64]) {
    let desc = t.desc;
    let mut i = 0;
    crate::host_tensor::for_each_index(desc.dims(), |idx| {
        t.set(idx, values[i]);
        i += 1;
    });
}

/// Reads per-row values (row-major) out of a statistics tensor.
fn read_rows(t: &HostTensor) -> Vec<f64> {
    t.logical()
}

fn fwd_kernel(kernel: RowKernel, dtype: DataType) -> Option<&'static str> {
    match kernel {
        RowKernel::Vectors { slots: 1 } => kernels::layer_norm_fwd_vec1(dtype),
        RowKernel::Vectors { slots: 2 } => kernels::layer_norm_fwd_vec2(dtype),
        RowKernel::Vectors { slots: 4 } => kernels::layer_norm_fwd_vec4(dtype),
        RowKernel::Vectors { slots: 8 } => kernels::layer_norm_fwd_vec8(dtype),
        RowKernel::Mapped { slots: 4 } => kernels::layer_norm_fwd_map4(dtype),
        RowKernel::Streamed { vectors: true } => kernels::layer_norm_fwd_long_vec(dtype),
        RowKernel::Streamed { vectors: false } => kernels::layer_norm_fwd_long_map(dtype),
        _ => None,
    }
}

fn bwd_kernel(kernel: RowKernel, dtype: DataType) -> Option<&'static str> {
    match kernel {
        RowKernel::Vectors { slots: 1 } => kernels::layer_norm_bwd_vec1(dtype),
        RowKernel::Vectors { slots: 2 } => kernels::layer_norm_bwd_vec2(dtype),
        RowKernel::Vectors { slots: 4 } => kernels::layer_norm_bwd_vec4(dtype),
        RowKernel::Mapped { slots: 4 } => kernels::layer_norm_bwd_map4(dtype),
        RowKernel::Streamed { vectors: true } => kernels::layer_norm_bwd_long_vec(dtype),
        RowKernel::Streamed { vectors: false } => kernels::layer_norm_bwd_long_map(dtype),
        _ => None,
    }
}

/// The backward's plan and grid: with weight gradients, the grid fills the GPU once (each
/// block leaves one partial slot); without, a group per row.
struct BwdLaunch {
    plan: RowPlan<4, 4>,
    kernel: &'static str,
    grid: u32,
    /// The in-register kernels' weight-gradient sums (`layer_norm_bwd_shared_bytes`).
    shared_bytes: u32,
}

impl BwdLaunch {
    fn new(gpu: &Gpu, split: &Split<4, 4>, dtype: DataType, weight_grads: bool) -> Result<Self> {
        // x and dy held as loaded, and the next row's loads in flight beside them: 8
        // registers a thread and operand (16 values of a 16-bit type, 8 of f32).
        let budget = Budget {
            max_values: 8,
            packed: true,
            columns: false,
            groups_share_blocks: NORM_BWD_GROUPS_SHARE_BLOCKS,
        };
        let limit = block_limit(gpu, |k| bwd_kernel(k, dtype));
        let operands = [true, true, true, false];
        let plan = RowPlan::new(split, operands, dtype.size_bytes(), budget, &limit)?;
        let kernel = bwd_kernel(plan.kernel, dtype).ok_or_else(|| {
            Error::unsupported(format!("layer norm backward on {dtype} tensors on the GPU"))
        })?;
        let values = match plan.kernel {
            RowKernel::Vectors { slots } => slots * (16 / dtype.size_bytes()) as u32,
            RowKernel::Mapped { slots } => slots,
            _ => 0,
        };
        let shared_bytes = layer_norm_bwd_shared_bytes(plan.block, values, weight_grads);
        let grid = if weight_grads {
            // Every block leaves a slot of partial sums: fill the GPU once, no more (the
            // streamed kernels, whose slots are long rows, twice per SM at most).
            let resident = match plan.kernel {
                RowKernel::Streamed { .. } => 2,
                // At least one: a block that cannot fit fails at its launch, by name.
                _ => gpu
                    .resident_blocks(kernel, plan.block, shared_bytes)?
                    .max(1),
            };
            plan.blocks.min(resident * gpu.sm_count.max(1))
        } else {
            plan.blocks
        };
        Ok(Self {
            plan,
            kernel,
            grid,
            shared_bytes,
        })
    }

    fn workspace_bytes(&self, weight_grads: bool) -> usize {
        if weight_grads {
            2 * self.grid as usize * self.plan.row_len as usize * size_of::<f32>()
        } else {
            0
        }
    }
}

/// The backward's split: rows over `[x, dy, dx, stats]`, elements over `[x, dy, dx, scale]`.
fn bwd_split(
    problem: &Problem,
    x_desc: &TensorDescriptor,
    dy_desc: &TensorDescriptor,
    dx_desc: &TensorDescriptor,
) -> Split<4, 4> {
    Split {
        outer_dims: problem.outer_dims.clone(),
        outer_strides: [
            row_strides(x_desc, problem),
            row_strides(dy_desc, problem),
            row_strides(dx_desc, problem),
            problem.stats_strides.clone(),
        ],
        inner_dims: problem.inner_dims.clone(),
        inner_strides: [
            elem_strides(x_desc, problem),
            elem_strides(dy_desc, problem),
            elem_strides(dx_desc, problem),
            problem.weight_strides.clone(),
        ],
    }
}

/// Workspace bytes [`layer_norm_backward`] needs, for these descriptors, when it computes
/// weight gradients (`weight_desc` given); 0 otherwise and on the CPU handle.
pub fn layer_norm_backward_workspace_size(
    handle: &Handle,
    norm: &LayerNormDescriptor,
    x_desc: &TensorDescriptor,
    dy_desc: &TensorDescriptor,
    dx_desc: &TensorDescriptor,
    weight_desc: Option<&TensorDescriptor>,
) -> Result<usize> {
    for (arg, d) in [("dy_desc", dy_desc), ("dx_desc", dx_desc)] {
        check_same_dims(arg, x_desc, d)?;
        check_same_dtype(arg, x_desc, d)?;
    }
    let problem = Problem::new(norm, x_desc, weight_desc, None)?;
    match (&handle.backend, weight_desc) {
        (Backend::Gpu(gpu), Some(_)) => {
            let split = bwd_split(&problem, x_desc, dy_desc, dx_desc);
            let launch = BwdLaunch::new(gpu, &split, x_desc.dtype(), true)?;
            Ok(launch.workspace_bytes(true))
        }
        _ => Ok(0),
    }
}

/// Backward: `dx` from `dy`, `x`, the optional `scale` and the forward's saved `mean`
/// (layer norm only) and `rstd`; and, if asked for, `dscale = sum_rows dy * xhat` and
/// (layer norm) `dbias = sum_rows dy`, written (not accumulated) in `weight_desc`'s type
/// and layout. `x`, `dy` and `dx` have the same dims and dtype, any strides; `workspace`
/// must hold [`layer_norm_backward_workspace_size`] bytes.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    handle: &Handle,
    norm: &LayerNormDescriptor,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    weight_desc: Option<&TensorDescriptor>,
    scale: Option<&Buffer>,
    stats_desc: &TensorDescriptor,
    mean: Option<&Buffer>,
    rstd: &Buffer,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
    dscale: Option<&mut Buffer>,
    dbias: Option<&mut Buffer>,
    workspace: &mut Buffer,
) -> Result<()> {
    for (arg, d) in [("dy_desc", dy_desc), ("dx_desc", dx_desc)] {
        check_same_dims(arg, x_desc, d)?;
        check_same_dtype(arg, x_desc, d)?;
    }
    check_output("dx_desc", dx_desc)?;
    let problem = Problem::new(norm, x_desc, weight_desc, Some(stats_desc))?;
    match (norm.mode, mean.is_some()) {
        (NormMode::LayerNorm, false) => {
            return Err(Error::bad(
                "mean",
                "layer norm backward needs the saved mean",
            ))
        }
        (NormMode::RmsNorm, true) => return Err(Error::bad("mean", "RMS norm has no mean")),
        _ => {}
    }
    if norm.rms() && dbias.is_some() {
        return Err(Error::bad("dbias", "RMS norm has no bias"));
    }
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    handle.check_tensor("rstd", stats_desc, rstd)?;
    if let Some(m) = mean {
        handle.check_tensor("mean", stats_desc, m)?;
    }
    check_optional(handle, "scale", "weight_desc", weight_desc, scale)?;
    check_optional(
        handle,
        "dscale",
        "weight_desc",
        weight_desc,
        dscale.as_deref(),
    )?;
    check_optional(
        handle,
        "dbias",
        "weight_desc",
        weight_desc,
        dbias.as_deref(),
    )?;
    handle.check_owner("workspace", workspace)?;
    let weight_grads = dscale.is_some() || dbias.is_some();
    match &handle.backend {
        Backend::Cpu => {
            let (xt, dyt) = (host_read(x_desc, x)?, host_read(dy_desc, dy)?);
            let st = match (weight_desc, scale) {
                (Some(d), Some(b)) => Some(host_read(d, b)?),
                _ => None,
            };
            let mean_rows = match mean {
                Some(m) => read_rows(&host_read(stats_desc, m)?),
                None => vec![0.0; problem.rows()],
            };
            let rstd_rows = read_rows(&host_read(stats_desc, rstd)?);
            let mut dxt = host_read(dx_desc, dx)?;
            let grads = reference::layer_norm::backward(
                norm,
                &xt,
                &dyt,
                st.as_ref(),
                &mean_rows,
                &rstd_rows,
                &mut dxt,
            );
            host_write(&dxt, dx)?;
            if let Some(wd) = weight_desc {
                for (buf, values) in [(dscale, &grads.dscale), (dbias, &grads.dbias)] {
                    if let Some(buf) = buf {
                        let mut t = host_read(wd, buf)?;
                        write_rows(&mut t, values);
                        host_write(&t, buf)?;
                    }
                }
            }
            Ok(())
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let split = bwd_split(&problem, x_desc, dy_desc, dx_desc);
            let launch = BwdLaunch::new(gpu, &split, dtype, weight_grads)?;
            let need = launch.workspace_bytes(weight_grads);
            if workspace.len_bytes() < need {
                return Err(Error::WorkspaceTooSmall {
                    required_bytes: need,
                    got_bytes: workspace.len_bytes(),
                });
            }
            let plan = &launch.plan;
            let mut flags = 0;
            if scale.is_some() {
                flags |= NORM_SCALE;
            }
            if problem.weights_f32 {
                flags |= NORM_F32_WEIGHTS;
            }
            if dscale.is_some() {
                flags |= NORM_DSCALE;
            }
            if dbias.is_some() {
                flags |= NORM_DBIAS;
            }
            let p = LayerNormBwdParams {
                rows: plan.rows,
                row_len: plan.row_len,
                warps: plan.warps,
                chunks: plan.chunks,
                rms: norm.rms() as u32,
                flags,
                slots: launch.grid,
                _pad: 0,
                outer: plan.outer,
                inner: plan.inner,
            };
            let ws = if need > 0 {
                device_ptr_mut(gpu, workspace)?
            } else {
                0
            };
            let ptrs = [
                device_ptr(gpu, x)?,
                device_ptr(gpu, dy)?,
                device_ptr_mut(gpu, dx)?,
                scale.map_or(Ok(0), |b| device_ptr(gpu, b))?,
                mean.map_or(Ok(0), |b| device_ptr(gpu, b))?,
                device_ptr(gpu, rstd)?,
                ws,
            ];
            let config = LaunchConfig {
                shared_bytes: launch.shared_bytes,
                ..plan.config(launch.grid)
            };
            // SAFETY: every buffer holds its descriptor's span (checked above) and the maps
            // only produce offsets inside them; the `vec` kernels run only on dense,
            // vector-aligned rows; the workspace holds 2 * grid * row_len f32 whenever
            // weight gradients are written (checked), and the block its shared sums; null
            // pointers are never read.
            unsafe { gpu.launch(launch.kernel, config, &p, &ptrs)? };
            if !weight_grads {
                return Ok(());
            }
            let wdtype = weight_desc.map_or(dtype, |d| d.dtype());
            let kernel = kernels::layer_norm_bwd_weights(wdtype).ok_or_else(|| {
                Error::unsupported(format!(
                    "layer norm weight gradients in {wdtype} on the GPU"
                ))
            })?;
            let wp = LayerNormWeightsParams {
                row_len: plan.row_len,
                slots: launch.grid,
                flags: flags & (NORM_DSCALE | NORM_DBIAS),
                _pad: 0,
                weights: operand_map(&plan.inner, 3)?,
            };
            let cfg = LaunchConfig {
                grid: plan.row_len.div_ceil(32),
                grid_y: 1,
                block: NORM_FINALIZE_THREADS,
                shared_bytes: 0,
            };
            let ptrs = [
                ws,
                dscale.map_or(Ok(0), |b| device_ptr_mut(gpu, b))?,
                dbias.map_or(Ok(0), |b| device_ptr_mut(gpu, b))?,
            ];
            // SAFETY: reads the partials the launch above wrote (same stream, same slots and
            // row length); writes the weight gradients at the offsets of the weight
            // descriptor's folded map, inside the buffers checked above.
            unsafe { gpu.launch(kernel, cfg, &wp, &ptrs) }
        }
    }
}
