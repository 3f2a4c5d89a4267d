//! The Hopper tensor-core core (`sm_90a`): [`wgmma_tile`], `wgmma` on operand tiles staged
//! in `wgmma`'s 128-byte-swizzled shared-memory layout ([`super::Sw128Atoms`]).
//!
//! A block is two warpgroups; warpgroup `w` computes rows `64 w ..` of the `128 x BN`
//! output tile with one `wgmma.m64nBNk16` per 16 of K, both operands read from shared
//! memory, accumulators (`BN / 2` f32 per thread) in registers. Every thread also copies:
//! `cp.async` fills a ring of `STAGES` stages `STAGES - 2` K tiles ahead. Per K tile, after
//! one barrier: the tile's `wgmma`s are issued (queued behind the previous tile's), then
//! the copies of a later tile, then the previous tile's `wgmma`s are waited for.
//!
//! [`wgmma_tma_tile`] is the warp-specialised variant for operands a TMA tensor map
//! describes: one producer thread issues bulk tensor copies that complete on per-stage
//! barriers; two consumer warpgroups only multiply.

use super::{mma_stage_bytes, store_warp_tile, Epilogue, MmaElement, TileLoader};
use crate::device::hopper::{
    fence_mbarrier_init, fence_proxy_async_shared, mbarrier_arrive, mbarrier_arrive_expect_tx,
    mbarrier_init, mbarrier_wait, set_max_registers, tma_load_3d, wgmma_commit_group, wgmma_fence,
    wgmma_wait, Accumulators, SmemDescriptor, WgmmaInput,
};
use crate::device::{
    bar_sync, cp_async_commit, cp_async_wait, sync_threads, sync_warp, thread_idx_x,
};
use crate::element::{Bf16, F16};
use crate::unrolled;
use oxidnn_params::{MMA_BK_BYTES, TMA_BOX, WGMMA_BM};

/// The 16-bit input types of [`wgmma_tile`].
pub trait WgmmaElement: MmaElement {
    const INPUT: WgmmaInput;
}

impl WgmmaElement for F16 {
    const INPUT: WgmmaInput = WgmmaInput::F16;
}

impl WgmmaElement for Bf16 {
    const INPUT: WgmmaInput = WgmmaInput::Bf16;
}

/// Rows of the output tile one warpgroup computes (the M of `wgmma`).
const WG_ROWS: u32 = 64;
/// K of one `wgmma`.
const WGMMA_K: u32 = 16;
/// Bytes of a swizzle atom's row, and of one stage's row of a K-major tile (64 16-bit
/// elements of K).
const ATOM_ROW: u32 = 128;
/// Bytes from one 8-row group of a swizzle-atom column to the next.
const ATOM_BYTES: u32 = 8 * ATOM_ROW;

/// The descriptor of the stage tile at `tile` (rows `first ..` of M/N) and the byte step
/// from one 16-element K slice to the next.
///
/// K-major tiles are rows of 128 bytes (the stage's 64 K), one after another: 8-row
/// groups 1024 bytes apart, a K slice 32 bytes further along each row (the hardware
/// swizzles the full address, so the XOR pattern stays that of the row). MN-major tiles
/// are column blocks of 64 M/N elements, each `BK` rows of K: blocks `BK * 128` bytes
/// apart, 8-row groups of K 1024 bytes apart, a K slice 16 rows further. Rows `first ..`
/// (a multiple of 64) start `first * 128` bytes in, either way.
#[inline(always)]
fn operand_descriptor(k_major: bool, tile: u32, first: u32, bk: u32) -> (SmemDescriptor, u32) {
    let start = tile + first * ATOM_ROW;
    if k_major {
        (SmemDescriptor::sw128(start, 16, ATOM_BYTES), WGMMA_K * 2)
    } else {
        (
            SmemDescriptor::sw128(start, bk * ATOM_ROW, ATOM_BYTES),
            WGMMA_K * ATOM_ROW,
        )
    }
}

