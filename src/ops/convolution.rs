//! Convolution forward (cuDNN's `cudnnConvolutionForward` and
//! `cudnnConvolutionBiasActivationForward`):
//!
//! `y = act(alpha * conv(x, w) + beta * y + bias + residual_scale * z)`
//!
//! x is `[n, c, spatial..]` (1 to 3 spatial dims, any layout and strides), the filter
//! `[k, c / groups, spatial..]` ([`FilterDescriptor`], KCRS or KRSC), y
//! `[n, k, output spatial..]` ([`convolution_forward_output_dims`]). The
//! [`ConvolutionDescriptor`] holds padding, stride and dilation per spatial dim, the
//! group count, the mode (cross-correlation, or convolution with the filter reversed) and
//! the math the caller allows ([`MathType`]). Sums accumulate in f32 (f64 on the CPU
//! handle).
//!
//! Algorithms ([`ConvFwdAlgo`]) form an ordered implementation list; each accepts a
//! problem or says why not. [`get_convolution_forward_algorithm`] ranks the accepted ones
//! by a heuristic (no launch), [`find_convolution_forward_algorithm`] times them on the
//! caller's buffers and caches the ranking in the handle.
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! // One 3x3 image, one channel; a 2x2 filter of ones, padding 0, stride 1.
//! let x_desc = TensorDescriptor::nchw(DataType::F32, 1, 1, 3, 3)?;
//! let w_desc = FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 1, 1, &[2, 2])?;
//! let conv = ConvolutionDescriptor::new(&[0, 0], &[1, 1], &[1, 1], ConvMode::CrossCorrelation, MathType::Fma)?;
//! let y_dims = convolution_forward_output_dims(&conv, &x_desc, &w_desc)?;
//! assert_eq!(y_dims, [1, 1, 2, 2]);
//! let y_desc = TensorDescriptor::packed(DataType::F32, &y_dims)?;
//! let x = handle.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])?;
//! let w = handle.upload(&[1.0f32; 4])?;
//! let mut y = handle.alloc(&y_desc)?;
//! let algo = get_convolution_forward_algorithm(&handle, &x_desc, &w_desc, &conv, &y_desc)?[0].algo;
//! let ws = convolution_forward_workspace_size(&handle, &x_desc, &w_desc, &conv, &y_desc, algo)?;
//! let mut workspace = handle.alloc_bytes(ws.max(1))?;
//! convolution_forward(&handle, 1.0, &x_desc, &x, &w_desc, &w, &conv, algo, Some(&mut workspace), 0.0, &y_desc, &mut y)?;
//! assert_eq!(handle.read::<f32>(&y)?, [12.0, 16.0, 24.0, 28.0]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

mod channel_padding;
mod depthwise;
mod direct;
mod gemm_1x1;
mod implicit_gemm;
mod implicit_gemm_tensor_op;
mod winograd;

use super::activation::ActivationDescriptor;
use super::matmul::{epilogue_ops, MathType, Residual};
use super::{host_read, host_write, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::launch::{device_ptr, device_ptr_mut, Gpu};
use crate::reference;
use oxidnn_params::{BiasMode, ConvGeometry, EpilogueOps};

/// Most spatial dims of a convolution (3-D: `d, h, w`).
pub const CONV_MAX_SPATIAL: usize = 3;

/// How a filter's dims lie in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FilterLayout {
    /// `[k, c, spatial..]` packed (cuDNN's `CUDNN_TENSOR_NCHW` filter).
    Kcrs,
    /// `[k, spatial.., c]` packed: channels innermost (`CUDNN_TENSOR_NHWC`).
    Krsc,
}

/// A convolution filter (cuDNN's `cudnnFilterDescriptor_t`): `k` output channels, `c` input
/// channels per group, 1 to 3 spatial dims, packed in `layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilterDescriptor {
    layout: FilterLayout,
    tensor: TensorDescriptor,
}

impl FilterDescriptor {
    /// ```
    /// use oxidnn::{DataType, FilterDescriptor, FilterLayout};
    /// let w = FilterDescriptor::new(DataType::F16, FilterLayout::Krsc, 64, 32, &[3, 3])?;
    /// assert_eq!(w.dims(), [64, 32, 3, 3]);
    /// assert_eq!(w.tensor().strides(), [288, 1, 96, 32]);
    /// # Ok::<(), oxidnn::Error>(())
    /// ```
    pub fn new(
        dtype: DataType,
        layout: FilterLayout,
        k: usize,
        c: usize,
        spatial: &[usize],
    ) -> Result<Self> {
        if spatial.is_empty() || spatial.len() > CONV_MAX_SPATIAL {
            return Err(Error::bad(
                "spatial",
                format!(
                    "a filter has 1 to {CONV_MAX_SPATIAL} spatial dims, got {}",
                    spatial.len()
                ),
            ));
        }
        let tensor = TensorDescriptor::spatial(
            dtype,
            k,
            c,
            spatial,
            match layout {
                FilterLayout::Kcrs => crate::Layout::ChannelsFirst,
                FilterLayout::Krsc => crate::Layout::ChannelsLast,
            },
        )
        .map_err(|e| match e {
            Error::BadParam { message, .. } => Error::bad("filter", message),
            e => e,
        })?;
        Ok(Self { layout, tensor })
    }

