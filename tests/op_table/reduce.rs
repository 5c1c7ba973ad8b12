//! The op table's reductions and statistics.

use super::*;

/// (shape, dims, keepdim). An empty dims list reduces every dim; a zero-dim tensor's dim is 0 or -1.
pub(super) const REDUCE_CASES: [(&[usize], &[isize], bool); 19] = [
    (&[], &[0], false),
    (&[], &[-1], true),
    (&[], &[], false),
    (&[5], &[0], false),
    (&[5], &[-1], true),
    (&[2, 3, 4], &[0], false),
    (&[2, 3, 4], &[1], true),
    (&[2, 3, 4], &[-1], false),
    (&[2, 3, 4], &[0, 2], false),
    (&[2, 3, 4], &[-1, -3], true),
    (&[2, 3, 4], &[], false),
    (&[2, 3, 4], &[], true),
    (&[4, 16], &[1], false),
    (&[64], &[0], true),
    (&[2, 0, 3], &[1], false),
    (&[2, 0, 3], &[1], true),
    (&[2, 0, 3], &[0, 2], false),
    (&[2, 0, 3], &[2], false),
    (&[2, 0, 3], &[], false),
];

/// logsumexp, var, std and norm over `REDUCE_CASES`, against the naive reference in f64: `log Σ exp`, the
/// two-pass variance with PyTorch's `correction` (NaN or inf where `N - correction <= 0`), the p-norms.
pub(super) fn statistics(t: &mut Table) {
    for d in FLOATS {
        for (shape, dims, keepdim) in REDUCE_CASES {
            let axes = resolve_all(dims, shape.len());
            let n: usize = axes.iter().map(|&a| shape[a]).product();
            let x = In::random(d, shape, seed(&[&"statistics", &d, &shape, &dims, &keepdim]), Dom::Cont(-2.0, 2.0));
            let nd = x.nd();
            let dv = dims.to_vec();
            let what = format!("dims {dims:?} keepdim {keepdim}");
            let lse = nd.map(f64::exp).reduce(&axes, keepdim, 0.0, |a, b| a + b).map(f64::ln);
            let dl = dv.clone();
            t.check(
                "logsumexp",
                &what,
                vec![x.clone()],
                move |a| a[0].logsumexp(dl.clone(), keepdim),
                Want::nd(d, &lse, Kind::Accumulate),
            );
            let mean = nd.reduce(&axes, true, 0.0, |a, b| a + b).map(|s| s / n as f64);
            let sq =
                nd.zip(&mean.broadcast_to(&nd.shape), |v, m| (v - m) * (v - m))
                    .reduce(&axes, keepdim, 0.0, |a, b| a + b);
            for correction in [0.0, 1.0] {
                let var = sq.map(|s| s / (n as f64 - correction).max(0.0));
                let std = var.map(f64::sqrt);
                let (dvar, dstd) = (dv.clone(), dv.clone());
                let what = format!("{what} correction {correction}");
                t.check(
                    "var",
                    &what,
                    vec![x.clone()],
                    move |a| a[0].var(dvar.clone(), correction, keepdim),
                    Want::nd(d, &var, Kind::Accumulate),
                );
                t.check(
                    "std",
                    &what,
                    vec![x.clone()],
                    move |a| a[0].std(dstd.clone(), correction, keepdim),
                    Want::nd(d, &std, Kind::Accumulate),
                );
            }
            for p in [2.0, 1.0, 3.0, 0.0, INF, -INF] {
                if p.is_infinite() && n == 0 {
                    continue; // the max or min over an empty dim is an error, as for `max` (and in PyTorch)
                }
                let norm = match p {
                    INF => nd.map(f64::abs).reduce(&axes, keepdim, 0.0, f64::max),
                    _ if p == -INF => nd.map(f64::abs).reduce(&axes, keepdim, INF, f64::min),
                    0.0 => nd.map(|v| (v != 0.0) as u8 as f64).reduce(&axes, keepdim, 0.0, |a, b| a + b),
                    _ => nd.map(|v| v.abs().powf(p)).reduce(&axes, keepdim, 0.0, |a, b| a + b).map(|s| s.powf(1.0 / p)),
                };
                let dn = dv.clone();
                t.check(
                    "norm",
                    &format!("{what} p {p}"),
                    vec![x.clone()],
                    move |a| a[0].norm(p, dn.clone(), keepdim),
                    Want::nd(d, &norm, Kind::Accumulate),
                );
            }
        }
    }
    // PyTorch's logsumexp where the maximum is infinite: a row of -inf gives -inf, a +inf gives +inf; NaN stays.
    for d in FLOATS {
        let x = In::new(d, &[4, 3], &[-INF, -INF, -INF, INF, 1.0, 2.0, 1.0, 2.0, 3.0, NAN, 0.0, 1.0]);
        let want = [-INF, INF, (1f64.exp() + 2f64.exp() + 3f64.exp()).ln(), NAN];
        t.check(
            "logsumexp",
            "infinite maxima",
            vec![x],
            |a| a[0].logsumexp(1, false),
            Want::new(d, &[4], &want, Kind::Accumulate),
        );
    }
    // Int input: logsumexp in f32 (PyTorch); var of one element with Bessel's correction is NaN (0 / 0).
    let ints = In::new(I32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let want = [(1f64.exp() + 2f64.exp()).ln(), (3f64.exp() + 4f64.exp()).ln()];
    t.check(
        "logsumexp",
        "i32 input",
        vec![ints],
        |a| a[0].logsumexp(1, false),
        Want::new(F32, &[2], &want, Kind::Accumulate),
    );
    t.check(
        "var",
        "one element",
        vec![In::new(F32, &[1], &[3.0])],
        |a| a[0].var(0, 1.0, false),
        Want::new(F32, &[], &[NAN], Kind::Exact),
    );
}

pub(super) type Red = fn(&Tensor, Vec<isize>, bool) -> Tensor;
/// (name, op, dtypes, identity, fold, float-only)
pub(super) type RedCase = (&'static str, Red, &'static [DType], f64, Fold, bool);

pub(super) fn reduce(t: &mut Table) {
    let ops: [RedCase; 5] = [
        ("sum", |x, d, k| x.sum(d, k), &ALL_DTYPES, 0.0, |a, b| a + b, false),
        ("prod", |x, d, k| x.prod(d, k), &ALL_DTYPES, 1.0, |a, b| a * b, false),
        ("max", |x, d, k| x.max(d, k), &ALL_DTYPES, -INF, f64::max, true),
        ("min", |x, d, k| x.min(d, k), &ALL_DTYPES, INF, f64::min, true),
        ("mean", |x, d, k| x.mean(d, k), &FLOATS, 0.0, |a, b| a + b, false),
    ];
    for (op, f, dtypes, init, fold, needs_nonempty) in ops {
        for &d in dtypes {
            for (shape, dims, keepdim) in REDUCE_CASES {
                let axes = resolve_all(dims, shape.len());
                if needs_nonempty && axes.iter().any(|&a| shape[a] == 0) {
                    continue; // max/min over an empty dim is an error (as in PyTorch), tested elsewhere
                }
                let dom = if op == "prod" {
                    if d.is_float() { Dom::Cont(0.5, 1.5) } else { Dom::Grid(-2.0, 2.0) }
                } else if d.is_float() {
                    Dom::Cont(-2.0, 2.0)
                } else {
                    Dom::Cont(-100.0, 100.0)
                };
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dims, &keepdim]), dom);
                let mut want = x.nd().reduce(&axes, keepdim, init, fold);
                if op == "mean" {
                    let count: usize = axes.iter().map(|&a| shape[a]).product();
                    want = want.map(|s| s / count as f64);
                }
                // Sums and products of bool and ints are i64; everything else keeps its dtype.
                let od = if (op == "sum" || op == "prod") && !d.is_float() { I64 } else { d };
                let kind = if needs_nonempty { Kind::Exact } else { Kind::Accumulate };
                let dv = dims.to_vec();
                t.check(
                    op,
                    &format!("dims {dims:?} keepdim {keepdim}"),
                    vec![x],
                    move |a| f(&a[0], dv.clone(), keepdim),
                    Want::nd(od, &want, kind),
                );
            }
        }
    }
    statistics(t);
    // The *_all forms: a zero-dim result.
    let alls: [(&str, UnOp, &[DType], f64, Fold); 5] = [
        ("sum_all", Tensor::sum_all, &ALL_DTYPES, 0.0, |a, b| a + b),
        ("prod_all", Tensor::prod_all, &ALL_DTYPES, 1.0, |a, b| a * b),
        ("max_all", Tensor::max_all, &ALL_DTYPES, -INF, f64::max),
        ("min_all", Tensor::min_all, &ALL_DTYPES, INF, f64::min),
        ("mean_all", Tensor::mean_all, &FLOATS, 0.0, |a, b| a + b),
    ];
    for (op, f, dtypes, init, fold) in alls {
        for &d in dtypes {
            for shape in [&[][..], &[5], &[2, 3, 4], &[2, 0, 3]] {
                let n: usize = shape.iter().product();
                if n == 0 && (op == "max_all" || op == "min_all") {
                    continue;
                }
                let dom = if op == "prod_all" { Dom::Grid(-1.0, 1.5) } else { any_dom(d) };
                let x = In::random(d, shape, seed(&[&op, &d, &shape]), dom);
                let mut v = x.nd().v.iter().fold(init, |a, &b| fold(a, b));
                if op == "mean_all" {
                    v /= n as f64;
                }
                let od = if (op == "sum_all" || op == "prod_all") && !d.is_float() { I64 } else { d };
                let kind = if op.starts_with("max") || op.starts_with("min") { Kind::Exact } else { Kind::Accumulate };
                t.check(op, "", vec![x], move |a| f(&a[0]), Want::new(od, &[], &[v], kind));
            }
        }
    }
    // NaN propagates through max/min (PyTorch) and sums; infinities.
    for d in FLOATS {
        let x = In::new(d, &[2, 3], &[1.0, NAN, 3.0, 4.0, 5.0, 6.0]);
        t.check(
            "max",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max(1, false),
            Want::new(d, &[2], &[NAN, 6.0], Kind::Exact),
        );
        t.check(
            "min",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].min(-1, true),
            Want::new(d, &[2, 1], &[NAN, 4.0], Kind::Exact),
        );
        t.check(
            "max",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max(0, false),
            Want::new(d, &[3], &[4.0, NAN, 6.0], Kind::Exact),
        );
        t.check(
            "max_all",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max_all(),
            Want::new(d, &[], &[NAN], Kind::Exact),
        );
        t.check(
            "min_all",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].min_all(),
            Want::new(d, &[], &[NAN], Kind::Exact),
        );
        t.check(
            "sum",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].sum(1, false),
            Want::new(d, &[2], &[NAN, 15.0], Kind::Accumulate),
        );
        t.check(
            "mean",
            "NaN propagates",
            vec![x],
            |a| a[0].mean(1, false),
            Want::new(d, &[2], &[NAN, 5.0], Kind::Accumulate),
        );
        let y = In::new(d, &[2, 2], &[-INF, -INF, INF, -INF]);
        t.check(
            "max",
            "all -inf",
            vec![y.clone()],
            |a| a[0].max(1, false),
            Want::new(d, &[2], &[-INF, INF], Kind::Exact),
        );
        t.check(
            "sum",
            "inf + -inf",
            vec![y.clone()],
            |a| a[0].sum(1, false),
            Want::new(d, &[2], &[-INF, NAN], Kind::Exact),
        );
        t.check("prod", "inf * -inf", vec![y], |a| a[0].prod(1, false), Want::new(d, &[2], &[INF, -INF], Kind::Exact));
    }
    t.check(
        "prod",
        "i64 wraps",
        vec![In::buf(&[2], HostBuffer::I64(vec![1 << 32, 1 << 32].into()))],
        |a| a[0].prod(0, false),
        Want::buf(&[], HostBuffer::I64(vec![0].into()), Kind::Exact),
    );
    t.check(
        "sum",
        "i32 sums as i64 (no i32 overflow)",
        vec![v(I32, &[2147483647.0, 1.0])],
        |a| a[0].sum(0, false),
        Want::new(I64, &[], &[2147483648.0], Kind::Exact),
    );
    t.check(
        "sum",
        "u8 sums as i64 (no wrap)",
        vec![v(U8, &[255.0, 255.0, 2.0])],
        |a| a[0].sum_all(),
        Want::new(I64, &[], &[512.0], Kind::Exact),
    );

    // argmax / argmin: i64 indices; the first extreme wins ties; NaN counts as the extreme (the first NaN).
    let args: [(&str, ArgOp, bool); 2] =
        [("argmax", |x, d, k| x.argmax(d, k), true), ("argmin", |x, d, k| x.argmin(d, k), false)];
    let arg_cases: [(&[usize], isize, bool); 11] = [
        (&[], 0, false),
        (&[], -1, true),
        (&[7], 0, false),
        (&[7], -1, true),
        (&[3, 4], 0, false),
        (&[3, 4], 1, true),
        (&[3, 4], -1, false),
        (&[2, 3, 4], 1, false),
        (&[2, 3, 4], -3, true),
        (&[0, 3], 1, false),
        (&[0, 3], -1, true),
    ];
    for (op, f, is_max) in args {
        for d in NON_BOOL {
            for (shape, dim, keepdim) in arg_cases {
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dim]), Dom::Grid(-2.0, 2.0));
                let want = arg_ref(&x.nd(), dim, keepdim, is_max);
                t.check(
                    op,
                    &format!("dim {dim} keepdim {keepdim}"),
                    vec![x],
                    move |a| f(&a[0], dim, keepdim),
                    Want::nd(I64, &want, Kind::Exact),
                );
            }
            for shape in [&[][..], &[1, 1], &[2, 3], &[2, 3, 4]] {
                let x = In::random(d, shape, seed(&[&op, &"all", &d, &shape]), Dom::Grid(-2.0, 2.0));
                let flat = x.nd().reshape(&[x.nd().numel()]);
                let want = arg_ref(&flat, 0, false, is_max);
                let all: fn(&Tensor) -> Tensor = if is_max { Tensor::argmax_all } else { Tensor::argmin_all };
                t.check(
                    if is_max { "argmax_all" } else { "argmin_all" },
                    "",
                    vec![x],
                    move |a| all(&a[0]),
                    Want::nd(I64, &want, Kind::Exact),
                );
            }
        }
        for d in FLOATS {
            let x = In::new(d, &[2, 4], &[1.0, NAN, 3.0, NAN, -INF, -INF, INF, INF]);
            let w = if is_max { [1.0, 2.0] } else { [1.0, 0.0] };
            t.check(
                op,
                "first NaN; ties pick the first",
                vec![x.clone()],
                move |a| f(&a[0], 1, false),
                Want::new(I64, &[2], &w, Kind::Exact),
            );
            // Columns: [1, -inf], [NaN, -inf], [3, inf], [NaN, inf].
            let w = if is_max { [0.0, 0.0, 1.0, 0.0] } else { [1.0, 0.0, 0.0, 0.0] };
            t.check(
                op,
                "dim 0 with NaN and infinities",
                vec![x.clone()],
                move |a| f(&a[0], 0, false),
                Want::new(I64, &[4], &w, Kind::Exact),
            );
            let all: fn(&Tensor) -> Tensor = if is_max { Tensor::argmax_all } else { Tensor::argmin_all };
            t.check(
                if is_max { "argmax_all" } else { "argmin_all" },
                "first NaN",
                vec![x],
                move |a| all(&a[0]),
                Want::new(I64, &[], &[1.0], Kind::Exact),
            );
        }
        for d in [U8, U32, I32, I64, F16, F32, F64] {
            let x = v(d, &[3.0, 1.0, 3.0, 1.0, 2.0, 3.0]);
            let w = if is_max { 0.0 } else { 1.0 };
            t.check(
                op,
                "ties pick the first",
                vec![x],
                move |a| f(&a[0], 0, false),
                Want::new(I64, &[], &[w], Kind::Exact),
            );
        }
    }
}

/// Index of the first extreme (or first NaN) along `dim`.
pub(super) fn arg_ref(x: &Nd, dim: isize, keepdim: bool, is_max: bool) -> Nd {
    if x.shape.is_empty() {
        return Nd::scalar(0.0);
    }
    let d = resolve(dim, x.shape.len());
    let mut kept = x.shape.clone();
    kept[d] = 1;
    let out = Nd::from_fn(&kept, |i| {
        let mut best: Option<(usize, f64)> = None;
        for j in 0..x.shape[d] {
            let mut idx = i.to_vec();
            idx[d] = j;
            let v = x.at(&idx);
            let better = match best {
                None => true,
                Some((_, b)) if b.is_nan() => false,
                Some((_, b)) => v.is_nan() || if is_max { v > b } else { v < b },
            };
            if better {
                best = Some((j, v));
            }
        }
        best.expect("non-empty dim").0 as f64
    });
    if keepdim {
        return out;
    }
    let mut shape = x.shape.clone();
    shape.remove(d);
    out.reshape(&shape)
}
