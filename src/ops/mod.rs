//! Public ops, one module per family. Each entry point validates its descriptors and
//! buffers, then runs either the GPU path (fold dims, pick a kernel, launch) or, on a CPU
//! handle, the reference implementation.

pub mod activation;
pub mod batch_norm;
pub mod convolution;
pub mod dropout;
pub mod layer_norm;
pub mod lrn;
pub mod matmul;
pub mod pooling;
pub mod reduce;
pub mod softmax;
pub mod tensor_ops;

pub(crate) mod layout;
pub(crate) mod rows;

use crate::buffer::{Buffer, Memory};
use crate::descriptor::TensorDescriptor;
use crate::error::{Error, Result};
use crate::host_tensor::HostTensor;
use crate::launch::{Gpu, LaunchConfig};
use layout::Folded;
use oxidnn_params::{packed_elements_per_thread, IndexMap, BLOCK_THREADS};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A blending factor (alpha, beta) as the kernels take it.
pub(crate) fn scale_factor(arg: &'static str, v: f64) -> Result<f32> {
    if v.is_finite() {
        Ok(v as f32)
    } else {
        Err(Error::bad(arg, format!("must be finite, got {v}")))
    }
}

/// Blocks of `threads` threads with `shared_bytes` of dynamic shared memory of `kernel` one
/// SM of `gpu` runs at once (cached per device, kernel, block size and shared memory).
pub(crate) fn resident_with(
    gpu: &Gpu,
    kernel: &'static str,
    threads: u32,
    shared_bytes: u32,
) -> Result<usize> {
    type Cache = Mutex<HashMap<(String, &'static str, u32, u32), usize>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (gpu.name.clone(), kernel, threads, shared_bytes);
    if let Some(&n) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(n);
    }
    let n = gpu.resident_blocks(kernel, threads, shared_bytes)? as usize;
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, n);
    Ok(n)
}

/// Grid for a grid-stride kernel over `len` items: enough blocks to fill the GPU several
/// times over, no more than the items need.
pub(crate) fn grid_stride_config(len: u64, sm_count: u32) -> Result<LaunchConfig> {
    let mut cfg = LaunchConfig::for_threads(len, BLOCK_THREADS)?;
    cfg.grid = cfg.grid.min(sm_count.max(1) * 32);
    Ok(cfg)
}

/// Grid for a packed elementwise kernel over `len` elements whose widest operand has
/// `widest_bytes` per element (one thread per `packed_elements_per_thread`).
pub(crate) fn packed_config(len: u64, widest_bytes: usize) -> Result<LaunchConfig> {
    let per_thread = packed_elements_per_thread(widest_bytes) as u64;
    LaunchConfig::for_threads(len.div_ceil(per_thread), BLOCK_THREADS)
}

/// How an elementwise op runs: the packed kernel (`map` is `None`) or the strided kernel
/// walking `map`, and the grid for it.
pub(crate) struct ElementwisePlan<const N: usize> {
    pub map: Option<IndexMap<N>>,
    pub cfg: LaunchConfig,
}

impl<const N: usize> ElementwisePlan<N> {
    pub fn new(folded: &Folded<N>, widest_bytes: usize, sm_count: u32) -> Result<Self> {
        let len = folded.len() as u64;
        if folded.is_packed() {
            Ok(Self {
                map: None,
                cfg: packed_config(len, widest_bytes)?,
            })
        } else {
            Ok(Self {
                map: Some(folded.index_map()?),
                cfg: grid_stride_config(len, sm_count)?,
            })
        }
    }

    /// The packed or the strided kernel as the plan says; `NotSupported` (naming `what`)
    /// where the dtype has none.
    pub fn kernel(
        &self,
        packed: Option<&'static str>,
        strided: Option<&'static str>,
        what: impl FnOnce() -> String,
    ) -> Result<&'static str> {
        let kernel = if self.map.is_none() { packed } else { strided };
        kernel.ok_or_else(|| Error::unsupported(what()))
    }
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
