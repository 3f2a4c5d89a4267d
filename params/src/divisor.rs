//! Division by a run-time constant with a multiply and a shift: the device's integer
//! divide is a long instruction sequence, and index arithmetic divides for every element.

/// A `u32` divisor with its precomputed magic number (round-up method): for every
/// `n: u32`, `n / d == (umulhi(n, multiplier) + n) >> shift`, evaluated in 64 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastDivisor {
    pub divisor: u32,
    pub multiplier: u32,
    pub shift: u32,
}

impl Default for FastDivisor {
    fn default() -> Self {
        Self::new(1)
    }
}

impl FastDivisor {
    /// Precomputes the magic numbers of `divisor`; a divisor of 0 is treated as 1 (the
    /// host never builds one: extents are validated to be >= 1 first).
    pub const fn new(divisor: u32) -> Self {
        let d = if divisor == 0 { 1 } else { divisor };
        // shift = ceil(log2(d))
        let shift = 32 - (d - 1).leading_zeros();
        // multiplier = floor(2^32 * (2^shift - d) / d) + 1, which fits in 32 bits.
        let multiplier = ((((1u64 << shift) - d as u64) << 32) / d as u64 + 1) as u32;
        Self {
            divisor: d,
            multiplier,
            shift,
        }
    }

    /// `n / divisor`.
    #[inline(always)]
    pub fn div(&self, n: u32) -> u32 {
        let hi = ((n as u64 * self.multiplier as u64) >> 32) as u32;
        ((hi as u64 + n as u64) >> self.shift) as u32
    }

    /// `(n / divisor, n % divisor)`.
    #[inline(always)]
    pub fn div_rem(&self, n: u32) -> (u32, u32) {
        let q = self.div(n);
        (q, n - q * self.divisor)
    }
}
