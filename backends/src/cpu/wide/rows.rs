//! Row kernels (`KernelIr::rows`: softmax, log_softmax, layer norm) at full vector width, generated at run time.
//!
//! Why: a row kernel reads each row from memory once and then runs two or three passes over it while it is in L1;
//! those passes are arithmetic, which the Cranelift kernels do four lanes at a time. Here each pass is one register
//! program (`gemm::epilogue::translate`, the elementwise kernels' own translation, `wide/mod.rs`) in a column loop at 8
//! or 16 lanes (`wide::width`). The schedule makes a row kernel on the CPU only where this file takes it
//! ([`generates`], the schedule's `row_kernel_ok`).
//!
//! What runs here: f32 row kernels with one row loop (after `KernelIr::with_merged_row_loops`) and one column loop
//! (`[rows, cols]`), sum or max row reductions over the row's columns, and code the register program expresses.
//! The root either stores over `[rows, cols]` (softmax) or folds the row itself, a sum or max after the row
//! reductions, into one output per row (cross entropy's pick of the target's log-probability: its fold is one more
//! pass into a scratch slot, and the code after it a per-row pass, [`PassKind::RowOut`], that reads only the
//! scratch; per-row code that reads an input, such as cross entropy's range check on its i64 targets, is declined,
//! and the schedule then keeps it in a kernel of its own). Each pass is translated as an elementwise kernel over
//! `[rows, cols]` in which a read of row reduction `j` (`RowAcc`) is a per-row value (`OperandKind::Col`) of a
//! scratch the kernel writes: the row's folded values, on the caller's stack. A pass may read each lane's column
//! (`EpInst::Position`: `arange(C) == target`), computed from the column offset in rax and a lane constant per
//! unrolled copy, and compare i32 values. Three things keep the passes cheap:
//! - per-row arithmetic (layer norm's `1 / sqrt(var + eps)`, log_softmax's `log(sum)`) is a pass of its own
//!   (`PassKind::Finish`) that computes it once per row into a scratch slot, instead of once per vector;
//! - a sum pass whose value the output computes again (softmax's `exp(x - max)`) stores each vector to the output
//!   as it folds it, and the output pass reads it back (`Pass::store_out`): one `exp` per element, not two;
//! - every pass after the first prefetches the next row's inputs, which the first pass would otherwise wait for;
//! - where a per-row value follows the reductions, the next row's first pass runs right after it (`emit`), so the
//!   next row streams in from memory while this row's last passes run (softmax over 4096 x 1024 at 16 lanes:
//!   1.34 -> 1.20-1.26 ms; log_softmax, layer norm and cross entropy measured the same as before).
//!
//! Code: `extern "sysv64" fn(table, rows, cols)`, `table` = `[out, tail mask, scratch, then per pass: uniforms,
//! operand pointers ([`OPERANDS_PER_PASS`] slots)]`, pointers at the chunk's first row. Per row, per pass: the pass's
//! uniforms and per-row values are broadcast into registers, its operand pointers loaded from the table; then
//! `unroll` vectors per iteration, single vectors, and a masked tail. A reduction pass folds each vector into one
//! accumulator per unrolled copy (a sum adds; a max takes `vmaxps` and keeps a NaN mask apart, so a NaN anywhere
//! makes the row's max NaN, as the interpreter's fold does), masks the tail's lanes past the row to the fold's
//! identity, combines the copies and the lanes, and stores the value to the scratch. The output pass stores its
//! vectors. At the row's end the output pointer and every pass's operand pointers in the table step one row. The
//! scratch has two halves (`2 * SLOTS` floats): a first pass run a row ahead folds into the other half (r15), and
//! r14 and r15 swap at the row's end; its operand pointers step right after each of its runs instead.
//!
//! Results agree with the interpreter within the f32 accumulation tolerance (a row's lanes are folded in another
//! order); the output pass is the elementwise kernels' arithmetic. Deliberately not done: aligning the output's
//! stores (the elementwise kernels' masked head), several rows' passes interleaved beyond the first pass's one row
//! ahead, f16 and bf16 rows (they stay apart).

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::emit::{Access, KMASK, load_vector, put, restore_registers_and_return, save_registers, store_vector};
use super::{MASK_REG, OPERAND_REGS};
use crate::cpu::gemm::asm;
use crate::cpu::gemm::asm512::Zmm;
use crate::cpu::gemm::epilogue::{self, Epilogue, OperandKind, Uniforms};
use crate::cpu::gemm::evex::{gpr, mem};
use crate::cpu::gemm::program::{EpInst, EpProgram, VBin, pred};
use crate::cpu::gemm::program_asm::{self, VecIsa};
use crate::cpu::isa::{self, Isa};
use crate::cpu::pool;
use dynasmrt::x64::Assembler;
use dynasmrt::{DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};
use kiln_jit::kernel::gemm::ElementwiseView;
use kiln_jit::kernel::{BufParam, IExpr, Inst, InstOp, KernelIr};
use kiln_jit::{DType, ReduceOp, dtype::Scalar};
use std::fmt::Write;

