//! The one place that touches device intrinsics and inline PTX.
//!
//! Every `asm!` of the kernels lives here, behind a small safe or documented-unsafe
//! function; op modules use only these wrappers. Naming follows CUDA C++ where it exists.

use core::arch::asm;
use core::arch::nvptx;

#[cfg(feature = "sm90a")]
pub mod hopper;

// ---------------------------------------------------------------------------------------
// Indices
// ---------------------------------------------------------------------------------------

/// `threadIdx.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register; no memory access.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `blockIdx.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `blockIdx.y`.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_y() as u32 }
}

/// `gridDim.y`.
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_y() as u32 }
}

/// `blockDim.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `gridDim.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// The global 1-D thread index, `blockIdx.x * blockDim.x + threadIdx.x`, in 64 bits.
#[inline(always)]
pub fn global_thread_x() -> u64 {
    block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64
}

/// Lane of this thread in its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() & 31
}

/// Warp of this thread in its (1-D) block.
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() >> 5
}

/// Calls `f(i)` for every `i < len` assigned to this thread by a grid-stride loop over the
/// whole 1-D grid.
#[inline(always)]
pub fn grid_stride(len: u64, mut f: impl FnMut(u64)) {
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut i = global_thread_x();
    while i < len {
        f(i);
        i += step;
    }
}

/// As [`grid_stride`], `K` items a turn: `locate` each (where it reads), `fetch` each (the
/// loads alone), then `finish` each with its loads through one [`LoadFence`] over all of
/// them: every load of the turn is issued before the first one is waited on, where ptxas
/// would otherwise wait on each load before it issues the next. A warp's turn covers `32
/// * K` consecutive items, lane `l` taking items `l, l + 32, ..` of them, so each of the
/// turn's loads is as coalesced as one item a thread would be. An item past the end
/// stands in for the turn's first (its loads hit L1) and is not finished. `fetch` must
/// only read; the block's size is a multiple of 32.
#[inline(always)]
pub fn grid_stride_turns<const K: usize, A: Copy + Default, L: Words>(
    len: u64,
    mut locate: impl FnMut(u64) -> A,
    mut fetch: impl FnMut(A) -> L,
    mut finish: impl FnMut(A, L),
) {
    let turn = 32 * K as u64;
    let step = (grid_dim_x() as u64 * block_dim_x() as u64 / 32) * turn;
    let mut first = global_thread_x() / 32 * turn + lane_id() as u64;
    while first < len {
        let item = |k: usize| {
            let i = first + 32 * k as u64;
            if i < len {
                i
            } else {
                first
            }
        };
        // Built by `unrolled!`: straight-line code whatever `fetch`'s size, so the arrays
        // stay in registers.
        let mut at = [A::default(); K];
        crate::unrolled!(k in K => at[k] = locate(item(k)));
        let mut loaded = [L::ZERO; K];
        crate::unrolled!(k in K => loaded[k] = fetch(at[k]));
        let fence = LoadFence::over(&loaded);
        crate::unrolled!(k in K => {
            if k == 0 || item(k) != first {
                finish(at[k], loaded[k].or_each(fence.zero()));
            }
        });
        first += step;
    }
}

