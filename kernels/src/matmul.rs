//! Matrix multiply: `D = act(alpha * op(A) op(B) + beta * C + bias + residual_scale * Z)`,
//! batched (see [`oxidnn_params::MatmulParams`] and [`EpilogueParams`]).
//!
//! Entry points, all `(params, a, b, d, bias, z)`:
//! * `matmul_mma_<BMxBN>_<la><lb>_<f16|bf16|tf32>`: tensor cores ([`mma_tile`]). `la`/`lb`
//!   say how each operand is copied: `k` = K contiguous (`cp.async` into a K-major tile),
//!   `n` = M or N contiguous (MN-major tile), `gg` = any strides or alignment (element
//!   gathers).
//! * `matmul_fma_<BMxBN>_<a><b>_f32`: exact f32 on CUDA cores ([`fma_tile_async`]), any
//!   strides; per operand `s` (word copies, [`StridedCopy`]) or `n` (16-byte copies of an
//!   M/N-contiguous aligned operand, [`ChunkCopy`]).
//! * `wgmma_matmul_128x<BN>_<la><lb>_<f16|bf16>` (the `sm90a` build: family `wgmma`, a
//!   module of its own that only Hopper loads): `wgmma` tensor cores, `k`/`n` copy modes.

use crate::device::{
    add_bytes, block_idx_x, block_idx_y, cp_async_16, cp_async_ca, dynamic_smem, grid_dim_y,
    st_shared_v4, sync_threads, thread_idx_x,
};
use crate::element::{Bf16, Element, F16};
use crate::epilogue;
use crate::gemm::{
    fma_tile_async, mma_stage_bytes, mma_tile, swizzled, Epilogue, MmaElement, MmaShape,
    RowSwizzled, SmemLayout, Tf32, TileLoader, FMA_BK, RUN,
};
use crate::unrolled;
#[cfg(feature = "sm90a")]
use crate::{
    device::hopper::Accumulators,
    gemm::hopper::{wgmma_tile, wgmma_tma_tile, TmaOperand, WgmmaElement},
    gemm::Sw128Atoms,
};
use oxidnn_params::{
    fma_matmul_thread_tile, fma_matmul_threads, mma_shared_bytes_staged, mma_stages, mma_threads,
    tile_coords, BiasMode, EpilogueParams, MatmulParams, OperandLayout, OutputType, FMA_STAGES,
    MMA_BK_BYTES, MMA_SHORT_K_STAGES,
};
#[cfg(feature = "sm90a")]
use oxidnn_params::{
    tma_shared_bytes, tma_stages, wgmma_shared_bytes, wgmma_stages, TensorMap, TmaOperands,
    WGMMA_BM, WGMMA_THREADS,
};

/// One operand of one block: the `rows x k` matrix starting at the block's first row (M for
/// A, N for B) in the block's batch; strides in elements.
#[derive(Clone, Copy)]
pub struct Operand {
    base: *const u8,
    stride_mn: u64,
    stride_k: u64,
    /// Rows of the operand from the block's first row on (may exceed the tile).
    rows: u32,
    k: u32,
}

impl Operand {
    /// The operand whose element `(mn, k)` lies at `base + (mn * stride_mn + k * stride_k)`
    /// elements, `rows` rows from `base` on and `k` long (the implicit GEMM's filter).
    #[inline(always)]
    pub fn new(base: *const u8, stride_mn: u64, stride_k: u64, rows: u32, k: u32) -> Self {
        Self {
            base,
            stride_mn,
            stride_k,
            rows,
            k,
        }
    }

    #[inline(always)]
    unsafe fn at(
        ptr: *const u8,
        l: &OperandLayout,
        batch: u32,
        row0: u32,
        extent: u32,
        k: u32,
        bytes: u32,
    ) -> Self {
        let offset = batch as u64 * l.batch + row0 as u64 * l.mn;
        Self {
            base: ptr.add((offset * bytes as u64) as usize),
            stride_mn: l.mn,
            stride_k: l.k,
            rows: extent - row0,
            k,
        }
    }

    #[inline(always)]
    unsafe fn element_ptr(&self, mn: u32, k: u32, bytes: u32) -> *const u8 {
        let e = mn as u64 * self.stride_mn + k as u64 * self.stride_k;
        self.base.add((e * bytes as u64) as usize)
    }
}

/// A loader made from an [`Operand`].
pub trait MatmulLoader: TileLoader {
    fn new(op: Operand) -> Self;
}

/// Where this thread's copy slots of an operand tile lie, computed once per tile. Slot `i`
/// of K tile `kt` covers element `(mn0 + i * mn_step, kt * bk + k0 + i * k_step)` (one of the
/// two steps is 0) at `ptr + kt * tile_step + i * slot_step` bytes.
#[derive(Clone, Copy)]
struct Slots {
    ptr: *const u8,
    slot_step: u64,
    tile_step: u64,
    mn0: u32,
    mn_step: u32,
    k0: u32,
    k_step: u32,
}