/// `table, rows, cols`: see the module doc.
type RowFn = unsafe extern "sysv64" fn(*const *const u8, usize, usize);

/// Passes of one row: row reductions, per-row values, the output.
const MAX_PASSES: usize = 12;
/// Scratch slots of a row: the row reductions' values, then the per-row values.
const SLOTS: usize = 16;
/// Table slots of one pass: its uniforms, then its operand pointers.
const OPERANDS_PER_PASS: usize = 1 + epilogue::MAX_OPERANDS;
/// Table slots before the passes: output, tail mask, scratch.
const TABLE_HEAD: usize = 3;
const TABLE_LEN: usize = TABLE_HEAD + MAX_PASSES * OPERANDS_PER_PASS;

/// The register holding the current row's half of the scratch (its folded values); r13 holds the table, r15 the
/// next row's half where the first pass runs a row ahead.
const SCRATCH_REG: u8 = gpr::R14;

/// The row kernel a plan runs for `k` where generation is enabled (`wide::enabled`) and `k` qualifies (counted in
/// `wide::BUILDS`, written to the dump), at `wide::width`; else `Ok(None)`: the caller compiles it with Cranelift.
pub(crate) fn for_plan(k: &KernelIr, dump: Option<&crate::dump::Dump>) -> Result<Option<RowKernel>, String> {
    // A kernel that gathers is the Cranelift renderer's (its per-lane checked loads and the fault record).
    if !super::enabled() || k.rows.is_empty() || k.can_fault() {
        return Ok(None);
    }
    let Some(r) = RowKernel::build_for(k, super::width())? else { return Ok(None) };
    super::BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(d) = dump {
        d.generated_files(k, "rows.txt", &r.listing(), r.code_bytes());
    }
    Ok(Some(r))
}

/// What a pass does with its program's value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PassKind {
    /// Folds it over the row's columns into a scratch slot (row reduction `j` into slot `j`).
    Fold(ReduceOp, usize),
    /// Computes it once (it is the same along the row) into a scratch slot.
    Finish(usize),
    /// Stores it over the row's columns.
    Output,
    /// Computes it once per row and stores it as the row's output (a kernel whose root folds the row too).
    RowOut,
}

/// One pass over a row.
struct Pass {
    ep: Epilogue,
    /// A row reduction's pass that also stores each vector it folds to the output, which the output pass reads
    /// back instead of computing it again (softmax's `exp(x - max)`).
    store_out: bool,
    /// The pass's code as an elementwise kernel's outer code (for the host-evaluated uniforms).
    outer: Vec<Inst>,
    kind: PassKind,
    /// The column loop's registers (none for `Finish`).
    layout: Option<PassLayout>,
}

/// A generated row kernel, ready to launch.
pub(crate) struct RowKernel {
    rows: usize,
    cols: usize,
    /// One output per row (the root folds the row too), not one per element.
    per_row: bool,
    passes: Vec<Pass>,
    n_inputs: usize,
    work: usize,
    isa: Isa,
    code: ExecutableBuffer,
    f: RowFn,
}

// SAFETY: `f` points into `code`, an immutable executable mapping owned here; running only reads `self`.
unsafe impl Send for RowKernel {}
// SAFETY: as for Send.
unsafe impl Sync for RowKernel {}

