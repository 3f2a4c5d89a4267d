//! Implicit-GEMM convolution forward on tensor cores: per group, `y[pixel, k] =
//! sum_kk A[pixel, kk] * B[k, kk]` on the tiled-MMA core ([`mma_tile`]; on sm_90a
//! [`wgmma_tile`]), the operand tiles gathered straight from x and the filter by `cp.async`
//! ([`ConvGemmParams`] says how the GEMM's K runs over the filter taps and channels).
//!
//! * [`Im2colTile`] (A): rows are output pixels. Each thread's rows are decoded once per
//!   block into [`PixelWindow`]s (where each pixel's input window starts); a K tile is one
//!   stored filter tap and a block of channels ([`KTile`], the same for the whole block),
//!   so a 16-byte chunk is 8 (tf32: 4) consecutive channels of one input pixel, copied
//!   whole or zero-filled (padding, rows past the output, channels past the group's).
//! * [`FilterTile`] (B): rows are the group's output channels, the filter read at the
//!   stored tap (channel-contiguous filters: chunks of consecutive channels).
//! * [`ConvGemmEpilogue`]: output `(pixel, k)` to y's (and z's) strides, through
//!   [`epilogue::apply`]; two channels per store where y's channels are contiguous.
//!
//! The gather variant, for problems the 16-byte copies cannot take (x not
//! channel-contiguous, e.g. NCHW; channels per group not a whole chunk, e.g. an RGB first
//! layer; misaligned strides), flattens the GEMM's K over (tap, channel) instead: `kk = tap
//! * c_per_group + c`, `K = taps * c_per_group` (no padding per tap, so three channels
//! waste nothing). [`FlatTap`] splits one `kk`; [`GatherIm2colTile`] (A) and
//! [`GatherFilterTile`] (B) load element by element (synchronous loads, then one
//! `st.shared` per chunk into the same swizzled layout), zeros outside.
//!
//! The packed variant ([`Packed`]), for problems whose channels per group the host pads
//! to a whole 16- or 8-byte unit in the workspace (an RGB first layer: 3 channels staged
//! as 8 or 4), flattens K by units (`unit = tap * units_per_tap + c / unit`), so one K
//! tile packs several taps: [`Im2colTile`] issues one `cp.async` per unit (two 8-byte
//! ones per chunk for 4-channel f16 units), [`FilterTile`] reads the staged filter as
//! dense rows.
//!
//! Entry points, all `(params, x, w, y, bias, z)`:
//! * `conv_fwd_igemm_tc_<BMxBN>_<f16|bf16|tf32>` ([`mma_tile`], `mma.sync`);
//! * `conv_fwd_igemm_tc_gather_<BMxBN>_<f16|bf16|tf32>` (the same, gathering loaders);
//! * `conv_fwd_igemm_tc_packed<16|8>_<BMxBN>_<f16|bf16|tf32>` (the same, packed loaders);
//! * `wgmma_conv_fwd_igemm[_packed<16|8>]_128x<BN>_<f16|bf16>` (the `sm90a` build, family
//!   `wgmma`); the same GEMM with both operands copied by TMA is
//!   [`super::implicit_gemm_tma`].
//!
//! [`PixelWindow`] and [`KTile`] are the reusable im2col address logic (a CUDA-core
//! gather can walk the same windows).

use crate::device::{
    block_idx_x, block_idx_y, cp_async_16, cp_async_ca, dynamic_smem, st_shared_v4, thread_idx_x,
};
use crate::element::{Bf16, Element, F16};
use crate::epilogue;
use crate::gemm::{Epilogue, MmaElement, SmemLayout, TileLoader};
use crate::unrolled;
use core::marker::PhantomData;
use oxidnn_params::{tile_coords, ConvGemmParams, ConvGeometry, PixelIndex};

#[cfg(not(feature = "sm90a"))]
use crate::gemm::{mma_stage_bytes, mma_tile, MmaShape, RowSwizzled, Tf32};
#[cfg(not(feature = "sm90a"))]
use crate::matmul::MmaTileShape;
#[cfg(not(feature = "sm90a"))]
use oxidnn_params::{mma_shared_bytes, mma_stages, mma_threads, MMA_BK_BYTES};

#[cfg(feature = "sm90a")]
use crate::gemm::{
    hopper::{wgmma_tile, WgmmaElement},
    mma_stage_bytes, Sw128Atoms,
};
#[cfg(feature = "sm90a")]
use oxidnn_params::{
    conv_wgmma_shared_bytes, conv_wgmma_stages, MMA_BK_BYTES, WGMMA_BM, WGMMA_THREADS,
};

/// The window origin of a row that lies past the output: no tap brings it inside.
const OUTSIDE: u32 = 0x8000_0000;

/// What K tile `kt` covers: one stored filter tap and a block of the group's channels.
#[derive(Clone, Copy)]
pub struct KTile {
    /// The tap `[t, r, s]` as the filter stores it.
    pub tap: [u32; 3],
    /// The tile's first channel within the group.
    pub c0: u32,
}

