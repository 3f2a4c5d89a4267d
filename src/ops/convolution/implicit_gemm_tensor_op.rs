//! [`ConvFwdAlgo::ImplicitGemmTensorOp`](super::ConvFwdAlgo::ImplicitGemmTensorOp): the
//! convolution as a GEMM per group, `y[pixel, k] = sum_(tap, c) x[pixel @ tap, c] *
//! w[k, tap, c]`, on the tiled-MMA core with im2col tiles gathered from x by `cp.async`
//! (`kernels/src/convolution/implicit_gemm.rs`): `conv_fwd_igemm_tc_<tile>_<dt>`
//! (`mma.sync`), or on Hopper `wgmma_conv_fwd_igemm_128x<BN>_<dt>` for K >= 256.
//!
//! In the `cp.async` kernels a 16-byte chunk of a tile is a run of consecutive channels of
//! one input pixel (or of one filter tap), so they need x and the filter
//! channel-contiguous (NHWC-like x, KRSC filter) with the group's channel count a whole
//! number of chunks and every other stride 16-byte aligned.
//!
//! Problems whose channels per group are not whole 16-byte chunks (an RGB first layer,
//! odd channel counts; any layout) are staged: x and the filter are copied into the
//! workspace with their channels padded to a copy unit ([`channel_padding`]), and the
//! packed kernels `conv_fwd_igemm_tc_packed<UNIT>_<tile>_<dt>` /
//! `wgmma_conv_fwd_igemm_packed<UNIT>_128x<BN>_<dt>` run the padded problem: `cp.async`
//! copies of whole units, K flattened over (tap, unit) so that one K tile holds several
//! taps.
//!
//! Where whole chunks of channels lie elsewhere than the copies need ([`copy_declines`]:
//! NCHW x, KCRS filters, misaligned strides), the gather kernels
//! `conv_fwd_igemm_tc_gather_<tile>_<dt>` run the problem instead: K flattened over (tap,
//! channel) without padding per tap, elements loaded one by one (any layout, any channel
//! count; also problems whose padded copies would exceed 2^31 elements).
//! y and z take any layout. Groups run as the grid's second dimension (each group is its
//! own GEMM over its channels).
//!
//! On sm_90a, 2-D problems whose x and filter TMA can describe run first on
//! `wgmma_conv_fwd_tma_128x<BN>_<dt>` (`kernels/src/convolution/implicit_gemm_tma.rs`):
//! matmul's warp-specialised TMA core, A copied in TMA's im2col mode (the tensor map
//! walks the output pixels' windows, padding and strides included), B in tiled mode
//! ([`tma_declines`] says what they need).

use super::channel_padding;
use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::{Gpu, LaunchConfig};
use crate::ops::matmul::MathType;
use crate::tma::{byte_stride, im2col, tiled, Im2colBox};
use oxidnn_params::{
    conv_tma_blocks_per_sm, conv_wgmma_shared_bytes, mma_shared_bytes, mma_threads,
    tma_shared_bytes, tma_threads, ConvGemmParams, FastDivisor, PixelIndex, TmaOperands,
    MMA_BK_BYTES, TMA_BOX, WGMMA_BM, WGMMA_THREADS,
};

/// How a kernel's loaders fill the operand tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loader {
    /// 16-byte `cp.async` chunks of x and the filter where they lie, K padded to whole
    /// tiles per tap (`conv_fwd_igemm_tc_*`).
    Copy,
    /// Element gathers over K flattened by (tap, channel) (`conv_fwd_igemm_tc_gather_*`).
    Gather,
    /// `unit`-byte `cp.async` copies over K flattened by (tap, unit), from the padded
    /// copies of x and the filter ([`channel_padding`]; `conv_fwd_igemm_tc_packed<unit>_*`).
    Packed { unit: u32 },
}

