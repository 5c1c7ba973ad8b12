//! The code of each kernel IR instruction as a WGSL expression: constants, index arithmetic, loads, stores, and the
//! unary / binary / cast table. Where WGSL's builtin differs from `kernel::eval`, the entry calls a helper from
//! `math.rs` instead (and says why).

use super::math::Helper;
use super::{Emitter, narrow};
use crate::dtype::{DType, Scalar};
use crate::kernel::{IExpr, Inst, InstOp, Valid};
use crate::op::{BinaryOp, RandDist, UnaryOp};

/// A WGSL f32 expression with exactly the value `x` rounded to f32 (non-finite and subnormal values as bit
/// patterns: WGSL has no literal for them, and a compiler may flush subnormal literals).
pub(crate) fn f32_lit(x: f32) -> String {
    if x.is_finite() && (x == 0.0 || x.is_normal()) {
        let s = format!("{x:?}");
        if x.is_sign_negative() { format!("({s}f)") } else { format!("{s}f") }
    } else {
        format!("bitcast<f32>({:#010x}u)", x.to_bits())
    }
}

/// A WGSL i32 expression for `x` (i32::MIN has no literal: its magnitude overflows).
pub(crate) fn i32_lit(x: i32) -> String {
    if x == i32::MIN { "i32(-2147483647 - 1)".to_string() } else { format!("{x}i") }
}

/// A constant of dtype `d`.
pub(crate) fn konst(s: Scalar, d: DType) -> String {
    match narrow(d) {
        DType::F32 => f32_lit(s.as_f64() as f32),
        DType::F16 => f32_lit(half::f16::from_f64(s.as_f64()).to_f32()),
        DType::I32 => i32_lit(s.as_i64() as i32),
        DType::U8 => format!("{}u", s.as_i64() as u8),
        DType::U32 => format!("{}u", s.as_i64() as u32),
        _ => (s.as_f64() != 0.0).to_string(),
    }
}

/// An index expression over the loop variables `i<n>` (i32; `check` proved every sub-expression fits).
pub(crate) fn iexpr(e: &IExpr) -> String {
    match e {
        IExpr::Var(v) => format!("i{v}"),
        IExpr::Const(c) => i32_lit(*c as i32),
        IExpr::Add(ts) if ts.is_empty() => "0i".to_string(),
        IExpr::Add(ts) => format!("({})", ts.iter().map(iexpr).collect::<Vec<_>>().join(" + ")),
        IExpr::Mul(x, k) => format!("({} * {})", iexpr(x), i32_lit(*k as i32)),
        // Index values are non-negative where they are divided, so i32 truncating division is floor division.
        IExpr::Div(x, k) => format!("({} / {})", iexpr(x), i32_lit(*k as i32)),
        IExpr::Mod(x, k) => format!("({} % {})", iexpr(x), i32_lit(*k as i32)),
    }
}

