//! GPU code compiled ahead of time on a machine without a GPU (`kiln_backends::gpu_cache`), for both GPU
//! languages: a run on the CPU with `KILN_CUDA_ARCH=sm_90` (or `KILN_HIP_ARCH=gfx90a`) compiles the cubins (code
//! objects) the GPU device would run into the cache, a second run finds them all, `kiln cache export --cuda-arch
//! sm_90` (`--hip-arch gfx90a`) bundles them, `kiln cache import` puts them in another cache where a run compiles
//! nothing, and a machine of another architecture refuses the bundle. Needs NVRTC and hiprtc (CI installs them and
//! sets `KILN_CHECK_GPU_C=1`, which makes their absence a failure; elsewhere the test says it skips).

#![cfg(feature = "cpu")]

mod test_cache;

use kiln::{Device, Tensor};
use kiln_jit::render::cuda::Flavor;
use std::path::Path;
use std::process::{Command, Output};

/// One GPU language as the test drives it.
struct Lang {
    flavor: Flavor,
    var: &'static str,
    flag: &'static str,
    /// The architecture compiled for, and another one.
    arch: &'static str,
    other: &'static str,
    /// What `kiln cache` calls the compiled kernels.
    code: &'static str,
}

const CUDA: Lang = Lang {
    flavor: Flavor::Cuda,
    var: "KILN_CUDA_ARCH",
    flag: "--cuda-arch",
    arch: "sm_90",
    other: "sm_80",
    code: "cubins",
};
const HIP: Lang = Lang {
    flavor: Flavor::Hip,
    var: "KILN_HIP_ARCH",
    flag: "--hip-arch",
    arch: "gfx90a",
    other: "gfx1030",
    code: "code objects",
};

fn compiler_here(lang: &Lang) -> bool {
    match kiln_backends::gpu_cache::compiler(lang.flavor) {
        Ok(_) => true,
        Err(e) if std::env::var("KILN_CHECK_GPU_C").is_ok_and(|v| v == "1") => {
            panic!("KILN_CHECK_GPU_C=1 but {} is missing: {e}", lang.flavor.name())
        }
        Err(e) => {
            eprintln!("skipping the {} cache: {e}", lang.flavor.name());
            false
        }
    }
}

/// The child process: a small model's step on the CPU, then what the code cache did for the language named by
/// `KILN_GPU_CACHE_CHILD`.
#[test]
#[ignore = "the child process of gpu_code_compiles_ahead_of_time_and_travels_in_a_bundle"]
fn precompile_child() {
    let lang = match std::env::var("KILN_GPU_CACHE_CHILD").as_deref() {
        Ok("cuda") => CUDA,
        Ok("hip") => HIP,
        _ => return,
    };
    let dev = Device::cpu();
    let x = Tensor::from_vec((0..96).map(|i| i as f32 * 0.1).collect(), [8, 12], &dev).unwrap();
    let idx = Tensor::from_vec(vec![2i64, 0, 7], [3], &dev).unwrap();
    let y = ((x.exp() * 2.0 + 1.0).sum(1, false).index_select(0, &idx) - 0.5).relu();
    y.realize().unwrap();
    // A top k, which the CPU alone runs as a routine the GPUs' renderers lack: compiling ahead of time, the CPU
    // records what a GPU run would (the sort's comparisons), so its kernels are compiled too.
    let (top, _) = x.topk(3, 1, true);
    let graph = kiln::capture(&[&top]).unwrap().graph;
    let routine = graph.topo_order().into_iter().any(|n| matches!(graph.node(n).op, kiln_jit::Op::SortRows { .. }));
    assert!(!routine, "a CPU run compiling for a GPU recorded the row sort routine");
    top.realize().unwrap();
    let store = kiln_backends::gpu_cache::store(lang.flavor, lang.arch).unwrap();
    let stored = store.entries().iter().filter(|e| !e.foreign && e.problem.is_none()).count();
    println!("compiles={} stored={stored}", kiln_backends::gpu_cache::compiles());
}

/// Runs the child with `KILN_CACHE_DIR=cache` and the language's variable set; returns (compiles, kernels on disk).
fn child(lang: &Lang, cache: &Path) -> (usize, usize) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "precompile_child", "--nocapture", "--test-threads", "1"])
        .env("KILN_GPU_CACHE_CHILD", if lang.flavor == Flavor::Cuda { "cuda" } else { "hip" })
        .env("KILN_CACHE_DIR", cache)
        .env(lang.var, lang.arch)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.contains("compiles=")).unwrap_or_else(|| panic!("no report:\n{text}"));
    let num = |k: &str| line.split(k).nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap();
    (num("compiles="), num("stored="))
}

fn kiln(lang: &Lang, cache: &Path, args: &[&str], arch: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).env("KILN_CACHE_DIR", cache).env_remove("KILN_CUDA_ARCH").env_remove("KILN_HIP_ARCH");
    if let Some(a) = arch {
        cmd.env(lang.var, a);
    }
    cmd.output().unwrap()
}

fn compile_ahead_of_time_and_travel(lang: &Lang) {
    if !compiler_here(lang) {
        return;
    }
    let (arch, code) = (lang.arch, lang.code);
    let (build, deploy, other) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (compiled, stored) = child(lang, build.path());
    assert!(compiled >= 2, "the step's kernels compile for {arch}: {compiled}");
    println!("{compiled} {code} compiled for {arch} on the CPU run");
    assert_eq!(stored, compiled, "each compiled kernel is in the cache");
    assert_eq!(child(lang, build.path()), (0, stored), "a second run finds every kernel on disk");

    let bundle = build.path().join("gpu.kiln");
    let b = bundle.to_str().unwrap();
    let out = kiln(lang, build.path(), &["cache", "export", lang.flag, arch, b], None);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains(&format!("exported {stored} {code} for {arch}")), "{said}{out:?}");

    // The deploy machine's GPU is `arch` (no GPU here: the variable stands for it): imported, nothing compiles.
    let out = kiln(lang, deploy.path(), &["cache", "import", b], Some(arch));
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("imported {stored} {code}")), "{out:?}");
    assert_eq!(child(lang, deploy.path()), (0, stored), "the imported code serves the deploy machine's run");

    // Another architecture refuses it, naming both, and stores nothing.
    let out = kiln(lang, other.path(), &["cache", "import", b], Some(lang.other));
    let err = String::from_utf8_lossy(&out.stderr);
    let refused = err.contains(&format!("compiled for {arch}")) && err.contains(&format!("GPU is {}", lang.other));
    assert!(!out.status.success() && refused, "{err}");
    // Nothing to export for an architecture nobody compiled for.
    let out = kiln(lang, build.path(), &["cache", "export", lang.flag, lang.other, b], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&format!("no {code} for {}", lang.other)), "{out:?}");
}

#[test]
fn cubins_compile_ahead_of_time_and_travel_in_a_bundle() {
    compile_ahead_of_time_and_travel(&CUDA);
}

#[test]
fn hip_code_objects_compile_ahead_of_time_and_travel_in_a_bundle() {
    compile_ahead_of_time_and_travel(&HIP);
}
