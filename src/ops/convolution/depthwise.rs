//! [`ConvFwdAlgo::Depthwise`](super::ConvFwdAlgo::Depthwise): depthwise convolutions
//! (groups == c, one input channel per group, any channel multiplier), every dtype, any
//! filter, stride, dilation, padding and mode. Channels-last x and y with 16-byte channel
//! vectors (and multiplier 1) run `conv_fwd_depthwise_strip3s<1|2>_<f16|bf16>` for packed
//! 3x3 filters at stride 1 (or 2 on narrow outputs) and dilation 1 along the innermost
//! dim (one thread per channel vector of seven output pixels, filter and input columns in
//! registers; see `strip_stride`), else
//! `conv_fwd_depthwise_vec_<dtype>` (one thread per channel vector of two output pixels);
//! everything else `conv_fwd_depthwise_rows_<dtype>` (one thread per four consecutive
//! outputs of a row, input windows in registers).

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use crate::ops::pooling::items;
use oxidnn_params::{
    ConvDepthwiseParams, DW_COLS, DW_PIXELS, DW_STRIP, DW_STRIP_THREADS, DW_THREADS,
};

/// Why this is not a depthwise problem, or `None` if it is.
pub(super) fn declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if g.groups != g.c || g.c_per_group != 1 {
        return Some(format!(
            "not depthwise: {} groups of {} input channels (depthwise has one channel per group)",
            g.groups, g.c_per_group
        ));
    }
    None
}

/// Elements per 16-byte channel vector when the channels-last kernel can run: x and y
/// channel-contiguous, multiplier 1, every other stride and both base addresses on
/// 16-byte boundaries.
fn vector(call: &Call, y_ptr: u64) -> Option<u32> {
    let g = &call.p.geo;
    let size = call.p.dtype.size_bytes() as u32;
    let vec = 16 / size;
    let aligned =
        |s: &[u32; 5]| s[1] == 1 && [0, 2, 3, 4].iter().all(|&d| s[d].is_multiple_of(vec));
    let ok = g.k_per_group == 1
        && g.k.is_multiple_of(vec)
        && aligned(&g.x)
        && aligned(&g.y)
        && call.ptrs.x.is_multiple_of(16)
        && y_ptr.is_multiple_of(16);
    ok.then_some(vec)
}

/// The `strip` kernel's innermost-dim stride (its name's `s1`/`s2`) when it runs: 16-bit
/// data (f32 channels-last keeps `vec`, untimed with `strip`); a 3x3 filter of depth 1,
/// packed (each channel's 9 taps contiguous, KCRS or KRSC alike at one channel per group)
/// and 16-byte aligned (the kernel reads a vector's 9 taps as 9 16-byte loads); dilation
/// 1 and stride 1 or 2 along the innermost dim. At stride 2 only where the output is at
/// most two strips wide: on wider stride-2 outputs (MobileNet's 28 to 56 wide, input 4x
/// the output) `vec`, whose 64 registers keep 4x the warps in flight, ran 1.15-1.4x
/// faster (H100); on the 7- and 14-wide ones `strip` took 0.88-1.05x `vec`'s time.
fn strip_stride(call: &Call) -> Option<u32> {
    let g = &call.p.geo;
    let ok = call.p.dtype.size_bytes() == 2
        && g.filter == [1, 3, 3]
        && g.w[0] == 9
        && g.w[3] == 3
        && g.w[4] == 1
        && call.ptrs.w.is_multiple_of(16)
        && g.dilation[2] == 1
        && (g.stride[2] == 1 || (g.stride[2] == 2 && g.output[2] <= 2 * DW_STRIP));
    ok.then_some(g.stride[2])
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let g = &call.p.geo;
    let y_ptr = call.y_ptr(y)?;
    // (kernel, channel items, outputs per thread along the innermost dim, channels-last,
    // threads per block).
    let (kind, channels, per_thread, channels_last, threads) = match vector(call, y_ptr) {
        Some(vec) => match strip_stride(call) {
            Some(1) => ("strip3s1", g.k / vec, DW_STRIP, true, DW_STRIP_THREADS),
            Some(_) => ("strip3s2", g.k / vec, DW_STRIP, true, DW_STRIP_THREADS),
            None => ("vec", g.k / vec, DW_PIXELS, true, DW_THREADS),
        },
        None => ("rows", g.k, DW_COLS, false, DW_THREADS),
    };
    let items = items(
        [
            g.n as usize,
            channels as usize,
            g.output[0] as usize,
            g.output[1] as usize,
            (g.output[2] as usize).div_ceil(per_thread as usize),
        ],
        channels_last,
    )?;
    let params = ConvDepthwiseParams {
        geo: *g,
        ops: call.ops(),
        items,
    };
    let name = format!("conv_fwd_depthwise_{kind}_{}", call.p.dtype.name());
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no depthwise convolution kernel `{name}`")))?;
    // A grid-stride grid of at most 8192 threads per SM (as `grid_stride_config`).
    let mut cfg = LaunchConfig::for_threads(params.items.len as u64, threads)?;
    cfg.grid = cfg.grid.min(call.gpu.sm_count.max(1) * (8192 / threads));
    let pointers = [call.ptrs.x, call.ptrs.w, y_ptr, call.ptrs.bias, call.ptrs.z];
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry describes; every span is below 2^31 elements (checked by the algorithm);
    // the kernels read x only at in-bounds input coordinates and store only y's elements;
    // bias and z are read only when the epilogue has them. The `vec` and `strip` kernels
    // run only under `vector`'s layout and alignment conditions, `strip` only under
    // `strip_stride`'s filter conditions.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}
