//! What each elementwise op means on one scalar: the single definition that the reference interpreter
//! (`interp`, over whole arrays in f64 / i64) and the kernel IR evaluator (`kernel::eval`, element by element in the
//! kernel's own precision) both call. Every match here lists every variant of `UnaryOp` and `BinaryOp`, with no
//! wildcard arm, so an op added to `op.rs` does not build until its meaning is written down here.
//!
//! Floats are generic over [`Float`] (f32 and f64; f16 is computed in f32 and rounded by the caller). Integers of
//! every width are carried in an `i64`; the caller wraps the result to its dtype (`DType::wrap_int`). Conventions,
//! all PyTorch's: `maximum`/`minimum` propagate NaN; integer division by zero gives 0 (PyTorch raises; kiln cannot
//! raise inside a kernel); a negative integer exponent gives 0 except for bases 1 and -1.

use crate::op::{BinaryOp, UnaryOp};

/// The float types an op is evaluated in.
pub trait Float: Copy + PartialOrd + std::ops::Neg<Output = Self> + std::fmt::Debug {
    const ZERO: Self;
    const ONE: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn sqrt(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn trunc(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn max(self, y: Self) -> Self;
    fn min(self, y: Self) -> Self;
    fn is_nan(self) -> bool;
    fn add(self, y: Self) -> Self;
    fn sub(self, y: Self) -> Self;
    fn mul(self, y: Self) -> Self;
    fn div(self, y: Self) -> Self;
    /// C's `fmod`: exact.
    fn rem(self, y: Self) -> Self;
}

macro_rules! float_impl {
    ($t:ty) => {
        impl Float for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            fn ln(self) -> $t {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> $t {
                <$t>::ln_1p(self)
            }
            fn exp_m1(self) -> $t {
                <$t>::exp_m1(self)
            }
            fn sin(self) -> $t {
                <$t>::sin(self)
            }
            fn cos(self) -> $t {
                <$t>::cos(self)
            }
            fn tanh(self) -> $t {
                <$t>::tanh(self)
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            fn floor(self) -> $t {
                <$t>::floor(self)
            }
            fn ceil(self) -> $t {
                <$t>::ceil(self)
            }
            fn round_ties_even(self) -> $t {
                <$t>::round_ties_even(self)
            }
            fn trunc(self) -> $t {
                <$t>::trunc(self)
            }
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
            fn powf(self, e: $t) -> $t {
                <$t>::powf(self, e)
            }
            fn max(self, y: $t) -> $t {
                <$t>::max(self, y)
            }
            fn min(self, y: $t) -> $t {
                <$t>::min(self, y)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn add(self, y: $t) -> $t {
                self + y
            }
            fn sub(self, y: $t) -> $t {
                self - y
            }
            fn mul(self, y: $t) -> $t {
                self * y
            }
            fn div(self, y: $t) -> $t {
                self / y
            }
            fn rem(self, y: $t) -> $t {
                self % y
            }
        }
    };
}
float_impl!(f32);
float_impl!(f64);

/// A unary op on a float. `Not` (logical not, which lowering applies to bools) reads a float as a truth value:
/// 1 where it is 0, else 0.
pub fn float_unary<F: Float>(u: UnaryOp, x: F) -> F {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => F::ONE.div(x),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Not => {
            if x == F::ZERO {
                F::ONE
            } else {
                F::ZERO
            }
        }
    }
}

/// A unary op on an integer (before wrapping to its dtype); `None` for the float-only ops.
pub fn int_unary(u: UnaryOp, x: i64) -> Option<i64> {
    match u {
        UnaryOp::Neg => Some(x.wrapping_neg()),
        UnaryOp::Abs => Some(x.wrapping_abs()),
        UnaryOp::Not => Some((x == 0) as i64),
        // Rounding an integer is the identity, which the `Tensor` API applies without recording an op.
        UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Tanh
        | UnaryOp::Sqrt
        | UnaryOp::Recip
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Trunc
        | UnaryOp::Log1p
        | UnaryOp::Expm1 => None,
    }
}

/// The result of a binary op on floats: a float, or a comparison's truth value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FloatResult<F> {
    Value(F),
    Bool(bool),
}

/// A binary op on floats; `None` for the logical ops, which apply to bools (integers) only.
pub fn float_binary<F: Float>(op: BinaryOp, x: F, y: F) -> Option<FloatResult<F>> {
    use FloatResult::{Bool, Value};
    Some(match op {
        BinaryOp::Lt => Bool(x < y),
        BinaryOp::Le => Bool(x <= y),
        BinaryOp::Eq => Bool(x == y),
        BinaryOp::Ne => Bool(x != y),
        BinaryOp::Add => Value(x.add(y)),
        BinaryOp::Sub => Value(x.sub(y)),
        BinaryOp::Mul => Value(x.mul(y)),
        BinaryOp::Div => Value(x.div(y)),
        BinaryOp::Rem => Value(x.rem(y)),
        // NaN wins, as torch.maximum / torch.minimum (`x + y` is the NaN operand, or a NaN).
        BinaryOp::Max => Value(if x.is_nan() || y.is_nan() { x.add(y) } else { x.max(y) }),
        BinaryOp::Min => Value(if x.is_nan() || y.is_nan() { x.add(y) } else { x.min(y) }),
        BinaryOp::Pow => Value(x.powf(y)),
        BinaryOp::And | BinaryOp::Or => return None,
    })
}

/// A binary op on integers (before wrapping to the result's dtype; a comparison gives 0 or 1).
pub fn int_binary(op: BinaryOp, x: i64, y: i64) -> i64 {
    match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div => {
            if y == 0 {
                0
            } else {
                x.wrapping_div(y)
            }
        }
        BinaryOp::Rem => {
            if y == 0 {
                0
            } else {
                x.wrapping_rem(y)
            }
        }
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Pow => int_pow(x, y),
        BinaryOp::Lt => (x < y) as i64,
        BinaryOp::Le => (x <= y) as i64,
        BinaryOp::Eq => (x == y) as i64,
        BinaryOp::Ne => (x != y) as i64,
        BinaryOp::And => (x != 0 && y != 0) as i64,
        BinaryOp::Or => (x != 0 || y != 0) as i64,
    }
}

/// `base ** exp` on integers, wrapping (PyTorch's integer `pow`); a negative exponent gives 0 except for bases 1
/// and -1.
pub fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut acc, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maximum_and_minimum_propagate_nan_and_keep_the_larger_or_smaller() {
        for (x, y) in [(1.0f32, 2.0), (2.0, 1.0), (-0.0, 0.0)] {
            assert_eq!(float_binary(BinaryOp::Max, x, y), Some(FloatResult::Value(x.max(y))));
        }
        let Some(FloatResult::Value(m)) = float_binary(BinaryOp::Max, 1.0f64, f64::NAN) else { panic!() };
        assert!(m.is_nan());
        let Some(FloatResult::Value(m)) = float_binary(BinaryOp::Min, f32::NAN, 1.0) else { panic!() };
        assert!(m.is_nan());
    }

    #[test]
    fn integer_edge_cases() {
        assert_eq!(int_binary(BinaryOp::Div, 7, 0), 0);
        assert_eq!(int_binary(BinaryOp::Div, i64::MIN, -1), i64::MIN);
        assert_eq!((int_pow(2, 10), int_pow(-1, -3), int_pow(1, -5), int_pow(3, -1)), (1024, -1, 1, 0));
        assert_eq!(int_unary(UnaryOp::Exp, 1), None);
        assert_eq!(float_binary(BinaryOp::And, 1.0f32, 1.0), None);
    }
}