/// One block tile of the implicit GEMM: `bm` pixels by `bn` output channels, on `wgmma`
/// (sm_90a) or `mma.sync`, with its loaders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    bm: u32,
    bn: u32,
    wgmma: bool,
    /// The warp-specialised `wgmma` tile whose operands TMA copies
    /// (`wgmma_conv_fwd_tma_*`; [`Loader::Copy`] problems that [`tma_declines`] accepts).
    tma: bool,
    loader: Loader,
}

/// The tiles in order of preference (largest first, Hopper's first, TMA's before
/// `cp.async`'s); a dtype has the ones whose kernels exist. The gather tiles run what the
/// `cp.async` ones cannot; the packed ones the channel-padded problems.
const TILES: [Tile; 23] = [
    Tile::tma(256),
    Tile::tma(128),
    Tile::tma(64),
    Tile::new(128, 256, true),
    Tile::new(128, 128, true),
    Tile::new(128, 64, true),
    Tile::new(128, 256, false),
    Tile::new(128, 128, false),
    Tile::new(128, 64, false),
    Tile::new(64, 64, false),
    Tile::gather(128, 128),
    Tile::gather(128, 64),
    Tile::gather(64, 64),
    Tile::packed(128, 128, true, 16),
    Tile::packed(128, 64, true, 16),
    Tile::packed(128, 128, false, 16),
    Tile::packed(128, 64, false, 16),
    Tile::packed(64, 64, false, 16),
    Tile::packed(128, 128, true, 8),
    Tile::packed(128, 64, true, 8),
    Tile::packed(128, 128, false, 8),
    Tile::packed(128, 64, false, 8),
    Tile::packed(64, 64, false, 8),
];

/// The kernels' name for the operand type: the storage type, or `tf32` for f32 data.
fn operand_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "tf32",
        dt => dt.name(),
    }
}

impl Tile {
    const fn new(bm: u32, bn: u32, wgmma: bool) -> Self {
        Self {
            bm,
            bn,
            wgmma,
            tma: false,
            loader: Loader::Copy,
        }
    }

    const fn tma(bn: u32) -> Self {
        Self {
            bm: WGMMA_BM,
            bn,
            wgmma: true,
            tma: true,
            loader: Loader::Copy,
        }
    }

    const fn gather(bm: u32, bn: u32) -> Self {
        Self {
            bm,
            bn,
            wgmma: false,
            tma: false,
            loader: Loader::Gather,
        }
    }

    const fn packed(bm: u32, bn: u32, wgmma: bool, unit: u32) -> Self {
        Self {
            bm,
            bn,
            wgmma,
            tma: false,
            loader: Loader::Packed { unit },
        }
    }

    /// The tile's name for `OXIDNN_CONV_IGEMM_TILE`: `BMxBN`, then `w` for the `cp.async`
    /// `wgmma` tiles or `t` for the TMA ones.
    fn label(&self) -> String {
        let kind = match (self.wgmma, self.tma) {
            (_, true) => "t",
            (true, false) => "w",
            _ => "",
        };
        format!("{}x{}{kind}", self.bm, self.bn)
    }

