//! Warm before deploy: tune and compile GEMMs ahead of time, and move the results between machines as one file.
//!
//! A service should never tune or generate code on its first request. On a build machine of the same CPU, run
//! the model at its batch sizes (or, with the `cpu` feature, `tune_gemm` / `kiln tune` for given shapes and batch
//! hints), then [`export_bundle`]; at start-up the service calls [`import_bundle`], and its first step reuses every
//! tuning record and maps the GEMMs' machine code instead of generating it (`stats().tunings == 0`,
//! `tuned_kernel_compiles == 0`); the plans the build machine compiled are compiled again at import, so that first
//! step is a plan-cache hit (`stats().plan_misses` unchanged by it). A service that starts on a cache dir filled
//! ahead of time (by earlier runs, or `kiln cache import`) calls [`warm_from_cache`] instead, for the same effect.
//!
//! Results live in the process-wide store (`KILN_CACHE_DIR`, default the user's cache dir, `off` for memory only),
//! namespaced by kiln version and CPU fingerprint: a bundle from another CPU or version is refused, never used.

use crate::Result;
#[cfg(feature = "cpu")]
use crate::{Device, Tensor};
pub use kiln_autotune::{BundleSummary, Mode, TuneRecord};

/// Puts the process-wide cache at `dir` (`None`: memory only, nothing written to disk) instead of where
/// `KILN_CACHE_DIR` (or the user's cache dir) says, for a program that chooses it in code. Call it before the first
/// realize or tune; later it returns an error and the cache stays where it opened.
pub fn set_cache_dir(dir: Option<&std::path::Path>) -> Result<()> {
    kiln_autotune::Store::set_global_root(dir.map(|d| d.to_path_buf()))?;
    Ok(())
}

/// What follows the GEMM in the tuned graph (the epilogue is part of the tuning key).
#[cfg(feature = "cpu")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    None,
    Bias,
    BiasRelu,
}

/// One GEMM to tune: `x[m, k] @ w` with `w` stored `[k, n]`, or `[n, k]` and transposed (`transposed_w`, the
/// layout of `nn::Linear`).
#[cfg(feature = "cpu")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transposed_w: bool,
    pub epilogue: Epilogue,
}

/// Tunes (with `mode`, whatever `KILN_AUTOTUNE` says) and compiles one GEMM on the CPU, and returns its tuning
/// record. A shape whose key is already in the store is not searched again, unless its record was made by a lighter
/// mode than `mode` (`off` or `fast` records are re-tuned by `full`: `TuneRecord::serves`). CPU only (cargo feature
/// `cpu`): the wgpu device tunes a GEMM when a plan first meets it, keyed by its adapter.
#[cfg(feature = "cpu")]
pub fn tune_gemm(shape: &GemmShape, mode: Mode) -> Result<Option<TuneRecord>> {
    let dev = Device::cpu();
    // Buffers, not constants: a GEMM of constant operands would be a different graph from the model's.
    let buffer = |dims: &[usize]| Tensor::from_vec(vec![0f32; dims.iter().product()], dims.to_vec(), &dev);
    let x = buffer(&[shape.m, shape.k])?;
    let w = if shape.transposed_w { buffer(&[shape.n, shape.k])?.t() } else { buffer(&[shape.k, shape.n])? };
    let mut y = x.matmul(&w);
    if shape.epilogue != Epilogue::None {
        y = y + buffer(&[shape.n])?;
    }
    if shape.epilogue == Epilogue::BiasRelu {
        y = y.relu();
    }
    let backend = dev.backend()?;
    // An earlier compile's record must not pass for this one's.
    backend.take_last_tune_record();
    backend.set_autotune_mode(Some(mode));
    let realized = crate::plan_store::without_persisting(|| crate::realize(&[&y]));
    backend.set_autotune_mode(None);
    realized?;
    // `None`: this process had compiled the same graph already (its record is in the store).
    Ok(backend.take_last_tune_record())
}

/// Writes every tuning record and cached GEMM kernel of this machine's namespace to one file.
pub fn export_bundle(path: impl AsRef<std::path::Path>) -> Result<BundleSummary> {
    Ok(kiln_autotune::Store::global().export_bundle(path.as_ref())?)
}

