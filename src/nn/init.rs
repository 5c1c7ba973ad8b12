//! Initial values for parameters (`torch.nn.init`), as lazy f32 tensors drawn from the calling thread's default
//! generator (so `kiln::manual_seed` makes them reproducible), or from the generator passed to a `_with` variant
//! (PyTorch's `generator=` argument). Convert with `to_dtype` for f64 parameters.
//!
//! Unlike PyTorch's in-place `kaiming_normal_(tensor)`, these take the shape and the fan explicitly: kiln has no
//! convention of which dim of a weight is "in" (a `Linear` weight is `[out, in]`, so its fan-in is `dims[1]`).

use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;
use kiln_jit::{DType, Shape};

/// Uniform in `[low, high)` (`uniform_`).
#[track_caller]
pub fn uniform(shape: impl Into<Shape>, low: f64, high: f64, device: &Device) -> Tensor {
    uniform_with(shape, low, high, device, &default_generator())
}

/// `uniform` drawing from `generator`.
#[track_caller]
pub fn uniform_with(shape: impl Into<Shape>, low: f64, high: f64, device: &Device, generator: &Generator) -> Tensor {
    if low.is_nan() || high.is_nan() || low > high {
        fail!("init::uniform", "low {low} must not exceed high {high}");
    }
    Tensor::rand_with(shape, DType::F32, device, generator).mul(high - low).add(low)
}

/// Normal with `mean` and standard deviation `std` (`normal_`).
#[track_caller]
pub fn normal(shape: impl Into<Shape>, mean: f64, std: f64, device: &Device) -> Tensor {
    normal_with(shape, mean, std, device, &default_generator())
}

/// `normal` drawing from `generator`.
#[track_caller]
pub fn normal_with(shape: impl Into<Shape>, mean: f64, std: f64, device: &Device, generator: &Generator) -> Tensor {
    if std.is_nan() || std < 0.0 {
        fail!("init::normal", "std {std} must be non-negative");
    }
    Tensor::randn_with(shape, DType::F32, device, generator).mul(std).add(mean)
}

/// He initialization for ReLU layers (`kaiming_normal_` with `a = 0`, `mode='fan_in'`): normal with
/// `std = sqrt(2 / fan_in)`.
#[track_caller]
pub fn kaiming_normal(shape: impl Into<Shape>, fan_in: usize, device: &Device) -> Tensor {
    kaiming_normal_with(shape, fan_in, device, &default_generator())
}

/// `kaiming_normal` drawing from `generator`.
#[track_caller]
pub fn kaiming_normal_with(shape: impl Into<Shape>, fan_in: usize, device: &Device, generator: &Generator) -> Tensor {
    let std = (2.0 / positive_fan("init::kaiming_normal", fan_in)).sqrt();
    Tensor::randn_with(shape, DType::F32, device, generator).mul(std)
}

/// He initialization, uniform (`kaiming_uniform_` with `a = 0`, `mode='fan_in'`): uniform in `[-b, b)` with
/// `b = sqrt(6 / fan_in)`. (PyTorch's `Linear` uses `a = sqrt(5)`, i.e. `b = 1 / sqrt(fan_in)`: see `Linear::new`.)
#[track_caller]
pub fn kaiming_uniform(shape: impl Into<Shape>, fan_in: usize, device: &Device) -> Tensor {
    kaiming_uniform_with(shape, fan_in, device, &default_generator())
}

/// `kaiming_uniform` drawing from `generator`.
#[track_caller]
pub fn kaiming_uniform_with(shape: impl Into<Shape>, fan_in: usize, device: &Device, generator: &Generator) -> Tensor {
    let bound = (6.0 / positive_fan("init::kaiming_uniform", fan_in)).sqrt();
    uniform_with(shape, -bound, bound, device, generator)
}

/// Glorot initialization (`xavier_uniform_` with gain 1): uniform in `[-b, b)`, `b = sqrt(6 / (fan_in + fan_out))`.
#[track_caller]
pub fn xavier_uniform(shape: impl Into<Shape>, fan_in: usize, fan_out: usize, device: &Device) -> Tensor {
    xavier_uniform_with(shape, fan_in, fan_out, device, &default_generator())
}

/// `xavier_uniform` drawing from `generator`.
#[track_caller]
pub fn xavier_uniform_with(
    shape: impl Into<Shape>,
    fan_in: usize,
    fan_out: usize,
    device: &Device,
    generator: &Generator,
) -> Tensor {
    let bound = (6.0 / positive_fan("init::xavier_uniform", fan_in + fan_out)).sqrt();
    uniform_with(shape, -bound, bound, device, generator)
}

/// Zeros (`zeros_`).
pub fn zeros(shape: impl Into<Shape>, device: &Device) -> Tensor {
    Tensor::zeros(shape, DType::F32, device)
}

/// Ones (`ones_`).
pub fn ones(shape: impl Into<Shape>, device: &Device) -> Tensor {
    Tensor::ones(shape, DType::F32, device)
}

#[track_caller]
fn positive_fan(name: &str, fan: usize) -> f64 {
    if fan == 0 {
        fail!(name, "the fan must be positive (a layer with no inputs has nothing to scale by)");
    }
    fan as f64
}
