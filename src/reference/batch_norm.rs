//! Reference batch normalization, in f64: straightforward loops over logical indices,
//! two-pass statistics.
//!
//! Per-feature tensors (scale, bias, means, variances and their gradients) have the dims of
//! [`crate::derive_batch_norm_descriptor`]: `1 x C x 1 x 1` (spatial) or `1 x C x H x W`
//! (per-activation); the element of `x` at `[n, c, h, w]` belongs to the feature at
//! `[0, c, 0, 0]` or `[0, c, h, w]`.

use super::blend;
use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::batch_norm::{BatchNormMode, BatchNormOps};

/// The index of the per-feature tensor that the element of `x` at `idx` belongs to.
pub fn feature_of(mode: BatchNormMode, idx: &[usize]) -> Vec<usize> {
    let mut f = idx.to_vec();
    f[0] = 0;
    if mode == BatchNormMode::Spatial {
        for d in f.iter_mut().skip(2) {
            *d = 0;
        }
    }
    f
}

/// Row-major position of `idx` in `dims`.
fn linear(dims: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &n)| acc * n + i)
}

/// Per-feature values, in row-major order of the per-feature tensor's dims.
struct PerFeature {
    dims: Vec<usize>,
    values: Vec<f64>,
}

impl PerFeature {
    fn zeros(mode: BatchNormMode, x_dims: &[usize]) -> Self {
        let dims: Vec<usize> = x_dims
            .iter()
            .enumerate()
            .map(|(d, &n)| match d {
                0 => 1,
                1 => n,
                _ if mode == BatchNormMode::Spatial => 1,
                _ => n,
            })
            .collect();
        let count = dims.iter().product();
        Self {
            dims,
            values: vec![0.0; count],
        }
    }

    fn at(&mut self, f: &[usize]) -> &mut f64 {
        let i = linear(&self.dims, f);
        &mut self.values[i]
    }

    fn get(&self, f: &[usize]) -> f64 {
        self.values[linear(&self.dims, f)]
    }
}

/// Batch statistics of each feature: mean, biased variance, and the element count.
pub struct BatchStats {
    mode: BatchNormMode,
    mean: PerFeature,
    var: PerFeature,
    pub count: usize,
}

impl BatchStats {
    /// Two passes over `x`: the means, then the mean squared deviations.
    pub fn of(mode: BatchNormMode, x: &HostTensor) -> Self {
        let dims = x.desc.dims().to_vec();
        let mut mean = PerFeature::zeros(mode, &dims);
        let mut var = PerFeature::zeros(mode, &dims);
        let count = x.desc.element_count() / mean.values.len();
        for_each_index(&dims, |i| *mean.at(&feature_of(mode, i)) += x.get(i));
        mean.values.iter_mut().for_each(|m| *m /= count as f64);
        for_each_index(&dims, |i| {
            let f = feature_of(mode, i);
            let d = x.get(i) - mean.get(&f);
            *var.at(&f) += d * d;
        });
        var.values.iter_mut().for_each(|v| *v /= count as f64);
        Self {
            mode,
            mean,
            var,
            count,
        }
    }

    /// Mean of the feature of `x`'s element `idx`.
    pub fn mean(&self, idx: &[usize]) -> f64 {
        self.mean.get(&feature_of(self.mode, idx))
    }

    /// Biased variance of the feature of `x`'s element `idx`.
    pub fn variance(&self, idx: &[usize]) -> f64 {
        self.var.get(&feature_of(self.mode, idx))
    }
}

/// `act(bn + z)` as the fused ops define it.
fn epilogue(ops: BatchNormOps, v: f64, z: f64) -> f64 {
    match ops {
        BatchNormOps::Bn => v,
        BatchNormOps::BnActivation => relu(v),
        BatchNormOps::BnAddActivation => relu(v + z),
    }
}

fn relu(v: f64) -> f64 {
    if v > 0.0 || v.is_nan() {
        v
    } else {
        0.0
    }
}

