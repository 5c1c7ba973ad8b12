//! Convolutions and poolings (`torch.nn.functional`: `conv1d`, `conv2d`, `max_pool2d`, `avg_pool2d`,
//! `adaptive_avg_pool2d`), NCHW as PyTorch, composed from movement ops and a GEMM so that autograd, every device
//! and the GEMM tuner serve them unchanged.
//!
//! A convolution is lowered to a GEMM over patches (im2col): the padded input's sliding windows (`unfold` along
//! the height, then the width, with the stride and dilation: views, so the index stays affine) are viewed as
//! `[N, G, C / G * KH * KW, OH * OW]`, and the weight, viewed as `[G, O / G, C / G * KH * KW]`, multiplies each
//! group's rows in one batched matmul. The patches are not copied where the backend reads a patched GEMM operand
//! (the CPU's generated GEMM packs them straight from the padded input through offset tables: schedule rule 2f);
//! elsewhere they are stored once in the GEMM's layout. The weight's gradient composes from the same views (its
//! GEMM reads the patches transposed); so does the input's at a stride past 1 (each window tap's gradient added
//! back), while at stride 1 it is a transposed convolution of the output's gradient, a GEMM over its patches like
//! the forward's (`Tensor::with_grad_fn`). A pooling
//! stacks strided slices and reduces over them (max with -inf padding, mean with zeros), so its windows are exactly
//! PyTorch's.

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
fn out_len(n: usize, k: usize, stride: usize, pad: usize, dilation: usize) -> Option<usize> {
    kiln_jit::shape::window_count(n + 2 * pad, k, stride, dilation)
}

/// The `[N, C, OH, OW]` slices of `xp` (already padded) at each of the `kh x kw` window positions, stacked along a
/// new dim 2: `[N, C, KH * KW, OH, OW]`.
fn windows(xp: &Tensor, k: [usize; 2], stride: [usize; 2], dilation: [usize; 2], out: [usize; 2]) -> Tensor {
    let mut slices = Vec::with_capacity(k[0] * k[1]);
    for i in 0..k[0] {
        for j in 0..k[1] {
            let (h0, w0) = ((i * dilation[0]) as isize, (j * dilation[1]) as isize);
            let rows = xp.slice(2, h0, h0 + ((out[0] - 1) * stride[0]) as isize + 1, stride[0]);
            slices.push(rows.slice(3, w0, w0 + ((out[1] - 1) * stride[1]) as isize + 1, stride[1]));
        }
    }
    let refs: Vec<&Tensor> = slices.iter().collect();
    Tensor::stack(&refs, 2)
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

/// Window geometry of a 2-D pooling (PyTorch's keyword arguments; `stride: None` is the kernel size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    pub kernel: [usize; 2],
    pub stride: Option<[usize; 2]>,
    pub padding: [usize; 2],
}

impl Pool2dOptions {
    /// A `kh x kw` window, stride the kernel, no padding.
    pub fn new(kernel: [usize; 2]) -> Pool2dOptions {
        Pool2dOptions { kernel, stride: None, padding: [0, 0] }
    }
}

/// The stacked windows of a pooling, `[N, C, KH * KW, OH, OW]`, the input padded with `fill`.
#[track_caller]
fn pool_windows(name: &str, x: &Tensor, opts: &Pool2dOptions, fill: f64) -> Tensor {
    float_only(name, x);
    if x.rank() != 4 {
        fail!(name, "expects an input [N, C, H, W], got {:?}", x.dims());
    }
    let (k, s) = (opts.kernel, opts.stride.unwrap_or(opts.kernel));
    if k.contains(&0) || s.contains(&0) || opts.padding[0] * 2 > k[0] || opts.padding[1] * 2 > k[1] {
        fail!(
            name,
            "kernel {k:?} and stride {s:?} must be at least 1, and padding {:?} at most half the kernel",
            opts.padding
        );
    }
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let (Some(oh), Some(ow)) = (out_len(h, k[0], s[0], opts.padding[0], 1), out_len(w, k[1], s[1], opts.padding[1], 1))
    else {
        fail!(name, "the window {k:?} does not fit the padded input {h}x{w}");
    };
    let xp = x.pad(&[(opts.padding[1], opts.padding[1]), (opts.padding[0], opts.padding[0])], fill);
    windows(&xp, k, s, [1, 1], [oh, ow])
}

