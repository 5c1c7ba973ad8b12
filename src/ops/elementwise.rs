//! Elementwise ops: unary math, binary arithmetic with promotion and broadcasting, comparisons, `where_`, casts.
//!
//! Promotion follows `torch.result_type`; ints under a float-only function (`exp`, `sqrt`, `/`, ...) are promoted
//! to f32 as PyTorch does. Misuse PyTorch rejects is rejected here too, at the caller's line: `-` on bool,
//! subtracting bools, a non-bool condition for `where_`.

use super::Operand;
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::dtype::result_type;
use kiln_jit::shape::broadcast_shape;
use kiln_jit::{BinaryOp, DType, Op, Scalar, UnaryOp};

/// What a binary op's result dtype is, given the promoted operand dtype.
#[derive(Clone, Copy, PartialEq)]
enum Out {
    Promoted,
    /// True division and friends: ints become f32.
    Float,
    Bool,
}

impl Tensor {
    #[track_caller]
    fn unary_prim(&self, u: UnaryOp) -> Tensor {
        Tensor::from_op(Op::Unary(u), smallvec::smallvec![self.clone()], self.shape().clone(), self.dtype())
    }

    /// A float-only unary function: bool and int inputs are promoted to f32 first.
    #[track_caller]
    fn float_unary(&self, u: UnaryOp) -> Tensor {
        self.to_float().unary_prim(u)
    }

