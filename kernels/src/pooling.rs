//! Pooling forward and backward (cudnnPoolingForward / cudnnPoolingBackward semantics) over
//! 1 to 3 spatial dims, any strides; see `oxidnn_params::pooling` for the geometry.
//!
//! Forward, `y = alpha * pool(x) + beta * y`:
//! - `pooling_fwd_window_*`: a thread per output element; items counted channels-first
//!   (consecutive threads on consecutive output w: NCHW) or channels-last (NHWC).
//! - `pooling_fwd_window_vec_*`: channel-contiguous x and y: a thread per 16-byte vector of
//!   channels of one output position.
//! - `pooling_fwd_strip_<shape>_*`: compiled for common window shapes (2x2, 3x3, 2x2x2)
//!   over x rows contiguous along w in 16-byte vectors (NCHW): a thread per two strips of
//!   consecutive outputs along w, their windows' rows loaded as vectors, all at once.
//!   `pooling_fwd_strip8_<shape>_*`: the same over rows of 8-byte vectors (f16 rows of 28,
//!   f32 rows of 14), which are not whole 16-byte ones.
//! - `pooling_fwd_global_*`: windows covering the whole spatial extent: a group of lanes,
//!   or a block, per `(n, c)`.
//! - `pooling_fwd_global_staged_f32`: global over short f32 planes stored back to back
//!   (NCHW 7x7): a warp per few planes, copied to shared memory with 16-byte `cp.async`s.
//! - `pooling_fwd_global_lane_{f16,bf16}`: global over short 16-bit planes stored back to
//!   back (up to 57 elements): a thread a plane, its 16-byte vectors loaded at once.
//! - `pooling_fwd_global_vec_*`: global over channel-contiguous x: a block per image and
//!   tile of channel vectors, spatial positions spread over its rows.
//!
//! Backward, `dx = alpha * grad + beta * dx`, deterministic: each dx element is written by
//! one thread, which adds its windows' contributions in a fixed order (no atomics):
//! - `pooling_bwd_gather_*` (and `_vec_`): a thread per dx element (or channel vector),
//!   gathering over the windows that contain it.
//! - `pooling_bwd_global_avg_*` (and `_vec_`): the average backward of a global window, a
//!   thread per dx element (or channel vector) copying its plane's scaled dy;
//!   `pooling_bwd_global_avg_flat_*`: dx's planes back to back (NCHW), a thread per 16-byte
//!   vector of dx.
//! - `pooling_bwd_cell_*` (and `_vec_`): a thread per cell, the stride-sized block of dx
//!   elements aligned to the window starts, visiting each window that overlaps it once.
//! - `pooling_bwd_cell_max_<W>x<W>s<S>p<P>_*`: the max cell kernel compiled for square
//!   2-D windows of 2x2 or 3x3 at strides 1 or 2 and their usual paddings along w, a thread
//!   per two cells' rows and columns: all their windows and the x region they cover loaded
//!   at once, dx stored as a vector a row.
//! - `pooling_bwd_cell_vec_max_<W>x<W>s<S>_*`: the max cell kernel over channel vectors
//!   compiled for square 2-D windows of 2x2 and 3x3 at stride 2 (any padding): a thread
//!   per cell and vector, each row of its windows loaded at once, the winners found in
//!   registers.
//! - `pooling_bwd_disjoint_{strip,vec}_{avg,max}_<shape>_*`: the backward of
//!   non-overlapping, unpadded 2x2 and 2x2x2 windows, where each dx element is under one
//!   window at most. `strip`: over rows contiguous along w in 16-byte vectors (NCHW), a
//!   thread per vector of dx columns and row of windows, its windows' dy (and y, and the x
//!   vectors under them, for the max) read together, dx written as vectors. `vec`: over
//!   channel vectors (NHWC), a thread per cell and 16-byte vector, the window's dy vector
//!   (and y and the cell's x vectors, for the max) written to the cell's dx vectors.
//! - `pooling_bwd_walk_max_3x3s2p<P>_*`: the max backward of 3x3 windows at stride 2 over
//!   rows of up to 32 16-byte vectors contiguous along w (NCHW): a group of lanes per
//!   band of rows of windows of one plane walks down it, each lane owning one vector of
//!   every row, the rows shared by consecutive rows of windows kept in registers, the
//!   columns beside a lane's vector exchanged by shuffles.
//! - `pooling_bwd_walk_vec_max_3x3s2_*`: the max backward of 3x3 windows at stride 2 over
//!   channel vectors (NHWC): a thread per column of cells (the two dx columns from a
//!   window's start), 8-byte vector of channels and band of rows of windows walks down the
//!   band, the x row shared by consecutive rows of windows kept in registers.
//! - `pooling_bwd_tile_max_*` (and `_vec_`): max through shared memory, a block per tile
//!   of cells: each window's winner found once, then gathered by the tile's dx elements.
//! - `pooling_bwd_band_max_*`: max of 2-D windows over single channels through shared
//!   memory, a block per band of rows of one plane: x and the windows' y and dy staged
//!   once, each window's winner found once, then gathered by the band's dx elements.
//!   `pooling_bwd_band_max_<W>x<W>s1p<P>_*`: the same unrolled for 2x2 and 3x3 windows at
//!   stride 1, a thread per run of 4 windows or dx elements.
//!
//! Max: the forward value is the window's maximum, NaN skipped or propagated as
//! `propagate_nan` says; the backward sends a window's dy to the window's first element in
//! scan order (d, then h, then w) that equals its y, NaN equal to NaN. Average: the sum
//! times `1 / count` (count: the window's volume, or its in-bounds elements when padding
//! is excluded), computed in f32 for every storage type.

use crate::activation::blend;
use crate::device::{
    block_dim_x, block_idx_x, block_reduce, cp_async_16, cp_async_commit, cp_async_wait,
    dynamic_smem, global_thread_x, grid_dim_x, grid_stride, grid_stride_turns, group_reduce,
    lane_id, ld_shared_u32, ld_shared_v4, max_ignore_nan, max_propagate_nan, shfl_group_u32,
    shfl_xor_f32, st_global_v4, st_shared_u32, st_shared_v4, sync_threads, sync_warp, thread_idx_x,
    warp_id, LoadFence, Vec16, Words,
};
use crate::element::{same_value, Element};
use oxidnn_params::{
    pooling_global_stage_bytes, pooling_walk_columns, pooling_walk_vec_channels, PoolCoord,
    PoolWalk, PoolWindow, PoolingBwdParams, PoolingFwdParams, PoolingGlobalParams, PoolingKind,
    POOLING_MAX_CELL, POOLING_REGION_CELLS,
};

const _: () = assert!(
    POOLING_MAX_CELL == 8,
    "the unrolled cell loops below list 8 slots"
);

/// Channels per thread of `pooling_bwd_cell_vec_*`.
const CELL_VECTOR: usize = oxidnn_params::POOLING_CELL_VECTOR;

/// Elements a thread of `pooling_fwd_global_lane_*` loads (a 16-byte vector at a time).
const LANE_ELEMENTS: usize = oxidnn_params::POOLING_GLOBAL_LANE_ELEMENTS;

// ---------------------------------------------------------------------------------------
// What a window computes
// ---------------------------------------------------------------------------------------

/// The reductions, as const-generic selectors: each gets its own loops.
const MAX_IGNORE_NAN: u32 = 0;
const MAX_PROPAGATE_NAN: u32 = 1;
const AVG: u32 = 2;

/// Evaluates `$body` with `$op` bound, as a constant, to the reduction the window
/// parameters ask for.
macro_rules! with_op {
    ($kind:expr, $propagate_nan:expr, |$op:ident| $body:expr) => {
        match (PoolingKind::from_u32($kind), $propagate_nan != 0) {
            (PoolingKind::Max, false) => {
                const $op: u32 = MAX_IGNORE_NAN;
                $body
            }
            (PoolingKind::Max, true) => {
                const $op: u32 = MAX_PROPAGATE_NAN;
                $body
            }
            _ => {
                const $op: u32 = AVG;
                $body
            }
        }
    };
}

/// Evaluates `$body` with `$k` bound to the elements of `$t` in 16 bytes.
macro_rules! with_vector {
    ($t:ty, |$k:ident| $body:expr) => {
        if size_of::<$t>() == 4 {
            const $k: usize = 4;
            $body
        } else {
            const $k: usize = 8;
            $body
        }
    };
}

#[inline(always)]
fn identity<const OP: u32>() -> f32 {
    if OP == AVG {
        0.0
    } else {
        f32::NEG_INFINITY
    }
}

#[inline(always)]
fn combine<const OP: u32>(a: f32, b: f32) -> f32 {
    match OP {
        MAX_IGNORE_NAN => max_ignore_nan(a, b),
        MAX_PROPAGATE_NAN => max_propagate_nan(a, b),
        _ => a + b,
    }
}

// ---------------------------------------------------------------------------------------
// Geometry
// ---------------------------------------------------------------------------------------

/// First input of window `o` along spatial dim `k` (negative: padding).
#[inline(always)]
fn window_start(w: &PoolWindow, k: usize, o: u32) -> i32 {
    (o * w.stride[k]) as i32 - w.pad[k] as i32
}

/// The in-bounds inputs `lo..hi` of window `o` along spatial dim `k`.
#[inline(always)]
fn span(w: &PoolWindow, k: usize, o: u32) -> (u32, u32) {
    let start = window_start(w, k, o);
    let end = start + w.window[k] as i32;
    let lo = if start < 0 { 0 } else { start as u32 };
    let hi = if end > w.input[k] as i32 {
        w.input[k]
    } else {
        end as u32
    };
    (lo, hi)
}

/// The windows `first..last` along spatial dim `k` that contain input `s` (none where
/// `first >= last`: the stride skips `s`).
#[inline(always)]
fn windows_over(p: &PoolingBwdParams, k: usize, s: u32) -> (u32, u32) {
    let w = &p.win;
    let t = s + w.pad[k];
    let first = if t >= w.window[k] {
        p.stride_div[k].div(t - w.window[k]) + 1
    } else {
        0
    };
    (first, (p.stride_div[k].div(t) + 1).min(w.output[k]))
}

/// `N` consecutive positions from `first` along a dim of `extent`, clamped into it, and
/// whether each lies inside.
#[inline(always)]
fn clamped<const N: usize>(first: i32, extent: u32) -> ([u32; N], [bool; N]) {
    let e = extent as i32;
    (
        core::array::from_fn(|i| (first + i as i32).max(0).min(e - 1) as u32),
        core::array::from_fn(|i| (0..e).contains(&(first + i as i32))),
    )
}

/// Whether every position strip `s` (`[od, oh, strip]`) of [`fwd_strip`] reads lies inside
/// x: its `WD` depth planes and `WIN` rows from the windows' starts, and its `RW` columns
/// from `strip * v - pad`.
#[inline(always)]
fn strip_inside<const WD: usize, const WIN: usize, const RW: usize>(
    w: &PoolWindow,
    s: [u32; 3],
    v: u32,
    pad: u32,
) -> bool {
    let inside =
        |first: i32, n: usize, extent: u32| first >= 0 && first + n as i32 <= extent as i32;
    inside(window_start(w, 0, s[0]), WD, w.input[0])
        & inside(window_start(w, 1, s[1]), WIN, w.input[1])
        & inside((s[2] * v) as i32 - pad as i32, RW, w.input[2])
}

/// `1 / count` of the average over window `o`.
#[inline(always)]
fn inverse_count(w: &PoolWindow, o: [u32; 3]) -> f32 {
    if PoolingKind::from_u32(w.kind) != PoolingKind::AvgExcludePadding {
        return w.inv_volume;
    }
    let (d0, d1) = span(w, 0, o[0]);
    let (h0, h1) = span(w, 1, o[1]);
    let (w0, w1) = span(w, 2, o[2]);
    let count = (d1 - d0) * (h1 - h0) * (w1 - w0);
    if count == w.window[0] * w.window[1] * w.window[2] {
        w.inv_volume
    } else {
        1.0 / count as f32
    }
}

/// Offset of spatial position `s` from a `(n, c)` base.
#[inline(always)]
fn spatial_offset(strides: &[u32; 5], s: [u32; 3]) -> u32 {
    s[0] * strides[2] + s[1] * strides[3] + s[2] * strides[4]
}

/// Offset of the `(n, c)` row, `c` counted in elements.
#[inline(always)]
fn row_offset(strides: &[u32; 5], n: u32, c: u32) -> u32 {
    n * strides[0] + c * strides[1]
}

// ---------------------------------------------------------------------------------------
// K consecutive channels: one element (K = 1, any alignment) or a 16-byte vector
// ---------------------------------------------------------------------------------------

/// Loads `K` elements from memory no thread of the launch writes.
///
/// # Safety
/// Readable; aligned to `K * size` bytes (4, 8 or 16) when `K > 1`.
#[inline(always)]
unsafe fn load<T: Element, const K: usize>(p: *const T) -> [f32; K] {
    if K == 1 {
        [T::load(p); K]
    } else {
        T::unpack::<K>(T::load_raw::<K>(p, true))
    }
}

/// Loads `K` elements of the output (coherent path).
///
/// # Safety
/// As [`load`].
#[inline(always)]
unsafe fn load_output<T: Element, const K: usize>(p: *const T) -> [f32; K] {
    if K == 1 {
        [T::load(p); K]
    } else {
        T::unpack::<K>(T::load_raw::<K>(p, false))
    }
}

/// Stores `K` elements.
///
/// # Safety
/// Writable; aligned to `K * size` bytes (4, 8 or 16) when `K > 1`.
#[inline(always)]
unsafe fn store<T: Element, const K: usize>(p: *mut T, v: [f32; K]) {
    if K == 1 {
        T::store(p, v[0])
    } else {
        T::store_vec::<K>(p, v)
    }
}

/// Writes `alpha * v + beta * old` at `p`, reading `old` only when `beta != 0`.
///
/// # Safety
/// As [`store`]; no other thread of the launch accesses these elements.
#[inline(always)]
unsafe fn store_blended<T: Element, const K: usize>(w: &PoolWindow, p: *mut T, v: [f32; K]) {
    let old = if w.beta != 0.0 {
        load_output::<T, K>(p)
    } else {
        [0.0; K]
    };
    let mut out = [0.0f32; K];
    for k in 0..K {
        out[k] = blend(w.alpha, v[k], w.beta, || old[k]);
    }
    store::<T, K>(p, out);
}

/// Calls `f(values, index, valid)` for the in-bounds elements of window `o`, `index` being
/// the element's linear spatial index `(d * H + h) * W + w` (which grows in scan order).
/// The window's rows (its in-bounds (d, h) pairs, in scan order) are taken several at a
/// time and each row in chunks of a few elements, sized to the window (single elements: up
/// to 4 rows of up to 4, a 3x3 window in one step of 3x3; 16-byte vectors: 1 row of 2).
/// The loads of a step are issued together and unconditionally (past the window's last
/// row or a row's end they re-read its last element), so the code has no branches per
/// element and each thread many loads in flight. Calls for positions past the window have
/// `valid == false` and values `fill`. The calls are in scan order except across the
/// column chunks of a row that takes several: `f` must not depend on the order (a max, a
/// sum, the minimum matching index).
///
/// # Safety
/// Every in-bounds element at `x + base + spatial_offset(strides, ..)` is readable.
#[inline(always)]
unsafe fn scan_window<T: Element, const K: usize>(
    w: &PoolWindow,
    x: *const T,
    strides: &[u32; 5],
    base: u32,
    o: [u32; 3],
    fill: f32,
    f: impl FnMut([f32; K], u32, bool),
) {
    if K > 1 {
        return scan_steps::<T, K, 1, 2>(w, x, strides, base, o, fill, f);
    }
    match w.window[0] * w.window[1] {
        0..=2 => scan_rows::<T, K, 2>(w, x, strides, base, o, fill, f),
        3 => scan_rows::<T, K, 3>(w, x, strides, base, o, fill, f),
        _ => scan_rows::<T, K, 4>(w, x, strides, base, o, fill, f),
    }
}

/// [`scan_window`] in steps of `ROWS` rows, with chunks as wide as the window (2 to 4).
///
/// # Safety
/// As [`scan_window`].
#[inline(always)]
unsafe fn scan_rows<T: Element, const K: usize, const ROWS: usize>(
    w: &PoolWindow,
    x: *const T,
    strides: &[u32; 5],
    base: u32,
    o: [u32; 3],
    fill: f32,
    f: impl FnMut([f32; K], u32, bool),
) {
    match w.window[2] {
        0..=2 => scan_steps::<T, K, ROWS, 2>(w, x, strides, base, o, fill, f),
        3 => scan_steps::<T, K, ROWS, 3>(w, x, strides, base, o, fill, f),
        _ => scan_steps::<T, K, ROWS, 4>(w, x, strides, base, o, fill, f),
    }
}

/// [`scan_window`] in steps of `ROWS` rows (at most 4) and chunks of `COLS` elements (at
/// most 4).
///
/// # Safety
/// As [`scan_window`].
#[inline(always)]
unsafe fn scan_steps<T: Element, const K: usize, const ROWS: usize, const COLS: usize>(
    w: &PoolWindow,
    x: *const T,
    strides: &[u32; 5],
    base: u32,
    o: [u32; 3],
    fill: f32,
    mut f: impl FnMut([f32; K], u32, bool),
) {
    let (d0, d1) = span(w, 0, o[0]);
    let (h0, h1) = span(w, 1, o[1]);
    let (w0, w1) = span(w, 2, o[2]);
    let window_rows = d1.saturating_sub(d0) * h1.saturating_sub(h0);
    // The (d, h) of the step's first row, walked in scan order.
    let (mut d, mut h) = (d0, h0);
    let mut first = 0;
    while first < window_rows {
        // Each row of the step: its offset, its first linear index, whether it is in the
        // window (rows past the last repeat it).
        let mut row = [(0u32, 0u32, false); ROWS];
        let (mut rd, mut rh) = (d, h);
        crate::unroll!(r in [0, 1, 2, 3] {
            if r < ROWS {
                row[r] = (
                    base + rd * strides[2] + rh * strides[3],
                    (rd * w.input[1] + rh) * w.input[2],
                    first + (r as u32) < window_rows,
                );
                // On to the next row, unless this one is the window's last.
                if first + (r as u32) + 1 < window_rows {
                    rh += 1;
                    if rh == h1 {
                        rh = h0;
                        rd += 1;
                    }
                }
            }
        });
        let mut c = w0;
        while c < w1 {
            let mut v = [[[0.0f32; K]; COLS]; ROWS];
            crate::unroll!(r in [0, 1, 2, 3] {
                crate::unroll!(j in [0, 1, 2, 3] {
                    if r < ROWS && j < COLS {
                        let col = if c + (j as u32) < w1 { c + j as u32 } else { w1 - 1 };
                        v[r][j] = load::<T, K>(x.add((row[r].0 + col * strides[4]) as usize));
                    }
                });
            });
            crate::unroll!(r in [0, 1, 2, 3] {
                crate::unroll!(j in [0, 1, 2, 3] {
                    if r < ROWS && j < COLS {
                        let valid = row[r].2 & (c + (j as u32) < w1);
                        let index = row[r].1 + c + j as u32;
                        f(if valid { v[r][j] } else { [fill; K] }, index, valid);
                    }
                });
            });
            c += COLS as u32;
        }
        // The walk stopped on the row after the step's last (the window's last row if
        // none is left): the next step's first.
        (d, h) = (rd, rh);
        first += ROWS as u32;
    }
}

