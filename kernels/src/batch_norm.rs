//! Batch normalization (cudnnBatchNormalizationForwardTraining / ForwardInference /
//! Backward and their `Ex` forms with a fused residual add and relu).
//!
//! Training runs three launches (see `oxidnn_params::batch_norm`):
//!
//! * `batch_norm_{fwd,bwd}_stats_{rows,cols}_<dtype>`: each block reduces a chunk of the
//!   reduction for its features and leaves one `BatchNormPartial` per (chunk, feature).
//!   Forward statistics are Welford/Chan moments (count, mean, sum of squared deviations):
//!   a thread takes a batch of loaded values, computes the batch's mean and squared
//!   deviations exactly (two passes over registers), and merges them into its running
//!   moments with Chan's formula; threads, warps and chunks merge the same way. No
//!   `sum(x^2) - n mean^2` cancellation anywhere; f32 for every storage type.
//! * `batch_norm_{fwd,bwd}_finalize`: one warp per feature merges its chunks in a fixed
//!   order, in f64, and writes the per-feature outputs and coefficients. No atomics: the
//!   results are bitwise reproducible for a given shape and device.
//! * `batch_norm_{fwd,bwd}_apply_{rows,cols}_<dtype>`: the elementwise pass. It visits the
//!   blocks in reverse order, so it starts on the data the stats pass read last (which may
//!   still be in L2).
//!
//! * `batch_norm_{fwd,bwd}_fused_rows_<dtype>`: the whole training pass in one launch when
//!   the stats pass would give each feature one chunk (rows mapping, many features of
//!   short reductions, e.g. NCHW 512x28x28 to 2048x7x7 at N = 32): a block per feature
//!   reduces it, finalizes it from the block total (same f64 formulas as the finalize
//!   kernels) and applies it, visiting its elements last to first (those it read last
//!   are likeliest still in L1/L2). No partials, no finalize or apply launch.
//!
//! * `batch_norm_fwd_staged_rows_<dtype>`: the fused forward with the block's feature
//!   copied into shared memory first (`cp.async`, all of it in flight at once), then
//!   reduced and applied from there, so `x` is read from memory once (features of up to
//!   half an SM's shared memory, vectors of 4 bytes or more). The `staged_masked` kernels
//!   also write the relu mask; `batch_norm_fwd_staged_masked_unrolled_rows_f32` keeps
//!   several loads of the residual `z` in flight, for more registers.
//!
//! * `batch_norm_{fwd,bwd}_pipelined_rows_<dtype>` (and `fwd_pipelined_plain_rows`): the
//!   whole training pass of a rows problem larger than L2 in one cooperative launch (see
//!   `oxidnn_params::BatchNormPipelinedParams`): tasks of a chunk each, every feature's
//!   stats, then its finalize by the block that completes them, then a few features later
//!   its apply, which finds most of the feature's inputs still in L2, so they are read
//!   from memory about once. Blocks wait only on tasks before theirs, counted in the
//!   handle's counter state.
//!
//! * `batch_norm_{fwd,bwd}_resident_cols_<dtype>`: the whole training pass of a cols
//!   problem with 16-byte vectors in one cooperative launch (see
//!   `oxidnn_params::BatchNormResidentParams`): the stats kernel's blocks, each keeping its
//!   chunk's first rows in shared memory, then the finalize, then the apply from shared
//!   memory (and from memory for the rows that did not fit). The finalize: where each
//!   tile has few chunks, a barrier of the tile's blocks and every block finalizing its
//!   tile itself; otherwise grid barriers around a finalize shared out over the grid's
//!   blocks, a feature a block.
//!
//! The apply loops are specialized for the common epilogues (plain, and add + relu, with
//! `alpha = 1`, `beta = 0`): no per-element flag tests or blend arithmetic there.
//! `batch_norm_fwd_apply_plain_cols_<dtype>` holds the plain loop alone, for the host to
//! launch where the epilogue is plain: fewer registers, so more blocks per SM. The cols
//! apply kernels deal their rows to the blocks in turn (a block-wide step each), so the
//! grid walks the tensor together.
//!
//! Inference is one apply launch whose coefficients come from the estimated statistics
//! (a cols block computes its tile's once, into shared memory).
//!
//! *Relu mask*: given a `relu_mask` (the training reserve space), forward training also
//! stores whether each stored `y` is positive, one bit per element at `x`'s element
//! offset, and the backward reads those bits instead of `y` (a sixteenth of an f16 `y`'s
//! bytes). Every kernel given one requires it to hold a bit for each offset of `x`'s span
//! and to be 4-byte aligned.
//!
//! *Rows* kernels (the reduction is contiguous, e.g. NCHW spatial) give each block one
//! feature and a chunk of its reduction; *cols* kernels (features contiguous, e.g. NHWC, or
//! per-activation mode) give each thread a vector of features and a strided set of rows.
//! Both take any strides through the geometry's index maps; `K > 1` (16-byte vectors) is
//! chosen by the host only where the innermost dim is contiguous and aligned.

use crate::activation::{blend, forward as activation};
use crate::device::{
    self, atomic_add_u32, block_dim_x, block_idx_x, block_reduce, cp_async_16, cp_async_ca,
    cp_async_commit, cp_async_wait, dynamic_smem, global_thread_x, grid_barrier, grid_dim_x,
    group_barrier, lane_id, ld_acquire_u32, ld_shared_u32, ld_shared_v2, ld_shared_v4,
    ld_shared_words, shfl_xor_f32, shfl_xor_f64, sqrt, sqrt_f64, st_shared_u32, st_shared_v4,
    st_shared_words, sync_threads_divergent, thread_fence, thread_idx_x, warp_id, SharedF32, Vec16,
};
use crate::element::Element;
use oxidnn_params::bn_operand::{DX, DZ, PARAM, X, Y, Z_OR_DY};
use oxidnn_params::{
    bn_flags, ActivationKind, BatchNormApplyParams, BatchNormCoef, BatchNormFinalizeParams,
    BatchNormFusedParams, BatchNormGeometry, BatchNormPartial, BatchNormPipelinedParams,
    BatchNormResidentParams, BatchNormStatsParams, BN_BLOCK_THREADS, BN_BLOCK_WARPS,
    BN_COLS_SHARED_BYTES,
};

/// Loads in flight per thread: vectors of one operand (forward), or of each of the two or
/// three operands (backward) before any is used.
const FWD_UNROLL: usize = 4;
const BWD_UNROLL: usize = 2;
/// Loads of `y` in flight per thread as the resident backward masks its stashed rows.
const KEPT_MASK_UNROLL: usize = 4;

// ---------------------------------------------------------------------------------------
// Accumulators
// ---------------------------------------------------------------------------------------

/// A thread's statistics of `K` features over the same `n` elements: forward, `a` = mean
/// and `b` = sum of squared deviations; backward, `a = sum(g)`, `b = sum(g (x - mean))`.
#[derive(Clone, Copy)]
struct Acc<const K: usize> {
    n: f32,
    a: [f32; K],
    b: [f32; K],
}

impl<const K: usize> Acc<K> {
    const EMPTY: Self = Acc {
        n: 0.0,
        a: [0.0; K],
        b: [0.0; K],
    };

    #[inline(always)]
    fn shfl(self, mask: u32) -> Self {
        Acc {
            n: shfl_xor_f32(self.n, mask),
            a: core::array::from_fn(|e| shfl_xor_f32(self.a[e], mask)),
            b: core::array::from_fn(|e| shfl_xor_f32(self.b[e], mask)),
        }
    }

    /// Merges a batch of `count` values per feature with means `mean` and squared
    /// deviations `m2` into these moments (Chan et al.; one division for all features).
    #[inline(always)]
    fn absorb(&mut self, count: f32, mean: [f32; K], m2: [f32; K]) {
        let n = self.n + count;
        let w = count / n;
        let cross = self.n * w;
        for e in 0..K {
            let d = mean[e] - self.a[e];
            self.a[e] += d * w;
            self.b[e] += m2[e] + d * d * cross;
        }
        self.n = n;
    }

    /// Adds the gradient sums of one vector: `g` and `g (x - mean)` per feature.
    #[inline(always)]
    fn add_grads(&mut self, count: f32, g: [f32; K], gx: [f32; K]) {
        for e in 0..K {
            self.a[e] += g[e];
            self.b[e] += gx[e];
        }
        self.n += count;
    }
}

/// Chan et al.'s combination of two sets of moments.
#[inline(always)]
fn merge_moments<const K: usize>(x: Acc<K>, y: Acc<K>) -> Acc<K> {
    if y.n == 0.0 {
        return x;
    }
    if x.n == 0.0 {
        return y;
    }
    let mut out = x;
    out.absorb(y.n, y.a, y.b);
    out
}

/// Sums combine by adding.
#[inline(always)]
fn merge_sums<const K: usize>(x: Acc<K>, y: Acc<K>) -> Acc<K> {
    let mut out = x;
    out.add_grads(y.n, y.a, y.b);
    out
}

/// Mean and squared deviations of all `R * KV` values (one feature's batch in a rows
/// kernel): two passes over registers.
#[inline(always)]
fn batch_moments<const KV: usize, const R: usize>(v: &[[f32; KV]; R]) -> (f32, f32) {
    let mut sum = 0.0f32;
    for r in 0..R {
        for e in 0..KV {
            sum += v[r][e];
        }
    }
    let mean = sum / (R * KV) as f32;
    let mut m2 = 0.0f32;
    for r in 0..R {
        for e in 0..KV {
            let d = v[r][e] - mean;
            m2 += d * d;
        }
    }
    (mean, m2)
}

/// Per feature `e`, mean and squared deviations of `v[0][e] .. v[R-1][e]` (a batch of
/// rows in a cols kernel).
#[inline(always)]
fn column_moments<const KV: usize, const R: usize>(v: &[[f32; KV]; R]) -> ([f32; KV], [f32; KV]) {
    let mean: [f32; KV] = core::array::from_fn(|e| {
        let mut s = 0.0f32;
        for r in 0..R {
            s += v[r][e];
        }
        s / R as f32
    });
    let m2 = core::array::from_fn(|e| {
        let mut s = 0.0f32;
        for r in 0..R {
            let d = v[r][e] - mean[e];
            s += d * d;
        }
        s
    });
    (mean, m2)
}

// ---------------------------------------------------------------------------------------
// Memory access
// ---------------------------------------------------------------------------------------

/// The raw words of the `KV` consecutive elements at `p + off`: one vector load when
/// `KV > 1` (16-bit data stays packed until [`unpack`]); for `KV == 1` the value's f32
/// bits in word 0.
///
/// # Safety
/// The elements are readable; for `KV > 1` they are `KV * size` bytes, aligned to that;
/// `read_only` only if no thread of this launch writes them.
#[inline(always)]
unsafe fn load_raw<T: Element, const KV: usize>(p: *const T, off: u64, read_only: bool) -> Vec16 {
    let p = p.add(off as usize);
    if KV == 1 {
        [T::load(p).to_bits(), 0, 0, 0]
    } else {
        T::load_raw::<KV>(p, read_only)
    }
}

#[inline(always)]
fn unpack<T: Element, const KV: usize>(w: Vec16) -> [f32; KV] {
    if KV == 1 {
        [f32::from_bits(w[0]); KV]
    } else {
        T::unpack::<KV>(w)
    }
}

/// [`load_raw`] and [`unpack`] at once.
///
/// # Safety
/// As [`load_raw`].
#[inline(always)]
unsafe fn load<T: Element, const KV: usize>(p: *const T, off: u64, read_only: bool) -> [f32; KV] {
    unpack::<T, KV>(load_raw::<T, KV>(p, off, read_only))
}

/// Stores `KV` consecutive elements at `p + off`.
///
/// # Safety
/// As [`load_raw`], for writing.
#[inline(always)]
unsafe fn store<T: Element, const KV: usize>(p: *mut T, off: u64, v: [f32; KV]) {
    let p = p.add(off as usize);
    if KV == 1 {
        T::store(p, v[0]);
    } else {
        T::store_vec::<KV>(p, v);
    }
}

/// [`load_raw`] of read-only data read for the last time: a streaming (evict-first) load
/// for vectors, so the apply pass does not push out of L2 the data the stats pass left
/// there that it has yet to re-read.
///
/// # Safety
/// As [`load_raw`], read-only.
#[inline(always)]
unsafe fn load_last<T: Element, const KV: usize>(p: *const T, off: u64) -> Vec16 {
    if KV == 1 {
        load_raw::<T, KV>(p, off, true)
    } else {
        device::ld_global_nc_cs_v4(p.add(off as usize) as *const u32)
    }
}

/// [`store`] of a final result: a streaming (evict-first) store for vectors.
///
/// # Safety
/// As [`store`].
#[inline(always)]
unsafe fn store_last<T: Element, const KV: usize>(p: *mut T, off: u64, v: [f32; KV]) {
    if KV == 1 {
        store::<T, KV>(p, off, v)
    } else {
        device::st_global_cs_v4(p.add(off as usize) as *mut u32, T::pack::<KV>(v))
    }
}

/// Visits `first, first + step, .. < end`: whole groups of `UN` as `group(state, i, loads)`
/// with every load of the group issued before any is used (loads in flight cover memory
/// latency), the remaining ones as `single(state, i, load)`.
#[inline(always)]
fn visit<const UN: usize, L: Copy + Default, S>(
    (first, end, step): (u32, u32, u32),
    state: &mut S,
    load: impl Fn(u32) -> L,
    group: impl Fn(&mut S, u32, &[L; UN]),
    single: impl Fn(&mut S, u32, L),
) {
    let mut i = first;
    while i + (UN as u32 - 1) * step < end {
        let mut v = [L::default(); UN];
        crate::unrolled!(u in UN => v[u] = load(i + u as u32 * step));
        group(state, i, &v);
        i += UN as u32 * step;
    }
    while i < end {
        single(state, i, load(i));
        i += step;
    }
}

fn relu(v: f32) -> f32 {
    activation(ActivationKind::Relu, 0.0, v, false)
}

/// Where the backward finds the relu's mask: no relu, `y > 0`, or the relu mask's bits
/// (what the forward wrote to the reserve space: the same test on the stored `y`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Relu {
    Off,
    FromY,
    FromBits,
}

impl Relu {
    /// From the flags ([`bn_flags::RELU`]) and the relu mask (null: read `y`).
    #[inline(always)]
    fn of(flags: u32, mask: *const u32) -> Self {
        match (flags & bn_flags::RELU != 0, mask.is_null()) {
            (false, _) => Relu::Off,
            (true, true) => Relu::FromY,
            (true, false) => Relu::FromBits,
        }
    }

    /// The gradient reaching the normalization from `dy` of a vector's element `e`:
    /// masked by `y > 0` (`relu` holds the vector's raw `y`, or its mask bits in word 0).
    #[inline(always)]
    fn masked<T: Element, const KV: usize>(self, dy: [f32; KV], relu: Vec16) -> [f32; KV] {
        match self {
            Relu::Off => dy,
            Relu::FromY => {
                let y = unpack::<T, KV>(relu);
                core::array::from_fn(|e| if y[e] > 0.0 { dy[e] } else { 0.0 })
            }
            Relu::FromBits => {
                core::array::from_fn(|e| if (relu[0] >> e) & 1 != 0 { dy[e] } else { 0.0 })
            }
        }
    }
}

