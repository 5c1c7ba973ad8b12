//! Linear algebra with explicit errors (`torch.linalg`'s names and shapes): [`lu_factor`], [`solve`], [`inv`],
//! [`det`], [`slogdet`], [`cholesky`], [`solve_triangular`], batched over leading dims, in f32 and f64, on every
//! device.
//!
//! Three primitives do the work (`Op::Linalg`: an LU with partial pivoting, a Cholesky factorization and a
//! triangular solve, each a kernel per device: Rust on the CPU, WGSL on wgpu); everything else is a composition of
//! them and ordinary ops, so it fuses, batches and differentiates like any other graph. Like every op, these
//! functions are lazy: they return at once, and what the data decides is found when the result is realized.
//!
//! **Errors instead of NaN.** A singular matrix given to [`solve`], [`inv`] or [`lu_factor`] makes the realization
//! fail with [`Fault::Singular`] (which matrix of the batch, which pivot), and one that is not positive definite given
//! to [`cholesky`] with [`Fault::NotPositiveDefinite`] (`Error::fault` reads either from the error). "Singular" means
//! a pivot `p` of the LU with `!(|p| > n * eps * max |a_ij|)` (eps the dtype's machine epsilon: f32 1.19e-7, f64
//! 2.2e-16): exactly singular matrices and those singular to working precision alike, which LAPACK (and so
//! PyTorch) factor into a solve that returns inf, NaN or values of 1e16. A triangular solve fails on an exactly zero
//! diagonal element. [`det`] and [`slogdet`] are defined for singular matrices (0, and sign 0 with log |det| =
//! -inf, as PyTorch), and do not fail. The run that failed changes no tensor, and the runtime goes on.
//!
//! **Gradients** come from each primitive's rule (the LU's and Cholesky's as PyTorch derives them, through
//! triangular solves), so `solve`, `inv`, `det`, `slogdet`, `cholesky` and `solve_triangular` differentiate with
//! respect to every operand. A gradient through a singular matrix is an error too (a triangular solve by a
//! zero pivot), never NaN.
//!
//! Not here yet: `qr`, `lstsq`, `eigh`, `svd` (no orthogonal factorization kernel), complex dtypes, and a blocked
//! multi-threaded LU (one matrix factors on one thread; a batch runs its matrices in parallel).

use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::dtype::result_type;
use kiln_jit::shape::broadcast_shape;
use kiln_jit::{DType, LinalgOp, Op, Priority, Scalar, Shape};

pub use kiln_jit::kernel::Fault;

/// The order `n` of `a`'s square matrices, checking that it holds them in f32 or f64.
#[track_caller]
fn square(op: &str, a: &Tensor) -> usize {
    let r = a.rank();
    if r < 2 || a.dims()[r - 1] != a.dims()[r - 2] {
        fail!(op, "expects square matrices in the last two dims, got shape {:?}", a.dims());
    }
    check_dtype(op, a.dtype());
    a.dims()[r - 1]
}

#[track_caller]
fn check_dtype(op: &str, d: DType) {
    if !matches!(d, DType::F32 | DType::F64) {
        fail!(op, "supports f32 and f64, got {d}; convert with to_dtype(DType::F32)");
    }
}

fn mt(t: &Tensor) -> Tensor {
    t.transpose(-1, -2)
}

/// The LU primitive: `[.., n, n]` -> `[.., n, n + 2]` (factors, permutation, pivots; `LinalgOp::Lu`).
#[track_caller]
pub(crate) fn lu_packed(a: &Tensor, check: bool) -> Tensor {
    let mut dims = a.dims().to_vec();
    let r = dims.len();
    dims[r - 1] += 2;
    Tensor::from_op(Op::Linalg(LinalgOp::Lu { check }), smallvec::smallvec![a.clone()], Shape::new(dims), a.dtype())
}

/// The triangular solve primitive `A X = B` for `a [.., n, n]` and `b [.., n, k]` of equal batch dims and dtype.
#[track_caller]
pub(crate) fn tri_solve(a: &Tensor, b: &Tensor, upper: bool, unit: bool) -> Tensor {
    let op = Op::Linalg(LinalgOp::TriSolve { upper, unit });
    Tensor::from_op(op, smallvec::smallvec![a.clone(), b.clone()], Shape::new(b.dims()), b.dtype())
}

