//! # oxidnn
//!
//! Deep-learning primitives for NVIDIA GPUs, written in Rust end to end: the kernels are
//! `no_std` Rust compiled to PTX at build time (see `kernels/`), this crate launches them
//! behind a cuDNN-like API — a [`Handle`], [`TensorDescriptor`]s, [`Buffer`]s, and ops with
//! cuDNN's `y = alpha * op(x) + beta * y` semantics. Without a GPU, [`Handle::cpu`] runs
//! the same API through the f64 CPU reference.
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! let desc = TensorDescriptor::nchw(DataType::F32, 1, 2, 2, 2)?;
//! let x = handle.upload_tensor(&HostTensor::from_fn(desc, |i| i[3] as f64 - 0.5))?;
//! let mut y = handle.alloc(&desc)?;
//! activation_forward(&handle, &ActivationDescriptor::gelu(), 1.0, &desc, &x, 0.0, &desc, &mut y)?;
//! let out = handle.download_tensor(&desc, &y)?;
//! assert!((out.get(&[0, 0, 0, 1]) - 0.345731).abs() < 1e-5);
//! # Ok::<(), oxidnn::Error>(())
//! ```

mod buffer;
mod descriptor;
mod dtype;
mod error;
mod handle;
mod host_tensor;
mod launch;
mod tma;

pub mod ops;
pub mod reference;

/// Kernel names, generated from the embedded PTX by build.rs.
pub mod kernels {
    use crate::dtype::DataType;
    include!(concat!(env!("OUT_DIR"), "/kernel_names.rs"));
}

pub use buffer::Buffer;
pub use descriptor::{Layout, TensorDescriptor};
pub use dtype::{DataType, HostElement};
pub use error::{Error, Result};
pub use handle::Handle;
pub use host_tensor::{for_each_index, HostTensor};
pub use ops::activation::{
    activation_backward, activation_forward, activation_forward_in_place, ActivationDescriptor,
    ActivationMode,
};
pub use ops::batch_norm::{
    batch_norm_backward, batch_norm_backward_workspace_size, batch_norm_forward_inference,
    batch_norm_forward_training, batch_norm_forward_training_workspace_size,
    batch_norm_training_reserve_space_size, derive_batch_norm_descriptor, BatchNormDescriptor,
    BatchNormMode, BatchNormOps, EstimatedStats, RunningStats, SavedStats, SavedStatsRef,
    BN_MIN_EPSILON,
};
pub use ops::convolution::{
    convolution_bias_activation_forward, convolution_forward, convolution_forward_output_dims,
    convolution_forward_with, convolution_forward_workspace_size,
    find_convolution_forward_algorithm, get_convolution_forward_algorithm, ConvBias, ConvEpilogue,
    ConvFwdAlgo, ConvFwdAlgoPerf, ConvMode, ConvolutionDescriptor, FilterDescriptor, FilterLayout,
    CONV_MAX_SPATIAL,
};
pub use ops::dropout::{
    dropout_backward, dropout_forward, dropout_generator_state, dropout_reserve_space_size,
    dropout_states_size, DropoutDescriptor, DropoutGeneratorState,
};
pub use ops::layer_norm::{
    layer_norm_backward, layer_norm_backward_workspace_size, layer_norm_forward,
    LayerNormDescriptor, NormMode,
};
pub use ops::lrn::{
    lrn_cross_channel_backward, lrn_cross_channel_forward, lrn_kernel, LrnDescriptor, LRN_MAX_N,
    LRN_MIN_BETA, LRN_MIN_K, LRN_MIN_N,
};
pub use ops::matmul::{
    find_matmul_algorithm, get_matmul_algorithm, matmul, BiasMode, MathType, MatmulAlgo,
    MatmulAlgoPerf, MatmulBias, MatmulDescriptor, MatmulEpilogue, MatmulMath, MatmulResidual,
    Residual,
};
pub use ops::pooling::{
    pooling_backward, pooling_forward, pooling_forward_output_dims, PoolingDescriptor, PoolingMode,
    PoolingNanOpt,
};
pub use ops::reduce::{
    reduce_tensor, reduce_tensor_workspace_size, ReduceOp, ReduceTensorDescriptor,
};
pub use ops::softmax::{softmax_backward, softmax_forward, SoftmaxAlgorithm, SoftmaxMode};
pub use ops::tensor_ops::{
    add_tensor, op_tensor, scale_tensor, set_tensor, transform_tensor, OpTensorOp,
};

/// The PTX a GPU handle loads, as (op family, PTX module) pairs (for inspection, e.g. with
/// `ptxas`). A handle loads a family's module the first time it runs one of its kernels
/// (`<family>_*`).
pub fn ptx_modules() -> &'static [(&'static str, &'static str)] {
    launch::modules::ptx()
}
