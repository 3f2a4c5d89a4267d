//! Convolution forward (`conv_fwd_<algo>_<dtype>`), mirrored by `src/ops/convolution.rs`.
//! Every algorithm computes the convolution [`oxidnn_params::ConvGeometry`] defines and
//! finishes each output element through the shared [`crate::epilogue`] (bias one per
//! output channel), so the algorithms differ only in how they walk the sums:
//!
//! * [`direct`]: one thread per output element, any layout, strides, groups, dims; the
//!   always-correct fallback.
//! * [`implicit_gemm`]: implicit GEMM on tensor cores (`mma.sync`, and `wgmma` in the
//!   sm90a build, where `lib.rs` compiles it with `implicit_gemm_tma`, the same GEMM on
//!   the warp-specialised TMA core, operands copied by TMA in im2col and tiled modes).
//! * [`winograd`]: Winograd F(2x2, 3x3) transforms around a batched matmul (3x3, stride 1).
//! * [`implicit_gemm_fma`]: exact-f32 implicit GEMM on CUDA cores (`cp.async` im2col
//!   copies for channels-first x, register-staged gathers otherwise).
//! * [`depthwise`]: groups == c, memory-bound, per layout.
//! * [`channel_padding`]: stages x and the filter with their channels padded to a copy
//!   unit for the implicit GEMM's packed kernels (few channels per group: C = 3).

pub mod channel_padding;
pub mod depthwise;
pub mod direct;
pub mod implicit_gemm;
pub mod implicit_gemm_fma;
pub mod winograd;
