//! `kiln::nn`: every module's and function's forward against hand-computed values or a plain-Rust reference in
//! f64, the gradients where PyTorch's convention differs from a naive composition, and Dropout's randomness.
//!
//! Tests that draw random numbers (`Linear::new`, `Dropout`, `manual_seed`) need no lock: each test runs on its own
//! thread, and each thread has its own default generator.

// Every body runs on the CPU (cargo feature `cpu`); `tests/op_table/` holds every device to the same ops.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::*;
use kiln::nn::functional::{self as F, Approximate, Reduction};
use kiln::nn::{
    Dropout, Embedding, Flatten, Func, GELU, Identity, LayerNorm, LeakyReLU, Linear, Module, PReLU, Param, ReLU,
    Sequential, SiLU, Tanh, Unflatten, Upsample,
};
use kiln::{DType, Device, Tensor};

fn dev() -> Device {
    Device::cpu()
}

/// `t` has `shape` and values within `kind`'s tolerance of `want` (computed in f64, rounded once to t's dtype).
#[track_caller]
fn check(t: &Tensor, shape: &[usize], want: &[f64], kind: Kind) {
    if let Err(e) = check_tensor(t, shape, &buffer(t.dtype(), want), kind) {
        panic!("{e}");
    }
}

/// `|got - want| <= abs + rel |want|` elementwise, for results whose error budget is not the table's (the erf
/// approximation).
#[track_caller]
fn close(got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= abs + rel * w.abs(), "[{i}] got {g:e}, want {w:e} (rel {rel:e}, abs {abs:e})");
    }
}

/// Naive `x @ w^T + b` for `x` [n, k], `w` [m, k].
fn linear_ref(x: &[f64], w: &[f64], b: Option<&[f64]>, n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            let dot: f64 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
            out[i * m + j] = dot + b.map_or(0.0, |b| b[j]);
        }
    }
    out
}

#[test]
fn linear_forward_matches_reference_with_and_without_bias() {
    for dtype in FLOATS {
        let (n, k, m) = (5, 4, 3);
        let x = data(dtype, n * k, 1, Dom::Cont(-2.0, 2.0));
        let w = data(dtype, m * k, 2, Dom::Cont(-1.0, 1.0));
        let b = data(dtype, m, 3, Dom::Cont(-1.0, 1.0));
        let xt = tensor(dtype, &x, &[n, k]);
        let with_bias = Linear::from_weight(tensor(dtype, &w, &[m, k]), Some(tensor(dtype, &b, &[m])));
        check(&with_bias.forward(&xt), &[n, m], &linear_ref(&x, &w, Some(&b), n, k, m), Kind::Accumulate);
        let no_bias = Linear::from_weight(tensor(dtype, &w, &[m, k]), None);
        check(&no_bias.forward(&xt), &[n, m], &linear_ref(&x, &w, None, n, k, m), Kind::Accumulate);
        assert_eq!(no_bias.named_params().len(), 1);
        assert_eq!((with_bias.in_features(), with_bias.out_features()), (k, m));
        // Leading batch dims: [2, n, k] -> [2, n, m], each batch row as the 2-d case.
        let x3 = tensor(dtype, &[x.clone(), x.clone()].concat(), &[2, n, k]);
        let want = linear_ref(&x, &w, Some(&b), n, k, m);
        check(&with_bias.forward(&x3), &[2, n, m], &[want.clone(), want].concat(), Kind::Accumulate);
    }
}

#[test]
fn linear_default_init_is_uniform_in_one_over_sqrt_fan_in() {
    let (k, m) = (16, 32);
    let lin = Linear::new(k, m, true, &dev());
    let names: Vec<String> = lin.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    // PyTorch's names for the same lists.
    let torch_names: Vec<String> = lin.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(torch_names, names);
    assert!(lin.parameters().iter().zip(lin.params()).all(|(a, b)| a.ptr_eq(&b)));
    let w = lin.weight().get();
    let b = lin.bias().unwrap().get();
    assert_eq!((w.dims(), b.dims(), w.dtype()), (&[m, k][..], &[m][..], DType::F32));
    assert!(w.is_requires_grad() && b.is_requires_grad());
    let bound = 1.0 / (k as f64).sqrt();
    let wv = vals(&w);
    for v in wv.iter().chain(&vals(&b)) {
        assert!(-bound <= *v && *v < bound, "{v} outside [-{bound}, {bound})");
    }
    // 512 uniform draws: mean 0 with sd bound/sqrt(3*512) ~ 0.0064; variance bound^2/3 within 15%.
    let mean = wv.iter().sum::<f64>() / wv.len() as f64;
    let var = wv.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / wv.len() as f64;
    assert!(mean.abs() < 0.03, "mean {mean}");
    assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.15, "var {var}");
}

