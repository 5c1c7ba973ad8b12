//! Routines: the kernels of `Op::Linalg` (LU with partial pivoting, Cholesky, triangular solves), of
//! `Op::ScatterRows` (a deterministic scatter-sum, `kernel::scatter`) and of `Op::SortRows` (a row sort,
//! `kernel::sort`). A factorization walks its matrix column by column, each step reading what the previous one
//! wrote, a scatter adds each source row into a row its index names, and a sort's comparisons depend on the data;
//! none fits the kernel IR (every output element computed independently from its inputs, over ranges fixed at
//! compile time), so each device writes these few kernels itself (the CPU in Rust, `backends/src/cpu/routines.rs`,
//! `scatter.rs` and `sort.rs`; wgpu in WGSL, `render/wgsl/routine.rs` and `scatter.rs`; CUDA and HIP C the scatter,
//! `render/cuda/scatter.rs`; the sort only on the CPU so far, `kernel::sort` says why that is enough), and this
//! module holds what they share: the shapes, the semantics every device follows, and the reference implementation
//! the interpreters run ([`reference()`]).
//!
//! A launch of a routine carries a *descriptor* kernel (`KernelIr::routine` set): its name, buffers and output
//! extents are real, so plans, slots, dumps and profiles treat it as any launch; it has no code (`outer` is empty),
//! and every pass that reads code skips it. Its sources are stored row-major (schedule rule 1), so a routine reads
//! plain `[batch, n, n]` matrices.
//!
//! # Semantics (every device)
//! - **LU** (`LinalgOp::Lu`): LAPACK `getf2`'s order. For column `k`: the pivot is the first row `p >= k` of largest
//!   `|a[p][k]|`; rows `k` and `p` are swapped (whole rows); the column below the pivot is divided by it; the
//!   trailing block gets `a[i][j] -= a[i][k] * a[k][j]`. A pivot that is zero is skipped (no division, no update;
//!   its column is zero below it anyway). With `check`, a pivot with `!(|pivot| > tol)` is a fault
//!   `Singular { batch_index, pivot: k }`, where `tol = n * eps * max |A|` ([`singular_tol`]; eps the dtype's
//!   machine epsilon): the rank tolerance of `numpy.linalg.matrix_rank`, with the largest entry for the norm. So an
//!   exactly singular matrix, and one singular to working precision (`[[1, 2, 3], [4, 5, 6], [7, 8, 9]]`, whose last
//!   pivot comes out near 1e-16 rather than 0), are errors where LAPACK would return factors whose solve overflows;
//!   a NaN pivot is one too.
//! - **Cholesky**: column `j`'s diagonal `d = a[j][j] - sum_k l[j][k]^2`; `!(d > 0)` is a fault
//!   `NotPositiveDefinite { batch_index, minor: j + 1 }` (LAPACK's `info`: the order of the leading minor); then
//!   `l[j][j] = sqrt(d)` and `l[i][j] = (a[i][j] - sum_k l[i][k] l[j][k]) / l[j][j]` below it. Zeros above the
//!   diagonal.
//! - **Triangular solve**: forward (lower) or backward (upper) substitution per right-hand column; a zero diagonal
//!   element (not read with `unit`) is `Singular { batch_index, pivot: i }`.
//!
//! Of several faults in one run, one is reported (devices run matrices in parallel; which one wins is not fixed).
//! Devices compute in the dtype (f32 or f64); sums run in the order above, and the reference runs in f64 and rounds
//! once, so results agree to rounding, scaled by the matrix's condition.

use crate::dtype::DType;
use crate::graph::NodeData;
use crate::kernel::fault::Fault;
use crate::kernel::ir::{BufParam, KernelIr};
pub use crate::kernel::scatter::ScatterRows;
pub use crate::kernel::sort::SortRows;
use crate::op::{LinalgOp, Op};

/// One routine launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Routine {
    Linalg(LinalgRoutine),
    Scatter(ScatterRows),
    Sort(SortRows),
}

impl Routine {
    /// The routine computing `node` (an `Op::Linalg` or `Op::ScatterRows`) from `srcs`; `None` for any other op.
    pub fn of(node: &NodeData, srcs: &[&NodeData]) -> Option<Routine> {
        match node.op {
            Op::Linalg(l) => Some(Routine::Linalg(LinalgRoutine::of(l, node, srcs))),
            Op::ScatterRows { positions } => Some(Routine::Scatter(ScatterRows::of(positions, node, srcs))),
            Op::SortRows { descending, keep } => Some(Routine::Sort(SortRows::of(descending, keep, node, srcs))),
            _ => None,
        }
    }

