//! Parameters of the `matmul_*` kernels (and of the tiled-MMA core's epilogue, which
//! convolution will share).

/// How one GEMM operand lies in memory, seen as an `extent x k` matrix (`A` is `M x K`,
/// `B` is described as `N x K`, i.e. `op(B)` transposed): element `(i, kk)` of batch `b` is
/// at `b * batch + i * mn + kk * k` elements from the operand's base.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OperandLayout {
    pub batch: u64,
    /// Stride along M (for A) or N (for B).
    pub mn: u64,
    /// Stride along K.
    pub k: u64,
}

/// An `M x N` output-shaped tensor (the result `C`, the residual `Z`): element `(r, c)` of
/// batch `b` is at `b * batch + r * row + c * col`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputLayout {
    pub batch: u64,
    pub row: u64,
    pub col: u64,
}

/// Which bias the epilogue adds.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BiasMode {
    None = 0,
    /// `bias[r]` added to row `r` (a length-M vector).
    PerRow = 1,
    /// `bias[c]` added to column `c` (a length-N vector: a linear layer's bias).
    PerColumn = 2,
}

impl BiasMode {
    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::PerRow,
            2 => Self::PerColumn,
            _ => Self::None,
        }
    }
}

/// Element type of the epilogue's tensors (result, residual and bias share one).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputType {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
}

impl OutputType {
    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::F16,
            2 => Self::Bf16,
            _ => Self::F32,
        }
    }
}

/// What the epilogue does with accumulator `acc` of an output element:
///
/// `D = act(alpha * acc + beta * C + bias + residual_scale * Z)`, where `C` is the old
/// content of `D` (read only when `beta != 0`), `bias` per [`BiasMode`], `Z` read only
/// when `residual_scale != 0`; `act` is an [`crate::ActivationKind`] with `act_coef`.
/// This is `cudnnConvolutionBiasActivationForward`'s order (residual and bias before the
/// activation) and cuBLASLt's (`beta * C` before it). Shared by matmul and convolution;
/// where the elements lie is each op's own business.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpilogueOps {
    pub alpha: f32,
    pub beta: f32,
    pub residual_scale: f32,
    pub act_coef: f32,
    /// An [`crate::ActivationKind`].
    pub activation: u32,
    /// A [`BiasMode`] (convolution: `PerColumn` = one bias per output channel).
    pub bias: u32,
    /// An [`OutputType`].
    pub out_type: u32,
    pub _pad: u32,
}

/// The matmul epilogue: [`EpilogueOps`] on a result `D` and residual `Z` laid out as
/// [`OutputLayout`]s say.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpilogueParams {
    pub out: OutputLayout,
    pub residual: OutputLayout,
    pub ops: EpilogueOps,
}

/// Parameters of `matmul_*`: `D[b] = epilogue(op(A)[b] x op(B)[b])` for `b < batch`, with
/// `op(A)` `M x K` and `op(B)` `K x N` as [`OperandLayout`]s say.
///
/// The grid is `(tiles_m * tiles_n, min(batch, 65535))`: block `(x, y)` takes output tile
/// [`tile_coords`]`(x)` of batches `y, y + gridDim.y, ..`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulParams {
    pub a: OperandLayout,
    pub b: OperandLayout,
    pub epilogue: EpilogueParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub tiles_m: u32,
    pub tiles_n: u32,
    pub batch: u32,
}

/// K per shared-memory stage of the tensor-core kernels, in bytes (64 16-bit elements or
/// 32 tf32 ones): one 128-byte row per tile row, 4 (or 8 tf32) `mma` K steps per barrier.
pub const MMA_BK_BYTES: u32 = 128;

/// Threads of a tensor-core `bm x bn` tile: 8 warps, or 4 for tiles under 128 x 128.
pub const fn mma_threads(bm: u32, bn: u32) -> u32 {
    if bm * bn >= 128 * 128 {
        256
    } else {
        128
    }
}

/// Pipeline depth of a tensor-core `bm x bn` tile (3 for the largest, to fit 2 blocks' worth
/// of registers and shared memory; else 4).
pub const fn mma_stages(bm: u32, bn: u32) -> u32 {
    if bm * bn >= 128 * 256 {
        3
    } else {
        4
    }
}

