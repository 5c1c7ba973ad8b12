//! x86-64 AVX2 + FMA GEMM micro-kernels, generated at run time.
//!
//! Why generate machine code: Cranelift 0.135 emits only 128-bit SIMD on x86-64, half the FMA width of an AVX2 core,
//! so no Cranelift GEMM can pass ~50% of peak. `dynasmrt` assembles straight from Rust with run-time register
//! numbers and displacements (a tile shape, a stride and an epilogue are just arguments), needs no toolchain at run
//! time, and maps the code W^X. A generated 6x16 kernel reaches the measured 2-core FMA peak of the development
//! machine, which is what made generating code (rather than a better Cranelift kernel) worth it.
//!
//! This is the 8-lane family; `asm512` generates the 16-lane AVX-512 one with the same contract, and the tuner
//! races both where the CPU has AVX-512 (on a core that splits 512-bit FMAs in two halves, as AMD Zen 4 does, AVX2
//! often keeps winning; on one with two full 512-bit FMA units, AVX-512 does). The AVX2 family is the one every
//! x86-64 host kiln generates code for has.
//!
//! One kernel computes an `mr x (8 * nv)` tile of C = A * B over `k` steps:
//! `extern "sysv64" fn(a, b, c, k, ep)`. A is read by broadcasts at `a + k*a_ks + r*a_rs` (any layout: packed
//! panels or the caller's matrix), B by 8-lane loads at `b + k*b_ks + 32*v`. Then, by `Mode`, C is stored,
//! accumulated into, and/or finished by the epilogue program, applied in registers before the store. The last
//! vector of a row may be masked (`vmaskmovps`) for a ragged N; B is never read past a panel's zero padding.
//!
//! Registers: accumulators are ymm0.. (mr*nv of them), then nv B registers (a 1-row kernel uses memory-operand FMAs
//! instead), then one broadcast register; the epilogue allocates its temporaries from whatever the accumulators
//! leave free. Scratch GPRs are rax, r9, r10, r11 (caller-saved in SysV, which is pinned: Win64 would need
//! xmm6-15 saved); in the K loop r9, r10 and r11 walk the prefetch of the C tile and the epilogue's operands (`k_loop`). Every kernel ends with
//! `vzeroupper` (the host Rust is SSE code). Constants an epilogue reads (`exp`'s polynomial) sit after the kernel's
//! `ret` as 32-byte vectors, addressed relative to the instruction pointer (`ConstPool`), so the code stays position
//! independent.
//!
//! Pitfall (dynasm 5.1): `vbroadcastss ymm, [mem]` silently encodes the 128-bit form; `vpbroadcastd` is used.

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use crate::cpu::isa::Isa;
use dynasmrt::x64::Assembler;
use dynasmrt::{AssemblyOffset, DynamicLabel, DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};

/// The generator's revision, part of every cached kernel set's key (`kernel_set` in `mod.rs`): bump it when a change
/// here alters the code emitted for an unchanged spec and program, so that code cached on disk by an earlier build
/// of the same kiln version is not mapped in place of the new code (the key's other parts, the specs and the
/// program, would not change). 2: a value read twice by one instruction is released once (a kernel cached before
/// that fix could compute a wrong epilogue); constants in a pool after the code. 3: the bf16 kernels (`amx`) load
/// each tile just before its first product. 4: the K loop prefetches the epilogue's per-element operands.
pub const REVISION: u32 = 4;

/// `a, b, c, k, ep`: see the module doc. `ep` points at `[mask, uniforms, operand 0, operand 1, ...]`.
pub type MicroFn = unsafe extern "sysv64" fn(*const f32, *const f32, *mut f32, usize, *const *const u8);

/// What a kernel does with the finished accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// First K block of several: store.
    First,
    /// A middle K block: C += acc.
    Middle,
    /// The last K block: C + acc, then the epilogue, then store.
    Last,
    /// The only K block: the epilogue, then store.
    Single,
}

/// Two-operand vector ops of the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VBin {
    Add,
    Sub,
    Mul,
    Div,
    And,
    Or,
    Xor,
    /// 32-bit integer lanes (exponent arithmetic on float bit patterns).
    IAdd,
    ISub,
    /// `vmaxps` as the hardware does it: the second operand where either is NaN (row-kernel max folds track NaN
    /// apart, `cpu::wide::rows`; the epilogue never emits it).
    MaxRaw,
}

