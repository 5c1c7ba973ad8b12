//! A GEMM kernel's epilogue (its outer code in the kernel IR) translated into a register program for the
//! generated micro-kernels: loads of M x N, per-column and per-row operands become vector loads at the tile, values
//! uniform over the launch (constants, a learning rate read from a buffer and cast) are computed on the host per
//! launch and splatted, and the arithmetic becomes AVX ops.
//!
//! What translates: f32 `+ - * /`, `sqrt`, `neg`, `abs`, `recip`, comparisons (`< <= == !=`, NaN semantics of the
//! spec), `where`, bool `and`/`or`/`not`, and f32 `exp`, `tanh` and `log` (so sigmoid, silu, gelu, softplus and
//! softmax's exponent). The transcendentals expand into `clif_math`'s f32 sequences in their FMA form, operation for
//! operation, with
//! constants read from the code's constant pool: the Cranelift kernels compute exactly these sequences on the hosts
//! that run generated code (they have FMA), so an element gets the same bits from either kernel
//! (`tests/wide.rs` checks it against a Cranelift run). Anything else (sin/cos, max/min with their NaN rule, an
//! int value, a gather) returns `None`, and the backend applies the epilogue as a separate compiled pass over C
//! instead: slower, never wrong.

use super::asm::{EpInst, EpProgram, VBin, pred};
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
}

/// The value of one uniform slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UniformSrc {
    /// The outer instruction with this index, evaluated on the host per launch.
    Inst(usize),
    /// A fixed bit pattern (sign masks).
    Bits(u32),
}

#[derive(Clone, Debug)]
pub struct Epilogue {
    pub program: EpProgram,
    pub operands: Vec<EpOperand>,
    pub uniforms: Vec<UniformSrc>,
    /// Which outer instructions are uniform (the host evaluates these).
    pub uniform_insts: Vec<bool>,
}

/// Most operands a program may read (their pointers travel in a small per-tile table).
pub const MAX_OPERANDS: usize = 6;

/// Translates `k`'s outer code, each value's role given by `roles` (a `GemmView`'s, or an `ElementwiseView`'s), or
/// `None` when it cannot run in registers (see the module doc).
pub fn translate(k: &KernelIr, roles: &[Role]) -> Option<Epilogue> {
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
    for i in 0..n {
        if !needed[i] {
            continue;
        }
        let inst = &k.outer[i];
        let push = |ep: &mut Epilogue, e: EpInst| {
            ep.program.insts.push(e);
            ep.program.insts.len() - 1
        };
        let v = match &roles[i] {
            Role::Other => return None,
            Role::Uniform => {
                if !matches!(inst.dtype, DType::F32 | DType::Bool) {
                    // Only feeds other uniform values (a cast), or an unsupported use caught below.
                    continue;
                }
                ep.uniforms.push(UniformSrc::Inst(i));
                let slot = ep.uniforms.len() - 1;
                push(&mut ep, EpInst::Uniform(slot))
            }
            Role::Mat { buf, offset, batch, ld } => {
                let o = operand(&mut ep, *buf, *offset, batch, OperandKind::Mat { ld: *ld })?;
                push(&mut ep, EpInst::Mat { op: o, ld: i32::try_from(*ld * 4).ok()? })
            }
            Role::Row { buf, offset, batch } => {
                let o = operand(&mut ep, *buf, *offset, batch, OperandKind::Row)?;
                push(&mut ep, EpInst::Row { op: o })
            }
            Role::Col { buf, offset, batch, stride } => {
                let o = operand(&mut ep, *buf, *offset, batch, OperandKind::Col { stride: *stride })?;
                push(&mut ep, EpInst::Col { op: o, stride: i32::try_from(*stride * 4).ok()? })
            }
            Role::Computed => {
                let get = |j: usize| val[j];
                let f32_of = |j: usize| (k.outer[j].dtype == DType::F32).then(|| val[j]).flatten();
                let bool_of = |j: usize| (k.outer[j].dtype == DType::Bool).then(|| val[j]).flatten();
                match (&inst.op, inst.dtype) {
                    (InstOp::Acc, DType::F32) => push(&mut ep, EpInst::Acc),
                    (InstOp::Binary(op, a, b), DType::F32) => {
                        let (x, y) = (f32_of(*a)?, f32_of(*b)?);
                        push(&mut ep, EpInst::Bin(float_bin(*op)?, x, y))
                    }
                    (InstOp::Binary(op, a, b), DType::Bool) if k.outer[*a].dtype == DType::F32 => {
                        let (x, y) = (f32_of(*a)?, f32_of(*b)?);
                        let p = match op {
                            BinaryOp::Lt => pred::LT_OQ,
                            BinaryOp::Le => pred::LE_OQ,
                            BinaryOp::Eq => pred::EQ_OQ,
                            BinaryOp::Ne => pred::NEQ_UQ,
                            _ => return None,
                        };
                        push(&mut ep, EpInst::Cmp(p, x, y))
                    }
                    (InstOp::Binary(op, a, b), DType::Bool) => {
                        let (x, y) = (bool_of(*a)?, bool_of(*b)?);
                        let op = match op {
                            BinaryOp::And => VBin::And,
                            BinaryOp::Or => VBin::Or,
                            _ => return None,
                        };
                        push(&mut ep, EpInst::Bin(op, x, y))
                    }
                    (InstOp::Where(c, a, b), DType::F32) => {
                        let (m, t, f) = (bool_of(*c)?, f32_of(*a)?, f32_of(*b)?);
                        push(&mut ep, EpInst::Select { mask: m, t, f })
                    }
                    (InstOp::Unary(u, a), DType::F32) => push_float_unary(&mut ep.program, *u, f32_of(*a)?)?,
                    (InstOp::Unary(UnaryOp::Not, a), DType::Bool) => {
                        let x = bool_of(*a)?;
                        ep.uniforms.push(UniformSrc::Bits(u32::MAX));
                        let slot = ep.uniforms.len() - 1;
                        let s = push(&mut ep, EpInst::Uniform(slot));
                        push(&mut ep, EpInst::Bin(VBin::Xor, x, s))
                    }
                    (InstOp::Cast(a), DType::F32) if k.outer[*a].dtype == DType::F32 => get(*a)?,
                    _ => return None,
                }
            }
        };
        val[i] = Some(v);
    }
    ep.program.result = val[k.result]?;
    (ep.uniforms.len() <= MAX_UNIFORMS).then_some(ep)
}

