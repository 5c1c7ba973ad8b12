//! Bundles: one file holding every record and artifact of a store's namespace, to warm a deploy machine's cache.
//!
//! Owns: the bundle format, export, and import with its refusals. A bundle is used whole or not at all: a corrupt
//! one, or one from another kiln version or device fingerprint, is refused with a message naming both sides, and
//! nothing of it is stored. Deliberately not: merging policies (an imported entry replaces the local one with the
//! same key; both were measured on this device type by this kiln version).
//!
//! Layout (integers little-endian; strings are a u32 byte length then UTF-8):
//! ```text
//! magic        8 bytes  "KILNBDL\0"
//! format       u32      1
//! version      string   kiln-autotune version that exported it
//! fingerprint  string   device fingerprint id
//! device       string   the DeviceFingerprint as JSON (to name the device in a refusal)
//! count        u64
//! count times: kind u8 (1 record, 2 artifact), key string, payload_len u64, payload
//! checksum     u64      FNV-1a 64 over every byte before it
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::{Store, StoreError, parse_record};
use crate::envelope::{EntryKind, Reader, put_str};
use crate::fingerprint::DeviceFingerprint;
use crate::hash::fnv1a64;

const BUNDLE_MAGIC: [u8; 8] = *b"KILNBDL\0";
const BUNDLE_FORMAT: u32 = 1;

/// What an export wrote or an import stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleSummary {
    pub records: usize,
    pub artifacts: usize,
    /// How many of the artifacts are persisted plans (named with [`crate::PLAN_ARTIFACT_PREFIX`]).
    pub plans: usize,
    /// The bundle file's size.
    pub bytes: u64,
    /// The kiln-autotune version of the bundle.
    pub version: String,
    /// The device fingerprint id of the bundle.
    pub fingerprint: String,
}

struct Parsed<'a> {
    version: &'a str,
    fingerprint: &'a str,
    device: &'a str,
    entries: Vec<(EntryKind, &'a str, &'a [u8])>,
}

impl Store {
    /// Writes every record and artifact of this namespace (memory and disk) to `path`, atomically. Bad disk
    /// entries met on the way are rejected as a lookup would reject them, and left out.
    pub fn export_bundle(&self, path: &Path) -> Result<BundleSummary, StoreError> {
        // Sorted, so the same contents give the same bytes.
        let mut entries: BTreeMap<(EntryKind, String), Vec<u8>> =
            self.good_disk_entries().into_iter().map(|(kind, key, payload)| ((kind, key), payload)).collect();
        // Memory wins over disk: it is at least as new.
        for rec in self.records.iter() {
            let key = rec.key().canonical();
            let payload = serde_json::to_vec(rec.value())
                .map_err(|e| StoreError::Encode { what: format!("tuning record {key}"), reason: e.to_string() })?;
            entries.insert((EntryKind::Record, key), payload);
        }
        for art in self.artifacts.iter() {
            entries.insert((EntryKind::Artifact, art.key().clone()), art.value().clone());
        }

        let device = serde_json::to_string(&self.fingerprint)
            .map_err(|e| StoreError::Encode { what: "device fingerprint".to_string(), reason: e.to_string() })?;
        let mut out = Vec::new();
        out.extend_from_slice(&BUNDLE_MAGIC);
        out.extend_from_slice(&BUNDLE_FORMAT.to_le_bytes());
        put_str(&mut out, &self.version);
        put_str(&mut out, &self.fp_id);
        put_str(&mut out, &device);
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for ((kind, key), payload) in &entries {
            out.push(kind.tag());
            put_str(&mut out, key);
            out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            out.extend_from_slice(payload);
        }
        out.extend_from_slice(&fnv1a64(&out).to_le_bytes());
        crate::fsio::write_atomic(path, &out, true).map_err(|source| StoreError::Io {
            action: "write bundle",
            path: path.to_path_buf(),
            source,
        })?;
        let records = entries.keys().filter(|(k, _)| *k == EntryKind::Record).count();
        Ok(BundleSummary {
            records,
            artifacts: entries.len() - records,
            plans: entries.keys().filter(|(k, name)| *k == EntryKind::Artifact && is_plan(name)).count(),
            bytes: out.len() as u64,
            version: self.version.clone(),
            fingerprint: self.fp_id.clone(),
        })
    }

