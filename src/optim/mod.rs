//! Optimizers (`torch.optim`): `Sgd` (momentum, dampening, Nesterov, weight decay), `Adam` (L2 weight decay,
//! AMSGrad), `AdamW` (decoupled weight decay), `RmsProp` (momentum, centered) and `Adagrad` (learning-rate decay),
//! with PyTorch's update formulas.
//!
//! How a step runs, and why it replays one compiled plan:
//! 1. `step(grads, &[&loss])` builds every parameter's new value and new optimizer state (momentum buffers, Adam
//!    moments) as LAZY tensors, under `no_grad`, from the lazy gradients `backward` returned.
//! 2. It realizes all of them together with `also_realize` (typically the loss) in ONE `kiln::realize` call, so
//!    the forward pass, the backward pass and the update are one graph: one plan, compiled on the first step and
//!    replayed after.
//! 3. Each `Param` is `set` to its realized new value, a fresh leaf that holds the new buffer and no history; the
//!    state likewise. Nothing from step `t` stays reachable from step `t + 1`, so memory stays flat.
//! 4. The new buffer is the old one wherever nothing else can read the old value (buffer donation, decided by
//!    reference counts in `realize/donate.rs`; `step` consumes the gradients so that they do not hold the old
//!    values): the update kernel writes each element over the one it read, and a step needs one buffer per
//!    parameter and state tensor, not two. Where something does hold the old value, the step writes new buffers
//!    and the values are the same (`tests/donation.rs`).
//!
//! Keeping the graph identical from step to step: values that change every step (the learning rate, which a
//! scheduler may change, and Adam's bias corrections `1 - β^t`) enter the graph as realized 0-dim f64 tensors, not
//! constants, because constants are part of a plan's signature. A 0-dim operand does not widen a tensor's dtype
//! (PyTorch's promotion), so the same scalars serve f32 and f64 parameters. Fixed hyperparameters (betas, eps,
//! momentum, weight decay) are constants. State starts as zeros uploaded from the host (not a lazy `zeros`), and
//! a parameter that is still lazy on the first step (a fresh random init) is realized on its own first, so the
//! first step's graph is already the steady-state one.
//!
//! A parameter without a gradient (the loss does not depend on it) is left unchanged, and so is its state (as in
//! PyTorch, where such a parameter is skipped and its step count does not advance). If realizing fails, no
//! parameter or state changes. There is no `zero_grad`: gradients are values returned by `backward`, never
//! accumulated into the parameters.
//!
//! Checkpoints: `state_dict` / `load_state_dict` (and `kiln::save_optimizer` / `load_optimizer` for a file) carry
//! the hyperparameters, step counts and state tensors, so that training resumed in a fresh process computes the same
//! bits as training that never stopped (`state.rs`).
//!
//! `GradAccumulator` sums the gradients of several micro-batches for one step (`accumulate.rs`).
//!
//! Mixed precision: `.master_weights(true)` keeps f16 and bf16 parameters' values and state in f32 and rounds each
//! parameter from its master once per step (`master.rs`).
//!
//! Learning-rate schedules (`schedule`: step, exponential, cosine, linear warm-up, sequential) are functions of the
//! step number: `opt.set_lr(s.lr(t))` before step `t`.
//!
//! Parameter groups (`.group(params, GroupOptions)`) give some parameters their own learning-rate scale or weight
//! decay (`groups.rs`); every group steps in the same graph.
//!
//! Deliberately not done: sparse gradients, and the fused/foreach variants (the whole update is one fused graph
//! already).

mod accumulate;
mod adagrad;
mod adam;
mod groups;
mod master;
mod rmsprop;
pub mod schedule;
mod sgd;
mod state;

pub use accumulate::GradAccumulator;
pub use adagrad::Adagrad;
pub use adam::{Adam, AdamW};
pub use groups::GroupOptions;
pub use rmsprop::RmsProp;
pub use sgd::Sgd;
pub use state::{OptimizerState, ParamState};

use crate::autograd::Gradients;
use crate::device::Device;
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::{Node, Tensor};
use kiln_jit::{HostBuffer, Shape};

