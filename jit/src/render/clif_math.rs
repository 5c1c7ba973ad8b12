//! Vectorized elementary functions emitted as straight-line CLIF.
//!
//! Cranelift has no instructions for transcendental functions, so the CLIF renderer calls these emitters to expand
//! `exp`, `log`, `sin`, `cos` and `tanh` inline: classic range reduction, a polynomial (Cephes for `f32`, fdlibm or a
//! fitted minimax-like polynomial for `f64`) and exponent arithmetic on the bit pattern.
//!
//! API: `exp(b, x, ty)`, `log`, `sin`, `cos`, `tanh`, each emitting at the builder's current position and returning
//! the result value. `ty` is the type of `x`: [`types::F32X4`], [`types::F64X2`], [`types::F32`] or [`types::F64`]
//! (see [`supports`]; any other type panics). Scalars run the very same algorithm with scalar instructions.
//!
//! `emit(f, b, x, ty, fma)` is the same with polynomials evaluated by fused multiply-adds, for hosts with FMA (the
//! CPU backend uses it there): different low bits, the same ulp bounds in the sampled test `clif_math_fma_forms`.
//! f32 `sin`/`cos` are a different algorithm there (reduction modulo pi by FMA, one odd polynomial instead of a
//! sine and a cosine polynomial and a select; about half the instructions), checked exhaustively in its own rows of
//! the table below. Without `fma`:
//!
//! What the emitted code does and does not use, so callers need not care about ISA flags:
//! * no `fma` (so no libcall to register, and bit-identical results whether or not the host has FMA),
//! * no `nearest`/`floor` (no SSE4.1 dependence), no `fcvt_*` (the x64 `f64x2` conversions are scalarized):
//!   rounding to an integer uses the `(y + 1.5*2^p) - 1.5*2^p` trick and integer<->float moves go through `bitcast`,
//! * no control flow: no blocks are created, the builder stays in its current block,
//! * `fdiv` only in `tanh` (both widths) and in `f64` `log`.
//!
//! # Accuracy
//!
//! Errors are in ULPs of the result type, against Rust's `f64` functions (glibc) rounded to `f32` for `f32`, and
//! against the `f64` functions themselves for `f64` (so an `f64` figure includes the reference's own error, which
//! glibc keeps below 1 ULP). "exhaustive" means every `f32` in the range was checked (the `#[ignore]`d test
//! `clif_math_exhaustive_f32`, run in release mode); "sampled" means the random sweeps of the regular tests (about
//! 1.5M points per function and width, uniform in value and uniform in bit pattern), which were also run once with
//! 134M points per `f64` function without a larger error. Vector and scalar forms give bit-identical results.
//!
//! | function | type | range                                  | max error | how        |
//! |----------|------|----------------------------------------|-----------|------------|
//! | exp      | f32  | all `f32` (incl. subnormal results)    | 1 ulp     | exhaustive |
//! | log      | f32  | all positive `f32` (incl. subnormals)  | 1 ulp     | exhaustive |
//! | sin      | f32  | \|x\| <= 51471 (2^15 pi/2)             | 3 ulp     | exhaustive |
//! | cos      | f32  | \|x\| <= 51471                         | 3 ulp     | exhaustive |
//! | tanh     | f32  | all `f32`                              | 1 ulp     | exhaustive |
//! | sin, FMA | f32  | \|x\| <= 51471                         | 2 ulp     | exhaustive |
//! | cos, FMA | f32  | \|x\| <= 51471                         | 2 ulp     | exhaustive |
//! | exp      | f64  | [-746, 710], and 2^-1074..1 patterns   | 1 ulp     | sampled    |
//! | log      | f64  | all positive `f64` (incl. subnormals)  | 1 ulp     | sampled    |
//! | sin      | f64  | \|x\| <= 1.6e6 (2^20 pi/2)             | 1 ulp     | sampled    |
//! | cos      | f64  | \|x\| <= 1.6e6                         | 1 ulp     | sampled    |
//! | tanh     | f64  | all `f64`                              | 2 ulp     | sampled    |
//!
//! (f32 `sin`/`cos` stay within 2 ulp for \|x\| <= 12867 = 2^13 pi/2, per the same exhaustive search; the 3 ulp
//! cases are beyond that. The sampled f32 sweeps include inputs within 2 ulp of multiples of pi/2, where the
//! reduction cancels most.)
//!
//! The table states the bounds the tests assert; see the tests for the exact sweeps.
//!
//! # Special values
//!
//! * `exp`: `exp(NaN) = NaN`, `exp(+inf) = +inf`, `exp(-inf) = +0`, overflow gives `+inf` (f32: x > 88.72,
//!   f64: x > 709.78), results in the subnormal range are computed (not flushed) and underflow gives `+0`,
//!   `exp(±0) = 1`.
//! * `log`: `log(NaN) = NaN` (the input NaN), `log(+inf) = +inf`, `log(±0) = -inf`, `log(x < 0) = NaN` (canonical
//!   quiet NaN); subnormal inputs are scaled into the normal range first (no flush to zero).
//! * `sin`/`cos`: `sin(±0) = ±0`, `cos(±0) = 1`, NaN and ±inf give NaN. Beyond the ranges in the table the
//!   Cody-Waite reduction loses accuracy (the products `n * (pi/2)_i` stop being exact). Measured absolute error:
//!   f32 < 2e-6 up to |x| = 2^17, 5e-3 at 2^17..2^18, 0.2 at 2^21..2^22; f64 1 ulp up to 2^22, < 2e-9 at
//!   2^24..2^25, < 1e-6 up to 2^34, 0.05 at 2^48..2^49 (the f32 FMA form was not measured beyond 51471). From
//!   |x| ~ 2^22 (f32) / 2^51 (f64) on the results are meaningless, but they stay finite and within [-1, 1] for
//!   every finite input. The accurate limits are exported
//!   as [`F32_TRIG_MAX_ARG`] and [`F64_TRIG_MAX_ARG`] for callers that want a fallback (e.g. a libcall) there.
//! * `tanh`: `tanh(±0) = ±0`, `tanh(±inf) = ±1`, NaN gives NaN; saturates to exactly ±1 for large |x|.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::FunctionBuilder;