/// Dynamic shared memory of a tensor-core `bm x bn` tile: all stages of both operands.
pub const fn mma_shared_bytes(bm: u32, bn: u32) -> u32 {
    mma_shared_bytes_staged(bm, bn, mma_stages(bm, bn))
}

/// Pipeline depth of the short-K tensor-core tiles (`matmul_mma_<BM>x<BN>s_*`), made for
/// K of at most one stage: with a single K tile a block cannot overlap its own loads with
/// its math, so the depth only costs shared memory; 2 stages (the least the ring takes)
/// let 2-3x more blocks share an SM and overlap one another instead.
pub const MMA_SHORT_K_STAGES: u32 = 2;

/// Dynamic shared memory of a tensor-core `bm x bn` tile of `stages` stages.
pub const fn mma_shared_bytes_staged(bm: u32, bn: u32, stages: u32) -> u32 {
    (bm + bn) * MMA_BK_BYTES * stages
}

/// Rows of every `wgmma` (sm_90a) block tile: two warpgroups of `wgmma.m64nNk16`, each
/// owning 64 rows by the tile's whole N.
pub const WGMMA_BM: u32 = 128;
/// Threads of a `wgmma` block: two warpgroups.
pub const WGMMA_THREADS: u32 = 256;

/// Pipeline depth of a `wgmma` `128 x bn` tile: as many 128-byte-K stages as fit in about
/// 192 KB of shared memory (4 for 128 x 256, 6 for 128 x 128).
pub const fn wgmma_stages(bn: u32) -> u32 {
    (192 * 1024) / ((WGMMA_BM + bn) * MMA_BK_BYTES)
}

/// Dynamic shared memory of a `wgmma` `128 x bn` tile: all stages of both operands, plus
/// 1 KB of slack to start them at a 1024-byte boundary (`wgmma`'s 128-byte swizzle
/// pattern repeats from one).
pub const fn wgmma_shared_bytes(bn: u32) -> u32 {
    (WGMMA_BM + bn) * MMA_BK_BYTES * wgmma_stages(bn) + 1024
}

/// A TMA tensor map (the driver's `CUtensorMap`): 128 opaque bytes that
/// `cuTensorMapEncodeTiled` writes on the host and the kernels' bulk tensor copies read.
/// TMA wants it 64-byte aligned; rustc's nvptx kernel ABI declares parameters at most
/// 16-byte aligned, so build.rs raises the declared alignment of the kernels'
/// [`TmaOperands`] parameter to 64 in the PTX.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap(pub [u64; 16]);

/// The last parameter of a `wgmma_matmul_tma_*` kernel: its operands' tensor maps, passed
/// by value so that the copies read them from parameter space (no memory to allocate or
/// fill per call). Each describes its operand as a 3-D tensor, innermost dim first:
/// `[K, rows, batch]` when K is contiguous, `[rows, K, batch]` when M/N is, where rows are
/// M (for A) or N (for B); boxes are [`TMA_BOX`] x [`TMA_BOX`] x 1, 128-byte swizzled.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmaOperands {
    pub a: TensorMap,
    pub b: TensorMap,
}

/// Rows (M/N) and K elements of one TMA box: 64 x 64 16-bit elements, 8 KB, one
/// 128-byte swizzle row of K per row (K-major) or of M/N per K (MN-major).
pub const TMA_BOX: u32 = 64;
/// Pipeline depth of a TMA `wgmma` `128 x bn` tile of which `per_sm` blocks share an SM:
/// as many stages as fit in its share of 192 KB of shared memory (one block: 4 stages
/// for `bn = 256`, 6 for 128, 8 for 64; two: 3 for 128, 4 for 64).
pub const fn tma_stages(bn: u32, per_sm: u32) -> u32 {
    (192 * 1024 / per_sm) / ((WGMMA_BM + bn) * MMA_BK_BYTES)
}

/// Dynamic shared memory of a TMA `wgmma` `128 x bn` tile ([`tma_stages`]`(bn, per_sm)`
/// stages), 1 KB of alignment slack, and two 8-byte barriers per stage (data landed;
/// stage free).
pub const fn tma_shared_bytes(bn: u32, per_sm: u32) -> u32 {
    let stages = tma_stages(bn, per_sm);
    (WGMMA_BM + bn) * MMA_BK_BYTES * stages + 1024 + 2 * 8 * stages
}

