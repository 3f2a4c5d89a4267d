//! Planning the row kernels of the normalisation-style families (layer/RMS norm, softmax):
//! a tensor splits into *rows* (the reduced dims, `inner`) indexed by the other dims
//! (`outer`); the plan says which kernel runs them and with what geometry:
//!
//! 1. rows dense and aligned in every operand: 16-byte vectors held in registers by a
//!    group of warps per row (`vec<slots>`), the input read once;
//! 2. other rows short enough for registers: elements through an index map (`map<slots>`);
//! 3. longer rows: streamed in chunks by a block per row (`long_vec` / `long_map`);
//! 4. (softmax) rows whose reduced dim is strided while neighbouring rows are adjacent in
//!    memory: a thread per row, so a warp reads 32 adjacent elements (`column`).

use super::layout::{fold, index_map, Folded};
use crate::error::{Error, Result};
use crate::launch::{Gpu, LaunchConfig};
use oxidnn_params::{
    IndexMap, MAP_SLOTS, ROW_BLOCK_THREADS, STREAM_SLOTS, STREAM_WARPS, VEC_SLOTS,
};

/// A tensor problem split into rows: the outer dims (which row) with the strides of the
/// `M` operands that have one value or row per row, and the inner dims (which element of
/// a row) with the strides of the `N` operands indexed per element.
pub(crate) struct Split<const N: usize, const M: usize> {
    pub outer_dims: Vec<usize>,
    pub outer_strides: [Vec<usize>; M],
    pub inner_dims: Vec<usize>,
    pub inner_strides: [Vec<usize>; N],
}

/// Which kernel of a family runs the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowKernel {
    /// `vec<slots>`: dense rows, `slots` 16-byte vectors per thread, in registers.
    Vectors { slots: u32 },
    /// `map<slots>`: elements through the inner map, `slots` per thread, in registers.
    Mapped { slots: u32 },
    /// `long_vec` / `long_map`: streamed in chunks.
    Streamed { vectors: bool },
    /// `column`: a thread per row.
    Column,
}

/// What a family's kernels can hold: `max_values` row values per thread and operand in
/// registers, and whether it has a `column` kernel. With `packed`, the kernels hold a
/// row's vectors as loaded (`Held` in `kernels/src/rows.rs`) and the budget counts 32-bit
/// registers: a 16-bit type fits twice as many values. With `groups_share_blocks`, the
/// in-register kernels' groups of several warps meet at named barriers, so several share
/// a block (`Group::of` in the kernels, from the same constant); otherwise such a group is
/// a block of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    pub max_values: usize,
    pub packed: bool,
    pub columns: bool,
    pub groups_share_blocks: bool,
}

impl Budget {
    /// Row values per thread and operand for elements of `elem_bytes` held as `vectors`
    /// (16-byte vectors) or one by one.
    fn values(&self, elem_bytes: usize, vectors: bool) -> usize {
        if self.packed && vectors {
            self.max_values * (4 / elem_bytes).max(1)
        } else {
            self.max_values
        }
    }
}

/// The kernel and geometry for a [`Split`].
#[derive(Clone, Debug)]
pub(crate) struct RowPlan<const N: usize, const M: usize> {
    pub kernel: RowKernel,
    pub rows: u32,
    pub row_len: u32,
    /// Warps per row (row kernels).
    pub warps: u32,
    /// Chunks per row (streamed kernels; 1 otherwise).
    pub chunks: u32,
    /// Threads per block.
    pub block: u32,
    /// Blocks that give every row its group (or thread).
    pub blocks: u32,
    pub outer: IndexMap<M>,
    pub inner: IndexMap<N>,
}

