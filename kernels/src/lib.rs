//! oxidnn device code: `no_std` Rust compiled to PTX by the host crate's `build.rs`.
//!
//! One module per op family (mirrored by `src/ops/<family>.rs` on the host). Kernel entry
//! points are named `<op>_<dir>_<algo>_<dtype>`, take their `#[repr(C)]` parameter struct
//! from `oxidnn-params` first and device pointers after it. Device intrinsics and inline
//! PTX live in [`device`] alone.
//!
//! Built twice by the host's `build.rs`: for sm_80 (every op family but the Hopper one),
//! and with the `sm90a` feature for `sm_90a`, where only the `wgmma_*` kernels (and the
//! modules they use) are compiled.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, stmt_expr_attributes)]
#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]
// The sm90a build compiles the shared modules without the sm_80 entry points that use
// most of their items.
#![cfg_attr(feature = "sm90a", allow(unused_imports, unused_macros, dead_code))]

pub mod device;
pub mod element;
pub mod elementwise;
pub mod epilogue;
pub mod gemm;
pub mod math;
#[cfg(not(feature = "sm90a"))]
pub mod rows;

pub mod activation;
#[cfg(not(feature = "sm90a"))]
pub mod batch_norm;
#[cfg(not(feature = "sm90a"))]
pub mod convolution;
/// The sm90a build's part of the convolution family: the implicit GEMM's `wgmma` kernels.
#[cfg(feature = "sm90a")]
pub mod convolution {
    pub mod implicit_gemm;
    pub mod implicit_gemm_tma;
}
#[cfg(not(feature = "sm90a"))]
pub mod dropout;
#[cfg(not(feature = "sm90a"))]
pub mod layer_norm;
#[cfg(not(feature = "sm90a"))]
pub mod lrn;
pub mod matmul;
#[cfg(not(feature = "sm90a"))]
pub mod pooling;
#[cfg(not(feature = "sm90a"))]
pub mod reduce;
#[cfg(not(feature = "sm90a"))]
pub mod softmax;
#[cfg(not(feature = "sm90a"))]
pub mod tensor_ops;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    device::trap()
}
