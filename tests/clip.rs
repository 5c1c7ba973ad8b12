//! Gradient clipping (`kiln::nn::clip_grad_norm`, `clip_grad_value`) against PyTorch's formulas computed here in
//! f64, on every device; and the runtime contract: clipping joins the step's graph, so a training loop that clips
//! still compiles one plan.
//!
//! Tolerance: f32 norms of at most 16 elements, relative 1e-6 (a sum of squares of n terms is within ~n ulp);
//! f64, 1e-12. The plan-cache counters are process-wide, so every test here takes `SERIAL` first.

mod test_cache;

mod common;

use common::*;
use kiln::nn::{Param, clip_grad_norm, clip_grad_value};
use kiln::{DType, Device};
use std::sync::{Mutex, MutexGuard};
#[cfg(feature = "cpu")]
use {
    kiln::Tensor,
    kiln::optim::{Optimizer, Sgd},
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const A: [f64; 12] = [0.5, -1.5, 2.0, 0.25, -0.75, 1.0, 3.0, -2.5, 0.125, 1.75, -0.5, 2.25];
const B: [f64; 4] = [-1.0, 0.5, 4.0, -0.25];

/// Parameters `w` [3, 4], `b` [4] (of `dtype`) and `unused` [2], and the gradients of `sum(w * A) + sum(b * B)`:
/// exactly A for `w`, B for `b`, none for `unused`.
fn setup(dev: &Device, dtype: DType) -> (Param, Param, Param, kiln::Gradients) {
    let param =
        |name: &str, v: &[f64], shape: &[usize]| Param::new(name, tensor(dtype, v, shape).to_device(dev).unwrap());
    let (w, b) = (param("w", &[0.1; 12], &[3, 4]), param("b", &[0.2; 4], &[4]));
    let unused = param("unused", &[1.0, 2.0], &[2]);
    let a = tensor(dtype, &A, &[3, 4]).to_device(dev).unwrap();
    let bb = tensor(dtype, &B, &[4]).to_device(dev).unwrap();
    let loss = w.get().mul(&a).sum_all().add(b.get().mul(&bb).sum_all());
    let grads = loss.backward().unwrap();
    (w, b, unused, grads)
}

fn total_norm() -> f64 {
    A.iter().chain(&B).map(|x| x * x).sum::<f64>().sqrt()
}

#[track_caller]
fn close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * w.abs(), "{what}[{i}]: got {g:e}, want {w:e}");
    }
}

#[test]
fn clip_grad_norm_scales_by_max_norm_over_the_total_norm_on_every_device() {
    let _s = serial();
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !dev.supports(dtype) {
                continue;
            }
            let rel = if dtype == DType::F32 { 1e-6 } else { 1e-12 };
            let what = format!("{dev:?} {dtype:?}");
            let total = total_norm();
            let max_norm = 2.0;
            let (w, b, unused, mut grads) = setup(&dev, dtype);
            let norm = clip_grad_norm(&mut grads, &[w.clone(), b.clone(), unused.clone(), w.clone()], max_norm);
            assert_eq!(norm.dtype(), dtype, "{what}");
            close(&vals(&norm), &[total], rel, &format!("{what}: total norm"));
            let coef = max_norm / (total + 1e-6);
            let scaled = |v: &[f64]| v.iter().map(|x| x * coef).collect::<Vec<_>>();
            close(&vals(grads.get(&w.get()).unwrap()), &scaled(&A), rel, &format!("{what}: w"));
            close(&vals(grads.get(&b.get()).unwrap()), &scaled(&B), rel, &format!("{what}: b"));
            assert!(grads.get(&unused.get()).is_none());

            // Below the limit the factor is exactly 1: the gradients keep their bits.
            let (w, b, _, mut grads) = setup(&dev, dtype);
            let norm = clip_grad_norm(&mut grads, &[w.clone(), b.clone()], 100.0);
            close(&vals(&norm), &[total], rel, &format!("{what}: total norm"));
            assert_eq!(vals(grads.get(&w.get()).unwrap()), A.to_vec(), "{what}: w unclipped");
            assert_eq!(vals(grads.get(&b.get()).unwrap()), B.to_vec(), "{what}: b unclipped");
        }
    }
}

#[cfg(feature = "cpu")]
#[test]
fn only_the_listed_parameters_count_and_are_clipped() {
    let _s = serial();
    let dev = Device::cpu();
    let (w, b, _, mut grads) = setup(&dev, DType::F32);
    let norm = clip_grad_norm(&mut grads, std::slice::from_ref(&w), 1.0);
    let total_w = A.iter().map(|x| x * x).sum::<f64>().sqrt();
    close(&vals(&norm), &[total_w], 1e-6, "norm of w alone");
    let coef = 1.0 / (total_w + 1e-6);
    close(&vals(grads.get(&w.get()).unwrap()), &A.map(|x| x * coef), 1e-6, "w");
    assert_eq!(vals(grads.get(&b.get()).unwrap()), B.to_vec(), "b is not listed: unchanged");

    // No listed parameter has a gradient: the norm is 0 and nothing changes.
    let unused = Param::new("unused", Tensor::ones([2], DType::F32, &dev).requires_grad());
    let norm = clip_grad_norm(&mut grads, &[unused], 1.0);
    assert_eq!(vals(&norm), vec![0.0]);
}

