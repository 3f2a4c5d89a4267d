//! `conv_fwd_implicit_gemm_<BMxBN>_<kp|pk>_f32`: exact-f32 implicit GEMM on CUDA cores,
//! built on [`fma_tile_ahead`] with im2col [`Gather`]s that read x and the filter in place.
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
    block_idx_x, block_idx_y, dynamic_smem, grid_dim_y, grid_stride, ld_shared_u32, ld_shared_v4,
    st_shared_u32, st_shared_v4, sync_threads, thread_idx_x,
};
use crate::epilogue;
use crate::gemm::{
    fma_slot, fma_stage_bytes, fma_tile_ahead, Epilogue, Gather, FMA_BK, FMA_THREADS,
};
use oxidnn_params::{fma_shared_bytes, tile_coords, ConvGeometry, ConvImplicitGemmParams};

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

/// The convolution's epilogue for one group: GEMM `(row, col)` is `(channel, pixel)`
/// when `KP`, else `(pixel, channel)`; channels are the group's.
pub struct ConvEpilogue<'a, const KP: bool> {
    p: &'a ConvImplicitGemmParams,
    group: u32,
    y: *mut f32,
    bias: *const f32,
    z: *const f32,
    /// Split-K: this block's partition of the workspace (the group's `rows x cols` GEMM,
    /// row-major), which takes the raw sums instead of y; null without split-K.
    partial: *mut f32,
}

impl<const KP: bool> ConvEpilogue<'_, KP> {
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

impl<const KP: bool> Epilogue for ConvEpilogue<'_, KP> {
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
        let ep = ConvEpilogue::<KP> {
            p,
            group,
            y,
            bias,
            z,
            partial: if p.splits > 1 {
                let (rows, cols) = if KP {
                    (p.geo.k_per_group, p.m_pixels)
                } else {
                    (p.m_pixels, p.geo.k_per_group)
                };
                ws.add((group * p.splits + split) as usize * (rows * cols) as usize)
            } else {
                core::ptr::null_mut()
            },
        };
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
