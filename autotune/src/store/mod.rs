//! The persistent store of tuning records and compiled artifacts: memory (DashMap) in front of a disk cache.
//!
//! Owns: lookups and writes, the directory layout, rejection of bad entries, counters, and the process-wide store.
//! Listing, clearing and verifying live in `inventory.rs`, bundles in `bundle.rs`, the file format in
//! `envelope.rs`. Deliberately not: deciding what to tune or compile, or evicting entries (entries are small and
//! few; `kiln cache clear` is the eviction policy for now).
//!
//! Layout under the root (`KILN_CACHE_DIR`, else `<user cache dir>/kiln`):
//! ```text
//! v<kiln-autotune version>/<fingerprint id>/fingerprint.txt            the device, for humans
//! v<kiln-autotune version>/<fingerprint id>/tune/<key digest>.rec      one TuneRecord (JSON payload)
//! v<kiln-autotune version>/<fingerprint id>/artifacts/<name digest>.bin  one artifact
//! ```
//! The directory names only route lookups: every entry carries its own version, fingerprint and full key text,
//! and is used only when all three equal what was asked for (a copied or colliding file can never answer for
//! another key). A bad entry is ignored with one warning, deleted if possible, counted, and rebuilt by the caller.

mod bundle;
mod inventory;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dashmap::DashMap;
use parking_lot::Mutex;

pub use bundle::{BundleSummary, bundle_device};
pub use inventory::EntryInfo;

use crate::envelope::{self, Entry, EntryKind};
use crate::fingerprint::DeviceFingerprint;
use crate::hash::{fnv1a64, hex16};
use crate::key::TuneKey;
use crate::record::TuneRecord;

/// The version that namespaces the disk cache and bundles: a new kiln never reads an older one's entries (kernels,
/// candidate sets and record formats may all have changed), it rebuilds them.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How many recent rejections [`Store::recent_rejections`] keeps.
const KEPT_REJECTIONS: usize = 64;

/// A store operation that touched the disk and failed. Memory is never the failing part: a failed `put` still
/// leaves the value in memory, so callers log the error and go on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Bundle { path: PathBuf, reason: String },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: String, reason: String },
    /// `Store::set_global_root` after the process-wide store was opened.
    #[error("the process-wide cache is already open at {}; choose its place before the first realize or tune", .0.as_deref().map_or("memory only".to_string(), |p| p.display().to_string()))]
    AlreadyOpen(Option<PathBuf>),
}

/// Counters since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub record_hits: u64,
    pub record_misses: u64,
    pub artifact_hits: u64,
    pub artifact_misses: u64,
    /// Entries found on disk but not used (corrupt, truncated, foreign, another key, unreadable).
    pub rejected: u64,
    /// Entries written to disk.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    record_hits: AtomicU64,
    record_misses: AtomicU64,
    artifact_hits: AtomicU64,
    artifact_misses: AtomicU64,
    rejected: AtomicU64,
    writes: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Tuning records and artifacts of one device, in memory and (unless memory-only) on disk.
pub struct Store {
    root: Option<PathBuf>,
    version: String,
    fingerprint: DeviceFingerprint,
    fp_id: String,
    records: DashMap<TuneKey, TuneRecord, rustc_hash::FxBuildHasher>,
    artifacts: DashMap<String, Vec<u8>, rustc_hash::FxBuildHasher>,
    counters: Counters,
    /// Whether `fingerprint.txt` was written by this store (once is enough; it is informational).
    described: AtomicBool,
    rejections: Mutex<Vec<(PathBuf, String)>>,
}

impl Store {
    /// A store rooted at `root` for `fingerprint`. Nothing is created on disk until the first write.
    pub fn open(root: PathBuf, fingerprint: &DeviceFingerprint) -> Store {
        Store::with_version(Some(root), fingerprint, VERSION)
    }

    /// A store that never touches the disk.
    pub fn memory_only(fingerprint: &DeviceFingerprint) -> Store {
        Store::with_version(None, fingerprint, VERSION)
    }

