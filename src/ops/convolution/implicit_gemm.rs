//! [`ConvFwdAlgo::ImplicitGemm`](super::ConvFwdAlgo::ImplicitGemm): exact-f32 implicit
//! GEMM on CUDA cores, `conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32`. Per group, the
//! pixels' im2col rows (gathered from x in place through per-tap offset tables the blocks
//! build in shared memory) times the filter's `[k, c * taps]` rows, on the matmul's
//! `fma_tile` core, finished by the shared epilogue. `kp` (output channels as the GEMM's
//! rows, pixels as its columns) for channels-first x, `pk` for channels-last; both take
//! any strides. f32 data only (`Fma` math, or `Tf32`, which allows exact arithmetic).
//!
//! Split-K: where the tile grid leaves SMs idle (small spatial outputs, few channels, long
//! K), the blocks cut K into partitions, store raw partial sums to the workspace, and a
//! second kernel adds the partitions in a fixed order (deterministic) and applies the
//! epilogue once. [`plan`] chooses the tile and the partitions by a cost model.

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use oxidnn_params::{
    conv_igemm_table_bytes, fma_shared_bytes, ConvImplicitGemmParams, FastDivisor, PixelIndex,
    CONV_IGEMM_MAX_TAPS, CONV_IGEMM_REDUCE_THREADS, FMA_BK, FMA_THREADS,
};

/// Block tiles (GEMM rows x columns) with their modelled throughput per SM (multiply-adds
/// per second with the SM full of its blocks) and the blocks one SM holds (ptxas 12.9
/// registers of the `kp` kernels at 256 threads: 183, 128 (bounded), 127, 63). The rates
/// are fitted to every tile x split of ResNet-50's layers at N = 32 (f32 NCHW, H100,
/// device run of 2026-11-23 07:05, `time_implicit_gemm_plans`, where the 128-row tiles
/// gathered two K tiles ahead and the others one): 128 x 64 (two blocks per SM) is the
/// fastest almost everywhere. (64 x 64 gathers two ahead since; its rate is that run's.)
/// Earlier entries win ties.
const TILES: [Tile; 4] = [
    Tile::new(128, 128, 90e9, 1),
    Tile::new(64, 128, 70e9, 2),
    Tile::new(128, 64, 100e9, 2),
    Tile::new(64, 64, 80e9, 4),
];

/// One block tile of [`TILES`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    bm: u32,
    bn: u32,
    rate: f64,
    resident: u64,
}

impl Tile {
    const fn new(bm: u32, bn: u32, rate: f64, resident: u64) -> Self {
        Self {
            bm,
            bn,
            rate,
            resident,
        }
    }
}

/// Most K partitions a plan uses.
const MAX_SPLITS: u32 = 16;
/// Fewest products per K partition the heuristic makes (a forced split may make fewer).
const MIN_SPLIT_K: u32 = 128;
/// A block's fixed cost (tap tables, pipeline fill, epilogue), as products of K.
const BLOCK_OVERHEAD_K: f64 = 32.0;
/// What a partial last wave costs, as a fraction of the full wave's missing blocks: the
/// blocks of a partly filled SM run barely faster than a full SM's (they are latency-bound).
const PARTIAL_WAVE_COST: f64 = 0.5;
/// Modelled cost of split-K's reduction: bytes per second through L2/DRAM and the extra
/// launch.
const REDUCE_BYTES_PER_S: f64 = 2.0e12;
const REDUCE_LAUNCH_S: f64 = 4e-6;
/// The SM count the plan assumes without a GPU (the workspace query on the CPU handle):
/// the H100 the kernels are tuned on.
const DEFAULT_SM_COUNT: u32 = 132;

/// How a problem runs: the kernel mode, the block tile and the K partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Output channels as the GEMM's rows, pixels as its columns (`kp` kernels).
    kp: bool,
    bm: u32,
    bn: u32,
    /// The group's GEMM: rows x columns, and K.
    rows: u64,
    cols: u64,
    gemm_k: u32,
    /// K partitions (1: no split-K) and products per partition.
    splits: u32,
    split_k: u32,
}

impl Plan {
    fn tiles(&self) -> (u64, u64) {
        (
            self.rows.div_ceil(self.bm as u64),
            self.cols.div_ceil(self.bn as u64),
        )
    }

    /// Partial sums in the workspace: `groups * splits * rows * cols` (none without
    /// split-K).
    fn partials(&self, groups: u32) -> u64 {
        if self.splits > 1 {
            groups as u64 * self.splits as u64 * self.rows * self.cols
        } else {
            0
        }
    }
}

/// `(splits, split_k)` for at most `want` partitions of `gemm_k`: each a multiple of the K
/// tile, all non-empty, so the count may come out lower than `want`.
fn partitions(gemm_k: u32, want: u32) -> (u32, u32) {
    let split_k = gemm_k.div_ceil(want.max(1)).div_ceil(FMA_BK) * FMA_BK;
    let splits = gemm_k.div_ceil(split_k.max(1)).max(1);
    if splits == 1 {
        (1, gemm_k)
    } else {
        (splits, split_k)
    }
}

