//! Layer normalization and RMS normalization over the trailing dims, forward and backward.
//! One body serves both: `p.rms != 0` drops the mean (`xhat = x * rstd`).
//!
//! Entry points (the row engine of [`crate::rows`]; `V` slots per thread):
//! - `layer_norm_{fwd,bwd}_vec<V>_<dtype>`: rows dense in every operand, 16-byte vectors,
//!   the row held in registers (x read once, two-pass statistics over registers);
//! - `layer_norm_{fwd,bwd}_map<V>_<dtype>`: any strides, elements through `p.inner`;
//! - `layer_norm_{fwd,bwd}_long_{vec,map}_<dtype>`: rows too long for registers, streamed
//!   in chunks (forward: Chan-combined mean/variance, then a normalising pass);
//! - `layer_norm_bwd_weights_<weight type>`: sums the backward's per-slot scale/bias
//!   gradient partials in a fixed order (deterministic; no float atomics).
//!
//! Statistics and arithmetic are f32 for every storage type.

use crate::device::{
    block_dim_x, block_idx_x, dynamic_smem, fma, lane_id, ld_shared_f32, ld_shared_v4,
    rsqrt_approx, shfl_xor_f32, st_shared_f32, st_shared_v4, sync_threads, thread_idx_x, warp_id,
};
use crate::element::Element;
use crate::rows::{self, shfl_pair, vector_elements, Dense, Group, Held, Inner};
use oxidnn_params::{
    IndexMap, LayerNormBwdParams, LayerNormFwdParams, LayerNormWeightsParams, NORM_BIAS,
    NORM_BWD_GROUPS_SHARE_BLOCKS, NORM_DBIAS, NORM_DSCALE, NORM_F32_WEIGHTS, NORM_SCALE,
    NORM_WRITE_STATS, STREAM_SLOTS,
};

/// Count, mean and sum of squared deviations of some elements (Chan et al.'s parallel
/// variance: partial results combine without cancellation).
type Moments = [f32; 3];

#[inline(always)]
fn combine(a: Moments, b: Moments) -> Moments {
    let n = a[0] + b[0];
    if b[0] == 0.0 {
        return a;
    }
    if a[0] == 0.0 {
        return b;
    }
    let delta = b[1] - a[1];
    let wb = b[0] / n;
    [
        n,
        a[1] + delta * wb,
        a[2] + b[2] + delta * delta * a[0] * wb,
    ]
}

#[inline(always)]
fn shfl_moments(v: Moments, mask: u32) -> Moments {
    [
        shfl_xor_f32(v[0], mask),
        shfl_xor_f32(v[1], mask),
        shfl_xor_f32(v[2], mask),
    ]
}

/// `1 / sqrt(v + epsilon)`: one special-function op (2^-22.9 relative error, as the
/// `rsqrtf` of PyTorch's kernels), where a correctly rounded square root and divide take
/// two slow-path checks on every row's critical path.
#[inline(always)]
fn rstd_of(v: f32, epsilon: f32) -> f32 {
    rsqrt_approx(v + epsilon)
}

/// What a forward's output pass does to each element: subtract the mean (layer norm; RMS
/// norm has none), multiply by a scale, add a bias, the parameters stored as f32 or as the
/// data's type.
#[derive(Clone, Copy)]
struct Epilogue {
    centred: bool,
    scale: bool,
    bias: bool,
    f32_weights: bool,
}

/// The bits of an [`Epilogue`] key: the flags' affine bits, and `RMS_KEY` for RMS norm.
const AFFINE_FLAGS: u32 = NORM_SCALE | NORM_BIAS | NORM_F32_WEIGHTS;
const RMS_KEY: u32 = 16;

impl Epilogue {
    /// The key of a forward's epilogue.
    #[inline(always)]
    fn key(p: &LayerNormFwdParams) -> u32 {
        p.flags & AFFINE_FLAGS | if p.rms != 0 { RMS_KEY } else { 0 }
    }

    #[inline(always)]
    const fn of(key: u32) -> Self {
        Self {
            centred: key & RMS_KEY == 0,
            scale: key & NORM_SCALE != 0,
            bias: key & NORM_BIAS != 0,
            f32_weights: key & NORM_F32_WEIGHTS != 0,
        }
    }
}

