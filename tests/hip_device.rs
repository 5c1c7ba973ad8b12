//! `Device::hip` (feature `hip`). On a machine without an AMD GPU (CI has ROCm 5.2's runtime, which finds none;
//! elsewhere there may be no runtime at all) opening it must be an error that says what is missing: never a panic
//! and never another device in its place. On an AMD GPU machine (`KILN_REQUIRE_HIP=1`) it must open, and data of
//! every dtype must make the round trip bit for bit; the device-generic suites then run on it through
//! `common::devices()`. No such machine has run this yet (the README says so).

#![cfg(all(feature = "hip", feature = "cpu"))]

mod test_cache;

mod common;

use kiln::{DType, Device, HostBuffer, Tensor};

#[test]
fn opening_hip_works_or_says_what_is_missing() {
    let required = std::env::var("KILN_REQUIRE_HIP").is_ok_and(|v| v == "1");
    match Device::hip(0) {
        Ok(dev) => {
            assert!(matches!(dev, Device::Hip(_)), "{dev:?}");
            assert_eq!(dev.to_string(), "hip:0");
            assert!(dev.describe().contains("gfx"), "{}", dev.describe());
            for dtype in DType::ALL {
                let vals: Vec<f64> = (0..1000)
                    .map(|i| if dtype == DType::Bool { (i % 3 == 0) as u8 as f64 } else { (i % 97) as f64 })
                    .collect();
                let host = HostBuffer::from_f64(dtype, &vals);
                let t = Tensor::from_host(host.clone(), [1000], &dev).unwrap();
                assert_eq!(t.to_host().unwrap(), host, "{dtype} round trip");
            }
            let err = Device::hip(4096).unwrap_err().to_string();
            assert!(err.contains("no HIP device 4096"), "{err}");
        }
        Err(e) => {
            assert!(!required, "KILN_REQUIRE_HIP=1 but Device::hip(0) failed: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with("hip is unavailable: "), "{msg}");
            assert!(
                msg.contains("no HIP runtime found") || msg.contains("hiprtc") || msg.contains("no HIP device 0"),
                "the error must say what is missing: {msg}"
            );
            // With the runtime installed (as in CI) the error names it and how many devices it sees.
            if msg.contains("no HIP device 0") {
                assert!(msg.contains("libamdhip64") && msg.contains("sees 0"), "{msg}");
            }
            // Asked again: the same answer (remembered), still no panic, and `"hip:1".parse()` agrees.
            assert_eq!(Device::hip(0).unwrap_err().to_string(), msg);
            assert!("hip:1".parse::<Device>().is_err());
            eprintln!("no HIP device here, as expected on this machine: {msg}");
        }
    }
    let unknown = "hip:x".parse::<Device>().unwrap_err().to_string();
    assert!(unknown.contains("unknown device") && unknown.contains("hip:N"), "{unknown}");
}

/// A fused graph with a reduction and a gather, on the HIP device against the CPU (where there is an AMD GPU; the
/// device-generic suites cover the rest).
#[test]
fn a_fused_graph_matches_the_cpu() {
    let Some(dev) = common::hip_device() else { return };
    let cpu = Device::cpu();
    let run = |d: &Device| {
        let x = Tensor::from_vec((0..4096).map(|i| (i as f32 * 0.01).sin()).collect(), [64, 64], d).unwrap();
        let idx = Tensor::from_vec(vec![3i64, 0, 63, 7], [4], d).unwrap();
        let y = (x.exp() * 2.0 + 1.0).sum(1, false).index_select(0, &idx);
        y.to_vec::<f32>().unwrap()
    };
    let (a, b) = (run(&cpu), run(&dev));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "cpu {a:?}\nhip {b:?}");
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
