//! Adam (`torch.optim.Adam`) and AdamW (`torch.optim.AdamW`).
//!
//! The docs' pseudo-code, in the arithmetic order of PyTorch's `_single_tensor_adam`:
//! ```text
//! t ← t + 1                                   (per parameter: only steps where it had a gradient count)
//! g ← ∇θ f(θ)                                 (−∇θ f(θ) if maximize)
//! Adam,  λ ≠ 0:  g ← g + λ θ                  (L2 penalty folded into the gradient)
//! AdamW, λ ≠ 0:  θ ← θ (1 − γ λ)              (decoupled weight decay)
//! m ← m + (g − m)(1 − β1)                     (m.lerp_(g, 1 − β1))
//! v ← β2 v + (1 − β2) g²
//! step_size ← γ / (1 − β1^t);  bc2_sqrt ← sqrt(1 − β2^t)
//! amsgrad:  v_max ← max(v_max, v);  denom ← sqrt(v_max) / bc2_sqrt + ε
//! else:     denom ← sqrt(v) / bc2_sqrt + ε
//! θ ← θ − step_size · m / denom
//! ```
//! `step_size`, `bc2_sqrt` and AdamW's `1 − γλ` change every step (or with the learning rate), so they are
//! computed on the host in f64 and enter the graph as 0-dim inputs; the rest are constants.

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

/// Per-parameter state: step count and moments.
#[derive(Clone)]
struct State {
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Option<Tensor>,
}

/// What Adam and AdamW share; they differ in how weight decay is applied and in its default.
struct Core {
    name: &'static str,
    params: Vec<Param>,
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    amsgrad: bool,
    maximize: bool,
    decoupled: bool,
    groups: Groups,
    state: Vec<Option<State>>,
    /// f32 master copies of f16 and bf16 parameters (`master_weights`).
    masters: Masters,
}

impl Core {
    #[track_caller]
    fn new(name: &'static str, params: Vec<Param>, lr: f64, weight_decay: f64, decoupled: bool) -> Core {
        check_hyper(name, "learning rate", lr, lr >= 0.0);
        let params = dedup(params);
        let n = params.len();
        let mut masters = Masters::default();
        masters.resize(n);
        Core {
            name,
            params,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            amsgrad: false,
            maximize: false,
            decoupled,
            groups: Groups::new(n),
            state: vec![None; n],
            masters,
        }
    }

