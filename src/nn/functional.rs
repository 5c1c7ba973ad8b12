//! Activations and losses as functions (`torch.nn.functional`), each a composition of kiln's ops, so autograd
//! differentiates them and the fuser sees one elementwise chain.
//!
//! Choices that match PyTorch where a naive composition would not:
//! - `relu` is `Tensor::relu`, a select `where(x <= 0, 0, x)`: its gradient at 0 is 0 (as PyTorch's), where
//!   `maximum`'s tie rule would give 1/2; NaN still propagates (`NaN <= 0` is false).
//! - `leaky_relu` is `where(x > 0, x, slope * x)`, so the gradient at 0 is `slope`, as in PyTorch.
//! - `cross_entropy` (`cross_entropy.rs`, with PyTorch's `ignore_index`, `weight` and `label_smoothing`) picks the
//!   target's log-probability with a one-hot mask and `where`, not a multiply (see there).
//!
//! `erf` is not a kiln primitive. `gelu` (exact) and `erf` use the Chebyshev fit of erfc from Numerical Recipes
//! (Press et al., 2nd ed., §6.2, `erfcc`): `erfc(z) = t exp(-z² + P(t))`, `t = 1 / (1 + z/2)`, with a fractional
//! (relative) error below 1.2e-7 for every z >= 0, tails included. That is f32 accuracy; for f64 inputs it is
//! still 1.2e-7 relative, not f64 accuracy (a primitive erf in the op set would fix that). Because the error is
//! relative to erfc, `gelu(x) = x/2 * erfc(-x/√2)` stays accurate for very negative x, where `x/2 * (1 + erf)`
//! would cancel. `erf` itself uses the odd Taylor series below |x| < 0.5 so small arguments keep their relative
//! accuracy too.
//!

mod activations;
mod attention;
mod conv;
mod conv_transpose;
mod cross_entropy;
mod interpolate;
mod losses;
mod norms;
mod pool;

pub use activations::{
    celu, elu, glu, hardshrink, hardsigmoid, hardswish, hardtanh, logsigmoid, mish, prelu, relu6, selu, softmin,
    softplus, softshrink, softsign, tanhshrink,
};
pub use attention::{AttentionOptions, scaled_dot_product_attention};
pub use conv::{Conv2dOptions, conv1d, conv2d};
pub use conv_transpose::{ConvTranspose2dOptions, conv_transpose2d};
pub use cross_entropy::{CrossEntropyOptions, cross_entropy, cross_entropy_with, nll_loss, nll_loss_with};
pub use interpolate::{InterpolateMode, InterpolateOptions, interpolate};
pub use losses::{
    BceWithLogitsOptions, KlReduction, binary_cross_entropy_with_logits, binary_cross_entropy_with_logits_with,
    huber_loss, kl_div, l1_loss, smooth_l1_loss,
};
pub use norms::{cdist, cosine_similarity, group_norm, normalize, pairwise_distance, rms_norm};
pub use pool::{
    Pool1dOptions, Pool2dOptions, adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d, adaptive_max_pool2d,
    avg_pool1d, avg_pool2d, max_pool1d, max_pool1d_with_indices, max_pool2d, max_pool2d_with_indices, max_unpool1d,
    max_unpool2d,
};

use crate::args::fail;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

/// How a loss reduces its per-element values (PyTorch's `reduction=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// One value per element (`'none'`).
    None,
    /// The mean (`'mean'`, the default).
    #[default]
    Mean,
    /// The sum (`'sum'`).
    Sum,
}

impl Reduction {
    fn apply(self, per_element: Tensor) -> Tensor {
        match self {
            Reduction::None => per_element,
            Reduction::Mean => per_element.mean_all(),
            Reduction::Sum => per_element.sum_all(),
        }
    }
}

/// Which GELU (PyTorch's `approximate=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Approximate {
    /// The exact `x Φ(x)` (`'none'`, the default), through the erfc approximation described in the module docs.
    #[default]
    None,
    /// `x/2 (1 + tanh(√(2/π) (x + 0.044715 x³)))` (`'tanh'`).
    Tanh,
}

