//! Activations: their formulas, the values PyTorch printed, gradients in the tails and at zero, PReLU, and the
//! exact GELU's erf and erfc within their documented accuracy.

use super::*;

#[test]
fn activations_match_their_formulas() {
    let xs = [-3.0, -1.5, -0.25, 0.0, 0.25, 1.0, 2.5];
    let n = xs.len();
    for dtype in FLOATS {
        let x = tensor(dtype, &xs, &[n]);
        let x64: Vec<f64> = vals(&x);
        let map = |f: &dyn Fn(f64) -> f64| x64.iter().map(|&v| f(v)).collect::<Vec<_>>();
        check(&F::relu(&x), &[n], &map(&|v| v.max(0.0)), Kind::Exact);
        check(&F::leaky_relu(&x, 0.1), &[n], &map(&|v| if v > 0.0 { v } else { 0.1 * v }), Kind::Elementwise);
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        check(&F::sigmoid(&x), &[n], &map(&sig), Kind::Elementwise);
        check(&F::silu(&x), &[n], &map(&|v| v * sig(v)), Kind::Elementwise);
        check(&F::tanh(&x), &[n], &map(&f64::tanh), Kind::Elementwise);
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let gelu_tanh = |v: f64| 0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh());
        check(&F::gelu(&x, Approximate::Tanh), &[n], &map(&gelu_tanh), Kind::Elementwise);
        // Modules are the same functions.
        check(&ReLU.forward(&x), &[n], &map(&|v| v.max(0.0)), Kind::Exact);
        check(
            &LeakyReLU::default().forward(&x),
            &[n],
            &map(&|v| if v > 0.0 { v } else { 0.01 * v }),
            Kind::Elementwise,
        );
        check(&SiLU.forward(&x), &[n], &map(&|v| v * sig(v)), Kind::Elementwise);
        check(&Tanh.forward(&x), &[n], &map(&f64::tanh), Kind::Elementwise);
        let sm = F::softmax(&x, 0);
        let total: f64 = x64.iter().map(|v| v.exp()).sum();
        check(&sm, &[n], &map(&|v| v.exp() / total), Kind::Accumulate);
        check(&F::log_softmax(&x, 0), &[n], &map(&|v| v - total.ln()), Kind::Accumulate);
    }
    // relu keeps NaN, as PyTorch's.
    let nan = tensor(DType::F32, &[f64::NAN, -1.0], &[2]);
    assert!(vals(&F::relu(&nan))[0].is_nan());
}

/// Inputs of `more_activations_match_pytorch`: both tails (past softplus's threshold), both zeros, the kinks of the
/// hard activations, the specials.
const ACT_X: [f64; 18] =
    [-30.0, -4.0, -3.0, -1.5, -0.25, -0.0, 0.0, 0.0001, 0.25, 1.0, 2.9, 3.0, 4.0, 19.9, 20.5, INF, -INF, NAN];
const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

/// An activation as a function of its input.
type Act = fn(&Tensor) -> Tensor;

