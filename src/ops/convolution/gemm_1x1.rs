//! [`ConvFwdAlgo::Gemm1x1`](super::ConvFwdAlgo::Gemm1x1): a 1x1 convolution without padding
//! is a matmul, `y[pixel, k] = sum_c x[pixel, c] * w[k, c]`, when the sampled pixels of x
//! and of y (and z) each form one strided run, or one run per image (then a batched
//! matmul). It runs on the matmul core as it is (heuristic tile, TMA `wgmma` on Hopper),
//! with the convolution's blend, bias (per column) and residual in the matmul's epilogue.
//!
//! Where x's sampled pixels do not form such runs (a strided 1x1 over NHWC: one short run
//! per output row) but y's do, the sampled pixels are first packed into the workspace,
//! channels contiguous (a strided copy reading a quarter of x at stride 2; 16-byte chunks
//! where the channels allow, [`chunk_gather`]), and the matmul reads them from there at
//! full tiles.

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::descriptor::TensorDescriptor;
use crate::dtype::DataType;
use crate::error::Result;
use crate::kernels;
use crate::launch::LaunchConfig;
use crate::ops::matmul::{
    matmul, matmul_staged_a, BiasMode, MathType, MatmulBias, MatmulDescriptor, MatmulEpilogue,
};
use crate::ops::tensor_ops::transform_on_gpu;
use oxidnn_params::{FastDivisor, IndexMap, RowGatherParams};

/// The shortest pixel run worth a batched matmul (a 64-row tile).
const MIN_BATCHED_ROWS: usize = 64;

/// The pixels of x, y and z as `[batch, M]` runs: `(extent, x, y, z strides)` of each
/// of (at most) two dims, outer first, or `None` when more dims remain after merging.
type Runs = Vec<(usize, [usize; 3])>;

/// The pixel dims `[n, o0, o1, o2]` of the output: extents.
fn pixel_extents(p: &Problem) -> [usize; 4] {
    let g = &p.geo;
    [g.n, g.output[0], g.output[1], g.output[2]].map(|e| e as usize)
}

/// x's strides between sampled pixels along `[n, o0, o1, o2]`: where they lie in x
/// (`staged` false), or packed channels-last in the workspace (`staged`).
fn x_pixel_strides(p: &Problem, staged: bool) -> [usize; 4] {
    let g = &p.geo;
    if staged {
        let e = pixel_extents(p);
        let c = g.c as usize;
        [e[1] * e[2] * e[3] * c, e[2] * e[3] * c, e[3] * c, c]
    } else {
        let s = |d: usize| g.stride[d] as usize;
        [
            g.x[0] as usize,
            g.x[2] as usize * s(0),
            g.x[3] as usize * s(1),
            g.x[4] as usize * s(2),
        ]
    }
}

