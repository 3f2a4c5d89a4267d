//! Exact-f32 implicit GEMM on CUDA cores, two cores (the host's `async_declines` picks):
//!
//! * `conv_fwd_implicit_gemm_async_<BMxBN>_<t|p>_f32` (end of this file): channels-first x
//!   with a dense `[k, c, r, s]` filter on [`fma_tile_async`], operands copied by
//!   `cp.async` ([`PixelCopy`], the matmul's [`StridedCopy`]).
//! * `conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32` (described below): any layout, on
//!   [`fma_tile_ahead`] with im2col [`Gather`]s that read x and the filter in place.
//!
//! Per group (grid y), the GEMM multiplies the pixels' im2col rows by the filter's rows:
//! `acc[pixel, k] = sum_kk x[pixel's tap of kk, channel of kk] * w[k, kk]` over
//! `gemm_k = c_per_group * taps`. At the start each block builds two tap tables in shared
//! memory (x offset and `f * dilation` per spatial dim; filter offset), so that a
//! gathered element costs one division of `kk` into (channel, tap), one table read, the
//! padding checks and the load. A pixel's `(n, o)` and its top-left input corner are
//! computed once per tile.
//!
//! * `kp`: GEMM rows = output channels (A = filter, K-fast), columns = pixels (B = im2col,
//!   pixel-fast), `kk` channel-outer: consecutive threads gather and store consecutive
//!   pixels, which coalesces for NCHW x and y.
//! * `pk`: rows = pixels (A = im2col, K-fast), columns = output channels, `kk`
//!   channel-inner: consecutive threads gather consecutive channels and store consecutive
//!   output channels, which coalesces for NHWC.
//!
//! Both are correct for any strides, groups, dilations and modes.
//!
//! Split-K (`p.splits > 1`, for grids too small to fill the GPU): each block computes one
//! K partition of its tile ([`FromTile`]) and stores the raw sums to the workspace; the
//! `conv_fwd_implicit_gemm_reduce_*` kernels add the partitions in a fixed order and
//! apply the epilogue (see [`ConvImplicitGemmParams`]).

use crate::device::{
    block_idx_x, block_idx_y, cp_async_ca, dynamic_smem, grid_dim_y, grid_stride, ld_shared_u32,
    ld_shared_v2, ld_shared_v4, st_shared_u32, st_shared_v2, st_shared_v4, sync_threads,
    thread_idx_x,
};
use crate::epilogue;
use crate::gemm::{
    fma_slot, fma_stage_bytes, fma_tile_ahead, fma_tile_async, Epilogue, Gather, TileLoader,
    FMA_BK, FMA_THREADS, RUN,
};
use crate::matmul::{Operand, StridedCopy};
use oxidnn_params::{
    conv_igemm_async_thread_tile, fma_shared_bytes, tile_coords, ConvGeometry,
    ConvImplicitGemmParams, CONV_IGEMM_ASYNC_THREADS, FMA_STAGES,
};

/// Fills the block's tap tables (see the module doc) at shared `xtab` (16 bytes a tap)
/// and `wtab` (4 bytes a tap), then waits for the whole block.
///
/// # Safety
/// Both tables lie in the block's shared memory, `taps` entries each.
#[inline(always)]
unsafe fn build_tables(g: &ConvGeometry, xtab: u32, wtab: u32) {
    let taps = g.taps();
    let mut t = thread_idx_x();
    while t < taps {
        let (q, f2) = (t / g.filter[2], t % g.filter[2]);
        let (f0, f1) = (q / g.filter[1], q % g.filter[1]);
        let f = [f0, f1, f2];
        let fd: [u32; 3] = core::array::from_fn(|j| f[j] * g.dilation[j]);
        let mut xo = 0u32;
        let mut wo = 0u32;
        for j in 0..3 {
            xo = xo.wrapping_add(fd[j].wrapping_mul(g.x[2 + j]));
            wo = wo.wrapping_add(g.filter_at(j, f[j]).wrapping_mul(g.w[2 + j]));
        }
        st_shared_v4(xtab + t * 16, [xo, fd[0], fd[1], fd[2]]);
        st_shared_u32(wtab + t * 4, wo);
        t += FMA_THREADS;
    }
    sync_threads();
}

/// `kk` as `(channel, tap)`: channel-outer when `C_OUTER`, else channel-inner.
#[inline(always)]
fn split<const C_OUTER: bool>(p: &ConvImplicitGemmParams, kk: u32) -> (u32, u32) {
    let (outer, inner) = p.inner.div_rem(kk);
    if C_OUTER {
        (outer, inner)
    } else {
        (inner, outer)
    }
}

