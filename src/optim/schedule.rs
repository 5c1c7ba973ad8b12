//! Learning-rate schedules (`torch.optim.lr_scheduler`) as functions of the step: before step `t`, call
//! `opt.set_lr(schedule.lr(t))`. The learning rate is a run-time input of the step's plan, so a schedule never
//! recompiles anything.
//!
//! Each schedule is PyTorch's closed form (`_get_closed_form_lr`), not its chained per-step update: `lr(t)` needs no
//! history, so a resumed run asks for step `t` directly. The values equal PyTorch's to ~1e-15 relative (its chained
//! form rounds differently: `ExponentialLR` gives 0.09000000000000001 where `0.1 * 0.9` is 0.09);
//! `tests/optim.rs` compares them with values printed by `tests/fixtures/lr_schedules.py`.
//!
//! One schedule is not a function of the step: [`ReduceLrOnPlateau`] (`ReduceLROnPlateau`) follows a metric the
//! program reads back (a validation loss, `loss.item()`), and gives the rate to set after each value.
//!
//! Deliberately not done: `CyclicLR` (a composition of the ones here through `Sequential` or a closure), and
//! `OneCycleLR`'s momentum cycling (a schedule here sets the learning rate only).

use crate::args::fail;
use std::f64::consts::PI;

/// A learning rate for every step (0-based: the rate of the first step is `lr(0)`).
pub trait LrSchedule: Send + Sync {
    fn lr(&self, step: u64) -> f64;
}

/// Any `Fn(step) -> lr` is a schedule (`LambdaLR` with the base rate folded in).
impl<F: Fn(u64) -> f64 + Send + Sync> LrSchedule for F {
    fn lr(&self, step: u64) -> f64 {
        self(step)
    }
}

/// `base · gamma^⌊t / step_size⌋` (`StepLR`).
#[derive(Clone, Copy, Debug)]
pub struct StepLr {
    base: f64,
    step_size: u64,
    gamma: f64,
}

impl StepLr {
    #[track_caller]
    pub fn new(base: f64, step_size: u64, gamma: f64) -> StepLr {
        if step_size == 0 {
            fail!("StepLr", "step_size must be at least 1");
        }
        StepLr { base, step_size, gamma }
    }
}

impl LrSchedule for StepLr {
    fn lr(&self, step: u64) -> f64 {
        self.base * self.gamma.powf((step / self.step_size) as f64)
    }
}

/// `base · gamma^t` (`ExponentialLR`).
#[derive(Clone, Copy, Debug)]
pub struct ExponentialLr {
    base: f64,
    gamma: f64,
}

impl ExponentialLr {
    pub fn new(base: f64, gamma: f64) -> ExponentialLr {
        ExponentialLr { base, gamma }
    }
}

impl LrSchedule for ExponentialLr {
    fn lr(&self, step: u64) -> f64 {
        self.base * self.gamma.powf(step as f64)
    }
}

/// `eta_min + (base − eta_min)(1 + cos(π t / t_max)) / 2` (`CosineAnnealingLR`): from `base` down to `eta_min` at
/// `t_max`, then back up, periodically, as PyTorch's closed form does.
#[derive(Clone, Copy, Debug)]
pub struct CosineAnnealingLr {
    base: f64,
    t_max: u64,
    eta_min: f64,
}

impl CosineAnnealingLr {
    #[track_caller]
    pub fn new(base: f64, t_max: u64, eta_min: f64) -> CosineAnnealingLr {
        if t_max == 0 {
            fail!("CosineAnnealingLr", "t_max must be at least 1");
        }
        CosineAnnealingLr { base, t_max, eta_min }
    }
}

