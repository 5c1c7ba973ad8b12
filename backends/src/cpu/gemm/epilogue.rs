//! A GEMM kernel's epilogue (its outer code in the kernel IR) translated into a register program for the
//! generated micro-kernels: loads of M x N, per-column and per-row operands become vector loads at the tile, f32
//! literals are read from the code's constant pool where they are used (`Literals`), other values uniform over the
//! launch (a learning rate read from a buffer and cast) are computed on the host per launch and splatted, and the
//! arithmetic becomes AVX ops.
//!
//! What translates: f32 `+ - * /`, `sqrt`, `neg`, `abs`, `recip`, comparisons (`< <= == !=`, NaN semantics of the
//! spec), `where`, bool `and`/`or`/`not`, and f32 `exp`, `tanh` and `log` (so sigmoid, silu, gelu, softplus and
//! softmax's exponent), which expand into the Cranelift kernels' own sequences (`program_math.rs`), and i32 `==`/`!=`
//! of 32-bit int loads and, where the caller allows it, positions along n (`arange(C) == target`). Anything else
//! (sin/cos, max/min with their NaN rule, int arithmetic, a gather) returns `None`, and the backend applies the
//! epilogue as a separate compiled pass over C instead: slower, never wrong. `translate_row_outer` does the same
//! for a row sum's outer code (`cpu/wide/`). A bf16 GEMM's epilogue (`translate_with`) may also compute in bf16:
//! each bf16 result is rounded in the program, with integer ops, exactly as the Cranelift kernels round it; and
//! 16-lane callers may read bf16 operands (`Allow::bf16_loads`).

use super::program::{EpInst, EpProgram, VBin, pred};
use super::program_math::{f32_bits, push_exp, push_inst, push_log, push_round_bf16, push_tanh};
use kiln_jit::DType;
use kiln_jit::dtype::Scalar;
use kiln_jit::kernel::Inst;
use kiln_jit::kernel::gemm::Role;
use kiln_jit::kernel::{InstOp, KernelIr};
use kiln_jit::op::{BinaryOp, UnaryOp};

/// Where an epilogue operand's tile pointer comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OperandKind {
    Mat { ld: i64 },
    Row,
    Col { stride: i64 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EpOperand {
    pub buf: usize,
    pub offset: i64,
    pub batch: Vec<i64>,
    pub kind: OperandKind,
    /// bf16 elements (2 bytes, widened to f32 by the load; only where `Allow::bf16_loads`), else 32-bit ones.
    pub bf16: bool,
}

impl EpOperand {
    /// Bytes per element.
    pub fn elem_bytes(&self) -> usize {
        if self.bf16 { 2 } else { 4 }
    }
}

#[derive(Clone, Debug)]
pub struct Epilogue {
    pub program: EpProgram,
    pub operands: Vec<EpOperand>,
    /// Per uniform slot, the outer instruction it holds (evaluated on the host per launch). Fixed bit patterns
    /// (sign masks, `not`'s all-ones) are constants of the program instead (`EpInst::BinK`).
    pub uniforms: Vec<usize>,
    /// Which outer instructions are uniform (the host evaluates these).
    pub uniform_insts: Vec<bool>,
}

/// Most operands a program may read (their pointers travel in a small per-tile table).
pub const MAX_OPERANDS: usize = 6;

/// What a translation may use beyond f32 (see [`translate_with`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Allow {
    /// Values of dtype bf16 (a bf16 GEMM's epilogue after the rounding of its product): each kept in a register as
    /// its exact f32 value, each bf16 result of arithmetic rounded to bf16 in the program
    /// (`program_math::push_round_bf16`, the Cranelift kernels' integer rounding), so the program's result is
    /// exactly the value the store writes.
    pub bf16: bool,
    /// Loads of bf16 operands (with `bf16`; `EpInst::Mat`/`Row`/`Col` with `bf16` set): only a caller whose loads
    /// widen 2-byte elements emits them: the 16-lane elementwise kernels (`cpu/wide/`) and the bf16 GEMMs' 16-lane
    /// epilogues (`program_asm::emit_program`, where AVX512BW gives the per-row operand's word broadcast); not the f32
    /// GEMM tiles or the row kernels.
    pub bf16_loads: bool,
    /// Positions along n (`Role::Position`, `EpInst::Position`): only a caller whose loop knows the column of each
    /// vector emits them (the row kernels, `cpu/wide/rows/`); a GEMM tile or an elementwise chunk does not.
    pub positions: bool,
    /// `EpInst::Scalef` (`vscalefps`), in `exp` and `tanh`: only a caller that emits the program at 16 lanes alone
    /// (the elementwise and row kernels built at AVX-512's width); a GEMM's epilogue, translated once for tiles of
    /// either width, does not.
    pub scalef: bool,
    /// A buffer the caller addresses through a register of its own, at each operand's offset (the row kernels'
    /// scratch of per-row values, `cpu/wide/rows/`): its operands need no pointer slot and do not count toward
    /// [`MAX_OPERANDS`]. The caller puts them after the others (`rows::plan`), so every operand that has a slot
    /// keeps an index under the limit.
    pub register_buf: Option<usize>,
}

