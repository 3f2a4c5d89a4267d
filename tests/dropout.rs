//! Dropout: the generator (Random123's known answers), the mask's statistics and
//! reproducibility, its independence from layout, strides and launch configuration, the
//! states buffer's set / advance / restore semantics, forward/backward consistency, the GPU
//! against the CPU reference bit for bit, and bad inputs.

mod common;

use common::*;
use oxidnn::reference::dropout::{is_kept, scale};
use oxidnn::*;
use proptest::prelude::*;

/// A seeded states buffer and its descriptor.
fn seeded(h: &Handle, p: f64, seed: u64) -> (DropoutDescriptor, Buffer) {
    let mut states = h.alloc_bytes(dropout_states_size(h)).unwrap();
    let d = DropoutDescriptor::new(h, p, &mut states, seed).unwrap();
    (d, states)
}

/// Random values in `[0.5, 2)` with random signs: never 0, so a 0 output means dropped.
fn nonzero(desc: TensorDescriptor, seed: u64) -> HostTensor {
    use rand::Rng;
    let mut r = rng(seed);
    HostTensor::from_fn(desc, |_| {
        let v = r.gen_range(0.5..2.0);
        if r.gen_bool(0.5) {
            v
        } else {
            -v
        }
    })
}

/// One forward call: `(y, mask words)`.
fn forward(
    h: &Handle,
    d: &DropoutDescriptor,
    states: &mut Buffer,
    xd: &TensorDescriptor,
    xt: &HostTensor,
    yd: &TensorDescriptor,
) -> (HostTensor, Vec<u32>) {
    let x = upload_poisoned(h, xt, false);
    let mut y = upload_poisoned(h, &HostTensor::filled(*yd, 0.0), true);
    let mut reserve = h.alloc_bytes(dropout_reserve_space_size(xd)).unwrap();
    dropout_forward(h, d, states, xd, &x, yd, &mut y, &mut reserve).unwrap();
    (
        h.download_tensor(yd, &y).unwrap(),
        h.read::<u32>(&reserve).unwrap(),
    )
}

fn kept_count(mask: &[u32], len: usize) -> usize {
    (0..len).filter(|&i| is_kept(mask, i)).count()
}

/// The keep count of `len` Bernoulli(1 - p) draws is within 5 standard deviations.
fn assert_binomial(kept: usize, len: usize, p: f64, what: &str) {
    let mean = len as f64 * (1.0 - p);
    let sigma = (len as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (kept as f64 - mean).abs() <= 5.0 * sigma + 1.0,
        "{what}: kept {kept} of {len} at p = {p}: mean {mean}, sigma {sigma}"
    );
}

