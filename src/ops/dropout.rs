//! Dropout (cudnnDropoutForward / cudnnDropoutBackward) with a counter-based generator.
//!
//! ```
//! use oxidnn::*;
//! let (handle, _) = Handle::gpu_or_cpu();
//! let desc = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5)?;
//! let x = handle.upload_tensor(&HostTensor::from_fn(desc, |i| 1.0 + i[3] as f64))?;
//! let mut y = handle.alloc(&desc)?;
//! // The generator state lives in a buffer the caller owns (cudnnDropoutGetStatesSize).
//! let mut states = handle.alloc_bytes(dropout_states_size(&handle))?;
//! let dropout = DropoutDescriptor::new(&handle, 0.5, &mut states, 42)?;
//! // The mask, for backward (cudnnDropoutGetReserveSpaceSize).
//! let mut reserve = handle.alloc_bytes(dropout_reserve_space_size(&desc))?;
//! dropout_forward(&handle, &dropout, &mut states, &desc, &x, &desc, &mut y, &mut reserve)?;
//! let (xs, ys) = (handle.download_tensor(&desc, &x)?, handle.download_tensor(&desc, &y)?);
//! for (x, y) in xs.logical().iter().zip(ys.logical()) {
//!     assert!(y == 0.0 || y == 2.0 * x); // dropped, or kept and scaled by 1 / (1 - p)
//! }
//! // The next call draws a new mask; the whole sequence is fixed by the seed.
//! assert_eq!(dropout_generator_state(&handle, &states)?.calls, 1);
//! # Ok::<(), oxidnn::Error>(())
//! ```
//!
//! # Which elements drop
//!
//! Element `i`, counted in row-major order over the tensor's dims (its *logical* index:
//! strides, layout and the GPU's grid do not enter), of the `k`-th forward call since the
//! states buffer was seeded with `seed` is dropped when its random word is below
//! `floor(p * 2^32)`. The word of element `i = 8 g + e` is `high << 16 | low`, where
//! `high` is half `e % 2` (bits `16 (e % 2)..`) of word `e / 2` of
//! Philox4x32-10(counter `[g (low, high 32 bits), k (low, high)]`, key `[seed (low,
//! high)]`) and `low` the same half of the call whose counter has bit 31 of its second word
//! set. So the words are uniform over 32 bits and the keep probability is
//! `1 - floor(p 2^32) / 2^32`, one Philox call yields the high halves of 8 elements, which
//! decide all but 1 in 2^16 of them (the kernels draw the low halves only for a group
//! where one ties with the threshold's high half), and the same seed replays the same
//! sequence of masks on any device, the CPU handle included.
//!
//! # The states buffer
//!
//! [`dropout_states_size`] bytes (1152) holding the seed, the number `k` of forward calls
//! made so far and the GPU forward's work counters, 0 between calls (cuDNN's states hold
//! per-thread curand states instead; the role is the same). [`DropoutDescriptor::new`]
//! (cudnnSetDropoutDescriptor) seeds it and sets `k = 0`; every [`dropout_forward`] uses `k` and advances it by one on the stream (on the GPU the
//! kernel itself does, so calls stay asynchronous); [`DropoutDescriptor::restore`]
//! (cudnnRestoreDropoutDescriptor) attaches to a buffer seeded earlier without touching
//! it, so a copy of a states buffer replays the masks from where the copy was taken. A
//! descriptor holds its buffer's seed (`new` writes it, `restore` reads it back), and the
//! GPU kernels take the seed from the descriptor, as Philox round keys in their
//! parameters, and only `k` from the buffer: a buffer seeded with another seed is an
//! error on the CPU handle and unchecked on the GPU.
//!
//! # The reserve space
//!
//! One bit per element (bit `i % 32` of little-endian u32 word `i / 32`, 1 = kept):
//! [`dropout_reserve_space_size`] = `4 * ceil(elements / 32)` bytes. A bit costs 1/32 of an
//! f32 element's traffic (1/16 of an f16's) where a byte mask would add 25% (50%) to the
//! forward's writes and the backward's reads; the forward gathers each warp's bits into
//! whole words with shuffles, so the packing costs no extra memory traffic.
//!
//! # Probability
//!
//! `p` in `[0, 1]`: `p = 0` copies `x`; `p = 1` drops everything, `y = 0` (every
//! element's keep test fails, so no infinite scale is ever applied; cuDNN's documentation
//! gives no range, PyTorch's dropout gives zeros at `p = 1`). Dropped elements are exactly
//! 0 even where `x` is NaN or infinite.

