//! Convolutions and poolings (`nn::functional::conv2d`, `conv1d`, `conv_transpose2d`, `max_pool1d`/`2d`,
//! `avg_pool1d`/`2d`, `adaptive_avg_pool1d`/`2d`, `adaptive_max_pool1d`/`2d`, batched and not) and `Tensor::unfold`,
//! and the modules over them, against what PyTorch 2.15 computed for the same inputs (`tests/fixtures/conv_torch.py`
//! writes `conv_torch.safetensors`, inputs and outputs), on every device in f32 and f64; their gradients by finite
//! differences in `tests/gradcheck.rs`.

mod test_cache;

mod common;

use common::*;
use kiln::nn::functional::{self as F, Conv2dOptions, Pool1dOptions, Pool2dOptions};
use kiln::{DType, Tensor};

#[test]
fn convolutions_and_poolings_match_pytorch() {
    let Some(fixture) = Fixture::load("conv_torch.safetensors") else { return };
    let get = |name: &str| fixture.get(name);
    type Case = (&'static str, fn(&[Tensor]) -> Tensor);
    let cases: [Case; 22] = [
        ("conv2d_strided", |t| {
            let o = Conv2dOptions { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 2 };
            F::conv2d(&t[0], &t[1], Some(&t[2]), &o)
        }),
        ("conv2d_plain", |t| F::conv2d(&t[0], &t[3], None, &Conv2dOptions::default())),
        ("conv1d", |t| F::conv1d(&t[4], &t[5], Some(&t[6]), 2, 1, 1, 1)),
        ("max_pool2d", |t| {
            F::max_pool2d(&t[0], &Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([2, 3]) })
        }),
        ("avg_pool2d", |t| {
            F::avg_pool2d(
                &t[0],
                &Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([2, 2]) },
                true,
            )
        }),
        ("avg_pool2d_exclude_pad", |t| {
            F::avg_pool2d(
                &t[0],
                &Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([2, 2]) },
                false,
            )
        }),
        ("adaptive_avg_pool2d", |t| F::adaptive_avg_pool2d(&t[0], [2, 4])),
        // Windows that tile the input (5 rows crop to 4): the reshaped form.
        ("max_pool2d_tiled", |t| F::max_pool2d(&t[0], &Pool2dOptions::new([2, 2]))),
        ("avg_pool2d_tiled", |t| F::avg_pool2d(&t[0], &Pool2dOptions::new([2, 3]), true)),
        ("max_pool2d_unbatched", |t| {
            let o = Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([2, 3]) };
            F::max_pool2d(&t[0].narrow(0, 0, 1).squeeze(0), &o)
        }),
        ("max_pool1d", |t| {
            F::max_pool1d(&t[4], &Pool1dOptions { stride: Some(2), padding: 1, ..Pool1dOptions::new(3) })
        }),
        ("max_pool1d_unbatched", |t| F::max_pool1d(&t[4].narrow(0, 0, 1).squeeze(0), &Pool1dOptions::new(2))),
        ("avg_pool1d", |t| {
            F::avg_pool1d(&t[4], &Pool1dOptions { stride: Some(2), padding: 1, ..Pool1dOptions::new(2) }, true)
        }),
        ("avg_pool1d_exclude_pad", |t| {
            F::avg_pool1d(&t[4], &Pool1dOptions { stride: Some(2), padding: 1, ..Pool1dOptions::new(3) }, false)
        }),
        ("adaptive_avg_pool1d", |t| F::adaptive_avg_pool1d(&t[4], 3)),
        ("adaptive_max_pool2d", |t| F::adaptive_max_pool2d(&t[0], [2, 3])),
        ("adaptive_max_pool2d_overlapping", |t| F::adaptive_max_pool2d(&t[0], [3, 4])),
        ("adaptive_max_pool1d", |t| F::adaptive_max_pool1d(&t[4], 3)),
        ("conv_transpose2d", |t| {
            let o = F::ConvTranspose2dOptions {
                stride: [2, 3],
                padding: [1, 0],
                output_padding: [1, 2],
                dilation: [1, 2],
                groups: 2,
            };
            F::conv_transpose2d(&t[0], &t[7], Some(&t[8]), &o)
        }),
        ("conv_transpose2d_plain", |t| F::conv_transpose2d(&t[0], &t[9], None, &Default::default())),
        ("unfold", |t| t[0].unfold(3, 3, 2)),
        ("unfold_twice", |t| t[0].unfold(-1, 3, 2).unfold(1, 2, 1)),
    ];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let inputs: Vec<Tensor> = ["x", "w", "b", "w_plain", "x1", "w1", "b1", "wt", "bt", "wt_plain"]
                .iter()
                .map(|n| get(n).to_dtype(dtype).to_device(&dev).unwrap())
                .collect();
            for (name, f) in &cases {
                let want = get(name);
                let got = f(&inputs);
                assert_eq!(got.dims(), want.dims(), "{name} ({dtype} on {}): shape", dev.describe());
                let want = want.to_host().unwrap();
                if let Err(e) = check_tensor(&got.to_dtype(DType::F32), got.dims(), &want, Kind::Accumulate) {
                    panic!("{name} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
}

/// A kernel larger than the padded input, a channel count that groups do not divide, an over-padded pool (2-D
/// and 1-D, named in its own terms) and a dilated average pool are refused naming the sizes.
#[test]
fn misfits_are_refused() {
    let Some(_) = data_device() else { return };
    let x = tensor(DType::F32, &vec![0.5; 2 * 4 * 5 * 5], &[2, 4, 5, 5]);
    let msg = |f: Box<dyn Fn()>| {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("refused");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let (x1, x2, x3) = (x.clone(), x.clone(), x.clone());
    let big = msg(Box::new(move || {
        F::conv2d(&x1, &tensor(DType::F32, &vec![0.1; 4 * 4 * 6 * 6], &[4, 4, 6, 6]), None, &Conv2dOptions::default());
    }));
    assert!(big.contains("6x6") && big.contains("5x5"), "{big}");
    let groups = msg(Box::new(move || {
        let o = Conv2dOptions { groups: 3, ..Default::default() };
        F::conv2d(&x2, &tensor(DType::F32, &vec![0.1; 3 * 4 * 3 * 3], &[3, 4, 3, 3]), None, &o);
    }));
    assert!(groups.contains("3 groups"), "{groups}");
    let pad = msg(Box::new(move || {
        F::max_pool2d(&x3, &Pool2dOptions { padding: [2, 0], ..Pool2dOptions::new([2, 2]) });
    }));
    assert!(pad.contains("half the window's span"), "{pad}");
    let x1 = tensor(DType::F32, &[0.5; 2 * 3 * 7], &[2, 3, 7]);
    let pad1 = msg(Box::new(move || {
        F::avg_pool1d(&x1, &Pool1dOptions { padding: 2, ..Pool1dOptions::new(2) }, true);
    }));
    assert!(pad1.contains("avg_pool1d") && pad1.contains("kernel 2") && pad1.contains("padding 2"), "{pad1}");
    let x4 = x.clone();
    let dilated = msg(Box::new(move || {
        F::avg_pool2d(&x4, &Pool2dOptions { dilation: [2, 1], ..Pool2dOptions::new([2, 2]) }, true);
    }));
    assert!(dilated.contains("avg_pool2d") && dilated.contains("dilation"), "{dilated}");
}

/// Max pooling with dilation and ceil mode, and its `return_indices` form, against PyTorch: the values, the index of
/// the tap each window took (also on inputs with ties, two NaNs in one window and windows of -inf only) and the
/// gradient (where no window ties). Average pooling in ceil mode, the overhang not counted, padding counted or not.
#[test]
fn max_pooling_takes_pytorchs_taps_and_ceil_mode_matches() {
    let Some(fixture) = Fixture::load("conv_torch.safetensors") else { return };
    let get = |name: &str| fixture.get(name);
    let p2 = |k: [usize; 2]| Pool2dOptions::new(k);
    let pooled: [(&str, &str, Pool2dOptions); 5] = [
        (
            "x",
            "max_pool2d_dilated_ceil",
            Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], dilation: [2, 1], ceil_mode: true, ..p2([2, 3]) },
        ),
        ("x", "max_pool2d_ceil", Pool2dOptions { ceil_mode: true, ..p2([2, 2]) }),
        ("x", "max_pool2d_tiled", p2([2, 2])),
        ("ties", "ties_padded", Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..p2([2, 3]) }),
        ("ties", "ties_tiled", p2([2, 2])),
    ];
    let ceil3 = Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ceil_mode: true, ..p2([3, 3]) };
    let averaged: [(&str, Pool2dOptions, bool); 3] = [
        ("avg_pool2d_ceil", ceil3, true),
        ("avg_pool2d_ceil_exclude_pad", ceil3, false),
        ("avg_pool2d_tiled_ceil", Pool2dOptions { ceil_mode: true, ..p2([2, 2]) }, true),
    ];
    let ints = |t: &Tensor| t.to_dtype(DType::I32).to_vec::<i32>().unwrap();
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |name: &str| get(name).to_dtype(dtype).to_device(&dev).unwrap();
            let check = |what: String, got: &Tensor, want: &Tensor| assert_close_to_torch(got, want, &what);
            let at = format!("({dtype} on {})", dev.describe());
            for (input, name, opts) in &pooled {
                let x = on(input).requires_grad();
                let (values, indices) = F::max_pool2d_with_indices(&x, opts);
                check(format!("{name} values {at}"), &values, &get(&format!("{name}_values")));
                assert_eq!(ints(&indices), ints(&get(&format!("{name}_indices"))), "{name} indices {at}");
                check(
                    format!("{name} without indices {at}"),
                    &F::max_pool2d(&x, opts),
                    &get(&format!("{name}_values")),
                );
                if input == &"x" {
                    let loss = values.mul(on(&format!("{name}_upstream"))).sum_all();
                    let grads = loss.backward().unwrap();
                    check(format!("{name} gradient {at}"), grads.get(&x).unwrap(), &get(&format!("{name}_grad")));
                }
            }
            let x1 = on("x1");
            let o1 =
                Pool1dOptions { stride: Some(2), padding: 1, dilation: 2, ceil_mode: true, ..Pool1dOptions::new(3) };
            let (values, indices) = F::max_pool1d_with_indices(&x1, &o1);
            check(format!("max_pool1d_dilated values {at}"), &values, &get("max_pool1d_dilated_values"));
            assert_eq!(ints(&indices), ints(&get("max_pool1d_dilated_indices")), "max_pool1d indices {at}");
            let (v0, i0) = F::max_pool1d_with_indices(&x1.narrow(0, 1, 1).squeeze(0), &o1);
            check(
                format!("unbatched max_pool1d {at}"),
                &v0,
                &get("max_pool1d_dilated_values").narrow(0, 1, 1).squeeze(0),
            );
            assert_eq!(ints(&i0), ints(&get("max_pool1d_dilated_indices").narrow(0, 1, 1)), "unbatched indices {at}");
            for (name, opts, include) in &averaged {
                check(format!("{name} {at}"), &F::avg_pool2d(&on("x"), opts, *include), &get(name));
            }
        }
    }
}

