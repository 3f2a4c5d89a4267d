//! Parameters of the convolution kernels (`conv_*`).
//!
//! Every convolution kernel sees 3 spatial dims `[d, h, w]`: a 2-D convolution has `d` of
//! extent 1 (filter 1, stride 1, no padding), a 1-D one `d` and `h`. Tensors are 5-D:
//! x `[n, c, d, h, w]`, the filter `[k, c / groups, t, r, s]`, y and the residual z
//! `[n, k, p0, p1, p2]`; strides are in elements, 32-bit (the host checks that every
//! tensor spans fewer than 2^31 elements).

use crate::{EpilogueOps, FastDivisor, PoolItems};

/// The convolution itself: output element `(n, k, o)` (`o` spatial) sums, over the
/// `c_per_group` channels of `k`'s group and the filter taps `f`, `x[n, g * c_per_group
/// + c, i] * w[k, c, f']`, where `i[j] = o[j] * stride[j] - pad[j] + f[j] * dilation[j]`
/// (taps with `i` outside the input contribute 0) and `f' = f` (cross-correlation) or the
/// reversed tap `filter - 1 - f` (convolution, `flip == 1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConvGeometry {
    pub n: u32,
    pub c: u32,
    pub k: u32,
    pub groups: u32,
    pub c_per_group: u32,
    pub k_per_group: u32,
    /// 1: convolution mode (the filter is applied reversed); 0: cross-correlation.
    pub flip: u32,
    pub _pad: u32,
    pub input: [u32; 3],
    pub output: [u32; 3],
    pub filter: [u32; 3],
    pub pad: [u32; 3],
    pub stride: [u32; 3],
    pub dilation: [u32; 3],
    /// Strides of x over `[n, c, d, h, w]`.
    pub x: [u32; 5],
    /// Strides of the filter over `[k, c, t, r, s]`.
    pub w: [u32; 5],
    /// Strides of y over `[n, k, p0, p1, p2]`.
    pub y: [u32; 5],
    /// Strides of the residual z over y's dims (unused when the epilogue has none).
    pub z: [u32; 5],
}

impl ConvGeometry {
    /// Filter taps per output element and group channel: `t * r * s`.
    #[inline(always)]
    pub fn taps(&self) -> u32 {
        self.filter[0] * self.filter[1] * self.filter[2]
    }

    /// The input coordinate that filter tap `f` of spatial dim `j` reads for output
    /// coordinate `o`, or `None` where it falls in the padding.
    #[inline(always)]
    pub fn input_at(&self, j: usize, o: u32, f: u32) -> Option<u32> {
        let i = (o * self.stride[j] + f * self.dilation[j]) as i64 - self.pad[j] as i64;
        if i >= 0 && i < self.input[j] as i64 {
            Some(i as u32)
        } else {
            None
        }
    }

    /// The filter index tap `f` of spatial dim `j` reads (reversed in convolution mode).
    #[inline(always)]
    pub fn filter_at(&self, j: usize, f: u32) -> u32 {
        if self.flip != 0 {
            self.filter[j] - 1 - f
        } else {
            f
        }
    }
}

/// Parameters of `conv_fwd_direct_*`: one thread per output element, items counted over
/// y's dims `[n, k, p0, p1, p2]` in y's memory order (see [`PoolItems`]), each through
/// the epilogue `ops` (bias one per output channel).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvFwdParams {
    pub geo: ConvGeometry,
    pub ops: EpilogueOps,
    pub items: PoolItems,
}

/// Threads per block of the direct kernels.
pub const CONV_DIRECT_THREADS: u32 = 256;

/// The `[n, p0, p1, p2]` of flat output pixel `m` (row `m` of an implicit GEMM whose rows
/// are y's pixels, `n` slowest).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PixelIndex {
    pub p0: FastDivisor,
    pub p1: FastDivisor,
    pub p2: FastDivisor,
}

