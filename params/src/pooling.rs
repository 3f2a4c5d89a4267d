//! Parameters of the pooling kernels (`pooling_*`).
//!
//! Every pooling kernel sees a tensor as five logical dims `[n, c, d, h, w]`: 2-D pooling
//! has `d` of extent 1 (window 1, stride 1, no padding), 1-D pooling `d` and `h`. Strides are
//! in elements, one per logical dim (0 for the dims the tensor lacks); offsets are 32-bit
//! (the host checks that every tensor spans fewer than 2^32 elements).

use crate::FastDivisor;

/// Most dx elements one thread of a `pooling_bwd_cell_*` kernel owns.
pub const POOLING_MAX_CELL: usize = 8;

/// Consecutive cells along w one thread of a `pooling_bwd_cell_max_<W>x<W>s<S>p<P>_*`
/// kernel takes (its `items` count w in runs of these cells' `POOLING_REGION_CELLS * S`
/// columns, from column 0).
pub const POOLING_REGION_CELLS: usize = 2;

/// Elements each lane of a `pooling_fwd_global_*` kernel loads at once (the host sizes its
/// lane groups by them).
pub const POOLING_GLOBAL_LOADS: usize = 8;

/// Longest plane (in elements) `pooling_fwd_global_staged_f32` takes.
pub const POOLING_GLOBAL_STAGED_LEN: usize = 128;

/// Warps of a `pooling_fwd_global_staged_f32` block.
pub const POOLING_GLOBAL_STAGED_WARPS: usize = 4;

/// Bytes of shared memory one warp of `pooling_fwd_global_staged_f32` stages: its `32 /
/// group` planes of `len` elements of `size` bytes, copied from the 16-byte boundary at or
/// before their first byte (so up to 15 bytes more), in 16-byte chunks.
pub const fn pooling_global_stage_bytes(group: usize, len: usize, size: usize) -> usize {
    ((32 / group) * len * size + 16).next_multiple_of(16)
}

/// Elements one lane of `pooling_fwd_global_lane_{f16,bf16}` loads, as 8 16-byte vectors:
/// its plane, from the 16-byte boundary at or before the plane's first byte.
pub const POOLING_GLOBAL_LANE_ELEMENTS: usize = 64;

/// Whether a lane of `POOLING_GLOBAL_LANE_ELEMENTS` takes planes of `len` elements of `size`
/// bytes: a plane starting as late as it can in its first vector (`16 - size` bytes in)
/// still ends inside it (57 elements of a 16-bit type).
pub const fn pooling_global_lane_fits(len: usize, size: usize) -> bool {
    len >= 1 && 16 - size + len * size <= POOLING_GLOBAL_LANE_ELEMENTS * size
}

/// Channels one thread of a `pooling_bwd_cell_vec_*` kernel takes (its accumulators are a
/// cell's elements times these): 16 bytes of f32, 8 of the 16-bit types.
pub const POOLING_CELL_VECTOR: usize = 4;

/// Strips a thread of `pooling_fwd_strip*_*` takes a turn (both loaded before either is
/// reduced); the host sizes the grid so that each thread has that many.
pub const POOLING_STRIPS_PER_TURN: u64 = 2;

/// Output vectors a thread of `pooling_fwd_window_vec_<shape>_*` takes a turn (every
/// vector of their windows loaded before any is reduced); the host sizes the grid so that
/// each thread has that many.
pub const POOLING_WINDOWS_PER_TURN: u64 = 2;

/// What a window computes, numbered as the kernels expect.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolingKind {
    Max = 0,
    /// Sum over the window divided by the window's volume (padding counts as zeros).
    AvgIncludePadding = 1,
    /// Sum over the window's in-bounds elements divided by their count.
    AvgExcludePadding = 2,
}

impl PoolingKind {
    /// The kind a raw discriminant names; unknown values read as max.
    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            1 => Self::AvgIncludePadding,
            2 => Self::AvgExcludePadding,
            _ => Self::Max,
        }
    }
}

/// The pooling window and the blend, shared by every windowed kernel. Output position `o`
/// of spatial dim `k` covers inputs `o * stride[k] - pad[k] ..` (`window[k]` of them), of
/// which those in `0..input[k]` exist. Spatial arrays are ordered `[d, h, w]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolWindow {
    pub kind: u32,
    /// Max only: 1 if a NaN in the window makes the result NaN, 0 if NaNs are skipped.
    pub propagate_nan: u32,
    pub alpha: f32,
    pub beta: f32,
    pub input: [u32; 3],
    pub output: [u32; 3],
    pub window: [u32; 3],
    pub pad: [u32; 3],
    pub stride: [u32; 3],
    /// `1 / (window[0] * window[1] * window[2])`, rounded to f32.
    pub inv_volume: f32,
}