#[cfg(feature = "cpu")]
#[test]
fn mixed_f32_and_f64_gradients_give_an_f64_norm() {
    let _s = serial();
    let w = Param::new("w", tensor(DType::F32, &[0.1; 12], &[3, 4]));
    let b = Param::new("b", tensor(DType::F64, &[0.2; 4], &[4]));
    let loss = w.get().mul(tensor(DType::F32, &A, &[3, 4])).sum_all().to_dtype(DType::F64);
    let loss = loss.add(b.get().mul(tensor(DType::F64, &B, &[4])).sum_all());
    let mut grads = loss.backward().unwrap();
    let norm = clip_grad_norm(&mut grads, &[w.clone(), b.clone()], 1.0);
    assert_eq!(norm.dtype(), DType::F64);
    // w's norm is an f32 (its gradient's dtype), so the total is only as close as f32.
    close(&vals(&norm), &[total_norm()], 1e-6, "total norm");
    let g = grads.get(&w.get()).unwrap();
    assert_eq!(g.dtype(), DType::F32, "a gradient keeps its dtype");
    close(&vals(g), &A.map(|x| x / (total_norm() + 1e-6)), 1e-6, "w");
}

#[test]
fn clip_grad_value_clamps_each_element() {
    let _s = serial();
    for dev in devices() {
        let (w, b, _, mut grads) = setup(&dev, DType::F32);
        clip_grad_value(&mut grads, &[w.clone(), b.clone()], 1.0);
        assert_eq!(vals(grads.get(&w.get()).unwrap()), A.map(|x| x.clamp(-1.0, 1.0)).to_vec(), "{dev:?}");
        assert_eq!(vals(grads.get(&b.get()).unwrap()), B.map(|x| x.clamp(-1.0, 1.0)).to_vec(), "{dev:?}");
    }
}

#[cfg(feature = "cpu")]
#[test]
fn a_training_loop_that_clips_compiles_one_plan() {
    let _s = serial();
    // Shapes no other test uses, so the plan cannot already be cached.
    let w = Param::new("w", tensor(DType::F32, &data(DType::F32, 5 * 7, 3, Dom::Cont(-1.0, 1.0)), &[5, 7]));
    let x = tensor(DType::F32, &data(DType::F32, 9 * 5, 4, Dom::Cont(-1.0, 1.0)), &[9, 5]);
    let mut opt = Sgd::new(vec![w.clone()], 0.1);
    let mut norms = Vec::new();
    let before = kiln::stats();
    for _ in 0..10 {
        let loss = x.matmul(&w.get()).square().sum_all();
        let mut grads = loss.backward().unwrap();
        let norm = clip_grad_norm(&mut grads, std::slice::from_ref(&w), 0.5);
        opt.step(grads, &[&loss, &norm]).unwrap();
        assert!(norm.is_realized(), "the norm is computed by the step's plan");
        norms.push(norm.item::<f32>().unwrap());
    }
    let after = kiln::stats();
    assert_eq!(after.compiles - before.compiles, 1, "one plan for forward, backward, clipping and update");
    assert_eq!(after.plan_hits - before.plan_hits, 9);
    assert!(norms[9] < norms[0], "training makes progress: {norms:?}");
}

#[cfg(feature = "cpu")]
#[test]
#[should_panic(expected = "clip_grad_norm: max_norm must be >= 0 (got -1)")]
fn a_negative_max_norm_is_refused() {
    let (w, _, _, mut grads) = setup(&Device::cpu(), DType::F32);
    clip_grad_norm(&mut grads, &[w], -1.0);
}

/// A model of 60 parameters (a 4-layer GPT has 52): the total norm sums 60 stored norms, which the schedule splits
/// so that no kernel binds more buffers than a wgpu adapter allows (lavapipe: 32; this had failed to compile there).
#[test]
fn the_norm_over_many_parameters_runs_on_every_device() {
    let _g = serial();
    for dev in devices() {
        let params: Vec<Param> = (0..60)
            .map(|i| Param::new(format!("p{i}"), tensor(DType::F32, &[0.5; 3], &[3]).to_device(&dev).unwrap()))
            .collect();
        // d/dp_i of sum(p_i * (i + 1)) is i + 1 in each of 3 elements.
        let loss = params
            .iter()
            .enumerate()
            .map(|(i, p)| p.get().mul((i + 1) as f64).sum_all())
            .reduce(|a, b| a.add(b))
            .expect("60 terms");
        let mut grads = loss.backward().unwrap();
        let norm = clip_grad_norm(&mut grads, &params, 1.0);
        let want = (1..=60).map(|k| 3.0 * (k * k) as f64).sum::<f64>().sqrt();
        // A sum of squares of 180 terms: within ~60 ulp of the 60 stored norms' sum, relative 4e-6.
        close(&vals(&norm), &[want], 4e-6, &format!("[{dev}] total norm"));
    }
}
