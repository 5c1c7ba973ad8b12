//! Kernel IR -> Cranelift IR (CLIF), for the CPU backend.
//!
//! Every kernel becomes `fn(args: *const *mut u8, rng: *const u64, start: i64, end: i64)`: `args` holds the
//! input pointers then the output pointer, `rng` holds (seed, offset) pairs, and the function computes rows
//! `start..end` of output loop 0 (all of it for a zero-dim output), so the backend can split rows over threads.
//!
//! Code for each instruction comes from one place, `Emitter::op`, which is written once for any lane count:
//! a kernel whose values are all f32, i32 or bool runs its innermost output loop 4 lanes at a time (f32x4, the
//! widest vector Cranelift emits on x86-64), with a scalar tail; other kernels run scalar. Loads whose index moves
//! by 1 along the vectorized loop are vector loads, by 0 are splats, otherwise gathers. Bools are 0/1 bytes in
//! memory and scalar code, all-ones/zero lane masks in vector code.
//!
//! Transcendentals are calls to `Libcall`s, which the backend binds to Rust functions (correctly rounded to the
//! accuracy of Rust's `std`); vectorized versions replace them where `clif_math` provides one.
//!
//! Semantics are those of `kernel::eval` (the executable spec): ints wrap, integer division by zero gives 0,
//! float -> int casts saturate through i64 then wrap, max/min propagate NaN, comparisons with NaN are false except
//! `!=`.

use crate::dtype::{DType, Scalar};
use crate::kernel::{IExpr, Inst, InstOp, KernelIr, Valid};
use crate::op::{BinaryOp, RandDist, ReduceOp, UnaryOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, Endianness, ExtFuncData, ExternalName, FuncRef, Function, InstBuilder, MemFlagsData, Signature, Type,
    UserExternalName, UserFuncName, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use std::collections::HashMap;

/// Host functions a kernel may call. The backend declares them first, in this order, so that a libcall's index
/// is its function id in the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Libcall {
    ExpF32,
    LogF32,
    SinF32,
    CosF32,
    TanhF32,
    PowF32,
    ExpF64,
    LogF64,
    SinF64,
    CosF64,
    TanhF64,
    PowF64,
    /// `(i64, i64) -> i64` wrapping integer power (see `interp::int_pow`).
    PowI64,
    /// `(seed, index) -> f32` uniform in [0, 1).
    UniformF32,
    /// `(seed, index) -> f64` uniform in [0, 1).
    UniformF64,
    /// `(seed, index) -> f64` standard normal.
    NormalF64,
}

