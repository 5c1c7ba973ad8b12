//! `Linear`: `y = x Wᵀ + b` (`torch.nn.Linear`), with PyTorch's default initialization.

use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;

/// A fully connected layer: weight `[out_features, in_features]`, optional bias `[out_features]`. The input's last
/// dim is `in_features`; leading dims are batch dims.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Param,
    bias: Option<Param>,
}

impl Linear {
    /// A layer with PyTorch's default initialization (f32): the weight is `kaiming_uniform_(a = sqrt(5))`, which is
    /// uniform in `[-1/sqrt(in), 1/sqrt(in))`, and the bias uniform in the same range.
    #[track_caller]
    pub fn new(in_features: usize, out_features: usize, bias: bool, device: &Device) -> Linear {
        Linear::new_with(in_features, out_features, bias, device, &default_generator())
    }

    /// `new`, drawing the initial weight and bias from `generator`.
    #[track_caller]
    pub fn new_with(
        in_features: usize,
        out_features: usize,
        bias: bool,
        device: &Device,
        generator: &Generator,
    ) -> Linear {
        // gain = sqrt(2 / (1 + a²)) = sqrt(1/3); bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
        let bound = if in_features > 0 { 1.0 / (in_features as f64).sqrt() } else { 0.0 };
        let weight = init::uniform_with([out_features, in_features], -bound, bound, device, generator);
        let bias = bias.then(|| init::uniform_with([out_features], -bound, bound, device, generator));
        Linear::from_weight(weight, bias)
    }

    /// A layer with the given weight `[out, in]` and bias `[out]` (float, same dtype).
    #[track_caller]
    pub fn from_weight(weight: Tensor, bias: Option<Tensor>) -> Linear {
        if weight.rank() != 2 || !weight.dtype().is_float() {
            fail!(
                "Linear",
                "the weight must be a 2-d float tensor [out, in], got {}{:?}",
                weight.dtype(),
                weight.dims()
            );
        }
        if let Some(b) = &bias
            && (b.dims() != [weight.dims()[0]] || b.dtype() != weight.dtype())
        {
            fail!(
                "Linear",
                "the bias must be {}[{}] to match the weight {:?}, got {}{:?}",
                weight.dtype(),
                weight.dims()[0],
                weight.dims(),
                b.dtype(),
                b.dims()
            );
        }
        Linear { weight: Param::new("weight", weight), bias: bias.map(|b| Param::new("bias", b)) }
    }

    /// A copy holding the same values in parameters of its own (a clone shares them).
    pub(crate) fn copy(&self) -> Linear {
        Linear::from_weight(self.weight.get(), self.bias.as_ref().map(Param::get))
    }

    pub fn weight(&self) -> &Param {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Param> {
        self.bias.as_ref()
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let w = self.weight.get();
        if x.rank() == 0 || x.dims()[x.rank() - 1] != w.dims()[1] {
            fail!("Linear", "expected input with last dim {} (in_features), got shape {:?}", w.dims()[1], x.dims());
        }
        let y = x.matmul(&w.t());
        match &self.bias {
            Some(b) => y.add(b.get()),
            None => y,
        }
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut out = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            out.push(("bias".to_string(), b.clone()));
        }
        out
    }
}