impl KTile {
    /// K tile `kt` of a kernel whose tiles hold `bk` channels.
    #[inline(always)]
    pub fn of(p: &ConvGemmParams, kt: u32, bk: u32) -> Self {
        let (tap, block) = p.c_tiles.div_rem(kt);
        let (tr, s) = p.filter_s.div_rem(tap);
        let (t, r) = p.filter_r.div_rem(tr);
        Self {
            tap: [t, r, s],
            c0: block * bk,
        }
    }

    /// How far (in input coordinates) the tap reaches from a window's origin per spatial
    /// dim: the stored tap, reversed in convolution mode, times the dilation.
    #[inline(always)]
    pub fn reach(&self, g: &ConvGeometry) -> [u32; 3] {
        core::array::from_fn(|j| g.filter_at(j, self.tap[j]) * g.dilation[j])
    }
}

/// Where one output pixel's input window starts: `o * stride - pad` per spatial dim and
/// the element offset of x at that corner of image `n` (both wrapping: the corner may lie
/// in the padding). Decoded once per pixel; each tap then costs three compares.
#[derive(Clone, Copy)]
pub struct PixelWindow {
    origin: [u32; 3],
    offset: u32,
}

impl PixelWindow {
    /// A window that every tap finds outside the input (a row past the output).
    pub const OUTSIDE: Self = Self {
        origin: [0, 0, OUTSIDE],
        offset: 0,
    };

    /// The window of output pixel `row` ([`PixelIndex`] order); rows at or past `m` get a
    /// window that every tap finds outside the input.
    #[inline(always)]
    pub fn new(g: &ConvGeometry, pixels: &PixelIndex, m: u32, row: u32) -> Self {
        if row >= m {
            return Self::OUTSIDE;
        }
        let (n, o) = pixels.at(row);
        let origin: [u32; 3] =
            core::array::from_fn(|j| (o[j] * g.stride[j]).wrapping_sub(g.pad[j]));
        let mut offset = n * g.x[0];
        unrolled!(j in 3 => offset = offset.wrapping_add(origin[j].wrapping_mul(g.x[2 + j])));
        Self { origin, offset }
    }

    /// The element offset in x of the input pixel a tap reaching `reach` ([`KTile::reach`])
    /// reads, plus `extra` (the tap's offset `sum reach[j] * x[2 + j]` and the channel), or
    /// `None` where that pixel lies in the padding. Every input coordinate is below 2^31,
    /// so a wrapped (negative) coordinate compares as outside.
    #[inline(always)]
    pub fn at(&self, g: &ConvGeometry, reach: [u32; 3], extra: u32) -> Option<u32> {
        let mut inside = true;
        unrolled!(j in 3 => inside &= self.origin[j].wrapping_add(reach[j]) < g.input[j]);
        inside.then(|| self.offset.wrapping_add(extra))
    }
}

/// A loader of one GEMM operand of a convolution, made once per block.
pub trait ConvTileLoader<'a>: TileLoader {
    /// The loader of the tile whose first row (pixel for A, the group's output channel
    /// for B) is `first`, in group `group`; `base` is x (A) or the filter (B).
    ///
    /// # Safety
    /// `base` points at the tensor `p` describes.
    unsafe fn new(p: &'a ConvGemmParams, base: *const u8, group: u32, first: u32) -> Self;
}

/// Rows `tid / row_chunks + i * (THREADS / row_chunks)` and chunk `tid % row_chunks` are
/// slot `i`'s of thread `tid` in a K-major tile of `row_chunks`-chunk rows.
#[inline(always)]
fn slot_row(i: u32, row_chunks: u32, threads: u32) -> (u32, u32) {
    let tid = thread_idx_x();
    (
        tid / row_chunks + i * (threads / row_chunks),
        tid % row_chunks,
    )
}

/// The im2col A operand: a `ROWS x BK` K-major tile of output pixels by (tap, channels),
/// `SLOTS` chunks per thread, in layout `L`.
/// How a convolution loader fills its chunks: whole 16-byte `cp.async` copies (operands
/// channel-contiguous, aligned, channels in whole chunks; K tiles of one tap each).
pub struct Copied;
/// ... or element by element over the flattened K (any layout and channel count).
pub struct Gathered;
/// ... or by `UNIT`-byte `cp.async` copies (16 or 8) over K flattened by units: `unit =
/// tap * units_per_tap + channel / (UNIT / size)` (`ConvGemmParams::c_tiles` is the units
/// per tap), so a 64-wide K tile packs several taps of a problem with few channels (8
/// taps of 8 f16 channels, 16 of 4) instead of padding each tap to a whole tile. A takes x
/// channels-last with every pixel's group a whole number of units (the channel-padded
/// copy the host stages, `src/ops/convolution/channel_padding.rs`); B takes the filter as
/// dense rows of the flattened K (`w[0]` elements each, zeros past `taps * c_per_group` up
/// to the last K tile).
pub struct Packed<const UNIT: u32>;

/// Where the `cp.async` im2col loader's copies of a K tile come from: `(tap, channel)` of
/// each of a chunk's `16 / UNIT` units.
pub trait ChunkMap {
    /// Bytes per `cp.async` (16: one per chunk; 8: two per chunk).
    const UNIT: u32;

