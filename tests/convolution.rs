//! Convolution forward: the descriptors' rules and the output-dim query; exact hand cases
//! on every handle; every algorithm the heuristic accepts against the f64 reference over
//! drawn shapes (1 and primes), paddings (including pad >= filter), strides, dilations,
//! groups (depthwise included), layouts (NCHW, NHWC, strided), dtypes, math types, modes,
//! alpha/beta and fused epilogues; exact integer results for algorithms that do not
//! round; find's ranking and cache; and bad inputs on every handle.

mod common;

use common::*;
use oxidnn::reference::convolution as reference;
use oxidnn::*;
use proptest::prelude::*;
use rand::Rng;

const XCORR: ConvMode = ConvMode::CrossCorrelation;

fn conv2d(pad: usize, stride: usize, dilation: usize, math: MathType) -> ConvolutionDescriptor {
    ConvolutionDescriptor::new(&[pad; 2], &[stride; 2], &[dilation; 2], XCORR, math).unwrap()
}

/// One drawn problem.
#[derive(Clone, Debug)]
struct Case {
    dtype: DataType,
    math: MathType,
    conv: ConvolutionDescriptor,
    x: TensorDescriptor,
    w: FilterDescriptor,
    y: TensorDescriptor,
    alpha: f64,
    beta: f64,
    bias: bool,
    residual: bool,
    activation: ActivationDescriptor,
}

impl Case {
    /// Multiply-adds per output element.
    fn reduction(&self) -> usize {
        self.w.dims()[1..].iter().product()
    }

    /// The error bound for `algo` on this case.
    fn tolerance(&self, perf: &ConvFwdAlgoPerf) -> f64 {
        let len = self.reduction() as f64;
        let base = match (self.dtype, self.math) {
            (DataType::F32, MathType::Tf32) => 2e-3,
            (DataType::F32, _) => 1e-6 * len.sqrt().max(10.0),
            (dt, _) => bound(dt) * 2.0,
        };
        if perf.reduced_precision {
            base.max(5e-3) * 4.0
        } else {
            base
        }
    }
}

/// A layout for a rank-`2 + s` tensor: NCHW, NHWC or a drawn strided one.
fn activation_layout(dims: Vec<usize>, dtype: DataType) -> impl Strategy<Value = TensorDescriptor> {
    let (n, c, sp) = (dims[0], dims[1], dims[2..].to_vec());
    prop_oneof![
        2 => Just(TensorDescriptor::spatial(dtype, n, c, &sp, Layout::ChannelsFirst).unwrap()),
        2 => Just(TensorDescriptor::spatial(dtype, n, c, &sp, Layout::ChannelsLast).unwrap()),
        1 => layout(dims, dtype),
    ]
}

fn math_for(dtype: DataType) -> BoxedStrategy<MathType> {
    match dtype {
        DataType::F32 => prop_oneof![3 => Just(MathType::Fma), 1 => Just(MathType::Tf32)].boxed(),
        _ => prop_oneof![3 => Just(MathType::TensorOp), 1 => Just(MathType::Fma)].boxed(),
    }
}

fn small() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(2),
        Just(3),
        Just(5),
        Just(7),
        Just(8),
        Just(13)
    ]
}

/// A drawn geometry: batch, groups, channels per group, and per spatial dim the filter,
/// padding, stride, dilation and input extent.
#[derive(Clone, Debug)]
struct Shape {
    n: usize,
    groups: usize,
    c_per_group: usize,
    k_per_group: usize,
    filter: Vec<usize>,
    pad: Vec<usize>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    input: Vec<usize>,
}

fn shape() -> impl Strategy<Value = Shape> {
    let per_dim = (
        prop_oneof![Just(1usize), Just(2), Just(3), Just(5)], // filter
        0usize..=4,                                           // pad (may exceed the filter)
        prop_oneof![3 => Just(1usize), 1 => Just(2), 1 => Just(3)], // stride
        prop_oneof![3 => Just(1usize), 1 => Just(2)],         // dilation
        prop_oneof![Just(1usize), Just(4), Just(7), Just(9), Just(16)], // input
    );
    (
        1usize..=3,                                           // spatial dims
        prop_oneof![Just(1usize), Just(2), Just(3)],          // n
        prop_oneof![Just(1usize), Just(2), Just(3), Just(4)], // groups
        small(),                                              // c per group
        small(),                                              // k per group
        prop_oneof![3 => Just(false), 1 => Just(true)],       // depthwise
        prop::collection::vec(per_dim, 3),
    )
        .prop_filter_map(
            "the filter must fit in the padded input",
            |(s, n, g, cg, kg, depthwise, dims)| {
                let dims = &dims[..s];
                let fits = dims.iter().all(|&(f, p, _, d, i)| (f - 1) * d < i + 2 * p);
                let pick = |k: usize| -> Vec<usize> {
                    dims.iter().map(|t| [t.0, t.1, t.2, t.3, t.4][k]).collect()
                };
                let (groups, c_per_group, k_per_group) = if depthwise {
                    (cg * g, 1, kg.min(2))
                } else {
                    (g, cg, kg)
                };
                fits.then(|| Shape {
                    n,
                    groups,
                    c_per_group,
                    k_per_group,
                    filter: pick(0),
                    pad: pick(1),
                    stride: pick(2),
                    dilation: pick(3),
                    input: pick(4),
                })
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    let epilogue = (
        alpha_beta(),
        any::<bool>(),
        prop_oneof![2 => Just(false), 1 => Just(true)],
        prop_oneof![
            2 => Just(ActivationDescriptor::identity()),
            1 => Just(ActivationDescriptor::relu()),
            1 => Just(ActivationDescriptor::silu()),
        ],
    );
    (
        shape(),
        gpu_dtype(),
        prop_oneof![3 => Just(XCORR), 1 => Just(ConvMode::Convolution)],
        epilogue,
    )
        .prop_flat_map(|(sh, dtype, mode, ((alpha, beta), bias, residual, act))| {
            let x_dims = [vec![sh.n, sh.groups * sh.c_per_group], sh.input.clone()].concat();
            (
                math_for(dtype),
                prop_oneof![Just(FilterLayout::Kcrs), Just(FilterLayout::Krsc)],
                activation_layout(x_dims, dtype),
                any::<bool>(), // y channels-last
            )
                .prop_map(move |(math, fl, x, y_last)| {
                    let conv =
                        ConvolutionDescriptor::new(&sh.pad, &sh.stride, &sh.dilation, mode, math)
                            .unwrap()
                            .with_groups(sh.groups)
                            .unwrap();
                    let w = FilterDescriptor::new(
                        dtype,
                        fl,
                        sh.groups * sh.k_per_group,
                        sh.c_per_group,
                        &sh.filter,
                    )
                    .unwrap();
                    let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
                    let layout = if y_last {
                        Layout::ChannelsLast
                    } else {
                        Layout::ChannelsFirst
                    };
                    let y =
                        TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], layout).unwrap();
                    Case {
                        dtype,
                        math,
                        conv,
                        x,
                        w,
                        y,
                        alpha,
                        beta,
                        bias,
                        residual,
                        activation: act,
                    }
                })
        })
}

/// Inputs of a case: x, w, the old y, bias and z, drawn in `[lo, hi)` (integers when
/// `integers`).
struct Inputs {
    x: HostTensor,
    w: HostTensor,
    y0: HostTensor,
    bias: Option<HostTensor>,
    z: Option<HostTensor>,
}

impl Inputs {
    fn draw(case: &Case, integers: bool, rng: &mut impl Rng) -> Self {
        let mut draw = |desc: TensorDescriptor| {
            if integers {
                HostTensor::from_fn(desc, |_| rng.gen_range(-3i32..=3) as f64)
            } else {
                random(desc, -1.0, 1.0, rng)
            }
        };
        let k = case.y.dims()[1];
        Inputs {
            x: draw(case.x),
            w: draw(*case.w.tensor()),
            y0: draw(case.y),
            bias: case
                .bias
                .then(|| draw(TensorDescriptor::packed(case.dtype, &[1, k, 1, 1]).unwrap())),
            z: case.residual.then(|| draw(case.y)),
        }
    }

    fn reference(&self, case: &Case) -> HostTensor {
        let mut y = self.y0.clone();
        reference::forward(
            &case.conv,
            case.alpha,
            &self.x,
            &self.w,
            case.beta,
            &mut y,
            self.bias.as_ref(),
            self.z.as_ref().map(|z| (0.75, z)),
            &case.activation,
        );
        y
    }
}

/// y of `case` by the direct algorithm on `h` (the reference for problems too large for
/// the f64 CPU reference), with the case's epilogue.
fn direct_on_gpu(h: &Handle, case: &Case, inputs: &Inputs) -> HostTensor {
    let xb = h.upload_tensor(&inputs.x).unwrap();
    let wb = h.upload_tensor(&inputs.w).unwrap();
    let mut yb = h.upload_tensor(&inputs.y0).unwrap();
    let bias = inputs
        .bias
        .as_ref()
        .map(|b| (b.desc, h.upload_tensor(b).unwrap()));
    let z = inputs
        .z
        .as_ref()
        .map(|z| (z.desc, h.upload_tensor(z).unwrap()));
    let epilogue = ConvEpilogue {
        activation: case.activation,
        bias: bias.as_ref().map(|(desc, data)| ConvBias { desc, data }),
        residual: z.as_ref().map(|(desc, data)| Residual {
            scale: 0.75,
            desc,
            data,
        }),
    };
    convolution_forward_with(
        h,
        case.alpha,
        &case.x,
        &xb,
        &case.w,
        &wb,
        &case.conv,
        ConvFwdAlgo::Direct,
        None,
        case.beta,
        &case.y,
        &mut yb,
        &epilogue,
    )
    .unwrap();
    h.download_tensor(&case.y, &yb).unwrap()
}

/// Runs `algo` on `h` and checks y against `want` within `tol` (gaps untouched).
fn run_and_check(
    h: &Handle,
    case: &Case,
    inputs: &Inputs,
    algo: ConvFwdAlgo,
    want: &HostTensor,
    tol: f64,
) {
    let xb = h.upload_tensor(&inputs.x).unwrap();
    let wb = h.upload_tensor(&inputs.w).unwrap();
    let mut yb = upload_poisoned(h, &inputs.y0, case.beta == 0.0);
    let bias = inputs
        .bias
        .as_ref()
        .map(|b| (b.desc, h.upload_tensor(b).unwrap()));
    let z = inputs
        .z
        .as_ref()
        .map(|z| (z.desc, h.upload_tensor(z).unwrap()));
    let ws_bytes =
        convolution_forward_workspace_size(h, &case.x, &case.w, &case.conv, &case.y, algo).unwrap();
    let mut ws = h.alloc_bytes(ws_bytes.max(1)).unwrap();
    let epilogue = ConvEpilogue {
        activation: case.activation,
        bias: bias.as_ref().map(|(desc, data)| ConvBias { desc, data }),
        residual: z.as_ref().map(|(desc, data)| Residual {
            scale: 0.75,
            desc,
            data,
        }),
    };
    convolution_forward_with(
        h,
        case.alpha,
        &case.x,
        &xb,
        &case.w,
        &wb,
        &case.conv,
        algo,
        Some(&mut ws),
        case.beta,
        &case.y,
        &mut yb,
        &epilogue,
    )
    .unwrap_or_else(|e| panic!("{algo:?} failed: {e}"));
    check(h, &case.y, &yb, want, tol, &format!("{algo:?} {case:?}"));
}

proptest! {
    #![proptest_config(gpu_cases(120))]

    /// Every algorithm the heuristic lists for a drawn problem matches the reference.
    #[test]
    fn every_accepted_algorithm_matches_the_reference(case in case(), seed in any::<u64>()) {
        with_gpu("every_accepted_algorithm_matches_the_reference", |h| {
            let inputs = Inputs::draw(&case, false, &mut rng(seed));
            let want = inputs.reference(&case);
            let algos = get_convolution_forward_algorithm(h, &case.x, &case.w, &case.conv, &case.y).unwrap();
            assert_eq!(algos.last().map(|p| p.algo), Some(ConvFwdAlgo::Direct));
            for perf in &algos {
                run_and_check(h, &case, &inputs, perf.algo, &want, case.tolerance(perf));
            }
        });
    }

    /// With small integers every algorithm that does not round its operands is exact.
    #[test]
    fn exact_algorithms_are_exact_on_integers(case in case(), seed in any::<u64>()) {
        with_gpu("exact_algorithms_are_exact_on_integers", |h| {
            let mut case = case;
            case.activation = ActivationDescriptor::relu();
            (case.alpha, case.beta) = (1.0, if case.beta != 0.0 { 1.0 } else { 0.0 });
            let inputs = Inputs::draw(&case, true, &mut rng(seed));
            let want = inputs.reference(&case);
            // Sums of products of integers in [-3, 3] stay exact in f32 (and in 16-bit
            // outputs while they are small, which the reduction length bounds here).
            let exact_output = case.dtype == DataType::F32 || case.reduction() * 9 <= 256;
            for perf in get_convolution_forward_algorithm(h, &case.x, &case.w, &case.conv, &case.y).unwrap() {
                if perf.reduced_precision || !exact_output {
                    continue;
                }
                run_and_check(h, &case, &inputs, perf.algo, &want, 0.0);
            }
        });
    }
}

#[test]
fn output_dims_follow_cudnn() {
    let x = TensorDescriptor::nchw(DataType::F32, 2, 3, 224, 224).unwrap();
    let w = FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 64, 3, &[7, 7]).unwrap();
    let conv = conv2d(3, 2, 1, MathType::Fma);
    assert_eq!(
        convolution_forward_output_dims(&conv, &x, &w).unwrap(),
        [2, 64, 112, 112]
    );
    // Dilation 2 makes a 3x3 filter span 5: (7 + 2 - 5) / 1 + 1 = 5.
    let x = TensorDescriptor::nchw(DataType::F32, 1, 4, 7, 7).unwrap();
    let w = FilterDescriptor::new(DataType::F32, FilterLayout::Krsc, 8, 2, &[3, 3]).unwrap();
    let conv = conv2d(1, 1, 2, MathType::Fma).with_groups(2).unwrap();
    assert_eq!(
        convolution_forward_output_dims(&conv, &x, &w).unwrap(),
        [1, 8, 5, 5]
    );
    // 3-D and 1-D.
    let x =
        TensorDescriptor::spatial(DataType::F32, 1, 2, &[5, 6, 7], Layout::ChannelsLast).unwrap();
    let w = FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 3, 2, &[3, 3, 3]).unwrap();
    let conv = ConvolutionDescriptor::new(&[0, 1, 2], &[1, 2, 3], &[1, 1, 1], XCORR, MathType::Fma)
        .unwrap();
    assert_eq!(
        convolution_forward_output_dims(&conv, &x, &w).unwrap(),
        [1, 3, 3, 3, 3]
    );
    let x = TensorDescriptor::packed(DataType::F32, &[1, 1, 10]).unwrap();
    let w = FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 1, 1, &[4]).unwrap();
    let conv = ConvolutionDescriptor::new(&[0], &[3], &[1], XCORR, MathType::Fma).unwrap();
    assert_eq!(
        convolution_forward_output_dims(&conv, &x, &w).unwrap(),
        [1, 1, 3]
    );
}

