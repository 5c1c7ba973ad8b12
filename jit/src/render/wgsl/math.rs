//! The WGSL source of each shared helper (`render::cstyle::Helper`): what table entries call where a WGSL builtin does
//! not have `kernel::eval`'s semantics, and the counter-based random numbers (Philox-4x32-10 in u32 arithmetic,
//! bit-exact with `crate::rng`). f16 rounding is done in u32 arithmetic because WGSL leaves the rounding of
//! `f16(x)` to the implementation and may flush f32 subnormals.

use crate::render::cstyle::Helper;

const PHILOX: &str = r#"
// Philox-4x32-10 (crate::rng): (hi, lo) of a 32 x 32 -> 64-bit product from 16-bit halves.
fn kiln_mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>(p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), a * b);
}
fn kiln_philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0; round < 10; round++) {
        if (round > 0) { k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u); }
        let p0 = kiln_mulhilo(0xD2511F53u, c.x);
        let p1 = kiln_mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}
// The words for element `index` of rng slot `slot`: counter = offset + index (64-bit), key = seed.
fn kiln_rand_words(slot: u32, index: i32) -> vec4<u32> {
    let base = slot * 4u;
    let lo = rng[base + 2u] + u32(index);
    let hi = rng[base + 3u] + select(0u, 1u, lo < u32(index));
    return kiln_philox(vec4<u32>(lo, hi, 0u, 0u), vec2<u32>(rng[base], rng[base + 1u]));
}
// Uniform in [0, 1) with 24 bits: exact, as rng::uniform_f32.
fn kiln_uniform(w: vec4<u32>) -> f32 {
    return f32(w.x >> 8u) * (1.0f / 16777216.0f);
}
// Uniform in [0, 1) with 11 bits: exact in f16, as rng::uniform_f16.
fn kiln_uniform_f16(w: vec4<u32>) -> f32 {
    return f32(w.x >> 21u) * (1.0f / 2048.0f);
}
"#;

const NORMAL: &str = r#"
// Box-Muller from words 2 and 3 (rng::normal_f64, in f32): u1 in (0, 1], so the log is finite.
fn kiln_normal(w: vec4<u32>) -> f32 {
    let u1 = (f32(w.z >> 8u) + 1.0f) * (1.0f / 16777216.0f);
    let u2 = f32(w.w >> 8u) * (1.0f / 16777216.0f);
    return sqrt(-2.0f * log(u1)) * cos(6.2831855f * u2);
}
"#;

const FLOAT_CMP: &str = r#"
// NaN tests on the bits: WGSL lets a compiler assume floats are never NaN, so `x != x` may fold to false.
fn kiln_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn kiln_unordered(x: f32, y: f32) -> bool { return kiln_isnan(x) || kiln_isnan(y); }
fn kiln_lt(x: f32, y: f32) -> bool { return !kiln_unordered(x, y) && x < y; }
fn kiln_le(x: f32, y: f32) -> bool { return !kiln_unordered(x, y) && x <= y; }
fn kiln_eq(x: f32, y: f32) -> bool { return !kiln_unordered(x, y) && x == y; }
fn kiln_ne(x: f32, y: f32) -> bool { return kiln_unordered(x, y) || !(x == y); }
// Truth of a float on the bits: WGSL lets a device flush subnormals to zero (NVIDIA's Vulkan driver does), so
// `x != 0.0` is false for 1e-40 there; every bit but the sign set is true (NaN included), as in eval.
fn kiln_nonzero(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) != 0u; }
"#;

const DIV_F32: &str = r#"
// x / y with y == +-0 spelled out: NaN for 0/0 and NaN/0, else an infinity with the sign of x * y.
fn kiln_div(x: f32, y: f32) -> f32 {
    let yb = bitcast<u32>(y);
    if ((yb & 0x7fffffffu) != 0u) { return x / y; }
    let xb = bitcast<u32>(x);
    if ((xb & 0x7fffffffu) == 0u || kiln_isnan(x)) { return bitcast<f32>(0x7fc00000u); }
    return bitcast<f32>(((xb ^ yb) & 0x80000000u) | 0x7f800000u);
}
"#;

