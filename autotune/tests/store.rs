//! The store through its public API, each test in its own temporary root: hits and misses by key, rejection of
//! corrupt/truncated/foreign entries, crash leftovers, listing, clearing, verifying, bundles.

use std::fs;
use std::path::{Path, PathBuf};

use kiln_autotune::{DeviceFingerprint, EntryKind, Store, StoreError, Trial, TuneKey, TuneRecord, bucket, checksum_of};
use tempfile::TempDir;

fn fp(features: &[&str]) -> DeviceFingerprint {
    DeviceFingerprint {
        arch: "x86_64".into(),
        model: "Test CPU".into(),
        features: features.iter().map(|s| s.to_string()).collect(),
    }
}

fn host() -> DeviceFingerprint {
    fp(&["avx", "avx2", "fma"])
}

fn key(m: u64, device: &DeviceFingerprint) -> TuneKey {
    TuneKey {
        op: "gemm".into(),
        dims: vec![("m".into(), bucket(m)), ("n".into(), 256), ("k".into(), 128)],
        dtypes: "f32".into(),
        layout: "row,row".into(),
        epilogue: "bias+relu".into(),
        device: device.id(),
        candidates: checksum_of(["t4x4", "t8x8"]),
    }
}

fn record(key: TuneKey) -> TuneRecord {
    TuneRecord {
        tuned_dims: key.dims.clone(),
        key,
        winner: "t8x8".into(),
        mode: "fast".into(),
        trials: vec![
            Trial { config: "t8x8".into(), score: 2.0, time_ns: Some(1500), verified: Some(true), note: None },
            Trial { config: "t4x4".into(), score: 1.0, time_ns: Some(2500), verified: Some(true), note: None },
        ],
    }
}

fn record_path(store: &Store, key: &TuneKey) -> PathBuf {
    store.namespace_dir().expect("disk store").join("tune").join(format!("{}.rec", key.digest()))
}

fn reasons(store: &Store) -> String {
    store.recent_rejections().iter().map(|(_, r)| r.as_str()).collect::<Vec<_>>().join(" | ")
}

#[test]
fn a_record_survives_a_restart_and_counts_hits_and_misses() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(1000, &host());
    let store = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(store.get_record(&k), None);
    store.put_record(&record(k.clone())).expect("write");
    assert_eq!(store.get_record(&k), Some(record(k.clone())));
    let s = store.stats();
    assert_eq!((s.record_hits, s.record_misses, s.writes, s.rejected), (1, 1, 1, 0));

    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_record(&k), Some(record(k.clone())), "disk hit");
    assert_eq!(fresh.get_record(&k), Some(record(k.clone())), "now a memory hit");
    assert_eq!(fresh.stats().record_hits, 2);
    assert!(fresh.namespace_dir().expect("disk store").join("fingerprint.txt").is_file());
}

#[test]
fn the_same_bucket_hits_and_anything_else_misses() {
    let dir = TempDir::new().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    store.put_record(&record(key(1000, &host()))).expect("write");
    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert!(fresh.get_record(&key(1024, &host())).is_some(), "1000 and 1024 share a bucket");
    assert!(fresh.get_record(&key(1025, &host())).is_none(), "1025 is the next bucket");
    let other_candidates = TuneKey { candidates: checksum_of(["t4x4", "t8x8", "t16x4"]), ..key(1000, &host()) };
    assert!(fresh.get_record(&other_candidates).is_none(), "a changed candidate set misses");
    let other_device = key(1000, &fp(&["avx", "avx2", "avx512f", "fma"]));
    assert!(fresh.get_record(&other_device).is_none(), "a key for other CPU flags misses");
    assert_eq!(fresh.stats().rejected, 0, "misses are not rejections");
}

