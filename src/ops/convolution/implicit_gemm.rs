//! [`ConvFwdAlgo::ImplicitGemm`](super::ConvFwdAlgo::ImplicitGemm): exact-f32 implicit
//! GEMM on CUDA cores, `conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32`. Per group, the
//! pixels' im2col rows (gathered from x in place through per-tap offset tables the blocks
//! build in shared memory) times the filter's `[k, c * taps]` rows, on the matmul's
//! `fma_tile` core, finished by the shared epilogue. `kp` (output channels as the GEMM's
//! rows, pixels as its columns) for channels-first x, `pk` for channels-last; both take
//! any strides. f32 data only (`Fma` math, or `Tf32`, which allows exact arithmetic).

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use oxidnn_params::{
    conv_igemm_table_bytes, fma_shared_bytes, ConvImplicitGemmParams, FastDivisor, PixelIndex,
    CONV_IGEMM_MAX_TAPS, FMA_THREADS,
};

/// Block tiles (GEMM rows x columns), tried in this order by [`tile`].
const TILES: [(u32, u32); 4] = [(128, 128), (128, 64), (64, 128), (64, 64)];

/// Why the implicit GEMM does not run this problem, or `None` if it does.
pub(super) fn declines(p: &Problem) -> Option<String> {
    if p.dtype != DataType::F32 {
        return Some(format!(
            "it computes exact f32 on CUDA cores; {} data goes to the tensor-core or direct algorithms",
            p.dtype
        ));
    }
    let taps = p.geo.taps();
    if taps > CONV_IGEMM_MAX_TAPS {
        return Some(format!(
            "the filter has {taps} taps; the shared offset tables hold at most {CONV_IGEMM_MAX_TAPS}"
        ));
    }
    let gemm_k = p.geo.c_per_group as u64 * taps as u64;
    let pixels = pixel_count(p);
    if gemm_k > u32::MAX as u64 / 2 || pixels > u32::MAX as u64 / 2 {
        return Some(format!(
            "the GEMM ({pixels} pixels, K = {gemm_k}) exceeds the kernels' 32-bit indices"
        ));
    }
    None
}

fn pixel_count(p: &Problem) -> u64 {
    let g = &p.geo;
    g.n as u64 * g.output.iter().map(|&o| o as u64).product::<u64>()
}

/// Whether the `kp` kernels (pixels as the GEMM's columns) suit x's layout: its pixels
/// lie closer together than its channels.
fn pixels_as_columns(p: &Problem) -> bool {
    p.geo.x[1] > p.geo.x[4] || p.geo.c_per_group == 1
}

/// The block tile for a `rows x cols` GEMM per group: the first of [`TILES`] that wastes
/// at most a quarter of each dim and gives every SM 4 blocks, else the smallest. (On an
/// H100, ResNet-50's 3x3 layers at N = 32 ran fastest on 64 x 64 tiles but for the
/// 64-channel one, where 64 x 128 was as fast; 128 x 128 tiles leave too few blocks.)
fn tile(rows: u64, cols: u64, groups: u64, sm_count: u32) -> (u32, u32) {
    let fill = |extent: u64, t: u32| extent as f64 / (extent.div_ceil(t as u64) * t as u64) as f64;
    TILES
        .into_iter()
        .find(|&(bm, bn)| {
            let blocks = rows.div_ceil(bm as u64) * cols.div_ceil(bn as u64) * groups;
            fill(rows, bm) >= 0.75 && fill(cols, bn) >= 0.75 && blocks >= 4 * sm_count as u64
        })
        .unwrap_or(TILES[TILES.len() - 1])
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let kp = pixels_as_columns(p);
    let pixels = pixel_count(p);
    let taps = g.taps();
    let (rows, cols) = if kp {
        (g.k_per_group as u64, pixels)
    } else {
        (pixels, g.k_per_group as u64)
    };
    let (bm, bn) = tile(rows, cols, g.groups as u64, call.gpu.sm_count);
    let (tiles_m, tiles_n) = (rows.div_ceil(bm as u64), cols.div_ceil(bn as u64));
    if tiles_m * tiles_n > i32::MAX as u64 {
        return Err(Error::unsupported(format!(
            "{} output tiles exceed the grid",
            tiles_m * tiles_n
        )));
    }
    let params = ConvImplicitGemmParams {
        geo: *g,
        ops: call.ops(),
        pixels: PixelIndex::new(g.output),
        inner: FastDivisor::new(if kp { taps } else { g.c_per_group }),
        m_pixels: pixels as u32,
        gemm_k: g.c_per_group * taps,
        tiles_m: tiles_m as u32,
        tiles_n: tiles_n as u32,
    };
    let mode = if kp { "kp" } else { "pk" };
    let name = format!("conv_fwd_implicit_gemm_{bm}x{bn}_{mode}_f32");
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no implicit-GEMM kernel `{name}`")))?;
    let cfg = LaunchConfig {
        grid: (tiles_m * tiles_n) as u32,
        grid_y: g.groups.min(65535),
        block: FMA_THREADS,
        shared_bytes: fma_shared_bytes(bm, bn) + conv_igemm_table_bytes(taps),
    };
    let pointers = call.kernel_pointers(y)?;
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry describes; every span is below 2^31 elements (checked by the algorithm),
    // and the kernel reads x only at in-bounds input coordinates (padding taps are
    // skipped), w only at rows < k_per_group and kk < gemm_k, and stores y only at rows
    // and columns inside the GEMM; bias and z are read only when the epilogue has them.
    // The shared memory covers the tile stages and the tap tables (taps <= the cap).
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}
