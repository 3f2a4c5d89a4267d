//! Kernel parameter structs shared by the oxidnn host crate and its PTX kernels.
//!
//! Every struct here is `#[repr(C)]` and is passed by value as a kernel's first parameter.
//! Host and device compile this same file, so the two sides can never disagree on a
//! field's offset. Keep it `no_std`, free of pointers and free of `bool` (not a stable
//! ABI type for kernel parameters).
#![no_std]

mod batch_norm;
mod convolution;
mod divisor;
mod dropout;
mod index_map;
mod layer_norm;
mod lrn;
mod matmul;
mod philox;
mod pooling;
mod rows;
mod softmax;

pub use batch_norm::{
    bn_flags, bn_operand, BatchNormApplyParams, BatchNormCoef, BatchNormFinalizeParams,
    BatchNormFusedParams, BatchNormGeometry, BatchNormPartial, BatchNormPipelinedParams,
    BatchNormResidentParams, BatchNormStatsParams, BN_BLOCK_THREADS, BN_BLOCK_WARPS,
    BN_COLS_SHARED_BYTES, BN_FINALIZE_THREADS_PER_FEATURE,
};
pub use convolution::{
    conv_igemm_async_shared_bytes, conv_igemm_async_table_bytes, conv_igemm_async_thread_tile,
    conv_igemm_table_bytes, conv_tma_blocks_per_sm, conv_wgmma_shared_bytes, conv_wgmma_stages,
    dw_tile_shared_bytes, dw_tile_threads, ConvDepthwiseParams, ConvDepthwiseTileParams,
    ConvFwdParams, ConvGemmParams, ConvGeometry, ConvImplicitGemmParams, ConvPadChannelsParams,
    ConvWinogradParams, PixelIndex, CONV_DIRECT_THREADS, CONV_IGEMM_ASYNC_MAX_K,
    CONV_IGEMM_ASYNC_THREADS, CONV_IGEMM_MAX_TAPS, CONV_IGEMM_REDUCE_THREADS,
    CONV_PAD_CHANNELS_THREADS, CONV_WINOGRAD_THREADS, DW_COLS, DW_PIXELS, DW_STRIP,
    DW_STRIP_THREADS, DW_THREADS, DW_TILE_AHEAD, DW_TILE_SLOTS,
};
pub use divisor::FastDivisor;
pub use dropout::{
    dropout_counter_offset, dropout_group_keeps, dropout_half, dropout_halves, dropout_keeps,
    dropout_keeps_element, dropout_key, dropout_threshold, DropoutBwdParams, DropoutFwdParams,
    DropoutState, DROPOUT_DEAL_COUNTERS, DROPOUT_GROUP, DROPOUT_LINE_BYTES, DROPOUT_MASK_WORD_BITS,
    DROPOUT_STATES_BYTES, DROPOUT_STATE_BYTES, DROPOUT_STATE_MAGIC,
};
pub use index_map::IndexMap;
pub use layer_norm::{
    layer_norm_bwd_shared_bytes, LayerNormBwdParams, LayerNormFwdParams, LayerNormWeightsParams,
    NORM_BIAS, NORM_BWD_GROUPS_SHARE_BLOCKS, NORM_DBIAS, NORM_DSCALE, NORM_F32_WEIGHTS,
    NORM_FINALIZE_THREADS, NORM_SCALE, NORM_WRITE_STATS,
};
pub use lrn::{
    lrn_pixel_slots, lrn_slot, LrnParams, LRN_CL_BWD_SLOT_BYTES, LRN_CL_FWD_SLOT_BYTES,
    LRN_WALK_BWD_SLOT_BYTES, LRN_WALK_FWD_SLOT_BYTES,
};
pub use matmul::{
    fma_matmul_shared_bytes, fma_matmul_thread_tile, fma_matmul_threads, fma_shared_bytes,
    mma_shared_bytes, mma_shared_bytes_staged, mma_stages, mma_threads, tile_coords,
    tma_shared_bytes, tma_stages, tma_threads, wgmma_shared_bytes, wgmma_stages, BiasMode,
    EpilogueOps, EpilogueParams, MatmulParams, OperandLayout, OutputLayout, OutputType, TensorMap,
    TmaOperands, FMA_BK, FMA_STAGES, FMA_THREADS, MATMUL_RASTER_GROUP, MMA_BK_BYTES,
    MMA_SHORT_K_STAGES, TMA_BOX, WGMMA_BM, WGMMA_THREADS,
};
pub use philox::{mul_wide, philox4x32_10, philox4x32_10_keyed, PhiloxKeys};
pub use pooling::{
    pooling_global_lane_fits, pooling_global_stage_bytes, pooling_walk_columns,
    pooling_walk_vec_channels, PoolBand, PoolCoord, PoolItems, PoolTile, PoolWalk, PoolWindow,
    PoolingBwdParams, PoolingFwdParams, PoolingGlobalParams, PoolingKind, POOLING_BAND_RUN,
    POOLING_CELL_VECTOR, POOLING_GLOBAL_LANE_ELEMENTS, POOLING_GLOBAL_LOADS,
    POOLING_GLOBAL_STAGED_LEN, POOLING_GLOBAL_STAGED_WARPS, POOLING_MAX_CELL, POOLING_REGION_CELLS,
    POOLING_STRIPS_PER_TURN, POOLING_WINDOWS_PER_TURN,
};
pub use rows::{MAP_SLOTS, ROW_BLOCK_THREADS, STREAM_SLOTS, STREAM_WARPS, VEC_SLOTS};
pub use softmax::{SoftmaxAlgorithm, SoftmaxBwdParams, SoftmaxFwdParams};