/// Translates `k`'s outer code, each value's role given by `roles` (a `GemmView`'s, or an `ElementwiseView`'s), or
/// `None` when it cannot run in registers (see the module doc).
pub fn translate(k: &KernelIr, roles: &[Role]) -> Option<Epilogue> {
    translate_with(k, roles, Allow::default())
}

/// [`translate`], with what `allow` permits besides. i32 values (loads, positions) are held as their bits and only
/// compared for equality (`EpInst::ICmpEq`); any other use of one leaves the code untranslated.
pub fn translate_with(k: &KernelIr, roles: &[Role], allow: Allow) -> Option<Epilogue> {
    let bf16 = allow.bf16;
    // A value held as f32 in a register: f32, or bf16 where allowed.
    let floaty = |d: DType| d == DType::F32 || bf16 && d == DType::BF16;
    let n = k.outer.len();
    // Only what the result depends on.
    let mut needed = vec![false; n];
    needed[k.result] = true;
    for i in (0..n).rev() {
        if !needed[i] {
            continue;
        }
        match &k.outer[i].op {
            InstOp::Unary(_, a) | InstOp::Cast(a) => needed[*a] = true,
            InstOp::Binary(_, a, b) => {
                needed[*a] = true;
                needed[*b] = true;
            }
            InstOp::Where(c, a, b) => {
                needed[*c] = true;
                needed[*a] = true;
                needed[*b] = true;
            }
            _ => {}
        }
    }
    let uniform_insts: Vec<bool> = roles.iter().map(|r| matches!(r, Role::Uniform)).collect();
    let mut ep = Epilogue { program: EpProgram::default(), operands: Vec::new(), uniforms: Vec::new(), uniform_insts };
    let mut val: Vec<Option<usize>> = vec![None; n];
    // f32 literals, by bit pattern: read from the code's constant pool at each use (see `Literals`), not given a
    // uniform slot.
    let mut lit: Vec<Option<u32>> = vec![None; n];
    for i in 0..n {
        if !needed[i] {
            continue;
        }
        let inst = &k.outer[i];
        let push = |ep: &mut Epilogue, e: EpInst| {
            ep.program.insts.push(e);
            ep.program.insts.len() - 1
        };
        if matches!(roles[i], Role::Uniform)
            && let Some(bits) = literal(inst)
        {
            lit[i] = Some(bits);
            continue;
        }
        let v = match &roles[i] {
            Role::Other => return None,
            Role::Uniform => {
                if !(floaty(inst.dtype) || inst.dtype == DType::Bool) {
                    // Only feeds other uniform values (a cast), or an unsupported use caught below.
                    continue;
                }
                ep.uniforms.push(i);
                let slot = ep.uniforms.len() - 1;
                push(&mut ep, EpInst::Uniform(slot))
            }
            Role::Mat { .. } | Role::Row { .. } | Role::Col { .. }
                if inst.dtype == DType::BF16 && !(bf16 && allow.bf16_loads) =>
            {
                return None;
            }
            Role::Mat { buf, offset, batch, ld } => {
                let o = operand(&mut ep, allow, *buf, *offset, batch, OperandKind::Mat { ld: *ld }, inst.dtype)?;
                let bytes = ep.operands[o].elem_bytes() as i64;
                let bf16 = ep.operands[o].bf16;
                push(&mut ep, EpInst::Mat { op: o, ld: i32::try_from(*ld * bytes).ok()?, bf16 })
            }
            Role::Row { buf, offset, batch } => {
                let o = operand(&mut ep, allow, *buf, *offset, batch, OperandKind::Row, inst.dtype)?;
                let bf16 = ep.operands[o].bf16;
                push(&mut ep, EpInst::Row { op: o, bf16 })
            }
            Role::Col { buf, offset, batch, stride } => {
                let o =
                    operand(&mut ep, allow, *buf, *offset, batch, OperandKind::Col { stride: *stride }, inst.dtype)?;
                let bytes = ep.operands[o].elem_bytes() as i64;
                let bf16 = ep.operands[o].bf16;
                push(&mut ep, EpInst::Col { op: o, stride: i32::try_from(*stride * bytes).ok()?, bf16 })
            }
            Role::Position { offset } if allow.positions => {
                push(&mut ep, EpInst::Position(i32::try_from(*offset).ok()?))
            }
            Role::Position { .. } => return None,
            Role::Computed => {
                let lits = Literals { val: &val, lit: &lit };
                let get = |ep: &mut Epilogue, j: usize| lits.value(ep, j);
                let f32_of =
                    |ep: &mut Epilogue, j: usize| floaty(k.outer[j].dtype).then(|| lits.value(ep, j)).flatten();
                let bool_of = |j: usize| (k.outer[j].dtype == DType::Bool).then(|| val[j]).flatten();
                // A bf16 result is rounded where the op's f32 result may not be a bf16 value.
                let rounded = |ep: &mut Epilogue, x: usize| {
                    if inst.dtype == DType::BF16 { push_round_bf16(&mut ep.program, x) } else { x }
                };
                match (&inst.op, inst.dtype) {
                    (InstOp::Acc, DType::F32) => push(&mut ep, EpInst::Acc),
                    (InstOp::Binary(op, a, b), d) if floaty(d) => {
                        let op = float_bin(*op)?;
                        // A literal operand is the op's memory operand: on the right, or on the left of an op
                        // that commutes (IEEE `+` and `*` do, bit for bit, unless both operands are NaN).
                        let commutes = |k: u32| matches!(op, VBin::Add | VBin::Mul) && !f32::from_bits(k).is_nan();
                        let e = match (lit[*a], lit[*b]) {
                            (_, Some(kb)) => EpInst::BinK(op, f32_of(&mut ep, *a)?, kb),
                            (Some(ka), None) if commutes(ka) => EpInst::BinK(op, f32_of(&mut ep, *b)?, ka),
                            _ => {
                                let x = f32_of(&mut ep, *a)?;
                                EpInst::Bin(op, x, f32_of(&mut ep, *b)?)
                            }
                        };
                        let r = push(&mut ep, e);
                        rounded(&mut ep, r)
                    }
                    (InstOp::Binary(op, a, b), DType::Bool) if floaty(k.outer[*a].dtype) => {
                        let x = f32_of(&mut ep, *a)?;
                        let y = f32_of(&mut ep, *b)?;
                        let p = match op {
                            BinaryOp::Lt => pred::LT_OQ,
                            BinaryOp::Le => pred::LE_OQ,
                            BinaryOp::Eq => pred::EQ_OQ,
                            BinaryOp::Ne => pred::NEQ_UQ,
                            BinaryOp::Add
                            | BinaryOp::Sub
                            | BinaryOp::Mul
                            | BinaryOp::Div
                            | BinaryOp::Rem
                            | BinaryOp::Max
                            | BinaryOp::Min
                            | BinaryOp::Pow
                            | BinaryOp::And
                            | BinaryOp::Or => return None,
                        };
                        push(&mut ep, EpInst::Cmp(p, x, y))
                    }
                    (InstOp::Binary(op @ (BinaryOp::Eq | BinaryOp::Ne), a, b), DType::Bool)
                        if k.outer[*a].dtype == DType::I32 =>
                    {
                        let x = int_operand(&mut ep, &mut val, k, roles, *a)?;
                        let y = int_operand(&mut ep, &mut val, k, roles, *b)?;
                        let eq = push(&mut ep, EpInst::ICmpEq(x, y));
                        if *op == BinaryOp::Ne { push(&mut ep, EpInst::BinK(VBin::Xor, eq, u32::MAX)) } else { eq }
                    }
                    (InstOp::Binary(op, a, b), DType::Bool) => {
                        let (x, y) = (bool_of(*a)?, bool_of(*b)?);
                        let op = match op {
                            BinaryOp::And => VBin::And,
                            BinaryOp::Or => VBin::Or,
                            // Bool arithmetic and comparisons stay in the compiled pass.
                            BinaryOp::Add
                            | BinaryOp::Sub
                            | BinaryOp::Mul
                            | BinaryOp::Div
                            | BinaryOp::Rem
                            | BinaryOp::Max
                            | BinaryOp::Min
                            | BinaryOp::Pow
                            | BinaryOp::Lt
                            | BinaryOp::Le
                            | BinaryOp::Eq
                            | BinaryOp::Ne => return None,
                        };
                        push(&mut ep, EpInst::Bin(op, x, y))
                    }
                    (InstOp::Where(c, a, b), d) if floaty(d) => {
                        let m = bool_of(*c)?;
                        let t = f32_of(&mut ep, *a)?;
                        let f = f32_of(&mut ep, *b)?;
                        push(&mut ep, EpInst::Select { mask: m, t, f })
                    }
                    (InstOp::Unary(u, a), d) if floaty(d) => {
                        let x = f32_of(&mut ep, *a)?;
                        let r = push_float_unary(&mut ep.program, *u, x, allow.scalef)?;
                        // Negation and absolute value of a bf16 value are bf16 values.
                        if matches!(u, UnaryOp::Neg | UnaryOp::Abs) { r } else { rounded(&mut ep, r) }
                    }
                    (InstOp::Unary(UnaryOp::Not, a), DType::Bool) => {
                        push(&mut ep, EpInst::BinK(VBin::Xor, bool_of(*a)?, u32::MAX))
                    }
                    (InstOp::Cast(a), d) if floaty(d) && floaty(k.outer[*a].dtype) => {
                        // Widening bf16 is exact; narrowing to bf16 rounds.
                        let x = get(&mut ep, *a)?;
                        if k.outer[*a].dtype == DType::F32 { rounded(&mut ep, x) } else { x }
                    }
                    _ => return None,
                }
            }
        };
        val[i] = Some(v);
    }
    ep.program.result = Literals { val: &val, lit: &lit }.value(&mut ep, k.result)?;
    (ep.uniforms.len() <= MAX_UNIFORMS).then_some(ep)
}