/// Zero, computed at run time as `%lanemask_eq & %lanemask_lt` (a lane's own bit and the
/// bits below it): ptxas knows the ranges of special registers such as `%nsmid` and folds
/// arithmetic on them, but not this relation, so what is computed from it is kept. For
/// [`LoadFence`].
#[inline(always)]
fn opaque_zero() -> u32 {
    let z: u32;
    // SAFETY: reads two special registers; no memory is touched.
    unsafe {
        asm!(
            "{{",
            ".reg .b32 lt;",
            "mov.u32 {z}, %lanemask_eq;",
            "mov.u32 lt, %lanemask_lt;",
            "and.b32 {z}, {z}, lt;",
            "}}",
            z = out(reg32) z,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    z
}

/// A value made of 32-bit words (loaded data as raw words: `u32`, arrays, pairs of them),
/// for [`LoadFence`].
pub trait Words: Copy {
    /// Every word 0.
    const ZERO: Self;
    /// The OR of every word.
    fn fold(&self) -> u32;
    /// Every word ORed with `z`.
    fn or_each(self, z: u32) -> Self;
}

impl Words for u32 {
    const ZERO: Self = 0;
    #[inline(always)]
    fn fold(&self) -> u32 {
        *self
    }
    #[inline(always)]
    fn or_each(self, z: u32) -> Self {
        self | z
    }
}

impl<W: Words, const N: usize> Words for [W; N] {
    const ZERO: Self = [W::ZERO; N];
    #[inline(always)]
    fn fold(&self) -> u32 {
        let mut all = 0;
        crate::unrolled!(k in N => all |= self[k].fold());
        all
    }
    #[inline(always)]
    fn or_each(mut self, z: u32) -> Self {
        crate::unrolled!(k in N => self[k] = self[k].or_each(z));
        self
    }
}

impl<A: Words, B: Words> Words for (A, B) {
    const ZERO: Self = (A::ZERO, B::ZERO);
    #[inline(always)]
    fn fold(&self) -> u32 {
        self.0.fold() | self.1.fold()
    }
    #[inline(always)]
    fn or_each(self, z: u32) -> Self {
        (self.0.or_each(z), self.1.or_each(z))
    }
}

/// A zero that depends on a group of loaded words, so that every use of a word passed
/// through it ([`Words::or_each`] with [`LoadFence::zero`]) waits for the whole group:
/// the group's loads are then all issued before the first wait. (ptxas otherwise places a
/// load's first uses, a 16-bit type's unpacking say, right after it, reuses its registers
/// for the next load, and that load waits for the first: one load in flight where there
/// could be several.) The OR of zero cannot be removed: the zero is [`opaque_zero`].
#[derive(Clone, Copy)]
pub struct LoadFence(u32);

impl LoadFence {
    /// The fence over every word of `group`.
    #[inline(always)]
    pub fn over(group: &impl Words) -> Self {
        Self(group.fold() & opaque_zero())
    }

    /// Zero, once every word of the group has landed.
    #[inline(always)]
    pub fn zero(self) -> u32 {
        self.0
    }
}

/// Repeats `$body` once per listed index with `$i` bound to that literal, so that arrays
/// indexed by `$i` stay in registers however large the body (LLVM's unroller gives up on
/// large bodies, and a run-time index sends an array to local memory).
#[macro_export]
macro_rules! unroll {
    ($i:ident in [$($n:literal),* $(,)?] $body:block) => {
        $( { let $i: usize = $n; $body } )*
    };
}

/// Calls `f(0) .. f(n - 1)` as straight-line code when `n` is a compile-time constant up to
/// 16, or 32 (after inlining the `match` folds to one arm): the loop over a const-generic tile size
/// is unrolled whatever its body's size, so register arrays indexed by `i` stay in
/// registers. Larger `n` runs as a plain loop.
#[inline(always)]
pub fn unrolled(n: usize, mut f: impl FnMut(usize)) {
    macro_rules! arms {
        ($($n:literal => [$($i:literal),*]),* $(,)?) => {
            match n {
                $($n => { $(f($i);)* })*
                _ => {
                    for i in 0..n {
                        f(i)
                    }
                }
            }
        };
    }
    arms! {
        0 => [],
        1 => [0],
        2 => [0, 1],
        3 => [0, 1, 2],
        4 => [0, 1, 2, 3],
        5 => [0, 1, 2, 3, 4],
        6 => [0, 1, 2, 3, 4, 5],
        7 => [0, 1, 2, 3, 4, 5, 6],
        8 => [0, 1, 2, 3, 4, 5, 6, 7],
        9 => [0, 1, 2, 3, 4, 5, 6, 7, 8],
        10 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
        11 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        12 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        13 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        14 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
        15 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        16 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        32 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
               16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
    }
}

/// `unrolled!(i in n => body)`: [`unrolled`] with the body's closure forced inline (LLVM
/// would otherwise outline a large body called `n` times, and the arrays it indexes would
/// go to local memory with it).
#[macro_export]
macro_rules! unrolled {
    ($i:pat in $n:expr => $body:expr) => {
        $crate::device::unrolled(
            $n,
            #[inline(always)]
            |$i| $body,
        )
    };
}

// ---------------------------------------------------------------------------------------
// Barriers and warp collectives
// ---------------------------------------------------------------------------------------

/// `__syncthreads()`: every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block-wide barrier; callers keep it in uniform control flow.
    unsafe { nvptx::_syncthreads() }
}

/// `bar.sync id, threads`: a named barrier for `threads` threads (a multiple of 32) of the
/// block, e.g. the warps of one row group when several groups share a block. `id` is 1 to
/// 15 (0 is `__syncthreads`'s); every warp of those threads must reach it, converged.
#[inline(always)]
pub fn bar_sync(id: u32, threads: u32) {
    // SAFETY: a barrier over whole warps; callers keep it in uniform control flow per group.
    unsafe {
        asm!(
            "bar.sync {id}, {n};",
            id = in(reg32) id,
            n = in(reg32) threads,
            options(nostack, preserves_flags)
        )
    }
}

/// `__syncthreads()` that stays correct where a warp reaches it diverged: PTX
/// `barrier.sync 0` without `.aligned` counts each thread's arrival, whichever barrier
/// instruction it executes. `bar.sync` (= `barrier.sync.aligned`) needs every lane of a warp
/// at the same instruction, and LLVM may duplicate a barrier into both arms of a branch that
/// follows it (seen: `if valid {..} sync_threads(); if valid {..}` became two `bar.sync`,
/// and a warp with valid and invalid lanes hung). Every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads_divergent() {
    // SAFETY: a block-wide barrier; callers have every thread of the block reach it.
    unsafe { asm!("barrier.sync 0;", options(nostack, preserves_flags)) }
}

/// `__syncwarp()`: orders the shared-memory accesses of the (converged) warp's lanes.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: a warp-wide barrier over all 32 lanes; callers keep the warp converged.
    unsafe {
        asm!(
            "bar.warp.sync 0xffffffff;",
            options(nostack, preserves_flags)
        )
    }
}

/// `__shfl_xor_sync(0xffffffff, v, mask)` on 32-bit words; the full warp must be converged.
#[inline(always)]
pub fn shfl_xor_u32(v: u32, lane_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: register-only warp exchange; all 32 lanes participate (member mask ~0).
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {o}, {v}, {m}, 0x1f, 0xffffffff;",
            o = out(reg32) out,
            v = in(reg32) v,
            m = in(reg32) lane_mask,
        );
    }
    out
}

/// `__shfl_sync(0xffffffff, v, lane)`: every lane gets lane `lane`'s word; the full warp
/// must be converged.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, lane: u32) -> u32 {
    let out: u32;
    // SAFETY: register-only warp exchange; all 32 lanes participate (member mask ~0).
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {o}, {v}, {l}, 0x1f, 0xffffffff;",
            o = out(reg32) out,
            v = in(reg32) v,
            l = in(reg32) lane,
        );
    }
    out
}

/// `__shfl_xor_sync` on an f32.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), lane_mask))
}

/// Lane `l` of each group of `width` consecutive lanes (a power of two up to 32) gets the
/// word `v` of lane `l - delta` of its group (`UP`, `__shfl_up_sync(0xffffffff, v, delta,
/// width)`) or of lane `l + delta` (`__shfl_down_sync`); lanes with no such lane in their
/// group get their own. The full warp must be converged.
#[inline(always)]
pub fn shfl_group_u32<const UP: bool>(v: u32, delta: u32, width: u32) -> u32 {
    let out: u32;
    // The segment mask in bits 8..13 and, for `down`, the last lane in bits 0..5.
    let segment = (32 - width) << 8;
    // SAFETY: register-only warp exchange; all 32 lanes participate (member mask ~0).
    unsafe {
        if UP {
            asm!(
                "shfl.sync.up.b32 {o}, {v}, {d}, {c}, 0xffffffff;",
                o = out(reg32) out,
                v = in(reg32) v,
                d = in(reg32) delta,
                c = in(reg32) segment,
            );
        } else {
            asm!(
                "shfl.sync.down.b32 {o}, {v}, {d}, {c}, 0xffffffff;",
                o = out(reg32) out,
                v = in(reg32) v,
                d = in(reg32) delta,
                c = in(reg32) segment | 0x1f,
            );
        }
    }
    out
}

