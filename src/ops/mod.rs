//! The user-facing ops, grouped by kind. Each one checks its arguments (panicking at the caller's line on misuse),
//! applies PyTorch's promotion and broadcasting rules, and records primitives from `kiln_jit::Op`. Composite ops
//! (softmax, argmax, cat, eye, ...) are compositions of primitives, so every backend runs them unchanged.

mod arrange;
mod composite;
mod creation;
mod cumulative;
mod einsum;
mod elementwise;
mod indexing;
mod linalg;
mod movement;
mod operators;
mod reduce;
mod sorting;
mod statistics;

pub use arrange::PadMode;
pub(crate) use indexing::scatter_sum;

use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::{DType, Op, Priority, Scalar, Shape};

/// The right-hand side of a binary op: a tensor or a Rust scalar (`x + 1.0`, `x.maximum(&y)`).
#[derive(Clone, Debug)]
pub enum Operand {
    Tensor(Tensor),
    Scalar(Scalar),
}

impl From<&Tensor> for Operand {
    fn from(t: &Tensor) -> Self {
        Operand::Tensor(t.clone())
    }
}

impl From<Tensor> for Operand {
    fn from(t: Tensor) -> Self {
        Operand::Tensor(t)
    }
}

macro_rules! operand_from_scalar {
    ($($t:ty),*) => {$(
        impl From<$t> for Operand {
            fn from(x: $t) -> Self { Operand::Scalar(Scalar::from(x)) }
        }
    )*};
}
operand_from_scalar!(f64, f32, i64, i32, u32, u8, bool);

impl Operand {
    /// (dtype, priority) for `kiln_jit::dtype::result_type`.
    fn promotion_key(&self) -> (DType, Priority) {
        match self {
            Operand::Tensor(t) if t.rank() == 0 => (t.dtype(), Priority::ZeroDim),
            Operand::Tensor(t) => (t.dtype(), Priority::Tensor),
            Operand::Scalar(s) => (s.natural_dtype(), Priority::Scalar),
        }
    }

    fn dims(&self) -> &[usize] {
        match self {
            Operand::Tensor(t) => t.dims(),
            Operand::Scalar(_) => &[],
        }
    }

    /// This operand as a tensor of `dtype` broadcast to `dims`, on the device of `like`. By value: a tensor already
    /// of that dtype and shape (the usual operand) is moved through, not cloned and dropped, since each clone and
    /// drop of a handle is a locked update of its node's count (a tenth of recording an elementwise op).
    #[track_caller]
    fn materialize(self, op: &str, dtype: DType, dims: &[usize], like: &Tensor) -> Tensor {
        match self {
            Operand::Tensor(t) => t.cast_expand(op, dtype, dims),
            Operand::Scalar(s) => Tensor::on_device(
                Op::Const(s),
                crate::tensor::Srcs::new(),
                Shape::new(dims),
                dtype,
                like.device(),
                None,
            ),
        }
    }
}

impl Tensor {
    /// `f(self)` computed in f32 and rounded once when `self` is f16 or bf16, as PyTorch computes its half-precision
    /// composites (mean, softmax, log_softmax, layer_norm, GELU, SiLU) with float accumulation: step by step in f16,
    /// layer_norm's mean and variance were each rounded, and its output's mean drifted by 6e-5 over 4096 values.
    /// Other dtypes: `f(self)`.
    pub(crate) fn in_f32(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        let d = self.dtype();
        if d.is_half() { f(&self.to_dtype(DType::F32)).to_dtype(d) } else { f(self) }
    }

    /// `self` converted to `dtype` and broadcast to `dims`, moved through when it is both already: by value, since
    /// each clone and drop of a handle is a locked update of its node's count, which recording an op paid several
    /// times per operand through `to_dtype` and `expand_to`.
    #[track_caller]
    pub(crate) fn cast_expand(self, op: &str, dtype: DType, dims: &[usize]) -> Tensor {
        let t = if self.dtype() == dtype { self } else { self.to_dtype(dtype) };
        if t.dims() == dims { t } else { t.expand_to(op, dims) }
    }

    /// Broadcasts to `dims` (prepending dims of 1, then stretching dims of 1), recording nothing if already there.
    #[track_caller]
    pub(crate) fn expand_to(&self, op: &str, dims: &[usize]) -> Tensor {
        if self.dims() == dims {
            return self.clone();
        }
        let src = self.dims();
        if src.len() > dims.len() {
            fail!(op, "cannot broadcast shape {:?} to {:?} (the target has fewer dims)", src, dims);
        }
        let mut padded: smallvec::SmallVec<[usize; 4]> = smallvec::smallvec![1; dims.len() - src.len()];
        padded.extend_from_slice(src);
        for (i, (&s, &d)) in padded.iter().zip(dims).enumerate() {
            if s != d && s != 1 {
                fail!(op, "cannot broadcast shape {:?} to {:?}: dim {i} is {s}, not 1 or {d}", src, dims);
            }
        }
        let reshaped = if padded.len() == src.len() { self.clone() } else { self.reshape_prim(padded.to_vec()) };
        Tensor::from_op(Op::Expand, smallvec::smallvec![reshaped], Shape::new(dims), self.dtype())
    }

    /// A `Reshape` primitive (no checks beyond the element count, which callers guarantee).
    pub(crate) fn reshape_prim(&self, dims: Vec<usize>) -> Tensor {
        if self.dims() == dims.as_slice() {
            return self.clone();
        }
        debug_assert_eq!(self.numel(), dims.iter().product::<usize>());
        Tensor::from_op(Op::Reshape, smallvec::smallvec![self.clone()], Shape::new(dims), self.dtype())
    }

    /// A constant of this tensor's device, broadcast to `dims`.
    pub(crate) fn const_like(&self, value: impl Into<Scalar>, dtype: DType, dims: &[usize]) -> Tensor {
        Tensor::on_device(
            Op::Const(value.into()),
            crate::tensor::Srcs::new(),
            Shape::new(dims),
            dtype,
            self.device(),
            None,
        )
    }
}
