//! [`ConvFwdAlgo::Winograd`](super::ConvFwdAlgo::Winograd): Winograd F(2x2, 3x3), non-fused
//! (cuDNN's `WINOGRAD_NONFUSED`), for 2-D 3x3 convolutions at stride 1 without dilation or
//! groups, any padding, layouts and strides.
//!
//! Four launches on the workspace (layouts in [`ConvWinogradParams`]):
//!
//! 1. `conv_fwd_winograd_filter_<dt>`: `U[xi] = (G g G^T)[xi]`, 16 matrices `K x C`;
//! 2. `conv_fwd_winograd_input_<dt>`: `V[xi] = (B^T d B)[xi]` of every 4x4 input patch
//!    under a 2x2 output tile, 16 matrices `tiles x C`;
//! 3. one batched matmul on the matmul core ([`DeviceMatmul`]), `M[xi] = V[xi] U[xi]^T`,
//!    batch 16, f32 results (tf32 tensor cores for f32 data, f16/bf16 tensor cores for
//!    16-bit data);
//! 4. `conv_fwd_winograd_output_<dt>`: `Y = A^T M A` per tile and output channel, through
//!    the shared epilogue into y.
//!
//! V and U are stored in the data's type: the matmul core's tensor-core kernels take f32
//! (rounded to tf32 by the instruction) or 16-bit inputs, so 16-bit V and U round once
//! more (to the data's precision) than the direct algorithms' operands; their magnitudes
//! stay within 4x the input's and 2.25x the filter's, so f16 overflows only where x is
//! within 4x of f16's limit. M is f32. The workspace is V, U and M (each 256-byte
//! aligned); V and M follow x's and y's layouts (channels innermost for channels-last
//! tensors, tiles innermost otherwise) so that the transforms read and write along
//! contiguous runs, and every matrix's leading dim is padded to 8 elements so that the
//! matmul core takes its 16-byte copy paths.
//!
//! The transforms round (`B^T d B` and `G g G^T` mix 4 and 9 values, `A^T M A` 9), so
//! this algorithm is [`reduced_precision`](super::ConvFwdAlgo::reduced_precision) and
//! declines exact `Fma` math.

use super::{Call, Problem};
use crate::buffer::Buffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::launch::LaunchConfig;
use crate::ops::grid_stride_config;
use crate::ops::matmul::{DeviceMatmul, MathType, MatmulAlgo};
use crate::ops::pooling::channels_last;
use oxidnn_params::{
    ConvWinogradParams, FastDivisor, OperandLayout, OutputLayout, CONV_WINOGRAD_THREADS,
};

/// Points of the transformed 4x4 tile: the matmul's batch.
const POINTS: usize = 16;

/// Why Winograd F(2x2, 3x3) does not run this problem, or `None` if it does.
pub(super) fn declines(p: &Problem) -> Option<String> {
    let g = &p.geo;
    if p.math == MathType::Fma {
        return Some(
            "exact math asked (Fma): Winograd rounds in its transforms; it runs under Tf32 (f32) or TensorOp (f16/bf16) math"
                .into(),
        );
    }
    if p.spatial != 2 {
        return Some(format!(
            "Winograd F(2x2, 3x3) runs 2-D convolutions only, this one has {} spatial dims",
            p.spatial
        ));
    }
    if g.filter[1..] != [3, 3] {
        return Some(format!(
            "the filter is {}x{}, not 3x3",
            g.filter[1], g.filter[2]
        ));
    }
    if g.stride[1..] != [1, 1] {
        return Some("the stride is not 1".into());
    }
    if g.dilation[1..] != [1, 1] {
        return Some("the filter is dilated".into());
    }
    if g.groups != 1 {
        return Some("grouped convolutions are not one batched matmul".into());
    }
    let plan = Plan::new(p);
    let (t, c, k) = (plan.tiles, g.c as usize, g.k as usize);
    let limit = i32::MAX as usize;
    if t * c > limit || t * k > limit || k * c > limit {
        return Some(format!(
            "{t} tiles x {c} input / {k} output channels exceed 2^31 transform items"
        ));
    }
    None
}

/// Bytes of workspace: V, U and M.
pub(super) fn workspace_bytes(p: &Problem) -> usize {
    Plan::new(p).bytes()
}

