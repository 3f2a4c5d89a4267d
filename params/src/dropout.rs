//! Dropout: the generator state kept in the caller's states buffer, the kernels' parameter
//! structs, and the one definition of which elements drop (shared by kernels and the CPU
//! reference).
//!
//! Element `i` (its logical, row-major index over the tensor's dims, whatever its strides)
//! of the `k`-th forward call on a states buffer seeded with `seed` draws a 32-bit random
//! word and is kept when that word is at least `dropout_threshold(p)`. The elements come in
//! groups of [`DROPOUT_GROUP`] = 8 (`g = i / 8`, `e = i % 8`), and a group takes two
//! Philox4x32-10 calls under `key = [seed as u32, (seed >> 32) as u32]`: the high halves
//! with `counter = [g as u32, (g >> 32) as u32, k as u32, (k >> 32) as u32]` and the low
//! halves with bit 31 of counter word 1 set. Element `e` takes half `e % 2` (0: bits 0-15,
//! 1: bits 16-31) of word `e / 2` of each, so its word is `high << 16 | low`: uniform over
//! 32 bits, as one word a call per element would be, at half the generator's work where
//! the high halves decide (the kernels draw the low halves only for a group whose high
//! half equals the threshold's, 1 in 2^16 elements). Nothing else (layout, grid, block
//! size) enters.

use crate::philox::{mul_wide, philox4x32_10_keyed, PhiloxKeys};
use crate::IndexMap;

/// The generator state at the start of a dropout states buffer.
///
/// `calls` counts the forward calls made with the buffer since it was seeded: call `k`
/// draws with counter words 2 and 3 equal to `k`, then advances `calls` to `k + 1` (on the
/// GPU the last block of the forward kernel to finish does it; `blocks_done` counts the
/// blocks finished so far and is 0 between calls). A states buffer holds it in its first
/// [`DROPOUT_LINE_BYTES`], then the packed forward's chunk counters
/// ([`dropout_counter_offset`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropoutState {
    /// [`DROPOUT_STATE_MAGIC`] once seeded.
    pub magic: u32,
    pub blocks_done: u32,
    pub seed: u64,
    pub calls: u64,
    pub _reserved: u64,
}

/// Marks a seeded [`DropoutState`] ("OXDP").
pub const DROPOUT_STATE_MAGIC: u32 = 0x5044_584F;

/// Bytes of a [`DropoutState`].
pub const DROPOUT_STATE_BYTES: usize = core::mem::size_of::<DropoutState>();

/// The packed forward's chunk counters in a states buffer: one for each warp of a block
/// (warp `j` of every block takes its chunks after the first from counter `j`, each 0
/// between calls). Each has a 128-byte line of its own, so every counter queues its own
/// atomics: one counter for the whole grid made its atomics the kernel's bottleneck.
pub const DROPOUT_DEAL_COUNTERS: usize = crate::BLOCK_THREADS as usize / 32;

/// The spacing of the state and the counters in a states buffer.
pub const DROPOUT_LINE_BYTES: usize = 128;

/// Bytes of a dropout states buffer: the state's line, then the counters'.
pub const DROPOUT_STATES_BYTES: usize = DROPOUT_LINE_BYTES * (1 + DROPOUT_DEAL_COUNTERS);

/// Byte offset of chunk counter `j` (a `u32`) in a states buffer.
pub const fn dropout_counter_offset(j: usize) -> usize {
    DROPOUT_LINE_BYTES * (1 + j)
}

/// Elements whose keep bits fill one 32-bit word of the reserve space.
pub const DROPOUT_MASK_WORD_BITS: u64 = 32;

/// The keep threshold of drop probability `p` in `[0, 1]`: `floor(p * 2^32)`. An element
/// whose random word is below it drops, so the keep probability is exactly
/// `1 - threshold / 2^32` (`p = 1`: 2^32, nothing kept; `p = 0`: 0, everything kept).
#[inline(always)]
pub fn dropout_threshold(p: f64) -> u64 {
    let t = p * 4_294_967_296.0;
    if t.is_nan() || t <= 0.0 {
        0
    } else if t >= 4_294_967_296.0 {
        1 << 32
    } else {
        t as u64 // truncation: floor for a non-negative value
    }
}

/// The generator's round keys for `seed` (its key: `[seed as u32, (seed >> 32) as u32]`).
pub const fn dropout_key(seed: u64) -> PhiloxKeys {
    PhiloxKeys::new([seed as u32, (seed >> 32) as u32])
}

/// Logical elements per generator group: each of a call's four words gives two of them
/// the high (or low) 16 bits of their random words.
pub const DROPOUT_GROUP: u64 = 8;

/// Set in counter word 1 for a group's low halves (`g < 2^61`, so the bit is free).
const LOW_HALVES: u32 = 1 << 31;

