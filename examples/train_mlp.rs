//! The seed's benchmark: train a 784 -> 256 -> 128 -> 10 MLP and print the time per step.
//!
//! Exactly the model of the comparison (benches/compare/mlp_torch.py runs the same step in PyTorch): no bias,
//! leaky_relu(0.01) after layers 1 and 2, Kaiming-normal init, loss `((out - t)^2).sum()`, SGD lr 1e-3, f32, the same
//! fixed x (B x 784) and t (B x 10, scaled by 0.1) every step. A step is forward + backward + SGD update: kiln records
//! it, realizes the new weights and the loss as one graph, and from the second step on replays the compiled plan.
//!
//! ```text
//! cargo run --release --example train_mlp                 # batches 1, 32, 128, 256, 512, 1024
//! cargo run --release --example train_mlp -- --batch 32   # one batch size (or a list: --batch 1,32)
//! cargo run --release --example train_mlp -- --device wgpu --batch 32   # on the wgpu device
//! cargo run --release --features cuda --example train_mlp -- --device cuda --batch 1   # on CUDA device 0
//! cargo run --release --example train_mlp -- --batch 1 --steps 20000   # a longer run, for `perf record`
//! cargo run --release --example train_mlp -- --dtype bf16   # weights, data and the step in bf16
//! ```
//! With `--dtype bf16` the weights, x and t are bf16 and every op of the step computes in f32 and rounds to bf16,
//! as PyTorch does with bf16 tensors (`mlp_torch.py --dtype bf16` runs that); SGD updates the bf16 weights in place
//! (no f32 master copy, as `torch.optim.SGD` on bf16 parameters).
//! Prints, per batch: `batch N: X µs/step (median of 100 after 10 warm-up), first step Y ms`, then the loss. With
//! `--phases`, also where a step's time goes: recording the forward pass and loss, recording the backward pass, and
//! the optimizer step (recording the update, then realizing the step: looking its plan up, running its kernels,
//! handing out the new buffers); with `KILN_PROFILE=1` the kernels' share of the last is in the profile below.
//! What bounds a batch-1 step on a CPU is that split (docs/benchmarks.md).

use kiln::nn::{self, Module, Param};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
use std::num::NonZeroUsize;
use std::time::Instant;

const WARMUP: usize = 10;
/// Timed steps per batch size unless `--steps N` says otherwise (more steps for a profiler run).
const STEPS: usize = 100;

/// The benchmark model: three bias-free linear layers with leaky_relu(0.01) between them.
struct Mlp {
    w: [Param; 3],
}

impl Mlp {
    fn new(dev: &Device, dtype: DType) -> Mlp {
        let layer =
            |name: &str, i: usize, o: usize| Param::new(name, nn::init::kaiming_normal([o, i], i, dev).to_dtype(dtype));
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

/// Trains the seed's 784 -> 256 -> 128 -> 10 MLP benchmark and prints the median time per step for each batch size.
#[derive(clap::Parser)]
#[command(name = "train_mlp")]
struct Args {
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32,128,256,512,1024")]
    batch: Vec<NonZeroUsize>,
    /// Timed steps per batch size (after 10 warm-up steps).
    #[arg(long, default_value_t = NonZeroUsize::new(STEPS).expect("positive"))]
    steps: NonZeroUsize,
    /// `cpu`, `wgpu`, or `cuda` / `hip` (`cuda:N`, `hip:N`) in a build with that feature.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// `f32` or `bf16`: the dtype of the weights, the data and the step.
    #[arg(long, default_value = "f32", value_parser = float_dtype)]
    dtype: DType,
    /// Also print the median time of each phase of a step (see the module doc).
    #[arg(long)]
    phases: bool,
}

fn float_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        _ => Err(format!("{s}: the step runs in f32 or bf16")),
    }
}

/// Seconds a step spent recording the forward pass and loss, recording the backward pass, and in the optimizer step
/// (recording the update and realizing the step, the device synchronized).
type Phases = [f64; 3];

