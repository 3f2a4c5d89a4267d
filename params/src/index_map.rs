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
    #[inline(always)]
    pub fn offsets(&self, index: u32) -> [u64; N] {
        let mut out = [0u64; N];
        let mut rest = index;
        // Walk all MAX_DIMS slots with constant indices (the loop unrolls, so the struct is
        // read straight from kernel-parameter space), skipping those past `rank`.
        let mut d = MAX_DIMS;
        while d > 0 {
            d -= 1;
            if (d as u32) < self.rank {
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