/// The vector op of an f32 arithmetic binary op (comparisons and logic are translated apart).
fn float_bin(op: BinaryOp) -> Option<VBin> {
    Some(match op {
        BinaryOp::Add => VBin::Add,
        BinaryOp::Sub => VBin::Sub,
        BinaryOp::Mul => VBin::Mul,
        BinaryOp::Div => VBin::Div,
        _ => return None,
    })
}

/// Appends f32 `u(x)` and returns its value, or `None` for an op the program lacks. Negation and absolute value
/// flip or clear the sign bit (as Cranelift's `fneg`/`fabs`), `recip` is `1 / x` (as the Cranelift kernels compute
/// it), the transcendentals follow `clif_math` (below).
fn push_float_unary(p: &mut EpProgram, u: UnaryOp, x: usize) -> Option<usize> {
    Some(match u {
        UnaryOp::Sqrt => push_inst(p, EpInst::Sqrt(x)),
        UnaryOp::Neg => push_inst(p, EpInst::BinK(VBin::Xor, x, 0x8000_0000)),
        UnaryOp::Abs => push_inst(p, EpInst::BinK(VBin::And, x, 0x7fff_ffff)),
        UnaryOp::Recip => {
            let one = push_inst(p, EpInst::Const(f32_bits(1.0)));
            push_inst(p, EpInst::Bin(VBin::Div, one, x))
        }
        UnaryOp::Exp => push_exp(p, x),
        UnaryOp::Tanh => push_tanh(p, x),
        UnaryOp::Log => push_log(p, x),
        _ => return None,
    })
}

