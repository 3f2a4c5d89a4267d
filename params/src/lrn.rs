//! Cross-channel local response normalization (cudnnLRNCrossChannelForward/Backward).
//!
//! With `n` the window width, `lb = (n - 1) / 2` channels before and `la = n - lb - 1`
//! after the centre (cuDNN's placement: for `n = 6`, `[c - 2, c + 3]`), clipped to the
//! tensor: `s_c = k + alpha / n * sum_{j = c - lb}^{c + la} x_j^2`, `y_c = x_c * s_c^-beta`.

use crate::{FastDivisor, IndexMap};

/// Parameters of every `lrn_*` kernel.
///
/// A *pixel* is one index of every dim but the channel dim (dim 1); `pixel_map` gives each
/// operand's offset of a pixel's channel 0, `channel_strides` the step between channels.
/// Operands: forward `[x, y, y]`, backward `[x, dy, dx]` (y is not read: it is recomputed
/// from x).
///
/// `lrn_{fwd,bwd}_walk_*` (any strides): thread `t < threads` takes pixel
/// `t % pixels` and channels `[s * segment_len, (s + 1) * segment_len)` of segment
/// `s = t / pixels`, walking them with f64 running sums; its recent values wait in
/// shared-memory rings of `ring` slots (a power of two >= n) per thread.
/// `lrn_{fwd,bwd}_walk_n<N>_*` take the same threads and segments with the width `N`
/// compiled in, their windows in registers (`ring` unused).
///
/// `lrn_{fwd,bwd}_channels_last_*` (unit channel stride in every operand): `group` lanes
/// (a power of two) share a pixel, `pixels_per_block` pixels per block; the pixel's squares
/// (and, backward, its `t` terms) are staged in shared memory, `pixel_slots` slots each
/// (a padding slot after every 16 bytes of elements, against bank conflicts), and window
/// sums slide over them. `vectorized != 0`: 16-byte accesses (channels and every pixel
/// offset a multiple of the vector width). `lrn_{fwd,bwd}_channels_last_n<N>_*` take the
/// same lanes with the width `N` compiled in and stage nothing (`pixel_slots` unused): each
/// lane loads the channels around its run itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LrnParams {
    pub channels: u32,
    pub look_behind: u32,
    pub look_ahead: u32,
    /// lrnAlpha / lrnN.
    pub alpha_over_n: f32,
    /// lrnBeta, the exponent.
    pub beta: f32,
    /// lrnK.
    pub k: f32,
    /// Blending: `out = blend_alpha * result + blend_beta * out`.
    pub blend_alpha: f32,
    pub blend_beta: f32,
    /// Backward: `2 * lrnAlpha * lrnBeta / lrnN`.
    pub grad_coef: f32,
    pub pixels: u32,
    pub pixels_div: FastDivisor,
    pub threads: u32,
    pub segment_len: u32,
    pub ring: u32,
    pub group: u32,
    pub pixels_per_block: u32,
    pub pixel_slots: u32,
    pub vectorized: u32,
    pub channel_strides: [u64; 3],
    pub pixel_map: IndexMap<3>,
}

/// Shared-memory slots of one pixel of a channels-last kernel whose lanes take `vector`
/// channels at a time: one padding slot after every `vector`.
pub const fn lrn_pixel_slots(channels: u32, vector: u32) -> u32 {
    channels + channels / vector + 1
}

/// The shared-memory slot of channel `c` (see [`lrn_pixel_slots`]).
#[inline(always)]
pub fn lrn_slot(c: u32, vector: u32) -> u32 {
    c + c / vector
}

/// Shared-memory bytes per slot of the channels-last kernels: forward f64 squares and f32
/// inputs; backward also f64 `t` terms and f32 `dy s^-beta`.
pub const LRN_CL_FWD_SLOT_BYTES: u32 = 12;
pub const LRN_CL_BWD_SLOT_BYTES: u32 = 24;
/// Shared-memory bytes per ring slot per thread of the walk kernels (the same arrays).
pub const LRN_WALK_FWD_SLOT_BYTES: u32 = 12;
pub const LRN_WALK_BWD_SLOT_BYTES: u32 = 24;
