//! reduce_tensor (cudnnReduceTensor semantics): `y = alpha * reduce(x) + beta * y` over any
//! set of dims, with the flattened index of the chosen element for min/max/amax.
//!
//! `reduce_thread_*`: one thread per output (reduced dims outer, or short reductions).
//! `reduce_warp_*`: a group of 2..32 lanes per output (many outputs, moderate reductions).
//! `reduce_block_*`: one block per output, or per slice of one when `splits > 1`, which
//! then leaves [`ReducePartial`]s in the workspace for `reduce_finalize_*`.

use crate::activation::blend;
use crate::device::{
    block_dim_x, block_idx_x, block_reduce, global_thread_x, grid_dim_x, grid_stride, group_reduce,
    lane_id, shfl_xor_f32, shfl_xor_u32, sqrt, thread_idx_x,
};
use crate::element::Element;
use oxidnn_params::{ReduceOp, ReduceParams, ReducePartial};

const NO_INDEX: u32 = u32::MAX;

/// The accumulator an empty reduction starts from.
#[inline(always)]
fn identity(op: ReduceOp) -> ReducePartial {
    let value = match op {
        ReduceOp::Mul | ReduceOp::MulNoZeros => 1.0,
        ReduceOp::Min => f32::INFINITY,
        ReduceOp::Max => f32::NEG_INFINITY,
        _ => 0.0,
    };
    ReducePartial {
        value,
        index: NO_INDEX,
    }
}

/// What element `x` (flattened index `r`) contributes.
#[inline(always)]
fn contribution(op: ReduceOp, x: f32, r: u32) -> ReducePartial {
    let value = match op {
        ReduceOp::Amax | ReduceOp::Norm1 => x.abs(),
        ReduceOp::Norm2 => x * x,
        ReduceOp::MulNoZeros if x == 0.0 => 1.0,
        _ => x,
    };
    ReducePartial { value, index: r }
}

/// Whether `b` wins over `a` for a selecting op: NaN wins, then the extreme value, then
/// the smaller index (so the first occurrence is reported, whatever the reduction order).
#[inline(always)]
fn wins(op: ReduceOp, b: ReducePartial, a: ReducePartial) -> bool {
    let (bn, an) = (b.value != b.value, a.value != a.value);
    if bn || an {
        return bn && (!an || b.index < a.index);
    }
    let strictly = match op {
        ReduceOp::Min => b.value < a.value,
        _ => b.value > a.value,
    };
    strictly || (b.value == a.value && b.index < a.index)
}

#[inline(always)]
fn combine(op: ReduceOp, a: ReducePartial, b: ReducePartial) -> ReducePartial {
    match op {
        ReduceOp::Min | ReduceOp::Max | ReduceOp::Amax => {
            if wins(op, b, a) {
                b
            } else {
                a
            }
        }
        ReduceOp::Mul | ReduceOp::MulNoZeros => ReducePartial {
            value: a.value * b.value,
            index: NO_INDEX,
        },
        _ => ReducePartial {
            value: a.value + b.value,
            index: NO_INDEX,
        },
    }
}

#[inline(always)]
fn shfl(v: ReducePartial, mask: u32) -> ReducePartial {
    ReducePartial {
        value: shfl_xor_f32(v.value, mask),
        index: shfl_xor_u32(v.index, mask),
    }
}

/// Writes output `o` from its complete accumulator.
#[inline(always)]
unsafe fn write_output<T: Element>(
    p: &ReduceParams,
    o: u32,
    acc: ReducePartial,
    y: *mut T,
    idx: *mut u32,
) {
    let op = ReduceOp::from_u32(p.op);
    let v = match op {
        ReduceOp::Avg => acc.value / p.red_len as f32,
        ReduceOp::Norm2 => sqrt(acc.value),
        _ => acc.value,
    };
    let [_, y_off, i_off] = p.out.offsets(o);
    let yp = y.add(y_off as usize);
    T::store(yp, blend(p.alpha, v, p.beta, || T::load(yp)));
    if p.write_indices != 0 {
        *idx.add(i_off as usize) = if acc.index == NO_INDEX { 0 } else { acc.index };
    }
}

/// Reduces the elements `first, first + step, ..` below `end` of the output whose first
/// element is at `x_base`. Four independent accumulators keep four loads in flight.
#[inline(always)]
unsafe fn accumulate<T: Element>(
    p: &ReduceParams,
    op: ReduceOp,
    x: *const T,
    x_base: u64,
    first: u32,
    end: u32,
    step: u32,
) -> ReducePartial {
    let load = |r: u64| {
        let [off] = p.red.offsets(r as u32);
        T::load(x.add((x_base + off) as usize))
    };
    let (end, step) = (end as u64, step as u64);
    let mut acc = [identity(op); 4];
    let mut r = first as u64;
    while r + 3 * step < end {
        let v = [
            load(r),
            load(r + step),
            load(r + 2 * step),
            load(r + 3 * step),
        ];
        for j in 0..4 {
            let at = r + j as u64 * step;
            acc[j] = combine(op, acc[j], contribution(op, v[j], at as u32));
        }
        r += 4 * step;
    }
    while r < end {
        acc[0] = combine(op, acc[0], contribution(op, load(r), r as u32));
        r += step;
    }
    combine(op, combine(op, acc[0], acc[1]), combine(op, acc[2], acc[3]))
}

