//! The losses: regression and binary ones, nll_loss, mse_loss, and cross_entropy with class indices, class
//! probabilities, its options (weights, label smoothing, ignored samples) and their gradients and refusals.

use super::*;

/// The regression and binary losses, `nll_loss`, `logsigmoid`, `glu`, `normalize` and `cosine_similarity` against
/// the values PyTorch 2.15 printed (`tests/fixtures/losses.py`), on every device in f32.
#[test]
fn losses_match_pytorch() {
    let want: Vec<(&str, Vec<usize>, Vec<f64>)> = vec![
        ("l1 mean", vec![], vec![1.3501487970352173]),
        (
            "smooth_l1 none beta 0.5",
            vec![2, 5],
            vec![
                0.23408827185630798,
                0.1628590226173401,
                0.9863227605819702,
                1.6517574787139893,
                2.059798002243042,
                2.1552181243896484,
                1.9251034259796143,
                1.4005985260009766,
                0.652692973613739,
                0.0010635519865900278,
            ],
        ),
        ("huber sum delta 1.5", vec![], vec![11.409392356872559]),
        (
            "bce_with_logits none",
            vec![2, 5],
            vec![
                0.555816113948822,
                0.31163471937179565,
                0.49778664112091064,
                1.0051817893981934,
                1.6061242818832397,
                2.0066311359405518,
                1.9749611616134644,
                1.4907118082046509,
                0.8226870894432068,
                0.376223623752594,
            ],
        ),
        ("bce_with_logits pos_weight mean", vec![], vec![1.0735714435577393]),
        ("nll_loss weight mean", vec![], vec![1.1292285919189453]),
        (
            "logsigmoid",
            vec![2, 5],
            vec![
                -0.5545679330825806,
                -0.22873210906982422,
                -0.10175009071826935,
                -0.05864153057336807,
                -0.04859337955713272,
                -0.059789642691612244,
                -0.10541354864835739,
                -0.23904584348201752,
                -0.5783483386039734,
                -1.2081620693206787,
            ],
        ),
        (
            "glu dim 0",
            vec![2, 3],
            vec![
                0.18960681557655334,
                0.34894272685050964,
                0.40576252341270447,
                0.3798369765281677,
                0.3123781681060791,
                0.2347547709941864,
            ],
        ),
        (
            "normalize p 2 dim 1",
            vec![2, 5],
            vec![
                0.06138675659894943,
                0.2784760892391205,
                0.45787498354911804,
                0.5753027200698853,
                0.6148658394813538,
                0.717324435710907,
                0.5654147267341614,
                0.3369787931442261,
                0.06293436139822006,
                -0.21962793171405792,
            ],
        ),
        ("cosine_similarity dim 1", vec![2], vec![0.878311812877655, 0.26633045077323914]),
        ("kl_div batchmean", vec![], vec![0.09524445235729218]),
        ("kl_div sum", vec![], vec![0.19048890471458435]),
        ("kl_div mean", vec![], vec![0.019048890098929405]),
        (
            "kl_div none",
            vec![2, 5],
            vec![
                0.09416383504867554,
                0.15199068188667297,
                0.0,
                -0.051279038190841675,
                -0.12276566028594971,
                0.27352574467658997,
                -0.0550609827041626,
                -0.05703100562095642,
                -0.029089316725730896,
                -0.013965364545583725,
            ],
        ),
        ("kl_div log_target batchmean", vec![], vec![0.14257623255252838]),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let x = on(sines(&[2, 5], 0.1, DType::F32).mul(3.0));
        let y = on(sines(&[2, 5], 0.9, DType::F32));
        let p = on(sines(&[2, 5], 1.7, DType::F32).add(1.0).div(2.0));
        let w = on(sines(&[5], 2.3, DType::F32).abs().add(0.5));
        let labels = on(Tensor::from_vec(vec![3i32, -100], [2], &data_device().unwrap()).unwrap());
        let bce_pw = F::BceWithLogitsOptions { pos_weight: Some(w.clone()), ..Default::default() };
        let nll = F::CrossEntropyOptions { weight: Some(w.clone()), ..Default::default() };
        // kl_div's log-probabilities and target distributions; one target probability exactly 0 (xlogy's case).
        let logp = on(sines(&[2, 5], 0.1, DType::F32).mul(2.0)).log_softmax(1);
        let q = on(sines(&[2, 5], 0.8, DType::F32).mul(3.0)).softmax(1);
        let zero_at_2 = on(Tensor::from_vec(
            vec![1.0f32, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            [2, 5],
            &data_device().unwrap(),
        )
        .unwrap());
        let q0 = q.mul(&zero_at_2);
        let got = [
            F::l1_loss(&x, &y, Reduction::Mean),
            F::smooth_l1_loss(&x, &y, Reduction::None, 0.5),
            F::huber_loss(&x, &y, Reduction::Sum, 1.5),
            F::binary_cross_entropy_with_logits(&x, &p, Reduction::None),
            F::binary_cross_entropy_with_logits_with(&x, &p, &bce_pw),
            F::nll_loss_with(&x.log_softmax(1), &labels, &nll),
            F::logsigmoid(&x),
            F::glu(&on(sines(&[4, 3], 0.3, DType::F32)), 0),
            F::normalize(&x, 2.0, 1, 1e-12),
            F::cosine_similarity(&x, &y, 1, 1e-8),
            F::kl_div(&logp, &q0, F::KlReduction::BatchMean, false),
            F::kl_div(&logp, &q0, F::KlReduction::Sum, false),
            F::kl_div(&logp, &q0, F::KlReduction::Mean, false),
            F::kl_div(&logp, &q0, F::KlReduction::None, false),
            F::kl_div(&logp, &q.log(), F::KlReduction::BatchMean, true),
        ];
        for ((name, shape, want), got) in want.iter().zip(&got) {
            if let Err(e) = check_tensor(got, shape, &buffer(DType::F32, want), kind_of(name)) {
                panic!("{name} on {}: {e}", dev.describe());
            }
        }
    }
}

#[test]
#[should_panic(expected = "nll_loss: has no label_smoothing (cross_entropy has), got 0.1")]
fn nll_loss_has_no_label_smoothing() {
    let x = sines(&[2, 5], 0.1, DType::F32);
    let t = Tensor::from_vec(vec![1i64, 2], [2], &dev()).unwrap();
    F::nll_loss_with(&x, &t, &F::CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() });
}

