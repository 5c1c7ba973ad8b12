//! f32 master weights for half-precision parameters (mixed-precision training, `.master_weights(true)` on `Sgd`,
//! `Adam` and `AdamW`).
//!
//! Why: a bf16 parameter has 8 significant bits, so an update smaller than half its spacing (`lr * g` below
//! `|θ| / 256`) rounds away, and a long run of small steps changes nothing; f16 loses the same way at 11 bits. With
//! master weights the optimizer keeps each f16 or bf16 parameter's value in f32, applies the update there (its
//! state, momentum or moments, is f32 too), and sets the parameter to the master rounded to its dtype once per step,
//! in the same graph: the model computes in half precision, the weights accumulate in f32.
//!
//! A master is made from its parameter's value when the parameter first steps (realized on its own, so the first
//! step's graph is already the steady one). It is part of the optimizer's state (`master_param` in a state dict),
//! so training resumed from a checkpoint continues from the f32 values, not from the rounded parameters. A parameter
//! changed from outside after its first step (a `load_module`) is not seen by its master: load the optimizer state
//! saved with it, or build a new optimizer. Parameters of other dtypes are updated as without the option.

use super::Update;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::{Node, Tensor};
use kiln_jit::DType;

/// The state-dict name of a parameter's master copy.
pub(super) const MASTER: &str = "master_param";

/// The master copies of an optimizer's parameters.
#[derive(Clone, Default)]
pub(super) struct Masters {
    pub on: bool,
    copies: Vec<Option<Tensor>>,
}

impl Masters {
    /// Keeps `n` parameters' copies (a group added grows it).
    pub(super) fn resize(&mut self, n: usize) {
        self.copies.resize(n, None);
    }

    /// Whether parameter `p` gets a master: the option is on and it is f16 or bf16.
    pub(super) fn wants(&self, p: &Tensor) -> bool {
        self.on && p.dtype().is_half()
    }

    /// Makes the master of every parameter that wants one and has none, in one graph of their own.
    pub(super) fn ensure(&mut self, params: &[Param]) -> Result<()> {
        let mut made = Vec::new();
        for (i, param) in params.iter().enumerate() {
            let p = param.get();
            if self.wants(&p) && self.copies[i].is_none() {
                made.push((i, p.to_dtype(DType::F32).contiguous()));
            }
        }
        if made.is_empty() {
            return Ok(());
        }
        let refs: Vec<&Tensor> = made.iter().map(|(_, t)| t).collect();
        crate::realize(&refs)?;
        for (i, t) in made {
            self.copies[i] = Some(t);
        }
        Ok(())
    }

    /// What parameter `i`'s update computes from: its master, else the parameter itself.
    pub(super) fn working(&self, i: usize, p: &Tensor) -> Tensor {
        self.copies.get(i).and_then(Option::clone).filter(|_| self.wants(p)).unwrap_or_else(|| p.clone())
    }

    /// [`Masters::working`] of parameter `i`, recording in `replaced` what the step overwrites: the parameter, and its
    /// master where the update reads one (their buffers may then take the new values: buffer donation).
    pub(super) fn working_replacing(&self, i: usize, p: &Tensor, replaced: &mut Vec<*const Node>) -> Tensor {
        let w = self.working(i, p);
        replaced.push(p.node_ptr());
        if w.dtype() != p.dtype() {
            replaced.push(w.node_ptr());
        }
        w
    }

    /// Installs `u`'s new parameter value and its new master (where it has one) after the step realized them; the
    /// optimizer's new state tensors, in the order its update made them.
    pub(super) fn install(&mut self, params: &[Param], u: Update) -> std::vec::IntoIter<Tensor> {
        params[u.param].set(u.value);
        if u.master.is_some() {
            self.set(u.param, u.master);
        }
        u.state.into_iter()
    }

    /// Parameter `i`'s master, if it has one.
    pub(super) fn get(&self, i: usize) -> Option<&Tensor> {
        self.copies.get(i).and_then(Option::as_ref)
    }

    pub(super) fn set(&mut self, i: usize, t: Option<Tensor>) {
        self.copies[i] = t;
    }

    /// The dtype parameter `p`'s state is kept in: f32 where it has a master, else its own.
    pub(super) fn state_dtype(&self, p: &Tensor) -> DType {
        if self.wants(p) { DType::F32 } else { p.dtype() }
    }
}

/// The new value of a parameter whose update computed `new` from `working` (its master or itself): the new master
/// and the parameter's value rounded from it, or the value alone.
pub(super) fn split(p: &Tensor, working: &Tensor, new: Tensor) -> (Tensor, Option<Tensor>) {
    if working.dtype() == p.dtype() { (new, None) } else { (new.to_dtype(p.dtype()), Some(new)) }
}