/// Calls `f` (inlined) with the epilogue of `key`, a constant for the usual ones (layer
/// norm with no affine parameters, a scale, or both; RMS norm with no scale or one; the
/// parameters of either type), so each of those passes is straight-line code with no
/// per-element defaults or predicated loads for what it lacks.
#[inline(always)]
fn with_epilogue(key: u32, f: impl Fn(Epilogue)) {
    const LN_SCALE: u32 = NORM_SCALE;
    const LN_AFFINE: u32 = NORM_SCALE | NORM_BIAS;
    const LN_SCALE_F32: u32 = NORM_SCALE | NORM_F32_WEIGHTS;
    const LN_AFFINE_F32: u32 = NORM_SCALE | NORM_BIAS | NORM_F32_WEIGHTS;
    const RMS_SCALE: u32 = RMS_KEY | NORM_SCALE;
    const RMS_SCALE_F32: u32 = RMS_KEY | NORM_SCALE | NORM_F32_WEIGHTS;
    match key {
        0 => f(Epilogue::of(0)),
        LN_SCALE => f(Epilogue::of(LN_SCALE)),
        LN_AFFINE => f(Epilogue::of(LN_AFFINE)),
        LN_SCALE_F32 => f(Epilogue::of(LN_SCALE_F32)),
        LN_AFFINE_F32 => f(Epilogue::of(LN_AFFINE_F32)),
        RMS_KEY => f(Epilogue::of(RMS_KEY)),
        RMS_SCALE => f(Epilogue::of(RMS_SCALE)),
        RMS_SCALE_F32 => f(Epilogue::of(RMS_SCALE_F32)),
        _ => f(Epilogue::of(key)),
    }
}

/// `((x - shift) - centre) * (rstd * scale) + bias` for `K` elements whose parameters are
/// at `at` (`[_, _, scale, bias]` offsets); `shift + centre` is the row's mean (RMS: no
/// subtraction). The two subtractions keep rows far from zero exact; the rest is one
/// product and a fused multiply-add an element.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn normalize<T: Element, const K: usize>(
    e: Epilogue,
    v: [f32; K],
    shift: f32,
    centre: f32,
    rstd: f32,
    scale: *const u8,
    bias: *const u8,
    at: [u64; 4],
) -> [f32; K] {
    let a: [f32; K] = if e.scale {
        let gamma = rows::load_params::<T, K>(scale, at[2], e.f32_weights);
        core::array::from_fn(|k| rstd * gamma[k])
    } else {
        [rstd; K]
    };
    let t: [f32; K] = if e.centred {
        core::array::from_fn(|k| (v[k] - shift) - centre)
    } else {
        v
    };
    if e.bias {
        let beta = rows::load_params::<T, K>(bias, at[3], e.f32_weights);
        core::array::from_fn(|k| fma(t[k], a[k], beta[k]))
    } else {
        core::array::from_fn(|k| t[k] * a[k])
    }
}

/// The value the row's elements are taken relative to while its statistics are summed:
/// its first element (layer norm; 0 for RMS). Elements near it subtract exactly, so the
/// sums of a row far from zero keep their precision (`1000 + small` rows).
#[inline(always)]
unsafe fn row_shift<T: Element, I: Inner<N>, const N: usize>(
    rms: u32,
    inner: I,
    x: *const T,
    base: u64,
) -> f32 {
    if rms != 0 {
        0.0
    } else {
        T::load(x.add((base + inner.at(0)[0]) as usize))
    }
}

/// Writes a row's statistics (rank 0 of the group only).
#[inline(always)]
unsafe fn write_stats(
    g: &Group,
    p: &LayerNormFwdParams,
    at: u64,
    mean: f32,
    rstd: f32,
    mean_out: *mut f32,
    rstd_out: *mut f32,
) {
    if g.rank == 0 && p.flags & NORM_WRITE_STATS != 0 {
        if p.rms == 0 {
            *mean_out.add(at as usize) = mean;
        }
        *rstd_out.add(at as usize) = rstd;
    }
}

/// The statistics of a row held in registers: its mean relative to `shift` (0 for RMS
/// norm) and its `rstd`.
///
/// Layer norm takes each slot's `K` elements exactly, in two passes over them (their mean
/// `m_j`, and the squares of their deviations from it), then the row's mean `c` (one group
/// sum) and its squared deviations `sum_j [M2_j + K (m_j - c)^2]` (another): the usual
/// decomposition of a sum of squares, with no `E[x^2] - E[x]^2` cancellation, in five
/// operations an element where the row-wide two passes took eight. RMS norm sums `x^2`.
#[inline(always)]
fn held_statistics<T: Element, const K: usize, const V: usize>(
    g: &Group,
    p: &LayerNormFwdParams,
    v: &Held<T, K, V>,
    shift: f32,
) -> (f32, f32) {
    let d = p.row_len;
    let inv_d = 1.0 / d as f32;
    if p.rms != 0 {
        let mut s2 = 0.0f32;
        crate::unrolled!(j in V => {
            if g.first::<K, V>(0, j) < d {
                for vk in v.get(j) {
                    s2 = fma(vk, vk, s2);
                }
            }
        });
        return (0.0, rstd_of(g.sum(s2) * inv_d, p.epsilon));
    }
    // Sums start at -0.0, which an addition leaves out exactly (0.0 would not: -0 + 0).
    let mut s = -0.0f32;
    let mut m2 = 0.0f32;
    let mut slot_means = [0.0f32; V];
    crate::unrolled!(j in V => {
        if g.first::<K, V>(0, j) < d {
            let t = v.get(j).map(|vk| vk - shift);
            let sj = t.iter().fold(-0.0f32, |a, &tk| a + tk);
            let mj = sj * (1.0 / K as f32);
            if K > 1 {
                for tk in t {
                    let dk = tk - mj;
                    m2 = fma(dk, dk, m2);
                }
            }
            slot_means[j] = mj;
            s += sj;
        }
    });
    let centre = g.sum(s) * inv_d;
    crate::unrolled!(j in V => {
        if g.first::<K, V>(0, j) < d {
            let dm = slot_means[j] - centre;
            m2 = fma(dm * K as f32, dm, m2);
        }
    });
    (centre, rstd_of(g.sum(m2) * inv_d, p.epsilon))
}