impl RowKernel {
    /// Generates `k` at `isa`'s width, or `Ok(None)` when it is not such a kernel (see the module doc) or this host
    /// cannot run it.
    pub(crate) fn build_for(k: &KernelIr, isa: Isa) -> Result<Option<RowKernel>, String> {
        let k = &k.with_merged_row_loops();
        let Some(passes) = plan(k, isa) else { return Ok(None) };
        let Some(Space { rows, cols, per_row }) = space(k) else { return Ok(None) };
        let code = emit(&passes, k.inputs.len(), cols, per_row, isa)?;
        crate::cpu::code::MAPPINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the code at offset 0 is a function emitted by `emit` with `RowFn`'s sysv64 signature, and `code`
        // (kept in the returned kernel) keeps it mapped executable.
        let f = unsafe { std::mem::transmute::<*const u8, RowFn>(code.ptr(dynasmrt::AssemblyOffset(0))) };
        Ok(Some(RowKernel { rows, cols, per_row, passes, n_inputs: k.inputs.len(), work: k.work(), isa, code, f }))
    }

    /// The passes' register programs and the machine code's size, for `KILN_DUMP`.
    pub(crate) fn listing(&self) -> String {
        let mut s = format!("row kernel {} x {}, {} lanes\n", self.rows, self.cols, self.isa.lanes());
        for (p, pass) in self.passes.iter().enumerate() {
            let what = match pass.kind {
                PassKind::Fold(op, slot) => format!("{op:?} over the row into slot {slot}"),
                PassKind::Finish(slot) => format!("per-row value into slot {slot}"),
                PassKind::Output => "output".to_string(),
                PassKind::RowOut => "per-row output".to_string(),
            };
            let unroll =
                pass.layout.as_ref().map_or(String::new(), |l| format!(", {} vectors per iteration", l.unroll));
            let _ = writeln!(s, "  pass {p}: {what}{unroll}");
            for (i, o) in pass.ep.operands.iter().enumerate() {
                let src = if o.buf == self.n_inputs { "row values".to_string() } else { format!("in{}", o.buf) };
                let _ = writeln!(s, "    op{i}: {src} + {}, {:?}", o.offset, o.kind);
            }
            for (i, inst) in pass.ep.program.insts.iter().enumerate() {
                let _ = writeln!(s, "    v{i} = {inst:?}");
            }
            let _ = writeln!(s, "    result v{}", pass.ep.program.result);
        }
        let _ = writeln!(s, "  ({} bytes of code)", self.code.len());
        s
    }

    pub(crate) fn code_bytes(&self) -> &[u8] {
        &self.code
    }

    /// Runs the kernel: `ptrs` holds its input pointers, then the output pointer.
    ///
    /// # Safety
    /// Every pointer must be valid for the buffer the kernel IR declares at that position (its dtype and length),
    /// and the output must not alias an input.
    pub(crate) unsafe fn run(&self, ptrs: &[*mut u8]) {
        // The passes' inputs: the kernel's, the scratch (never read for a uniform: its index varies by row) as a null
        // pointer, and the output. Inline, as the uniforms: a replayed launch allocates nothing.
        let mut all: smallvec::SmallVec<[*mut u8; 16]> = ptrs[..self.n_inputs].iter().copied().collect();
        all.push(std::ptr::null_mut());
        all.push(ptrs[self.n_inputs]);
        let all = &all[..];
        let uniforms: [Uniforms; MAX_PASSES] = std::array::from_fn(|p| {
            let pass = self.passes.get(p);
            // SAFETY: the caller's pointer contract.
            unsafe { Uniforms::for_launch(pass.map(|p| &p.ep), pass.map_or(&[], |p| &p.outer), all) }
        });
        let args = &Args { ins: all, out: ptrs[self.n_inputs] };
        let f = move |s: usize, e: usize| {
            let a: &Args = args;
            // SAFETY: the caller's pointer contract; rows `s..e` exist.
            unsafe { self.call(a.ins, a.out, &uniforms, s, e - s) };
        };
        pool::global().parallel_for_work(self.rows, self.work, &f);
    }

