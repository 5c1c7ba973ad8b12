//! The register program: what a GEMM epilogue or a generated elementwise, row or column kernel computes per vector,
//! as SSA instructions over vector registers (`EpInst`, `EpProgram`). `epilogue.rs` translates kernel IR into it,
//! `program_math.rs` expands `exp`, `tanh` and `log` into it, and `program_asm.rs` emits it at 8 or 16 lanes.

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
pub(crate) fn releases_late(inst: &EpInst) -> bool {
    matches!(inst, EpInst::MaxK(..) | EpInst::MinK(..))
}

/// The distinct values `inst` reads (`x * x` reads one: its register is released once).
pub(crate) fn sources(inst: &EpInst) -> Vec<usize> {
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
