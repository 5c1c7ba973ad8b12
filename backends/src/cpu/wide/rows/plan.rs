//! A row kernel's passes: each row reduction's code, the per-row values worth computing once, and the output, as
//! register programs over `[rows, cols]` (`gemm::epilogue::translate`), with their loops' register layouts.

use super::asm::PassLayout;
use super::{MAX_PASSES, Pass, PassKind, SLOTS};
use crate::cpu::gemm::asm;
use crate::cpu::gemm::epilogue::{self, Epilogue, OperandKind};
use crate::cpu::gemm::program::EpInst;
use crate::cpu::isa::Isa;
use kiln_jit::kernel::gemm::ElementwiseView;
use kiln_jit::kernel::{BufParam, IExpr, Inst, InstOp, KernelIr};
use kiln_jit::{DType, ReduceOp, dtype::Scalar};

/// `k`'s passes at `isa`'s width, or `None` where this file does not run it (see the module doc).
pub(super) fn plan(k: &KernelIr, isa: Isa) -> Option<Vec<Pass>> {
    if !asm::host_supported() || !isa.present() {
        return None;
    }
    let Space { rows, cols, per_row } = space(k)?;
    // The root's own fold (a kernel of per-row outputs) takes the slot after the row reductions'.
    let root_slot = k.rows.len();
    let mut passes = Vec::with_capacity(k.rows.len() + 2);
    let mut next_slot = k.rows.len() + usize::from(per_row);
    // Each row reduction's code and folded value, for the output pass to reuse.
    let mut folded: Vec<(usize, Vec<Inst>, usize)> = Vec::new();
    let root_fold = k.reduce.as_ref().filter(|_| per_row).map(|r| (&r.inner, r.value, Some(r.op)));
    let codes =
        k.rows.iter().map(|r| (&r.inner, r.value, Some(r.op))).chain(root_fold).chain([(&k.outer, k.result, None)]);
    for (j, (insts, result, fold)) in codes.enumerate() {
        let last = j == k.rows.len() + usize::from(per_row);
        let mut code = pass_code(k, insts, fold.is_some(), per_row.then_some(root_slot));
        if last && per_row {
            // Per-row code only (the root's fold and the row reductions, read from the scratch): once per row,
            // straight to the output.
            let ep = translated(k, code.clone(), result, rows, cols, isa)?;
            if ep.operands.iter().any(|o| o.buf != k.inputs.len()) {
                return None; // reads an input per row, which the per-row code does not load
            }
            passes.push(Pass { ep, outer: code, kind: PassKind::RowOut, layout: None, store_out: false });
            break;
        }
        // Per-row arithmetic (a layer norm's `1 / sqrt(var + eps)`) once per row, into a scratch slot.
        for f in row_invariants(&code, result, k.row_rank) {
            if next_slot == SLOTS || passes.len() + 2 > MAX_PASSES {
                break;
            }
            let Some(ep) = translated(k, code.clone(), f, rows, cols, isa) else { continue };
            if ep.operands.iter().any(|o| o.buf != k.inputs.len()) {
                continue; // reads an input per row: stays in the column loop
            }
            let outer = code.clone();
            passes.push(Pass { ep, outer, kind: PassKind::Finish(next_slot), layout: None, store_out: false });
            code[f].op = scratch_load(k, next_slot);
            next_slot += 1;
        }
        let mut reuse = None;
        if fold.is_none() {
            // The latest row reduction whose folded value the output computes again: read it back instead.
            let varies = column_varying(&code, k.row_rank);
            'find: for (pass, rcode, value) in folded.iter().rev() {
                let mut memo = std::collections::HashMap::new();
                for i in 0..code.len() {
                    if varies[i] && same(&code, i, rcode, *value, &mut memo) {
                        code[i].op = out_load(k);
                        reuse = Some(*pass);
                        break 'find;
                    }
                }
            }
        }
        let ep = translated(k, code.clone(), result, rows, cols, isa)?;
        if let Some(p) = reuse {
            passes[p].store_out = true;
        }
        if fold.is_some() {
            folded.push((passes.len(), code.clone(), result));
        }
        let steps_fit = ep.operands.iter().all(|o| match o.kind {
            OperandKind::Mat { ld } => i32::try_from(4 * ld).is_ok(),
            OperandKind::Col { stride } => i32::try_from(4 * stride).is_ok(),
            OperandKind::Row => true,
        });
        let layout = PassLayout::plan(&ep.program, cols, fold, isa).filter(|_| steps_fit)?;
        let kind = fold.map_or(PassKind::Output, |op| PassKind::Fold(op, j));
        passes.push(Pass { ep, outer: code, kind, layout: Some(layout), store_out: false });
    }
    (passes.len() <= MAX_PASSES).then_some(passes)
}

