//! Buffer donation: an optimizer step writes each parameter's new value into its old buffer exactly when nothing
//! else can read the old value, and the values are the same either way.
//!
//! Whether a donation happened is read from `stats().donated_buffers` (process-wide: every test takes `SERIAL`).
//! The "either way" half runs the same training twice, once with a holder that blocks donation, and compares
//! every bit; the holders themselves must still read the old values.

mod test_cache;

mod common;

use kiln::nn::Param;
use kiln::optim::{Optimizer, Sgd};
use kiln::{Device, Tensor};
use std::sync::{Mutex, MutexGuard};
#[cfg(feature = "cpu")]
use {
    kiln::optim::Adam,
    std::sync::atomic::{AtomicBool, AtomicUsize, Ordering},
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn donated() -> u64 {
    kiln::stats().donated_buffers
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    (0..n).map(|i| (((i as u64 * (2 * seed + 7) + seed) % 61) as f32 / 30.5 - 1.0) * 0.5).collect()
}

fn input(n: usize, dims: [usize; 2], seed: u64, dev: &Device) -> Tensor {
    Tensor::from_vec(values(n, seed), dims, dev).expect("upload")
}

/// A two-layer MLP, `x @ w1^T -> leaky_relu -> @ w2^T`, with batch `b` and an MSE-sum loss.
struct Net {
    w: [Param; 2],
    x: Tensor,
    t: Tensor,
}

impl Net {
    #[cfg(feature = "cpu")]
    fn new(b: usize) -> Net {
        Net::on(b, &Device::cpu())
    }

    fn on(b: usize, dev: &Device) -> Net {
        Net {
            w: [Param::new("w1", input(24 * 16, [24, 16], 1, dev)), Param::new("w2", input(5 * 24, [5, 24], 2, dev))],
            x: input(b * 16, [b, 16], 3, dev),
            t: input(b * 5, [b, 5], 4, dev),
        }
    }

    fn forward(&self) -> Tensor {
        let h = kiln::nn::functional::leaky_relu(&self.x.matmul(&self.w[0].get().t()), 0.01);
        h.matmul(&self.w[1].get().t())
    }

    fn loss(&self) -> Tensor {
        (self.forward() - &self.t).square().sum_all()
    }

    fn weights(&self) -> Vec<Vec<f32>> {
        self.w.iter().map(|p| p.get().to_vec::<f32>().expect("download")).collect()
    }
}

/// Trains `net` for `steps` SGD (momentum) steps; `hold` runs before each step and returns what it keeps alive
/// through the step. Returns the donations counted and what `hold` returned at each step.
fn train<H>(net: &Net, steps: usize, mut hold: impl FnMut(&Net) -> H) -> (u64, Vec<H>) {
    let mut opt = Sgd::new(net.w.to_vec(), 0.01).momentum(0.9);
    let before = donated();
    let mut held = Vec::new();
    for _ in 0..steps {
        let loss = net.loss();
        let grads = loss.backward().expect("backward");
        held.push(hold(net));
        opt.step(grads, &[&loss]).expect("step");
    }
    (donated() - before, held)
}

#[cfg(feature = "cpu")]
#[test]
fn an_optimizer_step_updates_parameters_and_state_in_place_with_the_same_values() {
    let _s = serial();
    // Batch 1: the updates are elementwise kernels, always donated. Larger batches: each update is a GEMM with K =
    // batch, donated only when the tuned GEMM stores C once, after reading W (one K block, epilogue in
    // registers); 600 rows pass every candidate's K block, where a donated C would hold partial sums.
    for batch in [1, 8, 600] {
        let free = Net::new(batch);
        let (n, _) = train(&free, 5, |_| ());
        // Weights every step; momentum buffers too (the first step's zeros are held by nobody but the graph).
        if batch == 1 {
            assert_eq!(n, 2 * 5 + 2 * 5);
        }

        // The same run with the old weights kept alive: only the momentum buffers may be donated, and the values
        // match bit for bit.
        let blocked = Net::new(batch);
        let (n, kept) = train(&blocked, 5, |net| net.w.iter().map(Param::get).collect::<Vec<_>>());
        assert!(n <= 2 * 5, "batch {batch}: a held parameter must keep its buffer");
        assert_eq!(free.weights(), blocked.weights(), "batch {batch}");
        // The kept tensors still hold the values they had (the first ones: the initial weights).
        assert_eq!(kept[0][0].to_vec::<f32>().expect("download"), values(24 * 16, 1));
    }
}

#[test]
fn every_device_updates_in_place_with_the_values_of_a_step_that_does_not() {
    let _s = serial();
    for dev in common::devices() {
        // Batch 1: every update is an elementwise kernel, which every backend donates.
        let free = Net::on(1, &dev);
        let (n, _) = train(&free, 5, |_| ());
        assert_eq!(n, 2 * 5 + 2 * 5, "{dev:?}: weights and momentum buffers, every step");
        let blocked = Net::on(1, &dev);
        let (n, kept) = train(&blocked, 5, |net| net.w.iter().map(Param::get).collect::<Vec<_>>());
        assert_eq!(n, 2 * 5, "{dev:?}: only the momentum buffers");
        assert_eq!(free.weights(), blocked.weights(), "{dev:?}");
        assert_eq!(kept[0][0].to_vec::<f32>().expect("download"), values(24 * 16, 1), "{dev:?}: the held weights");
        // Batch 8: on wgpu the weight updates are GEMMs, which it never donates; the values still match.
        let (free, blocked) = (Net::on(8, &dev), Net::on(8, &dev));
        train(&free, 3, |_| ());
        train(&blocked, 3, |net| net.w.iter().map(Param::get).collect::<Vec<_>>());
        assert_eq!(free.weights(), blocked.weights(), "{dev:?}: batch 8");
    }
}

#[cfg(feature = "cpu")]
#[test]
fn a_lazy_value_that_needs_the_old_weights_blocks_donation_and_reads_them() {
    let _s = serial();
    let net = Net::new(4);
    // The prediction with the initial weights, computed on copies that share nothing with the parameters.
    let copy = Net::new(4);
    let want = copy.forward().to_vec::<f32>().expect("forward");
    let (n, preds) = train(&net, 1, Net::forward);
    assert_eq!(n, 2, "an unrealized prediction still reads the old weights (the momentum buffers do not)");
    assert_eq!(preds[0].to_vec::<f32>().expect("realize after the step"), want);
}

#[cfg(feature = "cpu")]
/// One SGD step of `Net::new(4)` whose loss is computed from a held prediction, realized by the step itself when
/// `in_step`; returns the donations and the prediction, checked against the initial weights' prediction.
fn step_holding_the_prediction(in_step: bool) -> u64 {
    let net = Net::new(4);
    let mut opt = Sgd::new(net.w.to_vec(), 0.01);
    let before = donated();
    let pred = net.forward();
    let loss = (pred.clone() - &net.t).square().sum_all();
    let grads = loss.backward().expect("backward");
    let also: Vec<&Tensor> = if in_step { vec![&loss, &pred] } else { vec![&loss] };
    opt.step(grads, &also).expect("step");
    let n = donated() - before;
    let copy = Net::new(4);
    assert_eq!(pred.to_vec::<f32>().expect("realize"), copy.forward().to_vec::<f32>().expect("forward"));
    n
}

#[cfg(feature = "cpu")]
#[test]
fn a_held_intermediate_of_the_step_blocks_donation_and_reads_the_old_weights() {
    let _s = serial();
    // The loss is computed from the prediction, so it is a node of the step's graph, but not one of its outputs:
    // after the step it is still lazy, and realizing it then needs the weights as they were.
    assert_eq!(step_holding_the_prediction(false), 0);
}

#[cfg(feature = "cpu")]
#[test]
fn a_value_realized_by_the_step_itself_does_not_block_donation() {
    let _s = serial();
    assert_eq!(step_holding_the_prediction(true), 2);
}

#[cfg(feature = "cpu")]
#[test]
fn a_detached_view_of_a_parameter_keeps_its_buffer() {
    let _s = serial();
    let net = Net::new(2);
    let view = net.w[0].get().detach(); // a realized tensor: shares the parameter's buffer
    let (n, _) = train(&net, 1, |_| ());
    assert_eq!(n, 3, "w2 and both momentum buffers, not w1");
    assert_eq!(view.to_vec::<f32>().expect("download"), values(24 * 16, 1));
}

#[cfg(feature = "cpu")]
#[test]
fn adam_donates_weights_and_both_moments() {
    let _s = serial();
    let net = Net::new(3);
    let mut opt = Adam::new(net.w.to_vec(), 1e-3);
    let before = donated();
    for _ in 0..3 {
        let loss = net.loss();
        opt.step(loss.backward().expect("backward"), &[&loss]).expect("step");
    }
    assert_eq!(donated() - before, 3 * 2 * 3);
    // A moment the user keeps a handle to is not written over.
    let m = opt.moments(0).expect("moments").0.clone();
    let m_before = m.to_vec::<f32>().expect("download");
    let loss = net.loss();
    let before = donated();
    opt.step(loss.backward().expect("backward"), &[&loss]).expect("step");
    assert_eq!(donated() - before, 2 * 3 - 1);
    assert_eq!(m.to_vec::<f32>().expect("download"), m_before);
}

#[cfg(feature = "cpu")]
#[test]
fn any_realize_may_write_over_an_input_nobody_else_holds() {
    let _s = serial();
    let dev = Device::cpu();
    let a = Tensor::from_vec(values(64, 5), [8, 8], &dev).expect("upload");
    let want: Vec<f32> = values(64, 5).iter().map(|v| v * 2.0 + 1.0).collect();

    let kept = a.clone();
    let before = donated();
    let b = &a * 2.0 + 1.0;
    b.realize().expect("realize");
    assert_eq!(donated() - before, 0, "`kept` holds the input");
    assert_eq!(b.to_vec::<f32>().expect("download"), want);
    assert_eq!(kept.to_vec::<f32>().expect("download"), values(64, 5));

    drop(kept);
    let c = &a * 2.0 + 1.0;
    drop(a);
    let before = donated();
    c.realize().expect("realize");
    assert_eq!(donated() - before, 1);
    assert_eq!(c.to_vec::<f32>().expect("download"), want);
}

#[cfg(feature = "cpu")]
#[test]
fn a_thread_reading_a_parameter_during_steps_sees_whole_values_and_changes_none() {
    let _s = serial();
    let reference = Net::new(2);
    train(&reference, 40, |_| ());
    let net = Net::new(2);
    let w = net.w[0].clone();
    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let v = w.get().to_vec::<f32>().expect("read during a step");
                assert_eq!(v.len(), 24 * 16);
                assert!(v.iter().all(|x| x.is_finite()));
                reads.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Train only once the reader runs (on a busy host it may start late).
        while reads.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        train(&net, 40, |_| ());
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(net.weights(), reference.weights());
}
