//! A register program (`program.rs`) as machine code: `emit_insts` allocates registers and walks the program once
//! for either width, a `VecIsa` spells each instruction (8 lanes here through `dynasm!`, 16 in `asm512.rs` through
//! the EVEX encoder), `emit_program` adds a GEMM tile's operand loads, and `ConstPool` places the constants the
//! program reads after the code.

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::program::{EpInst, EpProgram, VBin, releases_late, sources};
use dynasmrt::x64::Assembler;
use dynasmrt::{DynamicLabel, DynasmApi, DynasmLabelApi, dynasm};

/// Emits the epilogue for tile element (r, v) whose accumulator is `acc_reg` (`at` = (acc_reg, r, v)) at `isa`'s
/// width, operand loads masked to the ragged edge when `masked`, and returns the register holding the result. The
/// operands' pointers are read from the table at r8 into r9 (see the module doc).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_program(
    isa: &dyn VecIsa,
    ops: &mut Assembler,
    p: &EpProgram,
    last: &[usize],
    free: &[u8],
    at: (u8, usize, usize),
    masked: bool,
    consts: &mut ConstPool,
) -> Result<u8, String> {
    const R9: u8 = 9;
    let (acc_reg, r, v) = at;
    let bf16_loads = p.insts.iter().any(|i| {
        matches!(i, EpInst::Mat { bf16: true, .. } | EpInst::Row { bf16: true, .. } | EpInst::Col { bf16: true, .. })
    });
    if bf16_loads && isa.vector_bytes() != 64 {
        return Err("bf16 epilogue loads need the 16-lane form".into());
    }
    // A vector of `v`'s elements: 4 bytes each, or 2 for a bf16 operand.
    let vd = |bf16: bool| isa.vector_bytes() * v as i32 / if bf16 { 2 } else { 1 };
    let fixed = |i: usize| matches!(p.insts[i], EpInst::Acc).then_some(acc_reg);
    let mut load = |ops: &mut Assembler, inst: &EpInst, d: u8| {
        let ptr = |ops: &mut Assembler, slot: usize| {
            let off = 8 * slot as i32;
            dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8 + off]);
        };
        match *inst {
            EpInst::Mat { op, ld, bf16 } => {
                ptr(ops, 2 + op);
                isa.load_elements(ops, d, R9, r as i32 * ld + vd(bf16), masked, bf16);
            }
            EpInst::Row { op, bf16 } => {
                ptr(ops, 2 + op);
                isa.load_elements(ops, d, R9, vd(bf16), masked, bf16);
            }
            EpInst::Col { op, stride, bf16 } => {
                ptr(ops, 2 + op);
                if bf16 {
                    isa.broadcast_bf16(ops, d, R9, r as i32 * stride);
                } else {
                    isa.broadcast(ops, d, R9, r as i32 * stride);
                }
            }
            EpInst::Uniform(slot) => {
                ptr(ops, 1);
                isa.uniform(ops, d, R9, 32 * slot as i32);
            }
            // A GEMM's epilogue is translated without positions (`epilogue::Allow`).
            _ => unreachable!("only loads are passed to `load`"),
        }
    };
    emit_insts(isa, ops, p, last, free, &fixed, &mut load, consts)
}