#[test]
fn the_generator_is_philox4x32_10() {
    // Random123's kat_vectors: counter, key -> output.
    assert_eq!(
        oxidnn_params::philox4x32_10([0; 4], [0; 2]),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        oxidnn_params::philox4x32_10(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            [0xa409_3822, 0x299f_31d0]
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
    // Element 8g + e of call k draws the 32-bit word `high << 16 | low`: half e % 2 of word
    // e / 2 of the counter (g, k) under the seed (high), and of the same counter with bit
    // 31 of its word 1 set (low).
    let (g, k, seed) = (5u64, 3u64, 7u64);
    let high = oxidnn_params::philox4x32_10([g as u32, 0, k as u32, 0], [seed as u32, 0]);
    let low = oxidnn_params::philox4x32_10([g as u32, 1 << 31, k as u32, 0], [seed as u32, 0]);
    let half = |w: [u32; 4], e: usize| (w[e / 2] >> (16 * (e % 2))) & 0xffff;
    for e in 0..8 {
        let word = half(high, e) << 16 | half(low, e);
        for threshold in [1 << 31, word as u64, word as u64 + 1] {
            assert_eq!(
                oxidnn_params::dropout_keeps_element(seed, k, threshold, 8 * g + e as u64),
                word as u64 >= threshold,
                "element {e}, threshold {threshold:#x}"
            );
        }
    }
}

/// Elements among the first `len` of call `call` whose random word's high half equals the
/// threshold's at `p` (so the low half decides): about `len / 2^16` where the threshold has
/// a low half.
fn ties(p: f64, seed: u64, call: u64, len: u64) -> usize {
    let threshold = oxidnn_params::dropout_threshold(p);
    let key = oxidnn_params::dropout_key(seed);
    (0..len.div_ceil(8))
        .map(|g| {
            let high = oxidnn_params::dropout_halves(&key, call, g, false, oxidnn_params::mul_wide);
            (0..8)
                .filter(|&e| {
                    8 * g + (e as u64) < len
                        && oxidnn_params::dropout_half(high, e) as u64 == threshold >> 16
                })
                .count()
        })
        .sum()
}

#[test]
fn keep_rate_is_binomial_within_five_sigma() {
    let h = Handle::cpu();
    let len = 1 << 16;
    let xd = TensorDescriptor::packed(DataType::F32, &[len]).unwrap();
    let xt = nonzero(xd, 1);
    for p in [0.1, 0.5, 0.9, 0.01] {
        let (d, mut states) = seeded(&h, p, 1234);
        let (_, mask) = forward(&h, &d, &mut states, &xd, &xt, &xd);
        assert_binomial(kept_count(&mask, len), len, p, "cpu");
    }
}

#[test]
fn kept_values_are_scaled_by_exactly_one_over_one_minus_p_and_dropped_ones_are_zero() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F64, &[3, 50]).unwrap();
    let xt = nonzero(xd, 2);
    for p in [0.1, 0.3, 0.75] {
        let (d, mut states) = seeded(&h, p, 99);
        let (yt, mask) = forward(&h, &d, &mut states, &xd, &xt, &xd);
        for (i, (x, y)) in xt.logical().iter().zip(yt.logical()).enumerate() {
            let want = if is_kept(&mask, i) {
                x / (1.0 - p)
            } else {
                0.0
            };
            assert!(
                (y - want).abs() <= 1e-15 * want.abs(),
                "p {p} element {i}: {y} vs {want}"
            );
        }
    }
}

#[test]
fn probability_zero_copies_and_one_drops_everything() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F32, &[7, 9]).unwrap();
    let xt = nonzero(xd, 3);
    let (d, mut states) = seeded(&h, 0.0, 5);
    let (yt, mask) = forward(&h, &d, &mut states, &xd, &xt, &xd);
    assert_eq!(yt.logical(), xt.logical());
    assert_eq!(kept_count(&mask, 63), 63);
    let (d, mut states) = seeded(&h, 1.0, 5);
    let (yt, mask) = forward(&h, &d, &mut states, &xd, &xt, &xd);
    assert!(yt.logical().iter().all(|&v| v == 0.0));
    assert_eq!(kept_count(&mask, 63), 0);
    assert_eq!(scale(1.0), 0.0);
}

#[test]
fn the_seed_fixes_the_mask_and_each_call_draws_a_new_one() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F32, &[4096]).unwrap();
    let xt = nonzero(xd, 4);
    let (d, mut states) = seeded(&h, 0.5, 42);
    let (_, first) = forward(&h, &d, &mut states, &xd, &xt, &xd);
    let (_, second) = forward(&h, &d, &mut states, &xd, &xt, &xd);
    assert_ne!(first, second, "successive calls must draw different masks");
    assert_eq!(
        dropout_generator_state(&h, &states).unwrap(),
        DropoutGeneratorState { seed: 42, calls: 2 }
    );
    // Re-seeding replays the sequence; another seed gives another mask.
    let (d, mut again) = seeded(&h, 0.5, 42);
    assert_eq!(forward(&h, &d, &mut again, &xd, &xt, &xd).1, first);
    assert_eq!(forward(&h, &d, &mut again, &xd, &xt, &xd).1, second);
    let (d, mut other) = seeded(&h, 0.5, 43);
    assert_ne!(forward(&h, &d, &mut other, &xd, &xt, &xd).1, first);
}

