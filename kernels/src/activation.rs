//! Activation forward and backward (cudnnActivationForward/Backward semantics).
//!
//! `activation_fwd_{packed,strided}_<dtype>`: `y = alpha * f(x) + beta * y`.
//! `activation_bwd_{packed,strided}_<dtype>`: `dx = alpha * f'(x) * dy + beta * dx`.
//! The derivative is evaluated at `x` for every kind (exact also where `y` was blended);
//! `y` is part of the cuDNN signature but no kind needs to read it.

use crate::element::Element;
use crate::elementwise::{map_packed, map_strided};
use crate::math::{exp, ln_1p, one_plus_erf, sech2, sigmoid, sigmoid_derivative, tanh};
use oxidnn_params::{ActivationBwdParams, ActivationFwdParams, ActivationKind};

const SQRT_2_OVER_PI: f32 = 0.797_884_56;
const GELU_TANH_CUBIC: f32 = 0.044_715;
const FRAC_1_SQRT_2: f32 = core::f32::consts::FRAC_1_SQRT_2;
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// `f(x)` of one activation kind with its coefficient; `low` allows approximations good to
/// about 2^-11 relative (for 16-bit results).
#[inline(always)]
pub fn forward(kind: ActivationKind, coef: f32, x: f32, low: bool) -> f32 {
    match kind {
        ActivationKind::Identity => x,
        ActivationKind::Relu => relu(x),
        ActivationKind::ClippedRelu => {
            let r = relu(x);
            if r > coef {
                coef
            } else {
                r
            }
        }
        ActivationKind::LeakyRelu => {
            if x > 0.0 {
                x
            } else {
                coef * x
            }
        }
        ActivationKind::Elu => {
            if x > 0.0 {
                x
            } else {
                coef * (exp(x) - 1.0)
            }
        }
        ActivationKind::Sigmoid => sigmoid(x),
        ActivationKind::Tanh => tanh(x, low),
        ActivationKind::Swish => x * sigmoid(coef * x),
        ActivationKind::GeluErf => 0.5 * x * one_plus_erf(x * FRAC_1_SQRT_2),
        ActivationKind::GeluTanh => {
            let u = SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x * x * x);
            0.5 * x * (1.0 + tanh(u, low))
        }
        ActivationKind::Softplus => relu(x) + ln_1p(exp(-x.abs()), low),
    }
}

/// `f'(x)`; `low` as for [`forward`].
#[inline(always)]
pub fn derivative(kind: ActivationKind, coef: f32, x: f32, low: bool) -> f32 {
    match kind {
        ActivationKind::Identity => 1.0,
        ActivationKind::Relu => step(x > 0.0),
        ActivationKind::ClippedRelu => step(x > 0.0 && x < coef),
        ActivationKind::LeakyRelu => {
            if x > 0.0 {
                1.0
            } else {
                coef
            }
        }
        ActivationKind::Elu => {
            if x > 0.0 {
                1.0
            } else {
                coef * exp(x)
            }
        }
        ActivationKind::Sigmoid => sigmoid_derivative(x),
        ActivationKind::Tanh => sech2(x),
        ActivationKind::Swish => sigmoid(coef * x) + coef * x * sigmoid_derivative(coef * x),
        ActivationKind::GeluErf => {
            let cdf = 0.5 * one_plus_erf(x * FRAC_1_SQRT_2);
            cdf + x * FRAC_1_SQRT_2PI * exp(-0.5 * x * x)
        }
        ActivationKind::GeluTanh => {
            let x2 = x * x;
            let u = SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x2 * x);
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_CUBIC * x2);
            0.5 * (1.0 + tanh(u, low)) + 0.5 * x * sech2(u) * du
        }
        ActivationKind::Softplus => sigmoid(x),
    }
}

#[inline(always)]
fn relu(x: f32) -> f32 {
    // `max` would turn NaN into 0; NaN must propagate.
    if x > 0.0 || x != x {
        x
    } else {
        0.0
    }
}

#[inline(always)]
fn step(on: bool) -> f32 {
    if on {
        1.0
    } else {
        0.0
    }
}

/// `alpha * v + beta * old`, reading `old` only when `beta != 0` (cuDNN: with beta = 0 the
/// output is write-only, so NaN already there never leaks).
#[inline(always)]
pub fn blend(alpha: f32, v: f32, beta: f32, old: impl FnOnce() -> f32) -> f32 {
    if beta == 0.0 {
        alpha * v
    } else {
        alpha * v + beta * old()
    }
}

