//! `MultiheadAttention` (`torch.nn.MultiheadAttention`) and rotary position embeddings (`RotaryEmbedding`, the
//! "rotate half" form of GPT-NeoX and Llama), compositions of `functional::scaled_dot_product_attention` and
//! elementwise ops.

use super::functional::{self, AttentionOptions};
use super::{Linear, Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

/// Attention over `num_heads` heads of `embed_dim / num_heads` with input projections `in_proj_weight`
/// `[3 E, E]` (and bias `[3 E]`) and an output projection `out_proj`, PyTorch's parameters and layout. Inputs are
/// `[L, N, E]` (or `[N, L, E]` with `batch_first`). Keys and values of other widths (PyTorch's `kdim`, `vdim`) take
/// separate projections `q_proj_weight` `[E, E]`, `k_proj_weight` `[E, kdim]`, `v_proj_weight` `[E, vdim]`
/// ([`MultiheadAttention::with_kv_dims`]).
pub struct MultiheadAttention {
    embed_dim: usize,
    num_heads: usize,
    batch_first: bool,
    dropout: f64,
    in_proj: InProj,
    in_proj_bias: Option<Param>,
    out_proj: Linear,
    training: std::sync::atomic::AtomicBool,
}

/// The input projections' weights: PyTorch's packed `in_proj_weight`, or one per input where keys or values have
/// another width than the queries.
enum InProj {
    Packed(Param),
    /// Query, key and value.
    Separate([Param; 3]),
}

impl InProj {
    /// Projection `i`'s weight (`[E, width]`: query, key, value).
    fn weight(&self, i: usize, e: usize) -> Tensor {
        match self {
            InProj::Packed(w) => w.get().narrow(0, i * e, e),
            InProj::Separate(ws) => ws[i].get(),
        }
    }

    /// The input widths the projections take.
    fn widths(&self, e: usize) -> [usize; 3] {
        match self {
            InProj::Packed(_) => [e; 3],
            InProj::Separate(ws) => [0, 1, 2].map(|i| ws[i].dims()[1]),
        }
    }
}

/// PyTorch's output projection: a default `Linear` (its bias drawn too, as PyTorch's, so the generator moves as
/// there), then the bias set to zero.
fn out_projection(embed_dim: usize, bias: bool, device: &Device) -> Linear {
    let out = Linear::new(embed_dim, embed_dim, bias, device);
    Linear::from_weight(out.weight().get(), bias.then(|| init::zeros([embed_dim], device)))
}

/// The keyword arguments of `MultiheadAttention.forward`. `Default`: no masks, weights returned (averaged over
/// heads), not causal.
#[derive(Clone, Debug)]
pub struct MhaOptions {
    /// `[L, S]` or `[N * H, L, S]`: bool, **true where attention is not allowed** (PyTorch's convention for this
    /// module, the opposite of `scaled_dot_product_attention`'s), or float, added to the logits.
    pub attn_mask: Option<Tensor>,
    /// `[N, S]` bool, true for keys to ignore (padding).
    pub key_padding_mask: Option<Tensor>,
    /// Return the attention weights (`[N, L, S]`, averaged over heads, or `[N, H, L, S]`).
    pub need_weights: bool,
    pub average_attn_weights: bool,
    /// A causal mask (query `i` sees keys `0..=i`), instead of `attn_mask`.
    pub is_causal: bool,
}

impl Default for MhaOptions {
    fn default() -> Self {
        MhaOptions {
            attn_mask: None,
            key_padding_mask: None,
            need_weights: true,
            average_attn_weights: true,
            is_causal: false,
        }
    }
}

impl MultiheadAttention {
    /// PyTorch's initialization: `in_proj_weight` Xavier-uniform, biases 0, `out_proj` a default `Linear` with its
    /// bias 0. f32, sequence-first, no dropout.
    #[track_caller]
    pub fn new(embed_dim: usize, num_heads: usize, device: &Device) -> MultiheadAttention {
        MultiheadAttention::with_bias(embed_dim, num_heads, true, device)
    }

    /// `MultiheadAttention(embed_dim, num_heads, bias=bias)`: as [`MultiheadAttention::new`], without the input and
    /// output projections' biases when `bias` is false.
    #[track_caller]
    pub fn with_bias(embed_dim: usize, num_heads: usize, bias: bool, device: &Device) -> MultiheadAttention {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            fail!("MultiheadAttention", "embed_dim {embed_dim} must be a multiple of num_heads {num_heads}");
        }
        let w = init::xavier_uniform([3 * embed_dim, embed_dim], embed_dim, 3 * embed_dim, device);
        let in_bias = bias.then(|| init::zeros([3 * embed_dim], device));
        MultiheadAttention::from_params(num_heads, w, in_bias, out_projection(embed_dim, bias, device))
    }

    /// The layer with given parameters (PyTorch's names: `in_proj_weight`, `in_proj_bias`, `out_proj`).
    #[track_caller]
    pub fn from_params(
        num_heads: usize,
        in_proj_weight: Tensor,
        in_proj_bias: Option<Tensor>,
        out_proj: Linear,
    ) -> MultiheadAttention {
        let e = in_proj_weight.dims().get(1).copied().unwrap_or(0);
        if in_proj_weight.dims() != [3 * e, e] || num_heads == 0 || !e.is_multiple_of(num_heads) {
            fail!(
                "MultiheadAttention",
                "in_proj_weight must be [3 E, E] with E a multiple of {num_heads}, got {:?}",
                in_proj_weight.dims()
            );
        }
        MultiheadAttention::assemble(
            num_heads,
            e,
            InProj::Packed(Param::new("in_proj_weight", in_proj_weight)),
            in_proj_bias,
            out_proj,
        )
    }

    /// `MultiheadAttention(embed_dim, num_heads, kdim=kdim, vdim=vdim)`: keys of width `kdim` and values of width
    /// `vdim`, each projection its own weight (`q_proj_weight`, `k_proj_weight`, `v_proj_weight`, Xavier-uniform
    /// each, as PyTorch), biases 0. f32, sequence-first, no dropout.
    #[track_caller]
    pub fn with_kv_dims(embed_dim: usize, num_heads: usize, kdim: usize, vdim: usize, device: &Device) -> Self {
        let xavier = |width: usize| init::xavier_uniform([embed_dim, width], width, embed_dim, device);
        let out = out_projection(embed_dim, true, device);
        let weights = [xavier(embed_dim), xavier(kdim), xavier(vdim)];
        MultiheadAttention::from_separate_params(num_heads, weights, Some(init::zeros([3 * embed_dim], device)), out)
    }

    /// The layer with a projection weight per input (PyTorch's `q_proj_weight` `[E, E]`, `k_proj_weight`
    /// `[E, kdim]`, `v_proj_weight` `[E, vdim]`), the bias `in_proj_bias` `[3 E]` and `out_proj`.
    #[track_caller]
    pub fn from_separate_params(
        num_heads: usize,
        [q, k, v]: [Tensor; 3],
        in_proj_bias: Option<Tensor>,
        out_proj: Linear,
    ) -> MultiheadAttention {
        let e = q.dims().first().copied().unwrap_or(0);
        let fits = q.dims() == [e, e] && k.rank() == 2 && v.rank() == 2 && k.dims()[0] == e && v.dims()[0] == e;
        if !fits || num_heads == 0 || !e.is_multiple_of(num_heads) {
            fail!(
                "MultiheadAttention",
                "q_proj_weight must be [E, E] with E a multiple of {num_heads}, k_proj_weight [E, kdim] and \
                 v_proj_weight [E, vdim], got {:?}, {:?}, {:?}",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        let weights = [("q_proj_weight", q), ("k_proj_weight", k), ("v_proj_weight", v)].map(|(n, w)| Param::new(n, w));
        MultiheadAttention::assemble(num_heads, e, InProj::Separate(weights), in_proj_bias, out_proj)
    }

    /// The layer from checked projection weights of width `e`: checks the bias and `out_proj`.
    #[track_caller]
    fn assemble(
        num_heads: usize,
        e: usize,
        in_proj: InProj,
        in_proj_bias: Option<Tensor>,
        out_proj: Linear,
    ) -> MultiheadAttention {
        if in_proj_bias.as_ref().is_some_and(|b| b.dims() != [3 * e]) || out_proj.in_features() != e {
            fail!("MultiheadAttention", "in_proj_bias must be [{}] and out_proj {e} -> {e}", 3 * e);
        }
        MultiheadAttention {
            embed_dim: e,
            num_heads,
            batch_first: false,
            dropout: 0.0,
            in_proj,
            in_proj_bias: in_proj_bias.map(|b| Param::new("in_proj_bias", b)),
            out_proj,
            training: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// A copy holding the same values in parameters of its own, in the same mode.
    pub(crate) fn copy(&self) -> MultiheadAttention {
        let out = self.out_proj.copy();
        let bias = self.in_proj_bias.as_ref().map(Param::get);
        let mut m = match &self.in_proj {
            InProj::Packed(w) => MultiheadAttention::from_params(self.num_heads, w.get(), bias, out),
            InProj::Separate(ws) => {
                MultiheadAttention::from_separate_params(self.num_heads, ws.clone().map(|w| w.get()), bias, out)
            }
        };
        m.batch_first = self.batch_first;
        m.dropout = self.dropout;
        m.training
            .store(self.training.load(std::sync::atomic::Ordering::Relaxed), std::sync::atomic::Ordering::Relaxed);
        m
    }

    /// Inputs and outputs `[N, L, E]` instead of `[L, N, E]`.
    pub fn batch_first(mut self, on: bool) -> MultiheadAttention {
        self.batch_first = on;
        self
    }

    /// Dropout on the attention weights, in training mode.
    pub fn dropout(mut self, p: f64) -> MultiheadAttention {
        self.dropout = p;
        self
    }

    /// Attention of `query` over `key` / `value`: the output (`query`'s layout) and, with `need_weights`, the
    /// attention weights.
    #[track_caller]
    pub fn attend(&self, query: &Tensor, key: &Tensor, value: &Tensor, opts: &MhaOptions) -> (Tensor, Option<Tensor>) {
        let (e, h) = (self.embed_dim, self.num_heads);
        let hd = e / h;
        let to_batch_first = |t: &Tensor| if self.batch_first { t.clone() } else { t.transpose(0, 1) };
        let (q, k, v) = (to_batch_first(query), to_batch_first(key), to_batch_first(value));
        let widths = self.in_proj.widths(e);
        for ((name, t), width) in [("query", &q), ("key", &k), ("value", &v)].into_iter().zip(widths) {
            if t.rank() != 3 || t.dims()[2] != width {
                fail!("MultiheadAttention", "{name} must be 3-d with width {width} last, got {:?}", t.dims());
            }
        }
        let (n, l, s) = (q.dims()[0], q.dims()[1], k.dims()[1]);
        let b = self.in_proj_bias.as_ref().map(Param::get);
        let project = |x: &Tensor, i: usize| {
            let y = x.matmul(&self.in_proj.weight(i, e).t());
            let y = match &b {
                Some(b) => y.add(b.narrow(0, i * e, e)),
                None => y,
            };
            // [N, T, E] -> [N, H, T, hd]
            let t = y.dims()[1];
            y.reshape([n, t, h, hd]).transpose(1, 2)
        };
        let (qh, kh, vh) = (project(&q, 0), project(&k, 1), project(&v, 2));
        // One float mask [N, H, L, S] (or broadcastable): -inf where a key is not allowed.
        let mut mask: Option<Tensor> = None;
        let mut add = |m: Tensor| {
            mask = Some(match mask.take() {
                Some(prev) => prev.add(&m),
                None => m,
            })
        };
        if opts.is_causal {
            if opts.attn_mask.is_some() {
                fail!("MultiheadAttention", "give attn_mask or is_causal, not both");
            }
            let keep = Tensor::ones([l, s], DType::F32, &q.device()).tril(0).gt(0);
            add(keep.where_(0.0, f64::NEG_INFINITY));
        }
        if let Some(m) = &opts.attn_mask {
            let m = match m.dtype() {
                DType::Bool => m.where_(f64::NEG_INFINITY, 0.0),
                d if d.is_float() => m.to_dtype(qh.dtype()),
                d => fail!("MultiheadAttention", "attn_mask must be bool or float, not {d}"),
            };
            add(if m.rank() == 3 { m.reshape([n, h, l, s]) } else { m });
        }
        if let Some(p) = &opts.key_padding_mask {
            if p.dims() != [n, s] || p.dtype() != DType::Bool {
                fail!(
                    "MultiheadAttention",
                    "key_padding_mask must be bool [{n}, {s}], got {}{:?}",
                    p.dtype(),
                    p.dims()
                );
            }
            add(p.where_(f64::NEG_INFINITY, 0.0).reshape([n, 1, 1, s]));
        }
        let training = self.training.load(std::sync::atomic::Ordering::Relaxed);
        let p = if training { self.dropout } else { 0.0 };
        let (out, weights) = if opts.need_weights {
            let logits = qh.matmul(&kh.transpose(-2, -1)).mul(1.0 / (hd as f64).sqrt());
            let logits = match &mask {
                Some(m) => logits.add(m),
                None => logits,
            };
            let weights = logits.softmax(-1);
            let dropped = functional::dropout(&weights, p, p > 0.0);
            let w = if opts.average_attn_weights { weights.mean([1], false) } else { weights };
            (dropped.matmul(&vh), Some(w))
        } else {
            let o = AttentionOptions { mask: mask.clone(), dropout_p: p, ..Default::default() };
            (functional::scaled_dot_product_attention(&qh, &kh, &vh, &o), None)
        };
        // [N, H, L, hd] -> [N, L, E] -> out_proj, back to the input layout.
        let out = self.out_proj.forward(&out.transpose(1, 2).reshape([n, l, e]));
        (if self.batch_first { out } else { out.transpose(0, 1) }, weights)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention of `x` with no masks (`attend(x, x, x)`'s output).
    fn forward(&self, x: &Tensor) -> Tensor {
        self.attend(x, x, x, &MhaOptions { need_weights: false, ..Default::default() }).0
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut p = match &self.in_proj {
            InProj::Packed(w) => vec![("in_proj_weight".to_string(), w.clone())],
            InProj::Separate(ws) => ws.iter().map(|w| (w.name().to_string(), w.clone())).collect(),
        };
        if let Some(b) = &self.in_proj_bias {
            p.push(("in_proj_bias".to_string(), b.clone()));
        }
        p.extend(self.out_proj.named_params_prefixed("out_proj"));
        p
    }

    fn train(&self, mode: bool) {
        self.training.store(mode, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Rotary position embedding over the last dim (`dim`, even) of `[.., T, dim]` inputs, the "rotate half" form:
/// `x cos(θ) + rotate_half(x) sin(θ)` with `θ[t, i] = (t + offset) base^(-2i / dim)` for the first half of the dim
/// and the same angles again for the second, `rotate_half(x) = [-x₂, x₁]` (GPT-NeoX, Llama). Angles in f32, as
/// those implementations compute them.
#[derive(Clone, Copy, Debug)]
pub struct RotaryEmbedding {
    pub dim: usize,
    pub base: f64,
}

impl RotaryEmbedding {
    /// Base 10000.
    #[track_caller]
    pub fn new(dim: usize) -> RotaryEmbedding {
        if dim == 0 || !dim.is_multiple_of(2) {
            fail!("RotaryEmbedding", "dim must be even and positive, got {dim}");
        }
        RotaryEmbedding { dim, base: 10000.0 }
    }

    /// `(cos, sin)` of the angles of positions `offset..offset + len`, `[len, dim]` f32.
    pub fn cos_sin(&self, len: usize, offset: usize, device: &Device) -> (Tensor, Tensor) {
        let half = self.dim / 2;
        let inv: Vec<f32> =
            (0..half).map(|i| 1.0 / (self.base as f32).powf(2.0 * i as f32 / self.dim as f32)).collect();
        let inv = Tensor::from_vec(inv, [1, half], device).unwrap_or_else(|e| fail!("RotaryEmbedding", "{e}"));
        let t =
            Tensor::iota(Scalar::Float(offset as f64), Scalar::Float(1.0), len, DType::F32, device).reshape([len, 1]);
        let angles = t.mul(&inv);
        let angles = Tensor::cat(&[&angles, &angles], 1);
        (angles.cos(), angles.sin())
    }

    /// `x` (`[.., T, dim]`) rotated for positions `offset..offset + T`.
    #[track_caller]
    pub fn apply(&self, x: &Tensor, offset: usize) -> Tensor {
        let r = x.rank();
        if r < 2 || x.dims()[r - 1] != self.dim {
            fail!("RotaryEmbedding", "expects [.., T, {}], got {:?}", self.dim, x.dims());
        }
        let (cos, sin) = self.cos_sin(x.dims()[r - 2], offset, &x.device());
        apply_rotary(x, &cos, &sin)
    }
}

/// `x cos + rotate_half(x) sin` (`cos`, `sin` broadcast to `x`, last dim even): the rotation of
/// [`RotaryEmbedding`] with given angles.
#[track_caller]
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let d = x.dims().last().copied().unwrap_or(0);
    let half = d / 2;
    let (x1, x2) = (x.narrow(-1, 0, half), x.narrow(-1, half, half));
    let rotated = Tensor::cat(&[&x2.neg(), &x1], -1);
    let (cos, sin) = (cos.to_dtype(x.dtype()), sin.to_dtype(x.dtype()));
    x.mul(&cos).add(rotated.mul(&sin))
}
