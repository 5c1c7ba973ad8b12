//! Stochastic gradient descent (`torch.optim.SGD`).
//!
//! The update, as PyTorch's `_single_tensor_sgd` computes it (the docs' pseudo-code, with `maximize` applied to
//! the gradient first as the implementation does):
//! ```text
//! g ← ∇θ f(θ)                       (−∇θ f(θ) if maximize)
//! if λ ≠ 0:  g ← g + λ θ             (weight decay)
//! if μ ≠ 0:
//!     b ← g                          on this parameter's first step
//!     b ← μ b + (1 − τ) g            after                          (τ: dampening)
//!     g ← g + μ b   if nesterov  else  g ← b
//! θ ← θ − γ g                        (γ: lr)
//! ```
//! kiln starts `b` at zero, so the first step's `μ·0 + 1·g` is exactly `g` and every step has the same graph;
//! with dampening the factor `1` vs `1 − τ` is a run-time scalar for the same reason.

use super::groups::{GroupOptions, Groups};
use super::master::{Masters, split};
use super::state::{Check, flag, state_of, upload};
use super::{
    Optimizer, OptimizerState, Scalars, Update, check_hyper, dedup, grad_of, realize_all, realize_lazy, zeros_input,
};
use crate::autograd::{Gradients, no_grad};
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

