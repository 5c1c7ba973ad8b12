//! Value classes: what the generator knows about each value (`Meta`: an interval holding its finite elements,
//! NaN/inf, exact or approximate and by how much) and how each op transforms it.

use super::*;

/// What the generator knows about a value: bounds, special values, and how closely the JIT must match.
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Meta {
    /// Bounds of the finite elements (ints: exact bounds within the dtype's range).
    pub(super) lo: f64,
    pub(super) hi: f64,
    /// May hold NaN or an infinity.
    pub(super) special: bool,
    /// The JIT and the interpreter compute it bit for bit.
    pub(super) bit: bool,
    /// They compute equal values (but maybe zeros of different sign: max/min do not fix it).
    pub(super) val: bool,
    /// Estimated absolute and relative difference between the two (both 0 when `val`).
    pub(super) ea: f64,
    pub(super) er: f64,
    /// A reduction, matmul or softmax is in its history (`Kind::Accumulate`).
    pub(super) acc: bool,
    /// f32 rounding differences are in its history (f32 tolerances apply, even for an f64 value).
    pub(super) coarse: bool,
}

impl Meta {
    pub(super) fn exact(lo: f64, hi: f64, special: bool) -> Meta {
        Meta { lo, hi, special, bit: true, val: true, ea: 0.0, er: 0.0, acc: false, coarse: false }
    }

    pub(super) fn mag(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }

    /// `min |x|` over the finite elements (0 if the bounds straddle zero).
    pub(super) fn min_abs(&self) -> f64 {
        if self.lo > 0.0 {
            self.lo
        } else if self.hi < 0.0 {
            -self.hi
        } else {
            0.0
        }
    }

    /// Absolute difference bound, relative differences turned absolute.
    pub(super) fn abs_err(&self) -> f64 {
        self.ea + self.er * self.mag()
    }

    /// Flags of a value computed from `parts` (error terms are the caller's).
    pub(super) fn joined(parts: &[&Meta], lo: f64, hi: f64) -> Meta {
        Meta {
            lo,
            hi,
            special: parts.iter().any(|m| m.special),
            bit: parts.iter().all(|m| m.bit),
            val: parts.iter().all(|m| m.val),
            ea: 0.0,
            er: 0.0,
            acc: parts.iter().any(|m| m.acc),
            coarse: parts.iter().any(|m| m.coarse),
        }
    }

    /// Marks the value approximate, with the given error terms, from an op computed in `d`.
    pub(super) fn approx(mut self, d: DType, ea: f64, er: f64) -> Meta {
        self.bit = false;
        self.val = false;
        self.ea = ea;
        self.er = er;
        self.coarse |= d == DType::F32;
        self
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in [{:.3e}, {:.3e}]", self.lo, self.hi)?;
        if self.special {
            write!(f, " + nan/inf")?;
        }
        if self.bit {
            write!(f, ", bit-exact")
        } else if self.val {
            write!(f, ", exact up to the sign of zero")
        } else {
            write!(f, ", approx (abs {:.1e}, rel {:.1e})", self.ea, self.er)
        }
    }
}

/// dtype, shape and value class of one value.
#[derive(Clone, PartialEq)]
pub(super) struct Info {
    pub(super) dtype: DType,
    pub(super) dims: Vec<usize>,
    pub(super) meta: Meta,
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}{}, {:?}", self.dtype, list(&self.dims), self.meta)
    }
}

/// Unit roundoff-ish: one ulp at 1.0.
pub(super) fn ulp(d: DType) -> f64 {
    match d {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => f32::EPSILON as f64,
    }
}

/// The tolerance a value is compared with.
pub(super) fn tolerance(dtype: DType, m: &Meta) -> Tol {
    if !dtype.is_float() || m.bit {
        return tol(dtype, Kind::Exact);
    }
    // An f16 value is held to f16's tolerance whatever its history (it is the coarsest class).
    let class = if m.coarse && dtype != DType::F16 { DType::F32 } else { dtype };
    tol(class, if m.acc { Kind::Accumulate } else { Kind::Elementwise })
}

