//! Cross-channel local response normalization (cudnnLRNCrossChannelForward /
//! cudnnLRNCrossChannelBackward, mode CUDNN_LRN_CROSS_CHANNEL_DIM1).
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! let desc = TensorDescriptor::nchw(DataType::F32, 1, 3, 1, 1)?;
//! let x = handle.upload(&[1.0f32, 2.0, 3.0])?;
//! let mut y = handle.alloc(&desc)?;
//! // n = 3 (one channel either side), alpha = 3, beta = 1, k = 1: y_c = x_c / (1 + sum x^2).
//! let lrn = LrnDescriptor::new(3, 3.0, 1.0, 1.0)?;
//! lrn_cross_channel_forward(&handle, &lrn, 1.0, &desc, &x, 0.0, &desc, &mut y)?;
//! let want = [1.0 / 6.0, 2.0 / 15.0, 3.0 / 14.0];
//! for (got, want) in handle.read::<f32>(&y)?.iter().zip(want) {
//!     assert!((*got as f64 - want).abs() < 1e-6 * want);
//! }
//! # Ok::<(), oxidnn::Error>(())
//! ```
//!
//! With `n` the window width, channel `c`'s window is `[c - lb, c + la]`, `lb = (n - 1) /
//! 2`, `la = n - 1 - lb` (cuDNN's placement: for even `n` one more channel after the
//! centre), clipped to the tensor; `s_c = k + alpha / n * sum of x^2 over the window`,
//! `y_c = x_c * s_c^-beta`. Dim 1 is the channel dim; tensors have 3 to 8 dims, any strides.
//!
//! Backward computes the exact gradient of `y(x)` from `x` and `dy`; the forward output `y`
//! is taken and validated as cuDNN takes it, but recomputed rather than read (one tensor
//! less to move, and exact even where `y` was written blended).
//!
//! On the GPU, tensors whose channels have unit stride (NHWC) take "channels-last" kernels:
//! lanes of a pixel take runs of its channels (16-byte accesses); any other layout (NCHW:
//! consecutive threads on consecutive pixels) walks the channels. For `n = 5` (cuDNN's
//! default and AlexNet's and GoogLeNet's width) both have the width compiled in: the walk
//! keeps its window in registers, a channels-last lane loads the channels around its run,
//! and each window is summed afresh in f32. For other widths the channels-last kernels
//! stage each pixel's squares in shared memory, and the walk keeps running sums of squares
//! in f64 (adding a channel and later removing it cancel exactly) and its recent channels
//! in shared-memory rings.

use super::layout::fold;
use super::{host_read, host_write, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference;
use oxidnn_params::{
    lrn_pixel_slots, packed_vector_elements, FastDivisor, LrnParams, LRN_CL_BWD_SLOT_BYTES,
    LRN_CL_FWD_SLOT_BYTES, LRN_WALK_BWD_SLOT_BYTES, LRN_WALK_FWD_SLOT_BYTES,
};

/// The smallest window width (CUDNN_LRN_MIN_N).
pub const LRN_MIN_N: u32 = 1;
/// The largest window width (CUDNN_LRN_MAX_N).
pub const LRN_MAX_N: u32 = 16;
/// The smallest k (CUDNN_LRN_MIN_K).
pub const LRN_MIN_K: f64 = 1e-5;
/// The smallest beta (CUDNN_LRN_MIN_BETA).
pub const LRN_MIN_BETA: f64 = 0.01;

/// LRN parameters (cuDNN's `cudnnLRNDescriptor_t`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrnDescriptor {
    n: u32,
    alpha: f64,
    beta: f64,
    k: f64,
}

impl Default for LrnDescriptor {
    /// cudnnCreateLRNDescriptor's defaults (Krizhevsky et al. 2012): n = 5, alpha = 1e-4,
    /// beta = 0.75, k = 2.
    fn default() -> Self {
        Self {
            n: 5,
            alpha: 1e-4,
            beta: 0.75,
            k: 2.0,
        }
    }
}

