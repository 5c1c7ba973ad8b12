//! RMSprop (`torch.optim.RMSprop`).
//!
//! The update, as PyTorch's `_single_tensor_rmsprop` computes it:
//! ```text
//! g ← ∇θ f(θ)                      (−∇θ f(θ) if maximize)
//! if λ ≠ 0:  g ← g + λ θ            (weight decay)
//! v ← α v + (1 − α) g²              (square_avg)
//! if centered:
//!     ḡ ← ḡ + (g − ḡ)(1 − α)        (grad_avg, a lerp)
//!     d ← sqrt(v − ḡ²) + ε
//! else:
//!     d ← sqrt(v) + ε
//! if μ > 0:
//!     b ← μ b + g / d               (momentum_buffer)
//!     θ ← θ − γ b
//! else:
//!     θ ← θ − γ g / d
//! ```
//! Every state starts at zero, as in PyTorch, so every step has the same graph.

use super::groups::{GroupOptions, Groups};
use super::master::{Masters, split};
use super::state::{Check, flag, state_of, upload_stepped};
use super::{
    Optimizer, OptimizerState, Scalars, Update, check_hyper, dedup, grad_of, realize_all, realize_lazy, zeros_input,
};
use crate::autograd::{Gradients, no_grad};
use crate::error::Result;
use crate::nn::Param;
use crate::tensor::Tensor;

/// One parameter's state, from its first step on.
#[derive(Clone)]
struct State {
    step: u64,
    square_avg: Tensor,
    /// With `centered`.
    grad_avg: Option<Tensor>,
    /// With a momentum.
    momentum_buffer: Option<Tensor>,
}

/// RMSprop with optional momentum, centering and weight decay, PyTorch's defaults (`lr` given, `alpha` 0.99, `eps`
/// 1e-8, no weight decay, no momentum, not centered): `RmsProp::new(model.params(), 0.01).momentum(0.9)`.
pub struct RmsProp {
    params: Vec<Param>,
    lr: f64,
    alpha: f64,
    eps: f64,
    weight_decay: f64,
    momentum: f64,
    centered: bool,
    maximize: bool,
    groups: Groups,
    state: Vec<Option<State>>,
    /// f32 master copies of f16 and bf16 parameters (`master_weights`).
    masters: Masters,
    /// The run-time scalars, kept across steps (a constant learning rate is uploaded once).
    scalars: Scalars,
}

impl RmsProp {
    /// RMSprop with learning rate `lr` over `params` (repeated handles to one parameter count once).
    #[track_caller]
    pub fn new(params: Vec<Param>, lr: f64) -> RmsProp {
        check_hyper("RmsProp", "learning rate", lr, lr >= 0.0);
        let params = dedup(params);
        let n = params.len();
        let mut masters = Masters::default();
        masters.resize(n);
        RmsProp {
            params,
            lr,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            momentum: 0.0,
            centered: false,
            maximize: false,
            groups: Groups::new(n),
            state: vec![None; n],
            masters,
            scalars: Scalars::default(),
        }
    }

    /// Keeps f16 and bf16 parameters' values and state in f32 and sets each parameter to its master copy rounded
    /// once per step (mixed precision; see `optim::master`). Default off.
    pub fn master_weights(mut self, on: bool) -> RmsProp {
        self.masters.on = on;
        self
    }

    /// The smoothing constant α of the squared gradients' average (default 0.99).
    #[track_caller]
    pub fn alpha(mut self, alpha: f64) -> RmsProp {
        check_hyper("RmsProp", "alpha value", alpha, (0.0..=1.0).contains(&alpha));
        self.alpha = alpha;
        self
    }

    /// Added to the denominator (default 1e-8).
    #[track_caller]
    pub fn eps(mut self, eps: f64) -> RmsProp {
        check_hyper("RmsProp", "epsilon value", eps, eps >= 0.0);
        self.eps = eps;
        self
    }

    /// L2 penalty λ added to the gradient (default 0).
    #[track_caller]
    pub fn weight_decay(mut self, weight_decay: f64) -> RmsProp {
        check_hyper("RmsProp", "weight_decay value", weight_decay, weight_decay >= 0.0);
        self.weight_decay = weight_decay;
        self
    }

    /// Momentum factor μ (default 0).
    #[track_caller]
    pub fn momentum(mut self, momentum: f64) -> RmsProp {
        check_hyper("RmsProp", "momentum value", momentum, momentum >= 0.0);
        self.momentum = momentum;
        self
    }

    /// Normalizes by the gradient's estimated variance rather than its raw second moment (default off).
    pub fn centered(mut self, centered: bool) -> RmsProp {
        self.centered = centered;
        self
    }

    /// Maximize the objective instead of minimizing it (default off).
    pub fn maximize(mut self, maximize: bool) -> RmsProp {
        self.maximize = maximize;
        self
    }

    /// Adds a parameter group: `params` with their own learning-rate scale or weight decay (see `GroupOptions`).
    #[track_caller]
    pub fn group(mut self, params: Vec<Param>, options: GroupOptions) -> RmsProp {
        self.groups.add("RmsProp", &mut self.params, params, options);
        self.state.resize(self.params.len(), None);
        self.masters.resize(self.params.len());
        self
    }

    /// The average of squared gradients of parameter `i` (in `params()` order), once it has stepped.
    pub fn square_avg(&self, i: usize) -> Option<&Tensor> {
        self.state.get(i).and_then(Option::as_ref).map(|s| &s.square_avg)
    }

