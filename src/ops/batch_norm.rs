//! Batch normalization (cudnnBatchNormalizationForwardTraining / ForwardInference /
//! Backward, and the `Ex` forms with a fused residual add and relu).
//!
//! Modes: [`BatchNormMode::Spatial`] normalizes each channel over `N, [D,] H, W`;
//! [`BatchNormMode::PerActivation`] each `C, [D,] H, W` position over `N`. The per-feature
//! tensors (scale, bias, running and saved statistics, their gradients) share one
//! descriptor, [`derive_batch_norm_descriptor`]'s (f32 for f32/f16/bf16 data). Data
//! tensors are 4-D or 5-D with any strides (NCHW, NHWC, padded, ...).
//!
//! Training (forward and backward) needs a workspace
//! ([`batch_norm_forward_training_workspace_size`], [`batch_norm_backward_workspace_size`]):
//! the GPU reduces each feature in chunks, leaves the chunks' partial statistics there and
//! combines them in a fixed order, so results are deterministic (bitwise, for a given
//! shape and device) without atomics. Statistics are Welford/Chan moments, accumulated in
//! f32 and combined across chunks in f64. Where one chunk per feature fills the GPU (NCHW
//! with many channels of short reductions), a block per feature reduces, finalizes and
//! normalizes its feature in a single launch. Over channels-first tensors larger than L2,
//! the plain forward and the backward (with saved statistics) run as one cooperative
//! launch that takes each channel's statistics and applies them a few channels later,
//! while the channel's data is still in L2 (read from memory about once). Channels-last
//! problems run as one
//! cooperative launch that keeps as much of the data in shared memory as fits (read from
//! memory once), where that is at least a fifth of it (`docs/batch-norm-notes.md`).
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! let x_desc = TensorDescriptor::nchw(DataType::F32, 2, 1, 1, 2)?;
//! let x = handle.upload(&[1.0f32, 3.0, 5.0, 7.0])?; // one channel: mean 4, variance 5
//! let mut y = handle.alloc(&x_desc)?;
//! let bn = BatchNormDescriptor::new(BatchNormMode::Spatial, 0.0)?;
//! let p_desc = derive_batch_norm_descriptor(&x_desc, BatchNormMode::Spatial)?;
//! let scale = handle.upload(&[2.0f32])?;
//! let bias = handle.upload(&[1.0f32])?;
//! let (mut mean, mut inv_std) = (handle.alloc(&p_desc)?, handle.alloc(&p_desc)?);
//! let ws_bytes = batch_norm_forward_training_workspace_size(&handle, &bn, &x_desc)?;
//! let mut ws = handle.alloc_bytes(ws_bytes)?;
//! batch_norm_forward_training(
//!     &handle, &bn, 1.0, 0.0, &x_desc, &x, None, &x_desc, &mut y,
//!     &p_desc, &scale, &bias, None,
//!     Some(SavedStats { mean: &mut mean, inv_std: &mut inv_std }), &mut ws, None,
//! )?;
//! assert_eq!(handle.read::<f32>(&mean)?, [4.0]);
//! let y = handle.read::<f32>(&y)?; // 2 (x - 4) / sqrt(5) + 1
//! assert!((y[3] - (1.0 + 6.0 / 5f32.sqrt())).abs() < 1e-5);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::activation::{ActivationDescriptor, ActivationMode};
use super::layout::{fold, Folded};
use super::{host_read, host_write, resident_with, scale_factor};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::host_tensor::HostTensor;
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, Gpu, LaunchConfig};
use crate::reference::batch_norm as reference;
use oxidnn_params::bn_operand::{COUNT, DX, DZ, PARAM, X, Y, Z_OR_DY};
use oxidnn_params::{
    bn_flags, BatchNormApplyParams, BatchNormCoef, BatchNormFinalizeParams, BatchNormFusedParams,
    BatchNormGeometry, BatchNormPartial, BatchNormPipelinedParams, BatchNormResidentParams,
    BatchNormStatsParams, BARRIER_GROUPS, BN_BLOCK_THREADS, BN_COLS_SHARED_BYTES,
    BN_FINALIZE_THREADS_PER_FEATURE, COUNTER_WORDS,
};

/// The smallest epsilon cuDNN 9 accepts (`CUDNN_BN_MIN_EPSILON`, `cudnn_ops.h`: 0.0).
pub const BN_MIN_EPSILON: f64 = 0.0;

/// Which elements share statistics (cuDNN's `cudnnBatchNormMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchNormMode {
    /// One feature per `C, [D,] H, W` position, normalized over `N`; per-feature tensors
    /// are `1 x C x [D x] H x W`.
    PerActivation,
    /// One feature per channel, normalized over `N, [D,] H, W`; per-feature tensors are
    /// `1 x C x 1 x 1 [x 1]`.
    Spatial,
}

/// What follows the normalization (cuDNN's `cudnnBatchNormOps_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BatchNormOps {
    /// Normalization only.
    Bn,
    /// `act(bn(x))`.
    BnActivation,
    /// `act(bn(x) + z)` with a residual `z`.
    BnAddActivation,
}

/// Mode, fused ops and epsilon of a batch normalization.
///
/// The activation of the fused ops is relu (the one cuDNN's fused batch-norm kernels
/// take). Backward derives the relu mask from the forward output: `y > 0`, which is the
/// mask of the pre-activation when the forward ran with `alpha > 0, beta = 0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormDescriptor {
    mode: BatchNormMode,
    ops: BatchNormOps,
    epsilon: f64,
}

impl BatchNormDescriptor {
    /// Normalization only; `epsilon` must be finite and at least [`BN_MIN_EPSILON`].
    pub fn new(mode: BatchNormMode, epsilon: f64) -> Result<Self> {
        if !epsilon.is_finite() || epsilon < BN_MIN_EPSILON {
            return Err(Error::bad(
                "epsilon",
                format!(
                    "must be finite and >= CUDNN_BN_MIN_EPSILON ({BN_MIN_EPSILON}), got {epsilon}"
                ),
            ));
        }
        Ok(Self {
            mode,
            ops: BatchNormOps::Bn,
            epsilon,
        })
    }

    /// The same normalization followed by `ops` with `activation` (which must be relu when
    /// `ops` is not [`BatchNormOps::Bn`]).
    pub fn with_ops(self, ops: BatchNormOps, activation: &ActivationDescriptor) -> Result<Self> {
        if ops != BatchNormOps::Bn && activation.mode() != ActivationMode::Relu {
            return Err(Error::unsupported(format!(
                "batch norm fused with {:?}: only relu is fused",
                activation.mode()
            )));
        }
        Ok(Self { ops, ..self })
    }

    /// `relu(bn(x))`.
    pub fn with_relu(self) -> Self {
        Self {
            ops: BatchNormOps::BnActivation,
            ..self
        }
    }

    /// `relu(bn(x) + z)`.
    pub fn with_add_relu(self) -> Self {
        Self {
            ops: BatchNormOps::BnAddActivation,
            ..self
        }
    }

    pub fn mode(&self) -> BatchNormMode {
        self.mode
    }
    pub fn ops(&self) -> BatchNormOps {
        self.ops
    }
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }
}

/// The descriptor of the per-feature tensors for data `x_desc` in `mode`
/// (cudnnDeriveBNTensorDescriptor): dims `1 x C x 1 x 1` (spatial) or `1 x C x H x W`
/// (per-activation), packed, f32 for f32/f16/bf16 data and f64 for f64 data.
pub fn derive_batch_norm_descriptor(
    x_desc: &TensorDescriptor,
    mode: BatchNormMode,
) -> Result<TensorDescriptor> {
    check_rank("x_desc", x_desc)?;
    let dims: Vec<usize> = x_desc
        .dims()
        .iter()
        .enumerate()
        .map(|(d, &n)| match d {
            0 => 1,
            1 => n,
            _ if mode == BatchNormMode::Spatial => 1,
            _ => n,
        })
        .collect();
    TensorDescriptor::packed(param_dtype(x_desc.dtype()), &dims)
}

/// Running (estimated) statistics that training updates in place:
/// `running = (1 - factor) * running + factor * batch`. With `factor == 1` (the first call
/// of a cumulative average) they are overwritten and not read.
#[derive(Debug)]
pub struct RunningStats<'a> {
    pub factor: f64,
    pub mean: &'a mut Buffer,
    /// Updated with the unbiased batch variance `var * m / (m - 1)`.
    pub variance: &'a mut Buffer,
}

/// Where forward training saves the batch mean and `1 / sqrt(var + epsilon)` (biased
/// variance) for the backward pass.
#[derive(Debug)]
pub struct SavedStats<'a> {
    pub mean: &'a mut Buffer,
    pub inv_std: &'a mut Buffer,
}

/// The saved statistics as backward reads them.
#[derive(Clone, Copy, Debug)]
pub struct SavedStatsRef<'a> {
    pub mean: &'a Buffer,
    pub inv_std: &'a Buffer,
}

/// The estimated mean and variance inference normalizes with.
#[derive(Clone, Copy, Debug)]
pub struct EstimatedStats<'a> {
    pub mean: &'a Buffer,
    pub variance: &'a Buffer,
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

fn param_dtype(data: DataType) -> DataType {
    match data {
        DataType::F64 => DataType::F64,
        _ => DataType::F32,
    }
}

fn check_rank(arg: &'static str, d: &TensorDescriptor) -> Result<()> {
    if (4..=5).contains(&d.rank()) {
        Ok(())
    } else {
        Err(Error::bad(
            arg,
            format!(
                "batch normalization takes 4-D (N, C, H, W) or 5-D (N, C, D, H, W) tensors, got {} dims",
                d.rank()
            ),
        ))
    }
}

/// A data tensor that must match `x` in dims and dtype.
fn check_like_x(
    arg: &'static str,
    x_desc: &TensorDescriptor,
    d: &TensorDescriptor,
    output: bool,
) -> Result<()> {
    check_same_dims(arg, x_desc, d)?;
    check_same_dtype(arg, x_desc, d)?;
    if output {
        check_output(arg, d)?;
    }
    Ok(())
}

/// The per-feature descriptor must have the derived dims and dtype (any non-overlapping
/// strides).
fn check_params_desc(
    x_desc: &TensorDescriptor,
    mode: BatchNormMode,
    p_desc: &TensorDescriptor,
) -> Result<()> {
    let want = derive_batch_norm_descriptor(x_desc, mode)?;
    if p_desc.dims() != want.dims() {
        return Err(Error::bad(
            "bn_desc",
            format!(
                "dims {:?} differ from {:?} ({mode:?} batch norm of x {:?})",
                p_desc.dims(),
                want.dims(),
                x_desc.dims()
            ),
        ));
    }
    if p_desc.dtype() != want.dtype() {
        return Err(Error::bad(
            "bn_desc",
            format!(
                "per-feature tensors of {} data are {}, got {}",
                x_desc.dtype(),
                want.dtype(),
                p_desc.dtype()
            ),
        ));
    }
    check_output("bn_desc", p_desc)
}

/// Reduction elements per feature.
fn reduction_len(mode: BatchNormMode, x_desc: &TensorDescriptor) -> usize {
    match mode {
        BatchNormMode::Spatial => x_desc.element_count() / x_desc.dims()[1],
        BatchNormMode::PerActivation => x_desc.dims()[0],
    }
}

fn check_training_len(mode: BatchNormMode, x_desc: &TensorDescriptor) -> Result<()> {
    let m = reduction_len(mode, x_desc);
    if m < 2 {
        return Err(Error::bad(
            "x_desc",
            format!(
                "training needs more than one value per feature ({mode:?} batch norm of {:?} has {m}); \
                 the unbiased variance of one value is undefined",
                x_desc.dims()
            ),
        ));
    }
    Ok(())
}

fn check_factor(factor: f64) -> Result<()> {
    if factor.is_finite() && (0.0..=1.0).contains(&factor) {
        Ok(())
    } else {
        Err(Error::bad(
            "exponential_average_factor",
            format!("must be in [0, 1], got {factor}"),
        ))
    }
}

/// `Some` exactly when the fused ops use the operand.
fn check_presence<T>(arg: &'static str, needed: bool, got: &Option<T>, what: &str) -> Result<()> {
    match (needed, got.is_some()) {
        (true, false) => Err(Error::bad(arg, format!("required with {what}"))),
        (false, true) => Err(Error::bad(arg, format!("only used with {what}; pass None"))),
        _ => Ok(()),
    }
}

