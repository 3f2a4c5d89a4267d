//! Hopper-only (`sm_90a`) instructions: warpgroup matrix multiply-accumulate (`wgmma`) on
//! shared-memory operands, its fences and groups, and the async-proxy fence that orders
//! ordinary shared-memory writes before the tensor cores read them.
//!
//! Compiled only into the `sm90a` kernel build (the kernels crate's `sm90a` feature); the
//! PTX it emits assembles for `sm_90a` alone.
//!
//! A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. `wgmma` is
//! issued by all 128 of its threads together; it reads A (`64 x 16`) and B (`N x 16`) from
//! shared memory through [`SmemDescriptor`]s and adds into f32 accumulators that stay in
//! registers, spread over the warpgroup as [`Accumulators`] says. It runs asynchronously:
//! the registers may be touched again only after [`wgmma_wait`] retires its group.

use core::arch::asm;

/// `fence.proxy.async.shared::cta`: this thread's earlier writes to shared memory (ordinary
/// stores, completed `cp.async`s) become visible to the async proxy, which `wgmma` reads
/// through. Each writing thread runs it before the barrier that hands the data over.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a memory-ordering fence; no operands.
    unsafe {
        asm!(
            "fence.proxy.async.shared::cta;",
            options(nostack, preserves_flags)
        )
    }
}

/// `wgmma.fence`: orders this warpgroup's earlier register accesses (to accumulators and
/// to nothing else) before the `wgmma`s that follow. Needed before the first `wgmma` of a
/// batch and whenever the accumulators were touched since the last one.
#[inline(always)]
pub fn wgmma_fence() {
    // SAFETY: warpgroup-wide ordering instruction, run by the whole converged warpgroup.
    unsafe {
        asm!(
            "wgmma.fence.sync.aligned;",
            options(nostack, preserves_flags)
        )
    }
}

/// `wgmma.commit_group`: closes the group of this warpgroup's `wgmma`s issued since the
/// last commit.
#[inline(always)]
pub fn wgmma_commit_group() {
    // SAFETY: bookkeeping of this warpgroup's own asynchronous operations.
    unsafe {
        asm!(
            "wgmma.commit_group.sync.aligned;",
            options(nostack, preserves_flags)
        )
    }
}

/// `wgmma.wait_group PENDING`: waits until at most `PENDING` (0 to 3) of this warpgroup's
/// committed groups are in flight. Follow it with [`Accumulators::fence_operands`] before
/// reading the accumulators, so that the compiler cannot move the reads above the wait.
#[inline(always)]
pub fn wgmma_wait<const PENDING: u32>() {
    // SAFETY: waits on this warpgroup's own operations; touches no memory.
    unsafe {
        match PENDING {
            0 => asm!(
                "wgmma.wait_group.sync.aligned 0;",
                options(nostack, preserves_flags)
            ),
            1 => asm!(
                "wgmma.wait_group.sync.aligned 1;",
                options(nostack, preserves_flags)
            ),
            2 => asm!(
                "wgmma.wait_group.sync.aligned 2;",
                options(nostack, preserves_flags)
            ),
            _ => asm!(
                "wgmma.wait_group.sync.aligned 3;",
                options(nostack, preserves_flags)
            ),
        }
    }
}

/// A `wgmma` shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start
/// address, leading- and stride-dimension byte offsets, base offset 0, swizzle mode.
#[derive(Clone, Copy)]
pub struct SmemDescriptor(pub u64);

impl SmemDescriptor {
    /// A matrix in shared memory laid out in 128-byte-swizzled atoms (8 rows of 128 bytes,
    /// 16-byte chunk `c` of row `r` stored at chunk `c ^ r`), starting at shared address
    /// `start`, whose atom pattern repeats from a 1024-byte boundary.
    ///
    /// * K-major (rows run along K): `stride` = bytes from one 8-row group of M/N to the
    ///   next; `leading` is unused (pass 16).
    /// * MN-major (rows run along M/N, 64 16-bit elements each): `leading` = bytes from one
    ///   64-element block of M/N to the next, `stride` = bytes from one 8-row group of K to
    ///   the next.
    #[inline(always)]
    pub const fn sw128(start: u32, leading: u32, stride: u32) -> Self {
        const fn encode(x: u32) -> u64 {
            ((x & 0x3_FFFF) >> 4) as u64
        }
        /// Swizzle mode 1 in bits 62-63: 128-byte swizzle.
        const SWIZZLE_128B: u64 = 1 << 62;
        Self(encode(start) | encode(leading) << 16 | encode(stride) << 32 | SWIZZLE_128B)
    }

