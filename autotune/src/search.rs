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

/// How hard a cold key is tuned (`KILN_AUTOTUNE`). Ordered by thoroughness (`Off < Fast < Full`): a stored record
/// serves a lookup in its own mode or a lighter one, and a more thorough mode searches the key again and replaces
/// the record ([`TuneRecord::serves`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Trust the cost model: the best score wins, nothing runs.
    Off,
    /// Time the top 2 within 20 ms: a cold shape never blocks for long. The default. No warm-up run: each
    /// candidate's verification, a full run on the same buffers just before the race, already pays its first-run
    /// costs (page faults, lazy code mapping), and a cold first step is what this mode is for. A backend may time
    /// a smaller problem of the same key here (the CPU GEMM does when one run of the canonical problem would
    /// cost more than ~1 ms: see `kiln-backends`' `cpu/gemm/tune.rs`); the record's `tuned_dims` say so.
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
            Mode::Fast => Budget { top_k: 2, warmup: 0, max_reps: 3, time_budget: Duration::from_millis(20) },
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
    /// The coarsest structural trait the cost model is least able to rank (the CPU GEMM's: a generated kernel's
    /// instruction set where the model prices them alike, its register tile where the host's measured peaks already
    /// rank the instruction sets). The timed set takes the best of each group first, then of each family. Empty: no
    /// group.
    pub group: String,
    /// Candidates of one family share a structure the cost model may rank wrongly as a whole (packed or in-place
    /// operands, a library); the timed set takes the best of each family first (after the groups), so one
    /// mis-modelled family cannot crowd the others out. Empty: no family.
    pub family: String,
    /// A second structural trait within families (a GEMM's register tile): the timed slots left after the families
    /// take the best of each shape not yet timed first, then the best scores. Empty: no shape.
    pub shape: String,
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

/// Timed medians within this fraction of the fastest are a tie, which the better score wins: run-to-run noise on
/// a shared host is a few per cent, and a "winner" by less is as likely noise as signal. Ties going to the model
/// keep the default (best-scored) config unless a challenger is measurably faster.
pub const TIE_MARGIN: f64 = 0.03;

