//! Neural-network building blocks with PyTorch's names and semantics: `Param`, the `Module` trait, `Sequential`,
//! layers (`Linear`, `Conv1d`, `Conv2d`, `ConvTranspose2d`, the poolings, `BatchNorm1d`/`2d`, `LayerNorm`,
//! `RMSNorm`, `GroupNorm`, `Dropout`, `Embedding`, `MultiheadAttention`, `LSTM`, `GRU`, `Flatten`, `Unflatten`,
//! `Upsample`, `Identity`, activation modules), `functional` (activations, losses, convolutions, poolings,
//! attention), `init`, and gradient clipping (`clip_grad_norm`, `clip_grad_value`: `utils.rs`).
//!
//! Everything here is a composition of kiln's public ops, so a model's forward, its backward and an optimizer's
//! update are one lazy graph that `optim` realizes, compiles once and replays.
//!
//! - A `Param` is a shared handle (`Arc<RwLock<Tensor>>`) to a leaf that requires gradients. Modules read it on
//!   every `forward`; an optimizer swaps in the next value with `set`. Cloning a `Param` shares it (weight tying is
//!   two modules holding the same `Param`).
//! - Initial values are lazy (e.g. `rand * 2b - b`): they are computed as part of the first graph that needs them.
//!   An optimizer's first `step` realizes any still-lazy parameter in a realize of its own first, so the training
//!   step's graph is the same from the first step on; `Module::realize_params` does it up front.
//! - Modules take `&self`: train/eval mode (of `Dropout` and the batch norms) is an atomic flag, so a model can be
//!   shared between threads.
//!
//! Deliberately not done: hooks, `max_norm` for `Embedding` (it renormalizes the looked-up rows of the table in
//! place during the forward, a write a lazy graph would order after every read of the table), and a dtype/device
//! `to` for whole modules (build the module on the device and dtype it should live on). Parameter groups are the
//! optimizers' (`optim::GroupOptions`); buffers, such as a batch norm's running statistics, are `Param::buffer`s.

mod attention_layers;
mod batch_norm;
mod conv_layers;
pub mod functional;
pub mod init;
mod layers;
mod linear;
mod norm_layers;
mod pool_layers;
mod recurrent;
mod transformer;
mod utils;

pub use attention_layers::{MhaOptions, MultiheadAttention, RotaryEmbedding, apply_rotary};
pub use batch_norm::{BatchNorm, BatchNorm1d, BatchNorm2d};
pub use conv_layers::{Conv1d, Conv1dOptions, Conv2d, ConvTranspose2d};
pub use functional::{Approximate, Reduction};
pub use layers::{
    Dropout, Embedding, Flatten, Func, GELU, Identity, LayerNorm, LeakyReLU, LogSoftmax, PReLU, ReLU, SiLU, Sigmoid,
    Softmax, Tanh, Unflatten, Upsample,
};
pub use linear::Linear;
pub use norm_layers::{GroupNorm, RMSNorm};
pub use pool_layers::{
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, MaxPool1d,
    MaxPool2d, MaxUnpool1d, MaxUnpool2d,
};
pub use recurrent::{GRU, LSTM, RnnOptions};
pub use transformer::{
    AttentionMasks, DecoderMasks, Transformer, TransformerActivation, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer, TransformerMasks, TransformerOptions,
};
pub use utils::{clip_grad_norm, clip_grad_value};

use crate::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use parking_lot::RwLock;
use std::fmt;
use std::sync::Arc;

/// A shared handle to a trainable tensor (`torch.nn.Parameter`): a name and the current leaf, which requires
/// gradients. Cloning is cheap and shares the parameter.
#[derive(Clone)]
pub struct Param {
    inner: Arc<ParamInner>,
}

struct ParamInner {
    name: String,
    value: RwLock<Tensor>,
    /// A parameter (a leaf that requires gradients) or a buffer (state kept as it is given: `Param::buffer`).
    trainable: bool,
}

/// `t` as a leaf that requires gradients: `t` itself (marked) unless it carries autograd history, in which case a
/// detached copy, so gradients stop at the parameter as they do at a `torch.nn.Parameter`.
#[track_caller]
fn as_leaf(t: Tensor) -> Tensor {
    let t = if t.node.grad_srcs.is_some() { t.detach() } else { t };
    t.requires_grad()
}

impl Param {
    /// A parameter named `name` holding `tensor`, marked `requires_grad`. The tensor must be float.
    #[track_caller]
    pub fn new(name: impl Into<String>, tensor: Tensor) -> Param {
        Param {
            inner: Arc::new(ParamInner { name: name.into(), value: RwLock::new(as_leaf(tensor)), trainable: true }),
        }
    }

