//! Matrix multiply with a fused epilogue (the cuDNN graph API's matmul; cuBLASLt's matmul
//! with its bias/activation epilogues):
//!
//! `D = act(alpha * op(A) op(B) + beta * C + bias + residual_scale * Z)`
//!
//! `A` is `[M, K]` or `[batch, M, K]`, `B` `[K, N]` or `[batch, K, N]`, `C`/`D` (one buffer)
//! `[M, N]` or `[batch, M, N]`. Transposes are strides: a transposed `A` is the `[M, K]`
//! descriptor with strides `[1, M]`. A batch of 1 in `A` or `B` broadcasts over `C`'s batch.
//! The arithmetic is the caller's explicit choice, [`MatmulMath`].
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! let a_desc = TensorDescriptor::packed(DataType::F32, &[2, 3])?;
//! let b_desc = TensorDescriptor::packed(DataType::F32, &[3, 2])?;
//! let c_desc = TensorDescriptor::packed(DataType::F32, &[2, 2])?;
//! let bias_desc = TensorDescriptor::packed(DataType::F32, &[2])?;
//! let a = handle.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let b = handle.upload(&[1.0f32, 0.0, 0.0, 1.0, 1.0, -1.0])?;
//! let bias = handle.upload(&[0.5f32, -10.0])?;
//! let mut c = handle.alloc(&c_desc)?;
//! // A linear layer with a relu: relu(A B + bias), bias per output column.
//! let epilogue = MatmulEpilogue {
//!     activation: ActivationDescriptor::relu(),
//!     bias: Some(MatmulBias { mode: BiasMode::PerColumn, desc: &bias_desc, data: &bias }),
//!     residual: None,
//! };
//! let desc = MatmulDescriptor::new(MatmulMath::Fma);
//! matmul(&handle, &desc, 1.0, &a_desc, &a, &b_desc, &b, 0.0, &c_desc, &mut c, &epilogue)?;
//! assert_eq!(handle.read::<f32>(&c)?, [4.5, 0.0, 10.5, 0.0]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::activation::ActivationDescriptor;
use super::{host_read, host_write, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference;
pub use oxidnn_params::BiasMode;
use oxidnn_params::{
    fma_matmul_shared_bytes, fma_matmul_threads, mma_shared_bytes, mma_shared_bytes_staged,
    mma_threads, tma_shared_bytes, tma_threads, wgmma_shared_bytes, EpilogueOps, EpilogueParams,
    MatmulParams, OperandLayout, OutputLayout, OutputType, TmaOperands, MMA_BK_BYTES,
    MMA_SHORT_K_STAGES, TMA_BOX, WGMMA_THREADS,
};

mod tma;

/// The arithmetic of a matmul or convolution (cuDNN's math type), always the caller's
/// explicit choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MathType {
    /// f32 inputs, f32 FMA on CUDA cores: exact f32 arithmetic (f64 on the CPU handle).
    Fma,
    /// f32 inputs rounded to tf32 (10-bit mantissa) on tensor cores, f32 accumulation:
    /// about 1e-3 relative error, several times the speed. Opt-in.
    Tf32,
    /// f16 or bf16 inputs on tensor cores with f32 accumulation (products are exact).
    TensorOp,
}

/// The matmul's name for [`MathType`].
pub type MatmulMath = MathType;

impl MathType {
    /// The math a matmul (or convolution) on `dtype` inputs uses unless told otherwise: exact FMA for f32
    /// (and f64), tensor cores for f16/bf16. Never tf32.
    pub fn default_for(dtype: DataType) -> Self {
        match dtype {
            DataType::F16 | DataType::BF16 => Self::TensorOp,
            _ => Self::Fma,
        }
    }
}

/// A matmul algorithm: the output tile one thread block computes, and on which
/// instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulAlgo {
    /// 128 x 256 on Hopper's `wgmma`, warp-specialised, with TMA copies (compute
    /// capability 9.0 only; f16/bf16 `TensorOp`; operands K- or M/N-contiguous with
    /// 16-byte aligned address and strides; batch up to 65535): a producer warpgroup (one
    /// thread) issues the bulk tensor copies, two consumer warpgroups of 64 x 256 only
    /// multiply; 4 shared stages. The fastest tile on H100 for K >= 256 (f16 8192^3:
    /// 1.54 ms, 0.96x cuBLAS).
    WgmmaTma128x256,
    /// [`Self::WgmmaTma128x256`] with 128-column tiles (two warpgroups of 64 x 128), 6
    /// stages: for N of 128 or less, or more blocks.
    WgmmaTma128x128,
    /// [`Self::WgmmaTma128x256`] with 64-column tiles, 8 stages: for N of 64 or less.
    WgmmaTma128x64,
    /// 128 x 256 on Hopper's `wgmma` (compute capability 9.0 only; f16/bf16 `TensorOp`;
    /// operands K- or M/N-contiguous with 16-byte aligned strides): two warpgroups of
    /// 64 x 256, 4 shared stages.
    Wgmma128x256,
    /// 128 x 128 on `wgmma` (as [`Self::Wgmma128x256`]): two warpgroups of 64 x 128, 6
    /// stages.
    Wgmma128x128,
    /// 128 x 256 (tensor cores, 16-bit inputs: 8 warps of 64 x 64, 3 stages; FMA: 8 x 16
    /// per thread). No tf32 kernel.
    Tile128x256,
    /// 128 x 128, 8 warps (tensor cores: 64 x 32 each, 4 stages; FMA: 8 x 8 per thread).
    Tile128x128,
    /// 64 x 64, for small or skinny problems (tensor cores: 4 warps; FMA: 4 x 4 per thread).
    Tile64x64,
    /// [`Self::Tile64x64`]'s tensor-core kernels with 2 shared stages instead of 4 and at
    /// most 128 registers, for K of at most one stage (64 16-bit or 32 tf32 elements; any
    /// K runs): 4 blocks per SM instead of 3 overlap one another's loads and stores. No
    /// FMA kernel.
    Tile64x64ShortK,
}