/// `max(x, 0)` with PyTorch's gradient (0 at 0); NaN propagates.
#[track_caller]
pub fn relu(x: &Tensor) -> Tensor {
    x.relu()
}

/// `x` where `x > 0`, else `negative_slope * x` (gradient `negative_slope` at 0, as in PyTorch).
///
/// Recorded as `x * where(x > 0, 1, negative_slope)`: the same values (`x * 1` is `x`, NaN and -0.0 included), and
/// the gradient is one product with the factor already in the graph, `g * where(..)`, where a `where` of `x` and
/// `x * negative_slope` needed a `where` per branch, a product and a sum (11 nodes a layer instead of 7, recorded on
/// every training step; it also turned a `-0.0` gradient below 0 into `+0.0`, which PyTorch keeps).
#[track_caller]
pub fn leaky_relu(x: &Tensor, negative_slope: f64) -> Tensor {
    float_only("leaky_relu", x);
    x.mul(x.gt(0).where_(x.ones_like(), negative_slope))
}

/// GELU, exact (`Approximate::None`) or the tanh approximation.
#[track_caller]
pub fn gelu(x: &Tensor, approximate: Approximate) -> Tensor {
    float_only("gelu", x);
    x.in_f32(|x| match approximate {
        // Φ(x) = erfc(-x/√2) / 2, computed from the erfc of |x|/√2 so the negative tail has relative accuracy.
        Approximate::None => {
            let e = erfc_nonneg(&x.abs().mul(std::f64::consts::FRAC_1_SQRT_2));
            let two_phi = x.lt(0).where_(&e, e.rsub(2.0));
            x.mul(0.5).mul(two_phi)
        }
        Approximate::Tanh => gelu_tanh(x),
    })
}

/// The tanh GELU of an f32 `x`, `x/2 (1 + tanh(u))` with `u = k (x + 0.044715 x^3)` and `k = sqrt(2/pi)`, computed
/// as `x s` with `s = sigmoid(2u)` (the same function: `(1 + tanh(u)) / 2 = sigmoid(2u)`), and differentiated by
/// PyTorch's rule (`gelu_backward`, `approximate='tanh'`) in the same terms: the forward also stores the derivative
/// `d = s + 2 x s (1 - s) k (1 + 3 * 0.044715 x^2)` (PyTorch's `(1 + t)/2 + x/2 (1 - t^2) k (..)`, with `1 + t = 2s`
/// and `1 - t^2 = 4 s (1 - s)`), and the input's gradient is `g * d`. In f32 `d` is within ~2e-7 of the f64 value
/// (PyTorch's f32 tanh form: ~1e-6, from `1 - t^2` near `t = 1`).
///
/// Why the sigmoid: one `exp` and one division an element, where `tanh` is a polynomial for small arguments and
/// an `exp` and a division for the rest, both evaluated in a vector kernel; the two GELU kernels of a training step
/// are bound by that arithmetic. The values agree with the tanh form to a few ulp; PyTorch's tanh form loses the
/// relative accuracy of `1 + tanh(u)` for `x` below about -5, where this keeps it.
///
/// Why a rule of its own: through its parts' rules the backward read `x` and the stored `tanh(u)` (one forward
/// kernel stored it, a second read it back with `x`), and the gradient's product computed the whole derivative in
/// its epilogue from those two operands. Here the activation and the derivative are two forward kernels that each
/// read only `x` (each computes its own `s`: a stored `s` would be a third kernel), the gradient's product reads
/// one operand and multiplies, and `x` is not kept for the backward. The derivative is recorded only where a
/// gradient can be asked for (`x` requires one and recording is on), and computed only by a plan that reads it (a
/// backward): realizing the activation alone runs one kernel.
fn gelu_tanh(x: &Tensor) -> Tensor {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    // `2u`, and the activation's sigmoid of it.
    let two_u = |x: &Tensor| x.add(x.mul(x).mul(x).mul(0.044715)).mul(2.0 * k);
    let s = |x: &Tensor| two_u(x).sigmoid();
    if !crate::autograd::is_grad_enabled() || !x.is_requires_grad() {
        return x.mul(s(x));
    }
    let xd = x.detach();
    let y = xd.mul(s(&xd));
    // The derivative's own `s = 1 / (1 + e)`, `e = exp(-2u)`, and `1 - s` as `e s` where `s >= 1/2`: there `1 - s`
    // cancels (at x = 5 it is ~1e-7, a few ulp of 1 in f32, and the derivative would be off by ~15 ulp), while `e s`
    // keeps its relative accuracy; below, `1 - s` is exact enough, and `e` may be inf (`e s` NaN). The compare and
    // select cost the derivative's kernel ~20 µs a layer of the GPT step (~10 %).
    let e = two_u(&xd).neg().exp();
    let s = e.add(1.0).recip();
    let one_minus_s = s.lt(0.5).where_(s.rsub(1.0), e.mul(&s));
    let inner_derivative = xd.mul(&xd).mul(3.0 * 0.044715).add(1.0).mul(2.0 * k);
    // Stored (`contiguous`): inlined, the gradient's product would compute it from `x` again in its epilogue.
    let d = s.add(xd.mul(&s).mul(one_minus_s).mul(inner_derivative)).contiguous();
    let grad: crate::autograd::GradFn =
        std::sync::Arc::new(|g: &Tensor, _, links: &[Tensor], i| (i == 0).then(|| g.mul(&links[1])));
    y.with_grad_fn(smallvec::smallvec![x.clone(), d.detach()], grad)
}