    fn kernel(&self, dtype: DataType) -> Option<&'static str> {
        let loader = match self.loader {
            Loader::Copy => String::new(),
            Loader::Gather => "gather".to_string(),
            Loader::Packed { unit } => format!("packed{unit}"),
        };
        let name = if self.tma {
            format!(
                "wgmma_conv_fwd_tma_{}x{}_{}",
                self.bm,
                self.bn,
                operand_name(dtype)
            )
        } else if self.wgmma {
            format!(
                "wgmma_conv_fwd_igemm{}{loader}_{}x{}_{}",
                if loader.is_empty() { "" } else { "_" },
                self.bm,
                self.bn,
                operand_name(dtype)
            )
        } else {
            format!(
                "conv_fwd_igemm_tc_{loader}{}{}x{}_{}",
                if loader.is_empty() { "" } else { "_" },
                self.bm,
                self.bn,
                operand_name(dtype)
            )
        };
        kernels::lookup(&name)
    }

    /// Relative time of one block of a `wgmma` tile in a full wave, measured on H100
    /// (ResNet-50's 14x14 x 256 3x3 layer at N = 256: 128x256 0.116 ms on 392 blocks,
    /// 128x128 0.150 on 784, 128x64 0.174 on 1568), scaled to 256 for 128x256.
    fn wgmma_cost(&self) -> u64 {
        match self.bn {
            256 => 256,
            128 => 165,
            _ => 96,
        }
    }

    fn threads(&self) -> u32 {
        if self.tma {
            tma_threads(conv_tma_blocks_per_sm(self.bn))
        } else if self.wgmma {
            WGMMA_THREADS
        } else {
            mma_threads(self.bm, self.bn)
        }
    }

    fn shared_bytes(&self) -> u32 {
        if self.tma {
            tma_shared_bytes(self.bn, conv_tma_blocks_per_sm(self.bn))
        } else if self.wgmma {
            conv_wgmma_shared_bytes(self.bn)
        } else {
            mma_shared_bytes(self.bm, self.bn)
        }
    }
}

/// Elements per 16-byte chunk.
fn per_chunk(dtype: DataType) -> u32 {
    16 / dtype.size_bytes() as u32
}

/// Channels per K tile (one 128-byte row of a stage).
pub(super) fn bk(dtype: DataType) -> u32 {
    MMA_BK_BYTES / dtype.size_bytes() as u32
}

/// `(output pixels, GEMM K tiles)` of the `cp.async` kernels (K padded to whole tiles
/// per tap) or the gather and packed kernels (K flattened, `taps * c_per_group`; for the
/// packed ones `p` is the padded problem).
fn gemm_extents(p: &Problem, loader: Loader) -> (u64, u64) {
    let g = &p.geo;
    let m = g.n as u64 * g.output.iter().map(|&o| o as u64).product::<u64>();
    let taps = g.filter.iter().map(|&f| f as u64).product::<u64>();
    let bk = bk(p.dtype) as u64;
    match loader {
        Loader::Copy => (m, taps * (g.c_per_group as u64).div_ceil(bk)),
        Loader::Gather | Loader::Packed { .. } => (m, (taps * g.c_per_group as u64).div_ceil(bk)),
    }
}

/// The loaders this problem runs on: packed where its channels are padded
/// ([`channel_padding::plan`]), else copied where [`copy_declines`] lets them, else
/// gathered.
fn loader(p: &Problem) -> Loader {
    match channel_padding::plan(p) {
        Some(pad) => Loader::Packed { unit: pad.unit },
        None if copy_declines(p).is_some() => Loader::Gather,
        None => Loader::Copy,
    }
}

/// Workspace bytes: the padded copies of x and the filter where the problem is padded.
pub(super) fn workspace_bytes(p: &Problem) -> usize {
    if declines(p).is_some() {
        return 0;
    }
    channel_padding::workspace_bytes(p)
}

/// Why this algorithm cannot run the problem, or `None` if it can (the gather kernels
/// take whatever [`copy_declines`] turns away).
pub(super) fn declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    let math_ok = match p.math {
        MathType::TensorOp => matches!(p.dtype, DataType::F16 | DataType::BF16),
        MathType::Tf32 => p.dtype == DataType::F32,
        MathType::Fma => false,
    };
    if !math_ok {
        return Some(format!(
            "it runs on tensor cores: TensorOp math on f16/bf16 or Tf32 math on f32, not {:?} on {}",
            p.math, p.dtype
        ));
    }
    if g.groups > 65535 {
        return Some(format!("{} groups exceed the grid's 65535", g.groups));
    }
    let (m, k_tiles) = match channel_padding::plan(p) {
        Some(pad) => gemm_extents(
            &channel_padding::padded(p, &pad),
            Loader::Packed { unit: pad.unit },
        ),
        None => gemm_extents(p, loader(p)),
    };
    if k_tiles * bk(p.dtype) as u64 > u32::MAX as u64 || m > i32::MAX as u64 {
        return Some("the GEMM's K or M exceeds 32 bits".to_string());
    }
    None
}