    /// This tensor if it is float, else converted to f32 (PyTorch's default float dtype).
    pub(crate) fn to_float(&self) -> Tensor {
        if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) }
    }

    #[track_caller]
    fn binary(&self, name: &str, rhs: Operand, op: BinaryOp, out: Out, swap: bool) -> Tensor {
        let lhs = Operand::Tensor(self.clone());
        let (a, b) = if swap { (rhs, lhs) } else { (lhs, rhs) };
        let mut dtype = result_type(&[a.promotion_key(), b.promotion_key()]);
        if out == Out::Float && !dtype.is_float() {
            dtype = DType::F32;
        }
        // A comparison of a bool tensor with an int scalar computes in i64 (PyTorch's promotion); on a device
        // without i64 it computes in i32 when the scalar fits, which gives the same bools.
        if out == Out::Bool
            && dtype == DType::I64
            && !self.device().supports(dtype)
            && [&a, &b].iter().all(|o| match o {
                Operand::Scalar(s) => i32::try_from(s.as_i64()).is_ok(),
                Operand::Tensor(_) => true,
            })
        {
            dtype = DType::I32;
        }
        if let (Operand::Tensor(x), Operand::Tensor(y)) = (&a, &b)
            && x.device() != y.device()
        {
            fail!(
                name,
                "operands live on different devices ({} and {}); move one with to_device",
                x.device(),
                y.device()
            );
        }
        match (op, dtype) {
            (BinaryOp::Sub, DType::Bool) => {
                fail!(name, "subtracting bool tensors is not supported; use logical_xor-style logic with ne()")
            }
            (BinaryOp::Pow, DType::Bool) => {
                fail!(name, "pow is not supported on bool tensors; cast to an int or float dtype")
            }
            (BinaryOp::Div, DType::Bool) => unreachable!("division promotes to float"),
            (BinaryOp::Rem, DType::Bool) => {
                fail!(name, "{name} is not supported on bool tensors; cast to an int or float dtype")
            }
            _ => {}
        }
        let Some(shape) = broadcast_shape(a.dims(), b.dims()) else {
            fail!(name, "shapes {:?} and {:?} cannot be broadcast together", a.dims(), b.dims());
        };
        let a = a.materialize(name, dtype, shape.dims(), self);
        let b = b.materialize(name, dtype, shape.dims(), self);
        let out_dtype = if out == Out::Bool { DType::Bool } else { dtype };
        Tensor::from_op(Op::Binary(op), smallvec::smallvec![a, b], shape, out_dtype)
    }

    /// `self + rhs` (logical or on bool).
    #[track_caller]
    pub fn add(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("add", rhs.into(), BinaryOp::Add, Out::Promoted, false)
    }

    /// `self - rhs`.
    #[track_caller]
    pub fn sub(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("sub", rhs.into(), BinaryOp::Sub, Out::Promoted, false)
    }

    /// `self * rhs` (logical and on bool).
    #[track_caller]
    pub fn mul(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("mul", rhs.into(), BinaryOp::Mul, Out::Promoted, false)
    }

    /// True division: `self / rhs`, with ints promoted to f32.
    #[track_caller]
    pub fn div(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("div", rhs.into(), BinaryOp::Div, Out::Float, false)
    }

    /// The remainder of `self / rhs` truncated toward zero, with the sign of `self` (`torch.fmod`, C's `fmod`): exact
    /// on floats; on ints `x % 0` is 0 (PyTorch raises).
    #[track_caller]
    pub fn fmod(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("fmod", rhs.into(), BinaryOp::Rem, Out::Promoted, false)
    }

    /// The remainder of `self / rhs` rounded toward -inf, with the sign of `rhs` (`torch.remainder`, Python's `%`):
    /// `fmod`, plus `rhs` where that is nonzero and of the other sign.
    #[track_caller]
    pub fn remainder(&self, rhs: impl Into<Operand>) -> Tensor {
        let rhs: Operand = rhs.into();
        let r = self.binary("remainder", rhs.clone(), BinaryOp::Rem, Out::Promoted, false);
        let b = match &rhs {
            Operand::Tensor(t) => t.to_dtype(r.dtype()),
            Operand::Scalar(s) => r.const_like(*s, r.dtype(), &[]),
        };
        let zero = r.zeros_like();
        let other_sign = r.lt(&zero).ne(b.lt(b.zeros_like()));
        let fix = r.ne(&zero).logical_and(other_sign);
        fix.where_(r.add(&b), &r)
    }

    /// `lhs - self`, for `scalar - tensor`.
    #[track_caller]
    pub(crate) fn rsub(&self, lhs: impl Into<Operand>) -> Tensor {
        self.binary("sub", lhs.into(), BinaryOp::Sub, Out::Promoted, true)
    }

    /// `lhs / self`, for `scalar / tensor`.
    #[track_caller]
    pub(crate) fn rdiv(&self, lhs: impl Into<Operand>) -> Tensor {
        self.binary("div", lhs.into(), BinaryOp::Div, Out::Float, true)
    }

    /// Elementwise maximum; NaN if either side is NaN (`torch.maximum`).
    #[track_caller]
    pub fn maximum(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("maximum", rhs.into(), BinaryOp::Max, Out::Promoted, false)
    }

    /// Elementwise minimum; NaN if either side is NaN (`torch.minimum`).
    #[track_caller]
    pub fn minimum(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("minimum", rhs.into(), BinaryOp::Min, Out::Promoted, false)
    }

    /// `self ** exponent`, elementwise with promotion (`torch.pow`).
    #[track_caller]
    pub fn pow(&self, exponent: impl Into<Operand>) -> Tensor {
        self.binary("pow", exponent.into(), BinaryOp::Pow, Out::Promoted, false)
    }

    /// `self ** exponent` for a float exponent; ints are promoted to f32.
    #[track_caller]
    pub fn powf(&self, exponent: f64) -> Tensor {
        self.binary("powf", Operand::Scalar(Scalar::Float(exponent)), BinaryOp::Pow, Out::Float, false)
    }

    #[track_caller]
    pub fn lt(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("lt", rhs.into(), BinaryOp::Lt, Out::Bool, false)
    }

    #[track_caller]
    pub fn le(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("le", rhs.into(), BinaryOp::Le, Out::Bool, false)
    }

    #[track_caller]
    pub fn gt(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("gt", rhs.into(), BinaryOp::Lt, Out::Bool, true)
    }

    #[track_caller]
    pub fn ge(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("ge", rhs.into(), BinaryOp::Le, Out::Bool, true)
    }

    #[track_caller]
    pub fn eq(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("eq", rhs.into(), BinaryOp::Eq, Out::Bool, false)
    }

    #[track_caller]
    pub fn ne(&self, rhs: impl Into<Operand>) -> Tensor {
        self.binary("ne", rhs.into(), BinaryOp::Ne, Out::Bool, false)
    }

    /// Logical and of the truth values (non-zero is true); bool result.
    #[track_caller]
    pub fn logical_and(&self, rhs: impl Into<Operand>) -> Tensor {
        self.to_dtype(DType::Bool).binary("logical_and", to_bool(rhs.into()), BinaryOp::And, Out::Bool, false)
    }

    /// Logical or of the truth values (non-zero is true); bool result.
    #[track_caller]
    pub fn logical_or(&self, rhs: impl Into<Operand>) -> Tensor {
        self.to_dtype(DType::Bool).binary("logical_or", to_bool(rhs.into()), BinaryOp::Or, Out::Bool, false)
    }

    /// Logical not of the truth values (non-zero is true); bool result.
    #[track_caller]
    pub fn logical_not(&self) -> Tensor {
        self.to_dtype(DType::Bool).unary_prim(UnaryOp::Not)
    }

    /// `-self`. Not defined on bool (use `logical_not`).
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        if self.dtype() == DType::Bool {
            fail!("neg", "negation is not supported on bool tensors; use logical_not()");
        }
        self.unary_prim(UnaryOp::Neg)
    }

    /// Absolute value (the identity on bool).
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        if self.dtype() == DType::Bool {
            return self.clone();
        }
        self.unary_prim(UnaryOp::Abs)
    }

    #[track_caller]
    pub fn exp(&self) -> Tensor {
        self.float_unary(UnaryOp::Exp)
    }

    /// Natural logarithm.
    #[track_caller]
    pub fn log(&self) -> Tensor {
        self.float_unary(UnaryOp::Log)
    }

    #[track_caller]
    pub fn sin(&self) -> Tensor {
        self.float_unary(UnaryOp::Sin)
    }

    #[track_caller]
    pub fn cos(&self) -> Tensor {
        self.float_unary(UnaryOp::Cos)
    }

    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        self.float_unary(UnaryOp::Tanh)
    }

    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        self.float_unary(UnaryOp::Sqrt)
    }

    /// The largest integral value not above each element (an integer or bool tensor is returned unchanged, as
    /// PyTorch's).
    #[track_caller]
    pub fn floor(&self) -> Tensor {
        self.rounding(UnaryOp::Floor)
    }

    /// The smallest integral value not below each element.
    #[track_caller]
    pub fn ceil(&self) -> Tensor {
        self.rounding(UnaryOp::Ceil)
    }

    /// The nearest integral value, ties to even (`round(2.5) == 2`, as PyTorch's `round`).
    #[track_caller]
    pub fn round(&self) -> Tensor {
        self.rounding(UnaryOp::Round)
    }

    /// The integral part, rounding toward zero.
    #[track_caller]
    pub fn trunc(&self) -> Tensor {
        self.rounding(UnaryOp::Trunc)
    }

    /// `log(1 + x)`, accurate where `x` is near 0 (where `(1 + x).log()` rounds `1 + x` first and keeps no digit
    /// of a tiny `x`). Bool and int inputs become f32, as PyTorch's `log1p`.
    #[track_caller]
    pub fn log1p(&self) -> Tensor {
        self.float_unary(UnaryOp::Log1p)
    }

    /// `exp(x) - 1`, accurate where `x` is near 0 (PyTorch's `expm1`).
    #[track_caller]
    pub fn expm1(&self) -> Tensor {
        self.float_unary(UnaryOp::Expm1)
    }

    /// -1, 0 or 1 by the sign of each element, in the tensor's dtype (PyTorch's `sign`: 0 for both zeros and for
    /// NaN); a bool tensor is returned as it is. No gradient flows through it (PyTorch's is zero).
    #[track_caller]
    pub fn sign(&self) -> Tensor {
        let d = self.dtype();
        if d == DType::Bool {
            return self.clone();
        }
        self.gt(0).to_dtype(d).sub(self.lt(0).to_dtype(d))
    }

    /// A rounding op on a float tensor; an integer or bool tensor is already integral, so it is the result.
    fn rounding(&self, u: UnaryOp) -> Tensor {
        if self.dtype().is_float() { self.unary_prim(u) } else { self.clone() }
    }

    /// `1 / self`.
    #[track_caller]
    pub fn recip(&self) -> Tensor {
        self.float_unary(UnaryOp::Recip)
    }

    /// `1 / sqrt(self)`.
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        self.float_unary(UnaryOp::Sqrt).unary_prim(UnaryOp::Recip)
    }

    /// `1 / (1 + exp(-self))`.
    ///
    /// Its gradient is PyTorch's `g (1 - y) y` from the output `y` (in f32 for a half input, else in its dtype),
    /// not the composition's: that one multiplies by `exp(-x)`, which is `inf` below about -88.7 in f32 while `y`
    /// has rounded to 0, and `0 * inf` made the gradient NaN there (PyTorch's is 0). It also has two nodes fewer.
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        crate::autograd::unary_with_rule(
            self,
            |x| x.float_unary(UnaryOp::Neg).unary_prim(UnaryOp::Exp).add(1.0).unary_prim(UnaryOp::Recip),
            |g, y, _| g.mul(y.rsub(1.0)).mul(y),
        )
    }

    /// `max(self, 0)`; NaN stays NaN.
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        if self.dtype() == DType::Bool {
            fail!("relu", "relu is not supported on bool tensors");
        }
        // where(x <= 0, 0, x) rather than maximum(x, 0): the same values (NaN stays NaN), and the gradient at 0 is
        // 0 as in PyTorch (a maximum tie would send it half).
        self.le(0).where_(0, self)
    }

    /// `self * self`. Bool squares to i64: PyTorch's `square` is `pow(self, 2)`, and bool ** int promotes to i64.
    #[track_caller]
    pub fn square(&self) -> Tensor {
        if self.dtype() == DType::Bool {
            let x = self.to_dtype(DType::I64);
            return x.mul(&x);
        }
        self.mul(self)
    }

    /// Clamps into `[min, max]` (`torch.clamp`); NaN stays NaN. Bounds promote like any other operand.
    #[track_caller]
    pub fn clamp(&self, min: impl Into<Operand>, max: impl Into<Operand>) -> Tensor {
        self.clamp_min(min).clamp_max(max)
    }

    /// `max(self, min)` elementwise (`torch.clamp(min=...)`).
    #[track_caller]
    pub fn clamp_min(&self, min: impl Into<Operand>) -> Tensor {
        // A select, not `maximum`: the gradient reaches `self` wherever it is inside the bound, bound included,
        // and the bound where it is below it, as PyTorch's clamp does.
        let min = min.into();
        self.binary("clamp", min.clone(), BinaryOp::Lt, Out::Bool, false).where_(min, self)
    }

    /// `min(self, max)` elementwise (`torch.clamp(max=...)`).
    #[track_caller]
    pub fn clamp_max(&self, max: impl Into<Operand>) -> Tensor {
        let max = max.into();
        self.binary("clamp", max.clone(), BinaryOp::Lt, Out::Bool, true).where_(max, self)
    }

    /// `torch.where(self, on_true, on_false)`: `self` is the bool condition; all three broadcast together and the
    /// two branches promote like a binary op.
    #[track_caller]
    pub fn where_(&self, on_true: impl Into<Operand>, on_false: impl Into<Operand>) -> Tensor {
        if self.dtype() != DType::Bool {
            fail!("where_", "the condition must be a bool tensor, not {} (compare first, e.g. x.gt(0))", self.dtype());
        }
        let (a, b) = (on_true.into(), on_false.into());
        for x in [&a, &b] {
            if let Operand::Tensor(t) = x
                && t.device() != self.device()
            {
                fail!("where_", "operands live on different devices ({} and {})", self.device(), t.device());
            }
        }
        let dtype = result_type(&[a.promotion_key(), b.promotion_key()]);
        let shape = broadcast_shape(self.dims(), a.dims()).and_then(|d| broadcast_shape(d.dims(), b.dims()));
        let Some(shape) = shape else {
            fail!("where_", "shapes {:?}, {:?} and {:?} cannot be broadcast together", self.dims(), a.dims(), b.dims());
        };
        let cond = self.expand_to("where_", shape.dims());
        let a = a.materialize("where_", dtype, shape.dims(), self);
        let b = b.materialize("where_", dtype, shape.dims(), self);
        Tensor::from_op(Op::Where, smallvec::smallvec![cond, a, b], shape, dtype)
    }

    /// Converts to `dtype` (a no-op if already there). Float -> int truncates toward zero to an i64 (saturating at
    /// the i64 range, NaN -> 0) and then wraps to the target width, the way a C cast through int64 does:
    /// `-1.5 -> u8` is 255 and `3e9 -> i32` is -1294967296. Values in the target's range convert exactly.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        Tensor::from_op(Op::Cast, smallvec::smallvec![self.clone()], self.shape().clone(), dtype)
    }
}

fn to_bool(o: Operand) -> Operand {
    match o {
        Operand::Tensor(t) => Operand::Tensor(t.to_dtype(DType::Bool)),
        Operand::Scalar(s) => Operand::Scalar(Scalar::Bool(s.as_f64() != 0.0)),
    }
}
