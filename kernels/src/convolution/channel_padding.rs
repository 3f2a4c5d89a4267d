//! `conv_fwd_pad_channels_b<16|32>_u<16|8>`: stages a convolution operand with few
//! channels per group (an RGB first layer's x and filter) into dense rows with the
//! channels padded to a whole copy unit and zeros in the padding, optionally with strided
//! spatial dims folded into the channels (space to depth), for the implicit GEMM's packed
//! kernels ([`super::implicit_gemm::Packed`]). Layout and indexing:
//! [`ConvPadChannelsParams`]. One thread per 16-byte destination chunk: a unit at a time,
//! one split of its position and first channel, then its channels loaded one by one (any
//! source strides: channels-last or not) and the chunk stored whole.

use crate::convolution::implicit_gemm::{load_element, pack};
use crate::device::{grid_stride, st_global_v4};
use crate::element::F16;
use crate::gemm::{MmaElement, Tf32};
use crate::unrolled;
use oxidnn_params::ConvPadChannelsParams;

/// Most elements in a unit (8 16-bit ones in 16 bytes).
const MAX_PER_UNIT: usize = 8;

#[inline(always)]
unsafe fn pad_channels<E: MmaElement, const UNIT: u32>(
    p: &ConvPadChannelsParams,
    src: *const u8,
    dst: *mut u32,
) {
    let per_unit = UNIT / E::BYTES;
    let units = 16 / UNIT;
    grid_stride(p.items as u64, |item| {
        let item = item as u32;
        let (row, chunk) = p.row_chunks.div_rem(item);
        let mut words = [0u32; 4];
        unrolled!(h in 2 => if (h as u32) < units {
            // A unit lies inside one group of one position (`per_unit` divides `c_pad`).
            let kk = (chunk * units + h as u32) * per_unit;
            let (position, rest) = p.block.div_rem(kk);
            let (group, ch0) = p.c_pad.div_rem(rest);
            if position < p.positions {
                let (q, p2) = p.p2.div_rem(position);
                let (p0, p1) = p.p1.div_rem(q);
                let at = [p0, p1, p2];
                // The unit's first channel as (phase per dim, channel); stepped below.
                let (q, mut c) = p.channels_div.div_rem(ch0);
                let (q, f2) = p.fold2.div_rem(q);
                let (f0, f1) = p.fold1.div_rem(q);
                let mut f = [f0, f1, f2];
                let base = row * p.src[0] + group * p.channels * p.src[1];
                unrolled!(e in MAX_PER_UNIT => if (e as u32) < per_unit {
                    if ch0 + (e as u32) < p.depth {
                        let mut inside = true;
                        let mut offset = base + c * p.src[1];
                        unrolled!(j in 3 => {
                            let i = (p.fold[j] * at[j] + f[j]).wrapping_sub(p.offset[j]);
                            inside &= i < p.src_extent[j];
                            let i = if p.reverse != 0 {
                                p.src_extent[j].wrapping_sub(1).wrapping_sub(i)
                            } else {
                                i
                            };
                            offset = offset.wrapping_add(i.wrapping_mul(p.src[2 + j]));
                        });
                        if inside {
                            // SAFETY: (row, group * channels + c, i) is an element of the
                            // source the caller's contract says `src` covers.
                            let v = load_element::<E>(
                                src.add(offset as usize * E::BYTES as usize),
                            );
                            pack::<E>(&mut words, h as u32 * per_unit + e as u32, v);
                        }
                        // The next channel: c fastest, then the phases, innermost dim first.
                        c += 1;
                        if c == p.channels {
                            c = 0;
                            f[2] += 1;
                            if f[2] == p.fold[2] {
                                f[2] = 0;
                                f[1] += 1;
                                if f[1] == p.fold[1] {
                                    f[1] = 0;
                                    f[0] += 1;
                                }
                            }
                        }
                    }
                });
            }
        });
        // SAFETY: chunk `item` of the destination, which the caller's contract says `dst`
        // covers (`items` chunks, 16-byte aligned).
        st_global_v4(dst.add(item as usize * 4), words);
    });
}

/// Stamps out `conv_fwd_pad_channels_<bits>_<unit>`: `(bits, unit, element, UNIT)`; the
/// kernels move bits, so f16 and bf16 share theirs.
macro_rules! pad_channels_entry_point {
    ($bits:ident, $unit:ident, $E:ty, $u:literal) => {
        paste::paste! {
            /// # Safety
            /// `src` covers the source `p` describes (every offset below 2^31 elements),
            /// `dst` is 16-byte aligned and holds `p.items` 16-byte chunks, and the two do
            /// not overlap.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_pad_channels_ $bits _ $unit>](
                p: ConvPadChannelsParams, src: *const u8, dst: *mut u32,
            ) {
                pad_channels::<$E, $u>(&p, src, dst)
            }
        }
    };
}

pad_channels_entry_point!(b16, u16, F16, 16);
pad_channels_entry_point!(b16, u8, F16, 8);
pad_channels_entry_point!(b32, u16, Tf32, 16);
