//! The tensor extras (`lerp` to `cdist`) and the shrinks, `logit` and distances against the values PyTorch printed.

use super::*;

/// `lerp`, `addcmul`, `addcdiv`, `diagonal`, `diag`, `trace`, `outer`, `hardtanh` and `relu6` against the values
/// PyTorch 2.15 printed (`tests/fixtures/tensor_extras.py`), on every device in f32; `isclose` and `nan_to_num` on
/// the special values it printed.
#[test]
fn tensor_extras_match_pytorch() {
    let want: Vec<(&str, Vec<usize>, Vec<f64>)> = vec![
        (
            "lerp scalar 0.3",
            vec![2, 3],
            vec![
                0.3372455835342407,
                0.6154977083206177,
                0.8104450702667236,
                0.8957025408744812,
                0.8597307801246643,
                0.7073985934257507,
            ],
        ),
        (
            "lerp scalar 0.8",
            vec![2, 3],
            vec![
                0.7329325675964355,
                0.8865167498588562,
                0.9201149940490723,
                0.8291800618171692,
                0.6260194182395935,
                0.33813005685806274,
            ],
        ),
        (
            "lerp tensor",
            vec![2, 3],
            vec![
                0.7829548120498657,
                0.790160596370697,
                0.8097960948944092,
                0.9447101950645447,
                1.1983776092529297,
                1.463060975074768,
            ],
        ),
        (
            "addcmul 0.5",
            vec![2, 3],
            vec![
                0.48448267579078674,
                0.7624239325523376,
                0.8878145217895508,
                0.9081865549087524,
                0.886927604675293,
                0.8601040244102478,
            ],
        ),
        (
            "addcdiv 2",
            vec![2, 3],
            vec![
                0.7223567962646484,
                1.2117235660552979,
                1.5839688777923584,
                1.766587257385254,
                1.6759769916534424,
                1.2272380590438843,
            ],
        ),
        ("diagonal", vec![3], vec![0.4794255495071411, 0.7114733457565308, -0.8715757727622986]),
        ("diagonal offset 1", vec![3], vec![0.7643289566040039, 0.40921416878700256, -0.9898797869682312]),
        ("diagonal offset -1", vec![2], vec![0.9174379706382751, -0.635308027267456]),
        (
            "diag of a vector, offset 1",
            vec![4, 4],
            vec![
                0.0,
                0.19866932928562164,
                0.0,
                0.0,
                0.0,
                0.0,
                0.5396320223808289,
                0.0,
                0.0,
                0.0,
                0.0,
                0.8075581192970276,
                0.0,
                0.0,
                0.0,
                0.0,
            ],
        ),
        ("trace", vec![], vec![0.3193231225013733]),
        (
            "outer",
            vec![3, 2],
            vec![
                0.15562303364276886,
                0.18974924087524414,
                0.42270830273628235,
                0.5154029726982117,
                0.6325820088386536,
                0.771299421787262,
            ],
        ),
        ("hardtanh -0.5 0.5", vec![2, 3], vec![0.0998334139585495, 0.45288628339767456, 0.5, 0.5, 0.5, 0.5]),
        ("relu6 of 8x", vec![2, 3], vec![0.798667311668396, 3.6230902671813965, 5.957144737243652, 6.0, 6.0, 6.0]),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let (a, b, w) = (
            on(sines(&[2, 3], 0.1, DType::F32)),
            on(sines(&[2, 3], 1.1, DType::F32)),
            on(sines(&[2, 3], 2.1, DType::F32)),
        );
        let m = on(sines(&[3, 4], 0.5, DType::F32));
        let got = [
            a.lerp(&b, 0.3),
            a.lerp(&b, 0.8),
            a.lerp(&b, &w),
            a.addcmul(&b, &w, 0.5),
            a.addcdiv(&b, &w.add(2.0), 2.0),
            m.diagonal(0, 0, 1),
            m.diagonal(1, 0, 1),
            m.diagonal(-1, 0, 1),
            on(sines(&[3], 0.2, DType::F32)).diag(1),
            m.trace(),
            on(sines(&[3], 0.2, DType::F32)).outer(&on(sines(&[2], 0.9, DType::F32))),
            F::hardtanh(&a, -0.5, 0.5),
            F::relu6(&a.mul(8.0)),
        ];
        for ((name, shape, want), got) in want.iter().zip(&got) {
            if let Err(e) = check_tensor(got, shape, &buffer(DType::F32, want), Kind::Elementwise) {
                panic!("{name} on {}: {e}", dev.describe());
            }
        }
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let x = on(Tensor::from_vec(vec![1.0f32, nan, inf, -inf, 1e-9, 100.0], [6], &data_device().unwrap()).unwrap());
        let y =
            on(Tensor::from_vec(vec![1.0f32 + 1e-6, nan, inf, inf, 0.0, 100.001], [6], &data_device().unwrap())
                .unwrap());
        let bools = |t: Tensor| t.to_vec::<bool>().unwrap();
        assert_eq!(bools(x.isclose(&y, 1e-5, 1e-8, false)), [true, false, true, false, true, true]);
        assert_eq!(bools(x.isclose(&y, 1e-5, 1e-8, true)), [true, true, true, false, true, true]);
        assert!(!x.allclose(&y, 1e-5, 1e-8, true).unwrap());
        assert!(x.allclose(&x, 0.0, 0.0, true).unwrap());
        assert_eq!(bools(x.isnan()), [false, true, false, false, false, false]);
        assert_eq!(bools(x.isinf()), [false, false, true, true, false, false]);
        assert_eq!(bools(x.isfinite()), [true, false, false, false, true, true]);
        let f = |t: Tensor| t.to_vec::<f32>().unwrap();
        assert_eq!(f(x.nan_to_num(0.0, None, None)), [1.0, 0.0, f32::MAX, -f32::MAX, 1e-9, 100.0]);
        assert_eq!(f(x.nan_to_num(-1.0, Some(7.0), Some(-7.0))), [1.0, -1.0, 7.0, -7.0, 1e-9, 100.0]);
        // hardtanh keeps a NaN (as PyTorch's clamp does).
        assert!(f(F::hardtanh(&x, -1.0, 1.0))[1].is_nan());

        // logaddexp (torch 2.15's values), and its infinities.
        let want = [
            3.606156826019287,
            4.088003635406494,
            4.203682899475098,
            4.204513072967529,
            4.143213272094727,
            3.766649007797241,
        ];
        check_tensor(&a.mul(4.0).logaddexp(&b.mul(4.0)), &[2, 3], &buffer(DType::F32, &want), Kind::Elementwise)
            .unwrap_or_else(|e| panic!("logaddexp on {}: {e}", dev.describe()));
        let l = on(Tensor::from_vec(vec![inf, -inf, -inf, 1.0], [4], &data_device().unwrap()).unwrap());
        let r = on(Tensor::from_vec(vec![inf, -inf, 2.0, nan], [4], &data_device().unwrap()).unwrap());
        let got = f(l.logaddexp(&r));
        assert_eq!(got[..3], [inf, -inf, 2.0]);
        assert!(got[3].is_nan());
        // nansum / nanmean (torch: [4, 2], [2, 2], 2).
        let n = on(Tensor::from_vec(vec![1.0f32, nan, 3.0, nan, nan, 2.0], [2, 3], &data_device().unwrap()).unwrap());
        assert_eq!(f(n.nansum(1, false)), [4.0, 2.0]);
        assert_eq!(f(n.nanmean(1, false)), [2.0, 2.0]);
        assert_eq!(f(n.nanmean(Vec::<isize>::new(), false)), [2.0]);
        // Truth reductions, NaN counting as true; over no elements any is false and all is true.
        let t = on(Tensor::from_vec(vec![0.0f32, 2.0, 0.0, nan, 1.0, -1.0], [2, 3], &data_device().unwrap()).unwrap());
        assert_eq!(bools(t.any(1, false)), [true, true]);
        assert_eq!(bools(t.all(1, false)), [false, true]);
        assert_eq!(bools(t.all(0, false)), [false, true, false]);
        let count = t.count_nonzero(1, false).to_dtype(DType::I32).to_vec::<i32>().unwrap();
        assert_eq!(count, [1, 3]);
        let empty = on(Tensor::zeros([0, 2], DType::F32, &data_device().unwrap()));
        assert_eq!(bools(empty.any(0, false)), [false, false]);
        assert_eq!(bools(empty.all(0, false)), [true, true]);
        let u = on(Tensor::from_vec(vec![true, false, true], [3], &data_device().unwrap()).unwrap());
        let v = on(Tensor::from_vec(vec![true, true, false], [3], &data_device().unwrap()).unwrap());
        assert_eq!(bools(u.logical_xor(&v)), [false, true, true]);
        // Views: movedim, expand_as, repeat_interleave, unbind.
        let c = on(Tensor::from_vec((0..24).map(|i| i as f32).collect::<Vec<_>>(), [2, 3, 4], &data_device().unwrap())
            .unwrap());
        assert_eq!(c.movedim(0, -1).dims(), [3, 4, 2]);
        assert_eq!(f(c.movedim(2, 0).contiguous()), f(c.permute([2, 0, 1]).contiguous()));
        assert_eq!(on(sines(&[3, 1], 0.0, DType::F32)).expand_as(&c).dims(), [2, 3, 4]);
        let ri = on(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], &data_device().unwrap()).unwrap());
        assert_eq!(f(ri.repeat_interleave(2, 0)), [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
        assert_eq!(f(ri.repeat_interleave(3, 1)), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0]);
        // meshgrid, as torch.meshgrid([0, 1, 2], [10, 20], indexing=...) prints.
        let (gx, gy) = (
            on(Tensor::from_vec(vec![0.0f32, 1.0, 2.0], [3], &data_device().unwrap()).unwrap()),
            on(Tensor::from_vec(vec![10.0f32, 20.0], [2], &data_device().unwrap()).unwrap()),
        );
        let ij = Tensor::meshgrid(&[&gx, &gy], false);
        assert_eq!((ij[0].dims(), ij[1].dims()), (&[3usize, 2][..], &[3usize, 2][..]));
        assert_eq!(
            (f(ij[0].clone()), f(ij[1].clone())),
            (vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0], vec![10.0, 20.0, 10.0, 20.0, 10.0, 20.0])
        );
        let xy = Tensor::meshgrid(&[&gx, &gy], true);
        assert_eq!(xy[0].dims(), [2, 3]);
        assert_eq!(
            (f(xy[0].clone()), f(xy[1].clone())),
            (vec![0.0, 1.0, 2.0, 0.0, 1.0, 2.0], vec![10.0, 10.0, 10.0, 20.0, 20.0, 20.0])
        );
        let parts = c.unbind(1);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1].dims(), [2, 4]);
        assert_eq!(f(parts[1].clone()), [4.0, 5.0, 6.0, 7.0, 16.0, 17.0, 18.0, 19.0]);
    }
}

