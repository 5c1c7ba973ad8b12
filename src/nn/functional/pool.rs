//! Poolings (`torch.nn.functional`: `max_pool1d`, `max_pool2d`, their `return_indices` forms and their inverses
//! `max_unpool1d`/`2d`, `avg_pool1d`, `avg_pool2d`, `adaptive_avg_pool1d`/`2d`, `adaptive_max_pool1d`/`2d`), NCHW as
//! PyTorch, with its `dilation` (max only, as there) and `ceil_mode`. A pooling stacks strided slices of the padded
//! input and reduces over them (max with -inf padding, mean with zeros), so its windows are exactly PyTorch's; where
//! the windows tile the input it reduces a reshaped view instead. The 1-D forms are the 2-D ones over a height of 1.
//!
//! Max pooling's indices name the tap PyTorch's kernels take (the first maximum in row-major window order; in a
//! window holding NaN, the last NaN; never a padding tap) by its flat position `h * W + w` in its input plane. Its
//! gradient is the maximum's (`amax`'s rule): shared between the taps that tie for a window's maximum, where
//! PyTorch sends it all to the tap the indices name, so the two differ only where a window holds its maximum
//! twice (and a window holding NaN gets NaN gradients). Deliberately: PyTorch's pick, as a one-hot over the taps in
//! the backward, made the digits CNN's step (two 2 x 2 poolings) about half again slower. Not done:
//! `divisor_override`, the adaptive max poolings' indices.

use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

/// Window geometry of a 1-D pooling (PyTorch's keyword arguments; `stride: None` is the kernel size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool1dOptions {
    pub kernel: usize,
    pub stride: Option<usize>,
    pub padding: usize,
    /// The spacing of a window's taps (max pooling only: PyTorch's average poolings have none).
    pub dilation: usize,
    /// Count the windows rounding up ([`Pool2dOptions::ceil_mode`]).
    pub ceil_mode: bool,
}

impl Pool1dOptions {
    /// A window of `kernel`, stride the kernel, no padding, no dilation, floor mode.
    pub fn new(kernel: usize) -> Pool1dOptions {
        Pool1dOptions { kernel, stride: None, padding: 0, dilation: 1, ceil_mode: false }
    }

    /// The same window over a height of 1, checked first so that a misuse is named in 1-D terms.
    #[track_caller]
    fn as_2d(&self, name: &str) -> Pool2dOptions {
        let s = self.stride.unwrap_or(self.kernel);
        check_axis(name, self.kernel, s, self.padding, self.dilation);
        Pool2dOptions {
            kernel: [1, self.kernel],
            stride: Some([1, s]),
            padding: [0, self.padding],
            dilation: [1, self.dilation],
            ceil_mode: self.ceil_mode,
        }
    }
}