/// The f32 literal an outer instruction is (an f32 constant of the kernel IR), as its bit pattern.
fn literal(inst: &Inst) -> Option<u32> {
    if inst.dtype != DType::F32 {
        return None;
    }
    match inst.op {
        InstOp::Const(Scalar::Float(x)) => Some(f32_bits(x)),
        // As the host rounds an integer uniform (`Uniforms::for_launch`).
        InstOp::Const(Scalar::Int(x)) => Some((x as f32).to_bits()),
        _ => None,
    }
}

/// The values translated so far, and the f32 literals, which are not values of the program until a use reads one.
/// A literal is uniform over the launch, but a uniform slot is a register for the whole of a generated elementwise
/// kernel (`cpu/wide/` hoists its uniforms out of the loop) or a temporary from its first use to its last in a GEMM
/// tile, where a literal read at its use costs nothing: it is the memory operand of the op that reads it
/// (`EpInst::BinK`), or a `Const` loaded just before that use. So a long program (a GELU's gradient reads six
/// literals) fits the registers a tile or an unrolled loop leaves. The same value either way: the host evaluates a
/// uniform literal with the same f64-to-f32 rounding.
struct Literals<'a> {
    val: &'a [Option<usize>],
    lit: &'a [Option<u32>],
}

impl Literals<'_> {
    /// Value `j` in the program: a literal is appended as a `Const` for this use.
    fn value(&self, ep: &mut Epilogue, j: usize) -> Option<usize> {
        match self.lit[j] {
            Some(bits) => Some(push_inst(&mut ep.program, EpInst::Const(bits))),
            None => self.val[j],
        }
    }
}