    fn step(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()> {
        realize_lazy(&self.params)?;
        self.masters.ensure(&self.params)?;
        let mut scalars = Scalars::default();
        let mut updates = Vec::new();
        let mut steps = Vec::new();
        let mut replaced = Vec::new();
        for (i, param) in self.params.iter().enumerate() {
            let p = param.get();
            let Some(g) = grad_of(&grads, &p) else { continue };
            // The value the update reads and writes: the f32 master, or the parameter.
            let w = self.masters.working_replacing(i, &p, &mut replaced);
            if let Some(s) = &self.state[i] {
                replaced.extend([&s.exp_avg, &s.exp_avg_sq].into_iter().chain(&s.max_exp_avg_sq).map(Tensor::node_ptr));
            }
            let dev = p.device();
            let (t, m, v, vmax) = match &self.state[i] {
                Some(s) => (s.step + 1, s.exp_avg.clone(), s.exp_avg_sq.clone(), s.max_exp_avg_sq.clone()),
                None => {
                    let vmax = if self.amsgrad { Some(zeros_input(&w)?) } else { None };
                    (1, zeros_input(&w)?, zeros_input(&w)?, vmax)
                }
            };
            let (b1, b2) = (self.beta1, self.beta2);
            // `powf`, as Python's `beta ** step` (C `pow`), not `powi`'s repeated products.
            let bias_correction1 = 1.0 - b1.powf(t as f64);
            let bias_correction2 = 1.0 - b2.powf(t as f64);
            let (group, lr) = (self.groups.of(i), self.groups.lr(i, self.lr));
            let weight_decay = self.groups.weight_decay(i, self.weight_decay);
            let step_size = scalars.get("step_size", dev, (group, t), lr / bias_correction1)?;
            let bc2_sqrt = scalars.get("bias_correction2_sqrt", dev, (0, t), bias_correction2.sqrt())?;
            let decay = if self.decoupled && weight_decay != 0.0 {
                Some(scalars.get("decay", dev, (group, 0), 1.0 - lr * weight_decay)?)
            } else {
                None
            };
            let update = no_grad(|| {
                let g = if g.dtype() == w.dtype() { g } else { g.to_dtype(w.dtype()) };
                let mut g = if self.maximize { g.neg() } else { g };
                let mut x = w.clone();
                if weight_decay != 0.0 {
                    match &decay {
                        Some(d) => x = x.mul(d),
                        None => g = g.add(x.mul(weight_decay)),
                    }
                }
                let m = m.add(g.sub(&m).mul(1.0 - b1));
                let v = v.mul(b2).add(g.mul(&g).mul(1.0 - b2));
                let mut state = vec![m.clone(), v.clone()];
                let second = match vmax {
                    Some(vmax) => {
                        let vmax = vmax.maximum(&v);
                        state.push(vmax.clone());
                        vmax
                    }
                    None => v,
                };
                let denom = second.sqrt().div(&bc2_sqrt).add(self.eps);
                let (value, master) = split(&p, &w, x.sub(m.div(denom).mul(&step_size)));
                Update { param: i, value, state, master }
            });
            updates.push(update);
            steps.push(t);
        }
        drop(grads);
        realize_all(&updates, also_realize, &replaced)?;
        for (u, t) in updates.into_iter().zip(steps) {
            let i = u.param;
            let mut s = self.masters.install(&self.params, u);
            let (exp_avg, exp_avg_sq) = (s.next().expect("m"), s.next().expect("v"));
            self.state[i] = Some(State { step: t, exp_avg, exp_avg_sq, max_exp_avg_sq: s.next() });
        }
        Ok(())
    }

    fn state_dict(&self) -> OptimizerState {
        let hyper = [
            ("lr", self.lr),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("eps", self.eps),
            ("weight_decay", self.weight_decay),
            ("amsgrad", flag(self.amsgrad)),
            ("maximize", flag(self.maximize)),
        ];
        state_of(self.name, &hyper, &self.groups, &self.masters, self.state.len(), |i| {
            self.state[i].as_ref().map(|s| {
                let mut tensors = vec![("exp_avg", &s.exp_avg), ("exp_avg_sq", &s.exp_avg_sq)];
                tensors.extend(s.max_exp_avg_sq.iter().map(|t| ("max_exp_avg_sq", t)));
                (s.step, tensors)
            })
        })
    }

    fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
        let mut check = Check::new(state, self.name, &self.params);
        let lr = check.value("lr", ">= 0", |v| v >= 0.0);
        let beta1 = check.value("beta1", "in [0, 1)", |v| (0.0..1.0).contains(&v));
        let beta2 = check.value("beta2", "in [0, 1)", |v| (0.0..1.0).contains(&v));
        let eps = check.value("eps", ">= 0", |v| v >= 0.0);
        let weight_decay = check.value("weight_decay", ">= 0", |v| v >= 0.0);
        let amsgrad = check.flag("amsgrad");
        let maximize = check.flag("maximize");
        let mut masters = self.masters.clone();
        masters.on = check.optional("master_weights", "0 or 1", |v| v == 0.0 || v == 1.0) == Some(1.0);
        let groups = self.groups.read(&mut check);
        let names: &[&str] =
            if amsgrad { &["exp_avg", "exp_avg_sq", "max_exp_avg_sq"] } else { &["exp_avg", "exp_avg_sq"] };
        // Moments exist from a parameter's first step on.
        let found = check.stepped(&self.params, &masters, names);
        check.finish()?;
        let states = upload_stepped(found, &self.params, &mut masters)?
            .into_iter()
            .map(|s| {
                s.map(|(step, t)| {
                    let mut t = t.into_iter();
                    let (exp_avg, exp_avg_sq) = (t.next().expect("exp_avg"), t.next().expect("exp_avg_sq"));
                    State { step, exp_avg, exp_avg_sq, max_exp_avg_sq: t.next() }
                })
            })
            .collect();
        (self.lr, self.beta1, self.beta2, self.eps, self.weight_decay) = (lr, beta1, beta2, eps, weight_decay);
        (self.amsgrad, self.maximize) = (amsgrad, maximize);
        self.groups = groups;
        self.state = states;
        self.masters = masters;
        Ok(())
    }
}