#[test]
fn another_fingerprint_has_its_own_namespace() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(64, &host());
    Store::open(dir.path().to_path_buf(), &host()).put_record(&record(k.clone())).expect("write");
    let avx512 = Store::open(dir.path().to_path_buf(), &fp(&["avx", "avx2", "avx512f", "fma"]));
    assert_ne!(avx512.namespace_dir(), Store::open(dir.path().to_path_buf(), &host()).namespace_dir());
    assert_eq!(avx512.get_record(&k), None, "even the same key misses on another device");
    let listed = avx512.entries();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].foreign && listed[0].problem.is_none(), "{listed:?}");
}

#[test]
fn an_entry_under_another_version_dir_is_foreign_and_unused() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(64, &host());
    let store = Store::open(dir.path().to_path_buf(), &host());
    store.put_record(&record(k.clone())).expect("write");
    let ns = store.namespace_dir().expect("disk store");
    let old_ns = dir.path().join("v0.0.1").join(host().id());
    fs::create_dir_all(old_ns.join("tune")).expect("mkdir");
    fs::rename(record_path(&store, &k), old_ns.join("tune").join(format!("{}.rec", k.digest()))).expect("move");
    assert!(!ns.join("tune").join(format!("{}.rec", k.digest())).exists());

    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_record(&k), None);
    let listed = fresh.entries();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].foreign && listed[0].version == "0.0.1", "{listed:?}");
    assert_eq!(listed[0].key, k.canonical());
}

#[test]
fn corrupt_entries_are_ignored_counted_deleted_and_rebuilt() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(64, &host());
    let store = Store::open(dir.path().to_path_buf(), &host());
    store.put_record(&record(k.clone())).expect("write");
    let path = record_path(&store, &k);
    let mut bytes = fs::read(&path).expect("read");
    let last = bytes.len() - 3;
    bytes[last] ^= 0x20;
    fs::write(&path, &bytes).expect("corrupt it");
    assert_eq!(store.verify().len(), 1);
    assert!(store.verify()[0].1.as_ref().is_err_and(|e| e.contains("checksum")));

    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_record(&k), None);
    assert_eq!(fresh.stats().rejected, 1);
    assert!(reasons(&fresh).contains("checksum mismatch"), "{}", reasons(&fresh));
    assert!(!path.exists(), "a rejected entry is deleted");
    // Rebuilt by the caller's next put: a later store reads it again.
    fresh.put_record(&record(k.clone())).expect("rebuild");
    assert_eq!(Store::open(dir.path().to_path_buf(), &host()).get_record(&k), Some(record(k)));
}

#[test]
fn a_crash_mid_write_leaves_nothing_that_is_used() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(64, &host());
    let store = Store::open(dir.path().to_path_buf(), &host());
    store.put_record(&record(k.clone())).expect("write");
    let path = record_path(&store, &k);
    let full = fs::read(&path).expect("read");
    // What a crash can leave: a half-written temp file beside the target, or (without rename) a torn target.
    let temp = path.with_file_name(format!(".{}.rec.4242.0.tmp", k.digest()));
    fs::write(&temp, &full[..full.len() / 2]).expect("torn temp");
    fs::write(&path, &full[..full.len() - 5]).expect("torn entry");
    let k2 = key(128, &host());
    let temp2 = path.with_file_name(format!(".{}.rec.4242.1.tmp", k2.digest()));
    fs::write(&temp2, &full[..10]).expect("temp of an entry that was never completed");

    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_record(&k), None);
    assert_eq!(fresh.get_record(&k2), None);
    let s = fresh.stats();
    assert_eq!((s.rejected, s.record_misses, s.record_hits), (1, 2, 0), "only the torn entry is a rejection");
    assert!(reasons(&fresh).contains("truncated"), "{}", reasons(&fresh));
    assert!(temp.exists() && temp2.exists(), "temp files are never read, so never judged");
    assert!(fresh.verify().is_empty(), "temp files are not entries");
    assert!(fresh.entries().is_empty());
}