/// A bool expression: every range of `valid` holds.
fn valid_expr(v: &Valid) -> String {
    if v.0.is_empty() {
        return "true".into();
    }
    v.0.iter()
        .map(|(e, lo, hi)| {
            let x = iexpr(e);
            format!("({x} >= {} && {x} < {})", i32_lit(*lo as i32), i32_lit(*hi as i32))
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

/// Converts a storage word read from a buffer of `d` to its register type.
pub(crate) fn from_storage(d: DType, word: &str) -> String {
    match d {
        DType::Bool => format!("({word} != 0u)"),
        DType::F16 => format!("f32({word})"),
        _ => word.to_string(),
    }
}

/// The storage word for value `v` of dtype `d`.
pub(crate) fn store(d: DType, v: &str) -> String {
    match d {
        DType::Bool => format!("select(0u, 1u, {v})"),
        // Exact: `v` holds an f16 value.
        DType::F16 => format!("f16({v})"),
        _ => v.to_string(),
    }
}

impl Emitter<'_> {
    /// One instruction as an expression; operands are named `<prefix><index>`.
    pub(crate) fn inst(&mut self, inst: &Inst, insts: &[Inst], prefix: &str) -> String {
        let d = narrow(inst.dtype);
        let v = |i: &usize| format!("{prefix}{i}");
        match &inst.op {
            InstOp::Const(s) => konst(*s, d),
            InstOp::Index(e) => self.cast(DType::I32, d, &iexpr(e)),
            InstOp::Load { buf, index, valid, fill } => {
                if self.k.inputs[*buf].len == 0 {
                    return konst(*fill, d); // an empty buffer is never read
                }
                let name = if self.aliased.contains(buf) { "out".to_string() } else { format!("in{buf}") };
                match valid {
                    None => from_storage(d, &format!("{name}[{}]", iexpr(index))),
                    Some(va) => {
                        // The index is clamped to 0 where invalid, so no read ever leaves the buffer.
                        let ok = valid_expr(va);
                        let word = format!("{name}[select(0i, {}, {ok})]", iexpr(index));
                        format!("select({}, {}, {ok})", konst(*fill, d), from_storage(d, &word))
                    }
                }
            }
            InstOp::Rand { dist, slot, index } => {
                self.uses_rng = true;
                self.helpers.insert(Helper::Philox);
                let words = format!("kiln_rand_words({slot}u, {})", iexpr(index));
                match (dist, d) {
                    (RandDist::Uniform, DType::F16) => format!("kiln_uniform_f16({words})"),
                    (RandDist::Uniform, _) => format!("kiln_uniform({words})"),
                    (RandDist::Normal, _) => {
                        self.helpers.insert(Helper::Normal);
                        let n = format!("kiln_normal({words})");
                        if d == DType::F16 { self.helper(Helper::F16, format!("kiln_round_f16({n})")) } else { n }
                    }
                }
            }
            InstOp::Unary(u, a) => self.unary(*u, d, &v(a)),
            InstOp::Binary(op, x, y) => self.binary(*op, insts[*x].dtype, &v(x), &v(y)),
            InstOp::Where(c, a, b) => format!("select({}, {}, {})", v(b), v(a), v(c)),
            InstOp::Cast(a) => self.cast(insts[*a].dtype, d, &v(a)),
            InstOp::Acc => "acc".into(),
        }
    }

    pub(crate) fn unary(&mut self, u: UnaryOp, d: DType, a: &str) -> String {
        if d == DType::F16 {
            // Computed in f32, rounded to f16 (negation and abs are exact).
            let r = self.unary(u, DType::F32, a);
            return if matches!(u, UnaryOp::Neg | UnaryOp::Abs) { r } else { self.round_f16(r) };
        }
        match (u, narrow(d)) {
            (UnaryOp::Neg, DType::F32 | DType::I32) => format!("(-{a})"), // WGSL i32 negation wraps
            (UnaryOp::Neg, DType::U8) => format!("((0u - {a}) & 0xffu)"),
            (UnaryOp::Neg, DType::U32) => format!("(0u - {a})"),
            (UnaryOp::Neg | UnaryOp::Abs, DType::Bool) => a.to_string(), // -1 and 1 are both true
            (UnaryOp::Abs, DType::U8 | DType::U32) => a.to_string(),
            (UnaryOp::Abs, _) => format!("abs({a})"), // abs(i32::MIN) wraps to itself, as in eval
            (UnaryOp::Exp, DType::F32) => format!("exp({a})"),
            (UnaryOp::Log, DType::F32) => format!("log({a})"),
            (UnaryOp::Sin, DType::F32) => self.helper(Helper::Trig, format!("kiln_sin({a})")),
            (UnaryOp::Cos, DType::F32) => self.helper(Helper::Trig, format!("kiln_cos({a})")),
            (UnaryOp::Tanh, DType::F32) => format!("tanh({a})"),
            (UnaryOp::Sqrt, DType::F32) => format!("sqrt({a})"),
            (UnaryOp::Recip, DType::F32) => self.helper(Helper::DivF32, format!("kiln_div(1.0f, {a})")),
            (UnaryOp::Not, DType::Bool) => format!("(!{a})"),
            (UnaryOp::Not, DType::F32) => {
                self.helper(Helper::FloatCmp, format!("select(1.0f, 0.0f, kiln_nonzero({a}))"))
            }
            (UnaryOp::Not, DType::I32) => format!("select(0i, 1i, {a} == 0i)"),
            (UnaryOp::Not, DType::U8 | DType::U32) => format!("select(0u, 1u, {a} == 0u)"),
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
                | UnaryOp::Not),
                d,
            ) => unreachable!("unary {op:?} on {d}: refused by check"),
        }
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    pub(crate) fn binary(&mut self, op: BinaryOp, d: DType, x: &str, y: &str) -> String {
        use BinaryOp::*;
        let d = narrow(d);
        if d == DType::F16 {
            // Computed in f32, rounded to f16 (comparisons, max and min are exact).
            let r = self.binary(op, DType::F32, x, y);
            return if op.is_comparison() || matches!(op, Max | Min) { r } else { self.round_f16(r) };
        }
        match d {
            // Comparisons test for NaN on the bits: a driver may compile float compares assuming no NaN.
            DType::F32 if op.is_comparison() => {
                let f = match op {
                    Lt => "kiln_lt",
                    Le => "kiln_le",
                    Eq => "kiln_eq",
                    Ne => "kiln_ne",
                    Add | Sub | Mul | Div | Max | Min | Pow | And | Or => unreachable!("{op:?} is not a comparison"),
                };
                self.helper(Helper::FloatCmp, format!("{f}({x}, {y})"))
            }
            DType::F32 => match op {
                Add => format!("({x} + {y})"),
                Sub => format!("({x} - {y})"),
                Mul => format!("({x} * {y})"),
                // A divisor the compiler sees as constant zero is folded without IEEE care on lavapipe (x / 0.0 gave
                // 0.0): the helper makes the zero case explicit on the bits.
                Div => self.helper(Helper::DivF32, format!("kiln_div({x}, {y})")),
                Lt | Le | Eq | Ne => unreachable!("comparisons are above"),
                // WGSL's max/min may return either operand for NaN; eval propagates it.
                Max => self.helper(Helper::MaxF32, format!("kiln_max({x}, {y})")),
                Min => self.helper(Helper::MinF32, format!("kiln_min({x}, {y})")),
                // WGSL's pow is exp2(y * log2(x)), undefined for x < 0; the helper handles signs and special cases.
                Pow => self.helper(Helper::PowF32, format!("kiln_pow({x}, {y})")),
                And | Or => unreachable!("{op:?} on floats"),
            },
            // u32 arithmetic, division, comparisons and max/min are WGSL's unsigned ones on `u32`.
            DType::I32 | DType::U8 | DType::U32 => {
                let s = if d == DType::I32 { "i" } else { "u" };
                let wrap = |e: String| if d == DType::U8 { format!("(({e}) & 0xffu)") } else { e };
                match op {
                    Add => wrap(format!("{x} + {y}")),
                    Sub => wrap(format!("{x} - {y}")),
                    Mul => wrap(format!("{x} * {y}")),
                    // WGSL's x / 0 is x (and i32::MIN / -1 is i32::MIN, as eval wraps); eval's x / 0 is 0.
                    Div => format!("select({x} / {y}, 0{s}, {y} == 0{s})"),
                    Max => format!("max({x}, {y})"),
                    Min => format!("min({x}, {y})"),
                    Pow if d == DType::I32 => self.helper(Helper::PowI32, format!("kiln_pow_i32({x}, {y})")),
                    Pow if d == DType::U32 => self.helper(Helper::PowU32, format!("kiln_pow_u32({x}, {y})")),
                    Pow => self.helper(Helper::PowI32, format!("(u32(kiln_pow_i32(i32({x}), i32({y}))) & 0xffu)")),
                    Lt => format!("({x} < {y})"),
                    Le => format!("({x} <= {y})"),
                    Eq => format!("({x} == {y})"),
                    Ne => format!("({x} != {y})"),
                    And => format!("({x} != 0{s} && {y} != 0{s})"),
                    Or => format!("({x} != 0{s} || {y} != 0{s})"),
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
                // eval: int_pow(x, y): 0^0 = 1, 0^1 = 0, 1^y = 1.
                Pow => format!("({x} || !{y})"),
            },
            _ => unreachable!("narrowed"),
        }
    }

    /// `e` (an f32 expression) rounded to the nearest f16 value.
    fn round_f16(&mut self, e: String) -> String {
        self.helper(Helper::F16, format!("kiln_round_f16({e})"))
    }

    fn helper(&mut self, h: Helper, e: String) -> String {
        self.helpers.insert(h);
        e
    }

    /// Converts `v` from `from` to `to` with eval's rules.
    pub(crate) fn cast(&mut self, from: DType, to: DType, v: &str) -> String {
        use DType::*;
        match (narrow(from), narrow(to)) {
            (a, b) if a == b => v.to_string(),
            // f16 is an f32 in registers: widening is free, narrowing is a rounding. An int converts to f32 first:
            // exact below 2^24, and anything larger is inf in f16 either way.
            (F16, F32) => v.to_string(),
            (F16, b) => self.cast(F32, b, v),
            (a, F16) => {
                let f = self.cast(a, F32, v);
                self.round_f16(f)
            }
            (F32, Bool) => self.helper(Helper::FloatCmp, format!("kiln_nonzero({v})")), // NaN and subnormals are true
            (I32, Bool) => format!("({v} != 0i)"),
            (U8 | U32, Bool) => format!("({v} != 0u)"),
            (Bool, F32) => format!("select(0.0f, 1.0f, {v})"),
            (Bool, I32) => format!("select(0i, 1i, {v})"),
            (Bool, U8 | U32) => format!("select(0u, 1u, {v})"),
            (I32 | U8 | U32, F32) => format!("f32({v})"),
            // WGSL's i32(u32) and u32(i32) keep the bits: the wrapped conversions of eval.
            (U8 | U32, I32) => format!("i32({v})"),
            (I32, U32) => format!("u32({v})"),
            (U8, U32) => v.to_string(),
            (U32, U8) => format!("({v} & 0xffu)"),
            // WGSL's u32(i32) keeps the bits: the low 8 of them are the wrapped u8.
            (I32, U8) => format!("(u32({v}) & 0xffu)"),
            // WGSL's f32 -> int conversion clamps to the target type; eval saturates to i64 and wraps.
            (F32, I32) => self.helper(Helper::F32ToInt, format!("bitcast<i32>(kiln_f32_low_bits({v}))")),
            (F32, U8) => self.helper(Helper::F32ToInt, format!("(kiln_f32_low_bits({v}) & 0xffu)")),
            (F32, U32) => self.helper(Helper::F32ToInt, format!("kiln_f32_low_bits({v})")),
            (a, b) => unreachable!("cast {a} -> {b} is refused by check"),
        }
    }
}
