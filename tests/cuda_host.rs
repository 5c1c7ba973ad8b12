//! The rendered CUDA C run on the host (`kiln_jit::render::cuda::host`: the kernel under a shim, every thread of
//! every block in turn, compiled by the host's C++ compiler) and compared with the reference interpreter: the
//! semantics of the GPU renderer (indices, folds, row kernels, gathers and their fault record, casts, helpers,
//! random numbers) checked on a machine without a GPU. NVRTC and hiprtc compile the same sources in CI
//! (`kiln_backends::gpu_check`); what the shim cannot cover is in `host.rs`'s doc.
//!
//! Needs a C++ compiler (`c++`, or `KILN_HOST_CXX`); without one the test says so and returns, unless
//! `KILN_REQUIRE_HOST_CXX=1` (CI), where that is a failure.

#![cfg(feature = "cpu")]

mod test_cache;

mod common;

mod gpu_open;

use common::*;
use kiln::{DType, Device, HostBuffer, Tensor, linalg};
use kiln_backends::gpu_cache::schedule as gpu_schedule;
use kiln_backends::gpu_gemm::{GpuGemm, GpuTile, candidates};
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::kernel::{Fault, KernelPlan, Slot};
use kiln_jit::render::cuda::{DEFAULT_TILE, Flavor, GpuKernel, MmaTile, host, render, render_gemm, render_gemm_mma};
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;

/// The expressions whose kernels are checked: the shared table's rows in every dtype the renderer takes.
fn corpus(dev: &Device) -> Vec<(&'static str, Vec<Tensor>)> {
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin() * 3.0).collect::<Vec<f32>>();
    let a = Tensor::from_vec(f(24, 0.7), [4, 6], dev).expect("a");
    let b = Tensor::from_vec(f(24, 1.3), [4, 6], dev).expect("b");
    let special = Tensor::from_vec(
        vec![0.0f32, -0.0, 1.0, -1.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-40, 3e9, -3e9, 255.5, -7.25],
        [12],
        dev,
    )
    .expect("special");
    let other = Tensor::from_vec(vec![0.0f32, 0.0, f32::NAN, 2.0, 2.0, -0.5, 1.0, 0.0, -3.0, 0.5, 2.0, 0.0], [12], dev)
        .expect("other");
    let (i, j) = (a.to_dtype(DType::I32), b.to_dtype(DType::I32));
    let (u, v) = (a.to_dtype(DType::U32), b.to_dtype(DType::U32));
    let (x8, y8) = (a.to_dtype(DType::U8), b.to_dtype(DType::U8));
    let idx = Tensor::from_vec(vec![5i32, 0, 3], [3], dev).expect("idx");
    vec![
        ("f32 arithmetic", vec![a.add(&b).mul(&a).sub(1.5).div(&b), a.neg().abs().sqrt().recip()]),
        ("f32 transcendentals", vec![a.sin(), a.cos(), a.tanh(), a.exp(), a.abs().log(), a.log1p(), a.expm1()]),
        ("f32 pow, max, min, fmod", vec![a.abs().pow(&b), a.maximum(&b), a.minimum(&b), a.fmod(&b)]),
        (
            "special values",
            vec![special.div(&other), special.maximum(&other), special.pow(&other), special.fmod(&other)],
        ),
        ("comparisons with NaN", vec![special.lt(&other), special.le(&other), special.eq(&other), special.ne(&other)]),
        (
            "float -> int casts",
            vec![special.to_dtype(DType::I32), special.to_dtype(DType::U32), special.to_dtype(DType::U8)],
        ),
        ("truth and rounding", vec![special.to_dtype(DType::Bool), special.floor(), special.round(), special.trunc()]),
        ("i32", vec![i.mul(&j).sub(&i).div(&j), i.remainder(&j), i.pow(j.abs()), i.maximum(&j), i.neg()]),
        ("u32", vec![u.add(&v).div(&u), u.mul(&v).sub(&v), u.pow(&v), u.minimum(&v)]),
        ("u8", vec![x8.mul(&y8).neg(), x8.pow(&y8), x8.add(&y8).div(&y8)]),
        ("bool", vec![a.lt(&b).logical_and(a.ne(&b)).logical_or(b.ge(&a).logical_not()), a.gt(&b).where_(&a, &b)]),
        ("f16", vec![a.to_dtype(DType::F16).mul(b.to_dtype(DType::F16)).add(a.to_dtype(DType::F16).exp())]),
        ("reductions", vec![a.sum(1, false), b.max(0, true), a.mul(&b).mean_all(), a.prod(1, false), b.min(1, false)]),
        (
            "row kernels",
            vec![a.softmax(-1), b.log_softmax(-1), kiln::nn::functional::layer_norm(&a, &[6], None, None, 1e-5)],
        ),
        ("movement", vec![a.t().add(1.0), a.pad(&[(1, 2), (0, 3)], 0.5), a.narrow(1, 1, 3).flip(0)]),
        ("gather", vec![a.index_select(1, &idx).mul(2.0)]),
        ("random", vec![Tensor::rand([4, 6], DType::F32, dev), Tensor::randn([5], DType::F16, dev)]),
        ("matmul", vec![a.matmul(&b.t()).relu()]),
        ("f64", {
            let (p, q) = (a.to_dtype(DType::F64), b.to_dtype(DType::F64));
            let s64 = special.to_dtype(DType::F64);
            let o64 = other.to_dtype(DType::F64);
            vec![
                p.mul(&q).add(0.1).div(&q).sin().exp(),
                p.abs().pow(&q).maximum(&p).log1p(),
                s64.div(&o64),
                s64.fmod(&o64),
                s64.lt(&o64),
                s64.to_dtype(DType::I64),
                s64.to_dtype(DType::I32),
                p.softmax(-1),
                p.sum(1, false),
                p.to_dtype(DType::F16),
                p.mul(1e-3).to_dtype(DType::BF16),
            ]
        }),
        ("i64", {
            let (m, n) = (i.to_dtype(DType::I64), j.to_dtype(DType::I64));
            vec![
                m.mul(&n).sub(&m).div(&n),
                m.remainder(&n),
                m.pow(n.abs()),
                m.maximum(&n),
                m.neg().abs(),
                m.sum(1, false),
            ]
        }),
        ("bf16", {
            let (p, q) = (a.to_dtype(DType::BF16), b.to_dtype(DType::BF16));
            vec![p.mul(&q).add(p.exp()), p.max(1, false), special.to_dtype(DType::BF16), q.to_dtype(DType::I32)]
        }),
        // Just above a tie of f16 (bf16) by 2^-40: kiln converts f64 through f32 (as `half` and PyTorch do), where it
        // lands on the tie and goes to even (down); rounded once it would go up. Scaled so the two differ by 1.
        ("f64 -> f16 and bf16 through f32", {
            let x = Tensor::from_vec(
                vec![1.0 + 2f64.powi(-11) + 2f64.powi(-40), -(1.0 + 2f64.powi(-8) + 2f64.powi(-40))],
                [2],
                dev,
            )
            .expect("x");
            vec![
                x.narrow(0, 0, 1).to_dtype(DType::F16).to_dtype(DType::F64).sub(1.0).mul(1024.0),
                x.narrow(0, 1, 1).to_dtype(DType::BF16).to_dtype(DType::F64).add(1.0).mul(128.0),
            ]
        }),
        // Long enough to run cooperatively (`cstyle::Coop`: a block folds each output, its tree in shared memory):
        // over the contiguous dim (rows of 700: sums, NaN-propagating max, i32, f16 and f64 sums, softmax and layer
        // norm as row kernels) and over a strided one (a column sum of 300 rows, 32 outputs across the lanes).
        ("cooperative reductions", {
            let long = Tensor::from_vec(f(2100, 0.37), [3, 700], dev).expect("long");
            let tall = Tensor::from_vec(f(12_000, 0.11), [300, 40], dev).expect("tall");
            let nan = long.add(special.narrow(0, 6, 1).pad(&[(350, 349)], 0.0).reshape([1, 700]));
            vec![
                long.sum(1, false),
                nan.max(1, false),
                long.min(1, true),
                tall.sum(0, false),
                tall.narrow(1, 0, 5).sum(0, false),
                long.mul(8.0).to_dtype(DType::I32).sum(1, false),
                long.to_dtype(DType::F16).sum(1, false),
                long.to_dtype(DType::F64).mul(0.5).sum(1, false),
                long.softmax(-1),
                long.log_softmax(-1),
                kiln::nn::functional::layer_norm(&long, &[700], None, None, 1e-5),
            ]
        }),
        // The scatter routine (`kernel::scatter`): rows into 3000 positions (a block of rows per thread, many
        // blocks), elements by i64 indices into f64, f16 values summed in f32.
        ("scatter", {
            let rows = Tensor::from_vec(f(35, 0.9), [7, 5], dev).expect("rows");
            let ids = Tensor::from_vec(vec![2999i32, 4, 4, 0, 1500, 4, 2999], [7], dev).expect("ids");
            let each = Tensor::from_vec((0..35).map(|k| (k * 7 % 6) as i64).collect::<Vec<_>>(), [7, 5], dev);
            let each = each.expect("each");
            vec![
                Tensor::zeros([3000, 5], DType::F32, dev).index_add(0, &ids, &rows, 1.0),
                Tensor::zeros([6, 5], DType::F64, dev).scatter_add(0, &each, &rows.to_dtype(DType::F64)),
                Tensor::zeros([3000, 5], DType::F16, dev).index_add(0, &ids, &rows.to_dtype(DType::F16), 1.0),
            ]
        }),
        (
            "random in f64 and bf16",
            vec![
                Tensor::rand([7], DType::F64, dev),
                Tensor::rand([6], DType::BF16, dev),
                Tensor::randn([4], DType::F64, dev),
            ],
        ),
    ]
}

