//! reduce_tensor: exact CPU examples, the GPU against the reference over drawn shapes,
//! reduced-dim sets, layouts, ops and dtypes (including the split-reduction path), and
//! bad inputs.

mod common;

use common::*;
use oxidnn::*;
use proptest::prelude::*;

fn run(
    h: &Handle,
    op: ReduceOp,
    xd: TensorDescriptor,
    yd: TensorDescriptor,
    (alpha, beta): (f64, f64),
    seed: u64,
) {
    let mut r = rng(seed);
    // Products of many values need factors near 1 to stay finite and non-zero.
    // Sums are kept inside f16's range (65504) by scaling long reductions down.
    let red_len = xd.element_count() / yd.element_count();
    let scale = (1000.0 / red_len as f64).min(1.0);
    let (lo, hi) = match op {
        ReduceOp::Mul | ReduceOp::MulNoZeros => (0.9, 1.1),
        _ => (-3.0 * scale, 3.0 * scale),
    };
    let mut xt = random(xd, lo, hi, &mut r);
    if op == ReduceOp::MulNoZeros {
        oxidnn::for_each_index(xd.dims(), |i| {
            if r.gen_bool(0.1) {
                xt.set(i, 0.0)
            }
        });
    }
    let y0 = random(yd, -1.0, 1.0, &mut r);
    let x = upload_poisoned(h, &xt, false);
    let mut y = upload_poisoned(h, &y0, beta == 0.0);
    let red = ReduceTensorDescriptor::new(op);
    let mut idx = h.alloc_bytes(yd.element_count() * 4).unwrap();
    let ws_len = reduce_tensor_workspace_size(h, &red, &xd, &yd).unwrap();
    let mut ws = h.alloc_bytes(ws_len).unwrap();
    let indices = if op.selects() { Some(&mut idx) } else { None };
    reduce_tensor(h, &red, indices, &mut ws, alpha, &xd, &x, beta, &yd, &mut y).unwrap();
    let mut want = y0.clone();
    let want_idx = oxidnn::reference::reduce::reduce(op, alpha, &xt, beta, &mut want);
    // f32 accumulation: the bound grows with the reduction length.
    let tol = bound(xd.dtype()).max(2e-7 * (red_len as f64).sqrt() * 8.0);
    // Sums of values of either sign (and their blend with y) may cancel to near zero:
    // their error is measured against the same sums of the magnitudes.
    let magnitude = match op {
        ReduceOp::Add | ReduceOp::Avg => {
            let abs = |t: &HostTensor| HostTensor::from_fn(t.desc, |i| t.get(i).abs());
            let mut m = abs(&y0);
            oxidnn::reference::reduce::reduce(op, alpha.abs(), &abs(&xt), beta.abs(), &mut m);
            m
        }
        _ => want.clone(),
    };
    check_scaled(
        h,
        &yd,
        &y,
        &want,
        &magnitude,
        tol,
        &format!("{op:?} {} -> {}", xd.problem_string(), yd.problem_string()),
    );
    if op.selects() && xd.dtype() == DataType::F32 {
        assert_eq!(h.read::<u32>(&idx).unwrap(), want_idx, "{op:?} indices");
    }
}

use rand::Rng;

#[test]
fn cpu_reduces_each_op_exactly() {
    let h = Handle::cpu();
    let xd = TensorDescriptor::packed(DataType::F64, &[2, 4]).unwrap();
    let yd = TensorDescriptor::packed(DataType::F64, &[2, 1]).unwrap();
    let x = h
        .upload(&[1.0f64, -2.0, 0.0, 4.0, 3.0, 3.0, -5.0, 0.5])
        .unwrap();
    let cases: [(ReduceOp, [f64; 2]); 9] = [
        (ReduceOp::Add, [3.0, 1.5]),
        (ReduceOp::Mul, [0.0, -22.5]),
        (ReduceOp::Min, [-2.0, -5.0]),
        (ReduceOp::Max, [4.0, 3.0]),
        (ReduceOp::Amax, [4.0, 5.0]),
        (ReduceOp::Avg, [0.75, 0.375]),
        (ReduceOp::Norm1, [7.0, 11.5]),
        (ReduceOp::Norm2, [21.0f64.sqrt(), 43.25f64.sqrt()]),
        (ReduceOp::MulNoZeros, [-8.0, -22.5]),
    ];
    for (op, want) in cases {
        let mut y = h.alloc(&yd).unwrap();
        let mut ws = h.alloc_bytes(0).unwrap();
        let mut idx = h.alloc_bytes(8).unwrap();
        let indices = if op.selects() { Some(&mut idx) } else { None };
        reduce_tensor(
            &h,
            &ReduceTensorDescriptor::new(op),
            indices,
            &mut ws,
            1.0,
            &xd,
            &x,
            0.0,
            &yd,
            &mut y,
        )
        .unwrap();
        assert_eq!(h.read::<f64>(&y).unwrap(), want, "{op:?}");
        if op == ReduceOp::Max {
            // First occurrence on ties: row 1 has 3.0 at 0 and 1.
            assert_eq!(h.read::<u32>(&idx).unwrap(), [3, 0]);
        }
    }
}

