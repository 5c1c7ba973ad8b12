//! f16 in generated code: values live in registers as f32 (every one exactly an f16 value), are loaded as 16-bit
//! words and widened, computed in f32 and rounded back to f16 after each op, and stored as 16-bit words.
//!
//! Why not Cranelift's `f16` type: cranelift-codegen 0.135 has the type and `f16const`, but its x86-64 backend
//! lowers no f16 arithmetic and no `fpromote`/`fdemote` to or from f16 (and does not use F16C's `vcvtph2ps` /
//! `vcvtps2ph`). The conversions are therefore integer bit manipulation, written once for a scalar (`i32`/`f32`) or
//! a 4-lane vector (`i32x4`/`f32x4`), so vector loops stay vector loops:
//! - widening (`f16_to_f32`) is exact: normal numbers move their exponent, subnormals are `m * 2^-24` computed as
//!   an int-to-float conversion times a power of two (no f32 subnormal is ever read, so a thread running with
//!   denormals-are-zero gets the same result), infinities and NaNs keep their payload bits;
//! - narrowing (`f32_to_f16`) rounds to nearest, ties to even: normal results by adding a rounding bias before the
//!   shift (the carry turns 65520 and above into infinity), subnormal results by one f32 addition of 0.5, whose
//!   rounding is exactly the f16 rounding at that scale; NaN stays NaN (quieted, top payload bits kept, as `half`).
//!
//! f64 -> f16 is a libcall (`Libcall::F64ToF16`): narrowing through f32 would round twice. It is scalar-only, as
//! every f64 value is.
//!
//! bf16 is f32's top half, so it is simpler: widening is a 16-bit shift (exact for every value), narrowing adds
//! `0x7fff` plus the lowest kept bit (ties to even; the carry rounds the largest values to infinity) and shifts back,
//! NaN kept NaN and quieted. f64 -> bf16 goes through f32 (PyTorch's conversion, two roundings: see
//! `dtype::bf16_from_f64`).

use super::*;

/// Bits of 2^-24 (the f16 subnormal step) as an f32.
const TWO_POW_M24: u32 = 0x3380_0000;

