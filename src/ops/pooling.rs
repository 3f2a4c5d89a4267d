//! Pooling (cudnnPoolingForward / cudnnPoolingBackward) over 1 to 3 spatial dims: max,
//! average including or excluding padding; a window, padding and stride per spatial dim.
//!
//! Tensors are `N, C, spatial..` (NCHW, NHWC, NCDHW, NDHWC or any strides). Output
//! extent per spatial dim: `1 + (in + 2 * pad - window) / stride`, rounded down
//! ([`pooling_forward_output_dims`], cudnnGetPoolingNdForwardOutputDim).
//!
//! Semantics:
//! - **Max** takes the window's largest in-bounds element (padding never wins). With
//!   [`PoolingNanOpt::Propagate`] a NaN in the window makes the result NaN; with
//!   [`PoolingNanOpt::NotPropagate`] NaNs are skipped (a window of NaNs only gives -inf).
//! - **Max backward** sends each window's gradient to one element: the window's first
//!   in-bounds element in scan order (d, then h, then w) whose `x` equals the window's `y`
//!   (NaN equals NaN); when none does (a `y` that is not this `x`'s forward output), the
//!   gradient is dropped. On ties this is the first maximum, as cuDNN chooses.
//!   [`PoolingMode::MaxDeterministic`] is the same: every oxidnn backward is deterministic
//!   (each dx element is computed by one thread that gathers over its windows in a fixed
//!   order; no atomics).
//! - **Average** divides the window's sum by its volume (padding counts as zeros) or by its
//!   in-bounds element count; the backward spreads `dy` over the window likewise.
//!
//! The GPU computes averages in f32 for every storage type, and maxima exactly (the
//! forward kernels of the common shapes take 16-bit maxima as stored, two elements an
//! instruction). Forward: a thread per output (threads along the output's w for NCHW);
//! channel-contiguous tensors (NHWC) move 16-byte vectors of channels, the common window
//! shapes (2x2, 3x3, 2x2x2) compiled in with every vector of a window loaded at once; rows
//! contiguous along w (NCHW) take, for those shapes, a thread per strip of outputs along w
//! that loads its windows' rows as 16-byte vectors; a window that covers the whole spatial
//! extent without padding (global pooling) runs a dedicated reduction per `(n, c)`. Backward, without atomics: each dx
//! element is written by one thread, as a gather over the windows containing it, per cell
//! (the stride-sized block of elements at a window start, each overlapping window visited
//! once; over NCHW rows, the common shapes have cell kernels of their own that load their
//! windows at once or write dx as vectors) or, for max over channel vectors, per tile of
//! cells whose windows' winners are found once into shared memory. The max of 3x3 windows
//! at stride 2 over rows of up to 32 16-byte vectors (ResNet's stem) walks down bands of
//! rows, a group of lanes per band owning one vector of each row, each x, y, dy and dx
//! element read or written once with the shared rows kept in registers; over channel
//! vectors (NHWC), the same windows walk down bands of rows a thread per column of cells
//! and vector of channels. Disjoint windows
//! (window = stride, unpadded: 2x2 and 2x2x2), where each dx element is under one window
//! at most, take kernels of their own in both layouts that read each window's dy (and y
//! and x, for the max) once and write every dx element under it as vectors.
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! // 3x3 max pooling, stride 2, padding 1, on a 1x1x4x4 image.
//! let pool = PoolingDescriptor::new_2d(PoolingMode::Max, PoolingNanOpt::NotPropagate, [3, 3], [1, 1], [2, 2])?;
//! let x_desc = TensorDescriptor::nchw(DataType::F32, 1, 1, 4, 4)?;
//! let y_dims = pooling_forward_output_dims(&pool, &x_desc)?;
//! assert_eq!(y_dims, [1, 1, 2, 2]);
//! let y_desc = TensorDescriptor::packed(DataType::F32, &y_dims)?;
//! let x = handle.upload(&(0..16).map(|v| v as f32).collect::<Vec<_>>())?;
//! let mut y = handle.alloc(&y_desc)?;
//! pooling_forward(&handle, &pool, 1.0, &x_desc, &x, 0.0, &y_desc, &mut y)?;
//! assert_eq!(handle.read::<f32>(&y)?, [5.0, 7.0, 13.0, 15.0]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::{grid_stride_config, host_read, host_write, resident_with, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference;
use oxidnn_params::{
    pooling_global_lane_fits, pooling_global_stage_bytes, pooling_walk_columns,
    pooling_walk_vec_channels, FastDivisor, PoolBand, PoolItems, PoolTile, PoolWalk, PoolWindow,
    PoolingBwdParams, PoolingFwdParams, PoolingGlobalParams, PoolingKind, BLOCK_THREADS,
    POOLING_BAND_RUN, POOLING_CELL_VECTOR, POOLING_GLOBAL_LOADS, POOLING_GLOBAL_STAGED_LEN,
    POOLING_GLOBAL_STAGED_WARPS, POOLING_MAX_CELL, POOLING_REGION_CELLS, POOLING_STRIPS_PER_TURN,
    POOLING_WINDOWS_PER_TURN,
};

/// The most spatial dims a pooling descriptor has.
pub const POOLING_MAX_SPATIAL_DIMS: usize = 3;

/// How a window is reduced (cuDNN's `cudnnPoolingMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolingMode {
    /// The maximum (`CUDNN_POOLING_MAX`).
    Max,
    /// `CUDNN_POOLING_MAX_DETERMINISTIC`: the same as [`PoolingMode::Max`] here, since every
    /// oxidnn pooling backward is deterministic.
    MaxDeterministic,
    /// The sum divided by the window's volume: padding counts as zeros.
    AverageCountIncludePadding,
    /// The sum divided by the number of in-bounds elements.
    AverageCountExcludePadding,
}

impl PoolingMode {
    pub const ALL: [PoolingMode; 4] = [
        Self::Max,
        Self::MaxDeterministic,
        Self::AverageCountIncludePadding,
        Self::AverageCountExcludePadding,
    ];

    /// Whether the mode takes the maximum.
    pub fn is_max(self) -> bool {
        matches!(self, Self::Max | Self::MaxDeterministic)
    }

    fn kind(self) -> PoolingKind {
        match self {
            Self::Max | Self::MaxDeterministic => PoolingKind::Max,
            Self::AverageCountIncludePadding => PoolingKind::AvgIncludePadding,
            Self::AverageCountExcludePadding => PoolingKind::AvgExcludePadding,
        }
    }
}

/// What max pooling does with NaN (cuDNN's `maxpoolingNanOpt`); average pooling always
/// propagates NaN, as arithmetic does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolingNanOpt {
    /// NaNs are skipped; a window holding only NaNs gives -inf.
    NotPropagate,
    /// A NaN in the window makes the result NaN.
    Propagate,
}

/// A pooling operation: mode, NaN option, and window, padding and stride per spatial dim
/// (cuDNN's `cudnnPoolingDescriptor_t`). Validated on construction, immutable after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolingDescriptor {
    mode: PoolingMode,
    nan_opt: PoolingNanOpt,
    spatial: usize,
    window: [usize; POOLING_MAX_SPATIAL_DIMS],
    padding: [usize; POOLING_MAX_SPATIAL_DIMS],
    stride: [usize; POOLING_MAX_SPATIAL_DIMS],
}

/// The largest window, padding or stride (cuDNN takes them as `int`).
const MAX_PARAMETER: usize = i32::MAX as usize;

impl PoolingDescriptor {
    /// 2-D pooling (cudnnSetPooling2dDescriptor): `[height, width]` each.
    pub fn new_2d(
        mode: PoolingMode,
        nan_opt: PoolingNanOpt,
        window: [usize; 2],
        padding: [usize; 2],
        stride: [usize; 2],
    ) -> Result<Self> {
        Self::new_nd(mode, nan_opt, &window, &padding, &stride)
    }

    /// Pooling over 1 to 3 spatial dims (cudnnSetPoolingNdDescriptor), outermost first
    /// (`[depth, height, width]` for 3-D). Every window and stride must be >= 1 and every
    /// padding smaller than its window, so that each window holds at least one input.
    ///
    /// ```
    /// use oxidnn::{Error, PoolingDescriptor, PoolingMode, PoolingNanOpt};
    /// let nan = PoolingNanOpt::NotPropagate;
    /// let p = PoolingDescriptor::new_nd(PoolingMode::Max, nan, &[2, 2, 2], &[0, 0, 0], &[2, 2, 2])?;
    /// assert_eq!(p.spatial_dims(), 3);
    /// let e = PoolingDescriptor::new_2d(PoolingMode::Max, nan, [3, 3], [1, 1], [0, 2]).unwrap_err();
    /// assert!(matches!(e, Error::BadParam { arg: "stride", .. }));
    /// # Ok::<(), oxidnn::Error>(())
    /// ```
    pub fn new_nd(
        mode: PoolingMode,
        nan_opt: PoolingNanOpt,
        window: &[usize],
        padding: &[usize],
        stride: &[usize],
    ) -> Result<Self> {
        let spatial = window.len();
        if !(1..=POOLING_MAX_SPATIAL_DIMS).contains(&spatial) {
            return Err(Error::bad(
                "window",
                format!("1 to {POOLING_MAX_SPATIAL_DIMS} spatial dims, got {spatial}"),
            ));
        }
        for (arg, v) in [("padding", padding), ("stride", stride)] {
            if v.len() != spatial {
                return Err(Error::bad(
                    arg,
                    format!("{} values for a {spatial}-dim window", v.len()),
                ));
            }
        }
        for (arg, v) in [("window", window), ("padding", padding), ("stride", stride)] {
            if let Some(i) = v.iter().position(|&e| e > MAX_PARAMETER) {
                return Err(Error::bad(
                    arg,
                    format!("dim {i} is {}, more than {MAX_PARAMETER}", v[i]),
                ));
            }
        }
        for (arg, v) in [("window", window), ("stride", stride)] {
            if let Some(i) = v.iter().position(|&e| e == 0) {
                return Err(Error::bad(
                    arg,
                    format!("dim {i} is 0; every {arg} must be >= 1 ({arg} {v:?})"),
                ));
            }
        }
        if let Some(i) = (0..spatial).find(|&i| padding[i] >= window[i]) {
            return Err(Error::bad(
                "padding",
                format!(
                    "dim {i}: padding {} must be smaller than the window {} (a window must \
                     hold at least one input)",
                    padding[i], window[i]
                ),
            ));
        }
        let mut d = Self {
            mode,
            nan_opt,
            spatial,
            window: [1; POOLING_MAX_SPATIAL_DIMS],
            padding: [0; POOLING_MAX_SPATIAL_DIMS],
            stride: [1; POOLING_MAX_SPATIAL_DIMS],
        };
        d.window[..spatial].copy_from_slice(window);
        d.padding[..spatial].copy_from_slice(padding);
        d.stride[..spatial].copy_from_slice(stride);
        Ok(d)
    }