#[test]
fn init_helpers_have_the_stated_distributions() {
    kiln::manual_seed(11);
    let fan_in = 50;
    let n = 20_000;
    let kn = vals(&kiln::nn::init::kaiming_normal([n], fan_in, &dev()));
    let var = kn.iter().map(|v| v * v).sum::<f64>() / n as f64;
    assert!((var / (2.0 / fan_in as f64) - 1.0).abs() < 0.05, "kaiming_normal var {var}");
    let ku = vals(&kiln::nn::init::kaiming_uniform([n], fan_in, &dev()));
    let bound = (6.0 / fan_in as f64).sqrt();
    assert!(ku.iter().all(|v| v.abs() <= bound));
    let var = ku.iter().map(|v| v * v).sum::<f64>() / n as f64;
    assert!((var / (2.0 / fan_in as f64) - 1.0).abs() < 0.05, "kaiming_uniform var {var}");
    assert_eq!(vals(&kiln::nn::init::zeros([3], &dev())), [0.0; 3]);
    assert_eq!(vals(&kiln::nn::init::ones([2], &dev())), [1.0; 2]);
    // Reproducible: the same seed gives the same init.
    kiln::manual_seed(5);
    let a = vals(&kiln::nn::init::kaiming_normal([4, 3], 3, &dev()));
    kiln::manual_seed(5);
    assert_eq!(a, vals(&kiln::nn::init::kaiming_normal([4, 3], 3, &dev())));
}

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
    let cases: [(&str, Act, [f64; 4]); 4] = [
        ("softplus", |x| F::softplus(x, 1.0, 20.0), [0.0, 0.0, 1.0, 1.0]),
        ("elu", |x| F::elu(x, 1.0), [0.0, 0.0, 1.0, 1.0]),
        ("celu", |x| F::celu(x, 0.5), [0.0, 0.0, 1.0, 1.0]),
        ("mish", F::mish, [0.0, 0.0, 1.0, 1.0]),
    ];
    for (name, f, want) in cases {
        let grads = f(&x).sum_all().backward().unwrap();
        let g = vals(grads.get(&x).unwrap());
        for (i, (&got, &w)) in g.iter().zip(&want).enumerate() {
            assert!((got - w).abs() <= 1e-6, "{name}: d/dx at {} is {got}, want {w}", [-200.0, -90.0, 90.0, 200.0][i]);
        }
    }
}

/// `sin(0.37 i + c)` over `shape`: the deterministic inputs `tests/fixtures`-free attention checks share with the
/// PyTorch script that printed their values.
fn sines(shape: &[usize], c: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (0.37 * i as f64 + c).sin()).collect();
    // Rounded to f32 first, as the script's torch.float32 tensors are.
    let v: Vec<f64> = v.iter().map(|&x| x as f32 as f64).collect();
    tensor(dtype, &v, shape)
}

