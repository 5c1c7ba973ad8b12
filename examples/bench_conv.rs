//! Convolution and lookup timings: `conv2d` forward on a few ResNet-shaped layers (the 3 x 3, 64 -> 64
//! channels at 56 x 56, a strided downsampling 3 x 3, a 1 x 1 projection, a 7 x 7 stem) and one forward + backward
//! (`sum(y * dy)` with a fixed random `dy`, both gradients), f32, NCHW; then a language model's two vocabulary-sized
//! steps at a 32k vocabulary and 4096 tokens, forward + backward: an embedding lookup (`sum(embedding(ids, table) *
//! dy)`, the table's gradient: a scatter-sum) and `cross_entropy` over `[4096, 32000]` logits (their gradient).
//! Inputs are seeded normal values; every figure is the median of `--runs` calls after two warm-up calls, each a
//! build of the lazy graph and its realize (the plan is compiled at the first call and replayed after).
//!
//! `cargo run --release --example bench_conv [-- --runs N] [--json]`
//!
//! `benches/compare/conv_torch.py` runs this with `--json` and PyTorch's `F.conv2d` (oneDNN) on the same shapes in
//! the same session, and prints the ratios.

use kiln::nn::functional::{Conv2dOptions, conv2d};
use kiln::{DType, Device, Tensor};
#[path = "../benches/timing/mod.rs"]
mod timing;

use timing::median_of_calls;

#[derive(clap::Parser)]
#[command(name = "bench_conv")]
struct Args {
    /// Calls timed per row (the table gives medians; at least 3).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(3..))]
    runs: u32,
    /// Also print the medians as one JSON line (what benches/compare/conv_torch.py reads).
    #[arg(long)]
    json: bool,
}

/// One benchmarked layer: name, input `[N, C, H, W]`, weight `[O, C, KH, KW]`, stride, padding, and whether the
/// timed call is forward + backward (the input's and the weight's gradients).
type Layer = (&'static str, [usize; 4], [usize; 4], usize, usize, bool);

/// The layers, in the order `conv_torch.py` reads them.
pub const LAYERS: [Layer; 5] = [
    ("3x3 64->64 56x56 b8", [8, 64, 56, 56], [64, 64, 3, 3], 1, 1, false),
    ("3x3 s2 64->128 56x56 b8", [8, 64, 56, 56], [128, 64, 3, 3], 2, 1, false),
    ("1x1 256->64 56x56 b8", [8, 256, 56, 56], [64, 256, 1, 1], 1, 0, false),
    ("7x7 s2 3->64 224x224 b8", [8, 3, 224, 224], [64, 3, 7, 7], 2, 3, false),
    ("3x3 64->64 56x56 b8, fwd+bwd", [8, 64, 56, 56], [64, 64, 3, 3], 1, 1, true),
];

/// Seconds per call of `layer`: the median of `runs` calls after two warm-up calls.
fn time_layer(&(_, input, weight, stride, padding, backward): &Layer, runs: u32) -> f64 {
    let dev = Device::cpu();
    let x = Tensor::randn(input, DType::F32, &dev);
    let w = Tensor::randn(weight, DType::F32, &dev).mul(0.05);
    kiln::realize(&[&x, &w]).expect("inputs");
    let opts = Conv2dOptions { stride: [stride; 2], padding: [padding; 2], ..Default::default() };
    // The upstream gradient of the forward + backward row: fixed random values (a loss `sum(y)` would make it
    // a constant, which turns the gradients' matmuls into sums).
    let dy = Tensor::randn(conv2d(&x, &w, None, &opts).dims(), DType::F32, &dev);
    dy.realize().expect("upstream gradient");
    let call = || {
        if backward {
            let (x, w) = (x.detach().requires_grad(), w.detach().requires_grad());
            let y = conv2d(&x, &w, None, &opts);
            let grads = y.mul(&dy).sum_all().backward().expect("backward");
            let (gx, gw) = (grads.get(&x).expect("dx"), grads.get(&w).expect("dw"));
            kiln::realize(&[&y, gx, gw]).expect("realize");
        } else {
            conv2d(&x, &w, None, &opts).realize().expect("realize");
        }
    };
    median_of_calls(runs, call)
}

/// The vocabulary-sized rows: name, vocabulary, tokens, embedding width (0 for the cross-entropy row).
pub const LOOKUPS: [(&str, usize, usize, usize); 2] = [
    ("embedding 32k x 128, 4096 tokens, fwd+bwd", 32_000, 4096, 128),
    ("cross_entropy 4096 x 32k, fwd+bwd", 32_000, 4096, 0),
];

/// Seconds per call of a `LOOKUPS` row, as [`time_layer`].
fn time_lookup(&(_, vocab, tokens, dim): &(&str, usize, usize, usize), runs: u32) -> f64 {
    let dev = Device::cpu();
    let ids: Vec<i64> = (0..tokens as i64).map(|t| (t * 7919 + 13) % vocab as i64).collect();
    let ids = Tensor::from_vec(ids, [tokens], &dev).expect("ids");
    let table = Tensor::randn([vocab, dim.max(1)], DType::F32, &dev);
    let logits = Tensor::randn([tokens, vocab], DType::F32, &dev);
    let dy = Tensor::randn([tokens, dim.max(1)], DType::F32, &dev);
    kiln::realize(&[&ids, &table, &logits, &dy]).expect("inputs");
    let call = || {
        let (leaf, loss) = if dim > 0 {
            let t = table.detach().requires_grad();
            let loss = kiln::nn::functional::embedding(&ids, &t).mul(&dy).sum_all();
            (t, loss)
        } else {
            let l = logits.detach().requires_grad();
            let loss = kiln::nn::functional::cross_entropy(&l, &ids, kiln::nn::functional::Reduction::Mean);
            (l, loss)
        };
        let grads = loss.backward().expect("backward");
        kiln::realize(&[&loss, grads.get(&leaf).expect("gradient")]).expect("realize");
    };
    median_of_calls(runs, call)
}

fn main() {
    let args: Args = clap::Parser::parse();
    let mut json = Vec::new();
    println!("| layer | kiln ms | GFLOP/s |");
    println!("|---|---|---|");
    for layer in &LAYERS {
        let s = time_layer(layer, args.runs);
        let &(name, [n, c, h, w], [o, _, kh, kw], stride, padding, backward) = layer;
        let out = |len: usize, k: usize| (len + 2 * padding - k) / stride + 1;
        let macs = (n * o * out(h, kh) * out(w, kw) * c * kh * kw) as f64;
        let flops = 2.0 * macs * if backward { 3.0 } else { 1.0 };
        println!("| {name} | {:.2} | {:.0} |", s * 1e3, flops / s / 1e9);
        json.push(format!("\"{name}\": {s}"));
    }
    for row in &LOOKUPS {
        let s = time_lookup(row, args.runs);
        println!("| {} | {:.2} | |", row.0, s * 1e3);
        json.push(format!("\"{}\": {s}", row.0));
    }
    if args.json {
        println!("{{{}}}", json.join(", "));
    }
}
