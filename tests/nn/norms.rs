//! Normalizations: layer_norm against a naive f64 implementation, rms_norm and group_norm against PyTorch.

use super::*;

/// rms_norm and group_norm (and their modules) against PyTorch 2.15 (`F.rms_norm`, `F.group_norm`) on x
/// `[2, 4, 3]` from `sines`, on every device in f32 and f64.
#[test]
fn rms_and_group_norms_match_pytorch() {
    let want: [(&str, [f64; 24]); 4] = [
        (
            "rms_norm [3] with weight",
            [
                0.5661689043045044,
                1.0076656341552734,
                1.2081125974655151,
                1.0069527626037598,
                1.0321217775344849,
                0.7755184769630432,
                1.2199054956436157,
                0.17162558436393738,
                -1.00945246219635,
                -0.6698848605155945,
                -1.025964379310608,
                -1.1289869546890259,
                -1.0757166147232056,
                -1.0190510749816895,
                -0.6775251626968384,
                -0.6431308388710022,
                0.4237692952156067,
                1.4612579345703125,
                0.7523539662361145,
                1.0357874631881714,
                1.057530403137207,
                1.1534463167190552,
                0.9948164820671082,
                0.549664318561554,
            ],
        ),
        (
            "rms_norm [4, 3], default eps",
            [
                0.6531140208244324,
                1.0412335395812988,
                1.2884268760681152,
                1.3612377643585205,
                1.2498115301132202,
                0.9692291617393494,
                0.5574661493301392,
                0.07025269418954849,
                -0.4264691174030304,
                -0.865470290184021,
                -1.1873341798782349,
                -1.348497986793518,
                -1.35014009475708,
                -1.1456860303878784,
                -0.7861686944961548,
                -0.3202471435070038,
                0.1890183985233307,
                0.6727011203765869,
                1.0653369426727295,
                1.3137844800949097,
                1.3844174146652222,
                1.2676758766174316,
                0.9793603420257568,
                0.5584930777549744,
            ],
        ),
        (
            "group_norm, 2 groups, affine",
            [
                0.2412223219871521,
                0.7186172008514404,
                1.022670030593872,
                1.646233081817627,
                1.358231782913208,
                0.6330159306526184,
                2.382559061050415,
                1.7639648914337158,
                1.1332985162734985,
                0.42242923378944397,
                -0.04531567171216011,
                -0.27952495217323303,
                0.41559457778930664,
                0.4997512102127075,
                0.6477343440055847,
                1.0731711387634277,
                1.5136563777923584,
                1.9320141077041626,
                0.9060632586479187,
                1.676832675933838,
                1.8959603309631348,
                1.5187993049621582,
                0.49501553177833557,
                -0.9994481205940247,
            ],
        ),
        (
            "group_norm, 4 groups",
            [
                -1.3044705390930176,
                0.17962485551834106,
                1.1248453855514526,
                1.017133116722107,
                0.3417607843875885,
                -1.3588944673538208,
                1.2207106351852417,
                0.007889716885983944,
                -1.228600263595581,
                1.3358339071273804,
                -0.266705185174942,
                -1.0691287517547607,
                -1.098545789718628,
                -0.22167916595935822,
                1.3202253580093384,
                -1.23505437374115,
                0.02103300206363201,
                1.2140213251113892,
                -1.3817490339279175,
                0.43292155861854553,
                0.9488275051116943,
                1.1416819095611572,
                0.15171149373054504,
                -1.2933932542800903,
            ],
        ),
    ];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |t: Tensor| t.to_device(&dev).unwrap();
            let x = on(sines(&[2, 4, 3], 0.5, dtype));
            let (rw, gw, gb) = (on(sines(&[3], 1.1, dtype)), on(sines(&[4], 0.3, dtype)), on(sines(&[4], 0.9, dtype)));
            let got = [
                F::rms_norm(&x, &[3], Some(&rw), None),
                F::rms_norm(&x, &[4, 3], None, None),
                F::group_norm(&x, 2, Some(&gw), Some(&gb), 1e-5),
                F::group_norm(&x, 4, None, None, 1e-5),
            ];
            for ((name, want), y) in want.iter().zip(got) {
                // f64's default eps is f64's: within f32's tolerance of PyTorch's f32 values all the same.
                if let Err(e) =
                    check_tensor(&y.to_dtype(DType::F32), &[2, 4, 3], &buffer(DType::F32, want), Kind::Accumulate)
                {
                    panic!("{name} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
    // The modules are the functions with their initial parameters (weight 1, bias 0).
    let x = sines(&[2, 4, 3], 0.5, DType::F32);
    let dev = data_device().unwrap();
    let m = kiln::nn::RMSNorm::new([3], &dev);
    assert_eq!(vals(&m.forward(&x)), vals(&F::rms_norm(&x, &[3], None, None)));
    let g = kiln::nn::GroupNorm::new(2, 4, &dev);
    assert_eq!(vals(&g.forward(&x)), vals(&F::group_norm(&x, 2, None, None, 1e-5)));
    assert_eq!(g.named_params().len(), 2);
}

/// Naive layer norm over the last `k` elements of each row.
fn layer_norm_ref(x: &[f64], k: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    x.chunks(k)
        .flat_map(|row| {
            let mean = row.iter().sum::<f64>() / k as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / k as f64;
            row.iter().enumerate().map(move |(j, v)| (v - mean) / (var + eps).sqrt() * w[j] + b[j]).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn layer_norm_matches_a_naive_implementation() {
    for dtype in FLOATS {
        let x = data(dtype, 2 * 3 * 4, 21, Dom::Cont(-3.0, 3.0));
        let xt = tensor(dtype, &x, &[2, 3, 4]);
        // Over the last dim, with a learned affine.
        let w = data(dtype, 4, 22, Dom::Cont(0.5, 1.5));
        let b = data(dtype, 4, 23, Dom::Cont(-0.5, 0.5));
        let ln = LayerNorm::from_params(tensor(dtype, &w, &[4]), Some(tensor(dtype, &b, &[4])), 1e-5);
        check(&ln.forward(&xt), &[2, 3, 4], &layer_norm_ref(&x, 4, &w, &b, 1e-5), Kind::Accumulate);
        // Over the last two dims, default init (weight 1, bias 0), another eps.
        let ln = LayerNorm::new(vec![3, 4], &dev()).eps(1e-3);
        let got = if dtype == DType::F32 { ln.forward(&xt) } else { ln.forward(&xt.to_dtype(DType::F32)) };
        let x32 = values(&buffer(DType::F32, &x));
        check(&got, &[2, 3, 4], &layer_norm_ref(&x32, 12, &[1.0; 12], &[0.0; 12], 1e-3), Kind::Accumulate);
        assert_eq!(ln.named_params().len(), 2);
        // Without affine parameters.
        let ln = LayerNorm::no_affine(vec![4], 1e-5);
        check(&ln.forward(&xt), &[2, 3, 4], &layer_norm_ref(&x, 4, &[1.0; 4], &[0.0; 4], 1e-5), Kind::Accumulate);
        assert!(ln.named_params().is_empty());
    }
}

/// layer_norm's own gradient rule gives each leaf its gradient in its own dtype (a half weight's is computed in f32
/// and rounded once), with the values of the same rule in f64 rounded to that dtype, within the accumulate
/// tolerance.
#[test]
fn layer_norm_gradients_keep_each_dtype() {
    let (x, w, b, r) = (
        data(DType::F64, 2 * 3 * 8, 31, Dom::Cont(-3.0, 3.0)),
        data(DType::F64, 8, 32, Dom::Cont(0.5, 1.5)),
        data(DType::F64, 8, 33, Dom::Cont(-0.5, 0.5)),
        data(DType::F64, 2 * 3 * 8, 34, Dom::Cont(-1.0, 1.0)),
    );
    let grads = |dtype: DType| {
        let leaves = [tensor(dtype, &x, &[2, 3, 8]), tensor(dtype, &w, &[8]), tensor(dtype, &b, &[8])]
            .map(|t| t.requires_grad());
        let y = F::layer_norm(&leaves[0], &[8], Some(&leaves[1]), Some(&leaves[2]), 1e-5);
        let g = y.mul(tensor(dtype, &r, &[2, 3, 8])).sum_all().backward().unwrap();
        leaves.map(|l| g.get(&l).cloned().expect("a gradient"))
    };
    let want = grads(DType::F64).map(|t| t.to_vec::<f64>().unwrap());
    for dtype in FLOATS {
        for (i, (got, want)) in grads(dtype).iter().zip(&want).enumerate() {
            assert_eq!(got.dtype(), dtype, "gradient {i} in {dtype}");
            check(got, got.dims(), want, Kind::Accumulate);
        }
    }
}