/// The plan for this problem on `sm_count` SMs (the workspace query and the launch agree
/// on it).
///
/// Tiles wasting more than a quarter of a GEMM dim are skipped (the smallest tile always
/// qualifies). For each tile and partition count the model charges the busiest SM's
/// blocks (`ceil(blocks / SMs)`, plus [`PARTIAL_WAVE_COST`] of the blocks its last wave
/// lacks) times a block's products (`bm * bn * (split_k +` [`BLOCK_OVERHEAD_K`]`)`) at the
/// tile's rate, plus, under split-K, the partial sums' traffic (each written once and
/// read once, y written once) and a launch; the cheapest wins. Against the best of every
/// tile and split measured (ResNet-50, N = 32, H100) its picks are 1.1% slower (geomean).
///
/// `OXIDNN_CONV_IGEMM_FMA=BMxBN` or `BMxBNsS` forces a tile (and at most `S` partitions),
/// for tuning and tests; a value naming no tile is an error.
pub(super) fn plan(p: &Problem, sm_count: u32) -> Result<Plan> {
    let g = &p.geo;
    let kp = pixels_as_columns(p);
    let pixels = pixel_count(p);
    let (rows, cols) = if kp {
        (g.k_per_group as u64, pixels)
    } else {
        (pixels, g.k_per_group as u64)
    };
    let gemm_k = g.c_per_group * g.taps();
    let groups = g.groups as u64;
    let make = |t: &Tile, (splits, split_k): (u32, u32)| Plan {
        kp,
        bm: t.bm,
        bn: t.bn,
        rows,
        cols,
        gemm_k,
        splits,
        split_k,
    };
    // The workspace's offsets are 32-bit in the kernels.
    let fits = |plan: &Plan| plan.partials(g.groups) < i32::MAX as u64;
    if let Ok(forced) = std::env::var("OXIDNN_CONV_IGEMM_FMA") {
        let (tile, splits) = forced.split_once('s').unwrap_or((&forced, "1"));
        let t = TILES.iter().find(|t| tile == format!("{}x{}", t.bm, t.bn));
        let splits = splits.parse::<u32>().ok().filter(|&s| s >= 1);
        return match (t, splits) {
            (Some(t), Some(s)) => {
                let plan = make(t, partitions(gemm_k, s));
                if fits(&plan) {
                    Ok(plan)
                } else {
                    Err(Error::unsupported(format!(
                        "OXIDNN_CONV_IGEMM_FMA={forced}: the partial sums exceed 2^31 elements"
                    )))
                }
            }
            _ => Err(Error::unsupported(format!(
                "OXIDNN_CONV_IGEMM_FMA={forced} names no exact-f32 implicit-GEMM plan (BMxBN or BMxBNsS, tiles 128x128, 64x128, 128x64, 64x64)"
            ))),
        };
    }
    let sms = sm_count.max(1) as u64;
    let fill = |extent: u64, t: u32| extent as f64 / (extent.div_ceil(t as u64) * t as u64) as f64;
    let smallest = &TILES[TILES.len() - 1];
    let mut best: Option<(f64, Plan)> = None;
    for t in TILES
        .iter()
        .filter(|t| *t == smallest || (fill(rows, t.bm) >= 0.75 && fill(cols, t.bn) >= 0.75))
    {
        let tiles = rows.div_ceil(t.bm as u64) * cols.div_ceil(t.bn as u64) * groups;
        for want in 1..=MAX_SPLITS {
            let (splits, split_k) = partitions(gemm_k, want);
            if splits != want || (splits > 1 && split_k < MIN_SPLIT_K) {
                continue;
            }
            let plan = make(t, (splits, split_k));
            if !fits(&plan) {
                break;
            }
            let blocks = tiles * splits as u64;
            let per_sm = blocks.div_ceil(sms);
            let missing = per_sm.div_ceil(t.resident) * t.resident - per_sm;
            let waves = per_sm as f64 + PARTIAL_WAVE_COST * missing as f64;
            let gemm = waves * (t.bm * t.bn) as f64 * (split_k as f64 + BLOCK_OVERHEAD_K) / t.rate;
            let reduce = if splits > 1 {
                (2 * splits as u64 + 1) as f64 * (groups * rows * cols * 4) as f64
                    / REDUCE_BYTES_PER_S
                    + REDUCE_LAUNCH_S
            } else {
                0.0
            };
            let cost = gemm + reduce;
            if best.is_none_or(|(c, _)| cost < c) {
                best = Some((cost, plan));
            }
        }
    }
    best.map(|(_, plan)| plan).ok_or_else(|| {
        Error::unsupported("no implicit-GEMM plan fits the 32-bit workspace offsets")
    })
}