impl Slots {
    /// Slots of threads laid over a tile whose rows (`rows_along_k` false: rows are MN,
    /// `row_len` K elements each; true: rows are K, `row_len` MN elements each) are cut in
    /// units of `unit` elements: thread `t`'s slot `i` is unit `t + i * threads` in row-major
    /// order.
    #[inline(always)]
    fn new(
        op: &Operand,
        rows_along_k: bool,
        row_len: u32,
        unit: u32,
        threads: u32,
        bk: u32,
        bytes: u32,
    ) -> Self {
        let units = row_len / unit;
        let tid = thread_idx_x();
        let (row, col) = (tid / units, (tid % units) * unit);
        let row_step = threads / units;
        let (mn0, k0, mn_step, k_step) = if rows_along_k {
            (col, row, 0, row_step)
        } else {
            (row, col, row_step, 0)
        };
        let off = mn0 as u64 * op.stride_mn + k0 as u64 * op.stride_k;
        let slot = mn_step as u64 * op.stride_mn + k_step as u64 * op.stride_k;
        Self {
            ptr: op.base.wrapping_add((off * bytes as u64) as usize),
            slot_step: slot * bytes as u64,
            tile_step: bk as u64 * op.stride_k * bytes as u64,
            mn0,
            mn_step,
            k0,
            k_step,
        }
    }

    /// `(address, mn, k)` of slot `i` of K tile `kt`, given `tile = kt * tile_step`.
    #[inline(always)]
    fn slot(&self, i: u32, kt: u32, bk: u32, tile: u64) -> (*const u8, u32, u32) {
        let p = self
            .ptr
            .wrapping_add((tile + i as u64 * self.slot_step) as usize);
        let (mn, k) = self.coords(i, kt, bk);
        (p, mn, k)
    }

    /// `(mn, k)` of slot `i` of K tile `kt`.
    #[inline(always)]
    fn coords(&self, i: u32, kt: u32, bk: u32) -> (u32, u32) {
        (
            self.mn0 + i * self.mn_step,
            kt * bk + self.k0 + i * self.k_step,
        )
    }
}

/// `cp.async` copies of an operand whose K (when `K_MAJOR`) or MN elements are contiguous,
/// with 16-byte aligned base and other stride: whole chunks, zero-filled past the edges.
/// `ROWS x BK` tiles, `THREADS` threads, `SLOTS` chunks per thread, laid out in shared
/// memory as `L` says.
pub struct StridedTile<
    E,
    const K_MAJOR: bool,
    const ROWS: u32,
    const BK: u32,
    const THREADS: u32,
    const SLOTS: usize,
    L = RowSwizzled,
> {
    op: Operand,
    slots: Slots,
    _e: core::marker::PhantomData<(E, L)>,
}

impl<
        E: MmaElement,
        const K_MAJOR: bool,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
    > MatmulLoader for StridedTile<E, K_MAJOR, ROWS, BK, THREADS, SLOTS, L>
{
    #[inline(always)]
    fn new(op: Operand) -> Self {
        // Shared rows run along K (K-major: ROWS rows of BK) or along MN (BK rows of ROWS).
        let row_len = if K_MAJOR { BK } else { ROWS };
        let slots = Slots::new(&op, !K_MAJOR, row_len, E::PER_CHUNK, THREADS, BK, E::BYTES);
        Self {
            op,
            slots,
            _e: core::marker::PhantomData,
        }
    }
}

impl<
        E: MmaElement,
        const K_MAJOR: bool,
        const ROWS: u32,
        const BK: u32,
        const THREADS: u32,
        const SLOTS: usize,
        L: SmemLayout,
    > TileLoader for StridedTile<E, K_MAJOR, ROWS, BK, THREADS, SLOTS, L>
{
    const K_MAJOR: bool = K_MAJOR;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let per = E::PER_CHUNK;
        let op = &self.op;
        let tile = kt as u64 * self.slots.tile_step;
        let (tile_rows, row_chunks) = if K_MAJOR {
            (ROWS, BK / per)
        } else {
            (BK, ROWS / per)
        };
        unrolled!(i in SLOTS => {
            let id = thread_idx_x() + i as u32 * THREADS;
            let (r, c) = (id / row_chunks, id % row_chunks);
            let (src, mn, k) = self.slots.slot(i as u32, kt, BK, tile);
            // Elements of this chunk inside the operand (the chunk runs along K or MN).
            let valid = if mn >= op.rows || k >= op.k {
                0
            } else if K_MAJOR {
                (op.k - k).min(per)
            } else {
                (op.rows - mn).min(per)
            };
            let src = if valid > 0 { src } else { op.base };
            cp_async_16(dst + L::offset(r, c, tile_rows, row_chunks), src, valid * E::BYTES);
        });
    }
}

/// Element-by-element copies of an operand with any strides and alignment into a K-major
/// tile (synchronous: the slow path for layouts `cp.async` cannot take).
pub struct GatherTile<E, const ROWS: u32, const BK: u32, const THREADS: u32> {
    op: Operand,
    _e: core::marker::PhantomData<E>,
}

impl<E: MmaElement, const ROWS: u32, const BK: u32, const THREADS: u32> MatmulLoader
    for GatherTile<E, ROWS, BK, THREADS>
{
    #[inline(always)]
    fn new(op: Operand) -> Self {
        Self {
            op,
            _e: core::marker::PhantomData,
        }
    }
}

impl<E: MmaElement, const ROWS: u32, const BK: u32, const THREADS: u32> TileLoader
    for GatherTile<E, ROWS, BK, THREADS>
{
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        let per = E::PER_CHUNK;
        let op = &self.op;
        let row_chunks = BK / per;
        unrolled!(i in (ROWS * row_chunks / THREADS) as usize => {
            let id = thread_idx_x() + i as u32 * THREADS;
            let (r, c) = (id / row_chunks, id % row_chunks);
            let k0 = kt * BK + c * per;
            let mut words = [0u32; 4];
            unrolled!(e in per as usize => {
                let e = e as u32;
                let k = k0 + e;
                if r < op.rows && k < op.k {
                    let p = op.element_ptr(r, k, E::BYTES);
                    if E::BYTES == 2 {
                        words[(e / 2) as usize] |= (*(p as *const u16) as u32) << (16 * (e % 2));
                    } else {
                        words[e as usize] = *(p as *const u32);
                    }
                }
            });
            st_shared_v4(dst + swizzled(r, c, row_chunks), words);
        });
    }
}