/// `d = x op src` for a [`VBin`], `src` a register (`Ry(y)`) or a memory operand (`[=>label]`): the one opcode
/// table of both forms.
macro_rules! vbin {
    ($ops:expr, $op:expr, $d:expr, $x:expr, $($src:tt)+) => {
        match $op {
            VBin::Add => dynasm!($ops ; .arch x64 ; vaddps Ry($d), Ry($x), $($src)+),
            VBin::Sub => dynasm!($ops ; .arch x64 ; vsubps Ry($d), Ry($x), $($src)+),
            VBin::Mul => dynasm!($ops ; .arch x64 ; vmulps Ry($d), Ry($x), $($src)+),
            VBin::Div => dynasm!($ops ; .arch x64 ; vdivps Ry($d), Ry($x), $($src)+),
            VBin::And => dynasm!($ops ; .arch x64 ; vandps Ry($d), Ry($x), $($src)+),
            VBin::Or => dynasm!($ops ; .arch x64 ; vorps Ry($d), Ry($x), $($src)+),
            VBin::Xor => dynasm!($ops ; .arch x64 ; vxorps Ry($d), Ry($x), $($src)+),
            VBin::IAdd => dynasm!($ops ; .arch x64 ; vpaddd Ry($d), Ry($x), $($src)+),
            VBin::ISub => dynasm!($ops ; .arch x64 ; vpsubd Ry($d), Ry($x), $($src)+),
            VBin::MaxRaw => dynasm!($ops ; .arch x64 ; vmaxps Ry($d), Ry($x), $($src)+),
        }
    };
}

/// A constant of the pool: its label (RIP-relative addressing) and its 32-byte slot after the pool's base label.
#[derive(Clone, Copy)]
pub(crate) struct ConstRef {
    label: DynamicLabel,
    pub(crate) slot: usize,
}

/// Lane-wise shifts by an immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shift {
    Left,
    RightArith,
    RightLogical,
}

/// The vector instructions of an epilogue program at one width: 8 lanes (`Ymm`, AVX2 through `dynasm!`) or 16
/// (`asm512::Zmm`, AVX-512F through the EVEX encoder). [`emit_insts`] allocates registers and walks the program
/// once for both; a width only spells instructions. Masks are all-ones/zero lanes in vector registers at both
/// widths (AVX-512 compares into an opmask and widens it), so programs mean the same everywhere.
pub(crate) trait VecIsa {
    /// Bytes of one vector (32 or 64).
    fn vector_bytes(&self) -> i32;
    /// `d = [gpr base + disp]`, or with `masked` only the lanes of the ragged-edge mask (the others zero, never
    /// read): ymm15 at 8 lanes, opmask k1 at 16.
    fn load(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32, masked: bool);
    /// `d` = the f32 at `[gpr base + disp]`, in every lane.
    fn broadcast(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32);
    /// [`VecIsa::load`], or with `bf16` a vector of 2-byte elements widened to their f32 values (16 lanes only:
    /// callers check `vector_bytes` first).
    fn load_elements(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32, masked: bool, bf16: bool) {
        assert!(!bf16, "bf16 loads are generated at 16 lanes only");
        self.load(ops, d, base, disp, masked);
    }
    /// `d` = the bf16 at `[gpr base + disp]` as an f32, in every lane (16 lanes only, as `load_elements`).
    fn broadcast_bf16(&self, _ops: &mut Assembler, _d: u8, _base: u8, _disp: i32) {
        unreachable!("bf16 loads are generated at 16 lanes only");
    }
    /// `d` = a launch-uniform value stored splatted over 8 lanes at `[gpr base + disp]`.
    fn uniform(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32);
    fn bin(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, y: u8);
    fn bin_const(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, k: ConstRef);
    /// `d = k` in every lane.
    fn konst(&self, ops: &mut Assembler, d: u8, k: ConstRef);
    /// `d = d * x + k`, one rounding.
    fn fma_const(&self, ops: &mut Assembler, d: u8, x: u8, k: ConstRef);
    fn mov(&self, ops: &mut Assembler, d: u8, x: u8);
    /// `d = max(k, x)` (`min`), x86's rule: `x` where either is NaN. `d` is not `x`.
    fn max_min_const(&self, ops: &mut Assembler, max: bool, d: u8, x: u8, k: ConstRef);
    fn shift(&self, ops: &mut Assembler, kind: Shift, d: u8, x: u8, n: u8);
    /// `d = x <pred> y` as lane masks ([`pred`]).
    fn cmp(&self, ops: &mut Assembler, d: u8, x: u8, y: u8, p: i8);
    /// `d = x == y` on 32-bit integer lanes, as lane masks.
    fn icmp_eq(&self, ops: &mut Assembler, d: u8, x: u8, y: u8);
    /// `d = (gpr >> 2) + lanes` on 32-bit integer lanes: the column of each lane of a vector at byte offset `gpr`
    /// (f32 elements) plus a lane constant ([`ConstPool::lanes`]).
    fn positions(&self, ops: &mut Assembler, d: u8, gpr: u8, lanes: ConstRef);
    /// `d = m ? t : f` per lane, `m` a lane mask.
    fn select(&self, ops: &mut Assembler, d: u8, m: u8, t: u8, f: u8);
    fn sqrt(&self, ops: &mut Assembler, d: u8, x: u8);
    /// `d = x * 2^floor(y)`, one rounding ([`EpInst::Scalef`]); an error where the width has no such instruction.
    fn scalef(&self, ops: &mut Assembler, d: u8, x: u8, y: u8) -> Result<(), String>;
    /// `d = x` rounded to an integral value, ties to even ([`EpInst::RoundNearest`]).
    fn round_nearest(&self, ops: &mut Assembler, d: u8, x: u8);
}

