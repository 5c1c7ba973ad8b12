//! `Device::hip` (feature `hip`). On a machine without an AMD GPU (CI has ROCm 5.2's runtime, which finds none;
//! elsewhere there may be no runtime at all) opening it must be an error that says what is missing: never a panic
//! and never another device in its place. On an AMD GPU machine (`KILN_REQUIRE_HIP=1`) it must open, and data of
//! every dtype must make the round trip bit for bit; the device-generic suites then run on it through
//! `common::devices()`. No such machine has run this yet (the README says so).

#![cfg(all(feature = "hip", feature = "cpu"))]

mod test_cache;

mod common;

mod gpu_open;

use gpu_open::Gpu;

const HIP: Gpu = Gpu {
    open: kiln::Device::hip,
    name: "hip",
    require: "KILN_REQUIRE_HIP",
    arch: "gfx",
    missing: &["HIP runtime not found", "hiprtc", "no HIP device 0"],
    no_device: "no HIP device",
};

#[test]
fn opening_hip_works_or_says_what_is_missing() {
    gpu_open::opens_or_says_what_is_missing(&HIP);
    // With the runtime installed (as in CI) the error names it and how many devices it sees.
    if let Err(e) = kiln::Device::hip(0) {
        let msg = e.to_string();
        if msg.contains("no HIP device 0") {
            assert!(msg.contains("libamdhip64") && msg.contains("sees 0"), "{msg}");
        }
    }
}

#[test]
fn a_fused_graph_matches_the_cpu() {
    if let Some(dev) = common::hip_device() {
        gpu_open::a_fused_graph_matches_the_cpu(&dev);
    }
}

/// Every GEMM candidate the device races (SIMT tiles on HIP), forced, against the interpreter.
#[test]
fn every_gemm_candidate_matches_the_interpreter_on_hip() {
    if common::hip_device().is_some() {
        let b = kiln_backends::hip::backend(0).expect("the device opened above");
        let ran = gpu_open::every_gemm_candidate_matches_the_interpreter(
            kiln_jit::render::cuda::Flavor::Hip,
            b.arch(),
            &|_| true,
            &|k, c, args| b.run_gemm_with(k, c, args),
        );
        assert!(ran >= 6, "each of the six GEMMs runs every candidate that takes it ({ran} runs)");
    }
}

#[test]
fn replayed_plans_match_the_cpu() {
    if let Some(dev) = common::hip_device() {
        gpu_open::replayed_plans_match_the_cpu(&dev);
    }
}

/// The device's architecture is read from the runtime's properties struct at a fixed offset (no ROCm header is
/// needed to build kiln); this holds that offset to ROCm 5's own header where it is installed (CI installs
/// `libamdhip64-dev` and sets `KILN_REQUIRE_HIP_HEADER=1`).
#[test]
fn the_architecture_name_is_read_where_the_rocm_5_header_puts_it() {
    let header = std::path::Path::new("/usr/include/hip/hip_runtime_api.h");
    if !header.exists() {
        let required = std::env::var("KILN_REQUIRE_HIP_HEADER").is_ok_and(|v| v == "1");
        assert!(!required, "KILN_REQUIRE_HIP_HEADER=1 but {} is missing (Debian: libamdhip64-dev)", header.display());
        eprintln!("skipping: no {} (Debian: libamdhip64-dev)", header.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("offset.cpp");
    std::fs::write(
        &src,
        "#define __HIP_PLATFORM_AMD__\n#include <hip/hip_runtime_api.h>\n#include <cstddef>\n#include <cstdio>\n\
         int main() { std::printf(\"%zu\", offsetof(hipDeviceProp_t, gcnArchName)); }\n",
    )
    .unwrap();
    let exe = dir.path().join("offset");
    let built = std::process::Command::new("c++").arg(&src).arg("-o").arg(&exe).output().unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let out = std::process::Command::new(&exe).output().unwrap();
    let offset: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(offset, kiln_backends::hip::ARCH_OFFSET_R0000, "gcnArchName moved in this ROCm 5 header");
}
