//! Reference pooling, in f64: for each output position, the window's in-bounds inputs in
//! scan order, reduced as the descriptor says (see `crate::ops::pooling` for the rules).

use crate::descriptor::TensorDescriptor;
use crate::dtype::DataType;
use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::pooling::{PoolingDescriptor, PoolingMode, PoolingNanOpt};

/// The spatial positions of the in-bounds inputs of the window at output position `out`,
/// in scan order (outermost spatial dim slowest).
pub fn window_positions(
    pool: &PoolingDescriptor,
    input: &[usize],
    out: &[usize],
) -> Vec<Vec<usize>> {
    let (window, pad, stride) = (pool.window(), pool.padding(), pool.stride());
    let mut ranges = Vec::new();
    for i in 0..input.len() {
        let start = (out[i] * stride[i]) as i64 - pad[i] as i64;
        let lo = start.max(0) as usize;
        let hi = ((start + window[i] as i64).min(input[i] as i64)).max(0) as usize;
        ranges.push((lo, hi.max(lo)));
    }
    let extents: Vec<usize> = ranges.iter().map(|&(lo, hi)| hi - lo).collect();
    let mut positions = Vec::new();
    for_each_index(&extents, |r| {
        positions.push(r.iter().zip(&ranges).map(|(&r, &(lo, _))| lo + r).collect());
    });
    positions
}

/// The maximum of `values`; NaN if any is NaN and `propagate`, else NaNs are skipped
/// (-inf when nothing is left).
pub fn max_of(values: &[f64], propagate: bool) -> f64 {
    let mut best = f64::NEG_INFINITY;
    for &v in values {
        if v.is_nan() {
            if propagate {
                return f64::NAN;
            }
        } else if v > best {
            best = v;
        }
    }
    best
}

/// Whether `v` is the window's `y` (NaN equals NaN).
fn same_value(v: f64, y: f64) -> bool {
    v == y || (v.is_nan() && y.is_nan())
}

/// The index `[n, c, spatial..]`.
fn full_index(n: usize, c: usize, spatial: &[usize]) -> Vec<usize> {
    let mut idx = vec![n, c];
    idx.extend_from_slice(spatial);
    idx
}

/// `y = alpha * pool(x) + beta * y` (`y` not read when `beta == 0`).
pub fn forward(
    pool: &PoolingDescriptor,
    alpha: f64,
    x: &HostTensor,
    beta: f64,
    y: &mut HostTensor,
) {
    let input = x.desc.dims()[2..].to_vec();
    let volume: usize = pool.window().iter().product();
    super::write_blended(y, alpha, beta, |yi| {
        let (n, c) = (yi[0], yi[1]);
        let values: Vec<f64> = window_positions(pool, &input, &yi[2..])
            .iter()
            .map(|p| x.get(&full_index(n, c, p)))
            .collect();
        match pool.mode() {
            PoolingMode::Max | PoolingMode::MaxDeterministic => {
                max_of(&values, pool.nan_opt() == PoolingNanOpt::Propagate)
            }
            PoolingMode::AverageCountIncludePadding => values.iter().sum::<f64>() / volume as f64,
            PoolingMode::AverageCountExcludePadding => {
                values.iter().sum::<f64>() / values.len() as f64
            }
        }
    });
}

/// `dx = alpha * grad + beta * dx` (`dx` not read when `beta == 0`): average windows
/// spread `dy / count` over their inputs; a max window sends `dy` to its first input in
/// scan order equal to its `y`, if any.
pub fn backward(
    pool: &PoolingDescriptor,
    alpha: f64,
    y: &HostTensor,
    dy: &HostTensor,
    x: &HostTensor,
    beta: f64,
    dx: &mut HostTensor,
) {
    let input = x.desc.dims()[2..].to_vec();
    let volume: usize = pool.window().iter().product();
    let dense = TensorDescriptor::packed(DataType::F64, x.desc.dims())
        .expect("x's dims describe a valid tensor");
    let mut grad = HostTensor::filled(dense, 0.0);
    for_each_index(dy.desc.dims(), |oi| {
        let (n, c) = (oi[0], oi[1]);
        let positions = window_positions(pool, &input, &oi[2..]);
        let g = dy.get(oi);
        if pool.mode().is_max() {
            let yv = y.get(oi);
            let winner = positions
                .iter()
                .map(|p| full_index(n, c, p))
                .find(|idx| same_value(x.get(idx), yv));
            if let Some(idx) = winner {
                grad.set(&idx, grad.get(&idx) + g);
            }
        } else {
            let count = match pool.mode() {
                PoolingMode::AverageCountIncludePadding => volume,
                _ => positions.len(),
            };
            for p in &positions {
                let idx = full_index(n, c, p);
                grad.set(&idx, grad.get(&idx) + g / count as f64);
            }
        }
    });
    super::write_blended(dx, alpha, beta, |idx| grad.get(idx));
}
