//! `matmul` with PyTorch's rank rules and batch broadcasting, and the softmax family as compositions.

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::dtype::result_type;
use kiln_jit::shape::broadcast_shape;
use kiln_jit::{DType, Op, Priority, Shape};

impl Tensor {
    /// Matrix product (`torch.matmul`): 1-D x 1-D is a dot product, a 1-D operand is treated as a row (left) or
    /// column (right) vector and that dim is dropped again, and leading batch dims broadcast.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        let (ra, rb) = (self.rank(), rhs.rank());
        if ra == 0 || rb == 0 {
            fail!("matmul", "both operands need at least one dim, got shapes {:?} and {:?}", self.dims(), rhs.dims());
        }
        let dtype = result_type(&[(self.dtype(), Priority::Tensor), (rhs.dtype(), Priority::Tensor)]);
        if dtype == DType::Bool {
            fail!("matmul", "bool operands are not supported; cast to an int or float dtype");
        }
        let a = if ra == 1 { self.unsqueeze(0) } else { self.clone() };
        let b = if rb == 1 { rhs.unsqueeze(1) } else { rhs.clone() };
        let (ad, bd) = (a.dims(), b.dims());
        let (m, k, k2, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 2], bd[bd.len() - 1]);
        if k != k2 {
            fail!(
                "matmul",
                "inner dims differ: shapes {:?} and {:?} ({}x{} times {}x{})",
                self.dims(),
                rhs.dims(),
                m,
                k,
                k2,
                n
            );
        }
        if ra >= 3 && rb == 2 {
            // A batch of rows times one matrix (a linear layer over [N, L, E]): one [N * L, K] x [K, N] product, as
            // PyTorch folds it. Batched with the matrix broadcast, each batch element was its own GEMM, and the
            // matrix's gradient a batch of products summed afterwards; folded, it is one product over all the rows
            // (`bench_transformer`'s 2-layer encoder step, 16 x 64 tokens: 15.0-15.1 -> 14.1-14.3 ms).
            let rows: usize = ad[..ad.len() - 1].iter().product();
            let mut dims = ad[..ad.len() - 1].to_vec();
            dims.push(n);
            return a.reshape(vec![rows, k]).matmul(&b).reshape(dims);
        }
        let Some(batch) = broadcast_shape(&ad[..ad.len() - 2], &bd[..bd.len() - 2]) else {
            fail!("matmul", "batch dims of {:?} and {:?} cannot be broadcast together", self.dims(), rhs.dims());
        };
        // Shapes, not `Vec`s: inline up to rank 4, so recording a matmul allocates only its nodes.
        let with = |tail: [usize; 2]| -> Shape { batch.dims().iter().copied().chain(tail).collect() };
        let operand = |t: Tensor, tail| t.cast_expand("matmul", dtype, with(tail).dims());
        let out = if k == 1 {
            // An outer product: `a[.., i, 0] * b[.., 0, j]`, recorded as the broadcast product it is. As a
            // one-term sum it would cost a reduction loop per element and an add of the sum's +0.0 start (kept
            // for the sign of a zero product), which the batch-1 training step's weight updates
            // (`W - lr * g^T x`) paid on every weight. IEEE's exact one-term sum is the product itself. In f16
            // too: the product of two f16 values is exact in f32, so rounding it once to f16 (what an f16 `mul`
            // computes) is what the f32-accumulating GEMM below would return, bar the sign of a zero.
            operand(a, [m, k]).mul(operand(b, [k, n]))
        } else if dtype.is_half() {
            // f16 or bf16 operands, f32 accumulation, one rounding (PyTorch's half matmul), recorded as what it
            // computes: the product of the operands widened to f32, rounded back. How it runs is the schedule's
            // choice: a backend with a bf16 GEMM reads bf16 operands in place and rounds in its epilogue (rule
            // 2e); elsewhere the widened operands are stored in f32 for the f32 GEMM (rule 2c) and its f32 result is
            // rounded by an elementwise kernel. The copies cost O(MK + KN + MN) against the GEMM's O(MNK).
            let f32s = |t: Tensor, tail| t.cast_expand("matmul", DType::F32, with(tail).dims());
            let prod = Tensor::from_op(
                Op::Matmul,
                smallvec::smallvec![f32s(a, [m, k]), f32s(b, [k, n])],
                with([m, n]),
                DType::F32,
            );
            prod.to_dtype(dtype)
        } else {
            Tensor::from_op(
                Op::Matmul,
                smallvec::smallvec![operand(a, [m, k]), operand(b, [k, n])],
                with([m, n]),
                dtype,
            )
        };
        match (ra, rb) {
            (1, 1) => out.reshape_prim(Vec::new()),
            (1, _) => out.squeeze(-2),
            (_, 1) => out.squeeze(-1),
            _ => out,
        }
    }

    /// `exp(x) / sum(exp(x))` along `dim`, computed stably (the max is subtracted first) and, as PyTorch does, as
    /// `exp(x - max) * (1 / sum)`: one reciprocal per row, a product per element. Float input only.
    ///
    /// Its gradient is PyTorch's `y * (g - Σ g y)` from the output `y` (in f32 for a half input, as the forward,
    /// else in its dtype), not the composition's own, which read `exp(x - max)` and `1 / sum` back: so the forward
    /// stores only `y` (one row kernel, where the exponent and the reciprocal had been stored for the backward, three
    /// kernels in attention).
    #[track_caller]
    pub fn softmax(&self, dim: isize) -> Tensor {
        self.softmax_rows(dim, false)
    }

    /// [`softmax`](Self::softmax) with 0, not NaN, for a row of only `-inf`: PyTorch's `_safe_softmax`, which its
    /// `scaled_dot_product_attention` uses (every backend, since 2.5) so that a query whose every key is masked out
    /// attends to nothing. The gradient is softmax's from this output, so such a row's is 0 as well.
    #[track_caller]
    pub(crate) fn safe_softmax(&self, dim: isize) -> Tensor {
        self.softmax_rows(dim, true)
    }

    /// [`softmax`](Self::softmax), or with `empty_rows_zero` [`safe_softmax`](Self::safe_softmax).
    #[track_caller]
    fn softmax_rows(&self, dim: isize, empty_rows_zero: bool) -> Tensor {
        let d = self.softmax_dim("softmax", dim);
        if self.numel() == 0 {
            return self.clone(); // nothing to normalize; the max below would reject an empty dim (PyTorch returns [])
        }
        let forward = |x: &Tensor| {
            x.in_f32(|x| {
                // The shift by the row's maximum cancels exactly (as in log-sum-exp): no gradient of its own.
                let max = x.max(d, true).detach();
                let e = x.sub(&max).exp();
                let y = e.mul(e.sum(d, true).recip());
                // A row's maximum is -inf exactly when every element is: its `x - max` is then NaN throughout.
                if empty_rows_zero { max.eq(f64::NEG_INFINITY).where_(0.0, y) } else { y }
            })
        };
        // `y` is the node itself (the value the forward stores), not `y`'s ops: through those, a reader would
        // recompute `y` from the exponent and the reciprocal, which then had to be stored.
        crate::autograd::unary_with_rule(self, forward, move |g, y, _| y.mul(g.sub(g.mul(y).sum(d, true))))
    }

    /// `log(softmax(x))` along `dim`, computed as `x - max - log(sum(exp(x - max)))`. Float input only.
    #[track_caller]
    pub fn log_softmax(&self, dim: isize) -> Tensor {
        let d = self.softmax_dim("log_softmax", dim);
        if self.numel() == 0 {
            return self.clone(); // as in softmax
        }
        self.in_f32(|x| {
            let shifted = x.sub(x.max(d, true).detach()); // as in softmax
            shifted.sub(shifted.exp().sum(d, true).log())
        })
    }

    #[track_caller]
    fn softmax_dim(&self, name: &str, dim: isize) -> isize {
        if !self.dtype().is_float() {
            fail!(name, "the input must be a float tensor, not {} (convert with to_dtype)", self.dtype());
        }
        if self.rank() == 0 {
            resolve_dim(name, dim, 0);
            return 0;
        }
        resolve_dim(name, dim, self.rank()) as isize
    }
}