/// The relu mask's bits of the `KV` elements at offset `o` of `x`'s layout (bit `e` for
/// element `o + e`).
///
/// # Safety
/// `mask` holds bit `o + KV - 1`.
#[inline(always)]
unsafe fn load_relu_bits<const KV: usize>(mask: *const u32, o: u64) -> u32 {
    let byte = *(mask as *const u8).add((o / 8) as usize) as u32;
    (byte >> (o % 8)) & ((1 << KV) - 1)
}

/// Stores the relu mask's bits of the `KV` elements at offset `o`: bit `e` says whether
/// `out[e]`, as stored in `T`, is positive. A vector of 8 is one byte (`o` is a multiple
/// of 8 there); fewer elements update their bits of a shared word, merged with the other
/// lanes of the warp that update the same word ([`device::warp_assign_bits`]).
///
/// # Safety
/// `mask` holds bit `o + KV - 1` and is 4-byte aligned.
#[inline(always)]
unsafe fn store_relu_bits<T: Element, const KV: usize>(mask: *mut u32, o: u64, out: &[f32; KV]) {
    let mut bits = 0u32;
    crate::unrolled!(e in KV => {
        if T::from_f32(out[e]).to_f32() > 0.0 {
            bits |= 1 << e;
        }
    });
    if KV == 8 {
        *(mask as *mut u8).add((o / 8) as usize) = bits as u8;
    } else {
        let shift = (o % 32) as u32;
        let word = mask.add((o / 32) as usize);
        device::warp_assign_bits(word, ((1 << KV) - 1) << shift, bits << shift);
    }
}

// ---------------------------------------------------------------------------------------
// Thread mappings
// ---------------------------------------------------------------------------------------

/// A thread's work. Rows kernels: feature `f0`, vectors `first, first + step, .. < end`
/// (reduction index `vector * KV`). Cols kernels: features `f0 .. f0 + KV` (if `active`),
/// rows `first, first + step, .. < end`; `chunk` is the partial's chunk.
struct Work {
    active: bool,
    f0: u32,
    chunk: u32,
    first: u32,
    end: u32,
    step: u32,
}

impl Work {
    fn range(&self) -> (u32, u32, u32) {
        (self.first, self.end, self.step)
    }
}

/// `first + last` of a thread's range of work (`first, end, step`): [`visited`] then maps the work's indices onto
/// themselves, last first. 0 (no reversal) when the work is empty or the one index 0.
fn mirror_of((first, end, step): (u32, u32, u32)) -> u32 {
    if end > first {
        let last = first + (end - 1 - first) / step * step;
        first + last
    } else {
        0
    }
}

/// Where a rows walk's vector `i` starts in the reduction: element `i * KV`.
#[inline(always)]
fn vector_start<const KV: usize>(i: u32) -> u32 {
    i * KV as u32
}

/// Where a cols walk's index `r` lies in the reduction: row `r`.
#[inline(always)]
fn same_row(r: u32) -> u32 {
    r
}

/// The index visited at position `i` of a work's range: `i`, or `mirror - i`.
#[inline(always)]
fn visited(mirror: u32, i: u32) -> u32 {
    if mirror != 0 {
        mirror - i
    } else {
        i
    }
}

#[inline(always)]
fn rows_work(g: &BatchNormGeometry, block: u32) -> Work {
    let f = block / g.chunks;
    let chunk = block - f * g.chunks;
    let start = chunk * g.chunk_len;
    Work {
        active: true,
        f0: f,
        chunk,
        first: start + thread_idx_x(),
        end: core::cmp::min(start + g.chunk_len, g.vectors),
        step: block_dim_x(),
    }
}

#[inline(always)]
fn cols_work<const KV: usize>(g: &BatchNormGeometry, block: u32) -> Work {
    let tile = block % g.tiles;
    let chunk = block / g.tiles;
    let t = thread_idx_x();
    let fv = tile * g.tile_vectors + (t & (g.tile_vectors - 1));
    let start = chunk * g.chunk_len;
    Work {
        active: fv < g.vectors,
        f0: fv * KV as u32,
        chunk,
        first: start + (t >> g.tile_vectors_log2),
        end: core::cmp::min(start + g.chunk_len, g.red_len),
        step: block_dim_x() >> g.tile_vectors_log2,
    }
}

/// An apply kernel's share of a cols problem: [`cols_work`]'s, or with
/// [`bn_flags::INTERLEAVE_ROWS`] its tile and features but the chunk's rows interleaved
/// with the other chunks': block-wide steps of rows (`blockDim / tile_vectors` rows each)
/// are dealt to the chunks in turn, so the grid's blocks walk the tensor together, a
/// contiguous span at a time, where contiguous chunks have every resident block stream a
/// region of its own. (The apply passes need no per-chunk result, so any partition of
/// the rows serves them.)
#[inline(always)]
fn cols_apply_work<const KV: usize>(p: &BatchNormApplyParams, block: u32) -> Work {
    let g = &p.geo;
    let w = cols_work::<KV>(g, block);
    if p.flags & bn_flags::INTERLEAVE_ROWS == 0 {
        return w;
    }
    let rows_per_step = block_dim_x() >> g.tile_vectors_log2;
    Work {
        first: w.chunk * rows_per_step + (thread_idx_x() >> g.tile_vectors_log2),
        end: g.red_len,
        step: g.chunks * rows_per_step,
        ..w
    }
}

/// Where a resident block's walk lands in the tensor. The walk is [`cols_work`]'s (its
/// chunk's rows `start, ..`, by which the stash indexes the kept ones); `row(r)` is the
/// tensor's row of walk index `r`: `r` itself, or, interleaved, the chunk's `k`-th
/// block-wide step is the tensor's step `k * chunks + chunk`, as [`cols_apply_work`] deals
/// them, so the grid's blocks stream the tensor together, a contiguous span at a time.
/// Each chunk's rows are its own either way: its partials still sum a partition of the
/// rows.
#[derive(Clone, Copy)]
struct RowOrder {
    interleaved: bool,
    start: u32,
    chunk: u32,
    chunks: u32,
    /// `log2` of the rows a block steps by (`blockDim / tile_vectors`).
    step_log2: u32,
}

impl RowOrder {
    /// The tensor's row of walk index `r`.
    #[inline(always)]
    fn row(&self, r: u32) -> u32 {
        if !self.interleaved {
            return r;
        }
        let local = r - self.start;
        let step = (local >> self.step_log2) * self.chunks + self.chunk;
        (step << self.step_log2) | (local & ((1 << self.step_log2) - 1))
    }
}

/// A resident block's share of a cols problem: [`cols_work`]'s, and its [`RowOrder`],
/// interleaved with [`bn_flags::INTERLEAVE_ROWS`] where some rows are streamed (then the
/// host makes chunks and kept rows whole steps; a chunk held whole on chip is read once
/// and gains nothing). Interleaved, chunk `c` has the tensor's steps `c, c + chunks, ..`,
/// at most `chunk_len / step` of them (`chunk_len` is `red_len / chunks` rounded up to
/// whole steps), the last one possibly short: its walk ends there.
#[inline(always)]
fn resident_work<const KV: usize>(p: &BatchNormResidentParams, block: u32) -> (Work, RowOrder) {
    let g = &p.fused.apply.geo;
    let mut w = cols_work::<KV>(g, block);
    let step_log2 = (block_dim_x() >> g.tile_vectors_log2).trailing_zeros();
    let order = RowOrder {
        interleaved: p.fused.apply.flags & bn_flags::INTERLEAVE_ROWS != 0
            && p.resident_rows < g.chunk_len,
        start: w.chunk * g.chunk_len,
        chunk: w.chunk,
        chunks: g.chunks,
        step_log2,
    };
    if order.interleaved {
        let steps = g.red_len.div_ceil(1 << step_log2);
        let mine = if w.chunk < steps {
            (steps - w.chunk).div_ceil(g.chunks)
        } else {
            0
        };
        let rows = match mine {
            0 => 0,
            _ => {
                let last = (w.chunk + (mine - 1) * g.chunks) << step_log2;
                ((mine - 1) << step_log2) + core::cmp::min(1 << step_log2, g.red_len - last)
            }
        };
        w.end = order.start + rows;
    }
    (w, order)
}

