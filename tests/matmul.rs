//! matmul: the reference against hand-computed values; the GPU against the reference on
//! drawn shapes, transposes, batches, epilogues, precisions and algorithms; exact results
//! on integer data at tile-crossing sizes for every algorithm and copy path (the Hopper
//! `wgmma` ones where the device and layouts allow, a `NotSupported` with the reason
//! where not); the algorithm queries; and every kind of bad input.

mod common;

use common::*;
use oxidnn::reference::matmul::matmul as reference_matmul;
use oxidnn::*;
use proptest::prelude::*;

/// A `[batch?, rows, cols]` matrix descriptor: row-major (cols contiguous) or
/// column-major, with `pad` extra elements per leading dimension and per batch.
fn matrix(
    dtype: DataType,
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    col_major: bool,
    pad: usize,
) -> TensorDescriptor {
    let (row_stride, col_stride, plane) = if col_major {
        (1, rows + pad, (rows + pad) * cols + pad)
    } else {
        (cols + pad, 1, rows * (cols + pad) + pad)
    };
    match batch {
        Some(b) => TensorDescriptor::new(dtype, &[b, rows, cols], &[plane, row_stride, col_stride]),
        None => TensorDescriptor::new(dtype, &[rows, cols], &[row_stride, col_stride]),
    }
    .expect("valid matrix layout")
}

/// One drawn matmul problem.
#[derive(Clone, Debug)]
struct Case {
    input: DataType,
    output: DataType,
    math: MatmulMath,
    algo: Option<MatmulAlgo>,
    m: usize,
    n: usize,
    k: usize,
    /// C's batch (None: rank 2) and whether A / B are broadcast (batch 1).
    batch: Option<usize>,
    broadcast: (bool, bool),
    col_major: (bool, bool, bool),
    pads: (usize, usize, usize),
    alpha: f64,
    beta: f64,
    activation: ActivationDescriptor,
    bias: BiasMode,
    residual: Option<f64>,
}

impl Case {
    /// `m x n x k` on `input -> output` with `math` (and `algo`, if forced): one row-major
    /// matrix per operand, no padding, `D = A B` with no epilogue.
    fn plain(
        (input, output, math): (DataType, DataType, MatmulMath),
        algo: Option<MatmulAlgo>,
        (m, n, k): (usize, usize, usize),
    ) -> Case {
        Case {
            input,
            output,
            math,
            algo,
            m,
            n,
            k,
            batch: None,
            broadcast: (false, false),
            col_major: (false, false, false),
            pads: (0, 0, 0),
            alpha: 1.0,
            beta: 0.0,
            activation: ActivationDescriptor::identity(),
            bias: BiasMode::None,
            residual: None,
        }
    }
}

fn precision() -> impl Strategy<Value = (DataType, DataType, MatmulMath)> {
    prop_oneof![
        Just((DataType::F32, DataType::F32, MatmulMath::Fma)),
        Just((DataType::F32, DataType::F32, MatmulMath::Tf32)),
        Just((DataType::F16, DataType::F16, MatmulMath::TensorOp)),
        Just((DataType::F16, DataType::F32, MatmulMath::TensorOp)),
        Just((DataType::BF16, DataType::BF16, MatmulMath::TensorOp)),
        Just((DataType::BF16, DataType::F32, MatmulMath::TensorOp)),
    ]
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![extent(), 65usize..200]
}

fn case() -> impl Strategy<Value = Case> {
    let shape = (size(), size(), size());
    let batching = prop_oneof![
        3 => Just((None, (false, false))),
        1 => (1usize..4, any::<bool>(), any::<bool>()).prop_map(|(b, ba, bb)| (Some(b), (ba, bb))),
    ];
    let layout = (
        (any::<bool>(), any::<bool>(), any::<bool>()),
        (0usize..9, 0usize..9, 0usize..3),
    );
    let epilogue = (
        prop::sample::select(vec![
            ActivationDescriptor::identity(),
            ActivationDescriptor::relu(),
            ActivationDescriptor::gelu(),
            ActivationDescriptor::silu(),
            ActivationDescriptor::tanh(),
        ]),
        prop::sample::select(vec![BiasMode::None, BiasMode::PerRow, BiasMode::PerColumn]),
        prop_oneof![2 => Just(None), 1 => Just(Some(1.0)), 1 => Just(Some(-0.5))],
    );
    let algo = prop_oneof![
        Just(None),
        prop::sample::select(MatmulAlgo::ALL.to_vec()).prop_map(Some)
    ];
    (
        precision(),
        shape,
        batching,
        layout,
        alpha_beta(),
        epilogue,
        algo,
    )
        .prop_map(
            |(
                (input, output, math),
                (m, n, k),
                (batch, broadcast),
                (col_major, pads),
                (alpha, beta),
                (activation, bias, residual),
                algo,
            )| Case {
                input,
                output,
                math,
                algo: algo.filter(|a| a.supports(math)),
                m,
                n,
                k,
                batch,
                broadcast,
                col_major,
                pads,
                alpha,
                beta,
                activation,
                bias,
                residual,
            },
        )
}

