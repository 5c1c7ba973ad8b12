//! The op table's random number ops.

use super::*;

pub(super) fn draw(
    f: fn(&[usize], DType, &Device) -> Tensor,
    n: usize,
    d: DType,
    dev: &Device,
) -> Result<Vec<f64>, String> {
    let x = f(&[n], d, dev);
    if x.dtype() != d || x.dims() != [n] {
        return Err(format!("got {x:?}"));
    }
    Ok(values(&x.to_host().map_err(|e| e.to_string())?))
}

pub(super) fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n)
}

pub(super) fn random(t: &mut Table) {
    type R = fn(&[usize], DType, &Device) -> Tensor;
    let rand: R = |s, d, dev| Tensor::rand(s.to_vec(), d, dev);
    let randn: R = |s, d, dev| Tensor::randn(s.to_vec(), d, dev);
    for d in FLOATS {
        for (op, f) in [("rand", rand), ("randn", randn)] {
            t.custom(op, &[d], "manual_seed: same seed, same numbers; the stream advances", move |dev| {
                kiln::manual_seed(1234);
                let a = draw(f, 1000, d, dev)?;
                let a2 = draw(f, 1000, d, dev)?;
                kiln::manual_seed(1234);
                let b = draw(f, 1000, d, dev)?;
                let b2 = draw(f, 1000, d, dev)?;
                kiln::manual_seed(1235);
                let c = draw(f, 1000, d, dev)?;
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if bits(&a) != bits(&b) || bits(&a2) != bits(&b2) {
                    return Err("the same seed gave different numbers".into());
                }
                if a == a2 || a == c {
                    return Err("consecutive draws or different seeds gave the same numbers".into());
                }
                Ok(())
            });
            t.custom(op, &[d], "numbers do not depend on when or with what they are realized", move |dev| {
                kiln::manual_seed(99);
                let (a, b) = (f(&[50], d, dev), f(&[2, 25], d, dev));
                let bv = values(&b.to_host().map_err(|e| e.to_string())?);
                let av = values(&a.to_host().map_err(|e| e.to_string())?);
                kiln::manual_seed(99);
                let (a2, b2) = (f(&[50], d, dev), f(&[50], d, dev));
                let both = Tensor::cat(&[&a2, &b2], 0);
                let v = values(&both.to_host().map_err(|e| e.to_string())?);
                if v[..50] != av[..] || v[50..] != bv[..] {
                    return Err("realization order or graph changed the numbers".into());
                }
                Ok(())
            });
        }
        t.custom("rand", &[d], "10k samples: all in [0, 1), mean 1/2, variance 1/12", move |dev| {
            kiln::manual_seed(7);
            let v = draw(rand, 10_000, d, dev)?;
            if let Some(x) = v.iter().find(|x| !(0.0..1.0).contains(*x)) {
                return Err(format!("{x} outside [0, 1)"));
            }
            let (m, var) = moments(&v);
            // Standard errors: 0.0029 for the mean, 0.00075 for the variance; the bounds are ~5 of them.
            if (m - 0.5).abs() > 0.015 || (var - 1.0 / 12.0).abs() > 0.004 {
                return Err(format!("mean {m}, variance {var}"));
            }
            Ok(())
        });
        t.custom("randn", &[d], "10k samples: mean 0, variance 1", move |dev| {
            kiln::manual_seed(7);
            let v = draw(randn, 10_000, d, dev)?;
            if v.iter().any(|x| !x.is_finite()) {
                return Err("a non-finite normal sample".into());
            }
            let (m, var) = moments(&v);
            // Standard errors: 0.01 for the mean, 0.014 for the variance; the bounds are 5 of them.
            if m.abs() > 0.05 || (var - 1.0).abs() > 0.07 {
                return Err(format!("mean {m}, variance {var}"));
            }
            Ok(())
        });
        t.custom("manual_seed", &[d], "rand and randn share one stream", move |dev| {
            kiln::manual_seed(5);
            let _ = rand(&[10], d, dev);
            let a = draw(randn, 10, d, dev)?;
            kiln::manual_seed(5);
            let _ = randn(&[10], d, dev);
            let b = draw(randn, 10, d, dev)?;
            if a != b {
                return Err("the second draw depends on the first draw's distribution".into());
            }
            Ok(())
        });
    }
    // Golden values: a seed gives the same numbers on every backend and in every later version of kiln (Philox
    // 4x32-10; uniform f32 values are bit-exact, normals agree to the libm's accuracy).
    t.build(
        "rand",
        &[F32],
        "golden values for seed 0",
        |dev| {
            kiln::manual_seed(0);
            Tensor::rand([4], F32, dev)
        },
        Want::buf(&[4], HostBuffer::F32(vec![0.39904642, 0.97224116, 0.019449413, 0.78736776].into()), Kind::Exact),
    );
    t.build(
        "randn",
        &[F64],
        "golden values for seed 0",
        |dev| {
            kiln::manual_seed(0);
            Tensor::randn([4], F64, dev)
        },
        Want::new(
            F64,
            &[4],
            &[-0.6176090549848544, 0.8317351265968663, -0.2696493043774042, -0.8988259151924168],
            Kind::Elementwise,
        ),
    );
}
