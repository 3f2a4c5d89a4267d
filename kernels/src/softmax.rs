//! Softmax forward and backward (cudnnSoftmaxForward / cudnnSoftmaxBackward semantics):
//! `y = alpha * softmax(x) + beta * y` over each row (the reduced dims: C*H*W per image in
//! instance mode, C per pixel in channel mode), for the fast, accurate (max-subtracted) and
//! log algorithms.
//!
//! Entry points:
//! - `softmax_{fwd,bwd}_vec<V>_<dtype>` / `_map<V>_`: a group of warps per row, the row in
//!   registers (the row engine of [`crate::rows`]): one read of the input;
//! - `softmax_{fwd,bwd}_long_{vec,map}_<dtype>`: rows too long for registers, streamed
//!   (forward: an online max/sum pass, then the output pass);
//! - `softmax_{fwd,bwd}_column_<dtype>`: a thread per row, for rows whose reduced dim is
//!   strided while neighbouring rows are adjacent in memory (channel mode on NCHW): the
//!   threads of a warp read 32 adjacent pixels of one channel at a time.

use crate::activation::blend;
use crate::device::grid_stride;
use crate::element::Element;
use crate::math::{exp, exp_shifted, ln, times_log2_e};
use crate::rows::{self, max_nan, shfl_pair, vector_elements, Dense, Group, Held, Inner};
use oxidnn_params::{IndexMap, SoftmaxAlgorithm, SoftmaxBwdParams, SoftmaxFwdParams, STREAM_SLOTS};

/// A running maximum and the sum of `exp(x - max)` of the elements seen.
type MaxSum = [f32; 2];

/// Combines two running (max, sum) pairs, rescaling to the larger maximum.
#[inline(always)]
fn combine_max_sum(a: MaxSum, b: MaxSum) -> MaxSum {
    if a[0] == f32::NEG_INFINITY {
        return [max_nan(a[0], b[0]), a[1] + b[1]];
    }
    if b[0] == f32::NEG_INFINITY {
        return a;
    }
    let m = max_nan(a[0], b[0]);
    [m, a[1] * exp(a[0] - m) + b[1] * exp(b[0] - m)]
}

/// How a row's outputs follow from its inputs once the row's maximum `m` (0 for the fast
/// algorithm) and sum of `exp(x - m)` are known, with `alpha` folded into the row's factor:
/// `exp(v - m) * (alpha / sum)`, or `(v - (m + ln(sum))) * alpha` for log softmax. Every
/// forward pass (in registers, streamed, a thread per row) writes its elements through it:
/// one formula for all three.
#[derive(Clone, Copy)]
struct RowOutput {
    m: f32,
    m_log2e: f32,
    factor: f32,
    shift: f32,
}

impl RowOutput {
    #[inline(always)]
    fn of(algo: SoftmaxAlgorithm, alpha: f32, m: f32, sum: f32) -> Self {
        let (factor, shift) = if algo == SoftmaxAlgorithm::Log {
            (alpha, m + ln(sum))
        } else {
            (alpha / sum, 0.0)
        };
        RowOutput {
            m,
            m_log2e: times_log2_e(m),
            factor,
            shift,
        }
    }

    /// The output of input `v` (before blending with the old output).
    #[inline(always)]
    fn value<T: Element>(self, algo: SoftmaxAlgorithm, v: f32) -> f32 {
        if algo == SoftmaxAlgorithm::Log {
            (v - self.shift) * self.factor
        } else {
            exp_minus::<T>(v, self.m, self.m_log2e) * self.factor
        }
    }
}

/// Blends `K` results into the output at `out` (reading it only when `beta != 0`).
#[inline(always)]
unsafe fn blend_store<T: Element, const K: usize>(alpha: f32, beta: f32, out: *mut T, v: [f32; K]) {
    let old = if beta != 0.0 {
        rows::load_coherent::<T, K>(out)
    } else {
        [0.0; K]
    };
    let mut res = [0.0f32; K];
    for k in 0..K {
        res[k] = blend(alpha, v[k], beta, || old[k]);
    }
    rows::store::<T, K>(out, res);
}

