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
        IExpr::Mod(x, k) => {
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
                IExpr::Div(..) | IExpr::Mod(..) => return false,
            }
            true
        }
        walk(self, 1, &mut coef, &mut c).then_some((coef, c))
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
                if rest.len() == 1 { rest.pop().expect("one term") } else { IExpr::Add(rest) }
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
                // (k*q + r) / k == q + r / k when every term of q's part is a multiple of k and r >= 0.
                if let Some((coef, c)) = x.affine(n) {
                    if let Some((q, _)) = split_by(&coef, c, *k, extents) {
                        return q;
                    }
                    let (mut q, mut r) = (vec![0; n], vec![0; n]);
                    for v in 0..n {
                        if coef[v] % k == 0 { q[v] = coef[v] / k } else { r[v] = coef[v] }
                    }
                    let (qc, rc) = (c.div_euclid(*k), c.rem_euclid(*k));
                    let rest = IExpr::from_affine(&r, rc);
                    let (rlo, rhi) = rest.bounds(extents);
                    if rlo >= 0 && rhi < *k {
                        return IExpr::from_affine(&q, qc);
                    }
                    if rlo >= 0 && q.iter().any(|&a| a != 0) {
                        return IExpr::Add(vec![IExpr::from_affine(&q, qc), rest.floor_div(*k)]).simplify(extents);
                    }
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
                // (k*q + r) % k == r % k: drop the terms that are multiples of k.
                if let Some((coef, c)) = x.affine(n) {
                    if let Some((_, r)) = split_by(&coef, c, *k, extents) {
                        return r;
                    }
                    let r: Vec<i64> = coef.iter().map(|&a| if a % k == 0 { 0 } else { a }).collect();
                    let rest = IExpr::from_affine(&r, c.rem_euclid(*k));
                    let (rlo, rhi) = rest.bounds(extents);
                    if rlo >= 0 && rhi < *k {
                        return rest;
                    }
                    if rlo >= 0 && rest != x {
                        return rest.modulo(*k);
                    }
                }
                IExpr::Mod(Box::new(x), *k)
            }
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
    fn simplified_expressions_evaluate_the_same() {
        let ext = [5, 6, 7];
        let exprs = [
            // A window re-read as rows one longer: (i0 * 8 + i1) by 7 splits as i0 and i0 + i1.
            Var(0).times(8).plus(Var(1)).floor_div(7),
            Var(0).times(8).plus(Var(1)).modulo(7),
            Var(0).times(42).plus(Var(1).times(7)).plus(Var(2)).floor_div(7).modulo(6),
            Var(2).times(6).plus(Var(1)).plus(Const(3)).floor_div(4),
            Var(0).plus(Var(1).times(5)).modulo(5).plus(Const(-1)).times(2),
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
