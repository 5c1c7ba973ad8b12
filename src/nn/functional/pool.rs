//! Poolings (`torch.nn.functional`: `max_pool1d`, `max_pool2d`, `avg_pool1d`, `avg_pool2d`,
//! `adaptive_avg_pool1d`, `adaptive_avg_pool2d`), NCHW as PyTorch. A pooling stacks strided slices of the padded
//! input and reduces over them (max with -inf padding, mean with zeros), so its windows are exactly PyTorch's; where
//! the windows tile the input it reduces a reshaped view instead. The 1-D forms are the 2-D ones over a height of 1.
//! Not done: `dilation`, `ceil_mode` and `return_indices` (PyTorch's further `max_pool` arguments).

use super::conv::out_len;
use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;

/// Window geometry of a 1-D pooling (PyTorch's keyword arguments; `stride: None` is the kernel size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool1dOptions {
    pub kernel: usize,
    pub stride: Option<usize>,
    pub padding: usize,
}

impl Pool1dOptions {
    /// A window of `kernel`, stride the kernel, no padding.
    pub fn new(kernel: usize) -> Pool1dOptions {
        Pool1dOptions { kernel, stride: None, padding: 0 }
    }

    /// The same window over a height of 1, checked first so that a misuse is named in 1-D terms.
    #[track_caller]
    fn as_2d(&self, name: &str) -> Pool2dOptions {
        let s = self.stride.unwrap_or(self.kernel);
        if self.kernel == 0 || s == 0 || self.padding * 2 > self.kernel {
            fail!(
                name,
                "kernel {} and stride {s} must be at least 1, and padding {} at most half the kernel",
                self.kernel,
                self.padding
            );
        }
        Pool2dOptions { kernel: [1, self.kernel], stride: Some([1, s]), padding: [0, self.padding] }
    }
}

/// `f` of `x` (`[N, C, L]` or `[C, L]`) viewed as `[N, C, 1, L]`, back in `x`'s rank: a 1-D pooling as the 2-D one.
#[track_caller]
fn over_one_row(name: &str, x: &Tensor, f: impl Fn(&Tensor) -> Tensor) -> Tensor {
    float_only(name, x);
    match x.rank() {
        3 => f(&x.unsqueeze(2)).squeeze(2),
        2 => f(&x.unsqueeze(0).unsqueeze(2)).squeeze(2).squeeze(0),
        _ => fail!(name, "expects an input [N, C, L] or [C, L], got {:?}", x.dims()),
    }
}

/// The maximum over each window of `x` `[N, C, L]` or `[C, L]` (PyTorch's `max_pool1d`).
#[track_caller]
pub fn max_pool1d(x: &Tensor, opts: &Pool1dOptions) -> Tensor {
    let o = opts.as_2d("max_pool1d");
    over_one_row("max_pool1d", x, |x| max_pool2d(x, &o))
}

/// The mean over each window of `x` `[N, C, L]` or `[C, L]` (PyTorch's `avg_pool1d`; see [`avg_pool2d`] for
/// `count_include_pad`).
#[track_caller]
pub fn avg_pool1d(x: &Tensor, opts: &Pool1dOptions, count_include_pad: bool) -> Tensor {
    let o = opts.as_2d("avg_pool1d");
    over_one_row("avg_pool1d", x, |x| avg_pool2d(x, &o, count_include_pad))
}

/// The mean over `output` adaptive windows of `x` `[N, C, L]` or `[C, L]` (PyTorch's `adaptive_avg_pool1d`; the
/// windows as [`adaptive_avg_pool2d`]'s).
#[track_caller]
pub fn adaptive_avg_pool1d(x: &Tensor, output: usize) -> Tensor {
    if output == 0 {
        fail!("adaptive_avg_pool1d", "the output size must be at least 1");
    }
    over_one_row("adaptive_avg_pool1d", x, |x| adaptive_avg_pool2d(x, [1, output]))
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
        fail!(name, "expects an input [N, C, H, W] or [C, H, W], got {:?}", x.dims());
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

/// The maximum over each window of `x` `[N, C, H, W]` or `[C, H, W]` (PyTorch's `max_pool2d`, padding with -inf;
/// NaN propagates).
#[track_caller]
pub fn max_pool2d(x: &Tensor, opts: &Pool2dOptions) -> Tensor {
    float_only("max_pool2d", x);
    if x.rank() == 3 {
        return max_pool2d(&x.unsqueeze(0), opts).squeeze(0);
    }
    if let Some(t) = tiled(x, opts) {
        return t.max([3, 5], false);
    }
    pool_windows("max_pool2d", x, opts, f64::NEG_INFINITY).max(2, false)
}

/// The mean over each window of `x` `[N, C, H, W]` or `[C, H, W]` (PyTorch's `avg_pool2d`): over the whole window
/// with `count_include_pad`, else over the elements of the input it covers.
#[track_caller]
pub fn avg_pool2d(x: &Tensor, opts: &Pool2dOptions, count_include_pad: bool) -> Tensor {
    float_only("avg_pool2d", x);
    if x.rank() == 3 {
        return avg_pool2d(&x.unsqueeze(0), opts, count_include_pad).squeeze(0);
    }
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
    if x.rank() == 3 {
        return adaptive_avg_pool2d(&x.unsqueeze(0), output).squeeze(0);
    }
    if x.rank() != 4 || output.contains(&0) {
        fail!(
            "adaptive_avg_pool2d",
            "expects an input [N, C, H, W] or [C, H, W] and an output size of at least 1, got {:?} and {output:?}",
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