/// `x * sigmoid(x)` (also known as swish).
#[track_caller]
pub fn silu(x: &Tensor) -> Tensor {
    float_only("silu", x);
    x.in_f32(|x| x.mul(x.sigmoid()))
}

/// `tanh(x)`.
#[track_caller]
pub fn tanh(x: &Tensor) -> Tensor {
    x.tanh()
}

/// `1 / (1 + exp(-x))`.
#[track_caller]
pub fn sigmoid(x: &Tensor) -> Tensor {
    x.sigmoid()
}

/// Softmax along `dim`.
#[track_caller]
pub fn softmax(x: &Tensor, dim: isize) -> Tensor {
    x.softmax(dim)
}

/// Log-softmax along `dim`.
#[track_caller]
pub fn log_softmax(x: &Tensor, dim: isize) -> Tensor {
    x.log_softmax(dim)
}

/// The error function, to about 1.2e-7 relative (see the module docs); float input only.
#[track_caller]
pub fn erf(x: &Tensor) -> Tensor {
    float_only("erf", x);
    let a = x.abs();
    // |x| >= 0.5: sign(x) (1 - erfc(|x|)), where erfc <= 0.48 so the subtraction loses nothing.
    let big = erfc_nonneg(&a).rsub(1.0);
    let big = x.lt(0).where_(big.neg(), &big);
    // |x| < 0.5: erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)); ten terms leave < 2e-14 relative at |x| = 0.5.
    // The series is evaluated on min(|x|, 0.5) times sign so that the branch not taken stays finite and its
    // (masked) gradient is 0, not NaN.
    let s = x.clamp(-0.5, 0.5);
    let s2 = s.mul(&s);
    let mut poly = s2.full_like(series_coeff(9));
    for n in (0..9).rev() {
        poly = poly.mul(&s2).add(series_coeff(n));
    }
    let small = s.mul(poly).mul(2.0 / std::f64::consts::PI.sqrt());
    a.lt(0.5).where_(small, big)
}

/// `(-1)^n / (n! (2n + 1))`, the Maclaurin coefficients of erf without the 2/√π.
fn series_coeff(n: u32) -> f64 {
    let fact: f64 = (1..=n).map(f64::from).product();
    let sign = if n.is_multiple_of(2) { 1.0 } else { -1.0 };
    sign / (fact * f64::from(2 * n + 1))
}

