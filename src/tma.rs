//! TMA tensor maps (the driver's `CUtensorMap`, encoded on the host, passed to kernels by
//! value as [`TensorMap`]s): the two encodings oxidnn's Hopper kernels use, both with
//! 128-byte swizzling (the shared-memory layout the `wgmma` descriptors read) for 16-bit
//! elements. The driver validates every argument and refuses a map it cannot encode; the
//! callers check the alignment rules first, so that algorithms decline with a reason
//! before anything is launched.

use crate::dtype::DataType;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use oxidnn_params::TensorMap;

/// The byte alignment TMA needs of a tensor's address and of its strides.
pub(crate) const TMA_ALIGN: u64 = 16;

/// The driver's name for a 16-bit element type.
fn data_type(dtype: DataType) -> Result<sys::CUtensorMapDataType> {
    match dtype {
        DataType::F16 => Ok(sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16),
        DataType::BF16 => Ok(sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16),
        other => Err(Error::unsupported(format!(
            "the TMA kernels take f16 or bf16 tensors, not {other}"
        ))),
    }
}

/// A byte stride for the driver: `stride` elements of `bytes` each, or, for a dim of
/// extent 1 (stride 0 in oxidnn's layouts, which the driver refuses), `fallback` rounded
/// up to [`TMA_ALIGN`] (only index 0 exists there, so any aligned stride describes it).
pub(crate) fn byte_stride(stride: u64, bytes: u64, fallback: u64) -> u64 {
    if stride == 0 {
        fallback.next_multiple_of(TMA_ALIGN)
    } else {
        stride * bytes
    }
}

/// A tiled map of the `R`-D tensor of `dtype` at device address `ptr` with `dims`
/// (innermost first; the innermost contiguous) and byte strides `strides` of dims 1..,
/// copied in boxes of `boxes` elements.
pub(crate) fn tiled<const R: usize>(
    dtype: DataType,
    ptr: u64,
    dims: [u64; R],
    strides: &[u64],
    boxes: [u32; R],
) -> Result<TensorMap> {
    debug_assert_eq!(strides.len() + 1, R);
    let element_strides = [1u32; R];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer argument points at a live local array of the rank (R) or
    // rank - 1 (strides) entries the driver reads; `map` is 64-byte aligned (its type's
    // alignment) and written only by the driver, which validates sizes, strides and
    // alignment and returns an error rather than encoding an invalid map.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type(dtype)?,
            R as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|e| {
        Error::unsupported(format!(
            "cuTensorMapEncodeTiled refused the tensor (dims {dims:?}, byte strides {strides:?}, box {boxes:?}): {e:?}"
        ))
    })?;
    Ok(TensorMap(map.opaque))
}

/// What an im2col map walks: per image, the pixel box from `lower` to the image's extent
/// plus `upper` (per spatial dim, `[w, h]`; both shifted by each copy's offsets) in
/// traversal strides `strides` (`[w, h]`), `pixels` pixels of `channels` channels per
/// copy.
pub(crate) struct Im2colBox {
    pub lower: [i32; 2],
    pub upper: [i32; 2],
    pub strides: [u32; 2],
    pub channels: u32,
    pub pixels: u32,
}

/// An im2col map of the channels-last image batch of `dtype` at `ptr` with `dims` `[C, W,
/// H, N]` (channels contiguous) and byte strides `strides` of W, H and N.
pub(crate) fn im2col(
    dtype: DataType,
    ptr: u64,
    dims: [u64; 4],
    strides: [u64; 3],
    walk: &Im2colBox,
) -> Result<TensorMap> {
    let element_strides = [1, walk.strides[0], walk.strides[1], 1];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: as in `tiled`: live local arrays of the entries the driver reads for a
    // rank-4 im2col map (4 dims and element strides, 3 strides, 2 corner coordinates).
    unsafe {
        sys::cuTensorMapEncodeIm2col(
            &mut map,
            data_type(dtype)?,
            4,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            walk.lower.as_ptr(),
            walk.upper.as_ptr(),
            walk.channels,
            walk.pixels,
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(|e| {
        Error::unsupported(format!(
            "cuTensorMapEncodeIm2col refused the tensor (dims {dims:?}, byte strides {strides:?}, box {:?}..{:?} by {:?}): {e:?}",
            walk.lower, walk.upper, walk.strides
        ))
    })?;
    Ok(TensorMap(map.opaque))
}