/// The register of i32 value `j` for an int op: its load or position, or a launch-uniform i32 (a class index read
/// from a one-element buffer), given a uniform slot here on first use (only int ops read one, so an int uniform
/// that feeds a cast alone takes no slot).
fn int_operand(ep: &mut Epilogue, val: &mut [Option<usize>], k: &KernelIr, roles: &[Role], j: usize) -> Option<usize> {
    if k.outer[j].dtype != DType::I32 {
        return None;
    }
    if val[j].is_none() && matches!(roles[j], Role::Uniform) {
        ep.uniforms.push(j);
        ep.program.insts.push(EpInst::Uniform(ep.uniforms.len() - 1));
        val[j] = Some(ep.program.insts.len() - 1);
    }
    val[j]
}

/// The vector op of an f32 arithmetic binary op (comparisons and logic are translated apart).
fn float_bin(op: BinaryOp) -> Option<VBin> {
    Some(match op {
        BinaryOp::Add => VBin::Add,
        BinaryOp::Sub => VBin::Sub,
        BinaryOp::Mul => VBin::Mul,
        BinaryOp::Div => VBin::Div,
        // Named, not `_`: a new op does not build until it is decided here. Max/Min/Pow have no program form
        // (the kernel stays on the Cranelift path), nor has Rem (a libcall per lane); comparisons and logic are
        // translated apart.
        BinaryOp::Rem
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::Pow
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::And
        | BinaryOp::Or => return None,
    })
}

