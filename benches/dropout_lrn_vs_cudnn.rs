//! oxidnn against cuDNN: dropout and cross-channel LRN, run by both libraries on the same
//! device buffers and stream, checked, then timed.
//!
//! ```text
//! cargo bench --features cudnn-bench --bench dropout_lrn_vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `op dtype-layout shape` contains it,
//!   e.g. `dropout`, `lrn_bwd`, `f16`, `NHWC`, `8192x4096`.
//! * `OXIDNN_BENCH_QUICK=1`: a few rows only (smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `dropout-lrn-results.csv`).
//!
//! Rows: dropout forward and backward at p = 0.1 on a ResNet-50 activation (32x256x56x56)
//! and a transformer activation (8192x4096), f32 and f16; LRN forward and backward with
//! AlexNet's parameters (n = 5, alpha = 1e-4, beta = 0.75, k = 2) on its two LRN inputs
//! (N = 32: 96x55x55 and 256x27x27), f32 NCHW, f16 NCHW and f16 NHWC.
//!
//! Checks: LRN outputs are compared byte for byte (relative error norm within 1e-4 for
//! f32, 1e-2 for f16). Dropout masks differ by design (cuDNN draws from its own generator),
//! so each library's output is checked for consistency instead: keep rate within 5 sigma
//! of 1 - p, dropped elements exactly 0, kept ones x / (1 - p) (backward: dy / (1 - p)
//! exactly where that library's forward kept, 0 elsewhere); the row reports the larger of
//! the two keep-rate deviations in sigmas.
//!
//! Method (as `vs_cudnn`): every timed call is bracketed by its own pair of CUDA events on
//! the handle's stream; 5 warm-up calls, then 30 timed calls per library, median reported.
//! The timed calls are queued behind a host-side stream gate and released together (device
//! time, not host launch overhead). oxidnn and cuDNN alternate call by call, and shapes
//! small enough to live in L2 rotate over several buffer sets (at least 200 MiB and 4x the
//! L2 in all). "Bytes moved" is the minimum traffic: each input read once, each output
//! written once, the mask counted at one bit per element (cuDNN's own reserve space is
//! larger); LRN backward needs x and dy, not y. The roofline reference is the
//! device-to-device copy bandwidth (1 GiB, read + write bytes).
//!
//! Without libcudnn only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::cudnn::{
    copy_bandwidth, cudnn_check, cudnn_sys, gb_per_s, version_string, Cudnn, TensorDesc,
};
use common::{
    decode, dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes,
    Args, Check, Context, Res, Timer,
};
use oxidnn::{
    dropout_backward, dropout_forward, dropout_reserve_space_size, dropout_states_size,
    lrn_cross_channel_backward, lrn_cross_channel_forward, Buffer, DataType, DropoutDescriptor,
    Handle, Layout, LrnDescriptor, TensorDescriptor,
};
use std::ffi::c_void;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

cudnn_object!(
    DropoutDesc,
    cudnn_sys::cudnnDropoutDescriptor_t,
    cudnnCreateDropoutDescriptor,
    cudnnDestroyDropoutDescriptor
);
cudnn_object!(
    LrnDesc,
    cudnn_sys::cudnnLRNDescriptor_t,
    cudnnCreateLRNDescriptor,
    cudnnDestroyLRNDescriptor
);

const WARMUP: usize = 5;
const RUNS: usize = 30;
const MAX_SIDES: usize = 2;
const ROTATION_MIN_BYTES: usize = 200 << 20;
const INPUT_RANGE: f32 = 2.0;
const INPUT_MIN_MAGNITUDE: f32 = 1.0 / 1024.0;
/// The drop probability of every dropout row.
const P: f32 = 0.1;
const SEED: u64 = 0x5EED;
/// AlexNet's LRN.
const LRN_N: u32 = 5;
const LRN_ALPHA: f64 = 1e-4;
const LRN_BETA: f64 = 0.75;
const LRN_K: f64 = 2.0;

const DROPOUT_SHAPES: [&[usize]; 2] = [&[32, 256, 56, 56], &[8192, 4096]];
const DROPOUT_TYPES: [DataType; 2] = [DataType::F32, DataType::F16];
const LRN_SHAPES: [&[usize]; 2] = [&[32, 96, 55, 55], &[32, 256, 27, 27]];
const LRN_TYPES: [(DataType, Layout); 3] = [
    (DataType::F32, Layout::ChannelsFirst),
    (DataType::F16, Layout::ChannelsFirst),
    (DataType::F16, Layout::ChannelsLast),
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dropout_lrn_vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    DropoutFwd,
    DropoutBwd,
    LrnFwd,
    LrnBwd,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::DropoutFwd => "dropout_fwd",
            Op::DropoutBwd => "dropout_bwd",
            Op::LrnFwd => "lrn_fwd",
            Op::LrnBwd => "lrn_bwd",
        }
    }

    fn family(self) -> &'static str {
        match self {
            Op::DropoutFwd | Op::DropoutBwd => "dropout",
            Op::LrnFwd | Op::LrnBwd => "lrn",
        }
    }

    fn is_dropout(self) -> bool {
        self.family() == "dropout"
    }

    /// Minimum bytes moved: tensors read and written once, the mask at a bit per element.
    fn bytes_moved(self, d: &TensorDescriptor) -> u64 {
        let tensor = d.size_bytes() as u64;
        let mask = d.element_count().div_ceil(8) as u64;
        match self {
            Op::DropoutFwd | Op::DropoutBwd => 2 * tensor + mask,
            Op::LrnFwd => 2 * tensor,
            Op::LrnBwd => 3 * tensor,
        }
    }
}