impl PixelIndex {
    pub fn new(output: [u32; 3]) -> Self {
        Self {
            p0: FastDivisor::new(output[0]),
            p1: FastDivisor::new(output[1]),
            p2: FastDivisor::new(output[2]),
        }
    }

    /// `(n, [o0, o1, o2])` of pixel `m`.
    #[inline(always)]
    pub fn at(&self, m: u32) -> (u32, [u32; 3]) {
        let (q, o2) = self.p2.div_rem(m);
        let (q, o1) = self.p1.div_rem(q);
        let (n, o0) = self.p0.div_rem(q);
        (n, [o0, o1, o2])
    }
}

/// Parameters of the implicit-GEMM tensor-core kernels (`conv_fwd_igemm_tc_*`,
/// `wgmma_conv_fwd_igemm_*`): per group `g` (grid y), the GEMM
/// `y[pixel, k] = sum_kk A[pixel, kk] * B[k, kk]` with rows the `m` output pixels
/// ([`PixelIndex`], `n` slowest), columns the group's `k_per_group` output channels, and
/// `kk` running over the filter taps as stored (outer) and then the group's channels in
/// blocks of one K tile (`BK` elements): K tile `kt` is tap `kt / c_tiles`, channels
/// `(kt % c_tiles) * BK ..` (past `c_per_group` zero-filled). The tap is decomposed as
/// `[t, r, s]` of the stored filter; in convolution mode the input is read at the
/// reversed tap.
///
/// The grid is `(tiles_m * tiles_n, groups)`: block `(b, g)` computes output tile
/// [`crate::tile_coords`]`(b)` of group `g`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvGemmParams {
    pub geo: ConvGeometry,
    pub ops: EpilogueOps,
    pub pixels: PixelIndex,
    /// K tiles per filter tap: `ceil(c_per_group / BK)` for the kernel's `BK`.
    pub c_tiles: FastDivisor,
    /// The filter's `r` and `s` extents (`geo.filter[1]`, `geo.filter[2]`).
    pub filter_r: FastDivisor,
    pub filter_s: FastDivisor,
    /// Output pixels: `n * p0 * p1 * p2`.
    pub m: u32,
    /// K tiles in all: `taps * c_tiles`.
    pub k_tiles: u32,
    pub tiles_m: u32,
    pub tiles_n: u32,
    /// The group's channels (`geo.c_per_group`): the gather kernels
    /// (`conv_fwd_igemm_tc_gather_*`) flatten K as `kk = tap * c_per_group + c` (their
    /// `k_tiles` is `ceil(taps * c_per_group / BK)`, `c_tiles` unused).
    pub channels: FastDivisor,
}

/// Pipeline depth of the implicit GEMM's `wgmma` `128 x bn` tile: matmul's
/// ([`crate::wgmma_stages`]), except 4 for `bn = 64`, so that two blocks share an SM (a
/// convolution's K is often short: each block's prologue and epilogue then hide behind the
/// other's main loop).
pub const fn conv_wgmma_stages(bn: u32) -> u32 {
    if bn <= 64 {
        4
    } else {
        crate::wgmma_stages(bn)
    }
}

/// Blocks per SM of the implicit GEMM's TMA `wgmma` `128 x bn` tile: two for `bn <= 128`
/// (a convolution's K is short: one block's pipeline fill and epilogue then run while
/// the other multiplies; +15-35% on ResNet-50's 3x3 layers, H100), one for 256 (its
/// accumulators need the registers). Matmul's TMA tiles keep one block per SM: its RNN
/// shapes (N <= 128) lost 10% with two.
pub const fn conv_tma_blocks_per_sm(bn: u32) -> u32 {
    if bn <= 128 {
        2
    } else {
        1
    }
}