/// scaled_dot_product_attention against PyTorch 2.15's math backend (`F.scaled_dot_product_attention` under
/// `sdpa_kernel([SDPBackend.MATH])`, q `[1, 2, 3, 4]`, k `[1, 2, 5, 4]`, v `[1, 2, 5, 3]` from `sines`): plain,
/// causal, a bool mask and a float mask with an explicit scale, on every device in f32 and f64.
#[test]
fn attention_matches_pytorch() {
    let bmask = [true, false, true, true, false, true, true, false, false, false, false, true, true, true, true];
    let want: [(&str, [f64; 18]); 4] = [
        (
            "plain",
            [
                0.18089377880096436,
                0.24879901111125946,
                0.2830304801464081,
                0.32707270979881287,
                0.3633776009082794,
                0.350501149892807,
                -0.22949227690696716,
                -0.3759308457374573,
                -0.47148895263671875,
                0.4667249321937561,
                0.24500183761119843,
                -0.00988113135099411,
                -0.17682355642318726,
                -0.20824167132377625,
                -0.2114752233028412,
                -0.34376469254493713,
                -0.24403338134288788,
                -0.11127330362796783,
            ],
        ),
        (
            "causal",
            [
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                0.063603475689888,
                -0.20672094821929932,
                -0.4490666687488556,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.6921190023422241,
                0.8338817954063416,
                0.8627825379371643,
                0.5664563179016113,
                0.7606595158576965,
                0.8519110679626465,
            ],
        ),
        (
            "bool mask",
            [
                0.4946107566356659,
                0.4958053231239319,
                0.4298950433731079,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                -0.337502121925354,
                -0.5000522136688232,
                -0.594922661781311,
                0.24834710359573364,
                -0.05644167587161064,
                -0.35359135270118713,
                0.6921190023422241,
                0.8338817954063416,
                0.8627825379371643,
                -0.738215446472168,
                -0.7141737937927246,
                -0.5934720039367676,
            ],
        ),
        (
            "float mask, scale 0.3",
            [
                0.6519885063171387,
                0.5959458351135254,
                0.45924463868141174,
                0.3347664177417755,
                0.36486607789993286,
                0.34558290243148804,
                -0.5271095037460327,
                -0.49802181124687195,
                -0.4015291631221771,
                0.6074720621109009,
                0.4933474659919739,
                0.3124506175518036,
                -0.038292884826660156,
                -0.01759551465511322,
                0.005483321845531464,
                -0.7520922422409058,
                -0.6960276961326599,
                -0.5457590818405151,
            ],
        ),
    ];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |t: Tensor| t.to_device(&dev).unwrap();
            let (q, k, v) = (
                on(sines(&[1, 2, 3, 4], 0.1, dtype)),
                on(sines(&[1, 2, 5, 4], 0.7, dtype)),
                on(sines(&[1, 2, 5, 3], 1.3, dtype)),
            );
            let b = on(Tensor::from_vec(bmask.to_vec(), [3, 5], &data_device().unwrap()).unwrap());
            let f = on(sines(&[3, 5], 2.0, dtype).mul(2.0));
            let opts = [
                F::AttentionOptions::default(),
                F::AttentionOptions { is_causal: true, ..Default::default() },
                F::AttentionOptions { mask: Some(b), ..Default::default() },
                F::AttentionOptions { mask: Some(f), scale: Some(0.3), ..Default::default() },
            ];
            for ((name, want), o) in want.iter().zip(&opts) {
                let got = F::scaled_dot_product_attention(&q, &k, &v, o).to_dtype(DType::F32);
                if let Err(e) = check_tensor(&got, &[1, 2, 3, 3], &buffer(DType::F32, want), Kind::Accumulate) {
                    panic!("attention, {name} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
}

/// Grouped-query attention (`enable_gqa`) against PyTorch 2.15's math backend: q `[1, 4, 3, 4]` (4 heads) over k
/// `[1, 2, 5, 4]` and v `[1, 2, 5, 3]` (2 heads, each serving two query heads), from `sines`, plain and causal, on
/// every device. Query heads 0 and 1 read key head 0, so the first head's rows equal `attention_matches_pytorch`'s.
#[test]
fn grouped_query_attention_matches_pytorch() {
    let want: [(&str, [f64; 36]); 2] = [
        (
            "plain",
            [
                0.18089377880096436,
                0.24879901111125946,
                0.2830304801464081,
                0.32707270979881287,
                0.3633776009082794,
                0.350501149892807,
                -0.22949227690696716,
                -0.3759308457374573,
                -0.47148895263671875,
                -0.4883125424385071,
                -0.6369902491569519,
                -0.6994541883468628,
                0.033275529742240906,
                0.07225628197193146,
                0.10145751386880875,
                0.33560308814048767,
                0.3953161835670471,
                0.4015251696109772,
                0.18348419666290283,
                0.14552363753318787,
                0.08786718547344208,
                0.5078018307685852,
                0.2893945574760437,
                0.031818993389606476,
                0.02191944420337677,
                -0.08057275414466858,
                -0.17215986549854279,
                -0.36421632766723633,
                -0.2764684855937958,
                -0.15130189061164856,
                -0.03393298387527466,
                0.0015724152326583862,
                0.036865025758743286,
                0.5202587246894836,
                0.3178533911705017,
                0.07242804765701294,
            ],
        ),
        (
            "causal",
            [
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                0.063603475689888,
                -0.20672094821929932,
                -0.4490666687488556,
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8612896800041199,
                0.7731335759162903,
                0.5803375244140625,
                0.831832766532898,
                0.7510301470756531,
                0.5685791373252869,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.9517601132392883,
                0.88107830286026,
                0.6911466717720032,
                0.5852118730545044,
                0.4576016962528229,
                0.2680572271347046,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.7035096883773804,
                0.8359522819519043,
                0.855252742767334,
                0.6459369659423828,
                0.43092596530914307,
                0.15759111940860748,
            ],
        ),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let (q, k, v) = (
            on(sines(&[1, 4, 3, 4], 0.1, DType::F32)),
            on(sines(&[1, 2, 5, 4], 0.7, DType::F32)),
            on(sines(&[1, 2, 5, 3], 1.3, DType::F32)),
        );
        for ((name, want), is_causal) in want.iter().zip([false, true]) {
            let o = F::AttentionOptions { is_causal, enable_gqa: true, ..Default::default() };
            let got = F::scaled_dot_product_attention(&q, &k, &v, &o);
            if let Err(e) = check_tensor(&got, &[1, 4, 3, 3], &buffer(DType::F32, want), Kind::Accumulate) {
                panic!("grouped-query attention, {name} on {}: {e}", dev.describe());
            }
        }
    }
}

#[test]
#[should_panic(expected = "enable_gqa: key's 2 heads do not divide the query's 3 heads")]
fn grouped_query_attention_needs_dividing_heads() {
    let (q, k) = (sines(&[1, 3, 3, 4], 0.1, DType::F32), sines(&[1, 2, 5, 4], 0.7, DType::F32));
    let o = F::AttentionOptions { enable_gqa: true, ..Default::default() };
    F::scaled_dot_product_attention(&q, &k, &k, &o);
}

/// The tolerance class of a case named by the tables below: accumulate where the result sums (a mean or sum
/// reduction, a norm, a softmax), elementwise otherwise.
fn kind_of(name: &str) -> Kind {
    let sums = ["mean", "sum", "normalize", "cosine", "softmin", "cdist", "pairwise"];
    if sums.iter().any(|k| name.contains(k)) { Kind::Accumulate } else { Kind::Elementwise }
}

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

/// `interpolate` against the values PyTorch 2.15 printed (`tests/fixtures/interpolate.py`): nearest and
/// nearest-exact to sizes and by a scale, linear and bilinear up and down, with and without aligned corners, on
/// every device in f32.
#[test]
fn interpolate_matches_pytorch() {
    use F::{InterpolateMode as M, InterpolateOptions as O};
    let want: Vec<(&str, Vec<usize>, Vec<f64>)> = vec![
        (
            "nearest 1d size 8",
            vec![1, 2, 8],
            vec![
                0.19866932928562164,
                0.19866932928562164,
                0.5396320223808289,
                0.5396320223808289,
                0.8075581192970276,
                0.9661849737167358,
                0.9661849737167358,
                0.994043231010437,
                0.8873623609542847,
                0.8873623609542847,
                0.6605811715126038,
                0.6605811715126038,
                0.34439346194267273,
                -0.018406307324767113,
                -0.018406307324767113,
                -0.3787148594856262,
            ],
        ),
        (
            "nearest 1d size 3",
            vec![1, 2, 3],
            vec![
                0.19866932928562164,
                0.5396320223808289,
                0.9661849737167358,
                0.8873623609542847,
                0.6605811715126038,
                -0.018406307324767113,
            ],
        ),
        (
            "nearest-exact 1d size 7",
            vec![1, 2, 7],
            vec![
                0.19866932928562164,
                0.5396320223808289,
                0.5396320223808289,
                0.8075581192970276,
                0.9661849737167358,
                0.9661849737167358,
                0.994043231010437,
                0.8873623609542847,
                0.6605811715126038,
                0.6605811715126038,
                0.34439346194267273,
                -0.018406307324767113,
                -0.018406307324767113,
                -0.3787148594856262,
            ],
        ),
        (
            "nearest 2d scale 2",
            vec![1, 2, 6, 8],
            vec![
                0.3894183337688446,
                0.3894183337688446,
                0.6961352229118347,
                0.6961352229118347,
                0.9086334705352783,
                0.9086334705352783,
                0.998152494430542,
                0.998152494430542,
                0.3894183337688446,
                0.3894183337688446,
                0.6961352229118347,
                0.6961352229118347,
                0.9086334705352783,
                0.9086334705352783,
                0.998152494430542,
                0.998152494430542,
                0.952576220035553,
                0.952576220035553,
                0.7780731916427612,
                0.7780731916427612,
                0.49826163053512573,
                0.49826163053512573,
                0.15101271867752075,
                0.15101271867752075,
                0.952576220035553,
                0.952576220035553,
                0.7780731916427612,
                0.7780731916427612,
                0.49826163053512573,
                0.49826163053512573,
                0.15101271867752075,
                0.15101271867752075,
                -0.21667508780956268,
                -0.21667508780956268,
                -0.5550369024276733,
                -0.5550369024276733,
                -0.81827712059021,
                -0.81827712059021,
                -0.9707673192024231,
                -0.9707673192024231,
                -0.21667508780956268,
                -0.21667508780956268,
                -0.5550369024276733,
                -0.5550369024276733,
                -0.81827712059021,
                -0.81827712059021,
                -0.9707673192024231,
                -0.9707673192024231,
                -0.9918687343597412,
                -0.9918687343597412,
                -0.8787254095077515,
                -0.8787254095077515,
                -0.6466506719589233,
                -0.6466506719589233,
                -0.32705482840538025,
                -0.32705482840538025,
                -0.9918687343597412,
                -0.9918687343597412,
                -0.8787254095077515,
                -0.8787254095077515,
                -0.6466506719589233,
                -0.6466506719589233,
                -0.32705482840538025,
                -0.32705482840538025,
                0.0368063785135746,
                0.0368063785135746,
                0.39568600058555603,
                0.39568600058555603,
                0.7010113596916199,
                0.7010113596916199,
                0.9114581346511841,
                0.9114581346511841,
                0.0368063785135746,
                0.0368063785135746,
                0.39568600058555603,
                0.39568600058555603,
                0.7010113596916199,
                0.7010113596916199,
                0.9114581346511841,
                0.9114581346511841,
                0.9985433220863342,
                0.9985433220863342,
                0.9504804015159607,
                0.9504804015159607,
                0.7737743258476257,
                0.7737743258476257,
                0.4923416078090668,
                0.4923416078090668,
                0.9985433220863342,
                0.9985433220863342,
                0.9504804015159607,
                0.9504804015159607,
                0.7737743258476257,
                0.7737743258476257,
                0.4923416078090668,
                0.4923416078090668,
            ],
        ),
        (
            "linear 1d size 8",
            vec![1, 2, 8],
            vec![
                0.19866932928562164,
                0.3478405177593231,
                0.5563774108886719,
                0.7238312363624573,
                0.8571290373802185,
                0.9562708139419556,
                0.9818552732467651,
                0.994043231010437,
                0.8873623609542847,
                0.7881456017494202,
                0.6408194303512573,
                0.4432021379470825,
                0.231018528342247,
                0.004268677905201912,
                -0.22107987105846405,
                -0.3787148594856262,
            ],
        ),
        (
            "linear 1d size 3 align",
            vec![1, 2, 3],
            vec![
                0.19866932928562164,
                0.8075581192970276,
                0.994043231010437,
                0.8873623609542847,
                0.34439346194267273,
                -0.3787148594856262,
            ],
        ),
        (
            "bilinear 2d size 5x3",
            vec![1, 2, 5, 3],
            vec![
                0.44053781032562256,
                0.8023843765258789,
                0.9832326769828796,
                0.6337196230888367,
                0.7366975545883179,
                0.6734945774078369,
                0.9234923720359802,
                0.6381673812866211,
                0.2088874876499176,
                0.2055555135011673,
                -0.15672743320465088,
                -0.4836565852165222,
                -0.27306875586509705,
                -0.6866570711135864,
                -0.9453522562980652,
                -0.9730114936828613,
                -0.7626880407333374,
                -0.3803207576274872,
                -0.5451590418815613,
                -0.23827332258224487,
                0.12236108630895615,
                0.09661965817213058,
                0.5483486652374268,
                0.8763837218284607,
                0.6329677104949951,
                0.7366159558296204,
                0.6741016507148743,
                0.9905328154563904,
                0.8621273636817932,
                0.5392469763755798,
            ],
        ),
        (
            "bilinear 2d scale 1.5 align",
            vec![1, 2, 4, 6],
            vec![
                0.3894183337688446,
                0.5734484791755676,
                0.7386348843574524,
                0.8661338090896606,
                0.9444410800933838,
                0.998152494430542,
                0.7648569345474243,
                0.7563990950584412,
                0.7276188731193542,
                0.6581939458847046,
                0.5543884038925171,
                0.43339261412620544,
                0.5628257393836975,
                0.42535215616226196,
                0.27884551882743835,
                0.11427289247512817,
                -0.053516436368227005,
                -0.22291399538516998,
                -0.21667508780956268,
                -0.41969218850135803,
                -0.6076849699020386,
                -0.7656291127204895,
                -0.8792732357978821,
                -0.9707673192024231,
                -0.9918687343597412,
                -0.9239827394485474,
                -0.8323104381561279,
                -0.6930655837059021,
                -0.5188122987747192,
                -0.32705482840538025,
                -0.3060852885246277,
                -0.13990476727485657,
                0.027063939720392227,
                0.19560904800891876,
                0.3505226671695709,
                0.49862051010131836,
                0.35738539695739746,
                0.49132466316223145,
                0.6095471382141113,
                0.6963360905647278,
                0.7438604831695557,
                0.7717525959014893,
                0.9985433220863342,
                0.9697055220603943,
                0.9151391983032227,
                0.8091155290603638,
                0.6612012386322021,
                0.4923416078090668,
            ],
        ),
        (
            "bilinear 2d scale 0.5",
            vec![1, 2, 1, 2],
            vec![0.7040507793426514, 0.6390150785446167, -0.3595254421234131, 0.1596909910440445],
        ),
    ];
    let size =
        |s: &[usize], mode: M, align_corners: bool| O { size: Some(s.to_vec()), mode, align_corners, ..O::default() };
    let scale =
        |s: f64, mode: M, align_corners: bool| O { scale_factor: Some(vec![s]), mode, align_corners, ..O::default() };
    let cases: [(usize, O); 9] = [
        (1, size(&[8], M::Nearest, false)),
        (1, size(&[3], M::Nearest, false)),
        (1, size(&[7], M::NearestExact, false)),
        (2, scale(2.0, M::Nearest, false)),
        (1, size(&[8], M::Linear, false)),
        (1, size(&[3], M::Linear, true)),
        (2, size(&[5, 3], M::Linear, false)),
        (2, scale(1.5, M::Linear, true)),
        (2, scale(0.5, M::Linear, false)),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let x1 = on(sines(&[1, 2, 5], 0.2, DType::F32));
        let x2 = on(sines(&[1, 2, 3, 4], 0.4, DType::F32));
        for ((name, shape, want), (spatial, o)) in want.iter().zip(&cases) {
            let got = F::interpolate(if *spatial == 1 { &x1 } else { &x2 }, o);
            if let Err(e) = check_tensor(&got, shape, &buffer(DType::F32, want), Kind::Elementwise) {
                panic!("interpolate {name} on {}: {e}", dev.describe());
            }
        }
    }
}

#[test]
#[should_panic(expected = "interpolate: give exactly one of size and scale_factor")]
fn interpolate_needs_a_size_or_a_scale() {
    F::interpolate(&sines(&[1, 1, 4], 0.0, DType::F32), &F::InterpolateOptions::default());
}

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

/// Misuse of scaled_dot_product_attention is refused at the caller's line, naming what does not fit.
#[test]
#[should_panic(expected = "give a mask or is_causal, not both")]
fn attention_refuses_a_mask_with_is_causal() {
    let q = sines(&[2, 3], 0.0, DType::F32);
    let o = F::AttentionOptions { is_causal: true, mask: Some(sines(&[2, 2], 0.0, DType::F32)), ..Default::default() };
    F::scaled_dot_product_attention(&q, &q, &q, &o);
}

#[test]
#[should_panic(expected = "key's last dim 2 is not the query's 3")]
fn attention_refuses_mismatched_head_dims() {
    let (q, k) = (sines(&[2, 3], 0.0, DType::F32), sines(&[4, 2], 0.0, DType::F32));
    F::scaled_dot_product_attention(&q, &k, &k, &F::AttentionOptions::default());
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

#[test]
fn dropout_is_reproducible_under_manual_seed_and_preserves_the_mean() {
    let x = Tensor::ones([20_000], DType::F32, &dev());
    let p = 0.3;
    let drop = Dropout::new(p);
    kiln::manual_seed(123);
    let a = vals(&drop.forward(&x));
    kiln::manual_seed(123);
    let b = vals(&drop.forward(&x));
    assert_eq!(a, b, "same seed, same mask");
    let c = vals(&drop.forward(&x));
    assert_ne!(a, c, "the next draw is a new mask");
    // Kept elements are scaled by 1/(1-p); about p of them are dropped; the mean stays 1.
    let scale = (1.0 / (1.0 - p)) as f32 as f64;
    assert!(a.iter().all(|&v| v == 0.0 || v == scale), "values other than 0 and 1/(1-p)");
    let dropped = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
    // Binomial sd of the fraction: sqrt(p(1-p)/n) ~ 0.0032; 5 sd.
    assert!((dropped - p).abs() < 0.017, "dropped fraction {dropped}");
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    assert!((mean - 1.0).abs() < 0.025, "mean {mean}");
    // Evaluation mode (and p = 0) is the identity.
    drop.eval();
    assert!(!drop.is_training());
    assert!(vals(&drop.forward(&x)).iter().all(|&v| v == 1.0));
    drop.train(true);
    assert!(drop.is_training());
    assert!(vals(&Dropout::new(0.0).forward(&x)).iter().all(|&v| v == 1.0));
    assert!(vals(&Dropout::new(1.0).forward(&x)).iter().all(|&v| v == 0.0));
    // The gradient is the same mask, scaled.
    kiln::manual_seed(9);
    let xg = Tensor::ones([1000], DType::F64, &dev()).requires_grad();
    let y = drop.forward(&xg);
    let g = y.sum_all().backward().unwrap();
    assert_eq!(vals(g.get(&xg).unwrap()), vals(&y));
}

#[test]
fn embedding_looks_rows_up_and_accumulates_their_gradient() {
    let w = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
    let emb = Embedding::from_weight(tensor(DType::F32, &w, &[4, 2]));
    let idx = Tensor::from_vec(vec![2i64, 0, 2, 3], [2, 2], &dev()).unwrap();
    let out = emb.forward(&idx);
    check(&out, &[2, 2, 2], &[20.0, 21.0, 0.0, 1.0, 20.0, 21.0, 30.0, 31.0], Kind::Exact);
    let weight = emb.weight().get();
    let g = out.sum_all().backward().unwrap();
    // Row 2 is used twice, rows 0 and 3 once, row 1 never.
    check(g.get(&weight).unwrap(), &[4, 2], &[1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 1.0, 1.0], Kind::Exact);
    let one_hot = F::one_hot(&Tensor::from_vec(vec![1i64, 0], [2], &dev()).unwrap(), 3);
    assert_eq!(one_hot.to_vec::<i64>().unwrap(), [0, 1, 0, 1, 0, 0]);
    // An index out of range is an error when the output is read, naming the index and the table's size.
    let idx = Tensor::from_vec(vec![1i64, 4, -1, 3], [4], &dev()).unwrap();
    let err = emb.forward(&idx).to_host().unwrap_err().to_string();
    assert!(err.contains("index 4 is out of range for a dimension of size 4"), "{err}");
}

/// Values from PyTorch 2.15: `nn.Embedding.from_pretrained(w, freeze=False, padding_idx=-3)` over this table and
/// these indices, then `out.sum().backward()`: row 1 (the padding entry) is looked up twice and gets no gradient.
#[test]
fn an_embedding_padding_entry_passes_no_gradient() {
    let w = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
    let emb = Embedding::from_weight(tensor(DType::F32, &w, &[4, 2])).padding_idx(-3);
    assert_eq!(emb.padding(), Some(1));
    let idx = Tensor::from_vec(vec![1i64, 0, 2, 1], [2, 2], &dev()).unwrap();
    let out = emb.forward(&idx);
    check(&out, &[2, 2, 2], &[10.0, 11.0, 0.0, 1.0, 20.0, 21.0, 10.0, 11.0], Kind::Exact);
    let weight = emb.weight().get();
    let g = out.sum_all().backward().unwrap();
    check(g.get(&weight).unwrap(), &[4, 2], &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0], Kind::Exact);
    // i32 indices, through the functional form.
    let idx32 = Tensor::from_vec(vec![1i32, 3], [2], &dev()).unwrap();
    let g = F::embedding_padded(&idx32, &weight, 1).sum_all().backward().unwrap();
    check(g.get(&weight).unwrap(), &[4, 2], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0], Kind::Exact);
    // The constructor zeroes the padding row, as `nn.Embedding(5, 3, padding_idx=4)`, on every device.
    for d in devices() {
        let fresh = Embedding::with_padding_idx(5, 3, 4, &d);
        let rows = fresh.weight().get().to_vec::<f32>().unwrap();
        assert_eq!(rows[12..], [0.0; 3], "{}", d.describe());
        assert!(rows[..12].iter().any(|&v| v != 0.0), "{}", d.describe());
    }
}

#[test]
#[should_panic(expected = "padding_idx 4 is out of range for 4 embeddings (it must be in -4..4)")]
fn an_embedding_padding_entry_outside_the_table_is_refused() {
    let _ = Embedding::from_weight(Tensor::zeros([4, 2], DType::F32, &dev())).padding_idx(4);
}

#[test]
fn flatten_identity_and_upsample_modules() {
    let v: Vec<f32> = (0..120).map(|i| i as f32).collect();
    let x = Tensor::from_vec(v.clone(), [2, 3, 4, 5], &dev()).unwrap();
    for (y, shape) in [
        (Flatten::default().forward(&x), vec![2, 60]),
        (x.flatten_dims(0, 1), vec![6, 4, 5]),
        (x.flatten_dims(-2, -1), vec![2, 3, 20]),
        (x.flatten_dims(2, 2), vec![2, 3, 4, 5]),
        (Identity.forward(&x), vec![2, 3, 4, 5]),
    ] {
        assert_eq!(y.dims(), shape.as_slice());
        assert_eq!(y.to_vec::<f32>().unwrap(), v, "{shape:?}: a flatten keeps the row-major order");
    }
    assert_eq!(Tensor::scalar(3.0, DType::F32, &dev()).flatten_dims(0, -1).dims(), [1]);
    // unflatten undoes it, with a size inferred.
    let back = Flatten::default().forward(&x).unflatten(1, &[3, -1, 5]);
    assert_eq!(back.dims(), [2, 3, 4, 5]);
    assert_eq!(back.to_vec::<f32>().unwrap(), v);
    let heads = Unflatten { dim: -1, sizes: vec![5, 1] }.forward(&x);
    assert_eq!(heads.dims(), [2, 3, 4, 5, 1]);
    let up = Upsample { options: F::InterpolateOptions { scale_factor: Some(vec![2.0]), ..Default::default() } };
    let small = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2], &dev()).unwrap();
    let big = up.forward(&small);
    assert_eq!(big.dims(), [1, 1, 4, 4]);
    let want = [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0];
    assert_eq!(big.to_vec::<f32>().unwrap(), want);
    // A CNN head: convolution, flatten, linear.
    let cnn = Sequential::new()
        .add(kiln::nn::Conv2d::new(3, 2, [3, 3], Default::default(), true, &dev()))
        .add(ReLU)
        .add(Flatten::default())
        .add(Linear::new(2 * 2 * 3, 5, true, &dev()));
    assert_eq!(cnn.forward(&x.to_dtype(DType::F32)).dims(), [2, 5]);
}

