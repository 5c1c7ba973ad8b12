//! An optimizer's state as a value (PyTorch's `optimizer.state_dict()`): what a checkpoint needs so that training
//! resumed in a fresh process continues exactly where it stopped, bit for bit (`tests/optim_state.rs`).
//!
//! `Optimizer::state_dict` returns an [`OptimizerState`]: the optimizer's kind, its hyperparameters (the learning
//! rate a schedule has moved included) and, per parameter, its step count and state tensors under PyTorch's names
//! (`momentum_buffer`; `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`). `load_state_dict` takes one back. As in PyTorch
//! the saved hyperparameters replace the optimizer's own; the parameters themselves are the module's business
//! (`save_module` / `load_module`). `kiln::save_optimizer` / `load_optimizer` put the state in a safetensors file
//! (`io.rs` describes the layout).
//!
//! Loading checks everything before it changes anything, like `load_module`: the kind, the number of parameters,
//! every hyperparameter (present, in range, no unknown names), and every parameter's tensors (exactly the set its
//! step count implies, each of the parameter's shape). All problems are reported in one `Error::OptimizerState`.
//! A tensor of another dtype is converted to the parameter's, and every tensor is placed on its parameter's device.
//!
//! Parameter groups are part of the hyperparameters (`groups`, then `group.{g}.params` and each group's overrides):
//! the grouping itself comes from how the optimizer was built and must match, the overrides are restored.
//!
//! Deliberately not done: PyTorch's pickled `.pt` optimizer files (the state is the same; a script converting one
//! to these names is a few lines of Python).

use super::master::{MASTER, Masters};
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::tensor::Tensor;
use kiln_jit::HostBuffer;
use std::collections::{BTreeMap, BTreeSet};

/// An optimizer's complete state. Holding one keeps the optimizer's current state tensors alive, so the next step
/// writes new buffers instead of updating them in place (with the same values): drop it once saved.
#[derive(Clone, Debug)]
pub struct OptimizerState {
    /// Which optimizer wrote it: `Sgd`, `Adam` or `AdamW`. Loading into another kind is refused.
    pub kind: String,
    /// Hyperparameters under PyTorch's names (`lr`, `momentum`, `weight_decay`, ...; `betas` as `beta1` and
    /// `beta2`); on/off settings (`nesterov`, `amsgrad`, `maximize`) as 0 or 1.
    pub hyper: BTreeMap<String, f64>,
    /// One entry per parameter, in the optimizer's `params()` order.
    pub params: Vec<ParamState>,
}

/// One parameter's optimizer state.
#[derive(Clone, Debug, Default)]
pub struct ParamState {
    /// Steps this parameter has taken (Adam's bias corrections depend on it; SGD keeps no count: 0).
    pub step: u64,
    /// State tensors by name (with `master_param`, the f32 value of a parameter with a master copy); empty before
    /// the parameter's first step.
    pub tensors: BTreeMap<String, Tensor>,
}

/// Checks an `OptimizerState` against the optimizer loading it, collecting every problem before anything changes.
pub(super) struct Check<'a> {
    state: &'a OptimizerState,
    kind: &'static str,
    read: BTreeSet<String>,
    problems: Vec<String>,
}