/// Dynamic shared memory of the implicit GEMM's `wgmma` `128 x bn` tile (as
/// [`crate::wgmma_shared_bytes`], with [`conv_wgmma_stages`]).
pub const fn conv_wgmma_shared_bytes(bn: u32) -> u32 {
    (crate::WGMMA_BM + bn) * crate::MMA_BK_BYTES * conv_wgmma_stages(bn) + 1024
}
/// Parameters of the Winograd F(2x2, 3x3) kernels `conv_fwd_winograd_{input,filter,
/// output}_<dtype>` (2-D problems: `d` of extent 1). Output tile `t` (`n` slowest, then
/// the tile row, then the tile column) covers output pixels `[2 th, 2 th + 2) x
/// [2 tw, 2 tw + 2)` and reads the 4x4 input patch from `(2 th - pad_h, 2 tw - pad_w)`
/// (zeros outside x). The workspace holds 16 matrices per transform, one per point `xi`
/// of the 4x4 transformed tile:
///
/// * V (input transform, x's dtype): element `(xi, t, c)` at `xi * v.batch + t * v.mn +
///   c * v.k` (the matmul's `A`, `tiles x C`);
/// * U (filter transform, x's dtype): `(xi, k, c)` at `xi * u.batch + k * u.mn + c * u.k`
///   (the matmul's `B` as `N x K`, `K x C`);
/// * M = V U^T (the batched matmul's f32 result): `(xi, t, k)` at `xi * m.batch + t *
///   m.row + k * m.col`.
///
/// Each kernel walks `items` work items, item `i` being `(outer, inner) = (i / inner,
/// i % inner)`: (tile, channel) or (channel, tile) as `channel_inner` says for the input
/// and output transforms, (k, c) for the filter transform. The `_c2` transforms take two
/// consecutive channels per item (the inner index then counts channel pairs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvWinogradParams {
    pub geo: ConvGeometry,
    /// The output transform's epilogue (bias one per output channel).
    pub ops: EpilogueOps,
    /// Output tiles per image along h and w: `ceil(p / 2)`, `ceil(q / 2)`.
    pub tiles_h: FastDivisor,
    pub tiles_w: FastDivisor,
    /// The inner extent of this launch's items.
    pub inner: FastDivisor,
    /// Work items of this launch (below 2^31).
    pub items: u32,
    /// 1: the channel (c or k) is the inner index of an input/output transform item, the
    /// tile the outer; 0: the reverse.
    pub channel_inner: u32,
    pub _pad: u32,
    pub v: crate::OperandLayout,
    pub u: crate::OperandLayout,
    pub m: crate::OutputLayout,
}

/// Threads per block of the Winograd transform kernels.
pub const CONV_WINOGRAD_THREADS: u32 = 256;
/// Parameters of `conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32`: per group `g` (grid y), the
/// exact-f32 GEMM `acc[pixel, k] = sum_kk im2col(x)[pixel, kk] * w[k, kk]` over
/// `gemm_k = c_per_group * taps` products, `kk` ordered channel-outer (`kk = c * taps +
/// tap`, `kp` kernels) or channel-inner (`kk = tap * c_per_group + c`, `pk` kernels).
/// `kp` kernels make the output channels the GEMM's rows and the pixels its columns (for
/// pixel-contiguous x and y, NCHW); `pk` kernels the other way round (channels-last).
///
/// Split-K (`splits > 1`): K is cut into `splits` partitions of `split_k` products (the
/// last one shorter); the grid's x is `splits * tiles_m * tiles_n`, block `b` computing
/// partition `b / (tiles_m * tiles_n)` of tile `b % (tiles_m * tiles_n)`. Each block
/// stores its raw partial sums to the workspace, GEMM element `(row, col)` of group `g`,
/// partition `s` at `((g * splits + s) * rows + row) * cols + col` (`rows x cols` the
/// group's GEMM), and `conv_fwd_implicit_gemm_reduce_<kp|pk>_f32` then adds the
/// partitions in order `0, 1, ..` (deterministic) and applies the epilogue once.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvImplicitGemmParams {
    pub geo: ConvGeometry,
    pub ops: EpilogueOps,
    /// Decomposes the flat output pixel (`n * p0 * p1 * p2` of them).
    pub pixels: PixelIndex,
    /// Splits `kk` into (outer, inner): divisor `taps` (`kp`) or `c_per_group` (`pk`).
    pub inner: FastDivisor,
    /// Output pixels of all images.
    pub m_pixels: u32,
    /// `c_per_group * taps`.
    pub gemm_k: u32,
    /// Output tiles along the GEMM's rows and columns.
    pub tiles_m: u32,
    pub tiles_n: u32,
    /// K partitions (1: no split-K, the blocks apply the epilogue themselves).
    pub splits: u32,
    /// Products per partition: a multiple of [`crate::FMA_BK`] when `splits > 1`, else
    /// `gemm_k`.
    pub split_k: u32,
}