    /// The same matrix `bytes` further on (a multiple of 16, within the same swizzle
    /// atoms' rows for K-major steps: the hardware applies the swizzle to the full address).
    #[inline(always)]
    pub const fn offset(self, bytes: u32) -> Self {
        Self(self.0 + (bytes >> 4) as u64)
    }
}

/// 16-bit input types `wgmma` multiplies with f32 accumulation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WgmmaInput {
    F16,
    Bf16,
}

/// One thread's share of a warpgroup's `64 x N` f32 accumulator tile, as `N / 8` blocks of
/// 4: block `j` of lane `l` of warp `w` (of the warpgroup) holds rows `16 w + l / 4` (items
/// 0, 1) and `+ 8` (items 2, 3), columns `8 j + 2 (l % 4)` and `+ 1` (the `mma.sync`
/// m16n8 accumulator layout, repeated along N).
pub trait Accumulators {
    /// N of the `wgmma.m64nNk16` this tile takes.
    const N: u32;

    /// `self += A x B^T` (or `=` when `!accumulate`) over one K step of 16: A is the
    /// `64 x 16` matrix `a` describes, B the `N x 16` one `b` describes; `trans_a` /
    /// `trans_b` say they are MN-major in shared memory (else K-major). The flags are
    /// immediates of the instruction: pass constants (the choice folds after inlining).
    ///
    /// # Safety
    /// Run by the whole converged warpgroup after [`wgmma_fence`]; the descriptors name
    /// shared memory of the block that holds the operands (written and made visible to the
    /// async proxy by [`fence_proxy_async_shared`] and a barrier) and that nothing writes
    /// until a [`wgmma_wait`] retires this operation; `self` is neither read nor written
    /// until then.
    unsafe fn mma(
        &mut self,
        input: WgmmaInput,
        trans: (bool, bool),
        a: SmemDescriptor,
        b: SmemDescriptor,
        accumulate: bool,
    );

    /// A compiler-only fence on every register of `self` (it emits no instruction): reads
    /// and writes of the accumulators stay on their side of it, and of the `wgmma_*`
    /// instructions around it.
    fn fence_operands(&mut self);
}

/// `"{0}, {1}, .."` for the listed operand positions.
macro_rules! operand_list {
    ($first:literal $($rest:literal)*) => {
        concat!("{", stringify!($first), "}" $(, ", {", stringify!($rest), "}")*)
    };
}

/// One `wgmma.mma_async` of an accumulator tile with registers at positions `$i`.
macro_rules! wgmma_asm {
    ($acc:ident, $n:literal, $ty:literal, $ta:literal, $tb:literal, $a:ident, $b:ident, $sd:ident,
     [$($i:literal)*]) => {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {sd}, 0;",
            concat!(
                "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{",
                operand_list!($($i)*),
                "}}, {da}, {db}, p, 1, 1, ", $ta, ", ", $tb, ";"
            ),
            "}}",
            $(inout(reg32) $acc[$i / 4][$i % 4],)*
            da = in(reg64) $a.0,
            db = in(reg64) $b.0,
            sd = in(reg32) $sd,
            options(nostack, preserves_flags),
        )
    };
}

/// Implements [`Accumulators`] for the `[[f32; 4]; N / 8]` tile of `wgmma.m64nNk16`, whose
/// `N / 2` registers are at positions `$i`.
macro_rules! accumulators {
    ($n:literal, [$($i:literal)*]) => {
        impl Accumulators for [[f32; 4]; $n / 8] {
            const N: u32 = $n;

            #[inline(always)]
            unsafe fn mma(
                &mut self,
                input: WgmmaInput,
                (trans_a, trans_b): (bool, bool),
                a: SmemDescriptor,
                b: SmemDescriptor,
                accumulate: bool,
            ) {
                let scale_d = accumulate as u32;
                match (input, trans_a, trans_b) {
                    (WgmmaInput::F16, false, false) => wgmma_asm!(self, $n, "f16", "0", "0", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::F16, false, true) => wgmma_asm!(self, $n, "f16", "0", "1", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::F16, true, false) => wgmma_asm!(self, $n, "f16", "1", "0", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::F16, true, true) => wgmma_asm!(self, $n, "f16", "1", "1", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::Bf16, false, false) => wgmma_asm!(self, $n, "bf16", "0", "0", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::Bf16, false, true) => wgmma_asm!(self, $n, "bf16", "0", "1", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::Bf16, true, false) => wgmma_asm!(self, $n, "bf16", "1", "0", a, b, scale_d, [$($i)*]),
                    (WgmmaInput::Bf16, true, true) => wgmma_asm!(self, $n, "bf16", "1", "1", a, b, scale_d, [$($i)*]),
                }
            }

            #[inline(always)]
            fn fence_operands(&mut self) {
                // SAFETY: an empty instruction stream (a PTX comment naming the registers).
                unsafe {
                    asm!(
                        concat!("// wgmma accumulators ", operand_list!($($i)*)),
                        $(inout(reg32) self[$i / 4][$i % 4],)*
                        options(nostack, preserves_flags),
                    )
                }
            }
        }
    };
}