/// Tunes one key with an explicit budget (e.g. `kiln tune` with a larger one).
///
/// Candidates are sorted by score, best first (stable: ties keep input order; NaN counts as worst). With
/// [`Mode::Off`] the best score wins and no closure is called. Otherwise the timed set is the first `top_k` (the
/// best of each group first, then of each family and shape: `timed_set`); each is verified (a failure or error is
/// recorded and it can never win), then run `warmup` times untimed, then the survivors are timed **round-robin**:
/// one rep of each per round, the order rotated every round, until `max_reps` rounds or the budget is spent.
/// Interleaving is the point: timing one candidate's reps back to back lets a burst of host noise (a neighbour's
/// job, two vCPUs put on one core) land on one candidate alone and crown the wrong one; interleaved, the noise hits
/// all of them alike. The best score is always in the set, so the untuned default is measured beside every
/// challenger in the same rounds.
///
/// The winner is, among the verified and timed candidates whose median is within `TIE_MARGIN` of the lowest, the
/// one with the best score. Every candidate appears in the record's trials.
///
/// Budget: it is charged with the durations `time_once` reports, warm-ups included (not wall-clock, so the result
/// is deterministic given the closures; verification is not charged), and checked after each full round, so every
/// timed candidate gets the same number of reps, at least one. `top_k` and `max_reps` below 1 are taken as 1
/// outside `Off`.
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
    candidates.sort_by(|a, b| rank(b).total_cmp(&rank(a)));

    let mut trials: Vec<Trial> = candidates
        .iter()
        .map(|c| Trial { config: c.name.clone(), score: c.score, time_ns: None, verified: None, note: None })
        .collect();
    let record = |winner: String, trials: Vec<Trial>| TuneRecord {
        key: key.clone(),
        winner,
        mode: mode.as_str().to_string(),
        tuned_dims: tuned_dims.clone(),
        trials,
    };

    if mode == Mode::Off {
        for t in &mut trials {
            t.note = Some("not run: KILN_AUTOTUNE=off".to_string());
        }
        return Ok(record(candidates[0].name.clone(), trials));
    }

    let top_k = budget.top_k.max(1);
    let in_set = timed_set(&candidates.iter().collect::<Vec<_>>(), top_k);
    let mut failures = Vec::new();
    let mut spent = Duration::ZERO;
    // Verify, then warm up, each member of the timed set (score order); the survivors are raced.
    let mut racers: Vec<usize> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        if !in_set[i] {
            trials[i].note = Some(format!("not timed: outside top {top_k}"));
            continue;
        }
        if let Err(msg) = verify(c.config) {
            trials[i].verified = Some(false);
            trials[i].note = Some(format!("verification failed: {msg}"));
            failures.push(format!("{}: verification failed: {msg}", c.name));
            continue;
        }
        trials[i].verified = Some(true);
        let warm: Result<(), String> = (0..budget.warmup).try_for_each(|_| {
            spent += time_once(c.config)?;
            Ok(())
        });
        match warm {
            Ok(()) => racers.push(i),
            Err(msg) => {
                trials[i].note = Some(format!("timing failed: {msg}"));
                failures.push(format!("{}: timing failed: {msg}", c.name));
            }
        }
    }
    let times = race(&racers, budget, &mut spent, |i| time_once(candidates[i].config));
    let mut medians: Vec<(usize, Duration)> = Vec::new();
    for (&i, result) in racers.iter().zip(times) {
        match result {
            Ok(reps) => {
                let m = median(reps.clone());
                trials[i].time_ns = Some(u64::try_from(m.as_nanos()).unwrap_or(u64::MAX));
                let n = reps.len();
                trials[i].note = Some(format!("{n} timed rep{}, interleaved", if n == 1 { "" } else { "s" }));
                medians.push((i, m));
            }
            Err(msg) => {
                trials[i].note = Some(format!("timing failed: {msg}"));
                failures.push(format!("{}: timing failed: {msg}", candidates[i].name));
            }
        }
    }
    let Some(fastest) = medians.iter().map(|&(_, m)| m).min() else {
        return Err(format!("{what}: no candidate passed verification and timing ({})", failures.join("; ")));
    };
    // `medians` is in score order: the first within the margin has the best score among the ties.
    let bound = fastest.as_secs_f64() * (1.0 + TIE_MARGIN);
    let (winner, winner_median) =
        medians.iter().copied().find(|&(_, m)| m.as_secs_f64() <= bound).unwrap_or(medians[0]);
    if winner_median > fastest {
        let note = trials[winner].note.take().unwrap_or_default();
        let pct = TIE_MARGIN * 100.0;
        trials[winner].note = Some(format!("{note}; within {pct:.0}% of the fastest: the better score wins the tie"));
    }
    Ok(record(candidates[winner].name.clone(), trials))
}