impl LrnDescriptor {
    /// Window width `n` in `[LRN_MIN_N, LRN_MAX_N]`, finite `alpha`, `beta >= LRN_MIN_BETA`,
    /// `k >= LRN_MIN_K` (cudnnSetLRNDescriptor's limits). The kernels compute in f32, so the
    /// values are used rounded to f32 (cuDNN: "cast to the tensor data type").
    pub fn new(n: u32, alpha: f64, beta: f64, k: f64) -> Result<Self> {
        if !(LRN_MIN_N..=LRN_MAX_N).contains(&n) {
            return Err(Error::bad(
                "lrn_n",
                format!("the window width must be in [{LRN_MIN_N}, {LRN_MAX_N}], got {n}"),
            ));
        }
        if !alpha.is_finite() {
            return Err(Error::bad(
                "lrn_alpha",
                format!("must be finite, got {alpha}"),
            ));
        }
        if !(beta >= LRN_MIN_BETA && beta.is_finite()) {
            return Err(Error::bad(
                "lrn_beta",
                format!("must be finite and >= {LRN_MIN_BETA}, got {beta}"),
            ));
        }
        if !(k >= LRN_MIN_K && k.is_finite()) {
            return Err(Error::bad(
                "lrn_k",
                format!("must be finite and >= {LRN_MIN_K}, got {k}"),
            ));
        }
        Ok(Self { n, alpha, beta, k })
    }

    /// The window width.
    pub fn n(&self) -> u32 {
        self.n
    }
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
    pub fn beta(&self) -> f64 {
        self.beta
    }
    pub fn k(&self) -> f64 {
        self.k
    }
    /// Channels of the window before its centre: `(n - 1) / 2`.
    pub fn look_behind(&self) -> u32 {
        (self.n - 1) / 2
    }
    /// Channels of the window after its centre: `n - 1 - look_behind`.
    pub fn look_ahead(&self) -> u32 {
        self.n - 1 - self.look_behind()
    }
}

/// Checks the tensors of one call: at least 3 dims, all dims and dtypes alike, the output
/// writable.
fn validate(x_desc: &TensorDescriptor, others: &[(&'static str, &TensorDescriptor)]) -> Result<()> {
    if x_desc.rank() < 3 {
        return Err(Error::bad(
            "x_desc",
            format!(
                "LRN needs at least 3 dims (N, C, spatial..), got {:?}",
                x_desc.dims()
            ),
        ));
    }
    for (arg, d) in others {
        check_same_dims(arg, x_desc, d)?;
        check_same_dtype(arg, x_desc, d)?;
    }
    if let Some((arg, out)) = others.last() {
        check_output(arg, out)?;
    }
    if x_desc.dims()[1] > i32::MAX as usize {
        return Err(Error::unsupported(format!(
            "{} channels (at most 2^31 - 1)",
            x_desc.dims()[1]
        )));
    }
    Ok(())
}

/// Forward or backward.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Forward,
    Backward,
}

/// Shared memory the channels-last kernels may take per block.
const CHANNELS_LAST_SMEM_LIMIT: u32 = 64 * 1024;
/// Shared memory the ring walk kernels take per block, at most.
const WALK_SMEM_LIMIT: u32 = 48 * 1024;
/// Threads per block of the walk kernels (fewer for the ring kernels where their rings
/// would pass [`WALK_SMEM_LIMIT`]).
const WALK_BLOCK: u32 = 256;

/// Threads per block of the channels-last kernels.
const CHANNELS_LAST_BLOCK: u32 = 256;

/// The channels-last kernel with window width `n` compiled in (no staging), where one is
/// built.
fn fixed_channels_last_kernel(dir: Direction, n: u32, dtype: DataType) -> Option<&'static str> {
    match (dir, n) {
        (Direction::Forward, 5) => kernels::lrn_fwd_channels_last_n5(dtype),
        (Direction::Backward, 5) => kernels::lrn_bwd_channels_last_n5(dtype),
        _ => None,
    }
}