/// Evaluates `$body` with `$k` bound to `$kind` as a constant, so each kind gets its own
/// specialised loop instead of a per-element `match`.
macro_rules! with_kind {
    ($kind:expr, |$k:ident| $body:expr) => {
        match $kind {
            ActivationKind::Identity => {
                const $k: ActivationKind = ActivationKind::Identity;
                $body
            }
            ActivationKind::Relu => {
                const $k: ActivationKind = ActivationKind::Relu;
                $body
            }
            ActivationKind::ClippedRelu => {
                const $k: ActivationKind = ActivationKind::ClippedRelu;
                $body
            }
            ActivationKind::LeakyRelu => {
                const $k: ActivationKind = ActivationKind::LeakyRelu;
                $body
            }
            ActivationKind::Elu => {
                const $k: ActivationKind = ActivationKind::Elu;
                $body
            }
            ActivationKind::Sigmoid => {
                const $k: ActivationKind = ActivationKind::Sigmoid;
                $body
            }
            ActivationKind::Tanh => {
                const $k: ActivationKind = ActivationKind::Tanh;
                $body
            }
            ActivationKind::Swish => {
                const $k: ActivationKind = ActivationKind::Swish;
                $body
            }
            ActivationKind::GeluErf => {
                const $k: ActivationKind = ActivationKind::GeluErf;
                $body
            }
            ActivationKind::GeluTanh => {
                const $k: ActivationKind = ActivationKind::GeluTanh;
                $body
            }
            ActivationKind::Softplus => {
                const $k: ActivationKind = ActivationKind::Softplus;
                $body
            }
        }
    };
}

#[inline(always)]
unsafe fn fwd_packed<T: Element>(p: &ActivationFwdParams, x: *const T, y: *mut T) {
    with_kind!(ActivationKind::from_u32(p.kind), |K| {
        map_packed::<T, T, 1>(p.len, [x], y, p.beta != 0.0, |[xv], old| {
            blend(
                p.alpha,
                forward(K, p.coef, xv, T::LOW_PRECISION),
                p.beta,
                || old,
            )
        })
    })
}

#[inline(always)]
unsafe fn fwd_strided<T: Element>(p: &ActivationFwdParams, x: *const T, y: *mut T) {
    with_kind!(ActivationKind::from_u32(p.kind), |K| {
        map_strided::<T, T, 1, 2>(p.len, &p.map, [x], y, p.beta != 0.0, |[xv], old| {
            blend(
                p.alpha,
                forward(K, p.coef, xv, T::LOW_PRECISION),
                p.beta,
                || old,
            )
        })
    })
}

#[inline(always)]
unsafe fn bwd_packed<T: Element>(p: &ActivationBwdParams, dy: *const T, x: *const T, dx: *mut T) {
    with_kind!(ActivationKind::from_u32(p.kind), |K| {
        map_packed::<T, T, 2>(p.len, [dy, x], dx, p.beta != 0.0, |[dyv, xv], old| {
            blend(
                p.alpha,
                derivative(K, p.coef, xv, T::LOW_PRECISION) * dyv,
                p.beta,
                || old,
            )
        })
    })
}

#[inline(always)]
unsafe fn bwd_strided<T: Element>(p: &ActivationBwdParams, dy: *const T, x: *const T, dx: *mut T) {
    with_kind!(ActivationKind::from_u32(p.kind), |K| {
        map_strided::<T, T, 2, 3>(
            p.len,
            &p.map,
            [dy, x],
            dx,
            p.beta != 0.0,
            |[dyv, xv], old| {
                blend(
                    p.alpha,
                    derivative(K, p.coef, xv, T::LOW_PRECISION) * dyv,
                    p.beta,
                    || old,
                )
            },
        )
    })
}

macro_rules! activation_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<activation_fwd_packed_ $dt>](
                p: ActivationFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_packed::<$T>(&p, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<activation_fwd_strided_ $dt>](
                p: ActivationFwdParams, x: *const $T, y: *mut $T,
            ) {
                fwd_strided::<$T>(&p, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes (`y` is not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<activation_bwd_packed_ $dt>](
                p: ActivationBwdParams, _y: *const $T, dy: *const $T, x: *const $T, dx: *mut $T,
            ) {
                bwd_packed::<$T>(&p, dy, x, dx)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes (`y` is not read).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<activation_bwd_strided_ $dt>](
                p: ActivationBwdParams, _y: *const $T, dy: *const $T, x: *const $T, dx: *mut $T,
            ) {
                bwd_strided::<$T>(&p, dy, x, dx)
            }
        }
    };
}

// The sm90a build takes only `forward` (for the matmul epilogue), not the entry points.
#[cfg(not(feature = "sm90a"))]
crate::for_each_dtype!(activation_entry_points);
