//! Tensor descriptors: element type, 1..=8 dims and a stride per dim (cuDNN's
//! `cudnnTensorDescriptor_t`), validated on construction and immutable after.

use crate::dtype::DataType;
use crate::error::{Error, Result};
use oxidnn_params::MAX_DIMS;

/// Memory order of a 4-D (or 5-D) tensor whose logical dims are `N, C, [D,] H, W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Channels outside the spatial dims (`NCHW`, `NCDHW`).
    ChannelsFirst,
    /// Channels innermost (`NHWC`, `NDHWC`).
    ChannelsLast,
}

/// Shape, strides (in elements) and element type of a tensor.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorDescriptor {
    dtype: DataType,
    rank: usize,
    dims: [usize; MAX_DIMS],
    strides: [usize; MAX_DIMS],
}

impl std::fmt::Debug for TensorDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}/{:?}", self.dtype, self.dims(), self.strides())
    }
}

impl TensorDescriptor {
    /// A tensor with explicit strides. Dims and strides must be >= 1; the span must fit in
    /// memory (`usize`).
    ///
    /// ```
    /// use oxidnn::{DataType, TensorDescriptor};
    /// // A 2x3 matrix stored column-major.
    /// let d = TensorDescriptor::new(DataType::F32, &[2, 3], &[1, 2])?;
    /// assert_eq!(d.element_count(), 6);
    /// # Ok::<(), oxidnn::Error>(())
    /// ```
    pub fn new(dtype: DataType, dims: &[usize], strides: &[usize]) -> Result<Self> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(Error::bad(
                "dims",
                format!("a tensor has 1 to {MAX_DIMS} dims, got {}", dims.len()),
            ));
        }
        if strides.len() != dims.len() {
            return Err(Error::bad(
                "strides",
                format!("{} strides given for {} dims", strides.len(), dims.len()),
            ));
        }
        if let Some(i) = dims.iter().position(|&d| d == 0) {
            return Err(Error::bad(
                "dims",
                format!("dim {i} is 0; every dim must be >= 1 (dims {dims:?})"),
            ));
        }
        if let Some(i) = strides.iter().position(|&s| s == 0) {
            return Err(Error::bad(
                "strides",
                format!("stride {i} is 0; every stride must be >= 1 (strides {strides:?})"),
            ));
        }
        let mut d = Self {
            dtype,
            rank: dims.len(),
            dims: [1; MAX_DIMS],
            strides: [1; MAX_DIMS],
        };
        d.dims[..dims.len()].copy_from_slice(dims);
        d.strides[..dims.len()].copy_from_slice(strides);
        let too_big = || {
            Error::bad(
                "dims",
                format!("tensor {dims:?}/{strides:?} does not fit in memory"),
            )
        };
        let mut count: usize = 1;
        let mut span: usize = 1;
        for (&n, &s) in dims.iter().zip(strides) {
            count = count.checked_mul(n).ok_or_else(too_big)?;
            span = (n - 1)
                .checked_mul(s)
                .and_then(|x| x.checked_add(span))
                .ok_or_else(too_big)?;
        }
        span.checked_mul(dtype.size_bytes()).ok_or_else(too_big)?;
        Ok(d)
    }

    /// A dense row-major tensor (last dim contiguous).
    pub fn packed(dtype: DataType, dims: &[usize]) -> Result<Self> {
        let mut strides = [0usize; MAX_DIMS];
        let mut s: usize = 1;
        for i in (0..dims.len().min(MAX_DIMS)).rev() {
            strides[i] = s;
            s = s.saturating_mul(dims[i].max(1));
        }
        Self::new(dtype, dims, &strides[..dims.len().min(MAX_DIMS)])
    }

    /// A dense 4-D tensor with logical dims `N, C, H, W` in the given memory layout.
    ///
    /// ```
    /// use oxidnn::{DataType, Layout, TensorDescriptor};
    /// let x = TensorDescriptor::nchw_with(DataType::F16, 32, 64, 56, 56, Layout::ChannelsLast)?;
    /// assert_eq!(x.strides(), &[64 * 56 * 56, 1, 56 * 64, 64]);
    /// # Ok::<(), oxidnn::Error>(())
    /// ```
    pub fn nchw_with(
        dtype: DataType,
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        layout: Layout,
    ) -> Result<Self> {
        Self::spatial(dtype, n, c, &[h, w], layout)
    }

    /// A dense `NCHW` tensor.
    pub fn nchw(dtype: DataType, n: usize, c: usize, h: usize, w: usize) -> Result<Self> {
        Self::spatial(dtype, n, c, &[h, w], Layout::ChannelsFirst)
    }

    /// A dense tensor with logical dims `N, C, H, W` stored `NHWC`.
    pub fn nhwc(dtype: DataType, n: usize, c: usize, h: usize, w: usize) -> Result<Self> {
        Self::spatial(dtype, n, c, &[h, w], Layout::ChannelsLast)
    }

    /// A dense tensor with logical dims `N, C, spatial..` (1 to 6 spatial dims) in `layout`.
    pub fn spatial(
        dtype: DataType,
        n: usize,
        c: usize,
        spatial: &[usize],
        layout: Layout,
    ) -> Result<Self> {
        if spatial.is_empty() || spatial.len() + 2 > MAX_DIMS {
            return Err(Error::bad(
                "spatial",
                format!("1 to {} spatial dims, got {}", MAX_DIMS - 2, spatial.len()),
            ));
        }
        let mut dims = vec![n, c];
        dims.extend_from_slice(spatial);
        match layout {
            Layout::ChannelsFirst => Self::packed(dtype, &dims),
            Layout::ChannelsLast => {
                let mut strides = vec![0usize; dims.len()];
                strides[1] = 1;
                let mut s = c.max(1);
                for i in (2..dims.len()).rev() {
                    strides[i] = s;
                    s = s.saturating_mul(dims[i].max(1));
                }
                strides[0] = s;
                Self::new(dtype, &dims, &strides)
            }
        }
    }

    /// The same shape and strides with another element type.
    pub fn with_dtype(&self, dtype: DataType) -> Result<Self> {
        Self::new(dtype, self.dims(), self.strides())
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }

    /// Number of logical elements.
    pub fn element_count(&self) -> usize {
        self.dims().iter().product()
    }

    /// Elements from the first to one past the last addressed element.
    pub fn span_elements(&self) -> usize {
        1 + self
            .dims()
            .iter()
            .zip(self.strides())
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
    }

    /// Bytes a buffer must hold for this tensor.
    pub fn size_bytes(&self) -> usize {
        self.span_elements() * self.dtype.size_bytes()
    }

    /// Offset (elements) of the element at `index` (one coordinate per dim).
    pub fn offset_of(&self, index: &[usize]) -> usize {
        index.iter().zip(self.strides()).map(|(&i, &s)| i * s).sum()
    }

    /// Whether each logical element has its own address (required of every output).
    pub fn is_non_overlapping(&self) -> bool {
        let mut order: Vec<usize> = (0..self.rank).filter(|&i| self.dims[i] > 1).collect();
        order.sort_by_key(|&i| self.strides[i]);
        let mut reach = 1usize; // elements covered by the dims so far
        for i in order {
            if self.strides[i] < reach {
                return false;
            }
            reach = self.strides[i] * self.dims[i];
        }
        true
    }

    /// Whether the elements fill `[0, element_count)` exactly (any dim order).
    pub fn is_dense(&self) -> bool {
        self.is_non_overlapping() && self.span_elements() == self.element_count()
    }

    /// The problem-string form used by tests and benches, e.g. `f32:2x3x4:12x4x1`.
    pub fn problem_string(&self) -> String {
        let join = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join("x")
        };
        format!(
            "{}:{}:{}",
            self.dtype,
            join(self.dims()),
            join(self.strides())
        )
    }
}

/// Checks that `desc` may be written: no two logical elements share an address.
pub(crate) fn check_output(arg: &'static str, desc: &TensorDescriptor) -> Result<()> {
    if desc.is_non_overlapping() {
        Ok(())
    } else {
        Err(Error::bad(
            arg,
            format!("output tensor {desc:?} has overlapping strides"),
        ))
    }
}

/// Checks that two descriptors have the same dims.
pub(crate) fn check_same_dims(
    arg: &'static str,
    want: &TensorDescriptor,
    got: &TensorDescriptor,
) -> Result<()> {
    if want.dims() == got.dims() {
        Ok(())
    } else {
        Err(Error::bad(
            arg,
            format!(
                "dims {:?} differ from the expected {:?}",
                got.dims(),
                want.dims()
            ),
        ))
    }
}

/// Checks that two descriptors have the same element type.
pub(crate) fn check_same_dtype(
    arg: &'static str,
    want: &TensorDescriptor,
    got: &TensorDescriptor,
) -> Result<()> {
    if want.dtype() == got.dtype() {
        Ok(())
    } else {
        Err(Error::bad(
            arg,
            format!(
                "data type {} differs from the expected {}",
                got.dtype(),
                want.dtype()
            ),
        ))
    }
}
