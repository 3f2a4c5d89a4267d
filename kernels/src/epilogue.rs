//! The fused epilogue's arithmetic, shared by matmul and convolution:
//! `act(alpha * acc + beta * old + bias + residual_scale * z)` ([`EpilogueOps`]). Each op
//! supplies where its elements lie; the operands are loaded only when the ops need them.

use oxidnn_params::{ActivationKind, BiasMode, EpilogueOps};

/// `L` results through the epilogue. `old` (the output's previous values) is called only
/// when `beta != 0`, `bias` only when there is a bias (with its mode), `z` only when
/// `residual_scale != 0`. `low`: the result is stored with 16-bit precision.
#[inline(always)]
pub fn apply<const L: usize>(
    ops: &EpilogueOps,
    acc: [f32; L],
    low: bool,
    old: impl FnOnce() -> [f32; L],
    bias: impl FnOnce(BiasMode) -> [f32; L],
    z: impl FnOnce() -> [f32; L],
) -> [f32; L] {
    let mut x = acc.map(|v| ops.alpha * v);
    if ops.beta != 0.0 {
        let o = old();
        crate::unrolled!(i in L => x[i] += ops.beta * o[i]);
    }
    let mode = BiasMode::from_u32(ops.bias);
    if mode != BiasMode::None {
        let b = bias(mode);
        crate::unrolled!(i in L => x[i] += b[i]);
    }
    if ops.residual_scale != 0.0 {
        let zv = z();
        crate::unrolled!(i in L => x[i] += ops.residual_scale * zv[i]);
    }
    let kind = ActivationKind::from_u32(ops.activation);
    if kind != ActivationKind::Identity {
        x = x.map(|v| activate(kind, ops.act_coef, v, low));
    }
    x
}

/// The epilogue's activation, out of line: one copy shared by every kernel of a module
/// instead of one per kernel and output type (it runs once per output element, after the
/// main loop).
#[inline(never)]
fn activate(kind: ActivationKind, coef: f32, x: f32, low: bool) -> f32 {
    crate::activation::forward(kind, coef, x, low)
}