proptest! {
    #![proptest_config(gpu_cases(96))]

    #[test]
    fn gpu_reduce_matches_reference(
        (xd, yd) in two_layouts(4, 8192), mask in 1u8.., op in prop::sample::select(ReduceOp::ALL.to_vec()),
        ab in alpha_beta(), seed in any::<u64>(),
    ) {
        with_gpu("gpu_reduce_matches_reference", |h| {
            let ydims: Vec<usize> = yd.dims().iter().enumerate().map(|(i, &n)| if mask >> i & 1 == 1 { 1 } else { n }).collect();
            let yd = TensorDescriptor::packed(yd.dtype(), &ydims).unwrap();
            run(h, op, xd, yd, ab, seed);
        });
    }
}

#[test]
fn gpu_long_reductions_take_the_split_path() {
    with_gpu("gpu_long_reductions_take_the_split_path", |h| {
        for dt in DataType::GPU {
            for op in ReduceOp::ALL {
                // Everything into one value; per-channel sums of an NCHW tensor; rows.
                let shapes: [(&[usize], &[usize]); 3] = [
                    (&[1 << 20], &[1]),
                    (&[8, 16, 64, 64], &[1, 16, 1, 1]),
                    (&[64, 40_000], &[64, 1]),
                ];
                for (xs, ys) in shapes {
                    let xd = TensorDescriptor::packed(dt, xs).unwrap();
                    let yd = TensorDescriptor::packed(dt, ys).unwrap();
                    run(
                        h,
                        op,
                        xd,
                        yd,
                        (1.0, 0.0),
                        xs.iter().product::<usize>() as u64,
                    );
                }
            }
        }
    });
}

#[test]
fn gpu_rows_and_columns_of_every_length() {
    with_gpu("gpu_rows_and_columns_of_every_length", |h| {
        for dt in DataType::GPU {
            for len in [2usize, 3, 17, 33, 56, 64, 100, 1000, 9000] {
                for op in [
                    ReduceOp::Add,
                    ReduceOp::Max,
                    ReduceOp::Amax,
                    ReduceOp::Norm2,
                ] {
                    // Rows (grouped lanes per output) and columns (a thread per output).
                    let rows = (
                        TensorDescriptor::packed(dt, &[300, len]).unwrap(),
                        TensorDescriptor::packed(dt, &[300, 1]).unwrap(),
                    );
                    let cols = (
                        TensorDescriptor::packed(dt, &[len, 300]).unwrap(),
                        TensorDescriptor::packed(dt, &[1, 300]).unwrap(),
                    );
                    for (xd, yd) in [rows, cols] {
                        run(h, op, xd, yd, (1.0, 0.0), len as u64);
                    }
                }
            }
        }
    });
}

#[test]
fn bad_inputs_are_rejected_with_typed_errors() {
    for h in handles() {
        let xd = TensorDescriptor::packed(DataType::F32, &[64, 4096]).unwrap();
        let yd = TensorDescriptor::packed(DataType::F32, &[64, 1]).unwrap();
        let x = h.alloc(&xd).unwrap();
        let mut y = h.alloc(&yd).unwrap();
        let mut ws = h.alloc_bytes(0).unwrap();
        let add = ReduceTensorDescriptor::new(ReduceOp::Add);
        let bad_y = TensorDescriptor::packed(DataType::F32, &[32, 1]).unwrap();
        let e =
            reduce_tensor(h, &add, None, &mut ws, 1.0, &xd, &x, 0.0, &bad_y, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let rank3 = TensorDescriptor::packed(DataType::F32, &[64, 1, 1]).unwrap();
        let e =
            reduce_tensor(h, &add, None, &mut ws, 1.0, &xd, &x, 0.0, &rank3, &mut y).unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "y_desc", .. }), "{e}");
        let mut idx = h.alloc_bytes(64 * 4).unwrap();
        let e = reduce_tensor(
            h,
            &add,
            Some(&mut idx),
            &mut ws,
            1.0,
            &xd,
            &x,
            0.0,
            &yd,
            &mut y,
        )
        .unwrap_err();
        assert!(matches!(e, Error::BadParam { arg: "indices", .. }), "{e}");
        let mut short_idx = h.alloc_bytes(64 * 4 - 1).unwrap();
        let max = ReduceTensorDescriptor::new(ReduceOp::Max);
        let e = reduce_tensor(
            h,
            &max,
            Some(&mut short_idx),
            &mut ws,
            1.0,
            &xd,
            &x,
            0.0,
            &yd,
            &mut y,
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::BufferTooSmall { arg: "indices", .. }),
            "{e}"
        );
        // The whole tensor into one value needs a workspace on the GPU.
        let one = TensorDescriptor::packed(DataType::F32, &[1, 1]).unwrap();
        let need = reduce_tensor_workspace_size(h, &add, &xd, &one).unwrap();
        if need > 0 {
            let mut small = h.alloc_bytes(need - 1).unwrap();
            let mut y1 = h.alloc(&one).unwrap();
            let e = reduce_tensor(h, &add, None, &mut small, 1.0, &xd, &x, 0.0, &one, &mut y1)
                .unwrap_err();
            assert!(matches!(e, Error::WorkspaceTooSmall { .. }), "{e}");
        }
    }
}