impl<const N: usize, const M: usize> RowPlan<N, M> {
    /// Plans `split` for elements of `elem_bytes`; `vector_operands` marks the outer
    /// operands whose rows the `vec` kernels read or write as vectors (their row bases
    /// must be vector-aligned). `max_threads` gives the largest block a kernel can be
    /// launched with (0 where the family has no such kernel): a row group of a kernel
    /// with many registers per thread must stay below it.
    pub fn new(
        split: &Split<N, M>,
        vector_operands: [bool; M],
        elem_bytes: usize,
        budget: Budget,
        max_threads: &dyn Fn(RowKernel) -> Result<u32>,
    ) -> Result<Self> {
        let rows: usize = split.outer_dims.iter().product();
        let row_len: usize = split.inner_dims.iter().product();
        if rows > i32::MAX as usize || row_len > i32::MAX as usize {
            return Err(Error::unsupported(format!(
                "{rows} rows of {row_len} elements (each at most 2^31-1)"
            )));
        }
        let inner = fold(
            &split.inner_dims,
            std::array::from_fn(|k| split.inner_strides[k].as_slice()),
            0,
        );
        let outer = fold(
            &split.outer_dims,
            std::array::from_fn(|k| split.outer_strides[k].as_slice()),
            0,
        );
        let k = 16 / elem_bytes;
        let vectors = inner.is_packed()
            && row_len.is_multiple_of(k)
            && (0..M).all(|o| {
                !vector_operands[o] || outer.strides[o].iter().all(|s| s.is_multiple_of(k))
            });
        let mut plan = Self {
            kernel: RowKernel::Column,
            rows: rows as u32,
            row_len: row_len as u32,
            warps: 1,
            chunks: 1,
            block: ROW_BLOCK_THREADS,
            blocks: rows.div_ceil(ROW_BLOCK_THREADS as usize).max(1) as u32,
            outer: outer.index_map()?,
            inner: inner.index_map()?,
        };
        if budget.columns && !inner.is_packed() && adjacent_rows(&outer) {
            return Ok(plan);
        }
        let (list, k): (&[u32], usize) = if vectors {
            (&VEC_SLOTS, k)
        } else {
            (&MAP_SLOTS, 1)
        };
        let slots_needed = row_len.div_ceil(k);
        let kernel_of = |slots| {
            if vectors {
                RowKernel::Vectors { slots }
            } else {
                RowKernel::Mapped { slots }
            }
        };
        // The most slots per thread within the budget whose kernel can launch the group
        // the row needs (more slots: fewer warps per row, fewer block-wide reductions).
        let max_values = budget.values(elem_bytes, vectors);
        let mut allowed: Vec<u32> = list
            .iter()
            .copied()
            .filter(|&v| v as usize * k <= max_values)
            .collect();
        allowed.sort_unstable();
        let mut chosen = None;
        for &v in allowed.iter().rev() {
            let warps = slots_needed.div_ceil(32 * v as usize).next_power_of_two();
            if warps <= max_warps(max_threads(kernel_of(v))?) as usize {
                chosen = Some((v, warps));
                break;
            }
        }
        if let Some((widest, warps)) = chosen {
            // One warp: the fewest slots that still cover the row.
            let slots = if warps == 1 {
                allowed
                    .iter()
                    .copied()
                    .find(|&v| 32 * v as usize >= slots_needed && v <= widest)
                    .unwrap_or(widest)
            } else {
                widest
            };
            plan.kernel = kernel_of(slots);
            plan.warps = warps as u32;
        } else {
            plan.kernel = RowKernel::Streamed { vectors };
            plan.warps = STREAM_WARPS.min(max_warps(max_threads(plan.kernel)?));
            if plan.warps == 0 {
                return Err(Error::unsupported(format!(
                    "no kernel for rows of {row_len} elements"
                )));
            }
            let per_chunk = 32 * (plan.warps * STREAM_SLOTS) as usize;
            plan.chunks = slots_needed.div_ceil(per_chunk) as u32;
        }
        // Groups share blocks of ROW_BLOCK_THREADS where the kernel can launch them: groups
        // of one warp, and with `groups_share_blocks`, groups of several. Otherwise a group
        // of several warps is a block of its own (its reductions meet at the block's
        // barrier), as is a streamed kernel's group (one long row at a time).
        let streamed = matches!(plan.kernel, RowKernel::Streamed { .. });
        plan.block = if !streamed && (plan.warps == 1 || budget.groups_share_blocks) {
            let limit = max_warps(max_threads(plan.kernel)?);
            let block_warps = (ROW_BLOCK_THREADS / 32).min(limit).max(plan.warps);
            32 * (block_warps / plan.warps * plan.warps)
        } else {
            32 * plan.warps
        };
        let groups_per_block = (plan.block / (32 * plan.warps)) as usize;
        plan.blocks = rows.div_ceil(groups_per_block).max(1) as u32;
        Ok(plan)
    }

