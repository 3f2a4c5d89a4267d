//! Depthwise convolution (groups == c: output channel `k` reads only input channel
//! `k / k_per_group`), f32 accumulation, every dtype. Memory-bound: each kernel keeps
//! its loads coalesced and reuses inputs in registers.
//!
//! * `conv_fwd_depthwise_rows_<dtype>`: one thread per [`DW_COLS`] consecutive outputs of
//!   one row (innermost spatial dim) of one `(n, k)` plane; consecutive threads take
//!   consecutive column groups. For each filter row the thread loads the input window
//!   its outputs share once into registers (filter widths 3 and 5 at strides 1 and 2,
//!   dilation 1; other filters read tap by tap) and stores its outputs with one vector
//!   store where y's row is contiguous and aligned. Any layout; the choice for NCHW.
//! * `conv_fwd_depthwise_vec_<dtype>`: channels-last (x and y channel stride 1,
//!   `k_per_group == 1`, 16-byte aligned channel vectors): one thread per 16-byte vector
//!   of channels of [`DW_PIXELS`] consecutive output pixels of a row, every x and y access
//!   a 16-byte vector, consecutive threads on consecutive channel vectors.
//! * `conv_fwd_depthwise_strip3s<ST>_<f16|bf16>`: as `vec` for the common case, a packed
//!   3x3 filter (depth 1) at stride `ST` (1 or 2) and dilation 1 along the innermost dim:
//!   one thread per channel vector of [`DW_STRIP`] consecutive outputs. The thread holds
//!   its filter (`9 * VEC` f32, read as 9 16-byte vectors) and reads each of the
//!   `(STRIP - 1) * ST + 3` input columns of each filter row once, one 16-byte vector
//!   that every output using it takes from registers: `27 / 7` (stride 1) or `45 / 7`
//!   vector loads per output vector, where `vec` makes 9 and `9 * VEC` scalar filter
//!   loads. It holds 230 (stride 1) to 255 registers: one block of 8 warps per SM.
//! * `conv_fwd_depthwise_tile3_<f16|bf16>`: channels-last, a packed 3x3 filter at stride 1
//!   and dilation 1 along both inner dims ([`ConvDepthwiseTileParams`]): a block stages
//!   the input rows of its tile (`tile_w + 2` columns of up to 8 channel vectors) in a
//!   shared-memory ring by `cp.async`, 6 rows ahead; each thread keeps its channel
//!   vector's filter and three partial output rows in registers, reads 3 vectors per input
//!   row from shared memory and stores one output vector per row (144 registers, capped
//!   by `.maxnreg` in build.rs: three 4-warp blocks per SM).

use crate::device::{
    block_dim_x, block_idx_x, cp_async_16, cp_async_commit, cp_async_wait, dynamic_smem,
    ld_shared_v2, ld_shared_v4, sync_threads, thread_idx_x,
};
use crate::device::{fma, grid_stride};
use crate::element::{Bf16, Element, F16};
use crate::epilogue;
use crate::unrolled;
use oxidnn_params::{
    ConvDepthwiseParams, ConvDepthwiseTileParams, ConvGeometry, EpilogueOps, PoolCoord, DW_COLS,
    DW_PIXELS, DW_STRIP, DW_TILE_AHEAD, DW_TILE_SLOTS,
};

const COLS: usize = DW_COLS as usize;
const PIXELS: usize = DW_PIXELS as usize;
const STRIP: usize = DW_STRIP as usize;
/// Registers of the input window of [`row_window`]: `(COLS - 1) * stride + width`.
const WINDOW: usize = 16;

/// Calls `f(i0_offset_in_x, filter_row_offset_in_w)` for each filter tap of the two
/// outer spatial dims whose input row `(i0, i1)` lies inside x (padding rows skipped).
#[inline(always)]
fn for_each_row(g: &ConvGeometry, o0: u32, o1: u32, mut f: impl FnMut(u32, u32)) {
    for f0 in 0..g.filter[0] {
        let Some(i0) = g.input_at(0, o0, f0) else {
            continue;
        };
        let (x0, w0) = (i0 * g.x[2], g.filter_at(0, f0) * g.w[2]);
        for f1 in 0..g.filter[1] {
            let Some(i1) = g.input_at(1, o1, f1) else {
                continue;
            };
            f(x0 + i1 * g.x[3], w0 + g.filter_at(1, f1) * g.w[3]);
        }
    }
}