/// Merges the accumulators of a cols block's threads that share a feature vector; thread
/// `t < tile_vectors` returns the result for its own feature vector (the others return
/// partial values). Fixed order: lanes by a butterfly, then warps in index order. Every
/// thread must call it; the block's dynamic shared memory holds `BN_COLS_SHARED_BYTES`.
#[inline(always)]
fn cols_reduce<const KV: usize>(
    g: &BatchNormGeometry,
    mut acc: Acc<KV>,
    merge: impl Fn(Acc<KV>, Acc<KV>) -> Acc<KV>,
) -> Acc<KV> {
    // Lanes of a warp with the same feature vector: lane % tile_vectors.
    let mut mask = g.tile_vectors;
    while mask < 32 {
        acc = merge(acc, acc.shfl(mask));
        mask <<= 1;
    }
    let slots = BN_BLOCK_WARPS * 32;
    let base = dynamic_smem();
    let counts = SharedF32 { base, len: slots };
    let a = SharedF32 {
        base: base + 4 * slots,
        len: slots * KV as u32,
    };
    let b = SharedF32 {
        base: base + 4 * slots * (1 + KV as u32),
        len: slots * KV as u32,
    };
    let (lane, warp) = (lane_id(), warp_id());
    // SAFETY: warp < BN_BLOCK_WARPS (blocks have at most BN_BLOCK_THREADS), so every slot is
    // below its view's `len`, all inside BN_COLS_SHARED_BYTES; the barrier orders the
    // stores before the loads.
    unsafe {
        if lane < g.tile_vectors {
            let slot = warp * 32 + lane;
            counts.store(slot, acc.n);
            for e in 0..KV {
                a.store(slot * KV as u32 + e as u32, acc.a[e]);
                b.store(slot * KV as u32 + e as u32, acc.b[e]);
            }
        }
        // Divergence-safe: threads of a partial last tile skip the loads before this, and
        // LLVM may give them their own copy of the code that follows (an `.aligned`
        // barrier reached by a warp split over two copies hangs).
        sync_threads_divergent();
        let t = thread_idx_x();
        if t < g.tile_vectors {
            let load = #[inline(always)]
            |w: u32| {
                let slot = w * 32 + t;
                let mut v = Acc::<KV>::EMPTY;
                v.n = counts.load(slot);
                for e in 0..KV {
                    v.a[e] = a.load(slot * KV as u32 + e as u32);
                    v.b[e] = b.load(slot * KV as u32 + e as u32);
                }
                v
            };
            acc = load(0);
            for w in 1..block_dim_x() / 32 {
                acc = merge(acc, load(w));
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn write_partial(partials: *mut BatchNormPartial, at: u32, n: f32, a: f32, b: f32) {
    *partials.add(at as usize) = BatchNormPartial {
        count: n,
        a,
        b,
        _pad: 0.0,
    };
}

/// Writes a cols block's partials (thread `t < tile_vectors`, for its own features).
#[inline(always)]
unsafe fn write_cols_partials<const KV: usize>(
    g: &BatchNormGeometry,
    w: &Work,
    total: Acc<KV>,
    partials: *mut BatchNormPartial,
) {
    if thread_idx_x() < g.tile_vectors && w.active {
        for e in 0..KV {
            let at = w.chunk * g.features + w.f0 + e as u32;
            write_partial(partials, at, total.n, total.a[e], total.b[e]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Forward statistics
// ---------------------------------------------------------------------------------------

/// The moments of a rows block's work (every thread gets the block's total).
///
/// # Safety
/// `x` covers the tensor `g` describes; every thread of the block calls it.
#[inline(always)]
unsafe fn fwd_moments_rows<T: Element, const KV: usize>(
    g: &BatchNormGeometry,
    x: *const T,
    w: &Work,
) -> Acc<1> {
    let base = g.feat.offsets(w.f0)[X];
    fwd_moments_of::<T, KV>(w, |j| {
        load_raw::<T, KV>(x, base + g.red.offsets(j * KV as u32)[X], true)
    })
}

/// The moments of a rows block's work, vector `j` being `load(j)` (every thread gets the
/// block's total; every thread of the block calls it).
#[inline(always)]
fn fwd_moments_of<T: Element, const KV: usize>(w: &Work, load: impl Fn(u32) -> Vec16) -> Acc<1> {
    let mut acc = Acc::<1>::EMPTY;
    visit::<FWD_UNROLL, Vec16, _>(
        w.range(),
        &mut acc,
        load,
        #[inline(always)]
        |acc, _, v| {
            let (mean, m2) = batch_moments(&v.map(unpack::<T, KV>));
            acc.absorb((FWD_UNROLL * KV) as f32, [mean], [m2]);
        },
        #[inline(always)]
        |acc, _, v| {
            let (mean, m2) = batch_moments(&[unpack::<T, KV>(v)]);
            acc.absorb(KV as f32, [mean], [m2]);
        },
    );
    let scratch = crate::shared_array!(Acc<1>, 384);
    block_reduce(acc, scratch, Acc::EMPTY, merge_moments, Acc::shfl)
}

#[inline(always)]
unsafe fn fwd_stats_rows<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    x: *const T,
    partials: *mut BatchNormPartial,
) {
    let g = &p.geo;
    let w = rows_work(g, block_idx_x());
    let total = fwd_moments_rows::<T, KV>(g, x, &w);
    if thread_idx_x() == 0 {
        let at = w.chunk * g.features + w.f0;
        write_partial(partials, at, total.n, total.a[0], total.b[0]);
    }
}

#[inline(always)]
unsafe fn fwd_stats_cols<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    x: *const T,
    partials: *mut BatchNormPartial,
) {
    let g = &p.geo;
    let w = cols_work::<KV>(g, block_idx_x());
    let mut acc = Acc::<KV>::EMPTY;
    if w.active {
        let base = g.feat.offsets(w.f0)[X];
        absorb_cols::<T, KV, FWD_UNROLL>(w.range(), &mut acc, |r| {
            load_raw::<T, KV>(x, base + g.red.offsets(r)[X], true)
        });
    }
    let total = cols_reduce(g, acc, merge_moments);
    write_cols_partials(g, &w, total, partials);
}

/// The moments of the vectors `load(r)` of a cols thread's rows `r` in `range` (`first,
/// end, step`), read twice from shared memory: the mean, then the deviations from it
/// (corrected two-pass: the deviations' sum corrects the rounding of the first mean).
/// Per element, adds and one fused multiply-add, where a running merge divides.
#[inline(always)]
fn kept_moments<T: Element, const KV: usize>(
    (first, end, step): (u32, u32, u32),
    load: impl Fn(u32) -> Vec16,
) -> Acc<KV> {
    let mut sum = [0.0f32; KV];
    let mut n = 0u32;
    let mut r = first;
    while r < end {
        let v = unpack::<T, KV>(load(r));
        crate::unrolled!(e in KV => sum[e] += v[e]);
        n += 1;
        r += step;
    }
    if n == 0 {
        return Acc::EMPTY;
    }
    let inv = 1.0 / n as f32;
    let mean = sum.map(|s| s * inv);
    let (mut dev, mut sq) = ([0.0f32; KV], [0.0f32; KV]);
    r = first;
    while r < end {
        let v = unpack::<T, KV>(load(r));
        crate::unrolled!(e in KV => {
            let d = v[e] - mean[e];
            dev[e] += d;
            sq[e] += d * d;
        });
        r += step;
    }
    Acc {
        n: n as f32,
        a: core::array::from_fn(|e| mean[e] + dev[e] * inv),
        b: core::array::from_fn(|e| sq[e] - dev[e] * dev[e] * inv),
    }
}

/// Absorbs into `acc` the moments of the vectors `load(r)` of a cols thread's rows `r` in
/// `range` (`first, end, step`), `UN` loads at a time (1 for shared memory: less code).
#[inline(always)]
fn absorb_cols<T: Element, const KV: usize, const UN: usize>(
    range: (u32, u32, u32),
    acc: &mut Acc<KV>,
    load: impl Fn(u32) -> Vec16,
) {
    visit::<UN, Vec16, _>(
        range,
        acc,
        load,
        #[inline(always)]
        |acc, _, v| {
            let (mean, m2) = column_moments(&v.map(unpack::<T, KV>));
            acc.absorb(UN as f32, mean, m2);
        },
        #[inline(always)]
        |acc, _, v| acc.absorb(1.0, unpack::<T, KV>(v), [0.0; KV]),
    );
}

// ---------------------------------------------------------------------------------------
// Backward statistics
// ---------------------------------------------------------------------------------------

/// The mean of feature `f` the backward pass uses: recomputed (workspace coefficients) or
/// saved by the forward pass.
#[inline(always)]
unsafe fn saved_mean(
    p: &BatchNormStatsParams,
    f: u32,
    coef: *const BatchNormCoef,
    saved: *const f32,
) -> f32 {
    if p.flags & bn_flags::STATS_IN_WORKSPACE != 0 {
        (*coef.add(f as usize)).0[0]
    } else {
        *saved.add(p.geo.feat.offsets(f)[PARAM] as usize)
    }
}

/// With [`bn_flags::WRITE_GRAD`], stores the masked gradient `g` of one vector as `dz`.
///
/// # Safety
/// `dz + off` holds the vector (checked by the host when the flag is set).
#[inline(always)]
unsafe fn write_grad<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    dz: *mut T,
    off: u64,
    g: [f32; KV],
) {
    if p.flags & bn_flags::WRITE_GRAD != 0 {
        store::<T, KV>(dz, off, g);
    }
}

/// Raw words of the backward inputs of one vector: `x`, `dy`, and `y` (behind a relu).
type BwdLoad = [Vec16; 3];

/// [`load_raw`], or with `last` [`load_last`].
///
/// # Safety
/// As [`load_raw`], read-only.
#[inline(always)]
unsafe fn load_ro<T: Element, const KV: usize>(last: bool, p: *const T, off: u64) -> Vec16 {
    if last {
        load_last::<T, KV>(p, off)
    } else {
        load_raw::<T, KV>(p, off, true)
    }
}

/// The relu's view of the vector at offsets `o` (the last of [`BwdLoad`]): `y` (slot
/// `Y`), the mask bits of `x`'s offset, or nothing.
///
/// # Safety
/// As [`load_raw`] for `y` ([`Relu::FromY`]), as [`load_relu_bits`] for the mask.
#[inline(always)]
unsafe fn load_relu<T: Element, const KV: usize>(
    relu: Relu,
    last: bool,
    y: *const T,
    mask: *const u32,
    o: [u64; 6],
) -> Vec16 {
    match relu {
        Relu::Off => [0; 4],
        Relu::FromY => load_ro::<T, KV>(last, y, o[Y]),
        Relu::FromBits => [load_relu_bits::<KV>(mask, o[X]), 0, 0, 0],
    }
}

/// Loads [`BwdLoad`] at the offsets `o` (slots `X`, `Z_OR_DY`, and the relu's); `last`:
/// streaming loads (the apply pass reads them for the last time).
///
/// # Safety
/// As [`load_raw`] for `x` and `dy`, and as [`load_relu`].
#[inline(always)]
unsafe fn load_bwd<T: Element, const KV: usize>(
    relu: Relu,
    last: bool,
    x: *const T,
    (y, mask): (*const T, *const u32),
    dy: *const T,
    o: [u64; 6],
) -> BwdLoad {
    [
        load_ro::<T, KV>(last, x, o[X]),
        load_ro::<T, KV>(last, dy, o[Z_OR_DY]),
        load_relu::<T, KV>(relu, last, y, mask, o),
    ]
}

/// `(g, x)` of one [`BwdLoad`]: the masked gradient and the input.
#[inline(always)]
fn grads<T: Element, const KV: usize>(relu: Relu, v: BwdLoad) -> ([f32; KV], [f32; KV]) {
    let dy = unpack::<T, KV>(v[1]);
    (relu.masked::<T, KV>(dy, v[2]), unpack::<T, KV>(v[0]))
}

/// Element offsets of every operand: the feature's base plus the reduction offsets.
#[inline(always)]
fn plus(base: [u64; 6], o: [u64; 6]) -> [u64; 6] {
    core::array::from_fn(|k| base[k] + o[k])
}

/// The gradient sums of a rows block's work (every thread gets the block's total).
///
/// # Safety
/// As `batch_norm_bwd_stats_rows_*`'s pointers; every thread of the block calls it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_sums_rows<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dz: *mut T,
    coef: *const BatchNormCoef,
    saved: *const f32,
    w: &Work,
) -> Acc<1> {
    let g = &p.geo;
    let mask = p.relu_mask as *const u32;
    let relu = Relu::of(p.flags, mask);
    let base = g.feat.offsets(w.f0);
    let mean = saved_mean(p, w.f0, coef, saved);
    let at = #[inline(always)]
    |j: u32| plus(base, g.red.offsets(j * KV as u32));
    let mut acc = Acc::<1>::EMPTY;
    let add = #[inline(always)]
    |acc: &mut Acc<1>, j: u32, v: BwdLoad| {
        let (gr, xv) = grads::<T, KV>(relu, v);
        write_grad::<T, KV>(p, dz, at(j)[DZ], gr);
        let (mut s, mut sx) = (0.0f32, 0.0f32);
        for e in 0..KV {
            s += gr[e];
            sx += gr[e] * (xv[e] - mean);
        }
        acc.add_grads(KV as f32, [s], [sx]);
    };
    visit::<BWD_UNROLL, BwdLoad, _>(
        w.range(),
        &mut acc,
        #[inline(always)]
        |j| load_bwd::<T, KV>(relu, false, x, (y, mask), dy, at(j)),
        #[inline(always)]
        |acc, j, v| {
            crate::unrolled!(u in BWD_UNROLL => add(acc, j + u as u32 * w.step, v[u]));
        },
        #[inline(always)]
        |acc, j, v| add(acc, j, v),
    );
    let scratch = crate::shared_array!(Acc<1>, 384);
    block_reduce(acc, scratch, Acc::EMPTY, merge_sums, Acc::shfl)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_stats_rows<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dz: *mut T,
    coef: *const BatchNormCoef,
    saved: *const f32,
    partials: *mut BatchNormPartial,
) {
    let g = &p.geo;
    let w = rows_work(g, block_idx_x());
    let total = bwd_sums_rows::<T, KV>(p, x, y, dy, dz, coef, saved, &w);
    if thread_idx_x() == 0 {
        let at = w.chunk * g.features + w.f0;
        write_partial(partials, at, total.n, total.a[0], total.b[0]);
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_stats_cols<T: Element, const KV: usize>(
    p: &BatchNormStatsParams,
    x: *const T,
    y: *const T,
    dy: *const T,
    dz: *mut T,
    coef: *const BatchNormCoef,
    saved: *const f32,
    partials: *mut BatchNormPartial,
) {
    let g = &p.geo;
    let mask = p.relu_mask as *const u32;
    let relu = Relu::of(p.flags, mask);
    let w = cols_work::<KV>(g, block_idx_x());
    let mut acc = Acc::<KV>::EMPTY;
    if w.active {
        let base = g.feat.offsets(w.f0);
        let mean: [f32; KV] = core::array::from_fn(|e| saved_mean(p, w.f0 + e as u32, coef, saved));
        let at = #[inline(always)]
        |r: u32| plus(base, g.red.offsets(r));
        let add = #[inline(always)]
        |acc: &mut Acc<KV>, r: u32, v: BwdLoad| {
            let (gr, xv) = grads::<T, KV>(relu, v);
            write_grad::<T, KV>(p, dz, at(r)[DZ], gr);
            let gx = core::array::from_fn(|e| gr[e] * (xv[e] - mean[e]));
            acc.add_grads(1.0, gr, gx);
        };
        visit::<BWD_UNROLL, BwdLoad, _>(
            w.range(),
            &mut acc,
            #[inline(always)]
            |r| load_bwd::<T, KV>(relu, false, x, (y, mask), dy, at(r)),
            #[inline(always)]
            |acc, r, v| {
                crate::unrolled!(u in BWD_UNROLL => add(acc, r + u as u32 * w.step, v[u]));
            },
            #[inline(always)]
            |acc, r, v| add(acc, r, v),
        );
    }
    let total = cols_reduce(g, acc, merge_sums);
    write_cols_partials(g, &w, total, partials);
}

// ---------------------------------------------------------------------------------------
// Finalize
// ---------------------------------------------------------------------------------------

/// f64 moments or sums of one feature, merged over its chunks.
#[derive(Clone, Copy)]
struct Total {
    n: f64,
    a: f64,
    b: f64,
}

impl Total {
    /// No elements: the identity of both merges.
    const EMPTY: Total = Total {
        n: 0.0,
        a: 0.0,
        b: 0.0,
    };

    fn shfl(self, mask: u32) -> Self {
        Total {
            n: shfl_xor_f64(self.n, mask),
            a: shfl_xor_f64(self.a, mask),
            b: shfl_xor_f64(self.b, mask),
        }
    }
}

#[inline(always)]
fn merge_total_moments(x: Total, y: Total) -> Total {
    if y.n == 0.0 {
        return x;
    }
    if x.n == 0.0 {
        return y;
    }
    let n = x.n + y.n;
    let w = y.n / n;
    let d = y.a - x.a;
    Total {
        n,
        a: x.a + d * w,
        b: x.b + y.b + d * d * x.n * w,
    }
}

#[inline(always)]
fn merge_total_sums(x: Total, y: Total) -> Total {
    Total {
        n: x.n + y.n,
        a: x.a + y.a,
        b: x.b + y.b,
    }
}

impl Total {
    /// A block's f32 total of one feature (what a single chunk's partial holds).
    #[inline(always)]
    fn of(acc: &Acc<1>) -> Self {
        Total {
            n: acc.n as f64,
            a: acc.a[0] as f64,
            b: acc.b[0] as f64,
        }
    }
}

/// The launch's warp `w` (global thread / 32) takes feature `w` ([`feature_total`]);
/// `None` for warps past the last feature.
#[inline(always)]
unsafe fn warp_total(
    features: u32,
    chunks: u32,
    partials: *const BatchNormPartial,
    merge: impl Fn(Total, Total) -> Total,
) -> Option<(u32, Total)> {
    let f = (global_thread_x() / 32) as u32;
    if f >= features {
        return None;
    }
    Some((f, feature_total(f, features, chunks, partials, merge)))
}

/// The calling warp merges feature `f`'s partials: lane `l` takes chunks `l, l+32, ..`
/// ([`chunks_total`]), then a butterfly; lane 0's result is returned to lane 0 (the
/// others' differ in rounding and are not used).
///
/// # Safety
/// `partials` holds `chunks * features` entries; the whole warp calls it, converged.
#[inline(always)]
unsafe fn feature_total(
    f: u32,
    features: u32,
    chunks: u32,
    partials: *const BatchNormPartial,
    merge: impl Fn(Total, Total) -> Total,
) -> Total {
    let t = chunks_total::<4>(f, features, (lane_id(), chunks, 32), partials, &merge);
    butterfly(t, 32, merge)
}

/// Feature `f`'s partials of the chunks `first, first + step, .. < end`, merged in that
/// order in f64 (loaded `UN` at a time).
///
/// # Safety
/// `partials` holds `end * features` entries (chunk-major).
#[inline(always)]
unsafe fn chunks_total<const UN: usize>(
    f: u32,
    features: u32,
    range: (u32, u32, u32),
    partials: *const BatchNormPartial,
    merge: &impl Fn(Total, Total) -> Total,
) -> Total {
    let mut t = Total::EMPTY;
    let add = #[inline(always)]
    |t: &mut Total, part: BatchNormPartial| {
        let next = Total {
            n: part.count as f64,
            a: part.a as f64,
            b: part.b as f64,
        };
        *t = merge(*t, next);
    };
    visit::<UN, BatchNormPartial, _>(
        range,
        &mut t,
        #[inline(always)]
        |c| *partials.add((c * features + f) as usize),
        #[inline(always)]
        |t, _, parts| crate::unrolled!(u in UN => add(t, parts[u])),
        #[inline(always)]
        |t, _, part| add(t, part),
    );
    t
}

/// Feature `f`'s partials merged by the whole block: thread `t` takes chunks `t, t +
/// threads, ..` ([`chunks_total`], two at a time: up to 512 chunks the merge waits for
/// memory once, where a warp's lanes took several partials each in turn), each warp
/// merges its lanes by a butterfly and the first warp the warps' totals by another;
/// thread 0's result is returned to thread 0. Uses the block's reduction scratch.
///
/// # Safety
/// `partials` holds `chunks * features` entries; every thread of the block calls it, and
/// no thread uses the scratch (the first `24 * warps` bytes of dynamic shared memory)
/// across the call.
#[inline(always)]
unsafe fn block_feature_total(
    f: u32,
    features: u32,
    chunks: u32,
    partials: *const BatchNormPartial,
    merge: &impl Fn(Total, Total) -> Total,
) -> Total {
    let range = (thread_idx_x(), chunks, block_dim_x());
    let t = butterfly(
        chunks_total::<2>(f, features, range, partials, merge),
        32,
        merge,
    );
    let slot = |w: u32| dynamic_smem() + w * size_of::<Total>() as u32;
    // SAFETY: warp < BN_BLOCK_WARPS, so every slot lies in the reduction scratch
    // (BN_COLS_SHARED_BYTES); the barriers order the stores before the loads and the
    // loads before the next call's stores.
    if lane_id() == 0 {
        st_shared_words(slot(warp_id()), t);
    }
    sync_threads_divergent();
    let mut total = t;
    if warp_id() == 0 {
        total = Total::EMPTY;
        if lane_id() < block_dim_x() / 32 {
            total = ld_shared_words::<Total>(slot(lane_id()));
        }
        total = butterfly(total, 32, merge);
    }
    sync_threads_divergent();
    total
}

/// `t` merged over each aligned group of `width` lanes (a power of two up to 32) by a
/// butterfly, widest step first. Every lane of the warp calls it, converged.
#[inline(always)]
fn butterfly(mut t: Total, width: u32, merge: impl Fn(Total, Total) -> Total) -> Total {
    let mut mask = width >> 1;
    while mask > 0 {
        t = merge(t, t.shfl(mask));
        mask >>= 1;
    }
    t
}

/// `alpha * v + beta * old` in f64, reading `old` only when `beta != 0`.
#[inline(always)]
unsafe fn blend_into(p: *mut f32, alpha: f32, v: f64, beta: f32) {
    let out = if beta == 0.0 {
        alpha as f64 * v
    } else {
        alpha as f64 * v + beta as f64 * *p as f64
    };
    *p = out as f32;
}

/// The per-feature pointers of a forward finalize: `scale`, `bias` may be null (their
/// coefficients are then 0); the running and saved ones are used only with their flags.
#[derive(Clone, Copy)]
struct FwdStatsOut {
    scale: *const f32,
    bias: *const f32,
    running_mean: *mut f32,
    running_var: *mut f32,
    saved_mean: *mut f32,
    saved_inv_std: *mut f32,
}

/// The forward finalize of a whole launch: one warp per feature.
///
/// # Safety
/// As `batch_norm_fwd_finalize`.
#[inline(always)]
unsafe fn fwd_finalize(
    p: &BatchNormFinalizeParams,
    partials: *const BatchNormPartial,
    out: &FwdStatsOut,
    coef: *mut BatchNormCoef,
) {
    let Some((f, t)) = warp_total(p.features, p.chunks, partials, merge_total_moments) else {
        return;
    };
    if lane_id() == 0 {
        *coef.add(f as usize) = fwd_feature(p, f, t, out, true);
    }
}

/// Feature `f`'s coefficient `(mean, inv_std, scale * inv_std, bias)` from its moments;
/// with `write`, also its saved and running statistics (exactly one thread per feature
/// may write: the running update reads the old value).
///
/// # Safety
/// The pointers of `out` cover the per-feature tensor (as their flags and nullness say).
#[inline(always)]
unsafe fn fwd_feature(
    p: &BatchNormFinalizeParams,
    f: u32,
    t: Total,
    out: &FwdStatsOut,
    write: bool,
) -> BatchNormCoef {
    let FwdStatsOut {
        scale,
        bias,
        running_mean,
        running_var,
        saved_mean,
        saved_inv_std,
    } = *out;
    let var = t.b / t.n;
    let inv_std = 1.0 / sqrt_f64(var + p.epsilon);
    let po = p.feat.offsets(f)[PARAM] as usize;
    let a = if scale.is_null() {
        0.0
    } else {
        *scale.add(po) as f64 * inv_std
    };
    let b = if bias.is_null() { 0.0 } else { *bias.add(po) };
    let coef = BatchNormCoef([t.a as f32, inv_std as f32, a as f32, b]);
    if !write {
        return coef;
    }
    if p.flags & bn_flags::SAVED != 0 {
        *saved_mean.add(po) = t.a as f32;
        *saved_inv_std.add(po) = inv_std as f32;
    }
    if p.flags & bn_flags::RUNNING != 0 {
        let unbiased = t.b / (t.n - 1.0);
        let (rm, rv) = (running_mean.add(po), running_var.add(po));
        if p.flags & bn_flags::RUNNING_OVERWRITE != 0 {
            *rm = t.a as f32;
            *rv = unbiased as f32;
        } else {
            let keep = 1.0 - p.factor;
            *rm = (keep * *rm as f64 + p.factor * t.a) as f32;
            *rv = (keep * *rv as f64 + p.factor * unbiased) as f32;
        }
    }
    coef
}

/// The per-feature pointers of a backward finalize: `stats` (with `STATS_IN_WORKSPACE`,
/// the forward coefficients) or the saved mean and inverse std, `scale`, and the outputs.
#[derive(Clone, Copy)]
struct BwdStatsOut {
    scale: *const f32,
    saved_mean: *const f32,
    saved_inv_std: *const f32,
    stats: *const BatchNormCoef,
    dscale: *mut f32,
    dbias: *mut f32,
}

/// The backward finalize of a whole launch: one warp per feature.
///
/// # Safety
/// As `batch_norm_bwd_finalize`.
#[inline(always)]
unsafe fn bwd_finalize(
    p: &BatchNormFinalizeParams,
    partials: *const BatchNormPartial,
    out: &BwdStatsOut,
    coef: *mut BatchNormCoef,
) {
    let Some((f, t)) = warp_total(p.features, p.chunks, partials, merge_total_sums) else {
        return;
    };
    if lane_id() == 0 {
        *coef.add(f as usize) = bwd_feature(p, f, t, out, true);
    }
}

/// Feature `f`'s backward coefficient `(mean, c1, c2, c3)` from its gradient sums; with
/// `write` (exactly one thread per feature), also its blended `dscale` and `dbias`.
///
/// # Safety
/// The pointers of `out` cover the per-feature tensor (`stats` holds `features`
/// coefficients with `STATS_IN_WORKSPACE`).
#[inline(always)]
unsafe fn bwd_feature(
    p: &BatchNormFinalizeParams,
    f: u32,
    t: Total,
    out: &BwdStatsOut,
    write: bool,
) -> BatchNormCoef {
    let BwdStatsOut {
        scale,
        saved_mean,
        saved_inv_std,
        stats,
        dscale,
        dbias,
    } = *out;
    let po = p.feat.offsets(f)[PARAM] as usize;
    let (mean, inv_std) = if p.flags & bn_flags::STATS_IN_WORKSPACE != 0 {
        let s = (*stats.add(f as usize)).0;
        (s[0], s[1] as f64)
    } else {
        (*saved_mean.add(po), *saved_inv_std.add(po) as f64)
    };
    let ds = t.b * inv_std;
    if write {
        blend_into(dscale.add(po), p.alpha, ds, p.beta);
        blend_into(dbias.add(po), p.alpha, t.a, p.beta);
    }
    let c1 = *scale.add(po) as f64 * inv_std;
    let c2 = -c1 * inv_std * ds / t.n;
    let c3 = -c1 * t.a / t.n;
    BatchNormCoef([mean, c1 as f32, c2 as f32, c3 as f32])
}

// ---------------------------------------------------------------------------------------
// Apply
// ---------------------------------------------------------------------------------------

/// What an apply pass does after the normalization: the flags ([`bn_flags::ADD`],
/// [`bn_flags::RELU`]) and the blend of the outputs (`alpha * new + beta * old`).
#[derive(Clone, Copy)]
struct Epilogue {
    flags: u32,
    alpha: f32,
    beta: f32,
}

/// The epilogues an apply kernel is compiled for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Epilogues {
    /// The plain one alone (no residual add, no relu, `alpha = 1`, `beta = 0`; the host
    /// launches such a kernel only then): one loop, and the registers of that loop alone,
    /// so more blocks fit an SM.
    Plain,
    /// Whatever the parameters say ([`with_constant_epilogue`]).
    Any,
}

/// `p` with the plain epilogue written in: constants, which [`with_constant_epilogue`]
/// folds to the plain loop (the other loops are not compiled).
#[inline(always)]
fn with_plain_epilogue(p: &BatchNormApplyParams) -> BatchNormApplyParams {
    BatchNormApplyParams {
        flags: p.flags & !(bn_flags::ADD | bn_flags::RELU),
        alpha: 1.0,
        beta: 0.0,
        ..*p
    }
}

/// Runs `body` on `p`'s epilogue, where in the common cases it is a constant, so each
/// gets its own loop with no per-element tests of flags and no blend arithmetic: plain
/// (no residual add, no relu) and fused (add and relu), both with `alpha = 1`, `beta = 0`.
#[inline(always)]
fn with_constant_epilogue(p: &BatchNormApplyParams, body: impl Fn(Epilogue)) {
    let mask = bn_flags::ADD | bn_flags::RELU;
    if p.alpha == 1.0 && p.beta == 0.0 {
        let constant = |flags| Epilogue {
            flags,
            alpha: 1.0,
            beta: 0.0,
        };
        match p.flags & mask {
            0 => return body(constant(0)),
            f if f == mask => return body(constant(mask)),
            _ => {}
        }
    }
    body(Epilogue {
        flags: p.flags & mask,
        alpha: p.alpha,
        beta: p.beta,
    })
}

/// Forward coefficients `(mean, a, bias)` of feature `f`: `y = (x - mean) a + bias`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_coef(
    p: &BatchNormApplyParams,
    f: u32,
    coef: *const BatchNormCoef,
    scale: *const f32,
    bias: *const f32,
    mean: *const f32,
    var: *const f32,
) -> [f32; 3] {
    if p.flags & bn_flags::COEF_FROM_PARAMS != 0 {
        coef_from_params(p, f, scale, bias, mean, var)
    } else {
        let c = (*coef.add(f as usize)).0;
        [c[0], c[2], c[3]]
    }
}

/// Inference's coefficients `(mean, a, bias)` of feature `f`, from the per-feature tensors:
/// `a = scale / sqrt(var + epsilon)`.
///
/// # Safety
/// The per-feature tensors cover feature `f`'s offset.
#[inline(always)]
unsafe fn coef_from_params(
    p: &BatchNormApplyParams,
    f: u32,
    scale: *const f32,
    bias: *const f32,
    mean: *const f32,
    var: *const f32,
) -> [f32; 3] {
    let po = p.geo.feat.offsets(f)[PARAM] as usize;
    let inv_std = 1.0 / sqrt(*var.add(po) + p.epsilon);
    [*mean.add(po), *scale.add(po) * inv_std, *bias.add(po)]
}

/// Features of a cols tile at most (`tile_vectors <= 32` vectors of at most 8 elements):
/// the slots of [`tile_coefficients_from_params`]' table.
const TILE_FEATURES: usize = 256;

/// Inference's coefficients of a cols thread's `KV` features ([`cols_work`]), computed once
/// a block instead of once a thread: the block's threads share out its tile's features,
/// each computing a feature's `(mean, a, bias)` ([`coef_from_params`]: four loads, a
/// square root and a division) into a table in shared memory, and after a block barrier
/// every active thread reads its own. Feature `v * KV + e` of the tile sits at slot
/// `e * tile_vectors + v`, so a warp's lanes, which differ in `v`, read consecutive
/// slots. Every thread of the block calls it; inactive threads get zeros.
///
/// # Safety
/// As [`coef_from_params`] for each feature of the block's tile.
#[inline(always)]
unsafe fn tile_coefficients_from_params<const KV: usize>(
    p: &BatchNormApplyParams,
    w: &Work,
    scale: *const f32,
    bias: *const f32,
    mean: *const f32,
    var: *const f32,
) -> [[f32; 3]; KV] {
    const { assert!(32 * KV <= TILE_FEATURES, "a tile's features fit the table") };
    let g = &p.geo;
    let table = crate::shared_f32!(4096).base;
    const { assert!(16 * TILE_FEATURES == 4096) };
    let slot = |v: u32, e: u32| table + 16 * (e * g.tile_vectors + v);
    let per_tile = g.tile_vectors * KV as u32;
    // Every thread's `f0` lies in its block's tile (inactive ones' past the last feature).
    let first = ((w.f0 / KV as u32) >> g.tile_vectors_log2) * per_tile;
    let mut i = thread_idx_x();
    while i < per_tile && first + i < g.features {
        let c = coef_from_params(p, first + i, scale, bias, mean, var);
        // SAFETY: slot < per_tile <= TILE_FEATURES; read only after the barrier below.
        st_shared_v4(
            slot(i / KV as u32, i % KV as u32),
            [c[0], c[1], c[2], 0.0].map(f32::to_bits),
        );
        i += block_dim_x();
    }
    sync_threads_divergent();
    if !w.active {
        return [[0.0; 3]; KV];
    }
    let v = thread_idx_x() & (g.tile_vectors - 1);
    core::array::from_fn(|e| {
        // SAFETY: written above for each of the tile's features, this thread's among them.
        let c = ld_shared_v4(slot(v, e as u32)).map(f32::from_bits);
        [c[0], c[1], c[2]]
    })
}

/// The pointers of a forward apply pass.
#[derive(Clone, Copy)]
struct FwdIo<T> {
    x: *const T,
    z: *const T,
    y: *mut T,
    /// The relu mask to write (the apply parameters' `relu_mask`), or null.
    mask: *mut u32,
}

/// Raw words of the forward inputs of one vector: `x`, `z` (with `ADD`).
type FwdLoad = [Vec16; 2];

/// Makes and stores the forward output of one vector at offsets `o`, reading the old `y`
/// only when `beta != 0`; `c[e]` are the coefficients of the vector's element `e`.
///
/// # Safety
/// The offsets are in bounds of their operands.
#[inline(always)]
unsafe fn fwd_one<T: Element, const KV: usize>(
    ep: Epilogue,
    io: FwdIo<T>,
    c: &[[f32; 3]; KV],
    o: [u64; 6],
    v: FwdLoad,
) {
    let (xv, zv) = (unpack::<T, KV>(v[0]), unpack::<T, KV>(v[1]));
    let old = if ep.beta != 0.0 {
        load::<T, KV>(io.y, o[Y], false)
    } else {
        [0.0; KV]
    };
    let mut out = [0.0f32; KV];
    crate::unrolled!(e in KV => {
        let mut v = (xv[e] - c[e][0]) * c[e][1] + c[e][2];
        if ep.flags & bn_flags::ADD != 0 {
            v += zv[e];
        }
        if ep.flags & bn_flags::RELU != 0 {
            v = relu(v);
        }
        out[e] = blend(ep.alpha, v, ep.beta, || old[e]);
    });
    store_last::<T, KV>(io.y, o[Y], out);
    if ep.flags & bn_flags::RELU != 0 && !io.mask.is_null() {
        store_relu_bits::<T, KV>(io.mask, o[X], &out);
    }
}

/// The residual `z` at offsets `o` (with `ADD`; zeros otherwise).
///
/// # Safety
/// As [`load_raw`] for `z` (with `ADD`).
#[inline(always)]
unsafe fn load_z<T: Element, const KV: usize>(ep: Epilogue, io: FwdIo<T>, o: [u64; 6]) -> Vec16 {
    if ep.flags & bn_flags::ADD != 0 {
        load_last::<T, KV>(io.z, o[Z_OR_DY])
    } else {
        [0; 4]
    }
}

/// The apply passes' `x` of vector `(i, offsets)`: read from memory, for the last time.
///
/// # Safety
/// Every call reads `x` at the offsets, as [`load_raw`].
#[inline(always)]
unsafe fn x_from_memory<T: Element, const KV: usize>(
    io: FwdIo<T>,
) -> impl Fn(u32, [u64; 6]) -> Vec16 {
    move |_, o| load_last::<T, KV>(io.x, o[X])
}

/// The forward apply pass over the vectors `i` of `range` (`first, end, step`): vector `i`
/// at `base + red(row(i))`, visited in order, or last to first with a nonzero `mirror`
/// ([`mirror_of`]); `x` of the vector visited as `i` is `load_x(i, offsets)`. `UN`
/// vectors at a time (1 for shared memory: less code, and no memory latency to cover).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_apply<T: Element, const KV: usize, const UN: usize>(
    p: &BatchNormApplyParams,
    io: FwdIo<T>,
    range: (u32, u32, u32),
    mirror: u32,
    base: [u64; 6],
    row: impl Fn(u32) -> u32,
    c: &[[f32; 3]; KV],
    load_x: impl Fn(u32, [u64; 6]) -> Vec16,
) {
    let g = &p.geo;
    let at = #[inline(always)]
    |i: u32| plus(base, g.red.offsets(row(visited(mirror, i))));
    let step = range.2;
    // Inlined into each of the three calls: a called closure would take its captures
    // (the parameters' geometry among them) through local memory.
    with_constant_epilogue(
        p,
        #[inline(always)]
        |ep| {
            visit::<UN, FwdLoad, _>(
                range,
                &mut (),
                #[inline(always)]
                |i| {
                    let o = at(i);
                    [load_x(visited(mirror, i), o), load_z::<T, KV>(ep, io, o)]
                },
                #[inline(always)]
                |_, i, v| {
                    crate::unrolled!(u in UN => {
                        fwd_one::<T, KV>(ep, io, c, at(i + u as u32 * step), v[u])
                    });
                },
                #[inline(always)]
                |_, i, v| fwd_one::<T, KV>(ep, io, c, at(i), v),
            )
        },
    );
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_apply_rows<T: Element, const KV: usize>(
    p: &BatchNormApplyParams,
    io: FwdIo<T>,
    coef: *const BatchNormCoef,
    scale: *const f32,
    bias: *const f32,
    mean: *const f32,
    var: *const f32,
) {
    let g = &p.geo;
    let w = rows_work(g, grid_dim_x() - 1 - block_idx_x());
    let base = g.feat.offsets(w.f0);
    let c = [fwd_coef(p, w.f0, coef, scale, bias, mean, var); KV];
    let load_x = x_from_memory::<T, KV>(io);
    fwd_apply::<T, KV, FWD_UNROLL>(p, io, w.range(), 0, base, vector_start::<KV>, &c, load_x);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fwd_apply_cols<T: Element, const KV: usize>(
    p: &BatchNormApplyParams,
    io: FwdIo<T>,
    coef: *const BatchNormCoef,
    scale: *const f32,
    bias: *const f32,
    mean: *const f32,
    var: *const f32,
) {
    let g = &p.geo;
    let w = cols_apply_work::<KV>(p, grid_dim_x() - 1 - block_idx_x());
    let c: [[f32; 3]; KV] = if p.flags & bn_flags::COEF_FROM_PARAMS != 0 {
        // Before the inactive threads leave: the whole block computes the table.
        tile_coefficients_from_params::<KV>(p, &w, scale, bias, mean, var)
    } else if w.active {
        core::array::from_fn(|e| fwd_coef(p, w.f0 + e as u32, coef, scale, bias, mean, var))
    } else {
        return;
    };
    if !w.active {
        return;
    }
    let load_x = x_from_memory::<T, KV>(io);
    let base = g.feat.offsets(w.f0);
    fwd_apply::<T, KV, FWD_UNROLL>(p, io, w.range(), 0, base, same_row, &c, load_x);
}

/// The pointers of a backward apply pass.
#[derive(Clone, Copy)]
struct BwdIo<T> {
    x: *const T,
    y: *const T,
    dy: *const T,
    dx: *mut T,
    dz: *mut T,
    /// The relu mask to read instead of `y` (the apply parameters' `relu_mask`), or null.
    mask: *const u32,
}

/// Makes and stores the backward outputs of one vector at offsets `o`: `dx` and (with
/// `ADD`) `dz`; `c[e]` are the coefficients `(mean, c1, c2, c3)` of element `e`.
///
/// # Safety
/// The offsets are in bounds of their operands.
#[inline(always)]
unsafe fn bwd_one<T: Element, const KV: usize>(
    ep: Epilogue,
    io: BwdIo<T>,
    c: &[[f32; 4]; KV],
    o: [u64; 6],
    v: BwdLoad,
) {
    let (grad, xv) = grads::<T, KV>(Relu::of(ep.flags, io.mask), v);
    let read_old = ep.beta != 0.0;
    let old = if read_old {
        load::<T, KV>(io.dx, o[DX], false)
    } else {
        [0.0; KV]
    };
    let mut out = [0.0f32; KV];
    crate::unrolled!(e in KV => {
        let [mean, c1, c2, c3] = c[e];
        let d = c1 * grad[e] + c2 * (xv[e] - mean) + c3;
        out[e] = blend(ep.alpha, d, ep.beta, || old[e]);
    });
    store_last::<T, KV>(io.dx, o[DX], out);
    if ep.flags & bn_flags::ADD != 0 {
        let old = if read_old {
            load::<T, KV>(io.dz, o[DZ], false)
        } else {
            [0.0; KV]
        };
        crate::unrolled!(e in KV => out[e] = blend(ep.alpha, grad[e], ep.beta, || old[e]));
        store_last::<T, KV>(io.dz, o[DZ], out);
    }
}

/// The backward apply pass over the vectors `i` of `range` (`first, end, step`): vector
/// `i` at `base + red(row(i))`, visited in order, or last to first with a nonzero
/// `mirror` ([`mirror_of`]); the inputs of the vector visited as `i` are
/// `load(i, offsets)`; `UN` vectors at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bwd_apply<T: Element, const KV: usize, const UN: usize>(
    p: &BatchNormApplyParams,
    io: BwdIo<T>,
    range: (u32, u32, u32),
    mirror: u32,
    base: [u64; 6],
    row: impl Fn(u32) -> u32,
    c: &[[f32; 4]; KV],
    load: impl Fn(u32, [u64; 6]) -> BwdLoad,
) {
    let g = &p.geo;
    let at = #[inline(always)]
    |i: u32| plus(base, g.red.offsets(row(visited(mirror, i))));
    let step = range.2;
    // Inlined into each of the three calls: a called closure would take its captures
    // (the parameters' geometry among them) through local memory.
    with_constant_epilogue(
        p,
        #[inline(always)]
        |ep| {
            visit::<UN, BwdLoad, _>(
                range,
                &mut (),
                #[inline(always)]
                |i| load(visited(mirror, i), at(i)),
                #[inline(always)]
                |_, i, v| {
                    crate::unrolled!(u in UN => {
                        bwd_one::<T, KV>(ep, io, c, at(i + u as u32 * step), v[u])
                    });
                },
                #[inline(always)]
                |_, i, v| bwd_one::<T, KV>(ep, io, c, at(i), v),
            )
        },
    );
}

#[inline(always)]
unsafe fn bwd_apply_rows<T: Element, const KV: usize>(
    p: &BatchNormApplyParams,
    io: BwdIo<T>,
    coef: *const BatchNormCoef,
) {
    let g = &p.geo;
    let w = rows_work(g, grid_dim_x() - 1 - block_idx_x());
    let c = [(*coef.add(w.f0 as usize)).0; KV];
    let load = bwd_from_memory::<T, KV>(p, io);
    bwd_apply::<T, KV, BWD_UNROLL>(
        p,
        io,
        w.range(),
        0,
        g.feat.offsets(w.f0),
        vector_start::<KV>,
        &c,
        load,
    );
}

#[inline(always)]
unsafe fn bwd_apply_cols<T: Element, const KV: usize>(
    p: &BatchNormApplyParams,
    io: BwdIo<T>,
    coef: *const BatchNormCoef,
) {
    let g = &p.geo;
    let w = cols_apply_work::<KV>(p, grid_dim_x() - 1 - block_idx_x());
    if !w.active {
        return;
    }
    let c: [[f32; 4]; KV] = core::array::from_fn(|e| (*coef.add(w.f0 as usize + e)).0);
    let load = bwd_from_memory::<T, KV>(p, io);
    let base = g.feat.offsets(w.f0);
    bwd_apply::<T, KV, BWD_UNROLL>(p, io, w.range(), 0, base, same_row, &c, load);
}

/// The backward apply passes' inputs of vector `(i, offsets)`: read from memory, for the
/// last time.
///
/// # Safety
/// Every call reads `x`, `dy` and (behind a relu) `y` at the offsets, as [`load_raw`].
#[inline(always)]
unsafe fn bwd_from_memory<T: Element, const KV: usize>(
    p: &BatchNormApplyParams,
    io: BwdIo<T>,
) -> impl Fn(u32, [u64; 6]) -> BwdLoad {
    let relu = Relu::of(p.flags, io.mask);
    move |_, o| load_bwd::<T, KV>(relu, true, io.x, (io.y, io.mask), io.dy, o)
}

// ---------------------------------------------------------------------------------------
// Fused training passes (one launch, a block per feature)
// ---------------------------------------------------------------------------------------

#[inline(always)]
unsafe fn fwd_fused_rows<T: Element, const KV: usize>(
    p: &BatchNormFusedParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
) {
    let g = &p.apply.geo;
    let w = rows_work(g, block_idx_x());
    let total = fwd_moments_rows::<T, KV>(g, io.x, &w);
    // Every thread has the block's total, which is the feature's: each finalizes it
    // (the same value), thread 0 writes the per-feature outputs.
    let t = Total::of(&total);
    let c = fwd_feature(&p.finalize, w.f0, t, out, thread_idx_x() == 0).0;
    let base = g.feat.offsets(w.f0);
    let c = [[c[0], c[2], c[3]]; KV];
    let load_x = x_from_memory::<T, KV>(io);
    fwd_apply::<T, KV, FWD_UNROLL>(
        &p.apply,
        io,
        w.range(),
        mirror_of(w.range()),
        base,
        vector_start::<KV>,
        &c,
        load_x,
    );
}

/// Copies vector `src` of `KV` elements of `T` (4, 8 or 16 bytes) to shared `dst`
/// asynchronously (`cp.async`: [`cp_async_commit`] and [`cp_async_wait`] before reading it).
///
/// # Safety
/// `src` holds the vector, aligned to its size; `dst` is shared memory, aligned likewise.
#[inline(always)]
unsafe fn stage_async<T: Element, const KV: usize>(dst: u32, src: *const T) {
    let src = src as *const u8;
    match KV * size_of::<T>() {
        16 => cp_async_16(dst, src, 16),
        8 => cp_async_ca::<8>(dst, src, 8),
        4 => cp_async_ca::<4>(dst, src, 4),
        // The host stages vectors of 4 bytes or more only.
        _ => device::trap(),
    }
}

/// The vector [`stage_async`] left at shared `addr` (in the low bytes of the word).
///
/// # Safety
/// `addr` holds a staged vector, its copy waited for.
#[inline(always)]
unsafe fn unstage<T: Element, const KV: usize>(addr: u32) -> Vec16 {
    match KV * size_of::<T>() {
        16 => ld_shared_v4(addr),
        8 => {
            let [a, b] = ld_shared_v2(addr);
            [a, b, 0, 0]
        }
        _ => [ld_shared_u32(addr), 0, 0, 0],
    }
}

/// The staged forward whose apply reads a vector at a time (from shared memory, and `z`
/// with `ADD`), for the fewest registers and the most blocks per SM.
///
/// # Safety
/// As `batch_norm_fwd_staged_rows_*`.
#[inline(always)]
unsafe fn fwd_staged_rows<T: Element, const KV: usize>(
    p: &BatchNormFusedParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
) {
    fwd_staged::<T, KV, 1>(p, io, out)
}

/// The unrolled staged forward (for a network's fused add + relu with the reserve space,
/// where shared memory bounds the blocks per SM): its apply takes [`FWD_UNROLL`] vectors
/// at a time, so that as many loads of the residual `z` are in flight, for more registers.
///
/// # Safety
/// As `batch_norm_fwd_staged_masked_unrolled_rows_*`.
#[inline(always)]
unsafe fn fwd_staged_unrolled_rows<T: Element, const KV: usize>(
    p: &BatchNormFusedParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
) {
    fwd_staged::<T, KV, FWD_UNROLL>(p, io, out)
}

/// [`fwd_fused_rows`] with the feature staged in shared memory: every thread first copies
/// its vectors there (`cp.async`, all of them in flight at once), then reduces and
/// applies them from there (`UN` vectors at a time), so `x` is read from memory once.
/// Vector `j` of the feature sits at `j * KV * size_of::<T>()` of the dynamic shared
/// memory; each thread reads back only the vectors it copied, so the phases need no
/// block barrier.
///
/// # Safety
/// As `batch_norm_fwd_staged_rows_*`.
#[inline(always)]
unsafe fn fwd_staged<T: Element, const KV: usize, const UN: usize>(
    p: &BatchNormFusedParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
) {
    let g = &p.apply.geo;
    let w = rows_work(g, block_idx_x());
    let base = g.feat.offsets(w.f0);
    let start = w.chunk * g.chunk_len;
    let slot = |j: u32| dynamic_smem() + (j - start) * (KV * size_of::<T>()) as u32;
    let mut j = w.first;
    while j < w.end {
        let at = base[X] + g.red.offsets(j * KV as u32)[X];
        // SAFETY: the host sizes the shared memory for the chunk's vectors; `x`'s vector
        // is in bounds and aligned to its size (the vector width's condition).
        stage_async::<T, KV>(slot(j), io.x.add(at as usize));
        j += w.step;
    }
    cp_async_commit();
    cp_async_wait(0);
    let from_stage = #[inline(always)]
    |j: u32| unstage::<T, KV>(slot(j));
    let total = fwd_moments_of::<T, KV>(&w, from_stage);
    let t = Total::of(&total);
    let c = fwd_feature(&p.finalize, w.f0, t, out, thread_idx_x() == 0).0;
    let c = [[c[0], c[2], c[3]]; KV];
    let load_x = |j: u32, _: [u64; 6]| from_stage(j);
    fwd_apply::<T, KV, UN>(
        &p.apply,
        io,
        w.range(),
        0,
        base,
        vector_start::<KV>,
        &c,
        load_x,
    );
}

#[inline(always)]
unsafe fn bwd_fused_rows<T: Element, const KV: usize>(
    p: &BatchNormFusedParams,
    io: BwdIo<T>,
    out: &BwdStatsOut,
) {
    let g = &p.apply.geo;
    // The relu mask of the apply flags; the mean from the saved statistics.
    let sp = BatchNormStatsParams {
        geo: p.apply.geo,
        flags: p.apply.flags & bn_flags::RELU,
        _pad: 0,
        relu_mask: p.apply.relu_mask,
    };
    let w = rows_work(g, block_idx_x());
    // `dz` is not written here (no WRITE_GRAD) and `stats` not read (no
    // STATS_IN_WORKSPACE); run-time pointers, not null constants (LLVM crashed on a load
    // from a constant null in an untaken branch).
    let total =
        bwd_sums_rows::<T, KV>(&sp, io.x, io.y, io.dy, io.dz, out.stats, out.saved_mean, &w);
    let t = Total::of(&total);
    let c = bwd_feature(&p.finalize, w.f0, t, out, thread_idx_x() == 0).0;
    let base = g.feat.offsets(w.f0);
    let load = bwd_from_memory::<T, KV>(&p.apply, io);
    let mirror = mirror_of(w.range());
    bwd_apply::<T, KV, BWD_UNROLL>(
        &p.apply,
        io,
        w.range(),
        mirror,
        base,
        vector_start::<KV>,
        &[c; KV],
        load,
    );
}

// ---------------------------------------------------------------------------------------
// Resident training forward (one cooperative launch, cols mapping)
// ---------------------------------------------------------------------------------------

/// Where a cols thread keeps its vectors of its chunk's first rows: in the block's dynamic
/// shared memory after the reduction scratch ([`BatchNormResidentParams`]'s layout).
struct Stash {
    /// The shared address of the thread's vector of the chunk's first row.
    base: u32,
    /// The thread's vector in its tile.
    vector: u32,
    /// The chunk's first row.
    start: u32,
    /// `log2` of the bytes from one row to the next (`16 * tile_vectors`).
    row_log2: u32,
}

impl Stash {
    #[inline(always)]
    fn of(g: &BatchNormGeometry, w: &Work) -> Self {
        let vector_in_tile = thread_idx_x() & (g.tile_vectors - 1);
        Stash {
            base: dynamic_smem() + BN_COLS_SHARED_BYTES + 16 * vector_in_tile,
            vector: vector_in_tile,
            start: w.chunk * g.chunk_len,
            row_log2: g.tile_vectors_log2 + 4,
        }
    }

    /// The shared address of the thread's vector of row `r` (of its chunk).
    #[inline(always)]
    fn at(&self, r: u32) -> u32 {
        self.base + ((r - self.start) << self.row_log2)
    }

    /// The shared address of the thread's 4-byte word of row `r` in a region of words
    /// after `operands` stashed operands of `region` bytes each.
    #[inline(always)]
    fn word_at(&self, r: u32, operands: u32, region: u32) -> u32 {
        let words = self.base - 16 * self.vector + operands * region;
        words + 4 * self.vector + ((r - self.start) << (self.row_log2 - 2))
    }
}

/// Coefficient `f` of the workspace, in one 16-byte load (not through the read-only
/// path: the resident kernels write the coefficients earlier in the same launch).
///
/// # Safety
/// `coef` is 16-byte aligned (the workspace's coefficient region is) and holds `f`.
#[inline(always)]
unsafe fn coef_of(coef: *const BatchNormCoef, f: u32) -> [f32; 4] {
    device::ld_global_v4(coef.add(f as usize) as *const u32).map(f32::from_bits)
}

/// Where a resident launch's blocks meet: the partials and coefficients of the workspace
/// and the barrier state (a word per tile, the first also the grid's).
#[derive(Clone, Copy)]
struct Sync {
    partials: *mut BatchNormPartial,
    coef: *mut BatchNormCoef,
    barrier: *mut u32,
}

/// The coefficients of a resident block's features, from the block's statistics `total`
/// ([`cols_reduce`]): its partials are written, then, with `local_finalize`, a barrier of
/// the tile's blocks and every block finalizing the tile itself ([`tile_finalize`]);
/// otherwise a grid barrier, the grid's blocks finalizing a feature each in turn
/// ([`block_feature_total`], through the workspace's coefficients) and another grid
/// barrier. `finish(f, total, write)` makes feature `f`'s coefficient (with `write`, also
/// its per-feature outputs: exactly once per feature). Every thread of the block calls it; inactive threads get zeros.
///
/// # Safety
/// As the resident kernels: a cooperative launch of the plan's grid, `sync` as the host
/// lays it out.
#[inline(always)]
unsafe fn resident_coefficients<const KV: usize>(
    p: &BatchNormResidentParams,
    w: &Work,
    total: Acc<KV>,
    sync: Sync,
    merge: impl Fn(Total, Total) -> Total,
    finish: impl Fn(u32, Total, bool) -> BatchNormCoef,
) -> [[f32; 4]; KV] {
    let g = &p.fused.apply.geo;
    write_cols_partials(g, w, total, sync.partials);
    if p.local_finalize != 0 {
        let tile = block_idx_x() % g.tiles;
        group_barrier(sync.barrier.add(tile as usize), g.chunks, w.chunk == 0);
        tile_finalize::<KV>(g, tile, w.chunk == 0, sync.partials, &merge, &finish);
        if !w.active {
            return [[0.0; 4]; KV];
        }
        let first = w.f0 - (tile << (g.tile_vectors_log2 + KV.trailing_zeros()));
        // SAFETY: `tile_finalize` left the tile's coefficients there, behind its barrier.
        core::array::from_fn(|e| {
            ld_shared_v4(dynamic_smem() + 16 * (first + e as u32)).map(f32::from_bits)
        })
    } else {
        grid_barrier(sync.barrier);
        let mut f = block_idx_x();
        while f < g.features {
            let t = block_feature_total(f, g.features, g.chunks, sync.partials, &merge);
            if thread_idx_x() == 0 {
                *sync.coef.add(f as usize) = finish(f, t, true);
            }
            f += grid_dim_x();
        }
        grid_barrier(sync.barrier);
        if !w.active {
            return [[0.0; 4]; KV];
        }
        core::array::from_fn(|e| coef_of(sync.coef, w.f0 + e as u32))
    }
}

/// Every block of tile `tile` finalizes the tile's features itself (after the tile's
/// barrier), so no second barrier is needed: the tile's `tile_vectors * KV` features get
/// `lanes = min(32, BN_BLOCK_THREADS / (tile_vectors * KV))` threads each; thread `t` merges the
/// chunks `t % lanes, + lanes, ..` of feature `t / lanes` ([`chunks_total`]), the lanes of
/// a feature merge by a butterfly, and the first leaves `finish(f, total, write)` in the
/// block's shared memory, at `16 *` the feature's index in the tile (the reduction
/// scratch, free again after the barrier). Ends with a block barrier. Every thread of the
/// block calls it.
///
/// # Safety
/// `partials` holds the tile's partials of all `g.chunks` chunks.
#[inline(always)]
unsafe fn tile_finalize<const KV: usize>(
    g: &BatchNormGeometry,
    tile: u32,
    write: bool,
    partials: *const BatchNormPartial,
    merge: &impl Fn(Total, Total) -> Total,
    finish: &impl Fn(u32, Total, bool) -> BatchNormCoef,
) {
    // Features per tile and threads per feature (the block shared out over the features,
    // at most a warp: the butterfly's width), powers of two; threads past the tile's
    // features (narrow tiles of a few features) only join the butterfly.
    let per_tile_log2 = g.tile_vectors_log2 + KV.trailing_zeros();
    let lanes_log2 = (BN_BLOCK_THREADS.trailing_zeros() - per_tile_log2).min(5);
    let t = thread_idx_x();
    let (i, lane) = (t >> lanes_log2, t & ((1 << lanes_log2) - 1));
    let f = (tile << per_tile_log2) + i;
    let mine = i < 1 << per_tile_log2 && f < g.features;
    let mut total = Total::EMPTY;
    if mine {
        let range = (lane, g.chunks, 1 << lanes_log2);
        total = chunks_total::<4>(f, g.features, range, partials, merge);
    }
    let total = butterfly(total, 1 << lanes_log2, merge);
    if lane == 0 && mine {
        let c = finish(f, total, write).0.map(f32::to_bits);
        // SAFETY: 16 * i < 16 * BN_BLOCK_THREADS <= BN_COLS_SHARED_BYTES, the scratch.
        st_shared_v4(dynamic_smem() + 16 * i, c);
    }
    sync_threads_divergent();
}

/// The training forward in one launch ([`BatchNormResidentParams`]): stats, finalize
/// ([`resident_coefficients`]: behind a barrier of the tile or of the grid), apply. Each
/// thread's first rows are copied to shared memory (`cp.async`, no registers held) while
/// it reduces the rest straight from memory, so those rows are read from memory once;
/// it reduces the copied ones in two passes over shared memory ([`kept_moments`]).
///
/// # Safety
/// As `batch_norm_fwd_resident_cols_*`.
#[inline(always)]
unsafe fn fwd_resident_cols<T: Element, const KV: usize>(
    p: &BatchNormResidentParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
    partials: *mut BatchNormPartial,
    coef: *mut BatchNormCoef,
    barrier: *mut u32,
) {
    let (ap, fp) = (&p.fused.apply, &p.fused.finalize);
    let g = &ap.geo;
    let (w, order) = resident_work::<KV>(p, block_idx_x());
    let row = #[inline(always)]
    |r: u32| order.row(r);
    let stash = Stash::of(g, &w);
    // The thread's rows kept on chip, and those read from memory twice (resident_rows is
    // a multiple of the step, so both are progressions of the same step, or the whole
    // chunk, and none are streamed).
    let kept = (
        w.first,
        core::cmp::min(w.end, w.first + p.resident_rows),
        w.step,
    );
    let streamed = (w.first + p.resident_rows, w.end, w.step);
    let base = g.feat.offsets(w.f0);
    let x_at = |r: u32| base[X] + g.red.offsets(row(r))[X];
    let mut acc = Acc::<KV>::EMPTY;
    if w.active {
        let mut r = kept.0;
        while r < kept.1 {
            // SAFETY: the stash slot lies in the launch's dynamic shared memory (the host
            // sizes it for resident_rows rows); x's vector is 16 bytes, 16-byte aligned.
            cp_async_16(stash.at(r), io.x.add(x_at(r) as usize) as *const u8, 16);
            r += kept.2;
        }
        cp_async_commit();
        absorb_cols::<T, KV, FWD_UNROLL>(streamed, &mut acc, |r| {
            load_raw::<T, KV>(io.x, x_at(r), true)
        });
        cp_async_wait(0);
        let on_chip = kept_moments::<T, KV>(kept, |r| ld_shared_v4(stash.at(r)));
        acc = merge_moments(acc, on_chip);
    }
    let total = cols_reduce(g, acc, merge_moments);
    let finish = #[inline(always)]
    |f: u32, t: Total, write: bool| fwd_feature(fp, f, t, out, write);
    let sync = Sync {
        partials,
        coef,
        barrier,
    };
    let coefs = resident_coefficients(p, &w, total, sync, merge_total_moments, finish);
    if !w.active {
        return;
    }
    let c: [[f32; 3]; KV] = coefs.map(|c| [c[0], c[2], c[3]]);
    let load_x = x_from_memory::<T, KV>(io);
    fwd_apply::<T, KV, FWD_UNROLL>(ap, io, streamed, mirror_of(streamed), base, row, &c, load_x);
    let from_stash = |r: u32, _: [u64; 6]| ld_shared_v4(stash.at(r));
    fwd_apply::<T, KV, 1>(ap, io, kept, 0, base, row, &c, from_stash);
}

/// The backward training pass in one launch ([`BatchNormResidentParams`], backward): the
/// gradient sums, finalize (with the saved statistics; [`resident_coefficients`]), apply.
/// Each thread keeps two vectors of its first rows in shared memory, `x` and the gradient
/// reaching the normalization, so those rows are read once: `x` and `dy` are copied
/// (`cp.async`) while it sums the other rows straight from memory; behind a relu, the
/// rows' `y` then masks `dy` in place into `g` (exact in `T`). With
/// [`bn_flags::WRITE_GRAD`] (add + relu, blend 1 and 0) the sums also store every row's
/// `g` as `dz`, its final value, and the apply reads the other rows' `g` back from `dz`
/// instead of `dy` and `y`.
///
/// # Safety
/// As `batch_norm_bwd_resident_cols_*`.
#[inline(always)]
unsafe fn bwd_resident_cols<T: Element, const KV: usize>(
    p: &BatchNormResidentParams,
    io: BwdIo<T>,
    out: &BwdStatsOut,
    partials: *mut BatchNormPartial,
    coef: *mut BatchNormCoef,
    barrier: *mut u32,
) {
    let (ap, fp) = (&p.fused.apply, &p.fused.finalize);
    let g = &ap.geo;
    let relu = Relu::of(ap.flags, io.mask);
    let grad_in_dz = ap.flags & bn_flags::WRITE_GRAD != 0;
    let (w, order) = resident_work::<KV>(p, block_idx_x());
    let row = #[inline(always)]
    |r: u32| order.row(r);
    let stash = Stash::of(g, &w);
    // The stashed operands' regions: x, then g (dy without a relu); with the relu mask,
    // then each vector's word of the mask (the kept rows' bits arrive with their x, dy).
    let region = p.resident_rows << stash.row_log2;
    let kept = (
        w.first,
        core::cmp::min(w.end, w.first + p.resident_rows),
        w.step,
    );
    let streamed = (w.first + p.resident_rows, w.end, w.step);
    let base = g.feat.offsets(w.f0);
    let at = #[inline(always)]
    |r: u32| plus(base, g.red.offsets(row(r)));
    // SAFETY (every shared access below): the stash slots lie in the launch's dynamic
    // shared memory (sized by the host for resident_rows rows of the two stashed
    // operands, and with the relu mask of their mask words); each vector is 16 bytes,
    // 16-byte aligned, each word 4-byte aligned; only this thread uses them.
    let from_stash = #[inline(always)]
    |r: u32, _: [u64; 6]| -> BwdLoad {
        let s = stash.at(r);
        [ld_shared_v4(s), ld_shared_v4(s + region), [0; 4]]
    };
    let mut acc = Acc::<KV>::EMPTY;
    if w.active {
        let mean: [f32; KV] = core::array::from_fn(|e| {
            *out.saved_mean
                .add(g.feat.offsets(w.f0 + e as u32)[PARAM] as usize)
        });
        // One row's inputs into the sums (and with WRITE_GRAD its g into dz); returns g.
        // A kept row's dz is not read again (the apply takes g from the stash): a
        // streaming store, leaving L2 to the streamed rows' dz and x, which it reads.
        let add = #[inline(always)]
        |acc: &mut Acc<KV>, r: u32, v: BwdLoad, kept: bool| -> [f32; KV] {
            let (gr, xv) = grads::<T, KV>(relu, v);
            if grad_in_dz && kept {
                store_last::<T, KV>(io.dz, at(r)[DZ], gr);
            } else if grad_in_dz {
                store::<T, KV>(io.dz, at(r)[DZ], gr);
            }
            let gx = core::array::from_fn(|e| gr[e] * (xv[e] - mean[e]));
            acc.add_grads(1.0, gr, gx);
            gr
        };
        // The kept rows' x and dy (and mask words), all in flight at once while the other
        // rows are summed.
        let mut r = kept.0;
        while r < kept.1 {
            let (s, o) = (stash.at(r), at(r));
            cp_async_16(s, io.x.add(o[X] as usize) as *const u8, 16);
            cp_async_16(s + region, io.dy.add(o[Z_OR_DY] as usize) as *const u8, 16);
            if relu == Relu::FromBits {
                // The mask's 4-byte word holding bits o .. o + KV (o % KV == 0: the
                // vector is 16-byte aligned, so they do not straddle words).
                let word = io.mask.add((o[X] / 32) as usize) as *const u8;
                cp_async_ca::<4>(stash.word_at(r, 2, region), word, 4);
            }
            r += kept.2;
        }
        cp_async_commit();
        visit::<BWD_UNROLL, BwdLoad, _>(
            streamed,
            &mut acc,
            #[inline(always)]
            |r| {
                // With WRITE_GRAD the apply reads g from dz: dy and the relu's input are
                // read here for the last time (streaming loads), x is read again.
                let o = at(r);
                [
                    load_ro::<T, KV>(false, io.x, o[X]),
                    load_ro::<T, KV>(grad_in_dz, io.dy, o[Z_OR_DY]),
                    load_relu::<T, KV>(relu, grad_in_dz, io.y, io.mask, o),
                ]
            },
            #[inline(always)]
            |acc, r, v| {
                crate::unrolled!(u in BWD_UNROLL => {
                    add(acc, r + u as u32 * w.step, v[u], false);
                });
            },
            #[inline(always)]
            |acc, r, v| {
                add(acc, r, v, false);
            },
        );
        if relu == Relu::FromY {
            // The kept rows' y from memory (a few rows in flight): the stash's dy becomes
            // g. (Only the first wait has copies to wait for.)
            let keep = #[inline(always)]
            |acc: &mut Acc<KV>, r: u32, yv: Vec16| {
                cp_async_wait(0);
                let [xv, dyv, _] = from_stash(r, [0; 6]);
                let gr = add(acc, r, [xv, dyv, yv], true);
                st_shared_v4(stash.at(r) + region, T::pack::<KV>(gr));
            };
            visit::<KEPT_MASK_UNROLL, Vec16, _>(
                kept,
                &mut acc,
                #[inline(always)]
                |r| load_relu::<T, KV>(relu, false, io.y, io.mask, at(r)),
                #[inline(always)]
                |acc, r, v| {
                    crate::unrolled!(u in KEPT_MASK_UNROLL => {
                        keep(acc, r + u as u32 * w.step, v[u])
                    });
                },
                keep,
            );
        } else {
            cp_async_wait(0);
            let mut r = kept.0;
            while r < kept.1 {
                let [xv, dyv, _] = from_stash(r, [0; 6]);
                if relu == Relu::FromBits {
                    let word = ld_shared_u32(stash.word_at(r, 2, region));
                    let bits = (word >> (at(r)[X] % 32)) & ((1 << KV) - 1);
                    let gr = add(&mut acc, r, [xv, dyv, [bits, 0, 0, 0]], true);
                    st_shared_v4(stash.at(r) + region, T::pack::<KV>(gr));
                } else {
                    add(&mut acc, r, [xv, dyv, [0; 4]], true);
                }
                r += kept.2;
            }
        }
    }
    let total = cols_reduce(g, acc, merge_sums);
    let finish = #[inline(always)]
    |f: u32, t: Total, write: bool| bwd_feature(fp, f, t, out, write);
    let sync = Sync {
        partials,
        coef,
        barrier,
    };
    let c = resident_coefficients(p, &w, total, sync, merge_total_sums, finish);
    if !w.active {
        return;
    }
    // The apply of the rows whose g is at hand (stashed, or in dz): no mask, and no dz to
    // write where WRITE_GRAD wrote it.
    let written = if grad_in_dz { bn_flags::ADD } else { 0 };
    let on_g = BatchNormApplyParams {
        flags: ap.flags & !(bn_flags::RELU | written),
        ..*ap
    };
    if grad_in_dz {
        // SAFETY: dz at these offsets was written by this thread in the sums above;
        // vectors of 16 bytes, 16-byte aligned (the host's vector width covers dz).
        let from_dz = #[inline(always)]
        |_: u32, o: [u64; 6]| -> BwdLoad {
            let dz = io.dz.add(o[DZ] as usize) as *const u32;
            [
                load_last::<T, KV>(io.x, o[X]),
                device::ld_global_cs_v4(dz),
                [0; 4],
            ]
        };
        let streamed_mirror = mirror_of(streamed);
        bwd_apply::<T, KV, BWD_UNROLL>(
            &on_g,
            io,
            streamed,
            streamed_mirror,
            base,
            row,
            &c,
            from_dz,
        );
    } else {
        let from_memory = bwd_from_memory::<T, KV>(ap, io);
        bwd_apply::<T, KV, BWD_UNROLL>(
            ap,
            io,
            streamed,
            mirror_of(streamed),
            base,
            row,
            &c,
            from_memory,
        );
    }
    bwd_apply::<T, KV, 1>(&on_g, io, kept, 0, base, row, &c, from_stash);
}

// ---------------------------------------------------------------------------------------
// Pipelined training passes (one cooperative launch, rows mapping)
// ---------------------------------------------------------------------------------------

/// A task of a pipelined pass: chunk `chunk` of feature `f`, its stats or its apply.
#[derive(Clone, Copy)]
struct Task {
    apply: bool,
    f: u32,
    chunk: u32,
}

/// Task `t` of the pipelined order ([`BatchNormPipelinedParams`]) over `features` features
/// of `chunks` chunks with the stats `lookahead` features ahead: `2 * features` units of
/// `chunks` tasks, the stats of features `0 .. lookahead`, then stats of `lookahead + k`
/// and apply of `k` in turn, then the applies of the last `lookahead` features.
#[inline(always)]
fn pipelined_task(t: u32, features: u32, chunks: u32, lookahead: u32) -> Task {
    let (unit, chunk) = (t / chunks, t % chunks);
    let paired = 2 * (features - lookahead);
    let (apply, f) = match unit.checked_sub(lookahead) {
        None => (false, unit),
        Some(k) if k < paired && k % 2 == 0 => (false, lookahead + k / 2),
        Some(k) if k < paired => (true, k / 2),
        Some(k) => (true, features - lookahead + (k - paired)),
    };
    Task { apply, f, chunk }
}

/// The task loop of a pipelined training pass ([`BatchNormPipelinedParams`]): the block's
/// tasks in order. A stats task's block total, `stats(work)` (every thread of the block
/// calls it), becomes its partial and is counted in its feature's word; the block whose
/// task completes a feature has its warp 0 call `finish(f)` (the whole warp, over the
/// feature's partials; lane 0's coefficient is stored) and count once more. An apply task
/// waits for that count, then calls `apply(work, f, coefficient)`. The last block done
/// sets the counters back to 0.
///
/// # Safety
/// As the pipelined entry points: a cooperative launch, `partials` and `coef` as the
/// stats and finalize kernels', `counters` the handle's counter state.
#[inline(always)]
unsafe fn pipelined_rows(
    g: &BatchNormGeometry,
    lookahead: u32,
    (partials, coef, counters): (*mut BatchNormPartial, *mut BatchNormCoef, *mut u32),
    stats: impl Fn(&Work) -> Acc<1>,
    finish: impl Fn(u32) -> BatchNormCoef,
    apply: impl Fn(&Work, u32, [f32; 4]),
) {
    let (features, chunks) = (g.features, g.chunks);
    // Feature f's count: its completed stats tasks, plus one once it is finalized.
    let count = |f: u32| counters.add(1 + f as usize);
    let finalized = chunks + 1;
    // Slot 0: whether this block's stats task completed its feature; slot 1: whether the
    // block is the last one done. Each written by thread 0 between two barriers.
    let flags = crate::shared_f32!(16).base;
    let tasks = 2 * features * chunks;
    let mut t = block_idx_x();
    while t < tasks {
        let task = pipelined_task(t, features, chunks, lookahead);
        let w = rows_work(g, task.f * chunks + task.chunk);
        if task.apply {
            if thread_idx_x() == 0 {
                // SAFETY: the feature's word of the counter state; its stats tasks come
                // before this task in every block's order, so they run (the blocks are
                // resident at once) and the block that finalizes it counts to `finalized`.
                while ld_acquire_u32(count(task.f)) != finalized {}
                // Acquires the finalizing block's coefficient for the whole block (the
                // barrier below).
                thread_fence();
            }
            sync_threads_divergent();
            apply(&w, task.f, coef_of(coef, task.f));
        } else {
            let total = stats(&w);
            if thread_idx_x() == 0 {
                let at = task.chunk * features + task.f;
                write_partial(partials, at, total.n, total.a[0], total.b[0]);
                // Releases the partial before the count; the last count acquires every
                // other block's partial of the feature (read by warp 0 below).
                thread_fence();
                let last = atomic_add_u32(count(task.f), 1) == chunks - 1;
                thread_fence();
                // SAFETY: slot 0 of `flags`; the barriers of the next stats task's
                // reduction keep the next write behind this task's reads.
                st_shared_u32(flags, last as u32);
            }
            sync_threads_divergent();
            if ld_shared_u32(flags) != 0 && warp_id() == 0 {
                let c = finish(task.f);
                if lane_id() == 0 {
                    *coef.add(task.f as usize) = c;
                    thread_fence();
                    atomic_add_u32(count(task.f), 1);
                }
            }
        }
        t += grid_dim_x();
    }
    // Every block counts itself done once it no longer touches the counters (thread 0,
    // which made the block's counts, after them); the last one zeroes them all.
    sync_threads_divergent();
    if thread_idx_x() == 0 {
        thread_fence();
        let last = atomic_add_u32(counters, 1) == grid_dim_x() - 1;
        // SAFETY: slot 1 of `flags`, read after the barrier below.
        st_shared_u32(flags + 4, last as u32);
    }
    sync_threads_divergent();
    if ld_shared_u32(flags + 4) != 0 {
        let mut i = thread_idx_x();
        while i <= features {
            // SAFETY: words 0 ..= features of the counter state; no other block touches
            // them any more in this launch.
            *counters.add(i as usize) = 0;
            i += block_dim_x();
        }
    }
}

/// The forward training pass of a rows problem in one cooperative launch
/// ([`pipelined_rows`]): each feature's moments, finalized as the finalize kernel does,
/// then its apply, which finds most of the feature's `x` still in L2.
///
/// # Safety
/// As `batch_norm_fwd_pipelined_rows_*`.
#[inline(always)]
unsafe fn fwd_pipelined_rows<T: Element, const KV: usize>(
    p: &BatchNormPipelinedParams,
    io: FwdIo<T>,
    out: &FwdStatsOut,
    sync: (*mut BatchNormPartial, *mut BatchNormCoef, *mut u32),
) {
    let (ap, fp) = (&p.fused.apply, &p.fused.finalize);
    let g = &ap.geo;
    pipelined_rows(
        g,
        p.lookahead,
        sync,
        #[inline(always)]
        |w| fwd_moments_rows::<T, KV>(g, io.x, w),
        #[inline(always)]
        |f| {
            let t = feature_total(f, g.features, g.chunks, sync.0, merge_total_moments);
            fwd_feature(fp, f, t, out, lane_id() == 0)
        },
        #[inline(always)]
        |w, f, c| {
            let c = [[c[0], c[2], c[3]]; KV];
            let load_x = x_from_memory::<T, KV>(io);
            let base = g.feat.offsets(f);
            fwd_apply::<T, KV, FWD_UNROLL>(
                ap,
                io,
                w.range(),
                0,
                base,
                vector_start::<KV>,
                &c,
                load_x,
            );
        },
    );
}

/// The backward training pass of a rows problem in one cooperative launch
/// ([`pipelined_rows`]), with the saved statistics: each feature's gradient sums,
/// finalized as the finalize kernel does (`dscale`, `dbias`), then its apply, which finds
/// most of the feature's `x` and `dy` still in L2.
///
/// # Safety
/// As `batch_norm_bwd_pipelined_rows_*`.
#[inline(always)]
unsafe fn bwd_pipelined_rows<T: Element, const KV: usize>(
    p: &BatchNormPipelinedParams,
    io: BwdIo<T>,
    out: &BwdStatsOut,
    sync: (*mut BatchNormPartial, *mut BatchNormCoef, *mut u32),
) {
    let (ap, fp) = (&p.fused.apply, &p.fused.finalize);
    let g = &ap.geo;
    // The relu mask of the apply flags; the mean from the saved statistics.
    let sp = BatchNormStatsParams {
        geo: *g,
        flags: ap.flags & bn_flags::RELU,
        _pad: 0,
        relu_mask: ap.relu_mask,
    };
    pipelined_rows(
        g,
        p.lookahead,
        sync,
        // `dz` is not written here (no WRITE_GRAD) and `stats` not read (no
        // STATS_IN_WORKSPACE): run-time pointers, as in `bwd_fused_rows`.
        #[inline(always)]
        |w| bwd_sums_rows::<T, KV>(&sp, io.x, io.y, io.dy, io.dz, out.stats, out.saved_mean, w),
        #[inline(always)]
        |f| {
            let t = feature_total(f, g.features, g.chunks, sync.0, merge_total_sums);
            bwd_feature(fp, f, t, out, lane_id() == 0)
        },
        #[inline(always)]
        |w, f, c| {
            let load = bwd_from_memory::<T, KV>(ap, io);
            let base = g.feat.offsets(f);
            bwd_apply::<T, KV, BWD_UNROLL>(
                ap,
                io,
                w.range(),
                0,
                base,
                vector_start::<KV>,
                &[c; KV],
                load,
            );
        },
    );
}

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

/// Calls `$f::<$T, K>(args)` with `K` = 1 (scalar) or a 16-byte vector of `$T`, as the
/// geometry's `vector` says.
macro_rules! by_width {
    ($T:ty, $vector:expr, $f:ident($($arg:expr),* $(,)?)) => {
        if $vector == 1 {
            $f::<$T, 1>($($arg),*)
        } else {
            $f::<$T, { 16 / size_of::<$T>() }>($($arg),*)
        }
    };
}

/// A forward apply pass's entry point of dtype `$T`: `$mapping` (`fwd_apply_rows` or
/// `fwd_apply_cols`) with the relu mask `$mask(&p)`. The plain entry points take a null
/// constant, so the mask's code folds away and does not cost inference its registers;
/// the masked ones serve training with a reserve space.
macro_rules! fwd_apply_entry_point {
    ($T:ty, $name:ident, $mapping:ident, $epilogues:expr, $doc:literal, $mask:expr) => {
        /// # Safety
        /// `x`, `z` (with `ADD`), `y` cover their tensors; `coef` holds `features`
        /// coefficients, or (with `COEF_FROM_PARAMS`) `scale`, `bias`, `mean`, `var`
        /// cover the per-feature tensor.
        #[doc = $doc]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            p: BatchNormApplyParams,
            x: *const $T,
            z: *const $T,
            y: *mut $T,
            coef: *const BatchNormCoef,
            scale: *const f32,
            bias: *const f32,
            mean: *const f32,
            var: *const f32,
        ) {
            let io = FwdIo {
                x,
                z,
                y,
                mask: ($mask)(&p),
            };
            match $epilogues {
                Epilogues::Plain => by_width!(
                    $T,
                    p.geo.vector,
                    $mapping(&with_plain_epilogue(&p), io, coef, scale, bias, mean, var)
                ),
                Epilogues::Any => by_width!(
                    $T,
                    p.geo.vector,
                    $mapping(&p, io, coef, scale, bias, mean, var)
                ),
            }
        }
    };
}

/// A staged forward's entry point of dtype `$T`: `$body` (`fwd_staged_rows` or
/// `fwd_staged_unrolled_rows`), with the relu mask of the parameters if `$masked`, else a
/// null constant, so that the mask's code folds away, and its registers. (Laid out as the
/// entry points in `batch_norm_entry_points!`.)
#[rustfmt::skip]
macro_rules! fwd_staged_entry_point {
    ($T:ty, $name:ident, $body:ident, $doc:literal, $masked:literal) => {
        /// # Safety
        /// As `batch_norm_fwd_fused_rows_*`, with vectors of 4 bytes or more and
        /// `chunk_len * vector * size_of::<T>()` bytes of dynamic shared memory (16-byte
        /// aligned).
        #[doc = $doc]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            p: BatchNormFusedParams, x: *const $T, z: *const $T, y: *mut $T,
            scale: *const f32, bias: *const f32, running_mean: *mut f32,
            running_var: *mut f32, saved_mean: *mut f32, saved_inv_std: *mut f32,
        ) {
            let mask = if $masked { p.apply.relu_mask as *mut u32 } else { core::ptr::null_mut() };
            let io = FwdIo { x, z, y, mask };
            let out = FwdStatsOut { scale, bias, running_mean, running_var, saved_mean, saved_inv_std };
            by_width!($T, p.apply.geo.vector, $body(&p, io, &out))
        }
    };
}

macro_rules! batch_norm_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `x` covers the tensor `p.geo` describes; `partials` holds `chunks *
            /// features` entries. Rows mapping: `features * chunks` blocks.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_fwd_stats_rows_ $dt>](
                p: BatchNormStatsParams, x: *const $T, partials: *mut BatchNormPartial,
            ) {
                by_width!($T, p.geo.vector, fwd_stats_rows(&p, x, partials))
            }

            /// # Safety
            /// As the rows kernel; cols mapping: `tiles * chunks` blocks of at most
            /// `BN_BLOCK_THREADS` with `BN_COLS_SHARED_BYTES` of dynamic shared memory.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_fwd_stats_cols_ $dt>](
                p: BatchNormStatsParams, x: *const $T, partials: *mut BatchNormPartial,
            ) {
                by_width!($T, p.geo.vector, fwd_stats_cols(&p, x, partials))
            }

            /// # Safety
            /// `x`, `y` (with `RELU`), `dy`, `dz` (with `WRITE_GRAD`) cover their tensors;
            /// `coef` (with `STATS_IN_WORKSPACE`) holds `features` coefficients, else
            /// `saved_mean` covers the per-feature tensor; `partials` as for the forward
            /// kernels.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_stats_rows_ $dt>](
                p: BatchNormStatsParams, x: *const $T, y: *const $T, dy: *const $T,
                dz: *mut $T, coef: *const BatchNormCoef, saved_mean: *const f32,
                partials: *mut BatchNormPartial,
            ) {
                by_width!($T, p.geo.vector, bwd_stats_rows(&p, x, y, dy, dz, coef, saved_mean, partials))
            }

            /// # Safety
            /// As `batch_norm_bwd_stats_rows_*`, cols mapping (with
            /// `BN_COLS_SHARED_BYTES` of dynamic shared memory).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_stats_cols_ $dt>](
                p: BatchNormStatsParams, x: *const $T, y: *const $T, dy: *const $T,
                dz: *mut $T, coef: *const BatchNormCoef, saved_mean: *const f32,
                partials: *mut BatchNormPartial,
            ) {
                by_width!($T, p.geo.vector, bwd_stats_cols(&p, x, y, dy, dz, coef, saved_mean, partials))
            }

            fwd_apply_entry_point!($T, [<batch_norm_fwd_apply_rows_ $dt>], fwd_apply_rows,
                Epilogues::Any, "Rows mapping.", |_p| core::ptr::null_mut());
            fwd_apply_entry_point!($T, [<batch_norm_fwd_apply_cols_ $dt>], fwd_apply_cols,
                Epilogues::Any, "Cols mapping.", |_p| core::ptr::null_mut());
            fwd_apply_entry_point!($T, [<batch_norm_fwd_apply_plain_cols_ $dt>], fwd_apply_cols,
                Epilogues::Plain, "Cols mapping, for the plain epilogue alone (`alpha = 1`, \
                `beta = 0`, no `ADD`, no `RELU`; the flags and the blend factors are not read).",
                |_p| core::ptr::null_mut());
            fwd_apply_entry_point!($T, [<batch_norm_fwd_apply_masked_rows_ $dt>], fwd_apply_rows,
                Epilogues::Any, "Rows mapping; with `RELU`, also writes the relu mask to `p.relu_mask` (a bit \
                per element of `x`'s span, 4-byte aligned).",
                |p: &BatchNormApplyParams| p.relu_mask as *mut u32);
            fwd_apply_entry_point!($T, [<batch_norm_fwd_apply_masked_cols_ $dt>], fwd_apply_cols,
                Epilogues::Any, "Cols mapping; as the masked rows kernel for the relu mask.",
                |p: &BatchNormApplyParams| p.relu_mask as *mut u32);

            /// # Safety
            /// `x`, `y` (with `RELU`), `dy`, `dx`, `dz` (with `ADD`) cover their tensors;
            /// `coef` holds `features` backward coefficients.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_apply_rows_ $dt>](
                p: BatchNormApplyParams, x: *const $T, y: *const $T, dy: *const $T,
                dx: *mut $T, dz: *mut $T, coef: *const BatchNormCoef,
            ) {
                let io = BwdIo { x, y, dy, dx, dz, mask: p.relu_mask as *const u32 };
                by_width!($T, p.geo.vector, bwd_apply_rows(&p, io, coef))
            }

            /// # Safety
            /// As `batch_norm_bwd_apply_rows_*`, cols mapping.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_apply_cols_ $dt>](
                p: BatchNormApplyParams, x: *const $T, y: *const $T, dy: *const $T,
                dx: *mut $T, dz: *mut $T, coef: *const BatchNormCoef,
            ) {
                let io = BwdIo { x, y, dy, dx, dz, mask: p.relu_mask as *const u32 };
                by_width!($T, p.geo.vector, bwd_apply_cols(&p, io, coef))
            }
            /// # Safety
            /// The pointers of the forward stats, finalize and apply kernels together (`z`
            /// with `ADD`). Rows mapping with one chunk: a block per feature
            /// (`features` blocks).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_fwd_fused_rows_ $dt>](
                p: BatchNormFusedParams, x: *const $T, z: *const $T, y: *mut $T,
                scale: *const f32, bias: *const f32, running_mean: *mut f32,
                running_var: *mut f32, saved_mean: *mut f32, saved_inv_std: *mut f32,
            ) {
                let io = FwdIo { x, z, y, mask: p.apply.relu_mask as *mut u32 };
                let out = FwdStatsOut { scale, bias, running_mean, running_var, saved_mean, saved_inv_std };
                by_width!($T, p.apply.geo.vector, fwd_fused_rows(&p, io, &out))
            }

            fwd_staged_entry_point!($T, [<batch_norm_fwd_staged_rows_ $dt>], fwd_staged_rows,
                "Writes no relu mask (`p.apply.relu_mask` is not read).", false);
            fwd_staged_entry_point!($T, [<batch_norm_fwd_staged_masked_rows_ $dt>],
                fwd_staged_rows,
                "With `RELU`, also writes the relu mask to `p.apply.relu_mask` (a bit per \
                element of `x`'s span, 4-byte aligned).", true);

            /// # Safety
            /// The pointers of the backward stats, finalize and apply kernels together
            /// (statistics from `saved_mean`, `saved_inv_std`; `y` with `RELU`, `dz` with
            /// `ADD`). Rows mapping with one chunk: a block per feature.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_fused_rows_ $dt>](
                p: BatchNormFusedParams, x: *const $T, y: *const $T, dy: *const $T,
                dx: *mut $T, dz: *mut $T, scale: *const f32, saved_mean: *const f32,
                saved_inv_std: *const f32, dscale: *mut f32, dbias: *mut f32,
            ) {
                let io = BwdIo { x, y, dy, dx, dz, mask: p.apply.relu_mask as *const u32 };
                // `stats` is never read (no STATS_IN_WORKSPACE): any run-time pointer.
                let stats = saved_mean as *const BatchNormCoef;
                let out = BwdStatsOut { scale, saved_mean, saved_inv_std, stats, dscale, dbias };
                by_width!($T, p.apply.geo.vector, bwd_fused_rows(&p, io, &out))
            }
        }
    };
}