    /// Calls the code on `rows` rows from `r0`.
    unsafe fn call(&self, ins: &[*mut u8], out: *mut u8, uniforms: &[Uniforms], r0: usize, rows: usize) {
        let mut table = [std::ptr::null::<u8>(); TABLE_LEN];
        // Two halves: the first pass may run a row ahead into the other half (`emit`'s pipelining).
        let mut scratch = [0f32; 2 * SLOTS];
        let lanes = self.isa.lanes();
        // SAFETY: every offset formed is that of an element the kernel IR's affine indices reach for a row in range
        // (the caller's contract), and the code reads and writes only `rows` rows from there (masked at the end).
        unsafe {
            table[0] = (out as *const f32).add(r0 * if self.per_row { 1 } else { self.cols }) as *const u8;
            table[1] = isa::lane_mask(self.isa, self.cols % lanes);
            table[2] = scratch.as_mut_ptr() as *const u8;
            for (p, (pass, u)) in self.passes.iter().zip(uniforms).enumerate() {
                let base = TABLE_HEAD + p * OPERANDS_PER_PASS;
                table[base] = u.as_ptr();
                for (i, o) in pass.ep.operands.iter().enumerate() {
                    if o.buf == self.n_inputs {
                        continue; // the scratch, addressed through its own register
                    }
                    let at = o.offset as isize
                        + match o.kind {
                            OperandKind::Mat { ld } => (r0 * ld as usize) as isize,
                            OperandKind::Row => 0,
                            OperandKind::Col { stride } => (r0 * stride as usize) as isize,
                        };
                    table[base + 1 + i] = (ins[o.buf] as *const f32).offset(at) as *const u8;
                }
            }
            (self.f)(table.as_ptr(), rows, self.cols)
        }
    }
}

/// Whether the CPU runs row kernel `k` as generated code at this host's width (the schedule's
/// `row_kernel_ok`): generation enabled, and `k` of a shape and code this file takes.
pub(crate) fn generates(k: &KernelIr) -> bool {
    super::enabled() && !k.can_fault() && plan(&k.with_merged_row_loops(), super::width()).is_some()
}

/// `k`'s passes at `isa`'s width, or `None` where this file does not run it (see the module doc).
fn plan(k: &KernelIr, isa: Isa) -> Option<Vec<Pass>> {
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

/// The launch's pointers, shared with the pool's threads.
struct Args<'a> {
    ins: &'a [*mut u8],
    out: *mut u8,
}

// SAFETY: read-only for the duration of one launch; the threads write disjoint rows of the output.
unsafe impl Sync for Args<'_> {}

/// The rows and columns of a row kernel this file takes, and how its root computes: elementwise over
/// `[rows, cols]` (softmax, layer norm), or folding the row itself (`per_row`: one output per row; cross entropy's
/// pick of the target's log-probability, its fold `k.reduce`). `None` for any other kernel (see the module doc).
struct Space {
    rows: usize,
    cols: usize,
    per_row: bool,
}

fn space(k: &KernelIr) -> Option<Space> {
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
    let allow = epilogue::Allow { bf16: false, bf16_loads: false, positions: true, scalef: isa == Isa::Avx512 };
    epilogue::translate_with(&pass, &view.roles, allow)
}

/// Where one pass's values live: per-row values and uniforms in registers of their own from the top down (as
/// `wide/mod.rs`), each unrolled copy's temporaries from 0 up, a reduction's accumulators (and a max's NaN masks) just
/// under the hoisted values, and two spare registers under those (the tail's masked value, a NaN test).
struct PassLayout {
    hoisted: Vec<Option<u8>>,
    temps: usize,
    unroll: usize,
    accs: Vec<u8>,
    nans: Vec<u8>,
    spare: [u8; 2],
}

impl PassLayout {
    fn plan(p: &EpProgram, n: usize, fold: Option<ReduceOp>, isa: Isa) -> Option<PassLayout> {
        let mut hoisted = vec![None; p.insts.len()];
        let mut next = match isa {
            Isa::Avx2 => MASK_REG,
            Isa::Avx512 => 32,
        };
        for (i, inst) in p.insts.iter().enumerate() {
            match inst {
                EpInst::Col { .. } | EpInst::Uniform(_) => {
                    next = next.checked_sub(1)?;
                    hoisted[i] = Some(next);
                }
                EpInst::Acc => return None,
                _ => {}
            }
        }
        let temps = p.temps_needed_besides(&|i| hoisted[i].is_some());
        let per_copy = match fold {
            None => 0,
            Some(ReduceOp::Max) => 2,
            Some(_) => 1,
        };
        let room = next as usize;
        // The lane combine at a reduction's end uses registers 0-3: the accumulators stay above them.
        let fits = |u: usize| u * temps + u * per_copy + 2 <= room && (per_copy == 0 || room >= u * per_copy + 2 + 4);
        let unroll = [4, 2, 1].into_iter().find(|&u| fits(u) && (u == 1 || isa.lanes() * u <= n))?;
        let top = room - 1;
        let accs: Vec<u8> = (0..unroll).filter(|_| per_copy > 0).map(|c| (top - c) as u8).collect();
        let nans: Vec<u8> = (0..unroll).filter(|_| per_copy == 2).map(|c| (top - unroll - c) as u8).collect();
        let below = top - unroll * per_copy;
        Some(PassLayout { hoisted, temps, unroll, accs, nans, spare: [below as u8, (below - 1) as u8] })
    }