    /// Any version: tests use it to play an older or newer kiln.
    pub(crate) fn with_version(root: Option<PathBuf>, fingerprint: &DeviceFingerprint, version: &str) -> Store {
        Store {
            root,
            version: version.to_string(),
            fingerprint: fingerprint.clone(),
            fp_id: fingerprint.id(),
            records: DashMap::default(),
            artifacts: DashMap::default(),
            counters: Counters::default(),
            described: AtomicBool::new(false),
            rejections: Mutex::new(Vec::new()),
        }
    }

    /// The process-wide store for the host CPU. Root: `KILN_CACHE_DIR` when set and non-empty (`off`: memory
    /// only), else `<user cache dir>/kiln`, else (no cache dir known) memory only.
    pub fn global() -> &'static Store {
        GLOBAL.get_or_init(|| Store::for_host(resolve_root(std::env::var_os("KILN_CACHE_DIR"), dirs::cache_dir())))
    }

    /// Opens the process-wide store at `root` (`None`: memory only) instead of where `KILN_CACHE_DIR` points: for a
    /// program that chooses its cache in code. Must come before anything uses the store; afterwards it is refused
    /// and the store stays where it is.
    pub fn set_global_root(root: Option<PathBuf>) -> Result<&'static Store, StoreError> {
        // Absolute, as `resolve_root` makes `KILN_CACHE_DIR`, so messages name the real place.
        let root = root.map(|r| std::path::absolute(&r).unwrap_or(r));
        let mut opened_here = false;
        let store = GLOBAL.get_or_init(|| {
            opened_here = true;
            Store::for_host(root)
        });
        if opened_here { Ok(store) } else { Err(StoreError::AlreadyOpen(store.root.clone())) }
    }

    /// The host CPU's store at `root`, or in memory only.
    fn for_host(root: Option<PathBuf>) -> Store {
        let fingerprint = DeviceFingerprint::host_cpu();
        match root {
            Some(root) => Store::open(root, &fingerprint),
            None => Store::memory_only(&fingerprint),
        }
    }

    pub fn fingerprint(&self) -> &DeviceFingerprint {
        &self.fingerprint
    }

    /// The cache root; `None` for a memory-only store.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// `<root>/v<version>/<fingerprint id>`: where this store's entries live; `None` for a memory-only store.
    pub fn namespace_dir(&self) -> Option<PathBuf> {
        self.root.as_ref().map(|root| root.join(format!("v{}", self.version)).join(&self.fp_id))
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            record_hits: get(&c.record_hits),
            record_misses: get(&c.record_misses),
            artifact_hits: get(&c.artifact_hits),
            artifact_misses: get(&c.artifact_misses),
            rejected: get(&c.rejected),
            writes: get(&c.writes),
        }
    }

    /// The last few rejected entries and why (oldest first), for tests and diagnostics.
    pub fn recent_rejections(&self) -> Vec<(PathBuf, String)> {
        self.rejections.lock().clone()
    }

    /// The winner of the record for `key` if that record serves a lookup in `mode` ([`TuneRecord::serves`]: tuned
    /// in `mode` or a more thorough one), found as [`Store::get_record`] finds it, without copying the record's
    /// trials (a plan compile needs only the winner; a record may hold a hundred trials). A record made by a
    /// lighter mode counts as a miss: the caller searches again and replaces it.
    pub fn get_winner(&self, key: &TuneKey, mode: crate::Mode) -> Option<String> {
        let found = match self.records.get(key) {
            Some(rec) => rec.serves(mode).then(|| rec.winner.clone()),
            None => self.read_record(key).filter(|r| r.serves(mode)).map(|r| r.winner),
        };
        bump(if found.is_some() { &self.counters.record_hits } else { &self.counters.record_misses });
        found
    }

    /// Memory first, then disk (a disk hit is kept in memory).
    pub fn get_record(&self, key: &TuneKey) -> Option<TuneRecord> {
        let found = match self.records.get(key) {
            Some(rec) => Some(rec.clone()),
            None => self.read_record(key),
        };
        bump(if found.is_some() { &self.counters.record_hits } else { &self.counters.record_misses });
        found
    }

    /// The record for `key` from disk, kept in memory when found; a bad entry is rejected (with a warning).
    fn read_record(&self, key: &TuneKey) -> Option<TuneRecord> {
        let key_text = key.canonical();
        let rec = self.load(EntryKind::Record, &key_text).and_then(|(path, payload)| {
            parse_record(&payload, &key_text).map_err(|reason| self.reject(&path, &reason)).ok()
        })?;
        self.records.insert(key.clone(), rec.clone());
        Some(rec)
    }

    /// Every record held in memory (imported, tuned or read from disk by this process), in no particular order.
    pub fn records(&self) -> Vec<TuneRecord> {
        self.records.iter().map(|e| e.value().clone()).collect()
    }

    /// Keeps `rec` in memory, then writes it to disk. A disk failure is returned (memory still holds it).
    pub fn put_record(&self, rec: &TuneRecord) -> Result<(), StoreError> {
        self.records.insert(rec.key.clone(), rec.clone());
        let key_text = rec.key.canonical();
        let Some(path) = self.entry_path(EntryKind::Record, &key_text) else {
            return Ok(());
        };
        let payload = serde_json::to_vec(rec)
            .map_err(|e| StoreError::Encode { what: format!("tuning record {key_text}"), reason: e.to_string() })?;
        self.write_entry(EntryKind::Record, &key_text, &payload, &path)
    }

    /// Memory first, then disk (a disk hit is kept in memory).
    pub fn get_artifact(&self, name: &str) -> Option<Vec<u8>> {
        if let Some(bytes) = self.artifacts.get(name) {
            bump(&self.counters.artifact_hits);
            return Some(bytes.clone());
        }
        match self.load(EntryKind::Artifact, name) {
            Some((_, bytes)) => {
                self.artifacts.insert(name.to_string(), bytes.clone());
                bump(&self.counters.artifact_hits);
                Some(bytes)
            }
            None => {
                bump(&self.counters.artifact_misses);
                None
            }
        }
    }

    /// The artifacts held in memory (put in this process, loaded, or imported) whose names start with `prefix`.
    pub fn artifacts_with_prefix(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        self.artifacts
            .iter()
            .filter(|e| e.key().starts_with(prefix))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect()
    }

    /// Keeps `bytes` in memory under `name`, then writes them to disk. A disk failure is returned (memory still
    /// holds them).
    pub fn put_artifact(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.artifacts.insert(name.to_string(), bytes.to_vec());
        match self.entry_path(EntryKind::Artifact, name) {
            Some(path) => self.write_entry(EntryKind::Artifact, name, bytes, &path),
            None => Ok(()),
        }
    }

    /// Where the entry for `key_text` (a key's canonical text or an artifact name) lives.
    fn entry_path(&self, kind: EntryKind, key_text: &str) -> Option<PathBuf> {
        let file = format!("{}.{}", digest_of(key_text), kind.extension());
        self.namespace_dir().map(|ns| ns.join(kind.dir()).join(file))
    }

    /// Reads and validates the entry for `key_text`; `None` when absent or rejected. Returns its payload.
    fn load(&self, kind: EntryKind, key_text: &str) -> Option<(PathBuf, Vec<u8>)> {
        let path = self.entry_path(kind, key_text)?;
        // A file that cannot be read (absent, or the cache dir is not a usable directory) is a miss, not a bad
        // entry: no warning per lookup (a write failure is reported once by the caller). Only content that was
        // read and is wrong is rejected with a warning.
        let Ok(data) = fs::read(&path) else { return None };
        match self.validate(&data, kind, Some(key_text)) {
            Ok(entry) => Some((path, entry.payload.to_vec())),
            Err(reason) => {
                self.reject(&path, &reason);
                None
            }
        }
    }

    /// Structure and checksum, then: the kind, version and fingerprint this store expects, and `key` if given.
    fn validate<'b>(&self, data: &'b [u8], kind: EntryKind, key: Option<&str>) -> Result<Entry<'b>, String> {
        let entry = envelope::decode(data)?;
        if entry.kind != kind {
            return Err(format!("holds the wrong kind of entry ({}, expected {})", entry.kind.as_str(), kind.as_str()));
        }
        if entry.version != self.version {
            return Err(format!("written by kiln-autotune {} (this is {})", entry.version, self.version));
        }
        if entry.fingerprint != self.fp_id {
            return Err(format!("written for device {} (this device is {})", entry.fingerprint, self.fp_id));
        }
        if let Some(key) = key
            && entry.key != key
        {
            return Err(format!("holds another key ({})", entry.key));
        }
        Ok(entry)
    }

    /// Ignores a bad entry: one warning line, delete it if possible (so it is rebuilt, not re-warned), count it.
    fn reject(&self, path: &Path, reason: &str) {
        eprintln!("kiln: ignoring cache entry {}: {reason}; it will be rebuilt", path.display());
        let _ = fs::remove_file(path);
        bump(&self.counters.rejected);
        let mut kept = self.rejections.lock();
        if kept.len() == KEPT_REJECTIONS {
            kept.remove(0);
        }
        kept.push((path.to_path_buf(), reason.to_string()));
    }

    fn write_entry(&self, kind: EntryKind, key_text: &str, payload: &[u8], path: &Path) -> Result<(), StoreError> {
        self.describe_namespace();
        let entry = Entry { kind, version: &self.version, fingerprint: &self.fp_id, key: key_text, payload };
        crate::fsio::write_atomic(path, &envelope::encode(&entry), false).map_err(|source| StoreError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        })?;
        bump(&self.counters.writes);
        Ok(())
    }

    /// Writes `fingerprint.txt` once per store when missing. Best effort: it is for humans and `kiln cache ls`;
    /// a real disk problem surfaces in the entry write that follows.
    fn describe_namespace(&self) {
        if self.described.swap(true, Ordering::Relaxed) {
            return;
        }
        let Some(ns) = self.namespace_dir() else { return };
        let path = ns.join("fingerprint.txt");
        if !path.exists() {
            let fp = &self.fingerprint;
            let text = format!(
                "kiln-autotune {} cache namespace\ndevice: {}\narch: {}\nmodel: {}\nfeatures: {}\nid: {}\n",
                self.version,
                fp.describe(),
                fp.arch,
                fp.model,
                fp.features.join(" "),
                self.fp_id
            );
            let _ = crate::fsio::write_atomic(&path, text.as_bytes(), false);
        }
    }
}

