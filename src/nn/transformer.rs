//! `torch.nn.TransformerEncoderLayer`, `TransformerDecoderLayer`, the stacks over them (`TransformerEncoder`,
//! `TransformerDecoder`) and the encoder-decoder `Transformer`: compositions of `MultiheadAttention`, `Linear`,
//! `LayerNorm` and dropout with PyTorch's parameter names (`self_attn.in_proj_weight`, `linear1.weight`,
//! `norm1.bias`, `layers.0. ...`), initialization, post-norm default and `norm_first`. A stack holds copies of the
//! layer it is given, as PyTorch's (every layer starts from the same values; `Transformer` then draws each
//! parameter of two or more dims anew, as PyTorch's).
//!
//! Not done: a custom activation function (ReLU or exact GELU, PyTorch's two named ones), `custom_encoder` /
//! `custom_decoder`, and PyTorch's fused inference path (the same values).

use super::attention_layers::{MhaOptions, MultiheadAttention};
use super::functional::{self, Approximate};
use super::{LayerNorm, Linear, Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::tensor::Tensor;
use kiln_jit::DType;
use std::sync::atomic::{AtomicBool, Ordering};

/// The feed-forward block's activation (PyTorch's `activation="relu"` or `"gelu"`, the exact form).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransformerActivation {
    #[default]
    Relu,
    Gelu,
}

/// The keyword arguments of PyTorch's transformer layers (`Default`: theirs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerOptions {
    pub dim_feedforward: usize,
    /// Dropout after the attention and feed-forward blocks, inside the feed-forward block and on the attention
    /// weights, in training mode.
    pub dropout: f64,
    pub activation: TransformerActivation,
    pub layer_norm_eps: f64,
    /// Inputs `[N, L, E]` instead of `[L, N, E]`.
    pub batch_first: bool,
    /// Layer norm before each block (pre-norm) instead of after each residual sum.
    pub norm_first: bool,
    /// Biases in the projections and the layer norms.
    pub bias: bool,
}

impl Default for TransformerOptions {
    fn default() -> Self {
        TransformerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: TransformerActivation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
        }
    }
}

/// The masks of one attention call (`None`/`false`: none), in `MultiheadAttention`'s conventions.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionMasks<'a> {
    /// `[L, S]` or `[N * H, L, S]`: bool true where attention is not allowed, or float added to the logits.
    pub mask: Option<&'a Tensor>,
    /// `[N, S]` bool, true for keys to ignore.
    pub key_padding_mask: Option<&'a Tensor>,
    /// A causal mask. With `mask` given too, PyTorch's hint that `mask` is the causal one: `mask` is used.
    pub is_causal: bool,
}

impl AttentionMasks<'_> {
    /// The options of one attention call; for an unbatched input, a key padding mask `[S]` as the batch of one.
    fn options(&self, unbatched: bool) -> MhaOptions {
        let one = |m: &Tensor| if unbatched && m.rank() == 1 { m.unsqueeze(0) } else { m.clone() };
        MhaOptions {
            attn_mask: self.mask.cloned(),
            key_padding_mask: self.key_padding_mask.map(one),
            need_weights: false,
            is_causal: self.is_causal && self.mask.is_none(),
            ..Default::default()
        }
    }
}

/// The parts both layers share: the feed-forward block, the norms, the options and the mode.
struct Common {
    linear1: Linear,
    linear2: Linear,
    norms: Vec<LayerNorm>,
    opts: TransformerOptions,
    training: AtomicBool,
}

impl Common {
    #[track_caller]
    fn new(name: &str, d_model: usize, nhead: usize, norms: usize, opts: TransformerOptions, device: &Device) -> Self {
        if nhead == 0 || !d_model.is_multiple_of(nhead) || opts.dim_feedforward == 0 {
            fail!(name, "d_model {d_model} must be a multiple of nhead {nhead}, and dim_feedforward at least 1");
        }
        if !(0.0..=1.0).contains(&opts.dropout) {
            fail!(name, "dropout has to be between 0 and 1, but got {}", opts.dropout);
        }
        Common {
            linear1: Linear::new(d_model, opts.dim_feedforward, opts.bias, device),
            linear2: Linear::new(opts.dim_feedforward, d_model, opts.bias, device),
            norms: (0..norms).map(|_| layer_norm(d_model, &opts, device)).collect(),
            opts,
            training: AtomicBool::new(true),
        }
    }

