//! Activation forward/backward: the reference against known values and finite
//! differences, the GPU against the reference on drawn shapes/layouts/dtypes, and every
//! kind of bad input.

mod common;

use common::*;
use oxidnn::reference::activation::{apply, derivative};
use oxidnn::*;
use proptest::prelude::*;

const ALL_DESCRIPTORS: fn() -> Vec<ActivationDescriptor> = || {
    vec![
        ActivationDescriptor::identity(),
        ActivationDescriptor::relu(),
        ActivationDescriptor::clipped_relu(1.5).unwrap(),
        ActivationDescriptor::leaky_relu(0.1).unwrap(),
        ActivationDescriptor::elu(0.7).unwrap(),
        ActivationDescriptor::sigmoid(),
        ActivationDescriptor::tanh(),
        ActivationDescriptor::swish(1.7).unwrap(),
        ActivationDescriptor::silu(),
        ActivationDescriptor::gelu(),
        ActivationDescriptor::gelu_tanh(),
        ActivationDescriptor::softplus(),
    ]
};

fn any_activation() -> impl Strategy<Value = ActivationDescriptor> {
    prop::sample::select(ALL_DESCRIPTORS())
}

#[test]
fn reference_matches_known_values() {
    use ActivationMode::*;
    let cases = [
        (Relu, 0.0, -1.0, 0.0),
        (Relu, 0.0, 2.5, 2.5),
        (ClippedRelu, 6.0, 7.0, 6.0),
        (LeakyRelu, 0.1, -2.0, -0.2),
        (Elu, 1.0, -1.0, (-1.0f64).exp() - 1.0),
        (Sigmoid, 0.0, 0.0, 0.5),
        (Tanh, 0.0, 0.5, 0.46211715726000974),
        (Swish, 1.0, 1.0, 0.7310585786300049),
        (GeluErf, 0.0, 1.0, 0.8413447460685429),
        (GeluTanh, 0.0, 1.0, 0.8411919906082768),
        (Softplus, 0.0, 0.0, std::f64::consts::LN_2),
        (Softplus, 0.0, -40.0, (-40.0f64).exp()),
    ];
    for (mode, coef, x, want) in cases {
        let got = apply(mode, coef, x);
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1e-300),
            "{mode:?}({x}) = {got}, want {want}"
        );
    }
}

#[test]
fn reference_derivatives_match_finite_differences() {
    for act in ALL_DESCRIPTORS() {
        for &x in &[-3.1, -0.7, -0.05, 0.3, 1.2, 2.9] {
            let h = 1e-6;
            let numeric = (apply(act.mode(), act.coef(), x + h)
                - apply(act.mode(), act.coef(), x - h))
                / (2.0 * h);
            let analytic = derivative(act.mode(), act.coef(), x);
            assert!(
                (numeric - analytic).abs() < 1e-6,
                "{act:?} at {x}: numeric {numeric}, analytic {analytic}"
            );
        }
    }
}

#[test]
fn cpu_handle_blends_with_alpha_beta_and_ignores_y_when_beta_is_zero() {
    let h = Handle::cpu();
    let d = TensorDescriptor::packed(DataType::F32, &[4]).unwrap();
    let x = h.upload(&[-1.0f32, 0.5, 2.0, 3.0]).unwrap();
    let mut y = h.upload(&[f32::NAN, 10.0, 10.0, 10.0]).unwrap();
    activation_forward(
        &h,
        &ActivationDescriptor::relu(),
        2.0,
        &d,
        &x,
        0.0,
        &d,
        &mut y,
    )
    .unwrap();
    assert_eq!(h.read::<f32>(&y).unwrap(), [0.0, 1.0, 4.0, 6.0]);
    activation_forward(
        &h,
        &ActivationDescriptor::relu(),
        1.0,
        &d,
        &x,
        0.5,
        &d,
        &mut y,
    )
    .unwrap();
    assert_eq!(h.read::<f32>(&y).unwrap(), [0.0, 1.0, 4.0, 6.0]);
}

