//! CUDA C and HIP C as a dialect of the shared C-like renderer (`render::cstyle`): C++ spelling of types, literals,
//! conversions, builtins and statements. The element and row functions are lambdas inside the kernel (`fn_open`),
//! so they read the kernel's buffer parameters as WGSL's functions read its bindings.

use super::{Flavor, math};
use crate::dtype::DType;
use crate::render::cstyle::{Builtin, Dialect, Helper};

/// The CUDA C or HIP C dialect.
pub struct CudaC {
    pub flavor: Flavor,
}

/// The C type of a device buffer element of `d`: bool and u8 one byte each, f16 and bf16 their 16 bits (converted
/// in integer arithmetic by the `F16` and `BF16` helpers, so kernels include no header).
pub(crate) fn storage_ty(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U32 => "unsigned int",
        DType::U8 | DType::Bool => "unsigned char",
        DType::F16 | DType::BF16 => "unsigned short",
    }
}

/// The C type of a register of dtype `d`: f16 and bf16 values live in f32 registers, u8 in u32 lanes.
fn ty(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 | DType::U32 => "unsigned int",
        DType::Bool => "bool",
    }
}

/// A C expression with exactly the value `x` of dtype `d` (f32 or f64): a literal where the value is zero or normal
/// (`f`-suffixed for f32), else its bit pattern (a compiler may flush subnormal literals, and there are none for
/// inf and NaN).
fn float_lit(x: f64, d: DType) -> String {
    let (regular, repr, bits) = if d == DType::F64 {
        (
            x.is_finite() && (x == 0.0 || x.is_normal()),
            format!("{x:?}"),
            format!("kiln_bits_f64({:#018x}ull)", x.to_bits()),
        )
    } else {
        let f = x as f32;
        (
            f.is_finite() && (f == 0.0 || f.is_normal()),
            format!("{f:?}"),
            format!("kiln_bits_f32({:#010x}u)", f.to_bits()),
        )
    };
    if !regular {
        return bits;
    }
    // `1e-7` needs no point; `1` does (`1f` is not a literal).
    let repr = if repr.contains(['.', 'e']) { repr } else { format!("{repr}.0") };
    let suffix = if d == DType::F64 { "" } else { "f" };
    if x.is_sign_negative() { format!("({repr}{suffix})") } else { format!("{repr}{suffix}") }
}

impl Dialect for CudaC {
    fn compute_dtype(&self, d: DType) -> DType {
        d
    }