/// Whether the estimated difference stays within half the tolerance.
pub(super) fn fits(dtype: DType, m: &Meta) -> bool {
    if !dtype.is_float() || m.val {
        return m.val;
    }
    let t = tolerance(dtype, m);
    m.ea <= t.abs / 2.0 && m.er <= t.rel / 2.0 && m.mag() < 1e6
}

/// `m` stored in float dtype `d`: bounds past the largest finite value round to an infinity there (an exact u32
/// of 4e9 cast to f16 is inf, and inf times 0 is NaN), so such a value may hold one, and its finite elements lie
/// within the finite range.
pub(super) fn overflowed(d: DType, mut m: Meta) -> Meta {
    let max = match d {
        DType::F16 => 65504.0,
        DType::BF16 => f64::from(f32::from_bits(0x7f7f_0000)),
        DType::F32 => f64::from(f32::MAX),
        _ => return m,
    };
    if m.mag() > max {
        m.special = true;
        m.lo = m.lo.max(-max);
        m.hi = m.hi.min(max);
    }
    m
}

pub(super) fn int_range(d: DType) -> (f64, f64) {
    match d {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    }
}

/// Bounds of an int value that may have wrapped (bool: `x != 0`).
pub(super) fn wrap(d: DType, lo: f64, hi: f64) -> (f64, f64) {
    let (a, b) = int_range(d);
    if lo >= a && hi <= b { (lo, hi) } else { (a, b) }
}