/// Where the windows tile the input (stride the kernel, no padding), the input cropped to whole windows and
/// viewed as `[N, C, OH, KH, OW, KW]`: a reduction over dims 3 and 5 pools it. Its backward is one broadcast,
/// where the stacked slices' is a pad per window position, which the schedule inlines into one another (a 2x2
/// pool's gradient in a small CNN made a kernel of 1.7 MB of kernel IR that WGSL's parser took minutes over).
fn tiled(x: &Tensor, opts: &Pool2dOptions) -> Option<Tensor> {
    let k = opts.kernel;
    if x.rank() != 4 || opts.stride.is_some_and(|s| s != k) || opts.padding != [0, 0] || k.contains(&0) {
        return None;
    }
    let (n, c, h, w) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (oh, ow) = (h / k[0], w / k[1]);
    if oh == 0 || ow == 0 {
        return None;
    }
    let cropped =
        if (oh * k[0], ow * k[1]) == (h, w) { x.clone() } else { x.narrow(2, 0, oh * k[0]).narrow(3, 0, ow * k[1]) };
    Some(cropped.reshape(vec![n, c, oh, k[0], ow, k[1]]))
}

/// The maximum over each window (PyTorch's `max_pool2d`, padding with -inf; NaN propagates).
#[track_caller]
pub fn max_pool2d(x: &Tensor, opts: &Pool2dOptions) -> Tensor {
    float_only("max_pool2d", x);
    if let Some(t) = tiled(x, opts) {
        return t.max([3, 5], false);
    }
    pool_windows("max_pool2d", x, opts, f64::NEG_INFINITY).max(2, false)
}

/// The mean over each window (PyTorch's `avg_pool2d`): over the whole window with `count_include_pad`, else over
/// the elements of the input it covers.
#[track_caller]
pub fn avg_pool2d(x: &Tensor, opts: &Pool2dOptions, count_include_pad: bool) -> Tensor {
    float_only("avg_pool2d", x);
    if let Some(t) = tiled(x, opts) {
        return t.mean([3, 5], false);
    }
    let sums = pool_windows("avg_pool2d", x, opts, 0.0).sum(2, false);
    if count_include_pad || opts.padding == [0, 0] {
        return sums.div((opts.kernel[0] * opts.kernel[1]) as f64);
    }
    // The covered elements per window: the same windows over ones.
    let ones = x.ones_like().narrow(0, 0, 1).narrow(1, 0, 1);
    let count = pool_windows("avg_pool2d", &ones, opts, 0.0).sum(2, false);
    sums.div(count)
}

/// The mean over `output` adaptive windows (PyTorch's `adaptive_avg_pool2d`): window `i` of `n` over a length `l`
/// spans `floor(i l / n) .. ceil((i + 1) l / n)`; rows and columns are averaged in turn.
#[track_caller]
pub fn adaptive_avg_pool2d(x: &Tensor, output: [usize; 2]) -> Tensor {
    float_only("adaptive_avg_pool2d", x);
    if x.rank() != 4 || output.contains(&0) {
        fail!(
            "adaptive_avg_pool2d",
            "expects an input [N, C, H, W] and an output size of at least 1, got {:?} and {output:?}",
            x.dims()
        );
    }
    let mut y = x.clone();
    for (d, &n) in [2usize, 3].iter().zip(&output) {
        let l = y.dims()[*d];
        let parts: Vec<Tensor> = (0..n)
            .map(|i| {
                let (start, end) = (i * l / n, ((i + 1) * l).div_ceil(n));
                y.narrow(*d as isize, start, end - start).mean(*d as isize, true)
            })
            .collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        y = Tensor::cat(&refs, *d as isize);
    }
    y
}
