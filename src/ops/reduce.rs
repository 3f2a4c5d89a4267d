//! reduce_tensor (cudnnReduceTensor): reduces `x` over every dim where `y` has extent 1.
//!
//! ```
//! use oxidnn::{reduce_tensor, DataType, Handle, HostTensor, ReduceOp, ReduceTensorDescriptor, TensorDescriptor};
//! let (handle, _) = Handle::gpu_or_cpu();
//! let x_desc = TensorDescriptor::packed(DataType::F32, &[2, 3])?;
//! let y_desc = TensorDescriptor::packed(DataType::F32, &[2, 1])?; // reduce over dim 1
//! let x = handle.upload(&[1.0f32, 5.0, 3.0, -4.0, 2.0, 0.5])?;
//! let mut y = handle.alloc(&y_desc)?;
//! let mut idx = handle.alloc_bytes(2 * 4)?;
//! let red = ReduceTensorDescriptor::new(ReduceOp::Max);
//! let ws_bytes = oxidnn::reduce_tensor_workspace_size(&handle, &red, &x_desc, &y_desc)?;
//! let mut ws = handle.alloc_bytes(ws_bytes)?;
//! reduce_tensor(&handle, &red, Some(&mut idx), &mut ws, 1.0, &x_desc, &x, 0.0, &y_desc, &mut y)?;
//! assert_eq!(handle.read::<f32>(&y)?, [5.0, 2.0]);
//! assert_eq!(handle.read::<u32>(&idx)?, [1, 1]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::layout::index_map;
use super::{grid_stride_config, host_read, host_write, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dtype, TensorDescriptor};
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, LaunchConfig};
use crate::reference;
pub use oxidnn_params::ReduceOp;
use oxidnn_params::{ReduceParams, ReducePartial, BLOCK_THREADS};

/// What to reduce with (cuDNN's `cudnnReduceTensorDescriptor_t`; compute type f32, NaN
/// propagated, 32-bit flattened indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceTensorDescriptor {
    op: ReduceOp,
}

impl ReduceTensorDescriptor {
    pub fn new(op: ReduceOp) -> Self {
        Self { op }
    }
    pub fn op(&self) -> ReduceOp {
        self.op
    }
}

/// The reduction split into output dims and reduced dims.
struct Shape {
    out_dims: Vec<usize>,
    out_strides: [Vec<usize>; 3], // x, y, indices (dense over y's dims)
    red_dims: Vec<usize>,
    red_strides: [Vec<usize>; 1],
}

impl Shape {
    fn out_len(&self) -> usize {
        self.out_dims.iter().product()
    }
    fn red_len(&self) -> usize {
        self.red_dims.iter().product()
    }
}

fn validate(
    red: &ReduceTensorDescriptor,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
) -> Result<Shape> {
    let _ = red;
    check_same_dtype("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    if x_desc.rank() != y_desc.rank() {
        return Err(Error::bad(
            "y_desc",
            format!(
                "rank {} differs from x's rank {}",
                y_desc.rank(),
                x_desc.rank()
            ),
        ));
    }
    let idx_desc = TensorDescriptor::packed(y_desc.dtype(), y_desc.dims())?;
    let mut s = Shape {
        out_dims: vec![],
        out_strides: [vec![], vec![], vec![]],
        red_dims: vec![],
        red_strides: [vec![]],
    };
    // Output dims, outermost by y's strides so consecutive threads write consecutive y.
    let mut outs: Vec<usize> = vec![];
    for d in 0..x_desc.rank() {
        let (xn, yn) = (x_desc.dims()[d], y_desc.dims()[d]);
        if yn == xn {
            if xn > 1 {
                outs.push(d);
            }
        } else if yn == 1 {
            s.red_dims.push(xn);
            s.red_strides[0].push(x_desc.strides()[d]);
        } else {
            return Err(Error::bad(
                "y_desc",
                format!(
                    "y dims {:?} must equal x dims {:?} or be 1 (reduced) in every dim",
                    y_desc.dims(),
                    x_desc.dims()
                ),
            ));
        }
    }
    outs.sort_by(|&a, &b| y_desc.strides()[b].cmp(&y_desc.strides()[a]));
    for d in outs {
        s.out_dims.push(x_desc.dims()[d]);
        s.out_strides[0].push(x_desc.strides()[d]);
        s.out_strides[1].push(y_desc.strides()[d]);
        s.out_strides[2].push(idx_desc.strides()[d]);
    }
    Ok(s)
}

