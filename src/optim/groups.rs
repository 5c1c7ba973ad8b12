//! Parameter groups (PyTorch's `param_groups`): parameters of one optimizer that take their learning rate or
//! weight decay from the group instead of the optimizer, e.g. AdamW without weight decay on biases and norms:
//! ```
//! # #[cfg(feature = "cpu")] {
//! use kiln::nn::{Linear, Module};
//! use kiln::optim::{AdamW, GroupOptions, Optimizer};
//! let dev = kiln::Device::cpu();
//! let fc = Linear::new(8, 4, true, &dev);
//! let (weights, biases) = fc.named_params().into_iter().partition::<Vec<_>, _>(|(n, _)| n.ends_with("weight"));
//! let strip = |v: Vec<(String, kiln::nn::Param)>| v.into_iter().map(|(_, p)| p).collect::<Vec<_>>();
//! let opt = AdamW::new(strip(weights), 1e-3)
//!     .weight_decay(0.05)
//!     .group(strip(biases), GroupOptions { weight_decay: Some(0.0), ..Default::default() });
//! assert_eq!(opt.params().len(), 2);
//! # }
//! ```
//! All groups step together, in the one graph of `step`. A group scales the optimizer's learning rate
//! (`lr_scale`) rather than fixing its own, so `set_lr` (a schedule) moves every group, as PyTorch's schedulers
//! scale each group's initial rate.
//!
//! Deliberately not done: per-group momentum, betas, eps, dampening or flags (rarely varied; one optimizer per
//! such setting is not possible either, since `step` consumes the gradients, so say so if a model needs it).

use super::state::Check;
use crate::args::fail;
use crate::nn::Param;
use std::collections::BTreeMap;

/// What a parameter group sets for itself; `None` takes the optimizer's value.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupOptions {
    /// The group's learning rate is the optimizer's times this (`set_lr` keeps the ratio).
    pub lr_scale: Option<f64>,
    /// The group's weight decay (for `Sgd` and `Adam` an L2 penalty, for `AdamW` decoupled).
    pub weight_decay: Option<f64>,
}

/// Which group each parameter is in. Group 0 is the parameters given to `new` (no overrides).
#[derive(Clone, Debug)]
pub(super) struct Groups {
    options: Vec<GroupOptions>,
    of: Vec<usize>,
}

impl Groups {
    /// `n` parameters, all in group 0.
    pub(super) fn new(n: usize) -> Groups {
        Groups { options: vec![GroupOptions::default()], of: vec![0; n] }
    }

    /// Appends a group: its parameters go to the end of `params`. A parameter already in the optimizer is a
    /// programmer error (PyTorch: "some parameters appear in more than one parameter group").
    #[track_caller]
    pub(super) fn add(&mut self, name: &str, params: &mut Vec<Param>, new: Vec<Param>, options: GroupOptions) {
        if let Some(s) = options.lr_scale
            && !(s.is_finite() && s >= 0.0)
        {
            fail!(name, "invalid group lr_scale: {s}");
        }
        if let Some(wd) = options.weight_decay
            && (wd.is_nan() || wd < 0.0)
        {
            fail!(name, "invalid group weight_decay value: {wd}");
        }
        let group = self.options.len();
        self.options.push(options);
        for p in super::dedup(new) {
            if params.iter().any(|q| q.ptr_eq(&p)) {
                fail!(name, "parameter `{}` appears in more than one parameter group", p.name());
            }
            params.push(p);
            self.of.push(group);
        }
    }

    /// The group of parameter `i`.
    pub(super) fn of(&self, i: usize) -> usize {
        self.of[i]
    }

    /// Parameter `i`'s learning rate, from the optimizer's.
    pub(super) fn lr(&self, i: usize, lr: f64) -> f64 {
        self.options[self.of[i]].lr_scale.map_or(lr, |s| lr * s)
    }

    /// Parameter `i`'s weight decay, from the optimizer's.
    pub(super) fn weight_decay(&self, i: usize, weight_decay: f64) -> f64 {
        self.options[self.of[i]].weight_decay.unwrap_or(weight_decay)
    }

    /// The groups as state entries: `groups` (how many), and per group `g >= 1` its size and overrides.
    pub(super) fn write(&self, hyper: &mut BTreeMap<String, f64>) {
        hyper.insert("groups".into(), self.options.len() as f64);
        for (g, o) in self.options.iter().enumerate().skip(1) {
            hyper.insert(format!("group.{g}.params"), self.of.iter().filter(|&&x| x == g).count() as f64);
            if let Some(s) = o.lr_scale {
                hyper.insert(format!("group.{g}.lr_scale"), s);
            }
            if let Some(wd) = o.weight_decay {
                hyper.insert(format!("group.{g}.weight_decay"), wd);
            }
        }
    }

    /// Reads groups written by `write` back: the same number of groups of the same sizes (the grouping is the
    /// optimizer's construction, not state), with the overrides of the state.
    pub(super) fn read(&self, check: &mut Check) -> Groups {
        let count =
            check.value("groups", "the optimizer's number of parameter groups", |v| v == self.options.len() as f64);
        let mut out = self.clone();
        if count as usize != self.options.len() {
            return out;
        }
        for g in 1..self.options.len() {
            let size = self.of.iter().filter(|&&x| x == g).count() as f64;
            check.value(&format!("group.{g}.params"), "that group's size in the optimizer", |v| v == size);
            let lr_scale =
                check.optional(&format!("group.{g}.lr_scale"), "finite, >= 0", |s| s.is_finite() && s >= 0.0);
            let weight_decay = check.optional(&format!("group.{g}.weight_decay"), ">= 0", |v| v >= 0.0);
            out.options[g] = GroupOptions { lr_scale, weight_decay };
        }
        out
    }
}
