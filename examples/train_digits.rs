//! A real learning task: classify the 8x8 hand-written digits of `examples/data/digits.csv` (UCI / scikit-learn,
//! 1,797 samples, see `examples/data/README.md`) with a 64 -> 128 -> 10 MLP (relu), Adam and cross-entropy.
//!
//! - Pixels (0..16) are scaled to [0, 1]. The 80/20 split is deterministic (`Split`): by default every fifth
//!   sample (index 0, 5, 10, ...) is one of the 360 test samples and the other 1,437 train, so both sides sample
//!   the whole file, as a shuffled split does. The defaults reach 97.5% test accuracy on average, never below 96.9%
//!   over seeds 0..99. `--split head` tests on the last 360 samples instead (the file is not in random order):
//!   this MLP reaches only about 90% there (1-nearest-neighbour: 95.6%), a property of the data, not of kiln (a
//!   plain f64 implementation of the same training gives the same losses and accuracies).
//! - Each epoch visits the training set in a new order: a Fisher-Yates shuffle driven by SplitMix64 seeded from
//!   `--seed`, which also seeds kiln's generator (`kiln::manual_seed`) for the initial weights, so a run is
//!   reproducible.
//! - Mini-batches of `--batch` samples are copied on the host and uploaded. The last batch of an epoch is smaller
//!   (1,437 = 44 x 32 + 29 with the default 32) and is kept: a batch of another shape is another graph signature,
//!   so it compiles a second training plan once (in the first epoch) and replays it after. Compiles in all: the
//!   initial weights, the full-batch step, the partial-batch step and the evaluation pass; none after epoch 1.
//! - A step is forward + backward + Adam update, realized with the loss as one plan (`opt.step(grads, &[&loss])`).
//!
//! ```text
//! cargo run --release --example train_digits
//! cargo run --release --example train_digits -- --epochs 20 --batch 64 --lr 0.005 --hidden 256 --seed 7
//! cargo run --release --example train_digits -- --split head --data path/to/digits.csv
//! cargo run --release --example train_digits -- --device wgpu
//! cargo build --release --features mpi --example train_digits
//! mpirun -np 2 -x KILN_NUM_THREADS=1 target/release/examples/train_digits --distributed
//! ```
//! With `--distributed` under an MPI launcher, each rank trains on its share of every epoch (`DistributedSampler`,
//! `batch / world` samples a step) and the ranks average their gradients (`DataParallel`); rank 0 prints.
//! Prints per epoch the mean training loss, the test accuracy and the time per step (the median over the epoch's
//! steps, so the first epoch's two compiling steps do not skew it; the epoch's total time shows them), then the
//! final test accuracy and `kiln::stats()`.
//!
//! `tests/digits.rs` uses this file as a module (`load_digits`, `parse_digits`, `Digits::split`, `train`), so the
//! test trains the same model with the same code.

use kiln::distributed::{DataParallel, DistributedSampler, ProcessGroup, ReduceOp};
use kiln::nn::functional::{self as F, Reduction};
use kiln::nn::{Linear, Module, Param};
use kiln::optim::{Adam, Optimizer};
use kiln::{DType, Device, Tensor};
use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Pixels per image (8 x 8).
pub const PIXELS: usize = 64;
/// Classes (the digits 0..9).
pub const CLASSES: usize = 10;
/// Samples in `digits.csv`.
pub const SAMPLES: usize = 1797;

/// Where the data set ships with the crate.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/digits.csv")
}

/// A data set in memory: `pixels` is row-major `[len, 64]`, scaled to [0, 1]; `labels` are 0..9.
#[derive(Clone, Debug, Default)]
pub struct Digits {
    pub pixels: Vec<f32>,
    pub labels: Vec<i64>,
}

impl Digits {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The samples whose index satisfies `keep`, in order, as a new data set.
    pub fn select(&self, keep: impl Fn(usize) -> bool) -> Digits {
        let mut out = Digits::default();
        for i in (0..self.len()).filter(|&i| keep(i)) {
            out.pixels.extend_from_slice(&self.pixels[i * PIXELS..(i + 1) * PIXELS]);
            out.labels.push(self.labels[i]);
        }
        out
    }