#[test]
#[should_panic(expected = "l1_loss: the target's shape [5] is not the input's [2, 5]")]
fn a_loss_target_of_another_shape_is_refused() {
    F::l1_loss(&sines(&[2, 5], 0.1, DType::F32), &sines(&[5], 0.1, DType::F32), Reduction::Mean);
}

#[test]
fn mse_loss_reductions_match_the_formula() {
    let a = [1.0, -2.0, 3.5, 0.25, 4.0, -1.0];
    let b = [0.5, -2.0, 1.0, 1.25, 0.0, 2.0];
    let sq: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).collect();
    for dtype in FLOATS {
        let (x, y) = (tensor(dtype, &a, &[2, 3]), tensor(dtype, &b, &[2, 3]));
        check(&F::mse_loss(&x, &y, Reduction::None), &[2, 3], &sq, Kind::Elementwise);
        check(&F::mse_loss(&x, &y, Reduction::Sum), &[], &[sq.iter().sum()], Kind::Accumulate);
        check(&F::mse_loss(&x, &y, Reduction::Mean), &[], &[sq.iter().sum::<f64>() / 6.0], Kind::Accumulate);
    }
}

/// Per-sample cross-entropy `logsumexp(z) - z[t]` in f64, for rows of `c` logits.
fn ce_ref(z: &[f64], t: &[i64], c: usize) -> Vec<f64> {
    t.iter()
        .enumerate()
        .map(|(i, &ti)| {
            let row = &z[i * c..(i + 1) * c];
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            lse - row[ti as usize]
        })
        .collect()
}

