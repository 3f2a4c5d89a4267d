//! [`ConvFwdAlgo::Depthwise`](super::ConvFwdAlgo::Depthwise): depthwise convolutions
//! (groups == c, one input channel per group, any channel multiplier), every dtype, any
//! filter, stride, dilation, padding and mode. Channels-last x and y with 16-byte channel
//! vectors (and multiplier 1) run, for packed 3x3 16-bit filters,
//! `conv_fwd_depthwise_tile3_<f16|bf16>` at stride 1 and dilation 1 along h and w on
//! outputs at least 7 wide (input rows staged in shared memory by `cp.async`, one output
//! vector per thread per row; see `default_tile`), else
//! `conv_fwd_depthwise_strip3s<1|2>_<f16|bf16>` at stride 1 (or 2 on narrow outputs) and
//! dilation 1 along the innermost dim (one thread per channel vector of seven output
//! pixels, filter and input columns in registers; see `strip_stride`), else
//! `conv_fwd_depthwise_vec_<dtype>` (one thread per channel vector of two output pixels);
//! everything else `conv_fwd_depthwise_rows_<dtype>` (one thread per four consecutive
//! outputs of a row, input windows in registers). `OXIDNN_CONV_DW_TILE` forces the
//! channels-last kernel (see `forced`).

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use crate::ops::pooling::items;
use oxidnn_params::{
    dw_tile_shared_bytes, dw_tile_threads, ConvDepthwiseParams, ConvDepthwiseTileParams, DW_COLS,
    DW_PIXELS, DW_STRIP, DW_STRIP_THREADS, DW_THREADS,
};

/// Why this is not a depthwise problem, or `None` if it is.
pub(super) fn declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if g.groups != g.c || g.c_per_group != 1 {
        return Some(format!(
            "not depthwise: {} groups of {} input channels (depthwise has one channel per group)",
            g.groups, g.c_per_group
        ));
    }
    None
}

/// Elements per 16-byte channel vector when the channels-last kernel can run: x and y
/// channel-contiguous, multiplier 1, every other stride and both base addresses on
/// 16-byte boundaries.
fn vector(call: &Call, y_ptr: u64) -> Option<u32> {
    let g = &call.p.geo;
    let size = call.p.dtype.size_bytes() as u32;
    let vec = 16 / size;
    let aligned =
        |s: &[u32; 5]| s[1] == 1 && [0, 2, 3, 4].iter().all(|&d| s[d].is_multiple_of(vec));
    let ok = g.k_per_group == 1
        && g.k.is_multiple_of(vec)
        && aligned(&g.x)
        && aligned(&g.y)
        && call.ptrs.x.is_multiple_of(16)
        && y_ptr.is_multiple_of(16);
    ok.then_some(vec)
}

/// The `strip` kernel's innermost-dim stride (its name's `s1`/`s2`) when it runs: 16-bit
/// data (f32 channels-last keeps `vec`, untimed with `strip`); a 3x3 filter of depth 1,
/// packed (each channel's 9 taps contiguous, KCRS or KRSC alike at one channel per group)
/// and 16-byte aligned (the kernel reads a vector's 9 taps as 9 16-byte loads); dilation
/// 1 and stride 1 or 2 along the innermost dim. At stride 2 only where the output is at
/// most two strips wide: on wider stride-2 outputs (MobileNet's 28 to 56 wide, input 4x
/// the output) `vec`, whose 64 registers keep 4x the warps in flight, ran 1.15-1.4x
/// faster (H100); on the 7- and 14-wide ones `strip` took 0.88-1.05x `vec`'s time.
fn strip_stride(call: &Call) -> Option<u32> {
    let g = &call.p.geo;
    let ok = call.p.dtype.size_bytes() == 2
        && g.filter == [1, 3, 3]
        && g.w[0] == 9
        && g.w[3] == 3
        && g.w[4] == 1
        && call.ptrs.w.is_multiple_of(16)
        && g.dilation[2] == 1
        && (g.stride[2] == 1 || (g.stride[2] == 2 && g.output[2] <= 2 * DW_STRIP));
    ok.then_some(g.stride[2])
}

/// A `tile3` kernel's block tile: `channel_vectors` 16-byte channel vectors of `tile_h`
/// output rows by `tile_w` output columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    channel_vectors: u32,
    tile_w: u32,
    tile_h: u32,
}

impl Tile {
    /// Threads per block: one per output vector of a row.
    fn threads(&self) -> u32 {
        dw_tile_threads(self.channel_vectors, self.tile_w)
    }
}

