//! `conv_fwd_direct_<dtype>`: one thread per output element, summing over its group's
//! input channels and every filter tap in f32. Any strides, layouts, groups, dilations and
//! modes; the reference-like fallback every other algorithm is checked against.

use crate::device::grid_stride;
use crate::element::{Bf16, Element, F16};
use crate::epilogue;
use oxidnn_params::{ConvFwdParams, PoolCoord};

#[inline(always)]
unsafe fn direct<T: Element>(
    p: &ConvFwdParams,
    x: *const T,
    w: *const T,
    y: *mut T,
    bias: *const T,
    z: *const T,
) {
    let g = &p.geo;
    grid_stride(p.items.len as u64, |item| {
        let item = item as u32;
        let PoolCoord { n, c: k, s: o } = p.items.at(item);
        let group = k / g.k_per_group;
        let xb = x.add((n * g.x[0] + group * g.c_per_group * g.x[1]) as usize);
        let wb = w.add((k * g.w[0]) as usize);
        let mut acc = 0f32;
        for f0 in 0..g.filter[0] {
            let Some(i0) = g.input_at(0, o[0], f0) else {
                continue;
            };
            let (x0, w0) = (i0 * g.x[2], g.filter_at(0, f0) * g.w[2]);
            for f1 in 0..g.filter[1] {
                let Some(i1) = g.input_at(1, o[1], f1) else {
                    continue;
                };
                let (x1, w1) = (x0 + i1 * g.x[3], w0 + g.filter_at(1, f1) * g.w[3]);
                for f2 in 0..g.filter[2] {
                    let Some(i2) = g.input_at(2, o[2], f2) else {
                        continue;
                    };
                    let xo = x1 + i2 * g.x[4];
                    let wo = w1 + g.filter_at(2, f2) * g.w[4];
                    for c in 0..g.c_per_group {
                        let xv = T::load(xb.add((xo + c * g.x[1]) as usize));
                        let wv = T::load(wb.add((wo + c * g.w[1]) as usize));
                        acc = crate::device::fma(xv, wv, acc);
                    }
                }
            }
        }
        let at = |s: &[u32; 5]| n * s[0] + k * s[1] + o[0] * s[2] + o[1] * s[3] + o[2] * s[4];
        let yp = y.add(at(&g.y) as usize);
        let v = epilogue::apply(
            &p.ops,
            [acc],
            T::LOW_PRECISION,
            || [T::load(yp)],
            |_| [T::load(bias.add(k as usize))],
            || [T::load(z.add(at(&g.z) as usize))],
        );
        T::store(yp, v[0]);
    });
}

macro_rules! direct_entry_points {
    ($dt:ident, $T:ty) => {
        paste::paste! {
            /// # Safety
            /// `x`, `w`, `y` (and `bias`, `z` where the epilogue reads them) cover the
            /// tensors `p` describes; y's offsets are distinct.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn [<conv_fwd_direct_ $dt>](
                p: ConvFwdParams, x: *const $T, w: *const $T, y: *mut $T, bias: *const $T,
                z: *const $T,
            ) {
                direct::<$T>(&p, x, w, y, bias, z)
            }
        }
    };
}

direct_entry_points!(f32, f32);
direct_entry_points!(f16, F16);
direct_entry_points!(bf16, Bf16);