    fn copy_regs(&self, copy: usize) -> Vec<u8> {
        (copy * self.temps..(copy + 1) * self.temps).map(|r| r as u8).collect()
    }
}

/// -inf, a max's identity.
const NEG_INF: u32 = 0xff80_0000;

/// Assembles the kernel (see the module doc) at `isa`'s width.
fn emit(passes: &[Pass], scratch: usize, cols: usize, per_row: bool, isa: Isa) -> Result<ExecutableBuffer, String> {
    let wide = isa == Isa::Avx512;
    let zmm = Zmm { pool: gpr::RBP };
    let vi: &dyn VecIsa = if wide { &zmm } else { &program_asm::Ymm };
    let mut ops = Assembler::new().map_err(|e| e.to_string())?;
    let mut consts = program_asm::ConstPool::default();
    let (row, done) = (ops.new_dynamic_label(), ops.new_dynamic_label());
    save_registers(&mut ops);
    dynasm!(ops ; .arch x64
        ; mov r13, rdi
        ; mov r15, QWORD [r13 + 8]
        ; mov r14, QWORD [r13 + 16]
        ; mov rdi, QWORD [r13]
        ; shl rdx, 2
    );
    if wide {
        let base = consts.base(&mut ops);
        dynasm!(ops ; .arch x64 ; lea rbp, [=>base]);
        put(&mut ops, |e| e.kmov_load(KMASK, mem(gpr::R15, 0)));
    } else {
        dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r15]);
    }
    // A row ahead: where a per-row value follows the row's reductions (softmax's `1 / sum`, log_softmax's
    // `log(sum)`, a layer norm's `1 / sqrt(var + eps)`), the next row's first pass, which reads that row from memory
    // and depends on nothing of this one, is emitted right after the value, so the next row streams in while this
    // row's last passes run (softmax 1.34 -> 1.20-1.26 ms at 4096 x 1024; the others measured unchanged, though
    // their per-row chains are overlapped too). It folds into the scratch's other half (r15), the halves swap at the
    // row's end, and its operand pointers run a row ahead, stepped after each of its runs. `after`: the pass it
    // follows.
    let after = match passes.first().map(|p| (p.kind, p.store_out)) {
        Some((PassKind::Fold(..), false)) => passes.iter().position(|p| matches!(p.kind, PassKind::Finish(_))),
        _ => None,
    };
    let ahead = after.is_some();
    let first_pass_steps = |ops: &mut Assembler| step_operands(ops, &passes[0], 0, scratch);
    if ahead {
        dynasm!(ops ; .arch x64 ; lea r15, [r14 + 4 * SLOTS as i32]);
    }
    dynasm!(ops ; .arch x64 ; test rsi, rsi ; jz =>done);
    if ahead {
        emit_pass(&mut ops, vi, &passes[0], 0, scratch, isa, gpr::R14, &mut consts)?;
        first_pass_steps(&mut ops);
    }
    dynasm!(ops ; .arch x64 ; =>row);
    for (pi, pass) in passes.iter().enumerate() {
        if pi == 0 && ahead {
            continue;
        }
        match pass.kind {
            PassKind::Finish(slot) => emit_finish(&mut ops, vi, pass, pi, Some(slot), &mut consts)?,
            PassKind::RowOut => emit_finish(&mut ops, vi, pass, pi, None, &mut consts)?,
            _ => emit_pass(&mut ops, vi, pass, pi, scratch, isa, SCRATCH_REG, &mut consts)?,
        }
        if after == Some(pi) {
            // The next row's first pass, if there is a next row.
            let last_row = ops.new_dynamic_label();
            dynasm!(ops ; .arch x64 ; cmp rsi, 1 ; je =>last_row);
            emit_pass(&mut ops, vi, &passes[0], 0, scratch, isa, gpr::R15, &mut consts)?;
            first_pass_steps(&mut ops);
            dynasm!(ops ; .arch x64 ; =>last_row);
        }
    }
    let out_step = if per_row { 4 } else { 4 * cols as i32 };
    dynasm!(ops ; .arch x64 ; add rdi, out_step);
    for (pi, pass) in passes.iter().enumerate().skip(usize::from(ahead)) {
        step_operands(&mut ops, pass, pi, scratch);
    }
    if ahead {
        dynasm!(ops ; .arch x64 ; xchg r14, r15);
    }
    dynasm!(ops ; .arch x64 ; dec rsi ; jnz =>row ; =>done);
    restore_registers_and_return(&mut ops);
    consts.emit(&mut ops);
    ops.finalize().map_err(|_| "finalizing a row kernel failed".to_string())
}

