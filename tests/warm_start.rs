//! Warm before deploy, end to end across processes: a cold process tunes and generates its GEMMs, compiles its
//! other kernels, and persists all of it; a bundle exported from its cache and imported by a fresh process (empty
//! cache dir) lets that process run the same step with zero tunings, zero GEMM code generations and zero Cranelift
//! compiles and zero fresh host buffers (the bundle's buffer profile filled the pool at import) and zero executable
//! mappings (the bundle's code was mapped at import, all of it at once) and zero plan compiles (the bundle's
//! plans were compiled at import); and a process on the warm disk cache reuses the persisted winners instead of
//! racing them again, and after `kiln::tune::warm_from_cache` is as warm as after an import.
//!
//! The child processes are this test binary itself, re-run with `KILN_WARM_CHILD` set (see `child_step`).

// Bundles carry the CPU's GEMMs, kernels and plans (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use kiln::{Device, Tensor};
use std::path::Path;
use std::process::Command;

/// One training-style step: two linear layers with bias and relu, forward and backward (GEMMs with epilogues in
/// both layouts), and an SGD update of the first weight. The hidden layer, the first weight's gradient and its
/// update are 64 KiB and more, so they come from the buffer pool. That weight is made by a plan of its own before
/// the step (as a model's initialization would), so the step needs a second buffer of its size while the first is
/// still alive: the buffer profile must count a plan's inputs, not only what it allocates.
///
/// Returns the stats before and after the step itself.
fn step() -> (kiln::Stats, kiln::Stats) {
    let dev = Device::cpu();
    let data = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(data(64 * 96, 0.1), [64, 96], &dev).unwrap();
    // From a plan with no input of its size (a host vector of that size would be given to the pool when dropped).
    kiln::manual_seed(7);
    let w1 = (Tensor::randn([256, 96], kiln::DType::F32, &dev) * 0.1).requires_grad();
    kiln::realize(&[&w1]).unwrap();
    let before = kiln::stats();
    let w2 = Tensor::from_vec(data(48 * 256, 0.3), [48, 256], &dev).unwrap().requires_grad();
    let b1 = Tensor::from_vec(data(256, 0.4), [256], &dev).unwrap();
    let h = (x.matmul(&w1.t()) + &b1).relu();
    let loss = h.matmul(&w2.t()).square().sum(Vec::<isize>::new(), false);
    let grads = loss.backward().unwrap();
    let gw1 = grads.get(&w1).unwrap();
    let gw2 = grads.get(&w2).unwrap();
    let w1_next = w1.detach() - gw1 * 1e-3;
    kiln::realize(&[&loss, gw1, gw2, &w1_next]).unwrap();
    let after = kiln::stats();
    assert!(loss.item::<f32>().unwrap().is_finite());
    (before, after)
}

/// Not a test on its own (ignored, so it never counts as a pass): the body of the child processes.
#[test]
#[ignore = "the child process of imported_bundle_means_no_tuning_and_no_code_generation"]
fn child_step() {
    let Ok(role) = std::env::var("KILN_WARM_CHILD") else { return };
    if let Ok(bundle) = std::env::var("KILN_WARM_BUNDLE") {
        kiln::tune::import_bundle(bundle).unwrap();
    }
    if std::env::var_os("KILN_WARM_FROM_CACHE").is_some() {
        let warmed = kiln::tune::warm_from_cache();
        assert!(warmed.records >= 1 && warmed.artifacts >= 1 && warmed.plans >= 2, "{warmed:?}");
    }
    let (before, s) = step();
    println!(
        "STATS role={role} tunings={} tune_hits={} compiles={} loads={} clif_compiles={} fresh={} mappings={} \
         plan_misses={}",
        s.tunings,
        s.tune_hits,
        s.tuned_kernel_compiles,
        s.tuned_kernel_loads,
        s.kernel_compiles,
        s.fresh_host_buffers - before.fresh_host_buffers,
        s.code_mappings - before.code_mappings,
        s.plan_misses - before.plan_misses
    );
}

/// What a child process reports: counts over the whole process unless noted.
#[derive(Debug)]
struct Child {
    tunings: u64,
    /// Tuning records reused.
    hits: u64,
    /// GEMM code generations.
    generations: u64,
    /// GEMM code loaded from the cache.
    loads: u64,
    /// Cranelift compiles.
    clif: u64,
    /// Fresh host buffers of the step.
    fresh: u64,
    /// Executable mappings of the step.
    mappings: u64,
    /// Realizations of the step that did not find their plan cached.
    plan_misses: u64,
}