/// `acc[v] +=` one filter row (at `wr`) over input row `xr` for outputs `c0 + v`, tap by
/// tap (any width, stride, dilation).
#[inline(always)]
unsafe fn row_taps<T: Element>(
    g: &ConvGeometry,
    xr: *const T,
    wr: *const T,
    c0: u32,
    acc: &mut [f32; COLS],
) {
    for f2 in 0..g.filter[2] {
        let wv = T::load(wr.add((g.filter_at(2, f2) * g.w[4]) as usize));
        unrolled!(v in COLS => {
            if let Some(i2) = g.input_at(2, c0 + v as u32, f2) {
                acc[v] = fma(T::load(xr.add((i2 * g.x[4]) as usize)), wv, acc[v]);
            }
        });
    }
}

/// As [`row_taps`] for a filter `SW` wide at stride `ST`, dilation 1: the
/// `(COLS - 1) * ST + SW` inputs the outputs share are loaded once (0 in the padding).
#[inline(always)]
unsafe fn row_window<T: Element, const SW: usize, const ST: usize>(
    g: &ConvGeometry,
    xr: *const T,
    wr: *const T,
    c0: u32,
    acc: &mut [f32; COLS],
) {
    let first = (c0 * ST as u32).wrapping_sub(g.pad[2]);
    let mut win = [0f32; WINDOW];
    unrolled!(i in (COLS - 1) * ST + SW => {
        let c = first.wrapping_add(i as u32);
        if c < g.input[2] {
            win[i] = T::load(xr.add((c * g.x[4]) as usize));
        }
    });
    let wv: [f32; SW] =
        core::array::from_fn(|s| T::load(wr.add((g.filter_at(2, s as u32) * g.w[4]) as usize)));
    unrolled!(v in COLS => {
        unrolled!(s in SW => acc[v] = fma(win[v * ST + s], wv[s], acc[v]));
    });
}

/// The `rows` kernel's loop with the row function `SW`/`ST` (0: [`row_taps`]).
#[inline(always)]
unsafe fn rows_with<T: Element, const SW: usize, const ST: usize>(
    p: &ConvDepthwiseParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    grid_stride(p.items.len as u64, |item| {
        let item = item as u32;
        let PoolCoord {
            n,
            c: k,
            s: [o0, o1, group],
        } = p.items.at(item);
        let c0 = group * COLS as u32;
        let ci = if g.k_per_group == 1 {
            k
        } else {
            k / g.k_per_group
        };
        let xb = x.add((n * g.x[0] + ci * g.x[1]) as usize);
        let wb = w.add((k * g.w[0]) as usize);
        let mut acc = [0f32; COLS];
        for_each_row(g, o0, o1, |xo, wo| {
            let (xr, wr) = (xb.add(xo as usize), wb.add(wo as usize));
            if SW == 0 {
                row_taps(g, xr, wr, c0, &mut acc);
            } else {
                row_window::<T, SW, ST>(g, xr, wr, c0, &mut acc);
            }
        });
        let count = (g.output[2] - c0).min(COLS as u32);
        let at = |s: &[u32; 5]| n * s[0] + k * s[1] + o0 * s[2] + o1 * s[3] + c0 * s[4];
        let (yr, zr) = (y.add(at(&g.y) as usize), z.add(at(&g.z) as usize));
        let (ys, zs) = (g.y[4] as usize, g.z[4] as usize);
        let r = epilogue::apply(
            &p.ops,
            acc,
            T::LOW_PRECISION,
            || {
                core::array::from_fn(|v| {
                    if (v as u32) < count {
                        T::load(yr.add(v * ys))
                    } else {
                        0.0
                    }
                })
            },
            |_| [T::load(bias.add(k as usize)); COLS],
            || {
                core::array::from_fn(|v| {
                    if (v as u32) < count {
                        T::load(zr.add(v * zs))
                    } else {
                        0.0
                    }
                })
            },
        );
        let vector_bytes = COLS * size_of::<T>();
        if count == COLS as u32 && ys == 1 && (yr as usize) % vector_bytes == 0 {
            T::store_vec::<COLS>(yr, r);
        } else {
            unrolled!(v in COLS => {
                if (v as u32) < count {
                    T::store(yr.add(v * ys), r[v]);
                }
            });
        }
    });
}