    pub fn layout(&self) -> FilterLayout {
        self.layout
    }
    pub fn dtype(&self) -> DataType {
        self.tensor.dtype()
    }
    /// `[k, c, spatial..]`.
    pub fn dims(&self) -> &[usize] {
        self.tensor.dims()
    }
    /// The filter as a tensor with logical dims `[k, c, spatial..]` and its layout's strides.
    pub fn tensor(&self) -> &TensorDescriptor {
        &self.tensor
    }
}

/// Whether the filter is applied as stored or reversed (cuDNN's `cudnnConvolutionMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvMode {
    /// Each spatial dim of the filter reversed: the mathematical convolution
    /// (`CUDNN_CONVOLUTION`).
    Convolution,
    /// The filter as stored: what deep-learning frameworks call convolution
    /// (`CUDNN_CROSS_CORRELATION`).
    CrossCorrelation,
}

/// Padding, stride, dilation (one per spatial dim), groups, mode and math of a convolution
/// (cuDNN's `cudnnConvolutionDescriptor_t`; the compute type is always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvolutionDescriptor {
    spatial: usize,
    pad: [usize; CONV_MAX_SPATIAL],
    stride: [usize; CONV_MAX_SPATIAL],
    dilation: [usize; CONV_MAX_SPATIAL],
    groups: usize,
    mode: ConvMode,
    math: MathType,
}

impl ConvolutionDescriptor {
    /// `pad`, `stride` and `dilation` have one entry per spatial dim (1 to 3, all the same
    /// count); strides and dilations are >= 1. One group.
    pub fn new(
        pad: &[usize],
        stride: &[usize],
        dilation: &[usize],
        mode: ConvMode,
        math: MathType,
    ) -> Result<Self> {
        let spatial = pad.len();
        if spatial == 0 || spatial > CONV_MAX_SPATIAL {
            return Err(Error::bad(
                "pad",
                format!("1 to {CONV_MAX_SPATIAL} spatial dims, got {spatial} paddings"),
            ));
        }
        for (arg, v) in [("stride", stride), ("dilation", dilation)] {
            if v.len() != spatial {
                return Err(Error::bad(
                    arg,
                    format!("{} values for {spatial} spatial dims", v.len()),
                ));
            }
            if let Some(i) = v.iter().position(|&s| s == 0) {
                return Err(Error::bad(
                    arg,
                    format!("{arg} of spatial dim {i} is 0; it must be >= 1 ({v:?})"),
                ));
            }
        }
        let fill = |v: &[usize], rest: usize| {
            let mut a = [rest; CONV_MAX_SPATIAL];
            a[..v.len()].copy_from_slice(v);
            a
        };
        Ok(Self {
            spatial,
            pad: fill(pad, 0),
            stride: fill(stride, 1),
            dilation: fill(dilation, 1),
            groups: 1,
            mode,
            math,
        })
    }

    /// The descriptor with `groups` groups (>= 1; `groups == c` is a depthwise convolution).
    pub fn with_groups(self, groups: usize) -> Result<Self> {
        if groups == 0 {
            return Err(Error::bad("groups", "the group count must be >= 1, got 0"));
        }
        Ok(Self { groups, ..self })
    }

    /// The descriptor with another math type.
    pub fn with_math(self, math: MathType) -> Self {
        Self { math, ..self }
    }

    pub fn spatial_dims(&self) -> usize {
        self.spatial
    }
    pub fn padding(&self) -> &[usize] {
        &self.pad[..self.spatial]
    }
    pub fn stride(&self) -> &[usize] {
        &self.stride[..self.spatial]
    }
    pub fn dilation(&self) -> &[usize] {
        &self.dilation[..self.spatial]
    }
    pub fn groups(&self) -> usize {
        self.groups
    }
    pub fn mode(&self) -> ConvMode {
        self.mode
    }
    pub fn math(&self) -> MathType {
        self.math
    }
}