fn run_forward(
    h: &Handle,
    act: &ActivationDescriptor,
    xd: TensorDescriptor,
    yd: TensorDescriptor,
    (alpha, beta): (f64, f64),
    seed: u64,
) {
    let mut r = rng(seed);
    let xt = random(xd, -4.0, 4.0, &mut r);
    let y0 = random(yd, -1.0, 1.0, &mut r);
    let x = upload_poisoned(h, &xt, false);
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    activation_forward(h, act, alpha, &xd, &x, beta, &yd, &mut y).unwrap();
    let mut want = y0.clone();
    oxidnn::reference::activation::forward(act, alpha, &xt, beta, &mut want);
    check(
        h,
        &yd,
        &y,
        &want,
        bound(xd.dtype()),
        &format!("{act:?} forward alpha {alpha} beta {beta}"),
    );
}

proptest! {
    #![proptest_config(gpu_cases(96))]

    #[test]
    fn gpu_forward_matches_reference((xd, yd) in two_layouts(5, 4096), act in any_activation(), ab in alpha_beta(), seed in any::<u64>()) {
        with_gpu("gpu_forward_matches_reference", |h| run_forward(h, &act, xd, yd, ab, seed));
    }

    #[test]
    fn gpu_backward_matches_reference(
        (dims, dt) in (dims(4, 4096), gpu_dtype()),
        layouts in any::<[u8; 3]>(),
        act in any_activation(), (alpha, beta) in alpha_beta(), seed in any::<u64>(),
    ) {
        with_gpu("gpu_backward_matches_reference", |h| {
            // Three layouts drawn from the seed bytes: packed, reversed or padded.
            let pick = |b: u8| -> TensorDescriptor {
                let rank = dims.len();
                let mut strides = vec![0; rank];
                let mut s = 1;
                let order: Vec<usize> = if b % 3 == 1 { (0..rank).collect() } else { (0..rank).rev().collect() };
                for d in order {
                    strides[d] = s;
                    s *= dims[d] + if b % 3 == 2 { 1 } else { 0 };
                }
                TensorDescriptor::new(dt, &dims, &strides).unwrap()
            };
            let (dyd, xd, dxd) = (pick(layouts[0]), pick(layouts[1]), pick(layouts[2]));
            let mut r = rng(seed);
            let (dyt, xt, dx0) = (random(dyd, -2.0, 2.0, &mut r), random(xd, -4.0, 4.0, &mut r), random(dxd, -1.0, 1.0, &mut r));
            let (dy, x) = (upload_poisoned(h, &dyt, false), upload_poisoned(h, &xt, false));
            let y = h.alloc(&xd).unwrap();
            let mut dx = upload_poisoned(h, &dx0, beta == 0.0);
            activation_backward(h, &act, alpha, &xd, &y, &dyd, &dy, &xd, &x, beta, &dxd, &mut dx).unwrap();
            let mut want = dx0.clone();
            oxidnn::reference::activation::backward(&act, alpha, &dyt, &xt, beta, &mut want);
            check(h, &dxd, &dx, &want, bound(dt), &format!("{act:?} backward"));
        });
    }
}

#[test]
fn gpu_large_packed_tensors_with_ragged_tails() {
    with_gpu("gpu_large_packed_tensors_with_ragged_tails", |h| {
        for dt in DataType::GPU {
            for len in [(1 << 20) + 13, 31, 1] {
                let d = TensorDescriptor::packed(dt, &[len]).unwrap();
                for act in [ActivationDescriptor::gelu(), ActivationDescriptor::relu()] {
                    run_forward(h, &act, d, d, (1.0, 0.0), len as u64);
                    run_forward(h, &act, d, d, (0.5, 2.0), len as u64 + 1);
                }
            }
        }
    });
}

