//! The smooth and piecewise activations PyTorch users reach for beyond relu/gelu/silu: `softplus`, `elu`, `selu`,
//! `celu`, `mish`, `hardsigmoid`, `hardswish`, `hardtanh`, `relu6`, `prelu`, `logsigmoid`, `glu`, `softsign`,
//! `tanhshrink`, `hardshrink`, `softshrink`, `softmin`, each PyTorch's
//! formula (`torch.nn.functional`), composed from kiln's ops so autograd differentiates them and the fuser sees one
//! elementwise chain. Half inputs compute in f32 and round once.
//!
//! Where one branch of a select would overflow on the elements the other branch takes (`exp(x)` for a large `x` in
//! `softplus`'s and `elu`'s formula branches), that branch reads its argument clamped to where it is taken: the
//! unused value stays finite, so its masked-off gradient is 0 and not `0 * inf = NaN`. The clamp is a select too,
//! so the gradient reaches `x` in full up to the bound.

use super::float_only;
use crate::tensor::Tensor;

/// `log(1 + exp(beta x)) / beta`, and `x` itself where `beta x > threshold` (PyTorch's `softplus`; its defaults
/// are `beta = 1`, `threshold = 20`).
#[track_caller]
pub fn softplus(x: &Tensor, beta: f64, threshold: f64) -> Tensor {
    float_only("softplus", x);
    x.in_f32(|x| {
        let bx = x.mul(beta);
        let linear = bx.gt(threshold);
        let soft = linear.where_(threshold, &bx).exp().log1p().div(beta);
        linear.where_(x, soft)
    })
}

/// `x` where `x > 0`, else `alpha (exp(x) - 1)` (PyTorch's `elu`, default `alpha = 1`).
#[track_caller]
pub fn elu(x: &Tensor, alpha: f64) -> Tensor {
    float_only("elu", x);
    x.in_f32(|x| elu_f(x, alpha, 1.0, 1.0))
}

/// `scale * elu(x, alpha)` with PyTorch's constants (self-normalizing networks, Klambauer et al. 2017).
#[track_caller]
pub fn selu(x: &Tensor) -> Tensor {
    const ALPHA: f64 = 1.673_263_242_354_377_3;
    const SCALE: f64 = 1.050_700_987_355_480_5;
    float_only("selu", x);
    x.in_f32(|x| elu_f(x, ALPHA * SCALE, SCALE, 1.0))
}

/// `x` where `x > 0`, else `alpha (exp(x / alpha) - 1)` (PyTorch's `celu`, default `alpha = 1`).
#[track_caller]
pub fn celu(x: &Tensor, alpha: f64) -> Tensor {
    float_only("celu", x);
    x.in_f32(|x| elu_f(x, alpha, 1.0, 1.0 / alpha))
}

/// `x > 0 ? x * pos : expm1(x * inner) * neg` (PyTorch's elu kernel, its coefficients folded as there), the
/// exponential reading `min(x, 0)` (see the module doc).
fn elu_f(x: &Tensor, neg: f64, pos: f64, inner: f64) -> Tensor {
    let positive = x.gt(0);
    let below = positive.where_(0.0, x);
    let below = if inner == 1.0 { below } else { below.mul(inner) };
    let above = if pos == 1.0 { x.clone() } else { x.mul(pos) };
    positive.where_(above, below.expm1().mul(neg))
}

/// `x tanh(softplus(x))` (PyTorch's `mish`).
#[track_caller]
pub fn mish(x: &Tensor) -> Tensor {
    float_only("mish", x);
    x.in_f32(|x| x.mul(softplus(x, 1.0, 20.0).tanh()))
}

/// `min(max(x + 3, 0), 6) / 6` (PyTorch's `hardsigmoid`, in its order of operations).
#[track_caller]
pub fn hardsigmoid(x: &Tensor) -> Tensor {
    float_only("hardsigmoid", x);
    x.in_f32(|x| x.add(3.0).clamp(0.0, 6.0).div(6.0))
}

/// `x min(max(x + 3, 0), 6) / 6` (PyTorch's `hardswish`, in its order of operations).
#[track_caller]
pub fn hardswish(x: &Tensor) -> Tensor {
    float_only("hardswish", x);
    x.in_f32(|x| x.mul(x.add(3.0).clamp(0.0, 6.0)).div(6.0))
}

/// `log(sigmoid(x))` in the stable form `min(x, 0) - log1p(exp(-|x|))` (PyTorch's `logsigmoid`): finite for every
/// finite `x`, where the naive form is `-inf` below about -104 in f32.
#[track_caller]
pub fn logsigmoid(x: &Tensor) -> Tensor {
    float_only("logsigmoid", x);
    x.in_f32(|x| x.minimum(0.0).sub(x.abs().neg().exp().log1p()))
}