/// The tiling and the workspace's layout.
struct Plan {
    tiles_h: usize,
    tiles_w: usize,
    /// Tiles of all images: the matmul's M.
    tiles: usize,
    /// x (y) is channels-last: V (M) has channels innermost.
    x_last: bool,
    y_last: bool,
    /// The input transform takes channel pairs (`_c2`): x channels-last with unit channel
    /// stride, C and x's other strides even (so every pair is 4-byte aligned).
    input_pairs: bool,
    v: OperandLayout,
    u: OperandLayout,
    m: OutputLayout,
    /// Byte offsets of U and M in the workspace (V at 0), and the total.
    u_at: usize,
    m_at: usize,
    end: usize,
}

/// `v` rounded up to a multiple of `to`.
fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

impl Plan {
    fn new(p: &Problem) -> Self {
        let g = &p.geo;
        let (tiles_h, tiles_w) = (
            g.output[1].div_ceil(2) as usize,
            g.output[2].div_ceil(2) as usize,
        );
        let tiles = g.n as usize * tiles_h * tiles_w;
        let (c, k) = (g.c as usize, g.k as usize);
        let (x_last, y_last) = (channels_last(&g.x), channels_last(&g.y));
        // Leading dims padded to 8 elements (16 bytes of 16-bit data, 32 of f32): the
        // matmul core's vector copies need 16-byte aligned strides.
        let (ld_c, ld_k, ld_t) = (round_up(c, 8), round_up(k, 8), round_up(tiles, 8));
        let v = if x_last {
            OperandLayout {
                batch: (tiles * ld_c) as u64,
                mn: ld_c as u64,
                k: 1,
            }
        } else {
            OperandLayout {
                batch: (c * ld_t) as u64,
                mn: 1,
                k: ld_t as u64,
            }
        };
        let u = OperandLayout {
            batch: (k * ld_c) as u64,
            mn: ld_c as u64,
            k: 1,
        };
        let m = if y_last {
            OutputLayout {
                batch: (tiles * ld_k) as u64,
                row: ld_k as u64,
                col: 1,
            }
        } else {
            OutputLayout {
                batch: (k * ld_t) as u64,
                row: 1,
                col: ld_t as u64,
            }
        };
        let size = p.dtype.size_bytes();
        let u_at = round_up(POINTS * v.batch as usize * size, 256);
        let m_at = u_at + round_up(POINTS * u.batch as usize * size, 256);
        let end = m_at + POINTS * m.batch as usize * DataType::F32.size_bytes();
        let even = |v: u32| v.is_multiple_of(2);
        let input_pairs =
            x_last && g.x[1] == 1 && even(g.c) && [g.x[0], g.x[3], g.x[4]].into_iter().all(even);
        Self {
            tiles_h,
            tiles_w,
            tiles,
            x_last,
            y_last,
            input_pairs,
            v,
            u,
            m,
            u_at,
            m_at,
            end,
        }
    }

    fn bytes(&self) -> usize {
        self.end
    }
}

/// The matmul's tile for `k` output channels (its N): 64x64 where N <= 64, whose wider
/// tiles would compute mostly padding columns (the heuristic counts blocks, not waste:
/// 16 x [25088 x 64] x [64 x 64], ResNet-50's 56x56 layer at N=32, ran in 0.11-0.14 ms
/// on 64x64 against 0.46 ms on the heuristic's 128x256 for f16, 0.17 against 0.27 on
/// 128x128 for tf32, H100); else the matmul's heuristic.
fn matmul_tile(k: usize) -> Option<MatmulAlgo> {
    (k <= 64).then_some(MatmulAlgo::Tile64x64)
}

/// Whether the output transform takes channel pairs (`_c2`): y (and z, where the epilogue
/// reads it) channels-last with unit channel stride, K and the other strides even, so
/// every pair of y, z and the bias is 4-byte aligned (M's rows are padded to 8).
fn output_pairs(call: &Call) -> bool {
    let g = &call.p.geo;
    let even = |v: u32| v.is_multiple_of(2);
    let paired = |s: &[u32; 5]| s[1] == 1 && [s[0], s[3], s[4]].into_iter().all(even);
    channels_last(&g.y)
        && even(g.k)
        && paired(&g.y)
        && (call.epilogue.residual.is_none() || paired(&g.z))
}