impl MatmulAlgo {
    /// Every algorithm: the Hopper ones, then the others, each group largest tile first.
    pub const ALL: [MatmulAlgo; 9] = [
        Self::WgmmaTma128x256,
        Self::WgmmaTma128x128,
        Self::WgmmaTma128x64,
        Self::Wgmma128x256,
        Self::Wgmma128x128,
        Self::Tile128x256,
        Self::Tile128x128,
        Self::Tile64x64,
        Self::Tile64x64ShortK,
    ];

    /// The output tile, rows x columns.
    pub fn tile(self) -> (usize, usize) {
        match self {
            Self::WgmmaTma128x256 | Self::Wgmma128x256 | Self::Tile128x256 => (128, 256),
            Self::WgmmaTma128x128 | Self::Wgmma128x128 | Self::Tile128x128 => (128, 128),
            Self::WgmmaTma128x64 => (128, 64),
            Self::Tile64x64 | Self::Tile64x64ShortK => (64, 64),
        }
    }

    /// Whether this is a short-K variant (2 shared stages, tensor cores only).
    pub fn short_k(self) -> bool {
        self == Self::Tile64x64ShortK
    }

    /// Whether this algorithm has kernels for `math` (whether it runs a given problem on a
    /// given device also depends on [`Self::needs_sm90a`] and, for those, the layouts).
    pub fn supports(self, math: MatmulMath) -> bool {
        match self {
            _ if self.needs_sm90a() => math == MatmulMath::TensorOp,
            Self::Tile128x256 => math != MatmulMath::Tf32,
            Self::Tile64x64ShortK => math != MatmulMath::Fma,
            _ => true,
        }
    }

    /// Whether this algorithm runs Hopper-only (`sm_90a`) kernels: a GPU of compute
    /// capability 9.0, operands that are K- or M/N-contiguous with 16-byte aligned
    /// strides (others return [`Error::NotSupported`] saying why).
    pub fn needs_sm90a(self) -> bool {
        self.tma() || matches!(self, Self::Wgmma128x256 | Self::Wgmma128x128)
    }

    /// Whether this algorithm's kernels copy operands with TMA (besides [`Self::needs_sm90a`],
    /// 16-byte aligned operand addresses and a batch of at most 65535).
    pub fn tma(self) -> bool {
        matches!(
            self,
            Self::WgmmaTma128x256 | Self::WgmmaTma128x128 | Self::WgmmaTma128x64
        )
    }
}

/// How to multiply: the math, and optionally a forced algorithm (else [`get_matmul_algorithm`]
/// picks one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulDescriptor {
    math: MatmulMath,
    algo: Option<MatmulAlgo>,
}

impl MatmulDescriptor {
    pub fn new(math: MatmulMath) -> Self {
        Self { math, algo: None }
    }
    /// The descriptor with [`MatmulMath::default_for`] `dtype`.
    pub fn for_dtype(dtype: DataType) -> Self {
        Self::new(MatmulMath::default_for(dtype))
    }
    /// Forces `algo` (an error at the call if it does not support the math).
    pub fn with_algorithm(self, algo: MatmulAlgo) -> Self {
        Self {
            algo: Some(algo),
            ..self
        }
    }
    pub fn math(&self) -> MatmulMath {
        self.math
    }
    pub fn algorithm(&self) -> Option<MatmulAlgo> {
        self.algo
    }
}

/// A bias vector added before the activation: length M ([`BiasMode::PerRow`]) or N
/// ([`BiasMode::PerColumn`], a linear layer's bias), packed, of `C`'s dtype.
#[derive(Clone, Copy, Debug)]
pub struct MatmulBias<'a> {
    pub mode: BiasMode,
    pub desc: &'a TensorDescriptor,
    pub data: &'a Buffer,
}

/// A residual `Z` of the output's dims and dtype (any strides), added as `scale * Z` before
/// the activation (cudnnConvolutionBiasActivationForward's `alpha2 * z`).
#[derive(Clone, Copy, Debug)]
pub struct Residual<'a> {
    pub scale: f64,
    pub desc: &'a TensorDescriptor,
    pub data: &'a Buffer,
}

/// The matmul's name for [`Residual`].
pub type MatmulResidual<'a> = Residual<'a>;

/// What the matmul does to each result before storing it; `Default` is nothing (identity
/// activation, no bias, no residual).
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulEpilogue<'a> {
    pub activation: ActivationDescriptor,
    pub bias: Option<MatmulBias<'a>>,
    pub residual: Option<Residual<'a>>,
}