impl LrSchedule for CosineAnnealingLr {
    fn lr(&self, step: u64) -> f64 {
        let phase = PI * step as f64 / self.t_max as f64;
        self.eta_min + (self.base - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
}

/// `base · (start + (end − start) · min(t, total) / total)` (`LinearLR`): a linear warm-up (or decay) of the factor
/// over `total` steps, then constant.
#[derive(Clone, Copy, Debug)]
pub struct LinearLr {
    base: f64,
    start_factor: f64,
    end_factor: f64,
    total: u64,
}

impl LinearLr {
    #[track_caller]
    pub fn new(base: f64, start_factor: f64, end_factor: f64, total: u64) -> LinearLr {
        if total == 0 {
            fail!("LinearLr", "total must be at least 1");
        }
        let ok = start_factor > 0.0 && start_factor <= 1.0 && (0.0..=1.0).contains(&end_factor);
        if !ok {
            fail!(
                "LinearLr",
                "start_factor must be in (0, 1] and end_factor in [0, 1] (got {start_factor}, {end_factor})"
            );
        }
        LinearLr { base, start_factor, end_factor, total }
    }
}

impl LrSchedule for LinearLr {
    fn lr(&self, step: u64) -> f64 {
        let done = step.min(self.total) as f64 / self.total as f64;
        self.base * (self.start_factor + (self.end_factor - self.start_factor) * done)
    }
}

/// Schedules one after another (`SequentialLR`): schedule `i + 1` takes over at `milestones[i]` and counts its
/// steps from there. Warm-up then cosine decay:
/// ```
/// use kiln::optim::schedule::{CosineAnnealingLr, LinearLr, LrSchedule, Sequential};
/// let s = Sequential::new(vec![Box::new(LinearLr::new(0.1, 0.1, 1.0, 3)), Box::new(CosineAnnealingLr::new(0.1, 5, 0.0))], vec![3]);
/// assert_eq!(s.lr(3), 0.1);
/// ```
pub struct Sequential {
    parts: Vec<Box<dyn LrSchedule>>,
    milestones: Vec<u64>,
}

impl Sequential {
    #[track_caller]
    pub fn new(parts: Vec<Box<dyn LrSchedule>>, milestones: Vec<u64>) -> Sequential {
        if parts.len() != milestones.len() + 1 {
            fail!(
                "Sequential",
                "{} schedules need {} milestones (got {})",
                parts.len(),
                parts.len().saturating_sub(1),
                milestones.len()
            );
        }
        if milestones.windows(2).any(|w| w[0] >= w[1]) {
            fail!("Sequential", "milestones must increase (got {milestones:?})");
        }
        Sequential { parts, milestones }
    }
}

impl LrSchedule for Sequential {
    fn lr(&self, step: u64) -> f64 {
        let i = self.milestones.iter().take_while(|&&m| m <= step).count();
        let start = if i == 0 { 0 } else { self.milestones[i - 1] };
        self.parts[i].lr(step - start)
    }
}

/// How [`OneCycleLr`] moves between two rates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Anneal {
    /// Half a cosine period (`anneal_strategy='cos'`, the default).
    #[default]
    Cos,
    /// A straight line (`'linear'`).
    Linear,
}

/// The 1cycle policy (`OneCycleLR`, the learning rate only): from `max_lr / div_factor` up to `max_lr` over the
/// first `pct_start` of `total_steps`, then down to `max_lr / div_factor / final_div_factor` (with `three_phase`:
/// back down to the start rate over as many steps, then to the final one). PyTorch's phases and formulas, so the
/// rates equal its own; past `total_steps` the rate stays at step `total_steps`'s (PyTorch raises there).
#[derive(Clone, Copy, Debug)]
pub struct OneCycleLr {
    max_lr: f64,
    total_steps: u64,
    pct_start: f64,
    anneal: Anneal,
    div_factor: f64,
    final_div_factor: f64,
    three_phase: bool,
}

impl OneCycleLr {
    /// PyTorch's defaults: `pct_start` 0.3, cosine, `div_factor` 25, `final_div_factor` 1e4, two phases.
    #[track_caller]
    pub fn new(max_lr: f64, total_steps: u64) -> OneCycleLr {
        if total_steps == 0 {
            fail!("OneCycleLr", "total_steps must be at least 1");
        }
        OneCycleLr {
            max_lr,
            total_steps,
            pct_start: 0.3,
            anneal: Anneal::Cos,
            div_factor: 25.0,
            final_div_factor: 1e4,
            three_phase: false,
        }
    }