/// Largest |x| for which `f32` `sin`/`cos` keep the accuracy in the module table (2^15 * pi/2, rounded down).
pub const F32_TRIG_MAX_ARG: f64 = 51471.0;
/// Largest |x| for which `f64` `sin`/`cos` keep the accuracy in the module table (2^20 * pi/2, rounded down).
pub const F64_TRIG_MAX_ARG: f64 = 1_647_099.0;

/// Whether the emitters accept values of type `ty`.
pub fn supports(ty: Type) -> bool {
    matches!(ty, types::F32 | types::F64 | types::F32X4 | types::F64X2)
}

/// `e^x`.
pub fn exp(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    Em::new(b, x, ty).exp(x)
}

/// Natural logarithm.
pub fn log(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    Em::new(b, x, ty).log(x)
}

/// Sine (radians).
pub fn sin(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    Em::new(b, x, ty).sincos(x, false)
}

/// Cosine (radians).
pub fn cos(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    Em::new(b, x, ty).sincos(x, true)
}

/// Hyperbolic tangent.
pub fn tanh(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    Em::new(b, x, ty).tanh(x)
}

/// The functions, for `emit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MathFn {
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
}

/// Emits `f(x)`. With `fma`, polynomials are evaluated with fused multiply-adds: one rounding per step instead of
/// two, so results stay within the documented bounds (those were measured without FMA), about a third fewer
/// instructions in the polynomial, and different low bits from the non-FMA form. Pass `fma` only when the host
/// has FMA (Cranelift would otherwise call a libm `fma` per lane).
pub fn emit(f: MathFn, b: &mut FunctionBuilder, x: Value, ty: Type, fma: bool) -> Value {
    let mut em = Em::new(b, x, ty);
    em.fma = fma;
    match f {
        MathFn::Exp => em.exp(x),
        MathFn::Log => em.log(x),
        MathFn::Sin => em.sincos(x, false),
        MathFn::Cos => em.sincos(x, true),
        MathFn::Tanh => em.tanh(x),
    }
}

// ---- constants ------------------------------------------------------------------------------------------------

/// f32 `exp`'s input clamp: past these the result is +inf / +0 anyway, and the clamp keeps the exponent in the range
/// of the two-step scaling. The f32 constants are public for the CPU backend's 8-lane kernels, which compute the same
/// sequences (`kiln-backends`' `cpu/gemm/program_math.rs`).
pub const EXPF_CLAMP: (f64, f64) = (-104.0, 89.0);
/// ln 2 split in two for f32 `exp`'s Cody-Waite reduction and `log`'s `k ln2` (`n * hi` exact for the n that
/// occur), each rounded to f32.
pub const F32_LN2_SPLIT: (f64, f64) = (0.693_359_375, -2.121_944_4e-4);

