//! Rewrites of a kernel's IR into the shape the generated loop runs: a longer loop as the row loop, a reduction's
//! inner code as an elementwise kernel of its sums.

use super::Along;
use crate::cpu::gemm::epilogue;
use crate::cpu::gemm::program::EpProgram;
use kiln_jit::kernel::{IExpr, KernelIr};

/// The elementwise kernel `k` (loops merged) with another output loop as its row loop, where its row loop is short
/// and a longer loop before it: the loops reordered (the columns stay last) and the output's
/// original strides per batch dim and per row, which the kernel then writes through. Each call of the generated code
/// runs the rows of one batch element, so the row loop sets the number of calls: attention's q/k/v gradients put
/// back into one `[B, T, 3 * D]` (`[16, 64, 3, 4, 32]`, rows of 4 head-dim vectors) made 3072 calls of 4 rows, and
/// with T as the row loop make 192 of 64. The elements and what each computes are unchanged (each element is still
/// loaded before its own store, so a donated input stays safe); only their order differs. `None` where the kernel
/// keeps its loops. A loop a mask tests may become the row loop: a kernel cut into regions
/// (`WideKernel::build_regions`) splits its rows where the masks change, and a masked kernel left whole is not
/// generated here at all.
pub(super) fn with_longest_rows(k: &KernelIr) -> Option<(KernelIr, (Vec<usize>, usize))> {
    /// Rows a call must have before another loop is considered, and how many times longer that loop must be.
    const SHORT_ROWS: usize = 16;
    const LONGER: usize = 4;
    let rank = k.out_rank();
    if k.reduce.is_some() || !k.rows.is_empty() || rank < 3 {
        return None;
    }
    let (mvar, nvar) = (rank - 2, rank - 1);
    let m = k.out_extents[mvar];
    if m >= SHORT_ROWS {
        return None;
    }
    let best = (0..mvar).max_by_key(|&v| (k.out_extents[v], v))?;
    if k.out_extents[best] < LONGER * m {
        return None;
    }
    let order: Vec<usize> = (0..nvar).filter(|&v| v != best).chain([best, nvar]).collect();
    let mut new_of_old = vec![0; rank];
    for (i, &o) in order.iter().enumerate() {
        new_of_old[o] = i;
    }
    let extents: Vec<usize> = order.iter().map(|&o| k.out_extents[o]).collect();
    let remap = |e: &IExpr| e.map_vars(&|v| IExpr::Var(new_of_old[v])).simplify(&extents);
    let mut out = k.clone();
    out.out_extents = extents.clone();
    for inst in &mut out.outer {
        inst.map_indices(&remap);
    }
    let row_major = row_major_strides(&k.out_extents);
    let strides: Vec<usize> = order.iter().map(|&o| row_major[o]).collect();
    Some((out, (strides[..rank - 2].to_vec(), strides[rank - 2])))
}

/// Element strides of a row-major layout over `extents`.
pub(super) fn row_major_strides(extents: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; extents.len()];
    for d in (0..extents.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * extents[d + 1];
    }
    strides
}

/// Whether `k` has bf16 values (an input, arithmetic in its outer or reduce code, its output): such a kernel is
/// generated at 16 lanes only. The reduce code counts: a row sum's loads live there (`sum_parts`).
pub(super) fn touches_bf16(k: &KernelIr) -> bool {
    let bf16 = kiln_jit::DType::BF16;
    let mut code = k.outer.iter().chain(k.reduce.iter().flat_map(|r| r.inner.iter()));
    k.output.dtype == bf16 || k.inputs.iter().any(|b| b.dtype == bf16) || code.any(|i| i.dtype == bf16)
}

/// For a reduce kernel this file runs as sums `along` one of its loops ([`Sum`]): its inner code as an elementwise
/// kernel over `[rows, k]` for row sums (the reduce loop as the columns) or `[k, cols]` for column sums (the reduce
/// loop as the rows), and its outer code as a register program of the sum. `None` for any other kernel: another
/// reduction than an f32 sum over one non-empty loop, an output of rank other than 1, outer code with loads or ops
/// the register program lacks. Whether the inner code's loads walk the view's columns contiguously is the view's
/// check (`ElementwiseView`, `epilogue::translate_with`).
pub(super) fn sum_parts(k: &KernelIr, along: Along) -> Option<(KernelIr, EpProgram)> {
    let k = k.clone().without_unit_loops();
    let r = k.reduce.as_ref().filter(|_| k.rows.is_empty())?;
    if r.op != kiln_jit::ReduceOp::Sum
        || r.dtype != kiln_jit::DType::F32
        || r.extents.len() != 1
        || r.extents[0] == 0
        || k.out_rank() != 1
        || k.output.dtype != kiln_jit::DType::F32
    {
        return None;
    }
    let (out, red) = (k.out_extents[0], r.extents[0]);
    let outer = epilogue::translate_row_outer(&k.outer, k.result)?;
    // The inner code reads the output's loop as variable 0 and the reduce loop as 1: a row sum's view keeps them,
    // column sums' view swaps them.
    let extents = match along {
        Along::Rows => [out, red],
        Along::Cols => [red, out],
    };
    let mut code = r.inner.clone();
    if along == Along::Cols {
        let swap = |e: &IExpr| e.map_vars(&|v| IExpr::Var(1 - v)).simplify(&extents);
        for inst in &mut code {
            inst.map_indices(&swap);
        }
    }
    let inner = KernelIr {
        name: format!("{}_inner", k.name),
        inputs: k.inputs.clone(),
        output: kiln_jit::kernel::BufParam { dtype: kiln_jit::DType::F32, len: out * red },
        out_extents: extents.to_vec(),
        reduce: None,
        rows: Vec::new(),
        row_rank: 2,
        outer: code,
        result: r.value,
        flops_per_elem: 0,
        routine: None,
    };
    Some((inner, outer))
}
