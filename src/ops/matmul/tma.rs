//! TMA tensor maps for the `wgmma_matmul_tma_*` kernels: each operand described to the
//! driver (`cuTensorMapEncodeTiled`) as the 3-D tensor `oxidnn_params::TmaOperands` says,
//! in boxes of [`TMA_BOX`] x [`TMA_BOX`] 16-bit elements, 128-byte swizzled (the layout the
//! kernels' `wgmma` descriptors read).

use crate::dtype::DataType;
use crate::error::Result;
use crate::tma::{byte_stride, tiled};
use oxidnn_params::{OperandLayout, TensorMap, TMA_BOX};

pub(super) use crate::tma::TMA_ALIGN;

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
    let bytes = dtype.size_bytes() as u64;
    let (inner, outer, outer_stride) = if k_major {
        (k, rows, l.mn)
    } else {
        (rows, k, l.k)
    };
    let batches = if l.batch == 0 { 1 } else { batch };
    let dims = [inner as u64, outer as u64, batches as u64];
    let s1 = byte_stride(outer_stride, bytes, dims[0] * bytes);
    let s2 = byte_stride(l.batch, bytes, dims[1] * s1);
    tiled(dtype, ptr, dims, &[s1, s2], [TMA_BOX, TMA_BOX, 1])
}