/// The largest tensor rank oxidnn handles (as cuDNN's `CUDNN_DIM_MAX` = 8).
pub const MAX_DIMS: usize = 8;

/// Groups of blocks a cooperative launch may synchronise separately
/// (`device::group_barrier`): the handle's barrier state holds a `u32` for each, the
/// first also the whole grid's.
pub const BARRIER_GROUPS: u32 = 1024;

/// Words of the handle's counter state: `u32`s, zeroed when allocated, that a launch may
/// count in as long as it leaves every word it used at 0 again (the next launch in stream
/// order relies on it). Kernels that use it say which words.
pub const COUNTER_WORDS: u32 = 4096;

/// Threads per block of every elementwise and reduction kernel.
pub const BLOCK_THREADS: u32 = 256;

/// 16-byte vectors (of the widest operand) a thread of a packed elementwise kernel moves.
/// Vector `v` of lane `l` in global warp `w` covers the `K = 16 / widest` elements from
/// `(w * V * 32 + v * 32 + l) * K`, so every warp-wide access is 512 contiguous bytes
/// (narrower operands: 256), and each thread has `V` independent loads in flight.
pub const PACKED_VECTORS_PER_THREAD: usize = 4;

/// Elements per vector of a packed kernel whose widest operand has `widest_element_bytes`.
pub const fn packed_vector_elements(widest_element_bytes: usize) -> usize {
    16 / widest_element_bytes
}

/// Elements a thread of a packed elementwise kernel handles.
pub const fn packed_elements_per_thread(widest_element_bytes: usize) -> usize {
    PACKED_VECTORS_PER_THREAD * packed_vector_elements(widest_element_bytes)
}

/// Side of the square tile of the tiled transpose kernel (elements).
pub const TRANSPOSE_TILE: u32 = 64;
/// Rows of a transpose tile the block's threads cover per step (`BLOCK_THREADS / TILE`).
pub const TRANSPOSE_BLOCK_ROWS: u32 = BLOCK_THREADS / TRANSPOSE_TILE;

