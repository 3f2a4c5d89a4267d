//! Shared test harness: the GPU handle (or a printed reason to skip), random tensors,
//! poisoned outputs, error norms and per-dtype bounds, and proptest strategies for
//! shapes and layouts.
#![allow(dead_code)]

use oxidnn::{Buffer, DataType, Handle, HostTensor, TensorDescriptor};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::sync::OnceLock;

/// The GPU handle shared by a test binary's tests, or `None` (with the reason printed
/// once) where no GPU is usable, e.g. in CI.
pub fn gpu() -> Option<&'static Handle> {
    static GPU: OnceLock<Option<Handle>> = OnceLock::new();
    GPU.get_or_init(|| match Handle::new() {
        Ok(h) => Some(h),
        Err(e) => {
            // Straight to stderr: the test harness captures `eprintln!` of passing tests.
            let _ = writeln!(std::io::stderr(), "SKIP GPU tests of this binary: {e}");
            None
        }
    })
    .as_ref()
}

/// The CPU handle and, where one is usable, the GPU handle: for tests (bad inputs, API
/// behaviour) that every backend must pass alike.
pub fn handles() -> Vec<&'static Handle> {
    static CPU: OnceLock<Handle> = OnceLock::new();
    let mut all = vec![CPU.get_or_init(Handle::cpu)];
    all.extend(gpu());
    all
}

/// Runs `f` with the GPU handle, or prints that the test skipped.
pub fn with_gpu(test: &str, f: impl FnOnce(&Handle)) {
    match gpu() {
        Some(h) => f(h),
        None => {
            // Once per test (property tests call this for every case).
            static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
            if !said.iter().any(|t| t == test) {
                said.push(test.to_string());
                let _ = writeln!(std::io::stderr(), "skipped {test}: no GPU");
            }
        }
    }
}

/// A fresh seeded RNG per call site.
pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// A tensor of uniform values in `[lo, hi)`, rounded to its dtype.
pub fn random(desc: TensorDescriptor, lo: f64, hi: f64, rng: &mut impl Rng) -> HostTensor {
    HostTensor::from_fn(desc, |_| rng.gen_range(lo..hi))
}

/// Uploads `t` into a buffer whose every byte outside the logical elements (and, when
/// `poison` is set, inside them too) holds 0xFF: NaN for every float type.
pub fn upload_poisoned(h: &Handle, t: &HostTensor, poison: bool) -> Buffer {
    let mut bytes = t.to_bytes();
    let size = t.desc.dtype().size_bytes();
    let mut keep = vec![false; t.desc.span_elements()];
    oxidnn::for_each_index(t.desc.dims(), |idx| keep[t.desc.offset_of(idx)] = !poison);
    for (i, k) in keep.iter().enumerate() {
        if !k {
            bytes[i * size..(i + 1) * size].fill(0xFF);
        }
    }
    let mut buf = h.alloc(&t.desc).expect("alloc");
    h.write_bytes(&mut buf, &bytes).expect("upload");
    buf
}

/// Relative error norm `||out - ref|| / ||ref||` over the logical elements; NaN or
/// infinity anywhere in `out` gives infinity (NaN never passes).
pub fn rel_error(out: &HostTensor, reference: &HostTensor) -> f64 {
    error_against(out, reference, reference)
}