#[test]
fn an_entry_from_another_device_copied_in_is_rejected() {
    let dir = TempDir::new().expect("temp dir");
    let k = key(64, &host());
    let other = Store::open(dir.path().to_path_buf(), &fp(&["avx512f"]));
    other.put_record(&record(k.clone())).expect("write");
    let mine = Store::open(dir.path().to_path_buf(), &host());
    let target = record_path(&mine, &k);
    fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
    fs::copy(record_path(&other, &k), &target).expect("copy");
    assert!(mine.verify()[0].1.as_ref().is_err_and(|e| e.contains("device")));
    assert_eq!(mine.get_record(&k), None);
    assert_eq!(mine.stats().rejected, 1);
    assert!(reasons(&mine).contains(&format!("written for device {}", fp(&["avx512f"]).id())), "{}", reasons(&mine));
}

#[test]
fn an_entry_filed_under_another_key_is_rejected() {
    let dir = TempDir::new().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    let (a, b) = (key(64, &host()), key(128, &host()));
    store.put_record(&record(a.clone())).expect("write");
    fs::rename(record_path(&store, &a), record_path(&store, &b)).expect("misfile");
    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_record(&b), None);
    assert!(reasons(&fresh).contains("another key"), "{}", reasons(&fresh));
}

#[test]
fn artifacts_round_trip_by_name() {
    let dir = TempDir::new().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    let code = vec![0x55u8, 0x48, 0x89, 0xe5, 0xc3];
    assert_eq!(store.get_artifact("G_gemm_f32_64x64"), None);
    store.put_artifact("G_gemm_f32_64x64", &code).expect("write");
    let fresh = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(fresh.get_artifact("G_gemm_f32_64x64"), Some(code));
    assert_eq!(fresh.get_artifact("G_gemm_f32_64x65"), None);
    let s = fresh.stats();
    assert_eq!((s.artifact_hits, s.artifact_misses), (1, 1));
    let listed = fresh.entries();
    assert_eq!((listed[0].kind, listed[0].key.as_str()), (EntryKind::Artifact, "G_gemm_f32_64x64"));
}

#[test]
fn memory_only_stores_never_touch_the_disk() {
    let store = Store::memory_only(&host());
    let k = key(64, &host());
    store.put_record(&record(k.clone())).expect("memory never fails");
    store.put_artifact("x", b"code").expect("memory never fails");
    assert_eq!(store.get_record(&k), Some(record(k)));
    assert_eq!((store.root(), store.namespace_dir()), (None, None));
    assert_eq!(store.stats().writes, 0);
    let listed = store.entries();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|e| e.path.is_none() && !e.foreign));
    assert_eq!(store.clear().expect("clear"), 2);
    assert!(store.entries().is_empty());
}

#[test]
fn a_failed_disk_write_is_an_error_but_memory_keeps_the_record() {
    let dir = TempDir::new().expect("temp dir");
    let root = dir.path().join("not-a-dir");
    fs::write(&root, b"a file where the cache root should be").expect("block the root");
    let store = Store::open(root, &host());
    let k = key(64, &host());
    let err = store.put_record(&record(k.clone())).expect_err("cannot create directories under a file");
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
    assert_eq!(store.get_record(&k), Some(record(k)));
}

#[test]
fn clear_removes_this_namespace_only() {
    let dir = TempDir::new().expect("temp dir");
    let mine = Store::open(dir.path().to_path_buf(), &host());
    let other = Store::open(dir.path().to_path_buf(), &fp(&["sse4.2"]));
    mine.put_record(&record(key(64, &host()))).expect("write");
    mine.put_record(&record(key(128, &host()))).expect("write");
    mine.put_artifact("a", b"1").expect("write");
    other.put_artifact("a", b"2").expect("write");
    assert_eq!(mine.clear().expect("clear"), 3);
    assert_eq!(mine.get_artifact("a"), None);
    assert!(!mine.namespace_dir().expect("disk").exists());
    assert_eq!(other.get_artifact("a"), Some(b"2".to_vec()));
    assert_eq!(Store::open(dir.path().to_path_buf(), &fp(&["sse4.2"])).get_artifact("a"), Some(b"2".to_vec()));
}

fn populated(root: &Path, device: &DeviceFingerprint) -> Store {
    let store = Store::open(root.to_path_buf(), device);
    store.put_record(&record(key(64, device))).expect("write");
    store.put_record(&record(key(4096, device))).expect("write");
    store.put_artifact("G_gemm_64", b"\x01\x02\x03").expect("write");
    store
}