#[test]
fn cross_entropy_with_class_indices_matches_the_formula() {
    let (n, c) = (4, 5);
    for dtype in FLOATS {
        let z = data(dtype, n * c, 7, Dom::Cont(-3.0, 3.0));
        let t = [3i64, 0, 4, 1];
        let logits = tensor(dtype, &z, &[n, c]);
        let targets = Tensor::from_vec(t.to_vec(), [n], &dev()).unwrap();
        let per = ce_ref(&z, &t, c);
        check(&F::cross_entropy(&logits, &targets, Reduction::None), &[n], &per, Kind::Accumulate);
        check(&F::cross_entropy(&logits, &targets, Reduction::Sum), &[], &[per.iter().sum()], Kind::Accumulate);
        let mean = per.iter().sum::<f64>() / n as f64;
        check(&F::cross_entropy(&logits, &targets, Reduction::Mean), &[], &[mean], Kind::Accumulate);
        // i32 targets work too; an unbatched [C] input takes a zero-dim target.
        let t32 = Tensor::from_vec(t.iter().map(|&v| v as i32).collect::<Vec<_>>(), [n], &dev()).unwrap();
        check(&F::cross_entropy(&logits, &t32, Reduction::Mean), &[], &[mean], Kind::Accumulate);
        let row = tensor(dtype, &z[..c], &[c]);
        let t0 = Tensor::from_vec(vec![3i64], [], &dev()).unwrap();
        check(&F::cross_entropy(&row, &t0, Reduction::Mean), &[], &per[..1], Kind::Accumulate);
    }
}

#[test]
fn cross_entropy_gradient_is_softmax_minus_one_hot_over_n() {
    let (n, c) = (3, 4);
    let z = data(DType::F64, n * c, 9, Dom::Cont(-2.0, 2.0));
    let t = [1i64, 3, 0];
    let logits = tensor(DType::F64, &z, &[n, c]).requires_grad();
    let targets = Tensor::from_vec(t.to_vec(), [n], &dev()).unwrap();
    let grads = F::cross_entropy(&logits, &targets, Reduction::Mean).backward().unwrap();
    let mut want = vec![0.0; n * c];
    for i in 0..n {
        let row = &z[i * c..(i + 1) * c];
        let s: f64 = row.iter().map(|v| v.exp()).sum();
        for j in 0..c {
            want[i * c + j] = (row[j].exp() / s - if j as i64 == t[i] { 1.0 } else { 0.0 }) / n as f64;
        }
    }
    check(grads.get(&logits).unwrap(), &[n, c], &want, Kind::Accumulate);
}

#[test]
fn cross_entropy_with_class_probabilities_and_spatial_dims() {
    // Soft targets: -sum_c p_c log_softmax(z)_c per sample, then the mean.
    let (n, c) = (2, 3);
    let z = [0.5, -1.0, 2.0, 0.0, 0.0, 1.0];
    let p = [0.2, 0.3, 0.5, 1.0, 0.0, 0.0];
    let mut want = 0.0;
    for i in 0..n {
        let row = &z[i * c..(i + 1) * c];
        let lse = row.iter().map(|v: &f64| v.exp()).sum::<f64>().ln();
        want -= (0..c).map(|j| p[i * c + j] * (row[j] - lse)).sum::<f64>();
    }
    let loss = F::cross_entropy(&tensor(DType::F64, &z, &[n, c]), &tensor(DType::F64, &p, &[n, c]), Reduction::Mean);
    check(&loss, &[], &[want / n as f64], Kind::Accumulate);
    // [N, C, L] logits with [N, L] targets: classes on dim 1.
    let (n, c, l) = (2, 3, 2);
    let z = data(DType::F64, n * c * l, 4, Dom::Cont(-2.0, 2.0));
    let t = [2i64, 0, 1, 1];
    let mut want = Vec::new();
    for i in 0..n {
        for s in 0..l {
            let row: Vec<f64> = (0..c).map(|j| z[(i * c + j) * l + s]).collect();
            want.extend(ce_ref(&row, &t[i * l + s..i * l + s + 1], c));
        }
    }
    let got = F::cross_entropy(
        &tensor(DType::F64, &z, &[n, c, l]),
        &Tensor::from_vec(t.to_vec(), [n, l], &dev()).unwrap(),
        Reduction::None,
    );
    check(&got, &[n, l], &want, Kind::Accumulate);
}

