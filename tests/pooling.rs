//! Pooling: the descriptor's rules and the output-dim query; hand cases with exact values
//! on every handle; the GPU against the f64 reference over drawn ranks, shapes, windows,
//! paddings, strides, layouts, dtypes, modes, NaN options and alpha/beta, forward and
//! backward; every kernel path (global, vectorised NHWC, strips, cells, gather) by name;
//! the global path against the general kernel; determinism; and bad inputs on every
//! handle.

mod common;

use common::*;
use oxidnn::ops::pooling::{
    pooling_backward_kernel, pooling_backward_with, pooling_forward_kernel, PoolingBwdAlgo,
};
use oxidnn::reference::pooling as reference;
use oxidnn::*;
use proptest::prelude::*;
use rand::Rng;

const NOT: PoolingNanOpt = PoolingNanOpt::NotPropagate;
const PROPAGATE: PoolingNanOpt = PoolingNanOpt::Propagate;

fn pool2d(mode: PoolingMode, window: usize, pad: usize, stride: usize) -> PoolingDescriptor {
    PoolingDescriptor::new_2d(mode, NOT, [window; 2], [pad; 2], [stride; 2]).unwrap()
}

/// The pooled descriptor of `x` laid out like `x` (channels first or last).
fn pooled(pool: &PoolingDescriptor, x: &TensorDescriptor, layout: Layout) -> TensorDescriptor {
    let dims = pooling_forward_output_dims(pool, x).unwrap();
    TensorDescriptor::spatial(x.dtype(), dims[0], dims[1], &dims[2..], layout).unwrap()
}

/// Runs the forward on `h` and returns y's logical elements.
fn forward(
    h: &Handle,
    pool: &PoolingDescriptor,
    x: &HostTensor,
    y_desc: &TensorDescriptor,
) -> Vec<f64> {
    let xb = h.upload_tensor(x).unwrap();
    let mut y = h.alloc(y_desc).unwrap();
    pooling_forward(h, pool, 1.0, &x.desc, &xb, 0.0, y_desc, &mut y).unwrap();
    h.download_tensor(y_desc, &y).unwrap().logical()
}

/// Runs the backward on `h` (y from the reference forward) and returns dx's elements.
fn backward(h: &Handle, pool: &PoolingDescriptor, x: &HostTensor, dy: &HostTensor) -> Vec<f64> {
    let mut y = HostTensor::filled(dy.desc, 0.0);
    reference::forward(pool, 1.0, x, 0.0, &mut y);
    let (xb, yb, dyb) = (
        h.upload_tensor(x).unwrap(),
        h.upload_tensor(&y).unwrap(),
        h.upload_tensor(dy).unwrap(),
    );
    let mut dx = h.alloc(&x.desc).unwrap();
    pooling_backward(
        h, pool, 1.0, &dy.desc, &yb, &dy.desc, &dyb, &x.desc, &xb, 0.0, &x.desc, &mut dx,
    )
    .unwrap();
    h.download_tensor(&x.desc, &dx).unwrap().logical()
}

fn nchw(
    dt: DataType,
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    f: impl Fn(&[usize]) -> f64,
) -> HostTensor {
    HostTensor::from_fn(TensorDescriptor::nchw(dt, n, c, h, w).unwrap(), |i| f(i))
}

/// The dtypes a handle runs: f64 and f32 on the CPU, the GPU types on a GPU.
fn dtypes(h: &Handle) -> Vec<DataType> {
    if h.is_gpu() {
        DataType::GPU.to_vec()
    } else {
        vec![DataType::F64, DataType::F32]
    }
}

// ---------------------------------------------------------------------------------------
// The descriptor and the output-dim query
// ---------------------------------------------------------------------------------------

#[test]
fn output_dims_follow_cudnns_floor_formula() {
    let x = TensorDescriptor::nchw(DataType::F32, 32, 64, 112, 112).unwrap();
    // ResNet-50's stem: 3x3, stride 2, padding 1: 1 + (112 + 2 - 3) / 2 = 56.
    let stem = pool2d(PoolingMode::Max, 3, 1, 2);
    assert_eq!(
        pooling_forward_output_dims(&stem, &x).unwrap(),
        [32, 64, 56, 56]
    );
    // The last input row/column no window reaches is dropped: 1 + (5 - 2) / 2 = 2.
    let x5 = TensorDescriptor::nchw(DataType::F32, 1, 1, 5, 7).unwrap();
    assert_eq!(
        pooling_forward_output_dims(&pool2d(PoolingMode::Max, 2, 0, 2), &x5).unwrap(),
        [1, 1, 2, 3]
    );
    // Rectangular windows, 3-D and 1-D.
    let rect = PoolingDescriptor::new_2d(PoolingMode::Max, NOT, [1, 3], [0, 2], [1, 3]).unwrap();
    assert_eq!(
        pooling_forward_output_dims(&rect, &x5).unwrap(),
        [1, 1, 5, 3]
    );
    let x3 = TensorDescriptor::spatial(DataType::F16, 8, 64, &[16, 56, 56], Layout::ChannelsLast)
        .unwrap();
    let cube = PoolingDescriptor::new_nd(PoolingMode::Max, NOT, &[2, 2, 2], &[0, 0, 0], &[2, 2, 2])
        .unwrap();
    assert_eq!(
        pooling_forward_output_dims(&cube, &x3).unwrap(),
        [8, 64, 8, 28, 28]
    );
    let x1 = TensorDescriptor::packed(DataType::F32, &[2, 3, 10]).unwrap();
    let line = PoolingDescriptor::new_nd(PoolingMode::Max, NOT, &[4], &[1], &[3]).unwrap();
    assert_eq!(pooling_forward_output_dims(&line, &x1).unwrap(), [2, 3, 3]);
    // Global pooling: one output per (n, c).
    let global =
        PoolingDescriptor::global(PoolingMode::AverageCountIncludePadding, NOT, &[112, 112])
            .unwrap();
    assert_eq!(
        pooling_forward_output_dims(&global, &x).unwrap(),
        [32, 64, 1, 1]
    );
}

#[test]
fn output_dims_reject_windows_larger_than_the_padded_input_and_wrong_ranks() {
    let x = TensorDescriptor::nchw(DataType::F32, 1, 1, 4, 4).unwrap();
    // 4 + 2 * 1 = 6 < 7.
    let e = pooling_forward_output_dims(&pool2d(PoolingMode::Max, 7, 1, 1), &x).unwrap_err();
    assert!(matches!(e, Error::BadParam { arg: "pooling", .. }), "{e}");
    // ... while exactly the padded extent fits.
    assert_eq!(
        pooling_forward_output_dims(&pool2d(PoolingMode::Max, 6, 1, 1), &x).unwrap(),
        [1, 1, 1, 1]
    );
    let cube = PoolingDescriptor::new_nd(PoolingMode::Max, NOT, &[2, 2, 2], &[0, 0, 0], &[1, 1, 1])
        .unwrap();
    let e = pooling_forward_output_dims(&cube, &x).unwrap_err();
    assert!(matches!(e, Error::BadParam { arg: "x_desc", .. }), "{e}");
}

#[test]
fn descriptors_reject_bad_windows_paddings_and_strides() {
    let max = PoolingMode::Max;
    let bad = |r: Result<PoolingDescriptor>, arg: &str| match r {
        Err(Error::BadParam { arg: a, .. }) => assert_eq!(a, arg),
        other => panic!("expected a bad `{arg}`, got {other:?}"),
    };
    bad(
        PoolingDescriptor::new_2d(max, NOT, [0, 3], [0, 0], [1, 1]),
        "window",
    );
    bad(
        PoolingDescriptor::new_2d(max, NOT, [3, 3], [0, 0], [1, 0]),
        "stride",
    );
    // Padding must be smaller than the window, so every window holds an input.
    bad(
        PoolingDescriptor::new_2d(max, NOT, [3, 3], [3, 0], [1, 1]),
        "padding",
    );
    bad(
        PoolingDescriptor::new_2d(max, NOT, [2, 2], [0, 5], [1, 1]),
        "padding",
    );
    bad(PoolingDescriptor::new_nd(max, NOT, &[], &[], &[]), "window");
    bad(
        PoolingDescriptor::new_nd(max, NOT, &[2; 4], &[0; 4], &[1; 4]),
        "window",
    );
    bad(
        PoolingDescriptor::new_nd(max, NOT, &[2, 2], &[0], &[1, 1]),
        "padding",
    );
    bad(
        PoolingDescriptor::new_nd(max, NOT, &[2, 2], &[0, 0], &[1, 1, 1]),
        "stride",
    );
    bad(
        PoolingDescriptor::new_nd(max, NOT, &[1 << 40], &[0], &[1]),
        "window",
    );
    let p = PoolingDescriptor::new_2d(
        PoolingMode::AverageCountExcludePadding,
        PROPAGATE,
        [3, 2],
        [1, 0],
        [2, 1],
    )
    .unwrap();
    assert_eq!(
        (p.window(), p.padding(), p.stride()),
        (&[3, 2][..], &[1, 0][..], &[2, 1][..])
    );
    assert_eq!(
        (p.mode(), p.nan_opt(), p.spatial_dims()),
        (PoolingMode::AverageCountExcludePadding, PROPAGATE, 2)
    );
}

// ---------------------------------------------------------------------------------------
// Hand cases, every handle
// ---------------------------------------------------------------------------------------

#[test]
fn max_and_average_of_a_4x4_image_are_exact() {
    for h in handles() {
        for dt in dtypes(h) {
            // x[i][j] = 4 i + j.
            let x = nchw(dt, 1, 1, 4, 4, |i| (4 * i[2] + i[3]) as f64);
            let y = TensorDescriptor::nchw(dt, 1, 1, 2, 2).unwrap();
            let max = forward(h, &pool2d(PoolingMode::Max, 2, 0, 2), &x, &y);
            assert_eq!(max, [5.0, 7.0, 13.0, 15.0], "{dt} on {h:?}");
            let avg = forward(
                h,
                &pool2d(PoolingMode::AverageCountIncludePadding, 2, 0, 2),
                &x,
                &y,
            );
            assert_eq!(avg, [2.5, 4.5, 10.5, 12.5], "{dt} on {h:?}");
            // 3x3, stride 2, padding 1: windows clipped at the top-left border.
            let stem = pool2d(PoolingMode::Max, 3, 1, 2);
            assert_eq!(
                forward(h, &stem, &x, &y),
                [5.0, 7.0, 13.0, 15.0],
                "{dt} on {h:?}"
            );
            // 2x2, stride 2, padding 1: the corner windows hold one input, edges two.
            let y3 = TensorDescriptor::nchw(dt, 1, 1, 3, 3).unwrap();
            let include = forward(
                h,
                &pool2d(PoolingMode::AverageCountIncludePadding, 2, 1, 2),
                &x,
                &y3,
            );
            assert_eq!(
                include,
                [0.0, 0.75, 0.75, 3.0, 7.5, 4.5, 3.0, 6.75, 3.75],
                "{dt} on {h:?}"
            );
            let exclude = forward(
                h,
                &pool2d(PoolingMode::AverageCountExcludePadding, 2, 1, 2),
                &x,
                &y3,
            );
            assert_eq!(
                exclude,
                [0.0, 1.5, 3.0, 6.0, 7.5, 9.0, 12.0, 13.5, 15.0],
                "{dt} on {h:?}"
            );
        }
    }
}

#[test]
fn max_pooling_skips_or_propagates_nan_as_asked() {
    for h in handles() {
        for dt in dtypes(h) {
            // Window 0 holds a NaN among finite values, window 1 only NaNs.
            let x = nchw(dt, 1, 1, 1, 4, |i| {
                [1.0, f64::NAN, f64::NAN, f64::NAN][i[3]]
            });
            let y = TensorDescriptor::nchw(dt, 1, 1, 1, 2).unwrap();
            let skip =
                PoolingDescriptor::new_2d(PoolingMode::Max, NOT, [1, 2], [0, 0], [1, 2]).unwrap();
            assert_eq!(
                forward(h, &skip, &x, &y),
                [1.0, f64::NEG_INFINITY],
                "{dt} on {h:?}"
            );
            let keep =
                PoolingDescriptor::new_2d(PoolingMode::Max, PROPAGATE, [1, 2], [0, 0], [1, 2])
                    .unwrap();
            assert!(
                forward(h, &keep, &x, &y).iter().all(|v| v.is_nan()),
                "{dt} on {h:?}"
            );
        }
    }
}

