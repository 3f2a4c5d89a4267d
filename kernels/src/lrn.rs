//! Cross-channel LRN forward and backward (cudnnLRNCrossChannelForward/Backward, mode
//! CUDNN_LRN_CROSS_CHANNEL_DIM1); the window and formula are in `oxidnn_params::lrn`.
//!
//! Backward, with `p_c = s_c^-beta` and `t_c = dy_c x_c p_c / s_c`:
//! `dx_j = dy_j p_j - (2 alpha beta / n) x_j sum_{c = j - la}^{j + lb} t_c`
//! (the channels `c` whose window holds `j`). y is recomputed from x, not read.
//!
//! `lrn_{fwd,bwd}_walk_<dtype>` (any strides; NCHW: consecutive threads on consecutive
//! pixels): each thread walks a segment of its pixel's channels with running sums in f64
//! (each square is exact in f64, so adding a channel and later removing it cancels
//! exactly: no drift over long channel runs), 8 channels' loads in flight at a time, the
//! values it must revisit held in shared-memory rings.
//!
//! `lrn_{fwd,bwd}_channels_last_<dtype>` (unit channel stride): a group of lanes loads a
//! pixel's contiguous channels with 16-byte vectors, stages squares in shared memory, then
//! each lane slides the window over its own run of channels there.

use crate::activation::blend;
use crate::device::{
    self, block_dim_x, block_idx_x, dynamic_smem, global_thread_x, ld_shared_f32, ld_shared_f64,
    st_shared_f32, st_shared_f64, sync_threads_divergent, thread_idx_x,
};
use crate::element::Element;
use oxidnn_params::{lrn_slot, packed_vector_elements, LrnParams};

/// Channels whose loads a walk kernel issues together.
const U: usize = 8;

/// `s^-beta` for `s > 0` (relative error about 2^-21).
#[inline(always)]
fn pow_neg(s: f32, beta: f32) -> f32 {
    device::exp2_approx(-beta * device::log2_approx(s))
}

/// `k + alpha / n * sum`.
#[inline(always)]
fn scale(p: &LrnParams, sum: f64) -> f32 {
    p.k + p.alpha_over_n * sum as f32
}

/// A thread's place in a walk kernel: its operands' pointers at channel 0 of its pixel,
/// and its channels `[c0, c1)`.
struct Walk {
    offs: [u64; 3],
    c0: i32,
    c1: i32,
}

#[inline(always)]
fn walk_place(p: &LrnParams) -> Option<Walk> {
    let t = global_thread_x();
    if t >= p.threads as u64 {
        return None;
    }
    let (seg, pixel) = p.pixels_div.div_rem(t as u32);
    let c0 = seg as i32 * p.segment_len as i32;
    let c1 = (c0 + p.segment_len as i32).min(p.channels as i32);
    Some(Walk {
        offs: p.pixel_map.offsets(pixel),
        c0,
        c1,
    })
}

/// The shared-memory address of this thread's ring slot for channel `c` in the ring array
/// starting at `base`, of `bytes`-byte elements (slot-major: a warp's lanes are adjacent).
#[inline(always)]
fn ring_at(base: u32, ring: u32, c: i32, bytes: u32) -> u32 {
    base + ((c as u32 & (ring - 1)) * block_dim_x() + thread_idx_x()) * bytes
}