    /// A buffer named `name` holding `tensor` (`register_buffer`): module state that is saved and loaded but not
    /// trained, so it does not require gradients and `set` keeps values as given (a batch norm's running
    /// statistics, recomputed each step from the last).
    pub fn buffer(name: impl Into<String>, tensor: Tensor) -> Param {
        let value = RwLock::new(tensor.detach());
        Param { inner: Arc::new(ParamInner { name: name.into(), value, trainable: false }) }
    }

    /// The name given at construction (a module's `named_params` gives the qualified path, e.g. `0.weight`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The current value: the leaf to use in a forward pass and to look gradients up with (`grads.get(&p.get())`).
    pub fn get(&self) -> Tensor {
        self.inner.value.read().clone()
    }

    /// Replaces the value (as `param.data = value` in PyTorch; optimizers use this). The new value becomes a leaf
    /// that requires gradients (a buffer's is kept as given). Its shape and dtype must be the current ones: a
    /// module's shapes are fixed.
    #[track_caller]
    pub fn set(&self, value: Tensor) {
        let mut slot = self.inner.value.write();
        if value.dims() != slot.dims() || value.dtype() != slot.dtype() {
            crate::args::fail!(
                "Param::set",
                "parameter `{}` is {}{:?}; cannot set it to {}{:?}",
                self.inner.name,
                slot.dtype(),
                slot.dims(),
                value.dtype(),
                value.dims()
            );
        }
        *slot = if self.inner.trainable { as_leaf(value) } else { value };
    }

    /// Changes the parameter's dtype to `dtype` (its value cast, rounding to nearest even as PyTorch), as
    /// `module.to(dtype)` does to each floating-point parameter; the shape stays. Both dtypes must be float: a
    /// parameter or buffer of another dtype (an integer count) is left alone by [`Module::to_dtype`], and refused
    /// here. Optimizer state made before the cast keeps its old dtype: cast first, then build the optimizer.
    #[track_caller]
    pub fn cast(&self, dtype: DType) {
        let mut slot = self.inner.value.write();
        if !dtype.is_float() || !slot.dtype().is_float() {
            crate::args::fail!(
                "Param::cast",
                "parameter `{}` is {}; casting it to {dtype} is not supported (float to float only)",
                self.inner.name,
                slot.dtype()
            );
        }
        if slot.dtype() == dtype {
            return;
        }
        let value = slot.detach().to_dtype(dtype);
        *slot = if self.inner.trainable { as_leaf(value) } else { value };
    }

    /// The parameter's dtype.
    pub fn dtype(&self) -> DType {
        self.inner.value.read().dtype()
    }

    /// The parameter's shape.
    pub fn dims(&self) -> Vec<usize> {
        self.inner.value.read().dims().to_vec()
    }

    /// Whether two handles share one parameter.
    pub fn ptr_eq(&self, other: &Param) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Param({}: {:?})", self.inner.name, *self.inner.value.read())
    }
}

/// `(name, param)` for each of `params` present, under its own name (a layer's optional weight and bias).
pub(crate) fn present(params: &[&Option<Param>]) -> Vec<(String, Param)> {
    params.iter().filter_map(|p| p.as_ref()).map(|p| (p.name().to_string(), p.clone())).collect()
}

/// A layer or model (`torch.nn.Module`). Implement `forward` and `named_params`; the rest has defaults.
///
/// A composite module lists its children's parameters under their names, e.g.
/// ```
/// # #[cfg(feature = "cpu")] {
/// use kiln::nn::{Linear, Module, Param};
/// use kiln::{Device, Tensor};
/// struct Mlp { fc1: Linear, fc2: Linear }
/// impl Module for Mlp {
///     fn forward(&self, x: &Tensor) -> Tensor { self.fc2.forward(&self.fc1.forward(x).relu()) }
///     fn named_params(&self) -> Vec<(String, Param)> {
///         let mut p = self.fc1.named_params_prefixed("fc1");
///         p.extend(self.fc2.named_params_prefixed("fc2"));
///         p
///     }
/// }
/// let dev = Device::cpu();
/// let mlp = Mlp { fc1: Linear::new(4, 8, true, &dev), fc2: Linear::new(8, 2, true, &dev) };
/// assert_eq!(mlp.named_params()[2].0, "fc2.weight");
/// assert_eq!(mlp.forward(&Tensor::ones([3, 4], kiln::DType::F32, &dev)).dims(), &[3, 2]);
/// # }
/// ```
pub trait Module: Send + Sync {
    /// The output for input `x` (lazy, like every op).
    fn forward(&self, x: &Tensor) -> Tensor;

    /// Every parameter with its path (`weight`, `0.bias`, `fc1.weight`): the keys of a PyTorch `state_dict`.
    fn named_params(&self) -> Vec<(String, Param)>;