/// An f32 operand's copies for [`fma_tile_async`]: this thread's `cp.async`s of one K tile
/// into a `[k][mn]` stage (rows of `ROWS + 4` floats), bounds-checked or not. Every
/// `FmaCopy` is a [`TileLoader`] that skips the checks where a K tile lies inside the
/// operand (every tile of a full block but the last of a ragged K; SASS: ~4 instructions
/// per copy instead of ~12).
trait FmaCopy {
    /// Whether the operand has all of the tile's rows.
    fn full_rows(&self) -> bool;
    /// The operand's K.
    fn k(&self) -> u32;
    /// This thread's copies of K tile `kt` into the stage at `dst`; unless `CHECKED`, all
    /// inside the operand.
    ///
    /// # Safety
    /// As [`TileLoader::load`]; without `CHECKED`, `kt` is below `inside_tiles`.
    unsafe fn copy<const CHECKED: bool>(&self, dst: u32, kt: u32);
}

impl<C: FmaCopy> TileLoader for C {
    /// `[k][mn]`: MN contiguous in the stage.
    const K_MAJOR: bool = false;

    #[inline(always)]
    unsafe fn load(&self, dst: u32, kt: u32) {
        if kt < self.inside_tiles() {
            self.copy::<false>(dst, kt)
        } else {
            self.copy::<true>(dst, kt)
        }
    }

    #[inline(always)]
    fn inside_tiles(&self) -> u32 {
        if self.full_rows() {
            self.k() / FMA_BK
        } else {
            0
        }
    }

    #[inline(always)]
    unsafe fn load_inside(&self, dst: u32, kt: u32) {
        self.copy::<false>(dst, kt)
    }
}

/// Where this thread's copy slots of K tile `kt` begin: `ptr + kt * tile_step`, the
/// product in the uniform datapath, the sum one opaque addition ([`add_bytes`]). The
/// copies walk on from it slot by slot with [`add_bytes`] too, never by `i * slot_step`.
#[inline(always)]
fn first_slot(slots: &Slots, kt: u32) -> *const u8 {
    add_bytes(slots.ptr, kt as u64 * slots.tile_step)
}

/// Word copies of an f32 operand with any strides (`cp.async` of 4 bytes), zero-filled
/// outside the operand. K fastest across threads when K is contiguous, else MN fastest (as
/// [`crate::gemm::fma_slot`] lays slots out), so that a warp's global reads coalesce
/// either way; its shared writes land in distinct banks either way (K-fast: 8 k rows, 4
/// floats apart in bank order, times 4 mn).
pub struct StridedCopy<const ROWS: u32, const THREADS: u32> {
    op: Operand,
    slots: Slots,
    full_rows: bool,
}

impl<const ROWS: u32, const THREADS: u32> StridedCopy<ROWS, THREADS> {
    #[inline(always)]
    pub fn new(op: Operand) -> Self {
        const {
            assert!(THREADS % FMA_BK == 0 && THREADS % ROWS == 0);
            assert!((ROWS * FMA_BK) % THREADS == 0);
        }
        let slots = if op.stride_k == 1 {
            Slots::new(&op, false, FMA_BK, 1, THREADS, FMA_BK, 4)
        } else {
            Slots::new(&op, true, ROWS, 1, THREADS, FMA_BK, 4)
        };
        let full_rows = op.rows >= ROWS;
        Self {
            op,
            slots,
            full_rows,
        }
    }
}

impl<const ROWS: u32, const THREADS: u32> FmaCopy for StridedCopy<ROWS, THREADS> {
    #[inline(always)]
    fn full_rows(&self) -> bool {
        self.full_rows
    }

    #[inline(always)]
    fn k(&self) -> u32 {
        self.op.k
    }

    #[inline(always)]
    unsafe fn copy<const CHECKED: bool>(&self, dst: u32, kt: u32) {
        let mut p = first_slot(&self.slots, kt);
        unrolled!(i in (ROWS * FMA_BK / THREADS) as usize => {
            let (mn, k) = self.slots.coords(i as u32, kt, FMA_BK);
            let local_k = self.slots.k0 + i as u32 * self.slots.k_step;
            let inside = !CHECKED || (mn < self.op.rows && k < self.op.k);
            // In the stage: local_k < FMA_BK and mn < ROWS by the slot layout.
            cp_async_ca::<4>(dst + (local_k * (ROWS + 4) + mn) * 4, p, if inside { 4 } else { 0 });
            p = add_bytes(p, self.slots.slot_step);
        });
    }
}

/// [`StridedCopy`] for an operand whose MN elements are contiguous, with its K and batch
/// strides and its address 16-byte aligned: 16-byte `cp.async`s of 4 consecutive MN
/// elements at one k (a quarter of [`StridedCopy`]'s copies), zero-filled past the
/// operand's rows and K. Threads run along MN, so a warp reads 512 contiguous bytes and
/// writes 32 consecutive chunks of one shared row (4 wavefronts, no conflicts).
pub struct ChunkCopy<const ROWS: u32, const THREADS: u32> {
    op: Operand,
    slots: Slots,
    full_rows: bool,
}