/// `y = alpha * act(scale (x - mean) / sqrt(var + epsilon) + bias [+ z]) + beta * y`
/// with the given per-element statistics.
#[allow(clippy::too_many_arguments)]
fn normalize(
    mode: BatchNormMode,
    ops: BatchNormOps,
    alpha: f64,
    beta: f64,
    x: &HostTensor,
    z: Option<&HostTensor>,
    y: &mut HostTensor,
    scale: &HostTensor,
    bias: &HostTensor,
    stats: &BatchStats,
    epsilon: f64,
) {
    super::write_blended(y, alpha, beta, |i| {
        let f = feature_of(mode, i);
        let xhat = (x.get(i) - stats.mean(i)) / (stats.variance(i) + epsilon).sqrt();
        let zv = z.map_or(0.0, |z| z.get(i));
        epilogue(ops, scale.get(&f) * xhat + bias.get(&f), zv)
    });
}

/// Running statistics to update: `(factor, mean, variance)`.
pub type Running<'a> = (f64, &'a mut HostTensor, &'a mut HostTensor);
/// Saved statistics: `(mean, inv_std)`.
pub type Saved<'a> = (&'a mut HostTensor, &'a mut HostTensor);

/// Forward training (cudnnBatchNormalizationForwardTraining[Ex]): normalizes with the
/// batch statistics; `running` becomes `(1 - factor) * running + factor * batch` (the
/// variance unbiased, `var * m / (m - 1)`; with factor 1 the old values are not read);
/// `saved` receives the batch mean and `1 / sqrt(var + epsilon)`.
#[allow(clippy::too_many_arguments)]
pub fn forward_training(
    mode: BatchNormMode,
    ops: BatchNormOps,
    alpha: f64,
    beta: f64,
    x: &HostTensor,
    z: Option<&HostTensor>,
    y: &mut HostTensor,
    scale: &HostTensor,
    bias: &HostTensor,
    epsilon: f64,
    running: Option<Running<'_>>,
    saved: Option<Saved<'_>>,
) {
    let stats = BatchStats::of(mode, x);
    normalize(mode, ops, alpha, beta, x, z, y, scale, bias, &stats, epsilon);
    let m = stats.count as f64;
    let features = scale.desc.dims().to_vec();
    if let Some((factor, rm, rv)) = running {
        for_each_index(&features, |f| {
            let (mean, var) = (stats.mean.get(f), stats.var.get(f) * m / (m - 1.0));
            if factor == 1.0 {
                rm.set(f, mean);
                rv.set(f, var);
            } else {
                rm.set(f, (1.0 - factor) * rm.get(f) + factor * mean);
                rv.set(f, (1.0 - factor) * rv.get(f) + factor * var);
            }
        });
    }
    if let Some((sm, sv)) = saved {
        for_each_index(&features, |f| {
            sm.set(f, stats.mean.get(f));
            sv.set(f, 1.0 / (stats.var.get(f) + epsilon).sqrt());
        });
    }
}

/// Forward inference (cudnnBatchNormalizationForwardInference): normalizes with the
/// estimated mean and variance.
#[allow(clippy::too_many_arguments)]
pub fn forward_inference(
    mode: BatchNormMode,
    ops: BatchNormOps,
    alpha: f64,
    beta: f64,
    x: &HostTensor,
    z: Option<&HostTensor>,
    y: &mut HostTensor,
    scale: &HostTensor,
    bias: &HostTensor,
    mean: &HostTensor,
    variance: &HostTensor,
    epsilon: f64,
) {
    let dims = x.desc.dims().to_vec();
    let mut stats = BatchStats {
        mode,
        mean: PerFeature::zeros(mode, &dims),
        var: PerFeature::zeros(mode, &dims),
        count: 0,
    };
    for_each_index(mean.desc.dims(), |f| {
        *stats.mean.at(f) = mean.get(f);
        *stats.var.at(f) = variance.get(f);
    });
    normalize(mode, ops, alpha, beta, x, z, y, scale, bias, &stats, epsilon);
}

