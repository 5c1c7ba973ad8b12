//! `cumsum` and `cumprod` with PyTorch's semantics (integers and bools accumulate in i64, f16 and bf16 in f32 with
//! one rounding per output), composed from the primitives.
//!
//! A row of up to [`FUSED_MAX`] elements is one fused reduction: output `i` folds `x[j]` for `j <= i` of the row
//! broadcast against itself (the `n x n` masked view is never stored), each output summed in order from `j = 0`,
//! as a sequential scan sums. Longer rows take `log2(n)` doubling passes (Hillis-Steele: `y[i] += y[i - s]` for
//! `s = 1, 2, 4, ..`), O(n log n) in as many kernels, the sums in a tree order.

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::{DType, ReduceOp, Scalar};

/// Longest row scanned as one fused reduction (O(n²) work: 1024² = 1M folds per row).
pub const FUSED_MAX: usize = 1024;

impl Tensor {
    /// Running sums along `dim` (`torch.cumsum`): `out[i] = x[0] + .. + x[i]`. Integers and bools give i64 (i32 on
    /// a device without 64-bit integers), floats keep their dtype (f16 and bf16 summed in f32, each output rounded
    /// once).
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Tensor {
        self.cumulative("cumsum", dim, ReduceOp::Sum)
    }

    /// Running products along `dim` (`torch.cumprod`), dtypes as [`Tensor::cumsum`]. Its gradient is PyTorch's,
    /// zeros included: at a zero, the product of the other factors (`prod`'s rule), not a division by it.
    #[track_caller]
    pub fn cumprod(&self, dim: isize) -> Tensor {
        self.cumulative("cumprod", dim, ReduceOp::Prod)
    }

    #[track_caller]
    fn cumulative(&self, name: &str, dim: isize, op: ReduceOp) -> Tensor {
        let d = resolve_dim(name, dim, self.rank().max(1));
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(self.device().index_dtype()) };
        if self.rank() == 0 || self.dims()[d] <= 1 {
            return x;
        }
        if !matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
            fail!(name, "a running {op:?} is not a cumulative op here");
        }
        x.in_f32(|x| if x.dims()[d] <= FUSED_MAX { fused_scan(x, d, op) } else { doubling_scan(x, d, op) })
    }
}

/// One reduction over `[.., n (i), n (j), ..]` of `x[j]` where `j <= i`, the identity elsewhere.
fn fused_scan(x: &Tensor, d: usize, op: ReduceOp) -> Tensor {
    let n = x.dims()[d];
    let device = x.device();
    let mut wide = x.dims().to_vec();
    wide.insert(d + 1, n);
    let pos = |at: usize| {
        let mut dims = vec![1usize; wide.len()];
        dims[at] = n;
        Tensor::iota(Scalar::Int(0), Scalar::Int(1), n, DType::I32, &device).reshape(dims)
    };
    let keep = pos(d + 1).le(pos(d));
    let xj = x.unsqueeze(d as isize).expand_to("cumulative", &wide);
    let identity = op.identity(x.dtype());
    let vals = keep.where_(&xj, Tensor::full(wide.clone(), identity, x.dtype(), &device));
    match op {
        ReduceOp::Prod => vals.prod([d as isize + 1], false),
        _ => vals.sum([d as isize + 1], false),
    }
}

/// `log2(n)` passes of `y = y op (y shifted by s along d, the identity shifted in)`, s doubling.
fn doubling_scan(x: &Tensor, d: usize, op: ReduceOp) -> Tensor {
    let n = x.dims()[d];
    let identity = op.identity(x.dtype());
    let mut y = x.clone();
    let mut s = 1;
    while s < n {
        let mut pads = vec![(0, 0); y.rank()];
        pads[d] = (s, 0);
        let shifted = y.narrow(d as isize, 0, n - s).pad_prim(pads, identity);
        y = match op {
            ReduceOp::Prod => y.mul(&shifted),
            _ => y.add(&shifted),
        };
        s *= 2;
    }
    y
}