/// The dims of y for this convolution: `[n, k, o..]` with
/// `o = (i + 2 * pad - ((f - 1) * dilation + 1)) / stride + 1` per spatial dim
/// (cudnnGetConvolutionNdForwardOutputDim).
pub fn convolution_forward_output_dims(
    conv: &ConvolutionDescriptor,
    x_desc: &TensorDescriptor,
    w_desc: &FilterDescriptor,
) -> Result<Vec<usize>> {
    let s = conv.spatial;
    if x_desc.rank() != s + 2 {
        return Err(Error::bad(
            "x_desc",
            format!(
                "a convolution with {s} spatial dims takes x of rank {}, got rank {}",
                s + 2,
                x_desc.rank()
            ),
        ));
    }
    if w_desc.dims().len() != s + 2 {
        return Err(Error::bad(
            "w_desc",
            format!(
                "the convolution has {s} spatial dims, the filter {}",
                w_desc.dims().len() - 2
            ),
        ));
    }
    let (xd, wd) = (x_desc.dims(), w_desc.dims());
    let (c, k, g) = (xd[1], wd[0], conv.groups);
    if c % g != 0 {
        return Err(Error::bad(
            "groups",
            format!("x has {c} channels, not divisible by {g} groups"),
        ));
    }
    if k % g != 0 {
        return Err(Error::bad(
            "groups",
            format!("the filter has {k} output channels, not divisible by {g} groups"),
        ));
    }
    if wd[1] * g != c {
        return Err(Error::bad(
            "w_desc",
            format!(
                "the filter takes {} channels per group, x has {c} channels in {g} groups ({} per group)",
                wd[1],
                c / g
            ),
        ));
    }
    let mut dims = vec![xd[0], k];
    for j in 0..s {
        let padded = xd[2 + j] + 2 * conv.pad[j];
        let extent = (wd[2 + j] - 1)
            .checked_mul(conv.dilation[j])
            .and_then(|e| e.checked_add(1))
            .ok_or_else(|| Error::bad("dilation", "the dilated filter does not fit in memory"))?;
        if extent > padded {
            return Err(Error::bad(
                "dilation",
                format!(
                    "spatial dim {j}: the filter spans {extent} elements (size {}, dilation {}), more than the padded input's {padded}",
                    wd[2 + j],
                    conv.dilation[j]
                ),
            ));
        }
        dims.push((padded - extent) / conv.stride[j] + 1);
    }
    Ok(dims)
}

/// A convolution forward algorithm. [`ConvFwdAlgo::ALL`] is the implementation list in
/// order of preference; each algorithm accepts a problem or says why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvFwdAlgo {
    /// Depthwise convolutions (groups == c, one input channel per group): several outputs
    /// per thread along a row with the input window in registers (any layout), or 16-byte
    /// channel vectors per thread (channels-last). Memory-bound.
    Depthwise,
    /// 1x1 filters with no padding (any stride whose pixels form long runs): a plain
    /// matmul of the pixels by the filter, on the matmul core (`wgmma` on Hopper).
    Gemm1x1,
    /// Implicit GEMM on tensor cores (f16/bf16 `TensorOp`, f32 with `Tf32` math;
    /// channels-last x, KRSC filter): im2col tiles copied by `cp.async` straight from x
    /// into the matmul core's shared-memory pipeline (`wgmma` on Hopper).
    ImplicitGemmTensorOp,
    /// Winograd F(2x2, 3x3) for 3x3 filters at stride 1: fewer multiplies, reduced
    /// precision (its transforms round); never used under exact `Fma` math.
    Winograd,
    /// Implicit GEMM on CUDA cores with exact f32 FMA (any layout), filter-tap offset
    /// tables in shared memory; split-K (a workspace of partial sums, reduced in a fixed
    /// order) where the output tiles alone would leave SMs idle.
    ImplicitGemm,
    /// One thread per output element: any problem, the always-correct fallback.
    Direct,
}

impl ConvFwdAlgo {
    /// The implementation list in the heuristic's order of preference: the specialised
    /// algorithms first (each accepts only problems it runs well), then the tensor cores
    /// where the math allows them (Winograd after the implicit GEMM: it is slower on every
    /// layer where both run, H100, and rounds more), the exact CUDA-core implicit GEMM,
    /// and the always-correct fallback last.
    pub const ALL: [ConvFwdAlgo; 6] = [
        Self::Depthwise,
        Self::Gemm1x1,
        Self::ImplicitGemmTensorOp,
        Self::Winograd,
        Self::ImplicitGemm,
        Self::Direct,
    ];

    /// Whether results are bitwise the same from run to run (every algorithm here: none
    /// uses atomics; the implicit GEMM's split-K adds its partitions in a fixed order).
    pub fn deterministic(self) -> bool {
        true
    }

    /// Whether the algorithm's arithmetic is less precise than the math type promises
    /// (Winograd's transforms round).
    pub fn reduced_precision(self) -> bool {
        self == Self::Winograd
    }
}

/// One ranked algorithm of [`get_convolution_forward_algorithm`] or
/// [`find_convolution_forward_algorithm`] (cuDNN's `cudnnConvolutionFwdAlgoPerf_t`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConvFwdAlgoPerf {
    pub algo: ConvFwdAlgo,
    /// Median time of the timed runs in milliseconds (`find`); `NaN` from `get`.
    pub time_ms: f32,
    pub workspace_bytes: usize,
    pub deterministic: bool,
    pub reduced_precision: bool,
}