    /// `x` as a batch (`[N, L, E]`, or `[L, N, E]` sequence first) and whether it was one sequence `[L, E]`
    /// (PyTorch's unbatched input), checked against `d_model`.
    #[track_caller]
    fn batched(&self, name: &str, what: &str, x: &Tensor) -> (Tensor, bool) {
        let d = self.linear1.in_features();
        if !matches!(x.rank(), 2 | 3) || x.dims()[x.rank() - 1] != d {
            fail!(name, "{what} must be [L, {d}] or 3-d with d_model {d} last, got {:?}", x.dims());
        }
        if x.rank() == 2 { (x.unsqueeze(self.batch_axis()), true) } else { (x.clone(), false) }
    }

    /// Where the batch dim is.
    fn batch_axis(&self) -> isize {
        if self.opts.batch_first { 0 } else { 1 }
    }

    /// Dropout at the layer's rate in training mode.
    fn dropout(&self, x: &Tensor) -> Tensor {
        functional::dropout(x, self.opts.dropout, self.training.load(Ordering::Relaxed))
    }

    fn feed_forward(&self, x: &Tensor) -> Tensor {
        let h = self.linear1.forward(x);
        let h = match self.opts.activation {
            TransformerActivation::Relu => h.relu(),
            TransformerActivation::Gelu => functional::gelu(&h, Approximate::None),
        };
        self.dropout(&self.linear2.forward(&self.dropout(&h)))
    }

    /// `x` through `block` with residual `i`: `x + block(norm_i(x))` pre-norm, `norm_i(x + block(x))` post-norm.
    fn residual(&self, i: usize, x: &Tensor, block: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        if self.opts.norm_first {
            x.add(block(&self.norms[i].forward(x)))
        } else {
            self.norms[i].forward(&x.add(block(x)))
        }
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.linear1.named_params_prefixed("linear1");
        p.extend(self.linear2.named_params_prefixed("linear2"));
        for (i, n) in self.norms.iter().enumerate() {
            p.extend(n.named_params_prefixed(&format!("norm{}", i + 1)));
        }
        p
    }

    /// A copy holding the same values in parameters of its own.
    fn copy(&self) -> Common {
        Common {
            linear1: self.linear1.copy(),
            linear2: self.linear2.copy(),
            norms: self.norms.iter().map(LayerNorm::copy).collect(),
            opts: self.opts,
            training: AtomicBool::new(self.training.load(Ordering::Relaxed)),
        }
    }
}

/// An attention layer as PyTorch builds it: Xavier-uniform input projection, zero biases, dropout on the weights.
fn attention(d_model: usize, nhead: usize, opts: &TransformerOptions, device: &Device) -> MultiheadAttention {
    MultiheadAttention::with_bias(d_model, nhead, opts.bias, device).batch_first(opts.batch_first).dropout(opts.dropout)
}

/// A layer norm as PyTorch's layers build it: weight 1, bias 0 (none without `opts.bias`), `opts.layer_norm_eps`.
fn layer_norm(d_model: usize, opts: &TransformerOptions, device: &Device) -> LayerNorm {
    let bias = opts.bias.then(|| init::zeros([d_model], device));
    LayerNorm::from_params(Tensor::ones([d_model], DType::F32, device), bias, opts.layer_norm_eps)
}

/// One encoder layer: self-attention, then the feed-forward block (`linear2(dropout(act(linear1(x))))`), each
/// with a residual sum and a layer norm (`norm1`, `norm2`).
pub struct TransformerEncoderLayer {
    self_attn: MultiheadAttention,
    common: Common,
}

impl TransformerEncoderLayer {
    /// `TransformerEncoderLayer(d_model, nhead, **opts)`, f32.
    #[track_caller]
    pub fn new(d_model: usize, nhead: usize, opts: TransformerOptions, device: &Device) -> Self {
        let common = Common::new("TransformerEncoderLayer", d_model, nhead, 2, opts, device);
        TransformerEncoderLayer { self_attn: attention(d_model, nhead, &opts, device), common }
    }

