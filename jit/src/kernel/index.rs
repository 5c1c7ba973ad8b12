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

/// An affine `Σ coef_v x_v + c` as `g X + r` with `g` a factor of `k` (one of the coefficients), `X` the terms
/// that `g` divides (divided by it) and `r` the rest in `0..g` over the variables' ranges: `(X, k / g, (g, r))`,
/// the largest such `g` first; `None` where there is none.
fn common_factor(coef: &[i64], c: i64, k: i64, extents: &[usize]) -> Option<(IExpr, i64, (i64, IExpr))> {
    let mut gs: Vec<i64> = coef.iter().map(|a| a.abs()).filter(|&g| g > 1 && g < k && k % g == 0).collect();
    gs.sort_unstable_by(|a, b| b.cmp(a));
    gs.dedup();
    gs.into_iter().find_map(|g| {
        let (big, small): (Vec<i64>, Vec<i64>) =
            coef.iter().map(|&a| if a % g == 0 { (a / g, 0) } else { (0, a) }).unzip();
        let r = IExpr::from_affine(&small, c.rem_euclid(g));
        let (lo, hi) = r.bounds(extents);
        (lo >= 0 && hi < g).then(|| (IExpr::from_affine(&big, c.div_euclid(g)), k / g, (g, r)))
    })
}

/// A sum that is not affine, `y + k z` with `z` the affine multiples of `k` among its terms: `(z, y)`; `None`
/// where there are none (or `x` is not a sum).
fn pull_multiples(x: &IExpr, k: i64, n: usize) -> Option<(IExpr, IExpr)> {
    let IExpr::Add(ts) = x else { return None };
    let (mut z, mut zc) = (vec![0; n], 0);
    let mut y = Vec::with_capacity(ts.len());
    for t in ts {
        match t.affine(n) {
            Some((coef, c)) => {
                let rest: Vec<i64> = coef.iter().map(|a| a.rem_euclid(k)).collect();
                z.iter_mut().zip(&coef).for_each(|(q, a)| *q += a.div_euclid(k));
                zc += c.div_euclid(k);
                y.push(IExpr::from_affine(&rest, c.rem_euclid(k)));
            }
            None => y.push(t.clone()),
        }
    }
    (zc != 0 || z.iter().any(|&q| q != 0)).then(|| (IExpr::from_affine(&z, zc), IExpr::Add(y)))
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

    /// The variables the expression reads, in ascending order without repeats.
    pub fn vars(&self) -> Vec<usize> {
        fn walk(e: &IExpr, out: &mut Vec<usize>) {
            match e {
                IExpr::Var(v) => out.push(*v),
                IExpr::Const(_) => {}
                IExpr::Add(ts) => ts.iter().for_each(|t| walk(t, out)),
                IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) => walk(x, out),
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
        let mut parts: Vec<Vec<IExpr>> = vec![Vec::new(); nvars];
        let mut c = 0;
        fn walk(e: &IExpr, k: i64, parts: &mut [Vec<IExpr>], c: &mut i64) -> bool {
            match e {
                IExpr::Const(x) => *c += k * x,
                IExpr::Add(ts) => return ts.iter().all(|t| walk(t, k, parts, c)),
                IExpr::Mul(x, m) => return walk(x, k * m, parts, c),
                _ => {
                    let vars = e.vars();
                    let [v] = vars.as_slice() else { return false };
                    let Some(part) = parts.get_mut(*v) else { return false };
                    part.push(if k == 1 { e.clone() } else { e.clone().times(k) });
                }
            }
            true
        }
        if !walk(self, 1, &mut parts, &mut c) {
            return None;
        }
        let parts = parts
            .into_iter()
            .map(|mut p| match p.len() {
                0 => IExpr::Const(0),
                1 => p.pop().expect("one term"),
                _ => IExpr::Add(p),
            })
            .collect();
        Some((parts, c))
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
                    // (g X + r) / (g m) == X / m where 0 <= r < g: a window position `(k * 3136 + p) / 28224`
                    // with p < 3136 is `k / 9`.
                    if let Some((x, m, _)) = common_factor(&coef, c, *k, extents) {
                        return x.floor_div(m).simplify(extents);
                    }
                } else if let Some((z, y)) = pull_multiples(&x, *k, n) {
                    // (y + k z) / k == y / k + z (Euclidean division, any signs).
                    return IExpr::Add(vec![y.floor_div(*k), z]).simplify(extents);
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
                    // (g X + r) % (g m) == g (X % m) + r where 0 <= r < g.
                    if let Some((x, m, (g, r))) = common_factor(&coef, c, *k, extents) {
                        return IExpr::Add(vec![x.modulo(m).times(g), r]).simplify(extents);
                    }
                } else if let Some((_, y)) = pull_multiples(&x, *k, n) {
                    // (y + k z) % k == y % k.
                    return y.modulo(*k).simplify(extents);
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
