//! `BatchNorm2d` and `BatchNorm1d` against PyTorch 2.15 (`tests/fixtures/batch_norm_torch.py` wrote the inputs,
//! outputs, input gradients and running statistics) on every device: three training batches, then eval mode; the
//! running statistics are updated with the step's realize (one plan per step, the chain not growing).

// The fixture is read on the CPU (cargo feature `cpu`) and moved to each device.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::*;
use kiln::nn::{BatchNorm1d, BatchNorm2d, Module};
use kiln::{DType, Device, Tensor};
use std::collections::HashMap;

/// `got` against `want` (PyTorch's), within the stated tolerance: summation orders differ (GEMMs, row reductions).
fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    if let Err(e) = compare(&got.to_host().unwrap(), &want.to_host().unwrap(), Tol { rel: 1e-5, abs: 1e-5 }) {
        panic!("{what}: {e}");
    }
}

/// The tests of this file one at a time: `kiln::stats().live_nodes` counts tensors process-wide, so another test
/// running beside the chain test would move its count.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn batch_norm_trains_and_evaluates_as_pytorch() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/batch_norm_torch.safetensors");
    let file: HashMap<String, Tensor> = kiln::load_safetensors(path, &Device::cpu()).unwrap().into_iter().collect();
    for dev in devices() {
        let on = |n: &str| file[n].to_device(&dev).unwrap();
        let bn = BatchNorm2d::new(3, &dev);
        let params = bn.named_params();
        params[0].1.set(Tensor::from_vec(vec![1.5f32, -0.5, 2.0], [3], &dev).unwrap());
        params[1].1.set(Tensor::from_vec(vec![0.1f32, 0.2, -0.3], [3], &dev).unwrap());
        for i in 0..3 {
            let x = on(&format!("x{i}")).requires_grad();
            let y = bn.forward(&x);
            let n = y.numel();
            let w = Tensor::arange(0.0, n as f64, 1.0, &dev).reshape(y.dims().to_vec()).sin();
            let g = y.mul(&w).sum_all().backward().unwrap();
            close(&y, &on(&format!("y{i}")), &format!("[{dev}] y{i}"));
            close(g.get(&x).unwrap(), &on(&format!("gx{i}")), &format!("[{dev}] grad x{i}"));
        }
        let tracked = bn.batches_tracked().unwrap().to_dtype(kiln::DType::I32).to_vec::<i32>().unwrap();
        assert_eq!(tracked, [3], "[{dev}] num_batches_tracked");
        close(&bn.running_mean().unwrap(), &on("rm2"), &format!("[{dev}] running mean"));
        close(&bn.running_var().unwrap(), &on("rv2"), &format!("[{dev}] running var"));
        bn.eval();
        close(&bn.forward(&on("x0")), &on("ye"), &format!("[{dev}] eval"));

        let bn1 = BatchNorm1d::new(4, &dev).momentum(None);
        for i in 0..3 {
            close(&bn1.forward(&on(&format!("a{i}"))), &on(&format!("b{i}")), &format!("[{dev}] 1d b{i}"));
        }
        close(&bn1.running_mean().unwrap(), &on("rm1"), &format!("[{dev}] 1d running mean"));
        close(&bn1.running_var().unwrap(), &on("rv1"), &format!("[{dev}] 1d running var"));
    }
}

/// Training steps compile one plan each time and keep the number of live tensors flat: the running statistics
/// are realized with each step instead of growing a lazy chain.
#[test]
fn running_statistics_do_not_grow_a_lazy_chain() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::cpu();
    let bn = BatchNorm2d::new(2, &dev);
    let x = Tensor::randn([4, 2, 3, 3], DType::F32, &dev);
    kiln::realize(&[&x]).unwrap();
    let mut live = Vec::new();
    for _ in 0..20 {
        let loss = bn.forward(&x).square().sum_all();
        loss.item::<f32>().unwrap();
        live.push(kiln::stats().live_nodes);
    }
    assert!(bn.running_mean().unwrap().is_realized(), "the update was realized with the loss");
    assert!(live[19] <= live[4], "live tensors grew: {live:?}");
}

/// The running statistics are buffers: saved and loaded with the parameters (as PyTorch's `state_dict`), under
/// their names inside a `Sequential`, and never handed to an optimizer.
#[test]
fn running_statistics_are_saved_and_loaded_as_buffers() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    use kiln::nn::Sequential;
    let dev = Device::cpu();
    let model = Sequential::new().add(BatchNorm1d::new(3, &dev));
    let x = Tensor::randn([8, 3], DType::F32, &dev).mul(2.0).add(1.0);
    model.forward(&x).sum_all().item::<f32>().unwrap();
    let names: Vec<String> = model.named_state().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "0.running_mean", "0.running_var", "0.num_batches_tracked"]);
    assert_eq!(model.params().len(), 2, "buffers are not parameters");
    let dir = std::env::temp_dir().join(format!("kiln-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bn.safetensors");
    kiln::save_module(&model, &path).unwrap();
    let fresh = Sequential::new().add(BatchNorm1d::new(3, &dev));
    kiln::load_module(&fresh, &path, true).unwrap();
    let (a, b) = (model.named_buffers(), fresh.named_buffers());
    for ((n, p), (_, q)) in a.iter().zip(&b) {
        assert_eq!(vals(&p.get()), vals(&q.get()), "{n}");
        assert!(!q.get().is_requires_grad(), "{n} must not require gradients");
    }
    assert_ne!(vals(&b[0].1.get()), [0.0; 3], "the loaded mean is the trained one");
    std::fs::remove_dir_all(&dir).ok();
}

/// A PyTorch `BatchNorm2d.state_dict()` (after the three training batches of the first test; written by
/// `tests/fixtures/batch_norm_torch.py`) loads strictly: the same five names, `num_batches_tracked` included, and the
/// layer then evaluates as PyTorch's did.
#[test]
fn a_pytorch_state_dict_loads_strictly() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
    let file: HashMap<String, Tensor> =
        kiln::load_safetensors(format!("{dir}batch_norm_torch.safetensors"), &Device::cpu())
            .unwrap()
            .into_iter()
            .collect();
    let dev = Device::cpu();
    let bn = BatchNorm2d::new(3, &dev);
    kiln::load_module(&bn, format!("{dir}batch_norm_state.safetensors"), true).unwrap();
    assert_eq!(bn.batches_tracked().unwrap().to_vec::<i64>().unwrap(), [3]);
    close(&bn.running_mean().unwrap(), &file["rm2"], "running mean");
    bn.eval();
    close(&bn.forward(&file["x0"]), &file["ye"], "eval after loading");
}
