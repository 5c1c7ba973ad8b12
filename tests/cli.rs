//! The `kiln` binary's cache commands against a temporary KILN_CACHE_DIR: entries made through the library are
//! listed, exported, cleared, imported back, verified; a corrupt entry fails verify; a foreign bundle is refused.

// The `kiln` binary needs the `cpu` feature (its `required-features`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use kiln_autotune::{DeviceFingerprint, Store, Trial, TuneKey, TuneRecord, checksum_of};
use tempfile::TempDir;

fn kiln(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("KILN_CACHE_DIR", root)
        .output()
        .expect("the kiln binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs and asserts success; returns stdout.
fn ok(root: &Path, args: &[&str]) -> String {
    let out = kiln(root, args);
    assert!(out.status.success(), "kiln {args:?} failed\nstdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

fn record(m: u64, device: &DeviceFingerprint) -> TuneRecord {
    let key = TuneKey {
        op: "gemm".into(),
        dims: vec![("m".into(), m), ("n".into(), 64), ("k".into(), 64)],
        dtypes: "f32".into(),
        layout: "row,row".into(),
        epilogue: "none".into(),
        device: device.id(),
        candidates: checksum_of(["mr4_nr8", "mr8_nr8"]),
    };
    TuneRecord {
        tuned_dims: key.dims.clone(),
        key,
        winner: "mr8_nr8".into(),
        mode: "full".into(),
        trials: vec![
            Trial { config: "mr8_nr8".into(), score: 2.0, time_ns: Some(900), verified: Some(true), note: None },
            Trial { config: "mr4_nr8".into(), score: 1.5, time_ns: Some(1400), verified: Some(true), note: None },
        ],
    }
}

#[test]
fn cache_commands_round_trip() {
    let (cache, other, out) =
        (TempDir::new().expect("cache"), TempDir::new().expect("other"), TempDir::new().expect("out"));
    let host = DeviceFingerprint::host_cpu();
    let store = Store::open(cache.path().to_path_buf(), &host);
    store.put_record(&record(64, &host)).expect("write");
    store.put_record(&record(128, &host)).expect("write");
    store.put_artifact("G_gemm_f32_64x64x64", b"\xc3").expect("write");

    let listed = ok(cache.path(), &["cache", "ls"]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
    assert!(listed.contains("G_gemm_f32_64x64x64") && listed.contains("dims=m:128"), "{listed}");
    let verbose = ok(cache.path(), &["cache", "ls", "-v"]);
    assert!(verbose.contains("median µs") && verbose.contains("* mr8_nr8"), "{verbose}");
    let stats = ok(cache.path(), &["cache", "stats"]);
    assert!(
        stats.contains("records:    2") && stats.contains("artifacts:  1") && stats.contains(&host.id()),
        "{stats}"
    );
    assert!(ok(cache.path(), &["cache", "verify"]).contains("3 entries checked, 0 bad"));

    let bundle = out.path().join("model.kiln");
    let bundle_arg = bundle.to_str().expect("UTF-8 temp path");
    assert!(
        ok(cache.path(), &["cache", "export", bundle_arg]).contains("exported 2 records and 1 artifacts (0 plans;")
    );
    assert!(ok(cache.path(), &["cache", "clear"]).contains("removed 3 entries"));
    assert!(ok(cache.path(), &["cache", "ls"]).contains("no cache entries"));
    assert!(
        ok(cache.path(), &["cache", "import", bundle_arg]).contains("imported 2 records and 1 artifacts (0 plans)")
    );
    assert_eq!(ok(cache.path(), &["cache", "ls"]), listed, "import restores exactly what was exported");
    let fresh = Store::open(cache.path().to_path_buf(), &host);
    assert_eq!(fresh.get_record(&record(64, &host).key), Some(record(64, &host)));

    // A corrupt entry: verify names it and exits 1.
    let victim = fresh.namespace_files().into_iter().next().expect("an entry file");
    let mut bytes = fs::read(&victim).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&victim, bytes).expect("corrupt");
    let bad = kiln(cache.path(), &["cache", "verify"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stdout).contains("checksum mismatch") && text(&bad.stdout).contains("1 bad"),
        "{}",
        text(&bad.stdout)
    );

    // A bundle from another device is refused with a message, and nothing is imported.
    let foreign =
        DeviceFingerprint { arch: "x86_64".into(), model: "Elsewhere".into(), features: vec!["avx512f".into()] };
    let foreign_store = Store::open(other.path().to_path_buf(), &foreign);
    foreign_store.put_record(&record(256, &foreign)).expect("write");
    let foreign_bundle = out.path().join("foreign.kiln");
    foreign_store.export_bundle(&foreign_bundle).expect("export");
    let refused = kiln(cache.path(), &["cache", "import", foreign_bundle.to_str().expect("UTF-8")]);
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(err.starts_with("kiln: ") && err.contains("refusing") && err.contains(&foreign.id()), "{err}");
    assert!(!ok(cache.path(), &["cache", "ls"]).contains("dims=m:256"));
}

#[test]
fn errors_are_one_line_and_non_zero() {
    let cache = TempDir::new().expect("cache");
    let missing = cache.path().join("missing.kiln");
    let out = kiln(cache.path(), &["cache", "import", missing.to_str().expect("UTF-8")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).starts_with("kiln: cannot read bundle"), "{}", text(&out.stderr));
    let off = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["cache", "stats"])
        .env("KILN_CACHE_DIR", "off")
        .output()
        .expect("runs");
    assert!(off.status.success() && text(&off.stdout).contains("memory only"), "{}", text(&off.stdout));
}

/// `kiln tune` leaves tuning records and GEMM kernels, but not the plans of the synthetic graphs it realizes to tune
/// them: those are no model's, and a bundle's plans are compiled by every process that imports it.
#[test]
fn tune_stores_winners_and_kernels_but_no_plans() {
    if common::skip_without_avx2() {
        return;
    }
    let cache = TempDir::new().expect("cache");
    ok(cache.path(), &["tune", "--gemm", "96x256x200", "--mode", "off"]);
    let entries = Store::open(cache.path().to_path_buf(), &DeviceFingerprint::host_cpu()).entries();
    let kinds = |kind| entries.iter().filter(|e| e.kind == kind).count();
    let (records, artifacts) = (kinds(kiln_autotune::EntryKind::Record), kinds(kiln_autotune::EntryKind::Artifact));
    assert!(records == 1 && artifacts >= 1, "{entries:?}");
    assert!(!entries.iter().any(|e| e.key.starts_with(kiln_autotune::PLAN_ARTIFACT_PREFIX)), "{entries:?}");
}

/// `KILN_CPU_ISA` narrows the generated GEMM kernels the tuner considers to one instruction family: every
/// generated candidate in the record `kiln tune` leaves is of that family (the 8-lane GEMVs and the library stay
/// candidates under either). A family the CPU lacks, or a name that is none, is an error, never a quiet fallback.
#[test]
fn kiln_cpu_isa_forces_a_kernel_family() {
    use kiln_backends::cpu::isa::Isa;
    if common::skip_without_avx2() {
        return;
    }
    for isa in Isa::ALL {
        let cache = TempDir::new().expect("cache");
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["tune", "--gemm", "96x256x200", "--mode", "fast"])
            .env("KILN_CACHE_DIR", cache.path())
            .env("KILN_CPU_ISA", isa.name())
            .output()
            .expect("the kiln binary runs");
        if !isa.present() {
            assert!(!out.status.success(), "KILN_CPU_ISA={} accepted on a CPU without it", isa.name());
            assert!(text(&out.stderr).contains("lacks"), "{}", text(&out.stderr));
            eprintln!("KILN_CPU_ISA={}: refused, as this CPU lacks it", isa.name());
            continue;
        }
        assert!(out.status.success(), "KILN_CPU_ISA={}: {}", isa.name(), text(&out.stderr));
        let store = Store::open(cache.path().to_path_buf(), &DeviceFingerprint::host_cpu());
        store.load_all();
        let records = store.records();
        let record = records.iter().find(|r| r.key.op == "gemm").expect("a GEMM record");
        let generated: Vec<&str> = record
            .trials
            .iter()
            .map(|t| t.config.as_str())
            .filter(|c| Isa::ALL.iter().any(|i| c.starts_with(&format!("{}:", i.name())) || c.starts_with("tr:")))
            .collect();
        assert!(!generated.is_empty(), "KILN_CPU_ISA={}: no generated candidate in {:?}", isa.name(), record.trials);
        let prefix = format!("{}:", isa.name());
        for c in generated {
            assert!(c.trim_start_matches("tr:").starts_with(&prefix), "KILN_CPU_ISA={}: candidate {c}", isa.name());
        }
        eprintln!("KILN_CPU_ISA={}: winner {}", isa.name(), record.winner);
    }
    let cache = TempDir::new().expect("cache");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["tune", "--gemm", "96x256x200", "--mode", "off"])
        .env("KILN_CACHE_DIR", cache.path())
        .env("KILN_CPU_ISA", "sse9")
        .output()
        .expect("the kiln binary runs");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("KILN_CPU_ISA=sse9 is not one of auto, avx2, avx512"), "{}", text(&out.stderr));
}

/// Exporting an empty cache is almost always the wrong `KILN_CACHE_DIR`: refused on stderr, non-zero, and nothing
/// is written (not even the folders of the path); `--allow-empty` writes the empty bundle.
#[test]
fn exporting_an_empty_cache_is_refused_unless_asked_for() {
    let (cache, out) = (TempDir::new().expect("cache"), TempDir::new().expect("out"));
    let bundle = out.path().join("new/dir/x.kiln");
    let bundle_arg = bundle.to_str().expect("UTF-8");
    let refused = kiln(cache.path(), &["cache", "export", bundle_arg]);
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(err.starts_with("kiln: nothing to export") && err.contains("--allow-empty"), "{err}");
    assert!(text(&refused.stdout).is_empty());
    assert!(!out.path().join("new").exists(), "nothing written");
    let written = ok(cache.path(), &["cache", "export", "--allow-empty", bundle_arg]);
    assert!(written.contains("exported 0 records and 0 artifacts"), "{written}");
    assert!(bundle.exists());
}