impl<const ROWS: u32, const THREADS: u32> ChunkCopy<ROWS, THREADS> {
    #[inline(always)]
    fn new(op: Operand) -> Self {
        const {
            assert!(ROWS % 4 == 0 && THREADS % (ROWS / 4) == 0);
            assert!((ROWS / 4 * FMA_BK) % THREADS == 0);
        }
        let slots = Slots::new(&op, true, ROWS, 4, THREADS, FMA_BK, 4);
        let full_rows = op.rows >= ROWS;
        Self {
            op,
            slots,
            full_rows,
        }
    }
}

impl<const ROWS: u32, const THREADS: u32> FmaCopy for ChunkCopy<ROWS, THREADS> {
    #[inline(always)]
    fn full_rows(&self) -> bool {
        self.full_rows
    }

    #[inline(always)]
    fn k(&self) -> u32 {
        self.op.k
    }

    #[inline(always)]
    unsafe fn copy<const CHECKED: bool>(&self, dst: u32, kt: u32) {
        let mut p = first_slot(&self.slots, kt);
        unrolled!(i in (ROWS / 4 * FMA_BK / THREADS) as usize => {
            let (mn, k) = self.slots.coords(i as u32, kt, FMA_BK);
            let local_k = self.slots.k0 + i as u32 * self.slots.k_step;
            // In the stage: local_k < FMA_BK and mn + 3 < ROWS by the slot layout; the
            // chunk (mn a multiple of 4, rows of ROWS + 4 floats) is 16-byte aligned.
            let at = dst + (local_k * (ROWS + 4) + mn) * 4;
            if CHECKED {
                let valid = if mn < self.op.rows && k < self.op.k {
                    (self.op.rows - mn).min(4)
                } else {
                    0
                };
                // A chunk with nothing to read still needs a valid address.
                let src = if valid > 0 { p } else { self.op.base };
                cp_async_16(at, src, 4 * valid);
            } else {
                cp_async_16(at, p, 16);
            }
            p = add_bytes(p, self.slots.slot_step);
        });
    }
}

/// The matmul epilogue of one block's batch: bounds, blending, bias, residual, activation,
/// conversion to the output type. `WIDE`: the drain hands it runs of 8 columns (16-byte
/// stores): the 16-bit-input and exact-f32 kernels (f16 4096x4096x16: 51 -> 36 us with
/// the short-K tile; f32 RNN shapes 1.2x faster than with pairs); the tf32 kernels take
/// pairs (with runs they ran 2-24% slower, H100).
pub struct MatmulEpilogue<const WIDE: bool> {
    p: EpilogueParams,
    m: u32,
    n: u32,
    d: *mut u8,
    bias: *const u8,
    z: *const u8,
}

impl<const WIDE: bool> MatmulEpilogue<WIDE> {
    /// The epilogue of batch `batch` of the problem `p` describes, writing to `d`.
    #[inline(always)]
    unsafe fn of_batch(
        p: &MatmulParams,
        batch: u32,
        (d, bias, z): (*mut u8, *const u8, *const u8),
    ) -> Self {
        let ep = &p.epilogue;
        let out_bytes = match OutputType::from_u32(ep.ops.out_type) {
            OutputType::F32 => 4,
            _ => 2,
        };
        Self {
            p: *ep,
            m: p.m,
            n: p.n,
            d: d.add((batch as u64 * ep.out.batch * out_bytes) as usize),
            bias,
            z: z.add((batch as u64 * ep.residual.batch * out_bytes) as usize),
        }
    }

    #[inline(always)]
    unsafe fn finish<O: Element>(&self, r: u32, c: u32, v: [f32; 2]) {
        let p = &self.p;
        let out = self.d as *mut O;
        let at = r as u64 * p.out.row + c as u64 * p.out.col;
        let both = c + 1 < self.n;
        // Paired accesses need the pair's alignment, which batch offsets and odd strides
        // can break.
        let paired = both
            && p.out.col == 1
            && (out.add(at as usize) as usize) % (2 * core::mem::size_of::<O>()) == 0;
        let count = if both { 2 } else { 1 };
        let x = epilogue::apply(
            &p.ops,
            v,
            O::LOW_PRECISION,
            || {
                if paired {
                    O::load_pair(out.add(at as usize))
                } else {
                    let second = if both {
                        O::load(out.add((at + p.out.col) as usize))
                    } else {
                        0.0
                    };
                    [O::load(out.add(at as usize)), second]
                }
            },
            |mode| {
                let bias = self.bias as *const O;
                let mut b = [0.0; 2];
                if mode == BiasMode::PerRow {
                    b = [O::load(bias.add(r as usize)); 2];
                } else {
                    unrolled!(j in 2 => if j < count {
                        b[j] = O::load(bias.add(c as usize + j));
                    });
                }
                b
            },
            || {
                let z = self.z as *const O;
                let zl = &p.residual;
                let mut zv = [0.0; 2];
                unrolled!(j in 2 => if j < count {
                    let zo = r as u64 * zl.row + (c as u64 + j as u64) * zl.col;
                    zv[j] = O::load(z.add(zo as usize));
                });
                zv
            },
        );
        if paired {
            O::store_pair(out.add(at as usize), x);
        } else {
            O::store(out.add(at as usize), x[0]);
            if both {
                O::store(out.add((at + p.out.col) as usize), x[1]);
            }
        }
    }
}