    /// The launch of `grid` blocks (at most [`RowPlan::blocks`]).
    pub fn config(&self, grid: u32) -> LaunchConfig {
        LaunchConfig {
            grid: grid.clamp(1, self.blocks.max(1)),
            grid_y: 1,
            block: self.block,
            shared_bytes: 0,
        }
    }
}

/// The most warps (a power of two, at most 32) in a block of at most `threads` threads.
fn max_warps(threads: u32) -> u32 {
    match threads / 32 {
        0 => 0,
        w => 1 << (31 - w.min(32).leading_zeros()),
    }
}

/// Whether the innermost outer dim has unit stride in every operand (neighbouring rows are
/// neighbouring elements).
fn adjacent_rows<const M: usize>(outer: &Folded<M>) -> bool {
    !outer.dims.is_empty() && outer.strides.iter().all(|s| s.last() == Some(&1))
}

/// The block limit of a family's kernel as [`RowPlan::new`] takes it: the kernel's own
/// limit on the GPU, 0 where the family has no such kernel.
pub(crate) fn block_limit<'a>(
    gpu: &'a Gpu,
    kernel: impl Fn(RowKernel) -> Option<&'static str> + 'a,
) -> impl Fn(RowKernel) -> Result<u32> + 'a {
    move |k| match kernel(k) {
        Some(name) => gpu.max_threads_per_block(name),
        None => Ok(0),
    }
}

/// The strides of a per-row operand (e.g. saved statistics of shape `x`'s outer dims with
/// 1s) over `outer_dims`: its dims, once extent-1 dims are dropped, must be the outer dims
/// without their extent-1 dims.
pub(crate) fn per_row_strides(
    arg: &'static str,
    outer_dims: &[usize],
    dims: &[usize],
    strides: &[usize],
) -> Result<Vec<usize>> {
    let mut theirs = dims.iter().zip(strides).filter(|(&n, _)| n > 1);
    let mut out = Vec::with_capacity(outer_dims.len());
    for &n in outer_dims {
        if n == 1 {
            out.push(0);
            continue;
        }
        match theirs.next() {
            Some((&m, &s)) if m == n => out.push(s),
            _ => {
                return Err(Error::bad(
                    arg,
                    format!(
                    "dims {dims:?} do not hold one value per row of the row dims {outer_dims:?}"
                ),
                ))
            }
        }
    }
    if theirs.next().is_some() {
        return Err(Error::bad(
            arg,
            format!("dims {dims:?} do not hold one value per row of the row dims {outer_dims:?}"),
        ));
    }
    Ok(out)
}

