//! WGSL as a dialect of the shared C-like renderer (`render::cstyle`): its types, literals, conversions, builtin
//! names, statements and helper sources. Everything here is spelling; what each instruction computes is the shared
//! table's.

use super::math;
use crate::dtype::DType;
use crate::render::cstyle::{Builtin, Dialect, Helper};

/// The WGSL dialect.
pub struct Wgsl;

/// The dtype a value of `d` is computed in: WGSL has no 64-bit types, so 64-bit intermediates are narrowed (see
/// `check`).
pub(crate) fn narrow(d: DType) -> DType {
    match d {
        DType::F64 => DType::F32,
        DType::I64 => DType::I32,
        d => d,
    }
}

/// WGSL element type of a device buffer of `d`.
pub(crate) fn storage_ty(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::I32 => "i32",
        DType::U32 | DType::U8 | DType::Bool => "u32",
        DType::F16 => "f16",
        DType::F64 | DType::I64 | DType::BF16 => unreachable!("{d} is refused by check"),
    }
}

/// A WGSL f32 expression with exactly the value `x` rounded to f32 (non-finite and subnormal values as bit
/// patterns: WGSL has no literal for them, and a compiler may flush subnormal literals).
fn f32_lit(x: f32) -> String {
    if x.is_finite() && (x == 0.0 || x.is_normal()) {
        let s = format!("{x:?}");
        if x.is_sign_negative() { format!("({s}f)") } else { format!("{s}f") }
    } else {
        format!("bitcast<f32>({:#010x}u)", x.to_bits())
    }
}

/// A WGSL i32 expression for `x` (i32::MIN has no literal: its magnitude overflows).
fn i32_lit(x: i32) -> String {
    if x == i32::MIN { "i32(-2147483647 - 1)".to_string() } else { format!("{x}i") }
}

/// The WGSL type named by a computed dtype.
fn ty(d: DType) -> &'static str {
    match narrow(d) {
        DType::F16 | DType::F32 => "f32",
        DType::I32 => "i32",
        DType::U8 | DType::U32 => "u32",
        DType::Bool => "bool",
        DType::F64 | DType::I64 => unreachable!("narrowed"),
        DType::BF16 => unreachable!("bf16 is refused by check"),
    }
}

impl Dialect for Wgsl {
    fn compute_dtype(&self, d: DType) -> DType {
        narrow(d)
    }

    fn reg_ty(&self, d: DType) -> &'static str {
        ty(d)
    }

    fn index_dtype(&self) -> DType {
        DType::I32
    }

    fn load_word(&self, d: DType, word: &str) -> String {
        match d {
            DType::Bool => format!("({word} != 0u)"),
            DType::F16 => format!("f32({word})"),
            _ => word.to_string(),
        }
    }

    fn store_word(&self, d: DType, v: &str) -> String {
        match d {
            DType::Bool => format!("select(0u, 1u, {v})"),
            // Exact: `v` holds an f16 value.
            DType::F16 => format!("f16({v})"),
            _ => v.to_string(),
        }
    }

    fn float_lit(&self, x: f64, _d: DType) -> String {
        f32_lit(x as f32)
    }

    fn int_lit(&self, x: i64, d: DType) -> String {
        match narrow(d) {
            DType::I32 => i32_lit(x as i32),
            DType::U8 => format!("{}u", x as u8),
            _ => format!("{}u", x as u32),
        }
    }

    fn select(&self, f: &str, t: &str, c: &str) -> String {
        format!("select({f}, {t}, {c})")
    }

    /// On magnitudes for i32: WGSL defines `%` on negative operands as C does, but naga writes it to GLSL as `%`,
    /// whose result GLSL leaves undefined for negative operands, and llvmpipe's GL computed it unsigned (`-7 % 3`
    /// gave 0). `u32(abs(x))` is `|x|` even for `i32::MIN` (its bits).
    fn int_rem(&self, x: &str, y: &str, d: DType) -> String {
        if narrow(d) != DType::I32 {
            return format!("{x} % {y}");
        }
        let r = format!("i32(u32(abs({x})) % u32(abs({y})))");
        format!("select({r}, -{r}, {x} < 0i)")
    }

    /// WGSL's `i32(u32)` and `u32(i32)` keep the bits, `f32(int)` converts the value.
    fn convert(&self, to: DType, v: &str) -> String {
        format!("{}({v})", ty(to))
    }

    fn bitcast(&self, to: DType, v: &str) -> String {
        format!("bitcast<{}>({v})", ty(to))
    }

    /// WGSL's builtins are overloaded on every numeric type.
    fn builtin(&self, f: Builtin, _d: DType) -> &'static str {
        match f {
            Builtin::Abs => "abs",
            Builtin::Exp => "exp",
            Builtin::Log => "log",
            Builtin::Sqrt => "sqrt",
            Builtin::Max => "max",
            Builtin::Min => "min",
            Builtin::Floor => "floor",
            Builtin::Ceil => "ceil",
            // WGSL's `round` rounds ties to even.
            Builtin::RoundEven => "round",
            Builtin::Trunc => "trunc",
        }
    }

    fn let_value(&self, name: &str, d: DType, e: &str) -> String {
        format!("let {name}: {} = {e};", ty(d))
    }

    fn let_index(&self, name: &str, e: &str) -> String {
        format!("let {name} = {e};")
    }

    fn var_value(&self, name: &str, d: DType, init: &str) -> String {
        format!("var {name}: {} = {init};", ty(d))
    }

    fn for_open(&self, var: &str, extent: usize) -> String {
        format!("for (var {var} = 0; {var} < {extent}; {var}++) {{")
    }

    fn fn_open(&self, name: &str, params: &[(&str, DType)]) -> String {
        let ps: Vec<String> = params.iter().map(|(p, d)| format!("{p}: {}", ty(*d))).collect();
        format!("fn {name}({}) {{", ps.join(", "))
    }

    fn fn_close(&self) -> &'static str {
        "}"
    }

    fn for_step_open(&self, var: &str, init: &str, end: &str, step: &str) -> String {
        format!("for (var {var} = {init}; {var} < {end}; {var} += {step}) {{")
    }

    fn workgroup_array(&self, name: &str, d: DType, len: usize) -> String {
        format!("var<workgroup> {name}: array<{}, {len}>;", ty(d))
    }

    fn barrier(&self) -> &'static str {
        "workgroupBarrier();"
    }

    /// `wid`: `@builtin(workgroup_id)` in the GEMM entry point (`gemm.rs`).
    fn group_id(&self, axis: usize) -> &'static str {
        if axis == 0 { "wid.x" } else { "wid.y" }
    }

    /// `lid`: `@builtin(local_invocation_index)` in the GEMM entry point.
    fn local_index(&self) -> &'static str {
        "lid"
    }

    fn helper_source(&self, h: Helper) -> &'static str {
        math::source(h)
    }

    fn rand_words(&self, slot: usize, index: &str) -> String {
        format!("kiln_rand_words({slot}u, {index})")
    }
}
