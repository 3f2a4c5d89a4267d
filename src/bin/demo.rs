//! The main job: runs a few ops on the GPU (or, without one, on the CPU reference path)
//! and prints what they computed next to what the reference says.

use oxidnn::*;

fn main() -> Result<()> {
    let (handle, why_cpu) = Handle::gpu_or_cpu();
    match &why_cpu {
        None => println!(
            "oxidnn on {} (PTX {})",
            handle.device_name(),
            kernels::PTX_ARCH
        ),
        Some(reason) => println!("oxidnn on the CPU reference path ({reason})"),
    }

    // A small NCHW batch: x in [-2, 2).
    let x_desc = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 4)?;
    let x_host = HostTensor::from_fn(x_desc, |i| {
        ((i[1] * 16 + i[2] * 4 + i[3]) as f64) / 12.0 - 2.0
    });
    let x = handle.upload_tensor(&x_host)?;

    // y = gelu(x) + per-channel bias.
    let mut y = handle.alloc(&x_desc)?;
    activation_forward(
        &handle,
        &ActivationDescriptor::gelu(),
        1.0,
        &x_desc,
        &x,
        0.0,
        &x_desc,
        &mut y,
    )?;
    let b_desc = TensorDescriptor::nchw(DataType::F32, 1, 3, 1, 1)?;
    let bias = handle.upload(&[0.5f32, -0.5, 1.0])?;
    add_tensor(&handle, 1.0, &b_desc, &bias, 1.0, &x_desc, &mut y)?;

    // To NHWC half precision, then per-channel max with its position.
    let h_desc = TensorDescriptor::nhwc(DataType::F16, 2, 3, 4, 4)?;
    let mut y_half = handle.alloc(&h_desc)?;
    transform_tensor(&handle, 1.0, &x_desc, &y, 0.0, &h_desc, &mut y_half)?;
    let m_desc = TensorDescriptor::nchw(DataType::F16, 1, 3, 1, 1)?;
    let red = ReduceTensorDescriptor::new(ReduceOp::Max);
    let mut ws = handle.alloc_bytes(reduce_tensor_workspace_size(
        &handle, &red, &h_desc, &m_desc,
    )?)?;
    let mut maxes = handle.alloc(&m_desc)?;
    let mut at = handle.alloc_bytes(3 * 4)?;
    reduce_tensor(
        &handle,
        &red,
        Some(&mut at),
        &mut ws,
        1.0,
        &h_desc,
        &y_half,
        0.0,
        &m_desc,
        &mut maxes,
    )?;

    let y_out = handle.download_tensor(&x_desc, &y)?;
    let mut y_ref = HostTensor::filled(x_desc, 0.0);
    reference::activation::forward(&ActivationDescriptor::gelu(), 1.0, &x_host, 0.0, &mut y_ref);
    let bias_host = HostTensor::from_fn(b_desc, |i| [0.5, -0.5, 1.0][i[1]]);
    reference::tensor_ops::add_tensor(1.0, &bias_host, 1.0, &mut y_ref);

    println!(
        "gelu(x) + bias, image 0 channel 0, row 0: {:?}",
        &y_out.logical()[..4]
    );
    println!(
        "reference                               : {:?}",
        &y_ref.logical()[..4]
    );
    let max_err = y_out
        .logical()
        .iter()
        .zip(y_ref.logical())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "max |oxidnn - reference| over all {} elements: {max_err:.3e}",
        x_desc.element_count()
    );
    let maxes = handle.download_tensor(&m_desc, &maxes)?.logical();
    println!(
        "per-channel max (f16, NHWC input): {maxes:?} at flattened N*H*W index {:?}",
        handle.read::<u32>(&at)?
    );
    convolution_demo(&handle, &x_desc, &x_host)
}

/// relu(conv3x3(x) + bias) with the algorithm the heuristic picks, against the reference.
fn convolution_demo(handle: &Handle, x_desc: &TensorDescriptor, x_host: &HostTensor) -> Result<()> {
    let w_desc = FilterDescriptor::new(DataType::F32, FilterLayout::Kcrs, 4, 3, &[3, 3])?;
    let conv = ConvolutionDescriptor::new(
        &[1, 1],
        &[1, 1],
        &[1, 1],
        ConvMode::CrossCorrelation,
        MathType::Fma,
    )?;
    let y_dims = convolution_forward_output_dims(&conv, x_desc, &w_desc)?;
    let y_desc = TensorDescriptor::packed(DataType::F32, &y_dims)?;
    let w_host = HostTensor::from_fn(*w_desc.tensor(), |i| {
        ((i[0] * 27 + i[1] * 9 + i[2] * 3 + i[3]) % 7) as f64 / 7.0 - 0.4
    });
    let bias_desc = TensorDescriptor::packed(DataType::F32, &[4])?;
    let bias_host = HostTensor::from_fn(bias_desc, |i| i[0] as f64 * 0.25 + 0.5);
    let (x, w, bias) = (
        handle.upload_tensor(x_host)?,
        handle.upload_tensor(&w_host)?,
        handle.upload_tensor(&bias_host)?,
    );
    let algo = get_convolution_forward_algorithm(handle, x_desc, &w_desc, &conv, &y_desc)?[0].algo;
    let mut ws = handle.alloc_bytes(
        convolution_forward_workspace_size(handle, x_desc, &w_desc, &conv, &y_desc, algo)?.max(1),
    )?;
    let mut y = handle.alloc(&y_desc)?;
    let relu = ActivationDescriptor::relu();
    convolution_bias_activation_forward(
        handle,
        1.0,
        x_desc,
        &x,
        &w_desc,
        &w,
        &conv,
        algo,
        Some(&mut ws),
        0.0,
        None,
        &bias_desc,
        &bias,
        &relu,
        &y_desc,
        &mut y,
    )?;
    let got = handle.download_tensor(&y_desc, &y)?.logical();
    let mut want = HostTensor::filled(y_desc, 0.0);
    reference::convolution::forward(
        &conv,
        1.0,
        x_host,
        &w_host,
        0.0,
        &mut want,
        Some(&bias_host),
        None,
        &relu,
    );
    let err = got
        .iter()
        .zip(want.logical())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "relu(conv3x3(x) + bias) by {algo:?}: y {:?}, first row {:?}, max |oxidnn - reference| {err:.3e}",
        y_desc.dims(),
        &got[..4]
    );
    Ok(())
}