const MAX_F32: &str = r#"
fn kiln_max(x: f32, y: f32) -> f32 {
    if (kiln_unordered(x, y)) { return bitcast<f32>(0x7fc00000u); }
    return max(x, y);
}
"#;

const MIN_F32: &str = r#"
fn kiln_min(x: f32, y: f32) -> f32 {
    if (kiln_unordered(x, y)) { return bitcast<f32>(0x7fc00000u); }
    return min(x, y);
}
"#;

const POW_F32: &str = r#"
// IEEE pow (what eval's powf does): zeros, infinities and negative bases by case, the rest as exp2(y * log2(|x|)).
fn kiln_pow(x: f32, y: f32) -> f32 {
    if ((!kiln_isnan(y) && y == 0.0f) || (!kiln_isnan(x) && x == 1.0f)) { return 1.0f; }
    if (kiln_unordered(x, y)) { return bitcast<f32>(0x7fc00000u); }
    let inf = bitcast<f32>(0x7f800000u);
    let ax = abs(x);
    let ay = abs(y);
    let y_int = ay == inf || floor(y) == y;
    // Integers from 2^24 up are even.
    let y_odd = ay < 16777216.0f && floor(y) == y && (i32(y) & 1) != 0;
    let flip = (bitcast<u32>(x) >> 31u) == 1u && y_odd;
    if (ay == inf) {
        if (ax == 1.0f) { return 1.0f; }
        return select(0.0f, inf, (ax > 1.0f) == (y > 0.0f));
    }
    if (ax == 0.0f || ax == inf) {
        let r = select(0.0f, inf, (ax == 0.0f) == (y < 0.0f));
        return select(r, -r, flip);
    }
    if (x < 0.0f && !y_int) { return bitcast<f32>(0x7fc00000u); }
    if (ax == 1.0f) { return select(1.0f, -1.0f, flip); }
    let r = exp2(y * log2(ax));
    return select(r, -r, flip);
}
"#;

const POW_I32: &str = r#"
// semantics::int_pow, wrapping in i32 (the low 32 bits of the i64 result).
fn kiln_pow_i32(x: i32, y: i32) -> i32 {
    if (y < 0) {
        if (x == 1) { return 1; }
        if (x == -1) { return select(-1, 1, (y & 1) == 0); }
        return 0;
    }
    // Wrapping products have the same bits in i32 and u32 (two's complement), so the u32 loop serves both.
    return bitcast<i32>(kiln_pow_u32(bitcast<u32>(x), u32(y)));
}
"#;

const POW_U32: &str = r#"
// semantics::int_pow on u32 operands, wrapping in u32.
fn kiln_pow_u32(x: u32, y: u32) -> u32 {
    var acc = 1u;
    var b = x;
    var e = y;
    while (e > 0u) {
        if ((e & 1u) == 1u) { acc = acc * b; }
        b = b * b;
        e = e >> 1u;
    }
    return acc;
}
"#;

