//! cuDNN for the comparison benches: owned handle and descriptor objects, status checks,
//! and the device-to-device copy that sets the bandwidth reference. Only benches built
//! with the `cudnn-bench` feature include it.

pub use cudarc::cudnn::sys as cudnn_sys;

use super::{copy_async, Context, Res, Timer};
use cudarc::driver::CudaStream;
use oxidnn::{DataType, Handle, TensorDescriptor};

/// Size of the copy that sets the bandwidth reference.
pub const COPY_BYTES: usize = 1 << 30;

pub fn cudnn_check(status: cudnn_sys::cudnnStatus_t, call: &str) -> Res<()> {
    if status == cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {status:?}"))
    }
}

/// An owned cuDNN object: made by `create`, destroyed once on drop.
#[macro_export]
macro_rules! cudnn_object {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        pub struct $name(pub $raw);

        impl $name {
            pub fn create() -> $crate::common::Res<Self> {
                let mut raw: $raw = std::ptr::null_mut();
                // SAFETY: `raw` is a valid out-pointer; on success it holds a new object
                // that only this wrapper destroys.
                $crate::common::cudnn::cudnn_check(
                    unsafe { $crate::common::cudnn::cudnn_sys::$create(&mut raw) },
                    stringify!($create),
                )?;
                Ok(Self(raw))
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: made by `create`, destroyed only here. A failure cannot be reported.
                let _ = unsafe { $crate::common::cudnn::cudnn_sys::$destroy(self.0) };
            }
        }
    };
}

cudnn_object!(
    CudnnHandle,
    cudnn_sys::cudnnHandle_t,
    cudnnCreate,
    cudnnDestroy
);
cudnn_object!(
    TensorDesc,
    cudnn_sys::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
cudnn_object!(
    ActDesc,
    cudnn_sys::cudnnActivationDescriptor_t,
    cudnnCreateActivationDescriptor,
    cudnnDestroyActivationDescriptor
);
cudnn_object!(
    OpDesc,
    cudnn_sys::cudnnOpTensorDescriptor_t,
    cudnnCreateOpTensorDescriptor,
    cudnnDestroyOpTensorDescriptor
);
cudnn_object!(
    ReduceDesc,
    cudnn_sys::cudnnReduceTensorDescriptor_t,
    cudnnCreateReduceTensorDescriptor,
    cudnnDestroyReduceTensorDescriptor
);

/// A cuDNN handle issuing on the oxidnn handle's stream.
pub struct Cudnn {
    pub handle: CudnnHandle,
    pub version: usize,
    pub cudart_version: usize,
}

impl Cudnn {
    /// Loads libcudnn and makes a handle on `stream`, or says why not.
    pub fn open(stream: &CudaStream) -> Res<Self> {
        // SAFETY: only tries to load the library.
        if !unsafe { cudnn_sys::is_culib_present() } {
            return Err(
                "libcudnn could not be loaded (not installed, or not on the library path)".into(),
            );
        }
        // A library missing a symbol the bindings expect panics at first use: report it.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Self::open_loaded(stream)))
            .unwrap_or_else(|_| Err("libcudnn lacks a function these bindings need".into()))
    }

    fn open_loaded(stream: &CudaStream) -> Res<Self> {
        let version = cudarc::cudnn::result::get_version();
        if version < 90000 {
            // The bindings use cuDNN 9's status codes and enums.
            return Err(format!(
                "found cuDNN {}, this bench needs cuDNN 9 or newer",
                version_string(version)
            ));
        }
        let cudart_version = cudarc::cudnn::result::get_cudart_version();
        let handle = CudnnHandle::create()?;
        // SAFETY: the handle is live; the stream is a live stream of the current context
        // (the same context cuDNN's runtime uses: the device's primary context).
        cudnn_check(
            unsafe { cudnn_sys::cudnnSetStream(handle.0, stream.cu_stream().cast()) },
            "cudnnSetStream",
        )?;
        Ok(Self {
            handle,
            version,
            cudart_version,
        })
    }
}

/// cuDNN 9 encodes major * 10000 + minor * 100 + patch; older versions major * 1000 + ...
pub fn version_string(v: usize) -> String {
    if v >= 90000 {
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
    }
}

pub fn cudnn_dtype(d: DataType) -> cudnn_sys::cudnnDataType_t {
    use cudnn_sys::cudnnDataType_t as T;
    match d {
        DataType::F32 => T::CUDNN_DATA_FLOAT,
        DataType::F16 => T::CUDNN_DATA_HALF,
        DataType::BF16 => T::CUDNN_DATA_BFLOAT16,
        DataType::F64 => T::CUDNN_DATA_DOUBLE,
    }
}

impl TensorDesc {
    pub fn new(d: &TensorDescriptor) -> Res<Self> {
        let to_i32 = |v: &[usize]| -> Res<Vec<i32>> {
            v.iter()
                .map(|&x| {
                    i32::try_from(x).map_err(|_| format!("{d:?} does not fit cuDNN's int dims"))
                })
                .collect()
        };
        let (dims, strides) = (to_i32(d.dims())?, to_i32(d.strides())?);
        let desc = Self::create()?;
        // SAFETY: `desc` is live; `dims` and `strides` hold `rank` values each and outlive the call.
        let status = unsafe {
            cudnn_sys::cudnnSetTensorNdDescriptor(
                desc.0,
                cudnn_dtype(d.dtype()),
                dims.len() as i32,
                dims.as_ptr(),
                strides.as_ptr(),
            )
        };
        cudnn_check(status, "cudnnSetTensorNdDescriptor")?;
        Ok(desc)
    }
}

pub fn gb_per_s(bytes: u64, us: f64) -> f64 {
    bytes as f64 / (us * 1e-6) / 1e9
}

/// Device-to-device copy bandwidth (GB/s, read + write bytes) of a 1 GiB copy.
pub fn copy_bandwidth(h: &Handle, timer: &Timer, warmup: usize, runs: usize) -> Res<f64> {
    let src = h
        .alloc_bytes(COPY_BYTES)
        .context("allocating the copy source")?;
    let mut dst = h
        .alloc_bytes(COPY_BYTES)
        .context("allocating the copy destination")?;
    let m = timer.measure(1, warmup, runs, |_, _| {
        copy_async(&timer.stream, &mut dst, &src, COPY_BYTES)
    })?;
    Ok(gb_per_s(2 * COPY_BYTES as u64, m.median_us[0]))
}