/// One timed candidate of [`find_matmul_algorithm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulAlgoPerf {
    pub algo: MatmulAlgo,
    /// Median time of the timed runs, milliseconds.
    pub time_ms: f32,
}

/// `D = act(alpha * op(A) op(B) + beta * C + bias + scale * Z)` (see the module docs); `C`
/// is `c` before the call and is not read when `beta == 0`.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    handle: &Handle,
    desc: &MatmulDescriptor,
    alpha: f64,
    a_desc: &TensorDescriptor,
    a: &Buffer,
    b_desc: &TensorDescriptor,
    b: &Buffer,
    beta: f64,
    c_desc: &TensorDescriptor,
    c: &mut Buffer,
    epilogue: &MatmulEpilogue,
) -> Result<()> {
    let problem = Problem::new(handle, desc, a_desc, b_desc, c_desc, epilogue)?;
    handle.check_tensor("a", a_desc, a)?;
    check_buffers(handle, (b_desc, b), (c_desc, c), epilogue)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let (at, bt) = (host_read(a_desc, a)?, host_read(b_desc, b)?);
            let mut ct = host_read(c_desc, c)?;
            let bias = match &epilogue.bias {
                Some(v) => Some((v.mode, host_read(v.desc, v.data)?)),
                None => None,
            };
            let residual = match &epilogue.residual {
                Some(v) => Some((v.scale, host_read(v.desc, v.data)?)),
                None => None,
            };
            reference::matmul::matmul(
                alpha,
                &at,
                &bt,
                beta,
                &mut ct,
                bias.as_ref().map(|(m, t)| (*m, t)),
                residual.as_ref().map(|(s, t)| (*s, t)),
                &epilogue.activation,
            );
            host_write(&ct, c)
        }
        Backend::Gpu(gpu) => {
            let a = device_ptr(gpu, a)?;
            run_on_gpu(gpu, &problem, desc, (alpha32, beta32), a, b, c, epilogue)
        }
    }
}

/// [`matmul`] with `A` at a device address rather than in a [`Buffer`]: for ops that
/// stage an operand in their workspace (a strided 1x1 convolution packs its sampled
/// pixels). GPU handles only.
///
/// # Safety
/// `a` is a device address in the handle's context holding every element `a_desc`
/// reaches, none of them in `c`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_staged_a(
    handle: &Handle,
    desc: &MatmulDescriptor,
    alpha: f64,
    a_desc: &TensorDescriptor,
    a: u64,
    b_desc: &TensorDescriptor,
    b: &Buffer,
    beta: f64,
    c_desc: &TensorDescriptor,
    c: &mut Buffer,
    epilogue: &MatmulEpilogue,
) -> Result<()> {
    let Backend::Gpu(gpu) = &handle.backend else {
        return Err(Error::unsupported(
            "a staged matmul operand lives in device memory: GPU handles only",
        ));
    };
    let problem = Problem::new(handle, desc, a_desc, b_desc, c_desc, epilogue)?;
    check_buffers(handle, (b_desc, b), (c_desc, c), epilogue)?;
    let scales = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    run_on_gpu(gpu, &problem, desc, scales, a, b, c, epilogue)
}

/// Checks that B, C and the epilogue's inputs hold their descriptors' spans on `handle`.
fn check_buffers(
    handle: &Handle,
    (b_desc, b): (&TensorDescriptor, &Buffer),
    (c_desc, c): (&TensorDescriptor, &Buffer),
    epilogue: &MatmulEpilogue,
) -> Result<()> {
    handle.check_tensor("b", b_desc, b)?;
    handle.check_tensor("c", c_desc, c)?;
    if let Some(bias) = &epilogue.bias {
        handle.check_tensor("bias", bias.desc, bias.data)?;
    }
    if let Some(z) = &epilogue.residual {
        handle.check_tensor("residual", z.desc, z.data)?;
    }
    Ok(())
}

/// Picks the algorithm (forced or heuristic) and launches a validated problem whose
/// buffers were checked, `A` at device address `a`.
#[allow(clippy::too_many_arguments)]
fn run_on_gpu(
    gpu: &Gpu,
    problem: &Problem,
    desc: &MatmulDescriptor,
    (alpha, beta): (f32, f32),
    a: u64,
    b: &Buffer,
    c: &mut Buffer,
    epilogue: &MatmulEpilogue,
) -> Result<()> {
    let algo = match desc.algo {
        Some(algo) => algo,
        None => problem.heuristic(gpu.sm_count, gpu.is_sm90a()),
    };
    let ptrs = Pointers {
        a,
        b: device_ptr(gpu, b)?,
        c: device_ptr_mut(gpu, c)?,
        bias: match &epilogue.bias {
            Some(v) => device_ptr(gpu, v.data)?,
            None => 0,
        },
        residual: match &epilogue.residual {
            Some(v) => device_ptr(gpu, v.data)?,
            None => 0,
        },
    };
    problem.launch(gpu, algo, alpha, beta, epilogue, &ptrs)
}