/// Activation functions, numbered as the device `match` expects.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationKind {
    Identity = 0,
    Relu = 1,
    /// `min(max(x, 0), coef)`.
    ClippedRelu = 2,
    /// `x` if `x > 0` else `coef * x`.
    LeakyRelu = 3,
    /// `x` if `x > 0` else `coef * (exp(x) - 1)`.
    Elu = 4,
    Sigmoid = 5,
    Tanh = 6,
    /// `x * sigmoid(coef * x)` (swish; `coef = 1` is SiLU).
    Swish = 7,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    GeluErf = 8,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh = 9,
    /// `ln(1 + exp(x))`.
    Softplus = 10,
}

impl ActivationKind {
    /// Every kind, in discriminant order.
    pub const ALL: [ActivationKind; 11] = [
        Self::Identity,
        Self::Relu,
        Self::ClippedRelu,
        Self::LeakyRelu,
        Self::Elu,
        Self::Sigmoid,
        Self::Tanh,
        Self::Swish,
        Self::GeluErf,
        Self::GeluTanh,
        Self::Softplus,
    ];

    /// The kind a raw discriminant names; unknown values read as identity.
    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Relu,
            2 => Self::ClippedRelu,
            3 => Self::LeakyRelu,
            4 => Self::Elu,
            5 => Self::Sigmoid,
            6 => Self::Tanh,
            7 => Self::Swish,
            8 => Self::GeluErf,
            9 => Self::GeluTanh,
            10 => Self::Softplus,
            _ => Self::Identity,
        }
    }
}

/// Parameters of `activation_fwd_*`: `y = alpha * f(x) + beta * y`.
/// Operand order in `map`: `[x, y]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ActivationFwdParams {
    pub kind: u32,
    pub coef: f32,
    pub alpha: f32,
    pub beta: f32,
    pub len: u64,
    pub map: IndexMap<2>,
}

/// Parameters of `activation_bwd_*`: `dx = alpha * f'(x) * dy + beta * dx`.
/// Operand order in `map`: `[dy, x, dx]` (`y` is accepted, as cuDNN's API takes it, but
/// no kind needs to read it: derivatives are evaluated at `x`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ActivationBwdParams {
    pub kind: u32,
    pub coef: f32,
    pub alpha: f32,
    pub beta: f32,
    pub len: u64,
    pub map: IndexMap<3>,
}

/// Pointwise operations of `tensor_op_*`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PointwiseOp {
    /// `c = alpha1 * a + beta * c` (add_tensor, scale_tensor; `b` unused).
    CopyA = 0,
    Add = 1,
    Mul = 2,
    Min = 3,
    Max = 4,
    /// `c = sqrt(alpha1 * a) + beta * c`.
    Sqrt = 5,
    /// `c = 1 - alpha1 * a + beta * c` (cuDNN's logical NOT).
    Not = 6,
    /// `c = alpha1` (set_tensor; `a`, `b` and the old `c` unused).
    Fill = 7,
}

impl PointwiseOp {
    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Add,
            2 => Self::Mul,
            3 => Self::Min,
            4 => Self::Max,
            5 => Self::Sqrt,
            6 => Self::Not,
            7 => Self::Fill,
            _ => Self::CopyA,
        }
    }

    /// Whether the op reads its second operand.
    #[inline(always)]
    pub fn reads_b(self) -> bool {
        matches!(self, Self::Add | Self::Mul | Self::Min | Self::Max)
    }

    /// Whether the op reads its first operand.
    #[inline(always)]
    pub fn reads_a(self) -> bool {
        !matches!(self, Self::Fill)
    }
}

/// Parameters of `tensor_op_*`: `c = op(alpha1 * a, alpha2 * b) + beta * c`.
/// Operand order in `map`: `[a, b, c]`.
///
/// `tensor_op_broadcast_*` reads `c` and the one operand that is not `broadcast` as packed
/// (element `i` at offset `i`) and operand `broadcast` (0 = a, 1 = b) through `map`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TensorOpParams {
    pub op: u32,
    pub alpha1: f32,
    pub alpha2: f32,
    pub beta: f32,
    pub len: u64,
    pub broadcast: u32,
    pub _pad: u32,
    /// Stride (elements) of the broadcast operand along the innermost dim of `map`.
    pub broadcast_inner_stride: u64,
    /// Extent of the innermost dim of `map`.
    pub broadcast_inner_len: FastDivisor,
    pub _pad2: u32,
    pub map: IndexMap<3>,
}