    /// The steps parameter `i` has taken.
    pub fn step_count(&self, i: usize) -> u64 {
        self.state.get(i).and_then(Option::as_ref).map_or(0, |s| s.step)
    }
}

impl Optimizer for RmsProp {
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
            let s = match &self.state[i] {
                Some(s) => {
                    let held = [Some(&s.square_avg), s.grad_avg.as_ref(), s.momentum_buffer.as_ref()];
                    replaced.extend(held.into_iter().flatten().map(Tensor::node_ptr));
                    s.clone()
                }
                None => State {
                    step: 0,
                    square_avg: zeros_input(&w)?,
                    grad_avg: if self.centered { Some(zeros_input(&w)?) } else { None },
                    momentum_buffer: if self.momentum > 0.0 { Some(zeros_input(&w)?) } else { None },
                },
            };
            let group = self.groups.of(i);
            let lr = scalars.get_for("lr", &w, (group, 0), self.groups.lr(i, self.lr))?;
            let weight_decay = self.groups.weight_decay(i, self.weight_decay);
            let (alpha, eps, momentum) = (self.alpha, self.eps, self.momentum);
            let update = no_grad(|| {
                let g = if g.dtype() == w.dtype() { g } else { g.to_dtype(w.dtype()) };
                let mut g = if self.maximize { g.neg() } else { g };
                if weight_decay != 0.0 {
                    g = g.add(w.mul(weight_decay));
                }
                let v = s.square_avg.mul(alpha).add(g.mul(&g).mul(1.0 - alpha));
                let mut state = vec![v.clone()];
                let avg = match &s.grad_avg {
                    Some(ga) => {
                        let ga = ga.add(g.sub(ga).mul(1.0 - alpha));
                        state.push(ga.clone());
                        v.sub(ga.mul(&ga)).sqrt()
                    }
                    None => v.sqrt(),
                }
                .add(eps);
                let step = match &s.momentum_buffer {
                    Some(b) => {
                        let b = b.mul(momentum).add(g.div(&avg));
                        state.push(b.clone());
                        b
                    }
                    None => g.div(&avg),
                };
                let (value, master) = split(&p, &w, w.sub(step.mul(&lr)));
                Update { param: i, value, state, master }
            });
            updates.push(update);
            steps.push((s.step + 1, s.grad_avg.is_some(), s.momentum_buffer.is_some()));
        }
        drop(grads);
        realize_all(&updates, also_realize, &replaced)?;
        for (u, (step, centered, with_momentum)) in updates.into_iter().zip(steps) {
            let i = u.param;
            let mut t = self.masters.install(&self.params, u);
            let square_avg = t.next().expect("square_avg");
            let grad_avg = if centered { t.next() } else { None };
            let momentum_buffer = if with_momentum { t.next() } else { None };
            self.state[i] = Some(State { step, square_avg, grad_avg, momentum_buffer });
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
        check_hyper("RmsProp", "learning rate", lr, lr >= 0.0);
        self.lr = lr;
    }

    fn state_dict(&self) -> OptimizerState {
        let hyper = [
            ("lr", self.lr),
            ("alpha", self.alpha),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("momentum", self.momentum),
            ("centered", flag(self.centered)),
            ("maximize", flag(self.maximize)),
        ];
        state_of("RmsProp", &hyper, &self.groups, &self.masters, self.state.len(), |i| {
            self.state[i].as_ref().map(|s| {
                let mut tensors = vec![("square_avg", &s.square_avg)];
                tensors.extend(s.momentum_buffer.iter().map(|t| ("momentum_buffer", t)));
                tensors.extend(s.grad_avg.iter().map(|t| ("grad_avg", t)));
                (s.step, tensors)
            })
        })
    }

    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
        let mut check = Check::new(state, "RmsProp", &self.params);
        let lr = check.value("lr", ">= 0", |v| v >= 0.0);
        let alpha = check.value("alpha", "in [0, 1]", |v| (0.0..=1.0).contains(&v));
        let eps = check.value("eps", ">= 0", |v| v >= 0.0);
        let weight_decay = check.value("weight_decay", ">= 0", |v| v >= 0.0);
        let momentum = check.value("momentum", ">= 0", |v| v >= 0.0);
        let centered = check.flag("centered");
        let maximize = check.flag("maximize");
        let mut masters = self.masters.clone();
        masters.on = check.optional("master_weights", "0 or 1", |v| v == 0.0 || v == 1.0) == Some(1.0);
        let groups = self.groups.read(&mut check);
        let mut names = vec!["square_avg"];
        if momentum > 0.0 {
            names.push("momentum_buffer");
        }
        if centered {
            names.push("grad_avg");
        }
        // The state exists from a parameter's first step on.
        let found = check.stepped(&self.params, &masters, &names);
        check.finish()?;
        let states = upload_stepped(found, &self.params, &mut masters)?
            .into_iter()
            .map(|s| {
                s.map(|(step, t)| {
                    let mut t = t.into_iter();
                    let square_avg = t.next().expect("square_avg");
                    let momentum_buffer = if momentum > 0.0 { t.next() } else { None };
                    let grad_avg = if centered { t.next() } else { None };
                    State { step, square_avg, grad_avg, momentum_buffer }
                })
            })
            .collect();
        (self.lr, self.alpha, self.eps, self.weight_decay, self.momentum) = (lr, alpha, eps, weight_decay, momentum);
        (self.centered, self.maximize) = (centered, maximize);
        self.groups = groups;
        self.state = states;
        self.masters = masters;
        Ok(())
    }
}