/// What PyTorch 2.15 printed for `ACT_X` in f32 (`torch.nn.functional`, defaults unless named).
fn activation_values() -> Vec<(&'static str, Act, [f64; 18])> {
    vec![
        (
            "softplus",
            |x| F::softplus(x, 1.0, 20.0),
            [
                9.357622912219837e-14,
                0.018149929121136665,
                0.04858735203742981,
                0.20141328871250153,
                0.575939416885376,
                0.6931471824645996,
                0.6931471824645996,
                0.6931971907615662,
                0.825939416885376,
                1.31326162815094,
                2.9535627365112305,
                3.0485873222351074,
                4.0181498527526855,
                19.899999618530273,
                20.5,
                INF,
                0.0,
                NAN,
            ],
        ),
        (
            "softplus beta 2 threshold 5",
            |x| F::softplus(x, 2.0, 5.0),
            [
                4.37825544636038e-27,
                0.00016770318325143307,
                0.0012378426035866141,
                0.024293676018714905,
                0.2370384931564331,
                0.3465735912322998,
                0.3465735912322998,
                0.34662359952926636,
                0.4870384931564331,
                1.0634640455245972,
                2.9000000953674316,
                3.0,
                4.0,
                19.899999618530273,
                20.5,
                INF,
                0.0,
                NAN,
            ],
        ),
        (
            "elu",
            |x| F::elu(x, 1.0),
            [
                -1.0,
                -0.9816843867301941,
                -0.9502129554748535,
                -0.7768698334693909,
                -0.22119921445846558,
                -0.0,
                0.0,
                9.999999747378752e-05,
                0.25,
                1.0,
                2.9000000953674316,
                3.0,
                4.0,
                19.899999618530273,
                20.5,
                INF,
                -1.0,
                NAN,
            ],
        ),
        (
            "elu alpha 0.5",
            |x| F::elu(x, 0.5),
            [
                -0.5,
                -0.49084219336509705,
                -0.47510647773742676,
                -0.38843491673469543,
                -0.11059960722923279,
                -0.0,
                0.0,
                9.999999747378752e-05,
                0.25,
                1.0,
                2.9000000953674316,
                3.0,
                4.0,
                19.899999618530273,
                20.5,
                INF,
                -0.5,
                NAN,
            ],
        ),
        (
            "selu",
            F::selu,
            [
                -1.7580993175506592,
                -1.7258986234664917,
                -1.6705687046051025,
                -1.3658143281936646,
                -0.38889017701148987,
                -0.0,
                0.0,
                0.00010507010301807895,
                0.2626752555370331,
                1.0507010221481323,
                3.0470330715179443,
                3.1521029472351074,
                4.202804088592529,
                20.908950805664062,
                21.539371490478516,
                INF,
                -1.7580993175506592,
                NAN,
            ],
        ),
        (
            "celu alpha 0.5",
            |x| F::celu(x, 0.5),
            [
                -0.5,
                -0.49983227252960205,
                -0.4987606108188629,
                -0.47510647773742676,
                -0.19673466682434082,
                -0.0,
                0.0,
                9.999999747378752e-05,
                0.25,
                1.0,
                2.9000000953674316,
                3.0,
                4.0,
                19.899999618530273,
                20.5,
                INF,
                -0.5,
                NAN,
            ],
        ),
        (
            "mish",
            F::mish,
            [
                -2.807286954981114e-12,
                -0.07259175181388855,
                -0.14564746618270874,
                -0.2980997562408447,
                -0.12992696464061737,
                -0.0,
                0.0,
                6.000319990562275e-05,
                0.1695723980665207,
                0.8650983572006226,
                2.8842668533325195,
                2.98653507232666,
                3.997412919998169,
                19.899999618530273,
                20.5,
                INF,
                NAN,
                NAN,
            ],
        ),
        (
            "hardsigmoid",
            F::hardsigmoid,
            [
                0.0,
                0.0,
                0.0,
                0.25,
                0.4583333432674408,
                0.5,
                0.5,
                0.5000166296958923,
                0.5416666865348816,
                0.6666666865348816,
                0.9833333492279053,
                1.0,
                1.0,
                1.0,
                1.0,
                1.0,
                0.0,
                NAN,
            ],
        ),
        (
            "hardswish",
            F::hardswish,
            [
                -0.0,
                -0.0,
                -0.0,
                -0.375,
                -0.1145833358168602,
                -0.0,
                0.0,
                5.00016612932086e-05,
                0.1354166716337204,
                0.6666666865348816,
                2.8516666889190674,
                3.0,
                4.0,
                19.899999618530273,
                20.5,
                INF,
                NAN,
                NAN,
            ],
        ),
    ]
}