/// The rows and columns of a row kernel this file takes, and how its root computes: elementwise over
/// `[rows, cols]` (softmax, layer norm), or folding the row itself (`per_row`: one output per row; cross entropy's
/// pick of the target's log-probability, its fold `k.reduce`). `None` for any other kernel (see the module doc).
pub(super) struct Space {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) per_row: bool,
}

pub(super) fn space(k: &KernelIr) -> Option<Space> {
    let folds = |op: ReduceOp, dtype: DType| matches!(op, ReduceOp::Sum | ReduceOp::Max) && dtype == DType::F32;
    let rows: usize = k.out_extents[..k.row_rank.min(k.out_rank())].iter().product();
    let (cols, per_row) = match &k.reduce {
        None if k.out_rank() == k.row_rank + 1 => (k.out_extents[k.row_rank], false),
        Some(r) if k.out_rank() == k.row_rank && r.extents.len() == 1 && folds(r.op, r.dtype) => (r.extents[0], true),
        _ => return None,
    };
    let fits = !k.rows.is_empty()
        && k.rows.len() + 2 < MAX_PASSES
        && k.rows.len() + 1 < SLOTS
        && k.output.dtype == DType::F32
        && k.rows.iter().all(|r| folds(r.op, r.dtype) && r.extents == [cols]);
    fits.then_some(Space { rows, cols, per_row })
}

/// A load of scratch slot `slot` of the current row, as the pass kernels read it (a per-row operand).
fn scratch_load(k: &KernelIr, slot: usize) -> InstOp {
    let strides = kiln_jit::shape::contiguous_strides(&k.out_extents[..k.row_rank]);
    let row_flat: Vec<i64> =
        (0..=k.row_rank).map(|v| if v < k.row_rank { (strides[v] * SLOTS) as i64 } else { 0 }).collect();
    InstOp::Load {
        buf: k.inputs.len(),
        index: IExpr::from_affine(&row_flat, slot as i64),
        valid: None,
        fill: Scalar::Int(0),
    }
}

/// One pass's code over the kernel's output loops: a row reduction's reduce variable becomes the column variable,
/// and `RowAcc(j)` a load of scratch slot `j`.
fn pass_code(k: &KernelIr, insts: &[Inst], reduction: bool, acc_slot: Option<usize>) -> Vec<Inst> {
    let (rank, row_rank) = (k.out_rank(), k.row_rank);
    let mut code = insts.to_vec();
    for inst in &mut code {
        if reduction {
            inst.map_indices(&|e| e.map_vars(&|v| IExpr::Var(if v == rank { row_rank } else { v })));
        }
        match (&inst.op, acc_slot) {
            (InstOp::RowAcc(j), _) => inst.op = scratch_load(k, *j),
            (InstOp::Acc, Some(slot)) => inst.op = scratch_load(k, slot),
            _ => {}
        }
    }
    code
}

/// The values of `code` worth computing once per row: computed (not a load or a constant), the same along the
/// row (no load reads the column variable `col`), and read by a value that is not, or the result itself.
fn row_invariants(code: &[Inst], result: usize, col: usize) -> Vec<usize> {
    let mut inv = vec![false; code.len()];
    for (i, inst) in code.iter().enumerate() {
        inv[i] = match &inst.op {
            InstOp::Const(_) => true,
            InstOp::Load { index, valid: None, .. } => !kiln_jit::render::cstyle::mentions_var(index, col),
            InstOp::Unary(_, a) | InstOp::Cast(a) => inv[*a],
            InstOp::Binary(_, a, b) => inv[*a] && inv[*b],
            InstOp::Where(c, a, b) => inv[*c] && inv[*a] && inv[*b],
            InstOp::Load { .. }
            | InstOp::Gather { .. }
            | InstOp::Index(_)
            | InstOp::Rand { .. }
            | InstOp::Acc
            | InstOp::RowAcc(_) => false,
        };
    }
    let computed =
        |i: usize| matches!(code[i].op, InstOp::Unary(..) | InstOp::Binary(..) | InstOp::Where(..) | InstOp::Cast(_));
    let mut frontier = Vec::new();
    let mut note = |i: usize| {
        if inv[i] && computed(i) && code[i].dtype == DType::F32 && !frontier.contains(&i) {
            frontier.push(i);
        }
    };
    for (i, inst) in code.iter().enumerate() {
        if inv[i] {
            continue;
        }
        match &inst.op {
            InstOp::Unary(_, a) | InstOp::Cast(a) => note(*a),
            InstOp::Binary(_, a, b) => {
                note(*a);
                note(*b);
            }
            InstOp::Where(c, a, b) => {
                note(*c);
                note(*a);
                note(*b);
            }
            _ => {}
        }
    }
    note(result);
    frontier.sort_unstable();
    frontier
}

/// A load of the output at the element being computed (the output as an input after the scratch).
fn out_load(k: &KernelIr) -> InstOp {
    let strides = kiln_jit::shape::contiguous_strides(&k.out_extents);
    let coef: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    InstOp::Load { buf: k.inputs.len() + 1, index: IExpr::from_affine(&coef, 0), valid: None, fill: Scalar::Int(0) }
}

