//! Dropout forward and backward (cudnnDropoutForward/Backward semantics), with the
//! counter-based generator of `oxidnn_params::dropout` (Philox4x32-10; a call gives the
//! high halves of the random words of a group of 8 elements, which decide all but 1 in
//! 2^16 of them: a group with a tie draws its low halves too).
//!
//! `dropout_fwd_packed_<dtype>`: x and y row-major and dense (element `i` at offset `i`):
//! each lane moves 16-byte vectors, a warp 512 contiguous bytes per access. A 16-bit
//! lane's vector is one group; two f32 lanes share one, drawn by one of them for each pair
//! of vectors. A warp takes chunks of 4 vectors: its first by its block's index, the next
//! ones from its group's counter in the states buffer (warp `j` of every block is group
//! `j`), so the grid ends within a chunk.
//! `dropout_fwd_strided_<dtype>`: any strides; a lane takes one group of 8
//! logical-consecutive elements through the index map. Both write the keep bits (bit
//! `i % 32` of word `i / 32`) gathered across lanes with shuffles, read the call number
//! from the states buffer, and the last block to finish advances it (so every call draws
//! fresh randoms, and the sequence is fixed by the seed). The seed comes as the Philox
//! round keys in the parameters, which the rounds read as constants (no registers: the
//! packed kernel fits four blocks an SM).
//!
//! `dropout_bwd_{packed,strided}_<dtype>`: `dx = keep ? dy * scale : 0` from the bits.
//!
//! Dropped elements are exactly 0 (a select, not a product: NaN or inf there do not leak).

use crate::device::{
    self, block_dim_x, block_idx_x, global_thread_x, grid_dim_x, group_reduce, lane_id,
    shfl_idx_u32, shfl_xor_u32, thread_idx_x,
};
use crate::element::Element;
use oxidnn_params::{
    dropout_counter_offset, dropout_half, dropout_halves, packed_vector_elements, DropoutBwdParams,
    DropoutFwdParams, DropoutState, PhiloxKeys, DROPOUT_DEAL_COUNTERS, DROPOUT_GROUP,
    PACKED_VECTORS_PER_THREAD,
};

/// 16-byte vectors per lane per step of the packed kernels (the host sizes the grid by it).
const V: usize = PACKED_VECTORS_PER_THREAD;
const _: () = assert!(V == 4, "the unrolled loops below list 4 vectors");

/// This call's number (the seed comes in the parameters' round keys).
#[inline(always)]
unsafe fn read_call(state: *const DropoutState) -> u64 {
    // A coherent (volatile) load: the previous call's last block wrote `calls`.
    core::ptr::read_volatile(&(*state).calls)
}

/// Called by every thread at the end of a forward kernel: the last block to get here
/// advances the call number and resets the block count and the chunk counters for the
/// next call.
#[inline(always)]
unsafe fn finish_call(state: *mut DropoutState) {
    // Every thread of this block read the state at the start; after the barrier and the
    // fence, the block's count below is ordered after those reads, so when the count
    // reaches the grid size every block of the launch has read the old call number.
    device::sync_threads_divergent();
    if thread_idx_x() == 0 {
        device::thread_fence();
        let done = device::atomic_add_u32(&raw mut (*state).blocks_done, 1);
        if done + 1 == grid_dim_x() {
            let calls = core::ptr::read_volatile(&(*state).calls);
            core::ptr::write_volatile(&raw mut (*state).calls, calls.wrapping_add(1));
            core::ptr::write_volatile(&raw mut (*state).blocks_done, 0);
            for j in 0..DROPOUT_DEAL_COUNTERS {
                core::ptr::write_volatile(deal_counter(state, j), 0);
            }
        }
    }
}

/// The keep test of `oxidnn_params::dropout_group_keeps` on the high halves of the random
/// words, which decide it for all but 1 in 2^16 elements.
#[derive(Clone, Copy)]
enum Keep {
    /// Threshold 0 (`p = 0`): every element, no randoms drawn.
    All,
    /// Threshold 2^32 (`p = 1`): no element, no randoms drawn.
    None,
    /// Threshold `t = high << 16 | low`, `0 < t < 2^32`. With an element's high half
    /// shifted to the top (`s = half << 16`): kept where `s > above`; where `s == tie`, its
    /// low half decides (a tie; `tie` is `high << 16` if `low != 0`, else 1, which no `s`
    /// equals); dropped otherwise.
    Halves { above: u32, tie: u32 },
}

