//! `clif_math`'s f32 `exp`, `tanh` and `log` as register programs (`program::EpProgram`), for generated elementwise
//! kernels, GEMM epilogues and row sums. Each is the Cranelift kernels' sequence in its FMA form (the form on every
//! host that runs generated code, which has FMA), operation for operation and constant for constant (the constants
//! come from `clif_math`), so an element gets the same bits from either kind of kernel; `tests/wide.rs` checks that
//! against a Cranelift run. One deliberate difference: in a program for 16 lanes (`epilogue::Allow::scalef`) the
//! final scaling by `2^n` of `exp` and `tanh` is one `vscalefps` instead of the exponent-field arithmetic, which
//! computes the same correctly rounded product, and `n` is rounded by one `vrndscaleps` instead of the magic
//! number's add and subtract, the same value; so the bits still agree. Constants are `EpInst::Const`/`BinK`
//! operands, read from the code's constant pool.
//!
//! Why the sequences are written twice (here and in `clif_math`) rather than emitted from one description: the two
//! targets are different instruction sets with different register disciplines (Cranelift IR values in SSA, and an
//! `EpProgram` of AVX2 operations whose registers `asm` allocates from a fixed file), and each sequence is ten to
//! thirty operations; a shared emitter trait would have to model both allocators to save that. What must not drift,
//! the constants and the order of the rounding operations, is shared: the constants are `clif_math`'s, and the
//! bit-for-bit test against the Cranelift kernels fails on any reordering.

use super::program::{EpInst, EpProgram, VBin, pred};

/// Appends f32 `e^x` and returns its value: `clif_math`'s f32 `exp` in its FMA form (the Cranelift kernels' form on
/// the hosts these programs run on, which have FMA) operation for operation, so an element gets the same bits from
/// either kernel: clamp, then [`push_exp_reduced`], then `p * 2^n1 * 2^n2` with `n1 = n >> 1`, `n2 = n - n1`
/// (overflow and subnormal results rounded once, by the last multiply).
///
/// Except how a subnormal (or zero) result is rounded: where `n <= -127`, the last multiply would produce a
/// subnormal, which x86 cores finish in a microcode assist (~100 cycles a lane; the -inf of a causal attention
/// mask made a whole exp kernel 5x slower). There the same rounding is done in the normal range: `p * 2^(n + 149)`
/// plus 2^23 in one fused multiply-add rounds to an integer (ties to even) in the mantissa, which is the
/// subnormal's bit pattern, the bits the multiply would have given. The two paths are selected without a mask
/// register beyond 4 (what a 14-row bf16 tile leaves): `g` is 1 where `n <= -127` and 0 above, the subnormal path
/// runs on `p * g` (so it gives 0 bits above), the normal one on `p - p * g` (so it gives +0 below), and the
/// results are or-ed. A NaN stays the NaN the normal path gives: the other path's bits are a subset
/// of it.
///
/// With `scalef` (a program for 16 lanes only) all of that scaling is one `vscalefps` of `p` by `n` as a float (and
/// `n` one `vrndscaleps`, see [`push_exp_reduced`]):
/// `p * 2^n` rounded once, in the normal, overflowing and subnormal ranges alike, which is the value both paths
/// above compute, so the bits are the same (`tests/wide.rs` holds the 16-lane kernels to the Cranelift ones). That
/// takes the exponential from ~40 instructions to ~20, and it is what bounds softmax and the other exp-heavy row
/// and elementwise kernels. `vscalefps` underflows like the multiply, so at the lower clamp, where the result is +0,
/// it scales +0 instead of `p` (two more instructions; `exp_below_its_clamp_does_not_underflow` in `tests/wide.rs`
/// reads MXCSR's underflow flag around each width's kernel).
pub(super) fn push_exp(p: &mut EpProgram, x: usize, scalef: bool) -> usize {
    use kiln_jit::render::clif_math::EXPF_CLAMP;
    let x = push_inst(p, EpInst::MaxK(x, f32_bits(EXPF_CLAMP.0)));
    let x = push_inst(p, EpInst::MinK(x, f32_bits(EXPF_CLAMP.1)));
    if scalef {
        let (e, nf) = push_exp_reduced(p, x, Exponent::Float);
        // At the lower clamp (x <= -104, a causal mask's -inf) the product rounds to +0, but `vscalefps` still
        // underflows to get there, and an underflow is a microcode assist (~100 cycles): a softmax over masked
        // scores ran 5x slower. Scaling +0 instead gives the same +0 without one. Only the subnormal results
        // between (-104 < x < -87.3) still take the assist, as they must to be rounded.
        let floor = push_inst(p, EpInst::Const(f32_bits(EXPF_CLAMP.0)));
        let under = push_inst(p, EpInst::Cmp(pred::LE_OQ, x, floor));
        let zero = push_inst(p, EpInst::Const(0));
        let e = push_inst(p, EpInst::Select { mask: under, t: zero, f: e });
        return push_inst(p, EpInst::Scalef(e, nf));
    }
    let (e, n) = push_exp_reduced(p, x, Exponent::Int);
    let k = push_inst(p, EpInst::BinK(VBin::IAdd, n, 149));
    // All ones exactly where n <= -127: the sign of n + 126, spread.
    let m = push_inst(p, EpInst::BinK(VBin::IAdd, n, 126));
    let tiny = push_inst(p, EpInst::Sar(m, 31));
    // 2^(n + 149) there (n + 149 in -1..=22), 2^0 elsewhere.
    let k = push_inst(p, EpInst::Bin(VBin::And, k, tiny));
    let sk = push_pow2(p, k);
    // g = 1 there, 0 elsewhere: the subnormal path runs on p * g, the normal one on p - p * g.
    let g = push_inst(p, EpInst::BinK(VBin::And, tiny, f32_bits(1.0)));
    let et = push_inst(p, EpInst::Bin(VBin::Mul, e, g));
    let en = push_inst(p, EpInst::Bin(VBin::Sub, e, et));
    let two23 = f32_bits(2f64.powi(23));
    let t = push_inst(p, EpInst::FmaK(et, sk, two23));
    let sub = push_inst(p, EpInst::BinK(VBin::ISub, t, two23));
    let n1 = push_inst(p, EpInst::Sar(n, 1));
    let n2 = push_inst(p, EpInst::Bin(VBin::ISub, n, n1));
    let s1 = push_pow2(p, n1);
    let s2 = push_pow2(p, n2);
    let x1 = push_inst(p, EpInst::Bin(VBin::Mul, en, s1));
    let normal = push_inst(p, EpInst::Bin(VBin::Mul, x1, s2));
    push_inst(p, EpInst::Bin(VBin::Or, normal, sub))
}