/// The channels-last kernel a problem runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChannelsLast {
    /// `conv_fwd_depthwise_tile3_<dtype>` with this block tile.
    Tile(Tile),
    /// `conv_fwd_depthwise_strip3s<stride>_<dtype>`.
    Strip(u32),
    /// `conv_fwd_depthwise_vec_<dtype>`.
    Vec,
}

/// Whether the `tile3` kernel runs the problem: the `strip` kernels' filter conditions
/// ([`strip_stride`]), stride 1 and dilation 1 along both inner spatial dims.
fn tile_fits(call: &Call) -> bool {
    let g = &call.p.geo;
    strip_stride(call) == Some(1) && g.stride[1] == 1 && g.dilation[1] == 1
}

/// The `tile3` block tile the heuristic takes: the most channel vectors up to 8 (128
/// bytes of each pixel) that are a power of two dividing k's, the output width in the
/// fewest tiles of at most 112 channel vectors (blocks of about 4 warps: at the kernel's
/// 144 registers three per SM), and 28 rows (the output's height if smaller). Measured
/// on H100 (MobileNet, N = 64, f16): 112-thread blocks ran 1.2-1.4x faster than 224-thread
/// ones on 28- to 112-wide layers, 28 rows a block 0-10% faster than 14; see the
/// depthwise notes in docs/perf-notes.md.
fn default_tile(g: &oxidnn_params::ConvGeometry, vec: u32) -> Tile {
    let vectors = g.k / vec;
    let channel_vectors = [8, 4, 2, 1]
        .into_iter()
        .find(|d| vectors.is_multiple_of(*d))
        .unwrap_or(1);
    let col_tiles = (g.output[2] * channel_vectors).div_ceil(112);
    let tile_w = g.output[2].div_ceil(col_tiles);
    Tile {
        channel_vectors,
        tile_w,
        tile_h: 28.min(g.output[1]),
    }
}

/// `OXIDNN_CONV_DW_TILE` forces the channels-last kernel, for tuning and tests: `vec`,
/// `strip` or `CVxTWxTH` (the `tile3` kernel with that block tile). An error where the forced kernel cannot run the problem (never a
/// silent fallback).
fn forced(call: &Call, vec: u32) -> Result<Option<ChannelsLast>> {
    let Ok(v) = std::env::var("OXIDNN_CONV_DW_TILE") else {
        return Ok(None);
    };
    let g = &call.p.geo;
    let refuse = |why: &str| {
        Err(Error::unsupported(format!(
            "OXIDNN_CONV_DW_TILE={v}: {why}"
        )))
    };
    match v.as_str() {
        "vec" => Ok(Some(ChannelsLast::Vec)),
        "strip" => match strip_stride(call) {
            Some(s) => Ok(Some(ChannelsLast::Strip(s))),
            None => refuse("the strip kernels need a packed 3x3 16-bit filter at stride 1 or 2"),
        },
        _ => {
            let dims: Vec<u32> = v.split('x').filter_map(|d| d.parse().ok()).collect();
            let [channel_vectors, tile_w, tile_h] = dims[..] else {
                return refuse("expected `vec`, `strip` or `CVxTWxTH`");
            };
            if !tile_fits(call) {
                return refuse(
                    "the tile3 kernel needs a packed 3x3 16-bit filter at stride 1, dilation 1",
                );
            }
            let tile = Tile {
                channel_vectors,
                tile_w,
                tile_h,
            };
            let ok = channel_vectors > 0
                && (g.k / vec).is_multiple_of(channel_vectors)
                && tile_w > 0
                && tile_h > 0
                && tile.threads() <= 1024
                && dw_tile_shared_bytes(channel_vectors, tile_w) <= 200 * 1024;
            if !ok {
                return refuse(
                    "CV must divide k's 16-byte vectors; at most 1024 threads and 200 KB",
                );
            }
            Ok(Some(ChannelsLast::Tile(tile)))
        }
    }
}

