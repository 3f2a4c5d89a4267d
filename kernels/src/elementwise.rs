//! The two shapes every elementwise kernel takes: *packed* (all operands dense and laid
//! out alike, so element `i` is at offset `i` everywhere: 16-byte vector accesses) and
//! *strided* (any strides, one element at a time through an [`IndexMap`]).

use crate::device::{global_thread_x, grid_stride};
use crate::element::Element;
use oxidnn_params::{packed_chunks_per_thread, IndexMap, PACKED_CHUNK};

const MAX_CHUNKS: usize = packed_chunks_per_thread(2);
const _: () = assert!(
    MAX_CHUNKS == 4 && PACKED_CHUNK == 8,
    "the unrolled loops below list 4 chunks of 8"
);

/// `out[i] = f([in_0[i], ..], out[i])` over `len` dense elements. Each thread takes
/// `packed_elements_per_thread(widest)` consecutive elements: all loads first, then the
/// math, then the stores; the last, partial group goes element by element. `out[i]` is
/// read only if `read_out` (otherwise `f` sees 0). The grid must cover `len` with one
/// group per thread.
///
/// # Safety
/// Every pointer is 16-byte aligned and valid for `len` elements; inputs may alias `out`
/// only element for element (in place), never shifted.
#[inline(always)]
pub unsafe fn map_packed<S: Element, T: Element, const N: usize>(
    len: u64,
    ins: [*const S; N],
    out: *mut T,
    read_out: bool,
    f: impl Fn([f32; N], f32) -> f32,
) {
    let widest = if size_of::<S>() > size_of::<T>() {
        size_of::<S>()
    } else {
        size_of::<T>()
    };
    let chunks = packed_chunks_per_thread(widest);
    let per_thread = (chunks * PACKED_CHUNK) as u64;
    let base = global_thread_x() * per_thread;
    if base + per_thread <= len {
        let mut vals = [[[0.0f32; PACKED_CHUNK]; MAX_CHUNKS]; N];
        let mut olds = [[0.0f32; PACKED_CHUNK]; MAX_CHUNKS];
        crate::unroll!(c in [0, 1, 2, 3] {
            if c < chunks {
                let at = (base + (c * PACKED_CHUNK) as u64) as usize;
                for k in 0..N {
                    // In-place calls alias an input with `out`; the element is read here
                    // before this same thread writes it, so the read-only path stays valid.
                    vals[k][c] = S::load_chunk(ins[k].add(at), true);
                }
                if read_out {
                    olds[c] = T::load_chunk(out.add(at), false);
                }
            }
        });
        crate::unroll!(c in [0, 1, 2, 3] {
            if c < chunks {
                let mut res = [0.0f32; PACKED_CHUNK];
                crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let mut args = [0.0f32; N];
                    for k in 0..N {
                        args[k] = vals[k][c][e];
                    }
                    res[e] = f(args, olds[c][e]);
                });
                T::store_chunk(out.add((base + (c * PACKED_CHUNK) as u64) as usize), res);
            }
        });
    } else {
        let mut i = base;
        while i < len {
            let at = i as usize;
            let mut args = [0.0f32; N];
            for k in 0..N {
                args[k] = S::load(ins[k].add(at));
            }
            let old = if read_out { T::load(out.add(at)) } else { 0.0 };
            T::store(out.add(at), f(args, old));
            i += 1;
        }
    }
}

/// `out[o_M-1(i)] = f([in_k[o_k(i)]], out[..])` for the `len` logical elements of `map`,
/// whose first `N` operands are the inputs and whose last is `out` (`N < M`; operands in
/// between are skipped). Grid-stride loop.
///
/// # Safety
/// Every offset `map` produces for `i < len` is in bounds of its operand; `out`'s offsets
/// are distinct (the host rejects overlapping output strides).
#[inline(always)]
pub unsafe fn map_strided<S: Element, T: Element, const N: usize, const M: usize>(
    len: u64,
    map: &IndexMap<M>,
    ins: [*const S; N],
    out: *mut T,
    read_out: bool,
    f: impl Fn([f32; N], f32) -> f32,
) {
    grid_stride(len, |i| {
        let off = map.offsets(i as u32);
        let mut args = [0.0f32; N];
        for k in 0..N {
            args[k] = S::load(ins[k].add(off[k] as usize));
        }
        let o = out.add(off[M - 1] as usize);
        let old = if read_out { T::load(o) } else { 0.0 };
        T::store(o, f(args, old));
    });
}
