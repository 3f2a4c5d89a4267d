//! Parameters of the batch-normalization kernels (`batch_norm_*`).
//!
//! A batch-norm problem is a set of *features* (spatial mode: the channels; per-activation
//! mode: every `C, [D,] H, W` position) each normalized over its *reduction* elements
//! (spatial: `N, [D,] H, W`; per-activation: `N`). Element `(f, r)` of operand `k` lives at
//! `feat.offsets(f)[k] + red.offsets(r)[k]`; the operand slots are [`bn_operand`].
//!
//! The training passes: a *stats* kernel leaves one [`BatchNormPartial`] per (chunk,
//! feature) in the workspace, a *finalize* kernel combines each feature's partials in a
//! fixed order (so results are bitwise reproducible) and writes the per-feature outputs and
//! [`BatchNormCoef`]s, an *apply* kernel makes the elementwise outputs. Two thread
//! mappings: *rows* (the reduction is contiguous, e.g. NCHW spatial: a block per (feature,
//! chunk), threads along the reduction) and *cols* (features contiguous, e.g. NHWC: a block
//! per (feature tile, chunk of rows), threads along the features).

use crate::IndexMap;

/// Operand slots of [`BatchNormGeometry`]'s index maps.
pub mod bn_operand {
    /// The input `x`.
    pub const X: usize = 0;
    /// The forward output `y` (read by the fused-relu backward for its mask).
    pub const Y: usize = 1;
    /// Forward: the residual `z`; backward: `dy`.
    pub const Z_OR_DY: usize = 2;
    /// Backward: `dx`.
    pub const DX: usize = 3;
    /// Backward: `dz`.
    pub const DZ: usize = 4;
    /// The per-feature tensors (scale, bias, means, variances); zero strides along the
    /// reduction.
    pub const PARAM: usize = 5;
    /// Slots in all.
    pub const COUNT: usize = 6;
}

/// Threads per block of the stats and apply kernels, at most (the host may halve it).
pub const BN_BLOCK_THREADS: u32 = 256;
/// Warps per block of the stats and apply kernels.
pub const BN_BLOCK_WARPS: u32 = BN_BLOCK_THREADS / 32;
/// Dynamic shared memory of the cols stats kernels: per warp and lane, a count and two
/// values for each of up to 8 features (a 16-byte vector of 16-bit elements).
pub const BN_COLS_SHARED_BYTES: u32 = BN_BLOCK_WARPS * 32 * (1 + 2 * 8) * 4;
/// Threads per feature (one warp) in the finalize kernels.
pub const BN_FINALIZE_THREADS_PER_FEATURE: u32 = 32;

/// Flags of the batch-norm kernels (bits of a `flags` field).
pub mod bn_flags {
    /// Apply: add the residual `z` before the activation.
    pub const ADD: u32 = 1;
    /// Apply and backward: relu after the (add and) normalization; backward masks `dy`
    /// with `y > 0`.
    pub const RELU: u32 = 2;
    /// Forward apply: compute the coefficients from scale, bias and the estimated mean and
    /// variance (inference) instead of reading finalized [`crate::BatchNormCoef`]s.
    pub const COEF_FROM_PARAMS: u32 = 4;
    /// Backward: the mean and inverse std come from the workspace (recomputed), not from
    /// the saved-statistics tensors.
    pub const STATS_IN_WORKSPACE: u32 = 8;
    /// Forward finalize: update the running mean and variance.
    pub const RUNNING: u32 = 16;
    /// Forward finalize: write the saved mean and inverse std.
    pub const SAVED: u32 = 32;
    /// Forward finalize: the running statistics are overwritten, not read (factor 1).
    pub const RUNNING_OVERWRITE: u32 = 64;
    /// Backward stats (and the resident backward): also store the masked gradient `g` as
    /// `dz` (the fused add's gradient with blend factors 1 and 0), so the apply pass reads
    /// `g` instead of `dy` and `y`.
    pub const WRITE_GRAD: u32 = 128;
    /// Cols apply, and the resident kernels where they stream rows: deal the rows to the
    /// chunks a block-wide step at a time, so the grid walks the tensor together, instead
    /// of a contiguous chunk a block.
    pub const INTERLEAVE_ROWS: u32 = 256;
}

