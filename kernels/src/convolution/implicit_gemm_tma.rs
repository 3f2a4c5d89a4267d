//! The implicit GEMM on the warp-specialised TMA core (`sm_90a`):
//! `wgmma_conv_fwd_tma_128x<BN>_<f16|bf16>`, the GEMM of [`super::implicit_gemm`]
//! (`ConvGemmParams`: rows are output pixels, K runs over the stored filter taps and then
//! the group's channels in blocks of 64) on matmul's [`wgmma_tma_tile`], with both operands
//! copied by the TMA unit:
//!
//! * [`Im2colTma`] (A): one TMA *im2col* copy per K tile brings the block's 128 output
//!   pixels' input pixels under the tile's filter tap, 64 channels each. The host's
//!   tensor map describes channels-last x as `[C, W, H, N]` with a pixel box of one
//!   output row's window per image (`-pad ..`, traversal strides = the convolution's
//!   strides), so the unit walks output pixels in GEMM row order itself (wrapping across
//!   rows and images) and fills the padding, rows past the output and channels past C
//!   with zeros. The copy's offsets are the tap's reach ([`KTile::reach`]: reversed in
//!   convolution mode, times the dilation).
//! * [`FilterTma`] (B): tiled copies of the KRSC filter described as `[C, S, R, K]`, 64
//!   output channels by 64 channels per box at the stored tap.
//!
//! 2-D problems (depth 1) only; the host checks what the tensor maps need (see
//! `src/ops/convolution/implicit_gemm_tensor_op.rs`). Entry points
//! `(params, x, w, y, bias, z, maps)` with `maps` an [`oxidnn_params::TmaOperands`] by
//! value (A: x's im2col map, B: the filter's); x and w are not read through their
//! pointers.

use super::implicit_gemm::{ConvGemmEpilogue, KTile};
use crate::device::hopper::{tma_load_4d, tma_load_im2col_4d, Accumulators};
use crate::device::{block_idx_x, block_idx_y, dynamic_smem};
use crate::element::{Bf16, Element, F16};
use crate::gemm::hopper::{wgmma_tma_tile, TmaTileLoader, WgmmaElement};
use crate::gemm::{mma_stage_bytes, MmaElement};
use oxidnn_params::{
    conv_tma_blocks_per_sm, tile_coords, tma_shared_bytes, tma_stages, ConvGemmParams, TensorMap,
    TmaOperands, MMA_BK_BYTES, TMA_BOX, WGMMA_BM,
};

/// Bytes of one stage row: 64 16-bit channels.
const ROW_BYTES: u32 = MMA_BK_BYTES;

/// The A operand: the block's output pixels under each K tile's filter tap, copied by
/// TMA in im2col mode (128 pixels by 64 channels per copy).
pub struct Im2colTma<'a> {
    p: &'a ConvGemmParams,
    /// Generic address of x's im2col tensor map.
    map: u64,
    /// The group's first channel of x.
    c0: u32,
    /// `(w, h, n)` of the window origin of the block's first output pixel (`o * stride -
    /// pad`, negative in the padding).
    origin: [i32; 3],
}

impl TmaTileLoader for Im2colTma<'_> {
    const K_MAJOR: bool = true;

    /// One im2col copy of `WGMMA_BM` pixels (the map's pixels per column; `rows` is that).
    #[inline(always)]
    unsafe fn load(&self, stage: u32, kt: u32, _rows: u32, bar: u32) {
        let tile = KTile::of(self.p, kt, TMA_BOX);
        let reach = tile.reach(&self.p.geo);
        let [w, h, n] = self.origin;
        let c = (self.c0 + tile.c0) as i32;
        tma_load_im2col_4d(
            stage,
            self.map,
            [c, w, h, n],
            [reach[2] as u16, reach[1] as u16],
            bar,
        );
    }
}

/// The B operand: the block's output channels of the filter at each K tile's stored tap.
pub struct FilterTma<'a> {
    p: &'a ConvGemmParams,
    /// Generic address of the filter's tensor map.
    map: u64,
    /// The block's first output channel (group offset included).
    k0: u32,
}

