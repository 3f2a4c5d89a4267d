//! Reference convolution forward with its epilogue, in f64.

use crate::host_tensor::{for_each_index, HostTensor};
use crate::ops::activation::ActivationDescriptor;
use crate::ops::convolution::{ConvMode, ConvolutionDescriptor};

/// `y = act(alpha * conv(x, w) + beta * y + bias + scale * z)` for tensors of rank
/// `2 + spatial`: x `[n, c, ..]`, w `[k, c / groups, ..]` (as a tensor, any layout), y
/// `[n, k, ..]`; bias has one value per output channel (any dims whose product is k, in
/// channel order); y's old values are read only when `beta != 0`.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    conv: &ConvolutionDescriptor,
    alpha: f64,
    x: &HostTensor,
    w: &HostTensor,
    beta: f64,
    y: &mut HostTensor,
    bias: Option<&HostTensor>,
    residual: Option<(f64, &HostTensor)>,
    act: &ActivationDescriptor,
) {
    let s = conv.spatial_dims();
    let (xd, wd) = (x.desc.dims().to_vec(), w.desc.dims().to_vec());
    let yd = y.desc.dims().to_vec();
    let (cg, kg) = (wd[1], wd[0] / conv.groups());
    let bias: Option<Vec<f64>> = bias.map(|b| b.logical());
    let mut xi = vec![0usize; 2 + s];
    let mut wi = vec![0usize; 2 + s];
    for_each_index(&yd, |yi| {
        let (n, k) = (yi[0], yi[1]);
        let group = k / kg;
        let mut sum = 0.0;
        for_each_index(&wd[2..], |f| {
            for j in 0..s {
                let i = (yi[2 + j] * conv.stride()[j] + f[j] * conv.dilation()[j]) as isize
                    - conv.padding()[j] as isize;
                if i < 0 || i >= xd[2 + j] as isize {
                    return;
                }
                xi[2 + j] = i as usize;
                wi[2 + j] = match conv.mode() {
                    ConvMode::Convolution => wd[2 + j] - 1 - f[j],
                    ConvMode::CrossCorrelation => f[j],
                };
            }
            for c in 0..cg {
                xi[0] = n;
                xi[1] = group * cg + c;
                wi[0] = k;
                wi[1] = c;
                sum += x.get(&xi) * w.get(&wi);
            }
        });
        let mut v = alpha * sum;
        if beta != 0.0 {
            v += beta * y.get(yi);
        }
        if let Some(b) = &bias {
            v += b[k];
        }
        if let Some((scale, z)) = residual {
            v += scale * z.get(yi);
        }
        y.set(yi, super::activation::apply(act.mode(), act.coef(), v));
    });
}
