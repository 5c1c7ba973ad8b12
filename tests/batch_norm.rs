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

fn close(got: &Tensor, want: &Tensor, what: &str) {
    let (g, w) = (vals(got), vals(want));
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{what}[{i}]: {a} vs {b}");
    }
}

#[test]
fn batch_norm_trains_and_evaluates_as_pytorch() {
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
        assert_eq!(bn.batches_tracked(), 3);
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
