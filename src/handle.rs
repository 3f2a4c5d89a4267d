//! The handle: where ops run (one GPU and a stream, or the CPU reference path), and the
//! buffers that belong to it.

use crate::buffer::{Buffer, Memory};
use crate::descriptor::TensorDescriptor;
use crate::dtype::HostElement;
use crate::error::{Error, Result};
use crate::host_tensor::HostTensor;
use crate::launch::Gpu;
use crate::ops::convolution::ConvFwdAlgoPerf;
use cudarc::driver::CudaStream;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The context every op takes (cuDNN's `cudnnHandle_t`).
///
/// ```
/// use oxidnn::Handle;
/// // A GPU handle where a GPU is usable, the CPU reference path otherwise.
/// let (handle, why_cpu) = Handle::gpu_or_cpu();
/// if let Some(reason) = why_cpu {
///     println!("running on the CPU: {reason}");
/// }
/// # let _ = handle;
/// ```
pub struct Handle {
    id: u64,
    pub(crate) backend: Backend,
    /// Rankings of `find_convolution_forward_algorithm`, per problem.
    conv_find: Mutex<HashMap<String, Vec<ConvFwdAlgoPerf>>>,
}

pub(crate) enum Backend {
    Gpu(Box<Gpu>),
    Cpu,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle({})", self.device_name())
    }
}

