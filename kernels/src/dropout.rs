//! Dropout forward and backward (cudnnDropoutForward/Backward semantics), with the
//! counter-based generator of `oxidnn_params::dropout` (Philox4x32-10, four random words
//! per call).
//!
//! `dropout_fwd_packed_<dtype>`: x and y row-major and dense (element `i` at offset `i`):
//! each lane moves 16-byte vectors, a warp 512 contiguous bytes per access, and each
//! Philox call covers 4 consecutive elements. `dropout_fwd_strided_<dtype>`: any strides;
//! a lane takes 4 logical-consecutive elements (one Philox call) through the index map.
//! Both write the keep bits (bit `i % 32` of word `i / 32`) gathered across lanes with
//! shuffles, read the seed and call number from the states buffer, and the last block to
//! finish advances the call number (so every call draws fresh randoms, and the sequence
//! is fixed by the seed).
//!
//! `dropout_bwd_{packed,strided}_<dtype>`: `dx = keep ? dy * scale : 0` from the bits.
//!
//! Dropped elements are exactly 0 (a select, not a product: NaN or inf there do not leak).

use crate::device::{
    self, block_dim_x, global_thread_x, grid_dim_x, group_reduce, lane_id, shfl_xor_u32,
    thread_idx_x,
};
use crate::element::Element;
use oxidnn_params::{
    dropout_key, dropout_randoms, packed_vector_elements, DropoutBwdParams, DropoutFwdParams,
    DropoutState, PACKED_VECTORS_PER_THREAD,
};

/// 16-byte vectors per lane per step of the packed kernels (the host sizes the grid by it).
const V: usize = PACKED_VECTORS_PER_THREAD;
const _: () = assert!(V == 4, "the unrolled loops below list 4 vectors");

/// The generator position of this call: `(key, call)`.
#[inline(always)]
unsafe fn read_state(state: *const DropoutState) -> ([u32; 2], u64) {
    // Coherent (volatile) loads: the previous call's last block wrote `calls`.
    let seed = core::ptr::read_volatile(&(*state).seed);
    let calls = core::ptr::read_volatile(&(*state).calls);
    (dropout_key(seed), calls)
}

/// Called by every thread at the end of a forward kernel: the last block to get here
/// advances the call number and resets the block count for the next call.
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
        }
    }
}

/// The keep test of `oxidnn_params::dropout_keeps` in 32-bit arithmetic: `r >= threshold`
/// for a threshold below 2^32, which is one compare where the 64-bit form takes two.
#[derive(Clone, Copy)]
enum Keep {
    /// Threshold 0 (`p = 0`): every element, no randoms drawn.
    All,
    /// Threshold 2^32 (`p = 1`): no element, no randoms drawn.
    None,
    /// Elements whose random word is at least this.
    AtLeast(u32),
}

impl Keep {
    #[inline(always)]
    fn of(threshold: u64) -> Self {
        match threshold {
            0 => Keep::All,
            t if t > u32::MAX as u64 => Keep::None,
            t => Keep::AtLeast(t as u32),
        }
    }
}

/// Keep bits of the `K` elements from `at` (a multiple of 4): bit `e` for element `at + e`.
#[inline(always)]
fn keep_bits<const K: usize>(key: [u32; 2], call: u64, keep: Keep, at: u64) -> u32 {
    let threshold = match keep {
        Keep::All => return if K >= 32 { u32::MAX } else { (1u32 << K) - 1 },
        Keep::None => return 0,
        Keep::AtLeast(t) => t,
    };
    let mut bits = 0u32;
    crate::unroll!(q in [0, 1] {
        if 4 * q < K {
            let r = dropout_randoms(key, call, at / 4 + q as u64);
            crate::unroll!(e in [0, 1, 2, 3] {
                bits |= ((r[e] >= threshold) as u32) << (4 * q + e);
            });
        }
    });
    bits
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
    match packed_vector_elements(size_of::<T>()) {
        4 => fwd_packed_k::<T, 4>(p, state, x, y, mask),
        _ => fwd_packed_k::<T, 8>(p, state, x, y, mask),
    }
}