/// SGD with optional momentum, dampening, Nesterov momentum and weight decay.
/// `Sgd::new(model.params(), 0.1).momentum(0.9).weight_decay(1e-4)`.
pub struct Sgd {
    params: Vec<Param>,
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
    groups: Groups,
    /// Momentum buffers, created on a parameter's first step with a gradient.
    bufs: Vec<Option<Tensor>>,
    /// f32 master copies of f16 and bf16 parameters (`master_weights`).
    masters: Masters,
    /// The run-time scalars, kept across steps: a step whose learning rate is unchanged reuses last step's
    /// uploaded tensor instead of uploading the same value again.
    scalars: Scalars,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` over `params` (repeated handles to one parameter count once).
    #[track_caller]
    pub fn new(params: Vec<Param>, lr: f64) -> Sgd {
        check_hyper("Sgd", "learning rate", lr, lr >= 0.0);
        let params = dedup(params);
        let n = params.len();
        let mut masters = Masters::default();
        masters.resize(n);
        Sgd {
            params,
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            groups: Groups::new(n),
            bufs: vec![None; n],
            masters,
            scalars: Scalars::default(),
        }
    }

    /// Keeps f16 and bf16 parameters' values and momentum in f32 and sets each parameter to its master copy
    /// rounded once per step (mixed precision; see `optim::master`). Default off.
    pub fn master_weights(mut self, on: bool) -> Sgd {
        self.masters.on = on;
        self
    }

    /// Momentum factor μ (default 0).
    #[track_caller]
    pub fn momentum(mut self, momentum: f64) -> Sgd {
        check_hyper("Sgd", "momentum value", momentum, momentum >= 0.0);
        self.momentum = momentum;
        self
    }

    /// Dampening τ for momentum (default 0).
    #[track_caller]
    pub fn dampening(mut self, dampening: f64) -> Sgd {
        check_hyper("Sgd", "dampening", dampening, dampening.is_finite());
        self.dampening = dampening;
        self
    }

    /// L2 penalty λ added to the gradient (default 0).
    #[track_caller]
    pub fn weight_decay(mut self, weight_decay: f64) -> Sgd {
        check_hyper("Sgd", "weight_decay value", weight_decay, weight_decay >= 0.0);
        self.weight_decay = weight_decay;
        self
    }

    /// Nesterov momentum (default off); needs a momentum and zero dampening, checked at the first step.
    pub fn nesterov(mut self, nesterov: bool) -> Sgd {
        self.nesterov = nesterov;
        self
    }

    /// Maximize the objective instead of minimizing it (default off).
    pub fn maximize(mut self, maximize: bool) -> Sgd {
        self.maximize = maximize;
        self
    }

    /// Adds a parameter group: `params` with their own learning-rate scale or weight decay (see `GroupOptions`).
    /// They come after the parameters already given in `params()` order.
    #[track_caller]
    pub fn group(mut self, params: Vec<Param>, options: GroupOptions) -> Sgd {
        self.groups.add("Sgd", &mut self.params, params, options);
        self.bufs.resize(self.params.len(), None);
        self.masters.resize(self.params.len());
        self
    }

    /// The momentum buffer of parameter `i` (in `params()` order), once it has one.
    pub fn momentum_buffer(&self, i: usize) -> Option<&Tensor> {
        self.bufs.get(i).and_then(Option::as_ref)
    }
}

impl Optimizer for Sgd {
    #[track_caller]
    fn step(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()> {
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            crate::args::fail!("Sgd", "Nesterov momentum requires a momentum and zero dampening");
        }
        realize_lazy(&self.params)?;
        self.masters.ensure(&self.params)?;
        let scalars = &mut self.scalars;
        let mut updates = Vec::new();
        let mut replaced = Vec::new();
        for (i, param) in self.params.iter().enumerate() {
            let p = param.get();
            let Some(g) = grad_of(&grads, &p) else { continue };
            // The value the update reads and writes: the f32 master, or the parameter.
            let w = self.masters.working_replacing(i, &p, &mut replaced);
            replaced.extend(self.bufs[i].as_ref().map(Tensor::node_ptr));
            let group = self.groups.of(i);
            let lr = scalars.get_for("lr", &w, (group, 0), self.groups.lr(i, self.lr))?;
            let weight_decay = self.groups.weight_decay(i, self.weight_decay);
            let first = self.bufs[i].is_none();
            let buf = match &self.bufs[i] {
                Some(b) if self.momentum != 0.0 => Some(b.clone()),
                _ if self.momentum != 0.0 => Some(zeros_input(&w)?),
                _ => None,
            };
            let damp = if self.momentum != 0.0 && self.dampening != 0.0 {
                let value = if first { 1.0 } else { 1.0 - self.dampening };
                Some(scalars.get_for("dampening", &w, (0, first as u64), value)?)
            } else {
                None
            };
            let update = no_grad(|| {
                let g = if g.dtype() == w.dtype() { g } else { g.to_dtype(w.dtype()) };
                let mut g = if self.maximize { g.neg() } else { g };
                if weight_decay != 0.0 {
                    g = g.add(w.mul(weight_decay));
                }
                let mut state = Vec::new();
                if let Some(b) = buf {
                    let scaled = match &damp {
                        Some(c) => g.mul(c),
                        None => g.clone(),
                    };
                    let b = b.mul(self.momentum).add(scaled);
                    g = if self.nesterov { g.add(b.mul(self.momentum)) } else { b.clone() };
                    state.push(b);
                }
                let (value, master) = split(&p, &w, w.sub(g.mul(&lr)));
                Update { param: i, value, state, master }
            });
            updates.push(update);
        }
        drop(grads);
        realize_all(&updates, also_realize, &replaced)?;
        for u in updates {
            let i = u.param;
            if let Some(b) = self.masters.install(&self.params, u).next() {
                self.bufs[i] = Some(b);
            }
        }
        Ok(())
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    #[track_caller]
    fn set_lr(&mut self, lr: f64) {
        check_hyper("Sgd", "learning rate", lr, lr >= 0.0);
        self.lr = lr;
    }

    fn state_dict(&self) -> OptimizerState {
        let hyper = [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("dampening", self.dampening),
            ("weight_decay", self.weight_decay),
            ("nesterov", flag(self.nesterov)),
            ("maximize", flag(self.maximize)),
        ];
        // Every parameter's entry is written, its momentum buffer where it has one (SGD keeps no step count).
        state_of("Sgd", &hyper, &self.groups, &self.masters, self.bufs.len(), |i| {
            Some((0, self.bufs[i].iter().map(|b| ("momentum_buffer", b)).collect()))
        })
    }

    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
        let mut check = Check::new(state, "Sgd", &self.params);
        let lr = check.value("lr", ">= 0", |v| v >= 0.0);
        let momentum = check.value("momentum", ">= 0", |v| v >= 0.0);
        let dampening = check.value("dampening", "finite", f64::is_finite);
        let weight_decay = check.value("weight_decay", ">= 0", |v| v >= 0.0);
        let nesterov = check.flag("nesterov");
        let maximize = check.flag("maximize");
        let mut masters = self.masters.clone();
        masters.on = check.optional("master_weights", "0 or 1", |v| v == 0.0 || v == 1.0) == Some(1.0);
        let groups = self.groups.read(&mut check);
        if nesterov && (momentum <= 0.0 || dampening != 0.0) {
            check.problem("nesterov = 1 needs a momentum and zero dampening".into());
        }
        let mut bufs = Vec::with_capacity(self.params.len());
        let mut master_data = Vec::with_capacity(self.params.len());
        for (i, param) in self.params.iter().enumerate() {
            let p = param.get();
            // A buffer exists once the parameter has stepped with momentum; without momentum there is none.
            let present = momentum != 0.0
                && state.params.get(i).is_some_and(|s| s.tensors.keys().any(|k| k == "momentum_buffer"));
            let dtype = masters.state_dtype(&p);
            let names = ["momentum_buffer"];
            bufs.push(check.tensors(i, &p, dtype, &names, present, |step| step == 0).map(|mut b| b.remove(0)));
            master_data.push(check.master(i, &p, masters.wants(&p)));
        }
        check.finish()?;
        let mut uploaded = Vec::with_capacity(bufs.len());
        for (i, (b, m)) in bufs.into_iter().zip(master_data).enumerate() {
            let p = self.params[i].get();
            uploaded.push(b.map(|data| upload(data, &p)).transpose()?);
            masters.set(i, m.map(|data| upload(data, &p)).transpose()?);
        }
        self.masters = masters;
        (self.lr, self.momentum, self.dampening, self.weight_decay) = (lr, momentum, dampening, weight_decay);
        (self.nesterov, self.maximize) = (nesterov, maximize);
        self.groups = groups;
        self.bufs = uploaded;
        Ok(())
    }
}