/// `a` and `b` (matrices) expanded to their common batch dims and converted to their common dtype.
#[track_caller]
fn batch_pair(op: &str, a: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    let d = result_type(&[(a.dtype(), Priority::Tensor), (b.dtype(), Priority::Tensor)]);
    check_dtype(op, d);
    let (ad, bd) = (a.dims(), b.dims());
    let Some(batch) = broadcast_shape(&ad[..ad.len() - 2], &bd[..bd.len() - 2]) else {
        fail!(op, "batch dims of {ad:?} and {bd:?} cannot be broadcast together");
    };
    let with = |t: &Tensor| {
        let r = t.rank();
        let dims: Vec<usize> = batch.dims().iter().copied().chain(t.dims()[r - 2..].iter().copied()).collect();
        t.to_dtype(d).expand_to(op, &dims)
    };
    (with(a), with(b))
}

/// The LU factorization with partial pivoting (`torch.linalg.lu_factor`): `(LU, pivots)` with `LU [.., n, n]` the
/// packed factors (`L`'s unit diagonal not stored) and `pivots [.., n]` (i32) LAPACK's row interchanges, 1-based:
/// row `i` was swapped with row `pivots[i] - 1` at step `i`. A singular matrix fails at realization
/// ([`Fault::Singular`], see the module doc).
#[track_caller]
pub fn lu_factor(a: &Tensor) -> (Tensor, Tensor) {
    let n = square("lu_factor", a);
    let p = lu_packed(a, true);
    (p.narrow(-1, 0, n), p.narrow(-1, n + 1, 1).squeeze(-1).to_dtype(DType::I32))
}

/// `X` with `A X = B` (`torch.linalg.solve`): `a [.., n, n]`, and `b [.., n, k]` or a batch of vectors `[.., n]`
/// (when `b` has rank 1, or one less than `a` with `a`'s leading dims); batch dims broadcast. A singular `A`
/// fails at realization with [`Fault::Singular`].
#[track_caller]
pub fn solve(a: &Tensor, b: &Tensor) -> Tensor {
    let n = square("solve", a);
    let vector = b.rank() == 1 || (b.rank() + 1 == a.rank() && b.dims() == &a.dims()[..a.rank() - 1]);
    let bm = if vector { b.unsqueeze(-1) } else { b.clone() };
    if bm.rank() < 2 || bm.dims()[bm.rank() - 2] != n {
        fail!("solve", "the right-hand side {:?} does not fit matrices {:?} ({n} rows)", b.dims(), a.dims());
    }
    let (a, bm) = batch_pair("solve", a, &bm);
    let p = lu_packed(&a, true);
    // Row i of P B is row perm[i] of B.
    let index = p.narrow(-1, n, 1).to_dtype(a.device().index_dtype()).expand_to("solve", bm.dims());
    let lu = p.narrow(-1, 0, n);
    let y = tri_solve(&lu, &bm.gather(-2, &index), false, true);
    let x = tri_solve(&lu, &y, true, false);
    if vector { x.squeeze(-1) } else { x }
}

/// The inverse of each matrix (`torch.linalg.inv`), as `solve(a, I)`. A singular matrix fails at realization.
#[track_caller]
pub fn inv(a: &Tensor) -> Tensor {
    let n = square("inv", a);
    let eye = Tensor::eye(n, a.dtype(), &a.device()).expand_to("inv", a.dims());
    solve(a, &eye)
}

/// The LU factors' diagonal `[.., n]` and the permutation's sign `[..]` (+1 or -1), from an unchecked LU.
fn lu_diagonal_and_sign(a: &Tensor, n: usize) -> (Tensor, Tensor) {
    let (d, dev) = (a.dtype(), a.device());
    let p = lu_packed(a, false);
    let diagonal = p.narrow(-1, 0, n).mul(Tensor::eye(n, d, &dev)).sum(-1, false);
    let steps = Tensor::iota(Scalar::Int(1), Scalar::Int(1), n, d, &dev);
    let swaps = p.narrow(-1, n + 1, 1).squeeze(-1).ne(&steps).to_dtype(d).sum(-1, false);
    (diagonal, swaps.remainder(2.0).mul(-2.0).add(1.0))
}

/// The determinant of each matrix (`torch.linalg.det`): the product of the LU's pivots, signed by the row
/// interchanges. 0 for a singular matrix (no error); its gradient there is an error.
#[track_caller]
pub fn det(a: &Tensor) -> Tensor {
    let n = square("det", a);
    let (diagonal, sign) = lu_diagonal_and_sign(a, n);
    diagonal.prod(-1, false).mul(sign)
}

/// `(sign, log |det|)` of each matrix (`torch.linalg.slogdet`): a determinant without overflow. A singular
/// matrix gives sign 0 and log |det| = -inf, as PyTorch.
#[track_caller]
pub fn slogdet(a: &Tensor) -> (Tensor, Tensor) {
    let n = square("slogdet", a);
    let (diagonal, sign) = lu_diagonal_and_sign(a, n);
    (diagonal.sign().prod(-1, false).mul(sign), diagonal.abs().log().sum(-1, false))
}

