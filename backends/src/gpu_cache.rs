//! GPU code on disk, and compiling it ahead of time for a GPU this machine does not have: cubins for the CUDA
//! device (NVRTC) and code objects for the HIP device (hiprtc), one scheme for both.
//!
//! A kernel's compiled code depends on its source, the language (CUDA C or HIP C), the architecture it is compiled
//! for and the compiler. Each GPU device keeps it in a store of its own (the tuning store's format: atomic writes,
//! checksummed entries, a namespace per kiln version) whose fingerprint is the language and architecture and the
//! compiler's version (`cuda-sm_90` / `NVRTC 13.0`, `hip-gfx90a` / `hiprtc 5.2`). Each code object is keyed by its
//! kernel's whole source (the store compares key texts, so two sources never share one). A GPU of that
//! architecture finds every kernel an earlier process, or a build machine, compiled with that compiler, whatever the
//! GPU model or driver.
//!
//! **Ahead of time.** With `KILN_CUDA_ARCH=sm_90` (several: `sm_80,sm_90`) or `KILN_HIP_ARCH=gfx90a`, every plan a
//! device compiles in this process is also scheduled as the GPU devices schedule it ([`schedule`]), rendered and
//! compiled for those architectures into their stores. So: run the workload once on a build machine (on the CPU;
//! no GPU and no driver, only the compiler), `kiln cache export --cuda-arch sm_90 FILE` (or `--hip-arch gfx90a`)
//! writes that store as a bundle, and `kiln cache import FILE` (or `kiln::tune::import_bundle`) on the GPU machine
//! puts it where the device looks: its first run compiles nothing. Importing a bundle made for another architecture
//! than the machine's GPU (or, without one, than the variable names first) is refused, naming both.
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

/// How one GPU language's code is named: in fingerprints, messages, the variable and the `kiln cache` flag.
struct Names {
    /// The fingerprint's prefix: `cuda-sm_90`.
    prefix: &'static str,
    compiler: &'static str,
    /// What a compiled kernel is called.
    code: &'static str,
    /// The ahead-of-time variable.
    var: &'static str,
    /// `kiln cache export`'s flag.
    flag: &'static str,
}

fn names(flavor: Flavor) -> &'static Names {
    match flavor {
        Flavor::Cuda => {
            &Names { prefix: "cuda", compiler: "NVRTC", code: "cubins", var: "KILN_CUDA_ARCH", flag: "--cuda-arch" }
        }
        Flavor::Hip => {
            &Names { prefix: "hip", compiler: "hiprtc", code: "code objects", var: "KILN_HIP_ARCH", flag: "--hip-arch" }
        }
    }
}

/// What compiled code is called for `flavor` ("cubins", "code objects"), for messages.
pub fn code_name(flavor: Flavor) -> &'static str {
    names(flavor).code
}

/// The variable that names the architectures to compile `flavor`'s code for ahead of time (`KILN_CUDA_ARCH`).
pub fn arch_var(flavor: Flavor) -> &'static str {
    names(flavor).var
}

/// The start of every compiled kernel's artifact name (then the kernel's source).
const ARTIFACT_PREFIX: &str = "code\n";

static COMPILES: AtomicU64 = AtomicU64::new(0);

/// Kernels NVRTC or hiprtc compiled in this process (cache misses), for tests and `kiln::stats`-style reports.
pub fn compiles() -> u64 {
    COMPILES.load(Ordering::Relaxed)
}

/// The fingerprint of the code for `flavor` and `arch` made by compiler `version`.
pub fn fingerprint(flavor: Flavor, arch: &str, version: (i32, i32)) -> DeviceFingerprint {
    let n = names(flavor);
    DeviceFingerprint {
        arch: format!("{}-{arch}", n.prefix),
        model: format!("{} {}.{}", n.compiler, version.0, version.1),
        features: Vec::new(),
    }
}

/// The language and architecture of a GPU code store's fingerprint (`None` for another device's).
pub fn target_of(fp: &DeviceFingerprint) -> Option<(Flavor, &str)> {
    [Flavor::Cuda, Flavor::Hip].into_iter().find_map(|f| {
        let arch = fp.arch.strip_prefix(names(f).prefix)?.strip_prefix('-')?;
        Some((f, arch))
    })
}

