//! The CUDA C / HIP C source of each shared helper (`render::cstyle::Helper`). Both languages are C++ with IEEE
//! float arithmetic when fast-math is off (NVRTC's and hiprtc's default): `x / y`, comparisons with NaN, `powf`,
//! `fmodf`, `sinf`, `tanhf`, `log1pf` and `expm1f` already have `kernel::eval`'s semantics (C99's special cases,
//! the libm's few-ulp accuracy over the whole range), so those helpers are the builtins. What C does not define as
//! eval does is spelled out: NaN-propagating max/min (`fmaxf` returns the other operand), float -> int casts
//! (undefined out of range in C; eval saturates to i64 and wraps), integer powers, f16 rounding on the bits (exact,
//! the same integer code as WGSL's), the truth of a float on its bits, Philox, and the fault record.

use crate::render::cstyle::Helper;

/// Bit casts and the 4-word Philox block, written before any helper (every kernel has them).
pub(super) const PRELUDE: &str = r#"
struct kiln_u4 { unsigned int x, y, z, w; };
__device__ __forceinline__ float kiln_bits_f32(unsigned int b) { return __uint_as_float(b); }
__device__ __forceinline__ float kiln_bits_f32(int b) { return __int_as_float(b); }
__device__ __forceinline__ unsigned int kiln_bits_u32(float x) { return __float_as_uint(x); }
__device__ __forceinline__ unsigned int kiln_bits_u32(int x) { return (unsigned int)x; }
__device__ __forceinline__ int kiln_bits_i32(float x) { return __float_as_int(x); }
__device__ __forceinline__ int kiln_bits_i32(unsigned int x) { return (int)x; }
__device__ __forceinline__ double kiln_bits_f64(unsigned long long b) { return __longlong_as_double((long long)b); }
__device__ __forceinline__ unsigned long long kiln_bits_u64(double x) { return (unsigned long long)__double_as_longlong(x); }
"#;

const PHILOX: &str = r#"
// Philox-4x32-10 (crate::rng).
__device__ kiln_u4 kiln_philox(kiln_u4 c, unsigned int k0, unsigned int k1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned long long p0 = 0xD2511F53ull * c.x;
        unsigned long long p1 = 0xCD9E8D57ull * c.z;
        kiln_u4 n;
        n.x = (unsigned int)(p1 >> 32) ^ c.y ^ k0;
        n.y = (unsigned int)p1;
        n.z = (unsigned int)(p0 >> 32) ^ c.w ^ k1;
        n.w = (unsigned int)p0;
        c = n;
    }
    return c;
}
// The words for element `index` of rng slot `slot`: counter = offset + index (64-bit), key = seed.
__device__ kiln_u4 kiln_rand_words(const unsigned int* rng, unsigned int slot, int index) {
    const unsigned int base = slot * 4u;
    const unsigned int lo = rng[base + 2u] + (unsigned int)index;
    const unsigned int hi = rng[base + 3u] + (lo < (unsigned int)index ? 1u : 0u);
    kiln_u4 c = { lo, hi, 0u, 0u };
    return kiln_philox(c, rng[base], rng[base + 1u]);
}
// Uniform in [0, 1) with 24 bits (rng::uniform_f32), 11 bits for f16 (rng::uniform_f16): exact.
__device__ float kiln_uniform(kiln_u4 w) { return (float)(w.x >> 8) * (1.0f / 16777216.0f); }
__device__ float kiln_uniform_f16(kiln_u4 w) { return (float)(w.x >> 21) * (1.0f / 2048.0f); }
// 8 bits for bf16 (rng::uniform_bf16), 53 for f64 (rng::uniform_f64).
__device__ float kiln_uniform_bf16(kiln_u4 w) { return (float)(w.x >> 24) * (1.0f / 256.0f); }
__device__ double kiln_uniform_f64(kiln_u4 w) {
    return (double)((((unsigned long long)w.x << 32) | w.y) >> 11) * (1.0 / 9007199254740992.0);
}
"#;