pub(super) fn corners(pairs: &[f64]) -> (f64, f64) {
    let lo = pairs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = pairs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The value class of `m` converted to `to` (from `from`), or `None` if that is ill-conditioned.
pub(super) fn cast_meta(from: DType, to: DType, m: &Meta) -> Option<Meta> {
    if from == to {
        return Some(*m);
    }
    if to.is_float() {
        // The interpreter converts ints to floats through f64, which rounds twice above 2^53 (1 ulp off for f32):
        // a known defect of the reference (reported), so such conversions are not generated.
        if !from.is_float() && to == DType::F32 && m.mag() >= 2f64.powi(53) {
            return None;
        }
        let mut out = *m;
        // Narrowing an approximate value: the two sides may round it differently.
        if from.is_float() && to.size_of() < from.size_of() && !m.val {
            out = out.approx(to, m.ea, m.er + ulp(to) / 2.0);
        }
        return Some(out);
    }
    // To an int or bool: the values must be the same on both sides (a rounding difference could cross an integer).
    if !m.val {
        return None;
    }
    let (lo, hi) = if to == DType::Bool {
        (0.0, 1.0)
    } else if m.special {
        int_range(to)
    } else {
        wrap(to, m.lo.trunc(), m.hi.trunc())
    };
    Some(Meta { acc: m.acc, ..Meta::exact(lo, hi, false) })
}

/// The value class of an elementwise binary op computed in `d` (operands already converted to `d`).
pub(super) fn binary_meta(op: Bin, d: DType, a: &Meta, b: &Meta) -> Option<Meta> {
    let u = ulp(d) / 2.0;
    if op.is_comparison() {
        // A comparison of approximate values could flip.
        return (a.val && b.val).then(|| Meta { acc: a.acc || b.acc, ..Meta::exact(0.0, 1.0, false) });
    }
    if !d.is_float() {
        let (lo, hi) = match op {
            _ if d == DType::Bool => (0.0, 1.0),
            Bin::Add => (a.lo + b.lo, a.hi + b.hi),
            Bin::Sub => (a.lo - b.hi, a.hi - b.lo),
            Bin::Mul => corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]),
            Bin::Maximum => (a.lo.max(b.lo), a.hi.max(b.hi)),
            Bin::Minimum => (a.lo.min(b.lo), a.hi.min(b.hi)),
            Bin::Pow if b.hi < 0.0 => (-1.0, 1.0),
            Bin::Pow => {
                let m = a.mag().max(1.0).powf(b.hi.max(0.0));
                (-m, m)
            }
            _ => unreachable!("{op:?} on {d}"),
        };
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta::joined(&[a, b], lo, hi));
    }
    let (ma, mb) = (a.mag(), b.mag());
    let same_sign = |x: &Meta, y: &Meta| (x.lo >= 0.0 && y.lo >= 0.0) || (x.hi <= 0.0 && y.hi <= 0.0);
    // inf or NaN times (or over) a value that may differ slightly near zero could change sign or become NaN.
    let special_hazard = (a.special && !b.val) || (b.special && !a.val);
    let m = match op {
        Bin::Add | Bin::Sub => {
            let nb = if op == Bin::Sub { Meta { lo: -b.hi, hi: -b.lo, ..*b } } else { *b };
            let j = Meta::joined(&[a, &nb], a.lo + nb.lo, a.hi + nb.hi);
            if let Some(r) = loose_rounding(d) {
                // The driver may reassociate a fused chain of sums: off by an ulp of the largest operand.
                j.approx(d, a.abs_err() + nb.abs_err() + r * ma.max(mb), r)
            } else if j.val {
                j
            } else if same_sign(a, &nb) {
                j.approx(d, a.ea + nb.ea, a.er.max(nb.er) + u)
            } else {
                j.approx(d, a.abs_err() + nb.abs_err(), u)
            }
        }
        Bin::Mul => {
            if special_hazard {
                return None;
            }
            let (lo, hi) = corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]);
            let j = Meta::joined(&[a, b], lo, hi);
            if j.val && loose_rounding(d).is_none() {
                j
            } else {
                j.approx(d, a.ea * mb + b.ea * ma + a.ea * b.ea, a.er + b.er + loose_rounding(d).unwrap_or(u))
            }
        }
        Bin::Div => {
            if special_hazard && !b.special {
                return None;
            }
            let bmin = b.min_abs();
            if bmin > 0.0 {
                let (lo, hi) = corners(&[a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]);
                let j = Meta::joined(&[a, b], lo, hi);
                match loose_rounding(d) {
                    Some(r) => j.approx(d, a.ea / bmin, a.er + b.er + b.ea / bmin + r),
                    None if j.bit => j,
                    None => j.approx(d, a.ea / bmin, a.er + b.er + b.ea / bmin + u),
                }
            } else if a.bit && b.bit && loose_rounding(d).is_none() {
                // x / 0 is +-inf or NaN on both sides; the quotient of tiny divisors is unbounded.
                let mut j = Meta::joined(&[a, b], -1e30, 1e30);
                j.special = true;
                j
            } else {
                return None;
            }
        }
        Bin::Maximum | Bin::Minimum => {
            let (lo, hi) =
                if op == Bin::Maximum { (a.lo.max(b.lo), a.hi.max(b.hi)) } else { (a.lo.min(b.lo), a.hi.min(b.hi)) };
            let mut j = Meta::joined(&[a, b], lo, hi);
            // max(-0.0, 0.0) may give either zero.
            j.bit = false;
            if j.val { j } else { j.approx(d, a.ea.max(b.ea), a.er.max(b.er)) }
        }
        Bin::Pow => {
            if special_hazard {
                return None;
            }
            let e = b.mag();
            if a.lo > 0.0 {
                let (l1, l2) = (a.lo.ln(), a.hi.ln());
                let (lo, hi) = corners(&[b.lo * l1, b.lo * l2, b.hi * l1, b.hi * l2]);
                let j = Meta::joined(&[a, b], lo.exp(), hi.exp());
                let er_base = if a.val { 0.0 } else { e * (a.er + a.ea / a.lo) };
                let er_exp = if b.val { 0.0 } else { l1.abs().max(l2.abs()) * b.abs_err() };
                j.approx(d, 0.0, er_base + er_exp + 2.0 * ulp(d))
            } else if a.bit && b.bit {
                let big = if b.lo < 0.0 { 1e30 } else { ma.max(1.0).powf(e) };
                let mut j = Meta::joined(&[a, b], -big, big).approx(d, 0.0, 2.0 * ulp(d));
                // 0 ** negative is inf and a negative base to a fractional power is NaN.
                j.special = true;
                if !fits(d, &j) {
                    return None;
                }
                j
            } else {
                return None;
            }
        }
        _ => unreachable!("{op:?}"),
    };
    Some(m)
}

