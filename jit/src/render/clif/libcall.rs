//! The host functions kernels may call, defined once in one table (the backend binds each name to a shim).

use super::*;

/// Defines `Libcall` from one table: variant, symbol, parameter types, return type.
macro_rules! libcalls {
    ($($(#[$doc:meta])* $v:ident => $name:literal, ($($p:ident),*) -> $r:ident;)*) => {
        /// Host functions a kernel may call. The backend declares them first, in this order, so that a libcall's
        /// index is its function id in the module.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Libcall {
            $($(#[$doc])* $v,)*
        }

        impl Libcall {
            pub const ALL: &'static [Libcall] = &[$(Libcall::$v,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Libcall::$v => $name,)*
                }
            }

            /// (parameter types, return type).
            pub fn types(self) -> (&'static [Type], Type) {
                match self {
                    $(Libcall::$v => (&[$(types::$p),*], types::$r),)*
                }
            }
        }
    };
}

libcalls! {
    ExpF32 => "kiln_exp_f32", (F32) -> F32;
    LogF32 => "kiln_log_f32", (F32) -> F32;
    SinF32 => "kiln_sin_f32", (F32) -> F32;
    CosF32 => "kiln_cos_f32", (F32) -> F32;
    TanhF32 => "kiln_tanh_f32", (F32) -> F32;
    PowF32 => "kiln_pow_f32", (F32, F32) -> F32;
    ExpF64 => "kiln_exp_f64", (F64) -> F64;
    LogF64 => "kiln_log_f64", (F64) -> F64;
    SinF64 => "kiln_sin_f64", (F64) -> F64;
    CosF64 => "kiln_cos_f64", (F64) -> F64;
    TanhF64 => "kiln_tanh_f64", (F64) -> F64;
    PowF64 => "kiln_pow_f64", (F64, F64) -> F64;
    /// `(i64, i64) -> i64` wrapping integer power (see `semantics::int_pow`).
    PowI64 => "kiln_pow_i64", (I64, I64) -> I64;
    /// `(seed, index) -> f32` uniform in [0, 1).
    UniformF32 => "kiln_uniform_f32", (I64, I64) -> F32;
    /// `(seed, index) -> f64` uniform in [0, 1).
    UniformF64 => "kiln_uniform_f64", (I64, I64) -> F64;
    /// `(seed, index) -> f64` standard normal.
    NormalF64 => "kiln_normal_f64", (I64, I64) -> F64;
    /// `(seed, index) -> f32` uniform in [0, 1) with 11 bits (exact in f16).
    UniformF16 => "kiln_uniform_f16", (I64, I64) -> F32;
    /// `(seed, index) -> f32`: the standard normal of `NormalF64` rounded to f16 (once, from f64).
    NormalF16 => "kiln_normal_f16", (I64, I64) -> F32;
    /// `f64 -> f32` holding the nearest f16 (ties to even): one rounding, where f64 -> f32 -> f16 would round twice.
    F64ToF16 => "kiln_f64_to_f16", (F64) -> F32;
    /// Appended: cached code names libcalls by position. `(seed, index) -> f32` uniform in [0, 1) with 8 bits (exact in bf16).
    UniformBF16 => "kiln_uniform_bf16", (I64, I64) -> F32;
    /// Appended, as above: `log(1 + x)` and `exp(x) - 1`, libm's, per lane.
    Log1pF32 => "kiln_log1p_f32", (F32) -> F32;
    Expm1F32 => "kiln_expm1_f32", (F32) -> F32;
    Log1pF64 => "kiln_log1p_f64", (F64) -> F64;
    Expm1F64 => "kiln_expm1_f64", (F64) -> F64;
    /// Appended, as above: `(record, len, index) -> 0` records `Fault::Index` in the run's fault record (see
    /// `kernel::fault`); called only on the cold path of a gather whose index failed its check.
    IndexFault => "kiln_index_fault", (I64, I64, I64) -> I64;
    /// Appended, as above: C's `fmod` (exact), per lane.
    FmodF32 => "kiln_fmod_f32", (F32, F32) -> F32;
    FmodF64 => "kiln_fmod_f64", (F64, F64) -> F64;
}

impl Libcall {
    pub fn signature(self, call_conv: CallConv) -> Signature {
        let (params, ret) = self.types();
        let mut sig = Signature::new(call_conv);
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(ret));
        sig
    }

    pub(super) fn index(self) -> u32 {
        Libcall::ALL.iter().position(|&l| l == self).expect("listed") as u32
    }

    pub(super) fn unary(u: UnaryOp, d: DType) -> Option<Libcall> {
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
            UnaryOp::Log1p if f64 => Libcall::Log1pF64,
            UnaryOp::Log1p => Libcall::Log1pF32,
            UnaryOp::Expm1 if f64 => Libcall::Expm1F64,
            UnaryOp::Expm1 => Libcall::Expm1F32,
            _ => return None,
        })
    }
}