/// The forward pass with each row in registers (one chunk).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_in_registers<T: Element, I: Inner<4>, const K: usize, const V: usize>(
    p: &LayerNormFwdParams,
    inner: I,
    x: *const T,
    y: *mut T,
    scale: *const u8,
    bias: *const u8,
    mean_out: *mut f32,
    rstd_out: *mut f32,
) {
    let g = Group::new(p.warps);
    let d = p.row_len;
    g.rows(
        p.rows,
        #[inline(always)]
        |row| {
            let [xb, yb, sb] = p.outer.offsets(row);
            let shift = row_shift(p.rms, inner, x, xb);
            let mut v = Held::<T, K, V>::filled(0.0);
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(0, j);
                if e < d {
                    v.load(j, x.add((xb + inner.at(e)[0]) as usize));
                }
            });
            let (centre, rstd) = held_statistics(&g, p, &v, shift);
            write_stats(&g, p, sb, shift + centre, rstd, mean_out, rstd_out);
            let y = y.add(yb as usize);
            with_epilogue(
                Epilogue::key(p),
                #[inline(always)]
                |epilogue| {
                    crate::unrolled!(j in V => {
                        let e = g.first::<K, V>(0, j);
                        if e < d {
                            let at = inner.at(e);
                            // SAFETY: as the kernel's: `at` is inside the row of every operand.
                            unsafe {
                                let out = normalize::<T, K>(
                                    epilogue, v.get(j), shift, centre, rstd, scale, bias, at,
                                );
                                rows::store::<T, K>(y.add(at[1] as usize), out);
                            }
                        }
                    });
                },
            );
        },
    );
}

/// The forward pass for rows longer than a group's registers: chunk by chunk, the
/// moments of each thread's elements (Chan-combined), reduced over the group; then a
/// second pass normalises.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_streamed<T: Element, I: Inner<4>, const K: usize>(
    p: &LayerNormFwdParams,
    inner: I,
    x: *const T,
    y: *mut T,
    scale: *const u8,
    bias: *const u8,
    mean_out: *mut f32,
    rstd_out: *mut f32,
) {
    const V: usize = STREAM_SLOTS as usize;
    let g = Group::new(p.warps);
    let d = p.row_len;
    let epilogue = Epilogue::of(Epilogue::key(p));
    g.rows(p.rows, |row| {
        let [xb, yb, sb] = p.outer.offsets(row);
        let shift = row_shift(p.rms, inner, x, xb);
        let mut acc: Moments = [0.0; 3];
        for c in 0..p.chunks {
            let mut v = [[0.0f32; K]; V];
            let mut n = 0u32;
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    v[j] = rows::load::<T, K>(x.add((xb + inner.at(e)[0]) as usize));
                    for k in 0..K {
                        v[j][k] -= shift;
                    }
                    n += K as u32;
                }
            });
            if n > 0 {
                let mut s = 0.0f32;
                crate::unrolled!(j in V => {
                    for k in 0..K {
                        s += v[j][k];
                    }
                });
                let m = s / n as f32;
                let mut m2 = 0.0f32;
                crate::unrolled!(j in V => {
                    if g.first::<K, V>(c, j) < d {
                        for k in 0..K {
                            let t = v[j][k] - m;
                            m2 += t * t;
                        }
                    }
                });
                acc = combine(acc, [n as f32, m, m2]);
            }
        }
        let total = g.reduce(acc, [0.0; 3], combine, shfl_moments);
        let var = total[2] / d as f32;
        let (centre, rstd) = if p.rms != 0 {
            // E[x^2] = var + mean^2: two non-negative terms, no cancellation.
            (0.0, rstd_of(var + total[1] * total[1], p.epsilon))
        } else {
            (total[1], rstd_of(var, p.epsilon))
        };
        write_stats(&g, p, sb, shift + centre, rstd, mean_out, rstd_out);
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let at = inner.at(e);
                    let v = rows::load::<T, K>(x.add((xb + at[0]) as usize));
                    let out = normalize::<T, K>(epilogue, v, shift, centre, rstd, scale, bias, at);
                    rows::store::<T, K>(y.add((yb + at[1]) as usize), out);
                }
            });
        }
    });
}

