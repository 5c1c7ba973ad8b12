//! Reductions composed from the primitive ones, with PyTorch's semantics: `logsumexp`, `var` and `std` (with
//! `correction`), and the vector `norm` (`torch.linalg.vector_norm`). As everywhere in kiln, an empty dims list
//! reduces every dim; half inputs compute in f32 and round once.
//!
//! Each is written so its gradient is the one PyTorch defines where a plain composition's would be NaN: the
//! log-sum-exp's shift by the maximum carries no gradient (it cancels exactly), and a norm of zero has gradient 0
//! (the square root is taken of 1 there and its value selected away).

use crate::args::{Dims, fail, resolve_dims};
use crate::tensor::Tensor;

impl Tensor {
    /// The dims a reduction over `dims` folds (every dim for an empty list or a zero-dim tensor).
    fn folded(&self, name: &str, dims: &impl Dims) -> Vec<usize> {
        let axes = resolve_dims(name, dims, self.rank());
        if dims.to_isize().is_empty() || self.rank() == 0 { (0..self.rank()).collect() } else { axes }
    }

    /// `log(Σ exp(x))` over `dims`, computed as `m + log(Σ exp(x - m))` with `m` the maximum (0 where that is
    /// infinite, as PyTorch: a row of -inf gives -inf, a +inf gives +inf). Bool and int inputs become f32. Over an
    /// empty dim the sum is 0 and the result -inf.
    #[track_caller]
    pub fn logsumexp(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        let axes = self.folded("logsumexp", &dims);
        let x = self.to_float();
        x.in_f32(|x| {
            if axes.iter().any(|&a| x.dims()[a] == 0) {
                return x.exp().sum(axes.clone(), keepdim).log();
            }
            let m = x.max(axes.clone(), true).detach();
            let m = m.abs().eq(f64::INFINITY).where_(0.0, &m);
            let lse = x.sub(&m).exp().sum(axes.clone(), true).log().add(&m);
            if keepdim || axes.is_empty() {
                lse
            } else {
                lse.squeeze(axes.iter().map(|&a| a as isize).collect::<Vec<_>>())
            }
        })
    }

    /// The variance over `dims`: `Σ (x - mean)² / (N - correction)` (PyTorch's `var`; `correction = 1` is Bessel's,
    /// its default). Where `N - correction <= 0` the divisor is 0, so the result is NaN or inf, as PyTorch's. Float
    /// input only.
    #[track_caller]
    pub fn var(&self, dims: impl Dims, correction: f64, keepdim: bool) -> Tensor {
        if !self.dtype().is_float() {
            fail!("var", "the input must be a float tensor, not {} (convert with to_dtype)", self.dtype());
        }
        let axes = self.folded("var", &dims);
        let n: usize = axes.iter().map(|&a| self.dims()[a]).product();
        let divisor = (n as f64 - correction).max(0.0);
        self.in_f32(|x| {
            let d = x.sub(x.mean(axes.clone(), true));
            d.mul(&d).sum(axes.clone(), keepdim).div(divisor)
        })
    }

    /// The standard deviation over `dims`: `var(dims, correction, keepdim).sqrt()`. Its gradient where the
    /// deviation is 0 (a constant input) is 0, as PyTorch's, not `inf * 0 = NaN`.
    #[track_caller]
    pub fn std(&self, dims: impl Dims, correction: f64, keepdim: bool) -> Tensor {
        if !self.dtype().is_float() {
            fail!("std", "the input must be a float tensor, not {} (convert with to_dtype)", self.dtype());
        }
        self.in_f32(|x| root_zero_safe(&x.var(dims, correction, keepdim), Tensor::sqrt))
    }

    /// The `p`-norm over `dims` (`torch.linalg.vector_norm`): `(Σ |x|^p)^(1/p)`; `p = inf` is the largest `|x|`,
    /// `-inf` the smallest, `0` the count of non-zero elements. The gradient at a zero norm is 0, as PyTorch's.
    /// Float input only.
    #[track_caller]
    pub fn norm(&self, p: f64, dims: impl Dims, keepdim: bool) -> Tensor {
        if !self.dtype().is_float() {
            fail!("norm", "the input must be a float tensor, not {} (convert with to_dtype)", self.dtype());
        }
        if p.is_nan() {
            fail!("norm", "p must be a number, got NaN");
        }
        let axes = self.folded("norm", &dims);
        self.in_f32(|x| {
            let a = x.abs();
            if p == f64::INFINITY {
                return a.max(axes.clone(), keepdim);
            }
            if p == f64::NEG_INFINITY {
                return a.min(axes.clone(), keepdim);
            }
            if p == 0.0 {
                return a.ne(0.0).to_dtype(x.dtype()).sum(axes.clone(), keepdim);
            }
            if p == 1.0 {
                return a.sum(axes.clone(), keepdim);
            }
            let s = if p == 2.0 { x.mul(x) } else { a.powf(p) }.sum(axes.clone(), keepdim);
            if p == 2.0 { root_zero_safe(&s, Tensor::sqrt) } else { root_zero_safe(&s, |s| s.powf(1.0 / p)) }
        })
    }
}

/// `root(s)`, and 0 where `s` is 0 with a gradient of 0 there: a root's slope at 0 is infinite, and times the 0
/// slope of the sum of squares it would make the gradient NaN (PyTorch's is 0 for a zero norm or deviation).
fn root_zero_safe(s: &Tensor, root: impl Fn(&Tensor) -> Tensor) -> Tensor {
    let zero = s.eq(0.0);
    zero.where_(0.0, root(&zero.where_(1.0, s)))
}