/// Per channel, the linear spatial index of window `o`'s first element (in scan order) equal
/// to `yv`, or `u32::MAX` where none is: the smallest index among the matches, a minimum
/// rather than a search, so that all the window's loads are in flight together.
///
/// # Safety
/// As [`scan_window`].
#[inline(always)]
unsafe fn first_match<T: Element, const K: usize>(
    w: &PoolWindow,
    x: *const T,
    strides: &[u32; 5],
    base: u32,
    o: [u32; 3],
    yv: [f32; K],
) -> [u32; K] {
    let mut first = [u32::MAX; K];
    scan_window::<T, K>(w, x, strides, base, o, 0.0, |v, index, valid| {
        for k in 0..K {
            let hit = valid & same_value(v[k], yv[k]);
            first[k] = first[k].min(if hit { index } else { u32::MAX });
        }
    });
    first
}

// ---------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------

/// A thread per output element (`K = 1`) or per vector of `K` channels.
#[inline(always)]
unsafe fn fwd_window<T: Element, const K: usize, const OP: u32>(
    p: &PoolingFwdParams,
    x: *const T,
    y: *mut T,
) {
    let w = &p.win;
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s } = p.items.at(i as u32);
        let c = c * K as u32;
        let mut acc = [identity::<OP>(); K];
        let base = row_offset(&p.x, n, c);
        scan_window::<T, K>(w, x, &p.x, base, s, identity::<OP>(), |v, _, _| {
            for k in 0..K {
                acc[k] = combine::<OP>(acc[k], v[k]);
            }
        });
        if OP == AVG {
            let inv = inverse_count(w, s);
            for k in 0..K {
                acc[k] *= inv;
            }
        }
        let at = row_offset(&p.y, n, c) + spatial_offset(&p.y, s);
        store_blended::<T, K>(w, y.add(at as usize), acc);
    })
}

/// Forward of `WD x WH x WW` windows (depth x h x w; any strides and paddings) over
/// channel vectors of `K` elements (16 bytes): a thread per output vector,
/// `POOLING_WINDOWS_PER_TURN` a turn, every vector of their windows loaded before the
/// first is used ([`grid_stride_turns`]; [`fwd_window`] walks a window in a run-time loop
/// whose every step waits for the last one's loads). Positions past x's edges are clamped
/// (they re-read an edge element of the same window) and, for averages, masked, as in
/// [`fwd_strip`], so the code has no branches until the store. A max reduces the vectors
/// as loaded ([`Element::max_words`]: 16-bit elements two an instruction, no unpacking)
/// and, unblended, stores them so.
///
/// # Safety
/// As `pooling_fwd_window_vec_*`, with windows of this shape; every window holds an input
/// along each dim (the host keeps padding below the window).
#[inline(always)]
unsafe fn fwd_window_vec_shaped<
    T: Element,
    const K: usize,
    const OP: u32,
    const WD: usize,
    const WH: usize,
    const WW: usize,
>(
    p: &PoolingFwdParams,
    x: *const T,
    y: *mut T,
) {
    let w = &p.win;
    // Where output `s`'s window reads along each dim, clamped to x, and which of those
    // positions lie inside it.
    let window = #[inline(always)]
    |s: [u32; 3]| {
        (
            clamped::<WD>(window_start(w, 0, s[0]), w.input[0]),
            clamped::<WH>(window_start(w, 1, s[1]), w.input[1]),
            clamped::<WW>(window_start(w, 2, s[2]), w.input[2]),
        )
    };
    let fetch = #[inline(always)]
    |coord: PoolCoord| -> [[[Vec16; WW]; WH]; WD] {
        let PoolCoord { n, c, s } = coord;
        let ((depth, _), (row, _), (col, _)) = window(s);
        let base = row_offset(&p.x, n, c * K as u32);
        core::array::from_fn(|a| {
            core::array::from_fn(|r| {
                let row_base = base + depth[a] * p.x[2] + row[r] * p.x[3];
                core::array::from_fn(|q| {
                    T::load_raw::<K>(x.add((row_base + col[q] * p.x[4]) as usize), true)
                })
            })
        })
    };
    // Forced inline: called once per output of a turn (see `fwd_strip`).
    let finish = #[inline(always)]
    |coord: PoolCoord, vectors: [[[Vec16; WW]; WH]; WD]| {
        let PoolCoord { n, c, s } = coord;
        let at = y.add((row_offset(&p.y, n, c * K as u32) + spatial_offset(&p.y, s)) as usize);
        if OP == AVG {
            let ((_, depth_in), (_, row_in), (_, col_in)) = window(s);
            let mut sum = [0.0f32; K];
            crate::unrolled!(a in WD => crate::unrolled!(r in WH => crate::unrolled!(q in WW => {
                let v = T::unpack::<K>(vectors[a][r][q]);
                let inside = depth_in[a] & row_in[r] & col_in[q];
                crate::unrolled!(k in K => sum[k] += if inside { v[k] } else { 0.0 });
            })));
            let inv = inverse_count(w, s);
            store_blended::<T, K>(w, at, sum.map(|v| v * inv));
            return;
        }
        // A max of the raw words (two 16-bit elements an instruction, exact), with no
        // mask: a clamped position re-reads an element of the same window.
        let mut max = [T::NEG_INF_WORD; 4];
        crate::unrolled!(a in WD => crate::unrolled!(r in WH => crate::unrolled!(q in WW => {
            crate::unrolled!(j in 4 => {
                max[j] = T::max_words(max[j], vectors[a][r][q][j], OP == MAX_PROPAGATE_NAN);
            });
        })));
        if w.alpha == 1.0 && w.beta == 0.0 {
            st_global_v4(at as *mut u32, max);
        } else {
            store_blended::<T, K>(w, at, T::unpack::<K>(max));
        }
    };
    const TURN: usize = oxidnn_params::POOLING_WINDOWS_PER_TURN as usize;
    let locate = #[inline(always)]
    |i: u64| p.items.at(i as u32);
    grid_stride_turns::<TURN, _, _>(p.items.len as u64, locate, fetch, finish)
}

/// Forward of `WD x WIN x WIN` windows (depth x h x w) at strides `S` along h and w and
/// padding `PAD` along w (any depth stride and any padding along d and h), over x whose
/// rows are contiguous along w in whole vectors of `V` elements (16 or 8 bytes): a thread
/// per strip of `O = V / S` consecutive outputs along w, two strips a turn.
///
/// The strip's windows cover, in each of their rows, the row's vector from `strip * V`
/// with the `PAD` elements before it and the `WIN - S - PAD` after it (`RW` in all). The
/// thread loads each row of both its strips as that vector and a few single elements, all
/// in flight at once ([`grid_stride_turns`]), and reduces each strip's `O` windows in
/// registers: each column over the rows (a max in the raw words as loaded,
/// [`Element::max_words`]), then each output over its columns. ([`fwd_window`]
/// loads every element of every window singly: `O` times as many loads, each thread with
/// fewer bytes in flight.) Rows and columns past the edges are clamped (re-read an edge
/// element, which lies in the same window) and, for averages, masked, so the code has no
/// branches until the stores: `O` outputs with one vector store where y's row allows it.
///
/// # Safety
/// As `pooling_fwd_window_*`, with `items` counting w in strips of `O` outputs, the window
/// as above (checked by the host), x aligned to a vector with unit w stride, its other
/// strides and w extent multiples of `V`. Then every strip's vector lies inside its row:
/// it starts at `strip * V <= (output[2] - 1) * S <= input[2] + 2 * PAD - WIN`, below
/// `input[2]` (`2 * PAD < WIN`), and both are multiples of `V`.
#[inline(always)]
unsafe fn fwd_strip<
    T: Element,
    const OP: u32,
    const WD: usize,
    const WIN: usize,
    const S: usize,
    const PAD: usize,
    const V: usize,
    const O: usize,
    const RW: usize,
>(
    p: &PoolingFwdParams,
    x: *const T,
    y: *mut T,
) {
    const {
        let vector_bytes = V * size_of::<T>();
        assert!(vector_bytes == 16 || vector_bytes == 8);
        assert!(O * S == V && WIN >= S + PAD && 2 * PAD < WIN);
        assert!(RW == PAD + V + (WIN - S - PAD));
        // y's strip: one element, or a store of 4, 8 or 16 bytes.
        assert!(O == 1 || matches!(O * size_of::<T>(), 4 | 8 | 16));
    };
    let w = &p.win;
    // Where strip `s` of plane `(n, c)` reads: its depth planes, rows and columns, clamped
    // to x, and which of them lie inside it.
    let window = #[inline(always)]
    |s: [u32; 3]| {
        let [od, oh, strip] = s;
        (
            clamped::<WD>(window_start(w, 0, od), w.input[0]),
            clamped::<WIN>(window_start(w, 1, oh), w.input[1]),
            clamped::<RW>((strip * V as u32) as i32 - PAD as i32, w.input[2]),
        )
    };
    // A strip's rows as loaded: each row's vector (raw words) and the single elements either
    // side of it (raw bits; the slots the vector covers are 0), for `grid_stride_turns`'s
    // fence. Two strips a turn: one strip's few vectors leave too few bytes in flight an
    // SM to cover the memory's latency.
    let fetch = #[inline(always)]
    |coord: PoolCoord| {
        let PoolCoord { n, c, s } = coord;
        let ((depth, _), (row, _), (col, _)) = window(s);
        let v0 = s[2] * V as u32;
        let x_base = row_offset(&p.x, n, c);
        let rows: [[(Vec16, [u32; RW]); WIN]; WD] = core::array::from_fn(|a| {
            core::array::from_fn(|r| {
                let row_base = x_base + depth[a] * p.x[2] + row[r] * p.x[3];
                let vector = T::load_raw::<V>(x.add((row_base + v0) as usize), true);
                let singles = core::array::from_fn(|q| match q.checked_sub(PAD) {
                    Some(e) if e < V => 0,
                    _ => T::load_bits(x.add((row_base + col[q]) as usize)),
                });
                (vector, singles)
            })
        });
        rows
    };
    // Forced inline: called once per strip of a turn, LLVM would otherwise outline it
    // and pass its captures through local memory.
    let finish = #[inline(always)]
    |coord: PoolCoord, rows: [[(Vec16, [u32; RW]); WIN]; WD]| {
        let PoolCoord { n, c, s } = coord;
        let [od, oh, strip] = s;
        let ((_, depth_in), (_, row_in), (_, col_in)) = window(s);
        // Each column over the window's rows, then each output over its columns. A max
        // needs no masks: a clamped row or column re-reads an element of the same window
        // (every window holds an input: the host keeps padding below the window), which
        // cannot change its max; an average leaves them out.
        let fill = identity::<OP>();
        let mut columns = [fill; RW];
        let column = |q: usize, vector: [f32; V], single: u32| match q.checked_sub(PAD) {
            Some(e) if e < V => vector[e],
            _ => T::unpack::<1>([single, 0, 0, 0])[0],
        };
        if OP == AVG && strip_inside::<WD, WIN, RW>(w, s, V as u32, PAD as u32) {
            // Most strips: every position inside x, so no masks (their predicates would be
            // kept across the rows in registers).
            crate::unrolled!(a in WD => crate::unrolled!(r in WIN => {
                let (vector, singles) = rows[a][r];
                let vector = T::unpack::<V>(vector);
                crate::unrolled!(q in RW => {
                    let v = column(q, vector, singles[q]);
                    columns[q] = if a == 0 && r == 0 { v } else { columns[q] + v };
                })
            }));
        } else if OP == AVG {
            crate::unrolled!(a in WD => crate::unrolled!(r in WIN => {
                let (vector, singles) = rows[a][r];
                let vector = T::unpack::<V>(vector);
                let row_inside = depth_in[a] & row_in[r];
                crate::unrolled!(q in RW => {
                    let v = column(q, vector, singles[q]);
                    columns[q] += if row_inside & col_in[q] { v } else { 0.0 };
                })
            }));
        } else {
            // A max over the rows of the raw words as loaded ([`Element::max_words`]:
            // 16-bit elements two an instruction), unpacked once. (A single's word holds
            // its element in its low half, and the high halves' max is not used.)
            let (mut vector, mut singles) = ([T::NEG_INF_WORD; 4], [T::NEG_INF_WORD; RW]);
            let propagate = OP == MAX_PROPAGATE_NAN;
            crate::unrolled!(a in WD => crate::unrolled!(r in WIN => {
                let (v, s) = rows[a][r];
                crate::unrolled!(j in 4 => vector[j] = T::max_words(vector[j], v[j], propagate));
                crate::unrolled!(q in RW => singles[q] = T::max_words(singles[q], s[q], propagate));
            }));
            let vector = T::unpack::<V>(vector);
            crate::unrolled!(q in RW => columns[q] = column(q, vector, singles[q]));
        }
        // (Each column is reduced from the identity already, so an output may start from
        // its first column.)
        let mut acc: [f32; O] = core::array::from_fn(|k| columns[k * S]);
        crate::unrolled!(k in O => crate::unrolled!(e in WIN => {
            if e > 0 {
                acc[k] = combine::<OP>(acc[k], columns[k * S + e]);
            }
        }));
        let first = strip * O as u32;
        if OP == AVG {
            crate::unrolled!(k in O => acc[k] *= inverse_count(w, [od, oh, first + k as u32]));
        }
        let y_row = y.add((row_offset(&p.y, n, c) + od * p.y[2] + oh * p.y[3]) as usize);
        let at = y_row.add((first * p.y[4]) as usize);
        let whole = p.y[4] == 1 && first + O as u32 <= w.output[2];
        if whole && (at as usize).is_multiple_of(O * size_of::<T>()) {
            store_blended::<T, O>(w, at, acc);
        } else {
            crate::unrolled!(k in O => {
                let ow = first + k as u32;
                if ow < w.output[2] {
                    store_blended::<T, 1>(w, y_row.add((ow * p.y[4]) as usize), [acc[k]]);
                }
            });
        }
    };
    // The host counts strips channels-first.
    let locate = #[inline(always)]
    |i: u64| p.items.at_channels_first(i as u32);
    const TURN: usize = oxidnn_params::POOLING_STRIPS_PER_TURN as usize;
    grid_stride_turns::<TURN, _, _>(p.items.len as u64, locate, fetch, finish)
}

/// Writes output `(n, c)` of a global pooling from its reduced value.
#[inline(always)]
unsafe fn write_global<T: Element, const OP: u32>(
    p: &PoolingGlobalParams,
    y: *mut T,
    n: u32,
    c: u32,
    total: f32,
) {
    let v = if OP == AVG { total * p.inv_len } else { total };
    let yp = y.add((n * p.y_n + c * p.y_c) as usize);
    T::store(yp, blend(p.alpha, v, p.beta, || T::load(yp)));
}

/// Elements one lane of `pooling_fwd_global_*` loads at once.
const GLOBAL_LOADS: usize = oxidnn_params::POOLING_GLOBAL_LOADS;

/// Reduces elements `first, first + step, ..` below `p.len` of the row at `base`.
#[inline(always)]
unsafe fn reduce_row<T: Element, const OP: u32>(
    p: &PoolingGlobalParams,
    x: *const T,
    base: u32,
    first: u32,
    step: u32,
) -> f32 {
    let mut acc = [identity::<OP>(); GLOBAL_LOADS];
    let mut r = first;
    while r < p.len {
        // `GLOBAL_LOADS` loads in flight (those past the end skipped), then their
        // combination.
        let mut v = [identity::<OP>(); GLOBAL_LOADS];
        crate::unrolled!(j in GLOBAL_LOADS => {
            let at = r + j as u32 * step;
            if at < p.len {
                v[j] = T::load(x.add((base + at * p.red_stride) as usize));
            }
        });
        crate::unrolled!(j in GLOBAL_LOADS => acc[j] = combine::<OP>(acc[j], v[j]));
        r += GLOBAL_LOADS as u32 * step;
    }
    acc.into_iter().fold(identity::<OP>(), combine::<OP>)
}

/// Global pooling, `group` lanes per output (warp-uniform loop, so every shuffle has the
/// whole warp), or a block per output when `group > 32`.
#[inline(always)]
unsafe fn fwd_global<T: Element, const OP: u32>(p: &PoolingGlobalParams, x: *const T, y: *mut T) {
    let comb = |a: f32, b: f32| combine::<OP>(a, b);
    if p.group > 32 {
        let scratch = crate::shared_array!(f32, 128);
        let mut o = block_idx_x();
        while o < p.outputs {
            let (n, c) = p.c.div_rem(o);
            let base = n * p.x_n + c * p.x_c;
            let mine = reduce_row::<T, OP>(p, x, base, thread_idx_x(), block_dim_x());
            let total = block_reduce(mine, scratch, identity::<OP>(), comb, shfl_xor_f32);
            if thread_idx_x() == 0 {
                write_global::<T, OP>(p, y, n, c, total);
            }
            o += grid_dim_x();
        }
        return;
    }
    // `group` is a power of two: shifts and masks, no division.
    let group = p.group.clamp(1, 32);
    let shift = group.trailing_zeros();
    let per_warp = (32 >> shift) as u64;
    let warps = (grid_dim_x() as u64 * block_dim_x() as u64) / 32;
    let (slot, lane) = (lane_id() >> shift, lane_id() & (group - 1));
    let mut first = (global_thread_x() / 32) * per_warp;
    while first < p.outputs as u64 {
        let o = first + slot as u64;
        let active = o < p.outputs as u64;
        let (n, c) = p.c.div_rem(o as u32);
        let mine = if active {
            let base = n * p.x_n + c * p.x_c;
            reduce_row::<T, OP>(p, x, base, lane, group)
        } else {
            identity::<OP>()
        };
        let total = group_reduce(mine, group, comb, shfl_xor_f32);
        if active && lane == 0 {
            write_global::<T, OP>(p, y, n, c, total);
        }
        first += warps * per_warp;
    }
}

