//! The search loop: order candidates by score, verify and time the best few within a budget, pick the winner.
//!
//! Owns: the tuning mode knob (`KILN_AUTOTUNE`), its budgets, and the device-neutral loop. Deliberately not:
//! candidates, cost models, kernels or clocks. The caller passes closures that verify one config against a
//! reference and time one run of it, so the loop is deterministic given those closures and testable with fakes.

use std::collections::HashSet;
use std::sync::Once;
use std::time::Duration;

use crate::key::TuneKey;
use crate::record::{Trial, TuneRecord};

/// How hard a cold key is tuned (`KILN_AUTOTUNE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Trust the cost model: the best score wins, nothing runs.
    Off,
    /// Time the top 2 within 20 ms: a cold shape never blocks for long. The default.
    Fast,
    /// Time the top 5 within 1 s: for `kiln tune` and builds that ship a bundle.
    Full,
}

impl Mode {
    pub const VALID: &'static str = "off, fast, full";

    /// Reads `KILN_AUTOTUNE`; unset means `fast`. An unknown value warns once per process (naming the valid
    /// values) and falls back to `fast`: a typo must not stop a program, nor go unnoticed.
    pub fn from_env() -> Mode {
        let value = std::env::var("KILN_AUTOTUNE").ok();
        match value.as_deref().map(str::trim) {
            None | Some("") => Mode::Fast,
            Some(text) => Mode::parse(text).unwrap_or_else(|| {
                static WARNED: Once = Once::new();
                WARNED.call_once(|| {
                    eprintln!("kiln: KILN_AUTOTUNE={text:?} is not one of {}; using fast", Mode::VALID);
                });
                Mode::Fast
            }),
        }
    }

    /// `off`, `fast` or `full` (any case).
    pub fn parse(text: &str) -> Option<Mode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Mode::Off),
            "fast" => Some(Mode::Fast),
            "full" => Some(Mode::Full),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Fast => "fast",
            Mode::Full => "full",
        }
    }

    /// The per-key budget of this mode (for all candidates of the key together).
    pub fn budget(self) -> Budget {
        match self {
            Mode::Off => Budget { top_k: 1, warmup: 0, max_reps: 0, time_budget: Duration::ZERO },
            Mode::Fast => Budget { top_k: 2, warmup: 1, max_reps: 3, time_budget: Duration::from_millis(20) },
            Mode::Full => Budget { top_k: 5, warmup: 1, max_reps: 15, time_budget: Duration::from_secs(1) },
        }
    }
}

/// What one key may spend on timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// How many of the best-scored candidates are verified and timed.
    pub top_k: usize,
    /// Untimed runs before timing (caches, page faults, lazy JIT work).
    pub warmup: usize,
    /// At most this many timed runs per candidate; the median is kept.
    pub max_reps: usize,
    /// Total measured time for all candidates of the key together.
    pub time_budget: Duration,
}

/// One config to consider, with the cost model's score (higher is better).
pub struct Candidate<'a, C> {
    pub config: &'a C,
    pub name: String,
    pub score: f64,
    /// Candidates of one family share a structure the cost model may rank wrongly as a whole (packed or in-place
    /// operands, a library); the timed set takes the best of each family first, so one mis-modelled family cannot
    /// crowd the others out. Empty: no family.
    pub family: String,
}

/// Tunes one key with `mode`'s budget. See [`search_with_budget`].
pub fn search<C>(
    key: &TuneKey,
    tuned_dims: Vec<(String, u64)>,
    candidates: Vec<Candidate<'_, C>>,
    mode: Mode,
    verify: impl FnMut(&C) -> Result<(), String>,
    time_once: impl FnMut(&C) -> Result<Duration, String>,
) -> Result<TuneRecord, String> {
    search_with_budget(key, tuned_dims, candidates, mode, mode.budget(), verify, time_once)
}