/// The file-name digest of a key's canonical text or an artifact's name.
pub(crate) fn digest_of(key_text: &str) -> String {
    hex16(fnv1a64(key_text.as_bytes()))
}

/// A record payload, checked to be for `key_text`.
fn parse_record(payload: &[u8], key_text: &str) -> Result<TuneRecord, String> {
    let rec: TuneRecord = serde_json::from_slice(payload).map_err(|e| format!("the record does not parse ({e})"))?;
    if rec.key.canonical() != key_text {
        return Err(format!("the record inside is for another key ({})", rec.key.canonical()));
    }
    Ok(rec)
}

static GLOBAL: OnceLock<Store> = OnceLock::new();

/// `KILN_CACHE_DIR` if set and non-empty (`off`, any case: no disk), else `<user cache dir>/kiln`.
fn resolve_root(var: Option<OsString>, user_cache_dir: Option<PathBuf>) -> Option<PathBuf> {
    match var {
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        Some(v) if !v.is_empty() => {
            // Absolute, so messages and `kiln cache stats` name the real place even for `KILN_CACHE_DIR=./c`.
            let path = PathBuf::from(v);
            Some(std::path::absolute(&path).unwrap_or(path))
        }
        _ => user_cache_dir.map(|d| d.join("kiln")),
    }
}
