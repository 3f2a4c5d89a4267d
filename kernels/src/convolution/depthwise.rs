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

use crate::device::{fma, grid_stride};
use crate::element::{Bf16, Element, F16};
use crate::epilogue;
use crate::unrolled;
use oxidnn_params::{ConvDepthwiseParams, ConvGeometry, PoolCoord, DW_COLS, DW_PIXELS, DW_STRIP};

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
        store_pixels::<T, VEC, PIXELS>(p, y, bias, z, [n, k, o0, o1, c0], acc);
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
            store_pixels::<T, VEC, L>(p, y, bias, z, [n, k, o0, o1, c0], acc);
        },
    );
}

/// Stores `L` consecutive output pixels' channel vectors (`pos`: `[n, k, o0, o1, o2]` of
/// the first) through the epilogue; pixels past the output's end are skipped.
#[inline(always)]
unsafe fn store_pixels<T: Element, const VEC: usize, const L: usize>(
    p: &ConvDepthwiseParams,
    y: *mut T,
    bias: *const T,
    z: *const T,
    [n, k, o0, o1, c0]: [u32; 5],
    acc: [[f32; VEC]; L],
) {
    let g = &p.geo;
    unrolled!(j in L => {
        let o2 = c0 + j as u32;
        if o2 < g.output[2] {
            let at = |s: &[u32; 5]| n * s[0] + k * s[1] + o0 * s[2] + o1 * s[3] + o2 * s[4];
            let (yp, zp) = (y.add(at(&g.y) as usize), z.add(at(&g.z) as usize));
            let zs = g.z[1] as usize;
            let r = epilogue::apply(
                &p.ops,
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
        }
    };
}

strip_entry_points!(f16, F16);
strip_entry_points!(bf16, Bf16);