    /// The share of the steps spent rising, in `[0, 1]`.
    #[track_caller]
    pub fn pct_start(mut self, pct_start: f64) -> Self {
        if !(0.0..=1.0).contains(&pct_start) {
            fail!("OneCycleLr", "pct_start must be in [0, 1], got {pct_start}");
        }
        self.pct_start = pct_start;
        self
    }

    pub fn anneal(mut self, anneal: Anneal) -> Self {
        self.anneal = anneal;
        self
    }

    /// The start rate is `max_lr / div_factor`.
    pub fn div_factor(mut self, div_factor: f64) -> Self {
        self.div_factor = div_factor;
        self
    }

    /// The final rate is the start rate divided by this.
    pub fn final_div_factor(mut self, final_div_factor: f64) -> Self {
        self.final_div_factor = final_div_factor;
        self
    }

    /// Three phases: up, back down to the start rate, then to the final rate.
    pub fn three_phase(mut self, three_phase: bool) -> Self {
        self.three_phase = three_phase;
        self
    }

    fn anneal_between(&self, start: f64, end: f64, pct: f64) -> f64 {
        match self.anneal {
            Anneal::Cos => end + (start - end) / 2.0 * ((PI * pct).cos() + 1.0),
            Anneal::Linear => (end - start) * pct + start,
        }
    }
}

impl LrSchedule for OneCycleLr {
    fn lr(&self, step: u64) -> f64 {
        let initial = self.max_lr / self.div_factor;
        let min = initial / self.final_div_factor;
        let total = self.total_steps as f64;
        let rise = self.pct_start * total - 1.0;
        // (the step a phase ends at, its start rate, its end rate)
        let phases: Vec<(f64, f64, f64)> = if self.three_phase {
            vec![
                (rise, initial, self.max_lr),
                (2.0 * self.pct_start * total - 2.0, self.max_lr, initial),
                (total - 1.0, initial, min),
            ]
        } else {
            vec![(rise, initial, self.max_lr), (total - 1.0, self.max_lr, min)]
        };
        let t = step.min(self.total_steps) as f64;
        let mut start_step = 0.0;
        for (i, &(end_step, start, end)) in phases.iter().enumerate() {
            if t <= end_step || i == phases.len() - 1 {
                let pct = (t - start_step) / (end_step - start_step);
                return self.anneal_between(start, end, pct);
            }
            start_step = end_step;
        }
        unreachable!("the last phase takes every step")
    }
}

/// Whether [`ReduceLrOnPlateau`]'s metric improves downwards (a loss) or upwards (an accuracy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlateauMode {
    Min,
    Max,
}

/// `ReduceLROnPlateau`: the rate is multiplied by `factor` (not below `min_lr`) once the metric has not improved
/// for more than `patience` steps in a row, then left alone for `cooldown` steps. An improvement beats the best
/// value so far by more than `threshold`: relative by default (`best * (1 - threshold)` in `Min` mode), absolute
/// with [`ReduceLrOnPlateau::threshold_abs`]. A reduction smaller than `eps` is skipped. A NaN metric never
/// improves. PyTorch's defaults and its exact rule (`tests/optim.rs` holds it to PyTorch's rates):
/// ```
/// use kiln::optim::schedule::{PlateauMode, ReduceLrOnPlateau};
/// let mut plateau = ReduceLrOnPlateau::new(0.1, PlateauMode::Min).factor(0.5).patience(1);
/// let rates: Vec<f64> = [1.0, 0.9, 0.9, 0.9].iter().map(|&loss| plateau.step(loss)).collect();
/// assert_eq!(rates, [0.1, 0.1, 0.1, 0.05]); // then `opt.set_lr(rate)` before the next step
/// ```
#[derive(Clone, Debug)]
pub struct ReduceLrOnPlateau {
    lr: f64,
    mode: PlateauMode,
    factor: f64,
    patience: u64,
    threshold: f64,
    relative: bool,
    cooldown: u64,
    min_lr: f64,
    eps: f64,
    best: f64,
    bad_steps: u64,
    cooldown_left: u64,
}