/// Combines `v` across the warp with `combine`; every lane gets the result.
#[inline(always)]
pub fn warp_reduce<T: Copy>(v: T, combine: impl Fn(T, T) -> T, shfl: impl Fn(T, u32) -> T) -> T {
    group_reduce(v, 32, combine, shfl)
}

/// Combines `v` within each aligned group of `width` lanes (a power of two <= 32); every
/// lane gets its group's result. The whole warp must be converged.
#[inline(always)]
pub fn group_reduce<T: Copy>(
    mut v: T,
    width: u32,
    combine: impl Fn(T, T) -> T,
    shfl: impl Fn(T, u32) -> T,
) -> T {
    let mut mask = width / 2;
    while mask > 0 {
        v = combine(v, shfl(v, mask));
        mask >>= 1;
    }
    v
}

// ---------------------------------------------------------------------------------------
// Shared memory
// ---------------------------------------------------------------------------------------

/// Declares a statically sized, 16-byte aligned `.shared` array of `$bytes` bytes inside
/// the calling kernel and evaluates to its generic address as `*mut $t`. The declaration
/// is scoped by braces, so several call sites in one kernel get separate arrays.
#[macro_export]
macro_rules! shared_array {
    ($t:ty, $bytes:literal) => {{
        let p: u64;
        // SAFETY: declares block-scoped shared storage and takes its generic address;
        // no memory is touched here.
        unsafe {
            ::core::arch::asm!(
                concat!(
                    "{{ .shared .align 16 .b8 oxidnn_smem[", stringify!($bytes), "];\n",
                    "cvta.shared.u64 {p}, oxidnn_smem; }}"
                ),
                p = out(reg64) p,
            );
        }
        p as *mut $t
    }};
}

/// Declares a statically sized `.shared` array of `$bytes` bytes (16-byte aligned) inside
/// the calling kernel and evaluates to a [`SharedF32`] view of it, addressed with 32-bit
/// shared-window addresses (`ld.shared`/`st.shared`, no generic-address translation).
#[macro_export]
macro_rules! shared_f32 {
    ($bytes:literal) => {{
        let a: u32;
        // SAFETY: declares block-scoped shared storage and takes its shared-window address.
        unsafe {
            ::core::arch::asm!(
                concat!(
                    "{{ .shared .align 16 .b8 oxidnn_smem[", stringify!($bytes), "];\n",
                    "mov.u32 {a}, oxidnn_smem; }}"
                ),
                a = out(reg32) a,
            );
        }
        $crate::device::SharedF32 { base: a, len: $bytes / 4 }
    }};
}

/// f32 slots in shared memory (see [`shared_f32!`]).
#[derive(Clone, Copy)]
pub struct SharedF32 {
    pub base: u32,
    pub len: u32,
}

impl SharedF32 {
    /// Stores slot `i`.
    ///
    /// # Safety
    /// `i < len`; other threads' accesses to slot `i` are ordered by barriers.
    #[inline(always)]
    pub unsafe fn store(&self, i: u32, v: f32) {
        asm!("st.shared.f32 [{a}], {v};", a = in(reg32) self.base + 4 * i, v = in(reg32) v,
             options(nostack, preserves_flags));
    }

    /// Loads slot `i`.
    ///
    /// # Safety
    /// As [`SharedF32::store`].
    #[inline(always)]
    pub unsafe fn load(&self, i: u32) -> f32 {
        let v: f32;
        asm!("ld.shared.f32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) self.base + 4 * i,
             options(readonly, nostack, preserves_flags));
        v
    }
}

/// Reduces `v` over the whole 1-D block (at most 1024 threads); every thread gets the
/// result. `scratch` is shared memory for 32 values. Must be reached by every thread.
#[inline(always)]
pub fn block_reduce<T: Copy>(
    v: T,
    scratch: *mut T,
    identity: T,
    combine: impl Fn(T, T) -> T + Copy,
    shfl: impl Fn(T, u32) -> T + Copy,
) -> T {
    let warp_total = warp_reduce(v, combine, shfl);
    let warps = (block_dim_x() + 31) >> 5;
    // SAFETY: `scratch` points to 32 shared slots; warp w writes slot w < 32, the barrier
    // orders those writes before the reads, the second barrier keeps a later call's writes
    // behind this call's reads.
    unsafe {
        if lane_id() == 0 {
            *scratch.add(warp_id() as usize) = warp_total;
        }
        sync_threads();
        let lane = lane_id();
        let mine = if lane < warps {
            *scratch.add(lane as usize)
        } else {
            identity
        };
        let total = warp_reduce(mine, combine, shfl);
        sync_threads();
        total
    }
}

// ---------------------------------------------------------------------------------------
// Global memory
// ---------------------------------------------------------------------------------------

