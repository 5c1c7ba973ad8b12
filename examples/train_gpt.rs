//! A small GPT trained end to end on characters: a decoder-only transformer (token and position embeddings, pre-norm
//! blocks of causal self-attention and a GELU MLP, a tied output head) learns Shakespeare's sonnets
//! (`examples/data/sonnets.txt`, public domain) with AdamW, a linear warm-up then cosine decay of the learning rate,
//! and gradient clipping; prints the loss, tokens per second, and a sample drawn from the trained model.
//!
//! ```text
//! cargo run --release --example train_gpt                         # 4 layers, d_model 128, 4 heads, context 64
//! cargo run --release --example train_gpt -- --steps 2000         # longer: the sample starts to read as verse
//! cargo run --release --example train_gpt -- --device wgpu        # on the wgpu device
//! cargo run --release --example train_gpt -- --dtype bf16         # bf16 weights, f32 master weights in AdamW
//! cargo run --release --example train_gpt -- --init w.safetensors  # given weights (and a fixed batch)
//! cargo build --release --features mpi --example train_gpt         # data-parallel over MPI ranks:
//! mpirun -np 2 -x KILN_NUM_THREADS=1 target/release/examples/train_gpt --distributed
//! ```
//! With `--distributed` each rank draws its own `batch / world` windows a step and the ranks average their
//! gradients (`kiln::distributed::DataParallel`, before clipping), so a step still covers `batch` sequences; rank 0
//! prints (the loss is the ranks' mean) and samples.
//! Prints the loss every 50 steps, then the first step's time (the plan's compile) and the median step time.
//!
//! The model is the one `benches/compare/gpt_torch.py` times against PyTorch and `tests/gpt.rs` holds to a recorded
//! PyTorch run (`tests/fixtures/make_gpt_parity.py`): same names, layouts and order of operations. Every step is the
//! same graph (a batch of `[batch, context]` i32 tokens, the learning rate a run-time input), so kiln compiles one
//! plan for the step and replays it.

use kiln::distributed::{DataParallel, ProcessGroup, ReduceOp};
use kiln::nn::functional::{self as F, Approximate, AttentionOptions};
use kiln::nn::{LayerNorm, Linear, Module, Param, init};
use kiln::optim::schedule::{CosineAnnealingLr, LinearLr, LrSchedule, Sequential};
use kiln::optim::{AdamW, GroupOptions, Optimizer};
use kiln::{DType, Device, Generator, Tensor};
use std::collections::HashMap;
use std::time::Instant;

/// The transformer's shape.
#[derive(Clone, Copy, Debug)]
pub struct GptConfig {
    pub vocab: usize,
    pub context: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
}

/// One pre-norm block: `x + proj(attn(ln1(x)))`, then `x + out(gelu(fc(ln2(x))))`.
pub struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    out: Linear,
    heads: usize,
}

impl Block {
    /// `x`: `[batch * context, d_model]` rows of `batch` sequences.
    fn forward(&self, x: &Tensor, batch: usize) -> Tensor {
        let (rows, d) = (x.dims()[0], x.dims()[1]);
        let (t, h) = (rows / batch, self.heads);
        // [B*T, 3D] -> [3, B, H, T, D/H]: the queries, keys and values of every head.
        let qkv = self.qkv.forward(&self.ln1.forward(x)).reshape([batch, t, 3, h, d / h]).permute([2, 0, 3, 1, 4]);
        let part = |i: usize| qkv.narrow(0, i, 1).squeeze(0);
        let causal = AttentionOptions { is_causal: true, ..Default::default() };
        let a = F::scaled_dot_product_attention(&part(0), &part(1), &part(2), &causal);
        let x = x.add(self.proj.forward(&a.permute([0, 2, 1, 3]).reshape([rows, d])));
        let m = self.out.forward(&F::gelu(&self.fc.forward(&self.ln2.forward(&x)), Approximate::Tanh));
        x.add(m)
    }

