//! Index expressions: how a kernel turns loop variables into buffer offsets.
//!
//! Movement ops become these (permute reorders variables, expand drops them, slice scales and shifts them, pad
//! shifts them and adds a validity range, reshape flattens and splits with `/` and `%`). Every variable has a known
//! range `0..extent`, so `simplify` can remove the `/` and `%` that a reshape of a contiguous tensor introduces:
//! `(i * 4 + j) / 4` with `j < 4` is `i`. All values are non-negative by construction except after a negative
//! slice step, which is written as `start - j` and never divided.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IExpr {
    /// Loop variable `n` of the kernel (output dims first, then reduce dims).
    Var(usize),
    Const(i64),
    /// Sum of terms.
    Add(Vec<IExpr>),
    Mul(Box<IExpr>, i64),
    /// Floor division by a positive constant, of a non-negative value.
    Div(Box<IExpr>, i64),
    /// Remainder by a positive constant, of a non-negative value.
    Mod(Box<IExpr>, i64),
    /// `x % n` standing for `x` where `x` is known to be in `0..n` wherever the value is used: a padded dim's
    /// source index, read only under the pad's range check. Its bounds let the simplifier see through the reshapes
    /// above it (a convolution's input gradient read its taps through divisions per element without); lowering
    /// removes it ([`IExpr::unwrap_known`]) before the index reaches an instruction; evaluated and rendered as `x`.
    Wrap(Box<IExpr>, i64),
}

/// `Σ coef_v x_v + c` as `k q + r` with every coefficient (and `c`) split as `k (a div k) + (a mod k)`: `(q, r)`
/// where `r` stays in `0..k` over the variables' ranges, so that `q` is the floor quotient by `k` and `r` the
/// remainder (`i3 * 59 + i5` by 58 with `i3 < 3`, `i5 < 56`: `i3` and `i3 + i5`, the index of a window that a row
/// of 59 re-reads as rows of 58); `None` where `r` can leave `0..k`.
fn split_by(coef: &[i64], c: i64, k: i64, extents: &[usize]) -> Option<(IExpr, IExpr)> {
    let (q, r): (Vec<i64>, Vec<i64>) = coef.iter().map(|&a| (a.div_euclid(k), a.rem_euclid(k))).unzip();
    let rest = IExpr::from_affine(&r, c.rem_euclid(k));
    let (lo, hi) = rest.bounds(extents);
    (lo >= 0 && hi < k).then(|| (IExpr::from_affine(&q, c.div_euclid(k)), rest))
}

/// Terms of a sum: (atom, coefficient).
type Terms = Vec<(IExpr, i64)>;

/// A sum as `Σ coef * atom + c`, the atoms being variables and the subexpressions that are not sums, products or
/// constants (a division, a remainder, a wrap), equal atoms merged, none with a zero coefficient.
fn atoms(x: &IExpr) -> (Terms, i64) {
    fn walk(e: &IExpr, k: i64, out: &mut Vec<(IExpr, i64)>, c: &mut i64) {
        match e {
            IExpr::Const(x) => *c += k * x,
            IExpr::Add(ts) => ts.iter().for_each(|t| walk(t, k, out, c)),
            IExpr::Mul(x, m) => walk(x, k * m, out, c),
            _ => match out.iter_mut().find(|(a, _)| a == e) {
                Some((_, q)) => *q += k,
                None => out.push((e.clone(), k)),
            },
        }
    }
    let (mut out, mut c) = (Vec::new(), 0);
    walk(x, 1, &mut out, &mut c);
    out.retain(|(_, k)| *k != 0);
    (out, c)
}

/// `Σ coef * atom + c` as an expression.
fn from_atoms(terms: &[(IExpr, i64)], c: i64) -> IExpr {
    let mut out: Vec<IExpr> =
        terms.iter().map(|(a, k)| if *k == 1 { a.clone() } else { a.clone().times(*k) }).collect();
    if c != 0 || out.is_empty() {
        out.push(IExpr::Const(c));
    }
    if out.len() == 1 { out.pop().expect("one term") } else { IExpr::Add(out) }
}