/// How [`push_exp_reduced`] gives `n`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Exponent {
    /// In integer lanes, for scaling through the exponent field.
    Int,
    /// As an f32 (an integral value), for `vscalefps`.
    Float,
}

/// `(p, n)` with e^x = p * 2^n for a clamped `x` (`clif_math`'s `exp_reduced`, f32, FMA form): `n = round(x log2 e)`
/// by the magic-number trick, Cody-Waite `r = x - n ln2`, `p = 1 + r + r^2 P(r)` with the Cephes polynomial by
/// fused multiply-adds; `n` in integer lanes or as a float (`form`).
fn push_exp_reduced(p: &mut EpProgram, x: usize, form: Exponent) -> (usize, usize) {
    use kiln_jit::render::clif_math::{EXPF_P, F32_LN2_SPLIT};
    let magic = 1.5 * 2f64.powi(23);
    let y = push_inst(p, EpInst::BinK(VBin::Mul, x, f32_bits(std::f64::consts::LOG2_E)));
    let (nf, n) = match form {
        Exponent::Int => {
            let t = push_inst(p, EpInst::BinK(VBin::Add, y, f32_bits(magic)));
            let nf = push_inst(p, EpInst::BinK(VBin::Add, t, f32_bits(-magic)));
            // The integer n, from t's bits (computed here so that t is free during the polynomial).
            (nf, push_inst(p, EpInst::BinK(VBin::ISub, t, f32_bits(magic))))
        }
        // The magic number's rounding is to nearest, ties to even, for |y| < 2^22 (a clamped x's |y| < 151): one
        // rounding instruction gives the same value.
        Exponent::Float => {
            let nf = push_inst(p, EpInst::RoundNearest(y));
            (nf, nf)
        }
    };
    let h = push_inst(p, EpInst::BinK(VBin::Mul, nf, f32_bits(F32_LN2_SPLIT.0)));
    let r = push_inst(p, EpInst::Bin(VBin::Sub, x, h));
    let l = push_inst(p, EpInst::BinK(VBin::Mul, nf, f32_bits(F32_LN2_SPLIT.1)));
    let r = push_inst(p, EpInst::Bin(VBin::Sub, r, l));
    let q = push_horner(p, r, &EXPF_P);
    let r2 = push_inst(p, EpInst::Bin(VBin::Mul, r, r));
    let e = push_inst(p, EpInst::Bin(VBin::Mul, q, r2));
    let e = push_inst(p, EpInst::Bin(VBin::Add, e, r));
    (push_inst(p, EpInst::BinK(VBin::Add, e, f32_bits(1.0))), n)
}