/// Parameters of `transform_*` (elementwise, any strides): `y = alpha * x + beta * y`,
/// converting dtype. Operand order in `map`: `[x, y]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TransformParams {
    pub alpha: f32,
    pub beta: f32,
    pub len: u64,
    pub map: IndexMap<2>,
}

/// Parameters of `transform_rows_v4`: a gather of `len / chunks` rows of `chunks` 16-byte
/// chunks each into a packed destination (row `r`, chunk `j` to chunk `r * chunks + j`),
/// row `r` starting `rows.offsets(r)[0]` chunks into the source.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowGatherParams {
    /// Chunks in all (below 2^32).
    pub len: u64,
    pub chunks: FastDivisor,
    pub rows: IndexMap<1>,
}

/// Parameters of `transpose_*`: a [`TransformParams`] whose source and destination have
/// different unit-stride dims. A block moves a `TRANSPOSE_TILE`² tile through shared
/// memory so that both the loads (along `x`'s unit-stride dim, `a`) and the stores (along
/// `y`'s unit-stride dim, `b`) are coalesced. `batch` maps the remaining dims.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TransposeParams {
    pub alpha: f32,
    pub beta: f32,
    /// Extent of dim `a` (unit stride in x).
    pub len_a: u32,
    /// Extent of dim `b` (unit stride in y).
    pub len_b: u32,
    /// Tiles along `a`, as a divisor of the block index.
    pub tiles_a: FastDivisor,
    /// Tiles along `b`.
    pub tiles_b: FastDivisor,
    /// Stride of dim `b` in x (elements).
    pub x_stride_b: u64,
    /// Stride of dim `a` in y (elements).
    pub y_stride_a: u64,
    /// Bit 0: 16-bit x may be read two elements (one word) at a time along `a`; bit 1: 16-bit
    /// y may be written so along `b` (the host sets them when extents and strides are even).
    pub pairs: u32,
    pub _pad: u32,
    /// The other dims; operand order `[x, y]`.
    pub batch: IndexMap<2>,
}

/// Reduction operations of `reduce_*`, as cuDNN's `cudnnReduceTensorOp_t`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Add = 0,
    Mul = 1,
    Min = 2,
    Max = 3,
    /// Maximum of absolute values.
    Amax = 4,
    Avg = 5,
    /// Sum of absolute values.
    Norm1 = 6,
    /// Square root of the sum of squares.
    Norm2 = 7,
    /// Product of the non-zero elements (1 if all are zero).
    MulNoZeros = 8,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 9] = [
        Self::Add,
        Self::Mul,
        Self::Min,
        Self::Max,
        Self::Amax,
        Self::Avg,
        Self::Norm1,
        Self::Norm2,
        Self::MulNoZeros,
    ];

    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::Mul,
            2 => Self::Min,
            3 => Self::Max,
            4 => Self::Amax,
            5 => Self::Avg,
            6 => Self::Norm1,
            7 => Self::Norm2,
            8 => Self::MulNoZeros,
            _ => Self::Add,
        }
    }

    /// Whether the op selects one element (and so can report its index).
    #[inline(always)]
    pub fn selects(self) -> bool {
        matches!(self, Self::Min | Self::Max | Self::Amax)
    }
}

