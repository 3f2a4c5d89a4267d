//! Element types of tensors, and the host types that stand for them.

use half::{bf16, f16};

/// The element type of a tensor (cuDNN's `cudnnDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    F32,
    F16,
    BF16,
    /// Double precision: CPU handle only (the GPU kernels do not take it).
    F64,
}

impl DataType {
    /// Every data type.
    pub const ALL: [DataType; 4] = [DataType::F32, DataType::F16, DataType::BF16, DataType::F64];
    /// The data types the GPU kernels take.
    pub const GPU: [DataType; 3] = [DataType::F32, DataType::F16, DataType::BF16];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F64 => 8,
        }
    }

    /// A short lower-case name (`"f32"`, ...), as used in kernel and problem names.
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::F64 => "f64",
        }
    }

    /// Rounds `v` to the nearest value this type can hold.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DataType::F32 => v as f32 as f64,
            DataType::F16 => f16::from_f32(to_f32_round_to_odd(v)).to_f64(),
            DataType::BF16 => bf16::from_f32(to_f32_round_to_odd(v)).to_f64(),
            DataType::F64 => v,
        }
    }

    /// Decodes the element stored in `bytes` (little endian, `size_bytes` long).
    pub(crate) fn decode(self, bytes: &[u8]) -> f64 {
        match self {
            DataType::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as f64,
            DataType::F16 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
            DataType::BF16 => bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
            DataType::F64 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&bytes[..8]);
                f64::from_le_bytes(b)
            }
        }
    }

    /// Encodes `v`, rounded to this type, into `bytes`.
    pub(crate) fn encode(self, v: f64, bytes: &mut [u8]) {
        match self {
            DataType::F32 => bytes[..4].copy_from_slice(&(v as f32).to_le_bytes()),
            DataType::F16 => {
                bytes[..2].copy_from_slice(&f16::from_f32(to_f32_round_to_odd(v)).to_le_bytes())
            }
            DataType::BF16 => {
                bytes[..2].copy_from_slice(&bf16::from_f32(to_f32_round_to_odd(v)).to_le_bytes())
            }
            DataType::F64 => bytes[..8].copy_from_slice(&v.to_le_bytes()),
        }
    }
}

/// `v` rounded to f32 with round-to-odd: exact values stay, inexact ones become the f32
/// toward zero with its last bit set. Rounding that result to any format of at most 22
/// significand bits (f16, bf16) with round-to-nearest-even equals rounding `v` directly,
/// which `half`'s own f64 conversions do not guarantee (they drop low bits first).
fn to_f32_round_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    if !v.is_finite() || nearest as f64 == v || nearest.is_infinite() {
        return nearest;
    }
    let toward_zero = if (nearest as f64).abs() > v.abs() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_half_types_is_correct_from_f64() {
        // An f32 just above a bf16 tie: the bits half's f64 path drops decide the rounding.
        let v = f32::from_bits(0x3F80_8001) as f64; // 1 + 2^-8 + 2^-23
        assert_eq!(DataType::BF16.round(v), 1.0 + 2.0f64.powi(-7));
        let tie = f32::from_bits(0x3F80_8000) as f64; // exactly halfway: to even
        assert_eq!(DataType::BF16.round(tie), 1.0);
        // f64 values closer than f32 can resolve.
        let just_above = 1.0 + 2.0f64.powi(-11) + 2.0f64.powi(-40);
        assert_eq!(DataType::F16.round(just_above), 1.0 + 2.0f64.powi(-10));
        assert_eq!(DataType::F16.round(1.0 + 2.0f64.powi(-11)), 1.0);
        assert_eq!(DataType::F16.round(1e6), f64::INFINITY);
        assert!(DataType::BF16.round(f64::NAN).is_nan());
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host type whose values can be copied to and from buffers.
pub trait HostElement: Copy + Default + 'static {
    /// The tensor data type it stands for, or `None` for non-tensor data (indices).
    const DTYPE: Option<DataType>;
    fn to_le(self, out: &mut [u8]);
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! host_element {
    ($t:ty, $dt:expr) => {
        impl HostElement for $t {
            const DTYPE: Option<DataType> = $dt;
            fn to_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn from_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
    };
}

host_element!(f32, Some(DataType::F32));
host_element!(f64, Some(DataType::F64));
host_element!(f16, Some(DataType::F16));
host_element!(bf16, Some(DataType::BF16));
host_element!(u32, None);