/// Cephes `expf` polynomial: e^r ~ 1 + r + r^2 * P(r) on |r| <= ln2/2 (highest degree first; Cephes' last
/// coefficient 5.0000001201e-1 rounds to 0.5 in f32).
pub const EXPF_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// e^r ~ 1 + r + r^2 * Q(r) on |r| <= ln2/2 for f64: Chebyshev interpolant of (e^r - 1 - r) / r^2 of degree 9 on
/// [-1.01 ln2/2, 1.01 ln2/2] (max relative error of the exact polynomial 2e-17), highest degree first.
const EXP_Q: [f64; 10] = [
    f64::from_bits(0x3e5a_f3ce_42b1_2b24),
    f64::from_bits(0x3e92_894f_5258_3578),
    f64::from_bits(0x3ec7_1de0_be2b_5e96),
    f64::from_bits(0x3efa_019b_621f_9d08),
    f64::from_bits(0x3f2a_01a0_1a83_ba17),
    f64::from_bits(0x3f56_c16c_1794_e1dc),
    f64::from_bits(0x3f81_1111_1111_0918),
    f64::from_bits(0x3fa5_5555_5555_3b6c),
    f64::from_bits(0x3fc5_5555_5555_5556),
    f64::from_bits(0x3fe0_0000_0000_0001),
];
/// Cephes `logf`: log(1+f) ~ f - f^2/2 + f^3 * P(f) on sqrt(1/2)-1 <= f < sqrt(2)-1.
pub const LOGF_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];
/// fdlibm `log`: Lg1..Lg7.
const LOG_LG: [f64; 7] = [
    6.666_666_666_666_735e-1,
    3.999_999_999_940_942e-1,
    2.857_142_874_366_239e-1,
    2.222_219_843_214_978_4e-1,
    1.818_357_216_161_805e-1,
    1.531_383_769_920_937_3e-1,
    1.479_819_860_511_658_6e-1,
];
/// Cephes `sinf`: sin(r) ~ r + r^3 * P(r^2) on |r| <= pi/4.
const SINF_P: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];
/// Cephes `cosf`: cos(r) ~ 1 - r^2/2 + r^4 * P(r^2).
const COSF_P: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];
/// sin(r) ~ r + r^3 * P(r^2) on |r| <= pi/2 + 0.006 (the FMA form's pi reduction): our fit, minimizing the relative
/// error with the coefficients rounded to f32 one at a time (lowest degree first, the rest refitted), which leaves
/// 0.11 * 2^-24 relative error before evaluation. Highest degree first.
const SINF_PI_P: [f32; 4] = [
    f32::from_bits(0x362e_d98f),
    f32::from_bits(0xb94f_b7de),
    f32::from_bits(0x3c08_876b),
    f32::from_bits(0xbe2a_aaa6),
];
/// pi = sum of these for the f32 FMA reduction: three full-precision f32 parts (~72 bits of pi).
const PI_F32: [f32; 3] = [f32::from_bits(0x4049_0fdb), f32::from_bits(0xb3bb_bd2e), f32::from_bits(0xa777_2ced)];
/// fdlibm `__kernel_sin` S6..S1.
const SIN_S: [f64; 6] = [
    1.589_690_995_211_55e-10,
    -2.505_076_025_340_686_3e-8,
    2.755_731_370_707_006_8e-6,
    -1.984_126_982_985_795e-4,
    8.333_333_333_322_49e-3,
    -1.666_666_666_666_663_2e-1,
];
/// fdlibm `__kernel_cos` C6..C1.
const COS_C: [f64; 6] = [
    -1.135_964_755_778_819_5e-11,
    2.087_572_321_298_175e-9,
    -2.755_731_435_139_066_3e-7,
    2.480_158_728_947_673e-5,
    -1.388_888_888_887_411e-3,
    4.166_666_666_666_66e-2,
];
/// pi/2 = sum of these for f32: four parts of at most 9 significant bits (so `n * part` is exact for n < 2^15)
/// and a full-precision tail; together ~68 bits of pi/2.
const PIO2_F32: [f32; 5] = [
    f32::from_bits(0x3fc9_0000),
    f32::from_bits(0x39fd_8000),
    f32::from_bits(0x34a8_8000),
    f32::from_bits(0x2e85_8000),
    f32::from_bits(0x298c_234c),
];
/// pi/2 = sum of these for f64 (fdlibm pio2_1, pio2_2, pio2_3 of 33 bits, so `n * part` is exact for n < 2^20,
/// and pio2_3t).
const PIO2_F64: [f64; 4] = [
    f64::from_bits(0x3ff9_21fb_5440_0000),
    f64::from_bits(0x3dd0_b461_1a60_0000),
    f64::from_bits(0x3ba3_198a_2e00_0000),
    f64::from_bits(0x397b_839a_2520_49c1),
];
/// Cephes `tanhf`: tanh(x) ~ x + x^3 * P(x^2) for |x| < 0.625.
pub const TANHF_P: [f32; 5] = [-5.704_988_7e-3, 2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1];
/// Cephes `tanh`: tanh(x) ~ x + x^3 * P(x^2) / Q(x^2) for |x| < 0.625 (Q monic).
const TANH_P: [f64; 3] = [-9.643_991_794_250_523e-1, -9.928_772_310_019_186e1, -1.614_687_684_417_084_5e3];
const TANH_Q: [f64; 4] = [1.0, 1.128_116_784_916_329_3e2, 2.235_488_390_601_004_6e3, 4.844_063_053_251_255e3];

