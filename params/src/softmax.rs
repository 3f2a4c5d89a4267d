//! Parameters of the softmax family (cudnnSoftmaxForward / cudnnSoftmaxBackward).

use crate::IndexMap;

/// Softmax algorithms, as cuDNN's `cudnnSoftmaxAlgorithm_t`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftmaxAlgorithm {
    /// `exp(x) / sum exp(x)` without subtracting the maximum (overflows for large inputs).
    Fast = 0,
    /// `exp(x - max) / sum exp(x - max)`.
    Accurate = 1,
    /// `log softmax`: `(x - max) - ln sum exp(x - max)`.
    Log = 2,
}

impl SoftmaxAlgorithm {
    pub const ALL: [SoftmaxAlgorithm; 3] = [Self::Fast, Self::Accurate, Self::Log];

    #[inline(always)]
    pub fn from_u32(v: u32) -> Self {
        match v {
            0 => Self::Fast,
            2 => Self::Log,
            _ => Self::Accurate,
        }
    }
}

/// Parameters of `softmax_fwd_*`: `y = alpha * softmax(x) + beta * y` over each of `rows`
/// rows of `row_len` elements. `outer.offsets(row) = [x, y]`, `inner.offsets(e) = [x, y]`
/// (the `vec` kernels read rows as dense runs of 16-byte vectors instead). The `column`
/// kernel gives each thread a row; the others a group of `warps` warps (`chunks > 1` only
/// for the `long` kernels, which stream the row).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxFwdParams {
    pub rows: u32,
    pub row_len: u32,
    pub warps: u32,
    pub chunks: u32,
    /// A [`SoftmaxAlgorithm`].
    pub algo: u32,
    pub alpha: f32,
    pub beta: f32,
    pub _pad: u32,
    pub outer: IndexMap<2>,
    pub inner: IndexMap<2>,
}

/// Parameters of `softmax_bwd_*`: `dx = alpha * y * (dy - sum dy * y) + beta * dx`; for
/// [`SoftmaxAlgorithm::Log`], `dx = alpha * (dy - exp(y) * sum dy) + beta * dx`.
/// Operand order of both maps: `[y, dy, dx]`; otherwise as [`SoftmaxFwdParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxBwdParams {
    pub rows: u32,
    pub row_len: u32,
    pub warps: u32,
    pub chunks: u32,
    pub algo: u32,
    pub alpha: f32,
    pub beta: f32,
    pub _pad: u32,
    pub outer: IndexMap<3>,
    pub inner: IndexMap<3>,
}