    fn named_params(&self, prefix: &str) -> Vec<(String, Param)> {
        let mut p = self.ln1.named_params_prefixed(&format!("{prefix}.ln1"));
        p.extend(self.qkv.named_params_prefixed(&format!("{prefix}.qkv")));
        p.extend(self.proj.named_params_prefixed(&format!("{prefix}.proj")));
        p.extend(self.ln2.named_params_prefixed(&format!("{prefix}.ln2")));
        p.extend(self.fc.named_params_prefixed(&format!("{prefix}.fc")));
        p.extend(self.out.named_params_prefixed(&format!("{prefix}.out")));
        p
    }
}

/// The model: `logits = ln_f(blocks(wte[tokens] + wpe[positions])) @ wteᵀ`.
pub struct Gpt {
    pub cfg: GptConfig,
    wte: Param,
    wpe: Param,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl Gpt {
    /// Weights ~ N(0, 0.02) (the residual projections scaled by 1 / sqrt(2 * layers), as GPT-2), biases 0, norms 1.
    pub fn new(cfg: GptConfig, dev: &Device, g: &Generator) -> Gpt {
        let d = cfg.d_model;
        let normal = |shape: [usize; 2], std: f64| init::normal_with(shape, 0.0, std, dev, g);
        let zeros = |n: usize| Tensor::zeros([n], DType::F32, dev);
        let linear = |i: usize, o: usize, std: f64| Linear::from_weight(normal([o, i], std), Some(zeros(o)));
        let norm = || LayerNorm::new([d], dev);
        let resid = 0.02 / (2.0 * cfg.layers as f64).sqrt();
        let blocks = (0..cfg.layers)
            .map(|_| Block {
                ln1: norm(),
                qkv: linear(d, 3 * d, 0.02),
                proj: linear(d, d, resid),
                ln2: norm(),
                fc: linear(d, 4 * d, 0.02),
                out: linear(4 * d, d, resid),
                heads: cfg.heads,
            })
            .collect();
        Gpt {
            cfg,
            wte: Param::new("wte", normal([cfg.vocab, d], 0.02)),
            wpe: Param::new("wpe", normal([cfg.context, d], 0.01)),
            blocks,
            ln_f: norm(),
        }
    }

    /// The model with the weights `named` holds under `named_params`' names (a checkpoint, PyTorch's layouts).
    pub fn from_named(cfg: GptConfig, named: &HashMap<String, Tensor>) -> Result<Gpt, String> {
        let get = |n: &str| named.get(n).cloned().ok_or_else(|| format!("no tensor `{n}`"));
        let linear = |p: &str| {
            Ok::<_, String>(Linear::from_weight(get(&format!("{p}.weight"))?, Some(get(&format!("{p}.bias"))?)))
        };
        let norm = |p: &str| {
            Ok::<_, String>(LayerNorm::from_params(
                get(&format!("{p}.weight"))?,
                Some(get(&format!("{p}.bias"))?),
                1e-5,
            ))
        };
        let mut blocks = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = format!("h.{i}");
            blocks.push(Block {
                ln1: norm(&format!("{p}.ln1"))?,
                qkv: linear(&format!("{p}.qkv"))?,
                proj: linear(&format!("{p}.proj"))?,
                ln2: norm(&format!("{p}.ln2"))?,
                fc: linear(&format!("{p}.fc"))?,
                out: linear(&format!("{p}.out"))?,
                heads: cfg.heads,
            });
        }
        Ok(Gpt {
            cfg,
            wte: Param::new("wte", get("wte")?),
            wpe: Param::new("wpe", get("wpe")?),
            blocks,
            ln_f: norm("ln_f")?,
        })
    }

    /// The mean cross-entropy of predicting `targets` from `tokens` (both `[batch, context]`, i32).
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Tensor {
        let logits = self.forward(tokens);
        let v = self.cfg.vocab;
        F::cross_entropy(&logits.reshape([tokens.numel(), v]), &targets.reshape([tokens.numel()]), F::Reduction::Mean)
    }