    /// Unit `h` of chunk `chunk` (a column of the `BK`-wide K-major tile) of K tile `kt`:
    /// the stored tap and the channel within the group it starts at, and whether it lies
    /// inside the GEMM's K (else it is zero-filled; the tap is then a valid one, `[0, 0,
    /// 0]` where none is).
    fn unit<E: MmaElement, const BK: u32>(
        p: &ConvGemmParams,
        kt: u32,
        chunk: u32,
        h: u32,
    ) -> (KTile, bool);
}

impl ChunkMap for Copied {
    const UNIT: u32 = 16;

    /// K tile `kt` is one tap and `BK` channels ([`KTile::of`]); chunks past the group's
    /// channels are outside.
    #[inline(always)]
    fn unit<E: MmaElement, const BK: u32>(
        p: &ConvGemmParams,
        kt: u32,
        chunk: u32,
        _h: u32,
    ) -> (KTile, bool) {
        let tile = KTile::of(p, kt, BK);
        let c = tile.c0 + chunk * E::PER_CHUNK;
        (
            KTile {
                tap: tile.tap,
                c0: c,
            },
            c < p.geo.c_per_group,
        )
    }
}

impl<const UNIT: u32> ChunkMap for Packed<UNIT> {
    const UNIT: u32 = UNIT;

    /// Unit `(kt * chunks + chunk) * units_per_chunk + h` of the flattened K; units past
    /// the last tap are outside.
    #[inline(always)]
    fn unit<E: MmaElement, const BK: u32>(
        p: &ConvGemmParams,
        kt: u32,
        chunk: u32,
        h: u32,
    ) -> (KTile, bool) {
        let per_unit = UNIT / E::BYTES;
        let unit = (kt * (BK / E::PER_CHUNK) + chunk) * (16 / UNIT) + h;
        let tile = KTile::of(p, unit, per_unit);
        let inside = tile.tap[0] < p.geo.filter[0] && tile.c0 < p.geo.c_per_group;
        let tap = if inside { tile.tap } else { [0; 3] };
        (KTile { tap, c0: tile.c0 }, inside)
    }
}

/// One `cp.async` of `unit` bytes (16 or 8, a constant after inlining) to shared `dst`:
/// `src_bytes` (0 or `unit`) from `src`, zeros for the rest.
///
/// # Safety
/// As [`cp_async_16`] / [`cp_async_ca`] for that size.
#[inline(always)]
unsafe fn cp_async_unit(unit: u32, dst: u32, src: *const u8, src_bytes: u32) {
    if unit == 16 {
        cp_async_16(dst, src, src_bytes)
    } else {
        cp_async_ca::<8>(dst, src, src_bytes)
    }
}

pub struct Im2colTile<
    'a,
    E,
    const ROWS: u32,
    const BK: u32,
    const THREADS: u32,
    const SLOTS: usize,
    L,
    M = Copied,
> {
    p: &'a ConvGemmParams,
    /// x at the group's first channel.
    x: *const u8,
    windows: [PixelWindow; SLOTS],
    _e: PhantomData<(E, L, M)>,
}

impl<
        'a,
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
        M,
    > ConvTileLoader<'a> for Im2colTile<'a, E, ROWS, BK, THREADS, SLOTS, L, M>
where
    Self: TileLoader,
{
    #[inline(always)]
    unsafe fn new(p: &'a ConvGemmParams, x: *const u8, group: u32, first: u32) -> Self {
        let g = &p.geo;
        // Unrolled (not `array::from_fn`, which LLVM may leave a loop over a stack array
        // for 8 slots): the windows stay in registers.
        let mut windows = [PixelWindow::OUTSIDE; SLOTS];
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, BK / E::PER_CHUNK, THREADS);
            windows[i] = PixelWindow::new(g, &p.pixels, p.m, first + r);
        });
        let c0 = group as u64 * g.c_per_group as u64 * g.x[1] as u64;
        Self {
            p,
            x: x.add((c0 * E::BYTES as u64) as usize),
            windows,
            _e: PhantomData,
        }
    }
}

impl<
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
        M: ChunkMap,
    > TileLoader for Im2colTile<'_, E, ROWS, BK, THREADS, SLOTS, L, M>
{
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let g = &self.p.geo;
        let row_chunks = BK / E::PER_CHUNK;
        let (_, chunk) = slot_row(0, row_chunks, THREADS);
        // Each unit's tap is the same for all of this thread's rows (one column of the
        // tile); the group's channels come in whole units (`c_per_group` a multiple of
        // `UNIT / size`).
        unrolled!(h in 2 => if (h as u32) < 16 / M::UNIT {
            let (tile, inside) = M::unit::<E, BK>(self.p, kt, chunk, h as u32);
            let reach = tile.reach(g);
            let mut extra = tile.c0;
            unrolled!(j in 3 => extra = extra.wrapping_add(reach[j] * g.x[2 + j]));
            unrolled!(i in SLOTS => {
                let (r, _) = slot_row(i as u32, row_chunks, THREADS);
                let (src, bytes) = match self.windows[i].at(g, reach, extra) {
                    Some(e) if inside => (self.x.add((e * E::BYTES) as usize), M::UNIT),
                    _ => (self.x, 0),
                };
                let to = dst + L::offset(r, chunk, ROWS, row_chunks) + h as u32 * M::UNIT;
                cp_async_unit(M::UNIT, to, src, bytes);
            });
        });
    }
}

