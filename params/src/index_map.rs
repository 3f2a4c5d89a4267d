//! Linear element index -> per-operand memory offsets, for operands that share one
//! logical shape but have their own strides.

use crate::{FastDivisor, MAX_DIMS};

/// A logical shape (`rank` dims, outermost first, each a [`FastDivisor`]) and the strides
/// (in elements) of `N` operands over it. Element `i` of the shape, counted in row-major
/// order, lives at `offsets(i)[k]` in operand `k`. Unused trailing dims hold extent 1.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IndexMap<const N: usize> {
    pub rank: u32,
    pub dims: [FastDivisor; MAX_DIMS],
    pub strides: [[u64; MAX_DIMS]; N],
}

impl<const N: usize> Default for IndexMap<N> {
    fn default() -> Self {
        Self {
            rank: 0,
            dims: [FastDivisor::new(1); MAX_DIMS],
            strides: [[0; MAX_DIMS]; N],
        }
    }
}

impl<const N: usize> IndexMap<N> {
    /// The offset of logical element `index` in each operand.
    ///
    /// Maps of one or two dims (most, after the host folds contiguous dims: rows of NHWC,
    /// NCHW's `(n, h*w)`) take a walk of exactly their dims; the others walk every slot and
    /// test each against `rank`. All give the same offsets.
    #[inline(always)]
    pub fn offsets(&self, index: u32) -> [u64; N] {
        match self.rank {
            1 => self.walk::<1>(index, 1),
            2 => self.walk::<2>(index, 2),
            rank => self.walk::<MAX_DIMS>(index, rank),
        }
    }

    /// The offsets of `index` over the first `rank` of the first `R` slots, innermost first.
    /// The slots are walked with constant indices (the loop unrolls, so the struct is read
    /// straight from kernel-parameter space); with `rank == R` a constant, the rank tests
    /// fold away.
    #[inline(always)]
    fn walk<const R: usize>(&self, index: u32, rank: u32) -> [u64; N] {
        let mut out = [0u64; N];
        let mut rest = index;
        let mut d = R;
        while d > 0 {
            d -= 1;
            if (d as u32) < rank {
                let (q, r) = self.dims[d].div_rem(rest);
                rest = q;
                let mut k = 0;
                while k < N {
                    out[k] += r as u64 * self.strides[k][d];
                    k += 1;
                }
            }
        }
        out
    }
}