/// f32 `tanh(x)` as `clif_math` computes it (f32, FMA form): on `a = |x|`, `a + a^3 P(a^2)` below 0.625, else
/// `1 - 2 / (e^(2a) + 1)` with `2a` capped at 40 (one 2^n scale, exact: `n` is 0..=58; by `vscalefps` with
/// `scalef`, the same value), then x's sign.
pub(super) fn push_tanh(p: &mut EpProgram, x: usize, scalef: bool) -> usize {
    use kiln_jit::render::clif_math::TANHF_P;
    let a = push_inst(p, EpInst::BinK(VBin::And, x, 0x7fff_ffff));
    let bound = push_inst(p, EpInst::Const(f32_bits(0.625)));
    let small = push_inst(p, EpInst::Cmp(pred::LT_OQ, a, bound));
    let a2 = push_inst(p, EpInst::Bin(VBin::Add, a, a));
    let u = push_inst(p, EpInst::MinK(a2, f32_bits(40.0)));
    let e = if scalef {
        let (e, nf) = push_exp_reduced(p, u, Exponent::Float);
        push_inst(p, EpInst::Scalef(e, nf))
    } else {
        let (e, n) = push_exp_reduced(p, u, Exponent::Int);
        let s = push_pow2(p, n);
        push_inst(p, EpInst::Bin(VBin::Mul, e, s))
    };
    let e1 = push_inst(p, EpInst::BinK(VBin::Add, e, f32_bits(1.0)));
    let z = push_inst(p, EpInst::Bin(VBin::Mul, a, a));
    let pz = push_horner(p, z, &TANHF_P);
    let sm = push_inst(p, EpInst::Bin(VBin::Mul, pz, z));
    let sm = push_inst(p, EpInst::Bin(VBin::Mul, sm, a));
    let sm = push_inst(p, EpInst::Bin(VBin::Add, sm, a));
    let two = push_inst(p, EpInst::Const(f32_bits(2.0)));
    let q = push_inst(p, EpInst::Bin(VBin::Div, two, e1));
    let one = push_inst(p, EpInst::Const(f32_bits(1.0)));
    let bg = push_inst(p, EpInst::Bin(VBin::Sub, one, q));
    let res = push_inst(p, EpInst::Select { mask: small, t: sm, f: bg });
    let sign = push_inst(p, EpInst::BinK(VBin::And, x, 0x8000_0000));
    push_inst(p, EpInst::Bin(VBin::Or, res, sign))
}