/// The algorithm [`matmul`] picks for these descriptors when none is forced: on a compute
/// capability 9.0 GPU, a `wgmma` tile when the layouts allow one and K is not short;
/// else the largest tile that still keeps most SMs busy (with several blocks each when K
/// is short), else the smallest (no launch, no timing).
pub fn get_matmul_algorithm(
    handle: &Handle,
    desc: &MatmulDescriptor,
    a_desc: &TensorDescriptor,
    b_desc: &TensorDescriptor,
    c_desc: &TensorDescriptor,
) -> Result<MatmulAlgo> {
    let problem = Problem::new(
        handle,
        desc,
        a_desc,
        b_desc,
        c_desc,
        &MatmulEpilogue::default(),
    )?;
    let (sms, sm90a) = match &handle.backend {
        Backend::Gpu(gpu) => (gpu.sm_count, gpu.is_sm90a()),
        Backend::Cpu => (132, false),
    };
    Ok(problem.heuristic(sms, sm90a))
}

/// Times every algorithm that can run this problem on this device (as cudnnFind does: one
/// warm-up, then the median of `runs` timed calls each) and returns them fastest first.
/// `c` holds an unspecified result afterwards (each trial writes it).
#[allow(clippy::too_many_arguments)]
pub fn find_matmul_algorithm(
    handle: &Handle,
    desc: &MatmulDescriptor,
    alpha: f64,
    a_desc: &TensorDescriptor,
    a: &Buffer,
    b_desc: &TensorDescriptor,
    b: &Buffer,
    beta: f64,
    c_desc: &TensorDescriptor,
    c: &mut Buffer,
    epilogue: &MatmulEpilogue,
    runs: usize,
) -> Result<Vec<MatmulAlgoPerf>> {
    let gpu = match &handle.backend {
        Backend::Gpu(gpu) => gpu,
        Backend::Cpu => return Err(Error::unsupported("timing algorithms needs a GPU handle")),
    };
    let problem = Problem::new(handle, desc, a_desc, b_desc, c_desc, epilogue)?;
    let mut ranked = Vec::new();
    for algo in MatmulAlgo::ALL
        .into_iter()
        .filter(|&a| problem.check_algorithm(a, gpu.is_sm90a()).is_ok())
    {
        let forced = desc.with_algorithm(algo);
        let mut call = || {
            matmul(
                handle, &forced, alpha, a_desc, a, b_desc, b, beta, c_desc, c, epilogue,
            )
        };
        call()?;
        let mut times = Vec::with_capacity(runs.max(1));
        for _ in 0..runs.max(1) {
            times.push(gpu.time(&mut call)?);
        }
        times.sort_by(f32::total_cmp);
        ranked.push(MatmulAlgoPerf {
            algo,
            time_ms: times[times.len() / 2],
        });
    }
    ranked.sort_by(|x, y| x.time_ms.total_cmp(&y.time_ms));
    Ok(ranked)
}

/// A plain batched product `C = A B` (no blend, no epilogue) over device memory that
/// the crate owns, such as an algorithm's workspace: the operands in the kernels' own
/// layouts ([`OperandLayout`]: `A` as `M x K`, `B` as `N x K`), the algorithm by the
/// heuristic. For algorithms of other ops built on the matmul core (convolution's
/// Winograd), which have no descriptors or [`Buffer`]s for their intermediates.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceMatmul {
    pub math: MatmulMath,
    /// Type of `A` and `B` (f32 for `Fma`/`Tf32`, f16/bf16 for `TensorOp`).
    pub input: DataType,
    /// Type of `C`: the input's, or f32 from 16-bit inputs.
    pub output: DataType,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: OperandLayout,
    pub b: OperandLayout,
    pub c: OutputLayout,
    /// The tile, or `None` for [`get_matmul_algorithm`]'s heuristic.
    pub algo: Option<MatmulAlgo>,
}

impl DeviceMatmul {
    /// Launches the product on `gpu`'s stream.
    ///
    /// # Safety
    /// `a`, `b` and `c` are device addresses in `gpu`'s context, each holding every element
    /// its layout reaches over `batch x M x N x K` (extent-1 dims at stride 0); `C`'s
    /// elements are distinct and overlap neither operand.
    pub(crate) unsafe fn launch(&self, gpu: &Gpu, a: u64, b: u64, c: u64) -> Result<()> {
        let limit = i32::MAX as usize;
        if [self.m, self.n, self.k, self.batch]
            .iter()
            .any(|&v| v > limit)
        {
            return Err(Error::unsupported(format!(
                "matmul sizes up to 2^31-1, got M={} N={} K={} batch={}",
                self.m, self.n, self.k, self.batch
            )));
        }
        let problem = Problem {
            math: self.math,
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            a: self.a,
            b: self.b,
            c: self.c,
            residual: OutputLayout::default(),
            input: self.input,
            output: self.output,
        };
        let algo = self
            .algo
            .unwrap_or_else(|| problem.heuristic(gpu.sm_count, gpu.is_sm90a()));
        let ptrs = Pointers {
            a,
            b,
            c,
            bias: 0,
            residual: 0,
        };
        problem.launch(gpu, algo, 1.0, 0.0, &MatmulEpilogue::default(), &ptrs)
    }
}

/// Device addresses of a call's buffers (0 for absent epilogue inputs).
struct Pointers {
    a: u64,
    b: u64,
    c: u64,
    bias: u64,
    residual: u64,
}