/// `p + bytes` as one `add.s64` that LLVM cannot see through. A chain of these stays a
/// chain of integer additions: otherwise LLVM folds `p + i * step` into loop-invariant
/// multiples of `step`, which ptxas, short of registers in an FFMA loop, recomputes inside
/// it with `IMAD.WIDE` on the FMA pipe (H100, exact-f32 matmul: the largest source of
/// dispatch and math-pipe stalls of its main loop).
#[inline(always)]
pub fn add_bytes(p: *const u8, bytes: u64) -> *const u8 {
    let out: *const u8;
    // SAFETY: integer arithmetic on the address; nothing is read or written.
    unsafe {
        asm!(
            "add.s64 {o}, {p}, {b};",
            o = out(reg64) out, p = in(reg64) p, b = in(reg64) bytes,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Four 32-bit words = one 16-byte vector.
pub type Vec16 = [u32; 4];

/// `w` unchanged, through an empty instruction the compiler cannot see through or merge
/// with another: what is computed from the result is computed again at each use, instead
/// of being kept alive in registers from an identical earlier computation. For data held
/// packed in registers (two 16-bit elements a word) and unpacked where it is used.
#[inline(always)]
pub fn opaque_words(mut w: Vec16) -> Vec16 {
    // SAFETY: the instruction string is empty: no register or memory is touched. Without
    // `pure`, the compiler treats each use as distinct and keeps it.
    unsafe {
        asm!(
            "// opaque {a} {b} {c} {d}",
            a = inout(reg32) w[0], b = inout(reg32) w[1], c = inout(reg32) w[2],
            d = inout(reg32) w[3],
            options(nomem, nostack, preserves_flags),
        );
    }
    w
}

/// A 16-byte global load wrapper `$name` issuing `$instr` (the `ld.global` variant: its
/// path and cache policy); the wrappers differ in nothing else.
macro_rules! ld_global_v4_with {
    ($(#[$doc:meta])* $name:ident, $instr:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name(p: *const u32) -> Vec16 {
            let (a, b, c, d): (u32, u32, u32, u32);
            asm!(
                concat!($instr, " {{{a}, {b}, {c}, {d}}}, [{p}];"),
                a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                p = in(reg64) p,
                options(readonly, nostack, preserves_flags),
            );
            [a, b, c, d]
        }
    };
}

ld_global_v4_with!(
    /// A 16-byte load through the read-only (non-coherent) path.
    ///
    /// # Safety
    /// `p` is 16-byte aligned, points into global memory the kernel does not write through
    /// another thread during this launch.
    ld_global_nc_v4,
    "ld.global.nc.v4.u32"
);

ld_global_v4_with!(
    /// A 16-byte coherent load.
    ///
    /// # Safety
    /// `p` is 16-byte aligned and points into global memory.
    ld_global_v4,
    "ld.global.v4.u32"
);

ld_global_v4_with!(
    /// A 16-byte read-only load marked streaming (`.cs`: evict first from L1 and L2), for
    /// data read for the last time, so it does not push out data that will be read again.
    ///
    /// # Safety
    /// As [`ld_global_nc_v4`].
    ld_global_nc_cs_v4,
    "ld.global.cs.nc.v4.u32"
);

ld_global_v4_with!(
    /// A 16-byte coherent load marked streaming (`.cs`: evict first from L1 and L2), for
    /// data this launch wrote earlier (through the same thread) and reads for the last
    /// time.
    ///
    /// # Safety
    /// As [`ld_global_v4`].
    ld_global_cs_v4,
    "ld.global.cs.v4.u32"
);

/// Clears the bits of `clear` and then sets those of `set` in the global word at `p`, so
/// that threads owning disjoint bits of a word update them without a race, merged across
/// the calling warp: the active lanes whose `p` is the same word combine their `clear` and
/// `set` bits (`match.any`, `redux.or`), and the lowest of them updates the word for all,
/// with a plain store where together they clear every bit of it (no other thread owns
/// any), else with two relaxed atomic reductions (`and`, then `or`, ordered as one
/// thread's accesses to one address are). Where neighbouring lanes own neighbouring bits
/// (a relu mask of 1- or 4-element vectors), a word takes one access instead of up to 64
/// atomics.
///
/// Every active lane must call it with its own update (`set` within `clear`); the lanes
/// of a word may come from any part of the warp. One asm block, so the compiler cannot
/// separate the lanes' rendezvous (`activemask` and the `.sync` instructions) from the
/// update.
///
/// # Safety
/// `p` is 4-byte aligned and points into global memory, and the threads updating a word
/// own disjoint bits of it.
#[inline(always)]
pub unsafe fn warp_assign_bits(p: *mut u32, clear: u32, set: u32) {
    asm!(
        "{{ .reg .b32 lanes, peers, all_clear, all_set, lowest, me;",
        ".reg .pred leads, whole, part;",
        "activemask.b32 lanes;",
        "match.any.sync.b64 peers, {p}, lanes;",
        "redux.sync.or.b32 all_clear, {c}, peers;",
        "redux.sync.or.b32 all_set, {s}, peers;",
        // The peer group's lowest lane, as a one-bit mask, against this lane's.
        "neg.s32 lowest, peers;",
        "and.b32 lowest, lowest, peers;",
        "mov.u32 me, %lanemask_eq;",
        "setp.eq.u32 leads, lowest, me;",
        "setp.eq.and.u32 whole, all_clear, 0xffffffff, leads;",
        "setp.ne.and.u32 part, all_clear, 0xffffffff, leads;",
        "@whole st.global.u32 [{p}], all_set;",
        "not.b32 all_clear, all_clear;",
        "@part red.relaxed.gpu.global.and.b32 [{p}], all_clear;",
        "@part red.relaxed.gpu.global.or.b32 [{p}], all_set; }}",
        p = in(reg64) p, c = in(reg32) clear, s = in(reg32) set,
        options(nostack, preserves_flags),
    );
}

/// A 16-byte store marked streaming (`.cs`: evict first), for results not read again soon.
///
/// # Safety
/// As [`st_global_v4`].
#[inline(always)]
pub unsafe fn st_global_cs_v4(p: *mut u32, v: Vec16) {
    asm!(
        "st.global.cs.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg64) p,
        a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
        options(nostack, preserves_flags),
    );
}

/// An 8-byte load through the read-only (non-coherent) path.
///
/// # Safety
/// As [`ld_global_nc_v4`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn ld_global_nc_v2(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    asm!(
        "ld.global.nc.v2.u32 {{{a}, {b}}}, [{p}];",
        a = out(reg32) a, b = out(reg32) b, p = in(reg64) p,
        options(readonly, nostack, preserves_flags),
    );
    [a, b]
}

/// An 8-byte coherent load.
///
/// # Safety
/// As [`ld_global_v4`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn ld_global_v2(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    asm!(
        "ld.global.v2.u32 {{{a}, {b}}}, [{p}];",
        a = out(reg32) a, b = out(reg32) b, p = in(reg64) p,
        options(readonly, nostack, preserves_flags),
    );
    [a, b]
}

