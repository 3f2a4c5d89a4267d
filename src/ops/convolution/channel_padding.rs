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
//! `c_pad / c_per_group` in multiply-adds, not a 64-channel tile per tap.
//!
//! Strided dims whose filter windows overlap are folded into the channels on the way
//! (space to depth): ResNet's 7x7 stride-2 conv1 over 3 channels runs as a 4x4 stride-1
//! convolution over 12 channels (the input's 2x2 phases; its padding staged as zeros, the
//! filter's taps past 7 zero), so each tap's copies are 16-byte runs of real data rather
//! than 3 channels of every other pixel.
//!
//! The unit is 16 bytes (a chunk: 8 f16/bf16 channels, 4 f32), or for 16-bit data 8 bytes
//! (4 channels, two `cp.async`s per chunk) where that halves the padded channels (1-4
//! channels padded to 4 rather than 8). `OXIDNN_CONV_PAD_UNIT=8|16` forces the unit for
//! 16-bit data (for timing; f32 always uses 16).
//!
//! Workspace: the padded x, `[n, d', h', w', groups, c_pad]` with each image's row rounded
//! up to a whole chunk (256-byte aligned end), then the padded filter as dense rows
//! `[k, taps' * c_pad]`, each rounded up to the packed kernels' whole K tiles with zeros.

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
    /// Channels per group after folding and padding: a whole number of units.
    pub c_pad: u32,
    /// Phases of each spatial dim (`[d, h, w]`) folded into the channels: the stride
    /// there, or 1 (not folded).
    pub fold: [u32; 3],
}

/// Bytes per 16-byte chunk, the staged rows' granularity.
const CHUNK: usize = 16;

/// The spatial dims folded into the channels (space to depth): where the stride is above
/// 1, the dilation 1 and the filter longer than the stride (its windows overlap), e.g. a
/// 7x7 stride-2 filter becomes 4x4 at stride 1 over 4x the channels, so that a K tile
/// holds 16-byte runs of real channels instead of one tap's 3 channels.
fn fold(p: &Problem) -> [u32; 3] {
    let g = &p.geo;
    std::array::from_fn(|j| {
        if g.stride[j] > 1 && g.dilation[j] == 1 && g.filter[j] > g.stride[j] {
            g.stride[j]
        } else {
            1
        }
    })
}

