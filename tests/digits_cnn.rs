//! The CNN example as a test (`examples/train_digits_cnn.rs` compiled in as a module): convolutions, poolings
//! and Adam learn the 8x8 digits, >= 95% test accuracy after 8 epochs (96.7% with seed 0); and 20 SGD steps of the
//! same model reproduce PyTorch's losses. A file of its own, so the plan-cache counters `tests/digits.rs` reads are
//! not disturbed by this training running beside it.

// Trains the example on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

#[path = "../examples/train_digits_cnn.rs"]
#[allow(dead_code)]
mod train_digits_cnn;

use kiln::Device;
use train_digits_cnn::train_digits::{Config, Split, default_path, load_digits, train_model};

#[test]
fn the_cnn_trains_to_95_percent() {
    let data = load_digits(&default_path()).unwrap_or_else(|e| panic!("{e}"));
    let (train, test) = data.split(Split::Interleaved);
    let cfg = Config { epochs: 8, lr: 5e-3, ..Config::default() };
    let report = train_model(&cfg, &train, &test, &Device::cpu(), train_digits_cnn::Cnn::new, |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(report.test_accuracy >= 0.95, "test accuracy {}", report.test_accuracy);
}

/// The CNN against a recorded PyTorch run (`tests/fixtures/make_cnn_parity.py`): the same initial weights, batch and
/// labels, 20 SGD steps of mean cross-entropy, on every device (the file is read on the CPU and moved).
#[test]
fn twenty_sgd_steps_match_a_recorded_pytorch_run() {
    use kiln::nn::Module;
    use kiln::optim::{Optimizer, Sgd};
    use kiln::{DType, Tensor};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cnn_parity.safetensors");
    let file: std::collections::HashMap<String, Tensor> =
        kiln::load_safetensors(path, &Device::cpu()).unwrap().into_iter().collect();
    let want: Vec<f64> = file["losses"].to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
    for dev in common::devices() {
        let model = train_digits_cnn::Cnn::new(&dev);
        for (name, p) in model.named_params() {
            p.set(file[&name].to_device(&dev).unwrap());
        }
        let x = file["x"].to_device(&dev).unwrap();
        let y = file["y"].to_dtype(DType::I32).to_device(&dev).unwrap();
        let mut opt = Sgd::new(model.params(), 0.05);
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let loss = kiln::nn::functional::cross_entropy(&model.forward(&x), &y, kiln::nn::Reduction::Mean);
            opt.step(loss.backward().unwrap(), &[&loss]).unwrap();
            got.push(loss.item::<f32>().unwrap() as f64);
        }
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-4, "[{dev}] losses off by up to {worst:e} relative:\n got {got:?}\nwant {want:?}");
    }
}