/// Appends f32 `u(x)` and returns its value, or `None` for an op the program lacks. Negation and absolute value
/// flip or clear the sign bit (as Cranelift's `fneg`/`fabs`), `recip` is `1 / x` (as the Cranelift kernels compute
/// it), the transcendentals follow `clif_math` (below), scaling by `vscalefps` where `scalef` allows it.
fn push_float_unary(p: &mut EpProgram, u: UnaryOp, x: usize, scalef: bool) -> Option<usize> {
    Some(match u {
        UnaryOp::Sqrt => push_inst(p, EpInst::Sqrt(x)),
        UnaryOp::Neg => push_inst(p, EpInst::BinK(VBin::Xor, x, 0x8000_0000)),
        UnaryOp::Abs => push_inst(p, EpInst::BinK(VBin::And, x, 0x7fff_ffff)),
        UnaryOp::Recip => {
            let one = push_inst(p, EpInst::Const(f32_bits(1.0)));
            push_inst(p, EpInst::Bin(VBin::Div, one, x))
        }
        UnaryOp::Exp => push_exp(p, x, scalef),
        UnaryOp::Tanh => push_tanh(p, x, scalef),
        UnaryOp::Log => push_log(p, x),
        // No register-program form (the kernel stays on the Cranelift path); named so a new op must be decided.
        UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Not
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Trunc
        | UnaryOp::Log1p
        | UnaryOp::Expm1 => return None,
    })
}

/// A reduce kernel's outer code as a register program of its accumulator and constants alone (a row sum's
/// epilogue in `cpu/wide/`: `log` of a sum of exponentials, a scale): f32 `Acc`, constants, `+ - * /`, `sqrt`,
/// `neg`, `abs`, `recip`, `exp`, `tanh`, `log`, and f32-to-f32 casts. `None` for anything else (a load, another
/// dtype).
pub fn translate_row_outer(outer: &[Inst], result: usize) -> Option<EpProgram> {
    let mut p = EpProgram::default();
    let mut val: Vec<Option<usize>> = vec![None; outer.len()];
    for (i, inst) in outer.iter().enumerate() {
        if inst.dtype != DType::F32 {
            return None;
        }
        let f32_of = |j: usize| (outer[j].dtype == DType::F32).then(|| val[j]).flatten();
        let v = match &inst.op {
            InstOp::Acc => push_inst(&mut p, EpInst::Acc),
            InstOp::Const(c) => {
                let x = match *c {
                    Scalar::Float(x) => x,
                    Scalar::Int(x) => x as f64,
                    Scalar::Bool(_) => return None,
                };
                push_inst(&mut p, EpInst::Const(f32_bits(x)))
            }
            InstOp::Cast(a) => f32_of(*a)?,
            InstOp::Binary(op, a, b) => {
                let (x, y) = (f32_of(*a)?, f32_of(*b)?);
                push_inst(&mut p, EpInst::Bin(float_bin(*op)?, x, y))
            }
            InstOp::Unary(u, a) => push_float_unary(&mut p, *u, f32_of(*a)?, false)?,
            _ => return None,
        };
        val[i] = Some(v);
    }
    p.result = val.get(result).copied().flatten()?;
    Some(p)
}

