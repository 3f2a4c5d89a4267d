//! A tensor in host memory, values held as f64: what the CPU reference computes on, what
//! tests draw inputs into and compare outputs with.

use crate::descriptor::TensorDescriptor;

/// A strided tensor on the host. `data` covers the descriptor's span; values are kept
/// exactly representable in the descriptor's dtype when they come from a buffer or from
/// [`HostTensor::from_fn`].
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub desc: TensorDescriptor,
    pub data: Vec<f64>,
}

impl HostTensor {
    /// A tensor filled with `value` (rounded to the dtype), gaps included.
    pub fn filled(desc: TensorDescriptor, value: f64) -> Self {
        Self {
            desc,
            data: vec![desc.dtype().round(value); desc.span_elements()],
        }
    }

    /// A tensor whose element at logical index `idx` is `f(idx)`, rounded to the dtype.
    /// Addresses no logical element reaches (gaps) hold NaN.
    pub fn from_fn(desc: TensorDescriptor, mut f: impl FnMut(&[usize]) -> f64) -> Self {
        let mut t = Self {
            desc,
            data: vec![f64::NAN; desc.span_elements()],
        };
        for_each_index(desc.dims(), |idx| {
            let o = desc.offset_of(idx);
            t.data[o] = desc.dtype().round(f(idx));
        });
        t
    }

    /// The element at logical index `idx`.
    pub fn get(&self, idx: &[usize]) -> f64 {
        self.data[self.desc.offset_of(idx)]
    }

    /// Sets the element at `idx` to `v` rounded to the dtype.
    pub fn set(&mut self, idx: &[usize], v: f64) {
        let o = self.desc.offset_of(idx);
        self.data[o] = self.desc.dtype().round(v);
    }

    /// The logical elements in row-major order.
    pub fn logical(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.desc.element_count());
        for_each_index(self.desc.dims(), |idx| out.push(self.get(idx)));
        out
    }

    /// Encodes the span in the dtype's little-endian byte form.
    pub fn to_bytes(&self) -> Vec<u8> {
        let size = self.desc.dtype().size_bytes();
        let mut bytes = vec![0u8; self.data.len() * size];
        for (v, out) in self.data.iter().zip(bytes.chunks_exact_mut(size)) {
            self.desc.dtype().encode(*v, out);
        }
        bytes
    }

    /// Decodes the span of `desc` from `bytes` (which hold at least `desc.size_bytes()`).
    pub fn from_bytes(desc: TensorDescriptor, bytes: &[u8]) -> Self {
        let size = desc.dtype().size_bytes();
        let data = bytes[..desc.size_bytes()]
            .chunks_exact(size)
            .map(|b| desc.dtype().decode(b))
            .collect();
        Self { desc, data }
    }
}

/// Calls `f` with every index of a tensor of `dims`, in row-major order.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx);
        let mut d = dims.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