#[test]
fn max_backward_sends_each_windows_gradient_to_its_first_maximum() {
    for h in handles() {
        for dt in dtypes(h) {
            let dy = nchw(dt, 1, 1, 1, 2, |i| [3.0, 5.0][i[3]]);
            let pool = pool2d(PoolingMode::Max, 2, 0, 2);
            // Window 0: a four-way tie, the first element in scan order takes it. Window
            // 1: 7 at (0, 3) and (1, 2); row 0 comes first.
            let x = nchw(dt, 1, 1, 2, 4, |i| {
                [[1.0, 1.0, 2.0, 7.0], [1.0, 1.0, 7.0, 0.0]][i[2]][i[3]]
            });
            assert_eq!(
                backward(h, &pool, &x, &dy),
                [3.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0],
                "{dt} on {h:?}"
            );
            // Overlapping windows (3x3, stride 1) share a maximum: its gradients add up.
            let x = nchw(dt, 1, 1, 3, 4, |i| {
                if i[2] == 1 && i[3] == 1 {
                    9.0
                } else {
                    0.0
                }
            });
            let dy = nchw(dt, 1, 1, 1, 2, |i| [3.0, 5.0][i[3]]);
            let dx = backward(h, &pool2d(PoolingMode::MaxDeterministic, 3, 0, 1), &x, &dy);
            assert_eq!(dx[5], 8.0, "{dt} on {h:?}");
            assert_eq!(dx.iter().sum::<f64>(), 8.0, "{dt} on {h:?}");
        }
    }
}

#[test]
fn average_backward_spreads_the_gradient_over_the_counted_elements() {
    for h in handles() {
        for dt in dtypes(h) {
            // 2x2, stride 2, padding 1 on 2x2: four windows of one input each; including the
            // padding, each input gets a quarter of its window's gradient.
            let x = nchw(dt, 1, 1, 2, 2, |_| 1.0);
            let dy = nchw(dt, 1, 1, 2, 2, |i| (4 + 4 * (2 * i[2] + i[3])) as f64);
            let include = backward(
                h,
                &pool2d(PoolingMode::AverageCountIncludePadding, 2, 1, 2),
                &x,
                &dy,
            );
            assert_eq!(include, [1.0, 2.0, 3.0, 4.0], "{dt} on {h:?}");
            let exclude = backward(
                h,
                &pool2d(PoolingMode::AverageCountExcludePadding, 2, 1, 2),
                &x,
                &dy,
            );
            assert_eq!(exclude, [4.0, 8.0, 12.0, 16.0], "{dt} on {h:?}");
            // Overlapping 2x2 windows, stride 1, on 3x3: the centre is in all four.
            let x = nchw(dt, 1, 1, 3, 3, |_| 0.0);
            let dy = nchw(dt, 1, 1, 2, 2, |_| 4.0);
            let dx = backward(
                h,
                &pool2d(PoolingMode::AverageCountIncludePadding, 2, 0, 1),
                &x,
                &dy,
            );
            assert_eq!(
                dx,
                [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0],
                "{dt} on {h:?}"
            );
        }
    }
}

#[test]
fn three_d_pooling_reduces_the_whole_cube() {
    for h in handles() {
        for dt in dtypes(h) {
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                let xd = TensorDescriptor::spatial(dt, 1, 2, &[2, 2, 2], layout).unwrap();
                // Channel c holds 8 c + 0..7 in scan order.
                let x = HostTensor::from_fn(xd, |i| (8 * i[1] + 4 * i[2] + 2 * i[3] + i[4]) as f64);
                let cube = PoolingDescriptor::new_nd(
                    PoolingMode::Max,
                    NOT,
                    &[2, 2, 2],
                    &[0, 0, 0],
                    &[2, 2, 2],
                )
                .unwrap();
                let yd = pooled(&cube, &xd, layout);
                assert_eq!(
                    forward(h, &cube, &x, &yd),
                    [7.0, 15.0],
                    "{dt} {layout:?} on {h:?}"
                );
                let dy = HostTensor::from_fn(yd, |i| (1 + i[1]) as f64);
                let dx = backward(h, &cube, &x, &dy);
                let mut want = vec![0.0; 16];
                want[7] = 1.0;
                want[15] = 2.0;
                assert_eq!(dx, want, "{dt} {layout:?} on {h:?}");
                let avg = PoolingDescriptor::new_nd(
                    PoolingMode::AverageCountIncludePadding,
                    NOT,
                    &[2, 2, 2],
                    &[0, 0, 0],
                    &[2, 2, 2],
                )
                .unwrap();
                assert_eq!(
                    forward(h, &avg, &x, &yd),
                    [3.5, 11.5],
                    "{dt} {layout:?} on {h:?}"
                );
            }
        }
    }
}

#[test]
fn alpha_and_beta_blend_into_the_output() {
    for h in handles() {
        let x = nchw(DataType::F32, 1, 1, 2, 2, |i| (2 * i[2] + i[3]) as f64);
        let yd = TensorDescriptor::nchw(DataType::F32, 1, 1, 1, 1).unwrap();
        let xb = h.upload_tensor(&x).unwrap();
        let mut y = h.upload(&[10.0f32]).unwrap();
        let pool = pool2d(PoolingMode::Max, 2, 0, 2);
        pooling_forward(h, &pool, 2.0, &x.desc, &xb, 0.5, &yd, &mut y).unwrap();
        assert_eq!(h.read::<f32>(&y).unwrap(), [11.0], "{h:?}");
        // beta = 0 never reads y: NaN there does not leak.
        let mut y = h.upload(&[f32::NAN]).unwrap();
        pooling_forward(h, &pool, 1.0, &x.desc, &xb, 0.0, &yd, &mut y).unwrap();
        assert_eq!(h.read::<f32>(&y).unwrap(), [3.0], "{h:?}");
    }
}

// ---------------------------------------------------------------------------------------
// The GPU against the reference
// ---------------------------------------------------------------------------------------

/// What a drawn problem's inputs hold.
#[derive(Clone, Copy, Debug)]
enum Data {
    /// Uniform in [-2, 2).
    Uniform,
    /// Integers 0..4: ties in most windows, exact sums.
    SmallIntegers,
    /// Uniform with about one NaN in 16.
    WithNan,
    /// NaN but for about one element in 4: many windows, edge ones too, hold only NaN.
    MostlyNan,
}

#[derive(Clone, Debug)]
struct Problem {
    pool: PoolingDescriptor,
    x: TensorDescriptor,
    y: TensorDescriptor,
    ab: (f64, f64),
    data: Data,
    seed: u64,
}

/// A memory layout of `dims`: dense channels first, dense channels last, or any dim order
/// with gaps.
fn any_layout(dims: Vec<usize>, dtype: DataType) -> BoxedStrategy<TensorDescriptor> {
    let spatial = dims[2..].to_vec();
    let (n, c) = (dims[0], dims[1]);
    prop_oneof![
        2 => Just(TensorDescriptor::spatial(dtype, n, c, &spatial, Layout::ChannelsFirst).unwrap()),
        2 => Just(TensorDescriptor::spatial(dtype, n, c, &spatial, Layout::ChannelsLast).unwrap()),
        1 => layout(dims, dtype),
    ]
    .boxed()
}

/// Spatial rank 1 to 3; per spatial dim an extent, a window up to 4 that fits the padded
/// extent, a padding below it and a stride up to 3; N, C and the extents include 1 and primes.
fn problem() -> impl Strategy<Value = Problem> {
    let dim = (
        prop::sample::select(vec![1usize, 2, 3, 5, 7, 8, 13]),
        1usize..=4,
        0usize..3,
        1usize..=3,
    );
    let modes = prop::sample::select(PoolingMode::ALL.to_vec());
    let nan = prop::sample::select(vec![NOT, PROPAGATE]);
    let data = prop_oneof![
        Just(Data::Uniform),
        Just(Data::SmallIntegers),
        Just(Data::WithNan)
    ];
    (
        prop::collection::vec(dim, 1..=3),
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![1usize, 2, 3, 5, 8, 16, 24]),
        modes,
        nan,
        gpu_dtype(),
    )
        .prop_flat_map(move |(spatial, n, c, mode, nan, dtype)| {
            let (mut extents, mut window, mut pad, mut stride) = (vec![], vec![], vec![], vec![]);
            for (e, k, p, s) in spatial {
                let p = p.min(k - 1);
                extents.push(e);
                window.push(k.min(e + 2 * p));
                pad.push(p);
                stride.push(s);
            }
            // At most ~12K elements, for the reference's sake.
            while n * c * extents.iter().product::<usize>() > 12_000 {
                let i = (0..extents.len()).max_by_key(|&i| extents[i]).unwrap_or(0);
                extents[i] = (extents[i] / 2).max(1);
                window[i] = window[i].min(extents[i] + 2 * pad[i]);
            }
            let pool = PoolingDescriptor::new_nd(mode, nan, &window, &pad, &stride).unwrap();
            let mut dims = vec![n, c];
            dims.extend_from_slice(&extents);
            let x0 = TensorDescriptor::packed(dtype, &dims).unwrap();
            let ydims = pooling_forward_output_dims(&pool, &x0).unwrap();
            (
                Just(pool),
                any_layout(dims, dtype),
                any_layout(ydims, dtype),
                alpha_beta(),
                data.clone(),
                any::<u64>(),
            )
        })
        .prop_map(|(pool, x, y, ab, data, seed)| Problem {
            pool,
            x,
            y,
            ab,
            data,
            seed,
        })
}

fn draw(desc: TensorDescriptor, data: Data, r: &mut impl Rng) -> HostTensor {
    HostTensor::from_fn(desc, |_| match data {
        Data::Uniform => r.gen_range(-2.0..2.0),
        Data::SmallIntegers => r.gen_range(0..4) as f64,
        Data::WithNan if r.gen_ratio(1, 16) => f64::NAN,
        Data::WithNan => r.gen_range(-2.0..2.0),
        Data::MostlyNan if r.gen_ratio(1, 4) => r.gen_range(-2.0..2.0),
        Data::MostlyNan => f64::NAN,
    })
}

/// Exact where the arithmetic is: max forward and max backward of integers, unblended.
fn tolerance(p: &Problem, max_exact: bool) -> f64 {
    if p.pool.mode().is_max() && max_exact && p.ab == (1.0, 0.0) {
        0.0
    } else {
        bound(p.x.dtype())
    }
}

fn check_forward(h: &Handle, p: &Problem) {
    let mut r = rng(p.seed);
    let xt = draw(p.x, p.data, &mut r);
    let y0 = random(p.y, -1.0, 1.0, &mut r);
    let (alpha, beta) = p.ab;
    let x = upload_poisoned(h, &xt, false);
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    pooling_forward(h, &p.pool, alpha, &p.x, &x, beta, &p.y, &mut y).unwrap();
    let mut want = y0.clone();
    reference::forward(&p.pool, alpha, &xt, beta, &mut want);
    let what = format!(
        "forward {:?} {} -> {}",
        p.pool,
        p.x.problem_string(),
        p.y.problem_string()
    );
    check(h, &p.y, &y, &want, tolerance(p, true), &what);
}