/// The walk kernel with window width `n` compiled in (no rings), where one is built.
fn fixed_walk_kernel(dir: Direction, n: u32, dtype: DataType) -> Option<&'static str> {
    match (dir, n) {
        (Direction::Forward, 5) => kernels::lrn_fwd_walk_n5(dtype),
        (Direction::Backward, 5) => kernels::lrn_bwd_walk_n5(dtype),
        _ => None,
    }
}

/// Channel segments per pixel for the walk kernels: the count minimising a simple cost
/// model, waves of resident threads times the channels each thread walks (its segment plus
/// the window's warm-up, `warm_up` channels), so that small pixel counts still fill the GPU
/// without splitting channels more than pays.
fn walk_segments(pixels: u64, channels: u64, warm_up: u64, resident_threads: u64) -> u64 {
    let mut best = (u64::MAX, 1);
    for segments in 1..=channels.min(64) {
        let segment_len = channels.div_ceil(segments);
        if segments > 1 && channels.div_ceil(segment_len) < segments {
            continue; // the same split as a smaller count
        }
        let waves = (segments * pixels).div_ceil(resident_threads.max(1));
        let cost = waves * (segment_len + warm_up);
        if cost < best.0 {
            best = (cost, segments);
        }
    }
    best.1
}

/// The kernel, its parameters and its grid for one call. `descs`: forward `[x, y, y]`,
/// backward `[x, dy, dx]`.
fn plan(
    gpu: &Gpu,
    dir: Direction,
    lrn: &LrnDescriptor,
    (alpha, beta): (f32, f32),
    descs: [&TensorDescriptor; 3],
) -> Result<(&'static str, LrnParams, LaunchConfig)> {
    let x = descs[0];
    let dtype = x.dtype();
    let channels = x.dims()[1];
    // Every dim but the channel dim, folded; consecutive threads on the output's
    // innermost pixels.
    let pixel_dims: Vec<usize> = x
        .dims()
        .iter()
        .enumerate()
        .filter(|(d, _)| *d != 1)
        .map(|(_, &n)| n)
        .collect();
    let pixel_strides: [Vec<usize>; 3] = std::array::from_fn(|k| {
        descs[k]
            .strides()
            .iter()
            .enumerate()
            .filter(|(d, _)| *d != 1)
            .map(|(_, &s)| s)
            .collect()
    });
    let folded = fold(
        &pixel_dims,
        [&pixel_strides[0], &pixel_strides[1], &pixel_strides[2]],
        2,
    );
    let pixels = folded.len();
    let mut p = LrnParams {
        channels: channels as u32,
        look_behind: lrn.look_behind(),
        look_ahead: lrn.look_ahead(),
        alpha_over_n: (lrn.alpha / lrn.n as f64) as f32,
        beta: lrn.beta as f32,
        k: lrn.k as f32,
        blend_alpha: alpha,
        blend_beta: beta,
        grad_coef: (2.0 * lrn.alpha * lrn.beta / lrn.n as f64) as f32,
        pixels: pixels as u32,
        pixels_div: FastDivisor::new(pixels as u32),
        channel_strides: std::array::from_fn(|k| descs[k].strides()[1] as u64),
        pixel_map: folded.index_map()?,
        ..LrnParams::default()
    };
    let unsupported = || Error::unsupported(format!("LRN on {dtype} tensors on the GPU"));

    // Channels-last: unit channel stride everywhere; with the window width compiled in
    // (no staging) any channel count, else where a pixel's staging fits.
    let vector = packed_vector_elements(dtype.size_bytes()) as u32;
    let unit_channels = channels == 1 || descs.iter().all(|d| d.strides()[1] == 1);
    if unit_channels {
        let c = channels as u32;
        let group = c.div_ceil(vector).next_power_of_two().min(32);
        let full_block_pixels = CHANNELS_LAST_BLOCK / group;
        let staged = || {
            let slots = lrn_pixel_slots(c, vector);
            let slot_bytes = match dir {
                Direction::Forward => LRN_CL_FWD_SLOT_BYTES,
                Direction::Backward => LRN_CL_BWD_SLOT_BYTES,
            };
            let per_pixel = slots as u64 * slot_bytes as u64;
            let pixels_per_block =
                (full_block_pixels as u64).min(CHANNELS_LAST_SMEM_LIMIT as u64 / per_pixel) as u32;
            let kernel = match dir {
                Direction::Forward => kernels::lrn_fwd_channels_last(dtype),
                Direction::Backward => kernels::lrn_bwd_channels_last(dtype),
            };
            (kernel, pixels_per_block, slots, per_pixel as u32)
        };
        let (kernel, pixels_per_block, slots, bytes_per_pixel) =
            match fixed_channels_last_kernel(dir, lrn.n, dtype) {
                Some(kernel) => (Some(kernel), full_block_pixels, 0, 0),
                None => staged(),
            };
        if pixels_per_block > 0 {
            p.group = group;
            p.pixels_per_block = pixels_per_block;
            p.pixel_slots = slots;
            p.vectorized = (c.is_multiple_of(vector)
                && folded
                    .strides
                    .iter()
                    .flatten()
                    .all(|&s| s.is_multiple_of(vector as usize))) as u32;
            let kernel = kernel.ok_or_else(unsupported)?;
            let blocks = (pixels as u64).div_ceil(pixels_per_block as u64);
            let cfg = LaunchConfig {
                grid: u32::try_from(blocks).map_err(|_| unsupported())?,
                grid_y: 1,
                block: group * pixels_per_block,
                shared_bytes: bytes_per_pixel * pixels_per_block,
            };
            return Ok((kernel, p, cfg));
        }
    }

    // Walk: each thread a pixel and a segment of its channels, with the window width
    // compiled in where a kernel has it, else with rings of recent channels in shared
    // memory.
    let n = lrn.n;
    let (kernel, block, shared_bytes) = match fixed_walk_kernel(dir, n, dtype) {
        Some(kernel) => (kernel, WALK_BLOCK, 0),
        None => {
            let ring = n.next_power_of_two();
            let slot_bytes = match dir {
                Direction::Forward => LRN_WALK_FWD_SLOT_BYTES,
                Direction::Backward => LRN_WALK_BWD_SLOT_BYTES,
            };
            let mut block = WALK_BLOCK;
            while block > 32 && block * ring * slot_bytes > WALK_SMEM_LIMIT {
                block /= 2;
            }
            p.ring = ring;
            let kernel = match dir {
                Direction::Forward => kernels::lrn_fwd_walk(dtype),
                Direction::Backward => kernels::lrn_bwd_walk(dtype),
            }
            .ok_or_else(unsupported)?;
            (kernel, block, block * ring * slot_bytes)
        }
    };
    let warm_up = match dir {
        Direction::Forward => n - 1,
        Direction::Backward => 2 * (n - 1),
    };
    let resident = gpu.sm_count as u64
        * gpu.resident_blocks(kernel, block, shared_bytes)? as u64
        * block as u64;
    let segments = walk_segments(pixels as u64, channels as u64, warm_up as u64, resident);
    let segment_len = channels.div_ceil(segments as usize);
    let segments = channels.div_ceil(segment_len) as u64;
    let threads = segments * pixels as u64;
    if threads > u32::MAX as u64 {
        return Err(Error::unsupported(format!(
            "LRN over {pixels} pixels x {segments} channel segments (at most 2^32 - 1 threads)"
        )));
    }
    p.threads = threads as u32;
    p.segment_len = segment_len as u32;
    let mut cfg = LaunchConfig::for_threads(threads, block)?;
    cfg.shared_bytes = shared_bytes;
    Ok((kernel, p, cfg))
}