/// `vcmpps` predicates (ordered, quiet, so NaN compares false, except `NeqUq`).
pub mod pred {
    pub const EQ_OQ: i8 = 0x00;
    pub const UNORD_Q: i8 = 0x03;
    pub const LT_OQ: i8 = 0x11;
    pub const LE_OQ: i8 = 0x12;
    pub const NEQ_UQ: i8 = 0x04;
    /// Not less than, or unordered: `x >= y` or either is NaN.
    pub const NLT_UQ: i8 = 0x15;
}

/// One instruction of an epilogue program: SSA, operands are earlier instruction indices. Loads address the
/// element (row r, vector v) of the tile being finished.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EpInst {
    /// The accumulator (after adding C in `Mode::Last`).
    Acc,
    /// An M x N operand: `op + r*ld + vector bytes*v` (pointer at the tile origin; `ld` in bytes). `bf16`: 2-byte
    /// elements widened to f32 (16 lanes only: `epilogue::Allow::bf16_loads`), half a vector's bytes per vector.
    Mat {
        op: usize,
        ld: i32,
        bf16: bool,
    },
    /// An N-vector (a bias over columns): `op + vector bytes*v` (halved for bf16).
    Row {
        op: usize,
        bf16: bool,
    },
    /// An M-vector, broadcast: `op + r*stride` (`stride` in bytes).
    Col {
        op: usize,
        stride: i32,
        bf16: bool,
    },
    /// A value uniform over the tile, computed on the host per launch: 8 splatted lanes at `uniforms + 32*slot`.
    Uniform(usize),
    Bin(VBin, usize, usize),
    /// `vcmpps` with a predicate from [`pred`]: an all-ones/zero lane mask.
    Cmp(i8, usize, usize),
    /// 32-bit integer lanes equal (`vpcmpeqd`): an all-ones/zero lane mask.
    ICmpEq(usize, usize),
    /// Each lane's column (i32) plus a constant: `n + offset` for the vector being computed. Emitted by the
    /// caller's `load`, which knows which columns that vector holds (only the row kernels emit it).
    Position(i32),
    /// `mask ? t : f`.
    Select {
        mask: usize,
        t: usize,
        f: usize,
    },
    Sqrt(usize),
    /// `a * 2^floor(b)`, rounded once (`vscalefps`, so an underflow to a subnormal rounds as one multiply would):
    /// 16 lanes only, emitted where the translation was told the program runs there (`epilogue::Allow::scalef`).
    Scalef(usize, usize),
    /// `a` rounded to an integral value, ties to even (`vroundps` / `vrndscaleps`).
    RoundNearest(usize),
    /// A constant (f32 bit pattern, or an integer for the integer ops) in every lane, from the code's constant pool.
    Const(u32),
    /// `a op k` for a constant `k` (read from the constant pool as a memory operand).
    BinK(VBin, usize, u32),
    /// `a * b + k` with one rounding (`vfmadd`).
    FmaK(usize, usize, u32),
    /// `a < k ? k : a` and `k < a ? k : a`: a bound that keeps NaN (one `vmaxps` / `vminps` with `k` first).
    MaxK(usize, u32),
    MinK(usize, u32),
    /// 32-bit lanes shifted left, right arithmetically, or right logically, by an immediate.
    Shl(usize, u8),
    Sar(usize, u8),
    Shr(usize, u8),
}

/// An epilogue: instructions and the one stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct EpProgram {
    pub insts: Vec<EpInst>,
    pub result: usize,
}

impl EpProgram {
    /// The identity epilogue (store the accumulator).
    pub fn identity() -> EpProgram {
        EpProgram { insts: vec![EpInst::Acc], result: 0 }
    }

    /// Registers needed on top of the accumulators (so a caller can reject a program before generating).
    pub fn temps_needed(&self) -> usize {
        self.temps_needed_besides(&|i| matches!(self.insts[i], EpInst::Acc))
    }

    /// Registers `emit_insts` takes from its free list when the values `fixed` marks are in registers already.
    pub fn temps_needed_besides(&self, fixed: &dyn Fn(usize) -> bool) -> usize {
        let last = self.last_uses();
        let mut live = 0usize;
        let mut peak = 0usize;
        for (i, inst) in self.insts.iter().enumerate() {
            if fixed(i) {
                continue;
            }
            let late = releases_late(inst);
            if late {
                live += 1;
                peak = peak.max(live);
            }
            for s in sources(inst) {
                if last[s] == i && !fixed(s) {
                    live -= 1;
                }
            }
            if !late {
                live += 1;
                peak = peak.max(live);
            }
            if last[i] == usize::MAX {
                // Dead value: freed at once.
                live -= 1;
            }
        }
        peak
    }