/// The scale (gamma) of the `K` elements at weight offset `at`: 1 without one.
#[inline(always)]
unsafe fn gamma_of<T: Element, const K: usize>(
    p: &LayerNormBwdParams,
    at: u64,
    scale: *const u8,
) -> [f32; K] {
    if p.flags & NORM_SCALE != 0 {
        rows::load_params::<T, K>(scale, at, p.flags & NORM_F32_WEIGHTS != 0)
    } else {
        [1.0; K]
    }
}

/// `xc = x - mean` and `g = dy * gamma` of one slot (`xhat = xc * rstd`).
#[inline(always)]
fn centred_and_g<const K: usize>(
    xv: [f32; K],
    dyv: [f32; K],
    gamma: [f32; K],
    mean: f32,
) -> ([f32; K], [f32; K]) {
    (
        core::array::from_fn(|k| xv[k] - mean),
        core::array::from_fn(|k| dyv[k] * gamma[k]),
    )
}

/// What one slot adds to its row's sums of `g` and `g * xhat`.
#[inline(always)]
fn bwd_sums<const K: usize>(xhat: [f32; K], gdy: [f32; K], sums: &mut [f32; 2]) {
    for k in 0..K {
        sums[0] += gdy[k];
        sums[1] = fma(gdy[k], xhat[k], sums[1]);
    }
}

/// A row's `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` in the form its element
/// pass takes: `g * rstd + (xc * c + b)` with `b = -rstd * mean(g)` and
/// `c = -rstd^2 * mean(g * xhat)`, two fused multiply-adds an element once `xc = x - mean`
/// and `g` are known (the centring stays a subtraction of its own: rows far from zero keep
/// their precision).
#[derive(Clone, Copy)]
struct DxRow {
    rstd: f32,
    b: f32,
    c: f32,
}

impl DxRow {
    /// From the row's sums of `g` and `g * xhat` and `1 / row_len` (a product: a divide
    /// per row would call its slow-path subroutine, which waits on every load in flight).
    #[inline(always)]
    fn of(p: &LayerNormBwdParams, sums: [f32; 2], inv_d: f32, rstd: f32) -> Self {
        let mean_g = if p.rms != 0 { 0.0 } else { sums[0] * inv_d };
        let mean_gx = sums[1] * inv_d;
        Self {
            rstd,
            b: -rstd * mean_g,
            c: -rstd * rstd * mean_gx,
        }
    }

    /// `dx` of `K` elements from their `xc` and `g`.
    #[inline(always)]
    fn dx<const K: usize>(&self, xc: [f32; K], gdy: [f32; K]) -> [f32; K] {
        core::array::from_fn(|k| fma(gdy[k], self.rstd, fma(xc[k], self.c, self.b)))
    }
}

/// The row's saved mean (0 for RMS norm, which has none) and `rstd`.
#[inline(always)]
unsafe fn saved_stats(
    p: &LayerNormBwdParams,
    at: u64,
    mean_in: *const f32,
    rstd_in: *const f32,
) -> (f32, f32) {
    let mean = if p.rms != 0 {
        0.0
    } else {
        *mean_in.add(at as usize)
    };
    (mean, *rstd_in.add(at as usize))
}

/// The weight-gradient sums of the in-register backward (`dy * xhat` for the scale, `dy`
/// for the bias) over all rows of a thread's group, per element the thread holds: kept in
/// dynamic shared memory, not registers, so the registers hold the next row's loads
/// instead. The `N = V * K` values of thread `t` lie in quads of 4 (`q = i / 4`), table
/// `s` (0: scale, 1: bias) at bytes `((s * Q + q) * block + t) * 16`: a warp's quad access
/// is 512 consecutive bytes.
#[derive(Clone, Copy)]
struct WeightSums<const K: usize, const V: usize> {
    base: u32,
    block: u32,
}

impl<const K: usize, const V: usize> WeightSums<K, V> {
    /// Quads per thread and table.
    const QUADS: u32 = (V * K).div_ceil(4) as u32;

    /// The sums of this block, in the dynamic shared memory the host launches it with
    /// (`layer_norm_bwd_shared_bytes`: `2 * QUADS * 16` bytes per thread).
    #[inline(always)]
    fn new() -> Self {
        Self {
            base: dynamic_smem(),
            block: block_dim_x(),
        }
    }

    /// The shared address of value `i` of `thread` in table `s`.
    #[inline(always)]
    fn at(&self, s: u32, i: usize, thread: u32) -> u32 {
        let q = (i / 4) as u32;
        self.base + ((s * Self::QUADS + q) * self.block + thread) * 16 + (i % 4) as u32 * 4
    }

    /// Zeroes this thread's sums.
    ///
    /// # Safety
    /// The block was launched with the shared bytes above.
    #[inline(always)]
    unsafe fn clear(&self) {
        for s in 0..2 {
            for q in 0..Self::QUADS as usize {
                st_shared_v4(self.at(s, 4 * q, thread_idx_x()), [0; 4]);
            }
        }
    }

