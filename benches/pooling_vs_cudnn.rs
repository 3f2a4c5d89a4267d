//! oxidnn's pooling against cuDNN's: both libraries pool the same device buffers on the
//! same stream, their outputs are checked against each other, then both are timed.
//!
//! ```text
//! cargo bench --features cudnn-bench --bench pooling_vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `direction.case layout shape` key contains
//!   it, e.g. `fwd`, `max3x3`, `f16.nhwc`, `gavg`, `bwd.max2x2x2`.
//! * `OXIDNN_BENCH_QUICK=1`: f32 NCHW and f16 NHWC only (every case, a smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `pooling-results.csv` in the cwd).
//! * `OXIDNN_BENCH_POOLING_ALGOS=1`: also time each backward algorithm oxidnn has for the
//!   problem (`bwd:gather`, `bwd:cell`, `bwd:tile` rows, outside the summary's geomeans);
//!   the `bwd` row is the heuristic's choice.
//!
//! Cases (ResNet-50 at N = 32, one 3-D shape): max 3x3 stride 2 padding 1 on 64x112x112
//! (the stem); global average over 2048x7x7; max 2x2x2 stride 2 on N = 8, C = 64,
//! 16x56x56; average 2x2 stride 2 on 256x56x56. Each as f32 NCHW, f16 NHWC and f16 NCHW,
//! forward (`y = pool(x)`) and backward (`dx = grad(y, dy, x)`, y the forward output).
//! cuDNN runs `CUDNN_POOLING_MAX` (its default max, nondeterministic where windows overlap;
//! oxidnn is always deterministic), `CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING`,
//! `CUDNN_NOT_PROPAGATE_NAN`. A last case, `ties`, repeats the stem's backward on inputs
//! drawn from {0, 1, 2, 3} (most windows have tied maxima): it checks that cuDNN, like
//! oxidnn, sends a window's gradient to its first maximum in scan order.
//!
//! Method (as `vs_cudnn`): every timed call is bracketed by its own pair of CUDA events on
//! the handle's stream; 5 warm-up calls, then 30 timed calls per library, median reported.
//! The timed calls are queued behind a host-side stream gate and released together, so the
//! events measure device time, not host launch overhead. oxidnn and cuDNN alternate call by
//! call, and buffer sets rotate (at least 200 MiB and 4x the L2 in all) so no call reads
//! what the previous one left in cache. Before timing, one run of each library from a
//! poisoned output is compared: ||oxidnn - cuDNN|| / ||cuDNN|| above 1e-5 (f32) or 1e-2
//! (f16) is a MISMATCH (still timed, left out of the summary). "Bytes moved" is the minimum
//! traffic: forward x + y; max backward x + y + dy + dx; average backward dy + dx. The
//! roofline reference is the device-to-device copy bandwidth (1 GiB, read + write bytes).
//!
//! Without libcudnn only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::cudnn::{
    copy_bandwidth, cudnn_check, cudnn_sys, gb_per_s, version_string, Cudnn, TensorDesc,
};
use common::{
    dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes, Args,
    Check, Context, Res, Timer,
};
use oxidnn::ops::pooling::{
    pooling_backward_kernel, pooling_backward_with, pooling_forward_kernel, PoolingBwdAlgo,
};
use oxidnn::{
    pooling_backward, pooling_forward, pooling_forward_output_dims, Buffer, DataType, Handle,
    Layout, PoolingDescriptor, PoolingMode, PoolingNanOpt, TensorDescriptor,
};
use std::ffi::c_void;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

/// Untimed calls per library before the timed ones.
const WARMUP: usize = 5;
/// Timed calls per library; the median is reported.
const RUNS: usize = 30;
/// Libraries timed side by side (oxidnn, cuDNN).
const MAX_SIDES: usize = 2;
/// Buffer sets of one problem together span at least this much (and 4x the L2).
const ROTATION_MIN_BYTES: usize = 200 << 20;
/// Inputs are uniform in `[-INPUT_RANGE, INPUT_RANGE]` (the `ties` case: {0, 1, 2, 3}).
const INPUT_RANGE: f32 = 2.0;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pooling_vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

