//! The assembler of the elementwise and row-sum kernels (the loop the parent module's doc describes), and the
//! pieces of it the row kernels (`rows.rs`) and the column sums (`cols.rs`) share: where values live (`Layout`), the
//! vector loads and stores at either width, the prologue and epilogue of the generated function.

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::{MASK_REG, OPERAND_REGS, TABLE_OPERANDS};
use crate::cpu::gemm::asm512::Zmm;
use crate::cpu::gemm::epilogue::{Epilogue, OperandKind};
use crate::cpu::gemm::evex::{Enc, gpr, mem, mem_indexed};
use crate::cpu::gemm::program::{EpInst, EpProgram, VBin};
use crate::cpu::gemm::program_asm::{self, VecIsa};
use crate::cpu::isa::Isa;
use dynasmrt::x64::Assembler;
use dynasmrt::{DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};

/// Bytes the column offset (rax) advances per element: 4, or 2 where an operand or the output is bf16 (its 4-byte
/// accesses then scale the offset by 2), so that a kernel without bf16 is the same code as before bf16 existed.
pub(super) fn unit(ep: &Epilogue, out_bf16: bool) -> usize {
    if out_bf16 || ep.operands.iter().any(|o| o.bf16) { 2 } else { 4 }
}

/// Where each value lives: values that stand still along a row (per-row loads, uniforms) in registers of their own
/// from the top down (14 with 8 lanes, whose tail mask is in 15; 31 with 16, whose mask is in opmask k1), each
/// unrolled copy's temporaries in its own block from 0 up.
pub(super) struct Layout {
    hoisted: Vec<Option<u8>>,
    /// Registers per copy.
    temps: usize,
    pub(super) unroll: usize,
    /// A row sum's accumulators, one per copy, just under the hoisted values.
    accs: Vec<u8>,
}

impl Layout {
    pub(super) fn plan(p: &EpProgram, n: usize, row_outer: Option<&EpProgram>, isa: Isa) -> Option<Layout> {
        let mut hoisted = vec![None; p.insts.len()];
        let mut next = match isa {
            Isa::Avx2 => MASK_REG,
            Isa::Avx512 => 32,
        };
        for (i, inst) in p.insts.iter().enumerate() {
            if matches!(inst, EpInst::Col { .. } | EpInst::Uniform(_)) {
                next = next.checked_sub(1)?;
                hoisted[i] = Some(next);
            }
            if matches!(inst, EpInst::Acc) {
                return None;
            }
        }
        let temps = p.temps_needed_besides(&|i| hoisted[i].is_some());
        let room = next as usize;
        // A row sum takes one accumulator per copy, and at each row's end the broadcast sum (register 0) and its
        // outer program's temporaries, from the registers below the accumulators.
        let accs_per_copy = usize::from(row_outer.is_some());
        let fits = |u: usize| {
            u * (temps + accs_per_copy) <= room
                && row_outer.is_none_or(|o| room >= u + 2 && o.temps_needed() < room - u)
        };
        // More vectors per iteration than the row has buys nothing; a program that does not fit once stays Cranelift's.
        let unroll = [4, 2, 1].into_iter().find(|&u| fits(u) && (u == 1 || isa.lanes() * u <= n))?;
        let accs = (0..unroll * accs_per_copy).map(|c| (room - 1 - c) as u8).collect();
        Some(Layout { hoisted, temps, unroll, accs })
    }

    fn copy_regs(&self, copy: usize) -> Vec<u8> {
        (copy * self.temps..(copy + 1) * self.temps).map(|r| r as u8).collect()
    }
}

/// Appends the EVEX bytes `f` encodes (the 16-lane form's vector instructions).
pub(super) fn put(ops: &mut Assembler, f: impl FnOnce(&mut Enc)) {
    let mut e = Enc::default();
    f(&mut e);
    ops.extend(e.bytes);
}

/// The 16-lane form's tail and head mask.
pub(super) const KMASK: u8 = 1;