/// `nn::Conv2d` holds a weight `[O, C / groups, KH, KW]` and a bias `[O]` uniform in `± 1 / sqrt(fan_in)`
/// (PyTorch's default init), and its forward is `conv2d` with them.
#[test]
fn conv2d_module_initializes_as_pytorch_and_forwards_the_function() {
    use kiln::nn::{Conv2d, Module};
    let Some(dev) = data_device() else { return };
    let opts = Conv2dOptions { stride: [2, 2], padding: [1, 1], dilation: [1, 1], groups: 2 };
    let m = Conv2d::new(4, 8, [3, 3], opts, true, &dev);
    let params = m.named_params();
    assert_eq!(
        params.iter().map(|(n, p)| (n.clone(), p.get().dims().to_vec())).collect::<Vec<_>>(),
        [("weight".to_string(), vec![8, 2, 3, 3]), ("bias".to_string(), vec![8])]
    );
    let bound = 1.0 / ((2 * 3 * 3) as f64).sqrt();
    for (name, p) in &params {
        let v = vals(&p.get());
        assert!(v.iter().all(|x| x.abs() <= bound), "{name} outside ±{bound}");
        assert!(v.iter().any(|x| x.abs() > bound / 2.0), "{name} not spread over the bound");
    }
    let x = tensor(DType::F32, &(0..2 * 4 * 6 * 6).map(|i| (i as f64 * 0.1).sin()).collect::<Vec<_>>(), &[2, 4, 6, 6]);
    let want = F::conv2d(&x, &m.weight().get(), Some(&m.bias().unwrap().get()), &opts);
    assert_eq!(vals(&m.forward(&x)), vals(&want));
    assert_eq!(m.forward(&x).dims(), [2, 8, 3, 3]);
}