/// softplus, elu, selu, celu, mish, hardsigmoid and hardswish against values PyTorch printed in f32, on every
/// device and float dtype: f64 within f32's tolerance of them, f16 and bf16 (computed in f32, rounded once) within
/// theirs.
#[test]
fn more_activations_match_pytorch() {
    let n = ACT_X.len();
    for dev in devices() {
        for dtype in FLOATS {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let x = tensor(dtype, &ACT_X, &[n]).to_device(&dev).unwrap();
            for (name, f, want) in activation_values() {
                // f64 is held to f32's tolerance of PyTorch's f32 values; f16 and bf16 to theirs, of the values
                // rounded to them.
                let (got, class) =
                    if dtype == DType::F64 { (f(&x).to_dtype(DType::F32), DType::F32) } else { (f(&x), dtype) };
                if let Err(e) = check_tensor(&got, &[n], &buffer(class, &want), Kind::Elementwise) {
                    panic!("{name} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
}

/// In the tails, where one branch of an activation's select overflows, the gradient is the other branch's (1 or
/// 0), never `0 * inf = NaN`.
#[test]
fn activation_gradients_stay_finite_in_the_tails() {
    let x = Tensor::from_vec(vec![-200.0f32, -90.0, 90.0, 200.0], [4], &Device::cpu()).unwrap().requires_grad();
    // sigmoid's `exp(-x)` is inf below about -88.7 where the sigmoid has rounded to 0: PyTorch's gradient there is
    // 0, and so is kiln's (its own rule from the output); silu and logsigmoid go through it or around it.
    let cases: [(&str, Act, [f64; 4]); 8] = [
        ("softplus", |x| F::softplus(x, 1.0, 20.0), [0.0, 0.0, 1.0, 1.0]),
        // Its own rule: the sigmoid of `2u` is 0 or 1 there, and the derivative's second term `x s (1 - s) ..`
        // a zero times finite factors.
        ("gelu (tanh)", |x| F::gelu(x, Approximate::Tanh), [0.0, 0.0, 1.0, 1.0]),
        ("elu", |x| F::elu(x, 1.0), [0.0, 0.0, 1.0, 1.0]),
        ("celu", |x| F::celu(x, 0.5), [0.0, 0.0, 1.0, 1.0]),
        ("mish", F::mish, [0.0, 0.0, 1.0, 1.0]),
        ("sigmoid", F::sigmoid, [0.0, 0.0, 0.0, 0.0]),
        ("silu", F::silu, [0.0, 0.0, 1.0, 1.0]),
        ("logsigmoid", F::logsigmoid, [1.0, 1.0, 0.0, 0.0]),
    ];
    for (name, f, want) in cases {
        let grads = f(&x).sum_all().backward().unwrap();
        let g = vals(grads.get(&x).unwrap());
        for (i, (&got, &w)) in g.iter().zip(&want).enumerate() {
            assert!((got - w).abs() <= 1e-6, "{name}: d/dx at {} is {got}, want {w}", [-200.0, -90.0, 90.0, 200.0][i]);
        }
    }
}

/// PReLU (functional and module) against PyTorch 2.15: `F.prelu(x, w)` with a weight per channel of x `[2, 3, 2]`,
/// and the weight's gradient of `sum(y * u)`.
#[test]
fn prelu_matches_pytorch() {
    let want = [
        1.892600178718567,
        1.5307098627090454,
        0.961645245552063,
        0.26242637634277344,
        -0.7084659337997437,
        -1.714684009552002,
        -0.4148045778274536,
        -0.4876866638660431,
        0.9891252517700195,
        0.8690037131309509,
        -1.8938000202178955,
        -0.9242717027664185,
    ];
    let want_grad = [-1.4518457651138306, 1.0492002964019775, 0.11721277236938477];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let x = on(sines(&[2, 3, 2], 1.9, DType::F32).mul(2.0));
        let m = PReLU::new(3, 0.25, &dev);
        let w = on(Tensor::from_vec(vec![0.25f32, -0.5, 1.5], [3], &data_device().unwrap()).unwrap());
        m.weight().set(w);
        let y = m.forward(&x);
        check_tensor(&y, &[2, 3, 2], &buffer(DType::F32, &want), Kind::Elementwise)
            .unwrap_or_else(|e| panic!("prelu on {}: {e}", dev.describe()));
        let weight = m.weight().get();
        let g = y.mul(on(sines(&[2, 3, 2], 0.3, DType::F32))).sum_all().backward().unwrap();
        check_tensor(g.get(&weight).unwrap(), &[3], &buffer(DType::F32, &want_grad), Kind::Accumulate)
            .unwrap_or_else(|e| panic!("prelu's weight gradient on {}: {e}", dev.describe()));
        assert_eq!(m.named_params().len(), 1);
    }
}

/// Reference values of Φ-based GELU, erf and erfc from Python's `math.erf`/`math.erfc` (correctly rounded to a
/// few ulp in f64).
const GELU_X: [f64; 13] = [-6.0, -3.5, -2.0, -1.0, -0.5, -0.1, 0.0, 0.1, 0.5, 1.0, 2.0, 3.5, 6.0];
const GELU_WANT: [f64; 13] = [
    -5.919525870226207e-09,
    -0.0008142017766243376,
    -0.04550026389635844,
    -0.15865525393145707,
    -0.15426876936299344,
    -0.0460172162722971,
    0.0,
    0.053982783727702904,
    0.34573123063700656,
    0.8413447460685429,
    1.9544997361036416,
    3.4991857982233756,
    5.999999994080474,
];
const ERF_X: [f64; 14] = [-4.0, -2.5, -1.0, -0.6, -0.3, -1e-3, 0.0, 1e-4, 0.2, 0.49, 0.51, 1.5, 3.0, 5.0];
const ERF_WANT: [f64; 14] = [
    -0.9999999845827421,
    -0.999593047982555,
    -0.8427007929497149,
    -0.6038560908479259,
    -0.3286267594591274,
    -0.0011283787909692365,
    0.0,
    0.00011283791633342487,
    0.22270258921047847,
    0.511668261188523,
    0.5292436198411704,
    0.9661051464753108,
    0.9999779095030014,
    0.9999999999984626,
];
const ERFC_WANT: [f64; 14] = [
    1.999999984582742,
    1.999593047982555,
    1.842700792949715,
    1.603856090847926,
    1.3286267594591274,
    1.0011283787909693,
    1.0,
    0.9998871620836666,
    0.7772974107895215,
    0.4883317388114769,
    0.4707563801588296,
    0.033894853524689274,
    2.2090496998585438e-05,
    1.5374597944280351e-12,
];

#[test]
fn exact_gelu_erf_and_erfc_are_within_the_documented_accuracy() {
    // In f64 the only error is the approximation: erfc's relative error < 1.2e-7 (Numerical Recipes' bound);
    // GELU inherits it relatively in both tails; erf's small-argument series is far more accurate.
    let x = tensor(DType::F64, &GELU_X, &[13]);
    close(&vals(&F::gelu(&x, Approximate::None)), &GELU_WANT, 1.3e-7, 1e-300);
    close(&vals(&GELU::default().forward(&x)), &GELU_WANT, 1.3e-7, 1e-300);
    let x = tensor(DType::F64, &ERF_X, &[14]);
    close(&vals(&F::erf(&x)), &ERF_WANT, 1.3e-7, 1e-300);
    close(&vals(&F::erfc(&x)), &ERFC_WANT, 1.3e-7, 1e-300);
    // Near 0 the series branch is exact to f64 rounding, not merely 1e-7.
    close(&vals(&F::erf(&x))[5..8], &ERF_WANT[5..8], 1e-14, 0.0);
    // f32: the same plus a few f32 roundings; in the far negative tail exp(-z²) also sees the rounding of z²
    // (relative error ~ z² eps), which stays far below 1e-9 absolute (PyTorch's f32 `1 + erf` cancels to 0 there).
    let x = tensor(DType::F32, &GELU_X, &[13]);
    close(&vals(&F::gelu(&x, Approximate::None)), &GELU_WANT, 5e-7, 1e-9);
}

#[test]
fn relu_and_leaky_relu_gradients_at_zero_follow_pytorch() {
    let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3], &dev()).unwrap().requires_grad();
    let g = F::relu(&x).sum_all().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f32>().unwrap(), [0.0, 0.0, 1.0]);
    let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3], &dev()).unwrap().requires_grad();
    let g = F::leaky_relu(&x, 0.2).sum_all().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f32>().unwrap(), [0.2, 0.2, 1.0]);
    // gelu'(0) = 1/2 exactly for both forms (Φ(0) = 1/2).
    for approx in [Approximate::None, Approximate::Tanh] {
        let x = Tensor::from_vec(vec![0.0f64], [1], &dev()).unwrap().requires_grad();
        let g = F::gelu(&x, approx).sum_all().backward().unwrap();
        close(&vals(g.get(&x).unwrap()), &[0.5], 1e-7, 0.0);
    }
}