/// A copy of a states buffer, restored, continues from where the copy was taken.
fn restore_replays_from_a_copy(h: &Handle) {
    let xd = TensorDescriptor::packed(DataType::F32, &[33, 65]).unwrap();
    let xt = nonzero(xd, 5);
    let (d, mut states) = seeded(h, 0.2, 7);
    forward(h, &d, &mut states, &xd, &xt, &xd);
    let snapshot = h.read_bytes(&states).unwrap();
    let (_, call1) = forward(h, &d, &mut states, &xd, &xt, &xd);
    let (_, call2) = forward(h, &d, &mut states, &xd, &xt, &xd);
    let mut copy = h.alloc_bytes(dropout_states_size(h)).unwrap();
    h.write_bytes(&mut copy, &snapshot).unwrap();
    let restored = DropoutDescriptor::restore(h, 0.2, &copy).unwrap();
    assert_eq!((restored.seed(), restored.probability()), (7, 0.2));
    assert_eq!(forward(h, &restored, &mut copy, &xd, &xt, &xd).1, call1);
    assert_eq!(forward(h, &restored, &mut copy, &xd, &xt, &xd).1, call2);
    assert_eq!(dropout_generator_state(h, &copy).unwrap().calls, 3);
}

#[test]
fn restore_continues_a_saved_generator() {
    restore_replays_from_a_copy(&Handle::cpu());
}

/// The seed comes from the descriptor and the call number from the states buffer, so the
/// two must belong together: the CPU handle rejects a buffer seeded with another seed (the
/// GPU handle does not read the buffer back) and leaves y, the mask and the buffer as they
/// were.
#[test]
fn a_states_buffer_of_another_seed_is_rejected() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F32, &[5, 7]).unwrap();
    let x = h.upload_tensor(&nonzero(xd, 6)).unwrap();
    let (d, _) = seeded(&h, 0.5, 7);
    let (_, mut other) = seeded(&h, 0.5, 8);
    let poison = HostTensor::filled(xd, 3.0);
    let mut y = h.upload_tensor(&poison).unwrap();
    let mut reserve = h.alloc_bytes(dropout_reserve_space_size(&xd)).unwrap();
    h.fill_bytes(&mut reserve, 0xA5).unwrap();
    let e = dropout_forward(&h, &d, &mut other, &xd, &x, &xd, &mut y, &mut reserve).unwrap_err();
    assert!(matches!(e, Error::BadParam { arg: "states", .. }), "{e}");
    assert!(e.to_string().contains("seed 8"), "{e}");
    assert_eq!(
        h.download_tensor(&xd, &y).unwrap().logical(),
        poison.logical()
    );
    assert!(h.read_bytes(&reserve).unwrap().iter().all(|&b| b == 0xA5));
    assert_eq!(
        dropout_generator_state(&h, &other).unwrap(),
        DropoutGeneratorState { seed: 8, calls: 0 }
    );
}

/// `(y, mask)` of one call on a fresh generator for x laid out as `xd` (values by logical
/// index from `seed`), y as `yd`.
fn masked(
    h: &Handle,
    xd: TensorDescriptor,
    yd: TensorDescriptor,
    seed: u64,
) -> (Vec<f64>, Vec<u32>) {
    let (d, mut states) = seeded(h, 0.3, 11);
    let logical = nonzero(
        TensorDescriptor::packed(xd.dtype(), xd.dims()).unwrap(),
        seed,
    );
    let xt = HostTensor::from_fn(xd, |i| logical.get(i));
    let (yt, mask) = forward(h, &d, &mut states, &xd, &xt, &yd);
    (yt.logical(), mask)
}