/// The unit for `depth` channels per group (after folding): 8 bytes where 16-bit channels
/// padded to 4 are at most half of them padded to 8 (the padded bytes and multiply-adds
/// halve), else 16 (the same padded bytes in half the copies); f32 always 16.
/// `OXIDNN_CONV_PAD_UNIT=8|16` overrides it for 16-bit data (for timing).
fn unit(p: &Problem, depth: u32) -> u32 {
    if p.dtype.size_bytes() != 2 {
        return 16;
    }
    match std::env::var("OXIDNN_CONV_PAD_UNIT").as_deref() {
        Ok("8") => 8,
        Ok("16") => 16,
        _ if 2 * depth.next_multiple_of(4) <= depth.next_multiple_of(8) => 8,
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
    let fold = fold(p);
    let depth = p.geo.c_per_group * fold.iter().product::<u32>();
    let unit = unit(p, depth);
    let pad = Padding {
        unit,
        c_pad: depth.next_multiple_of(unit / size),
        fold,
    };
    let layout = Staging::new(p, &pad);
    let fits = |rows: u64, row: u64| rows * row <= i32::MAX as u64;
    (fits(p.geo.n as u64, layout.x_row) && fits(p.geo.k as u64, layout.w_row)).then_some(pad)
}

/// The padded problem's shape and where its copies lie.
struct Staging {
    /// Spatial extents of the staged x: the input's, or where folded `output + filter - 1`
    /// (the padding staged as zeros).
    input: [u32; 3],
    /// Spatial extents of the staged filter: the filter's, or where folded
    /// `ceil(filter / stride)`.
    filter: [u32; 3],
    /// Elements per image of the padded x (whole chunks).
    x_row: u64,
    /// Elements per output channel of the padded filter (whole K tiles of the kernels).
    w_row: u64,
}

impl Staging {
    fn new(p: &Problem, pad: &Padding) -> Self {
        let g = &p.geo;
        let size = p.dtype.size_bytes() as u64;
        let filter: [u32; 3] = std::array::from_fn(|j| g.filter[j].div_ceil(pad.fold[j]));
        let input: [u32; 3] = std::array::from_fn(|j| {
            if pad.fold[j] > 1 {
                g.output[j] + filter[j] - 1
            } else {
                g.input[j]
            }
        });
        let positions = input.iter().map(|&e| e as u64).product::<u64>();
        let taps = filter.iter().map(|&e| e as u64).product::<u64>();
        let per_chunk = CHUNK as u64 / size;
        let bk = implicit_gemm_tensor_op::bk(p.dtype) as u64;
        Self {
            input,
            filter,
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
/// K; folded dims at stride 1 without padding, the filter staged reversed in convolution
/// mode so that the copy is cross-correlated), y and the epilogue as `p`'s.
pub(super) fn padded(p: &Problem, pad: &Padding) -> Problem {
    let g = &p.geo;
    let s = Staging::new(p, pad);
    let pixel = g.groups * pad.c_pad;
    let folded = |j: usize, then: u32, otherwise: u32| {
        if pad.fold[j] > 1 {
            then
        } else {
            otherwise
        }
    };
    let geo = ConvGeometry {
        c: pixel,
        c_per_group: pad.c_pad,
        flip: 0,
        input: s.input,
        filter: s.filter,
        pad: std::array::from_fn(|j| folded(j, 0, g.pad[j])),
        stride: std::array::from_fn(|j| folded(j, 1, g.stride[j])),
        x: [
            s.x_row as u32,
            1,
            s.input[1] * s.input[2] * pixel,
            s.input[2] * pixel,
            pixel,
        ],
        w: [
            s.w_row as u32,
            1,
            s.filter[1] * s.filter[2] * pad.c_pad,
            s.filter[2] * pad.c_pad,
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

/// One operand to stage: the source's address, strides over `[outer, channel, i0, i1,
/// i2]` and spatial extents, the offset subtracted from its coordinates, whether they are
/// read reversed, its groups; the destination's address, rows, row length (elements)
/// and spatial extents.
struct Operand {
    src: u64,
    strides: [u32; 5],
    extent: [u32; 3],
    offset: [u32; 3],
    reverse: bool,
    groups: u32,
    dst: u64,
    rows: u64,
    row: u64,
    dst_extent: [u32; 3],
}

/// Launches `conv_fwd_pad_channels_*` on one operand.
fn stage(call: &Call, pad: &Padding, op: Operand) -> Result<()> {
    let p = call.p;
    let size = p.dtype.size_bytes();
    let bits = if size == 2 { "b16" } else { "b32" };
    let name = format!("conv_fwd_pad_channels_{bits}_u{}", pad.unit);
    let kernel = kernels::lookup(&name)
        .ok_or_else(|| Error::unsupported(format!("no channel-padding kernel {name}")))?;
    let row_chunks = op.row * size as u64 / CHUNK as u64;
    let items = op.rows * row_chunks;
    let params = ConvPadChannelsParams {
        src: op.strides,
        src_extent: op.extent,
        fold: pad.fold,
        offset: op.offset,
        reverse: op.reverse as u32,
        channels: p.geo.c_per_group,
        depth: p.geo.c_per_group * pad.fold.iter().product::<u32>(),
        positions: op.dst_extent.iter().product(),
        row_chunks: FastDivisor::new(row_chunks as u32),
        c_pad: FastDivisor::new(pad.c_pad),
        block: FastDivisor::new(op.groups * pad.c_pad),
        p1: FastDivisor::new(op.dst_extent[1]),
        p2: FastDivisor::new(op.dst_extent[2]),
        channels_div: FastDivisor::new(p.geo.c_per_group),
        fold1: FastDivisor::new(pad.fold[1]),
        fold2: FastDivisor::new(pad.fold[2]),
        items: items as u32,
    };
    let cfg = LaunchConfig::for_threads(items, CONV_PAD_CHANNELS_THREADS)?;
    // SAFETY: the source strides and extents are the caller's tensor's, checked against
    // its buffer (every offset below 2^31 elements), and only coordinates inside the
    // extents are read; `dst` is a 256-byte aligned region of the workspace holding
    // `rows * row` elements (`items` chunks: `row` is a whole number of chunks), checked
    // by the caller, which overlaps no tensor of the call.
    unsafe { call.gpu.launch(kernel, cfg, &params, &[op.src, op.dst]) }
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
        Operand {
            src: call.ptrs.x,
            strides: g.x,
            extent: g.input,
            offset: std::array::from_fn(|j| if pad.fold[j] > 1 { g.pad[j] } else { 0 }),
            reverse: false,
            groups: g.groups,
            dst: x_at,
            rows: g.n as u64,
            row: s.x_row,
            dst_extent: s.input,
        },
    )?;
    stage(
        call,
        &pad,
        Operand {
            src: call.ptrs.w,
            strides: g.w,
            extent: g.filter,
            offset: [0; 3],
            reverse: g.flip != 0,
            groups: 1,
            dst: w_at,
            rows: g.k as u64,
            row: s.w_row,
            dst_extent: s.filter,
        },
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
