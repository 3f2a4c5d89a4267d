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

/// `s^-beta` for `s > 0` (relative error about 2^-21). `s` is normal: `s >= k >= 1e-5`
/// unless a negative alpha cancels `k`, and only a cancellation to below 2^-126 meets
/// the flush (the result is then inf where it would be at least 2^(126 beta)).
#[inline(always)]
fn pow_neg(s: f32, beta: f32) -> f32 {
    device::exp2_approx(-beta * device::log2_approx_ftz(s))
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

/// A walk's cursor over one operand: the address of channel `m`, moved a channel a step.
/// Addresses outside the operand are formed (wrapping) but only read where `m` is in
/// `[0, hi)`.
#[derive(Clone, Copy)]
struct Cursor<T> {
    at: *const T,
    stride: usize,
    m: i32,
    hi: i32,
}

impl<T: Element> Cursor<T> {
    /// At channel `m` of the channel run starting at `base`.
    #[inline(always)]
    fn new(base: *const T, stride: usize, m: i32, hi: i32) -> Self {
        let at = base.wrapping_offset(m as isize * stride as isize);
        Self { at, stride, m, hi }
    }

    /// Channel `m`'s value (0 outside `[0, hi)`), then a step.
    #[inline(always)]
    unsafe fn next(&mut self) -> f32 {
        // One unsigned compare: a negative m wraps past hi.
        let v = if (self.m as u32) < self.hi as u32 {
            T::load(self.at)
        } else {
            0.0
        };
        self.at = self.at.wrapping_add(self.stride);
        self.m += 1;
        v
    }

    /// The next `U` channels' values, loaded together (with no per-channel test where
    /// all of them are in `[0, hi)`).
    #[inline(always)]
    unsafe fn next_group(&mut self) -> [f32; U] {
        let mut out = [0.0f32; U];
        if self.m >= 0 && self.m + U as i32 <= self.hi {
            crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                out[u] = T::load(self.at.wrapping_add(u * self.stride));
            });
            self.at = self.at.wrapping_add(U * self.stride);
            self.m += U as i32;
        } else {
            crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                out[u] = self.next();
            });
        }
        out
    }
}

/// The window of `N` channels a fixed-width walk slides: squares and inputs of its last
/// `N` channels, as register queues (once unrolled, entering a channel renames registers).
struct Window<const N: usize> {
    squares: [f32; N],
    xs: [f32; N],
}

impl<const N: usize> Window<N> {
    /// Channels before the centre (`lb`) and after it (`la`).
    const BEHIND: usize = (N - 1) / 2;
    const AHEAD: usize = N - 1 - Self::BEHIND;

    #[inline(always)]
    fn new() -> Self {
        Self {
            squares: [0.0; N],
            xs: [0.0; N],
        }
    }

    #[inline(always)]
    fn enter(&mut self, x: f32) {
        self.squares = shift_in(self.squares, x * x);
        self.xs = shift_in(self.xs, x);
    }

    /// `s = k + alpha / n * sum x^2` of the centre channel (taken afresh in f32: no
    /// running sum, so nothing drifts).
    #[inline(always)]
    fn scale(&self, p: &LrnParams) -> f32 {
        let mut sum = 0.0;
        crate::unrolled!(i in N => sum += self.squares[i]);
        device::fma(p.alpha_over_n, sum, p.k)
    }

    /// x of the centre channel.
    #[inline(always)]
    fn centre(&self) -> f32 {
        self.xs[Self::BEHIND]
    }
}

/// `q` moved one place towards index 0, `v` entering at the end.
#[inline(always)]
fn shift_in<const N: usize>(q: [f32; N], v: f32) -> [f32; N] {
    core::array::from_fn(|i| if i + 1 < N { q[i + 1] } else { v })
}

