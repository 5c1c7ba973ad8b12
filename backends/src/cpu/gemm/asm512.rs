//! x86-64 AVX-512F GEMM micro-kernels, generated at run time: the 16-lane family next to `asm`'s AVX2 one.
//!
//! Same contract as `asm::emit` (`MicroFn`: `a, b, c, k, ep`; the same `Mode`s, `MicroSpec` addressing and epilogue
//! programs), at twice the width and with twice the registers: an `mr x (16 * nv)` tile keeps `mr * nv`
//! accumulators in zmm0.., `nv` B vectors after them and the broadcast of A in zmm31, so tiles like 6x64, 8x48 and
//! 14x32 fit where AVX2 stops at 6x16. A ragged last vector is masked with opmask k1 (loaded from the `u16` at
//! `ep[0]`): masked loads and stores instead of `vmaskmovps`, and masked-off lanes never fault. Epilogue programs
//! run through the shared `program_asm::emit_insts` with [`Zmm`] spelling its instructions; its constants are read by
//! broadcast from the pool after the code through r10 (`lea r10, [pool]`), so the code stays position independent.
//!
//! Why generated and not ahead-of-time intrinsics: the epilogue is part of the kernel (bias, activation, a residual
//! add, all in registers before the one store), and a tile, a stride and a program are run-time values. The EVEX
//! prefix is encoded by `evex` (`dynasmrt` has no AVX-512); the loop and GPR code is `dynasm!`'s.
//!
//! Whether these kernels beat AVX2 depends on the core (see `cpu::isa`): they are candidates, and the tuner races
//! them. Every kernel ends with `vzeroupper`.

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::asm::{MicroSpec, Mode, k_loop};
use super::evex::{self, Enc, Rm, gpr, mem};
use super::program::{EpProgram, VBin};
use super::program_asm::{ConstPool, ConstRef, Shift, VecIsa, emit_program};
use crate::cpu::isa::Isa;
use dynasmrt::x64::Assembler;
use dynasmrt::{AssemblyOffset, DynasmApi, DynasmLabelApi, dynasm};

/// The opmask of a ragged last vector.
const TAIL_MASK: u8 = 1;
/// The opmask a compare or select of an epilogue uses.
const TEMP_MASK: u8 = 2;
/// The register holding the constant pool's address during the epilogue.
const POOL: u8 = gpr::R10;
/// The broadcast of A.
const A_REG: u8 = 31;

/// Appends the bytes `f` encodes.
fn put(ops: &mut Assembler, f: impl FnOnce(&mut Enc)) {
    let mut e = Enc::default();
    f(&mut e);
    ops.extend(e.bytes);
}

/// 16-lane AVX-512F instructions (zmm0..31) for the shared epilogue emitter. Constants are read from the pool
/// whose address the kernel keeps in GPR `pool` (r10 here; the elementwise kernels use another).
pub(crate) struct Zmm {
    pub pool: u8,
}

impl Zmm {
    /// Constant `k`'s slot as a broadcast memory operand (its first lane).
    fn konst(&self, k: ConstRef) -> Rm {
        Rm::Bcst(mem(self.pool, 32 * k.slot as i32))
    }
}

fn opcode(op: VBin) -> evex::Opc {
    match op {
        VBin::Add => evex::VADDPS,
        VBin::Sub => evex::VSUBPS,
        VBin::Mul => evex::VMULPS,
        VBin::Div => evex::VDIVPS,
        VBin::And => evex::VPANDD,
        VBin::Or => evex::VPORD,
        VBin::Xor => evex::VPXORD,
        VBin::IAdd => evex::VPADDD,
        VBin::ISub => evex::VPSUBD,
        VBin::MaxRaw => evex::VMAXPS,
    }
}

