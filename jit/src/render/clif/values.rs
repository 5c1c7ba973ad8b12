//! The code of each kernel IR instruction, written once for any lane count: libcalls, per-lane fallbacks, the
//! instruction dispatch, and the unary / binary / cast table (constants, indices, loads and stores: `access.rs`).

use super::access::Gathered;
use super::*;

impl Emitter<'_> {
    pub(super) fn libcall(&mut self, l: Libcall, args: &[Value]) -> Value {
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
    pub(super) fn per_lane(
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
                    if arg_d == DType::Bool {
                        // A lane mask (all ones or zero) becomes this backend's scalar bool (1 or 0).
                        let b = self.b.ins().ireduce(types::I8, x);
                        self.b.ins().band_imm_s(b, 1)
                    } else {
                        x
                    }
                })
                .collect();
            out.push(f(self, &xs));
        }
        let out: Vec<Value> =
            out.into_iter().map(|v| if out_d == DType::Bool { self.b.ins().band_imm_s(v, 1) } else { v }).collect();
        self.lanes_from_scalars(&out, out_d, lanes)
    }

    /// Emits `insts` for every element of a `rows` x `vecs` tile. Returns, per instruction, its value for each
    /// element (row-major in the tile). An instruction that does not depend on the row (or column) is emitted once
    /// and its value shared along that axis. `accs` holds each element's finished reduction.
    pub(super) fn tile_insts(
        &mut self,
        insts: &[Inst],
        deps: &[(bool, bool)],
        rows: usize,
        vecs: usize,
        lanes: usize,
        accs: &[Value],
    ) -> Vec<Vec<Value>> {
        let n = rows * vecs;
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(insts.len());
        for (i, inst) in insts.iter().enumerate() {
            let (dr, dc) = deps[i];
            let mut per: Vec<Value> = Vec::with_capacity(n);
            for e in 0..n {
                let (r, c) = (e / vecs, e % vecs);
                // The element whose value this one shares (itself if it depends on both axes).
                let owner = if dr { r } else { 0 } * vecs + if dc { c } else { 0 };
                if owner != e {
                    per.push(per[owner]);
                    continue;
                }
                self.at = (r as i64, (c * lanes) as i64);
                // A value that does not vary along the vector lanes is computed once, as a scalar.
                // (Along a vectorized reduce loop only values without lanes are: a gather's i64 index.)
                let l = if lanes > 1 && !dc && (!self.reduce_vec || !has_lanes(inst.dtype)) { 1 } else { lanes };
                let key = inst as *const Inst;
                let v = if let Some(&u) = self.uniform_insts.get(&key).or_else(|| self.row_insts.get(&key)) {
                    u
                } else {
                    match self.hoisted_load(i, inst.dtype, l) {
                        Some(v) if matches!(inst.op, InstOp::Load { .. }) => v,
                        _ => self.inst(inst, insts, &vals, e, l, accs.get(e).copied()),
                    }
                };
                per.push(v);
            }
            vals.push(per);
        }
        self.at = (0, 0);
        vals
    }

    /// One instruction for tile element `e` (at `self.at`); operands come from `vals[..][e]`.
    pub(super) fn inst(
        &mut self,
        inst: &Inst,
        insts: &[Inst],
        vals: &[Vec<Value>],
        e: usize,
        lanes: usize,
        acc: Option<Value>,
    ) -> Value {
        let d = inst.dtype;
        let operands: Vec<usize> = match &inst.op {
            // The index is read as it is: one scalar for every lane where it does not vary along the vector (an
            // embedding's row), lanes otherwise (an i64 index has no vector form, so it is never splatted).
            InstOp::Gather { .. } => Vec::new(),
            _ => inst.operands(),
        };
        let mut ready: Vec<(usize, Value)> = Vec::with_capacity(operands.len());
        for &i in &operands {
            let v = self.vector_of(vals[i][e], insts[i].dtype, lanes);
            ready.push((i, v));
        }
        let val = |i: usize| ready.iter().find(|(j, _)| *j == i).map_or(vals[i][e], |&(_, v)| v);
        match &inst.op {
            InstOp::Const(s) => self.konst(*s, d, lanes),
            InstOp::Index(x) => {
                // A 32-bit index has lanes (an iota along a vectorized loop): lane 0's value plus the lane times
                // its step where it is affine in the vectorized variable, else one scalar per lane.
                let affine = x.affine(self.vars.len()).zip(self.col_dim).map(|((coef, _), col)| coef[col]);
                if let (true, Some(step)) = (lanes > 1, affine) {
                    let v0 = self.iexpr(x, 0);
                    let v0 = self.int_resize(v0, DType::I64, d);
                    let base = self.b.ins().splat(ty(d, lanes), v0);
                    let bytes: Vec<u8> = (0..lanes as i64).flat_map(|l| ((step * l) as i32).to_le_bytes()).collect();
                    let offsets = self.b.func.dfg.constants.insert(bytes.into());
                    let offsets = self.b.ins().vconst(ty(d, lanes), offsets);
                    return self.b.ins().iadd(base, offsets);
                }
                let scalars: Vec<Value> = (0..lanes as i64)
                    .map(|l| {
                        let v = self.iexpr(x, l);
                        self.int_resize(v, DType::I64, d)
                    })
                    .collect();
                if lanes == 1 { scalars[0] } else { self.lanes_from_scalars(&scalars, d, lanes) }
            }
            InstOp::Load { buf, index, valid, fill } => self.load(*buf, index, valid, *fill, d, lanes),
            InstOp::Gather { buf, base, index, stride, len, valid } => {
                let at = Gathered { buf: *buf, base, stride: *stride, len: *len, valid };
                self.gather(at, vals[*index][e], insts[*index].dtype, d, lanes)
            }
            InstOp::Rand { dist, slot, index } => {
                let i = self.iexpr(index, 0);
                let seed = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16) as i32);
                let off = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16 + 8) as i32);
                let i = self.b.ins().iadd(off, i);
                match (dist, d) {
                    (RandDist::Uniform, DType::F32) => self.libcall(Libcall::UniformF32, &[seed, i]),
                    (RandDist::Uniform, DType::F16) => self.libcall(Libcall::UniformF16, &[seed, i]),
                    (RandDist::Normal, DType::F16) => self.libcall(Libcall::NormalF16, &[seed, i]),
                    (RandDist::Uniform, DType::BF16) => self.libcall(Libcall::UniformBF16, &[seed, i]),
                    (RandDist::Normal, DType::BF16) => {
                        // As the interpreter: the f64 normal through f32 to bf16 (`dtype::bf16_from_f64`).
                        let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                        let x = self.b.ins().fdemote(types::F32, x);
                        self.round_half(DType::BF16, x, 1)
                    }
                    (RandDist::Uniform, _) => self.libcall(Libcall::UniformF64, &[seed, i]),
                    (RandDist::Normal, DType::F32) => {
                        let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                        self.b.ins().fdemote(types::F32, x)
                    }
                    (RandDist::Normal, _) => self.libcall(Libcall::NormalF64, &[seed, i]),
                }
            }
            InstOp::Unary(u, a) => self.unary(*u, d, lanes, val(*a)),
            InstOp::Binary(op, x, y) => self.binary(*op, insts[*x].dtype, lanes, val(*x), val(*y)),
            InstOp::Where(c, a, b) => {
                if lanes == 1 {
                    self.b.ins().select(val(*c), val(*a), val(*b))
                } else {
                    let mask = if ty(d, lanes) == types::F32X4 {
                        let little = MemFlagsData::new().with_endianness(Endianness::Little);
                        self.b.ins().bitcast(types::F32X4, little, val(*c))
                    } else {
                        val(*c)
                    };
                    self.b.ins().bitselect(mask, val(*a), val(*b))
                }
            }
            InstOp::Cast(a) => self.cast(insts[*a].dtype, d, lanes, val(*a)),
            InstOp::Acc => acc.expect("acc only in reduce kernels"),
            InstOp::RowAcc(j) => {
                let v = self.row_accs[*j];
                if lanes > 1 { self.vector_of(v, d, lanes) } else { v }
            }
        }
    }

    pub(super) fn unary(&mut self, u: UnaryOp, d: DType, lanes: usize, a: Value) -> Value {
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (negation and abs are exact).
            let r = self.unary(u, DType::F32, lanes, a);
            return if matches!(u, UnaryOp::Neg | UnaryOp::Abs) { r } else { self.round_half(d, r, lanes) };
        }
        if let Some(l) = Libcall::unary(u, d) {
            if matches!(u, UnaryOp::Log1p | UnaryOp::Expm1) {
                // No vector form: libm's, a lane at a time (the evaluator's value, bit for bit).
                return self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
            }
            return self.transcendental(u, l, d, lanes, a);
        }
        let ins = self.b.ins();
        match (u, d.is_float()) {
            (UnaryOp::Neg, true) => ins.fneg(a),
            (UnaryOp::Neg, false) => ins.ineg(a),
            (UnaryOp::Abs, true) => ins.fabs(a),
            (UnaryOp::Abs, false) if d.is_unsigned() => a, // iabs would read the bits as signed
            (UnaryOp::Abs, false) => ins.iabs(a),
            (UnaryOp::Sqrt, _) => ins.sqrt(a),
            // Floats only (the graph refuses them on ints); `nearest` rounds ties to even.
            (UnaryOp::Floor, _) => ins.floor(a),
            (UnaryOp::Ceil, _) => ins.ceil(a),
            (UnaryOp::Round, _) => ins.nearest(a),
            (UnaryOp::Trunc, _) => ins.trunc(a),
            (UnaryOp::Recip, _) => {
                let one = self.konst(Scalar::Float(1.0), d, lanes);
                self.b.ins().fdiv(one, a)
            }
            (UnaryOp::Not, _) if lanes == 1 => ins.bxor_imm_s(a, 1),
            (UnaryOp::Not, _) => ins.bnot(a),
            // Transcendentals took the libcall path above (floats only; an integer one is refused at the op).
            (
                op @ (UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Log1p
                | UnaryOp::Expm1),
                _,
            ) => {
                unreachable!("unary {op:?} on {d}")
            }
        }
    }

    /// exp/log/sin/cos/tanh inline from `clif_math` (the same polynomial in vector and scalar code, so an element's
    /// value does not depend on whether it fell in a vector body or a tail). sin/cos beyond the range where the
    /// reduction is accurate branch to the libcall for the whole vector; that branch is never taken in practice.
    pub(super) fn transcendental(&mut self, u: UnaryOp, l: Libcall, d: DType, lanes: usize, a: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        let f = match u {
            UnaryOp::Exp => clif_math::MathFn::Exp,
            UnaryOp::Log => clif_math::MathFn::Log,
            UnaryOp::Sin => clif_math::MathFn::Sin,
            UnaryOp::Cos => clif_math::MathFn::Cos,
            UnaryOp::Tanh => clif_math::MathFn::Tanh,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Not
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Trunc
            | UnaryOp::Log1p
            | UnaryOp::Expm1 => unreachable!("{u:?} is not one of clif_math's"),
        };
        let fast = clif_math::emit(f, &mut self.b, a, t, self.fma);
        if !matches!(u, UnaryOp::Sin | UnaryOp::Cos) {
            return fast;
        }
        let max = if d == DType::F64 { clif_math::F64_TRIG_MAX_ARG } else { clif_math::F32_TRIG_MAX_ARG };
        let limit = self.konst(Scalar::Float(max), d, lanes);
        let abs = self.b.ins().fabs(a);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, abs, limit);
        let any = if lanes > 1 { self.b.ins().vany_true(big) } else { big };
        let slow_block = self.b.create_block();
        let merge = self.b.create_block();
        let result = self.b.append_block_param(merge, t);
        self.b.ins().brif(any, slow_block, &[], merge, &[fast.into()]);
        self.b.switch_to_block(slow_block);
        self.b.seal_block(slow_block);
        let slow = self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
        self.b.ins().jump(merge, &[slow.into()]);
        self.b.switch_to_block(merge);
        self.b.seal_block(merge);
        result
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    pub(super) fn binary(&mut self, op: BinaryOp, d: DType, lanes: usize, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (comparisons, max and min are exact).
            let r = self.binary(op, DType::F32, lanes, x, y);
            return if op.is_comparison() || matches!(op, Max | Min) { r } else { self.round_half(d, r, lanes) };
        }
        let unsigned = d.is_unsigned();
        if d.is_float() {
            let cmp = |cc| -> Option<FloatCC> { Some(cc) };
            let cc = match op {
                Lt => cmp(FloatCC::LessThan),
                Le => cmp(FloatCC::LessThanOrEqual),
                Eq => cmp(FloatCC::Equal),
                Ne => cmp(FloatCC::NotEqual),
                Add | Sub | Mul | Div | Rem | Max | Min | Pow | And | Or => None,
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
                Rem => {
                    let l = if d == DType::F64 { Libcall::FmodF64 } else { Libcall::FmodF32 };
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
            Add | Sub | Mul | Div | Rem | Max | Min | Pow | And | Or => None,
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
            Div => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned, false)),
            Rem => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned, true)),
            Pow => self.per_lane(&[x, y], d, d, lanes, |s, a| {
                let wide = [s.int_resize(a[0], d, DType::I64), s.int_resize(a[1], d, DType::I64)];
                let r = s.libcall(Libcall::PowI64, &wide);
                s.int_resize(r, DType::I64, d)
            }),
            And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on {d}"),
        }
    }

    /// Integer division (or, with `rem`, remainder) that never traps: x / 0 == x % 0 == 0, MIN / -1 wraps to MIN
    /// and MIN % -1 is 0 (the divisor is made 1 where it is 0 or -1, and those cases selected after).
    pub(super) fn safe_div(&mut self, x: Value, y: Value, unsigned: bool, rem: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let zero = self.b.ins().iconst(t, 0);
        let one = self.b.ins().iconst(t, 1);
        let is_zero = self.b.ins().icmp(IntCC::Equal, y, zero);
        let safe = self.b.ins().select(is_zero, one, y);
        let r = match (unsigned, rem) {
            (true, false) => self.b.ins().udiv(x, safe),
            (true, true) => self.b.ins().urem(x, safe),
            (false, _) => {
                let is_neg_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let safe = self.b.ins().select(is_neg_one, one, safe);
                if rem {
                    // x % 1 is 0, as x % -1 must be.
                    self.b.ins().srem(x, safe)
                } else {
                    let q = self.b.ins().sdiv(x, safe);
                    let neg = self.b.ins().ineg(x);
                    self.b.ins().select(is_neg_one, neg, q)
                }
            }
        };
        self.b.ins().select(is_zero, zero, r)
    }

    /// Converts a scalar integer between int dtypes (wrapping when narrowing; bool means != 0).
    pub(super) fn int_resize(&mut self, v: Value, from: DType, to: DType) -> Value {
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
        } else if from.is_unsigned() {
            self.b.ins().uextend(tt, v)
        } else {
            self.b.ins().sextend(tt, v)
        }
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, lanes: usize, v: Value) -> Value {
        if from == to {
            return v;
        }
        // f16 and bf16 are f32s in registers: widening is free, narrowing is a rounding. An int converts to f32
        // first: exact below 2^24, and anything larger is inf in f16 either way, so the double rounding is
        // innocuous there (for bf16 it is PyTorch's conversion).
        match (from, to) {
            (DType::F16, DType::F32) => return v,
            (DType::F16, _) => return self.cast(DType::F32, to, lanes, v),
            (DType::F64, DType::F16) => {
                return self.per_lane(&[v], from, to, lanes, |s, x| s.libcall(Libcall::F64ToF16, x));
            }
            (_, DType::F16) => {
                let f = self.cast(from, DType::F32, lanes, v);
                return self.round_half(DType::F16, f, lanes);
            }
            // bf16 likewise; every source, f64 included, goes through f32 first, as PyTorch converts.
            (DType::BF16, DType::F32) => return v,
            (DType::BF16, _) => return self.cast(DType::F32, to, lanes, v),
            (_, DType::BF16) => {
                let f = self.cast(from, DType::F32, lanes, v);
                return self.round_half(DType::BF16, f, lanes);
            }
            _ => {}
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
                (DType::Bool, DType::I32 | DType::U32) => {
                    let one = self.konst(Scalar::Int(1), to, lanes);
                    self.b.ins().band(v, one)
                }
                // Same lane width, same bits: the wrapping conversion of eval.
                (DType::I32, DType::U32) | (DType::U32, DType::I32) => v,
                (DType::F32, DType::Bool) => {
                    let zero = self.konst(Scalar::Float(0.0), from, lanes);
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                }
                (DType::I32 | DType::U32, DType::Bool) => {
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
                if from.is_unsigned() { self.b.ins().fcvt_from_uint(t, v) } else { self.b.ins().fcvt_from_sint(t, v) }
            }
            (false, false) => self.int_resize(v, from, to),
        }
    }
}