/// One problem: a tensor shape, dtype and layout.
struct Problem {
    dims: Vec<usize>,
    dtype: DataType,
    layout: Layout,
    desc: TensorDescriptor,
}

impl Problem {
    fn new(dims: &[usize], dtype: DataType, layout: Layout) -> oxidnn::Result<Self> {
        let desc = if dims.len() == 4 {
            TensorDescriptor::nchw_with(dtype, dims[0], dims[1], dims[2], dims[3], layout)?
        } else {
            TensorDescriptor::packed(dtype, dims)?
        };
        Ok(Self {
            dims: dims.to_vec(),
            dtype,
            layout,
            desc,
        })
    }

    fn label(&self, op: Op) -> String {
        match (op.is_dropout(), self.layout) {
            (true, _) => self.dtype.to_string(),
            (false, Layout::ChannelsFirst) => format!("{}-NCHW", self.dtype),
            (false, Layout::ChannelsLast) => format!("{}-NHWC", self.dtype),
        }
    }

    fn shape(&self) -> String {
        self.dims
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("x")
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// One set of buffers. Invariant (from `alloc`): x, dy, aux and out hold the problem's
/// span; `ox_reserve` oxidnn's reserve space, `cu_reserve` cuDNN's (if any).
struct Set {
    /// Input x (random).
    x: Buffer,
    /// Input dy (random).
    dy: Buffer,
    /// The forward output a backward needs (LRN: y; dropout: cuDNN's y).
    aux: Buffer,
    out: Buffer,
    ox_reserve: Buffer,
    cu_reserve: Buffer,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem, cu_reserve_bytes: usize) -> Res<Self> {
        let alloc = |bytes: usize| h.alloc_bytes(bytes).context("allocating a buffer");
        let full = p.desc.size_bytes();
        Ok(Self {
            x: alloc(full)?,
            dy: alloc(full)?,
            aux: alloc(full)?,
            out: alloc(full)?,
            ox_reserve: alloc(dropout_reserve_space_size(&p.desc))?,
            cu_reserve: alloc(cu_reserve_bytes)?,
        })
    }

    fn bytes(&self) -> usize {
        [
            &self.x,
            &self.dy,
            &self.aux,
            &self.out,
            &self.ox_reserve,
            &self.cu_reserve,
        ]
        .iter()
        .map(|b| b.len_bytes())
        .sum()
    }
}

// ---------------------------------------------------------------------------------------
// The libraries
// ---------------------------------------------------------------------------------------

/// oxidnn's side: the dropout generator and the LRN parameters.
struct Oxidnn {
    dropout: DropoutDescriptor,
    states: Buffer,
    lrn: LrnDescriptor,
}

/// cuDNN's side: its handle, a seeded dropout descriptor with its states, the LRN
/// descriptor.
struct CudnnSide {
    cu: Cudnn,
    dropout: DropoutDesc,
    _states: Buffer,
    lrn: LrnDesc,
}

/// A host scalar for cuDNN's alpha / beta (float for float and half tensors).
fn scalar(v: f32) -> [u8; 4] {
    v.to_ne_bytes()
}

fn ptr(s: &[u8; 4]) -> *const c_void {
    s.as_ptr().cast()
}

impl CudnnSide {
    fn new(cu: Cudnn, h: &Handle) -> Res<Self> {
        let dropout = DropoutDesc::create()?;
        let mut bytes = 0usize;
        // SAFETY: the handle is live, `bytes` a valid out-pointer.
        cudnn_check(
            unsafe { cudnn_sys::cudnnDropoutGetStatesSize(cu.handle.0, &mut bytes) },
            "cudnnDropoutGetStatesSize",
        )?;
        let states = h
            .alloc_bytes(bytes)
            .context("allocating cuDNN's dropout states")?;
        let states_addr = device_address(&states)?;
        // SAFETY: descriptor and handle are live; the states buffer holds `bytes` bytes and
        // lives as long as the descriptor (both in `Self`).
        cudnn_check(
            unsafe {
                cudnn_sys::cudnnSetDropoutDescriptor(
                    dropout.0,
                    cu.handle.0,
                    P,
                    dev_mut(states_addr),
                    bytes,
                    SEED,
                )
            },
            "cudnnSetDropoutDescriptor",
        )?;
        let lrn = LrnDesc::create()?;
        // SAFETY: the descriptor is live.
        cudnn_check(
            unsafe { cudnn_sys::cudnnSetLRNDescriptor(lrn.0, LRN_N, LRN_ALPHA, LRN_BETA, LRN_K) },
            "cudnnSetLRNDescriptor",
        )?;
        Ok(Self {
            cu,
            dropout,
            _states: states,
            lrn,
        })
    }

