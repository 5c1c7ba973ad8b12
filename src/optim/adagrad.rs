//! Adagrad (`torch.optim.Adagrad`).
//!
//! The update, as PyTorch's `_single_tensor_adagrad` computes it at step `t` (from 1):
//! ```text
//! g ← ∇θ f(θ)                      (−∇θ f(θ) if maximize)
//! if λ ≠ 0:  g ← g + λ θ            (weight decay)
//! γₜ ← γ / (1 + (t − 1) η)          (η: lr_decay)
//! s ← s + g²                        (sum, starting at initial_accumulator_value)
//! θ ← θ − γₜ g / (sqrt(s) + ε)
//! ```
//! The decayed rate is a run-time scalar, so a step never recompiles for it.

use super::groups::{GroupOptions, Groups};
use super::master::{Masters, split};
use super::state::{Check, flag, state_of, upload_stepped};
use super::{
    Optimizer, OptimizerState, Scalars, Update, check_hyper, dedup, filled_input, grad_of, realize_all, realize_lazy,
};
use crate::autograd::{Gradients, no_grad};
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

/// Adagrad with optional learning-rate decay, weight decay and initial accumulator, PyTorch's defaults (`lr` given,
/// `lr_decay` 0, `eps` 1e-10): `Adagrad::new(model.params(), 0.01)`.
pub struct Adagrad {
    params: Vec<Param>,
    lr: f64,
    lr_decay: f64,
    weight_decay: f64,
    initial_accumulator_value: f64,
    eps: f64,
    maximize: bool,
    groups: Groups,
    /// Per parameter, its steps taken and its sum of squared gradients, from its first step on.
    state: Vec<Option<(u64, Tensor)>>,
    /// f32 master copies of f16 and bf16 parameters (`master_weights`).
    masters: Masters,
    scalars: Scalars,
}

impl Adagrad {
    /// Adagrad with learning rate `lr` over `params` (repeated handles to one parameter count once).
    #[track_caller]
    pub fn new(params: Vec<Param>, lr: f64) -> Adagrad {
        check_hyper("Adagrad", "learning rate", lr, lr >= 0.0);
        let params = dedup(params);
        let n = params.len();
        let mut masters = Masters::default();
        masters.resize(n);
        Adagrad {
            params,
            lr,
            lr_decay: 0.0,
            weight_decay: 0.0,
            initial_accumulator_value: 0.0,
            eps: 1e-10,
            maximize: false,
            groups: Groups::new(n),
            state: vec![None; n],
            masters,
            scalars: Scalars::default(),
        }
    }

    /// Keeps f16 and bf16 parameters' values and sums in f32 (mixed precision; see `optim::master`). Default off.
    pub fn master_weights(mut self, on: bool) -> Adagrad {
        self.masters.on = on;
        self
    }

    /// The rate of step `t` is `lr / (1 + (t - 1) lr_decay)` (default 0).
    #[track_caller]
    pub fn lr_decay(mut self, lr_decay: f64) -> Adagrad {
        check_hyper("Adagrad", "lr_decay", lr_decay, lr_decay >= 0.0);
        self.lr_decay = lr_decay;
        self
    }

    /// L2 penalty λ added to the gradient (default 0).
    #[track_caller]
    pub fn weight_decay(mut self, weight_decay: f64) -> Adagrad {
        check_hyper("Adagrad", "weight_decay value", weight_decay, weight_decay >= 0.0);
        self.weight_decay = weight_decay;
        self
    }

    /// The sum of squared gradients' starting value (default 0).
    #[track_caller]
    pub fn initial_accumulator_value(mut self, value: f64) -> Adagrad {
        check_hyper("Adagrad", "initial_accumulator_value", value, value >= 0.0);
        self.initial_accumulator_value = value;
        self
    }

    /// Added to the denominator (default 1e-10).
    #[track_caller]
    pub fn eps(mut self, eps: f64) -> Adagrad {
        check_hyper("Adagrad", "epsilon value", eps, eps >= 0.0);
        self.eps = eps;
        self
    }

    /// Maximize the objective instead of minimizing it (default off).
    pub fn maximize(mut self, maximize: bool) -> Adagrad {
        self.maximize = maximize;
        self
    }

    /// Adds a parameter group: `params` with their own learning-rate scale or weight decay (see `GroupOptions`).
    #[track_caller]
    pub fn group(mut self, params: Vec<Param>, options: GroupOptions) -> Adagrad {
        self.groups.add("Adagrad", &mut self.params, params, options);
        self.state.resize(self.params.len(), None);
        self.masters.resize(self.params.len());
        self
    }