fn pixel_runs(p: &Problem, staged: bool) -> Option<Runs> {
    let g = &p.geo;
    let extents = pixel_extents(p);
    let xs = x_pixel_strides(p, staged);
    let dims = (0..4).map(|d| {
        // y and z step by one pixel.
        let ys = g.y[if d == 0 { 0 } else { d + 1 }] as usize;
        let zs = g.z[if d == 0 { 0 } else { d + 1 }] as usize;
        (extents[d], [xs[d], ys, zs])
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

/// Whether the runs make full matmul tiles: one run, or runs of at least a tile's rows.
fn long(runs: &Runs) -> bool {
    runs.len() < 2 || runs[1].0 >= MIN_BATCHED_ROWS
}

/// Whether x's sampled pixels are packed into the workspace first (see the module docs),
/// for a problem [`declines`] accepts.
fn staged(p: &Problem) -> bool {
    !pixel_runs(p, false).is_some_and(|r| long(&r))
}

/// Workspace bytes: the packed sampled pixels of x when [`staged`], else none.
pub(super) fn workspace_bytes(p: &Problem) -> usize {
    if declines(p).is_some() || !staged(p) {
        return 0;
    }
    pixel_extents(p).iter().product::<usize>() * p.geo.c as usize * p.dtype.size_bytes()
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
    // x's pixels that do not form long runs are packed first: y's (and z's) must.
    if staged(p) {
        if let Err(e) = staging_descriptors(p) {
            return Some(format!("x's sampled pixels cannot be packed: {e}"));
        }
    }
    match pixel_runs(p, true) {
        None => Some("y's pixels do not form one strided run per image".into()),
        // A batch of short runs (one per output row) wastes most of each matmul tile; the
        // implicit GEMMs walk such pixels at full tiles.
        Some(runs) if !long(&runs) => Some(format!(
            "y's pixels form runs of {} (batched matmuls want at least {MIN_BATCHED_ROWS})",
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

/// The strided copy that packs x's sampled pixels into the workspace: x's view of them
/// and the packed tensor, both `[n, o0, o1, o2, c]` (channels innermost, so that the copy
/// runs along x's contiguous channels; the packed one has strides [`x_pixel_strides`]
/// and 1).
fn staging_descriptors(p: &Problem) -> Result<(TensorDescriptor, TensorDescriptor)> {
    let g = &p.geo;
    let e = pixel_extents(p);
    let dims = [e[0], e[1], e[2], e[3], g.c as usize];
    // Dims of extent 1 have stride 0 in the geometry; a descriptor wants >= 1 (any value
    // does there).
    let sampled = x_pixel_strides(p, false).map(|s| s.max(1));
    let packed = x_pixel_strides(p, true).map(|s| s.max(1));
    let channel = (g.x[1] as usize).max(1);
    let from = TensorDescriptor::new(
        p.dtype,
        &dims,
        &[sampled[0], sampled[1], sampled[2], sampled[3], channel],
    )?;
    let to = TensorDescriptor::new(
        p.dtype,
        &dims,
        &[packed[0], packed[1], packed[2], packed[3], 1],
    )?;
    Ok((from, to))
}

/// Threads of the chunk gather: enough to fill an H100 several times over; each strides on.
const CHUNK_GATHER_THREADS: u64 = 1 << 20;

/// The packing as a gather of 16-byte chunks (`transform_rows_v4`: one load and store per
/// chunk instead of per element), where x's channels are contiguous and each pixel's
/// channels, every pixel stride and both addresses are whole 16-byte chunks; `None`
/// sends the packing to the element-wise transform.
fn chunk_gather(p: &Problem, x: u64, workspace: u64) -> Option<RowGatherParams> {
    const CHUNK: usize = 16;
    let bytes = p.dtype.size_bytes();
    let row = p.geo.c as usize * bytes;
    let strides = x_pixel_strides(p, false).map(|s| s * bytes);
    let whole = |v: usize| v.is_multiple_of(CHUNK);
    let aligned = x.is_multiple_of(CHUNK as u64) && workspace.is_multiple_of(CHUNK as u64);
    if p.geo.x[1] != 1 || !whole(row) || !strides.iter().all(|&s| whole(s)) || !aligned {
        return None;
    }
    let extents = pixel_extents(p);
    let chunks = row / CHUNK;
    let len = extents.iter().product::<usize>() * chunks;
    if len > u32::MAX as usize {
        return None;
    }
    let mut rows = IndexMap::<1> {
        rank: extents.len() as u32,
        ..Default::default()
    };
    for (d, (&e, &s)) in extents.iter().zip(&strides).enumerate() {
        rows.dims[d] = FastDivisor::new(e as u32);
        rows.strides[0][d] = (s / CHUNK) as u64;
    }
    Some(RowGatherParams {
        len: len as u64,
        chunks: FastDivisor::new(chunks as u32),
        rows,
    })
}

/// Packs x's sampled pixels into the workspace ([`staging_descriptors`]).
fn stage_x(call: &Call) -> Result<()> {
    let p = call.p;
    let (from, to) = staging_descriptors(p)?;
    if call.ptrs.workspace_bytes < workspace_bytes(p) {
        return Err(crate::error::Error::WorkspaceTooSmall {
            required_bytes: workspace_bytes(p),
            got_bytes: call.ptrs.workspace_bytes,
        });
    }
    if let Some(params) = chunk_gather(p, call.ptrs.x, call.ptrs.workspace) {
        let cfg = LaunchConfig::for_threads(params.len.min(CHUNK_GATHER_THREADS), 256)?;
        // SAFETY: as below: `params` names x's sampled pixels (whole rows of channels,
        // contiguous in x) in 16-byte chunks and the packed rows of the workspace, `len`
        // chunks = `workspace_bytes / 16`; both addresses are 16-byte aligned.
        return unsafe {
            call.gpu.launch(
                kernels::TRANSFORM_ROWS_V4,
                cfg,
                &params,
                &[call.ptrs.x, call.ptrs.workspace],
            )
        };
    }
    // SAFETY: `from` reaches exactly x's sampled elements (the problem's geometry was
    // checked against x's descriptor and buffer); `to` is packed and its span, checked
    // just above, lies in the workspace, which the caller checked holds
    // `workspace_bytes` and which overlaps no tensor of the call.
    unsafe {
        transform_on_gpu(
            call.gpu,
            1.0,
            &from,
            call.ptrs.x,
            0.0,
            &to,
            call.ptrs.workspace,
        )
    }
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let staged = staged(p);
    if staged {
        stage_x(call)?;
    }
    let runs = pixel_runs(p, staged).unwrap_or_default();
    // The inner run is the matmul's M; an outer one (images that do not merge) its batch.
    let (m, ms) = runs.last().copied().unwrap_or((1, [1, 1, 1]));
    let batch = (runs.len() == 2).then(|| runs[0]);
    let (c, k) = (g.c as usize, g.k as usize);
    let dt = p.dtype;
    let a_desc = matrix(
        dt,
        batch.map(|b| (b.0, b.1[0])),
        (m, ms[0]),
        (c, if staged { 1 } else { g.x[1] as usize }),
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
    let desc = MatmulDescriptor::new(p.math);
    let (alpha, beta) = (call.alpha as f64, call.beta as f64);
    if staged {
        // SAFETY: the packed pixels `a_desc` describes are those `stage_x` wrote into the
        // workspace (checked to hold them), which y does not overlap.
        unsafe {
            matmul_staged_a(
                call.handle,
                &desc,
                alpha,
                &a_desc,
                call.ptrs.workspace,
                &b_desc,
                call.w,
                beta,
                &c_desc,
                y,
                &epilogue,
            )
        }
    } else {
        matmul(
            call.handle,
            &desc,
            alpha,
            &a_desc,
            call.x,
            &b_desc,
            call.w,
            beta,
            &c_desc,
            y,
            &epilogue,
        )
    }
}
