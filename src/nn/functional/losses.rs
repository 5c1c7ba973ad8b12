//! Regression, binary and distribution losses (`torch.nn.functional`): `l1_loss`, `smooth_l1_loss`, `huber_loss`,
//! `binary_cross_entropy_with_logits` and `kl_div`, each PyTorch's formula composed from kiln's ops (so autograd
//! differentiates them and the fuser makes the per-element loss and its reduction one kernel). Values PyTorch
//! printed are checked in `tests/nn/losses.rs` (`tests/fixtures/losses.py`). `mse_loss` and the class losses
//! (`cross_entropy`, `nll_loss`) live beside.
//!
//! Deliberately not done: `binary_cross_entropy` on probabilities. PyTorch raises where an input lies outside
//! `[0, 1]`; a lazy graph cannot check values when it is built, and a silent NaN would be the wrong answer. Its
//! `_with_logits` form has no such domain, is the stabler of the two, and is what PyTorch recommends.

use super::{Reduction, float_only};
use crate::args::fail;
use crate::tensor::Tensor;

/// Refuses a target whose shape differs from the input's (PyTorch's losses broadcast with a warning; kiln does not).
#[track_caller]
fn same_shape(name: &str, input: &Tensor, target: &Tensor) {
    float_only(name, input);
    if input.dims() != target.dims() {
        fail!(name, "the target's shape {:?} is not the input's {:?}", target.dims(), input.dims());
    }
}

/// `|input - target|`, reduced (`l1_loss`).
#[track_caller]
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    same_shape("l1_loss", input, target);
    reduction.apply(input.sub(target).abs())
}

/// With `z = |input - target|`: `0.5 z² / beta` where `z < beta`, else `z - 0.5 beta`, reduced (`smooth_l1_loss`;
/// PyTorch's default `beta` is 1; `beta = 0` is `l1_loss`).
#[track_caller]
pub fn smooth_l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction, beta: f64) -> Tensor {
    same_shape("smooth_l1_loss", input, target);
    if beta.is_nan() || beta < 0.0 {
        fail!("smooth_l1_loss", "beta must be >= 0, got {beta}");
    }
    if beta == 0.0 {
        return l1_loss(input, target, reduction);
    }
    let z = input.sub(target).abs();
    reduction.apply(z.lt(beta).where_(z.square().mul(0.5 / beta), z.sub(0.5 * beta)))
}

/// With `z = |input - target|`: `0.5 z²` where `z < delta`, else `delta (z - 0.5 delta)`, reduced (`huber_loss`;
/// PyTorch's default `delta` is 1).
#[track_caller]
pub fn huber_loss(input: &Tensor, target: &Tensor, reduction: Reduction, delta: f64) -> Tensor {
    same_shape("huber_loss", input, target);
    if delta.is_nan() || delta <= 0.0 {
        fail!("huber_loss", "delta must be > 0, got {delta}");
    }
    let z = input.sub(target).abs();
    reduction.apply(z.lt(delta).where_(z.square().mul(0.5), z.sub(0.5 * delta).mul(delta)))
}

/// The options of [`binary_cross_entropy_with_logits_with`], PyTorch's keyword arguments.
#[derive(Clone, Debug, Default)]
pub struct BceWithLogitsOptions {
    pub reduction: Reduction,
    /// A weight per element, broadcast to the input.
    pub weight: Option<Tensor>,
    /// A weight on the positive term per class, broadcast along the input's last dim (`pos_weight`).
    pub pos_weight: Option<Tensor>,
}

/// Binary cross-entropy of logits `input` against probabilities `target` (`binary_cross_entropy_with_logits`) with
/// PyTorch's defaults and `reduction`: see [`binary_cross_entropy_with_logits_with`].
#[track_caller]
pub fn binary_cross_entropy_with_logits(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    binary_cross_entropy_with_logits_with(input, target, &BceWithLogitsOptions { reduction, ..Default::default() })
}

/// `-weight (pos_weight · target · log σ(x) + (1 - target) log(1 - σ(x)))` per element, reduced, in the stable
/// form `(1 - target) x - (1 + (pos_weight - 1) target) log σ(x)` with `log σ(x) = min(x, 0) - log1p(exp(-|x|))`:
/// finite for every finite logit.
#[track_caller]
pub fn binary_cross_entropy_with_logits_with(input: &Tensor, target: &Tensor, opts: &BceWithLogitsOptions) -> Tensor {
    same_shape("binary_cross_entropy_with_logits", input, target);
    let log_sigmoid = super::logsigmoid(input);
    let positive = match &opts.pos_weight {
        Some(pw) => log_sigmoid.mul(pw.sub(1.0).mul(target).add(1.0)),
        None => log_sigmoid,
    };
    let loss = target.neg().add(1.0).mul(input).sub(positive);
    let loss = match &opts.weight {
        Some(w) => loss.mul(w),
        None => loss,
    };
    opts.reduction.apply(loss)
}

/// How [`kl_div`] reduces (PyTorch's `reduction`, which has one value more for this loss than the others).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KlReduction {
    None,
    /// The mean over every element (`'mean'`, PyTorch's default, which it warns is not the KL divergence).
    #[default]
    Mean,
    Sum,
    /// The sum divided by the batch size (dim 0): the KL divergence per sample (`'batchmean'`).
    BatchMean,
}

/// The Kullback-Leibler divergence of the distribution `target` from log-probabilities `input` (`kl_div`): per
/// element `target (log target - input)`, 0 where `target` is 0 (PyTorch's `xlogy`), or with `log_target`
/// (`target` given as log-probabilities) `exp(target) (target - input)`; then reduced.
#[track_caller]
pub fn kl_div(input: &Tensor, target: &Tensor, reduction: KlReduction, log_target: bool) -> Tensor {
    same_shape("kl_div", input, target);
    let per_element = if log_target {
        target.exp().mul(target.sub(input))
    } else {
        // xlogy(t, t): 0 where t is 0 (a select, so no 0 * -inf), t log t elsewhere.
        let t_log_t = target.eq(0.0).where_(0.0, target.mul(target.log())).to_dtype(target.dtype());
        t_log_t.sub(target.mul(input))
    };
    match reduction {
        KlReduction::None => per_element,
        KlReduction::Mean => per_element.mean_all(),
        KlReduction::Sum => per_element.sum_all(),
        KlReduction::BatchMean if input.rank() == 0 => per_element.sum_all(),
        KlReduction::BatchMean => per_element.sum_all().div(input.dims()[0] as f64),
    }
}