/// A validated matmul: sizes, strides (extent-1 dims at stride 0) and types.
#[derive(Clone, Debug)]
struct Problem {
    math: MatmulMath,
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// `A` as `M x K`, `B` as `N x K` (see [`OperandLayout`]).
    a: OperandLayout,
    b: OperandLayout,
    c: OutputLayout,
    residual: OutputLayout,
    input: DataType,
    output: DataType,
}

/// `(batch, rows, cols)` of a rank-2 or rank-3 matrix descriptor and its strides (batch,
/// row, col), a dim of extent 1 at stride 0.
fn matrix(arg: &'static str, d: &TensorDescriptor) -> Result<([usize; 3], [u64; 3])> {
    let (dims, strides): (Vec<usize>, Vec<usize>) = match d.rank() {
        2 => (
            [&[1], d.dims()].concat(),
            [&[0], d.strides()].concat(),
        ),
        3 => (d.dims().to_vec(), d.strides().to_vec()),
        r => {
            return Err(Error::bad(
                arg,
                format!("a matmul operand has rank 2 ([rows, cols]) or 3 ([batch, rows, cols]), got rank {r}"),
            ))
        }
    };
    let stride = |i: usize| if dims[i] == 1 { 0 } else { strides[i] as u64 };
    Ok((
        [dims[0], dims[1], dims[2]],
        [stride(0), stride(1), stride(2)],
    ))
}

impl Problem {
    fn new(
        handle: &Handle,
        desc: &MatmulDescriptor,
        a_desc: &TensorDescriptor,
        b_desc: &TensorDescriptor,
        c_desc: &TensorDescriptor,
        ep: &MatmulEpilogue,
    ) -> Result<Self> {
        let ([ab, m, k], sa) = matrix("a_desc", a_desc)?;
        let ([bb, kb, n], sb) = matrix("b_desc", b_desc)?;
        let ([batch, mc, nc], sc) = matrix("c_desc", c_desc)?;
        if kb != k {
            return Err(Error::bad(
                "b_desc",
                format!("op(B) has {kb} rows but op(A) has K = {k} columns"),
            ));
        }
        if (mc, nc) != (m, n) {
            return Err(Error::bad(
                "c_desc",
                format!("C is {mc} x {nc}, op(A) op(B) is {m} x {n}"),
            ));
        }
        for (arg, b) in [("a_desc", ab), ("b_desc", bb)] {
            if b != 1 && b != batch {
                return Err(Error::bad(
                    arg,
                    format!("batch {b} is neither 1 (broadcast) nor C's batch {batch}"),
                ));
            }
        }
        check_same_dtype("b_desc", a_desc, b_desc)?;
        check_output("c_desc", c_desc)?;
        let (input, output) = (a_desc.dtype(), c_desc.dtype());
        let math_ok = match desc.math {
            MatmulMath::Fma => matches!(input, DataType::F32 | DataType::F64),
            MatmulMath::Tf32 => input == DataType::F32,
            MatmulMath::TensorOp => matches!(input, DataType::F16 | DataType::BF16),
        };
        if !math_ok {
            return Err(Error::unsupported(format!(
                "math {:?} does not take {input} inputs (Fma: f32/f64, Tf32: f32, TensorOp: f16/bf16)",
                desc.math
            )));
        }
        let output_ok = output == input || (output == DataType::F32 && input.size_bytes() == 2);
        if !output_ok {
            return Err(Error::unsupported(format!(
                "a matmul of {input} inputs writes {input} or (from 16-bit inputs) f32, not {output}"
            )));
        }
        if input == DataType::F64 && handle.is_gpu() {
            return Err(Error::unsupported("f64 matmul runs on the CPU handle only"));
        }
        if let Some(bias) = &ep.bias {
            let len = match bias.mode {
                BiasMode::PerRow => m,
                BiasMode::PerColumn => n,
                BiasMode::None => {
                    return Err(Error::bad(
                        "bias",
                        "a bias is given with BiasMode::None; pass PerRow or PerColumn",
                    ))
                }
            };
            if bias.desc.dims() != [len] || bias.desc.strides() != [1] {
                return Err(Error::bad(
                    "bias",
                    format!(
                        "a {:?} bias is a packed vector of {len}, got {}",
                        bias.mode,
                        bias.desc.problem_string()
                    ),
                ));
            }
            check_same_dtype("bias", c_desc, bias.desc)?;
        }
        let mut residual = OutputLayout::default();
        if let Some(z) = &ep.residual {
            if z.desc.dims() != c_desc.dims() {
                return Err(Error::bad(
                    "residual",
                    format!("Z has dims {:?}, C has {:?}", z.desc.dims(), c_desc.dims()),
                ));
            }
            check_same_dtype("residual", c_desc, z.desc)?;
            scale_factor("residual.scale", z.scale)?;
            let (_, sz) = matrix("residual", z.desc)?;
            residual = OutputLayout {
                batch: sz[0],
                row: sz[1],
                col: sz[2],
            };
        }
        let limit = i32::MAX as usize;
        if [m, n, k, batch].iter().any(|&v| v > limit) {
            return Err(Error::unsupported(format!(
                "matmul sizes up to 2^31-1, got M={m} N={n} K={k} batch={batch}"
            )));
        }
        Ok(Self {
            math: desc.math,
            m,
            n,
            k,
            batch,
            a: OperandLayout {
                batch: sa[0],
                mn: sa[1],
                k: sa[2],
            },
            b: OperandLayout {
                batch: sb[0],
                mn: sb[2],
                k: sb[1],
            },
            c: OutputLayout {
                batch: sc[0],
                row: sc[1],
                col: sc[2],
            },
            residual,
            input,
            output,
        })
    }