impl<'a> Check<'a> {
    /// Starts a check: the kind and the number of parameters must match.
    pub(super) fn new(state: &'a OptimizerState, kind: &'static str, params: &[Param]) -> Check<'a> {
        let mut problems = Vec::new();
        if state.kind != kind {
            problems.push(format!("it is the state of {}, not of {kind}", state.kind));
        }
        if state.params.len() != params.len() {
            problems.push(format!("it has {} parameters, the optimizer {}", state.params.len(), params.len()));
        }
        Check { state, kind, read: BTreeSet::new(), problems }
    }

    /// The hyperparameter `name`, which must satisfy `ok` (`what` says how, for the message). Missing or out of
    /// range: a problem, and 0 is returned (never used: `finish` then fails).
    pub(super) fn value(&mut self, name: &str, what: &str, ok: impl Fn(f64) -> bool) -> f64 {
        self.read.insert(name.to_string());
        match self.state.hyper.get(name) {
            Some(&v) if ok(v) => v,
            Some(&v) => {
                self.problems.push(format!("{name} = {v} is invalid ({what})"));
                0.0
            }
            None => {
                self.problems.push(format!("missing hyperparameter {name}"));
                0.0
            }
        }
    }

    /// An optional hyperparameter: `None` when absent, else as `value`.
    pub(super) fn optional(&mut self, name: &str, what: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
        if self.state.hyper.contains_key(name) { Some(self.value(name, what, ok)) } else { None }
    }

    /// Records a problem the caller found (a combination of hyperparameters the optimizer refuses).
    pub(super) fn problem(&mut self, message: String) {
        self.problems.push(message);
    }

    /// An on/off hyperparameter: 0 or 1.
    pub(super) fn flag(&mut self, name: &str) -> bool {
        self.value(name, "0 or 1", |v| v == 0.0 || v == 1.0) == 1.0
    }

    /// The state tensors of parameter `i`, which must be exactly `names` (in that order in the result) when
    /// `present`, and none otherwise, each shaped like the parameter, converted to `dtype` (the parameter's, or f32
    /// for a parameter with a master copy). The step count must satisfy `step_ok`. `None` when absent or on a
    /// problem. A master copy (`master_param`) is read apart, by [`Check::master`].
    pub(super) fn tensors(
        &mut self,
        i: usize,
        param: &Tensor,
        dtype: kiln_jit::DType,
        names: &[&str],
        present: bool,
        step_ok: impl Fn(u64) -> bool,
    ) -> Option<Vec<HostBuffer>> {
        let s = self.state.params.get(i)?;
        if !step_ok(s.step) {
            self.problems.push(format!("parameter {i}: step count {} does not fit its state", s.step));
            return None;
        }
        let have: Vec<&str> = s.tensors.keys().map(String::as_str).filter(|&n| n != super::master::MASTER).collect();
        let want: Vec<&str> = if present {
            let mut w = names.to_vec();
            w.sort_unstable();
            w
        } else {
            Vec::new()
        };
        if have != want {
            self.problems.push(format!("parameter {i}: state tensors {have:?}, expected {want:?}"));
            return None;
        }
        if !present {
            return None;
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            out.push(self.read_tensor(i, name, &s.tensors[*name], param, dtype)?);
        }
        Some(out)
    }

    /// Parameter `i`'s master copy (`master_param`, f32, shaped like the parameter) if the state has one and
    /// `wanted` (the optimizer keeps masters and the parameter is f16 or bf16); one it does not want is a problem.
    pub(super) fn master(&mut self, i: usize, param: &Tensor, wanted: bool) -> Option<HostBuffer> {
        let t = self.state.params.get(i)?.tensors.get(super::master::MASTER)?;
        if !wanted {
            let why = "the optimizer keeps no master copy for it (master_weights off, or not an f16/bf16 parameter)";
            self.problems.push(format!("parameter {i}: `{}`: {why}", super::master::MASTER));
            return None;
        }
        self.read_tensor(i, super::master::MASTER, t, param, kiln_jit::DType::F32)
    }

    /// State tensor `name` of parameter `i`, checked against the parameter's shape and converted to `dtype`.
    fn read_tensor(
        &mut self,
        i: usize,
        name: &str,
        t: &Tensor,
        param: &Tensor,
        dtype: kiln_jit::DType,
    ) -> Option<HostBuffer> {
        if t.dims() != param.dims() {
            self.problems.push(format!(
                "parameter {i}: `{name}` has shape {:?}, the parameter {:?}",
                t.dims(),
                param.dims()
            ));
            return None;
        }
        match t.to_host() {
            Ok(host) if host.dtype() == dtype => Some(host),
            Ok(host) if dtype.is_float() => Some(HostBuffer::from_f64(dtype, &host.to_f64())),
            Ok(host) => Some(HostBuffer::from_i64(dtype, &host.to_i64())),
            Err(e) => {
                self.problems.push(format!("parameter {i}: `{name}` could not be read: {e}"));
                None
            }
        }
    }

    /// Fails with every problem found, unknown hyperparameters included.
    /// For each of `params` of an optimizer whose state starts at a parameter's first step (Adam, RMSprop,
    /// Adagrad): its step count and its `names` tensors (present once it has stepped), and its master copy, read now
    /// and uploaded by [`upload_stepped`] once [`Check::finish`] has passed.
    pub(super) fn stepped(&mut self, params: &[Param], masters: &Masters, names: &[&str]) -> Vec<Stepped> {
        let mut found = Vec::with_capacity(params.len());
        for (i, param) in params.iter().enumerate() {
            let p = param.get();
            let step = self.state.params.get(i).map_or(0, |s| s.step);
            let master = self.master(i, &p, masters.wants(&p));
            let tensors = self.tensors(i, &p, masters.state_dtype(&p), names, step > 0, |_| true);
            found.push((tensors.map(|data| (step, data)), master));
        }
        found
    }

    pub(super) fn finish(mut self) -> Result<()> {
        let unknown: Vec<&String> = self.state.hyper.keys().filter(|k| !self.read.contains(*k)).collect();
        if !unknown.is_empty() {
            self.problems.push(format!("unknown hyperparameters {unknown:?}"));
        }
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(Error::OptimizerState { kind: self.kind, problems: self.problems })
        }
    }
}

