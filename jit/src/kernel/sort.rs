//! The row sort routine (`Op::SortRows`): for each row of a `[rows, n]` buffer, the indices that sort it, the
//! primitive under `sort`, `argsort` and `topk` on devices that run it (the CPU).
//!
//! The kernel IR can only say a sort as a fixed network of compare-exchanges (`Tensor::sort`'s bitonic network:
//! `log2(N) (log2(N) + 1) / 2` stages of several kernels over the whole row, 47-70 ms for one row of 32k logits on
//! two cores, where PyTorch's sort takes 2 ms), or as an O(n²) count. A routine sorts each row in O(n log n) or
//! less (the CPU's: a radix sort of order keys; for `topk` a filter against its k best so far, then their sort),
//! which needs data-dependent control flow, so each device that runs it writes it itself (`kernel::routine`): the
//! CPU in Rust (`backends/src/cpu/sort.rs`). Devices without it (wgpu, CUDA, HIP) keep the network, and
//! `Tensor::sort` builds this op only for a device that has it (`Device::sorts_rows`; not the CPU in a process that
//! compiles its plans for a GPU ahead of time, which records what the GPU would).
//!
//! # Semantics (every device, the reference included)
//! - Source: `[rows, n]` values of any dtype (bool as 0 and 1); result: `[rows, keep]` indices in `0..n`, i64
//!   (or i32), row-major, `keep <= n`.
//! - Row `r`'s result lists its first `keep` positions (all `n` for a sort, `k` for `topk`) in the order of their
//!   values: ascending, or descending with `descending`, where every NaN is above every number (last ascending,
//!   first descending, as PyTorch), `-0` equals `+0`, and equal values (NaN with NaN) keep their index order in both
//!   directions: `torch.sort(stable=True)`, whose `descending` keeps ties in index order too.
//! - No faults. The reference reads the values as f64, exact for every dtype but i64 and u64 magnitudes past 2^53,
//!   which it compares rounded; the devices compare every dtype exactly.

use crate::dtype::DType;
use crate::graph::NodeData;
use crate::kernel::ir::{BufParam, KernelIr};
use crate::kernel::routine::Routine;
use std::cmp::Ordering;

/// One row sort launch (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SortRows {
    /// The values' dtype.
    pub dtype: DType,
    /// The result's dtype (i32 or i64).
    pub index: DType,
    pub rows: usize,
    /// Row length.
    pub n: usize,
    /// Indices kept of each row's order (`n` for a whole sort).
    pub keep: usize,
    pub descending: bool,
}

impl SortRows {
    /// The routine computing `node` (an `Op::SortRows { descending, keep }`) from `srcs` (the values).
    pub fn of(descending: bool, keep: usize, node: &NodeData, srcs: &[&NodeData]) -> SortRows {
        let v = srcs[0].shape.dims();
        SortRows { dtype: srcs[0].dtype, index: node.dtype, rows: v[0], n: v[1], keep, descending }
    }

    /// Element operations, for the pool's split decision: `n log2 n` comparisons a row.
    pub fn work(&self) -> usize {
        self.rows * self.n * (usize::BITS - self.n.leading_zeros()).max(1) as usize
    }

    /// The launch's descriptor kernel (`kernel::routine`).
    pub fn kernel(&self) -> KernelIr {
        let order = if self.descending { "desc" } else { "asc" };
        crate::kernel::routine::descriptor(
            Routine::Sort(*self),
            format!("S_sort_{order}_{}x{}_keep{}", self.rows, self.n, self.keep),
            vec![BufParam { dtype: self.dtype, len: self.rows * self.n }],
            BufParam { dtype: self.index, len: self.rows * self.keep },
            vec![self.rows, self.keep],
        )
    }

    /// The output from the values as f64, in the module doc's order.
    pub fn reference(&self, inputs: &[&[f64]]) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.rows * self.keep);
        for row in inputs[0].chunks(self.n.max(1)).take(self.rows) {
            let mut idx: Vec<usize> = (0..row.len()).collect();
            idx.sort_by(|&i, &j| self.order(row[i], row[j]).then(i.cmp(&j)));
            out.extend(idx.into_iter().take(self.keep).map(|i| i as f64));
        }
        out
    }

    /// How value `a` compares with value `b` in the sorted order (ties `Equal`).
    fn order(&self, a: f64, b: f64) -> Ordering {
        let o = match (a.is_nan(), b.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            // -0 == +0 here, as the module doc says.
            (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        };
        if self.descending { o.reverse() } else { o }
    }
}

/// The graph check of `Op::SortRows { keep, .. }`: a `[rows, n]` source, a `[rows, keep]` result in i32 or i64.
pub fn check(keep: usize, srcs: &[&NodeData], d: &NodeData) -> Result<(), String> {
    let v = srcs[0].shape.dims();
    if v.len() != 2 || keep > v[1] || d.shape.dims() != [v[0], keep] {
        return Err(format!("sort_rows: values {} keeping {keep} give {}", srcs[0].shape, d.shape));
    }
    if !matches!(d.dtype, DType::I32 | DType::I64) {
        return Err(format!("sort_rows: the result holds indices (i32 or i64), not {}", d.dtype));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sort(values: &[f64], descending: bool) -> Vec<f64> {
        let r =
            SortRows { dtype: DType::F32, index: DType::I64, rows: 1, n: values.len(), keep: values.len(), descending };
        r.reference(&[values])
    }

    #[test]
    fn nan_is_largest_zeros_tie_and_ties_keep_index_order_both_ways() {
        let v = [1.0, f64::NAN, -0.0, 2.0, 0.0, f64::NAN, 1.0, f64::NEG_INFINITY];
        assert_eq!(sort(&v, false), [7.0, 2.0, 4.0, 0.0, 6.0, 3.0, 1.0, 5.0]);
        assert_eq!(sort(&v, true), [1.0, 5.0, 3.0, 0.0, 6.0, 2.0, 4.0, 7.0]);
    }

    #[test]
    fn rows_sort_apart() {
        let r = SortRows { dtype: DType::I32, index: DType::I32, rows: 2, n: 3, keep: 3, descending: false };
        assert_eq!(r.reference(&[&[3.0, 1.0, 2.0, 0.0, 0.0, -1.0]]), [1.0, 2.0, 0.0, 2.0, 0.0, 1.0]);
        let top = SortRows { keep: 1, descending: true, ..r };
        assert_eq!(top.reference(&[&[3.0, 1.0, 2.0, 0.0, 0.0, -1.0]]), [0.0, 0.0]);
    }
}
