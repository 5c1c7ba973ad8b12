//! The op table's unary elementwise ops.

use super::*;

pub(super) struct Un {
    op: &'static str,
    f: fn(&Tensor) -> Tensor,
    r: fn(f64) -> f64,
    dtypes: &'static [DType],
    dom: Dom,
    out: Out,
    kind: Kind,
}

pub(super) fn un(
    op: &'static str,
    f: fn(&Tensor) -> Tensor,
    r: fn(f64) -> f64,
    dtypes: &'static [DType],
    dom: Dom,
    out: Out,
    kind: Kind,
) -> Un {
    Un { op, f, r, dtypes, dom, out, kind }
}

pub(super) const UNARY_SHAPES: [&[usize]; 5] = [&[], &[5], &[2, 3], &[2, 0, 3], &[2, 3, 4]];

pub(super) fn unary(t: &mut Table) {
    use Kind::{Elementwise as E, Exact as X};
    use Out::{Bool as B, Float as Fl, Same as S};
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let ops = [
        un("exp", Tensor::exp, f64::exp, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("log", Tensor::log, f64::ln, &ALL_DTYPES, Dom::Cont(0.05, 20.0), Fl, E),
        un("sin", Tensor::sin, f64::sin, &ALL_DTYPES, Dom::Cont(-6.0, 6.0), Fl, E),
        un("cos", Tensor::cos, f64::cos, &ALL_DTYPES, Dom::Cont(-6.0, 6.0), Fl, E),
        un("tanh", Tensor::tanh, f64::tanh, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("sqrt", Tensor::sqrt, f64::sqrt, &ALL_DTYPES, Dom::Cont(0.0, 50.0), Fl, E),
        un("recip", Tensor::recip, |x| 1.0 / x, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("rsqrt", Tensor::rsqrt, |x| 1.0 / x.sqrt(), &ALL_DTYPES, Dom::Cont(0.05, 50.0), Fl, E),
        un("sigmoid", Tensor::sigmoid, sigmoid, &ALL_DTYPES, Dom::Cont(-8.0, 8.0), Fl, E),
        un("neg", Tensor::neg, |x| -x, &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("abs", Tensor::abs, f64::abs, &ALL_DTYPES, Dom::Cont(-100.0, 100.0), S, X),
        un("relu", Tensor::relu, |x| x.max(0.0), &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("square", Tensor::square, |x| x * x, &ALL_DTYPES, Dom::Cont(-100.0, 100.0), Out::Square, E),
        un("logical_not", Tensor::logical_not, |x| (x == 0.0) as u8 as f64, &ALL_DTYPES, Dom::Grid(-2.0, 2.0), B, X),
        un("operator -x", |x| -x, |x| -x, &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("floor", Tensor::floor, f64::floor, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("ceil", Tensor::ceil, f64::ceil, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("round", Tensor::round, f64::round_ties_even, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("trunc", Tensor::trunc, f64::trunc, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("log1p", Tensor::log1p, f64::ln_1p, &ALL_DTYPES, Dom::Cont(-0.9, 20.0), Fl, E),
        un("expm1", Tensor::expm1, f64::exp_m1, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un(
            "sign",
            Tensor::sign,
            |x| (x > 0.0) as u8 as f64 - (x < 0.0) as u8 as f64,
            &ALL_DTYPES,
            Dom::Grid(-2.0, 2.0),
            S,
            X,
        ),
    ];
    for u in ops {
        for &d in u.dtypes {
            for shape in UNARY_SHAPES {
                let x = In::random(d, shape, seed(&[&u.op, &d, &shape]), u.dom);
                let od = u.out.of(d);
                // Int and bool inputs are small integers, exact in f32, so the reference needs no conversion.
                let want = x.nd().map(u.r);
                let f = u.f;
                t.check(u.op, "", vec![x], move |a| f(&a[0]), Want::nd(od, &want, u.kind));
            }
        }
    }

    // IEEE special values, bit-exact (the sign of zero included).
    let specials: [(&str, UnOp, &[f64], &[f64]); 21] = [
        ("exp", Tensor::exp, &[-INF, INF, NAN, 0.0, -0.0], &[0.0, INF, NAN, 1.0, 1.0]),
        ("log", Tensor::log, &[0.0, -0.0, -1.0, INF, 1.0], &[-INF, -INF, NAN, INF, 0.0]),
        ("sin", Tensor::sin, &[0.0, -0.0, INF, NAN], &[0.0, -0.0, NAN, NAN]),
        ("cos", Tensor::cos, &[0.0, INF, NAN], &[1.0, NAN, NAN]),
        ("tanh", Tensor::tanh, &[INF, -INF, NAN, 0.0, -0.0], &[1.0, -1.0, NAN, 0.0, -0.0]),
        ("sqrt", Tensor::sqrt, &[-1.0, -0.0, INF, 4.0, 0.0], &[NAN, -0.0, INF, 2.0, 0.0]),
        ("recip", Tensor::recip, &[0.0, -0.0, INF, -INF, 4.0], &[INF, -INF, 0.0, -0.0, 0.25]),
        ("rsqrt", Tensor::rsqrt, &[0.0, INF, 4.0, -1.0], &[INF, 0.0, 0.5, NAN]),
        ("sigmoid", Tensor::sigmoid, &[INF, -INF, NAN, 0.0], &[1.0, 0.0, NAN, 0.5]),
        ("neg", Tensor::neg, &[0.0, -0.0, INF, NAN], &[-0.0, 0.0, -INF, NAN]),
        ("abs", Tensor::abs, &[-0.0, -INF, NAN, -2.5], &[0.0, INF, NAN, 2.5]),
        ("relu", Tensor::relu, &[-INF, INF, NAN, -3.0, 2.5], &[0.0, INF, NAN, 0.0, 2.5]),
        ("square", Tensor::square, &[INF, -INF, NAN, -0.0], &[INF, INF, NAN, 0.0]),
        ("logical_not", Tensor::logical_not, &[NAN, 0.0, -0.0, INF], &[0.0, 1.0, 1.0, 0.0]),
        ("floor", Tensor::floor, &[-0.0, 0.5, -0.5, INF, NAN, -2.5], &[-0.0, 0.0, -1.0, INF, NAN, -3.0]),
        ("ceil", Tensor::ceil, &[-0.5, 0.5, -0.0, -INF, NAN, 2.5], &[-0.0, 1.0, -0.0, -INF, NAN, 3.0]),
        ("round", Tensor::round, &[0.5, 1.5, 2.5, -0.5, -2.5, NAN, INF], &[0.0, 2.0, 2.0, -0.0, -2.0, NAN, INF]),
        ("trunc", Tensor::trunc, &[-0.7, 2.9, -INF, NAN, -0.0], &[-0.0, 2.0, -INF, NAN, -0.0]),
        ("log1p", Tensor::log1p, &[-1.0, -0.0, INF, -2.0, NAN, 0.0], &[-INF, -0.0, INF, NAN, NAN, 0.0]),
        ("expm1", Tensor::expm1, &[-0.0, -INF, INF, NAN, 0.0], &[-0.0, -1.0, INF, NAN, 0.0]),
        // PyTorch's sign: 0 for NaN and for -0.0 (a +0.0).
        ("sign", Tensor::sign, &[-0.0, NAN, -INF, INF, 0.0, -2.5], &[0.0, 0.0, -1.0, 1.0, 0.0, -1.0]),
    ];
    for (op, f, x, want) in specials {
        for d in FLOATS {
            let od = if op == "logical_not" { Bool } else { d };
            let n = x.len();
            t.check(
                op,
                "IEEE special values",
                vec![In::new(d, &[n], x)],
                move |a| f(&a[0]),
                Want::new(od, &[n], want, Kind::Exact),
            );
        }
    }
    // log1p and expm1 near 0, where log(1 + x) and exp(x) - 1 keep no digit of x: relative accuracy.
    for d in [F32, F64] {
        let x = [1e-10f64, -1e-7, 3e-5, -2e-3, 0.1, -0.12, 0.13];
        for (op, f, r) in
            [("log1p", Tensor::log1p as UnOp, f64::ln_1p as fn(f64) -> f64), ("expm1", Tensor::expm1, f64::exp_m1)]
        {
            let want: Vec<f64> = x.iter().map(|&v| r(v)).collect();
            t.check(
                op,
                "near 0, relative",
                vec![In::new(d, &[7], &x)],
                move |a| f(&a[0]),
                Want::new(d, &[7], &want, Kind::Relative),
            );
        }
    }
    // Sigmoid far in the tails: exp(-x) overflows (or is 0) without making the result NaN.
    for d in FLOATS {
        let x = [-1000.0f64, -100.0, 100.0, 1000.0];
        let want: Vec<f64> = x.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect();
        t.check(
            "sigmoid",
            "tails",
            vec![In::new(d, &[4], &x)],
            |a| a[0].sigmoid(),
            Want::new(d, &[4], &want, Kind::Elementwise),
        );
    }
    // Integer wrapping at the type's bounds (PyTorch wraps too).
    t.check(
        "neg",
        "u8 wraps",
        vec![v(U8, &[0.0, 1.0, 255.0])],
        |a| a[0].neg(),
        Want::new(U8, &[3], &[0.0, 255.0, 1.0], Kind::Exact),
    );
    let (mn, mx) = (i32::MIN as f64, i32::MAX as f64);
    t.check(
        "neg",
        "i32 bounds wrap",
        vec![v(I32, &[mn, mx])],
        |a| a[0].neg(),
        Want::new(I32, &[2], &[mn, -mx], Kind::Exact),
    );
    t.check(
        "abs",
        "i32::MIN wraps",
        vec![v(I32, &[mn, -mx])],
        |a| a[0].abs(),
        Want::new(I32, &[2], &[mn, mx], Kind::Exact),
    );
    let i64s = In::buf(&[3], HostBuffer::I64(vec![i64::MIN, i64::MAX, -5].into()));
    t.check(
        "abs",
        "i64 bounds",
        vec![i64s.clone()],
        |a| a[0].abs(),
        Want::buf(&[3], HostBuffer::I64(vec![i64::MIN, i64::MAX, 5].into()), Kind::Exact),
    );
    t.check(
        "neg",
        "i64 bounds",
        vec![i64s],
        |a| a[0].neg(),
        Want::buf(&[3], HostBuffer::I64(vec![i64::MIN, -i64::MAX, 5].into()), Kind::Exact),
    );
    t.check(
        "square",
        "u8 wraps",
        vec![v(U8, &[16.0, 255.0, 3.0])],
        |a| a[0].square(),
        Want::new(U8, &[3], &[0.0, 1.0, 9.0], Kind::Exact),
    );
}