    fn reserve_bytes(&self, d: &TensorDesc) -> Res<usize> {
        let mut bytes = 0usize;
        // SAFETY: the descriptor is live; `bytes` a valid out-pointer.
        cudnn_check(
            unsafe { cudnn_sys::cudnnDropoutGetReserveSpaceSize(d.0, &mut bytes) },
            "cudnnDropoutGetReserveSpaceSize",
        )?;
        Ok(bytes)
    }

    /// Runs `op` on `set`.
    ///
    /// Invariant behind every unsafe call: the descriptors are live and describe the
    /// problem; the addresses are `set`'s live buffers, which hold the spans they describe
    /// (`Set::alloc`, the reserve sized by cudnnDropoutGetReserveSpaceSize); cuDNN issues
    /// on the oxidnn handle's stream, the only stream that touches them.
    fn run(&self, op: Op, d: &TensorDesc, set: &mut Set) -> Res<()> {
        let h = self.cu.handle.0;
        let (one, zero) = (scalar(1.0), scalar(0.0));
        let (x, dy, aux) = (
            device_address(&set.x)?,
            device_address(&set.dy)?,
            device_address(&set.aux)?,
        );
        let out = device_address(&set.out)?;
        let reserve = device_address(&set.cu_reserve)?;
        let reserve_bytes = set.cu_reserve.len_bytes();
        let lrn_mode = cudnn_sys::cudnnLRNMode_t::CUDNN_LRN_CROSS_CHANNEL_DIM1;
        let status = match op {
            // SAFETY: see the invariant above; out = dropout(x).
            Op::DropoutFwd => unsafe {
                cudnn_sys::cudnnDropoutForward(
                    h,
                    self.dropout.0,
                    d.0,
                    dev(x),
                    d.0,
                    dev_mut(out),
                    dev_mut(reserve),
                    reserve_bytes,
                )
            },
            // SAFETY: see the invariant above; out = dropout'(dy) with the reserve's mask.
            Op::DropoutBwd => unsafe {
                cudnn_sys::cudnnDropoutBackward(
                    h,
                    self.dropout.0,
                    d.0,
                    dev(dy),
                    d.0,
                    dev_mut(out),
                    dev_mut(reserve),
                    reserve_bytes,
                )
            },
            // SAFETY: see the invariant above; out = lrn(x).
            Op::LrnFwd => unsafe {
                cudnn_sys::cudnnLRNCrossChannelForward(
                    h,
                    self.lrn.0,
                    lrn_mode,
                    ptr(&one),
                    d.0,
                    dev(x),
                    ptr(&zero),
                    d.0,
                    dev_mut(out),
                )
            },
            // SAFETY: see the invariant above; y = aux, dy, x; out = dx.
            Op::LrnBwd => unsafe {
                cudnn_sys::cudnnLRNCrossChannelBackward(
                    h,
                    self.lrn.0,
                    lrn_mode,
                    ptr(&one),
                    d.0,
                    dev(aux),
                    d.0,
                    dev(dy),
                    d.0,
                    dev(x),
                    ptr(&zero),
                    d.0,
                    dev_mut(out),
                )
            },
        };
        cudnn_check(status, op.name())
    }
}

impl Oxidnn {
    fn run(&mut self, h: &Handle, op: Op, p: &Problem, set: &mut Set) -> oxidnn::Result<()> {
        let d = &p.desc;
        match op {
            Op::DropoutFwd => dropout_forward(
                h,
                &self.dropout,
                &mut self.states,
                d,
                &set.x,
                d,
                &mut set.out,
                &mut set.ox_reserve,
            ),
            Op::DropoutBwd => dropout_backward(
                h,
                &self.dropout,
                d,
                &set.dy,
                d,
                &mut set.out,
                &set.ox_reserve,
            ),
            Op::LrnFwd => {
                lrn_cross_channel_forward(h, &self.lrn, 1.0, d, &set.x, 0.0, d, &mut set.out)
            }
            Op::LrnBwd => lrn_cross_channel_backward(
                h,
                &self.lrn,
                1.0,
                d,
                &set.aux,
                d,
                &set.dy,
                d,
                &set.x,
                0.0,
                d,
                &mut set.out,
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Dropout consistency checks
// ---------------------------------------------------------------------------------------

/// Checks a dropout output `out` against its input `input` (both encoded as `dtype`):
/// kept elements are `input / (1 - p)`, dropped ones exactly 0, and `kept(i)` (oxidnn's
/// mask, or the zeros of cuDNN's forward) says which. Returns the keep rate's deviation
/// from 1 - p in standard deviations.
fn dropout_consistency(
    dtype: DataType,
    input: &[u8],
    out: &[u8],
    kept: impl Fn(usize, &[u8]) -> bool,
) -> Res<f64> {
    let size = dtype.size_bytes();
    let len = input.len() / size;
    let scale = 1.0 / (1.0 - f64::from(P));
    let tol = match dtype {
        DataType::F32 => 1e-6,
        _ => 1e-3,
    };
    let mut kept_count = 0usize;
    for i in 0..len {
        let x = decode(dtype, &input[i * size..(i + 1) * size]);
        let y = decode(dtype, &out[i * size..(i + 1) * size]);
        if kept(i, &out[i * size..(i + 1) * size]) {
            kept_count += 1;
            if (y - x * scale).abs() > tol * (x * scale).abs() {
                return Err(format!("element {i}: kept {x} became {y}, not x / (1 - p)"));
            }
        } else if y != 0.0 {
            return Err(format!("element {i}: dropped but {y}"));
        }
    }
    let (n, p) = (len as f64, f64::from(P));
    let sigma = (n * p * (1.0 - p)).sqrt();
    let z = (kept_count as f64 - n * (1.0 - p)) / sigma;
    if z.abs() > 5.0 {
        return Err(format!(
            "kept {kept_count} of {len}: {z:.1} sigma from the expected {}",
            n * (1.0 - p)
        ));
    }
    Ok(z.abs())
}

fn mask_bit(mask: &[u8], i: usize) -> bool {
    (mask[i / 8] >> (i % 8)) & 1 != 0
}

// ---------------------------------------------------------------------------------------
// Running a row
// ---------------------------------------------------------------------------------------

struct Bench {
    cudnn: Option<CudnnSide>,
    ox: Oxidnn,
    timer: Timer,
    handle: Handle,
    copy_gbps: f64,
    rotation_bytes: usize,
}

/// The buffer sets of one problem.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    cu_desc: Result<TensorDesc, String>,
}

impl Group {
    fn new(b: &Bench, p: Problem) -> Res<Self> {
        let cu_desc = match &b.cudnn {
            Some(_) => TensorDesc::new(&p.desc),
            None => Err("cuDNN not loaded".into()),
        };
        let cu_reserve = match (&b.cudnn, &cu_desc) {
            (Some(c), Ok(d)) => c.reserve_bytes(d)?,
            _ => 0,
        };
        let first = Set::alloc(&b.handle, &p, cu_reserve)?;
        let count = b.rotation_bytes.div_ceil(first.bytes()).max(1);
        let mut sets = vec![first];
        for _ in 1..count {
            sets.push(Set::alloc(&b.handle, &p, cu_reserve)?);
        }
        let elements = p.desc.span_elements();
        let seed = p.dims.iter().fold(p.dtype.size_bytes() as u64, |s, &d| {
            s.wrapping_mul(31).wrapping_add(d as u64)
        });
        let x = random_bytes(p.dtype, elements, seed, INPUT_RANGE, INPUT_MIN_MAGNITUDE);
        let dy = random_bytes(
            p.dtype,
            elements,
            seed ^ 0x5555,
            INPUT_RANGE,
            INPUT_MIN_MAGNITUDE,
        );
        for set in &mut sets {
            b.handle
                .write_bytes(&mut set.x, &x)
                .context("uploading x")?;
            b.handle
                .write_bytes(&mut set.dy, &dy)
                .context("uploading dy")?;
        }
        Ok(Self { p, sets, cu_desc })
    }
}

enum Timing {
    Us(f64),
    Missing,
}

struct Row {
    op: Op,
    dtype: String,
    shape: String,
    bytes: u64,
    oxidnn: Timing,
    cudnn: Timing,
    check: Check,
    notes: Vec<String>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        match (&self.oxidnn, &self.cudnn) {
            (Timing::Us(o), Timing::Us(c)) => Some(c / o),
            _ => None,
        }
    }
}

/// Puts `set` in the state `op` starts from: the forward outputs a backward reads (LRN:
/// y; dropout: both libraries' masks, and cuDNN's y to check its backward with), the
/// output poisoned.
fn prepare(
    b: &mut Bench,
    op: Op,
    p: &Problem,
    cu_desc: Option<&TensorDesc>,
    set: &mut Set,
) -> Res<()> {
    let stream = b.timer.stream.clone();
    match op {
        Op::DropoutBwd => {
            if let (Some(c), Some(d)) = (&b.cudnn, cu_desc) {
                c.run(Op::DropoutFwd, d, set)?;
                common::copy_async(&stream, &mut set.aux, &set.out, p.desc.size_bytes())?;
            }
            b.ox.run(&b.handle, Op::DropoutFwd, p, set)
                .context("oxidnn dropout forward")?;
        }
        Op::LrnBwd => {
            b.ox.run(&b.handle, Op::LrnFwd, p, set)
                .context("oxidnn LRN forward")?;
            common::copy_async(&stream, &mut set.aux, &set.out, p.desc.size_bytes())?;
        }
        Op::DropoutFwd | Op::LrnFwd => {}
    }
    poison_async(&stream, &mut set.out)
}

fn read(b: &Bench, buf: &Buffer, bytes: usize) -> Res<Vec<u8>> {
    let mut v = b.handle.read_bytes(buf).context("reading a buffer")?;
    v.truncate(bytes);
    Ok(v)
}

/// Runs `op` once on set 0 through `side` and checks or returns its output.
fn check_dropout(b: &mut Bench, g: &mut Group, op: Op, cudnn: bool) -> Res<f64> {
    let p = &g.p;
    let cu_desc = g.cu_desc.as_ref().ok();
    let set = &mut g.sets[0];
    prepare(b, op, p, cu_desc, set)?;
    if cudnn {
        let (c, d) = (
            b.cudnn.as_ref().ok_or("no cuDNN")?,
            cu_desc.ok_or("no cuDNN descriptor")?,
        );
        c.run(op, d, set)?;
    } else {
        b.ox.run(&b.handle, op, p, set).context("oxidnn")?;
    }
    let bytes = p.desc.size_bytes();
    let out = read(b, &set.out, bytes)?;
    let dtype = p.dtype;
    let size = dtype.size_bytes();
    match (op, cudnn) {
        (Op::DropoutFwd, false) => {
            let (x, mask) = (
                read(b, &set.x, bytes)?,
                read(b, &set.ox_reserve, usize::MAX)?,
            );
            dropout_consistency(dtype, &x, &out, |i, _| mask_bit(&mask, i))
        }
        (Op::DropoutFwd, true) => {
            let x = read(b, &set.x, bytes)?;
            dropout_consistency(dtype, &x, &out, |_, y| decode(dtype, y) != 0.0)
        }
        (Op::DropoutBwd, false) => {
            let (dy, mask) = (
                read(b, &set.dy, bytes)?,
                read(b, &set.ox_reserve, usize::MAX)?,
            );
            dropout_consistency(dtype, &dy, &out, |i, _| mask_bit(&mask, i))
        }
        (Op::DropoutBwd, true) => {
            let (dy, y) = (read(b, &set.dy, bytes)?, read(b, &set.aux, bytes)?);
            dropout_consistency(dtype, &dy, &out, |i, _| {
                decode(dtype, &y[i * size..(i + 1) * size]) != 0.0
            })
        }
        _ => Err("internal: not a dropout op".into()),
    }
}

/// The output of one LRN run on set 0.
fn lrn_output(b: &mut Bench, g: &mut Group, op: Op, cudnn: bool) -> Res<Vec<u8>> {
    let p = &g.p;
    let cu_desc = g.cu_desc.as_ref().ok();
    let set = &mut g.sets[0];
    prepare(b, op, p, cu_desc, set)?;
    if cudnn {
        let (c, d) = (
            b.cudnn.as_ref().ok_or("no cuDNN")?,
            cu_desc.ok_or("no cuDNN descriptor")?,
        );
        c.run(op, d, set)?;
    } else {
        b.ox.run(&b.handle, op, p, set).context("oxidnn")?;
    }
    read(b, &set.out, p.desc.size_bytes())
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

fn run_case(b: &mut Bench, g: &mut Group, op: Op) -> Row {
    let mut row = Row {
        op,
        dtype: g.p.label(op),
        shape: g.p.shape(),
        bytes: op.bytes_moved(&g.p.desc),
        oxidnn: Timing::Missing,
        cudnn: Timing::Missing,
        check: Check::Error,
        notes: vec![],
    };
    let have_cudnn = b.cudnn.is_some() && g.cu_desc.is_ok();
    if let (Some(_), Err(e)) = (&b.cudnn, &g.cu_desc) {
        row.notes.push(format!("cuDNN: {e}"));
    }
    let mut sides = vec![];
    if op.is_dropout() {
        let ours = check_dropout(b, g, op, false);
        let theirs = have_cudnn.then(|| check_dropout(b, g, op, true));
        row.check = match (&ours, &theirs) {
            (Ok(z), Some(Ok(zc))) => Check::Ok(z.max(*zc)),
            (Ok(z), None) => {
                row.notes
                    .push(format!("oxidnn keep rate {z:.2} sigma off; no cuDNN run"));
                Check::NoReference
            }
            (Ok(_), Some(Err(e))) => {
                row.notes.push(format!("cuDNN output inconsistent: {e}"));
                Check::Mismatch(f64::NAN)
            }
            (Err(e), _) => {
                row.notes
                    .push(format!("oxidnn output inconsistent or failed: {e}"));
                Check::Error
            }
        };
        if ours.is_ok() {
            sides.push(Side::Oxidnn);
        }
        if matches!(theirs, Some(Ok(_))) {
            sides.push(Side::Cudnn);
        }
    } else {
        let ours = lrn_output(b, g, op, false);
        let theirs = have_cudnn.then(|| lrn_output(b, g, op, true));
        let tol = if g.p.dtype == DataType::F32 {
            1e-4
        } else {
            1e-2
        };
        row.check = Check::compare(&ours, theirs.as_ref(), g.p.dtype, tol);
        match &ours {
            Ok(_) => sides.push(Side::Oxidnn),
            Err(e) => row.notes.push(e.clone()),
        }
        match &theirs {
            Some(Ok(_)) => sides.push(Side::Cudnn),
            Some(Err(e)) => row.notes.push(e.clone()),
            None => {}
        }
    }
    if sides.is_empty() {
        return row;
    }

    // Time: both libraries alternate call by call, each call on the next buffer set.
    let mut sets = std::mem::take(&mut g.sets);
    let prepared = sets
        .iter_mut()
        .try_for_each(|set| prepare(b, op, &g.p, g.cu_desc.as_ref().ok(), set));
    let timed = prepared.and_then(|()| {
        let count = sets.len();
        let (timer, ox, handle, cudnn) = (&b.timer, &mut b.ox, &b.handle, &b.cudnn);
        timer.measure(sides.len(), WARMUP, RUNS, |side, invocation| {
            let set = &mut sets[invocation % count];
            match (sides[side], cudnn, &g.cu_desc) {
                (Side::Oxidnn, _, _) => ox.run(handle, op, &g.p, set).context("oxidnn"),
                (Side::Cudnn, Some(c), Ok(d)) => c.run(op, d, set),
                _ => Err("internal: cuDNN side without cuDNN".into()),
            }
        })
    });
    g.sets = sets;
    match timed {
        Ok(m) => {
            for (side, us) in sides.iter().zip(&m.median_us) {
                match side {
                    Side::Oxidnn => row.oxidnn = Timing::Us(*us),
                    Side::Cudnn => row.cudnn = Timing::Us(*us),
                }
            }
            if !m.gated {
                row.notes
                    .push("stream gate timed out: times may include host launch overhead".into());
            }
        }
        Err(e) => row.notes.push(format!("timing failed: {e}")),
    }
    row
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str = "op,dtype,shape,bytes_moved,oxidnn_us,oxidnn_gbps,pct_copy_bw,cudnn_us,cudnn_gbps,ratio_cudnn_over_oxidnn,check,check_value";

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
    copy_gbps: f64,
}

impl Report {
    fn new(copy_gbps: f64) -> Self {
        Self {
            rows: vec![],
            csv: open_csv(
                "dropout_lrn_vs_cudnn",
                "dropout-lrn-results.csv",
                CSV_HEADER,
            ),
            copy_gbps,
        }
    }

    fn print_header(&self) {
        println!(
            "{:<12} {:<9} {:<15} {:>9} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  check",
            "op",
            "dtype",
            "shape",
            "MB moved",
            "oxidnn us",
            "GB/s",
            "%copy",
            "cuDNN us",
            "GB/s",
            "cu/ox"
        );
    }

    fn add(&mut self, row: Row) {
        let us = |t: &Timing| match t {
            Timing::Us(us) => Some(*us),
            Timing::Missing => None,
        };
        let (ox_us, cu_us) = (us(&row.oxidnn), us(&row.cudnn));
        let ox_gbps = ox_us.map(|t| gb_per_s(row.bytes, t));
        let cu_gbps = cu_us.map(|t| gb_per_s(row.bytes, t));
        let pct = ox_gbps.map(|g| 100.0 * g / self.copy_gbps);
        let (check, value) = row.check.label();
        let value_text = match value {
            Some(v) if row.op.is_dropout() => format!("keep rate within {v:.2} sigma"),
            Some(v) => format!("{v:.1e}"),
            None => String::new(),
        };
        println!(
            "{:<12} {:<9} {:<15} {:>9.1} {:>10} {:>7} {:>6} {:>10} {:>7} {:>7}  {check} {value_text}",
            row.op.name(),
            row.dtype,
            row.shape,
            row.bytes as f64 / 1e6,
            fmt_opt(ox_us, 1),
            fmt_opt(ox_gbps, 0),
            fmt_opt(pct, 1),
            fmt_opt(cu_us, 1),
            fmt_opt(cu_gbps, 0),
            fmt_opt(row.ratio(), 2),
        );
        for note in &row.notes {
            println!("    ! {note}");
        }
        if let Some((path, w)) = &mut self.csv {
            let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
            let line = format!(
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                row.op.name(),
                row.dtype,
                row.shape,
                row.bytes,
                cell(ox_us),
                cell(ox_gbps),
                cell(pct),
                cell(cu_us),
                cell(cu_gbps),
                cell(row.ratio()),
                check,
                value.map_or_else(String::new, |e| format!("{e:e}")),
            );
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
                eprintln!("dropout_lrn_vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: geometric mean of cuDNN time / oxidnn time (> 1: oxidnn faster), rows that passed the check");
        let line = |name: &str, v: Vec<f64>| {
            if v.is_empty() {
                println!("  {name:<12} {:>4} rows   n/a", 0);
            } else {
                let geomean = (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp();
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "  {name:<12} {:>4} rows   geomean {geomean:.3}   (min {min:.2}, max {max:.2})",
                    v.len()
                );
            }
        };
        let ratios = |family: Option<&str>| -> Vec<f64> {
            self.rows
                .iter()
                .filter(|r| family.is_none_or(|f| r.op.family() == f))
                .filter(|r| matches!(r.check, Check::Ok(_)))
                .filter_map(Row::ratio)
                .collect()
        };
        for family in ["dropout", "lrn"] {
            line(family, ratios(Some(family)));
        }
        line("all", ratios(None));
        let bad = self
            .rows
            .iter()
            .filter(|r| matches!(r.check, Check::Mismatch(_) | Check::Error))
            .count();
        println!("  rows: {}, MISMATCH or error: {bad}", self.rows.len());
        println!("  copy bandwidth: {:.0} GB/s", self.copy_gbps);
        println!("  device: {device}");
        if let Some((path, _)) = &self.csv {
            println!("  CSV: {path}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

/// What cuDNN does with p = 1 (its documentation states no range): the status of
/// cudnnSetDropoutDescriptor and, if accepted, whether a forward call zeroes its output.
fn probe_cudnn_p_one(c: &CudnnSide, h: &Handle) -> Res<String> {
    let desc = DropoutDesc::create()?;
    let cu = c.cu.handle.0;
    let mut bytes = 0usize;
    // SAFETY: live handle, valid out-pointer.
    cudnn_check(
        unsafe { cudnn_sys::cudnnDropoutGetStatesSize(cu, &mut bytes) },
        "cudnnDropoutGetStatesSize",
    )?;
    let states = h.alloc_bytes(bytes).context("allocating probe states")?;
    // SAFETY: live descriptor and handle; the states buffer holds `bytes` bytes and
    // outlives every use of the descriptor below.
    let status = unsafe {
        cudnn_sys::cudnnSetDropoutDescriptor(
            desc.0,
            cu,
            1.0,
            dev_mut(device_address(&states)?),
            bytes,
            SEED,
        )
    };
    if status != cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(format!(
            "cudnnSetDropoutDescriptor(p = 1) returns {status:?}"
        ));
    }
    let d =
        TensorDescriptor::packed(DataType::F32, &[1, 1, 1, 4096]).context("probe descriptor")?;
    let td = TensorDesc::new(&d)?;
    let mut rbytes = 0usize;
    // SAFETY: live descriptor, valid out-pointer.
    cudnn_check(
        unsafe { cudnn_sys::cudnnDropoutGetReserveSpaceSize(td.0, &mut rbytes) },
        "cudnnDropoutGetReserveSpaceSize",
    )?;
    let x = h.upload(&vec![1.0f32; 4096]).context("probe x")?;
    let y = h.alloc(&d).context("probe y")?;
    let reserve = h.alloc_bytes(rbytes).context("probe reserve")?;
    // SAFETY: live descriptors; x and y hold 4096 floats, the reserve the size cuDNN asked
    // for; same stream as every other user of these buffers.
    let status = unsafe {
        cudnn_sys::cudnnDropoutForward(
            cu,
            desc.0,
            td.0,
            dev(device_address(&x)?),
            td.0,
            dev_mut(device_address(&y)?),
            dev_mut(device_address(&reserve)?),
            rbytes,
        )
    };
    if status != cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(format!(
            "accepted by cudnnSetDropoutDescriptor, cudnnDropoutForward returns {status:?}"
        ));
    }
    let out = h.read::<f32>(&y).context("reading the probe")?;
    let zeros = out.iter().filter(|v| **v == 0.0).count();
    let non_finite = out.iter().filter(|v| !v.is_finite()).count();
    Ok(format!(
        "accepted; forward gives {zeros} zeros, {non_finite} non-finite of 4096 (oxidnn: all zero)"
    ))
}

impl Args {
    fn selects(&self, op: Op, p: &Problem, first_shape: bool) -> bool {
        if self.quick && !first_shape {
            return false;
        }
        let key = format!("{} {} {}", op.name(), p.label(op), p.shape());
        self.filter
            .as_ref()
            .is_none_or(|f| key.contains(f.as_str()))
    }
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let Some(gpu) = open_gpu("dropout_lrn_vs_cudnn")? else {
        return Ok(());
    };
    let (handle, stream, device, l2) = (gpu.handle, gpu.stream, gpu.name, gpu.l2_bytes);
    println!("oxidnn vs cuDNN: dropout and LRN");
    println!("{}", gpu.summary);
    let cudnn = match Cudnn::open(&stream) {
        Ok(cu) => {
            println!(
                "cuDNN {} (built for CUDA runtime {}.{})",
                version_string(cu.version),
                cu.cudart_version / 1000,
                cu.cudart_version % 1000 / 10
            );
            Some(CudnnSide::new(cu, &handle)?)
        }
        Err(why) => {
            println!("cuDNN: NOT AVAILABLE ({why}); timing oxidnn only, outputs unchecked");
            None
        }
    };
    if let Some(c) = &cudnn {
        match probe_cudnn_p_one(c, &handle) {
            Ok(s) => println!("cuDNN dropout at p = 1: {s}"),
            Err(e) => println!("cuDNN dropout at p = 1: probe failed: {e}"),
        }
    }
    let mut states = handle
        .alloc_bytes(dropout_states_size(&handle))
        .context("states")?;
    let ox = Oxidnn {
        dropout: DropoutDescriptor::new(&handle, f64::from(P), &mut states, SEED)
            .context("dropout descriptor")?,
        states,
        lrn: LrnDescriptor::new(LRN_N, LRN_ALPHA, LRN_BETA, LRN_K).context("LRN descriptor")?,
    };
    let timer = Timer::new(&stream, MAX_SIDES * RUNS)?;
    let mut bench = Bench {
        cudnn,
        ox,
        timer,
        handle,
        copy_gbps: 0.0,
        rotation_bytes: ROTATION_MIN_BYTES.max(4 * l2),
    };
    bench.copy_gbps = copy_bandwidth(&bench.handle, &bench.timer, WARMUP, RUNS)?;
    println!(
        "timing: CUDA events per call on the handle's stream; {WARMUP} warm-up + {RUNS} timed calls per library, median; \
         calls queued behind a stream gate (device time); oxidnn and cuDNN alternate; buffer sets rotate over >= {} MiB",
        bench.rotation_bytes >> 20
    );
    println!(
        "copy bandwidth (cuMemcpyDtoDAsync, 1 GiB, read + write bytes): {:.0} GB/s",
        bench.copy_gbps
    );
    println!(
        "dropout p = {P}: the two libraries' masks differ by design (different generators), so outputs are not \
         compared byte for byte: each is checked for keep rate (5 sigma), exact zeros and the 1/(1-p) scale"
    );
    println!("LRN n = {LRN_N}, alpha = {LRN_ALPHA}, beta = {LRN_BETA}, k = {LRN_K}: outputs compared with cuDNN's");
    if args.quick {
        println!("OXIDNN_BENCH_QUICK: first shape of each family only");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    println!();

    let mut problems: Vec<(Problem, [Op; 2], bool)> = vec![];
    for (i, dims) in DROPOUT_SHAPES.iter().enumerate() {
        for dtype in DROPOUT_TYPES {
            let p = Problem::new(dims, dtype, Layout::ChannelsFirst).context("describing")?;
            problems.push((p, [Op::DropoutFwd, Op::DropoutBwd], i == 0));
        }
    }
    for (i, dims) in LRN_SHAPES.iter().enumerate() {
        for (dtype, layout) in LRN_TYPES {
            let p = Problem::new(dims, dtype, layout).context("describing")?;
            problems.push((p, [Op::LrnFwd, Op::LrnBwd], i == 0));
        }
    }
    let mut report = Report::new(bench.copy_gbps);
    report.print_header();
    for (p, ops, first) in problems {
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|&op| args.selects(op, &p, first))
            .collect();
        if ops.is_empty() {
            continue;
        }
        let what = format!("{} {}", p.dtype, p.shape());
        let mut group = match Group::new(&bench, p) {
            Ok(g) => g,
            Err(e) => {
                println!("    ! {what}: skipped: {e}");
                continue;
            }
        };
        for op in ops {
            report.add(run_case(&mut bench, &mut group, op));
        }
        bench.timer.synchronize()?;
    }
    if report.rows.is_empty() {
        println!("no rows match the filter");
    }
    report.print_summary(&device);
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