/// The work items of a launch: `len` items counted row-major over `[n, c, d, h, w]` when
/// `channels_last == 0` (consecutive items along `w`: coalesced for NCHW) or over
/// `[n, d, h, w, c]` otherwise (consecutive channels: coalesced for NHWC). `c`, `d`, `h`
/// and `w` divide by the extents of those dims (items may be cells or channel vectors).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolItems {
    pub len: u32,
    pub channels_last: u32,
    pub c: FastDivisor,
    pub d: FastDivisor,
    pub h: FastDivisor,
    pub w: FastDivisor,
}

/// One item's coordinates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCoord {
    pub n: u32,
    pub c: u32,
    /// `[d, h, w]`.
    pub s: [u32; 3],
}

impl PoolItems {
    /// The coordinates of item `i`.
    #[inline(always)]
    pub fn at(&self, i: u32) -> PoolCoord {
        if self.channels_last != 0 {
            let (q, c) = self.c.div_rem(i);
            let (q, w) = self.w.div_rem(q);
            let (q, h) = self.h.div_rem(q);
            let (n, d) = self.d.div_rem(q);
            PoolCoord { n, c, s: [d, h, w] }
        } else {
            self.at_channels_first(i)
        }
    }

    /// The coordinates of item `i` of items counted channels-first (`channels_last ==
    /// 0`), without the branch on the order: for kernels only ever launched so.
    #[inline(always)]
    pub fn at_channels_first(&self, i: u32) -> PoolCoord {
        let (q, w) = self.w.div_rem(i);
        let (q, h) = self.h.div_rem(q);
        let (q, d) = self.d.div_rem(q);
        let (n, c) = self.c.div_rem(q);
        PoolCoord { n, c, s: [d, h, w] }
    }
}

/// Parameters of `pooling_fwd_window_*` (one thread per output element) and
/// `pooling_fwd_window_vec_*` (one thread per 16-byte vector of channels of one output
/// position; `items.c` then counts vectors): `y = alpha * pool(x) + beta * y`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolingFwdParams {
    pub win: PoolWindow,
    /// Over y's dims.
    pub items: PoolItems,
    /// Strides over `[n, c, d, h, w]`.
    pub x: [u32; 5],
    pub y: [u32; 5],
}

/// Parameters of `pooling_fwd_global_*` and `pooling_fwd_global_vec_*`: windows cover the
/// whole spatial extent without padding, so each `(n, c)` reduces its `len` spatial
/// elements, which lie at `x_n * n + x_c * c + red_stride * r` (`r < len`).
///
/// `pooling_fwd_global_*`: `group` lanes per output (a power of two up to 32), or one
/// 256-thread block per output when `group > 32`; outputs counted `(n, c)`, `c` fastest.
///
/// `pooling_fwd_global_staged_f32`: planes stored back to back (`red_stride = 1`, `x_c =
/// len`, `x_n = c * len`) of at most `POOLING_GLOBAL_STAGED_LEN` elements, `group` lanes a
/// plane (a power of two up to 32); warp `w` of the launch takes outputs `w * 32 / group
/// ..` (then every `warps * 32 / group`-th), blocks of `POOLING_GLOBAL_STAGED_WARPS` warps
/// with [`pooling_global_stage_bytes`] of dynamic shared memory a warp.
///
/// `pooling_fwd_global_lane_{f16,bf16}`: planes stored back to back as for the staged
/// kernel, short enough for [`pooling_global_lane_fits`], a thread a plane (thread `t` of
/// the launch takes outputs `t`, `t + threads`, ..).
///
/// `pooling_fwd_global_vec_*` (channel-contiguous x): block `b` takes image
/// `b / tiles` and the `cols` channel vectors from `(b % tiles) * cols`; its threads form
/// `rows x cols` (thread `t` at row `t / cols`), each row reducing every `rows`-th spatial
/// element, and the rows are combined through shared memory in row order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolingGlobalParams {
    pub kind: u32,
    pub propagate_nan: u32,
    pub alpha: f32,
    pub beta: f32,
    /// `n * c` outputs.
    pub outputs: u32,
    pub len: u32,
    /// `1 / len`, rounded to f32.
    pub inv_len: f32,
    pub group: u32,
    /// Extent of c (global kernel) or of the channel vectors (vec kernel).
    pub c: FastDivisor,
    pub tiles: FastDivisor,
    pub cols: FastDivisor,
    pub rows: u32,
    pub red_stride: u32,
    pub x_n: u32,
    pub x_c: u32,
    pub y_n: u32,
    pub y_c: u32,
}

