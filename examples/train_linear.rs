//! Fits a linear model by gradient descent, as eager-looking code that kiln records, compiles once and replays.
//!
//! The gradient of the mean squared error is written out by hand (autograd comes later):
//! `grad = 2/N * Xᵀ (X w - y)`. Every step builds the same graph, so only the first step compiles; the rest hit
//! the plan cache. Prints the loss as it falls and the time per step.
//!
//! `cargo run --release --example train_linear [-- --steps N] [--device wgpu]`

use kiln::{DType, Device, Tensor};
use std::time::Instant;

/// Fits a linear model with hand-written gradients and prints the loss as it falls and the time per step.
#[derive(clap::Parser)]
#[command(name = "train_linear")]
struct Args {
    /// Gradient-descent steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// `cpu` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    device: Device,
}

fn main() -> kiln::Result<()> {
    let Args { steps, device: dev } = clap::Parser::parse();
    let (n, d) = (1024, 16);
    kiln::manual_seed(42);

    // Data: y = X w_true + 0.01 noise.
    let x = Tensor::randn([n, d], DType::F32, &dev);
    let w_true = Tensor::arange(1.0, (d + 1) as f64, 1.0, &dev).div(d as f64).reshape([d, 1]);
    let y = x.matmul(&w_true) + Tensor::randn([n, 1], DType::F32, &dev) * 0.01;
    kiln::realize(&[&x, &y])?;

    let mut w = Tensor::zeros([d, 1], DType::F32, &dev);
    let lr = 0.1;
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps {
        let t0 = Instant::now();
        let err = x.matmul(&w) - &y;
        let loss = err.square().mean_all();
        let grad = x.t().matmul(&err) * (2.0 / n as f64);
        w = &w - grad * lr;
        kiln::realize(&[&w, &loss])?;
        times.push(t0.elapsed());
        if step % (steps / 10).max(1) == 0 || step + 1 == steps {
            println!("step {step:4}: loss {:.6}", loss.item::<f32>()?);
        }
    }
    let first = times[0];
    times.sort();
    let median = times[times.len() / 2];
    let stats = kiln::stats();
    println!(
        "{steps} steps: {:.1} µs/step (median), first step {:.2} ms; plans compiled: {}, cache hits: {}",
        median.as_secs_f64() * 1e6,
        first.as_secs_f64() * 1e3,
        stats.compiles,
        stats.plan_hits
    );
    let err = (&w - &w_true).abs().max_all().item::<f32>()?;
    println!("max |w - w_true| = {err:.4}");
    Ok(())
}
