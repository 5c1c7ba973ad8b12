//! One test body for opening each GPU device (`tests/cuda_device.rs`, `tests/hip_device.rs`): where the device is
//! there it opens, names itself and moves data of every dtype bit for bit; where it is not, opening it is an error
//! that says what is missing, the same error when asked again, never a panic; and a fused graph with a reduction
//! and a gather matches the CPU where there is a GPU; plans replayed with new inputs match the CPU; and every GEMM
//! candidate of the devices' race, forced, matches the interpreter (also on the host stand-in, `tests/cuda_host.rs`).
//!
//! Each test crate that says `mod gpu_open;` uses a subset of it, hence `dead_code`.
#![allow(dead_code)]

use kiln::{DType, Device, HostBuffer, Tensor};
use kiln_backends::gpu_gemm::GpuGemm;
use kiln_jit::kernel::KernelIr;

/// What differs between the GPU devices in these checks.
pub struct Gpu {
    /// `Device::cuda`, `Device::hip`.
    pub open: fn(usize) -> kiln::Result<Device>,
    /// `cuda`, `hip`: the device's name in errors and `"cuda:0"`.
    pub name: &'static str,
    /// The variable that makes a missing device a failure (`KILN_REQUIRE_CUDA`).
    pub require: &'static str,
    /// What `describe()` names (the architecture's prefix: `sm_`, `gfx`).
    pub arch: &'static str,
    /// Words of which a missing device's error contains one: what to install, or that there is no device.
    pub missing: &'static [&'static str],
    /// The error for an ordinal past the devices, e.g. `no CUDA device`.
    pub no_device: &'static str,
}

/// Opens device 0, or checks the error that says why it cannot be opened.
pub fn opens_or_says_what_is_missing(gpu: &Gpu) {
    let required = std::env::var(gpu.require).is_ok_and(|v| v == "1");
    match (gpu.open)(0) {
        Ok(dev) => {
            assert_eq!(dev.to_string(), format!("{}:0", gpu.name));
            assert!(dev.describe().contains(gpu.arch), "{}", dev.describe());
            for dtype in DType::ALL {
                let vals: Vec<f64> = (0..1000)
                    .map(|i| if dtype == DType::Bool { (i % 3 == 0) as u8 as f64 } else { (i % 97) as f64 })
                    .collect();
                let host = HostBuffer::from_f64(dtype, &vals);
                let t = Tensor::from_host(host.clone(), [1000], &dev).unwrap();
                assert_eq!(t.to_host().unwrap(), host, "{dtype} round trip");
            }
            // A device that does not exist is an error naming it, not a panic.
            let err = (gpu.open)(4096).unwrap_err().to_string();
            assert!(err.contains(&format!("{} 4096", gpu.no_device)), "{err}");
        }
        Err(e) => {
            assert!(!required, "{}=1 but opening {} device 0 failed: {e}", gpu.require, gpu.name);
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{} is unavailable: ", gpu.name)), "{msg}");
            assert!(gpu.missing.iter().any(|w| msg.contains(w)), "the error must say what is missing: {msg}");
            // Asked again: the same answer (remembered), still no panic, and `"<name>:1".parse()` agrees.
            assert_eq!((gpu.open)(0).unwrap_err().to_string(), msg);
            assert!(format!("{}:1", gpu.name).parse::<Device>().is_err());
            eprintln!("no {} device here, as expected on this machine: {msg}", gpu.name);
        }
    }
    let unknown = format!("{}:x", gpu.name).parse::<Device>().unwrap_err().to_string();
    assert!(unknown.contains("unknown device") && unknown.contains(&format!("{}:N", gpu.name)), "{unknown}");
}

/// A fused graph with a reduction and a gather on `dev` against the CPU (the device-generic suites cover the rest).
pub fn a_fused_graph_matches_the_cpu(dev: &Device) {
    let run = |d: &Device| {
        let x = Tensor::from_vec((0..4096).map(|i| (i as f32 * 0.01).sin()).collect(), [64, 64], d).unwrap();
        let idx = Tensor::from_vec(vec![3i64, 0, 63, 7], [4], d).unwrap();
        let y = (x.exp() * 2.0 + 1.0).sum(1, false).index_select(0, &idx);
        y.to_vec::<f32>().unwrap()
    };
    let (a, b) = (run(&Device::cpu()), run(dev));
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "cpu {a:?}\n{dev} {b:?}");
    }
}