    /// Global pooling of an input with spatial extents `spatial`: one window covering them
    /// all, no padding (stride 1).
    pub fn global(mode: PoolingMode, nan_opt: PoolingNanOpt, spatial: &[usize]) -> Result<Self> {
        let padding = vec![0; spatial.len()];
        let stride = vec![1; spatial.len()];
        Self::new_nd(mode, nan_opt, spatial, &padding, &stride)
    }

    pub fn mode(&self) -> PoolingMode {
        self.mode
    }
    pub fn nan_opt(&self) -> PoolingNanOpt {
        self.nan_opt
    }
    /// Number of spatial dims (1 to 3).
    pub fn spatial_dims(&self) -> usize {
        self.spatial
    }
    pub fn window(&self) -> &[usize] {
        &self.window[..self.spatial]
    }
    pub fn padding(&self) -> &[usize] {
        &self.padding[..self.spatial]
    }
    pub fn stride(&self) -> &[usize] {
        &self.stride[..self.spatial]
    }
}

/// Dims of the pooled output of `x_desc` (cudnnGetPoolingNdForwardOutputDim): `N, C`, then
/// `1 + (in + 2 * pad - window) / stride` per spatial dim, rounded down. `x_desc` must have
/// two dims more than the descriptor has spatial dims, each padded extent at least the window.
pub fn pooling_forward_output_dims(
    pooling: &PoolingDescriptor,
    x_desc: &TensorDescriptor,
) -> Result<Vec<usize>> {
    let s = pooling.spatial;
    if x_desc.rank() != s + 2 {
        return Err(Error::bad(
            "x_desc",
            format!(
                "rank {} does not fit {s}-D pooling, whose tensors have {} dims (N, C, then \
                 {s} spatial)",
                x_desc.rank(),
                s + 2
            ),
        ));
    }
    let mut dims = x_desc.dims()[..2].to_vec();
    for i in 0..s {
        let (input, window) = (x_desc.dims()[2 + i], pooling.window[i]);
        let (pad, stride) = (pooling.padding[i], pooling.stride[i]);
        let padded = input + 2 * pad;
        if padded < window {
            return Err(Error::bad(
                "pooling",
                format!(
                    "spatial dim {i}: the window {window} is larger than the padded input \
                     {input} + 2 * {pad} = {padded}"
                ),
            ));
        }
        dims.push(1 + (padded - window) / stride);
    }
    Ok(dims)
}

/// `y = alpha * pool(x) + beta * y` (cudnnPoolingForward). `y` has the dims
/// [`pooling_forward_output_dims`] gives and x's dtype; any strides. With `beta == 0`, `y`
/// is not read.
#[allow(clippy::too_many_arguments)]
pub fn pooling_forward(
    handle: &Handle,
    pooling: &PoolingDescriptor,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    let g = Geometry::new(pooling, x_desc)?;
    check_pooled("y_desc", &g, x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            reference::pooling::forward(pooling, alpha, &xt, beta, &mut yt);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let aligned = [x.device_address(), y.device_address()]
                .iter()
                .all(|a| a.is_some_and(|a| a % 16 == 0));
            let plan = forward_plan(pooling, &g, x_desc, y_desc, aligned, gpu.sm_count)?;
            let win = g.window_params(pooling, alpha32, beta32);
            let ptrs = [device_ptr(gpu, x)?, device_ptr_mut(gpu, y)?];
            launch_forward(gpu, &plan, win, x_desc, y_desc, &ptrs)
        }
    }
}

/// `dx = alpha * grad + beta * dx` (cudnnPoolingBackward), where `grad` is the gradient of
/// the pooling at `x` given `dy`: see the module docs for which element of a max window
/// takes its gradient. `y` must be the forward output of `x` (computed with alpha 1 and
/// beta 0) for max pooling; average pooling reads neither `x` nor `y`. `y` and `dy` have
/// the pooled dims, `x` and `dx` the input dims, all the same dtype, any strides. With
/// `beta == 0`, `dx` is not read.
#[allow(clippy::too_many_arguments)]
pub fn pooling_backward(
    handle: &Handle,
    pooling: &PoolingDescriptor,
    alpha: f64,
    y_desc: &TensorDescriptor,
    y: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
) -> Result<()> {
    backward(
        handle, None, pooling, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx,
    )
}

/// The backward algorithms of the GPU. [`pooling_backward`] picks one; benches and tests
/// may force one through [`pooling_backward_with`].
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolingBwdAlgo {
    /// A thread per dx element (or channel vector) gathering over the windows that contain
    /// it. Any problem.
    Gather,
    /// A thread per cell (the stride-sized block of dx elements at a window start), each
    /// overlapping window visited once. Cells of at most `POOLING_MAX_CELL` elements.
    Cell,
    /// Max only: a block per tile of cells; each overlapping window's winner is found once,
    /// into shared memory, then gathered by the tile's dx elements. Over single channels,
    /// for 2-D windows whose band fits in shared memory, the tile is a band of whole rows
    /// of one plane, with x, y and dy staged in shared memory.
    Tile,
}

impl PoolingBwdAlgo {
    pub const ALL: [PoolingBwdAlgo; 3] = [Self::Gather, Self::Cell, Self::Tile];
}

/// [`pooling_backward`] with the GPU algorithm forced (`NotSupported` where it does not
/// apply); the CPU handle ignores it.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn pooling_backward_with(
    handle: &Handle,
    algo: PoolingBwdAlgo,
    pooling: &PoolingDescriptor,
    alpha: f64,
    y_desc: &TensorDescriptor,
    y: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
) -> Result<()> {
    backward(
        handle,
        Some(algo),
        pooling,
        alpha,
        y_desc,
        y,
        dy_desc,
        dy,
        x_desc,
        x,
        beta,
        dx_desc,
        dx,
    )
}

#[allow(clippy::too_many_arguments)]
fn backward(
    handle: &Handle,
    algo: Option<PoolingBwdAlgo>,
    pooling: &PoolingDescriptor,
    alpha: f64,
    y_desc: &TensorDescriptor,
    y: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
) -> Result<()> {
    let g = Geometry::new(pooling, x_desc)?;
    check_pooled("y_desc", &g, x_desc, y_desc)?;
    check_pooled("dy_desc", &g, x_desc, dy_desc)?;
    check_same_dtype("dx_desc", x_desc, dx_desc)?;
    if dx_desc.dims() != x_desc.dims() {
        return Err(Error::bad(
            "dx_desc",
            format!(
                "dims {:?} differ from x's dims {:?}",
                dx_desc.dims(),
                x_desc.dims()
            ),
        ));
    }
    check_output("dx_desc", dx_desc)?;
    handle.check_tensor("y", y_desc, y)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let (yt, dyt, xt) = (
                host_read(y_desc, y)?,
                host_read(dy_desc, dy)?,
                host_read(x_desc, x)?,
            );
            let mut dxt = host_read(dx_desc, dx)?;
            reference::pooling::backward(pooling, alpha, &yt, &dyt, &xt, beta, &mut dxt);
            host_write(&dxt, dx)
        }
        Backend::Gpu(gpu) => {
            let aligned = [y, dy, x, &*dx]
                .iter()
                .all(|b| b.device_address().is_some_and(|a| a % 16 == 0));
            let descs = [x_desc, y_desc, dy_desc, dx_desc];
            let plan = backward_plan(pooling, &g, descs, aligned, gpu, algo)?;
            let win = g.window_params(pooling, alpha32, beta32);
            let ptrs = [
                device_ptr(gpu, x)?,
                device_ptr(gpu, y)?,
                device_ptr(gpu, dy)?,
                device_ptr_mut(gpu, dx)?,
            ];
            launch_backward(gpu, &plan, win, &g, descs, &ptrs)
        }
    }
}

/// The kernel [`pooling_forward`] runs for these descriptors on `handle`'s GPU (buffers
/// from [`Handle::alloc`] are always aligned enough for the vector kernels). For tests and
/// benches that check which path a problem takes.
#[doc(hidden)]
pub fn pooling_forward_kernel(
    handle: &Handle,
    pooling: &PoolingDescriptor,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
) -> Result<&'static str> {
    let g = Geometry::new(pooling, x_desc)?;
    check_pooled("y_desc", &g, x_desc, y_desc)?;
    let sm_count = gpu_of(handle)?.sm_count;
    Ok(forward_plan(pooling, &g, x_desc, y_desc, true, sm_count)?.kernel)
}