accumulators!(
    64,
    [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]
);
accumulators!(
    128,
    [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
     32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]
);
accumulators!(
    256,
    [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
     32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
     64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
     96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127]
);

// ---------------------------------------------------------------------------------------
// mbarriers, TMA bulk tensor copies and register reallocation: the plumbing of the
// warp-specialised core (`gemm::hopper::wgmma_tma_tile`).
// ---------------------------------------------------------------------------------------

/// `mbarrier.init`: the 8-byte barrier at shared `bar` completes a phase after `count`
/// arrivals and the transaction bytes announced for that phase.
///
/// # Safety
/// `bar` is an 8-byte aligned shared address of this block that nothing else uses as a
/// barrier; no thread or copy touches it before [`fence_mbarrier_init`] and a block
/// barrier that follow the init.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    asm!(
        "mbarrier.init.shared::cta.b64 [{bar}], {count};",
        bar = in(reg32) bar,
        count = in(reg32) count,
        options(nostack, preserves_flags)
    )
}

/// `fence.mbarrier_init.release.cluster`: this thread's barrier inits become visible to
/// the async proxy (the TMA unit that completes transactions on them) at the next
/// barrier.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a memory-ordering fence; no operands.
    unsafe {
        asm!(
            "fence.mbarrier_init.release.cluster;",
            options(nostack, preserves_flags)
        )
    }
}

/// One arrival on the barrier at shared `bar` that also announces `bytes` more
/// transaction bytes (TMA copies completing on it) for the current phase.
///
/// # Safety
/// `bar` is an initialised barrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, bytes: u32) {
    asm!(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{bar}], {bytes};",
        bar = in(reg32) bar,
        bytes = in(reg32) bytes,
        options(nostack, preserves_flags)
    )
}

/// One arrival on the barrier at shared `bar` of this block.
///
/// # Safety
/// `bar` is an initialised barrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    asm!(
        "mbarrier.arrive.shared::cta.b64 _, [{bar}];",
        bar = in(reg32) bar,
        options(nostack, preserves_flags)
    )
}

/// Waits until the phase of parity `parity` (0 or 1) of the barrier at shared `bar` has
/// completed (acquire: the data its arrivals and copies released is visible after).
///
/// # Safety
/// `bar` is an initialised barrier of this block; the phase is the current one or the
/// one just before (parity cannot tell older phases apart).
#[inline(always)]
pub unsafe fn mbarrier_wait(bar: u32, parity: u32) {
    loop {
        let done: u32;
        asm!(
            "{{",
            ".reg .pred p;",
            "mbarrier.try_wait.parity.shared::cta.b64 p, [{bar}], {parity};",
            "selp.u32 {done}, 1, 0, p;",
            "}}",
            bar = in(reg32) bar,
            parity = in(reg32) parity,
            done = out(reg32) done,
            options(nostack, preserves_flags)
        );
        if done != 0 {
            return;
        }
    }
}

