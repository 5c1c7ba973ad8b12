//! A row kernel's machine code: the row loop, each pass's column loop (unrolled copies, single vectors, a masked
//! tail) with a reduction's folds, the per-row values, and the first pass run a row ahead (the module doc of
//! `rows/mod.rs` says what each does).

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::{OPERANDS_PER_PASS, Pass, PassKind, SCRATCH_REG, SLOTS, TABLE_HEAD};
use crate::cpu::gemm::asm512::Zmm;
use crate::cpu::gemm::epilogue::OperandKind;
use crate::cpu::gemm::evex::{gpr, mem};
use crate::cpu::gemm::program::{EpInst, EpProgram, VBin, pred};
use crate::cpu::gemm::program_asm::{self, VecIsa};
use crate::cpu::isa::Isa;
use crate::cpu::wide::emit::{
    Access, KMASK, load_vector, put, restore_registers_and_return, save_registers, store_vector,
};
use crate::cpu::wide::{MASK_REG, OPERAND_REGS};
use dynasmrt::x64::Assembler;
use dynasmrt::{DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};
use kiln_jit::ReduceOp;

/// Where one pass's values live: per-row values and uniforms in registers of their own from the top down (as
/// `wide/mod.rs`), each unrolled copy's temporaries from 0 up, a reduction's accumulators (and a max's NaN masks) just
/// under the hoisted values, and two spare registers under those (the tail's masked value, a NaN test).
pub(super) struct PassLayout {
    hoisted: Vec<Option<u8>>,
    temps: usize,
    pub(super) unroll: usize,
    accs: Vec<u8>,
    nans: Vec<u8>,
    spare: [u8; 2],
}

impl PassLayout {
    pub(super) fn plan(p: &EpProgram, n: usize, fold: Option<ReduceOp>, isa: Isa) -> Option<PassLayout> {
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
pub(super) fn emit(
    passes: &[Pass],
    scratch: usize,
    cols: usize,
    per_row: bool,
    isa: Isa,
) -> Result<ExecutableBuffer, String> {
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