/// The filter as the B operand: a `ROWS x BK` K-major tile of the group's output channels
/// by (stored tap, channels), `SLOTS` chunks per thread, in layout `L`.
pub struct FilterTile<
    'a,
    E,
    const ROWS: u32,
    const BK: u32,
    const THREADS: u32,
    const SLOTS: usize,
    L,
    M = Copied,
> {
    p: &'a ConvGemmParams,
    /// The filter at the tile's first output channel.
    w: *const u8,
    /// Each slot's row offset (elements), or `OUTSIDE` past the group's channels.
    rows: [u32; SLOTS],
    _e: PhantomData<(E, L, M)>,
}

impl<
        'a,
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
        M,
    > ConvTileLoader<'a> for FilterTile<'a, E, ROWS, BK, THREADS, SLOTS, L, M>
where
    Self: TileLoader,
{
    #[inline(always)]
    unsafe fn new(p: &'a ConvGemmParams, w: *const u8, group: u32, first: u32) -> Self {
        let g = &p.geo;
        let mut rows = [OUTSIDE; SLOTS];
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, BK / E::PER_CHUNK, THREADS);
            if first + r < g.k_per_group {
                rows[i] = r * g.w[0];
            }
        });
        let k0 = group * g.k_per_group + first;
        Self {
            p,
            w: w.add((k0 as u64 * g.w[0] as u64 * E::BYTES as u64) as usize),
            rows,
            _e: PhantomData,
        }
    }
}

impl<
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
    > TileLoader for FilterTile<'_, E, ROWS, BK, THREADS, SLOTS, L, Copied>
{
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let g = &self.p.geo;
        let row_chunks = BK / E::PER_CHUNK;
        let tile = KTile::of(self.p, kt, BK);
        let (_, chunk) = slot_row(0, row_chunks, THREADS);
        let c = tile.c0 + chunk * E::PER_CHUNK;
        let c_inside = c < g.c_per_group;
        let mut extra = c;
        unrolled!(j in 3 => extra += tile.tap[j] * g.w[2 + j]);
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, row_chunks, THREADS);
            let row = self.rows[i];
            let (src, bytes) = if c_inside && row != OUTSIDE {
                (self.w.add(((row + extra) * E::BYTES) as usize), 16)
            } else {
                (self.w, 0)
            };
            cp_async_16(dst + L::offset(r, chunk, ROWS, row_chunks), src, bytes);
        });
    }
}

impl<
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
        const UNIT: u32,
    > TileLoader for FilterTile<'_, E, ROWS, BK, THREADS, SLOTS, L, Packed<UNIT>>
{
    const K_MAJOR: bool = true;

    /// The filter as dense rows of the flattened K, each holding every K tile whole: a
    /// chunk is 16 consecutive bytes of a row.
    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let row_chunks = BK / E::PER_CHUNK;
        let (_, chunk) = slot_row(0, row_chunks, THREADS);
        let extra = (kt * row_chunks + chunk) * E::PER_CHUNK;
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, row_chunks, THREADS);
            let row = self.rows[i];
            let (src, bytes) = if row != OUTSIDE {
                (self.w.add(((row + extra) * E::BYTES) as usize), 16)
            } else {
                (self.w, 0)
            };
            cp_async_16(dst + L::offset(r, chunk, ROWS, row_chunks), src, bytes);
        });
    }
}

/// One element of the flattened GEMM K of the gather kernels: `kk = tap * c_per_group + c`
/// with the tap `[t, r, s]` as the filter stores it.
#[derive(Clone, Copy)]
pub struct FlatTap {
    /// The tap `[t, r, s]` as the filter stores it.
    pub tap: [u32; 3],
    /// The channel within the group.
    pub c: u32,
}

impl FlatTap {
    /// Element `kk` of the flattened K, or `None` at or past `taps * c_per_group` (one fast
    /// division by the channels, two by the filter's `s` and `r`).
    #[inline(always)]
    pub fn of(p: &ConvGemmParams, kk: u32) -> Option<Self> {
        let (tap, c) = p.channels.div_rem(kk);
        let (tr, s) = p.filter_s.div_rem(tap);
        let (t, r) = p.filter_r.div_rem(tr);
        (t < p.geo.filter[0]).then_some(Self { tap: [t, r, s], c })
    }
}

/// Most elements in a chunk (16-bit types).
const MAX_PER_CHUNK: usize = 8;

/// The bits of one element at `ptr`, in the low bits of a word.
///
/// # Safety
/// `ptr` points at an element of type `E` (aligned for it).
#[inline(always)]
pub(crate) unsafe fn load_element<E: MmaElement>(ptr: *const u8) -> u32 {
    if E::BYTES == 2 {
        *(ptr as *const u16) as u32
    } else {
        *(ptr as *const u32)
    }
}

