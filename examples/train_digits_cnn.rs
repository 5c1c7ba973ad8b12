//! A small convolutional network on the shipped 8x8 digits (the data, split and batches of `train_digits`, whose
//! file this one includes as a module): conv 3x3 (1 -> 8 channels, padding 1), relu, 2x2 max pool, conv 3x3
//! (8 -> 16), relu, 2x2 max pool, then a linear layer from the 16 x 2 x 2 features to the 10 classes; Adam and
//! cross-entropy. Prints per epoch the mean training loss, the test accuracy and the time per step, then the final
//! test accuracy. The loop is `train_digits::train_model`, the MLP example's; `tests/digits_cnn.rs` trains it for 8
//! epochs and requires >= 95%.
//!
//! ```text
//! cargo run --release --example train_digits_cnn
//! cargo run --release --example train_digits_cnn -- --epochs 20 --lr 0.003 --device wgpu
//! ```

#[path = "train_digits.rs"]
#[allow(dead_code)]
pub mod train_digits;

use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions};
use kiln::nn::{Conv2d, Linear, Module, Param};
use kiln::{Device, Tensor};
use std::time::Instant;
use train_digits::{CLASSES, Config, DigitsError, Split, default_path, load_digits};

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
        let cfg = Config { epochs: args.epochs, batch: args.batch, lr: args.lr, seed: args.seed, ..Config::default() };
        let report = train_digits::train_model(&cfg, &train_set, &test_set, &args.device, Cnn::new, |e| {
            println!(
                "epoch {:2}: train loss {:.4}, test accuracy {:.2}%, {:.0} µs/step (median)",
                e.epoch,
                e.train_loss,
                e.test_accuracy * 100.0,
                e.median_step.as_secs_f64() * 1e6
            );
        })?;
        let secs = t_start.elapsed().as_secs_f64();
        println!("final test accuracy: {:.2}% in {secs:.2} s", report.test_accuracy * 100.0);
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("train_digits_cnn: {e}");
        std::process::exit(1);
    }
}