/// `nn::Conv1d` (weight `[O, C / groups, K]`) and `nn::ConvTranspose2d` (weight `[C, O / groups, KH, KW]`) hold
/// PyTorch's shapes, uniform in `± 1 / sqrt(fan_in)` with `fan_in` the weight's dim 1 times its kernel (as PyTorch
/// computes it for both), and forward their functions; the pooling modules forward theirs.
#[test]
fn conv1d_transposed_and_pooling_modules_forward_their_functions() {
    use kiln::nn::{
        AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, Conv1d,
        Conv1dOptions, ConvTranspose2d, MaxPool1d, MaxPool2d, MaxUnpool2d, Module,
    };
    let Some(dev) = data_device() else { return };
    let spread = |m: &dyn Module, shapes: &[Vec<usize>], fan_in: usize| {
        let params = m.named_params();
        assert_eq!(params.iter().map(|(_, p)| p.get().dims().to_vec()).collect::<Vec<_>>(), shapes);
        let bound = 1.0 / (fan_in as f64).sqrt();
        for (name, p) in &params {
            let v = vals(&p.get());
            assert!(v.iter().all(|x| x.abs() <= bound), "{name} outside ±{bound}");
            assert!(v.iter().any(|x| x.abs() > bound / 2.0), "{name} not spread over the bound");
        }
    };
    let sines = |shape: &[usize]| {
        let n = shape.iter().product::<usize>();
        tensor(DType::F32, &(0..n).map(|i| (i as f64 * 0.1).sin()).collect::<Vec<_>>(), shape)
    };
    let o1 = Conv1dOptions { stride: 2, padding: 1, dilation: 1, groups: 2 };
    let c1 = Conv1d::new(4, 6, 3, o1, true, &dev);
    spread(&c1, &[vec![6, 2, 3], vec![6]], 2 * 3);
    let x1 = sines(&[2, 4, 9]);
    let want = F::conv1d(&x1, &c1.weight().get(), Some(&c1.bias().unwrap().get()), 2, 1, 1, 2);
    assert_eq!(vals(&c1.forward(&x1)), vals(&want));
    let ot = F::ConvTranspose2dOptions { stride: [2, 2], groups: 2, ..Default::default() };
    let ct = ConvTranspose2d::new(4, 6, [3, 2], ot, true, &dev);
    spread(&ct, &[vec![4, 3, 3, 2], vec![6]], 3 * 3 * 2);
    let x2 = sines(&[2, 4, 5, 6]);
    let want = F::conv_transpose2d(&x2, &ct.weight().get(), Some(&ct.bias().unwrap().get()), &ot);
    assert_eq!(vals(&ct.forward(&x2)), vals(&want));
    assert_eq!(ct.forward(&x2).dims(), [2, 6, 11, 12]);
    let p2 = Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([2, 3]) };
    let p1 = Pool1dOptions { stride: Some(2), padding: 1, ..Pool1dOptions::new(3) };
    let pools: [(&dyn Module, &Tensor, Tensor); 8] = [
        (&MaxPool2d { options: p2 }, &x2, F::max_pool2d(&x2, &p2)),
        (&AvgPool2d { options: p2, count_include_pad: false }, &x2, F::avg_pool2d(&x2, &p2, false)),
        (&AdaptiveAvgPool2d { output: [1, 1] }, &x2, F::adaptive_avg_pool2d(&x2, [1, 1])),
        (&MaxPool1d { options: p1 }, &x1, F::max_pool1d(&x1, &p1)),
        (&AvgPool1d::new(3), &x1, F::avg_pool1d(&x1, &Pool1dOptions::new(3), true)),
        (&AdaptiveAvgPool1d { output: 4 }, &x1, F::adaptive_avg_pool1d(&x1, 4)),
        (&AdaptiveMaxPool2d { output: [2, 3] }, &x2, F::adaptive_max_pool2d(&x2, [2, 3])),
        (&AdaptiveMaxPool1d { output: 4 }, &x1, F::adaptive_max_pool1d(&x1, 4)),
    ];
    let (m, mi) = (MaxPool2d { options: p2 }.forward_with_indices(&x2), F::max_pool2d_with_indices(&x2, &p2));
    let unpooled = MaxUnpool2d { options: p2 }.forward_with(&m.0, &m.1, Some([5, 6]));
    assert_eq!(vals(&unpooled), vals(&F::max_unpool2d(&mi.0, &mi.1, &p2, Some([5, 6]))));
    assert_eq!(
        (vals(&m.0), m.1.to_dtype(DType::I32).to_vec::<i32>().unwrap()),
        (vals(&mi.0), mi.1.to_dtype(DType::I32).to_vec::<i32>().unwrap())
    );
    for (m, x, want) in pools {
        assert!(m.named_params().is_empty());
        assert_eq!(vals(&m.forward(x)), vals(&want));
    }
    assert_eq!(MaxPool2d::new([2, 2]).options, Pool2dOptions::new([2, 2]));
}