#[test]
#[should_panic(expected = "unflatten: sizes [4, 2] do not multiply to dim 1's size 3")]
fn unflatten_needs_sizes_that_multiply_to_the_dim() {
    Tensor::zeros([2, 3], DType::F32, &dev()).unflatten(1, &[4, 2]);
}

#[test]
#[should_panic(expected = "flatten: start_dim 2 comes after end_dim 1 in a 4-d tensor")]
fn flatten_needs_ordered_dims() {
    Tensor::zeros([2, 3, 4, 5], DType::F32, &dev()).flatten_dims(2, 1);
}

#[test]
fn sequential_composes_names_and_propagates_train_mode() {
    let model = Sequential::new()
        .add(Linear::new(3, 4, true, &dev()))
        .add(ReLU)
        .add(Dropout::new(0.5))
        .add(Func::new(|x| x.mul(2.0)))
        .add(Linear::new(4, 2, false, &dev()));
    let names: Vec<String> = model.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "4.weight"]);
    assert_eq!(model.params().len(), 3);
    assert_eq!(model.len(), 5);
    model.eval();
    let x = tensor(DType::F32, &data(DType::F32, 6, 31, Dom::Cont(-1.0, 1.0)), &[2, 3]);
    let l0 = model.get(0).unwrap();
    let l4 = model.get(4).unwrap();
    let want = l4.forward(&F::relu(&l0.forward(&x)).mul(2.0));
    check(&model.forward(&x), &[2, 2], &vals(&want), Kind::Accumulate);
    // Nested: a Sequential inside a Sequential gets a two-level prefix.
    let outer = Sequential::new().add(Linear::new(2, 2, true, &dev())).add(model);
    let names: Vec<String> = outer.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.4.weight"]);
}