/// Whether this problem runs on the element-gathering kernels (the `cp.async` ones
/// decline its layout), which are several times slower per flop.
pub(super) fn gathers(p: &Problem) -> bool {
    loader(p) == Loader::Gather
}

/// Why the `cp.async` kernels cannot copy the problem's operands in 16-byte chunks (the
/// gather kernels then run it, or the packed ones its padded copy), or `None` if they can.
fn copy_declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    let per = per_chunk(p.dtype);
    if g.x[1] != 1 && g.c > 1 {
        return Some(format!(
            "x's channels are not contiguous (channel stride {}): it copies runs of channels (NHWC-like layouts)",
            g.x[1]
        ));
    }
    if g.w[1] != 1 && g.c_per_group > 1 {
        return Some("the filter's channels are not contiguous: it takes KRSC filters".to_string());
    }
    if !g.c_per_group.is_multiple_of(per) {
        return Some(format!(
            "{} channels per group are not a multiple of {per} (one 16-byte copy of {})",
            g.c_per_group, p.dtype
        ));
    }
    // Strides of dims of extent 1 are never multiplied by a nonzero coordinate.
    let x_extents = [g.n, g.c, g.input[0], g.input[1], g.input[2]];
    let w_extents = [g.k, g.c_per_group, g.filter[0], g.filter[1], g.filter[2]];
    let misaligned = |strides: &[u32; 5], extents: &[u32; 5]| {
        (0..5).any(|d| d != 1 && extents[d] > 1 && !strides[d].is_multiple_of(per))
    };
    if misaligned(&g.x, &x_extents) {
        return Some(format!(
            "x's pixel strides {:?} are not multiples of {per} elements (16 bytes)",
            g.x
        ));
    }
    if misaligned(&g.w, &w_extents) {
        return Some(format!(
            "the filter's strides {:?} are not multiples of {per} elements (16 bytes)",
            g.w
        ));
    }
    None
}

/// The largest magnitude of an im2col pixel-box corner of a 4-D tensor map (8 signed
/// bits), and of a copy's offsets (8 unsigned bits).
const IM2COL_CORNER: i64 = 128;
const IM2COL_OFFSET: u64 = 256;
/// The largest traversal stride of a tensor map.
const TMA_MAX_STRIDE: u32 = 8;

/// The pixel box (per spatial dim `[w, h]`) of x's im2col map: from `-pad`, as many
/// positions at the convolution's stride as the output has, so that the map walks the
/// output pixels' window origins in GEMM row order (each copy's offsets then shift the
/// box to its filter tap).
fn im2col_box(p: &Problem) -> Im2colBox {
    let g = &p.geo;
    let corner = |j: usize| {
        let upper =
            (g.output[j] as i64 - 1) * g.stride[j] as i64 + 1 - g.input[j] as i64 - g.pad[j] as i64;
        (-(g.pad[j] as i64), upper)
    };
    let (w, h) = (corner(2), corner(1));
    Im2colBox {
        lower: [w.0 as i32, h.0 as i32],
        upper: [w.1 as i32, h.1 as i32],
        strides: [g.stride[2], g.stride[1]],
        channels: TMA_BOX,
        pixels: WGMMA_BM,
    }
}