    /// The dtype of the output (and of the values it reads, but for a sort's).
    pub fn dtype(&self) -> DType {
        match self {
            Routine::Linalg(r) => r.dtype,
            Routine::Scatter(s) => s.dtype,
            Routine::Sort(s) => s.index,
        }
    }

    /// Whether the routine can report a fault.
    pub fn can_fault(&self) -> bool {
        match self {
            Routine::Linalg(r) => r.can_fault(),
            Routine::Scatter(_) => true,
            Routine::Sort(_) => false,
        }
    }

    /// Element operations, for profiles and the thread pool's split decision.
    pub fn work(&self) -> usize {
        match self {
            Routine::Linalg(r) => r.work(),
            Routine::Scatter(s) => s.work(),
            Routine::Sort(s) => s.work(),
        }
    }

    /// The launch's descriptor kernel (see the module doc).
    pub fn kernel(&self) -> KernelIr {
        match self {
            Routine::Linalg(r) => r.kernel(),
            Routine::Scatter(s) => s.kernel(),
            Routine::Sort(s) => s.kernel(),
        }
    }
}

/// The routine's output from its inputs (row-major values, computed in f64), or the fault of the lowest matrix (the
/// first index, for a scatter) that has one. What the interpreters run; the devices' kernels are checked against it.
pub fn reference(r: &Routine, inputs: &[&[f64]]) -> Result<Vec<f64>, Fault> {
    match r {
        Routine::Linalg(r) => linalg_reference(r, inputs),
        Routine::Scatter(s) => s.reference(inputs),
        Routine::Sort(s) => Ok(s.reference(inputs)),
    }
}

/// One linear algebra launch: which, in what dtype, over how many matrices of what size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinalgRoutine {
    pub op: LinalgOp,
    pub dtype: DType,
    /// Matrices (the product of the leading dims).
    pub batch: usize,
    /// Rows (and columns) of each square matrix.
    pub n: usize,
    /// Right-hand columns of a triangular solve (`B`'s last dim); 0 for a factorization.
    pub k: usize,
}

impl LinalgRoutine {
    /// The routine computing `node` (an `Op::Linalg`) from `srcs`.
    pub fn of(l: LinalgOp, node: &NodeData, srcs: &[&NodeData]) -> LinalgRoutine {
        let a = srcs[0].shape.dims();
        let n = a[a.len() - 1];
        let batch = a[..a.len() - 2].iter().product();
        let k = match l {
            LinalgOp::TriSolve { .. } => srcs[1].shape.dims()[a.len() - 1],
            _ => 0,
        };
        LinalgRoutine { op: l, dtype: node.dtype, batch, n, k }
    }

    /// Columns of each output matrix.
    pub fn out_cols(&self) -> usize {
        match self.op {
            LinalgOp::Lu { .. } => self.n + 2,
            LinalgOp::Cholesky => self.n,
            LinalgOp::TriSolve { .. } => self.k,
        }
    }

    /// Whether the routine can report a fault (every one but an unchecked LU and a unit triangular solve).
    pub fn can_fault(&self) -> bool {
        !matches!(self.op, LinalgOp::Lu { check: false } | LinalgOp::TriSolve { unit: true, .. })
    }

    /// Multiply-adds, for profiles and the thread pool's split decision.
    pub fn work(&self) -> usize {
        let n = self.n;
        self.batch
            * match self.op {
                LinalgOp::Lu { .. } => n * n * n / 3 + n * n,
                LinalgOp::Cholesky => n * n * n / 6 + n * n,
                LinalgOp::TriSolve { .. } => n * n * self.k / 2 + n * self.k,
            }
    }

    /// The launch's descriptor kernel (see the module doc).
    pub fn kernel(&self) -> KernelIr {
        let mat = |cols: usize| BufParam { dtype: self.dtype, len: self.batch * self.n * cols };
        let mut inputs = vec![mat(self.n)];
        if let LinalgOp::TriSolve { .. } = self.op {
            inputs.push(mat(self.k));
        }
        descriptor(
            Routine::Linalg(*self),
            format!("L_{}_{}x{}x{}", self.op.name(), self.batch, self.n, self.out_cols()),
            inputs,
            mat(self.out_cols()),
            vec![self.batch, self.n, self.out_cols()],
        )
    }
}

