//! `cross_entropy` with PyTorch's options: `ignore_index`, class `weight`s and `label_smoothing`, each with
//! PyTorch's formula (`torch.nn.functional.cross_entropy`; values it printed are checked in `tests/nn/losses.rs`).
//!
//! `nll_loss` is the same loss on log-probabilities already computed.
//!
//! The target's log-probability is picked with a one-hot mask (`arange(C) == target`) and `where`, not a multiply
//! (`0 * -inf` would be NaN where a log-probability underflows) nor a gather: the mask is a comparison along the
//! row, so the pick joins the log_softmax's row kernel (`kernel::rows`), one pass over the row. A class index that
//! is neither in `0..C` nor the ignored index gives that sample a NaN loss (so a sum or mean over it is NaN), where
//! PyTorch raises an error: checking the values would need them on the host, and the graph is lazy. Before this,
//! such a sample silently added 0.
//!
//! What the checks cost: they are graph nodes recorded every step. `train_digits` (32 x 10 logits a step, 58 µs):
//! +1.7 µs for the range check, +2.3 µs more for `ignore_index` (the mean then divides by a count of the kept
//! samples, one more reduction); `ignore_index: None` skips the latter.

use super::Reduction;
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::{DType, Scalar};

/// The options of [`cross_entropy_with`], PyTorch's keyword arguments; `Default` is PyTorch's defaults.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    pub reduction: Reduction,
    /// Class-index targets equal to this add 0 and are left out of the mean (`ignore_index`; -100 by default, as
    /// in PyTorch, where padding tokens are marked so). `None`: every target counts. Not used with probability
    /// targets.
    pub ignore_index: Option<i64>,
    /// A weight per class, `[C]` in the input's dtype: a sample's loss is scaled by its target class's weight and
    /// the mean divides by the sum of those weights (with probability targets: `-Σ_c weight_c p_c log q_c`, and
    /// the mean divides by the sample count).
    pub weight: Option<Tensor>,
    /// In `[0, 1]`: the target is mixed with the uniform distribution over the classes, `(1 - ε) target + ε / C`.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { reduction: Reduction::Mean, ignore_index: Some(-100), weight: None, label_smoothing: 0.0 }
    }
}

/// Cross-entropy between `input` logits and `target` (`torch.nn.functional.cross_entropy`) with PyTorch's default
/// options and `reduction`: see [`cross_entropy_with`].
#[track_caller]
pub fn cross_entropy(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    cross_entropy_with(input, target, &CrossEntropyOptions { reduction, ..Default::default() })
}

/// Cross-entropy between `input` logits and `target` (`torch.nn.functional.cross_entropy`).
///
/// `input` is `[C]`, `[N, C]` or `[N, C, d1, ..]` (classes on dim 1, or dim 0 unbatched). `target` is either
/// class indices (an integer tensor shaped like `input` without the class dim) or class probabilities (a float
/// tensor shaped like `input`). The loss per sample is `-log_softmax(input)[target]` (resp.
/// `-Σ_c target_c log_softmax(input)_c`), with the options applied as PyTorch applies them, then reduced.
#[track_caller]
pub fn cross_entropy_with(input: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Tensor {
    class_loss("cross_entropy", input, target, opts, true)
}

/// The negative log-likelihood of class-index `target` under log-probabilities `input` (`nll_loss`) with PyTorch's
/// defaults and `reduction`: see [`nll_loss_with`].
#[track_caller]
pub fn nll_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    nll_loss_with(input, target, &CrossEntropyOptions { reduction, ..Default::default() })
}

/// `-input[target]` per sample (`torch.nn.functional.nll_loss`): [`cross_entropy_with`] on log-probabilities
/// already computed (`cross_entropy(x) = nll_loss(log_softmax(x))`), with its `weight`, `ignore_index` and
/// `reduction`. Class-index targets only, and no `label_smoothing` (PyTorch's `nll_loss` has neither).
#[track_caller]
pub fn nll_loss_with(input: &Tensor, target: &Tensor, opts: &CrossEntropyOptions) -> Tensor {
    if opts.label_smoothing != 0.0 {
        fail!("nll_loss", "has no label_smoothing (cross_entropy has), got {}", opts.label_smoothing);
    }
    if target.dtype().is_float() {
        fail!("nll_loss", "takes class indices (an integer tensor), not {} probabilities", target.dtype());
    }
    class_loss("nll_loss", input, target, opts, false)
}