    /// The deterministic 80/20 split into (train, test); see `Split`.
    pub fn split(&self, split: Split) -> (Digits, Digits) {
        let is_test = move |i: usize| match split {
            Split::Interleaved => i.is_multiple_of(5),
            Split::Head => i >= self.len() - self.len().div_ceil(5),
        };
        (self.select(|i| !is_test(i)), self.select(is_test))
    }

    /// The samples `idx` (in that order) as an input `[n, 64]` f32 and a target `[n]` i64, uploaded to `dev`.
    pub fn batch(&self, idx: &[usize], dev: &Device) -> kiln::Result<(Tensor, Tensor)> {
        let mut x = Vec::with_capacity(idx.len() * PIXELS);
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            x.extend_from_slice(&self.pixels[i * PIXELS..(i + 1) * PIXELS]);
            // i32 class indices: the wgpu device has no 64-bit integers, and cross_entropy compares in i32 anyway.
            y.push(self.labels[i] as i32);
        }
        Ok((Tensor::from_vec(x, [idx.len(), PIXELS], dev)?, Tensor::from_vec(y, [idx.len()], dev)?))
    }
}

/// How `Digits::split` divides the 1,797 samples into 1,437 train and 360 test (both deterministic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Split {
    /// Every fifth sample (index 0, 5, 10, ...) tests, the rest train: both sides sample the whole file, as a
    /// shuffled split (scikit-learn's `train_test_split`) does.
    #[default]
    Interleaved,
    /// The last 360 samples test, the first 1,437 train. The file is not in random order and its tail is harder
    /// to generalize to: this MLP reaches about 90% here.
    Head,
}

impl std::str::FromStr for Split {
    type Err = String;
    fn from_str(s: &str) -> Result<Split, String> {
        match s {
            "interleaved" => Ok(Split::Interleaved),
            "head" => Ok(Split::Head),
            _ => Err(format!("unknown split {s:?} (interleaved or head)")),
        }
    }
}

/// Why loading or training failed.
#[derive(Debug)]
pub enum DigitsError {
    /// The file could not be read.
    Io { path: PathBuf, source: std::io::Error },
    /// A line (1-based) is not 64 pixel values in 0..=16 followed by a label in 0..=9.
    Malformed { source: String, line: usize, message: String },
    /// The file parsed but does not hold the expected number of samples.
    Count { source: String, found: usize, expected: usize },
    /// kiln failed (compiling or running a plan).
    Kiln(kiln::Error),
}

impl fmt::Display for DigitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DigitsError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            DigitsError::Malformed { source, line, message } => write!(f, "{source}:{line}: {message}"),
            DigitsError::Count { source, found, expected } => {
                write!(f, "{source}: {found} samples, expected {expected} (the scikit-learn digits data set)")
            }
            DigitsError::Kiln(e) => write!(f, "kiln: {e}"),
        }
    }
}

impl std::error::Error for DigitsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DigitsError::Io { source, .. } => Some(source),
            DigitsError::Kiln(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kiln::Error> for DigitsError {
    fn from(e: kiln::Error) -> DigitsError {
        DigitsError::Kiln(e)
    }
}

/// Parses CSV text: one sample per line, 64 integer pixel values in 0..=16 then the label in 0..=9, separated by
/// commas (spaces around values and a trailing `\r` are allowed; blank lines are skipped). `source` names the
/// text in error messages (`source:line: ...`). Pixels are scaled to [0, 1].
pub fn parse_digits(text: &str, source: &str) -> Result<Digits, DigitsError> {
    let mut data = Digits::default();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let bad = |message: String| DigitsError::Malformed { source: source.to_string(), line: line_no, message };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != PIXELS + 1 {
            return Err(bad(format!(
                "expected {} comma-separated values ({PIXELS} pixels and a label), found {}",
                PIXELS + 1,
                fields.len()
            )));
        }
        for (col, field) in fields[..PIXELS].iter().enumerate() {
            match field.parse::<u8>() {
                Ok(v) if v <= 16 => data.pixels.push(f32::from(v) / 16.0),
                _ => {
                    return Err(bad(format!("pixel {} is {field:?}; expected an integer in 0..=16", col + 1)));
                }
            }
        }
        match fields[PIXELS].parse::<u8>() {
            Ok(v) if usize::from(v) < CLASSES => data.labels.push(i64::from(v)),
            _ => return Err(bad(format!("the label is {:?}; expected an integer in 0..=9", fields[PIXELS]))),
        }
    }
    Ok(data)
}

