//! oxidnn's matmul against cuBLAS: both libraries multiply the same device buffers on the
//! same stream, their outputs are checked against each other, then both are timed.
//!
//! ```text
//! cargo bench --features cublas-bench --bench matmul_vs_cublas [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `precision group MxNxK` key contains it,
//!   e.g. `fp32`, `bf16 square`, `rnn`, `4096x4096x128`, `h1024`. Precisions are `fp32`
//!   (exact f32), `tf32`, `fp16` and `bf16` (none is a substring of another).
//! * `OXIDNN_BENCH_QUICK=1`: a few shapes and at most 10 timed calls (smoke test).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `matmul-results.csv` in the cwd).
//!
//! Rows: squares M = N = K in 512..8192; LLM/MLP layers M = N = 4096, K in {16, 128, 1024};
//! RNN gate matmuls M = 4 * hidden, N = batch, K = hidden. Each in four precisions, against
//! the matching cuBLAS mode (`cublasGemmEx`, `CUBLAS_GEMM_DEFAULT`, math mode
//! `CUBLAS_DEFAULT_MATH`):
//!
//! * `fp32`: f32, `MatmulMath::Fma` vs `CUDA_R_32F`, `CUBLAS_COMPUTE_32F` (exact f32: no tf32)
//! * `tf32`: f32, `MatmulMath::Tf32` vs `CUDA_R_32F`, `CUBLAS_COMPUTE_32F_FAST_TF32`
//! * `fp16`: f16 in and out, `MatmulMath::TensorOp` vs `CUDA_R_16F`, `CUBLAS_COMPUTE_32F`
//! * `bf16`: bf16 in and out, `MatmulMath::TensorOp` vs `CUDA_R_16BF`, `CUBLAS_COMPUTE_32F`
//!
//! oxidnn's operands are row-major (`A` `[M, K]`, `B` `[K, N]`, `C` `[M, N]`); cuBLAS is
//! column-major, so it computes `C^T = B^T A^T` on the same bytes (m = N, n = M, no
//! transposes).
//!
//! Method: inputs uniform in [-1, 1]. Per row, one run of each library on the same inputs
//! (the output poisoned with 0xFF before each) is compared: ||oxidnn - cuBLAS|| / ||cuBLAS||
//! above 1e-4 (fp32), 5e-3 (tf32) or 1e-2 (fp16, bf16) is a MISMATCH (still timed, left out
//! of the summary).
//! Then `find_matmul_algorithm` (3 runs) picks oxidnn's fastest algorithm. Then oxidnn with
//! its heuristic algorithm, oxidnn with the fastest (if different) and cuBLAS alternate call
//! by call, each call bracketed by its own pair of CUDA events on the handle's stream,
//! queued behind a host-side stream gate and released together (device time, not launch
//! overhead); median reported. Warm-up and timed call counts scale with the call's time
//! (about 200 ms of timed calls per library, 5 to 30 calls). Problems whose A + B + C are
//! under 64 MiB rotate over several buffer sets (at least 128 MiB and 2x the L2 in all) so
//! no call starts with what the previous one left in L2. % of peak is against H100 SXM dense
//! peaks (fp32 67, tf32 495, fp16/bf16 989 TFLOPS).
//!
//! Without libcublas only oxidnn is timed; without a GPU the program says why and exits 0.

mod common;

use common::{
    dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes, Args,
    Check, Context, Res, Timer,
};
use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::CudaStream;
use oxidnn::{
    find_matmul_algorithm, get_matmul_algorithm, matmul, Buffer, DataType, Handle, MatmulAlgo,
    MatmulDescriptor, MatmulEpilogue, MatmulMath, TensorDescriptor,
};
use std::ffi::c_void;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Timed calls per library: about `TARGET_TIMED_MS` of device time, within these bounds.
const MIN_RUNS: usize = 5;
const MAX_RUNS: usize = 30;
const QUICK_MAX_RUNS: usize = 10;
const TARGET_TIMED_MS: f64 = 200.0;
/// Untimed calls per library before the timed ones: about `TARGET_WARMUP_MS`, within these.
const MIN_WARMUP: usize = 2;
const MAX_WARMUP: usize = 5;
const TARGET_WARMUP_MS: f64 = 50.0;
/// Timed sides: oxidnn (heuristic), oxidnn (fastest algorithm), cuBLAS.
const MAX_SIDES: usize = 3;
/// Timed runs per algorithm in `find_matmul_algorithm`.
const FIND_RUNS: usize = 3;
/// Problems whose A + B + C take fewer bytes than this rotate over several buffer sets...
const ROTATE_BELOW_BYTES: usize = 64 << 20;
/// ... which together span at least this much (and 2x the L2) ...
const ROTATION_MIN_BYTES: usize = 128 << 20;
/// ... but never more sets than this.
const MAX_SETS: usize = 1024;
/// Inputs are uniform in `[-INPUT_RANGE, INPUT_RANGE]`.
const INPUT_RANGE: f32 = 1.0;
/// The issue's targets, cuBLAS time / oxidnn time on squares of at least this size.
const TARGET_MIN_SIZE: usize = 2048;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("matmul_vs_cublas: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Precision {
    /// f32 with exact f32 arithmetic (no tf32 on either side).
    Fp32,
    /// f32 data on tf32 tensor cores.
    Tf32,
    /// f16 in, f16 out, f32 accumulation.
    Fp16,
    /// bf16 in, bf16 out, f32 accumulation.
    Bf16,
}