/// Global pooling of short planes stored back to back (NCHW: unit spatial stride, `x_c =
/// len`, `x_n = c * len`): a warp per `32 / group` consecutive planes, `group` lanes a
/// plane. The warp copies the planes' bytes (from the 16-byte boundary at or before the
/// first: the first itself where `32 / group` planes are a multiple of 16 bytes, as with
/// the host's groups of 1 and 2) into its shared memory with 16-byte `cp.async`s, all in
/// flight at once and holding no registers; then each lane reduces every `group`-th
/// element of its plane from there, and the group combines them with shuffles. ([`fwd_global`] has its lanes
/// load single elements: a few hundred bytes in flight a warp.) Where the length is even,
/// each plane's lanes start their reads at a plane-dependent element of their own, so
/// that the planes' reads fall in different banks (an odd length spreads them already).
///
/// # Safety
/// As `pooling_fwd_global_*`, with x 16-byte aligned and laid out as above, `1 <= len <=
/// POOLING_GLOBAL_STAGED_LEN`, `outputs * len * size < 2^32`, and
/// [`pooling_global_stage_bytes`] of dynamic shared memory per warp of the block.
#[inline(always)]
unsafe fn fwd_global_staged<T: Element, const OP: u32>(
    p: &PoolingGlobalParams,
    x: *const T,
    y: *mut T,
) {
    let comb = |a: f32, b: f32| combine::<OP>(a, b);
    let size = size_of::<T>() as u32;
    let lane = lane_id();
    // `group` is a power of two: shifts and masks, no division.
    let group = p.group.clamp(1, 32);
    let shift = group.trailing_zeros();
    let planes = 32 >> shift;
    let (slot, part) = (lane >> shift, lane & (group - 1));
    let stage_bytes = pooling_global_stage_bytes(group as usize, p.len as usize, size as usize);
    let stage = dynamic_smem() + warp_id() * stage_bytes as u32;
    let warps = grid_dim_x() * (block_dim_x() / 32);
    // This lane's elements of a plane: `part`, `part + group`, ..
    let count = if part < p.len {
        (p.len - part).div_ceil(group)
    } else {
        0
    };
    let mut first = (global_thread_x() / 32) as u32 * planes;
    while first < p.outputs {
        let rows = (p.outputs - first).min(planes);
        // Bytes `start..end` of x are the planes'; the copy starts at the 16-byte boundary
        // `base` (inside x, which is aligned) and zero-fills past `end`.
        let start = first * p.len * size;
        let end = start + rows * p.len * size;
        let base = start & !15;
        let mut at = base + lane * 16;
        while at < end {
            let src = (x as *const u8).add(at as usize);
            cp_async_16(stage + (at - base), src, (end - at).min(16));
            at += 32 * 16;
        }
        cp_async_commit();
        cp_async_wait(0);
        sync_warp();
        let active = slot < rows;
        let mut acc = [identity::<OP>(); 4];
        if active {
            // Byte offset in the stage of element `i` of this lane's plane.
            let plane = start - base + slot * p.len * size;
            let element = |k: u32| staged_element::<T>(stage, plane + (part + k * group) * size);
            let mut k = if p.len % 2 == 0 && count > 0 {
                slot % count
            } else {
                0
            };
            let next = |k: u32| if k + 1 == count { 0 } else { k + 1 };
            let mut left = count;
            while left >= 4 {
                crate::unrolled!(j in 4 => {
                    acc[j] = combine::<OP>(acc[j], element(k));
                    k = next(k);
                });
                left -= 4;
            }
            while left > 0 {
                acc[0] = combine::<OP>(acc[0], element(k));
                k = next(k);
                left -= 1;
            }
        }
        let mine = acc.into_iter().fold(identity::<OP>(), comb);
        let total = group_reduce(mine, group, comb, shfl_xor_f32);
        if active && part == 0 {
            let (n, c) = p.c.div_rem(first + slot);
            write_global::<T, OP>(p, y, n, c, total);
        }
        // The next planes overwrite the stage.
        sync_warp();
        first += planes * warps;
    }
}

/// Global pooling of short 16-bit planes stored back to back (NCHW 7x7): a thread a plane,
/// which loads the `NV` 16-byte vectors (`POOLING_GLOBAL_LANE_ELEMENTS` elements) from the
/// boundary at or before its first byte, all in flight at once, and combines the elements
/// of its plane among them. No shared memory and no barrier: one round trip, then
/// arithmetic in registers. (The staged kernel's lanes read an element a shared-memory load,
/// the group kernel's one element a global load.) A vector reaching past x's end (its
/// last, where x's bytes are not a whole number of vectors) is read an element at a time.
///
/// # Safety
/// As `pooling_fwd_global_*`, with x 16-byte aligned and laid out as above,
/// [`oxidnn_params::pooling_global_lane_fits`]`(len, size)` and `outputs * len * size <=
/// 2^32 - 257` (its byte offsets reach 256 bytes past a plane's start).
#[inline(always)]
unsafe fn fwd_global_lane<T: Element, const OP: u32, const K: usize, const NV: usize>(
    p: &PoolingGlobalParams,
    x: *const T,
    y: *mut T,
) {
    const { assert!(K * size_of::<T>() == 16 && NV * K == LANE_ELEMENTS) };
    let size = size_of::<T>() as u32;
    let x_bytes = p.outputs * p.len * size;
    grid_stride(p.outputs as u64, |o| {
        let o = o as u32;
        let start = o * p.len * size;
        let end = start + p.len * size;
        let base = start & !15;
        // The plane's elements are window elements `lead .. lead + len`.
        let lead = (start - base) / size;
        let vector = |at: u32| (x as *const u8).add(at as usize) as *const T;
        // The vectors that hold the plane (the rest stay zero and are not combined).
        let mut words = [[0u32; 4]; NV];
        if base + 16 * NV as u32 <= x_bytes {
            crate::unrolled!(k in NV => {
                let at = base + 16 * k as u32;
                if at < end {
                    words[k] = T::load_raw::<K>(vector(at), true);
                }
            });
        } else {
            // Near x's end: a vector reaching past it is read an element at a time.
            crate::unrolled!(k in NV => {
                let at = base + 16 * k as u32;
                if at < end {
                    words[k] = if at + 16 <= x_bytes {
                        T::load_raw::<K>(vector(at), true)
                    } else {
                        vector_prefix::<T, K>(vector(at), (x_bytes - at) / size)
                    };
                }
            });
        }
        let mut acc = [identity::<OP>(); 4];
        crate::unrolled!(k in NV => {
            let v = T::unpack::<K>(words[k]);
            for (i, &vi) in v.iter().enumerate() {
                let e = (k * K + i) as u32;
                if e.wrapping_sub(lead) < p.len {
                    acc[e as usize % 4] = combine::<OP>(acc[e as usize % 4], vi);
                }
            }
        });
        let (n, c) = p.c.div_rem(o);
        let total = acc.into_iter().fold(identity::<OP>(), combine::<OP>);
        write_global::<T, OP>(p, y, n, c, total);
    });
}

/// The first `count` (< `K`) elements from `src` loaded singly, packed as a vector of `K`
/// (zeros after them).
///
/// # Safety
/// `count` elements from `src` are readable.
#[inline(always)]
unsafe fn vector_prefix<T: Element, const K: usize>(src: *const T, count: u32) -> Vec16 {
    let mut v = [0.0f32; K];
    for (i, vi) in v.iter_mut().enumerate() {
        if (i as u32) < count {
            *vi = T::load(src.add(i));
        }
    }
    T::pack::<K>(v)
}

/// The element of `T` at byte offset `byte` of the shared memory from `stage`, as f32.
///
/// # Safety
/// `stage` is 4-byte aligned; the element lies in this warp's stage, copied before a
/// barrier.
#[inline(always)]
unsafe fn staged_element<T: Element>(stage: u32, byte: u32) -> f32 {
    let word = ld_shared_u32(stage + (byte & !3));
    // f32: the word itself; 16-bit types: its low or high half.
    T::unpack::<2>([word, 0, 0, 0])[((byte >> 1) & 1) as usize]
}

/// Global pooling over channel-contiguous x: vectors of `K` channels across the block's
/// columns, spatial positions across its rows, rows combined in order through shared memory.
#[inline(always)]
unsafe fn fwd_global_vec<T: Element, const K: usize, const OP: u32>(
    p: &PoolingGlobalParams,
    x: *const T,
    y: *mut T,
) {
    // One slot per thread and channel: 256 threads x up to 8 channels.
    let partials = crate::shared_f32!(8192);
    let (n, tile) = p.tiles.div_rem(block_idx_x());
    let t = thread_idx_x();
    let (row, col) = p.cols.div_rem(t);
    let cols = p.cols.divisor;
    let vector = tile * cols + col;
    let mut acc = [identity::<OP>(); K];
    if row < p.rows && vector < p.c.divisor {
        let base = n * p.x_n + vector * K as u32;
        let mut r = row;
        while r < p.len {
            // Two loads in flight, then their combination.
            let mut v = [[identity::<OP>(); K]; 2];
            crate::unroll!(j in [0, 1] {
                let at = r + j as u32 * p.rows;
                if at < p.len {
                    v[j] = load::<T, K>(x.add((base + at * p.red_stride) as usize));
                }
            });
            for k in 0..K {
                acc[k] = combine::<OP>(acc[k], combine::<OP>(v[0][k], v[1][k]));
            }
            r += 2 * p.rows;
        }
    }
    // SAFETY: thread t writes slots t * K .. t * K + K < 2048, its own; the barrier orders
    // these writes before the reads below.
    for k in 0..K {
        partials.store(t * K as u32 + k as u32, acc[k]);
    }
    sync_threads();
    if t < cols * K as u32 {
        let (col, k) = (t / K as u32, t % K as u32);
        let vector = tile * cols + col;
        if vector < p.c.divisor {
            let mut total = identity::<OP>();
            for r in 0..p.rows {
                // SAFETY: slot (r * cols + col) * K + k < rows * cols * K <= 2048, written
                // before the barrier.
                total = combine::<OP>(total, partials.load((r * cols + col) * K as u32 + k));
            }
            write_global::<T, OP>(p, y, n, vector * K as u32 + k, total);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------

/// A thread per dx element (`K = 1`) or vector of `K` channels, gathering over the windows
/// that contain it.
#[inline(always)]
unsafe fn bwd_gather<T: Element, const K: usize, const OP: u32>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let w = &p.win;
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s } = p.items.at(i as u32);
        let c = c * K as u32;
        // Windows `first[k]..last[k]` contain s[k]: o * stride - pad <= s < that + window.
        let mut first = [0u32; 3];
        let mut last = [0u32; 3];
        crate::unroll!(k in [0, 1, 2] {
            let t = s[k] + w.pad[k];
            first[k] = if t >= w.window[k] { p.stride_div[k].div(t - w.window[k]) + 1 } else { 0 };
            let end = p.stride_div[k].div(t) + 1;
            last[k] = if end < w.output[k] { end } else { w.output[k] };
        });
        let (x_row, y_row, dy_row) = (
            row_offset(&p.x, n, c),
            row_offset(&p.y, n, c),
            row_offset(&p.dy, n, c),
        );
        let mine = if OP == AVG {
            [0.0; K]
        } else {
            load::<T, K>(x.add((x_row + spatial_offset(&p.x, s)) as usize))
        };
        let mut acc = [0.0f32; K];
        for od in first[0]..last[0] {
            for oh in first[1]..last[1] {
                for ow in first[2]..last[2] {
                    let o = [od, oh, ow];
                    let g = dy.add((dy_row + spatial_offset(&p.dy, o)) as usize);
                    if OP == AVG {
                        let g = load::<T, K>(g);
                        let inv = inverse_count(w, o);
                        for k in 0..K {
                            acc[k] += g[k] * inv;
                        }
                        continue;
                    }
                    let yv = load::<T, K>(y.add((y_row + spatial_offset(&p.y, o)) as usize));
                    let mut hit = [false; K];
                    for k in 0..K {
                        hit[k] = same_value(mine[k], yv[k]);
                    }
                    if hit.iter().any(|&h| h)
                        && first_match_is_mine::<T, K>(w, x, &p.x, x_row, o, s, yv, &mut hit)
                    {
                        let g = load::<T, K>(g);
                        for k in 0..K {
                            if hit[k] {
                                acc[k] += g[k];
                            }
                        }
                    }
                }
            }
        }
        let at = row_offset(&p.dx, n, c) + spatial_offset(&p.dx, s);
        store_blended::<T, K>(w, dx.add(at as usize), acc);
    })
}

/// Global average backward: every dx element (or vector of `K` channels) of plane
/// `(n, c)` takes `dy[n, c] / volume` (the window covers the input and has no padding, so
/// its count is its volume whether padding counts or not). A thread per dx element or
/// vector, with no window arithmetic ([`bwd_gather`] works out the windows over each
/// element).
#[inline(always)]
unsafe fn bwd_global_avg<T: Element, const K: usize>(
    p: &PoolingBwdParams,
    dy: *const T,
    dx: *mut T,
) {
    let w = &p.win;
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s } = p.items.at(i as u32);
        let c = c * K as u32;
        let g = load::<T, K>(dy.add(row_offset(&p.dy, n, c) as usize));
        let at = row_offset(&p.dx, n, c) + spatial_offset(&p.dx, s);
        store_blended::<T, K>(w, dx.add(at as usize), g.map(|v| v * w.inv_volume));
    })
}

/// Global average backward over dx planes stored back to back (NCHW): a thread per
/// 16-byte vector of dx's `items.len` elements, each element taking its plane's `dy /
/// volume` (the planes change within a vector where they are shorter than it or end in
/// it). [`bwd_global_avg`] has a thread per element (a 4-byte or 2-byte store each).
///
/// # Safety
/// As `pooling_bwd_global_avg_*`, with dx 16-byte aligned, its planes back to back (unit
/// spatial stride, `dx_c = len`, `dx_n = c * len`, `p.plane_len` dividing by `len`) and
/// `items.len` its elements.
#[inline(always)]
unsafe fn bwd_global_avg_flat<T: Element, const V: usize>(
    p: &PoolingBwdParams,
    dy: *const T,
    dx: *mut T,
) {
    const { assert!(V * size_of::<T>() == 16) };
    let w = &p.win;
    let total = p.items.len;
    let planes = p.plane_len.div(p.items.len);
    let scaled = |plane: u32| {
        let (n, c) = p.items.c.div_rem(plane);
        T::load(dy.add(row_offset(&p.dy, n, c) as usize)) * w.inv_volume
    };
    grid_stride(total.div_ceil(V as u32) as u64, |i| {
        let first = i as u32 * V as u32;
        let (mut plane, mut at) = p.plane_len.div_rem(first);
        let mut g = scaled(plane);
        let mut v = [0.0f32; V];
        crate::unrolled!(k in V => {
            if at == p.plane_len.divisor {
                (plane, at) = (plane + 1, 0);
                if plane < planes {
                    g = scaled(plane);
                }
            }
            v[k] = g;
            at += 1;
        });
        let out = dx.add(first as usize);
        if first + V as u32 <= total {
            store_blended::<T, V>(w, out, v);
        } else {
            crate::unrolled!(k in V => {
                if first + (k as u32) < total {
                    store_blended::<T, 1>(w, out.add(k), [v[k]]);
                }
            });
        }
    })
}

/// Clears `hit[k]` where an element of window `o` before `mine` in scan order equals
/// `yv[k]` (that element takes the window's gradient); returns whether any hit remains.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn first_match_is_mine<T: Element, const K: usize>(
    w: &PoolWindow,
    x: *const T,
    strides: &[u32; 5],
    base: u32,
    o: [u32; 3],
    mine: [u32; 3],
    yv: [f32; K],
    hit: &mut [bool; K],
) -> bool {
    let (d0, _) = span(w, 0, o[0]);
    let (h0, h1) = span(w, 1, o[1]);
    let (w0, w1) = span(w, 2, o[2]);
    let mut d = d0;
    let (mut h, mut c) = (h0, w0);
    // Walk (d, h, c) in scan order from the window's first element up to `mine`.
    while (d, h, c) != (mine[0], mine[1], mine[2]) {
        let v = load::<T, K>(x.add((base + spatial_offset(strides, [d, h, c])) as usize));
        let mut any = false;
        for k in 0..K {
            hit[k] = hit[k] && !same_value(v[k], yv[k]);
            any |= hit[k];
        }
        if !any {
            return false;
        }
        c += 1;
        if c == w1 {
            c = w0;
            h += 1;
            if h == h1 {
                h = h0;
                d += 1;
            }
        }
    }
    true
}