#[inline(always)]
unsafe fn fwd_packed_k<T: Element, const K: usize>(
    p: &DropoutFwdParams,
    state: *mut DropoutState,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
) {
    let (key, call) = read_state(state);
    let keep = Keep::of(p.threshold);
    let chunk = (V * 32 * K) as u64;
    let chunks = p.len.div_ceil(chunk);
    let words = p.len.div_ceil(32);
    let warps = grid_dim_x() as u64 * (block_dim_x() / 32) as u64;
    let lane = lane_id() as u64;
    let mut w = global_thread_x() / 32;
    while w < chunks {
        let base = w * chunk;
        let at = |v: usize| base + (v as u64 * 32 + lane) * K as u64;
        if base + chunk <= p.len {
            // The chunk's loads first; its randoms are drawn while they are in flight (no
            // registers held across iterations, so more warps fit an SM).
            let mut raw = [[0u32; 4]; V];
            crate::unroll!(v in [0, 1, 2, 3] {
                raw[v] = T::load_raw::<K>(x.add(at(v) as usize), true);
            });
            let mut bits = [0u32; V];
            crate::unroll!(v in [0, 1, 2, 3] {
                bits[v] = keep_bits::<K>(key, call, keep, at(v));
            });
            crate::unroll!(v in [0, 1, 2, 3] {
                let xs = T::unpack::<K>(raw[v]);
                let mut out = [0.0f32; K];
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if e < K {
                        out[e] = apply((bits[v] >> e) & 1 != 0, xs[e], p.scale);
                    }
                });
                T::store_vec::<K>(y.add(at(v) as usize), out);
                publish_bits::<K>(bits[v], (base + (v * 32 * K) as u64) / 32, words, mask);
            });
        } else {
            // The grid's last, partial chunk: element by element, same bits.
            crate::unroll!(v in [0, 1, 2, 3] {
                let start = at(v);
                let mut bits = keep_bits::<K>(key, call, keep, start);
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if e < K {
                        let i = start + e as u64;
                        if i < p.len {
                            let kept = (bits >> e) & 1 != 0;
                            T::store(y.add(i as usize), apply(kept, T::load(x.add(i as usize)), p.scale));
                        } else {
                            bits &= !(1 << e);
                        }
                    }
                });
                publish_bits::<K>(bits, (base + (v * 32 * K) as u64) / 32, words, mask);
            });
        }
        w += warps;
    }
    finish_call(state);
}

#[inline(always)]
unsafe fn fwd_strided<T: Element>(
    p: &DropoutFwdParams,
    state: *mut DropoutState,
    x: *const T,
    y: *mut T,
    mask: *mut u32,
) {
    let (key, call) = read_state(state);
    let keep = Keep::of(p.threshold);
    let groups = p.len.div_ceil(4);
    let words = p.len.div_ceil(32);
    let warps = grid_dim_x() as u64 * (block_dim_x() / 32) as u64;
    let lane = lane_id() as u64;
    let mut w = global_thread_x() / 32;
    // A warp takes 32 groups of 4 elements; the whole warp runs each step (the bits are
    // gathered with shuffles), lanes past the end contribute no bits.
    while w * 32 < groups {
        let g = w * 32 + lane;
        let mut bits = 0u32;
        if g < groups {
            bits = keep_bits::<4>(key, call, keep, 4 * g);
            let mut offs = [[0u64; 2]; 4];
            let mut xs = [0.0f32; 4];
            crate::unroll!(e in [0, 1, 2, 3] {
                let i = 4 * g + e as u64;
                if i < p.len {
                    offs[e] = p.map.offsets(i as u32);
                    xs[e] = T::load(x.add(offs[e][0] as usize));
                } else {
                    bits &= !(1 << e);
                }
            });
            crate::unroll!(e in [0, 1, 2, 3] {
                if 4 * g + (e as u64) < p.len {
                    T::store(y.add(offs[e][1] as usize), apply((bits >> e) & 1 != 0, xs[e], p.scale));
                }
            });
        }
        publish_bits::<4>(bits, w * 4, words, mask);
        w += warps;
    }
    finish_call(state);
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