/// The complementary error function, to about 1.2e-7 relative (see the module docs); float input only.
#[track_caller]
pub fn erfc(x: &Tensor) -> Tensor {
    float_only("erfc", x);
    // |x| as a select rather than `abs`: the same value, but a gradient of 1 at x = 0 where `abs`'s is 0, which
    // had made erfc's gradient 0 there instead of -2/√π.
    let negative = x.lt(0);
    let e = erfc_nonneg(&negative.where_(x.neg(), x));
    negative.where_(e.rsub(2.0), &e)
}

/// Numerical Recipes' `erfcc` for `z >= 0`: fractional error < 1.2e-7.
fn erfc_nonneg(z: &Tensor) -> Tensor {
    const C: [f64; 10] = [
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    ];
    let t = z.mul(0.5).add(1.0).recip();
    // Horner: C0 + t (C1 + t (C2 + ... + t C9)).
    let mut p = t.mul(C[9]);
    for &c in C[1..9].iter().rev() {
        p = p.add(c).mul(&t);
    }
    let p = p.add(C[0]);
    t.mul(p.sub(z.mul(z)).exp())
}

/// Mean squared error between `input` and `target` (broadcast together).
#[track_caller]
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    float_only("mse_loss", input);
    reduction.apply(input.sub(target).square())
}

/// The rows of `weight` (`[num_embeddings, dim]`) at `indices` (any shape, i64 or i32): `[..indices, dim]`
/// (`torch.nn.functional.embedding`). A gather: O(indices x dim), and its gradient a deterministic scatter-add
/// into the weight (`Tensor::index_add`'s composition). An index outside `0..num_embeddings` is an error when the
/// result is read.
#[track_caller]
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Tensor {
    if weight.rank() != 2 {
        fail!("embedding", "the weight must be [num_embeddings, dim], got shape {:?}", weight.dims());
    }
    let mut dims = indices.dims().to_vec();
    dims.push(weight.dims()[1]);
    weight.index_select(0, &indices.flatten()).reshape(dims)
}

/// [`embedding`] with a padding entry (`torch.nn.functional.embedding(.., padding_idx=p)`): the positions that look
/// up row `padding_idx` (negative: counted from the end) pass no gradient to it, so sequences padded with it train
/// nothing through that row. The row's value is whatever the table holds there (`nn::Embedding::with_padding_idx`
/// zeroes it, as PyTorch's constructor does). An index outside `0..num_embeddings` is an error when the result is
/// read; a `padding_idx` outside the table panics here, naming it.
#[track_caller]
pub fn embedding_padded(indices: &Tensor, weight: &Tensor, padding_idx: i64) -> Tensor {
    let rows = embedding(indices, weight);
    let p = padding_row("embedding", weight.dims()[0], padding_idx);
    // A select, not a product with a 0/1 mask: the looked-up values pass through bit for bit (inf and NaN too),
    // and only the gradient stops at the padding positions.
    indices.ne(p as i64).unsqueeze(-1).where_(&rows, rows.detach())
}

/// `padding_idx` of a table of `num` rows as a row index (negative counts from the end); panics past either end.
#[track_caller]
pub(crate) fn padding_row(op: &str, num: usize, padding_idx: i64) -> usize {
    let n = num as i64;
    let p = if padding_idx < 0 { padding_idx + n } else { padding_idx };
    if !(0..n).contains(&p) {
        fail!(op, "padding_idx {padding_idx} is out of range for {num} embeddings (it must be in -{num}..{num})");
    }
    p as usize
}

/// `one_hot(indices, num_classes)` as i64 (`torch.nn.functional.one_hot`): a new last dim of `num_classes`, 1
/// where it equals the index. An index outside `0..num_classes` gives a row of zeros (PyTorch raises an error).
#[track_caller]
pub fn one_hot(indices: &Tensor, num_classes: usize) -> Tensor {
    one_hot_mask("one_hot", indices, num_classes, -1).to_dtype(DType::I64)
}