/// Puts element `e`'s bits `v` into a chunk's words.
#[inline(always)]
pub(crate) fn pack<E: MmaElement>(words: &mut [u32; 4], e: u32, v: u32) {
    if E::BYTES == 2 {
        words[(e / 2) as usize] |= v << (16 * (e % 2));
    } else {
        words[e as usize] = v;
    }
}

/// Element `e` of this thread's chunk (column `chunk` of a `BK` tile) of flattened K tile
/// `kt`, or `None` past K.
#[inline(always)]
fn flat_element<E: MmaElement, const BK: u32>(
    p: &ConvGemmParams,
    kt: u32,
    chunk: u32,
    e: u32,
) -> Option<FlatTap> {
    FlatTap::of(p, kt * BK + chunk * E::PER_CHUNK + e)
}

/// The im2col A operand over the flattened K, gathered element by element: a `ROWS x BK`
/// K-major tile, `SLOTS` chunks per thread, in layout `L`. Any x layout and channel count.
pub type GatherIm2colTile<
    'a,
    E,
    const ROWS: u32,
    const BK: u32,
    const THREADS: u32,
    const SLOTS: usize,
    L,
> = Im2colTile<'a, E, ROWS, BK, THREADS, SLOTS, L, Gathered>;

impl<
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
    > TileLoader for Im2colTile<'_, E, ROWS, BK, THREADS, SLOTS, L, Gathered>
{
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let g = &self.p.geo;
        let row_chunks = BK / E::PER_CHUNK;
        let (_, chunk) = slot_row(0, row_chunks, THREADS);
        // Element by element (one split of `kk` each, shared by the thread's rows, only
        // one element's taps live at a time), every load before the stores: the loads'
        // latencies overlap.
        let mut words = [[0u32; 4]; SLOTS];
        unrolled!(e in MAX_PER_CHUNK => if (e as u32) < E::PER_CHUNK {
            if let Some(f) = flat_element::<E, BK>(self.p, kt, chunk, e as u32) {
                let reach = KTile { tap: f.tap, c0: 0 }.reach(g);
                let mut extra = f.c * g.x[1];
                unrolled!(j in 3 => extra = extra.wrapping_add(reach[j] * g.x[2 + j]));
                unrolled!(i in SLOTS => {
                    if let Some(at) = self.windows[i].at(g, reach, extra) {
                        // SAFETY: `at` is an element inside x (the window's pixel is
                        // inside the input and `c` inside the group), which the caller's
                        // contract says `x` covers.
                        let v = load_element::<E>(self.x.add(at as usize * E::BYTES as usize));
                        pack::<E>(&mut words[i], e as u32, v);
                    }
                });
            }
        });
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, row_chunks, THREADS);
            st_shared_v4(dst + L::offset(r, chunk, ROWS, row_chunks), words[i]);
        });
    }
}

/// The filter as the B operand over the flattened K, gathered element by element: a
/// `ROWS x BK` K-major tile of the group's output channels, `SLOTS` chunks per thread, in
/// layout `L`. Any filter layout.
pub type GatherFilterTile<
    'a,
    E,
    const ROWS: u32,
    const BK: u32,
    const THREADS: u32,
    const SLOTS: usize,
    L,
> = FilterTile<'a, E, ROWS, BK, THREADS, SLOTS, L, Gathered>;

impl<
        E: MmaElement,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
    > TileLoader for FilterTile<'_, E, ROWS, BK, THREADS, SLOTS, L, Gathered>
{
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let g = &self.p.geo;
        let row_chunks = BK / E::PER_CHUNK;
        let (_, chunk) = slot_row(0, row_chunks, THREADS);
        let mut words = [[0u32; 4]; SLOTS];
        unrolled!(e in MAX_PER_CHUNK => if (e as u32) < E::PER_CHUNK {
            if let Some(f) = flat_element::<E, BK>(self.p, kt, chunk, e as u32) {
                let mut extra = f.c * g.w[1];
                unrolled!(j in 3 => extra += f.tap[j] * g.w[2 + j]);
                unrolled!(i in SLOTS => {
                    let row = self.rows[i];
                    if row != OUTSIDE {
                        // SAFETY: the row is one of the group's output channels and
                        // (tap, c) inside the filter, so the element lies in the filter
                        // `w` covers.
                        let v = load_element::<E>(
                            self.w.add((row + extra) as usize * E::BYTES as usize),
                        );
                        pack::<E>(&mut words[i], e as u32, v);
                    }
                });
            }
        });
        unrolled!(i in SLOTS => {
            let (r, _) = slot_row(i as u32, row_chunks, THREADS);
            st_shared_v4(dst + L::offset(r, chunk, ROWS, row_chunks), words[i]);
        });
    }
}

/// The convolution's epilogue for one group: GEMM `(row, col)` is output pixel `row`,
/// channel `k0 + col`.
pub struct ConvGemmEpilogue<'a, T> {
    p: &'a ConvGemmParams,
    y: *mut T,
    bias: *const T,
    z: *const T,
    k0: u32,
}