/// The outputs of [`backward`]: `dx`, and `dz` for the fused add.
pub struct DataGrads<'a> {
    pub dx: &'a mut HostTensor,
    pub dz: Option<&'a mut HostTensor>,
}

/// The parameter gradients of [`backward`].
pub struct ParamGrads<'a> {
    pub dscale: &'a mut HostTensor,
    pub dbias: &'a mut HostTensor,
}

/// Backward (cudnnBatchNormalizationBackward[Ex]). With a relu, `g = dy * (y > 0)`, else
/// `g = dy`; `dbias = sum(g)`, `dscale = sum(g xhat)`,
/// `dx = scale / sqrt(var + eps) * (g - dbias / m - xhat dscale / m)`, `dz = g`.
/// `dx` and `dz` blend with `(alpha_data, beta_data)`, `dscale` and `dbias` with
/// `(alpha_param, beta_param)`. The statistics come from `saved` (mean, inv_std) when given,
/// else from `x`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    mode: BatchNormMode,
    ops: BatchNormOps,
    (alpha_data, beta_data): (f64, f64),
    (alpha_param, beta_param): (f64, f64),
    x: &HostTensor,
    y: Option<&HostTensor>,
    dy: &HostTensor,
    data: DataGrads<'_>,
    scale: &HostTensor,
    params: ParamGrads<'_>,
    epsilon: f64,
    saved: Option<(&HostTensor, &HostTensor)>,
) {
    let dims = x.desc.dims().to_vec();
    // Per feature: mean and 1 / sqrt(var + epsilon), saved or recomputed.
    let mut mean = PerFeature::zeros(mode, &dims);
    let mut inv = PerFeature::zeros(mode, &dims);
    let count = x.desc.element_count() / mean.values.len();
    match saved {
        Some((m, s)) => for_each_index(m.desc.dims(), |f| {
            *mean.at(f) = m.get(f);
            *inv.at(f) = s.get(f);
        }),
        None => {
            let stats = BatchStats::of(mode, x);
            mean = stats.mean;
            for_each_index(&inv.dims.clone(), |f| {
                *inv.at(f) = 1.0 / (stats.var.get(f) + epsilon).sqrt()
            });
        }
    }
    let grad = |i: &[usize]| match (ops, y) {
        (BatchNormOps::Bn, _) | (_, None) => dy.get(i),
        (_, Some(y)) => {
            if y.get(i) > 0.0 {
                dy.get(i)
            } else {
                0.0
            }
        }
    };
    let inv_std = |i: &[usize]| inv.get(&feature_of(mode, i));
    let xhat = |i: &[usize]| (x.get(i) - mean.get(&feature_of(mode, i))) * inv_std(i);
    let mut dbias = PerFeature::zeros(mode, &dims);
    let mut dscale = PerFeature::zeros(mode, &dims);
    for_each_index(&dims, |i| {
        let f = feature_of(mode, i);
        *dbias.at(&f) += grad(i);
        *dscale.at(&f) += grad(i) * xhat(i);
    });
    let m = count as f64;
    super::write_blended(data.dx, alpha_data, beta_data, |i| {
        let f = feature_of(mode, i);
        scale.get(&f) * inv_std(i) * (grad(i) - dbias.get(&f) / m - xhat(i) * dscale.get(&f) / m)
    });
    if let Some(dz) = data.dz {
        super::write_blended(dz, alpha_data, beta_data, grad);
    }
    let features = scale.desc.dims().to_vec();
    for_each_index(&features, |f| {
        let (old_s, old_b) = (params.dscale.get(f), params.dbias.get(f));
        params
            .dscale
            .set(f, blend(alpha_param, dscale.get(f), beta_param, old_s));
        params
            .dbias
            .set(f, blend(alpha_param, dbias.get(f), beta_param, old_b));
    });
}