/// `cross_entropy_with` (`log_softmax`: the input is logits) or `nll_loss_with` (log-probabilities), `name` in
/// their errors.
#[track_caller]
fn class_loss(name: &str, input: &Tensor, target: &Tensor, opts: &CrossEntropyOptions, log_softmax: bool) -> Tensor {
    super::float_only(name, input);
    if input.rank() == 0 {
        fail!(name, "the input needs a class dim, got a zero-dim tensor");
    }
    let eps = opts.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        fail!(name, "label_smoothing must be in [0, 1], got {eps}");
    }
    let c = if input.rank() == 1 { 0 } else { 1 };
    let classes = input.dims()[c];
    // The class weights shaped to broadcast along the class dim.
    let weight = opts.weight.as_ref().map(|w| {
        if w.dims() != [classes] || w.dtype() != input.dtype() {
            fail!(
                name,
                "weight must be a [{classes}] {} tensor (one per class), got {:?} {}",
                input.dtype(),
                w.dims(),
                w.dtype()
            );
        }
        let mut shape = vec![1usize; input.rank()];
        shape[c] = classes;
        w.reshape(shape)
    });
    let logp = if log_softmax { input.log_softmax(c as isize) } else { input.clone() };
    // `x` times the class weights, where given.
    let weighted = |x: Tensor| match &weight {
        Some(w) => x.mul(w),
        None => x,
    };
    if target.dtype().is_float() {
        if target.dims() != input.dims() {
            fail!(name, "probability targets must have the input's shape {:?}, got {:?}", input.dims(), target.dims());
        }
        let p = if eps > 0.0 { target.mul(1.0 - eps).add(eps / classes as f64) } else { target.clone() };
        let per_sample = weighted(logp.mul(&p)).sum(c, false).neg();
        return opts.reduction.apply(per_sample);
    }
    let mut expected = input.dims().to_vec();
    expected.remove(c);
    if target.dims() != expected.as_slice() {
        fail!(
            name,
            "class-index targets must have shape {:?} (the input {:?} without its class dim {c}), got {:?}",
            expected,
            input.dims(),
            target.dims()
        );
    }
    let idx = target.device().index_dtype();
    let t = target.to_dtype(idx);
    let ignored = opts.ignore_index.map(|i| t.eq(Tensor::scalar(Scalar::Int(i), idx, &t.device())));
    // Each sample's target class; none for an ignored sample (PyTorch's default, -100, is outside the classes: only
    // an ignored index that is a class needs masking out). Compared in i32 (a class count fits): the 64-bit compare
    // ran 2 lanes to a 128-bit vector, and this pass took as long as the whole log_softmax (2 ms at 4096 x 1024). A
    // target past i32 wraps and may match a class, but the run fails anyway (the range check below reads the
    // target's own value).
    let narrow = if classes <= i32::MAX as usize { target.to_dtype(DType::I32) } else { target.clone() };
    let mut mask = super::one_hot_mask(name, &narrow, classes, c as isize);
    if let (Some(ig), Some(i)) = (&ignored, opts.ignore_index)
        && (0..classes as i64).contains(&i)
    {
        mask = mask.logical_and(ig.unsqueeze(c as isize).logical_not());
    }
    // -w_t log q_t (w = 1 without weights), 0 for an ignored sample.
    let wlogp = weighted(logp);
    let nll = mask.where_(&wlogp, 0.0).sum(c, false).neg();
    let loss = if eps > 0.0 {
        let smooth = wlogp.sum(c, false).neg();
        let smooth = match &ignored {
            Some(ig) => ig.where_(0.0, &smooth),
            None => smooth,
        };
        nll.mul(1.0 - eps).add(smooth.mul(eps / classes as f64))
    } else {
        nll
    };
    let loss = loss.add(super::checked_indices(&t, classes, ignored.as_ref(), loss.dtype()));
    if opts.reduction != Reduction::Mean {
        return opts.reduction.apply(loss);
    }
    // The mean divides by the counted samples' target weights (their number without weights).
    let counted = match (&weight, &ignored) {
        (Some(w), _) => mask.where_(w, 0.0).sum(c, false),
        (None, Some(ig)) => ig.logical_not().to_dtype(input.dtype()),
        (None, None) => return loss.mean_all(),
    };
    loss.sum_all().div(counted.sum_all())
}