impl<T: Element> Epilogue for ConvGemmEpilogue<'_, T> {
    #[inline(always)]
    fn extent(&self) -> (u32, u32) {
        (self.p.m, self.p.geo.k_per_group)
    }

    #[inline(always)]
    unsafe fn store_pair(&self, r: u32, c: u32, v: [f32; 2]) {
        let (p, g) = (self.p, &self.p.geo);
        if r >= p.m || c >= g.k_per_group {
            return;
        }
        let (n, o) = p.pixels.at(r);
        let k = self.k0 + c;
        let at = |s: &[u32; 5]| n * s[0] + k * s[1] + o[0] * s[2] + o[1] * s[3] + o[2] * s[4];
        let yp = self.y.add(at(&g.y) as usize);
        let both = c + 1 < g.k_per_group;
        // A pair of contiguous channels goes as one access where it is aligned for it.
        let paired = both && g.y[1] == 1 && (yp as usize) % (2 * core::mem::size_of::<T>()) == 0;
        let count = if both { 2 } else { 1 };
        let x = epilogue::apply(
            &p.ops,
            v,
            T::LOW_PRECISION,
            || {
                if paired {
                    T::load_pair(yp)
                } else {
                    let second = if both {
                        T::load(yp.add(g.y[1] as usize))
                    } else {
                        0.0
                    };
                    [T::load(yp), second]
                }
            },
            |_| {
                let mut b = [0.0; 2];
                unrolled!(j in 2 => if j < count {
                    b[j] = T::load(self.bias.add((k + j as u32) as usize));
                });
                b
            },
            || {
                let zp = self.z.add(at(&g.z) as usize);
                let mut zv = [0.0; 2];
                unrolled!(j in 2 => if j < count {
                    zv[j] = T::load(zp.add(j * g.z[1] as usize));
                });
                zv
            },
        );
        if paired {
            T::store_pair(yp, x);
        } else {
            T::store(yp, x[0]);
            if both {
                T::store(yp.add(g.y[1] as usize), x[1]);
            }
        }
    }
}

impl<'a, T> ConvGemmEpilogue<'a, T> {
    /// The epilogue of group `group` (output channels from `group * k_per_group`).
    #[inline(always)]
    pub fn of_group(
        p: &'a ConvGemmParams,
        (y, bias, z): (*mut T, *const T, *const T),
        group: u32,
    ) -> Self {
        Self {
            p,
            y,
            bias,
            z,
            k0: group * p.geo.k_per_group,
        }
    }
}

/// Sets up this block's tile (grid `x`: tile, grid `y`: group) and runs `core` on it.
#[inline(always)]
unsafe fn for_block<'a, T: Element, LA, LB>(
    p: &'a ConvGemmParams,
    (bm, bn): (u32, u32),
    (x, w, y, bias, z): (*const T, *const T, *mut T, *const T, *const T),
    core: impl FnOnce(&LA, &LB, &ConvGemmEpilogue<'a, T>, u32, u32),
) where
    LA: ConvTileLoader<'a>,
    LB: ConvTileLoader<'a>,
{
    let (tm, tn) = tile_coords(block_idx_x(), p.tiles_m, p.tiles_n);
    let group = block_idx_y();
    let (row0, col0) = (tm * bm, tn * bn);
    let la = LA::new(p, x as *const u8, group, row0);
    let lb = LB::new(p, w as *const u8, group, col0);
    let ep = ConvGemmEpilogue::of_group(p, (y, bias, z), group);
    core(&la, &lb, &ep, row0, col0);
}

/// Chunks each of `threads` threads copies per `rows x bk` tile.
const fn slots(rows: u32, bk: u32, per_chunk: u32, threads: u32) -> usize {
    (rows * bk / per_chunk / threads) as usize
}