/// The compiler of `flavor` (NVRTC, hiprtc), loaded once per process (`Rtc` says where it looks and what to install).
pub fn compiler(flavor: Flavor) -> Result<&'static Rtc, String> {
    static NVRTC: OnceLock<Result<Rtc, String>> = OnceLock::new();
    static HIPRTC: OnceLock<Result<Rtc, String>> = OnceLock::new();
    match flavor {
        Flavor::Cuda => NVRTC.get_or_init(Rtc::nvrtc),
        Flavor::Hip => HIPRTC.get_or_init(Rtc::hiprtc),
    }
    .as_ref()
    .map_err(Clone::clone)
}

/// The code store for `flavor` and `arch` with this process's compiler, under the process-wide cache root (memory
/// only where that store is).
pub fn store(flavor: Flavor, arch: &str) -> Result<&'static Store, String> {
    static STORES: OnceLock<Mutex<HashMap<String, &'static Store>>> = OnceLock::new();
    let version = compiler(flavor)?.version()?;
    let fp = fingerprint(flavor, arch, version);
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

/// Whether the code store for `flavor` and `arch` already holds `source` compiled (imported in a bundle, or compiled
/// by an earlier run): no compiler is called for it.
pub fn is_compiled(flavor: Flavor, arch: &str, source: &str) -> bool {
    store(flavor, arch).is_ok_and(|s| s.get_artifact(&format!("{ARTIFACT_PREFIX}{source}")).is_some())
}