/// Checks every per-feature buffer against the descriptor.
fn check_param_buffers(
    handle: &Handle,
    p_desc: &TensorDescriptor,
    buffers: &[(&'static str, &Buffer)],
) -> Result<()> {
    buffers
        .iter()
        .try_for_each(|(arg, b)| handle.check_tensor(arg, p_desc, b))
}

// ---------------------------------------------------------------------------------------
// GPU planning
// ---------------------------------------------------------------------------------------

/// How the GPU kernels walk a problem.
struct Plan {
    /// The stats kernels' geometry (its chunks are the partials' chunks).
    geo: BatchNormGeometry,
    /// The apply kernels' geometry: the same but for its chunks.
    apply_geo: BatchNormGeometry,
    /// Cols mapping (features contiguous) or rows mapping (reduction contiguous).
    cols: bool,
    /// Blocks of the stats and of the apply kernels, and their block sizes.
    blocks: u32,
    stats_threads: u32,
    apply_blocks: u32,
    apply_threads: u32,
    /// The pass, which picks the apply kernel.
    pass: Pass,
    /// The fused (one-launch) training kernels' plan.
    fused: FusedPlan,
}

/// The fused (one-launch) training kernels' plan: for the rows mapping when the stats
/// kernels would take one chunk per feature anyway (many features of short reductions,
/// e.g. NCHW 512x28x28 to 2048x7x7 at N = 32), one block per feature reduces it,
/// finalizes it and normalizes it: no partials, no finalize launch, no apply launch.
struct FusedPlan {
    /// The stats geometry with one chunk per feature.
    geo: BatchNormGeometry,
    threads: u32,
    /// Whether the problem takes the fused kernels (the backward's one launch; the
    /// forward's where the staged one does not run, [`Self::forward`]).
    usable: bool,
    /// Whether the problem has the rows mapping (where the staged forward may run).
    rows: bool,
    /// Whether the forward writes the relu mask (the masked staged kernel).
    masked: bool,
}

impl FusedPlan {
    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: self.geo.features,
            grid_y: 1,
            block: self.threads,
            shared_bytes: 0,
        }
    }

    /// The forward's one-launch kernel and launch, if the problem takes one (rows
    /// mapping): `batch_norm_fwd_staged_rows_*` (`staged_masked`, or in f32 where it fits
    /// as many blocks per SM `staged_masked_unrolled`, with the relu mask) where a feature's
    /// vectors (of 4 bytes or more) fit in the shared memory of half an SM and there are
    /// at least as many features as SMs, so each block reads its feature from memory once
    /// while another block computes; otherwise the plain fused kernel where
    /// [`Self::usable`] (it reads each feature twice, the second time mostly from L1/L2).
    fn forward(&self, gpu: &Gpu, dtype: DataType) -> Result<Option<(&'static str, LaunchConfig)>> {
        let g = self.geo;
        let vector_bytes = g.vector as usize * dtype.size_bytes();
        let bytes = g.chunk_len as usize * vector_bytes;
        let many = g.features >= gpu.sm_count;
        if self.rows && many && vector_bytes >= 4 && bytes <= gpu.shared_per_block_optin as usize {
            let kernel = staged_kernel(dtype, self.masked)?;
            let per_sm = resident_with(gpu, kernel, self.threads, bytes as u32)?;
            if per_sm >= 2 {
                // The masked forward's unrolled kernel keeps four loads of z in flight for
                // more registers: taken where as many of its blocks fit an SM (shared
                // memory bounds them). (H200, f32 NCHW N = 32: 512x28x28 12% faster, two
                // blocks an SM either way; at 1024x14x14 it fits half as many, 24% slower.)
                let kernel = match staged_unrolled_kernel(dtype).filter(|_| self.masked) {
                    Some(u) if resident_with(gpu, u, self.threads, bytes as u32)? >= per_sm => u,
                    _ => kernel,
                };
                let config = LaunchConfig {
                    shared_bytes: bytes as u32,
                    ..self.config()
                };
                return Ok(Some((kernel, config)));
            }
        }
        Ok(match self.usable {
            true => Some((fused_kernel(dtype, true)?, self.config())),
            false => None,
        })
    }
}

/// The resident training plan ([`BatchNormResidentParams`], forward or backward): the
/// cols geometry split into one chunk per block of a grid that is resident at once, each
/// block keeping the first `resident_rows` rows of its chunk of each stashed operand in
/// shared memory.
struct ResidentPlan {
    geo: BatchNormGeometry,
    blocks: u32,
    shared_bytes: u32,
    resident_rows: u32,
    /// Whether each tile's blocks finalize the tile themselves (else the grid does).
    local_finalize: bool,
}

impl ResidentPlan {
    /// The kernel's parameters: the three-launch path's apply and finalize parameters,
    /// on this plan's geometry and chunks.
    fn params(
        &self,
        mut apply: BatchNormApplyParams,
        mut finalize: BatchNormFinalizeParams,
    ) -> BatchNormResidentParams {
        apply.geo = self.geo;
        finalize.chunks = self.geo.chunks;
        BatchNormResidentParams {
            fused: BatchNormFusedParams { apply, finalize },
            resident_rows: self.resident_rows,
            local_finalize: self.local_finalize as u32,
            _pad: [0; 2],
        }
    }

    /// Launches the direction's resident kernel with `pointers` and the handle's
    /// grid-barrier state after them.
    ///
    /// # Safety
    /// `pointers` are the kernel's (before `barrier`) and cover what `params` describes,
    /// as for the three launches the kernel replaces; the partials region holds
    /// [`Occupancy::resident_chunks`]` * features >= chunks * features` entries.
    unsafe fn launch(
        &self,
        gpu: &Gpu,
        (dtype, forward): (DataType, bool),
        params: &BatchNormResidentParams,
        pointers: &[u64],
    ) -> Result<()> {
        let mut all = pointers.to_vec();
        all.push(gpu.grid_barrier()?);
        let config = LaunchConfig {
            grid: self.blocks,
            grid_y: 1,
            block: BN_BLOCK_THREADS,
            shared_bytes: self.shared_bytes,
        };
        // SAFETY: the caller's pointers; the plan sized the grid to be resident at once
        // (the cooperative launch fails otherwise) and the shared memory for
        // resident_rows rows of the stashed operands; the grid-barrier state is the
        // handle's, ordered by its stream.
        unsafe { gpu.launch_cooperative(resident_kernel(dtype, forward)?, config, params, &all) }
    }
}

/// The share of the data a resident plan must keep on chip to be taken over the
/// three-launch path: the rest is read twice, by a launch of fewer threads per SM.
/// (H100, f16 NHWC N = 32: a quarter on chip still gains 5-11% over three launches,
/// backward 64x112x112 and 256x56x56; a sixth loses 3%, the fused backward 256x56x56.)
const RESIDENT_MIN_SHARE: f64 = 0.2;

/// `OXIDNN_BN_RESIDENT=0` never takes the resident training kernels, `=1` takes them
/// wherever they can run, whatever share of the data stays on chip (for measurements and
/// for testing both paths).
fn resident_forced() -> Option<bool> {
    forced_switch("OXIDNN_BN_RESIDENT")
}

/// A path forced off (`var=0`) or on (`var=1`) by the environment; `None` leaves the choice
/// to the measured rule.
fn forced_switch(var: &str) -> Option<bool> {
    match std::env::var(var).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// Whether the cols apply kernels deal their rows to the blocks a block-wide step at a time
/// ([`bn_flags::INTERLEAVE_ROWS`]: the grid walks the tensor together), rather than give
/// each block a contiguous chunk of rows. `OXIDNN_BN_APPLY_ROWS=chunked` or
/// `=interleaved` picks one (for measurements and for testing both); interleaved by
/// default.
fn apply_rows_interleaved() -> bool {
    std::env::var("OXIDNN_BN_APPLY_ROWS").as_deref() != Ok("chunked")
}

/// Shared memory of one SM, as a resident plan divides it (bytes).
#[derive(Clone, Copy, Debug)]
struct SharedMemory {
    per_sm: usize,
    per_block: usize,
    reserved_per_block: usize,
}

impl SharedMemory {
    fn of(gpu: &Gpu) -> Self {
        Self {
            per_sm: gpu.shared_per_sm as usize,
            per_block: gpu.shared_per_block_optin as usize,
            reserved_per_block: gpu.shared_reserved_per_block as usize,
        }
    }
}

/// The resident training kernel of the direction for `plan`, keeping `stash_bytes` per
/// vector of a row on chip (16 per stashed operand, 4 for a relu mask word), where it
/// applies (checked against the kernel's occupancy at the chosen shared memory).
fn plan_resident(
    gpu: &Gpu,
    (dtype, forward): (DataType, bool),
    plan: &Plan,
    occ: &Occupancy,
    stash_bytes: usize,
) -> Result<Option<ResidentPlan>> {
    let forced = resident_forced();
    if forced == Some(false) {
        return Ok(None);
    }
    let smem = SharedMemory::of(gpu);
    let Some(resident) = resident_shape(plan, occ, smem, stash_bytes, forced) else {
        return Ok(None);
    };
    let per_sm = resident_with(
        gpu,
        resident_kernel(dtype, forward)?,
        BN_BLOCK_THREADS,
        resident.shared_bytes,
    )?;
    Ok((resident.blocks as usize <= per_sm * occ.sms).then_some(resident))
}

/// The share of the best on-chip stash a resident plan gives up for more blocks per SM.
/// (H100, f16 NHWC 1024x14x14 fused backward: all on chip with one block per SM, 82%
/// with two, keeping mask words too.)
const RESIDENT_SHARE_SLACK: f64 = 0.8;

/// Feature vectors per tile of a resident plan whose blocks finalize their tiles: more,
/// narrower tiles have fewer chunks each to merge (a warp still reads whole 128-byte rows
/// of a tile).
const LOCAL_TILE_VECTORS: u32 = 8;

/// The most partials a thread merges when the blocks finalize their own tiles; with more,
/// the grid's blocks share the finalize out instead, a feature a block (behind a second
/// grid barrier).
const LOCAL_FINALIZE_MAX_MERGES: u32 = 16;

/// The resident plan's shape: cols mapping with 16-byte vectors, every feature tile given
/// a chunk by a grid resident at once, `stash_bytes` kept per vector of a row. Narrow tiles
/// ([`LOCAL_TILE_VECTORS`]) where their blocks can finalize them
/// ([`LOCAL_FINALIZE_MAX_MERGES`]); otherwise the plan's tiles. `None` where it keeps
/// less than [`RESIDENT_MIN_SHARE`] of the data on chip (unless `forced`).
fn resident_shape(
    plan: &Plan,
    occ: &Occupancy,
    smem: SharedMemory,
    stash_bytes: usize,
    forced: Option<bool>,
) -> Option<ResidentPlan> {
    let g = plan.geo;
    if !plan.cols || g.vector == 1 || occ.resident == 0 {
        return None;
    }
    let mut narrow = g;
    if g.tile_vectors > LOCAL_TILE_VECTORS {
        narrow.tile_vectors = LOCAL_TILE_VECTORS;
        narrow.tile_vectors_log2 = LOCAL_TILE_VECTORS.trailing_zeros();
        narrow.tiles = g.vectors.div_ceil(LOCAL_TILE_VECTORS);
    }
    resident_shape_with(narrow, occ, smem, stash_bytes, forced)
        .filter(|r| r.local_finalize)
        .or_else(|| resident_shape_with(g, occ, smem, stash_bytes, forced))
}

/// [`resident_shape`] on the cols geometry `g`'s tiles. Blocks per SM: the most (up to
/// what registers allow, `occ.resident`) that keep on chip at least
/// [`RESIDENT_SHARE_SLACK`] of the most any count keeps (more warps hide more latency;
/// each block's scratch and reserved shared memory cost a little of the stash).
fn resident_shape_with(
    g: BatchNormGeometry,
    occ: &Occupancy,
    smem: SharedMemory,
    stash_bytes: usize,
    forced: Option<bool>,
) -> Option<ResidentPlan> {
    let (tiles, red_len) = (g.tiles as usize, g.red_len as usize);
    if tiles > occ.sms * occ.resident {
        return None;
    }
    let step = (BN_BLOCK_THREADS / g.tile_vectors) as usize;
    let row_bytes = g.tile_vectors as usize * stash_bytes;
    // (rows per chunk, rows of it that fit on chip) with `b` blocks per SM. Where a whole
    // chunk fits, its rows need not be whole steps (every block of the grid gets work);
    // otherwise chunks and the rows on chip are whole steps, so that each thread's
    // streamed rows continue its kept ones.
    let shape = |b: usize| {
        let chunks = (b * occ.sms / tiles).max(1);
        let rows = red_len.div_ceil(chunks);
        let dynamic = (smem.per_sm / b)
            .min(smem.per_block)
            .saturating_sub(smem.reserved_per_block + BN_COLS_SHARED_BYTES as usize);
        let fit = dynamic / row_bytes;
        match fit >= rows {
            true => (rows, rows),
            false => (rows.next_multiple_of(step), fit / step * step),
        }
    };
    // The rows kept on chip with `b` blocks per SM.
    let kept = |b: usize| {
        let (chunk_len, fit) = shape(b);
        (fit.min(chunk_len) * red_len.div_ceil(chunk_len)).min(red_len)
    };
    let most = (1..=occ.resident).map(kept).max().unwrap_or(0);
    let b = (1..=occ.resident)
        .rev()
        .find(|&b| kept(b) as f64 >= RESIDENT_SHARE_SLACK * most as f64)
        .unwrap_or(1);
    let (chunk_len, fit) = shape(b);
    let resident_rows = fit.min(chunk_len);
    let mut geo = g;
    geo.chunk_len = chunk_len as u32;
    geo.chunks = red_len.div_ceil(chunk_len) as u32;
    let share = (resident_rows * geo.chunks as usize).min(red_len) as f64 / red_len as f64;
    if resident_rows == 0 || (share < RESIDENT_MIN_SHARE && forced != Some(true)) {
        return None;
    }
    // Threads per feature in a block's finalize of its tile (at most a warp).
    let lanes = (BN_BLOCK_THREADS / (geo.tile_vectors * geo.vector)).min(32);
    Some(ResidentPlan {
        geo,
        blocks: geo.tiles * geo.chunks,
        shared_bytes: (BN_COLS_SHARED_BYTES as usize + resident_rows * row_bytes) as u32,
        resident_rows: resident_rows as u32,
        local_finalize: geo.tiles <= BARRIER_GROUPS
            && geo.chunks.div_ceil(lanes) <= LOCAL_FINALIZE_MAX_MERGES,
    })
}

/// Logical dims of `x` that index features and that are reduced.
fn split_dims(mode: BatchNormMode, rank: usize) -> (Vec<usize>, Vec<usize>) {
    match mode {
        BatchNormMode::Spatial => (vec![1], [0].into_iter().chain(2..rank).collect()),
        BatchNormMode::PerActivation => ((1..rank).collect(), vec![0]),
    }
}

/// Smallest stride of `x` over the dims `ds` of extent > 1 (`usize::MAX` if none).
fn inner_stride(x_desc: &TensorDescriptor, ds: &[usize]) -> usize {
    ds.iter()
        .filter(|&&d| x_desc.dims()[d] > 1)
        .map(|&d| x_desc.strides()[d])
        .min()
        .unwrap_or(usize::MAX)
}

/// Whether the cols mapping suits `x`: its features are closer together than its
/// reduction elements (NHWC spatial, most per-activation layouts).
fn use_cols(mode: BatchNormMode, x_desc: &TensorDescriptor) -> bool {
    let (feat, red) = split_dims(mode, x_desc.rank());
    inner_stride(x_desc, &feat) < inner_stride(x_desc, &red)
}

/// Elements of a 16-byte vector of `dtype`.
fn vector_elements(dtype: DataType) -> usize {
    16 / dtype.size_bytes()
}

/// Feature vectors per cols tile for `vectors` feature vectors: a power of two up to 32.
fn tile_vectors(vectors: usize) -> u32 {
    vectors.next_power_of_two().clamp(1, 32) as u32
}

/// Feature tiles of the cols mapping for `f` features in `k`-element vectors (assuming
/// full vectors, so the count depends on the descriptor alone).
fn cols_tiles(f: usize, k: usize) -> usize {
    f.div_ceil(k).div_ceil(tile_vectors(f.div_ceil(k)) as usize)
}

/// Groups of loads (of `FWD_UNROLL` vectors or rows) every thread gets at least.
const MIN_GROUPS_PER_THREAD: usize = 1;
/// Rows every thread of a cols stats kernel gets at least: its block-wide reduction and
/// the partials it writes cost about as much as reading a few rows per thread, and fewer
/// chunks make the finalize cheaper. (Measured on the H100 at 4 and 16 rows: 16 is
/// faster for every ResNet-50 shape; the apply kernels, with no reduction, prefer 4.)
const COLS_STATS_MIN_ROWS_PER_THREAD: usize = 16;
/// Vectors or rows a thread loads before using them (the kernels' unroll).
const LOADS_PER_GROUP: usize = 4;

/// The pass a plan serves, as far as its kernels differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Training or inference forward, writing no relu mask.
    Forward,
    /// A forward pass whose epilogue is plain (no residual add, no relu, `alpha = 1`,
    /// `beta = 0`; inference, or training without fused ops): its cols apply kernel serves
    /// that epilogue alone, in fewer registers, so more blocks fit an SM.
    ForwardPlain,
    /// Training forward writing the relu mask to the reserve space: its apply kernel is
    /// the masked one (the unmasked ones leave the mask's code out, and its registers).
    ForwardMasked,
    Backward,
}

