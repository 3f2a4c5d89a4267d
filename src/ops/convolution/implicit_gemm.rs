//! [`ConvFwdAlgo::ImplicitGemm`](super::ConvFwdAlgo::ImplicitGemm): exact-f32 implicit
//! GEMM on CUDA cores. Per group, the pixels' im2col rows (read from x in place through
//! offset tables the blocks build in shared memory) times the filter's `[k, c * taps]`
//! rows, finished by the shared epilogue. Two cores:
//!
//! * `cp.async` (`conv_fwd_implicit_gemm_async_<BMxBN>_<t|p>_f32`, the matmul's
//!   `fma_tile_async`: a 4-stage ring of `[k][mn]` stages, 64 x 64 / 64 x 32 warp tiles):
//!   output channels as the GEMM's rows, pixels as its columns, `kk` channel-outer, for
//!   channels-first x with a dense `[k, c, r, s]` filter (its rows contiguous along K).
//!   `_t` reads the pixels through a per-`kk` table, `_p` (one tap, no padding) directly.
//!   [`async_declines`] says which problems it leaves to the other core.
//! * register-staged gathers (`conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32`, `fma_tile_ahead`):
//!   everything else: channels-last x (`pk`), other filter layouts, 3-D filters, extents
//!   past the table's 16-bit taps. Any strides.
//!
//! f32 data only (`Fma` math, or `Tf32`, which allows exact arithmetic).
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
    conv_igemm_async_shared_bytes, conv_igemm_async_table_bytes, conv_igemm_table_bytes,
    fma_shared_bytes, ConvImplicitGemmParams, FastDivisor, PixelIndex, CONV_IGEMM_ASYNC_MAX_K,
    CONV_IGEMM_ASYNC_THREADS, CONV_IGEMM_MAX_TAPS, CONV_IGEMM_REDUCE_THREADS, FMA_BK, FMA_THREADS,
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

/// Block tiles of the `cp.async` core (128 threads each; 2, 3, 3 and 4 blocks per SM: ptxas
/// 12.9, 240-250 registers on 128 x 128, the others bounded by `build.rs`) with their
/// rates for the tap-table (`_t`) and pointwise (`_p`) kernels. Fitted (with
/// [`ASYNC_BLOCK_OVERHEAD_K`] and [`ASYNC_PARTIAL_WAVE_COST`]) to every tile x split of
/// ResNet-50's layers at N = 32 (f32 NCHW, H100, `time_implicit_gemm_plans`, device run
/// of 2026-11-23 19:14, pair epilogue), first by least squares, then two rates (64 x 128
/// `_t`, 64 x 64 `_p`) lowered by a search on the picks: 128 x 64 leads on 3x3s (C >= 128),
/// 64 x 128 on 1x1s, 64 x 64 where K is short, 128 x 128 split 5 ways on the 7x7 res5
/// layers. Against the best tile x split measured its picks are 1.3% slower (geomean;
/// every pick was measured). The least-squares rates (64 x 128 `_t` 128e9, 64 x 64 `_p`
/// 153e9) were what the device run of 19:50 measured (geomean 1.032 against cuDNN).
const ASYNC_TILES: [Tile; 4] = [
    Tile::new(128, 128, 139e9, 2).pointwise(145e9),
    Tile::new(64, 128, 115e9, 3).pointwise(170e9),
    Tile::new(128, 64, 143e9, 3).pointwise(167e9),
    Tile::new(64, 64, 127e9, 4).pointwise(138e9),
];
/// The `cp.async` core's [`BLOCK_OVERHEAD_K`] and [`PARTIAL_WAVE_COST`] (same fit).
const ASYNC_BLOCK_OVERHEAD_K: f64 = 16.0;
const ASYNC_PARTIAL_WAVE_COST: f64 = 0.3;

/// One block tile of [`TILES`] or [`ASYNC_TILES`].
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tile {
    bm: u32,
    bn: u32,
    /// Multiply-adds per second per full SM, and that of the pointwise kernels.
    rate: f64,
    rate_pointwise: f64,
    resident: u64,
}

impl Tile {
    const fn new(bm: u32, bn: u32, rate: f64, resident: u64) -> Self {
        Self {
            bm,
            bn,
            rate,
            rate_pointwise: rate,
            resident,
        }
    }