macro_rules! adam_type {
    ($(#[$doc:meta])* $name:ident, $default_wd:expr, $decoupled:expr) => {
        $(#[$doc])*
        pub struct $name {
            core: Core,
        }

        impl $name {
            #[doc = concat!("`", stringify!($name), "` with learning rate `lr`, betas (0.9, 0.999), eps 1e-8 and weight decay ", stringify!($default_wd), ", as in PyTorch.")]
            #[track_caller]
            pub fn new(params: Vec<Param>, lr: f64) -> $name {
                $name { core: Core::new(stringify!($name), params, lr, $default_wd, $decoupled) }
            }

            /// Adds a parameter group: `params` with their own learning-rate scale or weight decay (see
            /// `GroupOptions`). They come after the parameters already given in `params()` order.
            #[track_caller]
            pub fn group(mut self, params: Vec<Param>, options: GroupOptions) -> $name {
                let core = &mut self.core;
                core.groups.add(core.name, &mut core.params, params, options);
                core.state.resize(core.params.len(), None);
                core.masters.resize(core.params.len());
                self
            }

            /// Keeps f16 and bf16 parameters' values and moments in f32 and sets each parameter to its master
            /// copy rounded once per step (mixed precision; see `optim::master`). Default off.
            pub fn master_weights(mut self, on: bool) -> $name {
                self.core.masters.on = on;
                self
            }

            /// Coefficients (β1, β2) of the running averages of the gradient and its square.
            #[track_caller]
            pub fn betas(mut self, beta1: f64, beta2: f64) -> $name {
                check_hyper(self.core.name, "beta parameter at index 0", beta1, (0.0..1.0).contains(&beta1));
                check_hyper(self.core.name, "beta parameter at index 1", beta2, (0.0..1.0).contains(&beta2));
                self.core.beta1 = beta1;
                self.core.beta2 = beta2;
                self
            }

            /// Term added to the denominator for numerical stability.
            #[track_caller]
            pub fn eps(mut self, eps: f64) -> $name {
                check_hyper(self.core.name, "epsilon value", eps, eps >= 0.0);
                self.core.eps = eps;
                self
            }

            /// Weight decay λ.
            #[track_caller]
            pub fn weight_decay(mut self, weight_decay: f64) -> $name {
                check_hyper(self.core.name, "weight_decay value", weight_decay, weight_decay >= 0.0);
                self.core.weight_decay = weight_decay;
                self
            }

            /// The AMSGrad variant (the running maximum of the second moment).
            pub fn amsgrad(mut self, amsgrad: bool) -> $name {
                self.core.amsgrad = amsgrad;
                self
            }

            /// Maximize the objective instead of minimizing it.
            pub fn maximize(mut self, maximize: bool) -> $name {
                self.core.maximize = maximize;
                self
            }

            /// Steps taken by parameter `i` (in `params()` order).
            pub fn step_count(&self, i: usize) -> u64 {
                self.core.state.get(i).and_then(Option::as_ref).map_or(0, |s| s.step)
            }

            /// The first and second moment estimates of parameter `i`, once it has taken a step.
            pub fn moments(&self, i: usize) -> Option<(&Tensor, &Tensor)> {
                self.core.state.get(i).and_then(Option::as_ref).map(|s| (&s.exp_avg, &s.exp_avg_sq))
            }
        }

        impl Optimizer for $name {
            fn step(&mut self, grads: Gradients, also_realize: &[&Tensor]) -> Result<()> {
                self.core.step(grads, also_realize)
            }

            fn params(&self) -> &[Param] {
                &self.core.params
            }

            fn lr(&self) -> f64 {
                self.core.lr
            }

            #[track_caller]
            fn set_lr(&mut self, lr: f64) {
                check_hyper(self.core.name, "learning rate", lr, lr >= 0.0);
                self.core.lr = lr;
            }

            fn state_dict(&self) -> OptimizerState {
                self.core.state_dict()
            }

            fn load_state_dict(&mut self, state: &OptimizerState) -> Result<()> {
                self.core.load_state_dict(state)
            }
        }
    };
}

adam_type!(
    /// Adam with L2 weight decay added to the gradient (`torch.optim.Adam`, default weight decay 0).
    Adam,
    0.0,
    false
);

adam_type!(
    /// Adam with decoupled weight decay (`torch.optim.AdamW`, default weight decay 0.01): the parameter shrinks by
    /// `1 − lr·λ` before the Adam update, independently of the gradient's scale.
    AdamW,
    0.01,
    true
);
