//! Public ops, one module per family. Each entry point validates its descriptors and
//! buffers, then runs either the GPU path (fold dims, pick a kernel, launch) or, on a CPU
//! handle, the reference implementation.

pub mod activation;
pub mod reduce;
pub mod tensor_ops;

pub(crate) mod layout;

use crate::buffer::{Buffer, Memory};
use crate::descriptor::TensorDescriptor;
use crate::error::{Error, Result};
use crate::host_tensor::HostTensor;
use crate::launch::LaunchConfig;
use oxidnn_params::BLOCK_THREADS;

/// A blending factor (alpha, beta) as the kernels take it.
pub(crate) fn scale_factor(arg: &'static str, v: f64) -> Result<f32> {
    if v.is_finite() {
        Ok(v as f32)
    } else {
        Err(Error::bad(arg, format!("must be finite, got {v}")))
    }
}

/// Grid for a grid-stride kernel over `len` items: enough blocks to fill the GPU several
/// times over, no more than the items need.
pub(crate) fn grid_stride_config(len: u64, sm_count: u32) -> Result<LaunchConfig> {
    let mut cfg = LaunchConfig::for_threads(len, BLOCK_THREADS)?;
    cfg.grid = cfg.grid.min(sm_count.max(1) * 32);
    Ok(cfg)
}

/// The tensor in a host buffer of the CPU handle.
pub(crate) fn host_read(desc: &TensorDescriptor, buf: &Buffer) -> Result<HostTensor> {
    match &buf.memory {
        Memory::Host(v) => Ok(HostTensor::from_bytes(*desc, v)),
        Memory::Device(_) => Err(Error::bad(
            "buffer",
            "a device buffer was passed to the CPU handle",
        )),
    }
}

/// Writes the logical elements of `t` into a host buffer (gaps keep their bytes).
pub(crate) fn host_write(t: &HostTensor, buf: &mut Buffer) -> Result<()> {
    let size = t.desc.dtype().size_bytes();
    match &mut buf.memory {
        Memory::Host(v) => {
            crate::host_tensor::for_each_index(t.desc.dims(), |idx| {
                let o = t.desc.offset_of(idx);
                t.desc
                    .dtype()
                    .encode(t.data[o], &mut v[o * size..(o + 1) * size]);
            });
            Ok(())
        }
        Memory::Device(_) => Err(Error::bad(
            "buffer",
            "a device buffer was passed to the CPU handle",
        )),
    }
}