/// Threads per block of `conv_fwd_implicit_gemm_reduce_*` (one pair of columns each).
pub const CONV_IGEMM_REDUCE_THREADS: u32 = 256;

/// Most filter taps (`t * r * s`) the implicit-GEMM kernels keep offset tables for in
/// shared memory.
pub const CONV_IGEMM_MAX_TAPS: u32 = 1024;

/// Threads of every `conv_fwd_implicit_gemm_async_*` block (4 warps).
pub const CONV_IGEMM_ASYNC_THREADS: u32 = 128;

/// Outputs per thread, `(rows, cols)`, of the `cp.async` implicit GEMM's `bm x bn` tile
/// at [`CONV_IGEMM_ASYNC_THREADS`] threads: 8 x 16 on 128 x 128 (64 x 64 warp tiles, as
/// the exact-f32 matmul's), 8 x 8 on 128 x 64 and 64 x 128, 4 x 8 on 64 x 64.
pub const fn conv_igemm_async_thread_tile(bm: u32, bn: u32) -> (u32, u32) {
    let per_thread = bm * bn / CONV_IGEMM_ASYNC_THREADS;
    if per_thread >= 128 {
        (8, 16)
    } else if per_thread >= 64 {
        (8, 8)
    } else {
        (4, 8)
    }
}

/// Most products per K partition (`split_k`) the `cp.async` implicit GEMM's tap-table
/// kernels (`_t`) take: one 8-byte table entry per `kk` of the block's partition.
pub const CONV_IGEMM_ASYNC_MAX_K: u32 = 8192;

/// Bytes of the `_t` kernels' im2col table for a partition of `split_k` products: per
/// `kk` (rounded up to whole K tiles) `[x offset of (channel, tap), f1 * d1 | f2 * d2 << 16]`.
pub const fn conv_igemm_async_table_bytes(split_k: u32) -> u32 {
    split_k.div_ceil(crate::FMA_BK) * crate::FMA_BK * 8
}

/// Dynamic shared memory of the `cp.async` implicit GEMM's `bm x bn` tile with a table of
/// `table_bytes` ([`conv_igemm_async_table_bytes`], or 0 for the pointwise `_p` kernels):
/// [`crate::FMA_STAGES`] `[k][mn]` stages of both operands (rows padded by 4 floats),
/// then the table, or the staged `bm x (bn + 4)` result where that is larger (the
/// epilogue reuses the stages and the table).
pub const fn conv_igemm_async_shared_bytes(bm: u32, bn: u32, table_bytes: u32) -> u32 {
    let stages = crate::FMA_STAGES * crate::FMA_BK * (bm + 4 + bn + 4) * 4 + table_bytes;
    let result = bm * (bn + 4) * 4;
    if stages > result {
        stages
    } else {
        result
    }
}

/// Shared bytes of the implicit-GEMM tap tables: per tap `[x offset, f0 * d0, f1 * d1,
/// f2 * d2]` (16 bytes) and the filter offset (4 bytes).
pub const fn conv_igemm_table_bytes(taps: u32) -> u32 {
    taps * 20
}