#[inline(always)]
unsafe fn rows<T: Element>(
    p: &ConvDepthwiseParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    match (g.filter[2], g.stride[2], g.dilation[2]) {
        (3, 1, 1) => rows_with::<T, 3, 1>(p, x, w, y, bias, z),
        (3, 2, 1) => rows_with::<T, 3, 2>(p, x, w, y, bias, z),
        (5, 1, 1) => rows_with::<T, 5, 1>(p, x, w, y, bias, z),
        (5, 2, 1) => rows_with::<T, 5, 2>(p, x, w, y, bias, z),
        _ => rows_with::<T, 0, 0>(p, x, w, y, bias, z),
    }
}

/// The channels-last kernel: `VEC` channels (16 bytes) of [`PIXELS`] pixels per thread.
#[inline(always)]
unsafe fn vec<T: Element, const VEC: usize>(
    p: &ConvDepthwiseParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    grid_stride(p.items.len as u64, |item| {
        let item = item as u32;
        let PoolCoord {
            n,
            c: cv,
            s: [o0, o1, group],
        } = p.items.at(item);
        let k = cv * VEC as u32;
        let c0 = group * PIXELS as u32;
        let xb = x.add((n * g.x[0] + k) as usize);
        let wb = w.add((k * g.w[0]) as usize);
        let mut acc = [[0f32; VEC]; PIXELS];
        for_each_row(g, o0, o1, |xo, wo| {
            let (xr, wr) = (xb.add(xo as usize), wb.add(wo as usize));
            for f2 in 0..g.filter[2] {
                let wt = wr.add((g.filter_at(2, f2) * g.w[4]) as usize);
                let wv: [f32; VEC] = core::array::from_fn(|e| T::load(wt.add(e * g.w[0] as usize)));
                unrolled!(j in PIXELS => {
                    if let Some(i2) = g.input_at(2, c0 + j as u32, f2) {
                        let xv = T::unpack::<VEC>(T::load_raw::<VEC>(xr.add((i2 * g.x[4]) as usize), true));
                        unrolled!(e in VEC => acc[j][e] = fma(xv[e], wv[e], acc[j][e]));
                    }
                });
            }
        });
        store_pixels::<T, VEC, PIXELS>(&p.geo, &p.ops, y, bias, z, [n, k, o0, o1, c0], acc);
    });
}

/// The `F x F` taps (depth 1) of channels `k .. k + VEC` as f32, `[row][column][channel]`
/// in the order the outputs apply them (reversed in convolution mode), from a packed
/// filter (`[k][r][s]` contiguous, 16-byte aligned): the thread's `VEC * F * F` taps are
/// consecutive, `F * F` 16-byte vectors.
#[inline(always)]
unsafe fn filter_taps<T: Element, const VEC: usize, const F: usize>(
    g: &ConvGeometry,
    w: *const T,
    k: u32,
) -> [[[f32; VEC]; F]; F] {
    let wb = w.add((k * g.w[0]) as usize);
    // raw[a][b]: vector `a * F + b`, elements `(a * F + b) * VEC ..` of the thread's
    // `[channel][r][s]` taps.
    let mut raw = [[[0f32; VEC]; F]; F];
    unrolled!(a in F => unrolled!(b in F => {
        raw[a][b] = T::unpack::<VEC>(T::load_raw::<VEC>(wb.add((a * F + b) * VEC), true));
    }));
    let at = |e: usize, r: usize, s: usize| {
        let m = (e * F + r) * F + s;
        raw[m / VEC / F][m / VEC % F][m % VEC]
    };
    let flip = g.flip != 0;
    let mut taps = [[[0f32; VEC]; F]; F];
    unrolled!(r in F => unrolled!(s in F => unrolled!(e in VEC => {
        taps[r][s][e] = if flip { at(e, F - 1 - r, F - 1 - s) } else { at(e, r, s) };
    })));
    taps
}

