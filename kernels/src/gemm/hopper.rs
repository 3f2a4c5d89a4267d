//! The Hopper tensor-core core (`sm_90a`): [`wgmma_tile`], `wgmma` on operand tiles staged
//! in `wgmma`'s 128-byte-swizzled shared-memory layout ([`super::Sw128Atoms`]).
//!
//! A block is two warpgroups; warpgroup `w` computes rows `64 w ..` of the `128 x BN`
//! output tile with one `wgmma.m64nBNk16` per 16 of K, both operands read from shared
//! memory, accumulators (`BN / 2` f32 per thread) in registers. Every thread also copies:
//! `cp.async` fills a ring of `STAGES` stages `STAGES - 2` K tiles ahead. Per K tile, after
//! one barrier: the tile's `wgmma`s are issued (queued behind the previous tile's), then
//! the copies of a later tile, then the previous tile's `wgmma`s are waited for.

use super::{mma_stage_bytes, store_warp_tile, Epilogue, MmaElement, TileLoader};
use crate::device::hopper::{
    fence_proxy_async_shared, wgmma_commit_group, wgmma_fence, wgmma_wait, Accumulators,
    SmemDescriptor, WgmmaInput,
};
use crate::device::{cp_async_commit, cp_async_wait, sync_threads, thread_idx_x};
use crate::element::{Bf16, F16};
use crate::unrolled;
use oxidnn_params::{MMA_BK_BYTES, WGMMA_BM};

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