/// The im2col operand: `ROWS` output pixels from `origin` by `gemm_k`. K-fast (`KF`,
/// channel-inner `kk`): each thread gathers one `kk` for `PER` pixels. Pixel-fast
/// (channel-outer `kk`): each thread gathers `PER` `kk`s of one pixel.
pub struct PixelGather<'a, const ROWS: u32, const PER: usize, const KF: bool> {
    p: &'a ConvImplicitGemmParams,
    /// x at channel 0 of the group.
    x: *const f32,
    /// Per slot (slot 0 only when pixel-fast): the offset of the pixel's input corner
    /// `o * stride - pad` (wrapping: it may lie in the padding) and that corner.
    base: [u32; PER],
    corner: [[u32; 3]; PER],
    xtab: u32,
}

impl<'a, const ROWS: u32, const PER: usize, const KF: bool> PixelGather<'a, ROWS, PER, KF> {
    #[inline(always)]
    unsafe fn new(
        p: &'a ConvImplicitGemmParams,
        x: *const f32,
        group: u32,
        origin: u32,
        xtab: u32,
    ) -> Self {
        let g = &p.geo;
        let mut base = [0u32; PER];
        let mut corner = [[0u32; 3]; PER];
        crate::unrolled!(i in (if KF { PER } else { 1 }) => {
            let (mn, _) = fma_slot::<ROWS>(KF, i as u32);
            let m = origin + mn;
            if m < p.m_pixels {
                let (n, o) = p.pixels.at(m);
                let mut b = n.wrapping_mul(g.x[0]);
                for j in 0..3 {
                    let c = (o[j] * g.stride[j]).wrapping_sub(g.pad[j]);
                    corner[i][j] = c;
                    b = b.wrapping_add(c.wrapping_mul(g.x[2 + j]));
                }
                base[i] = b;
            } else {
                // A corner past any extent: `corner + f * d` stays >= 2^31 (f * d < 2^31),
                // so every tap of this pixel reads as padding.
                corner[i][0] = 0x8000_0000;
            }
        });
        Self {
            p,
            x: x.add((group * g.c_per_group * g.x[1]) as usize),
            base,
            corner,
            xtab,
        }
    }

    /// The element of slot `s`'s pixel at channel `c`, tap entry `t`, or 0 in the padding.
    #[inline(always)]
    unsafe fn element(&self, s: usize, c: u32, t: [u32; 4]) -> f32 {
        let g = &self.p.geo;
        let cr = self.corner[s];
        let inside = cr[0].wrapping_add(t[1]) < g.input[0]
            && cr[1].wrapping_add(t[2]) < g.input[1]
            && cr[2].wrapping_add(t[3]) < g.input[2];
        if inside {
            let off = self.base[s]
                .wrapping_add(c.wrapping_mul(g.x[1]))
                .wrapping_add(t[0]);
            *self.x.add(off as usize)
        } else {
            0.0
        }
    }
}

impl<const ROWS: u32, const PER: usize, const KF: bool> Gather<PER>
    for PixelGather<'_, ROWS, PER, KF>
{
    #[inline(always)]
    fn k_fast(&self) -> bool {
        KF
    }

    #[inline(always)]
    unsafe fn fetch(&self, kt: u32) -> [f32; PER] {
        let mut v = [0f32; PER];
        if KF {
            let (_, k) = fma_slot::<ROWS>(true, 0);
            let kk = kt * FMA_BK + k;
            if kk < self.p.gemm_k {
                let (c, tap) = split::<false>(self.p, kk);
                let t = ld_shared_v4(self.xtab + tap * 16);
                crate::unrolled!(i in PER => v[i] = self.element(i, c, t));
            }
        } else {
            crate::unrolled!(i in PER => {
                let (_, k) = fma_slot::<ROWS>(false, i as u32);
                let kk = kt * FMA_BK + k;
                if kk < self.p.gemm_k {
                    let (c, tap) = split::<true>(self.p, kk);
                    let t = ld_shared_v4(self.xtab + tap * 16);
                    v[i] = self.element(0, c, t);
                }
            });
        }
        v
    }
}

/// The filter operand: `ROWS` output channels of the group from `origin` by `gemm_k`,
/// K-fast (each thread gathers one `kk` of `PER` channels), `kk` channel-outer when
/// `C_OUTER`.
pub struct FilterGather<'a, const ROWS: u32, const PER: usize, const C_OUTER: bool> {
    p: &'a ConvImplicitGemmParams,
    w: *const f32,
    /// Per slot: the channel's row offset, or `u32::MAX` past the group's channels.
    row: [u32; PER],
    wtab: u32,
}

impl<'a, const ROWS: u32, const PER: usize, const C_OUTER: bool>
    FilterGather<'a, ROWS, PER, C_OUTER>
{
    #[inline(always)]
    unsafe fn new(
        p: &'a ConvImplicitGemmParams,
        w: *const f32,
        group: u32,
        origin: u32,
        wtab: u32,
    ) -> Self {
        let g = &p.geo;
        let row = core::array::from_fn(|i| {
            let (mn, _) = fma_slot::<ROWS>(true, i as u32);
            let r = origin + mn;
            if r < g.k_per_group {
                (group * g.k_per_group + r) * g.w[0]
            } else {
                u32::MAX
            }
        });
        Self { p, w, row, wtab }
    }
}