    /// The layer over `src` (a batch, or one sequence `[L, E]`) with the self-attention's masks (PyTorch's
    /// `src_mask`, `src_key_padding_mask`, `is_causal`).
    #[track_caller]
    pub fn forward_with(&self, src: &Tensor, masks: AttentionMasks) -> Tensor {
        let c = &self.common;
        let (src, one) = c.batched("TransformerEncoderLayer", "src", src);
        let x = c.residual(0, &src, |x| c.dropout(&self.self_attn.attend(x, x, x, &masks.options(one)).0));
        let y = c.residual(1, &x, |x| c.feed_forward(x));
        if one { y.squeeze(c.batch_axis()) } else { y }
    }

    fn copy(&self) -> TransformerEncoderLayer {
        TransformerEncoderLayer { self_attn: self.self_attn.copy(), common: self.common.copy() }
    }
}

impl Module for TransformerEncoderLayer {
    fn forward(&self, src: &Tensor) -> Tensor {
        self.forward_with(src, AttentionMasks::default())
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.self_attn.named_params_prefixed("self_attn");
        p.extend(self.common.named_params());
        p
    }

    fn train(&self, mode: bool) {
        self.self_attn.train(mode);
        self.common.training.store(mode, Ordering::Relaxed);
    }
}

/// The masks of a decoder layer's two attentions.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecoderMasks<'a> {
    /// The self-attention over the target (PyTorch's `tgt_mask`, `tgt_key_padding_mask`, `tgt_is_causal`).
    pub tgt: AttentionMasks<'a>,
    /// The attention over the memory (`memory_mask`, `memory_key_padding_mask`, `memory_is_causal`).
    pub memory: AttentionMasks<'a>,
}

/// One decoder layer: self-attention over the target, attention over the encoder's output (`memory`), then the
/// feed-forward block, each with a residual sum and a layer norm (`norm1`, `norm2`, `norm3`).
pub struct TransformerDecoderLayer {
    self_attn: MultiheadAttention,
    multihead_attn: MultiheadAttention,
    common: Common,
}

impl TransformerDecoderLayer {
    /// `TransformerDecoderLayer(d_model, nhead, **opts)`, f32.
    #[track_caller]
    pub fn new(d_model: usize, nhead: usize, opts: TransformerOptions, device: &Device) -> Self {
        let common = Common::new("TransformerDecoderLayer", d_model, nhead, 3, opts, device);
        TransformerDecoderLayer {
            self_attn: attention(d_model, nhead, &opts, device),
            multihead_attn: attention(d_model, nhead, &opts, device),
            common,
        }
    }

    /// The layer over `tgt` attending to `memory` (PyTorch's `forward(tgt, memory, ...)`; both batches, or both one
    /// sequence `[L, E]`).
    #[track_caller]
    pub fn forward_with(&self, tgt: &Tensor, memory: &Tensor, masks: DecoderMasks) -> Tensor {
        let (c, name) = (&self.common, "TransformerDecoderLayer");
        let (tgt, one) = c.batched(name, "tgt", tgt);
        let (memory, one_memory) = c.batched(name, "memory", memory);
        if one != one_memory {
            fail!(
                name,
                "tgt and memory must both be batches or both one sequence, got {:?} and {:?}",
                tgt.dims(),
                memory.dims()
            );
        }
        let (tgt_opts, memory_opts) = (masks.tgt.options(one), masks.memory.options(one));
        let x = c.residual(0, &tgt, |x| c.dropout(&self.self_attn.attend(x, x, x, &tgt_opts).0));
        let x = c.residual(1, &x, |x| c.dropout(&self.multihead_attn.attend(x, &memory, &memory, &memory_opts).0));
        let y = c.residual(2, &x, |x| c.feed_forward(x));
        if one { y.squeeze(c.batch_axis()) } else { y }
    }

    fn copy(&self) -> TransformerDecoderLayer {
        TransformerDecoderLayer {
            self_attn: self.self_attn.copy(),
            multihead_attn: self.multihead_attn.copy(),
            common: self.common.copy(),
        }
    }
}