/// The same logical tensor in other layouts (NHWC, padded, transposed output) drops the
/// same logical elements: the mask follows the logical index only.
fn mask_follows_the_logical_index(h: &Handle, dtype: DataType) {
    let (n, c, hh, w) = (3, 5, 7, 11);
    let nchw = TensorDescriptor::nchw(dtype, n, c, hh, w).unwrap();
    let nhwc = TensorDescriptor::nhwc(dtype, n, c, hh, w).unwrap();
    let padded =
        TensorDescriptor::new(dtype, &[n, c, hh, w], &[c * 9 * 13, 9 * 13, 13, 1]).unwrap();
    let base = masked(h, nchw, nchw, 6);
    for (xd, yd) in [(nhwc, nhwc), (padded, nchw), (nchw, nhwc), (nhwc, padded)] {
        assert_eq!(masked(h, xd, yd, 6), base, "{xd:?} -> {yd:?}");
    }
}

#[test]
fn the_mask_follows_the_logical_index_not_the_layout() {
    mask_follows_the_logical_index(&Handle::cpu(), DataType::F32);
}

#[test]
fn backward_zeroes_exactly_where_forward_dropped() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F32, &[17, 31]).unwrap();
    let xt = nonzero(xd, 8);
    let (d, mut states) = seeded(&h, 0.4, 1);
    let x = h.upload_tensor(&xt).unwrap();
    let mut y = h.alloc(&xd).unwrap();
    let mut reserve = h.alloc_bytes(dropout_reserve_space_size(&xd)).unwrap();
    dropout_forward(&h, &d, &mut states, &xd, &x, &xd, &mut y, &mut reserve).unwrap();
    let dyt = nonzero(xd, 9);
    let dy = h.upload_tensor(&dyt).unwrap();
    let mut dx = h.alloc(&xd).unwrap();
    dropout_backward(&h, &d, &xd, &dy, &xd, &mut dx, &reserve).unwrap();
    let (y, dx) = (
        h.download_tensor(&xd, &y).unwrap(),
        h.download_tensor(&xd, &dx).unwrap(),
    );
    for (i, ((yv, dxv), dyv)) in y
        .logical()
        .iter()
        .zip(dx.logical())
        .zip(dyt.logical())
        .enumerate()
    {
        assert_eq!(*yv == 0.0, dxv == 0.0, "element {i}");
        if dxv != 0.0 {
            assert_eq!(dxv, (dyv / 0.6) as f32 as f64, "element {i}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// GPU
// ---------------------------------------------------------------------------------------

/// One forward and one backward on `h` and on the CPU handle, from generators with the
/// same seed and call number: the masks agree bit for bit, y and dx match the reference.
fn gpu_against_cpu(h: &Handle, xd: TensorDescriptor, yd: TensorDescriptor, p: f64, seed: u64) {
    let cpu = Handle::cpu();
    let what = format!("p {p} {} -> {}", xd.problem_string(), yd.problem_string());
    let xt = nonzero(xd, seed);
    // Advance both generators past a first call, so the call number enters too.
    let (d, mut states) = seeded(h, p, seed);
    let (dc, mut cstates) = seeded(&cpu, p, seed);
    forward(h, &d, &mut states, &xd, &xt, &yd);
    forward(&cpu, &dc, &mut cstates, &xd, &xt, &yd);

    let x = upload_poisoned(h, &xt, false);
    let mut y = upload_poisoned(h, &HostTensor::filled(yd, 0.0), true);
    let mut reserve = h.alloc_bytes(dropout_reserve_space_size(&xd)).unwrap();
    h.fill_bytes(&mut reserve, 0xA5).unwrap();
    dropout_forward(h, &d, &mut states, &xd, &x, &yd, &mut y, &mut reserve).unwrap();
    let mut want = HostTensor::filled(yd, 0.0);
    let mask = oxidnn::reference::dropout::forward(p, seed, 1, &xt, &mut want);
    let got_mask = h.read::<u32>(&reserve).unwrap();
    assert_eq!(got_mask, mask, "{what}: mask");
    let (cy, cmask) = forward(&cpu, &dc, &mut cstates, &xd, &xt, &yd);
    assert_eq!(cmask, mask, "{what}: CPU handle mask");
    let _ = cy;
    // Exact zeros where dropped, the reference elsewhere, gaps untouched.
    let got = h.download_tensor(&yd, &y).unwrap();
    for (i, v) in got.logical().iter().enumerate() {
        assert_eq!(*v == 0.0, !is_kept(&mask, i), "{what}: element {i} is {v}");
    }
    check(h, &yd, &y, &want, bound(xd.dtype()), &format!("{what}: y"));
    assert_eq!(dropout_generator_state(h, &states).unwrap().calls, 2);

    // Backward from the GPU's reserve space.
    let dyt = nonzero(yd, seed ^ 1);
    let dy = upload_poisoned(h, &dyt, false);
    let mut dx = upload_poisoned(h, &HostTensor::filled(xd, 0.0), true);
    dropout_backward(h, &d, &yd, &dy, &xd, &mut dx, &reserve).unwrap();
    let mut want_dx = HostTensor::filled(xd, 0.0);
    oxidnn::reference::dropout::backward(p, &mask, &dyt, &mut want_dx);
    let got_dx = h.download_tensor(&xd, &dx).unwrap();
    for (i, v) in got_dx.logical().iter().enumerate() {
        assert_eq!(
            *v == 0.0,
            !is_kept(&mask, i),
            "{what}: dx element {i} is {v}"
        );
    }
    check(
        h,
        &xd,
        &dx,
        &want_dx,
        bound(xd.dtype()),
        &format!("{what}: dx"),
    );
}

proptest! {
    #![proptest_config(gpu_cases(48))]

    #[test]
    fn gpu_matches_the_cpu_reference_bit_for_bit(
        (xd, yd) in two_layouts(4, 20_000),
        p in prop_oneof![Just(0.0), Just(0.1), Just(0.5), Just(1.0), 0.0f64..1.0],
        seed in any::<u64>(),
    ) {
        with_gpu("gpu_matches_the_cpu_reference_bit_for_bit", |h| gpu_against_cpu(h, xd, yd, p, seed));
    }
}

#[test]
fn gpu_packed_path_on_every_dtype_and_awkward_lengths() {
    with_gpu("gpu_packed_path_on_every_dtype_and_awkward_lengths", |h| {
        for dt in DataType::GPU {
            // Whole chunks, a partial last chunk, fewer elements than a warp, one element;
            // and a tensor over which every warp of the one resident wave takes many
            // chunks (an H100's cover about 1.6M f32 elements a turn), y checked too.
            let few = [1usize, 3, 31, 33, 1000, 4096, 65_536 + 17, 300_001];
            let many_turns = (1 << 24) + 5;
            for len in few.into_iter().chain([many_turns]) {
                let d = TensorDescriptor::packed(dt, &[len]).unwrap();
                gpu_against_cpu(h, d, d, 0.1, len as u64);
            }
        }
    });
}

#[test]
fn gpu_ties_of_the_high_halves_are_settled_by_the_low_halves() {
    with_gpu(
        "gpu_ties_of_the_high_halves_are_settled_by_the_low_halves",
        |h| {
            // About 2^20 elements: some 16 ties per call (the high half of the word equal to
            // the threshold's), which the kernels settle from the low halves; the packed kernel
            // (each dtype: a group a 16-bit lane, a group shared by two f32 lanes) and the
            // strided one (NHWC) against the reference bit for bit.
            let (n, c, hh, w) = (16, 64, 32, 32);
            let p = 0.1;
            assert_ne!(oxidnn_params::dropout_threshold(p) & 0xffff, 0);
            for (i, dt) in DataType::GPU.into_iter().enumerate() {
                let seed = 40 + i as u64;
                let len = (n * c * hh * w) as u64;
                assert!(ties(p, seed, 1, len) > 0, "seed {seed}: no tie to settle");
                let nchw = TensorDescriptor::nchw(dt, n, c, hh, w).unwrap();
                let nhwc = TensorDescriptor::nhwc(dt, n, c, hh, w).unwrap();
                gpu_against_cpu(h, nchw, nchw, p, seed);
                gpu_against_cpu(h, nhwc, nhwc, p, seed);
            }
        },
    );
}

#[test]
fn gpu_mask_is_independent_of_layout_strides_and_grid() {
    with_gpu("gpu_mask_is_independent_of_layout_strides_and_grid", |h| {
        for dt in DataType::GPU {
            // Packed kernel (NCHW) vs strided kernel (NHWC, padded): other thread mappings.
            mask_follows_the_logical_index(h, dt);
            // A longer tensor runs another grid; its first elements draw the same bits.
            let seeded_mask = |len: usize| {
                let d = TensorDescriptor::packed(dt, &[len]).unwrap();
                let (desc, mut states) = seeded(h, 0.5, 77);
                forward(h, &desc, &mut states, &d, &nonzero(d, 1), &d).1
            };
            let (small, large) = (seeded_mask(5000), seeded_mask(3_000_000));
            assert_eq!(&large[..5000 / 32], &small[..5000 / 32]);
            for i in 5000 / 32 * 32..5000 {
                assert_eq!(is_kept(&small, i), is_kept(&large, i));
            }
        }
    });
}

#[test]
fn gpu_keep_rate_on_a_large_tensor_and_one_advance_per_call() {
    with_gpu(
        "gpu_keep_rate_on_a_large_tensor_and_one_advance_per_call",
        |h| {
            let d = TensorDescriptor::packed(DataType::F16, &[8192, 4096]).unwrap();
            let len = d.element_count();
            let x = h.alloc(&d).unwrap();
            let mut y = h.alloc(&d).unwrap();
            let mut reserve = h.alloc_bytes(dropout_reserve_space_size(&d)).unwrap();
            let (desc, mut states) = seeded(h, 0.1, 2024);
            let mut masks = vec![];
            for call in 0..3 {
                dropout_forward(h, &desc, &mut states, &d, &x, &d, &mut y, &mut reserve).unwrap();
                let mask = h.read::<u32>(&reserve).unwrap();
                assert_binomial(kept_count(&mask, len), len, 0.1, &format!("call {call}"));
                masks.push(mask);
            }
            assert!(masks[0] != masks[1] && masks[1] != masks[2]);
            // Thousands of blocks, one advance per call, the block count and the packed
            // kernel's chunk counters back to 0.
            let raw = h.read_bytes(&states).unwrap();
            let word = |at: usize| u32::from_le_bytes(raw[at..at + 4].try_into().unwrap());
            assert_eq!(word(4), 0, "blocks_done");
            for j in 0..oxidnn_params::DROPOUT_DEAL_COUNTERS {
                let at = oxidnn_params::dropout_counter_offset(j);
                assert_eq!(word(at), 0, "chunk counter {j}");
            }
            assert_eq!(dropout_generator_state(h, &states).unwrap().calls, 3);
            // The CPU reference draws the same third mask.
            let want = oxidnn::reference::dropout::keep_mask(0.1, 2024, 2, len);
            assert_eq!(masks[2], want);
        },
    );
}

#[test]
fn gpu_restore_continues_a_saved_generator() {
    with_gpu(
        "gpu_restore_continues_a_saved_generator",
        restore_replays_from_a_copy,
    );
}

#[test]
fn gpu_dropped_nan_and_inf_become_zero() {
    with_gpu("gpu_dropped_nan_and_inf_become_zero", |h| {
        for dt in DataType::GPU {
            let d = TensorDescriptor::packed(dt, &[2048]).unwrap();
            let xt = HostTensor::from_fn(d, |i| {
                if i[0] % 2 == 0 {
                    f64::NAN
                } else {
                    f64::INFINITY
                }
            });
            let (desc, mut states) = seeded(h, 0.5, 3);
            let (yt, mask) = forward(h, &desc, &mut states, &d, &xt, &d);
            for (i, v) in yt.logical().iter().enumerate() {
                if is_kept(&mask, i) {
                    assert!(!v.is_finite());
                } else {
                    assert_eq!(*v, 0.0);
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------------

#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for h in handles() {
        let xd = TensorDescriptor::packed(DataType::F32, &[4, 100]).unwrap();
        let x = h.alloc(&xd).unwrap();
        let mut y = h.alloc(&xd).unwrap();
        let mut states = h.alloc_bytes(dropout_states_size(h)).unwrap();
        let mut reserve = h.alloc_bytes(dropout_reserve_space_size(&xd)).unwrap();
        for p in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let e = DropoutDescriptor::new(h, p, &mut states, 1).unwrap_err();
            assert!(matches!(e, Error::BadParam { arg: "dropout", .. }), "{e}");
        }
        // Restoring a buffer that was never seeded.
        let e = DropoutDescriptor::restore(h, 0.5, &states).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "states", .. }), "{e}");
        let mut short_states = h.alloc_bytes(dropout_states_size(h) - 1).unwrap();
        let e = DropoutDescriptor::new(h, 0.5, &mut short_states, 1).unwrap_err();
        assert!(
            matches!(e, Error::BufferTooSmall { arg: "states", .. }),
            "{e}"
        );
        let d = DropoutDescriptor::new(h, 0.5, &mut states, 1).unwrap();
        let e = DropoutDescriptor::restore(h, 2.0, &states).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "dropout", .. }), "{e}");
        let e = dropout_forward(h, &d, &mut short_states, &xd, &x, &xd, &mut y, &mut reserve)
            .unwrap_err();
        assert!(
            matches!(e, Error::BufferTooSmall { arg: "states", .. }),
            "{e}"
        );
        // Reserve space one word short.
        let mut short = h.alloc_bytes(dropout_reserve_space_size(&xd) - 4).unwrap();
        let e = dropout_forward(h, &d, &mut states, &xd, &x, &xd, &mut y, &mut short).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BufferTooSmall {
                    arg: "reserve_space",
                    ..
                }
            ),
            "{e}"
        );
        let e = dropout_backward(h, &d, &xd, &x, &xd, &mut y, &short).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BufferTooSmall {
                    arg: "reserve_space",
                    ..
                }
            ),
            "{e}"
        );
        // Mismatched descriptors.
        let other = TensorDescriptor::packed(DataType::F32, &[4, 101]).unwrap();
        let mut y_big = h.alloc(&other).unwrap();
        let e = dropout_forward(
            h,
            &d,
            &mut states,
            &xd,
            &x,
            &other,
            &mut y_big,
            &mut reserve,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let half = xd.with_dtype(DataType::F16).unwrap();
        let e =
            dropout_forward(h, &d, &mut states, &xd, &x, &half, &mut y, &mut reserve).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let e = dropout_backward(h, &d, &xd, &x, &other, &mut y_big, &reserve).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "dx_desc", .. }), "{e}");
        let overlapping = TensorDescriptor::new(DataType::F32, &[4, 100], &[1, 1]).unwrap();
        let e = dropout_forward(
            h,
            &d,
            &mut states,
            &xd,
            &x,
            &overlapping,
            &mut y,
            &mut reserve,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        // Short tensors.
        let short_x = h.alloc_bytes(xd.size_bytes() - 1).unwrap();
        let e = dropout_forward(h, &d, &mut states, &xd, &short_x, &xd, &mut y, &mut reserve)
            .unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "x", .. }), "{e}");
        let mut short_y = h.alloc_bytes(xd.size_bytes() - 1).unwrap();
        let e = dropout_backward(h, &d, &xd, &x, &xd, &mut short_y, &reserve).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "dx", .. }), "{e}");
        // A buffer of another handle.
        let stranger = Handle::cpu();
        let mut foreign = stranger
            .alloc_bytes(dropout_states_size(&stranger))
            .unwrap();
        let e =
            dropout_forward(h, &d, &mut foreign, &xd, &x, &xd, &mut y, &mut reserve).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "states", .. }), "{e}");
        // Nothing above advanced the generator.
        assert_eq!(dropout_generator_state(h, &states).unwrap().calls, 0);
    }
}