    /// AdamW as GPT-2 trains it: weight decay on the matrices (embeddings included), none on biases and norms.
    pub fn optimizer(&self, lr: f64, weight_decay: f64, master_weights: bool) -> AdamW {
        let (decay, rest): (Vec<Param>, Vec<Param>) = self.params().into_iter().partition(|p| p.dims().len() == 2);
        AdamW::new(decay, lr)
            .betas(0.9, 0.95)
            .weight_decay(weight_decay)
            .group(rest, GroupOptions { weight_decay: Some(0.0), ..Default::default() })
            .master_weights(master_weights)
    }
}

impl Module for Gpt {
    /// `[batch, context]` tokens -> `[batch, context, vocab]` logits.
    fn forward(&self, tokens: &Tensor) -> Tensor {
        let (b, t) = (tokens.dims()[0], tokens.dims()[1]);
        let wte = self.wte.get();
        let pos = self.wpe.get().narrow(0, 0, t);
        let mut x = F::embedding(tokens, &wte).add(&pos).reshape([b * t, self.cfg.d_model]);
        for block in &self.blocks {
            x = block.forward(&x, b);
        }
        self.ln_f.forward(&x).matmul(&wte.t()).reshape([b, t, self.cfg.vocab])
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = vec![("wte".to_string(), self.wte.clone()), ("wpe".to_string(), self.wpe.clone())];
        for (i, b) in self.blocks.iter().enumerate() {
            p.extend(b.named_params(&format!("h.{i}")));
        }
        p.extend(self.ln_f.named_params_prefixed("ln_f"));
        p
    }
}

/// The learning rate of each step: a linear warm-up from 1% of `peak` over the first tenth of `steps`, then a
/// cosine decay to a tenth of it.
pub fn lr_schedule(peak: f64, steps: u64) -> Sequential {
    let warmup = (steps / 10).max(1);
    Sequential::new(
        vec![
            Box::new(LinearLr::new(peak, 0.01, 1.0, warmup)),
            Box::new(CosineAnnealingLr::new(peak, steps.saturating_sub(warmup).max(1), peak / 10.0)),
        ],
        vec![warmup],
    )
}

/// Characters to token ids and back: the text's distinct bytes, in byte order.
pub struct Vocab {
    bytes: Vec<u8>,
}

impl Vocab {
    pub fn of(text: &[u8]) -> Vocab {
        let mut bytes = text.to_vec();
        bytes.sort_unstable();
        bytes.dedup();
        Vocab { bytes }
    }

    /// The number of distinct characters (never 0: built from a non-empty text).
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    pub fn encode(&self, text: &[u8]) -> Vec<i32> {
        text.iter().map(|b| self.bytes.binary_search(b).map_or(0, |i| i as i32)).collect()
    }

    pub fn decode(&self, ids: &[i32]) -> String {
        ids.iter().map(|&i| self.bytes[i as usize] as char).collect()
    }
}

/// SplitMix64: the batch positions and the sampling draws, deterministic in the seed on every device.
pub struct HostRng(pub u64);

impl HostRng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `batch` windows of `context + 1` tokens at random places in `data`: inputs `[batch, context]` and the targets,
/// the same windows shifted by one.
pub fn batch(
    data: &[i32],
    batch: usize,
    context: usize,
    rng: &mut HostRng,
    dev: &Device,
) -> kiln::Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(batch * context);
    let mut y = Vec::with_capacity(batch * context);
    for _ in 0..batch {
        let start = (rng.next_u64() % (data.len() - context) as u64) as usize;
        x.extend_from_slice(&data[start..start + context]);
        y.extend_from_slice(&data[start + 1..start + context + 1]);
    }
    Ok((Tensor::from_vec(x, [batch, context], dev)?, Tensor::from_vec(y, [batch, context], dev)?))
}

