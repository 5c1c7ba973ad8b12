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
//! Code: `extern "sysv64" fn(table, rows, cols)`, `table` = `[out, tail mask, scratch, then per pass: uniforms, operand
//! pointers ([`OPERANDS_PER_PASS`] slots)]`, pointers at the chunk's first row. A pass's reads of the scratch take no
//! slot (its register and the value's offset address them; `epilogue::Allow::register_buf`), so it may read
//! `MAX_OPERANDS` inputs besides any number of per-row values (a layer norm's gradient reads five and four). Per row,
//! per pass: the pass's uniforms and per-row values are broadcast into registers, its operand pointers loaded from the
//! table; then `unroll` vectors per iteration, single vectors, and a masked tail. A reduction pass folds each vector
//! into one accumulator per unrolled copy (a sum adds; a max takes `vmaxps` and keeps a NaN mask apart, so a NaN
//! anywhere makes the row's max NaN, as the interpreter's fold does), masks the tail's lanes past the row to the fold's
//! identity, combines the copies and the lanes, and stores the value to the scratch. The output pass stores its
//! vectors. At the row's end the output pointer and every pass's operand pointers in the table step one row. The
//! scratch has two halves (`2 * SLOTS` floats): a first pass run a row ahead folds into the other half (r15), and r14
//! and r15 swap at the row's end; its operand pointers step right after each of its runs instead.
//!
//! Results agree with the interpreter within the f32 accumulation tolerance (a row's lanes are folded in another
//! order); the output pass is the elementwise kernels' arithmetic. Deliberately not done: aligning the output's
//! stores (the elementwise kernels' masked head), several rows' passes interleaved beyond the first pass's one row
//! ahead, f16 and bf16 rows (they stay apart).
//!
//! Here: the kernel and its launch; `plan.rs` turns the kernel IR into passes (register programs), `asm.rs`
//! assembles them.

mod asm;
mod plan;

use crate::cpu::gemm::epilogue::{self, Epilogue, OperandKind, Uniforms};
use crate::cpu::gemm::evex::gpr;
use crate::cpu::isa::{self, Isa};
use crate::cpu::pool;
use asm::{PassLayout, emit};
use dynasmrt::ExecutableBuffer;
use kiln_jit::ReduceOp;
use kiln_jit::kernel::{Inst, KernelIr};
use plan::{Space, plan, space};
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

/// The launch's pointers, shared with the pool's threads.
struct Args<'a> {
    ins: &'a [*mut u8],
    out: *mut u8,
}

// SAFETY: read-only for the duration of one launch; the threads write disjoint rows of the output.
unsafe impl Sync for Args<'_> {}