/// An 8-byte store.
///
/// # Safety
/// `p` is 8-byte aligned and points into writable global memory.
#[inline(always)]
pub unsafe fn st_global_v2(p: *mut u32, v: [u32; 2]) {
    asm!(
        "st.global.v2.u32 [{p}], {{{a}, {b}}};",
        p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1],
        options(nostack, preserves_flags),
    );
}

/// A 16-byte store.
///
/// # Safety
/// `p` is 16-byte aligned and points into writable global memory.
#[inline(always)]
pub unsafe fn st_global_v4(p: *mut u32, v: Vec16) {
    asm!(
        "st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg64) p,
        a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
        options(nostack, preserves_flags),
    );
}

// ---------------------------------------------------------------------------------------
// Floating point
// ---------------------------------------------------------------------------------------

/// Half precision bits -> f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let out: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {o}, {h};", o = out(reg32) out, h = in(reg16) h,
             options(pure, nomem, nostack));
    }
    out
}

/// f32 -> half precision bits, round to nearest even.
#[inline(always)]
pub fn f32_to_f16(v: f32) -> u16 {
    let out: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {o}, {v};", o = out(reg16) out, v = in(reg32) v,
             options(pure, nomem, nostack));
    }
    out
}

/// Two f32 -> two halves packed in one word (`lo` in the low half), round to nearest even.
#[inline(always)]
pub fn f32x2_to_f16x2(lo: f32, hi: f32) -> u32 {
    let out: u32;
    // SAFETY: register-only conversion; the first source goes to the upper half.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {o}, {hi}, {lo};", o = out(reg32) out, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack));
    }
    out
}

/// Whether each half of `a` equals the same half of `b` as f16 values (`==`: NaN equals
/// nothing, +0 equals -0), `[low, high]`: one `HSETP2` for two comparisons.
#[inline(always)]
pub fn eq_f16x2(a: u32, b: u32) -> [bool; 2] {
    let (lo, hi): (u32, u32);
    // SAFETY: register-only comparison.
    unsafe {
        asm!(
            "{{ .reg .pred p, q;",
            "setp.eq.f16x2 p|q, {a}, {b};",
            "selp.u32 {lo}, 1, 0, p;",
            "selp.u32 {hi}, 1, 0, q; }}",
            lo = out(reg32) lo, hi = out(reg32) hi, a = in(reg32) a, b = in(reg32) b,
            options(pure, nomem, nostack),
        );
    }
    [lo != 0, hi != 0]
}

/// `a == b` per half of two packed f16 pairs (NaN equals nothing, +0 equals -0), as a mask:
/// each half all ones where equal, zero elsewhere. One `HSET2` for two comparisons.
#[inline(always)]
pub fn eq_mask_f16x2(a: u32, b: u32) -> u32 {
    let mask: u32;
    // SAFETY: register-only comparison.
    unsafe {
        asm!("set.eq.u32.f16x2 {m}, {a}, {b};", m = out(reg32) mask, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack));
    }
    mask
}

/// Two f32 -> two bfloat16 packed in one word (`lo` in the low half), round to nearest even.
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    let out: u32;
    // SAFETY: register-only conversion; the first source goes to the upper half.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {o}, {hi}, {lo};", o = out(reg32) out, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack));
    }
    out
}

/// bfloat16 bits -> f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bfloat16 bits, round to nearest even (sm_80+).
#[inline(always)]
pub fn f32_to_bf16(v: f32) -> u16 {
    let out: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {o}, {v};", o = out(reg16) out, v = in(reg32) v,
             options(pure, nomem, nostack));
    }
    out
}

/// `2^x`, approximate (max relative error about 2^-22; subnormal results flush to 0).
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("ex2.approx.ftz.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// `log2(x)`, approximate (max absolute error about 2^-22 in the mantissa range).
#[inline(always)]
pub fn log2_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("lg2.approx.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// `log2(x)` for a normal `x`, approximate as [`log2_approx`]; a subnormal `x` flushes to
/// 0 (giving -inf). One `MUFU.LG2`, where [`log2_approx`] also tests for and rescales a
/// subnormal input (three more instructions).
#[inline(always)]
pub fn log2_approx_ftz(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("lg2.approx.ftz.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// The 64-bit product `a * b` as `(hi, lo)`: one `mul.wide.u32` (`IMAD.WIDE.U32`), for
/// `oxidnn_params::philox4x32_10_keyed` (see `oxidnn_params::mul_wide`, the host's).
#[inline(always)]
pub fn mul_wide_u32(a: u32, b: u32) -> (u32, u32) {
    let (hi, lo): (u32, u32);
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("{{ .reg .b64 t; mul.wide.u32 t, {a}, {b}; mov.b64 {{{l}, {h}}}, t; }}",
             a = in(reg32) a, b = in(reg32) b, l = out(reg32) lo, h = out(reg32) hi,
             options(pure, nomem, nostack));
    }
    (hi, lo)
}

/// `1 / x`, approximate (max error 1 ulp; subnormals flush to 0).
#[inline(always)]
pub fn rcp_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rcp.approx.ftz.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// `tanh x`, hardware approximation (max relative error about 2^-11: for 16-bit outputs).
#[inline(always)]
pub fn tanh_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("tanh.approx.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// `1 / sqrt(x)`, relative error at most 2^-22.9 (subnormal inputs handled).
#[inline(always)]
pub fn rsqrt_approx(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rsqrt.approx.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// Correctly rounded square root.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("sqrt.rn.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    out
}

/// Stamps a packed two-element max: `$instr {out}, {a}, {b}` on each half of two words.
macro_rules! packed_max {
    ($($(#[$doc:meta])* $name:ident = $instr:literal;)*) => { $(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(a: u32, b: u32) -> u32 {
            let out: u32;
            // SAFETY: register-only arithmetic.
            unsafe {
                asm!(concat!($instr, " {o}, {a}, {b};"), o = out(reg32) out, a = in(reg32) a,
                     b = in(reg32) b, options(pure, nomem, nostack));
            }
            out
        }
    )* };
}

packed_max! {
    /// The max of each half of `a` and `b` as f16 (a NaN operand yields the other; two
    /// NaNs, NaN): two elements an instruction (ptxas fuses two into a three-input
    /// `VHMNMX`).
    max_f16x2 = "max.f16x2";
    /// The max of each half of `a` and `b` as f16, NaN if either is.
    max_nan_f16x2 = "max.NaN.f16x2";
    /// The max of each half of `a` and `b` as bfloat16 (a NaN operand yields the other;
    /// two NaNs, NaN).
    max_bf16x2 = "max.bf16x2";
    /// The max of each half of `a` and `b` as bfloat16, NaN if either is.
    max_nan_bf16x2 = "max.NaN.bf16x2";
}

/// `max(a, b)` ignoring NaN (IEEE maxNum: a NaN operand yields the other; two NaNs, NaN).
#[inline(always)]
pub fn max_ignore_nan(a: f32, b: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("max.f32 {o}, {a}, {b};", o = out(reg32) out, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack));
    }
    out
}

/// `max(a, b)`, NaN if either is NaN (sm_80+).
#[inline(always)]
pub fn max_propagate_nan(a: f32, b: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("max.NaN.f32 {o}, {a}, {b};", o = out(reg32) out, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack));
    }
    out
}