/// The lower Cholesky factor `L` with `A = L L^T` of symmetric positive definite matrices
/// (`torch.linalg.cholesky`); only `a`'s lower triangle is read. A matrix that is not positive definite fails at
/// realization with [`Fault::NotPositiveDefinite`] (the order of the first leading minor that is not).
#[track_caller]
pub fn cholesky(a: &Tensor) -> Tensor {
    square("cholesky", a);
    Tensor::from_op(Op::Linalg(LinalgOp::Cholesky), smallvec::smallvec![a.clone()], Shape::new(a.dims()), a.dtype())
}

/// `X` with `A X = B` (`left`) or `X A = B` (`!left`) for triangular `A` (`torch.linalg.solve_triangular`): only
/// `A`'s `upper` or lower triangle is read, and with `unitriangular` not its diagonal (taken as ones). `b` is
/// `[.., n, k]` (left) or `[.., k, n]`; batch dims broadcast. An exactly zero diagonal element fails at realization
/// with [`Fault::Singular`].
#[track_caller]
pub fn solve_triangular(a: &Tensor, b: &Tensor, upper: bool, left: bool, unitriangular: bool) -> Tensor {
    let n = square("solve_triangular", a);
    let side = if left { b.rank().wrapping_sub(2) } else { b.rank().wrapping_sub(1) };
    if b.rank() < 2 || b.dims()[side] != n {
        fail!("solve_triangular", "the right-hand side {:?} does not fit matrices {:?} ({n} rows)", b.dims(), a.dims());
    }
    let (a, b) = batch_pair("solve_triangular", a, b);
    if left {
        tri_solve(&a, &b, upper, unitriangular)
    } else {
        // X A = B is A^T X^T = B^T.
        mt(&tri_solve(&mt(&a), &mt(&b), !upper, unitriangular))
    }
}

/// The gradient flowing to operand `i` of `y = op(srcs)` given `y`'s gradient `g` (autograd's rule for
/// `Op::Linalg`).
pub(crate) fn vjp(op: LinalgOp, y: &Tensor, srcs: &[Tensor], i: usize, g: &Tensor) -> Option<Tensor> {
    let (d, dev) = (y.dtype(), y.device());
    Some(match op {
        // A = P^T L U. With the factors' gradients gL (strictly lower) and gU (upper), PyTorch's rule for a square
        // LU: gA = P^T L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T. The permutation and pivots carry none.
        LinalgOp::Lu { .. } => {
            let n = srcs[0].dims()[srcs[0].rank() - 1];
            let (lu, g_lu) = (y.narrow(-1, 0, n), g.narrow(-1, 0, n));
            let l = lu.tril(-1).add(Tensor::eye(n, d, &dev));
            let u = lu.triu(0);
            let phi = mt(&l).matmul(&g_lu.tril(-1)).tril(-1).add(g_lu.triu(0).matmul(&mt(&u)).triu(0));
            // phi U^-T is the transpose of U^-1 phi^T; then L^-T from the left (L^T is unit upper).
            let right = mt(&tri_solve(&lu, &mt(&phi), true, false));
            let inner = tri_solve(&mt(&lu), &right, true, true);
            let cols = Tensor::iota(Scalar::Int(0), Scalar::Int(1), n, d, &dev);
            let p = y.narrow(-1, n, 1).eq(&cols).to_dtype(d); // P[i][j] = (perm[i] == j)
            mt(&p).matmul(&inner)
        }
        // PyTorch's rule: S = Phi(L^T gL) symmetrized (Phi: the lower triangle, diagonal halved), gA = L^-T S L^-1.
        LinalgOp::Cholesky => {
            let p = mt(y).matmul(g).tril(0);
            let s = p.add(mt(&p.tril(-1))).mul(0.5);
            let s_linv = mt(&tri_solve(&mt(y), &mt(&s), true, false));
            tri_solve(&mt(y), &s_linv, true, false)
        }
        // X = A^-1 B: gB = A^-T gX, gA = -gB X^T on A's triangle.
        LinalgOp::TriSolve { upper, unit } => {
            let gb = tri_solve(&mt(&srcs[0]), g, !upper, unit);
            if i == 1 {
                return Some(gb);
            }
            let ga = gb.matmul(&mt(y)).neg();
            match (upper, unit) {
                (true, false) => ga.triu(0),
                (true, true) => ga.triu(1),
                (false, false) => ga.tril(0),
                (false, true) => ga.tril(-1),
            }
        }
    })
}
