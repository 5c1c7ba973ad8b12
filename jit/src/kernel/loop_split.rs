//! Splitting output loops so that indices become affine: the inverse of `KernelIr::with_merged_loops`.
//!
//! A reshape across a permutation reads its source with `/` and `%` of the loop variables: the `[B * T, 3 * D]`
//! gradient of attention's `[3, B, H, T, D / H]` heads reads element `(r, c)` at
//! `(c / 128) * 131072 + (r / 64) * 8192 + ((c % 128) / 32) * 2048 + (r % 64) * 32 + c % 32`. Generated code then
//! computes a division per element and, with no unit stride along the vectorized loop, loads lane by lane. Split
//! `r` into `(r / 64, r % 64)` and `c` into `(c / 128, c / 32 % 4, c % 32)` as loops of their own and every index is
//! affine again: the kernel runs `[16, 64, 3, 4, 32]` with vector loads along the last loop. Splitting a loop into
//! (outer, inner) keeps the row-major order of the output, so the elements and the order they are stored in are
//! unchanged; only the loop nest that enumerates them differs.
//!
//! Elementwise kernels only (a reduction's loops are left to `split.rs` and the GEMM). A split is taken when it
//! lowers the count of divisions and remainders left in the indices, greedily, a bounded number of times.

use crate::kernel::index::IExpr;
use crate::kernel::ir::KernelIr;

/// Splits at most this many loops (each split adds a loop).
const MAX_SPLITS: usize = 8;

impl KernelIr {
    /// The same elementwise kernel with output loops split where that makes indices affine (module doc); any other
    /// kernel, or one with nothing to gain, as it is.
    pub fn with_split_loops(&self) -> KernelIr {
        if self.reduce.is_some() || !self.rows.is_empty() || self.out_extents.is_empty() {
            return self.clone();
        }
        let mut k = self.clone();
        for _ in 0..MAX_SPLITS {
            let bad = non_affine(&k);
            if bad == 0 {
                break;
            }
            let best = candidates(&k)
                .into_iter()
                .map(|(v, f)| split(&k, v, f))
                .map(|s| (non_affine(&s), s))
                .filter(|(n, _)| *n < bad)
                .min_by_key(|(n, _)| *n);
            match best {
                Some((_, s)) => k = s,
                None => break,
            }
        }
        k
    }
}

/// Every index expression of the outer code (loads' validity ranges included).
fn exprs(k: &KernelIr) -> Vec<&IExpr> {
    k.outer.iter().flat_map(crate::kernel::ir::Inst::indices).collect()
}

/// The divisions and remainders left in the indices: what a split must lower (a whole index turns affine only
/// after several splits, each removing some of them).
fn non_affine(k: &KernelIr) -> usize {
    fn count(e: &IExpr) -> usize {
        match e {
            IExpr::Var(_) | IExpr::Const(_) => 0,
            IExpr::Add(ts) => ts.iter().map(count).sum(),
            IExpr::Mul(x, _) => count(x),
            IExpr::Div(x, _) | IExpr::Mod(x, _) => 1 + count(x),
            IExpr::Wrap(x, _) => count(x),
        }
    }
    exprs(k).into_iter().map(count).sum()
}

