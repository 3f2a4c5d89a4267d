//! Winograd F(2x2, 3x3) forward convolution, non-fused (cuDNN's `WINOGRAD_NONFUSED`): three
//! transform kernels around one batched matmul that the host runs on the matmul core.
//!
//! With Lavin & Gray's matrices, a 2x2 output tile `Y` of a 3x3 filter `g` over the 4x4
//! input patch `d` is `Y = A^T [(G g G^T) . (B^T d B)] A` (`.` elementwise), so a tile
//! costs 16 multiplies per channel pair instead of 36, and the sum over input channels of
//! each of the 16 elementwise products is a matmul:
//!
//! * `conv_fwd_winograd_input_<dt>`: `V = B^T d B` per (tile, c), into the workspace;
//! * `conv_fwd_winograd_filter_<dt>`: `U = G g G^T` per (k, c) (the filter reversed in
//!   convolution mode);
//! * (host) `M[xi] = V[xi] U[xi]^T` for the 16 points `xi`, f32 results;
//! * `conv_fwd_winograd_output_<dt>`: `Y = A^T M A` per (tile, k), each in-range pixel
//!   through the shared epilogue into y (any strides; edge tiles of odd `p`/`q` store
//!   only their in-range pixels).
//!
//! Layouts and items: [`ConvWinogradParams`]. The transforms compute in f32; V and U are
//! stored in the data's type (the matmul core's input type), which rounds them.

use crate::device::grid_stride;
use crate::element::Element;
use crate::epilogue;
use crate::unrolled;
use oxidnn_params::ConvWinogradParams;

/// Calls `f(outer, inner)` for every work item of this thread (grid-stride; the host
/// keeps `items` below 2^31, so the index never wraps).
#[inline(always)]
fn for_items(p: &ConvWinogradParams, mut f: impl FnMut(u32, u32)) {
    grid_stride(p.items as u64, |i| {
        let (outer, inner) = p.inner.div_rem(i as u32);
        f(outer, inner);
    });
}

/// `(tile, channel)` of an input/output transform item.
#[inline(always)]
fn tile_and_channel(p: &ConvWinogradParams, outer: u32, inner: u32) -> (u32, u32) {
    if p.channel_inner != 0 {
        (outer, inner)
    } else {
        (inner, outer)
    }
}

/// `(n, th, tw)` of tile `t`.
#[inline(always)]
fn tile_coords(p: &ConvWinogradParams, t: u32) -> (u32, u32, u32) {
    let (q, tw) = p.tiles_w.div_rem(t);
    let (n, th) = p.tiles_h.div_rem(q);
    (n, th, tw)
}

/// `L` consecutive elements (1, or a pair by one 32-bit access for 16-bit types).
///
/// # Safety
/// The elements are readable; for `L == 2` and 16-bit types `p` is 4-byte aligned.
#[inline(always)]
unsafe fn load_n<T: Element, const L: usize>(p: *const T) -> [f32; L] {
    let mut out = [0f32; L];
    if L == 2 {
        let v = T::load_pair(p);
        (out[0], out[1]) = (v[0], v[1]);
    } else {
        unrolled!(l in L => out[l] = T::load(p.add(l)));
    }
    out
}

/// Stores `L` consecutive elements (as [`load_n`]).
///
/// # Safety
/// The elements are writable; for `L == 2` and 16-bit types `p` is 4-byte aligned.
#[inline(always)]
unsafe fn store_n<T: Element, const L: usize>(p: *mut T, v: [f32; L]) {
    if L == 2 {
        T::store_pair(p, [v[0], v[1]]);
    } else {
        unrolled!(l in L => T::store(p.add(l), v[l]));
    }
}

/// `B^T v` for one column (or row) `v` of the 4x4 input patch.
#[inline(always)]
fn bt(v: [f32; 4]) -> [f32; 4] {
    [v[0] - v[2], v[1] + v[2], v[2] - v[1], v[1] - v[3]]
}

