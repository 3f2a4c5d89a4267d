//! Channel padding for [`ConvFwdAlgo::ImplicitGemmTensorOp`](super::ConvFwdAlgo): a
//! problem whose channels per group are not a whole number of 16-byte chunks (ResNet's
//! first layer: 3 channels) cannot be copied by the implicit GEMM's `cp.async` loaders.
//! Rather than gather it element by element, it is staged, as cuDNN does: x and the
//! filter are copied into the workspace with each group's channels padded with zeros to a
//! whole copy unit (`conv_fwd_pad_channels_*`, one pass over each, any source layout),
//! and the implicit GEMM's packed kernels (`conv_fwd_igemm_tc_packed<UNIT>_*`, on Hopper
//! `wgmma_conv_fwd_igemm_packed<UNIT>_*`) run the padded problem with the caller's y,
//! bias, residual and blend. Their K runs over (tap, unit) without padding per tap, so a
//! 64-wide K tile holds 16 taps of 4 padded f16 channels: the padding costs
//! `c_pad / c_per_group` in multiply-adds (4/3 for RGB), not a 64-channel tile per tap.
//!
//! The unit is 16 bytes (a chunk: 8 f16/bf16 channels, 4 f32), or for 16-bit data 8 bytes
//! (4 channels, two `cp.async`s per chunk) where that pads less: 3 channels are padded to
//! 4 (8 bytes) rather than 8. `OXIDNN_CONV_PAD_UNIT=8|16` forces the unit for 16-bit data
//! (for timing; f32 always uses 16).
//!
//! Workspace: the padded x, `[n, d, h, w, groups, c_pad]` with each image's row rounded up
//! to a whole chunk (256-byte aligned end), then the padded filter as dense rows
//! `[k, taps * c_pad]`, each rounded up to the packed kernels' whole K tiles with zeros.

use super::implicit_gemm_tensor_op::{self, Loader};
use super::{Call, Pointers, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use oxidnn_params::{ConvGeometry, ConvPadChannelsParams, FastDivisor, CONV_PAD_CHANNELS_THREADS};

/// How a problem's channels are padded for the packed kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Padding {
    /// Bytes per `cp.async`: 16, or 8 (16-bit data only).
    pub unit: u32,
    /// Channels per group after padding: a whole number of units.
    pub c_pad: u32,
}

/// Bytes per 16-byte chunk, the staged rows' granularity.
const CHUNK: usize = 16;

/// The unit for this problem's dtype and channels: 8 bytes where 16-bit channels padded
/// to 4 are fewer than padded to 8 (1-4 channels past a multiple of 8), else 16;
/// `OXIDNN_CONV_PAD_UNIT` overrides it for 16-bit data.
fn unit(p: &Problem) -> u32 {
    if p.dtype.size_bytes() != 2 {
        return 16;
    }
    match std::env::var("OXIDNN_CONV_PAD_UNIT").as_deref() {
        Ok("8") => 8,
        Ok("16") => 16,
        _ if p.geo.c_per_group.next_multiple_of(4) < p.geo.c_per_group.next_multiple_of(8) => 8,
        _ => 16,
    }
}

/// The padding this problem runs with, or `None` where it is not padded: its channels per
/// group are whole 16-byte chunks (the `cp.async` kernels copy them, or the gather kernels
/// take the layout), or the padded copies would not fit the kernels' 32-bit offsets (the
/// gather kernels then run it, unstaged).
pub(super) fn plan(p: &Problem) -> Option<Padding> {
    let size = p.dtype.size_bytes() as u32;
    if !matches!(p.dtype, DataType::F16 | DataType::BF16 | DataType::F32)
        || p.geo.c_per_group.is_multiple_of(CHUNK as u32 / size)
    {
        return None;
    }
    let unit = unit(p);
    let pad = Padding {
        unit,
        c_pad: p.geo.c_per_group.next_multiple_of(unit / size),
    };
    let layout = Staging::new(p, &pad);
    let fits = |rows: u64, row: u64| rows * row <= i32::MAX as u64;
    (fits(p.geo.n as u64, layout.x_row) && fits(p.geo.k as u64, layout.w_row)).then_some(pad)
}

/// Where the padded copies lie: row lengths in elements.
struct Staging {
    /// Elements per image of the padded x (whole chunks).
    x_row: u64,
    /// Elements per output channel of the padded filter (whole K tiles of the kernels).
    w_row: u64,
}

impl Staging {
    fn new(p: &Problem, pad: &Padding) -> Self {
        let g = &p.geo;
        let size = p.dtype.size_bytes() as u64;
        let positions = g.input.iter().map(|&e| e as u64).product::<u64>();
        let taps = g.filter.iter().map(|&e| e as u64).product::<u64>();
        let per_chunk = CHUNK as u64 / size;
        let bk = implicit_gemm_tensor_op::bk(p.dtype) as u64;
        Self {
            x_row: (positions * g.groups as u64 * pad.c_pad as u64).next_multiple_of(per_chunk),
            w_row: (taps * pad.c_pad as u64).next_multiple_of(bk),
        }
    }