#[inline(always)]
unsafe fn fwd_walk<T: Element>(p: &LrnParams, x: *const T, y: *mut T) {
    let Some(w) = walk_place(p) else { return };
    let (xb, yb) = (x.add(w.offs[0] as usize), y.add(w.offs[1] as usize));
    let (sx, sy) = (p.channel_strides[0] as usize, p.channel_strides[1] as usize);
    let (lb, la, channels) = (p.look_behind as i32, p.look_ahead as i32, p.channels as i32);
    let sq_ring = dynamic_smem();
    let x_ring = sq_ring + p.ring * block_dim_x() * 8;
    // Channel m enters the window sum when it is read, channel c leaves it after output
    // c + lb; the output for channel c is made once channel c + la has entered.
    let mut sum = 0.0f64;
    let end = w.c1 + la;
    // The U channels from v; software-pipelined: the next group's loads are in flight
    // while this group is processed.
    let load = |v: i32| {
        let mut xs = [0.0f32; U];
        crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let m = v + u as i32;
            if m < end && m < channels {
                xs[u] = T::load(xb.add(m as usize * sx));
            }
        });
        xs
    };
    let mut v = (w.c0 - lb).max(0);
    let mut xs = load(v);
    while v < end {
        let next = load(v + U as i32);
        crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let m = v + u as i32;
            if m < end {
                if m < channels {
                    let q = xs[u] as f64 * xs[u] as f64;
                    sum += q;
                    st_shared_f64(ring_at(sq_ring, p.ring, m, 8), q);
                    st_shared_f32(ring_at(x_ring, p.ring, m, 4), xs[u]);
                }
                let c = m - la;
                if c >= w.c0 {
                    let xc = ld_shared_f32(ring_at(x_ring, p.ring, c, 4));
                    let r = xc * pow_neg(scale(p, sum), p.beta);
                    let out = yb.add(c as usize * sy);
                    T::store(out, blend(p.blend_alpha, r, p.blend_beta, || T::load(out)));
                    if c - lb >= 0 {
                        sum -= ld_shared_f64(ring_at(sq_ring, p.ring, c - lb, 8));
                    }
                }
            }
        });
        xs = next;
        v += U as i32;
    }
}

#[inline(always)]
unsafe fn bwd_walk<T: Element>(p: &LrnParams, x: *const T, dy: *const T, dx: *mut T) {
    let Some(w) = walk_place(p) else { return };
    let (xb, dyb, dxb) = (
        x.add(w.offs[0] as usize),
        dy.add(w.offs[1] as usize),
        dx.add(w.offs[2] as usize),
    );
    let (sx, sdy, sdx) = (
        p.channel_strides[0] as usize,
        p.channel_strides[1] as usize,
        p.channel_strides[2] as usize,
    );
    let (lb, la, channels) = (p.look_behind as i32, p.look_ahead as i32, p.channels as i32);
    let ring_f64 = p.ring * block_dim_x() * 8;
    let ring_f32 = p.ring * block_dim_x() * 4;
    let sq_ring = dynamic_smem();
    let t_ring = sq_ring + ring_f64;
    let x_ring = t_ring + ring_f64;
    let a_ring = x_ring + ring_f32;
    // Three fronts, `la` and `lb` channels apart: channel m is read (its square enters the
    // sums); channel c = m - la gets its scale, t_c (entering the t sums) and a_c = dy_c
    // p_c; channel j = c - lb gets its gradient, all of whose t terms are then in.
    let first_c = (w.c0 - la).max(0);
    let end = w.c1 + lb + la;
    let (mut sum, mut tsum) = (0.0f64, 0.0f64);
    // x of the U channels from v and dy of the U from v - la, software-pipelined as in
    // the forward.
    let load = |v: i32| {
        let mut xs = [0.0f32; U];
        let mut dys = [0.0f32; U];
        crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let m = v + u as i32;
            let c = m - la;
            if m < end && m < channels {
                xs[u] = T::load(xb.add(m as usize * sx));
            }
            if m < end && c >= first_c && c < channels {
                dys[u] = T::load(dyb.add(c as usize * sdy));
            }
        });
        (xs, dys)
    };
    let mut v = (first_c - lb).max(0);
    let (mut xs, mut dys) = load(v);
    while v < end {
        let next = load(v + U as i32);
        crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
            let m = v + u as i32;
            if m < end {
                if m < channels {
                    let q = xs[u] as f64 * xs[u] as f64;
                    sum += q;
                    st_shared_f64(ring_at(sq_ring, p.ring, m, 8), q);
                    st_shared_f32(ring_at(x_ring, p.ring, m, 4), xs[u]);
                }
                let c = m - la;
                if c >= first_c && c < channels {
                    let s = scale(p, sum);
                    let a = dys[u] * pow_neg(s, p.beta);
                    let t = a * ld_shared_f32(ring_at(x_ring, p.ring, c, 4)) * device::rcp_approx(s);
                    tsum += t as f64;
                    st_shared_f64(ring_at(t_ring, p.ring, c, 8), t as f64);
                    st_shared_f32(ring_at(a_ring, p.ring, c, 4), a);
                    if c - lb >= 0 {
                        sum -= ld_shared_f64(ring_at(sq_ring, p.ring, c - lb, 8));
                    }
                }
                let j = c - lb;
                if j >= w.c0 {
                    let xj = ld_shared_f32(ring_at(x_ring, p.ring, j, 4));
                    let aj = ld_shared_f32(ring_at(a_ring, p.ring, j, 4));
                    let g = aj - p.grad_coef * xj * tsum as f32;
                    let out = dxb.add(j as usize * sdx);
                    T::store(out, blend(p.blend_alpha, g, p.blend_beta, || T::load(out)));
                    if j - la >= first_c {
                        tsum -= ld_shared_f64(ring_at(t_ring, p.ring, j - la, 8));
                    }
                }
            }
        });
        (xs, dys) = next;
        v += U as i32;
    }
}

