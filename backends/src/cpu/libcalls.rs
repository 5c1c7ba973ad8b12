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
    FmodF32: fn fmod_f32(x: f32, y: f32) -> f32 { x % y }
    FmodF64: fn fmod_f64(x: f64, y: f64) -> f64 { x % y }
    IndexFault: fn index_fault(record: *const std::sync::atomic::AtomicI64, len: i64, index: i64) -> i64 {
        // SAFETY: a kernel that gathers is given its run's fault record (`plan::Arena::fault`), which outlives
        // the launch and is only touched atomically while kernels run.
        let r = unsafe { std::slice::from_raw_parts(record, kiln_jit::kernel::FAULT_WORDS) };
        record_fault(r, kiln_jit::kernel::Fault::Index { len, index });
        0
    }
}

/// Claims `record` for `fault` unless another fault holds it (see `kiln_jit::kernel::fault`).
pub(crate) fn record_fault(record: &[std::sync::atomic::AtomicI64], fault: kiln_jit::kernel::Fault) {
    use std::sync::atomic::Ordering;
    let words = fault.encode();
    if record[0].compare_exchange(0, words[0], Ordering::AcqRel, Ordering::Acquire).is_ok() {
        record[1].store(words[1], Ordering::Release);
        record[2].store(words[2], Ordering::Release);
    }
}