impl<const WIDE: bool> MatmulEpilogue<WIDE> {
    /// [`Epilogue::store_run`] for `O` outputs: one or two 16-byte stores when the run lies
    /// inside the output, along a unit-stride row, 16-byte aligned; else pair by pair.
    #[inline(always)]
    unsafe fn finish_run<O: Element>(&self, r: u32, c: u32, v: [f32; RUN as usize]) {
        const L: usize = RUN as usize;
        let p = &self.p;
        let out = self.d as *mut O;
        let at = out.add((r as u64 * p.out.row + c as u64 * p.out.col) as usize);
        let size = core::mem::size_of::<O>();
        // Elements per 16-byte vector (8 or 4).
        let per = 16 / size;
        if c + RUN > self.n || p.out.col != 1 || (at as usize) % 16 != 0 {
            // Pair by pair, in a loop with a run-time trip count so that it stays rolled:
            // one more copy of the pair epilogue, not four.
            const _: () = assert!(RUN == 8);
            let pairs = (self.n - c).min(RUN).div_ceil(2);
            let mut j = 0;
            while j < pairs {
                let pair = match j {
                    0 => [v[0], v[1]],
                    1 => [v[2], v[3]],
                    2 => [v[4], v[5]],
                    _ => [v[6], v[7]],
                };
                self.finish::<O>(r, c + 2 * j, pair);
                j += 1;
            }
            return;
        }
        let x = epilogue::apply(
            &p.ops,
            v,
            O::LOW_PRECISION,
            || {
                // One vector of 8 16-bit elements, or two of 4 f32 ones.
                if per == L {
                    O::unpack::<L>(O::load_raw::<L>(at, false))
                } else {
                    let lo = O::unpack::<4>(O::load_raw::<4>(at, false));
                    let hi = O::unpack::<4>(O::load_raw::<4>(at.add(4), false));
                    core::array::from_fn(|i| if i < 4 { lo[i % 4] } else { hi[i % 4] })
                }
            },
            |mode| {
                let bias = self.bias as *const O;
                if mode == BiasMode::PerRow {
                    [O::load(bias.add(r as usize)); L]
                } else {
                    core::array::from_fn(|j| O::load(bias.add(c as usize + j)))
                }
            },
            || {
                let z = self.z as *const O;
                let zl = &p.residual;
                core::array::from_fn(|j| {
                    let zo = r as u64 * zl.row + (c as u64 + j as u64) * zl.col;
                    O::load(z.add(zo as usize))
                })
            },
        );
        if per == L {
            O::store_vec::<L>(at, x);
        } else {
            O::store_vec::<4>(at, core::array::from_fn(|i| x[i % 4]));
            O::store_vec::<4>(at.add(4), core::array::from_fn(|i| x[4 + i % 4]));
        }
    }
}

impl<const W: bool> Epilogue for MatmulEpilogue<W> {
    const WIDE: bool = W;

    #[inline(always)]
    unsafe fn store_run(&self, r: u32, c: u32, v: [f32; RUN as usize]) {
        if r >= self.m || c >= self.n {
            return;
        }
        match OutputType::from_u32(self.p.ops.out_type) {
            OutputType::F32 => self.finish_run::<f32>(r, c, v),
            OutputType::F16 => self.finish_run::<F16>(r, c, v),
            OutputType::Bf16 => self.finish_run::<Bf16>(r, c, v),
        }
    }

    #[inline(always)]
    fn extent(&self) -> (u32, u32) {
        (self.m, self.n)
    }

    #[inline(always)]
    unsafe fn store_pair(&self, r: u32, c: u32, v: [f32; 2]) {
        if r >= self.m || c >= self.n {
            return;
        }
        match OutputType::from_u32(self.p.ops.out_type) {
            OutputType::F32 => self.finish::<f32>(r, c, v),
            OutputType::F16 => self.finish::<F16>(r, c, v),
            OutputType::Bf16 => self.finish::<Bf16>(r, c, v),
        }
    }
}

/// Runs `tile(la, lb, epilogue, row0, col0)` for this block's output tile in each of its
/// batches.
#[inline(always)]
unsafe fn for_each_batch<const WIDE: bool>(
    p: &MatmulParams,
    (bm, bn, in_bytes): (u32, u32, u32),
    (a, b, d, bias, z): (*const u8, *const u8, *mut u8, *const u8, *const u8),
    mut tile: impl FnMut(Operand, Operand, &MatmulEpilogue<WIDE>, u32, u32),
) {
    let (tm, tn) = tile_coords(block_idx_x(), p.tiles_m, p.tiles_n);
    let (row0, col0) = (tm * bm, tn * bn);
    let mut batch = block_idx_y();
    while batch < p.batch {
        let la = Operand::at(a, &p.a, batch, row0, p.m, p.k, in_bytes);
        let lb = Operand::at(b, &p.b, batch, col0, p.n, p.k, in_bytes);
        let epilogue = MatmulEpilogue::<WIDE>::of_batch(p, batch, (d, bias, z));
        tile(la, lb, &epilogue, row0, col0);
        batch += grid_dim_y();
        // The next batch's first copies reuse stages other warps may still be reading.
        sync_threads();
    }
}

/// A tensor-core block tile: `BM x BN x BK`, `WM x WN` warps, `STAGES` deep.
pub struct MmaTileShape<
    const BM: u32,
    const BN: u32,
    const BK: u32,
    const WM: u32,
    const WN: u32,
    const STAGES: u32,
>;