/// Why the TMA tiles (`wgmma_conv_fwd_tma_*`) cannot run the problem, or `None` if they
/// can: 2-D, f16/bf16 on tensor cores, x and the filter channel-contiguous with 16-byte
/// aligned other strides (TMA's rule), channels per group a whole number of 64-channel
/// copies when there are several groups (a copy must not reach into the next group's
/// channels), and a window a 4-D im2col map can describe (pixel-box corners within 8
/// signed bits, tap reach within 8 bits, strides at most 8).
fn tma_declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if p.math != MathType::TensorOp || !matches!(p.dtype, DataType::F16 | DataType::BF16) {
        return Some("TMA tiles take f16/bf16 with TensorOp math".to_string());
    }
    if g.input[0] != 1 || g.filter[0] != 1 {
        return Some("TMA tiles take 2-D convolutions".to_string());
    }
    if let Some(why) = copy_declines(p) {
        return Some(why);
    }
    if g.groups > 1 && !g.c_per_group.is_multiple_of(TMA_BOX) {
        return Some(format!(
            "{} channels per group are not a multiple of {TMA_BOX} with {} groups",
            g.c_per_group, g.groups
        ));
    }
    if (1..3).any(|j| g.stride[j] > TMA_MAX_STRIDE) {
        return Some(format!(
            "strides {:?} exceed TMA's {TMA_MAX_STRIDE}",
            g.stride
        ));
    }
    if (1..3).any(|j| (g.filter[j] as u64 - 1) * g.dilation[j] as u64 >= IM2COL_OFFSET) {
        return Some(format!(
            "the dilated filter reaches {IM2COL_OFFSET} pixels or more, past an im2col offset"
        ));
    }
    let walk = im2col_box(p);
    let corners = walk.lower.iter().chain(&walk.upper);
    if corners
        .clone()
        .any(|&c| !(-IM2COL_CORNER..IM2COL_CORNER).contains(&(c as i64)))
    {
        return Some(format!(
            "the im2col pixel box {:?}..{:?} (padding and output extents) exceeds the 8-bit corners",
            walk.lower, walk.upper
        ));
    }
    None
}

/// The tensor maps of a TMA tile: x in im2col mode ([`im2col_box`]), the filter tiled as
/// `[C, S, R, K]` in boxes of 64 channels by 64 output channels.
fn tma_maps(call: &Call) -> Result<TmaOperands> {
    let p = call.p;
    let g = &p.geo;
    let bytes = p.dtype.size_bytes() as u64;
    let x_dims = [g.c, g.input[2], g.input[1], g.n].map(u64::from);
    let xw = byte_stride(g.x[4] as u64, bytes, x_dims[0] * bytes);
    let xh = byte_stride(g.x[3] as u64, bytes, x_dims[1] * xw);
    let xn = byte_stride(g.x[0] as u64, bytes, x_dims[2] * xh);
    let a = im2col(p.dtype, call.ptrs.x, x_dims, [xw, xh, xn], &im2col_box(p))?;
    let w_dims = [g.c_per_group, g.filter[2], g.filter[1], g.k].map(u64::from);
    let ws = byte_stride(g.w[4] as u64, bytes, w_dims[0] * bytes);
    let wr = byte_stride(g.w[3] as u64, bytes, w_dims[1] * ws);
    let wk = byte_stride(g.w[0] as u64, bytes, w_dims[2] * wr);
    let b = tiled(
        p.dtype,
        call.ptrs.w,
        w_dims,
        &[ws, wr, wk],
        [TMA_BOX, 1, 1, TMA_BOX],
    )?;
    Ok(TmaOperands { a, b })
}