    fn reg_ty(&self, d: DType) -> &'static str {
        ty(d)
    }

    fn index_dtype(&self) -> DType {
        DType::I32
    }

    fn load_word(&self, d: DType, word: &str) -> String {
        match d {
            DType::Bool => format!("({word} != 0)"),
            DType::U8 => format!("((unsigned int){word})"),
            DType::F16 => format!("kiln_f16_value({word})"),
            DType::BF16 => format!("kiln_bits_f32(((unsigned int){word}) << 16)"),
            _ => word.to_string(),
        }
    }

    fn store_word(&self, d: DType, v: &str) -> String {
        match d {
            DType::Bool => format!("(unsigned char)({v} ? 1 : 0)"),
            DType::U8 => format!("(unsigned char)({v})"),
            // Exact: `v` holds an f16 value.
            DType::F16 => format!("(unsigned short)kiln_f16_bits({v})"),
            // Exact: `v` holds a bf16 value.
            DType::BF16 => format!("(unsigned short)(kiln_bits_u32({v}) >> 16)"),
            _ => v.to_string(),
        }
    }

    fn float_lit(&self, x: f64, d: DType) -> String {
        float_lit(x, d)
    }

    fn int_lit(&self, x: i64, d: DType) -> String {
        match d {
            DType::I64 if x == i64::MIN => "(-9223372036854775807ll - 1)".to_string(),
            DType::I64 => format!("{x}ll"),
            DType::I32 if x as i32 == i32::MIN => "(-2147483647 - 1)".to_string(),
            DType::I32 => format!("{}", x as i32),
            DType::U8 => format!("{}u", x as u8),
            _ => format!("{}u", x as u32),
        }
    }

    fn select(&self, f: &str, t: &str, c: &str) -> String {
        format!("(({c}) ? ({t}) : ({f}))")
    }

    /// C's casts: int -> float by value, between 32-bit ints keeping the bits.
    fn convert(&self, to: DType, v: &str) -> String {
        format!("(({})({v}))", ty(to))
    }

    fn bitcast(&self, to: DType, v: &str) -> String {
        match to {
            DType::F32 => format!("kiln_bits_f32({v})"),
            DType::U32 => format!("kiln_bits_u32({v})"),
            DType::I32 => format!("kiln_bits_i32({v})"),
            d => unreachable!("no 32-bit reinterpretation to {d}"),
        }
    }

    /// f32 values take the `f`-suffixed functions; ints CUDA's and HIP's overloaded `max` and `min`.
    fn builtin(&self, f: Builtin, d: DType) -> &'static str {
        if d == DType::F64 {
            return match f {
                Builtin::Abs => "fabs",
                Builtin::Exp => "exp",
                Builtin::Log => "log",
                Builtin::Sqrt => "sqrt",
                Builtin::Max => "fmax",
                Builtin::Min => "fmin",
                Builtin::Floor => "floor",
                Builtin::Ceil => "ceil",
                Builtin::RoundEven => "rint",
                Builtin::Trunc => "trunc",
            };
        }
        let float = d.is_float();
        match f {
            Builtin::Abs if float => "fabsf",
            Builtin::Abs if d == DType::I64 => "llabs",
            Builtin::Abs => "abs",
            Builtin::Exp => "expf",
            Builtin::Log => "logf",
            Builtin::Sqrt => "sqrtf",
            Builtin::Max if float => "fmaxf",
            Builtin::Max => "max",
            Builtin::Min if float => "fminf",
            Builtin::Min => "min",
            Builtin::Floor => "floorf",
            Builtin::Ceil => "ceilf",
            // Round to nearest even in the default rounding mode.
            Builtin::RoundEven => "rintf",
            Builtin::Trunc => "truncf",
        }
    }

    fn let_value(&self, name: &str, d: DType, e: &str) -> String {
        format!("const {} {name} = {e};", ty(d))
    }

    fn let_index(&self, name: &str, e: &str) -> String {
        format!("const int {name} = {e};")
    }

    fn var_value(&self, name: &str, d: DType, init: &str) -> String {
        format!("{} {name} = {init};", ty(d))
    }

    fn for_open(&self, var: &str, extent: usize) -> String {
        format!("for (int {var} = 0; {var} < {extent}; {var}++) {{")
    }

    /// A lambda in the kernel's body, capturing its parameters.
    fn fn_open(&self, name: &str, params: &[(&str, DType)]) -> String {
        let ps: Vec<String> = params.iter().map(|(p, d)| format!("{} {p}", ty(*d))).collect();
        format!("auto {name} = [&]({}) -> void {{", ps.join(", "))
    }

    fn fn_close(&self) -> &'static str {
        "};"
    }

    fn for_step_open(&self, var: &str, init: &str, end: &str, step: &str) -> String {
        format!("for (int {var} = {init}; {var} < {end}; {var} += {step}) {{")
    }

    fn workgroup_array(&self, name: &str, d: DType, len: usize) -> String {
        format!("__shared__ {} {name}[{len}];", ty(d))
    }

    fn barrier(&self) -> &'static str {
        "__syncthreads();"
    }

    fn group_id(&self, axis: usize) -> &'static str {
        if axis == 0 { "blockIdx.x" } else { "blockIdx.y" }
    }

    fn local_index(&self) -> &'static str {
        "threadIdx.x"
    }

    fn load4(&self, d: DType, first: &str, into: &str) -> Option<String> {
        // `kiln_ld4f` / `kiln_ld4h` (the tiled GEMM's helpers, `gemm::VECTOR_LOADS`): one 16- or 8-byte load.
        let (load, word) = match d {
            DType::F32 => ("kiln_ld4f", "float"),
            DType::BF16 | DType::F16 => ("kiln_ld4h", "unsigned short"),
            _ => return None,
        };
        let mut s = format!("const kiln_v4<{word}> w = {load}(&{first});");
        for i in 0..4 {
            s.push_str(&format!(" {into}{i} = {};", self.load_word(d, &format!("w.v[{i}]"))));
        }
        Some(s)
    }

    fn helper_source(&self, h: Helper) -> &'static str {
        math::source(h)
    }

    fn rand_words(&self, slot: usize, index: &str) -> String {
        format!("kiln_rand_words(rng, {slot}u, {index})")
    }
}
