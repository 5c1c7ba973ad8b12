//! The op table's creation ops.

use super::*;

/// from_vec / from_slice / to_vec / item round trips, bit for bit.
pub(super) fn roundtrip<T: kiln::Element>(t: &mut Table, data: Vec<T>) {
    let d = T::DTYPE;
    assert_eq!(data.len(), 6);
    let shapes: [Vec<usize>; 6] = [vec![6], vec![2, 3], vec![3, 1, 2], vec![], vec![0], vec![2, 0]];
    for shape in shapes {
        let n: usize = shape.iter().product();
        let part = data[..n].to_vec();
        let want = Want::buf(&shape, T::into_buffer(part.clone()), Kind::Exact);
        let what = format!("{shape:?}");
        t.build(
            "from_vec",
            &[d],
            what,
            move |dev| Tensor::from_vec(part.clone(), shape.clone(), dev).expect("from_vec"),
            want,
        );
    }
    // from_slice, to_vec and item are checked as plain values rather than via HostBuffer.
    let p = data.clone();
    t.custom("from_slice", &[d], "[2, 3] and []", move |dev| {
        let x = Tensor::from_slice(&p, [2, 3], dev).map_err(|e| e.to_string())?;
        let got = T::into_buffer(x.to_vec::<T>().map_err(|e| e.to_string())?);
        compare(&got, &T::into_buffer(p.clone()), Tol::EXACT)?;
        let s = Tensor::from_slice(&p[..1], [], dev).map_err(|e| e.to_string())?;
        if s.dims() != [0usize; 0] || s.dtype() != d {
            return Err(format!("0-dim from_slice gave {s:?}"));
        }
        compare(
            &T::into_buffer(s.to_vec::<T>().map_err(|e| e.to_string())?),
            &T::into_buffer(p[..1].to_vec()),
            Tol::EXACT,
        )
    });
    let p = data.clone();
    t.custom("to_vec", &[d], "[3, 2] after a reshape", move |dev| {
        let x = Tensor::from_vec(p.clone(), [2, 3], dev).map_err(|e| e.to_string())?.reshape([3, 2]);
        compare(&T::into_buffer(x.to_vec::<T>().map_err(|e| e.to_string())?), &T::into_buffer(p.clone()), Tol::EXACT)
    });
    for (shape, idx) in [(vec![], 0usize), (vec![1, 1], 3), (vec![1], 5)] {
        let p = data.clone();
        t.custom("item", &[d], format!("{shape:?}"), move |dev| {
            let x = Tensor::from_vec(vec![p[idx]], shape.clone(), dev).map_err(|e| e.to_string())?;
            let v: T = x.item::<T>().map_err(|e| e.to_string())?;
            compare(&T::into_buffer(vec![v]), &T::into_buffer(vec![p[idx]]), Tol::EXACT)
        });
    }
}