/// The backward's window: x's [`Window`] up to channel m, and `a = dy s^-beta` and
/// `t = a x / s` of the channels `c - N + 1 ..= c` (c = m - la), the `t` terms of the
/// gradient of channel j = c - lb.
struct GradWindow<const N: usize> {
    x: Window<N>,
    a: [f32; N],
    t: [f32; N],
}

impl<const N: usize> GradWindow<N> {
    #[inline(always)]
    fn new() -> Self {
        Self {
            x: Window::new(),
            a: [0.0; N],
            t: [0.0; N],
        }
    }

    /// x of channel m and dy of channel c = m - la enter.
    #[inline(always)]
    fn enter(&mut self, p: &LrnParams, x: f32, dy: f32) {
        self.x.enter(x);
        let s = self.x.scale(p);
        let a = dy * pow_neg(s, p.beta);
        self.a = shift_in(self.a, a);
        self.t = shift_in(self.t, a * self.x.centre() * device::rcp_approx(s));
    }

    /// `dx_j = a_j - coef x_j sum_{c = j - la}^{j + lb} t_c`.
    #[inline(always)]
    fn gradient(&self, p: &LrnParams) -> f32 {
        let mut tsum = 0.0;
        crate::unrolled!(i in N => tsum += self.t[i]);
        self.a[Window::<N>::AHEAD] - p.grad_coef * self.x.xs[0] * tsum
    }
}

/// `alpha * v`, plus `beta * out` where `BLEND` (the fixed-width walks compile their loop
/// once for `beta = 0`, where the output is write-only, and once for blending).
#[inline(always)]
unsafe fn blended<T: Element, const BLEND: bool>(p: &LrnParams, v: f32, out: *mut T) -> f32 {
    if BLEND {
        p.blend_alpha * v + p.blend_beta * T::load(out)
    } else {
        p.blend_alpha * v
    }
}

/// Writes `U` consecutive channels' outputs, `make()` called once per channel (in order)
/// and its value stored at `out`, which moves a channel each time; where not `FULL`, only
/// the first `left` are stored (every channel is still made: the windows move on).
#[inline(always)]
unsafe fn write_group<T: Element, const BLEND: bool, const FULL: bool>(
    p: &LrnParams,
    out: &mut *mut T,
    stride: usize,
    left: i32,
    mut make: impl FnMut(usize) -> Option<f32>,
) {
    crate::unroll!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
        if FULL || (u as i32) < left {
            if let Some(v) = make(u) {
                T::store(*out, blended::<T, BLEND>(p, v, *out));
            }
        } else {
            make(u);
        }
        *out = out.wrapping_add(stride);
    });
}

/// The walk with the window width `N` compiled in (`lrn_fwd_walk_n<N>_*`): no rings and
/// no f64, the window in registers ([`Window`]); loads run a group of `U` channels ahead.
/// Channels outside the tensor enter as 0, which clips the window.
#[inline(always)]
unsafe fn fwd_walk_n<T: Element, const N: usize>(p: &LrnParams, x: *const T, y: *mut T) {
    if p.blend_beta == 0.0 {
        fwd_walk_n_blend::<T, N, false>(p, x, y)
    } else {
        fwd_walk_n_blend::<T, N, true>(p, x, y)
    }
}

#[inline(always)]
unsafe fn fwd_walk_n_blend<T: Element, const N: usize, const BLEND: bool>(
    p: &LrnParams,
    x: *const T,
    y: *mut T,
) {
    let Some(w) = walk_place(p) else { return };
    let (lb, la) = (Window::<N>::BEHIND as i32, Window::<N>::AHEAD as i32);
    let hi = (w.c1 + la).min(p.channels as i32);
    let mut xc = Cursor::new(
        x.add(w.offs[0] as usize),
        p.channel_strides[0] as usize,
        w.c0 - lb,
        hi,
    );
    let sy = p.channel_strides[1] as usize;
    let mut out = y.add(w.offs[1] as usize + w.c0 as usize * sy);
    // Channels c0 - lb .. c0 + la - 1, then one channel entering per output.
    let mut win = Window::<N>::new();
    crate::unrolled!(_i in N - 1 => win.enter(xc.next()));
    let mut c = w.c0;
    let mut cur = xc.next_group();
    while c < w.c1 {
        let next = xc.next_group();
        let make = |u: usize| {
            win.enter(cur[u]);
            Some(win.centre() * pow_neg(win.scale(p), p.beta))
        };
        let left = w.c1 - c;
        if left >= U as i32 {
            write_group::<T, BLEND, true>(p, &mut out, sy, left, make);
        } else {
            write_group::<T, BLEND, false>(p, &mut out, sy, left, make);
        }
        cur = next;
        c += U as i32;
    }
}