/// The same graph run five times on `dev` with new inputs each time, against the CPU: from its second run a plan
/// replays as a device graph where the device has them (CUDA graphs), whose nodes must follow each run's buffers.
pub fn replayed_plans_match_the_cpu(dev: &Device) {
    let w = |d: &Device| Tensor::from_vec((0..64 * 32).map(|i| (i as f32 * 0.37).cos() * 0.2).collect(), [64, 32], d);
    let (wc, wd) = (w(&Device::cpu()).unwrap(), w(dev).unwrap());
    for round in 0..5 {
        let run = |d: &Device, w: &Tensor| {
            let vals = (0..16 * 64).map(|i| (i as f32 * 0.01 + round as f32).sin()).collect();
            let x = Tensor::from_vec(vals, [16, 64], d).unwrap();
            let y = ((x.matmul(w) + 1.0).relu().softmax(-1) * 2.0).sum(1, false) + x.exp().mean(1, false);
            y.to_vec::<f32>().unwrap()
        };
        let (a, b) = (run(&Device::cpu(), &wc), run(dev, &wd));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "run {round}: cpu {a:?}\n{dev} {b:?}");
        }
    }
}

/// Renders and runs GEMM kernel `k` as one candidate on `inputs`, returning its output.
pub type RunGemm<'a> = dyn Fn(&KernelIr, GpuGemm, &[&HostBuffer]) -> Result<HostBuffer, String> + 'a;

/// The GEMMs the forced-candidate tests run (ragged, a transposed operand, batched, fused epilogues, decode shapes
/// whose candidates split K, strides of 8; f32 and bf16 operands), each with its name.
fn gemm_cases() -> Vec<(&'static str, Tensor)> {
    use crate::common::rand_f32 as rand;
    let bf = |t: Tensor| t.to_dtype(DType::BF16);
    vec![
        ("ragged 70 x 130 x 33", rand(&[70, 33], 1).matmul(&rand(&[33, 130], 2))),
        ("x @ w.t() + bias, relu", (rand(&[12, 40], 5).matmul(&rand(&[27, 40], 6).t()) + rand(&[27], 9)).relu()),
        // Products of about +-2: the GELU's curved part.
        ("x @ w + bias, gelu", {
            let y = rand(&[12, 40], 19).matmul(&rand(&[40, 27], 20)) + rand(&[27], 21);
            kiln::nn::functional::gelu(&y, kiln::nn::functional::Approximate::Tanh)
        }),
        ("batched", rand(&[3, 17, 20], 7).matmul(&rand(&[3, 20, 33], 8))),
        // A relu's backward: the product masked by the forward's pre-activation, an epilogue no library has.
        (
            "dy @ w.t() where h > 0",
            rand(&[12, 27], 22).le(0).where_(0, rand(&[12, 40], 23).matmul(&rand(&[27, 40], 24).t())),
        ),
        ("bf16 ragged", bf(rand(&[70, 33], 1)).matmul(&bf(rand(&[33, 130], 2)))),
        ("bf16 x @ w.t(), relu", bf(rand(&[12, 40], 5)).matmul(&bf(rand(&[27, 40], 6)).t()).relu()),
        ("bf16 batched", bf(rand(&[3, 17, 20], 7)).matmul(&bf(rand(&[3, 20, 33], 8)))),
        // Decode shapes: few rows, a long ragged K (the candidates split it).
        ("decode 6 x 600 x 70 + bias", rand(&[6, 600], 10).matmul(&rand(&[600, 70], 11)) + rand(&[70], 12)),
        ("bf16 decode 9 x 700 x 40, x @ w.t()", bf(rand(&[9, 700], 13)).matmul(&bf(rand(&[40, 700], 14)).t())),
        // Strides of 8: the tensor-core template stages both operands 16 bytes a load.
        ("bf16 aligned 24 x 64 x 48, x @ w.t()", bf(rand(&[24, 64], 15)).matmul(&bf(rand(&[48, 64], 16)).t())),
        // f16 operands and output (the GPU devices read f16 operands where they are stored).
        ("f16 ragged", rand(&[70, 33], 17).to_dtype(DType::F16).matmul(&rand(&[33, 130], 18).to_dtype(DType::F16))),
    ]
}

