//! Reductions over dims (`keepdim` as in PyTorch) and over everything (`*_all`, giving a zero-dim tensor).
//!
//! dtypes follow PyTorch: `sum`/`prod` of bool or ints accumulate and return i64; `mean` needs a float input;
//! `max`/`min` keep the dtype, propagate NaN, and reject an empty reduced dim; `argmax`/`argmin` return i64, pick
//! the first extreme element, and point at the first NaN if there is one. As in PyTorch, an empty dims list
//! reduces every dim. `argmax`/`argmin` are compositions (max, compare, iota, max), not primitives.

use crate::args::{Dims, fail, resolve_dim, resolve_dims};
use crate::tensor::Tensor;
use kiln_jit::{Op, ReduceOp, Scalar, Shape};

impl Tensor {
    #[track_caller]
    fn reduce(&self, name: &str, op: ReduceOp, dims: &impl Dims, keepdim: bool) -> Tensor {
        let rank = self.rank();
        let mut axes = resolve_dims(name, dims, rank);
        // Reducing a zero-dim tensor over its pseudo-dim (0 or -1) is the identity, as in PyTorch; its dims()
        // has no entry to index.
        if dims.to_isize().is_empty() || rank == 0 {
            axes = (0..rank).collect();
        }
        if matches!(op, ReduceOp::Max | ReduceOp::Min)
            && let Some(&a) = axes.iter().find(|&&a| self.dims()[a] == 0)
        {
            fail!(name, "cannot take the {name} over dim {a} of shape {:?}: it is empty", self.dims());
        }
        let src = match op {
            // i64 as PyTorch; i32 on a device without 64-bit integers (wgpu), wrapping past 2^31.
            ReduceOp::Sum | ReduceOp::Prod if !self.dtype().is_float() => self.to_dtype(self.device().index_dtype()),
            _ => self.clone(),
        };
        if axes.is_empty() {
            return src; // a zero-dim tensor reduced over its only "dim"
        }
        let mut kept = self.dims().to_vec();
        for &a in &axes {
            kept[a] = 1;
        }
        let dtype = src.dtype();
        let reduced = Tensor::from_op(
            Op::Reduce { op, axes: axes.clone() },
            smallvec::smallvec![src],
            Shape::new(kept.clone()),
            dtype,
        );
        if keepdim {
            return reduced;
        }
        let dropped: Vec<usize> = kept.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        reduced.reshape_prim(dropped)
    }

    /// Sum over `dims` (bool and ints sum to i64, or to i32 on a device without 64-bit integers).
    #[track_caller]
    pub fn sum(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.reduce("sum", ReduceOp::Sum, &dims, keepdim)
    }

    /// Sum of every element, as a zero-dim tensor.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.reduce("sum", ReduceOp::Sum, &Vec::<usize>::new(), false)
    }

    /// Product over `dims` (bool and ints multiply to i64).
    #[track_caller]
    pub fn prod(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.reduce("prod", ReduceOp::Prod, &dims, keepdim)
    }

    #[track_caller]
    pub fn prod_all(&self) -> Tensor {
        self.reduce("prod", ReduceOp::Prod, &Vec::<usize>::new(), false)
    }

    /// Maximum over `dims` (values only; `argmax` gives indices). NaN propagates.
    #[track_caller]
    pub fn max(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.reduce("max", ReduceOp::Max, &dims, keepdim)
    }

    #[track_caller]
    pub fn max_all(&self) -> Tensor {
        self.reduce("max", ReduceOp::Max, &Vec::<usize>::new(), false)
    }

    /// Minimum over `dims` (values only; `argmin` gives indices). NaN propagates.
    #[track_caller]
    pub fn min(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.reduce("min", ReduceOp::Min, &dims, keepdim)
    }

    #[track_caller]
    pub fn min_all(&self) -> Tensor {
        self.reduce("min", ReduceOp::Min, &Vec::<usize>::new(), false)
    }

    /// Mean over `dims`; the input must be float (as in PyTorch). An empty reduction gives NaN.
    #[track_caller]
    pub fn mean(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.mean_impl(&dims, keepdim)
    }

    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        self.mean_impl(&Vec::<usize>::new(), false)
    }

    #[track_caller]
    fn mean_impl(&self, dims: &impl Dims, keepdim: bool) -> Tensor {
        if !self.dtype().is_float() {
            fail!("mean", "the input must be a float tensor, not {} (convert with to_dtype)", self.dtype());
        }
        let mut axes = resolve_dims("mean", dims, self.rank());
        if dims.to_isize().is_empty() || self.rank() == 0 {
            axes = (0..self.rank()).collect();
        }
        let count: usize = axes.iter().map(|&a| self.dims()[a]).product();
        // f16 in f32, as PyTorch: the sum (accumulated in f32 either way) divided in f32, then rounded to f16 once. In
        // f16 a count past 65504 is inf (the mean of 100000 ones read NaN) and the sum is rounded before dividing.
        self.in_f32(|x| x.reduce("mean", ReduceOp::Sum, dims, keepdim).div(count as f64))
    }

    /// Index of the maximum along `dim` (the first one; the first NaN if any), as i64 (i32 on a device without
    /// 64-bit integers, wgpu: the indices are far below 2^31).
    #[track_caller]
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Tensor {
        self.arg_extreme("argmax", ReduceOp::Max, dim, keepdim)
    }

    /// Index of the minimum along `dim` (the first one; the first NaN if any), as i64 (i32 on wgpu, as `argmax`).
    #[track_caller]
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Tensor {
        self.arg_extreme("argmin", ReduceOp::Min, dim, keepdim)
    }

    /// Flat index of the maximum over all elements, as a zero-dim i64 tensor (i32 on wgpu, as `argmax`).
    #[track_caller]
    pub fn argmax_all(&self) -> Tensor {
        self.reshape([-1]).arg_extreme("argmax", ReduceOp::Max, 0, false)
    }

    /// Flat index of the minimum over all elements, as a zero-dim i64 tensor (i32 on wgpu, as `argmax`).
    #[track_caller]
    pub fn argmin_all(&self) -> Tensor {
        self.reshape([-1]).arg_extreme("argmin", ReduceOp::Min, 0, false)
    }

    #[track_caller]
    fn arg_extreme(&self, name: &str, op: ReduceOp, dim: isize, keepdim: bool) -> Tensor {
        if self.rank() == 0 {
            resolve_dim(name, dim, 0);
            return self.const_like(0i64, self.device().index_dtype(), &[]);
        }
        let d = resolve_dim(name, dim, self.rank());
        let n = self.dims()[d];
        if n == 0 {
            fail!(name, "cannot take the {name} over dim {d} of shape {:?}: it is empty", self.dims());
        }
        let extreme = self.reduce(name, op, &(d as isize), true);
        let mut hit = self.eq(&extreme);
        if self.dtype().is_float() {
            hit = hit.logical_or(self.ne(self)); // NaN is the extreme, as in PyTorch
        }
        // Score n - i at hits, 0 elsewhere; the max score is n - (first hit).
        let mut iota_dims = vec![1; self.rank()];
        iota_dims[d] = n;
        let iota = Tensor::iota(Scalar::Int(n as i64), Scalar::Int(-1), n, self.device().index_dtype(), &self.device());
        let score = hit.where_(iota.reshape_prim(iota_dims), 0i64);
        score.reduce(name, ReduceOp::Max, &(d as isize), keepdim).rsub(n as i64)
    }
}