/// The kernel [`lrn_cross_channel_forward`] (or, with `backward`,
/// [`lrn_cross_channel_backward`]) runs on `handle`'s GPU for `x_desc` and `y_desc` (the
/// backward's dy laid out as y, dx as x). For tests and benches that check which path a
/// problem takes.
#[doc(hidden)]
pub fn lrn_kernel(
    handle: &Handle,
    lrn: &LrnDescriptor,
    backward: bool,
    x_desc: &TensorDescriptor,
    y_desc: &TensorDescriptor,
) -> Result<&'static str> {
    validate(x_desc, &[("y_desc", y_desc)])?;
    let Backend::Gpu(gpu) = &handle.backend else {
        return Err(Error::bad("handle", "the CPU handle runs no kernels"));
    };
    let (dir, descs) = if backward {
        (Direction::Backward, [x_desc, y_desc, x_desc])
    } else {
        (Direction::Forward, [x_desc, y_desc, y_desc])
    };
    Ok(plan(gpu, dir, lrn, (1.0, 0.0), descs)?.0)
}

/// `y = alpha * lrn(x) + beta * y` (cudnnLRNCrossChannelForward). `x` and `y`: same dims
/// (3 to 8, dim 1 the channels) and dtype, any strides; with `beta == 0`, `y` is not read.
#[allow(clippy::too_many_arguments)]
pub fn lrn_cross_channel_forward(
    handle: &Handle,
    lrn: &LrnDescriptor,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    validate(x_desc, &[("y_desc", y_desc)])?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    let blend = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            reference::lrn::forward(lrn, alpha, &xt, beta, &mut yt);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let (kernel, p, cfg) = plan(
                gpu,
                Direction::Forward,
                lrn,
                blend,
                [x_desc, y_desc, y_desc],
            )?;
            let ptrs = [device_ptr(gpu, x)?, device_ptr_mut(gpu, y)?];
            // SAFETY: x and y hold their descriptors' spans (checked); the pixel map and
            // channel strides only produce offsets of logical elements, inside the spans;
            // the dynamic shared memory is sized by `plan` for this kernel's layout.
            unsafe { gpu.launch(kernel, cfg, &p, &ptrs) }
        }
    }
}