    /// Every parameter, in `named_params` order.
    fn params(&self) -> Vec<Param> {
        self.named_params().into_iter().map(|(_, p)| p).collect()
    }

    /// `params`, under PyTorch's name (`module.parameters()`).
    fn parameters(&self) -> Vec<Param> {
        self.params()
    }

    /// `named_params`, under PyTorch's name (`module.named_parameters()`).
    fn named_parameters(&self) -> Vec<(String, Param)> {
        self.named_params()
    }

    /// `named_params` with `prefix.` in front of each name, for a parent module listing a child's parameters.
    fn named_params_prefixed(&self, prefix: &str) -> Vec<(String, Param)> {
        self.named_params().into_iter().map(|(n, p)| (format!("{prefix}.{n}"), p)).collect()
    }

    /// State that is not trained but saved and loaded with the parameters (`module.named_buffers()`: a batch
    /// norm's running statistics), as handles. Optimizers do not see them. Default: none; a composite module
    /// lists its children's, as it does their parameters.
    fn named_buffers(&self) -> Vec<(String, Param)> {
        Vec::new()
    }

    /// Casts every floating-point parameter and buffer to `dtype` (float), in place through their handles, as
    /// PyTorch's `module.to(dtype)`: `model.to_dtype(DType::BF16)` before building the optimizer (with
    /// `master_weights(true)` it keeps f32 copies). Others (an integer buffer) keep their dtype.
    #[track_caller]
    fn to_dtype(&self, dtype: DType) {
        for (_, p) in self.named_params().into_iter().chain(self.named_buffers()) {
            if p.dtype().is_float() {
                p.cast(dtype);
            }
        }
    }

    /// `named_buffers` with `prefix.` in front of each name.
    fn named_buffers_prefixed(&self, prefix: &str) -> Vec<(String, Param)> {
        self.named_buffers().into_iter().map(|(n, p)| (format!("{prefix}.{n}"), p)).collect()
    }

    /// Parameters then buffers: what `save_module` writes and `load_module` reads (`module.state_dict()`).
    fn named_state(&self) -> Vec<(String, Param)> {
        let mut s = self.named_params();
        s.extend(self.named_buffers());
        s
    }

    /// Sets training mode (`true`) or evaluation mode (`false`) here and in every child (`module.train(mode)`).
    /// Only `Dropout` and `BatchNorm` behave differently; modules start in training mode, as in PyTorch. A
    /// composite module that holds one must forward this call to it.
    fn train(&self, mode: bool) {
        let _ = mode;
    }

    /// Evaluation mode (`module.eval()`): `train(false)`.
    fn eval(&self) {
        self.train(false);
    }

    /// Computes every parameter that is still lazy (e.g. a fresh random initialization), all in one graph.
    /// Optional: an optimizer's first step does this too. Afterwards the first training step builds the same graph
    /// as every later one.
    fn realize_params(&self) -> Result<()> {
        let values: Vec<Tensor> = self.params().iter().map(Param::get).collect();
        let refs: Vec<&Tensor> = values.iter().collect();
        crate::realize(&refs)
    }
}

/// Modules applied in order (`torch.nn.Sequential`). Parameter names are prefixed with the layer's index
/// (`0.weight`, `2.bias`), as in PyTorch, so a `Sequential`'s safetensors file matches PyTorch's `state_dict`.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential { layers: Vec::new() }
    }

    /// Appends `module` (builder style): `Sequential::new().add(Linear::new(..)).add(ReLU)`.
    #[allow(clippy::should_implement_trait)] // `add` is torch's `add_module`, not arithmetic
    pub fn add(mut self, module: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(module));
        self
    }

    /// Appends `module`.
    pub fn push(&mut self, module: impl Module + 'static) {
        self.layers.push(Box::new(module));
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The `i`th layer.
    pub fn get(&self, i: usize) -> Option<&dyn Module> {
        self.layers.get(i).map(|m| &**m)
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut y = x.clone();
        for layer in &self.layers {
            y = layer.forward(&y);
        }
        y
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        self.layers.iter().enumerate().flat_map(|(i, m)| m.named_params_prefixed(&i.to_string())).collect()
    }

    fn named_buffers(&self) -> Vec<(String, Param)> {
        self.layers.iter().enumerate().flat_map(|(i, m)| m.named_buffers_prefixed(&i.to_string())).collect()
    }

    fn train(&self, mode: bool) {
        for layer in &self.layers {
            layer.train(mode);
        }
    }
}

impl fmt::Debug for Sequential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.named_params().into_iter().map(|(n, _)| n).collect();
        write!(f, "Sequential({} layers; params {:?})", self.layers.len(), names)
    }
}
