//! `kiln-autotune`: the device-neutral half of kiln's autotuner. It knows how to search, remember and ship tuning
//! results; it does not know what a GEMM is.
//!
//! - [`search()`]: sort candidates by a model's score, verify and time the best few within a budget
//!   ([`Mode`]: `KILN_AUTOTUNE=off|fast|full`), and return a [`TuneRecord`] naming the winner with every trial.
//! - [`TuneKey`]: what a result is valid for (op, bucketed dims, dtypes, layout, epilogue, [`DeviceFingerprint`]
//!   id, checksum of the candidate set); [`bucket`] rounds a dim up to its power-of-two bucket.
//! - [`Store`]: records and opaque compiled artifacts in memory and under `KILN_CACHE_DIR`, namespaced by version
//!   and device, written atomically, checksummed, and never used when anything about an entry is off; bundles
//!   export and import a whole namespace as one file.
//!
//! - [`cpu_gemm`]: the CPU GEMM search space (register tiles, cache blocking, packing, thread split, the library
//!   candidate) and its analytic cost model, over a `kiln_jit` `GemmView`.
//! - [`wgsl_gemm`]: the WGSL GEMM search space (workgroup and register tiles, K slice), adapter legality, and its
//!   analytic score.
//!
//! Must not know: the user-facing `Tensor` API, or how a kernel is generated and run: the GEMM kernels, the
//! reference check and the timing closures are the backends' (see docs/architecture.md, "Caches").
#![forbid(unsafe_code)]

pub mod cpu_gemm;
mod envelope;
mod fingerprint;
mod fsio;
mod hash;
mod key;
mod record;
mod search;
mod store;
pub mod wgsl_gemm;

pub use envelope::EntryKind;
pub use fingerprint::DeviceFingerprint;
pub use fsio::replace_file;
pub use key::{TuneKey, bucket, checksum_of, checksum_of_each, dim_named};
pub use record::{Trial, TuneRecord};
pub use search::{Budget, Candidate, Mode, search, search_with_budget};
pub use store::{BundleSummary, EntryInfo, Store, StoreError, StoreStats, VERSION};

/// Names of the artifacts that hold a persisted plan (a graph signature the `kiln` crate writes when it compiles a
/// CPU plan, and compiles again when a bundle is imported) start with this; the store keeps them as opaque bytes.
pub const PLAN_ARTIFACT_PREFIX: &str = "plan-";

/// A stable 16-hex-digit digest of `bytes` (FNV-1a 64), for naming content-addressed artifacts.
pub fn content_digest(bytes: &[u8]) -> String {
    hash::hex16(hash::fnv1a64(bytes))
}
