//! The two shapes every elementwise kernel takes: *packed* (all operands dense and laid
//! out alike, so element `i` is at offset `i` everywhere: vector accesses, coalesced
//! warp-wide) and *strided* (any strides, one element at a time through an [`IndexMap`]).

use crate::device::{block_dim_x, global_thread_x, grid_dim_x, lane_id};
use crate::element::Element;
use oxidnn_params::{packed_vector_elements, FastDivisor, IndexMap, PACKED_VECTORS_PER_THREAD};

const _: () = assert!(
    PACKED_VECTORS_PER_THREAD == 4,
    "the unrolled loops below list 4 vectors"
);

/// `out[i] = f([in_0[i], ..], out[i])` over `len` dense elements, laid out over threads as
/// `oxidnn_params::PACKED_VECTORS_PER_THREAD` describes: all loads of a thread first, then
/// the math, then the stores; the one thread group that runs past `len` goes element by
/// element.
/// `out[i]` is read only if `read_out` (otherwise `f` sees 0). The grid must give every
/// `packed_elements_per_thread(widest)` elements a thread.
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
    map_packed_broadcast::<S, T, N, 1>(len, ins, None, out, read_out, f)
}

/// A broadcast input of [`map_packed_broadcast`]: input `input` is read at
/// `map.offsets(i)[operand]` instead of `i`; `inner` is its stride along the map's
/// innermost dim, whose extent is `inner_len`. `input` and `operand` must be compile-time
/// constants at the call site (a run-time index would move the map to local memory).
#[derive(Clone, Copy)]
pub struct Broadcast<'a, const M: usize> {
    pub input: usize,
    pub operand: usize,
    pub map: &'a IndexMap<M>,
    pub inner: u64,
    pub inner_len: FastDivisor,
}

/// [`map_packed`] where one input may be broadcast through an index map (e.g. a bias of
/// one value per channel): one offset computation per vector, unless the vector crosses
/// the end of the map's innermost dim.
///
/// # Safety
/// As [`map_packed`]; the broadcast input's offsets are in bounds.
#[inline(always)]
pub unsafe fn map_packed_broadcast<S: Element, T: Element, const N: usize, const M: usize>(
    len: u64,
    ins: [*const S; N],
    broadcast: Option<Broadcast<'_, M>>,
    out: *mut T,
    read_out: bool,
    f: impl Fn([f32; N], f32) -> f32,
) {
    let widest = if size_of::<S>() > size_of::<T>() {
        size_of::<S>()
    } else {
        size_of::<T>()
    };
    match packed_vector_elements(widest) {
        4 => map_vectors::<S, T, N, M, 4>(len, ins, broadcast, out, read_out, f),
        _ => map_vectors::<S, T, N, M, 8>(len, ins, broadcast, out, read_out, f),
    }
}

/// The `K` values of the broadcast input for the vector starting at element `at`.
#[inline(always)]
unsafe fn broadcast_vector<S: Element, const M: usize, const K: usize>(
    b: &Broadcast<'_, M>,
    p: *const S,
    at: u64,
) -> [f32; K] {
    let (_, pos) = b.inner_len.div_rem(at as u32);
    let row_len = b.inner_len.divisor;
    if pos + K as u32 > row_len {
        // The vector crosses into the next row: two row starts, or (rows shorter than a
        // vector) an offset per element.
        let mut out = [0.0f32; K];
        if row_len as usize >= K {
            let split = row_len - pos;
            let off = b.map.offsets(at as u32)[b.operand];
            let next = b.map.offsets(at as u32 + split)[b.operand];
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                if e < K {
                    let e32 = e as u32;
                    let o = if e32 < split { off + e as u64 * b.inner } else { next + (e32 - split) as u64 * b.inner };
                    out[e] = S::load(p.add(o as usize));
                }
            });
        } else {
            // Rare (rows shorter than a vector): a rolled loop keeps each kernel's code small
            // (unrolled, it was most of the tensor-op module's PTX and JIT time).
            for e in 0..K {
                let v = S::load(p.add(b.map.offsets(at as u32 + e as u32)[b.operand] as usize));
                // A run-time index would put `out` in local memory: select its slot instead.
                crate::unroll!(slot in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if slot < K && slot == e {
                        out[slot] = v;
                    }
                });
            }
        }
        return out;
    }
    let off = b.map.offsets(at as u32)[b.operand];
    if b.inner == 0 {
        let v = S::load(p.add(off as usize));
        [v; K]
    } else {
        let mut out = [0.0f32; K];
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            if e < K {
                out[e] = S::load(p.add((off + e as u64 * b.inner) as usize));
            }
        });
        out
    }
}