    /// For each instruction, the index of its last reader (`insts.len()` for the result, `usize::MAX` if dead).
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last = vec![usize::MAX; self.insts.len()];
        for (i, inst) in self.insts.iter().enumerate() {
            for s in sources(inst) {
                last[s] = i;
            }
        }
        if self.result < last.len() {
            last[self.result] = self.insts.len();
        }
        last
    }
}

/// Whether `inst` needs its destination register apart from its operands' (it writes the destination before it
/// has read them all), so the operands are released only after the destination is taken.
fn releases_late(inst: &EpInst) -> bool {
    matches!(inst, EpInst::MaxK(..) | EpInst::MinK(..))
}

/// The distinct values `inst` reads (`x * x` reads one: its register is released once).
fn sources(inst: &EpInst) -> Vec<usize> {
    let mut v = match *inst {
        EpInst::Bin(_, a, b)
        | EpInst::Cmp(_, a, b)
        | EpInst::ICmpEq(a, b)
        | EpInst::FmaK(a, b, _)
        | EpInst::Scalef(a, b) => vec![a, b],
        EpInst::Select { mask, t, f } => vec![mask, t, f],
        EpInst::Sqrt(a)
        | EpInst::RoundNearest(a)
        | EpInst::BinK(_, a, _)
        | EpInst::Shl(a, _)
        | EpInst::Sar(a, _)
        | EpInst::Shr(a, _) => vec![a],
        EpInst::MaxK(a, _) | EpInst::MinK(a, _) => vec![a],
        _ => vec![],
    };
    v.sort_unstable();
    v.dedup();
    v
}

/// The shape and addressing of one micro-kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MicroSpec {
    /// The family the kernel is written for: this file's AVX2 kernels or `asm512`'s AVX-512 ones.
    pub isa: Isa,
    pub mr: usize,
    pub nv: usize,
    /// Byte strides of A along k and along rows.
    pub a_ks: i32,
    pub a_rs: i32,
    /// Byte stride of B along k (its vectors are contiguous).
    pub b_ks: i32,
    /// Byte stride of C rows.
    pub ldc: i32,
    pub mode: Mode,
    /// The last vector of each row is masked (ragged N): the mask is `ep[0]`.
    pub masked: bool,
    /// K-loop unroll (a power of two).
    pub unroll: usize,
    /// Prefetch B this many k-steps ahead (0: none). For B read in place from memory (skinny GEMMs), where a tile
    /// sweep interleaves many rows and the hardware prefetchers lose track.
    pub prefetch: i32,
}

/// Accumulator register of tile element (r, v).
fn acc(nv: usize, r: usize, v: usize) -> u8 {
    (r * nv + v) as u8
}