/// What a forward call draws with: the generator position and the keep test. The round
/// keys stay in the kernel's parameters (its rounds read them as constants).
#[derive(Clone, Copy)]
struct Draw<'a> {
    keys: &'a PhiloxKeys,
    call: u64,
    threshold: u64,
    keep: Keep,
}

impl<'a> Draw<'a> {
    #[inline(always)]
    fn new(keys: &'a PhiloxKeys, call: u64, threshold: u64) -> Self {
        let keep = match threshold {
            0 => Keep::All,
            t if t > u32::MAX as u64 => Keep::None,
            t => {
                let (high, low) = (t >> 16, t & 0xffff);
                // Kept for sure: a high half of at least `high + 1` where the low half can
                // decide, of at least `high` where it cannot; `above` is that bound shifted
                // to the top, minus 1 (2^32 - 1 for a bound of 2^16: none for sure).
                let sure = high + (low != 0) as u64;
                Keep::Halves {
                    above: ((sure << 16) - 1) as u32,
                    tie: if low != 0 { (high << 16) as u32 } else { 1 },
                }
            }
        };
        Self {
            keys,
            call,
            threshold,
            keep,
        }
    }

    /// The keep bits of group `g` (bit `e`: element `8 g + e`) from its high halves, and
    /// the elements among them that tie (`E`: ties as bits; otherwise only bit 0, set if
    /// any ties), whose low halves decide ([`Draw::exact`]).
    #[inline(always)]
    fn high<const E: bool>(&self, g: u64) -> (u32, u32) {
        let (above, tie) = match self.keep {
            Keep::All => return (0xff, 0),
            Keep::None => return (0, 0),
            Keep::Halves { above, tie } => (above, tie),
        };
        let high = dropout_halves(self.keys, self.call, g, false, device::mul_wide_u32);
        let mut bits = 0u32;
        let mut ties = 0u32;
        let mut any = false;
        crate::unroll!(j in [0, 1, 2, 3] {
            // Element 2j's half shifted to the top; element 2j + 1's in place, bits below cleared.
            let s = [high[j] << 16, high[j] & 0xffff_0000];
            crate::unroll!(h in [0, 1] {
                bits |= ((s[h] > above) as u32) << (2 * j + h);
                if E {
                    ties |= ((s[h] == tie) as u32) << (2 * j + h);
                } else {
                    any |= s[h] == tie;
                }
            });
        });
        (bits, if E { ties } else { any as u32 })
    }

    /// The keep bits of group `g` where one of its elements ties (1 in 2^13 groups), the
    /// high halves drawn again and then the low ones (one draw live at a time). The same
    /// bits as `oxidnn_params::dropout_group_keeps`: a tied element's word `tie | low half`
    /// is at least the threshold `tie | t_low` where its low half is at least `t_low`.
    #[inline(always)]
    fn exact(&self, g: u64) -> u32 {
        let (mut bits, ties) = self.high::<true>(g);
        let low = dropout_halves(self.keys, self.call, g, true, device::mul_wide_u32);
        let t_low = self.threshold as u32 & 0xffff;
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            let kept = dropout_half(low, e) >= t_low;
            bits |= (((ties >> e) & 1) & kept as u32) << e;
        });
        bits
    }

    /// The keep bits of group `g`.
    #[inline(always)]
    fn group(&self, g: u64) -> u32 {
        match self.high::<false>(g) {
            (bits, 0) => bits,
            _ => self.exact(g),
        }
    }

    /// The keep bits of a lane's `N` vectors of `K` elements (vector `v` from element
    /// `at(v)`, a multiple of `K`; bit `e` for element `at(v) + e`). The whole warp must call
    /// it; each group is drawn by one lane.
    ///
    /// `K = 8`: a lane's vector is one group. `K = 4`: lanes `2m` and `2m + 1` hold the two
    /// halves of a group in every vector; of each pair of vectors the even lane draws the
    /// first's group and the odd lane the second's, and one exchange gives each lane the
    /// other's. Groups with a tie are settled one at a time after all are drawn, so the
    /// kernel holds one copy of the exact draw, whatever `N`.
    #[inline(always)]
    fn lane_vectors<const K: usize, const N: usize>(&self, at: impl Fn(usize) -> u64) -> [u32; N] {
        const { assert!(K == 4 || K == DROPOUT_GROUP as usize) };
        const { assert!(N <= 4) };
        let odd = lane_id() as usize & 1;
        let drawn = if K == 4 { N.div_ceil(2) } else { N };
        let group = |j: usize| {
            let v = if K == 4 { 2 * j + odd } else { j };
            at(v) / DROPOUT_GROUP
        };
        let mut own = [0u32; N];
        let mut ties = 0u32;
        crate::unroll!(j in [0, 1, 2, 3] {
            if j < drawn {
                let (bits, tie) = self.high::<false>(group(j));
                own[j] = bits;
                ties |= tie << j;
            }
        });
        while ties != 0 {
            let j = ties.trailing_zeros() as usize;
            let bits = self.exact(group(j));
            crate::unroll!(u in [0, 1, 2, 3] {
                if u < drawn && u == j {
                    own[u] = bits;
                }
            });
            ties &= ties - 1;
        }
        if K != 4 {
            return own;
        }
        let mut bits = [0u32; N];
        let nibble = 4 * odd as u32;
        crate::unroll!(j in [0, 1] {
            if 2 * j < N {
                let other = shfl_xor_u32(own[j], 1);
                let (first, second) = if odd == 0 { (own[j], other) } else { (other, own[j]) };
                bits[2 * j] = (first >> nibble) & 0xf;
                if 2 * j + 1 < N {
                    bits[2 * j + 1] = (second >> nibble) & 0xf;
                }
            }
        });
        bits
    }
}