impl<const ROWS: u32, const PER: usize, const C_OUTER: bool> Gather<PER>
    for FilterGather<'_, ROWS, PER, C_OUTER>
{
    #[inline(always)]
    fn k_fast(&self) -> bool {
        true
    }

    #[inline(always)]
    unsafe fn fetch(&self, kt: u32) -> [f32; PER] {
        let mut v = [0f32; PER];
        let (_, k) = fma_slot::<ROWS>(true, 0);
        let kk = kt * FMA_BK + k;
        if kk < self.p.gemm_k {
            let (c, tap) = split::<C_OUTER>(self.p, kk);
            let off = c * self.p.geo.w[1] + ld_shared_u32(self.wtab + tap * 4);
            crate::unrolled!(i in PER => {
                if self.row[i] != u32::MAX {
                    v[i] = *self.w.add((self.row[i] + off) as usize);
                }
            });
        }
        v
    }
}

/// A gather seen from K tile `kt0` on: split-K partition `kt0 * FMA_BK ..` of the GEMM
/// as a GEMM of its own (the inner gather's bounds stay those of the whole K, so the last
/// partition's tail reads as zeros).
pub struct FromTile<G> {
    inner: G,
    kt0: u32,
}

impl<const PER: usize, G: Gather<PER>> Gather<PER> for FromTile<G> {
    #[inline(always)]
    fn k_fast(&self) -> bool {
        self.inner.k_fast()
    }

    #[inline(always)]
    unsafe fn fetch(&self, kt: u32) -> [f32; PER] {
        self.inner.fetch(self.kt0 + kt)
    }
}

impl<L: TileLoader> TileLoader for FromTile<L> {
    const K_MAJOR: bool = L::K_MAJOR;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        self.inner.load(dst, self.kt0 + kt)
    }

    #[inline(always)]
    fn inside_tiles(&self) -> u32 {
        self.inner.inside_tiles().saturating_sub(self.kt0)
    }

    #[inline(always)]
    unsafe fn load_inside(&self, dst: u32, kt: u32) {
        self.inner.load_inside(dst, self.kt0 + kt)
    }
}

/// The convolution's epilogue for one group: GEMM `(row, col)` is `(channel, pixel)`
/// when `KP`, else `(pixel, channel)`; channels are the group's. `WIDE` (with `KP`): the
/// drain hands it runs of [`RUN`] pixels of one channel ([`Epilogue::store_run`]): one
/// pixel decode per run instead of one per pair.
pub struct ConvEpilogue<'a, const KP: bool, const WIDE: bool = false> {
    p: &'a ConvImplicitGemmParams,
    group: u32,
    y: *mut f32,
    bias: *const f32,
    z: *const f32,
    /// Split-K: this block's partition of the workspace (the group's `rows x cols` GEMM,
    /// row-major), which takes the raw sums instead of y; null without split-K.
    partial: *mut f32,
}

impl<'a, const KP: bool, const WIDE: bool> ConvEpilogue<'a, KP, WIDE> {
    /// The epilogue of group `group`'s tile in K partition `split`: y itself without
    /// split-K, else the partition's partial sums in `ws`.
    #[inline(always)]
    unsafe fn of_block(
        p: &'a ConvImplicitGemmParams,
        group: u32,
        split: u32,
        (y, bias, z, ws): (*mut f32, *const f32, *const f32, *mut f32),
    ) -> Self {
        let partial = if p.splits > 1 {
            let (rows, cols) = if KP {
                (p.geo.k_per_group, p.m_pixels)
            } else {
                (p.m_pixels, p.geo.k_per_group)
            };
            ws.add((group * p.splits + split) as usize * (rows * cols) as usize)
        } else {
            core::ptr::null_mut()
        };
        Self {
            p,
            group,
            y,
            bias,
            z,
            partial,
        }
    }

    /// Offsets, at strides `s` (y's or z's), of output channel `k` at the `RUN` pixels
    /// from pixel `(n, o)` on (those past the last pixel are never used).
    #[inline(always)]
    fn run_offsets(&self, s: &[u32; 5], k: u32, (n, o): (u32, [u32; 3])) -> [u32; RUN as usize] {
        let out = &self.p.geo.output;
        let (mut n, mut o) = (n, o);
        let mut at = [0u32; RUN as usize];
        crate::unrolled!(j in RUN as usize => {
            at[j] = n
                .wrapping_mul(s[0])
                .wrapping_add(k.wrapping_mul(s[1]))
                .wrapping_add(o[0].wrapping_mul(s[2]))
                .wrapping_add(o[1].wrapping_mul(s[3]))
                .wrapping_add(o[2].wrapping_mul(s[4]));
            o[2] += 1;
            if o[2] == out[2] {
                o[2] = 0;
                o[1] += 1;
                if o[1] == out[1] {
                    o[1] = 0;
                    o[0] += 1;
                    if o[0] == out[0] {
                        o[0] = 0;
                        n += 1;
                    }
                }
            }
        });
        at
    }