/// A 1-channel 3x3 image and a 2x2 filter `[[1, 2], [3, 4]]`, both modes, with a bias,
/// a residual and a relu: exact on every handle, through every accepted algorithm.
#[test]
fn hand_case_is_exact_on_every_handle() {
    for h in handles() {
        let dtypes: &[DataType] = if h.is_gpu() {
            &DataType::GPU
        } else {
            &[DataType::F64, DataType::F32]
        };
        for &dt in dtypes {
            for (mode, want) in [
                // cross-correlation: y[0,0] = 1*1 + 2*2 + 3*4 + 4*5 = 37, ...
                (XCORR, [37.0, 47.0, 67.0, 77.0]),
                // convolution: the filter reversed, [[4, 3], [2, 1]].
                (ConvMode::Convolution, [23.0, 33.0, 53.0, 63.0]),
            ] {
                let math = MathType::default_for(dt);
                let x_desc = TensorDescriptor::nchw(dt, 1, 1, 3, 3).unwrap();
                let w_desc = FilterDescriptor::new(dt, FilterLayout::Kcrs, 1, 1, &[2, 2]).unwrap();
                let conv =
                    ConvolutionDescriptor::new(&[0, 0], &[1, 1], &[1, 1], mode, math).unwrap();
                let y_desc = TensorDescriptor::nchw(dt, 1, 1, 2, 2).unwrap();
                let x = h
                    .upload_tensor(&HostTensor::from_fn(x_desc, |i| {
                        (i[2] * 3 + i[3] + 1) as f64
                    }))
                    .unwrap();
                let w = h
                    .upload_tensor(&HostTensor::from_fn(*w_desc.tensor(), |i| {
                        (i[2] * 2 + i[3] + 1) as f64
                    }))
                    .unwrap();
                let bias_desc = TensorDescriptor::packed(dt, &[1]).unwrap();
                let bias = h
                    .upload_tensor(&HostTensor::filled(bias_desc, -40.0))
                    .unwrap();
                let z = h.upload_tensor(&HostTensor::filled(y_desc, 2.0)).unwrap();
                for perf in
                    get_convolution_forward_algorithm(h, &x_desc, &w_desc, &conv, &y_desc).unwrap()
                {
                    let mut y = h.alloc(&y_desc).unwrap();
                    let ws = convolution_forward_workspace_size(
                        h, &x_desc, &w_desc, &conv, &y_desc, perf.algo,
                    )
                    .unwrap();
                    let mut ws = h.alloc_bytes(ws.max(1)).unwrap();
                    // relu(y + 0.5 * 2 - 40)
                    convolution_bias_activation_forward(
                        h,
                        1.0,
                        &x_desc,
                        &x,
                        &w_desc,
                        &w,
                        &conv,
                        perf.algo,
                        Some(&mut ws),
                        0.5,
                        Some((&y_desc, &z)),
                        &bias_desc,
                        &bias,
                        &ActivationDescriptor::relu(),
                        &y_desc,
                        &mut y,
                    )
                    .unwrap();
                    let got = h.download_tensor(&y_desc, &y).unwrap().logical();
                    let expect: Vec<f64> =
                        want.iter().map(|v| (v + 1.0 - 40.0f64).max(0.0)).collect();
                    assert_eq!(got, expect, "{:?} {dt} {mode:?} on {h:?}", perf.algo);
                }
            }
        }
    }
}

#[test]
fn find_ranks_the_accepted_algorithms_and_caches_them() {
    with_gpu("find_ranks_the_accepted_algorithms_and_caches_them", |h| {
        let dt = DataType::F16;
        let x_desc = TensorDescriptor::nhwc(dt, 2, 32, 14, 14).unwrap();
        let w_desc = FilterDescriptor::new(dt, FilterLayout::Krsc, 32, 32, &[3, 3]).unwrap();
        let conv = conv2d(1, 1, 1, MathType::TensorOp);
        let y_desc = TensorDescriptor::nhwc(dt, 2, 32, 14, 14).unwrap();
        let x = h
            .upload_tensor(&random(x_desc, -1.0, 1.0, &mut rng(1)))
            .unwrap();
        let w = h
            .upload_tensor(&random(*w_desc.tensor(), -1.0, 1.0, &mut rng(2)))
            .unwrap();
        let mut y = h.alloc(&y_desc).unwrap();
        let found = find_convolution_forward_algorithm(
            h, &x_desc, &x, &w_desc, &w, &conv, &y_desc, &mut y, None,
        )
        .unwrap();
        let listed =
            get_convolution_forward_algorithm(h, &x_desc, &w_desc, &conv, &y_desc).unwrap();
        assert_eq!(found.len(), listed.len());
        assert!(found.windows(2).all(|p| p[0].time_ms <= p[1].time_ms));
        assert!(found.iter().all(|p| p.time_ms > 0.0));
        let again = find_convolution_forward_algorithm(
            h, &x_desc, &x, &w_desc, &w, &conv, &y_desc, &mut y, None,
        )
        .unwrap();
        assert_eq!(
            found, again,
            "the second find must come from the handle's cache"
        );
    });
}

/// The error's text names the problem.
fn assert_bad(r: Result<impl std::fmt::Debug>, arg: &str, words: &str) {
    match r {
        Err(Error::BadParam { arg: a, message }) => {
            assert_eq!(a, arg, "{message}");
            assert!(message.contains(words), "`{message}` lacks `{words}`");
        }
        other => panic!("expected BadParam({arg}), got {other:?}"),
    }
}

#[test]
fn descriptors_reject_bad_values() {
    assert_bad(
        ConvolutionDescriptor::new(&[1, 1], &[1, 0], &[1, 1], XCORR, MathType::Fma),
        "stride",
        "is 0",
    );
    assert_bad(
        ConvolutionDescriptor::new(&[1, 1], &[1, 1], &[0, 1], XCORR, MathType::Fma),
        "dilation",
        "is 0",
    );
    assert_bad(
        ConvolutionDescriptor::new(&[1, 1], &[1], &[1, 1], XCORR, MathType::Fma),
        "stride",
        "1 values for 2",
    );
    assert_bad(
        ConvolutionDescriptor::new(&[], &[], &[], XCORR, MathType::Fma),
        "pad",
        "spatial dims",
    );
    assert_bad(conv2d(0, 1, 1, MathType::Fma).with_groups(0), "groups", "0");
    assert_bad(
        FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 0, 3, &[3, 3]),
        "filter",
        "0",
    );
    assert_bad(
        FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 1, 3, &[1, 1, 1, 1]),
        "spatial",
        "1 to 3",
    );
}

#[test]
fn bad_inputs_are_typed_errors_on_every_handle() {
    for h in handles() {
        let dt = DataType::F32;
        let x_desc = TensorDescriptor::nchw(dt, 2, 6, 8, 8).unwrap();
        let w_desc = FilterDescriptor::new(dt, FilterLayout::Kcrs, 4, 3, &[3, 3]).unwrap();
        let conv = conv2d(1, 1, 1, MathType::Fma).with_groups(2).unwrap();
        let y_desc = TensorDescriptor::nchw(dt, 2, 4, 8, 8).unwrap();
        let x = h.alloc(&x_desc).unwrap();
        let w = h.alloc(w_desc.tensor()).unwrap();
        let mut y = h.alloc(&y_desc).unwrap();
        let direct = ConvFwdAlgo::Direct;
        let run = |conv: &ConvolutionDescriptor,
                   x_desc: &TensorDescriptor,
                   x: &Buffer,
                   w_desc: &FilterDescriptor,
                   y_desc: &TensorDescriptor,
                   y: &mut Buffer,
                   algo| {
            convolution_forward(
                h, 1.0, x_desc, x, w_desc, &w, conv, algo, None, 0.0, y_desc, y,
            )
        };
        // The good call works.
        run(&conv, &x_desc, &x, &w_desc, &y_desc, &mut y, direct).unwrap();
        // Channels not divisible by the groups.
        let conv4 = conv2d(1, 1, 1, MathType::Fma).with_groups(4).unwrap();
        assert_bad(
            run(&conv4, &x_desc, &x, &w_desc, &y_desc, &mut y, direct),
            "groups",
            "not divisible by 4 groups",
        );
        // The filter's channels per group disagree with x's.
        let w5 = FilterDescriptor::new(dt, FilterLayout::Kcrs, 4, 5, &[3, 3]).unwrap();
        assert_bad(
            run(&conv, &x_desc, &x, &w5, &y_desc, &mut y, direct),
            "w_desc",
            "5 channels per group",
        );
        // y of the wrong size.
        let y_bad = TensorDescriptor::nchw(dt, 2, 4, 7, 8).unwrap();
        assert_bad(
            run(&conv, &x_desc, &x, &w_desc, &y_bad, &mut y, direct),
            "y_desc",
            "produces [2, 4, 8, 8]",
        );
        // Dilation making the filter larger than the padded input (3 -> 9 > 8 + 0).
        let dilated = conv2d(0, 1, 4, MathType::Fma).with_groups(2).unwrap();
        assert_bad(
            run(&dilated, &x_desc, &x, &w_desc, &y_desc, &mut y, direct),
            "dilation",
            "more than the padded input",
        );
        // Rank mismatch.
        let x3 = TensorDescriptor::packed(dt, &[2, 6, 8]).unwrap();
        assert_bad(
            run(&conv, &x3, &x, &w_desc, &y_desc, &mut y, direct),
            "x_desc",
            "rank 4",
        );
        // Short buffers.
        let short = h.alloc_bytes(x_desc.size_bytes() - 4).unwrap();
        assert!(matches!(
            run(&conv, &x_desc, &short, &w_desc, &y_desc, &mut y, direct),
            Err(Error::BufferTooSmall { .. })
        ));
        let mut short_y = h.alloc_bytes(y_desc.size_bytes() / 2).unwrap();
        assert!(matches!(
            run(&conv, &x_desc, &x, &w_desc, &y_desc, &mut short_y, direct),
            Err(Error::BufferTooSmall { .. })
        ));
        // Mixed dtypes.
        let x16 = TensorDescriptor::nchw(DataType::F16, 2, 6, 8, 8).unwrap();
        assert_bad(
            run(&conv, &x16, &x, &w_desc, &y_desc, &mut y, direct),
            "w_desc",
            "differs",
        );
        // Math that does not take the dtype.
        let tensor_op = conv2d(1, 1, 1, MathType::TensorOp).with_groups(2).unwrap();
        assert!(matches!(
            run(&tensor_op, &x_desc, &x, &w_desc, &y_desc, &mut y, direct),
            Err(Error::NotSupported { .. })
        ));
        // A forced algorithm that declines says why (a 3x3 filter is no 1x1 GEMM).
        match run(
            &conv,
            &x_desc,
            &x,
            &w_desc,
            &y_desc,
            &mut y,
            ConvFwdAlgo::Gemm1x1,
        ) {
            Err(Error::NotSupported { message }) => {
                assert!(message.contains("not 1x1"), "{message}")
            }
            other => panic!("expected NotSupported, got {other:?}"),
        }
        // A bias that is not one value per output channel.
        let bias_desc = TensorDescriptor::packed(dt, &[3]).unwrap();
        let bias = h.alloc(&bias_desc).unwrap();
        let ep = ConvEpilogue {
            bias: Some(ConvBias {
                desc: &bias_desc,
                data: &bias,
            }),
            ..Default::default()
        };
        assert_bad(
            convolution_forward_with(
                h, 1.0, &x_desc, &x, &w_desc, &w, &conv, direct, None, 0.0, &y_desc, &mut y, &ep,
            ),
            "bias",
            "one contiguous value per output channel",
        );
    }
}

