//! The tiled matrix-multiply cores that matmul (and implicit-GEMM convolution) are built on.
//!
//! A block computes one `BM x BN` tile of `acc = A x B^T` over the whole K, where `A` is an
//! `M x K` operand and `B` an `N x K` operand, each delivered tile by tile by a
//! [`TileLoader`] (tensor cores) or a [`Gather`] (CUDA cores). A loader is only an address
//! generator: matmul supplies strided ones, a convolution supplies im2col ones. The
//! finished accumulators go, two adjacent columns at a time, to an [`Epilogue`].
//!
//! * [`mma_tile`]: tensor cores. A `STAGES`-deep ring of shared-memory stages filled by
//!   `cp.async`, fragments read with `ldmatrix`, `mma.sync` (m16n8k16 for f16/bf16, m16n8k8
//!   for tf32) into f32 accumulators. Each warp owns an `MI*16 x NI*8` warp tile.
//! * [`fma_tile`]: exact f32 on CUDA cores. Register-staged double buffering; each thread
//!   owns a `TM x TN` register tile (split in quarters to keep shared loads conflict-free).
//!   [`fma_tile_ahead`] fetches two K tiles ahead (the implicit GEMM's gathers).
//! * [`fma_tile_async`]: exact f32 with a `cp.async` ring of `[k][mn]` stages (strided
//!   operands, matmul) and warp tiles whose fragment loads are conflict-free.

use crate::device::{
    cp_async_commit, cp_async_wait, f32_to_tf32, ld_shared_u32, ld_shared_v2, ld_shared_v4,
    ldmatrix_x4, mma_m16n8k16_bf16, mma_m16n8k16_f16, mma_m16n8k8_tf32, st_shared_u32,
    st_shared_v2, st_shared_v4, sync_threads, sync_warp, thread_idx_x,
};
use crate::element::{Bf16, F16};
use crate::unrolled;
pub use oxidnn_params::{FMA_BK, FMA_THREADS};

/// Bytes in one shared-memory chunk: the unit of `cp.async`, `ldmatrix` rows and swizzling.
pub const CHUNK: u32 = 16;

/// Operand element types of the tensor-core core.
pub trait MmaElement {
    /// Bytes per element.
    const BYTES: u32;
    /// Elements per [`CHUNK`].
    const PER_CHUNK: u32 = CHUNK / Self::BYTES;
    /// Turns a fragment register as loaded into the instruction's operand.
    #[inline(always)]
    fn operand(x: u32) -> u32 {
        x
    }
    /// `acc += a x b` over one instruction's K, which is always 2 chunks.
    fn mma(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
}

impl MmaElement for F16 {
    const BYTES: u32 = 2;
    #[inline(always)]
    fn mma(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        mma_m16n8k16_f16(acc, a, b)
    }
}

impl MmaElement for Bf16 {
    const BYTES: u32 = 2;
    #[inline(always)]
    fn mma(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        mma_m16n8k16_bf16(acc, a, b)
    }
}

/// f32 data multiplied on the tensor cores as tf32 (rounded to nearest, 10-bit mantissa).
pub struct Tf32;

impl MmaElement for Tf32 {
    const BYTES: u32 = 4;
    #[inline(always)]
    fn operand(x: u32) -> u32 {
        f32_to_tf32(x)
    }
    #[inline(always)]
    fn mma(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        mma_m16n8k8_tf32(acc, a, b)
    }
}

/// A block-tile configuration of [`mma_tile`]. The warp tile is `BM / WARPS_M` by
/// `BN / WARPS_N`, which must equal the `MI * 16` by `NI * 8` the kernel instantiates.
pub trait MmaShape {
    const BM: u32;
    const BN: u32;
    /// K per stage, in elements.
    const BK: u32;
    const WARPS_M: u32;
    const WARPS_N: u32;
    const STAGES: u32;
    const THREADS: u32 = 32 * Self::WARPS_M * Self::WARPS_N;
}

/// Byte offset of chunk `chunk` of row `row` in a tile of `row_chunks`-chunk rows, with the
/// chunk index XOR-swizzled so that the 8 rows an `ldmatrix` (or a column of `cp.async`s)
/// touches at one logical chunk fall in 8 different bank groups.
#[inline(always)]
pub fn swizzled(row: u32, chunk: u32, row_chunks: u32) -> u32 {
    let phys = if row_chunks >= 8 {
        chunk ^ (row & 7)
    } else if row_chunks == 4 {
        chunk ^ ((row >> 1) & 3)
    } else if row_chunks == 2 {
        chunk ^ ((row >> 2) & 1)
    } else {
        chunk
    };
    (row * row_chunks + phys) * CHUNK
}

/// Where a shared operand tile keeps its 16-byte chunks: chunk `chunk` of row `row` of a
/// tile of `rows` rows of `row_chunks` chunks each (rows run along K for a K-major tile,
/// along M/N for an MN-major one).
pub trait SmemLayout {
    fn offset(row: u32, chunk: u32, rows: u32, row_chunks: u32) -> u32;
}

/// Rows one after another, chunks XOR-swizzled within each row ([`swizzled`]): what
/// `ldmatrix` reads conflict-free ([`mma_tile`]).
pub struct RowSwizzled;

impl SmemLayout for RowSwizzled {
    #[inline(always)]
    fn offset(row: u32, chunk: u32, _rows: u32, row_chunks: u32) -> u32 {
        swizzled(row, chunk, row_chunks)
    }
}

/// `wgmma`'s 128-byte swizzle atoms: the tile cut into column blocks of 8 chunks (128
/// bytes), each block `rows` rows of 128 bytes, chunk `c` of row `r` stored at chunk
/// `c ^ (r % 8)` of its row. With 8-chunk rows (a K-major tile of 64 16-bit elements) it
/// is [`RowSwizzled`]'s layout; for longer rows (MN-major tiles) the blocks are what the
/// descriptor's leading-dimension offset steps over. Tiles start at 1024-byte boundaries.
pub struct Sw128Atoms;

impl SmemLayout for Sw128Atoms {
    #[inline(always)]
    fn offset(row: u32, chunk: u32, rows: u32, _row_chunks: u32) -> u32 {
        (chunk / 8) * rows * 128 + swizzled(row, chunk % 8, 8)
    }
}

/// Copies one operand's `rows x BK` tile for each K step into shared memory.
///
/// The shared tile is K-major (`rows` rows of `BK` elements) when `K_MAJOR`, else MN-major
/// (`BK` rows of `rows` elements), swizzled by [`swizzled`]; elements outside the operand
/// (past its rows or past K) must arrive as zeros.
pub trait TileLoader {
    const K_MAJOR: bool;
    /// Starts copying K tile `kt` (elements `kt * BK ..`) to the stage at shared `dst`. May
    /// complete asynchronously (`cp.async`, committed by the caller) or synchronously.
    ///
    /// # Safety
    /// `dst` is a stage of the block's shared memory that no thread reads until the
    /// caller's wait and barrier.
    unsafe fn load(&self, dst: u32, kt: u32);