fn buf_ptr(b: &mut HostBuffer) -> *mut c_void {
    match b {
        HostBuffer::Bool(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::U8(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::U32(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::I32(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::I64(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::F16(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::F32(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::F64(v) => v.as_mut_ptr() as *mut c_void,
        HostBuffer::BF16(v) => v.as_mut_ptr() as *mut c_void,
    }
}

/// The host's C++ compiler, or `None` (said on stderr) where there is none and none is required.
fn cxx() -> Option<String> {
    let cxx = std::env::var("KILN_HOST_CXX").unwrap_or_else(|_| "c++".into());
    let ok = std::process::Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("KILN_REQUIRE_HOST_CXX").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_HOST_CXX=1 but `{cxx}` does not run");
        }
        eprintln!("skipping: no C++ compiler (`{cxx}`) to run the rendered CUDA C on the host");
        return None;
    }
    Some(cxx)
}

type Run = unsafe extern "C" fn(*mut *mut c_void, u32, u32, u32);

/// `kernels` under the host shim, compiled by `cxx` into two shared libraries side by side (the C++ compile is most
/// of these tests' time, and the machines have two cores) and loaded; [`HostLib::run`] finds kernel `i`'s driver.
fn host_library(cxx: &str, kernels: &[(&GpuKernel, &kiln_jit::kernel::KernelIr)]) -> HostLib {
    let dir = tempfile::tempdir().expect("a temp dir");
    let per = kernels.len().div_ceil(2).max(1);
    let compile = |part: usize, chunk: &[(&GpuKernel, &kiln_jit::kernel::KernelIr)]| {
        let lib = dir.path().join(format!("kernels{part}.so"));
        host::compile_library(cxx, &host::host_unit(chunk), &lib).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: a library this test just compiled; its initializers are the C++ runtime's.
        (part * per, unsafe { libloading::Library::new(&lib) }.expect("load the kernels"))
    };
    let parts = std::thread::scope(|s| {
        let handles: Vec<_> =
            kernels.chunks(per).enumerate().map(|(part, chunk)| s.spawn(move || compile(part, chunk))).collect();
        handles.into_iter().map(|h| h.join().expect("a compiling thread")).collect()
    });
    HostLib { parts, _dir: dir }
}

/// Kernels compiled under the shim: each library with the index of its first kernel, and the directory that holds
/// them (which must outlive them).
struct HostLib {
    parts: Vec<(usize, libloading::Library)>,
    _dir: tempfile::TempDir,
}

impl HostLib {
    /// The driver of kernel `i` (in the order given to `host_library`).
    fn run(&self, i: usize) -> libloading::Symbol<'_, Run> {
        let (first, lib) = self.parts.iter().rev().find(|(first, _)| *first <= i).expect("a library");
        let symbol = format!("kiln_run_{}\0", i - first);
        // SAFETY: the driver's signature from `host::host_unit`.
        unsafe { lib.get(symbol.as_bytes()) }.expect("a driver")
    }
}

#[test]
fn rendered_cuda_matches_the_interpreter_on_the_host() {
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let (failures, _) = run_on_host(&cxx, &corpus(&dev), Gemm::Generic, Kind::Accumulate);
    assert!(
        failures.is_empty(),
        "{} outputs differ from the interpreter:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// GEMMs (ragged, batched, a transposed operand, fused epilogues) rendered as the tiled CUDA template
/// (`render_gemm` with the device's default tile), run with the block's threads meeting at real barriers.
#[test]
fn tiled_cuda_gemm_matches_the_interpreter_on_the_host() {
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let m = |r: usize, c: usize, k: f32| {
        Tensor::from_vec((0..r * c).map(|i| ((i as f32) * k).sin()).collect::<Vec<f32>>(), [r, c], &dev).expect("m")
    };
    let bf = |t: &Tensor| t.to_dtype(DType::BF16);
    // `r x c`, NaN from column `from` on.
    let nan_cols = |r: usize, c: usize, from: usize| {
        let v = (0..r * c).map(|i| if i % c >= from { f32::NAN } else { (i as f32 * 0.3).sin() }).collect();
        Tensor::from_vec(v, [r, c], &dev).expect("nan_cols")
    };
    let bias = m(1, 30, 0.9).reshape([30]);
    let batched_a =
        Tensor::from_vec((0..3 * 17 * 40).map(|i| (i as f32 * 0.11).cos()).collect(), [3, 17, 40], &dev).expect("a");
    let batched_b =
        Tensor::from_vec((0..3 * 40 * 9).map(|i| (i as f32 * 0.07).sin()).collect(), [3, 40, 9], &dev).expect("b");
    let cases = vec![
        ("ragged 70 x 50 x 30", vec![m(70, 50, 0.3).matmul(&m(50, 30, 0.5))]),
        ("bias and relu epilogue", vec![(m(70, 50, 0.3).matmul(&m(50, 30, 0.5)) + &bias).relu()]),
        ("transposed weight, as nn::Linear", vec![m(33, 20, 0.2).matmul(&m(30, 20, 0.4).t())]),
        ("batched 3 x 17 x 40 x 9", vec![batched_a.matmul(&batched_b)]),
        ("K below one slice", vec![m(5, 3, 0.6).matmul(&m(3, 7, 0.8)).mul(2.0)]),
        // Strides of 4 elements: staged 4 floats (16 bytes) a load (`cstyle::vectorizable`), along K (both operands
        // of x @ w.t()), along M and N (x.t() @ w[:, :30]), and along K where x's columns are narrowed to 30 of
        // its 32, so the vector at K's edge straddles it and must take the checked loads: the two columns cut off
        // are NaN, which would reach the sums (times B's zeros past K) through an unchecked vector.
        ("aligned 33 x 32 x 24, x @ w.t()", vec![m(33, 24, 0.2).matmul(&m(32, 24, 0.4).t())]),
        ("aligned 36 x 30 x 20, x.t() @ w[:, :30]", vec![m(20, 36, 0.3).t().matmul(&m(20, 32, 0.5).narrow(1, 0, 30))]),
        ("aligned 36 x 32 x 30, x[:, :30] @ w", vec![nan_cols(36, 32, 30).narrow(1, 0, 30).matmul(&m(30, 32, 0.5))]),
    ];
    // bf16 operands, widened as they are staged; a bf16 output rounded once from the f32 sum.
    let bf16_cases = vec![
        ("bf16 ragged 70 x 50 x 30", vec![bf(&m(70, 50, 0.3)).matmul(&bf(&m(50, 30, 0.5)))]),
        ("bf16 bias and relu epilogue", vec![(bf(&m(70, 50, 0.3)).matmul(&bf(&m(50, 30, 0.5))) + &bf(&bias)).relu()]),
        (
            "bf16 transposed weight, f32 out",
            vec![bf(&m(33, 20, 0.2)).matmul(&bf(&m(30, 20, 0.4)).t()).to_dtype(DType::F32)],
        ),
        ("bf16 batched", vec![bf(&batched_a).matmul(&bf(&batched_b))]),
        // Strides of 8 elements: the tensor-core template stages these 16 bytes a load (`mma.rs`'s `vector8`),
        // along K (both operands of x @ w.t()), along M and N (x.t() @ w, stored scattered; M's edge inside a
        // tile, where whole vectors fall outside and take the checked path).
        ("bf16 aligned 24 x 64 x 48, x @ w.t()", vec![bf(&m(24, 64, 0.3)).matmul(&bf(&m(48, 64, 0.5)).t())]),
        ("bf16 aligned 40 x 48 x 72, x.t() @ w", vec![bf(&m(48, 40, 0.3)).t().matmul(&bf(&m(48, 72, 0.5)))]),
    ];
    let (mut failures, tiled) = run_on_host(&cxx, &cases, TILED, Kind::Accumulate);
    assert!(tiled >= cases.len(), "every case must run the tiled template ({tiled} launches did)");
    // The GPU devices' schedule keeps bf16 operands in bf16 for the template (rule 2e).
    let with_bf16_operands = |outs: &Vec<Tensor>| {
        let cap = kiln::capture(&outs.iter().collect::<Vec<_>>()).expect("capture");
        let plan = gpu_schedule(&cap.graph);
        plan.launches.iter().any(|l| GemmView::of(&l.kernel).is_some_and(|v| v.operands == DType::BF16))
    };
    for (name, outs) in &bf16_cases {
        assert!(with_bf16_operands(outs), "{name}: no GEMM on bf16 operands");
    }
    for (name, outs) in &cases[5..] {
        let k = gemm_of(outs);
        let v = GemmView::of(&k).expect("a GEMM");
        let source = render_gemm(&k, &v, DEFAULT_TILE, 1, Flavor::Cuda).expect("renders").source;
        assert_eq!(
            source.matches("kiln_ld4f(&in").count(),
            2,
            "{name}: both operands 4 floats a load: {:?} {:?}",
            v.a,
            v.b
        );
    }
    for (name, outs) in &bf16_cases[4..] {
        let k = gemm_of(outs);
        let v = GemmView::of(&k).expect("a GEMM");
        let g = render_gemm_mma(&k, &v, MmaTile::SQUARE, 1, Flavor::Cuda);
        let source = g.expect("renders").source;
        // Through registers, or (a vector along K into a row along K) as one asynchronous copy.
        for op in [&v.a, &v.b] {
            let operand = format!("&in{}[", op.buf);
            let loaded = source.contains(&format!("kiln_ld16({operand}"));
            let copied = source.lines().any(|l| l.contains("kiln_cp16(") && l.contains(&operand));
            assert!(loaded || copied, "{name}: in{} staged 16 bytes a load: {op:?}", op.buf);
        }
        let along_k = v.a.cols == 1 || v.b.cols != 1;
        assert_eq!(source.contains("kiln_cp_wait1()"), along_k, "{name}: double-buffered where a vector runs along K");
    }
    let (bf16_failures, tiled) = run_on_host(&cxx, &bf16_cases, TILED, Kind::Accumulate);
    assert!(tiled >= bf16_cases.len(), "every bf16 case must run the tiled template ({tiled} launches did)");
    failures.extend(bf16_failures);
    // The same bf16 GEMMs on every tensor-core tile the devices race (the warp-level products emulated by the shim),
    // and an epilogue, a batch and a transposed bf16 operand on every SIMT tile: one library for all.
    let some: Vec<_> = [&cases[1], &cases[3], &bf16_cases[2]].into_iter().cloned().collect();
    let bf16_gemm = GemmView::of(&gemm_of(&bf16_cases[0].1)).expect("a GEMM");
    let mut jobs: Vec<(String, Vec<Tensor>, GpuGemm)> = Vec::new();
    for c in candidates(Flavor::Cuda, "sm_90", &bf16_gemm) {
        let on = if matches!(c.tile, GpuTile::Mma(_)) { &bf16_cases } else { &some };
        jobs.extend(on.iter().map(|(name, outs)| (format!("{}: {name}", c.name()), outs.clone(), c)));
    }
    // An odd number of 8-column tiles a warp (no candidate has one): B's last tile is an `ldmatrix.x2`.
    let odd = GpuGemm::mma(MmaTile { wm: 1, wn: 2, fm: 1, fn_: 3 });
    jobs.extend(bf16_cases.iter().map(|(name, outs)| (format!("{}: {name}", odd.name()), outs.clone(), odd)));
    // f16 operands (`ScheduleOptions::f16_gemm`, read where they are stored): the SIMT default tile and every
    // tensor-core tile (`m16n8k16` f16, the bf16 product's layout), an f16 output rounded once, a relu computed in
    // f16, a transposed weight with strides of 8 (vector loads). Outputs are f16: an f32 one rounded to f16 first
    // would be compared at f32's tolerance across an f16 rounding that the interpreter's f64 sum can flip.
    let h = |t: &Tensor| t.to_dtype(DType::F16);
    let f16_cases = [
        ("f16 ragged 70 x 50 x 30", vec![h(&m(70, 50, 0.3)).matmul(&h(&m(50, 30, 0.5)))]),
        ("f16 relu", vec![h(&m(70, 50, 0.3)).matmul(&h(&m(50, 30, 0.5))).relu()]),
        ("f16 x @ w.t()", vec![h(&m(24, 64, 0.2)).matmul(&h(&m(48, 64, 0.4)).t())]),
    ];
    let f16_view = GemmView::of(&gemm_of(&f16_cases[0].1)).expect("a GEMM");
    for (name, outs) in &f16_cases {
        assert_eq!(GemmView::of(&gemm_of(outs)).expect("a GEMM").operands, DType::F16, "{name}: f16 operands");
    }
    for c in candidates(Flavor::Cuda, "sm_90", &f16_view) {
        if matches!(c.tile, GpuTile::Mma(_)) || c == GpuGemm::simt(DEFAULT_TILE) {
            for (name, outs) in &f16_cases {
                jobs.push((format!("{}: {name}", c.name()), outs.clone(), c));
            }
        }
    }
    // f32 operands in TF32 on every tensor-core tile (as `gpu_gemm::allow_tf32` races them), on inputs that are
    // TF32 values already (bf16 ones, realized), so the products are exact and only the summation order differs
    // from the interpreter; a fused epilogue and a transposed weight.
    let tf = |t: Tensor| bf(&t).to_dtype(DType::F32);
    let tf32_in = [
        tf(m(70, 50, 0.3)),
        tf(m(50, 30, 0.5)),
        tf(m(30, 50, 0.4)),
        tf(bias.clone()),
        tf(m(24, 64, 0.3)),
        tf(m(48, 64, 0.5)),
        tf(m(64, 36, 0.2)),
        tf(m(64, 72, 0.4)),
    ];
    kiln::realize(&tf32_in.iter().collect::<Vec<_>>()).expect("realize");
    // Strides of 4 floats: staged 16 bytes a load, along K (`x @ w.t()`: double-buffered where two buffers fit)
    // and along M and N (`x.t() @ w`, stored scattered).
    let tf32_cases = [
        ("tf32 ragged 70 x 50 x 30", vec![tf32_in[0].matmul(&tf32_in[1])]),
        ("tf32 x @ w.t() + bias, relu", vec![(tf32_in[0].matmul(&tf32_in[2].t()) + &tf32_in[3]).relu()]),
        ("tf32 aligned 24 x 48 x 64, x @ w.t()", vec![tf32_in[4].matmul(&tf32_in[5].t())]),
        ("tf32 aligned 36 x 72 x 64, x.t() @ w", vec![tf32_in[6].t().matmul(&tf32_in[7])]),
    ];
    for c in candidates(Flavor::Cuda, "sm_90", &bf16_gemm).into_iter().filter(|c| matches!(c.tile, GpuTile::Mma(_))) {
        for (name, outs) in &tf32_cases {
            assert_eq!(GemmView::of(&gemm_of(outs)).expect("a GEMM").operands, DType::F32, "{name}");
            jobs.push((format!("{}: {name}", c.name()), outs.clone(), c));
        }
    }
    let k = gemm_of(&tf32_cases[2].1);
    let v = GemmView::of(&k).expect("a GEMM");
    let square = render_gemm_mma(&k, &v, MmaTile::SQUARE, 1, Flavor::Cuda).expect("renders").source;
    assert!(square.contains("kiln_cp_wait1()"), "TF32 x @ w.t() at 64 x 64: double-buffered");
    let tall = render_gemm_mma(&k, &v, MmaTile { wm: 4, wn: 2, fm: 2, fn_: 4 }, 1, Flavor::Cuda);
    let tall = tall.expect("renders").source;
    assert!(!tall.contains("kiln_cp_wait1()"), "TF32 at 128 x 64: two buffers would pass 48 KiB");
    assert!(tall.contains("kiln_ld16(&in"), "TF32 at 128 x 64: 16-byte loads");
    // Decode shapes (few rows, a long and ragged K), fused epilogues, a transposed bf16 weight and a batch, with K
    // split (each tile as far as `split_for` takes it, the last split's range ragged): every SIMT tile on the f32
    // GEMM, every tensor-core tile on the bf16 one, the default tile on the batch (the SIMT template's bf16 staging
    // is the f32 one's, checked above).
    let bias70 = m(1, 70, 0.9).reshape([70]);
    let decode_a = Tensor::from_vec((0..2 * 3 * 500).map(|i| (i as f32 * 0.13).sin()).collect(), [2, 3, 500], &dev);
    let decode_b = Tensor::from_vec((0..2 * 500 * 24).map(|i| (i as f32 * 0.05).cos()).collect(), [2, 500, 24], &dev);
    let decode_cases = [
        ("decode 6 x 600 x 70, bias, relu", vec![(m(6, 600, 0.3).matmul(&m(600, 70, 0.5)) + &bias70).relu()]),
        ("bf16 decode 9 x 700 x 40, x @ w.t()", vec![bf(&m(9, 700, 0.2)).matmul(&bf(&m(40, 700, 0.4)).t())]),
        ("batched decode 2 x 3 x 500 x 24", vec![decode_a.expect("a").matmul(&decode_b.expect("b"))]),
    ];
    let mut split_kinds = HashSet::new();
    let kept: [&dyn Fn(GpuGemm) -> bool; 3] =
        [&|c| matches!(c.tile, GpuTile::Simt(_)), &|c| matches!(c.tile, GpuTile::Mma(_)), &|c| {
            c.tile == GpuTile::Simt(DEFAULT_TILE)
        }];
    for ((name, outs), keep) in decode_cases.iter().zip(kept) {
        let v = GemmView::of(&gemm_of(outs)).expect("a GEMM");
        let split: Vec<GpuGemm> =
            candidates(Flavor::Cuda, "sm_90", &v).into_iter().filter(|&c| c.splits > 1 && keep(c)).collect();
        assert!(!split.is_empty(), "{name}: no candidate splits K");
        for c in split {
            split_kinds.insert((matches!(c.tile, GpuTile::Mma(_)), c.splits));
            jobs.push((format!("{}: {name}", c.name()), outs.clone(), c));
        }
    }
    assert!(split_kinds.iter().any(|&(mma, _)| mma), "a tensor-core tile splits K: {split_kinds:?}");
    assert!(split_kinds.iter().any(|&(_, s)| s >= 4), "some tile splits K 4 ways: {split_kinds:?}");
    let named: Vec<(&str, Vec<Tensor>)> = jobs.iter().map(|(n, outs, _)| (n.as_str(), outs.clone())).collect();
    let (tile_failures, ran) = run_each_on_host(&cxx, &named, &|i| Gemm::With(jobs[i].2), Kind::Accumulate);
    for ((name, _, _), n) in jobs.iter().zip(&ran) {
        assert!(*n >= 1, "{name}: the template did not run");
    }
    failures.extend(tile_failures);
    // A job's kernel compiled by a GPU compiler for one target.
    let compile_job =
        |rtc: &kiln_backends::rtc::Rtc, (name, outs, c): &(String, Vec<Tensor>, GpuGemm), flavor, arch| {
            let k = gemm_of(outs);
            let g = c.render(&k, &GemmView::of(&k).expect("a GEMM"), flavor).expect("renders");
            rtc.compile(&g.source, &g.name, arch).unwrap_or_else(|log| panic!("{name}, {arch}: {log}"));
        };
    // NVRTC compiles every split-K candidate of the decode shapes for Hopper where it is installed, and one split
    // tensor-core tile for Ampere (its `mma.sync` is sm_80's).
    if let Ok(nvrtc) = kiln_backends::rtc::Rtc::nvrtc() {
        for job in jobs.iter().filter(|(_, _, c)| c.splits > 1) {
            compile_job(&nvrtc, job, Flavor::Cuda, "sm_90");
        }
        if let Some(job) = jobs.iter().find(|(_, _, c)| c.splits > 1 && matches!(c.tile, GpuTile::Mma(_))) {
            compile_job(&nvrtc, job, Flavor::Cuda, "sm_80");
        }
    }
    // And hiprtc one SIMT split (its tail is the same text in every tile), for gfx90a.
    if let Ok(hiprtc) = kiln_backends::rtc::Rtc::hiprtc()
        && let Some(job) = jobs.iter().rev().find(|(_, _, c)| c.splits > 1)
    {
        compile_job(&hiprtc, job, Flavor::Hip, "gfx90a");
    }
    let cases: Vec<_> = cases.into_iter().chain(bf16_cases).chain(f16_cases).collect();
    // NVRTC compiles the same sources for Hopper where it is installed (CI; `gpu_check` also compiles every tiled
    // GEMM the suites produce for sm_80, sm_90, gfx90a and gfx1030).
    if let Ok(nvrtc) = kiln_backends::rtc::Rtc::nvrtc() {
        for (name, outs) in &cases {
            let cap = kiln::capture(&outs.iter().collect::<Vec<_>>()).expect("capture");
            for l in &gpu_schedule(&cap.graph).launches {
                let Some(v) = GemmView::of(&l.kernel) else { continue };
                let tiled = render_gemm(&l.kernel, &v, DEFAULT_TILE, 1, Flavor::Cuda);
                let mma = render_gemm_mma(&l.kernel, &v, MmaTile::SQUARE, 1, Flavor::Cuda);
                for g in [tiled, mma].into_iter().flatten() {
                    for arch in ["sm_80", "sm_90"] {
                        nvrtc.compile(&g.source, &g.name, arch).unwrap_or_else(|log| panic!("{name}, {arch}: {log}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} outputs differ from the interpreter:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// How `run_plans` renders a GEMM kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gemm {
    /// As the generic kernel.
    Generic,
    /// As this candidate of the GPU devices' race (the generic kernel where it declines).
    With(GpuGemm),
}

/// The SIMT template in the CUDA device's default tile.
const TILED: Gemm = Gemm::With(GpuGemm::simt(DEFAULT_TILE));

/// The first GEMM kernel of the GPU devices' plan for `outs`.
fn gemm_of(outs: &[Tensor]) -> kiln_jit::kernel::KernelIr {
    let cap = kiln::capture(&outs.iter().collect::<Vec<_>>()).expect("capture");
    let plan = gpu_schedule(&cap.graph);
    plan.launches.into_iter().map(|l| l.kernel).find(|k| GemmView::of(k).is_some()).expect("a GEMM")
}

/// Runs every launch of each case's plan under the host shim (GEMMs as `gemm` says, where the kernel is one) and
/// compares the outputs with the interpreter (floats at `kind`'s tolerance); returns the differences and how many
/// launches ran the template `gemm` names.
fn run_on_host(cxx: &str, cases: &[(&str, Vec<Tensor>)], gemm: Gemm, kind: Kind) -> (Vec<String>, usize) {
    let (failures, tiled) = run_each_on_host(cxx, cases, &|_| gemm, kind);
    (failures, tiled.iter().sum())
}

/// `run_on_host` with case `i`'s GEMMs rendered as `gemm(i)` says, every case's kernels in one library (one C++
/// compile); returns the differences and how many launches of each case ran a template.
fn run_each_on_host(
    cxx: &str,
    cases: &[(&str, Vec<Tensor>)],
    gemm: &dyn Fn(usize) -> Gemm,
    kind: Kind,
) -> (Vec<String>, Vec<usize>) {
    let (runs, tiled_launches) = run_plans(cxx, cases, gemm);
    let mut failures = Vec::new();
    for ((name, _), mut run) in cases.iter().zip(runs) {
        assert_eq!(run.fault, None, "{name}: a fault where none is");
        let want = run.cap.reference().expect("the interpreter");
        for (o, w) in want.iter().enumerate() {
            let got = match run.plan.passthrough.iter().find(|(p, _)| *p == o) {
                Some(&(_, i)) => run.cap.inputs[i].clone(),
                None => run.slots.remove(&Slot::Output(o)).expect("every output written"),
            };
            let k = if w.dtype().is_float() { kind } else { Kind::Exact };
            if let Err(e) = compare(&got, w, tol(w.dtype(), k)) {
                failures.push(format!("{name}, output {o} ({}): {e}", w.dtype()));
            }
        }
    }
    (failures, tiled_launches)
}

/// One case's plan as it ran under the shim.
struct HostRun {
    cap: kiln::Captured,
    plan: KernelPlan,
    /// What each launch wrote.
    slots: HashMap<Slot, HostBuffer>,
    /// The fault record after the last launch.
    fault: Option<Fault>,
}

/// Renders every launch of each case's plan (GEMMs as the tiled template where `tiled` and the kernel is one),
/// compiles them into one library under the shim and runs each case's launches in order; returns the runs and how
/// many launches ran the tiled template.
fn run_plans(cxx: &str, cases: &[(&str, Vec<Tensor>)], gemm: &dyn Fn(usize) -> Gemm) -> (Vec<HostRun>, Vec<usize>) {
    let mut plans: Vec<(kiln::Captured, KernelPlan)> = Vec::new();
    for (_, outs) in cases {
        let refs: Vec<&Tensor> = outs.iter().collect();
        let cap = kiln::capture(&refs).expect("capture");
        let plan = gpu_schedule(&cap.graph);
        plans.push((cap, plan));
    }
    let mut kernels: Vec<(GpuKernel, kiln_jit::kernel::KernelIr)> = Vec::new();
    let mut tiled_launches = vec![0; cases.len()];
    for (case, ((name, _), (_, plan))) in cases.iter().zip(&plans).enumerate() {
        for l in &plan.launches {
            let template = match gemm(case) {
                Gemm::Generic => None,
                Gemm::With(c) => GemmView::of(&l.kernel).and_then(|v| c.render(&l.kernel, &v, Flavor::Cuda).ok()),
            };
            let g = match template {
                Some(g) => {
                    tiled_launches[case] += 1;
                    g
                }
                None => render(&l.kernel, Flavor::Cuda).unwrap_or_else(|e| panic!("{name}: {e}")),
            };
            kernels.push((g, l.kernel.clone()));
        }
    }
    let refs: Vec<(&GpuKernel, &kiln_jit::kernel::KernelIr)> = kernels.iter().map(|(g, k)| (g, k)).collect();
    let lib = host_library(cxx, &refs);
    let mut at = 0;
    let mut runs = Vec::new();
    for (cap, plan) in plans {
        let mut rng: Vec<u32> = cap
            .rng
            .iter()
            .flat_map(|k| [k.seed as u32, (k.seed >> 32) as u32, k.offset as u32, (k.offset >> 32) as u32])
            .collect();
        let mut fault = [0i32; 3];
        let mut slots: HashMap<Slot, HostBuffer> = HashMap::new();
        for l in &plan.launches {
            let g = &kernels[at].0;
            let mut bufs: Vec<HostBuffer> = l
                .inputs
                .iter()
                .map(|s| match s {
                    Slot::Input(i) => cap.inputs[*i].clone(),
                    s => slots.get(s).cloned().expect("written before read"),
                })
                .collect();
            bufs.push(HostBuffer::from_f64(l.kernel.output.dtype, &vec![0.0; l.kernel.output.len]));
            let mut args: Vec<*mut c_void> = bufs.iter_mut().map(buf_ptr).collect();
            if g.uses_rng {
                args.push(rng.as_mut_ptr() as *mut c_void);
            }
            if g.can_fault {
                args.push(fault.as_mut_ptr() as *mut c_void);
            }
            // A split-K GEMM's workspace: counters zeroed, as the devices allocate it.
            let (mut counters, mut partials) = match g.workspace {
                Some(w) => (vec![0u32; w.counters], vec![f32::NAN; w.partials]),
                None => (Vec::new(), Vec::new()),
            };
            if g.workspace.is_some() {
                args.push(counters.as_mut_ptr() as *mut c_void);
                args.push(partials.as_mut_ptr() as *mut c_void);
            }
            // SAFETY: the driver's signature from `host::host_unit`; `args` holds each buffer the kernel reads or
            // writes, sized by its kernel IR.
            unsafe { lib.run(at)(args.as_mut_ptr(), g.grid.0, g.grid.1, g.block) };
            assert!(counters.iter().all(|&c| c == 0), "a split-K kernel leaves its counters zero for the next launch");
            let out = bufs.pop().expect("the output");
            slots.insert(l.output, out);
            at += 1;
        }
        runs.push(HostRun { cap, plan, slots, fault: Fault::decode(fault.map(i64::from)) });
    }
    (runs, tiled_launches)
}

/// The linear algebra routines (LU with pivoting, Cholesky, triangular solves; `render/cuda/linalg.rs`), a block's
/// threads meeting at real barriers: orders past the block's 128 threads, batches, f32 and f64, against the
/// interpreter at the factorizations' tolerance; then each fault with the batch index it names.
#[test]
fn linear_algebra_routines_match_the_interpreter_on_the_host() {
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    // `2 I + R / n` with rows reversed (partial pivoting swaps them), R in [-1, 1).
    let matrices = |batch: usize, n: usize, dtype: DType| {
        let v: Vec<f64> = (0..batch * n * n)
            .map(|e| {
                let (i, j) = ((e / n) % n, e % n);
                ((e as f64 * 0.37).sin()) / n as f64 + if n - 1 - i == j { 2.0 } else { 0.0 }
            })
            .collect();
        Tensor::from_host(HostBuffer::from_f64(dtype, &v), [batch, n, n], &dev).expect("matrices")
    };
    let rhs = |batch: usize, n: usize, k: usize, dtype: DType| {
        let v: Vec<f64> = (0..batch * n * k).map(|e| (e as f64 * 0.21).cos()).collect();
        Tensor::from_host(HostBuffer::from_f64(dtype, &v), [batch, n, k], &dev).expect("rhs")
    };
    let (a, b) = (matrices(3, 40, DType::F32), rhs(3, 40, 5, DType::F32));
    let (big, big_b) = (matrices(1, 150, DType::F64), rhs(1, 150, 3, DType::F64));
    let spd = big.transpose(-1, -2).matmul(&big);
    let cases = vec![
        (
            "f32, 3 matrices of 40",
            vec![
                linalg::lu_factor(&a).0,
                linalg::lu_factor(&a).1,
                linalg::solve(&a, &b),
                linalg::det(&a),
                linalg::solve_triangular(&a, &b, true, true, true),
            ],
        ),
        ("f64, order 150", vec![linalg::solve(&big, &big_b), linalg::inv(&big), linalg::cholesky(&spd)]),
    ];
    let (failures, _) = run_on_host(&cxx, &cases, Gemm::Generic, Kind::Factorize);
    assert!(failures.is_empty(), "{} outputs differ:\n  {}", failures.len(), failures.join("\n  "));

    // Faults: batch index 1 singular (to working precision, and exactly), batch index 2 not positive definite.
    let values = |v: &[f64], shape: [usize; 3]| Tensor::from_host(HostBuffer::from_f64(DType::F32, v), shape, &dev);
    let good = [2.0, 1.0, 0.0, 1.0, 3.0, 1.0, 0.0, 1.0, 4.0];
    let near = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
    let indefinite = [1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    let zero_diag = [1.0, 0.0, 0.0, 5.0, 0.0, 0.0, 1.0, 1.0, 1.0];
    let stack = |m: [&[f64]; 3]| values(&m.concat(), [3, 3, 3]).expect("stack");
    let ones = values(&[1.0; 9], [3, 3, 1]).expect("ones");
    let cases = vec![
        ("singular", vec![linalg::solve(&stack([&good, &near, &good]), &ones)]),
        ("exactly singular", vec![linalg::inv(&stack([&good, &[0.0; 9], &good]))]),
        ("not positive definite", vec![linalg::cholesky(&stack([&good, &good, &indefinite]))]),
        (
            "zero diagonal",
            vec![linalg::solve_triangular(&stack([&good, &good, &zero_diag]), &ones, false, true, false)],
        ),
    ];
    let want = [
        Fault::Singular { batch_index: 1, pivot: 2 },
        Fault::Singular { batch_index: 1, pivot: 0 },
        Fault::NotPositiveDefinite { batch_index: 2, minor: 2 },
        Fault::Singular { batch_index: 2, pivot: 1 },
    ];
    let (runs, _) = run_plans(&cxx, &cases, &|_| Gemm::Generic);
    for (((name, _), run), want) in cases.iter().zip(&runs).zip(want) {
        assert_eq!(run.fault, Some(want), "{name}");
    }
}

/// A gathered index out of range claims the fault record with the index and the length, as on every device.
#[test]
fn a_gather_out_of_range_writes_the_fault_record() {
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1.0f32; 8], [2, 4], &dev).expect("a");
    let idx = Tensor::from_vec(vec![1i32, 7], [2], &dev).expect("idx");
    let y = a.index_select(1, &idx);
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = gpu_schedule(&cap.graph);
    assert_eq!(plan.launches.len(), 1);
    let k = &plan.launches[0].kernel;
    let g = render(k, Flavor::Cuda).expect("renders");
    let lib = host_library(&cxx, &[(&g, k)]);
    let mut bufs: Vec<HostBuffer> = plan.launches[0]
        .inputs
        .iter()
        .map(|s| match s {
            Slot::Input(i) => cap.inputs[*i].clone(),
            _ => unreachable!("one launch reads inputs only"),
        })
        .collect();
    bufs.push(HostBuffer::from_f64(k.output.dtype, &vec![0.0; k.output.len]));
    let mut fault = [0i32; 3];
    let mut args: Vec<*mut c_void> = bufs.iter_mut().map(buf_ptr).collect();
    args.push(fault.as_mut_ptr() as *mut c_void);
    // SAFETY: as above.
    unsafe {
        lib.run(0)(args.as_mut_ptr(), g.grid.0, g.grid.1, g.block);
    }
    assert_eq!(Fault::decode(fault.map(i64::from)), Some(Fault::Index { len: 4, index: 7 }));
}

/// The GPU devices' plan itself (`kiln_backends`' shared GPU plan, as `Device::cuda` and `Device::hip` run it:
/// uploads, rendering, temps, passthrough copies, rng keys, launch order, the fault record read back, downloads)
/// on the host stand-in `HostGpu` (each plan's kernels compiled under the shim), over the corpus and cases of its
/// own, against the interpreter; then a gather out of range, which must make the run an error naming the index.
#[test]
fn the_gpu_plan_runs_the_corpus_on_a_host_stand_in() {
    use kiln_backends::{Backend, BackendError, Buffer, HostGpu};
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let gpu = HostGpu::new(&cxx);
    let x = Tensor::from_vec((0..600).map(|i| (i as f32 * 0.13).sin()).collect(), [20, 30], &dev).expect("x");
    let w = Tensor::from_vec((0..300).map(|i| (i as f32 * 0.07).cos()).collect(), [30, 10], &dev).expect("w");
    let e = x.exp();
    let mut cases = corpus(&dev);
    cases.push((
        "an input returned as it is, and a temp two outputs read",
        vec![x.clone(), e.sum(0, false), e.softmax(-1)],
    ));
    cases.push((
        "a GEMM with a fused epilogue between elementwise kernels",
        vec![(x.tanh().matmul(&w) + 1.0).relu().sum(1, false)],
    ));
    cases.push((
        "random numbers",
        vec![Tensor::rand([1000], DType::F32, &dev).mul(2.0), kiln::nn::functional::dropout(&x, 0.5, true)],
    ));
    // Every case's kernels compiled first, in two libraries side by side (a C++ compile per plan would cost the
    // compiler's start-up each time), then each plan (finding its kernels loaded) and its run, in order.
    let caps: Vec<kiln::Captured> =
        cases.iter().map(|(_, outs)| kiln::capture(&outs.iter().collect::<Vec<_>>()).expect("capture")).collect();
    gpu.compile_ahead(&caps.iter().map(|c| &c.graph).collect::<Vec<_>>(), 2).expect("the kernels compile");
    let execs: Vec<_> = (0..caps.len())
        .map(|i| gpu.compile(&caps[i].graph).unwrap_or_else(|e| panic!("{}: {e}", cases[i].0)))
        .collect();
    let mut failures = Vec::new();
    for (((name, _), cap), exec) in cases.iter().zip(&caps).zip(execs) {
        let inputs: Vec<Buffer> = cap.inputs.iter().map(|h| gpu.upload(h.clone()).expect("upload")).collect();
        let got = exec.run(&inputs.iter().collect::<Vec<_>>(), &cap.rng).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = cap.reference().expect("the interpreter");
        assert_eq!(got.len(), want.len(), "{name}");
        for (o, (b, w)) in got.iter().zip(&want).enumerate() {
            let got = gpu.download(b).expect("download");
            let k = if w.dtype().is_float() { Kind::Accumulate } else { Kind::Exact };
            if let Err(e) = compare(&got, w, tol(w.dtype(), k)) {
                failures.push(format!("{name}, output {o} ({}): {e}", w.dtype()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} outputs differ from the interpreter:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );

    let idx = Tensor::from_vec(vec![1i32, 29, 31], [3], &dev).expect("idx");
    let cap = kiln::capture(&[&x.index_select(1, &idx).exp()]).expect("capture");
    let exec = gpu.compile(&cap.graph).expect("compiles");
    let inputs: Vec<Buffer> = cap.inputs.iter().map(|h| gpu.upload(h.clone()).expect("upload")).collect();
    match exec.run(&inputs.iter().collect::<Vec<_>>(), &cap.rng) {
        Err(BackendError::Fault { fault, .. }) => assert_eq!(fault, Fault::Index { len: 30, index: 31 }),
        other => panic!("an index out of range must fail the run: {other:?}"),
    }
}

/// A GPU plan replays as a graph from its second run (the CUDA device's graphs, `kiln_backends`' GPU plan): the
/// host stand-in's graph keeps the parameters it was built or patched with, as a CUDA graph does, so a node the plan
/// forgets to patch reads the previous run's buffers. Every run gets new input buffers holding new values; each
/// output must equal, bit for bit, the same plan launched one by one (`HostGpu::without_graphs`) and match the
/// interpreter. Then a gather out of range in a replay must fail that run, and the next run (the pinned fault record
/// zeroed again) must pass.
#[test]
fn graph_replays_equal_launches_one_by_one() {
    use kiln_backends::{Backend, BackendError, Buffer, HostGpu};
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let (graphs, plain) = (HostGpu::new(&cxx), HostGpu::without_graphs(&cxx));
    let x = Tensor::from_vec((0..600).map(|i| (i as f32 * 0.13).sin()).collect(), [20, 30], &dev).expect("x");
    let w = Tensor::from_vec((0..300).map(|i| (i as f32 * 0.07).cos()).collect(), [30, 10], &dev).expect("w");
    let idx = Tensor::from_vec(vec![1i32, 29, 7], [3], &dev).expect("idx");
    let e = x.exp();
    let xd = Tensor::from_vec((0..4 * 640).map(|i| (i as f32 * 0.011).sin()).collect(), [4, 640], &dev).expect("xd");
    let wd = Tensor::from_vec((0..640 * 20).map(|i| (i as f32 * 0.017).cos()).collect(), [640, 20], &dev).expect("wd");
    // Temps, a GEMM with an epilogue, random numbers, a passthrough output, a gather, and a decode-shaped GEMM that
    // runs with K split (its workspace pinned, its counters left zero by each replay): every kind of parameter.
    let outs = [
        (x.tanh().matmul(&w) + 1.0).relu().sum(1, false),
        e.softmax(-1),
        kiln::nn::functional::dropout(&x, 0.5, true),
        x.clone(),
        x.index_select(1, &idx).exp(),
        xd.matmul(&wd).mul(0.5),
    ];
    let cap = kiln::capture(&outs.iter().collect::<Vec<_>>()).expect("capture");
    let split = gpu_schedule(&cap.graph).launches.iter().any(|l| {
        GemmView::of(&l.kernel).is_some_and(|v| {
            kiln_backends::gpu_gemm::analytic_best(Flavor::Cuda, "host", &l.kernel, &v).is_some_and(|c| c.splits > 1)
        })
    });
    assert!(split, "the decode-shaped GEMM runs with K split on the stand-in");
    let (eg, ep) = (graphs.compile(&cap.graph).expect("compiles"), plain.compile(&cap.graph).expect("compiles"));
    // Every round's buffers stay alive, so a stale node reads old values (a clean failure) rather than freed memory.
    let mut kept: Vec<Vec<Buffer>> = Vec::new();
    for round in 0..5 {
        let mut inputs: Vec<HostBuffer> = cap
            .inputs
            .iter()
            .map(|h| match h {
                HostBuffer::F32(v) => {
                    HostBuffer::F32(v.iter().map(|x| x * (1.0 + 0.25 * round as f32) - 0.1).collect())
                }
                other => other.clone(),
            })
            .collect();
        let bad = round == 3;
        if bad {
            for h in &mut inputs {
                if let HostBuffer::I32(v) = h {
                    *h = HostBuffer::I32(v.iter().map(|_| 30).collect());
                }
            }
        }
        let up =
            |gpu: &HostGpu| -> Vec<Buffer> { inputs.iter().map(|h| gpu.upload(h.clone()).expect("upload")).collect() };
        let (ig, ip) = (up(&graphs), up(&plain));
        let got = eg.run(&ig.iter().collect::<Vec<_>>(), &cap.rng);
        if bad {
            match got {
                Err(BackendError::Fault { fault, .. }) => assert_eq!(fault, Fault::Index { len: 30, index: 30 }),
                other => panic!("round {round}: an index out of range must fail the replay: {other:?}"),
            }
            kept.push(ig);
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("round {round}: {e}"));
        let want = ep.run(&ip.iter().collect::<Vec<_>>(), &cap.rng).expect("launched one by one");
        let refs: Vec<&HostBuffer> = inputs.iter().collect();
        let oracle = kiln_jit::interp::run(&cap.graph, &refs, &cap.rng).expect("the interpreter");
        for (o, ((g, p), r)) in got.iter().zip(&want).zip(&oracle).enumerate() {
            let (g, p) = (graphs.download(g).expect("download"), plain.download(p).expect("download"));
            // Debug text tells -0.0 from 0.0 and shows NaNs, which `==` would not.
            assert_eq!(format!("{g:?}"), format!("{p:?}"), "round {round}, output {o}: replay vs one by one");
            compare(&g, r, tol(r.dtype(), Kind::Accumulate))
                .unwrap_or_else(|e| panic!("round {round}, output {o} against the interpreter: {e}"));
        }
        kept.push(ig);
        kept.push(got);
    }
    let (built, launched, patched) = graphs.graph_counts();
    assert_eq!(built, 1, "the second run builds the plan's graph, once");
    assert_eq!(launched, 4, "rounds 1 to 4 launch it (round 3 too, before its fault is read)");
    assert!(patched > 0, "new input and output buffers each round patch the nodes that read them");
    assert_eq!(plain.graph_counts(), (0, 0, 0), "the stand-in without graphs launches one by one");
}

/// The GPU devices' GEMM race (`kiln_backends`' `gpu/tune.rs`) on the host stand-in: a plan with a GEMM compiles
/// through it (the best-scored candidates rendered, compiled, verified against the kernel evaluator and timed), its
/// record names a candidate that verified, and the plan's output matches the interpreter.
#[test]
fn the_gemm_race_runs_on_the_host_stand_in() {
    use kiln_backends::{Backend, Buffer, HostGpu, gpu_tune_records};
    let Some(cxx) = cxx() else { return };
    let dev = Device::cpu();
    let gpu = HostGpu::racing(&cxx);
    let m = |r: usize, c: usize, k: f32| {
        Tensor::from_vec((0..r * c).map(|i| ((i as f32) * k).sin()).collect::<Vec<f32>>(), [r, c], &dev).expect("m")
    };
    let y = (m(48, 40, 0.3).matmul(&m(40, 24, 0.5)) + 1.0).relu();
    let cap = kiln::capture(&[&y]).expect("capture");
    let exec = gpu.compile(&cap.graph).expect("compiles");
    let inputs: Vec<Buffer> = cap.inputs.iter().map(|h| gpu.upload(h.clone()).expect("upload")).collect();
    let got = exec.run(&inputs.iter().collect::<Vec<_>>(), &cap.rng).expect("runs");
    let want = cap.reference().expect("the interpreter");
    compare(&gpu.download(&got[0]).expect("download"), &want[0], tol(DType::F32, Kind::Accumulate))
        .unwrap_or_else(|e| panic!("the raced GEMM: {e}"));
    let dims = |r: &kiln_autotune::TuneRecord| r.key.dims.iter().map(|(_, v)| *v).collect::<Vec<_>>();
    let rec = gpu_tune_records()
        .into_iter()
        .rev()
        .find(|r| r.key.op == "host-gpu-gemm" && dims(r) == [1, 48, 24, 40])
        .expect("a tuning record for the GEMM");
    let mut names: Vec<String> = candidates(Flavor::Cuda, "host", &GemmView::of(&gemm_of(&[y])).expect("a GEMM"))
        .iter()
        .map(GpuGemm::name)
        .collect();
    // `+ 1.0` is not a bias: the library's contestant is its product, then the epilogue as a pass.
    names.push("library+pass".into());
    assert!(names.contains(&rec.winner), "winner {} is not a contestant: {names:?}", rec.winner);
    if std::env::var("KILN_AUTOTUNE").map_or(true, |v| v != "off") {
        let won = rec.trials.iter().find(|t| t.config == rec.winner).expect("the winner's trial");
        assert_eq!(won.verified, Some(true), "the winner verified: {:?}", rec.trials);
        let templates = rec.trials.iter().filter(|t| t.config.starts_with("simt:") && t.verified == Some(true));
        assert!(templates.count() >= 1, "the templates raced and verified: {:?}", rec.trials);
    }
}

/// The body `tests/cuda_device.rs` runs on a GPU (every GEMM candidate of the race, forced, against the
/// interpreter) on the host stand-in, for the square tensor-core tile (its warp-level product emulated by the
/// shim): each forced run here is a C++ compile of its own, and every tile of both templates already runs under the
/// shim in `tiled_cuda_gemm_matches_the_interpreter_on_the_host`.
#[test]
fn gemm_candidates_run_forced_on_the_host_stand_in() {
    use kiln_backends::HostGpu;
    let Some(cxx) = cxx() else { return };
    let gpu = HostGpu::new(&cxx);
    let keep = |c: GpuGemm| c.tile == GpuTile::Mma(MmaTile::SQUARE);
    let ran = gpu_open::every_gemm_candidate_matches_the_interpreter(Flavor::Cuda, "sm_90", &keep, &|k, c, args| {
        gpu.run_gemm_with(k, c, args)
    });
    assert_eq!(
        ran, 7,
        "the square tensor-core tile on the five bf16 GEMMs and the f16 one, split K on the decode shape"
    );
}

/// The library contestant of the GEMM race (`kiln_backends::gpu_library`) fuses the epilogues a vendor library has
/// and nothing else, and runs any other epilogue as a pass after the library's product: checked by which of
/// `gpu_open`'s GEMMs it takes and how, each run through the host stand-in's library GEMM (the problem computed as
/// a library would, then the pass under the shim) against the interpreter, and by the fused epilogues it must
/// decline.
#[test]
fn the_library_gemm_takes_the_epilogues_it_has() {
    use kiln_backends::HostGpu;
    use kiln_backends::gpu_library::{LibAct, LibGemm};
    let Some(cxx) = cxx() else { return };
    let gpu = HostGpu::new(&cxx);
    let ran = gpu_open::library_gemm_matches_the_interpreter(&|k, args| gpu.run_library_with(k, args))
        .expect("the stand-in's library runs");
    let fused = |name| (name, false);
    let want = [
        fused("ragged 70 x 130 x 33"),
        fused("x @ w.t() + bias, relu"),
        fused("x @ w + bias, gelu"),
        fused("batched"),
        ("dy @ w.t() where h > 0", true),
        fused("bf16 ragged"),
        // Its product is rounded to bf16 before the relu, which no library epilogue does.
        ("bf16 x @ w.t(), relu", true),
        fused("bf16 batched"),
        fused("decode 6 x 600 x 70 + bias"),
        fused("bf16 decode 9 x 700 x 40, x @ w.t()"),
        fused("bf16 aligned 24 x 64 x 48, x @ w.t()"),
        fused("f16 ragged"),
    ];
    assert_eq!(ran, want, "(GEMM, whether its epilogue ran as a pass after the library's product)");
    let dev = Device::cpu();
    let m = |r: usize, c: usize| {
        Tensor::from_vec((0..r * c).map(|i| (i as f32 * 0.3).sin()).collect::<Vec<f32>>(), [r, c], &dev).expect("m")
    };
    let lib = |t: Tensor| {
        let k = gemm_of(&[t]);
        LibGemm::of(&k, &GemmView::of(&k).expect("a GEMM"))
    };
    let bias = m(1, 9).reshape([9]);
    let g = lib((m(5, 7).matmul(&m(9, 7).t()) + &bias).relu()).expect("bias and relu are cuBLASLt's");
    assert!(g.bias.is_some() && g.act == Some(LibAct::Relu) && !g.b.row_major && g.a.row_major, "{g:?}");
    use kiln::nn::functional::{Approximate, gelu};
    let g = lib(gelu(&(m(5, 7).matmul(&m(7, 9)) + &bias), Approximate::Tanh)).expect("the tanh GELU is cuBLASLt's");
    assert!(g.bias.is_some() && g.act == Some(LibAct::GeluTanh), "{g:?}");
    let g = lib(gelu(&m(5, 7).matmul(&m(7, 9)), Approximate::Tanh)).expect("a GELU without a bias too");
    assert!(g.bias.is_none() && g.act == Some(LibAct::GeluTanh), "{g:?}");
    assert_eq!(lib(gelu(&m(5, 7).matmul(&m(7, 9)), Approximate::None)), None, "the erf GELU is not cuBLASLt's");
    // The tanh GELU's tree with one constant off, and with one more term: not a GELU.
    let near = |x: &Tensor, c: f64, extra: bool| {
        let inner = x.add(x.mul(x).mul(x).mul(c)).mul((2.0 / std::f64::consts::PI).sqrt());
        let y = x.mul(0.5).mul(inner.tanh().add(1.0));
        if extra { y.add(x.mul(1e-3)) } else { y }
    };
    let y = m(5, 7).matmul(&m(7, 9));
    assert!(lib(near(&y, 0.044715, false)).is_some(), "the tree as gelu() builds it");
    assert_eq!(lib(near(&y, 0.045, false)), None, "a constant off");
    assert_eq!(lib(near(&y, 0.044715, true)), None, "a term more");
    assert_eq!(lib(m(5, 7).matmul(&m(7, 9)).mul(2.0)), None, "a scale stays with the templates");
    assert_eq!(lib(m(5, 7).matmul(&m(7, 9)) + 1.0), None, "a constant is not a bias");
}

/// The latest GEMM tuning record of the host stand-in for dims `[batch, m, n, k]`.
fn host_gemm_record(dims: [u64; 4]) -> kiln_autotune::TuneRecord {
    let of = |r: &kiln_autotune::TuneRecord| r.key.dims.iter().map(|(_, v)| *v).collect::<Vec<_>>();
    kiln_backends::gpu_tune_records()
        .into_iter()
        .rev()
        .find(|r| r.key.op == "host-gpu-gemm" && of(r) == dims)
        .unwrap_or_else(|| panic!("no tuning record for the GEMM {dims:?}"))
}

/// Runs `cap`'s plan on `gpu` four times, its f32 inputs scaled by `scale(round)` and uploaded anew each round (so a
/// replayed graph must be patched with each run's buffers), every output against the interpreter; returns (graphs
/// built, graph launches) by the stand-in.
fn run_rounds(gpu: &kiln_backends::HostGpu, cap: &kiln::Captured, scale: &dyn Fn(usize) -> f32) -> (usize, usize) {
    use kiln_backends::{Backend, Buffer};
    let exec = gpu.compile(&cap.graph).expect("compiles");
    for round in 0..4 {
        let inputs: Vec<HostBuffer> = cap
            .inputs
            .iter()
            .map(|h| match h {
                HostBuffer::F32(v) => HostBuffer::F32(v.iter().map(|x| x * scale(round)).collect()),
                other => other.clone(),
            })
            .collect();
        let up: Vec<Buffer> = inputs.iter().map(|h| gpu.upload(h.clone()).expect("upload")).collect();
        let got = exec.run(&up.iter().collect::<Vec<_>>(), &cap.rng).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let refs: Vec<&HostBuffer> = inputs.iter().collect();
        let want = kiln_jit::interp::run(&cap.graph, &refs, &cap.rng).expect("the interpreter");
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            compare(&gpu.download(got).expect("download"), want, tol(DType::F32, Kind::Accumulate))
                .unwrap_or_else(|e| panic!("round {round}, output {i}: {e}"));
        }
    }
    let (built, launched, _) = gpu.graph_counts();
    (built, launched)
}

/// A matrix of `sin(i * k)` values.
fn sines(r: usize, c: usize, k: f32) -> Tensor {
    let v: Vec<f32> = (0..r * c).map(|i| (i as f32 * k).sin()).collect();
    Tensor::from_vec(v, [r, c], &Device::cpu()).expect("a matrix")
}

/// The race with its library contestant on the host stand-in (whose library GEMM, a plain loop, outruns kernels
/// that start a thread per block thread): the GEMM's record has the library verified, and where it won, the plan
/// launches it, and replays it from a graph (its node patched with each run's buffers), every run matching the
/// interpreter.
#[test]
fn the_library_gemm_races_and_replays_on_the_host_stand_in() {
    let Some(cxx) = cxx() else { return };
    let gpu = kiln_backends::HostGpu::racing(&cxx);
    let (x, w, b) = (sines(33, 21, 0.3), sines(19, 21, 0.5), sines(1, 19, 0.7).reshape([19]));
    let y = (x.matmul(&w.t()) + &b).relu().exp().sum(1, false);
    let cap = kiln::capture(&[&y]).expect("capture");
    let graphs = run_rounds(&gpu, &cap, &|round| 1.0 + 0.5 * round as f32);
    let rec = host_gemm_record([1, 33, 19, 21]);
    if std::env::var("KILN_AUTOTUNE").map_or(true, |v| v != "off") {
        let lib = rec.trials.iter().find(|t| t.config == "library").expect("the library raced");
        assert_eq!(lib.verified, Some(true), "the library verified: {:?}", rec.trials);
        assert_eq!(rec.winner, "library", "a loop outruns a thread per block thread: {:?}", rec.trials);
    }
    assert_eq!(graphs, (1, 3), "runs 2 to 4 replay the plan's graph ({} won the race)", rec.winner);
}

/// A GEMM whose epilogue the library has not (a relu's backward: the product masked by the pre-activation) runs
/// as the library's product into the plan's scratch, then the epilogue as a kernel of its own: its contestant
/// verifies in the race on the host stand-in (racing alone, so the plan is sure to run it), the plan launches both
/// and replays them as two graph nodes, patched with each run's buffers, every run matching the interpreter.
#[test]
fn the_library_product_then_its_epilogue_pass_replays_on_the_host_stand_in() {
    let Some(cxx) = cxx() else { return };
    let gpu = kiln_backends::HostGpu::racing_the_library_alone(&cxx);
    let (dy, w, h) = (sines(29, 21, 0.3), sines(17, 21, 0.5), sines(29, 17, 0.7));
    // Both read back, so the GEMM's kernel writes the masked product (its epilogue) and a second kernel follows.
    let dx = h.le(0).where_(0, dy.matmul(&w.t()));
    let y = dx.exp().sum(1, false);
    let cap = kiln::capture(&[&dx, &y]).expect("capture");
    let graphs = run_rounds(&gpu, &cap, &|round| 1.0 - 0.3 * round as f32);
    let rec = host_gemm_record([1, 29, 17, 21]);
    assert_eq!(rec.winner, "library+pass", "{:?}", rec.trials);
    if std::env::var("KILN_AUTOTUNE").map_or(true, |v| v != "off") {
        assert_eq!(rec.trials[0].verified, Some(true), "the library and its pass verified: {:?}", rec.trials);
    }
    assert_eq!(graphs, (1, 3), "runs 2 to 4 replay the plan's graph");
}

/// A plan compiles its GEMMs' race contestants with its other kernels in one batch (one C++ unit on the host
/// stand-in, where a GPU device compiles one NVRTC program per core): two GEMMs raced (one the library takes with
/// its epilogue, one as its product then a pass) and the kernels around them cost one unit, not one per contestant;
/// the races still ran (their records verified a template each), and the plan matches the interpreter.
#[test]
fn a_racing_plan_compiles_its_contestants_in_one_batch_on_the_host_stand_in() {
    let Some(cxx) = cxx() else { return };
    let gpu = kiln_backends::HostGpu::racing(&cxx);
    let (x, w, b) = (sines(23, 19, 0.2), sines(19, 13, 0.4), sines(1, 13, 0.6).reshape([13]));
    let h = (x.matmul(&w) + &b).relu();
    let (dy, w2) = (sines(23, 11, 0.5), sines(11, 13, 0.9));
    // Read back, the masked product is its GEMM's epilogue (an input the library cannot read: product, then pass).
    let dx = h.le(0.5).where_(0, dy.matmul(&w2));
    let y = dx.exp().sum(1, false);
    let cap = kiln::capture(&[&h, &dx, &y]).expect("capture");
    run_rounds(&gpu, &cap, &|round| 1.0 + 0.25 * round as f32);
    assert_eq!(gpu.compile_units(), 1, "the plan's kernels and every race's contestants in one unit");
    if std::env::var("KILN_AUTOTUNE").map_or(true, |v| v != "off") {
        for dims in [[1, 23, 13, 19], [1, 23, 13, 11]] {
            let rec = host_gemm_record(dims);
            let raced = rec.trials.iter().filter(|t| t.config.starts_with("simt:") && t.verified == Some(true));
            assert!(raced.count() >= 1, "{dims:?}: a template raced: {:?}", rec.trials);
        }
        let pass = host_gemm_record([1, 23, 13, 11]);
        let lib = pass.trials.iter().find(|t| t.config == "library+pass").expect("the library's product and pass");
        assert_eq!(lib.verified, Some(true), "{:?}", pass.trials);
    }
}