/// `max_unpool2d` and `max_unpool1d` against PyTorch: the inverse of a tiling pooling (of values scaled after
/// pooling) and its gradient, of an overlapping one whose windows share taps (PyTorch's values and indices as
/// input; a shared tap's values are equal), to a given output size, and in 1-D; on every device in f32 and f64.
#[test]
fn max_unpool_inverts_max_pool_as_pytorch() {
    let Some(fixture) = Fixture::load("conv_torch.safetensors") else { return };
    let get = |name: &str| fixture.get(name);
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let at = format!("({dtype} on {})", dev.describe());
            let on = |name: &str| get(name).to_dtype(dtype).to_device(&dev).unwrap();
            let check =
                |what: &str, got: &Tensor, want: &str| assert_close_to_torch(got, &get(want), &format!("{what} {at}"));
            let tiles = Pool2dOptions::new([2, 2]);
            let (v, i) = F::max_pool2d_with_indices(&on("x"), &tiles);
            let leaf = v.mul(1.5).detach().requires_grad();
            let u = F::max_unpool2d(&leaf, &i, &tiles, None);
            check("max_unpool2d", &u, "max_unpool2d");
            let w = sines(u.dims(), 0.5, dtype, &dev);
            let grads = u.mul(&w).sum_all().backward().unwrap();
            check("max_unpool2d's gradient", grads.get(&leaf).unwrap(), "max_unpool2d_grad");
            let overlap = Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..Pool2dOptions::new([3, 3]) };
            let idx = get("max_unpool2d_overlap_indices").to_device(&dev).unwrap();
            let u = F::max_unpool2d(&on("max_unpool2d_overlap_values"), &idx, &overlap, Some([5, 6]));
            check("max_unpool2d over shared taps", &u, "max_unpool2d_overlap");
            let (v, i) = F::max_pool1d_with_indices(&on("x1"), &Pool1dOptions::new(2));
            check("max_unpool1d", &F::max_unpool1d(&v, &i, &Pool1dOptions::new(2), Some(7)), "max_unpool1d");
            // An index past the plane (7 positions) is an error when the result is read, naming it.
            let bad = i.add(4);
            let err = F::max_unpool1d(&v, &bad, &Pool1dOptions::new(2), Some(7)).realize().expect_err("refused");
            assert!(err.to_string().contains("index"), "{at}: {err}");
        }
    }
}
