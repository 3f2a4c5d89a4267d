//! Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers:
//! as easy as 1, 2, 3" (SC 2011), as Random123 defines it. One implementation in plain
//! integer arithmetic, compiled into both the kernels and the host's CPU reference, so
//! the two cannot drift apart; only the 32x32 -> 64-bit product is the caller's (`u64`
//! arithmetic on the host, one `mul.wide.u32` in the kernels), and the round keys are
//! computed once per key ([`PhiloxKeys`]).

/// Round multipliers.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// Key increments (Weyl sequence: the golden ratio and sqrt(3) - 1, in 32 bits).
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The 64-bit product `a * b` as `(hi, lo)`, in `u64` arithmetic.
///
/// The kernels pass [`philox4x32_10_keyed`] one PTX `mul.wide.u32` instead
/// (`device::mul_wide_u32`): given this form, LLVM merges each round's xors into 64-bit
/// operations on the products, and ptxas then spends two more instructions a round (six
/// where four do).
#[inline(always)]
pub fn mul_wide(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// The round keys of Philox4x32-10 under one 64-bit key: round `r` (0..10) uses
/// `key + r * (W0, W1)`. A kernel takes them in its parameters, so its rounds read them
/// as constants, in no registers of their own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhiloxKeys(pub [[u32; 2]; 10]);

impl PhiloxKeys {
    /// The round keys of `key` (little-endian 32-bit words, as Random123 lists keys).
    pub const fn new(key: [u32; 2]) -> Self {
        let mut keys = [key; 10];
        let mut r = 1;
        while r < 10 {
            keys[r] = [
                keys[r - 1][0].wrapping_add(W0),
                keys[r - 1][1].wrapping_add(W1),
            ];
            r += 1;
        }
        Self(keys)
    }
}

#[inline(always)]
fn round(c: [u32; 4], k: [u32; 2], mul_wide: impl Fn(u32, u32) -> (u32, u32)) -> [u32; 4] {
    let (hi0, lo0) = mul_wide(M0, c[0]);
    let (hi1, lo1) = mul_wide(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32 with 10 rounds under the round keys `keys`: four independent 32-bit random
/// words for one 128-bit `counter`; `mul_wide(a, b)` is the product `a * b` as `(hi, lo)`
/// ([`mul_wide`] on the host).
#[inline(always)]
pub fn philox4x32_10_keyed(
    counter: [u32; 4],
    keys: &PhiloxKeys,
    mul_wide: impl Fn(u32, u32) -> (u32, u32) + Copy,
) -> [u32; 4] {
    let mut c = counter;
    let mut r = 0;
    while r < 10 {
        c = round(c, keys.0[r], mul_wide);
        r += 1;
    }
    c
}

/// Philox4x32 with 10 rounds: four independent 32-bit random words for one 128-bit
/// `counter` under a 64-bit `key` (both as little-endian 32-bit words, as Random123's
/// known-answer vectors list them).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    philox4x32_10_keyed(counter, &PhiloxKeys::new(key), mul_wide)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's `examples/kat_vectors`, the three `philox4x32 10` lines
    /// (counter, key, expected output).
    #[test]
    fn philox4x32_10_matches_random123_known_answers() {
        let kat: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0, 0, 0, 0],
                [0, 0],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (counter, key, want) in kat {
            assert_eq!(
                philox4x32_10(counter, key),
                want,
                "{counter:08x?} {key:08x?}"
            );
        }
    }
}
