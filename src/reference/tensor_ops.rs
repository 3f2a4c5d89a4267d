//! Reference tensor ops, in f64.

use super::write_blended;
use crate::host_tensor::HostTensor;
use crate::ops::tensor_ops::OpTensorOp;

/// The element of `t` that broadcasts to index `idx` of a larger tensor (dims of 1 in
/// `t` repeat).
pub fn broadcast_get(t: &HostTensor, idx: &[usize]) -> f64 {
    let clamped: Vec<usize> = idx
        .iter()
        .zip(t.desc.dims())
        .map(|(&i, &n)| if n == 1 { 0 } else { i })
        .collect();
    t.get(&clamped)
}

/// `op(a, b)` on scaled operands.
pub fn apply(op: OpTensorOp, a: f64, b: f64) -> f64 {
    match op {
        OpTensorOp::Add => a + b,
        OpTensorOp::Mul => a * b,
        OpTensorOp::Min => a.min(b),
        OpTensorOp::Max => a.max(b),
        OpTensorOp::Sqrt => a.sqrt(),
        OpTensorOp::Not => 1.0 - a,
    }
}

/// `c = op(alpha1 * a, alpha2 * b) + beta * c`; `b` broadcasts and is `None` for unary ops.
pub fn op_tensor(
    op: OpTensorOp,
    alpha1: f64,
    a: &HostTensor,
    alpha2: f64,
    b: Option<&HostTensor>,
    beta: f64,
    c: &mut HostTensor,
) {
    write_blended(c, 1.0, beta, |idx| {
        let bv = b.map_or(0.0, |b| alpha2 * broadcast_get(b, idx));
        apply(op, alpha1 * a.get(idx), bv)
    });
}

/// `c = alpha * a + beta * c`, `a` broadcast.
pub fn add_tensor(alpha: f64, a: &HostTensor, beta: f64, c: &mut HostTensor) {
    write_blended(c, alpha, beta, |idx| broadcast_get(a, idx));
}

/// `y = alpha * y`.
pub fn scale_tensor(y: &mut HostTensor, alpha: f64) {
    let old = y.clone();
    write_blended(y, alpha, 0.0, |idx| old.get(idx));
}

/// `y = value` for every logical element.
pub fn set_tensor(y: &mut HostTensor, value: f64) {
    write_blended(y, 1.0, 0.0, |_| value);
}

/// `y = alpha * x + beta * y` (any layouts and dtypes).
pub fn transform_tensor(alpha: f64, x: &HostTensor, beta: f64, y: &mut HostTensor) {
    write_blended(y, alpha, beta, |idx| x.get(idx));
}