/// One block's `128 x BN` tile on `wgmma`: `acc = A[row0.., :] x B[col0.., :]^T` through
/// `STAGES` shared stages (loaders writing [`super::Sw128Atoms`] tiles of 128-byte K), then
/// every accumulator to `ep` at `(row0 + r, col0 + c)`. `NI = BN / 8`.
///
/// Shared memory at `smem` holds `oxidnn_params::wgmma_shared_bytes(BN)` bytes. Every
/// thread of the block (two warpgroups) calls it.
///
/// # Safety
/// The loaders' and the epilogue's own contracts; `smem` is the block's shared memory;
/// the device is sm_90a.
#[inline(always)]
pub unsafe fn wgmma_tile<E, const BN: u32, const STAGES: u32, const NI: usize, LA, LB, EP>(
    la: &LA,
    lb: &LB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) where
    E: WgmmaElement,
    LA: TileLoader,
    LB: TileLoader,
    EP: Epilogue,
    [[f32; 4]; NI]: Accumulators,
{
    const { assert!(STAGES >= 3 && NI as u32 * 8 == BN) };
    let bk = MMA_BK_BYTES / E::BYTES;
    let a_stage_bytes = WGMMA_BM * MMA_BK_BYTES;
    let b_stage_bytes = BN * MMA_BK_BYTES;
    // The swizzle pattern repeats from 1024-byte boundaries; every stage size is a multiple.
    let base = (smem + ATOM_BYTES - 1) & !(ATOM_BYTES - 1);
    let a_stage = |s: u32| base + s * a_stage_bytes;
    let b_stage = |s: u32| base + STAGES * a_stage_bytes + s * b_stage_bytes;
    let k_tiles = k.div_ceil(bk);
    let warp = thread_idx_x() >> 5;
    let wg_row = (warp / 4) * WG_ROWS;
    let trans = (!LA::K_MAJOR, !LB::K_MAJOR);
    let mut acc = [[0f32; 4]; NI];

    // Prologue: the first STAGES - 2 tiles in flight, one commit group each (empty or not,
    // so that the group count below stays in step with the tile count).
    for s in 0..STAGES - 2 {
        if s < k_tiles {
            la.load(a_stage(s), s);
            lb.load(b_stage(s), s);
        }
        cp_async_commit();
    }
    let mut read = 0;
    let mut write = STAGES - 2;
    for kt in 0..k_tiles {
        // This thread's copies of tile kt have landed (at most STAGES - 3 younger groups
        // pending) and are made visible to the async proxy; after the barrier, every
        // thread's are, and every warpgroup has retired its wgmmas of tile kt - 2 (the
        // wait at the end of the previous iteration), whose stage the next load reuses.
        cp_async_wait(STAGES - 3);
        fence_proxy_async_shared();
        sync_threads();

        // Tile kt's wgmmas first, so that the tensor cores have them queued behind tile
        // kt - 1's while this thread issues the next copies.
        let (da, a_step) = operand_descriptor(LA::K_MAJOR, a_stage(read), wg_row, bk);
        let (db, b_step) = operand_descriptor(LB::K_MAJOR, b_stage(read), 0, bk);
        acc.fence_operands();
        wgmma_fence();
        unrolled!(ks in (bk / WGMMA_K) as usize => {
            let ks = ks as u32;
            acc.mma(E::INPUT, trans, da.offset(ks * a_step), db.offset(ks * b_step), true);
        });
        wgmma_commit_group();

        let next = kt + STAGES - 2;
        if next < k_tiles {
            la.load(a_stage(write), next);
            lb.load(b_stage(write), next);
        }
        cp_async_commit();
        // Tile kt's wgmmas run on while the next iteration waits for its copies; tile
        // kt - 1's are retired.
        wgmma_wait::<1>();
        acc.fence_operands();
        read = if read + 1 == STAGES { 0 } else { read + 1 };
        write = if write + 1 == STAGES { 0 } else { write + 1 };
    }
    wgmma_wait::<0>();
    acc.fence_operands();
    // Every copy has landed and every warpgroup is done with the stages: they become the
    // epilogue's staging area, 16 rows of BN per warp.
    cp_async_wait(0);
    sync_threads();
    let stage = base + warp * mma_stage_bytes(1, BN);
    let warp_row = wg_row + (warp % 4) * 16;
    store_warp_tile(&[acc], stage, ep, (row0 + warp_row, col0));
}

// ---------------------------------------------------------------------------------------
// The warp-specialised TMA core: one producer thread copies, two warpgroups multiply.
// ---------------------------------------------------------------------------------------

/// One operand of a [`wgmma_tma_tile`] block: a tensor map (its generic address; see
/// `oxidnn_params::TmaOperands` for the tensor it describes) and where the block's tiles
/// start in it. `K_MAJOR`: K is the map's innermost dim (else M/N is).
#[derive(Clone, Copy)]
pub struct TmaOperand<const K_MAJOR: bool> {
    pub map: u64,
    /// The block's first row (M for A, N for B).
    pub mn0: u32,
    /// The batch coordinate (0 for an operand broadcast over the batch).
    pub batch: u32,
}

