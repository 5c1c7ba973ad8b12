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
        binary_operator!(@scalars $trait, $method, $reverse, f64, f32, i64, i32);
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
