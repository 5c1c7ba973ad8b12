//! `kiln::nn`: every module's and function's forward against hand-computed values or a plain-Rust reference in
//! f64, the gradients where PyTorch's convention differs from a naive composition, and Dropout's randomness.
//!
//! Tests that draw random numbers (`Linear::new`, `Dropout`, `manual_seed`) need no lock: each test runs on its own
//! thread, and each thread has its own default generator.

// Every body runs on the CPU (cargo feature `cpu`); `tests/op_table/` holds every device to the same ops.
#![cfg(feature = "cpu")]

#[path = "../test_cache/mod.rs"]
mod test_cache;

#[path = "../common/mod.rs"]
mod common;

mod activations;
mod attention;
mod extras;
mod interpolate;
mod layers;
mod losses;
mod norms;

use common::*;
use kiln::nn::functional::{self as F, Approximate, Reduction};
use kiln::nn::{
    Dropout, Embedding, Flatten, Func, GELU, Identity, LayerNorm, LeakyReLU, Linear, Module, PReLU, Param, ReLU,
    Sequential, SiLU, Tanh, Unflatten, Upsample,
};
use kiln::{DType, Device, Tensor};

fn dev() -> Device {
    Device::cpu()
}

/// `t` has `shape` and values within `kind`'s tolerance of `want` (computed in f64, rounded once to t's dtype).
#[track_caller]
fn check(t: &Tensor, shape: &[usize], want: &[f64], kind: Kind) {
    if let Err(e) = check_tensor(t, shape, &buffer(t.dtype(), want), kind) {
        panic!("{e}");
    }
}

/// `|got - want| <= abs + rel |want|` elementwise, for results whose error budget is not the table's (the erf
/// approximation).
#[track_caller]
fn close(got: &[f64], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= abs + rel * w.abs(), "[{i}] got {g:e}, want {w:e} (rel {rel:e}, abs {abs:e})");
    }
}

/// `sin(0.37 i + c)` over `shape`: the deterministic inputs `tests/fixtures`-free attention checks share with the
/// PyTorch script that printed their values.
fn sines(shape: &[usize], c: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (0.37 * i as f64 + c).sin()).collect();
    // Rounded to f32 first, as the script's torch.float32 tensors are.
    let v: Vec<f64> = v.iter().map(|&x| x as f32 as f64).collect();
    tensor(dtype, &v, shape)
}

/// The tolerance class of a case named by the tables below: accumulate where the result sums (a mean or sum
/// reduction, a norm, a softmax), elementwise otherwise.
fn kind_of(name: &str) -> Kind {
    let sums = ["mean", "sum", "normalize", "cosine", "softmin", "cdist", "pairwise"];
    if sums.iter().any(|k| name.contains(k)) { Kind::Accumulate } else { Kind::Elementwise }
}