    fn tiles(&self, algo: MatmulAlgo) -> usize {
        let (bm, bn) = algo.tile();
        self.m.div_ceil(bm) * self.n.div_ceil(bn) * self.batch
    }

    /// The largest supported tile whose blocks keep at least 3/4 of the SMs busy (a
    /// larger tile's better reuse outweighs a few idle SMs: 2048^3 runs 7-9% faster on
    /// 128x256's 128 blocks than on 128x128's 256, H100), or at least 8 blocks per SM when
    /// K < 256 (short K makes the epilogue's stores the main cost, and small tiles spread
    /// them wider: 4096x4096x{16,128} run 1.1-1.6x faster on 64x64's 4096 blocks than on
    /// 128x128's 1024, H100; not for exact f32, whose pipelined big tiles ran
    /// 4096x4096x{16,128} 1.2x / 1.5x faster than 64 x 64); else the smallest. Exact f32
    /// takes 128 x 256 only when K >= 128: there it ran 7-9% faster than 128 x 128 on
    /// every square >= 2048 and on 4096x4096x{128,1024} (H100, `find`, after the
    /// fragment loads were spread over the FMAs); at K = 16 128 x 128 was faster (two
    /// blocks per SM overlap each other's pipeline fill and epilogue).
    ///
    /// On sm_90a the TMA `wgmma` tiles come first when K spans more than one 64-wide K
    /// tile: the widest whose blocks keep 3/4 of the SMs busy, among those not mostly past
    /// N (64 columns, or more than half the tile inside N); when none does and K >= 512,
    /// the narrowest (RNN gates, 4096 x 16..128 x 1024: 128 x 64 on 32 blocks runs 1.3x
    /// faster than the sm_80 64 x 64 tile on 64, H100). Then the other `wgmma` tiles by
    /// the general rule when K >= 256 (below, the epilogue dominates and the small sm_80
    /// tiles spread it wider).
    ///
    /// On tensor cores, K of at most two shared stages takes [`MatmulAlgo::Tile64x64ShortK`]
    /// (and longer K never a short-K tile): a block then has little of its own to
    /// overlap, so more blocks per SM (4 of 64 x 64 at 2 stages and 128 registers, against
    /// 3 at 4 stages and 168) pay more than pipeline depth (H100, 4096x4096 f16: K = 16
    /// 51 -> 36 us, K = 128 59 -> 44 us).
    fn heuristic(&self, sm_count: u32, sm90a: bool) -> MatmulAlgo {
        let sms = sm_count as usize;
        let busy = (3 * sms).div_ceil(4);
        let tma: Vec<MatmulAlgo> = MatmulAlgo::ALL
            .into_iter()
            .filter(|&a| a.tma() && self.k > TMA_BOX as usize)
            .filter(|&a| self.check_algorithm(a, sm90a).is_ok())
            .filter(|a| a.tile().1 == TMA_BOX as usize || self.n > a.tile().1 / 2)
            .collect();
        if let Some(&algo) = tma.iter().find(|&&a| self.tiles(a) >= busy) {
            return algo;
        }
        if self.k >= 512 {
            if let Some(&algo) = tma.last() {
                return algo;
            }
        }
        let wanted = if self.k < 256 && self.math != MatmulMath::Fma {
            8 * sms
        } else {
            busy
        };
        let short = self.math != MatmulMath::Fma
            && self.k * self.input.size_bytes() <= 2 * MMA_BK_BYTES as usize;
        if short {
            return MatmulAlgo::Tile64x64ShortK;
        }
        MatmulAlgo::ALL
            .into_iter()
            .filter(|&a| self.check_algorithm(a, sm90a).is_ok())
            .filter(|a| !a.tma() && (!a.needs_sm90a() || self.k >= 256))
            .filter(|a| !a.short_k())
            .filter(|&a| {
                self.math != MatmulMath::Fma || self.k >= 128 || a != MatmulAlgo::Tile128x256
            })
            .find(|&a| self.tiles(a) >= wanted)
            .unwrap_or(MatmulAlgo::Tile64x64)
    }