const NORMAL: &str = r#"
// Box-Muller from words 2 and 3 (rng::normal_f64, in f32): u1 in (0, 1], so the log is finite.
__device__ float kiln_normal(kiln_u4 w) {
    const float u1 = ((float)(w.z >> 8) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = (float)(w.w >> 8) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831855f * u2);
}
__device__ double kiln_normal_f64(kiln_u4 w) {
    const double u1 = ((double)(w.z >> 8) + 1.0) * (1.0 / 16777216.0);
    const double u2 = (double)(w.w >> 8) * (1.0 / 16777216.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
"#;

const FLOAT_CMP: &str = r#"
// NaN and truth on the bits (robust to a compiler's float folding; a subnormal is true, as in eval).
__device__ __forceinline__ bool kiln_isnan(float x) { return (kiln_bits_u32(x) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool kiln_lt(float x, float y) { return !kiln_isnan(x) && !kiln_isnan(y) && x < y; }
__device__ __forceinline__ bool kiln_le(float x, float y) { return !kiln_isnan(x) && !kiln_isnan(y) && x <= y; }
__device__ __forceinline__ bool kiln_eq(float x, float y) { return !kiln_isnan(x) && !kiln_isnan(y) && x == y; }
__device__ __forceinline__ bool kiln_ne(float x, float y) { return kiln_isnan(x) || kiln_isnan(y) || !(x == y); }
__device__ __forceinline__ bool kiln_nonzero(float x) { return (kiln_bits_u32(x) & 0x7fffffffu) != 0u; }
__device__ __forceinline__ bool kiln_isnan(double x) {
    return (kiln_bits_u64(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
__device__ __forceinline__ bool kiln_lt(double x, double y) { return !kiln_isnan(x) && !kiln_isnan(y) && x < y; }
__device__ __forceinline__ bool kiln_le(double x, double y) { return !kiln_isnan(x) && !kiln_isnan(y) && x <= y; }
__device__ __forceinline__ bool kiln_eq(double x, double y) { return !kiln_isnan(x) && !kiln_isnan(y) && x == y; }
__device__ __forceinline__ bool kiln_ne(double x, double y) { return kiln_isnan(x) || kiln_isnan(y) || !(x == y); }
__device__ __forceinline__ bool kiln_nonzero(double x) { return (kiln_bits_u64(x) & 0x7fffffffffffffffull) != 0ull; }
"#;

const DIV_F32: &str = r#"
__device__ __forceinline__ float kiln_div(float x, float y) { return x / y; }
__device__ __forceinline__ double kiln_div(double x, double y) { return x / y; }
"#;

const MAX_F32: &str = r#"
__device__ __forceinline__ float kiln_max(float x, float y) {
    return (kiln_isnan(x) || kiln_isnan(y)) ? kiln_bits_f32(0x7fc00000u) : fmaxf(x, y);
}
__device__ __forceinline__ double kiln_max(double x, double y) {
    return (kiln_isnan(x) || kiln_isnan(y)) ? kiln_bits_f64(0x7ff8000000000000ull) : fmax(x, y);
}
"#;

const MIN_F32: &str = r#"
__device__ __forceinline__ float kiln_min(float x, float y) {
    return (kiln_isnan(x) || kiln_isnan(y)) ? kiln_bits_f32(0x7fc00000u) : fminf(x, y);
}
__device__ __forceinline__ double kiln_min(double x, double y) {
    return (kiln_isnan(x) || kiln_isnan(y)) ? kiln_bits_f64(0x7ff8000000000000ull) : fmin(x, y);
}
"#;

const POW_F32: &str = r#"
__device__ __forceinline__ float kiln_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double kiln_pow(double x, double y) { return pow(x, y); }
"#;

const POW_I32: &str = r#"
// semantics::int_pow, wrapping in i32 (the low 32 bits of the i64 result).
__device__ int kiln_pow_i32(int x, int y) {
    if (y < 0) {
        if (x == 1) { return 1; }
        if (x == -1) { return (y & 1) == 0 ? 1 : -1; }
        return 0;
    }
    return (int)kiln_pow_u32((unsigned int)x, (unsigned int)y);
}
"#;

const POW_U32: &str = r#"
// semantics::int_pow on u32 operands, wrapping in u32.
__device__ unsigned int kiln_pow_u32(unsigned int x, unsigned int y) {
    unsigned int acc = 1u;
    while (y > 0u) {
        if ((y & 1u) == 1u) { acc *= x; }
        x *= x;
        y >>= 1;
    }
    return acc;
}
"#;

const F16: &str = r#"
// The f16 bits nearest to x, ties to even (as `half`): NaN stays NaN (quiet, top payload bits kept), |x| >= 65520
// is inf, subnormal results rounded in integer arithmetic.
__device__ unsigned int kiln_f16_bits(float x) {
    const unsigned int u = kiln_bits_u32(x);
    const unsigned int sign = (u >> 16) & 0x8000u;
    const unsigned int a = u & 0x7fffffffu;
    if (a >= 0x47800000u) {
        if (a > 0x7f800000u) { return sign | 0x7e00u | ((a >> 13) & 0x3ffu); }
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) { return sign | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13); }
    const unsigned int e = a >> 23;
    if (e < 102u) { return sign; }
    const unsigned int m = (a & 0x7fffffu) | 0x800000u;
    const unsigned int s = 126u - e;
    const unsigned int q = m >> s;
    const unsigned int r = m & ((1u << s) - 1u);
    const unsigned int h = 1u << (s - 1u);
    return sign | (q + ((r > h || (r == h && (q & 1u) == 1u)) ? 1u : 0u));
}
// The f32 value of f16 bits (exact).
__device__ float kiln_f16_value(unsigned int h) {
    const unsigned int em = h & 0x7fffu;
    const unsigned int sign = (h & 0x8000u) << 16;
    unsigned int bits;
    if (em >= 0x7c00u) {
        bits = (em << 13) | 0x7f800000u;
    } else if (em >= 0x400u) {
        bits = (em << 13) + 0x38000000u;
    } else {
        bits = kiln_bits_u32((float)em * 5.9604645e-8f);
    }
    return kiln_bits_f32(bits | sign);
}
__device__ __forceinline__ float kiln_round_f16(float x) { return kiln_f16_value(kiln_f16_bits(x)); }
"#;

const F32_TO_INT: &str = r#"
// Rust's `x as i64`: saturating, NaN -> 0 (C leaves out-of-range conversions undefined); its low 32 bits.
__device__ long long kiln_to_i64(double x) {
    if (kiln_isnan(x)) { return 0; }
    if (x >= 9223372036854775808.0) { return 9223372036854775807ll; }
    if (x < -9223372036854775808.0) { return -9223372036854775807ll - 1; }
    return (long long)x;
}
__device__ long long kiln_to_i64(float x) { return kiln_to_i64((double)x); }
__device__ unsigned int kiln_f32_low_bits(float x) { return (unsigned int)(unsigned long long)kiln_to_i64(x); }
"#;

const TRIG: &str = r#"
__device__ __forceinline__ float kiln_sin(float x) { return sinf(x); }
__device__ __forceinline__ float kiln_cos(float x) { return cosf(x); }
__device__ __forceinline__ double kiln_sin(double x) { return sin(x); }
__device__ __forceinline__ double kiln_cos(double x) { return cos(x); }
"#;

const TANH: &str = r#"
__device__ __forceinline__ float kiln_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double kiln_tanh(double x) { return tanh(x); }
"#;

const LOG1P: &str = r#"
__device__ __forceinline__ float kiln_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double kiln_log1p(double x) { return log1p(x); }
"#;

const EXPM1: &str = r#"
__device__ __forceinline__ float kiln_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double kiln_expm1(double x) { return expm1(x); }
"#;

/// The fault record is the kernel's `fault` parameter: the macro passes it, so the table's call reads as WGSL's.
/// CUDA's and HIP's compare-and-swap never fail spuriously.
const INDEX_CHECK: &str = r#"
__device__ int kiln_checked_at(int* fault, int i, int len, bool live) {
    if ((i >= 0 && i < len) || !live) { return (i >= 0 && i < len) ? i : 0; }
    if (atomicCAS(fault, 0, 1) == 0) {
        atomicExch(fault + 1, len);
        atomicExch(fault + 2, i);
    }
    return 0;
}
#define kiln_checked(i, len, live) kiln_checked_at(fault, (i), (len), (live))
"#;

const FMOD_F32: &str = r#"
__device__ __forceinline__ float kiln_fmod(float x, float y) { return fmodf(x, y); }
__device__ __forceinline__ double kiln_fmod(double x, double y) { return fmod(x, y); }
"#;

const POW_I64: &str = r#"
// semantics::int_pow, wrapping in i64.
__device__ long long kiln_pow_i64(long long x, long long y) {
    if (y < 0) {
        if (x == 1) { return 1; }
        if (x == -1) { return (y & 1) == 0 ? 1 : -1; }
        return 0;
    }
    unsigned long long acc = 1ull, b = (unsigned long long)x, e = (unsigned long long)y;
    while (e > 0ull) {
        if ((e & 1ull) == 1ull) { acc *= b; }
        b *= b;
        e >>= 1;
    }
    return (long long)acc;
}
"#;

const BF16: &str = r#"
// The bf16 value nearest to x, ties to even (as `half`'s bf16::from_f32): NaN stays NaN (quiet).
__device__ float kiln_round_bf16(float x) {
    const unsigned int u = kiln_bits_u32(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return kiln_bits_f32((u | 0x00400000u) & 0xffff0000u); }
    return kiln_bits_f32((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
"#;

/// The C source of `h` (its dependencies are written before it by the shared renderer).
pub(super) fn source(h: Helper) -> &'static str {
    match h {
        Helper::Philox => PHILOX,
        Helper::Normal => NORMAL,
        Helper::FloatCmp => FLOAT_CMP,
        Helper::DivF32 => DIV_F32,
        Helper::MaxF32 => MAX_F32,
        Helper::MinF32 => MIN_F32,
        Helper::PowF32 => POW_F32,
        Helper::PowI32 => POW_I32,
        Helper::PowU32 => POW_U32,
        Helper::F16 => F16,
        Helper::F32ToInt => F32_TO_INT,
        Helper::Trig => TRIG,
        Helper::Tanh => TANH,
        Helper::Log1p => LOG1P,
        Helper::Expm1 => EXPM1,
        Helper::IndexCheck => INDEX_CHECK,
        Helper::FmodF32 => FMOD_F32,
        Helper::PowI64 => POW_I64,
        Helper::BF16 => BF16,
    }
}