/// The compiled code of several rendered kernels `(source, name)` for `flavor` and `arch`, in order: those the
/// store lacks are compiled in parallel where the compiler allows it (NVRTC: one program per thread, up to the
/// machine's cores), so a plan's cold start waits for its slowest kernel per core rather than for their sum; hiprtc
/// compiles one program at a time ([`Rtc::concurrent`]), so it gets one thread.
pub fn compiled(flavor: Flavor, kernels: &[(&str, &str)], arch: &str) -> Result<Vec<Vec<u8>>, String> {
    let store = store(flavor, arch)?;
    let key = |source: &str| format!("{ARTIFACT_PREFIX}{source}");
    let mut out: Vec<Option<Vec<u8>>> = kernels.iter().map(|(source, _)| store.get_artifact(&key(source))).collect();
    let missing: Vec<usize> = (0..kernels.len()).filter(|&i| out[i].is_none()).collect();
    if !missing.is_empty() {
        let rtc = compiler(flavor)?;
        let cores = if rtc.concurrent() { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { 1 };
        let threads = cores.min(missing.len());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: Vec<(usize, Result<Vec<u8>, String>)> = std::thread::scope(|s| {
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
        for (i, result) in done {
            let bytes = result?;
            COMPILES.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = store.put_artifact(&key(kernels[i].0), &bytes) {
                crate::runtime::cache_write_failed(names(flavor).code, &e);
            }
            out[i] = Some(bytes);
        }
    }
    out.into_iter()
        .zip(kernels)
        .map(|(c, (_, name))| c.ok_or_else(|| format!("kernel {name}: a compile thread stopped")))
        .collect()
}

/// How the GPU devices schedule a graph (one function, so ahead-of-time compiles match what the devices run): the
/// default options, with bf16 and f16 GEMMs (rule 2e: the templates read half operands where they are stored and
/// round a half product as they store it).
pub fn schedule(graph: &Graph) -> KernelPlan {
    let opts = kiln_jit::kernel::ScheduleOptions { bf16_gemm: true, f16_gemm: true, ..Default::default() };
    kiln_jit::kernel::schedule_with(graph, opts)
}

/// How a GPU device renders a kernel for architecture `arch` untuned: a GEMM as its best-scored candidate
/// (`gpu_gemm::analytic_best`: the tensor-core template for bf16 on CUDA sm_80 and later, else a SIMT tile), anything
/// else (or a GEMM the templates decline) as the generic kernel. What ahead-of-time compiles render and what a device
/// runs with `KILN_AUTOTUNE=off`; a device with tuning on runs its race's winner (`gpu/tune.rs`).
pub fn render(flavor: Flavor, arch: &str, k: &KernelIr) -> Result<GpuKernel, String> {
    if let Some(v) = GemmView::of(k)
        && let Some(c) = crate::gpu_gemm::analytic_best(flavor, arch, k, &v)
        && let Ok(g) = c.render(k, &v, flavor)
    {
        return Ok(g);
    }
    cuda::render(k, flavor)
}

/// The architectures `KILN_CUDA_ARCH` or `KILN_HIP_ARCH` names (read once), empty when unset.
pub fn precompile_archs(flavor: Flavor) -> &'static [String] {
    static ARCHS: OnceLock<[Vec<String>; 2]> = OnceLock::new();
    let read = |f: Flavor| -> Vec<String> {
        let text = std::env::var(names(f).var).unwrap_or_default();
        text.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect()
    };
    let archs = ARCHS.get_or_init(|| [read(Flavor::Cuda), read(Flavor::Hip)]);
    match flavor {
        Flavor::Cuda => &archs[0],
        Flavor::Hip => &archs[1],
    }
}

/// Whether this process compiles every plan for a GPU too (`KILN_CUDA_ARCH` or `KILN_HIP_ARCH` names an
/// architecture): the CPU then records what the GPU devices record where the two differ (a sort), so that the code
/// compiled ahead of time is the code a GPU run of the same program asks for.
pub fn precompiling() -> bool {
    [Flavor::Cuda, Flavor::Hip].into_iter().any(|f| !precompile_archs(f).is_empty())
}

/// With `KILN_CUDA_ARCH` or `KILN_HIP_ARCH` set: compiles the code the GPU devices would run for `graph` into the
/// stores of those architectures (see the module doc). Kernels a dialect cannot render (an index past i32) are
/// left out: the device refuses such a graph itself. A compile error is an error: the user asked for this code.
pub fn precompile(graph: &Graph) -> Result<(), String> {
    let mut plan = None;
    for flavor in [Flavor::Cuda, Flavor::Hip] {
        let archs = precompile_archs(flavor);
        if archs.is_empty() {
            continue;
        }
        let plan = plan.get_or_insert_with(|| schedule(graph));
        for arch in archs {
            let kernels = rendered(flavor, arch, plan);
            let refs: Vec<(&str, &str)> =
                kernels.iter().map(|(name, source)| (source.as_str(), name.as_str())).collect();
            compiled(flavor, &refs, arch).map_err(|e| format!("{}={arch}: {e}", names(flavor).var))?;
        }
    }
    Ok(())
}

/// Imports the bundle at `path` into its code store if it is a bundle of GPU code, saying whose (`None` otherwise: the caller
/// imports it into the CPU's store). `local_arch(flavor)` is this machine's GPU architecture for that language, if
/// it has one; without it, the first architecture `KILN_CUDA_ARCH` / `KILN_HIP_ARCH` names stands for it. Refused
/// when the bundle was made for another architecture, or by another compiler version than this machine's.
pub fn import_bundle(
    path: &Path,
    local_arch: impl Fn(Flavor) -> Option<String>,
) -> Result<Option<(Flavor, BundleSummary)>, String> {
    let (_, fp) = kiln_autotune::bundle_device(path).map_err(|e| e.to_string())?;
    let Some((flavor, arch)) = target_of(&fp) else { return Ok(None) };
    let n = names(flavor);
    let local = local_arch(flavor).or_else(|| precompile_archs(flavor).first().cloned());
    if let Some(local) = local
        && local != arch
    {
        return Err(format!(
            "{}: refusing a bundle of {} compiled for {arch} ({}): this machine's GPU is {local}. Compile for it \
             with {}={local} and `kiln cache export {} {local}`",
            path.display(),
            n.code,
            fp.model,
            n.var,
            n.flag
        ));
    }
    let store = store(flavor, arch)?;
    store.import_bundle(path).map(|s| Some((flavor, s))).map_err(|e| e.to_string())
}

/// The kernels of `plan` that `precompile` compiles for `flavor` and `arch`: (name, source).
pub fn rendered(flavor: Flavor, arch: &str, plan: &KernelPlan) -> Vec<(String, String)> {
    plan.launches.iter().filter_map(|l| render(flavor, arch, &l.kernel).ok()).map(|k| (k.name, k.source)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stores_fingerprint_names_its_language_and_architecture() {
        for (flavor, arch) in [(Flavor::Cuda, "sm_90"), (Flavor::Hip, "gfx90a:sramecc+:xnack-")] {
            let fp = fingerprint(flavor, arch, (5, 2));
            assert_eq!(target_of(&fp), Some((flavor, arch)), "{fp:?}");
        }
        assert_eq!(fingerprint(Flavor::Hip, "gfx90a", (5, 2)).model, "hiprtc 5.2");
        let cpu = DeviceFingerprint { arch: "x86_64".into(), model: "cpu".into(), features: Vec::new() };
        assert_eq!(target_of(&cpu), None);
        // `cuda-` and `hip-` are distinct prefixes: neither is read as the other.
        let odd = DeviceFingerprint { arch: "hipster-x".into(), model: String::new(), features: Vec::new() };
        assert_eq!(target_of(&odd), None);
    }
}