/// ORs each lane's `K` keep bits into whole 32-bit words (lanes `l` with the same
/// `l / (32 / K)` share a word) and stores word `first_word + l / (32 / K)` from the first
/// lane of each group, if below `words`. The whole warp must call it.
#[inline(always)]
unsafe fn publish_bits<const K: usize>(bits: u32, first_word: u64, words: u64, mask: *mut u32) {
    let lanes_per_word = (32 / K) as u32;
    let lane = lane_id();
    let shifted = bits << ((lane % lanes_per_word) * K as u32);
    let word = group_reduce(shifted, lanes_per_word, |a, b| a | b, shfl_xor_u32);
    let index = first_word + (lane / lanes_per_word) as u64;
    if lane % lanes_per_word == 0 && index < words {
        *mask.add(index as usize) = word;
    }
}

/// `keep ? v * scale : 0`.
#[inline(always)]
fn apply(kept: bool, v: f32, scale: f32) -> f32 {
    if kept {
        v * scale
    } else {
        0.0
    }
}

#[inline(always)]
unsafe fn fwd_packed<T: Element>(
    p: &DropoutFwdParams,
    state: *mut DropoutState,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
) {
    let draw = Draw::new(&p.keys, read_call(state), p.threshold);
    match packed_vector_elements(size_of::<T>()) {
        4 => fwd_packed_k::<T, 4>(p, draw, x, y, mask, state),
        _ => fwd_packed_k::<T, 8>(p, draw, x, y, mask, state),
    }
    finish_call(state);
}

/// Chunk counter `j` of a states buffer (`oxidnn_params::dropout_counter_offset`).
#[inline(always)]
unsafe fn deal_counter(state: *mut DropoutState, j: usize) -> *mut u32 {
    state.byte_add(dropout_counter_offset(j)).cast()
}

/// The packed forward in chunks of `V` vectors a warp. Warp `j` of each block deals with
/// the other blocks' warps `j` (`G` = warps a block = `DROPOUT_DEAL_COUNTERS`, the host
/// launches `BLOCK_THREADS`) the chunks `j + G m`: its first `m` is its block's index, each
/// next one the next undealt (`grid` + counter `j`, which counts the indices taken past the
/// first turn, a warp's last one unused), so warps that run ahead take more and the grid
/// finishes within a chunk of itself. A counter a group keeps the atomics of different
/// groups in different queues (one for the grid throttled the kernel).
/// A warp takes a chunk's index a whole chunk before it needs it, so the atomic's latency
/// hides behind the chunk.
#[inline(always)]
unsafe fn fwd_packed_k<T: Element, const K: usize>(
    p: &DropoutFwdParams,
    draw: Draw<'_>,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
    state: *mut DropoutState,
) {
    let chunk = (V * 32 * K) as u64;
    let chunks = p.len.div_ceil(chunk);
    let groups = DROPOUT_DEAL_COUNTERS as u64;
    let j = (thread_idx_x() / 32) as usize;
    let counter = deal_counter(state, j);
    let grid = grid_dim_x() as u64;
    // A 32-bit count: a chunk is at least 512 elements, so it cannot wrap (2^44 elements).
    let mut m = block_idx_x() as u64;
    let mut taken = device::atomic_add_u32_lane0(counter, 1);
    while j as u64 + groups * m < chunks {
        let next = grid + shfl_idx_u32(taken, 0) as u64;
        taken = device::atomic_add_u32_lane0(counter, 1);
        fwd_unit::<T, K, V>(p, draw, x, y, mask, (j as u64 + groups * m) * chunk);
        m = next;
    }
}