use super::layout::index_map;
use super::{host_read, host_write};
use crate::buffer::Buffer;
use crate::descriptor::{check_output, check_same_dims, check_same_dtype, TensorDescriptor};
use crate::error::{Error, Result};
use crate::handle::{Backend, Handle};
use crate::kernels;
use crate::launch::{device_ptr, device_ptr_mut, LaunchConfig};
use crate::reference;
use oxidnn_params::{
    dropout_key, dropout_threshold, packed_elements_per_thread, DropoutBwdParams, DropoutFwdParams,
    DropoutState, IndexMap, BLOCK_THREADS, DROPOUT_STATES_BYTES, DROPOUT_STATE_MAGIC,
};

/// Bytes of the states buffer (cudnnDropoutGetStatesSize): the same on every device.
pub fn dropout_states_size(handle: &Handle) -> usize {
    let _ = handle;
    DROPOUT_STATES_BYTES
}

/// Bytes of the reserve space for a tensor like `x_desc` (cudnnDropoutGetReserveSpaceSize):
/// one bit per element, in whole 32-bit words.
pub fn dropout_reserve_space_size(x_desc: &TensorDescriptor) -> usize {
    4 * x_desc.element_count().div_ceil(32)
}

/// The drop probability, attached to a seeded states buffer (cuDNN's
/// `cudnnDropoutDescriptor_t`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutDescriptor {
    p: f64,
    seed: u64,
}

/// Where a states buffer's generator stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutGeneratorState {
    /// The seed it was seeded with.
    pub seed: u64,
    /// Forward calls made since: the next call is call number `calls`.
    pub calls: u64,
}

fn check_probability(p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::bad(
            "dropout",
            format!("the drop probability must be in [0, 1], got {p}"),
        ))
    }
}

fn check_states(handle: &Handle, states: &Buffer) -> Result<()> {
    handle.check_owner("states", states)?;
    states.check_len("states", DROPOUT_STATES_BYTES)
}

/// A states buffer holding `s`, its chunk counters 0.
fn encode_state(s: &DropoutState) -> [u8; DROPOUT_STATES_BYTES] {
    let mut b = [0u8; DROPOUT_STATES_BYTES];
    b[0..4].copy_from_slice(&s.magic.to_le_bytes());
    b[4..8].copy_from_slice(&s.blocks_done.to_le_bytes());
    b[8..16].copy_from_slice(&s.seed.to_le_bytes());
    b[16..24].copy_from_slice(&s.calls.to_le_bytes());
    b[24..32].copy_from_slice(&s._reserved.to_le_bytes());
    b
}

/// The seeded state in `states`, or a `BadParam` naming `states` if it was never seeded.
/// Waits for the handle's stream (the state is read back).
fn read_state(handle: &Handle, states: &Buffer) -> Result<DropoutState> {
    let b = handle.read_bytes(states)?;
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let s = DropoutState {
        magic: u32::from_le_bytes(b[0..4].try_into().unwrap_or([0; 4])),
        blocks_done: u32::from_le_bytes(b[4..8].try_into().unwrap_or([0; 4])),
        seed: word(8),
        calls: word(16),
        _reserved: word(24),
    };
    if s.magic != DROPOUT_STATE_MAGIC {
        return Err(Error::bad(
            "states",
            "the buffer holds no seeded generator: seed it with DropoutDescriptor::new",
        ));
    }
    Ok(s)
}

fn write_state(handle: &Handle, states: &mut Buffer, s: &DropoutState) -> Result<()> {
    handle.write_bytes(states, &encode_state(s))
}

impl DropoutDescriptor {
    /// Drop probability `p` (in `[0, 1]`), and a generator seeded with `seed` in `states`
    /// (at least [`dropout_states_size`] bytes of this handle), its call count reset to 0
    /// (cudnnSetDropoutDescriptor).
    pub fn new(handle: &Handle, p: f64, states: &mut Buffer, seed: u64) -> Result<Self> {
        check_probability(p)?;
        check_states(handle, states)?;
        write_state(
            handle,
            states,
            &DropoutState {
                magic: DROPOUT_STATE_MAGIC,
                seed,
                ..DropoutState::default()
            },
        )?;
        Ok(Self { p, seed })
    }

