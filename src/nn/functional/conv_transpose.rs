//! `conv_transpose2d` (`torch.nn.functional.conv_transpose2d`, NCHW), the gradient of `conv2d` with respect to its
//! input, composed as that gradient is usually computed: the input dilated by the stride (`stride - 1` zeros
//! between elements), padded by `dilation * (k - 1) - padding` on each side (plus `output_padding` after; a
//! negative pad crops), then a stride-1 `conv2d` with the weight's kernel flipped and its in and out channels
//! swapped within each group. So it runs as the same GEMM over patches, on every device, with gradients.

use super::conv::{Conv2dOptions, conv2d};
use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;

/// PyTorch's keyword arguments of `conv_transpose2d` (`Default` is theirs: stride 1, padding 0, output padding
/// 0, dilation 1, groups 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    /// Extra rows and columns at the end of the output (each below the stride or the dilation).
    pub output_padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for ConvTranspose2dOptions {
    fn default() -> Self {
        ConvTranspose2dOptions { stride: [1, 1], padding: [0, 0], output_padding: [0, 0], dilation: [1, 1], groups: 1 }
    }
}

/// The transposed convolution of `x` (`[N, C_in, H, W]`, or unbatched `[C_in, H, W]`) by `weight` (`[C_in,
/// C_out / groups, kH, kW]`), plus `bias` (`[C_out]`): `[N, C_out, (H - 1) s - 2 p + d (kH - 1) + op + 1, ..]`.
#[track_caller]
pub fn conv_transpose2d(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, opts: &ConvTranspose2dOptions) -> Tensor {
    float_only("conv_transpose2d", x);
    if x.rank() == 3 {
        return conv_transpose2d(&x.unsqueeze(0), weight, bias, opts).squeeze(0);
    }
    let g = opts.groups;
    if x.rank() != 4
        || weight.rank() != 4
        || g == 0
        || weight.dims()[0] != x.dims()[1]
        || !x.dims()[1].is_multiple_of(g)
    {
        fail!(
            "conv_transpose2d",
            "expects x [N, C_in, H, W] and weight [C_in, C_out / groups, kH, kW] with C_in divisible by groups {g}, got \
             {:?} and {:?}",
            x.dims(),
            weight.dims()
        );
    }
    let [c_in, h, w] = [x.dims()[1], x.dims()[2], x.dims()[3]];
    let (o_g, kh, kw) = (weight.dims()[1], weight.dims()[2], weight.dims()[3]);
    let k = [kh, kw];
    for a in 0..2 {
        let (s, d, op) = (opts.stride[a], opts.dilation[a], opts.output_padding[a]);
        if s == 0 || d == 0 || (op >= s && op >= d) {
            fail!(
                "conv_transpose2d",
                "stride and dilation must be positive and output_padding below one of them: {opts:?}"
            );
        }
    }
    // Dilate: stride - 1 zeros after each element but the last, per spatial dim.
    let mut y = x.clone();
    for (a, len) in [(2usize, h), (3, w)] {
        let s = opts.stride[a - 2];
        if s > 1 && len > 0 {
            let mut dims = y.dims().to_vec();
            let widened = y.unsqueeze(a as isize + 1);
            let mut pads = vec![(0, 0); widened.rank()];
            pads[a + 1] = (0, s - 1);
            dims[a] = len * s;
            y = widened.pad(&pads.iter().rev().copied().collect::<Vec<_>>(), 0.0).reshape(dims).narrow(
                a as isize,
                0,
                (len - 1) * s + 1,
            );
        }
    }
    // Pad (or crop) by d (k - 1) - p before, and that plus output_padding after.
    for a in 0..2 {
        let full = (opts.dilation[a] * (k[a] - 1)) as isize;
        let before = full - opts.padding[a] as isize;
        let after = before + opts.output_padding[a] as isize;
        let dim = (a + 2) as isize;
        let len = y.dims()[a + 2] as isize;
        let start = (-before).max(0);
        let end = len - (-after).max(0);
        if end <= start {
            fail!("conv_transpose2d", "padding {:?} leaves no output for input {:?}", opts.padding, x.dims());
        }
        y = y.narrow(dim, start as usize, (end - start) as usize);
        let mut pads = [(0, 0); 4];
        pads[3 - (a + 2)] = (before.max(0) as usize, after.max(0) as usize);
        y = y.pad(&pads[..], 0.0);
    }
    // [C_in, O/g, kH, kW] -> [g, C_in/g, O/g, ..] -> [g, O/g, C_in/g, ..] -> [O, C_in/g, kH, kW], kernel flipped.
    let w =
        weight.reshape([g, c_in / g, o_g, kh, kw]).transpose(1, 2).reshape([g * o_g, c_in / g, kh, kw]).flip([2, 3]);
    let conv = Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: opts.dilation, groups: g };
    conv2d(&y, &w, bias, &conv)
}