/// Runs `child_step` in a new process with these cache settings.
fn child(role: &str, cache: &Path, bundle: Option<&Path>) -> Child {
    child_in_mode(role, cache, bundle, "fast")
}

/// [`child`] with `KILN_AUTOTUNE=mode`.
fn child_in_mode(role: &str, cache: &Path, bundle: Option<&Path>, mode: &str) -> Child {
    child_with(role, cache, bundle, &[("KILN_AUTOTUNE", mode)])
}

/// [`child`] with these environment variables set.
fn child_with(role: &str, cache: &Path, bundle: Option<&Path>, envs: &[(&str, &str)]) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "child_step", "--ignored", "--nocapture", "--test-threads=1"])
        .env("KILN_WARM_CHILD", role)
        .env("KILN_CACHE_DIR", cache)
        .env("KILN_AUTOTUNE", "fast")
        // The children test the cache, whatever engine knobs the parent run was given.
        .env_remove("KILN_GEMM")
        .env_remove("KILN_CPU_ENGINE")
        .env_remove("KILN_TUNE_BUDGET_MS")
        .env_remove("KILN_WARM_BUNDLE")
        .env_remove("KILN_WARM_FROM_CACHE")
        .envs(envs.iter().copied());
    if let Some(b) = bundle {
        cmd.env("KILN_WARM_BUNDLE", b);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{role} child failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let line =
        text.lines().find_map(|l| l.find("STATS").map(|i| &l[i..])).unwrap_or_else(|| panic!("no STATS line:\n{text}"));
    let field = |name: &str| -> u64 {
        let f = line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}=")));
        f.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} missing in {line}"))
    };
    Child {
        tunings: field("tunings"),
        hits: field("tune_hits"),
        generations: field("compiles"),
        loads: field("loads"),
        clif: field("clif_compiles"),
        fresh: field("fresh"),
        mappings: field("mappings"),
        plan_misses: field("plan_misses"),
    }
}

#[test]
fn imported_bundle_means_no_tuning_and_no_code_generation() {
    if std::env::var_os("KILN_WARM_CHILD").is_some() || common::skip_without_avx2() {
        return;
    }
    let build = tempfile::tempdir().unwrap();
    let deploy = tempfile::tempdir().unwrap();
    let cold = child("cold", build.path(), None);
    assert!(cold.tunings >= 1 && cold.generations >= 1 && cold.clif >= 1, "cold: {cold:?}");
    assert!(cold.fresh >= 2, "the cold step allocates its large buffers fresh: {cold:?}");
    assert!(cold.plan_misses >= 1, "the cold step compiles its plan: {cold:?}");

    // The same machine again: the persisted winners are reused, never raced again.
    let warm = child("warm-disk", build.path(), None);
    assert_eq!((warm.tunings, warm.generations, warm.clif), (0, 0, 0), "warm disk: {warm:?}");
    assert!(warm.hits >= 1 && warm.loads >= 1, "warm disk: {warm:?}");
    // Without an import, cached code is mapped and plans are compiled when a step first needs them.
    assert!(warm.mappings >= 1 && warm.plan_misses >= 1, "warm disk: {warm:?}");

    // The same cache, prepared at start-up (`warm_from_cache`): as warm as after an import.
    let prepared = child_with("warm-disk-prepared", build.path(), None, &[("KILN_WARM_FROM_CACHE", "1")]);
    let Child { tunings, generations, clif, fresh, mappings, plan_misses, .. } = prepared;
    assert_eq!((tunings, generations, clif, fresh, mappings, plan_misses), (0, 0, 0, 0, 0, 0), "{prepared:?}");

    // Ship: export from the build machine's cache, import into an empty one.
    let fp = kiln_autotune::DeviceFingerprint::host_cpu();
    let bundle = build.path().join("model.kiln");
    let summary = kiln_autotune::Store::open(build.path().to_path_buf(), &fp).export_bundle(&bundle).unwrap();
    // The plans: the first weight's initialization and the step.
    assert!(summary.records >= 1 && summary.artifacts >= 1 && summary.plans >= 2, "{summary:?}");
    let imported = child("imported", deploy.path(), Some(&bundle));
    eprintln!("imported: {imported:?}");
    let Child { tunings, generations, clif, fresh, mappings, plan_misses, .. } = imported;
    assert_eq!((tunings, generations, clif, fresh, mappings, plan_misses), (0, 0, 0, 0, 0, 0), "{imported:?}");
    assert!(imported.hits >= 1 && imported.loads >= 1, "{imported:?}");
}