    /// Drop probability `p` with the generator already in `states` (seeded by
    /// [`DropoutDescriptor::new`], possibly on a buffer this one was copied from), which
    /// continues where it stands (cudnnRestoreDropoutDescriptor; cuDNN's `seed` argument
    /// has no effect there, so there is none here). Reads the buffer back to check it.
    pub fn restore(handle: &Handle, p: f64, states: &Buffer) -> Result<Self> {
        check_probability(p)?;
        check_states(handle, states)?;
        let s = read_state(handle, states)?;
        Ok(Self { p, seed: s.seed })
    }

    /// The drop probability.
    pub fn probability(&self) -> f64 {
        self.p
    }

    /// The seed of the states buffer this descriptor was made with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The factor kept elements are multiplied by, as the kernels use it.
    fn scale32(&self) -> f32 {
        reference::dropout::scale(self.p) as f32
    }
}

/// Reads where the generator in `states` stands (waits for the handle's stream).
pub fn dropout_generator_state(handle: &Handle, states: &Buffer) -> Result<DropoutGeneratorState> {
    check_states(handle, states)?;
    let s = read_state(handle, states)?;
    Ok(DropoutGeneratorState {
        seed: s.seed,
        calls: s.calls,
    })
}

/// Whether element `i` (row-major over the dims) is at offset `i`.
fn is_row_major_dense(d: &TensorDescriptor) -> bool {
    let mut expect = 1;
    for (&n, &s) in d.dims().iter().zip(d.strides()).rev() {
        if n > 1 && s != expect {
            return false;
        }
        expect *= n;
    }
    true
}

/// The device map of the logical (row-major) order over `dims`, operands `strides`: unit
/// dims dropped, neighbouring dims merged where every operand allows, the order kept.
fn logical_map(dims: &[usize], strides: [&[usize]; 2]) -> Result<IndexMap<2>> {
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out_strides: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for d in 0..dims.len() {
        if dims[d] == 1 {
            continue;
        }
        let merges = !out_dims.is_empty()
            && (0..2).all(|k| out_strides[k].last() == Some(&(strides[k][d] * dims[d])));
        if merges {
            if let Some(last) = out_dims.last_mut() {
                *last *= dims[d];
            }
            for k in 0..2 {
                if let Some(s) = out_strides[k].last_mut() {
                    *s = strides[k][d];
                }
            }
        } else {
            out_dims.push(dims[d]);
            for k in 0..2 {
                out_strides[k].push(strides[k][d]);
            }
        }
    }
    index_map(&out_dims, &out_strides)
}

/// Blocks per SM of the backward kernels (about 40 registers: a full SM).
const BWD_BLOCKS_PER_SM: u32 = 2048 / BLOCK_THREADS;

/// A grid-stride grid of whole warps for `warps` warp-steps, at most `blocks_per_sm`
/// blocks per SM.
fn warp_grid(warps: u64, sm_count: u32, blocks_per_sm: u32) -> Result<LaunchConfig> {
    let mut cfg = LaunchConfig::for_threads(warps * 32, BLOCK_THREADS)?;
    cfg.grid = cfg.grid.min(sm_count.max(1) * blocks_per_sm);
    Ok(cfg)
}

/// Warp-steps of the packed kernels: each covers `PACKED_VECTORS_PER_THREAD` 16-byte
/// vectors per lane.
fn packed_warps(len: u64, element_bytes: usize) -> u64 {
    len.div_ceil(32 * packed_elements_per_thread(element_bytes) as u64)
}

