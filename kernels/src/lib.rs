//! oxidnn device code: `no_std` Rust compiled to PTX by the host crate's `build.rs`.
//!
//! One module per op family (mirrored by `src/ops/<family>.rs` on the host). Kernel entry
//! points are named `<op>_<dir>_<algo>_<dtype>`, take their `#[repr(C)]` parameter struct
//! from `oxidnn-params` first and device pointers after it. Device intrinsics and inline
//! PTX live in [`device`] alone.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, stmt_expr_attributes)]
#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

pub mod device;
pub mod element;
pub mod elementwise;
pub mod gemm;
pub mod math;

pub mod activation;
pub mod dropout;
pub mod lrn;
pub mod matmul;
pub mod reduce;
pub mod tensor_ops;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    device::trap()
}