/// A record serves its own mode and lighter ones; a more thorough mode searches the key again and replaces it. So a
/// quick `KILN_AUTOTUNE=off` run does not stop the next `fast` one from tuning, `kiln tune` (full) re-tunes what a
/// `fast` run recorded, and once a key is tuned no run of that mode or a lighter one races it again.
#[test]
fn a_more_thorough_mode_searches_a_lighter_modes_record_again() {
    if std::env::var_os("KILN_WARM_CHILD").is_some() || common::skip_without_avx2() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let run = |mode: &str| {
        let c = child_in_mode(mode, cache.path(), None, mode);
        (c.tunings > 0, c.hits > 0)
    };
    // (searched, reused a record) in each process, in order, on one cache.
    assert_eq!(run("off"), (false, false), "off: the model's picks, recorded as off");
    assert_eq!(run("off"), (false, true), "off reuses them");
    assert_eq!(run("fast"), (true, false), "fast searches what off recorded");
    assert_eq!(run("fast"), (false, true), "fast reuses its own records");
    assert_eq!(run("off"), (false, true), "off reuses fast records");
    assert_eq!(run("full"), (true, false), "full searches what fast recorded");
    assert_eq!(run("fast"), (false, true), "fast reuses full records");
}

/// A search runs each candidate several times (verification, then the timed reps); every run's output goes back to
/// the host pool for the next, so a search takes fresh memory once per output size, not once per run. Dropped
/// outputs had been unmapped and faulted in again by every timed run of a large GEMM, and the race compared page
/// faults. The cold step's fresh buffers with `fast` (which searches) are at most `off`'s (which runs nothing but
/// the step) plus one per searched key.
#[test]
fn a_search_reuses_its_output_buffers() {
    if std::env::var_os("KILN_WARM_CHILD").is_some() || common::skip_without_avx2() {
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let off = child_in_mode("off", a.path(), None, "off");
    let fast = child_in_mode("fast", b.path(), None, "fast");
    assert!(off.tunings == 0 && fast.tunings >= 2, "off: {off:?}, fast: {fast:?}");
    assert!(fast.fresh <= off.fresh + fast.tunings, "off: {off:?}, fast: {fast:?}");
}

/// A fast-mode compile searches GEMM keys only within its budget (`KILN_TUNE_BUDGET_MS`); a key past it gets the cost
/// model's choice, recorded as untuned, and the next compile that meets it searches it.
#[test]
fn keys_past_the_tuning_budget_are_searched_by_a_later_compile() {
    if std::env::var_os("KILN_WARM_CHILD").is_some() || common::skip_without_avx2() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let c = child_with("no budget", cache.path(), None, &[("KILN_TUNE_BUDGET_MS", "0")]);
    assert_eq!((c.tunings, c.hits), (0, 0), "with a zero budget nothing is searched");
    let store = kiln_autotune::Store::open(cache.path().to_path_buf(), &kiln_autotune::DeviceFingerprint::host_cpu());
    let records: Vec<kiln_autotune::TuneRecord> = store
        .entries()
        .iter()
        .filter(|e| e.kind == kiln_autotune::EntryKind::Record)
        .map(|e| kiln_autotune::Store::read_record_file(e.path.as_ref().unwrap()).unwrap())
        .collect();
    let modes: Vec<&str> = records.iter().map(|r| r.mode.as_str()).collect();
    assert!(!modes.is_empty() && modes.iter().all(|&m| m == "off"), "the model's choices, recorded as off: {modes:?}");
    // Each key's search alone passes a zero budget: the records say what searches them, not "a later compile".
    for r in &records {
        let note = r.trials.first().and_then(|t| t.note.as_deref()).unwrap_or_default();
        assert!(note.contains("its search alone passes the budget") && !note.contains("a later compile"), "{note}");
    }
    let c = child_with("default budget", cache.path(), None, &[]);
    assert!(c.tunings >= 1 && c.hits == 0, "the next compile searches them: {c:?}");
    let c = child_with("again", cache.path(), None, &[]);
    assert!(c.tunings == 0 && c.hits >= 1, "then they are tuned: {c:?}");
}