/// One operand of a [`wgmma_tma_tile`] block: issues the TMA copies of its stage tiles.
pub trait TmaTileLoader {
    /// Whether the stage tiles are K-major (rows of 64 K), else MN-major (column blocks of
    /// 64 M/N rows by 64 K).
    const K_MAJOR: bool;

    /// Starts copying the block's `rows` rows (a multiple of [`TMA_BOX`]) of K tile `kt`
    /// (K elements `64 kt ..`) to the [`super::Sw128Atoms`] stage tile at `stage`: rows
    /// `64 i ..` at `64 i * 128` bytes, all of them completing on the barrier at `bar`
    /// (`rows * 128` bytes, zeros outside the operand included).
    ///
    /// # Safety
    /// Run by one thread; the TMA copies' contract ([`tma_load_3d`]) for every box.
    unsafe fn load(&self, stage: u32, kt: u32, rows: u32, bar: u32);
}

impl<const K_MAJOR: bool> TmaTileLoader for TmaOperand<K_MAJOR> {
    const K_MAJOR: bool = K_MAJOR;

    #[inline(always)]
    unsafe fn load(&self, stage: u32, kt: u32, rows: u32, bar: u32) {
        let k = kt * TMA_BOX;
        let mut row = 0;
        while row < rows {
            let mn = self.mn0 + row;
            let coords = if K_MAJOR {
                [k, mn, self.batch]
            } else {
                [mn, k, self.batch]
            };
            tma_load_3d(stage + row * ATOM_ROW, self.map, coords, bar);
            row += TMA_BOX;
        }
    }
}

/// Consumer warpgroups of a [`wgmma_tma_tile`] block.
const CONSUMERS: u32 = 2;
/// Registers per thread of a one-block-per-SM [`wgmma_tma_tile`] block at launch (384
/// threads; build.rs declares `.maxntid 384` + `.minnctapersm 1`): 65536 / 384, rounded
/// down to a multiple of 8. ptxas compiles the whole kernel within it.
const LAUNCH_REGISTERS: u32 = 168;
/// Registers each producer thread keeps (`setmaxnreg.dec`): one thread issues copies.
const PRODUCER_REGISTERS: u32 = 40;
/// Registers each consumer thread takes (`setmaxnreg.inc`). `setmaxnreg.inc` waits,
/// forever, for registers nobody gives back, so the 256 consumers grow by at most what
/// the 128 producers release.
const CONSUMER_REGISTERS: u32 = 232;
const _: () =
    assert!(2 * (CONSUMER_REGISTERS - LAUNCH_REGISTERS) <= LAUNCH_REGISTERS - PRODUCER_REGISTERS);

/// One block's `128 x BN` tile on `wgmma`, warp-specialised, operands copied by TMA:
/// `acc = A[row0.., :] x B[col0.., :]^T` over K tiles of 64, then every accumulator to
/// `ep`. `NI = BN / 8`; `a` / `b` copy the operands' stage tiles ([`TmaTileLoader`]),
/// 16-bit elements.
///
/// The producer's first thread fills a ring of `STAGES` stages, each guarded by a
/// *full* barrier (its arrival and the stage's bytes) and an *empty* one (one arrival per
/// consumer warpgroup). The two consumer warpgroups wait on *full*, issue the K tile's
/// `wgmma`s, and release a stage once the `wgmma`s that read it retire (one group later);
/// they never compute an address or issue a copy. They then stage their accumulators
/// through the drained stages.
///
/// Shared memory at `smem`: `oxidnn_params::tma_shared_bytes(BN, STAGES)` bytes. Every
/// thread of the block (`oxidnn_params::tma_threads(PER_SM)`) calls it; the kernel
/// declares that many threads and `PER_SM` blocks per SM (build.rs). With one block per
/// SM the producer is a whole warpgroup (384 threads) whose registers `setmaxnreg` moves
/// to the consumers; with two (`BN <= 128`, for short K: one block's pipeline fill and
/// epilogue run while the other multiplies) it is one warp after the consumers (288
/// threads at 112 registers each).
///
/// # Safety
/// The tensor maps are valid, describe 16-bit operands with [`TMA_BOX`]-square boxes,
/// 128-byte swizzled, and stay valid for the launch; the epilogue's own contract; `smem`
/// is the block's shared memory; the device is sm_90a.
#[inline(always)]
pub unsafe fn wgmma_tma_tile<
    E,
    const BN: u32,
    const STAGES: u32,
    const PER_SM: u32,
    const NI: usize,
    LA,
    LB,
    EP,