/// The bool mask `arange(num_classes) == indices`, with the class dim inserted at `class_dim` of the result.
#[track_caller]
fn one_hot_mask(name: &str, indices: &Tensor, num_classes: usize, class_dim: isize) -> Tensor {
    if !indices.dtype().is_int() {
        fail!(name, "class indices must be an integer tensor (i64 as in PyTorch), not {}", indices.dtype());
    }
    let rank = indices.rank() + 1;
    let d = if class_dim < 0 { (class_dim + rank as isize) as usize } else { class_dim as usize };
    let mut shape = vec![1usize; rank];
    shape[d] = num_classes;
    // Compared in the indices' own dtype when it is 32-bit (and the class count fits), else the device's index dtype.
    let idx = match indices.dtype() {
        DType::I32 if num_classes <= i32::MAX as usize => DType::I32,
        _ => indices.device().index_dtype(),
    };
    let classes = Tensor::iota(Scalar::Int(0), Scalar::Int(1), num_classes, idx, &indices.device());
    indices.unsqueeze(d as isize).to_dtype(idx).eq(classes.reshape(shape))
}

/// Zeros shaped as `indices` (integers) in `dtype`, read through a checked gather at each index (index 0 where
/// `ignored`): a lookup through a one-hot mask (`cross_entropy`'s target pick) adds it so that an index outside
/// `0..n` makes the realization fail (`Fault::Index`, as PyTorch raises), where the empty mask alone would give a
/// silent zero. Added, not selected: the sum's gradient does not read it.
pub(crate) fn checked_indices(indices: &Tensor, n: usize, ignored: Option<&Tensor>, dtype: DType) -> Tensor {
    let dev = indices.device();
    let i = indices.to_dtype(dev.index_dtype());
    let i = match ignored {
        Some(ig) => ig.where_(Tensor::scalar(Scalar::Int(0), dev.index_dtype(), &dev), &i),
        None => i,
    };
    let flat = i.reshape([indices.numel()]);
    Tensor::zeros([n], dtype, &dev).gather(0, &flat).reshape(indices.dims().to_vec())
}