/// `y = x * mask / (1 - p)` with a fresh mask from the generator in `states` (which
/// advances by one call), the mask kept in `reserve_space` for [`dropout_backward`]
/// (cudnnDropoutForward). `x` and `y`: same dims and dtype, any strides. `states` must
/// hold the generator `dropout` was made with (seeded by [`DropoutDescriptor::new`] with
/// its seed, or the buffer [`DropoutDescriptor::restore`] read it from: the seed comes
/// from the descriptor, the call number from the buffer; the CPU handle checks, the GPU
/// handle does not read the buffer back), `reserve_space` at least
/// [`dropout_reserve_space_size`] bytes.
#[allow(clippy::too_many_arguments)]
pub fn dropout_forward(
    handle: &Handle,
    dropout: &DropoutDescriptor,
    states: &mut Buffer,
    x_desc: &TensorDescriptor,
    x: &Buffer,
    y_desc: &TensorDescriptor,
    y: &mut Buffer,
    reserve_space: &mut Buffer,
) -> Result<()> {
    check_same_dims("y_desc", x_desc, y_desc)?;
    check_same_dtype("y_desc", x_desc, y_desc)?;
    check_output("y_desc", y_desc)?;
    handle.check_tensor("x", x_desc, x)?;
    handle.check_tensor("y", y_desc, y)?;
    check_states(handle, states)?;
    handle.check_owner("reserve_space", reserve_space)?;
    reserve_space.check_len("reserve_space", dropout_reserve_space_size(x_desc))?;
    match &handle.backend {
        Backend::Cpu => {
            let mut state = read_state(handle, states)?;
            if state.seed != dropout.seed {
                return Err(Error::bad(
                    "states",
                    format!(
                        "the buffer holds the generator of seed {}, the descriptor's seed is {} \
                         (attach a descriptor to it with DropoutDescriptor::restore)",
                        state.seed, dropout.seed
                    ),
                ));
            }
            let xt = host_read(x_desc, x)?;
            let mut yt = host_read(y_desc, y)?;
            let mask =
                reference::dropout::forward(dropout.p, state.seed, state.calls, &xt, &mut yt);
            host_write(&yt, y)?;
            handle.write(reserve_space, &mask)?;
            state.calls = state.calls.wrapping_add(1);
            write_state(handle, states, &state)
        }
        Backend::Gpu(gpu) => {
            let dtype = x_desc.dtype();
            let len = x_desc.element_count() as u64;
            let unsupported =
                || Error::unsupported(format!("dropout on {dtype} tensors on the GPU"));
            let packed = is_row_major_dense(x_desc) && is_row_major_dense(y_desc);
            let (kernel, map, warps) = if packed {
                let kernel = kernels::dropout_fwd_packed(dtype).ok_or_else(unsupported)?;
                (
                    kernel,
                    IndexMap::default(),
                    packed_warps(len, dtype.size_bytes()),
                )
            } else {
                let kernel = kernels::dropout_fwd_strided(dtype).ok_or_else(unsupported)?;
                let map = logical_map(x_desc.dims(), [x_desc.strides(), y_desc.strides()])?;
                (kernel, map, len.div_ceil(4 * 32))
            };
            let p = DropoutFwdParams {
                threshold: dropout_threshold(dropout.p),
                scale: dropout.scale32(),
                _pad: 0,
                len,
                map,
                keys: dropout_key(dropout.seed),
            };
            let ptrs = [
                device_ptr_mut(gpu, states)?,
                device_ptr(gpu, x)?,
                device_ptr_mut(gpu, y)?,
                device_ptr_mut(gpu, reserve_space)?,
            ];
            // One resident wave, as many blocks per SM as the kernel's registers allow (4 for
            // the packed kernel, which `build.rs` holds at 64 registers): every warp loops over
            // many chunks, drawing one chunk's randoms while its loads are in flight (the
            // packed kernel's warps take their chunks after the first from counters in the
            // states buffer), and the kernel counts finished blocks with one atomic each.
            let blocks_per_sm = gpu.resident_blocks(kernel, BLOCK_THREADS, 0)?;
            // SAFETY: states holds a DropoutState and the chunk counters (length checked),
            // and the blocks have BLOCK_THREADS threads, so a warp's counter is one of them;
            // x and y hold their descriptors' spans and the packed kernel runs only when both
            // are row-major dense (offset i = element i < len), the strided map only produces
            // offsets inside the spans; the reserve holds ceil(len / 32) words (checked).
            unsafe {
                gpu.launch(
                    kernel,
                    warp_grid(warps, gpu.sm_count, blocks_per_sm)?,
                    &p,
                    &ptrs,
                )
            }
        }
    }
}