/// How the GPU runs a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// One thread per output.
    Thread,
    /// A group of `group` lanes (power of two, 2 to 32) per output.
    Warp { group: u32 },
    /// One block per output and slice of the reduction; `splits > 1` needs a workspace.
    Block { splits: u32, split_len: u32 },
}

fn strategy(s: &Shape, sm_count: u32) -> Strategy {
    let (out_len, red_len) = (s.out_len(), s.red_len());
    // Consecutive outputs adjacent in x: threads of a warp read adjacent elements.
    let out_inner_contiguous = s.out_strides[0].last() == Some(&1);
    if red_len <= 16 || (out_inner_contiguous && out_len >= 2048) {
        return Strategy::Thread;
    }
    let resident_blocks = 8 * sm_count as usize; // 2048 threads per SM in blocks of 256
    if red_len <= 8192 || out_len >= resident_blocks * 8 {
        // About four elements per lane: short rows share a warp.
        let group = red_len.div_ceil(4).next_power_of_two().clamp(2, 32) as u32;
        return Strategy::Warp { group };
    }
    // Few long reductions: enough blocks to fill the GPU, each reducing >= 2048 elements.
    let splits = resident_blocks
        .div_ceil(out_len)
        .min(red_len.div_ceil(2048))
        .clamp(1, 65_535);
    let split_len = red_len.div_ceil(splits);
    let splits = red_len.div_ceil(split_len);
    Strategy::Block {
        splits: splits as u32,
        split_len: split_len as u32,
    }
}

fn workspace_bytes(s: &Shape, strategy: Strategy) -> usize {
    match strategy {
        Strategy::Block { splits, .. } if splits > 1 => {
            s.out_len() * splits as usize * size_of::<ReducePartial>()
        }
        _ => 0,
    }
}

/// Workspace bytes [`reduce_tensor`] needs for this problem (cudnnGetReductionWorkspaceSize).
pub fn reduce_tensor_workspace_size(
    handle: &Handle,
    red: &ReduceTensorDescriptor,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
) -> Result<usize> {
    let s = validate(red, x_desc, y_desc)?;
    Ok(match &handle.backend {
        Backend::Gpu(gpu) => workspace_bytes(&s, strategy(&s, gpu.sm_count)),
        Backend::Cpu => 0,
    })
}