/// `dx = alpha * dlrn(x)/dx . dy + beta * dx` (cudnnLRNCrossChannelBackward). `y` is the
/// forward's output, validated like the others but recomputed from `x` (see the module
/// documentation). All four tensors: same dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn lrn_cross_channel_backward(
    handle: &Handle,
    lrn: &LrnDescriptor,
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
    validate(
        x_desc,
        &[
            ("y_desc", y_desc),
            ("dy_desc", dy_desc),
            ("dx_desc", dx_desc),
        ],
    )?;
    handle.check_tensor("y", y_desc, y)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    let blend = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let (dyt, xt) = (host_read(dy_desc, dy)?, host_read(x_desc, x)?);
            let mut dxt = host_read(dx_desc, dx)?;
            reference::lrn::backward(lrn, alpha, &dyt, &xt, beta, &mut dxt);
            host_write(&dxt, dx)
        }
        Backend::Gpu(gpu) => {
            let (kernel, p, cfg) = plan(
                gpu,
                Direction::Backward,
                lrn,
                blend,
                [x_desc, dy_desc, dx_desc],
            )?;
            let ptrs = [
                device_ptr(gpu, x)?,
                device_ptr(gpu, dy)?,
                device_ptr_mut(gpu, dx)?,
            ];
            // SAFETY: as in the forward: every buffer holds its descriptor's span, every
            // offset the parameters produce is a logical element's.
            unsafe { gpu.launch(kernel, cfg, &p, &ptrs) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::walk_segments;

    #[test]
    fn walk_segments_fill_the_gpu_only_as_far_as_it_pays() {
        // Many pixels: no split. Few pixels, many channels: split into segments.
        assert_eq!(walk_segments(1 << 22, 96, 4, 168_960), 1);
        assert_eq!(walk_segments(23_328, 256, 4, 168_960), 7);
        assert!(walk_segments(12, 3000, 30, 135_168) >= 32);
        assert_eq!(walk_segments(5, 1, 0, 1000), 1);
    }
}
