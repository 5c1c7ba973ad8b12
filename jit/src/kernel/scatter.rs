//! The scatter-sum routine (`Op::ScatterRows`): `out[p, w] = sum of src[t, w] over the rows t whose index is p`,
//! the primitive under `scatter_add`, `index_add` and the gradients of `gather` and `embedding`.
//!
//! Written as a comparison of every index with every position (a reduction the kernel IR can express), the same sum
//! costs O(positions x sources); as a product with a one-hot matrix it is a GEMM of that size. At a 32k-token
//! vocabulary and 4096 tokens of width 128 that is ~17 GFLOP for an embedding gradient PyTorch computes with 0.5 M
//! adds. A routine walks the sources once instead, which the kernel IR cannot say (where a row goes is data), so
//! each device writes it (`kernel::routine`).
//!
//! # Semantics (every device, the reference included)
//! - Sources: `index` `[J, 1]` (one index per source row, the `index_select` / `embedding` / `index_add` case) or
//!   `[J, W]` (one per element: a general `scatter_add` with its dim moved first), i32 or i64; `src` `[J, W]` in f32
//!   or f64 (the callers widen f16 and bf16 to f32 and round the result once). The result is `[P, W]` in `src`'s
//!   dtype.
//! - Each output element starts at zero and adds its sources **in ascending row order, in the dtype**: so the result
//!   is the same bits on every run, every thread count and every device (a GPU runs no float atomics here), and the
//!   reference, which rounds after each add as the devices do, matches them bit for bit.
//! - An index outside `0..P` is a fault `ScatterIndex { len: P, index }` (PyTorch raises), never a write outside the
//!   output. Of several, the device reports one (the reference: the first in row-major order).

use crate::dtype::DType;
use crate::graph::NodeData;
use crate::kernel::fault::Fault;
use crate::kernel::ir::{BufParam, KernelIr};
use crate::kernel::routine::Routine;

/// One scatter-sum launch (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScatterRows {
    /// The values' and the result's dtype (f32 or f64).
    pub dtype: DType,
    /// The indices' dtype (i32 or i64).
    pub index: DType,
    /// Source rows (J).
    pub rows: usize,
    /// Row width (W).
    pub width: usize,
    /// Output rows (P): the indices' range.
    pub positions: usize,
    /// One index per element (`index` is `[J, W]`) rather than per row (`[J, 1]`).
    pub per_element: bool,
}

impl ScatterRows {
    /// The routine computing `node` (an `Op::ScatterRows { positions }`) from `srcs` (index, values).
    pub fn of(positions: usize, node: &NodeData, srcs: &[&NodeData]) -> ScatterRows {
        let (i, v) = (srcs[0].shape.dims(), srcs[1].shape.dims());
        ScatterRows {
            dtype: node.dtype,
            index: srcs[0].dtype,
            rows: v[0],
            width: v[1],
            positions,
            per_element: i[1] == v[1] && v[1] != 1,
        }
    }

    /// Index columns: one per element, or one per row.
    pub fn index_cols(&self) -> usize {
        if self.per_element { self.width } else { 1 }
    }

    /// Element operations: the adds and the zeroing of the output.
    pub fn work(&self) -> usize {
        (self.rows + self.positions) * self.width
    }

    /// The launch's descriptor kernel (`kernel::routine`).
    pub fn kernel(&self) -> KernelIr {
        let kind = if self.per_element { "elems" } else { "rows" };
        crate::kernel::routine::descriptor(
            Routine::Scatter(*self),
            format!("S_scatter_{kind}_{}x{}_to_{}", self.rows, self.width, self.positions),
            vec![
                BufParam { dtype: self.index, len: self.rows * self.index_cols() },
                BufParam { dtype: self.dtype, len: self.rows * self.width },
            ],
            BufParam { dtype: self.dtype, len: self.positions * self.width },
            vec![self.positions, self.width],
        )
    }

