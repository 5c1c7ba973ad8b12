//! The op table's binary elementwise ops (same dtype on both sides, broadcasting), and u32's.

use super::*;

pub(super) struct Bin {
    op: &'static str,
    f: fn(&Tensor, &Tensor) -> Tensor,
    /// Reference on the promoted values; the dtype is the promoted (compute) dtype.
    r: fn(f64, f64, DType) -> f64,
    dtypes: &'static [DType],
    doms: fn(DType) -> (Dom, Dom),
    out: Out,
    kind: Kind,
}

pub(super) fn bin(
    op: &'static str,
    f: fn(&Tensor, &Tensor) -> Tensor,
    r: fn(f64, f64, DType) -> f64,
    dtypes: &'static [DType],
    doms: fn(DType) -> (Dom, Dom),
    out: Out,
    kind: Kind,
) -> Bin {
    Bin { op, f, r, dtypes, doms, out, kind }
}

pub(super) const BINARY_SHAPES: [(&[usize], &[usize]); 7] = [
    (&[2, 3], &[2, 3]),
    (&[2, 1, 3], &[4, 1]),
    (&[], &[3]),
    (&[4], &[]),
    (&[], &[]),
    (&[0, 3], &[3]),
    (&[2, 3, 4], &[3, 1]),
];

pub(super) fn int_pow(x: f64, y: f64) -> f64 {
    let (mut acc, x) = (1i64, x as i64);
    for _ in 0..y as i64 {
        acc = acc.wrapping_mul(x);
    }
    acc as f64
}

pub(super) fn cmp(b: bool) -> f64 {
    b as u8 as f64
}

pub(super) fn wide(_: DType) -> (Dom, Dom) {
    (Dom::Cont(-100.0, 100.0), Dom::Cont(-100.0, 100.0))
}

pub(super) fn grid(_: DType) -> (Dom, Dom) {
    (Dom::Grid(-3.0, 3.0), Dom::Grid(-3.0, 3.0))
}

pub(super) fn truth(_: DType) -> (Dom, Dom) {
    (Dom::Grid(-1.0, 1.0), Dom::Grid(-1.0, 1.0))
}

/// Zeros on the right, so x/0 = +-inf and 0/0 = NaN are covered.
pub(super) fn divisor(_: DType) -> (Dom, Dom) {
    (Dom::Cont(-100.0, 100.0), Dom::Grid(-4.0, 4.0))
}

pub(super) fn pow_doms(d: DType) -> (Dom, Dom) {
    if d.is_float() {
        (Dom::Cont(0.1, 4.0), Dom::Cont(-2.0, 3.0))
    } else {
        (Dom::Cont(-4.0, 6.0), Dom::Cont(0.0, 5.0)) // u8 6^5 wraps
    }
}

pub(super) fn pow_ref(x: f64, y: f64, d: DType) -> f64 {
    if d.is_float() { x.powf(y) } else { int_pow(x, y) }
}

