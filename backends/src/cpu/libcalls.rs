//! The host functions JIT'd kernels call (`kiln_jit::render::clif::Libcall`): transcendentals without a vector
//! implementation, integer power, and the Philox random streams. Each is the same computation as the kernel IR
//! evaluator's, so results match the spec bit for bit.

use kiln_jit::render::clif::Libcall;
use kiln_jit::rng;

/// One `extern "C"` shim per libcall and the address table, from one list.
macro_rules! shims {
    ($($v:ident: fn $f:ident($($a:ident: $t:ty),*) -> $r:ty $body:block)*) => {
        $(extern "C" fn $f($($a: $t),*) -> $r $body)*

        /// The address of a libcall's implementation.
        pub fn address(l: Libcall) -> *const u8 {
            match l {
                $(Libcall::$v => $f as *const u8,)*
            }
        }
    };
}

shims! {
    ExpF32: fn exp_f32(x: f32) -> f32 { x.exp() }
    LogF32: fn log_f32(x: f32) -> f32 { x.ln() }
    SinF32: fn sin_f32(x: f32) -> f32 { x.sin() }
    CosF32: fn cos_f32(x: f32) -> f32 { x.cos() }
    TanhF32: fn tanh_f32(x: f32) -> f32 { x.tanh() }
    PowF32: fn pow_f32(x: f32, y: f32) -> f32 { x.powf(y) }
    ExpF64: fn exp_f64(x: f64) -> f64 { x.exp() }
    LogF64: fn log_f64(x: f64) -> f64 { x.ln() }
    SinF64: fn sin_f64(x: f64) -> f64 { x.sin() }
    CosF64: fn cos_f64(x: f64) -> f64 { x.cos() }
    TanhF64: fn tanh_f64(x: f64) -> f64 { x.tanh() }
    PowF64: fn pow_f64(x: f64, y: f64) -> f64 { x.powf(y) }
    PowI64: fn pow_i64(x: i64, y: i64) -> i64 { kiln_jit::semantics::int_pow(x, y) }
    UniformF32: fn uniform_f32(seed: u64, index: u64) -> f32 { rng::uniform_f32(rng::words(seed, index)) }
    UniformF64: fn uniform_f64(seed: u64, index: u64) -> f64 { rng::uniform_f64(rng::words(seed, index)) }
    NormalF64: fn normal_f64(seed: u64, index: u64) -> f64 { rng::normal_f64(rng::words(seed, index)) }
    UniformF16: fn uniform_f16(seed: u64, index: u64) -> f32 { rng::uniform_f16(rng::words(seed, index)) }
    NormalF16: fn normal_f16(seed: u64, index: u64) -> f32 { f64_to_f16(rng::normal_f64(rng::words(seed, index))) }
    F64ToF16: fn f64_to_f16(x: f64) -> f32 { kiln_jit::f16::from_f64(x).to_f32() }
    UniformBF16: fn uniform_bf16(seed: u64, index: u64) -> f32 { rng::uniform_bf16(rng::words(seed, index)) }
    Log1pF32: fn log1p_f32(x: f32) -> f32 { x.ln_1p() }
    Expm1F32: fn expm1_f32(x: f32) -> f32 { x.exp_m1() }
    Log1pF64: fn log1p_f64(x: f64) -> f64 { x.ln_1p() }
    Expm1F64: fn expm1_f64(x: f64) -> f64 { x.exp_m1() }
}