/// Steps pass `pi`'s operand pointers in the table one row on (the scratch is addressed through its register).
fn step_operands(ops: &mut Assembler, pass: &Pass, pi: usize, scratch: usize) {
    for (o, operand) in pass.ep.operands.iter().enumerate() {
        let step = match operand.kind {
            _ if operand.buf == scratch => continue,
            OperandKind::Mat { ld } => 4 * ld as i32,
            OperandKind::Col { stride } => 4 * stride as i32,
            OperandKind::Row => continue,
        };
        let off = 8 * (TABLE_HEAD + pi * OPERANDS_PER_PASS + 1 + o) as i32;
        dynasm!(ops ; .arch x64 ; add QWORD [r13 + off], step);
    }
}

/// A per-row value: its program once, on broadcast scratch slots and uniforms, lane 0 stored to its slot, or
/// (`slot: None`) to the row's output element.
fn emit_finish(
    ops: &mut Assembler,
    vi: &dyn VecIsa,
    pass: &Pass,
    pi: usize,
    slot: Option<usize>,
    consts: &mut program_asm::ConstPool,
) -> Result<(), String> {
    let p = &pass.ep.program;
    let uoff = 8 * (TABLE_HEAD + pi * OPERANDS_PER_PASS) as i32;
    dynasm!(ops ; .arch x64 ; mov rax, QWORD [r13 + uoff]);
    let operands = &pass.ep.operands;
    let mut load = |ops: &mut Assembler, inst: &EpInst, d: u8| match *inst {
        EpInst::Col { op, .. } => vi.broadcast(ops, d, SCRATCH_REG, 4 * operands[op].offset as i32),
        EpInst::Uniform(u) => vi.uniform(ops, d, gpr::RAX, 32 * u as i32),
        _ => unreachable!("a per-row value reads only the scratch and uniforms"),
    };
    // xmm0-14: the VEX store names the result, and ymm15 holds the tail mask.
    let free: Vec<u8> = (0..MASK_REG).collect();
    let res = program_asm::emit_insts(vi, ops, p, &p.last_uses(), &free, &|_| None, &mut load, consts)?;
    match slot {
        Some(slot) => {
            let off = 4 * slot as i32;
            dynasm!(ops ; .arch x64 ; vmovss DWORD [r14 + off], Rx(res));
        }
        None => dynasm!(ops ; .arch x64 ; vmovss DWORD [rdi], Rx(res)),
    }
    Ok(())
}

