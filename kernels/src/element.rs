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

/// A tensor element type: storage in memory, arithmetic in f32.
///
/// Vector accesses move `K` consecutive elements (8 or 16 bytes) as raw words, which stay
/// packed in registers until [`Element::unpack`]: a 16-bit type keeps two elements per
/// register while its loads are in flight.
pub trait Element: Copy {
    /// Whether results are stored with 16-bit precision, so that math good to about 2^-11
    /// relative is enough.
    const LOW_PRECISION: bool;

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

    /// Loads two consecutive elements (one 32-bit load for 16-bit types).
    ///
    /// # Safety
    /// Both are readable; for 16-bit types `p` is 4-byte aligned.
    #[inline(always)]
    unsafe fn load_pair(p: *const Self) -> [f32; 2] {
        [Self::load(p), Self::load(p.add(1))]
    }

    /// Stores two consecutive elements (one 32-bit store for 16-bit types).
    ///
    /// # Safety
    /// Both are writable; for 16-bit types `p` is 4-byte aligned.
    #[inline(always)]
    unsafe fn store_pair(p: *mut Self, v: [f32; 2]) {
        Self::store(p, v[0]);
        Self::store(p.add(1), v[1]);
    }

    /// Loads `K` consecutive elements (`K * size` bytes: 4, 8 or 16) with one load, as raw
    /// words (a narrower load fills the first one or two).
    ///
    /// # Safety
    /// `p` is aligned to `K * size` bytes; the elements are readable; `read_only` only if
    /// no thread of this launch writes them.
    #[inline(always)]
    unsafe fn load_raw<const K: usize>(p: *const Self, read_only: bool) -> Vec16 {
        let p = p as *const u32;
        match (K * size_of::<Self>(), read_only) {
            (16, true) => device::ld_global_nc_v4(p),
            (16, false) => device::ld_global_v4(p),
            (8, true) => widen(device::ld_global_nc_v2(p)),
            (8, false) => widen(device::ld_global_v2(p)),
            (4, _) => [p.read(), 0, 0, 0],
            _ => device::trap(),
        }
    }

    /// Loads one element as its raw bits, zero-extended to a word: the first element of
    /// [`Element::unpack`]`::<1>([bits, 0, 0, 0])`.
    ///
    /// # Safety
    /// `p` is valid for reads.
    #[inline(always)]
    unsafe fn load_bits(p: *const Self) -> u32 {
        match size_of::<Self>() {
            4 => *(p as *const u32),
            2 => *(p as *const u16) as u32,
            _ => device::trap(),
        }
    }

    /// The `K` elements of raw words from [`Element::load_raw`].
    fn unpack<const K: usize>(w: Vec16) -> [f32; K];

    /// Stores `K` consecutive elements (`K * size` bytes: 4, 8 or 16) with one store.
    ///
    /// # Safety
    /// `p` is aligned to `K * size` bytes and the elements are writable.
    #[inline(always)]
    unsafe fn store_vec<const K: usize>(p: *mut Self, v: [f32; K]) {
        let w = Self::pack::<K>(v);
        let p = p as *mut u32;
        match K * size_of::<Self>() {
            16 => device::st_global_v4(p, w),
            8 => device::st_global_v2(p, [w[0], w[1]]),
            4 => p.write(w[0]),
            _ => device::trap(),
        }
    }

    /// Raw words holding `K` elements.
    fn pack<const K: usize>(v: [f32; K]) -> Vec16;

    /// A word of raw elements that are all -inf: the identity of [`Element::max_words`].
    const NEG_INF_WORD: u32;

    /// The element-wise max of two words of raw elements (one f32, or two of a 16-bit
    /// type, both in one instruction): a NaN operand yields the other (two NaNs, NaN), or,
    /// with `propagate`, NaN.
    fn max_words(a: u32, b: u32, propagate: bool) -> u32;

    /// Element-wise `a == b` (NaN equals nothing, +0 equals -0) of `K` elements each, as
    /// raw words from [`Element::load_raw`].
    #[inline(always)]
    fn equal<const K: usize>(a: Vec16, b: Vec16) -> [bool; K] {
        let (a, b) = (Self::unpack::<K>(a), Self::unpack::<K>(b));
        core::array::from_fn(|k| a[k] == b[k])
    }

    /// [`Element::equal`] as a mask in the elements' own bits: all ones over each element
    /// equal to its counterpart, zero elsewhere (and past `K`), so that `w & mask` keeps
    /// the raw elements of `w` where they are equal and makes the others +0.
    #[inline(always)]
    fn equal_mask<const K: usize>(a: Vec16, b: Vec16) -> Vec16 {
        elements_mask::<Self, K>(Self::equal::<K>(a, b))
    }

    /// [`Element::equal_mask`] with NaN equal to NaN ([`same_value`]).
    #[inline(always)]
    fn same_mask<const K: usize>(a: Vec16, b: Vec16) -> Vec16 {
        let (a, b) = (Self::unpack::<K>(a), Self::unpack::<K>(b));
        elements_mask::<Self, K>(core::array::from_fn(|k| same_value(a[k], b[k])))
    }
}