/// The high (`low == false`) or low halves of the random words of group `g` (elements
/// `8 g .. 8 g + 8`) in forward call `call`: element `8 g + e` takes half `e % 2` of word
/// `e / 2` (see [`dropout_half`]). `mul_wide` as [`philox4x32_10_keyed`] takes it
/// ([`mul_wide`] on the host).
#[inline(always)]
pub fn dropout_halves(
    keys: &PhiloxKeys,
    call: u64,
    g: u64,
    low: bool,
    mul_wide: impl Fn(u32, u32) -> (u32, u32) + Copy,
) -> [u32; 4] {
    let flag = if low { LOW_HALVES } else { 0 };
    philox4x32_10_keyed(
        [
            g as u32,
            (g >> 32) as u32 | flag,
            call as u32,
            (call >> 32) as u32,
        ],
        keys,
        mul_wide,
    )
}

/// Half `e % 2` of word `e / 2` of `words`: group element `e`'s 16 bits.
#[inline(always)]
pub fn dropout_half(words: [u32; 4], e: usize) -> u32 {
    (words[e / 2] >> (16 * (e % 2))) & 0xffff
}

/// Whether an element with random word `r` is kept.
#[inline(always)]
pub fn dropout_keeps(r: u32, threshold: u64) -> bool {
    r as u64 >= threshold
}

/// The keep bits of group `g` in forward call `call` (bit `e`: element `8 g + e`), from
/// both halves of its random words.
#[inline(always)]
pub fn dropout_group_keeps(keys: &PhiloxKeys, call: u64, threshold: u64, g: u64) -> u32 {
    let (high, low) = (
        dropout_halves(keys, call, g, false, mul_wide),
        dropout_halves(keys, call, g, true, mul_wide),
    );
    let mut bits = 0;
    let mut e = 0;
    while e < DROPOUT_GROUP as usize {
        let r = dropout_half(high, e) << 16 | dropout_half(low, e);
        bits |= (dropout_keeps(r, threshold) as u32) << e;
        e += 1;
    }
    bits
}

/// Whether element `i` is kept in forward call `call` of a generator seeded with `seed`.
pub fn dropout_keeps_element(seed: u64, call: u64, threshold: u64, i: u64) -> bool {
    let g = i / DROPOUT_GROUP;
    (dropout_group_keeps(&dropout_key(seed), call, threshold, g) >> (i % DROPOUT_GROUP)) & 1 != 0
}

/// Parameters of `dropout_fwd_*`: `y = keep(i) ? x * scale : 0` for the `len` logical
/// elements, keep bits to the reserve space (bit `i % 32` of word `i / 32`, 1 = kept).
///
/// `dropout_fwd_packed_*`: x and y row-major and dense, so element `i` is at offset `i`
/// (16-byte vectors). `dropout_fwd_strided_*`: `map` walks the logical dims in row-major
/// order, operands `[x, y]`. Both run a grid-stride loop over warps and read the call
/// number from the states buffer; the seed comes in `keys`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DropoutFwdParams {
    pub threshold: u64,
    pub scale: f32,
    pub _pad: u32,
    pub len: u64,
    pub map: IndexMap<2>,
    /// `dropout_key(seed)` of the states buffer's seed.
    pub keys: PhiloxKeys,
}

/// Parameters of `dropout_bwd_*`: `dx = keep(i) ? dy * scale : 0`, keep bits read from the
/// reserve space. Operands of `map` (strided kernel): `[dy, dx]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DropoutBwdParams {
    pub scale: f32,
    pub _pad: u32,
    pub len: u64,
    pub map: IndexMap<2>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_cover_the_closed_interval() {
        assert_eq!(dropout_threshold(0.0), 0);
        assert_eq!(dropout_threshold(1.0), 1 << 32);
        assert_eq!(dropout_threshold(0.5), 1 << 31);
        assert!(!dropout_keeps(u32::MAX, dropout_threshold(1.0)));
        assert!(dropout_keeps(0, dropout_threshold(0.0)));
    }

    #[test]
    fn an_elements_word_joins_its_high_and_low_halves() {
        let key = dropout_key(0x1234_5678_9abc_def0);
        for g in [0, 1, 1 << 40] {
            for call in [0, 7] {
                let high = dropout_halves(&key, call, g, false, mul_wide);
                let low = dropout_halves(&key, call, g, true, mul_wide);
                assert_ne!(high, low, "two counters, two draws");
                for e in 0..8 {
                    let word = dropout_half(high, e) << 16 | dropout_half(low, e);
                    for t in [0, word as u64, word as u64 + 1, 1 << 32] {
                        let kept = (dropout_group_keeps(&key, call, t, g) >> e) & 1 != 0;
                        assert_eq!(kept, word as u64 >= t, "g {g} call {call} e {e} t {t:#x}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_state_is_32_bytes_with_fixed_offsets_and_each_counter_its_own_line() {
        assert_eq!(DROPOUT_STATE_BYTES, 32);
        assert_eq!(core::mem::offset_of!(DropoutState, seed), 8);
        assert_eq!(core::mem::offset_of!(DropoutState, calls), 16);
        assert!(DROPOUT_STATE_BYTES <= dropout_counter_offset(0));
        assert_eq!(
            dropout_counter_offset(DROPOUT_DEAL_COUNTERS),
            DROPOUT_STATES_BYTES
        );
    }
}
