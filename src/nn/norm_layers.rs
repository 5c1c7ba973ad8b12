//! `RMSNorm` and `GroupNorm` (`torch.nn`): the parameters of `functional::rms_norm` and `functional::group_norm`,
//! initialized as PyTorch's (weight 1, bias 0, f32).

use super::functional;
use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::tensor::Tensor;

/// Root-mean-square normalization over the trailing `normalized_shape` dims with an elementwise weight (init 1)
/// (`torch.nn.RMSNorm`); `eps: None` is the input dtype's machine epsilon.
#[derive(Clone, Debug)]
pub struct RMSNorm {
    normalized_shape: Vec<usize>,
    weight: Option<Param>,
    eps: Option<f64>,
}

impl RMSNorm {
    /// `RMSNorm(normalized_shape)` with its weight (ones), f32.
    #[track_caller]
    pub fn new(normalized_shape: impl Into<Vec<usize>>, device: &Device) -> RMSNorm {
        let shape: Vec<usize> = normalized_shape.into();
        if shape.is_empty() {
            fail!("RMSNorm", "normalized_shape must name at least one dim");
        }
        RMSNorm {
            weight: Some(Param::new("weight", init::ones(shape.clone(), device))),
            normalized_shape: shape,
            eps: None,
        }
    }

    /// `RMSNorm(normalized_shape, elementwise_affine=False)`: no weight.
    #[track_caller]
    pub fn no_affine(normalized_shape: impl Into<Vec<usize>>) -> RMSNorm {
        let normalized_shape: Vec<usize> = normalized_shape.into();
        if normalized_shape.is_empty() {
            fail!("RMSNorm", "normalized_shape must name at least one dim");
        }
        RMSNorm { normalized_shape, weight: None, eps: None }
    }

    /// Sets `eps` (builder style).
    pub fn eps(mut self, eps: f64) -> RMSNorm {
        self.eps = Some(eps);
        self
    }

    pub fn weight(&self) -> Option<&Param> {
        self.weight.as_ref()
    }
}

impl Module for RMSNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let w = self.weight.as_ref().map(Param::get);
        functional::rms_norm(x, &self.normalized_shape, w.as_ref(), self.eps)
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        self.weight.iter().map(|w| ("weight".to_string(), w.clone())).collect()
    }
}

/// Group normalization of `[N, C, ..]` inputs in `num_groups` groups of channels, with a per-channel affine weight
/// (init 1) and bias (init 0) (`torch.nn.GroupNorm`, `eps` 1e-5).
#[derive(Clone, Debug)]
pub struct GroupNorm {
    num_groups: usize,
    weight: Option<Param>,
    bias: Option<Param>,
    eps: f64,
}

impl GroupNorm {
    /// `GroupNorm(num_groups, num_channels)`, f32 parameters.
    #[track_caller]
    pub fn new(num_groups: usize, num_channels: usize, device: &Device) -> GroupNorm {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            fail!("GroupNorm", "{num_channels} channels do not split into {num_groups} groups");
        }
        GroupNorm {
            num_groups,
            weight: Some(Param::new("weight", init::ones([num_channels], device))),
            bias: Some(Param::new("bias", init::zeros([num_channels], device))),
            eps: 1e-5,
        }
    }

    /// `GroupNorm(num_groups, num_channels, affine=False)`.
    #[track_caller]
    pub fn no_affine(num_groups: usize, num_channels: usize) -> GroupNorm {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            fail!("GroupNorm", "{num_channels} channels do not split into {num_groups} groups");
        }
        GroupNorm { num_groups, weight: None, bias: None, eps: 1e-5 }
    }

    /// Sets `eps` (builder style).
    pub fn eps(mut self, eps: f64) -> GroupNorm {
        self.eps = eps;
        self
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let w = self.weight.as_ref().map(Param::get);
        let b = self.bias.as_ref().map(Param::get);
        functional::group_norm(x, self.num_groups, w.as_ref(), b.as_ref(), self.eps)
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        super::present(&[&self.weight, &self.bias])
    }
}