/// `G v` for one column (or row) `v` of the 3x3 filter.
#[inline(always)]
fn g3(v: [f32; 3]) -> [f32; 4] {
    let h = 0.5 * (v[0] + v[2]);
    [v[0], h + 0.5 * v[1], h - 0.5 * v[1], v[2]]
}

/// `A^T v` for one column (or row) `v` of the 4x4 product tile.
#[inline(always)]
fn at(v: [f32; 4]) -> [f32; 2] {
    [v[0] + v[1] + v[2], v[1] - v[2] - v[3]]
}

/// `V = B^T d B` of every (tile, c) item; `L` consecutive channels per item (`L == 2`
/// only with the channel inner, x's channels contiguous and its offsets even).
#[inline(always)]
unsafe fn input<T: Element, const L: usize>(p: &ConvWinogradParams, x: *const T, v: *mut T) {
    let g = &p.geo;
    for_items(p, |outer, inner| {
        let (t, c) = tile_and_channel(p, outer, inner);
        let c = c * L as u32;
        let (n, th, tw) = tile_coords(p, t);
        let h0 = (2 * th) as i32 - g.pad[1] as i32;
        let w0 = (2 * tw) as i32 - g.pad[2] as i32;
        let xb = x.add((n * g.x[0] + c * g.x[1]) as usize);
        // d[row][col][channel], zeros outside x.
        let mut d = [[[0f32; L]; 4]; 4];
        unrolled!(i in 4 => {
            let h = h0 + i as i32;
            if h >= 0 && (h as u32) < g.input[1] {
                unrolled!(j in 4 => {
                    let w = w0 + j as i32;
                    if w >= 0 && (w as u32) < g.input[2] {
                        let at = h as u32 * g.x[3] + w as u32 * g.x[4];
                        d[i][j] = load_n::<T, L>(xb.add(at as usize));
                    }
                });
            }
        });
        let base = t as u64 * p.v.mn + c as u64 * p.v.k;
        unrolled!(l in L => {
            // B^T d: the transform down each column, then along each row.
            let mut cols = [[0f32; 4]; 4];
            unrolled!(j in 4 => {
                let r = bt([d[0][j][l], d[1][j][l], d[2][j][l], d[3][j][l]]);
                unrolled!(i in 4 => cols[i][j] = r[i]);
            });
            unrolled!(i in 4 => {
                let r = bt(cols[i]);
                unrolled!(j in 4 => d[i][j][l] = r[j]);
            });
        });
        unrolled!(i in 4 => {
            unrolled!(j in 4 => {
                let at = base + (4 * i + j) as u64 * p.v.batch;
                store_n::<T, L>(v.add(at as usize), d[i][j]);
            });
        });
    });
}

/// `U = G g G^T` of every (k, c) item.
#[inline(always)]
unsafe fn filter<T: Element>(p: &ConvWinogradParams, w: *const T, u: *mut T) {
    let g = &p.geo;
    for_items(p, |k, c| {
        let wb = w.add((k * g.w[0] + c * g.w[1]) as usize);
        let mut f = [[0f32; 3]; 3];
        unrolled!(r in 3 => {
            unrolled!(s in 3 => {
                let (fr, fs) = (g.filter_at(1, r as u32), g.filter_at(2, s as u32));
                f[r][s] = T::load(wb.add((fr * g.w[3] + fs * g.w[4]) as usize));
            });
        });
        let mut cols = [[0f32; 3]; 4];
        unrolled!(s in 3 => {
            let r = g3([f[0][s], f[1][s], f[2][s]]);
            unrolled!(i in 4 => cols[i][s] = r[i]);
        });
        let base = k as u64 * p.u.mn + c as u64 * p.u.k;
        unrolled!(i in 4 => {
            let r = g3(cols[i]);
            unrolled!(j in 4 => {
                T::store(u.add((base + (4 * i + j) as u64 * p.u.batch) as usize), r[j]);
            });
        });
    });
}