crate::for_each_dtype!(batch_norm_entry_points);

// The unrolled masked staged forward, in f32 only: the dtype it was measured for (NCHW
// 512x28x28, two blocks of 100 KB an SM). A 16-bit channel would take it only from about
// 76 KB, which no bench or test shape reaches; the host runs the masked kernel where a
// dtype has no unrolled one.
fwd_staged_entry_point!(
    f32,
    batch_norm_fwd_staged_masked_unrolled_rows_f32,
    fwd_staged_unrolled_rows,
    "As the masked kernel, applying four vectors at a time.",
    true
);

macro_rules! batch_norm_resident_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// The pointers of the forward stats, finalize and apply kernels together (`z`
            /// with `ADD`; `partials` holds `chunks * features` entries, `coef`
            /// `features`); `barrier` as `device::grid_barrier` requires. A cooperative
            /// launch of `tiles * chunks` blocks of `BN_BLOCK_THREADS` with
            /// `BN_COLS_SHARED_BYTES + 16 * resident_rows * tile_vectors` bytes of dynamic
            /// shared memory; 16-byte vectors (`geo.vector > 1`).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_fwd_resident_cols_ $dt>](
                p: BatchNormResidentParams, x: *const $T, z: *const $T, y: *mut $T,
                scale: *const f32, bias: *const f32, running_mean: *mut f32,
                running_var: *mut f32, saved_mean: *mut f32, saved_inv_std: *mut f32,
                partials: *mut BatchNormPartial, coef: *mut BatchNormCoef, barrier: *mut u32,
            ) {
                let io = FwdIo { x, z, y, mask: p.fused.apply.relu_mask as *mut u32 };
                let out = FwdStatsOut { scale, bias, running_mean, running_var, saved_mean, saved_inv_std };
                fwd_resident_cols::<$T, { 16 / size_of::<$T>() }>(&p, io, &out, partials, coef, barrier)
            }

            /// # Safety
            /// The pointers of the backward stats, finalize and apply kernels together
            /// (statistics from `saved_mean`, `saved_inv_std`; `y` with `RELU`, `dz` with
            /// `ADD`; `partials` holds `chunks * features` entries, `coef` `features`);
            /// `barrier` as `device::grid_barrier` requires. A cooperative launch as the
            /// forward's, with `BN_COLS_SHARED_BYTES + resident_rows * tile_vectors * s`
            /// bytes of dynamic shared memory, `s` = 36 with `RELU` and the relu mask
            /// (x, g and a mask word per vector), else 32; the mask 4-byte aligned.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_resident_cols_ $dt>](
                p: BatchNormResidentParams, x: *const $T, y: *const $T, dy: *const $T,
                dx: *mut $T, dz: *mut $T, scale: *const f32, saved_mean: *const f32,
                saved_inv_std: *const f32, dscale: *mut f32, dbias: *mut f32,
                partials: *mut BatchNormPartial, coef: *mut BatchNormCoef, barrier: *mut u32,
            ) {
                let io = BwdIo { x, y, dy, dx, dz, mask: p.fused.apply.relu_mask as *const u32 };
                // `stats` is never read (no STATS_IN_WORKSPACE): any run-time pointer.
                let stats = saved_mean as *const BatchNormCoef;
                let out = BwdStatsOut { scale, saved_mean, saved_inv_std, stats, dscale, dbias };
                bwd_resident_cols::<$T, { 16 / size_of::<$T>() }>(&p, io, &out, partials, coef, barrier)
            }
        }
    };
}