#[inline(always)]
unsafe fn map_vectors<S: Element, T: Element, const N: usize, const M: usize, const K: usize>(
    len: u64,
    ins: [*const S; N],
    broadcast: Option<Broadcast<'_, M>>,
    out: *mut T,
    read_out: bool,
    f: impl Fn([f32; N], f32) -> f32,
) {
    const V: usize = PACKED_VECTORS_PER_THREAD;
    let warp = global_thread_x() / 32;
    let first = (warp * (V as u64) * 32 + lane_id() as u64) * K as u64;
    let start = |v: usize| first + (v * 32 * K) as u64;
    if start(V - 1) + K as u64 > len {
        // The last, partial group of the grid: element by element.
        for v in 0..V {
            let mut i = start(v);
            while i < len && i < start(v) + K as u64 {
                let p = i as usize;
                let mut args = [0.0f32; N];
                for k in 0..N {
                    let at = match &broadcast {
                        Some(b) if b.input == k => b.map.offsets(i as u32)[b.operand] as usize,
                        _ => p,
                    };
                    args[k] = S::load(ins[k].add(at));
                }
                let old = if read_out { T::load(out.add(p)) } else { 0.0 };
                T::store(out.add(p), f(args, old));
                i += 1;
            }
        }
        return;
    }
    // Raw words, unpacked only when used: 16-bit data stays two elements per register.
    let mut vals = [[[0u32; 4]; V]; N];
    let mut olds = [[0u32; 4]; V];
    // The broadcast operand's values, repacked into `S`'s words (exact: they are `S`
    // values): 16-bit data then keeps two per register, as the other inputs do.
    let mut bvals = [[0u32; 4]; V];
    let is_broadcast = |k: usize| matches!(broadcast, Some(b) if b.input == k);
    crate::unroll!(v in [0, 1, 2, 3] {
        let at = start(v);
        if let Some(b) = &broadcast {
            bvals[v] = S::pack::<K>(broadcast_vector::<S, M, K>(b, ins[b.input], at));
        }
        for k in 0..N {
            if is_broadcast(k) {
                continue;
            }
            // In-place calls alias an input with `out`; the element is read here before
            // this same thread writes it, so the read-only path stays valid.
            vals[k][v] = S::load_raw::<K>(ins[k].add(at as usize), true);
        }
        if read_out {
            olds[v] = T::load_raw::<K>(out.add(at as usize), false);
        }
    });
    crate::unroll!(v in [0, 1, 2, 3] {
        let mut ins_v = [[0.0f32; K]; N];
        for k in 0..N {
            ins_v[k] = if is_broadcast(k) {
                S::unpack::<K>(bvals[v])
            } else {
                S::unpack::<K>(vals[k][v])
            };
        }
        let old_v = T::unpack::<K>(olds[v]);
        let mut res = [0.0f32; K];
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            if e < K {
                let mut args = [0.0f32; N];
                for k in 0..N {
                    args[k] = ins_v[k][e];
                }
                res[e] = f(args, old_v[e]);
            }
        });
        T::store_vec::<K>(out.add(start(v) as usize), res);
    });
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
    // Four elements per iteration, all loads first: a strided kernel moves few bytes per
    // element, so each thread needs several loads in flight to cover memory latency.
    let step = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut i = global_thread_x();
    while i + 3 * step < len {
        let mut off = [[0u64; M]; 4];
        let mut args = [[0.0f32; N]; 4];
        let mut olds = [0.0f32; 4];
        crate::unroll!(j in [0, 1, 2, 3] {
            off[j] = map.offsets((i + j as u64 * step) as u32);
        });
        crate::unroll!(j in [0, 1, 2, 3] {
            for k in 0..N {
                args[j][k] = S::load(ins[k].add(off[j][k] as usize));
            }
            if read_out {
                olds[j] = T::load(out.add(off[j][M - 1] as usize));
            }
        });
        crate::unroll!(j in [0, 1, 2, 3] {
            T::store(out.add(off[j][M - 1] as usize), f(args[j], olds[j]));
        });
        i += 4 * step;
    }
    while i < len {
        let off = map.offsets(i as u32);
        let mut args = [0.0f32; N];
        for k in 0..N {
            args[k] = S::load(ins[k].add(off[k] as usize));
        }
        let o = out.add(off[M - 1] as usize);
        let old = if read_out { T::load(o) } else { 0.0 };
        T::store(o, f(args, old));
        i += step;
    }
}