/// The tile of a `pooling_bwd_tile_max_*` block: the block takes image `n`, channel
/// vectors `vb * vectors ..` (at most `vectors`, of `channel_vectors`) and the cells
/// `t * cells ..` per spatial dim, where the block index counts `(n, vb, td, th, tw)`
/// row-major (`count` tiles per dim, `vector_blocks` channel-vector blocks). Its first
/// phase finds the winner of each of the `windows[k] = cells[k] + windows_per_cell[k] - 1`
/// windows per dim that overlap the tile (from window `t * cells - windows_per_cell + 1`),
/// its second gathers them into the `elements[k] = cells[k] * stride[k]` dx elements per
/// dim. Dynamic shared memory: `window_count * vectors * K` u32 winners (each the linear
/// spatial index of the window's element that takes its gradient, or `u32::MAX`), then as
/// many f32 gradients.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolTile {
    pub cells: [u32; 3],
    pub count: [FastDivisor; 3],
    pub windows: [FastDivisor; 3],
    pub elements: [FastDivisor; 3],
    pub vectors: FastDivisor,
    pub vector_blocks: FastDivisor,
    pub channel_vectors: u32,
    pub window_count: u32,
    pub element_count: u32,
}

impl PoolTile {
    /// Bytes of dynamic shared memory a block needs, for `k` channels per vector.
    pub const fn shared_bytes(&self, k: u32) -> u32 {
        self.window_count * self.vectors.divisor * k * 8
    }
}

/// dx columns (and windows) one thread of a `pooling_bwd_band_max_<W>x<W>s1p<P>_*` kernel
/// takes.
pub const POOLING_BAND_RUN: usize = 4;

/// The band of a `pooling_bwd_band_max*` block: the max backward of 2-D windows (the
/// depth window 1 at stride 1, unpadded) over single channels. Block `b` takes the plane
/// `items.at(b) = (n, c, [d, band, 0])` (`items` counts `[n, c, d, bands, 1]`) and its dx
/// rows from `band * rows` (at most `rows` of them). It stages in dynamic shared memory,
/// as f32: the x rows covered by the windows over its dx rows (at most `x_rows` rows,
/// `x_pitch` words apart), then those windows' y and dy (at most `window_rows` rows each,
/// `window_pitch` words apart). Both pitches are multiples of 4 words at least
/// `input[2]` (and `output[2]`), so each row's runs of `POOLING_BAND_RUN` columns from a
/// multiple of it are 16-byte aligned. Each window's y word then holds its winner.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolBand {
    pub rows: u32,
    pub x_rows: u32,
    pub window_rows: u32,
    pub x_pitch: u32,
    pub window_pitch: u32,
    /// Divides by `win.output[2]`.
    pub output_w: FastDivisor,
    /// Divide by the runs of `POOLING_BAND_RUN` windows in a row of y, and of dx elements
    /// in a row of dx.
    pub window_runs: FastDivisor,
    pub dx_runs: FastDivisor,
}

impl PoolBand {
    /// Bytes of dynamic shared memory a block needs.
    pub const fn shared_bytes(&self) -> u32 {
        4 * (self.x_rows * self.x_pitch + 2 * self.window_rows * self.window_pitch)
    }
}

/// Columns of x and dx each lane of a `pooling_bwd_walk_max_*` kernel owns, for elements
/// of `size` bytes: one 16-byte vector (4 f32, 8 of a 16-bit type).
pub const fn pooling_walk_columns(size: usize) -> usize {
    16 / size
}

/// Channels each thread of a `pooling_bwd_walk_vec_max_*` kernel takes, for elements of
/// `size` bytes: 8 bytes (2 f32, 4 of a 16-bit type), so that two blocks fit an SM's
/// registers (with 16 bytes, one: the stem's f16 backward took 57.1 against 56.0 µs on
/// an H100).
pub const fn pooling_walk_vec_channels(size: usize) -> usize {
    8 / size
}