/// The kernel [`pooling_backward`] (or, with `algo`, [`pooling_backward_with`]) runs for
/// these descriptors (as [`pooling_forward_kernel`]).
#[doc(hidden)]
pub fn pooling_backward_kernel(
    handle: &Handle,
    algo: Option<PoolingBwdAlgo>,
    pooling: &PoolingDescriptor,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
    dy_desc: &TensorDescriptor,
    dx_desc: &TensorDescriptor,
) -> Result<&'static str> {
    let g = Geometry::new(pooling, x_desc)?;
    check_pooled("y_desc", &g, x_desc, y_desc)?;
    check_pooled("dy_desc", &g, x_desc, dy_desc)?;
    let descs = [x_desc, y_desc, dy_desc, dx_desc];
    Ok(backward_plan(pooling, &g, descs, true, gpu_of(handle)?, algo)?.kernel)
}

fn gpu_of(handle: &Handle) -> Result<&Gpu> {
    match &handle.backend {
        Backend::Gpu(gpu) => Ok(gpu),
        Backend::Cpu => Err(Error::bad("handle", "the CPU handle runs no kernels")),
    }
}

/// Checks that `desc` (y or dy) has x's dtype and the pooled dims.
fn check_pooled(
    arg: &'static str,
    g: &Geometry,
    x_desc: &TensorDescriptor,
    desc: &TensorDescriptor,
) -> Result<()> {
    check_same_dtype(arg, x_desc, desc)?;
    if desc.dims() != g.output_dims.as_slice() {
        return Err(Error::bad(
            arg,
            format!(
                "dims {:?} differ from the pooled dims {:?} of x {:?}",
                desc.dims(),
                g.output_dims,
                x_desc.dims()
            ),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The problem in the kernels' form
// ---------------------------------------------------------------------------------------

/// A validated problem over the five logical dims `[n, c, d, h, w]` the kernels see
/// (missing spatial dims: extent 1, window 1, stride 1, no padding).
struct Geometry {
    n: usize,
    c: usize,
    input: [usize; 3],
    output: [usize; 3],
    window: [usize; 3],
    pad: [usize; 3],
    /// The descriptor's strides, except 1 where the output has extent 1 (a single window,
    /// whose position no stride changes): backward cells are then as small as possible.
    stride: [usize; 3],
    /// The output's dims as the tensors have them.
    output_dims: Vec<usize>,
}

impl Geometry {
    fn new(pooling: &PoolingDescriptor, x_desc: &TensorDescriptor) -> Result<Self> {
        let output_dims = pooling_forward_output_dims(pooling, x_desc)?;
        let s = pooling.spatial;
        let front = 3 - s;
        let mut g = Self {
            n: x_desc.dims()[0],
            c: x_desc.dims()[1],
            input: [1; 3],
            output: [1; 3],
            window: [1; 3],
            pad: [0; 3],
            stride: [1; 3],
            output_dims,
        };
        for i in 0..s {
            g.input[front + i] = x_desc.dims()[2 + i];
            g.output[front + i] = g.output_dims[2 + i];
            g.window[front + i] = pooling.window[i];
            g.pad[front + i] = pooling.padding[i];
            g.stride[front + i] = if g.output_dims[2 + i] == 1 {
                1
            } else {
                pooling.stride[i]
            };
        }
        Ok(g)
    }

    fn volume(&self) -> usize {
        self.window.iter().product()
    }

    /// Whether each depth plane of x is one depth plane of y, pooled in 2-D: the depth window
    /// 1, unpadded, at stride 1. (Where the output has one depth plane, [`Geometry::new`]
    /// sets the depth stride to 1 whatever the descriptor's, so the extents must also
    /// agree: x planes past the first window would otherwise read y planes that do not
    /// exist.) The kernels compiled for 2-D window shapes ask for it.
    fn planes_pass_through(&self) -> bool {
        self.window[0] == 1 && self.pad[0] == 0 && self.input[0] == self.output[0]
    }

    /// Whether the window covers the whole spatial extent without padding.
    fn is_global(&self) -> bool {
        (0..3).all(|k| self.window[k] == self.input[k] && self.pad[k] == 0)
    }

    /// Fails unless every extent fits the kernels' 32-bit index arithmetic.
    fn check_gpu_limits(&self) -> Result<()> {
        const LIMIT: usize = 1 << 30;
        for k in 0..3 {
            let reach = self.input[k] + 2 * self.pad[k] + self.window[k] + self.stride[k];
            if reach >= LIMIT {
                return Err(Error::unsupported(format!(
                    "pooling a spatial extent {} with window {}, padding {} and stride {} on \
                     the GPU (their sum must stay below 2^30)",
                    self.input[k], self.window[k], self.pad[k], self.stride[k]
                )));
            }
        }
        if self.volume() >= LIMIT {
            return Err(Error::unsupported(format!(
                "a pooling window of {} elements on the GPU (at most 2^30 - 1)",
                self.volume()
            )));
        }
        Ok(())
    }

    fn window_params(&self, pooling: &PoolingDescriptor, alpha: f32, beta: f32) -> PoolWindow {
        let u = |a: [usize; 3]| a.map(|v| v as u32);
        PoolWindow {
            kind: pooling.mode.kind() as u32,
            propagate_nan: (pooling.nan_opt == PoolingNanOpt::Propagate) as u32,
            alpha,
            beta,
            input: u(self.input),
            output: u(self.output),
            window: u(self.window),
            pad: u(self.pad),
            stride: u(self.stride),
            inv_volume: 1.0 / self.volume() as f32,
        }
    }
}

/// Strides of `desc` over `[n, c, d, h, w]`, 0 for dims it lacks or where its extent is 1
/// (no element steps along them). The kernels compute 32-bit offsets: a tensor spanning
/// 2^32 elements or more is not supported.
fn strides5(desc: &TensorDescriptor) -> Result<[u32; 5]> {
    if desc.span_elements() > u32::MAX as usize {
        return Err(Error::unsupported(format!(
            "pooling a tensor spanning {} elements on the GPU (at most 2^32 - 1)",
            desc.span_elements()
        )));
    }
    let mut out = [0u32; 5];
    let front = 5 - desc.rank();
    for (i, (&n, &s)) in desc.dims().iter().zip(desc.strides()).enumerate() {
        let slot = if i < 2 { i } else { front + i };
        out[slot] = if n == 1 { 0 } else { s as u32 };
    }
    Ok(out)
}

/// Whether every operand keeps `c` contiguous in whole vectors of `k` elements: unit
/// channel stride, every other stride a multiple of `k`, `c` a multiple of `k`.
fn channel_vectors(c: usize, k: usize, operands: &[[u32; 5]]) -> bool {
    c.is_multiple_of(k)
        && operands
            .iter()
            .all(|s| s[1] == 1 && [0, 2, 3, 4].iter().all(|&d| s[d].is_multiple_of(k as u32)))
}

/// Whether a tensor with these strides and `width` elements along w keeps its rows
/// contiguous along w in whole vectors of `v` elements: unit w stride, the width and every
/// other stride multiples of `v` (the base's alignment is the caller's to check).
fn rows_of_vectors(strides: &[u32; 5], width: usize, v: usize) -> bool {
    strides[4] == 1
        && width.is_multiple_of(v)
        && strides[..4].iter().all(|s| s.is_multiple_of(v as u32))
}

/// Whether the `(n, c)` planes of a tensor with these strides (its spatial elements one
/// run of unit stride) lie back to back, `c` then `n`: `c` strides a plane's volume and
/// `n` a whole image.
fn planes_back_to_back(strides: &[u32; 5], g: &Geometry) -> bool {
    let len: usize = g.input.iter().product();
    strides[1] as usize == len && (g.n == 1 || strides[0] as usize == g.c * len)
}

/// Whether items over a tensor with these strides should count channels innermost: its
/// channel stride is below every spatial stride.
pub(crate) fn channels_last(strides: &[u32; 5]) -> bool {
    strides[1] != 0 && strides[2..].iter().all(|&s| s == 0 || strides[1] < s)
}

/// The stride of x's spatial elements when they form one run with a single stride (the
/// spatial dims merge), or `None`.
fn spatial_run(strides: &[u32; 5], input: [usize; 3]) -> Option<u32> {
    let dims: Vec<(u64, u64)> = (0..3)
        .filter(|&k| input[k] > 1)
        .map(|k| (input[k] as u64, strides[2 + k] as u64))
        .collect();
    let merges = dims.windows(2).all(|p| p[0].1 == p[1].1 * p[1].0);
    merges.then(|| dims.last().map_or(0, |&(_, s)| s as u32))
}

/// Work items over extents `[n, c, d, h, w]` (shared with convolution's direct kernels).
pub(crate) fn items(extents: [usize; 5], channels_last: bool) -> Result<PoolItems> {
    let len: usize = extents.iter().product();
    if len > u32::MAX as usize {
        return Err(Error::unsupported(format!(
            "a launch over {len} work items on the GPU (at most 2^32 - 1)"
        )));
    }
    let div = |v: usize| FastDivisor::new(v as u32);
    Ok(PoolItems {
        len: len as u32,
        channels_last: channels_last as u32,
        c: div(extents[1]),
        d: div(extents[2]),
        h: div(extents[3]),
        w: div(extents[4]),
    })
}

fn unsupported(what: &str, dtype: DataType) -> Error {
    Error::unsupported(format!("pooling {what} on {dtype} tensors on the GPU"))
}

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------

enum ForwardKernel {
    Window(PoolItems),
    Global(PoolingGlobalParams),
}

struct ForwardPlan {
    kernel: &'static str,
    how: ForwardKernel,
    cfg: LaunchConfig,
}

fn forward_plan(
    pooling: &PoolingDescriptor,
    g: &Geometry,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
    aligned: bool,
    sm_count: u32,
) -> Result<ForwardPlan> {
    g.check_gpu_limits()?;
    let dtype = x_desc.dtype();
    let (xs, ys) = (strides5(x_desc)?, strides5(y_desc)?);
    let k = 16 / dtype.size_bytes();
    let missing = || unsupported("forward", dtype);
    if g.is_global() {
        if let Some(red_stride) = spatial_run(&xs, g.input) {
            let vec = aligned && channel_vectors(g.c, k, &[xs]);
            let layout = GlobalLayout {
                red_stride,
                vec,
                aligned,
            };
            return global_plan(pooling, g, dtype, xs, ys, layout, sm_count);
        }
    }
    let vec = aligned && channel_vectors(g.c, k, &[xs, ys]);
    let strip = if vec {
        None
    } else {
        strip_kernel(g, dtype, &xs, aligned)
    };
    let [d, h, w] = g.output;
    let (kernel, it, cfg) = match strip {
        Some((kernel, outputs)) => {
            let it = items([g.n, g.c, d, h, w.div_ceil(outputs)], false)?;
            // A thread per `POOLING_STRIPS_PER_TURN` strips, all loaded at once (a
            // grid-stride loop capped at fewer threads would leave most of them one).
            let threads = (it.len as u64).div_ceil(POOLING_STRIPS_PER_TURN);
            let cfg = LaunchConfig::for_threads(threads, BLOCK_THREADS)?;
            (Some(kernel), it, cfg)
        }
        None if vec => {
            let it = items([g.n, g.c / k, d, h, w], true)?;
            match window_vec_kernel(g, dtype) {
                Some(kernel) => {
                    // A thread per `POOLING_WINDOWS_PER_TURN` outputs, all loaded at once
                    // (as the strips).
                    let threads = (it.len as u64).div_ceil(POOLING_WINDOWS_PER_TURN);
                    let cfg = LaunchConfig::for_threads(threads, BLOCK_THREADS)?;
                    (Some(kernel), it, cfg)
                }
                None => {
                    let cfg = grid_stride_config(it.len as u64, sm_count)?;
                    (kernels::pooling_fwd_window_vec(dtype), it, cfg)
                }
            }
        }
        None => {
            let it = items([g.n, g.c, d, h, w], channels_last(&ys))?;
            let cfg = grid_stride_config(it.len as u64, sm_count)?;
            (kernels::pooling_fwd_window(dtype), it, cfg)
        }
    };
    Ok(ForwardPlan {
        kernel: kernel.ok_or_else(missing)?,
        cfg,
        how: ForwardKernel::Window(it),
    })
}

/// The channel-vector forward kernel compiled for this window's shape, if there is one:
/// 3x3, 2x2 (a depth window of 1) or 2x2x2, any strides and paddings. A thread loads its
/// windows' vectors all at once (`fwd_window_vec_shaped`), where the general kernel walks
/// a window two vectors at a time.
fn window_vec_kernel(g: &Geometry, dtype: DataType) -> Option<&'static str> {
    match g.window {
        [1, 3, 3] => kernels::pooling_fwd_window_vec_3x3(dtype),
        [1, 2, 2] => kernels::pooling_fwd_window_vec_2x2(dtype),
        [2, 2, 2] => kernels::pooling_fwd_window_vec_2x2x2(dtype),
        _ => None,
    }
}

/// The forward strip kernel compiled for this window, if there is one, and the outputs
/// along w each of its threads takes: x's rows contiguous along w in whole vectors of 16
/// bytes, or else of 8 (unit w stride, the w extent and every other stride multiples of
/// the vector, aligned), and windows of 2x2 (strides 1 or 2), 3x3 (stride 2 unpadded or
/// padded by 1 along w, stride 1 padded by 1), or 2x2x2 at stride 2 unpadded along w (the
/// depth window 1 for the 2-D shapes; any depth stride and any padding along d and h). A
/// thread loads its windows' rows as one vector and a few single elements each
/// (`fwd_strip`), where the window kernel loads every element of every window singly.
fn strip_kernel(
    g: &Geometry,
    dtype: DataType,
    xs: &[u32; 5],
    aligned: bool,
) -> Option<(&'static str, usize)> {
    let square = g.window[1] == g.window[2] && g.stride[1] == g.stride[2];
    if !aligned || !square {
        return None;
    }
    type Kernel = fn(DataType) -> Option<&'static str>;
    // (16-byte, 8-byte) vector kernels of the shape.
    let (wide, narrow): (Kernel, Kernel) = match (g.window[0], g.window[2], g.stride[2], g.pad[2]) {
        (1, 2, 2, 0) => (
            kernels::pooling_fwd_strip_2x2s2p0,
            kernels::pooling_fwd_strip8_2x2s2p0,
        ),
        (1, 2, 1, 0) => (
            kernels::pooling_fwd_strip_2x2s1p0,
            kernels::pooling_fwd_strip8_2x2s1p0,
        ),
        (1, 3, 2, 0) => (
            kernels::pooling_fwd_strip_3x3s2p0,
            kernels::pooling_fwd_strip8_3x3s2p0,
        ),
        (1, 3, 2, 1) => (
            kernels::pooling_fwd_strip_3x3s2p1,
            kernels::pooling_fwd_strip8_3x3s2p1,
        ),
        (1, 3, 1, 1) => (
            kernels::pooling_fwd_strip_3x3s1p1,
            kernels::pooling_fwd_strip8_3x3s1p1,
        ),
        (2, 2, 2, 0) => (
            kernels::pooling_fwd_strip_2x2x2s2p0,
            kernels::pooling_fwd_strip8_2x2x2s2p0,
        ),
        _ => return None,
    };
    [(16, wide), (8, narrow)]
        .into_iter()
        .map(|(bytes, kernel)| (bytes / dtype.size_bytes(), kernel))
        .find(|&(v, _)| rows_of_vectors(xs, g.input[2], v))
        .and_then(|(v, kernel)| Some((kernel(dtype)?, v / g.stride[2])))
}

/// How x's planes lie, for [`global_plan`].
struct GlobalLayout {
    /// The stride of a plane's elements (they form one run).
    red_stride: u32,
    /// Channel-contiguous, in 16-byte vectors.
    vec: bool,
    /// 16-byte aligned.
    aligned: bool,
}

/// Global pooling: over channel vectors, the vector kernel; short planes stored back to
/// back (NCHW 7x7): 16-bit ones of up to 57 elements a thread a plane loading whole
/// vectors ([`pooling_global_lane_fits`]), f32 ones of at most `POOLING_GLOBAL_STAGED_LEN`
/// elements a warp per few planes staged through shared memory; otherwise a group of
/// lanes, or a block, a plane.
fn global_plan(
    pooling: &PoolingDescriptor,
    g: &Geometry,
    dtype: DataType,
    xs: [u32; 5],
    ys: [u32; 5],
    layout: GlobalLayout,
    sm_count: u32,
) -> Result<ForwardPlan> {
    let GlobalLayout {
        red_stride,
        vec,
        aligned,
    } = layout;
    let len: usize = g.input.iter().product();
    let outputs = g.n * g.c;
    if outputs > u32::MAX as usize {
        return Err(Error::unsupported(format!(
            "global pooling into {outputs} outputs on the GPU (at most 2^32 - 1)"
        )));
    }
    let missing = || unsupported("forward", dtype);
    let mut p = PoolingGlobalParams {
        kind: pooling.mode.kind() as u32,
        propagate_nan: (pooling.nan_opt == PoolingNanOpt::Propagate) as u32,
        alpha: 1.0,
        beta: 0.0,
        outputs: outputs as u32,
        len: len as u32,
        inv_len: 1.0 / len as f32,
        group: 32,
        c: FastDivisor::new(g.c as u32),
        tiles: FastDivisor::new(1),
        cols: FastDivisor::new(1),
        rows: 1,
        red_stride,
        x_n: xs[0],
        x_c: xs[1],
        y_n: ys[0],
        y_c: ys[1],
    };
    if vec {
        // Columns of channel vectors, rows of spatial positions: as many columns as a warp
        // has lanes, fewer while that leaves the GPU short of blocks and the rows have
        // spatial positions to take.
        let k = 16 / dtype.size_bytes();
        let vectors = g.c / k;
        let threads = BLOCK_THREADS as usize;
        let mut cols = vectors.min(32);
        while cols > 1
            && g.n * vectors.div_ceil(cols) < 2 * sm_count as usize
            && threads / (cols / 2) <= len.next_power_of_two()
        {
            cols /= 2;
        }
        let tiles = vectors.div_ceil(cols);
        p.c = FastDivisor::new(vectors as u32);
        p.tiles = FastDivisor::new(tiles as u32);
        p.cols = FastDivisor::new(cols as u32);
        p.rows = (threads / cols) as u32;
        let blocks = (g.n * tiles) as u64;
        return Ok(ForwardPlan {
            kernel: kernels::pooling_fwd_global_vec(dtype).ok_or_else(missing)?,
            cfg: LaunchConfig::for_threads(blocks * BLOCK_THREADS as u64, BLOCK_THREADS)?,
            how: ForwardKernel::Global(p),
        });
    }
    // The short-plane kernels take aligned planes stored back to back, addressed by 32-bit
    // byte offsets (which run up to 256 bytes past a plane's start).
    let planes_in_a_row = aligned
        && red_stride == 1
        && planes_back_to_back(&xs, g)
        && outputs * len * dtype.size_bytes() <= u32::MAX as usize - 256;
    // 16-bit planes of up to 57 elements: a thread a plane, its vectors loaded at once.
    // 32x2048x7x7 f16 on the H100: 7.7 µs, where the group kernel took 10.2. f32 keeps the
    // staged kernel: its lane version ran 10.6 µs against the staged 10.3.
    let lane = planes_in_a_row
        && dtype.size_bytes() == 2
        && pooling_global_lane_fits(len, dtype.size_bytes());
    if lane {
        p.group = 1;
        return Ok(ForwardPlan {
            kernel: kernels::pooling_fwd_global_lane(dtype).ok_or_else(missing)?,
            cfg: grid_stride_config(outputs as u64, sm_count)?,
            how: ForwardKernel::Global(p),
        });
    }
    // f32 only: its lanes reduce a word an element; the 16-bit types' staged reductions
    // (a shared-memory read and a conversion an element, one lane a plane) lost to the
    // group kernel (H100, 32x2048x7x7 f16: 11.9 against 10.3 µs; f32: 10.4 against 12.1).
    let staged = planes_in_a_row && dtype.size_bytes() == 4 && len <= POOLING_GLOBAL_STAGED_LEN;
    if staged {
        // A lane a plane up to 64 elements (32 planes a warp), two beyond. Four lanes a
        // 7x7 plane ran slower (H100, 32x2048x7x7: f32 10.1 -> 10.4 µs, f16 10.3 -> 14.8):
        // planes 49 words apart put the groups' reads in the same banks, and four times
        // the warps each pay the copy's round trip and barriers.
        p.group = len.div_ceil(64).next_power_of_two().min(32) as u32;
        let warps = outputs.div_ceil(32 / p.group as usize) as u64;
        let threads = (POOLING_GLOBAL_STAGED_WARPS * 32) as u32;
        let mut cfg = LaunchConfig::for_threads(warps * 32, threads)?;
        cfg.grid = cfg.grid.min(32 * sm_count.max(1));
        let stage = pooling_global_stage_bytes(p.group as usize, len, dtype.size_bytes());
        cfg.shared_bytes = (POOLING_GLOBAL_STAGED_WARPS * stage) as u32;
        return Ok(ForwardPlan {
            kernel: kernels::pooling_fwd_global_staged(dtype).ok_or_else(missing)?,
            cfg,
            how: ForwardKernel::Global(p),
        });
    }
    // About POOLING_GLOBAL_LOADS elements per lane (one round trip: on 7x7, a quarter
    // of a warp per output); a block per output for long reductions that leave the GPU
    // short of warps.
    let resident_warps = 64 * sm_count as usize;
    let cfg = if len >= 4096 && outputs < resident_warps {
        p.group = BLOCK_THREADS;
        let blocks = outputs.min(32 * sm_count as usize) as u64;
        LaunchConfig::for_threads(blocks * BLOCK_THREADS as u64, BLOCK_THREADS)?
    } else {
        p.group = len
            .div_ceil(POOLING_GLOBAL_LOADS)
            .next_power_of_two()
            .clamp(1, 32) as u32;
        let warps = (outputs as u64).div_ceil(32 / p.group as u64);
        grid_stride_config(warps * 32, sm_count)?
    };
    Ok(ForwardPlan {
        kernel: kernels::pooling_fwd_global(dtype).ok_or_else(missing)?,
        cfg,
        how: ForwardKernel::Global(p),
    })
}

fn launch_forward(
    gpu: &Gpu,
    plan: &ForwardPlan,
    win: PoolWindow,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
    ptrs: &[u64; 2],
) -> Result<()> {
    match plan.how {
        ForwardKernel::Window(items) => {
            let p = PoolingFwdParams {
                win,
                items,
                x: strides5(x_desc)?,
                y: strides5(y_desc)?,
            };
            // SAFETY: x and y hold their descriptors' spans (checked by the caller); the
            // items cover y's dims and every window stays inside x's dims, so each offset
            // is inside its buffer; y's offsets are distinct (check_output). The vector
            // kernel runs only on channel-contiguous, 16-byte aligned operands, the strip
            // kernels only on x rows of whole aligned vectors and their window shapes
            // (strip_kernel); their items count strips.
            unsafe { gpu.launch(plan.kernel, plan.cfg, &p, ptrs) }
        }
        ForwardKernel::Global(mut p) => {
            p.alpha = win.alpha;
            p.beta = win.beta;
            // SAFETY: as above: outputs cover (n, c) of y, reductions run over x's spatial
            // run, inside its span. The staged kernel runs only on aligned x whose planes
            // lie back to back (so the outputs' planes span `outputs * len` elements from x,
            // below 2^32) and are at most POOLING_GLOBAL_STAGED_LEN long, with the shared
            // memory global_plan sized for its warps; the lane kernel on the same layout,
            // for planes pooling_global_lane_fits admits.
            unsafe { gpu.launch(plan.kernel, plan.cfg, &p, ptrs) }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------

struct BackwardPlan {
    kernel: &'static str,
    algo: PoolingBwdAlgo,
    items: PoolItems,
    tile: PoolTile,
    band: PoolBand,
    walk: PoolWalk,
    cfg: LaunchConfig,
}

/// Elements of a cell: the product of the (normalised) strides.
fn cell_len(g: &Geometry) -> usize {
    g.stride.iter().product()
}

/// Windows per dim that overlap one cell: `ceil(window / stride)`.
fn windows_per_cell(g: &Geometry) -> [usize; 3] {
    std::array::from_fn(|k| g.window[k].div_ceil(g.stride[k]))
}

/// The max backward cell kernel compiled for this window shape, if there is one, and the
/// dx columns each of its threads takes: square 2-D windows of 2x2 (stride 2, or stride 1
/// unpadded along w) or 3x3 (stride 2 unpadded or padded by 1 along w, stride 1 padded by
/// 1), the depth window 1 unpadded, any padding along h. Its thread loads all the windows
/// over `POOLING_REGION_CELLS` cells' rows and a run of as many cells' columns at once
/// (`bwd_cell_region`: one round trip to memory, where the generic cell kernel takes one a
/// window) and stores each row of the run as a vector where dx allows.
fn cell_region_kernel(g: &Geometry, dtype: DataType) -> Option<(&'static str, usize)> {
    let square = g.window[1] == g.window[2] && g.stride[1] == g.stride[2];
    if !square || !g.planes_pass_through() {
        return None;
    }
    let kernel = match (g.window[2], g.stride[2], g.pad[2]) {
        (2, 2, 0) => kernels::pooling_bwd_cell_max_2x2s2p0(dtype),
        (2, 1, 0) => kernels::pooling_bwd_cell_max_2x2s1p0(dtype),
        (3, 2, 0) => kernels::pooling_bwd_cell_max_3x3s2p0(dtype),
        (3, 2, 1) => kernels::pooling_bwd_cell_max_3x3s2p1(dtype),
        (3, 1, 1) => kernels::pooling_bwd_cell_max_3x3s1p1(dtype),
        _ => None,
    }?;
    Some((kernel, POOLING_REGION_CELLS * g.stride[2]))
}

/// The window shape of the max backward cell kernels over channel vectors, `(window,
/// stride)`, if they have this one: square 2-D windows of 2x2 or 3x3 at stride 2 (any
/// padding), x planes passing through to y planes. A thread per cell and vector of
/// `POOLING_CELL_VECTOR` channels finds the winners of the windows over its cell in
/// registers (`bwd_cell_region_vec`), where the generic cell kernel walks each window with
/// runtime loops.
fn cell_region_vec_shape(g: &Geometry) -> Option<(usize, usize)> {
    let square = g.window[1] == g.window[2] && g.stride[1] == g.stride[2];
    let shape = (g.window[2], g.stride[2]);
    let compiled = matches!(shape, (2, 2) | (3, 2));
    (square && compiled && g.planes_pass_through()).then_some(shape)
}

/// The kernel of [`cell_region_vec_shape`].
fn cell_region_vec_kernel(g: &Geometry, dtype: DataType) -> Option<&'static str> {
    match cell_region_vec_shape(g)? {
        (2, 2) => kernels::pooling_bwd_cell_vec_max_2x2s2(dtype),
        (3, 2) => kernels::pooling_bwd_cell_vec_max_3x3s2(dtype),
        _ => None,
    }
}

/// The shape `(depth, side)` of non-overlapping, unpadded windows that the disjoint-window
/// backward kernels are compiled for, if `g` has one: `window = stride = [depth, side,
/// side]`, no padding, 2x2 (a depth window of 1) or 2x2x2. Each dx element is then under
/// at most one window (the one at its cell's index), and every window lies whole inside x.
fn disjoint_window(g: &Geometry) -> Option<(usize, usize)> {
    let shape = [g.window[0], g.window[2], g.window[2]];
    let compiled = matches!((shape[0], shape[1]), (1, 2) | (2, 2));
    (compiled && g.window == shape && g.stride == shape && g.pad == [0; 3])
        .then_some((shape[0], shape[1]))
}

/// The backward kernel of the disjoint windows of `g` ([`disjoint_window`]) for the max or
/// the average, over channel vectors (`vec`: a thread per cell and 16-byte vector,
/// `bwd_cell_vec_disjoint`) or over rows of 16-byte vectors (a thread per vector of dx
/// columns, `bwd_strip_disjoint`). Both read each window's dy (and, for the max, its y and
/// the x under it) once and write every dx element under it, where the general cells read
/// one window at a time and write single elements: 2x2x2/s2 max f16 NCHW 142.1 -> 44.8
/// µs, NHWC (against the tiles) 71.3 -> 42.2 µs on 8x64x16x56x56 (H100).
fn disjoint_kernel(g: &Geometry, dtype: DataType, max: bool, vec: bool) -> Option<&'static str> {
    use kernels::*;
    match (disjoint_window(g)?, max, vec) {
        ((1, 2), false, false) => pooling_bwd_disjoint_strip_avg_2x2s2(dtype),
        ((1, 2), true, false) => pooling_bwd_disjoint_strip_max_2x2s2(dtype),
        ((2, 2), false, false) => pooling_bwd_disjoint_strip_avg_2x2x2s2(dtype),
        ((2, 2), true, false) => pooling_bwd_disjoint_strip_max_2x2x2s2(dtype),
        ((1, 2), false, true) => pooling_bwd_disjoint_vec_avg_2x2s2(dtype),
        ((1, 2), true, true) => pooling_bwd_disjoint_vec_max_2x2s2(dtype),
        ((2, 2), false, true) => pooling_bwd_disjoint_vec_avg_2x2x2s2(dtype),
        ((2, 2), true, true) => pooling_bwd_disjoint_vec_max_2x2x2s2(dtype),
        _ => None,
    }
}

/// The disjoint-window strip kernel ([`disjoint_kernel`] over rows) and the dx columns
/// each of its threads takes, if dx (and x, for the max) keeps its rows contiguous along w
/// in whole 16-byte vectors (unit w stride, the w extent and every other stride multiples
/// of the vector, aligned): a thread's vector of dx columns is then the x vector under
/// its windows.
fn disjoint_strip_kernel(
    g: &Geometry,
    dtype: DataType,
    max: bool,
    xs: &[u32; 5],
    dxs: &[u32; 5],
    aligned: bool,
) -> Option<(&'static str, usize)> {
    let v = 16 / dtype.size_bytes();
    let rows = |s: &[u32; 5]| rows_of_vectors(s, g.input[2], v);
    if !(aligned && rows(dxs) && (!max || rows(xs))) {
        return None;
    }
    Some((disjoint_kernel(g, dtype, max, false)?, v))
}

/// Cells per dim: cells tile the input from the first window's start, so the last input
/// is in cell `(in - 1 + pad) / stride`.
fn cells(g: &Geometry) -> [usize; 3] {
    std::array::from_fn(|k| (g.input[k] - 1 + g.pad[k]) / g.stride[k] + 1)
}

/// The algorithm [`pooling_backward`] runs (`vectors`: the operands take the 16-byte
/// channel-vector kernels), as measured on an H100 (`benches/pooling_vs_cudnn.rs` with
/// `OXIDNN_BENCH_POOLING_ALGOS=1`). Max, for windows small enough to scan once each (64
/// elements) and not global: the walk down bands of rows where a walk kernel takes the
/// window and the operands (`walk`: over channel vectors, [`walk_vec_plan`]: 56 against 89
/// µs for the cells on 3x3/s2/p1 f16 NHWC; over single channels, [`walk_plan`]: 66 against
/// 136 µs for the cells on 3x3/s2/p1 f16 NCHW); over channel vectors, a thread per cell
/// where a cell kernel is compiled for the window shape (winners found in registers: 89
/// against 150 µs for the tiles on 3x3/s2 f16 NHWC, 88 against 149 on 2x2/s2; disjoint 2x2
/// and 2x2x2 windows take [`disjoint_kernel`]), else shared-memory tiles (each window
/// scanned once for all the cells it overlaps: 1.4x faster than the generic cells on
/// 3x3/s2 f16 NHWC); over single channels, bands of rows for the stride-1 windows with
/// band kernels of their own
/// (each x element staged once, where a cell kernel's threads each reload their windows':
/// 61 against 112 µs on 3x3/s1/p1 f32 NCHW), a thread per cell where cells are small (a
/// few percent faster than the tiles, which amortise less over one channel; 3.7x for the
/// square 2-D windows with cell kernels of their own: 142 against 531 µs on 3x3/s2 f32
/// NCHW, where the general band kernel takes 314), tiles otherwise. Global
/// pooling and larger windows: the gather. Average: over channel vectors, cells for
/// disjoint 2x2 and 2x2x2 windows (their kernels of their own, [`disjoint_kernel`]), the gather
/// otherwise (the general vector cells: 49.9 against 37.8 µs on 2x2/s2 f16 NHWC); the
/// gather where a cell is one element (global pooling, whose gather is a kernel of its own
/// that copies each plane's scaled dy); cells otherwise (2x faster than the gather on
/// 2x2/s2 NCHW, 4x with the strip kernel: 51 against 203 µs in f32).
fn default_algo(
    pooling: &PoolingDescriptor,
    g: &Geometry,
    vectors: bool,
    walk: bool,
) -> PoolingBwdAlgo {
    let cell = cell_len(g);
    if pooling.mode.is_max() {
        if g.is_global() || g.volume() > 64 {
            PoolingBwdAlgo::Gather
        } else if walk || (!vectors && band_s1_shape(g).is_some() && band_plan(g).is_some()) {
            PoolingBwdAlgo::Tile
        } else if (vectors && (disjoint_window(g).is_some() || cell_region_vec_shape(g).is_some()))
            || (!vectors && cell <= POOLING_MAX_CELL)
        {
            PoolingBwdAlgo::Cell
        } else {
            PoolingBwdAlgo::Tile
        }
    } else if (vectors && disjoint_window(g).is_some())
        || (!vectors && (2..=POOLING_MAX_CELL).contains(&cell))
    {
        PoolingBwdAlgo::Cell
    } else {
        PoolingBwdAlgo::Gather
    }
}

/// Most dynamic shared memory a tile takes (below the 48 KB a launch may use unasked).
const TILE_MAX_SHARED_BYTES: usize = 32 << 10;
/// Most cells a tile holds (times its channel vectors).
const TILE_MAX_CELLS: usize = 256;

/// The tile of the shared-memory max backward for `vectors` (of `channel_vectors`) channel
/// vectors of `k` channels per block: grown from one cell by doubling the dim whose
/// windows overlap the tile most (preferring w, then h), while the cells and the shared
/// memory fit. `None` if even one cell's windows do not fit.
fn tile_plan(g: &Geometry, channel_vectors: usize, k: usize) -> Option<PoolTile> {
    let (cells, wpc) = (cells(g), windows_per_cell(g));
    let vectors = channel_vectors.min(8);
    let shared = |t: &[usize; 3]| -> usize {
        (0..3).map(|d| t[d] + wpc[d] - 1).product::<usize>() * vectors * k * 8
    };
    let mut t = [1usize; 3];
    if shared(&t) > TILE_MAX_SHARED_BYTES {
        return None;
    }
    loop {
        let overhead = |d: usize| (t[d] + wpc[d] - 1) as f64 / t[d] as f64 + 1e-3 * d as f64;
        let Some(d) = (0..3)
            .filter(|&d| t[d] < cells[d] && t[d] < 64)
            .max_by(|&a, &b| overhead(a).total_cmp(&overhead(b)))
        else {
            break;
        };
        let mut next = t;
        next[d] = (t[d] * 2).min(cells[d]);
        if next.iter().product::<usize>() * vectors > TILE_MAX_CELLS
            || shared(&next) > TILE_MAX_SHARED_BYTES
        {
            break;
        }
        t = next;
    }
    let div = |v: usize| FastDivisor::new(v as u32);
    Some(PoolTile {
        cells: t.map(|v| v as u32),
        count: std::array::from_fn(|d| div(cells[d].div_ceil(t[d]))),
        windows: std::array::from_fn(|d| div(t[d] + wpc[d] - 1)),
        elements: std::array::from_fn(|d| div(t[d] * g.stride[d])),
        vectors: div(vectors),
        vector_blocks: div(channel_vectors.div_ceil(vectors)),
        channel_vectors: channel_vectors as u32,
        window_count: (0..3).map(|d| t[d] + wpc[d] - 1).product::<usize>() as u32,
        element_count: (0..3).map(|d| t[d] * g.stride[d]).product::<usize>() as u32,
    })
}

/// Most dynamic shared memory a band takes.
const BAND_MAX_SHARED_BYTES: usize = 32 << 10;
/// dx elements a band aims at: eight a thread.
const BAND_ELEMENTS: usize = 8 * BLOCK_THREADS as usize;

/// The band of the shared-memory max backward over single channels (`bwd_band_max`): 2-D
/// windows (the depth window 1 at stride 1, unpadded), a block per `rows` dx rows of one
/// plane, as many as make `BAND_ELEMENTS` elements (the whole plane where it is smaller),
/// halved while the x rows its windows cover and their y and dy take more than
/// `BAND_MAX_SHARED_BYTES`. `None` if one row's do.
fn band_plan(g: &Geometry) -> Option<PoolBand> {
    if !g.planes_pass_through() {
        return None;
    }
    let (height, width, out_width) = (g.input[1], g.input[2], g.output[2]);
    let (window, stride) = (g.window[1], g.stride[1]);
    let run = POOLING_BAND_RUN;
    let div = |v: usize| FastDivisor::new(v as u32);
    let mut rows = (BAND_ELEMENTS / width).clamp(1, height);
    loop {
        // At most ceil((rows + window - 1) / stride) windows overlap `rows` rows.
        let window_rows = (rows + window - 1).div_ceil(stride).min(g.output[1]);
        let band = PoolBand {
            rows: rows as u32,
            x_rows: ((window_rows - 1) * stride + window).min(height) as u32,
            window_rows: window_rows as u32,
            x_pitch: width.next_multiple_of(run) as u32,
            window_pitch: out_width.max(width).next_multiple_of(run) as u32,
            output_w: div(out_width),
            window_runs: div(out_width.div_ceil(run)),
            dx_runs: div(width.div_ceil(run)),
        };
        if band.shared_bytes() as usize <= BAND_MAX_SHARED_BYTES {
            return Some(band);
        }
        if rows == 1 {
            return None;
        }
        rows /= 2;
    }
}

/// The window and padding along w of the band kernels compiled for a shape, if this is
/// one: 2x2 unpadded along w, or 3x3 unpadded or padded by 1, at stride 1.
/// (`bwd_band_max_s1`: its loops unrolled, a thread per run of `POOLING_BAND_RUN` windows
/// or dx elements.)
fn band_s1_shape(g: &Geometry) -> Option<(usize, usize)> {
    let w = g.window[2];
    let shape = (w, g.pad[2]);
    let compiled = matches!(shape, (2, 0) | (3, 0) | (3, 1));
    (compiled && g.window == [1, w, w] && g.stride == [1; 3] && g.planes_pass_through())
        .then_some(shape)
}

/// The band kernel for this window: compiled for its shape, or the general one.
fn band_kernel(g: &Geometry, dtype: DataType) -> Option<&'static str> {
    match band_s1_shape(g) {
        Some((2, 0)) => kernels::pooling_bwd_band_max_2x2s1p0(dtype),
        Some((3, 0)) => kernels::pooling_bwd_band_max_3x3s1p0(dtype),
        Some((3, 1)) => kernels::pooling_bwd_band_max_3x3s1p1(dtype),
        _ => kernels::pooling_bwd_band_max(dtype),
    }
}

/// The padding along w of the walk kernels compiled for a shape
/// (`pooling_bwd_walk_max_3x3s2p<P>_*`), if this is one: square 2-D windows of 3x3 at
/// stride 2, unpadded or padded by 1 along w, any padding along h.
fn walk_shape(g: &Geometry) -> Option<usize> {
    let compiled = g.window == [1, 3, 3] && g.stride == [1, 2, 2] && g.pad[2] <= 1;
    (compiled && g.planes_pass_through()).then_some(g.pad[2])
}

/// The max backward that walks down bands of rows over single channels (`bwd_walk_max`),
/// if its kernel is compiled for the window ([`walk_shape`]) and x and dx keep their rows
/// as whole, aligned 16-byte vectors (`pooling_walk_columns`: unit w stride, the w extent
/// and every other stride multiples of it) that fit one warp's lanes (up to 32 vectors: w
/// up to 128 in f32, 256 in 16-bit types): a group of lanes, as many as the row has
/// vectors rounded up to a power of two, per band of rows of windows of one plane (a lane
/// over 8 f16 columns, not 4, took the stem's f16 backward from 66.2 to 61.0 µs). Each x,
/// y, dy and dx element crosses memory once, where the cell kernel reloads the x under
/// every window of its cells and the band kernel stages all of them in shared memory.
///
/// Every group walks its band's rows of windows plus the one before (whose rows it shares)
/// and one past its end, and the groups run in waves of as many as fit the GPU at once,
/// each as long as a band: the bands are those of the fewest waves times steps (fewer
/// bands on a tie). On the stem's 32x64x112x112 (2048 planes, 56 rows of windows; H100)
/// that is 2 bands of 28 in f16, one wave of 32 groups an SM (16 warps of two), and 3
/// bands of 19 in f32, two waves of 24 warps an SM (105.6 µs; with 2 bands, 1.3 waves,
/// 122.7 µs; 4 bands 110.8; 7 bands 112.1). (Measured with lanes of 4 f16 columns, 32
/// warps an SM: 2 bands, one wave, 66.1 µs; 4 bands, two waves, 68.9.)
fn walk_plan(
    g: &Geometry,
    dtype: DataType,
    xs: &[u32; 5],
    dxs: &[u32; 5],
    aligned: bool,
    gpu: &Gpu,
) -> Result<Option<(&'static str, PoolWalk, PoolItems)>> {
    let v = pooling_walk_columns(dtype.size_bytes());
    let rows = |s: &[u32; 5]| rows_of_vectors(s, g.input[2], v);
    let fits = g.input[2] <= 32 * v;
    let Some(kernel) = walk_shape(g)
        .filter(|_| aligned && fits && rows(xs) && rows(dxs))
        .and_then(|pad| match pad {
            1 => kernels::pooling_bwd_walk_max_3x3s2p1(dtype),
            _ => kernels::pooling_bwd_walk_max_3x3s2p0(dtype),
        })
    else {
        return Ok(None);
    };
    let lanes = (g.input[2] / v).next_power_of_two();
    let warps = resident_with(gpu, kernel, BLOCK_THREADS, 0)? * BLOCK_THREADS as usize / 32;
    let at_once = gpu.sm_count as usize * warps * (32 / lanes);
    let planes = g.n * g.c * g.input[0];
    let (bands, walk) = walk_bands(g, planes, at_once);
    let walk = PoolWalk {
        lanes: lanes as u32,
        ..walk
    };
    Ok(Some((
        kernel,
        walk,
        items([g.n, g.c, g.input[0], bands, 1], false)?,
    )))
}

/// The max backward that walks down bands of rows over channel vectors
/// (`bwd_walk_vec_max`), if its kernel is compiled for the window (3x3 at stride 2,
/// ResNet's stem, or 1, Inception's pools; any padding) and every operand keeps its
/// channels in vectors of `pooling_walk_vec_channels` (`vectors`): a thread per cell
/// column (the `stride` dx columns from a window's start), vector of channels and band of
/// rows of windows. Each thread reads the x rows its windows cover once, keeping the rows
/// shared by consecutive rows of windows in registers, where the cell kernel reloads the
/// 5x5 x positions around every 2x2 cell (mostly from L2): 88.8 -> 56.0 µs on the stem's
/// f16 NHWC backward (H100), and the tile kernel stages 3x3/s1 windows' winners in shared
/// memory (99.0 -> 53.8 µs on Inception's f16 NHWC 32x192x28x28, H200). Bands as
/// [`walk_plan`]'s, a thread for a group (2 bands of 28 rows of windows on the stem, two
/// blocks an SM).
fn walk_vec_plan(
    g: &Geometry,
    dtype: DataType,
    vectors: bool,
    gpu: &Gpu,
) -> Result<Option<(&'static str, PoolWalk, PoolItems)>> {
    // Where the output has one row (or column) of windows, the geometry's stride along it
    // is 1, and any stride is the kernel's.
    let strides = |s: usize| (1..3).all(|k| g.stride[k] == s || g.output[k] == 1);
    let walks = vectors && g.window == [1, 3, 3] && g.planes_pass_through();
    let Some(stride) = [2, 1].into_iter().find(|&s| walks && strides(s)) else {
        return Ok(None);
    };
    let kernel = match stride {
        2 => kernels::pooling_bwd_walk_vec_max_3x3s2(dtype),
        _ => kernels::pooling_bwd_walk_vec_max_3x3s1(dtype),
    };
    let Some(kernel) = kernel else {
        return Ok(None);
    };
    let at_once = gpu.sm_count as usize
        * resident_with(gpu, kernel, BLOCK_THREADS, 0)?
        * BLOCK_THREADS as usize;
    let cells_w = (g.input[2] - 1 + g.pad[2]) / stride + 1;
    let channel_vectors = g.c / pooling_walk_vec_channels(dtype.size_bytes());
    let (bands, walk) = walk_bands(g, g.n * channel_vectors * g.input[0] * cells_w, at_once);
    let items = items([g.n, channel_vectors, g.input[0], bands, cells_w], true)?;
    Ok(Some((kernel, walk, items)))
}

/// The bands of rows of windows a walk takes (`PoolWalk`'s rows of windows and steps, and
/// how many bands), for `groups` groups a band of which `at_once` fit the GPU at once.
/// Every group walks its band's rows of windows plus the ones before (whose rows it
/// shares) and one past its end, and the groups run in waves, each as long as a band: the
/// bands are those of the fewest waves times steps (fewer bands on a tie).
fn walk_bands(g: &Geometry, groups: usize, at_once: usize) -> (usize, PoolWalk) {
    // Rows of windows a band shares with the one before.
    let shared = (g.window[1] - 1) / g.stride[1];
    let out_h = g.output[1];
    let cost = |bands: usize| {
        let steps = out_h.div_ceil(bands) + shared + 1;
        (groups * bands).div_ceil(at_once.max(1)) * steps
    };
    let bands = (1..=out_h).min_by_key(|&b| cost(b)).unwrap_or(1);
    let window_rows = out_h.div_ceil(bands);
    let walk = PoolWalk {
        lanes: 1,
        window_rows: window_rows as u32,
        steps: (window_rows + shared + 1) as u32,
    };
    (out_h.div_ceil(window_rows), walk)
}

fn backward_plan(
    pooling: &PoolingDescriptor,
    g: &Geometry,
    [x_desc, y_desc, dy_desc, dx_desc]: [&TensorDescriptor; 4],
    aligned: bool,
    gpu: &Gpu,
    algo: Option<PoolingBwdAlgo>,
) -> Result<BackwardPlan> {
    g.check_gpu_limits()?;
    let dtype = x_desc.dtype();
    let max = pooling.mode.is_max();
    let strides = [x_desc, y_desc, dy_desc, dx_desc]
        .map(strides5)
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    // Average pooling reads neither x nor y.
    let read = if max { &strides[..] } else { &strides[2..] };
    let vectors = |k: usize| aligned && channel_vectors(g.c, k, read);
    // Whether the operands take 16-byte channel vectors.
    let vectors16 = vectors(16 / dtype.size_bytes());
    // The max backward's walks: over rows of single channels, else over channel vectors.
    let walk = if !max {
        None
    } else if let Some(rows) = walk_plan(g, dtype, &strides[0], &strides[3], aligned, gpu)? {
        Some(rows)
    } else {
        let k = pooling_walk_vec_channels(dtype.size_bytes());
        walk_vec_plan(g, dtype, vectors(k), gpu)?
    };
    let algo = algo.unwrap_or_else(|| default_algo(pooling, g, vectors16, walk.is_some()));
    match algo {
        PoolingBwdAlgo::Cell if cell_len(g) > POOLING_MAX_CELL => {
            return Err(Error::unsupported(format!(
                "the cell backward for strides {:?} (cells of at most {POOLING_MAX_CELL} elements)",
                pooling.stride()
            )))
        }
        PoolingBwdAlgo::Tile if !max => {
            return Err(Error::unsupported("the tile backward of average pooling"))
        }
        _ => {}
    }
    // The cells of disjoint windows over 16-byte channel vectors, if compiled.
    let disjoint_vec = if algo == PoolingBwdAlgo::Cell && vectors16 {
        disjoint_kernel(g, dtype, max, true)
    } else {
        None
    };
    // Channels per thread: a 16-byte vector, or POOLING_CELL_VECTOR for the general cells
    // (whose accumulators are a cell's elements times these).
    let k = if algo == PoolingBwdAlgo::Cell && disjoint_vec.is_none() {
        POOLING_CELL_VECTOR
    } else {
        16 / dtype.size_bytes()
    };
    let vec = vectors(k);
    let c = if vec { g.c / k } else { g.c };
    use PoolingBwdAlgo::{Cell, Gather, Tile};
    // The global average over dx planes back to back and aligned: the flat kernel, a
    // thread per 16-byte vector of dx.
    let global_avg_flat = (algo, vec, max) == (Gather, false, false)
        && g.is_global()
        && aligned
        && spatial_run(&strides[3], g.input) == Some(1)
        && planes_back_to_back(&strides[3], g);
    // Kernels compiled for a window shape, with the dx columns each thread takes.
    let disjoint_strip = if (algo, vec) == (Cell, false) {
        disjoint_strip_kernel(g, dtype, max, &strides[0], &strides[3], aligned)
    } else {
        None
    };
    let shaped = match (algo, vec, max) {
        (Cell, false, _) if disjoint_strip.is_some() => disjoint_strip,
        (Cell, false, true) => cell_region_kernel(g, dtype),
        _ => None,
    };
    // The tile backward walks down bands of rows in registers where a walk kernel takes
    // them (over single channels or channel vectors), else, over single channels, stages
    // bands of whole rows where they fit.
    if let (Tile, Some((kernel, walk, items))) = (algo, walk) {
        let threads = items.len as u64 * walk.lanes as u64;
        return Ok(BackwardPlan {
            kernel,
            algo,
            items,
            tile: PoolTile::default(),
            band: PoolBand::default(),
            walk,
            cfg: LaunchConfig::for_threads(threads, BLOCK_THREADS)?,
        });
    }
    let band = if (algo, vec) == (Tile, false) {
        band_plan(g)
    } else {
        None
    };
    let kernel = match (algo, vec, max) {
        (Tile, true, _) => kernels::pooling_bwd_tile_vec_max(dtype),
        (Tile, false, _) if band.is_some() => band_kernel(g, dtype),
        (Tile, false, _) => kernels::pooling_bwd_tile_max(dtype),
        (Cell, true, true) => disjoint_vec
            .or_else(|| cell_region_vec_kernel(g, dtype))
            .or_else(|| kernels::pooling_bwd_cell_vec_max(dtype)),
        (Cell, true, false) => disjoint_vec.or_else(|| kernels::pooling_bwd_cell_vec_avg(dtype)),
        (Cell, false, _) if shaped.is_some() => shaped.map(|(k, _)| k),
        (Cell, false, true) => kernels::pooling_bwd_cell_max(dtype),
        (Cell, false, false) => kernels::pooling_bwd_cell_avg(dtype),
        (Gather, true, true) => kernels::pooling_bwd_gather_vec_max(dtype),
        (Gather, true, false) if g.is_global() => kernels::pooling_bwd_global_vec_avg(dtype),
        (Gather, true, false) => kernels::pooling_bwd_gather_vec_avg(dtype),
        (Gather, false, true) => kernels::pooling_bwd_gather_max(dtype),
        (Gather, false, false) if global_avg_flat => kernels::pooling_bwd_global_avg_flat(dtype),
        (Gather, false, false) if g.is_global() => kernels::pooling_bwd_global_avg(dtype),
        (Gather, false, false) => kernels::pooling_bwd_gather_avg(dtype),
    }
    .ok_or_else(|| unsupported("backward", dtype))?;
    if let Some(band) = band {
        let bands = g.input[1].div_ceil(band.rows as usize);
        let items = items([g.n, g.c, g.input[0], bands, 1], false)?;
        let mut cfg =
            LaunchConfig::for_threads(items.len as u64 * BLOCK_THREADS as u64, BLOCK_THREADS)?;
        cfg.shared_bytes = band.shared_bytes();
        return Ok(BackwardPlan {
            kernel,
            algo,
            items,
            tile: PoolTile::default(),
            band,
            walk: PoolWalk::default(),
            cfg,
        });
    }
    if algo == Tile {
        let tile = tile_plan(g, c, if vec { k } else { 1 }).ok_or_else(|| {
            Error::unsupported(format!(
                "the tile backward for windows {:?} with strides {:?} (too many windows per tile)",
                pooling.window(),
                pooling.stride()
            ))
        })?;
        let blocks = (g.n * tile.vector_blocks.divisor as usize) as u64
            * tile.count.iter().map(|d| d.divisor as u64).product::<u64>();
        let mut cfg = LaunchConfig::for_threads(blocks * BLOCK_THREADS as u64, BLOCK_THREADS)?;
        cfg.shared_bytes = tile.shared_bytes(if vec { k as u32 } else { 1 });
        return Ok(BackwardPlan {
            kernel,
            algo,
            items: PoolItems::default(),
            tile,
            band: PoolBand::default(),
            walk: PoolWalk::default(),
            cfg,
        });
    }
    let [d, h, w] = match (algo, shaped) {
        (Cell, Some((_, columns))) => {
            let [d, h, _] = cells(g);
            [d, h, g.input[2].div_ceil(columns)]
        }
        (Cell, None) => cells(g),
        _ => g.input,
    };
    let items = items([g.n, c, d, h, w], vec || channels_last(&strides[3]))?;
    let cfg = if disjoint_vec.is_some() || disjoint_strip.is_some() {
        // A thread per `POOLING_STRIPS_PER_TURN` cells or strips, all their loads in
        // flight at once (as the forward strips).
        let threads = (items.len as u64).div_ceil(POOLING_STRIPS_PER_TURN);
        LaunchConfig::for_threads(threads, BLOCK_THREADS)?
    } else {
        let per_thread = if global_avg_flat {
            16 / dtype.size_bytes()
        } else {
            1
        };
        grid_stride_config((items.len as u64).div_ceil(per_thread as u64), gpu.sm_count)?
    };
    Ok(BackwardPlan {
        kernel,
        algo,
        items,
        tile: PoolTile::default(),
        band: PoolBand::default(),
        walk: PoolWalk::default(),
        cfg,
    })
}

fn launch_backward(
    gpu: &Gpu,
    plan: &BackwardPlan,
    win: PoolWindow,
    g: &Geometry,
    [x_desc, y_desc, dy_desc, dx_desc]: [&TensorDescriptor; 4],
    ptrs: &[u64; 4],
) -> Result<()> {
    let mut p = PoolingBwdParams {
        win,
        items: plan.items,
        stride_div: g.stride.map(|s| FastDivisor::new(s as u32)),
        input_hw: [g.input[1], g.input[2]].map(|v| FastDivisor::new(v as u32)),
        windows_per_cell: windows_per_cell(g).map(|v| v as u32),
        cell_len: 0,
        cell_slots: [0; POOLING_MAX_CELL],
        tile: plan.tile,
        band: plan.band,
        walk: plan.walk,
        plane_len: FastDivisor::new(g.input.iter().product::<usize>() as u32),
        x: strides5(x_desc)?,
        y: strides5(y_desc)?,
        dy: strides5(dy_desc)?,
        dx: strides5(dx_desc)?,
    };
    if plan.algo == PoolingBwdAlgo::Cell {
        let [sd, sh, sw] = g.stride;
        let mut j = 0;
        for d in 0..sd {
            for h in 0..sh {
                for w in 0..sw {
                    p.cell_slots[j] = (d | h << 8 | w << 16) as u32;
                    j += 1;
                }
            }
        }
        p.cell_len = j as u32;
    }
    // SAFETY: every buffer holds its descriptor's span (checked by the caller); items
    // cover dx's dims (or cells of them, whose elements are bounds-checked against x's
    // dims before any access), windows stay inside y's and dy's dims and their elements
    // inside x's, so every offset is inside its buffer; dx's offsets are distinct
    // (check_output) and each is written by one thread. The vector kernels run only on
    // channel-contiguous, 16-byte aligned operands; the shaped cell kernels only on their
    // window shapes, with dx vector stores only where dx allows them (checked in the
    // kernel, or by disjoint_strip_kernel for the disjoint-window strips, which load x
    // rows as vectors only where x allows them too); the band kernel only on 2-D
    // windows, with the shared memory band_plan sized for its rows; the walk kernels only
    // on x and dx rows of whole aligned 16-byte vectors, no more than the group's lanes
    // (walk_plan), its groups counting the bands of dx's planes, and the channel-vector
    // walk only on 3x3 windows over aligned channel vectors of its width, its items
    // counting them, the depth, the bands and the cell columns (walk_vec_plan); the flat
    // global average only on aligned dx whose planes lie back to back, its items counting
    // dx's elements and plane_len their planes' volume.
    unsafe { gpu.launch(plan.kernel, plan.cfg, &p, ptrs) }
}
