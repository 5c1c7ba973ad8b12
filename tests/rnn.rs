//! `nn::LSTM` and `nn::GRU` against PyTorch 2.15 (`tests/fixtures/rnn_torch.py` writes the parameters, inputs,
//! outputs and gradients): a 2-layer LSTM with `batch_first` from given states, a GRU from a given state and on an
//! unbatched sequence, a 2-layer bidirectional LSTM from zero states; outputs, final states and the gradients of a
//! loss over them for the input, a recurrent weight and a bias or input weight; on every device in f32 and f64.
//! Plus PyTorch's parameter names, shapes and init bounds.

mod test_cache;

mod common;

use common::*;
use kiln::nn::{GRU, LSTM, Module, RnnOptions};
use kiln::{DType, Tensor};

#[test]
fn lstm_and_gru_match_pytorch_with_gradients() {
    let Some(fixture) = Fixture::load("rnn_torch.safetensors") else { return };
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |name: &str| fixture.get(name).to_dtype(dtype).to_device(&dev).unwrap();
            let at = format!("{dtype} on {}", dev.describe());

            let opts = RnnOptions { num_layers: 2, batch_first: true, ..Default::default() };
            let lstm = LSTM::new(3, 4, opts, &dev);
            fixture.load_params(&lstm, "lstm", dtype, &dev);
            let x = on("lstm.x").requires_grad();
            let (y, (hn, cn)) = lstm.forward_with(&x, Some((&on("lstm.h0"), &on("lstm.c0"))));
            assert_close_to_torch(&y, &fixture.get("lstm.out"), &format!("LSTM output ({at})"));
            assert_close_to_torch(&hn, &fixture.get("lstm.hn"), &format!("LSTM h_n ({at})"));
            assert_close_to_torch(&cn, &fixture.get("lstm.cn"), &format!("LSTM c_n ({at})"));
            let loss = y.mul(sines(y.dims(), 1.9, dtype, &dev)).sum_all()
                + hn.mul(sines(&[2, 2, 4], 2.3, dtype, &dev)).sum_all()
                + cn.sum_all();
            let grads = loss.backward().unwrap();
            let params: std::collections::HashMap<String, Tensor> =
                lstm.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
            assert_close_to_torch(grads.get(&x).unwrap(), &fixture.get("lstm.dx"), &format!("LSTM dx ({at})"));
            for name in ["weight_hh_l0", "bias_ih_l1"] {
                let g = grads.get(&params[name]).unwrap();
                assert_close_to_torch(g, &fixture.get(&format!("lstm.d{name}")), &format!("LSTM d{name} ({at})"));
            }

            let gru = GRU::new(3, 4, RnnOptions::default(), &dev);
            fixture.load_params(&gru, "gru", dtype, &dev);
            let x = on("gru.x").requires_grad();
            let (y, hn) = gru.forward_with(&x, Some(&on("gru.h0")));
            assert_close_to_torch(&y, &fixture.get("gru.out"), &format!("GRU output ({at})"));
            assert_close_to_torch(&hn, &fixture.get("gru.hn"), &format!("GRU h_n ({at})"));
            let loss = y.mul(sines(y.dims(), 0.6, dtype, &dev)).sum_all()
                + hn.mul(sines(&[1, 2, 4], 2.9, dtype, &dev)).sum_all();
            let grads = loss.backward().unwrap();
            let params: std::collections::HashMap<String, Tensor> =
                gru.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
            assert_close_to_torch(grads.get(&x).unwrap(), &fixture.get("gru.dx"), &format!("GRU dx ({at})"));
            for name in ["weight_hh_l0", "bias_hh_l0"] {
                let g = grads.get(&params[name]).unwrap();
                assert_close_to_torch(g, &fixture.get(&format!("gru.d{name}")), &format!("GRU d{name} ({at})"));
            }
            // One unbatched sequence [T, I] from zeros: outputs [T, H], h_n [layers, H].
            let (y1, h1) = gru.forward_with(&on("gru.x").narrow(1, 0, 1).squeeze(1), None);
            assert_close_to_torch(&y1, &fixture.get("gru.out_unbatched"), &format!("GRU unbatched output ({at})"));
            assert_close_to_torch(&h1, &fixture.get("gru.hn_unbatched"), &format!("GRU unbatched h_n ({at})"));
            assert_eq!(gru.forward(&x).dims(), [5, 2, 4]);

            // Two layers in both directions: outputs [T, N, 2H], states [4, N, H] (layer by layer, forward first).
            let opts = RnnOptions { num_layers: 2, bidirectional: true, ..Default::default() };
            let bi = LSTM::new(3, 4, opts, &dev);
            fixture.load_params(&bi, "bi", dtype, &dev);
            let x = on("bi.x").requires_grad();
            let (y, (hn, cn)) = bi.forward_with(&x, None);
            assert_close_to_torch(&y, &fixture.get("bi.out"), &format!("bidirectional output ({at})"));
            assert_close_to_torch(&hn, &fixture.get("bi.hn"), &format!("bidirectional h_n ({at})"));
            assert_close_to_torch(&cn, &fixture.get("bi.cn"), &format!("bidirectional c_n ({at})"));
            let loss = y.mul(sines(y.dims(), 0.2, dtype, &dev)).sum_all()
                + hn.mul(sines(&[4, 2, 4], 1.4, dtype, &dev)).sum_all()
                + cn.mul(sines(&[4, 2, 4], 2.6, dtype, &dev)).sum_all();
            let grads = loss.backward().unwrap();
            let params: std::collections::HashMap<String, Tensor> =
                bi.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
            assert_close_to_torch(grads.get(&x).unwrap(), &fixture.get("bi.dx"), &format!("bidirectional dx ({at})"));
            for name in ["weight_hh_l1_reverse", "weight_ih_l1"] {
                let g = grads.get(&params[name]).unwrap();
                assert_close_to_torch(
                    g,
                    &fixture.get(&format!("bi.d{name}")),
                    &format!("bidirectional d{name} ({at})"),
                );
            }
        }
    }
}