/// Correctly rounded square root in double precision.
#[inline(always)]
pub fn sqrt_f64(x: f64) -> f64 {
    let out: f64;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("sqrt.rn.f64 {o}, {x};", o = out(reg64) out, x = in(reg64) x,
             options(pure, nomem, nostack));
    }
    out
}

/// `__shfl_xor_sync` on an f64 (two 32-bit exchanges); the full warp must be converged.
#[inline(always)]
pub fn shfl_xor_f64(v: f64, lane_mask: u32) -> f64 {
    let bits = v.to_bits();
    let lo = shfl_xor_u32(bits as u32, lane_mask) as u64;
    let hi = shfl_xor_u32((bits >> 32) as u32, lane_mask) as u64;
    f64::from_bits(hi << 32 | lo)
}

/// Fused multiply-add `a * b + c`, rounded once.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f32 {o}, {a}, {b}, {c};", o = out(reg32) out,
             a = in(reg32) a, b = in(reg32) b, c = in(reg32) c,
             options(pure, nomem, nostack));
    }
    out
}

// ---------------------------------------------------------------------------------------
// Shared memory by address, asynchronous copies and tensor-core instructions
// ---------------------------------------------------------------------------------------

/// The shared-memory address of the kernel's dynamic shared memory (the size is set at
/// launch). `build.rs` declares the module-scope `.extern .shared` symbol this names,
/// since PTX accepts `.extern` only outside functions.
#[inline(always)]
pub fn dynamic_smem() -> u32 {
    let a: u32;
    // SAFETY: takes the address of a module-scope symbol; no memory access.
    unsafe {
        asm!("mov.u32 {a}, oxidnn_dyn_smem;", a = out(reg32) a,
             options(pure, nomem, nostack, preserves_flags));
    }
    a
}

/// A 32-bit shared-memory load.
///
/// # Safety
/// `addr` is a 4-byte aligned shared address inside the block's allocation; barriers order
/// it against other threads' writes.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr,
         options(readonly, nostack, preserves_flags));
    v
}

/// A 32-bit shared-memory store.
///
/// # Safety
/// As [`ld_shared_u32`].
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    asm!("st.shared.u32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v,
         options(nostack, preserves_flags));
}

/// A shared-memory load of a value of any `Copy` type made of 32-bit words (`f32`,
/// `[f32; 2]`, ..), one `ld.shared.u32` a word.
///
/// # Safety
/// As [`ld_shared_u32`], for each of the value's words.
#[inline(always)]
pub unsafe fn ld_shared_words<T: Copy>(addr: u32) -> T {
    const { assert!(size_of::<T>() % 4 == 0) };
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    let words = v.as_mut_ptr() as *mut u32;
    for i in 0..size_of::<T>() / 4 {
        // SAFETY: `i` words into a `T` of `size_of::<T>() / 4` words.
        words
            .add(i)
            .write_unaligned(ld_shared_u32(addr + 4 * i as u32));
    }
    // SAFETY: every word of `v` was written; `T` is plain data (`Copy`, of f32/u32 words).
    v.assume_init()
}

/// A shared-memory store of a value of 32-bit words (see [`ld_shared_words`]).
///
/// # Safety
/// As [`ld_shared_u32`], for each of the value's words.
#[inline(always)]
pub unsafe fn st_shared_words<T: Copy>(addr: u32, v: T) {
    const { assert!(size_of::<T>() % 4 == 0) };
    let words = &v as *const T as *const u32;
    for i in 0..size_of::<T>() / 4 {
        // SAFETY: `i` words into `v`.
        st_shared_u32(addr + 4 * i as u32, words.add(i).read_unaligned());
    }
}

/// A 16-byte shared-memory load.
///
/// # Safety
/// As [`ld_shared_u32`], with 16-byte alignment.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> Vec16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    asm!(
        "ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
        a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
        p = in(reg32) addr,
        options(readonly, nostack, preserves_flags),
    );
    [a, b, c, d]
}

/// An 8-byte shared-memory load.
///
/// # Safety
/// As [`ld_shared_u32`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    asm!(
        "ld.shared.v2.u32 {{{a}, {b}}}, [{p}];",
        a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr,
        options(readonly, nostack, preserves_flags),
    );
    [a, b]
}