crate::for_each_dtype!(batch_norm_resident_entry_points);

/// A pipelined forward's entry point of dtype `$T` for `$epilogues`, with the relu mask
/// of the parameters if `$masked`, else a null constant (the mask's code folds away).
#[rustfmt::skip]
macro_rules! fwd_pipelined_entry_point {
    ($T:ty, $name:ident, $epilogues:expr, $doc:literal, $masked:literal) => {
        /// # Safety
        /// The pointers of the forward stats, finalize and apply kernels together (`z`
        /// with `ADD`; `partials` holds `chunks * features` entries, `coef` `features`);
        /// `counters` is the handle's counter state, words `0 ..= features` of it 0 and
        /// used by no concurrent launch. A cooperative launch of blocks of at most
        /// `BN_BLOCK_THREADS`; rows mapping.
        #[doc = $doc]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            p: BatchNormPipelinedParams, x: *const $T, z: *const $T, y: *mut $T,
            scale: *const f32, bias: *const f32, running_mean: *mut f32,
            running_var: *mut f32, saved_mean: *mut f32, saved_inv_std: *mut f32,
            partials: *mut BatchNormPartial, coef: *mut BatchNormCoef, counters: *mut u32,
        ) {
            let mask = if $masked { p.fused.apply.relu_mask as *mut u32 } else { core::ptr::null_mut() };
            let io = FwdIo { x, z, y, mask };
            let out = FwdStatsOut { scale, bias, running_mean, running_var, saved_mean, saved_inv_std };
            let mut p = p;
            if $epilogues == Epilogues::Plain {
                p.fused.apply = with_plain_epilogue(&p.fused.apply);
            }
            let sync = (partials, coef, counters);
            by_width!($T, p.fused.apply.geo.vector, fwd_pipelined_rows(&p, io, &out, sync))
        }
    };
}

