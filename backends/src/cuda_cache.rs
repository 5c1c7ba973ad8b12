//! Cubins on disk, and compiling them ahead of time for a GPU this machine does not have.
//!
//! A CUDA kernel's cubin depends on its source, the architecture it is compiled for and the compiler. The CUDA
//! device keeps them in a store of their own (the tuning store's format: atomic writes, checksummed entries, a
//! namespace per kiln version) whose fingerprint is the architecture and NVRTC's version (`cuda-sm_90`,
//! `NVRTC 13.0`). Each cubin is keyed by its kernel's whole source (the store compares key texts, so two sources
//! never share a cubin). A GPU of that architecture finds every kernel an earlier process, or a build machine,
//! compiled with that NVRTC, whatever the GPU model or driver.
//!
//! **Ahead of time.** With `KILN_CUDA_ARCH=sm_90` (several: `sm_80,sm_90`), every plan a device compiles in this
//! process is also scheduled as the CUDA device schedules it ([`schedule`]), rendered to CUDA C and compiled for
//! those architectures into their stores. So: run the workload once on a build machine (on the CPU; no GPU and no
//! driver, only NVRTC), `kiln cache export --cuda-arch sm_90 FILE` writes that store as a bundle, and
//! `kiln cache import FILE` (or `kiln::tune::import_bundle`) on the GPU machine puts it where the device looks:
//! its first run compiles nothing. Importing a bundle made for another architecture than the machine's GPU (or,
//! without a GPU, than `KILN_CUDA_ARCH` names) is refused, naming both.
//!
//! This module needs no driver: it builds in every configuration, so a CPU-only build can precompile.

use crate::rtc::Rtc;
use kiln_autotune::{BundleSummary, DeviceFingerprint, Store};
use kiln_jit::Graph;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::kernel::{KernelIr, KernelPlan};
use kiln_jit::render::cuda::{self, Flavor, GpuKernel};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The start of every cubin's artifact name (then the kernel's source).
pub const CUBIN_PREFIX: &str = "cubin\n";

static COMPILES: AtomicU64 = AtomicU64::new(0);

/// Cubins NVRTC compiled in this process (cache misses), for tests and `kiln::stats`-style reports.
pub fn compiles() -> u64 {
    COMPILES.load(Ordering::Relaxed)
}

/// The fingerprint of the cubins for `arch` made by NVRTC `version`.
pub fn fingerprint(arch: &str, version: (i32, i32)) -> DeviceFingerprint {
    DeviceFingerprint {
        arch: format!("cuda-{arch}"),
        model: format!("NVRTC {}.{}", version.0, version.1),
        features: Vec::new(),
    }
}

/// The architecture of a CUDA cubin store's fingerprint (`None` for another device's).
pub fn arch_of(fp: &DeviceFingerprint) -> Option<&str> {
    fp.arch.strip_prefix("cuda-")
}

/// NVRTC, loaded once per process (`Rtc::nvrtc` says where it looks and what to install).
pub fn nvrtc() -> Result<&'static Rtc, String> {
    static RTC: OnceLock<Result<Rtc, String>> = OnceLock::new();
    RTC.get_or_init(Rtc::nvrtc).as_ref().map_err(Clone::clone)
}

/// The cubin store for `arch` with this process's NVRTC, under the process-wide cache root (memory only where that
/// store is).
pub fn store(arch: &str) -> Result<&'static Store, String> {
    static STORES: OnceLock<Mutex<HashMap<String, &'static Store>>> = OnceLock::new();
    let version = nvrtc()?.version()?;
    let fp = fingerprint(arch, version);
    let mut stores = STORES.get_or_init(Default::default).lock();
    let store = stores.entry(fp.id()).or_insert_with(|| {
        let store = match Store::global().root() {
            Some(root) => Store::open(root.to_path_buf(), &fp),
            None => Store::memory_only(&fp),
        };
        Box::leak(Box::new(store))
    });
    Ok(store)
}

