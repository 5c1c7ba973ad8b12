//! Column sums at full vector width: `out[j] = outer(sum over i of inner(i, j))` over `[rows, cols]` with the
//! columns contiguous, a bias's or a norm weight's gradient (`dy.sum(0)`, `(dy * x_hat).sum(0)`).
//!
//! Why: Cranelift emits 128-bit vectors only, and its column-sum loop walks all rows once per strip of 32 columns
//! with 4-lane adds; the GPT step's 30 such sums a step (`[1024, 128]` to `[1024, 512]`) took ~1 ms there, 2-4x what
//! reading their operands costs.
//!
//! What runs here (the parent module's `Along::Cols`, its inner code from `sum_parts`): a reduce kernel whose f32 sum runs
//! over one loop that is not the output's, the inner code an elementwise program over `[rows, cols]` that the
//! register program can express with its loads walking the columns contiguously (`ElementwiseView`, the reduce loop
//! as its rows), the outer code a program of the sum and constants (`mean`'s division). The generated code zeroes the call's output columns, then walks the rows a panel
//! of 16 at a time ([`PANEL_ROWS`]): for each block of `u` vectors of columns (8, 4, 2, then 1, then a masked last
//! vector) it loads the block's sums from the output, adds the panel's rows into them (the program's value, one
//! register a vector) and stores them back; a last pass applies the outer program where it is more than the sum.
//! Each call adds its rows in order, one rounding per add, as the interpreter and the Cranelift kernel add them.
//! How the threads share a launch (`WideKernel::run`): a plain f32 sum of at least 128 rows a thread is cut into
//! one share of rows a thread (`col_parts`), each summed over every column into its own partial, then the partials
//! are added in share order; otherwise (fewer rows, an outer program beyond the sum, a bf16 output) the threads take
//! disjoint ranges of whole vectors, every row, and the results are bit for bit the interpreter's. Why rows: in a
//! training step the rows are tokens, and the kernels before (row-split elementwise and row kernels, the weight
//! gradient's K split) wrote each thread's share of them on that thread; split by columns, every thread reads every
//! token, half of them from the other core's cache (the GPT step's bias gradients, `[1024, 128]` to `[1024, 512]`,
//! `KILN_PROFILE=1`: 18 -> 4.5, 58 -> 14 and 41 -> 10 µs a launch). The shares' sums are not the single pass's
//! bits; they are the same on every run of a machine with the same thread count.
//!
//! Deliberately not done: blocks wider than 8 vectors (the loop is bound by reading the rows, not by the adds'
//! latency, from 4 on).

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::emit::{self, Access, KMASK, put};
use super::{MASK_REG, OPERAND_REGS};
use crate::cpu::gemm::asm512::Zmm;
use crate::cpu::gemm::epilogue::{Epilogue, OperandKind};
use crate::cpu::gemm::evex::{gpr, mem};
use crate::cpu::gemm::program::{EpInst, EpProgram, VBin};
use crate::cpu::gemm::program_asm::{self, VecIsa};
use crate::cpu::isa::Isa;
use dynasmrt::x64::Assembler;
use dynasmrt::{DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};

/// Vectors per block, widest first; each block width the code has a loop for.
const BLOCKS: [usize; 4] = [8, 4, 2, 1];

/// Where each value lives: per-row values (loads that stand still along a row) and uniforms in registers of their
/// own from the top down (under ymm15, the 8-lane mask; k1 holds the 16-lane one), a block's accumulators under
/// them, each copy's temporaries from 0 up.
pub(super) struct ColLayout {
    hoisted: Vec<Option<u8>>,
    temps: usize,
    /// The widest block (vectors), and the accumulators' first register (they take `top - u..top`).
    widest: usize,
    top: u8,
}

impl ColLayout {
    pub(super) fn plan(p: &EpProgram, outer: &EpProgram, n: usize, isa: Isa) -> Option<ColLayout> {
        let mut next = match isa {
            Isa::Avx2 => MASK_REG,
            Isa::Avx512 => 32,
        };
        let mut hoisted = vec![None; p.insts.len()];
        for (i, inst) in p.insts.iter().enumerate() {
            match inst {
                EpInst::Col { .. } | EpInst::Uniform(_) => {
                    next = next.checked_sub(1)?;
                    hoisted[i] = Some(next);
                }
                EpInst::Acc | EpInst::Position(_) => return None,
                _ => {}
            }
        }
        let temps = p.temps_needed_besides(&|i| hoisted[i].is_some());
        let room = next as usize;
        // A block of `u` takes `u` accumulators and `u` copies' temporaries; at its end each column's outer
        // program runs in the registers under the accumulators.
        let fits = |u: usize| u * (temps + 1) <= room && outer.temps_needed() < room - u;
        let widest = BLOCKS.into_iter().find(|&u| fits(u) && (u == 1 || isa.lanes() * u <= n))?;
        Some(ColLayout { hoisted, temps, widest, top: next })
    }