/// The state of an optimizer of `kind` over `n` parameters: its hyperparameters `hyper` (flags as [`flag`]; with
/// `master_weights` 1 where `masters` are on), its `groups`, and per parameter `i` the step count and named state
/// tensors `per_param(i)` gives, followed by its master copy (`None`: no state, as before its first step).
pub(super) fn state_of<'a>(
    kind: &str,
    hyper: &[(&str, f64)],
    groups: &super::groups::Groups,
    masters: &'a Masters,
    n: usize,
    per_param: impl Fn(usize) -> Option<(u64, Vec<(&'static str, &'a Tensor)>)>,
) -> OptimizerState {
    let mut map: BTreeMap<String, f64> = hyper.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    if masters.on {
        map.insert("master_weights".to_string(), 1.0);
    }
    groups.write(&mut map);
    let params = (0..n)
        .map(|i| match per_param(i) {
            None => ParamState::default(),
            Some((step, tensors)) => {
                let all = tensors.into_iter().chain(masters.get(i).map(|m| (MASTER, m)));
                ParamState { step, tensors: all.map(|(name, t)| (name.to_string(), t.clone())).collect() }
            }
        })
        .collect();
    OptimizerState { kind: kind.to_string(), hyper: map, params }
}

/// Uploads `data` to `param`'s device, shaped like it.
pub(super) fn upload(data: HostBuffer, param: &Tensor) -> Result<Tensor> {
    Tensor::from_host(data, param.shape().clone(), &param.device())
}

/// One parameter's state as [`Check::stepped`] read it: (step count, tensors in `names` order) once it has
/// stepped, and its master copy.
pub(super) type Stepped = (Option<(u64, Vec<HostBuffer>)>, Option<HostBuffer>);

/// A parameter's step count and state tensors, once it has stepped.
pub(super) type StepState = Option<(u64, Vec<Tensor>)>;

/// Uploads what [`Check::stepped`] read next to `params`: each parameter's step count and state tensors (in the
/// `names` order), its master copy set in `masters`.
pub(super) fn upload_stepped(read: Vec<Stepped>, params: &[Param], masters: &mut Masters) -> Result<Vec<StepState>> {
    let mut states = Vec::with_capacity(read.len());
    for (i, (found, master)) in read.into_iter().enumerate() {
        let p = params[i].get();
        masters.set(i, master.map(|data| upload(data, &p)).transpose()?);
        states.push(match found {
            Some((step, data)) => Some((step, data.into_iter().map(|d| upload(d, &p)).collect::<Result<Vec<_>>>()?)),
            None => None,
        });
    }
    Ok(states)
}

/// 1 or 0, for an on/off hyperparameter.
pub(super) fn flag(on: bool) -> f64 {
    if on { 1.0 } else { 0.0 }
}
