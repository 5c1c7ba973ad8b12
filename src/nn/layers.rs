//! Layers other than `Linear`: `LayerNorm`, `Dropout`, `Embedding`, activation modules for `Sequential`, and
//! `Func` (any function as a module).

use super::functional::{self, Approximate};
use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::random::Generator;
use crate::tensor::Tensor;
use kiln_jit::Scalar;
use std::sync::atomic::{AtomicBool, Ordering};

/// Layer normalization over the trailing `normalized_shape` dims (`torch.nn.LayerNorm`), with an elementwise
/// affine weight (init 1) and bias (init 0).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    normalized_shape: Vec<usize>,
    weight: Option<Param>,
    bias: Option<Param>,
    eps: f64,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape, eps=1e-5)` with weight (ones) and bias (zeros), f32.
    pub fn new(normalized_shape: impl Into<Vec<usize>>, device: &Device) -> LayerNorm {
        let shape: Vec<usize> = normalized_shape.into();
        LayerNorm::from_params(init::ones(shape.clone(), device), Some(init::zeros(shape, device)), 1e-5)
    }

    /// `LayerNorm(normalized_shape, elementwise_affine=False)`: no parameters.
    #[track_caller]
    pub fn no_affine(normalized_shape: impl Into<Vec<usize>>, eps: f64) -> LayerNorm {
        let normalized_shape = normalized_shape.into();
        if normalized_shape.is_empty() {
            fail!("LayerNorm", "normalized_shape must name at least one dim");
        }
        LayerNorm { normalized_shape, weight: None, bias: None, eps }
    }

    /// A layer norm with the given float weight (its shape is `normalized_shape`), optional bias of the same
    /// shape and dtype, and `eps`.
    #[track_caller]
    pub fn from_params(weight: Tensor, bias: Option<Tensor>, eps: f64) -> LayerNorm {
        if weight.rank() == 0 || !weight.dtype().is_float() {
            fail!(
                "LayerNorm",
                "the weight must be a float tensor of at least one dim, got {}{:?}",
                weight.dtype(),
                weight.dims()
            );
        }
        if let Some(b) = &bias
            && (weight.dims() != b.dims() || weight.dtype() != b.dtype())
        {
            fail!(
                "LayerNorm",
                "weight {}{:?} and bias {}{:?} differ",
                weight.dtype(),
                weight.dims(),
                b.dtype(),
                b.dims()
            );
        }
        LayerNorm {
            normalized_shape: weight.dims().to_vec(),
            weight: Some(Param::new("weight", weight)),
            bias: bias.map(|b| Param::new("bias", b)),
            eps,
        }
    }

    /// A copy holding the same values in parameters of its own (a clone shares them).
    pub(crate) fn copy(&self) -> LayerNorm {
        let own = |p: &Option<Param>| p.as_ref().map(|p| Param::new(p.name(), p.get()));
        LayerNorm {
            normalized_shape: self.normalized_shape.clone(),
            weight: own(&self.weight),
            bias: own(&self.bias),
            eps: self.eps,
        }
    }

    /// Sets `eps` (builder style).
    pub fn eps(mut self, eps: f64) -> LayerNorm {
        self.eps = eps;
        self
    }

    pub fn normalized_shape(&self) -> &[usize] {
        &self.normalized_shape
    }

    pub fn weight(&self) -> Option<&Param> {
        self.weight.as_ref()
    }

    pub fn bias(&self) -> Option<&Param> {
        self.bias.as_ref()
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        let w = self.weight.as_ref().map(Param::get);
        let b = self.bias.as_ref().map(Param::get);
        functional::layer_norm(x, &self.normalized_shape, w.as_ref(), b.as_ref(), self.eps)
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        super::present(&[&self.weight, &self.bias])
    }
}

/// Dropout (`torch.nn.Dropout`): in training mode zeroes each element with probability `p` and scales the rest by
/// `1 / (1 - p)`; in evaluation mode the identity. Starts in training mode. See `functional::dropout`.
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    training: AtomicBool,
    /// `None`: the default generator of the thread that runs `forward`.
    generator: Option<Generator>,
}

impl Dropout {
    /// Dropout whose masks come from the default generator of the thread that calls `forward`.
    #[track_caller]
    pub fn new(p: f64) -> Dropout {
        Dropout::checked(p, None)
    }

    /// Dropout whose masks come from `generator`, whichever thread runs it.
    #[track_caller]
    pub fn with_generator(p: f64, generator: Generator) -> Dropout {
        Dropout::checked(p, Some(generator))
    }

    #[track_caller]
    fn checked(p: f64, generator: Option<Generator>) -> Dropout {
        if !(0.0..=1.0).contains(&p) {
            fail!("Dropout", "probability has to be between 0 and 1, but got {p}");
        }
        Dropout { p, training: AtomicBool::new(true), generator }
    }

    pub fn p(&self) -> f64 {
        self.p
    }

    pub fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Tensor {
        match &self.generator {
            Some(g) => functional::dropout_with(x, self.p, self.is_training(), g),
            None => functional::dropout(x, self.p, self.is_training()),
        }
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    fn train(&self, mode: bool) {
        self.training.store(mode, Ordering::Relaxed);
    }
}

/// A lookup table of `num_embeddings` vectors of size `embedding_dim` (`torch.nn.Embedding`), initialized
/// standard normal. The input is an integer tensor of indices `[...]` (i64, or i32); the output is
/// `[..., embedding_dim]`, a gather of the weight's rows ([`functional::embedding`]) that fuses with what reads it
/// (an added position embedding). An index outside `0..num_embeddings` is an error when the output is read. With a
/// padding entry ([`Embedding::with_padding_idx`], [`Embedding::padding_idx`]) the positions that look it up pass
/// no gradient to it, as PyTorch's `padding_idx`.
#[derive(Clone, Debug)]
pub struct Embedding {
    weight: Param,
    /// The row that takes no gradient, as a row index.
    padding: Option<usize>,
}

impl Embedding {
    /// `Embedding(num_embeddings, embedding_dim)` with weight ~ N(0, 1) (f32).
    pub fn new(num_embeddings: usize, embedding_dim: usize, device: &Device) -> Embedding {
        Embedding::from_weight(init::normal([num_embeddings, embedding_dim], 0.0, 1.0, device))
    }

    /// `new`, drawing the initial weight from `generator`.
    pub fn new_with(num_embeddings: usize, embedding_dim: usize, device: &Device, generator: &Generator) -> Embedding {
        Embedding::from_weight(init::normal_with([num_embeddings, embedding_dim], 0.0, 1.0, device, generator))
    }

    /// An embedding with the given float weight `[num_embeddings, embedding_dim]` (`Embedding.from_pretrained`,
    /// but trainable).
    #[track_caller]
    pub fn from_weight(weight: Tensor) -> Embedding {
        if weight.rank() != 2 || !weight.dtype().is_float() {
            fail!(
                "Embedding",
                "the weight must be a 2-d float tensor [num, dim], got {}{:?}",
                weight.dtype(),
                weight.dims()
            );
        }
        Embedding { weight: Param::new("weight", weight), padding: None }
    }

    /// `Embedding(num_embeddings, embedding_dim, padding_idx=p)`: [`Embedding::new`] with row `padding_idx`
    /// (negative: counted from the end) zeroed and kept out of training ([`Embedding::padding_idx`]).
    #[track_caller]
    pub fn with_padding_idx(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: i64,
        device: &Device,
    ) -> Embedding {
        let p = functional::padding_row("Embedding", num_embeddings, padding_idx);
        let w = init::normal([num_embeddings, embedding_dim], 0.0, 1.0, device);
        // Row numbers in the device's index dtype (i32 on a device without 64-bit integers).
        let rows = Tensor::iota(Scalar::Int(0), Scalar::Int(1), num_embeddings, device.index_dtype(), device);
        let keep = rows.ne(p as i64).unsqueeze(1);
        Embedding::from_weight(keep.where_(&w, 0.0)).padding_idx(padding_idx)
    }

    /// Makes row `padding_idx` (negative: counted from the end) the padding entry: the positions that look it up
    /// pass no gradient to it ([`functional::embedding_padded`]), so it keeps its value through training. The row is
    /// not changed here (`Embedding.from_pretrained(w, padding_idx=p)` keeps it too); `with_padding_idx` zeroes it.
    #[track_caller]
    pub fn padding_idx(mut self, padding_idx: i64) -> Embedding {
        self.padding = Some(functional::padding_row("Embedding", self.weight.get().dims()[0], padding_idx));
        self
    }

    /// The padding entry's row, if there is one.
    pub fn padding(&self) -> Option<usize> {
        self.padding
    }

    pub fn weight(&self) -> &Param {
        &self.weight
    }
}

impl Module for Embedding {
    fn forward(&self, indices: &Tensor) -> Tensor {
        match self.padding {
            Some(p) => functional::embedding_padded(indices, &self.weight.get(), p as i64),
            None => functional::embedding(indices, &self.weight.get()),
        }
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

/// Any function of one tensor as a parameterless module: `Sequential::new().add(Func::new(|x| x.relu()))`.
pub struct Func {
    f: Box<dyn Fn(&Tensor) -> Tensor + Send + Sync>,
}

impl Func {
    pub fn new(f: impl Fn(&Tensor) -> Tensor + Send + Sync + 'static) -> Func {
        Func { f: Box::new(f) }
    }
}

impl Module for Func {
    fn forward(&self, x: &Tensor) -> Tensor {
        (self.f)(x)
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        Vec::new()
    }
}

macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, |$s:ident, $x:ident| $body:expr) => {
        $(#[$doc])*
        impl Module for $name {
            #[allow(unused_variables)]
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

/// Passes its input through (`torch.nn.Identity`): a placeholder where a model's layer is optional.
#[derive(Clone, Copy, Debug, Default)]
pub struct Identity;
activation!(Identity, |s, x| x.clone());

/// [`Tensor::flatten_dims`] as a module (`torch.nn.Flatten`): `Flatten::default()` merges every dim but the batch
/// dim (`start_dim` 1 through `end_dim` -1), as between a CNN's convolutions and its linear head.
#[derive(Clone, Copy, Debug)]
pub struct Flatten {
    pub start_dim: isize,
    pub end_dim: isize,
}
impl Default for Flatten {
    fn default() -> Self {
        Flatten { start_dim: 1, end_dim: -1 }
    }
}
activation!(Flatten, |s, x| x.flatten_dims(s.start_dim, s.end_dim));

/// [`Tensor::unflatten`] as a module (`torch.nn.Unflatten`): dim `dim` split into `sizes`.
#[derive(Clone, Debug)]
pub struct Unflatten {
    pub dim: isize,
    pub sizes: Vec<isize>,
}
activation!(Unflatten, |s, x| x.unflatten(s.dim, &s.sizes));

/// [`functional::interpolate`] as a module (`torch.nn.Upsample`), with its options.
#[derive(Clone, Debug, Default)]
pub struct Upsample {
    pub options: functional::InterpolateOptions,
}
activation!(Upsample, |s, x| functional::interpolate(x, &s.options));

/// [`functional::prelu`] with a learned slope (`torch.nn.PReLU`): one weight, or one per channel, initialized to
/// `init` (PyTorch's default 0.25).
#[derive(Clone, Debug)]
pub struct PReLU {
    weight: Param,
}

impl PReLU {
    /// `PReLU(num_parameters, init)` in f32.
    #[track_caller]
    pub fn new(num_parameters: usize, init: f64, device: &Device) -> PReLU {
        if num_parameters == 0 {
            fail!("PReLU", "num_parameters must be at least 1");
        }
        PReLU { weight: Param::new("weight", Tensor::full([num_parameters], init, kiln_jit::DType::F32, device)) }
    }

    pub fn weight(&self) -> &Param {
        &self.weight
    }
}

impl Module for PReLU {
    fn forward(&self, x: &Tensor) -> Tensor {
        functional::prelu(x, &self.weight.get())
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}

/// `functional::relu` as a module (`torch.nn.ReLU`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReLU;
activation!(ReLU, |s, x| functional::relu(x));

/// `functional::leaky_relu` as a module (`torch.nn.LeakyReLU`; `LeakyReLU::default()` has slope 0.01).
#[derive(Clone, Copy, Debug)]
pub struct LeakyReLU {
    pub negative_slope: f64,
}
impl Default for LeakyReLU {
    fn default() -> Self {
        LeakyReLU { negative_slope: 0.01 }
    }
}
activation!(LeakyReLU, |s, x| functional::leaky_relu(x, s.negative_slope));

/// `functional::gelu` as a module (`torch.nn.GELU`; the default is exact).
#[allow(clippy::upper_case_acronyms)] // PyTorch's name
#[derive(Clone, Copy, Debug, Default)]
pub struct GELU {
    pub approximate: Approximate,
}
activation!(GELU, |s, x| functional::gelu(x, s.approximate));

/// `functional::silu` as a module (`torch.nn.SiLU`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SiLU;
activation!(SiLU, |s, x| functional::silu(x));

/// `tanh` as a module (`torch.nn.Tanh`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tanh;
activation!(Tanh, |s, x| x.tanh());

/// `sigmoid` as a module (`torch.nn.Sigmoid`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sigmoid;
activation!(Sigmoid, |s, x| x.sigmoid());

/// Softmax along `dim` as a module (`torch.nn.Softmax(dim)`).
#[derive(Clone, Copy, Debug)]
pub struct Softmax {
    pub dim: isize,
}
activation!(Softmax, |s, x| x.softmax(s.dim));

/// Log-softmax along `dim` as a module (`torch.nn.LogSoftmax(dim)`).
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    pub dim: isize,
}
activation!(LogSoftmax, |s, x| x.log_softmax(s.dim));
