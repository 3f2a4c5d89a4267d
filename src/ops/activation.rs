//! Activation forward and backward (cudnnActivationForward / cudnnActivationBackward).
//!
//! ```
//! use oxidnn::{activation_forward, ActivationDescriptor, DataType, Handle, HostTensor, TensorDescriptor};
//! let (handle, _) = Handle::gpu_or_cpu();
//! let desc = TensorDescriptor::packed(DataType::F32, &[2, 3])?;
//! let x = handle.upload_tensor(&HostTensor::from_fn(desc, |i| i[1] as f64 - 1.0))?;
//! let mut y = handle.alloc(&desc)?;
//! activation_forward(&handle, &ActivationDescriptor::relu(), 1.0, &desc, &x, 0.0, &desc, &mut y)?;
//! assert_eq!(handle.download_tensor(&desc, &y)?.logical(), [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]);
//! # Ok::<(), oxidnn::Error>(())
//! ```

use super::layout::fold;
use super::{host_read, host_write, scale_factor, ElementwisePlan};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut};
use crate::reference;
pub use oxidnn_params::ActivationKind as ActivationMode;
use oxidnn_params::{ActivationBwdParams, ActivationFwdParams};

/// An activation function and its coefficient (cuDNN's `cudnnActivationDescriptor_t`).
///
/// The coefficient is the ceiling of clipped relu, the negative slope of leaky relu, the
/// alpha of elu and the beta of swish; other modes ignore it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationDescriptor {
    mode: ActivationMode,
    coef: f64,
}

impl Default for ActivationDescriptor {
    /// The identity.
    fn default() -> Self {
        Self::identity()
    }
}

impl ActivationDescriptor {
    /// `mode` with coefficient `coef`; the coefficient must be finite, and positive for
    /// clipped relu.
    pub fn new(mode: ActivationMode, coef: f64) -> Result<Self> {
        if !coef.is_finite() {
            return Err(Error::bad("coef", format!("must be finite, got {coef}")));
        }
        if mode == ActivationMode::ClippedRelu && coef <= 0.0 {
            return Err(Error::bad(
                "coef",
                format!("the clipped relu ceiling must be > 0, got {coef}"),
            ));
        }
        Ok(Self { mode, coef })
    }

    fn of(mode: ActivationMode, coef: f64) -> Self {
        Self { mode, coef }
    }

    pub fn identity() -> Self {
        Self::of(ActivationMode::Identity, 0.0)
    }
    pub fn relu() -> Self {
        Self::of(ActivationMode::Relu, 0.0)
    }
    /// `min(max(x, 0), ceiling)`.
    pub fn clipped_relu(ceiling: f64) -> Result<Self> {
        Self::new(ActivationMode::ClippedRelu, ceiling)
    }
    /// `x` for `x > 0`, else `slope * x`.
    pub fn leaky_relu(slope: f64) -> Result<Self> {
        Self::new(ActivationMode::LeakyRelu, slope)
    }
    /// `x` for `x > 0`, else `alpha * (e^x - 1)`.
    pub fn elu(alpha: f64) -> Result<Self> {
        Self::new(ActivationMode::Elu, alpha)
    }
    pub fn sigmoid() -> Self {
        Self::of(ActivationMode::Sigmoid, 0.0)
    }
    pub fn tanh() -> Self {
        Self::of(ActivationMode::Tanh, 0.0)
    }
    /// `x * sigmoid(beta * x)`.
    pub fn swish(beta: f64) -> Result<Self> {
        Self::new(ActivationMode::Swish, beta)
    }
    /// SiLU: swish with beta = 1.
    pub fn silu() -> Self {
        Self::of(ActivationMode::Swish, 1.0)
    }
    /// GELU, exact (erf) form.
    pub fn gelu() -> Self {
        Self::of(ActivationMode::GeluErf, 0.0)
    }
    /// GELU, tanh approximation.
    pub fn gelu_tanh() -> Self {
        Self::of(ActivationMode::GeluTanh, 0.0)
    }
    pub fn softplus() -> Self {
        Self::of(ActivationMode::Softplus, 0.0)
    }

    pub fn mode(&self) -> ActivationMode {
        self.mode
    }
    pub fn coef(&self) -> f64 {
        self.coef
    }
}

/// `y = alpha * f(x) + beta * y`. `x` and `y` have the same dims and dtype and any strides;
/// with `beta == 0`, `y` is not read.
#[allow(clippy::too_many_arguments)]
pub fn activation_forward(
    handle: &Handle,
    act: &ActivationDescriptor,
    alpha: f64,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    forward(handle, act, alpha, Some((x_desc, x)), beta, y_desc, y)
}