/// A pooling problem: the operation and the input's logical dims `N, C, spatial..`.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    mode: PoolingMode,
    window: &'static [usize],
    padding: &'static [usize],
    stride: &'static [usize],
    dims: &'static [usize],
    /// Inputs from {0, 1, 2, 3} (ties) instead of uniform values; backward only.
    ties: bool,
}

const CASES: [Case; 7] = [
    Case {
        name: "max3x3s2p1",
        mode: PoolingMode::Max,
        window: &[3, 3],
        padding: &[1, 1],
        stride: &[2, 2],
        dims: &[32, 64, 112, 112],
        ties: false,
    },
    Case {
        name: "gavg7x7",
        mode: PoolingMode::AverageCountIncludePadding,
        window: &[7, 7],
        padding: &[0, 0],
        stride: &[1, 1],
        dims: &[32, 2048, 7, 7],
        ties: false,
    },
    Case {
        name: "max2x2x2s2",
        mode: PoolingMode::Max,
        window: &[2, 2, 2],
        padding: &[0, 0, 0],
        stride: &[2, 2, 2],
        dims: &[8, 64, 16, 56, 56],
        ties: false,
    },
    Case {
        name: "avg2x2s2",
        mode: PoolingMode::AverageCountIncludePadding,
        window: &[2, 2],
        padding: &[0, 0],
        stride: &[2, 2],
        dims: &[32, 256, 56, 56],
        ties: false,
    },
    // VGG's pooling after its second block.
    Case {
        name: "max2x2s2",
        mode: PoolingMode::Max,
        window: &[2, 2],
        padding: &[0, 0],
        stride: &[2, 2],
        dims: &[32, 128, 112, 112],
        ties: false,
    },
    // GoogLeNet's inception 3a pooling branch.
    Case {
        name: "max3x3s1p1",
        mode: PoolingMode::Max,
        window: &[3, 3],
        padding: &[1, 1],
        stride: &[1, 1],
        dims: &[32, 192, 28, 28],
        ties: false,
    },
    Case {
        name: "max3x3s2p1.ties",
        mode: PoolingMode::Max,
        window: &[3, 3],
        padding: &[1, 1],
        stride: &[2, 2],
        dims: &[32, 64, 112, 112],
        ties: true,
    },
];

/// Data type and memory layout of a row.
const VARIANTS: [(DataType, Layout); 3] = [
    (DataType::F32, Layout::ChannelsFirst),
    (DataType::F16, Layout::ChannelsLast),
    (DataType::F16, Layout::ChannelsFirst),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Direction {
    Forward,
    /// The backward, with oxidnn's algorithm forced when given.
    Backward(Option<PoolingBwdAlgo>),
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Forward => "fwd",
            Direction::Backward(None) => "bwd",
            Direction::Backward(Some(PoolingBwdAlgo::Gather)) => "bwd:gather",
            Direction::Backward(Some(PoolingBwdAlgo::Cell)) => "bwd:cell",
            Direction::Backward(Some(PoolingBwdAlgo::Tile)) => "bwd:tile",
        }
    }

    fn is_backward(self) -> bool {
        matches!(self, Direction::Backward(_))
    }
}

fn layout_name(dtype: DataType, layout: Layout) -> String {
    let l = match layout {
        Layout::ChannelsFirst => "nchw",
        Layout::ChannelsLast => "nhwc",
    };
    format!("{dtype}.{l}")
}

