//! Element types of device tensors. Kernels are written once, generic over [`Element`],
//! and compute in f32; each type only says how it is loaded, stored and converted.

use crate::device::{self, Vec16};

/// IEEE half precision, as its bits.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, as its bits.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// Elements a packed kernel moves per chunk: 8 (32 bytes of f32, 16 bytes of f16/bf16).
pub const CHUNK: usize = oxidnn_params::PACKED_CHUNK;

/// A tensor element type: storage in memory, arithmetic in f32.
pub trait Element: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;

    /// Loads one element.
    ///
    /// # Safety
    /// `p` is valid for reads.
    #[inline(always)]
    unsafe fn load(p: *const Self) -> f32 {
        (*p).to_f32()
    }

    /// Stores one element.
    ///
    /// # Safety
    /// `p` is valid for writes.
    #[inline(always)]
    unsafe fn store(p: *mut Self, v: f32) {
        *p = Self::from_f32(v);
    }

    /// Loads [`CHUNK`] consecutive elements with 16-byte vector loads.
    ///
    /// # Safety
    /// `p` is 16-byte aligned; the chunk is readable; `read_only` only if no thread of this
    /// launch writes it.
    unsafe fn load_chunk(p: *const Self, read_only: bool) -> [f32; CHUNK];

    /// Stores [`CHUNK`] consecutive elements with 16-byte vector stores.
    ///
    /// # Safety
    /// `p` is 16-byte aligned and the chunk is writable.
    unsafe fn store_chunk(p: *mut Self, v: [f32; CHUNK]);
}

#[inline(always)]
unsafe fn load_v4(p: *const u32, read_only: bool) -> Vec16 {
    if read_only {
        device::ld_global_nc_v4(p)
    } else {
        device::ld_global_v4(p)
    }
}

impl Element for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }

    #[inline(always)]
    unsafe fn load_chunk(p: *const Self, read_only: bool) -> [f32; CHUNK] {
        let lo = load_v4(p as *const u32, read_only);
        let hi = load_v4((p as *const u32).add(4), read_only);
        let mut out = [0.0; CHUNK];
        for i in 0..4 {
            out[i] = f32::from_bits(lo[i]);
            out[i + 4] = f32::from_bits(hi[i]);
        }
        out
    }

    #[inline(always)]
    unsafe fn store_chunk(p: *mut Self, v: [f32; CHUNK]) {
        let mut lo = [0u32; 4];
        let mut hi = [0u32; 4];
        for i in 0..4 {
            lo[i] = v[i].to_bits();
            hi[i] = v[i + 4].to_bits();
        }
        device::st_global_v4(p as *mut u32, lo);
        device::st_global_v4((p as *mut u32).add(4), hi);
    }
}

/// Implements [`Element`] for a 16-bit type stored as `u16` bits, given its two
/// conversions: the 8 elements of a chunk are one 16-byte vector, two per word.
macro_rules! half_element {
    ($t:ident, $to_f32:path, $from_f32:path) => {
        impl Element for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to_f32(self.0)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $t($from_f32(v))
            }

            #[inline(always)]
            unsafe fn load_chunk(p: *const Self, read_only: bool) -> [f32; CHUNK] {
                let w = load_v4(p as *const u32, read_only);
                let mut out = [0.0; CHUNK];
                for i in 0..4 {
                    out[2 * i] = $to_f32(w[i] as u16);
                    out[2 * i + 1] = $to_f32((w[i] >> 16) as u16);
                }
                out
            }

            #[inline(always)]
            unsafe fn store_chunk(p: *mut Self, v: [f32; CHUNK]) {
                let mut w = [0u32; 4];
                for i in 0..4 {
                    w[i] = $from_f32(v[2 * i]) as u32 | (($from_f32(v[2 * i + 1]) as u32) << 16);
                }
                device::st_global_v4(p as *mut u32, w);
            }
        }
    };
}

half_element!(F16, device::f16_to_f32, device::f32_to_f16);
half_element!(Bf16, device::bf16_to_f32, device::f32_to_bf16);

/// Stamps out entry points for every element type: `$mac!(suffix, Type)` for each.
#[macro_export]
macro_rules! for_each_dtype {
    ($mac:ident) => {
        $mac!(f32, f32);
        $mac!(f16, $crate::element::F16);
        $mac!(bf16, $crate::element::Bf16);
    };
}

/// Stamps out entry points for every ordered pair of element types:
/// `$mac!(src_suffix, SrcType, dst_suffix, DstType)`.
#[macro_export]
macro_rules! for_each_dtype_pair {
    ($mac:ident) => {
        $crate::for_each_dtype_pair!(@src $mac, f32, f32);
        $crate::for_each_dtype_pair!(@src $mac, f16, $crate::element::F16);
        $crate::for_each_dtype_pair!(@src $mac, bf16, $crate::element::Bf16);
    };
    (@src $mac:ident, $s:ident, $S:ty) => {
        $mac!($s, $S, f32, f32);
        $mac!($s, $S, f16, $crate::element::F16);
        $mac!($s, $S, bf16, $crate::element::Bf16);
    };
}