impl ReduceLrOnPlateau {
    /// Starting at rate `lr`, with PyTorch's defaults: factor 0.1, patience 10, relative threshold 1e-4, no
    /// cooldown, `min_lr` 0, eps 1e-8.
    pub fn new(lr: f64, mode: PlateauMode) -> ReduceLrOnPlateau {
        let best = match mode {
            PlateauMode::Min => f64::INFINITY,
            PlateauMode::Max => f64::NEG_INFINITY,
        };
        ReduceLrOnPlateau {
            lr,
            mode,
            factor: 0.1,
            patience: 10,
            threshold: 1e-4,
            relative: true,
            cooldown: 0,
            min_lr: 0.0,
            eps: 1e-8,
            best,
            bad_steps: 0,
            cooldown_left: 0,
        }
    }

    /// The rate's multiplier at a reduction; must be below 1.
    #[track_caller]
    pub fn factor(mut self, factor: f64) -> Self {
        if factor >= 1.0 || factor.is_nan() {
            fail!("ReduceLrOnPlateau", "factor must be below 1.0 (got {factor})");
        }
        self.factor = factor;
        self
    }

    /// Steps without improvement tolerated before a reduction.
    pub fn patience(mut self, patience: u64) -> Self {
        self.patience = patience;
        self
    }

    /// The relative margin an improvement needs (`threshold_mode="rel"`).
    pub fn threshold(mut self, threshold: f64) -> Self {
        (self.threshold, self.relative) = (threshold, true);
        self
    }

    /// An absolute margin instead (`threshold_mode="abs"`).
    pub fn threshold_abs(mut self, threshold: f64) -> Self {
        (self.threshold, self.relative) = (threshold, false);
        self
    }

    /// Steps after a reduction during which bad steps are not counted.
    pub fn cooldown(mut self, cooldown: u64) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The lowest rate a reduction goes to.
    pub fn min_lr(mut self, min_lr: f64) -> Self {
        self.min_lr = min_lr;
        self
    }

    /// A reduction by less than this is skipped.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Takes the metric of the step just done and returns the rate for the next one.
    pub fn step(&mut self, metric: f64) -> f64 {
        if self.improves(metric) {
            (self.best, self.bad_steps) = (metric, 0);
        } else {
            self.bad_steps += 1;
        }
        if self.cooldown_left > 0 {
            self.cooldown_left -= 1;
            self.bad_steps = 0;
        }
        if self.bad_steps > self.patience {
            let reduced = (self.lr * self.factor).max(self.min_lr);
            if self.lr - reduced > self.eps {
                self.lr = reduced;
            }
            (self.cooldown_left, self.bad_steps) = (self.cooldown, 0);
        }
        self.lr
    }

    /// The current rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// The best metric so far (infinite before the first step).
    pub fn best(&self) -> f64 {
        self.best
    }

    fn improves(&self, metric: f64) -> bool {
        let (t, best) = (self.threshold, self.best);
        match (self.mode, self.relative) {
            (PlateauMode::Min, true) => metric < best * (1.0 - t),
            (PlateauMode::Min, false) => metric < best - t,
            (PlateauMode::Max, true) => metric > best * (t + 1.0),
            (PlateauMode::Max, false) => metric > best + t,
        }
    }
}