    /// Vectors per iteration of the widest block (the listing's figure).
    pub(super) fn widest(&self) -> usize {
        self.widest
    }

    fn copy_regs(&self, copy: usize) -> Vec<u8> {
        (copy * self.temps..(copy + 1) * self.temps).map(|r| r as u8).collect()
    }

    fn acc(&self, copy: usize) -> u8 {
        self.top - 1 - copy as u8
    }
}

/// Rows a panel has (the last one may have fewer): a call walks its columns a panel at a time, block by block, so
/// that the panel's rows (a few KiB each) stay in L1 while every block reads them. Walking all rows per block
/// instead read the memory of long rows once per block (the prefetchers fetch whole rows): `[1024, 512]` took as
/// long as Cranelift's 4-lane loop.
const PANEL_ROWS: usize = 16;

/// Whether the operands' row steps fit the code's 32-bit immediates over a whole panel.
pub(super) fn panel_steps_fit(ep: &Epilogue) -> bool {
    ep.operands.iter().all(|o| i32::try_from(row_step(o) as i64 * PANEL_ROWS as i64).is_ok())
}

/// Bytes an operand's pointer moves per row (0 for a per-column one).
fn row_step(o: &crate::cpu::gemm::epilogue::EpOperand) -> i32 {
    let size = o.elem_bytes() as i64;
    let step = match o.kind {
        OperandKind::Mat { ld } => size * ld,
        OperandKind::Col { stride } => size * stride,
        OperandKind::Row => 0,
    };
    i32::try_from(step).unwrap_or(i32::MAX)
}

