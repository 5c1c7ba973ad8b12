//! PyTorch ops that are short compositions of kiln's: the blends `lerp`, `addcmul`, `addcdiv`, `logaddexp` and
//! `logit`; the float tests `isnan`, `isinf`, `isfinite`, `isclose` (and `allclose`, which reads its answer back);
//! `nan_to_num`, `nansum`, `nanmean`; the truth reductions `any`, `all`, `count_nonzero` and `logical_xor`; the views
//! `movedim`, `expand_as`, `repeat_interleave`, `unbind`, `meshgrid`; and the matrix helpers `diagonal`, `diag`,
//! `trace`, `outer`. Each follows PyTorch's formula, rounding order included where it has one (`lerp`'s two
//! branches), so the values agree to the last bit where the ops do; values PyTorch printed are checked in
//! `tests/nn/extras.rs` (`tensor_extras_match_pytorch`, `tests/fixtures/tensor_extras.py`).

use crate::args::{Dims, fail, resolve_dim};
use crate::error::Result;
use crate::ops::Operand;
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

/// The largest finite value of a float dtype.
fn finite_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

impl Tensor {
    /// `self + weight (end - self)` (`torch.lerp`), computed as PyTorch does: `end - (end - self)(1 - weight)` where
    /// `|weight| >= 0.5`, so both ends are reached exactly.
    #[track_caller]
    pub fn lerp(&self, end: &Tensor, weight: impl Into<Operand>) -> Tensor {
        let diff = end.sub(self);
        match weight.into() {
            Operand::Scalar(w) if w.as_f64().abs() < 0.5 => self.add(diff.mul(Operand::Scalar(w))),
            Operand::Scalar(w) => end.sub(diff.mul(1.0 - w.as_f64())),
            Operand::Tensor(w) => {
                let near_start = w.abs().lt(0.5);
                near_start.where_(self.add(diff.mul(&w)), end.sub(diff.mul(w.neg().add(1.0))))
            }
        }
    }

