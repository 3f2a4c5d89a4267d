//! TMA tensor maps for the `wgmma_matmul_tma_*` kernels: each operand described to the
//! driver (`cuTensorMapEncodeTiled`) as the 3-D tensor `oxidnn_params::TmaOperands` says,
//! in boxes of [`TMA_BOX`] x [`TMA_BOX`] 16-bit elements, 128-byte swizzled (the layout the
//! kernels' `wgmma` descriptors read).

use crate::dtype::DataType;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use oxidnn_params::{OperandLayout, TensorMap, TMA_BOX};

/// The byte alignment TMA needs of an operand's address and of its strides.
pub(super) const TMA_ALIGN: u64 = 16;

/// The tensor map of an operand of `rows` rows (M for A, N for B) by `k`, in `batch`
/// batches, of 16-bit `dtype` elements at device address `ptr` with layout `l`
/// (elements; extent-1 dims at stride 0). `k_major`: K is the contiguous dim (else the
/// rows are). The caller has checked that the strides it uses are multiples of 8
/// elements, and `ptr` of 16 bytes.
pub(super) fn operand_map(
    dtype: DataType,
    l: &OperandLayout,
    (rows, k, batch): (usize, usize, usize),
    ptr: u64,
    k_major: bool,
) -> Result<TensorMap> {
    let data_type = match dtype {
        DataType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DataType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        other => {
            return Err(Error::unsupported(format!(
                "TMA matmul kernels take f16 or bf16 operands, not {other}"
            )))
        }
    };
    let bytes = dtype.size_bytes() as u64;
    let (inner, outer, outer_stride) = if k_major {
        (k, rows, l.mn)
    } else {
        (rows, k, l.k)
    };
    let batches = if l.batch == 0 { 1 } else { batch };
    let dims = [inner as u64, outer as u64, batches as u64];
    // A dim of extent 1 has stride 0 in the layout, which the driver refuses; any aligned
    // stride does there (only index 0 exists), so take the packed one.
    let packed = |stride: u64, fallback: u64| {
        if stride == 0 {
            fallback.next_multiple_of(TMA_ALIGN)
        } else {
            stride * bytes
        }
    };
    let s1 = packed(outer_stride, dims[0] * bytes);
    let s2 = packed(l.batch, dims[1] * s1);
    let strides = [s1, s2];
    let boxes = [TMA_BOX, TMA_BOX, 1];
    let element_strides = [1u32; 3];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer argument points at a live local array of the rank (3) or
    // rank - 1 (strides) entries the driver reads; `map` is 64-byte aligned (its type's
    // alignment) and written only by the driver. The driver validates sizes, strides
    // and alignment and returns an error rather than encoding an invalid map.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            3,
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
            "cuTensorMapEncodeTiled refused the operand (dims {dims:?}, byte strides {strides:?}): {e:?}"
        ))
    })?;
    Ok(TensorMap(map.opaque))
}