#[test]
fn params_are_shared_handles_and_set_keeps_shape_and_dtype() {
    let p = Param::new("w", Tensor::zeros([2, 2], DType::F32, &dev()));
    let q = p.clone();
    assert!(p.ptr_eq(&q) && p.name() == "w");
    q.set(Tensor::ones([2, 2], DType::F32, &dev()));
    assert_eq!(p.get().to_vec::<f32>().unwrap(), [1.0; 4]);
    assert!(p.get().is_requires_grad());
    // A value with autograd history is detached: gradients stop at the parameter.
    let src = Tensor::ones([2, 2], DType::F32, &dev()).requires_grad();
    let r = Param::new("r", src.mul(3.0));
    let g = r.get().sum_all().backward().unwrap();
    assert!(g.get(&r.get()).is_some() && g.get(&src).is_none());
    let bad = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.set(Tensor::ones([3], DType::F32, &dev()))));
    let msg = *bad.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("Param::set") && msg.contains("[2, 2]") && msg.contains("[3]"), "{msg}");
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

/// `Module::to_dtype` (PyTorch's `module.to(dtype)`): every float parameter and buffer of a composite module takes
/// the new dtype with its values rounded as `to_dtype` rounds them, the handles stay the same parameters, and a
/// forward and backward pass runs in the new dtype; casting back to f32 widens exactly. A non-float target is
/// refused by `Param::cast`.
#[test]
fn module_to_dtype_casts_every_float_parameter_and_buffer() {
    let dev = dev();
    let model = Sequential::new()
        .add(Linear::new(6, 5, true, &dev))
        .add(kiln::nn::BatchNorm1d::new(5, &dev))
        .add(ReLU)
        .add(Linear::new(5, 3, false, &dev));
    let before: Vec<(String, Tensor)> = model.named_state().into_iter().map(|(n, p)| (n, p.get())).collect();
    let handles = model.named_state();
    model.to_dtype(DType::BF16);
    for ((name, p), (_, old)) in handles.iter().zip(&before) {
        if !old.dtype().is_float() {
            // An integer buffer (batch norm's `num_batches_tracked`) keeps its dtype, as in PyTorch.
            assert_eq!(p.dtype(), old.dtype(), "{name}");
            continue;
        }
        assert_eq!(p.dtype(), DType::BF16, "{name}");
        let want = old.to_dtype(DType::BF16).to_dtype(DType::F64).to_vec::<f64>().unwrap();
        assert_eq!(p.get().to_dtype(DType::F64).to_vec::<f64>().unwrap(), want, "{name}");
    }
    let x = Tensor::randn([4, 6], DType::F32, &dev).to_dtype(DType::BF16);
    let loss = model.forward(&x).square().sum_all();
    assert_eq!(loss.dtype(), DType::BF16);
    let grads = loss.backward().unwrap();
    for p in model.params() {
        let g = grads.get(&p.get()).unwrap_or_else(|| panic!("no gradient for {}", p.name()));
        assert_eq!(g.dtype(), DType::BF16, "{}", p.name());
    }
    let rounded: Vec<Vec<f64>> =
        model.params().iter().map(|p| p.get().to_dtype(DType::F64).to_vec::<f64>().unwrap()).collect();
    model.to_dtype(DType::F32);
    for (p, r) in model.params().iter().zip(&rounded) {
        assert_eq!(
            (p.dtype(), &p.get().to_dtype(DType::F64).to_vec::<f64>().unwrap()),
            (DType::F32, r),
            "{}",
            p.name()
        );
    }
    let first = model.params()[0].clone();
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| first.cast(DType::I32)));
    let msg = refused.expect_err("a cast to i32 was taken");
    let msg = msg.downcast_ref::<String>().map(String::as_str).unwrap_or("");
    assert!(msg.contains("float to float only"), "{msg}");
}