/// A bias with one value per output channel, of y's dtype: dims `[k]` or `[1, k, 1..]`,
/// contiguous.
#[derive(Clone, Copy, Debug)]
pub struct ConvBias<'a> {
    pub desc: &'a TensorDescriptor,
    pub data: &'a Buffer,
}

/// What the convolution does to each result before storing it; `Default` is nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvEpilogue<'a> {
    pub activation: ActivationDescriptor,
    pub bias: Option<ConvBias<'a>>,
    /// `scale * z`, z of y's dims and dtype (any strides).
    pub residual: Option<Residual<'a>>,
}

/// `y = alpha * conv(x, w) + beta * y` with algorithm `algo` and `workspace` of at least
/// [`convolution_forward_workspace_size`] bytes (`None` where it is 0). y is not read when
/// `beta == 0`.
#[allow(clippy::too_many_arguments)]
pub fn convolution_forward(
    handle: &Handle,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    w_desc: &FilterDescriptor,
    w: &Buffer,
    conv: &ConvolutionDescriptor,
    algo: ConvFwdAlgo,
    workspace: Option<&mut Buffer>,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    convolution_forward_with(
        handle,
        alpha,
        x_desc,
        x,
        w_desc,
        w,
        conv,
        algo,
        workspace,
        beta,
        y_desc,
        y,
        &ConvEpilogue::default(),
    )
}

/// cuDNN's `cudnnConvolutionBiasActivationForward`:
/// `y = act(alpha1 * conv(x, w) + alpha2 * z + bias)`. `z` is `Some` for a separate
/// residual tensor, `None` for `z = y` (y's old content, as cuDNN allows `zData == yData`).
#[allow(clippy::too_many_arguments)]
pub fn convolution_bias_activation_forward(
    handle: &Handle,
    alpha1: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    w_desc: &FilterDescriptor,
    w: &Buffer,
    conv: &ConvolutionDescriptor,
    algo: ConvFwdAlgo,
    workspace: Option<&mut Buffer>,
    alpha2: f64,
    z: Option<(&TensorDescriptor, &Buffer)>,
    bias_desc: &TensorDescriptor,
    bias: &Buffer,
    activation: &ActivationDescriptor,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    let (beta, residual) = match z {
        Some((desc, data)) => (
            0.0,
            Some(Residual {
                scale: alpha2,
                desc,
                data,
            }),
        ),
        None => (alpha2, None),
    };
    let epilogue = ConvEpilogue {
        activation: *activation,
        bias: Some(ConvBias {
            desc: bias_desc,
            data: bias,
        }),
        residual,
    };
    convolution_forward_with(
        handle, alpha1, x_desc, x, w_desc, w, conv, algo, workspace, beta, y_desc, y, &epilogue,
    )
}

/// The general form: `y = act(alpha * conv(x, w) + beta * y + bias + scale * z)` as
/// `epilogue` says.
#[allow(clippy::too_many_arguments)]
pub fn convolution_forward_with(
    handle: &Handle,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    w_desc: &FilterDescriptor,
    w: &Buffer,
    conv: &ConvolutionDescriptor,
    algo: ConvFwdAlgo,
    workspace: Option<&mut Buffer>,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    epilogue: &ConvEpilogue,
) -> Result<()> {
    let problem = Problem::new(handle, x_desc, w_desc, conv, y_desc, epilogue)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("w", w_desc.tensor(), w)?;
    handle.check_tensor("y", y_desc, y)?;
    if let Some(b) = &epilogue.bias {
        handle.check_tensor("bias", b.desc, b.data)?;
    }
    if let Some(z) = &epilogue.residual {
        handle.check_tensor("residual", z.desc, z.data)?;
    }
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            // The CPU handle runs the reference whatever the algorithm (each is checked
            // for acceptance first, so that errors agree with the GPU's).
            problem.check_algorithm(algo, None)?;
            let (xt, wt) = (host_read(x_desc, x)?, host_read(w_desc.tensor(), w)?);
            let mut yt = host_read(y_desc, y)?;
            let bias = match &epilogue.bias {
                Some(b) => Some(host_read(b.desc, b.data)?),
                None => None,
            };
            let residual = match &epilogue.residual {
                Some(z) => Some((z.scale, host_read(z.desc, z.data)?)),
                None => None,
            };
            reference::convolution::forward(
                conv,
                alpha,
                &xt,
                &wt,
                beta,
                &mut yt,
                bias.as_ref(),
                residual.as_ref().map(|(s, t)| (*s, t)),
                &epilogue.activation,
            );
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            problem.check_algorithm(algo, Some(gpu))?;
            let needed = problem.workspace_bytes(algo, Some(gpu));
            let workspace = match workspace {
                Some(ws) if needed > 0 => {
                    if ws.len_bytes() < needed {
                        return Err(Error::WorkspaceTooSmall {
                            required_bytes: needed,
                            got_bytes: ws.len_bytes(),
                        });
                    }
                    handle.check_owner("workspace", ws)?;
                    Some((device_ptr_mut(gpu, ws)?, ws.len_bytes()))
                }
                None if needed > 0 => {
                    return Err(Error::WorkspaceTooSmall {
                        required_bytes: needed,
                        got_bytes: 0,
                    })
                }
                _ => None,
            };
            let call = Call {
                handle,
                gpu,
                p: &problem,
                alpha: alpha32,
                beta: beta32,
                epilogue,
                x,
                w,
                ptrs: Pointers {
                    x: device_ptr(gpu, x)?,
                    w: device_ptr(gpu, w)?,
                    bias: match &epilogue.bias {
                        Some(b) => device_ptr(gpu, b.data)?,
                        None => 0,
                    },
                    z: match &epilogue.residual {
                        Some(z) => device_ptr(gpu, z.data)?,
                        None => 0,
                    },
                    workspace: workspace.map_or(0, |(ptr, _)| ptr),
                    workspace_bytes: workspace.map_or(0, |(_, bytes)| bytes),
                },
            };
            problem.launch(algo, &call, y)
        }
    }
}