    const fn pointwise(self, rate_pointwise: f64) -> Self {
        Self {
            rate_pointwise,
            ..self
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
    /// The core: register-staged gathers or `cp.async`.
    core: Core,
    /// Output channels as the GEMM's rows, pixels as its columns (`kp` kernels; always
    /// on the `cp.async` core).
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

/// Which kernels a plan runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Core {
    /// `conv_fwd_implicit_gemm_<tile>_<kp|pk>_f32`.
    Gather,
    /// `conv_fwd_implicit_gemm_async_<tile>_<t|p>_f32`; `pointwise`: the `_p` kernels.
    Async { pointwise: bool },
}

impl Plan {
    /// Dynamic shared memory of a block (stages or staged result, and the tables).
    fn shared_bytes(&self, taps: u32) -> u32 {
        match self.core {
            Core::Gather => fma_shared_bytes(self.bm, self.bn) + conv_igemm_table_bytes(taps),
            Core::Async { pointwise } => conv_igemm_async_shared_bytes(
                self.bm,
                self.bn,
                if pointwise {
                    0
                } else {
                    conv_igemm_async_table_bytes(self.split_k)
                },
            ),
        }
    }

    fn kernel_name(&self) -> String {
        match self.core {
            Core::Gather => {
                let mode = if self.kp { "kp" } else { "pk" };
                format!("conv_fwd_implicit_gemm_{}x{}_{mode}_f32", self.bm, self.bn)
            }
            Core::Async { pointwise } => {
                let v = if pointwise { "p" } else { "t" };
                format!(
                    "conv_fwd_implicit_gemm_async_{}x{}_{v}_f32",
                    self.bm, self.bn
                )
            }
        }
    }

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
/// tile and split measured (ResNet-50, N = 32, H100) its picks are 1.1% slower (gather
/// core) and 1.3% (`cp.async` core, with its own constants) (geomean).
///
/// The `cp.async` core's tiles are the candidates wherever it takes the problem
/// ([`async_declines`]), else the gather core's.
///
/// `OXIDNN_CONV_IGEMM_FMA=BMxBN` or `BMxBNsS` forces a gather-core tile (and at most `S`
/// partitions), `aBMxBN[sS]` a `cp.async` one, for tuning and tests; a value naming no
/// tile, or a `cp.async` tile for a problem that core declines, is an error.
pub(super) fn plan(p: &Problem, sm_count: u32) -> Result<Plan> {
    let g = &p.geo;
    let async_why = async_declines(p);
    let pointwise = is_pointwise(p);
    let forced = std::env::var("OXIDNN_CONV_IGEMM_FMA").ok();
    let use_async = match forced.as_deref().map(|f| f.strip_prefix('a')) {
        Some(Some(_)) => {
            if let Some(why) = &async_why {
                return Err(Error::unsupported(format!(
                    "OXIDNN_CONV_IGEMM_FMA={} forces a cp.async tile, but that core declines this problem: {why}",
                    forced.as_deref().unwrap_or_default()
                )));
            }
            true
        }
        Some(None) => false,
        None => async_why.is_none(),
    };
    let (core, tiles) = if use_async {
        (Core::Async { pointwise }, &ASYNC_TILES)
    } else {
        (Core::Gather, &TILES)
    };
    // The tap-table kernels keep one entry per product of a partition.
    let table_fits = |split_k: u32| pointwise || !use_async || split_k <= CONV_IGEMM_ASYNC_MAX_K;
    let kp = use_async || pixels_as_columns(p);
    let pixels = pixel_count(p);
    let (rows, cols) = if kp {
        (g.k_per_group as u64, pixels)
    } else {
        (pixels, g.k_per_group as u64)
    };
    let gemm_k = g.c_per_group * g.taps();
    let groups = g.groups as u64;
    let make = |t: &Tile, (splits, split_k): (u32, u32)| Plan {
        core,
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
    if let Some(forced) = &forced {
        let spec = forced.strip_prefix('a').unwrap_or(forced);
        let (tile, splits) = spec.split_once('s').unwrap_or((spec, "1"));
        let t = tiles.iter().find(|t| tile == format!("{}x{}", t.bm, t.bn));
        let splits = splits.parse::<u32>().ok().filter(|&s| s >= 1);
        return match (t, splits) {
            (Some(t), Some(s)) => {
                let plan = make(t, partitions(gemm_k, s));
                if !fits(&plan) {
                    Err(Error::unsupported(format!(
                        "OXIDNN_CONV_IGEMM_FMA={forced}: the partial sums exceed 2^31 elements"
                    )))
                } else if !table_fits(plan.split_k) {
                    Err(Error::unsupported(format!(
                        "OXIDNN_CONV_IGEMM_FMA={forced}: partitions of {} products exceed the cp.async kernels' table ({CONV_IGEMM_ASYNC_MAX_K})",
                        plan.split_k
                    )))
                } else {
                    Ok(plan)
                }
            }
            _ => Err(Error::unsupported(format!(
                "OXIDNN_CONV_IGEMM_FMA={forced} names no exact-f32 implicit-GEMM plan (BMxBN[sS] for the gather core, aBMxBN[sS] for cp.async; tiles 128x128, 64x128, 128x64, 64x64)"
            ))),
        };
    }
    let sms = sm_count.max(1) as u64;
    let (block_overhead_k, partial_wave_cost) = if use_async {
        (ASYNC_BLOCK_OVERHEAD_K, ASYNC_PARTIAL_WAVE_COST)
    } else {
        (BLOCK_OVERHEAD_K, PARTIAL_WAVE_COST)
    };
    let fill = |extent: u64, t: u32| extent as f64 / (extent.div_ceil(t as u64) * t as u64) as f64;
    let smallest = &tiles[tiles.len() - 1];
    let mut best: Option<(f64, Plan)> = None;
    for t in tiles
        .iter()
        .filter(|t| *t == smallest || (fill(rows, t.bm) >= 0.75 && fill(cols, t.bn) >= 0.75))
    {
        let tiles = rows.div_ceil(t.bm as u64) * cols.div_ceil(t.bn as u64) * groups;
        for want in 1..=MAX_SPLITS {
            let (splits, split_k) = partitions(gemm_k, want);
            if splits != want || (splits > 1 && split_k < MIN_SPLIT_K) || !table_fits(split_k) {
                continue;
            }
            let plan = make(t, (splits, split_k));
            if !fits(&plan) {
                break;
            }
            let blocks = tiles * splits as u64;
            let per_sm = blocks.div_ceil(sms);
            let missing = per_sm.div_ceil(t.resident) * t.resident - per_sm;
            let waves = per_sm as f64 + partial_wave_cost * missing as f64;
            let rate = if use_async && pointwise {
                t.rate_pointwise
            } else {
                t.rate
            };
            let gemm = waves * (t.bm * t.bn) as f64 * (split_k as f64 + block_overhead_k) / rate;
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
        Error::unsupported(
            "no implicit-GEMM plan fits the 32-bit workspace offsets (and the tables' partitions)",
        )
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

/// Why the `cp.async` kernels leave this problem to the gather kernels, or `None` if they
/// take it (`OXIDNN_VERBOSE=1` prints the reason with the plan).
pub(super) fn async_declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if !pixels_as_columns(p) {
        return Some("x is channels-last: its pixels are gathered by the `pk` kernels".into());
    }
    let taps = g.taps();
    if g.filter[0] != 1 || g.pad[0] != 0 {
        return Some(
            "the depth dim has a filter or padding (3-D): the table holds h and w taps".into(),
        );
    }
    // Row `k` of the filter at `kk = c * taps + r * s_extent + s`: the strides of c, r and
    // s (those of extent 1 never step) are taps, s_extent and 1.
    let dense = [
        (g.c_per_group, g.w[1], taps),
        (g.filter[1], g.w[3], g.filter[2]),
        (g.filter[2], g.w[4], 1),
    ]
    .iter()
    .all(|&(extent, stride, want)| extent == 1 || stride == want);
    if !dense {
        return Some(format!(
            "the filter's strides {:?} are not a dense [k, c, r, s] layout: its rows are not contiguous along K",
            g.w
        ));
    }
    const TAP_LIMIT: u32 = 1 << 15;
    for j in 1..3 {
        let reach = (g.filter[j] - 1) as u64 * g.dilation[j] as u64;
        if g.input[j] as u64 + g.pad[j] as u64 > TAP_LIMIT as u64 || reach >= TAP_LIMIT as u64 {
            return Some(format!(
                "spatial dim {j}: input {} + padding {} or filter reach {reach} exceeds the table's 15-bit taps",
                g.input[j], g.pad[j]
            ));
        }
    }
    let gemm_k = g.c_per_group as u64 * taps as u64;
    if !is_pointwise(p) && gemm_k > CONV_IGEMM_ASYNC_MAX_K as u64 * MAX_SPLITS as u64 {
        return Some(format!(
            "K = {gemm_k} needs more than {MAX_SPLITS} partitions of the table's {CONV_IGEMM_ASYNC_MAX_K} entries"
        ));
    }
    None
}

/// One tap and no padding: the `cp.async` core's `_p` kernels (no table, no checks inside).
fn is_pointwise(p: &Problem) -> bool {
    p.geo.taps() == 1 && p.geo.pad == [0; 3]
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
    let name = plan.kernel_name();
    if std::env::var("OXIDNN_VERBOSE").is_ok_and(|v| v == "1") {
        let why = async_declines(p).unwrap_or_else(|| "it takes the problem".into());
        eprintln!(
            "oxidnn: ImplicitGemm runs {} with {} split(s) of K = {} (cp.async core: {why})",
            name, plan.splits, plan.gemm_k
        );
    }
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no implicit-GEMM kernel `{name}`")))?;
    let cfg = LaunchConfig {
        grid: blocks as u32,
        grid_y: g.groups.min(65535),
        block: match plan.core {
            Core::Gather => FMA_THREADS,
            Core::Async { .. } => CONV_IGEMM_ASYNC_THREADS,
        },
        shared_bytes: plan.shared_bytes(taps),
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
    // the tile stages and the tap tables (taps <= the cap; for the cp.async kernels the
    // table of `split_k` entries), and the cp.async kernels run only where
    // `async_declines` found a dense [k, c, r, s] filter, an unpadded 1-tap depth dim and
    // h, w extents within the table's 15-bit taps (the padding checks rely on them).
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
    use crate::{
        convolution_forward_output_dims, ConvEpilogue, ConvMode, ConvolutionDescriptor,
        FilterDescriptor, FilterLayout, Handle, Layout, MathType, TensorDescriptor,
    };

    /// An f32 2-D problem: `(n, c, k, [h, w])`, square filter, pad, stride, groups, layout.
    fn problem(
        (n, c, k, hw): (usize, usize, usize, [usize; 2]),
        (f, pad, stride, groups): (usize, usize, usize, usize),
        layout: Layout,
    ) -> Problem {
        let conv = ConvolutionDescriptor::new(
            &[pad; 2],
            &[stride; 2],
            &[1; 2],
            ConvMode::Convolution,
            MathType::Fma,
        )
        .unwrap()
        .with_groups(groups)
        .unwrap();
        let fl = match layout {
            Layout::ChannelsLast => FilterLayout::Krsc,
            _ => FilterLayout::Kcrs,
        };
        let x = TensorDescriptor::spatial(DataType::F32, n, c, &hw, layout).unwrap();
        let w = FilterDescriptor::new(DataType::F32, fl, k, c / groups, &[f, f]).unwrap();
        let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
        let y = TensorDescriptor::spatial(DataType::F32, yd[0], yd[1], &yd[2..], layout).unwrap();
        Problem::new(&Handle::cpu(), &x, &w, &conv, &y, &ConvEpilogue::default()).unwrap()
    }

    /// NCHW with KCRS filters (every ResNet-50 layer's f32 configuration) runs on the
    /// `cp.async` core, `_p` exactly for unpadded 1x1s; channels-last x, KRSC filters and
    /// 3x3s with 2^15 input columns stay on the gather core, with a reason.
    #[test]
    fn async_core_takes_channels_first_dense_filters() {
        let nchw = Layout::ChannelsFirst;
        for (dims, geo, pointwise) in [
            ((32, 3, 64, [224, 224]), (7, 3, 2, 1), false),
            ((32, 64, 64, [56, 56]), (3, 1, 1, 1), false),
            ((32, 256, 512, [56, 56]), (1, 0, 2, 1), true),
            ((32, 512, 2048, [7, 7]), (1, 0, 1, 1), true),
            ((2, 130, 129, [6, 5]), (1, 1, 1, 1), false),
            ((2, 12, 18, [8, 7]), (3, 1, 1, 3), false),
        ] {
            let p = problem(dims, geo, nchw);
            assert_eq!(async_declines(&p), None, "{dims:?} {geo:?}");
            let plan = plan(&p, DEFAULT_SM_COUNT).unwrap();
            assert_eq!(plan.core, Core::Async { pointwise }, "{dims:?} {geo:?}");
            assert!(plan.kp && (pointwise || plan.split_k <= CONV_IGEMM_ASYNC_MAX_K));
            let name = plan.kernel_name();
            assert!(crate::kernels::lookup(&name).is_some(), "{name}");
        }
        for p in [
            problem((2, 64, 64, [14, 14]), (3, 1, 1, 1), Layout::ChannelsLast),
            problem((1, 4, 4, [3, 1 << 15]), (3, 1, 1, 1), nchw),
        ] {
            assert!(async_declines(&p).is_some());
            assert_eq!(plan(&p, DEFAULT_SM_COUNT).unwrap().core, Core::Gather);
        }
    }

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