/// Checks the backward of `p` against the reference, with `algo` forced if given.
fn check_backward(h: &Handle, p: &Problem, algo: Option<PoolingBwdAlgo>) {
    let mut r = rng(p.seed);
    let xt = draw(p.x, p.data, &mut r);
    let mut yt = HostTensor::filled(p.y, 0.0);
    reference::forward(&p.pool, 1.0, &xt, 0.0, &mut yt);
    // dy in y's layout; integers where the data are, so that max sums are exact.
    let dyt = match p.data {
        Data::SmallIntegers => HostTensor::from_fn(p.y, |_| r.gen_range(1..8) as f64),
        _ => random(p.y, -1.0, 1.0, &mut r),
    };
    let dx0 = random(p.x, -1.0, 1.0, &mut r);
    let (alpha, beta) = p.ab;
    let (x, y, dy) = (
        upload_poisoned(h, &xt, false),
        upload_poisoned(h, &yt, false),
        upload_poisoned(h, &dyt, false),
    );
    let mut dx = upload_poisoned(h, &dx0, beta == 0.0);
    match algo {
        None => pooling_backward(
            h, &p.pool, alpha, &p.y, &y, &p.y, &dy, &p.x, &x, beta, &p.x, &mut dx,
        ),
        Some(a) => pooling_backward_with(
            h, a, &p.pool, alpha, &p.y, &y, &p.y, &dy, &p.x, &x, beta, &p.x, &mut dx,
        ),
    }
    .unwrap();
    let mut want = dx0.clone();
    reference::backward(&p.pool, alpha, &yt, &dyt, &xt, beta, &mut want);
    let exact = matches!(p.data, Data::SmallIntegers);
    let kernel = pooling_backward_kernel(h, algo, &p.pool, &p.x, &p.y, &p.y, &p.x).unwrap();
    let what = format!(
        "backward ({kernel}) {:?} {} <- {}",
        p.pool,
        p.x.problem_string(),
        p.y.problem_string()
    );
    check(h, &p.x, &dx, &want, tolerance(p, exact), &what);
}

proptest! {
    #![proptest_config(gpu_cases(160))]

    #[test]
    fn gpu_forward_matches_reference(p in problem()) {
        with_gpu("gpu_forward_matches_reference", |h| check_forward(h, &p));
    }

    #[test]
    fn gpu_backward_matches_reference(p in problem()) {
        with_gpu("gpu_backward_matches_reference", |h| check_backward(h, &p, None));
    }
}

// ---------------------------------------------------------------------------------------
// Every path by name
// ---------------------------------------------------------------------------------------

/// A problem on dense tensors of `layout`, with the data and blend given.
fn dense_problem(
    pool: PoolingDescriptor,
    dtype: DataType,
    dims: &[usize],
    layout: Layout,
    data: Data,
    ab: (f64, f64),
) -> Problem {
    let x = TensorDescriptor::spatial(dtype, dims[0], dims[1], &dims[2..], layout).unwrap();
    Problem {
        y: pooled(&pool, &x, layout),
        pool,
        x,
        ab,
        data,
        seed: dims.iter().sum::<usize>() as u64,
    }
}

/// The inputs every kernel is checked on: uniform data, small integers (ties, exact sums),
/// NaNs, each unblended, and uniform data under an alpha/beta blend.
const DATA_AND_BLENDS: [(Data, (f64, f64)); 4] = [
    (Data::Uniform, (1.0, 0.0)),
    (Data::SmallIntegers, (1.0, 0.0)),
    (Data::WithNan, (1.0, 0.0)),
    (Data::Uniform, (-1.5, 0.25)),
];

/// The forward strip kernel of window shape `shape` (`3x3s1p1`, ..) over dense rows of `w`
/// elements of `dt`: 16-byte vectors where the rows hold whole ones, else 8-byte vectors,
/// else none (the window kernel).
fn strip_kernel(shape: &str, w: usize, dt: DataType) -> String {
    let row_bytes = w * dt.size_bytes();
    if row_bytes.is_multiple_of(16) {
        format!("pooling_fwd_strip_{shape}_{dt}")
    } else if row_bytes.is_multiple_of(8) {
        format!("pooling_fwd_strip8_{shape}_{dt}")
    } else {
        format!("pooling_fwd_window_{dt}")
    }
}

/// A backward case of the kernel tests: window, padding, stride, dims, whether x and dx
/// have gaps between elements, and the kernel (or its shape) the case must take.
type KernelCase = (
    &'static [usize],
    &'static [usize],
    &'static [usize],
    &'static [usize],
    bool,
    &'static str,
);

/// Every kernel, forward and each backward algorithm, on shapes that reach it: global and
/// windowed, channels first and last (vectorised where C allows), 1-D to 3-D, overlapping
/// and disjoint windows, against the reference for every mode and dtype.
#[test]
fn gpu_every_kernel_matches_the_reference() {
    with_gpu("gpu_every_kernel_matches_the_reference", |h| {
        let (first, last) = (Layout::ChannelsFirst, Layout::ChannelsLast);
        // (window, padding, stride, dims, layout, forward kernel)
        type Case = (
            &'static [usize],
            &'static [usize],
            &'static [usize],
            &'static [usize],
            Layout,
            &'static str,
        );
        let cases: [Case; 26] = [
            (
                &[3, 3],
                &[1, 1],
                &[2, 2],
                &[2, 3, 17, 19],
                first,
                "pooling_fwd_window_",
            ),
            (
                &[3, 3],
                &[1, 1],
                &[2, 2],
                &[2, 16, 17, 19],
                last,
                "pooling_fwd_window_vec_3x3_",
            ),
            // Channel vectors under a window no kernel is compiled for: the general one.
            (
                &[2, 3],
                &[1, 1],
                &[1, 2],
                &[2, 16, 9, 11],
                last,
                "pooling_fwd_window_vec_",
            ),
            (
                &[2, 2],
                &[1, 0],
                &[1, 1],
                &[2, 16, 7, 9],
                last,
                "pooling_fwd_window_vec_2x2_",
            ),
            (
                &[3, 3],
                &[1, 1],
                &[2, 2],
                &[2, 3, 17, 19],
                last,
                "pooling_fwd_window_",
            ),
            (
                &[3, 3],
                &[1, 1],
                &[1, 1],
                &[2, 3, 11, 13],
                first,
                "pooling_fwd_window_",
            ),
            (
                &[3, 3],
                &[0, 0],
                &[3, 3],
                &[2, 16, 11, 13],
                last,
                "pooling_fwd_window_vec_3x3_",
            ),
            (
                &[2, 2, 2],
                &[0, 1, 0],
                &[2, 2, 2],
                &[2, 16, 5, 6, 7],
                last,
                "pooling_fwd_window_vec_2x2x2_",
            ),
            (
                &[2, 2, 2],
                &[1, 0, 1],
                &[2, 2, 2],
                &[2, 3, 5, 6, 7],
                first,
                "pooling_fwd_window_",
            ),
            (&[4], &[1], &[3], &[3, 5, 23], first, "pooling_fwd_window_"),
            // The other square windows the max cell kernels are compiled for (2x2 and 3x3
            // at strides 1 and 2), one with a depth window of 1.
            (
                &[2, 2],
                &[0, 0],
                &[2, 2],
                &[2, 3, 17, 19],
                first,
                "pooling_fwd_window_",
            ),
            (
                &[2, 2],
                &[1, 1],
                &[1, 1],
                &[2, 3, 11, 13],
                first,
                "pooling_fwd_window_",
            ),
            // (Rows of 10 are whole 8-byte vectors of f32: its 8-byte strip.)
            (
                &[1, 3, 3],
                &[0, 1, 1],
                &[1, 2, 2],
                &[2, 3, 3, 9, 10],
                first,
                "pooling_fwd_strip_3x3s2p1_",
            ),
            // The forward strip kernels: rows of whole 16-byte vectors of every dtype (w a
            // multiple of 8), odd and prime h, strips cut short at the row's end and rows
            // of y not aligned for a vector store (11 and 7 outputs along w), padding
            // along h other than along w.
            (
                &[3, 3],
                &[1, 1],
                &[2, 2],
                &[2, 3, 17, 24],
                first,
                "pooling_fwd_strip_3x3s2p1_",
            ),
            (
                &[3, 3],
                &[1, 0],
                &[2, 2],
                &[2, 3, 11, 24],
                first,
                "pooling_fwd_strip_3x3s2p0_",
            ),
            (
                &[3, 3],
                &[0, 1],
                &[1, 1],
                &[2, 3, 7, 16],
                first,
                "pooling_fwd_strip_3x3s1p1_",
            ),
            (
                &[2, 2],
                &[0, 0],
                &[2, 2],
                &[2, 3, 9, 16],
                first,
                "pooling_fwd_strip_2x2s2p0_",
            ),
            (
                &[2, 2],
                &[1, 0],
                &[1, 1],
                &[2, 3, 5, 8],
                first,
                "pooling_fwd_strip_2x2s1p0_",
            ),
            (
                &[2, 2, 2],
                &[1, 1, 0],
                &[2, 2, 2],
                &[2, 3, 5, 7, 16],
                first,
                "pooling_fwd_strip_2x2x2s2p0_",
            ),
            // Rows of whole 8-byte vectors but not 16-byte ones: 28 and 12 elements of the
            // 16-bit types, 14 of f32 (whose other rows here take 16-byte strips).
            (
                &[3, 3],
                &[1, 1],
                &[1, 1],
                &[2, 3, 7, 28],
                first,
                "pooling_fwd_strip_3x3s1p1_",
            ),
            (
                &[2, 2],
                &[0, 0],
                &[2, 2],
                &[2, 3, 9, 12],
                first,
                "pooling_fwd_strip_2x2s2p0_",
            ),
            (
                &[3, 3],
                &[1, 1],
                &[2, 2],
                &[2, 3, 11, 14],
                first,
                "pooling_fwd_strip_3x3s2p1_",
            ),
            // 16-bit planes of up to 57 elements back to back: a thread a plane (f32:
            // staged, a warp per 32 planes).
            (
                &[7, 7],
                &[0, 0],
                &[1, 1],
                &[3, 5, 7, 7],
                first,
                "pooling_fwd_global_lane_",
            ),
            // Longer f32 planes of at most 128 elements: staged (16-bit: a group of
            // lanes a plane).
            (
                &[8, 8],
                &[0, 0],
                &[1, 1],
                &[3, 5, 8, 8],
                first,
                "pooling_fwd_global_staged_",
            ),
            (
                &[7, 7],
                &[0, 0],
                &[7, 7],
                &[3, 32, 7, 7],
                last,
                "pooling_fwd_global_vec_",
            ),
            // A long reduction over few (n, c): a block per output.
            (
                &[96, 96],
                &[0, 0],
                &[1, 1],
                &[1, 3, 96, 96],
                first,
                "pooling_fwd_global_",
            ),
        ];
        for (window, padding, stride, dims, layout, fwd) in cases {
            // 16 and 32 channels take whole vectors of every width; 3 and 5 none.
            let vec = layout == last && dims[1] % 8 == 0;
            let cell: usize = stride.iter().product();
            let global = window == &dims[2..] && padding.iter().all(|&p| p == 0);
            let volume: usize = window.iter().product();
            // Square 2-D windows (or a depth window of 1, unpadded) of the shapes the max
            // cell kernels are compiled for take them: 2x2/s2, 2x2/s1 unpadded along w,
            // 3x3/s2 unpadded or padded by 1 along w, 3x3/s1 padded by 1.
            let compiled = [(2, 2, 0), (2, 1, 0), (3, 2, 0), (3, 2, 1), (3, 1, 1)];
            let shaped_cell = match (window, stride, padding) {
                (&[1, a, b], &[1, s, t], &[0, _, pw]) | (&[a, b], &[s, t], &[_, pw])
                    if a == b && s == t && compiled.contains(&(a, s, pw)) =>
                {
                    Some(format!("{a}x{a}s{s}p{pw}"))
                }
                _ => None,
            };
            // Over channel vectors, the max cell kernels are compiled for square 2-D
            // windows (or a depth window of 1, unpadded) of 2x2 and 3x3 at stride 2, any
            // padding.
            let shaped_cell_vec = match (window, stride, padding) {
                (&[1, a, b], &[1, 2, 2], &[0, _, _]) | (&[a, b], &[2, 2], _)
                    if a == b && (a == 2 || a == 3) =>
                {
                    Some(format!("{a}x{a}s2"))
                }
                _ => None,
            };
            // Over channel vectors, 3x3 windows at stride 2 or 1 (any padding) walk down
            // bands of rows.
            let walk_vec = match (window, stride, padding) {
                (&[1, 3, 3], &[1, s, t], &[0, _, _]) | (&[3, 3], &[s, t], _)
                    if s == t && (s == 1 || s == 2) =>
                {
                    Some(format!("3x3s{s}"))
                }
                _ => None,
            };
            // Over single channels, the tile backward of 2-D windows (a depth window of 1
            // at stride 1, unpadded) takes bands of rows, in kernels of their own for 2x2
            // unpadded along w and 3x3 unpadded or padded by 1, at stride 1.
            let band = window.len() < 3 || (window[0], stride[0], padding[0]) == (1, 1, 0);
            let band_shape = match (window, stride, padding) {
                (&[1, a, b], &[1, 1, 1], &[0, _, pw]) | (&[a, b], &[1, 1], &[_, pw])
                    if a == b && [(2, 0), (3, 0), (3, 1)].contains(&(a, pw)) =>
                {
                    format!("_{a}x{a}s1p{pw}")
                }
                _ => String::new(),
            };
            // Over single channels whose rows are whole 16-byte vectors (32 at most), 3x3
            // windows at stride 2 (padded by 0 or 1 along w) walk down bands of rows.
            let walk_shape = |dt: DataType| match (window, stride, padding) {
                (&[3, 3], &[2, 2], &[_, pw]) if pw <= 1 && layout == first => {
                    let row = dims[3] * dt.size_bytes();
                    (row.is_multiple_of(16) && row <= 32 * 16).then(|| format!("3x3s2p{pw}"))
                }
                _ => None,
            };
            // Unpadded 2x2/s2 windows over rows of whole 16-byte vectors (channels first)
            // take the disjoint-window strip kernel, for the max and the average.
            let disjoint_strip = |dt: DataType| {
                window == [2, 2]
                    && stride == [2, 2]
                    && padding == [0, 0]
                    && layout == first
                    && (dims[3] * dt.size_bytes()).is_multiple_of(16)
            };
            for mode in PoolingMode::ALL {
                let pool =
                    PoolingDescriptor::new_nd(mode, PROPAGATE, window, padding, stride).unwrap();
                for dt in DataType::GPU {
                    for (data, ab) in DATA_AND_BLENDS {
                        let p = dense_problem(pool, dt, dims, layout, data, ab);
                        let f = pooling_forward_kernel(h, &p.pool, &p.x, &p.y).unwrap();
                        let want = match fwd.strip_prefix("pooling_fwd_strip_") {
                            Some(shape) => {
                                strip_kernel(shape.trim_end_matches('_'), dims[dims.len() - 1], dt)
                            }
                            // The staged global forward runs f32 only, the lane
                            // forward the 16-bit types.
                            None if fwd.ends_with("staged_") && dt != DataType::F32 => {
                                format!("pooling_fwd_global_{dt}")
                            }
                            None if fwd.ends_with("lane_") && dt == DataType::F32 => {
                                format!("pooling_fwd_global_staged_{dt}")
                            }
                            None => format!("{fwd}{dt}"),
                        };
                        assert_eq!(f, want, "forward kernel of {p:?}");
                        check_forward(h, &p);
                        check_backward(h, &p, None);
                        for algo in PoolingBwdAlgo::ALL {
                            let applies = match algo {
                                PoolingBwdAlgo::Gather => true,
                                // Cells of at most 8 elements (global strides count as 1).
                                PoolingBwdAlgo::Cell => global || cell <= 8,
                                // Max, with a band's rows or one cell's windows in 32 KB
                                // of shared memory (the 96x96 global window has neither).
                                PoolingBwdAlgo::Tile => mode.is_max() && (volume <= 64 || !global),
                            };
                            let b = pooling_backward_kernel(
                                h,
                                Some(algo),
                                &p.pool,
                                &p.x,
                                &p.y,
                                &p.y,
                                &p.x,
                            );
                            if !applies {
                                assert!(
                                    matches!(b, Err(Error::NotSupported { .. })),
                                    "{algo:?} on {p:?}: {b:?}"
                                );
                                continue;
                            }
                            let b = b.unwrap();
                            let family = format!("{algo:?}").to_lowercase();
                            let m = if mode.is_max() { "max" } else { "avg" };
                            let want = if let (true, PoolingBwdAlgo::Cell, "max", Some(shape)) =
                                (vec, algo, m, &shaped_cell_vec)
                            {
                                format!("pooling_bwd_cell_vec_max_{shape}_{dt}")
                            } else if (algo, m, global) == (PoolingBwdAlgo::Gather, "avg", true) {
                                // Dense channels-first dx: planes back to back.
                                let how = match (vec, layout == first) {
                                    (true, _) => "vec_avg",
                                    (false, true) => "avg_flat",
                                    (false, false) => "avg",
                                };
                                format!("pooling_bwd_global_{how}_{dt}")
                            } else if let (true, Some(shape), PoolingBwdAlgo::Tile) =
                                (vec, &walk_vec, algo)
                            {
                                format!("pooling_bwd_walk_vec_max_{shape}_{dt}")
                            } else if vec {
                                format!("pooling_bwd_{family}_vec_{m}_{dt}")
                            } else if algo == PoolingBwdAlgo::Cell && disjoint_strip(dt) {
                                format!("pooling_bwd_disjoint_strip_{m}_2x2s2_{dt}")
                            } else if let (PoolingBwdAlgo::Cell, "max", Some(shape)) =
                                (algo, m, &shaped_cell)
                            {
                                format!("pooling_bwd_cell_max_{shape}_{dt}")
                            } else if let (PoolingBwdAlgo::Tile, Some(shape)) =
                                (algo, walk_shape(dt))
                            {
                                format!("pooling_bwd_walk_max_{shape}_{dt}")
                            } else if algo == PoolingBwdAlgo::Tile && band {
                                format!("pooling_bwd_band_max{band_shape}_{dt}")
                            } else {
                                format!("pooling_bwd_{family}_{m}_{dt}")
                            };
                            assert_eq!(b, want, "backward kernel of {p:?}");
                            check_backward(h, &p, Some(algo));
                        }
                    }
                }
            }
        }
    });
}