/// An 8-byte shared-memory store.
///
/// # Safety
/// As [`ld_shared_v2`].
#[inline(always)]
pub unsafe fn st_shared_v2(addr: u32, v: [u32; 2]) {
    asm!(
        "st.shared.v2.u32 [{p}], {{{a}, {b}}};",
        p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1],
        options(nostack, preserves_flags),
    );
}

/// A 16-byte shared-memory store.
///
/// # Safety
/// As [`ld_shared_v4`].
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: Vec16) {
    asm!(
        "st.shared.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
        p = in(reg32) addr,
        a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
        options(nostack, preserves_flags),
    );
}

/// `cp.async` of one 16-byte chunk, global -> shared, bypassing L1: the first `src_bytes`
/// (0 to 16) come from `src`, the rest of the chunk is zero-filled.
///
/// # Safety
/// `dst` is a 16-byte aligned shared address of the block; `src` is 16-byte aligned and
/// its first `src_bytes` bytes are readable global memory (any address when 0). The copy
/// completes only at a [`cp_async_wait`] for its group.
#[inline(always)]
pub unsafe fn cp_async_16(dst: u32, src: *const u8, src_bytes: u32) {
    asm!(
        "cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
        d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes,
        options(nostack, preserves_flags),
    );
}

/// `cp.async` of `BYTES` (4 or 8) bytes, global -> shared, through L1 (`.ca`: copies
/// under 16 bytes cannot bypass it): the first `src_bytes` (0 or `BYTES`) come from `src`,
/// the rest is zero-filled. Word copies can scatter a tile into any shared layout (the
/// exact-f32 core stores its operands transposed, `[k][mn]`), which 16-byte chunks
/// cannot; 8-byte ones copy channel-padded pixels of 4 16-bit channels.
///
/// # Safety
/// `dst` is a `BYTES`-aligned shared address of the block; `src` is `BYTES`-aligned and
/// its first `src_bytes` bytes are readable global memory (any address when 0). The copy
/// completes only at a [`cp_async_wait`] for its group.
#[inline(always)]
pub unsafe fn cp_async_ca<const BYTES: u32>(dst: u32, src: *const u8, src_bytes: u32) {
    const { assert!(BYTES == 4 || BYTES == 8) };
    asm!(
        "cp.async.ca.shared.global [{d}], [{s}], {b}, {n};",
        b = const BYTES,
        d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes,
        options(nostack, preserves_flags),
    );
}

/// Closes the group of this thread's `cp.async`s issued since the last commit.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: bookkeeping of this thread's own asynchronous copies.
    unsafe { asm!("cp.async.commit_group;", options(nostack, preserves_flags)) }
}

/// Waits until at most `pending` of this thread's committed `cp.async` groups are still in
/// flight (`pending` a constant, 0 to 7). Other threads' copies need a barrier after it.
#[inline(always)]
pub fn cp_async_wait(pending: u32) {
    // SAFETY: waits on this thread's own copies; no memory is touched.
    unsafe {
        match pending {
            0 => asm!("cp.async.wait_group 0;", options(nostack, preserves_flags)),
            1 => asm!("cp.async.wait_group 1;", options(nostack, preserves_flags)),
            2 => asm!("cp.async.wait_group 2;", options(nostack, preserves_flags)),
            3 => asm!("cp.async.wait_group 3;", options(nostack, preserves_flags)),
            4 => asm!("cp.async.wait_group 4;", options(nostack, preserves_flags)),
            5 => asm!("cp.async.wait_group 5;", options(nostack, preserves_flags)),
            6 => asm!("cp.async.wait_group 6;", options(nostack, preserves_flags)),
            _ => asm!("cp.async.wait_group 7;", options(nostack, preserves_flags)),
        }
    }
}

/// `ldmatrix.x4`: four 8x8 matrices of 16-bit elements from shared memory. Lane `l`
/// supplies the address of row `l % 8` of matrix `l / 8`; register `j` of lane `l` gets
/// elements `2 (l % 4)` and `+1` of row `l / 4` of matrix `j` (transposed when `TRANS`).
///
/// # Safety
/// Every lane's `row` is a 16-byte aligned shared address of 16 readable bytes, ordered
/// after their writes by a barrier; the whole warp executes it.
#[inline(always)]
pub unsafe fn ldmatrix_x4<const TRANS: bool>(row: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    if TRANS {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg32) row, options(readonly, nostack, preserves_flags),
        );
    } else {
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            p = in(reg32) row, options(readonly, nostack, preserves_flags),
        );
    }
    [a, b, c, d]
}

/// Generates a warp-wide `mma.sync` with f32 accumulators: `acc += a * b` for the fragment
/// layouts of the PTX ISA (A row-major, B column-major).
macro_rules! mma_sync {
    ($(#[$doc:meta])* $name:ident, $shape:literal, $ty:literal, $a:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(acc: &mut [f32; 4], a: [u32; $a], b: [u32; 2]) {
            // SAFETY: register-only warp-wide instruction; callers run it on the whole,
            // converged warp.
            unsafe {
                asm!(
                    concat!("mma.sync.aligned.", $shape, ".row.col.f32.", $ty, ".", $ty,
                            ".f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, ",
                            "{{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};"),
                    d0 = inout(reg32) acc[0], d1 = inout(reg32) acc[1],
                    d2 = inout(reg32) acc[2], d3 = inout(reg32) acc[3],
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1],
                    a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                    options(pure, nomem, nostack),
                );
            }
        }
    };
}

mma_sync!(
    /// `mma.sync` m16n8k16 on f16 pairs.
    mma_m16n8k16_f16, "m16n8k16", "f16", 4
);
mma_sync!(
    /// `mma.sync` m16n8k16 on bf16 pairs.
    mma_m16n8k16_bf16, "m16n8k16", "bf16", 4
);
mma_sync!(
    /// `mma.sync` m16n8k8 on tf32 words (see [`f32_to_tf32`]).
    mma_m16n8k8_tf32, "m16n8k8", "tf32", 4
);

