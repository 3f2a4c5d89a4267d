//! What the comparison benches share: errors, device buffers, host data, the stream gate
//! and CUDA-event timing. Each bench is its own crate (`mod common;`) and uses a subset.
#![allow(dead_code)]

#[cfg(feature = "cudnn-bench")]
pub mod cudnn;

use cudarc::driver::{sys as cu_sys, CudaEvent, CudaStream};
use oxidnn::{Buffer, DataType, Handle};
use std::ffi::c_void;
use std::fmt::Display;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the stream gate waits for the host to queue the timed calls (which takes
/// milliseconds; the limit only matters if a library call blocks on the stream).
pub const GATE_TIMEOUT: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------
// Errors, device buffers
// ---------------------------------------------------------------------------------------

pub type Res<T> = Result<T, String>;

/// Adds what was being done to any displayable error.
pub trait Context<T> {
    fn context(self, what: &str) -> Res<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn context(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

pub fn device_address(b: &Buffer) -> Res<u64> {
    b.device_address()
        .ok_or_else(|| "a GPU handle made a host buffer".to_string())
}

/// Copies the first `bytes` of `src` to `dst` on `stream`.
pub fn copy_async(stream: &CudaStream, dst: &mut Buffer, src: &Buffer, bytes: usize) -> Res<()> {
    assert!(bytes <= dst.len_bytes() && bytes <= src.len_bytes());
    let (d, s) = (device_address(dst)?, device_address(src)?);
    // SAFETY: both are live device allocations of at least `bytes` bytes (asserted) in the
    // stream's context; every other user of them is ordered on the same stream.
    unsafe { cu_sys::cuMemcpyDtoDAsync_v2(d, s, bytes, stream.cu_stream()) }
        .result()
        .context("cuMemcpyDtoDAsync")
}

/// Fills `buf` with 0xFF bytes (NaN in every float type), so an output a library fails to
/// write cannot pass the check with the other library's values.
pub fn poison_async(stream: &CudaStream, buf: &mut Buffer) -> Res<()> {
    let d = device_address(buf)?;
    // SAFETY: `d` is a live device allocation of `len_bytes` bytes; its users share the stream.
    unsafe { cu_sys::cuMemsetD8Async(d, 0xFF, buf.len_bytes(), stream.cu_stream()) }
        .result()
        .context("cuMemsetD8Async")
}

// ---------------------------------------------------------------------------------------
// Host data
// ---------------------------------------------------------------------------------------

/// splitmix64: a small, fast, seedable generator.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

pub fn encode(dtype: DataType, v: f32, out: &mut [u8]) {
    match dtype {
        DataType::F32 => out.copy_from_slice(&v.to_le_bytes()),
        DataType::F16 => out.copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
        DataType::BF16 => out.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&f64::from(v).to_le_bytes()),
    }
}

pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
    match dtype {
        DataType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]).into(),
        DataType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::F64 => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

/// Threads for host work on `elements` elements.
pub fn host_threads(elements: usize) -> usize {
    if elements < 1 << 20 {
        1
    } else {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .min(32)
    }
}

/// `count` elements uniform in `[-range, range]`, none closer to 0 than `min_magnitude`,
/// encoded as `dtype`.
pub fn random_bytes(
    dtype: DataType,
    count: usize,
    seed: u64,
    range: f32,
    min_magnitude: f32,
) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut bytes = vec![0u8; count * size];
    let chunk = count.div_ceil(host_threads(count)).max(1) * size;
    std::thread::scope(|s| {
        for (i, part) in bytes.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut rng = SplitMix(
                    seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
                        ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9),
                );
                for out in part.chunks_exact_mut(size) {
                    let v = range * (2.0 * rng.next_f32() - 1.0);
                    let v = if v.abs() < min_magnitude {
                        min_magnitude.copysign(v)
                    } else {
                        v
                    };
                    encode(dtype, v, out);
                }
            });
        }
    });
    bytes
}

