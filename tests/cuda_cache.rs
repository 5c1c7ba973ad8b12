//! CUDA cubins compiled ahead of time on a machine without a GPU (`kiln_backends::cuda_cache`): a run on the CPU
//! with `KILN_CUDA_ARCH=sm_90` compiles the cubins the CUDA device would run into the cache, a second run finds them
//! all, `kiln cache export --cuda-arch sm_90` bundles them, `kiln cache import` puts them in another cache where a
//! run compiles nothing, and a machine of another architecture refuses the bundle. Needs NVRTC (CI installs it and
//! sets `KILN_CHECK_GPU_C=1`, which makes its absence a failure; elsewhere the test says it skips).

#![cfg(feature = "cpu")]

mod test_cache;

use kiln::{Device, Tensor};
use std::path::Path;
use std::process::{Command, Output};

fn nvrtc_here() -> bool {
    match kiln_backends::cuda_cache::nvrtc() {
        Ok(_) => true,
        Err(e) if std::env::var("KILN_CHECK_GPU_C").is_ok_and(|v| v == "1") => {
            panic!("KILN_CHECK_GPU_C=1 but NVRTC is missing: {e}")
        }
        Err(e) => {
            eprintln!("skipping the cubin cache: {e}");
            false
        }
    }
}

/// The child process: a small model's step on the CPU, then what the cubin cache did.
#[test]
#[ignore = "the child process of cubins_compile_ahead_of_time_and_travel_in_a_bundle"]
fn precompile_child() {
    if std::env::var_os("KILN_CUDA_CACHE_CHILD").is_none() {
        return;
    }
    let dev = Device::cpu();
    let x = Tensor::from_vec((0..96).map(|i| i as f32 * 0.1).collect(), [8, 12], &dev).unwrap();
    let idx = Tensor::from_vec(vec![2i64, 0, 7], [3], &dev).unwrap();
    let y = ((x.exp() * 2.0 + 1.0).sum(1, false).index_select(0, &idx) - 0.5).relu();
    y.realize().unwrap();
    let store = kiln_backends::cuda_cache::store("sm_90").unwrap();
    let cubins = store.entries().iter().filter(|e| !e.foreign && e.problem.is_none()).count();
    println!("compiles={} cubins={cubins}", kiln_backends::cuda_cache::compiles());
}

/// Runs the child with `KILN_CACHE_DIR=cache` and `KILN_CUDA_ARCH=sm_90`; returns (compiles, cubins on disk).
fn child(cache: &Path) -> (usize, usize) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "precompile_child", "--nocapture", "--test-threads", "1"])
        .env("KILN_CUDA_CACHE_CHILD", "1")
        .env("KILN_CACHE_DIR", cache)
        .env("KILN_CUDA_ARCH", "sm_90")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.contains("compiles=")).unwrap_or_else(|| panic!("no report:\n{text}"));
    let num = |k: &str| line.split(k).nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap();
    (num("compiles="), num("cubins="))
}

fn kiln(cache: &Path, args: &[&str], arch: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).env("KILN_CACHE_DIR", cache);
    match arch {
        Some(a) => cmd.env("KILN_CUDA_ARCH", a),
        None => cmd.env_remove("KILN_CUDA_ARCH"),
    };
    cmd.output().unwrap()
}

#[test]
fn cubins_compile_ahead_of_time_and_travel_in_a_bundle() {
    if !nvrtc_here() {
        return;
    }
    let (build, deploy, other) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (compiled, stored) = child(build.path());
    assert!(compiled >= 2, "the step's kernels compile for sm_90: {compiled}");
    println!("{compiled} cubins compiled for sm_90 on the CPU run");
    assert_eq!(stored, compiled, "each compiled cubin is in the cache");
    assert_eq!(child(build.path()), (0, stored), "a second run finds every cubin on disk");

    let bundle = build.path().join("cubins.kiln");
    let b = bundle.to_str().unwrap();
    let out = kiln(build.path(), &["cache", "export", "--cuda-arch", "sm_90", b], None);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains(&format!("exported {stored} cubins for sm_90")), "{said}{out:?}");

    // The deploy machine's GPU is sm_90 (no GPU here: KILN_CUDA_ARCH stands for it): imported, nothing compiles.
    let out = kiln(deploy.path(), &["cache", "import", b], Some("sm_90"));
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("imported {stored} cubins")), "{out:?}");
    assert_eq!(child(deploy.path()), (0, stored), "the imported cubins serve the deploy machine's run");

    // Another architecture refuses it, naming both, and stores nothing.
    let out = kiln(other.path(), &["cache", "import", b], Some("sm_80"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("compiled for sm_90") && err.contains("GPU is sm_80"), "{err}");
    // Nothing to export for an architecture nobody compiled for.
    let out = kiln(build.path(), &["cache", "export", "--cuda-arch", "sm_80", b], None);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no cubins for sm_80"), "{out:?}");
}