/// The value class of a float unary function applied to `a` in `d`, or `None` if ill-conditioned there.
pub(super) fn unary_meta(u: Un, d: DType, a: &Meta) -> Option<Meta> {
    let h = ulp(d) / 2.0;
    let j = |lo: f64, hi: f64| Meta { lo, hi, ..*a };
    let abs_in = a.abs_err();
    let m = match u {
        Un::Neg => j(-a.hi, -a.lo),
        Un::Abs => {
            let (lo, hi) = if a.lo >= 0.0 { (a.lo, a.hi) } else { (a.min_abs(), a.mag()) };
            j(lo, hi)
        }
        Un::Exp => {
            if a.hi > 12.0 {
                return None;
            }
            j(a.lo.max(-200.0).exp(), a.hi.exp()).approx(d, 0.0, abs_in + ulp(d))
        }
        Un::Log => {
            if a.lo > 0.0 {
                j(a.lo.ln(), a.hi.ln()).approx(d, if a.val { 0.0 } else { a.ea / a.lo + a.er }, ulp(d))
            } else if a.val {
                // log(0) = -inf and log(x < 0) = NaN on both sides; tiny positives give large negatives.
                let mut m = j(-104.0, a.hi.max(1e-30).ln().max(-104.0)).approx(d, 0.0, ulp(d));
                m.special = true;
                m
            } else {
                return None;
            }
        }
        Un::Sin | Un::Cos => {
            if a.mag() > 1e4 {
                return None;
            }
            j(-1.0, 1.0).approx(d, abs_in + wgsl_trig_abs(), 3.0 * ulp(d))
        }
        Un::Tanh => j(a.lo.tanh(), a.hi.tanh()).approx(d, abs_in, 2.0 * ulp(d)),
        Un::Sigmoid => {
            let s = |x: f64| 1.0 / (1.0 + (-x).exp());
            j(s(a.lo), s(a.hi)).approx(d, abs_in / 4.0, 3.0 * ulp(d))
        }
        Un::Sqrt => {
            if a.lo > 0.0 {
                let m = j(a.lo.sqrt(), a.hi.sqrt());
                match loose_rounding(d) {
                    Some(r) => m.approx(d, a.ea / (2.0 * a.lo.sqrt()), a.er / 2.0 + r),
                    None if a.bit => m,
                    None => m.approx(d, a.ea / (2.0 * a.lo.sqrt()), a.er / 2.0 + h),
                }
            } else if a.bit && loose_rounding(d).is_none() {
                let mut m = j(0.0, a.hi.max(0.0).sqrt());
                m.special |= a.lo < 0.0;
                m
            } else {
                return None;
            }
        }
        Un::Recip | Un::Rsqrt => {
            let base = if u == Un::Rsqrt { unary_meta(Un::Sqrt, d, a)? } else { *a };
            let bmin = base.min_abs();
            if bmin > 0.0 {
                let (lo, hi) = corners(&[1.0 / base.lo, 1.0 / base.hi]);
                let m = Meta { lo, hi, ..base };
                match loose_rounding(d) {
                    Some(r) => m.approx(d, 0.0, base.er + base.ea / bmin + r),
                    None if base.bit => m,
                    None => m.approx(d, 0.0, base.er + base.ea / bmin + h),
                }
            } else if base.bit && loose_rounding(d).is_none() {
                let mut m = Meta { lo: -1e30, hi: 1e30, ..base };
                m.special = true;
                m
            } else {
                return None;
            }
        }
        // Monotone, exact, but discontinuous: equal inputs give equal outputs, an input off by an ulp may not.
        Un::Floor | Un::Ceil | Un::Round | Un::Trunc => {
            if !a.val {
                return None;
            }
            let f = |x: f64| match u {
                Un::Floor => x.floor(),
                Un::Ceil => x.ceil(),
                Un::Round => x.round_ties_even(),
                _ => x.trunc(),
            };
            j(f(a.lo), f(a.hi))
        }
        Un::Relu | Un::Square | Un::LogicalNot => unreachable!("composite {u:?}"),
    };
    Some(m)
}