/// `softsign`, `tanhshrink`, `hardshrink`, `softshrink`, `softmin`, `logit`, `cdist` and `pairwise_distance` against
/// the values PyTorch 2.15 printed (x = 2 sines, the shrinks of x - 1; cdist without the matrix-product path), on every
/// device in f32.
#[test]
fn shrinks_logit_and_distances_match_pytorch() {
    let want: Vec<(&str, Vec<usize>, Vec<f64>)> = vec![
        (
            "softsign",
            vec![2, 3],
            vec![
                0.16643522679805756,
                0.47527840733528137,
                0.5982784032821655,
                0.651717483997345,
                0.6666572690010071,
                0.6500951051712036,
            ],
        ),
        (
            "tanhshrink",
            vec![2, 3],
            vec![
                0.0026117265224456787,
                0.1866755485534668,
                0.5860928893089294,
                0.917526364326477,
                1.0358936786651611,
                0.9054332375526428,
            ],
        ),
        (
            "hardshrink 0.5",
            vec![2, 3],
            vec![-0.8003331422805786, 0.0, 0.0, 0.8712320327758789, 0.9999152421951294, 0.857919454574585],
        ),
        (
            "softshrink 0.5",
            vec![2, 3],
            vec![-0.3003331422805786, -0.0, 0.0, 0.3712320327758789, 0.4999152421951294, 0.35791945457458496],
        ),
        (
            "softmin dim 1",
            vec![2, 3],
            vec![
                0.5653108954429626,
                0.27901628613471985,
                0.1556728333234787,
                0.34570327401161194,
                0.3039604425430298,
                0.3503362536430359,
            ],
        ),
        (
            "logit eps 0.1",
            vec![2, 3],
            vec![
                0.8222284317016602,
                1.7195249795913696,
                2.1972243785858154,
                2.1972243785858154,
                2.1972243785858154,
                2.0809378623962402,
            ],
        ),
        (
            "cdist p2",
            vec![4, 5],
            vec![
                0.8942087292671204,
                0.959515392780304,
                2.173736095428467,
                2.4962375164031982,
                1.1804343461990356,
                0.00536963390186429,
                1.1407196521759033,
                2.78934383392334,
                3.238065004348755,
                2.0095901489257812,
                1.1592679023742676,
                0.015609671361744404,
                1.699251413345337,
                2.2455549240112305,
                1.3035144805908203,
                2.8032257556915283,
                1.726881504058838,
                0.012566483579576015,
                0.6840502023696899,
                1.221958041191101,
            ],
        ),
        (
            "cdist p1",
            vec![4, 5],
            vec![
                1.304710865020752,
                1.4712193012237549,
                3.495178461074829,
                4.2928466796875,
                2.039499282836914,
                0.008233189582824707,
                1.834177851676941,
                4.796909332275391,
                5.594577789306641,
                3.3412303924560547,
                1.8640018701553345,
                0.02684437483549118,
                2.935887336730957,
                3.733555316925049,
                1.908113718032837,
                4.820782661437988,
                2.9836251735687256,
                0.020893573760986328,
                1.0013281106948853,
                1.7528737783432007,
            ],
        ),
        (
            "pairwise_distance",
            vec![4],
            vec![0.894207239151001, 1.140721321105957, 1.6992530822753906, 0.6840513944625854],
        ),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let a = on(sines(&[2, 3], 0.1, DType::F32).mul(2.0));
        let p = on(sines(&[2, 3], 0.4, DType::F32).add(1.0).div(2.0));
        let (x1, x2) = (on(sines(&[4, 3], 0.2, DType::F32)), on(sines(&[5, 3], 1.3, DType::F32)));
        let got = [
            F::softsign(&a),
            F::tanhshrink(&a),
            F::hardshrink(&a.sub(1.0), 0.5),
            F::softshrink(&a.sub(1.0), 0.5),
            F::softmin(&a, 1),
            p.logit(Some(0.1)),
            F::cdist(&x1, &x2, 2.0),
            F::cdist(&x1, &x2, 1.0),
            F::pairwise_distance(&x1, &x2.narrow(0, 0, 4), 2.0, 1e-6, false),
        ];
        for ((name, shape, want), got) in want.iter().zip(&got) {
            if let Err(e) = check_tensor(got, shape, &buffer(DType::F32, want), kind_of(name)) {
                panic!("{name} on {}: {e}", dev.describe());
            }
        }
    }
}
