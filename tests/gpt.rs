//! The GPT example (`examples/train_gpt.rs`, compiled in as a module) against a recorded PyTorch run of the same
//! model (`tests/fixtures/make_gpt_parity.py`): the same initial weights and tokens, 50 AdamW steps with the
//! warm-up + cosine schedule and gradient clipping, on every device; and a longer run that must compile its step
//! once and keep its memory flat.

// The fixture is read on the CPU (cargo feature `cpu`) and moved to each device.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

#[path = "../examples/train_gpt.rs"]
#[allow(dead_code)]
mod train_gpt;

use kiln::nn::Param;
use kiln::optim::schedule::LrSchedule;
use kiln::optim::{AdamW, Optimizer};
use kiln::{Device, Tensor};
use std::collections::HashMap;
use train_gpt::{Gpt, GptConfig, HostRng, Vocab};

/// The fixture's model: 56 characters, context 16, d_model 32, 4 heads, 2 layers (batch 4, 50 steps, peak 3e-3).
const CFG: GptConfig = GptConfig { vocab: 56, context: 16, d_model: 32, heads: 4, layers: 2 };

/// The tests of this file one at a time: `kiln::stats()` counts compiles and live tensors process-wide.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn fifty_adamw_steps_match_a_recorded_pytorch_run() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_parity.safetensors");
    let file: HashMap<String, Tensor> = kiln::load_safetensors(path, &Device::cpu()).unwrap().into_iter().collect();
    let want: Vec<f64> = file["losses"].to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
    let tokens = file["tokens"].to_vec::<i32>().unwrap();
    let (steps, batch, window) = (want.len(), 4, CFG.context + 1);
    assert_eq!(tokens.len(), steps * batch * window);
    for dev in common::devices() {
        let named: HashMap<String, Tensor> = file
            .iter()
            .filter(|(k, _)| *k != "losses" && *k != "tokens")
            .map(|(k, t)| (k.clone(), t.to_device(&dev).unwrap()))
            .collect();
        let model = Gpt::from_named(CFG, &named).unwrap();
        let mut opt = model.optimizer(3e-3, 0.1, false);
        let schedule = train_gpt::lr_schedule(3e-3, steps as u64);
        let params = kiln::nn::Module::params(&model);
        let mut got = Vec::with_capacity(steps);
        for i in 0..steps {
            let rows = &tokens[i * batch * window..(i + 1) * batch * window];
            let x: Vec<i32> = rows.chunks(window).flat_map(|w| w[..CFG.context].to_vec()).collect();
            let y: Vec<i32> = rows.chunks(window).flat_map(|w| w[1..].to_vec()).collect();
            let x = Tensor::from_vec(x, [batch, CFG.context], &dev).unwrap();
            let y = Tensor::from_vec(y, [batch, CFG.context], &dev).unwrap();
            opt.set_lr(schedule.lr(i as u64));
            let loss = model.loss(&x, &y);
            let mut grads = loss.backward().unwrap();
            kiln::nn::clip_grad_norm(&mut grads, &params, 1.0);
            opt.step(grads, &[&loss]).unwrap();
            got.push(loss.item::<f32>().unwrap() as f64);
        }
        // Sums run in other orders than PyTorch's (GEMM tiles, row reductions), and Adam's division by the root
        // of the second moment amplifies that in the first steps; a wrong gradient or update is off by far more.
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-4, "[{dev}] losses off by up to {worst:e} relative:\n got {got:?}\nwant {want:?}");
        eprintln!("[{dev}] 50 losses within {worst:.1e} relative of PyTorch's");
    }
}

/// The example's tokens (the sonnets, character level) and a fresh model for them on `dev` (seed 1).
fn sonnets_model(dev: &Device) -> (Vec<i32>, Gpt) {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/sonnets.txt")).unwrap();
    let vocab = Vocab::of(&text);
    let cfg = GptConfig { vocab: vocab.size(), ..CFG };
    (vocab.encode(&text), Gpt::new(cfg, dev, &kiln::Generator::new(1)))
}

/// One step of the example's loop on a batch of 4: loss, backward, gradients clipped to norm 1, the optimizer's
/// step (realizing the loss with it); returns the loss.
fn train_step(model: &Gpt, opt: &mut AdamW, params: &[Param], data: &[i32], rng: &mut HostRng, dev: &Device) -> Tensor {
    let (x, y) = train_gpt::batch(data, 4, CFG.context, rng, dev).unwrap();
    let loss = model.loss(&x, &y);
    let mut grads = loss.backward().unwrap();
    let norm = kiln::nn::clip_grad_norm(&mut grads, params, 1.0);
    opt.step(grads, &[&loss, &norm]).unwrap();
    loss
}

/// 100 steps of the example's loop: one plan for the step (after the first steps create the optimizer's state),
/// and as many tensors alive after the 100th step as after the 10th.
#[test]
fn a_hundred_steps_compile_once_and_keep_memory_flat() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::cpu();
    let (data, model) = sonnets_model(&dev);
    let mut opt = model.optimizer(3e-3, 0.1, false);
    let schedule = train_gpt::lr_schedule(3e-3, 100);
    let params = kiln::nn::Module::params(&model);
    let mut rng = HostRng(7);
    let mut at_10 = None;
    let mut first_loss = None;
    let mut loss_at = 0.0;
    for step in 0..100u64 {
        opt.set_lr(schedule.lr(step));
        let loss = train_step(&model, &mut opt, &params, &data, &mut rng, &dev);
        loss_at = loss.item::<f32>().unwrap();
        first_loss.get_or_insert(loss_at);
        if step == 9 {
            let s = kiln::stats();
            at_10 = Some((s.compiles, s.live_nodes));
        }
    }
    let s = kiln::stats();
    let (compiles, live) = at_10.expect("10 steps ran");
    assert_eq!(s.compiles, compiles, "plans compiled after 100 steps vs after 10");
    assert!(s.live_nodes <= live, "{} tensors alive after 100 steps, {live} after 10", s.live_nodes);
    assert!(loss_at < first_loss.unwrap() - 0.5, "the loss went {first_loss:?} -> {loss_at}");
}

/// The example's `--dtype bf16` path: the model cast to bf16 (`Module::to_dtype`), AdamW with f32 master weights,
/// every weight and gradient bf16, and the loss falls over 40 steps as in f32.
#[test]
fn bf16_training_with_master_weights_lowers_the_loss() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Device::cpu();
    let (data, model) = sonnets_model(&dev);
    kiln::nn::Module::to_dtype(&model, kiln::DType::BF16);
    let mut opt = model.optimizer(3e-3, 0.1, true);
    let schedule = train_gpt::lr_schedule(3e-3, 40);
    let params = kiln::nn::Module::params(&model);
    assert!(params.iter().all(|p| p.dtype() == kiln::DType::BF16));
    let mut rng = HostRng(7);
    let mut losses = Vec::new();
    for step in 0..40u64 {
        opt.set_lr(schedule.lr(step));
        let loss = train_step(&model, &mut opt, &params, &data, &mut rng, &dev);
        losses.push(loss.to_dtype(kiln::DType::F32).item::<f32>().unwrap());
    }
    assert!(params.iter().all(|p| p.dtype() == kiln::DType::BF16), "a parameter changed dtype");
    let (first, last) = (losses[..5].iter().sum::<f32>() / 5.0, losses[35..].iter().sum::<f32>() / 5.0);
    assert!(last.is_finite() && last < first - 0.5, "bf16 losses {first} -> {last}: {losses:?}");
}