/// A window shape a forward kernel is compiled for: (name, window, padding, stride).
type KernelWindow = (
    &'static str,
    &'static [usize],
    &'static [usize],
    &'static [usize],
);

/// The forward strip kernels' window shapes; the paddings along d and h are free (the
/// kernels clamp them).
const STRIP_SHAPES: [KernelWindow; 6] = [
    ("2x2s2p0", &[2, 2], &[0, 0], &[2, 2]),
    ("2x2s1p0", &[2, 2], &[1, 0], &[1, 1]),
    ("3x3s2p0", &[3, 3], &[0, 0], &[2, 2]),
    ("3x3s2p1", &[3, 3], &[1, 1], &[2, 2]),
    ("3x3s1p1", &[3, 3], &[1, 1], &[1, 1]),
    ("2x2x2s2p0", &[2, 2, 2], &[1, 0, 0], &[2, 2, 2]),
];

/// Every forward strip shape over rows of whole 8-byte vectors that are not whole 16-byte
/// ones, in each dtype: rows of 14 (f32: its 8-byte strips; 16-bit types: no strip) and 12
/// (16-bit types: their 8-byte strips; f32: its 16-byte strips), every mode, ties, NaN and
/// blends, against the reference.
#[test]
fn gpu_every_strip_shape_over_8_byte_rows_matches_the_reference() {
    with_gpu(
        "gpu_every_strip_shape_over_8_byte_rows_matches_the_reference",
        |h| {
            for (shape, window, padding, stride) in STRIP_SHAPES {
                for w in [14, 12] {
                    let dims: Vec<usize> = if window.len() == 3 {
                        vec![2, 3, 4, 7, w]
                    } else {
                        vec![2, 3, 7, w]
                    };
                    for mode in PoolingMode::ALL {
                        let pool =
                            PoolingDescriptor::new_nd(mode, PROPAGATE, window, padding, stride)
                                .unwrap();
                        for dt in DataType::GPU {
                            for (data, ab) in DATA_AND_BLENDS {
                                let p =
                                    dense_problem(pool, dt, &dims, Layout::ChannelsFirst, data, ab);
                                let f = pooling_forward_kernel(h, &p.pool, &p.x, &p.y).unwrap();
                                assert_eq!(
                                    f,
                                    strip_kernel(shape, w, dt),
                                    "forward kernel of {p:?}"
                                );
                                check_forward(h, &p);
                            }
                        }
                    }
                }
            }
        },
    );
}

/// The forward strips' max over their windows at every edge of x: the strips read each
/// row as whole vectors and clamp rows and columns past the edges to the edge, and the
/// max takes no mask for them (re-reading an element of the same window cannot change a
/// max). Every strip shape over rows of whole 16-byte vectors, both NaN options, windows
/// that hold only NaN (skipped: -inf; propagated: NaN) and values outside each window
/// that would win if a clamp left it, against the reference.
#[test]
fn gpu_strip_max_at_the_edges_takes_only_its_window() {
    with_gpu("gpu_strip_max_at_the_edges_takes_only_its_window", |h| {
        for (shape, window, padding, stride) in STRIP_SHAPES {
            let dims: Vec<usize> = if window.len() == 3 {
                vec![1, 2, 5, 7, 24]
            } else {
                vec![2, 3, 7, 24]
            };
            for nan in [NOT, PROPAGATE] {
                let pool =
                    PoolingDescriptor::new_nd(PoolingMode::Max, nan, window, padding, stride)
                        .unwrap();
                for dt in DataType::GPU {
                    for data in [Data::MostlyNan, Data::WithNan, Data::Uniform] {
                        let p =
                            dense_problem(pool, dt, &dims, Layout::ChannelsFirst, data, (1.0, 0.0));
                        let f = pooling_forward_kernel(h, &p.pool, &p.x, &p.y).unwrap();
                        assert_eq!(f, strip_kernel(shape, 24, dt), "forward kernel of {p:?}");
                        check_forward(h, &p);
                    }
                }
            }
        }
    });
}

/// Channel-vector windows of the shapes a forward kernel is compiled for
/// (`pooling_fwd_window_vec_<shape>_*`): (shape, window, padding, stride). Their strides and
/// paddings are free; these put windows across every edge of x.
const WINDOW_VEC_SHAPES: [KernelWindow; 6] = [
    ("3x3", &[3, 3], &[1, 1], &[2, 2]),
    ("3x3", &[3, 3], &[1, 0], &[1, 1]),
    ("3x3", &[3, 3], &[2, 1], &[3, 2]),
    ("2x2", &[2, 2], &[1, 1], &[1, 1]),
    ("2x2", &[2, 2], &[0, 1], &[2, 2]),
    ("2x2x2", &[2, 2, 2], &[1, 0, 1], &[2, 2, 2]),
];

/// The channel-vector forward kernels compiled for a window shape load a window's
/// positions past x's edges as the edge's (clamped) and take no mask for a max: every
/// shape, every mode and both NaN options, windows that hold only NaN (skipped: -inf;
/// propagated: NaN), ties and a blend, against the reference. No output count here is a
/// multiple of a warp's turn (64 outputs), so the last turn has outputs past the end.
#[test]
fn gpu_window_vec_shapes_match_the_reference_at_the_edges() {
    with_gpu(
        "gpu_window_vec_shapes_match_the_reference_at_the_edges",
        |h| {
            let inputs = [
                (Data::MostlyNan, (1.0, 0.0)),
                (Data::WithNan, (1.0, 0.0)),
                (Data::SmallIntegers, (1.0, 0.0)),
                (Data::Uniform, (-1.5, 0.25)),
            ];
            for (shape, window, padding, stride) in WINDOW_VEC_SHAPES {
                let dims: Vec<usize> = if window.len() == 3 {
                    vec![1, 24, 5, 7, 6]
                } else {
                    vec![1, 24, 7, 9]
                };
                for mode in PoolingMode::ALL {
                    for nan in [NOT, PROPAGATE] {
                        let pool =
                            PoolingDescriptor::new_nd(mode, nan, window, padding, stride).unwrap();
                        for dt in DataType::GPU {
                            for (data, ab) in inputs {
                                let p =
                                    dense_problem(pool, dt, &dims, Layout::ChannelsLast, data, ab);
                                let f = pooling_forward_kernel(h, &p.pool, &p.x, &p.y).unwrap();
                                let want = format!("pooling_fwd_window_vec_{shape}_{dt}");
                                assert_eq!(f, want, "forward kernel of {p:?}");
                                check_forward(h, &p);
                            }
                        }
                    }
                }
            }
        },
    );
}