/// A thread per cell (`K = 1`) or cell and vector of `K` channels: each window overlapping
/// the cell is visited once, its contribution added to the cell's elements it covers.
#[inline(always)]
unsafe fn bwd_cell<T: Element, const K: usize, const OP: u32>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let w = &p.win;
    let slot = |j: usize| {
        let v = p.cell_slots[j];
        [v & 0xff, (v >> 8) & 0xff, v >> 16]
    };
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s: cell } = p.items.at(i as u32);
        let c = c * K as u32;
        // The cell's first element (negative: padding), and the windows first[k]..last[k]
        // that overlap it: cell - windows_per_cell < o <= cell.
        let mut origin = [0i32; 3];
        let mut first = [0u32; 3];
        let mut last = [0u32; 3];
        crate::unroll!(k in [0, 1, 2] {
            origin[k] = (cell[k] * w.stride[k]) as i32 - w.pad[k] as i32;
            let back = p.windows_per_cell[k] - 1;
            first[k] = if cell[k] > back { cell[k] - back } else { 0 };
            last[k] = if cell[k] < w.output[k] { cell[k] + 1 } else { w.output[k] };
        });
        let (x_row, y_row, dy_row) = (
            row_offset(&p.x, n, c),
            row_offset(&p.y, n, c),
            row_offset(&p.dy, n, c),
        );
        let mut acc = [[0.0f32; K]; POOLING_MAX_CELL];
        for od in first[0]..last[0] {
            for oh in first[1]..last[1] {
                for ow in first[2]..last[2] {
                    let o = [od, oh, ow];
                    let g = load::<T, K>(dy.add((dy_row + spatial_offset(&p.dy, o)) as usize));
                    if OP == AVG {
                        // Cell element e is in the window when e + (cell - o) * stride < window.
                        let limit = [
                            w.window[0] - (cell[0] - od) * w.stride[0],
                            w.window[1] - (cell[1] - oh) * w.stride[1],
                            w.window[2] - (cell[2] - ow) * w.stride[2],
                        ];
                        let inv = inverse_count(w, o);
                        crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                            let e = slot(j);
                            if (j as u32) < p.cell_len && e[0] < limit[0] && e[1] < limit[1] && e[2] < limit[2] {
                                crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                                    if k < K {
                                        acc[j][k] += g[k] * inv;
                                    }
                                });
                            }
                        });
                        continue;
                    }
                    // The window's first element equal to its y, per channel.
                    let yv = load::<T, K>(y.add((y_row + spatial_offset(&p.y, o)) as usize));
                    let first = first_match::<T, K>(w, x, &p.x, x_row, o, yv);
                    crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if k < K && first[k] != u32::MAX {
                            // The winner's place in the cell, if it is in the cell.
                            let (q, ww) = p.input_hw[1].div_rem(first[k]);
                            let (wd, wh) = p.input_hw[0].div_rem(q);
                            let r = [
                                wd as i32 - origin[0],
                                wh as i32 - origin[1],
                                ww as i32 - origin[2],
                            ];
                            let inside = r[0] >= 0
                                && r[1] >= 0
                                && r[2] >= 0
                                && (r[0] as u32) < w.stride[0]
                                && (r[1] as u32) < w.stride[1]
                                && (r[2] as u32) < w.stride[2];
                            let at = ((r[0] as u32 * w.stride[1] + r[1] as u32) * w.stride[2]
                                + r[2] as u32) as usize;
                            crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                                if inside && at == j {
                                    acc[j][k] += g[k];
                                }
                            });
                        }
                    });
                }
            }
        }
        let dx_row = row_offset(&p.dx, n, c);
        crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            if (j as u32) < p.cell_len {
                let e = slot(j);
                let mut at = [0u32; 3];
                let mut inside = true;
                crate::unroll!(k in [0, 1, 2] {
                    let v = origin[k] + e[k] as i32;
                    inside &= v >= 0 && v < w.input[k] as i32;
                    at[k] = v as u32;
                });
                if inside {
                    let off = dx_row + spatial_offset(&p.dx, at);
                    store_blended::<T, K>(w, dx.add(off as usize), acc[j]);
                }
            }
        });
    })
}

/// Max backward of square 2-D windows, `WIN x WIN` elements at strides `S x S`, padded by
/// `PAD` along w (any padding along h; the depth window 1 at stride 1): a thread per `S`
/// rows (a row of cells) and `RUN = C * S` columns of dx, the columns from a multiple of
/// `RUN`.
///
/// Along h, `P = ceil(WIN / S)` rows of windows overlap the cells' rows, covering
/// `R = (P - 1) * S + WIN` rows of x. Along w, the `PW` windows from `K0 = (WIN - 1 - PAD) /
/// S` before the thread's first cell's overlap its columns, covering `RW = (PW - 1) * S +
/// WIN` columns of x, the thread's own from `OFF = K0 * S + PAD`. The thread loads that
/// region once, and the windows' y and dy, all in flight together; then it finds each
/// window's winner (its first in-bounds element in scan order equal to its y) in registers
/// and adds the window's dy to the winner if it is one of its elements. ([`bwd_cell`], for
/// any window, visits the windows one after another: a round trip to memory each, four a
/// cell for 3x3/s2.) Each of its `S` rows of dx is one vector store where dx allows it:
/// consecutive threads then store consecutive runs, whole sectors a warp instruction
/// (single elements 8 or 16 bytes apart fill a quarter or half of each sector an
/// instruction, and run at about half the speed).
///
/// # Safety
/// As `pooling_bwd_cell_max_*`, with `items` counting h in cells and w in runs of `RUN`
/// columns, and the window as above (`window = [1, WIN, WIN]`, `stride = [1, S, S]`,
/// `pad[0] = 0`, `pad[2] = PAD`: checked by the host).
#[inline(always)]
unsafe fn bwd_cell_region<
    T: Element,
    const WIN: usize,
    const S: usize,
    const PAD: usize,
    const C: usize,
    const P: usize,
    const R: usize,
    const K0: usize,
    const PW: usize,
    const RW: usize,
    const RUN: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const {
        assert!(P == WIN.div_ceil(S) && R == (P - 1) * S + WIN && S <= WIN && PAD < WIN);
        assert!(RUN == C * S && K0 == (WIN - 1 - PAD) / S);
        assert!(PW == K0 + (RUN - 1 + PAD) / S + 1 && RW == (PW - 1) * S + WIN);
    };
    // The thread's first column in the region.
    let off = K0 * S + PAD;
    let w = &p.win;
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s } = p.items.at(i as u32);
        let [depth, cell_h, run] = s;
        // The first window over the thread's elements, per dim; the region's rows and
        // columns and the windows, clamped into x and y (a clamped element re-reads an
        // edge one and never wins; a clamped window adds nothing).
        let first = [
            cell_h as i32 - (P as i32 - 1),
            (run * C as u32) as i32 - K0 as i32,
        ];
        let starts = [
            first[0] * S as i32 - w.pad[1] as i32,
            first[1] * S as i32 - PAD as i32,
        ];
        let (row, row_in) = clamped::<R>(starts[0], w.input[1]);
        let (col, col_in) = clamped::<RW>(starts[1], w.input[2]);
        let (window_row, window_row_in) = clamped::<P>(first[0], w.output[1]);
        let (window_col, window_col_in) = clamped::<PW>(first[1], w.output[2]);
        let x_base = row_offset(&p.x, n, c) + depth * p.x[2];
        let xv: [[f32; RW]; R] = core::array::from_fn(|r| {
            core::array::from_fn(|q| {
                let at = x_base + row[r] * p.x[3] + col[q] * p.x[4];
                load::<T, 1>(x.add(at as usize))[0]
            })
        });
        let per_window = |t: *const T, strides: &[u32; 5]| -> [[f32; PW]; P] {
            core::array::from_fn(|a| {
                core::array::from_fn(|b| {
                    let o = [depth, window_row[a], window_col[b]];
                    let at = row_offset(strides, n, c) + spatial_offset(strides, o);
                    load::<T, 1>(t.add(at as usize))[0]
                })
            })
        };
        let (yv, g) = (per_window(y, &p.y), per_window(dy, &p.dy));
        // The cells' rows in the region start at the last row of windows' start.
        let row_first = (P - 1) * S;
        let mut acc = [[0.0f32; RUN]; S];
        crate::unrolled!(a in P => crate::unrolled!(b in PW => {
            let mut taken = !(window_row_in[a] & window_col_in[b]);
            crate::unrolled!(r in WIN => crate::unrolled!(q in WIN => {
                let (ur, uq) = (a * S + r, b * S + q);
                let won = !taken & row_in[ur] & col_in[uq] & same_value(xv[ur][uq], yv[a][b]);
                taken |= won;
                let ours = (row_first..row_first + S).contains(&ur)
                    && (off..off + RUN).contains(&uq);
                if ours {
                    acc[ur - row_first][uq - off] += if won { g[a][b] } else { 0.0 };
                }
            }))
        }));
        // Each row: one vector store where the run is contiguous, inside x and aligned,
        // single elements otherwise.
        let dx_base = row_offset(&p.dx, n, c) + depth * p.dx[2];
        let vector_bytes = RUN * size_of::<T>();
        let vectors = (8..=16).contains(&vector_bytes) && p.dx[4] == 1;
        crate::unrolled!(r in S => {
            let ur = row_first + r;
            let row_at = dx_base + row[ur] * p.dx[3];
            let run_start = dx.add((row_at + col[off] * p.dx[4]) as usize);
            let mut run_in = row_in[ur];
            crate::unrolled!(q in RUN => run_in &= col_in[off + q]);
            if vectors && run_in && (run_start as usize).is_multiple_of(vector_bytes) {
                store_blended::<T, RUN>(w, run_start, acc[r]);
            } else {
                crate::unrolled!(q in RUN => {
                    if row_in[ur] & col_in[off + q] {
                        let at = row_at + col[off + q] * p.dx[4];
                        store_blended::<T, 1>(w, dx.add(at as usize), [acc[r][q]]);
                    }
                });
            }
        });
    })
}

/// What a thread of [`bwd_cell_region_vec`] knows of its cell: the region of x its `P x P`
/// windows cover (`R x R` positions from the first window's start, clamped into x, with
/// whether each is inside), which windows exist, and their y (unpacked) and dy (as loaded).
struct RegionCell<T, const K: usize, const P: usize, const R: usize> {
    /// x at the cell's `(n, c, depth)`, and its h and w strides.
    x: *const T,
    x_strides: [u32; 2],
    /// The region's rows and columns (clamped), and whether each is inside x.
    rows: ([u32; R], [bool; R]),
    cols: ([u32; R], [bool; R]),
    /// Whether each row and column of windows is inside y.
    windows_in: ([bool; P], [bool; P]),
    /// The windows' y, as loaded and unpacked, and their dy as loaded.
    y_raw: [[Vec16; P]; P],
    y: [[[f32; K]; P]; P],
    dy: [[Vec16; P]; P],
}

impl<T: Element, const K: usize, const P: usize, const R: usize> RegionCell<T, K, P, R> {
    /// The gradient of the cell's `S x S` elements from its `WIN x WIN` windows at stride
    /// `S`; `NAN`: whether a NaN x must count as equal to a NaN y (some y is NaN).
    ///
    /// Row of windows by row of windows: the x rows they cover are loaded together, then
    /// each window's winner (its first in-bounds element equal to its y, per channel) is
    /// found in registers, and its dy goes to the winner where that is one of the cell's
    /// elements (which of a window's elements are the cell's is known at compile time).
    ///
    /// # Safety
    /// Every clamped region position is readable in x.
    #[inline(always)]
    unsafe fn grads<const WIN: usize, const S: usize, const NAN: bool>(
        &self,
    ) -> [[[f32; K]; S]; S] {
        // The cell's positions in the region, per dim, start after the first P - 1 windows'.
        let own = (P - 1) * S;
        let ((row, row_in), (col, col_in)) = (self.rows, self.cols);
        let mut acc = [[[0.0f32; K]; S]; S];
        crate::unrolled!(a in P => {
            let xs: [[Vec16; R]; WIN] = core::array::from_fn(|r| {
                core::array::from_fn(|q| {
                    let at = row[a * S + r] * self.x_strides[0] + col[q] * self.x_strides[1];
                    T::load_raw::<K>(self.x.add(at as usize), true)
                })
            });
            crate::unrolled!(b in P => {
                let (yw, gw) = (self.y[a][b], T::unpack::<K>(self.dy[a][b]));
                let y_raw = self.y_raw[a][b];
                // The winner as `r * WIN + q`: scanned in reverse, the last match is the
                // first in scan order (`u32::MAX` where none is).
                let mut winner = [u32::MAX; K];
                crate::unrolled!(rr in WIN => crate::unrolled!(qq in WIN => {
                    let (r, q) = (WIN - 1 - rr, WIN - 1 - qq);
                    let (ur, uq) = (a * S + r, b * S + q);
                    let inside = row_in[ur] & col_in[uq];
                    // Without NaN y, the same value is `==`, compared as loaded (two f16 an
                    // instruction).
                    let same: [bool; K] = if NAN {
                        let xv = T::unpack::<K>(xs[r][uq]);
                        core::array::from_fn(|k| same_value(xv[k], yw[k]))
                    } else {
                        T::equal::<K>(xs[r][uq], y_raw)
                    };
                    for k in 0..K {
                        if inside & same[k] {
                            winner[k] = (r * WIN + q) as u32;
                        }
                    }
                }));
                let valid = self.windows_in.0[a] & self.windows_in.1[b];
                crate::unrolled!(r in WIN => crate::unrolled!(q in WIN => {
                    let (ur, uq) = (a * S + r, b * S + q);
                    if (own..own + S).contains(&ur) && (own..own + S).contains(&uq) {
                        for k in 0..K {
                            if valid & (winner[k] == (r * WIN + q) as u32) {
                                acc[ur - own][uq - own][k] += gw[k];
                            }
                        }
                    }
                }));
            });
        });
        acc
    }
}

/// Max backward of square 2-D windows, `WIN x WIN` elements at strides `S x S` (any
/// padding; the depth window 1 at stride 1), over channel vectors (every operand
/// channel-contiguous, `CELL_VECTOR` channels a thread): a thread per cell (the `S x S` dx
/// positions from the start of a window) and vector, as [`bwd_cell`] with the window
/// shape compiled in.
///
/// `P = ceil(WIN / S)` windows per dim overlap a cell, covering `R = (P - 1) * S + WIN` x
/// positions per dim; [`RegionCell::grads`] finds their winners in registers. ([`bwd_cell`]
/// walks each window with runtime loops, a round trip to memory a window; the
/// shared-memory tile kernel divides every index.) Each of the cell's positions is one
/// vector store.
///
/// # Safety
/// As `pooling_bwd_cell_vec_max_*`, with the window as above (`window = [1, WIN, WIN]`,
/// `stride = [1, S, S]`, `pad[0] = 0`) and x and y of the same depth: checked by the host.
#[inline(always)]
unsafe fn bwd_cell_region_vec<
    T: Element,
    const WIN: usize,
    const S: usize,
    const P: usize,
    const R: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const K: usize = CELL_VECTOR;
    const { assert!(P == WIN.div_ceil(S) && R == (P - 1) * S + WIN && S <= WIN) };
    // The cell's positions in the region, per dim, start after the first P - 1 windows'.
    let own = (P - 1) * S;
    let w = &p.win;
    grid_stride(p.items.len as u64, |i| {
        let PoolCoord { n, c, s } = p.items.at(i as u32);
        let [depth, cell_h, cell_w] = s;
        let c = c * K as u32;
        // The first window over the cell, per dim; the windows and the region's rows and
        // columns, clamped into y and x (a clamped element re-reads an edge one and never
        // wins; a clamped window adds nothing).
        let first = [
            cell_h as i32 - (P - 1) as i32,
            cell_w as i32 - (P - 1) as i32,
        ];
        let (window_row, window_row_in) = clamped::<P>(first[0], w.output[1]);
        let (window_col, window_col_in) = clamped::<P>(first[1], w.output[2]);
        let (row, row_in) = clamped::<R>(first[0] * S as i32 - w.pad[1] as i32, w.input[1]);
        let (col, col_in) = clamped::<R>(first[1] * S as i32 - w.pad[2] as i32, w.input[2]);
        let per_window = |t: *const T, strides: &[u32; 5]| -> [[Vec16; P]; P] {
            core::array::from_fn(|a| {
                core::array::from_fn(|b| {
                    let o = [depth, window_row[a], window_col[b]];
                    let at = row_offset(strides, n, c) + spatial_offset(strides, o);
                    T::load_raw::<K>(t.add(at as usize), true)
                })
            })
        };
        let (yv, g) = (per_window(y, &p.y), per_window(dy, &p.dy));
        let cell = RegionCell::<T, K, P, R> {
            x: x.add((row_offset(&p.x, n, c) + depth * p.x[2]) as usize),
            x_strides: [p.x[3], p.x[4]],
            rows: (row, row_in),
            cols: (col, col_in),
            windows_in: (window_row_in, window_col_in),
            y_raw: yv,
            y: core::array::from_fn(|a| core::array::from_fn(|b| T::unpack::<K>(yv[a][b]))),
            dy: g,
        };
        // Without a NaN among the windows' y, equal is `==`, a third of the work.
        let mut nan = false;
        crate::unrolled!(a in P => crate::unrolled!(b in P => {
            for k in 0..K {
                nan |= cell.y[a][b][k] != cell.y[a][b][k];
            }
        }));
        let acc = if nan {
            cell.grads::<WIN, S, true>()
        } else {
            cell.grads::<WIN, S, false>()
        };
        let dx_base = row_offset(&p.dx, n, c) + depth * p.dx[2];
        crate::unrolled!(r in S => crate::unrolled!(q in S => {
            if row_in[own + r] & col_in[own + q] {
                let at = dx_base + row[own + r] * p.dx[3] + col[own + q] * p.dx[4];
                store_blended::<T, K>(w, dx.add(at as usize), acc[r][q]);
            }
        }));
    })
}

/// The first of a window's `n` elements (a compile-time constant after inlining), in scan
/// order, for which `same` holds (the one that takes a max window's gradient), or
/// `u32::MAX` if none does. Scanned in reverse with selects: no branches.
#[inline(always)]
fn first_equal(n: usize, same: impl Fn(usize) -> bool) -> u32 {
    let mut first = u32::MAX;
    crate::unrolled!(j in n => {
        let j = n - 1 - j;
        if same(j) {
            first = j as u32;
        }
    });
    first
}

/// What a disjoint window gives one of its elements: the average's share of its dy `g`,
/// or, for the max, `g` if the element won the window; nothing where the window is not
/// one (`valid` false: a cell past the last window).
#[inline(always)]
fn disjoint_grad<const OP: u32>(w: &PoolWindow, g: f32, valid: bool, won: bool) -> f32 {
    if !valid {
        0.0
    } else if OP == AVG {
        g * w.inv_volume
    } else if won {
        g
    } else {
        0.0
    }
}

