//! Blocked forms of the CPU's linear algebra routines (`routines.rs`) for matrices of order [`MIN_ORDER`] and up,
//! organized as LAPACK organizes them so that nearly all the work is a product `C -= A @ B`, run by the `gemm`
//! crate in column strips over the pool's threads ([`sub_product`]):
//! - LU with partial pivoting recursively, as `getrf2`: the left half of the columns, the right half's rows beside
//!   it solved by the left's unit lower factor, the rows below reduced by a GEMM, then the right half; leaves of
//!   [`LEAF`] columns run the unblocked step.
//! - Cholesky left-looking by [`BLOCK`]-wide block columns, as `potrf`: a block column reduced by a GEMM of the
//!   columns left of it, its diagonal block factored unblocked, the rows below solved against it.
//! - Triangular solves by blocks of rows, as `trsm`: each block reduced by a GEMM of the rows solved before it, then
//!   substituted. The lower solves inside the first two ([`trsm_lower`]) recurse the same way.
//!
//! One matrix of order 512 factored this way runs on all cores at GEMM speed, where the unblocked row updates ran
//! on one core at a fraction of it (docs/benchmarks.md, "Linear algebra against PyTorch"). The matrices of a batch
//! already run one a thread; each of those runs its products on its own thread (the pool runs a nested launch
//! inline). Smaller matrices keep the unblocked loops.
//!
//! The results are the unblocked routines' up to rounding: the same pivots chosen in the same order (each column is
//! fully updated before its pivot is searched), the same singularity and definiteness checks at the same column or
//! minor, the same fault words; an element is reduced by GEMMs' sums of products rather than one product at a
//! time, so it differs within the factorization tolerance (`tests/linalg.rs`, order 160).
//!
//! Deliberately not done: a parallel panel or leaf, look-ahead (the next panel factored while the trailing update
//! runs): at the orders measured, the products are most of the time.

use super::gemm::tune::{Update, library_strips};
use super::routines::Real;

/// The order from which a single matrix factors blocked.
pub(super) const MIN_ORDER: usize = 128;
/// Panel width.
const BLOCK: usize = 32;

/// A row-major view of some elements: the first and the distance between rows.
#[derive(Clone, Copy)]
struct View<T> {
    at: *mut T,
    ld: usize,
}

impl<T> View<T> {
    fn at(self, row: usize, col: usize) -> *mut T {
        self.at.wrapping_add(row * self.ld + col)
    }
}

/// `C -= A @ B` for an `m x n` C and inner dimension `k`, A row-major and B row-major or, with `b_t`, the transpose
/// of a row-major matrix (element (p, j) at `b[j * ld + p]`: Cholesky's `L L^T`): the CPU library GEMM's column
/// strips over the pool's threads (`gemm::tune::library_strips`).
///
/// # Safety
/// Every element the views address for these dims lies in live memory, and C overlaps neither A nor B.
unsafe fn sub_product<T: Real>((m, n, k): (usize, usize, usize), c: View<T>, a: View<T>, b: View<T>, b_t: bool) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (b_cs, b_rs) = if b_t { (b.ld as isize, 1) } else { (1, b.ld as isize) };
    // SAFETY: the caller's contract.
    unsafe {
        library_strips((m, n, k), (c.at, c.ld as isize), (a.at, 1, a.ld as isize), (b.at, b_cs, b_rs), Update::Subtract)
    }
}

/// `routines::lu` for order `n >= MIN_ORDER`: `out` (rows of `n + 2`) already holds `a`, the identity permutation
/// and the unit pivots; factors it in place, recursively as LAPACK's `getrf2`: the left half of the columns, then
/// the right half's rows beside it solved by the left's unit lower factor (`trsm`), the rows below reduced by the
/// product of the two (a GEMM), then the right half. Every level swaps whole rows, as the unblocked loop does.
pub(super) fn lu<T: Real>(out: &mut [T], n: usize, tol: Option<f64>) -> Result<(), usize> {
    let mut f = Lu { out: View { at: out.as_mut_ptr(), ld: n + 2 }, n, tol, zero_pivots: vec![false; n] };
    // SAFETY: `out` holds n rows of n + 2 elements, borrowed mutably for the call.
    unsafe { f.columns(0, n) }
}

/// One LU factorization in progress (`lu`).
struct Lu<T> {
    out: View<T>,
    n: usize,
    tol: Option<f64>,
    /// Columns whose pivot was exactly zero (no check asked): the unblocked routine eliminates nothing with them,
    /// so their multipliers take no part in the products here either.
    zero_pivots: Vec<bool>,
}

/// Columns of a panel factored one by one (the recursion's leaves).
const LEAF: usize = 8;