impl Pass {
    /// The forward pass of descriptor `bn` with blend factors `alpha`, `beta`, writing the
    /// relu mask or not.
    fn forward_of(bn: &BatchNormDescriptor, alpha: f32, beta: f32, masked: bool) -> Self {
        if masked {
            Pass::ForwardMasked
        } else if bn.ops == BatchNormOps::Bn && alpha == 1.0 && beta == 0.0 {
            Pass::ForwardPlain
        } else {
            Pass::Forward
        }
    }

    fn forward(self) -> bool {
        self != Pass::Backward
    }
}

/// The GPU a problem runs on: SMs, and for its stats and its apply kernel the block size
/// and how many such blocks each SM runs at once.
#[derive(Clone, Copy, Debug)]
struct Occupancy {
    pass: Pass,
    sms: usize,
    stats: usize,
    stats_threads: u32,
    apply: usize,
    apply_threads: u32,
    /// Blocks of the resident training kernel of the direction per SM (registers
    /// allowing; 0 where the problem cannot take it: rows mapping).
    resident: usize,
}

impl Occupancy {
    /// For the kernels of `x_desc`'s mapping in `pass` (cached per device and kernel).
    fn of(gpu: &Gpu, mode: BatchNormMode, x_desc: &TensorDescriptor, pass: Pass) -> Result<Self> {
        let forward = pass.forward();
        let cols = use_cols(mode, x_desc);
        let dtype = x_desc.dtype();
        let stats_kernel = stats_kernel(cols, dtype, forward)?;
        // Cols stats blocks reduce in shared memory and write a partial per feature:
        // always full-size blocks, so there are fewer of both.
        let (stats, stats_threads) = if cols {
            let n = resident_with(gpu, stats_kernel, BN_BLOCK_THREADS, BN_COLS_SHARED_BYTES)?;
            (n, BN_BLOCK_THREADS)
        } else {
            best_block(gpu, stats_kernel, 0)?
        };
        let (apply, apply_threads) = best_block(gpu, apply_kernel(cols, dtype, pass)?, 0)?;
        let resident = if cols {
            let kernel = resident_kernel(dtype, forward)?;
            resident_with(gpu, kernel, BN_BLOCK_THREADS, BN_COLS_SHARED_BYTES)?
        } else {
            0
        };
        Ok(Self {
            pass,
            sms: gpu.sm_count.max(1) as usize,
            stats,
            stats_threads,
            apply,
            apply_threads,
            resident,
        })
    }
}

/// Blocks of 256 or of 128 threads, whichever keeps more threads of `kernel` resident on
/// an SM (register-heavy kernels fit more in small blocks): `(blocks per SM, threads)`.
fn best_block(gpu: &Gpu, kernel: &'static str, shared_bytes: u32) -> Result<(usize, u32)> {
    let (big, small) = (BN_BLOCK_THREADS, BN_BLOCK_THREADS / 2);
    let at_big = resident_with(gpu, kernel, big, shared_bytes)?;
    let at_small = resident_with(gpu, kernel, small, shared_bytes)?;
    Ok(if at_small * small as usize > at_big * big as usize {
        (at_small, small)
    } else {
        (at_big, big)
    })
}

/// Chunks to split each feature's reduction into for a kernel of which `resident` blocks
/// of `threads` fit on an SM: as many as fill the GPU once (rounded down, so no short
/// second wave; every block does the same work, so one wave leaves no tail), while every
/// thread still gets `min_rows` rows (cols mapping) or a full group of vector loads (rows
/// mapping). The count does not depend on the vector width the plan ends up with (it
/// assumes full vectors), so the workspace size depends on `x_desc` alone.
fn chunks_for(
    mode: BatchNormMode,
    x_desc: &TensorDescriptor,
    (sms, resident, threads): (usize, usize, u32),
    min_rows: usize,
) -> usize {
    let (f, m) = (
        x_desc.element_count() / reduction_len(mode, x_desc),
        reduction_len(mode, x_desc),
    );
    let k = vector_elements(x_desc.dtype());
    let threads = threads as usize;
    let (units, min_per_chunk) = if use_cols(mode, x_desc) {
        let tv = tile_vectors(f.div_ceil(k)) as usize;
        (cols_tiles(f, k), (threads / tv).max(1) * min_rows)
    } else {
        let vectors = MIN_GROUPS_PER_THREAD * LOADS_PER_GROUP;
        (f, threads * vectors * k)
    };
    (sms * resident / units)
        .min(m / min_per_chunk)
        .clamp(1, 65_535)
}

impl Occupancy {
    /// Chunks of the stats kernels (the partials' chunks; an upper bound of the plan's).
    fn stats_chunks(&self, mode: BatchNormMode, x_desc: &TensorDescriptor) -> usize {
        let shape = (self.sms, self.stats, self.stats_threads);
        chunks_for(mode, x_desc, shape, COLS_STATS_MIN_ROWS_PER_THREAD)
    }

    /// Chunks of the apply kernels.
    fn apply_chunks(&self, mode: BatchNormMode, x_desc: &TensorDescriptor) -> usize {
        let shape = (self.sms, self.apply, self.apply_threads);
        chunks_for(mode, x_desc, shape, LOADS_PER_GROUP)
    }

    /// Chunks of the resident training kernel, at most (its partials' chunks).
    fn resident_chunks(&self, mode: BatchNormMode, x_desc: &TensorDescriptor) -> usize {
        let f = x_desc.element_count() / reduction_len(mode, x_desc);
        let tiles = cols_tiles(f, vector_elements(x_desc.dtype()));
        self.sms * self.resident / tiles
    }

    /// Whether a problem takes the fused kernels: rows mapping, one chunk per feature.
    fn fused_fits(&self, mode: BatchNormMode, x_desc: &TensorDescriptor) -> bool {
        !use_cols(mode, x_desc) && self.stats_chunks(mode, x_desc) == 1
    }
}

/// Bytes of the workspace regions: partials, then the forward coefficients, then (backward)
/// the backward coefficients.
struct WorkspaceLayout {
    partials: usize,
    coef: usize,
    bwd_coef: usize,
    total: usize,
}

fn workspace_layout(
    mode: BatchNormMode,
    x_desc: &TensorDescriptor,
    occ: Occupancy,
    backward: bool,
) -> WorkspaceLayout {
    let f = x_desc.element_count() / reduction_len(mode, x_desc);
    let mut chunks = occ
        .stats_chunks(mode, x_desc)
        .max(occ.resident_chunks(mode, x_desc));
    if !use_cols(mode, x_desc) {
        chunks = chunks.max(pipelined_chunks_bound(mode, x_desc));
    }
    let partials = chunks * f * size_of::<BatchNormPartial>();
    let coef_bytes = f * size_of::<BatchNormCoef>();
    WorkspaceLayout {
        partials: 0,
        coef: partials,
        bwd_coef: partials + coef_bytes,
        total: partials + coef_bytes * if backward { 2 } else { 1 },
    }
}

/// The operands of a GPU problem: descriptor and device address per slot
/// (`bn_operand`), `None` where unused.
type Operands<'a> = [Option<(&'a TensorDescriptor, u64)>; COUNT];