/// The bound on the relative error of a drawn case: the output's rounding, or tf32's
/// 10-bit inputs, or f32 accumulation over K.
fn tolerance(c: &Case) -> f64 {
    match (c.math, c.output) {
        (MatmulMath::Tf32, _) => 3e-3,
        (_, DataType::F32) => 2e-5,
        (_, out) => bound(out),
    }
}

/// Uploaded inputs of a case and the reference result.
struct Prepared {
    a_desc: TensorDescriptor,
    b_desc: TensorDescriptor,
    c_desc: TensorDescriptor,
    bias_desc: TensorDescriptor,
    a: Buffer,
    b: Buffer,
    c: Buffer,
    bias: Buffer,
    z: Buffer,
    expected: HostTensor,
}

fn prepare(
    h: &Handle,
    c: &Case,
    fill: &mut impl FnMut(TensorDescriptor) -> HostTensor,
) -> Prepared {
    let (ca, cb, cc) = c.col_major;
    let (pa, pb, pc) = c.pads;
    let batch_of = |broadcast: bool| c.batch.map(|b| if broadcast { 1 } else { b });
    let a_desc = matrix(c.input, batch_of(c.broadcast.0), c.m, c.k, ca, pa);
    let b_desc = matrix(c.input, batch_of(c.broadcast.1), c.k, c.n, cb, pb);
    let c_desc = matrix(c.output, c.batch, c.m, c.n, cc, pc);
    let bias_len = if c.bias == BiasMode::PerRow { c.m } else { c.n };
    let bias_desc = TensorDescriptor::packed(c.output, &[bias_len]).unwrap();
    let (at, bt) = (fill(a_desc), fill(b_desc));
    let old_c = fill(c_desc);
    let bias_t = fill(bias_desc);
    let z_t = fill(c_desc);
    let mut expected = old_c.clone();
    reference_matmul(
        c.alpha,
        &at,
        &bt,
        c.beta,
        &mut expected,
        (c.bias != BiasMode::None).then_some((c.bias, &bias_t)),
        c.residual.map(|s| (s, &z_t)),
        &c.activation,
    );
    Prepared {
        a: upload_poisoned(h, &at, false),
        b: upload_poisoned(h, &bt, false),
        // With beta == 0, C must not be read: every element starts as NaN.
        c: upload_poisoned(h, &old_c, c.beta == 0.0),
        bias: upload_poisoned(h, &bias_t, false),
        z: upload_poisoned(h, &z_t, false),
        a_desc,
        b_desc,
        c_desc,
        bias_desc,
        expected,
    }
}

/// Whether a `wgmma` algorithm must decline the operand `d` (a matrix descriptor): it
/// takes operands with one of the two matrix dims contiguous (or of extent 1) and every
/// other stride (extent-1 dims aside) a multiple of 16 bytes.
fn wgmma_layout_ok(d: &TensorDescriptor) -> bool {
    let per_chunk = 16 / d.dtype().size_bytes();
    let rank = d.rank();
    let stride = |i: usize| if d.dims()[i] == 1 { 0 } else { d.strides()[i] };
    (rank - 2..rank).any(|fast| {
        (d.dims()[fast] == 1 || d.strides()[fast] == 1)
            && (0..rank)
                .filter(|&i| i != fast)
                .all(|i| stride(i) % per_chunk == 0)
    })
}

/// The reason a forced algorithm must decline this case on `h` (a substring of the
/// `NotSupported` message), or `None` if it must run it.
fn declines(h: &Handle, c: &Case, p: &Prepared) -> Option<&'static str> {
    let algo = c.algo?;
    if !algo.needs_sm90a() {
        return None;
    }
    if h.compute_capability() != Some((9, 0)) {
        Some("compute capability 9.0")
    } else if !wgmma_layout_ok(&p.a_desc) || !wgmma_layout_ok(&p.b_desc) {
        Some("16-byte aligned")
    } else {
        None
    }
}

/// Runs the case and checks the result against the reference within `tolerance`, or, where
/// the forced algorithm must decline it, that it returns `NotSupported` with the reason.
fn run_and_check(h: &Handle, c: &Case, p: &mut Prepared, tolerance: f64) {
    match (run(h, c, p), declines(h, c, p)) {
        (Ok(()), None) => check(
            h,
            &p.c_desc,
            &p.c,
            &p.expected,
            tolerance,
            &format!("{c:?}"),
        ),
        (Err(Error::NotSupported { message }), Some(why)) => {
            assert!(message.contains(why), "{c:?}: {message} (expected: {why})")
        }
        (result, why) => panic!("{c:?}: got {result:?}, expected to decline: {why:?}"),
    }
}

fn run(h: &Handle, c: &Case, p: &mut Prepared) -> Result<()> {
    let mut desc = MatmulDescriptor::new(c.math);
    if let Some(algo) = c.algo {
        desc = desc.with_algorithm(algo);
    }
    let epilogue = MatmulEpilogue {
        activation: c.activation,
        bias: (c.bias != BiasMode::None).then_some(MatmulBias {
            mode: c.bias,
            desc: &p.bias_desc,
            data: &p.bias,
        }),
        residual: c.residual.map(|scale| MatmulResidual {
            scale,
            desc: &p.c_desc,
            data: &p.z,
        }),
    };
    matmul(
        h, &desc, c.alpha, &p.a_desc, &p.a, &p.b_desc, &p.b, c.beta, &p.c_desc, &mut p.c, &epilogue,
    )
}

