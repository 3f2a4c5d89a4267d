//! f32 transcendental functions for kernels (no libm on the device), built on the
//! hardware approximations (`ex2`, `lg2`, `rcp`, `tanh`): one special-function op where
//! possible, since the 16-bit data types leave only a few per element at full bandwidth.
//! Accurate to a few f32 ulps except where noted.

use crate::device::{exp2_approx, fma, log2_approx, rcp_approx, tanh_approx};

const LOG2_E: f32 = core::f32::consts::LOG2_E;
const LN_2: f32 = core::f32::consts::LN_2;

/// `e^x` (relative error about 2^-22 + |x| 2^-24).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2_approx(x * LOG2_E)
}

/// `e^(x - m)` given `m_log2e = m * log2(e)`: one fused multiply-add and `ex2`. Rounding
/// `m_log2e` costs an absolute exponent error of about `|m| 2^-24` (relative in the
/// result): far below a 16-bit result's precision; for f32 results with large `|m|`, take
/// [`exp`] of the exact difference instead.
#[inline(always)]
pub fn exp_shifted(x: f32, m_log2e: f32) -> f32 {
    exp2_approx(fma(x, LOG2_E, -m_log2e))
}

/// `m * log2(e)`, as [`exp_shifted`] takes it.
#[inline(always)]
pub fn times_log2_e(m: f32) -> f32 {
    m * LOG2_E
}

/// `ln x`.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2_approx(x) * LN_2
}

/// `a / b` to about 2 ulps.
#[inline(always)]
pub fn div(a: f32, b: f32) -> f32 {
    a * rcp_approx(b)
}

/// `ln(1 + t)` for `t >= 0`, accurate also for tiny `t` unless `low_precision` (for
/// 16-bit results, where `ln(1 + t)`'s absolute error of 2^-24 is far below an ulp of any
/// value it is added to).
#[inline(always)]
pub fn ln_1p(t: f32, low_precision: bool) -> f32 {
    let u = 1.0 + t;
    if low_precision {
        return ln(u);
    }
    if u == 1.0 {
        t
    } else {
        // ln(u) * t / (u - 1) cancels the rounding error of forming u.
        ln(u) * div(t, u - 1.0)
    }
}

/// The logistic function `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    rcp_approx(1.0 + exp(-x))
}

/// `tanh x`. `low_precision` (for 16-bit results) uses the hardware approximation;
/// otherwise a Taylor polynomial near 0 (where `1 - 2/(e^2x + 1)` cancels) and the
/// exponential form elsewhere.
#[inline(always)]
pub fn tanh(x: f32, low_precision: bool) -> f32 {
    if low_precision {
        return tanh_approx(x);
    }
    let a = x.abs();
    if a < 0.4 {
        let x2 = x * x;
        // x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 - 1382x^11/155925
        let p = fma(x2, -1382.0 / 155925.0, 62.0 / 2835.0);
        let p = fma(x2, p, -17.0 / 315.0);
        let p = fma(x2, p, 2.0 / 15.0);
        let p = fma(x2, p, -1.0 / 3.0);
        fma(x * x2, p, x)
    } else {
        let r = 1.0 - 2.0 * rcp_approx(exp(2.0 * a) + 1.0);
        r.copysign(x)
    }
}

/// `1 + erf(x)`, by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7; for x < 0
/// computed as `erfc(|x|)` without cancellation). Branch-free: this is what GELU needs.
#[inline(always)]
pub fn one_plus_erf(x: f32) -> f32 {
    let a = x.abs();
    let t = rcp_approx(fma(0.327_591_1, a, 1.0));
    let p = fma(t, 1.061_405_4, -1.453_152_1);
    let p = fma(t, p, 1.421_413_7);
    let p = fma(t, p, -0.284_496_74);
    let p = fma(t, p, 0.254_829_6);
    let erfc = p * t * exp(-a * a);
    if x < 0.0 {
        erfc
    } else {
        2.0 - erfc
    }
}

/// `sech^2 x = 1 - tanh^2 x`, without the cancellation of forming `1 - t*t` near |t| = 1.
#[inline(always)]
pub fn sech2(x: f32) -> f32 {
    let e = exp(-2.0 * x.abs());
    let r = rcp_approx(1.0 + e);
    4.0 * e * r * r
}

/// The logistic function's derivative `s (1 - s)`, without cancellation for large |x|.
#[inline(always)]
pub fn sigmoid_derivative(x: f32) -> f32 {
    let e = exp(-x.abs());
    let r = rcp_approx(1.0 + e);
    e * r * r
}