/// ||got - want|| / ||want|| over two encoded tensors (NaN if either holds a NaN or inf).
pub fn relative_error(dtype: DataType, got: &[u8], want: &[u8]) -> f64 {
    let size = dtype.size_bytes();
    let count = want.len() / size;
    let chunk = count.div_ceil(host_threads(count)).max(1) * size;
    let (diff2, want2) = std::thread::scope(|s| {
        let parts: Vec<_> = got
            .chunks(chunk)
            .zip(want.chunks(chunk))
            .map(|(g, w)| {
                s.spawn(move || {
                    let (mut diff2, mut want2) = (0.0f64, 0.0f64);
                    for (a, b) in g.chunks_exact(size).zip(w.chunks_exact(size)) {
                        let (a, b) = (decode(dtype, a), decode(dtype, b));
                        diff2 += (a - b) * (a - b);
                        want2 += b * b;
                    }
                    (diff2, want2)
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|p| p.join().unwrap_or((f64::NAN, f64::NAN)))
            .fold((0.0, 0.0), |(d, w), (pd, pw)| (d + pd, w + pw))
    });
    if want2 > 0.0 {
        (diff2 / want2).sqrt()
    } else {
        diff2.sqrt()
    }
}

// ---------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------

#[derive(Default)]
pub struct GateState {
    open: AtomicBool,
    timed_out: AtomicBool,
}

/// Holds back a stream: work queued after `close` starts only once `open` is called (or
/// GATE_TIMEOUT passes), so a batch of launches runs back to back on the device whatever
/// the host's launch overhead. Dropping the gate opens it.
pub struct Gate(Arc<GateState>);

/// The stream callback of a gate: waits until the gate opens.
///
/// # Safety
/// `user` is a pointer from `Arc::into_raw` of an `Arc<GateState>` whose count this call
/// owns; it is called at most once per such pointer.
unsafe extern "C" fn hold_stream(user: *mut c_void) {
    // SAFETY: per the contract above, this reclaims exactly the count `Gate::close` leaked.
    let state = unsafe { Arc::from_raw(user.cast::<GateState>().cast_const()) };
    let start = Instant::now();
    while !state.open.load(Ordering::Acquire) {
        if start.elapsed() > GATE_TIMEOUT {
            state.timed_out.store(true, Ordering::Release);
            return;
        }
        std::thread::yield_now();
    }
}

impl Gate {
    pub fn close(stream: &CudaStream) -> Res<Self> {
        let state = Arc::new(GateState::default());
        let user = Arc::into_raw(Arc::clone(&state))
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: `hold_stream` has the CUhostFn signature and takes ownership of the count
        // leaked into `user`; the driver calls it once, on a driver thread, and it makes no
        // CUDA calls. The stream is a live stream of the current context.
        let launched =
            unsafe { cu_sys::cuLaunchHostFunc(stream.cu_stream(), Some(hold_stream), user) }
                .result();
        if let Err(e) = launched {
            // SAFETY: the launch failed, so the callback never runs; the count is ours again.
            drop(unsafe { Arc::from_raw(user.cast::<GateState>().cast_const()) });
            return Err(format!("cuLaunchHostFunc: {e}"));
        }
        Ok(Self(state))
    }

    pub fn open(&self) {
        self.0.open.store(true, Ordering::Release);
    }

    /// Whether the gate gave up waiting (meaningful once the stream has passed it).
    pub fn timed_out(&self) -> bool {
        self.0.timed_out.load(Ordering::Acquire)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// Median device times (us) of each side.
pub struct Measurement {
    pub median_us: Vec<f64>,
    /// False if the gate timed out: then host launch overhead may be in the times.
    pub gated: bool,
}

/// CUDA events on the handle's stream, reused by every measurement.
pub struct Timer {
    pub stream: Arc<CudaStream>,
    starts: Vec<CudaEvent>,
    ends: Vec<CudaEvent>,
}

impl Timer {
    /// A timer for up to `slots` timed calls per measurement (sides x runs).
    pub fn new(stream: &Arc<CudaStream>, slots: usize) -> Res<Self> {
        let ctx = stream.context();
        let events = || -> Res<Vec<CudaEvent>> {
            (0..slots)
                .map(|_| {
                    ctx.new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
                        .context("cuEventCreate")
                })
                .collect()
        };
        Ok(Self {
            stream: Arc::clone(stream),
            starts: events()?,
            ends: events()?,
        })
    }

    pub fn synchronize(&self) -> Res<()> {
        self.stream.synchronize().context("cuStreamSynchronize")
    }

    /// Calls `call(side, invocation)` for each of `sides` sides in turn: `warmup` rounds,
    /// then `runs` gated rounds, each call between its own two events. `invocation` counts
    /// every call, so callers can rotate buffer sets with it.
    pub fn measure(
        &self,
        sides: usize,
        warmup: usize,
        runs: usize,
        mut call: impl FnMut(usize, usize) -> Res<()>,
    ) -> Res<Measurement> {
        assert!(sides * runs <= self.starts.len());
        let mut invocation = 0;
        for _ in 0..warmup {
            for side in 0..sides {
                call(side, invocation)?;
                invocation += 1;
            }
        }
        self.synchronize()?;
        let gate = Gate::close(&self.stream)?;
        for run in 0..runs {
            for side in 0..sides {
                let slot = side * runs + run;
                self.starts[slot]
                    .record(&self.stream)
                    .context("cuEventRecord")?;
                call(side, invocation)?;
                invocation += 1;
                self.ends[slot]
                    .record(&self.stream)
                    .context("cuEventRecord")?;
            }
        }
        gate.open();
        self.synchronize()?;
        let mut median_us = Vec::with_capacity(sides);
        for side in 0..sides {
            let mut us = (0..runs)
                .map(|run| {
                    let slot = side * runs + run;
                    self.starts[slot]
                        .elapsed_ms(&self.ends[slot])
                        .map(|ms| f64::from(ms) * 1e3)
                        .context("cuEventElapsedTime")
                })
                .collect::<Res<Vec<f64>>>()?;
            median_us.push(median(&mut us));
        }
        Ok(Measurement {
            median_us,
            gated: !gate.timed_out(),
        })
    }
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// A device address as the pointer type vendor libraries take.
pub fn dev(addr: u64) -> *const c_void {
    std::ptr::with_exposed_provenance(addr as usize)
}

pub fn dev_mut(addr: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

// ---------------------------------------------------------------------------------------
// Setup and output
// ---------------------------------------------------------------------------------------

/// The GPU a bench runs on: oxidnn's handle, its stream (bound to this thread) and a
/// description of the device.
pub struct Gpu {
    pub handle: Handle,
    pub stream: Arc<CudaStream>,
    /// The device's name.
    pub name: String,
    /// `device: NAME (sm_XY, N SMs, M GiB, L2 L MiB), CUDA driver V`
    pub summary: String,
    pub l2_bytes: usize,
}

/// Opens GPU 0, or says why there is none (`Ok(None)`: nothing to measure).
pub fn open_gpu(bench: &str) -> Res<Option<Gpu>> {
    let handle = match Handle::new() {
        Ok(h) => h,
        Err(oxidnn::Error::NoGpu { reason }) => {
            println!("{bench}: no usable GPU, nothing to measure ({reason})");
            return Ok(None);
        }
        Err(e) => return Err(format!("opening GPU 0: {e}")),
    };
    let stream = Arc::clone(handle.stream().ok_or("the GPU handle has no stream")?);
    let ctx = stream.context();
    ctx.bind_to_thread().context("cuCtxSetCurrent")?;
    let attr = |a| ctx.attribute(a).unwrap_or(0);
    let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
    let sms = attr(cu_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    let l2_bytes = usize::try_from(attr(
        cu_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
    ))
    .unwrap_or(0);
    let memory = ctx.total_mem().unwrap_or(0);
    let name = handle.device_name();
    let summary = format!(
        "device: {name} (sm_{major}{minor}, {sms} SMs, {:.1} GiB, L2 {} MiB), CUDA driver {}",
        memory as f64 / (1u64 << 30) as f64,
        l2_bytes >> 20,
        driver_version()
    );
    Ok(Some(Gpu {
        handle,
        stream,
        name,
        summary,
        l2_bytes,
    }))
}

/// How oxidnn's output of a row compared with the vendor library's.
pub enum Check {
    Ok(f64),
    Mismatch(f64),
    /// No vendor result to compare with.
    NoReference,
    /// oxidnn failed.
    Error,
}

impl Check {
    /// The check's label for tables and CSVs (`ok`, `MISMATCH`, `unchecked`, `error`) and
    /// the compared value, where there is one.
    pub fn label(&self) -> (&'static str, Option<f64>) {
        match *self {
            Check::Ok(e) => ("ok", Some(e)),
            Check::Mismatch(e) => ("MISMATCH", Some(e)),
            Check::NoReference => ("unchecked", None),
            Check::Error => ("error", None),
        }
    }

    /// Compares oxidnn's output bytes with the vendor's (when it ran): a relative error
    /// norm within `tolerance` is `Ok`.
    pub fn compare(
        ours: &Res<Vec<u8>>,
        vendor: Option<&Res<Vec<u8>>>,
        dtype: DataType,
        tolerance: f64,
    ) -> Self {
        match (ours, vendor) {
            (Ok(got), Some(Ok(want))) => {
                let err = relative_error(dtype, got, want);
                if err <= tolerance {
                    Check::Ok(err)
                } else {
                    Check::Mismatch(err)
                }
            }
            (Ok(_), _) => Check::NoReference,
            (Err(_), _) => Check::Error,
        }
    }
}

/// What selects a bench's rows: the command line's filter (the first argument that is not
/// a flag; `cargo bench` passes `--bench`) and `OXIDNN_BENCH_QUICK` (a few rows only). Each
/// bench adds its own `selects`.
pub struct Args {
    pub filter: Option<String>,
    pub quick: bool,
}

impl Args {
    pub fn parse() -> Self {
        Self {
            filter: std::env::args().skip(1).find(|a| !a.starts_with("--")),
            quick: std::env::var("OXIDNN_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0"),
        }
    }
}

/// The CSV at `OXIDNN_BENCH_CSV` (else `default_path`) with `header` written, or `None`
/// after saying on stderr why not.
pub fn open_csv(
    bench: &str,
    default_path: &str,
    header: &str,
) -> Option<(String, BufWriter<File>)> {
    let path = std::env::var("OXIDNN_BENCH_CSV").unwrap_or_else(|_| default_path.into());
    match File::create(&path) {
        Ok(f) => {
            let mut w = BufWriter::new(f);
            match writeln!(w, "{header}") {
                Ok(()) => Some((path, w)),
                Err(e) => {
                    eprintln!("{bench}: writing {path}: {e}; no CSV");
                    None
                }
            }
        }
        Err(e) => {
            eprintln!("{bench}: creating {path}: {e}; no CSV");
            None
        }
    }
}

pub fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.decimals$}"))
}

pub fn driver_version() -> String {
    let mut v = 0i32;
    // SAFETY: `v` is a valid out-pointer; the driver library is loaded (a handle exists).
    match unsafe { cu_sys::cuDriverGetVersion(&mut v) }.result() {
        Ok(()) => format!("{}.{}", v / 1000, v % 1000 / 10),
        Err(e) => format!("unknown ({e})"),
    }
}
