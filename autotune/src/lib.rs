//! `kiln-autotune`: the device-neutral half of kiln's autotuner. It knows how to search, remember and ship tuning
//! results; it does not know what a GEMM is, nor any backend (the one machine it describes is the host it runs on,
//! whose fingerprint namespaces the store).
//!
//! - [`search()`]: sort candidates by a model's score, verify and time the best few within a budget
//!   ([`Mode`]: `KILN_AUTOTUNE=off|fast|full`), and return a [`TuneRecord`] naming the winner with every trial.
//! - [`TuneKey`]: what a result is valid for (op, bucketed dims, dtypes, layout, epilogue, [`DeviceFingerprint`]
//!   id, checksum of the candidate set); [`bucket`] rounds a dim up to its power-of-two bucket.
//! - [`Store`]: records and opaque compiled artifacts in memory and under `KILN_CACHE_DIR`, namespaced by version
//!   and device, written atomically, checksummed, and never used when anything about an entry is off; bundles
//!   export and import a whole namespace as one file.
//!
//! Must not know: the user-facing `Tensor` API, the kernel IR, or how a kernel is generated and run. A search space
//! and its cost model belong to the backend whose kernels they describe (`kiln-backends`' `cpu/gemm/config.rs` and
//! `wgpu/tiles.rs`), as do the kernels, the reference check and the timing closures (see docs/architecture.md,
//! "Layers" and "Caches"). Hence no dependency on `kiln-jit`: candidates reach [`search()`] as names, scores and
//! closures.
#![forbid(unsafe_code)]

mod envelope;
mod fingerprint;
mod fsio;
mod hash;
mod key;
mod record;
mod search;
mod store;

pub use envelope::EntryKind;
pub use fingerprint::DeviceFingerprint;
pub use fsio::replace_file;
pub use key::{TuneKey, bucket, checksum_of, checksum_of_each, dim_named};
pub use record::{Trial, TuneRecord};
pub use search::{Budget, Candidate, Mode, search, search_with_budget, timed_configs};
pub use store::{BundleSummary, EntryInfo, Store, StoreError, StoreStats, VERSION, bundle_device};

/// Names of the artifacts that hold a persisted plan (a graph signature the `kiln` crate writes when it compiles a
/// CPU plan, and compiles again when a bundle is imported) start with this; the store keeps them as opaque bytes.
pub const PLAN_ARTIFACT_PREFIX: &str = "plan-";

/// A stable 16-hex-digit digest of `bytes` (FNV-1a 64), for naming content-addressed artifacts.
pub fn content_digest(bytes: &[u8]) -> String {
    hash::hex16(hash::fnv1a64(bytes))
}