/// The `strip` kernel: `VEC` channels (16 bytes) of `L` consecutive outputs per thread,
/// for an `F x F` filter of depth 1 at stride `ST` and dilation 1 along the innermost dim
/// (any stride and dilation along the others). For each filter row the `(L - 1) * ST + F`
/// input columns (at most 24) are loaded once each (zero in the padding) and applied to
/// every output they reach.
#[inline(always)]
unsafe fn strip<T: Element, const VEC: usize, const F: usize, const ST: usize, const L: usize>(
    p: &ConvDepthwiseParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    let columns = (L - 1) * ST + F;
    const {
        assert!(
            (L - 1) * ST + F <= 24,
            "the column loop below lists 24 columns"
        )
    };
    // The body inlined whatever its size: outlined, the closure's captures (and the
    // register arrays) would live in local memory.
    grid_stride(
        p.items.len as u64,
        #[inline(always)]
        |item| {
            let item = item as u32;
            let PoolCoord {
                n,
                c: cv,
                s: [o0, o1, group],
            } = p.items.at(item);
            let k = cv * VEC as u32;
            let taps = filter_taps::<T, VEC, F>(g, w, k);
            let c0 = group * L as u32;
            let first = (c0 * ST as u32).wrapping_sub(g.pad[2]);
            let xb = x.add((n * g.x[0] + k) as usize);
            let i0 = g.input_at(0, o0, 0);
            let mut acc = [[0f32; VEC]; L];
            unrolled!(r in F => {
                // The row's offset in x, or None in the padding (its inputs count as 0).
                let row = match (i0, g.input_at(1, o1, r as u32)) {
                    (Some(i0), Some(i1)) => Some(i0 * g.x[2] + i1 * g.x[3]),
                    _ => None,
                };
                crate::unroll!(c in [
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23
                ] {
                    if c < columns {
                        let ic = first.wrapping_add(c as u32);
                        let v = match row {
                            Some(ro) if ic < g.input[2] => T::unpack::<VEC>(T::load_raw::<VEC>(
                                xb.add((ro + ic * g.x[4]) as usize),
                                true,
                            )),
                            _ => [0f32; VEC],
                        };
                        // Column c is tap s of output j where j * ST + s == c.
                        unrolled!(s in F => {
                            if c >= s && (c - s) % ST == 0 && (c - s) / ST < L {
                                let j = (c - s) / ST;
                                unrolled!(e in VEC => acc[j][e] = fma(v[e], taps[r][s][e], acc[j][e]));
                            }
                        });
                    }
                });
            });
            store_pixels::<T, VEC, L>(&p.geo, &p.ops, y, bias, z, [n, k, o0, o1, c0], acc);
        },
    );
}

