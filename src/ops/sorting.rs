//! `sort`, `argsort` and `topk` with PyTorch's semantics, composed from comparisons, reductions and a gather.
//!
//! Each element's place in the sorted order is counted: along the sorted dim, element `i` goes to position `#{j :
//! x[j] before x[i]} + #{j < i : x[j] ties x[i]}` (a stable sort: ties keep their order). The position of every
//! element, then the element of every position (`Σ i · [place(i) = p]`), are two fused reductions over an `n x n`
//! comparison that is never stored, and the values are a gather. NaN sorts above every number, as in PyTorch (last
//! ascending, first descending). Counts are f32 sums of 0/1, exact below 2^24 elements per row.
//!
//! On a device that runs the row sort routine (`Device::sorts_rows`: the CPU, unless the process also compiles its
//! plans for a GPU ahead of time) none of this is built: the sorted dim moves last, the rows are one `Op::SortRows`
//! (`kernel::sort`: a radix or comparison sort per row in the same order; for `topk` a filter against the k best so
//! far, then their sort), and the values are the same gather. Elsewhere (wgpu, CUDA, HIP) the order is composed as
//! follows.
//!
//! Cost: O(n²) comparisons per row, in three kernels, on every device: nothing to tune and nothing data-dependent
//! in the control flow, which is right for short rows. Rows longer than [`BITONIC_MIN`] (a vocabulary's logits for
//! top-k sampling: 32k elements cost a billion comparisons that way) run a bitonic sorting network instead
//! ([`Tensor::bitonic_order`]): the row padded to a power of two `N`, `log2(N) (log2(N) + 1) / 2` compare-exchange
//! stages of a few kernels each, O(N log² N) work. Each stage carries only the indices: slot `i` and its partner
//! `i ^ j` read their values through a gather of the input, compare them in the same total order (value, then
//! index, so the result is the stable sort's; padding slots, indices `>= n`, after everything) and keep the earlier
//! or the later as the slot's place in its block says. Both paths give the same indices. Not done: a routine for the
//! GPU devices (the CPU's is Rust; a GPU one would be a block per row in each dialect).

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::{DType, Op, Scalar, Shape};

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
        if n > MAX_ROW {
            fail!("topk", "dim {d} has {n} elements; rows of more than 2^24 elements are not supported");
        }
        if self.rank() > 0 && n > 0 && self.device().sorts_rows() {
            let order = self.routine_order(d, largest, k);
            return (self.gather_prim(d, &order), order);
        }
        let (values, indices) = self.sort(dim, largest);
        if self.rank() == 0 {
            return (values, indices);
        }
        (values.narrow(d as isize, 0, k), indices.narrow(d as isize, 0, k))
    }

    /// For each position along `dim` of the sorted result, the index of the element that goes there.
    #[track_caller]
    fn sort_order(&self, d: usize, descending: bool) -> Tensor {
        let n = self.dims()[d];
        let device = self.device();
        let index_dtype = device.index_dtype();
        if n == 0 {
            return self.to_dtype(index_dtype);
        }
        if n > MAX_ROW {
            fail!("sort", "dim {d} has {n} elements; rows of more than 2^24 elements are not supported");
        }
        if device.sorts_rows() {
            return self.routine_order(d, descending, n);
        }
        if n > BITONIC_MIN {
            return self.bitonic_order(d, descending);
        }
        // [.., n (i), n (j), ..]: element i along dim d, each other element j along the new dim d + 1.
        let mut wide = self.dims().to_vec();
        wide.insert(d + 1, n);
        let xi = self.unsqueeze(d as isize + 1).expand_to("sort", &wide);
        let xj = self.unsqueeze(d as isize).expand_to("sort", &wide);
        let pos = |len: usize, at: usize, rank: usize| {
            let mut dims = vec![1usize; rank];
            dims[at] = len;
            Tensor::iota(Scalar::Float(0.0), Scalar::Float(1.0), len, DType::F32, &device).reshape(dims)
        };
        let r = wide.len();
        let j_earlier = pos(n, d + 1, r).lt(pos(n, d, r));
        let counted = sorts_before(&xj, &xi, &j_earlier, descending);
        // The place of each i (f32 counts, exact below 2^24): [.., n (i), ..].
        let place = counted.to_dtype(DType::F32).sum([d as isize + 1], false);
        // The element of each place p: Σ_i i [place(i) = p], over [.., n (p), n (i), ..].
        let place_i = place.unsqueeze(d as isize).expand_to("sort", &wide);
        let i = pos(n, d + 1, r).expand_to("sort", &wide);
        let p = pos(n, d, r).expand_to("sort", &wide);
        let hit = place_i.eq(p);
        hit.where_(&i, 0.0).sum([d as isize + 1], false).to_dtype(index_dtype)
    }

    /// The first `keep` positions of [`Tensor::sort_order`] along `d`, through the row sort routine: `d` moved
    /// last, the other dims flattened into rows.
    fn routine_order(&self, d: usize, descending: bool, keep: usize) -> Tensor {
        let last = self.rank() - 1;
        let moved = self.transpose(d as isize, last as isize);
        let mut dims = moved.dims().to_vec();
        let n = dims[last];
        dims[last] = keep;
        let rows = dims[..last].iter().product::<usize>();
        let index_dtype = self.device().index_dtype();
        if rows == 0 || keep == 0 {
            return Tensor::zeros(dims, index_dtype, &self.device()).transpose(d as isize, last as isize);
        }
        let srcs = smallvec::smallvec![moved.reshape([rows, n])];
        let order = Tensor::from_op(Op::SortRows { descending, keep }, srcs, Shape::new([rows, keep]), index_dtype);
        order.reshape(dims).transpose(d as isize, last as isize)
    }

    /// [`Tensor::sort_order`] through a bitonic network (see the module doc): `self` sorted along `d`, whose length
    /// `n` pads to `big`, a power of two.
    fn bitonic_order(&self, d: usize, descending: bool) -> Tensor {
        let n = self.dims()[d];
        let big = n.next_power_of_two();
        let index_dtype = self.device().index_dtype();
        let mut wide = self.dims().to_vec();
        wide[d] = big;
        let mut at = vec![1usize; self.rank()];
        at[d] = big;
        // Slot positions along `d`, f32 (exact: `big <= MAX_ROW`); `bit(s)` is bit `log2(s)` of each, 0 or 1.
        let slot = Tensor::iota(Scalar::Float(0.0), Scalar::Float(1.0), big, DType::F32, &self.device()).reshape(at);
        let bit = |s: usize| {
            let q = slot.mul(1.0 / s as f64).floor();
            q.sub(q.mul(0.5).floor().mul(2.0))
        };
        let index = |t: &Tensor| t.to_dtype(index_dtype).expand_to("sort", &wide);
        // Which element each slot holds: its own to start with, the padding slots `n..big` included.
        let mut held = index(&slot);
        // The value of the element a slot holds (a padding slot reads element n - 1, never compared: see `first`).
        let value = |h: &Tensor| self.gather_prim(d, &h.lt(n as i64).where_(h, (n - 1) as i64));
        let mut k = 2;
        while k <= big {
            let mut j = k / 2;
            while j >= 1 {
                // Partner `i ^ j`: `i + j` where bit j of `i` is 0, `i - j` where it is 1. A gather rather than
                // the same as index math (`d` split as [big / 2j, 2, j], the middle axis flipped): those kernels
                // divided per element and took 1.5x as long (4 rows of 4096: 18-19 against 12-13 ms).
                let partner = index(&slot.add(bit(j).mul(-2.0 * j as f64).add(j as f64)));
                let theirs = held.gather_prim(d, &partner);
                let (a, b) = (value(&held), value(&theirs));
                // The element this slot holds sorts before its partner's: by value, ties by index; the padding
                // (indices >= n) after everything.
                let ordered = sorts_before(&a, &b, &held.lt(&theirs), descending);
                let first = held.lt(n as i64).logical_and(theirs.ge(n as i64).logical_or(ordered));
                // A slot keeps the earlier of the pair where bit j of its position equals bit k (the lower slot of
                // a block in ascending order, the upper of one in descending order), the later elsewhere; at the
                // last merge (k = big) bit k is 0 everywhere, so the row ends in that order.
                let keeps_first = bit(j).eq(bit(k)).expand_to("sort", &wide);
                held = keeps_first.eq(&first).where_(&held, &theirs);
                j /= 2;
            }
            k *= 2;
        }
        held.narrow(d as isize, 0, n)
    }
}