    /// Output channel and the y and z offsets of GEMM element `(row, col)`.
    #[inline(always)]
    fn at(&self, row: u32, col: u32) -> (u32, u32, u32) {
        let g = &self.p.geo;
        let (chan, pix) = if KP { (row, col) } else { (col, row) };
        let k = self.group * g.k_per_group + chan;
        let (n, o) = self.p.pixels.at(pix);
        let off = |s: &[u32; 5]| n * s[0] + k * s[1] + o[0] * s[2] + o[1] * s[3] + o[2] * s[4];
        (k, off(&g.y), off(&g.z))
    }
}

impl<const KP: bool, const WIDE: bool> Epilogue for ConvEpilogue<'_, KP, WIDE> {
    const WIDE: bool = WIDE && KP;

    /// Only with `KP`: `row` is a channel, `col..` consecutive pixels.
    #[inline(always)]
    unsafe fn store_run(&self, row: u32, col: u32, v: [f32; RUN as usize]) {
        let (rows, cols) = self.extent();
        if row >= rows || col >= cols {
            return;
        }
        let valid = |j: usize| col + (j as u32) < cols;
        if !self.partial.is_null() {
            let at = self.partial.add((row * cols + col) as usize);
            crate::unrolled!(j in RUN as usize => {
                if valid(j) {
                    *at.add(j) = v[j];
                }
            });
            return;
        }
        let g = &self.p.geo;
        let k = self.group * g.k_per_group + row;
        let first = self.p.pixels.at(col);
        let ys = self.run_offsets(&g.y, k, first);
        let r = epilogue::apply(
            &self.p.ops,
            v,
            false,
            || {
                core::array::from_fn(|j| {
                    if valid(j) {
                        *self.y.add(ys[j] as usize)
                    } else {
                        0.0
                    }
                })
            },
            |_| [*self.bias.add(k as usize); RUN as usize],
            || {
                let zs = self.run_offsets(&g.z, k, first);
                core::array::from_fn(|j| {
                    if valid(j) {
                        *self.z.add(zs[j] as usize)
                    } else {
                        0.0
                    }
                })
            },
        );
        crate::unrolled!(j in RUN as usize => {
            if valid(j) {
                *self.y.add(ys[j] as usize) = r[j];
            }
        });
    }

    #[inline(always)]
    fn extent(&self) -> (u32, u32) {
        let (k, m) = (self.p.geo.k_per_group, self.p.m_pixels);
        if KP {
            (k, m)
        } else {
            (m, k)
        }
    }

    #[inline(always)]
    unsafe fn store_pair(&self, row: u32, col: u32, v: [f32; 2]) {
        let (rows, cols) = self.extent();
        if row >= rows || col >= cols {
            return;
        }
        let both = col + 1 < cols;
        if !self.partial.is_null() {
            let at = self.partial.add((row * cols + col) as usize);
            *at = v[0];
            if both {
                *at.add(1) = v[1];
            }
            return;
        }
        let e0 = self.at(row, col);
        let e1 = if both { self.at(row, col + 1) } else { e0 };
        let r = epilogue::apply(
            &self.p.ops,
            v,
            false,
            || [*self.y.add(e0.1 as usize), *self.y.add(e1.1 as usize)],
            |_| [*self.bias.add(e0.0 as usize), *self.bias.add(e1.0 as usize)],
            || [*self.z.add(e0.2 as usize), *self.z.add(e1.2 as usize)],
        );
        *self.y.add(e0.1 as usize) = r[0];
        if both {
            *self.y.add(e1.1 as usize) = r[1];
        }
    }
}

/// One block: builds the tap tables, then its `BM x BN` output tile (and K partition,
/// under split-K) of each group `block_idx_y, + grid_dim_y, ..`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn implicit_gemm<
    const BM: u32,
    const BN: u32,
    const HM: usize,
    const HN: usize,
    const PA: usize,
    const PB: usize,
    const KP: bool,
    const AHEAD: bool,