#[test]
fn reference_matches_hand_computed_values() {
    let d = |dims: &[usize]| TensorDescriptor::packed(DataType::F64, dims).unwrap();
    let t = |dims: &[usize], v: &[f64]| {
        let desc = d(dims);
        let mut i = 0;
        HostTensor::from_fn(desc, |_| {
            i += 1;
            v[i - 1]
        })
    };
    // Two batches of A (2x2) times one broadcast B (2x1), plus beta * C, a per-row bias
    // and a residual, through a relu.
    let a = t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 0.0, -1.0]);
    let b = t(&[1, 2, 1], &[1.0, 10.0]);
    let mut c = t(&[2, 2, 1], &[100.0, 200.0, 300.0, 400.0]);
    let bias = t(&[2], &[0.5, -0.5]);
    let z = t(&[2, 2, 1], &[1.0, 1.0, 1.0, 1.0]);
    reference_matmul(
        2.0,
        &a,
        &b,
        0.01,
        &mut c,
        Some((BiasMode::PerRow, &bias)),
        Some((3.0, &z)),
        &ActivationDescriptor::relu(),
    );
    // Batch 0: A B = [21, 43]; batch 1: [-1, -10].
    let want = [
        2.0 * 21.0 + 1.0 + 0.5 + 3.0,
        2.0 * 43.0 + 2.0 - 0.5 + 3.0,
        (-2.0 + 3.0 + 0.5 + 3.0f64).max(0.0),
        (-20.0 + 4.0 - 0.5 + 3.0f64).max(0.0),
    ];
    assert_eq!(c.logical(), want);
}

#[test]
fn cpu_and_gpu_agree_on_a_linear_layer_with_every_epilogue_input() {
    for h in handles() {
        let c = Case {
            input: DataType::F32,
            output: DataType::F32,
            math: MatmulMath::Fma,
            algo: None,
            m: 37,
            n: 19,
            k: 23,
            batch: Some(2),
            broadcast: (false, true),
            col_major: (false, true, false),
            pads: (1, 2, 0),
            alpha: 0.75,
            beta: 0.5,
            activation: ActivationDescriptor::gelu(),
            bias: BiasMode::PerColumn,
            residual: Some(1.0),
        };
        let mut r = rng(7);
        let mut p = prepare(h, &c, &mut |d| random(d, -1.0, 1.0, &mut r));
        run(h, &c, &mut p).unwrap();
        check(h, &p.c_desc, &p.c, &p.expected, 2e-5, "linear layer");
    }
}

proptest! {
    #![proptest_config(gpu_cases(160))]

    /// Every precision, transpose, batch/broadcast, padding, epilogue and algorithm agrees
    /// with the f64 reference, writes every element of C and nothing between them.
    #[test]
    fn gpu_matches_reference(c in case(), seed in any::<u64>()) {
        with_gpu("gpu_matches_reference", |h| {
            let mut r = rng(seed);
            let mut p = prepare(h, &c, &mut |d| random(d, -1.0, 1.0, &mut r));
            run_and_check(h, &c, &mut p, tolerance(&c));
        });
    }
}

/// Small integers: every product and partial sum is exact in every input type and in the
/// f32 accumulators, whatever the order of summation, so results must match exactly.
fn integers(d: TensorDescriptor, r: &mut impl rand::Rng) -> HostTensor {
    HostTensor::from_fn(d, |_| r.gen_range(-3i32..=3) as f64)
}

#[test]
fn exact_on_integers_across_tile_edges_for_every_algorithm_and_copy_path() {
    with_gpu("exact_on_integers", |h| {
        let precisions = [
            (DataType::F32, MatmulMath::Fma),
            (DataType::F32, MatmulMath::Tf32),
            (DataType::F16, MatmulMath::TensorOp),
            (DataType::BF16, MatmulMath::TensorOp),
        ];
        // Sizes crossing 64/128/256 tile edges and K-stage edges; pads 0 keep leading
        // dims 16-byte aligned where the sizes are (cp.async paths), pad 1 forces gathers.
        // The last two have fewer K tiles than the pipelines have stages (K = 17: 3 tiles
        // of 8, 2 of 16; K = 1).
        let shapes = [
            (257, 131, 515),
            (64, 256, 64),
            (129, 300, 33),
            (1, 263, 97),
            (190, 1, 40),
            (70, 45, 17),
            (40, 129, 1),
        ];
        let mut r = rng(11);
        for (input, math) in precisions {
            for algo in MatmulAlgo::ALL.into_iter().filter(|a| a.supports(math)) {
                for (i, &(m, n, k)) in shapes.iter().enumerate() {
                    for layouts in 0..4u8 {
                        let pad = if i % 2 == 0 { 0 } else { 8 };
                        let c = Case {
                            batch: Some(2),
                            broadcast: (false, i == 1),
                            col_major: (layouts & 1 != 0, layouts & 2 != 0, i == 2),
                            pads: (pad + (i == 3) as usize, pad, 0),
                            ..Case::plain((input, DataType::F32, math), Some(algo), (m, n, k))
                        };
                        let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
                        run_and_check(h, &c, &mut p, 0.0);
                    }
                }
            }
        }
    });
}