/// f32 `ln(x)` as `clif_math` computes it (Cephes `logf`, f32, FMA form): subnormals scaled by 2^23 first, `x = z *
/// 2^k` with `z` in [sqrt(1/2), sqrt(2)) from the bit pattern, `f = z - 1`, `f - f^2/2 + f^3 P(f) + k ln2` (ln2
/// split), then NaN and +inf as they are, negative -> NaN, ±0 -> -inf.
pub(super) fn push_log(p: &mut EpProgram, x: usize) -> usize {
    use kiln_jit::render::clif_math::{F32_LN2_SPLIT, LOGF_P};
    let two23 = 2f64.powi(23);
    let min_normal = push_inst(p, EpInst::Const(f32::MIN_POSITIVE.to_bits()));
    let den = push_inst(p, EpInst::Cmp(pred::LT_OQ, x, min_normal));
    let scaled = push_inst(p, EpInst::BinK(VBin::Mul, x, f32_bits(two23)));
    let xs = push_inst(p, EpInst::Select { mask: den, t: scaled, f: x });
    // The bits of sqrt(1/2), and the same with the exponent field cleared to 0 (bias - 1 = 126 taken off), so the
    // difference keeps a non-negative exponent field holding k + 126.
    let off = 0x3f35_04f3_u32;
    let tmp = push_inst(p, EpInst::BinK(VBin::ISub, xs, off - (126 << 23)));
    let kb = push_inst(p, EpInst::Shr(tmp, 23));
    let zb = push_inst(p, EpInst::BinK(VBin::And, tmp, (1 << 23) - 1));
    let z = push_inst(p, EpInst::BinK(VBin::IAdd, zb, off));
    // k as a float: or-ing the small non-negative kb into the mantissa of 2^23 is exact.
    let kf = push_inst(p, EpInst::BinK(VBin::Or, kb, f32_bits(two23)));
    let adj_normal = push_inst(p, EpInst::Const(f32_bits(two23 + 126.0)));
    let adj_den = push_inst(p, EpInst::Const(f32_bits(two23 + 126.0 + 23.0)));
    let adj = push_inst(p, EpInst::Select { mask: den, t: adj_den, f: adj_normal });
    let k = push_inst(p, EpInst::Bin(VBin::Sub, kf, adj));
    let f = push_inst(p, EpInst::BinK(VBin::Add, z, f32_bits(-1.0)));
    let z2 = push_inst(p, EpInst::Bin(VBin::Mul, f, f));
    let q = push_horner(p, f, &LOGF_P);
    let y = push_inst(p, EpInst::Bin(VBin::Mul, q, f));
    let y = push_inst(p, EpInst::Bin(VBin::Mul, y, z2));
    let klo = push_inst(p, EpInst::BinK(VBin::Mul, k, f32_bits(F32_LN2_SPLIT.1)));
    let y = push_inst(p, EpInst::Bin(VBin::Add, y, klo));
    let hz = push_inst(p, EpInst::BinK(VBin::Mul, z2, f32_bits(0.5)));
    let y = push_inst(p, EpInst::Bin(VBin::Sub, y, hz));
    let r = push_inst(p, EpInst::Bin(VBin::Add, f, y));
    let khi = push_inst(p, EpInst::BinK(VBin::Mul, k, f32_bits(F32_LN2_SPLIT.0)));
    let res = push_inst(p, EpInst::Bin(VBin::Add, r, khi));
    let inf = push_inst(p, EpInst::Const(f32::INFINITY.to_bits()));
    let big = push_inst(p, EpInst::Cmp(pred::NLT_UQ, x, inf));
    let res = push_inst(p, EpInst::Select { mask: big, t: x, f: res });
    let zero = push_inst(p, EpInst::Const(0));
    let neg = push_inst(p, EpInst::Cmp(pred::LT_OQ, x, zero));
    let nan = push_inst(p, EpInst::Const(f32::NAN.to_bits()));
    let res = push_inst(p, EpInst::Select { mask: neg, t: nan, f: res });
    let is_zero = push_inst(p, EpInst::Cmp(pred::EQ_OQ, x, zero));
    let minf = push_inst(p, EpInst::Const(f32::NEG_INFINITY.to_bits()));
    push_inst(p, EpInst::Select { mask: is_zero, t: minf, f: res })
}

/// `cs[0]`, then `acc * x + c` by fused multiply-adds for each later coefficient (`clif_math`'s `horner32`).
fn push_horner(p: &mut EpProgram, x: usize, cs: &[f32]) -> usize {
    let mut q = push_inst(p, EpInst::Const(cs[0].to_bits()));
    for c in &cs[1..] {
        q = push_inst(p, EpInst::FmaK(q, x, c.to_bits()));
    }
    q
}

/// 2^n for integer lanes `n` in the normal range: `(n + 127) << 23`.
fn push_pow2(p: &mut EpProgram, n: usize) -> usize {
    let b = push_inst(p, EpInst::BinK(VBin::IAdd, n, 127));
    push_inst(p, EpInst::Shl(b, 23))
}

pub(super) fn push_inst(p: &mut EpProgram, i: EpInst) -> usize {
    p.insts.push(i);
    p.insts.len() - 1
}

/// An f64 constant rounded to f32, as `clif_math` rounds its constants.
pub(super) fn f32_bits(v: f64) -> u32 {
    (v as f32).to_bits()
}

/// Appends the rounding of f32 `x` to the nearest bf16 value, ties to even, and returns it as an f32 (its low 16 bits
/// zero): the Cranelift kernels' integer rounding (`render/clif/half.rs`), bit for bit: add `0x7fff` plus the lowest
/// kept bit and clear the low half (the carry rounds the largest values to infinity); a NaN keeps its top bits with
/// the quiet bit set. Integer ops only, so subnormals round as any value (`vcvtneps2bf16` would flush them).
pub(super) fn push_round_bf16(p: &mut EpProgram, x: usize) -> usize {
    let top = push_inst(p, EpInst::Shr(x, 16));
    let odd = push_inst(p, EpInst::BinK(VBin::And, top, 1));
    let n = push_inst(p, EpInst::Bin(VBin::IAdd, x, odd));
    let n = push_inst(p, EpInst::BinK(VBin::IAdd, n, 0x7fff));
    let rounded = push_inst(p, EpInst::BinK(VBin::And, n, 0xffff_0000));
    let nan = push_inst(p, EpInst::Cmp(pred::UNORD_Q, x, x));
    let quiet = push_inst(p, EpInst::BinK(VBin::Or, x, 0x0040_0000));
    let quiet = push_inst(p, EpInst::BinK(VBin::And, quiet, 0xffff_0000));
    push_inst(p, EpInst::Select { mask: nan, t: quiet, f: rounded })
}