fn operand(
    ep: &mut Epilogue,
    allow: Allow,
    buf: usize,
    offset: i64,
    batch: &[i64],
    kind: OperandKind,
    d: DType,
) -> Option<usize> {
    let o = EpOperand { buf, offset, batch: batch.to_vec(), kind, bf16: d == DType::BF16 };
    if let Some(i) = ep.operands.iter().position(|x| *x == o) {
        return Some(i);
    }
    let slotted = |b: usize| Some(b) != allow.register_buf;
    if slotted(buf) && ep.operands.iter().filter(|x| slotted(x.buf)).count() == MAX_OPERANDS {
        return None;
    }
    ep.operands.push(o);
    Some(ep.operands.len() - 1)
}

/// The uniform values of one launch, each splatted to 8 lanes (the micro-kernels read slot `s` at `32 * s`).
pub struct Uniforms {
    vals: [[f32; 8]; MAX_UNIFORMS],
}

/// Most uniform slots a program may use.
pub const MAX_UNIFORMS: usize = 16;

impl Uniforms {
    /// The uniform outer instructions, evaluated on the host from the launch's buffers.
    ///
    /// # Safety
    /// `ptrs` holds the launch's input pointers, each valid for the buffer the kernel IR declares at its position.
    pub unsafe fn for_launch(ep: Option<&Epilogue>, outer: &[Inst], ptrs: &[*mut u8]) -> Uniforms {
        let mut u = Uniforms { vals: [[0f32; 8]; MAX_UNIFORMS] };
        let Some(ep) = ep.filter(|ep| !ep.uniforms.is_empty()) else { return u };
        // SAFETY: the caller's contract; the indices are the constant ones the kernel IR reads.
        let mut load = |buf: usize, i: usize, d: DType| unsafe { read_scalar(ptrs[buf], i, d) };
        let vals = kiln_jit::kernel::eval::eval_uniform(outer, &ep.uniform_insts, &mut load);
        for (slot, &i) in ep.uniforms.iter().enumerate().take(MAX_UNIFORMS) {
            let bits = match vals[i] {
                Some(Scalar::Bool(true)) => u32::MAX,
                Some(Scalar::Bool(false)) => 0,
                Some(Scalar::Float(x)) => (x as f32).to_bits(),
                // An i32 value is held as its bits (`int_operand`).
                Some(Scalar::Int(x)) if outer[i].dtype == DType::I32 => x as i32 as u32,
                Some(Scalar::Int(x)) => (x as f32).to_bits(),
                None => 0,
            };
            u.vals[slot] = [f32::from_bits(bits); 8];
        }
        u
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.vals.as_ptr() as *const u8
    }
}

/// Reads element `i` of a buffer of dtype `d` as a scalar (for host-evaluated uniforms).
///
/// # Safety
/// `p` must be valid for reading element `i` of dtype `d`.
unsafe fn read_scalar(p: *mut u8, i: usize, d: DType) -> Scalar {
    // SAFETY: the caller's contract.
    unsafe {
        match d {
            DType::Bool => Scalar::Bool(*p.add(i) != 0),
            DType::U8 => Scalar::Int(*p.add(i) as i64),
            DType::U32 => Scalar::Int(*(p as *const u32).add(i) as i64),
            DType::I32 => Scalar::Int(*(p as *const i32).add(i) as i64),
            DType::I64 => Scalar::Int(*(p as *const i64).add(i)),
            DType::F16 => Scalar::Float((*(p as *const kiln_jit::f16).add(i)).to_f64()),
            DType::F32 => Scalar::Float(*(p as *const f32).add(i) as f64),
            DType::F64 => Scalar::Float(*(p as *const f64).add(i)),
            DType::BF16 => Scalar::Float((*(p as *const kiln_jit::bf16).add(i)).to_f64()),
        }
    }
}