/// f32 -> tf32 (10-bit mantissa), rounded to nearest, ties away, as cuBLAS rounds.
#[inline(always)]
pub fn f32_to_tf32(v: u32) -> u32 {
    let out: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rna.tf32.f32 {o}, {v};", o = out(reg32) out, v = in(reg32) v,
             options(pure, nomem, nostack));
    }
    out
}

/// A 64-bit shared-memory load of an f64.
///
/// # Safety
/// As [`ld_shared_u32`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn ld_shared_f64(addr: u32) -> f64 {
    let v: f64;
    asm!("ld.shared.f64 {v}, [{a}];", v = out(reg64) v, a = in(reg32) addr,
         options(readonly, nostack, preserves_flags));
    v
}

/// A 64-bit shared-memory store of an f64.
///
/// # Safety
/// As [`ld_shared_f64`].
#[inline(always)]
pub unsafe fn st_shared_f64(addr: u32, v: f64) {
    asm!("st.shared.f64 [{a}], {v};", a = in(reg32) addr, v = in(reg64) v,
         options(nostack, preserves_flags));
}

/// A 32-bit shared-memory load of an f32.
///
/// # Safety
/// As [`ld_shared_u32`].
#[inline(always)]
pub unsafe fn ld_shared_f32(addr: u32) -> f32 {
    f32::from_bits(ld_shared_u32(addr))
}

/// A 32-bit shared-memory store of an f32.
///
/// # Safety
/// As [`ld_shared_u32`].
#[inline(always)]
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    st_shared_u32(addr, v.to_bits())
}

// ---------------------------------------------------------------------------------------
// Device-wide atomics and fences
// ---------------------------------------------------------------------------------------

/// `atomicAdd` on a global `u32`; returns the old value.
///
/// # Safety
/// `p` is 4-byte aligned and points into writable global memory.
#[inline(always)]
pub unsafe fn atomic_add_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    asm!("atom.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) p,
         v = in(reg32) v, options(nostack, preserves_flags));
    old
}

/// `atomicAdd(p, v)` made by the warp's lane 0 alone, which gets the old value; the other
/// lanes get 0. The atomic stays one instruction whose result is waited for only where it
/// is used: on an address it can prove warp-uniform, ptxas makes an atomic warp-aggregated,
/// with a shuffle of the result right after it that waits for the atomic there and then.
/// Here the address is `p` plus the lane's `%lanemask_lt`, which is 0 in lane 0, the only
/// lane that makes the atomic.
///
/// # Safety
/// As [`atomic_add_u32`]; the whole warp is converged.
#[inline(always)]
pub unsafe fn atomic_add_u32_lane0(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    asm!(
        "{{",
        ".reg .pred first;",
        ".reg .b32 below;",
        ".reg .b64 at;",
        "mov.u32 {o}, 0;",
        "mov.u32 below, %lanemask_lt;",
        "setp.eq.u32 first, below, 0;",
        "cvt.u64.u32 at, below;",
        "add.u64 at, at, {p};",
        "@first atom.global.add.u32 {o}, [at], {v};",
        "}}",
        o = out(reg32) old,
        p = in(reg64) p,
        v = in(reg32) v,
        options(nostack, preserves_flags)
    );
    old
}

/// `__threadfence()`: this thread's memory accesses before it are ordered, device-wide,
/// before its accesses after it.
#[inline(always)]
pub fn thread_fence() {
    // SAFETY: a memory fence; no memory is touched.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack, preserves_flags)) }
}

/// A load of a global `u32` with acquire semantics at GPU scope (never cached in L1).
///
/// # Safety
/// `p` is 4-byte aligned and points into readable global memory.
#[inline(always)]
pub unsafe fn ld_acquire_u32(p: *const u32) -> u32 {
    let v: u32;
    asm!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p,
         options(nostack, preserves_flags));
    v
}

/// A barrier across every block of the launch: no thread passes it before every thread of
/// the grid has reached it, and the memory writes of all before it are visible to all
/// after it ([`group_barrier`] of the whole grid, block 0 leading).
///
/// # Safety
/// As [`group_barrier`], the group being the grid.
#[inline(always)]
pub unsafe fn grid_barrier(state: *mut u32) {
    let leader = block_idx_x() == 0 && block_idx_y() == 0;
    group_barrier(state, grid_dim_x() * grid_dim_y(), leader);
}

/// A barrier across a group of `members` blocks of the launch, one of them the `leader`:
/// no thread passes it before every thread of the group's blocks has reached it, and the
/// memory writes of all before it are visible to all after it.
///
/// `state` is one word: each block's thread 0 adds to it, 1 for the others and
/// `2^31 - (members - 1)` for the leader, so the arrivals add up to `2^31` exactly: the
/// last one flips the word's top bit and leaves its other bits as they were (0), and each
/// block waits until the top bit differs from the one its own addition saw. Nobody resets
/// or advances anything after the last arrival (the waiters see that arrival itself), and
/// the bits below the top are 0 whenever no barrier is in progress, so one state serves
/// any number of barriers and of launches in stream order.
///
/// # Safety
/// Every block of the group is resident at once (a cooperative launch) and calls it with
/// the same `state` and `members`, exactly one of them as the `leader`, every thread of
/// each block in uniform control flow; `state` is global memory no concurrent launch or
/// other group uses, its bits below the top 0 when the launch starts.
#[inline(always)]
pub unsafe fn group_barrier(state: *mut u32, members: u32, leader: bool) {
    const TOP: u32 = 1 << 31;
    sync_threads_divergent();
    if thread_idx_x() == 0 {
        // Releases the block's writes (ordered before this thread's by the block barrier).
        thread_fence();
        let add = if leader { TOP - (members - 1) } else { 1 };
        let seen = atomic_add_u32(state, add) & TOP;
        while ld_acquire_u32(state) & TOP == seen {}
        // Acquires every block's writes for this block's threads (the barrier below).
        thread_fence();
    }
    sync_threads_divergent();
}

/// Stops the kernel with an error the host sees at the next synchronisation.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` aborts the launch.
    unsafe { nvptx::trap() }
}
