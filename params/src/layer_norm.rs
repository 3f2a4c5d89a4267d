//! Parameters of the layer-normalization family (layer norm and RMS norm share every
//! kernel; `rms != 0` drops the mean).

use crate::IndexMap;

/// `LayerNormFwdParams::flags`: a scale (gamma) is read.
pub const NORM_SCALE: u32 = 1;
/// `LayerNormFwdParams::flags`: a bias (beta) is read.
pub const NORM_BIAS: u32 = 2;
/// `LayerNormFwdParams::flags`: the row statistics (mean unless RMS, rstd) are written.
pub const NORM_WRITE_STATS: u32 = 4;
/// Both directions' flags: the affine parameters (and their gradients) are f32, whatever
/// the data type (otherwise they have the data's type).
pub const NORM_F32_WEIGHTS: u32 = 8;
/// `LayerNormBwdParams::flags`: the scale gradient is accumulated.
pub const NORM_DSCALE: u32 = 16;
/// `LayerNormBwdParams::flags`: the bias gradient is accumulated.
pub const NORM_DBIAS: u32 = 32;

/// Whether the in-register backward kernels (`vec`, `map`) put several row groups of
/// several warps in a block, meeting at named barriers (`Group::of` in the kernels'
/// `rows.rs`, `Budget::groups_share_blocks` on the host). Registers hold them to two blocks
/// of 256 threads an SM, so the named barriers' four-block limit costs nothing, and each
/// block leaves a slot of weight-gradient partials: the fewer blocks, the fewer partials.
pub const NORM_BWD_GROUPS_SHARE_BLOCKS: bool = true;

/// Threads per block of the weight-gradient finalisation: 32 columns (one per lane) times
/// 32 warps, each warp summing every 32nd workspace slot.
pub const NORM_FINALIZE_THREADS: u32 = 1024;

/// Dynamic shared memory of an in-register backward block (`vec` and `map` kernels) of
/// `threads` threads holding `values` row elements each, when weight gradients are
/// accumulated: each thread's scale and bias gradient sums, f32, in quads of 4 (0 without
/// weight gradients: the kernels then touch no dynamic shared memory).
pub const fn layer_norm_bwd_shared_bytes(threads: u32, values: u32, weight_grads: bool) -> u32 {
    if weight_grads {
        2 * values.div_ceil(4) * 16 * threads
    } else {
        0
    }
}

/// Parameters of `layer_norm_fwd_*`: each of `rows` rows of `row_len` elements (the
/// normalized dims, folded) becomes `y = (x - mean) * rstd * gamma + beta`, with
/// `rstd = 1 / sqrt(var + epsilon)` (biased variance); RMS norm: `mean = 0`, `var = E[x^2]`.
///
/// `outer.offsets(row) = [x, y, stats]` (row bases); `inner.offsets(e) = [x, y, gamma,
/// beta]` of element `e` of a row (the `map` kernels; the `vec` kernels read rows as dense
/// runs of 16-byte vectors and the weights densely). A row is handled by a group of
/// `warps` warps; `chunks > 1` only for the `long` kernels, which stream the row.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerNormFwdParams {
    pub rows: u32,
    pub row_len: u32,
    pub warps: u32,
    pub chunks: u32,
    pub epsilon: f32,
    pub rms: u32,
    /// `NORM_SCALE | NORM_BIAS | NORM_WRITE_STATS | NORM_F32_WEIGHTS`.
    pub flags: u32,
    pub _pad: u32,
    pub outer: IndexMap<3>,
    pub inner: IndexMap<4>,
}

/// Parameters of `layer_norm_bwd_*`: from the saved `mean` (not for RMS) and `rstd`,
/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * gamma` and
/// `xhat = (x - mean) * rstd` (RMS: without the `mean(g)` term); the scale gradient
/// `sum_rows dy * xhat` and the bias gradient `sum_rows dy` are left as per-slot partial
/// sums in the workspace (`slots` slots: `dscale` partials `[slot * row_len + e]`, then the
/// `dbias` partials after all of them) for `layer_norm_bwd_weights_*`.
///
/// `outer.offsets(row) = [x, dy, dx, stats]`; `inner.offsets(e) = [x, dy, dx, gamma]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerNormBwdParams {
    pub rows: u32,
    pub row_len: u32,
    pub warps: u32,
    pub chunks: u32,
    pub rms: u32,
    /// `NORM_SCALE | NORM_F32_WEIGHTS | NORM_DSCALE | NORM_DBIAS`.
    pub flags: u32,
    /// Workspace slots (one per block of the grid).
    pub slots: u32,
    pub _pad: u32,
    pub outer: IndexMap<4>,
    pub inner: IndexMap<4>,
}

/// Parameters of `layer_norm_bwd_weights_<weight type>`: sums the `slots` partials of each
/// of the `row_len` elements in slot order (deterministic) and writes the scale gradient
/// and bias gradient at `weights.offsets(e)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerNormWeightsParams {
    pub row_len: u32,
    pub slots: u32,
    /// `NORM_DSCALE | NORM_DBIAS`.
    pub flags: u32,
    pub _pad: u32,
    pub weights: IndexMap<1>,
}