/// Appends f32 `e^x` and returns its value: `clif_math`'s f32 `exp` in its FMA form (the Cranelift kernels' form on
/// the hosts these programs run on, which have FMA) operation for operation, so an element gets the same bits from
/// either kernel: clamp, then [`push_exp_reduced`], then `p * 2^n1 * 2^n2` with `n1 = n >> 1`, `n2 = n - n1`
/// (overflow and subnormal results rounded once, by the last multiply).
fn push_exp(p: &mut EpProgram, x: usize) -> usize {
    use kiln_jit::render::clif_math::EXPF_CLAMP;
    let x = push_inst(p, EpInst::MaxK(x, f32_bits(EXPF_CLAMP.0)));
    let x = push_inst(p, EpInst::MinK(x, f32_bits(EXPF_CLAMP.1)));
    let (e, n) = push_exp_reduced(p, x);
    let n1 = push_inst(p, EpInst::Sar(n, 1));
    let n2 = push_inst(p, EpInst::Bin(VBin::ISub, n, n1));
    let s1 = push_pow2(p, n1);
    let s2 = push_pow2(p, n2);
    let e = push_inst(p, EpInst::Bin(VBin::Mul, e, s1));
    push_inst(p, EpInst::Bin(VBin::Mul, e, s2))
}

/// `(p, n)` with e^x = p * 2^n for a clamped `x` (`clif_math`'s `exp_reduced`, f32, FMA form): `n = round(x log2 e)`
/// by the magic-number trick, Cody-Waite `r = x - n ln2`, `p = 1 + r + r^2 P(r)` with the Cephes polynomial by
/// fused multiply-adds; `n` in integer lanes.
fn push_exp_reduced(p: &mut EpProgram, x: usize) -> (usize, usize) {
    use kiln_jit::render::clif_math::{EXPF_LN2, EXPF_P};
    let magic = 1.5 * 2f64.powi(23);
    let y = push_inst(p, EpInst::BinK(VBin::Mul, x, f32_bits(std::f64::consts::LOG2_E)));
    let t = push_inst(p, EpInst::BinK(VBin::Add, y, f32_bits(magic)));
    let nf = push_inst(p, EpInst::BinK(VBin::Add, t, f32_bits(-magic)));
    // The integer n, from t's bits (computed here so that t is free during the polynomial).
    let n = push_inst(p, EpInst::BinK(VBin::ISub, t, f32_bits(magic)));
    let h = push_inst(p, EpInst::BinK(VBin::Mul, nf, f32_bits(EXPF_LN2.0)));
    let r = push_inst(p, EpInst::Bin(VBin::Sub, x, h));
    let l = push_inst(p, EpInst::BinK(VBin::Mul, nf, f32_bits(EXPF_LN2.1)));
    let r = push_inst(p, EpInst::Bin(VBin::Sub, r, l));
    let q = push_horner(p, r, &EXPF_P);
    let r2 = push_inst(p, EpInst::Bin(VBin::Mul, r, r));
    let e = push_inst(p, EpInst::Bin(VBin::Mul, q, r2));
    let e = push_inst(p, EpInst::Bin(VBin::Add, e, r));
    (push_inst(p, EpInst::BinK(VBin::Add, e, f32_bits(1.0))), n)
}

/// f32 `tanh(x)` as `clif_math` computes it (f32, FMA form): on `a = |x|`, `a + a^3 P(a^2)` below 0.625, else
/// `1 - 2 / (e^(2a) + 1)` with `2a` capped at 40 (one 2^n scale), then x's sign.
fn push_tanh(p: &mut EpProgram, x: usize) -> usize {
    use kiln_jit::render::clif_math::TANHF_P;
    let a = push_inst(p, EpInst::BinK(VBin::And, x, 0x7fff_ffff));
    let bound = push_inst(p, EpInst::Const(f32_bits(0.625)));
    let small = push_inst(p, EpInst::Cmp(pred::LT_OQ, a, bound));
    let a2 = push_inst(p, EpInst::Bin(VBin::Add, a, a));
    let u = push_inst(p, EpInst::MinK(a2, f32_bits(40.0)));
    let (e, n) = push_exp_reduced(p, u);
    let s = push_pow2(p, n);
    let e = push_inst(p, EpInst::Bin(VBin::Mul, e, s));
    let e1 = push_inst(p, EpInst::BinK(VBin::Add, e, f32_bits(1.0)));
    let z = push_inst(p, EpInst::Bin(VBin::Mul, a, a));
    let pz = push_horner(p, z, &TANHF_P);
    let sm = push_inst(p, EpInst::Bin(VBin::Mul, pz, z));
    let sm = push_inst(p, EpInst::Bin(VBin::Mul, sm, a));
    let sm = push_inst(p, EpInst::Bin(VBin::Add, sm, a));
    let two = push_inst(p, EpInst::Const(f32_bits(2.0)));
    let q = push_inst(p, EpInst::Bin(VBin::Div, two, e1));
    let one = push_inst(p, EpInst::Const(f32_bits(1.0)));
    let bg = push_inst(p, EpInst::Bin(VBin::Sub, one, q));
    let res = push_inst(p, EpInst::Select { mask: small, t: sm, f: bg });
    let sign = push_inst(p, EpInst::BinK(VBin::And, x, 0x8000_0000));
    push_inst(p, EpInst::Bin(VBin::Or, res, sign))
}