>(
    p: &ConvImplicitGemmParams,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    bias: *const f32,
    z: *const f32,
    ws: *mut f32,
) {
    let smem = dynamic_smem();
    let xtab = smem + fma_shared_bytes(BM, BN);
    let wtab = xtab + p.geo.taps() * 16;
    build_tables(&p.geo, xtab, wtab);
    let tiles = p.tiles_m * p.tiles_n;
    let (split, tile) = (block_idx_x() / tiles, block_idx_x() % tiles);
    let (tm, tn) = tile_coords(tile, p.tiles_m, p.tiles_n);
    let (row0, col0) = (tm * BM, tn * BN);
    // This block's K partition (the whole K without split-K): the host makes every
    // partition non-empty and `split_k` a multiple of FMA_BK when it splits.
    let k0 = split * p.split_k;
    let k_len = (p.gemm_k - k0).min(p.split_k);
    let kt0 = k0 / FMA_BK;
    let mut group = block_idx_y();
    while group < p.geo.groups {
        let ep = ConvEpilogue::<KP>::of_block(p, group, split, (y, bias, z, ws));
        if KP {
            fma_tile_ahead::<BM, BN, HM, HN, PA, PB, AHEAD, _, _, _>(
                &FromTile {
                    inner: FilterGather::<BM, PA, true>::new(p, w, group, row0, wtab),
                    kt0,
                },
                &FromTile {
                    inner: PixelGather::<BN, PB, false>::new(p, x, group, col0, xtab),
                    kt0,
                },
                k_len,
                smem,
                &ep,
                row0,
                col0,
            );
        } else {
            fma_tile_ahead::<BM, BN, HM, HN, PA, PB, AHEAD, _, _, _>(
                &FromTile {
                    inner: PixelGather::<BM, PA, true>::new(p, x, group, row0, xtab),
                    kt0,
                },
                &FromTile {
                    inner: FilterGather::<BN, PB, false>::new(p, w, group, col0, wtab),
                    kt0,
                },
                k_len,
                smem,
                &ep,
                row0,
                col0,
            );
        }
        group += grid_dim_y();
        // The next group's first staging stores reuse memory other warps may still read.
        sync_threads();
    }
}

/// Split-K's second pass: for each pair of GEMM columns of each row of each group, the sum
/// of the partitions' partial sums in order `0, 1, ..`, through the epilogue.
///
/// # Safety
/// `ws` holds `groups * splits * rows * cols` partial sums (below 2^31) written by the
/// implicit-GEMM launch of the same `p`; the rest as that kernel.
#[inline(always)]
unsafe fn reduce_partials<const KP: bool>(
    p: &ConvImplicitGemmParams,
    ws: *const f32,
    y: *mut f32,
    bias: *const f32,
    z: *const f32,
) {
    let (rows, cols) = if KP {
        (p.geo.k_per_group, p.m_pixels)
    } else {
        (p.m_pixels, p.geo.k_per_group)
    };
    let pairs = cols.div_ceil(2);
    let per_group = rows * pairs;
    grid_stride(p.geo.groups as u64 * per_group as u64, |i| {
        let i = i as u32;
        let (group, rest) = (i / per_group, i % per_group);
        let (row, col) = (rest / pairs, 2 * (rest % pairs));
        let both = col + 1 < cols;
        let mut at = ws.add((group * p.splits * rows * cols + row * cols + col) as usize);
        let mut v = [0f32; 2];
        for _ in 0..p.splits {
            v[0] += *at;
            if both {
                v[1] += *at.add(1);
            }
            at = at.add((rows * cols) as usize);
        }
        let ep = ConvEpilogue::<KP> {
            p,
            group,
            y,
            bias,
            z,
            partial: core::ptr::null_mut(),
        };
        ep.store_pair(row, col, v);
    });
}

/// Stamps out the `kp` and `pk` entry points of a `BM x BN` tile.
macro_rules! implicit_gemm_kernels {
    ($bm:literal, $bn:literal) => {
        const _: () = assert!(fma_stage_bytes($bm, $bn) <= fma_shared_bytes($bm, $bn));
        implicit_gemm_kernels!(@one $bm, $bn, kp, true);
        implicit_gemm_kernels!(@one $bm, $bn, pk, false);
    };
    (@one $bm:literal, $bn:literal, $mode:ident, $kp:literal) => {
        paste::paste! {
            /// # Safety
            /// `x`, `w`, `y` (and `bias`, `z` where the epilogue reads them) cover the
            /// tensors `p.geo` describes, every span below 2^31 elements; y's offsets are
            /// distinct; the dynamic shared memory holds `fma_shared_bytes(BM, BN)` plus
            /// `conv_igemm_table_bytes(taps)`; with split-K, `ws` holds the partial sums
            /// (see [`ConvImplicitGemmParams`]).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_implicit_gemm_ $bm x $bn _ $mode _f32>](
                p: ConvImplicitGemmParams, x: *const f32, w: *const f32, y: *mut f32,
                bias: *const f32, z: *const f32, ws: *mut f32,
            ) {
                const PA: usize = ($bm * FMA_BK / FMA_THREADS) as usize;
                const PB: usize = ($bn * FMA_BK / FMA_THREADS) as usize;
                // Gathers two K tiles ahead where the registers allow (ptxas 12.9, `kp`
                // kernels, no spills: 128 x 128 183 registers, 128 x 64 127, 64 x 64 63,
                // so 1, 2 and 4 blocks share an SM); not 64 x 128, which spills 28 B at
                // its 128-register bound (two blocks per SM).
                const AHEAD: bool = !($bm == 64 && $bn == 128);
                implicit_gemm::<$bm, $bn, { $bm / 32 }, { $bn / 32 }, PA, PB, $kp, AHEAD>(
                    &p, x, w, y, bias, z, ws,
                )
            }
        }
    };
}

