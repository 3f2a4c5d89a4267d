//! [`ConvFwdAlgo::ImplicitGemmTensorOp`](super::ConvFwdAlgo::ImplicitGemmTensorOp): the
//! convolution as a GEMM per group, `y[pixel, k] = sum_(tap, c) x[pixel @ tap, c] *
//! w[k, tap, c]`, on the tiled-MMA core with im2col tiles gathered from x by `cp.async`
//! (`kernels/src/convolution/implicit_gemm.rs`): `conv_fwd_igemm_tc_<tile>_<dt>`
//! (`mma.sync`), or on Hopper `wgmma_conv_fwd_igemm_128x<BN>_<dt>` for K >= 256.
//!
//! In the `cp.async` kernels a 16-byte chunk of a tile is a run of consecutive channels of
//! one input pixel (or of one filter tap), so they need x and the filter
//! channel-contiguous (NHWC-like x, KRSC filter) with the group's channel count a whole
//! number of chunks and every other stride 16-byte aligned. Where a problem is not
//! ([`copy_declines`]: NCHW x, an RGB first layer, odd channel counts), the gather kernels
//! `conv_fwd_igemm_tc_gather_<tile>_<dt>` run it instead: K flattened over (tap, channel)
//! without padding per tap, elements loaded one by one (any layout, any channel count).
//! y and z take any layout. Groups run as the grid's second dimension (each group is its
//! own GEMM over its channels).

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::{Gpu, LaunchConfig};
use crate::ops::matmul::MathType;
use oxidnn_params::{
    conv_wgmma_shared_bytes, mma_shared_bytes, mma_threads, ConvGemmParams, FastDivisor,
    PixelIndex, MMA_BK_BYTES, WGMMA_THREADS,
};

/// One block tile of the implicit GEMM: `bm` pixels by `bn` output channels, on `wgmma`
/// (sm_90a) or `mma.sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    bm: u32,
    bn: u32,
    wgmma: bool,
    /// The element-gathering loaders over the flattened K (`conv_fwd_igemm_tc_gather_*`).
    gather: bool,
}

/// The tiles in order of preference (largest first, Hopper's first); a dtype has the
/// ones whose kernels exist. The gather tiles run what the `cp.async` ones cannot.
const TILES: [Tile; 10] = [
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
            gather: false,
        }
    }

    const fn gather(bm: u32, bn: u32) -> Self {
        Self {
            bm,
            bn,
            wgmma: false,
            gather: true,
        }
    }

    fn kernel(&self, dtype: DataType) -> Option<&'static str> {
        let name = if self.wgmma {
            format!(
                "wgmma_conv_fwd_igemm_{}x{}_{}",
                self.bm,
                self.bn,
                operand_name(dtype)
            )
        } else {
            format!(
                "conv_fwd_igemm_tc_{}{}x{}_{}",
                if self.gather { "gather_" } else { "" },
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
        if self.wgmma {
            WGMMA_THREADS
        } else {
            mma_threads(self.bm, self.bn)
        }
    }

    fn shared_bytes(&self) -> u32 {
        if self.wgmma {
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
fn bk(dtype: DataType) -> u32 {
    MMA_BK_BYTES / dtype.size_bytes() as u32
}

/// `(output pixels, GEMM K tiles)` of the `cp.async` kernels (K padded to whole tiles
/// per tap) or the gather kernels (`gather`: K flattened, `taps * c_per_group`).
fn gemm_extents(p: &Problem, gather: bool) -> (u64, u64) {
    let g = &p.geo;
    let m = g.n as u64 * g.output.iter().map(|&o| o as u64).product::<u64>();
    let taps = g.filter.iter().map(|&f| f as u64).product::<u64>();
    let bk = bk(p.dtype) as u64;
    if gather {
        (m, (taps * g.c_per_group as u64).div_ceil(bk))
    } else {
        (m, taps * (g.c_per_group as u64).div_ceil(bk))
    }
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
    let gather = copy_declines(p).is_some();
    let (m, k_tiles) = gemm_extents(p, gather);
    if k_tiles * bk(p.dtype) as u64 > u32::MAX as u64 || m > i32::MAX as u64 {
        return Some("the GEMM's K or M exceeds 32 bits".to_string());
    }
    None
}

/// Why the `cp.async` kernels cannot copy the problem's operands in 16-byte chunks (the
/// gather kernels then run it), or `None` if they can.
/// Whether this problem runs on the element-gathering kernels (the `cp.async` ones
/// decline its layout), which are several times slower per flop.
pub(super) fn gathers(p: &Problem) -> bool {
    copy_declines(p).is_some()
}

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

/// The tile for this problem on `gpu`.
///
/// On sm_90a with K >= 256, the `wgmma` tile with the least work on the busiest SM:
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
/// Problems the `cp.async` kernels cannot copy ([`copy_declines`]) choose among the
/// gather tiles alone, the same way.
///
/// `OXIDNN_CONV_IGEMM_TILE=BMxBN` (`BMxBNw` for `wgmma`) forces a tile, for tuning and
/// tests; naming one without a kernel for the problem is an error.
fn choose(p: &Problem, gpu: &Gpu) -> Result<(Tile, &'static str)> {
    let g = &p.geo;
    let gather = copy_declines(p).is_some();
    let (m, k_tiles) = gemm_extents(p, gather);
    let k = k_tiles * bk(p.dtype) as u64;
    let sms = gpu.sm_count as u64;
    let available: Vec<(Tile, &'static str)> = TILES
        .into_iter()
        .filter(|t| t.gather == gather)
        .filter(|t| !t.wgmma || gpu.is_sm90a())
        .filter_map(|t| t.kernel(p.dtype).map(|name| (t, name)))
        .collect();
    if let Ok(forced) = std::env::var("OXIDNN_CONV_IGEMM_TILE") {
        return available
            .iter()
            .find(|(t, _)| {
                forced == format!("{}x{}{}", t.bm, t.bn, if t.wgmma { "w" } else { "" })
            })
            .copied()
            .ok_or_else(|| {
                Error::unsupported(format!(
                    "OXIDNN_CONV_IGEMM_TILE={forced} names no implicit-GEMM tile for this problem (BMxBN, `w` for wgmma)"
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
        .filter(|t| t.wgmma && k >= 256)
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
    let p = call.p;
    let g = &p.geo;
    let (tile, kernel) = choose(p, call.gpu)?;
    let (m, k_tiles) = gemm_extents(p, tile.gather);
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
        c_tiles: FastDivisor::new(g.c_per_group.div_ceil(bk(p.dtype))),
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
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry's dims and strides describe; every span is below 2^31 elements (checked by
    // the algorithm), so the kernel's 32-bit offsets do not wrap for any element inside;
    // for the `cp.async` kernels, `copy_declines` checked that x and the filter are
    // channel-contiguous with 16-byte aligned other strides and whole chunks of channels
    // per group (device allocations are 256-byte aligned), so every 16-byte copy the
    // loaders issue for an element inside lies in its buffer, and copies outside are
    // zero-fills that read nothing; the gather kernels load single elements, only those
    // inside the input, the filter and the flattened K (`channels` is c_per_group, the
    // K tiles cover taps * c_per_group, the rest zeros); bias and z
    // are read only when the epilogue has them, which is exactly when they were given.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}