/// The `tile3` kernel (see [`ConvDepthwiseTileParams`]): a block stages the input rows of
/// its `tile_h x tile_w` outputs of `channel_vectors` channel vectors in shared memory by
/// `cp.async` ([`DW_TILE_AHEAD`] rows ahead, a ring of [`DW_TILE_SLOTS`]); each thread
/// keeps its channel vector's 3x3 filter and three partial output rows in registers and
/// reads 3 vectors from shared memory per input row. `CH`: channels per thread, `VEC` (a
/// whole vector) in the entry points; `VEC / 2` (two threads per vector, 93 registers
/// instead of 144) ran 0-10% slower on every MobileNet layer (H100) and has none.
#[inline(always)]
unsafe fn tile3<T: Element, const VEC: usize, const CH: usize>(
    p: &ConvDepthwiseTileParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    const AHEAD: u32 = DW_TILE_AHEAD;
    const SLOTS: u32 = DW_TILE_SLOTS;
    const { assert!(DW_TILE_SLOTS >= DW_TILE_AHEAD + 2 && DW_TILE_AHEAD <= 7) };
    const { assert!((CH == VEC || 2 * CH == VEC) && CH * size_of::<T>() >= 8) };
    let g = &p.geo;
    let cvs = p.channel_vectors;
    // Block coordinates: column tiles fastest, then row tiles, channel tiles, planes.
    let b = block_idx_x();
    let (q, col_tile) = (b / p.col_tiles, b % p.col_tiles);
    let (q, row_tile) = (q / p.row_tiles, q % p.row_tiles);
    let (plane, channel_tile) = (q / p.channel_tiles, q % p.channel_tiles);
    let (n, o0) = (plane / g.output[0], plane % g.output[0]);
    let (ow0, oh0) = (col_tile * p.tile_w, row_tile * p.tile_h);
    let rows_out = (g.output[1] - oh0).min(p.tile_h);
    let rows_in = rows_out + 2;
    let k0 = channel_tile * cvs * VEC as u32;
    // The staged row: `tile_w + 2` columns (input columns `ow0 - pad ..`) of `cvs` vectors.
    let row_vectors = (p.tile_w + 2) * cvs;
    let row_bytes = row_vectors * 16;
    let smem = dynamic_smem();
    let (t, threads) = (thread_idx_x(), block_dim_x());
    // The depth plane's input row offset, or None if the plane is padding (zero input).
    let plane_x = g.input_at(0, o0, 0).map(|i0| n * g.x[0] + i0 * g.x[2] + k0);
    // This thread's staged chunks (at most two per row: the host launches at least half a
    // row's chunks of threads): (shared offset in the row, x offset in the row or None in
    // the column padding).
    let chunk = |i: u32| -> Option<(u32, Option<u32>)> {
        let idx = t + i * threads;
        (idx < row_vectors).then(|| {
            let (col, v) = (idx / cvs, idx % cvs);
            let iw = (ow0 + col).wrapping_sub(g.pad[2]);
            (
                idx * 16,
                (iw < g.input[2]).then(|| iw * g.x[4] + v * VEC as u32),
            )
        })
    };
    let chunks = [chunk(0), chunk(1)];
    // Stages input row `r` of the tile (input row `oh0 - pad + r`) into its ring slot;
    // rows and columns outside x are zero-filled.
    let stage = |r: u32| {
        let ih = (oh0 + r).wrapping_sub(g.pad[1]);
        let row_x = match plane_x {
            Some(px) if ih < g.input[1] => Some(px + ih * g.x[3]),
            _ => None,
        };
        let slot = smem + (r % SLOTS) * row_bytes;
        for c in chunks.iter().flatten() {
            let (off, col_x) = *c;
            match (row_x, col_x) {
                (Some(rx), Some(cx)) => {
                    cp_async_16(slot + off, x.add((rx + cx) as usize) as *const u8, 16)
                }
                _ => cp_async_16(slot + off, x as *const u8, 0),
            }
        }
    };
    // The thread's `CH` output channels: part `t % per_col` of column `t / per_col`'s
    // channel vectors (a whole 16-byte vector, or half of one, per thread).
    let per_col = cvs * (VEC / CH) as u32;
    let (col, u) = (t / per_col, t % per_col);
    let active = col < p.tile_w && ow0 + col < g.output[2];
    let k = k0 + u * CH as u32;
    let taps = if active {
        filter_taps::<T, CH, 3>(g, w, k)
    } else {
        [[[0f32; CH]; 3]; 3]
    };
    // Shared offset of the thread's channels of its first input column (column `col`) in
    // a slot: `col * cvs * 16 + u * CH * size`.
    let read_at = t * (CH * size_of::<T>()) as u32;
    // Partial sums of output rows `r - 2`, `r - 1` and `r` while input row `r` is applied.
    let mut acc = [[0f32; CH]; 3];
    for r in 0..AHEAD {
        if r < rows_in {
            stage(r);
        }
        cp_async_commit();
    }
    for r in 0..rows_in {
        if r + AHEAD < rows_in {
            stage(r + AHEAD);
        }
        // One group per row (empty past the last): row r's is complete when at most AHEAD
        // later ones are pending.
        cp_async_commit();
        cp_async_wait(AHEAD);
        // Every thread's copies of row r are complete and visible; the slot staged next
        // (row r + AHEAD + 1, SLOTS >= AHEAD + 2 rows later in the ring) was last read
        // before this barrier's previous crossing.
        sync_threads();
        if active {
            let slot = smem + (r % SLOTS) * row_bytes + read_at;
            unrolled!(s in 3 => {
                let at = slot + s as u32 * cvs * 16;
                let raw = if CH * size_of::<T>() == 16 {
                    ld_shared_v4(at)
                } else {
                    let [a, b] = ld_shared_v2(at);
                    [a, b, 0, 0]
                };
                let xv = T::unpack::<CH>(raw);
                unrolled!(e in CH => {
                    acc[0][e] = fma(xv[e], taps[2][s][e], acc[0][e]);
                    acc[1][e] = fma(xv[e], taps[1][s][e], acc[1][e]);
                    acc[2][e] = fma(xv[e], taps[0][s][e], acc[2][e]);
                });
            });
            if r >= 2 {
                let o1 = oh0 + r - 2;
                store_pixels::<T, CH, 1>(
                    g,
                    &p.ops,
                    y,
                    bias,
                    z,
                    [n, k, o0, o1, ow0 + col],
                    [acc[0]],
                );
            }
        }
        acc[0] = acc[1];
        acc[1] = acc[2];
        acc[2] = [0f32; CH];
    }
    // Leave no copy in flight at exit (the trailing groups are empty).
    cp_async_wait(0);
}