/// Whether `v` is `y` where NaN equals NaN (+0 equals -0), as max pooling's backward finds
/// a window's element equal to its y. Evaluated without branches.
#[inline(always)]
pub fn same_value(v: f32, y: f32) -> bool {
    (v == y) | ((v != v) & (y != y))
}

/// The mask of [`Element::equal_mask`] over the raw words of `K` elements of `T` where
/// `set` holds.
#[inline(always)]
fn elements_mask<T: Element, const K: usize>(set: [bool; K]) -> Vec16 {
    let bits = 8 * size_of::<T>();
    let per_word = 32 / bits;
    let ones = u32::MAX >> (32 - bits);
    let mut mask = [0u32; 4];
    crate::unrolled!(k in K => {
        mask[(k / per_word) % 4] |= ((set[k] as u32).wrapping_neg() & ones) << (bits * (k % per_word));
    });
    mask
}

#[inline(always)]
fn widen(w: [u32; 2]) -> Vec16 {
    [w[0], w[1], 0, 0]
}

impl Element for f32 {
    const LOW_PRECISION: bool = false;
    const NEG_INF_WORD: u32 = f32::NEG_INFINITY.to_bits();

    #[inline(always)]
    fn max_words(a: u32, b: u32, propagate: bool) -> u32 {
        let (a, b) = (f32::from_bits(a), f32::from_bits(b));
        let max = if propagate {
            device::max_propagate_nan(a, b)
        } else {
            device::max_ignore_nan(a, b)
        };
        max.to_bits()
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn unpack<const K: usize>(w: Vec16) -> [f32; K] {
        core::array::from_fn(|i| f32::from_bits(w[i % 4]))
    }
    #[inline(always)]
    fn pack<const K: usize>(v: [f32; K]) -> Vec16 {
        core::array::from_fn(|i| if i < K { v[i].to_bits() } else { 0 })
    }
}

/// Implements [`Element`] for a 16-bit type stored as `u16` bits, given its scalar
/// conversions, its paired f32x2 -> 16x2 conversion (one instruction for two), its packed
/// maxima (NaN skipped, NaN propagated) and its -inf bits.
macro_rules! half_element {
    ($t:ident, $to_f32:path, $from_f32:path, $pair_from_f32:path, $pair_max:path,
     $pair_max_nan:path, $neg_inf:literal $(, $pair_equal:path, $pair_equal_mask:path)?) => {
        impl Element for $t {
            const LOW_PRECISION: bool = true;
            const NEG_INF_WORD: u32 = $neg_inf * 0x1_0001;

            #[inline(always)]
            fn max_words(a: u32, b: u32, propagate: bool) -> u32 {
                if propagate {
                    $pair_max_nan(a, b)
                } else {
                    $pair_max(a, b)
                }
            }

            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to_f32(self.0)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $t($from_f32(v))
            }
            #[inline(always)]
            fn unpack<const K: usize>(w: Vec16) -> [f32; K] {
                core::array::from_fn(|i| $to_f32((w[(i / 2) % 4] >> (16 * (i % 2))) as u16))
            }
            #[inline(always)]
            fn pack<const K: usize>(v: [f32; K]) -> Vec16 {
                core::array::from_fn(|i| {
                    if 2 * i + 1 < K {
                        $pair_from_f32(v[2 * i], v[2 * i + 1])
                    } else {
                        0
                    }
                })
            }
            #[inline(always)]
            unsafe fn load_pair(p: *const Self) -> [f32; 2] {
                let w = *(p as *const u32);
                [$to_f32(w as u16), $to_f32((w >> 16) as u16)]
            }
            #[inline(always)]
            unsafe fn store_pair(p: *mut Self, v: [f32; 2]) {
                *(p as *mut u32) = $pair_from_f32(v[0], v[1]);
            }
            $(
                /// Two elements a comparison, as they are packed.
                #[inline(always)]
                fn equal<const K: usize>(a: Vec16, b: Vec16) -> [bool; K] {
                    core::array::from_fn(|k| $pair_equal(a[(k / 2) % 4], b[(k / 2) % 4])[k % 2])
                }
                /// Two elements a comparison, as they are packed.
                #[inline(always)]
                fn equal_mask<const K: usize>(a: Vec16, b: Vec16) -> Vec16 {
                    core::array::from_fn(|w| if 2 * w < K { $pair_equal_mask(a[w], b[w]) } else { 0 })
                }
            )?
        }
    };
}

half_element!(
    F16,
    device::f16_to_f32,
    device::f32_to_f16,
    device::f32x2_to_f16x2,
    device::max_f16x2,
    device::max_nan_f16x2,
    0xfc00,
    device::eq_f16x2,
    device::eq_mask_f16x2
);
half_element!(
    Bf16,
    device::bf16_to_f32,
    device::f32_to_bf16,
    device::f32x2_to_bf16x2,
    device::max_bf16x2,
    device::max_nan_bf16x2,
    0xff80
);

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
