//! A recurrent model's training step, timed: a 2-layer LSTM or GRU (input 32, hidden 64) over 20 steps of a batch of
//! 16, a linear head on the last step's output to 8 values, loss `((out - t)^2).sum()`, SGD lr 1e-3, f32, the same
//! x (`[20, 16, 32]`) and t every step. A step is forward + backward + SGD update, one graph that kiln compiles once
//! (the recurrence unrolled) and replays; benches/compare/rnn_torch.py runs the same step in PyTorch.
//!
//! ```text
//! cargo run --release --example bench_rnn                 # LSTM and GRU
//! cargo run --release --example bench_rnn -- --cell gru   # one of them
//! ```
//! Prints, per cell: `lstm: X µs/step (median of N after 10 warm-up), first step Y ms`, then the loss; with `--json`
//! a last line `{"lstm step": seconds, ...}` for the comparison script.

use kiln::nn::{GRU, LSTM, Linear, Module, RnnOptions};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
#[path = "common/steps.rs"]
mod steps;

const WARMUP: usize = 10;
const SEQ: usize = 20;
const BATCH: usize = 16;

/// Which recurrent layer.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Cell {
    Lstm,
    Gru,
}

/// Times one recurrent model's training step.
#[derive(clap::Parser)]
#[command(name = "bench_rnn")]
struct Args {
    /// `lstm`, `gru`, or both (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "lstm,gru")]
    cell: Vec<Cell>,
    /// Timed steps (after 10 warm-up steps).
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Also print the medians as one JSON line.
    #[arg(long)]
    json: bool,
}

/// The median seconds of `steps` training steps of `cell`'s model, after printing them.
fn run(cell: Cell, runs: usize) -> kiln::Result<f64> {
    kiln::manual_seed(0);
    let dev = Device::cpu();
    let opts = RnnOptions { num_layers: 2, ..Default::default() };
    let rnn: Box<dyn Module> = match cell {
        Cell::Lstm => Box::new(LSTM::new(32, 64, opts, &dev)),
        Cell::Gru => Box::new(GRU::new(32, 64, opts, &dev)),
    };
    let name = format!("{cell:?}").to_lowercase();
    let head = Linear::new(64, 8, true, &dev);
    let x = Tensor::randn([SEQ, BATCH, 32], DType::F32, &dev);
    let t = Tensor::randn([BATCH, 8], DType::F32, &dev) * 0.1;
    kiln::realize(&[&x, &t])?;
    rnn.realize_params()?;
    head.realize_params()?;
    let mut params = rnn.params();
    params.extend(head.params());
    let mut opt = Sgd::new(params, 1e-3);
    let step = || -> kiln::Result<Tensor> {
        let last = rnn.forward(&x).narrow(0, SEQ - 1, 1).squeeze(0);
        let loss = (head.forward(&last) - &t).square().sum_all();
        let grads = loss.backward()?;
        opt.step(grads, &[&loss])?;
        Ok(loss)
    };
    let timing = steps::time_steps(runs, WARMUP, step)?;
    timing.print(&name, runs, WARMUP, false);
    Ok(timing.median)
}

fn main() -> kiln::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let mut rows = Vec::new();
    for &cell in &args.cell {
        rows.push((format!("{cell:?}").to_lowercase(), run(cell, args.runs)?));
    }
    steps::finish(&rows, args.json);
    Ok(())
}