pub(super) fn launch(call: &Call, y: &mut Buffer) -> Result<()> {
    let p = call.p;
    let g = &p.geo;
    let plan = Plan::new(p);
    let ws = call.ptrs.workspace;
    let (v_ptr, u_ptr, m_ptr) = (ws, ws + plan.u_at as u64, ws + plan.m_at as u64);
    let (t, c, k) = (plan.tiles as u32, g.c, g.k);
    let params = |items: u32, inner: u32, channel_inner: bool| ConvWinogradParams {
        geo: *g,
        ops: call.ops(),
        tiles_h: FastDivisor::new(plan.tiles_h as u32),
        tiles_w: FastDivisor::new(plan.tiles_w as u32),
        inner: FastDivisor::new(inner),
        items,
        channel_inner: channel_inner as u32,
        _pad: 0,
        v: plan.v,
        u: plan.u,
        m: plan.m,
    };
    let config = |items: u32| -> Result<LaunchConfig> {
        let mut cfg = grid_stride_config(items as u64, call.gpu.sm_count)?;
        cfg.block = CONV_WINOGRAD_THREADS;
        Ok(cfg)
    };
    let kernel = |stage: &str| {
        let name = format!("conv_fwd_winograd_{stage}_{}", p.dtype.name());
        kernels::lookup(&name)
            .ok_or_else(|| Error::unsupported(format!("no Winograd kernel `{name}`")))
    };

    // The items' counts are below 2^31 (checked by `declines`), so they fit the u32s.
    let filter = params(k * c, c, true);
    // SAFETY: w holds the filter `g` describes (checked against its descriptor's span,
    // below 2^31 elements); U at `u_ptr` holds 16 x K x ld_c elements of the data's type,
    // inside the workspace (checked to hold `workspace_bytes`), which every (k, c) item's
    // 16 stores stay within.
    unsafe {
        call.gpu.launch(
            kernel("filter")?,
            config(filter.items)?,
            &filter,
            &[call.ptrs.w, u_ptr],
        )?;
    }
    let input = match (plan.x_last, plan.input_pairs) {
        (true, true) => params(t * (c / 2), c / 2, true),
        (true, false) => params(t * c, c, true),
        _ => params(t * c, t, false),
    };
    // SAFETY: x holds the tensor `g` describes (span checked, below 2^31 elements) and
    // the kernel reads only in-range pixels; V at `v_ptr` holds 16 matrices of `tiles x C`
    // at `plan.v`, inside the workspace, which every (tile, c) item's stores stay within;
    // the `_c2` kernel runs only where `Plan::input_pairs` found every offset even.
    unsafe {
        call.gpu.launch(
            kernel(if plan.input_pairs {
                "input_c2"
            } else {
                "input"
            })?,
            config(input.items)?,
            &input,
            &[call.ptrs.x, v_ptr],
        )?;
    }
    let product = DeviceMatmul {
        math: p.math,
        input: p.dtype,
        output: DataType::F32,
        batch: POINTS,
        m: plan.tiles,
        n: k as usize,
        k: c as usize,
        a: plan.v,
        b: plan.u,
        c: plan.m,
        algo: matmul_tile(k as usize),
    };
    // SAFETY: V, U and M are the workspace's three disjoint regions, each holding the 16
    // matrices its layout describes (`tiles x C`, `K x C`, `tiles x K`), M's elements
    // distinct.
    unsafe { product.launch(call.gpu, v_ptr, u_ptr, m_ptr)? };
    let pairs = output_pairs(call);
    let output = match (plan.y_last, pairs) {
        (true, true) => params(t * (k / 2), k / 2, true),
        (true, false) => params(t * k, k, true),
        _ => params(t * k, t, false),
    };
    let pointers = [m_ptr, call.y_ptr(y)?, call.ptrs.bias, call.ptrs.z];
    // SAFETY: M at `m_ptr` holds the 16 f32 matrices `tiles x K` the matmul wrote; y, bias
    // and z were checked to hold their descriptors' spans (below 2^31 elements), and the
    // kernel stores only in-range pixels of each tile, each once; bias and z are read only
    // when the epilogue has them, which is exactly when they were given; the `_c2` kernel
    // runs only where `output_pairs` found every offset even and channels contiguous.
    let name = if pairs { "output_c2" } else { "output" };
    unsafe {
        call.gpu
            .launch(kernel(name)?, config(output.items)?, &output, &pointers)
    }
}
