//! Store tests that need crate-private access: entries written by hand with a patched envelope (another kiln
//! version, another kind), a store playing another kiln version, and the cache-root rules of `Store::global`.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;

use super::*;
use crate::key::checksum_of;
use crate::record::Trial;

fn host() -> DeviceFingerprint {
    DeviceFingerprint { arch: "x86_64".into(), model: "Test CPU".into(), features: vec!["avx2".into()] }
}

fn key() -> TuneKey {
    TuneKey {
        op: "gemm".into(),
        dims: vec![("m".into(), 64)],
        dtypes: "f32".into(),
        layout: "row,row".into(),
        epilogue: "none".into(),
        device: host().id(),
        candidates: checksum_of(["a"]),
    }
}

fn record() -> TuneRecord {
    TuneRecord {
        key: key(),
        winner: "a".into(),
        mode: "fast".into(),
        tuned_dims: vec![("m".into(), 64)],
        trials: vec![Trial { config: "a".into(), score: 1.0, time_ns: Some(10), verified: Some(true), note: None }],
    }
}

/// Writes an envelope by hand where `store` looks for `key()`.
fn plant(store: &Store, kind: EntryKind, version: &str, fingerprint: &str) -> PathBuf {
    let key_text = key().canonical();
    let payload = serde_json::to_vec(&record()).expect("serializes");
    let path = store.entry_path(EntryKind::Record, &key_text).expect("disk store");
    let bytes = envelope::encode(&Entry { kind, version, fingerprint, key: &key_text, payload: &payload });
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(&path, bytes).expect("plant");
    path
}

#[test]
fn a_good_hand_written_entry_is_used() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    plant(&store, EntryKind::Record, VERSION, &host().id());
    assert_eq!(store.get_record(&key()), Some(record()));
}

#[test]
fn an_entry_claiming_another_version_is_rejected_and_rebuilt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    let path = plant(&store, EntryKind::Record, "9.9.9", &host().id());
    assert!(store.verify_file(&path).is_err_and(|e| e.contains("kiln-autotune 9.9.9")));
    assert_eq!(store.get_record(&key()), None);
    assert_eq!(store.stats().rejected, 1);
    let rejections = store.recent_rejections();
    assert_eq!(rejections, vec![(path.clone(), format!("written by kiln-autotune 9.9.9 (this is {VERSION})"))]);
    assert!(!path.exists());
    store.put_record(&record()).expect("rebuild");
    assert_eq!(Store::open(dir.path().to_path_buf(), &host()).get_record(&key()), Some(record()));
}

#[test]
fn an_artifact_where_a_record_belongs_is_rejected() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path().to_path_buf(), &host());
    plant(&store, EntryKind::Artifact, VERSION, &host().id());
    assert_eq!(store.get_record(&key()), None);
    assert!(store.recent_rejections()[0].1.contains("wrong kind of entry (artifact, expected record)"));
}

#[test]
fn another_kiln_version_misses_and_its_bundles_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let older = Store::with_version(Some(dir.path().to_path_buf()), &host(), "0.0.1");
    older.put_record(&record()).expect("write");
    let current = Store::open(dir.path().to_path_buf(), &host());
    assert_eq!(current.get_record(&key()), None, "a new kiln does not read an old kiln's namespace");
    assert_eq!(current.stats().rejected, 0);
    let listed = current.entries();
    assert!(listed.len() == 1 && listed[0].foreign && listed[0].version == "0.0.1", "{listed:?}");

    let bundle = dir.path().join("old.kiln");
    older.export_bundle(&bundle).expect("export");
    let err = current.import_bundle(&bundle).expect_err("refused").to_string();
    assert!(err.contains("kiln-autotune 0.0.1") && err.contains(&format!("kiln-autotune {VERSION}")), "{err}");
    assert_eq!(current.get_record(&key()), None);
}

#[test]
fn cache_root_rules() {
    let user = Some(PathBuf::from("/home/u/.cache"));
    assert_eq!(resolve_root(None, user.clone()), Some(PathBuf::from("/home/u/.cache/kiln")));
    assert_eq!(resolve_root(Some(OsString::new()), user.clone()), Some(PathBuf::from("/home/u/.cache/kiln")));
    assert_eq!(resolve_root(Some("off".into()), user.clone()), None);
    assert_eq!(resolve_root(Some("OFF".into()), user.clone()), None);
    assert_eq!(resolve_root(Some("/srv/kiln".into()), user), Some(PathBuf::from("/srv/kiln")));
    assert_eq!(resolve_root(None, None), None);
    let relative = resolve_root(Some("rel/dir".into()), None).expect("a root");
    assert!(relative.is_absolute() && relative.ends_with("rel/dir"));
}