/// A warp's `N` vectors from element `base` (a multiple of `32 K`): lane `l`'s vector `v`
/// holds the `K` elements from `base + (32 v + l) K`. Past the tensor's end (the grid's
/// last unit only), element by element.
#[inline(always)]
unsafe fn fwd_unit<T: Element, const K: usize, const N: usize>(
    p: &DropoutFwdParams,
    draw: Draw<'_>,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
    base: u64,
) {
    let lane = lane_id() as u64;
    let at = |v: usize| base + (v as u64 * 32 + lane) * K as u64;
    let words = p.len.div_ceil(32);
    let inside = base + (N * 32 * K) as u64 <= p.len;
    // The unit's loads first; its randoms are drawn while they are in flight (no
    // registers held across units, so more warps fit an SM).
    let mut raw = [[0u32; 4]; N];
    if inside {
        crate::unroll!(v in [0, 1, 2, 3] {
            if v < N {
                raw[v] = T::load_raw::<K>(x.add(at(v) as usize), true);
            }
        });
    }
    let mut bits = draw.lane_vectors::<K, N>(at);
    crate::unroll!(v in [0, 1, 2, 3] {
        if v < N {
            if inside {
                let xs = T::unpack::<K>(raw[v]);
                let mut out = [0.0f32; K];
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if e < K {
                        out[e] = apply((bits[v] >> e) & 1 != 0, xs[e], p.scale);
                    }
                });
                T::store_vec::<K>(y.add(at(v) as usize), out);
            } else {
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if e < K {
                        let i = at(v) + e as u64;
                        if i < p.len {
                            let kept = (bits[v] >> e) & 1 != 0;
                            T::store(y.add(i as usize), apply(kept, T::load(x.add(i as usize)), p.scale));
                        } else {
                            bits[v] &= !(1 << e);
                        }
                    }
                });
            }
            publish_bits::<K>(bits[v], (base + (v * 32 * K) as u64) / 32, words, mask);
        }
    });
}

#[inline(always)]
unsafe fn fwd_strided<T: Element>(
    p: &DropoutFwdParams,
    state: *mut DropoutState,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
) {
    let draw = Draw::new(&p.keys, read_call(state), p.threshold);
    fwd_strided_groups::<T>(p, draw, x, y, mask);
    finish_call(state);
}

/// A lane takes a group of 8 logical-consecutive elements (one draw) through the index map;
/// the whole warp runs each step (the bits are gathered with shuffles), lanes past the end
/// contribute no bits.
#[inline(always)]
unsafe fn fwd_strided_groups<T: Element>(
    p: &DropoutFwdParams,
    draw: Draw<'_>,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
) {
    const G: usize = DROPOUT_GROUP as usize;
    let groups = p.len.div_ceil(DROPOUT_GROUP);
    let words = p.len.div_ceil(32);
    let warps = grid_dim_x() as u64 * (block_dim_x() / 32) as u64;
    let lane = lane_id() as u64;
    let mut w = global_thread_x() / 32;
    while w * 32 < groups {
        let g = w * 32 + lane;
        let mut bits = 0u32;
        if g < groups {
            bits = draw.group(g);
            let mut offs = [[0u64; 2]; G];
            let mut xs = [0.0f32; G];
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let i = G as u64 * g + e as u64;
                if i < p.len {
                    offs[e] = p.map.offsets(i as u32);
                    xs[e] = T::load(x.add(offs[e][0] as usize));
                } else {
                    bits &= !(1 << e);
                }
            });
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                if G as u64 * g + (e as u64) < p.len {
                    T::store(y.add(offs[e][1] as usize), apply((bits >> e) & 1 != 0, xs[e], p.scale));
                }
            });
        }
        publish_bits::<G>(bits, w * G as u64, words, mask);
        w += warps;
    }
}

