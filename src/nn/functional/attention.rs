//! `scaled_dot_product_attention` (`torch.nn.functional.scaled_dot_product_attention`), as PyTorch's math
//! reference computes it: `softmax(q kᵀ * scale + bias) v`, where the bias is 0 where a position takes part and
//! -inf where a causal or boolean mask leaves it out, or a float mask itself. A composition: the GEMMs are the tuned
//! ones, the scale and bias join the first product's epilogue where the schedule allows, and the softmax is a row
//! kernel. Causal attention over more than [`MIN_CAUSAL_BLOCK`] queries and keys runs up to [`CAUSAL_BLOCKS`]
//! blocks of queries, each against only the keys it can see, so the products and the softmax skip most of what the
//! mask would zero, forward and backward. Not done: a fused flash-attention kernel that never stores the `L x S`
//! weights.
//!
//! A query whose every key a mask leaves out attends to nothing: its output and its gradients are 0, as in PyTorch
//! (2.5 on, every backend: its `_safe_softmax`), where a plain `softmax` of a row of `-inf` is NaN. Only a mask can
//! leave a row empty (a causal query always sees key 0), so the plain softmax serves the other paths.

use super::{dropout, float_only};
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::DType;

/// PyTorch's keyword arguments of `scaled_dot_product_attention`. `Default`: no mask, no dropout, not causal,
/// `scale` 1 / sqrt(E).
#[derive(Clone, Debug, Default)]
pub struct AttentionOptions {
    /// Broadcast to `[.., L, S]`: bool (true where a query may attend to a key) or a float added to the logits.
    pub mask: Option<Tensor>,
    /// The probability of zeroing an attention weight (with the rest scaled by `1 / (1 - p)`), in training.
    pub dropout_p: f64,
    /// Query `i` attends to keys `0..=i` only (the lower triangle of an `L x S` matrix, top-left aligned, as
    /// PyTorch's `is_causal`); not with `mask`.
    pub is_causal: bool,
    /// Multiplies the logits; `None` is `1 / sqrt(E)`.
    pub scale: Option<f64>,
    /// Grouped-query attention: `key` and `value` have fewer heads (dim -3) than `query`, each serving the
    /// `Hq / Hkv` query heads that follow it (PyTorch's `enable_gqa`, its `repeat_interleave` along dim -3, done here
    /// as a broadcast view: no copy of the keys).
    pub enable_gqa: bool,
}

/// Attention of `query` `[.., L, E]` over `key` `[.., S, E]` and `value` `[.., S, Ev]` (leading dims broadcast):
/// `[.., L, Ev]`. See the module doc and [`AttentionOptions`].
#[track_caller]
pub fn scaled_dot_product_attention(query: &Tensor, key: &Tensor, value: &Tensor, opts: &AttentionOptions) -> Tensor {
    for (name, t) in [("query", query), ("key", key), ("value", value)] {
        float_only("scaled_dot_product_attention", t);
        if t.rank() < 2 {
            fail!("scaled_dot_product_attention", "{name} needs at least 2 dims ([.., L or S, E]), got {:?}", t.dims());
        }
    }
    let (key, value) = if opts.enable_gqa {
        (grouped_heads(key, query, "key"), grouped_heads(value, query, "value"))
    } else {
        (key.clone(), value.clone())
    };
    let (key, value) = (&key, &value);
    let (l, e) = (query.dims()[query.rank() - 2], query.dims()[query.rank() - 1]);
    let s = key.dims()[key.rank() - 2];
    if key.dims()[key.rank() - 1] != e {
        fail!("scaled_dot_product_attention", "key's last dim {} is not the query's {e}", key.dims()[key.rank() - 1]);
    }
    if value.dims()[value.rank() - 2] != s {
        fail!("scaled_dot_product_attention", "value has {} positions, key {s}", value.dims()[value.rank() - 2]);
    }
    if opts.is_causal && opts.mask.is_some() {
        fail!("scaled_dot_product_attention", "give a mask or is_causal, not both (as PyTorch)");
    }
    let scale = opts.scale.unwrap_or(1.0 / (e as f64).sqrt());
    let block = causal_block(l);
    if opts.is_causal && l > block && s > block {
        return causal_blocks(query, key, value, scale, opts.dropout_p, block);
    }
    let logits = query.matmul(&key.transpose(-2, -1)).mul(scale);
    let bias = if opts.is_causal {
        let keep = Tensor::ones([l, s], DType::F32, &query.device()).tril(0).gt(0);
        Some(keep.where_(0.0, f64::NEG_INFINITY))
    } else {
        match &opts.mask {
            Some(m) if m.dtype() == DType::Bool => Some(m.where_(0.0, f64::NEG_INFINITY)),
            Some(m) if m.dtype().is_float() => Some(m.clone()),
            Some(m) => fail!("scaled_dot_product_attention", "the mask must be bool or float, not {}", m.dtype()),
            None => None,
        }
    };
    let logits = match bias {
        Some(b) => logits.add(b.to_dtype(logits.dtype())),
        None => logits,
    };
    let weights = if opts.mask.is_some() { logits.safe_softmax(-1) } else { logits.softmax(-1) };
    let weights = dropout(&weights, opts.dropout_p, opts.dropout_p > 0.0);
    weights.matmul(value)
}