/// Assembles the kernel (see the module doc for its shape) at `isa`'s width: the same loop either way, its vector
/// moves spelled per width (8 lanes: `vmaskmovps` with a lane mask in ymm15; 16: opmask k1 and EVEX moves).
pub(super) fn emit(
    ep: &Epilogue,
    l: &Layout,
    out_ld: usize,
    row_outer: Option<&EpProgram>,
    isa: Isa,
    out_bf16: bool,
) -> Result<ExecutableBuffer, String> {
    let p = &ep.program;
    let last = p.last_uses();
    let wide = isa == Isa::Avx512;
    let zmm = Zmm { pool: gpr::RBP };
    let vec_isa: &dyn VecIsa = if wide { &zmm } else { &program_asm::Ymm };
    let lanes = isa.lanes() as i32;
    // The column offset counts `unit` bytes per element; an access of `size`-byte elements scales it by
    // `size / unit`, and copy `c` of an iteration is `size * lanes * c` bytes further.
    let unit = unit(ep, out_bf16) as i32;
    let access = |size: i32, c: usize| ((size / unit) as u8, size * lanes * c as i32);
    let out_size = if out_bf16 { 2 } else { 4 };
    let mut ops = Assembler::new().map_err(|e| e.to_string())?;
    let (row, main, single, tail, row_end, done) = (
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
    );
    save_registers(&mut ops);
    dynasm!(ops ; .arch x64
        ; mov r15, QWORD [rdi + 8]
        ; mov r14, QWORD [rdi + 24]
        ; mov r13, QWORD [rdi + 32]
        ; mov rax, QWORD [rdi + 16]
    );
    hoist_uniforms(&mut ops, p, &l.hoisted, wide);
    load_operand_pointers(&mut ops, ep.operands.len(), gpr::RDI);
    let mut consts = const_pool(&mut ops, wide);
    let unit_shift = unit.trailing_zeros() as i8;
    dynasm!(ops ; .arch x64
        ; mov rdi, QWORD [rdi]
        ; shl rdx, unit_shift
        ; test rsi, rsi
        ; jz =>done
        ; =>row
    );
    // (r12 is free until the column loop.)
    broadcast_row_values(&mut ops, ep, &l.hoisted, wide);
    for &a in &l.accs {
        if wide {
            put(&mut ops, |e| e.zero(a));
        } else {
            dynasm!(ops ; .arch x64 ; vxorps Ry(a), Ry(a), Ry(a));
        }
    }
    let body = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64
        ; xor eax, eax
        ; test r13, r13
        ; jz =>body
    );
    let load_mask = |ops: &mut Assembler, from: u8| {
        if wide {
            put(ops, |e| e.kmov_load(KMASK, mem(from, 0)));
        } else if from == gpr::R14 {
            dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r14]);
        } else {
            dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r15]);
        }
    };
    load_mask(&mut ops, gpr::R14);
    let fixed = |i: usize| l.hoisted[i];
    // The program for copies 0..n (their vectors at `access(.., c)`), interleaved (`emit_insts_interleaved`);
    // each copy's result register.
    let program = |ops: &mut Assembler, consts: &mut program_asm::ConstPool, n: usize, masked: bool| {
        let regs: Vec<Vec<u8>> = (0..n).map(|c| l.copy_regs(c)).collect();
        let frees: Vec<&[u8]> = regs.iter().map(|r| r.as_slice()).collect();
        let mut load = |ops: &mut Assembler, c: usize, inst: &EpInst, d: u8| {
            load_element_vector(ops, ep, isa, inst, d, |size| access(size, c), masked)
        };
        program_asm::emit_insts_interleaved(vec_isa, ops, p, &last, &frees, &fixed, &mut load, consts)
    };
    // Copy `c`'s result `res` summed into its accumulator or stored.
    let finish = |ops: &mut Assembler, c: usize, res: u8, masked: bool| {
        if let Some(&acc) = l.accs.get(c) {
            // A row sum: the lanes past the row's end hold the program's value of the masked loads' zeros, which
            // may be anything (log(0) = -inf): cleared to +0 before they are added. Not in place when the result
            // is a hoisted register (a value uniform over the launch, summed): that would clear its lanes for every
            // later row. Then into the copy's first temporary, or register 0, which a program without temporaries
            // leaves free (`Layout::plan` keeps registers 0 and 1 under the accumulators).
            let cleared = if masked {
                let dst =
                    if l.hoisted.contains(&Some(res)) { l.copy_regs(c).first().copied().unwrap_or(0) } else { res };
                if wide {
                    put(ops, |e| e.mov_masked_zero(dst, KMASK, res));
                } else {
                    dynasm!(ops ; .arch x64 ; vandps Ry(dst), Ry(res), Ry(MASK_REG));
                }
                dst
            } else {
                res
            };
            vec_isa.bin(ops, VBin::Add, acc, acc, cleared);
        } else {
            let (scale, disp) = access(out_size, c);
            let res = if out_bf16 {
                // The program's result is a bf16 value (`epilogue::translate_with` rounds it): its top half,
                // shifted down in place, or into a temporary where it is a hoisted value later rows read again
                // (every temporary is free once the result is computed; register 0 where the program has none).
                let dst =
                    if l.hoisted.contains(&Some(res)) { l.copy_regs(c).first().copied().unwrap_or(0) } else { res };
                put(ops, |e| e.shift(2, dst, res, 16));
                dst
            } else {
                res
            };
            store_vector(ops, isa, res, Access { scale, disp, bf16: out_bf16 }, masked);
        }
    };
    let mut copies = |ops: &mut Assembler, n: usize, masked: bool| -> Result<(), String> {
        let res = program(ops, &mut consts, n, masked)?;
        for (c, r) in res.into_iter().enumerate() {
            finish(ops, c, r, masked);
        }
        Ok(())
    };
    copies(&mut ops, 1, true)?;
    dynasm!(ops ; .arch x64 ; mov rax, r13 ; =>body);
    let vb = unit * lanes;
    if l.unroll > 1 {
        let span = vb * l.unroll as i32;
        dynasm!(ops ; .arch x64
            ; =>main
            ; lea r12, [rax + span]
            ; cmp r12, rdx
            ; ja =>single
        );
        copies(&mut ops, l.unroll, false)?;
        dynasm!(ops ; .arch x64 ; mov rax, r12 ; jmp =>main);
    }
    dynasm!(ops ; .arch x64
        ; =>single
        ; lea r12, [rax + vb]
        ; cmp r12, rdx
        ; ja =>tail
    );
    copies(&mut ops, 1, false)?;
    dynasm!(ops ; .arch x64
        ; mov rax, r12
        ; jmp =>single
        ; =>tail
        ; cmp rax, rdx
        ; jae =>row_end
    );
    load_mask(&mut ops, gpr::R15);
    copies(&mut ops, 1, true)?;
    dynasm!(ops ; .arch x64 ; =>row_end);
    let out_step = if let Some(outer) = row_outer {
        // Pairwise (a0 + a1) + (a2 + a3), then the lanes (16 folded to 8 first), into lane 0 of register 0,
        // broadcast; then the outer program; lane 0 stored.
        let a = &l.accs;
        if a.len() == 4 {
            vec_isa.bin(&mut ops, VBin::Add, a[0], a[0], a[1]);
            vec_isa.bin(&mut ops, VBin::Add, a[2], a[2], a[3]);
            vec_isa.bin(&mut ops, VBin::Add, a[0], a[0], a[2]);
        } else if a.len() == 2 {
            vec_isa.bin(&mut ops, VBin::Add, a[0], a[0], a[1]);
        }
        if wide {
            put(&mut ops, |e| {
                e.shuffle_quarters(1, a[0], a[0], 0x4e);
                e.op3(crate::cpu::gemm::evex::VADDPS, 0, a[0], crate::cpu::gemm::evex::Rm::Reg(1));
            });
        } else {
            let a0 = a[0];
            dynasm!(ops ; .arch x64 ; vmovaps ymm0, Ry(a0));
        }
        dynasm!(ops ; .arch x64
            ; vextractf128 xmm1, ymm0, 1
            ; vaddps xmm0, xmm0, xmm1
            ; vmovhlps xmm1, xmm1, xmm0
            ; vaddps xmm0, xmm0, xmm1
            ; vmovshdup xmm1, xmm0
            ; vaddss xmm0, xmm0, xmm1
        );
        if wide {
            put(&mut ops, |e| e.broadcast_lane0(0, 0));
        } else {
            dynasm!(ops ; .arch x64 ; vbroadcastss ymm0, xmm0);
        }
        // Below the accumulators, and within xmm0-15, which the VEX store of the result can name.
        let free: Vec<u8> = (1..a[a.len() - 1].min(16)).collect();
        let res = emit_sum_outer(vec_isa, &mut ops, outer, &outer.last_uses(), &free, &mut consts)?;
        dynasm!(ops ; .arch x64 ; vmovss DWORD [rdi], Rx(res));
        4
    } else {
        out_size * out_ld as i32
    };
    dynasm!(ops ; .arch x64 ; add rdi, out_step);
    for (o, operand) in ep.operands.iter().enumerate() {
        let r = OPERAND_REGS[o];
        let size = operand.elem_bytes() as i32;
        let step = match operand.kind {
            OperandKind::Mat { ld } => size * ld as i32,
            OperandKind::Col { stride } => size * stride as i32,
            OperandKind::Row => continue,
        };
        dynasm!(ops ; .arch x64 ; add Rq(r), step);
    }
    dynasm!(ops ; .arch x64 ; dec rsi ; jnz =>row ; =>done);
    restore_registers_and_return(&mut ops);
    consts.emit(&mut ops);
    ops.finalize().map_err(|_| "finalizing an elementwise kernel failed".to_string())
}