/// f32 `ln(x)` as `clif_math` computes it (Cephes `logf`, f32, FMA form): subnormals scaled by 2^23 first, `x = z *
/// 2^k` with `z` in [sqrt(1/2), sqrt(2)) from the bit pattern, `f = z - 1`, `f - f^2/2 + f^3 P(f) + k ln2` (ln2
/// split), then NaN and +inf as they are, negative -> NaN, ±0 -> -inf.
fn push_log(p: &mut EpProgram, x: usize) -> usize {
    use kiln_jit::render::clif_math::{EXPF_LN2, LOGF_P};
    let two23 = 2f64.powi(23);
    let min_normal = push_inst(p, EpInst::Const(f32::MIN_POSITIVE.to_bits()));
    let den = push_inst(p, EpInst::Cmp(pred::LT_OQ, x, min_normal));
    let scaled = push_inst(p, EpInst::BinK(VBin::Mul, x, f32_bits(two23)));
    let xs = push_inst(p, EpInst::Select { mask: den, t: scaled, f: x });
    // The bits of sqrt(1/2), and the same with the exponent field cleared to 0 (bias - 1 = 126 taken off), so the
    // difference keeps a non-negative exponent field holding k + 126.
    let off = 0x3f35_04f3_u32;
    let tmp = push_inst(p, EpInst::BinK(VBin::ISub, xs, off - (126 << 23)));
    let kb = push_inst(p, EpInst::Shr(tmp, 23));
    let zb = push_inst(p, EpInst::BinK(VBin::And, tmp, (1 << 23) - 1));
    let z = push_inst(p, EpInst::BinK(VBin::IAdd, zb, off));
    // k as a float: or-ing the small non-negative kb into the mantissa of 2^23 is exact.
    let kf = push_inst(p, EpInst::BinK(VBin::Or, kb, f32_bits(two23)));
    let adj_normal = push_inst(p, EpInst::Const(f32_bits(two23 + 126.0)));
    let adj_den = push_inst(p, EpInst::Const(f32_bits(two23 + 126.0 + 23.0)));
    let adj = push_inst(p, EpInst::Select { mask: den, t: adj_den, f: adj_normal });
    let k = push_inst(p, EpInst::Bin(VBin::Sub, kf, adj));
    let f = push_inst(p, EpInst::BinK(VBin::Add, z, f32_bits(-1.0)));
    let z2 = push_inst(p, EpInst::Bin(VBin::Mul, f, f));
    let q = push_horner(p, f, &LOGF_P);
    let y = push_inst(p, EpInst::Bin(VBin::Mul, q, f));
    let y = push_inst(p, EpInst::Bin(VBin::Mul, y, z2));
    let klo = push_inst(p, EpInst::BinK(VBin::Mul, k, f32_bits(EXPF_LN2.1)));
    let y = push_inst(p, EpInst::Bin(VBin::Add, y, klo));
    let hz = push_inst(p, EpInst::BinK(VBin::Mul, z2, f32_bits(0.5)));
    let y = push_inst(p, EpInst::Bin(VBin::Sub, y, hz));
    let r = push_inst(p, EpInst::Bin(VBin::Add, f, y));
    let khi = push_inst(p, EpInst::BinK(VBin::Mul, k, f32_bits(EXPF_LN2.0)));
    let res = push_inst(p, EpInst::Bin(VBin::Add, r, khi));
    let inf = push_inst(p, EpInst::Const(f32::INFINITY.to_bits()));
    let big = push_inst(p, EpInst::Cmp(pred::NLT_UQ, x, inf));
    let res = push_inst(p, EpInst::Select { mask: big, t: x, f: res });
    let zero = push_inst(p, EpInst::Const(0));
    let neg = push_inst(p, EpInst::Cmp(pred::LT_OQ, x, zero));
    let nan = push_inst(p, EpInst::Const(f32::NAN.to_bits()));
    let res = push_inst(p, EpInst::Select { mask: neg, t: nan, f: res });
    let is_zero = push_inst(p, EpInst::Cmp(pred::EQ_OQ, x, zero));
    let minf = push_inst(p, EpInst::Const(f32::NEG_INFINITY.to_bits()));
    push_inst(p, EpInst::Select { mask: is_zero, t: minf, f: res })
}