    /// K tiles, from the first on, whose every element lies inside the operand, so that
    /// [`Self::load_inside`] may copy them (the exact-f32 core, [`fma_tile_async`], then
    /// runs a branch-free loop). None by default.
    #[inline(always)]
    fn inside_tiles(&self) -> u32 {
        0
    }

    /// [`Self::load`] of a tile `kt < inside_tiles()`: without bounds checks where the
    /// loader has them. By default, `load`.
    ///
    /// # Safety
    /// As [`Self::load`], and `kt < self.inside_tiles()`.
    #[inline(always)]
    unsafe fn load_inside(&self, dst: u32, kt: u32) {
        self.load(dst, kt)
    }
}

/// Receives the finished accumulators.
pub trait Epilogue {
    /// Rows and columns of the output (pairs at or past them are never passed).
    fn extent(&self) -> (u32, u32);
    /// Output element `(row, col)` and `(row, col + 1)` of the whole problem (tile origin
    /// included) have accumulators `v`; `row` is inside the output, `col + 1` may not be.
    ///
    /// # Safety
    /// Implementations check bounds; callers pass each pair once.
    unsafe fn store_pair(&self, row: u32, col: u32, v: [f32; 2]);

    /// Whether the drains hand this epilogue runs of [`RUN`] columns ([`Self::store_run`],
    /// one thread per run: wide stores) rather than pairs (one thread per pair: a warp's
    /// pair stores cover a contiguous stretch of a row).
    const WIDE: bool = false;