/// Emits one kernel at the assembler's current offset and returns that offset.
pub fn emit(ops: &mut Assembler, s: &MicroSpec, ep: &EpProgram) -> Result<AssemblyOffset, String> {
    if s.isa != Isa::Avx2 || !super::config::fits(Isa::Avx2, s.mr, s.nv) || !s.unroll.is_power_of_two() {
        return Err(format!("tile {}x{} (unroll {}) does not fit 16 registers", s.mr, 8 * s.nv, s.unroll));
    }
    let with_ep = matches!(s.mode, Mode::Last | Mode::Single);
    let epi = if with_ep { ep.clone() } else { EpProgram::identity() };
    let nacc = s.mr * s.nv;
    let free_regs: Vec<u8> = (nacc as u8..16).filter(|&r| !(s.masked && r == 15)).collect();
    if epi.temps_needed() > free_regs.len() {
        return Err(format!("epilogue needs {} registers, {} free", epi.temps_needed(), free_regs.len()));
    }
    let start = ops.offset();
    let b0 = nacc as u8;
    let areg = 15u8;
    let (mr, nv) = (s.mr, s.nv);
    // Prologue: zero the accumulators (the K loop prefetches the C tile, see `k_loop`).
    for i in 0..nacc as u8 {
        dynasm!(ops ; .arch x64 ; vxorps Ry(i), Ry(i), Ry(i));
    }
    let step = |ops: &mut Assembler, u: usize| {
        let bk = u as i32 * s.b_ks;
        let ak = u as i32 * s.a_ks;
        if s.prefetch > 0 {
            for line in 0..(nv * 32).div_ceil(64) {
                let d = bk + s.prefetch * s.b_ks + 64 * line as i32;
                dynasm!(ops ; .arch x64 ; prefetcht0 [rsi + d]);
            }
        }
        if mr == 1 {
            dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(areg), DWORD [rdi + ak]);
            for v in 0..nv {
                let d = bk + 32 * v as i32;
                let a = acc(nv, 0, v);
                dynasm!(ops ; .arch x64 ; vfmadd231ps Ry(a), Ry(areg), [rsi + d]);
            }
            return;
        }
        for v in 0..nv {
            let d = bk + 32 * v as i32;
            let br = b0 + v as u8;
            dynasm!(ops ; .arch x64 ; vmovups Ry(br), [rsi + d]);
        }
        for r in 0..mr {
            let d = ak + r as i32 * s.a_rs;
            dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(areg), DWORD [rdi + d]);
            for v in 0..nv {
                let a = acc(nv, r, v);
                let br = b0 + v as u8;
                dynasm!(ops ; .arch x64 ; vfmadd231ps Ry(a), Ry(br), Ry(areg));
            }
        }
    };
    k_loop(ops, s, &epi, &step);
    // Finish: mask, C, epilogue, store.
    let mreg = 15u8;
    if s.masked {
        dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8] ; vmovups Ry(mreg), [r9]);
    }
    let load_c = matches!(s.mode, Mode::Middle | Mode::Last);
    let last_uses = epi.last_uses();
    let mut consts = ConstPool::default();
    for r in 0..mr {
        for v in 0..nv {
            let a = acc(nv, r, v);
            let cd = r as i32 * s.ldc + 32 * v as i32;
            let masked = s.masked && v == nv - 1;
            if load_c {
                let t = free_regs[0];
                if masked {
                    dynasm!(ops ; .arch x64 ; vmaskmovps Ry(t), Ry(mreg), [rdx + cd] ; vaddps Ry(a), Ry(a), Ry(t));
                } else {
                    dynasm!(ops ; .arch x64 ; vaddps Ry(a), Ry(a), [rdx + cd]);
                }
            }
            let res = emit_program(&Ymm, ops, &epi, &last_uses, &free_regs, (a, r, v), masked, &mut consts)?;
            if res != a {
                dynasm!(ops ; .arch x64 ; vmovaps Ry(a), Ry(res));
            }
            if masked {
                dynasm!(ops ; .arch x64 ; vmaskmovps [rdx + cd], Ry(mreg), Ry(a));
            } else {
                dynasm!(ops ; .arch x64 ; vmovups [rdx + cd], Ry(a));
            }
        }
    }
    dynasm!(ops ; .arch x64 ; vzeroupper ; ret);
    consts.emit(ops);
    Ok(start)
}