/// Per channel, the first of a window's `n` vectors of `K` channels (a compile-time
/// constant after inlining; `x(j)` the `j`-th in scan order, as loaded) equal to the
/// window's y (as loaded), or `u32::MAX` where none is. `NAN`: whether a NaN must count as
/// equal to a NaN (some y is NaN); without, `==` on the elements as loaded (two 16-bit ones
/// an instruction).
#[inline(always)]
fn first_equal_channels<T: Element, const K: usize, const NAN: bool>(
    n: usize,
    x: impl Fn(usize) -> Vec16,
    y_raw: Vec16,
) -> [u32; K] {
    let y = T::unpack::<K>(y_raw);
    let mut first = [u32::MAX; K];
    crate::unrolled!(j in n => {
        let j = n - 1 - j;
        let same: [bool; K] = if NAN {
            let xv = T::unpack::<K>(x(j));
            core::array::from_fn(|k| same_value(xv[k], y[k]))
        } else {
            T::equal::<K>(x(j), y_raw)
        };
        crate::unrolled!(k in K => {
            if same[k] {
                first[k] = j as u32;
            }
        });
    });
    first
}

/// [`first_equal_channels`] as masks: calls `won(j, mask)` for each of a window's `n`
/// vectors of `K` channels in scan order (`x(j)` the `j`-th, as loaded), `mask` in the form
/// of [`Element::equal_mask`], over the channels where `x(j)` is the first vector `inside`
/// x equal to the window's y (NaN equal to NaN where `NAN`). Two f16 channels take one
/// comparison and two bitwise operations, where a winner index takes a comparison and a
/// select per channel, and another per channel to gather.
#[inline(always)]
fn first_equal_masks<T: Element, const K: usize, const NAN: bool>(
    n: usize,
    x: impl Fn(usize) -> Vec16,
    inside: impl Fn(usize) -> bool,
    y_raw: Vec16,
    mut won: impl FnMut(usize, Vec16),
) {
    let mut taken = [0u32; 4];
    crate::unrolled!(j in n => {
        let same = if NAN {
            T::same_mask::<K>(x(j), y_raw)
        } else {
            T::equal_mask::<K>(x(j), y_raw)
        };
        let inside = (inside(j) as u32).wrapping_neg();
        let mut first = [0u32; 4];
        crate::unrolled!(w in 4 => {
            let hit = same[w] & inside;
            first[w] = hit & !taken[w];
            taken[w] |= hit;
        });
        won(j, first);
    });
}

/// Backward of non-overlapping, unpadded windows, `WD x S x S` at stride `WD x S x S` (`WD`
/// 1, the planes passing through, or `S`), over rows contiguous along w in whole 16-byte
/// vectors of `V` elements (NCHW): a thread per vector of dx columns and row of windows,
/// two a turn with every load of the turn in flight before the first wait
/// (`grid_stride_turns`). The `O = V / S` windows over the vector's columns cover exactly
/// the `WD * S` dx vectors under them (a dx element is under one window at most: the one at
/// its cell's index). Average (`OP == AVG`): each window's dy, scaled, goes to all its
/// elements. Max: the thread also reads the windows' y and the `WD * S` x vectors under
/// them, and each window's dy goes to its first element equal to its y in scan order
/// (depth, then h, then w; NaN equal to NaN). Consecutive threads take consecutive vectors,
/// so a warp's loads and stores of x and dx fill whole sectors. dx elements under no window
/// (the last planes and rows where the window does not divide the input) take a zero
/// gradient. ([`bwd_cell`] reads one window at a time and writes single elements.)
///
/// # Safety
/// As `pooling_bwd_cell_max_*`, with `items` counting w in strips of `O` cells and d and h
/// in cells, the window as above (`pad = [0, 0, 0]`; checked by the host), and dx (and x,
/// for the max) 16-byte aligned with unit w stride, its other strides and w extent
/// multiples of `V` (so a strip's vector, which starts inside its row, ends inside it).
#[inline(always)]
unsafe fn bwd_strip_disjoint<
    T: Element,
    const OP: u32,
    const WD: usize,
    const S: usize,
    const V: usize,
    const O: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const { assert!(V * size_of::<T>() == 16 && O * S == V && (WD == 1 || WD == S)) };
    let w = &p.win;
    // The strip's windows, clamped into y (a clamped one gives no gradient), and the x and
    // dx vector `(plane, row)` under them, clamped into x (only cells past the last window
    // reach past its end, and they take no gradient).
    let windows = #[inline(always)]
    |s: [u32; 3]| {
        let [cell_d, cell_h, strip] = s;
        let (ow, ow_in) = clamped::<O>((strip * O as u32) as i32, w.output[2]);
        let row_in = (cell_d < w.output[0]) & (cell_h < w.output[1]);
        let o = [cell_d.min(w.output[0] - 1), cell_h.min(w.output[1] - 1)];
        let valid: [bool; O] = core::array::from_fn(|k| row_in & ow_in[k]);
        (o, ow, valid)
    };
    let under = #[inline(always)]
    |s: [u32; 3], dd: usize, r: usize| {
        let plane = s[0] * WD as u32 + dd as u32;
        let row = s[1] * S as u32 + r as u32;
        (plane, row, (plane < w.input[0]) & (row < w.input[1]))
    };
    let fetch = #[inline(always)]
    |coord: PoolCoord| {
        let PoolCoord { n, c, s } = coord;
        let (o, ow, _) = windows(s);
        let bits = |t: *const T, strides: &[u32; 5]| -> [u32; O] {
            core::array::from_fn(|k| {
                let at = row_offset(strides, n, c) + spatial_offset(strides, [o[0], o[1], ow[k]]);
                T::load_bits(t.add(at as usize))
            })
        };
        if OP == AVG {
            return (bits(dy, &p.dy), ([0; O], [[[0; 4]; S]; WD]));
        }
        let xs: [[Vec16; S]; WD] = core::array::from_fn(|dd| {
            core::array::from_fn(|r| {
                let (plane, row, _) = under(s, dd, r);
                let at = row_offset(&p.x, n, c)
                    + spatial_offset(
                        &p.x,
                        [plane.min(w.input[0] - 1), row.min(w.input[1] - 1), 0],
                    )
                    + s[2] * V as u32;
                T::load_raw::<V>(x.add(at as usize), true)
            })
        });
        (bits(dy, &p.dy), (bits(y, &p.y), xs))
    };
    let finish =
        #[inline(always)]
        |coord: PoolCoord, (g_bits, (y_bits, xs)): ([u32; O], ([u32; O], [[Vec16; S]; WD]))| {
            let PoolCoord { n, c, s } = coord;
            let (_, _, valid) = windows(s);
            let value = |b: u32| T::unpack::<1>([b, 0, 0, 0])[0];
            let g: [f32; O] = core::array::from_fn(|k| value(g_bits[k]));
            // Each window's winner as `(dd * S + r) * S + q` (the max), per window.
            let mut winner = [u32::MAX; O];
            if OP != AVG {
                let xv: [[[f32; V]; S]; WD] =
                    core::array::from_fn(|dd| core::array::from_fn(|r| T::unpack::<V>(xs[dd][r])));
                crate::unrolled!(k in O => {
                    let yk = value(y_bits[k]);
                    winner[k] = first_equal(WD * S * S, |j| {
                        let (dd, r, q) = (j / (S * S), j / S % S, j % S);
                        same_value(xv[dd][r][k * S + q], yk)
                    });
                });
            }
            let dx_row = row_offset(&p.dx, n, c) + s[2] * V as u32;
            crate::unrolled!(dd in WD => crate::unrolled!(r in S => {
                let (plane, row, inside) = under(s, dd, r);
                let values: [f32; V] = core::array::from_fn(|e| {
                    let (k, q) = (e / S, e % S);
                    let won = winner[k] == ((dd * S + r) * S + q) as u32;
                    disjoint_grad::<OP>(w, g[k], valid[k], won)
                });
                if inside {
                    let at = dx_row + plane * p.dx[2] + row * p.dx[3];
                    store_blended::<T, V>(w, dx.add(at as usize), values);
                }
            }));
        };
    let locate = #[inline(always)]
    |i: u64| p.items.at(i as u32);
    const TURN: usize = oxidnn_params::POOLING_STRIPS_PER_TURN as usize;
    grid_stride_turns::<TURN, _, _>(p.items.len as u64, locate, fetch, finish)
}

/// Backward of non-overlapping, unpadded windows, `WD x S x S` at stride `WD x S x S` (`WD`
/// 1, the planes passing through, or `S`), over channel vectors (NHWC): a thread per cell
/// (the `WD x S x S` dx positions under one window) and 16-byte vector of `K` channels,
/// two cells a turn with every load of the turn in flight before the first wait
/// (`grid_stride_turns`). Average (`OP == AVG`): the window's dy vector, scaled, goes to
/// the cell's positions. Max: the thread also reads the window's y vector and the cell's x
/// vectors, and per channel the window's dy goes to its first element equal to its y in
/// scan order (NaN equal to NaN; where no y of the vector is NaN, `==` on the elements as
/// loaded, two 16-bit ones an instruction). Consecutive lanes take consecutive channel
/// vectors, so every load and store of a warp is contiguous. Cells past the last window
/// (where the window does not divide the input) take a zero gradient. (The gather visits
/// each dx vector's windows through run-time bounds and divisions; the tiles go through
/// shared memory.)
///
/// # Safety
/// As `pooling_bwd_cell_vec_max_*`, with vectors of `K = 16 / size` channels (`items.c`
/// counts them, `items` counts cells; every operand channel-contiguous as for
/// `pooling_fwd_window_vec_*`), and the window as above (checked by the host).
#[inline(always)]
unsafe fn bwd_cell_vec_disjoint<
    T: Element,
    const OP: u32,
    const WD: usize,
    const S: usize,
    const K: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const { assert!((WD == 1 || WD == S) && WD * S * S <= POOLING_MAX_CELL) };
    let w = &p.win;
    // The cell's window (the one at the cell's own index), clamped into y, and whether it
    // is one.
    let window = #[inline(always)]
    |cell: [u32; 3]| {
        let inside = (cell[0] < w.output[0]) & (cell[1] < w.output[1]) & (cell[2] < w.output[2]);
        let o: [u32; 3] = core::array::from_fn(|k| cell[k].min(w.output[k] - 1));
        (o, inside)
    };
    // The cell's position `j = (dd * S + r) * S + q` in x and dx, and whether it is inside.
    let position = #[inline(always)]
    |cell: [u32; 3], j: usize| {
        let (dd, r, q) = (j / (S * S), j / S % S, j % S);
        let at = [
            cell[0] * WD as u32 + dd as u32,
            cell[1] * S as u32 + r as u32,
            cell[2] * S as u32 + q as u32,
        ];
        let inside = (at[0] < w.input[0]) & (at[1] < w.input[1]) & (at[2] < w.input[2]);
        (at, inside)
    };
    let fetch = #[inline(always)]
    |coord: PoolCoord| {
        let PoolCoord { n, c, s: cell } = coord;
        let o = window(cell).0;
        let at = |strides: &[u32; 5], s: [u32; 3]| {
            row_offset(strides, n, c * K as u32) + spatial_offset(strides, s)
        };
        let g = T::load_raw::<K>(dy.add(at(&p.dy, o) as usize), true);
        if OP == AVG {
            return (g, ([0; 4], [[[[0; 4]; S]; S]; WD]));
        }
        // The cell's x, clamped into x (only cells past the last window reach past its
        // end, and they take no gradient).
        let xs = core::array::from_fn(|dd| {
            core::array::from_fn(|r| {
                core::array::from_fn(|q| {
                    let (s, _) = position(cell, (dd * S + r) * S + q);
                    let s = core::array::from_fn(|k| s[k].min(w.input[k] - 1));
                    T::load_raw::<K>(x.add(at(&p.x, s) as usize), true)
                })
            })
        });
        (g, (T::load_raw::<K>(y.add(at(&p.y, o) as usize), true), xs))
    };
    let finish = #[inline(always)]
    |coord: PoolCoord, (g, (y_raw, xs)): (Vec16, (Vec16, [[[Vec16; S]; S]; WD]))| {
        let PoolCoord { n, c, s: cell } = coord;
        let inside = window(cell).1;
        let g = T::unpack::<K>(g);
        // Each channel's winner as the cell position `j` (the max). Without a NaN y, equal
        // is `==` on the elements as loaded.
        let mut winner = [u32::MAX; K];
        if OP != AVG {
            let x_at = |j: usize| xs[j / (S * S)][j / S % S][j % S];
            let y = T::unpack::<K>(y_raw);
            let mut nan = false;
            crate::unrolled!(k in K => nan |= y[k] != y[k]);
            winner = if nan {
                first_equal_channels::<T, K, true>(WD * S * S, x_at, y_raw)
            } else {
                first_equal_channels::<T, K, false>(WD * S * S, x_at, y_raw)
            };
        }
        let dx_row = row_offset(&p.dx, n, c * K as u32);
        crate::unrolled!(j in WD * S * S => {
            let (at, position_inside) = position(cell, j);
            let values: [f32; K] =
                core::array::from_fn(|k| disjoint_grad::<OP>(w, g[k], inside, winner[k] == j as u32));
            if position_inside {
                store_blended::<T, K>(w, dx.add((dx_row + spatial_offset(&p.dx, at)) as usize), values);
            }
        });
    };
    let locate = #[inline(always)]
    |i: u64| p.items.at(i as u32);
    const TURN: usize = oxidnn_params::POOLING_STRIPS_PER_TURN as usize;
    grid_stride_turns::<TURN, _, _>(p.items.len as u64, locate, fetch, finish)
}

/// One band of a walk down rows of `WIN`-row windows at stride `S` along h (see
/// `PoolWalk`): its rows of windows `oh0 .. oh1`, the dx rows `lo .. hi` it stores and the
/// end of the x rows its windows read.
///
/// A band owns dx rows from its first row of windows' first row (row 0 for the first band,
/// and for any band whose first window starts in the padding) to the next band's (the
/// input's end for the last): the bands' rows partition dx. It walks from the rows of
/// windows before its own whose rows it shares (`first`).
#[derive(Clone, Copy)]
struct WalkBand<const WIN: usize, const S: usize> {
    pad: i32,
    oh1: u32,
    first: i32,
    lo: i32,
    hi: i32,
    x_end: i32,
}

impl<const WIN: usize, const S: usize> WalkBand<WIN, S> {
    #[inline(always)]
    fn new(w: &PoolWindow, walk: &PoolWalk, band: u32) -> Self {
        let (height, out_h) = (w.input[1] as i32, w.output[1]);
        let oh0 = band * walk.window_rows;
        let oh1 = (oh0 + walk.window_rows).min(out_h);
        let pad = w.pad[1] as i32;
        let top = |oh: u32| S as i32 * oh as i32 - pad;
        // At stride 1 a later band's first window can still start in the padding.
        let lo = if band == 0 { 0 } else { top(oh0).max(0) };
        let hi = if oh1 == out_h {
            height
        } else {
            top(oh1).max(0)
        };
        Self {
            pad,
            oh1,
            first: oh0 as i32 - const { (WIN - 1) / S } as i32,
            lo,
            hi,
            x_end: (top(oh1 - 1) + WIN as i32).min(height),
        }
    }

    /// First row of the windows of row `oh`.
    #[inline(always)]
    fn top(&self, oh: i32) -> i32 {
        S as i32 * oh - self.pad
    }

    /// Whether row `oh` of windows is the band's (or one before it whose rows it shares).
    #[inline(always)]
    fn live(&self, oh: i32) -> bool {
        (oh >= 0) & (oh < self.oh1 as i32)
    }

    /// Whether the band's windows read x row `row`.
    #[inline(always)]
    fn reads(&self, row: i32) -> bool {
        (row >= 0) & (row < self.x_end)
    }

    /// Whether the band stores dx row `row`.
    #[inline(always)]
    fn stores(&self, row: i32) -> bool {
        (row >= self.lo) & (row < self.hi)
    }
}