impl Module for TransformerDecoderLayer {
    /// A decoder layer needs the encoder's output: this refuses, naming `forward_with`.
    #[track_caller]
    fn forward(&self, _tgt: &Tensor) -> Tensor {
        fail!("TransformerDecoderLayer", "needs the memory it attends to: call forward_with(tgt, memory, masks)");
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.self_attn.named_params_prefixed("self_attn");
        p.extend(self.multihead_attn.named_params_prefixed("multihead_attn"));
        p.extend(self.common.named_params());
        p
    }

    fn train(&self, mode: bool) {
        self.self_attn.train(mode);
        self.multihead_attn.train(mode);
        self.common.training.store(mode, Ordering::Relaxed);
    }
}

/// `num_layers` copies of an encoder layer and an optional final norm (`torch.nn.TransformerEncoder`).
pub struct TransformerEncoder {
    layers: Vec<TransformerEncoderLayer>,
    norm: Option<LayerNorm>,
}

impl TransformerEncoder {
    /// `TransformerEncoder(layer, num_layers, norm)`: each layer a copy of `layer` (its values at this call).
    pub fn new(layer: &TransformerEncoderLayer, num_layers: usize, norm: Option<LayerNorm>) -> TransformerEncoder {
        TransformerEncoder { layers: (0..num_layers).map(|_| layer.copy()).collect(), norm }
    }

    /// Every layer over `src` with the same masks, then the norm.
    #[track_caller]
    pub fn forward_with(&self, src: &Tensor, masks: AttentionMasks) -> Tensor {
        let x = self.layers.iter().fold(src.clone(), |x, l| l.forward_with(&x, masks));
        self.norm.as_ref().map_or(x.clone(), |n| n.forward(&x))
    }
}

impl Module for TransformerEncoder {
    fn forward(&self, src: &Tensor) -> Tensor {
        self.forward_with(src, AttentionMasks::default())
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        stack_params(&self.layers, &self.norm)
    }

    fn train(&self, mode: bool) {
        self.layers.iter().for_each(|l| l.train(mode));
    }
}

/// `num_layers` copies of a decoder layer and an optional final norm (`torch.nn.TransformerDecoder`).
pub struct TransformerDecoder {
    layers: Vec<TransformerDecoderLayer>,
    norm: Option<LayerNorm>,
}

impl TransformerDecoder {
    /// `TransformerDecoder(layer, num_layers, norm)`: each layer a copy of `layer` (its values at this call).
    pub fn new(layer: &TransformerDecoderLayer, num_layers: usize, norm: Option<LayerNorm>) -> TransformerDecoder {
        TransformerDecoder { layers: (0..num_layers).map(|_| layer.copy()).collect(), norm }
    }

    /// Every layer over `tgt` attending to `memory` with the same masks, then the norm.
    #[track_caller]
    pub fn forward_with(&self, tgt: &Tensor, memory: &Tensor, masks: DecoderMasks) -> Tensor {
        let x = self.layers.iter().fold(tgt.clone(), |x, l| l.forward_with(&x, memory, masks));
        self.norm.as_ref().map_or(x.clone(), |n| n.forward(&x))
    }
}

impl Module for TransformerDecoder {
    /// A decoder needs the encoder's output: this refuses, naming `forward_with`.
    #[track_caller]
    fn forward(&self, _tgt: &Tensor) -> Tensor {
        fail!("TransformerDecoder", "needs the memory it attends to: call forward_with(tgt, memory, masks)");
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        stack_params(&self.layers, &self.norm)
    }

    fn train(&self, mode: bool) {
        self.layers.iter().for_each(|l| l.train(mode));
    }
}

/// A stack's parameters: `layers.{i}.` and `norm.` prefixes, as PyTorch names them.
fn stack_params(layers: &[impl Module], norm: &Option<LayerNorm>) -> Vec<(String, Param)> {
    let mut p: Vec<(String, Param)> =
        layers.iter().enumerate().flat_map(|(i, l)| l.named_params_prefixed(&format!("layers.{i}"))).collect();
    if let Some(n) = norm {
        p.extend(n.named_params_prefixed("norm"));
    }
    p
}