/// One pass over the current row (see the module doc); a reduction's value goes to slot `j` of the scratch half
/// `fold_to` points at.
#[allow(clippy::too_many_arguments)]
fn emit_pass(
    ops: &mut Assembler,
    vi: &dyn VecIsa,
    pass: &Pass,
    pi: usize,
    scratch: usize,
    isa: Isa,
    fold_to: u8,
    consts: &mut program_asm::ConstPool,
) -> Result<(), String> {
    let (p, l) = (&pass.ep.program, pass.layout.as_ref().expect("a column loop's layout"));
    let fold = match pass.kind {
        PassKind::Fold(op, slot) => Some((op, slot)),
        _ => None,
    };
    let wide = isa == Isa::Avx512;
    let vb = 4 * isa.lanes() as i32;
    let base = TABLE_HEAD + pi * OPERANDS_PER_PASS;
    // Uniforms, then the operand pointers, then the per-row values.
    let uoff = 8 * base as i32;
    dynasm!(ops ; .arch x64 ; mov rax, QWORD [r13 + uoff]);
    for (i, inst) in p.insts.iter().enumerate() {
        if let (EpInst::Uniform(slot), Some(h)) = (inst, l.hoisted[i]) {
            vi.uniform(ops, h, gpr::RAX, 32 * *slot as i32);
        }
    }
    for (o, operand) in pass.ep.operands.iter().enumerate() {
        if operand.buf != scratch {
            let (r, off) = (OPERAND_REGS[o], 8 * (base + 1 + o) as i32);
            dynasm!(ops ; .arch x64 ; mov Rq(r), QWORD [r13 + off]);
        }
    }
    for (i, inst) in p.insts.iter().enumerate() {
        if let (EpInst::Col { op, .. }, Some(h)) = (inst, l.hoisted[i]) {
            let o = &pass.ep.operands[*op];
            let (r, disp) = if o.buf == scratch { (SCRATCH_REG, 4 * o.offset as i32) } else { (OPERAND_REGS[*op], 0) };
            vi.broadcast(ops, h, r, disp);
        }
    }
    for &a in &l.accs {
        match fold.map(|f| f.0) {
            Some(ReduceOp::Max) => {
                let at = consts.get(ops, NEG_INF);
                vi.konst(ops, a, at);
            }
            _ => vi.bin(ops, VBin::Xor, a, a, a),
        }
    }
    for &n in &l.nans {
        vi.bin(ops, VBin::Xor, n, n, n);
    }
    let last = p.last_uses();
    // Passes after the first fetch the next row's inputs into cache while they work on this one (the first pass
    // reads the row from memory; without this it would wait for it, every row).
    let prefetch: Vec<(u8, i32)> = if pi == 0 {
        Vec::new()
    } else {
        pass.ep
            .operands
            .iter()
            .enumerate()
            .filter_map(|(o, operand)| match operand.kind {
                OperandKind::Mat { ld } if operand.buf < scratch => Some((OPERAND_REGS[o], 4 * ld as i32)),
                _ => None,
            })
            .collect()
    };
    let mut copy = |ops: &mut Assembler, c: usize, masked: bool| -> Result<(), String> {
        let disp = vb * c as i32;
        if !masked {
            for &(r, step) in &prefetch {
                let at = disp + step;
                dynasm!(ops ; .arch x64 ; prefetcht0 [Rq(r) + rax + at]);
            }
        }
        let fixed = |i: usize| l.hoisted[i];
        // The columns of this copy's lanes, per position offset the program reads: `rax / 4 + lanes * c + lane`.
        let positions: Vec<(i32, program_asm::ConstRef)> = p
            .insts
            .iter()
            .filter_map(|inst| if let EpInst::Position(off) = *inst { Some(off) } else { None })
            .map(|off| {
                let base = off + (isa.lanes() * c) as i32;
                (off, consts.lanes(ops, std::array::from_fn(|lane| (base + lane as i32) as u32)))
            })
            .collect();
        let mut load = |ops: &mut Assembler, inst: &EpInst, d: u8| match *inst {
            EpInst::Mat { op, .. } | EpInst::Row { op, .. } => {
                load_vector(ops, isa, d, OPERAND_REGS[op], Access::f32(disp), masked)
            }
            EpInst::Position(off) => {
                let lanes = positions.iter().find(|p| p.0 == off).map(|p| p.1);
                vi.positions(ops, d, gpr::RAX, lanes.unwrap_or_else(|| unreachable!("collected above")));
            }
            _ => unreachable!("per-row values and uniforms are hoisted"),
        };
        let res = program_asm::emit_insts(vi, ops, p, &last, &l.copy_regs(c), &fixed, &mut load, consts)?;
        if fold.is_none() || pass.store_out {
            store_vector(ops, isa, res, Access::f32(disp), masked);
        }
        let Some((op, _)) = fold else { return Ok(()) };
        // Lanes past the row's end hold the program's value of the masked loads' zeros: the fold's identity there.
        let v = if masked {
            let s = l.spare[0];
            match op {
                ReduceOp::Max => {
                    let ninf = consts.get(ops, NEG_INF);
                    vi.konst(ops, s, ninf);
                    if wide {
                        put(ops, |e| e.blend(s, KMASK, s, res));
                    } else {
                        dynasm!(ops ; .arch x64 ; vblendvps Ry(s), Ry(s), Ry(res), Ry(MASK_REG));
                    }
                }
                _ if wide => put(ops, |e| e.mov_masked_zero(s, KMASK, res)),
                _ => dynasm!(ops ; .arch x64 ; vandps Ry(s), Ry(res), Ry(MASK_REG)),
            }
            s
        } else {
            res
        };
        let acc = l.accs[c];
        match op {
            ReduceOp::Max => {
                let t = l.spare[1];
                vi.cmp(ops, t, v, v, pred::UNORD_Q);
                vi.bin(ops, VBin::Or, l.nans[c], l.nans[c], t);
                vi.bin(ops, VBin::MaxRaw, acc, v, acc);
            }
            _ => vi.bin(ops, VBin::Add, acc, acc, v),
        }
        Ok(())
    };
    let (main, single, tail, end) =
        (ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label());
    dynasm!(ops ; .arch x64 ; xor eax, eax);
    if l.unroll > 1 {
        let span = vb * l.unroll as i32;
        dynasm!(ops ; .arch x64 ; =>main ; lea r12, [rax + span] ; cmp r12, rdx ; ja =>single);
        for c in 0..l.unroll {
            copy(ops, c, false)?;
        }
        dynasm!(ops ; .arch x64 ; mov rax, r12 ; jmp =>main);
    }
    dynasm!(ops ; .arch x64 ; =>single ; lea r12, [rax + vb] ; cmp r12, rdx ; ja =>tail);
    copy(ops, 0, false)?;
    dynasm!(ops ; .arch x64 ; mov rax, r12 ; jmp =>single ; =>tail ; cmp rax, rdx ; jae =>end);
    copy(ops, 0, true)?;
    dynasm!(ops ; .arch x64 ; =>end);
    if let Some((op, slot)) = fold {
        fold_lanes(ops, vi, l, op, wide);
        let off = 4 * slot as i32;
        dynasm!(ops ; .arch x64 ; vmovss DWORD [Rq(fold_to) + off], xmm0);
    }
    Ok(())
}