pub(super) fn creation(t: &mut Table) {
    roundtrip(t, vec![true, false, false, true, true, false]);
    roundtrip(t, vec![0u8, 1, 127, 128, 254, 255]);
    roundtrip(t, vec![0u32, 1, 65_535, 1 << 31, u32::MAX - 1, u32::MAX]);
    roundtrip(t, vec![i32::MIN, -1, 0, 1, 7, i32::MAX]);
    roundtrip(t, vec![i64::MIN, -1, 0, 1, 1 << 40, i64::MAX]);
    roundtrip(t, vec![-0.0f32, 1.5, -2.25, f32::INFINITY, f32::NAN, 1e-40]);
    roundtrip(t, [-0.0f32, 1.5, -65504.0, f32::INFINITY, f32::NAN, 6e-8].map(f16::from_f32).to_vec());
    roundtrip(t, vec![-0.0f64, 0.1, -1e300, f64::NEG_INFINITY, f64::NAN, 5e-324]);
    roundtrip(t, [-0.0f32, 1.5, -3.3895314e38, f32::INFINITY, f32::NAN, 9.2e-41].map(kiln::bf16::from_f32).to_vec());

    for d in ALL_DTYPES {
        for shape in [vec![], vec![0], vec![2, 3], vec![2, 0, 3]] {
            let n: usize = shape.iter().product();
            let s = shape.clone();
            t.build(
                "zeros",
                &[d],
                format!("{shape:?}"),
                move |dev| Tensor::zeros(s.clone(), d, dev),
                Want::new(d, &shape, &vec![0.0; n], Kind::Exact),
            );
            let s = shape.clone();
            t.build(
                "ones",
                &[d],
                format!("{shape:?}"),
                move |dev| Tensor::ones(s.clone(), d, dev),
                Want::new(d, &shape, &vec![1.0; n], Kind::Exact),
            );
            let s = shape.clone();
            t.build(
                "full",
                &[d],
                format!("{shape:?} value 3"),
                move |dev| Tensor::full(s.clone(), 3, d, dev),
                Want::new(d, &shape, &vec![3.0; n], Kind::Exact),
            );
        }
        // A float value into an int dtype truncates toward zero (torch.full(.., 2.7, dtype=int32) is 2); bool is
        // value != 0.
        t.build(
            "full",
            &[d],
            "[3] value 2.7",
            move |dev| Tensor::full([3], 2.7, d, dev),
            Want::new(d, &[3], &[2.7; 3], Kind::Exact),
        );
        t.build(
            "full",
            &[d],
            "[2] value true",
            move |dev| Tensor::full([2], true, d, dev),
            Want::new(d, &[2], &[1.0; 2], Kind::Exact),
        );
        if d != U8 && d != Bool {
            t.build(
                "full",
                &[d],
                "[2] value -2.7",
                move |dev| Tensor::full([2], -2.7, d, dev),
                Want::new(d, &[2], &[-2.7; 2], Kind::Exact),
            );
        }
        for n in [0usize, 1, 3] {
            let want = Nd::from_fn(&[n, n], |i| (i[0] == i[1]) as u8 as f64);
            t.build(
                "eye",
                &[d],
                format!("n = {n}"),
                move |dev| Tensor::eye(n, d, dev),
                Want::nd(d, &want, Kind::Exact),
            );
        }
    }

    // arange: i64 when start, end and step are all integers, else f32; the length is ceil((end - start) / step).
    let ar: Vec<(&str, Build, DType, Vec<f64>)> = vec![
        ("0..5 by 1", Box::new(|d| Tensor::arange(0, 5, 1, d)), I64, vec![0.0, 1.0, 2.0, 3.0, 4.0]),
        ("0..10 by 3", Box::new(|d| Tensor::arange(0, 10, 3, d)), I64, vec![0.0, 3.0, 6.0, 9.0]),
        ("5..0 by -2", Box::new(|d| Tensor::arange(5, 0, -2, d)), I64, vec![5.0, 3.0, 1.0]),
        ("-3..3 by 2", Box::new(|d| Tensor::arange(-3, 3, 2, d)), I64, vec![-3.0, -1.0, 1.0]),
        ("3..3 (empty)", Box::new(|d| Tensor::arange(3, 3, 1, d)), I64, vec![]),
        ("i32 args", Box::new(|d| Tensor::arange(1i32, 4i32, 1i32, d)), I64, vec![1.0, 2.0, 3.0]),
        ("0.0..1.0 by 0.25", Box::new(|d| Tensor::arange(0.0, 1.0, 0.25, d)), F32, vec![0.0, 0.25, 0.5, 0.75]),
        ("1.0..-1.0 by -0.5", Box::new(|d| Tensor::arange(1.0, -1.0, -0.5, d)), F32, vec![1.0, 0.5, 0.0, -0.5]),
        ("0.5..3 by 1 (mixed)", Box::new(|d| Tensor::arange(0.5, 3, 1, d)), F32, vec![0.5, 1.5, 2.5]),
        ("0..1.0 by 0.1", Box::new(|d| Tensor::arange(0, 1.0, 0.1, d)), F32, (0..10).map(|i| i as f64 * 0.1).collect()),
    ];
    for (what, f, d, v) in ar {
        let n = v.len();
        t.build("arange", &[d], what, f, Want::new(d, &[n], &v, Kind::Elementwise));
    }

    // linspace: both ends exact, evenly spaced in between (PyTorch's symmetric formula).
    for (a, b, n, d) in
        [(0.0, 1.0, 5, F32), (1.0, -1.0, 3, F64), (0.0, 1.0, 0, F32), (2.0, 3.0, 1, F64), (0.0, 1.0, 7, F32)]
            .into_iter()
            .chain([(-3.5, 10.0, 100, F64), (-3.5, 10.0, 100, F32), (0.1, 0.7, 4, F32)])
            .chain([(0.0, 1.0, 5, F16), (-3.5, 10.0, 100, F16), (0.0, 1.0, 5, BF16), (-3.5, 10.0, 100, BF16)])
    {
        let v: Vec<f64> = (0..n).map(|i| if n == 1 { a } else { a + (b - a) * i as f64 / (n - 1) as f64 }).collect();
        t.build(
            "linspace",
            &[d],
            format!("{a}..={b}, {n} steps"),
            move |dev| Tensor::linspace(a, b, n, d, dev),
            Want::new(d, &[n], &v, Kind::Elementwise),
        );
    }
    t.build(
        "linspace",
        &[F32],
        "0.1..=0.7: the endpoints are bit-exact",
        |dev| {
            let x = Tensor::linspace(0.1, 0.7, 4, F32, dev);
            Tensor::cat(&[&x.narrow(0, 0, 1), &x.narrow(0, 3, 1)], 0)
        },
        Want::new(F32, &[2], &[0.1, 0.7], Kind::Exact),
    );
}