const F16: &str = r#"
// The f16 bits nearest to x, ties to even (as `half`): NaN stays NaN (quiet, top payload bits kept), |x| >= 65520
// is inf, subnormal results are rounded in integer arithmetic (no f32 subnormal is read as a float).
fn kiln_f16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    let sign = (u >> 16u) & 0x8000u;
    let a = u & 0x7fffffffu;
    if (a >= 0x47800000u) {
        if (a > 0x7f800000u) { return sign | 0x7e00u | ((a >> 13u) & 0x3ffu); }
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) {
        // Normal: rebias, round to nearest even by adding 0xfff plus the lowest kept bit; a carry reaches inf.
        return sign | ((a + 0xc8000fffu + ((a >> 13u) & 1u)) >> 13u);
    }
    let e = a >> 23u;
    if (e < 102u) { return sign; } // below 2^-25: rounds to zero
    // m * 2^(e - 150) in units of 2^-24 is m >> (126 - e), rounded to nearest even.
    let m = (a & 0x7fffffu) | 0x800000u;
    let s = 126u - e;
    let q = m >> s;
    let r = m & ((1u << s) - 1u);
    let h = 1u << (s - 1u);
    return sign | (q + select(0u, 1u, r > h || (r == h && (q & 1u) == 1u)));
}
// The f32 value of f16 bits (exact; subnormals as m * 2^-24, a normal f32).
fn kiln_f16_value(h: u32) -> f32 {
    let em = h & 0x7fffu;
    let sign = (h & 0x8000u) << 16u;
    var bits: u32;
    if (em >= 0x7c00u) {
        bits = (em << 13u) | 0x7f800000u;
    } else if (em >= 0x400u) {
        bits = (em << 13u) + 0x38000000u;
    } else {
        bits = bitcast<u32>(f32(em) * bitcast<f32>(0x33800000u));
    }
    return bitcast<f32>(bits | sign);
}
fn kiln_round_f16(x: f32) -> f32 { return kiln_f16_value(kiln_f16_bits(x)); }
"#;

const F32_TO_INT: &str = r#"
// The low 32 bits of Rust's `x as i64` (saturating, NaN -> 0): WGSL's i32(x) would clamp to the i32 range instead.
fn kiln_f32_low_bits(x: f32) -> u32 {
    if (kiln_isnan(x)) { return 0u; }
    let ax = abs(x);
    if (ax >= 9223372036854775808.0f) { return select(0xffffffffu, 0u, x < 0.0f); }
    var low: u32;
    if (ax < 2147483648.0f) {
        low = u32(i32(ax));
    } else {
        // ax is an integer m * 2^e with a 24-bit m and e >= 8.
        let bits = bitcast<u32>(ax);
        let e = i32((bits >> 23u) & 0xffu) - 150;
        let m = (bits & 0x7fffffu) | 0x800000u;
        low = select(m << u32(min(e, 31)), 0u, e >= 32);
    }
    return select(low, 0u - low, x < 0.0f);
}
"#;

const TRIG: &str = r#"
// sin/cos with the argument reduced to [-pi, pi] first (Cody-Waite: 2 pi = C1 + C2 + C3, C1 with 8 significant
// bits, so k * C1 is exact for |k| < 2^15). WGSL promises the builtins' accuracy only inside [-pi, pi], and NVIDIA's
// hardware sine loses it beyond about 100 pi (1.2e-5 absolute at x = 500 on an H200). Arguments already inside are
// passed unchanged, which keeps sin(-0) = -0; NaN and inf reduce to NaN.
fn kiln_reduce_2pi(x: f32) -> f32 {
    let k = round(x * 0.15915494f);
    let r = ((x - k * 6.28125f) - k * bitcast<f32>(0x3afdaa22u)) - k * bitcast<f32>(0x2d346000u);
    return select(x, r, !(abs(x) <= 3.1415927f));
}
fn kiln_sin(x: f32) -> f32 { return sin(kiln_reduce_2pi(x)); }
fn kiln_cos(x: f32) -> f32 { return cos(kiln_reduce_2pi(x)); }
"#;

const TANH: &str = r#"
// tanh with NaN kept and relative accuracy near 0: WGSL bounds the builtin's error only in absolute terms there
// (tanh(1e-6) read 1.0133e-6 on Vulkan drivers) and lets a driver assume no NaN. Below |x| = 0.125 the odd Taylor
// series to x^7 is within an f32 ulp (the next term, 62/2835 x^9, is under 1.3e-9 relative), written as
// x * (1 + ...) so that tanh(-0) = -0.
fn kiln_tanh(x: f32) -> f32 {
    if (kiln_isnan(x)) { return x; }
    if (abs(x) < 0.125f) {
        let x2 = x * x;
        return x * (1.0f + x2 * (-0.33333334f + x2 * (0.13333334f - x2 * 0.053968254f)));
    }
    return tanh(x);
}
"#;