    /// The sums of slot `j`'s elements of `thread` in table `s`.
    ///
    /// # Safety
    /// As [`WeightSums::clear`].
    #[inline(always)]
    unsafe fn get(&self, s: u32, j: usize, thread: u32) -> [f32; K] {
        let mut out = [0.0f32; K];
        if K % 4 == 0 {
            for c in 0..K / 4 {
                let w = ld_shared_v4(self.at(s, j * K + 4 * c, thread));
                for i in 0..4 {
                    out[4 * c + i] = f32::from_bits(w[i]);
                }
            }
        } else {
            for (k, o) in out.iter_mut().enumerate() {
                *o = ld_shared_f32(self.at(s, j * K + k, thread));
            }
        }
        out
    }

    /// Replaces this thread's sum of element `k` of slot `j` in table `s` by
    /// `update(k, sum)`.
    ///
    /// # Safety
    /// As [`WeightSums::clear`].
    #[inline(always)]
    unsafe fn update(&self, s: u32, j: usize, update: impl Fn(usize, f32) -> f32) {
        let t = thread_idx_x();
        let old = self.get(s, j, t);
        if K % 4 == 0 {
            for c in 0..K / 4 {
                let w = core::array::from_fn(|i| update(4 * c + i, old[4 * c + i]).to_bits());
                st_shared_v4(self.at(s, j * K + 4 * c, t), w);
            }
        } else {
            for k in 0..K {
                st_shared_f32(self.at(s, j * K + k, t), update(k, old[k]));
            }
        }
    }
}

/// A group's row as the in-register backward holds it: `x` and `dy` as loaded, the row's
/// saved statistics, and where its `dx` row starts.
struct BwdRow<T, const K: usize, const V: usize> {
    x: Held<T, K, V>,
    dy: Held<T, K, V>,
    mean: f32,
    rstd: f32,
    dx_base: u64,
}

/// The backward pass with each row in registers.
///
/// A group issues its next row's loads (x, dy and the statistics) once it has used the
/// current row's, so a row is in flight through each reduction and `dx` pass. Nothing
/// else is loaded from global memory inside the row loop (the scale is loaded once: a
/// thread's elements are the same in every row), so no wait for a later load also waits
/// for that row. Each thread adds the weight-gradient sums of its own elements over the
/// group's rows in shared memory ([`WeightSums`]); at the end, group 0 of the block adds
/// the groups' sums in a fixed order and writes the block's slot.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_in_registers<T: Element, I: Inner<4>, const K: usize, const V: usize>(
    p: &LayerNormBwdParams,
    inner: I,
    x: *const T,
    dy: *const T,
    dx: *mut T,
    scale: *const u8,
    mean_in: *const f32,
    rstd_in: *const f32,
    partials: *mut f32,
) {
    let g = Group::of(p.warps, NORM_BWD_GROUPS_SHARE_BLOCKS);
    let d = p.row_len;
    let inv_d = 1.0 / d as f32;
    let weight_grads = p.flags & (NORM_DSCALE | NORM_DBIAS) != 0;
    let wsums = WeightSums::<K, V>::new();
    if weight_grads {
        wsums.clear();
    }
    let gamma: [[f32; K]; V] = core::array::from_fn(|j| {
        let e = g.first::<K, V>(0, j);
        if e < d {
            gamma_of::<T, K>(p, inner.at(e)[3], scale)
        } else {
            [0.0; K]
        }
    });
    let load = #[inline(always)]
    |row: u32| {
        let mut held = BwdRow {
            x: Held::<T, K, V>::filled(0.0),
            dy: Held::<T, K, V>::filled(0.0),
            mean: 0.0,
            rstd: 0.0,
            dx_base: 0,
        };
        if row < p.rows {
            let [xb, dyb, dxb, sb] = p.outer.offsets(row);
            (held.mean, held.rstd) = saved_stats(p, sb, mean_in, rstd_in);
            held.dx_base = dxb;
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(0, j);
                if e < d {
                    let at = inner.at(e);
                    held.x.load(j, x.add((xb + at[0]) as usize));
                    held.dy.load(j, dy.add((dyb + at[1]) as usize));
                }
            });
        }
        held
    };
    // One row: its sums (the last use of its loads), then the next row's loads, then its
    // reduction and dx. Returns the next row's loads.
    let step = #[inline(always)]
    |row: u32, held: BwdRow<T, K, V>| {
        let BwdRow {
            x: xv,
            dy: dyv,
            mean,
            rstd,
            dx_base,
        } = held;
        // Every slot, also those past the row's end (their x, dy and gamma are 0: they add
        // nothing), so that this first use of each loaded register is unconditional: the
        // wait for this row's loads happens here on every path, and no later use waits
        // again, behind the next row's loads.
        let mut sums = [0.0f32; 2];
        crate::unrolled!(j in V => {
            let dyj = dyv.get(j);
            let (xc, gdy) = centred_and_g::<K>(xv.get(j), dyj, gamma[j], mean);
            let xhat: [f32; K] = core::array::from_fn(|k| xc[k] * rstd);
            bwd_sums::<K>(xhat, gdy, &mut sums);
            if weight_grads {
                wsums.update(0, j, |k, sum| fma(dyj[k], xhat[k], sum));
                wsums.update(1, j, |k, sum| sum + dyj[k]);
            }
        });
        let next = load(row + g.count);
        let sums = g.reduce(sums, [0.0; 2], |a, b| [a[0] + b[0], a[1] + b[1]], shfl_pair);
        let dx_row = DxRow::of(p, sums, inv_d, rstd);
        crate::unrolled!(j in V => {
            let e = g.first::<K, V>(0, j);
            if e < d {
                let (xc, gdy) = centred_and_g::<K>(xv.get(j), dyv.get(j), gamma[j], mean);
                let out = dx_row.dx::<K>(xc, gdy);
                rows::store::<T, K>(dx.add((dx_base + inner.at(e)[2]) as usize), out);
            }
        });
        next
    };
    // Two rows a turn, the loads alternating between two sets of registers: with one set,
    // the loop's copy of the next row's registers into the current row's would wait for
    // the loads to land, and nothing would be in flight across the turn.
    let mut row = g.index;
    let mut held = load(row);
    while row < p.rows {
        let second = step(row, held);
        row += g.count;
        if row >= p.rows {
            break;
        }
        held = step(row, second);
        row += g.count;
    }
    if !weight_grads {
        return;
    }
    // Group 0 adds the block's groups' sums of each of its elements, in group order.
    sync_threads();
    if g.in_block != 0 {
        return;
    }
    let slot = block_idx_x() as usize;
    let (dg_out, db_out) = (
        partials.add(slot * d as usize),
        partials.add((p.slots as usize + slot) * d as usize),
    );
    crate::unrolled!(j in V => {
        let e = g.first::<K, V>(0, j);
        if e < d {
            let (mut dg, mut db) = ([0.0f32; K], [0.0f32; K]);
            for b in 0..g.per_block {
                let t = b * g.threads + g.rank;
                let (gs, bs) = (wsums.get(0, j, t), wsums.get(1, j, t));
                for k in 0..K {
                    dg[k] += gs[k];
                    db[k] += bs[k];
                }
            }
            // 16-byte stores where K is a multiple of 4 (the vector kernels: `e` and the row
            // length are multiples of K, and the workspace is a device allocation, 256-byte
            // aligned). Single 4-byte stores, a warp's lanes 4 * K bytes apart, took 14 of
            // the 75 µs of the f16 8192x4096 backward.
            rows::store_f32s::<K>(dg_out.add(e as usize), dg);
            rows::store_f32s::<K>(db_out.add(e as usize), db);
        }
    });
}