/// Whether every used data operand allows `k`-element vectors along folded map `along`
/// (innermost dim contiguous, its extent and every other stride multiples of `k`, base
/// addresses 16-byte aligned).
fn vectorizable(
    k: usize,
    ops: &Operands<'_>,
    along: &Folded<COUNT>,
    other: &Folded<COUNT>,
) -> bool {
    let Some(&inner) = along.dims.last() else {
        return false;
    };
    if inner % k != 0 {
        return false;
    }
    let last = along.dims.len() - 1;
    (0..PARAM).filter(|&s| ops[s].is_some()).all(|s| {
        let addr_ok = ops[s].is_some_and(|(_, addr)| addr % 16 == 0);
        let inner_ok = along.strides[s][last] == 1;
        let rest_ok = along.strides[s][..last]
            .iter()
            .chain(other.strides[s].iter())
            .all(|&st| st % k == 0);
        addr_ok && inner_ok && rest_ok
    })
}

fn plan_problem(
    mode: BatchNormMode,
    x_desc: &TensorDescriptor,
    p_desc: &TensorDescriptor,
    ops: &Operands<'_>,
    occ: Occupancy,
) -> Result<Plan> {
    let rank = x_desc.rank();
    let (feat_dims, red_dims) = split_dims(mode, rank);
    // Strides per slot over all logical dims (0 for unused operands, and for the
    // per-feature tensors along reduced dims).
    let strides: [Vec<usize>; COUNT] = std::array::from_fn(|s| {
        if s == PARAM {
            (0..rank)
                .map(|d| {
                    if feat_dims.contains(&d) {
                        p_desc.strides()[d]
                    } else {
                        0
                    }
                })
                .collect()
        } else {
            match ops[s] {
                Some((desc, _)) => desc.strides().to_vec(),
                None => vec![0; rank],
            }
        }
    });
    let fold_over = |ds: &[usize]| {
        let dims: Vec<usize> = ds.iter().map(|&d| x_desc.dims()[d]).collect();
        let picked: [Vec<usize>; COUNT] =
            std::array::from_fn(|s| ds.iter().map(|&d| strides[s][d]).collect());
        fold(&dims, std::array::from_fn(|s| picked[s].as_slice()), X)
    };
    let (feat, red) = (fold_over(&feat_dims), fold_over(&red_dims));
    let (features, red_len) = (feat.len(), red.len());
    if red_len > i32::MAX as usize || features > i32::MAX as usize {
        return Err(Error::unsupported(format!(
            "batch norm with {features} features of {red_len} elements (at most 2^31-1 each)"
        )));
    }
    let cols = use_cols(mode, x_desc);
    let kmax = vector_elements(x_desc.dtype());
    let (along, other) = if cols { (&feat, &red) } else { (&red, &feat) };
    let k = if vectorizable(kmax, ops, along, other) {
        kmax
    } else {
        1
    };
    let mut geo = BatchNormGeometry {
        features: features as u32,
        red_len: red_len as u32,
        vector: k as u32,
        tiles: 1,
        tile_vectors: 1,
        tile_vectors_log2: 0,
        feat: feat.index_map()?,
        red: red.index_map()?,
        ..Default::default()
    };
    if cols {
        let vectors = features / k;
        let tv = tile_vectors(vectors);
        geo.vectors = vectors as u32;
        geo.tile_vectors = tv;
        geo.tile_vectors_log2 = tv.trailing_zeros();
        geo.tiles = vectors.div_ceil(tv as usize) as u32;
    } else {
        geo.vectors = (red_len / k) as u32;
    }
    // Rows: chunks of vectors of each feature; cols: chunks of rows of each tile.
    let (units, groups) = if cols {
        (red_len, geo.tiles as u64)
    } else {
        (geo.vectors as usize, features as u64)
    };
    let split = |chunks: usize| -> Result<(BatchNormGeometry, u32)> {
        let chunk_len = units.div_ceil(chunks);
        let mut g = geo;
        g.chunk_len = chunk_len as u32;
        g.chunks = units.div_ceil(chunk_len) as u32;
        let blocks = groups * g.chunks as u64;
        if blocks > i32::MAX as u64 {
            return Err(Error::unsupported(format!(
                "batch norm needing {blocks} blocks"
            )));
        }
        Ok((g, blocks as u32))
    };
    let (geo, blocks) = split(occ.stats_chunks(mode, x_desc))?;
    let (apply_geo, apply_blocks) = split(occ.apply_chunks(mode, x_desc))?;
    let (fused_geo, _) = split(1)?;
    Ok(Plan {
        geo,
        apply_geo,
        cols,
        blocks,
        stats_threads: occ.stats_threads,
        apply_blocks,
        apply_threads: occ.apply_threads,
        pass: occ.pass,
        fused: FusedPlan {
            geo: fused_geo,
            threads: BN_BLOCK_THREADS,
            usable: occ.fused_fits(mode, x_desc),
            rows: !cols,
            masked: occ.pass == Pass::ForwardMasked,
        },
    })
}

/// Bytes of `x` from which a rows training pass takes the pipelined kernel: below them the
/// three launches' apply finds most of its inputs still in L2 (the H100's holds 50 MB).
const PIPELINE_MIN_BYTES: usize = 40 << 20;
/// Bytes of input a pipelined task reads: the forward's of `x`, the backward's of `x` and
/// `dy` together. Each task costs its block a few microseconds of bookkeeping (the
/// reduction, the counts and their fences, the wait for the coefficient), so small tasks
/// lose: H100, f32 NCHW N = 32, forward 64x112x112 at 16 / 32 / 64 KB 191 / 125 / 121 µs
/// (three launches 129), backward at 16 / 32 / 64 KB of input 203 / 173 / 180 µs (three
/// launches 192); 256x56x56 likewise.
const PIPELINE_FWD_CHUNK_BYTES: usize = 64 << 10;
const PIPELINE_BWD_CHUNK_BYTES: usize = 32 << 10;
/// The fewest bytes of `x` a chunk may have (the workspace holds the partials of chunks
/// that small).
const PIPELINE_MIN_CHUNK_BYTES: usize = 4 << 10;
/// Tasks between the end of a feature's stats and the start of its apply, in grids: at
/// least one grid of tasks, so that the stats are done (and finalized) by the time the
/// first block reaches the apply; the tasks between are the reuse distance of `x` in L2
/// (their stats read new data and their applies write `y`).
const PIPELINE_AHEAD_GRIDS: f64 = 1.25;

/// `OXIDNN_BN_PIPELINE=0` never takes the pipelined training kernels, `=1` takes them for
/// every rows problem they can run (for measurements and for testing both paths);
/// `OXIDNN_BN_PIPELINE_CHUNK` (bytes of input, 4096 to 65536) and
/// `OXIDNN_BN_PIPELINE_AHEAD` (grids) override their chunk and lookahead, for measurements.
fn pipelined_forced() -> Option<bool> {
    forced_switch("OXIDNN_BN_PIPELINE")
}

/// Bytes of input a pipelined task of `pass` reads.
fn pipelined_chunk_bytes(pass: Pass) -> usize {
    let default = match pass {
        Pass::Backward => PIPELINE_BWD_CHUNK_BYTES,
        _ => PIPELINE_FWD_CHUNK_BYTES,
    };
    std::env::var("OXIDNN_BN_PIPELINE_CHUNK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(default, |b| b.clamp(PIPELINE_MIN_CHUNK_BYTES, 64 << 10))
}

fn pipelined_ahead_grids() -> f64 {
    std::env::var("OXIDNN_BN_PIPELINE_AHEAD")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|a| a.is_finite() && *a >= 0.0)
        .unwrap_or(PIPELINE_AHEAD_GRIDS)
}

/// Chunks per feature a pipelined pass over `x_desc` takes at most (with the smallest
/// chunk), for the workspace's partials: it depends on the descriptor alone.
fn pipelined_chunks_bound(mode: BatchNormMode, x_desc: &TensorDescriptor) -> usize {
    let chunk_elements = PIPELINE_MIN_CHUNK_BYTES / x_desc.dtype().size_bytes();
    reduction_len(mode, x_desc).div_ceil(chunk_elements)
}

/// Rows geometry `geo` split for a pipelined pass over a grid of `blocks` (elements
/// of `element_bytes`): chunks of `chunk_bytes` of `x`, and the lookahead (in features)
/// that puts about `ahead` grids of tasks between a feature's stats and its apply. `None`
/// where there is no grid or the tasks overflow the kernel's `u32` count.
fn pipelined_split(
    geo: BatchNormGeometry,
    element_bytes: usize,
    blocks: u32,
    chunk_bytes: usize,
    ahead: f64,
) -> Option<(BatchNormGeometry, u32)> {
    let mut geo = geo;
    geo.chunk_len = (chunk_bytes / element_bytes / geo.vector as usize).max(1) as u32;
    geo.chunks = geo.vectors.div_ceil(geo.chunk_len);
    let tasks = 2 * geo.features as u64 * geo.chunks as u64;
    if blocks == 0 || tasks > i32::MAX as u64 {
        return None;
    }
    // After the first features, `2 * lookahead * chunks` tasks lie between the last stats
    // task of a feature and its first apply task.
    let lookahead = (blocks as f64 * ahead / (2 * geo.chunks) as f64).ceil();
    Some((geo, (lookahead as u32).clamp(1, geo.features)))
}

/// The pipelined training pass of a rows problem ([`BatchNormPipelinedParams`]): its
/// kernel, a cooperative grid of as many blocks as fit the GPU at once, chunks of
/// [`PIPELINE_FWD_CHUNK_BYTES`] or [`PIPELINE_BWD_CHUNK_BYTES`] of input and the lookahead.
struct PipelinedPlan {
    kernel: &'static str,
    config: LaunchConfig,
    geo: BatchNormGeometry,
    lookahead: u32,
}

impl PipelinedPlan {
    /// The plan for `plan`'s problem where it takes the pipelined kernel: rows mapping, a
    /// counter word for each feature, and `x` of [`PIPELINE_MIN_BYTES`] or more, the
    /// plain forward or the backward (or wherever `OXIDNN_BN_PIPELINE=1`). The forward of
    /// any other epilogue (add, relu and its mask, blends: 80 registers, three blocks an
    /// SM) measured 6-8% slower than three launches (H100, f32 NCHW N = 32, 64x112x112
    /// and 256x56x56, 32 and 64 KB chunks), so it runs only when forced.
    fn of(gpu: &Gpu, dtype: DataType, plan: &Plan) -> Result<Option<Self>> {
        let features = plan.geo.features;
        let bytes = features as usize * plan.geo.red_len as usize * dtype.size_bytes();
        let chosen = match (pipelined_forced(), plan.pass) {
            (Some(on), _) => on,
            (None, Pass::Forward | Pass::ForwardMasked) => false,
            (None, Pass::ForwardPlain | Pass::Backward) => bytes >= PIPELINE_MIN_BYTES,
        };
        if plan.cols || features >= COUNTER_WORDS || !chosen {
            return Ok(None);
        }
        let kernel = match plan.pass {
            Pass::ForwardPlain => kernels::batch_norm_fwd_pipelined_plain_rows(dtype),
            Pass::Forward | Pass::ForwardMasked => kernels::batch_norm_fwd_pipelined_rows(dtype),
            Pass::Backward => kernels::batch_norm_bwd_pipelined_rows(dtype),
        }
        .ok_or_else(|| unsupported_dtype(dtype))?;
        let (per_sm, threads) = best_block(gpu, kernel, 0)?;
        let blocks = per_sm as u32 * gpu.sm_count;
        let inputs = if plan.pass == Pass::Backward { 2 } else { 1 };
        let chunk_bytes = (pipelined_chunk_bytes(plan.pass) / inputs).max(PIPELINE_MIN_CHUNK_BYTES);
        let split = pipelined_split(
            plan.geo,
            dtype.size_bytes(),
            blocks,
            chunk_bytes,
            pipelined_ahead_grids(),
        );
        let Some((geo, lookahead)) = split else {
            return Ok(None);
        };
        let config = LaunchConfig {
            grid: blocks,
            grid_y: 1,
            block: threads,
            shared_bytes: 0,
        };
        Ok(Some(Self {
            kernel,
            config,
            geo,
            lookahead,
        }))
    }

    /// The kernel's parameters: the three-launch path's apply and finalize parameters on
    /// this plan's geometry and chunks.
    fn params(
        &self,
        mut apply: BatchNormApplyParams,
        mut finalize: BatchNormFinalizeParams,
    ) -> BatchNormPipelinedParams {
        apply.geo = self.geo;
        finalize.chunks = self.geo.chunks;
        BatchNormPipelinedParams {
            fused: BatchNormFusedParams { apply, finalize },
            lookahead: self.lookahead,
            _pad: [0; 3],
        }
    }
}

