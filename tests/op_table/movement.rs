//! The op table's movement ops (views, copies, padding, indexing).

use super::*;

pub(super) type Mv = Box<dyn Fn(&Tensor) -> Tensor>;
pub(super) type MvRef = Box<dyn Fn(&Nd) -> Nd>;
/// (op, input shape, description, kiln op, reference).
pub(super) type MvCase = (&'static str, Vec<usize>, String, Mv, MvRef);

/// The border modes against what PyTorch 2.15 printed (`F.pad(arange(6.).reshape(1, 2, 3), ..., mode=...)`).
pub(super) fn pad_modes_as_pytorch(t: &mut Table) {
    use kiln::PadMode::{Circular, Reflect, Replicate};
    let x = In::new(F32, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    /// (what, the last dim's pad, mode, result shape, values)
    type PadRow = (&'static str, (usize, usize), kiln::PadMode, &'static [usize], &'static [f64]);
    let cases: [PadRow; 3] = [
        ("reflect (2, 1)", (2, 1), Reflect, &[2, 6], &[2.0, 1.0, 0.0, 1.0, 2.0, 1.0, 5.0, 4.0, 3.0, 4.0, 5.0, 4.0]),
        (
            "circular (3, 2)",
            (3, 2),
            Circular,
            &[2, 8],
            &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0],
        ),
        ("replicate (1, 2)", (1, 2), Replicate, &[2, 6], &[0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 5.0]),
    ];
    for (what, pad, mode, shape, want) in cases {
        t.check(
            "pad_with",
            &format!("{what}, as PyTorch printed"),
            vec![x.clone()],
            move |a| a[0].pad_with(&[pad], mode),
            Want::new(F32, shape, want, Kind::Exact),
        );
    }
}

pub(super) fn movement(t: &mut Table) {
    pad_modes_as_pytorch(t);
    for d in ALL_DTYPES {
        let mut cases: Vec<MvCase> = Vec::new();
        let mut add = |op: &'static str, shape: &[usize], what: String, f: Mv, r: MvRef| {
            cases.push((op, shape.to_vec(), what, f, r));
        };
        for (shape, spec, out) in [
            (&[2, 3, 4][..], &[4, 6][..], &[4, 6][..]),
            (&[2, 3, 4], &[-1, 4], &[6, 4]),
            (&[2, 3, 4], &[24], &[24]),
            (&[2, 3, 4], &[2, -1, 2], &[2, 6, 2]),
            (&[], &[1], &[1]),
            (&[], &[1, 1], &[1, 1]),
            (&[1], &[], &[]),
            (&[0, 3], &[3, 0], &[3, 0]),
            (&[0, 3], &[0], &[0]),
        ] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "reshape",
                shape,
                format!("to {spec:?}"),
                Box::new(move |x| x.reshape(sp.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for (shape, spec, out) in [(&[2, 3][..], &[3, 2][..], &[3, 2][..]), (&[6], &[-1, 2], &[3, 2])] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "view",
                shape,
                format!("as {spec:?}"),
                Box::new(move |x| x.view(sp.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for shape in [&[2, 3, 4][..], &[], &[0, 3]] {
            let n: usize = shape.iter().product();
            add("flatten", shape, String::new(), Box::new(Tensor::flatten), Box::new(move |x| x.reshape(&[n])));
        }
        for (shape, perm) in [
            (&[2, 3, 4][..], &[2, 0, 1][..]),
            (&[2, 3, 4], &[-1, 0, -2]),
            (&[2, 3], &[1, 0]),
            (&[2, 3], &[0, 1]),
            (&[], &[]),
            (&[2, 0, 3], &[2, 1, 0]),
        ] {
            let p = perm.to_vec();
            let rp: Vec<usize> = perm.iter().map(|&q| resolve(q, shape.len())).collect();
            add(
                "permute",
                shape,
                format!("{perm:?}"),
                Box::new(move |x| x.permute(p.clone())),
                Box::new(move |x| x.permute(&rp)),
            );
        }
        for (shape, a, b) in
            [(&[2, 3, 4][..], 0, 2), (&[2, 3, 4], -1, -2), (&[2, 3], 1, 1), (&[3], 0, -1), (&[], 0, -1)]
        {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            if !shape.is_empty() {
                perm.swap(resolve(a, shape.len()), resolve(b, shape.len()));
            }
            add(
                "transpose",
                shape,
                format!("({a}, {b})"),
                Box::new(move |x| x.transpose(a, b)),
                Box::new(move |x| x.permute(&perm)),
            );
        }
        for shape in [&[2, 3][..], &[5], &[]] {
            let perm: Vec<usize> = (0..shape.len()).rev().collect();
            add("t", shape, String::new(), Box::new(Tensor::t), Box::new(move |x| x.permute(&perm)));
        }
        for (shape, spec, out) in [
            (&[3, 1][..], &[2, 3, 4][..], &[2, 3, 4][..]),
            (&[3, 1], &[-1, 4], &[3, 4]),
            (&[1], &[0], &[0]),
            (&[], &[2, 2], &[2, 2]),
            (&[2, 1, 3], &[2, 5, 3], &[2, 5, 3]),
            (&[1, 3], &[2, -1], &[2, 3]),
            (&[2, 3], &[2, 3], &[2, 3]),
        ] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "expand",
                shape,
                format!("to {spec:?}"),
                Box::new(move |x| x.expand(sp.clone())),
                Box::new(move |x| x.broadcast_to(&o)),
            );
        }
        for (shape, out) in [(&[3][..], &[2, 3][..]), (&[], &[4]), (&[2, 1], &[2, 0]), (&[1, 1], &[3, 1, 2])] {
            let o = out.to_vec();
            let o2 = o.clone();
            add(
                "broadcast_to",
                shape,
                format!("{out:?}"),
                Box::new(move |x| x.broadcast_to(o.clone())),
                Box::new(move |x| x.broadcast_to(&o2)),
            );
        }
        for (shape, dim) in
            [(&[2, 3][..], 0), (&[2, 3], 2), (&[2, 3], -1), (&[2, 3], -3), (&[], 0), (&[], -1), (&[0], 1)]
        {
            let mut out = shape.to_vec();
            out.insert(resolve(dim, shape.len() + 1), 1);
            add(
                "unsqueeze",
                shape,
                format!("{dim}"),
                Box::new(move |x| x.unsqueeze(dim)),
                Box::new(move |x| x.reshape(&out)),
            );
        }
        for (shape, dims, out) in [
            (&[1, 3, 1][..], &[0][..], &[3, 1][..]),
            (&[1, 3, 1], &[-1], &[1, 3]),
            (&[1, 3, 1], &[0, 2], &[3]),
            (&[1, 3, 1], &[1], &[1, 3, 1]),
            (&[], &[0], &[]),
            (&[2, 1, 0], &[1], &[2, 0]),
        ] {
            let (dv, o) = (dims.to_vec(), out.to_vec());
            add(
                "squeeze",
                shape,
                format!("{dims:?}"),
                Box::new(move |x| x.squeeze(dv.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for (shape, out) in
            [(&[1, 3, 1, 1][..], &[3][..]), (&[1], &[]), (&[], &[]), (&[2, 3], &[2, 3]), (&[1, 0, 1], &[0])]
        {
            let o = out.to_vec();
            add("squeeze_all", shape, String::new(), Box::new(Tensor::squeeze_all), Box::new(move |x| x.reshape(&o)));
        }
        for (shape, dim, start, len) in
            [(&[4, 5][..], 1, 1, 3), (&[4, 5], -1, 0, 2), (&[4, 5], 0, 4, 0), (&[4, 5], 0, 0, 4), (&[6], 0, 2, 3)]
        {
            let dd = resolve(dim, shape.len());
            add(
                "narrow",
                shape,
                format!("dim {dim} start {start} len {len}"),
                Box::new(move |x| x.narrow(dim, start, len)),
                Box::new(move |x| x.slice(dd, start, start + len, 1)),
            );
        }
        for (shape, dim, start, end, step) in [
            (&[10][..], 0, 1, 8, 3),
            (&[10], 0, -3, 100, 1),
            (&[10], 0, 5, 2, 1),
            (&[10], -1, -100, -7, 2),
            (&[4, 5], 1, 0, 5, 2),
            (&[4, 5], -2, 1, -1, 1),
            (&[4, 5], 0, -1, 4, 1),
            (&[0, 5], 1, 1, 4, 2),
        ] {
            let dd = resolve(dim, shape.len());
            let n = shape[dd] as isize;
            let clamp = |i: isize| if i < 0 { (i + n).max(0) as usize } else { i.min(n) as usize };
            let (a, b) = (clamp(start), clamp(end));
            add(
                "slice",
                shape,
                format!("dim {dim} [{start}:{end}:{step}]"),
                Box::new(move |x| x.slice(dim, start, end, step)),
                Box::new(move |x| x.slice(dd, a, b, step)),
            );
        }
        for (shape, dims) in [
            (&[2, 3, 4][..], &[0][..]),
            (&[2, 3, 4], &[0, 2]),
            (&[2, 3, 4], &[-1]),
            (&[5], &[0]),
            (&[], &[0]),
            (&[2, 0], &[0, 1]),
            (&[1, 3], &[0, -1]),
        ] {
            let dv = dims.to_vec();
            let rd: Vec<usize> =
                if shape.is_empty() { Vec::new() } else { dims.iter().map(|&q| resolve(q, shape.len())).collect() };
            add(
                "flip",
                shape,
                format!("{dims:?}"),
                Box::new(move |x| x.flip(dv.clone())),
                Box::new(move |x| x.flip(&rd)),
            );
        }
        for (shape, pads) in [
            (&[2, 3][..], &[(1usize, 2usize)][..]),
            (&[2, 3], &[(1, 0), (0, 2)]),
            (&[3], &[(0, 0)]),
            (&[2, 3, 4], &[(0, 1)]),
            (&[0, 2], &[(1, 1), (1, 0)]),
            (&[], &[]),
        ] {
            let p = pads.to_vec();
            let mut per_dim = vec![(0, 0); shape.len()];
            for (i, &q) in pads.iter().enumerate() {
                per_dim[shape.len() - 1 - i] = q;
            }
            add(
                "pad",
                shape,
                format!("{pads:?} with 1"),
                Box::new(move |x| x.pad(&p, 1)),
                Box::new(move |x| x.pad(&per_dim, 1.0)),
            );
        }
        for (shape, k) in
            [(&[3, 4][..], 0i64), (&[3, 4], -1), (&[4, 3], 1), (&[2, 3, 4], 2), (&[2, 3, 3], -5), (&[0, 3], 0)]
        {
            let keep = |lower: bool, k: i64| {
                move |x: &Nd| {
                    let r = x.shape.len();
                    Nd::from_fn(&x.shape, |i| {
                        let off = i[r - 1] as i64 - i[r - 2] as i64;
                        if (lower && off <= k) || (!lower && off >= k) { x.at(i) } else { 0.0 }
                    })
                }
            };
            add("tril", shape, format!("diagonal {k}"), Box::new(move |x| x.tril(k)), Box::new(keep(true, k)));
            add("triu", shape, format!("diagonal {k}"), Box::new(move |x| x.triu(k)), Box::new(keep(false, k)));
        }
        for (shape, shifts, dims) in [
            (&[2, 3][..], &[1i64][..], &[][..]),
            (&[2, 3], &[1, -1], &[0isize, 1]),
            (&[5], &[7], &[0]),
            (&[4, 5], &[-12], &[-1]),
            (&[3, 0], &[2], &[0]),
            (&[2, 3, 4], &[1, 2], &[0, 2]),
        ] {
            let (sh, dm) = (shifts.to_vec(), dims.to_vec());
            let (rsh, rdm) = (shifts.to_vec(), dims.to_vec());
            add(
                "roll",
                shape,
                format!("shifts {shifts:?} dims {dims:?}"),
                Box::new(move |x| x.roll(&sh, &dm)),
                Box::new(move |x| {
                    if rdm.is_empty() {
                        // Rolled as if flat.
                        let n = x.numel() as i64;
                        let flat = x.reshape(&[x.numel()]);
                        let rolled =
                            Nd::from_fn(&[x.numel()], |i| flat.at(&[(i[0] as i64 - rsh[0]).rem_euclid(n) as usize]));
                        return rolled.reshape(&x.shape);
                    }
                    let axes: Vec<usize> = rdm.iter().map(|&q| resolve(q, x.shape.len())).collect();
                    Nd::from_fn(&x.shape, |i| {
                        let mut src = i.to_vec();
                        for (&a, &s) in axes.iter().zip(&rsh) {
                            let n = x.shape[a] as i64;
                            src[a] = (i[a] as i64 - s).rem_euclid(n) as usize;
                        }
                        x.at(&src)
                    })
                }),
            );
        }
        for (shape, sizes, tile) in [
            (&[2][..], &[2usize, 2][..], false),
            (&[2, 3], &[1, 2], false),
            (&[2, 3], &[3, 1, 2], false),
            (&[], &[3], false),
            (&[2, 3], &[2], true),
            (&[2, 0], &[2, 2], false),
        ] {
            let sz = sizes.to_vec();
            let full: Vec<usize> =
                std::iter::repeat_n(1, shape.len().saturating_sub(sizes.len())).chain(sizes.iter().copied()).collect();
            let op = if tile { "tile" } else { "repeat" };
            add(
                op,
                shape,
                format!("{sizes:?}"),
                Box::new(move |x| if tile { x.tile(&sz) } else { x.repeat(&sz) }),
                Box::new(move |x| {
                    let lead = full.len() - x.shape.len();
                    let out: Vec<usize> = full
                        .iter()
                        .enumerate()
                        .map(|(i, &s)| s * if i < lead { 1 } else { x.shape[i - lead] })
                        .collect();
                    Nd::from_fn(&out, |i| {
                        let src: Vec<usize> = (0..x.shape.len()).map(|k| i[k + lead] % x.shape[k]).collect();
                        x.at(&src)
                    })
                }),
            );
        }
        // chunk and split: each piece is a narrow of the input.
        for (shape, dim, how, pieces) in [
            (&[7][..], 0isize, "chunk 3", &[(0usize, 3usize), (3, 3), (6, 1)][..]),
            (&[5, 2], 0, "chunk 4", &[(0, 2), (2, 2), (4, 1)]),
            (&[2, 7], -1, "split 3", &[(0, 3), (3, 3), (6, 1)]),
            (&[2, 7], 1, "split [2, 5]", &[(0, 2), (2, 5)]),
            (&[0, 2], 0, "split 2", &[(0, 0)]),
        ] {
            for (p, &(start, len)) in pieces.iter().enumerate() {
                let dd = resolve(dim, shape.len());
                let how = how.to_string();
                let h = how.clone();
                add(
                    if how.starts_with("chunk") { "chunk" } else { "split" },
                    shape,
                    format!("{how} along {dim}, piece {p}"),
                    Box::new(move |x| {
                        let parts = match h.as_str() {
                            "chunk 3" => x.chunk(3, dim),
                            "chunk 4" => x.chunk(4, dim),
                            "split 3" => x.split(3, dim),
                            "split 2" => x.split(2, dim),
                            _ => x.split_sizes(&[2, 5], dim),
                        };
                        assert_eq!(parts.len(), pieces.len(), "pieces");
                        parts[p].clone()
                    }),
                    Box::new(move |x| x.slice(dd, start, start + len, 1)),
                );
            }
        }
        // The border modes: each padded dim maps an output position to a source one (PyTorch's definitions).
        for (shape, pads) in [
            (&[5][..], &[(2usize, 3usize)][..]),
            (&[2, 3, 4], &[(1, 2), (2, 0)]),
            (&[3, 3], &[(0, 0), (1, 1)]),
            (&[2, 3], &[(3, 2)]),
        ] {
            for mode in [kiln::PadMode::Reflect, kiln::PadMode::Replicate, kiln::PadMode::Circular] {
                let fits = pads.iter().enumerate().all(|(i, &(b, a))| {
                    let n = shape[shape.len() - 1 - i];
                    match mode {
                        kiln::PadMode::Reflect => b < n && a < n,
                        kiln::PadMode::Replicate => n > 0,
                        kiln::PadMode::Circular => b <= n && a <= n,
                    }
                });
                if !fits {
                    continue; // refused with a message (tests/errors.rs)
                }
                let p = pads.to_vec();
                let rp = pads.to_vec();
                add(
                    "pad_with",
                    shape,
                    format!("{pads:?} {mode:?}"),
                    Box::new(move |x| x.pad_with(&p, mode)),
                    Box::new(move |x| {
                        let r = x.shape.len();
                        let mut before = vec![0usize; r];
                        let mut out = x.shape.clone();
                        for (i, &(b, a)) in rp.iter().enumerate() {
                            before[r - 1 - i] = b;
                            out[r - 1 - i] += b + a;
                        }
                        Nd::from_fn(&out, |o| {
                            let src: Vec<usize> = (0..r)
                                .map(|k| {
                                    let n = x.shape[k] as i64;
                                    let i = o[k] as i64 - before[k] as i64;
                                    (match mode {
                                        kiln::PadMode::Reflect => {
                                            if i < 0 {
                                                -i
                                            } else if i >= n {
                                                2 * (n - 1) - i
                                            } else {
                                                i
                                            }
                                        }
                                        kiln::PadMode::Replicate => i.clamp(0, n - 1),
                                        kiln::PadMode::Circular => i.rem_euclid(n),
                                    }) as usize
                                })
                                .collect();
                            x.at(&src)
                        })
                    }),
                );
            }
        }
        for shape in [&[2, 3, 4][..], &[3, 4]] {
            add("contiguous", shape, "plain".into(), Box::new(Tensor::contiguous), Box::new(|x| x.clone()));
        }
        add(
            "contiguous",
            &[2, 3, 4],
            "of a permute".into(),
            Box::new(|x| x.permute([2, 0, 1]).contiguous()),
            Box::new(|x| x.permute(&[2, 0, 1])),
        );
        add(
            "contiguous",
            &[3, 1],
            "of an expand".into(),
            Box::new(|x| x.expand([3, 4]).contiguous()),
            Box::new(|x| x.broadcast_to(&[3, 4])),
        );
        add(
            "contiguous",
            &[4, 5],
            "of a strided flip".into(),
            Box::new(|x| x.flip(0).slice(1, 0, 5, 2).contiguous()),
            Box::new(|x| x.flip(&[0]).slice(1, 0, 5, 2)),
        );

        for (i, (op, shape, what, f, r)) in cases.into_iter().enumerate() {
            let x = In::random(d, &shape, seed(&[&op, &d, &i]), any_dom(d));
            let want = r(&x.nd());
            t.check(op, &what, vec![x], move |a| f(&a[0]), Want::nd(d, &want, Kind::Exact));
        }

        // cat and stack: several inputs.
        for (shapes, dim) in [
            (vec![vec![2, 3], vec![2, 1]], 1isize),
            (vec![vec![2, 3], vec![1, 3], vec![3, 3]], 0),
            (vec![vec![2, 3], vec![2, 2]], -1),
            (vec![vec![2, 3], vec![0, 3]], 0),
            (vec![vec![3], vec![4]], 0),
            (vec![vec![2, 3, 4], vec![2, 1, 4]], 1),
            (vec![vec![1, 2], vec![1, 2]], -2),
            (vec![vec![2, 2]], 0),
            (vec![vec![0, 2], vec![0, 3]], 1),
        ] {
            let ins: Vec<In> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| In::random(d, s, seed(&[&"cat", &d, &shapes, &k]), any_dom(d)))
                .collect();
            let nds: Vec<Nd> = ins.iter().map(In::nd).collect();
            let want = Nd::cat(&nds.iter().collect::<Vec<_>>(), resolve(dim, shapes[0].len()));
            t.check(
                "cat",
                &format!("dim {dim}"),
                ins,
                move |a| Tensor::cat(&a.iter().collect::<Vec<_>>(), dim),
                Want::nd(d, &want, Kind::Exact),
            );
        }
        for (shape, n, dim) in [
            (vec![2, 3], 3, 0isize),
            (vec![2, 3], 3, 1),
            (vec![2, 3], 2, 2),
            (vec![2, 3], 2, -1),
            (vec![2, 3], 2, -3),
            (vec![], 3, 0),
            (vec![0, 2], 2, 1),
        ] {
            let ins: Vec<In> =
                (0..n).map(|k| In::random(d, &shape, seed(&[&"stack", &d, &shape, &dim, &k]), any_dom(d))).collect();
            let at = resolve(dim, shape.len() + 1);
            let mut one = shape.clone();
            one.insert(at, 1);
            let nds: Vec<Nd> = ins.iter().map(|i| i.nd().reshape(&one)).collect();
            let want = Nd::cat(&nds.iter().collect::<Vec<_>>(), at);
            t.check(
                "stack",
                &format!("dim {dim}"),
                ins,
                move |a| Tensor::stack(&a.iter().collect::<Vec<_>>(), dim),
                Want::nd(d, &want, Kind::Exact),
            );
        }
    }
    // Floats: cat keeps -0.0, NaN and infinities bit for bit; pad with a float value and -inf.
    for d in FLOATS {
        t.check(
            "cat",
            "-0.0, NaN and inf survive",
            vec![v(d, &[-0.0, 1.0]), v(d, &[-0.0, 0.0, NAN]), v(d, &[-INF])],
            |a| Tensor::cat(&[&a[0], &a[1], &a[2]], 0),
            Want::new(d, &[6], &[-0.0, 1.0, -0.0, 0.0, NAN, -INF], Kind::Exact),
        );
        t.check(
            "stack",
            "-0.0 survives",
            vec![v(d, &[-0.0]), v(d, &[-0.0])],
            |a| Tensor::stack(&[&a[0], &a[1]], 0),
            Want::new(d, &[2, 1], &[-0.0, -0.0], Kind::Exact),
        );
        t.check(
            "pad",
            "value 2.5 and -inf",
            vec![In::new(d, &[1, 2], &[1.0, -0.0])],
            |a| a[0].pad(&[(1, 0)], 2.5).pad(&[(0, 0), (0, 1)], f64::NEG_INFINITY),
            Want::new(d, &[2, 3], &[2.5, 1.0, -0.0, -INF, -INF, -INF], Kind::Exact),
        );
    }
}
