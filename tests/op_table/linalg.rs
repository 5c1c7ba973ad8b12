//! The op table's matmul, softmax and log_softmax.

use super::*;

/// torch.matmul's rank rules on the reference: 1-D operands become a row (left) or column (right) and lose that
/// dim again.
pub(super) fn matmul_ref(a: &Nd, b: &Nd) -> Nd {
    let a2 = if a.shape.len() == 1 { a.reshape(&[1, a.shape[0]]) } else { a.clone() };
    let b2 = if b.shape.len() == 1 { b.reshape(&[b.shape[0], 1]) } else { b.clone() };
    let out = a2.matmul(&b2);
    let mut shape = out.shape.clone();
    let r = shape.len();
    match (a.shape.len(), b.shape.len()) {
        (1, 1) => shape.clear(),
        (1, _) => {
            shape.remove(r - 2);
        }
        (_, 1) => {
            shape.remove(r - 1);
        }
        _ => {}
    }
    out.reshape(&shape)
}

pub(super) fn softmax_ref(x: &Nd, dim: isize, log: bool) -> Nd {
    if x.shape.is_empty() {
        return Nd::scalar(if log { 0.0 } else { 1.0 });
    }
    let d = resolve(dim, x.shape.len());
    Nd::from_fn(&x.shape, |i| {
        let row: Vec<f64> = (0..x.shape[d])
            .map(|j| {
                let mut k = i.to_vec();
                k[d] = j;
                x.at(&k)
            })
            .collect();
        let m = row.iter().fold(-INF, |a, &b| if a.is_nan() || b.is_nan() { NAN } else { a.max(b) });
        let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
        let v = x.at(i);
        if log { v - m - s.ln() } else { (v - m).exp() / s }
    })
}

pub(super) fn linalg(t: &mut Table) {
    let shapes: [(&[usize], &[usize]); 13] = [
        (&[4], &[4]),
        (&[3], &[3, 2]),
        (&[2, 3], &[3]),
        (&[2, 3], &[3, 4]),
        (&[1, 1], &[1, 1]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[2, 4, 3]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[2, 0], &[0, 3]),
        (&[0, 3], &[3, 2]),
        (&[3, 8], &[8, 3]),
        (&[2, 2, 3], &[2, 3, 2]),
    ];
    for d in [U8, U32, I32, I64, F16, F32, F64] {
        let dom = if d.is_float() { Dom::Cont(-2.0, 2.0) } else { Dom::Cont(-5.0, 20.0) };
        for (sa, sb) in shapes {
            let a = In::random(d, sa, seed(&[&"matmul a", &d, &sa, &sb]), dom);
            let b = In::random(d, sb, seed(&[&"matmul b", &d, &sa, &sb]), dom);
            let want = matmul_ref(&a.nd(), &b.nd());
            t.check("matmul", "", vec![a, b], |x| x[0].matmul(&x[1]), Want::nd(d, &want, Kind::Accumulate));
        }
    }
    t.check(
        "matmul",
        "u8 wraps",
        vec![In::new(U8, &[1, 2], &[16.0, 1.0]), In::new(U8, &[2, 1], &[16.0, 3.0])],
        |x| x[0].matmul(&x[1]),
        Want::new(U8, &[1, 1], &[3.0], Kind::Exact),
    );

    let cases: [(&[usize], isize); 10] = [
        (&[], 0),
        (&[], -1),
        (&[5], 0),
        (&[2, 3, 4], 0),
        (&[2, 3, 4], 1),
        (&[2, 3, 4], -1),
        (&[3, 64], -1),
        (&[0, 3], 1),
        (&[0, 3], 0),
        (&[2, 0], -1),
    ];
    for d in FLOATS {
        for (shape, dim) in cases {
            for (op, log) in [("softmax", false), ("log_softmax", true)] {
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dim]), Dom::Cont(-4.0, 4.0));
                let want = softmax_ref(&x.nd(), dim, log);
                t.check(
                    op,
                    &format!("dim {dim}"),
                    vec![x],
                    move |a| if log { a[0].log_softmax(dim) } else { a[0].softmax(dim) },
                    Want::nd(d, &want, Kind::Accumulate),
                );
            }
        }
        // Stable for large inputs (exp overflows f32 past 88.7); -inf entries are masked out; NaN poisons its row
        // only. bf16 holds consecutive integers only up to 256.
        let big = if d == BF16 { 128.0 } else { 1000.0 };
        let x = In::new(d, &[3, 3], &[big, big + 1.0, big + 2.0, -INF, 0.0, -INF, NAN, 1.0, 2.0]);
        let e = [(-2f64).exp(), (-1f64).exp(), 1.0];
        let s: f64 = e.iter().sum();
        let soft = [e[0] / s, e[1] / s, e[2] / s, 0.0, 1.0, 0.0, NAN, NAN, NAN];
        let logs = [-2.0 - s.ln(), -1.0 - s.ln(), -s.ln(), -INF, 0.0, -INF, NAN, NAN, NAN];
        t.check(
            "softmax",
            "large, -inf, NaN rows",
            vec![x.clone()],
            |a| a[0].softmax(-1),
            Want::new(d, &[3, 3], &soft, Kind::Accumulate),
        );
        t.check(
            "log_softmax",
            "large, -inf, NaN rows",
            vec![x],
            |a| a[0].log_softmax(1),
            Want::new(d, &[3, 3], &logs, Kind::Accumulate),
        );
    }
}