/// `y = alpha * reduce(x) + beta * y`, reducing every dim where `y` has extent 1 (and `x`
/// does not). For min, max and amax, `indices` (if given) receives, per output element,
/// the u32 flattened row-major index within the reduced dims of the chosen element (the
/// first one on ties; NaN wins); other ops must pass `None`. `workspace` must hold
/// [`reduce_tensor_workspace_size`] bytes.
#[allow(clippy::too_many_arguments)]
pub fn reduce_tensor(
    handle: &Handle,
    red: &ReduceTensorDescriptor,
    indices: Option<&mut Buffer>,
    workspace: &mut Buffer,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    let s = validate(red, x_desc, y_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    handle.check_owner("workspace", workspace)?;
    if let Some(ix) = &indices {
        if !red.op.selects() {
            return Err(Error::bad(
                "indices",
                format!(
                    "{:?} selects no element; only min, max and amax produce indices",
                    red.op
                ),
            ));
        }
        handle.check_owner("indices", ix)?;
        ix.check_len("indices", y_desc.element_count() * 4)?;
    }
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            let idx = reference::reduce::reduce(red.op, alpha, &xt, beta, &mut yt);
            host_write(&yt, y)?;
            if let Some(ix) = indices {
                handle.write(ix, &idx)?;
            }
            Ok(())
        }
        Backend::Gpu(gpu) => {
            let strategy = strategy(&s, gpu.sm_count);
            let need = workspace_bytes(&s, strategy);
            if workspace.len_bytes() < need {
                return Err(Error::WorkspaceTooSmall {
                    required_bytes: need,
                    got_bytes: workspace.len_bytes(),
                });
            }
            let dtype = x_desc.dtype();
            let unsupported =
                || Error::unsupported(format!("reduce_tensor on {dtype} tensors on the GPU"));
            let (out_len, red_len) = (s.out_len(), s.red_len());
            if red_len > u32::MAX as usize {
                return Err(Error::unsupported(format!(
                    "reducing {red_len} elements into one (at most 2^32-1)"
                )));
            }
            let mut p = ReduceParams {
                op: red.op as u32,
                alpha: alpha32,
                beta: beta32,
                write_indices: indices.is_some() as u32,
                out_len: out_len as u32,
                red_len: red_len as u32,
                splits: 1,
                split_len: red_len as u32,
                group: 32,
                _pad: 0,
                out: index_map(&s.out_dims, &s.out_strides)?,
                red: index_map(&s.red_dims, &s.red_strides)?,
            };
            let x_ptr = device_ptr(gpu, x)?;
            let y_ptr = device_ptr_mut(gpu, y)?;
            let idx_ptr = match indices {
                Some(ix) => device_ptr_mut(gpu, ix)?,
                None => 0,
            };
            match strategy {
                Strategy::Thread => {
                    let kernel = kernels::reduce_thread(dtype).ok_or_else(unsupported)?;
                    // SAFETY: offsets from both maps stay inside x's and y's spans; indices
                    // holds one u32 per y element (checked) or is not written.
                    unsafe {
                        gpu.launch(
                            kernel,
                            grid_stride_config(out_len as u64, gpu.sm_count)?,
                            &p,
                            &[x_ptr, y_ptr, idx_ptr],
                        )
                    }
                }
                Strategy::Warp { group } => {
                    p.group = group;
                    let kernel = kernels::reduce_warp(dtype).ok_or_else(unsupported)?;
                    let warps = (out_len as u64).div_ceil(32 / group as u64);
                    let cfg = grid_stride_config(warps * 32, gpu.sm_count)?;
                    // SAFETY: as for Thread.
                    unsafe { gpu.launch(kernel, cfg, &p, &[x_ptr, y_ptr, idx_ptr]) }
                }
                Strategy::Block { splits, split_len } => {
                    p.splits = splits;
                    p.split_len = split_len;
                    let ws_ptr = if need > 0 {
                        device_ptr_mut(gpu, workspace)?
                    } else {
                        0
                    };
                    let blocks = out_len as u64 * splits as u64;
                    let cfg =
                        LaunchConfig::for_threads(blocks * BLOCK_THREADS as u64, BLOCK_THREADS)?;
                    let kernel = kernels::reduce_block(dtype).ok_or_else(unsupported)?;
                    // SAFETY: as above; the workspace holds out_len * splits partials.
                    unsafe { gpu.launch(kernel, cfg, &p, &[x_ptr, y_ptr, idx_ptr, ws_ptr])? };
                    if splits > 1 {
                        let kernel = kernels::reduce_finalize(dtype).ok_or_else(unsupported)?;
                        let cfg = grid_stride_config(out_len as u64, gpu.sm_count)?;
                        // SAFETY: reads the partials the launch above wrote (same stream).
                        unsafe { gpu.launch(kernel, cfg, &p, &[y_ptr, idx_ptr, ws_ptr])? };
                    }
                    Ok(())
                }
            }
        }
    }
}