    /// Bytes of the padded x, rounded up to 256 (where the filter starts).
    fn x_bytes(&self, p: &Problem) -> usize {
        (p.geo.n as usize * self.x_row as usize * p.dtype.size_bytes()).next_multiple_of(256)
    }

    fn w_bytes(&self, p: &Problem) -> usize {
        p.geo.k as usize * self.w_row as usize * p.dtype.size_bytes()
    }
}

/// Workspace bytes: the padded x and filter where the problem is padded, else none.
pub(super) fn workspace_bytes(p: &Problem) -> usize {
    match plan(p) {
        Some(pad) => {
            let s = Staging::new(p, &pad);
            s.x_bytes(p) + s.w_bytes(p)
        }
        None => 0,
    }
}

/// The problem the packed kernels run: x and the filter as their padded copies (`c_pad`
/// channels per group, dense channels-last x, the filter as dense rows of the flattened
/// K), everything else as `p`.
pub(super) fn padded(p: &Problem, pad: &Padding) -> Problem {
    let g = &p.geo;
    let s = Staging::new(p, pad);
    let pixel = g.groups * pad.c_pad;
    let geo = ConvGeometry {
        c: pixel,
        c_per_group: pad.c_pad,
        x: [
            s.x_row as u32,
            1,
            g.input[1] * g.input[2] * pixel,
            g.input[2] * pixel,
            pixel,
        ],
        w: [
            s.w_row as u32,
            1,
            g.filter[1] * g.filter[2] * pad.c_pad,
            g.filter[2] * pad.c_pad,
            pad.c_pad,
        ],
        ..*g
    };
    let mut spans = p.spans;
    spans[0] = g.n as usize * s.x_row as usize;
    spans[1] = g.k as usize * s.w_row as usize;
    Problem {
        geo,
        spans,
        ..p.clone()
    }
}

/// Launches `conv_fwd_pad_channels_*`: `rows` dense rows of `row` elements from `src`
/// (strides `strides` over `[row, channel, s0, s1, s2]`, spatial extents `extents`,
/// `groups` groups of `channels`) to `dst`.
#[allow(clippy::too_many_arguments)]
fn stage(
    call: &Call,
    pad: &Padding,
    (src, dst): (u64, u64),
    (rows, row): (u64, u64),
    strides: [u32; 5],
    extents: [u32; 3],
    groups: u32,
) -> Result<()> {
    let p = call.p;
    let size = p.dtype.size_bytes();
    let bits = if size == 2 { "b16" } else { "b32" };
    let name = format!("conv_fwd_pad_channels_{bits}_u{}", pad.unit);
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no channel-padding kernel {name}")))?;
    let row_chunks = row * size as u64 / CHUNK as u64;
    let items = rows * row_chunks;
    let params = ConvPadChannelsParams {
        src: strides,
        channels: p.geo.c_per_group,
        positions: extents.iter().product(),
        row_chunks: FastDivisor::new(row_chunks as u32),
        c_pad: FastDivisor::new(pad.c_pad),
        block: FastDivisor::new(groups * pad.c_pad),
        s1: FastDivisor::new(extents[1]),
        s2: FastDivisor::new(extents[2]),
        items: items as u32,
    };
    let cfg = LaunchConfig::for_threads(items, CONV_PAD_CHANNELS_THREADS)?;
    // SAFETY: the source strides and extents are the caller's tensor's, checked against
    // its buffer (every offset below 2^31 elements); `dst` is a 256-byte aligned region
    // of the workspace holding `rows * row` elements (`items` chunks: `row` is a whole
    // number of chunks), checked by the caller, which overlaps no tensor of the call.
    unsafe { call.gpu.launch(kernel, cfg, &params, &[src, dst]) }
}

/// Stages the padded x and filter into the workspace and runs the packed implicit GEMM on
/// them, with the caller's y, bias, residual and blend.
pub(super) fn launch(call: &Call, y: &mut Buffer, pad: Padding) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let s = Staging::new(p, &pad);
    let need = s.x_bytes(p) + s.w_bytes(p);
    if call.ptrs.workspace_bytes < need {
        return Err(Error::WorkspaceTooSmall {
            required_bytes: need,
            got_bytes: call.ptrs.workspace_bytes,
        });
    }
    let x_at = call.ptrs.workspace;
    let w_at = x_at + s.x_bytes(p) as u64;
    stage(
        call,
        &pad,
        (call.ptrs.x, x_at),
        (g.n as u64, s.x_row),
        g.x,
        g.input,
        g.groups,
    )?;
    stage(
        call,
        &pad,
        (call.ptrs.w, w_at),
        (g.k as u64, s.w_row),
        g.w,
        g.filter,
        1,
    )?;
    let padded = padded(p, &pad);
    let staged = Call {
        handle: call.handle,
        gpu: call.gpu,
        p: &padded,
        alpha: call.alpha,
        beta: call.beta,
        epilogue: call.epilogue,
        x: call.x,
        w: call.w,
        ptrs: Pointers {
            x: x_at,
            w: w_at,
            bias: call.ptrs.bias,
            z: call.ptrs.z,
            workspace: 0,
            workspace_bytes: 0,
        },
    };
    implicit_gemm_tensor_op::launch_with(&staged, y, Loader::Packed { unit: pad.unit })
}