/// The backward pass for long rows: the two row sums chunk by chunk, then `dx` and the
/// group's weight-gradient partials (its own workspace slot, read-modify-written by the
/// thread that owns each element).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_streamed<T: Element, I: Inner<4>, const K: usize>(
    p: &LayerNormBwdParams,
    inner: I,
    x: *const T,
    dy: *const T,
    dx: *mut T,
    scale: *const u8,
    mean_in: *const f32,
    rstd_in: *const f32,
    partials: *mut f32,
) {
    const V: usize = STREAM_SLOTS as usize;
    let g = Group::new(p.warps);
    let d = p.row_len;
    let inv_d = 1.0 / d as f32;
    let weight_grads = p.flags & (NORM_DSCALE | NORM_DBIAS) != 0;
    let slot = g.index as usize;
    let (dg_out, db_out) = (
        partials.add(slot * d as usize),
        partials.add((p.slots as usize + slot) * d as usize),
    );
    g.rows(p.rows, |row| {
        let [xb, dyb, dxb, sb] = p.outer.offsets(row);
        let (mean, rstd) = saved_stats(p, sb, mean_in, rstd_in);
        let load = |e: u32| {
            let at = inner.at(e);
            (
                at,
                rows::load::<T, K>(x.add((xb + at[0]) as usize)),
                rows::load::<T, K>(dy.add((dyb + at[1]) as usize)),
            )
        };
        let mut sums = [0.0f32; 2];
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let (at, xv, dyv) = load(e);
                    let (xc, gdy) = centred_and_g::<K>(xv, dyv, gamma_of::<T, K>(p, at[3], scale), mean);
                    bwd_sums::<K>(core::array::from_fn(|k| xc[k] * rstd), gdy, &mut sums);
                }
            });
        }
        let sums = g.reduce(sums, [0.0; 2], |a, b| [a[0] + b[0], a[1] + b[1]], shfl_pair);
        let dx_row = DxRow::of(p, sums, inv_d, rstd);
        let first_row = row == g.index;
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let (at, xv, dyv) = load(e);
                    let (xc, gdy) = centred_and_g::<K>(xv, dyv, gamma_of::<T, K>(p, at[3], scale), mean);
                    rows::store::<T, K>(dx.add((dxb + at[2]) as usize), dx_row.dx::<K>(xc, gdy));
                    if weight_grads {
                        let (dg_at, db_at) = (dg_out.add(e as usize), db_out.add(e as usize));
                        // As the in-register kernels' partials (16-byte accesses), coherent:
                        // this group wrote them for its earlier rows.
                        let (og, ob) = if first_row { ([0.0; K], [0.0; K]) } else { (rows::load_f32s::<K>(dg_at, false), rows::load_f32s::<K>(db_at, false)) };
                        rows::store_f32s::<K>(dg_at, core::array::from_fn(|k| fma(dyv[k], xc[k] * rstd, og[k])));
                        rows::store_f32s::<K>(db_at, core::array::from_fn(|k| ob[k] + dyv[k]));
                    }
                }
            });
        }
    });
    if weight_grads && g.index >= p.rows {
        // A group without rows still owns its slot.
        let mut i = g.rank;
        while i < d {
            *dg_out.add(i as usize) = 0.0;
            *db_out.add(i as usize) = 0.0;
            i += g.threads;
        }
    }
}