/// The K loop every micro-kernel runs (either family): `step(ops, u)` emits k-step `u` of an unrolled iteration,
/// addressing A and B at `u` steps past rdi and rsi; the loop runs `k / unroll` such iterations (rcx = k), then the
/// remainder one step at a time. Uses rax, r9, and r10 and r11 for the C tile's prefetch.
///
/// The C tile (rdx, stored or accumulated into after the loop) is prefetched one row per iteration, its rows in
/// turn (r11 walks them, r10 marks the end, then r11 starts over: rows already in L1 cost a prefetch that hits).
/// So is the same row of each f32 operand the epilogue `ep` reads per element with C's row stride (a training
/// step's saved activations, which the GELU's gradient reads two of): its tile is at the same offset from its
/// pointer in the epilogue table as C's row from rdx, so r9 = that pointer + (r11 - rdx). Those operands, like C,
/// were written long before and have left the caches; read only by the epilogue, after the loop, each line was a
/// miss the tile waited for.
/// Why spread: a 14 x 32 tile is 28 lines, more than the core's line fill buffers (16 on the Xeon guest). All 28
/// prefetched at the kernel's start measured slower than no prefetch at all with C in cache, and a GEMM writing a C
/// that had left the caches (a training step's outputs) ran ~15 % slower than with C in cache at K = 128; spread,
/// both are faster (`KILN_PROFILE=1 train_gpt`: its K = 128 products 15-25 % a launch).
pub(crate) fn k_loop(ops: &mut Assembler, s: &MicroSpec, ep: &EpProgram, step: &dyn Fn(&mut Assembler, usize)) {
    let u = s.unroll;
    let (main, main_end, rem, done) =
        (ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label(), ops.new_dynamic_label());
    let (a_adv, b_adv) = (u as i32 * s.a_ks, u as i32 * s.b_ks);
    let shift = u.trailing_zeros() as i8;
    let (tile_end, ldc) = (s.mr as i32 * s.ldc, s.ldc);
    // A row of the tile: `nv` vectors of 32 or 64 bytes.
    let row_lines = (s.nv * s.isa.lanes() * 4).div_ceil(64) as i32;
    // Table slots of the f32 per-element operands laid out as C (once each).
    let mut operands: Vec<i32> = Vec::new();
    for inst in &ep.insts {
        if let EpInst::Mat { op, ld, bf16: false } = *inst {
            let slot = 8 * (2 + op as i32);
            if ld == ldc && !operands.contains(&slot) {
                operands.push(slot);
            }
        }
    }
    let prefetch_c_row = |ops: &mut Assembler| {
        for line in 0..row_lines {
            dynasm!(ops ; .arch x64 ; prefetcht0 [r11 + 64 * line]);
        }
        for &slot in &operands {
            dynasm!(ops ; .arch x64 ; mov r9, QWORD [r8 + slot] ; add r9, r11 ; sub r9, rdx);
            for line in 0..row_lines {
                dynasm!(ops ; .arch x64 ; prefetcht0 [r9 + 64 * line]);
            }
        }
        dynasm!(ops ; .arch x64 ; add r11, ldc ; cmp r11, r10 ; cmovae r11, rdx);
    };
    dynasm!(ops ; .arch x64
        ; mov r11, rdx
        ; lea r10, [rdx + tile_end]
        ; mov rax, rcx
        ; shr rax, shift
        ; test rax, rax
        ; jz =>main_end
        ; =>main
    );
    prefetch_c_row(ops);
    for i in 0..u {
        step(ops, i);
    }
    dynasm!(ops ; .arch x64
        ; add rdi, a_adv
        ; add rsi, b_adv
        ; dec rax
        ; jnz =>main
        ; =>main_end
        ; mov rax, rcx
        ; and rax, (u as i32) - 1
        ; jz =>done
        ; =>rem
    );
    prefetch_c_row(ops);
    step(ops, 0);
    let (a1, b1) = (s.a_ks, s.b_ks);
    dynasm!(ops ; .arch x64
        ; add rdi, a1
        ; add rsi, b1
        ; dec rax
        ; jnz =>rem
        ; =>done
    );
}

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

/// A finalized set of kernels (one mapping) and their entry points.
#[derive(Clone)]
pub struct KernelSet {
    /// Keeps the code mapped for as long as the entry points are used (shared when several sets were mapped
    /// together, see [`KernelSet::map_artifacts`]).
    _code: std::sync::Arc<ExecutableBuffer>,
    pub fns: Vec<MicroFn>,
    /// The code bytes, position independent (relative jumps, register and RIP-relative addressing within the
    /// bytes): what a cache stores.
    pub bytes: Vec<u8>,
    offsets: Vec<usize>,
}

/// Magic of a serialized kernel set (`to_artifact`): format version 1.
const ARTIFACT_MAGIC: &[u8; 8] = b"KGEMMv1\n";

impl KernelSet {
    /// Assembles every spec (all sharing `ep`) into one mapping.
    pub fn build(specs: &[MicroSpec], ep: &EpProgram) -> Result<KernelSet, String> {
        Self::assemble(specs.len(), |ops, i| match specs[i].isa {
            Isa::Avx2 => emit(ops, &specs[i], ep),
            Isa::Avx512 => super::asm512::emit(ops, &specs[i], ep),
        })
    }

    /// Assembles `count` kernels, kernel `i` emitted by `emit(ops, i)` (returning its entry), into one mapping.
    pub fn assemble(
        count: usize,
        mut emit: impl FnMut(&mut Assembler, usize) -> Result<AssemblyOffset, String>,
    ) -> Result<KernelSet, String> {
        let mut ops = Assembler::new().map_err(|e| e.to_string())?;
        let mut offsets = Vec::with_capacity(count);
        for i in 0..count {
            offsets.push(emit(&mut ops, i)?.0);
        }
        let code = ops.finalize().map_err(|_| "finalizing the GEMM kernels failed".to_string())?;
        crate::cpu::code::MAPPINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = code.to_vec();
        Ok(Self::from_code(std::sync::Arc::new(code), 0, bytes, offsets))
    }

