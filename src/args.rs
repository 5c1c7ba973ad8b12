//! Argument plumbing for ops: how dims and shapes are passed, and how a misuse is reported.
//!
//! Every public op is `#[track_caller]`, and so is every helper on the way to `op_panic`, so the panic location
//! and the message both name the user's line. Checks run before anything is built, so a caught panic leaves no
//! half-made state behind.

use std::panic::Location;

/// Panics for a programmer error in op `op`, naming the caller's file:line.
#[track_caller]
pub(crate) fn op_panic(op: &str, msg: std::fmt::Arguments<'_>) -> ! {
    let at = Location::caller();
    panic!("kiln: {op}: {msg} (at {}:{}:{})", at.file(), at.line(), at.column())
}

/// Reports a misuse of op `$op`, e.g. `fail!("reshape", "cannot view {} as {:?}", a, b)`.
macro_rules! fail {
    ($op:expr, $($arg:tt)*) => { $crate::args::op_panic($op, format_args!($($arg)*)) };
}
pub(crate) use fail;

/// One or several dims, PyTorch-style: negative values count from the end (`-1` is the last dim).
pub trait Dims {
    fn to_isize(&self) -> Vec<isize>;
}

macro_rules! dims_impl {
    ($($t:ty),*) => {$(
        impl Dims for $t {
            fn to_isize(&self) -> Vec<isize> { vec![*self as isize] }
        }
        impl<const N: usize> Dims for [$t; N] {
            fn to_isize(&self) -> Vec<isize> { self.iter().map(|&d| d as isize).collect() }
        }
        impl Dims for &[$t] {
            fn to_isize(&self) -> Vec<isize> { self.iter().map(|&d| d as isize).collect() }
        }
        impl Dims for Vec<$t> {
            fn to_isize(&self) -> Vec<isize> { self.iter().map(|&d| d as isize).collect() }
        }
    )*};
}
dims_impl!(i32, i64, isize, usize);

/// Resolves one possibly negative dim against `rank`.
#[track_caller]
pub(crate) fn resolve_dim(op: &str, d: isize, rank: usize) -> usize {
    let r = rank as isize;
    if d < -r.max(1) || d >= r.max(1) {
        fail!(op, "dim {d} is out of range for a tensor of rank {rank} (expected {} ..= {})", -r.max(1), r.max(1) - 1);
    }
    // A zero-dim tensor has one pseudo-dim that 0 and -1 both name (as in PyTorch), so wrap by max(rank, 1):
    // `d + r` alone turned -1 into usize::MAX for rank 0.
    if d < 0 { (d + r.max(1)) as usize } else { d as usize }
}

/// Resolves a list of dims: each in range, none repeated; sorted ascending.
#[track_caller]
pub(crate) fn resolve_dims(op: &str, dims: &impl Dims, rank: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for d in dims.to_isize() {
        let r = resolve_dim(op, d, rank);
        if out.contains(&r) {
            fail!(op, "dim {d} appears more than once in {:?}", dims.to_isize());
        }
        out.push(r);
    }
    out.sort_unstable();
    out
}

/// A target shape for `reshape`/`view`/`expand`: like `Dims`, but `-1` means "infer" (reshape) or "keep" (expand).
pub trait ShapeSpec {
    fn to_spec(&self) -> Vec<i64>;
}

macro_rules! spec_impl {
    ($($t:ty),*) => {$(
        impl<const N: usize> ShapeSpec for [$t; N] {
            fn to_spec(&self) -> Vec<i64> { self.iter().map(|&d| d as i64).collect() }
        }
        impl ShapeSpec for &[$t] {
            fn to_spec(&self) -> Vec<i64> { self.iter().map(|&d| d as i64).collect() }
        }
        impl ShapeSpec for Vec<$t> {
            fn to_spec(&self) -> Vec<i64> { self.iter().map(|&d| d as i64).collect() }
        }
    )*};
}
spec_impl!(i32, i64, isize, usize);

impl ShapeSpec for kiln_jit::Shape {
    fn to_spec(&self) -> Vec<i64> {
        self.dims().iter().map(|&d| d as i64).collect()
    }
}

impl ShapeSpec for &kiln_jit::Shape {
    fn to_spec(&self) -> Vec<i64> {
        self.dims().iter().map(|&d| d as i64).collect()
    }
}
