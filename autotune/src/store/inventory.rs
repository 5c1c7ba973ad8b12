//! Looking at the store as a whole: listing every entry under the root (this namespace and foreign ones),
//! checking every entry of this namespace, clearing it, and reading one record file for display.
//!
//! Owns: the walk over the cache directories. Deliberately not: repairing anything. `entries` and `verify` only
//! report; a bad entry is deleted when a lookup meets it, or by `clear`.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{Store, StoreError, digest_of, parse_record};
use crate::envelope::{self, EntryKind};
use crate::fsio::is_temp_name;
use crate::record::TuneRecord;

/// One entry, as `kiln cache ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    pub kind: EntryKind,
    /// A record's canonical key text or an artifact's name; `?` when the file cannot be decoded.
    pub key: String,
    /// File size (payload size for an entry that is only in memory).
    pub bytes: u64,
    /// `None`: only in memory (a memory-only store, or a write that failed).
    pub path: Option<PathBuf>,
    /// The kiln-autotune version of the namespace the entry is in.
    pub version: String,
    /// The fingerprint id of the namespace the entry is in.
    pub fingerprint: String,
    /// In another version's or device's namespace: never used by this store.
    pub foreign: bool,
    /// Why the entry would be rejected; `None` when it is good (for foreign entries: structurally good).
    pub problem: Option<String>,
}

impl Store {
    /// Every entry under the root (foreign namespaces included, marked) plus entries only in memory; this
    /// namespace first, then by kind and key.
    pub fn entries(&self) -> Vec<EntryInfo> {
        let mut out = Vec::new();
        let mut on_disk = HashSet::new();
        if let Some(root) = &self.root {
            for (version, fingerprint, dir) in namespaces(root) {
                let foreign = version != self.version || fingerprint != self.fp_id;
                for (kind, path) in entry_files(&dir) {
                    let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                    let (key, problem) = match fs::read(&path) {
                        Err(e) => ("?".to_string(), Some(format!("cannot read it ({e})"))),
                        Ok(data) => match envelope::decode(&data) {
                            Err(reason) => ("?".to_string(), Some(reason)),
                            Ok(entry) if foreign => {
                                let problem = (entry.kind != kind).then(|| "wrong kind for its file name".to_string());
                                (entry.key.to_string(), problem)
                            }
                            Ok(entry) => (entry.key.to_string(), self.check_file(&path, kind, &data).err()),
                        },
                    };
                    if !foreign && problem.is_none() {
                        on_disk.insert((kind, key.clone()));
                    }
                    out.push(EntryInfo {
                        kind,
                        key,
                        bytes,
                        path: Some(path),
                        version: version.clone(),
                        fingerprint: fingerprint.clone(),
                        foreign,
                        problem,
                    });
                }
            }
        }
        let memory_only = |kind, key: String, bytes: u64| EntryInfo {
            kind,
            key,
            bytes,
            path: None,
            version: self.version.clone(),
            fingerprint: self.fp_id.clone(),
            foreign: false,
            problem: None,
        };
        for rec in self.records.iter() {
            let key = rec.key().canonical();
            if !on_disk.contains(&(EntryKind::Record, key.clone())) {
                let bytes = serde_json::to_vec(rec.value()).map_or(0, |v| v.len() as u64);
                out.push(memory_only(EntryKind::Record, key, bytes));
            }
        }
        for art in self.artifacts.iter() {
            if !on_disk.contains(&(EntryKind::Artifact, art.key().clone())) {
                out.push(memory_only(EntryKind::Artifact, art.key().clone(), art.value().len() as u64));
            }
        }
        out.sort_by(|a, b| (a.foreign, a.kind, &a.key, &a.path).cmp(&(b.foreign, b.kind, &b.key, &b.path)));
        out
    }

    /// Checks every entry file of this namespace (structure, checksum, version, fingerprint, file name, record
    /// payload). Reports only: nothing is deleted or counted.
    pub fn verify(&self) -> Vec<(PathBuf, Result<(), String>)> {
        self.namespace_files().into_iter().map(|path| (path.clone(), self.verify_file(&path))).collect()
    }

    /// The entry files of this namespace (temp files excluded), sorted; empty for a memory-only store.
    pub fn namespace_files(&self) -> Vec<PathBuf> {
        let Some(ns) = self.namespace_dir() else { return Vec::new() };
        entry_files(&ns).into_iter().map(|(_, path)| path).collect()
    }

    /// Checks one entry file as [`verify`](Self::verify) does (lets a caller show progress file by file).
    pub fn verify_file(&self, path: &Path) -> Result<(), String> {
        let kind = path
            .extension()
            .and_then(|e| e.to_str())
            .and_then(EntryKind::from_extension)
            .ok_or_else(|| "not a cache entry file (expected .rec or .bin)".to_string())?;
        let data = fs::read(path).map_err(|e| format!("cannot read it ({e})"))?;
        self.check_file(path, kind, &data).map(|_| ())
    }