/// Every algorithm that needs a workspace refuses a short one (never a silent fallback).
#[test]
fn short_workspace_is_an_error() {
    for h in handles() {
        let dt = if h.is_gpu() {
            DataType::F16
        } else {
            DataType::F32
        };
        let math = MathType::default_for(dt);
        let math = if math == MathType::Fma {
            MathType::Tf32
        } else {
            math
        };
        let x_desc = TensorDescriptor::nhwc(dt, 2, 16, 12, 12).unwrap();
        let w_desc = FilterDescriptor::new(dt, FilterLayout::Krsc, 16, 16, &[3, 3]).unwrap();
        let conv = conv2d(1, 1, 1, math);
        let y_desc = TensorDescriptor::nhwc(dt, 2, 16, 12, 12).unwrap();
        let x = h.alloc(&x_desc).unwrap();
        let w = h.alloc(w_desc.tensor()).unwrap();
        let mut y = h.alloc(&y_desc).unwrap();
        if !h.is_gpu() {
            continue; // the CPU handle needs no workspace
        }
        for algo in ConvFwdAlgo::ALL {
            let Ok(need) =
                convolution_forward_workspace_size(h, &x_desc, &w_desc, &conv, &y_desc, algo)
            else {
                continue;
            };
            if need == 0 {
                continue;
            }
            let mut ws = h.alloc_bytes(need - 1).unwrap();
            let r = convolution_forward(
                h,
                1.0,
                &x_desc,
                &x,
                &w_desc,
                &w,
                &conv,
                algo,
                Some(&mut ws),
                0.0,
                &y_desc,
                &mut y,
            );
            assert!(
                matches!(r, Err(Error::WorkspaceTooSmall { .. })),
                "{algo:?}: {r:?}"
            );
            let r = convolution_forward(
                h, 1.0, &x_desc, &x, &w_desc, &w, &conv, algo, None, 0.0, &y_desc, &mut y,
            );
            assert!(
                matches!(r, Err(Error::WorkspaceTooSmall { .. })),
                "{algo:?}: {r:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Winograd F(2x2, 3x3)
// ---------------------------------------------------------------------------------------

/// A 2-D 3x3 case for Winograd: `n x c x h x w` to `k` channels, padding `pad`, x and y
/// channels-last or not, the data type's reduced-precision math.
#[allow(clippy::too_many_arguments)]
fn winograd_case(
    dtype: DataType,
    [n, c, h, w, k]: [usize; 5],
    pad: usize,
    mode: ConvMode,
    x_last: bool,
    y_last: bool,
    filter: FilterLayout,
) -> Case {
    let math = if dtype == DataType::F32 {
        MathType::Tf32
    } else {
        MathType::TensorOp
    };
    let layout = |last: bool| {
        if last {
            Layout::ChannelsLast
        } else {
            Layout::ChannelsFirst
        }
    };
    let conv = ConvolutionDescriptor::new(&[pad; 2], &[1; 2], &[1; 2], mode, math).unwrap();
    let x = TensorDescriptor::spatial(dtype, n, c, &[h, w], layout(x_last)).unwrap();
    let wd = FilterDescriptor::new(dtype, filter, k, c, &[3, 3]).unwrap();
    let yd = convolution_forward_output_dims(&conv, &x, &wd).unwrap();
    let y = TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], layout(y_last)).unwrap();
    Case {
        dtype,
        math,
        conv,
        x,
        w: wd,
        y,
        alpha: 1.0,
        beta: 0.0,
        bias: false,
        residual: false,
        activation: ActivationDescriptor::identity(),
    }
}

/// Runs Winograd on `case` (no epilogue) against the reference with the
/// reduced-precision tolerance (and untouched gaps); returns the relative error.
fn check_winograd(h: &Handle, case: &Case, seed: u64) -> f64 {
    let algo = ConvFwdAlgo::Winograd;
    let perf = get_convolution_forward_algorithm(h, &case.x, &case.w, &case.conv, &case.y)
        .unwrap()
        .into_iter()
        .find(|p| p.algo == algo)
        .unwrap_or_else(|| panic!("Winograd declines {case:?}"));
    assert!(perf.reduced_precision && perf.workspace_bytes > 0);
    let inputs = Inputs::draw(case, false, &mut rng(seed));
    let want = inputs.reference(case);
    run_and_check(h, case, &inputs, algo, &want, case.tolerance(&perf));
    // Once more for the error's value (run_and_check only asserts its bound).
    let xb = h.upload_tensor(&inputs.x).unwrap();
    let wb = h.upload_tensor(&inputs.w).unwrap();
    let mut yb = h.alloc(&case.y).unwrap();
    let mut ws = h.alloc_bytes(perf.workspace_bytes).unwrap();
    convolution_forward(
        h,
        case.alpha,
        &case.x,
        &xb,
        &case.w,
        &wb,
        &case.conv,
        algo,
        Some(&mut ws),
        0.0,
        &case.y,
        &mut yb,
    )
    .unwrap();
    let got = h.download_tensor(&case.y, &yb).unwrap();
    rel_error(&got, &want)
}

/// Odd and tiny images (partial edge tiles, tiles wholly in the padding), paddings 0 to
/// 3, both layouts of x and y (mixed too), both filter layouts and modes, every dtype.
#[test]
fn winograd_matches_the_reference_on_edge_shapes() {
    with_gpu("winograd_matches_the_reference_on_edge_shapes", |h| {
        let mut seed = 1;
        for dtype in DataType::GPU {
            let mut worst: f64 = 0.0;
            for (hw, pad_min) in [([1, 1], 1), ([3, 3], 0), ([5, 7], 0), ([2, 9], 1)] {
                for pad in pad_min..=3 {
                    let layouts = [(false, false), (true, true), (true, false)];
                    // Odd channel counts, and even ones (channel-pair transforms).
                    for ((x_last, y_last), (c, k)) in
                        layouts.into_iter().flat_map(|l| [(l, (3, 5)), (l, (4, 6))])
                    {
                        let (mode, fl) = if seed % 2 == 0 {
                            (XCORR, FilterLayout::Kcrs)
                        } else {
                            (ConvMode::Convolution, FilterLayout::Krsc)
                        };
                        let case = winograd_case(
                            dtype,
                            [2, c, hw[0], hw[1], k],
                            pad,
                            mode,
                            x_last,
                            y_last,
                            fl,
                        );
                        worst = worst.max(check_winograd(h, &case, seed));
                        seed += 1;
                    }
                }
            }
            eprintln!("winograd edge shapes {dtype}: worst rel error {worst:.2e}");
        }
    });
}

/// The fused epilogue (alpha, beta, bias, residual, activation) on odd shapes, and
/// channel counts that are not multiples of the matmul's 8-element rows.
#[test]
fn winograd_fuses_the_epilogue() {
    with_gpu("winograd_fuses_the_epilogue", |h| {
        for dtype in DataType::GPU {
            for (i, (shape, last)) in [
                ([3, 17, 9, 11, 13], true),
                ([1, 9, 6, 5, 31], false),
                ([2, 8, 7, 9, 10], true),
            ]
            .into_iter()
            .enumerate()
            {
                let mut case =
                    winograd_case(dtype, shape, 1, XCORR, last, last, FilterLayout::Krsc);
                (case.alpha, case.beta) = (-1.5, 0.25);
                (case.bias, case.residual) = (true, true);
                case.activation = ActivationDescriptor::silu();
                let inputs = Inputs::draw(&case, false, &mut rng(40 + i as u64));
                let want = inputs.reference(&case);
                let perf = ConvFwdAlgoPerf {
                    algo: ConvFwdAlgo::Winograd,
                    time_ms: f32::NAN,
                    workspace_bytes: 0,
                    deterministic: true,
                    reduced_precision: true,
                };
                run_and_check(
                    h,
                    &case,
                    &inputs,
                    ConvFwdAlgo::Winograd,
                    &want,
                    case.tolerance(&perf),
                );
            }
        }
    });
}

/// A ResNet-like layer (256 channels: a long reduction) stays within a few times the
/// direct algorithms' error.
#[test]
fn winograd_is_accurate_on_a_deep_reduction() {
    with_gpu("winograd_is_accurate_on_a_deep_reduction", |h| {
        for dtype in DataType::GPU {
            for last in [true, false] {
                let case = winograd_case(
                    dtype,
                    [2, 256, 14, 14, 64],
                    1,
                    XCORR,
                    last,
                    last,
                    FilterLayout::Krsc,
                );
                let err = check_winograd(h, &case, 7);
                eprintln!("winograd {dtype} c=256 14x14 channels-last={last}: rel error {err:.2e}");
            }
        }
    });
}

/// Winograd's decline reasons: exact math, and every shape it does not transform.
#[test]
fn winograd_declines_exact_math_and_other_shapes() {
    for h in handles() {
        let declines = |dtype: DataType,
                        spatial: &[usize],
                        filter: &[usize],
                        conv: ConvolutionDescriptor,
                        words: &str| {
            let x = TensorDescriptor::spatial(dtype, 2, 4, spatial, Layout::ChannelsLast).unwrap();
            let w = FilterDescriptor::new(dtype, FilterLayout::Krsc, 4, 4 / conv.groups(), filter)
                .unwrap();
            let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
            let y = TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], Layout::ChannelsLast)
                .unwrap();
            let r = convolution_forward_workspace_size(h, &x, &w, &conv, &y, ConvFwdAlgo::Winograd);
            match r {
                Err(Error::NotSupported { message }) => {
                    assert!(message.contains(words), "`{message}` lacks `{words}`")
                }
                other => panic!("expected Winograd to decline ({words}), got {other:?}"),
            }
            let listed = get_convolution_forward_algorithm(h, &x, &w, &conv, &y).unwrap();
            assert!(listed.iter().all(|p| p.algo != ConvFwdAlgo::Winograd));
        };
        let f32_ = DataType::F32;
        let tf32 = |pad, stride, dil| conv2d(pad, stride, dil, MathType::Tf32);
        declines(
            f32_,
            &[8, 8],
            &[3, 3],
            conv2d(1, 1, 1, MathType::Fma),
            "exact math",
        );
        if h.is_gpu() {
            declines(
                DataType::F16,
                &[8, 8],
                &[3, 3],
                conv2d(1, 1, 1, MathType::Fma),
                "exact math",
            );
        }
        declines(f32_, &[8, 8], &[3, 3], tf32(1, 2, 1), "stride");
        declines(f32_, &[8, 8], &[3, 3], tf32(2, 1, 2), "dilated");
        declines(f32_, &[8, 8], &[5, 5], tf32(1, 1, 1), "not 3x3");
        declines(f32_, &[8, 8], &[3, 1], tf32(1, 1, 1), "not 3x3");
        declines(
            f32_,
            &[8, 8],
            &[3, 3],
            tf32(1, 1, 1).with_groups(2).unwrap(),
            "grouped",
        );
        let conv3d =
            ConvolutionDescriptor::new(&[0, 1, 1], &[1; 3], &[1; 3], XCORR, MathType::Tf32)
                .unwrap();
        declines(f32_, &[4, 8, 8], &[1, 3, 3], conv3d, "2-D");
        let conv1d = ConvolutionDescriptor::new(&[1], &[1], &[1], XCORR, MathType::Tf32).unwrap();
        declines(f32_, &[8], &[3], conv1d, "2-D");
        // The accepted problem reports its workspace: V and U (16 x 8 tiles x 8 channels
        // and 16 x 4 x 8, f32, each 256-aligned) and M (16 x 8 x 8 f32).
        let x = TensorDescriptor::nhwc(f32_, 2, 4, 4, 4).unwrap();
        let w = FilterDescriptor::new(f32_, FilterLayout::Krsc, 4, 4, &[3, 3]).unwrap();
        let y = TensorDescriptor::nhwc(f32_, 2, 4, 4, 4).unwrap();
        let ws = convolution_forward_workspace_size(
            h,
            &x,
            &w,
            &tf32(1, 1, 1),
            &y,
            ConvFwdAlgo::Winograd,
        )
        .unwrap();
        assert_eq!(ws, 16 * 8 * 8 * 4 + 16 * 4 * 8 * 4 + 16 * 8 * 8 * 4);
    }
}

