//! `nn` modules and their parameters: Linear and its init, the init helpers, Dropout, Embedding (padding entry
//! included), Flatten, Unflatten, Upsample, Identity, Sequential, parameter handles and `Module::to_dtype`.

use super::*;

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