/// `E` consecutive channels from `p` (`avail` of them exist): one 16-byte load when
/// `vector`, else element by element. `read_only`: the kernel does not write them.
#[inline(always)]
unsafe fn load_run<T: Element, const E: usize>(
    p: *const T,
    avail: u32,
    vector: bool,
    read_only: bool,
) -> [f32; E] {
    if vector {
        T::unpack::<E>(T::load_raw::<E>(p, read_only))
    } else {
        let mut out = [0.0f32; E];
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            if e < E && (e as u32) < avail {
                out[e] = T::load(p.add(e));
            }
        });
        out
    }
}

#[inline(always)]
unsafe fn store_run<T: Element, const E: usize>(p: *mut T, v: [f32; E], avail: u32, vector: bool) {
    if vector {
        T::store_vec::<E>(p, v);
    } else {
        crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
            if e < E && (e as u32) < avail {
                T::store(p.add(e), v[e]);
            }
        });
    }
}

/// Window sums for channels `c0 .. c0 + E` (those below `channels`) of values `at(j)`,
/// the window of channel `c` being `[c - behind, c + ahead]` clipped to the channels: the
/// first summed in full, the rest by sliding (f64, a handful of steps).
#[inline(always)]
fn window_sums<const E: usize>(
    at: impl Fn(u32) -> f64,
    c0: u32,
    behind: u32,
    ahead: u32,
    channels: u32,
) -> [f64; E] {
    let mut out = [0.0f64; E];
    let mut s = 0.0f64;
    let mut j = c0.saturating_sub(behind);
    let last = (c0 + ahead).min(channels - 1);
    while j <= last {
        s += at(j);
        j += 1;
    }
    out[0] = s;
    crate::unroll!(e in [1, 2, 3, 4, 5, 6, 7] {
        let c = c0 + e as u32;
        if e < E && c < channels {
            if c + ahead < channels {
                s += at(c + ahead);
            }
            if c > behind {
                s -= at(c - 1 - behind);
            }
            out[e] = s;
        }
    });
    out
}

/// A thread's place in a channels-last kernel.
struct Group {
    /// This lane's first channel and the step to its next run.
    lane_c0: u32,
    step: u32,
    /// This pixel's index in the block, and whether it exists.
    local: u32,
    valid: bool,
    offs: [u64; 3],
}