#[test]
fn bundles_round_trip_between_roots() {
    let (a, b, out) = (TempDir::new().expect("a"), TempDir::new().expect("b"), TempDir::new().expect("out"));
    populated(a.path(), &host());
    // Export from a fresh store: everything comes from disk. Add one memory-only record too.
    let exporter = Store::open(a.path().to_path_buf(), &host());
    let extra = Store::memory_only(&host());
    extra.put_record(&record(key(256, &host()))).expect("memory");
    let bundle = out.path().join("model.kiln");
    let exported = exporter.export_bundle(&bundle).expect("export");
    assert_eq!((exported.records, exported.artifacts), (2, 1));
    assert_eq!(extra.export_bundle(&out.path().join("extra.kiln")).expect("export memory").records, 1);

    let importer = Store::open(b.path().to_path_buf(), &host());
    let imported = importer.import_bundle(&bundle).expect("import");
    assert_eq!(imported, exported);
    importer.import_bundle(&out.path().join("extra.kiln")).expect("import memory-only export");
    let fresh = Store::open(b.path().to_path_buf(), &host());
    for m in [64, 4096, 256] {
        assert_eq!(fresh.get_record(&key(m, &host())), Some(record(key(m, &host()))), "m={m} from disk");
    }
    assert_eq!(fresh.get_artifact("G_gemm_64"), Some(b"\x01\x02\x03".to_vec()));
    assert!(fresh.verify().iter().all(|(_, r)| r.is_ok()));
    // Same contents, same bytes: from disk (a fresh store) or from memory (the importer).
    let (from_disk, from_memory) = (out.path().join("disk.kiln"), out.path().join("memory.kiln"));
    let summary = Store::open(b.path().to_path_buf(), &host()).export_bundle(&from_disk).expect("re-export");
    assert_eq!((summary.records, summary.artifacts), (3, 1));
    importer.export_bundle(&from_memory).expect("re-export");
    assert_eq!(fs::read(&from_disk).expect("read"), fs::read(&from_memory).expect("read"));
}

#[test]
fn a_bundle_from_another_device_is_refused_and_nothing_is_stored() {
    let (a, b, out) = (TempDir::new().expect("a"), TempDir::new().expect("b"), TempDir::new().expect("out"));
    let foreign = fp(&["avx512f", "avx512bw"]);
    let bundle = out.path().join("foreign.kiln");
    populated(a.path(), &foreign).export_bundle(&bundle).expect("export");
    let store = Store::open(b.path().to_path_buf(), &host());
    let err = store.import_bundle(&bundle).expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains(&foreign.id()) && msg.contains(&host().id()), "{msg}");
    assert!(msg.contains("refusing"), "{msg}");
    assert!(store.entries().is_empty());
}

#[test]
fn a_corrupt_or_truncated_bundle_is_refused() {
    let (a, b, out) = (TempDir::new().expect("a"), TempDir::new().expect("b"), TempDir::new().expect("out"));
    let bundle = out.path().join("b.kiln");
    populated(a.path(), &host()).export_bundle(&bundle).expect("export");
    let good = fs::read(&bundle).expect("read");
    let store = Store::open(b.path().to_path_buf(), &host());
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    for (name, bytes) in [("flipped", flipped), ("truncated", good[..good.len() - 1].to_vec())] {
        let path = out.path().join(name);
        fs::write(&path, bytes).expect("write");
        let err = store.import_bundle(&path).expect_err(name).to_string();
        assert!(err.contains("corrupt"), "{name}: {err}");
    }
    fs::write(out.path().join("text"), b"hello").expect("write");
    assert!(store.import_bundle(&out.path().join("text")).expect_err("not a bundle").to_string().contains("magic"));
    assert!(matches!(store.import_bundle(&out.path().join("missing")), Err(StoreError::Io { .. })));
    assert!(store.entries().is_empty());
}