/// The exact-f32 kernels' 16-byte copies (operands M/N-contiguous with 16-byte aligned
/// strides: A column-major, B row-major, leading dims padded to multiples of 4) at ragged
/// edges: operand rows that end inside a 4-element chunk, K not a multiple of the K tile,
/// fewer K tiles than stages, on both tiles that take them; and the same shapes with
/// word copies (A row-major) beside them.
#[test]
fn exact_f32_chunk_copies_at_ragged_edges() {
    with_gpu("exact_f32_chunk_copies", |h| {
        let mut r = rng(23);
        let shapes = [
            (131, 258, 45, 1, 2),
            (250, 130, 300, 2, 2),
            (5, 7, 1029, 3, 1),
            (129, 513, 64, 3, 3),
            (260, 260, 3, 0, 0),
        ];
        for algo in [MatmulAlgo::Tile128x256, MatmulAlgo::Tile128x128] {
            for &(m, n, k, pa, pb) in &shapes {
                for a_col_major in [true, false] {
                    let exact_f32 = (DataType::F32, DataType::F32, MatmulMath::Fma);
                    let c = Case {
                        // A padded batch stride is not aligned (see `matrix`).
                        batch: (pa == 0 && pb == 0).then_some(2),
                        col_major: (a_col_major, false, false),
                        pads: (if a_col_major { pa } else { 0 }, pb, 0),
                        ..Case::plain(exact_f32, Some(algo), (m, n, k))
                    };
                    let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
                    run_and_check(h, &c, &mut p, 0.0);
                }
            }
        }
    });
}

/// The `wgmma` algorithms on layouts they take (16-byte aligned strides) at sizes that
/// cross their 128-row, 128/256-column and 64-K edges, K = 1 and 2, all four
/// K-/MN-major operand combinations, batches with a broadcast operand, and the epilogue
/// (alpha, beta, bias, residual, relu, f32/f16/bf16 output): exact on integers.
#[test]
fn wgmma_exact_on_integers_at_aligned_edges() {
    with_gpu("wgmma_exact_on_integers", |h| {
        let shapes = [
            (136, 264, 520, Some(2), (false, true)),
            (128, 256, 128, None, (false, false)),
            (8, 8, 8, None, (false, false)),
            (264, 136, 64, Some(3), (true, false)),
            (200, 72, 1, None, (false, false)),
            (72, 200, 2, Some(2), (false, false)),
            (392, 520, 1000, None, (false, false)),
        ];
        let mut r = rng(23);
        let mut ran = 0;
        for (input, out16) in [
            (DataType::F16, DataType::F16),
            (DataType::BF16, DataType::BF16),
        ] {
            for algo in MatmulAlgo::ALL.into_iter().filter(|a| a.needs_sm90a()) {
                for (i, &(m, n, k, batch, broadcast)) in shapes.iter().enumerate() {
                    for layouts in 0..8u8 {
                        // Every other case runs the whole epilogue, in f32 or (on smaller
                        // magnitudes: K <= 128 keeps sums exact in 16 bits) 16-bit output.
                        let full = (i + layouts as usize) % 2 == 1;
                        let output = if full && k <= 128 && input == DataType::F16 {
                            out16
                        } else {
                            DataType::F32
                        };
                        let c = Case {
                            input,
                            output,
                            math: MatmulMath::TensorOp,
                            algo: Some(algo),
                            m,
                            n,
                            k,
                            batch,
                            broadcast,
                            col_major: (layouts & 1 != 0, layouts & 2 != 0, layouts & 4 != 0),
                            pads: (8 * (i % 2), 8 * (i % 3 == 0) as usize, (i % 2)),
                            alpha: 1.0,
                            beta: if full { 1.0 } else { 0.0 },
                            activation: if full {
                                ActivationDescriptor::relu()
                            } else {
                                ActivationDescriptor::identity()
                            },
                            bias: if full {
                                BiasMode::PerColumn
                            } else {
                                BiasMode::None
                            },
                            residual: full.then_some(-1.0),
                        };
                        let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
                        ran += declines(h, &c, &p).is_none() as usize;
                        run_and_check(h, &c, &mut p, 0.0);
                    }
                }
            }
        }
        if h.compute_capability() == Some((9, 0)) {
            assert!(ran > 100, "only {ran} cases ran on wgmma");
        }
    });
}

/// An f16 -> f32 tensor-core matmul of 3 x 2 x 5 in 70000 batches, past the grid's
/// 65535 rows.
fn many_batches() -> Case {
    let f16_to_f32 = (DataType::F16, DataType::F32, MatmulMath::TensorOp);
    Case {
        batch: Some(70_000),
        ..Case::plain(f16_to_f32, None, (3, 2, 5))
    }
}

#[test]
fn batches_beyond_the_grid_limit_are_all_computed() {
    with_gpu("batches_beyond_the_grid_limit", |h| {
        let c = many_batches();
        let mut r = rng(3);
        let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
        run(h, &c, &mut p).unwrap();
        check(h, &p.c_desc, &p.c, &p.expected, 0.0, "70000 batches");
    });
}