/// Stores `L` consecutive output pixels' channel vectors (`pos`: `[n, k, o0, o1, o2]` of
/// the first) through the epilogue; pixels past the output's end are skipped.
#[inline(always)]
unsafe fn store_pixels<T: Element, const VEC: usize, const L: usize>(
    g: &ConvGeometry,
    ops: &EpilogueOps,
    y: *mut T,
    bias: *const T,
    z: *const T,
    [n, k, o0, o1, c0]: [u32; 5],
    acc: [[f32; VEC]; L],
) {
    unrolled!(j in L => {
        let o2 = c0 + j as u32;
        if o2 < g.output[2] {
            let at = |s: &[u32; 5]| n * s[0] + k * s[1] + o0 * s[2] + o1 * s[3] + o2 * s[4];
            let (yp, zp) = (y.add(at(&g.y) as usize), z.add(at(&g.z) as usize));
            let zs = g.z[1] as usize;
            let r = epilogue::apply(
                ops,
                acc[j],
                T::LOW_PRECISION,
                || T::unpack::<VEC>(T::load_raw::<VEC>(yp, false)),
                |_| core::array::from_fn(|e| T::load(bias.add(k as usize + e))),
                || core::array::from_fn(|e| T::load(zp.add(e * zs))),
            );
            T::store_vec::<VEC>(yp, r);
        }
    });
}

macro_rules! depthwise_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `x`, `w`, `y` (and `bias`, `z` where the epilogue reads them) cover the
            /// tensors `p.geo` describes (spans below 2^31 elements); y's offsets are
            /// distinct and y does not overlap x.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_depthwise_rows_ $dt>](
                p: ConvDepthwiseParams, x: *const $T, w: *const $T, y: *mut $T,
                bias: *const $T, z: *const $T,
            ) {
                rows::<$T>(&p, x, w, y, bias, z)
            }

            /// # Safety
            /// As the `rows` kernel; besides, x and y have channel stride 1, their other
            /// strides and both base pointers are 16-byte multiples, k equals c and
            /// divides into 16-byte vectors.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_depthwise_vec_ $dt>](
                p: ConvDepthwiseParams, x: *const $T, w: *const $T, y: *mut $T,
                bias: *const $T, z: *const $T,
            ) {
                vec::<$T, { 16 / size_of::<$T>() }>(&p, x, w, y, bias, z)
            }
        }
    };
}

depthwise_entry_points!(f32, f32);
depthwise_entry_points!(f16, F16);
depthwise_entry_points!(bf16, Bf16);

/// The `strip` kernels, for the 16-bit types only: with f32's 4-channel vectors a thread
/// holds half the channels for the same registers (the shape that ran slower than `vec`
/// in f16 on the large layers), and f32 channels-last has not been timed; it keeps `vec`.
macro_rules! strip_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// As the `vec` kernel; besides, the filter is 3x3 (depth 1), packed (strides
            /// `[9, _, _, 3, 1]`) and 16-byte aligned, and the innermost dim has stride 1
            /// and dilation 1.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_depthwise_strip3s1_ $dt>](
                p: ConvDepthwiseParams, x: *const $T, w: *const $T, y: *mut $T,
                bias: *const $T, z: *const $T,
            ) {
                strip::<$T, { 16 / size_of::<$T>() }, 3, 1, STRIP>(&p, x, w, y, bias, z)
            }

            /// # Safety
            /// As `strip3s1`, at stride 2 along the innermost dim.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_depthwise_strip3s2_ $dt>](
                p: ConvDepthwiseParams, x: *const $T, w: *const $T, y: *mut $T,
                bias: *const $T, z: *const $T,
            ) {
                strip::<$T, { 16 / size_of::<$T>() }, 3, 2, STRIP>(&p, x, w, y, bias, z)
            }

            /// # Safety
            /// As `strip3s1`, at stride 1 and dilation 1 along both inner spatial dims;
            /// the block shape, dynamic shared memory and grid are those
            /// `ConvDepthwiseTileParams` describes (`dw_tile_threads`,
            /// `dw_tile_shared_bytes`), `channel_vectors` divides k's vectors.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_depthwise_tile3_ $dt>](
                p: ConvDepthwiseTileParams, x: *const $T, w: *const $T, y: *mut $T,
                bias: *const $T, z: *const $T,
            ) {
                tile3::<$T, { 16 / size_of::<$T>() }, { 16 / size_of::<$T>() }>(
                    &p, x, w, y, bias, z,
                )
            }
        }
    };
}

strip_entry_points!(f16, F16);
strip_entry_points!(bf16, Bf16);