/// A sum of atoms as `k q + r` with `q` the terms whose coefficients `k` divides (and `c div k`): `(q, r)`;
/// `None` where that splits nothing off. `(k q + r) / k == q + r / k` and `(k q + r) % k == r % k` for Euclidean
/// division, whatever the signs.
fn multiples(terms: &[(IExpr, i64)], c: i64, k: i64) -> Option<(IExpr, IExpr)> {
    let (q, r): (Terms, Terms) = terms.iter().cloned().partition(|(_, a)| a % k == 0);
    if q.is_empty() && c.div_euclid(k) == 0 {
        return None;
    }
    let q: Terms = q.into_iter().map(|(a, m)| (a, m / k)).collect();
    Some((from_atoms(&q, c.div_euclid(k)), from_atoms(&r, c.rem_euclid(k))))
}

/// A sum of atoms as `g X + r` with `g` a factor of `k` (one of the coefficients), `X` the terms that `g` divides
/// (divided by it) and `r` the rest, in `0..g` over the variables' ranges: `(X, k / g, (g, r))`, the largest such
/// `g` first; `None` where there is none. Then `(g X + r) / (g m) == X / m` and `(g X + r) % (g m) == g (X % m) +
/// r`: a window position `(k * 3136 + p) / 28224` with `p < 3136` is `k / 9`.
fn common_factor(terms: &[(IExpr, i64)], c: i64, k: i64, extents: &[usize]) -> Option<(IExpr, i64, (i64, IExpr))> {
    let mut gs: Vec<i64> = terms.iter().map(|(_, a)| a.abs()).filter(|&g| g > 1 && g < k && k % g == 0).collect();
    gs.sort_unstable_by(|a, b| b.cmp(a));
    gs.dedup();
    gs.into_iter().find_map(|g| {
        let (big, small): (Terms, Terms) = terms.iter().cloned().partition(|(_, a)| a % g == 0);
        let r = from_atoms(&small, c.rem_euclid(g));
        let (lo, hi) = r.bounds(extents);
        let big: Terms = big.into_iter().map(|(a, m)| (a, m / g)).collect();
        (lo >= 0 && hi < g).then(|| (from_atoms(&big, c.div_euclid(g)), k / g, (g, r)))
    })
}

/// A sum whose digits of one value recombine: `k a (x / a) + k (x % a)` is `k x`, and `k a ((x / a) % b) + k (x %
/// a)` is `k (x % (a b))` (Euclidean division, any `x`): a dim split by one reshape and merged back by another (a
/// weight `[O, C, 3, 3]` read as `[O, C * 9]`) reads its flat index again. `None` where no pair recombines; each
/// step removes a division, so repeating ends.
fn recombine(sum: &IExpr) -> Option<IExpr> {
    let (mut terms, c) = atoms(sum);
    for i in 0..terms.len() {
        let (IExpr::Mod(x, a), k) = &terms[i] else { continue };
        let (x, a, k) = ((**x).clone(), *a, *k);
        let found = terms.iter().position(|(t, m)| {
            *m == k * a
                && match t {
                    IExpr::Div(y, d) => **y == x && *d == a,
                    IExpr::Mod(q, _) => matches!(&**q, IExpr::Div(y, d) if **y == x && *d == a),
                    _ => false,
                }
        });
        let Some(j) = found else { continue };
        let merged = match &terms[j].0 {
            IExpr::Mod(_, b) => IExpr::Mod(Box::new(x), a * b),
            _ => x,
        };
        let (lo, hi) = (i.min(j), i.max(j));
        terms.remove(hi);
        terms[lo] = (merged, k);
        return Some(from_atoms(&terms, c));
    }
    None
}

/// Inclusive bounds of an expression given the variables' extents.
fn bounds(e: &IExpr, ext: &[usize]) -> (i64, i64) {
    match e {
        IExpr::Var(v) => (0, ext[*v] as i64 - 1),
        IExpr::Const(c) => (*c, *c),
        IExpr::Add(ts) => ts.iter().map(|t| bounds(t, ext)).fold((0, 0), |(a, b), (c, d)| (a + c, b + d)),
        IExpr::Mul(x, k) => {
            let (lo, hi) = bounds(x, ext);
            if *k >= 0 { (lo * k, hi * k) } else { (hi * k, lo * k) }
        }
        IExpr::Div(x, k) => {
            let (lo, hi) = bounds(x, ext);
            (lo.div_euclid(*k), hi.div_euclid(*k))
        }
        IExpr::Mod(x, k) | IExpr::Wrap(x, k) => {
            let (lo, hi) = bounds(x, ext);
            if lo >= 0 && hi < *k { (lo, hi) } else { (0, k - 1) }
        }
    }
}