pub(super) fn binary(t: &mut Table) {
    use Kind::{Elementwise as E, Exact as X};
    let ops = [
        bin("add", |a, b| a.add(b), |x, y, _| x + y, &ALL_DTYPES, wide, Out::Same, E),
        bin("sub", |a, b| a.sub(b), |x, y, _| x - y, &NON_BOOL, wide, Out::Same, E),
        bin("mul", |a, b| a.mul(b), |x, y, _| x * y, &ALL_DTYPES, wide, Out::Same, E),
        bin("div", |a, b| a.div(b), |x, y, _| x / y, &ALL_DTYPES, divisor, Out::Float, E),
        bin("maximum", |a, b| a.maximum(b), |x, y, _| x.max(y), &ALL_DTYPES, grid, Out::Same, X),
        bin("minimum", |a, b| a.minimum(b), |x, y, _| x.min(y), &ALL_DTYPES, grid, Out::Same, X),
        bin("pow", |a, b| a.pow(b), pow_ref, &NON_BOOL, pow_doms, Out::Same, E),
        bin("lt", |a, b| a.lt(b), |x, y, _| cmp(x < y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("le", |a, b| a.le(b), |x, y, _| cmp(x <= y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("gt", |a, b| a.gt(b), |x, y, _| cmp(x > y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("ge", |a, b| a.ge(b), |x, y, _| cmp(x >= y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("eq", |a, b| a.eq(b), |x, y, _| cmp(x == y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("ne", |a, b| a.ne(b), |x, y, _| cmp(x != y), &ALL_DTYPES, grid, Out::Bool, X),
        bin(
            "logical_and",
            |a, b| a.logical_and(b),
            |x, y, _| cmp(x != 0.0 && y != 0.0),
            &ALL_DTYPES,
            truth,
            Out::Bool,
            X,
        ),
        bin(
            "logical_or",
            |a, b| a.logical_or(b),
            |x, y, _| cmp(x != 0.0 || y != 0.0),
            &ALL_DTYPES,
            truth,
            Out::Bool,
            X,
        ),
        bin("clamp_min", |a, b| a.clamp_min(b), |x, y, _| x.max(y), &NON_BOOL, grid, Out::Same, X),
        bin("clamp_max", |a, b| a.clamp_max(b), |x, y, _| x.min(y), &NON_BOOL, grid, Out::Same, X),
        bin("operator +", |a, b| a + b, |x, y, _| x + y, &ALL_DTYPES, wide, Out::Same, E),
        bin("operator -", |a, b| a - b, |x, y, _| x - y, &NON_BOOL, wide, Out::Same, E),
        bin("operator *", |a, b| a * b, |x, y, _| x * y, &ALL_DTYPES, wide, Out::Same, E),
        bin("operator /", |a, b| a / b, |x, y, _| x / y, &ALL_DTYPES, divisor, Out::Float, E),
    ];
    for b in ops {
        for &d in b.dtypes {
            let (da, db) = (b.doms)(d);
            for (sa, sb) in BINARY_SHAPES {
                let x = In::random(d, sa, seed(&[&b.op, &d, &sa, &0]), da);
                let y = In::random(d, sb, seed(&[&b.op, &d, &sb, &1]), db);
                let cd = if b.op.contains('/') || b.op == "div" { float_of(d) } else { d };
                let r = b.r;
                let want = x.nd().zip(&y.nd(), |p, q| r(p, q, cd));
                let f = b.f;
                t.check(b.op, "", vec![x, y], move |a| f(&a[0], &a[1]), Want::nd(b.out.of(d), &want, b.kind));
            }
        }
    }

    // NaN and infinities.
    for d in FLOATS {
        let a = v(d, &[1.0, NAN, 3.0, NAN, -INF]);
        let b = v(d, &[NAN, 2.0, 1.0, NAN, 5.0]);
        // torch.maximum / torch.minimum propagate NaN from either side.
        t.check(
            "maximum",
            "NaN propagates",
            vec![a.clone(), b.clone()],
            |x| x[0].maximum(&x[1]),
            Want::new(d, &[5], &[NAN, NAN, 3.0, NAN, 5.0], Kind::Exact),
        );
        t.check(
            "minimum",
            "NaN propagates",
            vec![a.clone(), b.clone()],
            |x| x[0].minimum(&x[1]),
            Want::new(d, &[5], &[NAN, NAN, 1.0, NAN, -INF], Kind::Exact),
        );
        let cmps: [(&str, BinOp, [f64; 5]); 6] = [
            ("lt", |x, y| x.lt(y), [0.0, 0.0, 0.0, 0.0, 1.0]),
            ("le", |x, y| x.le(y), [0.0, 0.0, 0.0, 0.0, 1.0]),
            ("gt", |x, y| x.gt(y), [0.0, 0.0, 1.0, 0.0, 0.0]),
            ("ge", |x, y| x.ge(y), [0.0, 0.0, 1.0, 0.0, 0.0]),
            ("eq", |x, y| x.eq(y), [0.0, 0.0, 0.0, 0.0, 0.0]),
            ("ne", |x, y| x.ne(y), [1.0, 1.0, 1.0, 1.0, 1.0]),
        ];
        for (op, f, want) in cmps {
            t.check(
                op,
                "NaN compares false (ne true)",
                vec![a.clone(), b.clone()],
                move |x| f(&x[0], &x[1]),
                Want::new(Bool, &[5], &want, Kind::Exact),
            );
        }
        let p = v(d, &[INF, 0.0, INF, -0.0]);
        let q = v(d, &[-INF, INF, INF, 0.0]);
        t.check(
            "add",
            "inf + -inf is NaN",
            vec![p.clone(), q.clone()],
            |x| &x[0] + &x[1],
            Want::new(d, &[4], &[NAN, INF, INF, 0.0], Kind::Exact),
        );
        t.check(
            "mul",
            "0 * inf is NaN",
            vec![p.clone(), q.clone()],
            |x| &x[0] * &x[1],
            Want::new(d, &[4], &[-INF, NAN, INF, -0.0], Kind::Exact),
        );
        t.check(
            "eq",
            "-0.0 == 0.0, inf == inf",
            vec![p, q],
            |x| x[0].eq(&x[1]),
            Want::new(Bool, &[4], &[0.0, 0.0, 1.0, 1.0], Kind::Exact),
        );
        t.check(
            "clamp_min",
            "NaN stays NaN",
            vec![v(d, &[NAN, -5.0, 5.0])],
            |x| x[0].clamp_min(0),
            Want::new(d, &[3], &[NAN, 0.0, 5.0], Kind::Exact),
        );
        t.check(
            "clamp_max",
            "NaN stays NaN",
            vec![v(d, &[NAN, -5.0, 5.0])],
            |x| x[0].clamp_max(0),
            Want::new(d, &[3], &[NAN, -5.0, 0.0], Kind::Exact),
        );
    }

    // Integer wrapping (two's complement, as PyTorch).
    let (mn, mx) = (i32::MIN as f64, i32::MAX as f64);
    t.check(
        "add",
        "i32 wraps",
        vec![v(I32, &[mx, mn]), v(I32, &[1.0, -1.0])],
        |x| x[0].add(&x[1]),
        Want::new(I32, &[2], &[mn, mx], Kind::Exact),
    );
    t.check(
        "mul",
        "i32 wraps",
        vec![v(I32, &[65536.0, 65537.0]), v(I32, &[65536.0, 65537.0])],
        |x| x[0].mul(&x[1]),
        Want::new(I32, &[2], &[0.0, 131073.0], Kind::Exact),
    );
    t.check(
        "add",
        "i64 wraps",
        vec![
            In::buf(&[2], HostBuffer::I64(vec![i64::MAX, i64::MIN].into())),
            In::buf(&[2], HostBuffer::I64(vec![1, -1].into())),
        ],
        |x| x[0].add(&x[1]),
        Want::buf(&[2], HostBuffer::I64(vec![i64::MIN, i64::MAX].into()), Kind::Exact),
    );
    t.check(
        "sub",
        "u8 wraps",
        vec![v(U8, &[3.0, 250.0, 0.0]), v(U8, &[5.0, 255.0, 1.0])],
        |x| x[0].sub(&x[1]),
        Want::new(U8, &[3], &[254.0, 251.0, 255.0], Kind::Exact),
    );
    // True division of ints: f32, with x/0 = +-inf and 0/0 = NaN.
    for d in [U8, U32, I32, I64] {
        let (a, w): (&[f64], &[f64]) = if d.is_unsigned() {
            (&[7.0, 255.0, 0.0, 1.0], &[3.5, 127.5, NAN, INF])
        } else {
            (&[7.0, -7.0, 0.0, 1.0], &[3.5, -3.5, NAN, INF])
        };
        t.check(
            "div",
            "int / int -> f32",
            vec![In::new(d, &[4], a), v(d, &[2.0, 2.0, 0.0, 0.0])],
            |x| x[0].div(&x[1]),
            Want::new(F32, &[4], w, Kind::Exact),
        );
    }
    // Integer powers; a negative exponent gives 1/x truncated (kiln-defined: PyTorch raises).
    t.check(
        "pow",
        "i64 exact",
        vec![v(I64, &[2.0, -3.0, 0.0, 5.0, 3.0, -2.0, 10.0]), v(I64, &[10.0, 3.0, 0.0, 0.0, 1.0, 4.0, 15.0])],
        |x| x[0].pow(&x[1]),
        Want::new(I64, &[7], &[1024.0, -27.0, 1.0, 1.0, 3.0, 16.0, 1e15], Kind::Exact),
    );
    t.check(
        "pow",
        "int ** negative int (kiln-defined)",
        vec![v(I32, &[1.0, -1.0, 2.0, -1.0]), v(I32, &[-2.0, -3.0, -1.0, -2.0])],
        |x| x[0].pow(&x[1]),
        Want::new(I32, &[4], &[1.0, -1.0, 0.0, 1.0], Kind::Exact),
    );
    for d in FLOATS {
        t.check(
            "pow",
            "float special cases",
            vec![v(d, &[-8.0, 0.0, 0.0, 2.0, -2.0, INF]), v(d, &[1.0 / 3.0, -1.0, 0.0, 0.5, 2.0, -1.0])],
            |x| x[0].pow(&x[1]),
            Want::new(d, &[6], &[NAN, INF, 1.0, 2f64.sqrt(), 4.0, 0.0], Kind::Elementwise),
        );
    }
    // powf: a float exponent; ints and bool are promoted to f32.
    for d in ALL_DTYPES {
        let x = In::random(d, &[2, 3], seed(&[&"powf", &d]), Dom::Cont(0.0, 9.0));
        for e in [0.5, 2.0, -1.5] {
            let want = x.nd().map(|v| v.powf(e));
            t.check(
                "powf",
                &format!("** {e}"),
                vec![x.clone()],
                move |a| a[0].powf(e),
                Want::nd(float_of(d), &want, Kind::Elementwise),
            );
        }
    }

    // clamp: maximum then minimum; NaN stays, min > max gives max everywhere (as torch.clamp).
    for d in NON_BOOL {
        for shape in [&[][..], &[7], &[2, 0], &[2, 3]] {
            let x = In::random(d, shape, seed(&[&"clamp", &d, &shape]), Dom::Grid(-3.0, 3.0));
            let want = x.nd().map(|v| v.clamp(1.0, 2.0));
            t.check("clamp", "to [1, 2]", vec![x], |a| a[0].clamp(1, 2), Want::nd(d, &want, Kind::Exact));
        }
        let x = In::random(d, &[2, 3], seed(&[&"clamp t", &d]), Dom::Grid(-3.0, 3.0));
        let lo = In::random(d, &[3], seed(&[&"clamp lo", &d]), Dom::Grid(-1.0, 0.0));
        let hi = In::random(d, &[2, 1], seed(&[&"clamp hi", &d]), Dom::Grid(1.0, 2.0));
        let want = x.nd().zip(&lo.nd(), f64::max).zip(&hi.nd(), f64::min);
        t.check(
            "clamp",
            "broadcast tensor bounds",
            vec![x, lo, hi],
            |a| a[0].clamp(&a[1], &a[2]),
            Want::nd(d, &want, Kind::Exact),
        );
        t.check(
            "clamp",
            "min > max gives max",
            vec![v(d, &[0.0, 5.0, 3.0])],
            |a| a[0].clamp(2, 1),
            Want::new(d, &[3], &[1.0; 3], Kind::Exact),
        );
    }
    for d in FLOATS {
        t.check(
            "clamp",
            "NaN stays NaN",
            vec![v(d, &[NAN, 5.0, -5.0])],
            |a| a[0].clamp(-1.0, 1.0),
            Want::new(d, &[3], &[NAN, 1.0, -1.0], Kind::Exact),
        );
    }

    // where_: the condition selects; the other branch's NaN never leaks.
    for d in ALL_DTYPES {
        for (sc, sa, sb) in [
            (&[2, 3][..], &[2, 3][..], &[2, 3][..]),
            (&[3, 1], &[1, 4], &[]),
            (&[], &[2], &[2]),
            (&[0, 1], &[3], &[1]),
            (&[4], &[2, 1], &[4]),
        ] {
            let c = In::random(Bool, sc, seed(&[&"where c", &d, &sc]), Dom::Grid(0.0, 1.0));
            let a = In::random(d, sa, seed(&[&"where a", &d, &sa]), any_dom(d));
            let b = In::random(d, sb, seed(&[&"where b", &d, &sb]), any_dom(d));
            let shape = broadcast_shape(&broadcast_shape(sc, sa).unwrap(), sb).unwrap();
            let (cn, an, bn) = (c.nd(), a.nd(), b.nd());
            let want =
                Nd::from_fn(
                    &shape,
                    |i| {
                        if cn.at_broadcast(i) != 0.0 { an.at_broadcast(i) } else { bn.at_broadcast(i) }
                    },
                );
            t.check("where_", "", vec![c, a, b], |x| x[0].where_(&x[1], &x[2]), Want::nd(d, &want, Kind::Exact));
        }
    }
    for d in FLOATS {
        t.check(
            "where_",
            "NaN in the unselected branch",
            vec![v(Bool, &[1.0, 0.0, 1.0]), v(d, &[1.0, NAN, INF]), v(d, &[NAN, 2.0, NAN])],
            |x| x[0].where_(&x[1], &x[2]),
            Want::new(d, &[3], &[1.0, 2.0, INF], Kind::Exact),
        );
    }
}