impl Libcall {
    pub const ALL: [Libcall; 16] = [
        Libcall::ExpF32,
        Libcall::LogF32,
        Libcall::SinF32,
        Libcall::CosF32,
        Libcall::TanhF32,
        Libcall::PowF32,
        Libcall::ExpF64,
        Libcall::LogF64,
        Libcall::SinF64,
        Libcall::CosF64,
        Libcall::TanhF64,
        Libcall::PowF64,
        Libcall::PowI64,
        Libcall::UniformF32,
        Libcall::UniformF64,
        Libcall::NormalF64,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Libcall::ExpF32 => "kiln_exp_f32",
            Libcall::LogF32 => "kiln_log_f32",
            Libcall::SinF32 => "kiln_sin_f32",
            Libcall::CosF32 => "kiln_cos_f32",
            Libcall::TanhF32 => "kiln_tanh_f32",
            Libcall::PowF32 => "kiln_pow_f32",
            Libcall::ExpF64 => "kiln_exp_f64",
            Libcall::LogF64 => "kiln_log_f64",
            Libcall::SinF64 => "kiln_sin_f64",
            Libcall::CosF64 => "kiln_cos_f64",
            Libcall::TanhF64 => "kiln_tanh_f64",
            Libcall::PowF64 => "kiln_pow_f64",
            Libcall::PowI64 => "kiln_pow_i64",
            Libcall::UniformF32 => "kiln_uniform_f32",
            Libcall::UniformF64 => "kiln_uniform_f64",
            Libcall::NormalF64 => "kiln_normal_f64",
        }
    }

    /// (parameter types, return type).
    pub fn types(self) -> (&'static [Type], Type) {
        use Libcall::*;
        match self {
            ExpF32 | LogF32 | SinF32 | CosF32 | TanhF32 => (&[types::F32], types::F32),
            PowF32 => (&[types::F32, types::F32], types::F32),
            ExpF64 | LogF64 | SinF64 | CosF64 | TanhF64 => (&[types::F64], types::F64),
            PowF64 => (&[types::F64, types::F64], types::F64),
            PowI64 => (&[types::I64, types::I64], types::I64),
            UniformF32 => (&[types::I64, types::I64], types::F32),
            UniformF64 | NormalF64 => (&[types::I64, types::I64], types::F64),
        }
    }

    pub fn signature(self, call_conv: CallConv) -> Signature {
        let (params, ret) = self.types();
        let mut sig = Signature::new(call_conv);
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(ret));
        sig
    }

    fn index(self) -> u32 {
        Libcall::ALL.iter().position(|&l| l == self).expect("listed") as u32
    }

    fn unary(u: UnaryOp, d: DType) -> Option<Libcall> {
        let f64 = d == DType::F64;
        Some(match u {
            UnaryOp::Exp => {
                if f64 {
                    Libcall::ExpF64
                } else {
                    Libcall::ExpF32
                }
            }
            UnaryOp::Log => {
                if f64 {
                    Libcall::LogF64
                } else {
                    Libcall::LogF32
                }
            }
            UnaryOp::Sin => {
                if f64 {
                    Libcall::SinF64
                } else {
                    Libcall::SinF32
                }
            }
            UnaryOp::Cos => {
                if f64 {
                    Libcall::CosF64
                } else {
                    Libcall::CosF32
                }
            }
            UnaryOp::Tanh => {
                if f64 {
                    Libcall::TanhF64
                } else {
                    Libcall::TanhF32
                }
            }
            _ => return None,
        })
    }
}

/// The kernel entry signature.
pub fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([types::I64; 4].map(AbiParam::new));
    sig
}

/// Lanes of the vectorized innermost loop.
const LANES: usize = 4;

/// Whether every value of the kernel fits the f32x4 / i32x4 / mask lane model.
pub fn vectorizable(k: &KernelIr) -> bool {
    let ok_inst = |i: &Inst| {
        matches!(i.dtype, DType::F32 | DType::I32 | DType::Bool)
            && !matches!(i.op, InstOp::Index(_) | InstOp::Rand { .. })
    };
    let inner_ok = k
        .reduce
        .as_ref()
        .is_none_or(|r| matches!(r.dtype, DType::F32 | DType::I32 | DType::Bool) && r.inner.iter().all(ok_inst));
    !k.out_extents.is_empty()
        && k.inputs.iter().chain([&k.output]).all(|b| matches!(b.dtype, DType::F32 | DType::I32 | DType::Bool))
        && k.outer.iter().all(ok_inst)
        && inner_ok
}