impl IExpr {
    pub fn plus(self, other: IExpr) -> IExpr {
        IExpr::Add(vec![self, other])
    }

    pub fn times(self, k: i64) -> IExpr {
        IExpr::Mul(Box::new(self), k)
    }

    pub fn floor_div(self, k: i64) -> IExpr {
        IExpr::Div(Box::new(self), k)
    }

    pub fn modulo(self, k: i64) -> IExpr {
        IExpr::Mod(Box::new(self), k)
    }

    /// Inclusive (min, max) over all loop variable values.
    pub fn bounds(&self, extents: &[usize]) -> (i64, i64) {
        bounds(self, extents)
    }

    /// The expression as `Σ coef_v * var_v + c`, if it is affine.
    pub fn affine(&self, nvars: usize) -> Option<(Vec<i64>, i64)> {
        let mut coef = vec![0; nvars];
        let mut c = 0;
        fn walk(e: &IExpr, k: i64, coef: &mut [i64], c: &mut i64) -> bool {
            match e {
                IExpr::Var(v) => coef[*v] += k,
                IExpr::Const(x) => *c += k * x,
                IExpr::Add(ts) => return ts.iter().all(|t| walk(t, k, coef, c)),
                IExpr::Mul(x, m) => return walk(x, k * m, coef, c),
                IExpr::Div(..) | IExpr::Mod(..) | IExpr::Wrap(..) => return false,
            }
            true
        }
        walk(self, 1, &mut coef, &mut c).then_some((coef, c))
    }