    /// The sum of squared gradients of parameter `i` (in `params()` order), once it has stepped.
    pub fn sum(&self, i: usize) -> Option<&Tensor> {
        self.state.get(i).and_then(Option::as_ref).map(|(_, s)| s)
    }

    /// The steps parameter `i` has taken.
    pub fn step_count(&self, i: usize) -> u64 {
        self.state.get(i).and_then(Option::as_ref).map_or(0, |(t, _)| *t)
    }
}

impl Optimizer for Adagrad {
    fn step(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()> {
        realize_lazy(&self.params)?;
        self.masters.ensure(&self.params)?;
        let scalars = &mut self.scalars;
        let mut updates = Vec::new();
        let mut steps = Vec::new();
        let mut replaced = Vec::new();
        for (i, param) in self.params.iter().enumerate() {
            let p = param.get();
            let Some(g) = grad_of(&grads, &p) else { continue };
            // The value the update reads and writes: the f32 master, or the parameter.
            let w = self.masters.working_replacing(i, &p, &mut replaced);
            let (t, sum) = match &self.state[i] {
                Some((t, s)) => {
                    replaced.push(s.node_ptr());
                    (t + 1, s.clone())
                }
                // Realized, as every later step's sum is: the first step's graph is the same as the others'.
                None => (1, filled_input(&w, self.initial_accumulator_value)?),
            };
            let group = self.groups.of(i);
            let rate = self.groups.lr(i, self.lr) / (1.0 + (t - 1) as f64 * self.lr_decay);
            let lr = scalars.get_for("lr", &w, (group, t), rate)?;
            let weight_decay = self.groups.weight_decay(i, self.weight_decay);
            let eps = self.eps;
            let update = no_grad(|| {
                let g = if g.dtype() == w.dtype() { g } else { g.to_dtype(w.dtype()) };
                let mut g = if self.maximize { g.neg() } else { g };
                if weight_decay != 0.0 {
                    g = g.add(w.mul(weight_decay));
                }
                let sum = sum.add(g.mul(&g));
                let std = sum.sqrt().add(eps);
                let (value, master) = split(&p, &w, w.sub(g.div(std).mul(&lr)));
                Update { param: i, value, state: vec![sum], master }
            });
            updates.push(update);
            steps.push(t);
        }
        drop(grads);
        realize_all(&updates, also_realize, &replaced)?;
        for (u, t) in updates.into_iter().zip(steps) {
            let i = u.param;
            let sum = self.masters.install(&self.params, u).next().expect("sum");
            self.state[i] = Some((t, sum));
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
        check_hyper("Adagrad", "learning rate", lr, lr >= 0.0);
        self.lr = lr;
    }

    fn state_dict(&self) -> OptimizerState {
        let hyper = [
            ("lr", self.lr),
            ("lr_decay", self.lr_decay),
            ("weight_decay", self.weight_decay),
            ("initial_accumulator_value", self.initial_accumulator_value),
            ("eps", self.eps),
            ("maximize", flag(self.maximize)),
        ];
        state_of("Adagrad", &hyper, &self.groups, &self.masters, self.state.len(), |i| {
            self.state[i].as_ref().map(|(t, sum)| (*t, vec![("sum", sum)]))
        })
    }

    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
        let mut check = Check::new(state, "Adagrad", &self.params);
        let lr = check.value("lr", ">= 0", |v| v >= 0.0);
        let lr_decay = check.value("lr_decay", ">= 0", |v| v >= 0.0);
        let weight_decay = check.value("weight_decay", ">= 0", |v| v >= 0.0);
        let initial = check.value("initial_accumulator_value", ">= 0", |v| v >= 0.0);
        let eps = check.value("eps", ">= 0", |v| v >= 0.0);
        let maximize = check.flag("maximize");
        let mut masters = self.masters.clone();
        masters.on = check.optional("master_weights", "0 or 1", |v| v == 0.0 || v == 1.0) == Some(1.0);
        let groups = self.groups.read(&mut check);
        // The sum exists from a parameter's first step on.
        let found = check.stepped(&self.params, &masters, &["sum"]);
        check.finish()?;
        let states = upload_stepped(found, &self.params, &mut masters)?
            .into_iter()
            .map(|s| s.map(|(step, t)| (step, t.into_iter().next().expect("sum"))))
            .collect();
        (self.lr, self.lr_decay, self.weight_decay, self.initial_accumulator_value, self.eps) =
            (lr, lr_decay, weight_decay, initial, eps);
        self.maximize = maximize;
        self.groups = groups;
        self.state = states;
        self.masters = masters;
        Ok(())
    }
}