/// Renders `k` as a CLIF function named `user0:index`. `vectorize` may be turned off to get the scalar form.
pub fn render(k: &KernelIr, index: u32, target: TargetFrontendConfig, vectorize: bool) -> Function {
    let call_conv = target.default_call_conv;
    let mut func = Function::with_name_signature(UserFuncName::user(1, index), kernel_signature(call_conv));
    let mut ctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut ctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let [args, rng, start, end] = b.block_params(entry).try_into().expect("four params");
    let trusted = MemFlagsData::trusted().with_readonly();
    let mut bases = Vec::with_capacity(k.inputs.len() + 1);
    for i in 0..=k.inputs.len() {
        bases.push(b.ins().load(types::I64, trusted, args, (i * 8) as i32));
    }
    let out_ptr = bases.pop().expect("output pointer");
    let nvars = k.extents().len();
    let vars: Vec<Variable> = (0..nvars).map(|_| b.declare_var(types::I64)).collect();
    let oidx = b.declare_var(types::I64);
    let mut em = Emitter { b, k, bases, out_ptr, rng, vars, oidx, call_conv, libcalls: HashMap::new(), vdim: None };
    let vec_ok = vectorize && vectorizable(k);
    let rank = k.out_rank();
    if rank == 0 {
        let zero = em.b.ins().iconst(types::I64, 0);
        em.b.def_var(em.oidx, zero);
        em.element(1);
    } else {
        let row: i64 = k.out_extents[1..].iter().product::<usize>() as i64;
        let first = em.b.ins().imul_imm_s(start, row);
        em.b.def_var(em.oidx, first);
        em.loops(0, start, end, vec_ok);
    }
    em.b.ins().return_(&[]);
    em.b.finalize(target);
    func
}

struct Emitter<'a> {
    b: FunctionBuilder<'a>,
    k: &'a KernelIr,
    bases: Vec<Value>,
    out_ptr: Value,
    rng: Value,
    vars: Vec<Variable>,
    oidx: Variable,
    call_conv: CallConv,
    libcalls: HashMap<Libcall, FuncRef>,
    /// The loop variable that advances by lanes in vector code.
    vdim: Option<usize>,
}

/// CLIF type of a dtype: bools and u8 are bytes in scalar code; in vector code bools are i32 lane masks.
fn ty(d: DType, lanes: usize) -> Type {
    match (d, lanes) {
        (DType::Bool | DType::U8, 1) => types::I8,
        (DType::I32, 1) => types::I32,
        (DType::I64, 1) => types::I64,
        (DType::F32, 1) => types::F32,
        (DType::F64, 1) => types::F64,
        (DType::F32, _) => types::F32X4,
        (DType::I32 | DType::Bool, _) => types::I32X4,
        (d, l) => unreachable!("{d} has no {l}-lane form"),
    }
}

fn vector_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