// ---- emitter ----------------------------------------------------------------------------------------------------

/// The builder plus the shape of the values being computed.
struct Em<'a, 'f> {
    b: &'a mut FunctionBuilder<'f>,
    /// The float type (scalar or vector).
    ty: Type,
    /// The integer type of the same shape.
    ity: Type,
    /// f64 lanes.
    wide: bool,
    vector: bool,
    /// Evaluate polynomials with fused multiply-adds (only on hosts with FMA; see `emit`).
    fma: bool,
}

impl<'a, 'f> Em<'a, 'f> {
    fn new(b: &'a mut FunctionBuilder<'f>, x: Value, ty: Type) -> Self {
        assert!(supports(ty), "clif_math: unsupported type {ty} (want f32, f64, f32x4 or f64x2)");
        debug_assert_eq!(b.func.dfg.value_type(x), ty, "clif_math: the value's type is not the `ty` passed");
        Em { b, ty, ity: ty.as_int(), wide: ty.lane_type() == types::F64, vector: ty.is_vector(), fma: false }
    }

    // -- shape-dependent basics --

    /// Mantissa bits of the lane type.
    fn mbits(&self) -> i64 {
        if self.wide { 52 } else { 23 }
    }

    fn lane_bits(&self) -> i64 {
        if self.wide { 64 } else { 32 }
    }

    /// Exponent bias of the lane type.
    fn bias(&self) -> i64 {
        if self.wide { 1023 } else { 127 }
    }

    /// Float constant (rounded to f32 for f32 lanes), splatted for vectors.
    fn c(&mut self, v: f64) -> Value {
        let s = if self.wide { self.b.ins().f64const(v) } else { self.b.ins().f32const(v as f32) };
        if self.vector { self.b.ins().splat(self.ty, s) } else { s }
    }

    /// Integer constant in the lane integer type, splatted for vectors.
    fn ic(&mut self, v: i64) -> Value {
        let s = self.b.ins().iconst(self.ity.lane_type(), v);
        if self.vector { self.b.ins().splat(self.ity, s) } else { s }
    }

    /// The integer whose bits are those of the float `v` in the lane type.
    fn bits_of(&self, v: f64) -> i64 {
        if self.wide { v.to_bits() as i64 } else { (v as f32).to_bits() as i64 }
    }

    fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }

    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }

    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }

    fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }

    fn addk(&mut self, a: Value, k: f64) -> Value {
        let k = self.c(k);
        self.add(a, k)
    }

    fn mulk(&mut self, a: Value, k: f64) -> Value {
        let k = self.c(k);
        self.mul(a, k)
    }

    /// Horner evaluation, coefficients highest degree first.
    fn horner(&mut self, x: Value, cs: &[f64]) -> Value {
        let mut p = self.c(cs[0]);
        for &c in &cs[1..] {
            if self.fma {
                let c = self.c(c);
                p = self.b.ins().fma(p, x, c);
            } else {
                p = self.mul(p, x);
                p = self.addk(p, c);
            }
        }
        p
    }

    fn horner32(&mut self, x: Value, cs: &[f32]) -> Value {
        let cs: Vec<f64> = cs.iter().map(|&c| f64::from(c)).collect();
        self.horner(x, &cs)
    }

    fn flags() -> MemFlagsData {
        MemFlagsData::new().with_endianness(Endianness::Little)
    }

    /// Reinterpret float bits as integer lanes.
    fn ibits(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(self.ity, Self::flags(), x)
    }

    /// Reinterpret integer lanes as float bits.
    fn fbits(&mut self, i: Value) -> Value {
        self.b.ins().bitcast(self.ty, Self::flags(), i)
    }

    /// Lane mask `a cc b`: for vectors an all-ones/all-zeros float vector (ready for `bitselect`), for scalars the
    /// `i8` truth value (ready for `select`).
    fn cmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        let m = self.b.ins().fcmp(cc, a, b);
        if self.vector { self.b.ins().bitcast(self.ty, Self::flags(), m) } else { m }
    }

    fn cmpk(&mut self, cc: FloatCC, a: Value, k: f64) -> Value {
        let k = self.c(k);
        self.cmp(cc, a, k)
    }

    /// `m ? a : b` per lane, for a mask from [`Self::cmp`] or [`Self::bit_mask`].
    fn sel(&mut self, m: Value, a: Value, b: Value) -> Value {
        if self.vector { self.b.ins().bitselect(m, a, b) } else { self.b.ins().select(m, a, b) }
    }

    /// A mask from integer lanes that are 0 or 1.
    fn bit_mask(&mut self, i01: Value) -> Value {
        if self.vector {
            let all = self.b.ins().ineg(i01);
            self.fbits(all)
        } else {
            i01
        }
    }

    /// min(x, hi), but NaN in `x` stays NaN (x64 lowers this pattern to one `minps`/`minpd`).
    fn min_keep_nan(&mut self, x: Value, hi: f64) -> Value {
        let hi = self.c(hi);
        let m = self.cmp(FloatCC::LessThan, hi, x);
        self.sel(m, hi, x)
    }

    /// max(x, lo), but NaN in `x` stays NaN (x64: one `maxps`/`maxpd`).
    fn max_keep_nan(&mut self, x: Value, lo: f64) -> Value {
        let lo = self.c(lo);
        let m = self.cmp(FloatCC::LessThan, x, lo);
        self.sel(m, lo, x)
    }

    fn sign_mask(&self) -> i64 {
        if self.wide { i64::MIN } else { 0x8000_0000 }
    }

    /// `mag` (non-negative or NaN) with the sign bit of `s`.
    fn with_sign_of(&mut self, mag: Value, s: Value) -> Value {
        let si = self.ibits(s);
        let sm = self.ic(self.sign_mask());
        let sign = self.b.ins().band(si, sm);
        let mi = self.ibits(mag);
        let r = self.b.ins().bor(mi, sign);
        self.fbits(r)
    }

    /// Round to nearest integer (ties to even) for |y| < 2^(mbits-1), without SSE4.1's `round`: returns
    /// `(t, magic)` with `t = y + magic`, so that `t - magic` is round(y) as a float (exactly) and
    /// `bits(t) - bits(magic)` is round(y) as an integer (see [`Self::round_int`]); the low bits of `bits(t)` alone
    /// are round(y) modulo a power of two. Relies on Cranelift never reassociating float arithmetic.
    fn round_magic(&mut self, y: Value) -> (Value, f64) {
        let magic = if self.wide { 1.5 * 2f64.powi(52) } else { 1.5 * 2f64.powi(23) };
        let t = self.addk(y, magic);
        (t, magic)
    }

    /// The integer `n` from [`Self::round_magic`]'s `t`.
    fn round_int(&mut self, t: Value, magic: f64) -> Value {
        let ti = self.ibits(t);
        let mb = self.ic(self.bits_of(magic));
        self.b.ins().isub(ti, mb)
    }

    /// 2^n for integer lanes `n` with `1 - bias <= n <= bias`.
    fn pow2i(&mut self, n: Value) -> Value {
        let bias = self.ic(self.bias());
        let e = self.b.ins().iadd(n, bias);
        let mb = self.mbits();
        let e = self.b.ins().ishl_imm_u(e, mb);
        self.fbits(e)
    }

    // -- exp --

    /// For moderate `x`: `(p, n)` with e^x = p * 2^n, p in [sqrt(1/2), sqrt(2)] and `n` integer lanes.
    fn exp_reduced(&mut self, x: Value) -> (Value, Value) {
        let y = self.mulk(x, std::f64::consts::LOG2_E);
        let (t, magic) = self.round_magic(y);
        let nf = self.addk(t, -magic);
        // Cody-Waite: r = x - n*ln2 with ln2 split so that n*hi is exact.
        let (hi, lo) = if self.wide {
            (f64::from_bits(0x3fe6_2e42_fee0_0000), f64::from_bits(0x3dea_39ef_3579_3c76))
        } else {
            F32_LN2_SPLIT
        };
        let h = self.mulk(nf, hi);
        let r = self.sub(x, h);
        let l = self.mulk(nf, lo);
        let r = self.sub(r, l);
        let q = if self.wide { self.horner(r, &EXP_Q) } else { self.horner32(r, &EXPF_P) };
        let r2 = self.mul(r, r);
        let p = self.mul(q, r2);
        let p = self.add(p, r);
        let p = self.addk(p, 1.0);
        let n = self.round_int(t, magic);
        (p, n)
    }

    fn exp(&mut self, x: Value) -> Value {
        // Past these the result is +inf / +0 anyway; clamping keeps n in the range of the two-step scale below.
        let (lo, hi) = if self.wide { (-746.0, 710.0) } else { EXPF_CLAMP };
        let x = self.max_keep_nan(x, lo);
        let x = self.min_keep_nan(x, hi);
        let (p, n) = self.exp_reduced(x);
        // 2^n = 2^n1 * 2^n2 with both halves normal, so that overflow, and underflow into subnormals (rounded once,
        // by the last multiply), come out right.
        let n1 = self.b.ins().sshr_imm_u(n, 1);
        let n2 = self.b.ins().isub(n, n1);
        let s1 = self.pow2i(n1);
        let s2 = self.pow2i(n2);
        let r = self.mul(p, s1);
        self.mul(r, s2)
    }

    // -- log --

    fn log(&mut self, x: Value) -> Value {
        let (min_normal, den_scale, den_shift) = if self.wide {
            (f64::MIN_POSITIVE, 2f64.powi(54), 54.0)
        } else {
            (f64::from(f32::MIN_POSITIVE), 2f64.powi(23), 23.0)
        };
        // Subnormals: scale into the normal range first.
        let den = self.cmpk(FloatCC::LessThan, x, min_normal);
        let xs = self.mulk(x, den_scale);
        let xs = self.sel(den, xs, x);
        // x = z * 2^k with z in [sqrt(1/2), sqrt(2)): subtracting the bits of sqrt(1/2) (exponent field cleared to
        // 0 so the difference stays non-negative) makes the exponent field of the difference k + (bias - 1).
        let (off, mant_mask) =
            if self.wide { (0x3fe6_a09e_667f_3bcd_i64, (1i64 << 52) - 1) } else { (0x3f35_04f3_i64, (1i64 << 23) - 1) };
        let off_noexp = off - ((self.bias() - 1) << self.mbits());
        let ix = self.ibits(xs);
        let offv = self.ic(off_noexp);
        let tmp = self.b.ins().isub(ix, offv);
        let mb = self.mbits();
        let kb = self.b.ins().ushr_imm_u(tmp, mb);
        let mm = self.ic(mant_mask);
        let zb = self.b.ins().band(tmp, mm);
        let offv = self.ic(off);
        let zb = self.b.ins().iadd(zb, offv);
        let z = self.fbits(zb);
        // k as a float: kb is small and non-negative, so or-ing it into the mantissa of 2^mbits is exact.
        let two_m = 2f64.powi(self.mbits() as i32);
        let tb = self.ic(self.bits_of(two_m));
        let kf = self.b.ins().bor(kb, tb);
        let kf = self.fbits(kf);
        let base = two_m + (self.bias() - 1) as f64;
        let kadj_n = self.c(base);
        let kadj_d = self.c(base + den_shift);
        let kadj = self.sel(den, kadj_d, kadj_n);
        let k = self.sub(kf, kadj);
        let f = self.addk(z, -1.0);

        let res = if self.wide {
            // fdlibm e_log.c
            let two = self.addk(f, 2.0);
            let s = self.div(f, two);
            let s2 = self.mul(s, s);
            let w = self.mul(s2, s2);
            let t1 = self.horner(w, &[LOG_LG[5], LOG_LG[3], LOG_LG[1]]);
            let t1 = self.mul(t1, w);
            let t2 = self.horner(w, &[LOG_LG[6], LOG_LG[4], LOG_LG[2], LOG_LG[0]]);
            let t2 = self.mul(t2, s2);
            let r = self.add(t2, t1);
            let ff = self.mul(f, f);
            let hfsq = self.mulk(ff, 0.5);
            let a = self.add(hfsq, r);
            let a = self.mul(s, a);
            let klo = self.mulk(k, f64::from_bits(0x3dea_39ef_3579_3c76));
            let a = self.add(a, klo);
            let a = self.sub(hfsq, a);
            let a = self.sub(a, f);
            let khi = self.mulk(k, f64::from_bits(0x3fe6_2e42_fee0_0000));
            self.sub(khi, a)
        } else {
            // Cephes logf.c
            let z2 = self.mul(f, f);
            let p = self.horner32(f, &LOGF_P);
            let y = self.mul(p, f);
            let y = self.mul(y, z2);
            let klo = self.mulk(k, F32_LN2_SPLIT.1);
            let y = self.add(y, klo);
            let hz = self.mulk(z2, 0.5);
            let y = self.sub(y, hz);
            let r = self.add(f, y);
            let khi = self.mulk(k, F32_LN2_SPLIT.0);
            self.add(r, khi)
        };

        // Special values: NaN -> NaN (the input), +inf -> +inf, x < 0 -> NaN, ±0 -> -inf.
        let big = self.cmpk(FloatCC::UnorderedOrGreaterThanOrEqual, x, f64::INFINITY);
        let res = self.sel(big, x, res);
        let neg = self.cmpk(FloatCC::LessThan, x, 0.0);
        let nan = self.c(f64::NAN);
        let res = self.sel(neg, nan, res);
        let zero = self.cmpk(FloatCC::Equal, x, 0.0);
        let minf = self.c(f64::NEG_INFINITY);
        self.sel(zero, minf, res)
    }

    // -- sin / cos --

    fn sincos(&mut self, x: Value, cos: bool) -> Value {
        if self.fma && !self.wide {
            return self.sincos_f32_fma(x, cos);
        }
        // Work on |x| (sin is odd, cos even); this also keeps sin(-0) = -0.
        let a = self.b.ins().fabs(x);
        let y = self.mulk(a, std::f64::consts::FRAC_2_PI);
        let (t, magic) = self.round_magic(y);
        let j = self.addk(t, -magic);
        let (s, c) = if self.wide {
            // r + rlo = a - j*pi/2 as a double-double: a - j*P1 is exact (j < 2^20), the subtraction of j*P2 keeps
            // its rounding error (Fast2Sum), and j*(P3 + P4) is tiny enough to be added to the tail.
            let [p1, p2, p3, p4] = PIO2_F64;
            let jp1 = self.mulk(j, p1);
            let r1 = self.sub(a, jp1);
            let jp2 = self.mulk(j, p2);
            let r2 = self.sub(r1, jp2);
            let t2 = self.sub(r1, r2);
            let t2 = self.sub(t2, jp2);
            let jp3 = self.mulk(j, p3);
            let jp4 = self.mulk(j, p4);
            let w = self.add(jp3, jp4);
            let tail = self.sub(t2, w);
            let r = self.add(r2, tail);
            let rlo = self.sub(r2, r);
            let rlo = self.add(rlo, tail);
            // In the accurate range |r| <= pi/4 + a hair and |rlo| <= 2^-53 |r|; the clamps only bound the garbage
            // far beyond it.
            let r = self.max_keep_nan(r, -0.8);
            let r = self.min_keep_nan(r, 0.8);
            let rlo = self.max_keep_nan(rlo, -1e-15);
            let rlo = self.min_keep_nan(rlo, 1e-15);
            let z = self.mul(r, r);
            let hz = self.mulk(z, 0.5);
            let one = self.c(1.0);
            let w = self.sub(one, hz);
            // sin(r + rlo) ~ sin(r) + rlo * (1 - r^2/2)
            let ps = self.horner(z, &SIN_S);
            let v = self.mul(z, r);
            let s = self.mul(v, ps);
            let sc = self.mul(rlo, w);
            let s = self.add(s, sc);
            let s = self.add(r, s);
            // cos(r + rlo) ~ cos(r) - r * rlo, cos(r) summed as in fdlibm's __kernel_cos
            let pc = self.horner(z, &COS_C);
            let pc = self.mul(pc, z);
            let pc = self.mul(pc, z);
            let e = self.sub(one, w);
            let e = self.sub(e, hz);
            let rr = self.mul(r, rlo);
            let pc = self.sub(pc, rr);
            let e = self.add(e, pc);
            let c = self.add(w, e);
            (s, c)
        } else {
            let mut r = a;
            for p in PIO2_F32 {
                let jp = self.mulk(j, f64::from(p));
                r = self.sub(r, jp);
            }
            // In the accurate range |r| <= pi/4 + a hair; the clamp only bounds the garbage far beyond it.
            let r = self.max_keep_nan(r, -0.8);
            let r = self.min_keep_nan(r, 0.8);
            let z = self.mul(r, r);
            let ps = self.horner32(z, &SINF_P);
            let s = self.mul(ps, z);
            let s = self.mul(s, r);
            let s = self.add(s, r);
            let pc = self.horner32(z, &COSF_P);
            let pc = self.mul(pc, z);
            let pc = self.mul(pc, z);
            let hz = self.mulk(z, 0.5);
            let c = self.sub(pc, hz);
            let c = self.addk(c, 1.0);
            (s, c)
        };

        // Quadrant q = j mod 4 (the low bits of t's pattern; the magic constant's low bits are zero).
        let mut q = self.ibits(t);
        if cos {
            let one = self.ic(1);
            q = self.b.ins().iadd(q, one);
        }
        let one = self.ic(1);
        let odd = self.b.ins().band(q, one);
        let odd = self.bit_mask(odd);
        let res = self.sel(odd, c, s);
        let two = self.ic(2);
        let neg = self.b.ins().band(q, two);
        let sh = self.lane_bits() - 2;
        let flip = self.b.ins().ishl_imm_u(neg, sh);
        self.flip_sign(res, flip, x, !cos)
    }

    /// `v` with its sign bit flipped by the sign bit of the integer lanes `flip`, and, for an odd function
    /// (`odd`), by the sign of its argument `x` as well.
    fn flip_sign(&mut self, v: Value, mut flip: Value, x: Value, odd: bool) -> Value {
        if odd {
            let xi = self.ibits(x);
            let sm = self.ic(self.sign_mask());
            let xs = self.b.ins().band(xi, sm);
            flip = self.b.ins().bxor(flip, xs);
        }
        let vi = self.ibits(v);
        let vi = self.b.ins().bxor(vi, flip);
        self.fbits(vi)
    }

    /// f32 `sin`/`cos` on hosts with FMA: reduce modulo pi (not pi/2) and evaluate one odd polynomial, so each
    /// lane needs one polynomial instead of a sine and a cosine polynomial plus a select. About half the
    /// instructions of the two-polynomial form (the sin chain benchmark is bound by them).
    ///
    /// sin: `j = round(|x| / pi)`, `r = |x| - j pi` in [-pi/2, pi/2], `sin(|x|) = (-1)^j sin(r)`.
    /// cos: `q = 2 round(|x| / pi - 1/2) + 1` (odd), `r = |x| - q pi/2`, `cos(|x|) = -(-1)^((q-1)/2) sin(r)`.
    ///
    /// The reduction subtracts `j * PI_F32[i]` with one fused multiply-add each: the product is exact inside the
    /// FMA, and the first step is exact as a whole (both `|x|` and `j * PI_F32[0]` are multiples of
    /// min(ulp(|x|), 2^-23) and the difference is below 2), so `r` carries two roundings. Without FMA the products
    /// would need short parts (as `PIO2_F32`), which is why the non-FMA form keeps Cephes' pi/2 reduction.
    fn sincos_f32_fma(&mut self, x: Value, cos: bool) -> Value {
        let a = self.b.ins().fabs(x);
        let inv_pi = self.c(std::f64::consts::FRAC_1_PI);
        let y = if cos {
            let half = self.c(-0.5);
            self.b.ins().fma(a, inv_pi, half)
        } else {
            self.mul(a, inv_pi)
        };
        let (t, magic) = self.round_magic(y);
        let j = self.addk(t, -magic);
        // The multiple of pi/2 to subtract: j (in units of pi) for sin, q = 2j + 1 (in units of pi/2) for cos.
        let (m, parts) = if cos {
            let two = self.c(2.0);
            let one = self.c(1.0);
            (self.b.ins().fma(j, two, one), PI_F32.map(|p| p * 0.5))
        } else {
            (j, PI_F32)
        };
        let m = self.b.ins().fneg(m);
        let mut r = a;
        for p in parts {
            let p = self.c(f64::from(p));
            r = self.b.ins().fma(m, p, r);
        }
        // In the accurate range |r| <= pi/2 + 0.0052: |x| / pi carries two roundings (1/pi in f32, the product),
        // up to 1.6e-3 at |x| = 51471, so j may be off by one within that distance of a half-integer. The clamp
        // only bounds the garbage far beyond the range; the polynomial stays below 1 in magnitude up to it.
        let r = self.max_keep_nan(r, -1.5768);
        let r = self.min_keep_nan(r, 1.5768);
        let z = self.mul(r, r);
        let p = self.horner32(z, &SINF_PI_P);
        let rz = self.mul(r, z);
        let s = self.b.ins().fma(rz, p, r);
        // Near r = +-pi/2 the evaluation can round one ulp past 1 (cos(3e-6) gave 1.0000001): clamp, so that
        // |sin|, |cos| <= 1 always holds.
        let s = self.max_keep_nan(s, -1.0);
        let s = self.min_keep_nan(s, 1.0);
        // Sign: the parity of j (the low bit of t's pattern) flips it; for sin so does x's sign, for cos an even
        // j does.
        let mut q = self.ibits(t);
        if cos {
            let one = self.ic(1);
            q = self.b.ins().iadd(q, one);
        }
        let sh = self.lane_bits() - 1;
        let flip = self.b.ins().ishl_imm_u(q, sh);
        self.flip_sign(s, flip, x, !cos)
    }

    // -- tanh --

    fn tanh(&mut self, x: Value) -> Value {
        // Work on a = |x| and copy x's sign at the end (tanh is odd); keeps tanh(-0) = -0.
        let a = self.b.ins().fabs(x);
        let small = self.cmpk(FloatCC::LessThan, a, 0.625);
        // Large branch: tanh(a) = 1 - 2 / (e^(2a) + 1). 2a is capped at 40 where tanh is 1 in both widths; NaN
        // stays NaN. No overflow or underflow, so a single 2^n scale suffices.
        let a2 = self.add(a, a);
        let u = self.min_keep_nan(a2, 40.0);
        let (p, n) = self.exp_reduced(u);
        let s = self.pow2i(n);
        let e = self.mul(p, s);
        let e1 = self.addk(e, 1.0);
        let z = self.mul(a, a);
        let one = self.c(1.0);
        let res = if self.wide {
            // Small branch: a + a^3 P(a^2) / Q(a^2); share the division with the large branch.
            let pz = self.horner(z, &TANH_P);
            let az = self.mul(a, z);
            let num_s = self.mul(az, pz);
            let den_s = self.horner(z, &TANH_Q);
            let two = self.c(2.0);
            let num = self.sel(small, num_s, two);
            let den = self.sel(small, den_s, e1);
            let q = self.div(num, den);
            let sm = self.add(a, q);
            let bg = self.sub(one, q);
            self.sel(small, sm, bg)
        } else {
            let pz = self.horner32(z, &TANHF_P);
            let sm = self.mul(pz, z);
            let sm = self.mul(sm, a);
            let sm = self.add(sm, a);
            let two = self.c(2.0);
            let q = self.div(two, e1);
            let bg = self.sub(one, q);
            self.sel(small, sm, bg)
        };
        self.with_sign_of(res, x)
    }
}

#[cfg(test)]
mod tests;