>(
    a: &LA,
    b: &LB,
    k: u32,
    smem: u32,
    ep: &EP,
    row0: u32,
    col0: u32,
) where
    E: WgmmaElement,
    LA: TmaTileLoader,
    LB: TmaTileLoader,
    EP: Epilogue,
    [[f32; 4]; NI]: Accumulators,
{
    const {
        assert!(NI as u32 * 8 == BN && BN % TMA_BOX == 0 && STAGES >= 2);
        assert!(PER_SM == 1 || (PER_SM == 2 && BN <= 128));
        assert!(TMA_BOX * 2 == MMA_BK_BYTES);
    };
    let bk = MMA_BK_BYTES / E::BYTES;
    let a_stage_bytes = WGMMA_BM * MMA_BK_BYTES;
    let b_stage_bytes = BN * MMA_BK_BYTES;
    let base = (smem + ATOM_BYTES - 1) & !(ATOM_BYTES - 1);
    let a_stage = |s: u32| base + s * a_stage_bytes;
    let b_stage = |s: u32| base + STAGES * a_stage_bytes + s * b_stage_bytes;
    let barriers = base + STAGES * (a_stage_bytes + b_stage_bytes);
    let full = |s: u32| barriers + 8 * s;
    let empty = |s: u32| barriers + 8 * (STAGES + s);
    let tid = thread_idx_x();
    // One block per SM: the producer is warpgroup 0 (its registers go to the consumers);
    // two: it is warp 8, after the consumers, and every thread keeps its launch budget.
    let (producer, consumer_tid) = if PER_SM == 1 {
        (tid < 128, tid.wrapping_sub(128))
    } else {
        (tid >= CONSUMERS * 128, tid)
    };
    let k_tiles = k.div_ceil(bk);

    if tid == 0 {
        for s in 0..STAGES {
            mbarrier_init(full(s), 1);
            mbarrier_init(empty(s), CONSUMERS);
        }
        fence_mbarrier_init();
    }
    sync_threads();

    if producer {
        if PER_SM == 1 {
            set_max_registers::<false, PRODUCER_REGISTERS>();
        }
        if tid == if PER_SM == 1 { 0 } else { CONSUMERS * 128 } {
            for kt in 0..k_tiles {
                let s = kt % STAGES;
                if kt >= STAGES {
                    // Both consumers retired their reads of the stage's previous tile.
                    mbarrier_wait(empty(s), (kt / STAGES - 1) & 1);
                }
                mbarrier_arrive_expect_tx(full(s), a_stage_bytes + b_stage_bytes);
                a.load(a_stage(s), kt, WGMMA_BM, full(s));
                b.load(b_stage(s), kt, BN, full(s));
            }
        }
        sync_warp();
    } else {
        if PER_SM == 1 {
            set_max_registers::<true, CONSUMER_REGISTERS>();
        }
        let wg_row = (consumer_tid / 128) * WG_ROWS;
        let trans = (!LA::K_MAJOR, !LB::K_MAJOR);
        let release = |s: u32| {
            if consumer_tid % 128 == 0 {
                mbarrier_arrive(empty(s));
            }
            sync_warp();
        };
        let mut acc = [[0f32; 4]; NI];
        for kt in 0..k_tiles {
            let s = kt % STAGES;
            mbarrier_wait(full(s), (kt / STAGES) & 1);
            let (da, a_step) = operand_descriptor(LA::K_MAJOR, a_stage(s), wg_row, bk);
            let (db, b_step) = operand_descriptor(LB::K_MAJOR, b_stage(s), 0, bk);
            acc.fence_operands();
            wgmma_fence();
            unrolled!(ks in (MMA_BK_BYTES / 2 / WGMMA_K) as usize => {
                let ks = ks as u32;
                acc.mma(E::INPUT, trans, da.offset(ks * a_step), db.offset(ks * b_step), true);
            });
            wgmma_commit_group();
            // Tile kt's wgmmas run on; tile kt - 1's have retired: its stage is free.
            wgmma_wait::<1>();
            acc.fence_operands();
            if kt > 0 {
                release((kt - 1) % STAGES);
            }
        }
        wgmma_wait::<0>();
        acc.fence_operands();
        // Every copy has landed (each stage's full barrier was waited for) and both
        // consumer warpgroups are done reading: the stages become the epilogue's staging
        // area, 16 rows of BN per warp.
        bar_sync(1, CONSUMERS * 128);
        let warp = consumer_tid / 32;
        let stage = base + warp * mma_stage_bytes(1, BN);
        let warp_row = wg_row + (warp % 4) * 16;
        store_warp_tile(&[acc], stage, ep, (row0 + warp_row, col0));
    }
}
