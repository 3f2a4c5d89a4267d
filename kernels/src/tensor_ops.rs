//! Tensor ops: op_tensor / add_tensor / scale_tensor / set_tensor (`tensor_op_*`) and
//! transform_tensor with dtype conversion (`transform_*`, and `transpose_*` when the
//! source and destination have different unit-stride dims).

use crate::activation::blend;
use crate::device::{
    block_idx_x, grid_stride, ld_global_nc_v4, sqrt, st_global_v4, sync_threads, thread_idx_x,
};
use crate::element::Element;
use crate::elementwise::{map_packed, map_packed_broadcast, map_strided, Broadcast};
use oxidnn_params::{
    PointwiseOp, RowGatherParams, TensorOpParams, TransformParams, TransposeParams,
    TRANSPOSE_BLOCK_ROWS, TRANSPOSE_TILE,
};

/// `op(a, b)` on already scaled operands.
#[inline(always)]
pub fn pointwise(op: PointwiseOp, a: f32, b: f32) -> f32 {
    match op {
        PointwiseOp::CopyA | PointwiseOp::Fill => a,
        PointwiseOp::Add => a + b,
        PointwiseOp::Mul => a * b,
        PointwiseOp::Min => a.min(b),
        PointwiseOp::Max => a.max(b),
        PointwiseOp::Sqrt => sqrt(a),
        PointwiseOp::Not => 1.0 - a,
    }
}

/// Evaluates `$body` with `$o` bound to `$op` as a constant (one specialised loop per op).
macro_rules! with_op {
    ($op:expr, |$o:ident| $body:expr) => {
        match $op {
            PointwiseOp::CopyA => {
                const $o: PointwiseOp = PointwiseOp::CopyA;
                $body
            }
            PointwiseOp::Add => {
                const $o: PointwiseOp = PointwiseOp::Add;
                $body
            }
            PointwiseOp::Mul => {
                const $o: PointwiseOp = PointwiseOp::Mul;
                $body
            }
            PointwiseOp::Min => {
                const $o: PointwiseOp = PointwiseOp::Min;
                $body
            }
            PointwiseOp::Max => {
                const $o: PointwiseOp = PointwiseOp::Max;
                $body
            }
            PointwiseOp::Sqrt => {
                const $o: PointwiseOp = PointwiseOp::Sqrt;
                $body
            }
            PointwiseOp::Not => {
                const $o: PointwiseOp = PointwiseOp::Not;
                $body
            }
            PointwiseOp::Fill => {
                const $o: PointwiseOp = PointwiseOp::Fill;
                $body
            }
        }
    };
}

#[inline(always)]
unsafe fn tensor_op_packed<T: Element>(p: &TensorOpParams, a: *const T, b: *const T, c: *mut T) {
    let read_c = p.beta != 0.0;
    with_op!(PointwiseOp::from_u32(p.op), |OP| {
        if OP.reads_b() {
            map_packed::<T, T, 2>(p.len, [a, b], c, read_c, |[av, bv], old| {
                blend(
                    1.0,
                    pointwise(OP, p.alpha1 * av, p.alpha2 * bv),
                    p.beta,
                    || old,
                )
            });
        } else if OP.reads_a() {
            map_packed::<T, T, 1>(p.len, [a], c, read_c, |[av], old| {
                blend(1.0, pointwise(OP, p.alpha1 * av, 0.0), p.beta, || old)
            });
        } else {
            map_packed::<T, T, 0>(p.len, [], c, false, |[], _| p.alpha1);
        }
    })
}

/// `c` and the non-broadcast input packed, input `p.broadcast` through `p.map`.
#[inline(always)]
unsafe fn tensor_op_broadcast<T: Element>(p: &TensorOpParams, a: *const T, b: *const T, c: *mut T) {
    match p.broadcast {
        0 => tensor_op_broadcast_from::<T, 0>(p, a, b, c),
        _ => tensor_op_broadcast_from::<T, 1>(p, a, b, c),
    }
}