/// Reads and parses `path` (see `parse_digits`) and checks that it holds all 1,797 samples.
pub fn load_digits(path: &Path) -> Result<Digits, DigitsError> {
    let text = std::fs::read_to_string(path).map_err(|source| DigitsError::Io { path: path.to_path_buf(), source })?;
    let source = path.display().to_string();
    let data = parse_digits(&text, &source)?;
    if data.len() != SAMPLES {
        return Err(DigitsError::Count { source, found: data.len(), expected: SAMPLES });
    }
    Ok(data)
}

/// The classifier: `fc2(relu(fc1(x)))`, 64 -> hidden -> 10, with PyTorch's default `Linear` initialization.
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    pub fn new(hidden: usize, dev: &Device) -> Mlp {
        Mlp { fc1: Linear::new(PIXELS, hidden, true, dev), fc2: Linear::new(hidden, CLASSES, true, dev) }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.fc2.forward(&F::relu(&self.fc1.forward(x)))
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.fc1.named_params_prefixed("fc1");
        p.extend(self.fc2.named_params_prefixed("fc2"));
        p
    }
}

/// Training hyperparameters. The defaults reach 97.5% test accuracy on the interleaved split (96.9% to 98.3% over
/// seeds 0..99), in about 0.2 s.
#[derive(Clone, Debug)]
pub struct Config {
    pub epochs: usize,
    pub batch: usize,
    pub hidden: usize,
    pub lr: f64,
    pub seed: u64,
    /// Data-parallel training over these processes (`--distributed`): each rank trains on its share of every epoch
    /// (`DistributedSampler`) with `batch / world` samples per step, and the ranks average their gradients
    /// (`DataParallel`), so a step covers `batch` samples in all. A group of one is plain training.
    pub group: Option<ProcessGroup>,
}

impl Default for Config {
    fn default() -> Config {
        Config { epochs: 30, batch: 32, hidden: 128, lr: 2e-3, seed: 0, group: None }
    }
}

/// What one epoch did.
#[derive(Clone, Debug)]
pub struct EpochReport {
    /// 1-based.
    pub epoch: usize,
    /// The mean cross-entropy over the epoch's training samples (each batch's loss weighted by its size).
    pub train_loss: f64,
    /// The fraction of the test set classified correctly after the epoch.
    pub test_accuracy: f64,
    pub steps: usize,
    /// The median time of one training step (host batch copy + upload, forward, backward, Adam, loss download).
    pub median_step: Duration,
    /// The whole epoch, evaluation included.
    pub elapsed: Duration,
}