/// The tanh GELU's gradient in f32 (its own rule: the stored derivative `d`, from `s = sigmoid(2u)`) against
/// PyTorch's formula in f64, `(1 + t)/2 + x/2 (1 - t^2) k (1 + 3 * 0.044715 x^2)` with `t = tanh(u)`, at every
/// step of 0.0012 over [-12, 12] and in the tails: within 4e-7 (a few ulp of the derivative's values, up to ~1.13),
/// no NaN. Where `s` rounds to a few ulp below 1 (x near 5), `1 - s` would cancel to a multiple of 6e-8 and the
/// derivative be off by up to ~2e-6; PyTorch's own f32 tanh form is off by up to ~1e-6 there (`1 - t^2`).
#[test]
fn tanh_gelu_gradient_is_accurate_in_f32() {
    let mut xs: Vec<f32> = (0..=20000).map(|i| -12.0 + 24.0 * i as f32 / 20000.0).collect();
    xs.extend([-200.0, -90.0, -10.5, 10.5, 90.0, 200.0]);
    let x = Tensor::from_vec(xs.clone(), [xs.len()], &dev()).unwrap().requires_grad();
    let g = F::gelu(&x, Approximate::Tanh).sum_all().backward().unwrap();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let want: Vec<f64> = xs
        .iter()
        .map(|&x| {
            let x = x as f64;
            let t = (k * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x)
        })
        .collect();
    let got = vals(g.get(&x).unwrap());
    assert!(got.iter().all(|v| !v.is_nan()));
    close(&got, &want, 0.0, 4e-7);
}