/// Max backward of `WIN x WIN` windows at stride `S`, padded by `PW` along w (any padding
/// along h), over single channels whose rows are whole 16-byte vectors of `V` elements
/// (`pooling_walk_columns`) and fit a group of lanes (see `PoolWalk`): each group walks
/// down its band's rows of windows, lane `l` owning x and dx columns `V * l ..` and the `V
/// / S` windows from column `V * l - PW`. A step loads the `S` new x rows of the next row of
/// windows as one vector each (the `WIN - S` rows it shares with the last row stay in
/// registers, with their dx sums) and the windows' y and dy; the `PW` columns left and
/// `WIN - S - PW` right of a lane's vector come from its neighbours by shuffles. Each
/// window's dy goes to its first element equal to its y in scan order (NaN equal to NaN,
/// padding never); the first `S` rows are then whole: the sums a lane made for its
/// neighbours' columns go to them, and each lane stores its vector of the row. Each x, y,
/// dy and dx element crosses memory once (the rows a band shares with the one before it
/// twice, through L2), every access of a group is one contiguous run, and nothing goes
/// through shared memory. (The cell kernel reloads the x under every window of its cells,
/// element by element; the band kernel stages everything in shared memory and finds each
/// element's windows by division.)
///
/// Bands as [`WalkBand`] says; a band walks through one row of windows past its own (so
/// that the last band reaches rows below every window), every group `steps` rows of
/// windows: lanes of a warp never diverge around a shuffle. Groups past `items.len` walk
/// the last band again and store nothing.
///
/// # Safety
/// `p` as described by `PoolWalk`, for windows `[1, WIN, WIN]` at strides `[1, S, S]`
/// padded `[0, any, PW]`; x and dx rows at unit w stride, aligned to `V` elements (16
/// bytes), and `input[2] <= V * walk.lanes`; `N = V + WIN - S` and `KW = V / S` (checked
/// at compile time).
#[inline(always)]
unsafe fn bwd_walk_max<
    T: Element,
    const V: usize,
    const WIN: usize,
    const S: usize,
    const PW: usize,
    const N: usize,
    const KW: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const {
        assert!(V * size_of::<T>() == 16 && S < WIN && PW <= WIN - S);
        assert!(N == V + WIN - S && KW * S == V);
    };
    // Rows a row of windows shares with the next, and columns a lane's windows reach right
    // of its vector.
    let carry = const { WIN - S };
    let right = const { WIN - S - PW };
    let (w, walk) = (&p.win, &p.walk);
    let thread = global_thread_x();
    let lanes = walk.lanes;
    let lane = thread as u32 & (lanes - 1);
    let group = thread / lanes as u64;
    let active = group < p.items.len as u64;
    let PoolCoord { n, c, s } = p
        .items
        .at_channels_first(group.min(p.items.len as u64 - 1) as u32);
    let (width, out_w) = (w.input[2], w.output[2]);
    let mut band = WalkBand::<WIN, S>::new(w, walk, s[1]);
    if !active {
        band.hi = band.lo;
    }
    let top = |oh: i32| band.top(oh);
    let col0 = lane * V as u32;
    let mine = col0 < width;
    let plane = |t: &[u32; 5]| row_offset(t, n, c) + spatial_offset(t, [s[0], 0, 0]);
    let (x_plane, dx_plane) = (plane(&p.x) + col0, plane(&p.dx) + col0);
    let (y_plane, dy_plane) = (plane(&p.y), plane(&p.dy));
    // Whether the lane's window `k` of row `oh` is one of the band's (or of the rows of
    // windows before it).
    let live = |oh: i32, k: usize| band.live(oh) & (lane * KW as u32 + (k as u32) < out_w);
    // Whether the band's windows read the lane's vector of x row `row`.
    let read = move |row: i32| mine & band.reads(row);
    let x_row = #[inline(always)]
    |row: i32| -> Vec16 {
        if read(row) {
            T::load_raw::<V>(x.add((x_plane + row as u32 * p.x[3]) as usize), true)
        } else {
            [0; 4]
        }
    };
    // The words row `oh` of windows loads: its `S` x rows below the shared ones and its
    // live windows' y and dy.
    let fetch = #[inline(always)]
    |oh: i32| -> ([Vec16; S], ([u32; KW], [u32; KW])) {
        let rows = core::array::from_fn(|r| x_row(top(oh) + (carry + r) as i32));
        let (mut ys, mut gs) = ([0; KW], [0; KW]);
        crate::unrolled!(k in KW => {
            if live(oh, k) {
                let ow = lane * KW as u32 + k as u32;
                let at = |t: &[u32; 5]| (oh as u32 * t[3] + ow * t[4]) as usize;
                ys[k] = T::load_bits(y.add(y_plane as usize + at(&p.y)));
                gs[k] = T::load_bits(dy.add(dy_plane as usize + at(&p.dy)));
            }
        });
        (rows, (ys, gs))
    };
    // x row `row` (its vector `raw`) as the [`canonical`] bits of the lane's columns `col0
    // - PW ..`, the neighbours' through shuffles; `OUTSIDE` where the row or column is not
    // in x (or not read).
    let spread = #[inline(always)]
    |raw: Vec16, row: i32| -> [u32; N] {
        let own = T::unpack::<V>(raw);
        // All ones (`OUTSIDE`) where the row is not read: no branch.
        let outside = (!read(row) as u32).wrapping_neg();
        let own: [u32; V] = core::array::from_fn(|i| canonical(own[i]) | outside);
        let mut r = [OUTSIDE; N];
        crate::unrolled!(i in V => r[PW + i] = own[i]);
        crate::unrolled!(m in PW => {
            let theirs = shfl_group_u32::<true>(own[V - PW + m], 1, lanes);
            r[m] = if lane > 0 { theirs } else { OUTSIDE };
        });
        crate::unrolled!(m in right => {
            let theirs = shfl_group_u32::<false>(own[m], 1, lanes);
            r[PW + V + m] = if lane + 1 < lanes { theirs } else { OUTSIDE };
        });
        r
    };
    let value = |bits: u32| T::unpack::<1>([bits, 0, 0, 0])[0];
    // Stores dx row `row` from the lane's sums over columns `col0 - PW ..`, with the sums
    // its neighbours made for its columns.
    let store_row = #[inline(always)]
    |row: i32, sums: [f32; N]| {
        let mut own: [f32; V] = core::array::from_fn(|i| sums[PW + i]);
        let shuffled = |v: f32, up: bool| {
            let bits = if up {
                shfl_group_u32::<true>(v.to_bits(), 1, lanes)
            } else {
                shfl_group_u32::<false>(v.to_bits(), 1, lanes)
            };
            f32::from_bits(bits)
        };
        crate::unrolled!(m in PW => {
            let theirs = shuffled(sums[m], false);
            if lane + 1 < lanes {
                own[V - PW + m] += theirs;
            }
        });
        crate::unrolled!(m in right => {
            let theirs = shuffled(sums[PW + V + m], true);
            if lane > 0 {
                own[m] += theirs;
            }
        });
        if mine & band.stores(row) {
            store_blended::<T, V>(w, dx.add((dx_plane + row as u32 * p.dx[3]) as usize), own);
        }
    };

    let first = band.first;
    let mut xs = [[OUTSIDE; N]; WIN];
    let mut sums = [[0.0f32; N]; WIN];
    crate::unrolled!(r in carry => {
        let row = top(first) + r as i32;
        xs[r] = spread(x_row(row), row);
    });
    // Each step's loads are issued a step ahead, in flight while the step before computes.
    let mut next = fetch(first);
    for step in 0..walk.steps as i32 {
        let oh = first + step;
        let row0 = top(oh);
        let (rows, (ys, gs)) = next;
        next = fetch(oh + 1);
        let fence = LoadFence::over(&(rows, (ys, gs))).zero();
        crate::unrolled!(r in S => {
            let row = row0 + (carry + r) as i32;
            xs[carry + r] = spread(rows[r].or_each(fence), row);
        });
        crate::unrolled!(k in KW => {
            // Window `k`'s element `e = (r, q)` is the lane's column `S * k + q` of row `r`;
            // the first equal to y takes dy (a window that is not the band's, nothing).
            let y_bits = canonical(value(ys[k] | fence));
            let winner = first_equal(WIN * WIN, |e| xs[e / WIN][S * k + e % WIN] == y_bits);
            let g = if live(oh, k) { value(gs[k] | fence) } else { 0.0 };
            // Selects, not a branch per winner (sums start at +0: adding 0 keeps them).
            crate::unrolled!(e in WIN * WIN => {
                sums[e / WIN][S * k + e % WIN] += if winner == e as u32 { g } else { 0.0 };
            });
        });
        // Rows `row0 .. row0 + S` are in no later window: store them, move the shared ones
        // up.
        crate::unrolled!(r in S => store_row(row0 + r as i32, sums[r]));
        crate::unrolled!(r in carry => {
            xs[r] = xs[r + S];
            sums[r] = sums[r + S];
        });
        crate::unrolled!(r in S => sums[carry + r] = [0.0; N]);
    }
    let row0 = top(first + walk.steps as i32);
    crate::unrolled!(r in carry => store_row(row0 + r as i32, sums[r]));
}

/// Max backward of square 2-D windows, `WIN x WIN` at strides `S x S` with `S < WIN` (any
/// padding; the depth window 1), over channel vectors (every operand channel-contiguous,
/// `K` channels a thread, `pooling_walk_vec_channels`): a thread per cell column (the `S`
/// dx columns from the start of a window along w), vector of channels and band of rows of
/// windows walks down the band (see `PoolWalk`; `lanes` unused), a row of windows a step.
///
/// The `P = ceil(WIN / S)` windows of a row that overlap the thread's columns cover
/// `R = (P - 1) * S + WIN` x columns (clamped into x, as [`bwd_cell_region_vec`]'s). A
/// step loads the `S` x rows its row of windows does not share with the one before (`R`
/// vectors each) and the `P` windows' y and dy, a step ahead: they are in flight while
/// the step before computes. (No `LoadFence` holds them back until the whole group has
/// landed: with one, the stem's f16 backward took 67.4 against 56.0 µs on an H100.) The
/// `WIN - S` shared rows stay in registers with their dx sums, so the thread reads each x
/// row it needs once, and neighbouring threads' shared columns come from the same warp's
/// loads (L1), where the cell kernel reloads the `R x R` region of every cell from L2
/// (3x3/s2: 25 x vectors for 4 dx vectors, here 10). Each window's winners (its first
/// element inside x equal to its y, per channel) are found once per thread as masks
/// ([`first_equal_masks`]: 3x3/s1 f16 53.6 -> 37.3 µs, the stem's 53.7 -> 46.4 on an
/// H200, against a winner index per channel), and its dy added through them to the
/// thread's own columns; the `S` rows that no later window reads are stored. Compiled
/// for 3x3 at stride 2 (ResNet's stem: 88.8 -> 56.0 µs in f16 on an H100) and 1
/// (Inception's pools: the tile kernel's 99.0 -> 53.8 µs on 32x192x28x28 f16, H200; two
/// dx columns a thread, at one block per SM, took 59.8).
///
/// Band by band as [`bwd_walk_max`] ([`WalkBand`]), through one row of windows past the
/// band's own.
///
/// # Safety
/// As `pooling_bwd_cell_vec_max_*`, with `items` counting (channels last) vectors of `K`
/// channels, the depth, bands of `walk.window_rows` rows of windows and cell columns
/// (`(input[2] - 1 + pad[2]) / S + 1`), and `walk.steps` at least the band's rows of
/// windows plus `(WIN - 1) / S + 1`; the window as above (`window = [1, WIN, WIN]`,
/// `stride = [1, S, S]`, `pad[0] = 0`, or any stride along a dim with one window; the
/// padding below the window, as every descriptor's) and x and y of the same depth:
/// checked by the host.
#[inline(always)]
unsafe fn bwd_walk_vec_max<
    T: Element,
    const K: usize,
    const WIN: usize,
    const S: usize,
    const P: usize,
    const R: usize,
>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const { assert!(P == WIN.div_ceil(S) && R == (P - 1) * S + WIN && S < WIN) };
    // Rows a row of windows shares with the next, and the thread's columns in the region
    // (after the first P - 1 windows').
    let carry = const { WIN - S };
    let own = const { (P - 1) * S };
    let (w, walk) = (&p.win, &p.walk);
    let i = global_thread_x();
    if i >= p.items.len as u64 {
        return;
    }
    let PoolCoord { n, c, s } = p.items.at(i as u32);
    let [depth, band, cell] = s;
    let c = c * K as u32;
    let band = WalkBand::<WIN, S>::new(w, walk, band);
    let top = |oh: i32| band.top(oh);
    // The windows' columns and the region's, clamped into y and x (a clamped element
    // re-reads an edge one and never wins; a clamped window adds nothing).
    let first_col = cell as i32 - (P - 1) as i32;
    let (window_col, window_col_in) = clamped::<P>(first_col, w.output[2]);
    let (col, col_in) = clamped::<R>(first_col * S as i32 - w.pad[2] as i32, w.input[2]);
    let base = |t: &[u32; 5]| row_offset(t, n, c) + depth * t[2];
    let (x_base, dx_base) = (base(&p.x), base(&p.dx));
    let (y_base, dy_base) = (base(&p.y), base(&p.dy));
    // Whether the band's windows read x row `row`, and the window `b` of row `oh` is one of
    // the band's (or of the rows of windows before it).
    let read = |row: i32| band.reads(row);
    let live = |oh: i32, b: usize| band.live(oh) & window_col_in[b];
    let x_row = #[inline(always)]
    |row: i32| -> [Vec16; R] {
        let at = |q: usize| x_base + row as u32 * p.x[3] + col[q] * p.x[4];
        let read = read(row);
        core::array::from_fn(|q| {
            if read {
                T::load_raw::<K>(x.add(at(q) as usize), true)
            } else {
                [0; 4]
            }
        })
    };
    // What row `oh` of windows loads: its `S` x rows below the shared ones and its live
    // windows' y and dy.
    let fetch = #[inline(always)]
    |oh: i32| -> ([[Vec16; R]; S], ([Vec16; P], [Vec16; P])) {
        let rows = core::array::from_fn(|r| x_row(top(oh) + (carry + r) as i32));
        let (mut ys, mut gs) = ([[0; 4]; P], [[0; 4]; P]);
        crate::unrolled!(b in P => {
            if live(oh, b) {
                let at = |t: &[u32; 5]| (oh as u32 * t[3] + window_col[b] * t[4]) as usize;
                ys[b] = T::load_raw::<K>(y.add(y_base as usize + at(&p.y)), true);
                gs[b] = T::load_raw::<K>(dy.add(dy_base as usize + at(&p.dy)), true);
            }
        });
        (rows, (ys, gs))
    };
    // Stores dx row `row` from its sums over the thread's columns (unblended, without
    // multiplies, where alpha is 1 and beta 0).
    let plain = (w.alpha == 1.0) & (w.beta == 0.0);
    let store_row = #[inline(always)]
    |row: i32, sums: &[[f32; K]; S]| {
        if band.stores(row) {
            crate::unrolled!(q in S => {
                if col_in[own + q] {
                    let at = dx_base + row as u32 * p.dx[3] + col[own + q] * p.dx[4];
                    if plain {
                        store::<T, K>(dx.add(at as usize), sums[q]);
                    } else {
                        store_blended::<T, K>(w, dx.add(at as usize), sums[q]);
                    }
                }
            });
        }
    };

    let first = band.first;
    let mut xs = [[[0u32; 4]; R]; WIN];
    let mut xs_in = [false; WIN];
    let mut sums = [[[0.0f32; K]; S]; WIN];
    crate::unrolled!(r in carry => {
        let row = top(first) + r as i32;
        (xs[r], xs_in[r]) = (x_row(row), read(row));
    });
    // Each step's loads are issued a step ahead, in flight while the step before computes.
    let mut next = fetch(first);
    for step in 0..walk.steps as i32 {
        let oh = first + step;
        let row0 = top(oh);
        let (rows, (ys, gs)) = next;
        next = fetch(oh + 1);
        crate::unrolled!(r in S => {
            xs[carry + r] = rows[r];
            xs_in[carry + r] = read(row0 + (carry + r) as i32);
        });
        crate::unrolled!(b in P => {
            // Window `b`'s element `e = (r, q)` is the region's column `S * b + q` of row `r`.
            let x_at = |e: usize| xs[e / WIN][S * b + e % WIN];
            let inside = |e: usize| xs_in[e / WIN] & col_in[S * b + e % WIN];
            let y_raw = ys[b];
            let yv = T::unpack::<K>(y_raw);
            let nan = (0..K).fold(false, |nan, k| nan | (yv[k] != yv[k]));
            // The window's dy as `fetch` loaded it (+0 for a window that is not the
            // band's); each element it wins takes it through its mask (sums start at +0:
            // adding +0 keeps them).
            let g = gs[b];
            let mut add = |e: usize, won: Vec16| {
                let q = S * b + e % WIN;
                if (own..own + S).contains(&q) {
                    let won = T::unpack::<K>(core::array::from_fn(|w| g[w] & won[w]));
                    crate::unrolled!(k in K => sums[e / WIN][q - own][k] += won[k]);
                }
            };
            if nan {
                first_equal_masks::<T, K, true>(WIN * WIN, x_at, inside, y_raw, &mut add);
            } else {
                first_equal_masks::<T, K, false>(WIN * WIN, x_at, inside, y_raw, &mut add);
            }
        });
        // Rows `row0 .. row0 + S` are in no later window: store them, move the shared ones
        // up.
        crate::unrolled!(r in S => store_row(row0 + r as i32, &sums[r]));
        crate::unrolled!(r in carry => {
            (xs[r], xs_in[r]) = (xs[r + S], xs_in[r + S]);
            sums[r] = sums[r + S];
        });
        crate::unrolled!(r in S => sums[carry + r] = [[0.0; K]; S]);
    }
    let row0 = top(first + walk.steps as i32);
    crate::unrolled!(r in carry => store_row(row0 + r as i32, &sums[r]));
}

