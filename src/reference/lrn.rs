//! Reference cross-channel LRN, forward and backward, in f64 (direct sums over each
//! window; no running sums).

use super::write_blended;
use crate::host_tensor::HostTensor;
use crate::ops::lrn::LrnDescriptor;

/// The channels of the window centred on channel `c` of `channels`.
pub fn window(lrn: &LrnDescriptor, c: usize, channels: usize) -> std::ops::RangeInclusive<usize> {
    let lo = c.saturating_sub(lrn.look_behind() as usize);
    let hi = (c + lrn.look_ahead() as usize).min(channels - 1);
    lo..=hi
}

/// `k + alpha / n * sum of x^2 over the window` at `idx`.
fn scale_at(lrn: &LrnDescriptor, x: &HostTensor, idx: &[usize]) -> f64 {
    let mut at = idx.to_vec();
    let mut sum = 0.0;
    for j in window(lrn, idx[1], x.desc.dims()[1]) {
        at[1] = j;
        let v = x.get(&at);
        sum += v * v;
    }
    lrn.k() + lrn.alpha() / lrn.n() as f64 * sum
}

/// `y = alpha * x * s^-beta + beta * y`.
pub fn forward(lrn: &LrnDescriptor, alpha: f64, x: &HostTensor, beta: f64, y: &mut HostTensor) {
    write_blended(y, alpha, beta, |idx| {
        x.get(idx) * scale_at(lrn, x, idx).powf(-lrn.beta())
    });
}

/// `dx = alpha * d(sum_c dy_c y_c)/dx + beta * dx`, with y the forward output of x:
/// `dy_j s_j^-beta - 2 alpha beta / n * x_j * sum over the channels c whose window holds j
/// of dy_c x_c s_c^(-beta - 1)`.
pub fn backward(
    lrn: &LrnDescriptor,
    alpha: f64,
    dy: &HostTensor,
    x: &HostTensor,
    beta: f64,
    dx: &mut HostTensor,
) {
    let channels = x.desc.dims()[1];
    let coef = 2.0 * lrn.alpha() * lrn.beta() / lrn.n() as f64;
    write_blended(dx, alpha, beta, |idx| {
        let j = idx[1];
        let mut at = idx.to_vec();
        let mut cross = 0.0;
        for c in 0..channels {
            if window(lrn, c, channels).contains(&j) {
                at[1] = c;
                let s = scale_at(lrn, x, &at);
                cross += dy.get(&at) * x.get(&at) * s.powf(-lrn.beta() - 1.0);
            }
        }
        dy.get(idx) * scale_at(lrn, x, idx).powf(-lrn.beta()) - coef * x.get(idx) * cross
    });
}