/// The benchmark's fixed model, data and optimizer for `batch`, and a closure running one step (and writing the
/// time of each of its phases).
fn setup(batch: usize, dev: &Device, dtype: DType) -> kiln::Result<impl FnMut(&mut Phases) -> kiln::Result<Tensor>> {
    kiln::manual_seed(0);
    let model = Mlp::new(dev, dtype);
    let x = Tensor::randn([batch, 784], DType::F32, dev).to_dtype(dtype);
    let t = (Tensor::randn([batch, 10], DType::F32, dev) * 0.1).to_dtype(dtype);
    kiln::realize(&[&x, &t])?;
    model.realize_params()?;
    let mut opt = Sgd::new(model.params(), 1e-3);
    let dev = *dev;
    Ok(move |phases: &mut Phases| -> kiln::Result<Tensor> {
        let t0 = Instant::now();
        let loss = (model.forward(&x) - &t).square().sum_all();
        let t1 = Instant::now();
        let grads = loss.backward()?;
        let t2 = Instant::now();
        opt.step(grads, &[&loss])?;
        // A GPU queue runs ahead of the host: wait, so a step's time is its whole run.
        dev.synchronize()?;
        *phases = [t1 - t0, t2 - t1, t2.elapsed()].map(|d| d.as_secs_f64());
        Ok(loss)
    })
}

/// The first step (1-based) of `steps` whose loss is not finite, in a fresh untimed run (reading the loss every
/// step would change what the timed run measures).
fn first_non_finite_step(batch: usize, steps: usize, dev: &Device, dtype: DType) -> kiln::Result<Option<usize>> {
    let mut step = setup(batch, dev, dtype)?;
    for i in 1..=steps {
        if !step(&mut Phases::default())?.to_dtype(DType::F32).item::<f32>()?.is_finite() {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

fn run(batch: usize, steps: usize, dev: &Device, dtype: DType, print_phases: bool) -> kiln::Result<()> {
    let mut step = setup(batch, dev, dtype)?;
    let mut phases = Phases::default();
    let t0 = Instant::now();
    let first_loss = step(&mut phases)?;
    let first = t0.elapsed();
    for _ in 1..WARMUP {
        step(&mut phases)?;
    }
    let mut times = Vec::with_capacity(steps);
    let mut phase_times: [Vec<f64>; 3] = Default::default();
    let mut last = first_loss.clone();
    for _ in 0..steps {
        let t0 = Instant::now();
        last = step(&mut phases)?;
        times.push(t0.elapsed().as_secs_f64());
        for (all, t) in phase_times.iter_mut().zip(phases) {
            all.push(t);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "batch {batch}: {:.1} µs/step (median of {steps} after {WARMUP} warm-up), first step {:.2} ms",
        median(&mut times) * 1e6,
        first.as_secs_f64() * 1e3
    );
    if print_phases {
        let [fwd, bwd, opt] = phase_times.each_mut().map(|v| median(v) * 1e6);
        println!(
            "  phases (medians): forward + loss recorded {fwd:.1} µs, backward recorded {bwd:.1} µs, \
             optimizer step (update recorded, step realized) {opt:.1} µs"
        );
    }
    let wide = |t: &Tensor| t.to_dtype(DType::F32).item::<f32>();
    let (first_loss, last_loss) = (wide(&first_loss)?, wide(&last)?);
    let mut note = String::new();
    if !last_loss.is_finite() {
        // The benchmark's loss is a sum over the batch at a fixed lr 1e-3: past batch 32 the first steps overshoot
        // and it blows up. PyTorch does the same (benches/compare/mlp_divergence.py: not finite from step 5 at
        // batch 64, step 4 at 128 to 1024); the definition is kept, as the comparison needs it.
        let at = first_non_finite_step(batch, WARMUP + steps, dev, dtype)?.map_or("?".to_string(), |s| s.to_string());
        note = format!(
            " (not finite from step {at}: the benchmark's sum loss at lr 1e-3 diverges here in PyTorch too; \
             benches/compare/mlp_divergence.py prints its step)"
        );
    }
    println!("  loss {first_loss:.4} -> {last_loss:.4} over {} steps{note}", WARMUP + steps);
    Ok(())
}

fn main() -> kiln::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let dev = args.device;
    println!("device: {}, {}", dev.describe(), args.dtype);
    for b in args.batch {
        run(b.get(), args.steps.get(), &dev, args.dtype, args.phases)?;
    }
    let s = kiln::stats();
    println!(
        "plans compiled: {}, cache hits: {}, parameter buffers updated in place: {}",
        s.compiles, s.plan_hits, s.donated_buffers
    );
    print!("{}", kiln::profile_report());
    Ok(())
}
