//! [`ConvFwdAlgo::Depthwise`](super::ConvFwdAlgo::Depthwise): depthwise convolutions
//! (groups == c, one input channel per group, any channel multiplier), every dtype, any
//! filter, stride, dilation, padding and mode. Channels-last x and y with 16-byte channel
//! vectors (and multiplier 1) run `conv_fwd_depthwise_vec_<dtype>` (one thread per
//! channel vector of two output pixels); everything else `conv_fwd_depthwise_rows_<dtype>`
//! (one thread per four consecutive outputs of a row, input windows in registers).

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::kernels;
use crate::ops::grid_stride_config;
use crate::ops::pooling::items;
use oxidnn_params::{ConvDepthwiseParams, DW_COLS, DW_PIXELS, DW_THREADS};

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

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let g = &call.p.geo;
    let y_ptr = call.y_ptr(y)?;
    let (o0, o1, o2) = (
        g.output[0] as usize,
        g.output[1] as usize,
        g.output[2] as usize,
    );
    let (kind, items) = match vector(call, y_ptr) {
        Some(vec) => (
            "vec",
            items(
                [
                    g.n as usize,
                    (g.k / vec) as usize,
                    o0,
                    o1,
                    o2.div_ceil(DW_PIXELS as usize),
                ],
                true,
            )?,
        ),
        None => (
            "rows",
            items(
                [
                    g.n as usize,
                    g.k as usize,
                    o0,
                    o1,
                    o2.div_ceil(DW_COLS as usize),
                ],
                false,
            )?,
        ),
    };
    let params = ConvDepthwiseParams {
        geo: *g,
        ops: call.ops(),
        items,
    };
    let name = format!("conv_fwd_depthwise_{kind}_{}", call.p.dtype.name());
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no depthwise convolution kernel `{name}`")))?;
    let mut cfg = grid_stride_config(params.items.len as u64, call.gpu.sm_count)?;
    cfg.block = DW_THREADS;
    let pointers = [call.ptrs.x, call.ptrs.w, y_ptr, call.ptrs.bias, call.ptrs.z];
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry describes; every span is below 2^31 elements (checked by the algorithm);
    // the kernels read x only at in-bounds input coordinates and store only y's elements;
    // bias and z are read only when the epilogue has them. The `vec` kernel runs only
    // under `vector`'s layout and alignment conditions.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}