/// The TMA tiles run one grid row per batch: beyond 65535 batches a forced TMA tile
/// declines and says why (the heuristic takes another tile: the test above).
#[test]
fn tma_tiles_decline_batches_beyond_the_grid() {
    with_gpu("tma_tiles_decline_batches_beyond_the_grid", |h| {
        let c = Case {
            algo: Some(MatmulAlgo::WgmmaTma128x64),
            m: 8,
            n: 8,
            k: 8,
            ..many_batches()
        };
        let mut r = rng(4);
        let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
        let why = if h.compute_capability() == Some((9, 0)) {
            "65535"
        } else {
            "compute capability 9.0"
        };
        match run(h, &c, &mut p) {
            Err(Error::NotSupported { message }) => {
                assert!(message.contains(why), "{message} (expected: {why})")
            }
            other => panic!("70000 batches on WgmmaTma128x64: got {other:?}"),
        }
    });
}

#[test]
fn heuristic_and_find_rank_the_supported_algorithms() {
    let desc = |dt, dims: &[usize]| TensorDescriptor::packed(dt, dims).unwrap();
    for h in handles() {
        // Big enough for the largest tile to fill the GPU; tiny ones get the smallest tile.
        let (a, b, c) = (
            desc(DataType::F16, &[4096, 512]),
            desc(DataType::F16, &[512, 4096]),
            desc(DataType::F16, &[4096, 4096]),
        );
        let d = MatmulDescriptor::new(MatmulMath::TensorOp);
        let largest = if h.compute_capability() == Some((9, 0)) {
            MatmulAlgo::WgmmaTma128x256
        } else {
            MatmulAlgo::Tile128x256
        };
        assert_eq!(get_matmul_algorithm(h, &d, &a, &b, &c).unwrap(), largest);
        // On sm_90a a narrow N takes the narrowest TMA tile, whose columns it fills.
        if h.compute_capability() == Some((9, 0)) {
            let (a, b, c) = (
                desc(DataType::F16, &[65536, 512]),
                desc(DataType::F16, &[512, 64]),
                desc(DataType::F16, &[65536, 64]),
            );
            assert_eq!(
                get_matmul_algorithm(h, &d, &a, &b, &c).unwrap(),
                MatmulAlgo::WgmmaTma128x64
            );
        }
        let (a, b, c) = (
            desc(DataType::F32, &[16, 8]),
            desc(DataType::F32, &[8, 16]),
            desc(DataType::F32, &[16, 16]),
        );
        let algo =
            get_matmul_algorithm(h, &MatmulDescriptor::new(MatmulMath::Fma), &a, &b, &c).unwrap();
        assert_eq!(algo, MatmulAlgo::Tile64x64);
    }
    with_gpu("find_ranks_algorithms", |h| {
        // (K = 100 leaves row-major A unaligned for wgmma; K = 128 does not.)
        for (input, math, k) in [
            (DataType::F32, MatmulMath::Fma, 100),
            (DataType::BF16, MatmulMath::TensorOp, 100),
            (DataType::BF16, MatmulMath::TensorOp, 128),
        ] {
            let c = Case {
                activation: ActivationDescriptor::relu(),
                ..Case::plain((input, input, math), None, (300, 200, k))
            };
            let mut r = rng(5);
            let mut p = prepare(h, &c, &mut |d| random(d, -1.0, 1.0, &mut r));
            let ranked = find_matmul_algorithm(
                h,
                &MatmulDescriptor::new(math),
                1.0,
                &p.a_desc,
                &p.a,
                &p.b_desc,
                &p.b,
                0.0,
                &p.c_desc,
                &mut p.c,
                &MatmulEpilogue {
                    activation: ActivationDescriptor::relu(),
                    ..Default::default()
                },
                3,
            )
            .unwrap();
            let sm90a = h.compute_capability() == Some((9, 0));
            let want: Vec<_> = MatmulAlgo::ALL
                .into_iter()
                .filter(|a| a.supports(math) && (!a.needs_sm90a() || (sm90a && k == 128)))
                .collect();
            assert_eq!(ranked.len(), want.len(), "{ranked:?}");
            assert!(want.iter().all(|a| ranked.iter().any(|r| r.algo == *a)));
            assert!(ranked.windows(2).all(|w| w[0].time_ms <= w[1].time_ms));
            assert!(ranked
                .iter()
                .all(|r| r.time_ms > 0.0 && r.time_ms.is_finite()));
            // With beta = 0 every trial computes the same result.
            check(h, &p.c_desc, &p.c, &p.expected, tolerance(&c), "after find");
        }
    });
    let cpu = Handle::cpu();
    let d = TensorDescriptor::packed(DataType::F32, &[2, 2]).unwrap();
    let x = cpu.alloc(&d).unwrap();
    let mut y = cpu.alloc(&d).unwrap();
    let e = find_matmul_algorithm(
        &cpu,
        &MatmulDescriptor::new(MatmulMath::Fma),
        1.0,
        &d,
        &x,
        &d,
        &x,
        0.0,
        &d,
        &mut y,
        &MatmulEpilogue::default(),
        1,
    )
    .unwrap_err();
    assert!(matches!(e, Error::NotSupported { .. }), "{e}");
}

