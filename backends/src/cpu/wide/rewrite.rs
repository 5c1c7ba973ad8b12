//! Rewrites of a kernel's IR into the shape the generated loop runs: a longer loop as the row loop, masks on batch
//! positions read through per-row gates, a reduction's inner code as an elementwise kernel of its sums.

use super::Along;
use crate::cpu::gemm::epilogue;
use crate::cpu::gemm::program::EpProgram;
use kiln_jit::kernel::{IExpr, Inst, KernelIr};

/// The elementwise kernel `k` (loops merged) with another output loop as its row loop, where its row loop is short
/// and a longer loop before it takes no part in a mask: the loops reordered (the columns stay last) and the output's
/// original strides per batch dim and per row, which the kernel then writes through. Each call of the generated code
/// runs the rows of one batch element, so the row loop sets the number of calls: attention's q/k/v gradients put
/// back into one `[B, T, 3 * D]` (`[16, 64, 3, 4, 32]`, rows of 4 head-dim vectors) made 3072 calls of 4 rows, and
/// with T as the row loop make 192 of 64. The elements and what each computes are unchanged (each element is still
/// loaded before its own store, so a donated input stays safe); only their order differs. `None` where the kernel
/// keeps its loops.
pub(super) fn with_longest_rows(k: &KernelIr) -> Option<(KernelIr, (Vec<usize>, usize))> {
    use kiln_jit::kernel::{IExpr, InstOp};
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
    // A masked load's tested loops must stay batch loops (`gate_batch_masks` reads them per batch element).
    let tested: Vec<usize> = k
        .outer
        .iter()
        .filter_map(|i| match &i.op {
            InstOp::Load { valid: Some(v), .. } => Some(v.0.iter().flat_map(|(e, _, _)| e.vars()).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    let best = (0..mvar).filter(|v| !tested.contains(v)).max_by_key(|&v| (k.out_extents[v], v))?;
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

/// For a kernel whose masked loads [`gate_batch_masks`] will gate: the buffer each gated load reads, in gate order,
/// where a closed gate's load may read another's bytes instead of its own (empty where not): every gated load reads
/// a buffer of its own (no other load reads it) at the same index, in the same dtype, so within a batch element the
/// loads of every part read the same addresses. A concatenation's parts are such loads: each output element takes
/// one part and the others' loads, whose values the gates discard, read the taken part's element again (from cache)
/// instead of their own part's, which a pass over the output would otherwise read in full once per part.
pub(super) fn shared_gate_reads(k: &KernelIr) -> Vec<usize> {
    use kiln_jit::kernel::InstOp;
    let rank = k.out_rank();
    if rank < 3 {
        return Vec::new();
    }
    let mut gated = Vec::new();
    let mut reads = vec![0usize; k.inputs.len()];
    for inst in &k.outer {
        if let InstOp::Load { buf, index, .. } = &inst.op {
            reads[*buf] += 1;
            if batch_gated(&inst.op, rank) {
                gated.push((*buf, index, inst.dtype));
            }
        }
    }
    let alike = gated.windows(2).all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
    let own = gated.iter().all(|&(buf, _, _)| reads[buf] == 1 && k.inputs[buf].len == k.inputs[gated[0].0].len);
    if gated.len() < 2 || !alike || !own {
        return Vec::new();
    }
    gated.iter().map(|&(buf, _, _)| buf).collect()
}

/// Whether `op` is a load [`gate_batch_masks`] reads through a gate: masked, its ranges testing only batch positions
/// (loop variables before the last two of `rank`), its index independent of the variables they test.
fn batch_gated(op: &kiln_jit::kernel::InstOp, rank: usize) -> bool {
    let kiln_jit::kernel::InstOp::Load { index, valid: Some(v), .. } = op else { return false };
    let tested: Vec<usize> = v.0.iter().flat_map(|(e, _, _)| e.vars()).collect();
    let coef = index.affine(rank).map(|(c, _)| c);
    tested.iter().all(|&t| t + 2 < rank) && coef.is_some_and(|c| tested.iter().all(|&t| c[t] == 0))
}

/// Element strides of a row-major layout over `extents`.
pub(super) fn row_major_strides(extents: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; extents.len()];
    for d in (0..extents.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * extents[d + 1];
    }
    strides
}

/// `k` with its masked loads whose ranges test only batch positions (loop variables before the last two: a pad or a
/// concatenation along an outer dim, such as attention's q/k/v gradients put back into one `[B * T, 3 * D]`)
/// rewritten as unmasked loads selected by a gate: an i32 table, 1 where the load's ranges hold, read per row (a
/// per-row operand), built here from the ranges, one table per load (`None`: no such load). The register program
/// then runs such a kernel at full width, where the masks had left it to a 4-lane Cranelift kernel. The same
/// values: where a gate is 0 the `where` gives the load's fill, as the masked load did.
///
/// Only loads whose index does not depend on the variables their ranges test (a padded dim of one element reads
/// its element 0): the address read where the gate is 0 is then one read where it is 1, inside the buffer.
pub(super) fn gate_batch_masks(k: &KernelIr) -> Option<(KernelIr, Vec<Vec<i32>>)> {
    const MAX_GATE_ROWS: usize = 1 << 20;
    use kiln_jit::kernel::index::IExpr;
    use kiln_jit::kernel::ir::{BufParam, InstOp};
    use kiln_jit::{DType, Scalar, op::BinaryOp};
    let rank = k.out_rank();
    if k.reduce.is_some() || !k.rows.is_empty() || rank < 3 {
        return None;
    }
    let batch_rank = rank - 2;
    let gated = |op: &InstOp| batch_gated(op, rank);
    if !k.outer.iter().any(|i| gated(&i.op)) {
        return None;
    }
    let (batch, m) = (&k.out_extents[..batch_rank], k.out_extents[batch_rank]);
    let rows: usize = batch.iter().product::<usize>() * m;
    // A table entry per row: past a few MiB (rows of a few elements over a large tensor) the Cranelift kernel's
    // masks are the cheaper way.
    if rows > MAX_GATE_ROWS {
        return None;
    }
    // Row r's batch position and its index in the table (`b * m + row`): the per-row operand's index.
    let row_index = {
        let mut stride = m as i64;
        let mut terms = vec![IExpr::Var(batch_rank)];
        for d in (0..batch_rank).rev() {
            terms.push(IExpr::Var(d).times(stride));
            stride *= batch[d] as i64;
        }
        IExpr::Add(terms)
    };
    let mut out = k.clone();
    out.outer.clear();
    let mut gates = Vec::new();
    let mut ids = Vec::with_capacity(k.outer.len());
    let push = |out: &mut KernelIr, op: InstOp, dtype: DType| {
        out.outer.push(Inst { op, dtype });
        out.outer.len() - 1
    };
    for inst in &k.outer {
        if gated(&inst.op) {
            let InstOp::Load { buf, index, valid: Some(v), fill } = inst.op.clone() else {
                unreachable!("gated loads are masked")
            };
            let mut vars = vec![0i64; rank];
            let table: Vec<i32> = (0..rows)
                .map(|r| {
                    let mut rest = r / m;
                    for d in (0..batch_rank).rev() {
                        vars[d] = (rest % batch[d]) as i64;
                        rest /= batch[d];
                    }
                    i32::from(v.0.iter().all(|(e, lo, hi)| (*lo..*hi).contains(&e.eval(&vars))))
                })
                .collect();
            let gate_buf = k.inputs.len() + gates.len();
            gates.push(table);
            out.inputs.insert(gate_buf, BufParam { dtype: DType::I32, len: rows });
            let load = push(&mut out, InstOp::Load { buf, index, valid: None, fill }, inst.dtype);
            let gate = InstOp::Load { buf: gate_buf, index: row_index.clone(), valid: None, fill: Scalar::Int(0) };
            let gate = push(&mut out, gate, DType::I32);
            let zero = push(&mut out, InstOp::Const(Scalar::Int(0)), DType::I32);
            let open = push(&mut out, InstOp::Binary(BinaryOp::Ne, gate, zero), DType::Bool);
            let fill = push(&mut out, InstOp::Const(fill), inst.dtype);
            ids.push(push(&mut out, InstOp::Where(open, load, fill), inst.dtype));
            continue;
        }
        let mut inst = inst.clone();
        inst.map_operands(|a| ids[a]);
        out.outer.push(inst);
        ids.push(out.outer.len() - 1);
    }
    out.result = ids[k.result];
    Some((out, gates))
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