impl Emitter<'_> {
    /// An i32 constant, splatted for vectors.
    fn ik(&mut self, x: u32, lanes: usize) -> Value {
        let c = self.b.ins().iconst(types::I32, x as i64);
        if lanes > 1 { self.b.ins().splat(types::I32X4, c) } else { c }
    }

    /// An f32 constant from its bits, splatted for vectors.
    fn fk(&mut self, bits: u32, lanes: usize) -> Value {
        let c = self.b.ins().f32const(f32::from_bits(bits));
        if lanes > 1 { self.b.ins().splat(types::F32X4, c) } else { c }
    }

    /// `x << n` and `x >> n` (logical), lane by lane for vectors (the amount is a scalar in both forms).
    fn shl(&mut self, x: Value, n: i64) -> Value {
        let n = self.b.ins().iconst(types::I32, n);
        self.b.ins().ishl(x, n)
    }

    fn shr(&mut self, x: Value, n: i64) -> Value {
        let n = self.b.ins().iconst(types::I32, n);
        self.b.ins().ushr(x, n)
    }

    /// `cond ? a : b` for a scalar bool (i8) or a vector lane mask.
    fn sel(&mut self, cond: Value, a: Value, b: Value, lanes: usize) -> Value {
        if lanes > 1 { self.b.ins().bitselect(cond, a, b) } else { self.b.ins().select(cond, a, b) }
    }

    fn bits_of(&mut self, x: Value, lanes: usize) -> Value {
        let t = if lanes > 1 { types::I32X4 } else { types::I32 };
        self.b.ins().bitcast(t, little(), x)
    }

    fn float_of(&mut self, x: Value, lanes: usize) -> Value {
        let t = if lanes > 1 { types::F32X4 } else { types::F32 };
        self.b.ins().bitcast(t, little(), x)
    }

    /// The f32 value of f16 bit patterns (`h`: i32 or i32x4 holding a u16 each). Exact.
    pub(super) fn f16_to_f32(&mut self, h: Value, lanes: usize) -> Value {
        let k7fff = self.ik(0x7fff, lanes);
        let em = self.b.ins().band(h, k7fff);
        let k8000 = self.ik(0x8000, lanes);
        let sign = self.b.ins().band(h, k8000);
        let sign = self.shl(sign, 16);
        let shifted = self.shl(em, 13);
        // Normal: rebias the exponent by 127 - 15.
        let bias = self.ik(112 << 23, lanes);
        let normal = self.b.ins().iadd(shifted, bias);
        // Inf and NaN: all exponent bits set, mantissa kept.
        let expmax = self.ik(0x7f80_0000, lanes);
        let special = self.b.ins().bor(shifted, expmax);
        // Subnormal (and zero): m * 2^-24, exact (m < 2^10).
        let t = if lanes > 1 { types::F32X4 } else { types::F32 };
        let m = self.b.ins().fcvt_from_sint(t, em);
        let step = self.fk(TWO_POW_M24, lanes);
        let sub = self.b.ins().fmul(m, step);
        let sub = self.bits_of(sub, lanes);
        let kinf = self.ik(0x7c00, lanes);
        let is_special = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, em, kinf);
        let kmin = self.ik(0x0400, lanes);
        let is_sub = self.b.ins().icmp(IntCC::SignedLessThan, em, kmin);
        let r = self.sel(is_sub, sub, normal, lanes);
        let r = self.sel(is_special, special, r, lanes);
        let r = self.b.ins().bor(r, sign);
        self.float_of(r, lanes)
    }

    /// The f16 bit pattern (i32 or i32x4 holding a u16 each) nearest to `x` (f32 or f32x4), ties to even.
    pub(super) fn f32_to_f16(&mut self, x: Value, lanes: usize) -> Value {
        let u = self.bits_of(x, lanes);
        let ksign = self.ik(0x8000_0000, lanes);
        let sign = self.b.ins().band(u, ksign);
        let a = self.b.ins().bxor(u, sign);
        // |x| >= 65536 (or inf, NaN): inf, or a quiet NaN with the top payload bits.
        let knan_payload = self.ik(0x3ff, lanes);
        let payload = self.shr(a, 13);
        let payload = self.b.ins().band(payload, knan_payload);
        let kqnan = self.ik(0x7e00, lanes);
        let nan = self.b.ins().bor(payload, kqnan);
        let kinf = self.ik(0x7c00, lanes);
        let expmax = self.ik(0x7f80_0000, lanes);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, a, expmax);
        let special = self.sel(is_nan, nan, kinf, lanes);
        // Subnormal or zero result (|x| < 2^-14): x + 0.5 rounds to a multiple of 2^-24, which is the answer.
        let fa = self.float_of(a, lanes);
        let half_bits = 0x3f00_0000;
        let khalf = self.fk(half_bits, lanes);
        let sum = self.b.ins().fadd(fa, khalf);
        let sum = self.bits_of(sum, lanes);
        let khalf_i = self.ik(half_bits, lanes);
        let sub = self.b.ins().isub(sum, khalf_i);
        // Normal result: rebias, add 0xfff plus the lowest kept bit (ties to even), shift. A carry out of the
        // mantissa bumps the exponent, up to infinity.
        let odd = self.shr(a, 13);
        let kone = self.ik(1, lanes);
        let odd = self.b.ins().band(odd, kone);
        let kbias = self.ik(((-112i32 << 23) as u32).wrapping_add(0xfff), lanes);
        let n = self.b.ins().iadd(a, kbias);
        let n = self.b.ins().iadd(n, odd);
        let normal = self.shr(n, 13);
        let kbig = self.ik(143 << 23, lanes);
        let is_big = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, a, kbig);
        let ksmall = self.ik(113 << 23, lanes);
        let is_small = self.b.ins().icmp(IntCC::SignedLessThan, a, ksmall);
        let r = self.sel(is_small, sub, normal, lanes);
        let r = self.sel(is_big, special, r, lanes);
        let sign = self.shr(sign, 16);
        self.b.ins().bor(r, sign)
    }

    /// `x` (f32 or f32x4) rounded to the nearest f16 value, still as f32.
    pub(super) fn round_f16(&mut self, x: Value, lanes: usize) -> Value {
        let h = self.f32_to_f16(x, lanes);
        self.f16_to_f32(h, lanes)
    }

    /// The f32 value of bf16 bit patterns (`h`: i32 or i32x4 holding a u16 each). Exact.
    pub(super) fn bf16_to_f32(&mut self, h: Value, lanes: usize) -> Value {
        let w = self.shl(h, 16);
        self.float_of(w, lanes)
    }

    /// The bf16 bit pattern (i32 or i32x4 holding a u16 each) nearest to `x` (f32 or f32x4), ties to even.
    pub(super) fn f32_to_bf16(&mut self, x: Value, lanes: usize) -> Value {
        let u = self.bits_of(x, lanes);
        let odd = self.shr(u, 16);
        let kone = self.ik(1, lanes);
        let odd = self.b.ins().band(odd, kone);
        let kbias = self.ik(0x7fff, lanes);
        let n = self.b.ins().iadd(u, kbias);
        let n = self.b.ins().iadd(n, odd);
        let rounded = self.shr(n, 16);
        // NaN: the top bits with the quiet bit set (the sign kept), as `half`.
        let top = self.shr(u, 16);
        let kquiet = self.ik(0x40, lanes);
        let nan = self.b.ins().bor(top, kquiet);
        let kabs = self.ik(0x7fff_ffff, lanes);
        let a = self.b.ins().band(u, kabs);
        let expmax = self.ik(0x7f80_0000, lanes);
        let is_nan = self.b.ins().icmp(IntCC::SignedGreaterThan, a, expmax);
        self.sel(is_nan, nan, rounded, lanes)
    }

    /// `x` (f32 or f32x4) rounded to the nearest value of the 16-bit float `d` (f16 or bf16), still as f32.
    pub(super) fn round_half(&mut self, d: DType, x: Value, lanes: usize) -> Value {
        match d {
            DType::BF16 => {
                let h = self.f32_to_bf16(x, lanes);
                self.bf16_to_f32(h, lanes)
            }
            _ => self.round_f16(x, lanes),
        }
    }

    /// Loads one 16-bit float of dtype `d` at `addr + offset` as its f32 value.
    pub(super) fn load_half(&mut self, d: DType, addr: Value, offset: i32) -> Value {
        let h = self.b.ins().uload16(types::I32, MemFlagsData::trusted(), addr, offset);
        if d == DType::BF16 { self.bf16_to_f32(h, 1) } else { self.f16_to_f32(h, 1) }
    }

    /// Loads four consecutive 16-bit floats of dtype `d` at `addr + offset` as an f32x4.
    pub(super) fn load_halfx4(&mut self, d: DType, addr: Value, offset: i32) -> Value {
        let h = self.b.ins().uload16x4(vector_flags(), addr, offset);
        if d == DType::BF16 { self.bf16_to_f32(h, LANES) } else { self.f16_to_f32(h, LANES) }
    }

    /// Stores `v` (f32 or f32x4 of values of the 16-bit float `d`) as 16-bit words at `addr + at` bytes.
    pub(super) fn store_half(&mut self, d: DType, v: Value, addr: Value, at: i32, lanes: usize) {
        // `v` holds values of `d` already, so this narrowing is exact; it is the same code as any rounding.
        let h = if d == DType::BF16 { self.f32_to_bf16(v, lanes) } else { self.f32_to_f16(v, lanes) };
        if lanes == 1 {
            self.b.ins().istore16(MemFlagsData::trusted(), h, addr, at);
            return;
        }
        let packed = self.b.ins().unarrow(h, h);
        let wide = self.b.ins().bitcast(types::I64X2, little(), packed);
        let low = self.b.ins().extractlane(wide, 0);
        self.b.ins().store(vector_flags(), low, addr, at);
    }
}

fn little() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}