/// Max backward through shared memory: a block takes a tile of cells of one image and run
/// of channel vectors (see `PoolTile`). First every window overlapping the tile finds, once,
/// the element that takes its gradient (its first element equal to its y), kept in shared
/// memory with its dy; then every dx element of the tile adds the dy of the windows it won.
#[inline(always)]
unsafe fn bwd_tile_max<T: Element, const K: usize>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let w = &p.win;
    let tile = &p.tile;
    let vectors = tile.vectors.divisor;
    let winners = dynamic_smem();
    let grads = winners + 4 * tile.window_count * vectors * K as u32;
    let (q, tw) = tile.count[2].div_rem(block_idx_x());
    let (q, th) = tile.count[1].div_rem(q);
    let (q, td) = tile.count[0].div_rem(q);
    let (n, vb) = tile.vector_blocks.div_rem(q);
    let t = [td, th, tw];
    // The tile's first cell, and its first window (negative: before window 0), per dim.
    let mut first_cell = [0u32; 3];
    let mut first_window = [0i32; 3];
    crate::unroll!(k in [0, 1, 2] {
        first_cell[k] = t[k] * tile.cells[k];
        first_window[k] = first_cell[k] as i32 - (p.windows_per_cell[k] - 1) as i32;
    });

    let mut i = thread_idx_x();
    while i < tile.window_count * vectors {
        let (wi, v) = tile.vectors.div_rem(i);
        let (q, ow) = tile.windows[2].div_rem(wi);
        let (od, oh) = tile.windows[1].div_rem(q);
        let o = [
            first_window[0] + od as i32,
            first_window[1] + oh as i32,
            first_window[2] + ow as i32,
        ];
        let vector = vb * vectors + v;
        let mut inside = vector < tile.channel_vectors;
        crate::unroll!(k in [0, 1, 2] {
            inside &= o[k] >= 0 && (o[k] as u32) < w.output[k];
        });
        let mut winner = [u32::MAX; K];
        let mut g = [0.0f32; K];
        if inside {
            let o = [o[0] as u32, o[1] as u32, o[2] as u32];
            let c = vector * K as u32;
            let at_y = row_offset(&p.y, n, c) + spatial_offset(&p.y, o);
            let yv = load::<T, K>(y.add(at_y as usize));
            winner = first_match::<T, K>(w, x, &p.x, row_offset(&p.x, n, c), o, yv);
            let at_dy = row_offset(&p.dy, n, c) + spatial_offset(&p.dy, o);
            g = load::<T, K>(dy.add(at_dy as usize));
        }
        // SAFETY: slot i * K + k < window_count * vectors * K, the size of both arrays the
        // host allocated; each slot is written by one thread, read after the barrier.
        for k in 0..K {
            let slot = 4 * (i * K as u32 + k as u32);
            st_shared_u32(winners + slot, winner[k]);
            st_shared_u32(grads + slot, g[k].to_bits());
        }
        i += block_dim_x();
    }
    sync_threads();

    let mut e = thread_idx_x();
    while e < tile.element_count * vectors {
        let (ei, v) = tile.vectors.div_rem(e);
        let (q, ew) = tile.elements[2].div_rem(ei);
        let (ed, eh) = tile.elements[1].div_rem(q);
        let rel = [ed, eh, ew];
        let vector = vb * vectors + v;
        let mut inside = vector < tile.channel_vectors;
        let mut s = [0u32; 3];
        crate::unroll!(k in [0, 1, 2] {
            let at = (first_cell[k] * w.stride[k] + rel[k]) as i32 - w.pad[k] as i32;
            inside &= at >= 0 && (at as u32) < w.input[k];
            s[k] = at as u32;
        });
        if inside {
            let me = (s[0] * w.input[1] + s[1]) * w.input[2] + s[2];
            // Windows first[k]..last[k] contain s[k] (all among the tile's windows).
            let mut first = [0u32; 3];
            let mut last = [0u32; 3];
            crate::unroll!(k in [0, 1, 2] {
                (first[k], last[k]) = windows_over(p, k, s[k]);
            });
            let mut acc = [0.0f32; K];
            for od in first[0]..last[0] {
                for oh in first[1]..last[1] {
                    for ow in first[2]..last[2] {
                        let local = ((od as i32 - first_window[0]) as u32
                            * tile.windows[1].divisor
                            + (oh as i32 - first_window[1]) as u32)
                            * tile.windows[2].divisor
                            + (ow as i32 - first_window[2]) as u32;
                        let base = (local * vectors + v) * K as u32;
                        for k in 0..K {
                            let slot = 4 * (base + k as u32);
                            // SAFETY: written in the first phase, before the barrier.
                            if ld_shared_u32(winners + slot) == me {
                                acc[k] += f32::from_bits(ld_shared_u32(grads + slot));
                            }
                        }
                    }
                }
            }
            let c = vector * K as u32;
            let at = row_offset(&p.dx, n, c) + spatial_offset(&p.dx, s);
            store_blended::<T, K>(w, dx.add(at as usize), acc);
        }
        e += block_dim_x();
    }
}

/// Loads issued together by each thread of a `pooling_bwd_band_max*` block as it stages
/// its rows (times three: x, y and dy).
const BAND_LOADS: u32 = 4;

/// Windows or dx columns a thread of `pooling_bwd_band_max_<W>x<W>s1p<P>_*` takes.
const BAND_RUN: usize = oxidnn_params::POOLING_BAND_RUN;

/// Where a band block's rows are, once staged in shared memory.
struct StagedBand {
    /// The band's dx rows `h0..h1`.
    h0: u32,
    h1: u32,
    /// The first row of windows over them, and how many rows of windows.
    oh0: u32,
    window_rows: u32,
    /// The first x row those windows cover, and how many x rows.
    xr0: u32,
    x_rows: u32,
    /// Shared addresses: x, then the windows' y (then their winners), then their dy.
    xs: u32,
    ys: u32,
    gs: u32,
    /// The plane's offset in dx.
    dx_plane: u32,
}

/// Bits no [`canonical`] value has (a NaN's, which canonical NaNs are not): a position
/// outside the tensor, equal to no y.
const OUTSIDE: u32 = u32::MAX;

/// `v`'s bits, NaNs and zeros made one value each: equal canonical bits are what
/// [`same_value`] calls the same value.
#[inline(always)]
fn canonical(v: f32) -> u32 {
    // Two selects, no branch: the staging loops run it on every element.
    let nonzero = if v == 0.0 { 0 } else { v.to_bits() };
    if v != v {
        0x7fff_ffff
    } else {
        nonzero
    }
}

/// Stages a band block's x rows and its windows' y and dy in shared memory (see
/// `PoolBand`), x and y as [`canonical`] bits, dy as f32, and waits for the whole block's
/// stores. Each thread issues its loads `BAND_LOADS` a tensor at a time, consecutive
/// threads on consecutive elements of a row. Where the staged rows are one run both in
/// memory and in shared memory (unit w stride, rows `input[2]` apart, the pitch the
/// width; likewise y and dy), an element's index is its offset, without a division.
///
/// # Safety
/// As `pooling_bwd_band_max_*`.
#[inline(always)]
unsafe fn stage_band<T: Element>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
) -> StagedBand {
    let w = &p.win;
    let band = &p.band;
    let PoolCoord { n, c, s } = p.items.at(block_idx_x());
    let [depth, b, _] = s;
    let h0 = b * band.rows;
    let h1 = (h0 + band.rows).min(w.input[1]);
    let (oh0, _) = windows_over(p, 1, h0);
    let (_, oh1) = windows_over(p, 1, h1 - 1);
    let window_rows = oh1.saturating_sub(oh0);
    // Every window has an in-bounds row (padding < window), so rows of windows cover x rows.
    let (xr0, xr1) = (span(w, 1, oh0).0, span(w, 1, oh1.max(1) - 1).1);
    let x_rows = if window_rows > 0 { xr1 - xr0 } else { 0 };

    let xs = dynamic_smem();
    let ys = xs + 4 * band.x_rows * band.x_pitch;
    let gs = ys + 4 * band.window_rows * band.window_pitch;
    let plane = |strides: &[u32; 5]| row_offset(strides, n, c) + depth * strides[2];
    let (x_plane, y_plane, dy_plane) = (plane(&p.x), plane(&p.y), plane(&p.dy));
    let (width, out_width) = (w.input[2], w.output[2]);
    let (x_len, window_len) = (x_rows * width, window_rows * out_width);
    // Whether `rows` staged rows of `width` are one run in memory and in shared memory.
    let one_run = |strides: &[u32; 5], rows: u32, width: u32, pitch: u32| {
        (strides[4] == 1 || width == 1) && (strides[3] == width || rows <= 1) && pitch == width
    };
    let x_run = one_run(&p.x, x_rows, width, band.x_pitch);
    let window_run = one_run(&p.y, window_rows, out_width, band.window_pitch)
        && one_run(&p.dy, window_rows, out_width, band.window_pitch);
    // The staging loop, compiled twice: for rows that are one run (the usual dense
    // planes: each element's index is its offset, and the loop carries no division
    // and no untaken path), and for any strides.
    let stage = #[inline(always)]
    |x_run: bool, window_run: bool| {
        let step = block_dim_x();
        let mut i = thread_idx_x();
        while i < x_len.max(window_len) {
            // Every load of the round unconditionally (past the end: the last element again),
            // then the stores of those inside.
            let at = |u: usize, len: u32| (i + u as u32 * step).min(len.max(1) - 1);
            let xv: [(u32, f32); BAND_LOADS as usize] = core::array::from_fn(|u| {
                let j = at(u, x_len);
                let (slot, offset) = if x_run {
                    (j, xr0 * width + j)
                } else {
                    let (r, q) = p.input_hw[1].div_rem(j);
                    (r * band.x_pitch + q, (xr0 + r) * p.x[3] + q * p.x[4])
                };
                (slot, load::<T, 1>(x.add((x_plane + offset) as usize))[0])
            });
            let window_at = |u: usize, t: *const T, plane: u32, strides: &[u32; 5]| {
                let j = at(u, window_len);
                let (slot, offset) = if window_run {
                    (j, oh0 * out_width + j)
                } else {
                    let (a, ow) = band.output_w.div_rem(j);
                    (
                        a * band.window_pitch + ow,
                        (oh0 + a) * strides[3] + ow * strides[4],
                    )
                };
                (slot, load::<T, 1>(t.add((plane + offset) as usize))[0])
            };
            let yv: [(u32, f32); BAND_LOADS as usize] =
                core::array::from_fn(|u| window_at(u, y, y_plane, &p.y));
            let gv: [(u32, f32); BAND_LOADS as usize] =
                core::array::from_fn(|u| window_at(u, dy, dy_plane, &p.dy));
            // SAFETY: slots of staged rows and columns, inside the host's allocation.
            crate::unrolled!(u in BAND_LOADS as usize => {
                let j = i + u as u32 * step;
                if j < x_len {
                    st_shared_u32(xs + 4 * xv[u].0, canonical(xv[u].1));
                }
                if j < window_len {
                    st_shared_u32(ys + 4 * yv[u].0, canonical(yv[u].1));
                    st_shared_u32(gs + 4 * gv[u].0, gv[u].1.to_bits());
                }
            });
            i += BAND_LOADS * step;
        }
    };
    if x_run && window_run {
        stage(true, true);
    } else {
        stage(x_run, window_run);
    }
    sync_threads();
    StagedBand {
        h0,
        h1,
        oh0,
        window_rows,
        xr0,
        x_rows,
        xs,
        ys,
        gs,
        dx_plane: plane(&p.dx),
    }
}

/// Max backward of 2-D windows over single channels through shared memory: a block per
/// band of dx rows of one plane (see `PoolBand`), any window, padding and stride. The
/// block stages the x rows the windows over its band cover and those windows' y and dy
/// ([`stage_band`]); then a thread per window finds its winner once (the first in-bounds
/// element in scan order equal to its y), kept in place of its y; then a thread per dx
/// element of the band adds the dy of the windows it won, in window order. Loads and
/// stores run along rows, consecutive threads on consecutive elements.
///
/// # Safety
/// As `pooling_bwd_tile_max_*`, with one block per item of `items` (over `[n, c, d,
/// bands, 1]`), the window as `PoolBand` says (`window[0] = stride[0] = 1`, `pad[0] =
/// 0`), and `band.shared_bytes()` bytes of dynamic shared memory.
#[inline(always)]
unsafe fn bwd_band_max<T: Element>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let w = &p.win;
    let band = &p.band;
    let s = stage_band(p, x, y, dy);
    let (width, out_width) = (w.input[2], w.output[2]);
    let (tid, step) = (thread_idx_x(), block_dim_x());

    let mut i = tid;
    while i < s.window_rows * out_width {
        let (a, ow) = band.output_w.div_rem(i);
        let slot = 4 * (a * band.window_pitch + ow);
        // SAFETY: staged before the barrier; each window's slot is rewritten by the thread
        // that reads it.
        let yv = ld_shared_u32(s.ys + slot);
        let (r0, r1) = span(w, 1, s.oh0 + a);
        let (q0, q1) = span(w, 2, ow);
        let mut winner = u32::MAX;
        'scan: for r in r0..r1 {
            let row = s.xs + 4 * (r - s.xr0) * band.x_pitch;
            for q in q0..q1 {
                if ld_shared_u32(row + 4 * q) == yv {
                    winner = r * width + q;
                    break 'scan;
                }
            }
        }
        st_shared_u32(s.ys + slot, winner);
        i += step;
    }
    sync_threads();

    let mut i = tid;
    while i < (s.h1 - s.h0) * width {
        let (r, q) = p.input_hw[1].div_rem(i);
        let h = s.h0 + r;
        let me = h * width + q;
        let (fh, lh) = windows_over(p, 1, h);
        let (fw, lw) = windows_over(p, 2, q);
        let mut acc = 0.0f32;
        for oh in fh..lh {
            let row = (oh - s.oh0) * band.window_pitch;
            for ow in fw..lw {
                // SAFETY: written in the second phase, before the barrier.
                let slot = 4 * (row + ow);
                if ld_shared_u32(s.ys + slot) == me {
                    acc += f32::from_bits(ld_shared_u32(s.gs + slot));
                }
            }
        }
        let at = s.dx_plane + h * p.dx[3] + q * p.dx[4];
        store_blended::<T, 1>(w, dx.add(at as usize), [acc]);
        i += step;
    }
}

/// The code of a window without a winner (codes are places `row * WIN + column` in the
/// window).
const NO_WINNER: u32 = u32::MAX;

/// [`bwd_band_max`] for `WIN x WIN` windows at stride 1, padded by `PAD` along w (any
/// padding along h; `2 * PAD < WIN`, so a row has no more windows than elements), with
/// the loops unrolled: a thread per run of `RUN = BAND_RUN` windows of a row finds their
/// winners from the `WIN` rows of `RW = RUN + WIN - 1` x elements they share (the middle
/// `RUN` a 16-byte shared-memory load), each winner kept as its place in the window; a
/// thread per run of `RUN` dx elements then reads the `WIN x RW` windows over them (codes
/// and dy, the middle `RUN` of each row as 16-byte loads), and each element adds the dy of
/// those whose winner is at its own place in them, a constant per window and element, in
/// window order. The run's dx row is stored as one vector where dx allows.
///
/// # Safety
/// As `bwd_band_max`, with the window as above (checked by the host).
#[inline(always)]
unsafe fn bwd_band_max_s1<T: Element, const WIN: usize, const PAD: usize, const RW: usize>(
    p: &PoolingBwdParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
) {
    const { assert!(RW == BAND_RUN + WIN - 1 && 2 * PAD < WIN && BAND_RUN == 4) };
    let w = &p.win;
    let band = &p.band;
    let s = stage_band(p, x, y, dy);
    let (width, out_width) = (w.input[2], w.output[2]);
    let (tid, step) = (thread_idx_x(), block_dim_x());

    let mut i = tid;
    while i < s.window_rows * band.window_runs.divisor {
        let (a, run) = band.window_runs.div_rem(i);
        let c0 = run * BAND_RUN as u32;
        // The windows' x rows (staged rows, clamped: a clamped row is out of bounds for
        // every window of the run) and columns, clamped into x and masked.
        let first_row = (s.oh0 + a) as i32 - w.pad[1] as i32 - s.xr0 as i32;
        let (row, row_in) = clamped::<WIN>(first_row, s.x_rows);
        let (col, col_in) = clamped::<RW>(c0 as i32 - PAD as i32, width);
        // SAFETY: staged rows; the middle run starts at c0 < output[2] <= input[2], inside
        // the row's pitch and 16-byte aligned (pitch and c0 multiples of 4).
        let xv: [[u32; RW]; WIN] = core::array::from_fn(|r| {
            let at = s.xs + 4 * row[r] * band.x_pitch;
            let middle = ld_shared_v4(at + 4 * c0);
            core::array::from_fn(|m| {
                if (PAD..PAD + BAND_RUN).contains(&m) {
                    middle[m - PAD]
                } else {
                    ld_shared_u32(at + 4 * col[m])
                }
            })
        });
        let slot = s.ys + 4 * (a * band.window_pitch + c0);
        let yv = ld_shared_v4(slot);
        let mut codes = [NO_WINNER; BAND_RUN];
        crate::unrolled!(k in BAND_RUN => {
            // The window's elements in reverse scan order, so that the match kept is the
            // first in scan order; canonical bits, so that equal bits are the same value.
            crate::unrolled!(rr in WIN => crate::unrolled!(qq in WIN => {
                let (r, q) = (WIN - 1 - rr, WIN - 1 - qq);
                if row_in[r] & col_in[k + q] & (xv[r][k + q] == yv[k]) {
                    codes[k] = (r * WIN + q) as u32;
                }
            }));
            // Windows past the row's end have no winner.
            if c0 + k as u32 >= out_width {
                codes[k] = NO_WINNER;
            }
        });
        // SAFETY: the slots this thread read; windows past the row's end stay inside the
        // pitch.
        st_shared_v4(slot, codes);
        i += step;
    }
    sync_threads();

    let mut i = tid;
    while i < (s.h1 - s.h0) * band.dx_runs.divisor {
        let (r, run) = band.dx_runs.div_rem(i);
        let h = s.h0 + r;
        let c0 = run * BAND_RUN as u32;
        // Window rows h + pad - (WIN - 1) ..= h + pad and columns c0 + PAD - (WIN - 1) ..,
        // clamped into the staged rows and the row of windows (every window over the run
        // is staged, and every staged window is in y; at stride 1 every row is under one).
        let first_row = (h + w.pad[1]) as i32 - (WIN as i32 - 1) - s.oh0 as i32;
        let (row, row_in) = clamped::<WIN>(first_row, s.window_rows.max(1));
        let first_col = c0 as i32 + PAD as i32 - (WIN as i32 - 1);
        let (col, col_in) = clamped::<RW>(first_col, out_width);
        let middle = WIN - 1 - PAD;
        let mut acc = [0.0f32; BAND_RUN];
        crate::unrolled!(a in WIN => {
            let at = 4 * row[a] * band.window_pitch;
            // SAFETY: staged rows; the middle run starts at c0 < input[2], inside the
            // pitch and aligned; written in the second phase, before the barrier.
            let (codes, grads) = (ld_shared_v4(s.ys + at + 4 * c0), ld_shared_v4(s.gs + at + 4 * c0));
            crate::unrolled!(m in RW => {
                let (code, g) = if (middle..middle + BAND_RUN).contains(&m) {
                    (codes[m - middle], f32::from_bits(grads[m - middle]))
                } else {
                    let edge = at + 4 * col[m];
                    (ld_shared_u32(s.ys + edge), f32::from_bits(ld_shared_u32(s.gs + edge)))
                };
                let code = if row_in[a] & col_in[m] { code } else { NO_WINNER };
                // Element k sits at row WIN - 1 - a and column k + WIN - 1 - m of window
                // (a, m).
                crate::unrolled!(k in BAND_RUN => {
                    let q = (k + WIN - 1).wrapping_sub(m);
                    if q < WIN {
                        let place = ((WIN - 1 - a) * WIN + q) as u32;
                        acc[k] += if code == place { g } else { 0.0 };
                    }
                });
            });
        });
        let dx_row = s.dx_plane + h * p.dx[3];
        let run_start = dx.add((dx_row + c0 * p.dx[4]) as usize);
        let whole = p.dx[4] == 1 && c0 + BAND_RUN as u32 <= width;
        if whole && (run_start as usize).is_multiple_of(BAND_RUN * size_of::<T>()) {
            store_blended::<T, BAND_RUN>(w, run_start, acc);
        } else {
            crate::unrolled!(k in BAND_RUN => {
                if c0 + (k as u32) < width {
                    let at = dx_row + (c0 + k as u32) * p.dx[4];
                    store_blended::<T, 1>(w, dx.add(at as usize), [acc[k]]);
                }
            });
        }
        i += step;
    }
}

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

