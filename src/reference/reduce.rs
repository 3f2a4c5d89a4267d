//! Reference reduction, in f64.

use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::reduce::ReduceOp;

/// `y = alpha * reduce(x) + beta * y` over the dims where `y` has extent 1. Returns, per
/// element of `y` in row-major order, the flattened index of the selected element within
/// the reduced dims (min/max/amax: NaN wins, then the first extreme; 0 for other ops).
pub fn reduce(op: ReduceOp, alpha: f64, x: &HostTensor, beta: f64, y: &mut HostTensor) -> Vec<u32> {
    let red_dims: Vec<usize> = x
        .desc
        .dims()
        .iter()
        .zip(y.desc.dims())
        .map(|(&xn, &yn)| if yn == 1 { xn } else { 1 })
        .collect();
    let mut indices = Vec::new();
    let ydesc = y.desc;
    for_each_index(ydesc.dims(), |out_idx| {
        let mut values = Vec::new();
        for_each_index(&red_dims, |r| {
            let full: Vec<usize> = out_idx.iter().zip(r).map(|(&o, &r)| o + r).collect();
            values.push(x.get(&full));
        });
        let (v, i) = reduce_values(op, &values);
        indices.push(i as u32);
        let old = y.get(out_idx);
        y.set(out_idx, super::blend(alpha, v, beta, old));
    });
    indices
}

/// Reduces one list of values; returns the result and the selected index.
pub fn reduce_values(op: ReduceOp, values: &[f64]) -> (f64, usize) {
    let select = |key: &dyn Fn(f64) -> f64, better: &dyn Fn(f64, f64) -> bool| {
        let mut best = 0;
        for (i, &v) in values.iter().enumerate() {
            let (kv, kb) = (key(v), key(values[best]));
            if kb.is_nan() {
                break;
            }
            if kv.is_nan() || better(kv, kb) {
                best = i;
            }
        }
        (key(values[best]), best)
    };
    let n = values.len() as f64;
    match op {
        ReduceOp::Add => (values.iter().sum(), 0),
        ReduceOp::Mul => (values.iter().product(), 0),
        ReduceOp::Avg => (values.iter().sum::<f64>() / n, 0),
        ReduceOp::Norm1 => (values.iter().map(|v| v.abs()).sum(), 0),
        ReduceOp::Norm2 => (values.iter().map(|v| v * v).sum::<f64>().sqrt(), 0),
        ReduceOp::MulNoZeros => (values.iter().filter(|&&v| v != 0.0).product(), 0),
        ReduceOp::Min => select(&|v| v, &|a, b| a < b),
        ReduceOp::Max => select(&|v| v, &|a, b| a > b),
        ReduceOp::Amax => select(&|v: f64| v.abs(), &|a, b| a > b),
    }
}