    /// Stores every entry of the bundle at `path` (memory and disk). Refuses, storing nothing, a corrupt bundle or
    /// one from another kiln version or device.
    pub fn import_bundle(&self, path: &Path) -> Result<BundleSummary, StoreError> {
        let data = fs::read(path).map_err(|source| StoreError::Io {
            action: "read bundle",
            path: path.to_path_buf(),
            source,
        })?;
        let refuse = |reason: String| StoreError::Bundle { path: path.to_path_buf(), reason };
        let parsed = parse(&data).map_err(refuse)?;
        if parsed.version != self.version || parsed.fingerprint != self.fp_id {
            let theirs = serde_json::from_str::<DeviceFingerprint>(parsed.device)
                .map_or_else(|_| format!("(id {})", parsed.fingerprint), |fp| fp.describe());
            return Err(refuse(format!(
                "refusing a bundle made by kiln-autotune {} on {theirs}; this is kiln-autotune {} on {}. \
                 Tuning results and compiled code are only valid for the version and device that made them: \
                 export the bundle with this kiln version on this kind of machine",
                parsed.version,
                self.version,
                self.fingerprint.describe()
            )));
        }
        // Check every record before storing any, so a bad bundle leaves the store as it was.
        let mut records = Vec::new();
        let mut artifacts = Vec::new();
        for (kind, key, payload) in parsed.entries {
            match kind {
                EntryKind::Record => records.push(parse_record(payload, key).map_err(refuse)?),
                EntryKind::Artifact => artifacts.push((key, payload)),
            }
        }
        for rec in &records {
            self.put_record(rec)?;
        }
        for (name, bytes) in &artifacts {
            self.put_artifact(name, bytes)?;
        }
        Ok(BundleSummary {
            records: records.len(),
            artifacts: artifacts.len(),
            plans: artifacts.iter().filter(|(name, _)| is_plan(name)).count(),
            bytes: data.len() as u64,
            version: parsed.version.to_string(),
            fingerprint: parsed.fingerprint.to_string(),
        })
    }
}

/// The kiln-autotune version and device of the bundle at `path` (checked whole, as an import checks it), to choose
/// the store it belongs to before importing: a CUDA bundle goes to the store of its architecture, not the CPU's.
pub fn bundle_device(path: &Path) -> Result<(String, DeviceFingerprint), StoreError> {
    let data =
        fs::read(path).map_err(|source| StoreError::Io { action: "read bundle", path: path.to_path_buf(), source })?;
    let refuse = |reason: String| StoreError::Bundle { path: path.to_path_buf(), reason };
    let parsed = parse(&data).map_err(refuse)?;
    let device = serde_json::from_str::<DeviceFingerprint>(parsed.device)
        .map_err(|e| refuse(format!("the bundle's device record is unreadable: {e}")))?;
    Ok((parsed.version.to_string(), device))
}

fn is_plan(artifact_name: &str) -> bool {
    artifact_name.starts_with(crate::PLAN_ARTIFACT_PREFIX)
}

fn parse(data: &[u8]) -> Result<Parsed<'_>, String> {
    if data.get(..BUNDLE_MAGIC.len()) != Some(&BUNDLE_MAGIC[..]) {
        return Err("not a kiln cache bundle (bad magic)".to_string());
    }
    // The format is read before the checksum, so a bundle of a future format is named as such, not as corrupt.
    let mut r = Reader::new(&data[BUNDLE_MAGIC.len()..]);
    let format = r.u32("format").map_err(|e| format!("corrupt bundle: {e}"))?;
    if format != BUNDLE_FORMAT {
        return Err(format!("bundle format {format} (this kiln reads format {BUNDLE_FORMAT})"));
    }
    let body_len = data.len().checked_sub(8).filter(|&n| n >= BUNDLE_MAGIC.len() + 4);
    let Some(body_len) = body_len else {
        return Err("corrupt bundle: truncated before its checksum".to_string());
    };
    let (body, checksum) = data.split_at(body_len);
    let mut stored = [0u8; 8];
    stored.copy_from_slice(checksum);
    if fnv1a64(body) != u64::from_le_bytes(stored) {
        return Err("corrupt or truncated bundle (checksum mismatch)".to_string());
    }
    let corrupt = |e: String| format!("corrupt bundle: {e}");
    let mut r = Reader::new(&body[BUNDLE_MAGIC.len() + 4..]);
    let version = r.str("version").map_err(corrupt)?;
    let fingerprint = r.str("fingerprint").map_err(corrupt)?;
    let device = r.str("device").map_err(corrupt)?;
    let count = r.u64("entry count").map_err(corrupt)?;
    let mut entries = Vec::new();
    for _ in 0..count {
        let tag = r.u8("entry kind").map_err(corrupt)?;
        let kind = EntryKind::from_tag(tag).ok_or_else(|| corrupt(format!("unknown entry kind {tag}")))?;
        let key = r.str("entry key").map_err(corrupt)?;
        let len = r.u64("payload length").map_err(corrupt)?;
        let payload = r.take(len, "payload").map_err(corrupt)?;
        entries.push((kind, key, payload));
    }
    if !r.rest().is_empty() {
        return Err(corrupt(format!("{} unexpected bytes after the last entry", r.rest().len())));
    }
    Ok(Parsed { version, fingerprint, device, entries })
}