impl<T: Real> Lu<T> {
    /// Factors columns `c0..c1` of rows `c0..n` (the columns left of `c0` done, those right of `c1` untouched but
    /// for row swaps).
    ///
    /// # Safety
    /// `self.out` addresses `n` rows of `n + 2` live elements, used by nothing else.
    unsafe fn columns(&mut self, c0: usize, c1: usize) -> Result<(), usize> {
        let (n, o) = (self.n, self.out);
        if c1 - c0 <= LEAF {
            for c in c0..c1 {
                // SAFETY: (caller) every element addressed is in `out`.
                unsafe { self.eliminate(c, c1) }?;
            }
            return Ok(());
        }
        let mid = c0 + (c1 - c0) / 2;
        // SAFETY: (caller) as above; the views below address disjoint blocks of `out` (or a copy of the left one).
        unsafe {
            self.columns(c0, mid)?;
            let copy = self.multipliers(c0, mid);
            let l = match &copy {
                Some(c) => View { at: c.as_ptr() as *mut T, ld: mid - c0 },
                None => View { at: o.at(c0, c0), ld: o.ld },
            };
            trsm_lower(true, mid - c0, c1 - mid, l, View { at: o.at(c0, mid), ld: o.ld });
            let l21 = View { at: l.at(mid - c0, 0), ..l };
            sub_product(
                (n - mid, c1 - mid, mid - c0),
                View { at: o.at(mid, mid), ..o },
                l21,
                View { at: o.at(c0, mid), ..o },
                false,
            );
            self.columns(mid, c1)
        }
    }

    /// The unblocked routine's step at column `c`, its updates limited to columns `..c1`.
    ///
    /// # Safety
    /// As `columns`.
    unsafe fn eliminate(&mut self, c: usize, c1: usize) -> Result<(), usize> {
        let n = self.n;
        // SAFETY: (caller) `out` is n rows of n + 2 elements, borrowed for this call only.
        let out = unsafe { std::slice::from_raw_parts_mut(self.out.at, n * self.out.ld) };
        if !super::routines::lu_step(out, n, c, c1, self.tol)? {
            self.zero_pivots[c] = true;
        }
        Ok(())
    }

    /// Where a column of `c0..c1` had a zero pivot: a copy of rows `c0..n` of those columns with it zeroed (the
    /// products then take no part of it); `None` (use `out`'s) otherwise.
    ///
    /// # Safety
    /// As `columns`.
    unsafe fn multipliers(&self, c0: usize, c1: usize) -> Option<Vec<T>> {
        if !self.zero_pivots[c0..c1].contains(&true) {
            return None;
        }
        let w = c1 - c0;
        let mut l = vec![T::ZERO; (self.n - c0) * w];
        for i in c0..self.n {
            for c in (c0..c1).filter(|&c| !self.zero_pivots[c]) {
                // SAFETY: (caller) row i, column c of `out`.
                l[(i - c0) * w + c - c0] = unsafe { *self.out.at(i, c) };
            }
        }
        Some(l)
    }
}

/// Rows of L from which [`trsm_lower`] recurses (at most this many, it substitutes directly).
const TRSM_LEAF: usize = 16;

/// `B = L^-1 B` for a lower triangular `w x w` L (with `unit`, its diagonal is taken as ones and not read; what lies
/// above it never is) and a `w x m` B, recursively: the top half of B, then the bottom half less L's lower left
/// block times the top, then that. At the leaves each element is reduced by the rows above it in order and then
/// divided by its diagonal, the unblocked routines' order of operations.
///
/// # Safety
/// The views address live elements for these dims; B overlaps no element of L that is read.
unsafe fn trsm_lower<T: Real>(unit: bool, w: usize, m: usize, l: View<T>, b: View<T>) {
    if w <= TRSM_LEAF {
        for r in 0..w {
            if !unit {
                // SAFETY: (caller) L's diagonal element r and B's row r.
                let (d, row) = unsafe { (*l.at(r, r), std::slice::from_raw_parts_mut(b.at(r, 0), m)) };
                for x in row {
                    *x = x.div(d);
                }
            }
            for i in r + 1..w {
                // SAFETY: (caller) L's element (i, r), B's rows r and i (distinct rows: disjoint), m elements each.
                let (f, src, dst) = unsafe {
                    (
                        *l.at(i, r),
                        std::slice::from_raw_parts(b.at(r, 0), m),
                        std::slice::from_raw_parts_mut(b.at(i, 0), m),
                    )
                };
                for (x, &y) in dst.iter_mut().zip(src) {
                    *x = *x - f * y;
                }
            }
        }
        return;
    }
    let h = w / 2;
    // SAFETY: (caller) the halves and blocks lie within the views; B's halves are disjoint rows.
    unsafe {
        trsm_lower(unit, h, m, l, b);
        sub_product((w - h, m, h), View { at: b.at(h, 0), ..b }, View { at: l.at(h, 0), ..l }, b, false);
        trsm_lower(unit, w - h, m, View { at: l.at(h, h), ..l }, View { at: b.at(h, 0), ..b });
    }
}