/// Parameters of `reduce_*`.
///
/// Output element `o` (of `out_len`) reduces the `red_len` input elements at
/// `x_base(o) + red_offset(r)`; `out.offsets(o) = [x_base, y_offset, index_offset]`,
/// `red.offsets(r) = [x_offset]`. Result: `y = alpha * reduce + beta * y`; for selecting
/// ops the flattened index `r` of the chosen element is written to `indices` (u32) when
/// `write_indices != 0`.
///
/// Split reductions (`splits > 1`): block `(o, s)` reduces the slice
/// `[s * split_len, min((s + 1) * split_len, red_len))` into `partials[o * splits + s]`
/// and `reduce_finalize_*` combines the `splits` partials of each output.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReduceParams {
    pub op: u32,
    pub alpha: f32,
    pub beta: f32,
    pub write_indices: u32,
    pub out_len: u32,
    pub red_len: u32,
    pub splits: u32,
    pub split_len: u32,
    /// Lanes per output of `reduce_warp_*` (a power of two, 1 to 32).
    pub group: u32,
    pub _pad: u32,
    pub out: IndexMap<3>,
    pub red: IndexMap<1>,
}

/// One partial result of a split reduction, as the workspace holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReducePartial {
    pub value: f32,
    pub index: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_divisor_matches_integer_division() {
        let divisors = [
            1u32,
            2,
            3,
            5,
            7,
            31,
            32,
            33,
            1000,
            65535,
            65536,
            1 << 31,
            (1 << 31) + 1,
            u32::MAX,
        ];
        let numerators = [
            0u32,
            1,
            2,
            3,
            31,
            32,
            1000,
            123_456_789,
            (1 << 31) - 1,
            1 << 31,
            u32::MAX - 1,
            u32::MAX,
        ];
        for &d in &divisors {
            let f = FastDivisor::new(d);
            for &n in &numerators {
                assert_eq!(f.div_rem(n), (n / d, n % d), "{n} / {d}");
            }
        }
        // A denser sweep of small divisors over a spread of numerators.
        let mut n: u32 = 12345;
        for d in 1..2000u32 {
            let f = FastDivisor::new(d);
            for _ in 0..64 {
                n = n.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                assert_eq!(f.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn index_map_walks_row_major() {
        let mut m = IndexMap::<2> {
            rank: 3,
            ..Default::default()
        };
        m.dims[0] = FastDivisor::new(2);
        m.dims[1] = FastDivisor::new(3);
        m.dims[2] = FastDivisor::new(4);
        m.strides[0] = [12, 4, 1, 0, 0, 0, 0, 0]; // packed
        m.strides[1] = [1, 2 * 4, 2, 0, 0, 0, 0, 0]; // a permuted layout
        for i in 0..24u32 {
            let (n, c, w) = (i / 12, (i / 4) % 3, i % 4);
            assert_eq!(m.offsets(i), [i as u64, (n + 8 * c + 2 * w) as u64]);
        }
    }

    #[test]
    fn index_map_offsets_agree_with_a_mixed_radix_walk_at_every_rank() {
        // Ranks 1 and 2 take their own walks; every rank must give the row-major
        // mixed-radix offsets, including past the shape's end (the outermost dim wraps).
        let mut seed: u32 = 7;
        let mut next = |m: u32| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) % m
        };
        for rank in 0..=MAX_DIMS {
            let mut m = IndexMap::<3> {
                rank: rank as u32,
                ..Default::default()
            };
            for d in 0..rank {
                m.dims[d] = FastDivisor::new(1 + next(7));
                for k in 0..3 {
                    m.strides[k][d] = next(1000) as u64 * if k == 2 { 1 << 33 } else { 1 };
                }
            }
            let len: u32 = (0..rank).map(|d| m.dims[d].divisor).product();
            for i in (0..len + 5).chain([u32::MAX]) {
                let mut want = [0u64; 3];
                let mut rest = i;
                for d in (0..rank).rev() {
                    let n = m.dims[d].divisor;
                    for (k, w) in want.iter_mut().enumerate() {
                        *w += (rest % n) as u64 * m.strides[k][d];
                    }
                    rest /= n;
                }
                assert_eq!(m.offsets(i), want, "rank {rank}, index {i}");
            }
        }
    }
}