const PRECISIONS: [Precision; 4] = [
    Precision::Fp32,
    Precision::Tf32,
    Precision::Fp16,
    Precision::Bf16,
];

impl Precision {
    fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }

    /// The dtype of A, B and C.
    fn dtype(self) -> DataType {
        match self {
            Precision::Fp32 | Precision::Tf32 => DataType::F32,
            Precision::Fp16 => DataType::F16,
            Precision::Bf16 => DataType::BF16,
        }
    }

    fn math(self) -> MatmulMath {
        match self {
            Precision::Fp32 => MatmulMath::Fma,
            Precision::Tf32 => MatmulMath::Tf32,
            Precision::Fp16 | Precision::Bf16 => MatmulMath::TensorOp,
        }
    }

    /// cuBLAS's data type (A, B and C) and compute type for the same arithmetic.
    fn cublas(self) -> (cublas_sys::cudaDataType, cublas_sys::cublasComputeType_t) {
        use cublas_sys::cublasComputeType_t as C;
        use cublas_sys::cudaDataType as D;
        match self {
            Precision::Fp32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
            Precision::Tf32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32),
            Precision::Fp16 => (D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
            Precision::Bf16 => (D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        }
    }

    /// H100 SXM dense peak, TFLOPS.
    fn peak_tflops(self) -> f64 {
        match self {
            Precision::Fp32 => 67.0,
            Precision::Tf32 => 495.0,
            Precision::Fp16 | Precision::Bf16 => 989.0,
        }
    }

    /// Largest relative difference between the two libraries' outputs that still passes.
    fn tolerance(self) -> f64 {
        match self {
            Precision::Fp32 => 1e-4,
            Precision::Tf32 => 5e-3,
            Precision::Fp16 | Precision::Bf16 => 1e-2,
        }
    }

    /// The issue's target for cuBLAS time / oxidnn time on large squares, if it sets one.
    fn target(self) -> Option<f64> {
        match self {
            Precision::Fp32 => Some(0.9),
            Precision::Tf32 => None,
            Precision::Fp16 | Precision::Bf16 => Some(0.7),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// M = N = K.
    Square,
    /// An LLM/MLP layer: M = N = 4096 (tokens x features), small to medium K.
    Llm,
    /// An RNN's gate matmul: M = 4 * hidden, N = batch, K = hidden.
    Rnn,
}

const FAMILIES: [Family; 3] = [Family::Square, Family::Llm, Family::Rnn];

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Square => "square",
            Family::Llm => "llm",
            Family::Rnn => "rnn",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    family: Family,
    m: usize,
    n: usize,
    k: usize,
    /// In the `OXIDNN_BENCH_QUICK=1` subset.
    quick: bool,
}

impl Shape {
    fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    fn dims(&self) -> String {
        format!("{}x{}x{}", self.m, self.n, self.k)
    }

    /// What the shape stands for, beyond its dims (RNN: hidden size and batch).
    fn label(&self) -> String {
        match self.family {
            Family::Rnn => format!("h{} b{}", self.k, self.n),
            Family::Square | Family::Llm => String::new(),
        }
    }

    /// The text the command-line filter matches.
    fn key(&self, prec: Precision) -> String {
        format!(
            "{} {} {} {}",
            prec.name(),
            self.family.name(),
            self.dims(),
            self.label()
        )
    }
}

fn shapes() -> Vec<Shape> {
    let mut v = vec![];
    for s in [512, 1024, 2048, 4096, 8192] {
        v.push(Shape {
            family: Family::Square,
            m: s,
            n: s,
            k: s,
            quick: s == 1024 || s == 4096,
        });
    }
    for k in [16, 128, 1024] {
        v.push(Shape {
            family: Family::Llm,
            m: 4096,
            n: 4096,
            k,
            quick: k == 128,
        });
    }
    for hidden in [512, 1024, 2048] {
        for batch in [16, 32, 64, 128] {
            v.push(Shape {
                family: Family::Rnn,
                m: 4 * hidden,
                n: batch,
                k: hidden,
                quick: hidden == 1024 && batch == 64,
            });
        }
    }
    v
}

/// An algorithm's short name: its output tile, `wg` first for the Hopper `wgmma` ones.
fn algo_name(a: MatmulAlgo) -> String {
    let (rows, cols) = a.tile();
    let kind = if a.tma() {
        "tma-"
    } else if a.needs_sm90a() {
        "wg"
    } else {
        ""
    };
    let short = if a.short_k() { "s" } else { "" };
    format!("{kind}{rows}x{cols}{short}")
}

// ---------------------------------------------------------------------------------------
// cuBLAS
// ---------------------------------------------------------------------------------------

fn cublas_check(status: cublas_sys::cublasStatus_t, call: &str) -> Res<()> {
    if status == cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {status:?}"))
    }
}

