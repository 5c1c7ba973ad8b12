//! The search loop with fake verify/time closures: ordering, budgets, verification, Off mode, errors.

use std::cell::RefCell;
use std::time::Duration;

use kiln_autotune::{Budget, Candidate, Mode, TuneKey, checksum_of, search, search_with_budget};

struct Cfg {
    name: &'static str,
    score: f64,
    /// What the fake clock says one run takes.
    time: Duration,
    correct: bool,
}

fn cfg(name: &'static str, score: f64, micros: u64, correct: bool) -> Cfg {
    Cfg { name, score, time: Duration::from_micros(micros), correct }
}

fn key(cfgs: &[Cfg]) -> TuneKey {
    TuneKey {
        op: "gemm".into(),
        dims: vec![("m".into(), 64), ("n".into(), 64), ("k".into(), 64)],
        dtypes: "f32".into(),
        layout: "row,row".into(),
        epilogue: "none".into(),
        device: "0123456789abcdef".into(),
        candidates: checksum_of(cfgs.iter().map(|c| c.name)),
    }
}

/// A key for tests of which candidates are timed (its fields do not matter there).
fn bare_key() -> TuneKey {
    TuneKey {
        op: "t".into(),
        dims: vec![],
        dtypes: String::new(),
        layout: String::new(),
        epilogue: String::new(),
        device: "d".into(),
        candidates: 0,
    }
}

fn candidates(cfgs: &[Cfg]) -> Vec<Candidate<'_, Cfg>> {
    cfgs.iter()
        .map(|c| Candidate {
            config: c,
            name: c.name.to_string(),
            score: c.score,
            group: String::new(),
            family: String::new(),
            shape: String::new(),
        })
        .collect()
}

fn verify(c: &Cfg) -> Result<(), String> {
    if c.correct { Ok(()) } else { Err(format!("{} disagrees with the reference", c.name)) }
}

fn tuned(cfgs: &[Cfg]) -> Vec<(String, u64)> {
    key(cfgs).dims
}

#[test]
fn trials_are_sorted_by_score_with_stable_ties() {
    let cfgs =
        [cfg("b", 1.0, 10, true), cfg("a", 3.0, 10, true), cfg("c", 1.0, 10, true), cfg("nan", f64::NAN, 1, true)];
    let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Full, verify, |c: &Cfg| Ok(c.time))
        .expect("all verify");
    let order: Vec<&str> = rec.trials.iter().map(|t| t.config.as_str()).collect();
    assert_eq!(order, ["a", "b", "c", "nan"]);
    // All take 10 µs except NaN-scored (fastest, but ranked last yet inside top 5, so it is timed and wins).
    assert_eq!(rec.winner, "nan");
    assert_eq!(rec.mode, "full");
    assert_eq!(rec.tuned_dims, tuned(&cfgs));
}

#[test]
fn equal_times_go_to_the_better_score() {
    let cfgs = [cfg("low", 1.0, 10, true), cfg("high", 2.0, 10, true)];
    let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Fast, verify, |c: &Cfg| Ok(c.time))
        .expect("both verify");
    assert_eq!(rec.winner, "high");
}

#[test]
fn off_mode_runs_nothing_and_trusts_the_best_score() {
    let cfgs = [cfg("slow", 1.0, 100, true), cfg("best", 9.0, 1000, false)];
    let rec = search(
        &key(&cfgs),
        tuned(&cfgs),
        candidates(&cfgs),
        Mode::Off,
        |_: &Cfg| panic!("Off must not verify"),
        |_: &Cfg| -> Result<Duration, String> { panic!("Off must not time") },
    )
    .expect("Off always has a winner");
    assert_eq!(rec.winner, "best");
    assert_eq!(rec.mode, "off");
    assert!(rec.trials.iter().all(|t| t.time_ns.is_none() && t.verified.is_none()));
    assert_eq!(rec.trials.len(), 2);
}