impl Handle {
    /// A handle on GPU 0.
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// A handle on GPU `ordinal`, with that device's default stream.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        let gpu = Gpu::open(ordinal)?;
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            backend: Backend::Gpu(Box::new(gpu)),
            conv_find: Mutex::default(),
        })
    }

    /// A handle that runs every op through the CPU reference implementation.
    pub fn cpu() -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            backend: Backend::Cpu,
            conv_find: Mutex::default(),
        }
    }

    /// GPU 0 if usable, else the CPU handle together with the reason.
    pub fn gpu_or_cpu() -> (Self, Option<Error>) {
        match Self::new() {
            Ok(h) => (h, None),
            Err(e) => (Self::cpu(), Some(e)),
        }
    }

    /// Whether ops run on a GPU.
    pub fn is_gpu(&self) -> bool {
        matches!(self.backend, Backend::Gpu(_))
    }

    /// The GPU's name, or `"cpu"`.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Gpu(g) => g.name.clone(),
            Backend::Cpu => "cpu".into(),
        }
    }

    /// The GPU's compute capability (major, minor), or `None` for the CPU handle.
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        match &self.backend {
            Backend::Gpu(g) => Some(g.compute_capability),
            Backend::Cpu => None,
        }
    }

    /// The stream ops are issued on (`None` for the CPU handle).
    pub fn stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.backend {
            Backend::Gpu(g) => Some(&g.stream),
            Backend::Cpu => None,
        }
    }

    /// Issues later ops on `stream` (cudnnSetStream). The stream must belong to this
    /// handle's context.
    pub fn set_stream(&mut self, stream: Arc<CudaStream>) -> Result<()> {
        match &mut self.backend {
            Backend::Gpu(g) => {
                if !Arc::ptr_eq(stream.context(), &g.ctx) {
                    return Err(Error::bad(
                        "stream",
                        "the stream belongs to another CUDA context",
                    ));
                }
                g.stream = stream;
                Ok(())
            }
            Backend::Cpu => Err(Error::bad("stream", "the CPU handle has no stream")),
        }
    }

    /// A new stream of this handle's context (for use with [`Handle::set_stream`]).
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        match &self.backend {
            Backend::Gpu(g) => g
                .ctx
                .new_stream()
                .map_err(|e| Error::driver("cuStreamCreate", e)),
            Backend::Cpu => Err(Error::bad("handle", "the CPU handle has no streams")),
        }
    }

    /// Waits until all work issued on the handle's stream is done.
    pub fn synchronize(&self) -> Result<()> {
        match &self.backend {
            Backend::Gpu(g) => g.synchronize(),
            Backend::Cpu => Ok(()),
        }
    }

    /// A zero-filled buffer of `bytes` bytes.
    pub fn alloc_bytes(&self, bytes: usize) -> Result<Buffer> {
        let memory = match &self.backend {
            Backend::Gpu(g) => {
                Memory::Device(g.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| {
                    Error::AllocFailed {
                        bytes,
                        message: format!("{e:?}"),
                    }
                })?)
            }
            Backend::Cpu => {
                let mut v = Vec::new();
                v.try_reserve_exact(bytes).map_err(|e| Error::AllocFailed {
                    bytes,
                    message: e.to_string(),
                })?;
                v.resize(bytes, 0);
                Memory::Host(v)
            }
        };
        Ok(Buffer {
            memory,
            bytes,
            owner: self.id,
        })
    }

    /// A zero-filled buffer sized for `desc`.
    pub fn alloc(&self, desc: &TensorDescriptor) -> Result<Buffer> {
        self.alloc_bytes(desc.size_bytes())
    }

    /// A buffer holding `data`.
    pub fn upload<T: HostElement>(&self, data: &[T]) -> Result<Buffer> {
        let mut buf = self.alloc_bytes(std::mem::size_of_val(data))?;
        self.write(&mut buf, data)?;
        Ok(buf)
    }

    /// Copies `data` to the start of `buf`.
    pub fn write<T: HostElement>(&self, buf: &mut Buffer, data: &[T]) -> Result<()> {
        let size = size_of::<T>();
        let mut bytes = vec![0u8; std::mem::size_of_val(data)];
        for (v, out) in data.iter().zip(bytes.chunks_exact_mut(size)) {
            v.to_le(out);
        }
        self.write_bytes(buf, &bytes)
    }

    /// Copies raw bytes to the start of `buf`.
    pub fn write_bytes(&self, buf: &mut Buffer, bytes: &[u8]) -> Result<()> {
        self.check_owner("buf", buf)?;
        buf.check_len("buf", bytes.len())?;
        match (&self.backend, &mut buf.memory) {
            (Backend::Gpu(g), Memory::Device(s)) => {
                if bytes.is_empty() {
                    return Ok(());
                }
                let mut view = s.slice_mut(..bytes.len());
                g.stream
                    .memcpy_htod(bytes, &mut view)
                    .map_err(|e| Error::driver("cuMemcpyHtoD", e))
            }
            (Backend::Cpu, Memory::Host(v)) => {
                v[..bytes.len()].copy_from_slice(bytes);
                Ok(())
            }
            _ => Err(Error::bad(
                "buf",
                "buffer and handle are on different devices",
            )),
        }
    }

    /// Sets every byte of `buf` to `value` (e.g. 0xFF poisons floats with NaN).
    pub fn fill_bytes(&self, buf: &mut Buffer, value: u8) -> Result<()> {
        let bytes = vec![value; buf.bytes];
        self.write_bytes(buf, &bytes)
    }

    /// The whole buffer as bytes (waits for the stream).
    pub fn read_bytes(&self, buf: &Buffer) -> Result<Vec<u8>> {
        self.check_owner("buf", buf)?;
        match (&self.backend, &buf.memory) {
            (Backend::Gpu(g), Memory::Device(s)) => {
                let mut out = vec![0u8; buf.bytes];
                if buf.bytes > 0 {
                    let view = s.slice(..buf.bytes);
                    g.stream
                        .memcpy_dtoh(&view, &mut out)
                        .map_err(|e| Error::driver("cuMemcpyDtoH", e))?;
                }
                g.synchronize()?;
                Ok(out)
            }
            (Backend::Cpu, Memory::Host(v)) => Ok(v[..buf.bytes].to_vec()),
            _ => Err(Error::bad(
                "buf",
                "buffer and handle are on different devices",
            )),
        }
    }

    /// The buffer's contents as `T`s (its length divided by `size_of::<T>()`, rounded down).
    pub fn read<T: HostElement>(&self, buf: &Buffer) -> Result<Vec<T>> {
        let bytes = self.read_bytes(buf)?;
        Ok(bytes.chunks_exact(size_of::<T>()).map(T::from_le).collect())
    }

    /// A buffer holding `t` in its descriptor's dtype and strides.
    pub fn upload_tensor(&self, t: &HostTensor) -> Result<Buffer> {
        let mut buf = self.alloc(&t.desc)?;
        self.write_bytes(&mut buf, &t.to_bytes())?;
        Ok(buf)
    }

    /// Reads the tensor `desc` describes out of `buf`.
    pub fn download_tensor(&self, desc: &TensorDescriptor, buf: &Buffer) -> Result<HostTensor> {
        buf.check_holds("buf", desc)?;
        let bytes = self.read_bytes(buf)?;
        Ok(HostTensor::from_bytes(*desc, &bytes))
    }

    /// The cached `find_convolution_forward_algorithm` ranking of problem `key`.
    pub(crate) fn cached_conv_find(&self, key: &str) -> Option<Vec<ConvFwdAlgoPerf>> {
        let cache = self.conv_find.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(key).cloned()
    }

    pub(crate) fn cache_conv_find(&self, key: String, ranked: Vec<ConvFwdAlgoPerf>) {
        let mut cache = self.conv_find.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(key, ranked);
    }

    /// Checks that `buf` was made by this handle.
    pub(crate) fn check_owner(&self, arg: &'static str, buf: &Buffer) -> Result<()> {
        if buf.owner == self.id {
            Ok(())
        } else {
            Err(Error::bad(arg, "the buffer belongs to another handle"))
        }
    }

    /// Checks that `buf` belongs to this handle and can hold `desc`.
    pub(crate) fn check_tensor(
        &self,
        arg: &'static str,
        desc: &TensorDescriptor,
        buf: &Buffer,
    ) -> Result<()> {
        self.check_owner(arg, buf)?;
        buf.check_holds(arg, desc)
    }
}