    /// Output elements `(row, col + j)`, `j < RUN`, have accumulators `v`; `row` is inside
    /// the output, columns from `col + 1` on may not be. Only called when [`Self::WIDE`];
    /// by default, pair by pair.
    ///
    /// # Safety
    /// As [`Self::store_pair`].
    #[inline(always)]
    unsafe fn store_run(&self, row: u32, col: u32, v: [f32; RUN as usize]) {
        let (_, n) = self.extent();
        unrolled!(j in (RUN / 2) as usize => {
            let c = col + 2 * j as u32;
            if c < n {
                self.store_pair(row, c, [v[2 * j], v[2 * j + 1]]);
            }
        });
    }
}

/// Columns of one [`Epilogue::store_run`]: 16 bytes of 16-bit output, 32 of f32.
pub const RUN: u32 = 8;

/// Loads the `ldmatrix.x4` fragment that covers MN `[mn0, mn0 + 16)` and the two chunks of K
/// from chunk `kc0` of a shared operand tile (K-major or MN-major): for A (`IS_A`), registers `a0..a3` of the
/// instruction; for B, `b0, b1` of the n8 tile at `mn0` then those of the tile at `mn0 + 8`.
#[inline(always)]
unsafe fn fragment<E: MmaElement, const IS_A: bool>(
    k_major: bool,
    tile: u32,
    mn_extent: u32,
    bk: u32,
    mn0: u32,
    kc0: u32,
) -> [u32; 4] {
    let lane = thread_idx_x() & 31;
    let (matrix, r) = (lane >> 3, lane & 7);
    // A's registers go (rows 0-7, k lo), (rows 8-15, k lo), (0-7, hi), (8-15, hi); B's go
    // (n 0-7, k lo), (0-7, hi), (8-15, lo), (8-15, hi).
    let (mn_hi, k_hi) = if IS_A {
        (matrix & 1, matrix >> 1)
    } else {
        (matrix >> 1, matrix & 1)
    };
    if k_major {
        let row = mn0 + r + 8 * mn_hi;
        ldmatrix_x4::<false>(tile + swizzled(row, kc0 + k_hi, bk / E::PER_CHUNK))
    } else if E::BYTES == 2 {
        let row = (kc0 + k_hi) * E::PER_CHUNK + r;
        ldmatrix_x4::<true>(tile + swizzled(row, mn0 / 8 + mn_hi, mn_extent / 8))
    } else {
        // 32-bit MN-major: no transposing ldmatrix; read the four words directly. Lane
        // (g, t) = (lane / 4, lane % 4) needs (mn, k) = (g | g + 8, t | t + 4).
        let (g, t) = (lane >> 2, lane & 3);
        let k0 = kc0 * E::PER_CHUNK;
        let word = #[inline(always)]
        |mn: u32, k: u32| {
            let chunk = swizzled(k, mn / 4, mn_extent / 4);
            ld_shared_u32(tile + chunk + (mn % 4) * 4)
        };
        let (m_lo, m_hi) = (mn0 + g, mn0 + g + 8);
        let (k_lo, k_hi) = (k0 + t, k0 + t + 4);
        if IS_A {
            [
                word(m_lo, k_lo),
                word(m_hi, k_lo),
                word(m_lo, k_hi),
                word(m_hi, k_hi),
            ]
        } else {
            [
                word(m_lo, k_lo),
                word(m_lo, k_hi),
                word(m_hi, k_lo),
                word(m_hi, k_hi),
            ]
        }
    }
}

/// One block's tile on the tensor cores: `acc = A[row0.., :] x B[col0.., :]^T` through
/// `STAGES` shared stages, then every accumulator to `ep` at `(row0 + r, col0 + c)`.
///
/// `MI x NI` (m16 x n8) instructions per warp per K step; `NI` is even. Shared memory at
/// `smem` must hold `(BM + BN) * BK * STAGES` elements. Every thread of the block must call it.
///
/// # Safety
/// The loaders' and the epilogue's own contracts; `smem` is the block's shared memory.
#[inline(always)]
pub unsafe fn mma_tile<E, S, const MI: usize, const NI: usize, LA, LB, EP>(
    la: &LA,
    lb: &LB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) where
    E: MmaElement,
    S: MmaShape,
    LA: TileLoader,
    LB: TileLoader,
    EP: Epilogue,
{
    let a_stage_bytes = S::BM * S::BK * E::BYTES;
    let b_stage_bytes = S::BN * S::BK * E::BYTES;
    let a_stage = |s: u32| smem + s * a_stage_bytes;
    let b_stage = |s: u32| smem + S::STAGES * a_stage_bytes + s * b_stage_bytes;
    let k_tiles = k.div_ceil(S::BK);

    let warp = thread_idx_x() >> 5;
    let warp_m = (warp % S::WARPS_M) * (MI as u32 * 16);
    let warp_n = (warp / S::WARPS_M) * (NI as u32 * 8);
    let mut acc = [[[0f32; 4]; NI]; MI];

    // Prologue: the first STAGES - 1 tiles in flight (one commit group each, empty or not,
    // so that the group count below stays in step with the tile count).
    for s in 0..S::STAGES - 1 {
        if s < k_tiles {
            la.load(a_stage(s), s);
            lb.load(b_stage(s), s);
        }
        cp_async_commit();
    }
    let mut read = 0;
    let mut write = S::STAGES - 1;
    for kt in 0..k_tiles {
        // Tile kt has landed (at most STAGES - 2 younger groups pending) for every thread,
        // and every warp is done with the stage the next load overwrites (read at kt - 1).
        cp_async_wait(S::STAGES - 2);
        sync_threads();
        let next = kt + S::STAGES - 1;
        if next < k_tiles {
            la.load(a_stage(write), next);
            lb.load(b_stage(write), next);
        }
        cp_async_commit();

        let (at, bt) = (a_stage(read), b_stage(read));
        unrolled!(ks in (S::BK / (2 * E::PER_CHUNK)) as usize => {
            let kc = 2 * ks as u32;
            let mut a = [[0u32; 4]; MI];
            unrolled!(mi in MI => {
                let mn0 = warp_m + mi as u32 * 16;
                a[mi] = fragment::<E, true>(LA::K_MAJOR, at, S::BM, S::BK, mn0, kc).map(E::operand);
            });
            let mut b = [[0u32; 4]; NI];
            unrolled!(nj in NI / 2 => {
                let mn0 = warp_n + nj as u32 * 16;
                b[nj] = fragment::<E, false>(LB::K_MAJOR, bt, S::BN, S::BK, mn0, kc).map(E::operand);
            });
            unrolled!(mi in MI => {
                unrolled!(ni in NI => {
                    let pair = b[ni / 2];
                    let bf = if ni % 2 == 0 {
                        [pair[0], pair[1]]
                    } else {
                        [pair[2], pair[3]]
                    };
                    E::mma(&mut acc[mi][ni], a[mi], bf);
                });
            });
        });
        read = if read + 1 == S::STAGES { 0 } else { read + 1 };
        write = if write + 1 == S::STAGES { 0 } else { write + 1 };
    }
    // Every copy has landed and every warp is done with the stages: they become the
    // epilogue's staging area.
    cp_async_wait(0);
    sync_threads();
    store_warp_tile(
        &acc,
        smem + warp * mma_stage_bytes(1, NI as u32 * 8),
        ep,
        (row0 + warp_m, col0 + warp_n),
    );
}

/// Hands one warp's `MI*16 x NI*8` accumulator tile (the `mma.sync` m16n8 layout: block
/// `[mi][ni]` of lane `(g, t) = (lane / 4, lane % 4)` holds rows `mi*16 + g` and `+ 8`,
/// columns `ni*8 + 2t` and `+ 1`) to `ep` at output origin `(r0, c0)`, 16 rows at a time
/// through the warp's staging area at shared `stage` ([`mma_stage_bytes`]`(1, NI * 8)`
/// bytes), so that each store instruction of the drain covers a contiguous run of an
/// output row.
///
/// # Safety
/// The whole warp calls it; `stage` is this warp's alone until it returns; `ep`'s contract.
#[inline(always)]
pub unsafe fn store_warp_tile<EP: Epilogue, const MI: usize, const NI: usize>(
    acc: &[[[f32; 4]; NI]; MI],
    stage: u32,
    ep: &EP,
    (r0, c0): (u32, u32),
) {
    let lane = thread_idx_x() & 31;
    let (g, t) = (lane >> 2, lane & 3);
    let wn = NI as u32 * 8;
    let stride = wn + STAGE_PAD;
    unrolled!(mi in MI => {
        unrolled!(ni in NI => {
            let c = ni as u32 * 8 + 2 * t;
            let v = acc[mi][ni].map(f32::to_bits);
            st_shared_v2(stage + (g * stride + c) * 4, [v[0], v[1]]);
            st_shared_v2(stage + ((g + 8) * stride + c) * 4, [v[2], v[3]]);
        });
        sync_warp();
        drain(stage, stride, ep, (r0 + mi as u32 * 16, c0), (16, wn), lane, 32);
        sync_warp();
    });
}

/// Floats each staged row is padded by: 8 keeps the half-warps' 8-byte staging stores
/// (rows `g`, columns `2t`) in distinct banks.
pub const STAGE_PAD: u32 = 8;

/// Shared bytes the tensor-core epilogue stages: 16 rows of a warp tile per warp.
pub const fn mma_stage_bytes(warps: u32, warp_n: u32) -> u32 {
    warps * 16 * (warp_n + STAGE_PAD) * 4
}

/// Hands the part inside the output of a staged `rows x cols` f32 tile (shared, row
/// stride `stride` floats, a multiple of 4; origin `(r0, c0)` of the output) to `ep`, two
/// columns at a time or, when `EP::WIDE`, [`RUN`] at a time (`cols` a multiple of it):
/// units `first, first + step, ..` in row-major order, so that consecutive threads store
/// consecutive units of a row. The loop stays rolled (its trip count depends on the
/// output's edge): one copy of the epilogue's code per kernel.
#[inline(always)]
unsafe fn drain<EP: Epilogue>(
    tile: u32,
    stride: u32,
    ep: &EP,
    (r0, c0): (u32, u32),
    (rows, cols): (u32, u32),
    first: u32,
    step: u32,
) {
    let (m, n) = ep.extent();
    let rows = m.saturating_sub(r0).min(rows);
    let cols = n.saturating_sub(c0).min(cols);
    let width = if EP::WIDE { RUN } else { 2 };
    let units = cols.div_ceil(width);
    if units == 0 {
        return;
    }
    let mut q = first;
    while q < rows * units {
        let (r, u) = (q / units, q % units);
        let at = tile + (r * stride + width * u) * 4;
        if EP::WIDE {
            // In the staged tile: `cols` rounded up to RUN stays within its columns.
            let (lo, hi) = (ld_shared_v4(at), ld_shared_v4(at + 16));
            let v =
                core::array::from_fn(|i| f32::from_bits(if i < 4 { lo[i % 4] } else { hi[i % 4] }));
            ep.store_run(r0 + r, c0 + width * u, v);
        } else {
            let v = ld_shared_v2(at);
            ep.store_pair(
                r0 + r,
                c0 + width * u,
                [f32::from_bits(v[0]), f32::from_bits(v[1])],
            );
        }
        q += step;
    }
}

// ---------------------------------------------------------------------------------------
// Exact f32 on CUDA cores
// ---------------------------------------------------------------------------------------

/// The `(mn, k)` of element `i` of the `ROWS x FMA_BK` operand tile that this thread stages
/// in [`fma_tile`]: K fastest across threads when the operand's K is contiguous, else MN
/// fastest, so that a warp's loads coalesce either way.
#[inline(always)]
pub fn fma_slot<const ROWS: u32>(k_fast: bool, i: u32) -> (u32, u32) {
    let e = thread_idx_x() + i * FMA_THREADS;
    if k_fast {
        (e / FMA_BK, e % FMA_BK)
    } else {
        (e % ROWS, e / ROWS)
    }
}

/// Supplies this thread's `PER` elements of each K tile of one operand of [`fma_tile`].
pub trait Gather<const PER: usize> {
    /// Whether the slots follow [`fma_slot`] with K fastest.
    fn k_fast(&self) -> bool;
    /// Slot `i`'s element of K tile `kt` ([`fma_slot`]`(k_fast, i)` from the tile's
    /// origin), 0 outside the operand.
    ///
    /// # Safety
    /// Implementations check bounds.
    unsafe fn fetch(&self, kt: u32) -> [f32; PER];
}

#[inline(always)]
unsafe fn fma_stage<const ROWS: u32, const PER: usize>(k_fast: bool, dst: u32, v: [f32; PER]) {
    unrolled!(i in PER => {
        let (mn, k) = fma_slot::<ROWS>(k_fast, i as u32);
        st_shared_u32(dst + (k * (ROWS + 4) + mn) * 4, v[i].to_bits());
    });
}

/// `L` consecutive f32s from shared memory (vector loads when `L` is 8, 4 or 2).
#[inline(always)]
unsafe fn ld_run<const L: usize>(addr: u32) -> [f32; L] {
    if L == 8 {
        let (lo, hi) = (ld_shared_v4(addr), ld_shared_v4(addr + 16));
        core::array::from_fn(|i| f32::from_bits(if i < 4 { lo[i % 4] } else { hi[i % 4] }))
    } else if L == 4 {
        let v = ld_shared_v4(addr);
        core::array::from_fn(|i| f32::from_bits(v[i % 4]))
    } else if L == 2 {
        let v = ld_shared_v2(addr);
        core::array::from_fn(|i| f32::from_bits(v[i % 2]))
    } else {
        core::array::from_fn(|i| f32::from_bits(ld_shared_u32(addr + 4 * i as u32)))
    }
}

/// One block's `BM x BN` tile in exact f32: `acc = A x B^T` by FMA, then `ep`.
///
/// Thread `(ty, tx)` of the 16 x 16 grid owns rows `ty * TM/2 ..` in each half of the tile
/// and columns `tx * TN/2 ..` in each half (`TM = BM / 16`, `TN = BN / 16`; `HM = TM / 2`,
/// `HN = TN / 2` passed separately). Shared tiles are stored K-major-transposed
/// (`[k][mn]`), rows padded by 4 floats so that staging stores from K-fast threads do not
/// collide. `PA`/`PB` = elements of A/B each thread stages per K step.
///
/// # Safety
/// As [`mma_tile`]; `smem` holds [`oxidnn_params::fma_shared_bytes`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fma_tile<
    const BM: u32,
    const BN: u32,
    const HM: usize,
    const HN: usize,
    const PA: usize,
    const PB: usize,
    GA: Gather<PA>,
    GB: Gather<PB>,
    EP: Epilogue,
>(
    ga: &GA,
    gb: &GB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) {
    fma_tile_ahead::<BM, BN, HM, HN, PA, PB, false, GA, GB, EP>(ga, gb, k, smem, ep, row0, col0)
}

/// [`fma_tile`], with each K tile's elements fetched two K tiles before they are staged
/// when `TWO_AHEAD` (one set of `PA + PB` registers more): two tiles' arithmetic, not
/// one, hides the gathers' latency. For gathers whose loads are slow to land (an
/// implicit GEMM's im2col reads) when registers allow; `false` is [`fma_tile`].
///
/// # Safety
/// As [`fma_tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fma_tile_ahead<
    const BM: u32,
    const BN: u32,
    const HM: usize,
    const HN: usize,
    const PA: usize,
    const PB: usize,
    const TWO_AHEAD: bool,
    GA: Gather<PA>,
    GB: Gather<PB>,
    EP: Epilogue,
>(
    ga: &GA,
    gb: &GB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) {
    let a_bytes = FMA_BK * (BM + 4) * 4;
    let b_bytes = FMA_BK * (BN + 4) * 4;
    let a_stage = |s: u32| smem + s * a_bytes;
    let b_stage = |s: u32| smem + 2 * a_bytes + s * b_bytes;
    let (ka, kb) = (ga.k_fast(), gb.k_fast());
    let tid = thread_idx_x();
    let (ty, tx) = (tid / 16, tid % 16);
    let k_tiles = k.div_ceil(FMA_BK);
    let mut acc = [[[[0f32; HN]; 2]; HM]; 2];

    fma_stage::<BM, PA>(ka, a_stage(0), ga.fetch(0));
    fma_stage::<BN, PB>(kb, b_stage(0), gb.fetch(0));
    // TWO_AHEAD: tile kt + 1's elements, fetched one iteration before they are staged.
    let mut near_a = [0f32; PA];
    let mut near_b = [0f32; PB];
    if TWO_AHEAD && 1 < k_tiles {
        near_a = ga.fetch(1);
        near_b = gb.fetch(1);
    }
    sync_threads();
    for kt in 0..k_tiles {
        let cur = kt & 1;
        let more = kt + 1 < k_tiles;
        let mut next_a = [0f32; PA];
        let mut next_b = [0f32; PB];
        if !TWO_AHEAD && more {
            next_a = ga.fetch(kt + 1);
            next_b = gb.fetch(kt + 1);
        } else if TWO_AHEAD && kt + 2 < k_tiles {
            next_a = ga.fetch(kt + 2);
            next_b = gb.fetch(kt + 2);
        }
        let (at, bt) = (a_stage(cur), b_stage(cur));
        unrolled!(kk in FMA_BK as usize => {
            let a_row = at + kk as u32 * (BM + 4) * 4;
            let b_row = bt + kk as u32 * (BN + 4) * 4;
            let a = [
                ld_run::<HM>(a_row + ty * HM as u32 * 4),
                ld_run::<HM>(a_row + (BM / 2 + ty * HM as u32) * 4),
            ];
            let b = [
                ld_run::<HN>(b_row + tx * HN as u32 * 4),
                ld_run::<HN>(b_row + (BN / 2 + tx * HN as u32) * 4),
            ];
            unrolled!(hm in 2 => {
                unrolled!(i in HM => {
                    unrolled!(hn in 2 => {
                        unrolled!(j in HN => {
                            acc[hm][i][hn][j] =
                                crate::device::fma(a[hm][i], b[hn][j], acc[hm][i][hn][j]);
                        });
                    });
                });
            });
        });
        if more {
            if TWO_AHEAD {
                fma_stage::<BM, PA>(ka, a_stage(cur ^ 1), near_a);
                fma_stage::<BN, PB>(kb, b_stage(cur ^ 1), near_b);
                (near_a, near_b) = (next_a, next_b);
            } else {
                fma_stage::<BM, PA>(ka, a_stage(cur ^ 1), next_a);
                fma_stage::<BN, PB>(kb, b_stage(cur ^ 1), next_b);
            }
        }
        sync_threads();
    }

    // Stage the whole tile (the loop above ended with a barrier, so the stages are free),
    // then drain it row by row.
    let stride = BN + 4;
    unrolled!(hm in 2 => {
        unrolled!(i in HM => {
            let r = hm as u32 * (BM / 2) + ty * HM as u32 + i as u32;
            unrolled!(hn in 2 => {
                let c = hn as u32 * (BN / 2) + tx * HN as u32;
                let v = acc[hm][i][hn];
                let at = smem + (r * stride + c) * 4;
                if HN == 4 {
                    st_shared_v4(at, core::array::from_fn(|j| v[j % HN].to_bits()));
                } else {
                    unrolled!(j in HN / 2 => {
                        st_shared_v2(at + 8 * j as u32, [v[2 * j].to_bits(), v[2 * j + 1].to_bits()]);
                    });
                }
            });
        });
    });
    sync_threads();
    drain(smem, stride, ep, (row0, col0), (BM, BN), tid, FMA_THREADS);
}

/// Lanes of a warp along M in [`fma_tile_async`]'s warp tile for a `tm x tn` thread tile:
/// 4 or 8 (the rest of the 32 along N), whichever makes the warp tile
/// (`lanes_m * tm` x `(32 / lanes_m) * tn`) squarer, so fewer shared bytes feed each FMA.
pub const fn fma_lanes_m(tm: u32, tn: u32) -> u32 {
    let (m8, n8) = (8 * tm, 4 * tn);
    let (m4, n4) = (4 * tm, 8 * tn);
    let d8 = if m8 > n8 { m8 - n8 } else { n8 - m8 };
    let d4 = if m4 > n4 { m4 - n4 } else { n4 - m4 };
    if d8 <= d4 {
        8
    } else {
        4
    }
}

/// `R` (a multiple of 4) fragment values at one k: 4 consecutive floats from `first`, then
/// from every `group` floats on (16-byte shared loads).
#[inline(always)]
unsafe fn fma_fragment<const R: usize>(row: u32, first: u32, group: u32) -> [f32; R] {
    let mut v = [0f32; R];
    unrolled!(g in R / 4 => {
        let q = ld_run::<4>(row + (first + g as u32 * group) * 4);
        unrolled!(j in 4 => v[4 * g + j] = q[j]);
    });
    v
}

/// One block's `BM x BN` tile in exact f32 with operands copied asynchronously: `acc =
/// A x B^T` by FMA, then `ep`. The loaders fill `[k][mn]` stages (rows of `BM + 4` /
/// `BN + 4` floats, K tiles of [`FMA_BK`]) with `cp.async`s that this core commits, one
/// group per K tile, in a `STAGES`-deep ring: tiles `kt + 1 .. kt + STAGES - 1` are in
/// flight while tile `kt` is multiplied.
///
/// Each thread owns `TM x TN` outputs (multiples of 4) in groups of 4 rows and 4 columns.
/// Warps tile the block with `(LM * TM) x (LN * TN)` warp tiles (`LM` =
/// [`fma_lanes_m`], `LN = 32 / LM`); lane `(lane / LN, lane % LN)` owns 4 rows in each
/// row group of its warp tile (groups `4 * LM` rows apart) and likewise 4 columns per
/// column group. So every fragment load is a 16-byte `ld.shared.v4` and a warp's loads of
/// one group read `LM` (or `LN`) consecutive 16-byte chunks: one wavefront, no bank
/// conflicts (8 x 16 per thread: 6 loads per 128 FMAs). Block threads: `BM * BN / (TM * TN)`.
///
/// Schedule (as CUTLASS's multistage SIMT loop): the fragments of step `kk + 1` are loaded
/// during the FMAs of step `kk`, spread over them ([`fma_k_tile`]); the one barrier per K
/// tile comes before its last step's FMAs, after the last fragment loads from its stage,
/// and is followed by the loads of the next tile's first fragments, so that barrier and
/// load latency hide under 128 FMAs per thread. Tile `kt + STAGES - 1`'s copies are issued after the first step's
/// fragment loads; while they stay inside both operands ([`TileLoader::inside_tiles`])
/// the loop runs a copy of its body with [`TileLoader::load_inside`] (no bounds checks,
/// no branches: the scheduler interleaves the copies' address arithmetic with FMAs).
///
/// # Safety
/// As [`mma_tile`]; every thread of the block calls it; the loaders' `load` only issues
/// `cp.async`s into the stage it is given (their `K_MAJOR` is false: `[k][mn]`);
/// `smem` holds `STAGES` stages of both operands and the staged `BM x (BN + 4)` result
/// ([`oxidnn_params::fma_matmul_shared_bytes`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fma_tile_async<
    const BM: u32,
    const BN: u32,
    const TM: usize,
    const TN: usize,
    const STAGES: u32,
    LA: TileLoader,
    LB: TileLoader,
    EP: Epilogue,
>(
    la: &LA,
    lb: &LB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) {
    const {
        assert!(TM % 4 == 0 && TN % 4 == 0 && STAGES >= 2 && FMA_BK >= 2);
        assert!(!LA::K_MAJOR && !LB::K_MAJOR);
        let lanes_m = fma_lanes_m(TM as u32, TN as u32);
        assert!(BM % (lanes_m * TM as u32) == 0 && BN % ((32 / lanes_m) * TN as u32) == 0);
    }
    let lanes_m = fma_lanes_m(TM as u32, TN as u32);
    let lanes_n = 32 / lanes_m;
    let (warp_m, warp_n) = (lanes_m * TM as u32, lanes_n * TN as u32);
    let warps_n = BN / warp_n;
    let threads = BM * BN / (TM * TN) as u32;
    let tid = thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    // This thread's first row and column in the tile; groups follow 4 * lanes apart.
    let row = (warp / warps_n) * warp_m + (lane / lanes_n) * 4;
    let col = (warp % warps_n) * warp_n + (lane % lanes_n) * 4;

    let a_bytes = FMA_BK * (BM + 4) * 4;
    let b_bytes = FMA_BK * (BN + 4) * 4;
    let stages = FmaStages {
        a: smem,
        b: smem + STAGES * a_bytes,
        a_bytes,
        b_bytes,
        a_step: (BM + 4) * 4,
        b_step: (BN + 4) * 4,
        row,
        col,
        a_group: 4 * lanes_m,
        b_group: 4 * lanes_n,
    };
    let k_tiles = k.div_ceil(FMA_BK);

    unrolled!(s in (STAGES - 1) as usize => {
        let s = s as u32;
        if s < k_tiles {
            la.load(stages.a + s * a_bytes, s);
            lb.load(stages.b + s * b_bytes, s);
        }
        cp_async_commit();
    });
    cp_async_wait(STAGES - 2);
    sync_threads();

    let mut acc = [[0f32; TN]; TM];
    let mut frags = ([[0f32; TM]; 2], [[0f32; TN]; 2]);
    (frags.0[0], frags.1[0]) = stages.fragments::<TM, TN>(0, 0);
    // Ring positions: the stage multiplied now, and the one the copies go to (read in
    // the previous iteration, before its barrier).
    let mut ring = (0, STAGES - 1);
    // Iterations whose copies (tile kt + STAGES - 1) lie inside both operands.
    let inside = la.inside_tiles().min(lb.inside_tiles()).min(k_tiles);
    let fast = inside.saturating_sub(STAGES - 1);
    for kt in 0..fast {
        fma_k_tile::<TM, TN, STAGES, _>(&stages, &mut acc, &mut frags, &mut ring, |a, b| {
            let ahead = kt + STAGES - 1;
            la.load_inside(a, ahead);
            lb.load_inside(b, ahead);
        });
    }
    for kt in fast..k_tiles {
        fma_k_tile::<TM, TN, STAGES, _>(&stages, &mut acc, &mut frags, &mut ring, |a, b| {
            let ahead = kt + STAGES - 1;
            if ahead < k_tiles {
                la.load(a, ahead);
                lb.load(b, ahead);
            }
        });
    }
    // Groups still pending are empty (no tile past the last is copied), and every thread
    // passed the last barrier after its last read of a real tile: the stages are free
    // (the loads of a next tile's first fragments that follow that barrier read stage
    // memory whose values are never used). Stage the tile, then drain it row by row.
    cp_async_wait(0);
    let stride = BN + 4;
    unrolled!(i in TM => {
        let r = row + (i as u32 / 4) * 4 * lanes_m + i as u32 % 4;
        unrolled!(g in TN / 4 => {
            let c = col + g as u32 * 4 * lanes_n;
            let v: [u32; 4] = core::array::from_fn(|j| acc[i][4 * g + j].to_bits());
            st_shared_v4(smem + (r * stride + c) * 4, v);
        });
    });
    sync_threads();
    drain(smem, stride, ep, (row0, col0), (BM, BN), tid, threads);
}

/// Where [`fma_tile_async`]'s stages lie and which fragments this thread reads from them.
struct FmaStages {
    /// Shared addresses of stage 0 of A and of B; bytes per stage.
    a: u32,
    b: u32,
    a_bytes: u32,
    b_bytes: u32,
    /// Bytes from one k row of a stage to the next.
    a_step: u32,
    b_step: u32,
    /// This thread's first row / column, and the distance between its groups of 4.
    row: u32,
    col: u32,
    a_group: u32,
    b_group: u32,
}

impl FmaStages {
    /// This thread's A and B fragments at step `kk` of stage `stage`.
    #[inline(always)]
    unsafe fn fragments<const TM: usize, const TN: usize>(
        &self,
        stage: u32,
        kk: u32,
    ) -> ([f32; TM], [f32; TN]) {
        let (a, b) = self.rows(stage, kk);
        (
            fma_fragment::<TM>(a, self.row, self.a_group),
            fma_fragment::<TN>(b, self.col, self.b_group),
        )
    }