/// Calls `f` (inlined) with `algo` as a constant, so each algorithm's passes are their
/// own straight-line code.
#[inline(always)]
fn with_algo(algo: SoftmaxAlgorithm, f: impl Fn(SoftmaxAlgorithm)) {
    match algo {
        SoftmaxAlgorithm::Fast => f(SoftmaxAlgorithm::Fast),
        SoftmaxAlgorithm::Accurate => f(SoftmaxAlgorithm::Accurate),
        SoftmaxAlgorithm::Log => f(SoftmaxAlgorithm::Log),
    }
}

/// `exp(v - m)` given `m` and `m_log2e = m * log2(e)`: for 16-bit results one fused
/// multiply-add and `ex2` ([`exp_shifted`]), for f32 ones of the exact difference.
#[inline(always)]
fn exp_minus<T: Element>(v: f32, m: f32, m_log2e: f32) -> f32 {
    if T::LOW_PRECISION {
        exp_shifted(v, m_log2e)
    } else {
        exp(v - m)
    }
}

#[inline(always)]
unsafe fn fwd_in_registers<T: Element, I: Inner<2>, const K: usize, const V: usize>(
    p: &SoftmaxFwdParams,
    inner: I,
    x: *const T,
    y: *mut T,
) {
    let g = Group::new(p.warps);
    let d = p.row_len;
    let row_pass = #[inline(always)]
    |algo: SoftmaxAlgorithm, row: u32| {
        let [xb, yb] = p.outer.offsets(row);
        // Slots past the row hold -inf: they add exp(-inf) = 0.
        let mut v = Held::<T, K, V>::filled(f32::NEG_INFINITY);
        crate::unrolled!(j in V => {
            let e = g.first::<K, V>(0, j);
            if e < d {
                // SAFETY: as the kernel's: `e` is inside the row.
                unsafe { v.load(j, x.add((xb + inner.at(e)[0]) as usize)) };
            }
        });
        let m = if algo == SoftmaxAlgorithm::Fast {
            0.0
        } else {
            g.max(v.max_nan())
        };
        let m_log2e = times_log2_e(m);
        let mut s = 0.0f32;
        crate::unrolled!(j in V => {
            for vk in v.get(j) {
                s += exp_minus::<T>(vk, m, m_log2e);
            }
        });
        let out_of = RowOutput::of(algo, p.alpha, m, g.sum(s));
        // The exponentials are taken again rather than kept: only the held row stays live
        // across the sum.
        crate::unrolled!(j in V => {
            let e = g.first::<K, V>(0, j);
            if e < d {
                let out = v.get(j).map(|vk| out_of.value::<T>(algo, vk));
                // SAFETY: as the kernel's: `e` is inside the row.
                unsafe {
                    let at = y.add((yb + inner.at(e)[1]) as usize);
                    blend_store::<T, K>(1.0, p.beta, at, out);
                }
            }
        });
    };
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    g.rows(
        p.rows,
        #[inline(always)]
        |row| {
            with_algo(
                algo,
                #[inline(always)]
                |algo| row_pass(algo, row),
            )
        },
    );
}