/// Stamps out `conv_fwd_<kind>_<BMxBN>_<dt>`: `(kind, loader mode; dt, storage type,
/// MmaElement, BM, BN, BK, WARPS_M, WARPS_N, STAGES, MI, NI)`; the mode ([`Copied`],
/// [`Gathered`], [`Packed`]) picks [`Im2colTile`]'s and [`FilterTile`]'s loads.
#[cfg(not(feature = "sm90a"))]
macro_rules! igemm_mma_kernel {
    ($kind:ident, $mode:ty; $dt:ident, $T:ty, $E:ty, $bm:literal, $bn:literal,
     $bk:literal, $wm:literal, $wn:literal, $st:literal, $mi:literal, $ni:literal) => {
        // The tile is what the host launches for it (threads, stages, shared bytes), and
        // every thread's chunks share one column of the tile.
        const _: () = assert!(
            $bm == $wm * $mi * 16
                && $bn == $wn * $ni * 8
                && $ni % 2 == 0
                && 32 * $wm * $wn == mma_threads($bm, $bn)
                && $st == mma_stages($bm, $bn)
                && $bk * <$E as MmaElement>::BYTES == MMA_BK_BYTES
                && mma_stage_bytes($wm * $wn, $ni * 8) <= mma_shared_bytes($bm, $bn)
                && (32 * $wm * $wn) % ($bk / <$E as MmaElement>::PER_CHUNK) == 0
        );
        paste::paste! {
            /// # Safety
            /// `x`, `w`, `y` (and `bias`, `z` where the epilogue reads them) cover the
            /// tensors `p` describes; for the `cp.async` loaders (`igemm_tc`), x and the
            /// filter are channel-contiguous with their other strides and bases 16-byte
            /// aligned and whole chunks of channels per group (the gather loaders take
            /// any layout); for the packed ones (`igemm_tc_packed<UNIT>`), x as for
            /// `igemm_tc` with whole `UNIT`-byte units of channels per group (bases and
            /// strides `UNIT`-aligned) and the filter as [`Packed`] says.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_ $kind _ $bm x $bn _ $dt>](
                p: ConvGemmParams, x: *const $T, w: *const $T, y: *mut $T, bias: *const $T,
                z: *const $T,
            ) {
                const T: u32 = 32 * $wm * $wn;
                const PER: u32 = <$E as MmaElement>::PER_CHUNK;
                type S = MmaTileShape<$bm, $bn, $bk, $wm, $wn, $st>;
                type LA<'a> =
                    Im2colTile<'a, $E, $bm, $bk, T, { slots($bm, $bk, PER, T) }, RowSwizzled, $mode>;
                type LB<'a> =
                    FilterTile<'a, $E, $bn, $bk, T, { slots($bn, $bk, PER, T) }, RowSwizzled, $mode>;
                let p = &p;
                for_block::<$T, LA<'_>, LB<'_>>(
                    p,
                    ($bm, $bn),
                    (x, w, y, bias, z),
                    #[inline(always)]
                    |la, lb, ep, row0, col0| {
                        mma_tile::<$E, S, $mi, $ni, _, _, _>(
                            la, lb, p.k_tiles * <S as MmaShape>::BK, dynamic_smem(), ep, row0, col0,
                        )
                    },
                );
            }
        }
    };
}

#[cfg(not(feature = "sm90a"))]
mod sm80_kernels {
    use super::*;
    /// The `cp.async` im2col kernels (`conv_fwd_igemm_tc_*`).
    macro_rules! copy {
        ($($t:tt)*) => { igemm_mma_kernel!(igemm_tc, Copied; $($t)*); };
    }
    /// The gathering kernels over the flattened K (`conv_fwd_igemm_tc_gather_*`).
    macro_rules! gather {
        ($($t:tt)*) => { igemm_mma_kernel!(igemm_tc_gather, Gathered; $($t)*); };
    }
    /// The packed kernels over K flattened by 16-byte units (`conv_fwd_igemm_tc_packed16_*`)
    /// or 8-byte units (`conv_fwd_igemm_tc_packed8_*`, 16-bit types).
    macro_rules! packed16 {
        ($($t:tt)*) => { igemm_mma_kernel!(igemm_tc_packed16, Packed<16>; $($t)*); };
    }
    macro_rules! packed8 {
        ($($t:tt)*) => { igemm_mma_kernel!(igemm_tc_packed8, Packed<8>; $($t)*); };
    }
    copy!(f16, F16, F16, 128, 256, 64, 2, 4, 3, 4, 8);
    copy!(f16, F16, F16, 128, 128, 64, 2, 4, 4, 4, 4);
    copy!(f16, F16, F16, 128, 64, 64, 2, 2, 4, 4, 4);
    copy!(f16, F16, F16, 64, 64, 64, 2, 2, 4, 2, 4);
    copy!(bf16, Bf16, Bf16, 128, 256, 64, 2, 4, 3, 4, 8);
    copy!(bf16, Bf16, Bf16, 128, 128, 64, 2, 4, 4, 4, 4);
    copy!(bf16, Bf16, Bf16, 128, 64, 64, 2, 2, 4, 4, 4);
    copy!(bf16, Bf16, Bf16, 64, 64, 64, 2, 2, 4, 2, 4);
    copy!(tf32, f32, Tf32, 128, 128, 32, 2, 4, 4, 4, 4);
    copy!(tf32, f32, Tf32, 64, 64, 32, 2, 2, 4, 2, 4);
    gather!(f16, F16, F16, 128, 128, 64, 2, 4, 4, 4, 4);
    gather!(f16, F16, F16, 128, 64, 64, 2, 2, 4, 4, 4);
    gather!(f16, F16, F16, 64, 64, 64, 2, 2, 4, 2, 4);
    gather!(bf16, Bf16, Bf16, 128, 128, 64, 2, 4, 4, 4, 4);
    gather!(bf16, Bf16, Bf16, 128, 64, 64, 2, 2, 4, 4, 4);
    gather!(bf16, Bf16, Bf16, 64, 64, 64, 2, 2, 4, 2, 4);
    gather!(tf32, f32, Tf32, 128, 128, 32, 2, 4, 4, 4, 4);
    gather!(tf32, f32, Tf32, 64, 64, 32, 2, 2, 4, 2, 4);
    packed16!(f16, F16, F16, 128, 128, 64, 2, 4, 4, 4, 4);
    packed16!(f16, F16, F16, 128, 64, 64, 2, 2, 4, 4, 4);
    packed16!(f16, F16, F16, 64, 64, 64, 2, 2, 4, 2, 4);
    packed16!(bf16, Bf16, Bf16, 128, 128, 64, 2, 4, 4, 4, 4);
    packed16!(bf16, Bf16, Bf16, 128, 64, 64, 2, 2, 4, 4, 4);
    packed16!(bf16, Bf16, Bf16, 64, 64, 64, 2, 2, 4, 2, 4);
    packed16!(tf32, f32, Tf32, 128, 128, 32, 2, 4, 4, 4, 4);
    packed16!(tf32, f32, Tf32, 64, 64, 32, 2, 2, 4, 2, 4);
    packed8!(f16, F16, F16, 128, 128, 64, 2, 4, 4, 4, 4);
    packed8!(f16, F16, F16, 128, 64, 64, 2, 2, 4, 4, 4);
    packed8!(f16, F16, F16, 64, 64, 64, 2, 2, 4, 2, 4);
    packed8!(bf16, Bf16, Bf16, 128, 128, 64, 2, 4, 4, 4, 4);
    packed8!(bf16, Bf16, Bf16, 128, 64, 64, 2, 2, 4, 4, 4);
    packed8!(bf16, Bf16, Bf16, 64, 64, 64, 2, 2, 4, 2, 4);
}