/// `Y = A^T M A` of every (tile, k) item, through the epilogue into y; `L` consecutive
/// output channels per item (`L == 2` only with the channel inner, M's, y's (and z's)
/// channels contiguous and their offsets even).
#[inline(always)]
unsafe fn output<T: Element, const L: usize>(
    p: &ConvWinogradParams,
    m: *const f32,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    for_items(p, |outer, inner| {
        let (t, k) = tile_and_channel(p, outer, inner);
        let k = k * L as u32;
        let (n, th, tw) = tile_coords(p, t);
        let base = t as u64 * p.m.row + k as u64 * p.m.col;
        let mut mm = [[[0f32; L]; 4]; 4];
        unrolled!(i in 4 => {
            unrolled!(j in 4 => {
                let at = base + (4 * i + j) as u64 * p.m.batch;
                unrolled!(l in L => mm[i][j][l] = *m.add((at + l as u64 * p.m.col) as usize));
            });
        });
        // y[i][j][channel] = A^T M A.
        let mut out = [[[0f32; L]; 2]; 2];
        unrolled!(l in L => {
            let mut cols = [[0f32; 4]; 2];
            unrolled!(j in 4 => {
                let r = at([mm[0][j][l], mm[1][j][l], mm[2][j][l], mm[3][j][l]]);
                unrolled!(i in 2 => cols[i][j] = r[i]);
            });
            unrolled!(i in 2 => {
                let r = at(cols[i]);
                unrolled!(j in 2 => out[i][j][l] = r[j]);
            });
        });
        unrolled!(i in 2 => {
            let oh = 2 * th + i as u32;
            unrolled!(j in 2 => {
                let ow = 2 * tw + j as u32;
                if oh < g.output[1] && ow < g.output[2] {
                    let off = |s: &[u32; 5]| (n * s[0] + k * s[1] + oh * s[3] + ow * s[4]) as usize;
                    let yp = y.add(off(&g.y));
                    let v = epilogue::apply(
                        &p.ops,
                        out[i][j],
                        T::LOW_PRECISION,
                        || load_n::<T, L>(yp),
                        |_| load_n::<T, L>(bias.add(k as usize)),
                        || load_n::<T, L>(z.add(off(&g.z))),
                    );
                    store_n::<T, L>(yp, v);
                }
            });
        });
    });
}

macro_rules! winograd_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `x` covers the tensor `p.geo` describes; `v` holds every element `p.v`
            /// reaches for the tiles and channels of `p.items`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_winograd_input_ $dt>](
                p: ConvWinogradParams, x: *const $T, v: *mut $T,
            ) {
                input::<$T, 1>(&p, x, v)
            }

            /// # Safety
            /// As `conv_fwd_winograd_input_*`, items of two channels: the channel is the
            /// inner index, x's channel stride is 1 and its other strides, `c` and V's
            /// strides are even.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_winograd_input_c2_ $dt>](
                p: ConvWinogradParams, x: *const $T, v: *mut $T,
            ) {
                input::<$T, 2>(&p, x, v)
            }

            /// # Safety
            /// `w` covers the filter `p.geo` describes (3x3); `u` holds every element
            /// `p.u` reaches for the (k, c) items.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_winograd_filter_ $dt>](
                p: ConvWinogradParams, w: *const $T, u: *mut $T,
            ) {
                filter::<$T>(&p, w, u)
            }

            /// # Safety
            /// `m` holds every element `p.m` reaches for the (tile, k) items; `y` (and
            /// `bias`, `z` where the epilogue reads them) cover the tensors `p.geo`
            /// describes; y's offsets are distinct.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_winograd_output_ $dt>](
                p: ConvWinogradParams, m: *const f32, y: *mut $T, bias: *const $T,
                z: *const $T,
            ) {
                output::<$T, 1>(&p, m, y, bias, z)
            }

            /// # Safety
            /// As `conv_fwd_winograd_output_*`, items of two output channels: the channel
            /// is the inner index, y's (and z's, where read) channel stride is 1 and its
            /// other strides, `k` and M's strides are even.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_winograd_output_c2_ $dt>](
                p: ConvWinogradParams, m: *const f32, y: *mut $T, bias: *const $T,
                z: *const $T,
            ) {
                output::<$T, 2>(&p, m, y, bias, z)
            }
        }
    };
}

crate::for_each_dtype!(winograd_entry_points);
