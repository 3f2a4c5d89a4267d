//! Reference layer norm and RMS norm, in f64: the mean, then the variance as the mean of
//! squared deviations (two passes), per row.

use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::layer_norm::{LayerNormDescriptor, NormMode};

/// The per-row statistics of a forward pass, row-major over the leading dims (`mean` is
/// all 0 for RMS norm).
#[derive(Clone, Debug, PartialEq)]
pub struct NormStats {
    pub mean: Vec<f64>,
    pub rstd: Vec<f64>,
}

/// The weight gradients of a backward pass, row-major over the normalized dims.
#[derive(Clone, Debug, PartialEq)]
pub struct NormWeightGrads {
    pub dscale: Vec<f64>,
    pub dbias: Vec<f64>,
}

/// The leading (row) dims and normalized dims of `x`.
fn split(norm: &LayerNormDescriptor, x: &HostTensor) -> (Vec<usize>, Vec<usize>) {
    let dims = x.desc.dims();
    let at = dims.len() - norm.normalized_rank().min(dims.len());
    (dims[..at].to_vec(), dims[at..].to_vec())
}

/// The value of a weight tensor (the normalized dims, maybe after leading 1s) at the
/// normalized index `e`.
fn weight(w: Option<&HostTensor>, e: &[usize], default: f64) -> f64 {
    match w {
        None => default,
        Some(w) => {
            let mut idx = vec![0; w.desc.rank() - e.len()];
            idx.extend_from_slice(e);
            w.get(&idx)
        }
    }
}

/// Calls `f(row_index, row)` for each row, `row` listing the full indices of its elements.
fn for_each_row(
    norm: &LayerNormDescriptor,
    x: &HostTensor,
    mut f: impl FnMut(usize, &[Vec<usize>]),
) {
    let (outer, inner) = split(norm, x);
    let mut r = 0;
    for_each_index(&outer, |o| {
        let mut row = Vec::new();
        for_each_index(&inner, |e| {
            let mut idx = o.to_vec();
            idx.extend_from_slice(e);
            row.push(idx);
        });
        f(r, &row);
        r += 1;
    });
}

/// The mean (0 for RMS norm) and `rstd` of the values of one row.
pub fn row_stats(mode: NormMode, epsilon: f64, values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = match mode {
        NormMode::LayerNorm => values.iter().sum::<f64>() / n,
        NormMode::RmsNorm => 0.0,
    };
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, 1.0 / (var + epsilon).sqrt())
}

/// `y = (x - mean) * rstd * scale + bias` per row (RMS norm: no mean, no bias); returns the
/// statistics.
pub fn forward(
    norm: &LayerNormDescriptor,
    x: &HostTensor,
    scale: Option<&HostTensor>,
    bias: Option<&HostTensor>,
    y: &mut HostTensor,
) -> NormStats {
    let (_, inner) = split(norm, x);
    let k = inner.len();
    let mut stats = NormStats {
        mean: vec![],
        rstd: vec![],
    };
    for_each_row(norm, x, |_, row| {
        let values: Vec<f64> = row.iter().map(|i| x.get(i)).collect();
        let (mean, rstd) = row_stats(norm.mode(), norm.epsilon(), &values);
        for (idx, v) in row.iter().zip(&values) {
            let e = &idx[idx.len() - k..];
            let out = (v - mean) * rstd * weight(scale, e, 1.0) + weight(bias, e, 0.0);
            y.set(idx, out);
        }
        stats.mean.push(mean);
        stats.rstd.push(rstd);
    });
    stats
}

/// `dx` per row from the saved `mean` (ignored for RMS norm) and `rstd` (one per row,
/// row-major); returns `dscale = sum dy * xhat` and `dbias = sum dy` over all rows.
pub fn backward(
    norm: &LayerNormDescriptor,
    x: &HostTensor,
    dy: &HostTensor,
    scale: Option<&HostTensor>,
    mean: &[f64],
    rstd: &[f64],
    dx: &mut HostTensor,
) -> NormWeightGrads {
    let (_, inner) = split(norm, x);
    let k = inner.len();
    let d: usize = inner.iter().product();
    let mut grads = NormWeightGrads {
        dscale: vec![0.0; d],
        dbias: vec![0.0; d],
    };
    let rms = norm.mode() == NormMode::RmsNorm;
    for_each_row(norm, x, |r, row| {
        let (m, s) = (if rms { 0.0 } else { mean[r] }, rstd[r]);
        let xhat: Vec<f64> = row.iter().map(|i| (x.get(i) - m) * s).collect();
        let g: Vec<f64> = row
            .iter()
            .map(|i| dy.get(i) * weight(scale, &i[i.len() - k..], 1.0))
            .collect();
        let n = d as f64;
        let mean_g = if rms { 0.0 } else { g.iter().sum::<f64>() / n };
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for (e, idx) in row.iter().enumerate() {
            dx.set(idx, s * (g[e] - mean_g - xhat[e] * mean_gx));
            grads.dscale[e] += dy.get(idx) * xhat[e];
            grads.dbias[e] += dy.get(idx);
        }
    });
    grads
}