#[inline(always)]
unsafe fn fwd_streamed<T: Element, I: Inner<2>, const K: usize>(
    p: &SoftmaxFwdParams,
    inner: I,
    x: *const T,
    y: *mut T,
) {
    const V: usize = STREAM_SLOTS as usize;
    let g = Group::new(p.warps);
    let d = p.row_len;
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    g.rows(p.rows, |row| {
        let [xb, yb] = p.outer.offsets(row);
        let mut acc: MaxSum = if algo == SoftmaxAlgorithm::Fast {
            [0.0, 0.0]
        } else {
            [f32::NEG_INFINITY, 0.0]
        };
        for c in 0..p.chunks {
            let mut v = [[f32::NEG_INFINITY; K]; V];
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    v[j] = rows::load::<T, K>(x.add((xb + inner.at(e)[0]) as usize));
                }
            });
            let mut m = if algo == SoftmaxAlgorithm::Fast {
                0.0
            } else {
                f32::NEG_INFINITY
            };
            if algo != SoftmaxAlgorithm::Fast {
                crate::unrolled!(j in V => {
                    for k in 0..K {
                        m = max_nan(m, v[j][k]);
                    }
                });
            }
            // A chunk with nothing above -inf (past the row, or masked) adds nothing; the
            // test keeps -inf - -inf = NaN out of the sum.
            let mut s = 0.0f32;
            if m != f32::NEG_INFINITY {
                crate::unrolled!(j in V => {
                    for k in 0..K {
                        s += exp(v[j][k] - m);
                    }
                });
            }
            acc = combine_max_sum(acc, [m, s]);
        }
        let [m, s] = g.reduce(acc, [f32::NEG_INFINITY, 0.0], combine_max_sum, shfl_pair);
        let out_of = RowOutput::of(algo, p.alpha, m, s);
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let at = inner.at(e);
                    let v = rows::load::<T, K>(x.add((xb + at[0]) as usize));
                    let out = v.map(|vk| out_of.value::<T>(algo, vk));
                    blend_store::<T, K>(1.0, p.beta, y.add((yb + at[1]) as usize), out);
                }
            });
        }
    });
}

/// What one element adds to the backward's row sum: `dy * y`, or `dy` for log softmax.
#[inline(always)]
fn bwd_term(algo: SoftmaxAlgorithm, y: f32, dy: f32) -> f32 {
    if algo == SoftmaxAlgorithm::Log {
        dy
    } else {
        dy * y
    }
}

/// `dx` (before blending) of one element, given the row sum.
#[inline(always)]
fn bwd_value(algo: SoftmaxAlgorithm, y: f32, dy: f32, sum: f32) -> f32 {
    if algo == SoftmaxAlgorithm::Log {
        dy - exp(y) * sum
    } else {
        y * (dy - sum)
    }
}

#[inline(always)]
unsafe fn bwd_in_registers<T: Element, I: Inner<3>, const K: usize, const V: usize>(
    p: &SoftmaxBwdParams,
    inner: I,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let g = Group::new(p.warps);
    let d = p.row_len;
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    g.rows(p.rows, |row| {
        let [yb, dyb, dxb] = p.outer.offsets(row);
        let mut yv = Held::<T, K, V>::filled(0.0);
        let mut dyv = Held::<T, K, V>::filled(0.0);
        crate::unrolled!(j in V => {
            let e = g.first::<K, V>(0, j);
            if e < d {
                let at = inner.at(e);
                yv.load(j, y.add((yb + at[0]) as usize));
                dyv.load(j, dy.add((dyb + at[1]) as usize));
            }
        });
        let mut s = 0.0f32;
        crate::unrolled!(j in V => {
            let (yj, dyj) = (yv.get(j), dyv.get(j));
            for k in 0..K {
                s += bwd_term(algo, yj[k], dyj[k]);
            }
        });
        let s = g.sum(s);
        crate::unrolled!(j in V => {
            let e = g.first::<K, V>(0, j);
            if e < d {
                let (yj, dyj) = (yv.get(j), dyv.get(j));
                let out: [f32; K] = core::array::from_fn(|k| bwd_value(algo, yj[k], dyj[k], s));
                blend_store::<T, K>(p.alpha, p.beta, dx.add((dxb + inner.at(e)[2]) as usize), out);
            }
        });
    });
}