impl<
        const BM: u32,
        const BN: u32,
        const BK: u32,
        const WM: u32,
        const WN: u32,
        const STAGES: u32,
    > MmaShape for MmaTileShape<BM, BN, BK, WM, WN, STAGES>
{
    const BM: u32 = BM;
    const BN: u32 = BN;
    const BK: u32 = BK;
    const WARPS_M: u32 = WM;
    const WARPS_N: u32 = WN;
    const STAGES: u32 = STAGES;
}

#[inline(always)]
unsafe fn matmul_mma<E, S, const MI: usize, const NI: usize, LA, LB, const WIDE: bool>(
    p: &MatmulParams,
    ptrs: (*const u8, *const u8, *mut u8, *const u8, *const u8),
) where
    E: MmaElement,
    S: MmaShape,
    LA: MatmulLoader,
    LB: MatmulLoader,
{
    let smem = dynamic_smem();
    for_each_batch(
        p,
        (S::BM, S::BN, E::BYTES),
        ptrs,
        #[inline(always)]
        |a, b, ep, row0, col0| {
            mma_tile::<E, S, MI, NI, LA, LB, MatmulEpilogue<WIDE>>(
                &LA::new(a),
                &LB::new(b),
                p.k,
                smem,
                ep,
                row0,
                col0,
            )
        },
    );
}

/// Chunks each of `threads` threads copies per `rows x bk` tile.
const fn slots(rows: u32, bk: u32, per_chunk: u32, threads: u32) -> usize {
    (rows * bk / per_chunk / threads) as usize
}

/// Stamps out the tensor-core entry points `<name>_<la><lb>_<suffix>` of one element type
/// and tile: `(name, suffix, Element, BM, BN, BK, WARPS_M, WARPS_N, STAGES, MI, NI)`. The
/// name is `matmul_mma_<BM>x<BN>` for the tile's usual depth ([`mma_stages`]), with an
/// `s` appended for the short-K depth ([`MMA_SHORT_K_STAGES`]).
macro_rules! mma_kernels {
    ($name:ident, $dt:ident, $E:ty, $bm:literal, $bn:literal, $bk:literal, $wm:literal,
     $wn:literal, $st:literal, $mi:literal, $ni:literal) => {
        // The tile is what the host launches for it (threads, stages, shared bytes).
        const _: () = assert!(
            $bm == $wm * $mi * 16 && $bn == $wn * $ni * 8 && $ni % 2 == 0
                && 32 * $wm * $wn == mma_threads($bm, $bn)
                && ($st == mma_stages($bm, $bn) || $st == MMA_SHORT_K_STAGES)
                && $bk * <$E as MmaElement>::BYTES == MMA_BK_BYTES
                && mma_stage_bytes($wm * $wn, $ni * 8) <= mma_shared_bytes_staged($bm, $bn, $st)
        );
        mma_kernels!(@one $name, $dt, $E, $bm, $bn, $bk, $wm, $wn, $st, $mi, $ni, k, true, k, true);
        mma_kernels!(@one $name, $dt, $E, $bm, $bn, $bk, $wm, $wn, $st, $mi, $ni, k, true, n, false);
        mma_kernels!(@one $name, $dt, $E, $bm, $bn, $bk, $wm, $wn, $st, $mi, $ni, n, false, k, true);
        mma_kernels!(@one $name, $dt, $E, $bm, $bn, $bk, $wm, $wn, $st, $mi, $ni, n, false, n, false);
        paste::paste! {
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn [<$name _gg_ $dt>](
                p: MatmulParams, a: *const u8, b: *const u8, d: *mut u8, bias: *const u8,
                z: *const u8,
            ) {
                const T: u32 = 32 * $wm * $wn;
                matmul_mma::<
                    $E, MmaTileShape<$bm, $bn, $bk, $wm, $wn, $st>, $mi, $ni,
                    GatherTile<$E, $bm, $bk, T>, GatherTile<$E, $bn, $bk, T>,
                    { <$E as MmaElement>::BYTES == 2 },
                >(&p, (a, b, d, bias, z))
            }
        }
    };
    (@one $name:ident, $dt:ident, $E:ty, $bm:literal, $bn:literal, $bk:literal, $wm:literal,
     $wn:literal, $st:literal, $mi:literal, $ni:literal, $la:ident, $ka:literal, $lb:ident,
     $kb:literal) => {
        paste::paste! {
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn [<$name _ $la $lb _ $dt>](
                p: MatmulParams, a: *const u8, b: *const u8, d: *mut u8, bias: *const u8,
                z: *const u8,
            ) {
                const T: u32 = 32 * $wm * $wn;
                matmul_mma::<
                    $E, MmaTileShape<$bm, $bn, $bk, $wm, $wn, $st>, $mi, $ni,
                    StridedTile<$E, $ka, $bm, $bk, T, { slots($bm, $bk, <$E as MmaElement>::PER_CHUNK, T) }>,
                    StridedTile<$E, $kb, $bn, $bk, T, { slots($bn, $bk, <$E as MmaElement>::PER_CHUNK, T) }>,
                    { <$E as MmaElement>::BYTES == 2 },
                >(&p, (a, b, d, bias, z))
            }
        }
    };
}

