//! Tensors whose shape is part of their type: [`Tensor1`] to [`Tensor4`] wrap a [`Tensor`] whose dims are const
//! generic parameters, so `einsum!` checks at compile time that an index shared by two typed operands has one
//! size (and that each typed operand has as many indices as dims). Everything else a `Tensor` does, a typed one does
//! through `Deref`; results are plain tensors (Rust cannot compute the output type of a general op on stable).

use crate::tensor::Tensor;

/// A size known at compile time.
pub struct Const<const N: usize>;

/// A size known only at run time (an operand that is a plain [`Tensor`]): agrees with any size here, and is
/// checked when the einsum runs.
pub struct Dynamic;

/// Size of dim `I` of an einsum operand, as a type.
#[diagnostic::on_unimplemented(
    message = "einsum!: `{Self}` has no dim {I}: more indices than its type has dims",
    label = "this operand's type fixes its rank"
)]
pub trait Axis<const I: usize> {
    type Size;
}

/// Rank of an einsum operand, as a type.
pub trait Rank {
    type Rank;
}

/// Two sizes that may be equal (equal constants, or either one dynamic).
#[diagnostic::on_unimplemented(
    message = "einsum!: an index has size {Self} in one operand and {T} in another",
    label = "sizes of a shared index differ"
)]
pub trait SameSize<T> {}

/// A typed operand's rank against its number of indices.
#[diagnostic::on_unimplemented(
    message = "einsum!: this operand's type has rank {Self}, and {T} indices are given",
    label = "rank fixed by the operand's type"
)]
pub trait SameRank<T> {}

impl<const N: usize> SameRank<Const<N>> for Const<N> {}
impl<T> SameRank<T> for Dynamic {}

impl<const N: usize> SameSize<Const<N>> for Const<N> {}
impl<T> SameSize<T> for Dynamic {}
impl<const N: usize> SameSize<Dynamic> for Const<N> {}

impl<const I: usize> Axis<I> for Tensor {
    type Size = Dynamic;
}

impl Rank for Tensor {
    type Rank = Dynamic;
}

impl<const I: usize, T: Axis<I>> Axis<I> for &T {
    type Size = T::Size;
}

impl<T: Rank> Rank for &T {
    type Rank = T::Rank;
}

/// Requires `A` and `B` to be [`SameSize`] (what `einsum!` expands to, once per pair of uses of an index).
pub fn same_size<A: SameSize<B>, B>(_: std::marker::PhantomData<(A, B)>) {}

/// Requires `A` and `B` to be [`SameRank`] (what `einsum!` expands to, once per operand).
pub fn same_rank<A: SameRank<B>, B>(_: std::marker::PhantomData<(A, B)>) {}

/// The size types of dim `I` of `a` and dim `J` of `b`.
pub fn axis_pair<const I: usize, const J: usize, A: Axis<I>, B: Axis<J>>(
    _: &A,
    _: &B,
) -> std::marker::PhantomData<(A::Size, B::Size)> {
    std::marker::PhantomData
}

/// The rank type of `a` and a constant `N` (its number of indices).
pub fn rank_and<const N: usize, A: Rank>(_: &A) -> std::marker::PhantomData<(A::Rank, Const<N>)> {
    std::marker::PhantomData
}

/// What `einsum!` hands to `Tensor::einsum`: a tensor, typed or not, or a reference to one.
pub trait AsTensor {
    fn as_tensor(&self) -> &Tensor;
}

impl AsTensor for Tensor {
    fn as_tensor(&self) -> &Tensor {
        self
    }
}

impl<T: AsTensor> AsTensor for &T {
    fn as_tensor(&self) -> &Tensor {
        (**self).as_tensor()
    }
}

/// `Axis<$i>` of typed tensor `$name`, whose generic parameters come as one token tree (`{A B}`): its size `$d`.
macro_rules! axis {
    ($name:ident, {$($all:ident)+}, $d:ident, $i:literal) => {
        impl<$(const $all: usize),+> Axis<$i> for $name<$($all),+> {
            type Size = Const<$d>;
        }
    };
}