/// (loop, factor) pairs worth trying: for each `x / d` or `x % d` over an affine `x`, each loop `v` of `x` whose
/// split by `f = d / gcd(coef_v, d)` makes `coef_v * f` a multiple of `d` (so the outer part of `v` leaves the
/// remainder), where `f` divides the loop's extent.
fn candidates(k: &KernelIr) -> Vec<(usize, usize)> {
    let n = k.out_rank();
    let mut out = Vec::new();
    let mut visit = |e: &IExpr| {
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            match e {
                IExpr::Div(x, d) | IExpr::Mod(x, d) => match x.affine(n) {
                    Some((coef, _)) => {
                        for (v, &a) in coef.iter().enumerate() {
                            if a == 0 || *d <= 1 {
                                continue;
                            }
                            let f = (d / gcd(a.abs(), *d)) as usize;
                            let ext = k.out_extents[v];
                            if f > 1 && f < ext && ext.is_multiple_of(f) && !out.contains(&(v, f)) {
                                out.push((v, f));
                            }
                        }
                    }
                    None => stack.push(x),
                },
                IExpr::Add(ts) => stack.extend(ts.iter()),
                IExpr::Mul(x, _) | IExpr::Wrap(x, _) => stack.push(x),
                IExpr::Var(_) | IExpr::Const(_) => {}
            }
        }
    };
    for e in exprs(k) {
        visit(e);
    }
    out
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `k` with loop `v` split into `(v / f, v % f)`: loops after `v` move up by one, every index is rewritten and
/// simplified over the new extents.
fn split(k: &KernelIr, v: usize, f: usize) -> KernelIr {
    let mut extents = k.out_extents.clone();
    extents[v] /= f;
    extents.insert(v + 1, f);
    let map = |w: usize| match w.cmp(&v) {
        std::cmp::Ordering::Less => IExpr::Var(w),
        std::cmp::Ordering::Equal => IExpr::Var(v).times(f as i64).plus(IExpr::Var(v + 1)),
        std::cmp::Ordering::Greater => IExpr::Var(w + 1),
    };
    let rewrite = |e: &IExpr| e.map_vars(&map).simplify(&extents);
    let mut out = k.clone();
    for inst in &mut out.outer {
        inst.map_indices(&rewrite);
    }
    out.row_rank = extents.len();
    out.out_extents = extents;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, Scalar};
    use crate::kernel::ir::{BufParam, Inst, InstOp};

    /// A copy reading `in0` at `index` over loops `extents`.
    fn copy(extents: &[usize], index: IExpr) -> KernelIr {
        let n: usize = extents.iter().product();
        let load = InstOp::Load { buf: 0, index, valid: None, fill: Scalar::Int(0) };
        KernelIr {
            name: "E_copy".into(),
            inputs: vec![BufParam { dtype: DType::F32, len: n }],
            output: BufParam { dtype: DType::F32, len: n },
            out_extents: extents.to_vec(),
            reduce: None,
            rows: Vec::new(),
            row_rank: extents.len(),
            outer: vec![Inst { op: load, dtype: DType::F32 }],
            result: 0,
            flops_per_elem: 0,
            routine: None,
        }
    }

    #[test]
    fn a_transposing_reshape_becomes_affine_and_keeps_every_element_in_place() {
        // [6, 4] read from a [2, 4, 3] buffer permuted to [2, 3, 4]: (r, c) -> (r / 3, c, r % 3).
        let (r, c) = (IExpr::Var(0), IExpr::Var(1));
        let index = r.clone().floor_div(3).times(12).plus(c.times(3)).plus(r.modulo(3));
        let k = copy(&[6, 4], index.clone());
        let s = k.with_split_loops();
        assert_eq!(s.out_extents, [2, 3, 4]);
        assert_eq!(non_affine(&s), 0, "{s}");
        // Element by element (row-major over either nest), the same buffer positions.
        let InstOp::Load { index: split_index, .. } = &s.outer[0].op else { unreachable!() };
        let mut flat = 0;
        for a in 0..2 {
            for b in 0..3 {
                for d in 0..4 {
                    let (rr, cc) = (flat / 4, flat % 4);
                    assert_eq!(split_index.eval(&[a, b, d]), index.eval(&[rr, cc]), "element {flat}");
                    flat += 1;
                }
            }
        }
    }

    #[test]
    fn affine_kernels_and_reductions_are_left_alone() {
        let k = copy(&[6, 4], IExpr::Var(0).times(4).plus(IExpr::Var(1)));
        assert_eq!(k.with_split_loops(), k);
        // A division that no split of whole loops removes (5 does not divide 6).
        let odd = copy(&[6, 4], IExpr::Var(0).floor_div(5));
        assert_eq!(odd.with_split_loops(), odd);
    }
}
