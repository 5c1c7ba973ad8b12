//! Gradient accumulation: the gradients of several micro-batches summed, for one optimizer step over a batch that
//! does not fit in memory at once.
//!
//! ```
//! use kiln::nn::{Linear, Module};
//! use kiln::optim::{GradAccumulator, Optimizer, Sgd};
//! # fn main() -> kiln::Result<()> {
//! # kiln::tune::set_cache_dir(None).ok(); // doc tests keep off the user's cache
//! # #[cfg(feature = "cpu")] {
//! let dev = kiln::Device::cpu();
//! let model = Linear::new(4, 1, true, &dev);
//! let mut opt = Sgd::new(model.params(), 0.01);
//! let mut acc = GradAccumulator::new(model.params());
//! for micro in 0..4 {
//!     let x = kiln::Tensor::full([8, 4], micro as f64, kiln::DType::F32, &dev);
//!     let loss = model.forward(&x).square().sum_all();
//!     acc.add(loss.backward()?, &[&loss])?; // realizes this micro-batch's forward, backward and the running sum
//! }
//! opt.step(acc.take(), &[])?;
//! # }
//! # Ok(())
//! # }
//! ```
//!
//! Each `add` realizes the running sums (in the parameters' order, so every micro-step builds the same graph and
//! replays one plan; the new sums are written over the old ones where nothing else holds them) and frees the
//! micro-batch's graph: memory holds one micro-batch's activations and one gradient per parameter, never the whole
//! batch. Summing is what `backward` into PyTorch's `.grad` does across micro-batches;
//! for the mean over the whole batch, scale the loss (`loss / micro_batches`), as there.

use crate::autograd::{Gradients, no_grad};
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

/// Sums the gradients of the listed parameters over several `backward` calls.
pub struct GradAccumulator {
    params: Vec<Param>,
    /// The running sum per parameter (realized), `None` until a micro-batch gave that parameter a gradient.
    sums: Vec<Option<Tensor>>,
}

impl GradAccumulator {
    /// An accumulator for `params` (repeated handles to one parameter count once).
    pub fn new(params: Vec<Param>) -> GradAccumulator {
        let params = super::dedup(params);
        let sums = vec![None; params.len()];
        GradAccumulator { params, sums }
    }

    /// Adds one micro-batch's gradients and realizes the sums, together with `also_realize` (its loss, say).
    /// Gradients of parameters not listed are dropped. A parameter must not change between `add`s (step after
    /// `take`): its gradient would belong to another value.
    pub fn add(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()> {
        let next: Vec<Option<Tensor>> = no_grad(|| {
            self.params
                .iter()
                .zip(&self.sums)
                .map(|(p, sum)| match (grads.get(&p.get()), sum) {
                    (Some(g), Some(s)) => Some(s.add(g)),
                    (Some(g), None) => Some(g.clone()),
                    (None, s) => s.clone(),
                })
                .collect()
        });
        drop(grads);
        let mut targets: Vec<&Tensor> = next.iter().flatten().collect();
        targets.extend_from_slice(also_realize);
        // The old sums are held here alone and replaced below: the new ones may be written over them (donation).
        let replaced: Vec<_> = self.sums.iter().flatten().map(Tensor::node_ptr).collect();
        crate::realize::realize_replacing(&targets, &replaced)?;
        self.sums = next;
        Ok(())
    }

    /// The summed gradients, for `Optimizer::step`; the accumulator starts over.
    pub fn take(&mut self) -> Gradients {
        let mut out = Gradients::default();
        for (p, sum) in self.params.iter().zip(&mut self.sums) {
            if let Some(s) = sum.take() {
                out.insert(p.get(), s);
            }
        }
        out
    }
}