/// In place (x == y) equals the out-of-place result, on the CPU handle and the GPU, for
/// packed and padded layouts.
#[test]
fn in_place_forward_matches_out_of_place() {
    for h in handles() {
        for dt in DataType::GPU {
            let packed = TensorDescriptor::packed(dt, &[3, 1000]).unwrap();
            let padded = TensorDescriptor::new(dt, &[3, 1000], &[1003, 1]).unwrap();
            for d in [packed, padded] {
                let t = random(d, -3.0, 3.0, &mut rng(7));
                for act in [ActivationDescriptor::gelu(), ActivationDescriptor::relu()] {
                    for (alpha, beta) in [(1.0, 0.0), (0.5, 0.25)] {
                        let x = upload_poisoned(h, &t, false);
                        let mut y = upload_poisoned(h, &t, false);
                        activation_forward(h, &act, alpha, &d, &x, beta, &d, &mut y).unwrap();
                        let mut z = upload_poisoned(h, &t, false);
                        activation_forward_in_place(h, &act, alpha, beta, &d, &mut z).unwrap();
                        assert_eq!(
                            h.read_bytes(&y).unwrap(),
                            h.read_bytes(&z).unwrap(),
                            "{act:?} {d:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gpu_nan_propagates_and_nan_in_y_does_not_leak_with_beta_zero() {
    with_gpu("gpu_nan_propagates", |h| {
        let d = TensorDescriptor::packed(DataType::F32, &[64]).unwrap();
        let mut xs = vec![1.0f32; 64];
        xs[5] = f32::NAN;
        let x = h.upload(&xs).unwrap();
        for act in ALL_DESCRIPTORS() {
            let mut y = h.upload(&vec![f32::NAN; 64]).unwrap();
            activation_forward(h, &act, 1.0, &d, &x, 0.0, &d, &mut y).unwrap();
            let out = h.read::<f32>(&y).unwrap();
            assert!(out[5].is_nan(), "{act:?} swallowed a NaN");
            assert!(
                out.iter().enumerate().all(|(i, v)| i == 5 || v.is_finite()),
                "{act:?} leaked NaN from y"
            );
        }
    });
}

/// Every way to call activation_forward/backward wrongly, on the CPU handle and (where
/// present) the GPU handle: each returns its typed error, never panics.
#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for h in handles() {
        let d = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let relu = ActivationDescriptor::relu();

        let other_dims = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 6).unwrap();
        let e = activation_forward(h, &relu, 1.0, &d, &x, 0.0, &other_dims, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");

        let other_type = d.with_dtype(DataType::F16).unwrap();
        let e = activation_forward(h, &relu, 1.0, &d, &x, 0.0, &other_type, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");

        let mut short = h.alloc_bytes(d.size_bytes() - 1).unwrap();
        let e = activation_forward(h, &relu, 1.0, &d, &x, 0.0, &d, &mut short).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "y", .. }), "{e}");
        let e = activation_forward(h, &relu, 1.0, &d, &short, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "x", .. }), "{e}");

        let overlapping = TensorDescriptor::new(DataType::F32, &[4, 4], &[1, 1]).unwrap();
        let e = activation_forward(h, &relu, 1.0, &overlapping, &x, 0.0, &overlapping, &mut y)
            .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");

        let e = activation_forward(h, &relu, f64::NAN, &d, &x, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "alpha", .. }), "{e}");

        let stranger = Handle::cpu().alloc(&d).unwrap();
        let e = activation_forward(h, &relu, 1.0, &d, &stranger, 0.0, &d, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "x", .. }), "{e}");

        let e = activation_forward_in_place(h, &relu, 1.0, 0.0, &d, &mut short).unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "y", .. }), "{e}");
        let e = activation_forward_in_place(h, &relu, 1.0, 0.0, &overlapping, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");

        let e = activation_backward(
            h,
            &relu,
            1.0,
            &d,
            &x,
            &other_dims,
            &x,
            &d,
            &x,
            0.0,
            &d,
            &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "dy_desc", .. }), "{e}");
        let e = activation_backward(h, &relu, 1.0, &d, &x, &d, &short, &d, &x, 0.0, &d, &mut y)
            .unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { arg: "dy", .. }), "{e}");
    }
    assert!(matches!(
        ActivationDescriptor::clipped_relu(0.0),
        Err(Error::BadParam { arg: "coef", .. })
    ));
    assert!(matches!(
        ActivationDescriptor::elu(f64::INFINITY),
        Err(Error::BadParam { arg: "coef", .. })
    ));
}

#[test]
fn gpu_rejects_f64_as_not_supported() {
    with_gpu("gpu_rejects_f64_as_not_supported", |h| {
        let d = TensorDescriptor::packed(DataType::F64, &[8]).unwrap();
        let x = h.alloc(&d).unwrap();
        let mut y = h.alloc(&d).unwrap();
        let e = activation_forward(
            h,
            &ActivationDescriptor::relu(),
            1.0,
            &d,
            &x,
            0.0,
            &d,
            &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
    });
}