/// A call with every argument valid, to be broken one way at a time.
struct Call {
    math: MatmulMath,
    algo: Option<MatmulAlgo>,
    alpha: f64,
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
    a_bytes: Option<usize>,
    bias: Option<(BiasMode, TensorDescriptor)>,
    residual: Option<TensorDescriptor>,
}

impl Call {
    fn valid() -> Self {
        let d = |dims: &[usize]| TensorDescriptor::packed(DataType::F32, dims).unwrap();
        Self {
            math: MatmulMath::Fma,
            algo: None,
            alpha: 1.0,
            a: d(&[4, 3]),
            b: d(&[3, 5]),
            c: d(&[4, 5]),
            a_bytes: None,
            bias: None,
            residual: None,
        }
    }

    fn run(&self, h: &Handle) -> Result<()> {
        let a = h.alloc_bytes(self.a_bytes.unwrap_or(self.a.size_bytes()))?;
        let b = h.alloc(&self.b)?;
        let mut c = h.alloc(&self.c)?;
        let bias = self.bias.map(|(_, d)| h.alloc(&d)).transpose()?;
        let z = self.residual.map(|d| h.alloc(&d)).transpose()?;
        let mut desc = MatmulDescriptor::new(self.math);
        if let Some(algo) = self.algo {
            desc = desc.with_algorithm(algo);
        }
        let epilogue = MatmulEpilogue {
            activation: ActivationDescriptor::identity(),
            bias: self
                .bias
                .as_ref()
                .zip(bias.as_ref())
                .map(|((mode, d), data)| MatmulBias {
                    mode: *mode,
                    desc: d,
                    data,
                }),
            residual: self
                .residual
                .as_ref()
                .zip(z.as_ref())
                .map(|(d, data)| MatmulResidual {
                    scale: 1.0,
                    desc: d,
                    data,
                }),
        };
        matmul(
            h, &desc, self.alpha, &self.a, &a, &self.b, &b, 0.0, &self.c, &mut c, &epilogue,
        )
    }
}

#[test]
fn bad_inputs_are_rejected_with_the_argument_named() {
    let f32d = |dims: &[usize]| TensorDescriptor::packed(DataType::F32, dims).unwrap();
    let f16d = |dims: &[usize]| TensorDescriptor::packed(DataType::F16, dims).unwrap();
    type Breaker = Box<dyn Fn(&mut Call)>;
    let cases: Vec<(&str, Breaker, &str)> = vec![
        (
            "K mismatch",
            Box::new(move |c: &mut Call| c.b = f32d(&[4, 5])),
            "b_desc",
        ),
        (
            "C rows",
            Box::new(move |c: &mut Call| c.c = f32d(&[3, 5])),
            "c_desc",
        ),
        (
            "C cols",
            Box::new(move |c: &mut Call| c.c = f32d(&[4, 6])),
            "c_desc",
        ),
        (
            "rank 1 A",
            Box::new(move |c: &mut Call| c.a = f32d(&[12])),
            "a_desc",
        ),
        (
            "rank 4 C",
            Box::new(move |c: &mut Call| c.c = f32d(&[1, 1, 4, 5])),
            "c_desc",
        ),
        (
            "batch mismatch",
            Box::new(move |c: &mut Call| {
                c.a = f32d(&[2, 4, 3]);
                c.c = f32d(&[3, 4, 5]);
            }),
            "a_desc",
        ),
        (
            "batched A, unbatched C",
            Box::new(move |c: &mut Call| c.a = f32d(&[2, 4, 3])),
            "a_desc",
        ),
        (
            "A/B dtypes",
            Box::new(move |c: &mut Call| c.b = f16d(&[3, 5])),
            "b_desc",
        ),
        (
            "overlapping C",
            Box::new(move |c: &mut Call| {
                c.c = TensorDescriptor::new(DataType::F32, &[4, 5], &[1, 1]).unwrap()
            }),
            "c_desc",
        ),
        (
            "short A",
            Box::new(move |c: &mut Call| c.a_bytes = Some(4 * 12 - 1)),
            "a",
        ),
        (
            "bias length",
            Box::new(move |c: &mut Call| c.bias = Some((BiasMode::PerColumn, f32d(&[4])))),
            "bias",
        ),
        (
            "bias rank",
            Box::new(move |c: &mut Call| c.bias = Some((BiasMode::PerRow, f32d(&[4, 1])))),
            "bias",
        ),
        (
            "bias without mode",
            Box::new(move |c: &mut Call| c.bias = Some((BiasMode::None, f32d(&[5])))),
            "bias",
        ),
        (
            "bias dtype",
            Box::new(move |c: &mut Call| c.bias = Some((BiasMode::PerColumn, f16d(&[5])))),
            "bias",
        ),
        (
            "residual dims",
            Box::new(move |c: &mut Call| c.residual = Some(f32d(&[5, 4]))),
            "residual",
        ),
        (
            "residual dtype",
            Box::new(move |c: &mut Call| c.residual = Some(f16d(&[4, 5]))),
            "residual",
        ),
        (
            "NaN alpha",
            Box::new(move |c: &mut Call| c.alpha = f64::NAN),
            "alpha",
        ),
    ];
    for h in handles() {
        Call::valid().run(h).expect("the valid call");
        for (what, breaker, arg) in &cases {
            let mut call = Call::valid();
            breaker(&mut call);
            match call.run(h) {
                Err(Error::BadParam { arg: got, .. })
                | Err(Error::BufferTooSmall { arg: got, .. }) => {
                    assert_eq!(got, *arg, "{what}")
                }
                other => panic!("{what}: expected an error naming `{arg}`, got {other:?}"),
            }
        }
    }
}