implicit_gemm_kernels!(128, 128);
implicit_gemm_kernels!(64, 128);
implicit_gemm_kernels!(128, 64);
implicit_gemm_kernels!(64, 64);

/// Stamps out the split-K reduction of one mode.
macro_rules! reduce_kernel {
    ($mode:ident, $kp:literal) => {
        paste::paste! {
            /// # Safety
            /// As `reduce_partials`: `ws` holds the partial sums the implicit-GEMM launch
            /// of the same `p` wrote; y, bias and z as that kernel's.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_implicit_gemm_reduce_ $mode _f32>](
                p: ConvImplicitGemmParams, ws: *const f32, y: *mut f32, bias: *const f32,
                z: *const f32,
            ) {
                reduce_partials::<$kp>(&p, ws, y, bias, z)
            }
        }
    };
}

reduce_kernel!(kp, true);
reduce_kernel!(pk, false);

// ---------------------------------------------------------------------------------------
// The cp.async core: `conv_fwd_implicit_gemm_async_<BMxBN>_<t|p>_f32`
// ---------------------------------------------------------------------------------------

/// The im2col operand of the `cp.async` kernels for [`fma_tile_async`]: `ROWS` output
/// pixels from the block's first column by the K partition from `k0`, `kk` channel-outer
/// (`kk = c * taps + tap`), copied word by word into `[k][mn]` stages, zero-filled in the
/// padding and past the pixels and K.
///
/// Pixel-fast: thread `t` copies pixel `t % ROWS` of the tile (decoded once, in `new`)
/// at local k `t / ROWS + i * (THREADS / ROWS)`, so a warp reads 32 consecutive pixels
/// at one `kk` (contiguous along an output row at stride 1) and writes 32 consecutive
/// floats of one stage row (no bank conflicts).
///
/// * `TABLE` (`_t` kernels, any filter): a per-block table in shared memory gives each
///   `kk` of the partition its x offset (channel and tap) and its tap's `f * dilation` in
///   h and w (16 bits each), so a copy costs one broadcast table read, two bounds checks
///   and the copy; entries past K hold taps `0x8000` (past any input), so the checks also
///   cover K. The h and w checks cover the padding; the depth dim has a 1-tap, unpadded
///   filter (the host's condition), folded into the pixel's base.
/// * pointwise (`_p`: one tap, no padding): element `base + kk * x.c`; checks only at the
///   last pixel tile and the last K tile ([`TileLoader::inside_tiles`]).
pub struct PixelCopy<'a, const ROWS: u32, const THREADS: u32, const TABLE: bool> {
    p: &'a ConvImplicitGemmParams,
    /// x at channel 0 of the group.
    x: *const f32,
    /// This thread's pixel: the x offset of its input corner `o * stride - pad` (wrapping:
    /// it may lie in the padding) and that corner in h and w (`0x8000_0000` past the
    /// pixels: outside the input at every tap).
    base: u32,
    corner: [u32; 2],
    /// This thread's column and first local k in the stage.
    mn: u32,
    k: u32,
    /// Whether the pixel exists, and whether the tile's every column does.
    valid: bool,
    full: bool,
    /// The partition's first `kk`, and the table's shared address (`TABLE`).
    k0: u32,
    table: u32,
}