/// `n` characters sampled from `model` after `prompt`, at `temperature`: each step runs the model on the last
/// `context` tokens, right-padded to `context` (a causal model's logits at a position do not read later ones, so
/// one plan serves every length), and draws from the softmax of the logits at the last real position.
pub fn sample(
    model: &Gpt,
    prompt: &[i32],
    n: usize,
    temperature: f64,
    rng: &mut HostRng,
    dev: &Device,
) -> kiln::Result<Vec<i32>> {
    let t = model.cfg.context;
    let mut out = prompt.to_vec();
    kiln::no_grad(|| {
        for _ in 0..n {
            let start = out.len().saturating_sub(t);
            let mut window = out[start..].to_vec();
            let last = window.len() - 1;
            window.resize(t, 0);
            let tokens = Tensor::from_vec(window, [1, t], dev)?;
            let at = Tensor::from_vec(vec![last as i32], [1], dev)?;
            let logits = model.forward(&tokens).index_select(1, &at).reshape([model.cfg.vocab]);
            let p = F::softmax(&logits.div(temperature), 0).to_vec::<f32>()?;
            let mut u = rng.unit() as f32;
            let pick = p.iter().position(|&q| {
                u -= q;
                u < 0.0
            });
            out.push(pick.unwrap_or(p.len() - 1) as i32);
        }
        Ok(out)
    })
}

/// Trains the small GPT on `examples/data/sonnets.txt` and prints its loss, speed and a sample.
#[derive(clap::Parser)]
#[command(name = "train_gpt")]
struct Args {
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 64)]
    context: usize,
    #[arg(long, default_value_t = 128)]
    d_model: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Peak learning rate (after the warm-up; the cosine decays it to a tenth).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// `cpu` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// `f32`, or `bf16` (bf16 weights and activations; AdamW keeps f32 master weights).
    #[arg(long, default_value = "f32", value_parser = float_dtype)]
    dtype: DType,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Characters to sample at the end.
    #[arg(long, default_value_t = 300)]
    sample: usize,
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// A safetensors file with the initial weights (`named_params`' names) and, optionally, `tokens`
    /// `[batch, context + 1]` (i32) to train on at every step instead of random windows of the text: how
    /// `benches/compare/gpt_torch.py` runs the same step as PyTorch.
    #[arg(long)]
    init: Option<std::path::PathBuf>,
    /// Data-parallel over the processes of an MPI launch (kiln built with `--features mpi`).
    #[arg(long)]
    distributed: bool,
}