/// The device map of a per-element operand alone (e.g. the weights a finalising kernel
/// writes), over the folded inner dims of `plan`.
pub(crate) fn operand_map<const N: usize>(inner: &IndexMap<N>, k: usize) -> Result<IndexMap<1>> {
    let rank = inner.rank as usize;
    let dims: Vec<usize> = (0..rank).map(|d| inner.dims[d].divisor as usize).collect();
    let strides = [(0..rank).map(|d| inner.strides[k][d] as usize).collect()];
    index_map(&dims, &strides)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(outer: &[usize], inner: &[usize]) -> Split<2, 2> {
        let packed = |dims: &[usize], inner_len: usize| -> Vec<usize> {
            let mut s = vec![0; dims.len()];
            let mut acc = inner_len;
            for i in (0..dims.len()).rev() {
                s[i] = acc;
                acc *= dims[i];
            }
            s
        };
        let d: usize = inner.iter().product();
        Split {
            outer_dims: outer.to_vec(),
            outer_strides: [packed(outer, d), packed(outer, d)],
            inner_dims: inner.to_vec(),
            inner_strides: [packed(inner, 1), packed(inner, 1)],
        }
    }

    /// Kernels that launch with any block.
    fn any_block(_: RowKernel) -> Result<u32> {
        Ok(1024)
    }

    const FWD: Budget = Budget {
        max_values: 32,
        packed: false,
        columns: false,
        groups_share_blocks: false,
    };

    #[test]
    fn transformer_rows_take_vectors_in_registers() {
        let p = RowPlan::new(&split(&[8192], &[1024]), [true, true], 4, FWD, &any_block).unwrap();
        assert_eq!(p.kernel, RowKernel::Vectors { slots: 8 });
        assert_eq!((p.warps, p.block, p.blocks), (1, 256, 1024));
        let p = RowPlan::new(&split(&[8192], &[4096]), [true, true], 4, FWD, &any_block).unwrap();
        assert_eq!(
            (p.kernel, p.warps, p.block, p.blocks),
            (RowKernel::Vectors { slots: 8 }, 4, 128, 8192)
        );
        let p = RowPlan::new(&split(&[8192], &[512]), [true, true], 2, FWD, &any_block).unwrap();
        assert_eq!((p.kernel, p.warps), (RowKernel::Vectors { slots: 2 }, 1));
    }

    /// A group of several warps is a block of its own unless the family's kernels meet
    /// at named barriers; groups of one warp always share blocks.
    #[test]
    fn groups_of_several_warps_share_blocks_only_at_named_barriers() {
        let own = Budget {
            max_values: 8,
            packed: true,
            ..FWD
        };
        let shared = Budget {
            groups_share_blocks: true,
            ..own
        };
        // (row length, budget) -> (warps per row, block, blocks) for 8192 f16 rows
        let cases = [
            (1024, own, (2, 64, 8192)),
            (1024, shared, (2, 256, 2048)),
            (128, own, (1, 256, 1024)),
            (128, shared, (1, 256, 1024)),
        ];
        for (len, budget, geometry) in cases {
            let s = split(&[8192], &[len]);
            let p = RowPlan::new(&s, [true, true], 2, budget, &any_block).unwrap();
            assert_eq!((p.warps, p.block, p.blocks), geometry, "{len}, {budget:?}");
        }
    }

    /// Held as loaded, a 16-bit row takes twice the values of an f32 one in the same
    /// registers: fewer warps per row. Elements loaded one by one take a register each.
    #[test]
    fn packed_sixteen_bit_rows_take_twice_the_values() {
        let packed = Budget {
            packed: true,
            ..FWD
        };
        // (rows, row length, element bytes, budget) -> (kernel, warps per row)
        let cases = [
            ([8192, 4096], 2, FWD, RowKernel::Vectors { slots: 4 }, 4),
            ([8192, 4096], 2, packed, RowKernel::Vectors { slots: 8 }, 2),
            ([8192, 4096], 4, packed, RowKernel::Vectors { slots: 8 }, 4),
            ([10, 4001], 2, packed, RowKernel::Mapped { slots: 4 }, 32),
        ];
        for ([rows, len], bytes, budget, kernel, warps) in cases {
            let s = split(&[rows], &[len]);
            let p = RowPlan::new(&s, [true, true], bytes, budget, &any_block).unwrap();
            assert_eq!(
                (p.kernel, p.warps),
                (kernel, warps),
                "{rows}x{len}, {bytes} bytes"
            );
        }
    }

    #[test]
    fn odd_rows_are_mapped_and_long_rows_streamed() {
        let p = RowPlan::new(&split(&[10], &[97]), [true, true], 4, FWD, &any_block).unwrap();
        assert_eq!((p.kernel, p.warps), (RowKernel::Mapped { slots: 4 }, 1));
        let p = RowPlan::new(&split(&[3], &[1 << 20]), [true, true], 4, FWD, &any_block).unwrap();
        assert_eq!(p.kernel, RowKernel::Streamed { vectors: true });
        assert_eq!((p.chunks, p.blocks), ((1 << 20) / (4 * 32 * 16 * 4), 3));
    }

    #[test]
    fn every_planned_slot_count_has_a_kernel_list_entry() {
        for bytes in [2usize, 4] {
            for (max_values, packed) in [(16usize, false), (32, false), (32, true)] {
                for d in (1..70_000).step_by(7) {
                    let b = Budget {
                        max_values,
                        packed,
                        columns: false,
                        groups_share_blocks: false,
                    };
                    let p = RowPlan::new(&split(&[2], &[d]), [true, true], bytes, b, &any_block)
                        .unwrap();
                    let k = 16 / bytes;
                    match p.kernel {
                        RowKernel::Vectors { slots } => {
                            assert!(slots as usize * k <= b.values(bytes, true));
                            assert!(32 * p.warps * slots * k as u32 >= d as u32);
                        }
                        RowKernel::Mapped { slots } => {
                            assert!(32 * p.warps * slots >= d as u32);
                        }
                        RowKernel::Streamed { .. } => assert!(p.chunks > 1),
                        RowKernel::Column => panic!("no columns asked for"),
                    }
                    // The kernels reduce a group of several warps at the block's barrier.
                    if p.warps > 1 {
                        assert_eq!(p.block, 32 * p.warps, "{d} elements of {bytes} bytes");
                    }
                }
            }
        }
    }

    /// A kernel with many registers per thread cannot launch 1024 threads: its rows take
    /// fewer slots (more of them fit a smaller block) or are streamed.
    #[test]
    fn register_heavy_kernels_get_smaller_groups() {
        let limit = |k: RowKernel| -> Result<u32> {
            Ok(match k {
                RowKernel::Vectors { slots: 8 } => 640,
                RowKernel::Mapped { .. } => 576,
                _ => 1024,
            })
        };
        // 5000 f32 vectors: 16 warps of 8 slots cover 4096, 32 warps of 4 cover 4096.
        let p = RowPlan::new(&split(&[2], &[20_000]), [true, true], 4, FWD, &limit).unwrap();
        assert_eq!(p.kernel, RowKernel::Streamed { vectors: true });
        // 4096 vectors: 16 warps of 8 slots.
        let p = RowPlan::new(&split(&[2], &[16_384]), [true, true], 4, FWD, &limit).unwrap();
        assert_eq!((p.kernel, p.warps), (RowKernel::Vectors { slots: 8 }, 16));
        // 2111 elements through the map: 16 warps of 4 cover 2048, so streamed.
        let p = RowPlan::new(&split(&[2], &[2111]), [true, true], 2, FWD, &limit).unwrap();
        assert_eq!(p.kernel, RowKernel::Streamed { vectors: false });
        assert_eq!(max_warps(1024), 32);
        assert_eq!(max_warps(640), 16);
        assert_eq!(max_warps(31), 0);
    }

    #[test]
    fn per_row_operands_match_the_row_dims() {
        assert_eq!(
            per_row_strides("s", &[4, 1, 3], &[4, 3, 1], &[3, 1, 1]).unwrap(),
            [3, 0, 1]
        );
        assert!(per_row_strides("s", &[4, 3], &[3, 4], &[4, 1]).is_err());
        assert!(per_row_strides("s", &[4], &[4, 2], &[2, 1]).is_err());
    }
}