    /// Whether `algo` runs this problem on a device with (`sm90a`) or without the Hopper
    /// kernels; if not, why.
    fn check_algorithm(&self, algo: MatmulAlgo, sm90a: bool) -> Result<()> {
        if !algo.supports(self.math) {
            return Err(Error::unsupported(format!(
                "algorithm {algo:?} does not support math {:?}",
                self.math
            )));
        }
        if algo.needs_sm90a() {
            if !sm90a {
                return Err(Error::unsupported(format!(
                    "algorithm {algo:?} runs sm_90a wgmma kernels: it needs a GPU of compute capability 9.0"
                )));
            }
            if self.copy_mode(&self.a, self.m).is_none()
                || self.copy_mode(&self.b, self.n).is_none()
            {
                return Err(Error::unsupported(format!(
                    "algorithm {algo:?} needs each operand K- or M/N-contiguous with 16-byte aligned strides and batch stride; the sm_80 algorithms take any layout"
                )));
            }
        }
        if algo.tma() {
            if self.batch > 65535 {
                return Err(Error::unsupported(format!(
                    "algorithm {algo:?} runs one grid row per batch: at most 65535 batches, got {}",
                    self.batch
                )));
            }
            if self.k == 0 {
                return Err(Error::unsupported(format!(
                    "algorithm {algo:?} needs K >= 1 (a TMA tensor has no empty dims)"
                )));
            }
        }
        Ok(())
    }

    /// The same product transposed: `D^T = op(B)^T op(A)^T`, so that a column-major `C`
    /// becomes row-major (the epilogue's paired stores want unit column stride).
    fn transposed(&self) -> Self {
        let swap = |l: OutputLayout| OutputLayout {
            batch: l.batch,
            row: l.col,
            col: l.row,
        };
        Self {
            m: self.n,
            n: self.m,
            a: self.b,
            b: self.a,
            c: swap(self.c),
            residual: swap(self.residual),
            ..self.clone()
        }
    }

    /// How the tensor-core kernels copy an operand of `extent` rows: `k` (K contiguous),
    /// `n` (MN contiguous), or `None` (neither with 16-byte aligned other strides).
    fn copy_mode(&self, l: &OperandLayout, extent: usize) -> Option<char> {
        let per_chunk = (16 / self.input.size_bytes()) as u64;
        let aligned = |s: u64| s.is_multiple_of(per_chunk);
        let k_contiguous = self.k == 1 || l.k == 1;
        let mn_contiguous = extent == 1 || l.mn == 1;
        if k_contiguous && aligned(l.mn) && aligned(l.batch) {
            Some('k')
        } else if mn_contiguous && aligned(l.k) && aligned(l.batch) {
            Some('n')
        } else {
            None
        }
    }

    /// Whether the exact-f32 kernels copy this operand (at `ptr`) in 16-byte chunks of
    /// MN-contiguous elements (mode `n`: MN stride 1 or a single row, K and batch strides
    /// and the address 16-byte aligned) rather than word by word (mode `s`).
    fn fma_chunk_copies(&self, l: &OperandLayout, extent: usize, ptr: u64) -> bool {
        let aligned = |s: u64| s.is_multiple_of(4);
        (extent == 1 || l.mn == 1) && aligned(l.k) && aligned(l.batch) && ptr.is_multiple_of(16)
    }