/// Forces every GEMM candidate a GPU device races (`kiln_backends::gpu_gemm::candidates` for `flavor` and `arch`,
/// those `keep` keeps; `run` renders and runs one kernel as one candidate) on GEMMs of every kind (ragged, a
/// transposed operand, batched, a fused epilogue, decode shapes whose candidates split K; f32 and bf16 operands) and
/// compares each with the interpreter.
/// Returns how many (GEMM, candidate) pairs ran.
pub fn every_gemm_candidate_matches_the_interpreter(
    flavor: kiln_jit::render::cuda::Flavor,
    arch: &str,
    keep: &dyn Fn(GpuGemm) -> bool,
    run: &RunGemm<'_>,
) -> usize {
    use crate::common::{Kind, compare, gemm_tol, tol, with_last_launch};
    let cases = gemm_cases();
    // The GPU devices' schedule (bf16 operands read where they are stored), without the transposed-operand copy.
    let options = kiln_jit::kernel::ScheduleOptions {
        transpose_copy: false,
        bf16_gemm: true,
        f16_gemm: true,
        ..Default::default()
    };
    let mut ran = 0;
    for (name, out) in &cases {
        ran += with_last_launch(name, out, options, |kernel, args, want| {
            let v = kiln_jit::kernel::gemm::GemmView::of(kernel).unwrap_or_else(|| panic!("{name}: not a GEMM"));
            let tolerance =
                if want.dtype() == DType::F32 { gemm_tol(v.k) } else { tol(want.dtype(), Kind::Accumulate) };
            let mut n = 0;
            for c in kiln_backends::gpu_gemm::candidates(flavor, arch, &v) {
                if !keep(c) || c.render(kernel, &v, flavor).is_err() {
                    continue;
                }
                let got = run(kernel, c, args).unwrap_or_else(|e| panic!("{name}: {}: {e}", c.name()));
                if let Err(e) = compare(&got, want, tolerance) {
                    panic!("{name}: {} is wrong: {e}", c.name());
                }
                n += 1;
            }
            n
        });
    }
    ran
}

/// Runs GEMM kernel `k` as the device's library contestant on `inputs`, returning its output and whether the
/// epilogue ran as a pass after the library's product.
pub type RunLibrary<'a> = dyn Fn(&KernelIr, &[&HostBuffer]) -> Result<(HostBuffer, bool), String> + 'a;

/// The device's library contestant (`kiln_backends::gpu_library`; cuBLASLt on CUDA) on every GEMM of
/// [`gemm_cases`] whose layouts it takes (the epilogue fused where the library has it, else a pass after its
/// product), against the interpreter at the templates' tolerances. Returns the names of the GEMMs it ran, each with
/// whether it ran a pass, or the library's error on the first (where it is not installed).
pub fn library_gemm_matches_the_interpreter(run: &RunLibrary<'_>) -> Result<Vec<(&'static str, bool)>, String> {
    use crate::common::{Kind, compare, gemm_tol, tol, with_last_launch};
    let options = kiln_jit::kernel::ScheduleOptions {
        transpose_copy: false,
        bf16_gemm: true,
        f16_gemm: true,
        ..Default::default()
    };
    let mut ran = Vec::new();
    for (name, out) in gemm_cases() {
        let mut failed = None;
        with_last_launch(name, &out, options, |kernel, args, want| {
            let v = kiln_jit::kernel::gemm::GemmView::of(kernel).unwrap_or_else(|| panic!("{name}: not a GEMM"));
            if kiln_backends::gpu_library::LibGemm::product_of(kernel, &v).is_none() {
                return 0;
            }
            let tolerance =
                if want.dtype() == DType::F32 { gemm_tol(v.k) } else { tol(want.dtype(), Kind::Accumulate) };
            match run(kernel, args) {
                Ok((got, pass)) => {
                    compare(&got, want, tolerance).unwrap_or_else(|e| panic!("{name}: the library GEMM is wrong: {e}"));
                    ran.push((name, pass));
                }
                Err(e) => failed = Some(e),
            }
            1
        });
        if let Some(e) = failed {
            return Err(e);
        }
    }
    Ok(ran)
}