    /// The output from `inputs` (the indices and the values as f64), in the module doc's order and rounding, or the
    /// first out-of-range index's fault.
    pub fn reference(&self, inputs: &[&[f64]]) -> Result<Vec<f64>, Fault> {
        let (w, c) = (self.width, self.index_cols());
        let round = |x: f64| if self.dtype == DType::F32 { x as f32 as f64 } else { x };
        let mut out = vec![0.0; self.positions * w];
        for (t, row) in inputs[0].chunks(c).enumerate().take(self.rows) {
            for col in 0..w {
                let p = row[if c == 1 { 0 } else { col }];
                if !(p >= 0.0 && p < self.positions as f64) {
                    return Err(Fault::ScatterIndex { len: self.positions as i64, index: p as i64 });
                }
                let o = &mut out[p as usize * w + col];
                *o = round(*o + inputs[1][t * w + col]);
            }
        }
        Ok(out)
    }
}

/// How a GPU launch spreads a scatter over its threads: thread `g` owns column `g % width` of the `block_rows`
/// output rows of block `g / width`; it zeroes them, then walks every index in row order and adds the values that
/// land in its rows. No two threads write one element, so no atomics, and each element's adds keep row order. Every
/// thread reads every index (a broadcast: the threads of a warp read the same one), so the blocks trade that
/// repeated read against parallelism: `target` threads where the output has that many columns times rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLayout {
    pub block_rows: usize,
    pub blocks: usize,
    /// `blocks * width`.
    pub threads: usize,
    /// The longest loop of one thread (the index walk, or the zeroing of its rows).
    pub trips: usize,
}

impl ScatterRows {
    /// The layout for about `target` threads (see [`GpuLayout`]).
    pub fn gpu_layout(&self, target: usize) -> GpuLayout {
        let blocks = target.div_ceil(self.width.max(1)).clamp(1, self.positions.max(1));
        let block_rows = self.positions.div_ceil(blocks).max(1);
        let blocks = self.positions.div_ceil(block_rows);
        GpuLayout { block_rows, blocks, threads: blocks * self.width, trips: self.rows.max(block_rows) }
    }
}

/// The graph check of an `Op::ScatterRows { positions }` node.
pub fn check(positions: usize, srcs: &[&NodeData], d: &NodeData) -> Result<(), String> {
    let (i, v) = (srcs[0].shape.dims(), srcs[1].shape.dims());
    let fits = i.len() == 2 && v.len() == 2 && i[0] == v[0] && (i[1] == 1 || i[1] == v[1]);
    if !fits || d.shape.dims() != [positions, v[1]] {
        return Err(format!(
            "scatter_rows: index {} and values {} into {positions} rows give {}",
            srcs[0].shape, srcs[1].shape, d.shape
        ));
    }
    if !matches!(srcs[0].dtype, DType::I32 | DType::I64)
        || !matches!(d.dtype, DType::F32 | DType::F64)
        || srcs[1].dtype != d.dtype
    {
        return Err(format!(
            "scatter_rows: {} indices, f32 or f64 values and result, got {} -> {}",
            srcs[0].dtype, srcs[1].dtype, d.dtype
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scatter(
        positions: usize,
        per_element: bool,
        index: &[f64],
        src: &[f64],
        width: usize,
    ) -> Result<Vec<f64>, Fault> {
        let rows = src.len() / width;
        let s = ScatterRows { dtype: DType::F32, index: DType::I64, rows, width, positions, per_element };
        s.reference(&[index, src])
    }

    #[test]
    fn rows_add_in_order_and_round_per_add() {
        // Rows 0 and 2 go to position 1, row 1 to position 2, nothing to 0.
        let got = scatter(3, false, &[1.0, 2.0, 1.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2).expect("in range");
        assert_eq!(got, vec![0.0, 0.0, 6.0, 8.0, 3.0, 4.0]);
        // 1 + 2^-24 rounds back to 1 in f32 before the next add: (1 + 2^-24) + 2^-24 = 1, where f64 keeps 1 + 2^-23.
        let tiny = 2f64.powi(-24);
        assert_eq!(scatter(1, false, &[0.0; 3], &[1.0, tiny, tiny], 1), Ok(vec![1.0]));
    }

    #[test]
    fn elements_take_their_own_index_and_a_bad_one_is_a_fault() {
        let got = scatter(2, true, &[0.0, 1.0, 1.0, 1.0], &[1.0, 2.0, 3.0, 4.0], 2).expect("in range");
        assert_eq!(got, vec![1.0, 0.0, 3.0, 6.0]);
        let bad = scatter(2, true, &[0.0, 1.0, 2.0, -1.0], &[1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(bad, Err(Fault::ScatterIndex { len: 2, index: 2 }));
    }
}
