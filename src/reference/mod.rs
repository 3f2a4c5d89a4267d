//! The CPU reference: straightforward loops in f64 over logical indices, written
//! independently of the kernels. The CPU handle runs it; tests and benches compare the GPU
//! against it.

pub mod activation;
pub mod batch_norm;
pub mod convolution;
pub mod dropout;
pub mod layer_norm;
pub mod lrn;
pub mod matmul;
pub mod pooling;
pub mod reduce;
pub mod softmax;
pub mod tensor_ops;

use crate::host_tensor::HostTensor;

/// `alpha * v + beta * old`, where `old` is not read when `beta == 0` (cuDNN semantics).
pub fn blend(alpha: f64, v: f64, beta: f64, old: f64) -> f64 {
    if beta == 0.0 {
        alpha * v
    } else {
        alpha * v + beta * old
    }
}

/// Writes `f(index)` blended into every logical element of `out`.
pub(crate) fn write_blended(
    out: &mut HostTensor,
    alpha: f64,
    beta: f64,
    mut f: impl FnMut(&[usize]) -> f64,
) {
    let desc = out.desc;
    crate::host_tensor::for_each_index(desc.dims(), |idx| {
        let old = out.get(idx);
        let v = blend(alpha, f(idx), beta, old);
        out.set(idx, v);
    });
}