/// Groups of `p.group` lanes per output (grid-stride over outputs, uniform per warp so
/// every shuffle has the whole warp): a group's lanes stride through the reduction, then
/// combine by shuffles.
#[inline(always)]
unsafe fn reduce_warp<T: Element>(p: &ReduceParams, x: *const T, y: *mut T, idx: *mut u32) {
    let op = ReduceOp::from_u32(p.op);
    let per_warp = (32 / p.group) as u64;
    let warps = (grid_dim_x() as u64 * block_dim_x() as u64) / 32;
    let (group, lane) = (lane_id() / p.group, lane_id() % p.group);
    let mut base = (global_thread_x() / 32) * per_warp;
    while base < p.out_len as u64 {
        let o = base + group as u64;
        let active = o < p.out_len as u64;
        let mine = if active {
            let [x_base, _, _] = p.out.offsets(o as u32);
            accumulate(p, op, x, x_base, lane, p.red_len, p.group)
        } else {
            identity(op)
        };
        let total = group_reduce(mine, p.group, |a, b| combine(op, a, b), shfl);
        if active && lane == 0 {
            write_output(p, o as u32, total, y, idx);
        }
        base += warps * per_warp;
    }
}

#[inline(always)]
unsafe fn reduce_thread<T: Element>(p: &ReduceParams, x: *const T, y: *mut T, idx: *mut u32) {
    let op = ReduceOp::from_u32(p.op);
    grid_stride(p.out_len as u64, |o| {
        let o = o as u32;
        let [x_base, _, _] = p.out.offsets(o);
        let acc = accumulate(p, op, x, x_base, 0, p.red_len, 1);
        write_output(p, o, acc, y, idx);
    });
}

#[inline(always)]
unsafe fn reduce_block<T: Element>(
    p: &ReduceParams,
    x: *const T,
    y: *mut T,
    idx: *mut u32,
    partials: *mut ReducePartial,
) {
    let op = ReduceOp::from_u32(p.op);
    let scratch = crate::shared_array!(ReducePartial, 256);
    let (o, s) = (block_idx_x() / p.splits, block_idx_x() % p.splits);
    let begin = s * p.split_len;
    let end = if p.red_len - begin < p.split_len {
        p.red_len
    } else {
        begin + p.split_len
    };
    let [x_base, _, _] = p.out.offsets(o);
    let mine = accumulate(p, op, x, x_base, begin + thread_idx_x(), end, block_dim_x());
    let total = block_reduce(mine, scratch, identity(op), |a, b| combine(op, a, b), shfl);
    if thread_idx_x() == 0 {
        if p.splits == 1 {
            write_output(p, o, total, y, idx);
        } else {
            *partials.add(block_idx_x() as usize) = total;
        }
    }
}

#[inline(always)]
unsafe fn reduce_finalize<T: Element>(
    p: &ReduceParams,
    y: *mut T,
    idx: *mut u32,
    partials: *const ReducePartial,
) {
    let op = ReduceOp::from_u32(p.op);
    grid_stride(p.out_len as u64, |o| {
        let o = o as u32;
        let mut acc = identity(op);
        for s in 0..p.splits {
            acc = combine(op, acc, *partials.add((o * p.splits + s) as usize));
        }
        write_output(p, o, acc, y, idx);
    });
}

macro_rules! reduce_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// Pointers cover the tensors that `p` describes; `idx` may be null when
            /// `p.write_indices == 0`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<reduce_thread_ $dt>](
                p: ReduceParams, x: *const $T, y: *mut $T, idx: *mut u32,
            ) {
                reduce_thread::<$T>(&p, x, y, idx)
            }
            /// # Safety
            /// As `reduce_thread_*`; blocks are whole warps.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<reduce_warp_ $dt>](
                p: ReduceParams, x: *const $T, y: *mut $T, idx: *mut u32,
            ) {
                reduce_warp::<$T>(&p, x, y, idx)
            }
            /// # Safety
            /// As `reduce_thread_*`; `partials` holds `out_len * splits` entries when
            /// `p.splits > 1`. One block per (output, split).
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<reduce_block_ $dt>](
                p: ReduceParams, x: *const $T, y: *mut $T, idx: *mut u32,
                partials: *mut ReducePartial,
            ) {
                reduce_block::<$T>(&p, x, y, idx, partials)
            }
            /// # Safety
            /// As `reduce_block_*`, after it completed on the same stream.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<reduce_finalize_ $dt>](
                p: ReduceParams, y: *mut $T, idx: *mut u32, partials: *const ReducePartial,
            ) {
                reduce_finalize::<$T>(&p, y, idx, partials)
            }
        }
    };
}

crate::for_each_dtype!(reduce_entry_points);
