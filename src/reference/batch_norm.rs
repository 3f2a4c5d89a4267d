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

/// Numbers the features of `x`'s elements: the row-major position of their element in
/// the per-feature tensor.
struct Features {
    mode: BatchNormMode,
    dims: Vec<usize>,
    count: usize,
}

impl Features {
    fn new(mode: BatchNormMode, x: &HostTensor) -> Self {
        let dims = x.desc.dims().to_vec();
        let count = match mode {
            BatchNormMode::Spatial => dims[1],
            BatchNormMode::PerActivation => dims[1..].iter().product(),
        };
        Self { mode, dims, count }
    }

    /// The feature of `x`'s element `idx`.
    fn of(&self, idx: &[usize]) -> usize {
        match self.mode {
            BatchNormMode::Spatial => idx[1],
            BatchNormMode::PerActivation => idx[1..]
                .iter()
                .zip(&self.dims[1..])
                .fold(0, |acc, (&i, &n)| acc * n + i),
        }
    }

    /// Elements per feature.
    fn reduction_len(&self) -> usize {
        self.dims.iter().product::<usize>() / self.count
    }

    /// A per-feature tensor's values in feature order.
    fn values(&self, t: &HostTensor) -> Vec<f64> {
        let mut v = Vec::with_capacity(self.count);
        for_each_index(t.desc.dims(), |f| v.push(t.get(f)));
        v
    }

    /// Sets each element of a per-feature tensor to `value(feature, old value)`.
    fn write(&self, t: &mut HostTensor, value: impl Fn(usize, f64) -> f64) {
        let dims = t.desc.dims().to_vec();
        let mut k = 0;
        for_each_index(&dims, |f| {
            let old = t.get(f);
            t.set(f, value(k, old));
            k += 1;
        });
    }
}

/// Batch statistics of each feature: mean, biased variance, and the element count.
pub struct BatchStats {
    features: Features,
    mean: Vec<f64>,
    var: Vec<f64>,
    pub count: usize,
}

impl BatchStats {
    /// Two passes over `x`: the means, then the mean squared deviations.
    pub fn of(mode: BatchNormMode, x: &HostTensor) -> Self {
        let features = Features::new(mode, x);
        let count = features.reduction_len();
        let mut mean = vec![0.0; features.count];
        let mut var = vec![0.0; features.count];
        for_each_index(x.desc.dims(), |i| mean[features.of(i)] += x.get(i));
        mean.iter_mut().for_each(|m| *m /= count as f64);
        for_each_index(x.desc.dims(), |i| {
            let f = features.of(i);
            let d = x.get(i) - mean[f];
            var[f] += d * d;
        });
        var.iter_mut().for_each(|v| *v /= count as f64);
        Self {
            features,
            mean,
            var,
            count,
        }
    }

    /// Mean of the feature of `x`'s element `idx`.
    pub fn mean(&self, idx: &[usize]) -> f64 {
        self.mean[self.features.of(idx)]
    }

    /// Biased variance of the feature of `x`'s element `idx`.
    pub fn variance(&self, idx: &[usize]) -> f64 {
        self.var[self.features.of(idx)]
    }
}

/// `act(v + z)` as the fused ops define it.
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
/// with per-feature `mean` and `var`.
#[allow(clippy::too_many_arguments)]
fn normalize(
    features: &Features,
    ops: BatchNormOps,
    (alpha, beta): (f64, f64),
    x: &HostTensor,
    z: Option<&HostTensor>,
    y: &mut HostTensor,
    (scale, bias): (&HostTensor, &HostTensor),
    (mean, var): (&[f64], &[f64]),
    epsilon: f64,
) {
    let (scale, bias) = (features.values(scale), features.values(bias));
    super::write_blended(y, alpha, beta, |i| {
        let f = features.of(i);
        let xhat = (x.get(i) - mean[f]) / (var[f] + epsilon).sqrt();
        let zv = z.map_or(0.0, |z| z.get(i));
        epilogue(ops, scale[f] * xhat + bias[f], zv)
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
    let features = &stats.features;
    let (mean, var) = (&stats.mean, &stats.var);
    normalize(
        features,
        ops,
        (alpha, beta),
        x,
        z,
        y,
        (scale, bias),
        (mean, var),
        epsilon,
    );
    let m = stats.count as f64;
    if let Some((factor, rm, rv)) = running {
        let unbiased = |f: usize| var[f] * m / (m - 1.0);
        if factor == 1.0 {
            features.write(rm, |f, _| mean[f]);
            features.write(rv, |f, _| unbiased(f));
        } else {
            features.write(rm, |f, old| (1.0 - factor) * old + factor * mean[f]);
            features.write(rv, |f, old| (1.0 - factor) * old + factor * unbiased(f));
        }
    }
    if let Some((sm, sv)) = saved {
        features.write(sm, |f, _| mean[f]);
        features.write(sv, |f, _| 1.0 / (var[f] + epsilon).sqrt());
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
    let features = Features::new(mode, x);
    let (mean, var) = (features.values(mean), features.values(variance));
    normalize(
        &features,
        ops,
        (alpha, beta),
        x,
        z,
        y,
        (scale, bias),
        (&mean, &var),
        epsilon,
    );
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
    let features = Features::new(mode, x);
    // Per feature: mean and 1 / sqrt(var + epsilon), saved or recomputed.
    let (mean, inv_std) = match saved {
        Some((m, s)) => (features.values(m), features.values(s)),
        None => {
            let stats = BatchStats::of(mode, x);
            let inv = stats
                .var
                .iter()
                .map(|v| 1.0 / (v + epsilon).sqrt())
                .collect();
            (stats.mean, inv)
        }
    };
    let scale = features.values(scale);
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
    let xhat = |i: &[usize], f: usize| (x.get(i) - mean[f]) * inv_std[f];
    let mut dbias = vec![0.0; features.count];
    let mut dscale = vec![0.0; features.count];
    for_each_index(x.desc.dims(), |i| {
        let f = features.of(i);
        let g = grad(i);
        dbias[f] += g;
        dscale[f] += g * xhat(i, f);
    });
    let m = features.reduction_len() as f64;
    super::write_blended(data.dx, alpha_data, beta_data, |i| {
        let f = features.of(i);
        scale[f] * inv_std[f] * (grad(i) - dbias[f] / m - xhat(i, f) * dscale[f] / m)
    });
    if let Some(dz) = data.dz {
        super::write_blended(dz, alpha_data, beta_data, grad);
    }
    features.write(params.dscale, |f, old| {
        blend(alpha_param, dscale[f], beta_param, old)
    });
    features.write(params.dbias, |f, old| {
        blend(alpha_param, dbias[f], beta_param, old)
    });
}