/// `cross_entropy_with`'s options against values PyTorch 2.15 printed for the same f64 inputs
/// (`tests/fixtures/cross_entropy_options.py`): `ignore_index` (the default -100, and a valid class), class
/// weights, label smoothing, and all together, for every reduction; probability targets with weights and smoothing.
#[test]
fn cross_entropy_options_match_pytorch() {
    use F::CrossEntropyOptions as O;
    let z = [
        0.5, -1.25, 2.0, 0.125, 1.5, 0.25, -0.75, 3.0, -2.0, 0.0, 0.5, 1.0, 0.75, 0.75, -0.5, 2.5, 1.0, -0.5, 0.25,
        -1.5,
    ];
    let logits = tensor(DType::F64, &z, &[5, 4]);
    let w = Some(tensor(DType::F64, &[0.5, 1.0, 2.0, 0.25], &[4]));
    let padded = Tensor::from_vec(vec![2i64, -100, 0, 3, 1], [5], &dev()).unwrap();
    let plain = Tensor::from_vec(vec![2i64, 1, 0, 3, 1], [5], &dev()).unwrap();
    let cases: [(&Tensor, O, [f64; 5], f64, f64); 6] = [
        (
            &padded,
            O::default(),
            [0.3473127897970557, 0.0, 3.705173162318934, 0.33456681908618446, 2.0752538515477292],
            6.462306622749904,
            1.615576655687476,
        ),
        (
            &padded,
            O { weight: w.clone(), ..O::default() },
            [0.6946255795941114, 0.0, 1.852586581159467, 0.08364170477154612, 2.0752538515477292],
            4.706107717072854,
            1.2549620578860943,
        ),
        (
            &padded,
            O { label_smoothing: 0.1, ..O::default() },
            [0.5129377897970557, 0.0, 3.517673162318934, 0.49706681908618444, 2.0440038515477292],
            6.571681622749904,
            1.642920405687476,
        ),
        (
            &padded,
            O { weight: w.clone(), label_smoothing: 0.1, ..O::default() },
            [0.7694423456781743, 0.0, 1.8209379070109204, 0.3222681735837213, 2.012283514975556],
            4.924931941248372,
            1.3133151843328992,
        ),
        (
            &plain,
            O { ignore_index: Some(3), ..O::default() },
            [0.3473127897970557, 3.0204665576088487, 3.705173162318934, 0.0, 2.0752538515477292],
            9.148206361272567,
            2.287051590318142,
        ),
        (
            &plain,
            O { ignore_index: Some(3), weight: w.clone(), label_smoothing: 0.2, ..O::default() },
            [0.8442591117622371, 3.0170857256387382, 1.789289232862374, 0.0, 1.9493131784033826],
            7.599947248666732,
            1.6888771663703848,
        ),
    ];
    for (t, o, none, sum, mean) in cases {
        for (r, want) in [(Reduction::None, &none[..]), (Reduction::Sum, &[sum][..]), (Reduction::Mean, &[mean][..])] {
            let got = F::cross_entropy_with(&logits, t, &O { reduction: r, ..o.clone() });
            let got = got.to_host().unwrap().to_f64();
            close(&got, want, 1e-14, 1e-15);
        }
    }
    // Probability targets: -Σ_c w_c p'_c log q_c with p' = (1 - ε) p + ε / C; the mean divides by the samples.
    let p: Vec<f64> = (1..=5)
        .flat_map(|k| {
            let e: Vec<f64> = [0.1, 0.2, 0.3, 0.4].iter().map(|v: &f64| (v * k as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect();
    let p = tensor(DType::F64, &p, &[5, 4]);
    let prob: [(O, [f64; 5], f64, f64); 3] = [
        (
            O { weight: w.clone(), ..O::default() },
            [1.389450530468563, 3.0157657450538475, 1.3541082967479383, 2.397793297311135, 1.458016116765302],
            9.615133986346786,
            1.923026797269357,
        ),
        (
            O { label_smoothing: 0.1, ..O::default() },
            [1.979977396784749, 2.1700675844573256, 1.531654728333856, 1.7329742497170457, 2.1301756918782537],
            9.54484965117123,
            1.908969930234246,
        ),
        (
            O { weight: w.clone(), label_smoothing: 0.1, ..O::default() },
            [1.3947848014651805, 3.014545410324293, 1.3723074510405444, 2.405004606869351, 1.4567695536713716],
            9.643411823370743,
            1.9286823646741484,
        ),
    ];
    for (o, none, sum, mean) in prob {
        for (r, want) in [(Reduction::None, &none[..]), (Reduction::Sum, &[sum][..]), (Reduction::Mean, &[mean][..])] {
            let got = F::cross_entropy_with(&logits, &p, &O { reduction: r, ..o.clone() }).to_host().unwrap();
            close(&got.to_f64(), want, 1e-14, 1e-15);
        }
    }
}

/// A class index that is neither in `0..C` nor ignored makes the realization fail, naming the index (PyTorch
/// raises too), for every reduction; a silent 0 or NaN is never returned. The ignored index is not checked, and
/// every target ignored gives a mean of 0 / 0, NaN, as PyTorch's.
#[test]
fn cross_entropy_out_of_range_targets_are_errors() {
    let z = data(DType::F64, 12, 3, Dom::Cont(-2.0, 2.0));
    let logits = tensor(DType::F64, &z, &[3, 4]);
    // (2^32 + 1 wraps to class 1 in the i32 compare; the range check reads the i64 value.)
    for bad in [4i64, -1, -7, (1 << 32) + 1] {
        let t = Tensor::from_vec(vec![1i64, bad, 3], [3], &dev()).unwrap();
        for r in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            let err = F::cross_entropy(&logits, &t, r).to_host().expect_err("out of range");
            assert_eq!(err.fault(), Some(kiln::Fault::Index { len: 4, index: bad }), "target {bad}, {r:?}");
        }
    }
    let ok = Tensor::from_vec(vec![1i64, -100, 3], [3], &dev()).unwrap();
    let per = F::cross_entropy(&logits, &ok, Reduction::None).to_host().unwrap().to_f64();
    let want = ce_ref(&z, &[1, 0, 3], 4);
    close(&[per[0], per[1], per[2]], &[want[0], 0.0, want[2]], 1e-12, 1e-12);
    let all_ignored = Tensor::from_vec(vec![-100i64; 3], [3], &dev()).unwrap();
    assert!(F::cross_entropy(&logits, &all_ignored, Reduction::Mean).item::<f64>().unwrap().is_nan());
    assert_eq!(F::cross_entropy(&logits, &all_ignored, Reduction::Sum).item::<f64>().unwrap(), 0.0);
}

/// The gradient with every option on (weights, smoothing, an ignored sample) against central differences of the
/// loss itself, in f64: ignored samples get none.
#[test]
fn cross_entropy_options_gradient_matches_finite_differences() {
    let (n, c) = (4, 3);
    let z = data(DType::F64, n * c, 11, Dom::Cont(-2.0, 2.0));
    let t = Tensor::from_vec(vec![2i64, -100, 0, 1], [n], &dev()).unwrap();
    let opts = F::CrossEntropyOptions {
        weight: Some(tensor(DType::F64, &[0.5, 2.0, 1.25], &[c])),
        label_smoothing: 0.15,
        ..Default::default()
    };
    let loss = |z: &[f64]| F::cross_entropy_with(&tensor(DType::F64, z, &[n, c]), &t, &opts).item::<f64>().unwrap();
    let logits = tensor(DType::F64, &z, &[n, c]).requires_grad();
    let g = F::cross_entropy_with(&logits, &t, &opts).backward().unwrap();
    let got = g.get(&logits).unwrap().to_host().unwrap().to_f64();
    let h = 1e-6;
    for i in 0..n * c {
        let (mut up, mut down) = (z.clone(), z.clone());
        up[i] += h;
        down[i] -= h;
        let numeric = (loss(&up) - loss(&down)) / (2.0 * h);
        assert!((got[i] - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()), "[{i}] {} vs {numeric}", got[i]);
    }
    assert!(got[c..2 * c].iter().all(|&v| v == 0.0), "the ignored sample has no gradient: {got:?}");
}

#[test]
#[should_panic(expected = "label_smoothing must be in [0, 1], got 1.5")]
fn cross_entropy_refuses_label_smoothing_outside_0_1() {
    let logits = tensor(DType::F32, &[0.0; 6], &[2, 3]);
    let t = Tensor::from_vec(vec![0i64, 2], [2], &dev()).unwrap();
    let _ = F::cross_entropy_with(&logits, &t, &F::CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() });
}

#[test]
#[should_panic(expected = "weight must be a [3] f32 tensor (one per class), got [2] f32")]
fn cross_entropy_refuses_a_weight_per_class_of_the_wrong_shape() {
    let logits = tensor(DType::F32, &[0.0; 6], &[2, 3]);
    let t = Tensor::from_vec(vec![0i64, 2], [2], &dev()).unwrap();
    let weight = Some(tensor(DType::F32, &[1.0, 2.0], &[2]));
    let _ = F::cross_entropy_with(&logits, &t, &F::CrossEntropyOptions { weight, ..Default::default() });
}
