//! The row engine of the normalisation-style families (layer/RMS norm, softmax): each row
//! of `len` elements is handled by a [`Group`] of whole warps, which loads it once into
//! registers ([`Held`]: as loaded, two 16-bit elements a register), reduces across the group
//! by shuffles (and shared memory between warps), and writes the result.
//!
//! Slot `j` (of `V` per thread) of lane `l` of warp `w` in a group of `W` warps covers, in
//! chunk `c`, the `K` elements from `(((c * W + w) * V + j) * 32 + l) * K`: every warp-wide
//! access is `32 * K` consecutive elements (512 bytes with 16-byte vectors), a thread's
//! slots are independent loads in flight together, and they lie a constant `32 * K`
//! elements apart (immediate address offsets, no address register per slot). `K` is a 16-byte vector (`Dense` rows: dense and
//! aligned in every operand) or 1 (rows through an index map). Rows that do not fit the
//! group's registers are streamed chunk by chunk (`long` kernels).

use crate::device::{
    bar_sync, block_dim_x, block_idx_x, grid_dim_x, lane_id, ld_global_nc_v4, ld_global_v4,
    ld_shared_words, max_propagate_nan, opaque_words, shfl_xor_f32, st_global_v4, st_shared_words,
    sync_threads, thread_idx_x, warp_id, warp_reduce, Vec16,
};
use crate::element::Element;
use core::cell::Cell;
use core::marker::PhantomData;
use oxidnn_params::IndexMap;

/// Elements of `T` in a 16-byte vector.
pub const fn vector_elements<T>() -> usize {
    16 / size_of::<T>()
}

/// The threads of one row: `threads` (whole warps), `per_block` groups to a block. A group
/// of one warp reduces by shuffles alone, so single-warp groups share blocks and may be at
/// different rows. A group of several warps meets, to reduce, at
/// - the block's barrier, being its whole block ([`Group::new`]), or
/// - a named barrier (id `1 + in_block`) where several share a block ([`Group::of`] with
///   `shares_blocks`). A kernel that names barriers by a register reserves all sixteen, so
///   an SM holds only four of its blocks: for kernels that registers hold to four blocks of
///   256 or fewer anyway.
///
/// The host plans the blocks to match (`RowPlan`, `Budget::groups_share_blocks`).
pub struct Group {
    /// This thread's rank in its group.
    pub rank: u32,
    pub threads: u32,
    /// Warps in the group.
    pub warps: u32,
    /// This group's index in its block, and the groups per block.
    pub in_block: u32,
    pub per_block: u32,
    /// This group's index over the grid, and the groups in the grid.
    pub index: u32,
    pub count: u32,
    /// Whether groups of several warps share blocks (named barriers). A constant where
    /// the kernel builds its group, so the other barrier's code folds away.
    shares_blocks: bool,
    /// The shared address of the reductions' scratch: two halves of 32 warp slots of 16
    /// bytes, declared where the kernel builds its group, so one array serves every
    /// reduction of the kernel (an array per call site of [`Group::reduce`], 5 KB a
    /// softmax forward block, made that kernel 4-10% slower on the H200).
    scratch: u32,
    /// Reductions this thread has made through shared memory: their parity picks the half
    /// of the scratch that [`Group::reduce`] uses.
    reductions: Cell<u32>,
}

impl Group {
    /// The group of this thread when each row has `warps` warps, a group of several warps
    /// being its whole block. Either way a thread's place needs no division: a group of
    /// one warp is a warp of its block, a larger one the block.
    #[inline(always)]
    pub fn new(warps: u32) -> Self {
        let (rank, in_block, per_block) = if warps == 1 {
            (lane_id(), warp_id(), block_dim_x() / 32)
        } else {
            (thread_idx_x(), 0, 1)
        };
        Self::placed(warps, rank, in_block, per_block, false)
    }

    /// As [`Group::new`], with several groups of several warps to a block where
    /// `shares_blocks` (a constant, shared with the host's plan).
    #[inline(always)]
    pub fn of(warps: u32, shares_blocks: bool) -> Self {
        if !shares_blocks {
            return Self::new(warps);
        }
        let threads = 32 * warps;
        let in_block = thread_idx_x() / threads;
        let rank = thread_idx_x() % threads;
        Self::placed(warps, rank, in_block, block_dim_x() / threads, true)
    }

    #[inline(always)]
    fn placed(warps: u32, rank: u32, in_block: u32, per_block: u32, shares_blocks: bool) -> Self {
        Self {
            rank,
            threads: 32 * warps,
            warps,
            in_block,
            per_block,
            index: block_idx_x() * per_block + in_block,
            count: grid_dim_x() * per_block,
            shares_blocks,
            scratch: crate::shared_f32!(1024).base,
            reductions: Cell::new(0),
        }
    }

    /// Calls `f(row)` for this group's rows (`index`, `index + count`, ..).
    #[inline(always)]
    pub fn rows(&self, rows: u32, mut f: impl FnMut(u32)) {
        let mut row = self.index;
        while row < rows {
            f(row);
            row += self.count;
        }
    }