/// PyTorch's parameter names and shapes (`state_dict` keys), every one uniform in `± 1 / sqrt(hidden_size)`; a
/// misshapen input or state is refused naming the shapes.
#[test]
fn recurrent_layers_have_pytorch_parameters_and_refuse_misfits() {
    let Some(dev) = data_device() else { return };
    let lstm = LSTM::new(3, 8, RnnOptions { num_layers: 2, ..Default::default() }, &dev);
    let shapes: Vec<(String, Vec<usize>)> =
        lstm.named_params().into_iter().map(|(n, p)| (n, p.get().dims().to_vec())).collect();
    let want = [
        ("weight_ih_l0", vec![32, 3]),
        ("weight_hh_l0", vec![32, 8]),
        ("bias_ih_l0", vec![32]),
        ("bias_hh_l0", vec![32]),
        ("weight_ih_l1", vec![32, 8]),
        ("weight_hh_l1", vec![32, 8]),
        ("bias_ih_l1", vec![32]),
        ("bias_hh_l1", vec![32]),
    ];
    assert_eq!(shapes, want.map(|(n, s)| (n.to_string(), s)));
    let bound = 1.0 / 8f64.sqrt();
    for (name, p) in lstm.named_params() {
        let v = vals(&p.get());
        assert!(v.iter().all(|x| x.abs() <= bound) && v.iter().any(|x| x.abs() > bound / 2.0), "{name}");
    }
    let bi = GRU::new(3, 8, RnnOptions { bidirectional: true, num_layers: 2, ..Default::default() }, &dev);
    let names: Vec<(String, Vec<usize>)> =
        bi.named_params().into_iter().map(|(n, p)| (n, p.get().dims().to_vec())).collect();
    assert_eq!(names[4], ("weight_ih_l0_reverse".to_string(), vec![24, 3]));
    assert_eq!(names[8], ("weight_ih_l1".to_string(), vec![24, 16]));
    assert_eq!(names.len(), 16);
    let gru = GRU::new(3, 8, RnnOptions { bias: false, ..Default::default() }, &dev);
    let names: Vec<String> = gru.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight_ih_l0", "weight_hh_l0"]);
    assert_eq!(gru.named_params()[0].1.get().dims(), [24, 3]);
    let refused = |f: Box<dyn Fn()>| {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("refused");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let x = tensor(DType::F32, &[0.5; 2 * 5 * 4], &[2, 5, 4]);
    let msg = refused(Box::new(move || {
        gru.forward(&x);
    }));
    assert!(msg.contains("GRU") && msg.contains("[2, 5, 4]"), "{msg}");
    let x = tensor(DType::F32, &[0.5; 5 * 2 * 3], &[5, 2, 3]);
    let h = tensor(DType::F32, &[0.0; 2 * 8], &[2, 8]);
    let c = h.clone();
    let msg = refused(Box::new(move || {
        lstm.forward_with(&x, Some((&h, &c)));
    }));
    assert!(msg.contains("h_0 must be [2, 2, 8]"), "{msg}");
}

/// `dropout` zeroes the outputs between layers in training mode only: in evaluation mode a 2-layer LSTM with
/// dropout 0.5 equals the same weights without it, bit for bit; in training mode it differs; at dropout 1 the last
/// layer sees only zeros, so the output no longer depends on the input; a probability outside [0, 1] is refused.
#[test]
fn recurrent_dropout_applies_between_layers_in_training_only() {
    let Some(dev) = data_device() else { return };
    let opts = |dropout| RnnOptions { num_layers: 2, dropout, ..Default::default() };
    let with = LSTM::new(3, 4, opts(0.5), &dev);
    let without = LSTM::new(3, 4, opts(0.0), &dev);
    for ((_, a), (_, b)) in with.named_params().into_iter().zip(without.named_params()) {
        b.set(a.get());
    }
    let x = tensor(DType::F32, &(0..5 * 2 * 3).map(|i| (i as f64 * 0.3).sin()).collect::<Vec<_>>(), &[5, 2, 3]);
    let trained = vals(&with.forward(&x));
    with.eval();
    assert_eq!(vals(&with.forward(&x)), vals(&without.forward(&x)));
    assert_ne!(trained, vals(&without.forward(&x)), "dropout 0.5 changed nothing in training mode");
    let all = GRU::new(3, 4, opts(1.0), &dev);
    let y = tensor(DType::F32, &vec![0.7; 5 * 2 * 3], &[5, 2, 3]);
    assert_eq!(vals(&all.forward(&x)), vals(&all.forward(&y)));
    let err = std::panic::catch_unwind(|| GRU::new(3, 4, opts(1.5), &dev)).expect_err("refused");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("dropout has to be between 0 and 1"), "{msg}");
}
