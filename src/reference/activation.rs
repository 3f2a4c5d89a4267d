//! Reference activation functions and their derivatives, in f64.

use super::write_blended;
use crate::host_tensor::HostTensor;
use crate::ops::activation::{ActivationDescriptor, ActivationMode};

/// `f(x)`.
pub fn apply(mode: ActivationMode, coef: f64, x: f64) -> f64 {
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    match mode {
        ActivationMode::Identity => x,
        ActivationMode::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        ActivationMode::ClippedRelu => {
            if x.is_nan() {
                x
            } else {
                x.max(0.0).min(coef)
            }
        }
        ActivationMode::LeakyRelu => {
            if x > 0.0 {
                x
            } else {
                coef * x
            }
        }
        ActivationMode::Elu => {
            if x > 0.0 {
                x
            } else {
                coef * x.exp_m1()
            }
        }
        ActivationMode::Sigmoid => sigmoid(x),
        ActivationMode::Tanh => x.tanh(),
        ActivationMode::Swish => x * sigmoid(coef * x),
        ActivationMode::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        ActivationMode::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + u.tanh())
        }
        ActivationMode::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
    }
}

/// `f'(x)`; at the kinks of relu-like modes, the one-sided value cuDNN uses (0 at x = 0).
pub fn derivative(mode: ActivationMode, coef: f64, x: f64) -> f64 {
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    match mode {
        ActivationMode::Identity => 1.0,
        ActivationMode::Relu => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        ActivationMode::ClippedRelu => {
            if x > 0.0 && x < coef {
                1.0
            } else {
                0.0
            }
        }
        ActivationMode::LeakyRelu => {
            if x > 0.0 {
                1.0
            } else {
                coef
            }
        }
        ActivationMode::Elu => {
            if x > 0.0 {
                1.0
            } else {
                coef * x.exp()
            }
        }
        ActivationMode::Sigmoid => sigmoid(x) * (1.0 - sigmoid(x)),
        ActivationMode::Tanh => 1.0 - x.tanh().powi(2),
        ActivationMode::Swish => {
            let s = sigmoid(coef * x);
            s + coef * x * s * (1.0 - s)
        }
        ActivationMode::GeluErf => {
            let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            cdf + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        ActivationMode::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let t = (k * (x + 0.044715 * x.powi(3))).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
        }
        ActivationMode::Softplus => sigmoid(x),
    }
}

/// `y = alpha * f(x) + beta * y`.
pub fn forward(
    act: &ActivationDescriptor,
    alpha: f64,
    x: &HostTensor,
    beta: f64,
    y: &mut HostTensor,
) {
    write_blended(y, alpha, beta, |idx| {
        apply(act.mode(), act.coef(), x.get(idx))
    });
}

/// `dx = alpha * f'(x) * dy + beta * dx`.
pub fn backward(
    act: &ActivationDescriptor,
    alpha: f64,
    dy: &HostTensor,
    x: &HostTensor,
    beta: f64,
    dx: &mut HostTensor,
) {
    write_blended(dx, alpha, beta, |idx| {
        derivative(act.mode(), act.coef(), x.get(idx)) * dy.get(idx)
    });
}