/// A routine launch's descriptor kernel (the module doc): its name, buffers and output extents, and no code.
pub(crate) fn descriptor(
    routine: Routine,
    name: String,
    inputs: Vec<BufParam>,
    output: BufParam,
    out_extents: Vec<usize>,
) -> KernelIr {
    KernelIr {
        name,
        inputs,
        output,
        row_rank: out_extents.len(),
        out_extents,
        reduce: None,
        rows: Vec::new(),
        outer: Vec::new(),
        result: 0,
        flops_per_elem: 0,
        routine: Some(routine),
    }
}

/// The graph check of an `Op::Linalg` node.
pub fn check(l: LinalgOp, srcs: &[&NodeData], d: &NodeData) -> Result<(), String> {
    let a = srcs[0].shape.dims();
    let r = a.len();
    if r < 2 || a[r - 1] != a[r - 2] {
        return Err(format!("{}: needs square matrices, got {}", l.name(), srcs[0].shape));
    }
    if !matches!(d.dtype, DType::F32 | DType::F64) || srcs.iter().any(|s| s.dtype != d.dtype) {
        return Err(format!("{}: f32 or f64 operands and result, got {}", l.name(), d.dtype));
    }
    let n = a[r - 1];
    let mut want = a.to_vec();
    match l {
        LinalgOp::Lu { .. } => want[r - 1] = n + 2,
        LinalgOp::Cholesky => {}
        LinalgOp::TriSolve { .. } => {
            let b = srcs[1].shape.dims();
            if b.len() != r || b[..r - 1] != a[..r - 1] {
                return Err(format!("{}: right-hand side {} for matrices {}", l.name(), srcs[1].shape, srcs[0].shape));
            }
            want = b.to_vec();
        }
    }
    if want != d.shape.dims() {
        return Err(format!("{} gives {want:?}, node has {}", l.name(), d.shape));
    }
    Ok(())
}

/// `x > bound`, false for a NaN: a pivot or a diagonal that is not above its bound (NaN included) is a fault.
pub fn above<T: PartialOrd>(x: T, bound: T) -> bool {
    x.partial_cmp(&bound) == Some(std::cmp::Ordering::Greater)
}

/// The LU singularity threshold for an `n x n` matrix of dtype `d` whose largest magnitude is `max_abs`.
pub fn singular_tol(d: DType, n: usize, max_abs: f64) -> f64 {
    let eps = if d == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
    n as f64 * eps * max_abs
}

