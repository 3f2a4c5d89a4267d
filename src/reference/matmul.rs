//! Reference matmul with its epilogue, in f64.

use crate::host_tensor::HostTensor;
use crate::ops::activation::ActivationDescriptor;
use oxidnn_params::BiasMode;

/// Element `(i, j)` of matrix `batch` of a rank-2 (`[rows, cols]`) or rank-3
/// (`[batch, rows, cols]`, batch 1 broadcast) tensor.
fn at(t: &HostTensor, batch: usize, i: usize, j: usize) -> f64 {
    match t.desc.dims() {
        [b, _, _] => t.get(&[if *b == 1 { 0 } else { batch }, i, j]),
        _ => t.get(&[i, j]),
    }
}

fn set(t: &mut HostTensor, batch: usize, i: usize, j: usize, v: f64) {
    match t.desc.dims().len() {
        3 => t.set(&[batch, i, j], v),
        _ => t.set(&[i, j], v),
    }
}

/// `D = act(alpha * A B + beta * C + bias + scale * Z)` for every batch of `c`; `C` (the
/// old `c`) is not read when `beta == 0`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    alpha: f64,
    a: &HostTensor,
    b: &HostTensor,
    beta: f64,
    c: &mut HostTensor,
    bias: Option<(BiasMode, &HostTensor)>,
    residual: Option<(f64, &HostTensor)>,
    act: &ActivationDescriptor,
) {
    let cd = c.desc.dims().to_vec();
    let (batches, m, n) = match cd[..] {
        [b, m, n] => (b, m, n),
        [m, n] => (1, m, n),
        _ => panic!("matmul reference: C must have rank 2 or 3"),
    };
    let k = *a.desc.dims().last().expect("A has rank >= 2");
    for bt in 0..batches {
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k).map(|kk| at(a, bt, i, kk) * at(b, bt, kk, j)).sum();
                let mut v = alpha * sum;
                if beta != 0.0 {
                    v += beta * at(c, bt, i, j);
                }
                match bias {
                    Some((BiasMode::PerRow, t)) => v += t.get(&[i]),
                    Some((BiasMode::PerColumn, t)) => v += t.get(&[j]),
                    _ => {}
                }
                if let Some((scale, z)) = residual {
                    v += scale * at(z, bt, i, j);
                }
                let out = super::activation::apply(act.mode(), act.coef(), v);
                set(c, bt, i, j, out);
            }
        }
    }
}
