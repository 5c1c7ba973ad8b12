//! Convolutions (`torch.nn.functional`: `conv1d`, `conv2d`), NCHW as PyTorch, composed from movement ops and a
//! GEMM so that autograd, every device and the GEMM tuner serve them unchanged. Poolings are in `pool.rs`.
//!
//! A convolution is lowered to a GEMM over patches (im2col): the padded input's sliding windows (`unfold` along
//! the height, then the width, with the stride and dilation: views, so the index stays affine) are viewed as
//! `[N, G, C / G * KH * KW, OH * OW]`, and the weight, viewed as `[G, O / G, C / G * KH * KW]`, multiplies each
//! group's rows in one batched matmul. The patches are not copied where the backend reads a patched GEMM operand
//! (the CPU's generated GEMM packs them straight from the padded input through offset tables: schedule rule 2f);
//! elsewhere they are stored once in the GEMM's layout. The weight's gradient composes from the same views (its
//! GEMM reads the patches transposed); so does the input's at a stride past 1 (each window tap's gradient added
//! back), while at stride 1 it is a transposed convolution of the output's gradient, a GEMM over its patches like
//! the forward's (`Tensor::with_grad_fn`).

use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;

/// Stride, padding and dilation per spatial dim, and the channel groups, of a 2-D convolution (PyTorch's keyword
/// arguments; `Default` is theirs: 1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 }
    }
}

/// The output length of a window of `k` taps, `dilation` apart, slid by `stride` over `n` padded by `pad` on both
/// sides; `None` where not even one window fits.
pub(super) fn out_len(n: usize, k: usize, stride: usize, pad: usize, dilation: usize) -> Option<usize> {
    kiln_jit::shape::window_count(n + 2 * pad, k, stride, dilation)
}

/// 2-D convolution of `x` `[N, C, H, W]` (or unbatched `[C, H, W]`) with `weight` `[O, C / groups, KH, KW]` and an
/// optional `bias` `[O]` (PyTorch's `conv2d`, a cross-correlation): `[N, O, OH, OW]`.
#[track_caller]
pub fn conv2d(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, opts: &Conv2dOptions) -> Tensor {
    float_only("conv2d", x);
    if x.rank() == 3 {
        return conv2d(&x.unsqueeze(0), weight, bias, opts).squeeze(0);
    }
    if x.rank() != 4 || weight.rank() != 4 {
        fail!(
            "conv2d",
            "expects x [N, C, H, W] and weight [O, C / groups, KH, KW], got {:?} and {:?}",
            x.dims(),
            weight.dims()
        );
    }
    let (n, c, h, w) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (o, cg, kh, kw) = (weight.dims()[0], weight.dims()[1], weight.dims()[2], weight.dims()[3]);
    let g = opts.groups;
    if g == 0 || !c.is_multiple_of(g) || !o.is_multiple_of(g) || cg != c / g {
        fail!(
            "conv2d",
            "{c} input and {o} output channels in {g} groups need a weight [{o}, {}, KH, KW], got {:?}",
            c / g.max(1),
            weight.dims()
        );
    }
    if opts.stride.contains(&0) || opts.dilation.contains(&0) || kh == 0 || kw == 0 {
        fail!(
            "conv2d",
            "stride, dilation and the kernel must be at least 1 (stride {:?}, dilation {:?}, kernel {kh}x{kw})",
            opts.stride,
            opts.dilation
        );
    }
    if let Some(b) = bias
        && b.dims() != [o]
    {
        fail!("conv2d", "bias has shape {:?}, expected [{o}]", b.dims());
    }
    let (Some(oh), Some(ow)) = (
        out_len(h, kh, opts.stride[0], opts.padding[0], opts.dilation[0]),
        out_len(w, kw, opts.stride[1], opts.padding[1], opts.dilation[1]),
    ) else {
        fail!(
            "conv2d",
            "the kernel {kh}x{kw} (dilation {:?}) does not fit the padded input {h}x{w} (padding {:?})",
            opts.dilation,
            opts.padding
        );
    };
    let product = |x: &Tensor| {
        let xp = x.pad(&[(opts.padding[1], opts.padding[1]), (opts.padding[0], opts.padding[0])], 0.0);
        let (s, d) = (opts.stride, opts.dilation);
        // [N, C, OH, OW, KH, KW] -> [N, C, KH, KW, OH, OW] -> [N, G, C/G * KH*KW, OH*OW]: channel-major within a
        // group, as the weight's layout.
        let cols = xp.unfold_dilated(2, kh, s[0], d[0]).unfold_dilated(3, kw, s[1], d[1]);
        debug_assert_eq!(&cols.dims()[2..4], &[oh, ow]);
        let cols = cols.permute([0, 1, 4, 5, 2, 3]).reshape(vec![n, g, cg * kh * kw, oh * ow]);
        let wm = weight.reshape(vec![g, o / g, cg * kh * kw]);
        wm.matmul(&cols).reshape(vec![n, o, oh, ow])
    };
    let y = if opts.stride == [1, 1] && crate::autograd::is_grad_enabled() && x.is_requires_grad() {
        // At stride 1 the input's gradient is itself a convolution (of the output's gradient with the weight's
        // flipped taps, `conv_transpose2d`): one GEMM over patches, as the forward. Through the composition's
        // own rules it is the patches' gradient (`W^T dy`, the patches' size: 58 MB for 64 channels at 56 x 56,
        // batch 8) and a kernel adding the window's taps back. At a larger stride the transposed convolution
        // would read an input dilated with zeros (stride^2 the products), so the composition's rules stay.
        let transposed = super::ConvTranspose2dOptions {
            padding: opts.padding,
            dilation: opts.dilation,
            groups: g,
            ..Default::default()
        };
        // Links: the product (the weight's gradient flows through the composition), the input, and the weight
        // without its gradient (read by the input's).
        let input_grad: crate::autograd::GradFn =
            std::sync::Arc::new(move |dy: &Tensor, _: &Tensor, links: &[Tensor], i| match i {
                0 => Some(dy.clone()),
                1 => Some(super::conv_transpose2d(dy, &links[2], None, &transposed)),
                _ => None,
            });
        let y = product(&x.detach());
        y.with_grad_fn(smallvec::smallvec![y.clone(), x.clone(), weight.detach()], input_grad)
    } else {
        product(x)
    };
    match bias {
        Some(b) => y.add(b.reshape(vec![o, 1, 1])),
        None => y,
    }
}

/// 1-D convolution of `x` `[N, C, L]` (or `[C, L]`) with `weight` `[O, C / groups, K]` (PyTorch's `conv1d`): a
/// `conv2d` over a height of 1.
#[track_caller]
pub fn conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    dilation: usize,
    groups: usize,
) -> Tensor {
    if weight.rank() != 3 || !(2..=3).contains(&x.rank()) {
        fail!(
            "conv1d",
            "expects x [N, C, L] and weight [O, C / groups, K], got {:?} and {:?}",
            x.dims(),
            weight.dims()
        );
    }
    let opts = Conv2dOptions { stride: [1, stride], padding: [0, padding], dilation: [1, dilation], groups };
    let h = x.rank() - 1;
    conv2d(&x.unsqueeze(h as isize), &weight.unsqueeze(2), bias, &opts).squeeze(h as isize)
}