impl<'a, const ROWS: u32, const THREADS: u32, const TABLE: bool>
    PixelCopy<'a, ROWS, THREADS, TABLE>
{
    const PER: u32 = ROWS * FMA_BK / THREADS;

    #[inline(always)]
    unsafe fn new(
        p: &'a ConvImplicitGemmParams,
        x: *const f32,
        group: u32,
        col0: u32,
        k0: u32,
        table: u32,
    ) -> Self {
        const {
            assert!(THREADS % ROWS == 0 && ROWS * FMA_BK % THREADS == 0);
        }
        let g = &p.geo;
        let tid = thread_idx_x();
        let (mn, k) = (tid % ROWS, tid / ROWS);
        let m = col0 + mn;
        let valid = m < p.m_pixels;
        let (base, corner) = if valid {
            let (n, o) = p.pixels.at(m);
            let c1 = (o[1] * g.stride[1]).wrapping_sub(g.pad[1]);
            let c2 = (o[2] * g.stride[2]).wrapping_sub(g.pad[2]);
            let base = (n * g.x[0])
                .wrapping_add(o[0] * g.stride[0] * g.x[2])
                .wrapping_add(c1.wrapping_mul(g.x[3]))
                .wrapping_add(c2.wrapping_mul(g.x[4]));
            (base, [c1, c2])
        } else {
            (0, [0x8000_0000; 2])
        };
        Self {
            p,
            x: x.add((group * g.c_per_group * g.x[1]) as usize),
            base,
            corner,
            mn,
            k,
            valid,
            full: p.m_pixels - col0 >= ROWS,
            k0,
            table,
        }
    }

    /// This thread's copies of (partition-local) K tile `kt` into `dst`; unless `CHECKED`,
    /// the pointwise copies all lie inside x.
    #[inline(always)]
    unsafe fn copy<const CHECKED: bool>(&self, dst: u32, kt: u32) {
        let g = &self.p.geo;
        // Pointwise: slot i reads `kk0 + i * kk_step`, one running address (a pointer per
        // slot would hold registers through the K loop).
        let kk0 = self.k0 + kt * FMA_BK + self.k;
        let kk_step = THREADS / ROWS;
        let mut src = self
            .x
            .wrapping_add(self.base.wrapping_add(kk0.wrapping_mul(g.x[1])) as usize);
        let step = (kk_step * g.x[1]) as usize;
        crate::unrolled!(i in Self::PER as usize => {
            let kl = self.k + i as u32 * kk_step;
            // In the stage: kl < FMA_BK and mn < ROWS by the slot layout.
            let at = dst + (kl * (ROWS + 4) + self.mn) * 4;
            if TABLE {
                // The table covers the partition's K tiles (kt * FMA_BK + kl below it).
                let e = ld_shared_v2(self.table + (kt * FMA_BK + kl) * 8);
                let h = self.corner[0].wrapping_add(e[1] & 0xffff);
                let w = self.corner[1].wrapping_add(e[1] >> 16);
                let inside = h < g.input[1] && w < g.input[2];
                let off = self.base.wrapping_add(e[0]);
                // A copy with nothing to read still needs a valid address: x itself.
                let src = if inside { self.x.wrapping_add(off as usize) } else { self.x };
                cp_async_ca::<4>(at, src as *const u8, if inside { 4 } else { 0 });
            } else {
                let inside = !CHECKED || (self.valid && kk0 + i as u32 * kk_step < self.p.gemm_k);
                let from = if inside { src } else { self.x };
                cp_async_ca::<4>(at, from as *const u8, if inside { 4 } else { 0 });
                src = src.wrapping_add(step);
            }
        });
    }
}

impl<const ROWS: u32, const THREADS: u32, const TABLE: bool> TileLoader
    for PixelCopy<'_, ROWS, THREADS, TABLE>
{
    /// `[k][mn]`: pixels contiguous in the stage.
    const K_MAJOR: bool = false;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        self.copy::<true>(dst, kt)
    }

    /// The table's copies are the same everywhere (their checks are the padding's); the
    /// pointwise copies skip theirs wherever the tile's pixels and K tile all exist.
    #[inline(always)]
    fn inside_tiles(&self) -> u32 {
        if TABLE {
            u32::MAX
        } else if self.full {
            (self.p.gemm_k - self.k0) / FMA_BK
        } else {
            0
        }
    }

    #[inline(always)]
    unsafe fn load_inside(&self, dst: u32, kt: u32) {
        self.copy::<false>(dst, kt)
    }
}

/// Fills the `_t` kernels' im2col table (see [`PixelCopy`]) at shared `table` for the
/// `entries` `kk`s from `k0` on, then waits for the whole block. The filter operand reads
/// row `kk` of the filter as stored (`c * taps + tap`, tap `(r, s)`); in convolution mode
/// that element multiplies the input tap `(R - 1 - r, S - 1 - s)`, so the table maps
/// through [`ConvGeometry::filter_at`].
///
/// # Safety
/// The table lies in the block's shared memory, `entries` 8-byte entries.
#[inline(always)]
unsafe fn build_pixel_table<const THREADS: u32>(
    p: &ConvImplicitGemmParams,
    table: u32,
    k0: u32,
    entries: u32,
) {
    let g = &p.geo;
    let mut e = thread_idx_x();
    while e < entries {
        let kk = k0 + e;
        let v = if kk < p.gemm_k {
            let (c, tap) = p.inner.div_rem(kk);
            let (r, s) = (tap / g.filter[2], tap % g.filter[2]);
            let d1 = g.filter_at(1, r) * g.dilation[1];
            let d2 = g.filter_at(2, s) * g.dilation[2];
            let off = c
                .wrapping_mul(g.x[1])
                .wrapping_add(d1.wrapping_mul(g.x[3]))
                .wrapping_add(d2.wrapping_mul(g.x[4]));
            [off, d1 | (d2 << 16)]
        } else {
            [0, 0x8000_8000]
        };
        st_shared_v2(table + e * 8, v);
        e += THREADS;
    }
    sync_threads();
}

