//! Buffers: untyped memory (like cuDNN's `void*`) on the device of a GPU handle or in host
//! memory for the CPU handle. Every op checks a buffer's length against its descriptor.

use crate::descriptor::TensorDescriptor;
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;

/// Memory owned by one [`crate::Handle`]; passed to ops next to its descriptor.
pub struct Buffer {
    pub(crate) memory: Memory,
    pub(crate) bytes: usize,
    /// The id of the handle that made it; ops refuse buffers of another handle.
    pub(crate) owner: u64,
}

pub(crate) enum Memory {
    Device(CudaSlice<u8>),
    Host(Vec<u8>),
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match self.memory {
            Memory::Device(_) => "device",
            Memory::Host(_) => "host",
        };
        write!(f, "Buffer({} bytes, {place})", self.bytes)
    }
}

impl Buffer {
    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The raw device address (`CUdeviceptr`) of a GPU handle's buffer, for interop with
    /// other CUDA libraries on the handle's stream (e.g. the cuDNN comparison benches);
    /// `None` for host buffers. Using it is the caller's own unsafe business.
    pub fn device_address(&self) -> Option<u64> {
        match &self.memory {
            Memory::Device(s) => {
                use cudarc::driver::DevicePtr;
                Some(s.device_ptr(s.stream()).0)
            }
            Memory::Host(_) => None,
        }
    }

    /// Whether the buffer lives in device memory.
    pub fn is_device(&self) -> bool {
        matches!(self.memory, Memory::Device(_))
    }

    /// Checks that this buffer can hold the tensor `desc` describes.
    pub(crate) fn check_holds(&self, arg: &'static str, desc: &TensorDescriptor) -> Result<()> {
        let required = desc.size_bytes();
        if self.bytes < required {
            return Err(Error::BufferTooSmall {
                arg,
                required_bytes: required,
                got_bytes: self.bytes,
            });
        }
        Ok(())
    }

    /// Checks that this buffer holds at least `required` bytes.
    pub(crate) fn check_len(&self, arg: &'static str, required: usize) -> Result<()> {
        if self.bytes < required {
            return Err(Error::BufferTooSmall {
                arg,
                required_bytes: required,
                got_bytes: self.bytes,
            });
        }
        Ok(())
    }
}