/// How the elements of a batch-norm problem are laid out and split over blocks.
///
/// Rows mode: block `b` works on feature `b / chunks`, chunk `b % chunks` (apply kernels
/// take the blocks in reverse order, so they start with what the stats pass read last and
/// may still find it in L2); a chunk is `chunk_len` vectors of `vector` consecutive
/// reduction elements. Cols mode: block `b` works on feature tile `b % tiles`, chunk
/// `b / tiles`; thread `t` on the `vector` features starting at
/// `(tile * tile_vectors + t % tile_vectors) * vector` and on rows `t / tile_vectors`,
/// `+ blockDim / tile_vectors`, .. of its chunk of `chunk_len` rows. Blocks have at most
/// `BN_BLOCK_THREADS` threads (the host picks 256 or 128 per kernel, by occupancy).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormGeometry {
    /// Features `F`.
    pub features: u32,
    /// Reduction elements per feature `M`.
    pub red_len: u32,
    /// Elements per vector access (1: scalar).
    pub vector: u32,
    /// Chunks the reduction is split into (per feature, or per feature tile).
    pub chunks: u32,
    /// Rows mode: vectors per chunk; cols mode: rows per chunk.
    pub chunk_len: u32,
    /// Rows mode: vectors per feature (`red_len / vector`); cols mode: feature vectors
    /// (`features / vector`).
    pub vectors: u32,
    /// Cols mode: feature tiles.
    pub tiles: u32,
    /// Cols mode: feature vectors per tile (a power of two, 1 to 32).
    pub tile_vectors: u32,
    /// `log2(tile_vectors)`.
    pub tile_vectors_log2: u32,
    pub _pad: u32,
    pub feat: IndexMap<{ bn_operand::COUNT }>,
    pub red: IndexMap<{ bn_operand::COUNT }>,
}

/// Parameters of `batch_norm_{fwd,bwd}_stats_{rows,cols}_*`.
///
/// Forward: partial `chunk * features + f` = ([`BatchNormPartial`]) count, mean and sum of
/// squared deviations of `x` over the chunk. Backward: count, `sum(g)` and
/// `sum(g * (x - mean))` where `g = dy` (masked by `y > 0` with [`bn_flags::RELU`], read
/// from the relu mask where `relu_mask` is given).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormStatsParams {
    pub geo: BatchNormGeometry,
    pub flags: u32,
    pub _pad: u32,
    /// Backward: the [relu mask](BatchNormApplyParams::relu_mask), or 0 (read `y`).
    pub relu_mask: u64,
}

/// Parameters of `batch_norm_fwd_finalize` and `batch_norm_bwd_finalize`: one warp per
/// feature combines the `chunks` partials of its feature in a fixed order (f64).
///
/// Forward: mean, biased variance `var`, `inv_std = 1 / sqrt(var + epsilon)`; coefficient
/// `f` = `(mean, inv_std, scale * inv_std, bias)` (the last two only where scale and bias
/// are given); saved mean / inv std ([`bn_flags::SAVED`]); running mean and variance
/// ([`bn_flags::RUNNING`]): `(1 - factor) * running + factor * batch`, with the unbiased
/// variance `var * n / (n - 1)`.
///
/// Backward: `dbias = sum(g)`, `dscale = sum(g (x - mean)) * inv_std`, each blended
/// `alpha * d + beta * old`; coefficient `f` = `(mean, c1, c2, c3)` with
/// `dx = c1 g + c2 (x - mean) + c3`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormFinalizeParams {
    pub features: u32,
    pub chunks: u32,
    pub flags: u32,
    pub _pad: u32,
    pub epsilon: f64,
    pub factor: f64,
    pub alpha: f32,
    pub beta: f32,
    /// Feature offsets of the per-feature tensors (slot [`bn_operand::PARAM`]).
    pub feat: IndexMap<{ bn_operand::COUNT }>,
}

/// Parameters of `batch_norm_{fwd,bwd}_apply_{rows,cols}_*`.
///
/// Forward: `y = alpha * act((x - mean) * a + bias [+ z]) + beta * y` with the
/// coefficients of the finalize pass (or, with [`bn_flags::COEF_FROM_PARAMS`],
/// `a = scale / sqrt(var + epsilon)` from the estimated statistics). Backward:
/// `dx = alpha * (c1 g + c2 (x - mean) + c3) + beta * dx`, and with [`bn_flags::ADD`]
/// `dz = alpha * g + beta * dz`. `beta == 0` never reads the output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormApplyParams {
    pub geo: BatchNormGeometry,
    pub flags: u32,
    pub alpha: f32,
    pub beta: f32,
    pub epsilon: f32,
    /// Device address of the relu mask (the training reserve space), or 0: bit `i` (of
    /// 32-bit words, least significant first) says whether the output `y` stored at
    /// element offset `i` of `x`'s layout is positive. Forward training (with
    /// [`bn_flags::RELU`]) writes it; the backward reads it instead of `y`.
    pub relu_mask: u64,
}

/// Parameters of `batch_norm_{fwd,bwd}_fused_rows_*`: a whole training pass in one launch
/// when a block holds a feature's whole reduction (rows mapping, one chunk, a block per
/// feature). Each block reduces its feature as a stats kernel would (geometry
/// `apply.geo`), finalizes it from the block total (every thread computes the
/// coefficient; thread 0 writes the per-feature outputs), then applies it to the same
/// elements, visited last to first (the data read last, still in L1/L2, comes first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormFusedParams {
    /// Geometry, apply flags ([`bn_flags::ADD`], [`bn_flags::RELU`]) and blend factors of
    /// the data outputs.
    pub apply: BatchNormApplyParams,
    /// Finalize flags, epsilon, running-average factor and the parameter-gradient blend.
    pub finalize: BatchNormFinalizeParams,
}