    /// The first element of slot `j` in chunk `chunk`, for `K` elements per slot and `V`
    /// slots per thread.
    #[inline(always)]
    pub fn first<const K: usize, const V: usize>(&self, chunk: u32, j: usize) -> u32 {
        let (warp, lane) = (self.rank / 32, self.rank % 32);
        let base = ((chunk * self.warps + warp) * V as u32 * 32 + lane) * K as u32;
        base + (j * 32 * K) as u32
    }

    /// Combines `v` over the group; every thread of the group gets the result. Every
    /// thread of the group makes the same calls in the same order (uniform control flow).
    #[inline(always)]
    pub fn reduce<T: Copy>(
        &self,
        v: T,
        identity: T,
        combine: impl Fn(T, T) -> T + Copy,
        shfl: impl Fn(T, u32) -> T + Copy,
    ) -> T {
        let total = warp_reduce(v, combine, shfl);
        if self.threads == 32 {
            return total;
        }
        // Each warp's total to shared memory (one slot per warp of the block, at most 32),
        // then every thread combines its group's slots in warp order.
        let _ = identity;
        const { assert!(size_of::<T>() <= 16, "a warp's slot holds 16 bytes") };
        // Two halves of 32 slots; the group's `k`-th reduction uses half `k % 2`, so one
        // barrier a reduction is enough: a thread that writes half `h` in reduction `k`
        // has passed reduction `k - 1`'s barrier, which every thread of the group reached
        // after its reads of reduction `k - 2`, the last to use half `h`.
        let k = self.reductions.get();
        self.reductions.set(k + 1);
        let half = self.scratch + (k & 1) * 512;
        let slot = |w: u32| half + w * size_of::<T>() as u32;
        let first = self.in_block * self.warps;
        // SAFETY: warp `w` of the block writes slot `w < 32` of the half (at most 16 bytes
        // each: 512 bytes a half); the group's barrier orders those writes before the
        // group's reads, and the halves' alternation (above) keeps the next writes of a
        // half behind them. Shared-window loads, not generic ones, so no wait on them also
        // waits on the thread's global loads in flight.
        unsafe {
            if lane_id() == 0 {
                st_shared_words(slot(warp_id()), total);
            }
            if self.shares_blocks {
                bar_sync(1 + self.in_block, self.threads);
            } else {
                sync_threads();
            }
            let mut all = ld_shared_words::<T>(slot(first));
            for w in 1..self.warps {
                all = combine(all, ld_shared_words::<T>(slot(first + w)));
            }
            all
        }
    }

    #[inline(always)]
    pub fn sum(&self, v: f32) -> f32 {
        self.reduce(v, 0.0, |a, b| a + b, shfl_xor_f32)
    }

    #[inline(always)]
    pub fn max(&self, v: f32) -> f32 {
        self.reduce(v, f32::NEG_INFINITY, max_nan, shfl_xor_f32)
    }
}

/// `max(a, b)`, NaN if either is (so a NaN in a row reaches every output).
#[inline(always)]
pub fn max_nan(a: f32, b: f32) -> f32 {
    max_propagate_nan(a, b)
}

/// Two sums reduced together.
#[inline(always)]
pub fn shfl_pair(v: [f32; 2], mask: u32) -> [f32; 2] {
    [shfl_xor_f32(v[0], mask), shfl_xor_f32(v[1], mask)]
}

/// Where element `e` of a row lives in each of `N` operands, relative to their row bases.
pub trait Inner<const N: usize>: Copy {
    fn at(&self, e: u32) -> [u64; N];
}

/// Rows dense in every operand: element `e` at offset `e`.
#[derive(Clone, Copy)]
pub struct Dense;

impl<const N: usize> Inner<N> for Dense {
    #[inline(always)]
    fn at(&self, e: u32) -> [u64; N] {
        [e as u64; N]
    }
}

impl<const N: usize> Inner<N> for &IndexMap<N> {
    #[inline(always)]
    fn at(&self, e: u32) -> [u64; N] {
        self.offsets(e)
    }
}

/// A thread's `V` slots of a row (`K` elements each), held in registers as they were
/// loaded: a 16-byte vector keeps its raw words (two elements a register for 16-bit
/// types), a single element its f32 bits. Every [`Held::get`] unpacks afresh, so no f32
/// copy of the row stays alive across the group's reductions: a 16-bit row costs half the
/// registers, and the row kernels fit more rows per SM.
#[derive(Clone, Copy)]
pub struct Held<T, const K: usize, const V: usize> {
    words: [Vec16; V],
    element: PhantomData<T>,
}

impl<T: Element, const K: usize, const V: usize> Held<T, K, V> {
    /// Every element `fill` (what slots past the row's end read as).
    #[inline(always)]
    pub fn filled(fill: f32) -> Self {
        let words = if K == 1 {
            [fill.to_bits(), 0, 0, 0]
        } else {
            T::pack::<K>([fill; K])
        };
        Self {
            words: [words; V],
            element: PhantomData,
        }
    }