/// The configs [`search`] in `mode` verifies and times among `candidates`, best score first, or in [`Mode::Off`]
/// the one it picks without running anything (the best score): for a caller that prepares them together
/// beforehand (compiles their code in one parallel batch, say) rather than one by one as the search reaches each.
pub fn timed_configs<'c, C>(candidates: &'c [Candidate<'_, C>], mode: Mode) -> Vec<&'c C> {
    let mut sorted: Vec<&Candidate<'_, C>> = candidates.iter().collect();
    sorted.sort_by(|a, b| rank(b).total_cmp(&rank(a)));
    if mode == Mode::Off {
        return sorted.first().map(|c| c.config).into_iter().collect();
    }
    let in_set = timed_set(&sorted, mode.budget().top_k.max(1));
    sorted.into_iter().zip(in_set).filter(|(_, t)| *t).map(|(c, _)| c.config).collect()
}

/// The order candidates are searched in: by score, best first (NaN last).
fn rank<C>(c: &Candidate<'_, C>) -> f64 {
    if c.score.is_nan() { f64::NEG_INFINITY } else { c.score }
}

/// The timed set, `top_k` in all, coarse to fine: the best of each group (in score order), then the best of each
/// family not yet in the set, then of each shape not yet in it, then the best remaining scores; and past `top_k`,
/// the best of each shape not yet in it that ties the best score exactly. Groups first: fast
/// mode's two slots had both gone to AVX2 packings where the model put them a hair over AVX-512 (a batch of 64
/// attention products 64 x 32 x 64 in the GPT step: AVX2 4x24 won at 259 µs; `KILN_AUTOTUNE=full` timed AVX-512's
/// 8x48 at 115 against 140). Shapes only fill slots the families leave: `KILN_AUTOTUNE=full` (five slots) at 1024^3
/// timed four variants of one 6 x 16 tile and the library, while the 4 x 24 tile, scored 15 % lower, ran 1-5 %
/// faster once the packing was vectorized.
fn timed_set<C>(candidates: &[&Candidate<'_, C>], top_k: usize) -> Vec<bool> {
    let mut in_set = vec![false; candidates.len()];
    let mut taken = 0;
    fn of<'c, C>(c: &'c Candidate<'_, C>, level: usize) -> &'c str {
        [&c.group, &c.family, &c.shape][level]
    }
    for level in 0..3 {
        let mut seen: Vec<&str> =
            candidates.iter().zip(&in_set).filter(|(_, t)| **t).map(|(c, _)| of(c, level)).collect();
        for (i, c) in candidates.iter().enumerate() {
            if taken < top_k && !in_set[i] && !of(c, level).is_empty() && !seen.contains(&of(c, level)) {
                seen.push(of(c, level));
                in_set[i] = true;
                taken += 1;
            }
        }
    }
    for flag in in_set.iter_mut() {
        if taken >= top_k {
            break;
        }
        if !*flag {
            *flag = true;
            taken += 1;
        }
    }
    // A tie at the top is what the model cannot decide and the race can: each shape scoring exactly the best score
    // is timed too, past `top_k` (a batched 64 x 64 x 32 product scored AVX-512's 14 x 32 and 6 x 64 alike, the
    // two slots went to the best of each family, and 6 x 64, a quarter faster in the training step, was never run).
    if let Some(best) = candidates.first().map(|c| rank(c)) {
        let mut shapes: Vec<&str> =
            candidates.iter().zip(&in_set).filter(|(_, t)| **t).map(|(c, _)| c.shape.as_str()).collect();
        for (i, c) in candidates.iter().enumerate() {
            if !in_set[i] && rank(c) == best && !c.shape.is_empty() && !shapes.contains(&c.shape.as_str()) {
                shapes.push(&c.shape);
                in_set[i] = true;
            }
        }
    }
    in_set
}

/// Times `racers` round-robin: each round runs every still-healthy racer once, starting one further along each
/// round; stops after `max_reps` rounds or at the end of the round that spends the budget. A racer whose timing
/// fails drops out with its error; the others go on. Returns each racer's reps (or error), in `racers` order.
fn race(
    racers: &[usize],
    budget: Budget,
    spent: &mut Duration,
    mut time_once: impl FnMut(usize) -> Result<Duration, String>,
) -> Vec<Result<Vec<Duration>, String>> {
    let n = racers.len();
    let max_reps = budget.max_reps.max(1);
    let mut out: Vec<Result<Vec<Duration>, String>> = vec![Ok(Vec::with_capacity(max_reps)); n];
    for round in 0..max_reps {
        for step in 0..n {
            let slot = (round + step) % n;
            let Ok(reps) = &mut out[slot] else { continue };
            match time_once(racers[slot]) {
                Ok(t) => {
                    *spent += t;
                    reps.push(t);
                }
                Err(msg) => out[slot] = Err(msg),
            }
        }
        if *spent >= budget.time_budget {
            break;
        }
    }
    out
}

/// The median (mean of the middle two for an even count) of a non-empty set of times.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    let mid = times.len() / 2;
    if times.len() % 2 == 1 { times[mid] } else { (times[mid - 1] + times[mid]) / 2 }
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
        let d = |v: &[u64]| v.iter().map(|&x| Duration::from_nanos(x)).collect::<Vec<_>>();
        assert_eq!(median(d(&[5, 1, 3])), Duration::from_nanos(3));
        assert_eq!(median(d(&[5, 1, 3, 100])), Duration::from_nanos(4));
        assert_eq!(median(d(&[7])), Duration::from_nanos(7));
    }

    #[test]
    fn rounds_rotate_and_stop_at_the_budget_after_a_full_round() {
        let budget = Budget { top_k: 3, warmup: 0, max_reps: 10, time_budget: Duration::from_nanos(25) };
        let mut order = Vec::new();
        let mut spent = Duration::ZERO;
        let out = race(&[0, 1, 2], budget, &mut spent, |i| {
            order.push(i);
            Ok(Duration::from_nanos(5))
        });
        // Round 0: 0 1 2 (15 ns), round 1: 1 2 0 (30 ns >= 25: stop after the round).
        assert_eq!(order, [0, 1, 2, 1, 2, 0]);
        assert!(out.iter().all(|r| r.as_ref().is_ok_and(|v| v.len() == 2)));
    }
}
