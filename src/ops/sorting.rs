//! `sort`, `argsort` and `topk` with PyTorch's semantics, composed from comparisons, reductions and a gather.
//!
//! Each element's place in the sorted order is counted: along the sorted dim, element `i` goes to position `#{j :
//! x[j] before x[i]} + #{j < i : x[j] ties x[i]}` (a stable sort: ties keep their order). The position of every
//! element, then the element of every position (`Σ i · [place(i) = p]`), are two fused reductions over an `n x n`
//! comparison that is never stored, and the values are a gather. NaN sorts above every number, as in PyTorch (last
//! ascending, first descending). Counts are f32 sums of 0/1, exact below 2^24 elements per row.
//!
//! Cost: O(n²) comparisons per row, in three kernels, on every device: nothing to tune and nothing data-dependent
//! in the control flow, which is right for the short rows this is used on (sampling's top-k over a vocabulary of
//! tens to thousands, small sorts); a row of 32k costs a billion comparisons. Not done: a merge or radix sort for
//! long rows.

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

impl Tensor {
    /// The values along `dim` in ascending (or `descending`) order and, for each, its index in `self` (i64, i32 on a
    /// device without 64-bit integers): `torch.sort(stable=True)`. NaN sorts above every number.
    #[track_caller]
    pub fn sort(&self, dim: isize, descending: bool) -> (Tensor, Tensor) {
        let d = resolve_dim("sort", dim, self.rank().max(1));
        if self.rank() == 0 {
            return (self.clone(), self.const_like(0i64, self.device().index_dtype(), &[]));
        }
        let order = self.sort_order(d, descending);
        (self.gather_prim(d, &order), order)
    }

    /// The indices that sort `self` along `dim` (`torch.argsort(stable=True)`): `sort`'s second result.
    #[track_caller]
    pub fn argsort(&self, dim: isize, descending: bool) -> Tensor {
        self.sort(dim, descending).1
    }

    /// The `k` largest (or, with `largest` false, smallest) values along `dim`, in order, and their indices
    /// (`torch.topk(sorted=True)`); of equal values the one at the lower index comes first.
    #[track_caller]
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> (Tensor, Tensor) {
        let d = resolve_dim("topk", dim, self.rank().max(1));
        let n = if self.rank() == 0 { 1 } else { self.dims()[d] };
        if k > n {
            fail!("topk", "k = {k} is larger than dim {d} of shape {:?}", self.dims());
        }
        let (values, indices) = self.sort(dim, largest);
        if self.rank() == 0 {
            return (values, indices);
        }
        (values.narrow(d as isize, 0, k), indices.narrow(d as isize, 0, k))
    }

    /// For each position along `dim` of the sorted result, the index of the element that goes there.
    fn sort_order(&self, d: usize, descending: bool) -> Tensor {
        let n = self.dims()[d];
        let device = self.device();
        let index_dtype = device.index_dtype();
        if n == 0 {
            return self.to_dtype(index_dtype);
        }
        // [.., n (i), n (j), ..]: element i along dim d, each other element j along the new dim d + 1.
        let mut wide = self.dims().to_vec();
        wide.insert(d + 1, n);
        let xi = self.unsqueeze(d as isize + 1).expand_to("sort", &wide);
        let xj = self.unsqueeze(d as isize).expand_to("sort", &wide);
        let before = |a: &Tensor, b: &Tensor| -> Tensor {
            // a sorts strictly before b. NaN is above every number: ascending, a number before NaN; descending,
            // NaN before a number.
            let ordered = if descending { a.gt(b) } else { a.lt(b) };
            if !self.dtype().is_float() {
                return ordered;
            }
            let (a_nan, b_nan) = (a.ne(a), b.ne(b));
            let nan_rule = if descending {
                a_nan.logical_and(b_nan.logical_not())
            } else {
                b_nan.logical_and(a_nan.logical_not())
            };
            ordered.logical_or(nan_rule)
        };
        let ties = |a: &Tensor, b: &Tensor| -> Tensor {
            let eq = a.eq(b);
            if self.dtype().is_float() { eq.logical_or(a.ne(a).logical_and(b.ne(b))) } else { eq }
        };
        let pos = |len: usize, at: usize, rank: usize| {
            let mut dims = vec![1usize; rank];
            dims[at] = len;
            Tensor::iota(Scalar::Float(0.0), Scalar::Float(1.0), len, DType::F32, &device).reshape(dims)
        };
        let r = wide.len();
        let j_earlier = pos(n, d + 1, r).lt(pos(n, d, r));
        let counted = before(&xj, &xi).logical_or(ties(&xj, &xi).logical_and(j_earlier));
        // The place of each i (f32 counts, exact below 2^24): [.., n (i), ..].
        let place = counted.to_dtype(DType::F32).sum([d as isize + 1], false);
        // The element of each place p: Σ_i i [place(i) = p], over [.., n (p), n (i), ..].
        let place_i = place.unsqueeze(d as isize).expand_to("sort", &wide);
        let i = pos(n, d + 1, r).expand_to("sort", &wide);
        let p = pos(n, d, r).expand_to("sort", &wide);
        let hit = place_i.eq(p);
        hit.where_(&i, 0.0).sum([d as isize + 1], false).to_dtype(index_dtype)
    }
}