/// One block of the `cp.async` kernels: its `BM x BN` tile (output channels x pixels, as
/// the `kp` kernels) and K partition of each group `block_idx_y, + grid_dim_y, ..` on
/// [`fma_tile_async`] (`TM x TN` per thread), the filter copied by the matmul's
/// [`StridedCopy`] (K-contiguous rows: the host's condition is a dense `[k, c, r, s]`
/// filter) and the pixels by [`PixelCopy`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn implicit_gemm_async<
    const BM: u32,
    const BN: u32,
    const TM: usize,
    const TN: usize,
    const TABLE: bool,
>(
    p: &ConvImplicitGemmParams,
    x: *const f32,
    w: *const f32,
    y: *mut f32,
    bias: *const f32,
    z: *const f32,
    ws: *mut f32,
) {
    const T: u32 = CONV_IGEMM_ASYNC_THREADS;
    const { assert!(BM * BN / (TM * TN) as u32 == T) };
    let smem = dynamic_smem();
    let table = smem + FMA_STAGES * FMA_BK * (BM + 4 + BN + 4) * 4;
    let g = &p.geo;
    let tiles = p.tiles_m * p.tiles_n;
    let (split, tile) = (block_idx_x() / tiles, block_idx_x() % tiles);
    let (tm, tn) = tile_coords(tile, p.tiles_m, p.tiles_n);
    let (row0, col0) = (tm * BM, tn * BN);
    // As `implicit_gemm`: non-empty partitions, `split_k` a multiple of FMA_BK.
    let k0 = split * p.split_k;
    let k_len = (p.gemm_k - k0).min(p.split_k);
    let mut group = block_idx_y();
    while group < g.groups {
        if TABLE {
            // Rebuilt per group: the previous group's epilogue staged its tile over it.
            build_pixel_table::<T>(p, table, k0, k_len.div_ceil(FMA_BK) * FMA_BK);
        }
        let ep = ConvEpilogue::<true, true>::of_block(p, group, split, (y, bias, z, ws));
        let rows = (group * g.k_per_group + row0) as u64 * g.w[0] as u64;
        let filter = Operand::new(
            w.add(rows as usize) as *const u8,
            g.w[0] as u64,
            1,
            g.k_per_group - row0,
            p.gemm_k,
        );
        fma_tile_async::<BM, BN, TM, TN, FMA_STAGES, _, _, _>(
            &FromTile {
                inner: StridedCopy::<BM, T>::new(filter),
                kt0: k0 / FMA_BK,
            },
            &PixelCopy::<BN, T, TABLE>::new(p, x, group, col0, k0, table),
            k_len,
            smem,
            &ep,
            row0,
            col0,
        );
        group += grid_dim_y();
        // The next group's table and stages reuse memory other warps may still read.
        sync_threads();
    }
}

/// Stamps out the `_t` (tap table) and `_p` (pointwise) `cp.async` kernels of a
/// `BM x BN` tile.
macro_rules! implicit_gemm_async_kernels {
    ($bm:literal, $bn:literal) => {
        implicit_gemm_async_kernels!(@one $bm, $bn, t, true);
        implicit_gemm_async_kernels!(@one $bm, $bn, p, false);
    };
    (@one $bm:literal, $bn:literal, $v:ident, $table:literal) => {
        paste::paste! {
            /// # Safety
            /// As the `kp` kernels, and: the filter is dense `[k, c, r, s]` (`w` strides
            /// `[w0, taps, s, 1]`, 1-tap depth), the depth dim unpadded; for `_t`, input
            /// extent plus padding and `(filter - 1) * dilation` below 2^15 in h and w, and
            /// the dynamic shared memory holds `conv_igemm_async_shared_bytes(BM, BN,
            /// conv_igemm_async_table_bytes(split_k))`; for `_p`, one tap and no padding
            /// and `conv_igemm_async_shared_bytes(BM, BN, 0)`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_implicit_gemm_async_ $bm x $bn _ $v _f32>](
                p: ConvImplicitGemmParams, x: *const f32, w: *const f32, y: *mut f32,
                bias: *const f32, z: *const f32, ws: *mut f32,
            ) {
                const TILE: (u32, u32) = conv_igemm_async_thread_tile($bm, $bn);
                implicit_gemm_async::<$bm, $bn, { TILE.0 as usize }, { TILE.1 as usize }, $table>(
                    &p, x, w, y, bias, z, ws,
                )
            }
        }
    };
}

implicit_gemm_async_kernels!(128, 128);
implicit_gemm_async_kernels!(128, 64);
implicit_gemm_async_kernels!(64, 128);
implicit_gemm_async_kernels!(64, 64);