#[test]
fn a_failing_fast_candidate_never_wins() {
    // "wrong" has the best score and the best time; it must still lose to the slower correct one.
    let cfgs = [cfg("wrong", 10.0, 1, false), cfg("right", 5.0, 50, true), cfg("third", 1.0, 100, true)];
    for mode in [Mode::Fast, Mode::Full] {
        let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), mode, verify, |c: &Cfg| Ok(c.time))
            .expect("one candidate verifies");
        assert_eq!(rec.winner, "right", "{mode:?}");
        let wrong = &rec.trials[0];
        assert_eq!((wrong.config.as_str(), wrong.verified, wrong.time_ns), ("wrong", Some(false), None));
        assert!(wrong.note.as_deref().is_some_and(|n| n.contains("disagrees with the reference")), "{wrong:?}");
        assert_eq!(rec.trials[1].time_ns, Some(50_000));
    }
}

#[test]
fn only_top_k_are_timed_and_every_candidate_is_recorded() {
    let cfgs: Vec<Cfg> = ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| cfg(name, 10.0 - i as f64, 1, true))
        .collect();
    let timed = RefCell::new(Vec::new());
    let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Fast, verify, |c: &Cfg| {
        timed.borrow_mut().push(c.name);
        Ok(c.time)
    })
    .expect("all verify");
    assert_eq!(rec.trials.len(), 7);
    // Fast: top 2, no warm-up (verification is the first run), three interleaved rounds, rotated (1 µs runs never
    // reach the 20 ms budget).
    assert_eq!(*timed.borrow(), ["c0", "c1", "c1", "c0", "c0", "c1"]);
    for t in &rec.trials[2..] {
        assert_eq!(t.note.as_deref(), Some("not timed: outside top 2"));
        assert_eq!(t.time_ns, None);
    }
    assert_eq!(rec.trials[0].note.as_deref(), Some("3 timed reps, interleaved"));
}

#[test]
fn an_exhausted_budget_stops_after_a_full_round_so_every_racer_gets_a_rep() {
    // 20 ms, charged with the warm-ups (15 ms + 1 µs); round one (15 ms + 1 µs) spends it: one rep each.
    let cfgs = [cfg("first", 3.0, 15_000, true), cfg("second", 2.0, 1, true)];
    let budget = Budget { top_k: 2, warmup: 1, max_reps: 3, time_budget: Duration::from_millis(20) };
    let calls = RefCell::new(0);
    let rec =
        search_with_budget(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Fast, budget, verify, |c: &Cfg| {
            *calls.borrow_mut() += 1;
            Ok(c.time)
        })
        .expect("both verify");
    assert_eq!(*calls.borrow(), 4, "a warm-up and exactly one timed rep each");
    assert_eq!(rec.winner, "second");
    for t in &rec.trials {
        assert_eq!(t.note.as_deref(), Some("1 timed rep, interleaved"), "{t:?}");
    }
}

#[test]
fn a_challenger_must_beat_the_best_score_by_more_than_the_tie_margin() {
    // 2% faster is a tie (noise): the better score keeps it. 5% faster wins.
    for (challenger_micros, winner) in [(98, "default"), (95, "challenger")] {
        let cfgs = [cfg("default", 2.0, 100, true), cfg("challenger", 1.0, challenger_micros, true)];
        let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Full, verify, |c: &Cfg| Ok(c.time))
            .expect("both verify");
        assert_eq!(rec.winner, winner, "challenger at {challenger_micros} µs");
        let note = rec.trials[0].note.as_deref().unwrap_or_default();
        assert_eq!(note.contains("wins the tie"), winner == "default", "{note}");
    }
}

#[test]
fn a_noise_burst_hits_every_racer_alike() {
    // "fast" (90 µs, best score) and "slow" (100 µs). The host is noisy for the first four timed calls (x3).
    // Timed back to back, "fast" would take all four slow reps (median 270) and lose; interleaved, both take two.
    let cfgs = [cfg("fast", 2.0, 90, true), cfg("slow", 1.0, 100, true)];
    let budget = Budget { top_k: 2, warmup: 0, max_reps: 5, time_budget: Duration::from_secs(1) };
    let mut calls = 0;
    let rec =
        search_with_budget(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Full, budget, verify, |c: &Cfg| {
            calls += 1;
            Ok(if calls <= 4 { c.time * 3 } else { c.time })
        })
        .expect("both verify");
    assert_eq!(rec.winner, "fast");
    assert_eq!((rec.trials[0].time_ns, rec.trials[1].time_ns), (Some(90_000), Some(100_000)));
}