fn stats_kernel(cols: bool, dtype: DataType, forward: bool) -> Result<&'static str> {
    let k = match (forward, cols) {
        (true, false) => kernels::batch_norm_fwd_stats_rows(dtype),
        (true, true) => kernels::batch_norm_fwd_stats_cols(dtype),
        (false, false) => kernels::batch_norm_bwd_stats_rows(dtype),
        (false, true) => kernels::batch_norm_bwd_stats_cols(dtype),
    };
    k.ok_or_else(|| unsupported_dtype(dtype))
}

fn resident_kernel(dtype: DataType, forward: bool) -> Result<&'static str> {
    let k = if forward {
        kernels::batch_norm_fwd_resident_cols(dtype)
    } else {
        kernels::batch_norm_bwd_resident_cols(dtype)
    };
    k.ok_or_else(|| unsupported_dtype(dtype))
}

fn fused_kernel(dtype: DataType, forward: bool) -> Result<&'static str> {
    let k = if forward {
        kernels::batch_norm_fwd_fused_rows(dtype)
    } else {
        kernels::batch_norm_bwd_fused_rows(dtype)
    };
    k.ok_or_else(|| unsupported_dtype(dtype))
}

fn staged_kernel(dtype: DataType, masked: bool) -> Result<&'static str> {
    let k = match masked {
        false => kernels::batch_norm_fwd_staged_rows(dtype),
        true => kernels::batch_norm_fwd_staged_masked_rows(dtype),
    };
    k.ok_or_else(|| unsupported_dtype(dtype))
}

/// The masked staged forward's unrolled kernel, where `dtype` has one (f32).
fn staged_unrolled_kernel(dtype: DataType) -> Option<&'static str> {
    kernels::batch_norm_fwd_staged_masked_unrolled_rows(dtype)
}

fn apply_kernel(cols: bool, dtype: DataType, pass: Pass) -> Result<&'static str> {
    let k = match (pass, cols) {
        (Pass::Forward | Pass::ForwardPlain, false) => kernels::batch_norm_fwd_apply_rows(dtype),
        (Pass::Forward, true) => kernels::batch_norm_fwd_apply_cols(dtype),
        (Pass::ForwardPlain, true) => kernels::batch_norm_fwd_apply_plain_cols(dtype),
        (Pass::ForwardMasked, false) => kernels::batch_norm_fwd_apply_masked_rows(dtype),
        (Pass::ForwardMasked, true) => kernels::batch_norm_fwd_apply_masked_cols(dtype),
        (Pass::Backward, false) => kernels::batch_norm_bwd_apply_rows(dtype),
        (Pass::Backward, true) => kernels::batch_norm_bwd_apply_cols(dtype),
    };
    k.ok_or_else(|| unsupported_dtype(dtype))
}

impl Plan {
    fn stats_config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: self.blocks,
            grid_y: 1,
            block: self.stats_threads,
            shared_bytes: if self.cols { BN_COLS_SHARED_BYTES } else { 0 },
        }
    }

    fn apply_config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: self.apply_blocks,
            grid_y: 1,
            block: self.apply_threads,
            shared_bytes: 0,
        }
    }

    fn finalize_config(&self) -> Result<LaunchConfig> {
        LaunchConfig::for_threads(
            self.geo.features as u64 * BN_FINALIZE_THREADS_PER_FEATURE as u64,
            BN_BLOCK_THREADS,
        )
    }

    fn finalize_params(&self, flags: u32, epsilon: f64) -> BatchNormFinalizeParams {
        BatchNormFinalizeParams {
            features: self.geo.features,
            chunks: self.geo.chunks,
            flags,
            epsilon,
            feat: self.geo.feat,
            ..Default::default()
        }
    }

    fn stats_kernel(&self, dtype: DataType, forward: bool) -> Result<&'static str> {
        stats_kernel(self.cols, dtype, forward)
    }

    fn apply_kernel(&self, dtype: DataType) -> Result<&'static str> {
        apply_kernel(self.cols, dtype, self.pass)
    }
}

fn unsupported_dtype(dtype: DataType) -> Error {
    Error::unsupported(format!("batch normalization of {dtype} tensors on the GPU"))
}

/// The workspace, checked against the layout; its device address.
fn workspace_ptr(gpu: &Gpu, layout: &WorkspaceLayout, workspace: &mut Buffer) -> Result<u64> {
    if workspace.len_bytes() < layout.total {
        return Err(Error::WorkspaceTooSmall {
            required_bytes: layout.total,
            got_bytes: workspace.len_bytes(),
        });
    }
    device_ptr_mut(gpu, workspace)
}

/// Workspace bytes [`batch_norm_forward_training`] needs for data `x_desc`
/// (cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize). 0 on the CPU handle.
pub fn batch_norm_forward_training_workspace_size(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    x_desc: &TensorDescriptor,
) -> Result<usize> {
    check_rank("x_desc", x_desc)?;
    match &handle.backend {
        Backend::Gpu(gpu) => {
            let occ = Occupancy::of(gpu, bn.mode, x_desc, Pass::Forward)?;
            Ok(workspace_layout(bn.mode, x_desc, occ, false).total)
        }
        Backend::Cpu => Ok(0),
    }
}

/// Workspace bytes [`batch_norm_backward`] needs for data `x_desc`
/// (cudnnGetBatchNormalizationBackwardExWorkspaceSize). 0 on the CPU handle.
pub fn batch_norm_backward_workspace_size(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    x_desc: &TensorDescriptor,
) -> Result<usize> {
    check_rank("x_desc", x_desc)?;
    match &handle.backend {
        Backend::Gpu(gpu) => {
            let occ = Occupancy::of(gpu, bn.mode, x_desc, Pass::Backward)?;
            Ok(workspace_layout(bn.mode, x_desc, occ, true).total)
        }
        Backend::Cpu => Ok(0),
    }
}

/// Bytes of the training reserve space for data `x_desc`
/// (cudnnGetBatchNormalizationTrainingExReserveSpaceSize): with a relu in `bn`'s ops, the
/// relu mask, a bit per element of `x`'s span that [`batch_norm_forward_training`] writes
/// and [`batch_norm_backward`] reads instead of `y` (on the GPU; the CPU handle reads `y`
/// and leaves the reserve space alone); 0 without a relu.
pub fn batch_norm_training_reserve_space_size(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    x_desc: &TensorDescriptor,
) -> Result<usize> {
    let _ = handle;
    check_rank("x_desc", x_desc)?;
    Ok(match bn.ops {
        BatchNormOps::Bn => 0,
        _ => relu_mask_bytes(x_desc),
    })
}

/// The relu mask's bytes: a bit per element of `x`'s span, in whole 32-bit words.
fn relu_mask_bytes(x_desc: &TensorDescriptor) -> usize {
    x_desc.span_elements().div_ceil(32) * 4
}