/// Assembles column sums (see the module doc): `extern "sysv64" fn(table, rows, cols)`, the table as the
/// elementwise kernels' (the parent module's: output, tail mask, uniforms, two unused entries, operands), every pointer at
/// the first row of the call's first column. The output's columns are the accumulators between panels: zeroed
/// first, each panel's block loads them, adds the panel's rows in order and stores them, and a last pass applies
/// the outer program where it is more than the sum.
pub(super) fn emit(
    ep: &Epilogue,
    l: &ColLayout,
    outer: &EpProgram,
    isa: Isa,
    unit: usize,
) -> Result<ExecutableBuffer, String> {
    let p = &ep.program;
    let last = p.last_uses();
    let outer_last = outer.last_uses();
    let wide = isa == Isa::Avx512;
    let zmm = Zmm { pool: gpr::RBP };
    let vec_isa: &dyn VecIsa = if wide { &zmm } else { &program_asm::Ymm };
    let lanes = isa.lanes() as i32;
    let unit = unit as i32;
    // As in `wide::emit`: the column offset (rax) counts `unit` bytes per element, copy `c` is a vector further.
    let access = |size: i32, c: usize| ((size / unit) as u8, size * lanes * c as i32);
    let out_access = |c: usize| {
        let (scale, disp) = access(4, c);
        Access { scale, disp, bf16: false }
    };
    let vb = unit * lanes;
    let steps: Vec<i32> = ep.operands.iter().map(row_step).collect();
    let mut ops = Assembler::new().map_err(|e| e.to_string())?;
    emit::save_registers(&mut ops);
    // Registers: rdi the output, rsi the rows left, rdx the columns' end (bytes), rax the column offset, r14 the
    // table, r15 the panel's rows (the tail mask is reloaded from the table when needed), r13 the row counter, r12
    // scratch, rbp the 16-lane constants, the operands in `OPERAND_REGS` (at the panel's first row).
    dynasm!(ops ; .arch x64
        ; mov r14, rdi
        ; mov rax, QWORD [rdi + 16]
    );
    emit::hoist_uniforms(&mut ops, p, &l.hoisted, wide);
    emit::load_operand_pointers(&mut ops, ep.operands.len(), gpr::R14);
    let mut consts = emit::const_pool(&mut ops, wide);
    let unit_shift = unit.trailing_zeros() as i8;
    dynasm!(ops ; .arch x64
        ; mov rdi, QWORD [rdi]
        ; shl rdx, unit_shift
    );
    let load_tail_mask = |ops: &mut Assembler| {
        dynasm!(ops ; .arch x64 ; mov r12, QWORD [r14 + 8]);
        if wide {
            put(ops, |e| e.kmov_load(KMASK, mem(gpr::R12, 0)));
        } else {
            dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r12]);
        }
    };
    // `body(ops, u, masked)` for every block of the call's columns: blocks of 8, 4, 2, 1 vectors, then the masked
    // last vector. rax runs over the columns; r12 is free inside `body` (it reloads the tail mask before the masked
    // vector).
    let columns = |ops: &mut Assembler,
                   body: &mut dyn FnMut(&mut Assembler, usize, bool) -> Result<(), String>|
     -> Result<(), String> {
        dynasm!(ops ; .arch x64 ; xor eax, eax);
        for u in BLOCKS.into_iter().filter(|&u| u <= l.widest) {
            let (top, next) = (ops.new_dynamic_label(), ops.new_dynamic_label());
            let span = vb * u as i32;
            dynasm!(ops ; .arch x64
                ; =>top
                ; lea r12, [rax + span]
                ; cmp r12, rdx
                ; ja =>next
            );
            body(ops, u, false)?;
            dynasm!(ops ; .arch x64 ; add rax, span ; jmp =>top ; =>next);
        }
        let done = ops.new_dynamic_label();
        dynasm!(ops ; .arch x64 ; cmp rax, rdx ; jae =>done);
        load_tail_mask(ops);
        body(ops, 1, true)?;
        dynasm!(ops ; .arch x64 ; =>done);
        Ok(())
    };
    // The accumulators start at +0, as the interpreter's sums do.
    columns(&mut ops, &mut |ops, u, masked| {
        put_zero(ops, wide, 0);
        for c in 0..u {
            emit::store_vector(ops, isa, 0, out_access(c), masked);
        }
        Ok(())
    })?;
    // Panels of rows.
    let panel = ops.new_dynamic_label();
    let panels_done = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64
        ; =>panel
        ; test rsi, rsi
        ; jz =>panels_done
        ; mov r15d, PANEL_ROWS as i32
        ; cmp rsi, r15
        ; cmovb r15, rsi
    );
    columns(&mut ops, &mut |ops, u, masked| {
        for c in 0..u {
            emit::load_vector(ops, isa, l.acc(c), gpr::RDI, out_access(c), masked);
        }
        let row = ops.new_dynamic_label();
        dynasm!(ops ; .arch x64 ; mov r13, r15 ; =>row);
        emit::broadcast_row_values(ops, ep, &l.hoisted, wide);
        for c in 0..u {
            let fixed = |i: usize| l.hoisted[i];
            let mut load = |ops: &mut Assembler, inst: &EpInst, d: u8| {
                emit::load_element_vector(ops, ep, isa, inst, d, |size| access(size, c), masked)
            };
            let res = program_asm::emit_insts(vec_isa, ops, p, &last, &l.copy_regs(c), &fixed, &mut load, &mut consts)?;
            // Lanes past a masked vector's end add whatever the program made of the zeros loaded there: those
            // lanes are never stored.
            vec_isa.bin(ops, VBin::Add, l.acc(c), l.acc(c), res);
        }
        for (o, &step) in steps.iter().enumerate() {
            if step != 0 {
                let r = OPERAND_REGS[o];
                dynasm!(ops ; .arch x64 ; add Rq(r), step);
            }
        }
        dynasm!(ops ; .arch x64 ; dec r13 ; jnz =>row);
        for c in 0..u {
            emit::store_vector(ops, isa, l.acc(c), out_access(c), masked);
        }
        // Back to the panel's first row for the next block.
        for (o, &step) in steps.iter().enumerate() {
            if step != 0 {
                let r = OPERAND_REGS[o];
                dynasm!(ops ; .arch x64 ; imul r12, r15, step ; sub Rq(r), r12);
            }
        }
        Ok(())
    })?;
    for (o, &step) in steps.iter().enumerate() {
        if step != 0 {
            let r = OPERAND_REGS[o];
            let panel_step = step * PANEL_ROWS as i32;
            dynasm!(ops ; .arch x64 ; add Rq(r), panel_step);
        }
    }
    dynasm!(ops ; .arch x64 ; sub rsi, r15 ; jmp =>panel ; =>panels_done);
    // The outer program over the sums, where it does more than return them.
    if !matches!(outer.insts[outer.result], EpInst::Acc) {
        let free: Vec<u8> = (1..l.top).collect();
        columns(&mut ops, &mut |ops, u, masked| {
            for c in 0..u {
                emit::load_vector(ops, isa, 0, gpr::RDI, out_access(c), masked);
                let res = emit::emit_sum_outer(vec_isa, ops, outer, &outer_last, &free, &mut consts)?;
                emit::store_vector(ops, isa, res, out_access(c), masked);
            }
            Ok(())
        })?;
    }
    emit::restore_registers_and_return(&mut ops);
    consts.emit(&mut ops);
    ops.finalize().map_err(|_| "finalizing a column-sum kernel failed".to_string())
}

/// `d` = +0 in every lane.
fn put_zero(ops: &mut Assembler, wide: bool, d: u8) {
    if wide {
        put(ops, |e| e.zero(d));
    } else {
        dynasm!(ops ; .arch x64 ; vxorps Ry(d), Ry(d), Ry(d));
    }
}
