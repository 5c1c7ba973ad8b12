//! The seed's benchmark: train a 784 -> 256 -> 128 -> 10 MLP and print the time per step.
//!
//! Exactly the model of the comparison (benches/compare/mlp_torch.py runs the same step in PyTorch): no bias,
//! leaky_relu(0.01) after layers 1 and 2, Kaiming-normal init, loss `((out - t)^2).sum()`, SGD lr 1e-3, f32, the same
//! fixed x (B x 784) and t (B x 10, scaled by 0.1) every step. A step is forward + backward + SGD update: kiln records
//! it, realizes the new weights and the loss as one graph, and from the second step on replays the compiled plan.
//!
//! ```text
//! cargo run --release --example train_mlp                 # batches 1, 32, 128, 256, 512, 1024
//! cargo run --release --example train_mlp -- --batch 32   # one batch size
//! cargo run --release --example train_mlp -- --device wgpu --batch 32   # on the wgpu device
//! cargo run --release --example train_mlp -- --batch 1 --steps 20000   # a longer run, for `perf record`
//! ```
//! Prints, per batch: `batch N: X µs/step (median of 100 after 10 warm-up), first step Y ms`, then the loss.

use kiln::nn::{self, Module, Param};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use std::time::Instant;

const WARMUP: usize = 10;
/// Timed steps per batch size unless `--steps N` says otherwise (more steps for a profiler run).
const STEPS: usize = 100;

/// The benchmark model: three bias-free linear layers with leaky_relu(0.01) between them.
struct Mlp {
    w: [Param; 3],
}

impl Mlp {
    fn new(dev: &Device) -> Mlp {
        let layer = |name: &str, i: usize, o: usize| Param::new(name, nn::init::kaiming_normal([o, i], i, dev));
        Mlp { w: [layer("w1", 784, 256), layer("w2", 256, 128), layer("w3", 128, 10)] }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = nn::functional::leaky_relu(&x.matmul(&self.w[0].get().t()), 0.01);
        let h = nn::functional::leaky_relu(&h.matmul(&self.w[1].get().t()), 0.01);
        h.matmul(&self.w[2].get().t())
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        self.w.iter().map(|p| (p.name().to_string(), p.clone())).collect()
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn run(batch: usize, steps: usize, dev: &Device) -> kiln::Result<()> {
    kiln::manual_seed(0);
    let model = Mlp::new(dev);
    let x = Tensor::randn([batch, 784], DType::F32, dev);
    let t = Tensor::randn([batch, 10], DType::F32, dev) * 0.1;
    kiln::realize(&[&x, &t])?;
    model.realize_params()?;
    let mut opt = Sgd::new(model.params(), 1e-3);
    let mut step = || -> kiln::Result<Tensor> {
        let loss = (model.forward(&x) - &t).square().sum_all();
        let grads = loss.backward()?;
        opt.step(grads, &[&loss])?;
        // A GPU queue runs ahead of the host: wait, so a step's time is its whole run.
        dev.synchronize()?;
        Ok(loss)
    };
    let t0 = Instant::now();
    let first_loss = step()?;
    let first = t0.elapsed();
    for _ in 1..WARMUP {
        step()?;
    }
    let mut times = Vec::with_capacity(steps);
    let mut last = first_loss.clone();
    for _ in 0..steps {
        let t0 = Instant::now();
        last = step()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "batch {batch}: {:.1} µs/step (median of {steps} after {WARMUP} warm-up), first step {:.2} ms",
        times[steps / 2] * 1e6,
        first.as_secs_f64() * 1e3
    );
    println!("  loss {:.4} -> {:.4} over {} steps", first_loss.item::<f32>()?, last.item::<f32>()?, WARMUP + steps);
    Ok(())
}

fn main() -> kiln::Result<()> {
    let dev: Device = match arg("--device").as_deref().unwrap_or("cpu").parse() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("--device: {e}");
            std::process::exit(2);
        }
    };
    println!("device: {}", dev.describe());
    let batches: Vec<usize> = match arg("--batch") {
        Some(b) => vec![b.parse().unwrap_or_else(|_| panic!("--batch expects a number, got {b:?}"))],
        None => vec![1, 32, 128, 256, 512, 1024],
    };
    let steps = match arg("--steps").map(|s| s.parse::<usize>()) {
        None => STEPS,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("--steps expects a positive number");
            std::process::exit(2);
        }
    };
    for b in batches {
        run(b, steps, &dev)?;
    }
    let s = kiln::stats();
    println!(
        "plans compiled: {}, cache hits: {}, parameter buffers updated in place: {}",
        s.compiles, s.plan_hits, s.donated_buffers
    );
    print!("{}", kiln::profile_report());
    Ok(())
}