/// The cubin of a rendered kernel for `arch`: from the store, else compiled by NVRTC and stored.
pub fn cubin(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, String> {
    let mut one = cubins(&[(source, name)], arch)?;
    Ok(one.pop().expect("one cubin per kernel"))
}

/// The cubins of several rendered kernels `(source, name)` for `arch`, in order: those the store lacks are
/// compiled in parallel (one NVRTC program per thread, up to the machine's cores: NVRTC compiles distinct programs
/// concurrently), so a plan's cold start waits for its slowest kernel per core rather than for their sum.
pub fn cubins(kernels: &[(&str, &str)], arch: &str) -> Result<Vec<Vec<u8>>, String> {
    let store = store(arch)?;
    let key = |source: &str| format!("{CUBIN_PREFIX}{source}");
    let mut out: Vec<Option<Vec<u8>>> = kernels.iter().map(|(source, _)| store.get_artifact(&key(source))).collect();
    let missing: Vec<usize> = (0..kernels.len()).filter(|&i| out[i].is_none()).collect();
    if !missing.is_empty() {
        let rtc = nvrtc()?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(missing.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let compiled: Vec<(usize, Result<Vec<u8>, String>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let j = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&i) = missing.get(j) else { break done };
                            done.push((i, rtc.compile(kernels[i].0, kernels[i].1, arch)));
                        }
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
        });
        for (i, result) in compiled {
            let bytes = result?;
            COMPILES.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = store.put_artifact(&key(kernels[i].0), &bytes) {
                crate::runtime::cache_write_failed("a cubin", &e);
            }
            out[i] = Some(bytes);
        }
    }
    out.into_iter()
        .zip(kernels)
        .map(|(c, (_, name))| c.ok_or_else(|| format!("kernel {name}: a compile thread stopped")))
        .collect()
}

/// How the CUDA device schedules a graph (one function, so ahead-of-time compiles match what the device runs).
pub fn schedule(graph: &Graph) -> KernelPlan {
    kiln_jit::kernel::schedule(graph)
}

/// How the CUDA device renders a kernel: an f32 GEMM as the tiled template in the default tile, anything else (or
/// a GEMM the template declines) as the generic kernel. Shared with ahead-of-time compiles, as `schedule` is.
pub fn render(k: &KernelIr) -> Result<GpuKernel, String> {
    if let Some(v) = GemmView::of(k)
        && let Ok(g) = cuda::render_gemm(k, &v, cuda::DEFAULT_TILE, Flavor::Cuda)
    {
        return Ok(g);
    }
    cuda::render(k, Flavor::Cuda)
}

/// The architectures `KILN_CUDA_ARCH` names (read once), empty when unset.
fn precompile_archs() -> &'static [String] {
    static ARCHS: OnceLock<Vec<String>> = OnceLock::new();
    ARCHS.get_or_init(|| {
        std::env::var("KILN_CUDA_ARCH")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect()
    })
}

/// With `KILN_CUDA_ARCH` set: compiles the cubins the CUDA device would run for `graph` into the stores of those
/// architectures (see the module doc). Kernels the CUDA dialect cannot render (an index past i32) are left out:
/// the CUDA device refuses such a graph itself. An NVRTC error is an error: the user asked for these cubins.
pub fn precompile(graph: &Graph) -> Result<(), String> {
    let archs = precompile_archs();
    if archs.is_empty() {
        return Ok(());
    }
    let kernels = rendered(&schedule(graph));
    let refs: Vec<(&str, &str)> = kernels.iter().map(|(name, source)| (source.as_str(), name.as_str())).collect();
    for arch in archs {
        cubins(&refs, arch).map_err(|e| format!("KILN_CUDA_ARCH={arch}: {e}"))?;
    }
    Ok(())
}

/// Imports the bundle at `path` into its cubin store if it is a CUDA bundle (`None` otherwise: the caller imports
/// it into the CPU's store). Refused when it was made for another architecture than `local_arch` (the GPU's, or
/// `KILN_CUDA_ARCH`'s first where there is no GPU) or by another NVRTC than this machine's.
pub fn import_bundle(path: &Path, local_arch: Option<&str>) -> Result<Option<BundleSummary>, String> {
    let (_, fp) = kiln_autotune::bundle_device(path).map_err(|e| e.to_string())?;
    let Some(arch) = arch_of(&fp) else { return Ok(None) };
    let local = local_arch.map(str::to_string).or_else(|| precompile_archs().first().cloned());
    if let Some(local) = local
        && local != arch
    {
        return Err(format!(
            "{}: refusing a bundle of cubins compiled for {arch} ({}): this machine's GPU is {local}. Compile for \
             it with KILN_CUDA_ARCH={local} and `kiln cache export --cuda-arch {local}`",
            path.display(),
            fp.model
        ));
    }
    let store = store(arch)?;
    store.import_bundle(path).map(Some).map_err(|e| e.to_string())
}

/// The kernels of `plan` that `precompile` compiles: (name, source).
pub fn rendered(plan: &KernelPlan) -> Vec<(String, String)> {
    plan.launches.iter().filter_map(|l| render(&l.kernel).ok()).map(|k| (k.name, k.source)).collect()
}