/// The architecture of this machine's GPU 0 in `flavor`'s terms (`sm_90` for CUDA, `gfx90a` for HIP), where the
/// build has that device's feature and the machine such a GPU: what a bundle of its compiled kernels must have been
/// compiled for.
pub fn local_gpu_arch(flavor: kiln_jit::render::cuda::Flavor) -> Option<String> {
    use kiln_jit::render::cuda::Flavor;
    match flavor {
        Flavor::Cuda => {
            #[cfg(feature = "cuda")]
            return kiln_backends::cuda::backend(0).ok().map(|b| b.arch().to_string());
            #[cfg(not(feature = "cuda"))]
            None
        }
        Flavor::Hip => {
            #[cfg(feature = "hip")]
            return kiln_backends::hip::backend(0).ok().map(|b| b.arch().to_string());
            #[cfg(not(feature = "hip"))]
            None
        }
    }
}

/// What [`warm_from_cache`] found in the cache dir and prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Warmed {
    /// Tuning records read into memory.
    pub records: usize,
    /// Artifacts (compiled kernels, plans, the buffer profile) read into memory.
    pub artifacts: usize,
    /// Plans compiled ahead of their first use.
    pub plans: usize,
}

/// For a process that starts on a warm cache dir (`KILN_CACHE_DIR`, filled by earlier runs or by `kiln cache
/// import`) rather than importing a bundle itself: reads every entry of this machine's namespace into memory, then
/// prepares what [`import_bundle`] prepares (mapped kernels, pool buffers, the GEMM runtime, the compiled plans),
/// so the first step is as warm as after an import. Bad entries are rejected with a warning, as at any lookup.
pub fn warm_from_cache() -> Warmed {
    let (records, artifacts) = kiln_autotune::Store::global().load_all();
    Warmed { records, artifacts, plans: prepare_stored() }
}

/// What an import and a warm start both prepare once the store's memory holds the entries: the runtime's one-time
/// costs (mapped kernels, pool buffers, the GEMM runtime), then the persisted plans. Returns the plans compiled.
fn prepare_stored() -> usize {
    kiln_backends::runtime::warm_up();
    persisted_plans()
}

/// Compiles the persisted plans (`plan_store`); returns how many.
#[cfg(feature = "cpu")]
fn persisted_plans() -> usize {
    crate::plan_store::build_persisted()
}

/// Persisted plans are CPU plans: a build without the CPU compiles none (and an imported bundle's stay stored).
#[cfg(not(feature = "cpu"))]
fn persisted_plans() -> usize {
    0
}

/// Loads a bundle written by [`export_bundle`] on a machine with the same CPU fingerprint and kiln version, and
/// pays here rather than in the first step what the first step would otherwise pay once: the GEMM runtime's start-up
/// (thread pool, the library candidate's cache probing and first calls, pack buffers), the buffers the bundle's
/// plans keep live, allocated and faulted in (`stats().fresh_host_buffers` stays unchanged in that first step), and
/// the mapping of the bundle's compiled kernels, all in two executable mappings (`stats().code_mappings` stays
/// unchanged in that first step), and the compiling of the bundle's plans (every CPU plan the exporting cache had
/// compiled, from its graph's signature: no tuning or code generation, ~0.3 ms for a training step's plan; one that
/// cannot be compiled is skipped with a warning and compiled at its first use, as without a bundle).
pub fn import_bundle(path: impl AsRef<std::path::Path>) -> Result<BundleSummary> {
    let path = path.as_ref();
    // A bundle of GPU code (`kiln cache export --cuda-arch` / `--hip-arch`) goes to the store of its architecture.
    let gpu = kiln_backends::gpu_cache::import_bundle(path, local_gpu_arch).map_err(|reason| {
        crate::Error::Cache(kiln_autotune::StoreError::Bundle { path: path.to_path_buf(), reason })
    })?;
    if let Some((_, summary)) = gpu {
        return Ok(summary);
    }
    let summary = kiln_autotune::Store::global().import_bundle(path)?;
    prepare_stored();
    Ok(summary)
}