/// The gated linear unit (PyTorch's `glu`): `a * sigmoid(b)` where `a` and `b` are the first and second halves of
/// `x` along `dim`, which must be of even size.
#[track_caller]
pub fn glu(x: &Tensor, dim: isize) -> Tensor {
    float_only("glu", x);
    let d = if dim < 0 { dim + x.rank() as isize } else { dim };
    if d < 0 || d as usize >= x.rank() {
        crate::args::fail!("glu", "dim {dim} is out of range for a {}-d input", x.rank());
    }
    let n = x.dims()[d as usize];
    if !n.is_multiple_of(2) {
        crate::args::fail!("glu", "dim {dim} must have an even size to be halved, got {n}");
    }
    x.narrow(dim, 0, n / 2).mul(x.narrow(dim, n / 2, n / 2).sigmoid())
}

/// `x` clamped to `[min_val, max_val]` (PyTorch's `hardtanh`, defaults -1 and 1; NaN stays NaN), with PyTorch's
/// gradient: 1 strictly inside, 0 at and beyond the bounds.
#[track_caller]
pub fn hardtanh(x: &Tensor, min_val: f64, max_val: f64) -> Tensor {
    float_only("hardtanh", x);
    if min_val.is_nan() || max_val.is_nan() || min_val > max_val {
        crate::args::fail!("hardtanh", "min_val {min_val} must not exceed max_val {max_val}");
    }
    // At and beyond a bound, the bound: a select of a constant, so the gradient there is 0; NaN passes through.
    x.le(min_val).where_(min_val, x.ge(max_val).where_(max_val, x))
}

/// `min(max(x, 0), 6)` (PyTorch's `relu6`, `hardtanh(x, 0, 6)`).
#[track_caller]
pub fn relu6(x: &Tensor) -> Tensor {
    hardtanh(x, 0.0, 6.0)
}

/// `x` where `x > 0`, else `weight · x` (PyTorch's `prelu`): `weight` has one element, or one per channel (dim 1 of
/// `x`, or its only dim), as `nn::PReLU` learns it. The gradient is PyTorch's: `weight` below and at 0.
#[track_caller]
pub fn prelu(x: &Tensor, weight: &Tensor) -> Tensor {
    float_only("prelu", x);
    let n = weight.numel();
    let w = if n == 1 {
        weight.reshape([1usize; 0].to_vec())
    } else {
        let channels = if x.rank() >= 2 { x.dims()[1] } else { x.dims().first().copied().unwrap_or(0) };
        if weight.rank() != 1 || n != channels {
            crate::args::fail!(
                "prelu",
                "the weight must have 1 element or one per channel ({channels} for input {:?}), got {:?}",
                x.dims(),
                weight.dims()
            );
        }
        // One weight per channel, broadcast over the dims after it.
        let mut shape = vec![1usize; x.rank().max(1)];
        shape[if x.rank() >= 2 { 1 } else { 0 }] = n;
        weight.reshape(shape)
    };
    x.gt(0.0).where_(x, x.mul(w))
}

/// `x / (1 + |x|)` (PyTorch's `softsign`).
#[track_caller]
pub fn softsign(x: &Tensor) -> Tensor {
    float_only("softsign", x);
    x.div(x.abs().add(1.0))
}

/// `x - tanh(x)` (PyTorch's `tanhshrink`).
#[track_caller]
pub fn tanhshrink(x: &Tensor) -> Tensor {
    float_only("tanhshrink", x);
    x.sub(x.tanh())
}

/// `x` where `|x| > lambd`, else 0 (PyTorch's `hardshrink`, default `lambd = 0.5`).
#[track_caller]
pub fn hardshrink(x: &Tensor, lambd: f64) -> Tensor {
    float_only("hardshrink", x);
    x.abs().gt(lambd).where_(x, 0.0).to_dtype(x.dtype())
}

/// `x` moved `lambd` toward 0, and 0 within `lambd` of it (PyTorch's `softshrink`, default `lambd = 0.5`).
#[track_caller]
pub fn softshrink(x: &Tensor, lambd: f64) -> Tensor {
    float_only("softshrink", x);
    if lambd.is_nan() || lambd < 0.0 {
        crate::args::fail!("softshrink", "lambd must be >= 0, got {lambd}");
    }
    x.gt(lambd).where_(x.sub(lambd), x.lt(-lambd).where_(x.add(lambd), 0.0)).to_dtype(x.dtype())
}

/// `softmax(-x)` along `dim` (PyTorch's `softmin`).
#[track_caller]
pub fn softmin(x: &Tensor, dim: isize) -> Tensor {
    float_only("softmin", x);
    x.neg().softmax(dim)
}