/// Stamps out the exact-f32 entry points `matmul_fma_<BM>x<BN>_<a><b>_f32` of a `BM x BN`
/// tile ([`fma_tile_async`], thread tile [`fma_matmul_thread_tile`]), one per pair of
/// operand copy modes: `s` ([`StridedCopy`], any strides) or `n` ([`ChunkCopy`]: MN
/// contiguous, 16-byte aligned).
macro_rules! fma_kernel {
    ($bm:literal, $bn:literal, $($la:ident $lb:ident),+) => {
        $(fma_kernel!(@one $bm, $bn, $la, $lb);)+
    };
    (@loader s, $rows:literal, $t:ident) => { StridedCopy::<$rows, $t> };
    (@loader n, $rows:literal, $t:ident) => { ChunkCopy::<$rows, $t> };
    (@one $bm:literal, $bn:literal, $la:ident, $lb:ident) => {
        paste::paste! {
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn [<matmul_fma_ $bm x $bn _ $la $lb _f32>](
                p: MatmulParams, a: *const u8, b: *const u8, d: *mut u8, bias: *const u8,
                z: *const u8,
            ) {
                const TILE: (u32, u32) = fma_matmul_thread_tile($bm, $bn);
                const T: u32 = fma_matmul_threads($bm, $bn);
                let smem = dynamic_smem();
                for_each_batch::<true>(&p, ($bm, $bn, 4), (a, b, d, bias, z), #[inline(always)] |a, b, ep, row0, col0| {
                    fma_tile_async::<$bm, $bn, { TILE.0 as usize }, { TILE.1 as usize }, FMA_STAGES, _, _, MatmulEpilogue<true>>(
                        &<fma_kernel!(@loader $la, $bm, T)>::new(a),
                        &<fma_kernel!(@loader $lb, $bn, T)>::new(b),
                        p.k,
                        smem,
                        ep,
                        row0,
                        col0,
                    )
                });
            }
        }
    };
}

// The sm_80 build's kernels; the sm90a build (feature `sm90a`) has only the wgmma ones.
#[cfg(not(feature = "sm90a"))]
mod sm80_kernels {
    use super::*;
    mma_kernels!(matmul_mma_128x256, f16, F16, 128, 256, 64, 2, 4, 3, 4, 8);
    mma_kernels!(matmul_mma_128x128, f16, F16, 128, 128, 64, 2, 4, 4, 4, 4);
    mma_kernels!(matmul_mma_64x64, f16, F16, 64, 64, 64, 2, 2, 4, 2, 4);
    mma_kernels!(matmul_mma_64x64s, f16, F16, 64, 64, 64, 2, 2, 2, 2, 4);
    mma_kernels!(matmul_mma_128x256, bf16, Bf16, 128, 256, 64, 2, 4, 3, 4, 8);
    mma_kernels!(matmul_mma_128x128, bf16, Bf16, 128, 128, 64, 2, 4, 4, 4, 4);
    mma_kernels!(matmul_mma_64x64, bf16, Bf16, 64, 64, 64, 2, 2, 4, 2, 4);
    mma_kernels!(matmul_mma_64x64s, bf16, Bf16, 64, 64, 64, 2, 2, 2, 2, 4);
    mma_kernels!(matmul_mma_128x128, tf32, Tf32, 128, 128, 32, 2, 4, 4, 4, 4);
    mma_kernels!(matmul_mma_64x64, tf32, Tf32, 64, 64, 32, 2, 2, 4, 2, 4);
    mma_kernels!(matmul_mma_64x64s, tf32, Tf32, 64, 64, 32, 2, 2, 2, 2, 4);
    fma_kernel!(128, 256, s s, s n, n s, n n);
    fma_kernel!(128, 128, s s, s n, n s, n n);
    fma_kernel!(64, 64, s s);
}

// ---------------------------------------------------------------------------------------
// Hopper: wgmma (sm_90a build only)
// ---------------------------------------------------------------------------------------

/// One block's `WGMMA_BM x BN` tile of each of its batches on `wgmma` ([`wgmma_tile`]).
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn matmul_wgmma<E, const BN: u32, const STAGES: u32, const NI: usize, LA, LB>(
    p: &MatmulParams,
    ptrs: (*const u8, *const u8, *mut u8, *const u8, *const u8),
) where
    E: WgmmaElement,
    LA: MatmulLoader,
    LB: MatmulLoader,
    [[f32; 4]; NI]: Accumulators,
{
    let smem = dynamic_smem();
    for_each_batch(
        p,
        (WGMMA_BM, BN, E::BYTES),
        ptrs,
        #[inline(always)]
        |a, b, ep, row0, col0| {
            wgmma_tile::<E, BN, STAGES, NI, LA, LB, MatmulEpilogue<true>>(
                &LA::new(a),
                &LB::new(b),
                p.k,
                smem,
                ep,
                row0,
                col0,
            )
        },
    );
}