/// Bytes of workspace `algo` needs for this problem (0 for most), or why it cannot run it.
pub fn convolution_forward_workspace_size(
    handle: &Handle,
    x_desc: &TensorDescriptor,
    w_desc: &FilterDescriptor,
    conv: &ConvolutionDescriptor,
    y_desc: &TensorDescriptor,
    algo: ConvFwdAlgo,
) -> Result<usize> {
    let problem = Problem::new(
        handle,
        x_desc,
        w_desc,
        conv,
        y_desc,
        &ConvEpilogue::default(),
    )?;
    problem.check_algorithm(algo, gpu_of(handle))?;
    Ok(problem.workspace_bytes(algo, gpu_of(handle)))
}

/// The algorithms that accept this problem, best first by a heuristic (no launch, no
/// timing): the specialised ones where they apply, the tensor cores where the math allows
/// them, the fallback last. `OXIDNN_VERBOSE=1` prints every decline reason.
pub fn get_convolution_forward_algorithm(
    handle: &Handle,
    x_desc: &TensorDescriptor,
    w_desc: &FilterDescriptor,
    conv: &ConvolutionDescriptor,
    y_desc: &TensorDescriptor,
) -> Result<Vec<ConvFwdAlgoPerf>> {
    let problem = Problem::new(
        handle,
        x_desc,
        w_desc,
        conv,
        y_desc,
        &ConvEpilogue::default(),
    )?;
    let mut ranked: Vec<ConvFwdAlgoPerf> = problem
        .accepted(gpu_of(handle))
        .into_iter()
        .map(|algo| problem.perf(algo, f32::NAN, gpu_of(handle)))
        .collect();
    ranked.sort_by_key(|p| problem.preference(p.algo));
    Ok(ranked)
}

/// Times every algorithm that accepts this problem (one warm-up, then the median of 5
/// runs each, as cudnnFindConvolutionForwardAlgorithm does) on the caller's buffers and
/// returns them fastest first. Algorithms needing more workspace than `workspace` holds
/// are skipped (`None`: as much as any needs is allocated for the search). y holds an
/// unspecified result afterwards. The ranking is cached in the handle per problem: a second
/// call for the same problem returns it without timing.
#[allow(clippy::too_many_arguments)]
pub fn find_convolution_forward_algorithm(
    handle: &Handle,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    w_desc: &FilterDescriptor,
    w: &Buffer,
    conv: &ConvolutionDescriptor,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    workspace: Option<&mut Buffer>,
) -> Result<Vec<ConvFwdAlgoPerf>> {
    let gpu =
        gpu_of(handle).ok_or_else(|| Error::unsupported("timing algorithms needs a GPU handle"))?;
    let problem = Problem::new(
        handle,
        x_desc,
        w_desc,
        conv,
        y_desc,
        &ConvEpilogue::default(),
    )?;
    let key = problem.key(x_desc, w_desc, y_desc);
    if let Some(hit) = handle.cached_conv_find(&key) {
        return Ok(hit);
    }
    let candidates = problem.accepted(Some(gpu));
    let mut owned;
    let workspace: &mut Buffer = match workspace {
        Some(ws) => ws,
        None => {
            let most = candidates
                .iter()
                .map(|&a| problem.workspace_bytes(a, Some(gpu)))
                .max()
                .unwrap_or(0);
            owned = handle.alloc_bytes(most.max(1))?;
            &mut owned
        }
    };
    let mut ranked = Vec::new();
    for algo in candidates {
        let bytes = problem.workspace_bytes(algo, Some(gpu));
        if bytes > workspace.len_bytes() {
            continue;
        }
        let mut call = || {
            convolution_forward(
                handle,
                1.0,
                x_desc,
                x,
                w_desc,
                w,
                conv,
                algo,
                Some(&mut *workspace),
                0.0,
                y_desc,
                y,
            )
        };
        call()?;
        let mut times = Vec::with_capacity(5);
        for _ in 0..5 {
            times.push(gpu.time(&mut call)?);
        }
        times.sort_by(f32::total_cmp);
        ranked.push(problem.perf(algo, times[times.len() / 2], Some(gpu)));
    }
    ranked.sort_by(|a, b| a.time_ms.total_cmp(&b.time_ms));
    handle.cache_conv_find(key, ranked.clone());
    Ok(ranked)
}