    /// The set whose code starts at byte `base` of `code`.
    fn from_code(
        code: std::sync::Arc<ExecutableBuffer>,
        base: usize,
        bytes: Vec<u8>,
        offsets: Vec<usize>,
    ) -> KernelSet {
        let fns = offsets
            .iter()
            .map(|&o| {
                // SAFETY: `base + o` is the start of a function emitted with `MicroFn`'s sysv64 signature (by `build`,
                // or by a `build` whose bytes `parse_artifact` validated, copied to `base`), and `code` (kept in the
                // returned set) keeps it mapped executable.
                unsafe { std::mem::transmute::<*const u8, MicroFn>(code.ptr(AssemblyOffset(base + o))) }
            })
            .collect();
        KernelSet { _code: code, fns, bytes, offsets }
    }

    /// The set as bytes for a cache: magic, kernel count, offsets, code.
    pub fn to_artifact(&self) -> Vec<u8> {
        let mut out = ARTIFACT_MAGIC.to_vec();
        out.extend((self.offsets.len() as u32).to_le_bytes());
        for &o in &self.offsets {
            out.extend((o as u32).to_le_bytes());
        }
        out.extend(&self.bytes);
        out
    }

    /// Maps a cached set back (no code generation). The cache entry was checksummed and keyed by the exact specs,
    /// program, kiln version and CPU fingerprint; this checks only its framing (`expected` kernels, offsets inside
    /// the code).
    pub fn from_artifact(a: &[u8], expected: usize) -> Result<KernelSet, String> {
        let (offsets, code_bytes) = parse_artifact(a)?;
        if offsets.len() != expected {
            return Err("malformed GEMM code artifact".into());
        }
        let (code, _) = crate::cpu::code::map_together(&[code_bytes])?;
        Ok(Self::from_code(std::sync::Arc::new(code), 0, code_bytes.to_vec(), offsets))
    }

    /// Maps several cached sets into one executable mapping (one `mmap` and `mprotect` for all: see the CPU
    /// backend's `code` module). A malformed artifact is left out, not an error.
    pub fn map_artifacts(artifacts: &[&[u8]]) -> Result<Vec<Option<KernelSet>>, String> {
        let parsed: Vec<Option<(Vec<usize>, &[u8])>> = artifacts.iter().map(|a| parse_artifact(a).ok()).collect();
        let blobs: Vec<&[u8]> = parsed.iter().flatten().map(|(_, code)| *code).collect();
        let (code, bases) = crate::cpu::code::map_together(&blobs)?;
        let code = std::sync::Arc::new(code);
        let mut bases = bases.into_iter();
        Ok(parsed
            .into_iter()
            .map(|p| {
                let (offsets, bytes) = p?;
                let base = bases.next()?;
                Some(Self::from_code(code.clone(), base, bytes.to_vec(), offsets))
            })
            .collect())
    }
}

/// The framing of a kernel-set artifact: magic, kernel count, offsets (inside the code), code.
fn parse_artifact(a: &[u8]) -> Result<(Vec<usize>, &[u8]), String> {
    let bad = || "malformed GEMM code artifact".to_string();
    let rest = a.strip_prefix(&ARTIFACT_MAGIC[..]).ok_or_else(bad)?;
    let word =
        |i: usize| -> Option<usize> { Some(u32::from_le_bytes(rest.get(4 * i..4 * i + 4)?.try_into().ok()?) as usize) };
    let n = word(0).ok_or_else(bad)?;
    let offsets: Vec<usize> = (1..=n).map(word).collect::<Option<_>>().ok_or_else(bad)?;
    let code_bytes = rest.get(4 * (n + 1)..).ok_or_else(bad)?;
    if code_bytes.is_empty() || offsets.iter().any(|&o| o >= code_bytes.len()) {
        return Err(bad());
    }
    Ok((offsets, code_bytes))
}

/// Whether this host can run the generated kernels.
pub fn host_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `d = x <pred> y`. dynasm 5.1 encodes `vcmpps d, x, y, imm` with x and y swapped (checked with objdump; the
/// test below pins the bytes), so the operands are written reversed here.
fn cmp(ops: &mut Assembler, d: u8, x: u8, y: u8, p: i8) {
    dynasm!(ops ; .arch x64 ; vcmpps Ry(d), Ry(y), Ry(x), p);
}

#[cfg(test)]
mod tests {
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