/// Workspace bytes of the plan on `sm_count` SMs (`None`: [`DEFAULT_SM_COUNT`]): the
/// split-K partial sums, or 0.
pub(super) fn workspace_bytes(p: &Problem, sm_count: Option<u32>) -> usize {
    plan(p, sm_count.unwrap_or(DEFAULT_SM_COUNT))
        .map_or(0, |plan| plan.partials(p.geo.groups) as usize * 4)
}

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

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let plan = plan(p, call.gpu.sm_count)?;
    let taps = g.taps();
    let (tiles_m, tiles_n) = plan.tiles();
    let blocks = tiles_m * tiles_n * plan.splits as u64;
    if blocks > i32::MAX as u64 {
        return Err(Error::unsupported(format!(
            "{blocks} blocks (output tiles x K partitions) exceed the grid"
        )));
    }
    let params = ConvImplicitGemmParams {
        geo: *g,
        ops: call.ops(),
        pixels: PixelIndex::new(g.output),
        inner: FastDivisor::new(if plan.kp { taps } else { g.c_per_group }),
        m_pixels: pixel_count(p) as u32,
        gemm_k: plan.gemm_k,
        tiles_m: tiles_m as u32,
        tiles_n: tiles_n as u32,
        splits: plan.splits,
        split_k: plan.split_k,
    };
    let mode = if plan.kp { "kp" } else { "pk" };
    let name = format!("conv_fwd_implicit_gemm_{}x{}_{mode}_f32", plan.bm, plan.bn);
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no implicit-GEMM kernel `{name}`")))?;
    let cfg = LaunchConfig {
        grid: blocks as u32,
        grid_y: g.groups.min(65535),
        block: FMA_THREADS,
        shared_bytes: fma_shared_bytes(plan.bm, plan.bn) + conv_igemm_table_bytes(taps),
    };
    let [x, w, y_ptr, bias, z] = call.kernel_pointers(y)?;
    let partials = plan.partials(g.groups);
    // The registry checked the workspace against `workspace_bytes`, the same plan's;
    // checked again here, so that the launch can never write past it.
    let ws = if partials > 0 { call.ptrs.workspace } else { 0 };
    if partials as usize * 4 > call.ptrs.workspace_bytes {
        return Err(Error::WorkspaceTooSmall {
            required_bytes: partials as usize * 4,
            got_bytes: call.ptrs.workspace_bytes,
        });
    }
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry describes; every span is below 2^31 elements (checked by the algorithm),
    // and the kernel reads x only at in-bounds input coordinates (padding taps are
    // skipped), w only at rows < k_per_group and kk < gemm_k, and stores y only at rows
    // and columns inside the GEMM; bias and z are read only when the epilogue has them.
    // Under split-K it stores the partial sums instead, inside the workspace of
    // `partials` (< 2^31) elements that the registry checked. The shared memory covers
    // the tile stages and the tap tables (taps <= the cap).
    unsafe {
        call.gpu
            .launch(kernel, cfg, &params, &[x, w, y_ptr, bias, z, ws])?
    };
    if plan.splits == 1 {
        return Ok(());
    }
    let pairs = g.groups as u64 * plan.rows * plan.cols.div_ceil(2);
    let cfg = LaunchConfig::for_threads(pairs, CONV_IGEMM_REDUCE_THREADS)?;
    let cfg = LaunchConfig {
        grid: cfg.grid.min(call.gpu.sm_count * 16),
        ..cfg
    };
    let name = format!("conv_fwd_implicit_gemm_reduce_{mode}_f32");
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no split-K reduction kernel `{name}`")))?;
    // SAFETY: the first launch (same stream, so it finishes first) wrote all `partials`
    // sums of the workspace; this kernel reads only those and stores each y element of
    // the GEMM once through the epilogue, as the first kernel does without split-K.
    unsafe { call.gpu.launch(kernel, cfg, &params, &[ws, y_ptr, bias, z]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partitions are whole K tiles, none empty, the last one taking the remainder.
    #[test]
    fn partitions_cover_k_once() {
        // K shorter than the asked-for partitions: fewer of them, or none.
        assert_eq!(partitions(5, 4), (1, 5));
        assert_eq!(partitions(8, 16), (1, 8));
        assert_eq!(partitions(12, 4), (2, 8));
        // Uneven: 8 of 136 and a last one of 91.
        assert_eq!(partitions(1179, 9), (9, 136));
        assert_eq!(partitions(4608, 1), (1, 4608));
        for k in 1..600 {
            for want in 1..=MAX_SPLITS {
                let (splits, split_k) = partitions(k, want);
                assert!(splits >= 1 && splits <= want, "k {k} want {want}");
                if splits > 1 {
                    assert_eq!(split_k % FMA_BK, 0);
                    assert!((splits - 1) * split_k < k && splits * split_k >= k);
                } else {
                    assert_eq!(split_k, k);
                }
            }
        }
    }
}