/// Parameters of `batch_norm_{fwd,bwd}_resident_cols_*`: a whole training pass in one
/// cooperative launch, for the cols mapping with 16-byte vectors, keeping as much of the
/// data on chip as fits so that it is read from memory once (forward `x`; backward `x`
/// and `g`, `dy` masked behind a relu, one region of `resident_rows` rows each, in that
/// order, then with the relu mask a region of its 4-byte words, one per vector and row).
///
/// Blocks, threads and partials as in the cols stats kernels (geometry `fused.apply.geo`:
/// `tiles * chunks` blocks of [`BN_BLOCK_THREADS`], all resident at once). Each block keeps
/// the first `resident_rows` rows of its chunk (a multiple of the rows a block steps by,
/// `BN_BLOCK_THREADS / tile_vectors`, or the whole chunk) in its dynamic shared memory,
/// after the
/// [`BN_COLS_SHARED_BYTES`] of its reduction scratch: row `l` of the chunk, feature vector
/// `v` of the tile at `16 * (l * tile_vectors + v)`. Where the rest is streamed, chunks
/// are whole steps of rows, and with [`bn_flags::INTERLEAVE_ROWS`] chunk `c`'s steps are
/// the tensor's steps `c, c + chunks, ..` (its first rows are its first steps). Phases,
/// separated by grid barriers:
/// the stats (partials, as the stats kernel); the finalize; the apply (streamed rows last
/// to first, then the resident rows). The finalize, with `fused.finalize`'s formulas:
/// with `local_finalize`, each tile's blocks meet at a barrier of their own (`chunks`
/// blocks) and each finalizes the tile's features itself, into its shared memory (no
/// second barrier); otherwise the grid's blocks take a feature each in turn, with the
/// finalize kernel's formulas, between two grid barriers, the coefficients through the
/// workspace.
/// Barrier state: a word per tile (at most [`crate::BARRIER_GROUPS`]), the first also the
/// grid's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormResidentParams {
    pub fused: BatchNormFusedParams,
    /// Rows of each chunk kept in shared memory: a multiple of the block's row step
    /// (`BN_BLOCK_THREADS / tile_vectors`), or the whole chunk.
    pub resident_rows: u32,
    /// Nonzero: every block finalizes its tile's features after a barrier of the tile.
    pub local_finalize: u32,
    pub _pad: [u32; 2],
}

/// Parameters of `batch_norm_{fwd,bwd}_pipelined_rows_*` (and `fwd_pipelined_plain_rows`):
/// a training pass of a rows problem too large for L2 in one cooperative launch that reads
/// its inputs from memory about once, the apply of each feature following its statistics
/// closely enough to find the feature's data still in L2.
///
/// The work is `2 * features * chunks` tasks of one block each (geometry `fused.apply.geo`:
/// `chunks` chunks of `chunk_len` vectors a feature), in this order: the stats tasks of
/// features `0 .. lookahead`, then those of feature `lookahead + k` and the apply tasks of
/// feature `k` in turn, then the apply tasks of the last `lookahead` features. Block `b`
/// of the grid takes tasks `b, b + grid, ..` in that order. A stats task leaves its
/// partial (as the stats kernels) and counts itself in its feature's word of the counter
/// state; the block whose task completes a feature finalizes it (the finalize kernels'
/// formulas on `fused.finalize`, in the same fixed order), writes its coefficient to
/// `coef` and counts once more. An apply task waits for that last count, then applies
/// the feature's coefficient to its chunk as the apply kernels would. The backward takes
/// the saved statistics.
///
/// Counter state (the handle's, [`crate::COUNTER_WORDS`] words, 0 when the launch
/// starts): word 0 counts the blocks that are done, words `1 ..= features` the features'
/// counts; the last block done sets them back to 0. Every task waits only on tasks before
/// it in the order, which blocks resident at once reach first: the launch is cooperative.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchNormPipelinedParams {
    pub fused: BatchNormFusedParams,
    /// Features whose stats run ahead of the first apply (at least 1, at most `features`).
    pub lookahead: u32,
    pub _pad: [u32; 3],
}

/// A chunk's partial statistics of one feature, as the workspace holds them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchNormPartial {
    /// Elements in the chunk.
    pub count: f32,
    /// Forward: mean; backward: `sum(g)`.
    pub a: f32,
    /// Forward: sum of squared deviations from the mean; backward: `sum(g (x - mean))`.
    pub b: f32,
    pub _pad: f32,
}

/// The per-feature coefficients the finalize kernels leave for the apply kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchNormCoef(pub [f32; 4]);
