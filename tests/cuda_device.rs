//! `Device::cuda` (feature `cuda`). On a machine without an NVIDIA driver (CI) opening it must be an error that
//! says what to install: never a panic (cudarc panics when it calls into a library it cannot find, so kiln asks
//! first) and never another device in its place. On a GPU machine (`KILN_REQUIRE_CUDA=1`, `scripts/gpu-check.sh`)
//! it must open, and data of every dtype must make the round trip bit for bit; the device-generic suites then run
//! on it through `common::devices()`.

#![cfg(all(feature = "cuda", feature = "cpu"))]

mod test_cache;

mod common;

mod gpu_open;

use gpu_open::Gpu;
#[cfg(feature = "nccl")]
use kiln::{DType, HostBuffer, Tensor};

const CUDA: Gpu = Gpu {
    open: kiln::Device::cuda,
    name: "cuda",
    require: "KILN_REQUIRE_CUDA",
    arch: "sm_",
    missing: &["install the NVIDIA driver", "NVRTC", "no CUDA device"],
    no_device: "no CUDA device",
};

#[test]
fn opening_cuda_works_or_says_what_is_missing() {
    gpu_open::opens_or_says_what_is_missing(&CUDA);
}

#[test]
fn a_fused_graph_matches_the_cpu() {
    if let Some(dev) = common::cuda_device() {
        gpu_open::a_fused_graph_matches_the_cpu(&dev);
    }
}

/// Every GEMM candidate the device races (the tensor-core template on sm_80 and later), forced, against the
/// interpreter.
#[test]
fn every_gemm_candidate_matches_the_interpreter_on_cuda() {
    if common::cuda_device().is_some() {
        let b = kiln_backends::cuda::backend(0).expect("the device opened above");
        let ran = gpu_open::every_gemm_candidate_matches_the_interpreter(
            kiln_jit::render::cuda::Flavor::Cuda,
            b.arch(),
            &|_| true,
            &|k, c, args| b.run_gemm_with(k, c, args),
        );
        assert!(ran >= 6, "each of the six GEMMs runs every candidate that takes it ({ran} runs)");
    }
}

/// cuBLASLt, the race's library contestant, on every GEMM whose layouts and epilogue it takes, against the
/// interpreter. Where cuBLASLt is not installed the race runs kiln's templates alone and this says so, unless
/// `KILN_REQUIRE_CUBLASLT=1` (`scripts/gpu-check.sh` sets it where it found the library), which makes that a failure.
#[test]
fn the_library_gemm_matches_the_interpreter_on_cuda() {
    if common::cuda_device().is_some() {
        let b = kiln_backends::cuda::backend(0).expect("the device opened above");
        match gpu_open::library_gemm_matches_the_interpreter(&|k, args| b.run_library_with(k, args)) {
            Ok(ran) => assert!(ran.len() >= 5 && ran.iter().any(|r| r.1), "cuBLASLt ran {ran:?} (true: then a pass)"),
            Err(e) if std::env::var("KILN_REQUIRE_CUBLASLT").is_ok_and(|v| v == "1") => {
                panic!("cuBLASLt was required: {e}")
            }
            Err(e) => eprintln!("note: the library GEMM was not checked: {e}"),
        }
    }
}

/// Plans replay as CUDA graphs from their second run (unless `KILN_CUDA_GRAPHS=0`): each run's results match the
/// CPU, and the graphs were built and launched.
#[test]
fn replayed_plans_match_the_cpu_as_cuda_graphs() {
    if let Some(dev) = common::cuda_device() {
        let (built, launched, _) = kiln_backends::graph_counts();
        gpu_open::replayed_plans_match_the_cpu(&dev);
        if std::env::var("KILN_CUDA_GRAPHS").map_or(true, |v| v != "0" && v != "off") {
            let (b, l, _) = kiln_backends::graph_counts();
            assert!(
                b > built && l >= launched + 4,
                "runs 2 to 5 replay as CUDA graphs: {built}->{b} built, {launched}->{l} launched"
            );
        }
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