/// The backward walk with `N` compiled in (`lrn_bwd_walk_n<N>_*`), windows as in
/// [`fwd_walk_n`] ([`GradWindow`]).
#[inline(always)]
unsafe fn bwd_walk_n<T: Element, const N: usize>(
    p: &LrnParams,
    x: *const T,
    dy: *const T,
    dx: *mut T,
) {
    if p.blend_beta == 0.0 {
        bwd_walk_n_blend::<T, N, false>(p, x, dy, dx)
    } else {
        bwd_walk_n_blend::<T, N, true>(p, x, dy, dx)
    }
}

#[inline(always)]
unsafe fn bwd_walk_n_blend<T: Element, const N: usize, const BLEND: bool>(
    p: &LrnParams,
    x: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let Some(w) = walk_place(p) else { return };
    let (lb, la) = (Window::<N>::BEHIND as i32, Window::<N>::AHEAD as i32);
    let channels = p.channels as i32;
    let first = w.c0 - (N as i32 - 1);
    // x up to the last window's end; dy (and so t) up to the last gradient's last term.
    let x_hi = (w.c1 + N as i32 - 1).min(channels);
    let dy_hi = (w.c1 + lb).min(channels);
    let mut xc = Cursor::new(
        x.add(w.offs[0] as usize),
        p.channel_strides[0] as usize,
        first,
        x_hi,
    );
    let mut dyc = Cursor::new(
        dy.add(w.offs[1] as usize),
        p.channel_strides[1] as usize,
        first - la,
        dy_hi,
    );
    let sdx = p.channel_strides[2] as usize;
    let mut out = dx.add(w.offs[2] as usize + w.c0 as usize * sdx);
    let mut win = GradWindow::<N>::new();
    // Up to channel m = c0 + N - 2 (the last before dx_c0 can be made).
    crate::unrolled!(_i in 2 * (N - 1) => win.enter(p, xc.next(), dyc.next()));
    // Unlike the forward, no group's loads wait in registers behind the previous group's
    // work: that took 116 registers (two blocks per SM); at 80 three blocks fit, and their
    // loads overlap one another's work.
    let mut j = w.c0;
    while j < w.c1 {
        let cur = (xc.next_group(), dyc.next_group());
        let make = |u: usize| {
            win.enter(p, cur.0[u], cur.1[u]);
            Some(win.gradient(p))
        };
        let left = w.c1 - j;
        if left >= U as i32 {
            write_group::<T, BLEND, true>(p, &mut out, sdx, left, make);
        } else {
            write_group::<T, BLEND, false>(p, &mut out, sdx, left, make);
        }
        j += U as i32;
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

/// A lane's run of `E` channels `c0 .. c0 + E` of one pixel with `B` channels before it
/// and `A` after (0 outside the tensor): the run loaded at once, the others one by one
/// (they are other lanes' channels, so they come from L1).
struct Run<const E: usize, const B: usize, const A: usize> {
    before: [f32; B],
    run: [f32; E],
    after: [f32; A],
}

impl<const E: usize, const B: usize, const A: usize> Run<E, B, A> {
    #[inline(always)]
    unsafe fn load<T: Element>(base: *const T, c0: u32, channels: u32, vector: bool) -> Self {
        let c0 = c0 as i32;
        let around = |c: i32| {
            if (c as u32) < channels {
                T::load(base.add(c as usize))
            } else {
                0.0
            }
        };
        Self {
            before: core::array::from_fn(|i| around(c0 - B as i32 + i as i32)),
            run: load_run::<T, E>(base.add(c0 as usize), channels - c0 as u32, vector, true),
            after: core::array::from_fn(|i| around(c0 + E as i32 + i as i32)),
        }
    }

    /// The value of channel `c0 + k`, `-B <= k < E + A` (a register once unrolled).
    #[inline(always)]
    fn at(&self, k: isize) -> f32 {
        if k < 0 {
            self.before[(B as isize + k) as usize]
        } else if (k as usize) < E {
            self.run[k as usize]
        } else {
            self.after[k as usize - E]
        }
    }
}

/// `s = k + alpha / n * sum x^2` over the window of channel `c0 + k` of a run whose `x`
/// has at least the window's `lb` channels before and `la` after it.
#[inline(always)]
fn run_scale<const N: usize, const E: usize, const B: usize, const A: usize>(
    p: &LrnParams,
    x: &Run<E, B, A>,
    k: isize,
) -> f32 {
    let mut sum = 0.0;
    crate::unrolled!(d in N => {
        let v = x.at(k + d as isize - Window::<N>::BEHIND as isize);
        sum += v * v;
    });
    device::fma(p.alpha_over_n, sum, p.k)
}

/// Channels-last with the width `N` compiled in (`lrn_fwd_channels_last_n<N>_*`): no shared
/// memory; each lane takes runs of `E` channels (16-byte vectors where `p.vectorized`) and
/// the `N - 1` channels around them, and sums each window afresh in f32.
#[inline(always)]
unsafe fn fwd_cl_n<
    T: Element,
    const N: usize,
    const E: usize,
    const B: usize,
    const BLEND: bool,
>(
    p: &LrnParams,
    x: *const T,
    y: *mut T,
) {
    let g = group_place::<E>(p);
    if !g.valid {
        return;
    }
    let (xb, yb) = (x.add(g.offs[0] as usize), y.add(g.offs[1] as usize));
    let (channels, vector) = (p.channels, p.vectorized != 0);
    let mut c0 = g.lane_c0;
    while c0 < channels {
        let avail = channels - c0;
        let xr = Run::<E, B, B>::load(xb, c0, channels, vector);
        let old = if BLEND {
            load_run::<T, E>(yb.add(c0 as usize), avail, vector, false)
        } else {
            [0.0; E]
        };
        let mut out = [0.0f32; E];
        crate::unrolled!(e in E => {
            let r = xr.run[e] * pow_neg(run_scale::<N, E, B, B>(p, &xr, e as isize), p.beta);
            out[e] = blend(p.blend_alpha, r, if BLEND { p.blend_beta } else { 0.0 }, || old[e]);
        });
        store_run::<T, E>(yb.add(c0 as usize), out, avail, vector);
        c0 += g.step;
    }
}

/// Channels whose `a` and `t` terms one run of the channels-last backward makes, at most.
const RUN_TERMS: usize = 16;

/// The backward of [`fwd_cl_n`] (`lrn_bwd_channels_last_n<N>_*`). For a run's gradients
/// `dx_j = a_j - coef x_j sum_{c = j - la}^{j + lb} t_c` it makes `a = dy s^-beta` and
/// `t = a x / s` of the run and of the `la` channels before it and `lb` after, whose scales
/// take x of `XB = N - 1` channels either side of the run; dy comes with `DB = max(lb, la)`
/// either side.
#[inline(always)]
unsafe fn bwd_cl_n<
    T: Element,
    const N: usize,
    const E: usize,
    const XB: usize,
    const DB: usize,
    const BLEND: bool,
>(
    p: &LrnParams,
    x: *const T,
    dy: *const T,
    dx: *mut T,
) {
    let g = group_place::<E>(p);
    if !g.valid {
        return;
    }
    let (xb, dyb, dxb) = (
        x.add(g.offs[0] as usize),
        dy.add(g.offs[1] as usize),
        dx.add(g.offs[2] as usize),
    );
    let (channels, vector) = (p.channels, p.vectorized != 0);
    let la = Window::<N>::AHEAD as isize;
    let mut c0 = g.lane_c0;
    while c0 < channels {
        let avail = channels - c0;
        let xr = Run::<E, XB, XB>::load(xb, c0, channels, vector);
        let dyr = Run::<E, DB, DB>::load(dyb, c0, channels, vector);
        let old = if BLEND {
            load_run::<T, E>(dxb.add(c0 as usize), avail, vector, false)
        } else {
            [0.0; E]
        };
        // a and t of channels c0 + k for k in [-la, E + lb): index k + la.
        const { assert!(E + N - 1 <= RUN_TERMS) };
        let mut a = [0.0f32; RUN_TERMS];
        let mut t = [0.0f32; RUN_TERMS];
        crate::unrolled!(i in E + N - 1 => {
            let k = i as isize - la;
            let s = run_scale::<N, E, XB, XB>(p, &xr, k);
            a[i] = dyr.at(k) * pow_neg(s, p.beta);
            t[i] = a[i] * xr.at(k) * device::rcp_approx(s);
        });
        let mut out = [0.0f32; E];
        crate::unrolled!(e in E => {
            let mut tsum = 0.0;
            crate::unrolled!(d in N => tsum += t[e + d]);
            let gr = a[e + la as usize] - p.grad_coef * xr.run[e] * tsum;
            out[e] = blend(p.blend_alpha, gr, if BLEND { p.blend_beta } else { 0.0 }, || old[e]);
        });
        store_run::<T, E>(dxb.add(c0 as usize), out, avail, vector);
        c0 += g.step;
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
            /// As `lrn_fwd_walk_*`, with no dynamic shared memory; `n` = 5.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_fwd_walk_n5_ $dt>](p: LrnParams, x: *const $T, y: *mut $T) {
                fwd_walk_n::<$T, 5>(&p, x, y)
            }
            /// # Safety
            /// As `lrn_fwd_walk_n5_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_bwd_walk_n5_ $dt>](
                p: LrnParams, x: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                bwd_walk_n::<$T, 5>(&p, x, dy, dx)
            }
            /// # Safety
            /// The pointers cover every offset `p` describes, channels at unit stride; no
            /// dynamic shared memory; `n` = 5.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_fwd_channels_last_n5_ $dt>](
                p: LrnParams, x: *const $T, y: *mut $T,
            ) {
                match (packed_vector_elements(size_of::<$T>()), p.blend_beta == 0.0) {
                    (4, true) => fwd_cl_n::<$T, 5, 4, 2, false>(&p, x, y),
                    (4, false) => fwd_cl_n::<$T, 5, 4, 2, true>(&p, x, y),
                    (_, true) => fwd_cl_n::<$T, 5, 8, 2, false>(&p, x, y),
                    (_, false) => fwd_cl_n::<$T, 5, 8, 2, true>(&p, x, y),
                }
            }
            /// # Safety
            /// As `lrn_fwd_channels_last_n5_*`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<lrn_bwd_channels_last_n5_ $dt>](
                p: LrnParams, x: *const $T, dy: *const $T, dx: *mut $T,
            ) {
                match (packed_vector_elements(size_of::<$T>()), p.blend_beta == 0.0) {
                    (4, true) => bwd_cl_n::<$T, 5, 4, 4, 2, false>(&p, x, dy, dx),
                    (4, false) => bwd_cl_n::<$T, 5, 4, 4, 2, true>(&p, x, dy, dx),
                    (_, true) => bwd_cl_n::<$T, 5, 8, 4, 2, false>(&p, x, dy, dx),
                    (_, false) => bwd_cl_n::<$T, 5, 8, 4, 2, true>(&p, x, dy, dx),
                }
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