/// Stamps out `wgmma_conv_fwd_<kind>_128x<BN>_<dt>` ([`wgmma_tile`], [`Sw128Atoms`] tiles):
/// `(kind, loader mode; dt, MmaElement, BN)`, the mode as in `igemm_mma_kernel!`.
#[cfg(feature = "sm90a")]
macro_rules! igemm_wgmma_kernel {
    ($kind:ident, $mode:ty; $dt:ident, $E:ty, $bn:literal) => {
        const _: () = assert!(
            mma_stage_bytes(WGMMA_THREADS / 32, $bn) <= conv_wgmma_shared_bytes($bn) - 1024
                && 64 * <$E as MmaElement>::BYTES == MMA_BK_BYTES
        );
        paste::paste! {
            /// # Safety
            /// As `conv_fwd_igemm_tc_*` of the same mode; the device is sm_90a.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<wgmma_conv_fwd_ $kind _128x $bn _ $dt>](
                p: ConvGemmParams, x: *const $E, w: *const $E, y: *mut $E, bias: *const $E,
                z: *const $E,
            ) {
                const T: u32 = WGMMA_THREADS;
                const BK: u32 = MMA_BK_BYTES / <$E as MmaElement>::BYTES;
                const PER: u32 = <$E as MmaElement>::PER_CHUNK;
                type LA<'a> =
                    Im2colTile<'a, $E, WGMMA_BM, BK, T, { slots(WGMMA_BM, BK, PER, T) }, Sw128Atoms, $mode>;
                type LB<'a> =
                    FilterTile<'a, $E, $bn, BK, T, { slots($bn, BK, PER, T) }, Sw128Atoms, $mode>;
                let p = &p;
                for_block::<$E, LA<'_>, LB<'_>>(
                    p,
                    (WGMMA_BM, $bn),
                    (x, w, y, bias, z),
                    #[inline(always)]
                    |la, lb, ep, row0, col0| {
                        wgmma_tile::<$E, $bn, { conv_wgmma_stages($bn) }, { $bn / 8 }, _, _, _>(
                            la, lb, p.k_tiles * BK, dynamic_smem(), ep, row0, col0,
                        )
                    },
                );
            }
        }
    };
}

#[cfg(feature = "sm90a")]
mod sm90a_kernels {
    use super::*;
    igemm_wgmma_kernel!(igemm, Copied; f16, F16, 256);
    igemm_wgmma_kernel!(igemm, Copied; f16, F16, 128);
    igemm_wgmma_kernel!(igemm, Copied; f16, F16, 64);
    igemm_wgmma_kernel!(igemm, Copied; bf16, Bf16, 256);
    igemm_wgmma_kernel!(igemm, Copied; bf16, Bf16, 128);
    igemm_wgmma_kernel!(igemm, Copied; bf16, Bf16, 64);
    igemm_wgmma_kernel!(igemm_packed16, Packed<16>; f16, F16, 128);
    igemm_wgmma_kernel!(igemm_packed16, Packed<16>; f16, F16, 64);
    igemm_wgmma_kernel!(igemm_packed16, Packed<16>; bf16, Bf16, 128);
    igemm_wgmma_kernel!(igemm_packed16, Packed<16>; bf16, Bf16, 64);
    igemm_wgmma_kernel!(igemm_packed8, Packed<8>; f16, F16, 128);
    igemm_wgmma_kernel!(igemm_packed8, Packed<8>; f16, F16, 64);
    igemm_wgmma_kernel!(igemm_packed8, Packed<8>; bf16, Bf16, 128);
    igemm_wgmma_kernel!(igemm_packed8, Packed<8>; bf16, Bf16, 64);
}