/// Updates parameters from the gradients of one `backward` call.
pub trait Optimizer {
    /// One update of every parameter that has a gradient in `grads`, realized in one graph together with
    /// `also_realize` (pass the loss so it is computed by the same plan instead of another pass).
    ///
    /// The step consumes the gradients: with them gone, nothing can read a parameter's old value after the step,
    /// so the new value is written into the old buffer (buffer donation) wherever the plan allows it, and training
    /// holds one buffer per parameter and state tensor instead of two. Anything still holding the old values (a
    /// clone of the gradients, an old parameter tensor, a lazy value computed from one) keeps them intact: the
    /// update then writes new buffers instead. To read a gradient or a prediction of this step, pass it in
    /// `also_realize`.
    fn step(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()>;

    /// The parameters, in the order given (duplicates removed).
    fn params(&self) -> &[Param];

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate (for a schedule). It is a run-time input of the plan, so changing it does not
    /// recompile.
    fn set_lr(&mut self, lr: f64);

    /// The whole state, for a checkpoint: hyperparameters, and per parameter its step count and state tensors.
    fn state_dict(&self) -> OptimizerState;

    /// Restores a state `state_dict` returned (of this kind of optimizer, over parameters of the same shapes, in
    /// the same order): its hyperparameters replace this optimizer's, as in PyTorch. Everything is checked first;
    /// on an error nothing changes.
    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()>;
}

/// Removes repeated handles to the same parameter (a tied weight listed twice would be updated twice).
pub(crate) fn dedup(params: Vec<Param>) -> Vec<Param> {
    let mut out: Vec<Param> = Vec::with_capacity(params.len());
    for p in params {
        if !out.iter().any(|q| q.ptr_eq(&p)) {
            out.push(p);
        }
    }
    out
}

/// Realizes the parameters that are still lazy (e.g. a random init) in one graph of their own.
fn realize_lazy(params: &[Param]) -> Result<()> {
    let lazy: Vec<Tensor> = params.iter().map(Param::get).filter(|t| !t.is_realized()).collect();
    if lazy.is_empty() {
        return Ok(());
    }
    let refs: Vec<&Tensor> = lazy.iter().collect();
    crate::realize(&refs)
}

/// Zeros shaped like `t`, uploaded (a realized input, so the first step's graph matches later ones).
fn zeros_input(t: &Tensor) -> Result<Tensor> {
    filled_input(t, 0.0)
}

/// A realized tensor of `t`'s shape, dtype and device holding `value` everywhere (an input of the step's graph, as
/// every later step's state is).
fn filled_input(t: &Tensor, value: f64) -> Result<Tensor> {
    let host = HostBuffer::from_f64(t.dtype(), &vec![value; t.numel()]);
    Tensor::from_host(host, t.shape().clone(), &t.device())
}

/// Run-time scalars of an optimizer step as realized 0-dim inputs: f64 (f32 on a device without f64, or for an f32
/// parameter through `get_for`), one per (role, device, dtype, parameter group, key). Keys are structural (a role and, e.g., a step
/// count), never the value itself: two roles that happen to hold equal values must stay two inputs, or the graph's
/// signature would change. An optimizer may keep its `Scalars` across steps (SGD does): a key whose value is
/// unchanged then reuses its uploaded tensor.
#[derive(Default)]
struct Scalars {
    /// (key, the value's bits, its tensor).
    made: Vec<(ScalarKey, u64, Tensor)>,
}

/// (role, device, stored as f32, parameter group, structural key).
type ScalarKey = (&'static str, Device, bool, usize, u64);

impl Scalars {
    fn get(&mut self, role: &'static str, device: Device, key: (usize, u64), value: f64) -> Result<Tensor> {
        self.make(role, device, false, key, value)
    }

    /// Like `get`, for a scalar that only multiplies `param`-typed values: an f32 parameter gets it as f32, the
    /// value its update would read anyway (a 0-dim f64 operand is converted to the f32 operand's type), without a
    /// conversion in the update kernel (~1 µs of a batch-1 MLP step). Other dtypes get the f64 scalar.
    fn get_for(&mut self, role: &'static str, param: &Tensor, key: (usize, u64), value: f64) -> Result<Tensor> {
        self.make(role, param.device(), param.dtype() == kiln_jit::DType::F32, key, value)
    }

    /// The tensor of `key` holding `value`: the one made before if it holds that value (an optimizer that keeps
    /// its `Scalars` across steps uploads a constant learning rate once), else a new upload replacing it.
    fn make(
        &mut self,
        role: &'static str,
        device: Device,
        as_f32: bool,
        key: (usize, u64),
        value: f64,
    ) -> Result<Tensor> {
        let key = (role, device, as_f32, key.0, key.1);
        let slot = self.made.iter().position(|(k, _, _)| *k == key);
        if let Some(i) = slot
            && self.made[i].1 == value.to_bits()
        {
            return Ok(self.made[i].2.clone());
        }
        // On a device without f64 the scalar is f32: the same value an f32 parameter's update reads after the
        // cast a 0-dim f64 operand gets.
        let t = if !as_f32 && device.supports(kiln_jit::DType::F64) {
            Tensor::from_vec(vec![value], Shape::scalar(), &device)?
        } else {
            Tensor::from_vec(vec![value as f32], Shape::scalar(), &device)?
        };
        match slot {
            Some(i) => self.made[i] = (key, value.to_bits(), t.clone()),
            None => self.made.push((key, value.to_bits(), t.clone())),
        }
        Ok(t)
    }
}

/// One parameter's update: its new value, new state tensors and new master copy (lazy until `commit`).
struct Update {
    param: usize,
    value: Tensor,
    state: Vec<Tensor>,
    master: Option<Tensor>,
}

/// Realizes every update together with `also_realize` in one call. On success the caller installs the values.
/// `replaced`: the parameters and state tensors the caller overwrites with the new values (each held once, by the
/// optimizer or its `Param`), whose buffers the new values may then be written into (buffer donation; the caller
/// must hold no other handle to them, and must have dropped the `Gradients`, which hold the parameters).
fn realize_all(updates: &[Update], also_realize: &[&Tensor], replaced: &[*const Node]) -> Result<()> {
    let mut targets: Vec<&Tensor> = Vec::with_capacity(also_realize.len() + updates.len() * 3);
    for u in updates {
        targets.push(&u.value);
        targets.extend(u.state.iter().chain(&u.master));
    }
    targets.extend_from_slice(also_realize);
    crate::realize::realize_replacing(&targets, replaced)
}

/// The gradient of `p` in `grads`, if any.
fn grad_of(grads: &Gradients, p: &Tensor) -> Option<Tensor> {
    let g = grads.get(p)?;
    debug_assert_eq!(g.dims(), p.dims(), "gradient shape");
    Some(g.clone())
}

#[track_caller]
fn check_hyper(name: &str, what: &str, v: f64, ok: bool) {
    if !ok {
        crate::args::fail!(name, "invalid {what}: {v}");
    }
}