/// Slots whose partials a thread of `layer_norm_bwd_weights_*` loads at once: with 32
/// warps a block, up to 384 slots take one round trip to memory (the backward leaves a
/// slot per resident block: 264 at two blocks an SM on 132 SMs).
const WEIGHT_SLOTS_AT_ONCE: usize = 12;

/// Sums the `p.slots` partials of each element in slot order: lane `l` of warp `w` adds
/// slots `w, w + 32, ..` of element `32 * block + l` (their loads issued
/// [`WEIGHT_SLOTS_AT_ONCE`] at a time, then added in order), then warp 0 adds the 32
/// warps' sums in order and writes.
#[inline(always)]
unsafe fn bwd_weights<W: Element>(
    p: &LayerNormWeightsParams,
    partials: *const f32,
    dscale: *mut W,
    dbias: *mut W,
) {
    const N: usize = WEIGHT_SLOTS_AT_ONCE;
    let (lane, warp) = (lane_id(), warp_id());
    let d = p.row_len as usize;
    let e = block_idx_x() * 32 + lane;
    let slots = p.slots as usize;
    let mut total = [0.0f32; 2];
    if (e as usize) < d {
        let mut first = warp as usize;
        while first < slots {
            // Unconditional loads (past the last slot, the last again), so that all are
            // issued before the first add waits.
            let mut v = [[0.0f32; 2]; N];
            crate::unrolled!(i in N => {
                let s = (first + 32 * i).min(slots - 1);
                v[i] = [*partials.add(s * d + e as usize), *partials.add((slots + s) * d + e as usize)];
            });
            crate::unrolled!(i in N => {
                if first + 32 * i < slots {
                    total[0] += v[i][0];
                    total[1] += v[i][1];
                }
            });
            first += 32 * N;
        }
    }
    let smem = crate::shared_f32!(8448);
    smem.store(warp * 33 + lane, total[0]);
    smem.store(32 * 33 + warp * 33 + lane, total[1]);
    sync_threads();
    if warp == 0 && (e as usize) < d {
        let (mut dg, mut db) = (0.0f32, 0.0f32);
        for w in 0..32 {
            dg += smem.load(w * 33 + lane);
            db += smem.load(32 * 33 + w * 33 + lane);
        }
        let [off] = p.weights.offsets(e);
        if p.flags & NORM_DSCALE != 0 {
            W::store(dscale.add(off as usize), dg);
        }
        if p.flags & NORM_DBIAS != 0 {
            W::store(dbias.add(off as usize), db);
        }
    }
}

/// Stamps the forward in-register entry points of one dtype for each slot count.
macro_rules! fwd_vec_entry_points {
    ($dt:ident, $T:ty, $($v:literal)*) => {
        paste::paste! { $(
            /// # Safety
            /// Pointers cover the tensors `p` describes; rows are dense in every operand,
            /// 16-byte aligned, `row_len` a multiple of the vector.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_fwd_vec $v _ $dt>](
                p: LayerNormFwdParams, x: *const $T, y: *mut $T, scale: *const u8,
                bias: *const u8, mean: *mut f32, rstd: *mut f32,
            ) {
                fwd_in_registers::<$T, Dense, { vector_elements::<$T>() }, $v>(
                    &p, Dense, x, y, scale, bias, mean, rstd,
                )
            }
        )* }
    };
}

/// Stamps the backward in-register entry points of one dtype for each slot count.
macro_rules! bwd_vec_entry_points {
    ($dt:ident, $T:ty, $($v:literal)*) => {
        paste::paste! { $(
            /// # Safety
            /// Pointers cover the tensors `p` describes; rows are dense in every operand,
            /// 16-byte aligned, `row_len` a multiple of the vector; the workspace holds
            /// `2 * slots * row_len` f32 when weight gradients are requested.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_bwd_vec $v _ $dt>](
                p: LayerNormBwdParams, x: *const $T, dy: *const $T, dx: *mut $T,
                scale: *const u8, mean: *const f32, rstd: *const f32, partials: *mut f32,
            ) {
                bwd_in_registers::<$T, Dense, { vector_elements::<$T>() }, $v>(
                    &p, Dense, x, dy, dx, scale, mean, rstd, partials,
                )
            }
        )* }
    };
}