/// Most blocks a causal attention is cut into ([`causal_blocks`]). More blocks skip more of the masked triangle,
/// but each block's key and value gradients are summed into the full ones, one padded piece per block: past 4
/// pieces live at once that sum is no longer a kernel the CPU's generated code runs (it takes 6 operands), and the
/// 4-lane kernel left costs more than the skipped products save. In the GPT example's step 4 blocks beat 2 and 8
/// at every context from 256 to 2048 (`docs/benchmarks.md`, longer contexts).
const CAUSAL_BLOCKS: usize = 4;

/// Fewest queries in a block of a blocked causal attention: 2 blocks of 32 still pay at context 64, 4 of 16 cost
/// more launches than they save.
const MIN_CAUSAL_BLOCK: usize = 32;

/// The block of a causal attention over `l` queries: a quarter of them, at least [`MIN_CAUSAL_BLOCK`], a multiple of
/// 16 (whole vectors of the products' rows).
fn causal_block(l: usize) -> usize {
    MIN_CAUSAL_BLOCK.max(l.div_ceil(CAUSAL_BLOCKS).next_multiple_of(16))
}

/// Causal attention (top-left aligned, as PyTorch's `is_causal`) by blocks of `block` queries: queries `a..b`
/// attend to keys `0..min(b, S)` only, with the causal bias on that block's own triangle, and the blocks' outputs
/// are concatenated. Each row's softmax is over the same keys as the full masked product's (the ones left out have
/// weight exactly 0 there), so the values agree with it up to summation order. The block that reaches the last key
/// runs to the last query (every later query sees every key).
fn causal_blocks(query: &Tensor, key: &Tensor, value: &Tensor, scale: f64, dropout_p: f64, block: usize) -> Tensor {
    let (l, s) = (query.dims()[query.rank() - 2], key.dims()[key.rank() - 2]);
    let mut outs = Vec::new();
    let mut a = 0;
    while a < l {
        let b = if a + block >= s { l } else { (a + block).min(l) };
        let keys = b.min(s);
        let q = query.narrow(-2, a, b - a);
        let (k, v) = (key.narrow(-2, 0, keys), value.narrow(-2, 0, keys));
        let mut logits = q.matmul(&k.transpose(-2, -1)).mul(scale);
        // Query a + r sees keys 0..=a + r: masked only where the block reaches past its first query's key.
        if keys > a + 1 {
            let keep = Tensor::ones([b - a, keys], DType::F32, &query.device()).tril(a as i64).gt(0);
            logits = logits.add(keep.where_(0.0, f64::NEG_INFINITY).to_dtype(logits.dtype()));
        }
        let weights = dropout(&logits.softmax(-1), dropout_p, dropout_p > 0.0);
        outs.push(weights.matmul(&v));
        a = b;
    }
    let outs: Vec<&Tensor> = outs.iter().collect();
    Tensor::cat(&outs, -2)
}

/// `t` (`[.., Hkv, S, E]`) with each head repeated for the `Hq / Hkv` query heads of its group: `[.., Hq, S, E]`, head
/// `i` being `t`'s head `i / (Hq / Hkv)` (`repeat_interleave` along dim -3), as a broadcast view.
#[track_caller]
fn grouped_heads(t: &Tensor, query: &Tensor, name: &str) -> Tensor {
    if t.rank() < 3 || query.rank() < 3 {
        fail!(
            "scaled_dot_product_attention",
            "enable_gqa needs heads at dim -3 of query and {name}, got {:?} and {:?}",
            query.dims(),
            t.dims()
        );
    }
    let (hq, h) = (query.dims()[query.rank() - 3], t.dims()[t.rank() - 3]);
    if h == 0 || hq % h != 0 {
        fail!("scaled_dot_product_attention", "enable_gqa: {name}'s {h} heads do not divide the query's {hq} heads");
    }
    if h == hq {
        return t.clone();
    }
    let r = t.rank();
    let mut grouped = t.dims().to_vec();
    grouped.insert(r - 2, hq / h);
    let mut merged = t.dims().to_vec();
    merged[r - 3] = hq;
    t.unsqueeze(r as isize - 2).expand(grouped).reshape(merged)
}
