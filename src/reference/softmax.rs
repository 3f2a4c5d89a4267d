//! Reference softmax, in f64.

use super::blend;
use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::softmax::{SoftmaxAlgorithm, SoftmaxMode};

/// Calls `f(row)` for each row `mode` picks in a tensor of `dims`, `row` listing the
/// indices of its elements in row-major order.
pub fn for_each_row(mode: SoftmaxMode, dims: &[usize], mut f: impl FnMut(&[Vec<usize>])) {
    let reduced = mode.reduced_dims(dims.len());
    let outer: Vec<usize> = (0..dims.len())
        .map(|d| if reduced.contains(&d) { 1 } else { dims[d] })
        .collect();
    let inner: Vec<usize> = (0..dims.len())
        .map(|d| if reduced.contains(&d) { dims[d] } else { 1 })
        .collect();
    for_each_index(&outer, |o| {
        let mut row = Vec::new();
        for_each_index(&inner, |e| {
            row.push(o.iter().zip(e).map(|(a, b)| a + b).collect())
        });
        f(&row);
    });
}

/// The softmax (or log softmax) of one row.
pub fn softmax(algo: SoftmaxAlgorithm, values: &[f64]) -> Vec<f64> {
    let m = match algo {
        SoftmaxAlgorithm::Fast => 0.0,
        _ => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    };
    let sum: f64 = values.iter().map(|v| (v - m).exp()).sum();
    values
        .iter()
        .map(|v| match algo {
            SoftmaxAlgorithm::Log => (v - m) - sum.ln(),
            _ => (v - m).exp() / sum,
        })
        .collect()
}

/// `y = alpha * softmax(x) + beta * y` over each row.
pub fn forward(
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: f64,
    x: &HostTensor,
    beta: f64,
    y: &mut HostTensor,
) {
    for_each_row(mode, x.desc.dims(), |row| {
        let values: Vec<f64> = row.iter().map(|i| x.get(i)).collect();
        for (idx, v) in row.iter().zip(softmax(algo, &values)) {
            let out = blend(alpha, v, beta, y.get(idx));
            y.set(idx, out);
        }
    });
}

/// `dx = alpha * y * (dy - sum(dy * y)) + beta * dx`; log: `dx = alpha * (dy - exp(y) *
/// sum(dy)) + beta * dx`.
pub fn backward(
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: f64,
    y: &HostTensor,
    dy: &HostTensor,
    beta: f64,
    dx: &mut HostTensor,
) {
    for_each_row(mode, y.desc.dims(), |row| {
        let log = algo == SoftmaxAlgorithm::Log;
        let sum: f64 = row
            .iter()
            .map(|i| if log { dy.get(i) } else { dy.get(i) * y.get(i) })
            .sum();
        for idx in row {
            let (yv, dyv) = (y.get(idx), dy.get(idx));
            let v = if log {
                dyv - yv.exp() * sum
            } else {
                yv * (dyv - sum)
            };
            let out = blend(alpha, v, beta, dx.get(idx));
            dx.set(idx, out);
        }
    });
}