/// The walk of a `pooling_bwd_walk_max_*` kernel: the max backward of 2-D windows over
/// single channels whose rows fit one warp's lanes. A group of `lanes` consecutive lanes (a
/// power of two up to 32) takes, in thread order, the band `items.at(group) = (n, c, [d,
/// band, 0])` (`items` counts `[n, c, d, bands, 1]`): the windows of rows `band *
/// window_rows ..` (at most `window_rows` of them) of one plane, lane `l` those over its
/// columns `l * pooling_walk_columns(size) ..`. Every group of a launch walks `steps` rows
/// of windows (the band's, the ones before it whose rows it shares, and one after), so
/// that a warp's lanes stay converged.
///
/// The walk of a `pooling_bwd_walk_vec_max_*` kernel, over channel vectors: one thread a
/// group (`lanes` 1, unused), `items.at(thread) = (n, v, [d, band, cell])` (`items` counts
/// `[n, c / pooling_walk_vec_channels(size), d, bands, cells]`, channels last), the windows
/// of the same rows over the `stride` columns of x from the start of window `cell` along
/// w, `pooling_walk_vec_channels(size)` channels from `v` times as many.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolWalk {
    pub lanes: u32,
    pub window_rows: u32,
    pub steps: u32,
}

/// Parameters of the backward kernels: `dx = alpha * grad + beta * dx`, where `grad` of an
/// element sums, over the windows that contain it, `dy / count` (average; count = volume
/// when padding is included, else the window's in-bounds elements) or `dy` where the
/// element is the window's first element in scan order (d, then h, then w) equal to the
/// window's `y` (max; NaN equals NaN).
///
/// `pooling_bwd_gather_*` (and `_vec_`): one thread per dx element (or channel vector),
/// gathering over the windows that contain it; `items` over dx's dims.
///
/// `pooling_bwd_global_avg_*` (and `_vec_`): the average of a global window, one thread per
/// dx element (or channel vector); `items` over dx's dims. `pooling_bwd_global_avg_flat_*`:
/// dx's planes back to back (NCHW), one thread per 16-byte vector of its `items.len`
/// elements, `plane_len` their planes' length.
///
/// `pooling_bwd_tile_max_*` (and `_vec_`): a block per tile of cells (see [`PoolTile`]),
/// windows through shared memory.
///
/// `pooling_bwd_band_max_*` (and `_<W>x<W>s1p<P>_`): a block per band of rows of one plane
/// (see [`PoolBand`]), x and the windows through shared memory.
///
/// `pooling_bwd_walk_max_<W>x<W>s<S>p<P>_*`: a group of lanes per band of rows of windows
/// of one plane (see [`PoolWalk`]). `pooling_bwd_walk_vec_max_<W>x<W>s<S>_*`: one thread per
/// band, column of cells and channel vector (see [`PoolWalk`]).
///
/// `pooling_bwd_cell_*` (and `_vec_`): one thread per *cell*: the `stride[0] x stride[1] x
/// stride[2]` block of dx elements from `cell * stride - pad` (cells tile the input
/// aligned to the window starts; `cell_len <= POOLING_MAX_CELL`). It visits each of the at
/// most `windows_per_cell` windows per dim that overlap the cell once; `items` count cells.
/// Element `j` of a cell is at offset `cell_slots[j]` = `d | h << 8 | w << 16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolingBwdParams {
    pub win: PoolWindow,
    pub items: PoolItems,
    /// Divides by `win.stride`.
    pub stride_div: [FastDivisor; 3],
    /// Divide by `win.input[1]` and `win.input[2]` (h and w: linear spatial indices to
    /// coordinates).
    pub input_hw: [FastDivisor; 2],
    pub windows_per_cell: [u32; 3],
    pub cell_len: u32,
    pub cell_slots: [u32; POOLING_MAX_CELL],
    pub tile: PoolTile,
    pub band: PoolBand,
    pub walk: PoolWalk,
    /// Divides by a plane's spatial volume: `pooling_bwd_global_avg_flat_*` counts dx's
    /// elements (its planes back to back) and finds each one's plane with it.
    pub plane_len: FastDivisor,
    /// Strides over `[n, c, d, h, w]`.
    pub x: [u32; 5],
    pub y: [u32; 5],
    pub dy: [u32; 5],
    pub dx: [u32; 5],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_kernel_takes_planes_that_end_inside_its_window_from_any_start() {
        // A 16-bit plane may start 7 elements into its first vector; 7 + 57 = 64.
        assert!(pooling_global_lane_fits(1, 2));
        assert!(pooling_global_lane_fits(49, 2));
        assert!(pooling_global_lane_fits(57, 2));
        assert!(!pooling_global_lane_fits(58, 2));
        assert!(!pooling_global_lane_fits(0, 2));
    }
}