const LOG1P: &str = r#"
// log(1 + x) and exp(x) - 1 lose every digit near 0 (WGSL's `log` promises 2^-21 absolute on [0.5, 2]). Below
// |x| = 0.125 a series: log1p as 2 atanh(s), s = x / (2 + x) <= 0.059, to s^9 (the next term is under 1e-10
// relative); expm1 as its Taylor series to x^7 (the next, x^8 / 8!, is under 1e-11 relative). Both keep -0.
fn kiln_log1p(x: f32) -> f32 {
    if (kiln_isnan(x)) { return x; }
    if (abs(x) < 0.125f) {
        let s = x / (2.0f + x);
        let s2 = s * s;
        return 2.0f * s * (1.0f + s2 * (0.33333334f + s2 * (0.2f + s2 * (0.14285715f + s2 * 0.11111111f))));
    }
    return log(1.0f + x);
}
"#;

const EXPM1: &str = r#"
fn kiln_expm1(x: f32) -> f32 {
    if (kiln_isnan(x)) { return x; }
    if (abs(x) < 0.125f) {
        return x * (1.0f + x * (0.5f + x * (0.16666667f + x * (0.041666668f + x * (0.008333334f
            + x * (0.0013888889f + x * 0.0001984127f))))));
    }
    return exp(x) - 1.0f;
}
"#;

/// The fault record is `fault` (declared by `header` for a kernel that gathers). The compare-and-swap is retried
/// while it fails spuriously (WGSL's is weak) and the record is still free, so a fault is never lost.
const INDEX_CHECK: &str = r#"
fn kiln_checked(i: i32, len: i32, live: bool) -> i32 {
    if ((i >= 0 && i < len) || !live) {
        return select(0, i, i >= 0 && i < len);
    }
    loop {
        let r = atomicCompareExchangeWeak(&fault[0], 0, 1);
        if (r.exchanged) {
            atomicStore(&fault[1], len);
            atomicStore(&fault[2], i);
            break;
        }
        if (r.old_value != 0) { break; }
    }
    return 0;
}
"#;

/// Exact: each step subtracts from |r| the largest `|y| 2^k` not above it, which leaves an exactly representable
/// difference (at most one step per binade of the quotient: about 280 in the widest case, within llvmpipe's loop
/// limit); NaN for a NaN operand, an infinite x or a zero y; x for an infinite y.
const FMOD_F32: &str = r#"
fn kiln_fmod(x: f32, y: f32) -> f32 {
    let ax = abs(x);
    let ay = abs(y);
    if (kiln_isnan(x) || kiln_isnan(y) || bitcast<u32>(ay) == 0u || bitcast<u32>(ax) == 0x7f800000u) {
        return bitcast<f32>(0x7fc00000u);
    }
    if (bitcast<u32>(ay) == 0x7f800000u || ax < ay) {
        return x;
    }
    var r = ax;
    for (var i = 0; i < 320; i++) {
        if (r < ay) {
            break;
        }
        let k = frexp(r).exp - frexp(ay).exp;
        var s = ldexp(ay, k);
        if (s > r) {
            s = ldexp(ay, k - 1);
        }
        r = r - s;
    }
    return bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(x) & 0x80000000u));
}
"#;

/// The WGSL source of `h` (its dependencies are written before it by the shared renderer).
pub(crate) fn source(h: Helper) -> &'static str {
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
        // The table asks for these only of values WGSL refuses (bf16, f64, i64: `check`).
        h @ (Helper::BF16 | Helper::PowI64) => unreachable!("{h:?} in WGSL: refused by check"),
    }
}