/// A reduction pass's accumulators folded into lane 0 of register 0: a max's NaN masks first (all-ones lanes are
/// NaN), then the copies pairwise, then the lanes (16 folded to 8 first).
fn fold_lanes(ops: &mut Assembler, vi: &dyn VecIsa, l: &PassLayout, op: ReduceOp, wide: bool) {
    let max = op == ReduceOp::Max;
    // `x = x op y` on registers, NaN kept for a max: the raw max returns `x` where either is NaN, and `y`'s NaN
    // lanes are ORed in as all-ones.
    let fold = |ops: &mut Assembler, x: u8, y: u8| {
        if max {
            vi.cmp(ops, 3, y, y, pred::UNORD_Q);
            vi.bin(ops, VBin::MaxRaw, x, y, x);
            vi.bin(ops, VBin::Or, x, x, 3);
        } else {
            vi.bin(ops, VBin::Add, x, x, y);
        }
    };
    for (&a, &n) in l.accs.iter().zip(&l.nans) {
        vi.bin(ops, VBin::Or, a, a, n);
    }
    let a = &l.accs;
    if a.len() == 4 {
        fold(ops, a[0], a[1]);
        fold(ops, a[2], a[3]);
        fold(ops, a[0], a[2]);
    } else if a.len() == 2 {
        fold(ops, a[0], a[1]);
    }
    vi.mov(ops, 0, a[0]);
    if wide {
        put(ops, |e| e.shuffle_quarters(1, 0, 0, 0x4e));
        fold(ops, 0, 1);
    }
    // 8 lanes in ymm0: halves, pairs, then lanes 0 and 1 (VEX; the fold on xmm registers).
    dynasm!(ops ; .arch x64 ; vextractf128 xmm1, ymm0, 1);
    fold_xmm(ops, max);
    dynasm!(ops ; .arch x64 ; vmovhlps xmm1, xmm1, xmm0);
    fold_xmm(ops, max);
    dynasm!(ops ; .arch x64 ; vmovshdup xmm1, xmm0);
    fold_xmm(ops, max);
}

/// `xmm0 = xmm0 op xmm1` (lanes 0-3), NaN kept for a max as in `fold_lanes`.
fn fold_xmm(ops: &mut Assembler, max: bool) {
    if max {
        dynasm!(ops ; .arch x64
            ; vcmpps xmm3, xmm1, xmm1, 3
            ; vmaxps xmm0, xmm1, xmm0
            ; vorps xmm0, xmm0, xmm3
        );
    } else {
        dynasm!(ops ; .arch x64 ; vaddps xmm0, xmm0, xmm1);
    }
}
