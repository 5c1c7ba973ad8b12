//! `+ - * /` and unary `-` on owned and borrowed tensors and Rust scalars, as thin calls to the named methods.

use crate::tensor::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! binary_operator {
    ($trait:ident, $method:ident, $reverse:ident) => {
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor { Tensor::$method(&self, rhs) }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor { Tensor::$method(&self, rhs) }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor { Tensor::$method(self, rhs) }
        }
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor { Tensor::$method(self, rhs) }
        }
        // One float and one int type only: with impls for f32 and i32 as well, a literal (`x + 1.0`) matched two
        // impls, so the result's type was unknown and a method call on it (`(x + 1.0).relu()`) did not compile.
        // The named methods (`x.add(v)`) take any scalar type.
        binary_operator!(@scalars $trait, $method, $reverse, f64, i64);
    };
    (@scalars $trait:ident, $method:ident, $reverse:ident, $($s:ty),*) => {$(
        impl $trait<$s> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor { Tensor::$method(&self, rhs) }
        }
        impl $trait<$s> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor { Tensor::$method(self, rhs) }
        }
        impl $trait<Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor { rhs.$reverse(self) }
        }
        impl $trait<&Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor { rhs.$reverse(self) }
        }
    )*};
}

// Addition and multiplication commute, so `2.0 * x` is `x.mul(2.0)`; subtraction and division have reverse forms.
binary_operator!(Add, add, add);
binary_operator!(Sub, sub, rsub);
binary_operator!(Mul, mul, mul);
binary_operator!(Div, div, rdiv);

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}