#[inline(always)]
fn group_place<const E: usize>(p: &LrnParams) -> Group {
    let tid = thread_idx_x();
    let shift = p.group.trailing_zeros();
    let local = tid >> shift;
    let pixel = block_idx_x() * p.pixels_per_block + local;
    let valid = pixel < p.pixels;
    Group {
        lane_c0: (tid & (p.group - 1)) * E as u32,
        step: p.group * E as u32,
        local,
        valid,
        offs: if valid {
            p.pixel_map.offsets(pixel)
        } else {
            [0; 3]
        },
    }
}

#[inline(always)]
unsafe fn fwd_channels_last<T: Element>(p: &LrnParams, x: *const T, y: *mut T) {
    match packed_vector_elements(size_of::<T>()) {
        4 => fwd_cl::<T, 4>(p, x, y),
        _ => fwd_cl::<T, 8>(p, x, y),
    }
}

#[inline(always)]
unsafe fn fwd_cl<T: Element, const E: usize>(p: &LrnParams, x: *const T, y: *mut T) {
    let g = group_place::<E>(p);
    let (xb, yb) = (x.add(g.offs[0] as usize), y.add(g.offs[1] as usize));
    let (channels, vector) = (p.channels, p.vectorized != 0);
    let slots = p.pixel_slots;
    let sq = dynamic_smem() + g.local * slots * 8;
    let xv = dynamic_smem() + p.pixels_per_block * slots * 8 + g.local * slots * 4;
    let slot = |c: u32| lrn_slot(c, E as u32);
    if g.valid {
        let mut c0 = g.lane_c0;
        while c0 < channels {
            let xs = load_run::<T, E>(xb.add(c0 as usize), channels - c0, vector, true);
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let c = c0 + e as u32;
                if e < E && c < channels {
                    st_shared_f64(sq + slot(c) * 8, xs[e] as f64 * xs[e] as f64);
                    st_shared_f32(xv + slot(c) * 4, xs[e]);
                }
            });
            c0 += g.step;
        }
    }
    sync_threads_divergent();
    if g.valid {
        let mut c0 = g.lane_c0;
        while c0 < channels {
            let avail = channels - c0;
            let sums = window_sums::<E>(
                |j| ld_shared_f64(sq + slot(j) * 8),
                c0,
                p.look_behind,
                p.look_ahead,
                channels,
            );
            let old = if p.blend_beta != 0.0 {
                load_run::<T, E>(yb.add(c0 as usize), avail, vector, false)
            } else {
                [0.0; E]
            };
            let mut out = [0.0f32; E];
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let c = c0 + e as u32;
                if e < E && c < channels {
                    let r = ld_shared_f32(xv + slot(c) * 4) * pow_neg(scale(p, sums[e]), p.beta);
                    out[e] = blend(p.blend_alpha, r, p.blend_beta, || old[e]);
                }
            });
            store_run::<T, E>(yb.add(c0 as usize), out, avail, vector);
            c0 += g.step;
        }
    }
}

#[inline(always)]
unsafe fn bwd_channels_last<T: Element>(p: &LrnParams, x: *const T, dy: *const T, dx: *mut T) {
    match packed_vector_elements(size_of::<T>()) {
        4 => bwd_cl::<T, 4>(p, x, dy, dx),
        _ => bwd_cl::<T, 8>(p, x, dy, dx),
    }
}