fn gpu_of(handle: &Handle) -> Option<&Gpu> {
    match &handle.backend {
        Backend::Gpu(gpu) => Some(gpu),
        Backend::Cpu => None,
    }
}

/// Device addresses of a call's inputs (0 for absent ones).
pub(crate) struct Pointers {
    pub x: u64,
    pub w: u64,
    pub bias: u64,
    pub z: u64,
    pub workspace: u64,
    /// Bytes at `workspace` (0 without one).
    pub workspace_bytes: usize,
}

/// Everything an algorithm's launch needs: the validated problem, the blend, the
/// caller's buffers (for algorithms built on other ops) and their addresses.
pub(crate) struct Call<'a> {
    pub handle: &'a Handle,
    pub gpu: &'a Gpu,
    pub p: &'a Problem,
    pub alpha: f32,
    pub beta: f32,
    pub epilogue: &'a ConvEpilogue<'a>,
    pub x: &'a Buffer,
    pub w: &'a Buffer,
    pub ptrs: Pointers,
}

impl Call<'_> {
    /// The epilogue arithmetic for the kernels (bias: one per output channel).
    pub fn ops(&self) -> EpilogueOps {
        epilogue_ops(
            &self.epilogue.activation,
            self.epilogue.residual.map_or(0.0, |z| z.scale),
            self.alpha,
            self.beta,
            if self.epilogue.bias.is_some() {
                BiasMode::PerColumn
            } else {
                BiasMode::None
            },
            self.p.dtype,
        )
    }

    pub fn y_ptr(&self, y: &mut Buffer) -> Result<u64> {
        device_ptr_mut(self.gpu, y)
    }

    /// The pointer arguments of the convolution kernels, `(x, w, y, bias, z)`.
    pub fn kernel_pointers(&self, y: &mut Buffer) -> Result<[u64; 5]> {
        Ok([
            self.ptrs.x,
            self.ptrs.w,
            self.y_ptr(y)?,
            self.ptrs.bias,
            self.ptrs.z,
        ])
    }
}

/// A validated convolution: the geometry the kernels take (as 3 spatial dims), the dtype,
/// the math and the layouts.
#[derive(Clone, Debug)]
pub(crate) struct Problem {
    pub geo: ConvGeometry,
    /// Spatial dims of the caller's descriptors (1 to 3).
    pub spatial: usize,
    pub dtype: DataType,
    pub math: MathType,
    /// Elements each tensor spans, for the 32-bit offset limit of the GPU kernels.
    spans: [usize; 4],
}

/// Strides (or dims) of a rank `2 + spatial` descriptor as the kernels' 5 dims
/// `[n, c, d, h, w]`: missing leading spatial dims get extent 1 (stride 0).
fn five(values: &[usize], spatial: usize, fill: usize) -> [usize; 5] {
    let mut out = [fill; 5];
    out[0] = values[0];
    out[1] = values[1];
    out[5 - spatial..].copy_from_slice(&values[2..]);
    out
}