macro_rules! pooling_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `x` and `y` cover the tensors `p` describes; y's offsets are distinct.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_window_ $dt>](
                p: PoolingFwdParams, x: *const $T, y: *mut $T,
            ) {
                with_op!(p.win.kind, p.win.propagate_nan, |OP| fwd_window::<$T, 1, OP>(&p, x, y))
            }
            /// # Safety
            /// As `pooling_fwd_window_*`; x and y are channel-contiguous, 16-byte aligned,
            /// every other stride a multiple of the vector, `items.c` counts vectors.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_window_vec_ $dt>](
                p: PoolingFwdParams, x: *const $T, y: *mut $T,
            ) {
                with_vector!($T, |K| with_op!(p.win.kind, p.win.propagate_nan, |OP| {
                    fwd_window::<$T, K, OP>(&p, x, y)
                }))
            }
            /// # Safety
            /// `x` and `y` cover the tensors `p` describes; 256-thread blocks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_global_ $dt>](
                p: PoolingGlobalParams, x: *const $T, y: *mut $T,
            ) {
                with_op!(p.kind, p.propagate_nan, |OP| fwd_global::<$T, OP>(&p, x, y))
            }
            /// # Safety
            /// As `pooling_fwd_global_*`; x channel-contiguous and 16-byte aligned, its
            /// other strides multiples of the vector; `rows * cols <= 256`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_global_vec_ $dt>](
                p: PoolingGlobalParams, x: *const $T, y: *mut $T,
            ) {
                with_vector!($T, |K| with_op!(p.kind, p.propagate_nan, |OP| {
                    fwd_global_vec::<$T, K, OP>(&p, x, y)
                }))
            }
            /// # Safety
            /// The pointers cover the tensors `p` describes; dx's offsets are distinct.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_gather_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_gather::<$T, 1, MAX_IGNORE_NAN>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_gather_max_*` (x and y are not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_gather_avg_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_gather::<$T, 1, AVG>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_gather_avg_*`, for a global window (the input's extents,
            /// no padding).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_global_avg_ $dt>](
                p: PoolingBwdParams, _x: *const $T, _y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_global_avg::<$T, 1>(&p, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_global_avg_*`, with dx's planes back to back and aligned as
            /// `bwd_global_avg_flat` states.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_global_avg_flat_ $dt>](
                p: PoolingBwdParams, _x: *const $T, _y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_global_avg_flat::<$T, { 16 / size_of::<$T>() }>(&p, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_gather_vec_avg_*`, for a global window.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_global_vec_avg_ $dt>](
                p: PoolingBwdParams, _x: *const $T, _y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                with_vector!($T, |K| bwd_global_avg::<$T, K>(&p, dy, dx))
            }
            /// # Safety
            /// As `pooling_bwd_gather_max_*`; every operand channel-contiguous as for
            /// `pooling_fwd_window_vec_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_gather_vec_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                with_vector!($T, |K| bwd_gather::<$T, K, MAX_IGNORE_NAN>(&p, x, y, dy, dx))
            }
            /// # Safety
            /// As `pooling_bwd_gather_vec_max_*` (x and y are not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_gather_vec_avg_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                with_vector!($T, |K| bwd_gather::<$T, K, AVG>(&p, x, y, dy, dx))
            }
            /// # Safety
            /// As `pooling_bwd_gather_max_*`; one block per tile (`p.tile`), 256 threads,
            /// `p.tile.shared_bytes(1)` bytes of dynamic shared memory.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_tile_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_tile_max::<$T, 1>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_gather_max_*`; one block per item (`p.band`), 256 threads,
            /// `p.band.shared_bytes()` bytes of dynamic shared memory.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_band_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_band_max::<$T>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_tile_max_*` with `p.tile.shared_bytes(16 / size)` bytes, and
            /// every operand channel-contiguous as for `pooling_fwd_window_vec_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_tile_vec_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                with_vector!($T, |K| bwd_tile_max::<$T, K>(&p, x, y, dy, dx))
            }
            /// # Safety
            /// As `pooling_bwd_gather_max_*`; `items` counts cells.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell::<$T, 1, MAX_IGNORE_NAN>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_cell_max_*` (x and y are not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_avg_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell::<$T, 1, AVG>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_cell_max_*`; every operand channel-contiguous in vectors of
            /// `CELL_VECTOR` elements (aligned to their size, every other stride a
            /// multiple of it); `items.c` counts those vectors.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_vec_max_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell::<$T, CELL_VECTOR, MAX_IGNORE_NAN>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_cell_vec_max_*` (x and y are not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_vec_avg_ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell::<$T, CELL_VECTOR, AVG>(&p, x, y, dy, dx)
            }
        }
    };
}

crate::for_each_dtype!(pooling_entry_points);

/// # Safety
/// As `pooling_fwd_global_*`, with x's planes back to back and short, as
/// `fwd_global_staged` states, and its shared memory. f32 only: the 16-bit types' staged
/// reductions (a shared-memory read and a conversion an element) lost to the group kernel
/// on the H100 (32x2048x7x7 f16: 11.9 against 10.3 µs).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pooling_fwd_global_staged_f32(
    p: PoolingGlobalParams,
    x: *const f32,
    y: *mut f32,
) {
    with_op!(p.kind, p.propagate_nan, |OP| fwd_global_staged::<f32, OP>(
        &p, x, y
    ))
}

/// Stamps `pooling_fwd_global_lane_*` for one dtype. The 16-bit types only: on f32 planes
/// (16 vectors a thread, each warp load spread over 32 lines) it ran no faster than the
/// staged kernel (H100, 32x2048x7x7: 10.6 against 10.3 µs).
macro_rules! global_lane_entry_point {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// As `pooling_fwd_global_*`, with x's planes back to back and short, as
            /// `fwd_global_lane` states.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_global_lane_ $dt>](
                p: PoolingGlobalParams,
                x: *const $T,
                y: *mut $T,
            ) {
                const K: usize = 16 / size_of::<$T>();
                with_op!(p.kind, p.propagate_nan, |OP| {
                    fwd_global_lane::<$T, OP, K, { LANE_ELEMENTS / K }>(&p, x, y)
                })
            }
        }
    };
}

global_lane_entry_point!(f16, crate::element::F16);
global_lane_entry_point!(bf16, crate::element::Bf16);

/// The compile-time window shapes of `pooling_bwd_cell_max_<W>x<W>s<S>p<P>_*`
/// ([`bwd_cell_region`]): window, stride and padding along w; then, for
/// `POOLING_REGION_CELLS = 2` cells a thread, the windows and the region's elements across
/// the cells' rows, the windows before the first cell, and the windows and the region's
/// elements along the cells' columns.
macro_rules! cell_region_entry_points {
    ($dt:ident, $T:ty) => {
        cell_region_entry_points!(@each $dt, $T,
            (2, 2, 0, 1, 2, 0, 2, 4) (2, 1, 0, 2, 3, 1, 3, 4) (3, 2, 0, 2, 5, 1, 3, 7)
            (3, 2, 1, 2, 5, 0, 3, 7) (3, 1, 1, 3, 5, 1, 4, 6));
    };
    (@each $dt:ident, $T:ty, $(($win:literal, $s:literal, $pad:literal, $p:literal,
        $r:literal, $k0:literal, $pw:literal, $rw:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_bwd_cell_max_*`, for 2-D windows of the size, stride and w
            /// padding in the name (`window = [1, W, W]`, `stride = [1, S, S]`, `pad[0] =
            /// 0`, `pad[2] = P`), `items` counting h in cells and w in runs of
            /// `POOLING_REGION_CELLS * S` columns.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_max_ $win x $win s $s p $pad _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                const C: usize = POOLING_REGION_CELLS;
                bwd_cell_region::<$T, $win, $s, $pad, C, $p, $r, $k0, $pw, $rw, { C * $s }>(
                    &p, x, y, dy, dx,
                )
            }
        )* }
    };
}

crate::for_each_dtype!(cell_region_entry_points);

/// The compile-time window shapes of `pooling_bwd_cell_vec_max_<W>x<W>s<S>_*`
/// ([`bwd_cell_region_vec`]): window and stride, the windows over a cell per dim, and the x
/// positions they cover per dim.
macro_rules! cell_region_vec_entry_points {
    ($dt:ident, $T:ty) => {
        cell_region_vec_entry_points!(@each $dt, $T, (2, 2, 1, 2) (3, 2, 2, 5));
    };
    (@each $dt:ident, $T:ty, $(($win:literal, $s:literal, $p:literal, $r:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_bwd_cell_vec_max_*`, for 2-D windows of the size and stride in
            /// the name (`window = [1, W, W]`, `stride = [1, S, S]`, `pad[0] = 0`) and x
            /// and y of the same depth.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_cell_vec_max_ $win x $win s $s _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell_region_vec::<$T, $win, $s, $p, $r>(&p, x, y, dy, dx)
            }
        )* }
    };
}

crate::for_each_dtype!(cell_region_vec_entry_points);

/// The compile-time window shapes of `pooling_bwd_band_max_<W>x<W>s1p<P>_*`
/// ([`bwd_band_max_s1`]): the (square) window and the padding along w.
macro_rules! band_entry_points {
    ($dt:ident, $T:ty) => {
        band_entry_points!(@each $dt, $T, (2, 0) (3, 0) (3, 1));
    };
    (@each $dt:ident, $T:ty, $(($win:literal, $pad:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_bwd_band_max_*`, for 2-D windows of the size and w padding in
            /// the name at stride 1 (`window = [1, W, W]`, `stride = [1, 1, 1]`, `pad[0] =
            /// 0`, `pad[2] = P`).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_band_max_ $win x $win s1p $pad _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_band_max_s1::<$T, $win, $pad, { BAND_RUN + $win - 1 }>(&p, x, y, dy, dx)
            }
        )* }
    };
}

crate::for_each_dtype!(band_entry_points);

/// The compile-time window shapes of `pooling_fwd_strip_<shape>_*` ([`fwd_strip`]): the name,
/// then the depth window, the (square) window along h and w, its stride, the padding
/// along w.
/// Entry points come in two vector widths: `pooling_fwd_strip_<shape>_*` loads 16 bytes a
/// row, `pooling_fwd_strip8_<shape>_*` 8 bytes.
macro_rules! strip_entry_points {
    ($dt:ident, $T:ty) => {
        strip_entry_points!(@width $dt, $T, [pooling_fwd_strip_] 16);
        strip_entry_points!(@width $dt, $T, [pooling_fwd_strip8_] 8);
    };
    (@width $dt:ident, $T:ty, [$prefix:ident] $bytes:literal) => {
        strip_entry_points!(@each $dt, $T, $prefix, $bytes,
            [2 x 2 s 2 p 0] (1, 2, 2, 0) [2 x 2 s 1 p 0] (1, 2, 1, 0)
            [3 x 3 s 2 p 0] (1, 3, 2, 0) [3 x 3 s 2 p 1] (1, 3, 2, 1)
            [3 x 3 s 1 p 1] (1, 3, 1, 1) [2 x 2 x 2 s 2 p 0] (2, 2, 2, 0));
    };
    (@each $dt:ident, $T:ty, $prefix:ident, $bytes:literal, $([$($name:tt)*] ($wd:literal,
        $win:literal, $s:literal, $pad:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_fwd_window_*`, for windows of the shape in the name (depth x h x
            /// w, the stride along h and w, the padding along w); `items` counting w in
            /// strips of `V / stride` outputs, `V` the elements of a vector (16 bytes for
            /// `pooling_fwd_strip_*`, 8 for `pooling_fwd_strip8_*`); x aligned to a vector
            /// with unit w stride, its other strides and w extent multiples of `V`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<$prefix $($name)* _ $dt>](
                p: PoolingFwdParams, x: *const $T, y: *mut $T,
            ) {
                const V: usize = $bytes / size_of::<$T>();
                with_op!(p.win.kind, p.win.propagate_nan, |OP| {
                    fwd_strip::<$T, OP, $wd, $win, $s, $pad, V, { V / $s }, { V + $win - $s }>(
                        &p, x, y,
                    )
                })
            }
        )* }
    };
}

crate::for_each_dtype!(strip_entry_points);

/// The window shapes `pooling_fwd_window_vec_<shape>_*` ([`fwd_window_vec_shaped`]) are
/// compiled for (depth x h x w): ResNet's 3x3, the 2x2 of VGG and U-Nets, the 2x2x2 of
/// 3-D networks.
macro_rules! window_vec_entry_points {
    ($dt:ident, $T:ty) => {
        window_vec_entry_points!(@each $dt, $T, [3 x 3] (1, 3, 3) [2 x 2] (1, 2, 2)
            [2 x 2 x 2] (2, 2, 2));
    };
    (@each $dt:ident, $T:ty, $([$($name:tt)*] ($wd:literal, $wh:literal, $ww:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_fwd_window_vec_*`, for windows of the shape in the name (depth x
            /// h x w; any strides and paddings, each padding below its window).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_fwd_window_vec_ $($name)* _ $dt>](
                p: PoolingFwdParams, x: *const $T, y: *mut $T,
            ) {
                with_vector!($T, |K| with_op!(p.win.kind, p.win.propagate_nan, |OP| {
                    fwd_window_vec_shaped::<$T, K, OP, $wd, $wh, $ww>(&p, x, y)
                }))
            }
        )* }
    };
}

crate::for_each_dtype!(window_vec_entry_points);

/// The backward kernels of non-overlapping, unpadded windows, for the average and the max
/// and the window shapes they are compiled for (depth x h x w, at a stride of the same
/// shape): the 2x2 of VGG, ResNet's shortcut and U-Nets (a depth window of 1), the 2x2x2 of
/// 3-D networks. `pooling_bwd_disjoint_strip_<op>_<shape>_*` ([`bwd_strip_disjoint`]) over
/// rows of 16-byte vectors (NCHW), `pooling_bwd_disjoint_vec_<op>_<shape>_*`
/// ([`bwd_cell_vec_disjoint`]) over channel vectors (NHWC).
macro_rules! disjoint_entry_points {
    ($dt:ident, $T:ty) => {
        disjoint_entry_points!(@op $dt, $T, avg, AVG);
        disjoint_entry_points!(@op $dt, $T, max, MAX_IGNORE_NAN);
    };
    (@op $dt:ident, $T:ty, $op:ident, $OP:ident) => {
        disjoint_entry_points!(@each $dt, $T, $op, $OP, [2 x 2 s 2] (1, 2) [2 x 2 x 2 s 2] (2, 2));
    };
    (@each $dt:ident, $T:ty, $op:ident, $OP:ident,
        $([$($name:tt)*] ($wd:literal, $s:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `pooling_bwd_cell_max_*` (the average reads neither x nor y), for
            /// unpadded windows of the shape in the name at a stride of that shape;
            /// `items` counting w in strips of `16 / size / S` cells, d and h in cells;
            /// dx (and x, for the max) 16-byte aligned with unit w stride, its other
            /// strides and w extent multiples of `16 / size`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_disjoint_strip_ $op _ $($name)* _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                const V: usize = 16 / size_of::<$T>();
                bwd_strip_disjoint::<$T, $OP, $wd, $s, V, { V / $s }>(&p, x, y, dy, dx)
            }
            /// # Safety
            /// As `pooling_bwd_cell_vec_max_*` (the average reads neither x nor y), for the
            /// windows above, with `items` counting cells and vectors of `16 / size`
            /// channels, every operand channel-contiguous in such vectors, aligned to 16
            /// bytes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_disjoint_vec_ $op _ $($name)* _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_cell_vec_disjoint::<$T, $OP, $wd, $s, { 16 / size_of::<$T>() }>(
                    &p, x, y, dy, dx,
                )
            }
        )* }
    };
}

crate::for_each_dtype!(disjoint_entry_points);

/// The shapes of `pooling_bwd_walk_max_<W>x<W>s<S>p<P>_*` ([`bwd_walk_max`]): (window,
/// stride, padding along w). At stride 1 (3x3/s1/p1: four windows a lane, two shared rows)
/// the walk measured no faster than the band kernels (f32 32x192x28x28: 56.4 against 53.1
/// µs on an H100), so it is not compiled.
macro_rules! walk_entry_points {
    ($dt:ident, $T:ty) => {
        walk_entry_points!(@each $dt, $T, (3, 2, 1) (3, 2, 0));
    };
    (@each $dt:ident, $T:ty, $(($win:literal, $s:literal, $pad:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `bwd_walk_max`, for the window, stride and padding along w in the name.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_walk_max_ $win x $win s $s p $pad _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                const V: usize = pooling_walk_columns(size_of::<$T>());
                bwd_walk_max::<$T, V, $win, $s, $pad, { V + $win - $s }, { V / $s }>(&p, x, y, dy, dx)
            }
        )* }
    };
}

crate::for_each_dtype!(walk_entry_points);

/// The shapes of `pooling_bwd_walk_vec_max_<W>x<W>s<S>_*` ([`bwd_walk_vec_max`]): (window,
/// stride, windows over a cell column `P`, region columns `R`).
macro_rules! walk_vec_entry_points {
    ($dt:ident, $T:ty) => {
        walk_vec_entry_points!(@each $dt, $T, (3, 2, 2, 5) (3, 1, 3, 5));
    };
    (@each $dt:ident, $T:ty, $(($win:literal, $s:literal, $p:literal, $r:literal))*) => {
        paste::paste! { $(
            /// # Safety
            /// As `bwd_walk_vec_max`, for the window and stride in the name.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<pooling_bwd_walk_vec_max_ $win x $win s $s _ $dt>](
                p: PoolingBwdParams, x: *const $T, y: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                const K: usize = pooling_walk_vec_channels(size_of::<$T>());
                bwd_walk_vec_max::<$T, K, $win, $s, $p, $r>(&p, x, y, dy, dx)
            }
        )* }
    };
}

crate::for_each_dtype!(walk_vec_entry_points);