#[inline(always)]
unsafe fn bwd_streamed<T: Element, I: Inner<3>, const K: usize>(
    p: &SoftmaxBwdParams,
    inner: I,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const V: usize = STREAM_SLOTS as usize;
    let g = Group::new(p.warps);
    let d = p.row_len;
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    g.rows(p.rows, |row| {
        let [yb, dyb, dxb] = p.outer.offsets(row);
        let load = |e: u32| {
            let at = inner.at(e);
            (
                rows::load::<T, K>(y.add((yb + at[0]) as usize)),
                rows::load::<T, K>(dy.add((dyb + at[1]) as usize)),
                at,
            )
        };
        let mut s = 0.0f32;
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let (yv, dyv, _) = load(e);
                    for k in 0..K {
                        s += bwd_term(algo, yv[k], dyv[k]);
                    }
                }
            });
        }
        let s = g.sum(s);
        for c in 0..p.chunks {
            crate::unrolled!(j in V => {
                let e = g.first::<K, V>(c, j);
                if e < d {
                    let (yv, dyv, at) = load(e);
                    let mut out = [0.0f32; K];
                    for k in 0..K {
                        out[k] = bwd_value(algo, yv[k], dyv[k], s);
                    }
                    blend_store::<T, K>(p.alpha, p.beta, dx.add((dxb + at[2]) as usize), out);
                }
            });
        }
    });
}

/// Calls `f(e, offsets)` for every element of a row, in order, four at a time (so four
/// loads are in flight): offsets by a constant stride when the reduced dims fold to one,
/// else through `inner`.
#[inline(always)]
fn for_each_element<const N: usize>(
    d: u32,
    inner: &IndexMap<N>,
    mut f: impl FnMut([[u64; N]; 4], u32),
) {
    let strided = inner.rank <= 1;
    let at = |e: u32| -> [u64; N] {
        if strided {
            core::array::from_fn(|k| e as u64 * inner.strides[k][0])
        } else {
            inner.offsets(e)
        }
    };
    let mut e = 0u32;
    while e < d {
        let offs = [
            at(e),
            at((e + 1).min(d - 1)),
            at((e + 2).min(d - 1)),
            at((e + 3).min(d - 1)),
        ];
        f(offs, (d - e).min(4));
        e += 4;
    }
}

/// A thread per row: an online (max, sum) pass, then the output pass.
#[inline(always)]
unsafe fn fwd_column<T: Element>(p: &SoftmaxFwdParams, x: *const T, y: *mut T) {
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    grid_stride(p.rows as u64, |row| {
        let [xb, yb] = p.outer.offsets(row as u32);
        let mut acc: MaxSum = if algo == SoftmaxAlgorithm::Fast {
            [0.0, 0.0]
        } else {
            [f32::NEG_INFINITY, 0.0]
        };
        for_each_element(p.row_len, &p.inner, |offs, n| {
            let v: [f32; 4] = core::array::from_fn(|i| T::load(x.add((xb + offs[i][0]) as usize)));
            let mut m = f32::NEG_INFINITY;
            for i in 0..4 {
                if (i as u32) < n {
                    m = max_nan(m, v[i]);
                }
            }
            if algo == SoftmaxAlgorithm::Fast {
                m = 0.0;
            }
            let mut s = 0.0f32;
            if m != f32::NEG_INFINITY {
                for i in 0..4 {
                    if (i as u32) < n {
                        s += exp(v[i] - m);
                    }
                }
            }
            acc = combine_max_sum(acc, [m, s]);
        });
        let [m, s] = acc;
        let out_of = RowOutput::of(algo, p.alpha, m, s);
        for_each_element(p.row_len, &p.inner, |offs, n| {
            let v: [f32; 4] = core::array::from_fn(|i| T::load(x.add((xb + offs[i][0]) as usize)));
            for i in 0..4 {
                if (i as u32) < n {
                    let out = [out_of.value::<T>(algo, v[i])];
                    blend_store::<T, 1>(1.0, p.beta, y.add((yb + offs[i][1]) as usize), out);
                }
            }
        });
    });
}