#[test]
fn unsupported_precision_combinations_say_so() {
    let d = |dt, dims: &[usize]| TensorDescriptor::packed(dt, dims).unwrap();
    let combos = [
        (MatmulMath::Fma, DataType::F16, DataType::F16, "math Fma"),
        (
            MatmulMath::TensorOp,
            DataType::F32,
            DataType::F32,
            "math TensorOp",
        ),
        (MatmulMath::Tf32, DataType::BF16, DataType::F32, "math Tf32"),
        (MatmulMath::Fma, DataType::F32, DataType::F16, "writes f32"),
        (
            MatmulMath::TensorOp,
            DataType::F16,
            DataType::BF16,
            "writes f16",
        ),
    ];
    for h in handles() {
        for (math, input, output, says) in combos {
            let call = Call {
                math,
                a: d(input, &[4, 3]),
                b: d(input, &[3, 5]),
                c: d(output, &[4, 5]),
                ..Call::valid()
            };
            match call.run(h) {
                Err(Error::NotSupported { message }) => {
                    assert!(message.contains(says), "{message}")
                }
                other => panic!("{math:?} {input} -> {output}: got {other:?}"),
            }
        }
    }
    with_gpu("unsupported_algorithm", |h| {
        let call = Call {
            math: MatmulMath::Tf32,
            algo: Some(MatmulAlgo::Tile128x256),
            ..Call::valid()
        };
        match call.run(h) {
            Err(Error::NotSupported { message }) => assert!(message.contains("Tile128x256")),
            other => panic!("128x256 tf32: got {other:?}"),
        }
        for algo in MatmulAlgo::ALL.into_iter().filter(|a| a.needs_sm90a()) {
            let call = Call {
                algo: Some(algo),
                ..Call::valid()
            };
            match call.run(h) {
                Err(Error::NotSupported { message }) => {
                    assert!(
                        message.contains(&format!("{algo:?}")) && message.contains("Fma"),
                        "{message}"
                    )
                }
                other => panic!("{algo:?} on f32: got {other:?}"),
            }
            // f16 [4, 3] x [3, 5]: K = 3 rows of A are not 16-byte aligned.
            let call = Call {
                math: MatmulMath::TensorOp,
                algo: Some(algo),
                a: d(DataType::F16, &[4, 3]),
                b: d(DataType::F16, &[3, 5]),
                c: d(DataType::F16, &[4, 5]),
                ..Call::valid()
            };
            let why = if h.compute_capability() == Some((9, 0)) {
                "16-byte aligned"
            } else {
                "compute capability 9.0"
            };
            match call.run(h) {
                Err(Error::NotSupported { message }) => assert!(message.contains(why), "{message}"),
                other => panic!("{algo:?} on unaligned f16: got {other:?}"),
            }
        }
        let call = Call {
            a: d(DataType::F64, &[4, 3]),
            b: d(DataType::F64, &[3, 5]),
            c: d(DataType::F64, &[4, 5]),
            ..Call::valid()
        };
        assert!(matches!(call.run(h), Err(Error::NotSupported { .. })));
    });
}

// ---------------------------------------------------------------------------------------
// Short-K tiles and the wide (8-column) epilogue
// ---------------------------------------------------------------------------------------

/// The short-K tile (2 stages) and the tensor-core tiles' 8-column epilogue runs at K of
/// one stage and below and across several stages, output widths that are and are not
/// multiples of 8, aligned and unaligned output rows, row- and column-major C, and the
/// whole epilogue in 16-bit and f32 output: exact on integers.
#[test]
fn short_k_and_wide_epilogue_exact_on_integers() {
    with_gpu("short_k_exact_on_integers", |h| {
        // (m, n, k, batch)
        let shapes = [
            (200, 72, 16, None),
            (131, 257, 64, Some(2)),
            (64, 8, 1, None),
            (300, 100, 33, None),
            (96, 136, 128, Some(2)),
            (130, 64, 200, None),
        ];
        let mut r = rng(31);
        for (input, math) in [
            (DataType::F16, MatmulMath::TensorOp),
            (DataType::BF16, MatmulMath::TensorOp),
            (DataType::F32, MatmulMath::Tf32),
        ] {
            let algos = [MatmulAlgo::Tile64x64ShortK, MatmulAlgo::Tile64x64];
            for algo in algos {
                for (i, &(m, n, k, batch)) in shapes.iter().enumerate() {
                    for layouts in 0..4u8 {
                        let full = (i + layouts as usize) % 2 == 1;
                        // 16-bit output on the smaller magnitudes (K <= 128 keeps sums exact).
                        let output = if full && k <= 128 && input == DataType::F16 {
                            DataType::F16
                        } else {
                            DataType::F32
                        };
                        let c = Case {
                            input,
                            output,
                            math,
                            algo: Some(algo),
                            m,
                            n,
                            k,
                            batch,
                            broadcast: (false, i % 3 == 1),
                            col_major: (layouts & 1 != 0, false, layouts & 2 != 0),
                            pads: (8 * (i % 2), 0, [0, 1, 8][i % 3]),
                            alpha: 1.0,
                            beta: if full { 1.0 } else { 0.0 },
                            activation: if full {
                                ActivationDescriptor::relu()
                            } else {
                                ActivationDescriptor::identity()
                            },
                            bias: match (full, i % 2) {
                                (false, _) => BiasMode::None,
                                (true, 0) => BiasMode::PerColumn,
                                _ => BiasMode::PerRow,
                            },
                            residual: full.then_some(-1.0),
                        };
                        let mut p = prepare(h, &c, &mut |d| integers(d, &mut r));
                        run_and_check(h, &c, &mut p, 0.0);
                    }
                }
            }
        }
    });
}