/// 8-lane AVX2 instructions (ymm0..15).
pub(crate) struct Ymm;

impl VecIsa for Ymm {
    fn vector_bytes(&self) -> i32 {
        32
    }
    fn load(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32, masked: bool) {
        if masked {
            dynasm!(ops ; .arch x64 ; vmaskmovps Ry(d), Ry(15), [Rq(base) + disp]);
        } else {
            dynasm!(ops ; .arch x64 ; vmovups Ry(d), [Rq(base) + disp]);
        }
    }
    fn broadcast(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32) {
        dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(d), DWORD [Rq(base) + disp]);
    }
    fn uniform(&self, ops: &mut Assembler, d: u8, base: u8, disp: i32) {
        self.load(ops, d, base, disp, false);
    }
    fn bin(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, y: u8) {
        vbin!(ops, op, d, x, Ry(y));
    }
    fn bin_const(&self, ops: &mut Assembler, op: VBin, d: u8, x: u8, k: ConstRef) {
        let at = k.label;
        vbin!(ops, op, d, x, [=>at]);
    }
    fn konst(&self, ops: &mut Assembler, d: u8, k: ConstRef) {
        let at = k.label;
        dynasm!(ops ; .arch x64 ; vmovaps Ry(d), [=>at]);
    }
    fn fma_const(&self, ops: &mut Assembler, d: u8, x: u8, k: ConstRef) {
        let at = k.label;
        dynasm!(ops ; .arch x64 ; vfmadd213ps Ry(d), Ry(x), [=>at]);
    }
    fn mov(&self, ops: &mut Assembler, d: u8, x: u8) {
        dynasm!(ops ; .arch x64 ; vmovaps Ry(d), Ry(x));
    }
    fn max_min_const(&self, ops: &mut Assembler, max: bool, d: u8, x: u8, k: ConstRef) {
        let at = k.label;
        dynasm!(ops ; .arch x64 ; vmovaps Ry(d), [=>at]);
        if max {
            dynasm!(ops ; .arch x64 ; vmaxps Ry(d), Ry(d), Ry(x));
        } else {
            dynasm!(ops ; .arch x64 ; vminps Ry(d), Ry(d), Ry(x));
        }
    }
    fn shift(&self, ops: &mut Assembler, kind: Shift, d: u8, x: u8, n: u8) {
        match kind {
            Shift::Left => dynasm!(ops ; .arch x64 ; vpslld Ry(d), Ry(x), n as i8),
            Shift::RightArith => dynasm!(ops ; .arch x64 ; vpsrad Ry(d), Ry(x), n as i8),
            Shift::RightLogical => dynasm!(ops ; .arch x64 ; vpsrld Ry(d), Ry(x), n as i8),
        }
    }
    fn cmp(&self, ops: &mut Assembler, d: u8, x: u8, y: u8, p: i8) {
        cmp(ops, d, x, y, p);
    }
    fn icmp_eq(&self, ops: &mut Assembler, d: u8, x: u8, y: u8) {
        dynasm!(ops ; .arch x64 ; vpcmpeqd Ry(d), Ry(x), Ry(y));
    }
    fn positions(&self, ops: &mut Assembler, d: u8, gpr: u8, lanes: ConstRef) {
        let at = lanes.label;
        dynasm!(ops ; .arch x64
            ; vmovd Rx(d), Rd(gpr)
            ; vpbroadcastd Ry(d), Rx(d)
            ; vpsrld Ry(d), Ry(d), 2
            ; vpaddd Ry(d), Ry(d), [=>at]
        );
    }
    fn select(&self, ops: &mut Assembler, d: u8, m: u8, t: u8, f: u8) {
        dynasm!(ops ; .arch x64 ; vblendvps Ry(d), Ry(f), Ry(t), Ry(m));
    }
    fn sqrt(&self, ops: &mut Assembler, d: u8, x: u8) {
        dynasm!(ops ; .arch x64 ; vsqrtps Ry(d), Ry(x));
    }
    fn scalef(&self, _: &mut Assembler, _: u8, _: u8, _: u8) -> Result<(), String> {
        Err("vscalefps has no 8-lane (AVX2) form: this program was translated for 16 lanes".into())
    }
    fn round_nearest(&self, ops: &mut Assembler, d: u8, x: u8) {
        dynasm!(ops ; .arch x64 ; vroundps Ry(d), Ry(x), 0);
    }
}

