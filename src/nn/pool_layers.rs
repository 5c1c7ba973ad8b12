//! Pooling modules (`torch.nn.MaxPool1d`, `MaxPool2d`, `AvgPool1d`, `AvgPool2d`, `AdaptiveAvgPool1d`,
//! `AdaptiveAvgPool2d`, `AdaptiveMaxPool1d`, `AdaptiveMaxPool2d`, and `MaxUnpool1d`, `MaxUnpool2d`, whose forward
//! takes the indices too): the functions of `functional` with their options, no parameters, for `Sequential`.

use super::functional::{self, Pool1dOptions, Pool2dOptions};
use super::{Module, Param};
use crate::tensor::Tensor;

/// A module with no parameters whose forward is `$body` of the module `$s` and the input `$x`.
macro_rules! pooling {
    ($name:ident, |$s:ident, $x:ident| $body:expr) => {
        impl Module for $name {
            fn forward(&self, $x: &Tensor) -> Tensor {
                let $s = self;
                $body
            }

            fn named_params(&self) -> Vec<(String, Param)> {
                Vec::new()
            }
        }
    };
}

/// [`functional::max_pool1d`] as a module: `MaxPool1d::new(k)` is PyTorch's `nn.MaxPool1d(k)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool1d {
    pub options: Pool1dOptions,
}

impl MaxPool1d {
    /// A window of `kernel`, stride the kernel, no padding.
    pub fn new(kernel: usize) -> MaxPool1d {
        MaxPool1d { options: Pool1dOptions::new(kernel) }
    }
}
pooling!(MaxPool1d, |s, x| functional::max_pool1d(x, &s.options));

impl MaxPool1d {
    /// The forward and the index of the tap each output took (`nn.MaxPool1d(..., return_indices=True)`).
    #[track_caller]
    pub fn forward_with_indices(&self, x: &Tensor) -> (Tensor, Tensor) {
        functional::max_pool1d_with_indices(x, &self.options)
    }
}

/// [`functional::max_pool2d`] as a module: `MaxPool2d::new([2, 2])` is PyTorch's `nn.MaxPool2d(2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    pub options: Pool2dOptions,
}

impl MaxPool2d {
    /// A `kh x kw` window, stride the kernel, no padding.
    pub fn new(kernel: [usize; 2]) -> MaxPool2d {
        MaxPool2d { options: Pool2dOptions::new(kernel) }
    }
}
pooling!(MaxPool2d, |s, x| functional::max_pool2d(x, &s.options));

impl MaxPool2d {
    /// The forward and the flat index of the tap each output took (`nn.MaxPool2d(..., return_indices=True)`).
    #[track_caller]
    pub fn forward_with_indices(&self, x: &Tensor) -> (Tensor, Tensor) {
        functional::max_pool2d_with_indices(x, &self.options)
    }
}

/// [`functional::avg_pool1d`] as a module; `count_include_pad` is true by default, as PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool1d {
    pub options: Pool1dOptions,
    pub count_include_pad: bool,
}

impl AvgPool1d {
    /// A window of `kernel`, stride the kernel, no padding, padding counted.
    pub fn new(kernel: usize) -> AvgPool1d {
        AvgPool1d { options: Pool1dOptions::new(kernel), count_include_pad: true }
    }
}
pooling!(AvgPool1d, |s, x| functional::avg_pool1d(x, &s.options, s.count_include_pad));

/// [`functional::avg_pool2d`] as a module; `count_include_pad` is true by default, as PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d {
    pub options: Pool2dOptions,
    pub count_include_pad: bool,
}

impl AvgPool2d {
    /// A `kh x kw` window, stride the kernel, no padding, padding counted.
    pub fn new(kernel: [usize; 2]) -> AvgPool2d {
        AvgPool2d { options: Pool2dOptions::new(kernel), count_include_pad: true }
    }
}
pooling!(AvgPool2d, |s, x| functional::avg_pool2d(x, &s.options, s.count_include_pad));

/// [`functional::adaptive_avg_pool1d`] as a module: `output` positions whatever the input's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool1d {
    pub output: usize,
}
pooling!(AdaptiveAvgPool1d, |s, x| functional::adaptive_avg_pool1d(x, s.output));

/// [`functional::adaptive_avg_pool2d`] as a module: `AdaptiveAvgPool2d { output: [1, 1] }` is a CNN's global
/// average pool before its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d {
    pub output: [usize; 2],
}
pooling!(AdaptiveAvgPool2d, |s, x| functional::adaptive_avg_pool2d(x, s.output));

/// [`functional::adaptive_max_pool1d`] as a module: `output` positions whatever the input's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool1d {
    pub output: usize,
}
pooling!(AdaptiveMaxPool1d, |s, x| functional::adaptive_max_pool1d(x, s.output));

/// [`functional::adaptive_max_pool2d`] as a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool2d {
    pub output: [usize; 2],
}
pooling!(AdaptiveMaxPool2d, |s, x| functional::adaptive_max_pool2d(x, s.output));

/// [`functional::max_unpool2d`] with its options (`torch.nn.MaxUnpool2d`). Not a [`Module`]: its forward takes the
/// pooling's indices too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxUnpool2d {
    pub options: Pool2dOptions,
}

impl MaxUnpool2d {
    /// A `kh x kw` window, stride the kernel, no padding.
    pub fn new(kernel: [usize; 2]) -> MaxUnpool2d {
        MaxUnpool2d { options: Pool2dOptions::new(kernel) }
    }

    /// `x` written at `indices` in planes of `output_size` (by default the pooling's input size).
    #[track_caller]
    pub fn forward_with(&self, x: &Tensor, indices: &Tensor, output_size: Option<[usize; 2]>) -> Tensor {
        functional::max_unpool2d(x, indices, &self.options, output_size)
    }
}

/// [`functional::max_unpool1d`] with its options (`torch.nn.MaxUnpool1d`). Not a [`Module`]: its forward takes the
/// pooling's indices too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxUnpool1d {
    pub options: Pool1dOptions,
}

impl MaxUnpool1d {
    /// A window of `kernel`, stride the kernel, no padding.
    pub fn new(kernel: usize) -> MaxUnpool1d {
        MaxUnpool1d { options: Pool1dOptions::new(kernel) }
    }

    /// `x` written at `indices` along outputs of `output_size` (by default the pooling's input length).
    #[track_caller]
    pub fn forward_with(&self, x: &Tensor, indices: &Tensor, output_size: Option<usize>) -> Tensor {
        functional::max_unpool1d(x, indices, &self.options, output_size)
    }
}