/// Threads of a TMA `wgmma` block of which `per_sm` share an SM: two consumer
/// warpgroups and a producer, a whole warpgroup with one block per SM (its registers go
/// to the consumers), one warp with two (every thread keeps 112 registers).
pub const fn tma_threads(per_sm: u32) -> u32 {
    if per_sm == 1 {
        384
    } else {
        288
    }
}

/// K per stage of the exact-f32 (FMA) kernels.
pub const FMA_BK: u32 = 8;
/// Threads of an FMA block: a 16 x 16 grid of register tiles.
pub const FMA_THREADS: u32 = 256;

/// Dynamic shared memory of an FMA `bm x bn` tile: two stages of both operands, stored
/// `[k][mn]` with rows padded by 4 floats, or the staged `bm x (bn + 4)` result, whichever
/// is larger.
pub const fn fma_shared_bytes(bm: u32, bn: u32) -> u32 {
    let stages = 2 * FMA_BK * (bm + 4 + bn + 4) * 4;
    let result = bm * (bn + 4) * 4;
    if stages > result {
        stages
    } else {
        result
    }
}

/// `cp.async` stages (K tiles of [`FMA_BK`]) of the exact-f32 matmul tiles.
pub const FMA_STAGES: u32 = 4;

/// Outputs per thread, `(rows, cols)`, of the exact-f32 matmul's `bm x bn` tile: 8 x 16
/// on the 128-row tiles (a warp owns 64 x 64: 6 conflict-free 16-byte shared loads per 128
/// FMAs), 4 x 4 on 64 x 64 (256 threads, for short K and small problems).
pub const fn fma_matmul_thread_tile(bm: u32, bn: u32) -> (u32, u32) {
    if bm >= 128 && bn >= 128 {
        (8, 16)
    } else {
        (4, 4)
    }
}

/// Threads of the exact-f32 matmul's `bm x bn` tile: one per [`fma_matmul_thread_tile`]
/// (128 x 128: 128 threads, so two blocks share an SM at up to 255 registers).
pub const fn fma_matmul_threads(bm: u32, bn: u32) -> u32 {
    let (tm, tn) = fma_matmul_thread_tile(bm, bn);
    bm * bn / (tm * tn)
}

/// Dynamic shared memory of the exact-f32 matmul's `bm x bn` tile: [`FMA_STAGES`] stages
/// of both operands, stored `[k][mn]` with rows padded by 4 floats, or the staged
/// `bm x (bn + 4)` result, whichever is larger.
pub const fn fma_matmul_shared_bytes(bm: u32, bn: u32) -> u32 {
    let stages = FMA_STAGES * FMA_BK * (bm + 4 + bn + 4) * 4;
    let result = bm * (bn + 4) * 4;
    if stages > result {
        stages
    } else {
        result
    }
}

/// Output tiles side by side in M that consecutive blocks sweep before moving along N, so
/// that the blocks running at once share operand tiles in L2.
pub const MATMUL_RASTER_GROUP: u32 = 8;

/// The `(tile_m, tile_n)` block `block` of a `tiles_m x tiles_n` grid computes: blocks run
/// down a group of [`MATMUL_RASTER_GROUP`] tile rows, column by column, group after group.
#[inline(always)]
pub fn tile_coords(block: u32, tiles_m: u32, tiles_n: u32) -> (u32, u32) {
    let per_group = MATMUL_RASTER_GROUP * tiles_n.max(1);
    let group = block / per_group;
    let first_m = group * MATMUL_RASTER_GROUP;
    let rows = tiles_m
        .saturating_sub(first_m)
        .clamp(1, MATMUL_RASTER_GROUP);
    let within = block - group * per_group;
    (first_m + within % rows, within / rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_coords_cover_the_grid_once() {
        for (tm, tn) in [(1, 1), (1, 7), (7, 1), (8, 8), (9, 5), (17, 3), (64, 64)] {
            let mut seen = [[false; 64]; 64];
            for b in 0..tm * tn {
                let (m, n) = tile_coords(b, tm, tn);
                assert!(
                    m < tm && n < tn,
                    "block {b} -> ({m}, {n}) outside {tm}x{tn}"
                );
                assert!(!seen[m as usize][n as usize], "({m}, {n}) twice");
                seen[m as usize][n as usize] = true;
            }
        }
    }
}