/// Emits the arithmetic of `p` and returns the register holding its result. `fixed(i)` names a register that
/// holds instruction `i` already (the accumulator, a value the caller loaded before a loop): never emitted, never
/// reused. Every other value takes a register from `free` (released after its last use, per `last`); loads
/// (`Mat`, `Row`, `Col`, `Uniform`) are emitted by `load`, which knows where the operands are.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_insts(
    isa: &dyn VecIsa,
    ops: &mut Assembler,
    p: &EpProgram,
    last: &[usize],
    free: &[u8],
    fixed: &dyn Fn(usize) -> Option<u8>,
    load: &mut dyn FnMut(&mut Assembler, &EpInst, u8),
    consts: &mut ConstPool,
) -> Result<u8, String> {
    let mut load_copy = |ops: &mut Assembler, _: usize, inst: &EpInst, d: u8| load(ops, inst, d);
    let res = emit_insts_interleaved(isa, ops, p, last, &[free], fixed, &mut load_copy, consts)?;
    Ok(res[0])
}

/// [`emit_insts`] for several copies of `p` (an unrolled loop's vectors), copy `c` in registers `frees[c]` (each
/// copy's its own) and loading through `load(ops, c, ..)`; returns each copy's result register. The copies are
/// emitted instruction by instruction across them (the first instruction of every copy, then the second, ...)
/// rather than copy after copy: a transcendental is a chain of ~20-45 dependent operations, and emitted one copy
/// at a time the core's schedulers fill with one copy's chain, each operation waiting on the last, before the next
/// copy's independent work reaches them. Each copy computes exactly what it did alone (the same operations in the
/// same order on its own registers), so results are the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_insts_interleaved(
    isa: &dyn VecIsa,
    ops: &mut Assembler,
    p: &EpProgram,
    last: &[usize],
    frees: &[&[u8]],
    fixed: &dyn Fn(usize) -> Option<u8>,
    load: &mut dyn FnMut(&mut Assembler, usize, &EpInst, u8),
    consts: &mut ConstPool,
) -> Result<Vec<u8>, String> {
    let mut pools: Vec<Vec<u8>> = frees.iter().map(|f| f.iter().rev().copied().collect()).collect();
    let mut regs = vec![vec![0u8; p.insts.len()]; frees.len()];
    for (i, inst) in p.insts.iter().enumerate() {
        if let Some(r) = fixed(i) {
            for reg in &mut regs {
                reg[i] = r;
            }
            continue;
        }
        for (c, (pool, reg)) in pools.iter_mut().zip(regs.iter_mut()).enumerate() {
            let late = releases_late(inst);
            let d = if late { pool.pop().ok_or("epilogue ran out of registers")? } else { 0 };
            for s in sources(inst) {
                if last[s] == i && fixed(s).is_none() {
                    pool.push(reg[s]);
                }
            }
            let d = if late { d } else { pool.pop().ok_or("epilogue ran out of registers")? };
            reg[i] = d;
            match *inst {
                EpInst::Acc => return Err("an accumulator without a register".into()),
                EpInst::Mat { .. }
                | EpInst::Row { .. }
                | EpInst::Col { .. }
                | EpInst::Uniform(_)
                | EpInst::Position(_) => load(ops, c, inst, d),
                EpInst::Bin(op, a, b) => isa.bin(ops, op, d, reg[a], reg[b]),
                EpInst::Const(k) => {
                    let at = consts.get(ops, k);
                    isa.konst(ops, d, at);
                }
                EpInst::BinK(op, a, k) => {
                    let at = consts.get(ops, k);
                    isa.bin_const(ops, op, d, reg[a], at);
                }
                EpInst::FmaK(a, b, k) => {
                    // `d = d * s + k`; the product's operands commute (one rounding either way).
                    let (x, y, at) = (reg[a], reg[b], consts.get(ops, k));
                    if d == x {
                        isa.fma_const(ops, d, y, at);
                    } else if d == y {
                        isa.fma_const(ops, d, x, at);
                    } else {
                        isa.mov(ops, d, x);
                        isa.fma_const(ops, d, y, at);
                    }
                }
                EpInst::MaxK(a, k) | EpInst::MinK(a, k) => {
                    // x86 max/min return their second operand when either is NaN and when neither is greater
                    // (less): with `k` first that is `a < k ? k : a` (`k < a ? k : a`), NaN in `a` kept. `d` is not
                    // `a`'s register (`releases_late`).
                    let at = consts.get(ops, k);
                    isa.max_min_const(ops, matches!(inst, EpInst::MaxK(..)), d, reg[a], at);
                }
                EpInst::Shl(a, n) => isa.shift(ops, Shift::Left, d, reg[a], n),
                EpInst::Sar(a, n) => isa.shift(ops, Shift::RightArith, d, reg[a], n),
                EpInst::Shr(a, n) => isa.shift(ops, Shift::RightLogical, d, reg[a], n),
                EpInst::Cmp(pr, a, b) => isa.cmp(ops, d, reg[a], reg[b], pr),
                EpInst::ICmpEq(a, b) => isa.icmp_eq(ops, d, reg[a], reg[b]),
                EpInst::Select { mask, t, f } => isa.select(ops, d, reg[mask], reg[t], reg[f]),
                EpInst::Sqrt(a) => isa.sqrt(ops, d, reg[a]),
                EpInst::Scalef(a, b) => isa.scalef(ops, d, reg[a], reg[b])?,
                EpInst::RoundNearest(a) => isa.round_nearest(ops, d, reg[a]),
            }
            if last[i] == usize::MAX {
                pool.push(d);
            }
        }
    }
    Ok(regs.iter().map(|reg| reg[p.result]).collect())
}