    /// `self + value · t1 · t2` (`torch.addcmul`).
    #[track_caller]
    pub fn addcmul(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Tensor {
        self.add(t1.mul(value).mul(t2))
    }

    /// `self + value · t1 / t2` (`torch.addcdiv`).
    #[track_caller]
    pub fn addcdiv(&self, t1: &Tensor, t2: &Tensor, value: f64) -> Tensor {
        self.add(t1.mul(value).div(t2))
    }

    /// Where the elements are NaN (`torch.isnan`; false for every integer).
    pub fn isnan(&self) -> Tensor {
        self.ne(self)
    }

    /// Where the elements are +-infinity (`torch.isinf`).
    pub fn isinf(&self) -> Tensor {
        if self.dtype().is_float() { self.abs().eq(f64::INFINITY) } else { self.ne(self) }
    }

    /// Where the elements are finite (`torch.isfinite`).
    pub fn isfinite(&self) -> Tensor {
        if self.dtype().is_float() { self.abs().lt(f64::INFINITY) } else { self.eq(self) }
    }

    /// Where `self` and `other` are close (`torch.isclose`): equal (infinities of one sign included), or both finite
    /// with `|self - other| <= atol + rtol |other|`; NaN is close to NaN only with `equal_nan`. PyTorch's defaults
    /// are `rtol = 1e-5`, `atol = 1e-8`.
    #[track_caller]
    pub fn isclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Tensor {
        if !(rtol >= 0.0 && atol >= 0.0) {
            fail!("isclose", "rtol and atol must be >= 0, got {rtol} and {atol}");
        }
        let mut close = self.eq(other);
        if equal_nan {
            close = close.logical_or(self.isnan().logical_and(other.isnan()));
        }
        if rtol == 0.0 && atol == 0.0 {
            return close;
        }
        let error = self.sub(other).abs();
        close.logical_or(error.isfinite().logical_and(error.le(other.abs().mul(rtol).add(atol))))
    }

    /// Whether every element is [`isclose`](Tensor::isclose) (`torch.allclose`): realizes both tensors' comparison
    /// and reads the answer back.
    #[track_caller]
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Result<bool> {
        let far = self.isclose(other, rtol, atol, equal_nan).logical_not().to_dtype(DType::I32).sum_all();
        Ok(far.to_dtype(DType::I32).to_vec::<i32>()?.first().is_none_or(|&n| n == 0))
    }

    /// NaN, +infinity and -infinity replaced by `nan`, `posinf` and `neginf` (`torch.nan_to_num`; `None`: the
    /// dtype's largest and lowest finite values). Integers pass through.
    #[track_caller]
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Tensor {
        if !self.dtype().is_float() {
            return self.clone();
        }
        let max = finite_max(self.dtype());
        let x = self.isnan().where_(nan, self);
        let x = x.eq(f64::INFINITY).where_(posinf.unwrap_or(max), &x);
        x.eq(f64::NEG_INFINITY).where_(neginf.unwrap_or(-max), &x)
    }

    /// `log(exp(self) + exp(other))` without overflow (`torch.logaddexp`): `max + log1p(exp(-|self - other|))`, and
    /// the common value where both are the same infinity.
    #[track_caller]
    pub fn logaddexp(&self, other: &Tensor) -> Tensor {
        let m = self.maximum(other);
        let same_inf = self.isinf().logical_and(self.eq(other));
        same_inf.where_(self, m.add(self.sub(other).abs().neg().exp().log1p()))
    }

    /// `log(x / (1 - x))` (`torch.logit`), the input first clamped to `[eps, 1 - eps]` where `eps` is given.
    /// Without `eps` its gradient at 0 and 1 is `+inf`, as PyTorch's `g / (x (1 - x))` (the composition's was NaN).
    #[track_caller]
    pub fn logit(&self, eps: Option<f64>) -> Tensor {
        if !self.dtype().is_float() {
            fail!("logit", "the input must be a float tensor, not {}", self.dtype());
        }
        let x = match eps {
            Some(e) => self.clamp(e, 1.0 - e),
            None => self.clone(),
        };
        let forward = |x: &Tensor| x.div(x.neg().add(1.0)).log();
        match eps {
            // The clamp's own gradient (0 outside the bounds) is PyTorch's there.
            Some(_) => forward(&x),
            None => crate::autograd::unary_with_rule(self, forward, |g, _, x| g.div(x.mul(x.neg().add(1.0)))),
        }
    }

    /// The sum over `dims` with NaN counted as zero (`torch.nansum`).
    #[track_caller]
    pub fn nansum(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.isnan().where_(0.0, self).to_dtype(self.dtype()).sum(dims, keepdim)
    }

    /// The mean over `dims` of the elements that are not NaN (`torch.nanmean`; NaN where every one is).
    #[track_caller]
    pub fn nanmean(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        if !self.dtype().is_float() {
            fail!("nanmean", "the input must be a float tensor, not {}", self.dtype());
        }
        let kept = self.isnan().logical_not().to_dtype(self.dtype());
        let dims = dims.to_isize();
        self.nansum(dims.clone(), keepdim).div(kept.sum(dims, keepdim))
    }

    /// Whether any element over `dims` is nonzero (`torch.any`; false over no elements).
    #[track_caller]
    pub fn any(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.count_nonzero_as(dims, keepdim, DType::I32).gt(0)
    }

    /// Whether every element over `dims` is nonzero (`torch.all`; true over no elements).
    #[track_caller]
    pub fn all(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.ne(0).logical_not().any(dims, keepdim).logical_not()
    }

    /// The nonzero elements' count over `dims` (`torch.count_nonzero`), in the device's index dtype (i64, or i32
    /// where the device has no 64-bit integers).
    #[track_caller]
    pub fn count_nonzero(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.count_nonzero_as(dims, keepdim, self.device().index_dtype())
    }

    fn count_nonzero_as(&self, dims: impl Dims, keepdim: bool, dtype: DType) -> Tensor {
        self.ne(0).to_dtype(dtype).sum(dims, keepdim)
    }

    /// Where exactly one of `self` and `other` is nonzero (`torch.logical_xor`).
    #[track_caller]
    pub fn logical_xor(&self, other: &Tensor) -> Tensor {
        self.ne(0).ne(other.ne(0))
    }

    /// Dim `source` moved to position `destination`, the others keeping their order (`torch.movedim`): a view.
    #[track_caller]
    pub fn movedim(&self, source: isize, destination: isize) -> Tensor {
        let r = self.rank();
        let (s, d) = (resolve_dim("movedim", source, r), resolve_dim("movedim", destination, r));
        let mut order: Vec<isize> = (0..r as isize).filter(|&i| i != s as isize).collect();
        order.insert(d, s as isize);
        self.permute(order)
    }

    /// `self` broadcast to `other`'s shape (`Tensor.expand_as`): a view.
    #[track_caller]
    pub fn expand_as(&self, other: &Tensor) -> Tensor {
        self.broadcast_to(other.dims().to_vec())
    }

    /// Each element repeated `repeats` times along `dim`, in place (`torch.repeat_interleave` with one count):
    /// `[a, b]` becomes `[a, a, b, b]`. A broadcast view reshaped, so no copy until something stores it.
    #[track_caller]
    pub fn repeat_interleave(&self, repeats: usize, dim: isize) -> Tensor {
        let r = self.rank().max(1);
        let x = if self.rank() == 0 { self.reshape([1]) } else { self.clone() };
        let d = resolve_dim("repeat_interleave", dim, r);
        let mut expanded = x.dims().to_vec();
        expanded.insert(d + 1, repeats);
        let mut merged = x.dims().to_vec();
        merged[d] *= repeats;
        x.unsqueeze(d as isize + 1).expand(expanded).reshape(merged)
    }

    /// The slices along `dim`, each without that dim (`torch.unbind`).
    #[track_caller]
    pub fn unbind(&self, dim: isize) -> Vec<Tensor> {
        let d = resolve_dim("unbind", dim, self.rank());
        (0..self.dims()[d]).map(|i| self.narrow(dim, i, 1).squeeze(d as isize)).collect()
    }

    /// Coordinate grids of 1-d tensors (`torch.meshgrid`): output `i` holds tensor `i`'s values along its own dim of
    /// the grid, as broadcast views. `xy` indexing (`indexing="xy"`, Cartesian) swaps the first two dims of the
    /// grid; `ij` (matrix) keeps the tensors' order.
    #[track_caller]
    pub fn meshgrid(tensors: &[&Tensor], xy: bool) -> Vec<Tensor> {
        if let Some(t) = tensors.iter().find(|t| t.rank() != 1) {
            fail!("meshgrid", "takes 1-d tensors, got one of shape {:?}", t.dims());
        }
        let mut shape: Vec<usize> = tensors.iter().map(|t| t.dims()[0]).collect();
        // The grid dim each tensor varies along.
        let mut along: Vec<usize> = (0..tensors.len()).collect();
        if xy && tensors.len() >= 2 {
            shape.swap(0, 1);
            along.swap(0, 1);
        }
        tensors
            .iter()
            .zip(along)
            .map(|(t, d)| {
                let mut view = vec![1usize; shape.len()];
                view[d] = shape[d];
                t.reshape(view).expand(shape.clone())
            })
            .collect()
    }

    /// The diagonal of the matrices in dims `dim1` and `dim2` (`torch.diagonal`), `offset` above (positive) or below
    /// (negative) the main one, as a new last dim; the other dims keep their order. A gather, so its gradient is
    /// the scatter back.
    #[track_caller]
    pub fn diagonal(&self, offset: i64, dim1: isize, dim2: isize) -> Tensor {
        let r = self.rank();
        if r < 2 {
            fail!("diagonal", "needs at least 2 dims, got {:?}", self.dims());
        }
        let (d1, d2) = (resolve_dim("diagonal", dim1, r), resolve_dim("diagonal", dim2, r));
        if d1 == d2 {
            fail!("diagonal", "dim1 and dim2 are the same dim {d1}");
        }
        let mut order: Vec<usize> = (0..r).filter(|&d| d != d1 && d != d2).collect();
        order.extend([d1, d2]);
        let m = self.permute(order.iter().map(|&d| d as isize).collect::<Vec<_>>());
        let (rows, cols) = (self.dims()[d1], self.dims()[d2]);
        let (row0, col0) = ((-offset).max(0) as usize, offset.max(0) as usize);
        let len = rows.saturating_sub(row0).min(cols.saturating_sub(col0));
        let mut flat = m.dims()[..r - 2].to_vec();
        flat.push(rows * cols);
        let at: Vec<i32> = (0..len).map(|k| ((row0 + k) * cols + col0 + k) as i32).collect();
        let at = Tensor::from_vec(at, [len], &self.device())
            .unwrap_or_else(|e| fail!("diagonal", "the diagonal's positions: {e}"));
        m.reshape(flat).index_select(-1, &at)
    }

    /// A 1-d tensor as the `offset`-th diagonal of a square matrix of zeros, or a 2-d tensor's `offset`-th diagonal
    /// (`torch.diag`).
    #[track_caller]
    pub fn diag(&self, offset: i64) -> Tensor {
        match self.rank() {
            1 => {
                let len = self.dims()[0];
                let n = len + offset.unsigned_abs() as usize;
                let row0 = (-offset).max(0) as usize;
                let dev = self.device();
                // Row i reads element i - row0 (clamped: rows without one are masked out below) ...
                let rows: Vec<i32> = (0..n).map(|i| i.saturating_sub(row0).min(len.saturating_sub(1)) as i32).collect();
                let rows = Tensor::from_vec(rows, [n], &dev).unwrap_or_else(|e| fail!("diag", "the rows: {e}"));
                // ... and keeps it at column i + offset: a select, not a product with a 0/1 mask (inf * 0 = NaN).
                let at = Tensor::iota(Scalar::Int(0), Scalar::Int(1), n, dev.index_dtype(), &dev);
                let on = at.unsqueeze(0).sub(at.unsqueeze(1)).eq(offset);
                if len == 0 {
                    return Tensor::zeros([n, n], self.dtype(), &dev);
                }
                on.where_(self.index_select(0, &rows).unsqueeze(1), 0.0).to_dtype(self.dtype())
            }
            2 => self.diagonal(offset, 0, 1),
            _ => fail!("diag", "takes a 1-d or 2-d tensor, got {:?}", self.dims()),
        }
    }

    /// The sum of a matrix's main diagonal (`torch.trace`).
    #[track_caller]
    pub fn trace(&self) -> Tensor {
        if self.rank() != 2 {
            fail!("trace", "takes a matrix, got {:?}", self.dims());
        }
        self.diagonal(0, 0, 1).sum_all()
    }

    /// `self[i] · other[j]` for 1-d tensors (`torch.outer`).
    #[track_caller]
    pub fn outer(&self, other: &Tensor) -> Tensor {
        if self.rank() != 1 || other.rank() != 1 {
            fail!("outer", "takes two 1-d tensors, got {:?} and {:?}", self.dims(), other.dims());
        }
        self.unsqueeze(1).mul(other.unsqueeze(0))
    }
}