#[test]
fn the_budget_does_not_skip_while_nothing_has_verified() {
    let cfgs = [cfg("slow_wrong", 3.0, 30_000, false), cfg("right", 2.0, 30_000, true)];
    let budget = Budget { top_k: 2, warmup: 1, max_reps: 3, time_budget: Duration::ZERO };
    let rec =
        search_with_budget(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Fast, budget, verify, |c: &Cfg| {
            Ok(c.time)
        })
        .expect("right is still tried");
    assert_eq!(rec.winner, "right");
}

#[test]
fn full_mode_takes_the_median_of_up_to_fifteen_reps() {
    let cfgs = [cfg("only", 1.0, 0, true)];
    let mut n = 0u64;
    // Warm-up 1000 µs (discarded), then 1, 2, ..., 15 µs: the median is 8 µs.
    let rec = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Full, verify, |_: &Cfg| {
        let t = if n == 0 { 1000 } else { n };
        n += 1;
        Ok(Duration::from_micros(t))
    })
    .expect("verifies");
    assert_eq!(n, 16);
    assert_eq!(rec.trials[0].time_ns, Some(8_000));
}

#[test]
fn errors_name_every_failure() {
    let cfgs = [cfg("a", 2.0, 1, false), cfg("b", 1.0, 1, true)];
    let err = search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Fast, verify, |c: &Cfg| {
        if c.name == "b" { Err("device lost".to_string()) } else { Ok(c.time) }
    })
    .expect_err("nothing both verified and timed");
    assert!(
        err.contains("a: verification failed: a disagrees") && err.contains("b: timing failed: device lost"),
        "{err}"
    );

    let none: [Cfg; 0] = [];
    assert!(search(&key(&none), vec![], candidates(&none), Mode::Fast, verify, |c: &Cfg| Ok(c.time)).is_err());
    let dup = [cfg("same", 1.0, 1, true), cfg("same", 2.0, 1, true)];
    let err = search(&key(&dup), vec![], candidates(&dup), Mode::Fast, verify, |c: &Cfg| Ok(c.time))
        .expect_err("duplicate names are ambiguous");
    assert!(err.contains("\"same\""), "{err}");
}

#[test]
fn deterministic_given_the_closures() {
    let cfgs = [cfg("x", 1.0, 7, true), cfg("y", 2.0, 9, true), cfg("z", 0.5, 3, false)];
    let run = || search(&key(&cfgs), tuned(&cfgs), candidates(&cfgs), Mode::Full, verify, |c: &Cfg| Ok(c.time));
    assert_eq!(run(), run());
}

/// Candidates named `names` with these scores, families (the group: what comes before a `:`) and shapes, raced with
/// `budget` on closures where `fastest` takes 1 ns and every other 100 ns; returns the names timed (sorted, once
/// each) and the winner.
fn race_named(
    names: &[&str],
    scores: &[f64],
    fams: &[&str],
    shapes: &[&str],
    budget: kiln_autotune::Budget,
    fastest: &str,
) -> (Vec<String>, String) {
    let cands: Vec<Candidate<'_, &str>> = (0..names.len())
        .map(|i| Candidate {
            config: &names[i],
            name: names[i].to_string(),
            score: scores[i],
            group: fams[i].split(':').next().unwrap_or_default().to_string(),
            family: fams[i].to_string(),
            shape: shapes[i].to_string(),
        })
        .collect();
    let mut timed = Vec::new();
    let rec = kiln_autotune::search_with_budget(
        &bare_key(),
        vec![],
        cands,
        kiln_autotune::Mode::Full,
        budget,
        |_| Ok(()),
        |c: &&str| {
            timed.push(c.to_string());
            Ok(std::time::Duration::from_nanos(if *c == fastest { 1 } else { 100 }))
        },
    )
    .unwrap();
    timed.sort();
    timed.dedup();
    (timed, rec.winner)
}

#[test]
fn the_timed_set_takes_the_best_of_each_family_first() {
    // Two slots (fast mode's): the best of family a and the best of family b, not a1 and a2.
    let (timed, winner) = race_named(
        &["a1", "a2", "a3", "b1", "c1"],
        &[10.0, 9.0, 8.0, 1.0, 0.5],
        &["a", "a", "a", "b", "c"],
        &[""; 5],
        kiln_autotune::Mode::Fast.budget(),
        "b1",
    );
    assert_eq!(timed, ["a1", "b1"]);
    assert_eq!(winner, "b1");
}