/// The outcome of `train`.
#[derive(Clone, Debug)]
pub struct Report {
    pub epochs: Vec<EpochReport>,
    /// The test accuracy after the last epoch (of the initial weights with `epochs: 0`).
    pub test_accuracy: f64,
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny, well-mixed deterministic generator for the shuffle.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (the bias is below 2^-50 for the n used here).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fisher-Yates: a uniformly random permutation of `v`.
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// The fraction of `(x, y)` that `model` classifies correctly (one graph: forward, argmax, compare, count).
pub fn accuracy(model: &impl Module, x: &Tensor, y: &Tensor) -> kiln::Result<f64> {
    // Counted in f32 (exact below 2^24 samples): the wgpu device has no 64-bit integers.
    let correct = kiln::no_grad(|| model.forward(x).argmax(1, false).eq(y).to_dtype(DType::F32).sum_all());
    Ok(f64::from(correct.item::<f32>()?) / y.numel() as f64)
}

/// Trains a fresh `Mlp` on `train_set` and evaluates it on `test_set` after every epoch; `on_epoch` sees each epoch's
/// report as soon as it is done (the example prints it). Deterministic for a given `cfg` (seeds kiln's generator).
pub fn train(
    cfg: &Config,
    train_set: &Digits,
    test_set: &Digits,
    dev: &Device,
    on_epoch: impl FnMut(&EpochReport),
) -> Result<Report, DigitsError> {
    train_model(cfg, train_set, test_set, dev, |dev| Mlp::new(cfg.hidden, dev), on_epoch)
}

/// `train` for any classifier of `[n, 64]` pixels into 10 logits, built by `model` after kiln's generator is seeded
/// (`train_digits_cnn` trains its CNN with it; `cfg.hidden` is the MLP's and unused otherwise).
pub fn train_model<M: Module>(
    cfg: &Config,
    train_set: &Digits,
    test_set: &Digits,
    dev: &Device,
    model: impl FnOnce(&Device) -> M,
    mut on_epoch: impl FnMut(&EpochReport),
) -> Result<Report, DigitsError> {
    assert!(cfg.batch > 0, "the batch size must be positive");
    kiln::manual_seed(cfg.seed);
    let mut rng = SplitMix64(cfg.seed);
    let model = model(dev);
    model.realize_params()?;
    let group = cfg.group.clone().unwrap_or_else(ProcessGroup::single);
    let world = group.world_size();
    // Every rank starts from rank 0's weights (DataParallel::new copies them) and averages its gradients.
    let ddp = if world > 1 { Some(DataParallel::new(&group, model.params())?) } else { None };
    let sampler = DistributedSampler::new(train_set.len(), &group).seed(cfg.seed);
    let batch = cfg.batch.div_ceil(world);
    let mut opt = Adam::new(model.params(), cfg.lr);
    let all: Vec<usize> = (0..test_set.len()).collect();
    let (x_test, y_test) = test_set.batch(&all, dev)?;

    let mut order: Vec<usize> = (0..train_set.len()).collect();
    let mut epochs = Vec::with_capacity(cfg.epochs);
    for epoch in 1..=cfg.epochs {
        let t_epoch = Instant::now();
        // One process shuffles as it always has; ranks take their share of the sampler's epoch.
        if world > 1 {
            order = sampler.indices(epoch as u64);
        } else {
            rng.shuffle(&mut order);
        }
        let (mut loss_sum, mut samples) = (0.0, 0.0);
        let mut times = Vec::with_capacity(order.len().div_ceil(batch));
        for idx in order.chunks(batch) {
            let t0 = Instant::now();
            let (x, y) = train_set.batch(idx, dev)?;
            let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean);
            let grads = loss.backward()?;
            let grads = match &ddp {
                Some(ddp) => ddp.average(grads, &[&loss])?,
                None => grads,
            };
            opt.step(grads, &[&loss])?;
            loss_sum += f64::from(loss.item::<f32>()?) * idx.len() as f64;
            samples += idx.len() as f64;
            times.push(t0.elapsed());
        }
        if world > 1 {
            // The epoch's loss over every rank's samples (one small all-reduce per epoch, not per step).
            // f32: the wgpu device has no f64; ample for a printed mean.
            let sums = Tensor::from_vec(vec![loss_sum as f32, samples as f32], [2], dev)?;
            let sums = group.all_reduce(&sums, ReduceOp::Sum)?.to_vec::<f32>()?;
            (loss_sum, samples) = (f64::from(sums[0]), f64::from(sums[1]));
        }
        let test_accuracy = accuracy(&model, &x_test, &y_test)?;
        times.sort();
        let report = EpochReport {
            epoch,
            train_loss: loss_sum / samples.max(1.0),
            test_accuracy,
            steps: times.len(),
            median_step: times.get(times.len() / 2).copied().unwrap_or_default(),
            elapsed: t_epoch.elapsed(),
        };
        on_epoch(&report);
        epochs.push(report);
    }
    let test_accuracy = match epochs.last() {
        Some(last) => last.test_accuracy,
        None => accuracy(&model, &x_test, &y_test)?,
    };
    Ok(Report { epochs, test_accuracy })
}

