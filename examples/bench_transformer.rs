//! A transformer's training step, timed: a 2-layer `TransformerEncoder` and a 2 + 2-layer encoder-decoder
//! `Transformer` (d_model 128, 4 heads, feed-forward 512, no dropout, batch first) over a batch of 16 sequences of
//! 64, loss `((out - t)^2).mean()`, SGD lr 1e-2, f32, the same inputs every step (the decoder's target causal). A
//! step is forward + backward + SGD update, one graph that kiln compiles once and replays;
//! benches/compare/transformer_torch.py runs the same steps in PyTorch.
//!
//! ```text
//! cargo run --release --example bench_transformer
//! cargo run --release --example bench_transformer -- --model encoder
//! ```
//! Prints, per model: `encoder: X ms/step (median of N after 5 warm-up), first step Y ms`, then the loss; with
//! `--json` a last line `{"encoder step": seconds, ...}` for the comparison script.

use kiln::nn::{
    AttentionMasks, Module, Transformer, TransformerEncoder, TransformerEncoderLayer, TransformerMasks,
    TransformerOptions,
};
use kiln::optim::{Optimizer, Sgd};
use kiln::{DType, Device, Tensor};
#[path = "common/steps.rs"]
mod steps;

const WARMUP: usize = 5;
const BATCH: usize = 16;
const LEN: usize = 64;
const D: usize = 128;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Model {
    Encoder,
    Transformer,
}

#[derive(clap::Parser)]
#[command(name = "bench_transformer")]
struct Args {
    #[arg(long, value_delimiter = ',', default_value = "encoder,transformer")]
    model: Vec<Model>,
    #[arg(long, default_value_t = 30)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

fn run(model: Model, runs: usize) -> kiln::Result<f64> {
    kiln::manual_seed(0);
    let dev = Device::cpu();
    let opts = TransformerOptions { dim_feedforward: 512, dropout: 0.0, batch_first: true, ..Default::default() };
    let src = Tensor::randn([BATCH, LEN, D], DType::F32, &dev);
    let tgt = Tensor::randn([BATCH, LEN, D], DType::F32, &dev);
    let t = Tensor::randn([BATCH, LEN, D], DType::F32, &dev);
    let causal = Transformer::generate_square_subsequent_mask(LEN, &dev);
    kiln::realize(&[&src, &tgt, &t, &causal])?;
    let (encoder, transformer) = match model {
        Model::Encoder => {
            let layer = TransformerEncoderLayer::new(D, 4, opts, &dev);
            (Some(TransformerEncoder::new(&layer, 2, None)), None)
        }
        Model::Transformer => (None, Some(Transformer::new(D, 4, 2, 2, opts, &dev))),
    };
    let module: &dyn Module = match (&encoder, &transformer) {
        (Some(e), _) => e,
        (_, Some(m)) => m,
        _ => unreachable!("one is built"),
    };
    module.realize_params()?;
    let mut opt = Sgd::new(module.params(), 1e-2);
    let step = || -> kiln::Result<Tensor> {
        let out = match (&encoder, &transformer) {
            (Some(e), _) => e.forward(&src),
            (_, Some(m)) => {
                let tgt_masks = AttentionMasks { mask: Some(&causal), ..Default::default() };
                m.forward_with(&src, &tgt, TransformerMasks { tgt: tgt_masks, ..Default::default() })
            }
            _ => unreachable!("one is built"),
        };
        let loss = (out - &t).square().mean_all();
        let grads = loss.backward()?;
        opt.step(grads, &[&loss])?;
        Ok(loss)
    };
    let name = format!("{model:?}").to_lowercase();
    let timing = steps::time_steps(runs, WARMUP, step)?;
    timing.print(&name, runs, WARMUP, true);
    Ok(timing.median)
}

fn main() -> kiln::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let mut rows = Vec::new();
    for &model in &args.model {
        rows.push((format!("{model:?}").to_lowercase(), run(model, args.runs)?));
    }
    steps::finish(&rows, args.json);
    Ok(())
}