/// Stamps out the `wgmma_matmul_128x<BN>_<la><lb>_<dt>` entry points of one element type
/// and tile width, for each of the four `k`/`n` copy modes of A and B (`cp.async` into
/// [`Sw128Atoms`] tiles: K-major or MN-major, which `wgmma` reads through its transpose
/// flags). Operands that need element gathers stay on the sm_80 kernels.
#[cfg(feature = "sm90a")]
macro_rules! wgmma_kernels {
    ($dt:ident, $E:ty, $bn:literal) => {
        const _: () = assert!(
            mma_stage_bytes(WGMMA_THREADS / 32, $bn) <= wgmma_shared_bytes($bn) - 1024
                && 64 * <$E as MmaElement>::BYTES == MMA_BK_BYTES
        );
        wgmma_kernels!(@one $dt, $E, $bn, k, true, k, true);
        wgmma_kernels!(@one $dt, $E, $bn, k, true, n, false);
        wgmma_kernels!(@one $dt, $E, $bn, n, false, k, true);
        wgmma_kernels!(@one $dt, $E, $bn, n, false, n, false);
    };
    (@one $dt:ident, $E:ty, $bn:literal, $la:ident, $ka:literal, $lb:ident, $kb:literal) => {
        paste::paste! {
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn [<wgmma_matmul_128x $bn _ $la $lb _ $dt>](
                p: MatmulParams, a: *const u8, b: *const u8, d: *mut u8, bias: *const u8,
                z: *const u8,
            ) {
                const T: u32 = WGMMA_THREADS;
                const BK: u32 = MMA_BK_BYTES / <$E as MmaElement>::BYTES;
                const PER: u32 = <$E as MmaElement>::PER_CHUNK;
                matmul_wgmma::<
                    $E, $bn, { wgmma_stages($bn) }, { $bn / 8 },
                    StridedTile<$E, $ka, WGMMA_BM, BK, T, { slots(WGMMA_BM, BK, PER, T) }, Sw128Atoms>,
                    StridedTile<$E, $kb, $bn, BK, T, { slots($bn, BK, PER, T) }, Sw128Atoms>,
                >(&p, (a, b, d, bias, z))
            }
        }
    };
}

/// One block's `WGMMA_BM x BN` tile of batch `blockIdx.y` on the warp-specialised TMA
/// `wgmma` core ([`wgmma_tma_tile`]); `maps` is the generic address of the kernel's
/// [`oxidnn_params::TmaOperands`].
#[cfg(feature = "sm90a")]
#[inline(always)]
unsafe fn matmul_wgmma_tma<
    E,
    const BN: u32,
    const STAGES: u32,
    const PER_SM: u32,
    const NI: usize,
    const KA: bool,
    const KB: bool,
>(
    p: &MatmulParams,
    maps: u64,
    out: (*mut u8, *const u8, *const u8),
) where
    E: WgmmaElement,
    [[f32; 4]; NI]: Accumulators,
{
    let (tm, tn) = tile_coords(block_idx_x(), p.tiles_m, p.tiles_n);
    let (row0, col0) = (tm * WGMMA_BM, tn * BN);
    let batch = block_idx_y();
    let coordinate = |l: &OperandLayout| if l.batch == 0 { 0 } else { batch };
    let a = TmaOperand::<KA> {
        map: maps,
        mn0: row0,
        batch: coordinate(&p.a),
    };
    let b = TmaOperand::<KB> {
        map: maps + core::mem::size_of::<TensorMap>() as u64,
        mn0: col0,
        batch: coordinate(&p.b),
    };
    let ep = MatmulEpilogue::<true>::of_batch(p, batch, out);
    wgmma_tma_tile::<E, BN, STAGES, PER_SM, NI, _, _, _>(
        &a,
        &b,
        p.k,
        dynamic_smem(),
        &ep,
        row0,
        col0,
    );
}

/// Stamps out the `wgmma_matmul_tma_128x<BN>_<la><lb>_<dt>` entry points of one element
/// type and tile width, for each of the four `k`/`n` layouts of A and B:
/// `(params, a, b, d, bias, z, maps)`, `maps` an [`oxidnn_params::TmaOperands`] by value
/// (the operands' addresses are in the maps; the kernel does not read `a` and `b`).
#[cfg(feature = "sm90a")]
macro_rules! wgmma_tma_kernels {
    ($dt:ident, $E:ty, $bn:literal) => {
        const _: () = assert!(
            mma_stage_bytes(8, $bn) <= tma_shared_bytes($bn, 1) - 1024
                && 64 * <$E as MmaElement>::BYTES == MMA_BK_BYTES
        );
        wgmma_tma_kernels!(@one $dt, $E, $bn, k, true, k, true);
        wgmma_tma_kernels!(@one $dt, $E, $bn, k, true, n, false);
        wgmma_tma_kernels!(@one $dt, $E, $bn, n, false, k, true);
        wgmma_tma_kernels!(@one $dt, $E, $bn, n, false, n, false);
    };
    (@one $dt:ident, $E:ty, $bn:literal, $la:ident, $ka:literal, $lb:ident, $kb:literal) => {
        paste::paste! {
            #[no_mangle]
            pub unsafe extern "ptx-kernel" fn [<wgmma_matmul_tma_128x $bn _ $la $lb _ $dt>](
                p: MatmulParams, _a: *const u8, _b: *const u8, d: *mut u8, bias: *const u8,
                z: *const u8, _maps: TmaOperands,
            ) {
                let maps = crate::kernel_param_address!(concat!(
                    stringify!([<wgmma_matmul_tma_128x $bn _ $la $lb _ $dt>]),
                    "_param_6"
                ));
                matmul_wgmma_tma::<
                    $E, $bn, { tma_stages($bn, 1) }, 1, { $bn / 8 }, $ka, $kb,
                >(
                    &p, maps, (d, bias, z),
                )
            }
        }
    };
}

#[cfg(feature = "sm90a")]
mod sm90a_kernels {
    use super::*;
    wgmma_kernels!(f16, F16, 256);
    wgmma_kernels!(f16, F16, 128);
    wgmma_kernels!(bf16, Bf16, 256);
    wgmma_kernels!(bf16, Bf16, 128);
    wgmma_tma_kernels!(f16, F16, 256);
    wgmma_tma_kernels!(f16, F16, 128);
    wgmma_tma_kernels!(f16, F16, 64);
    wgmma_tma_kernels!(bf16, Bf16, 256);
    wgmma_tma_kernels!(bf16, Bf16, 128);
    wgmma_tma_kernels!(bf16, Bf16, 64);
}
