//! Folding the dims of operands that share one logical shape into the fewest dims the
//! kernels must walk: unit dims dropped, dims ordered by the output's strides, dims that are
//! contiguous in every operand merged. Dense operands laid out alike fold to one dim.

use crate::descriptor::TensorDescriptor;
use crate::error::{Error, Result};
use oxidnn_params::{FastDivisor, IndexMap, MAX_DIMS};

/// Dims (outermost first) and each operand's strides over them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Folded<const N: usize> {
    pub dims: Vec<usize>,
    pub strides: [Vec<usize>; N],
}

#[allow(clippy::needless_range_loop)] // `k` walks operands across several arrays
/// Folds `dims` with the operands' `strides`, ordering by operand `lead` (largest stride
/// outermost), so that consecutive threads walk `lead` contiguously.
pub(crate) fn fold<const N: usize>(
    dims: &[usize],
    strides: [&[usize]; N],
    lead: usize,
) -> Folded<N> {
    let mut order: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] > 1).collect();
    order.sort_by(|&a, &b| strides[lead][b].cmp(&strides[lead][a]));
    let mut out = Folded {
        dims: Vec::new(),
        strides: std::array::from_fn(|_| Vec::new()),
    };
    for d in order {
        let mergeable = !out.dims.is_empty()
            && (0..N).all(|k| *out.strides[k].last().unwrap_or(&0) == strides[k][d] * dims[d]);
        if mergeable {
            *out.dims.last_mut().unwrap_or(&mut 0) *= dims[d];
            for k in 0..N {
                if let Some(s) = out.strides[k].last_mut() {
                    *s = strides[k][d];
                }
            }
        } else {
            out.dims.push(dims[d]);
            for k in 0..N {
                out.strides[k].push(strides[k][d]);
            }
        }
    }
    out
}

impl<const N: usize> Folded<N> {
    /// Logical elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product()
    }

    /// Whether element `i` is at offset `i` in every operand.
    pub fn is_packed(&self) -> bool {
        self.dims.is_empty() || (self.dims.len() == 1 && self.strides.iter().all(|s| s[0] == 1))
    }

    /// The device form. Fails if the shape has more than `u32::MAX` elements (the strided
    /// kernels index in 32 bits).
    pub fn index_map(&self) -> Result<IndexMap<N>> {
        index_map(&self.dims, &self.strides)
    }
}

#[allow(clippy::needless_range_loop)]
/// The device form of `dims` with per-operand `strides`.
pub(crate) fn index_map<const N: usize>(
    dims: &[usize],
    strides: &[Vec<usize>; N],
) -> Result<IndexMap<N>> {
    let len: usize = dims.iter().product();
    if len > u32::MAX as usize {
        return Err(Error::unsupported(format!(
            "a non-contiguous tensor of {len} elements (the strided kernels index at most 2^32-1)"
        )));
    }
    if dims.len() > MAX_DIMS {
        return Err(Error::unsupported(format!(
            "{} dims after folding",
            dims.len()
        )));
    }
    let mut map = IndexMap::<N> {
        rank: dims.len() as u32,
        ..Default::default()
    };
    for (d, &n) in dims.iter().enumerate() {
        map.dims[d] = FastDivisor::new(n as u32);
        for k in 0..N {
            map.strides[k][d] = strides[k][d] as u64;
        }
    }
    Ok(map)
}

/// The strides of `input` broadcast to the dims of `out`: a dim of 1 in `input` where `out`
/// has more repeats its element (stride 0). Other dims must match.
pub(crate) fn broadcast_strides(
    arg: &'static str,
    input: &TensorDescriptor,
    out: &TensorDescriptor,
) -> Result<Vec<usize>> {
    if input.rank() != out.rank() {
        return Err(Error::bad(
            arg,
            format!(
                "rank {} differs from the output's rank {}",
                input.rank(),
                out.rank()
            ),
        ));
    }
    input
        .dims()
        .iter()
        .zip(out.dims())
        .zip(input.strides())
        .map(|((&i, &o), &s)| match (i, o) {
            (i, o) if i == o => Ok(s),
            (1, _) => Ok(0),
            _ => Err(Error::bad(
                arg,
                format!(
                    "dims {:?} cannot broadcast to {:?} (each dim must equal the output's or be 1)",
                    input.dims(),
                    out.dims()
                ),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_alike_operands_fold_to_one_dim() {
        let f = fold(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]], 1);
        assert_eq!(
            f,
            Folded {
                dims: vec![24],
                strides: [vec![1], vec![1]]
            }
        );
        assert!(f.is_packed());
    }

    #[test]
    fn nhwc_operands_fold_in_memory_order() {
        // N=2, C=3, H=4, W=5 stored NHWC in both operands.
        let s: [usize; 4] = [60, 1, 15, 3];
        let f = fold(&[2, 3, 4, 5], [&s, &s], 1);
        assert_eq!(f.dims, vec![120]);
    }

    #[test]
    fn transposed_operands_do_not_merge() {
        let f = fold(&[2, 3, 4, 5], [&[60, 20, 5, 1], &[60, 1, 15, 3]], 1);
        assert_eq!(f.dims, vec![2, 20, 3]);
        assert_eq!(f.strides, [vec![60, 1, 20], vec![60, 3, 1]]);
        assert!(!f.is_packed());
    }

    /// The folded map visits exactly the operand offset tuples of the logical elements.
    #[test]
    fn folded_maps_visit_every_element_once() {
        use crate::host_tensor::for_each_index;
        let dims = [48usize, 3, 8, 3];
        let layouts: [[usize; 4]; 3] = [[72, 24, 3, 1], [1, 48, 144, 1152], [1, 49, 196, 1800]];
        for a in layouts {
            for b in layouts {
                for c in layouts {
                    let f = fold(&dims, [&a, &b, &c], 2);
                    let map = f.index_map().unwrap();
                    let mut got: Vec<[u64; 3]> =
                        (0..f.len() as u32).map(|i| map.offsets(i)).collect();
                    let mut want = Vec::new();
                    for_each_index(&dims, |i| {
                        let o = |s: &[usize; 4]| {
                            i.iter().zip(s).map(|(x, y)| (x * y) as u64).sum::<u64>()
                        };
                        want.push([o(&a), o(&b), o(&c)]);
                    });
                    got.sort();
                    want.sort();
                    assert_eq!(got, want, "{a:?} {b:?} {c:?} folded to {f:?}");
                }
            }
        }
    }

    #[test]
    fn unit_dims_vanish_and_scalars_fold_to_nothing() {
        let f = fold(&[1, 1], [&[1, 1]], 0);
        assert!(f.dims.is_empty() && f.is_packed() && f.len() == 1);
    }
}