/// The tile for this problem on `gpu`.
///
/// On sm_90a with K >= 256, the `wgmma` tile with the least work on the busiest SM, among
/// the TMA tiles where [`tma_declines`] accepts the problem, else the `cp.async` ones:
/// `ceil(blocks / SMs)` blocks there, each costing its [`Tile::wgmma_cost`] (columns past
/// the group's channels included). That weighs the larger tiles' efficiency against the
/// SMs they leave idle: on ResNet-50's 3x3 layers at N = 32 (H100) it picks 128x64 for
/// 7x7 x 512 (221 TFLOPS vs 173 for 128x128) and 28x28 x 128, 128x128 for 14x14 x 256
/// (268 vs 225 for 128x64), and at N = 256 the largest tile that fits the channels.
///
/// Otherwise, as matmul's heuristic, among the `mma.sync` tiles whose columns are not
/// mostly past the group's channels: the largest whose blocks keep 3/4 of the SMs busy (8
/// blocks per SM when K < 256, where the epilogue dominates), else the smallest.
///
/// Problems on the gather or packed kernels choose among those tiles alone, the same way.
///
/// `OXIDNN_CONV_IGEMM_TILE=BMxBN` (`BMxBNw` for `wgmma`, `BMxBNt` for TMA) forces a
/// tile, for tuning and tests; naming one without a kernel for the problem is an error.
fn choose(p: &Problem, gpu: &Gpu, loader: Loader) -> Result<(Tile, &'static str)> {
    let g = &p.geo;
    let (m, k_tiles) = gemm_extents(p, loader);
    let k = k_tiles * bk(p.dtype) as u64;
    let sms = gpu.sm_count as u64;
    let tma_accepts = gpu.is_sm90a() && tma_declines(p).is_none();
    let available: Vec<(Tile, &'static str)> = TILES
        .into_iter()
        .filter(|t| t.loader == loader)
        .filter(|t| !t.wgmma || gpu.is_sm90a())
        .filter(|t| !t.tma || tma_accepts)
        .filter_map(|t| t.kernel(p.dtype).map(|name| (t, name)))
        .collect();
    // The `wgmma` tiles of one kind compete: the TMA ones where any runs the problem.
    let tma = available.iter().any(|(t, _)| t.tma);
    if let Ok(forced) = std::env::var("OXIDNN_CONV_IGEMM_TILE") {
        return available
            .iter()
            .find(|(t, _)| forced == t.label())
            .copied()
            .ok_or_else(|| {
                Error::unsupported(format!(
                    "OXIDNN_CONV_IGEMM_TILE={forced} names no implicit-GEMM tile for this problem (BMxBN, `w` for wgmma, `t` for TMA)"
                ))
            });
    }
    let blocks =
        |t: &Tile| m.div_ceil(t.bm as u64) * g.k_per_group.div_ceil(t.bn) as u64 * g.groups as u64;
    let fits = |t: &Tile| t.bn / 2 < g.k_per_group || t.bn == 64;
    let wanted = if k < 256 {
        8 * sms
    } else {
        (3 * sms).div_ceil(4)
    };
    let wgmma = available
        .iter()
        .map(|&(t, _)| t)
        .filter(|t| t.wgmma && t.tma == tma && k >= 256)
        .min_by_key(|t| blocks(t).div_ceil(sms) * t.wgmma_cost());
    let mma: Vec<Tile> = available
        .iter()
        .map(|&(t, _)| t)
        .filter(|t| !t.wgmma && fits(t))
        .collect();
    let tile = wgmma
        .or(mma.iter().find(|t| blocks(t) >= wanted).copied())
        .or(mma.last().copied());
    tile.and_then(|t| available.iter().find(|(a, _)| *a == t).copied())
        .ok_or_else(|| {
            Error::unsupported(format!(
                "no implicit-GEMM tensor-core kernel for {}",
                p.dtype
            ))
        })
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    match channel_padding::plan(call.p) {
        Some(pad) => channel_padding::launch(call, y, pad),
        None => launch_with(call, y, loader(call.p)),
    }
}

/// Runs the problem on `loader`'s kernels; for [`Loader::Packed`], `call` is the padded
/// problem with x and the filter at their padded copies ([`channel_padding::launch`]).
pub(super) fn launch_with(call: &Call, y: &mut Buffer, loader: Loader) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let (tile, kernel) = choose(p, call.gpu, loader)?;
    let (m, k_tiles) = gemm_extents(p, loader);
    let tiles_m = m.div_ceil(tile.bm as u64);
    let tiles_n = g.k_per_group.div_ceil(tile.bn) as u64;
    if tiles_m * tiles_n > i32::MAX as u64 {
        return Err(Error::unsupported(format!(
            "{tiles_m} x {tiles_n} output tiles exceed the grid"
        )));
    }
    let params = ConvGemmParams {
        geo: *g,
        ops: call.ops(),
        pixels: PixelIndex::new(g.output),
        c_tiles: FastDivisor::new(match loader {
            // Units per tap (the padded channels are whole units).
            Loader::Packed { unit } => g.c_per_group / (unit / p.dtype.size_bytes() as u32),
            _ => g.c_per_group.div_ceil(bk(p.dtype)),
        }),
        filter_r: FastDivisor::new(g.filter[1]),
        filter_s: FastDivisor::new(g.filter[2]),
        m: m as u32,
        k_tiles: k_tiles as u32,
        tiles_m: tiles_m as u32,
        tiles_n: tiles_n as u32,
        channels: FastDivisor::new(g.c_per_group),
    };
    let cfg = LaunchConfig {
        grid: (tiles_m * tiles_n) as u32,
        grid_y: g.groups,
        block: tile.threads(),
        shared_bytes: tile.shared_bytes(),
    };
    let pointers = call.kernel_pointers(y)?;
    if tile.tma {
        let maps = tma_maps(call)?;
        // SAFETY: the kernel's signature is `(ConvGemmParams, 5 pointers, TmaOperands)`;
        // it reads x and the filter only through the tensor maps, which describe exactly
        // their tensors (dims and byte strides from the checked descriptors, addresses of
        // their buffers), so TMA reads nothing outside them and fills the rest with zeros;
        // y, bias and z as for the other tiles below.
        return unsafe {
            call.gpu
                .launch_with_last(kernel, cfg, &params, &pointers, &maps)
        };
    }
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry's dims and strides describe; every span is below 2^31 elements (checked by
    // the algorithm), so the kernel's 32-bit offsets do not wrap for any element inside;
    // for the `cp.async` kernels, `copy_declines` checked that x and the filter are
    // channel-contiguous with 16-byte aligned other strides and whole chunks of channels
    // per group (device allocations are 256-byte aligned), so every 16-byte copy the
    // loaders issue for an element inside lies in its buffer, and copies outside are
    // zero-fills that read nothing; the gather kernels load single elements, only those
    // inside the input, the filter and the flattened K (`channels` is c_per_group, the
    // K tiles cover taps * c_per_group, the rest zeros); for the packed kernels, x and the
    // filter are the padded copies `channel_padding::launch` staged in the workspace (x
    // dense channels-last with whole units of channels per group, its strides multiples
    // of the unit; the filter dense rows of `w[0]` elements holding every K tile the
    // kernel reads, `k_tiles * BK <= w[0]`), 256-byte aligned, and the units past the last
    // tap are zero-fills that read nothing; bias and z
    // are read only when the epilogue has them, which is exactly when they were given.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::Handle;
    use crate::ops::convolution::{
        convolution_forward_output_dims, ConvEpilogue, ConvMode, ConvolutionDescriptor,
        FilterDescriptor, FilterLayout,
    };
    use crate::TensorDescriptor;

    /// A channels-last f16 problem: x `[n, c, hw..]`, a KRSC filter of `k` x `filter`.
    fn problem(
        (n, c, k, hw): (usize, usize, usize, &[usize]),
        filter: &[usize],
        (pad, stride, groups): (&[usize], &[usize], usize),
    ) -> Problem {
        let s = hw.len();
        let conv = ConvolutionDescriptor::new(
            pad,
            stride,
            &vec![1; s],
            ConvMode::CrossCorrelation,
            MathType::TensorOp,
        )
        .unwrap()
        .with_groups(groups)
        .unwrap();
        let x = TensorDescriptor::spatial(DataType::F16, n, c, hw, crate::Layout::ChannelsLast)
            .unwrap();
        let w = FilterDescriptor::new(DataType::F16, FilterLayout::Krsc, k, c / groups, filter)
            .unwrap();
        let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
        let y = TensorDescriptor::spatial(
            DataType::F16,
            yd[0],
            yd[1],
            &yd[2..],
            crate::Layout::ChannelsLast,
        )
        .unwrap();
        Problem::new(&Handle::cpu(), &x, &w, &conv, &y, &ConvEpilogue::default()).unwrap()
    }

    /// The im2col pixel box runs from `-pad` over exactly the output's extent at the
    /// convolution's stride, `[w, h]` order.
    #[test]
    fn im2col_box_spans_the_output_windows() {
        // 3x3, pad 1, stride 1 on 56x56: [-1, 56 - 1).
        let b = im2col_box(&problem(
            (2, 64, 64, &[56, 56]),
            &[3, 3],
            (&[1, 1], &[1, 1], 1),
        ));
        assert_eq!((b.lower, b.upper, b.strides), ([-1, -1], [-1, -1], [1, 1]));
        // 1x1 at stride 2 on 56x56: 28 positions from 0, (28 - 1) * 2 + 1 - 56 = -1.
        let b = im2col_box(&problem(
            (2, 256, 512, &[56, 56]),
            &[1, 1],
            (&[0, 0], &[2, 2], 1),
        ));
        assert_eq!((b.lower, b.upper, b.strides), ([0, 0], [-1, -1], [2, 2]));
        // Asymmetric: h 9 with 3x5, pad (2, 1), stride (2, 1); w 7.
        let b = im2col_box(&problem(
            (1, 64, 64, &[9, 7]),
            &[3, 5],
            (&[2, 1], &[2, 1], 1),
        ));
        // h: out (9 + 4 - 3) / 2 + 1 = 6, upper (6 - 1) * 2 + 1 - 9 - 2 = 0;
        // w: out 7 + 2 - 5 + 1 = 5, upper 5 - 7 - 1 = -3.
        assert_eq!((b.lower, b.upper, b.strides), ([-1, -2], [-3, 0], [1, 2]));
        assert_eq!((b.channels, b.pixels), (TMA_BOX, WGMMA_BM));
    }

    /// The TMA tiles take 2-D channels-last f16/bf16 problems and say why they take no
    /// others.
    #[test]
    fn tma_tiles_say_why_they_decline() {
        let accepted = problem((2, 64, 64, &[14, 14]), &[3, 3], (&[1, 1], &[1, 1], 1));
        assert_eq!(tma_declines(&accepted), None);
        // Channels not a multiple of 64 are zero-filled past C when there is one group.
        let c24 = problem((2, 24, 64, &[14, 14]), &[3, 3], (&[1, 1], &[1, 1], 1));
        assert_eq!(tma_declines(&c24), None);
        let three_d = problem((1, 64, 64, &[4, 6, 6]), &[3, 3, 3], (&[1; 3], &[1; 3], 1));
        assert!(tma_declines(&three_d).unwrap().contains("2-D"));
        let groups = problem((1, 64, 64, &[6, 6]), &[3, 3], (&[1, 1], &[1, 1], 2));
        assert!(tma_declines(&groups)
            .unwrap()
            .contains("32 channels per group"));
        let grouped_64 = problem((1, 128, 64, &[6, 6]), &[3, 3], (&[1, 1], &[1, 1], 2));
        assert_eq!(tma_declines(&grouped_64), None);
        let stride = problem((1, 64, 64, &[40, 40]), &[3, 3], (&[1, 1], &[9, 9], 1));
        assert!(tma_declines(&stride).unwrap().contains("strides"));
        let pad = problem((1, 64, 64, &[6, 6]), &[3, 3], (&[130, 1], &[1, 1], 1));
        assert!(tma_declines(&pad).unwrap().contains("pixel box"));
        let odd = problem((1, 12, 64, &[6, 6]), &[3, 3], (&[1, 1], &[1, 1], 1));
        assert!(tma_declines(&odd).unwrap().contains("multiple of 8"));
    }
}