    /// The kernel of `algo` for this problem, whose operands A and B lie at `ptrs`.
    fn kernel(&self, algo: MatmulAlgo, ptrs: (u64, u64)) -> Result<&'static str> {
        let (bm, bn) = algo.tile();
        let name = match self.math {
            _ if algo.needs_sm90a() => {
                let (la, lb) = (
                    self.copy_mode(&self.a, self.m),
                    self.copy_mode(&self.b, self.n),
                );
                let modes: String = la.into_iter().chain(lb).collect();
                let dtype = self.input.name();
                if algo.tma() {
                    format!("wgmma_matmul_tma_{bm}x{bn}_{modes}_{dtype}")
                } else {
                    format!("wgmma_matmul_{bm}x{bn}_{modes}_{dtype}")
                }
            }
            MatmulMath::Fma => {
                let mode = |l: &OperandLayout, extent: usize, ptr: u64| {
                    if bm >= 128 && self.fma_chunk_copies(l, extent, ptr) {
                        'n'
                    } else {
                        's'
                    }
                };
                let (la, lb) = (mode(&self.a, self.m, ptrs.0), mode(&self.b, self.n, ptrs.1));
                format!("matmul_fma_{bm}x{bn}_{la}{lb}_f32")
            }
            MatmulMath::Tf32 | MatmulMath::TensorOp => {
                let dtype = match self.math {
                    MatmulMath::Tf32 => "tf32",
                    _ => self.input.name(),
                };
                let modes = match (
                    self.copy_mode(&self.a, self.m),
                    self.copy_mode(&self.b, self.n),
                ) {
                    (Some(la), Some(lb)) => format!("{la}{lb}"),
                    _ => "gg".to_string(),
                };
                let depth = if algo.short_k() { "s" } else { "" };
                format!("matmul_mma_{bm}x{bn}{depth}_{modes}_{dtype}")
            }
        };
        kernels::lookup(&name).ok_or_else(|| {
            Error::unsupported(format!(
                "algorithm {algo:?} has no kernel for math {:?} on {} inputs ({name})",
                self.math, self.input
            ))
        })
    }

    fn launch(
        &self,
        gpu: &Gpu,
        algo: MatmulAlgo,
        alpha: f32,
        beta: f32,
        ep: &MatmulEpilogue,
        ptrs: &Pointers,
    ) -> Result<()> {
        self.check_algorithm(algo, gpu.is_sm90a())?;
        let mut bias_mode = ep.bias.map_or(BiasMode::None, |b| b.mode);
        let mut p = self.clone();
        let (mut a, mut b) = (ptrs.a, ptrs.b);
        if p.c.col != 1 && p.c.row == 1 {
            p = p.transposed();
            (a, b) = (b, a);
            bias_mode = match bias_mode {
                BiasMode::PerRow => BiasMode::PerColumn,
                BiasMode::PerColumn => BiasMode::PerRow,
                BiasMode::None => BiasMode::None,
            };
        }
        let kernel = p.kernel(algo, (a, b))?;
        let (bm, bn) = algo.tile();
        let (tiles_m, tiles_n) = (p.m.div_ceil(bm), p.n.div_ceil(bn));
        if tiles_m * tiles_n > i32::MAX as usize {
            return Err(Error::unsupported(format!(
                "{tiles_m} x {tiles_n} output tiles exceed the grid"
            )));
        }
        let params = MatmulParams {
            a: p.a,
            b: p.b,
            epilogue: EpilogueParams {
                out: p.c,
                residual: p.residual,
                ops: epilogue_ops(
                    &ep.activation,
                    ep.residual.map_or(0.0, |z| z.scale),
                    alpha,
                    beta,
                    bias_mode,
                    p.output,
                ),
            },
            m: p.m as u32,
            n: p.n as u32,
            k: p.k as u32,
            tiles_m: tiles_m as u32,
            tiles_n: tiles_n as u32,
            batch: p.batch as u32,
        };
        let cfg = LaunchConfig {
            grid: (tiles_m * tiles_n) as u32,
            grid_y: p.batch.min(65535) as u32,
            block: p.threads(algo),
            shared_bytes: p.shared_bytes(algo),
        };
        let pointers = [a, b, ptrs.c, ptrs.bias, ptrs.residual];
        if algo.tma() {
            let maps = p.tensor_maps(algo, a, b)?;
            // SAFETY: as below; the tensor maps describe the same operands (address,
            // sizes and strides of `p`), and TMA reads only inside them (it fills the
            // rest of a box with zeros).
            return unsafe { gpu.launch_with_last(kernel, cfg, &params, &pointers, &maps) };
        }
        // SAFETY: every buffer was checked to hold its descriptor's span, and the layouts
        // passed are those descriptors' strides (dims of extent 1 at stride 0), so every
        // element the kernel reads or writes, within M x N x K x batch, lies in its buffer
        // (for `DeviceMatmul::launch`, its caller's contract says the same of its memory);
        // the bias and residual pointers are read only when their mode / scale say so,
        // which is exactly when they were given and checked.
        unsafe { gpu.launch(kernel, cfg, &params, &pointers) }
    }

    /// The operands' tensor maps for a TMA algorithm, `a` and `b` their device addresses.
    fn tensor_maps(&self, algo: MatmulAlgo, a: u64, b: u64) -> Result<TmaOperands> {
        if !a.is_multiple_of(tma::TMA_ALIGN) || !b.is_multiple_of(tma::TMA_ALIGN) {
            return Err(Error::unsupported(format!(
                "algorithm {algo:?} copies with TMA, which needs 16-byte aligned operand addresses (A at {a:#x}, B at {b:#x})"
            )));
        }
        let map = |l: &OperandLayout, rows: usize, ptr: u64| {
            let k_major = self.copy_mode(l, rows) == Some('k');
            tma::operand_map(self.input, l, (rows, self.k, self.batch), ptr, k_major)
        };
        Ok(TmaOperands {
            a: map(&self.a, self.m, a)?,
            b: map(&self.b, self.n, b)?,
        })
    }

    fn threads(&self, algo: MatmulAlgo) -> u32 {
        let (bm, bn) = algo.tile();
        match self.math {
            _ if algo.tma() => tma_threads(1),
            _ if algo.needs_sm90a() => WGMMA_THREADS,
            MatmulMath::Fma => fma_matmul_threads(bm as u32, bn as u32),
            _ => mma_threads(bm as u32, bn as u32),
        }
    }

    fn shared_bytes(&self, algo: MatmulAlgo) -> u32 {
        let (bm, bn) = algo.tile();
        match self.math {
            _ if algo.tma() => tma_shared_bytes(bn as u32, 1),
            _ if algo.needs_sm90a() => wgmma_shared_bytes(bn as u32),
            MatmulMath::Fma => fma_matmul_shared_bytes(bm as u32, bn as u32),
            _ if algo.short_k() => {
                mma_shared_bytes_staged(bm as u32, bn as u32, MMA_SHORT_K_STAGES)
            }
            _ => mma_shared_bytes(bm as u32, bn as u32),
        }
    }
}

/// The epilogue arithmetic of a matmul (or of a convolution, which shares it) writing
/// `output`-typed results.
pub(crate) fn epilogue_ops(
    activation: &ActivationDescriptor,
    residual_scale: f64,
    alpha: f32,
    beta: f32,
    bias: BiasMode,
    output: DataType,
) -> EpilogueOps {
    EpilogueOps {
        alpha,
        beta,
        residual_scale: residual_scale as f32,
        act_coef: activation.coef() as f32,
        activation: activation.mode() as u32,
        bias: bias as u32,
        out_type: match output {
            DataType::F16 => OutputType::F16,
            DataType::BF16 => OutputType::Bf16,
            _ => OutputType::F32,
        } as u32,
        _pad: 0,
    }
}