/// Where a vector access is relative to its row pointer: `[row + rax*scale + disp]`, and whether its elements are
/// bf16 (16-lane form only).
/// Emits a sum's outer program (`sum_parts`: the `log` of a log-sum-exp, a scale) over the sum in register 0, which
/// it reads as its accumulator and never loads anything else, taking temporaries from `free`; returns the register
/// of its result. The row sums' and the column sums' loops share it.
pub(super) fn emit_sum_outer(
    vec_isa: &dyn VecIsa,
    ops: &mut Assembler,
    outer: &EpProgram,
    last: &[usize],
    free: &[u8],
    consts: &mut program_asm::ConstPool,
) -> Result<u8, String> {
    let sum = |i: usize| matches!(outer.insts[i], EpInst::Acc).then_some(0u8);
    let mut no_load = |_: &mut Assembler, _: &EpInst, _: u8| unreachable!("a sum's outer program loads nothing");
    program_asm::emit_insts(vec_isa, ops, outer, last, free, &sum, &mut no_load, consts)
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Access {
    pub scale: u8,
    pub disp: i32,
    pub bf16: bool,
}

impl Access {
    /// 32-bit elements, the column offset in bytes.
    pub(super) fn f32(disp: i32) -> Access {
        Access { scale: 1, disp, bf16: false }
    }
}

/// `d` = the vector at `a` from `base`, lanes past the mask zero when `masked` (ymm15 at 8 lanes, k1 at 16); bf16
/// elements are widened to their exact f32 values (zero-extended into the top half of each lane).
pub(super) fn load_vector(ops: &mut Assembler, isa: Isa, d: u8, base: u8, a: Access, masked: bool) {
    let disp = a.disp;
    if isa == Isa::Avx512 {
        let (m, k) = (mem_indexed(base, gpr::RAX, a.scale, disp), if masked { KMASK } else { 0 });
        put(ops, |e| {
            if a.bf16 {
                e.load_words_zx(d, m, k);
                e.shift(6, d, d, 16);
            } else {
                e.load(d, m, k);
            }
        });
    } else if masked {
        debug_assert!(a.scale == 1 && !a.bf16, "8 lanes: f32, the column offset in bytes");
        dynasm!(ops ; .arch x64 ; vmaskmovps Ry(d), Ry(MASK_REG), [Rq(base) + rax + disp]);
    } else {
        dynasm!(ops ; .arch x64 ; vmovups Ry(d), [Rq(base) + rax + disp]);
    }
}

/// Stores `x` at `a` from rdi (the output), only the mask's lanes when `masked`; bf16 elements are the low words of
/// `x`'s lanes.
pub(super) fn store_vector(ops: &mut Assembler, isa: Isa, x: u8, a: Access, masked: bool) {
    let disp = a.disp;
    if isa == Isa::Avx512 {
        let (m, k) = (mem_indexed(gpr::RDI, gpr::RAX, a.scale, disp), if masked { KMASK } else { 0 });
        put(ops, |e| if a.bf16 { e.store_low_words(m, x, k) } else { e.store(m, x, k) });
    } else if masked {
        debug_assert!(a.scale == 1 && !a.bf16, "8 lanes: f32, the column offset in bytes");
        dynasm!(ops ; .arch x64 ; vmaskmovps [rdi + rax + disp], Ry(MASK_REG), Ry(x));
    } else {
        dynasm!(ops ; .arch x64 ; vmovups [rdi + rax + disp], Ry(x));
    }
}

/// Loads the launch-uniform values of `p` into their hoisted registers, from the splatted slots rax points at (the
/// table's uniforms entry): 8 lanes load a slot, 16 broadcast its first lane.
pub(super) fn hoist_uniforms(ops: &mut Assembler, p: &EpProgram, hoisted: &[Option<u8>], wide: bool) {
    for (i, inst) in p.insts.iter().enumerate() {
        if let (EpInst::Uniform(slot), Some(h)) = (inst, hoisted[i]) {
            let off = 32 * *slot as i32;
            if wide {
                put(ops, |e| e.broadcast(h, mem(gpr::RAX, off)));
            } else {
                dynasm!(ops ; .arch x64 ; vmovups Ry(h), [rax + off]);
            }
        }
    }
}

/// Points each of `n` operands' registers ([`OPERAND_REGS`]) at its pointer in the table that GPR `table` holds.
pub(super) fn load_operand_pointers(ops: &mut Assembler, n: usize, table: u8) {
    for (o, &r) in OPERAND_REGS.iter().enumerate().take(n) {
        let off = 8 * (TABLE_OPERANDS + o) as i32;
        dynasm!(ops ; .arch x64 ; mov Rq(r), QWORD [Rq(table) + off]);
    }
}

/// The code's constant pool; at 16 lanes its base goes into rbp, which nothing else in these loops uses.
pub(super) fn const_pool(ops: &mut Assembler, wide: bool) -> program_asm::ConstPool {
    let mut consts = program_asm::ConstPool::default();
    if wide {
        let base = consts.base(ops);
        dynasm!(ops ; .arch x64 ; lea rbp, [=>base]);
    }
    consts
}

/// Broadcasts each per-row value (a load that stands still along a row) into its hoisted register, read at its
/// operand's current row pointer; a bf16 one as the top half of a dword through r12.
pub(super) fn broadcast_row_values(ops: &mut Assembler, ep: &Epilogue, hoisted: &[Option<u8>], wide: bool) {
    for (i, inst) in ep.program.insts.iter().enumerate() {
        if let (EpInst::Col { op, .. }, Some(h)) = (inst, hoisted[i]) {
            let r = OPERAND_REGS[*op];
            if ep.operands[*op].bf16 {
                dynasm!(ops ; .arch x64 ; movzx r12d, WORD [Rq(r)] ; shl r12d, 16);
                put(ops, |e| e.broadcast_gpr(h, gpr::R12));
            } else if wide {
                put(ops, |e| e.broadcast(h, mem(r, 0)));
            } else {
                dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(h), DWORD [Rq(r)]);
            }
        }
    }
}