    /// Shared addresses of the k row `kk` of stage `stage`, in A and in B.
    #[inline(always)]
    fn rows(&self, stage: u32, kk: u32) -> (u32, u32) {
        (
            self.a + stage * self.a_bytes + kk * self.a_step,
            self.b + stage * self.b_bytes + kk * self.b_step,
        )
    }

    /// Loads group `g` of 4 fragment values at the k rows `rows` (A's `TM / 4` groups,
    /// then B's `TN / 4`) into `frags`: one 16-byte shared load.
    #[inline(always)]
    unsafe fn load_group<const TM: usize, const TN: usize>(
        &self,
        rows: (u32, u32),
        g: usize,
        frags: (&mut [f32; TM], &mut [f32; TN]),
    ) {
        if g < TM / 4 {
            let v = ld_run::<4>(rows.0 + (self.row + g as u32 * self.a_group) * 4);
            unrolled!(j in 4 => frags.0[4 * g + j] = v[j]);
        } else {
            let g = g - TM / 4;
            let v = ld_run::<4>(rows.1 + (self.col + g as u32 * self.b_group) * 4);
            unrolled!(j in 4 => frags.1[4 * g + j] = v[j]);
        }
    }
}

/// One K tile of [`fma_tile_async`]: the FMAs of stage `ring.0` (whose first fragments are
/// in `frags.*[0]`), `copy(a_stage, b_stage)` issuing the copies into stage `ring.1` (then
/// committed), the barrier before the last step, and the next stage's first fragments.
///
/// The next step's `(TM + TN) / 4` fragment groups are loaded spread over the rows of
/// this step's FMAs (one 16-byte load before each of the first rows), not all at once: a
/// burst of `ld.shared.v4`s (B's take 4 wavefronts each) held the FMAs behind it in
/// dispatch (H100, ncu: dispatch stalls were the exact-f32 loop's largest loss against
/// cuBLAS, whose loop spaces its shared loads 8-17 FFMAs apart).
#[inline(always)]
unsafe fn fma_k_tile<const TM: usize, const TN: usize, const STAGES: u32, C: Fn(u32, u32)>(
    st: &FmaStages,
    acc: &mut [[f32; TN]; TM],
    frags: &mut ([[f32; TM]; 2], [[f32; TN]; 2]),
    ring: &mut (u32, u32),
    copy: C,
) {
    let (read, write) = *ring;
    unrolled!(kk in FMA_BK as usize => {
        let (cur, next) = (kk % 2, (kk + 1) % 2);
        let rows = if kk + 1 < FMA_BK as usize {
            st.rows(read, (kk + 1) as u32)
        } else {
            // Every fragment of this stage is loaded. Tile kt + 1 has landed (only the
            // newest STAGES - 2 groups may be pending); the barrier publishes every
            // thread's copies and frees stage `read` for the next iteration's copies.
            cp_async_wait(STAGES - 2);
            sync_threads();
            let r = if read + 1 == STAGES { 0 } else { read + 1 };
            let w = if write + 1 == STAGES { 0 } else { write + 1 };
            *ring = (r, w);
            st.rows(r, 0)
        };
        if kk == 0 {
            copy(st.a + write * st.a_bytes, st.b + write * st.b_bytes);
            cp_async_commit();
        }
        let (a, b) = (frags.0[cur], frags.1[cur]);
        unrolled!(i in TM => {
            // Group g before row g (or, with more groups than rows, g * TM / groups).
            let groups = (TM + TN) / 4;
            unrolled!(g in groups => {
                if (if groups <= TM { g } else { g * TM / groups }) == i {
                    let (fa, fb) = (&mut frags.0[next], &mut frags.1[next]);
                    st.load_group::<TM, TN>(rows, g, (fa, fb));
                }
            });
            unrolled!(j in TN => {
                acc[i][j] = crate::device::fma(a[i], b[j], acc[i][j]);
            });
        });
    });
}

/// Shared bytes [`fma_tile`] stages its `bm x bn` result in (rows padded by 4 floats).
pub const fn fma_stage_bytes(bm: u32, bn: u32) -> u32 {
    bm * (bn + 4) * 4
}

#[cfg(feature = "sm90a")]
pub mod hopper;