#[test]
fn slots_the_families_leave_take_the_best_of_each_shape_first() {
    // One family with two shapes; the second shape scores below three variants of the first. Three slots: the two
    // families' best (p1, lib), then the best of the unseen shape (q1), not p2.
    let budget =
        kiln_autotune::Budget { top_k: 3, warmup: 0, max_reps: 1, time_budget: std::time::Duration::from_secs(1) };
    let (timed, winner) = race_named(
        &["p1", "p2", "p3", "q1", "lib"],
        &[10.0, 9.9, 9.8, 5.0, 1.0],
        &["packed", "packed", "packed", "packed", "library"],
        &["6x16", "6x16", "6x16", "4x24", ""],
        budget,
        "q1",
    );
    assert_eq!(timed, ["lib", "p1", "q1"]);
    assert_eq!(winner, "q1");
}

#[test]
fn shapes_tied_at_the_top_score_are_all_timed() {
    // Fast mode's two slots go to the best of each group (AVX-512 and AVX2); AVX-512's 6x64 ties its 14x32 at the top
    // score (the model cannot tell them apart), so it is timed too, and wins; 8x48, scored below, is not timed.
    let (timed, winner) = race_named(
        &["14x32", "6x64", "8x48", "avx2 6x16"],
        &[145.0, 145.0, 140.0, 107.0],
        &["AVX-512: packed", "AVX-512: packed", "AVX-512: packed", "AVX2: packed"],
        &["14x32", "6x64", "8x48", "6x16"],
        kiln_autotune::Mode::Fast.budget(),
        "6x64",
    );
    assert_eq!(timed, ["14x32", "6x64", "avx2 6x16"]);
    assert_eq!(winner, "6x64");
}

#[test]
fn groups_come_before_families() {
    // Two slots: the best of group AVX2 and of group AVX-512, although AVX2's second family scores over AVX-512's.
    let (timed, winner) = race_named(
        &["avx2 packed", "avx2 in place", "avx512 packed"],
        &[77.1, 77.0, 76.9],
        &["AVX2: packed", "AVX2: in place", "AVX-512: packed"],
        &[""; 3],
        kiln_autotune::Mode::Fast.budget(),
        "avx512 packed",
    );
    assert_eq!(timed, ["avx2 packed", "avx512 packed"]);
    assert_eq!(winner, "avx512 packed");
}

#[test]
fn timed_configs_are_what_the_search_verifies() {
    // Scores out of order, two families, a NaN: in each mode, the configs `timed_configs` names (a caller compiles
    // them beforehand) are exactly those the search then verifies, in the same order (in Off mode, its pick).
    let names = ["a1", "b1", "a2", "nan", "a3", "b2"];
    let scores = [5.0, 1.0, 9.0, f64::NAN, 7.0, 0.5];
    let fams = ["a", "b", "a", "a", "a", "b"];
    let cands = || -> Vec<Candidate<'_, &str>> {
        (0..names.len())
            .map(|i| Candidate {
                config: &names[i],
                name: names[i].to_string(),
                score: scores[i],
                group: String::new(),
                family: fams[i].to_string(),
                shape: String::new(),
            })
            .collect()
    };
    for mode in [Mode::Off, Mode::Fast, Mode::Full] {
        let c = cands();
        let named: Vec<&str> = kiln_autotune::timed_configs(&c, mode).into_iter().copied().collect();
        let mut verified = Vec::new();
        let rec = search(
            &bare_key(),
            vec![],
            cands(),
            mode,
            |c: &&str| {
                verified.push(*c);
                Ok(())
            },
            |_| Ok(Duration::from_nanos(1)),
        )
        .unwrap();
        if mode == Mode::Off {
            // Nothing runs; the one config named is the one the search picks.
            assert!(verified.is_empty());
            assert_eq!(named, [rec.winner.as_str()]);
        } else {
            assert_eq!(named, verified, "{mode:?}");
        }
    }
    let c = cands();
    let fast: Vec<&str> = kiln_autotune::timed_configs(&c, Mode::Fast).into_iter().copied().collect();
    assert_eq!(fast, ["a2", "b1"], "fast mode: the best of each family");
}
