//! Learning-rate schedules (`torch.optim.lr_scheduler`) as functions of the step: before step `t`, call
//! `opt.set_lr(schedule.lr(t))`. The learning rate is a run-time input of the step's plan, so a schedule never
//! recompiles anything.
//!
//! Each schedule is PyTorch's closed form (`_get_closed_form_lr`), not its chained per-step update: `lr(t)` needs no
//! history, so a resumed run asks for step `t` directly. The values equal PyTorch's to ~1e-15 relative (its chained
//! form rounds differently: `ExponentialLR` gives 0.09000000000000001 where `0.1 * 0.9` is 0.09);
//! `tests/optim.rs` compares them with values printed by `tests/fixtures/lr_schedules.py`.
//!
//! Deliberately not done: `ReduceLROnPlateau` (it needs the loss on the host every step, which a lazy step does not
//! have unless the user asks for it: compute it yourself from the realized loss and call `set_lr`), `OneCycleLR`
//! and `CyclicLR` (compositions of the ones here through `Sequential` or a closure).

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