/// `cs[0]`, then `acc * x + c` by fused multiply-adds for each later coefficient (`clif_math`'s `horner32`).
fn push_horner(p: &mut EpProgram, x: usize, cs: &[f32]) -> usize {
    let mut q = push_inst(p, EpInst::Const(cs[0].to_bits()));
    for c in &cs[1..] {
        q = push_inst(p, EpInst::FmaK(q, x, c.to_bits()));
    }
    q
}

/// 2^n for integer lanes `n` in the normal range: `(n + 127) << 23`.
fn push_pow2(p: &mut EpProgram, n: usize) -> usize {
    let b = push_inst(p, EpInst::BinK(VBin::IAdd, n, 127));
    push_inst(p, EpInst::Shl(b, 23))
}

fn push_inst(p: &mut EpProgram, i: EpInst) -> usize {
    p.insts.push(i);
    p.insts.len() - 1
}

/// An f64 constant rounded to f32, as `clif_math` rounds its constants.
fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}

/// A reduce kernel's outer code as a register program of its accumulator and constants alone (a row sum's
/// epilogue in `cpu/wide.rs`: `log` of a sum of exponentials, a scale): f32 `Acc`, constants, `+ - * /`, `sqrt`,
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
            InstOp::Unary(u, a) => push_float_unary(&mut p, *u, f32_of(*a)?)?,
            _ => return None,
        };
        val[i] = Some(v);
    }
    p.result = val.get(result).copied().flatten()?;
    Some(p)
}

fn operand(ep: &mut Epilogue, buf: usize, offset: i64, batch: &[i64], kind: OperandKind) -> Option<usize> {
    let o = EpOperand { buf, offset, batch: batch.to_vec(), kind };
    if let Some(i) = ep.operands.iter().position(|x| *x == o) {
        return Some(i);
    }
    if ep.operands.len() == MAX_OPERANDS {
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
    /// Fixed bit patterns as they are; outer instructions evaluated on the host from the launch's buffers.
    ///
    /// # Safety
    /// `ptrs` holds the launch's input pointers, each valid for the buffer the kernel IR declares at its position.
    pub unsafe fn for_launch(ep: Option<&Epilogue>, outer: &[Inst], ptrs: &[*mut u8]) -> Uniforms {
        let mut u = Uniforms { vals: [[0f32; 8]; MAX_UNIFORMS] };
        let Some(ep) = ep else { return u };
        let any_inst = ep.uniforms.iter().any(|u| matches!(u, UniformSrc::Inst(_)));
        let vals = if any_inst {
            // SAFETY: the caller's contract; the indices are the constant ones the kernel IR reads.
            let mut load = |buf: usize, i: usize, d: DType| unsafe { read_scalar(ptrs[buf], i, d) };
            kiln_jit::kernel::eval::eval_uniform(outer, &ep.uniform_insts, &mut load)
        } else {
            smallvec::SmallVec::new()
        };
        for (slot, src) in ep.uniforms.iter().enumerate().take(MAX_UNIFORMS) {
            let bits = match *src {
                UniformSrc::Bits(b) => b,
                UniformSrc::Inst(i) => match vals[i] {
                    Some(Scalar::Bool(true)) => u32::MAX,
                    Some(Scalar::Bool(false)) => 0,
                    Some(Scalar::Float(x)) => (x as f32).to_bits(),
                    Some(Scalar::Int(x)) => (x as f32).to_bits(),
                    None => 0,
                },
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
        }
    }
}