impl VecIsa for Zmm {
    fn vector_bytes(&self) -> i32 {
        64
    }
    fn load(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32, masked: bool) {
        put(ops, |e| e.load(d, mem(base, disp), if masked { TAIL_MASK } else { 0 }));
    }
    fn broadcast(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32) {
        put(ops, |e| e.broadcast(d, mem(base, disp)));
    }
    fn load_elements(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32, masked: bool, bf16: bool) {
        if !bf16 {
            return self.load(ops, d, base, disp, masked);
        }
        put(ops, |e| {
            e.load_words_zx(d, mem(base, disp), if masked { TAIL_MASK } else { 0 });
            e.shift(6, d, d, 16);
        });
    }
    fn broadcast_bf16(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32) {
        // The word in every word (AVX512BW: `epilogue::Allow::bf16_loads` is given only where it is present), then
        // each dword's low copy shifted into its top half.
        put(ops, |e| {
            e.broadcast_word(d, mem(base, disp));
            e.shift(6, d, d, 16);
        });
    }
    fn uniform(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32) {
        // Stored splatted over 8 lanes: the first is broadcast.
        self.broadcast(ops, d, base, disp);
    }
    fn bin(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, y: u8) {
        put(ops, |e| e.op3(opcode(op), d, x, Rm::Reg(y)));
    }
    fn bin_const(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, k: ConstRef) {
        put(ops, |e| e.op3(opcode(op), d, x, self.konst(k)));
    }
    fn konst(&self, ops: &mut Assembler, d: u8, k: ConstRef) {
        put(ops, |e| e.broadcast(d, mem(self.pool, 32 * k.slot as i32)));
    }
    fn fma_const(&self, ops: &mut Assembler, d: u8, x: u8, k: ConstRef) {
        put(ops, |e| e.op3(evex::VFMADD213PS, d, x, self.konst(k)));
    }
    fn mov(&self, ops: &mut Assembler, d: u8, x: u8) {
        put(ops, |e| e.mov(d, x));
    }
    fn max_min_const(&self, ops: &mut Assembler, max: bool, d: u8, x: u8, k: ConstRef) {
        put(ops, |e| {
            e.broadcast(d, mem(self.pool, 32 * k.slot as i32));
            e.op3(if max { evex::VMAXPS } else { evex::VMINPS }, d, d, Rm::Reg(x));
        });
    }
    fn shift(&self, ops: &mut Assembler, kind: Shift, d: u8, x: u8, n: u8) {
        let ext = match kind {
            Shift::Left => 6,
            Shift::RightArith => 4,
            Shift::RightLogical => 2,
        };
        put(ops, |e| e.shift(ext, d, x, n));
    }
    fn cmp(&self, ops: &mut Assembler, d: u8, x: u8, y: u8, p: i8) {
        put(ops, |e| {
            e.cmp(TEMP_MASK, x, y, p as u8);
            e.mask_to_lanes(d, TEMP_MASK);
        });
    }
    fn icmp_eq(&self, ops: &mut Assembler, d: u8, x: u8, y: u8) {
        put(ops, |e| {
            e.icmp_eq(TEMP_MASK, x, y);
            e.mask_to_lanes(d, TEMP_MASK);
        });
    }
    fn positions(&self, ops: &mut Assembler, d: u8, gpr: u8, lanes: ConstRef) {
        put(ops, |e| {
            e.broadcast_gpr(d, gpr);
            e.shift(2, d, d, 2);
            e.op3(evex::VPADDD, d, d, Rm::Full(mem(self.pool, 32 * lanes.slot as i32)));
        });
    }
    fn select(&self, ops: &mut Assembler, d: u8, m: u8, t: u8, f: u8) {
        put(ops, |e| {
            e.lanes_to_mask(TEMP_MASK, m);
            e.blend(d, TEMP_MASK, f, t);
        });
    }
    fn sqrt(&self, ops: &mut Assembler, d: u8, x: u8) {
        put(ops, |e| e.sqrt(d, x));
    }
    fn round_nearest(&self, ops: &mut Assembler, d: u8, x: u8) {
        put(ops, |e| e.round_nearest(d, x));
    }
    fn scalef(&self, ops: &mut Assembler, d: u8, x: u8, y: u8) -> Result<(), String> {
        put(ops, |e| e.op3(evex::VSCALEFPS, d, x, Rm::Reg(y)));
        Ok(())
    }
}

/// Accumulator register of tile element (r, v).
fn acc(nv: usize, r: usize, v: usize) -> u8 {
    (r * nv + v) as u8
}