/// The cuBLAS functions this bench calls (checked up front: the bindings panic on a
/// missing symbol).
const CUBLAS_SYMBOLS: [&str; 6] = [
    "cublasCreate_v2",
    "cublasDestroy_v2",
    "cublasSetStream_v2",
    "cublasSetMathMode",
    "cublasGetVersion_v2",
    "cublasGemmEx",
];

/// A cuBLAS handle issuing on the oxidnn handle's stream, default math mode (no tf32
/// unless the compute type asks for it).
struct Cublas {
    handle: cublas_sys::cublasHandle_t,
    version: i32,
}

impl Cublas {
    /// Loads libcublas and makes a handle on `stream`, or says why not.
    fn open(stream: &CudaStream) -> Res<Self> {
        // SAFETY: only tries to load the library.
        if !unsafe { cublas_sys::is_culib_present() } {
            return Err(
                "libcublas could not be loaded (not installed, or not on the library path)".into(),
            );
        }
        catch_unwind(AssertUnwindSafe(|| Self::open_loaded(stream)))
            .unwrap_or_else(|_| Err("loading libcublas failed".into()))
    }

    fn open_loaded(stream: &CudaStream) -> Res<Self> {
        // SAFETY: `is_culib_present` found the library, so `culib` loads it; looking a
        // symbol up calls nothing.
        let lib = unsafe { cublas_sys::culib() };
        for name in CUBLAS_SYMBOLS {
            // SAFETY: as above; the symbol's type is never used.
            if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                return Err(format!("libcublas lacks {name}"));
            }
        }
        let mut handle: cublas_sys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; on success it holds a new handle that
        // only `Drop` destroys.
        cublas_check(
            unsafe { cublas_sys::cublasCreate_v2(&mut handle) },
            "cublasCreate",
        )?;
        let mut cublas = Self { handle, version: 0 };
        // SAFETY (the three calls): the handle is live; the stream is a live stream of the
        // current context (the device's primary context, which cuBLAS's runtime uses too);
        // `version` is a valid out-pointer.
        cublas_check(
            unsafe { cublas_sys::cublasSetStream_v2(cublas.handle, stream.cu_stream().cast()) },
            "cublasSetStream",
        )?;
        cublas_check(
            unsafe {
                cublas_sys::cublasSetMathMode(
                    cublas.handle,
                    cublas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH,
                )
            },
            "cublasSetMathMode",
        )?;
        cublas_check(
            unsafe { cublas_sys::cublasGetVersion_v2(cublas.handle, &mut cublas.version) },
            "cublasGetVersion",
        )?;
        Ok(cublas)
    }

    fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
    }

    /// Row-major `C[M,N] = A[M,K] B[K,N]` in `prec`, as column-major `C^T = B^T A^T`.
    fn gemm(&self, prec: Precision, s: &Shape, addr: &Addrs) -> Res<()> {
        let int = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit cuBLAS's int"));
        let (m, n, k) = (int(s.m)?, int(s.n)?, int(s.k)?);
        let (dtype, compute) = prec.cublas();
        let (alpha, beta) = (1.0f32, 0.0f32);
        let op = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: the handle is live and issues on the stream that orders every use of these
        // buffers; `addr` holds live device buffers of `s`'s A [M,K], B [K,N] and C [M,N] in
        // `prec`'s dtype (`Set::alloc`), read as column-major B^T (N x K, ld N), A^T (K x M,
        // ld K) and C^T (N x M, ld N); alpha and beta are host f32 (the pointer mode is
        // host; compute type 32F takes f32 scalars) and live for the call.
        let status = unsafe {
            cublas_sys::cublasGemmEx(
                self.handle,
                op,
                op,
                n,
                m,
                k,
                (&raw const alpha).cast::<c_void>(),
                dev(addr.b),
                dtype,
                n,
                dev(addr.a),
                dtype,
                k,
                (&raw const beta).cast::<c_void>(),
                dev_mut(addr.c),
                dtype,
                n,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        cublas_check(status, "cublasGemmEx")
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: made by `open_loaded`, destroyed only here. A failure cannot be reported.
        let _ = unsafe { cublas_sys::cublasDestroy_v2(self.handle) };
    }
}

// ---------------------------------------------------------------------------------------
// Buffers
// ---------------------------------------------------------------------------------------

/// Device addresses of a set's buffers, for cuBLAS.
#[derive(Clone, Copy)]
struct Addrs {
    a: u64,
    b: u64,
    c: u64,
}

/// One set of operands. Invariant (from `alloc`): `a`, `b` and `c` hold exactly the spans of
/// the group's `a_desc`, `b_desc` and `c_desc`.
struct Set {
    a: Buffer,
    b: Buffer,
    c: Buffer,
    addr: Addrs,
}

impl Set {
    fn alloc(h: &Handle, g: &Descs) -> Res<Self> {
        let alloc = |d: &TensorDescriptor| h.alloc(d).context("allocating a buffer");
        let (a, b, c) = (alloc(&g.a)?, alloc(&g.b)?, alloc(&g.c)?);
        let addr = Addrs {
            a: device_address(&a)?,
            b: device_address(&b)?,
            c: device_address(&c)?,
        };
        Ok(Self { a, b, c, addr })
    }
}

/// The operand descriptors of one shape and dtype: packed row-major A `[M,K]`, B `[K,N]`,
/// C `[M,N]`.
struct Descs {
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
}

/// The buffers of one shape and dtype: `sets` rotate so that small problems miss L2.
struct Group {
    shape: Shape,
    descs: Descs,
    sets: Vec<Set>,
}

impl Group {
    fn new(b: &Bench, shape: Shape, dtype: DataType) -> Res<Self> {
        let packed = |dims: &[usize]| {
            TensorDescriptor::packed(dtype, dims).context("describing the problem")
        };
        let descs = Descs {
            a: packed(&[shape.m, shape.k])?,
            b: packed(&[shape.k, shape.n])?,
            c: packed(&[shape.m, shape.n])?,
        };
        let bytes = descs.a.size_bytes() + descs.b.size_bytes() + descs.c.size_bytes();
        let count = if bytes < ROTATE_BELOW_BYTES {
            b.rotation_bytes.div_ceil(bytes.max(1)).clamp(1, MAX_SETS)
        } else {
            1
        };
        let mut sets = Vec::with_capacity(count);
        for _ in 0..count {
            sets.push(Set::alloc(&b.handle, &descs)?);
        }
        let seed = [shape.m, shape.n, shape.k]
            .iter()
            .fold(dtype.size_bytes() as u64, |s, &d| {
                s.wrapping_mul(31).wrapping_add(d as u64)
            });
        let a = random_bytes(dtype, descs.a.element_count(), seed, INPUT_RANGE, 0.0);
        let bb = random_bytes(
            dtype,
            descs.b.element_count(),
            seed ^ 0x5555,
            INPUT_RANGE,
            0.0,
        );
        for set in &mut sets {
            b.handle
                .write_bytes(&mut set.a, &a)
                .context("uploading A")?;
            b.handle
                .write_bytes(&mut set.b, &bb)
                .context("uploading B")?;
        }
        Ok(Self { shape, descs, sets })
    }
}

// ---------------------------------------------------------------------------------------
// Running a row
// ---------------------------------------------------------------------------------------

/// Everything that lives for the whole run. cuBLAS comes first so its handle is destroyed
/// before the stream and context it uses.
struct Bench {
    cublas: Option<Cublas>,
    timer: Timer,
    handle: Handle,
    stream: Arc<CudaStream>,
    rotation_bytes: usize,
    max_runs: usize,
}

struct Row {
    prec: Precision,
    shape: Shape,
    /// oxidnn's heuristic algorithm and its median time (us).
    heuristic: Option<MatmulAlgo>,
    oxidnn_us: Option<f64>,
    /// The fastest algorithm of `find_matmul_algorithm` and its median time (us).
    best: Option<MatmulAlgo>,
    best_us: Option<f64>,
    cublas_us: Option<f64>,
    check: Check,
    /// `find_matmul_algorithm`'s ranking: `algo:ms;...`.
    found: String,
    warmup: usize,
    runs: usize,
    notes: Vec<String>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        Some(self.cublas_us? / self.oxidnn_us?)
    }

    fn ratio_best(&self) -> Option<f64> {
        Some(self.cublas_us? / self.best_us?)
    }

    fn passed(&self) -> bool {
        matches!(self.check, Check::Ok(_))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    /// oxidnn, the algorithm its heuristic picks.
    Oxidnn,
    /// oxidnn, a forced algorithm.
    OxidnnForced(MatmulAlgo),
    Cublas,
}

/// One oxidnn matmul, `C = A B`, on `set`.
fn run_oxidnn(h: &Handle, desc: &MatmulDescriptor, d: &Descs, set: &mut Set) -> Res<()> {
    matmul(
        h,
        desc,
        1.0,
        &d.a,
        &set.a,
        &d.b,
        &set.b,
        0.0,
        &d.c,
        &mut set.c,
        &MatmulEpilogue::default(),
    )
    .context("oxidnn matmul")
}

/// Poisons C, runs `call` on set 0 and reads C back.
fn checked_output(
    b: &Bench,
    set: &mut Set,
    call: impl FnOnce(&mut Set) -> Res<()>,
) -> Res<Vec<u8>> {
    poison_async(&b.stream, &mut set.c)?;
    call(set)?;
    b.handle.read_bytes(&set.c).context("reading C")
}

fn run_row(b: &Bench, g: &mut Group, prec: Precision) -> Row {
    let shape = g.shape;
    let mut row = Row {
        prec,
        shape,
        heuristic: None,
        oxidnn_us: None,
        best: None,
        best_us: None,
        cublas_us: None,
        check: Check::Error,
        found: String::new(),
        warmup: 0,
        runs: 0,
        notes: vec![],
    };
    let desc = MatmulDescriptor::new(prec.math());
    let (descs, sets) = (&g.descs, &mut g.sets);
    match get_matmul_algorithm(&b.handle, &desc, &descs.a, &descs.b, &descs.c) {
        Ok(algo) => row.heuristic = Some(algo),
        Err(e) => row.notes.push(format!("get_matmul_algorithm: {e}")),
    }

    // Check: one run of each library on set 0, C poisoned before each.
    let ox_out = checked_output(b, &mut sets[0], |set| {
        run_oxidnn(&b.handle, &desc, descs, set)
    });
    let cu_out = b.cublas.as_ref().map(|cu| {
        checked_output(b, &mut sets[0], |set| {
            cu.gemm(prec, &shape, &set.addr).context("cuBLAS")
        })
    });
    let mut sides = vec![];
    match &ox_out {
        Ok(_) => sides.push(Side::Oxidnn),
        Err(e) => row.notes.push(e.clone()),
    }
    match &cu_out {
        Some(Ok(_)) => sides.push(Side::Cublas),
        Some(Err(e)) => row.notes.push(e.clone()),
        None => {}
    }
    row.check = Check::compare(&ox_out, cu_out.as_ref(), prec.dtype(), prec.tolerance());
    drop((ox_out, cu_out));

    // oxidnn's fastest algorithm here, timed by the library itself.
    let mut estimate_ms = None;
    if sides.contains(&Side::Oxidnn) {
        let set = &mut sets[0];
        let found = find_matmul_algorithm(
            &b.handle,
            &desc,
            1.0,
            &descs.a,
            &set.a,
            &descs.b,
            &set.b,
            0.0,
            &descs.c,
            &mut set.c,
            &MatmulEpilogue::default(),
            FIND_RUNS,
        );
        match found {
            Ok(ranked) => {
                row.found = ranked
                    .iter()
                    .map(|p| format!("{}:{:.4}", algo_name(p.algo), p.time_ms))
                    .collect::<Vec<_>>()
                    .join(";");
                if let Some(first) = ranked.first() {
                    row.best = Some(first.algo);
                    estimate_ms = Some(f64::from(first.time_ms));
                    if row.heuristic != Some(first.algo) {
                        sides.insert(1, Side::OxidnnForced(first.algo));
                    }
                }
            }
            Err(e) => row.notes.push(format!("find_matmul_algorithm: {e}")),
        }
    }
    if sides.is_empty() {
        return row;
    }

    // Time: the sides alternate call by call, each call on the next buffer set.
    let estimate_ms = estimate_ms
        .filter(|t| *t > 0.0)
        .unwrap_or_else(|| shape.flops() / (0.5 * prec.peak_tflops() * 1e12) * 1e3);
    let calls = |target_ms: f64, min: usize, max: usize| {
        ((target_ms / estimate_ms).ceil() as usize).clamp(min, max)
    };
    row.runs = calls(TARGET_TIMED_MS, MIN_RUNS, b.max_runs);
    row.warmup = calls(TARGET_WARMUP_MS, MIN_WARMUP, MAX_WARMUP);
    let count = sets.len();
    let timed = b
        .timer
        .measure(sides.len(), row.warmup, row.runs, |side, invocation| {
            let set = &mut sets[invocation % count];
            match (sides[side], &b.cublas) {
                (Side::Oxidnn, _) => run_oxidnn(&b.handle, &desc, descs, set),
                (Side::OxidnnForced(algo), _) => {
                    run_oxidnn(&b.handle, &desc.with_algorithm(algo), descs, set)
                }
                (Side::Cublas, Some(cu)) => cu.gemm(prec, &shape, &set.addr).context("cuBLAS"),
                (Side::Cublas, None) => Err("internal: cuBLAS side without a handle".into()),
            }
        });
    match timed {
        Ok(m) => {
            for (side, us) in sides.iter().zip(&m.median_us) {
                match side {
                    Side::Oxidnn => row.oxidnn_us = Some(*us),
                    Side::OxidnnForced(_) => row.best_us = Some(*us),
                    Side::Cublas => row.cublas_us = Some(*us),
                }
            }
            if row.best.is_some() && row.best == row.heuristic {
                row.best_us = row.oxidnn_us;
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

const CSV_HEADER: &str = "precision,group,m,n,k,gflop,oxi_algo,oxi_ms,oxi_tflops,oxi_pct_peak,\
oxi_best_algo,oxi_best_ms,oxi_best_tflops,cublas_ms,cublas_tflops,cublas_pct_peak,\
ratio_cublas_over_oxi,ratio_cublas_over_oxi_best,check,rel_err,warmup,runs,find_ms,notes";

fn tflops(flops: f64, us: f64) -> f64 {
    flops / (us * 1e-6) / 1e12
}

/// A CSV cell holding arbitrary text.
fn csv_text(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

struct Report {
    rows: Vec<Row>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
}

impl Report {
    fn new() -> Self {
        Self {
            rows: vec![],
            csv: open_csv("matmul_vs_cublas", "matmul-results.csv", CSV_HEADER),
        }
    }

    fn print_header(&self) {
        println!(
            "{:<4} {:<6} {:<16} {:>9} {:>7} {:>5} {:<7} | {:>9} {:<7} | {:>9} {:>7} {:>5} | {:>5} {:>5}  check",
            "prec",
            "group",
            "MxNxK",
            "oxi ms",
            "TFLOPS",
            "%pk",
            "algo",
            "best ms",
            "algo",
            "cuBLAS ms",
            "TFLOPS",
            "%pk",
            "cu/ox",
            "/best",
        );
    }

    fn add(&mut self, row: Row) {
        let flops = row.shape.flops();
        let peak = row.prec.peak_tflops();
        let ms = |us: Option<f64>| us.map(|t| t / 1e3);
        let tf = |us: Option<f64>| us.map(|t| tflops(flops, t));
        let pct = |us: Option<f64>| tf(us).map(|t| 100.0 * t / peak);
        let algo = |a: Option<MatmulAlgo>| a.map_or_else(|| "-".to_string(), algo_name);
        let (check, err) = row.check.label();
        let err_text = err.map_or_else(String::new, |e| format!("{e:.1e}"));
        println!(
            "{:<4} {:<6} {:<16} {:>9} {:>7} {:>5} {:<7} | {:>9} {:<7} | {:>9} {:>7} {:>5} | {:>5} {:>5}  {check} {err_text}",
            row.prec.name(),
            row.shape.family.name(),
            row.shape.dims(),
            fmt_opt(ms(row.oxidnn_us), 4),
            fmt_opt(tf(row.oxidnn_us), 1),
            fmt_opt(pct(row.oxidnn_us), 0),
            algo(row.heuristic),
            fmt_opt(ms(row.best_us), 4),
            algo(row.best),
            fmt_opt(ms(row.cublas_us), 4),
            fmt_opt(tf(row.cublas_us), 1),
            fmt_opt(pct(row.cublas_us), 0),
            fmt_opt(row.ratio(), 2),
            fmt_opt(row.ratio_best(), 2),
        );
        for note in &row.notes {
            println!("    ! {note}");
        }
        if let Some((path, w)) = &mut self.csv {
            let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
            let algo_cell = |a: Option<MatmulAlgo>| a.map_or_else(String::new, algo_name);
            let line = [
                row.prec.name().to_string(),
                row.shape.family.name().to_string(),
                row.shape.m.to_string(),
                row.shape.n.to_string(),
                row.shape.k.to_string(),
                format!("{:.4}", flops / 1e9),
                algo_cell(row.heuristic),
                cell(ms(row.oxidnn_us)),
                cell(tf(row.oxidnn_us)),
                cell(pct(row.oxidnn_us)),
                algo_cell(row.best),
                cell(ms(row.best_us)),
                cell(tf(row.best_us)),
                cell(ms(row.cublas_us)),
                cell(tf(row.cublas_us)),
                cell(pct(row.cublas_us)),
                cell(row.ratio()),
                cell(row.ratio_best()),
                check.to_string(),
                err.map_or_else(String::new, |e| format!("{e:e}")),
                row.warmup.to_string(),
                row.runs.to_string(),
                row.found.clone(),
                csv_text(&row.notes.join("; ")),
            ]
            .join(",");
            if let Err(e) = writeln!(w, "{line}").and_then(|()| w.flush()) {
                eprintln!("matmul_vs_cublas: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    /// Ratios of the rows of `prec` (any, if `None`) that pass `keep` and the check.
    fn ratios(
        &self,
        prec: Option<Precision>,
        keep: impl Fn(&Row) -> bool,
        ratio: fn(&Row) -> Option<f64>,
    ) -> Vec<(f64, &Row)> {
        self.rows
            .iter()
            .filter(|r| prec.is_none_or(|p| r.prec == p) && r.passed() && keep(r))
            .filter_map(|r| Some((ratio(r)?, r)))
            .collect()
    }

    fn print_summary(&self, device: &str, cublas: Option<&Cublas>) {
        fn geomean(v: &[(f64, &Row)]) -> String {
            if v.is_empty() {
                "n/a".into()
            } else {
                let g = (v.iter().map(|(r, _)| r.ln()).sum::<f64>() / v.len() as f64).exp();
                format!("{g:.3}")
            }
        }
        println!();
        println!(
            "summary: geometric mean of cuBLAS time / oxidnn time (> 1: oxidnn faster), rows that passed the check;"
        );
        println!("         each cell: oxidnn's heuristic algorithm / oxidnn's fastest algorithm (find_matmul_algorithm)");
        print!("  {:<6}", "prec");
        for f in FAMILIES {
            print!(" {:>15}", f.name());
        }
        println!(" {:>15}", "all");
        let mut precs: Vec<Option<Precision>> = PRECISIONS.iter().copied().map(Some).collect();
        precs.push(None);
        for prec in precs {
            let cell = |family: Option<Family>| {
                let keep = |r: &Row| family.is_none_or(|f| r.shape.family == f);
                format!(
                    "{}/{}",
                    geomean(&self.ratios(prec, keep, Row::ratio)),
                    geomean(&self.ratios(prec, keep, Row::ratio_best))
                )
            };
            print!("  {:<6}", prec.map_or("all", Precision::name));
            for f in FAMILIES {
                print!(" {:>15}", cell(Some(f)));
            }
            println!(" {:>15}", cell(None));
        }
        println!();
        println!(
            "targets: min of cuBLAS time / oxidnn time over squares >= {TARGET_MIN_SIZE} (fp32 >= 0.9, fp16/bf16 >= 0.7)"
        );
        let large = |r: &Row| r.shape.family == Family::Square && r.shape.m >= TARGET_MIN_SIZE;
        for prec in PRECISIONS {
            let verdict = |ratio: fn(&Row) -> Option<f64>| {
                let v = self.ratios(Some(prec), large, ratio);
                let Some((min, row)) = v.iter().copied().min_by(|x, y| x.0.total_cmp(&y.0)) else {
                    return "n/a".to_string();
                };
                let met = match prec.target() {
                    Some(t) if min >= t => " MET",
                    Some(_) => " NOT MET",
                    None => "",
                };
                format!("{min:.3} at {} ({} rows){met}", row.shape.dims(), v.len())
            };
            let target = prec
                .target()
                .map_or_else(|| "no target".to_string(), |t| format!(">= {t}"));
            println!(
                "  {:<6} {:<10} heuristic {:<32} fastest {}",
                prec.name(),
                target,
                verdict(Row::ratio),
                verdict(Row::ratio_best)
            );
        }
        let count = |f: fn(&Check) -> bool| self.rows.iter().filter(|r| f(&r.check)).count();
        let mismatches = count(|c| matches!(c, Check::Mismatch(_)));
        let errors = count(|c| matches!(c, Check::Error));
        let unchecked = count(|c| matches!(c, Check::NoReference));
        println!();
        println!(
            "  rows: {}, MISMATCH: {mismatches}, oxidnn errors: {errors}, unchecked: {unchecked}",
            self.rows.len()
        );
        println!("  device: {device}");
        match cublas {
            Some(cu) => println!("  cuBLAS {}", cu.version_string()),
            None => println!("  cuBLAS: not available"),
        }
        if let Some((path, _)) = &self.csv {
            println!("  CSV: {path}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

impl Args {
    fn selects(&self, shape: &Shape, prec: Precision) -> bool {
        if self.quick && !shape.quick {
            return false;
        }
        self.filter
            .as_ref()
            .is_none_or(|f| shape.key(prec).contains(f.as_str()))
    }
}

/// The precisions that run on `dtype` inputs, in row order.
fn precisions_of(dtype: DataType) -> impl Iterator<Item = Precision> {
    PRECISIONS.into_iter().filter(move |p| p.dtype() == dtype)
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let Some(gpu) = open_gpu("matmul_vs_cublas")? else {
        return Ok(());
    };
    let (handle, stream, device) = (gpu.handle, gpu.stream, gpu.name);
    println!("oxidnn matmul vs cuBLAS");
    println!("{}", gpu.summary);
    let cublas = match Cublas::open(&stream) {
        Ok(cu) => {
            println!(
                "cuBLAS {} (cublasGemmEx, CUBLAS_GEMM_DEFAULT, CUBLAS_DEFAULT_MATH)",
                cu.version_string()
            );
            Some(cu)
        }
        Err(why) => {
            println!("cuBLAS: NOT AVAILABLE ({why}); timing oxidnn only, outputs unchecked");
            None
        }
    };
    if let Ok(v) = std::env::var("NVIDIA_TF32_OVERRIDE") {
        println!(
            "NVIDIA_TF32_OVERRIDE={v}: cuBLAS's tf32 rows may run plain f32 (0 disables tf32)"
        );
    }
    let max_runs = if args.quick { QUICK_MAX_RUNS } else { MAX_RUNS };
    let timer = Timer::new(&stream, MAX_SIDES * MAX_RUNS)?;
    let bench = Bench {
        cublas,
        timer,
        handle,
        stream,
        rotation_bytes: ROTATION_MIN_BYTES.max(2 * gpu.l2_bytes),
        max_runs,
    };
    println!(
        "timing: CUDA events per call on the handle's stream; {MIN_WARMUP}-{MAX_WARMUP} warm-up + {MIN_RUNS}-{max_runs} timed calls \
         per library (about {TARGET_TIMED_MS} ms), median; calls queued behind a stream gate (device time); oxidnn \
         (heuristic), oxidnn (fastest, if different) and cuBLAS alternate; problems under {} MiB rotate over >= {} MiB of buffer sets",
        ROTATE_BELOW_BYTES >> 20,
        bench.rotation_bytes >> 20
    );
    println!(
        "% of peak (%pk): H100 SXM dense, fp32 67, tf32 495, fp16/bf16 989 TFLOPS; cu/ox = cuBLAS time / oxidnn time (> 1: oxidnn faster)"
    );
    if args.quick {
        println!("OXIDNN_BENCH_QUICK: a few rows only");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    println!();

    let mut report = Report::new();
    report.print_header();
    for shape in shapes() {
        for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
            let precs: Vec<Precision> = precisions_of(dtype)
                .filter(|&p| args.selects(&shape, p))
                .collect();
            if precs.is_empty() {
                continue;
            }
            let mut group = match Group::new(&bench, shape, dtype) {
                Ok(g) => g,
                Err(e) => {
                    println!("    ! {dtype} {}: skipped: {e}", shape.dims());
                    continue;
                }
            };
            for prec in precs {
                let row = catch_unwind(AssertUnwindSafe(|| run_row(&bench, &mut group, prec)));
                match row {
                    Ok(row) => report.add(row),
                    Err(_) => println!(
                        "    ! {} {}: panicked (see stderr), row skipped",
                        prec.name(),
                        shape.dims()
                    ),
                }
            }
            // Outstanding work must finish before the buffers are freed.
            bench.timer.synchronize()?;
        }
    }
    if report.rows.is_empty() {
        println!("no rows match the filter");
    }
    report.print_summary(&device, bench.cublas.as_ref());
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