/// Rows longer than this sort through the bitonic network. Measured on one row (two threads): 2049 elements (4096
/// slots, 78 stages) 9-14 ms a call against the quadratic form's ~20 at 2048, though its first call (the stages'
/// compile) takes ~100 ms against ~30; 8192 elements 10 against 333 ms; 32000 (a vocabulary) 47-70 against 4600.
pub(crate) const BITONIC_MIN: usize = 2048;

/// Longest row either form sorts: positions and counts are f32, exact below 2^24.
const MAX_ROW: usize = 1 << 24;

/// The sort's total order, which both forms use: `a` goes before `b` by value, and among ties where `a_earlier` (the
/// element of `a` comes earlier in the row), so the result is the stable sort's.
fn sorts_before(a: &Tensor, b: &Tensor, a_earlier: &Tensor, descending: bool) -> Tensor {
    key_before(a, b, descending).logical_or(key_ties(a, b).logical_and(a_earlier))
}

/// `a` sorts strictly before `b` by value. NaN is above every number: ascending, a number before NaN; descending,
/// NaN before a number.
fn key_before(a: &Tensor, b: &Tensor, descending: bool) -> Tensor {
    let ordered = if descending { a.gt(b) } else { a.lt(b) };
    if !a.dtype().is_float() {
        return ordered;
    }
    let (a_nan, b_nan) = (a.ne(a), b.ne(b));
    let nan_rule =
        if descending { a_nan.logical_and(b_nan.logical_not()) } else { b_nan.logical_and(a_nan.logical_not()) };
    ordered.logical_or(nan_rule)
}

/// `a` and `b` tie in the sort's order: equal, or both NaN.
fn key_ties(a: &Tensor, b: &Tensor) -> Tensor {
    let eq = a.eq(b);
    if a.dtype().is_float() { eq.logical_or(a.ne(a).logical_and(b.ne(b))) } else { eq }
}