/// `dx = dy * mask / (1 - p)` with the mask a [`dropout_forward`] call left in
/// `reserve_space` (cudnnDropoutBackward; `dropout` must have the forward's probability).
/// `dy` and `dx`: the forward's dims and dtype, any strides.
#[allow(clippy::too_many_arguments)]
pub fn dropout_backward(
    handle: &Handle,
    dropout: &DropoutDescriptor,
    dy_desc: &TensorDescriptor,
    dy: &Buffer,
    dx_desc: &TensorDescriptor,
    dx: &mut Buffer,
    reserve_space: &Buffer,
) -> Result<()> {
    check_same_dims("dx_desc", dy_desc, dx_desc)?;
    check_same_dtype("dx_desc", dy_desc, dx_desc)?;
    check_output("dx_desc", dx_desc)?;
    handle.check_tensor("dy", dy_desc, dy)?;
    handle.check_tensor("dx", dx_desc, dx)?;
    handle.check_owner("reserve_space", reserve_space)?;
    reserve_space.check_len("reserve_space", dropout_reserve_space_size(dy_desc))?;
    match &handle.backend {
        Backend::Cpu => {
            let mask: Vec<u32> = handle.read(reserve_space)?;
            let dyt = host_read(dy_desc, dy)?;
            let mut dxt = host_read(dx_desc, dx)?;
            reference::dropout::backward(dropout.p, &mask, &dyt, &mut dxt);
            host_write(&dxt, dx)
        }
        Backend::Gpu(gpu) => {
            let dtype = dy_desc.dtype();
            let len = dy_desc.element_count() as u64;
            let unsupported =
                || Error::unsupported(format!("dropout backward on {dtype} tensors on the GPU"));
            let packed = is_row_major_dense(dy_desc) && is_row_major_dense(dx_desc);
            let p = DropoutBwdParams {
                scale: dropout.scale32(),
                _pad: 0,
                len,
                map: if packed {
                    IndexMap::default()
                } else {
                    logical_map(dy_desc.dims(), [dy_desc.strides(), dx_desc.strides()])?
                },
            };
            let (kernel, cfg) = if packed {
                let warps = packed_warps(len, dtype.size_bytes());
                let kernel = kernels::dropout_bwd_packed(dtype).ok_or_else(unsupported)?;
                (kernel, warp_grid(warps, gpu.sm_count, BWD_BLOCKS_PER_SM)?)
            } else {
                let kernel = kernels::dropout_bwd_strided(dtype).ok_or_else(unsupported)?;
                (kernel, super::grid_stride_config(len, gpu.sm_count)?)
            };
            let ptrs = [
                device_ptr(gpu, dy)?,
                device_ptr_mut(gpu, dx)?,
                device_ptr(gpu, reserve_space)?,
            ];
            // SAFETY: as in dropout_forward: dy and dx hold their spans (packed only when
            // row-major dense), the reserve ceil(len / 32) words.
            unsafe { gpu.launch(kernel, cfg, &p, &ptrs) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;

    #[test]
    fn row_major_dense_ignores_unit_dims() {
        let d = TensorDescriptor::new(DataType::F32, &[2, 1, 3], &[3, 7, 1]).unwrap();
        assert!(is_row_major_dense(&d));
        let nhwc = TensorDescriptor::nhwc(DataType::F32, 2, 3, 4, 5).unwrap();
        assert!(!is_row_major_dense(&nhwc));
    }

    #[test]
    fn the_logical_map_keeps_row_major_order() {
        // NHWC x, NCHW y: element i of the map is logical element i in both.
        let x = TensorDescriptor::nhwc(DataType::F32, 2, 3, 4, 5).unwrap();
        let y = TensorDescriptor::nchw(DataType::F32, 2, 3, 4, 5).unwrap();
        let map = logical_map(x.dims(), [x.strides(), y.strides()]).unwrap();
        let mut i = 0u32;
        crate::host_tensor::for_each_index(x.dims(), |idx| {
            let want = [x.offset_of(idx) as u64, y.offset_of(idx) as u64];
            assert_eq!(map.offsets(i), want, "{idx:?}");
            i += 1;
        });
    }
}
