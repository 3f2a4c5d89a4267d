//! [`ConvFwdAlgo::Gemm1x1`](super::ConvFwdAlgo::Gemm1x1): a 1x1 convolution without padding
//! is a matmul, `y[pixel, k] = sum_c x[pixel, c] * w[k, c]`, when the sampled pixels of x
//! and of y (and z) each form one strided run, or one run per image (then a batched
//! matmul). It runs on the matmul core as it is (heuristic tile, `wgmma` on Hopper), with
//! the convolution's blend, bias (per column) and residual in the matmul's epilogue.

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::descriptor::TensorDescriptor;
use crate::dtype::DataType;
use crate::error::Result;
use crate::ops::matmul::{
    matmul, BiasMode, MathType, MatmulBias, MatmulDescriptor, MatmulEpilogue,
};

/// The shortest pixel run worth a batched matmul (a 64-row tile).
const MIN_BATCHED_ROWS: usize = 64;

/// The pixels of x, y and z as `[batch, M]` runs: `(extent, x, y, z strides)` of each
/// of (at most) two dims, outer first, or `None` when more dims remain after merging.
type Runs = Vec<(usize, [usize; 3])>;

fn pixel_runs(p: &Problem) -> Option<Runs> {
    let g = &p.geo;
    let dims = (0..4).map(|d| {
        let extent = if d == 0 { g.n } else { g.output[d - 1] } as usize;
        let step = if d == 0 { 1 } else { g.stride[d - 1] as usize };
        // x's sampled pixels step by the stride; y and z step by one.
        let xs = g.x[if d == 0 { 0 } else { d + 1 }] as usize * step;
        let ys = g.y[if d == 0 { 0 } else { d + 1 }] as usize;
        let zs = g.z[if d == 0 { 0 } else { d + 1 }] as usize;
        (extent, [xs, ys, zs])
    });
    let mut runs: Runs = Vec::new();
    for (extent, s) in dims.filter(|&(e, _)| e > 1) {
        match runs.last_mut() {
            Some((outer, os)) if (0..3).all(|i| os[i] == s[i] * extent) => {
                *outer *= extent;
                *os = s;
            }
            _ => runs.push((extent, s)),
        }
    }
    (runs.len() <= 2).then_some(runs)
}

/// Why this problem is not a matmul, or `None` if it is.
pub(super) fn declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if g.filter != [1, 1, 1] {
        return Some("the filter is not 1x1".into());
    }
    if g.pad != [0, 0, 0] {
        return Some("the convolution pads its input".into());
    }
    if g.groups != 1 {
        return Some("grouped convolutions are not one matmul".into());
    }
    if p.math == MathType::Fma && matches!(p.dtype, DataType::F16 | DataType::BF16) {
        return Some("the matmul core has no CUDA-core kernels for 16-bit data".into());
    }
    match pixel_runs(p) {
        None => Some("x's or y's pixels do not form one strided run per image".into()),
        // A batch of short runs (a strided 1x1 over NHWC: one run per output row) wastes
        // most of each matmul tile; the implicit GEMMs walk such pixels at full tiles.
        Some(runs) if runs.len() == 2 && runs[1].0 < MIN_BATCHED_ROWS => Some(format!(
            "its pixels form runs of {} (batched matmuls want at least {MIN_BATCHED_ROWS})",
            runs[1].0
        )),
        Some(_) => None,
    }
}

/// `[batch, rows, cols]` (or `[rows, cols]` without a batch) with the given strides.
fn matrix(
    dtype: DataType,
    batch: Option<(usize, usize)>,
    rows: (usize, usize),
    cols: (usize, usize),
) -> Result<TensorDescriptor> {
    let (dims, strides): (Vec<usize>, Vec<usize>) = match batch {
        Some(b) => (
            vec![b.0, rows.0, cols.0],
            vec![b.1.max(1), rows.1.max(1), cols.1.max(1)],
        ),
        None => (vec![rows.0, cols.0], vec![rows.1.max(1), cols.1.max(1)]),
    };
    TensorDescriptor::new(dtype, &dims, &strides)
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let runs = pixel_runs(p).unwrap_or_default();
    // The inner run is the matmul's M; an outer one (images that do not merge) its batch.
    let (m, ms) = runs.last().copied().unwrap_or((1, [1, 1, 1]));
    let batch = (runs.len() == 2).then(|| runs[0]);
    let (c, k) = (g.c as usize, g.k as usize);
    let dt = p.dtype;
    let a_desc = matrix(
        dt,
        batch.map(|b| (b.0, b.1[0])),
        (m, ms[0]),
        (c, g.x[1] as usize),
    )?;
    let b_desc = matrix(dt, None, (c, g.w[1] as usize), (k, g.w[0] as usize))?;
    let c_desc = matrix(
        dt,
        batch.map(|b| (b.0, b.1[1])),
        (m, ms[1]),
        (k, g.y[1] as usize),
    )?;
    let z_desc = match &call.epilogue.residual {
        Some(_) => Some(matrix(
            dt,
            batch.map(|b| (b.0, b.1[2])),
            (m, ms[2]),
            (k, g.z[1] as usize),
        )?),
        None => None,
    };
    let bias_desc = TensorDescriptor::packed(dt, &[k])?;
    let epilogue = MatmulEpilogue {
        activation: call.epilogue.activation,
        bias: call.epilogue.bias.map(|b| MatmulBias {
            mode: BiasMode::PerColumn,
            desc: &bias_desc,
            data: b.data,
        }),
        residual: match (&call.epilogue.residual, &z_desc) {
            (Some(z), Some(desc)) => Some(crate::ops::matmul::Residual { desc, ..*z }),
            _ => None,
        },
    };
    matmul(
        call.handle,
        &MatmulDescriptor::new(p.math),
        call.alpha as f64,
        &a_desc,
        call.x,
        &b_desc,
        call.w,
        call.beta as f64,
        &c_desc,
        y,
        &epilogue,
    )
}