/// The heuristic takes the short-K tile for tensor-core K of up to two stages (on sm_90a
/// one: two already run on the TMA tiles), and never otherwise.
#[test]
fn heuristic_takes_short_k_tiles_for_one_stage_of_k() {
    let desc = |dt, dims: &[usize]| TensorDescriptor::packed(dt, dims).unwrap();
    for h in handles() {
        let sm90a = h.compute_capability() == Some((9, 0));
        for (dt, math, k, short) in [
            (DataType::F16, MatmulMath::TensorOp, 64, true),
            (DataType::F16, MatmulMath::TensorOp, 16, true),
            (DataType::F16, MatmulMath::TensorOp, 128, !sm90a),
            (DataType::F16, MatmulMath::TensorOp, 129, false),
            (DataType::F32, MatmulMath::Tf32, 64, true),
            (DataType::F32, MatmulMath::Tf32, 65, false),
            (DataType::F32, MatmulMath::Fma, 16, false),
        ] {
            let (a, b, c) = (
                desc(dt, &[4096, k]),
                desc(dt, &[k, 4096]),
                desc(dt, &[4096, 4096]),
            );
            let algo = get_matmul_algorithm(h, &MatmulDescriptor::new(math), &a, &b, &c).unwrap();
            assert_eq!(algo.short_k(), short, "{dt} {math:?} K={k}: {algo:?}");
        }
    }
}

/// Exact f32 keeps its big pipelined tiles at short K when the blocks still fill the GPU
/// (4096x4096, K = 16 and 128: 1.2x / 1.5x faster than 64 x 64, H100): 128 x 256 from
/// K = 128 on (7-9% faster than 128 x 128 on squares >= 2048 and 4096x4096x{128,1024}),
/// 128 x 128 below; it takes the small tile when no big one would fill the GPU (RNN
/// gates, N = 16) or the problem is small.
#[test]
fn heuristic_keeps_exact_f32_short_k_on_the_big_tile() {
    let desc = |dims: &[usize]| TensorDescriptor::packed(DataType::F32, dims).unwrap();
    let h = Handle::cpu();
    for ((m, n, k), want) in [
        ((4096, 4096, 16), MatmulAlgo::Tile128x128),
        ((4096, 4096, 128), MatmulAlgo::Tile128x256),
        ((4096, 4096, 4096), MatmulAlgo::Tile128x256),
        ((2048, 2048, 2048), MatmulAlgo::Tile128x256),
        ((2048, 16, 512), MatmulAlgo::Tile64x64),
        ((1024, 1024, 1024), MatmulAlgo::Tile64x64),
    ] {
        let (a, b, c) = (desc(&[m, k]), desc(&[k, n]), desc(&[m, n]));
        let algo =
            get_matmul_algorithm(&h, &MatmulDescriptor::new(MatmulMath::Fma), &a, &b, &c).unwrap();
        assert_eq!(algo, want, "{m}x{n}x{k}");
    }
}

/// Short-K timings (`find`, median of 10): `cargo test --release --test matmul -- --ignored
/// --nocapture time_short_k`.
#[test]
#[ignore]
fn time_short_k() {
    with_gpu("time_short_k", |h| {
        for (input, math) in [
            (DataType::F16, MatmulMath::TensorOp),
            (DataType::F32, MatmulMath::Fma),
            (DataType::F32, MatmulMath::Tf32),
        ] {
            for k in [16, 128] {
                let c = Case::plain((input, input, math), None, (4096, 4096, k));
                let mut r = rng(5);
                let mut p = prepare(h, &c, &mut |d| random(d, -1.0, 1.0, &mut r));
                let desc = MatmulDescriptor::new(math);
                let picked = get_matmul_algorithm(h, &desc, &p.a_desc, &p.b_desc, &p.c_desc);
                let ranked = find_matmul_algorithm(
                    h,
                    &desc,
                    1.0,
                    &p.a_desc,
                    &p.a,
                    &p.b_desc,
                    &p.b,
                    0.0,
                    &p.c_desc,
                    &mut p.c,
                    &MatmulEpilogue::default(),
                    10,
                )
                .unwrap();
                let line: Vec<_> = ranked
                    .iter()
                    .map(|r| format!("{:?} {:.4}", r.algo, r.time_ms))
                    .collect();
                println!(
                    "matmul 4096x4096x{k} {} {math:?} picked {picked:?}: {}",
                    input.name(),
                    line.join(", ")
                );
            }
        }
    });
}