/// `f` of `x` (`[N, C, L]` or `[C, L]`) viewed as `[N, C, 1, L]`, back in `x`'s rank: a 1-D pooling as the 2-D one.
#[track_caller]
fn over_one_row(name: &str, x: &Tensor, mut f: impl FnMut(&Tensor) -> Tensor) -> Tensor {
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

/// [`max_pool1d`] and the position along `L` of the tap each output took (PyTorch's
/// `max_pool1d(..., return_indices=True)`; see [`max_pool2d_with_indices`]).
#[track_caller]
pub fn max_pool1d_with_indices(x: &Tensor, opts: &Pool1dOptions) -> (Tensor, Tensor) {
    let o = opts.as_2d("max_pool1d_with_indices");
    let mut indices = None;
    let values = over_one_row("max_pool1d_with_indices", x, |x| {
        let (v, i) = max_pool2d_with_indices(x, &o);
        indices = Some(i);
        v
    });
    let i = indices.unwrap_or_else(|| unreachable!("set by the pooling"));
    // The indices' height of 1 goes as the values' does.
    let i = if x.rank() == 3 { i.squeeze(2) } else { i.squeeze(2).squeeze(0) };
    (values, i)
}

/// The mean over each window of `x` `[N, C, L]` or `[C, L]` (PyTorch's `avg_pool1d`; see [`avg_pool2d`] for
/// `count_include_pad`).
#[track_caller]
pub fn avg_pool1d(x: &Tensor, opts: &Pool1dOptions, count_include_pad: bool) -> Tensor {
    let o = opts.as_2d("avg_pool1d");
    over_one_row("avg_pool1d", x, |x| avg_pool2d(x, &o, count_include_pad))
}

/// The maximum over `output` adaptive windows of `x` `[N, C, L]` or `[C, L]` (PyTorch's `adaptive_max_pool1d`; the
/// windows as [`adaptive_avg_pool2d`]'s).
#[track_caller]
pub fn adaptive_max_pool1d(x: &Tensor, output: usize) -> Tensor {
    if output == 0 {
        fail!("adaptive_max_pool1d", "the output size must be at least 1");
    }
    over_one_row("adaptive_max_pool1d", x, |x| adaptive_max_pool2d(x, [1, output]))
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
    /// The spacing of a window's taps (max pooling only: PyTorch's average poolings have none).
    pub dilation: [usize; 2],
    /// Count the windows rounding up, as PyTorch: a last window may run past the padded input (the part past it
    /// ignored, and not counted by an average), but none starts in the right padding.
    pub ceil_mode: bool,
}

impl Pool2dOptions {
    /// A `kh x kw` window, stride the kernel, no padding, no dilation, floor mode.
    pub fn new(kernel: [usize; 2]) -> Pool2dOptions {
        Pool2dOptions { kernel, stride: None, padding: [0, 0], dilation: [1, 1], ceil_mode: false }
    }

    fn stride_or_kernel(&self) -> [usize; 2] {
        self.stride.unwrap_or(self.kernel)
    }
}

/// PyTorch's checks of one axis of a window: kernel, stride and dilation at least 1, padding at most half the
/// window's span (`dilation * (kernel - 1) + 1`).
#[track_caller]
fn check_axis(name: &str, k: usize, s: usize, p: usize, d: usize) {
    let span = d.saturating_mul(k.saturating_sub(1)).saturating_add(1);
    if k == 0 || s == 0 || d == 0 || p.saturating_mul(2) > span {
        fail!(
            name,
            "kernel {k}, stride {s} and dilation {d} must be at least 1, and padding {p} at most half the window's \
             span ({span})"
        );
    }
}

/// The windows along one axis of length `l`: how many (PyTorch's `pooling_output_shape`) and how far the last one
/// runs past the padded input (ceil mode only). `None` where not one fits.
fn axis_windows(l: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> Option<(usize, usize)> {
    let span = d * (k - 1) + 1;
    let padded = l + 2 * p;
    let room = padded.checked_sub(span)?;
    let mut out = if ceil { room.div_ceil(s) + 1 } else { room / s + 1 };
    if ceil && (out - 1) * s >= l + p {
        out -= 1;
    }
    Some((out, ((out - 1) * s + span).saturating_sub(padded)))
}

/// A 2-D pooling's geometry on an input `h x w`: the output size and the overhang past the padded input per axis.
#[track_caller]
fn geometry(name: &str, h: usize, w: usize, opts: &Pool2dOptions) -> ([usize; 2], [usize; 2]) {
    let (k, s, p, d) = (opts.kernel, opts.stride_or_kernel(), opts.padding, opts.dilation);
    for a in 0..2 {
        check_axis(name, k[a], s[a], p[a], d[a]);
    }
    let rows = axis_windows(h, k[0], s[0], p[0], d[0], opts.ceil_mode);
    let cols = axis_windows(w, k[1], s[1], p[1], d[1], opts.ceil_mode);
    let (Some((oh, eh)), Some((ow, ew))) = (rows, cols) else {
        fail!(name, "the window {k:?} (dilation {d:?}) does not fit the padded input {h}x{w}");
    };
    ([oh, ow], [eh, ew])
}

/// The stacked windows of a pooling, `[N, C, KH * KW, OH, OW]`, the input padded with `fill` and, past that,
/// with `overhang` (ceil mode's last windows).
#[track_caller]
fn pool_windows(name: &str, x: &Tensor, opts: &Pool2dOptions, fill: Scalar, overhang: Scalar) -> Tensor {
    if x.rank() != 4 {
        fail!(name, "expects an input [N, C, H, W] or [C, H, W], got {:?}", x.dims());
    }
    let (out, extra) = geometry(name, x.dims()[2], x.dims()[3], opts);
    let p = opts.padding;
    let mut xp = x.pad(&[(p[1], p[1]), (p[0], p[0])], fill);
    if extra != [0, 0] {
        xp = xp.pad(&[(0, extra[1]), (0, extra[0])], overhang);
    }
    windows(&xp, opts.kernel, opts.stride_or_kernel(), opts.dilation, out)
}

/// Where the windows tile the input (stride the kernel, no padding), the input cropped to whole windows and
/// viewed as `[N, C, OH, KH, OW, KW]`: a reduction over dims 3 and 5 pools it. Its backward is one broadcast,
/// where the stacked slices' is a pad per window position, which the schedule inlines into one another (a 2x2
/// pool's gradient in a small CNN made a kernel of 1.7 MB of kernel IR that WGSL's parser took minutes over).
fn tiled(x: &Tensor, opts: &Pool2dOptions) -> Option<Tensor> {
    let k = opts.kernel;
    if x.rank() != 4
        || opts.stride.is_some_and(|s| s != k)
        || opts.padding != [0, 0]
        || opts.dilation != [1, 1]
        || k.contains(&0)
    {
        return None;
    }
    let (n, c, h, w) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (oh, ow) = (h / k[0], w / k[1]);
    // Ceil mode adds a window over a ragged end, which a reshape cannot hold.
    if oh == 0 || ow == 0 || opts.ceil_mode && (h % k[0] != 0 || w % k[1] != 0) {
        return None;
    }
    let cropped =
        if (oh * k[0], ow * k[1]) == (h, w) { x.clone() } else { x.narrow(2, 0, oh * k[0]).narrow(3, 0, ow * k[1]) };
    Some(cropped.reshape(vec![n, c, oh, k[0], ow, k[1]]))
}

/// The maximum over each window of `x` `[N, C, H, W]` or `[C, H, W]` (PyTorch's `max_pool2d`, padding with -inf;
/// NaN propagates; the gradient as the module doc says).
#[track_caller]
pub fn max_pool2d(x: &Tensor, opts: &Pool2dOptions) -> Tensor {
    max_pool("max_pool2d", x, opts, false).0
}

/// [`max_pool2d`] and, for each output, the flat position `h * W + w` in its input plane of the tap it took
/// (PyTorch's `max_pool2d(..., return_indices=True)`), as i64 (i32 on a device without 64-bit integers, as
/// `argmax`).
#[track_caller]
pub fn max_pool2d_with_indices(x: &Tensor, opts: &Pool2dOptions) -> (Tensor, Tensor) {
    let (values, indices) = max_pool("max_pool2d_with_indices", x, opts, true);
    (values, indices.unwrap_or_else(|| unreachable!("asked for")))
}

/// Max pooling of a rank-3 or rank-4 `x`: the values and, when `want_indices`, the indices.
#[track_caller]
fn max_pool(name: &str, x: &Tensor, opts: &Pool2dOptions, want_indices: bool) -> (Tensor, Option<Tensor>) {
    float_only(name, x);
    if x.rank() == 3 {
        let (v, i) = max_pool(name, &x.unsqueeze(0), opts, want_indices);
        return (v.squeeze(0), i.map(|i| i.squeeze(0)));
    }
    if x.rank() != 4 {
        fail!(name, "expects an input [N, C, H, W] or [C, H, W], got {:?}", x.dims());
    }
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let dt = x.device().index_dtype();
    // Every position's flat index in its plane, laid out as the windows are.
    let plane = || Tensor::iota(Scalar::Int(0), Scalar::Int(1), h * w, dt, &x.device()).reshape(vec![1, 1, h, w]);
    let k = opts.kernel;
    if let Some(t) = tiled(x, opts) {
        // Taps along dims 3 and 5 of [N, C, OH, KH, OW, KW]; every tap lies in the input.
        let order = tap_order(k[0] * k[1], x.dtype(), x, vec![1, 1, 1, k[0], 1, k[1]]);
        let (values, pick) = pick_max(&t, &[3, 5], &order, None, want_indices);
        let idx = pick.map(|pick| {
            let pos = tiled(&plane(), opts).unwrap_or_else(|| unreachable!("the plane tiles as its input"));
            pick.where_(&pos, -1i64).max([3, 5], false)
        });
        return (values.squeeze([3, 5]), idx);
    }
    let win = pool_windows(name, x, opts, f64::NEG_INFINITY.into(), f64::NEG_INFINITY.into());
    let pos = want_indices.then(|| pool_windows(name, &plane(), opts, Scalar::Int(-1), Scalar::Int(-1)));
    let order = tap_order(k[0] * k[1], x.dtype(), x, vec![1, 1, k[0] * k[1], 1, 1]);
    let valid = pos.as_ref().map(|p| p.ge(0i64));
    let (values, pick) = pick_max(&win, &[2], &order, valid.as_ref(), want_indices);
    let idx = pick.zip(pos).map(|(pick, pos)| pick.where_(&pos, -1i64).max(2, false));
    (values.squeeze(2), idx)
}

/// The partial inverse of [`max_pool2d_with_indices`] (PyTorch's `max_unpool2d`): `x` `[N, C, H, W]` (or
/// `[C, H, W]`) written at the flat positions `indices` (its shape, i64 or i32) of planes `output_size`, by default
/// `(H - 1) * stride - 2 * padding + kernel` a side, zeros elsewhere. Where several values name one position
/// (overlapping windows that took the same tap) it holds their mean: the value itself when they are equal, as a
/// pooling's own outputs are, where PyTorch keeps one of them (the last, on its CPU). An index outside the plane is
/// an error when the result is read. Deterministic; its gradient is the output's gradient at each index (shared
/// the same way).
#[track_caller]
pub fn max_unpool2d(x: &Tensor, indices: &Tensor, opts: &Pool2dOptions, output_size: Option<[usize; 2]>) -> Tensor {
    let name = "max_unpool2d";
    float_only(name, x);
    if x.rank() == 3 && indices.rank() == 3 {
        return max_unpool2d(&x.unsqueeze(0), &indices.unsqueeze(0), opts, output_size).squeeze(0);
    }
    if x.rank() != 4 || x.dims() != indices.dims() || !matches!(indices.dtype(), DType::I64 | DType::I32) {
        fail!(
            name,
            "expects values [N, C, H, W] or [C, H, W] and i64 or i32 indices of their shape, got {}{:?} and {}{:?}",
            x.dtype(),
            x.dims(),
            indices.dtype(),
            indices.dims()
        );
    }
    let (n, c, h, w) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (k, s, p) = (opts.kernel, opts.stride_or_kernel(), opts.padding);
    let side = |l: usize, a: usize| ((l.max(1) - 1) * s[a] + k[a]).checked_sub(2 * p[a]);
    let [oh, ow] = match (output_size, side(h, 0), side(w, 1)) {
        (Some(o), _, _) => o,
        (None, Some(a), Some(b)) => [a, b],
        _ => fail!(name, "the default output size of {h}x{w} under kernel {k:?}, stride {s:?}, padding {p:?} is empty"),
    };
    let values = x.reshape(vec![n, c, h * w]);
    let at = indices.reshape(vec![n, c, h * w]);
    let zeros = Tensor::zeros([n, c, oh * ow], x.dtype(), &x.device());
    let sums = zeros.scatter_add(2, &at, &values);
    let counts = zeros.scatter_add(2, &at, &values.ones_like());
    sums.div(counts.clamp_min(1.0)).reshape(vec![n, c, oh, ow])
}

/// [`max_unpool2d`] over one row: `x` `[N, C, L]` or `[C, L]` written at `indices` along outputs of
/// `output_size` (by default `(L - 1) * stride - 2 * padding + kernel`), PyTorch's `max_unpool1d`.
#[track_caller]
pub fn max_unpool1d(x: &Tensor, indices: &Tensor, opts: &Pool1dOptions, output_size: Option<usize>) -> Tensor {
    let o = opts.as_2d("max_unpool1d");
    let size = output_size.map(|l| [1, l]);
    match (x.rank(), indices.rank()) {
        (3, 3) => max_unpool2d(&x.unsqueeze(2), &indices.unsqueeze(2), &o, size).squeeze(2),
        (2, 2) => max_unpool2d(&x.unsqueeze(1), &indices.unsqueeze(1), &o, size).squeeze(1),
        _ => fail!(
            "max_unpool1d",
            "expects values and indices [N, C, L] or [C, L], got {:?} and {:?}",
            x.dims(),
            indices.dims()
        ),
    }
}

/// `n, n - 1, .., 1` along the taps (row-major window order), shaped `dims` to broadcast over the windows.
fn tap_order(n: usize, dt: DType, like: &Tensor, dims: Vec<usize>) -> Tensor {
    Tensor::iota(Scalar::Int(n as i64), Scalar::Int(-1), n, dt, &like.device()).reshape(dims)
}

/// The maxima of `win` over its tap dims `taps` (kept, size 1) and, when `want_pick`, the one-hot bool of the tap
/// PyTorch's kernels take in each window: the first maximum in tap order (`order`: descending along the taps), or
/// in a window holding NaN the last NaN, never a tap outside `valid`.
fn pick_max(
    win: &Tensor,
    taps: &[usize],
    order: &Tensor,
    valid: Option<&Tensor>,
    want_pick: bool,
) -> (Tensor, Option<Tensor>) {
    let values = win.max(taps.to_vec(), true);
    if !want_pick {
        return (values, None);
    }
    let (plain, m) = (win.detach(), values.detach());
    let nan = plain.ne(&plain);
    let mut hit = plain.eq(&m);
    if let Some(v) = valid {
        hit = hit.logical_and(v);
    }
    // PyTorch's loop takes a value only if it is larger than the one it holds, or NaN: the first maximum, the last
    // NaN (scored by the reversed order).
    let n = order.dims().iter().product::<usize>() as f64;
    let score = m.ne(&m).where_(nan.where_(order.rsub(n + 1.0), 0.0), hit.where_(order, 0.0));
    let pick = score.eq(score.max(taps.to_vec(), true)).logical_and(score.gt(0.0));
    (values, Some(pick))
}

/// The mean over each window of `x` `[N, C, H, W]` or `[C, H, W]` (PyTorch's `avg_pool2d`): over the window as it
/// lies in the padded input with `count_include_pad` (in ceil mode, less the part past it), else over the elements
/// of the input it covers.
#[track_caller]
pub fn avg_pool2d(x: &Tensor, opts: &Pool2dOptions, count_include_pad: bool) -> Tensor {
    float_only("avg_pool2d", x);
    if opts.dilation != [1, 1] {
        fail!("avg_pool2d", "takes no dilation (PyTorch's neither), got {:?}", opts.dilation);
    }
    if x.rank() == 3 {
        return avg_pool2d(&x.unsqueeze(0), opts, count_include_pad).squeeze(0);
    }
    if let Some(t) = tiled(x, opts) {
        return t.mean([3, 5], false);
    }
    let sums = pool_windows("avg_pool2d", x, opts, 0.0.into(), 0.0.into()).sum(2, false);
    let (_, extra) = geometry("avg_pool2d", x.dims()[2], x.dims()[3], opts);
    if extra == [0, 0] && (count_include_pad || opts.padding == [0, 0]) {
        return sums.div((opts.kernel[0] * opts.kernel[1]) as f64);
    }
    // Each window's divisor: the same windows over ones, the padding counted or not, the overhang never.
    let ones = x.ones_like().narrow(0, 0, 1).narrow(1, 0, 1);
    let pad = if count_include_pad { 1.0 } else { 0.0 };
    let count = pool_windows("avg_pool2d", &ones, opts, pad.into(), 0.0.into()).sum(2, false);
    sums.div(count)
}

/// The mean over `output` adaptive windows (PyTorch's `adaptive_avg_pool2d`): window `i` of `n` over a length `l`
/// spans `floor(i l / n) .. ceil((i + 1) l / n)`; rows and columns are averaged in turn.
#[track_caller]
pub fn adaptive_avg_pool2d(x: &Tensor, output: [usize; 2]) -> Tensor {
    adaptive("adaptive_avg_pool2d", x, output, |w, d| w.mean(d, true))
}

/// The maximum over `output` adaptive windows (PyTorch's `adaptive_max_pool2d`; the windows as
/// [`adaptive_avg_pool2d`]'s, rows and columns reduced in turn). The gradient as [`max_pool2d`]'s.
#[track_caller]
pub fn adaptive_max_pool2d(x: &Tensor, output: [usize; 2]) -> Tensor {
    adaptive("adaptive_max_pool2d", x, output, |w, d| w.max(d, true))
}

/// `reduce(window, dim)` (keeping `dim`) over `output` adaptive windows of `x` `[N, C, H, W]` or `[C, H, W]`, along
/// the rows and then the columns: what both adaptive poolings are, as a mean and a maximum over a rectangle are
/// those over its rows' results.
#[track_caller]
fn adaptive(name: &str, x: &Tensor, output: [usize; 2], reduce: fn(&Tensor, isize) -> Tensor) -> Tensor {
    float_only(name, x);
    if x.rank() == 3 {
        return adaptive(name, &x.unsqueeze(0), output, reduce).squeeze(0);
    }
    if x.rank() != 4 || output.contains(&0) {
        fail!(
            name,
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
                reduce(&y.narrow(*d as isize, start, end - start), *d as isize)
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
