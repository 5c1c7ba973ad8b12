//! The code of each kernel IR instruction as an expression: constants, index arithmetic, guarded loads, random
//! numbers, and the unary / binary / cast table with `kernel::eval`'s semantics. Where a target's builtin differs
//! from them, the entry calls a helper (`helpers.rs`) instead and says why; the spelling of types, literals,
//! conversions and builtins is the dialect's.

use super::{Builtin, Dialect, Emitter, Helper};
use crate::dtype::{DType, Scalar};
use crate::kernel::{IExpr, Inst, InstOp, Valid};
use crate::op::{BinaryOp, RandDist, UnaryOp};

/// A constant of dtype `d`, in `d`'s computed dtype (an f16 constant is its f16 value as an f32).
pub fn konst<D: Dialect>(dl: &D, s: Scalar, d: DType) -> String {
    match dl.compute_dtype(d) {
        c @ (DType::F32 | DType::F64) => dl.float_lit(s.as_f64(), c),
        DType::F16 => dl.float_lit(half::f16::from_f64(s.as_f64()).to_f64(), DType::F32),
        DType::BF16 => dl.float_lit(crate::dtype::bf16_from_f64(s.as_f64()).to_f64(), DType::F32),
        DType::Bool => dl.bool_lit(s.as_f64() != 0.0),
        c @ (DType::U8 | DType::U32 | DType::I32 | DType::I64) => dl.int_lit(s.as_i64(), c),
    }
}

/// An index expression over the loop variables `i<n>`, in the dialect's index dtype (the dialect's `check` proves
/// every sub-expression fits it).
pub fn iexpr<D: Dialect>(dl: &D, e: &IExpr) -> String {
    let lit = |x: i64| dl.int_lit(x, dl.index_dtype());
    match e {
        IExpr::Var(v) => format!("i{v}"),
        IExpr::Const(c) => lit(*c),
        IExpr::Add(ts) if ts.is_empty() => lit(0),
        IExpr::Add(ts) => format!("({})", ts.iter().map(|t| iexpr(dl, t)).collect::<Vec<_>>().join(" + ")),
        IExpr::Mul(x, k) => format!("({} * {})", iexpr(dl, x), lit(*k)),
        // Index values are non-negative where they are divided, so truncating division is floor division.
        IExpr::Div(x, k) => format!("({} / {})", iexpr(dl, x), lit(*k)),
        IExpr::Mod(x, k) => format!("({} % {})", iexpr(dl, x), lit(*k)),
        // What it stands for (lowering removes wraps; see `IExpr::Wrap`).
        IExpr::Wrap(x, _) => iexpr(dl, x),
    }
}