/// Parameters of the depthwise kernels (groups == c, one input channel per group: output
/// channel `k` reads input channel `k / k_per_group`).
///
/// * `conv_fwd_depthwise_rows_<dtype>`: one thread per [`DW_COLS`] consecutive outputs
///   along the innermost spatial dim of one `(n, k, o0, o1)` row; `items` over `[n, k, o0,
///   o1, column groups]`, column groups fastest. Any layout.
/// * `conv_fwd_depthwise_vec_<dtype>`: channels-last, one thread per 16-byte vector of
///   channels (`16 / size` of them) of [`DW_PIXELS`] consecutive outputs along the
///   innermost spatial dim; `items` over `[n, channel vectors, o0, o1, pixel groups]`,
///   channel vectors fastest.
/// * `conv_fwd_depthwise_strip3s<1|2>_<f16|bf16>`: as `vec` for packed 3x3 filters
///   (depth 1) at stride 1 or 2 along the innermost dim, dilation 1 there, one thread per
///   channel vector of [`DW_STRIP`] consecutive outputs (`items` over `[n, channel
///   vectors, o0, o1, strips]`), the filter and each input column's vector held in
///   registers; [`DW_STRIP_THREADS`] per block.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvDepthwiseParams {
    pub geo: ConvGeometry,
    pub ops: EpilogueOps,
    pub items: PoolItems,
}

/// Parameters of `conv_fwd_depthwise_tile3_<f16|bf16>`: channels-last, a packed 3x3
/// filter (depth 1) at stride 1 and dilation 1 along both inner spatial dims. Block `b`
/// (a 1-D grid of `planes * channel_tiles * row_tiles * col_tiles` blocks, column tiles
/// fastest, then row tiles, channel tiles and planes `n * p0`) computes `tile_h` output
/// rows by `tile_w` output columns of `channel_vectors` 16-byte channel vectors: it walks
/// down the `tile_h + 2` input rows its outputs read, staging each (`tile_w + 2` columns
/// of the block's channel vectors, zero outside x) in a ring of [`DW_TILE_SLOTS`]
/// shared-memory rows by `cp.async`, [`DW_TILE_AHEAD`] rows ahead. Thread `t` owns
/// channel vector `t % channel_vectors` of column `t / channel_vectors`: per input row it
/// reads its 3 input vectors from shared memory and adds them into the three output rows
/// they reach (rows `r`, `r - 1`, `r - 2` at filter rows 0, 1, 2), storing the row that
/// completes. The block has at least `channel_vectors * tile_w` threads, and at least
/// half the `channel_vectors * (tile_w + 2)` staged chunks of a row
/// ([`dw_tile_threads`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvDepthwiseTileParams {
    pub geo: ConvGeometry,
    pub ops: EpilogueOps,
    /// 16-byte channel vectors per block (divides the channel vectors of `k`).
    pub channel_vectors: u32,
    /// Output columns per block.
    pub tile_w: u32,
    /// Output rows per block.
    pub tile_h: u32,
    /// `ceil(output[2] / tile_w)`.
    pub col_tiles: u32,
    /// `ceil(output[1] / tile_h)`.
    pub row_tiles: u32,
    /// `k / (channel_vectors * 16 / size)`.
    pub channel_tiles: u32,
}

/// Shared-memory rows in the `tile3` depthwise kernel's ring (at least
/// [`DW_TILE_AHEAD`] + 2: a row is overwritten only after every thread has used it).
pub const DW_TILE_SLOTS: u32 = 8;
/// Input rows the `tile3` depthwise kernel stages ahead of the row it computes.
pub const DW_TILE_AHEAD: u32 = 6;

/// Threads per block of the `tile3` depthwise kernel for `channel_vectors` by `tile_w`
/// outputs: one per output vector of a row, in whole warps.
pub const fn dw_tile_threads(channel_vectors: u32, tile_w: u32) -> u32 {
    (channel_vectors * tile_w).div_ceil(32) * 32
}

