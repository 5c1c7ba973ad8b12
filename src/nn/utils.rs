//! Gradient clipping (`torch.nn.utils.clip_grad_norm_` and `clip_grad_value_`), on the lazy gradients `backward`
//! returned, before they go to `Optimizer::step`.
//!
//! Clipping is a few more lazy nodes: the norm, the scale factor and the scaled gradients join the step's graph, so
//! forward, backward, clipping and update still compile into one plan, and nothing waits for the norm on the host
//! (PyTorch's `error_if_nonfinite` would need exactly that wait, so it is not offered: pass the returned norm to
//! `also_realize` and look at it after the step).
//!
//! The arithmetic is PyTorch's (`_clip_grads_with_norm_`): the 2-norm of each gradient, the 2-norm of those norms,
//! `coef = max_norm / (total + 1e-6)` clamped to at most 1, every gradient times `coef`. So a gradient whose norm is
//! already below `max_norm` is multiplied by exactly 1 and unchanged. One difference: the norms of f16 gradients are
//! computed in f32 (PyTorch keeps f16, where the sum of squares overflows past a norm of 256).
//!
//! The parameters are passed, not taken from the `Gradients`, because their order fixes the order of the sum: a
//! `Gradients` has no order, and a sum in another order is another graph (and another plan) every step.

use crate::args::fail;
use crate::autograd::{Gradients, no_grad};
use crate::nn::Param;
use crate::tensor::Tensor;
use kiln_jit::DType;

/// Scales the gradients of `params` in `grads` so that their total 2-norm is at most `max_norm`; returns that total
/// norm before scaling, a lazy 0-dim tensor (f32, or f64 when a gradient is f64; 0 when no parameter has a
/// gradient). Parameters without a gradient are skipped, gradients of other parameters are left alone.
#[track_caller]
pub fn clip_grad_norm(grads: &mut Gradients, params: &[Param], max_norm: f64) -> Tensor {
    if max_norm.is_nan() || max_norm < 0.0 {
        fail!("clip_grad_norm", "max_norm must be >= 0 (got {max_norm})");
    }
    let leaves = with_gradients(grads, params);
    no_grad(|| {
        let norms: Vec<Tensor> = leaves
            .iter()
            .filter_map(|p| grads.get(p))
            .map(|g| {
                let g = if g.dtype().is_half() { g.to_dtype(DType::F32) } else { g.clone() };
                g.square().sum_all().sqrt()
            })
            .collect();
        if norms.is_empty() {
            let dev = match params.first() {
                Some(p) => p.get().device(),
                None => device_without_params(),
            };
            return Tensor::scalar(0.0, DType::F32, &dev);
        }
        let refs: Vec<&Tensor> = norms.iter().collect();
        let total = Tensor::stack(&refs, 0).square().sum_all().sqrt();
        let denom = total.add(1e-6);
        let coef = Tensor::scalar(max_norm, denom.dtype(), &denom.device()).div(&denom).clamp_max(1.0);
        for p in &leaves {
            grads.update(p, |g| g.mul(&coef));
        }
        total
    })
}

/// The device of the norm of no parameters at all (PyTorch's is a CPU 0): the CPU where the build has it, else the
/// wgpu device.
#[cfg(feature = "cpu")]
fn device_without_params() -> crate::Device {
    crate::Device::cpu()
}

/// The device of the norm of no parameters at all: in a build without the CPU, the wgpu device; without an adapter
/// there is no device to hold it, which is refused as a misuse (with no parameters there is nothing to clip).
#[cfg(not(feature = "cpu"))]
#[track_caller]
fn device_without_params() -> crate::Device {
    match crate::Device::wgpu() {
        Ok(d) => d,
        Err(e) => fail!("clip_grad_norm", "no parameters given, and no device for their norm of 0: {e}"),
    }
}

/// Clamps every gradient of `params` in `grads` to `[-clip_value, clip_value]` (`clip_grad_value_`).
#[track_caller]
pub fn clip_grad_value(grads: &mut Gradients, params: &[Param], clip_value: f64) {
    if clip_value.is_nan() || clip_value < 0.0 {
        fail!("clip_grad_value", "clip_value must be >= 0 (got {clip_value})");
    }
    let leaves = with_gradients(grads, params);
    no_grad(|| {
        for p in &leaves {
            grads.update(p, |g| g.clamp(-clip_value, clip_value));
        }
    })
}

/// The values of `params` that have a gradient in `grads`, in order, each once: a parameter listed twice (a tied
/// weight) counts once, as in PyTorch's `parameters()`. Runs every step, so duplicates are found by hashing.
fn with_gradients(grads: &Gradients, params: &[Param]) -> Vec<Tensor> {
    let mut seen = rustc_hash::FxHashSet::default();
    params.iter().map(Param::get).filter(|p| grads.get(p).is_some() && seen.insert(p.node_ptr())).collect()
}