/// A case of the disjoint-window backward test: window, dims, layout, whether x's rows
/// and whether y's rows have gaps between them.
/// Dense strides of `dims` (channels first) with rows `gap` elements apart more than their
/// width.
fn padded_rows(dims: &[usize], gap: usize) -> Vec<usize> {
    let rank = dims.len();
    let mut strides = vec![1; rank];
    strides[rank - 2] = dims[rank - 1] + gap;
    for d in (0..rank - 2).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    strides
}

type DisjointCase = (&'static [usize], &'static [usize], Layout, bool, bool);

/// The backward of disjoint windows (window = stride, unpadded: each dx element under one
/// window at most) takes kernels of its own by default, for the max and both averages:
/// over channel vectors (NHWC) a thread per cell and 16-byte vector, over rows of 16-byte
/// vectors (NCHW) a thread per vector of dx columns. Odd depths, heights and widths leave
/// cells past the last window (a zero gradient) and cells cut short at the edges; 24
/// channels are 3 vectors of f16 and 6 of f32; 3-D tensors take a depth window of 1 and
/// 2x2x2 windows; x with gaps between its rows (a pitch of whole vectors), y and dy with
/// gaps that leave their rows unaligned (each window loaded alone); every dtype,
/// ties (the first maximum in scan order takes the gradient), NaN and blends, against the
/// reference.
#[test]
fn gpu_disjoint_window_backward_matches_the_reference() {
    with_gpu("gpu_disjoint_window_backward_matches_the_reference", |h| {
        let (first, last) = (Layout::ChannelsFirst, Layout::ChannelsLast);
        let cases: [DisjointCase; 11] = [
            (&[2, 2], &[2, 24, 7, 9], last, false, false),
            (&[2, 2], &[3, 16, 8, 6], last, false, false),
            (&[1, 2, 2], &[1, 32, 3, 5, 7], last, false, false),
            (&[2, 2, 2], &[2, 16, 5, 6, 7], last, false, false),
            (&[2, 2, 2], &[1, 24, 4, 5, 4], last, false, false),
            (&[2, 2], &[2, 3, 7, 16], first, false, false),
            (&[2, 2], &[1, 2, 6, 8], first, true, false),
            (&[2, 2], &[2, 3, 6, 16], first, false, true),
            (&[1, 2, 2], &[2, 3, 3, 5, 8], first, false, false),
            (&[2, 2, 2], &[2, 3, 5, 7, 16], first, false, false),
            (&[2, 2, 2], &[1, 2, 4, 4, 8], first, false, true),
        ];
        for (window, dims, layout, gaps, y_gaps) in cases {
            let padding = vec![0; window.len()];
            let shape = if window.len() == 3 && window[0] == 2 {
                "2x2x2s2"
            } else {
                "2x2s2"
            };
            let how = if layout == last { "vec" } else { "strip" };
            for mode in PoolingMode::ALL {
                let pool =
                    PoolingDescriptor::new_nd(mode, PROPAGATE, window, &padding, window).unwrap();
                let op = if mode.is_max() { "max" } else { "avg" };
                for dt in DataType::GPU {
                    for (data, ab) in DATA_AND_BLENDS {
                        let mut p = dense_problem(pool, dt, dims, layout, data, ab);
                        if gaps {
                            // Rows a vector apart more than their width.
                            let strides = padded_rows(dims, 16 / dt.size_bytes());
                            p.x = TensorDescriptor::new(dt, dims, &strides).unwrap();
                        }
                        if y_gaps {
                            // y and dy rows one element apart more than their width: the
                            // strips read their windows one at a time.
                            let strides = padded_rows(p.y.dims(), 1);
                            p.y = TensorDescriptor::new(dt, p.y.dims(), &strides).unwrap();
                        }
                        let b = pooling_backward_kernel(h, None, &p.pool, &p.x, &p.y, &p.y, &p.x)
                            .unwrap();
                        let want = format!("pooling_bwd_disjoint_{how}_{op}_{shape}_{dt}");
                        assert_eq!(b, want, "backward kernel of {p:?}");
                        check_backward(h, &p, None);
                    }
                }
            }
        }
    });
}

/// The pooling of a walk test case: 3x3 max windows at stride `s` padded `[h, w]` over
/// `dims` (a depth window of 1 for 3-D dims), in both max modes, or only `Max` for a
/// `large` case.
fn walk_pools(
    s: usize,
    [ph, pw]: [usize; 2],
    dims: &[usize],
    large: bool,
) -> Vec<PoolingDescriptor> {
    let (window, padding, strides) = if dims.len() == 5 {
        (vec![1, 3, 3], vec![0, ph, pw], vec![1, s, s])
    } else {
        (vec![3, 3], vec![ph, pw], vec![s, s])
    };
    let modes: &[PoolingMode] = if large {
        &[PoolingMode::Max]
    } else {
        &[PoolingMode::Max, PoolingMode::MaxDeterministic]
    };
    modes
        .iter()
        .map(|&mode| {
            PoolingDescriptor::new_nd(mode, PROPAGATE, &window, &padding, &strides).unwrap()
        })
        .collect()
}