#[inline(always)]
unsafe fn tensor_op_broadcast_from<T: Element, const B: usize>(
    p: &TensorOpParams,
    a: *const T,
    b: *const T,
    c: *mut T,
) {
    let read_c = p.beta != 0.0;
    let bc = Broadcast {
        input: B,
        operand: B,
        map: &p.map,
        inner: p.broadcast_inner_stride,
        inner_len: p.broadcast_inner_len,
    };
    with_op!(PointwiseOp::from_u32(p.op), |OP| {
        if OP.reads_b() {
            map_packed_broadcast::<T, T, 2, 3>(
                p.len,
                [a, b],
                Some(bc),
                c,
                read_c,
                |[av, bv], old| {
                    blend(
                        1.0,
                        pointwise(OP, p.alpha1 * av, p.alpha2 * bv),
                        p.beta,
                        || old,
                    )
                },
            );
        } else if B == 0 {
            // Unary ops (and add_tensor's CopyA) read `a` only.
            map_packed_broadcast::<T, T, 1, 3>(p.len, [a], Some(bc), c, read_c, |[av], old| {
                blend(1.0, pointwise(OP, p.alpha1 * av, 0.0), p.beta, || old)
            });
        }
    })
}

#[inline(always)]
unsafe fn tensor_op_strided<T: Element>(p: &TensorOpParams, a: *const T, b: *const T, c: *mut T) {
    let read_c = p.beta != 0.0;
    with_op!(PointwiseOp::from_u32(p.op), |OP| {
        if OP.reads_b() {
            map_strided::<T, T, 2, 3>(p.len, &p.map, [a, b], c, read_c, |[av, bv], old| {
                blend(
                    1.0,
                    pointwise(OP, p.alpha1 * av, p.alpha2 * bv),
                    p.beta,
                    || old,
                )
            });
        } else if OP.reads_a() {
            map_strided::<T, T, 1, 3>(p.len, &p.map, [a], c, read_c, |[av], old| {
                blend(1.0, pointwise(OP, p.alpha1 * av, 0.0), p.beta, || old)
            });
        } else {
            map_strided::<T, T, 0, 3>(p.len, &p.map, [], c, false, |[], _| p.alpha1);
        }
    })
}

#[inline(always)]
unsafe fn transform_packed<S: Element, T: Element>(p: &TransformParams, x: *const S, y: *mut T) {
    map_packed::<S, T, 1>(p.len, [x], y, p.beta != 0.0, |[v], old| {
        blend(p.alpha, v, p.beta, || old)
    });
}

#[inline(always)]
unsafe fn transform_strided<S: Element, T: Element>(p: &TransformParams, x: *const S, y: *mut T) {
    map_strided::<S, T, 1, 2>(p.len, &p.map, [x], y, p.beta != 0.0, |[v], old| {
        blend(p.alpha, v, p.beta, || old)
    });
}

const TILE: u32 = TRANSPOSE_TILE;
const ROWS: u32 = TRANSPOSE_BLOCK_ROWS;
/// Row pitch of the shared tile: one word of padding keeps column reads conflict-free.
const PITCH: u32 = TILE + 1;
/// Tile rows each thread moves.
const STEPS: usize = (TILE / ROWS) as usize;
const _: () = assert!(
    TILE * PITCH * 4 == 16640 && STEPS == 16,
    "the literals below"
);