/// For each value of `code`: whether it reads the column variable `col` (through a load).
fn column_varying(code: &[Inst], col: usize) -> Vec<bool> {
    let mut varies = Vec::with_capacity(code.len());
    for inst in code {
        let v = match &inst.op {
            InstOp::Load { index, .. } | InstOp::Index(index) => kiln_jit::render::cstyle::mentions_var(index, col),
            InstOp::Unary(_, a) | InstOp::Cast(a) => varies[*a],
            InstOp::Binary(_, a, b) => varies[*a] || varies[*b],
            InstOp::Where(c, a, b) => varies[*c] || varies[*a] || varies[*b],
            // (Never reached: a kernel that gathers is not generated here, `generates`.)
            InstOp::Gather { .. } => true,
            InstOp::Rand { .. } | InstOp::Acc | InstOp::RowAcc(_) | InstOp::Const(_) => false,
        };
        varies.push(v);
    }
    varies
}

/// Whether value `i` of `a` and value `j` of `b` compute the same thing the same way (every operation, operand
/// and index equal), so one may stand for the other bit for bit. `memo` holds the pairs compared already (the
/// code is a DAG: without it a value read twice would be compared twice, at every level).
fn same(
    a: &[Inst],
    i: usize,
    b: &[Inst],
    j: usize,
    memo: &mut std::collections::HashMap<(usize, usize), bool>,
) -> bool {
    if let Some(&s) = memo.get(&(i, j)) {
        return s;
    }
    let (x, y) = (&a[i], &b[j]);
    let s = x.dtype == y.dtype
        && match (&x.op, &y.op) {
            (InstOp::Unary(u, p), InstOp::Unary(v, q)) => u == v && same(a, *p, b, *q, memo),
            (InstOp::Cast(p), InstOp::Cast(q)) => same(a, *p, b, *q, memo),
            (InstOp::Binary(o, p, r), InstOp::Binary(w, q, s)) => {
                o == w && same(a, *p, b, *q, memo) && same(a, *r, b, *s, memo)
            }
            (InstOp::Where(c, p, r), InstOp::Where(d, q, s)) => {
                same(a, *c, b, *d, memo) && same(a, *p, b, *q, memo) && same(a, *r, b, *s, memo)
            }
            (InstOp::Load { .. } | InstOp::Const(_), _) => x.op == y.op,
            _ => false,
        };
    memo.insert((i, j), s);
    s
}

/// `code` (value `result`) as an elementwise kernel over `[rows, cols]` reading the scratch as an extra input,
/// translated into a register program; `None` where it does not translate.
fn translated(k: &KernelIr, code: Vec<Inst>, result: usize, rows: usize, cols: usize, isa: Isa) -> Option<Epilogue> {
    let mut inputs = k.inputs.clone();
    inputs.push(BufParam { dtype: DType::F32, len: rows * SLOTS });
    inputs.push(k.output.clone());
    let pass = KernelIr {
        name: format!("{}_pass", k.name),
        inputs,
        output: BufParam { dtype: DType::F32, len: k.output.len },
        out_extents: k.out_extents[..k.row_rank].iter().copied().chain([cols]).collect(),
        reduce: None,
        rows: Vec::new(),
        row_rank: k.row_rank + 1,
        outer: code,
        result,
        flops_per_elem: 0,
        routine: None,
    };
    if pass.out_rank() != 2 {
        return None;
    }
    let view = ElementwiseView::of(&pass).filter(|v| v.batch.is_empty() && (v.m, v.n) == (rows, cols))?;
    let scratch = k.inputs.len();
    let allow = epilogue::Allow {
        bf16: false,
        bf16_loads: false,
        positions: true,
        scalef: isa == Isa::Avx512,
        register_buf: Some(scratch),
    };
    let mut ep = epilogue::translate_with(&pass, &view.roles, allow)?;
    // The scratch's operands (addressed through its register, `asm::emit_pass`) after the others, which keep the
    // indices of their pointer slots and registers (`OPERAND_REGS`) under `MAX_OPERANDS`: a layer norm's gradient
    // reads five inputs and four per-row values.
    let mut order: Vec<usize> = (0..ep.operands.len()).collect();
    order.sort_by_key(|&o| ep.operands[o].buf == scratch);
    let mut new_index = vec![0; order.len()];
    for (to, &from) in order.iter().enumerate() {
        new_index[from] = to;
    }
    ep.operands = order.iter().map(|&o| ep.operands[o].clone()).collect();
    for inst in &mut ep.program.insts {
        if let EpInst::Mat { op, .. } | EpInst::Row { op, .. } | EpInst::Col { op, .. } = inst {
            *op = new_index[*op];
        }
    }
    Some(ep)
}