/// Tunes one key with an explicit budget (e.g. `kiln tune` with a larger one).
///
/// Candidates are sorted by score, best first (stable: ties keep input order; NaN counts as worst). With
/// [`Mode::Off`] the best score wins and no closure is called. Otherwise each of the first `top_k` is verified
/// (a failure or error is recorded and it can never win), then run `warmup` times untimed, then timed until
/// `max_reps` or the budget is spent, and its median kept. The winner is the verified candidate with the lowest
/// median (ties: the better score). Every candidate appears in the record's trials.
///
/// Budget: it is charged with the durations `time_once` reports, warm-up runs included (not wall-clock, so the
/// result is deterministic given the closures; verification is not charged). Every timed candidate gets its
/// warm-up plus at least one timed rep. Once the budget is spent, later candidates are skipped ("not timed:
/// budget") — but only when a verified, timed candidate already exists, so an exhausted budget alone never makes a
/// key fail. `top_k` and `max_reps` below 1 are taken as 1 outside `Off`.
///
/// Errors: no candidates, duplicate names (the winner is named by its config name), or no candidate verified and
/// timed (the message lists every failure).
pub fn search_with_budget<C>(
    key: &TuneKey,
    tuned_dims: Vec<(String, u64)>,
    mut candidates: Vec<Candidate<'_, C>>,
    mode: Mode,
    budget: Budget,
    mut verify: impl FnMut(&C) -> Result<(), String>,
    mut time_once: impl FnMut(&C) -> Result<Duration, String>,
) -> Result<TuneRecord, String> {
    let what = format!("autotune {}", key.canonical());
    if candidates.is_empty() {
        return Err(format!("{what}: no candidates"));
    }
    let mut seen = HashSet::new();
    if let Some(dup) = candidates.iter().find(|c| !seen.insert(c.name.as_str())) {
        return Err(format!("{what}: two candidates are named {:?}", dup.name));
    }
    let rank = |c: &Candidate<'_, C>| if c.score.is_nan() { f64::NEG_INFINITY } else { c.score };
    candidates.sort_by(|a, b| rank(b).total_cmp(&rank(a)));

    let untimed = |c: &Candidate<'_, C>, note: String| Trial {
        config: c.name.clone(),
        score: c.score,
        time_ns: None,
        verified: None,
        note: Some(note),
    };
    let record = |winner: String, trials: Vec<Trial>| TuneRecord {
        key: key.clone(),
        winner,
        mode: mode.as_str().to_string(),
        tuned_dims: tuned_dims.clone(),
        trials,
    };

    if mode == Mode::Off {
        let trials = candidates.iter().map(|c| untimed(c, "not run: KILN_AUTOTUNE=off".to_string())).collect();
        return Ok(record(candidates[0].name.clone(), trials));
    }

    let top_k = budget.top_k.max(1);
    let max_reps = budget.max_reps.max(1);
    // The timed set: the best of each family (in score order), then the best remaining scores, `top_k` in all.
    let mut in_set = vec![false; candidates.len()];
    let mut families: Vec<&str> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        if families.len() < top_k && !c.family.is_empty() && !families.contains(&c.family.as_str()) {
            families.push(&c.family);
            in_set[i] = true;
        }
    }
    let mut taken = families.len();
    for flag in in_set.iter_mut() {
        if taken >= top_k {
            break;
        }
        if !*flag {
            *flag = true;
            taken += 1;
        }
    }
    let mut spent = Duration::ZERO;
    let mut best: Option<(Duration, usize)> = None;
    let mut failures = Vec::new();
    let mut trials = Vec::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        if !in_set[i] {
            trials.push(untimed(c, format!("not timed: outside top {top_k}")));
            continue;
        }
        if best.is_some() && spent >= budget.time_budget {
            trials.push(untimed(c, "not timed: budget".to_string()));
            continue;
        }
        let mut trial = untimed(c, String::new());
        if let Err(msg) = verify(c.config) {
            trial.verified = Some(false);
            trial.note = Some(format!("verification failed: {msg}"));
            failures.push(format!("{}: verification failed: {msg}", c.name));
            trials.push(trial);
            continue;
        }
        trial.verified = Some(true);
        match time_candidate(c.config, budget.warmup, max_reps, budget.time_budget, &mut spent, &mut time_once) {
            Ok((median, reps)) => {
                trial.time_ns = Some(u64::try_from(median.as_nanos()).unwrap_or(u64::MAX));
                trial.note = Some(format!("{reps} timed rep{}", if reps == 1 { "" } else { "s" }));
                if best.is_none_or(|(t, _)| median < t) {
                    best = Some((median, i));
                }
            }
            Err(msg) => {
                trial.note = Some(format!("timing failed: {msg}"));
                failures.push(format!("{}: timing failed: {msg}", c.name));
            }
        }
        trials.push(trial);
    }
    match best {
        Some((_, i)) => Ok(record(candidates[i].name.clone(), trials)),
        None => Err(format!("{what}: no candidate passed verification and timing ({})", failures.join("; "))),
    }
}

/// Warm-up, then timed reps until `max_reps` or the budget; returns the median (mean of the middle two for an
/// even count) and the number of timed reps. Charges every run to `spent`.
fn time_candidate<C>(
    config: &C,
    warmup: usize,
    max_reps: usize,
    time_budget: Duration,
    spent: &mut Duration,
    time_once: &mut impl FnMut(&C) -> Result<Duration, String>,
) -> Result<(Duration, usize), String> {
    for _ in 0..warmup {
        *spent += time_once(config)?;
    }
    let mut times = Vec::with_capacity(max_reps);
    while times.len() < max_reps {
        let t = time_once(config)?;
        *spent += t;
        times.push(t);
        if *spent >= time_budget {
            break;
        }
    }
    times.sort_unstable();
    let mid = times.len() / 2;
    let median = if times.len() % 2 == 1 { times[mid] } else { (times[mid - 1] + times[mid]) / 2 };
    Ok((median, times.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_name_themselves() {
        for m in [Mode::Off, Mode::Fast, Mode::Full] {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        assert_eq!(Mode::parse(" FULL "), Some(Mode::Full));
        assert_eq!(Mode::parse("fastest"), None);
        assert_eq!(Mode::Fast.budget().top_k, 2);
        assert_eq!(Mode::Full.budget().time_budget, Duration::from_secs(1));
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        let mut spent = Duration::ZERO;
        let mut times = [5u64, 1, 3, 100].into_iter().map(Duration::from_nanos);
        let mut next = |_: &()| times.next().ok_or_else(|| "out of fake times".to_string());
        let m = time_candidate(&(), 0, 3, Duration::from_secs(1), &mut spent, &mut next);
        assert_eq!(m, Ok((Duration::from_nanos(3), 3)));
        assert_eq!(spent, Duration::from_nanos(9));
        let m =
            time_candidate(&(), 0, 2, Duration::from_secs(1), &mut spent, &mut |_: &()| Ok(Duration::from_nanos(10)));
        assert_eq!(m, Ok((Duration::from_nanos(10), 2)));
    }
}