/// In place: `y = alpha * f(y) + beta * y` (cudnnActivationForward with `x == y`, which
/// Rust's borrows cannot express through [`activation_forward`]).
pub fn activation_forward_in_place(
    handle: &Handle,
    act: &ActivationDescriptor,
    alpha: f64,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    forward(handle, act, alpha, None, beta, y_desc, y)
}

/// The forward pass; `x == None` reads `y` itself (each element is read and then written
/// by the same thread, which the kernels allow).
fn forward(
    handle: &Handle,
    act: &ActivationDescriptor,
    alpha: f64,
    x: Option<(&TensorDescriptor, &Buffer)>,
    beta: f64,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
) -> Result<()> {
    let x_desc = x.map_or(y_desc, |(d, _)| d);
    check_same_dims("y_desc", x_desc, y_desc)?;
    check_same_dtype("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    if let Some((d, b)) = x {
        handle.check_tensor("x", d, b)?;
    }
    handle.check_tensor("y", y_desc, y)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let xt = match x {
                Some((d, b)) => host_read(d, b)?,
                None => host_read(y_desc, y)?,
            };
            let mut yt = host_read(y_desc, y)?;
            reference::activation::forward(act, alpha, &xt, beta, &mut yt);
            host_write(&yt, y)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let folded = fold(x_desc.dims(), [x_desc.strides(), y_desc.strides()], 1);
            let plan = ElementwisePlan::new(&folded, dtype.size_bytes(), gpu.sm_count)?;
            let kernel = plan.kernel(
                kernels::activation_fwd_packed(dtype),
                kernels::activation_fwd_strided(dtype),
                || format!("activation on {dtype} tensors on the GPU"),
            )?;
            let p = ActivationFwdParams {
                kind: act.mode as u32,
                coef: act.coef as f32,
                alpha: alpha32,
                beta: beta32,
                len: folded.len() as u64,
                map: plan.map.unwrap_or_default(),
            };
            let x_ptr = match x {
                Some((_, b)) => device_ptr(gpu, b)?,
                None => device_ptr_mut(gpu, y)?,
            };
            let ptrs = [x_ptr, device_ptr_mut(gpu, y)?];
            // SAFETY: both buffers hold their descriptors' spans (checked above) and the
            // folded map only produces offsets inside those spans; in place, x and y share
            // one descriptor, so every element is read and written at the same offset.
            unsafe { gpu.launch(kernel, plan.cfg, &p, &ptrs) }
        }
    }
}

/// `dx = alpha * f'(x) * dy + beta * dx`, as cudnnActivationBackward. `y` (the forward
/// output) is validated as cuDNN requires, but derivatives are evaluated at `x`, so it is
/// never read. All four tensors have the same dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn activation_backward(
    handle: &Handle,
    act: &ActivationDescriptor,
    alpha: f64,
    y_desc: &TensorDescriptor,
    y: &Buffer,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    beta: f64,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
) -> Result<()> {
    for (arg, d) in [
        ("y_desc", y_desc),
        ("dy_desc", dy_desc),
        ("dx_desc", dx_desc),
    ] {
        check_same_dims(arg, x_desc, d)?;
        check_same_dtype(arg, x_desc, d)?;
    }
    check_output("dx_desc", dx_desc)?;
    handle.check_tensor("y", y_desc, y)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    let (alpha32, beta32) = (scale_factor("alpha", alpha)?, scale_factor("beta", beta)?);
    match &handle.backend {
        Backend::Cpu => {
            let (dyt, xt) = (host_read(dy_desc, dy)?, host_read(x_desc, x)?);
            let mut dxt = host_read(dx_desc, dx)?;
            reference::activation::backward(act, alpha, &dyt, &xt, beta, &mut dxt);
            host_write(&dxt, dx)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let strides = [dy_desc.strides(), x_desc.strides(), dx_desc.strides()];
            let folded = fold(x_desc.dims(), strides, 2);
            let plan = ElementwisePlan::new(&folded, dtype.size_bytes(), gpu.sm_count)?;
            let kernel = plan.kernel(
                kernels::activation_bwd_packed(dtype),
                kernels::activation_bwd_strided(dtype),
                || format!("activation backward on {dtype} tensors on the GPU"),
            )?;
            let p = ActivationBwdParams {
                kind: act.mode as u32,
                coef: act.coef as f32,
                alpha: alpha32,
                beta: beta32,
                len: folded.len() as u64,
                map: plan.map.unwrap_or_default(),
            };
            let ptrs = [
                device_ptr(gpu, y)?,
                device_ptr(gpu, dy)?,
                device_ptr(gpu, x)?,
                device_ptr_mut(gpu, dx)?,
            ];
            // SAFETY: every buffer holds its descriptor's span (checked above); the folded map
            // only produces offsets inside them.
            unsafe { gpu.launch(kernel, plan.cfg, &p, &ptrs) }
        }
    }
}