/// A bool expression: every range of `valid` holds.
fn valid_expr<D: Dialect>(dl: &D, v: &Valid) -> String {
    if v.0.is_empty() {
        return dl.bool_lit(true);
    }
    let lit = |x: i64| dl.int_lit(x, dl.index_dtype());
    v.0.iter()
        .map(|(e, lo, hi)| {
            let x = iexpr(dl, e);
            format!("({x} >= {} && {x} < {})", lit(*lo), lit(*hi))
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

impl<D: Dialect> Emitter<'_, D> {
    /// One instruction as an expression; operands are named `<prefix><index>`.
    pub fn inst(&mut self, inst: &Inst, insts: &[Inst], prefix: &str) -> String {
        let dl = self.d;
        let d = dl.compute_dtype(inst.dtype);
        let v = |i: &usize| format!("{prefix}{i}");
        match &inst.op {
            InstOp::Const(s) => konst(dl, *s, d),
            InstOp::Index(e) => self.cast(dl.index_dtype(), d, &iexpr(dl, e)),
            InstOp::Load { buf, index, valid, fill } => {
                if self.k.inputs[*buf].len == 0 {
                    return konst(dl, *fill, d); // an empty buffer is never read
                }
                let name = if self.aliased.contains(buf) { "out".to_string() } else { format!("in{buf}") };
                match valid {
                    None => dl.load_word(d, &format!("{name}[{}]", iexpr(dl, index))),
                    Some(va) => {
                        // The index is clamped to 0 where invalid, so no read ever leaves the buffer.
                        let ok = valid_expr(dl, va);
                        let zero = dl.int_lit(0, dl.index_dtype());
                        let word = format!("{name}[{}]", dl.select(&zero, &iexpr(dl, index), &ok));
                        dl.select(&konst(dl, *fill, d), &dl.load_word(d, &word), &ok)
                    }
                }
            }
            InstOp::Gather { buf, base, index, stride, len, valid } => {
                let ok = valid.as_ref().map_or(dl.bool_lit(true), |va| valid_expr(dl, va));
                let i = self.cast(insts[*index].dtype, dl.index_dtype(), &v(index));
                let lit = |x: i64| dl.int_lit(x, dl.index_dtype());
                let checked = self.helper(Helper::IndexCheck, format!("kiln_checked({i}, {}, {ok})", lit(*len)));
                let zero = konst(dl, Scalar::Int(0), d);
                if self.k.inputs[*buf].len == 0 {
                    // Nothing to read (every index faults), but the check must run.
                    return dl.select(&zero, &zero, &format!("({checked} == {})", lit(0)));
                }
                let name = if self.aliased.contains(buf) { "out".to_string() } else { format!("in{buf}") };
                let word = format!("{name}[({} + {checked} * {})]", iexpr(dl, base), lit(*stride));
                let value = dl.load_word(d, &word);
                if valid.is_some() { dl.select(&zero, &value, &ok) } else { value }
            }
            InstOp::Rand { dist, slot, index } => {
                self.uses_rng = true;
                self.helpers.insert(Helper::Philox);
                let words = dl.rand_words(*slot, &iexpr(dl, index));
                match (dist, d) {
                    (RandDist::Uniform, DType::F16) => format!("kiln_uniform_f16({words})"),
                    (RandDist::Uniform, DType::BF16) => format!("kiln_uniform_bf16({words})"),
                    // 53 bits, as rng::uniform_f64 (a dialect computing in f64 has it).
                    (RandDist::Uniform, DType::F64) => format!("kiln_uniform_f64({words})"),
                    (RandDist::Uniform, _) => format!("kiln_uniform({words})"),
                    (RandDist::Normal, _) => {
                        self.helpers.insert(Helper::Normal);
                        match d {
                            DType::F64 => format!("kiln_normal_f64({words})"),
                            DType::F16 | DType::BF16 => self.round_half(d, format!("kiln_normal({words})")),
                            _ => format!("kiln_normal({words})"),
                        }
                    }
                }
            }
            InstOp::Unary(u, a) => self.unary(*u, d, &v(a)),
            InstOp::Binary(op, x, y) => self.binary(*op, insts[*x].dtype, &v(x), &v(y)),
            InstOp::Where(c, a, b) => dl.select(&v(b), &v(a), &v(c)),
            InstOp::Cast(a) => self.cast(insts[*a].dtype, d, &v(a)),
            InstOp::Acc => "acc".into(),
            InstOp::RowAcc(j) => format!("row{j}"),
        }
    }

    /// `u` on a value of dtype `d`.
    pub fn unary(&mut self, u: UnaryOp, d: DType, a: &str) -> String {
        let dl = self.d;
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (negation and abs are exact).
            let r = self.unary(u, DType::F32, a);
            return if matches!(u, UnaryOp::Neg | UnaryOp::Abs) { r } else { self.round_half(d, r) };
        }
        let d = dl.compute_dtype(d);
        let call = |f: Builtin| format!("{}({a})", dl.builtin(f, d));
        // The f64 rows are the f32 rows in f64: the same helper names, which a dialect with f64 overloads.
        let float = matches!(d, DType::F32 | DType::F64);
        match (u, d) {
            (UnaryOp::Neg, DType::F32 | DType::F64 | DType::I32 | DType::I64) => format!("(-{a})"), // ints wrap
            (UnaryOp::Neg, DType::U8) => format!("((0u - {a}) & 0xffu)"),
            (UnaryOp::Neg, DType::U32) => format!("(0u - {a})"),
            (UnaryOp::Neg | UnaryOp::Abs, DType::Bool) => a.to_string(), // -1 and 1 are both true
            (UnaryOp::Abs, DType::U8 | DType::U32) => a.to_string(),
            (UnaryOp::Abs, _) => call(Builtin::Abs), // abs(i32::MIN) wraps to itself, as in eval
            (UnaryOp::Exp, _) if float => call(Builtin::Exp),
            (UnaryOp::Log, _) if float => call(Builtin::Log),
            (UnaryOp::Sin, _) if float => self.helper(Helper::Trig, format!("kiln_sin({a})")),
            (UnaryOp::Cos, _) if float => self.helper(Helper::Trig, format!("kiln_cos({a})")),
            // A builtin tanh may lose NaN (Mesa's GL driver gave -1) and is accurate only in absolute terms near 0.
            (UnaryOp::Tanh, _) if float => self.helper(Helper::Tanh, format!("kiln_tanh({a})")),
            (UnaryOp::Log1p, _) if float => self.helper(Helper::Log1p, format!("kiln_log1p({a})")),
            (UnaryOp::Expm1, _) if float => self.helper(Helper::Expm1, format!("kiln_expm1({a})")),
            (UnaryOp::Sqrt, _) if float => call(Builtin::Sqrt),
            (UnaryOp::Floor, _) if float => call(Builtin::Floor),
            (UnaryOp::Ceil, _) if float => call(Builtin::Ceil),
            (UnaryOp::Round, _) if float => call(Builtin::RoundEven),
            (UnaryOp::Trunc, _) if float => call(Builtin::Trunc),
            (UnaryOp::Recip, _) if float => {
                let one = dl.float_lit(1.0, d);
                self.helper(Helper::DivF32, format!("kiln_div({one}, {a})"))
            }
            (UnaryOp::Not, DType::Bool) => format!("(!{a})"),
            (UnaryOp::Not, _) if float => {
                let (one, zero) = (dl.float_lit(1.0, d), dl.float_lit(0.0, d));
                let e = dl.select(&one, &zero, &format!("kiln_nonzero({a})"));
                self.helper(Helper::FloatCmp, e)
            }
            (UnaryOp::Not, DType::I32 | DType::I64 | DType::U8 | DType::U32) => {
                let (zero, one) = (dl.int_lit(0, d), dl.int_lit(1, d));
                dl.select(&zero, &one, &format!("{a} == {zero}"))
            }
            // Every op but `Abs` (whose rows above cover every dtype) is named, not `_`: a new op does not build until
            // it has its rows.
            (
                op @ (UnaryOp::Neg
                | UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Sqrt
                | UnaryOp::Recip
                | UnaryOp::Not
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Trunc
                | UnaryOp::Log1p
                | UnaryOp::Expm1),
                d,
            ) => unreachable!("unary {op:?} on {d}: refused by the dialect's check"),
        }
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    pub fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        use BinaryOp::*;
        let dl = self.d;
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (comparisons, max and min are exact).
            let r = self.binary(op, DType::F32, x, y);
            return if op.is_comparison() || matches!(op, Max | Min) { r } else { self.round_half(d, r) };
        }
        let d = dl.compute_dtype(d);
        match d {
            // Comparisons test for NaN on the bits: a compiler may fold float compares assuming no NaN.
            DType::F32 | DType::F64 if op.is_comparison() => {
                let f = match op {
                    Lt => "kiln_lt",
                    Le => "kiln_le",
                    Eq => "kiln_eq",
                    Ne => "kiln_ne",
                    Add | Sub | Mul | Div | Rem | Max | Min | Pow | And | Or => {
                        unreachable!("{op:?} is not a comparison")
                    }
                };
                self.helper(Helper::FloatCmp, format!("{f}({x}, {y})"))
            }
            DType::F32 | DType::F64 => match op {
                Add => format!("({x} + {y})"),
                Sub => format!("({x} - {y})"),
                Mul => format!("({x} * {y})"),
                // A divisor the compiler sees as constant zero may be folded without IEEE care (lavapipe gave
                // x / 0.0 = 0.0): the helper makes the zero case explicit on the bits.
                Div => self.helper(Helper::DivF32, format!("kiln_div({x}, {y})")),
                // A builtin `%` on floats is `x - y * trunc(x / y)`, inexact once the quotient is large.
                Rem => self.helper(Helper::FmodF32, format!("kiln_fmod({x}, {y})")),
                Lt | Le | Eq | Ne => unreachable!("comparisons are above"),
                // Builtin max/min may return either operand for NaN; eval propagates it.
                Max => self.helper(Helper::MaxF32, format!("kiln_max({x}, {y})")),
                Min => self.helper(Helper::MinF32, format!("kiln_min({x}, {y})")),
                // A builtin pow may be exp2(y * log2(x)), undefined for x < 0; the helper handles signs and special
                // cases.
                Pow => self.helper(Helper::PowF32, format!("kiln_pow({x}, {y})")),
                And | Or => unreachable!("{op:?} on floats"),
            },
            // u32 arithmetic, division, comparisons and max/min are the unsigned ones on the unsigned type.
            DType::I32 | DType::I64 | DType::U8 | DType::U32 => {
                let zero = dl.int_lit(0, d);
                let wrap = |e: String| if d == DType::U8 { format!("(({e}) & 0xffu)") } else { e };
                match op {
                    Add => wrap(format!("{x} + {y}")),
                    Sub => wrap(format!("{x} - {y}")),
                    Mul => wrap(format!("{x} * {y}")),
                    // A target's x / 0 is x or undefined (and i32::MIN / -1 is i32::MIN, as eval wraps); eval's x / 0
                    // is 0.
                    // The divisor is made 1 where it is 0 before dividing: a shader compiler refuses a division by
                    // a constant zero (naga: "Division by zero") even where the result is not selected.
                    Div => {
                        let safe = dl.select(y, &dl.int_lit(1, d), &format!("{y} == {zero}"));
                        dl.select(&format!("{x} / {safe}"), &zero, &format!("{y} == {zero}"))
                    }
                    // As eval: x % 0 is 0 (i32::MIN % -1 is 0 on every target, as in eval).
                    Rem => {
                        let safe = dl.select(y, &dl.int_lit(1, d), &format!("{y} == {zero}"));
                        dl.select(&dl.int_rem(x, &safe, d), &zero, &format!("{y} == {zero}"))
                    }
                    Max => format!("{}({x}, {y})", dl.builtin(Builtin::Max, d)),
                    Min => format!("{}({x}, {y})", dl.builtin(Builtin::Min, d)),
                    Pow if d == DType::I32 => self.helper(Helper::PowI32, format!("kiln_pow_i32({x}, {y})")),
                    Pow if d == DType::U32 => self.helper(Helper::PowU32, format!("kiln_pow_u32({x}, {y})")),
                    Pow if d == DType::I64 => self.helper(Helper::PowI64, format!("kiln_pow_i64({x}, {y})")),
                    Pow => {
                        let (xi, yi) = (dl.convert(DType::I32, x), dl.convert(DType::I32, y));
                        let p = dl.convert(DType::U32, &format!("kiln_pow_i32({xi}, {yi})"));
                        self.helper(Helper::PowI32, format!("({p} & 0xffu)"))
                    }
                    Lt => format!("({x} < {y})"),
                    Le => format!("({x} <= {y})"),
                    Eq => format!("({x} == {y})"),
                    Ne => format!("({x} != {y})"),
                    And => format!("({x} != {zero} && {y} != {zero})"),
                    Or => format!("({x} != {zero} || {y} != {zero})"),
                }
            }
            DType::Bool => match op {
                And | Mul | Min => format!("({x} && {y})"),
                Or | Add | Max => format!("({x} || {y})"),
                Eq => format!("({x} == {y})"),
                Ne | Sub => format!("({x} != {y})"),
                Lt => format!("(!{x} && {y})"),
                Le => format!("(!{x} || {y})"),
                // eval: x / y as ints, 0 when y == 0: true only for 1 / 1.
                Div => format!("({x} && {y})"),
                // eval: x % y as ints, 0 when y == 0: never true.
                Rem => dl.bool_lit(false),
                // eval: int_pow(x, y): 0^0 = 1, 0^1 = 0, 1^y = 1.
                Pow => format!("({x} || !{y})"),
            },
            d @ (DType::F16 | DType::BF16) => unreachable!("binary {op:?} on {d}: computed in f32 above"),
        }
    }

    /// `e` (an f32 expression) rounded to the nearest f16 value.
    fn round_f16(&mut self, e: String) -> String {
        self.helper(Helper::F16, format!("kiln_round_f16({e})"))
    }

    /// `e` (an f32 expression) rounded to the nearest value of half type `d` (f16 or bf16).
    fn round_half(&mut self, d: DType, e: String) -> String {
        if d == DType::BF16 { self.helper(Helper::BF16, format!("kiln_round_bf16({e})")) } else { self.round_f16(e) }
    }

    /// Converts `v` from `from` to `to` with eval's rules.
    pub fn cast(&mut self, from: DType, to: DType, v: &str) -> String {
        use DType::*;
        let dl = self.d;
        match (dl.compute_dtype(from), dl.compute_dtype(to)) {
            (a, b) if a == b => v.to_string(),
            // f16 is an f32 in registers: widening is free, narrowing is a rounding. An int converts to f32 first:
            // exact below 2^24, and anything larger is inf in f16 either way.
            (F16 | BF16, F32) => v.to_string(),
            (F16 | BF16, b) => self.cast(F32, b, v),
            // From f64 too: through f32 (nearest, ties to even) and then to the half type, as `half`'s from_f64 and
            // PyTorch convert (two roundings: a value just past a half-type tie can land on it).
            (a, b @ (F16 | BF16)) => {
                let f = self.cast(a, F32, v);
                self.round_half(b, f)
            }
            // NaN and subnormals are true.
            (F32 | F64, Bool) => self.helper(Helper::FloatCmp, format!("kiln_nonzero({v})")),
            (b @ (I32 | I64 | U8 | U32), Bool) => format!("({v} != {})", dl.int_lit(0, b)),
            (Bool, b @ (F32 | F64)) => dl.select(&dl.float_lit(0.0, b), &dl.float_lit(1.0, b), v),
            (Bool, b @ (I32 | I64 | U8 | U32)) => dl.select(&dl.int_lit(0, b), &dl.int_lit(1, b), v),
            // Ints to floats round to nearest; between f32 and f64, widening is exact and narrowing rounds.
            (I32 | I64 | U8 | U32 | F64, F32) => dl.convert(F32, v),
            (I32 | I64 | U8 | U32 | F32, F64) => dl.convert(F64, v),
            (I32 | U8 | U32, I64) => dl.convert(I64, v),
            (I64, b @ (I32 | U32)) => dl.convert(b, v),
            (I64, U8) => format!("({} & 0xffu)", dl.convert(U32, v)),
            (F32 | F64, I64) => self.helper(Helper::F32ToInt, format!("kiln_to_i64({v})")),
            (F64, I32) => self.helper(Helper::F32ToInt, dl.convert(I32, &format!("kiln_to_i64({v})"))),
            (F64, U32) => self.helper(Helper::F32ToInt, dl.convert(U32, &format!("kiln_to_i64({v})"))),
            (F64, U8) => {
                self.helper(Helper::F32ToInt, format!("({} & 0xffu)", dl.convert(U32, &format!("kiln_to_i64({v})"))))
            }
            // Conversions between ints keep the low bits: the wrapped conversions of eval.
            (U8 | U32, I32) => dl.convert(I32, v),
            (I32, U32) => dl.convert(U32, v),
            (U8, U32) => v.to_string(),
            (U32, U8) => format!("({v} & 0xffu)"),
            (I32, U8) => format!("({} & 0xffu)", dl.convert(U32, v)),
            // A target's f32 -> int conversion clamps to the target type (or is undefined out of range); eval
            // saturates to i64 and wraps.
            (F32, I32) => self.helper(Helper::F32ToInt, dl.bitcast(I32, &format!("kiln_f32_low_bits({v})"))),
            (F32, U8) => self.helper(Helper::F32ToInt, format!("(kiln_f32_low_bits({v}) & 0xffu)")),
            (F32, U32) => self.helper(Helper::F32ToInt, format!("kiln_f32_low_bits({v})")),
            (a, b) => unreachable!("cast {a} -> {b}: refused by the dialect's check"),
        }
    }
}
