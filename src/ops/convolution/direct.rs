//! [`ConvFwdAlgo::Direct`](super::ConvFwdAlgo::Direct): `conv_fwd_direct_<dtype>`, one
//! thread per output element over y in its memory order. Accepts every problem.

use super::Call;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::kernels;
use crate::ops::grid_stride_config;
use crate::ops::pooling::{channels_last, items};
use oxidnn_params::{ConvFwdParams, CONV_DIRECT_THREADS};

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let g = &call.p.geo;
    let extents = [
        g.n as usize,
        g.k as usize,
        g.output[0] as usize,
        g.output[1] as usize,
        g.output[2] as usize,
    ];
    let params = ConvFwdParams {
        geo: *g,
        ops: call.ops(),
        items: items(extents, channels_last(&g.y))?,
    };
    let name = format!("conv_fwd_direct_{}", call.p.dtype.name());
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no direct convolution kernel `{name}`")))?;
    let mut cfg = grid_stride_config(params.items.len as u64, call.gpu.sm_count)?;
    cfg.block = CONV_DIRECT_THREADS;
    let pointers = call.kernel_pointers(y)?;
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry's dims and strides describe (missing spatial dims at extent 1); every span
    // is below 2^31 elements (checked by the algorithm), so the kernel's 32-bit offsets do
    // not wrap; bias and z are read only when the epilogue has them, which is exactly when
    // they were given.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}
