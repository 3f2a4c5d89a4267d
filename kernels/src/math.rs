//! f32 transcendental functions for kernels (no libm on the device), built on the
//! hardware `ex2`/`lg2` approximations with care where they lose accuracy.

use crate::device::{exp2_approx, fma, log2_approx};

const LOG2_E: f32 = core::f32::consts::LOG2_E;
const LN_2: f32 = core::f32::consts::LN_2;

/// `e^x`. The argument is split as `x·log2(e) = n + f` so that the rounding error of the
/// product does not grow with |x|.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let t = x * LOG2_E;
    let n = floor(t);
    // f = x·log2(e) - n, with the product's low part recovered by an fma.
    let lo = fma(x, LOG2_E, -t);
    let f = (t - n) + lo;
    let scale = exp2_approx(n);
    exp2_approx(f) * scale
}

#[inline(always)]
fn floor(x: f32) -> f32 {
    let out: f32;
    // SAFETY: register-only rounding, `cvt.rmi` = round toward minus infinity.
    unsafe {
        core::arch::asm!("cvt.rmi.f32.f32 {o}, {x};", o = out(reg32) out, x = in(reg32) x,
                         options(pure, nomem, nostack));
    }
    out
}

/// `ln x`.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2_approx(x) * LN_2
}

/// `ln(1 + t)` for `t >= 0`, accurate also for tiny `t`.
#[inline(always)]
pub fn ln_1p(t: f32) -> f32 {
    let u = 1.0 + t;
    if u == 1.0 {
        t
    } else {
        // ln(u) * t / (u - 1) cancels the rounding error of forming u.
        ln(u) * (t / (u - 1.0))
    }
}

/// The logistic function `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `tanh x`: a Taylor polynomial near 0 (where `1 - 2/(e^2x + 1)` cancels), else the
/// exponential form.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
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
        let r = 1.0 - 2.0 / (exp(2.0 * a) + 1.0);
        if x < 0.0 {
            -r
        } else {
            r
        }
    }
}

/// The error function: a Taylor polynomial near 0, Abramowitz & Stegun 7.1.26 elsewhere
/// (absolute error below 1.5e-7).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.5 {
        let x2 = x * x;
        // 2/sqrt(pi) (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320)
        let p = fma(x2, -1.0 / 1320.0, 1.0 / 216.0);
        let p = fma(x2, p, -1.0 / 42.0);
        let p = fma(x2, p, 1.0 / 10.0);
        let p = fma(x2, p, -1.0 / 3.0);
        fma(x * x2, p, x) * core::f32::consts::FRAC_2_SQRT_PI
    } else {
        let t = 1.0 / fma(0.327_591_1, a, 1.0);
        let p = fma(t, 1.061_405_4, -1.453_152_1);
        let p = fma(t, p, 1.421_413_7);
        let p = fma(t, p, -0.284_496_74);
        let p = fma(t, p, 0.254_829_6);
        let r = 1.0 - p * t * exp(-a * a);
        if x < 0.0 {
            -r
        } else {
            r
        }
    }
}