/// One constant of a [`ConstPool`]: its 16 lanes (a splat for [`ConstPool::get`]), label, first 32-byte slot and
/// how many slots it takes (1 for a splat, 2 for a lane constant).
struct PoolEntry {
    lanes: [u32; 16],
    label: DynamicLabel,
    slot: usize,
    width: usize,
}

/// The constants a program reads from memory (`EpInst::Const`, `BinK`, ...): each a 32-byte vector of one value (and
/// the 64-byte lane constants of `EpInst::Position`), placed after the code that reads it (`emit`, once that code's
/// `ret` is written). 8-lane code addresses them relative to the instruction pointer; 16-lane code broadcasts a slot's
/// first lane from a base register loaded with the pool's address (`base`). Either way the code stays position
/// independent (what the kernel cache stores).
#[derive(Default)]
pub(crate) struct ConstPool {
    entries: Vec<PoolEntry>,
    /// Slots taken: one per splat (32 bytes: 16-lane code broadcasts its first lane), two per lane constant.
    slots: usize,
    base: Option<DynamicLabel>,
}

impl ConstPool {
    /// Constant `k` in every lane (added on first use).
    pub(crate) fn get(&mut self, ops: &mut Assembler, k: u32) -> ConstRef {
        self.entry(ops, [k; 16], false)
    }