macro_rules! mapped_entry_points {
    ($dt:ident, $T:ty, $($v:literal)*) => {
        paste::paste! { $(
            /// # Safety
            /// Pointers cover the tensors `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_fwd_map $v _ $dt>](
                p: LayerNormFwdParams, x: *const $T, y: *mut $T, scale: *const u8,
                bias: *const u8, mean: *mut f32, rstd: *mut f32,
            ) {
                fwd_in_registers::<$T, &IndexMap<4>, 1, $v>(
                    &p, &p.inner, x, y, scale, bias, mean, rstd,
                )
            }
            /// # Safety
            /// As `layer_norm_bwd_vec*`, any strides.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_bwd_map $v _ $dt>](
                p: LayerNormBwdParams, x: *const $T, dy: *const $T, dx: *mut $T,
                scale: *const u8, mean: *const f32, rstd: *const f32, partials: *mut f32,
            ) {
                bwd_in_registers::<$T, &IndexMap<4>, 1, $v>(
                    &p, &p.inner, x, dy, dx, scale, mean, rstd, partials,
                )
            }
        )* }
    };
}

/// The entry points of one dtype. Slot counts keep a thread's row values within the
/// register budget the host plans with (`src/ops/layer_norm.rs`): 32 values forward, 16
/// backward (whose weight-gradient sums are f32).
macro_rules! layer_norm_entry_points {
    (f32, $T:ty) => {
        layer_norm_entry_points!(@all f32, $T, [1 2 4 8], [1 2 4]);
    };
    ($dt:ident, $T:ty) => {
        layer_norm_entry_points!(@all $dt, $T, [1 2 4], [1 2]);
    };
    (@all $dt:ident, $T:ty, [$($fv:literal)*], [$($bv:literal)*]) => {
        fwd_vec_entry_points!($dt, $T, $($fv)*);
        bwd_vec_entry_points!($dt, $T, $($bv)*);
        mapped_entry_points!($dt, $T, 4);
        paste::paste! {
            /// # Safety
            /// As `layer_norm_fwd_vec*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_fwd_long_vec_ $dt>](
                p: LayerNormFwdParams, x: *const $T, y: *mut $T, scale: *const u8,
                bias: *const u8, mean: *mut f32, rstd: *mut f32,
            ) {
                fwd_streamed::<$T, Dense, { vector_elements::<$T>() }>(
                    &p, Dense, x, y, scale, bias, mean, rstd,
                )
            }
            /// # Safety
            /// As `layer_norm_fwd_map*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_fwd_long_map_ $dt>](
                p: LayerNormFwdParams, x: *const $T, y: *mut $T, scale: *const u8,
                bias: *const u8, mean: *mut f32, rstd: *mut f32,
            ) {
                fwd_streamed::<$T, &IndexMap<4>, 1>(&p, &p.inner, x, y, scale, bias, mean, rstd)
            }
            /// # Safety
            /// As `layer_norm_bwd_vec*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_bwd_long_vec_ $dt>](
                p: LayerNormBwdParams, x: *const $T, dy: *const $T, dx: *mut $T,
                scale: *const u8, mean: *const f32, rstd: *const f32, partials: *mut f32,
            ) {
                bwd_streamed::<$T, Dense, { vector_elements::<$T>() }>(
                    &p, Dense, x, dy, dx, scale, mean, rstd, partials,
                )
            }
            /// # Safety
            /// As `layer_norm_bwd_map*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_bwd_long_map_ $dt>](
                p: LayerNormBwdParams, x: *const $T, dy: *const $T, dx: *mut $T,
                scale: *const u8, mean: *const f32, rstd: *const f32, partials: *mut f32,
            ) {
                bwd_streamed::<$T, &IndexMap<4>, 1>(
                    &p, &p.inner, x, dy, dx, scale, mean, rstd, partials,
                )
            }
            /// # Safety
            /// `partials` holds what a `layer_norm_bwd_*` launch with the same `slots` and
            /// `row_len` wrote (same stream); `dscale` / `dbias` cover the offsets of
            /// `p.weights` when their flags are set. `NORM_FINALIZE_THREADS` threads per
            /// block, one block per 32 elements.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<layer_norm_bwd_weights_ $dt>](
                p: LayerNormWeightsParams, partials: *const f32, dscale: *mut $T, dbias: *mut $T,
            ) {
                bwd_weights::<$T>(&p, partials, dscale, dbias)
            }
        }
    };
}

crate::for_each_dtype!(layer_norm_entry_points);