macro_rules! typed {
    ($(#[$doc:meta])* $name:ident, $rank:literal, $gen:tt, [$($d:ident : $i:literal),+]) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name<$(const $d: usize),+>(Tensor);

        impl<$(const $d: usize),+> $name<$($d),+> {
            /// `t` as a typed tensor; panics at the caller's line if its dims are not the type's.
            #[track_caller]
            pub fn new(t: Tensor) -> Self {
                let want = [$($d),+];
                if t.dims() != want {
                    crate::args::fail!(stringify!($name), "the tensor has shape {:?}, the type says {:?}", t.dims(), want);
                }
                $name(t)
            }

            /// The tensor, untyped.
            pub fn into_tensor(self) -> Tensor {
                self.0
            }
        }

        impl<$(const $d: usize),+> std::ops::Deref for $name<$($d),+> {
            type Target = Tensor;
            fn deref(&self) -> &Tensor {
                &self.0
            }
        }

        impl<$(const $d: usize),+> From<$name<$($d),+>> for Tensor {
            fn from(t: $name<$($d),+>) -> Tensor {
                t.0
            }
        }

        impl<$(const $d: usize),+> AsTensor for $name<$($d),+> {
            fn as_tensor(&self) -> &Tensor {
                &self.0
            }
        }

        impl<$(const $d: usize),+> Rank for $name<$($d),+> {
            type Rank = Const<$rank>;
        }

        $(axis!($name, $gen, $d, $i);)+
    };
}

typed!(
    /// A vector of `A` elements (see [`Tensor2`]).
    Tensor1, 1, {A}, [A: 0]
);
typed!(
    /// An `A x B` matrix: a [`Tensor`] whose dims are part of its type, so that `einsum!` checks shared sizes when
    /// your crate compiles.
    ///
    /// ```
    /// # #[cfg(feature = "cpu")] {
    /// use kiln::{DType, Device, Tensor, Tensor2, einsum};
    /// let dev = Device::cpu();
    /// let x: Tensor2<32, 784> = Tensor2::new(Tensor::zeros([32, 784], DType::F32, &dev));
    /// let w: Tensor2<784, 256> = Tensor2::new(Tensor::zeros([784, 256], DType::F32, &dev));
    /// let h = einsum!((b, o) = x[b, i] * w[i, o]); // i is 784 in both: checked when this compiles
    /// assert_eq!(h.dims(), &[32, 256]);
    /// # }
    /// ```
    ///
    /// A shared index whose sizes differ does not compile:
    ///
    /// ```compile_fail,E0277
    /// # use kiln::{DType, Device, Tensor, Tensor2, einsum};
    /// # fn f(x: Tensor2<32, 784>, w: Tensor2<256, 784>) {
    /// let h = einsum!((b, o) = x[b, i] * w[i, o]); // i is 784 in x, 256 in w
    /// # }
    /// ```
    ///
    /// ```text
    /// error[E0277]: einsum!: an index has size 784 in one operand and 256 in another
    /// ```
    ///
    /// nor does a typed operand given the wrong number of indices:
    ///
    /// ```compile_fail,E0277
    /// # use kiln::{Tensor2, einsum};
    /// # fn f(x: Tensor2<3, 4>) {
    /// let t = einsum!((i) = x[i, j, k]);
    /// # }
    /// ```
    Tensor2, 2, {A B}, [A: 0, B: 1]
);
typed!(
    /// A tensor of shape `[A, B, C]` (see [`Tensor2`]).
    Tensor3, 3, {A B C}, [A: 0, B: 1, C: 2]
);
typed!(
    /// A tensor of shape `[A, B, C, D]` (see [`Tensor2`]).
    Tensor4, 4, {A B C D}, [A: 0, B: 1, C: 2, D: 3]
);