/// Dynamic shared bytes of the `tile3` depthwise kernel: the ring of staged rows.
pub const fn dw_tile_shared_bytes(channel_vectors: u32, tile_w: u32) -> u32 {
    DW_TILE_SLOTS * (tile_w + 2) * channel_vectors * 16
}

/// Consecutive output columns one `rows` depthwise thread computes.
pub const DW_COLS: u32 = 4;
/// Consecutive output pixels one `vec` depthwise thread computes.
pub const DW_PIXELS: u32 = 2;
/// Consecutive output pixels one `strip` depthwise thread computes (7 divides every
/// MobileNet width: 112, 56, 28, 14, 7).
pub const DW_STRIP: u32 = 7;
/// Threads per block of the `rows` and `vec` depthwise kernels.
pub const DW_THREADS: u32 = 256;
/// Threads per block of the `strip` depthwise kernels (their 230-255 registers fit one
/// 256-thread block per SM; two 128-thread blocks ran 1-2% faster, about the noise).
pub const DW_STRIP_THREADS: u32 = 128;

/// Parameters of `conv_fwd_pad_channels_b<16|32>_u<8|16>`, which stage a convolution
/// operand with few channels per group into the workspace with those channels padded to a
/// whole copy unit (the implicit GEMM's packed kernels then copy it in `UNIT`-byte units),
/// optionally folding strided spatial dims into the channels (space to depth).
///
/// The source is `[outer, groups * channels, i0, i1, i2]` with strides `src` and spatial
/// extents `src_extent` (x: `outer` the images; the filter: `outer` the output channels,
/// one group, the taps). The destination is dense rows, one per `outer`, of `row_chunks`
/// 16-byte chunks: row element `kk = position * block + group * c_pad + ch` (`position`
/// flat over the destination's `[p0, p1, p2]`, `block = groups * c_pad`) holds, for `ch <
/// depth` with `ch = ((f0 * fold[1] + f1) * fold[2] + f2) * channels + c`, the source
/// element `(outer, group * channels + c, i)` at `i[j] = fold[j] * p[j] + f[j] -
/// offset[j]` (read at `src_extent[j] - 1 - i[j]` where `reverse`), zero where that lies
/// outside the source, for `ch >= depth` (the padded channels) and past the last
/// position (the row's tail). Item `i` (one thread each) writes chunk `i % row_chunks` of
/// row `i / row_chunks`, a unit (`UNIT / size` elements, a divisor of `c_pad`) at a time.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ConvPadChannelsParams {
    /// Source strides over `[outer, channel, i0, i1, i2]` (elements).
    pub src: [u32; 5],
    /// Source spatial extents.
    pub src_extent: [u32; 3],
    /// Phases of each spatial dim folded into the channels (1: none).
    pub fold: [u32; 3],
    /// Subtracted from each source coordinate (x: the padding folded into the staging).
    pub offset: [u32; 3],
    /// 1: read each spatial dim reversed (a filter staged for convolution mode).
    pub reverse: u32,
    /// The source's channels per group.
    pub channels: u32,
    /// Channels per group after folding: `channels * fold[0] * fold[1] * fold[2]`.
    pub depth: u32,
    /// Destination positions per row: `p0 * p1 * p2`.
    pub positions: u32,
    /// Chunks per destination row.
    pub row_chunks: FastDivisor,
    /// Padded channels per group (at least `depth`).
    pub c_pad: FastDivisor,
    /// Elements per position: `groups * c_pad`.
    pub block: FastDivisor,
    /// The destination's extents `p1` and `p2`.
    pub p1: FastDivisor,
    pub p2: FastDivisor,
    /// `channels`, `fold[1]` and `fold[2]`, to split `ch`.
    pub channels_div: FastDivisor,
    pub fold1: FastDivisor,
    pub fold2: FastDivisor,
    /// Chunks in all (`rows * row_chunks`, below 2^32).
    pub items: u32,
}

/// Threads per block of `conv_fwd_pad_channels_*`.
pub const CONV_PAD_CHANNELS_THREADS: u32 = 256;