#[inline(always)]
unsafe fn bwd_column<T: Element>(p: &SoftmaxBwdParams, y: *const T, dy: *const T, dx: *mut T) {
    let algo = SoftmaxAlgorithm::from_u32(p.algo);
    grid_stride(p.rows as u64, |row| {
        let [yb, dyb, dxb] = p.outer.offsets(row as u32);
        let load = |offs: &[[u64; 3]; 4]| -> ([f32; 4], [f32; 4]) {
            (
                core::array::from_fn(|i| T::load(y.add((yb + offs[i][0]) as usize))),
                core::array::from_fn(|i| T::load(dy.add((dyb + offs[i][1]) as usize))),
            )
        };
        let mut s = 0.0f32;
        for_each_element(p.row_len, &p.inner, |offs, n| {
            let (yv, dyv) = load(&offs);
            for i in 0..4 {
                if (i as u32) < n {
                    s += bwd_term(algo, yv[i], dyv[i]);
                }
            }
        });
        for_each_element(p.row_len, &p.inner, |offs, n| {
            let (yv, dyv) = load(&offs);
            for i in 0..4 {
                if (i as u32) < n {
                    let out = [bwd_value(algo, yv[i], dyv[i], s)];
                    blend_store::<T, 1>(p.alpha, p.beta, dx.add((dxb + offs[i][2]) as usize), out);
                }
            }
        });
    });
}

macro_rules! in_register_entry_points {
    ($dt:ident, $T:ty, $($v:literal)*) => {
        paste::paste! { $(
            /// # Safety
            /// Pointers cover the tensors `p` describes; rows are dense in both operands,
            /// 16-byte aligned, `row_len` a multiple of the vector.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_fwd_vec $v _ $dt>](
                p: SoftmaxFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_in_registers::<$T, Dense, { vector_elements::<$T>() }, $v>(&p, Dense, x, y)
            }
            /// # Safety
            /// As `softmax_fwd_vec*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_bwd_vec $v _ $dt>](
                p: SoftmaxBwdParams, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_in_registers::<$T, Dense, { vector_elements::<$T>() }, $v>(&p, Dense, y, dy, dx)
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
            pub unsafe extern "ptx-kernel" fn [<softmax_fwd_map $v _ $dt>](
                p: SoftmaxFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_in_registers::<$T, &IndexMap<2>, 1, $v>(&p, &p.inner, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_bwd_map $v _ $dt>](
                p: SoftmaxBwdParams, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_in_registers::<$T, &IndexMap<3>, 1, $v>(&p, &p.inner, y, dy, dx)
            }
        )* }
    };
}

/// The entry points of one dtype. Slot counts keep a thread's held row within the register
/// budget the host plans with (`src/ops/softmax.rs`): 32 registers per operand, 32 f32 or
/// 64 16-bit values.
macro_rules! softmax_entry_points {
    ($dt:ident, $T:ty) => {
        in_register_entry_points!($dt, $T, 1 2 4 8);
        mapped_entry_points!($dt, $T, 4);
        paste::paste! {
            /// # Safety
            /// As `softmax_fwd_vec*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_fwd_long_vec_ $dt>](
                p: SoftmaxFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_streamed::<$T, Dense, { vector_elements::<$T>() }>(&p, Dense, x, y)
            }
            /// # Safety
            /// As `softmax_fwd_map*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_fwd_long_map_ $dt>](
                p: SoftmaxFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_streamed::<$T, &IndexMap<2>, 1>(&p, &p.inner, x, y)
            }
            /// # Safety
            /// As `softmax_bwd_vec*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_bwd_long_vec_ $dt>](
                p: SoftmaxBwdParams, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_streamed::<$T, Dense, { vector_elements::<$T>() }>(&p, Dense, y, dy, dx)
            }
            /// # Safety
            /// As `softmax_bwd_map*`; the row is streamed in `p.chunks` chunks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_bwd_long_map_ $dt>](
                p: SoftmaxBwdParams, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_streamed::<$T, &IndexMap<3>, 1>(&p, &p.inner, y, dy, dx)
            }
            /// # Safety
            /// Pointers cover the tensors `p` describes; a thread per row (grid-stride).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_fwd_column_ $dt>](
                p: SoftmaxFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_column::<$T>(&p, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors `p` describes; a thread per row (grid-stride).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<softmax_bwd_column_ $dt>](
                p: SoftmaxBwdParams, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_column::<$T>(&p, y, dy, dx)
            }
        }
    };
}

crate::for_each_dtype!(softmax_entry_points);