/// The channels-last kernel: forced, else `tile3` for stride-1 outputs at least 7 wide
/// (on H100 it beat `strip` on every MobileNet stride-1 layer, 7x7 included, by 1.1-1.5x),
/// `strip` where it runs, else `vec`.
fn channels_last(call: &Call, vec: u32) -> Result<ChannelsLast> {
    if let Some(k) = forced(call, vec)? {
        return Ok(k);
    }
    let g = &call.p.geo;
    Ok(if tile_fits(call) && g.output[2] >= 7 {
        ChannelsLast::Tile(default_tile(g, vec))
    } else {
        match strip_stride(call) {
            Some(s) => ChannelsLast::Strip(s),
            None => ChannelsLast::Vec,
        }
    })
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let g = &call.p.geo;
    let y_ptr = call.y_ptr(y)?;
    let pointers = [call.ptrs.x, call.ptrs.w, y_ptr, call.ptrs.bias, call.ptrs.z];
    // (kernel, channel items, outputs per thread along the innermost dim, channels-last,
    // threads per block).
    let (kind, channels, per_thread, channels_last, threads) = match vector(call, y_ptr) {
        Some(vec) => match channels_last(call, vec)? {
            ChannelsLast::Tile(tile) => return launch_tile(call, tile, vec, &pointers),
            ChannelsLast::Strip(1) => ("strip3s1", g.k / vec, DW_STRIP, true, DW_STRIP_THREADS),
            ChannelsLast::Strip(_) => ("strip3s2", g.k / vec, DW_STRIP, true, DW_STRIP_THREADS),
            ChannelsLast::Vec => ("vec", g.k / vec, DW_PIXELS, true, DW_THREADS),
        },
        None => ("rows", g.k, DW_COLS, false, DW_THREADS),
    };
    let items = items(
        [
            g.n as usize,
            channels as usize,
            g.output[0] as usize,
            g.output[1] as usize,
            (g.output[2] as usize).div_ceil(per_thread as usize),
        ],
        channels_last,
    )?;
    let params = ConvDepthwiseParams {
        geo: *g,
        ops: call.ops(),
        items,
    };
    let name = format!("conv_fwd_depthwise_{kind}_{}", call.p.dtype.name());
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no depthwise convolution kernel `{name}`")))?;
    // A grid-stride grid of at most 8192 threads per SM (as `grid_stride_config`).
    let mut cfg = LaunchConfig::for_threads(params.items.len as u64, threads)?;
    cfg.grid = cfg.grid.min(call.gpu.sm_count.max(1) * (8192 / threads));
    // SAFETY: x, w, y, bias and z were checked to hold their descriptors' spans, which the
    // geometry describes; every span is below 2^31 elements (checked by the algorithm);
    // the kernels read x only at in-bounds input coordinates and store only y's elements;
    // bias and z are read only when the epilogue has them. The `vec` and `strip` kernels
    // run only under `vector`'s layout and alignment conditions, `strip` only under
    // `strip_stride`'s filter conditions.
    unsafe { call.gpu.launch(kernel, cfg, &params, &pointers) }
}

/// Launches `conv_fwd_depthwise_tile3_<dtype>` with block tile `tile` (`vec` elements per
/// channel vector).
fn launch_tile(call: &Call, tile: Tile, vec: u32, pointers: &[u64; 5]) -> Result<()> {
    let g = &call.p.geo;
    let Tile {
        channel_vectors,
        tile_w,
        tile_h,
    } = tile;
    let params = ConvDepthwiseTileParams {
        geo: *g,
        ops: call.ops(),
        channel_vectors,
        tile_w,
        tile_h,
        col_tiles: g.output[2].div_ceil(tile_w),
        row_tiles: g.output[1].div_ceil(tile_h),
        channel_tiles: g.k / vec / channel_vectors,
    };
    let threads = tile.threads();
    // The kernel stages each row with at most two 16-byte chunks per thread.
    if 2 * threads < (tile_w + 2) * channel_vectors {
        return Err(Error::unsupported(format!(
            "depthwise tile3 {channel_vectors}x{tile_w}x{tile_h}: {threads} threads cannot stage a row of {} chunks at two each",
            (tile_w + 2) * channel_vectors
        )));
    }
    let blocks = g.n as u64
        * g.output[0] as u64
        * params.channel_tiles as u64
        * params.row_tiles as u64
        * params.col_tiles as u64;
    if blocks > i32::MAX as u64 {
        return Err(Error::unsupported(format!(
            "the depthwise tile3 kernel needs {blocks} blocks (more than 2^31-1)"
        )));
    }
    let name = format!("conv_fwd_depthwise_tile3_{}", call.p.dtype.name());
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no depthwise convolution kernel `{name}`")))?;
    let cfg = LaunchConfig {
        grid: blocks as u32,
        grid_y: 1,
        block: threads,
        shared_bytes: dw_tile_shared_bytes(channel_vectors, tile_w),
    };
    // SAFETY: as `launch`'s: the spans were checked and are below 2^31 elements; the
    // kernel runs under `vector`'s layout and alignment conditions and `tile_fits`'s
    // filter, stride and dilation conditions; `channel_vectors` divides k's vectors, the
    // block has `dw_tile_threads` threads (at least half a staged row's chunks, checked
    // above) and the ring's `dw_tile_shared_bytes`; the grid is the params' tile count.
    // The kernel copies x only at in-bounds coordinates (zero-filling the rest) and stores
    // only y's elements of its tile that lie inside the output.
    unsafe { call.gpu.launch(kernel, cfg, &params, pointers) }
}