/// `||out - ref|| / ||scale||` over the logical elements, as [`rel_error`] (which is
/// `scale = ref`).
fn error_against(out: &HostTensor, reference: &HostTensor, scale: &HostTensor) -> f64 {
    let (o, r, s) = (out.logical(), reference.logical(), scale.logical());
    assert_eq!(o.len(), r.len());
    assert_eq!(s.len(), r.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for ((a, b), m) in o.iter().zip(&r).zip(&s) {
        if a.is_nan() && b.is_nan() {
            continue;
        }
        if a == b {
            // Equal infinities add nothing; equal finite values count toward the norm.
            if m.is_finite() {
                den += m * m;
            }
            continue;
        }
        if !a.is_finite() || !b.is_finite() {
            return f64::INFINITY;
        }
        num += (a - b) * (a - b);
        den += m * m;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// The bound on [`rel_error`] for results computed in f32 and stored as `dtype`.
pub fn bound(dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => 1e-5,
        DataType::F16 => 2e-3,
        DataType::BF16 => 1e-2,
        DataType::F64 => 1e-12,
    }
}

/// Downloads `desc`'s tensor from `buf` and checks it against `reference`: error within
/// `tol`, and every address outside the logical elements still holds the poison bytes.
pub fn check(
    h: &Handle,
    desc: &TensorDescriptor,
    buf: &Buffer,
    reference: &HostTensor,
    tol: f64,
    what: &str,
) {
    check_scaled(h, desc, buf, reference, reference, tol, what)
}

/// [`check`] of a result that sums terms of either sign (a mean, a blend), whose exact
/// value may cancel to near zero: the error norm is taken relative to `magnitude`, the
/// same sum of the terms' absolute values (what the rounding scales with).
pub fn check_scaled(
    h: &Handle,
    desc: &TensorDescriptor,
    buf: &Buffer,
    reference: &HostTensor,
    magnitude: &HostTensor,
    tol: f64,
    what: &str,
) {
    let bytes = h.read_bytes(buf).expect("download");
    let out = HostTensor::from_bytes(*desc, &bytes);
    let err = error_against(&out, reference, magnitude);
    assert!(
        err <= tol,
        "{what}: rel error {err:e} > {tol:e} on {}",
        desc.problem_string()
    );
    let size = desc.dtype().size_bytes();
    let mut logical = vec![false; desc.span_elements()];
    oxidnn::for_each_index(desc.dims(), |idx| logical[desc.offset_of(idx)] = true);
    for (i, l) in logical.iter().enumerate() {
        if !l {
            assert!(
                bytes[i * size..(i + 1) * size].iter().all(|&b| b == 0xFF),
                "{what}: the gap at element offset {i} of {} was overwritten",
                desc.problem_string()
            );
        }
    }
    let nonzero = out.logical().iter().filter(|v| **v != 0.0).count();
    let ref_nonzero = reference.logical().iter().filter(|v| **v != 0.0).count();
    assert!(
        ref_nonzero == 0 || nonzero * 2 >= ref_nonzero,
        "{what}: output mostly zeros ({nonzero} non-zero vs {ref_nonzero} in the reference)"
    );
}

/// Awkward extents: 1, primes, powers of two and neighbours.
pub fn extent() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(5),
        Just(7),
        Just(8),
        Just(13),
        Just(16),
        Just(31),
        Just(33),
        Just(64),
        Just(97)
    ]
}

/// Dims of rank 1..=max_rank with at most ~`max_elems` elements.
pub fn dims(max_rank: usize, max_elems: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(extent(), 1..=max_rank).prop_map(move |mut d| {
        while d.iter().product::<usize>() > max_elems {
            let i = d
                .iter()
                .enumerate()
                .max_by_key(|(_, &n)| n)
                .map(|(i, _)| i)
                .unwrap_or(0);
            d[i] = (d[i] / 2).max(1);
        }
        d
    })
}

/// A memory layout for `dims`: a random dim order and random padding (gaps) per dim.
pub fn layout(dims: Vec<usize>, dtype: DataType) -> impl Strategy<Value = TensorDescriptor> {
    let rank = dims.len();
    let order: Vec<usize> = (0..rank).collect();
    let pads = prop::collection::vec(
        prop_oneof![3 => Just(0usize), 1 => Just(1), 1 => Just(3)],
        rank,
    );
    (Just(order).prop_shuffle(), pads).prop_map(move |(order, pads)| {
        // `order` lists the dims from innermost to outermost in memory.
        let mut strides = vec![0; rank];
        let mut s = 1;
        for &d in &order {
            strides[d] = s;
            s *= dims[d] + pads[d];
        }
        TensorDescriptor::new(dtype, &dims, &strides).expect("valid layout")
    })
}

/// A GPU data type.
pub fn gpu_dtype() -> impl Strategy<Value = DataType> {
    prop_oneof![
        Just(DataType::F32),
        Just(DataType::F16),
        Just(DataType::BF16)
    ]
}

/// Dims with two independently drawn layouts of them.
pub fn two_layouts(
    max_rank: usize,
    max_elems: usize,
) -> impl Strategy<Value = (TensorDescriptor, TensorDescriptor)> {
    (dims(max_rank, max_elems), gpu_dtype())
        .prop_flat_map(|(d, dt)| (layout(d.clone(), dt), layout(d, dt)))
}

/// alpha and beta as tests draw them: the common (1, 0) often, else mixed values.
pub fn alpha_beta() -> impl Strategy<Value = (f64, f64)> {
    prop_oneof![2 => Just((1.0, 0.0)), 1 => Just((0.5, 0.0)), 1 => Just((1.0, 1.0)), 1 => Just((-1.5, 0.25))]
}

/// Proptest settings for GPU property tests: no persistence files, a fixed case count.
pub fn gpu_cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
