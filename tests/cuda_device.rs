//! `Device::cuda` (feature `cuda`). On a machine without an NVIDIA driver (CI) opening it must be an error that
//! says what to install: never a panic (cudarc panics when it calls into a library it cannot find, so kiln asks
//! first) and never another device in its place. On a GPU machine (`KILN_REQUIRE_CUDA=1`, `scripts/gpu-check.sh`)
//! it must open, and data of every dtype must make the round trip bit for bit; the device-generic suites then run
//! on it through `common::devices()`.

#![cfg(all(feature = "cuda", feature = "cpu"))]

mod test_cache;

mod common;

use kiln::{DType, Device, HostBuffer, Tensor};

#[test]
fn opening_cuda_works_or_says_what_is_missing() {
    let required = std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match Device::cuda(0) {
        Ok(dev) => {
            assert!(matches!(dev, Device::Cuda(_)), "{dev:?}");
            assert_eq!(dev.to_string(), "cuda:0");
            assert!(dev.describe().contains("sm_"), "{}", dev.describe());
            for dtype in DType::ALL {
                let vals: Vec<f64> = (0..1000)
                    .map(|i| if dtype == DType::Bool { (i % 3 == 0) as u8 as f64 } else { (i % 97) as f64 })
                    .collect();
                let host = HostBuffer::from_f64(dtype, &vals);
                let t = Tensor::from_host(host.clone(), [1000], &dev).unwrap();
                assert_eq!(t.to_host().unwrap(), host, "{dtype} round trip");
            }
            // A device that does not exist is an error naming it, not a panic.
            let err = Device::cuda(4096).unwrap_err().to_string();
            assert!(err.contains("no CUDA device 4096"), "{err}");
        }
        Err(e) => {
            assert!(!required, "KILN_REQUIRE_CUDA=1 but Device::cuda(0) failed: {e}");
            let msg = e.to_string();
            assert!(msg.starts_with("cuda is unavailable: "), "{msg}");
            assert!(
                msg.contains("install the NVIDIA driver") || msg.contains("NVRTC") || msg.contains("no CUDA device"),
                "the error must say what is missing: {msg}"
            );
            // Asked again: the same answer (remembered), still no panic, and `"cuda:1".parse()` agrees.
            assert_eq!(Device::cuda(0).unwrap_err().to_string(), msg);
            assert!("cuda:1".parse::<Device>().is_err());
            eprintln!("no CUDA here, as expected on this machine: {msg}");
        }
    }
    assert!("cuda:x".parse::<Device>().unwrap_err().to_string().contains("unknown device"));
}

/// A fused graph with a reduction and a gather, on the CUDA device against the CPU (where there is
/// a GPU; the device-generic suites cover the rest).
#[test]
fn a_fused_graph_matches_the_cpu() {
    let Some(dev) = common::cuda_device() else { return };
    let cpu = Device::cpu();
    let run = |d: &Device| {
        let x = Tensor::from_vec((0..4096).map(|i| (i as f32 * 0.01).sin()).collect(), [64, 64], d).unwrap();
        let idx = Tensor::from_vec(vec![3i64, 0, 63, 7], [4], d).unwrap();
        let y = (x.exp() * 2.0 + 1.0).sum(1, false).index_select(0, &idx);
        y.to_vec::<f32>().unwrap()
    };
    let (a, b) = (run(&cpu), run(&dev));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "cpu {a:?}\ncuda {b:?}");
    }
}

/// NCCL (feature `nccl`) is opened at run time: where it is missing (CI) asking for it is an error that says what
/// to install, never a panic.
#[cfg(feature = "nccl")]
#[test]
fn nccl_is_found_or_says_what_to_install() {
    match kiln_backends::cuda::nccl::probe() {
        Ok(version) => {
            // The unique id needs no GPU (NCCL's bootstrap only opens a socket): one rank's part of making a group.
            match kiln_backends::cuda::nccl::unique_id() {
                Ok(id) => assert!(id.iter().any(|&b| b != 0), "NCCL {version} gave an empty unique id"),
                Err(e) => eprintln!("NCCL {version} made no unique id here: {e}"),
            }
            println!("NCCL {version}");
        }
        Err(e) => {
            assert!(e.contains("NCCL not found") && e.contains("libnccl.so.2") && e.contains("KILN_NCCL"), "{e}");
            eprintln!("no NCCL here: {e}");
        }
    }
}

/// Collectives on CUDA tensors go through NCCL (feature `nccl`): a group of one process (NCCL refuses two ranks
/// on one GPU) all-reduces, broadcasts and gathers on the device, with the host path's results. Needs a GPU and
/// NCCL (`KILN_REQUIRE_NCCL=1` makes a missing NCCL a failure).
#[cfg(feature = "nccl")]
#[test]
fn a_group_of_one_moves_cuda_tensors_through_nccl() {
    use kiln::distributed::{ProcessGroup, ReduceOp};
    let Some(dev) = common::cuda_device() else { return };
    if let Err(e) = kiln_backends::cuda::nccl::probe() {
        assert!(!std::env::var("KILN_REQUIRE_NCCL").is_ok_and(|v| v == "1"), "KILN_REQUIRE_NCCL=1: {e}");
        eprintln!("skipping the NCCL group: {e}");
        return;
    }
    let group = ProcessGroup::single();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool] {
        let vals: Vec<f64> =
            (0..1000).map(|i| if dtype == DType::Bool { (i % 2) as f64 } else { (i % 7) as f64 }).collect();
        let host = HostBuffer::from_f64(dtype, &vals);
        let t = Tensor::from_host(host.clone(), [10, 100], &dev).unwrap();
        let summed = group.all_reduce(&t, ReduceOp::Sum).unwrap();
        assert_eq!(summed.device(), dev);
        assert_eq!(summed.to_host().unwrap(), host, "{dtype}: a world of one sums to its input");
        assert_eq!(group.broadcast(&t, 0).unwrap().to_host().unwrap(), host, "{dtype} broadcast");
        let gathered = group.all_gather(&t).unwrap();
        assert_eq!(gathered.dims(), &[1, 10, 100]);
        assert_eq!(gathered.to_host().unwrap(), host, "{dtype} all_gather");
    }
}