    /// The variables the expression reads, in ascending order without repeats.
    pub fn vars(&self) -> Vec<usize> {
        fn walk(e: &IExpr, out: &mut Vec<usize>) {
            match e {
                IExpr::Var(v) => out.push(*v),
                IExpr::Const(_) => {}
                IExpr::Add(ts) => ts.iter().for_each(|t| walk(t, out)),
                IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) | IExpr::Wrap(x, _) => walk(x, out),
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The expression as a sum of one part per variable plus a constant, `c + Σ_v f_v(var_v)`, where each part
    /// reads only its own variable (`(i3 / 56) * 58 + i3 % 56 + i2 * 3364`: three parts, the first two of `i3`);
    /// `None` where a term mixes variables (`(i2 * 4 + i3) / 3`). Parts of variables the expression does not read
    /// are `Const(0)`.
    pub fn separate(&self, nvars: usize) -> Option<(Vec<IExpr>, i64)> {
        let (terms, c) = atoms(self);
        let mut parts: Vec<Terms> = vec![Vec::new(); nvars];
        for (atom, k) in terms {
            let [v] = atom.vars()[..] else { return None };
            parts.get_mut(v)?.push((atom, k));
        }
        Some((parts.iter().map(|p| from_atoms(p, 0)).collect(), c))
    }

    /// Rebuilds an affine form as an expression.
    pub fn from_affine(coef: &[i64], c: i64) -> IExpr {
        let mut terms: Vec<IExpr> = coef
            .iter()
            .enumerate()
            .filter(|&(_, &k)| k != 0)
            .map(|(v, &k)| if k == 1 { IExpr::Var(v) } else { IExpr::Var(v).times(k) })
            .collect();
        if c != 0 || terms.is_empty() {
            terms.push(IExpr::Const(c));
        }
        if terms.len() == 1 { terms.pop().expect("one term") } else { IExpr::Add(terms) }
    }

    /// Simplifies using the variables' extents: constant folding, flattening of sums, affine normal form, and
    /// removal of `/` and `%` where the ranges make them trivial or separable.
    pub fn simplify(&self, extents: &[usize]) -> IExpr {
        let n = extents.len();
        match self {
            IExpr::Var(_) | IExpr::Const(_) => self.clone(),
            IExpr::Add(ts) => {
                let ts: Vec<IExpr> = ts.iter().map(|t| t.simplify(extents)).collect();
                let mut coef = vec![0; n];
                let mut c = 0;
                let mut rest = Vec::new();
                for t in ts {
                    match t.affine(n) {
                        Some((k, x)) => {
                            coef.iter_mut().zip(&k).for_each(|(a, b)| *a += b);
                            c += x;
                        }
                        None => rest.push(t),
                    }
                }
                let aff = IExpr::from_affine(&coef, c);
                if rest.is_empty() {
                    return aff;
                }
                if aff != IExpr::Const(0) {
                    rest.push(aff);
                }
                let sum = if rest.len() == 1 { rest.pop().expect("one term") } else { IExpr::Add(rest) };
                match recombine(&sum) {
                    Some(fewer) => fewer.simplify(extents),
                    None => sum,
                }
            }
            IExpr::Mul(x, k) => {
                let x = x.simplify(extents);
                match x.affine(n) {
                    Some((coef, c)) => IExpr::from_affine(&coef.iter().map(|a| a * k).collect::<Vec<_>>(), c * k),
                    None if *k == 1 => x,
                    None if *k == 0 => IExpr::Const(0),
                    None => IExpr::Mul(Box::new(x), *k),
                }
            }
            IExpr::Div(x, k) => {
                let x = x.simplify(extents);
                if *k == 1 {
                    return x;
                }
                let (lo, hi) = x.bounds(extents);
                if lo.div_euclid(*k) == hi.div_euclid(*k) {
                    return IExpr::Const(lo.div_euclid(*k));
                }
                if let Some((coef, c)) = x.affine(n) {
                    // Coefficients past the divisor, where the remainders stay below it.
                    if let Some((q, _)) = split_by(&coef, c, *k, extents) {
                        return q;
                    }
                }
                let (terms, c) = atoms(&x);
                // Only where the rest is non-negative: renderers divide unsigned (index values are non-negative
                // where they are divided, and stay so).
                if let Some((q, r)) = multiples(&terms, c, *k) {
                    let (rlo, rhi) = r.bounds(extents);
                    if rlo >= 0 && rhi < *k {
                        return q;
                    }
                    if rlo >= 0 && q != IExpr::Const(0) {
                        return IExpr::Add(vec![q, r.floor_div(*k)]).simplify(extents);
                    }
                }
                if let Some((x, m, _)) = common_factor(&terms, c, *k, extents) {
                    return x.floor_div(m).simplify(extents);
                }
                IExpr::Div(Box::new(x), *k)
            }
            IExpr::Mod(x, k) => {
                let x = x.simplify(extents);
                if *k == 1 {
                    return IExpr::Const(0);
                }
                let (lo, hi) = x.bounds(extents);
                if lo >= 0 && hi < *k {
                    return x;
                }
                if let Some((coef, c)) = x.affine(n)
                    && let Some((_, r)) = split_by(&coef, c, *k, extents)
                {
                    return r;
                }
                let (terms, c) = atoms(&x);
                if let Some((_, r)) = multiples(&terms, c, *k) {
                    let (rlo, rhi) = r.bounds(extents);
                    if rlo >= 0 && rhi < *k {
                        return r;
                    }
                    if rlo >= 0 && r != x {
                        return r.modulo(*k).simplify(extents);
                    }
                }
                if let Some((x, m, (g, r))) = common_factor(&terms, c, *k, extents) {
                    return IExpr::Add(vec![x.modulo(m).times(g), r]).simplify(extents);
                }
                IExpr::Mod(Box::new(x), *k)
            }
            IExpr::Wrap(x, k) => {
                let x = x.simplify(extents);
                let (lo, hi) = x.bounds(extents);
                if lo >= 0 && hi < *k { x } else { IExpr::Wrap(Box::new(x), *k) }
            }
        }
    }

    /// The expression with every [`IExpr::Wrap`] replaced by what it wraps: equal wherever the wraps' values are
    /// in range, which the lowering guarantees where it calls this (under the pads' range checks).
    pub fn unwrap_known(&self) -> IExpr {
        match self {
            IExpr::Var(_) | IExpr::Const(_) => self.clone(),
            IExpr::Add(ts) => IExpr::Add(ts.iter().map(|t| t.unwrap_known()).collect()),
            IExpr::Mul(x, k) => IExpr::Mul(Box::new(x.unwrap_known()), *k),
            IExpr::Div(x, k) => IExpr::Div(Box::new(x.unwrap_known()), *k),
            IExpr::Mod(x, k) => IExpr::Mod(Box::new(x.unwrap_known()), *k),
            IExpr::Wrap(x, _) => x.unwrap_known(),
        }
    }

    /// Whether the expression holds an [`IExpr::Wrap`].
    pub fn has_wrap(&self) -> bool {
        match self {
            IExpr::Var(_) | IExpr::Const(_) => false,
            IExpr::Add(ts) => ts.iter().any(|t| t.has_wrap()),
            IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) => x.has_wrap(),
            IExpr::Wrap(..) => true,
        }
    }

    /// The expression with every variable replaced by `f(var)`.
    pub fn map_vars(&self, f: &impl Fn(usize) -> IExpr) -> IExpr {
        match self {
            IExpr::Var(v) => f(*v),
            IExpr::Const(c) => IExpr::Const(*c),
            IExpr::Add(ts) => IExpr::Add(ts.iter().map(|t| t.map_vars(f)).collect()),
            IExpr::Mul(x, k) => IExpr::Mul(Box::new(x.map_vars(f)), *k),
            IExpr::Div(x, k) => IExpr::Div(Box::new(x.map_vars(f)), *k),
            IExpr::Mod(x, k) => IExpr::Mod(Box::new(x.map_vars(f)), *k),
            IExpr::Wrap(x, k) => IExpr::Wrap(Box::new(x.map_vars(f)), *k),
        }
    }

    /// Evaluates the expression for given loop variable values.
    pub fn eval(&self, vars: &[i64]) -> i64 {
        match self {
            IExpr::Var(v) => vars[*v],
            IExpr::Const(c) => *c,
            IExpr::Add(ts) => ts.iter().map(|t| t.eval(vars)).sum(),
            IExpr::Mul(x, k) => x.eval(vars) * k,
            IExpr::Div(x, k) => x.eval(vars).div_euclid(*k),
            IExpr::Mod(x, k) => x.eval(vars).rem_euclid(*k),
            // What it stands for (in range wherever it is used).
            IExpr::Wrap(x, _) => x.eval(vars),
        }
    }
}

impl fmt::Display for IExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IExpr::Var(v) => write!(f, "i{v}"),
            IExpr::Const(c) => write!(f, "{c}"),
            IExpr::Add(ts) => {
                write!(f, "(")?;
                for (i, t) in ts.iter().enumerate() {
                    if i > 0 {
                        write!(f, " + ")?;
                    }
                    write!(f, "{t}")?;
                }
                write!(f, ")")
            }
            IExpr::Mul(x, k) => write!(f, "{x}*{k}"),
            IExpr::Div(x, k) => write!(f, "{x}/{k}"),
            IExpr::Mod(x, k) => write!(f, "{x}%{k}"),
            IExpr::Wrap(x, k) => write!(f, "wrap({x}, 0..{k})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IExpr::*;

    #[test]
    fn reshape_of_contiguous_simplifies_away() {
        // A [3, 4] tensor read as [12] and split back: (i0*4 + i1) / 4 -> i0, % 4 -> i1.
        let ext = [3, 4];
        let flat = Var(0).times(4).plus(Var(1));
        assert_eq!(flat.clone().floor_div(4).simplify(&ext), Var(0));
        assert_eq!(flat.modulo(4).simplify(&ext), Var(1));
        // Coefficients past the divisor split too, where the remainders stay below it: i0 * 8 + i1 (i1 < 4 here,
        // i0 + i1 < 7) by 7.
        let long = Var(0).times(8).plus(Var(1));
        assert_eq!(long.clone().floor_div(7).simplify(&ext), Var(0));
        assert_eq!(long.modulo(7).simplify(&ext), Var(0).plus(Var(1)).simplify(&ext));
        // Not separable: (i0*3 + i1) / 4 stays a division.
        let e = Var(0).times(3).plus(Var(1)).floor_div(4).simplify(&ext);
        assert!(matches!(e, Div(..)), "{e}");
    }

    #[test]
    fn window_positions_in_merged_dims_simplify() {
        // [8, 576, 3136] read as [8, 64, 3, 3, 56, 56]: the channel is k / 9, the row in the window (k / 3) % 3.
        let ext = [8, 576, 3136];
        let flat = Var(1).times(3136).plus(Var(2));
        assert_eq!(flat.clone().floor_div(28224).simplify(&ext), Var(1).floor_div(9));
        let row = flat.floor_div(9408).plus(Var(0).times(192)).modulo(3).simplify(&ext);
        assert_eq!(row, Var(1).floor_div(3).modulo(3));
        // Multiples of the divisor leave a sum that is not affine: (i2 / 56 + i1 * 56) % 56 is i2 / 56.
        let e = Var(2).floor_div(56).plus(Var(1).times(56)).modulo(56).simplify(&ext);
        assert_eq!(e, Var(2).floor_div(56));
        let q = Var(2).floor_div(56).plus(Var(1).times(112)).floor_div(56).simplify(&ext);
        assert_eq!(q.eval(&[0, 5, 3135]), (3135 / 56 + 5 * 112) / 56);
    }

    #[test]
    fn digits_of_one_value_recombine() {
        // [64, 576] read through [64, 64, 3, 3]: i0 * 576 + (i1 / 9) * 9 + ((i1 / 3) % 3) * 3 + i1 % 3.
        let ext = [64, 576];
        let i1 = || Var(1);
        let e = Var(0)
            .times(576)
            .plus(i1().floor_div(9).times(9))
            .plus(i1().floor_div(3).modulo(3).times(3))
            .plus(i1().modulo(3));
        assert_eq!(e.simplify(&ext), Var(0).times(576).plus(Var(1)).simplify(&ext));
        // Scaled by a stride, and only part of the digits: ((i1 / 3) % 3) * 6 + (i1 % 3) * 2 is (i1 % 9) * 2.
        let part = i1().floor_div(3).modulo(3).times(6).plus(i1().modulo(3).times(2)).simplify(&ext);
        assert_eq!(part, i1().modulo(9).times(2));
        for v in 0..576 {
            assert_eq!(part.eval(&[0, v]), (v % 9) * 2);
        }
    }

    #[test]
    fn separable_expressions_split_per_variable() {
        // A convolution's patches read at [k, p]: (k / 9) * 3364 + ((k / 3) % 3) * 58 + k % 3 + (p / 56) * 58 +
        // p % 56 + 7, times 2.
        let k = Var(0).floor_div(9).times(3364).plus(Var(0).floor_div(3).modulo(3).times(58)).plus(Var(0).modulo(3));
        let p = Var(1).floor_div(56).times(58).plus(Var(1).modulo(56));
        let e = k.plus(p).plus(Const(7)).times(2);
        let (parts, c) = e.separate(3).expect("separable");
        assert_eq!((parts[2].clone(), c), (Const(0), 14));
        for (kv, pv) in [(0, 0), (17, 3), (575, 3135), (40, 57)] {
            let vars = [kv, pv, 0];
            assert_eq!(parts[0].eval(&vars) + parts[1].eval(&vars) + c, e.eval(&vars));
            assert_eq!(parts[0].vars(), vec![0]);
        }
        // A term mixing two variables is not separable.
        assert!(Var(0).times(4).plus(Var(1)).floor_div(3).separate(2).is_none());
    }

    #[test]
    fn simplified_expressions_evaluate_the_same() {
        let ext = [5, 6, 7];
        let exprs = [
            // A window re-read as rows one longer: (i0 * 8 + i1) by 7 splits as i0 and i0 + i1.
            Var(0).times(8).plus(Var(1)).floor_div(7),
            Var(0).times(8).plus(Var(1)).modulo(7),
            Var(0).times(42).plus(Var(1).times(7)).plus(Var(2)).floor_div(7).modulo(6),
            Var(2).times(6).plus(Var(1)).plus(Const(3)).floor_div(4),
            Var(0).plus(Var(1).times(5)).modulo(5).plus(Const(-1)).times(2),
            // A common factor of the divisor (6 of 12; 7 of 14 with a remainder that reaches 7).
            Var(0).times(6).plus(Var(1)).floor_div(12),
            Var(0).times(6).plus(Var(1)).modulo(12),
            Var(0).times(7).plus(Var(1)).plus(Const(2)).floor_div(14),
            Var(0).times(7).plus(Var(1)).plus(Const(2)).modulo(14),
            // Multiples pulled out of a sum that is not affine, a negative constant among them.
            Var(2).floor_div(2).plus(Var(0).times(3)).plus(Const(-3)).floor_div(3),
            Var(2).floor_div(3).plus(Var(1).times(4)).plus(Const(5)).modulo(4),
            Var(2).modulo(3).plus(Var(1).times(-6)).plus(Const(40)).floor_div(6).modulo(5),
        ];
        for e in &exprs {
            let s = e.simplify(&ext);
            for a in 0..5 {
                for b in 0..6 {
                    for c in 0..7 {
                        assert_eq!(e.eval(&[a, b, c]), s.eval(&[a, b, c]), "{e} vs {s}");
                    }
                }
            }
        }
    }
}