macro_rules! batch_norm_pipelined_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            fwd_pipelined_entry_point!($T, [<batch_norm_fwd_pipelined_rows_ $dt>], Epilogues::Any,
                "Any epilogue; with `RELU`, writes the relu mask where `p.fused.apply.relu_mask` \
is not 0 (a bit per element of `x`'s span, 4-byte aligned).", true);
            fwd_pipelined_entry_point!($T, [<batch_norm_fwd_pipelined_plain_rows_ $dt>],
                Epilogues::Plain, "The plain epilogue alone (`alpha = 1`, `beta = 0`, no `ADD`, \
no `RELU`; the flags and the blend factors are not read).", false);

            /// # Safety
            /// The pointers of the backward stats, finalize and apply kernels together
            /// (statistics from `saved_mean`, `saved_inv_std`; `y` with `RELU` where
            /// `p.fused.apply.relu_mask` is 0, `dz` with `ADD`; `partials` holds `chunks *
            /// features` entries, `coef` `features`); `counters` as for the forward. A
            /// cooperative launch of blocks of at most `BN_BLOCK_THREADS`; rows mapping.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<batch_norm_bwd_pipelined_rows_ $dt>](
                p: BatchNormPipelinedParams, x: *const $T, y: *const $T, dy: *const $T,
                dx: *mut $T, dz: *mut $T, scale: *const f32, saved_mean: *const f32,
                saved_inv_std: *const f32, dscale: *mut f32, dbias: *mut f32,
                partials: *mut BatchNormPartial, coef: *mut BatchNormCoef, counters: *mut u32,
            ) {
                let io = BwdIo { x, y, dy, dx, dz, mask: p.fused.apply.relu_mask as *const u32 };
                // `stats` is never read (no STATS_IN_WORKSPACE): any run-time pointer.
                let stats = saved_mean as *const BatchNormCoef;
                let out = BwdStatsOut { scale, saved_mean, saved_inv_std, stats, dscale, dbias };
                let sync = (partials, coef, counters);
                by_width!($T, p.fused.apply.geo.vector, bwd_pipelined_rows(&p, io, &out, sync))
            }
        }
    };
}