/// The masks of a whole [`Transformer`]'s three attentions.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransformerMasks<'a> {
    /// The encoder's self-attention (PyTorch's `src_mask`, `src_key_padding_mask`, `src_is_causal`).
    pub src: AttentionMasks<'a>,
    /// The decoder's self-attention (`tgt_mask`, `tgt_key_padding_mask`, `tgt_is_causal`).
    pub tgt: AttentionMasks<'a>,
    /// The decoder's attention over the memory (`memory_mask`, `memory_key_padding_mask`, `memory_is_causal`).
    pub memory: AttentionMasks<'a>,
}

/// An encoder-decoder transformer (`torch.nn.Transformer`): `num_encoder_layers` encoder layers and
/// `num_decoder_layers` decoder layers, each stack with a final layer norm, every parameter of two or more dims then
/// drawn Xavier-uniform, as PyTorch's `_reset_parameters`.
pub struct Transformer {
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
}

impl Transformer {
    /// `Transformer(d_model, nhead, num_encoder_layers, num_decoder_layers, **opts)`, f32.
    #[track_caller]
    pub fn new(
        d_model: usize,
        nhead: usize,
        num_encoder_layers: usize,
        num_decoder_layers: usize,
        opts: TransformerOptions,
        device: &Device,
    ) -> Transformer {
        let encoder_layer = TransformerEncoderLayer::new(d_model, nhead, opts, device);
        let decoder_layer = TransformerDecoderLayer::new(d_model, nhead, opts, device);
        let t = Transformer {
            encoder: TransformerEncoder::new(
                &encoder_layer,
                num_encoder_layers,
                Some(layer_norm(d_model, &opts, device)),
            ),
            decoder: TransformerDecoder::new(
                &decoder_layer,
                num_decoder_layers,
                Some(layer_norm(d_model, &opts, device)),
            ),
        };
        for (_, p) in t.named_params() {
            let dims = p.dims();
            if dims.len() > 1 {
                let field: usize = dims[2..].iter().product();
                p.set(init::xavier_uniform(dims.clone(), dims[1] * field, dims[0] * field, device));
            }
        }
        t
    }

    /// The encoder over `src`, then the decoder over `tgt` attending to its output (PyTorch's
    /// `forward(src, tgt, ...)`): `[T, N, E]` (or `[N, T, E]` with `batch_first`).
    #[track_caller]
    pub fn forward_with(&self, src: &Tensor, tgt: &Tensor, masks: TransformerMasks) -> Tensor {
        let first = self.encoder.layers.first().map(|l| l.common.opts.batch_first).unwrap_or(false);
        let batch = if first { 0 } else { 1 };
        if src.rank() != tgt.rank() || src.rank() == 3 && src.dims()[batch] != tgt.dims()[batch] {
            fail!(
                "Transformer",
                "src and tgt must be batches of one size, or both one sequence, got {:?} and {:?}",
                src.dims(),
                tgt.dims()
            );
        }
        let memory = self.encoder.forward_with(src, masks.src);
        self.decoder.forward_with(tgt, &memory, DecoderMasks { tgt: masks.tgt, memory: masks.memory })
    }

    /// A float `[size, size]` mask with -inf above the diagonal and 0 on and below it: each position attends to
    /// itself and the ones before (PyTorch's `Transformer.generate_square_subsequent_mask`).
    pub fn generate_square_subsequent_mask(size: usize, device: &Device) -> Tensor {
        let above = Tensor::ones([size, size], DType::F32, device).triu(1).gt(0.0);
        above.where_(f64::NEG_INFINITY, 0.0)
    }
}

impl Module for Transformer {
    /// A transformer needs a source and a target: this refuses, naming `forward_with`.
    #[track_caller]
    fn forward(&self, _src: &Tensor) -> Tensor {
        fail!("Transformer", "needs a source and a target: call forward_with(src, tgt, masks)");
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = self.encoder.named_params_prefixed("encoder");
        p.extend(self.decoder.named_params_prefixed("decoder"));
        p
    }

    fn train(&self, mode: bool) {
        self.encoder.train(mode);
        self.decoder.train(mode);
    }
}
