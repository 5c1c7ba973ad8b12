//! The helper functions a table entry may call where a target's builtin does not have `kernel::eval`'s semantics,
//! and the counter-based random numbers. Which helpers exist, what each promises and which others it calls are
//! target-neutral (here); their source is the dialect's (`Dialect::helper_source`). A kernel contains only the
//! helpers its instructions use, each once, after those it calls.

use super::Dialect;
use std::collections::BTreeSet;

/// A helper function (or group of them). The declaration order is the order a kernel declares them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Helper {
    /// `kiln_rand_words(slot, index)` (reached through `Dialect::rand_words`) and `kiln_uniform(words)` /
    /// `kiln_uniform_f16(words)`: Philox-4x32-10, bit-exact with `crate::rng`.
    Philox,
    /// `kiln_normal(words)`: Box-Muller from words 2 and 3, as `rng::normal_f64` (computed in f32).
    Normal,
    /// `kiln_isnan` and `kiln_nonzero` on the bits, and `kiln_lt` / `kiln_le` / `kiln_eq` / `kiln_ne` with IEEE NaN
    /// semantics.
    FloatCmp,
    /// `kiln_div(x, y)`: IEEE division with the zero divisor handled on the bits.
    DivF32,
    /// `kiln_max` / `kiln_min`: NaN-propagating.
    MaxF32,
    MinF32,
    /// `kiln_pow(x, y)`: IEEE `pow` special cases, negative bases with integer exponents.
    PowF32,
    /// `kiln_pow_i32(x, y)`: `semantics::int_pow` with i32 wrapping.
    PowI32,
    /// `kiln_pow_u32(x, y)`: `semantics::int_pow` for u32 (the exponent is never negative), wrapping.
    PowU32,
    /// `kiln_pow_i64(x, y)`: `semantics::int_pow` with i64 wrapping (dialects with i64 only).
    PowI64,
    /// `kiln_round_f16(x)`: the f16 value nearest to an f32, ties to even, as an f32.
    F16,
    /// `kiln_round_bf16(x)`: the bf16 value nearest to an f32, ties to even, as an f32 (dialects with bf16 only).
    BF16,
    /// `kiln_f32_low_bits(x)`: the low 32 bits of `x as i64` (Rust's saturating conversion, NaN -> 0); in a dialect
    /// with 64-bit values also `kiln_to_i64(x)` for f32 and f64 (the saturated value itself).
    F32ToInt,
    /// `kiln_sin(x)` / `kiln_cos(x)`: accurate over the whole f32 range (the builtins on a reduced argument where
    /// the target promises accuracy only near zero).
    Trig,
    /// `kiln_tanh(x)`: NaN kept, and within an ulp or two relative near zero, where a builtin `tanh` may promise an
    /// absolute error only.
    Tanh,
    /// `kiln_log1p(x)` / `kiln_expm1(x)`: NaN kept, and relative accuracy near zero (a series there; the builtins
    /// `log(1 + x)` and `exp(x) - 1` elsewhere).
    Log1p,
    Expm1,
    /// `kiln_checked(i, len, live)`: `i` where `0 <= i < len`; else, where `live`, records `Fault::Index` in the
    /// kernel's fault record (`kernel::fault`: claimed by a compare-and-swap of its kind from 0, then `len` and
    /// `i`), and 0, an index inside the buffer.
    IndexCheck,
    /// `kiln_fmod(x, y)`: C's `fmod`, exact (scaled subtractions, at most one per binade of the quotient).
    FmodF32,
}

impl Helper {
    /// The helpers whose functions this one calls.
    pub fn deps(self) -> &'static [Helper] {
        match self {
            // They test for NaN.
            Helper::MaxF32
            | Helper::MinF32
            | Helper::PowF32
            | Helper::F32ToInt
            | Helper::DivF32
            | Helper::Tanh
            | Helper::Log1p
            | Helper::Expm1
            | Helper::FmodF32 => &[Helper::FloatCmp],
            Helper::PowI32 => &[Helper::PowU32],
            Helper::PowI64 | Helper::BF16 => &[],
            Helper::Philox
            | Helper::Normal
            | Helper::FloatCmp
            | Helper::PowU32
            | Helper::F16
            | Helper::Trig
            | Helper::IndexCheck => &[],
        }
    }
}

/// Appends `h`'s source to `s` after its dependencies, unless `done` has it.
pub(super) fn write<D: Dialect>(d: &D, s: &mut String, h: Helper, done: &mut BTreeSet<Helper>) {
    if !done.insert(h) {
        return;
    }
    for &dep in h.deps() {
        write(d, s, dep, done);
    }
    s.push_str(d.helper_source(h));
}