    /// Full validation of an entry file of this namespace; returns its key text and payload.
    pub(super) fn check_file(&self, path: &Path, kind: EntryKind, data: &[u8]) -> Result<(String, Vec<u8>), String> {
        let entry = self.validate(data, kind, None)?;
        let expected = format!("{}.{}", digest_of(entry.key), kind.extension());
        if path.file_name().and_then(|n| n.to_str()) != Some(expected.as_str()) {
            return Err(format!("file name does not match its key (expected {expected})"));
        }
        if kind == EntryKind::Record {
            parse_record(entry.payload, entry.key)?;
        }
        Ok((entry.key.to_string(), entry.payload.to_vec()))
    }

    /// Every good entry of this namespace on disk as (kind, key text, payload), in file order; a bad one is rejected
    /// as a lookup would reject it (one warning, deleted) and left out. Bundle export and [`Store::load_all`] read the
    /// disk through this.
    pub(super) fn good_disk_entries(&self) -> Vec<(EntryKind, String, Vec<u8>)> {
        let Some(ns) = self.namespace_dir() else { return Vec::new() };
        let mut out = Vec::new();
        for (kind, path) in entry_files(&ns) {
            let checked = fs::read(&path)
                .map_err(|e| format!("cannot read it ({e})"))
                .and_then(|data| self.check_file(&path, kind, &data));
            match checked {
                Ok((key, payload)) => out.push((kind, key, payload)),
                Err(reason) => self.reject(&path, &reason),
            }
        }
        out
    }

    /// Reads every good entry of this namespace on disk into memory (what is in memory already is kept: it is at
    /// least as new); returns how many records and artifacts were read. A process that starts on a warm cache dir
    /// calls this (through `kiln::tune::warm_from_cache`) to do at start-up what its first step would otherwise do
    /// entry by entry, as an imported bundle's entries are.
    pub fn load_all(&self) -> (usize, usize) {
        let (mut records, mut artifacts) = (0, 0);
        for (kind, key, payload) in self.good_disk_entries() {
            if kind == EntryKind::Record {
                // `check_file` parsed it already; parsing is what turns the payload into a record.
                if let Ok(rec) = parse_record(&payload, &key) {
                    self.records.entry(rec.key.clone()).or_insert(rec);
                    records += 1;
                }
            } else {
                self.artifacts.entry(key).or_insert(payload);
                artifacts += 1;
            }
        }
        (records, artifacts)
    }

    /// Removes this namespace from disk (entries, temp files, `fingerprint.txt`) and empties memory. Foreign
    /// namespaces are left alone. Returns how many distinct entries were removed.
    pub fn clear(&self) -> Result<usize, StoreError> {
        let mut removed = HashSet::new();
        let ns = self.namespace_dir();
        if let Some(ns) = &ns {
            for (kind, path) in entry_files(ns) {
                removed.insert((kind, path.file_stem().map(|s| s.to_string_lossy().into_owned())));
            }
        }
        for rec in self.records.iter() {
            removed.insert((EntryKind::Record, Some(rec.key().digest())));
        }
        for art in self.artifacts.iter() {
            removed.insert((EntryKind::Artifact, Some(digest_of(art.key()))));
        }
        self.records.clear();
        self.artifacts.clear();
        self.described.store(false, Ordering::Relaxed);
        if let Some(ns) = ns {
            match fs::remove_dir_all(&ns) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(StoreError::Io { action: "remove", path: ns, source }),
            }
        }
        Ok(removed.len())
    }

    /// Reads a record file from any namespace (for display: `kiln cache ls -v`). Checks structure, checksum and
    /// that the payload matches the key it is filed under; not whether it belongs to this store.
    pub fn read_record_file(path: &Path) -> Result<TuneRecord, String> {
        let data = fs::read(path).map_err(|e| format!("cannot read it ({e})"))?;
        let entry = envelope::decode(&data)?;
        if entry.kind != EntryKind::Record {
            return Err(format!("holds the wrong kind of entry ({}, expected record)", entry.kind.as_str()));
        }
        parse_record(entry.payload, entry.key)
    }
}

/// `(version, fingerprint id, dir)` of every namespace under `root` (`v<version>/<id>/`), sorted.
fn namespaces(root: &Path) -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    for version_dir in subdirs(root) {
        let Some(version) = file_name(&version_dir).and_then(|n| n.strip_prefix('v').map(str::to_string)) else {
            continue;
        };
        for fp_dir in subdirs(&version_dir) {
            if let Some(fp) = file_name(&fp_dir) {
                out.push((version.clone(), fp.to_string(), fp_dir.clone()));
            }
        }
    }
    out.sort();
    out
}

/// The entry files of one namespace directory (temp files and anything else skipped), sorted.
pub(super) fn entry_files(ns: &Path) -> Vec<(EntryKind, PathBuf)> {
    let mut out = Vec::new();
    for kind in [EntryKind::Record, EntryKind::Artifact] {
        let Ok(dir) = fs::read_dir(ns.join(kind.dir())) else { continue };
        for path in dir.flatten().map(|e| e.path()) {
            let Some(name) = file_name(&path) else { continue };
            let ext = path.extension().and_then(|e| e.to_str());
            if !is_temp_name(name) && ext == Some(kind.extension()) && path.is_file() {
                out.push((kind, path));
            }
        }
    }
    out.sort();
    out
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()
}

fn file_name(path: &Path) -> Option<&str> {
    path.file_name().and_then(|n| n.to_str())
}