/// `routines::cholesky` for order `n >= MIN_ORDER` (`out` zeroed, `n x n`).
pub(super) fn cholesky<T: Real>(a: &[T], out: &mut [T], n: usize) -> Result<(), usize> {
    for i in 0..n {
        out[i * n..=i * n + i].copy_from_slice(&a[i * n..=i * n + i]);
    }
    for j0 in (0..n).step_by(BLOCK) {
        let t = (j0 + BLOCK).min(n);
        // Views are taken from `out` afresh after each direct use of it, never kept across one.
        let whole = View { at: out.as_mut_ptr(), ld: n };
        // The block column from the diagonal down, less the products of the columns left of it: L[j0.., 0..j0]
        // L[j0..t, 0..j0]^T. Its part above the diagonal block's diagonal is computed too and zeroed below.
        // SAFETY: C is rows j0..n, columns j0..t; A rows j0..n and B rows j0..t, both columns 0..j0: disjoint.
        unsafe {
            sub_product(
                (n - j0, t - j0, j0),
                View { at: whole.at(j0, j0), ..whole },
                View { at: whole.at(j0, 0), ..whole },
                View { at: whole.at(j0, 0), ..whole },
                true,
            )
        };
        // The diagonal block, unblocked.
        for i in j0..t {
            for j in j0..=i {
                let s = (j0..j).fold(out[i * n + j], |s, c| s - out[i * n + c] * out[j * n + c]);
                super::routines::cholesky_entry(out, n, (i, j), s)?;
            }
            out[i * n + i + 1..i * n + t].fill(T::ZERO);
        }
        // The rows below it: `L21 = A21 L11^-T`, solved as `L11 X = A21^T` on a transposed copy, whose rows are
        // contiguous (the substitution then runs along them, vectorized, and its products are GEMMs).
        let (m, w) = (n - t, t - j0);
        if m == 0 {
            break;
        }
        let mut x = vec![T::ZERO; w * m];
        for i in 0..m {
            for j in 0..w {
                x[j * m + i] = out[(t + i) * n + j0 + j];
            }
        }
        let l11 = View { at: out.as_mut_ptr().wrapping_add(j0 * n + j0), ld: n };
        // SAFETY: L11 is the diagonal block of `out`, only read; X the copy, m columns of w rows.
        unsafe { trsm_lower(false, w, m, l11, View { at: x.as_mut_ptr(), ld: m }) };
        for i in 0..m {
            for j in 0..w {
                out[(t + i) * n + j0 + j] = x[j * m + i];
            }
        }
    }
    Ok(())
}

/// `routines::tri_solve` for order `n >= MIN_ORDER` (`out` holds B, `n x k`): blocks of rows in solve order, each
/// first reduced by the product of its part of A with the rows solved before it, then substituted.
pub(super) fn tri_solve<T: Real>(
    a: &[T],
    out: &mut [T],
    n: usize,
    k: usize,
    upper: bool,
    unit: bool,
) -> Result<(), usize> {
    let av = View { at: a.as_ptr() as *mut T, ld: n };
    for b in 0..n.div_ceil(BLOCK) {
        // Taken from `out` afresh after the last block's direct use of it.
        let whole = View { at: out.as_mut_ptr(), ld: k };
        let (i0, i1) = if upper {
            (n.saturating_sub((b + 1) * BLOCK), n - b * BLOCK)
        } else {
            (b * BLOCK, n.min((b + 1) * BLOCK))
        };
        // SAFETY: C is rows i0..i1 of `out`, B the rows solved before (disjoint), A a block of `a`, only read.
        unsafe {
            if upper {
                sub_product(
                    (i1 - i0, k, n - i1),
                    View { at: whole.at(i0, 0), ..whole },
                    View { at: av.at(i0, i1), ..av },
                    View { at: whole.at(i1, 0), ..whole },
                    false,
                );
            } else {
                sub_product(
                    (i1 - i0, k, i0),
                    View { at: whole.at(i0, 0), ..whole },
                    View { at: av.at(i0, 0), ..av },
                    whole,
                    false,
                );
            }
        }
        super::routines::substitute(a, out, (n, k), i0..i1, upper, unit)?;
    }
    Ok(())
}