impl Problem {
    pub fn new(
        handle: &Handle,
        x_desc: &TensorDescriptor,
        w_desc: &FilterDescriptor,
        conv: &ConvolutionDescriptor,
        y_desc: &TensorDescriptor,
        ep: &ConvEpilogue,
    ) -> Result<Self> {
        let dims = convolution_forward_output_dims(conv, x_desc, w_desc)?;
        if y_desc.dims() != dims {
            return Err(Error::bad(
                "y_desc",
                format!(
                    "y has dims {:?}; this convolution produces {dims:?}",
                    y_desc.dims()
                ),
            ));
        }
        let dtype = x_desc.dtype();
        if w_desc.dtype() != dtype {
            return Err(Error::bad(
                "w_desc",
                format!(
                    "filter data type {} differs from x's {dtype}",
                    w_desc.dtype()
                ),
            ));
        }
        check_same_dtype("y_desc", x_desc, y_desc)?;
        check_output("y_desc", y_desc)?;
        let math_ok = match conv.math {
            MathType::Fma => true,
            MathType::Tf32 => dtype == DataType::F32,
            MathType::TensorOp => matches!(dtype, DataType::F16 | DataType::BF16),
        };
        if !math_ok {
            return Err(Error::unsupported(format!(
                "math {:?} does not take {dtype} data (Fma: any, Tf32: f32, TensorOp: f16/bf16)",
                conv.math
            )));
        }
        if dtype == DataType::F64 && handle.is_gpu() {
            return Err(Error::unsupported(
                "f64 convolution runs on the CPU handle only",
            ));
        }
        let k = dims[1];
        if let Some(b) = &ep.bias {
            let bd = b.desc.dims();
            let per_channel = bd.iter().product::<usize>() == k
                && (bd == [k] || (bd.len() >= 2 && bd[1] == k && bd[0] == 1));
            if !per_channel || b.desc.strides()[bd.iter().position(|&d| d == k).unwrap_or(0)] != 1 {
                return Err(Error::bad(
                    "bias",
                    format!(
                        "the bias has one contiguous value per output channel: dims [{k}] or [1, {k}, 1, ..], got {}",
                        b.desc.problem_string()
                    ),
                ));
            }
            check_same_dtype("bias", y_desc, b.desc)?;
        }
        if let Some(z) = &ep.residual {
            if z.desc.dims() != y_desc.dims() {
                return Err(Error::bad(
                    "residual",
                    format!("z has dims {:?}, y has {:?}", z.desc.dims(), y_desc.dims()),
                ));
            }
            check_same_dtype("residual", y_desc, z.desc)?;
            scale_factor("residual.scale", z.scale)?;
        }
        let s = conv.spatial;
        let u32s = |v: [usize; 5]| v.map(|e| e as u32);
        let xd = five(x_desc.dims(), s, 1);
        let wd = five(w_desc.dims(), s, 1);
        let yd = five(&dims, s, 1);
        let sp = |a: &[usize; CONV_MAX_SPATIAL], fill: usize| {
            let mut out = [fill as u32; 3];
            for j in 0..s {
                out[3 - s + j] = a[j] as u32;
            }
            out
        };
        let z_strides = ep
            .residual
            .map_or([0; 5], |z| u32s(five(z.desc.strides(), s, 0)));
        let geo = ConvGeometry {
            n: xd[0] as u32,
            c: xd[1] as u32,
            k: wd[0] as u32,
            groups: conv.groups as u32,
            c_per_group: wd[1] as u32,
            k_per_group: (wd[0] / conv.groups) as u32,
            flip: (conv.mode == ConvMode::Convolution) as u32,
            _pad: 0,
            input: [xd[2] as u32, xd[3] as u32, xd[4] as u32],
            output: [yd[2] as u32, yd[3] as u32, yd[4] as u32],
            filter: [wd[2] as u32, wd[3] as u32, wd[4] as u32],
            pad: sp(&conv.pad, 0),
            stride: sp(&conv.stride, 1),
            dilation: sp(&conv.dilation, 1),
            x: u32s(five(x_desc.strides(), s, 0)),
            w: u32s(five(w_desc.tensor().strides(), s, 0)),
            y: u32s(five(y_desc.strides(), s, 0)),
            z: z_strides,
        };
        Ok(Self {
            geo,
            spatial: s,
            dtype,
            math: conv.math,
            spans: [
                x_desc.span_elements(),
                w_desc.tensor().span_elements(),
                y_desc.span_elements(),
                ep.residual.map_or(0, |z| z.desc.span_elements()),
            ],
        })
    }

    /// Whether `algo` runs this problem (on `gpu`; `None`: the CPU handle, where the
    /// reference runs but acceptance is judged as on a non-Hopper GPU), and if not, why.
    pub fn check_algorithm(&self, algo: ConvFwdAlgo, gpu: Option<&Gpu>) -> Result<()> {
        if gpu.is_some() {
            if let Some(span) = self.spans.iter().find(|&&s| s > i32::MAX as usize) {
                return Err(Error::unsupported(format!(
                    "the GPU convolution kernels take tensors spanning fewer than 2^31 elements, got {span}"
                )));
            }
        }
        let why = match algo {
            ConvFwdAlgo::Direct => None,
            ConvFwdAlgo::Gemm1x1 => gemm_1x1::declines(self),
            ConvFwdAlgo::ImplicitGemmTensorOp => implicit_gemm_tensor_op::declines(self),
            ConvFwdAlgo::Winograd => winograd::declines(self),
            ConvFwdAlgo::ImplicitGemm => implicit_gemm::declines(self),
            ConvFwdAlgo::Depthwise => depthwise::declines(self),
        };
        match why {
            None => Ok(()),
            Some(reason) => Err(Error::unsupported(format!(
                "convolution algorithm {algo:?} declines {}: {reason}",
                self.problem_string()
            ))),
        }
    }