impl TmaTileLoader for FilterTma<'_> {
    const K_MAJOR: bool = true;

    #[inline(always)]
    unsafe fn load(&self, stage: u32, kt: u32, rows: u32, bar: u32) {
        let tile = KTile::of(self.p, kt, TMA_BOX);
        let [_, r, s] = tile.tap;
        let mut row = 0;
        while row < rows {
            let k = (self.k0 + row) as i32;
            tma_load_4d(
                stage + row * ROW_BYTES,
                self.map,
                [tile.c0 as i32, s as i32, r as i32, k],
                bar,
            );
            row += TMA_BOX;
        }
    }
}

/// Block `(b, g)`: output tile [`tile_coords`]`(b)` of group `g` on [`wgmma_tma_tile`];
/// `maps` is the generic address of the kernel's [`TmaOperands`].
#[inline(always)]
unsafe fn conv_tma<E, const BN: u32, const STAGES: u32, const PER_SM: u32, const NI: usize>(
    p: &ConvGemmParams,
    maps: u64,
    (y, bias, z): (*mut E, *const E, *const E),
) where
    E: WgmmaElement + Element,
    [[f32; 4]; NI]: Accumulators,
{
    let g = &p.geo;
    let (tm, tn) = tile_coords(block_idx_x(), p.tiles_m, p.tiles_n);
    let group = block_idx_y();
    let (row0, col0) = (tm * WGMMA_BM, tn * BN);
    // Row 0 of every tile is inside the output (tiles_m = ceil(m / 128)).
    let (n, o) = p.pixels.at(row0);
    let origin = |j: usize| (o[j] * g.stride[j]) as i32 - g.pad[j] as i32;
    let a = Im2colTma {
        p,
        map: maps,
        c0: group * g.c_per_group,
        origin: [origin(2), origin(1), n as i32],
    };
    let b = FilterTma {
        p,
        map: maps + core::mem::size_of::<TensorMap>() as u64,
        k0: group * g.k_per_group + col0,
    };
    let ep = ConvGemmEpilogue::of_group(p, (y, bias, z), group);
    wgmma_tma_tile::<E, BN, STAGES, PER_SM, NI, _, _, _>(
        &a,
        &b,
        p.k_tiles * TMA_BOX,
        dynamic_smem(),
        &ep,
        row0,
        col0,
    );
}

/// Stamps out `wgmma_conv_fwd_tma_128x<BN>_<dt>`.
macro_rules! conv_tma_kernel {
    ($dt:ident, $E:ty, $bn:literal) => {
        const _: () = assert!(
            mma_stage_bytes(8, $bn) <= tma_shared_bytes($bn, conv_tma_blocks_per_sm($bn)) - 1024
                && TMA_BOX * <$E as MmaElement>::BYTES == MMA_BK_BYTES
        );
        paste::paste! {
            /// # Safety
            /// `maps` describe x and the filter as the module says, for the problem `p`
            /// describes; y (and `bias`, `z` where the epilogue reads them) cover their
            /// tensors; the device is sm_90a.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<wgmma_conv_fwd_tma_128x $bn _ $dt>](
                p: ConvGemmParams, _x: *const $E, _w: *const $E, y: *mut $E, bias: *const $E,
                z: *const $E, _maps: TmaOperands,
            ) {
                let maps = crate::kernel_param_address!(concat!(
                    stringify!([<wgmma_conv_fwd_tma_128x $bn _ $dt>]),
                    "_param_6"
                ));
                conv_tma::<$E, $bn, { tma_stages($bn, conv_tma_blocks_per_sm($bn)) }, { conv_tma_blocks_per_sm($bn) }, { $bn / 8 }>(
                    &p, maps, (y, bias, z),
                )
            }
        }
    };
}

conv_tma_kernel!(f16, F16, 256);
conv_tma_kernel!(f16, F16, 128);
conv_tma_kernel!(f16, F16, 64);
conv_tma_kernel!(bf16, Bf16, 256);
conv_tma_kernel!(bf16, Bf16, 128);
conv_tma_kernel!(bf16, Bf16, 64);
