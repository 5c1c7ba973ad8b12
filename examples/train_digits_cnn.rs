//! A small convolutional network on the shipped 8x8 digits (the data, split and batches of `train_digits`, whose
//! file this one includes as a module): conv 3x3 (1 -> 8 channels, padding 1), relu, 2x2 max pool, conv 3x3
//! (8 -> 16), relu, 2x2 max pool, then a linear layer from the 16 x 2 x 2 features to the 10 classes; Adam and
//! cross-entropy. Prints per epoch the mean training loss, the test accuracy and the time per step, then the final
//! test accuracy. `tests/digits.rs` trains it for 8 epochs and requires >= 95% (96.7% with seed 0).
//!
//! ```text
//! cargo run --release --example train_digits_cnn
//! cargo run --release --example train_digits_cnn -- --epochs 20 --lr 0.003 --device wgpu
//! ```

#[path = "train_digits.rs"]
#[allow(dead_code)]
pub mod train_digits;

use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions, Reduction};
use kiln::nn::{Conv2d, Linear, Module, Param};
use kiln::optim::{Adam, Optimizer};
use kiln::{DType, Device, Tensor};
use std::time::Instant;
use train_digits::{CLASSES, Digits, DigitsError, Split, default_path, load_digits};

/// The network (see the module doc).
pub struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    fc: Linear,
}

impl Cnn {
    pub fn new(dev: &Device) -> Cnn {
        let same = Conv2dOptions { padding: [1, 1], ..Default::default() };
        Cnn {
            conv1: Conv2d::new(1, 8, [3, 3], same, true, dev),
            conv2: Conv2d::new(8, 16, [3, 3], same, true, dev),
            fc: Linear::new(16 * 2 * 2, CLASSES, true, dev),
        }
    }
}

impl Module for Cnn {
    fn forward(&self, x: &Tensor) -> Tensor {
        let n = x.dims()[0];
        let pool = Pool2dOptions::new([2, 2]);
        let x = x.reshape(vec![n, 1, 8, 8]);
        let x = F::max_pool2d(&F::relu(&self.conv1.forward(&x)), &pool);
        let x = F::max_pool2d(&F::relu(&self.conv2.forward(&x)), &pool);
        self.fc.forward(&x.reshape(vec![n, 16 * 2 * 2]))
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.conv1.named_params_prefixed("conv1");
        p.extend(self.conv2.named_params_prefixed("conv2"));
        p.extend(self.fc.named_params_prefixed("fc"));
        p
    }
}

/// Trains a fresh `Cnn` for `epochs` and returns the final test accuracy; `on_epoch(epoch, loss, accuracy,
/// median step µs)` sees every epoch.
pub fn train(
    epochs: usize,
    batch: usize,
    lr: f64,
    seed: u64,
    (train_set, test_set): (&Digits, &Digits),
    dev: &Device,
    mut on_epoch: impl FnMut(usize, f64, f64, f64),
) -> Result<f64, DigitsError> {
    kiln::manual_seed(seed);
    let model = Cnn::new(dev);
    model.realize_params()?;
    let mut opt = Adam::new(model.params(), lr);
    let all: Vec<usize> = (0..test_set.len()).collect();
    let (x_test, y_test) = test_set.batch(&all, dev)?;
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    let mut state = seed.wrapping_add(1);
    let mut accuracy = 0.0;
    for epoch in 1..=epochs {
        // A Fisher-Yates shuffle from a xorshift stream: a new order every epoch, reproducible from the seed.
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let (mut loss_sum, mut times) = (0.0, Vec::new());
        for idx in order.chunks(batch) {
            let t0 = Instant::now();
            let (x, y) = train_set.batch(idx, dev)?;
            let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean);
            let grads = loss.backward()?;
            opt.step(grads, &[&loss])?;
            loss_sum += f64::from(loss.item::<f32>()?) * idx.len() as f64;
            times.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let correct =
            kiln::no_grad(|| model.forward(&x_test).argmax(1, false).eq(&y_test).to_dtype(DType::F32).sum_all());
        accuracy = f64::from(correct.item::<f32>()?) / test_set.len() as f64;
        times.sort_by(f64::total_cmp);
        on_epoch(epoch, loss_sum / train_set.len() as f64, accuracy, times[times.len() / 2]);
    }
    Ok(accuracy)
}

#[derive(clap::Parser)]
#[command(name = "train_digits_cnn")]
struct Args {
    /// Passes over the training set.
    #[arg(long, default_value_t = 20)]
    epochs: usize,
    /// Samples per mini-batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 5e-3)]
    lr: f64,
    /// Seeds the initial weights and the shuffle.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// `cpu` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    device: Device,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    if args.batch == 0 {
        eprintln!("train_digits_cnn: the batch size must be at least 1");
        std::process::exit(2);
    }
    let run = || -> Result<(), DigitsError> {
        let t_start = Instant::now();
        let (train_set, test_set) = load_digits(&default_path())?.split(Split::Interleaved);
        println!(
            "digits: {} train, {} test; CNN conv3x3(8) pool conv3x3(16) pool linear(64 -> 10), Adam lr {}, batch {}, on {}",
            train_set.len(),
            test_set.len(),
            args.lr,
            args.batch,
            args.device
        );
        let accuracy = train(
            args.epochs,
            args.batch,
            args.lr,
            args.seed,
            (&train_set, &test_set),
            &args.device,
            |e, loss, acc, us| {
                println!(
                    "epoch {e:2}: train loss {loss:.4}, test accuracy {:.2}%, {us:.0} µs/step (median)",
                    acc * 100.0
                );
            },
        )?;
        println!("final test accuracy: {:.2}% in {:.2} s", accuracy * 100.0, t_start.elapsed().as_secs_f64());
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("train_digits_cnn: {e}");
        std::process::exit(1);
    }
}