fn shape_string(dims: &[usize]) -> String {
    dims.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// The descriptors of one case, dtype and layout.
struct Problem {
    case: Case,
    pool: PoolingDescriptor,
    x: TensorDescriptor,
    y: TensorDescriptor,
}

impl Problem {
    fn new(case: Case, dtype: DataType, layout: Layout) -> oxidnn::Result<Self> {
        let pool = PoolingDescriptor::new_nd(
            case.mode,
            PoolingNanOpt::NotPropagate,
            case.window,
            case.padding,
            case.stride,
        )?;
        let d = case.dims;
        let x = TensorDescriptor::spatial(dtype, d[0], d[1], &d[2..], layout)?;
        let yd = pooling_forward_output_dims(&pool, &x)?;
        let y = TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], layout)?;
        Ok(Self { case, pool, x, y })
    }

    fn dtype(&self) -> DataType {
        self.x.dtype()
    }

    /// Minimum bytes moved: each input read once, each output written once.
    fn bytes_moved(&self, dir: Direction) -> u64 {
        let (x, y) = (self.x.size_bytes() as u64, self.y.size_bytes() as u64);
        match dir {
            Direction::Forward => x + y,
            Direction::Backward(_) if self.case.mode.is_max() => 2 * x + 2 * y,
            Direction::Backward(_) => x + y,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// One set of buffers. Invariant (`Set::alloc`): `x` and `dx` hold `p.x`'s span, `y`, `dy`
/// and `out` hold `p.y`'s.
struct Set {
    x: Buffer,
    /// The forward output (input of the backward).
    y: Buffer,
    dy: Buffer,
    /// The forward's output under test.
    out: Buffer,
    dx: Buffer,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem) -> Res<Self> {
        let alloc = |d: &TensorDescriptor| h.alloc(d).context("allocating a buffer");
        Ok(Self {
            x: alloc(&p.x)?,
            y: alloc(&p.y)?,
            dy: alloc(&p.y)?,
            out: alloc(&p.y)?,
            dx: alloc(&p.x)?,
        })
    }

    fn bytes(&self) -> usize {
        [&self.x, &self.y, &self.dy, &self.out, &self.dx]
            .iter()
            .map(|b| b.len_bytes())
            .sum()
    }

    fn output(&mut self, dir: Direction) -> &mut Buffer {
        match dir {
            Direction::Forward => &mut self.out,
            Direction::Backward(_) => &mut self.dx,
        }
    }
}

/// `count` values from {0, 1, 2, 3}, encoded as `dtype`.
fn small_integer_bytes(dtype: DataType, count: usize, seed: u64) -> Vec<u8> {
    let mut rng = common::SplitMix(seed);
    let size = dtype.size_bytes();
    let mut bytes = vec![0u8; count * size];
    for out in bytes.chunks_exact_mut(size) {
        common::encode(dtype, (rng.next_u64() % 4) as f32, out);
    }
    bytes
}

// ---------------------------------------------------------------------------------------
// cuDNN
// ---------------------------------------------------------------------------------------

crate::cudnn_object!(
    PoolDesc,
    cudnn_sys::cudnnPoolingDescriptor_t,
    cudnnCreatePoolingDescriptor,
    cudnnDestroyPoolingDescriptor
);

/// cuDNN's descriptors of a [`Problem`].
struct CudnnProblem {
    pool: PoolDesc,
    x: TensorDesc,
    y: TensorDesc,
}

impl CudnnProblem {
    fn new(p: &Problem) -> Res<Self> {
        use cudnn_sys::cudnnPoolingMode_t as M;
        let mode = match p.case.mode {
            PoolingMode::Max => M::CUDNN_POOLING_MAX,
            PoolingMode::MaxDeterministic => M::CUDNN_POOLING_MAX_DETERMINISTIC,
            PoolingMode::AverageCountIncludePadding => {
                M::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
            }
            PoolingMode::AverageCountExcludePadding => {
                M::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
            }
        };
        let ints = |v: &[usize]| v.iter().map(|&e| e as i32).collect::<Vec<i32>>();
        let (window, padding, stride) = (
            ints(p.case.window),
            ints(p.case.padding),
            ints(p.case.stride),
        );
        let pool = PoolDesc::create()?;
        // SAFETY: `pool` is live; the arrays hold `window.len()` values each and outlive the call.
        let status = unsafe {
            cudnn_sys::cudnnSetPoolingNdDescriptor(
                pool.0,
                mode,
                cudnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                window.len() as i32,
                window.as_ptr(),
                padding.as_ptr(),
                stride.as_ptr(),
            )
        };
        cudnn_check(status, "cudnnSetPoolingNdDescriptor")?;
        Ok(Self {
            pool,
            x: TensorDesc::new(&p.x)?,
            y: TensorDesc::new(&p.y)?,
        })
    }
}

/// A host f32 scalar for cuDNN (alpha and beta for f32 and f16 data).
#[repr(C, align(8))]
struct Scalar(f32);

impl Scalar {
    fn ptr(&self) -> *const c_void {
        std::ptr::from_ref(&self.0).cast()
    }
}

/// Runs the pooling through cuDNN on `set`'s buffers.
///
/// Invariant behind both unsafe calls: the descriptors are live and describe the problem;
/// the addresses are `set`'s live buffers, which hold the spans of those descriptors
/// (`Set::alloc`); cuDNN issues on the oxidnn handle's stream, the only stream that touches
/// them; the scalars live on the host for the whole call.
fn run_cudnn(cu: &Cudnn, d: &CudnnProblem, dir: Direction, set: &mut Set) -> Res<()> {
    let (one, zero) = (Scalar(1.0), Scalar(0.0));
    let a = |b: &Buffer| device_address(b);
    let status = match dir {
        Direction::Forward => {
            let (x, out) = (a(&set.x)?, a(&set.out)?);
            // SAFETY: see the invariant above; out = pool(x).
            unsafe {
                cudnn_sys::cudnnPoolingForward(
                    cu.handle.0,
                    d.pool.0,
                    one.ptr(),
                    d.x.0,
                    dev(x),
                    zero.ptr(),
                    d.y.0,
                    dev_mut(out),
                )
            }
        }
        Direction::Backward(_) => {
            let (y, dy, x, dx) = (a(&set.y)?, a(&set.dy)?, a(&set.x)?, a(&set.dx)?);
            // SAFETY: see the invariant above; dx = grad(y, dy, x).
            unsafe {
                cudnn_sys::cudnnPoolingBackward(
                    cu.handle.0,
                    d.pool.0,
                    one.ptr(),
                    d.y.0,
                    dev(y),
                    d.y.0,
                    dev(dy),
                    d.x.0,
                    dev(x),
                    zero.ptr(),
                    d.x.0,
                    dev_mut(dx),
                )
            }
        }
    };
    cudnn_check(status, "cudnnPooling")
}

fn run_oxidnn(h: &Handle, p: &Problem, dir: Direction, set: &mut Set) -> oxidnn::Result<()> {
    let (pool, x, y) = (&p.pool, &p.x, &p.y);
    match dir {
        Direction::Forward => pooling_forward(h, pool, 1.0, x, &set.x, 0.0, y, &mut set.out),
        Direction::Backward(None) => pooling_backward(
            h,
            pool,
            1.0,
            y,
            &set.y,
            y,
            &set.dy,
            x,
            &set.x,
            0.0,
            x,
            &mut set.dx,
        ),
        Direction::Backward(Some(algo)) => pooling_backward_with(
            h,
            algo,
            pool,
            1.0,
            y,
            &set.y,
            y,
            &set.dy,
            x,
            &set.x,
            0.0,
            x,
            &mut set.dx,
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Running a row
// ---------------------------------------------------------------------------------------

struct Bench {
    cudnn: Option<Cudnn>,
    timer: Timer,
    handle: Handle,
    copy_gbps: f64,
    rotation_bytes: usize,
}

/// The buffers of one problem: `sets` rotate so that no call hits in L2.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    cudnn: Result<CudnnProblem, String>,
}

impl Group {
    fn new(b: &Bench, p: Problem) -> Res<Self> {
        let first = Set::alloc(&b.handle, &p)?;
        let count = b.rotation_bytes.div_ceil(first.bytes()).max(1);
        let mut sets = vec![first];
        for _ in 1..count {
            sets.push(Set::alloc(&b.handle, &p)?);
        }
        let dtype = p.dtype();
        let seed = p.case.dims.iter().fold(dtype.size_bytes() as u64, |s, &d| {
            s.wrapping_mul(31).wrapping_add(d as u64)
        });
        // Bytes over each tensor's whole span (dense here, so span = elements).
        let (xn, yn) = (p.x.span_elements(), p.y.span_elements());
        let x = if p.case.ties {
            small_integer_bytes(dtype, xn, seed)
        } else {
            random_bytes(dtype, xn, seed, INPUT_RANGE, 0.0)
        };
        let dy = random_bytes(dtype, yn, seed ^ 0x5555, INPUT_RANGE, 0.0);
        for set in &mut sets {
            b.handle
                .write_bytes(&mut set.x, &x)
                .context("uploading x")?;
            b.handle
                .write_bytes(&mut set.dy, &dy)
                .context("uploading dy")?;
            // y: the forward output, as the backward expects.
            pooling_forward(&b.handle, &p.pool, 1.0, &p.x, &set.x, 0.0, &p.y, &mut set.y)
                .context("computing y")?;
        }
        let cudnn = match &b.cudnn {
            Some(_) => CudnnProblem::new(&p),
            None => Err("cuDNN not loaded".into()),
        };
        Ok(Self { p, sets, cudnn })
    }
}

struct Row {
    dir: Direction,
    case: &'static str,
    layout: String,
    shape: String,
    bytes: u64,
    oxidnn: Option<f64>,
    cudnn: Option<f64>,
    check: Check,
    notes: Vec<String>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        Some(self.cudnn? / self.oxidnn?)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

fn output_bytes(b: &Bench, p: &Problem, dir: Direction, set: &mut Set) -> Res<Vec<u8>> {
    let desc = match dir {
        Direction::Forward => p.y,
        Direction::Backward(_) => p.x,
    };
    let mut bytes = b
        .handle
        .read_bytes(set.output(dir))
        .context("reading the output")?;
    bytes.truncate(desc.size_bytes());
    Ok(bytes)
}

/// Checks and times one row; `None` for a forced backward algorithm that does not apply.
fn run_row(b: &Bench, g: &mut Group, dir: Direction) -> Option<Row> {
    let p = &g.p;
    let mut row = Row {
        dir,
        case: p.case.name,
        layout: layout_name(
            p.dtype(),
            if p.x.strides()[1] == 1 {
                Layout::ChannelsLast
            } else {
                Layout::ChannelsFirst
            },
        ),
        shape: shape_string(p.case.dims),
        bytes: p.bytes_moved(dir),
        oxidnn: None,
        cudnn: None,
        check: Check::Error,
        notes: vec![],
    };
    let kernel = match dir {
        Direction::Forward => pooling_forward_kernel(&b.handle, &p.pool, &p.x, &p.y),
        Direction::Backward(algo) => {
            pooling_backward_kernel(&b.handle, algo, &p.pool, &p.x, &p.y, &p.y, &p.x)
        }
    };
    match kernel {
        Ok(k) => row.notes.push(format!("oxidnn kernel {k}")),
        Err(oxidnn::Error::NotSupported { .. }) if dir != Direction::Backward(None) => return None,
        Err(e) => {
            row.notes.push(format!("oxidnn: {e}"));
            return Some(row);
        }
    }
    let cu = match (&b.cudnn, &g.cudnn) {
        (Some(cu), Ok(d)) => Some((cu, d)),
        (Some(_), Err(e)) => {
            row.notes.push(format!("cuDNN: {e}"));
            None
        }
        (None, _) => None,
    };
    let s = &b.timer.stream;
    // Check: one run of each library on set 0 from a poisoned output.
    let set0 = &mut g.sets[0];
    let ox_out = poison_async(s, set0.output(dir))
        .and_then(|()| run_oxidnn(&b.handle, p, dir, set0).context("oxidnn"))
        .and_then(|()| output_bytes(b, p, dir, set0));
    let cu_out = cu.map(|(cu, d)| {
        poison_async(s, set0.output(dir))
            .and_then(|()| run_cudnn(cu, d, dir, set0))
            .and_then(|()| output_bytes(b, p, dir, set0))
    });
    let mut sides = vec![];
    match &ox_out {
        Ok(_) => sides.push(Side::Oxidnn),
        Err(e) => row.notes.push(e.clone()),
    }
    match &cu_out {
        Some(Ok(_)) => sides.push(Side::Cudnn),
        Some(Err(e)) => row.notes.push(e.clone()),
        None => {}
    }
    let tolerance = if p.dtype() == DataType::F32 {
        1e-5
    } else {
        1e-2
    };
    row.check = Check::compare(&ox_out, cu_out.as_ref(), p.dtype(), tolerance);
    if sides.is_empty() {
        return Some(row);
    }
    let count = g.sets.len();
    let timed = b
        .timer
        .measure(sides.len(), WARMUP, RUNS, |side, invocation| {
            let set = &mut g.sets[invocation % count];
            match (sides[side], cu) {
                (Side::Oxidnn, _) => run_oxidnn(&b.handle, p, dir, set).context("oxidnn"),
                (Side::Cudnn, Some((cu, d))) => run_cudnn(cu, d, dir, set),
                (Side::Cudnn, None) => Err("internal: cuDNN side without descriptors".into()),
            }
        });
    match timed {
        Ok(m) => {
            for (side, us) in sides.iter().zip(&m.median_us) {
                match side {
                    Side::Oxidnn => row.oxidnn = Some(*us),
                    Side::Cudnn => row.cudnn = Some(*us),
                }
            }
            if !m.gated {
                row.notes
                    .push("stream gate timed out: times may include host launch overhead".into());
            }
        }
        Err(e) => row.notes.push(format!("timing failed: {e}")),
    }
    Some(row)
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str = "direction,case,layout,shape,bytes_moved,oxidnn_us,oxidnn_gbps,pct_copy_bw,cudnn_us,cudnn_gbps,ratio_cudnn_over_oxidnn,check,rel_err";

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
    copy_gbps: f64,
}

impl Report {
    fn print_header(&self) {
        println!(
            "{:<4} {:<16} {:<9} {:<15} {:>8} {:>10} {:>6} {:>6} {:>10} {:>6} {:>6}  check",
            "dir",
            "case",
            "layout",
            "shape",
            "MB",
            "oxidnn us",
            "GB/s",
            "%copy",
            "cuDNN us",
            "GB/s",
            "cu/ox"
        );
    }

    fn add(&mut self, row: Row) {
        let ox_gbps = row.oxidnn.map(|t| gb_per_s(row.bytes, t));
        let cu_gbps = row.cudnn.map(|t| gb_per_s(row.bytes, t));
        let pct = ox_gbps.map(|g| 100.0 * g / self.copy_gbps);
        let (check, err) = row.check.label();
        let err_text = err.map_or_else(String::new, |e| format!("{e:.1e}"));
        println!(
            "{:<4} {:<16} {:<9} {:<15} {:>8.1} {:>10} {:>6} {:>6} {:>10} {:>6} {:>6}  {check} {err_text}",
            row.dir.name(),
            row.case,
            row.layout,
            row.shape,
            row.bytes as f64 / 1e6,
            fmt_opt(row.oxidnn, 1),
            fmt_opt(ox_gbps, 0),
            fmt_opt(pct, 1),
            fmt_opt(row.cudnn, 1),
            fmt_opt(cu_gbps, 0),
            fmt_opt(row.ratio(), 2),
        );
        for note in &row.notes {
            println!("    - {note}");
        }
        if let Some((path, w)) = &mut self.csv {
            let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
            let line = format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                row.dir.name(),
                row.case,
                row.layout,
                row.shape,
                row.bytes,
                cell(row.oxidnn),
                cell(ox_gbps),
                cell(pct),
                cell(row.cudnn),
                cell(cu_gbps),
                cell(row.ratio()),
                check,
                err.map_or_else(String::new, |e| format!("{e:e}")),
            );
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
                eprintln!("pooling_vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: geometric mean of cuDNN time / oxidnn time (> 1: oxidnn faster), rows that passed the check");
        let line = |name: &str, keep: &dyn Fn(&Row) -> bool| {
            let v: Vec<f64> = self
                .rows
                .iter()
                .filter(|r| keep(r) && matches!(r.check, Check::Ok(_)))
                .filter_map(Row::ratio)
                .collect();
            if v.is_empty() {
                println!("  {name:<14} {:>4} rows   n/a", 0);
            } else {
                let geomean = (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp();
                let min = v.iter().copied().fold(f64::INFINITY, f64::min);
                let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                println!(
                    "  {name:<14} {:>4} rows   geomean {geomean:.3}   (min {min:.2}, max {max:.2})",
                    v.len()
                );
            }
        };
        line("forward", &|r| r.dir == Direction::Forward);
        line("backward", &|r| r.dir == Direction::Backward(None));
        line("all", &|r| {
            matches!(r.dir, Direction::Forward | Direction::Backward(None))
        });
        for algo in PoolingBwdAlgo::ALL {
            let dir = Direction::Backward(Some(algo));
            if self.rows.iter().any(|r| r.dir == dir) {
                line(dir.name(), &|r| r.dir == dir);
            }
        }
        let count = |f: fn(&Check) -> bool| self.rows.iter().filter(|r| f(&r.check)).count();
        println!(
            "  rows: {}, MISMATCH: {}, oxidnn errors: {}",
            self.rows.len(),
            count(|c| matches!(c, Check::Mismatch(_))),
            count(|c| matches!(c, Check::Error))
        );
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

impl Args {
    fn selects(&self, case: &Case, dtype: DataType, layout: Layout, dir: Direction) -> bool {
        if case.ties && !dir.is_backward() {
            return false;
        }
        if self.quick && dtype == DataType::F16 && layout == Layout::ChannelsFirst {
            return false;
        }
        let key = format!(
            "{}.{} {} {}",
            dir.name(),
            case.name,
            layout_name(dtype, layout),
            shape_string(case.dims)
        );
        self.filter
            .as_ref()
            .is_none_or(|f| key.contains(f.as_str()))
    }
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let algos =
        std::env::var("OXIDNN_BENCH_POOLING_ALGOS").is_ok_and(|v| !v.is_empty() && v != "0");
    let Some(gpu) = open_gpu("pooling_vs_cudnn")? else {
        return Ok(());
    };
    println!("oxidnn pooling vs cuDNN");
    println!("{}", gpu.summary);
    let cudnn = match Cudnn::open(&gpu.stream) {
        Ok(cu) => {
            println!(
                "cuDNN {} (built for CUDA runtime {}.{})",
                version_string(cu.version),
                cu.cudart_version / 1000,
                cu.cudart_version % 1000 / 10
            );
            Some(cu)
        }
        Err(why) => {
            println!("cuDNN: NOT AVAILABLE ({why}); timing oxidnn only, outputs unchecked");
            None
        }
    };
    let timer = Timer::new(&gpu.stream, MAX_SIDES * RUNS)?;
    let mut bench = Bench {
        cudnn,
        timer,
        handle: gpu.handle,
        copy_gbps: 0.0,
        rotation_bytes: ROTATION_MIN_BYTES.max(4 * gpu.l2_bytes),
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
    if args.quick {
        println!("OXIDNN_BENCH_QUICK: f32 NCHW and f16 NHWC only");
    }
    if algos {
        println!("OXIDNN_BENCH_POOLING_ALGOS: every backward algorithm");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    println!();
    let mut report = Report {
        rows: vec![],
        csv: open_csv("pooling_vs_cudnn", "pooling-results.csv", CSV_HEADER),
        copy_gbps: bench.copy_gbps,
    };
    report.print_header();
    for case in CASES {
        for (dtype, layout) in VARIANTS {
            let mut dirs = vec![Direction::Forward, Direction::Backward(None)];
            if algos {
                dirs.extend(PoolingBwdAlgo::ALL.map(|a| Direction::Backward(Some(a))));
            }
            let dirs: Vec<Direction> = dirs
                .into_iter()
                .filter(|&d| args.selects(&case, dtype, layout, d))
                .collect();
            if dirs.is_empty() {
                continue;
            }
            let mut group = match Problem::new(case, dtype, layout)
                .context("describing the problem")
                .and_then(|p| Group::new(&bench, p))
            {
                Ok(g) => g,
                Err(e) => {
                    println!(
                        "    ! {} {}: skipped: {e}",
                        case.name,
                        layout_name(dtype, layout)
                    );
                    continue;
                }
            };
            for dir in dirs {
                if let Some(row) = run_row(&bench, &mut group, dir) {
                    report.add(row);
                }
            }
            // Outstanding work must finish before the buffers are freed.
            bench.timer.synchronize()?;
        }
    }
    if report.rows.is_empty() {
        println!("no rows match the filter");
    }
    report.print_summary(&gpu.name);
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