/// [`reference`] of a linear algebra routine.
fn linalg_reference(r: &LinalgRoutine, inputs: &[&[f64]]) -> Result<Vec<f64>, Fault> {
    let (n, k, cols) = (r.n, r.k, r.out_cols());
    let mut out = vec![0.0; r.batch * n * cols];
    for b in 0..r.batch {
        let a = &inputs[0][b * n * n..(b + 1) * n * n];
        let o = &mut out[b * n * cols..(b + 1) * n * cols];
        let batch_index = b as i64;
        match r.op {
            LinalgOp::Lu { check } => {
                let mut m: Vec<Vec<f64>> = (0..n).map(|i| a[i * n..(i + 1) * n].to_vec()).collect();
                let mut perm: Vec<usize> = (0..n).collect();
                let tol = singular_tol(r.dtype, n, a.iter().fold(0.0, |x: f64, y| x.max(y.abs())));
                for c in 0..n {
                    let mut p = c;
                    for i in c + 1..n {
                        if m[i][c].abs() > m[p][c].abs() {
                            p = i;
                        }
                    }
                    m.swap(c, p);
                    perm.swap(c, p);
                    o[c * cols + n + 1] = (p + 1) as f64;
                    let pivot = m[c][c];
                    if check && !above(pivot.abs(), tol) {
                        return Err(Fault::Singular { batch_index, pivot: c as i64 });
                    }
                    if pivot == 0.0 {
                        continue;
                    }
                    for i in c + 1..n {
                        m[i][c] /= pivot;
                        for j in c + 1..n {
                            m[i][j] -= m[i][c] * m[c][j];
                        }
                    }
                }
                for i in 0..n {
                    o[i * cols..i * cols + n].copy_from_slice(&m[i]);
                    o[i * cols + n] = perm[i] as f64;
                }
            }
            LinalgOp::Cholesky => {
                for j in 0..n {
                    let d = a[j * n + j] - (0..j).map(|c| o[j * n + c] * o[j * n + c]).sum::<f64>();
                    if !above(d, 0.0) {
                        return Err(Fault::NotPositiveDefinite { batch_index, minor: j as i64 + 1 });
                    }
                    o[j * n + j] = d.sqrt();
                    for i in j + 1..n {
                        let s = a[i * n + j] - (0..j).map(|c| o[i * n + c] * o[j * n + c]).sum::<f64>();
                        o[i * n + j] = s / o[j * n + j];
                    }
                }
            }
            LinalgOp::TriSolve { upper, unit } => {
                let rhs = &inputs[1][b * n * k..(b + 1) * n * k];
                let rows: Vec<usize> = if upper { (0..n).rev().collect() } else { (0..n).collect() };
                for &i in &rows {
                    let diag = a[i * n + i];
                    if !unit && diag == 0.0 {
                        return Err(Fault::Singular { batch_index, pivot: i as i64 });
                    }
                    let known: Vec<usize> = if upper { (i + 1..n).collect() } else { (0..i).collect() };
                    for c in 0..k {
                        let s = rhs[i * k + c] - known.iter().map(|&j| a[i * n + j] * o[j * k + c]).sum::<f64>();
                        o[i * k + c] = if unit { s } else { s / diag };
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lu(a: &[f64], n: usize) -> Result<Vec<f64>, Fault> {
        let r =
            Routine::Linalg(LinalgRoutine { op: LinalgOp::Lu { check: true }, dtype: DType::F64, batch: 1, n, k: 0 });
        reference(&r, &[a])
    }

    #[test]
    fn lu_pivots_and_packs() {
        // [[1, 2], [3, 4]]: pivot row 1, l = 1/3, u = [[3, 4], [0, 2 - 4/3]].
        let o = lu(&[1.0, 2.0, 3.0, 4.0], 2).expect("regular");
        assert_eq!(o, vec![3.0, 4.0, 1.0, 2.0, 1.0 / 3.0, 2.0 - 4.0 / 3.0, 0.0, 2.0]);
    }

    #[test]
    fn singular_to_working_precision_is_a_fault() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        assert_eq!(lu(&a, 3), Err(Fault::Singular { batch_index: 0, pivot: 2 }));
        assert_eq!(lu(&[0.0; 4], 2), Err(Fault::Singular { batch_index: 0, pivot: 0 }));
        let unchecked = LinalgRoutine { op: LinalgOp::Lu { check: false }, dtype: DType::F64, batch: 1, n: 2, k: 0 };
        assert!(linalg_reference(&unchecked, &[&[0.0; 4]]).is_ok());
    }

    #[test]
    fn cholesky_and_solves() {
        let chol = LinalgRoutine { op: LinalgOp::Cholesky, dtype: DType::F64, batch: 2, n: 2, k: 0 };
        let o = linalg_reference(&chol, &[&[4.0, 0.0, 2.0, 5.0, 1.0, 0.0, 0.0, 1.0]]).expect("positive definite");
        assert_eq!(o, vec![2.0, 0.0, 1.0, 2.0, 1.0, 0.0, 0.0, 1.0]);
        let bad = linalg_reference(&chol, &[&[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 2.0, 1.0]]);
        assert_eq!(bad, Err(Fault::NotPositiveDefinite { batch_index: 1, minor: 2 }));
        // [[2, 0], [1, 4]] x = [2, 6]: x = [1, 5/4]; the upper solve reads [[2, 1], [., 4]] (the 3 is not read).
        let lower = LinalgRoutine {
            op: LinalgOp::TriSolve { upper: false, unit: false },
            dtype: DType::F64,
            batch: 1,
            n: 2,
            k: 1,
        };
        assert_eq!(linalg_reference(&lower, &[&[2.0, 9.0, 1.0, 4.0], &[2.0, 6.0]]), Ok(vec![1.0, 1.25]));
        let upper = LinalgRoutine { op: LinalgOp::TriSolve { upper: true, unit: true }, ..lower };
        assert_eq!(linalg_reference(&upper, &[&[2.0, 1.0, 3.0, 4.0], &[2.0, 6.0]]), Ok(vec![-4.0, 6.0]));
        let zero = linalg_reference(&lower, &[&[2.0, 0.0, 1.0, 0.0], &[2.0, 6.0]]);
        assert_eq!(zero, Err(Fault::Singular { batch_index: 0, pivot: 1 }));
    }
}