/// The median of `xs`, `None` for none.
fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn float_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        _ => Err(format!("{s}: the model trains in f32 or bf16")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = <Args as clap::Parser>::parse();
    let dev = args.device;
    let group = if args.distributed { kiln::distributed::init()? } else { ProcessGroup::single() };
    let (world, root) = (group.world_size(), group.is_root());
    // Each rank's share of a step's sequences.
    let local_batch = args.batch.div_ceil(world);
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/sonnets.txt"))?;
    let vocab = Vocab::of(&text);
    let data = vocab.encode(&text);
    let cfg = GptConfig {
        vocab: vocab.size(),
        context: args.context,
        d_model: args.d_model,
        heads: args.heads,
        layers: args.layers,
    };
    if args.d_model % args.heads != 0 || args.context >= data.len() {
        return Err(format!(
            "d_model must be a multiple of heads, and context below the text's {} characters",
            data.len()
        )
        .into());
    }
    let (model, fixed) = match &args.init {
        Some(path) => {
            let named: HashMap<String, Tensor> = kiln::load_safetensors(path, &dev)?.into_iter().collect();
            let fixed = match named.get("tokens") {
                Some(t) if t.dims() == [args.batch, cfg.context + 1] => {
                    let t = t.to_dtype(DType::I32);
                    let (x, y) = (t.narrow(1, 0, cfg.context), t.narrow(1, 1, cfg.context));
                    // Realized once, so every step reads the same two buffers (one plan).
                    let (x, y) = (x.contiguous(), y.contiguous());
                    kiln::realize(&[&x, &y])?;
                    Some((x, y))
                }
                Some(t) => return Err(format!("tokens are {:?}, not [batch, context + 1]", t.dims()).into()),
                None => None,
            };
            (Gpt::from_named(cfg, &named)?, fixed)
        }
        None => (Gpt::new(cfg, &dev, &Generator::new(args.seed)), None),
    };
    model.to_dtype(args.dtype);
    // The weights' initialization is its own plan, realized here, so that the first step times the step's compile
    // and run only (as PyTorch's weights exist before its first step).
    let t_init = Instant::now();
    model.realize_params()?;
    let init_ms = 1e3 * t_init.elapsed().as_secs_f64();
    let mut opt = model.optimizer(args.lr, 0.1, args.dtype != DType::F32);
    let schedule = lr_schedule(args.lr, args.steps);
    let params = model.params();
    // Every rank starts from rank 0's weights and averages its gradients with the others'.
    let ddp = if world > 1 { Some(DataParallel::new(&group, params.clone())?) } else { None };
    if fixed.is_some() && world > 1 {
        return Err("--init with fixed tokens trains one batch; it does not split over ranks".into());
    }
    let say = |line: String| {
        if root {
            println!("{line}");
        }
    };
    say(format!(
        "train_gpt: {} parameters ({} layers, d_model {}, {} heads, context {}; initialized in {init_ms:.0} ms), {} \
         characters of text, vocabulary {}, {} on {dev}{}",
        params.iter().map(|p| p.get().numel()).sum::<usize>(),
        cfg.layers,
        cfg.d_model,
        cfg.heads,
        cfg.context,
        data.len(),
        cfg.vocab,
        args.dtype,
        if world > 1 {
            format!(", data-parallel over {world} processes ({local_batch} sequences each)")
        } else {
            String::new()
        }
    ));
    // Each rank draws its own windows.
    let mut rng = HostRng(args.seed ^ 0x5eed ^ (group.rank() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut times = Vec::with_capacity(args.steps as usize);
    let mut loss_at = f32::NAN;
    // Steps before this one compile the plan and warm the host: not in the median.
    const WARMUP: usize = 3;
    let speed = |times: &[f64]| {
        median(times.get(WARMUP..).unwrap_or(&[])).map(|t| (local_batch * world * cfg.context) as f64 / t)
    };
    for step in 0..args.steps {
        let t0 = Instant::now();
        opt.set_lr(schedule.lr(step));
        let (x, y) = match &fixed {
            Some((x, y)) => (x.clone(), y.clone()),
            None => batch(&data, local_batch, cfg.context, &mut rng, &dev)?,
        };
        let loss = model.loss(&x, &y);
        let grads = loss.backward()?;
        let mut grads = match &ddp {
            Some(ddp) => ddp.average(grads, &[&loss])?,
            None => grads,
        };
        let norm = kiln::nn::clip_grad_norm(&mut grads, &params, 1.0);
        opt.step(grads, &[&loss, &norm])?;
        let report = step % 50 == 0 || step + 1 == args.steps;
        if report {
            let mean = group.all_reduce(&loss.to_dtype(DType::F32), ReduceOp::Mean)?;
            loss_at = mean.item::<f32>()?;
        }
        times.push(t0.elapsed().as_secs_f64());
        if report {
            let tokens = speed(&times).map_or(String::new(), |v| format!("  {v:.0} tokens/s"));
            say(format!("step {step:>5}  loss {loss_at:.4}  lr {:.2e}{tokens}", schedule.lr(step)));
        }
    }
    if !root {
        return Ok(());
    }
    let first = 1e3 * times.first().copied().unwrap_or(f64::NAN);
    match (median(times.get(WARMUP..).unwrap_or(&[])), speed(&times)) {
        (Some(t), Some(tokens)) => println!(
            "first step {first:.0} ms, then {:.2} ms/step (median of {} steps), {tokens:.0} tokens/s; final loss \
             {loss_at:.4}",
            1e3 * t,
            times.len() - WARMUP
        ),
        // Too few steps for a median past the warm-up (`--steps` at most WARMUP): no step time to report.
        _ => println!(
            "first step {first:.0} ms; no step time (the median starts after {WARMUP} warm-up steps); final loss \
             {loss_at:.4}"
        ),
    }
    print!("{}", kiln::profile_report());
    let prompt = vocab.encode(b"Shall I");
    let text = sample(&model, &prompt, args.sample, args.temperature, &mut rng, &dev)?;
    println!("--- sample (temperature {}) ---\n{}", args.temperature, vocab.decode(&text));
    Ok(())
}