crate::for_each_dtype!(batch_norm_pipelined_entry_points);

/// # Safety
/// `partials` holds `chunks * features` entries of a forward stats pass; `coef` holds
/// `features`; the per-feature pointers cover the per-feature tensor (`scale`, `bias` may
/// be null: their coefficients are then 0; the running and saved pointers are used only
/// with their flags). One warp per feature.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn batch_norm_fwd_finalize(
    p: BatchNormFinalizeParams,
    partials: *const BatchNormPartial,
    scale: *const f32,
    bias: *const f32,
    running_mean: *mut f32,
    running_var: *mut f32,
    saved_mean: *mut f32,
    saved_inv_std: *mut f32,
    coef: *mut BatchNormCoef,
) {
    let out = FwdStatsOut {
        scale,
        bias,
        running_mean,
        running_var,
        saved_mean,
        saved_inv_std,
    };
    fwd_finalize(&p, partials, &out, coef)
}

/// # Safety
/// `partials` holds `chunks * features` entries of a backward stats pass; `stats` (with
/// `STATS_IN_WORKSPACE`) the forward coefficients, else `saved_mean` and `saved_inv_std`
/// cover the per-feature tensor, as do `scale`, `dscale`, `dbias`; `coef` holds
/// `features`. One warp per feature.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn batch_norm_bwd_finalize(
    p: BatchNormFinalizeParams,
    partials: *const BatchNormPartial,
    scale: *const f32,
    saved_mean: *const f32,
    saved_inv_std: *const f32,
    stats: *const BatchNormCoef,
    dscale: *mut f32,
    dbias: *mut f32,
    coef: *mut BatchNormCoef,
) {
    let out = BwdStatsOut {
        scale,
        saved_mean,
        saved_inv_std,
        stats,
        dscale,
        dbias,
    };
    bwd_finalize(&p, partials, &out, coef)
}