/// One `TILE`² tile per block of `TILE * ROWS` threads: coalesced reads along `a` (unit
/// stride in x) into registers, then shared memory; coalesced writes along `b` (unit
/// stride in y) out. All of a thread's loads are issued before its first shared store.
/// 16-bit data moves as element pairs (one word per thread and access) where `p.pairs`
/// allows, so that each warp access is 128 bytes as for f32.
#[inline(always)]
unsafe fn transpose<S: Element, T: Element>(p: &TransposeParams, x: *const S, y: *mut T) {
    let tile = crate::shared_f32!(16640);
    let (rest, tile_a) = p.tiles_a.div_rem(block_idx_x());
    let (batch, tile_b) = p.tiles_b.div_rem(rest);
    let [x_base, y_base] = p.batch.offsets(batch);
    let (a0, b0) = (tile_a * TILE, tile_b * TILE);
    let tid = thread_idx_x();

    if size_of::<S>() == 2 && p.pairs & 1 != 0 {
        // 32 lanes x 2 elements along a; 8 rows of b per step.
        let (tx, ty) = (tid % (TILE / 2), tid / (TILE / 2));
        let a = a0 + 2 * tx;
        let mut vals = [[0.0f32; 2]; STEPS / 2];
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            let b = b0 + ty + k as u32 * 2 * ROWS;
            if a < p.len_a && b < p.len_b {
                vals[k] = S::load_pair(x.add((x_base + b as u64 * p.x_stride_b + a as u64) as usize));
            }
        });
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            let row = (ty + k as u32 * 2 * ROWS) * PITCH;
            tile.store(row + 2 * tx, vals[k][0]);
            tile.store(row + 2 * tx + 1, vals[k][1]);
        });
    } else {
        let (tx, ty) = (tid % TILE, tid / TILE);
        let a = a0 + tx;
        let mut vals = [0.0f32; STEPS];
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let b = b0 + ty + k as u32 * ROWS;
            if a < p.len_a && b < p.len_b {
                vals[k] = S::load(x.add((x_base + b as u64 * p.x_stride_b + a as u64) as usize));
            }
        });
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            tile.store((ty + k as u32 * ROWS) * PITCH + tx, vals[k]);
        });
    }
    sync_threads();
    if size_of::<T>() == 2 && p.pairs & 2 != 0 {
        let (tx, ty) = (tid % (TILE / 2), tid / (TILE / 2));
        let b = b0 + 2 * tx;
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            let r = ty + k as u32 * 2 * ROWS;
            let a = a0 + r;
            if a < p.len_a && b < p.len_b {
                let at = y.add((y_base + a as u64 * p.y_stride_a + b as u64) as usize);
                let v = [tile.load(2 * tx * PITCH + r), tile.load((2 * tx + 1) * PITCH + r)];
                let old = if p.beta != 0.0 { T::load_pair(at) } else { [0.0; 2] };
                T::store_pair(at, [blend(p.alpha, v[0], p.beta, || old[0]), blend(p.alpha, v[1], p.beta, || old[1])]);
            }
        });
    } else {
        let (tx, ty) = (tid % TILE, tid / TILE);
        let b = b0 + tx;
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let r = ty + k as u32 * ROWS;
            let a = a0 + r;
            if a < p.len_a && b < p.len_b {
                let at = (y_base + a as u64 * p.y_stride_a + b as u64) as usize;
                let v = tile.load(tx * PITCH + r);
                T::store(y.add(at), blend(p.alpha, v, p.beta, || T::load(y.add(at))));
            }
        });
    }
}

macro_rules! tensor_op_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<tensor_op_packed_ $dt>](
                p: TensorOpParams, a: *const $T, b: *const $T, c: *mut $T,
            ) {
                tensor_op_packed::<$T>(&p, a, b, c)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes; see `TensorOpParams`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<tensor_op_broadcast_ $dt>](
                p: TensorOpParams, a: *const $T, b: *const $T, c: *mut $T,
            ) {
                tensor_op_broadcast::<$T>(&p, a, b, c)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<tensor_op_strided_ $dt>](
                p: TensorOpParams, a: *const $T, b: *const $T, c: *mut $T,
            ) {
                tensor_op_strided::<$T>(&p, a, b, c)
            }
        }
    };
}

macro_rules! transform_entry_points {
    ($s:ident, $S:ty, $d:ident, $D:ty) => {
        paste::paste! {
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<transform_packed_ $s _ $d>](
                p: TransformParams, x: *const $S, y: *mut $D,
            ) {
                transform_packed::<$S, $D>(&p, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<transform_strided_ $s _ $d>](
                p: TransformParams, x: *const $S, y: *mut $D,
            ) {
                transform_strided::<$S, $D>(&p, x, y)
            }
            /// # Safety
            /// Pointers cover the tensors that `p` describes; blocks are `TILE * ROWS`
            /// threads.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<transpose_ $s _ $d>](
                p: TransposeParams, x: *const $S, y: *mut $D,
            ) {
                transpose::<$S, $D>(&p, x, y)
            }
        }
    };
}

crate::for_each_dtype!(tensor_op_entry_points);
crate::for_each_dtype_pair!(transform_entry_points);

/// A gather of rows whose bytes, starts and strides are whole 16-byte chunks (row `r` of
/// the packed destination from chunk `p.rows.offsets(r)[0]` of the source): one 16-byte
/// load and store per chunk, whatever the element type. The strided 1x1 convolution's
/// pixel staging (channels-last pixels at stride 2), which the element-wise
/// `transform_strided` ran at a third of copy bandwidth (H100: 209 µs for 206 MB,
/// compute-bound on the index maps).
///
/// # Safety
/// `x` covers every source chunk `p` names and `y` `p.len` chunks; both 16-byte aligned;
/// they do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn transform_rows_v4(
    p: RowGatherParams,
    x: *const u32,
    y: *mut u32,
) {
    grid_stride(p.len, |i| {
        let (row, chunk) = p.chunks.div_rem(i as u32);
        let [start] = p.rows.offsets(row);
        let v = ld_global_nc_v4(x.add(((start + chunk as u64) * 4) as usize));
        st_global_v4(y.add((i * 4) as usize), v);
    });
}