impl Emitter<'_> {
    /// Output loops from `dim` inward; the innermost output loop is vectorized when `vec_ok`.
    fn loops(&mut self, dim: usize, lo: Value, hi: Value, vec_ok: bool) {
        let var = self.vars[dim];
        let innermost = dim + 1 == self.k.out_rank();
        if innermost && vec_ok {
            self.vdim = Some(dim);
            self.b.def_var(var, lo);
            self.counted_loop(var, hi, LANES as i64, |s| s.element(LANES));
            self.vdim = None;
            self.counted_loop(var, hi, 1, |s| s.element(1));
            return;
        }
        self.b.def_var(var, lo);
        self.counted_loop(var, hi, 1, |s| {
            if innermost {
                s.element(1);
            } else {
                let zero = s.b.ins().iconst(types::I64, 0);
                let n = s.b.ins().iconst(types::I64, s.k.out_extents[dim + 1] as i64);
                s.loops(dim + 1, zero, n, vec_ok);
            }
        });
    }

    /// `while var + step <= hi { body; var += step }`, continuing from `var`'s current value.
    fn counted_loop(&mut self, var: Variable, hi: Value, step: i64, body: impl FnOnce(&mut Self)) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let v = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(v, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        body(self);
        let v = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(v, step);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// One output element (or `lanes` adjacent ones): the reduction if any, the outer code, the store.
    fn element(&mut self, lanes: usize) {
        let k = self.k;
        let acc = k.reduce.as_ref().map(|r| {
            let acc = self.b.declare_var(ty(r.dtype, lanes));
            let init = self.init(r.op, r.dtype, lanes);
            self.b.def_var(acc, init);
            self.reduce_loops(0, acc, lanes);
            self.b.use_var(acc)
        });
        let vals = self.insts(&k.outer, lanes, acc);
        let v = vals[k.result];
        self.store(v, lanes);
        let o = self.b.use_var(self.oidx);
        let o = self.b.ins().iadd_imm_s(o, lanes as i64);
        self.b.def_var(self.oidx, o);
    }

    fn reduce_loops(&mut self, level: usize, acc: Variable, lanes: usize) {
        let r = self.k.reduce.as_ref().expect("reduce kernel");
        if level == r.extents.len() {
            let vals = self.insts(&r.inner, lanes, None);
            let a = self.b.use_var(acc);
            let folded = self.fold(r.op, r.dtype, lanes, a, vals[r.value]);
            self.b.def_var(acc, folded);
            return;
        }
        let var = self.vars[self.k.out_rank() + level];
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().iconst(types::I64, r.extents[level] as i64);
        self.b.def_var(var, zero);
        self.counted_loop(var, n, 1, |s| s.reduce_loops(level + 1, acc, lanes));
    }

    fn init(&mut self, op: ReduceOp, d: DType, lanes: usize) -> Value {
        let s = match (op, d.is_float()) {
            (ReduceOp::Sum, _) => Scalar::Int(0),
            (ReduceOp::Prod, _) => Scalar::Int(1),
            (ReduceOp::Max, true) => Scalar::Float(f64::NEG_INFINITY),
            (ReduceOp::Min, true) => Scalar::Float(f64::INFINITY),
            (ReduceOp::Max, false) => Scalar::Int(d.int_range().0),
            (ReduceOp::Min, false) => Scalar::Int(d.int_range().1),
        };
        self.konst(s, d, lanes)
    }

    fn fold(&mut self, op: ReduceOp, d: DType, lanes: usize, acc: Value, x: Value) -> Value {
        let b = match op {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        };
        self.binary(b, d, lanes, acc, x)
    }

    fn konst(&mut self, s: Scalar, d: DType, lanes: usize) -> Value {
        let scalar = match d {
            DType::F32 => self.b.ins().f32const(s.as_f64() as f32),
            DType::F64 => self.b.ins().f64const(s.as_f64()),
            DType::Bool if lanes > 1 => self.b.ins().iconst(types::I32, if s.as_f64() != 0.0 { -1 } else { 0 }),
            DType::Bool => self.b.ins().iconst(types::I8, (s.as_f64() != 0.0) as i64),
            DType::U8 => self.b.ins().iconst(types::I8, s.as_i64() as u8 as i64),
            DType::I32 => self.b.ins().iconst(types::I32, s.as_i64() as i32 as i64),
            DType::I64 => self.b.ins().iconst(types::I64, s.as_i64()),
        };
        if lanes > 1 { self.b.ins().splat(ty(d, lanes), scalar) } else { scalar }
    }

    /// The scalar value of an index expression, with the vectorized variable advanced by `lane`.
    fn iexpr(&mut self, e: &IExpr, lane: i64) -> Value {
        match e {
            IExpr::Var(v) => {
                let x = self.b.use_var(self.vars[*v]);
                if Some(*v) == self.vdim && lane != 0 { self.b.ins().iadd_imm_s(x, lane) } else { x }
            }
            IExpr::Const(c) => self.b.ins().iconst(types::I64, *c),
            IExpr::Add(ts) => {
                let mut acc: Option<Value> = None;
                for t in ts {
                    let v = self.iexpr(t, lane);
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.b.ins().iadd(a, v),
                    });
                }
                acc.unwrap_or_else(|| self.b.ins().iconst(types::I64, 0))
            }
            IExpr::Mul(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().imul_imm_s(x, *k)
            }
            // Index values are non-negative by construction, so unsigned division is floor division.
            IExpr::Div(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().udiv_imm_u(x, *k)
            }
            IExpr::Mod(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().urem_imm_u(x, *k)
            }
        }
    }

    /// A bool (i8 0/1) saying whether every range of `valid` holds at `lane`.
    fn valid(&mut self, valid: &Valid, lane: i64) -> Value {
        let mut ok = self.b.ins().iconst(types::I8, 1);
        for (e, lo, hi) in &valid.0 {
            let x = self.iexpr(e, lane);
            let a = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, x, *lo);
            let c = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, *hi);
            let both = self.b.ins().band(a, c);
            ok = self.b.ins().band(ok, both);
        }
        ok
    }

    /// A scalar element load of `buf[index]` at `lane`, honouring `valid` (the index is clamped to 0 and the
    /// value replaced by `fill` where invalid, so no load ever leaves the buffer).
    fn load_scalar(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lane: i64,
    ) -> Value {
        let mut i = self.iexpr(index, lane);
        let ok = valid.as_ref().map(|v| self.valid(v, lane));
        if let Some(ok) = ok {
            let zero = self.b.ins().iconst(types::I64, 0);
            i = self.b.ins().select(ok, i, zero);
        }
        let addr = self.b.ins().imul_imm_s(i, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.bases[buf], addr);
        let v = self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, 0);
        match ok {
            Some(ok) => {
                let f = self.konst(fill, d, 1);
                self.b.ins().select(ok, v, f)
            }
            None => v,
        }
    }

    fn load(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lanes: usize,
    ) -> Value {
        if self.k.inputs[buf].len == 0 {
            return self.konst(fill, d, lanes); // an empty buffer is never read; its pointer may dangle
        }
        if lanes == 1 {
            return self.load_scalar(buf, index, valid, fill, d, 0);
        }
        let vdim = self.vdim.expect("vector code has a vector dim");
        let coef = index.affine(self.vars.len()).map(|(c, _)| c[vdim]);
        match (coef, valid, d) {
            (Some(0), None, _) => {
                let s = self.load_scalar(buf, index, valid, fill, d, 0);
                self.lanes_from_scalars(&[s], d, lanes)
            }
            (Some(1), None, DType::F32 | DType::I32) => {
                let i = self.iexpr(index, 0);
                let addr = self.b.ins().imul_imm_s(i, 4);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                self.b.ins().load(ty(d, lanes), vector_flags(), addr, 0)
            }
            _ => {
                let scalars: Vec<Value> =
                    (0..lanes as i64).map(|l| self.load_scalar(buf, index, valid, fill, d, l)).collect();
                self.lanes_from_scalars(&scalars, d, lanes)
            }
        }
    }

    /// Builds a vector from one scalar (splat) or one scalar per lane; bool bytes become lane masks.
    fn lanes_from_scalars(&mut self, scalars: &[Value], d: DType, lanes: usize) -> Value {
        let conv = |s: &mut Self, v: Value| -> Value {
            if d == DType::Bool {
                let w = s.b.ins().uextend(types::I32, v);
                s.b.ins().ineg(w)
            } else {
                v
            }
        };
        let vt = ty(d, lanes);
        if let [one] = scalars {
            let v = conv(self, *one);
            return self.b.ins().splat(vt, v);
        }
        let first = conv(self, scalars[0]);
        let mut vec = self.b.ins().splat(vt, first);
        for (l, &s) in scalars.iter().enumerate().skip(1) {
            let v = conv(self, s);
            vec = self.b.ins().insertlane(vec, v, l as u8);
        }
        vec
    }

    fn store(&mut self, v: Value, lanes: usize) {
        let d = self.k.output.dtype;
        let o = self.b.use_var(self.oidx);
        let addr = self.b.ins().imul_imm_s(o, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.out_ptr, addr);
        match (d, lanes) {
            (_, 1) => {
                self.b.ins().store(MemFlagsData::trusted(), v, addr, 0);
            }
            (DType::Bool, _) => {
                for l in 0..lanes {
                    let x = self.b.ins().extractlane(v, l as u8);
                    let x = self.b.ins().band_imm_s(x, 1);
                    self.b.ins().istore8(MemFlagsData::trusted(), x, addr, l as i32);
                }
            }
            _ => {
                self.b.ins().store(vector_flags(), v, addr, 0);
            }
        }
    }

    fn libcall(&mut self, l: Libcall, args: &[Value]) -> Value {
        let f = match self.libcalls.get(&l) {
            Some(&f) => f,
            None => {
                let sig = self.b.import_signature(l.signature(self.call_conv));
                let name = self.b.func.declare_imported_user_function(UserExternalName::new(0, l.index()));
                let f = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature: sig,
                    colocated: false,
                    patchable: false,
                });
                self.libcalls.insert(l, f);
                f
            }
        };
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// Applies a scalar operation lane by lane (for ops with no vector instruction).
    fn per_lane(
        &mut self,
        args: &[Value],
        arg_d: DType,
        out_d: DType,
        lanes: usize,
        f: impl Fn(&mut Self, &[Value]) -> Value,
    ) -> Value {
        if lanes == 1 {
            return f(self, args);
        }
        let mut out = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let xs: Vec<Value> = args
                .iter()
                .map(|&a| {
                    let x = self.b.ins().extractlane(a, l as u8);
                    if arg_d == DType::Bool { self.b.ins().ireduce(types::I8, x) } else { x }
                })
                .collect();
            out.push(f(self, &xs));
        }
        let out: Vec<Value> =
            out.into_iter().map(|v| if out_d == DType::Bool { self.b.ins().band_imm_s(v, 1) } else { v }).collect();
        self.lanes_from_scalars(&out, out_d, lanes)
    }

    fn insts(&mut self, insts: &[Inst], lanes: usize, acc: Option<Value>) -> Vec<Value> {
        let mut vals: Vec<Value> = Vec::with_capacity(insts.len());
        let mut dtypes: Vec<DType> = Vec::with_capacity(insts.len());
        for inst in insts {
            let d = inst.dtype;
            let v = match &inst.op {
                InstOp::Const(s) => self.konst(*s, d, lanes),
                InstOp::Index(e) => {
                    debug_assert_eq!(lanes, 1, "index values are scalar-only");
                    let x = self.iexpr(e, 0);
                    self.int_resize(x, DType::I64, d)
                }
                InstOp::Load { buf, index, valid, fill } => self.load(*buf, index, valid, *fill, d, lanes),
                InstOp::Rand { dist, slot, index } => {
                    let i = self.iexpr(index, 0);
                    let seed = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16) as i32);
                    let off = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16 + 8) as i32);
                    let i = self.b.ins().iadd(off, i);
                    match (dist, d) {
                        (RandDist::Uniform, DType::F32) => self.libcall(Libcall::UniformF32, &[seed, i]),
                        (RandDist::Uniform, _) => self.libcall(Libcall::UniformF64, &[seed, i]),
                        (RandDist::Normal, DType::F32) => {
                            let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                            self.b.ins().fdemote(types::F32, x)
                        }
                        (RandDist::Normal, _) => self.libcall(Libcall::NormalF64, &[seed, i]),
                    }
                }
                InstOp::Unary(u, a) => self.unary(*u, d, lanes, vals[*a]),
                InstOp::Binary(op, x, y) => {
                    let od = dtypes[*x];
                    self.binary(*op, od, lanes, vals[*x], vals[*y])
                }
                InstOp::Where(c, a, b) => {
                    if lanes == 1 {
                        self.b.ins().select(vals[*c], vals[*a], vals[*b])
                    } else {
                        let mask = if d == DType::F32 {
                            self.b.ins().bitcast(
                                types::F32X4,
                                MemFlagsData::new().with_endianness(Endianness::Little),
                                vals[*c],
                            )
                        } else {
                            vals[*c]
                        };
                        self.b.ins().bitselect(mask, vals[*a], vals[*b])
                    }
                }
                InstOp::Cast(a) => self.cast(dtypes[*a], d, lanes, vals[*a]),
                InstOp::Acc => acc.expect("acc only in reduce kernels"),
            };
            vals.push(v);
            dtypes.push(d);
        }
        vals
    }

    fn unary(&mut self, u: UnaryOp, d: DType, lanes: usize, a: Value) -> Value {
        if let Some(l) = Libcall::unary(u, d) {
            return self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
        }
        let ins = self.b.ins();
        match (u, d.is_float()) {
            (UnaryOp::Neg, true) => ins.fneg(a),
            (UnaryOp::Neg, false) => ins.ineg(a),
            (UnaryOp::Abs, true) => ins.fabs(a),
            (UnaryOp::Abs, false) => ins.iabs(a),
            (UnaryOp::Sqrt, _) => ins.sqrt(a),
            (UnaryOp::Recip, _) => {
                let one = self.konst(Scalar::Float(1.0), d, lanes);
                self.b.ins().fdiv(one, a)
            }
            (UnaryOp::Not, _) if lanes == 1 => ins.bxor_imm_s(a, 1),
            (UnaryOp::Not, _) => ins.bnot(a),
            (op, _) => unreachable!("unary {op:?} on {d}"),
        }
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    fn binary(&mut self, op: BinaryOp, d: DType, lanes: usize, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        let unsigned = matches!(d, DType::U8 | DType::Bool);
        if d.is_float() {
            let cmp = |cc| -> Option<FloatCC> { Some(cc) };
            let cc = match op {
                Lt => cmp(FloatCC::LessThan),
                Le => cmp(FloatCC::LessThanOrEqual),
                Eq => cmp(FloatCC::Equal),
                Ne => cmp(FloatCC::NotEqual),
                _ => None,
            };
            if let Some(cc) = cc {
                return self.b.ins().fcmp(cc, x, y);
            }
            return match op {
                Add => self.b.ins().fadd(x, y),
                Sub => self.b.ins().fsub(x, y),
                Mul => self.b.ins().fmul(x, y),
                Div => self.b.ins().fdiv(x, y),
                Max => self.b.ins().fmax(x, y),
                Min => self.b.ins().fmin(x, y),
                Pow => {
                    let l = if d == DType::F64 { Libcall::PowF64 } else { Libcall::PowF32 };
                    self.per_lane(&[x, y], d, d, lanes, |s, a| s.libcall(l, a))
                }
                And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on floats"),
            };
        }
        let cc = match op {
            Lt if unsigned => Some(IntCC::UnsignedLessThan),
            Le if unsigned => Some(IntCC::UnsignedLessThanOrEqual),
            Lt => Some(IntCC::SignedLessThan),
            Le => Some(IntCC::SignedLessThanOrEqual),
            Eq => Some(IntCC::Equal),
            Ne => Some(IntCC::NotEqual),
            _ => None,
        };
        if let Some(cc) = cc {
            // Vector compares give lane masks, scalar compares 0/1 bytes: both are this backend's bools.
            return self.b.ins().icmp(cc, x, y);
        }
        let is_bool = d == DType::Bool;
        match op {
            Add | Or if is_bool => self.b.ins().bor(x, y),
            Mul | And if is_bool => self.b.ins().band(x, y),
            Max if is_bool => self.b.ins().bor(x, y),
            Min if is_bool => self.b.ins().band(x, y),
            Add => self.b.ins().iadd(x, y),
            Sub => self.b.ins().isub(x, y),
            Mul => self.b.ins().imul(x, y),
            Max if unsigned => self.b.ins().umax(x, y),
            Min if unsigned => self.b.ins().umin(x, y),
            Max => self.b.ins().smax(x, y),
            Min => self.b.ins().smin(x, y),
            Div => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned)),
            Pow => self.per_lane(&[x, y], d, d, lanes, |s, a| {
                let wide = [s.int_resize(a[0], d, DType::I64), s.int_resize(a[1], d, DType::I64)];
                let r = s.libcall(Libcall::PowI64, &wide);
                s.int_resize(r, DType::I64, d)
            }),
            And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on {d}"),
        }
    }

    /// Integer division that never traps: x / 0 == 0 and MIN / -1 wraps to MIN.
    fn safe_div(&mut self, x: Value, y: Value, unsigned: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let zero = self.b.ins().iconst(t, 0);
        let one = self.b.ins().iconst(t, 1);
        let is_zero = self.b.ins().icmp(IntCC::Equal, y, zero);
        let safe = self.b.ins().select(is_zero, one, y);
        if unsigned {
            let q = self.b.ins().udiv(x, safe);
            return self.b.ins().select(is_zero, zero, q);
        }
        let is_neg_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
        let safe = self.b.ins().select(is_neg_one, one, safe);
        let q = self.b.ins().sdiv(x, safe);
        let neg = self.b.ins().ineg(x);
        let q = self.b.ins().select(is_neg_one, neg, q);
        self.b.ins().select(is_zero, zero, q)
    }

    /// Converts a scalar integer between int dtypes (wrapping when narrowing; bool means != 0).
    fn int_resize(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        if to == DType::Bool {
            return self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0);
        }
        let (ft, tt) = (ty(from, 1), ty(to, 1));
        if ft.bits() == tt.bits() {
            v
        } else if ft.bits() > tt.bits() {
            self.b.ins().ireduce(tt, v)
        } else if matches!(from, DType::U8 | DType::Bool) {
            self.b.ins().uextend(tt, v)
        } else {
            self.b.ins().sextend(tt, v)
        }
    }

    fn cast(&mut self, from: DType, to: DType, lanes: usize, v: Value) -> Value {
        if from == to {
            return v;
        }
        if lanes > 1 {
            return match (from, to) {
                (DType::I32, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, v),
                (DType::Bool, DType::F32) => {
                    let (one, zero) =
                        (self.konst(Scalar::Float(1.0), to, lanes), self.konst(Scalar::Float(0.0), to, lanes));
                    let m =
                        self.b.ins().bitcast(types::F32X4, MemFlagsData::new().with_endianness(Endianness::Little), v);
                    self.b.ins().bitselect(m, one, zero)
                }
                (DType::Bool, DType::I32) => {
                    let one = self.konst(Scalar::Int(1), to, lanes);
                    self.b.ins().band(v, one)
                }
                (DType::F32, DType::Bool) => {
                    let zero = self.konst(Scalar::Float(0.0), from, lanes);
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                }
                (DType::I32, DType::Bool) => {
                    let zero = self.konst(Scalar::Int(0), from, lanes);
                    self.b.ins().icmp(IntCC::NotEqual, v, zero)
                }
                // float -> int saturates through i64 then wraps; do it lane by lane to match the spec exactly.
                _ => self.per_lane(&[v], from, to, lanes, |s, x| s.cast(from, to, 1, x[0])),
            };
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if to == DType::F64 {
                    self.b.ins().fpromote(types::F64, v)
                } else {
                    self.b.ins().fdemote(types::F32, v)
                }
            }
            (true, false) if to == DType::Bool => {
                let zero = self.konst(Scalar::Float(0.0), from, 1);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (true, false) => {
                let wide = self.b.ins().fcvt_to_sint_sat(types::I64, v);
                self.int_resize(wide, DType::I64, to)
            }
            (false, true) => {
                let t = ty(to, 1);
                if matches!(from, DType::U8 | DType::Bool) {
                    self.b.ins().fcvt_from_uint(t, v)
                } else {
                    self.b.ins().fcvt_from_sint(t, v)
                }
            }
            (false, false) => self.int_resize(v, from, to),
        }
    }
}