/// The load of a per-element or per-column value `inst` (`Mat`, `Row`) into `d`, at the column offset (rax) from
/// its operand's row pointer: `at(element bytes)` gives the access's scale and displacement.
pub(super) fn load_element_vector(
    ops: &mut Assembler,
    ep: &Epilogue,
    isa: Isa,
    inst: &EpInst,
    d: u8,
    at: impl Fn(i32) -> (u8, i32),
    masked: bool,
) {
    let (EpInst::Mat { op, .. } | EpInst::Row { op, .. }) = *inst else {
        unreachable!("per-row values and uniforms are hoisted")
    };
    let bf16 = ep.operands[op].bf16;
    let (scale, disp) = at(if bf16 { 2 } else { 4 });
    load_vector(ops, isa, d, OPERAND_REGS[op], Access { scale, disp, bf16 }, masked);
}

/// Pushes the callee-saved registers the generated loops use (rbp, rbx, r12-r15).
pub(super) fn save_registers(ops: &mut Assembler) {
    dynasm!(ops ; .arch x64 ; push rbp ; push rbx ; push r12 ; push r13 ; push r14 ; push r15);
}

/// Clears the upper vector halves, pops what [`save_registers`] pushed, and returns.
pub(super) fn restore_registers_and_return(ops: &mut Assembler) {
    dynasm!(ops ; .arch x64 ; vzeroupper ; pop r15 ; pop r14 ; pop r13 ; pop r12 ; pop rbx ; pop rbp ; ret);
}
