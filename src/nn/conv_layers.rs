//! `Conv2d` (`torch.nn.Conv2d`): the parameters of `functional::conv2d`, initialized as PyTorch's (weight and bias
//! uniform in `± 1 / sqrt(fan_in)`, `fan_in = C / groups * KH * KW`: its `kaiming_uniform_(a = sqrt(5))`).

use super::functional::{self, Conv2dOptions};
use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;

/// A 2-D convolution layer over `[N, C, H, W]` inputs.
#[derive(Clone, Debug)]
pub struct Conv2d {
    weight: Param,
    bias: Option<Param>,
    opts: Conv2dOptions,
}

impl Conv2d {
    /// `Conv2d(in_channels, out_channels, kernel, **opts, bias=bias)`, f32, drawn from the default generator.
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: Conv2dOptions,
        bias: bool,
        device: &Device,
    ) -> Conv2d {
        Conv2d::new_with(in_channels, out_channels, kernel, opts, bias, device, &default_generator())
    }

    /// `new` drawing the initial values from `generator`.
    #[track_caller]
    pub fn new_with(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: Conv2dOptions,
        bias: bool,
        device: &Device,
        generator: &Generator,
    ) -> Conv2d {
        let g = opts.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            fail!("Conv2d", "{in_channels} input and {out_channels} output channels do not split into {g} groups");
        }
        let fan_in = in_channels / g * kernel[0] * kernel[1];
        let bound = if fan_in > 0 { 1.0 / (fan_in as f64).sqrt() } else { 0.0 };
        let shape = [out_channels, in_channels / g, kernel[0], kernel[1]];
        let weight = Param::new("weight", init::uniform_with(shape, -bound, bound, device, generator));
        let bias =
            bias.then(|| Param::new("bias", init::uniform_with([out_channels], -bound, bound, device, generator)));
        Conv2d { weight, bias, opts }
    }

    pub fn weight(&self) -> &Param {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Param> {
        self.bias.as_ref()
    }

    pub fn options(&self) -> &Conv2dOptions {
        &self.opts
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Tensor {
        let b = self.bias.as_ref().map(Param::get);
        functional::conv2d(x, &self.weight.get(), b.as_ref(), &self.opts)
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut out = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            out.push(("bias".to_string(), b.clone()));
        }
        out
    }
}