/// A case of the walk tests: the padding `[h, w]` of a 3x3 window at stride 2 (a depth
/// window of 1 for 3-D dims), dims, the extra elements between x's (and dx's) rows, and
/// whether y and dy have gaps between their rows.
type WalkCase = ([usize; 2], &'static [usize], usize, bool);

/// The max backward of 3x3 windows at stride 2 over single channels whose rows are whole
/// 16-byte vectors, at most 32 of them, walks down bands of rows in registers by default
/// (`pooling_bwd_walk_max_3x3s2p<P>_*`, padded by 0 or 1 along w, any padding along h);
/// other rows take the cell kernel. Against the reference: rows of 1 to 32 vectors (groups
/// of 1 to 32 lanes, several groups a warp), planes cut into bands of one row of windows
/// (few planes) and of several with a short last one (1100 planes of 19 rows of windows:
/// 10 and 9 in f32, 7, 7 and 5 in 16-bit types on an H100), rows below the last window (a
/// zero gradient), padding of 2 along h, 3-D tensors with a depth window of 1, x and dx
/// with gaps between rows (a pitch of whole vectors, or not), y and dy with unaligned
/// gaps, rows too long for a warp in f32 but not in f16; ties, NaN and blends, every
/// dtype, both max modes.
#[test]
fn gpu_walk_backward_matches_the_reference() {
    with_gpu("gpu_walk_backward_matches_the_reference", |h| {
        let cases: [WalkCase; 12] = [
            ([1, 1], &[2, 3, 37, 112], 0, false),
            ([1, 1], &[11, 100, 37, 128], 0, false),
            ([1, 1], &[1, 2, 9, 8], 0, false),
            ([0, 1], &[2, 3, 30, 24], 8, true),
            ([2, 1], &[2, 3, 23, 16], 0, false),
            ([1, 0], &[2, 2, 29, 64], 0, false),
            // Row 17 is under no window.
            ([0, 0], &[1, 3, 18, 128], 0, false),
            ([1, 1], &[1, 2, 3, 5, 8], 8, false),
            ([1, 1], &[1, 4, 15, 256], 0, false),
            ([1, 1], &[2, 3, 11, 132], 0, false),
            ([1, 1], &[2, 3, 11, 18], 0, false),
            ([1, 1], &[2, 3, 11, 24], 2, false),
        ];
        for (padding, dims, gap, y_gaps) in cases {
            for pool in walk_pools(2, padding, dims, dims[0] * dims[1] > 100) {
                let pw = padding[1];
                for dt in DataType::GPU {
                    // Rows (and the gaps between them) of whole 16-byte vectors, 32 at most.
                    let row = dims[dims.len() - 1] * dt.size_bytes();
                    let walks = row.is_multiple_of(16)
                        && row <= 32 * 16
                        && (gap * dt.size_bytes()).is_multiple_of(16);
                    let how = if walks { "walk" } else { "cell" };
                    for (data, ab) in DATA_AND_BLENDS {
                        let mut p = dense_problem(pool, dt, dims, Layout::ChannelsFirst, data, ab);
                        if gap > 0 {
                            p.x = TensorDescriptor::new(dt, dims, &padded_rows(dims, gap)).unwrap();
                        }
                        if y_gaps {
                            let strides = padded_rows(p.y.dims(), 1);
                            p.y = TensorDescriptor::new(dt, p.y.dims(), &strides).unwrap();
                        }
                        let b = pooling_backward_kernel(h, None, &p.pool, &p.x, &p.y, &p.y, &p.x)
                            .unwrap();
                        let want = format!("pooling_bwd_{how}_max_3x3s2p{pw}_{dt}");
                        assert_eq!(b, want, "{p:?}");
                        check_backward(h, &p, None);
                    }
                }
            }
        }
    });
}

/// A case of the channel-vector walk test: the stride (2 or 1) and padding `[h, w]` of a
/// 3x3 window (a depth window of 1 for 3-D dims), dims, and whether x, and y and dy, have
/// gaps between their pixels.
type WalkVecCase = (usize, [usize; 2], &'static [usize], bool, bool);

/// The max backward of 3x3 windows at stride 2 or 1 over channel vectors (every operand
/// channels-last in 8-byte vectors: 2 f32, 4 f16) walks down bands of rows by default
/// (`pooling_bwd_walk_vec_max_3x3s{2,1}_*`, any padding; a single window takes the
/// stride-2 kernel at any stride). Against the reference: odd, prime and even extents
/// (windows hanging past the edges, a row and a column under no window), paddings of 0 to
/// 2, one row or column, channels of one vector and of several, bands of one row of
/// windows (few pixels) and of several with a short last one (10x64x37x99: 8000 f16
/// threads a band, 6 bands of 3 rows of windows and one of 1 on an H100), at stride 1 and
/// padding 2 a band whose first window starts in the padding (1x12x7x11), 3-D tensors
/// with a depth window of 1, gaps between pixels; ties, NaN and blends, every dtype, both
/// max modes. Channels that are not whole vectors (6 f16) take another kernel.
#[test]
fn gpu_walk_vec_backward_matches_the_reference() {
    with_gpu("gpu_walk_vec_backward_matches_the_reference", |h| {
        let cases: [WalkVecCase; 20] = [
            (2, [1, 1], &[2, 16, 17, 19], false, false),
            (2, [0, 0], &[2, 4, 13, 10], false, false),
            (2, [1, 0], &[1, 12, 7, 11], false, false),
            (2, [0, 1], &[3, 8, 5, 5], false, false),
            (2, [2, 2], &[2, 8, 9, 6], false, false),
            (2, [2, 0], &[1, 4, 8, 13], false, true),
            (2, [1, 1], &[2, 8, 1, 7], false, false),
            (2, [1, 1], &[2, 8, 6, 1], false, false),
            // Row 17 and column 8 are under no window.
            (2, [0, 0], &[1, 8, 18, 9], true, false),
            (2, [1, 1], &[2, 8, 3, 9, 10], false, false),
            (2, [1, 1], &[2, 24, 23, 29], true, true),
            (2, [1, 1], &[10, 64, 37, 99], false, false),
            (2, [1, 1], &[2, 6, 9, 9], false, false),
            (1, [1, 1], &[2, 16, 17, 19], false, false),
            (1, [0, 0], &[2, 4, 13, 10], false, false),
            // The second band's first window starts at row -1: it stores from row 0.
            (1, [2, 1], &[1, 12, 7, 11], true, true),
            (1, [0, 2], &[2, 8, 3, 5], false, false),
            (1, [1, 1], &[2, 8, 1, 7], false, false),
            (1, [1, 1], &[2, 8, 3, 9, 10], false, false),
            (1, [1, 1], &[10, 64, 37, 29], false, false),
        ];
        for (s, padding, dims, x_gaps, y_gaps) in cases {
            let large = dims.iter().product::<usize>() > 1 << 20;
            for pool in walk_pools(s, padding, dims, large) {
                for dt in DataType::GPU {
                    for (data, ab) in DATA_AND_BLENDS {
                        let mut p = dense_problem(pool, dt, dims, Layout::ChannelsLast, data, ab);
                        if x_gaps {
                            p.x = gapped_pixels(dt, dims);
                        }
                        if y_gaps {
                            p.y = gapped_pixels(dt, p.y.dims());
                        }
                        // A single window (any stride) takes the stride-2 walk.
                        let single = p.y.dims()[2..].iter().all(|&d| d == 1);
                        let s = if single { 2 } else { s };
                        let walk = format!("pooling_bwd_walk_vec_max_3x3s{s}_{dt}");
                        let b = pooling_backward_kernel(h, None, &p.pool, &p.x, &p.y, &p.y, &p.x)
                            .unwrap();
                        if dims[1] % (8 / dt.size_bytes()) == 0 {
                            assert_eq!(b, walk, "{p:?}");
                        } else {
                            assert_ne!(b, walk, "{p:?}");
                        }
                        check_backward(h, &p, None);
                    }
                }
            }
        }
    });
}

/// The max backward's bands of rows against the reference: planes cut into several bands
/// (the last one short), strides that skip rows, windows taller than wide, a band of one row
/// where wider ones take too much shared memory, 1-D and 3-D windows of depth 1, and x and
/// dx with gaps between elements and rows. A window too wide for one row's band falls back
/// to the tiles.
#[test]
fn gpu_band_backward_matches_the_reference_across_bands() {
    with_gpu(
        "gpu_band_backward_matches_the_reference_across_bands",
        |h| {
            // Every other element, rows `2 * w + 5` elements apart.
            let gapped = |dt: DataType, dims: &[usize]| {
                let (c, height, w) = (dims[1], dims[2], dims[3]);
                let row = 2 * w + 5;
                TensorDescriptor::new(dt, dims, &[c * height * row, height * row, row, 2]).unwrap()
            };
            let cases: [KernelCase; 12] = [
                // 2048 / 300 = 6 rows a band: 5 bands, the last of 5 rows.
                (
                    &[3, 3],
                    &[1, 1],
                    &[1, 1],
                    &[2, 3, 29, 300],
                    false,
                    "band_max_3x3s1p1",
                ),
                // 2048 / 61 = 33 rows a band; rows not whole runs of 4.
                (
                    &[3, 3],
                    &[1, 0],
                    &[1, 1],
                    &[2, 3, 40, 61],
                    false,
                    "band_max_3x3s1p0",
                ),
                (
                    &[2, 2],
                    &[1, 0],
                    &[1, 1],
                    &[2, 3, 9, 5],
                    false,
                    "band_max_2x2s1p0",
                ),
                (
                    &[3, 3],
                    &[1, 1],
                    &[2, 2],
                    &[2, 3, 37, 150],
                    false,
                    "band_max",
                ),
                // Rows 2, 5, 8, ... are in no window.
                (
                    &[2, 2],
                    &[0, 0],
                    &[3, 3],
                    &[2, 3, 20, 23],
                    false,
                    "band_max",
                ),
                (
                    &[5, 3],
                    &[2, 1],
                    &[2, 1],
                    &[1, 4, 33, 70],
                    false,
                    "band_max",
                ),
                // Three rows of 600 take 40 KB: one row a band.
                (
                    &[3, 3],
                    &[1, 1],
                    &[1, 1],
                    &[1, 2, 5, 600],
                    false,
                    "band_max_3x3s1p1",
                ),
                (&[3, 3], &[1, 0], &[1, 2], &[2, 3, 13, 17], true, "band_max"),
                (
                    &[3, 3],
                    &[0, 1],
                    &[1, 1],
                    &[2, 3, 6, 11],
                    true,
                    "band_max_3x3s1p1",
                ),
                (
                    &[1, 3, 3],
                    &[0, 1, 1],
                    &[1, 1, 1],
                    &[2, 3, 4, 9, 10],
                    false,
                    "band_max_3x3s1p1",
                ),
                (&[4], &[1], &[1], &[3, 5, 23], false, "band_max"),
                // Nine rows of 2000 take 72 KB even in a band of one row.
                (
                    &[9, 9],
                    &[4, 4],
                    &[1, 1],
                    &[1, 2, 10, 2000],
                    false,
                    "tile_max",
                ),
            ];
            for (window, padding, stride, dims, gaps, kernel) in cases {
                for mode in [PoolingMode::Max, PoolingMode::MaxDeterministic] {
                    let pool = PoolingDescriptor::new_nd(mode, PROPAGATE, window, padding, stride)
                        .unwrap();
                    for dt in DataType::GPU {
                        for (data, ab) in DATA_AND_BLENDS {
                            let mut p =
                                dense_problem(pool, dt, dims, Layout::ChannelsFirst, data, ab);
                            if gaps {
                                p.x = gapped(dt, dims);
                            }
                            let algo = PoolingBwdAlgo::Tile;
                            let b = pooling_backward_kernel(
                                h,
                                Some(algo),
                                &p.pool,
                                &p.x,
                                &p.y,
                                &p.y,
                                &p.x,
                            );
                            assert_eq!(b.unwrap(), format!("pooling_bwd_{kernel}_{dt}"), "{p:?}");
                            check_backward(h, &p, Some(algo));
                        }
                    }
                }
            }
            // Stride 1 over single channels takes the bands by default.
            let pool = pool2d(PoolingMode::Max, 3, 1, 1);
            let x =
                TensorDescriptor::spatial(DataType::F32, 32, 192, &[28, 28], Layout::ChannelsFirst)
                    .unwrap();
            let y = pooled(&pool, &x, Layout::ChannelsFirst);
            let b = pooling_backward_kernel(h, None, &pool, &x, &y, &y, &x).unwrap();
            assert_eq!(b, "pooling_bwd_band_max_3x3s1p1_f32");
        },
    );
}

/// A channels-last tensor of `dims` (`[n, c, spatial..]`) with gaps between its pixels:
/// channels innermost, then w, h, (d,) n, pixels `c + 4` elements apart.
fn gapped_pixels(dt: DataType, dims: &[usize]) -> TensorDescriptor {
    let mut strides = vec![0; dims.len()];
    strides[1] = 1;
    let mut s = dims[1] + 4;
    for d in (2..dims.len()).rev() {
        strides[d] = s;
        s *= dims[d];
    }
    strides[0] = s;
    TensorDescriptor::new(dt, dims, &strides).unwrap()
}

/// The max cell kernels over channel vectors (`pooling_bwd_cell_vec_max_<W>x<W>s2_*`)
/// against the reference: cells cut by the input's edges (odd and prime extents, windows
/// hanging past them with and without padding, rows and columns of x in no window),
/// channels of one vector and of several that are not whole 16-byte vectors (12: only the
/// forced cell algorithm takes them), a 3-D window of depth 1, channel-contiguous tensors
/// with gaps between pixels, ties, NaNs and an alpha/beta blend, in both max modes and
/// every dtype. The default algorithm takes the 2x2 ones where C fills 16-byte vectors;
/// there, unpadded 2x2/s2 windows take the disjoint-window kernel instead.
#[test]
fn gpu_cell_vec_backward_matches_the_reference() {
    with_gpu("gpu_cell_vec_backward_matches_the_reference", |h| {
        let cases: [KernelCase; 10] = [
            (&[3, 3], &[1, 1], &[2, 2], &[2, 16, 17, 19], false, "3x3s2"),
            (&[3, 3], &[0, 0], &[2, 2], &[2, 4, 13, 10], false, "3x3s2"),
            (&[3, 3], &[1, 0], &[2, 2], &[1, 12, 7, 11], false, "3x3s2"),
            (&[3, 3], &[0, 1], &[2, 2], &[3, 8, 5, 5], false, "3x3s2"),
            (&[3, 3], &[1, 1], &[2, 2], &[2, 8, 9, 6], true, "3x3s2"),
            (&[2, 2], &[0, 0], &[2, 2], &[2, 16, 9, 11], false, "2x2s2"),
            (&[2, 2], &[0, 0], &[2, 2], &[2, 12, 7, 9], false, "2x2s2"),
            (&[2, 2], &[1, 1], &[2, 2], &[1, 4, 6, 7], false, "2x2s2"),
            (&[2, 2], &[1, 0], &[2, 2], &[2, 8, 5, 8], true, "2x2s2"),
            (
                &[1, 3, 3],
                &[0, 1, 1],
                &[1, 2, 2],
                &[2, 8, 3, 9, 10],
                false,
                "3x3s2",
            ),
        ];
        for (window, padding, stride, dims, gaps, shape) in cases {
            for mode in [PoolingMode::Max, PoolingMode::MaxDeterministic] {
                let pool =
                    PoolingDescriptor::new_nd(mode, PROPAGATE, window, padding, stride).unwrap();
                for dt in DataType::GPU {
                    for (data, ab) in DATA_AND_BLENDS {
                        let mut p = dense_problem(pool, dt, dims, Layout::ChannelsLast, data, ab);
                        if gaps {
                            p.x = gapped_pixels(dt, dims);
                        }
                        let whole_vectors = !gaps && dims[1] % (16 / dt.size_bytes()) == 0;
                        // Unpadded windows of their stride's size over whole 16-byte
                        // vectors take the disjoint-window kernel.
                        let disjoint = whole_vectors && window == stride && padding == [0, 0];
                        let kernel = if disjoint {
                            format!("pooling_bwd_disjoint_vec_max_{shape}_{dt}")
                        } else {
                            format!("pooling_bwd_cell_vec_max_{shape}_{dt}")
                        };
                        let algo = PoolingBwdAlgo::Cell;
                        let b =
                            pooling_backward_kernel(h, Some(algo), &p.pool, &p.x, &p.y, &p.y, &p.x);
                        assert_eq!(b.unwrap(), kernel, "{p:?}");
                        check_backward(h, &p, Some(algo));
                        // Where C fills 16-byte vectors of the dtype, the default too (3x3
                        // windows walk down bands of rows instead).
                        if whole_vectors && shape == "2x2s2" {
                            let b =
                                pooling_backward_kernel(h, None, &p.pool, &p.x, &p.y, &p.y, &p.x);
                            assert_eq!(b.unwrap(), kernel, "default of {p:?}");
                            check_backward(h, &p, None);
                        }
                    }
                }
            }
        }
    });
}

/// A depth window of 1 at a depth stride larger than the depth leaves one output plane and
/// x planes in no window, which take no gradient: the kernels compiled for 2-D windows,
/// which pool each x plane into the y plane of the same depth, must not take them (a
/// proptest case once sent one to the stride-1 band kernel, whose later planes read y
/// planes that do not exist). Every backward algorithm, both layouts, against the reference.
#[test]
fn gpu_depth_planes_in_no_window_take_no_gradient() {
    with_gpu("gpu_depth_planes_in_no_window_take_no_gradient", |h| {
        // (window, padding, stride, dims, layout)
        type Case = ([usize; 3], [usize; 3], [usize; 3], &'static [usize], Layout);
        let cases: [Case; 3] = [
            (
                [1, 3, 3],
                [0, 0, 1],
                [3, 1, 3],
                &[2, 2, 3, 8, 2],
                Layout::ChannelsFirst,
            ),
            (
                [1, 3, 3],
                [0, 1, 1],
                [3, 2, 2],
                &[2, 3, 3, 9, 10],
                Layout::ChannelsFirst,
            ),
            (
                [1, 3, 3],
                [0, 1, 1],
                [4, 2, 2],
                &[2, 8, 3, 9, 10],
                Layout::ChannelsLast,
            ),
        ];
        for (window, padding, stride, dims, layout) in cases {
            let pool =
                PoolingDescriptor::new_nd(PoolingMode::Max, PROPAGATE, &window, &padding, &stride)
                    .unwrap();
            for dt in DataType::GPU {
                for data in [Data::Uniform, Data::SmallIntegers] {
                    let p = dense_problem(pool, dt, dims, layout, data, (1.0, 0.0));
                    assert_eq!(p.y.dims()[2], 1, "{p:?}");
                    check_backward(h, &p, None);
                    for algo in PoolingBwdAlgo::ALL {
                        let b =
                            pooling_backward_kernel(h, Some(algo), &p.pool, &p.x, &p.y, &p.y, &p.x);
                        match b {
                            Err(Error::NotSupported { .. }) => continue,
                            b => {
                                let b = b.unwrap();
                                assert!(!b.contains("band") && !b.contains("x3s"), "{b} for {p:?}");
                            }
                        }
                        check_backward(h, &p, Some(algo));
                    }
                }
            }
        }
    });
}

/// Global pooling over planes stored back to back (channels first): in f32 the staged
/// forward (a warp per few planes) up to 128 elements a plane, in the 16-bit types the lane
/// forward (a thread a plane) up to 57, and the global average backward's flat kernel (a
/// thread per 16-byte vector of dx). The cases: each side of the lane kernel's limit (57
/// and 58 elements), planes of 65 to 128 elements (two staged lanes each, combined by a
/// shuffle) and longer ones (the group kernel), x ending on a partial vector (111 planes of
/// 7x7, 35 of 2x3), even plane lengths (whose staged lanes start their reads apart), planes
/// shorter than a vector, 3-D planes, and more planes than the launch has threads or warps
/// for at once (they loop); channels last, with planes interleaved, takes the group kernel
/// and the per-element backward. Every mode and dtype, against the reference.
#[test]
fn gpu_global_planes_back_to_back_match_the_reference() {
    with_gpu("gpu_global_planes_back_to_back_match_the_reference", |h| {
        let (first, last) = (Layout::ChannelsFirst, Layout::ChannelsLast);
        // (dims, layout, f32 forward, 16-bit forward, average backward kernel)
        let cases: [(&[usize], Layout, &str, &str, &str); 12] = [
            (&[3, 37, 7, 7], first, "staged_", "lane_", "avg_flat_"),
            (&[3, 37, 9, 9], first, "staged_", "", "avg_flat_"),
            (&[2, 20, 8, 8], first, "staged_", "", "avg_flat_"),
            (&[2, 3, 3, 19], first, "staged_", "lane_", "avg_flat_"),
            (&[2, 3, 2, 29], first, "staged_", "", "avg_flat_"),
            (&[5, 7, 2, 3], first, "staged_", "lane_", "avg_flat_"),
            (&[1, 33, 1, 5], first, "staged_", "lane_", "avg_flat_"),
            (&[2, 5, 2, 3, 4], first, "staged_", "lane_", "avg_flat_"),
            (&[2, 3, 5, 13], first, "staged_", "", "avg_flat_"),
            (&[2, 3, 11, 12], first, "", "", "avg_flat_"),
            (&[1100, 1024, 2, 2], first, "staged_", "lane_", "avg_flat_"),
            (&[2, 3, 5, 7], last, "", "", "avg_"),
        ];
        for (dims, layout, fwd32, fwd16, avg_bwd) in cases {
            let big = dims[0] * dims[1] > 1 << 16;
            let pool_of = |mode| PoolingDescriptor::global(mode, PROPAGATE, &dims[2..]).unwrap();
            for mode in PoolingMode::ALL {
                for dt in DataType::GPU {
                    for (data, ab) in DATA_AND_BLENDS {
                        if big && (dt == DataType::BF16 || !matches!(data, Data::Uniform)) {
                            continue;
                        }
                        let p = dense_problem(pool_of(mode), dt, dims, layout, data, ab);
                        let f = pooling_forward_kernel(h, &p.pool, &p.x, &p.y).unwrap();
                        let fwd = if dt == DataType::F32 { fwd32 } else { fwd16 };
                        assert_eq!(f, format!("pooling_fwd_global_{fwd}{dt}"), "{p:?}");
                        check_forward(h, &p);
                        let b = pooling_backward_kernel(h, None, &p.pool, &p.x, &p.y, &p.y, &p.x);
                        let want = if mode.is_max() {
                            format!("pooling_bwd_gather_max_{dt}")
                        } else {
                            format!("pooling_bwd_global_{avg_bwd}{dt}")
                        };
                        assert_eq!(b.unwrap(), want, "{p:?}");
                        check_backward(h, &p, None);
                    }
                }
            }
        }
    });
}

#[test]
fn gpu_headline_shapes_take_the_fast_paths() {
    with_gpu("gpu_headline_shapes_take_the_fast_paths", |h| {
        let stem = pool2d(PoolingMode::Max, 3, 1, 2);
        for (dt, layout, fwd, bwd) in [
            (
                DataType::F32,
                Layout::ChannelsFirst,
                "pooling_fwd_strip_3x3s2p1_f32",
                "pooling_bwd_walk_max_3x3s2p1_f32",
            ),
            (
                DataType::F16,
                Layout::ChannelsFirst,
                "pooling_fwd_strip_3x3s2p1_f16",
                "pooling_bwd_walk_max_3x3s2p1_f16",
            ),
            (
                DataType::F16,
                Layout::ChannelsLast,
                "pooling_fwd_window_vec_3x3_f16",
                "pooling_bwd_walk_vec_max_3x3s2_f16",
            ),
        ] {
            let x = TensorDescriptor::spatial(dt, 32, 64, &[112, 112], layout).unwrap();
            let y = pooled(&stem, &x, layout);
            assert_eq!(pooling_forward_kernel(h, &stem, &x, &y).unwrap(), fwd);
            assert_eq!(
                pooling_backward_kernel(h, None, &stem, &x, &y, &y, &x).unwrap(),
                bwd
            );
        }
        // The disjoint windows of VGG and U-Nets (2x2/s2) and of 3-D networks (2x2x2/s2).
        let disjoint: [(&[usize], &[usize]); 2] = [
            (&[2, 2], &[32, 128, 112, 112]),
            (&[2, 2, 2], &[8, 64, 16, 56, 56]),
        ];
        for (window, dims) in disjoint {
            let padding = vec![0; window.len()];
            let pool =
                PoolingDescriptor::new_nd(PoolingMode::Max, NOT, window, &padding, window).unwrap();
            let shape = if window.len() == 3 {
                "2x2x2s2"
            } else {
                "2x2s2"
            };
            for (layout, how) in [
                (Layout::ChannelsFirst, "strip"),
                (Layout::ChannelsLast, "vec"),
            ] {
                let x =
                    TensorDescriptor::spatial(DataType::F16, dims[0], dims[1], &dims[2..], layout)
                        .unwrap();
                let y = pooled(&pool, &x, layout);
                assert_eq!(
                    pooling_backward_kernel(h, None, &pool, &x, &y, &y, &x).unwrap(),
                    format!("pooling_bwd_disjoint_{how}_max_{shape}_f16")
                );
            }
        }
        // Inception's 3x3/s1/p1 on 28x28 f16 rows (56 bytes: 8-byte vectors).
        let inception = pool2d(PoolingMode::Max, 3, 1, 1);
        let x = TensorDescriptor::nchw(DataType::F16, 32, 192, 28, 28).unwrap();
        let y = pooled(&inception, &x, Layout::ChannelsFirst);
        assert_eq!(
            pooling_forward_kernel(h, &inception, &x, &y).unwrap(),
            "pooling_fwd_strip8_3x3s1p1_f16"
        );
        // ResNet-50's global average over 7x7, channels first.
        let gap = PoolingDescriptor::global(PoolingMode::AverageCountIncludePadding, NOT, &[7, 7])
            .unwrap();
        for dt in DataType::GPU {
            let x = TensorDescriptor::nchw(dt, 32, 2048, 7, 7).unwrap();
            let y = pooled(&gap, &x, Layout::ChannelsFirst);
            let how = if dt == DataType::F32 {
                "staged_"
            } else {
                "lane_"
            };
            assert_eq!(
                pooling_forward_kernel(h, &gap, &x, &y).unwrap(),
                format!("pooling_fwd_global_{how}{dt}")
            );
            assert_eq!(
                pooling_backward_kernel(h, None, &gap, &x, &y, &y, &x).unwrap(),
                format!("pooling_bwd_global_avg_flat_{dt}")
            );
        }
    });
}

/// The global fast path against the general kernel: the same values stored with gaps
/// between rows cannot take the global reduction and run the window kernel.
#[test]
fn gpu_global_path_matches_the_general_kernel() {
    with_gpu("gpu_global_path_matches_the_general_kernel", |h| {
        for dt in DataType::GPU {
            for mode in PoolingMode::ALL {
                for (layout, spatial) in [
                    (Layout::ChannelsFirst, [7usize, 7]),
                    (Layout::ChannelsLast, [7, 7]),
                    (Layout::ChannelsFirst, [2, 50]),
                ] {
                    let (n, c) = (4, 64);
                    let pool = PoolingDescriptor::global(mode, PROPAGATE, &spatial).unwrap();
                    let dense = TensorDescriptor::spatial(dt, n, c, &spatial, layout).unwrap();
                    // Each row of w padded by 3 elements (channels first) or each position
                    // by a vector of channels (channels last).
                    let gapped = match layout {
                        Layout::ChannelsFirst => {
                            let w = spatial[1] + 3;
                            TensorDescriptor::new(
                                dt,
                                &[n, c, spatial[0], spatial[1]],
                                &[c * spatial[0] * w, spatial[0] * w, w, 1],
                            )
                            .unwrap()
                        }
                        Layout::ChannelsLast => {
                            let cs = c + 8;
                            TensorDescriptor::new(
                                dt,
                                &[n, c, spatial[0], spatial[1]],
                                &[
                                    spatial[0] * (spatial[1] + 1) * cs,
                                    1,
                                    (spatial[1] + 1) * cs,
                                    cs,
                                ],
                            )
                            .unwrap()
                        }
                    };
                    let y = pooled(&pool, &dense, Layout::ChannelsFirst);
                    let fast = pooling_forward_kernel(h, &pool, &dense, &y).unwrap();
                    let general = pooling_forward_kernel(h, &pool, &gapped, &y).unwrap();
                    assert!(fast.starts_with("pooling_fwd_global"), "{fast}");
                    assert!(general.starts_with("pooling_fwd_window"), "{general}");
                    let mut r = rng(7);
                    let values = draw(
                        TensorDescriptor::packed(dt, &[n, c, spatial[0], spatial[1]]).unwrap(),
                        Data::Uniform,
                        &mut r,
                    );
                    let copy = |d: TensorDescriptor| HostTensor::from_fn(d, |i| values.get(i));
                    let a = forward(h, &pool, &copy(dense), &y);
                    let b = forward(h, &pool, &copy(gapped), &y);
                    let tol = if mode.is_max() { 0.0 } else { 4.0 * bound(dt) };
                    let (ta, tb) = (
                        HostTensor::from_fn(y, |i| a[y.offset_of(i)]),
                        HostTensor::from_fn(y, |i| b[y.offset_of(i)]),
                    );
                    let err = rel_error(&ta, &tb);
                    assert!(
                        err <= tol,
                        "{mode:?} {dt} {layout:?} {spatial:?}: global vs window differ by {err:e}"
                    );
                    let mut want = HostTensor::filled(y, 0.0);
                    reference::forward(&pool, 1.0, &copy(dense), 0.0, &mut want);
                    assert!(
                        rel_error(&ta, &want) <= bound(dt).max(tol),
                        "{mode:?} {dt}: global vs reference"
                    );
                }
            }
        }
    });
}

#[test]
fn gpu_backward_is_deterministic() {
    with_gpu("gpu_backward_is_deterministic", |h| {
        for mode in [PoolingMode::Max, PoolingMode::AverageCountExcludePadding] {
            let p = dense_problem(
                pool2d(mode, 3, 1, 2),
                DataType::F32,
                &[4, 8, 57, 59],
                Layout::ChannelsFirst,
                Data::Uniform,
                (1.0, 0.0),
            );
            let mut r = rng(3);
            let x = draw(p.x, p.data, &mut r);
            let dy = random(p.y, -1.0, 1.0, &mut r);
            let first = backward(h, &p.pool, &x, &dy);
            for _ in 0..3 {
                assert_eq!(backward(h, &p.pool, &x, &dy), first, "{mode:?}");
            }
        }
    });
}

// ---------------------------------------------------------------------------------------
// Bad inputs, every handle
// ---------------------------------------------------------------------------------------

fn assert_bad(e: Error, arg: &str) {
    match &e {
        Error::BadParam { arg: a, .. } | Error::BufferTooSmall { arg: a, .. } => {
            assert_eq!(*a, arg, "{e}")
        }
        _ => panic!("expected an error naming `{arg}`, got {e}"),
    }
}

/// The backward of disjoint 2x2 windows (kernels of their own on the GPU, for the max and
/// the average, over channel vectors and over rows of vectors) and the walks of 3x3 max
/// windows (at stride 2 over rows of vectors and over channel vectors, at stride 1 over
/// channel vectors) check their operands first like every path: wrong dims, another dtype
/// and short buffers are typed errors naming the argument, and dx is left as it was. (The
/// stride-2 windows pool 8x16 to 4x8, the stride-1 ones keep 8x16.)
#[test]
fn bad_inputs_on_the_disjoint_window_and_walk_paths_are_typed_errors() {
    let pools = [
        pool2d(PoolingMode::Max, 2, 0, 2),
        pool2d(PoolingMode::AverageCountIncludePadding, 2, 0, 2),
        pool2d(PoolingMode::Max, 3, 1, 2),
        pool2d(PoolingMode::Max, 3, 1, 1),
    ];
    for h in handles() {
        let f16_ = DataType::F16;
        for layout in [Layout::ChannelsLast, Layout::ChannelsFirst] {
            let desc = |dt: DataType, c: usize, hw: [usize; 2]| {
                TensorDescriptor::spatial(dt, 2, c, &hw, layout).unwrap()
            };
            let xd = desc(f16_, 16, [8, 16]);
            for pool in pools {
                let mode = pool.mode();
                let yd = pooled(&pool, &xd, layout);
                let [oh, ow] = [yd.dims()[2], yd.dims()[3]];
                if h.is_gpu() && pool.window() == [3, 3] {
                    let kernel = pooling_backward_kernel(h, None, &pool, &xd, &yd, &yd, &xd);
                    let how = match (layout, pool.stride()[0]) {
                        (Layout::ChannelsFirst, 2) => Some("walk_max_3x3s2p1"),
                        (Layout::ChannelsLast, s) => Some(if s == 2 {
                            "walk_vec_max_3x3s2"
                        } else {
                            "walk_vec_max_3x3s1"
                        }),
                        // Single channels at stride 1 take the band kernel.
                        _ => None,
                    };
                    if let Some(how) = how {
                        assert_eq!(kernel.unwrap(), format!("pooling_bwd_{how}_f16"));
                    }
                }
                let (x, y, dy) = (
                    h.alloc(&xd).unwrap(),
                    h.alloc(&yd).unwrap(),
                    h.alloc(&yd).unwrap(),
                );
                let mut dx = h.alloc(&xd).unwrap();
                h.fill_bytes(&mut dx, 0x5A).unwrap();
                let bwd = |[x_desc, dy_desc, dx_desc]: [&TensorDescriptor; 3],
                           [x, dy]: [&Buffer; 2],
                           dx: &mut Buffer| {
                    pooling_backward(
                        h, &pool, 1.0, &yd, &y, dy_desc, dy, x_desc, x, 0.0, dx_desc, dx,
                    )
                    .unwrap_err()
                };
                let wrong_dy = desc(f16_, 16, [oh, ow - 1]);
                assert_bad(bwd([&xd, &wrong_dy, &xd], [&x, &dy], &mut dx), "dy_desc");
                let f32_dy = desc(DataType::F32, 16, [oh, ow]);
                assert_bad(bwd([&xd, &f32_dy, &xd], [&x, &dy], &mut dx), "dy_desc");
                let wrong_dx = desc(f16_, 8, [8, 16]);
                assert_bad(bwd([&xd, &yd, &wrong_dx], [&x, &dy], &mut dx), "dx_desc");
                // x of other dims: y's dims are no longer x's pooled ones.
                let wrong_x = desc(f16_, 16, [8, 8]);
                assert_bad(bwd([&wrong_x, &yd, &xd], [&x, &dy], &mut dx), "y_desc");
                let short_dy = h.alloc_bytes(yd.size_bytes() - 2).unwrap();
                assert_bad(bwd([&xd, &yd, &xd], [&x, &short_dy], &mut dx), "dy");
                let short_x = h.alloc_bytes(xd.size_bytes() - 16).unwrap();
                assert_bad(bwd([&xd, &yd, &xd], [&short_x, &dy], &mut dx), "x");
                let mut short_dx = h.alloc_bytes(xd.size_bytes() - 16).unwrap();
                assert_bad(bwd([&xd, &yd, &xd], [&x, &dy], &mut short_dx), "dx");
                assert!(
                    h.read_bytes(&dx).unwrap().iter().all(|&b| b == 0x5A),
                    "dx was written ({mode:?}, {layout:?})"
                );
            }
        }
    }
}

#[test]
fn bad_inputs_are_rejected_with_errors_naming_the_argument() {
    for h in handles() {
        let f32_ = DataType::F32;
        let xd = TensorDescriptor::nchw(f32_, 2, 3, 8, 8).unwrap();
        let yd = TensorDescriptor::nchw(f32_, 2, 3, 4, 4).unwrap();
        let pool = pool2d(PoolingMode::Max, 2, 0, 2);
        let (x, y) = (h.alloc(&xd).unwrap(), h.alloc(&yd).unwrap());
        let (dy, mut dx, mut out) = (
            h.alloc(&yd).unwrap(),
            h.alloc(&xd).unwrap(),
            h.alloc(&yd).unwrap(),
        );
        let fwd = |pool: &PoolingDescriptor,
                   xd: &TensorDescriptor,
                   x: &Buffer,
                   yd: &TensorDescriptor,
                   out: &mut Buffer| {
            pooling_forward(h, pool, 1.0, xd, x, 0.0, yd, out).unwrap_err()
        };
        // The window is larger than the padded input.
        let big = pool2d(PoolingMode::Max, 9, 0, 1);
        assert_bad(fwd(&big, &xd, &x, &yd, &mut out), "pooling");
        // Output dims that are not the pooled dims; another dtype; another rank.
        let wrong = TensorDescriptor::nchw(f32_, 2, 3, 4, 5).unwrap();
        assert_bad(fwd(&pool, &xd, &x, &wrong, &mut out), "y_desc");
        let half = TensorDescriptor::nchw(DataType::F16, 2, 3, 4, 4).unwrap();
        assert_bad(fwd(&pool, &xd, &x, &half, &mut out), "y_desc");
        let rank5 = TensorDescriptor::packed(f32_, &[2, 3, 1, 4, 4]).unwrap();
        assert_bad(fwd(&pool, &xd, &x, &rank5, &mut out), "y_desc");
        let x5 = TensorDescriptor::packed(f32_, &[2, 3, 1, 8, 8]).unwrap();
        assert_bad(fwd(&pool, &x5, &x, &yd, &mut out), "x_desc");
        // An output whose elements overlap.
        let overlapping = TensorDescriptor::new(f32_, &[2, 3, 4, 4], &[16, 16, 4, 1]).unwrap();
        assert_bad(fwd(&pool, &xd, &x, &overlapping, &mut out), "y_desc");
        // Short buffers.
        let short_x = h.alloc_bytes(xd.size_bytes() - 4).unwrap();
        assert_bad(fwd(&pool, &xd, &short_x, &yd, &mut out), "x");
        let mut short_y = h.alloc_bytes(yd.size_bytes() - 1).unwrap();
        assert_bad(fwd(&pool, &xd, &x, &yd, &mut short_y), "y");
        // Non-finite blending factors.
        let e = pooling_forward(h, &pool, f64::NAN, &xd, &x, 0.0, &yd, &mut out).unwrap_err();
        assert_bad(e, "alpha");
        let e = pooling_forward(h, &pool, 1.0, &xd, &x, f64::INFINITY, &yd, &mut out).unwrap_err();
        assert_bad(e, "beta");

        let bwd = |yd: &TensorDescriptor,
                   y: &Buffer,
                   dyd: &TensorDescriptor,
                   dy: &Buffer,
                   xd: &TensorDescriptor,
                   x: &Buffer,
                   dxd: &TensorDescriptor,
                   dx: &mut Buffer| {
            pooling_backward(h, &pool, 1.0, yd, y, dyd, dy, xd, x, 0.0, dxd, dx).unwrap_err()
        };
        assert_bad(bwd(&wrong, &y, &yd, &dy, &xd, &x, &xd, &mut dx), "y_desc");
        assert_bad(bwd(&yd, &y, &wrong, &dy, &xd, &x, &xd, &mut dx), "dy_desc");
        assert_bad(bwd(&yd, &y, &half, &dy, &xd, &x, &xd, &mut dx), "dy_desc");
        let wrong_dx = TensorDescriptor::nchw(f32_, 2, 3, 8, 7).unwrap();
        assert_bad(
            bwd(&yd, &y, &yd, &dy, &xd, &x, &wrong_dx, &mut dx),
            "dx_desc",
        );
        let half_dx = TensorDescriptor::nchw(DataType::F16, 2, 3, 8, 8).unwrap();
        assert_bad(
            bwd(&yd, &y, &yd, &dy, &xd, &x, &half_dx, &mut dx),
            "dx_desc",
        );
        assert_bad(bwd(&yd, &y, &yd, &dy, &x5, &x, &xd, &mut dx), "x_desc");
        let short = h.alloc_bytes(yd.size_bytes() - 4).unwrap();
        assert_bad(bwd(&yd, &short, &yd, &dy, &xd, &x, &xd, &mut dx), "y");
        assert_bad(bwd(&yd, &y, &yd, &short, &xd, &x, &xd, &mut dx), "dy");
        assert_bad(bwd(&yd, &y, &yd, &dy, &xd, &short_x, &xd, &mut dx), "x");
        let mut short_dx = h.alloc_bytes(xd.size_bytes() - 2).unwrap();
        assert_bad(bwd(&yd, &y, &yd, &dy, &xd, &x, &xd, &mut short_dx), "dx");
        // A buffer of another handle.
        let other = Handle::cpu();
        let foreign = other.alloc(&xd).unwrap();
        assert_bad(fwd(&pool, &xd, &foreign, &yd, &mut out), "x");
    }
}

#[test]
fn gpu_rejects_f64_tensors_as_unsupported() {
    with_gpu("gpu_rejects_f64_tensors_as_unsupported", |h| {
        let xd = TensorDescriptor::nchw(DataType::F64, 1, 1, 4, 4).unwrap();
        let yd = TensorDescriptor::nchw(DataType::F64, 1, 1, 2, 2).unwrap();
        let (x, mut y) = (h.alloc(&xd).unwrap(), h.alloc(&yd).unwrap());
        let e = pooling_forward(
            h,
            &pool2d(PoolingMode::Max, 2, 0, 2),
            1.0,
            &xd,
            &x,
            0.0,
            &yd,
            &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    });
}
