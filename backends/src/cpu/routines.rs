//! The CPU's linear algebra routines (`kiln_jit::kernel::routine`: LU with partial pivoting, Cholesky, triangular
//! solves), written in Rust rather than generated: each walks its matrix column by column, and the work that
//! vectorizes is a row update (`row_i -= l * row_k`) or a dot product of two rows over contiguous memory, which the
//! compiler vectorizes in these loops. Matrices of a batch run in parallel on the pool. From order
//! `blocked::MIN_ORDER` a matrix factors blocked instead (`blocked.rs`: panels, and their products as GEMMs on the
//! pool's threads).
//!
//! Every routine first writes its whole output (so a fault leaves no unwritten memory behind), then works in it.
//! The semantics (pivot choice, singularity threshold, fault words) are the module doc of `routine`.

use super::pool;
use kiln_jit::DType;
use kiln_jit::LinalgOp;
use kiln_jit::kernel::FAULT_WORDS;
use kiln_jit::kernel::fault::{FAULT_NOT_POSITIVE_DEFINITE, FAULT_SINGULAR};
use kiln_jit::kernel::routine::{LinalgRoutine, Routine, above, singular_tol};
use std::sync::atomic::{AtomicI64, Ordering};

/// The float types the routines run in (the `gemm` crate's, for the blocked forms' products: `LibFloat`).
pub(super) trait Real:
    super::gemm::tune::LibFloat + PartialOrd + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self>
{
    fn div(self, d: Self) -> Self;
    fn abs(self) -> Self;
    fn sqrt(self) -> Self;
    fn from_usize(i: usize) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            fn div(self, d: Self) -> Self {
                self / d
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn from_usize(i: usize) -> Self {
                i as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}
real!(f32);
real!(f64);

/// Claims the run's fault record for `[kind, a, b]` if no kernel has (`kernel::fault`).
pub(super) fn claim(fault: &[AtomicI64; FAULT_WORDS], kind: i64, a: i64, b: i64) {
    if fault[0].compare_exchange(0, kind, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
        fault[1].store(a, Ordering::Release);
        fault[2].store(b, Ordering::Release);
    }
}

/// Raw buffer pointers shared with the pool threads for one launch.
struct Bufs {
    a: *const u8,
    b: *const u8,
    out: *mut u8,
}

// SAFETY: each pool task touches only its own matrices' ranges of the buffers (disjoint per batch index), and the
// launch returns before the buffers are used again.
unsafe impl Sync for Bufs {}

/// Runs routine `r` with `ptrs` = its input buffers then its output (each sized as `r.kernel()` declares).
///
/// # Safety
/// Every pointer is valid for its buffer's length in `r.dtype`, the output is not an input, and nothing else
/// touches the buffers while this runs.
pub(super) unsafe fn run(r: &Routine, ptrs: &[*mut u8], fault: &[AtomicI64; FAULT_WORDS]) {
    match r {
        // SAFETY: the caller's contract.
        Routine::Linalg(l) => unsafe { run_linalg(l, ptrs, fault) },
        // SAFETY: the caller's contract.
        Routine::Scatter(s) => unsafe { super::scatter::run(s, ptrs, fault) },
        // SAFETY: the caller's contract.
        Routine::Sort(s) => unsafe { super::sort::run(s, ptrs) },
    }
}

/// [`run`] for a linear algebra routine.
///
/// # Safety
/// As [`run`].
unsafe fn run_linalg(r: &LinalgRoutine, ptrs: &[*mut u8], fault: &[AtomicI64; FAULT_WORDS]) {
    let bufs = Bufs { a: ptrs[0], b: if ptrs.len() > 2 { ptrs[1] } else { ptrs[0] }, out: ptrs[ptrs.len() - 1] };
    let call = |start: usize, end: usize| {
        for m in start..end {
            // SAFETY: the caller's contract; matrix `m` is a disjoint range of each buffer.
            unsafe {
                match r.dtype {
                    DType::F32 => matrix::<f32>(r, &bufs, m, fault),
                    DType::F64 => matrix::<f64>(r, &bufs, m, fault),
                    d => unreachable!("the graph check keeps routines to f32 and f64, not {d}"),
                }
            }
        }
    };
    pool::global().parallel_for_work(r.batch, r.work(), &call);
}

/// Matrix `m` of the launch.
///
/// # Safety
/// As [`run`], with `T` the routine's dtype.
unsafe fn matrix<T: Real>(r: &LinalgRoutine, bufs: &Bufs, m: usize, fault: &[AtomicI64; FAULT_WORDS]) {
    let (n, k, cols) = (r.n, r.k, r.out_cols());
    // SAFETY: (caller) the buffers hold `r.batch` matrices of these sizes in `T`.
    let (a, out) = unsafe {
        (
            std::slice::from_raw_parts((bufs.a as *const T).add(m * n * n), n * n),
            std::slice::from_raw_parts_mut((bufs.out as *mut T).add(m * n * cols), n * cols),
        )
    };
    match r.op {
        LinalgOp::Lu { check } => {
            if let Err(pivot) = lu(a, out, n, check.then_some(r.dtype)) {
                claim(fault, FAULT_SINGULAR, m as i64, pivot as i64);
            }
        }
        LinalgOp::Cholesky => {
            if let Err(minor) = cholesky(a, out, n) {
                claim(fault, FAULT_NOT_POSITIVE_DEFINITE, m as i64, minor as i64);
            }
        }
        LinalgOp::TriSolve { upper, unit } => {
            // SAFETY: (caller) B holds `r.batch` matrices of n x k.
            let b = unsafe { std::slice::from_raw_parts((bufs.b as *const T).add(m * n * k), n * k) };
            if let Err(row) = tri_solve(a, b, out, n, k, upper, unit) {
                claim(fault, FAULT_SINGULAR, m as i64, row as i64);
            }
        }
    }
}

/// LU of `a` into `out` (rows of `n + 2`: factors, permutation, pivot); `check` (the dtype) makes a numerically
/// zero pivot an error naming its column.
fn lu<T: Real>(a: &[T], out: &mut [T], n: usize, check: Option<DType>) -> Result<(), usize> {
    let cols = n + 2;
    for i in 0..n {
        out[i * cols..i * cols + n].copy_from_slice(&a[i * n..(i + 1) * n]);
        out[i * cols + n] = T::from_usize(i);
        out[i * cols + n + 1] = T::from_usize(i + 1);
    }
    let tol = check.map(|d| singular_tol(d, n, a.iter().fold(0.0f64, |m, x| m.max(x.abs().to_f64()))));
    if n >= super::blocked::MIN_ORDER {
        return super::blocked::lu(out, n, tol);
    }
    for c in 0..n {
        lu_step(out, n, c, n, tol)?;
    }
    Ok(())
}

/// The LU's step at column `c` in `out` (rows of `n + 2`): the largest element at or below the diagonal as the
/// pivot, its row swapped with row `c` whole (factors and permutation), its row number in the pivot column; a
/// pivot not above `tol` is an error naming the column; then the rows below eliminated, in columns `..c1` (all of
/// them unblocked; a blocked factorization's panel, `blocked::lu`). Returns whether it eliminated: not with a pivot
/// exactly zero (no check asked), whose column then stays as it was.
pub(super) fn lu_step<T: Real>(out: &mut [T], n: usize, c: usize, c1: usize, tol: Option<f64>) -> Result<bool, usize> {
    let cols = n + 2;
    let mut p = c;
    for i in c + 1..n {
        if out[i * cols + c].abs() > out[p * cols + c].abs() {
            p = i;
        }
    }
    if p != c {
        let (top, bottom) = out.split_at_mut(p * cols);
        top[c * cols..c * cols + n + 1].swap_with_slice(&mut bottom[..n + 1]);
    }
    out[c * cols + n + 1] = T::from_usize(p + 1);
    let pivot = out[c * cols + c];
    if let Some(tol) = tol
        && !above(pivot.abs().to_f64(), tol)
    {
        return Err(c);
    }
    if pivot == T::ZERO {
        return Ok(false);
    }
    let (done, rest) = out.split_at_mut((c + 1) * cols);
    let row_c = &done[c * cols + c + 1..c * cols + c1];
    for row in rest.chunks_exact_mut(cols) {
        let l = row[c].div(pivot);
        row[c] = l;
        for (x, &u) in row[c + 1..c1].iter_mut().zip(row_c) {
            *x = *x - l * u;
        }
    }
    Ok(true)
}

/// The Cholesky factor of `a`'s lower triangle into `out` (row by row: each element a dot product of two row
/// prefixes); a non-positive diagonal is an error naming the order of its leading minor.
fn cholesky<T: Real>(a: &[T], out: &mut [T], n: usize) -> Result<(), usize> {
    out.fill(T::ZERO);
    if n >= super::blocked::MIN_ORDER {
        return super::blocked::cholesky(a, out, n);
    }
    for i in 0..n {
        for j in 0..=i {
            let s = (0..j).fold(a[i * n + j], |s, c| s - out[i * n + c] * out[j * n + c]);
            cholesky_entry(out, n, (i, j), s)?;
        }
    }
    Ok(())
}

/// Element (i, j) of the Cholesky factor in `out` (`n x n`) from `s`, A's element less the products of the row
/// prefixes: its square root on the diagonal (not above zero: an error naming the leading minor's order), else
/// divided by the diagonal of row `j`.
pub(super) fn cholesky_entry<T: Real>(out: &mut [T], n: usize, (i, j): (usize, usize), s: T) -> Result<(), usize> {
    if i == j {
        if !above(s, T::ZERO) {
            return Err(i + 1);
        }
        out[i * n + i] = s.sqrt();
    } else {
        out[i * n + j] = s.div(out[j * n + j]);
    }
    Ok(())
}

/// `X` with `A X = B` into `out`, substituting row by row in place (each solved row subtracted from the ones left
/// as a contiguous update); a zero diagonal element is an error naming its row.
fn tri_solve<T: Real>(
    a: &[T],
    b: &[T],
    out: &mut [T],
    n: usize,
    k: usize,
    upper: bool,
    unit: bool,
) -> Result<(), usize> {
    out.copy_from_slice(b);
    if n >= super::blocked::MIN_ORDER {
        return super::blocked::tri_solve(a, out, n, k, upper, unit);
    }
    substitute(a, out, (n, k), 0..n, upper, unit)
}

/// Rows `rows` of `A X = B` solved in place in `out` (holding B there, and X in the rows already solved), in
/// solve order (top down, or bottom up for an upper A), each reduced by the solved rows of `rows` before it, then
/// divided by its diagonal (unless `unit`); a zero diagonal element is an error naming its row. The unblocked
/// routine's whole solve (`rows = 0..n`), and a blocked one's step (`blocked::tri_solve`).
pub(super) fn substitute<T: Real>(
    a: &[T],
    out: &mut [T],
    (n, k): (usize, usize),
    rows: std::ops::Range<usize>,
    upper: bool,
    unit: bool,
) -> Result<(), usize> {
    let (i0, i1) = (rows.start, rows.end);
    for step in 0..i1 - i0 {
        let i = if upper { i1 - 1 - step } else { i0 + step };
        let known = if upper { i + 1..i1 } else { i0..i };
        for j in known {
            let f = a[i * n + j];
            let (lo, hi) = out.split_at_mut(i.max(j) * k);
            let (row_i, row_j) =
                if i < j { (&mut lo[i * k..(i + 1) * k], &hi[..k]) } else { (&mut hi[..k], &lo[j * k..(j + 1) * k]) };
            for (x, &y) in row_i.iter_mut().zip(row_j.iter()) {
                *x = *x - f * y;
            }
        }
        if !unit {
            let d = a[i * n + i];
            if d == T::ZERO {
                return Err(i);
            }
            for x in &mut out[i * k..(i + 1) * k] {
                *x = x.div(d);
            }
        }
    }
    Ok(())
}