    /// The algorithms that accept this problem, in list order; with `OXIDNN_VERBOSE=1`,
    /// every decline reason on stderr.
    fn accepted(&self, gpu: Option<&Gpu>) -> Vec<ConvFwdAlgo> {
        let verbose = std::env::var("OXIDNN_VERBOSE").is_ok_and(|v| v == "1");
        ConvFwdAlgo::ALL
            .into_iter()
            .filter(|&a| match self.check_algorithm(a, gpu) {
                Ok(()) => true,
                Err(e) => {
                    if verbose {
                        eprintln!("oxidnn: {e}");
                    }
                    false
                }
            })
            .collect()
    }

    /// Heuristic rank of an accepted algorithm (lower first): the list order, except that
    /// the tensor-core implicit GEMM on its element-gathering kernels (x not
    /// channels-last, or channels not in 16-byte chunks) goes after Winograd, which runs
    /// such layouts 2-3x faster (f16 NCHW 3x3, H100), and `Gemm1x1` staging strided pixels
    /// through its workspace goes after the tensor-core implicit GEMM (which reads them in
    /// place: 0.9-1.1x its time on ResNet-50's strided 1x1 layers, H100).
    fn preference(&self, algo: ConvFwdAlgo) -> usize {
        let position = |a| {
            ConvFwdAlgo::ALL
                .iter()
                .position(|&x| x == a)
                .unwrap_or(usize::MAX)
        };
        if algo == ConvFwdAlgo::ImplicitGemmTensorOp && implicit_gemm_tensor_op::gathers(self) {
            position(ConvFwdAlgo::Winograd) * 2 + 1
        } else if algo == ConvFwdAlgo::Gemm1x1 && gemm_1x1::workspace_bytes(self) > 0 {
            position(ConvFwdAlgo::ImplicitGemmTensorOp) * 2 + 1
        } else {
            position(algo) * 2
        }
    }

    /// Bytes of workspace `algo` needs on `gpu` (`None`: the CPU handle, which reports
    /// what the GPU the kernels are tuned on would need).
    pub fn workspace_bytes(&self, algo: ConvFwdAlgo, gpu: Option<&Gpu>) -> usize {
        match algo {
            ConvFwdAlgo::Winograd => winograd::workspace_bytes(self),
            ConvFwdAlgo::Gemm1x1 => gemm_1x1::workspace_bytes(self),
            ConvFwdAlgo::ImplicitGemmTensorOp => implicit_gemm_tensor_op::workspace_bytes(self),
            ConvFwdAlgo::ImplicitGemm => {
                implicit_gemm::workspace_bytes(self, gpu.map(|g| g.sm_count))
            }
            _ => 0,
        }
    }

    fn perf(&self, algo: ConvFwdAlgo, time_ms: f32, gpu: Option<&Gpu>) -> ConvFwdAlgoPerf {
        ConvFwdAlgoPerf {
            algo,
            time_ms,
            workspace_bytes: self.workspace_bytes(algo, gpu),
            deterministic: algo.deterministic(),
            reduced_precision: algo.reduced_precision(),
        }
    }

    fn launch(&self, algo: ConvFwdAlgo, call: &Call, y: &mut Buffer) -> Result<()> {
        match algo {
            ConvFwdAlgo::Direct => direct::launch(call, y),
            ConvFwdAlgo::Gemm1x1 => gemm_1x1::launch(call, y),
            ConvFwdAlgo::ImplicitGemmTensorOp => implicit_gemm_tensor_op::launch(call, y),
            ConvFwdAlgo::Winograd => winograd::launch(call, y),
            ConvFwdAlgo::ImplicitGemm => implicit_gemm::launch(call, y),
            ConvFwdAlgo::Depthwise => depthwise::launch(call, y),
        }
    }

    /// A benchdnn-style description: `g1n2c16d1h7w7k32t1r3s3pd0ph1pw1sd1sh1sw1dd1dh1dw1`
    /// plus the dtype, math and mode.
    pub fn problem_string(&self) -> String {
        let g = &self.geo;
        format!(
            "g{}n{}c{}k{}i{}x{}x{}f{}x{}x{}p{}x{}x{}s{}x{}x{}d{}x{}x{}_{}_{:?}{}",
            g.groups,
            g.n,
            g.c,
            g.k,
            g.input[0],
            g.input[1],
            g.input[2],
            g.filter[0],
            g.filter[1],
            g.filter[2],
            g.pad[0],
            g.pad[1],
            g.pad[2],
            g.stride[0],
            g.stride[1],
            g.stride[2],
            g.dilation[0],
            g.dilation[1],
            g.dilation[2],
            self.dtype.name(),
            self.math,
            if g.flip != 0 { "_conv" } else { "" }
        )
    }

    /// The find cache's key: the problem and every descriptor's strides.
    fn key(
        &self,
        x_desc: &TensorDescriptor,
        w_desc: &FilterDescriptor,
        y_desc: &TensorDescriptor,
    ) -> String {
        format!(
            "{}|{:?}|{:?}|{:?}",
            self.problem_string(),
            x_desc.strides(),
            w_desc.tensor().strides(),
            y_desc.strides()
        )
    }
}