#[inline(always)]
unsafe fn bwd_packed<T: Element>(p: &DropoutBwdParams, dy: *const T, dx: *mut T, mask: *const u32) {
    match packed_vector_elements(size_of::<T>()) {
        4 => bwd_packed_k::<T, 4>(p, dy, dx, mask),
        _ => bwd_packed_k::<T, 8>(p, dy, dx, mask),
    }
}

/// The `K` keep bits of the elements from `at` (a multiple of `K`, which divides 32).
#[inline(always)]
unsafe fn read_bits<const K: usize>(mask: *const u32, at: u64) -> u32 {
    let word = *mask.add((at / 32) as usize);
    (word >> (at % 32)) & if K >= 32 { u32::MAX } else { (1u32 << K) - 1 }
}

#[inline(always)]
unsafe fn bwd_packed_k<T: Element, const K: usize>(
    p: &DropoutBwdParams,
    dy: *const T,
    dx: *mut T,
    mask: *const u32,
) {
    let chunk = (V * 32 * K) as u64;
    let chunks = p.len.div_ceil(chunk);
    let warps = grid_dim_x() as u64 * (block_dim_x() / 32) as u64;
    let lane = lane_id() as u64;
    let mut w = global_thread_x() / 32;
    while w < chunks {
        let base = w * chunk;
        let at = |v: usize| base + (v as u64 * 32 + lane) * K as u64;
        if base + chunk <= p.len {
            let mut raw = [[0u32; 4]; V];
            let mut bits = [0u32; V];
            crate::unroll!(v in [0, 1, 2, 3] {
                raw[v] = T::load_raw::<K>(dy.add(at(v) as usize), true);
                bits[v] = read_bits::<K>(mask, at(v));
            });
            crate::unroll!(v in [0, 1, 2, 3] {
                let ds = T::unpack::<K>(raw[v]);
                let mut out = [0.0f32; K];
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if e < K {
                        out[e] = apply((bits[v] >> e) & 1 != 0, ds[e], p.scale);
                    }
                });
                T::store_vec::<K>(dx.add(at(v) as usize), out);
            });
        } else {
            for v in 0..V {
                let start = at(v);
                let mut e = 0;
                while e < K && start + (e as u64) < p.len {
                    let i = start + e as u64;
                    let kept = (*mask.add((i / 32) as usize) >> (i % 32)) & 1 != 0;
                    T::store(
                        dx.add(i as usize),
                        apply(kept, T::load(dy.add(i as usize)), p.scale),
                    );
                    e += 1;
                }
            }
        }
        w += warps;
    }
}

#[inline(always)]
unsafe fn bwd_strided<T: Element>(
    p: &DropoutBwdParams,
    dy: *const T,
    dx: *mut T,
    mask: *const u32,
) {
    device::grid_stride(p.len, |i| {
        let off = p.map.offsets(i as u32);
        let kept = (*mask.add((i / 32) as usize) >> (i % 32)) & 1 != 0;
        T::store(
            dx.add(off[1] as usize),
            apply(kept, T::load(dy.add(off[0] as usize)), p.scale),
        );
    });
}

macro_rules! dropout_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `state` is a dropout states buffer; x and y cover `p.len` dense elements,
            /// `mask` `ceil(len / 32)` words.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<dropout_fwd_packed_ $dt>](
                p: DropoutFwdParams, state: *mut DropoutState, x: *const $T, y: *mut $T, mask: *mut u32,
            ) {
                fwd_packed::<$T>(&p, state, x, y, mask)
            }
            /// # Safety
            /// As the packed kernel, with x and y covering the offsets `p.map` produces.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<dropout_fwd_strided_ $dt>](
                p: DropoutFwdParams, state: *mut DropoutState, x: *const $T, y: *mut $T, mask: *mut u32,
            ) {
                fwd_strided::<$T>(&p, state, x, y, mask)
            }
            /// # Safety
            /// dy and dx cover `p.len` dense elements, `mask` `ceil(len / 32)` words.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<dropout_bwd_packed_ $dt>](
                p: DropoutBwdParams, dy: *const $T, dx: *mut $T, mask: *const u32,
            ) {
                bwd_packed::<$T>(&p, dy, dx, mask)
            }
            /// # Safety
            /// As the packed kernel, with dy and dx covering the offsets `p.map` produces.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<dropout_bwd_strided_ $dt>](
                p: DropoutBwdParams, dy: *const $T, dx: *mut $T, mask: *const u32,
            ) {
                bwd_strided::<$T>(&p, dy, dx, mask)
            }
        }
    };
}

crate::for_each_dtype!(dropout_entry_points);
