//! The host functions JIT'd kernels call (`kiln_jit::render::clif::Libcall`): transcendentals without a vector
//! implementation, integer power, and the Philox random streams. Each is the same computation as the kernel IR
//! evaluator's, so results match the spec bit for bit.

use kiln_jit::render::clif::Libcall;
use kiln_jit::rng;

extern "C" fn exp_f32(x: f32) -> f32 {
    x.exp()
}
extern "C" fn log_f32(x: f32) -> f32 {
    x.ln()
}
extern "C" fn sin_f32(x: f32) -> f32 {
    x.sin()
}
extern "C" fn cos_f32(x: f32) -> f32 {
    x.cos()
}
extern "C" fn tanh_f32(x: f32) -> f32 {
    x.tanh()
}
extern "C" fn pow_f32(x: f32, y: f32) -> f32 {
    x.powf(y)
}
extern "C" fn exp_f64(x: f64) -> f64 {
    x.exp()
}
extern "C" fn log_f64(x: f64) -> f64 {
    x.ln()
}
extern "C" fn sin_f64(x: f64) -> f64 {
    x.sin()
}
extern "C" fn cos_f64(x: f64) -> f64 {
    x.cos()
}
extern "C" fn tanh_f64(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn pow_f64(x: f64, y: f64) -> f64 {
    x.powf(y)
}
extern "C" fn pow_i64(x: i64, y: i64) -> i64 {
    kiln_jit::interp::int_pow(x, y)
}
extern "C" fn uniform_f32(seed: u64, index: u64) -> f32 {
    rng::uniform_f32(rng::words(seed, index))
}
extern "C" fn uniform_f64(seed: u64, index: u64) -> f64 {
    rng::uniform_f64(rng::words(seed, index))
}
extern "C" fn normal_f64(seed: u64, index: u64) -> f64 {
    rng::normal_f64(rng::words(seed, index))
}

/// The address of a libcall's implementation.
pub fn address(l: Libcall) -> *const u8 {
    match l {
        Libcall::ExpF32 => exp_f32 as *const u8,
        Libcall::LogF32 => log_f32 as *const u8,
        Libcall::SinF32 => sin_f32 as *const u8,
        Libcall::CosF32 => cos_f32 as *const u8,
        Libcall::TanhF32 => tanh_f32 as *const u8,
        Libcall::PowF32 => pow_f32 as *const u8,
        Libcall::ExpF64 => exp_f64 as *const u8,
        Libcall::LogF64 => log_f64 as *const u8,
        Libcall::SinF64 => sin_f64 as *const u8,
        Libcall::CosF64 => cos_f64 as *const u8,
        Libcall::TanhF64 => tanh_f64 as *const u8,
        Libcall::PowF64 => pow_f64 as *const u8,
        Libcall::PowI64 => pow_i64 as *const u8,
        Libcall::UniformF32 => uniform_f32 as *const u8,
        Libcall::UniformF64 => uniform_f64 as *const u8,
        Libcall::NormalF64 => normal_f64 as *const u8,
    }
}