/// Checks a reserve space given to a training pass: this handle's, and large enough for
/// the relu mask where the ops have a relu.
fn check_reserve(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    x_desc: &TensorDescriptor,
    reserve: Option<&Buffer>,
) -> Result<()> {
    let Some(r) = reserve else {
        return Ok(());
    };
    handle.check_owner("reserve", r)?;
    let required = batch_norm_training_reserve_space_size(handle, bn, x_desc)?;
    if r.len_bytes() < required {
        return Err(Error::BufferTooSmall {
            arg: "reserve",
            required_bytes: required,
            got_bytes: r.len_bytes(),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Forward training
// ---------------------------------------------------------------------------------------

/// Forward training (cudnnBatchNormalizationForwardTraining, and ForwardTrainingEx with
/// the descriptor's fused ops):
/// `y = alpha * act(scale * (x - mean) / sqrt(var + epsilon) + bias [+ z]) + beta * y`
/// with the batch mean and biased variance of each feature. `z` is given exactly for
/// [`BatchNormOps::BnAddActivation`]. `running` (optional) is updated, `saved` (optional)
/// receives the batch mean and inverse std for [`batch_norm_backward`]. `y` is not read
/// when `beta == 0`. Each feature needs at least two values. `reserve` (optional, of
/// [`batch_norm_training_reserve_space_size`] bytes; cuDNN's reserve space) receives the
/// relu mask for a backward given the same reserve space and descriptors.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_forward_training(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    alpha: f64,
    beta: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    z: Option<(&TensorDescriptor, &Buffer)>,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    bn_desc: &TensorDescriptor,
    scale: &Buffer,
    bias: &Buffer,
    running: Option<RunningStats<'_>>,
    saved: Option<SavedStats<'_>>,
    workspace: &mut Buffer,
    reserve: Option<&mut Buffer>,
) -> Result<()> {
    check_rank("x_desc", x_desc)?;
    check_like_x("y_desc", x_desc, y_desc, true)?;
    check_presence(
        "z",
        bn.ops == BatchNormOps::BnAddActivation,
        &z,
        "BnAddActivation",
    )?;
    if let Some((z_desc, _)) = z {
        check_like_x("z_desc", x_desc, z_desc, false)?;
    }
    check_params_desc(x_desc, bn.mode, bn_desc)?;
    check_training_len(bn.mode, x_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    if let Some((z_desc, zb)) = z {
        handle.check_tensor("z", z_desc, zb)?;
    }
    check_param_buffers(handle, bn_desc, &[("scale", scale), ("bias", bias)])?;
    if let Some(r) = &running {
        check_factor(r.factor)?;
        check_param_buffers(
            handle,
            bn_desc,
            &[("running_mean", r.mean), ("running_var", r.variance)],
        )?;
    }
    if let Some(s) = &saved {
        check_param_buffers(
            handle,
            bn_desc,
            &[("saved_mean", s.mean), ("saved_inv_std", s.inv_std)],
        )?;
    }
    handle.check_owner("workspace", workspace)?;
    check_reserve(handle, bn, x_desc, reserve.as_deref())?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let zt = z.map(|(d, b)| host_read(d, b)).transpose()?;
            let mut yt = host_read(y_desc, y)?;
            let (st, bt) = (host_read(bn_desc, scale)?, host_read(bn_desc, bias)?);
            let mut run = running
                .as_ref()
                .map(|r| {
                    Ok::<_, Error>((host_read(bn_desc, r.mean)?, host_read(bn_desc, r.variance)?))
                })
                .transpose()?;
            let mut sav = saved
                .as_ref()
                .map(|s| {
                    Ok::<_, Error>((host_read(bn_desc, s.mean)?, host_read(bn_desc, s.inv_std)?))
                })
                .transpose()?;
            let factor = running.as_ref().map_or(0.0, |r| r.factor);
            reference::forward_training(
                bn.mode,
                bn.ops,
                alpha,
                beta,
                &xt,
                zt.as_ref(),
                &mut yt,
                &st,
                &bt,
                bn.epsilon,
                run.as_mut().map(|(m, v)| (factor, m, v)),
                sav.as_mut().map(|(m, s)| (m, s)),
            );
            host_write(&yt, y)?;
            if let (Some(r), Some((m, v))) = (running, run) {
                host_write(&m, r.mean)?;
                host_write(&v, r.variance)?;
            }
            if let (Some(s), Some((m, i))) = (saved, sav) {
                host_write(&m, s.mean)?;
                host_write(&i, s.inv_std)?;
            }
            Ok(())
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let relu_mask = match reserve {
                Some(r) if bn.ops != BatchNormOps::Bn => device_ptr_mut(gpu, r)?,
                _ => 0,
            };
            let pass = Pass::forward_of(bn, alpha32, beta32, relu_mask != 0);
            let occ = Occupancy::of(gpu, bn.mode, x_desc, pass)?;
            // The same layout as the size query's: the apply kernel does not change it.
            let layout = workspace_layout(bn.mode, x_desc, occ, false);
            let ws = workspace_ptr(gpu, &layout, workspace)?;
            let x_ptr = device_ptr(gpu, x)?;
            let z_ptr = z.map(|(_, b)| device_ptr(gpu, b)).transpose()?;
            let y_ptr = device_ptr_mut(gpu, y)?;
            let mut operands: Operands<'_> = [None; COUNT];
            operands[X] = Some((x_desc, x_ptr));
            operands[Y] = Some((y_desc, y_ptr));
            operands[Z_OR_DY] = z.map(|(d, _)| d).zip(z_ptr);
            let plan = plan_problem(bn.mode, x_desc, bn_desc, &operands, occ)?;
            let (partials, coef) = (ws + layout.partials as u64, ws + layout.coef as u64);
            let mut flags = 0;
            let mut ptrs = [0u64; 4]; // running mean, running var, saved mean, saved inv std
            let mut factor = 0.0;
            if let Some(r) = running {
                flags |= bn_flags::RUNNING;
                if r.factor == 1.0 {
                    flags |= bn_flags::RUNNING_OVERWRITE;
                }
                factor = r.factor;
                ptrs[0] = device_ptr_mut(gpu, r.mean)?;
                ptrs[1] = device_ptr_mut(gpu, r.variance)?;
            }
            if let Some(s) = saved {
                flags |= bn_flags::SAVED;
                ptrs[2] = device_ptr_mut(gpu, s.mean)?;
                ptrs[3] = device_ptr_mut(gpu, s.inv_std)?;
            }
            let (scale_ptr, bias_ptr) = (device_ptr(gpu, scale)?, device_ptr(gpu, bias)?);
            // The one-launch kernels' pointers: the data, then the per-feature tensors.
            let one_launch = [
                x_ptr,
                z_ptr.unwrap_or(0),
                y_ptr,
                scale_ptr,
                bias_ptr,
                ptrs[0],
                ptrs[1],
                ptrs[2],
                ptrs[3],
            ];
            if let Some((kernel, config)) = plan.fused.forward(gpu, dtype)? {
                let fused = &plan.fused;
                let mut fp = plan.finalize_params(flags, bn.epsilon);
                fp.chunks = 1;
                fp.factor = factor;
                let mut ap = apply_params(&plan, bn, alpha32, beta32, 0, relu_mask);
                ap.geo = fused.geo;
                let params = BatchNormFusedParams {
                    apply: ap,
                    finalize: fp,
                };
                // SAFETY: as for the stats, finalize and apply launches below together:
                // x, z (with ADD) and y hold their descriptors' spans, which the
                // geometry's offsets stay inside; the per-feature pointers cover bn_desc's
                // span (checked), the running and saved ones used only with their flags.
                // A staged launch has shared memory for the feature's vectors, of 4 bytes
                // or more (`FusedPlan::forward`).
                return unsafe { gpu.launch(kernel, config, &params, &one_launch) };
            }
            if let Some(pipelined) = PipelinedPlan::of(gpu, dtype, &plan)? {
                let mut fp = plan.finalize_params(flags, bn.epsilon);
                fp.factor = factor;
                let ap = apply_params(&plan, bn, alpha32, beta32, 0, relu_mask);
                let params = pipelined.params(ap, fp);
                let pointers = [&one_launch[..], &[partials, coef, gpu.counters()?]].concat();
                // SAFETY: as for the stats, finalize and apply launches below together; the
                // partials region holds pipelined_chunks_bound * features >= chunks *
                // features entries (the chunks are at least PIPELINE_MIN_CHUNK_BYTES); the
                // counter state has a word for each feature and one more, 0 between
                // launches, which the handle's stream orders; the launch is cooperative.
                return unsafe {
                    gpu.launch_cooperative(pipelined.kernel, pipelined.config, &params, &pointers)
                };
            }
            if let Some(resident) = plan_resident(gpu, (dtype, true), &plan, &occ, 16)? {
                let mut fp = plan.finalize_params(flags, bn.epsilon);
                fp.factor = factor;
                let ap = apply_params(&plan, bn, alpha32, beta32, 0, relu_mask);
                let params = resident.params(ap, fp);
                let pointers = [&one_launch[..], &[partials, coef]].concat();
                // SAFETY: as for the stats, finalize and apply launches below together.
                return unsafe { resident.launch(gpu, (dtype, true), &params, &pointers) };
            }
            stats_forward(gpu, &plan, dtype, x_ptr, partials)?;
            let mut fp = plan.finalize_params(flags, bn.epsilon);
            fp.factor = factor;
            // SAFETY: the partials were written by the stats launch above (same stream);
            // every per-feature pointer covers bn_desc's span (checked), which the
            // PARAM offsets of the feature map stay inside; coef holds `features` entries.
            unsafe {
                gpu.launch(
                    kernels::BATCH_NORM_FWD_FINALIZE,
                    plan.finalize_config()?,
                    &fp,
                    &[
                        partials, scale_ptr, bias_ptr, ptrs[0], ptrs[1], ptrs[2], ptrs[3], coef,
                    ],
                )?;
            }
            let ap = apply_params(&plan, bn, alpha32, beta32, 0, relu_mask);
            let kernel = plan.apply_kernel(dtype)?;
            // SAFETY: x, z (with ADD) and y hold their descriptors' spans (checked), which
            // the geometry's offsets stay inside; coef was written by the finalize launch;
            // the relu mask (if any) holds a bit per element of x's span (checked).
            unsafe {
                gpu.launch(
                    kernel,
                    plan.apply_config(),
                    &ap,
                    &[x_ptr, z_ptr.unwrap_or(0), y_ptr, coef, 0, 0, 0, 0],
                )
            }
        }
    }
}

/// Flags, blend factors and relu mask (device address or 0) of an apply pass.
fn apply_params(
    plan: &Plan,
    bn: &BatchNormDescriptor,
    alpha: f32,
    beta: f32,
    extra_flags: u32,
    relu_mask: u64,
) -> BatchNormApplyParams {
    let mut flags = extra_flags;
    if bn.ops == BatchNormOps::BnAddActivation {
        flags |= bn_flags::ADD;
    }
    if bn.ops != BatchNormOps::Bn {
        flags |= bn_flags::RELU;
    }
    if plan.cols && apply_rows_interleaved() {
        flags |= bn_flags::INTERLEAVE_ROWS;
    }
    BatchNormApplyParams {
        geo: plan.apply_geo,
        flags,
        alpha,
        beta,
        epsilon: bn.epsilon as f32,
        relu_mask,
    }
}

/// The forward stats pass over `x` into the partials.
fn stats_forward(gpu: &Gpu, plan: &Plan, dtype: DataType, x: u64, partials: u64) -> Result<()> {
    let sp = BatchNormStatsParams {
        geo: plan.geo,
        ..Default::default()
    };
    let kernel = plan.stats_kernel(dtype, true)?;
    // SAFETY: x holds its descriptor's span, which the geometry's offsets stay inside;
    // the partials region holds max_chunks * features >= chunks * features entries.
    unsafe { gpu.launch(kernel, plan.stats_config(), &sp, &[x, partials]) }
}

// ---------------------------------------------------------------------------------------
// Forward inference
// ---------------------------------------------------------------------------------------

/// Forward inference (cudnnBatchNormalizationForwardInference; the descriptor's fused ops
/// as cudnnNormalizationForwardInference takes them):
/// `y = alpha * act(scale * (x - mean) / sqrt(var + epsilon) + bias [+ z]) + beta * y`
/// with the estimated mean and variance.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_forward_inference(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    alpha: f64,
    beta: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    z: Option<(&TensorDescriptor, &Buffer)>,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    bn_desc: &TensorDescriptor,
    scale: &Buffer,
    bias: &Buffer,
    estimated: EstimatedStats<'_>,
) -> Result<()> {
    check_rank("x_desc", x_desc)?;
    check_like_x("y_desc", x_desc, y_desc, true)?;
    check_presence(
        "z",
        bn.ops == BatchNormOps::BnAddActivation,
        &z,
        "BnAddActivation",
    )?;
    if let Some((z_desc, _)) = z {
        check_like_x("z_desc", x_desc, z_desc, false)?;
    }
    check_params_desc(x_desc, bn.mode, bn_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    if let Some((z_desc, zb)) = z {
        handle.check_tensor("z", z_desc, zb)?;
    }
    check_param_buffers(
        handle,
        bn_desc,
        &[
            ("scale", scale),
            ("bias", bias),
            ("estimated_mean", estimated.mean),
            ("estimated_variance", estimated.variance),
        ],
    )?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = host_read(x_desc, x)?;
            let zt = z.map(|(d, b)| host_read(d, b)).transpose()?;
            let mut yt = host_read(y_desc, y)?;
            let p = |b: &Buffer| host_read(bn_desc, b);
            reference::forward_inference(
                bn.mode,
                bn.ops,
                alpha,
                beta,
                &xt,
                zt.as_ref(),
                &mut yt,
                &p(scale)?,
                &p(bias)?,
                &p(estimated.mean)?,
                &p(estimated.variance)?,
                bn.epsilon,
            );
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let x_ptr = device_ptr(gpu, x)?;
            let z_ptr = z.map(|(_, b)| device_ptr(gpu, b)).transpose()?;
            let y_ptr = device_ptr_mut(gpu, y)?;
            let mut operands: Operands<'_> = [None; COUNT];
            operands[X] = Some((x_desc, x_ptr));
            operands[Y] = Some((y_desc, y_ptr));
            operands[Z_OR_DY] = z.map(|(d, _)| d).zip(z_ptr);
            let pass = Pass::forward_of(bn, alpha32, beta32, false);
            let occ = Occupancy::of(gpu, bn.mode, x_desc, pass)?;
            let plan = plan_problem(bn.mode, x_desc, bn_desc, &operands, occ)?;
            let ap = apply_params(&plan, bn, alpha32, beta32, bn_flags::COEF_FROM_PARAMS, 0);
            let kernel = plan.apply_kernel(dtype)?;
            let params = [scale, bias, estimated.mean, estimated.variance]
                .map(|b| device_ptr(gpu, b))
                .into_iter()
                .collect::<Result<Vec<u64>>>()?;
            // SAFETY: x, z (with ADD), y and the four per-feature tensors hold their
            // descriptors' spans (checked), which the geometry's offsets stay inside.
            unsafe {
                gpu.launch(
                    kernel,
                    plan.apply_config(),
                    &ap,
                    &[
                        x_ptr,
                        z_ptr.unwrap_or(0),
                        y_ptr,
                        0,
                        params[0],
                        params[1],
                        params[2],
                        params[3],
                    ],
                )
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------

/// Backward (cudnnBatchNormalizationBackward, and BackwardEx with the descriptor's fused
/// ops). With `g = dy` (behind a relu: `dy` where `y > 0`, else 0), `xhat` the normalized
/// input and `m` the elements per feature:
///
/// * `dscale = alpha_param * sum(g xhat) + beta_param * dscale`,
///   `dbias = alpha_param * sum(g) + beta_param * dbias`;
/// * `dx = alpha_data * scale / sqrt(var + eps) * (g - sum(g) / m - xhat sum(g xhat) / m)
///   + beta_data * dx`;
/// * with [`BatchNormOps::BnAddActivation`], `dz = alpha_data * g + beta_data * dz`.
///
/// `y` (the forward output) is given exactly when the ops have the relu, `dz` exactly for
/// the add. The statistics come from `saved` when given, else are recomputed from `x`.
/// Outputs are not read when their beta is 0. `reserve` (optional) is the reserve space
/// the forward training pass filled with the same descriptors: behind a relu, its mask
/// is read instead of `y`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward(
    handle: &Handle,
    bn: &BatchNormDescriptor,
    alpha_data: f64,
    beta_data: f64,
    alpha_param: f64,
    beta_param: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    y: Option<(&TensorDescriptor, &Buffer)>,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    dz: Option<(&TensorDescriptor, &mut Buffer)>,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
    bn_desc: &TensorDescriptor,
    scale: &Buffer,
    dscale: &mut Buffer,
    dbias: &mut Buffer,
    saved: Option<SavedStatsRef<'_>>,
    workspace: &mut Buffer,
    reserve: Option<&Buffer>,
) -> Result<()> {
    check_rank("x_desc", x_desc)?;
    check_like_x("dy_desc", x_desc, dy_desc, false)?;
    check_like_x("dx_desc", x_desc, dx_desc, true)?;
    check_presence("y", bn.ops != BatchNormOps::Bn, &y, "a fused relu")?;
    check_presence(
        "dz",
        bn.ops == BatchNormOps::BnAddActivation,
        &dz,
        "BnAddActivation",
    )?;
    if let Some((y_desc, _)) = y {
        check_like_x("y_desc", x_desc, y_desc, false)?;
    }
    if let Some((dz_desc, _)) = &dz {
        check_like_x("dz_desc", x_desc, dz_desc, true)?;
    }
    check_params_desc(x_desc, bn.mode, bn_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    if let Some((y_desc, yb)) = y {
        handle.check_tensor("y", y_desc, yb)?;
    }
    if let Some((dz_desc, dzb)) = &dz {
        handle.check_tensor("dz", dz_desc, dzb)?;
    }
    check_param_buffers(
        handle,
        bn_desc,
        &[("scale", scale), ("dscale", dscale), ("dbias", dbias)],
    )?;
    if let Some(s) = &saved {
        check_param_buffers(
            handle,
            bn_desc,
            &[("saved_mean", s.mean), ("saved_inv_std", s.inv_std)],
        )?;
    }
    handle.check_owner("workspace", workspace)?;
    check_reserve(handle, bn, x_desc, reserve)?;
    let alpha_d = scale_factor("alpha_data", alpha_data)?;
    let beta_d = scale_factor("beta_data", beta_data)?;
    let alpha_p = scale_factor("alpha_param", alpha_param)?;
    let beta_p = scale_factor("beta_param", beta_param)?;
    match &handle.backend {
        Backend::Cpu => {
            let read = |d: &TensorDescriptor, b: &Buffer| host_read(d, b);
            let xt = read(x_desc, x)?;
            let yt = y.map(|(d, b)| read(d, b)).transpose()?;
            let dyt = read(dy_desc, dy)?;
            let mut dxt = read(dx_desc, dx)?;
            let mut dzt = dz.as_ref().map(|(d, b)| read(d, b)).transpose()?;
            let st = read(bn_desc, scale)?;
            let (mut dst, mut dbt) = (read(bn_desc, dscale)?, read(bn_desc, dbias)?);
            let sav: Option<(HostTensor, HostTensor)> = saved
                .map(|s| Ok::<_, Error>((read(bn_desc, s.mean)?, read(bn_desc, s.inv_std)?)))
                .transpose()?;
            reference::backward(
                bn.mode,
                bn.ops,
                (alpha_data, beta_data),
                (alpha_param, beta_param),
                &xt,
                yt.as_ref(),
                &dyt,
                reference::DataGrads {
                    dx: &mut dxt,
                    dz: dzt.as_mut(),
                },
                &st,
                reference::ParamGrads {
                    dscale: &mut dst,
                    dbias: &mut dbt,
                },
                bn.epsilon,
                sav.as_ref().map(|(m, s)| (m, s)),
            );
            host_write(&dxt, dx)?;
            if let (Some((_, b)), Some(t)) = (dz, dzt) {
                host_write(&t, b)?;
            }
            host_write(&dst, dscale)?;
            host_write(&dbt, dbias)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let occ = Occupancy::of(gpu, bn.mode, x_desc, Pass::Backward)?;
            let layout = workspace_layout(bn.mode, x_desc, occ, true);
            let ws = workspace_ptr(gpu, &layout, workspace)?;
            let x_ptr = device_ptr(gpu, x)?;
            let y_ptr = y.map(|(_, b)| device_ptr(gpu, b)).transpose()?;
            let dy_ptr = device_ptr(gpu, dy)?;
            let dx_ptr = device_ptr_mut(gpu, dx)?;
            let (dz_desc, dz_ptr) = match dz {
                Some((d, b)) => (Some(d), Some(device_ptr_mut(gpu, b)?)),
                None => (None, None),
            };
            let mut operands: Operands<'_> = [None; COUNT];
            operands[X] = Some((x_desc, x_ptr));
            operands[Y] = y.map(|(d, _)| d).zip(y_ptr);
            operands[Z_OR_DY] = Some((dy_desc, dy_ptr));
            operands[DX] = Some((dx_desc, dx_ptr));
            operands[DZ] = dz_desc.zip(dz_ptr);
            let plan = plan_problem(bn.mode, x_desc, bn_desc, &operands, occ)?;
            let partials = ws + layout.partials as u64;
            // Behind a relu, the forward's mask in the reserve space instead of y.
            let relu_mask = match reserve {
                Some(r) if bn.ops != BatchNormOps::Bn => device_ptr(gpu, r)?,
                _ => 0,
            };
            let (fwd_coef, bwd_coef) = (ws + layout.coef as u64, ws + layout.bwd_coef as u64);
            let scale_ptr = device_ptr(gpu, scale)?;
            // The one-launch kernels' pointers (saved statistics only): the data, then the
            // per-feature tensors.
            let one_launch = match saved {
                Some(s) => Some([
                    x_ptr,
                    y_ptr.unwrap_or(0),
                    dy_ptr,
                    dx_ptr,
                    dz_ptr.unwrap_or(0),
                    scale_ptr,
                    device_ptr(gpu, s.mean)?,
                    device_ptr(gpu, s.inv_std)?,
                    device_ptr_mut(gpu, dscale)?,
                    device_ptr_mut(gpu, dbias)?,
                ]),
                None => None,
            };
            if let (Some(pointers), true) = (one_launch, plan.fused.usable) {
                let fused = &plan.fused;
                let mut fp = plan.finalize_params(0, bn.epsilon);
                fp.chunks = 1;
                fp.alpha = alpha_p;
                fp.beta = beta_p;
                let mut ap = apply_params(&plan, bn, alpha_d, beta_d, 0, relu_mask);
                ap.geo = fused.geo;
                let params = BatchNormFusedParams {
                    apply: ap,
                    finalize: fp,
                };
                // SAFETY: as for the stats, finalize and apply launches below together:
                // x, y (with RELU), dy, dx and dz (with ADD) hold their descriptors' spans;
                // the per-feature pointers cover bn_desc's span (checked).
                return unsafe {
                    gpu.launch(
                        fused_kernel(dtype, false)?,
                        fused.config(),
                        &params,
                        &pointers,
                    )
                };
            }
            // Saved statistics, rows mapping: the pipelined kernel where x is larger than L2.
            let pipelined = match one_launch {
                Some(_) => PipelinedPlan::of(gpu, dtype, &plan)?,
                None => None,
            };
            if let (Some(one_launch), Some(pipelined)) = (one_launch, pipelined) {
                let mut fp = plan.finalize_params(0, bn.epsilon);
                fp.alpha = alpha_p;
                fp.beta = beta_p;
                let ap = apply_params(&plan, bn, alpha_d, beta_d, 0, relu_mask);
                let params = pipelined.params(ap, fp);
                let sync = [partials, bwd_coef, gpu.counters()?];
                let pointers = [&one_launch[..], &sync].concat();
                // SAFETY: as for the stats, finalize and apply launches below together, and
                // as for the forward's pipelined launch.
                return unsafe {
                    gpu.launch_cooperative(pipelined.kernel, pipelined.config, &params, &pointers)
                };
            }
            // Saved statistics: the resident kernel where it keeps enough on chip (x and
            // the gradient reaching the normalization: dy, masked behind a relu; the
            // relu mask's word of each vector, which arrives with them).
            let stash_bytes = match relu_mask {
                0 => 32,
                _ => 36,
            };
            let resident = match one_launch {
                Some(_) => plan_resident(gpu, (dtype, false), &plan, &occ, stash_bytes)?,
                None => None,
            };
            if let (Some(one_launch), Some(resident)) = (one_launch, resident) {
                let mut fp = plan.finalize_params(0, bn.epsilon);
                fp.alpha = alpha_p;
                fp.beta = beta_p;
                // dz = g exactly (blend 1, 0): the kernel's sums store it, and its apply
                // reads g from dz for the rows not on chip.
                let write_grad = match bn.ops == BatchNormOps::BnAddActivation
                    && alpha_data == 1.0
                    && beta_data == 0.0
                {
                    true => bn_flags::WRITE_GRAD,
                    false => 0,
                };
                let ap = apply_params(&plan, bn, alpha_d, beta_d, write_grad, relu_mask);
                let params = resident.params(ap, fp);
                let pointers = [&one_launch[..], &[partials, bwd_coef]].concat();
                // SAFETY: as for the stats, finalize and apply launches below together.
                return unsafe { resident.launch(gpu, (dtype, false), &params, &pointers) };
            }
            let mut flags = 0;
            let (saved_mean, saved_inv) = match saved {
                Some(s) => (device_ptr(gpu, s.mean)?, device_ptr(gpu, s.inv_std)?),
                None => {
                    // Recompute the statistics: mean and inverse std into the forward
                    // coefficients.
                    flags |= bn_flags::STATS_IN_WORKSPACE;
                    stats_forward(gpu, &plan, dtype, x_ptr, partials)?;
                    let fp = plan.finalize_params(0, bn.epsilon);
                    // SAFETY: as in forward training; bias is null (its coefficient is
                    // not needed) and no running or saved output is written.
                    unsafe {
                        gpu.launch(
                            kernels::BATCH_NORM_FWD_FINALIZE,
                            plan.finalize_config()?,
                            &fp,
                            &[partials, scale_ptr, 0, 0, 0, 0, 0, fwd_coef],
                        )?;
                    }
                    (0, 0)
                }
            };
            if bn.ops != BatchNormOps::Bn {
                flags |= bn_flags::RELU;
            }
            // dz = g exactly (blend 1, 0): the stats pass stores it, and the apply pass
            // reads g from dz (laid out as dy) instead of dy and y.
            let grad_in_dz = alpha_data == 1.0
                && beta_data == 0.0
                && dz_desc.is_some_and(|d| d.strides() == dy_desc.strides());
            if grad_in_dz {
                flags |= bn_flags::WRITE_GRAD;
            }
            let sp = BatchNormStatsParams {
                geo: plan.geo,
                flags,
                _pad: 0,
                relu_mask,
            };
            let kernel = plan.stats_kernel(dtype, false)?;
            let grad_ptr = if grad_in_dz { dz_ptr.unwrap_or(0) } else { 0 };
            // SAFETY: x, y (with RELU), dy and dz (with WRITE_GRAD, laid out as dy) hold
            // their descriptors' spans (checked); the mean comes from the coefficients
            // written above or from saved_mean (bn_desc's span, checked); the partials
            // region is large enough.
            unsafe {
                gpu.launch(
                    kernel,
                    plan.stats_config(),
                    &sp,
                    &[
                        x_ptr,
                        y_ptr.unwrap_or(0),
                        dy_ptr,
                        grad_ptr,
                        fwd_coef,
                        saved_mean,
                        partials,
                    ],
                )?;
            }
            let mut fp = plan.finalize_params(flags, bn.epsilon);
            fp.alpha = alpha_p;
            fp.beta = beta_p;
            let (dscale_ptr, dbias_ptr) =
                (device_ptr_mut(gpu, dscale)?, device_ptr_mut(gpu, dbias)?);
            // SAFETY: the partials come from the launch above (same stream); the
            // per-feature pointers cover bn_desc's span (checked); bwd_coef holds
            // `features` entries.
            unsafe {
                gpu.launch(
                    kernels::BATCH_NORM_BWD_FINALIZE,
                    plan.finalize_config()?,
                    &fp,
                    &[
                        partials, scale_ptr, saved_mean, saved_inv, fwd_coef, dscale_ptr,
                        dbias_ptr, bwd_coef,
                    ],
                )?;
            }
            let (ap, grads) = if grad_in_dz {
                // Plain backward on g (already masked, dz already written).
                let plain = BatchNormDescriptor {
                    ops: BatchNormOps::Bn,
                    ..*bn
                };
                (apply_params(&plan, &plain, alpha_d, beta_d, 0, 0), grad_ptr)
            } else {
                (
                    apply_params(&plan, bn, alpha_d, beta_d, 0, relu_mask),
                    dy_ptr,
                )
            };
            let kernel = plan.apply_kernel(dtype)?;
            // SAFETY: x, y (with RELU), dy (or dz holding g, laid out as dy), dx and dz
            // (with ADD) hold their descriptors' spans (checked); bwd_coef was written by
            // the finalize launch.
            unsafe {
                gpu.launch(
                    kernel,
                    plan.apply_config(),
                    &ap,
                    &[
                        x_ptr,
                        y_ptr.unwrap_or(0),
                        grads,
                        dx_ptr,
                        dz_ptr.unwrap_or(0),
                        bwd_coef,
                    ],
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: Occupancy = Occupancy {
        pass: Pass::Forward,
        sms: 132,
        stats: 4,
        stats_threads: 256,
        apply: 5,
        apply_threads: 128,
        resident: 2,
    };

    fn fake_ops<'a>(descs: &[(usize, &'a TensorDescriptor)]) -> Operands<'a> {
        let mut ops: Operands<'a> = [None; COUNT];
        for &(slot, d) in descs {
            ops[slot] = Some((d, 256));
        }
        ops
    }

    #[test]
    fn nchw_spatial_takes_the_rows_mapping_with_vectors() {
        let x = TensorDescriptor::nchw(DataType::F32, 32, 64, 112, 112).unwrap();
        let p = derive_batch_norm_descriptor(&x, BatchNormMode::Spatial).unwrap();
        let plan = plan_problem(
            BatchNormMode::Spatial,
            &x,
            &p,
            &fake_ops(&[(X, &x), (Y, &x)]),
            H100,
        )
        .unwrap();
        assert!(!plan.cols);
        assert_eq!(plan.geo.vector, 4);
        assert_eq!(plan.geo.features, 64);
        assert_eq!(plan.geo.red_len, 32 * 112 * 112);
        assert!(plan.blocks >= 132 * 3 && plan.blocks <= 132 * 4);
    }

    #[test]
    fn nhwc_spatial_takes_the_cols_mapping_and_odd_widths_go_scalar() {
        let x = TensorDescriptor::nhwc(DataType::F16, 32, 256, 56, 56).unwrap();
        let p = derive_batch_norm_descriptor(&x, BatchNormMode::Spatial).unwrap();
        let plan = plan_problem(
            BatchNormMode::Spatial,
            &x,
            &p,
            &fake_ops(&[(X, &x), (Y, &x)]),
            H100,
        )
        .unwrap();
        assert!(plan.cols);
        assert_eq!((plan.geo.vector, plan.geo.tile_vectors), (8, 32));
        let odd = TensorDescriptor::nhwc(DataType::F16, 2, 3, 5, 7).unwrap();
        let p = derive_batch_norm_descriptor(&odd, BatchNormMode::Spatial).unwrap();
        let plan = plan_problem(
            BatchNormMode::Spatial,
            &odd,
            &p,
            &fake_ops(&[(X, &odd), (Y, &odd)]),
            H100,
        )
        .unwrap();
        assert!(plan.cols);
        assert_eq!((plan.geo.vector, plan.geo.tile_vectors), (1, 4));
    }

    #[test]
    fn chunks_never_exceed_the_workspace_bound() {
        for (dims, mode) in [
            ([32usize, 64, 112, 112], BatchNormMode::Spatial),
            ([32, 2048, 7, 7], BatchNormMode::Spatial),
            ([3, 5, 7, 11], BatchNormMode::PerActivation),
            ([1000, 3, 2, 2], BatchNormMode::PerActivation),
        ] {
            for layout in [crate::Layout::ChannelsFirst, crate::Layout::ChannelsLast] {
                for dt in [DataType::F32, DataType::F16] {
                    let [n, c, h, w] = dims;
                    let x = TensorDescriptor::nchw_with(dt, n, c, h, w, layout).unwrap();
                    let p = derive_batch_norm_descriptor(&x, mode).unwrap();
                    let bound = H100.stats_chunks(mode, &x);
                    for addr in [256u64, 2] {
                        let mut ops = fake_ops(&[(X, &x), (Y, &x)]);
                        ops[Y] = Some((&x, addr));
                        let plan = plan_problem(mode, &x, &p, &ops, H100).unwrap();
                        assert!(plan.geo.chunks as usize <= bound, "{x:?} {mode:?}");
                        let covered = plan.geo.chunks as usize * plan.geo.chunk_len as usize;
                        let units = if plan.cols {
                            plan.geo.red_len
                        } else {
                            plan.geo.vectors
                        };
                        assert!(covered >= units as usize);
                        assert!(covered - (plan.geo.chunk_len as usize) < units as usize);
                    }
                }
            }
        }
    }

    /// The pipelined passes' chunks stay within the workspace's partials (whatever chunk
    /// size it picks), cover each feature's vectors, and its lookahead puts at least the
    /// asked-for grids of tasks between a feature's stats and its apply (or every feature
    /// ahead, where there are too few).
    #[test]
    fn pipelined_chunks_fit_the_workspace_and_the_lookahead_covers_the_grid() {
        let mode = BatchNormMode::Spatial;
        for dims in [
            [32usize, 64, 112, 112],
            [32, 256, 56, 56],
            [5, 7, 11, 13],
            [2, 1, 3, 5],
        ] {
            for dt in [DataType::F32, DataType::F16] {
                let [n, c, h, w] = dims;
                let x = TensorDescriptor::nchw(dt, n, c, h, w).unwrap();
                let p = derive_batch_norm_descriptor(&x, mode).unwrap();
                let ops = fake_ops(&[(X, &x), (Y, &x)]);
                let plan = plan_problem(mode, &x, &p, &ops, H100).unwrap();
                assert!(!plan.cols);
                let bound = pipelined_chunks_bound(mode, &x);
                for chunk_bytes in [PIPELINE_MIN_CHUNK_BYTES, PIPELINE_BWD_CHUNK_BYTES, 64 << 10] {
                    for (blocks, ahead) in [(528, PIPELINE_AHEAD_GRIDS), (1056, 2.0), (1, 0.0)] {
                        let split =
                            pipelined_split(plan.geo, dt.size_bytes(), blocks, chunk_bytes, ahead);
                        let (geo, lookahead) = split.unwrap();
                        let what = format!("{x:?} {chunk_bytes} {blocks} {ahead}");
                        assert!(geo.chunks as usize <= bound, "{what}");
                        let covered = geo.chunks as usize * geo.chunk_len as usize;
                        assert!(covered >= geo.vectors as usize, "{what}");
                        assert!(
                            covered - (geo.chunk_len as usize) < geo.vectors as usize,
                            "{what}"
                        );
                        assert!((1..=geo.features).contains(&lookahead), "{what}");
                        let between = 2.0 * lookahead as f64 * geo.chunks as f64;
                        assert!(
                            lookahead == geo.features || between >= ahead * blocks as f64,
                            "{what}"
                        );
                    }
                }
                assert!(pipelined_split(
                    plan.geo,
                    dt.size_bytes(),
                    0,
                    PIPELINE_FWD_CHUNK_BYTES,
                    1.0
                )
                .is_none());
            }
        }
    }

    const H100_SHARED: SharedMemory = SharedMemory {
        per_sm: 233_472,
        per_block: 232_448,
        reserved_per_block: 1024,
    };

    /// The resident training forward keeps ResNet-50's smaller NHWC problems wholly on
    /// chip (in chunks of any length) and half of the larger ones (in whole steps of rows),
    /// within the shared memory of its blocks per SM, the co-resident grid and the
    /// workspace's partials; the backward, two operands a row, two blocks per SM, keeps the
    /// f16 2048x7x7 wholly on chip, 90% of the 1024x14x14 and a quarter or more of the
    /// rest.
    #[test]
    fn resident_plans_fit_shared_memory_grid_and_workspace() {
        let cases = [
            (64usize, 112usize, false),
            (256, 56, false),
            (512, 28, true),
            (1024, 14, true),
            (2048, 7, true),
        ];
        for (c, hw, whole) in cases {
            for dt in [DataType::F16, DataType::F32] {
                let x = TensorDescriptor::nhwc(dt, 32, c, hw, hw).unwrap();
                let mode = BatchNormMode::Spatial;
                let p = derive_batch_norm_descriptor(&x, mode).unwrap();
                let ops = fake_ops(&[(X, &x), (Y, &x)]);
                let plan = plan_problem(mode, &x, &p, &ops, H100).unwrap();
                let Some(r) = resident_shape(&plan, &H100, H100_SHARED, 16, None) else {
                    assert!(dt == DataType::F32 && !whole, "{x:?} not resident");
                    continue;
                };
                let g = r.geo;
                let step = BN_BLOCK_THREADS / g.tile_vectors;
                assert!(
                    r.resident_rows % step == 0 || r.resident_rows == g.chunk_len,
                    "{x:?}"
                );
                assert!(r.resident_rows <= g.chunk_len);
                // Where rows are streamed, the kernels may interleave the chunks' steps
                // of rows: chunks are whole steps.
                if r.resident_rows < g.chunk_len {
                    assert_eq!(g.chunk_len % step, 0, "{x:?}");
                }
                assert!(g.chunks as u64 * g.chunk_len as u64 >= g.red_len as u64);
                assert!(g.chunks as usize <= H100.resident_chunks(mode, &x), "{x:?}");
                let per_sm = (r.blocks as usize).div_ceil(132);
                assert!(per_sm <= H100.resident, "{x:?}");
                assert!(
                    per_sm * (r.shared_bytes as usize + 1024) <= 233_472,
                    "{x:?}"
                );
                if r.local_finalize {
                    let lanes = (BN_BLOCK_THREADS / (g.tile_vectors * g.vector)).min(32);
                    assert!(g.tiles <= BARRIER_GROUPS, "{x:?}");
                    assert!(
                        g.chunks.div_ceil(lanes) <= LOCAL_FINALIZE_MAX_MERGES,
                        "{x:?}"
                    );
                }
                // The small problems' blocks finalize their own narrow tiles; the largest,
                // of one tile and hundreds of chunks, leave it to the grid.
                if dt == DataType::F16 {
                    assert_eq!(r.local_finalize, hw <= 28, "{x:?}");
                    if r.local_finalize {
                        assert_eq!(g.tile_vectors, LOCAL_TILE_VECTORS, "{x:?}");
                    }
                }
                let kept = (r.resident_rows as usize * g.chunks as usize).min(g.red_len as usize);
                let share = kept as f64 / g.red_len as f64;
                if dt == DataType::F16 {
                    assert!(share >= if whole { 1.0 } else { 0.45 }, "{x:?}: {share}");
                    let bwd = resident_shape(&plan, &H100, H100_SHARED, 36, None).unwrap();
                    let kept = bwd.resident_rows as usize * bwd.geo.chunks as usize;
                    let share = kept.min(g.red_len as usize) as f64 / g.red_len as f64;
                    let least = match hw {
                        7 => 1.0,
                        14 => 0.8,
                        _ => 0.2,
                    };
                    assert!(share >= least, "{x:?}: {share}");
                    // Two blocks per SM, though one would keep a little more on chip.
                    assert!(bwd.blocks as usize > H100.sms, "{x:?}");
                }
                // 2048x7x7: 32 narrow tiles of 8 chunks of 196 rows (not 7 of 224): every
                // block slot of the grid (2 per SM) but 8 gets one.
                if dt == DataType::F16 && c == 2048 {
                    assert_eq!((g.chunks, g.chunk_len, r.blocks), (8, 196, 256));
                }
            }
        }
        // Forced off or scalar rows: none.
        let x = TensorDescriptor::nhwc(DataType::F16, 32, 2048, 7, 7).unwrap();
        let p = derive_batch_norm_descriptor(&x, BatchNormMode::Spatial).unwrap();
        let ops = fake_ops(&[(X, &x), (Y, &x)]);
        let mut plan = plan_problem(BatchNormMode::Spatial, &x, &p, &ops, H100).unwrap();
        plan.geo.vector = 1;
        assert!(resident_shape(&plan, &H100, H100_SHARED, 16, None).is_none());
    }

    /// The fused kernels take rows problems whose stats pass would give each feature one
    /// chunk (a block per feature), and nothing else.
    #[test]
    fn fused_kernels_take_rows_problems_of_one_chunk_per_feature() {
        let cases = [
            ([32usize, 2048, 7, 7], BatchNormMode::Spatial),
            ([32, 1024, 14, 14], BatchNormMode::Spatial),
            ([32, 64, 112, 112], BatchNormMode::Spatial),
            ([4, 64, 8, 8], BatchNormMode::PerActivation),
        ];
        for (dims, mode) in cases {
            for layout in [crate::Layout::ChannelsFirst, crate::Layout::ChannelsLast] {
                let [n, c, h, w] = dims;
                let x = TensorDescriptor::nchw_with(DataType::F16, n, c, h, w, layout).unwrap();
                let p = derive_batch_norm_descriptor(&x, mode).unwrap();
                let plan =
                    plan_problem(mode, &x, &p, &fake_ops(&[(X, &x), (Y, &x)]), H100).unwrap();
                let one_chunk = plan.geo.chunks == 1;
                assert_eq!(plan.fused.usable, !plan.cols && one_chunk, "{x:?} {mode:?}");
                assert_eq!(plan.fused.geo.chunks, 1);
                assert_eq!(plan.fused.config().grid, plan.geo.features);
            }
        }
        let nchw = |c, hw| TensorDescriptor::nchw(DataType::F32, 32, c, hw, hw).unwrap();
        let takes = |x: &TensorDescriptor| {
            let p = derive_batch_norm_descriptor(x, BatchNormMode::Spatial).unwrap();
            let ops = fake_ops(&[(X, x), (Y, x)]);
            let plan = plan_problem(BatchNormMode::Spatial, x, &p, &ops, H100).unwrap();
            plan.fused.usable
        };
        assert!(takes(&nchw(2048, 7)) && takes(&nchw(1024, 14)));
        assert!(!takes(&nchw(64, 112)));
    }
}