/// Trains a 64 -> hidden -> 10 MLP (relu, Adam, cross-entropy) on the 8x8 hand-written digits and prints the loss,
/// the test accuracy and the time per step of every epoch.
#[derive(clap::Parser)]
#[command(name = "train_digits")]
struct Args {
    /// Passes over the training set.
    #[arg(long, default_value_t = Config::default().epochs)]
    epochs: usize,
    /// Samples per mini-batch.
    #[arg(long, default_value_t = nonzero(Config::default().batch))]
    batch: NonZeroUsize,
    /// Width of the hidden layer.
    #[arg(long, default_value_t = nonzero(Config::default().hidden))]
    hidden: NonZeroUsize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = Config::default().lr)]
    lr: f64,
    /// Seeds the initial weights and the shuffle.
    #[arg(long, default_value_t = Config::default().seed)]
    seed: u64,
    /// The digits file (CSV: 64 pixels and the label per line).
    #[arg(long, default_value_os_t = default_path())]
    data: PathBuf,
    /// `interleaved`: every fifth sample is a test sample; `head`: the last 360 are.
    #[arg(long, default_value = "interleaved")]
    split: Split,
    /// `cpu` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Data-parallel over the processes of an MPI launch (`mpirun -np 2 train_digits --distributed`; kiln built
    /// with `--features mpi`): each rank trains on its share of every epoch and the ranks average gradients.
    #[arg(long)]
    distributed: bool,
}

/// A default count (positive by construction).
fn nonzero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).expect("a positive default")
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if let Err(e) = run(args) {
        eprintln!("train_digits: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), DigitsError> {
    let (batch, hidden) = (args.batch.get(), args.hidden.get());
    let group = if args.distributed { Some(kiln::distributed::init()?) } else { None };
    let root = group.as_ref().is_none_or(ProcessGroup::is_root);
    let cfg = Config { epochs: args.epochs, batch, hidden, lr: args.lr, seed: args.seed, group: group.clone() };
    let (path, split, dev) = (args.data, args.split, args.device);
    let t_start = Instant::now();
    let data = load_digits(&path)?;
    let (train_set, test_set) = data.split(split);
    // Under a launcher every rank trains; rank 0 alone prints.
    if !root {
        train(&cfg, &train_set, &test_set, &dev, |_| {})?;
        return Ok(());
    }
    println!("digits ({split:?} split): {} train, {} test samples", train_set.len(), test_set.len());
    let world = group.as_ref().map_or(1, ProcessGroup::world_size);
    let parallel = if world > 1 { format!(", data-parallel over {world} processes") } else { String::new() };
    println!(
        "MLP {PIXELS} -> {} -> {CLASSES} (relu), Adam lr {}, batch {}, {} epochs, seed {}, on {dev}{parallel}",
        cfg.hidden, cfg.lr, cfg.batch, cfg.epochs, cfg.seed
    );
    let report = train(&cfg, &train_set, &test_set, &dev, |e| {
        println!(
            "epoch {:2}: train loss {:.4}, test accuracy {:.2}%, {:.1} µs/step (median of {} steps), epoch {:.1} ms",
            e.epoch,
            e.train_loss,
            e.test_accuracy * 100.0,
            e.median_step.as_secs_f64() * 1e6,
            e.steps,
            e.elapsed.as_secs_f64() * 1e3
        );
    })?;
    let s = kiln::stats();
    println!(
        "final test accuracy: {:.2}% ({} of {}) in {:.2} s",
        report.test_accuracy * 100.0,
        (report.test_accuracy * test_set.len() as f64).round(),
        test_set.len(),
        t_start.elapsed().as_secs_f64()
    );
    println!("plans compiled: {}, cache hits: {}, realizes: {}", s.compiles, s.plan_hits, s.realizes);
    Ok(())
}