/// Starts a TMA copy of the box at element coordinates `coords` (innermost first) of the
/// 3-D tensor the tensor map at generic address `map` describes, to shared `dst`; the
/// barrier at `bar` receives the bytes as completed transactions. Coordinates outside the
/// tensor read as zeros.
///
/// # Safety
/// `map` is the address of a valid tensor map in parameter, constant or global memory;
/// `dst` (1024-byte aligned for 128-byte swizzling) holds the whole box and nothing
/// reads or writes it until the barrier's phase completes; the barrier expects these
/// bytes in its current phase.
#[inline(always)]
pub unsafe fn tma_load_3d(dst: u32, map: u64, coords: [u32; 3], bar: u32) {
    asm!(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{c0}, {c1}, {c2}}}], [{bar}];",
        dst = in(reg32) dst,
        map = in(reg64) map,
        c0 = in(reg32) coords[0],
        c1 = in(reg32) coords[1],
        c2 = in(reg32) coords[2],
        bar = in(reg32) bar,
        options(nostack, preserves_flags)
    )
}

/// [`tma_load_3d`] for a 4-D tensor map: the box at `coords` (innermost first, signed:
/// coordinates outside the tensor read as zeros).
///
/// # Safety
/// As [`tma_load_3d`].
#[inline(always)]
pub unsafe fn tma_load_4d(dst: u32, map: u64, coords: [i32; 4], bar: u32) {
    asm!(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{c0}, {c1}, {c2}, {c3}}}], [{bar}];",
        dst = in(reg32) dst,
        map = in(reg64) map,
        c0 = in(reg32) coords[0],
        c1 = in(reg32) coords[1],
        c2 = in(reg32) coords[2],
        c3 = in(reg32) coords[3],
        bar = in(reg32) bar,
        options(nostack, preserves_flags)
    )
}

/// Starts a TMA im2col copy from the 4-D (`[C, W, H, N]`, innermost first) tensor the
/// im2col tensor map at `map` describes: the map's pixels-per-column pixels, each its
/// channels-per-pixel channels from `coords[0]`, walked from pixel `(w, h, n) =
/// coords[1..] + (offsets, 0)` through the map's pixel box (W fastest, then H, then N, in
/// the map's traversal strides), to shared `dst`, one row per pixel; pixels in the
/// padding (outside the tensor) read as zeros. `offsets` = `[w, h]` (the filter tap's
/// reach) also shift the box.
///
/// # Safety
/// As [`tma_load_3d`], for an im2col map.
#[inline(always)]
pub unsafe fn tma_load_im2col_4d(
    dst: u32,
    map: u64,
    coords: [i32; 4],
    offsets: [u16; 2],
    bar: u32,
) {
    asm!(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [{dst}], [{map}, {{{c0}, {c1}, {c2}, {c3}}}], [{bar}], {{{o0}, {o1}}};",
        dst = in(reg32) dst,
        map = in(reg64) map,
        c0 = in(reg32) coords[0],
        c1 = in(reg32) coords[1],
        c2 = in(reg32) coords[2],
        c3 = in(reg32) coords[3],
        bar = in(reg32) bar,
        o0 = in(reg16) offsets[0],
        o1 = in(reg16) offsets[1],
        options(nostack, preserves_flags)
    )
}

/// `setmaxnreg.inc` / `.dec`: this warpgroup's threads take (`INC`) or give back
/// registers until each has `REGS` (a multiple of 8, 24 to 256). The kernel must declare
/// its launch register budget (`.maxnreg` or `.maxntid` + `.minnctapersm`, build.rs).
/// `.inc` waits until the SM's pool holds the registers: the block's increases must fit
/// in what its other warpgroups give back, or it waits forever.
#[inline(always)]
pub fn set_max_registers<const INC: bool, const REGS: u32>() {
    const { assert!(REGS % 8 == 0 && REGS >= 24 && REGS <= 256) };
    // SAFETY: run by all threads of a warpgroup together (`.sync.aligned`); it changes
    // only how many registers the warpgroup holds, which ptxas allocates against.
    unsafe {
        if INC {
            asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const REGS,
                 options(nostack, preserves_flags))
        } else {
            asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const REGS,
                 options(nostack, preserves_flags))
        }
    }
}

/// The generic address of the kernel parameter named `$param` (a string literal: PTX
/// names a kernel's parameters `<kernel>_param_<index>`), as TMA copies need for a tensor
/// map passed by value (CUDA's `__grid_constant__`): the parameter stays in parameter
/// space, which no code writes.
#[macro_export]
macro_rules! kernel_param_address {
    ($param:expr) => {{
        let a: u64;
        // SAFETY: takes the address of a parameter of the kernel being compiled (the
        // caller names one of its own); no memory access.
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {a}, ", $param, ";"),
                "cvta.param.u64 {a}, {a};",
                a = out(reg64) a,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        a
    }};
}