/// Layer normalization over the last `normalized_shape.len()` dims (`torch.nn.functional.layer_norm`): the mean
/// and biased variance of those dims, `(x - mean) / sqrt(var + eps)`, then `* weight + bias` if given.
#[track_caller]
pub fn layer_norm(
    x: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    float_only("layer_norm", x);
    let k = normalized_shape.len();
    if k == 0 || x.rank() < k || &x.dims()[x.rank() - k..] != normalized_shape {
        fail!(
            "layer_norm",
            "the input's trailing dims must be normalized_shape {:?}, got an input of shape {:?}",
            normalized_shape,
            x.dims()
        );
    }
    for (what, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p
            && p.dims() != normalized_shape
        {
            fail!("layer_norm", "{what} has shape {:?}, expected normalized_shape {:?}", p.dims(), normalized_shape);
        }
    }
    let axes: Vec<isize> = (1..=k as isize).map(|i| -i).collect();
    x.in_f32(|x| {
        let mean = x.mean(axes.clone(), true);
        let rstd = x.sub(&mean).square().mean(axes.clone(), true).add(eps).rsqrt();
        let affine = |x: &Tensor, mean: &Tensor, rstd: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>| {
            let mut y = x.sub(mean).mul(rstd);
            if let Some(w) = w {
                y = y.mul(w);
            }
            if let Some(b) = b {
                y = y.add(b);
            }
            y
        };
        let wants_grad = [Some(x), weight, bias].into_iter().flatten().any(Tensor::is_requires_grad);
        if !crate::autograd::is_grad_enabled() || !wants_grad {
            return affine(x, &mean, &rstd, weight, bias);
        }
        // PyTorch's rule (`native_layer_norm_backward`), from the input and the row statistics: through the
        // composition's rules the forward stored the normalized input as well (one more pass over the activation
        // each way), and the statistics' own gradients cancel to this anyway. The statistics are links without
        // gradients, so forward and backward read the same two per-row values.
        let (w, b) = (weight.map(Tensor::detach), bias.map(Tensor::detach));
        let y = affine(&x.detach(), &mean.detach(), &rstd.detach(), w.as_ref(), b.as_ref());
        let mut links: crate::tensor::Srcs = smallvec::smallvec![x.clone()];
        links.extend(weight.cloned());
        links.extend(bias.cloned());
        let (has_w, has_b) = (weight.is_some(), bias.is_some());
        links.push(mean.detach());
        links.push(rstd.detach());
        // The weight's and bias's gradients sum over the leading dims (an empty list would sum over all).
        let lead: Vec<isize> = (0..(x.rank() - k) as isize).collect();
        let over_lead = move |t: Tensor| if lead.is_empty() { t } else { t.sum(lead.clone(), false) };
        let grad: crate::autograd::GradFn = std::sync::Arc::new(move |g: &Tensor, _, links: &[Tensor], i| {
            let n = links.len();
            let (x, mean, rstd) = (links[0].detach(), &links[n - 2], &links[n - 1]);
            // In terms of x, not of the normalized input as a value of its own: used by two kernels, that would
            // be stored (a pass over the activation written in the forward, read back here). As PyTorch's CPU
            // kernel: with a = mean(gw), s = mean(gw x), dx = rstd (gw - a) - (x - mean) rstd^3 (s - mean a).
            // Links: x, the weight and the bias where given, then mean and 1/std.
            let bias_link = 1 + usize::from(has_w);
            match i {
                0 => {
                    let gw = if has_w { g.mul(links[1].detach()) } else { g.clone() };
                    let a = gw.mean(axes.clone(), true);
                    let s = gw.mul(&x).mean(axes.clone(), true);
                    let c = rstd.mul(rstd).mul(rstd).mul(s.sub(mean.mul(&a)));
                    Some(rstd.mul(gw.sub(&a)).sub(x.sub(mean).mul(c)))
                }
                // In the parameter's dtype (a half weight's gradient is computed in f32 and rounded once).
                1 if has_w => Some(over_lead(g.mul(x.sub(mean).mul(rstd))).to_dtype(links[i].dtype())),
                _ if has_b && i == bias_link => Some(over_lead(g.clone()).to_dtype(links[i].dtype())),
                _ => None,
            }
        });
        y.with_grad_fn(links, grad)
    })
}

/// Dropout (`torch.nn.functional.dropout`): in training, each element is zeroed with probability `p` and the rest
/// are scaled by `1 / (1 - p)`; otherwise the identity. The mask comes from kiln's counter-based `rand` on the
/// calling thread's default generator, so it is reproducible under `kiln::manual_seed`, and drawing a new mask each
/// step does not recompile (the random key is a run-time input of the plan).
#[track_caller]
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Tensor {
    dropout_with(x, p, training, &default_generator())
}

/// `dropout` drawing its mask from `generator`.
#[track_caller]
pub fn dropout_with(x: &Tensor, p: f64, training: bool, generator: &Generator) -> Tensor {
    if !(0.0..=1.0).contains(&p) {
        fail!("dropout", "probability has to be between 0 and 1, but got {p}");
    }
    float_only("dropout", x);
    if !training || p == 0.0 {
        return x.clone();
    }
    if p == 1.0 {
        return x.mul(0.0);
    }
    // rand is uniform in [0, 1): P(u >= p) = 1 - p.
    x.rand_like_with(generator).ge(p).where_(x.mul(1.0 / (1.0 - p)), 0.0)
}

#[track_caller]
fn float_only(name: &str, x: &Tensor) {
    if !x.dtype().is_float() {
        fail!(name, "the input must be a float tensor, not {} (convert with to_dtype)", x.dtype());
    }
}