    /// A vector of 16 lanes, each its own value (64 bytes; 8-lane code reads the first 8): what
    /// [`VecIsa::positions`] adds.
    pub(crate) fn lanes(&mut self, ops: &mut Assembler, lanes: [u32; 16]) -> ConstRef {
        self.entry(ops, lanes, true)
    }

    fn entry(&mut self, ops: &mut Assembler, lanes: [u32; 16], wide: bool) -> ConstRef {
        let width = if wide { 2 } else { 1 };
        // A splat may reuse a lane constant whose lanes are all its value; a lane constant needs all 16 written.
        let found = self.entries.iter().find(|e| e.lanes == lanes && e.width >= width);
        if let Some(e) = found {
            return ConstRef { label: e.label, slot: e.slot };
        }
        let (label, slot) = (ops.new_dynamic_label(), self.slots);
        self.entries.push(PoolEntry { lanes, label, slot, width });
        self.slots += width;
        ConstRef { label, slot }
    }

    /// The label of the pool's first slot.
    pub(crate) fn base(&mut self, ops: &mut Assembler) -> DynamicLabel {
        *self.base.get_or_insert_with(|| ops.new_dynamic_label())
    }

    /// Writes the constants (32-byte aligned) at the current position, which must not be executed.
    pub(crate) fn emit(self, ops: &mut Assembler) {
        if self.entries.is_empty() && self.base.is_none() {
            return;
        }
        dynasm!(ops ; .arch x64 ; .align 32);
        if let Some(b) = self.base {
            dynasm!(ops ; .arch x64 ; =>b);
        }
        for e in &self.entries {
            let label = e.label;
            dynasm!(ops ; .arch x64 ; =>label);
            for &k in &e.lanes[..8 * e.width] {
                dynasm!(ops ; .arch x64 ; .u32 k);
            }
        }
    }
}

/// `d = x <pred> y`. dynasm 5.1 encodes `vcmpps d, x, y, imm` with x and y swapped (checked with objdump; the
/// test below pins the bytes), so the operands are written reversed here.
fn cmp(ops: &mut Assembler, d: u8, x: u8, y: u8, p: i8) {
    dynasm!(ops ; .arch x64 ; vcmpps Ry(d), Ry(y), Ry(x), p);
}

#[cfg(test)]
mod tests {
    use super::super::program::pred;
    use super::*;

    /// Encodings the generator relies on, from `objdump -M intel` of an independent assembler's output.
    #[test]
    fn encodings_match_the_intended_instructions() {
        let mut ops = Assembler::new().unwrap();
        cmp(&mut ops, 5, 6, 7, pred::LE_OQ); // vcmple_oqps ymm5, ymm6, ymm7
        dynasm!(ops ; .arch x64
            ; vblendvps Ry(1), Ry(2), Ry(3), Ry(4)     // ymm1 = ymm4 ? ymm3 : ymm2
            ; vpbroadcastd Ry(3), DWORD [r9 + 4]       // all 8 lanes (vbroadcastss would encode 4)
            ; vmaskmovps Ry(1), Ry(2), [rdx + 8]
        );
        let code = ops.finalize().unwrap();
        let want: &[u8] = &[
            0xc4, 0xe1, 0x4c, 0xc2, 0xef, 0x12, //
            0xc4, 0xe3, 0x6d, 0x4a, 0xcb, 0x40, //
            0xc4, 0xc2, 0x7d, 0x58, 0x59, 0x04, //
            0xc4, 0xe2, 0x6d, 0x2c, 0x4a, 0x08,
        ];
        assert_eq!(&code[..], want);
    }
}
