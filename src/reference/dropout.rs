//! Reference dropout, in f64. Which elements drop comes from the generator shared with the
//! kernels (`oxidnn_params::dropout`), indexed by logical element.

use crate::host_tensor::{for_each_index, HostTensor};
use oxidnn_params::{dropout_group_keeps, dropout_key, dropout_threshold, DROPOUT_GROUP};

/// The factor kept elements are multiplied by: `1 / (1 - p)`, or 0 when `p = 1` (nothing
/// is kept).
pub fn scale(p: f64) -> f64 {
    if p < 1.0 {
        1.0 / (1.0 - p)
    } else {
        0.0
    }
}

/// The keep mask of forward call `call` of a generator seeded with `seed`, over `len`
/// elements: bit `i % 32` of word `i / 32` is 1 when element `i` is kept.
pub fn keep_mask(p: f64, seed: u64, call: u64, len: usize) -> Vec<u32> {
    let (threshold, key) = (dropout_threshold(p), dropout_key(seed));
    let group = DROPOUT_GROUP as usize;
    let mut words = vec![0u32; len.div_ceil(32)];
    for g in 0..len.div_ceil(group) {
        let bits = dropout_group_keeps(&key, call, threshold, g as u64);
        let valid = (len - g * group).min(group);
        let bits = bits & ((1u32 << valid) - 1);
        words[g * group / 32] |= bits << (g * group % 32);
    }
    words
}

/// Whether element `i` is kept according to `mask`.
pub fn is_kept(mask: &[u32], i: usize) -> bool {
    (mask[i / 32] >> (i % 32)) & 1 != 0
}

/// `y = kept ? x * scale : 0` over the logical elements, with the mask of forward call
/// `call`; returns the mask.
pub fn forward(p: f64, seed: u64, call: u64, x: &HostTensor, y: &mut HostTensor) -> Vec<u32> {
    let mask = keep_mask(p, seed, call, x.desc.element_count());
    apply(&mask, scale(p), x, y);
    mask
}

/// `dx = kept ? dy * scale : 0` with the mask a forward call left.
pub fn backward(p: f64, mask: &[u32], dy: &HostTensor, dx: &mut HostTensor) {
    apply(mask, scale(p), dy, dx);
}

fn apply(mask: &[u32], scale: f64, input: &HostTensor, out: &mut HostTensor) {
    let mut i = 0;
    for_each_index(input.desc.dims(), |idx| {
        let v = if is_kept(mask, i) {
            input.get(idx) * scale
        } else {
            0.0
        };
        out.set(idx, v);
        i += 1;
    });
}
