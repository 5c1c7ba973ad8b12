//! Convolution layers (`torch.nn.Conv1d`, `Conv2d`, `ConvTranspose2d`): the parameters of `functional::conv1d`,
//! `conv2d` and `conv_transpose2d`, initialized as PyTorch's: weight and bias uniform in `± 1 / sqrt(fan_in)`
//! (its `kaiming_uniform_(a = sqrt(5))`), where `fan_in` is the weight's dim 1 times its kernel: `C / groups * K`
//! for a convolution, `O / groups * K` for a transposed one (PyTorch's `_calculate_fan_in_and_fan_out` reads dim 1
//! either way).

use super::functional::{self, Conv2dOptions, ConvTranspose2dOptions};
use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;

/// The weight of `shape` and an optional bias of `bias_len`, uniform in `± 1 / sqrt(fan_in)` with `fan_in` the
/// weight's dim 1 times its kernel (module doc), after checking that both channel counts split into `groups`.
#[track_caller]
fn conv_params(
    name: &str,
    channels: [usize; 2],
    groups: usize,
    shape: &[usize],
    bias: bool,
    device: &Device,
    generator: &Generator,
) -> (Param, Option<Param>) {
    let [cin, cout] = channels;
    if groups == 0 || !cin.is_multiple_of(groups) || !cout.is_multiple_of(groups) {
        fail!(name, "{cin} input and {cout} output channels do not split into {groups} groups");
    }
    let fan_in: usize = shape[1..].iter().product();
    let bound = if fan_in > 0 { 1.0 / (fan_in as f64).sqrt() } else { 0.0 };
    let weight = Param::new("weight", init::uniform_with(shape.to_vec(), -bound, bound, device, generator));
    let bias = bias.then(|| Param::new("bias", init::uniform_with([cout], -bound, bound, device, generator)));
    (weight, bias)
}

/// The accessors every convolution layer has (`weight`, `bias`, `options`) and its `Module` impl: `$forward` of the
/// input `$x`, the weight `$w`, the bias `$b` (an `Option<&Tensor>`) and the options `$o`.
macro_rules! conv_layer {
    ($name:ident, $opts:ty, |$x:ident, $w:ident, $b:ident, $o:ident| $forward:expr) => {
        impl $name {
            pub fn weight(&self) -> &Param {
                &self.weight
            }

            pub fn bias(&self) -> Option<&Param> {
                self.bias.as_ref()
            }

            pub fn options(&self) -> &$opts {
                &self.opts
            }
        }

        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Tensor {
                let (weight, bias) = (self.weight.get(), self.bias.as_ref().map(Param::get));
                let ($w, $b, $o) = (&weight, bias.as_ref(), &self.opts);
                $forward
            }

            fn named_params(&self) -> Vec<(String, Param)> {
                let mut out = vec![("weight".to_string(), self.weight.clone())];
                if let Some(b) = &self.bias {
                    out.push(("bias".to_string(), b.clone()));
                }
                out
            }
        }
    };
}

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
        let shape = [out_channels, in_channels / opts.groups.max(1), kernel[0], kernel[1]];
        let channels = [in_channels, out_channels];
        let (weight, bias) = conv_params("Conv2d", channels, opts.groups, &shape, bias, device, generator);
        Conv2d { weight, bias, opts }
    }
}

conv_layer!(Conv2d, Conv2dOptions, |x, w, b, o| functional::conv2d(x, w, b, o));

/// Stride, padding, dilation and channel groups of a 1-D convolution (PyTorch's keyword arguments; `Default` is
/// theirs: 1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions { stride: 1, padding: 0, dilation: 1, groups: 1 }
    }
}

/// A 1-D convolution layer over `[N, C, L]` (or `[C, L]`) inputs: weight `[O, C / groups, K]`.
#[derive(Clone, Debug)]
pub struct Conv1d {
    weight: Param,
    bias: Option<Param>,
    opts: Conv1dOptions,
}

impl Conv1d {
    /// `Conv1d(in_channels, out_channels, kernel, **opts, bias=bias)`, f32, drawn from the default generator.
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: Conv1dOptions,
        bias: bool,
        device: &Device,
    ) -> Conv1d {
        Conv1d::new_with(in_channels, out_channels, kernel, opts, bias, device, &default_generator())
    }

    /// `new` drawing the initial values from `generator`.
    #[track_caller]
    pub fn new_with(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: Conv1dOptions,
        bias: bool,
        device: &Device,
        generator: &Generator,
    ) -> Conv1d {
        let shape = [out_channels, in_channels / opts.groups.max(1), kernel];
        let channels = [in_channels, out_channels];
        let (weight, bias) = conv_params("Conv1d", channels, opts.groups, &shape, bias, device, generator);
        Conv1d { weight, bias, opts }
    }
}

conv_layer!(Conv1d, Conv1dOptions, |x, w, b, o| {
    functional::conv1d(x, w, b, o.stride, o.padding, o.dilation, o.groups)
});

/// A 2-D transposed convolution layer over `[N, C, H, W]` inputs (a decoder's upsampling): weight
/// `[C, O / groups, KH, KW]`.
#[derive(Clone, Debug)]
pub struct ConvTranspose2d {
    weight: Param,
    bias: Option<Param>,
    opts: ConvTranspose2dOptions,
}

impl ConvTranspose2d {
    /// `ConvTranspose2d(in_channels, out_channels, kernel, **opts, bias=bias)`, f32, drawn from the default
    /// generator.
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: ConvTranspose2dOptions,
        bias: bool,
        device: &Device,
    ) -> ConvTranspose2d {
        ConvTranspose2d::new_with(in_channels, out_channels, kernel, opts, bias, device, &default_generator())
    }

    /// `new` drawing the initial values from `generator`.
    #[track_caller]
    pub fn new_with(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: ConvTranspose2dOptions,
        bias: bool,
        device: &Device,
        generator: &Generator,
    ) -> ConvTranspose2d {
        let shape = [in_channels, out_channels / opts.groups.max(1), kernel[0], kernel[1]];
        let channels = [in_channels, out_channels];
        let (weight, bias) = conv_params("ConvTranspose2d", channels, opts.groups, &shape, bias, device, generator);
        ConvTranspose2d { weight, bias, opts }
    }
}

conv_layer!(ConvTranspose2d, ConvTranspose2dOptions, |x, w, b, o| functional::conv_transpose2d(x, w, b, o));