#[inline(always)]
unsafe fn bwd_cl<T: Element, const E: usize>(p: &LrnParams, x: *const T, dy: *const T, dx: *mut T) {
    let g = group_place::<E>(p);
    let (xb, dyb, dxb) = (
        x.add(g.offs[0] as usize),
        dy.add(g.offs[1] as usize),
        dx.add(g.offs[2] as usize),
    );
    let (channels, vector) = (p.channels, p.vectorized != 0);
    let slots = p.pixel_slots;
    let f64_array = p.pixels_per_block * slots * 8;
    let f32_array = p.pixels_per_block * slots * 4;
    let sq = dynamic_smem() + g.local * slots * 8;
    let ts = dynamic_smem() + f64_array + g.local * slots * 8;
    let xv = dynamic_smem() + 2 * f64_array + g.local * slots * 4;
    // dy, then a = dy s^-beta in place.
    let av = dynamic_smem() + 2 * f64_array + f32_array + g.local * slots * 4;
    let slot = |c: u32| lrn_slot(c, E as u32);
    if g.valid {
        let mut c0 = g.lane_c0;
        while c0 < channels {
            let avail = channels - c0;
            let xs = load_run::<T, E>(xb.add(c0 as usize), avail, vector, true);
            let dys = load_run::<T, E>(dyb.add(c0 as usize), avail, vector, true);
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let c = c0 + e as u32;
                if e < E && c < channels {
                    st_shared_f64(sq + slot(c) * 8, xs[e] as f64 * xs[e] as f64);
                    st_shared_f32(xv + slot(c) * 4, xs[e]);
                    st_shared_f32(av + slot(c) * 4, dys[e]);
                }
            });
            c0 += g.step;
        }
    }
    sync_threads_divergent();
    if g.valid {
        let mut c0 = g.lane_c0;
        while c0 < channels {
            let sums = window_sums::<E>(
                |j| ld_shared_f64(sq + slot(j) * 8),
                c0,
                p.look_behind,
                p.look_ahead,
                channels,
            );
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let c = c0 + e as u32;
                if e < E && c < channels {
                    let s = scale(p, sums[e]);
                    let a = ld_shared_f32(av + slot(c) * 4) * pow_neg(s, p.beta);
                    let t = a * ld_shared_f32(xv + slot(c) * 4) * device::rcp_approx(s);
                    st_shared_f64(ts + slot(c) * 8, t as f64);
                    st_shared_f32(av + slot(c) * 4, a);
                }
            });
            c0 += g.step;
        }
    }
    sync_threads_divergent();
    if g.valid {
        let mut c0 = g.lane_c0;
        while c0 < channels {
            let avail = channels - c0;
            // The channels whose window holds j: [j - la, j + lb].
            let tsums = window_sums::<E>(
                |c| ld_shared_f64(ts + slot(c) * 8),
                c0,
                p.look_ahead,
                p.look_behind,
                channels,
            );
            let old = if p.blend_beta != 0.0 {
                load_run::<T, E>(dxb.add(c0 as usize), avail, vector, false)
            } else {
                [0.0; E]
            };
            let mut out = [0.0f32; E];
            crate::unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7] {
                let c = c0 + e as u32;
                if e < E && c < channels {
                    let xj = ld_shared_f32(xv + slot(c) * 4);
                    let r = ld_shared_f32(av + slot(c) * 4) - p.grad_coef * xj * tsums[e] as f32;
                    out[e] = blend(p.blend_alpha, r, p.blend_beta, || old[e]);
                }
            });
            store_run::<T, E>(dxb.add(c0 as usize), out, avail, vector);
            c0 += g.step;
        }
    }
}

macro_rules! lrn_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// The pointers cover every offset `p` describes; dynamic shared memory as
            /// the host sizes it for `p.ring` and the block size.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_fwd_walk_ $dt>](p: LrnParams, x: *const $T, y: *mut $T) {
                fwd_walk::<$T>(&p, x, y)
            }
            /// # Safety
            /// As `lrn_fwd_walk_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_bwd_walk_ $dt>](
                p: LrnParams, x: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_walk::<$T>(&p, x, dy, dx)
            }
            /// # Safety
            /// The pointers cover every offset `p` describes, channels at unit stride;
            /// dynamic shared memory for `p.pixels_per_block` pixels of `p.pixel_slots`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_fwd_channels_last_ $dt>](
                p: LrnParams, x: *const $T, y: *mut $T,
            ) {
                fwd_channels_last::<$T>(&p, x, y)
            }
            /// # Safety
            /// As `lrn_fwd_channels_last_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_bwd_channels_last_ $dt>](
                p: LrnParams, x: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_channels_last::<$T>(&p, x, dy, dx)
            }
        }
    };
}

crate::for_each_dtype!(lrn_entry_points);