/// Timings (not a check): every accepted algorithm on ResNet-50's 3x3 stride-1 layers at
/// N=32 (tf32 NHWC and NCHW, f16 NHWC), by find, with effective TFLOPS
/// (`2 N K P Q C 9 / time`), and the batched matmul inside Winograd alone. Run with
/// `--ignored --nocapture winograd_timing`.
#[test]
#[ignore]
fn winograd_timing_resnet50() {
    with_gpu("winograd_timing_resnet50", |h| {
        let configs = [
            (DataType::F32, MathType::Tf32, true),
            (DataType::F32, MathType::Tf32, false),
            (DataType::F16, MathType::TensorOp, true),
        ];
        for (dt, math, last) in configs {
            for (c, hw) in [(64, 56), (128, 28), (256, 14), (512, 7)] {
                let n = 32;
                let name = format!("{dt}-{}-{c}", if last { "nhwc" } else { "nchw" });
                if std::env::var("WINOGRAD_TIMING_ONLY").is_ok_and(|only| only != name) {
                    continue;
                }
                let layout = if last {
                    Layout::ChannelsLast
                } else {
                    Layout::ChannelsFirst
                };
                let fl = if last {
                    FilterLayout::Krsc
                } else {
                    FilterLayout::Kcrs
                };
                let x_desc = TensorDescriptor::spatial(dt, n, c, &[hw, hw], layout).unwrap();
                let w_desc = FilterDescriptor::new(dt, fl, c, c, &[3, 3]).unwrap();
                let conv = conv2d(1, 1, 1, math);
                let y_desc = TensorDescriptor::spatial(dt, n, c, &[hw, hw], layout).unwrap();
                let x = h
                    .upload_tensor(&random(x_desc, -1.0, 1.0, &mut rng(1)))
                    .unwrap();
                let w = h
                    .upload_tensor(&random(*w_desc.tensor(), -1.0, 1.0, &mut rng(2)))
                    .unwrap();
                let mut y = h.alloc(&y_desc).unwrap();
                let found = find_convolution_forward_algorithm(
                    h, &x_desc, &x, &w_desc, &w, &conv, &y_desc, &mut y, None,
                )
                .unwrap();
                let flops = 2.0 * (n * c * hw * hw * c * 9) as f64;
                let row: Vec<String> = found
                    .iter()
                    .map(|p| {
                        format!(
                            "{:?} {:.3} ms {:.1} TFLOPS",
                            p.algo,
                            p.time_ms,
                            flops / (p.time_ms as f64 * 1e-3) / 1e12
                        )
                    })
                    .collect();
                // The batched matmul alone: 16 x [tiles, C] x [C, K].
                let tiles = n * hw.div_ceil(2) * hw.div_ceil(2);
                let a_desc = TensorDescriptor::packed(dt, &[16, tiles, c]).unwrap();
                let b_desc = TensorDescriptor::new(dt, &[16, c, c], &[c * c, 1, c]).unwrap();
                let m_type = DataType::F32;
                let c_desc = TensorDescriptor::packed(m_type, &[16, tiles, c]).unwrap();
                let a = h.alloc(&a_desc).unwrap();
                let b = h.alloc(&b_desc).unwrap();
                let mut m = h.alloc(&c_desc).unwrap();
                let mm = find_matmul_algorithm(
                    h,
                    &MatmulDescriptor::new(math),
                    1.0,
                    &a_desc,
                    &a,
                    &b_desc,
                    &b,
                    0.0,
                    &c_desc,
                    &mut m,
                    &MatmulEpilogue::default(),
                    5,
                )
                .unwrap();
                let mm: Vec<String> = mm
                    .iter()
                    .map(|p| format!("{:?} {:.3}", p.algo, p.time_ms))
                    .collect();
                eprintln!(
                    "{name} {hw}x{hw} N={n}: {} | matmul 16x[{tiles}x{c}]x[{c}x{c}] ms: {}",
                    row.join(", "),
                    mm.join(", "),
                );
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// ImplicitGemm (exact f32 on CUDA cores) and Depthwise
// ---------------------------------------------------------------------------------------

/// A 2-D case with the given geometry and layouts (no epilogue beyond alpha/beta).
#[allow(clippy::too_many_arguments)]
fn case2d(
    dtype: DataType,
    math: MathType,
    (n, c, k, hw): (usize, usize, usize, [usize; 2]),
    (filter, pad, stride, dilation, groups): (usize, usize, usize, usize, usize),
    layout: Layout,
    mode: ConvMode,
) -> Case {
    let conv = ConvolutionDescriptor::new(&[pad; 2], &[stride; 2], &[dilation; 2], mode, math)
        .unwrap()
        .with_groups(groups)
        .unwrap();
    let fl = match layout {
        Layout::ChannelsLast => FilterLayout::Krsc,
        _ => FilterLayout::Kcrs,
    };
    let x = TensorDescriptor::spatial(dtype, n, c, &hw, layout).unwrap();
    let w = FilterDescriptor::new(dtype, fl, k, c / groups, &[filter; 2]).unwrap();
    let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
    let y = TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], layout).unwrap();
    Case {
        dtype,
        math,
        conv,
        x,
        w,
        y,
        alpha: 1.0,
        beta: 0.0,
        bias: false,
        residual: false,
        activation: ActivationDescriptor::identity(),
    }
}

/// Runs `algo` on `case` (exactly, on integers, when `exact`) with a bias, a residual and
/// relu, and checks it against the reference.
fn check_forced(h: &Handle, mut case: Case, algo: ConvFwdAlgo, exact: bool, seed: u64) {
    case.bias = true;
    case.residual = true;
    case.activation = ActivationDescriptor::relu();
    case.beta = 1.0;
    let inputs = Inputs::draw(&case, exact, &mut rng(seed));
    let want = inputs.reference(&case);
    let perf = ConvFwdAlgoPerf {
        algo,
        time_ms: 0.0,
        workspace_bytes: 0,
        deterministic: true,
        reduced_precision: false,
    };
    let tol = if exact { 0.0 } else { case.tolerance(&perf) };
    run_and_check(h, &case, &inputs, algo, &want, tol);
}

#[test]
fn implicit_gemm_is_exact_on_resnet_like_layers() {
    with_gpu("implicit_gemm_is_exact_on_resnet_like_layers", |h| {
        let f32 = DataType::F32;
        for (i, layout) in [Layout::ChannelsFirst, Layout::ChannelsLast]
            .into_iter()
            .enumerate()
        {
            for (j, (dims, geo)) in [
                ((2, 64, 64, [14, 14]), (3, 1, 1, 1, 1)),
                ((3, 48, 80, [9, 11]), (3, 1, 2, 1, 1)),
                ((2, 256, 64, [7, 7]), (1, 0, 1, 1, 1)),
                ((1, 3, 64, [23, 23]), (7, 3, 2, 1, 1)),
                ((2, 32, 96, [10, 10]), (3, 2, 1, 2, 4)),
                ((2, 24, 24, [9, 9]), (3, 1, 1, 1, 24)),
                ((1, 130, 129, [5, 6]), (2, 4, 3, 1, 1)),
            ]
            .into_iter()
            .enumerate()
            {
                for mode in [XCORR, ConvMode::Convolution] {
                    let case = case2d(f32, MathType::Fma, dims, geo, layout, mode);
                    check_forced(
                        h,
                        case,
                        ConvFwdAlgo::ImplicitGemm,
                        true,
                        (10 * i + j) as u64,
                    );
                }
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// ImplicitGemm split-K
// ---------------------------------------------------------------------------------------

/// Problems whose output tiles alone would leave most of an H100's 132 SMs idle (one or
/// two images, small outputs, long K), so that the exact-f32 implicit GEMM splits K.
fn split_k_cases() -> Vec<Case> {
    let first = Layout::ChannelsFirst;
    [
        // K = 131 * 9 = 1179: partitions of whole K tiles that do not divide it.
        ((1, 131, 64, [7, 7]), (3, 1, 1, 1, 1), first, XCORR),
        // res5b_branch2a at N = 1: a 1x1 over 2048 channels.
        ((1, 2048, 512, [7, 7]), (1, 0, 1, 1, 1), first, XCORR),
        // Channels-last (`pk` kernels: pixels as the GEMM's rows).
        (
            (2, 256, 96, [5, 6]),
            (3, 1, 1, 1, 1),
            Layout::ChannelsLast,
            XCORR,
        ),
        // Two groups, each with its own partitions.
        ((1, 128, 64, [7, 7]), (3, 1, 1, 1, 2), first, XCORR),
        // Convolution mode, stride, dilation, padding.
        (
            (1, 200, 70, [9, 9]),
            (3, 2, 2, 2, 1),
            first,
            ConvMode::Convolution,
        ),
    ]
    .into_iter()
    .map(|(dims, geo, layout, mode)| case2d(DataType::F32, MathType::Fma, dims, geo, layout, mode))
    .collect()
}

fn implicit_gemm_workspace(h: &Handle, case: &Case) -> usize {
    convolution_forward_workspace_size(
        h,
        &case.x,
        &case.w,
        &case.conv,
        &case.y,
        ConvFwdAlgo::ImplicitGemm,
    )
    .unwrap()
}

/// `y = conv(x, w)` on [`ConvFwdAlgo::ImplicitGemm`] with workspace `ws`.
fn implicit_gemm_forward(
    h: &Handle,
    case: &Case,
    (x, w): (&Buffer, &Buffer),
    ws: Option<&mut Buffer>,
    y: &mut Buffer,
) -> Result<()> {
    convolution_forward(
        h,
        1.0,
        &case.x,
        x,
        &case.w,
        w,
        &case.conv,
        ConvFwdAlgo::ImplicitGemm,
        ws,
        0.0,
        &case.y,
        y,
    )
}

/// The exact-f32 implicit GEMM asks for a workspace (split-K) exactly where its tile grid
/// is small: ResNet-50's res5a_branch2b at N = 32 (1568 pixels x 512 channels, K = 4608)
/// but not res2a_branch2b (100352 pixels); `get` reports the workspace and determinism.
#[test]
fn implicit_gemm_splits_k_only_where_the_tiles_leave_sms_idle() {
    for h in handles() {
        let res = |c: usize, k: usize, hw: usize| {
            case2d(
                DataType::F32,
                MathType::Fma,
                (32, c, k, [hw, hw]),
                (3, 1, 1, 1, 1),
                Layout::ChannelsFirst,
                XCORR,
            )
        };
        let (small, large) = (res(512, 512, 7), res(64, 64, 56));
        let need = implicit_gemm_workspace(h, &small);
        // Partitions of f32 partial sums over the whole output, at least two.
        let out = small.y.dims().iter().product::<usize>() * 4;
        assert!(
            need >= 2 * out && need.is_multiple_of(out),
            "{need} vs {out}"
        );
        assert_eq!(implicit_gemm_workspace(h, &large), 0);
        let perf = get_convolution_forward_algorithm(h, &small.x, &small.w, &small.conv, &small.y)
            .unwrap()
            .into_iter()
            .find(|p| p.algo == ConvFwdAlgo::ImplicitGemm)
            .unwrap();
        assert_eq!(perf.workspace_bytes, need);
        assert!(perf.deterministic && !perf.reduced_precision);
    }
}

/// Under split-K the result is still exact on integers, and beta, the bias, the residual
/// and relu are applied once (by the reduction), not once per partition.
#[test]
fn implicit_gemm_split_k_is_exact_and_applies_the_epilogue_once() {
    with_gpu(
        "implicit_gemm_split_k_is_exact_and_applies_the_epilogue_once",
        |h| {
            for (i, case) in split_k_cases().into_iter().enumerate() {
                assert!(
                    implicit_gemm_workspace(h, &case) > 0,
                    "case {i} does not split K"
                );
                check_forced(h, case, ConvFwdAlgo::ImplicitGemm, true, 50 + i as u64);
            }
        },
    );
}

/// Split-K adds its partitions in a fixed order: two runs on the same (non-integer) data
/// are bitwise equal, and within f32 rounding of the reference.
#[test]
fn implicit_gemm_split_k_is_deterministic() {
    with_gpu("implicit_gemm_split_k_is_deterministic", |h| {
        for (i, case) in split_k_cases().into_iter().enumerate() {
            let inputs = Inputs::draw(&case, false, &mut rng(70 + i as u64));
            let want = inputs.reference(&case);
            let (x, w) = (
                h.upload_tensor(&inputs.x).unwrap(),
                h.upload_tensor(&inputs.w).unwrap(),
            );
            let mut ws = h.alloc_bytes(implicit_gemm_workspace(h, &case)).unwrap();
            let mut run = || {
                let mut y = upload_poisoned(h, &inputs.y0, true);
                implicit_gemm_forward(h, &case, (&x, &w), Some(&mut ws), &mut y).unwrap();
                y
            };
            let (first, second) = (run(), run());
            let perf = ConvFwdAlgoPerf {
                algo: ConvFwdAlgo::ImplicitGemm,
                time_ms: 0.0,
                workspace_bytes: 0,
                deterministic: true,
                reduced_precision: false,
            };
            check(
                h,
                &case.y,
                &first,
                &want,
                case.tolerance(&perf),
                &format!("case {i}"),
            );
            assert_eq!(
                h.read_bytes(&first).unwrap(),
                h.read_bytes(&second).unwrap(),
                "case {i}: two runs differ"
            );
        }
    });
}

/// A split-K plan refuses a workspace one byte short, or none.
#[test]
fn implicit_gemm_split_k_refuses_a_short_workspace() {
    with_gpu("implicit_gemm_split_k_refuses_a_short_workspace", |h| {
        let case = &split_k_cases()[0];
        let need = implicit_gemm_workspace(h, case);
        let (x, w) = (h.alloc(&case.x).unwrap(), h.alloc(case.w.tensor()).unwrap());
        let mut y = h.alloc(&case.y).unwrap();
        let mut short = h.alloc_bytes(need - 1).unwrap();
        for ws in [Some(&mut short), None] {
            let r = implicit_gemm_forward(h, case, (&x, &w), ws, &mut y);
            assert!(
                matches!(r, Err(Error::WorkspaceTooSmall { required_bytes, .. }) if required_bytes == need),
                "{r:?}"
            );
        }
    });
}

/// `OXIDNN_CONV_IGEMM_FMA=a<tile>[s<splits>]` forces each `cp.async` tile of the
/// exact-f32 implicit GEMM (run alone: the variable is process-wide;
/// `cargo test --release --test convolution -- --ignored --test-threads=1 forced_async`):
/// exact on integers against the reference on awkward shapes (extents of 1, primes, odd
/// sizes, padding >= filter, strides, dilation, groups, both modes, tap-table and
/// pointwise kernels, several row and pixel tiles, split-K), with beta = 0 into a poisoned
/// y and beta = 1 with a residual, bias and relu; a forced tile the core cannot take
/// (channels-last x) is an error naming the variable.
#[test]
#[ignore]
fn implicit_gemm_forced_async_tiles_are_exact() {
    let Some(h) = gpu() else {
        return;
    };
    const VAR: &str = "OXIDNN_CONV_IGEMM_FMA";
    let first = Layout::ChannelsFirst;
    let shapes = [
        ((1, 1, 1, [1, 1]), (1, 0, 1, 1, 1)),
        ((2, 3, 5, [7, 11]), (3, 1, 1, 1, 1)),
        ((3, 13, 7, [5, 9]), (3, 4, 1, 1, 1)),
        ((2, 17, 31, [13, 13]), (1, 0, 2, 1, 1)),
        ((1, 5, 67, [9, 10]), (5, 2, 2, 2, 1)),
        ((2, 12, 18, [8, 7]), (3, 1, 1, 1, 3)),
        ((1, 3, 64, [23, 23]), (7, 3, 2, 1, 1)),
        ((2, 130, 129, [6, 5]), (1, 1, 1, 1, 1)),
        ((1, 67, 131, [11, 13]), (1, 0, 1, 1, 1)),
        ((1, 37, 70, [5, 5]), (3, 1, 1, 1, 1)),
    ];
    let mut seed = 400;
    for tile in ["128x128", "128x64", "64x128", "64x64"] {
        for splits in ["", "s3"] {
            std::env::set_var(VAR, format!("a{tile}{splits}"));
            for (dims, geo) in shapes {
                for mode in [XCORR, ConvMode::Convolution] {
                    seed += 1;
                    let mut case = case2d(DataType::F32, MathType::Fma, dims, geo, first, mode);
                    case.bias = true;
                    case.activation = ActivationDescriptor::relu();
                    if seed % 2 == 0 {
                        // beta = 1, a residual: y is read; else y starts poisoned.
                        case.residual = true;
                        case.beta = 1.0;
                    }
                    let inputs = Inputs::draw(&case, true, &mut rng(seed));
                    let want = inputs.reference(&case);
                    run_and_check(h, &case, &inputs, ConvFwdAlgo::ImplicitGemm, &want, 0.0);
                }
            }
        }
        // Channels-last x: the cp.async kernels decline, and a forced tile says so.
        std::env::set_var(VAR, format!("a{tile}"));
        let case = case2d(
            DataType::F32,
            MathType::Fma,
            (1, 8, 8, [5, 5]),
            (3, 1, 1, 1, 1),
            Layout::ChannelsLast,
            XCORR,
        );
        let (x, w) = (h.alloc(&case.x).unwrap(), h.alloc(case.w.tensor()).unwrap());
        let mut y = h.alloc(&case.y).unwrap();
        let e = implicit_gemm_forward(h, &case, (&x, &w), None, &mut y).unwrap_err();
        assert!(e.to_string().contains(VAR), "{tile}: {e}");
    }
    std::env::remove_var(VAR);
}

/// Tuning aid for the exact-f32 implicit GEMM's plan (run alone: it sets
/// `OXIDNN_CONV_IGEMM_FMA`, a process-wide variable): every ResNet-50 layer (f32 NCHW,
/// N = 32) under the heuristic's plan and under each forced tile and split of both cores, timed on the
/// host clock around 10 queued calls. Lines `PLAN layer plan µs`, then per layer `BEST`.
#[test]
#[ignore]
fn time_implicit_gemm_plans() {
    let Some(h) = gpu() else {
        return;
    };
    const VAR: &str = "OXIDNN_CONV_IGEMM_FMA";
    // (name, C, H = W, K, filter, stride, pad) of benches/shapes/resnet50.txt.
    let layers = [
        ("conv1", 3, 224, 64, 7, 2, 3),
        ("res2a_branch1", 64, 56, 256, 1, 1, 0),
        ("res2a_branch2a", 64, 56, 64, 1, 1, 0),
        ("res2a_branch2b", 64, 56, 64, 3, 1, 1),
        ("res2b_branch2a", 256, 56, 64, 1, 1, 0),
        ("res3a_branch1", 256, 56, 512, 1, 2, 0),
        ("res3a_branch2a", 256, 56, 128, 1, 2, 0),
        ("res3a_branch2b", 128, 28, 128, 3, 1, 1),
        ("res3a_branch2c", 128, 28, 512, 1, 1, 0),
        ("res3b_branch2a", 512, 28, 128, 1, 1, 0),
        ("res4a_branch1", 512, 28, 1024, 1, 2, 0),
        ("res4a_branch2a", 512, 28, 256, 1, 2, 0),
        ("res4a_branch2b", 256, 14, 256, 3, 1, 1),
        ("res4a_branch2c", 256, 14, 1024, 1, 1, 0),
        ("res4b_branch2a", 1024, 14, 256, 1, 1, 0),
        ("res5a_branch1", 1024, 14, 2048, 1, 2, 0),
        ("res5a_branch2a", 1024, 14, 512, 1, 2, 0),
        ("res5a_branch2b", 512, 7, 512, 3, 1, 1),
        ("res5a_branch2c", 512, 7, 2048, 1, 1, 0),
        ("res5b_branch2a", 2048, 7, 512, 1, 1, 0),
        ("res3a_branch2a_v1.5", 256, 56, 128, 1, 1, 0),
        ("res3a_branch2b_v1.5", 128, 56, 128, 3, 2, 1),
        ("res4a_branch2a_v1.5", 512, 28, 256, 1, 1, 0),
        ("res4a_branch2b_v1.5", 256, 28, 256, 3, 2, 1),
        ("res5a_branch2a_v1.5", 1024, 14, 512, 1, 1, 0),
        ("res5a_branch2b_v1.5", 512, 14, 512, 3, 2, 1),
    ];
    // The cp.async core's tiles (`a`) at every split count, the gather core's at a few.
    let mut forced = vec![];
    for tile in ["128x128", "64x128", "128x64", "64x64"] {
        for splits in [1, 2, 3, 4, 6, 8, 12, 16] {
            forced.push(format!("a{tile}s{splits}"));
        }
        for splits in [1, 2, 4, 8] {
            forced.push(format!("{tile}s{splits}"));
        }
    }
    let mut r = rng(11);
    for (name, c, hw, k, f, stride, pad) in layers {
        let case = case2d(
            DataType::F32,
            MathType::Fma,
            (32, c, k, [hw, hw]),
            (f, pad, stride, 1, 1),
            Layout::ChannelsFirst,
            XCORR,
        );
        let x = h.upload_tensor(&random(case.x, -1.0, 1.0, &mut r)).unwrap();
        let w = h
            .upload_tensor(&random(*case.w.tensor(), -1.0, 1.0, &mut r))
            .unwrap();
        let mut y = h.alloc(&case.y).unwrap();
        let mut time = |plan: Option<&str>| -> Option<f64> {
            match plan {
                Some(v) => std::env::set_var(VAR, v),
                None => std::env::remove_var(VAR),
            }
            let need = implicit_gemm_workspace(h, &case);
            if need > 1 << 29 {
                return None;
            }
            let mut ws = h.alloc_bytes(need.max(1)).unwrap();
            let mut call =
                || implicit_gemm_forward(h, &case, (&x, &w), Some(&mut ws), &mut y).unwrap();
            call();
            call();
            h.synchronize().unwrap();
            let start = std::time::Instant::now();
            for _ in 0..10 {
                call();
            }
            h.synchronize().unwrap();
            Some(start.elapsed().as_secs_f64() / 10.0 * 1e6)
        };
        let default = time(None).unwrap_or(f64::NAN);
        println!("PLAN {name} heuristic {default:.1}");
        let mut best = ("heuristic".to_string(), default);
        for plan in &forced {
            if let Some(us) = time(Some(plan)) {
                println!("PLAN {name} {plan} {us:.1}");
                if us < best.1 {
                    best = (plan.clone(), us);
                }
            }
        }
        std::env::remove_var(VAR);
        println!(
            "BEST {name} heuristic {default:.1} best {} {:.1}",
            best.0, best.1
        );
    }
}

#[test]
fn depthwise_matches_the_reference_on_mobilenet_like_layers() {
    with_gpu(
        "depthwise_matches_the_reference_on_mobilenet_like_layers",
        |h| {
            for dt in [DataType::F32, DataType::F16, DataType::BF16] {
                for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                    for (seed, (dims, geo)) in [
                        ((2, 32, 32, [17, 17]), (3, 1, 1, 1, 32)),
                        ((2, 64, 64, [18, 19]), (3, 1, 2, 1, 64)),
                        ((3, 40, 40, [7, 7]), (5, 2, 1, 1, 40)),
                        ((1, 24, 24, [11, 13]), (5, 2, 2, 1, 24)),
                        ((2, 16, 32, [9, 9]), (3, 1, 1, 1, 16)), // multiplier 2
                        ((2, 12, 12, [10, 10]), (3, 2, 1, 2, 12)), // dilation 2
                        ((1, 8, 8, [6, 6]), (7, 4, 3, 1, 8)),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        let math = MathType::Fma;
                        let case = case2d(dt, math, dims, geo, layout, XCORR);
                        let exact = dt == DataType::F32;
                        check_forced(h, case, ConvFwdAlgo::Depthwise, exact, seed as u64);
                        let case = case2d(dt, math, dims, geo, layout, ConvMode::Convolution);
                        check_forced(h, case, ConvFwdAlgo::Depthwise, exact, seed as u64 + 100);
                    }
                }
            }
        },
    );
}

/// A 2-D depthwise case (multiplier 1, KRSC filter, NHWC tensors) with per-dim padding,
/// stride and dilation `[h, w]`.
fn depthwise_nhwc(
    dtype: DataType,
    (n, c, hw): (usize, usize, [usize; 2]),
    (pad, stride, dilation): ([usize; 2], [usize; 2], [usize; 2]),
    mode: ConvMode,
) -> Case {
    let conv = ConvolutionDescriptor::new(&pad, &stride, &dilation, mode, MathType::Fma)
        .unwrap()
        .with_groups(c)
        .unwrap();
    let x = TensorDescriptor::spatial(dtype, n, c, &hw, Layout::ChannelsLast).unwrap();
    let w = FilterDescriptor::new(dtype, FilterLayout::Krsc, c, 1, &[3, 3]).unwrap();
    let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
    let y = TensorDescriptor::spatial(dtype, yd[0], yd[1], &yd[2..], Layout::ChannelsLast).unwrap();
    Case {
        dtype,
        math: MathType::Fma,
        conv,
        x,
        w,
        y,
        alpha: 1.0,
        beta: 0.0,
        bias: false,
        residual: false,
        activation: ActivationDescriptor::identity(),
    }
}

/// The channels-last 3x3 depthwise path (for f16 and bf16 the `strip` kernels: seven
/// output pixels of one 16-byte channel vector per thread, stride 1 or 2 along w, where
/// `tile3` declines (stride or dilation 2 along h, outputs narrower than 7), `tile3` on
/// the other stride-1 shapes; f32 and wide stride-2 outputs take the `vec` kernel) on the shapes at its edges: widths below,
/// at and past one strip and not multiples of it, padding 0 to 3 (pad 3 leaves outputs
/// whose every tap is padding), stride and dilation along h that differ from w's, more
/// than one warp of channel vectors, a stride-2 output wider than two strips, and channel
/// counts that are not a multiple of the 16-byte vector (f16/bf16 then take the `rows`
/// kernel: the answer must not change), each with bias, residual, beta and relu, in both
/// modes.
#[test]
fn depthwise_channels_last_3x3_matches_the_reference_at_strip_edges() {
    with_gpu(
        "depthwise_channels_last_3x3_matches_the_reference_at_strip_edges",
        |h| {
            for dt in [DataType::F32, DataType::F16, DataType::BF16] {
                for (seed, (dims, geo)) in [
                    ((2, 8, [5, 5]), ([1, 1], [1, 1], [1, 1])),
                    ((2, 16, [9, 15]), ([1, 1], [1, 1], [1, 1])),
                    ((1, 24, [8, 13]), ([1, 1], [2, 2], [1, 1])),
                    ((3, 40, [7, 20]), ([0, 0], [1, 2], [1, 1])),
                    ((2, 8, [6, 6]), ([2, 3], [1, 1], [1, 1])),
                    ((2, 32, [11, 17]), ([1, 1], [2, 2], [2, 1])),
                    ((1, 264, [4, 9]), ([1, 1], [1, 1], [1, 1])),
                    ((2, 12, [7, 14]), ([1, 1], [1, 2], [1, 1])),
                    ((1, 20, [3, 29]), ([1, 2], [1, 1], [1, 1])),
                    ((1, 16, [5, 33]), ([1, 1], [2, 2], [1, 1])),
                ]
                .into_iter()
                .enumerate()
                {
                    let exact = dt == DataType::F32;
                    for (m, mode) in [XCORR, ConvMode::Convolution].into_iter().enumerate() {
                        let case = depthwise_nhwc(dt, dims, geo, mode);
                        let seed = (100 * m + seed) as u64;
                        check_forced(h, case, ConvFwdAlgo::Depthwise, exact, seed);
                    }
                }
            }
        },
    );
}

/// Checks `case` on the Depthwise algorithm twice: through the full epilogue (bias,
/// residual, relu, beta 1: `check_forced`) and plain (beta 0 into a poisoned y, so an
/// output the kernel never writes cannot pass).
fn check_depthwise_both_ways(h: &Handle, case: Case, exact: bool, seed: u64) {
    check_forced(h, case.clone(), ConvFwdAlgo::Depthwise, exact, seed);
    let inputs = Inputs::draw(&case, exact, &mut rng(seed + 1));
    let want = inputs.reference(&case);
    let perf = ConvFwdAlgoPerf {
        algo: ConvFwdAlgo::Depthwise,
        time_ms: 0.0,
        workspace_bytes: 0,
        deterministic: true,
        reduced_precision: false,
    };
    let tol = if exact { 0.0 } else { case.tolerance(&perf) };
    run_and_check(h, &case, &inputs, ConvFwdAlgo::Depthwise, &want, tol);
}

/// The `tile3` depthwise kernel (f16 and bf16 channels-last with 16-byte channel vectors,
/// a packed 3x3 filter at stride 1 and dilation 1 along h and w, outputs at least 7
/// wide: input rows staged in shared memory, one output vector per thread per row) on
/// the shapes at its tiles' edges, as the heuristic tiles them: 1, 2 and 8 channel
/// vectors per block (8, 16, 32, 48 and 128 channels) and 33 channel tiles of one vector (264
/// channels); one column tile (7, 14, 28, 33, 34 wide) and five uneven ones (64 -> 4 x 13 +
/// 12); heights below one row tile, at it and past it with a short last tile (35 -> 28 +
/// 7); padding 0 to 3 (padding 2 and 3 give output rows and columns whose taps reach past
/// x); padding that differs between h and w. Next to them the problems the kernel
/// declines (stride 2 or dilation 2 along h only), which keep the `strip` kernel. f32
/// (the `vec` kernel) checks the same shapes. Both modes, each with the full epilogue and
/// plain into a poisoned output.
#[test]
fn depthwise_tile3_matches_the_reference_at_tile_edges() {
    with_gpu("depthwise_tile3_matches_the_reference_at_tile_edges", |h| {
        for dt in [DataType::F16, DataType::BF16, DataType::F32] {
            for (seed, (dims, geo)) in [
                ((2, 8, [5, 28]), ([1, 1], [1, 1], [1, 1])),
                ((1, 24, [20, 33]), ([1, 1], [1, 1], [1, 1])),
                ((2, 40, [16, 30]), ([0, 0], [1, 1], [1, 1])),
                ((1, 16, [9, 30]), ([2, 3], [1, 1], [1, 1])),
                ((1, 264, [3, 29]), ([1, 1], [1, 1], [1, 1])),
                ((1, 128, [15, 64]), ([1, 1], [1, 1], [1, 1])),
                ((1, 64, [14, 14]), ([1, 1], [1, 1], [1, 1])),
                ((2, 48, [12, 28]), ([1, 1], [1, 1], [1, 1])),
                ((3, 32, [7, 7]), ([1, 1], [1, 1], [1, 1])),
                ((2, 8, [31, 30]), ([3, 0], [1, 1], [1, 1])),
                ((1, 32, [6, 29]), ([1, 1], [1, 1], [2, 1])),
                ((1, 16, [9, 30]), ([1, 1], [2, 1], [1, 1])),
            ]
            .into_iter()
            .enumerate()
            {
                let exact = dt == DataType::F32;
                for (m, mode) in [XCORR, ConvMode::Convolution].into_iter().enumerate() {
                    let case = depthwise_nhwc(dt, dims, geo, mode);
                    check_depthwise_both_ways(h, case, exact, (100 * m + seed) as u64);
                }
            }
        }
    });
}

/// `OXIDNN_CONV_DW_TILE` forces the `tile3` kernel's block tile (run alone: the variable
/// is process-wide): tiles of one column, one row and one channel vector, tiles wider
/// and taller than the output, tiles that leave most of a block's threads idle, and the
/// heuristic's kernels forced by name, all against the reference; a tile the kernel
/// cannot take is an error naming the variable, never a silent fallback.
/// `cargo test --release --test convolution -- --ignored --test-threads=1 depthwise_forced`.
#[test]
#[ignore]
fn depthwise_forced_tiles_match_the_reference() {
    let Some(h) = gpu() else {
        return;
    };
    const VAR: &str = "OXIDNN_CONV_DW_TILE";
    let mut seed = 0;
    for dt in [DataType::F16, DataType::BF16] {
        for (dims, geo) in [
            ((2, 16, [9, 30]), ([1, 1], [1, 1], [1, 1])),
            ((1, 24, [13, 7]), ([2, 1], [1, 1], [1, 1])),
            ((1, 64, [4, 3]), ([0, 1], [1, 1], [1, 1])),
        ] {
            for tile in [
                "1x1x1", "2x1x3", "1x7x2", "3x5x4", "1x64x64", "8x32x16", "2x3x100", "vec", "strip",
            ] {
                std::env::set_var(VAR, tile);
                let case = depthwise_nhwc(dt, dims, geo, XCORR);
                let vectors = dims.1 / 8;
                let cv: usize = tile.split('x').next().unwrap().parse().unwrap_or(1);
                if vectors % cv == 0 {
                    seed += 1;
                    check_depthwise_both_ways(h, case, false, seed);
                } else {
                    let x = h.alloc(&case.x).unwrap();
                    let w = h.alloc(case.w.tensor()).unwrap();
                    let mut y = h.alloc(&case.y).unwrap();
                    let e = convolution_forward_with(
                        h,
                        1.0,
                        &case.x,
                        &x,
                        &case.w,
                        &w,
                        &case.conv,
                        ConvFwdAlgo::Depthwise,
                        None,
                        0.0,
                        &case.y,
                        &mut y,
                        &ConvEpilogue::default(),
                    )
                    .unwrap_err();
                    assert!(e.to_string().contains(VAR), "{tile}: {e}");
                }
            }
        }
    }
    std::env::remove_var(VAR);
}

/// Tuning aid for the channels-last depthwise kernels (run alone: it sets
/// `OXIDNN_CONV_DW_TILE`): MobileNet's f16 depthwise layers at N = 64 under the
/// heuristic and under `vec`, `strip` and a sweep of `tile3` block tiles,
/// timed on the host clock around 20 queued calls on rotating buffers. Lines `DWTILE layer kernel µs`, then per layer
/// `DWBEST`.
#[test]
#[ignore]
fn time_depthwise_tiles() {
    let Some(h) = gpu() else {
        return;
    };
    const VAR: &str = "OXIDNN_CONV_DW_TILE";
    // (name, C, H = W, stride) of benches/shapes/mobilenet.txt.
    let layers = [
        ("conv2_1", 32, 112, 1),
        ("conv2_2", 64, 112, 2),
        ("conv3_1", 128, 56, 1),
        ("conv3_2", 128, 56, 2),
        ("conv4_1", 256, 28, 1),
        ("conv4_2", 256, 28, 2),
        ("conv5_1", 512, 14, 1),
        ("conv5_6", 512, 14, 2),
        ("conv6", 1024, 7, 1),
        ("block1_dw96s2", 96, 112, 2),
        ("block2_dw144", 144, 56, 1),
        ("block3_dw144s2", 144, 56, 2),
        ("block4_dw192", 192, 28, 1),
        ("block6_dw192s2", 192, 28, 2),
        ("block7_dw384", 384, 14, 1),
        ("block11_dw576", 576, 14, 1),
        ("block13_dw576s2", 576, 14, 2),
        ("block14_dw960", 960, 7, 1),
    ];
    let mut r = rng(12);
    for (name, c, hw, stride) in layers {
        let case = case2d(
            DataType::F16,
            MathType::Fma,
            (64, c, c, [hw, hw]),
            (3, 1, stride, 1, c),
            Layout::ChannelsLast,
            XCORR,
        );
        let out = case.y.dims()[3];
        // Buffer sets rotate (200 MB in all, as the bench's) so that no call reads what
        // the previous one left in L2.
        let bytes = 2 * (case.x.dims().iter().product::<usize>() * 2);
        let sets = (200usize << 20).div_ceil(bytes).clamp(2, 32);
        let xs: Vec<_> = (0..sets)
            .map(|_| h.upload_tensor(&random(case.x, -1.0, 1.0, &mut r)).unwrap())
            .collect();
        let mut ys: Vec<_> = (0..sets).map(|_| h.alloc(&case.y).unwrap()).collect();
        let w = h
            .upload_tensor(&random(*case.w.tensor(), -1.0, 1.0, &mut r))
            .unwrap();
        let mut next = 0;
        let mut time = |kernel: Option<&str>| -> Option<f64> {
            match kernel {
                Some(v) => std::env::set_var(VAR, v),
                None => std::env::remove_var(VAR),
            }
            let mut call = || {
                next = (next + 1) % sets;
                convolution_forward_with(
                    h,
                    1.0,
                    &case.x,
                    &xs[next],
                    &case.w,
                    &w,
                    &case.conv,
                    ConvFwdAlgo::Depthwise,
                    None,
                    0.0,
                    &case.y,
                    &mut ys[next],
                    &ConvEpilogue::default(),
                )
            };
            call().ok()?;
            call().ok()?;
            h.synchronize().unwrap();
            let start = std::time::Instant::now();
            for _ in 0..20 {
                call().unwrap();
            }
            h.synchronize().unwrap();
            Some(start.elapsed().as_secs_f64() / 20.0 * 1e6)
        };
        let default = time(None).unwrap_or(f64::NAN);
        println!("DWTILE {name} heuristic {default:.1}");
        let mut best = ("heuristic".to_string(), default);
        let vectors = c / 8;
        let mut kernels = vec!["vec".to_string(), "strip".to_string()];
        if stride == 1 {
            for cv in [8, 4, 2] {
                if vectors % cv != 0 {
                    continue;
                }
                for tw in [
                    out.div_ceil(out.div_ceil(16)),
                    out.div_ceil(out.div_ceil(28)),
                    out.min(64),
                ] {
                    for th in [7, 14, 28] {
                        let k = format!("{cv}x{tw}x{th}");
                        if th <= out && !kernels.contains(&k) {
                            kernels.push(k);
                        }
                    }
                }
            }
        }
        for k in &kernels {
            if let Some(us) = time(Some(k)) {
                println!("DWTILE {name} {k} {us:.1}");
                if us < best.1 {
                    best = (k.clone(), us);
                }
            }
        }
        std::env::remove_var(VAR);
        println!(
            "DWBEST {name} heuristic {default:.1} best {} {:.1}",
            best.0, best.1
        );
    }
}

#[test]
fn implicit_gemm_and_depthwise_decline_with_reasons() {
    for h in handles() {
        let conv = conv2d(1, 1, 1, MathType::Fma);
        let ask = |dt: DataType, c: usize, groups: usize, algo: ConvFwdAlgo| {
            let conv = conv.with_groups(groups).unwrap();
            let x = TensorDescriptor::nchw(dt, 1, c, 8, 8).unwrap();
            let w = FilterDescriptor::new(dt, FilterLayout::Kcrs, c, c / groups, &[3, 3]).unwrap();
            let y = TensorDescriptor::nchw(dt, 1, c, 8, 8).unwrap();
            convolution_forward_workspace_size(h, &x, &w, &conv, &y, algo)
        };
        assert!(ask(DataType::F32, 8, 1, ConvFwdAlgo::ImplicitGemm).is_ok());
        let e = ask(DataType::F16, 8, 1, ConvFwdAlgo::ImplicitGemm).unwrap_err();
        assert!(e.to_string().contains("exact f32"), "{e}");
        assert!(ask(DataType::F16, 8, 8, ConvFwdAlgo::Depthwise).is_ok());
        let e = ask(DataType::F32, 8, 2, ConvFwdAlgo::Depthwise).unwrap_err();
        assert!(e.to_string().contains("not depthwise"), "{e}");
    }
}

/// Timings of ImplicitGemm and Depthwise against Direct (`find`, median of 5) on ResNet-50
/// (N = 32, f32 NCHW) and MobileNet (N = 64, f32 NCHW and f16 NHWC) layers:
/// `cargo test --release --test convolution -- --ignored --nocapture time_`.
#[test]
#[ignore]
fn time_implicit_gemm_and_depthwise() {
    let Some(h) = gpu() else {
        return;
    };
    let run = |h: &Handle, case: &Case, label: &str| {
        let mut r = rng(7);
        let x = h.upload_tensor(&random(case.x, -1.0, 1.0, &mut r)).unwrap();
        let w = h
            .upload_tensor(&random(*case.w.tensor(), -1.0, 1.0, &mut r))
            .unwrap();
        let mut y = h.alloc(&case.y).unwrap();
        let found = find_convolution_forward_algorithm(
            h, &case.x, &x, &case.w, &w, &case.conv, &case.y, &mut y, None,
        )
        .unwrap();
        let flops = 2.0 * case.y.dims().iter().product::<usize>() as f64 * case.reduction() as f64;
        let bytes = (case.x.dims().iter().product::<usize>()
            + case.w.dims().iter().product::<usize>()
            + case.y.dims().iter().product::<usize>()) as f64
            * case.dtype.size_bytes() as f64;
        for p in &found {
            let s = p.time_ms as f64 * 1e-3;
            println!(
                "{label:<34} {:<13?} {:8.4} ms {:7.2} TFLOPS {:7.1} GB/s",
                p.algo,
                p.time_ms,
                flops / s * 1e-12,
                bytes / s * 1e-9
            );
        }
    };
    let xc = XCORR;
    for (label, dims, geo) in [
        (
            "resnet c64k64 56x56 3x3",
            (32, 64, 64, [56, 56]),
            (3, 1, 1, 1, 1),
        ),
        (
            "resnet c128k128 28x28 3x3",
            (32, 128, 128, [28, 28]),
            (3, 1, 1, 1, 1),
        ),
        (
            "resnet c256k256 14x14 3x3",
            (32, 256, 256, [14, 14]),
            (3, 1, 1, 1, 1),
        ),
        (
            "resnet c512k512 7x7 3x3",
            (32, 512, 512, [7, 7]),
            (3, 1, 1, 1, 1),
        ),
        (
            "resnet c256k64 56x56 1x1",
            (32, 256, 64, [56, 56]),
            (1, 0, 1, 1, 1),
        ),
        (
            "resnet c64k256 56x56 1x1",
            (32, 64, 256, [56, 56]),
            (1, 0, 1, 1, 1),
        ),
    ] {
        let case = case2d(
            DataType::F32,
            MathType::Fma,
            dims,
            geo,
            Layout::ChannelsFirst,
            xc,
        );
        run(h, &case, label);
    }
    for (dt, layout) in [
        (DataType::F32, Layout::ChannelsFirst),
        (DataType::F16, Layout::ChannelsLast),
        (DataType::F32, Layout::ChannelsLast),
    ] {
        for (label, c, hw, stride) in [
            ("mnv1 c32 112x112 s1", 32, 112, 1),
            ("mnv1 c64 112x112 s2", 64, 112, 2),
            ("mnv1 c512 14x14 s1", 512, 14, 1),
            ("mnv1 c1024 7x7 s1", 1024, 7, 1),
            ("mnv2 c144 56x56 s1", 144, 56, 1),
            ("mnv2 c960 7x7 s1", 960, 7, 1),
        ] {
            let case = case2d(
                dt,
                MathType::Fma,
                (64, c, c, [hw, hw]),
                (3, 1, stride, 1, c),
                layout,
                xc,
            );
            run(h, &case, &format!("{label} {} {layout:?}", dt.name()));
        }
    }
}

// ---------------------------------------------------------------------------------------
// ImplicitGemmTensorOp
// ---------------------------------------------------------------------------------------

/// A channels-last implicit-GEMM case: x `[n, c, input..]` NHWC, a KRSC filter of `k`
/// output channels, y NHWC or NCHW; `epilogue`: bias, residual, relu and `beta = 0.5`.
struct IgemmShape<'a> {
    dtype: DataType,
    n: usize,
    c: usize,
    k: usize,
    input: &'a [usize],
    filter: &'a [usize],
    pad: usize,
    stride: &'a [usize],
    dilation: usize,
    groups: usize,
    mode: ConvMode,
    y_last: bool,
    epilogue: bool,
    /// x channels-last (else NCHW-like) and the filter KRSC (else KCRS).
    x_last: bool,
    krsc: bool,
}

impl IgemmShape<'_> {
    fn case(&self) -> Case {
        let s = self.input.len();
        let math = if self.dtype == DataType::F32 {
            MathType::Tf32
        } else {
            MathType::TensorOp
        };
        let conv = ConvolutionDescriptor::new(
            &vec![self.pad; s],
            self.stride,
            &vec![self.dilation; s],
            self.mode,
            math,
        )
        .unwrap()
        .with_groups(self.groups)
        .unwrap();
        let x_layout = if self.x_last {
            Layout::ChannelsLast
        } else {
            Layout::ChannelsFirst
        };
        let x =
            TensorDescriptor::spatial(self.dtype, self.n, self.c, self.input, x_layout).unwrap();
        let w = FilterDescriptor::new(
            self.dtype,
            if self.krsc {
                FilterLayout::Krsc
            } else {
                FilterLayout::Kcrs
            },
            self.k,
            self.c / self.groups,
            self.filter,
        )
        .unwrap();
        let yd = convolution_forward_output_dims(&conv, &x, &w).unwrap();
        let layout = if self.y_last {
            Layout::ChannelsLast
        } else {
            Layout::ChannelsFirst
        };
        let y = TensorDescriptor::spatial(self.dtype, yd[0], yd[1], &yd[2..], layout).unwrap();
        Case {
            dtype: self.dtype,
            math,
            conv,
            x,
            w,
            y,
            alpha: if self.epilogue { 0.75 } else { 1.0 },
            beta: if self.epilogue { 0.5 } else { 0.0 },
            bias: self.epilogue,
            residual: self.epilogue,
            activation: if self.epilogue {
                ActivationDescriptor::relu()
            } else {
                ActivationDescriptor::identity()
            },
        }
    }
}

fn igemm(
    dtype: DataType,
    n: usize,
    c: usize,
    k: usize,
    input: &'static [usize],
) -> IgemmShape<'static> {
    IgemmShape {
        dtype,
        n,
        c,
        k,
        input,
        filter: &[3, 3],
        pad: 1,
        stride: &[1, 1],
        dilation: 1,
        groups: 1,
        mode: XCORR,
        y_last: true,
        epilogue: false,
        x_last: true,
        krsc: true,
    }
}

/// The implicit GEMM forced on small channels-last problems that stress its loaders:
/// partial channel blocks and tiles, padding past the filter, strides, dilations,
/// convolution mode, groups, 1-D and 3-D, NCHW y, odd channel counts (unpaired stores)
/// and the fused epilogue, against the f64 reference. On an H100 the 2-D problems with K
/// >= 256 and whole 64-channel groups run on the TMA tiles.
#[test]
fn implicit_gemm_tensor_op_matches_the_reference() {
    use DataType::{BF16, F16, F32};
    let conv = ConvMode::Convolution;
    let cases = [
        igemm(F16, 2, 64, 64, &[8, 8]),
        IgemmShape {
            stride: &[2, 2],
            pad: 2,
            mode: conv,
            y_last: false,
            ..igemm(BF16, 1, 72, 40, &[7, 9])
        },
        IgemmShape {
            pad: 4,
            dilation: 2,
            epilogue: true,
            ..igemm(F16, 2, 16, 37, &[9, 9])
        },
        IgemmShape {
            filter: &[5, 5],
            pad: 2,
            ..igemm(F32, 2, 36, 20, &[6, 6])
        },
        IgemmShape {
            filter: &[3, 3, 3],
            stride: &[1, 2, 1],
            mode: conv,
            ..igemm(F16, 1, 8, 16, &[5, 6, 7])
        },
        IgemmShape {
            filter: &[5],
            pad: 2,
            stride: &[3],
            epilogue: true,
            ..igemm(BF16, 3, 24, 24, &[20])
        },
        IgemmShape {
            groups: 2,
            ..igemm(F16, 2, 32, 48, &[6, 5])
        },
        IgemmShape {
            groups: 4,
            epilogue: true,
            y_last: false,
            ..igemm(BF16, 1, 32, 12, &[4, 4])
        },
        IgemmShape {
            groups: 3,
            filter: &[1, 1],
            pad: 0,
            ..igemm(F32, 2, 24, 9, &[5, 5])
        },
        IgemmShape {
            filter: &[1, 1],
            pad: 3,
            stride: &[2, 3],
            ..igemm(F16, 2, 136, 130, &[7, 7])
        },
        // On sm_90a the TMA tiles (im2col copies): an asymmetric filter and stride with
        // rows wrapping across three images, a strided 1x1 (K = 256), and groups of 64
        // channels in convolution mode.
        IgemmShape {
            filter: &[3, 5],
            pad: 2,
            stride: &[2, 1],
            epilogue: true,
            ..igemm(F16, 3, 64, 80, &[9, 11])
        },
        IgemmShape {
            filter: &[1, 1],
            pad: 0,
            stride: &[2, 2],
            ..igemm(F16, 2, 256, 96, &[13, 13])
        },
        IgemmShape {
            groups: 2,
            mode: conv,
            epilogue: true,
            y_last: false,
            ..igemm(BF16, 2, 128, 72, &[10, 10])
        },
    ];
    with_gpu("implicit_gemm_tensor_op_matches_the_reference", |h| {
        for (i, shape) in cases.iter().enumerate() {
            let case = shape.case();
            let inputs = Inputs::draw(&case, false, &mut rng(i as u64));
            let want = inputs.reference(&case);
            let perf = ConvFwdAlgoPerf {
                algo: ConvFwdAlgo::ImplicitGemmTensorOp,
                time_ms: f32::NAN,
                workspace_bytes: 0,
                deterministic: true,
                reduced_precision: false,
            };
            run_and_check(h, &case, &inputs, perf.algo, &want, case.tolerance(&perf));
        }
    });
}

/// ResNet-like problems large enough for each of the implicit GEMM's tiles to be the
/// heuristic's choice on an H100 (TMA `wgmma` 128x256, 128x128 and 128x64, `mma.sync`
/// 128x256, 128x128 and 128x64 in f16/bf16, 128x128 in tf32; the property tests cover
/// 64x64), against the direct algorithm on the same GPU.
#[test]
fn implicit_gemm_tensor_op_matches_direct_on_large_problems() {
    use DataType::{BF16, F16, F32};
    let cases = [
        igemm(F16, 2, 32, 256, &[80, 80]),
        IgemmShape {
            epilogue: true,
            ..igemm(BF16, 1, 64, 256, &[84, 84])
        },
        IgemmShape {
            filter: &[1, 1],
            ..igemm(F16, 2, 128, 128, &[270, 270])
        },
        IgemmShape {
            filter: &[1, 1],
            y_last: false,
            ..igemm(BF16, 2, 128, 256, &[270, 270])
        },
        igemm(F32, 2, 64, 128, &[80, 80]),
        IgemmShape {
            epilogue: true,
            ..igemm(F16, 2, 64, 64, &[56, 56])
        },
        IgemmShape {
            filter: &[1, 1],
            groups: 2,
            ..igemm(BF16, 2, 128, 128, &[270, 270])
        },
    ];
    with_gpu(
        "implicit_gemm_tensor_op_matches_direct_on_large_problems",
        |h| {
            for (i, shape) in cases.iter().enumerate() {
                let case = shape.case();
                let inputs = Inputs::draw(&case, false, &mut rng(100 + i as u64));
                let direct = direct_on_gpu(h, &case, &inputs);
                let tol = bound(case.dtype) * 2.0;
                let tol = if case.dtype == F32 { 2e-3 } else { tol };
                run_and_check(
                    h,
                    &case,
                    &inputs,
                    ConvFwdAlgo::ImplicitGemmTensorOp,
                    &direct,
                    tol,
                );
            }
        },
    );
}

/// Each of the implicit GEMM's requirements declines with its reason, on every handle.
#[test]
fn implicit_gemm_tensor_op_declines_with_reasons() {
    use DataType::{F16, F32};
    let algo = ConvFwdAlgo::ImplicitGemmTensorOp;
    for h in handles() {
        let dt = if h.is_gpu() { F16 } else { F32 };
        let math = if dt == F16 {
            MathType::TensorOp
        } else {
            MathType::Tf32
        };
        let conv = conv2d(1, 1, 1, math);
        let nhwc = |c| TensorDescriptor::nhwc(dt, 2, c, 9, 9).unwrap();
        let krsc = |c| FilterDescriptor::new(dt, FilterLayout::Krsc, 16, c, &[3, 3]).unwrap();
        let y = nhwc(16);
        let why = |x: &TensorDescriptor, w: &FilterDescriptor, conv: &ConvolutionDescriptor| {
            match convolution_forward_workspace_size(h, x, w, conv, &y, algo) {
                Ok(_) => String::new(),
                Err(e) => e.to_string(),
            }
        };
        assert_eq!(why(&nhwc(16), &krsc(16), &conv), "");
        // Layouts and channel counts the 16-byte copies cannot take run on the gather
        // kernels.
        let nchw = TensorDescriptor::nchw(dt, 2, 16, 9, 9).unwrap();
        assert_eq!(why(&nchw, &krsc(16), &conv), "");
        let kcrs = FilterDescriptor::new(dt, FilterLayout::Kcrs, 16, 16, &[3, 3]).unwrap();
        assert_eq!(why(&nhwc(16), &kcrs, &conv), "");
        assert_eq!(why(&nhwc(3), &krsc(3), &conv), "");
        let odd = TensorDescriptor::new(dt, &[2, 16, 9, 9], &[9 * 200, 1, 200, 21]).unwrap();
        assert_eq!(why(&odd, &krsc(16), &conv), "");
        let fma = conv.with_math(MathType::Fma);
        assert!(why(&nhwc(16), &krsc(16), &fma).contains("tensor cores"));
        assert!(why(&nchw, &krsc(16), &fma).contains("tensor cores"));
    }
}

/// Times the implicit GEMM (NHWC, KRSC; f16 on every tile `IGEMM_TIMING_TILES` lists,
/// comma-separated, empty for the heuristic's; bf16 and tf32 on the heuristic's) on
/// ResNet-50's 3x3 layers at N = 32 and 256 and prints TFLOPS (`cargo test --release --test convolution -- --ignored --nocapture
/// implicit_gemm_tensor_op_timing`; `OXIDNN_CONV_IGEMM_TILE` forces a tile).
#[test]
#[ignore]
fn implicit_gemm_tensor_op_timing() {
    let Some(h) = gpu() else { return };
    let tiles: Vec<String> = std::env::var("IGEMM_TIMING_TILES")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_else(|_| vec![String::new()]);
    let shapes = [(64, 56), (128, 28), (256, 14), (512, 7)];
    for dt in [DataType::F16, DataType::BF16, DataType::F32] {
        let math = if dt == DataType::F32 {
            MathType::Tf32
        } else {
            MathType::TensorOp
        };
        for n in [32usize, 256] {
            for &(c, hw) in &shapes {
                // The tile sweep in f16 only; bf16 and tf32 on the heuristic's tile.
                let tiles = if dt == DataType::F16 {
                    tiles.clone()
                } else {
                    vec![String::new()]
                };
                let x_desc = TensorDescriptor::nhwc(dt, n, c, hw, hw).unwrap();
                let w_desc = FilterDescriptor::new(dt, FilterLayout::Krsc, c, c, &[3, 3]).unwrap();
                let conv = conv2d(1, 1, 1, math);
                let y_desc = TensorDescriptor::nhwc(dt, n, c, hw, hw).unwrap();
                let mut x = h.alloc(&x_desc).unwrap();
                let mut w = h.alloc(w_desc.tensor()).unwrap();
                h.fill_bytes(&mut x, 0x31).unwrap();
                h.fill_bytes(&mut w, 0x22).unwrap();
                let mut y = h.alloc(&y_desc).unwrap();
                let flops = 2.0 * (n * c * hw * hw * c * 9) as f64;
                for tile in &tiles {
                    if tile.is_empty() {
                        std::env::remove_var("OXIDNN_CONV_IGEMM_TILE");
                    } else {
                        std::env::set_var("OXIDNN_CONV_IGEMM_TILE", tile);
                    }
                    let mut run = || {
                        convolution_forward(
                            h,
                            1.0,
                            &x_desc,
                            &x,
                            &w_desc,
                            &w,
                            &conv,
                            ConvFwdAlgo::ImplicitGemmTensorOp,
                            None,
                            0.0,
                            &y_desc,
                            &mut y,
                        )
                    };
                    if let Err(e) = run() {
                        println!("igemm {dt} n{n} c=k={c} {hw}x{hw} tile {tile:?}: {e}");
                        continue;
                    }
                    h.synchronize().unwrap();
                    let mut times = Vec::new();
                    for _ in 0..7 {
                        let t = std::time::Instant::now();
                        for _ in 0..10 {
                            run().unwrap();
                        }
                        h.synchronize().unwrap();
                        times.push(t.elapsed().as_secs_f64() / 10.0);
                    }
                    times.sort_by(f64::total_cmp);
                    let t = times[3];
                    println!(
                        "igemm {dt} n{n} c=k={c} {hw}x{hw} 3x3 tile {:>9}: {:8.3} ms {:6.1} TFLOPS",
                        if tile.is_empty() { "heuristic" } else { tile },
                        t * 1e3,
                        flops / t / 1e12
                    );
                }
                std::env::remove_var("OXIDNN_CONV_IGEMM_TILE");
            }
        }
    }
    // conv1 (7x7/2, c = 3) declines: 3 channels are not a whole 16-byte chunk.
    let x_desc = TensorDescriptor::nhwc(DataType::F16, 32, 3, 224, 224).unwrap();
    let w_desc = FilterDescriptor::new(DataType::F16, FilterLayout::Krsc, 64, 3, &[7, 7]).unwrap();
    let conv = conv2d(3, 2, 1, MathType::TensorOp);
    let y_desc = TensorDescriptor::nhwc(DataType::F16, 32, 64, 112, 112).unwrap();
    let r = convolution_forward_workspace_size(
        h,
        &x_desc,
        &w_desc,
        &conv,
        &y_desc,
        ConvFwdAlgo::ImplicitGemmTensorOp,
    );
    println!("conv1: {r:?}");
}

// ---------------------------------------------------------------------------------------
// ImplicitGemmTensorOp: the gather kernels (flattened K, any layout, any channel count)
// ---------------------------------------------------------------------------------------

/// The implicit GEMM forced on problems its `cp.async` kernels cannot copy as they lie
/// (NCHW x, KCRS filters, tf32 NCHW: the gather kernels; channel counts that are not
/// whole 16-byte chunks, grouped odd channels, a ResNet conv1-like 7x7/2 layer with 3
/// channels: since channel padding, the packed kernels over padded copies), against the
/// f64 reference.
#[test]
fn implicit_gemm_tensor_op_gather_matches_the_reference() {
    use DataType::{BF16, F16, F32};
    let conv = ConvMode::Convolution;
    let cases = [
        // conv1-like: 7x7 stride 2 pad 3, C = 3, NHWC.
        IgemmShape {
            filter: &[7, 7],
            pad: 3,
            stride: &[2, 2],
            epilogue: true,
            ..igemm(F16, 2, 3, 64, &[30, 30])
        },
        // NCHW f16, KCRS filter, NCHW y.
        IgemmShape {
            x_last: false,
            krsc: false,
            y_last: false,
            ..igemm(F16, 2, 64, 64, &[8, 8])
        },
        // NCHW x with a KRSC filter.
        IgemmShape {
            x_last: false,
            ..igemm(BF16, 1, 40, 24, &[7, 9])
        },
        // Odd channel counts, dilation, padding past the filter.
        IgemmShape {
            pad: 4,
            dilation: 2,
            epilogue: true,
            ..igemm(BF16, 2, 5, 37, &[9, 9])
        },
        IgemmShape {
            stride: &[2, 3],
            mode: conv,
            ..igemm(F16, 3, 7, 130, &[11, 10])
        },
        // Grouped, odd channels per group, NCHW.
        IgemmShape {
            groups: 3,
            x_last: false,
            krsc: false,
            ..igemm(F16, 2, 9, 12, &[6, 5])
        },
        IgemmShape {
            groups: 5,
            epilogue: true,
            ..igemm(BF16, 2, 15, 10, &[5, 5])
        },
        // tf32 NCHW, and tf32 with 3 channels.
        IgemmShape {
            filter: &[5, 5],
            pad: 2,
            mode: conv,
            x_last: false,
            krsc: false,
            y_last: false,
            ..igemm(F32, 2, 16, 20, &[6, 6])
        },
        IgemmShape {
            filter: &[7, 7],
            pad: 3,
            stride: &[2, 2],
            ..igemm(F32, 2, 3, 16, &[15, 15])
        },
        // 3-D and 1-D with odd channels.
        IgemmShape {
            filter: &[3, 3, 3],
            stride: &[1, 2, 1],
            ..igemm(F16, 1, 3, 16, &[5, 6, 7])
        },
        IgemmShape {
            filter: &[5],
            pad: 2,
            stride: &[1],
            x_last: false,
            ..igemm(BF16, 3, 6, 24, &[20])
        },
    ];
    with_gpu(
        "implicit_gemm_tensor_op_gather_matches_the_reference",
        |h| {
            for (i, shape) in cases.iter().enumerate() {
                let case = shape.case();
                let inputs = Inputs::draw(&case, false, &mut rng(300 + i as u64));
                let want = inputs.reference(&case);
                let perf = ConvFwdAlgoPerf {
                    algo: ConvFwdAlgo::ImplicitGemmTensorOp,
                    time_ms: f32::NAN,
                    workspace_bytes: 0,
                    deterministic: true,
                    reduced_precision: false,
                };
                run_and_check(h, &case, &inputs, perf.algo, &want, case.tolerance(&perf));
            }
        },
    );
}

/// Times the gather kernels (`find_convolution_forward_algorithm`, every accepted
/// algorithm) on ResNet-50's conv1 (7x7/2, C = 3, NHWC) in f16 at N = 32 and 256 and bf16
/// at N = 32, and a 3x3 c = k = 64 56x56 NCHW f16 layer at N = 32 (`cargo test --release
/// --test convolution -- --ignored --nocapture implicit_gemm_tensor_op_gather_timing`).
#[test]
#[ignore]
fn implicit_gemm_tensor_op_gather_timing() {
    let Some(h) = gpu() else { return };
    use DataType::{BF16, F16};
    // (dtype, n, c, k, hw, filter, pad, stride, channels-last)
    let shapes = [
        (F16, 32, 3, 64, 224, 7, 3, 2, true),
        (F16, 256, 3, 64, 224, 7, 3, 2, true),
        (BF16, 32, 3, 64, 224, 7, 3, 2, true),
        (F16, 32, 64, 64, 56, 3, 1, 1, false),
    ];
    for (dt, n, c, k, hw, f, pad, stride, last) in shapes {
        let layout = if last {
            Layout::ChannelsLast
        } else {
            Layout::ChannelsFirst
        };
        let fl = if last {
            FilterLayout::Krsc
        } else {
            FilterLayout::Kcrs
        };
        let x_desc = TensorDescriptor::spatial(dt, n, c, &[hw, hw], layout).unwrap();
        let w_desc = FilterDescriptor::new(dt, fl, k, c, &[f, f]).unwrap();
        let conv = conv2d(pad, stride, 1, MathType::TensorOp);
        let yd = convolution_forward_output_dims(&conv, &x_desc, &w_desc).unwrap();
        let y_desc = TensorDescriptor::spatial(dt, yd[0], yd[1], &yd[2..], layout).unwrap();
        let mut x = h.alloc(&x_desc).unwrap();
        let mut w = h.alloc(w_desc.tensor()).unwrap();
        h.fill_bytes(&mut x, 0x31).unwrap();
        h.fill_bytes(&mut w, 0x22).unwrap();
        let mut y = h.alloc(&y_desc).unwrap();
        let found = find_convolution_forward_algorithm(
            h, &x_desc, &x, &w_desc, &w, &conv, &y_desc, &mut y, None,
        )
        .unwrap();
        let flops = 2.0 * (yd.iter().product::<usize>() * c * f * f) as f64;
        let row: Vec<String> = found
            .iter()
            .map(|p| {
                format!(
                    "{:?} {:.4} ms {:.1} TFLOPS",
                    p.algo,
                    p.time_ms,
                    flops / (p.time_ms as f64 * 1e-3) / 1e12
                )
            })
            .collect();
        println!(
            "gather {dt} N={n} c={c} k={k} {hw}x{hw} {f}x{f}/{stride} {}: {}",
            if last { "nhwc" } else { "nchw" },
            row.join(", ")
        );
    }
}

// ---------------------------------------------------------------------------------------
// ImplicitGemmTensorOp: few channels per group, padded into the workspace (packed kernels)
// ---------------------------------------------------------------------------------------

/// The workspace the implicit GEMM asks for a problem whose channels per group are padded
/// to `c_pad` after folding its strided dims into them (where the stride is above 1, the
/// dilation 1 and the filter longer than the stride: the filter becomes `ceil(f / s)`
/// taps, the input `output + taps - 1` positions): x as `[n, spatial, groups, c_pad]`
/// (each image a whole number of 16-byte chunks, the region rounded up to 256 bytes),
/// then the filter as `k` rows of `taps * c_pad` rounded up to a whole 128-byte K tile.
fn padded_workspace(case: &Case, c_pad: usize) -> usize {
    let (xd, wd, yd) = (case.x.dims(), case.w.dims(), case.y.dims());
    let size = case.dtype.size_bytes();
    let groups = case.conv.groups();
    let (mut positions, mut taps) = (1, 1);
    for j in 0..xd.len() - 2 {
        let (f, s) = (wd[2 + j], case.conv.stride()[j]);
        if s > 1 && case.conv.dilation()[j] == 1 && f > s {
            taps *= f.div_ceil(s);
            positions *= yd[2 + j] + f.div_ceil(s) - 1;
        } else {
            taps *= f;
            positions *= xd[2 + j];
        }
    }
    let x_row = (positions * groups * c_pad).next_multiple_of(16 / size);
    let w_row = (taps * c_pad).next_multiple_of(128 / size);
    (xd[0] * x_row * size).next_multiple_of(256) + wd[0] * w_row * size
}

/// Problems with 1-7 channels per group (ResNet's RGB first layer among them) run on the
/// implicit GEMM's packed kernels over copies of x and the filter with their channels
/// padded (and strided dims folded into the channels where the filter is longer than the
/// stride: conv1's 7x7/2 over 3 channels as 4x4/1 over 12, padded to 16): f16/bf16 to 4
/// channels in 8-byte units where that halves the padding, else to a multiple of 8 in
/// 16-byte ones; f32 to a multiple of 4. Against the f64 reference with a bias, a
/// residual, relu and beta, odd spatial sizes, strides 2 and 3, padding (past the filter
/// too), dilation, convolution mode (folded and not), groups, NCHW x and KCRS filters
/// (the staging reads any layout), NCHW y, 1-D and 3-D; each asks for exactly its padded
/// copies as workspace.
#[test]
fn implicit_gemm_tensor_op_pads_few_channels() {
    use DataType::{BF16, F16, F32};
    let conv = ConvMode::Convolution;
    let conv1 = |dtype, n, c, k, input| IgemmShape {
        filter: &[7, 7],
        pad: 3,
        stride: &[2, 2],
        epilogue: true,
        ..igemm(dtype, n, c, k, input)
    };
    // (shape, padded channels per group after folding)
    let cases = [
        (conv1(F16, 2, 3, 64, &[31, 29]), 16),
        (conv1(BF16, 1, 3, 64, &[23, 23]), 16),
        (conv1(F32, 2, 3, 40, &[19, 21]), 12),
        (
            IgemmShape {
                y_last: false,
                ..conv1(F16, 1, 1, 24, &[17, 15])
            },
            4,
        ),
        (
            IgemmShape {
                pad: 4,
                dilation: 2,
                ..igemm(BF16, 2, 2, 37, &[9, 11])
            },
            4,
        ),
        (
            IgemmShape {
                stride: &[2, 3],
                mode: conv,
                epilogue: true,
                ..igemm(F16, 3, 5, 130, &[11, 10])
            },
            16,
        ),
        (
            IgemmShape {
                filter: &[5, 5],
                pad: 2,
                stride: &[2, 2],
                epilogue: true,
                ..igemm(BF16, 2, 7, 20, &[13, 9])
            },
            32,
        ),
        (
            IgemmShape {
                epilogue: true,
                mode: conv,
                ..igemm(F32, 2, 5, 16, &[7, 9])
            },
            8,
        ),
        (
            IgemmShape {
                epilogue: true,
                ..igemm(F32, 1, 2, 8, &[5, 5])
            },
            4,
        ),
        // Groups: 3 channels in each of 2 groups, 5 in each of 3 (tf32: 1 in each of 2).
        (
            IgemmShape {
                groups: 2,
                epilogue: true,
                ..igemm(F16, 2, 6, 12, &[9, 7])
            },
            4,
        ),
        (
            IgemmShape {
                groups: 3,
                stride: &[2, 2],
                ..igemm(BF16, 2, 15, 9, &[9, 9])
            },
            24,
        ),
        (
            IgemmShape {
                groups: 2,
                ..igemm(F32, 2, 2, 6, &[6, 5])
            },
            4,
        ),
        // NCHW x and a KCRS filter, staged from channels-first.
        (
            IgemmShape {
                x_last: false,
                krsc: false,
                y_last: false,
                epilogue: true,
                ..conv1(F16, 2, 3, 16, &[15, 17])
            },
            16,
        ),
        (
            IgemmShape {
                x_last: false,
                krsc: false,
                ..igemm(F32, 2, 3, 12, &[8, 8])
            },
            4,
        ),
        // 3-D and 1-D.
        (
            IgemmShape {
                filter: &[3, 3, 3],
                stride: &[1, 2, 1],
                mode: conv,
                ..igemm(F16, 1, 3, 16, &[5, 6, 7])
            },
            8,
        ),
        (
            IgemmShape {
                filter: &[5],
                pad: 2,
                stride: &[2],
                epilogue: true,
                ..igemm(BF16, 3, 6, 24, &[21])
            },
            16,
        ),
    ];
    let algo = ConvFwdAlgo::ImplicitGemmTensorOp;
    for h in handles() {
        for (i, (shape, c_pad)) in cases.iter().enumerate() {
            let case = shape.case();
            let bytes =
                convolution_forward_workspace_size(h, &case.x, &case.w, &case.conv, &case.y, algo)
                    .unwrap();
            assert_eq!(bytes, padded_workspace(&case, *c_pad), "{case:?}");
            if !h.is_gpu() {
                continue;
            }
            let inputs = Inputs::draw(&case, false, &mut rng(500 + i as u64));
            let want = inputs.reference(&case);
            let perf = ConvFwdAlgoPerf {
                algo,
                time_ms: f32::NAN,
                workspace_bytes: bytes,
                deterministic: true,
                reduced_precision: false,
            };
            run_and_check(h, &case, &inputs, algo, &want, case.tolerance(&perf));
        }
    }
}

/// The padded path refuses a workspace one byte short of its padded copies, or none, with
/// `WorkspaceTooSmall` (never a fallback to the unstaged kernels); `get` and `find` report
/// the workspace.
#[test]
fn implicit_gemm_tensor_op_padding_refuses_a_short_workspace() {
    use DataType::{F16, F32};
    for (dtype, c_pad) in [(F16, 16), (F32, 12)] {
        let case = IgemmShape {
            filter: &[7, 7],
            pad: 3,
            stride: &[2, 2],
            ..igemm(dtype, 2, 3, 64, &[32, 32])
        }
        .case();
        let algo = ConvFwdAlgo::ImplicitGemmTensorOp;
        let need = padded_workspace(&case, c_pad);
        for h in handles() {
            let perf = get_convolution_forward_algorithm(h, &case.x, &case.w, &case.conv, &case.y)
                .unwrap()
                .into_iter()
                .find(|p| p.algo == algo)
                .unwrap();
            assert_eq!(perf.workspace_bytes, need);
            if !h.is_gpu() {
                continue;
            }
            let x = h.alloc(&case.x).unwrap();
            let w = h.alloc(case.w.tensor()).unwrap();
            let mut y = h.alloc(&case.y).unwrap();
            let mut short = h.alloc_bytes(need - 1).unwrap();
            for ws in [Some(&mut short), None] {
                let r = convolution_forward(
                    h, 1.0, &case.x, &x, &case.w, &w, &case.conv, algo, ws, 0.0, &case.y, &mut y,
                );
                assert!(
                    matches!(r, Err(Error::WorkspaceTooSmall { required_bytes, .. }) if required_bytes == need),
                    "{r:?}"
                );
            }
        }
    }
}

/// ResNet-50's conv1 (7x7/2, pad 3, 3 -> 64 channels, 224x224) on the padded path, large
/// enough for the heuristic's Hopper tiles, in f16, bf16 and tf32 with the fused
/// epilogue, against the direct algorithm on the same GPU.
#[test]
fn implicit_gemm_tensor_op_pads_resnet_conv1_like_direct() {
    use DataType::{BF16, F16, F32};
    with_gpu(
        "implicit_gemm_tensor_op_pads_resnet_conv1_like_direct",
        |h| {
            for (i, (dtype, n)) in [(F16, 2), (BF16, 1), (F32, 1)].into_iter().enumerate() {
                let case = IgemmShape {
                    filter: &[7, 7],
                    pad: 3,
                    stride: &[2, 2],
                    epilogue: true,
                    ..igemm(dtype, n, 3, 64, &[224, 224])
                }
                .case();
                let inputs = Inputs::draw(&case, false, &mut rng(600 + i as u64));
                let direct = direct_on_gpu(h, &case, &inputs);
                let tol = if dtype == F32 {
                    2e-3
                } else {
                    bound(dtype) * 2.0
                };
                run_and_check(
                    h,
                    &case,
                    &inputs,
                    ConvFwdAlgo::ImplicitGemmTensorOp,
                    &direct,
                    tol,
                );
            }
        },
    );
}

/// Times ResNet-50's conv1 on the padded path at N = 32 and 256, with 8- and 16-byte
/// units for f16/bf16 (`OXIDNN_CONV_PAD_UNIT`), on the heuristic's tile and, for f16, the
/// tiles `PAD_TIMING_TILES` lists (comma-separated `OXIDNN_CONV_IGEMM_TILE` values):
/// `cargo test --release --test convolution -- --ignored --nocapture time_padded_conv1`.
#[test]
#[ignore]
fn time_padded_conv1() {
    let Some(h) = gpu() else { return };
    use DataType::{BF16, F16, F32};
    let sweep: Vec<String> = std::env::var("PAD_TIMING_TILES")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    for (dtype, units) in [
        (F16, &["8", "16"][..]),
        (BF16, &["8", "16"]),
        (F32, &["16"]),
    ] {
        for n in [32usize, 256] {
            for unit in units {
                let mut tiles = vec![String::new()];
                if dtype == F16 {
                    tiles.extend(sweep.iter().cloned());
                }
                for tile in &tiles {
                    std::env::set_var("OXIDNN_CONV_PAD_UNIT", unit);
                    if tile.is_empty() {
                        std::env::remove_var("OXIDNN_CONV_IGEMM_TILE");
                    } else {
                        std::env::set_var("OXIDNN_CONV_IGEMM_TILE", tile);
                    }
                    let case = IgemmShape {
                        filter: &[7, 7],
                        pad: 3,
                        stride: &[2, 2],
                        ..igemm(dtype, n, 3, 64, &[224, 224])
                    }
                    .case();
                    let mut r = rng(7);
                    let x = h.upload_tensor(&random(case.x, -1.0, 1.0, &mut r)).unwrap();
                    let w = h
                        .upload_tensor(&random(*case.w.tensor(), -1.0, 1.0, &mut r))
                        .unwrap();
                    let mut y = h.alloc(&case.y).unwrap();
                    let algo = ConvFwdAlgo::ImplicitGemmTensorOp;
                    let bytes = convolution_forward_workspace_size(
                        h, &case.x, &case.w, &case.conv, &case.y, algo,
                    )
                    .unwrap();
                    let mut ws = h.alloc_bytes(bytes.max(1)).unwrap();
                    let mut run = || {
                        convolution_forward(
                            h,
                            1.0,
                            &case.x,
                            &x,
                            &case.w,
                            &w,
                            &case.conv,
                            algo,
                            Some(&mut ws),
                            0.0,
                            &case.y,
                            &mut y,
                        )
                    };
                    if let Err(e) = run() {
                        println!("padded conv1 {dtype} N={n} unit {unit} tile {tile:?}: {e}");
                        continue;
                    }
                    h.synchronize().unwrap();
                    let mut times = Vec::new();
                    for _ in 0..7 {
                        let t = std::time::Instant::now();
                        for _ in 0..10 {
                            run().unwrap();
                        }
                        h.synchronize().unwrap();
                        times.push(t.elapsed().as_secs_f64() / 10.0);
                    }
                    times.sort_by(f64::total_cmp);
                    let flops = 2.0 * (case.y.dims().iter().product::<usize>() * 3 * 49) as f64;
                    println!(
                        "padded conv1 {dtype} N={n} unit {unit:>2} tile {:>9}: {:8.1} us {:6.1} TFLOPS (workspace {} MB)",
                        if tile.is_empty() { "heuristic" } else { tile },
                        times[3] * 1e6,
                        flops / times[3] / 1e12,
                        bytes >> 20
                    );
                }
            }
        }
    }
    std::env::remove_var("OXIDNN_CONV_PAD_UNIT");
    std::env::remove_var("OXIDNN_CONV_IGEMM_TILE");
}

// ---------------------------------------------------------------------------------------
// Gemm1x1 on short K (the matmul core's short-K tiles)
// ---------------------------------------------------------------------------------------

/// 1x1 convolutions of ResNet-50 whose GEMM has a short K (`find`, median of 5):
/// `cargo test --release --test convolution -- --ignored --nocapture time_gemm1x1_short_k`.
#[test]
#[ignore]
fn time_gemm1x1_short_k() {
    let Some(h) = gpu() else {
        return;
    };
    for (label, dt, math, layout, dims) in [
        (
            "res2a_branch1 c64k256 56x56 f16 NHWC",
            DataType::F16,
            MathType::TensorOp,
            Layout::ChannelsLast,
            (32, 64, 256, [56, 56]),
        ),
        (
            "res2a_branch2a c64k64 56x56 f16 NHWC",
            DataType::F16,
            MathType::TensorOp,
            Layout::ChannelsLast,
            (32, 64, 64, [56, 56]),
        ),
        (
            "res3a_branch2c c128k512 28x28 f16 NHWC",
            DataType::F16,
            MathType::TensorOp,
            Layout::ChannelsLast,
            (32, 128, 512, [28, 28]),
        ),
        (
            "c256k64 56x56 f32 NCHW Fma",
            DataType::F32,
            MathType::Fma,
            Layout::ChannelsFirst,
            (32, 256, 64, [56, 56]),
        ),
    ] {
        let case = case2d(dt, math, dims, (1, 0, 1, 1, 1), layout, XCORR);
        let mut r = rng(7);
        let x = h.upload_tensor(&random(case.x, -1.0, 1.0, &mut r)).unwrap();
        let w = h
            .upload_tensor(&random(*case.w.tensor(), -1.0, 1.0, &mut r))
            .unwrap();
        let mut y = h.alloc(&case.y).unwrap();
        let found = find_convolution_forward_algorithm(
            h, &case.x, &x, &case.w, &w, &case.conv, &case.y, &mut y, None,
        )
        .unwrap();
        let line: Vec<_> = found
            .iter()
            .map(|p| format!("{:?} {:.4}", p.algo, p.time_ms))
            .collect();
        println!("{label}: {}", line.join(", "));
    }
}

// ---------------------------------------------------------------------------------------
// Gemm1x1 on strided pixels (packed into the workspace first)
// ---------------------------------------------------------------------------------------

/// A strided 1x1 convolution over channels-last x (one short pixel run per output row)
/// runs as one matmul over x's sampled pixels packed into the workspace: exact on
/// integers with a bias, a residual, beta and relu, for every dtype, odd sizes, both
/// strides even and not, pixels of whole 16-byte chunks (packed chunk by chunk) and not
/// (12 f16 channels: element by element); its workspace is the packed pixels, and a
/// short one is refused.
#[test]
fn gemm1x1_packs_strided_pixels_into_the_workspace() {
    use DataType::{BF16, F16, F32};
    for h in handles() {
        for (i, (dt, math, dims, stride)) in [
            (F16, MathType::TensorOp, (3, 24, 40, [15, 15]), 2),
            (F16, MathType::TensorOp, (2, 12, 16, [11, 11]), 2),
            (BF16, MathType::TensorOp, (2, 64, 72, [28, 28]), 2),
            (F32, MathType::Fma, (2, 16, 24, [13, 9]), 3),
            (F32, MathType::Tf32, (1, 32, 8, [9, 17]), 2),
        ]
        .into_iter()
        .enumerate()
        {
            let case = case2d(
                dt,
                math,
                dims,
                (1, 0, stride, 1, 1),
                Layout::ChannelsLast,
                XCORR,
            );
            let algo = ConvFwdAlgo::Gemm1x1;
            let bytes =
                convolution_forward_workspace_size(h, &case.x, &case.w, &case.conv, &case.y, algo)
                    .unwrap();
            let y = case.y.dims();
            assert_eq!(
                bytes,
                y[0] * y[2] * y[3] * dims.1 * dt.size_bytes(),
                "{case:?}"
            );
            let x = h.alloc(&case.x).unwrap();
            let w = h.alloc(case.w.tensor()).unwrap();
            let mut out = h.alloc(&case.y).unwrap();
            let mut short = h.alloc_bytes(bytes - 1).unwrap();
            let result = convolution_forward(
                h,
                1.0,
                &case.x,
                &x,
                &case.w,
                &w,
                &case.conv,
                algo,
                Some(&mut short),
                0.0,
                &case.y,
                &mut out,
            );
            if h.is_gpu() {
                assert!(
                    matches!(result, Err(Error::WorkspaceTooSmall { .. })),
                    "{result:?}"
                );
            }
            check_forced(h, case, algo, math != MathType::Tf32, 40 + i as u64);
        }
        // Unstrided, the pixels are read where they lie: no workspace.
        let case = case2d(
            F16,
            MathType::TensorOp,
            (2, 16, 16, [8, 8]),
            (1, 0, 1, 1, 1),
            Layout::ChannelsLast,
            XCORR,
        );
        let bytes = convolution_forward_workspace_size(
            h,
            &case.x,
            &case.w,
            &case.conv,
            &case.y,
            ConvFwdAlgo::Gemm1x1,
        )
        .unwrap();
        assert_eq!(bytes, 0);
    }
}