/// Emits one 16-lane kernel at the assembler's current offset and returns that offset.
pub fn emit(ops: &mut Assembler, s: &MicroSpec, ep: &EpProgram) -> Result<AssemblyOffset, String> {
    if s.isa != Isa::Avx512 || !super::config::fits(Isa::Avx512, s.mr, s.nv) || !s.unroll.is_power_of_two() {
        return Err(format!("tile {}x{} (unroll {}) does not fit 32 registers", s.mr, 16 * s.nv, s.unroll));
    }
    let with_ep = matches!(s.mode, Mode::Last | Mode::Single);
    let epi = if with_ep { ep.clone() } else { EpProgram::identity() };
    let nacc = s.mr * s.nv;
    // Everything past the accumulators is free once the K loop is done (the mask lives in k1).
    let free_regs: Vec<u8> = (nacc as u8..32).collect();
    if epi.temps_needed() > free_regs.len() {
        return Err(format!("epilogue needs {} registers, {} free", epi.temps_needed(), free_regs.len()));
    }
    let start = ops.offset();
    let b0 = nacc as u8;
    let (mr, nv) = (s.mr, s.nv);
    // The K loop prefetches the C tile (`k_loop`).
    put(ops, |e| (0..nacc as u8).for_each(|i| e.zero(i)));
    let step = |ops: &mut Assembler, u: usize| {
        let bk = u as i32 * s.b_ks;
        let ak = u as i32 * s.a_ks;
        if s.prefetch > 0 {
            for line in 0..nv {
                let d = bk + s.prefetch * s.b_ks + 64 * line as i32;
                dynasm!(ops ; .arch x64 ; prefetcht0 [rsi + d]);
            }
        }
        put(ops, |e| {
            if mr == 1 {
                e.broadcast(A_REG, mem(gpr::RDI, ak));
                for v in 0..nv {
                    e.op3(evex::VFMADD231PS, acc(nv, 0, v), A_REG, Rm::Full(mem(gpr::RSI, bk + 64 * v as i32)));
                }
                return;
            }
            for v in 0..nv {
                e.load(b0 + v as u8, mem(gpr::RSI, bk + 64 * v as i32), 0);
            }
            for r in 0..mr {
                e.broadcast(A_REG, mem(gpr::RDI, ak + r as i32 * s.a_rs));
                for v in 0..nv {
                    e.op3(evex::VFMADD231PS, acc(nv, r, v), b0 + v as u8, Rm::Reg(A_REG));
                }
            }
        });
    };
    k_loop(ops, s, &epi, &step);
    // Finish: mask, C, epilogue, store.
    if s.masked {
        dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8]);
        put(ops, |e| e.kmov_load(TAIL_MASK, mem(gpr::R9, 0)));
    }
    let mut consts = ConstPool::default();
    let pool = consts.base(ops);
    dynasm!(ops ; .arch x64 ; lea r10, [=>pool]);
    let load_c = matches!(s.mode, Mode::Middle | Mode::Last);
    let last_uses = epi.last_uses();
    for r in 0..mr {
        for v in 0..nv {
            let a = acc(nv, r, v);
            let cd = mem(gpr::RDX, r as i32 * s.ldc + 64 * v as i32);
            let k = if s.masked && v == nv - 1 { TAIL_MASK } else { 0 };
            if load_c {
                let t = free_regs[0];
                put(ops, |e| {
                    if k != 0 {
                        e.load(t, cd, k);
                        e.op3(evex::VADDPS, a, a, Rm::Reg(t));
                    } else {
                        e.op3(evex::VADDPS, a, a, Rm::Full(cd));
                    }
                });
            }
            let res =
                emit_program(&Zmm { pool: POOL }, ops, &epi, &last_uses, &free_regs, (a, r, v), k != 0, &mut consts)?;
            put(ops, |e| {
                if res != a {
                    e.mov(a, res);
                }
                e.store(cd, a, k);
            });
        }
    }
    dynasm!(ops ; .arch x64 ; vzeroupper ; ret);
    consts.emit(ops);
    Ok(start)
}