    /// Loads slot `j` from `p` through the read-only path.
    ///
    /// # Safety
    /// As [`load`].
    #[inline(always)]
    pub unsafe fn load(&mut self, j: usize, p: *const T) {
        self.words[j] = if K == 1 {
            [T::load(p).to_bits(), 0, 0, 0]
        } else {
            T::load_raw::<K>(p, true)
        };
    }

    /// The maximum of every element held, NaN if any is: a max over the raw words
    /// ([`Element::max_words`]: 16-bit elements two an instruction, not converted), then
    /// over the last word's elements.
    #[inline(always)]
    pub fn max_nan(&self) -> f32 {
        if K == 1 {
            let mut m = f32::NEG_INFINITY;
            for j in 0..V {
                m = max_nan(m, f32::from_bits(self.words[j][0]));
            }
            return m;
        }
        let mut w = T::NEG_INF_WORD;
        for j in 0..V {
            for word in self.words[j] {
                w = T::max_words(w, word, true);
            }
        }
        // Two elements of a 16-bit type, or the f32 twice.
        let [a, b] = T::unpack::<2>([w; 4]);
        max_nan(a, b)
    }

    /// The elements of slot `j`, as f32.
    #[inline(always)]
    pub fn get(&self, j: usize) -> [f32; K] {
        let w = opaque_words(self.words[j]);
        if K == 1 {
            [f32::from_bits(w[0]); K]
        } else {
            T::unpack::<K>(w)
        }
    }
}

/// `K` consecutive elements at `p` (one element, or one 16-byte vector), through the
/// read-only path.
///
/// # Safety
/// Readable, not written during the launch; for `K > 1`, `p` is 16-byte aligned.
#[inline(always)]
pub unsafe fn load<T: Element, const K: usize>(p: *const T) -> [f32; K] {
    if K == 1 {
        let mut out = [0.0; K];
        out[0] = T::load(p);
        out
    } else {
        T::unpack::<K>(T::load_raw::<K>(p, true))
    }
}

/// As [`load`], through the coherent path (for outputs read before they are written).
///
/// # Safety
/// Readable; for `K > 1`, `p` is 16-byte aligned.
#[inline(always)]
pub unsafe fn load_coherent<T: Element, const K: usize>(p: *const T) -> [f32; K] {
    if K == 1 {
        let mut out = [0.0; K];
        out[0] = T::load(p);
        out
    } else {
        T::unpack::<K>(T::load_raw::<K>(p, false))
    }
}

/// Stores `K` consecutive elements at `p`.
///
/// # Safety
/// Writable; for `K > 1`, `p` is 16-byte aligned.
#[inline(always)]
pub unsafe fn store<T: Element, const K: usize>(p: *mut T, v: [f32; K]) {
    if K == 1 {
        T::store(p, v[0]);
    } else {
        T::store_vec::<K>(p, v);
    }
}

/// `K` consecutive per-element parameters (e.g. a norm's scale) at element offset `off` of
/// `w`, stored as f32 (`f32_params`) or as `T`.
///
/// # Safety
/// As [`load`] for the stored type; f32 runs of `K > 1` are 16-byte aligned.
#[inline(always)]
pub unsafe fn load_params<T: Element, const K: usize>(
    w: *const u8,
    off: u64,
    f32_params: bool,
) -> [f32; K] {
    if !f32_params {
        return load::<T, K>((w as *const T).add(off as usize));
    }
    load_f32s::<K>((w as *const f32).add(off as usize), true)
}

/// `K` consecutive f32 at `p`: 16-byte loads where `K` is a multiple of 4, single ones
/// otherwise; through the read-only path where `read_only` (memory no thread of the launch
/// writes).
///
/// # Safety
/// `p` points at `K` readable f32, 16-byte aligned where `K % 4 == 0`.
#[inline(always)]
pub unsafe fn load_f32s<const K: usize>(p: *const f32, read_only: bool) -> [f32; K] {
    let mut out = [0.0f32; K];
    if K % 4 == 0 {
        for c in 0..K / 4 {
            let q = p.add(4 * c) as *const u32;
            let v = if read_only {
                ld_global_nc_v4(q)
            } else {
                ld_global_v4(q)
            };
            for i in 0..4 {
                out[4 * c + i] = f32::from_bits(v[i]);
            }
        }
    } else {
        for i in 0..K {
            out[i] = *p.add(i);
        }
    }
    out
}

/// Stores `K` consecutive f32 at `p` as [`load_f32s`] loads them.
///
/// # Safety
/// `p` points at `K` writable f32, 16-byte aligned where `K % 4 == 0`.
#[inline(always)]
pub unsafe fn store_f32s<const K: usize>(p: *mut f32, v: [f32; K]) {
    if K % 4 == 0 {
        for c in 0..K / 4 {
            st_global_v4(
                p.add(4 * c) as *mut u32,
                core::array::from_fn(|i| v[4 * c + i].to_bits()),
            );
        }
    } else {
        for k in 0..K {
            *p.add(k) = v[k];
        }
    }
}
