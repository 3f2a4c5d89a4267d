//! The one error type of oxidnn, mirroring cuDNN's status codes with context.

use std::fmt;

/// Result alias used by every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong. Each variant names the argument or resource involved.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// An argument is invalid (`CUDNN_STATUS_BAD_PARAM`): `arg` names it, `message` says how.
    BadParam { arg: &'static str, message: String },
    /// A buffer holds fewer bytes than its descriptor spans.
    BufferTooSmall {
        arg: &'static str,
        required_bytes: usize,
        got_bytes: usize,
    },
    /// The workspace is smaller than the operation needs (`CUDNN_STATUS_BAD_PARAM` in cuDNN).
    WorkspaceTooSmall {
        required_bytes: usize,
        got_bytes: usize,
    },
    /// The combination is valid but not implemented (`CUDNN_STATUS_NOT_SUPPORTED`).
    NotSupported { message: String },
    /// Device memory could not be allocated (`CUDNN_STATUS_ALLOC_FAILED`).
    AllocFailed { bytes: usize, message: String },
    /// A kernel launch or the work on the stream failed (`CUDNN_STATUS_EXECUTION_FAILED`).
    ExecutionFailed { kernel: String, message: String },
    /// No usable GPU or CUDA driver (the caller may fall back to [`crate::Handle::cpu`]).
    NoGpu { reason: String },
    /// Any other CUDA driver error.
    Driver { call: &'static str, message: String },
}

impl Error {
    pub(crate) fn bad(arg: &'static str, message: impl Into<String>) -> Self {
        Error::BadParam {
            arg,
            message: message.into(),
        }
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Error::NotSupported {
            message: message.into(),
        }
    }

    pub(crate) fn driver(call: &'static str, e: impl fmt::Debug) -> Self {
        Error::Driver {
            call,
            message: format!("{e:?}"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadParam { arg, message } => write!(f, "bad parameter `{arg}`: {message}"),
            Error::BufferTooSmall { arg, required_bytes, got_bytes } => write!(
                f,
                "buffer `{arg}` is too small: its descriptor spans {required_bytes} bytes, the buffer holds {got_bytes}"
            ),
            Error::WorkspaceTooSmall { required_bytes, got_bytes } => write!(
                f,
                "workspace too small: {required_bytes} bytes required, {got_bytes} given"
            ),
            Error::NotSupported { message } => write!(f, "not supported: {message}"),
            Error::AllocFailed { bytes, message } => write!(f, "allocating {bytes} bytes failed: {message}"),
            Error::ExecutionFailed { kernel, message } => write!(f, "kernel `{kernel}` failed: {message}"),
            Error::NoGpu { reason } => write!(f, "no GPU available: {reason}"),
            Error::Driver { call, message } => write!(f, "CUDA driver call {call} failed: {message}"),
        }
    }
}

impl std::error::Error for Error {}
