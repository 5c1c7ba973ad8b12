//! Golden files for one rendered kernel: the fused `(a * b + c).relu().sum(1, false)` as kernel IR text
//! (`KernelIr::to_text`), as CLIF (`render::clif::render`, vectorized, displayed) and as WGSL
//! (`render::wgsl::render`), compared with `tests/golden/mul_add_relu_sum.{kernel,clif,wgsl}.txt`; and an SGD
//! update `w - g * lr` rendered to read `w` through its output (`render::wgsl::render_aliased`, buffer donation on
//! wgpu): `tests/golden/sgd_update_aliased.wgsl.txt`; and the batch-1 weight update `w - (dy ⊗ x) * lr` as the CPU's
//! 8-lane elementwise kernel (register program, loop shape, code size): `tests/golden/outer_update.wide.txt`; and
//! CUDA C / HIP C renderings (`render::cuda`): `mul_add_relu_sum.{cu,hip}.txt`, `rows_and_gather.cu.txt`,
//! `table_zoo.cu.txt`, `gemm_tensor_cores.cu.txt`, `cooperative_reductions.{wgsl,cu}.txt`, `solve.{wgsl,cu}.txt`
//! (the linear algebra routines, written by hand per target).
//!
//! A change to fusion, lowering or the CLIF renderer that changes the output fails here with the first differing
//! line. If the change is intended, rewrite the files and review their diff:
//!
//! ```text
//! KILN_BLESS=1 cargo test --test golden
//! ```
//!
//! The CLIF is rendered for the host ISA from `cranelift_native`, with the calling convention pinned to SystemV:
//! the signature line would otherwise differ between Linux, macOS and Windows, and the renderer reads nothing else
//! from the ISA (64-bit pointers are assumed). The text must not depend on anything but the kernel: it is rendered
//! twice and the two must be equal.

// The graphs are built and run on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_codegen::settings::{self, Configurable};
use kiln::{DType, Device, Tensor};
use kiln_jit::kernel::{KernelIr, schedule};
use kiln_jit::render::clif;
use std::path::PathBuf;

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden").join(name)
}

/// Compares `actual` with the golden file `name`, or rewrites the file when `KILN_BLESS=1`.
fn check_golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var("KILN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("a parent dir")).expect("create tests/golden");
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("blessed {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e} (create it with KILN_BLESS=1)", path.display()));
    if actual == expected {
        return;
    }
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    let line = a.iter().zip(&e).position(|(x, y)| x != y).unwrap_or(a.len().min(e.len()));
    panic!(
        "{} differs from the rendered text at line {} ({} lines rendered, {} in the file):\n  file:     {}\n  \
         rendered: {}\nIf the change is intended: KILN_BLESS=1 cargo test --test golden, then review the diff.\n\
         Rendered text:\n{actual}",
        path.display(),
        line + 1,
        a.len(),
        e.len(),
        e.get(line).unwrap_or(&"<end of file>"),
        a.get(line).unwrap_or(&"<end of text>"),
    );
}

/// The one kernel of `(a * b + c).relu().sum(1, false)` with a, b: f32[8, 13] and c: f32[13].
fn kernel() -> KernelIr {
    let dev = Device::cpu();
    let data = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let a = Tensor::from_vec(data(8 * 13, 0.7), [8, 13], &dev).expect("a");
    let b = Tensor::from_vec(data(8 * 13, 1.3), [8, 13], &dev).expect("b");
    let c = Tensor::from_vec(data(13, 0.3), [13], &dev).expect("c");
    let y = (&a * &b + &c).relu().sum(1, false);
    assert_eq!((y.dtype(), y.dims()), (DType::F32, &[8usize][..]));
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = schedule(&cap.graph);
    let names: Vec<&str> = plan.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    assert_eq!(plan.launches.len(), 1, "expected one fused kernel, got {names:?}");
    plan.launches.into_iter().next().expect("one launch").kernel
}

fn target() -> TargetFrontendConfig {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").expect("opt_level");
    let isa = cranelift_native::builder()
        .expect("host ISA supported by Cranelift")
        .finish(settings::Flags::new(flags))
        .expect("host ISA");
    TargetFrontendConfig { default_call_conv: CallConv::SystemV, ..isa.frontend_config() }
}

#[test]
fn mul_add_relu_sum_kernel_ir() {
    check_golden("mul_add_relu_sum.kernel.txt", &kernel().to_text());
}

#[test]
fn mul_add_relu_sum_clif() {
    let k = kernel();
    let render = || clif::render(&k, 0, target(), true).display().to_string();
    let text = render();
    assert_eq!(text, render(), "rendering the same kernel twice gave different CLIF");
    assert_eq!(text, clif::render(&kernel(), 0, target(), true).display().to_string(), "CLIF of a rebuilt kernel");
    check_golden("mul_add_relu_sum.clif.txt", &text);
}

/// WGSL is a pure function of the kernel too: no device needed.
#[test]
fn mul_add_relu_sum_wgsl() {
    let k = kernel();
    let text = kiln_jit::render::wgsl::render(&k).expect("renders").source;
    assert_eq!(text, kiln_jit::render::wgsl::render(&kernel()).expect("renders").source, "WGSL of a rebuilt kernel");
    check_golden("mul_add_relu_sum.wgsl.txt", &text);
}

/// The one kernel of `w - g * lr` (w, g: f32[8, 13], lr: a 0-dim f32), and the position of `w` among its inputs.
fn update_kernel() -> (KernelIr, usize) {
    let dev = Device::cpu();
    let data = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).cos()).collect::<Vec<f32>>();
    let w = Tensor::from_vec(data(8 * 13, 0.9), [8, 13], &dev).expect("w");
    let g = Tensor::from_vec(data(8 * 13, 0.4), [8, 13], &dev).expect("g");
    let lr = Tensor::from_vec(vec![0.1f32], kiln::Shape::scalar(), &dev).expect("lr");
    let y = w.sub(g.mul(&lr));
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = schedule(&cap.graph);
    assert_eq!(plan.launches.len(), 1, "expected one fused kernel");
    // Inputs are numbered in the order the walk met them: w first.
    let launch = plan.launches.into_iter().next().expect("one launch");
    let w_pos = launch.inputs.iter().position(|s| *s == kiln_jit::kernel::Slot::Input(0)).expect("w is read");
    (launch.kernel, w_pos)
}

#[test]
fn sgd_update_reading_its_weight_through_the_output_wgsl() {
    let (k, w) = update_kernel();
    let text = kiln_jit::render::wgsl::render_aliased(&k, &[w]).expect("renders").source;
    assert!(!text.contains(&format!("in{w}[")), "the aliased input is never read:\n{text}");
    assert!(text.contains(&format!("var<storage, read> in{w}:")), "its binding stays declared:\n{text}");
    check_golden("sgd_update_aliased.wgsl.txt", &text);
    // An input of another shape than the output cannot be read through it.
    let other = kernel();
    let err = kiln_jit::render::wgsl::render_aliased(&other, &[0]).expect_err("an [8, 13] input of an [8] output");
    assert!(err.contains("cannot be read through the output"), "{err}");
}

/// The batch-1 weight update of a 24 x 37 layer, `w - (dy ⊗ x) * lr`, as the 8-lane AVX2 kernel's listing: per-row,
/// per-column and uniform operands, and the unroll its registers allow. Host-dependent only in whether it exists.
#[test]
fn outer_update_wide() {
    if !kiln_backends::cpu::gemm::asm::host_supported() {
        eprintln!("skipping: this host has no AVX2+FMA, so kiln's 8-lane elementwise kernels never run here");
        return;
    }
    let dev = Device::cpu();
    let data = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).cos()).collect::<Vec<f32>>();
    let w = Tensor::from_vec(data(24 * 37, 0.9), [24, 37], &dev).expect("w");
    let dy = Tensor::from_vec(data(24, 0.4), [24, 1], &dev).expect("dy");
    let x = Tensor::from_vec(data(37, 0.7), [1, 37], &dev).expect("x");
    let lr = Tensor::from_vec(vec![0.1f32], kiln::Shape::scalar(), &dev).expect("lr");
    let y = w.sub(dy.matmul(&x).mul(&lr));
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = schedule(&cap.graph);
    assert_eq!(plan.launches.len(), 1, "expected one fused kernel");
    let k = &plan.launches[0].kernel;
    let listing = kiln_backends::cpu::wide_listing(k).expect("generates").expect("an 8-lane kernel");
    check_golden("outer_update.wide.txt", &listing);
}

/// Every kernel of `outputs`' plan rendered as WGSL, one after the other.
fn plan_wgsl(outputs: &[&Tensor]) -> String {
    let cap = kiln::capture(outputs).expect("capture");
    let plan = schedule(&cap.graph);
    plan.launches.iter().map(|l| kiln_jit::render::wgsl::render(&l.kernel).expect("renders").source).collect()
}

/// The same kernel as CUDA C (for NVRTC) and HIP C (for hiprtc): `mul_add_relu_sum.{cu,hip}.txt`.
#[test]
fn mul_add_relu_sum_cuda_and_hip() {
    use kiln_jit::render::cuda::{Flavor, render};
    let k = kernel();
    check_golden("mul_add_relu_sum.cu.txt", &render(&k, Flavor::Cuda).expect("renders").source);
    check_golden("mul_add_relu_sum.hip.txt", &render(&k, Flavor::Hip).expect("renders").source);
}

/// A row kernel (softmax over the last dim: the row's max and sum, then its elements) and a gather with its index
/// check as CUDA C: `rows_and_gather.cu.txt`.
#[test]
fn rows_and_gather_cuda() {
    use kiln_jit::render::cuda::{Flavor, render};
    let dev = Device::cpu();
    let x = Tensor::from_vec((0..24).map(|i| (i as f32 * 0.3).sin()).collect::<Vec<f32>>(), [4, 6], &dev).expect("x");
    let idx = Tensor::from_vec(vec![2i32, 0, 5], [3], &dev).expect("idx");
    let y = x.softmax(-1);
    let z = x.index_select(1, &idx).mul(2.0);
    let cap = kiln::capture(&[&y, &z]).expect("capture");
    let plan = schedule(&cap.graph);
    let text: String = plan.launches.iter().map(|l| render(&l.kernel, Flavor::Cuda).expect("renders").source).collect();
    check_golden("rows_and_gather.cu.txt", &text);
}

/// Cooperative reductions (`render::cstyle::Coop`: a workgroup folds each output, the partial results meeting in
/// workgroup memory): a softmax over rows of 300 (one row per workgroup), a row sum over 500 and a column sum over
/// 300 rows (32 neighbouring outputs across the lanes), as WGSL and as CUDA C: `cooperative_reductions.{wgsl,cu}.txt`.
#[test]
fn cooperative_reductions_wgsl_and_cuda() {
    use kiln_jit::render::cuda::{Flavor, render};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(1200, 0.3), [4, 300], &dev).expect("x");
    let y = Tensor::from_vec(f(1500, 0.7), [3, 500], &dev).expect("y");
    let z = Tensor::from_vec(f(12_000, 0.11), [300, 40], &dev).expect("z");
    let outs = [x.softmax(-1), y.sum(1, false), z.sum(0, false)];
    let refs: Vec<&Tensor> = outs.iter().collect();
    check_golden("cooperative_reductions.wgsl.txt", &plan_wgsl(&refs));
    let cap = kiln::capture(&refs).expect("capture");
    let plan = schedule(&cap.graph);
    let cuda: String = plan.launches.iter().map(|l| render(&l.kernel, Flavor::Cuda).expect("renders").source).collect();
    check_golden("cooperative_reductions.cu.txt", &cuda);
}

/// `linalg::solve` of a batch of 2 matrices of order 5 in f32: the checked LU (a block per matrix), then the unit
/// lower and the upper triangular solves (a thread per right-hand column), as WGSL and as CUDA C:
/// `solve.{wgsl,cu}.txt`.
#[test]
fn solve_routines_wgsl_and_cuda() {
    use kiln_jit::render::cuda::{Flavor, render};
    let dev = Device::cpu();
    let a = Tensor::from_vec((0..50).map(|i| (i as f32 * 0.3).sin()).collect(), [2, 5, 5], &dev).expect("a");
    let b = Tensor::from_vec((0..20).map(|i| (i as f32 * 0.7).cos()).collect(), [2, 5, 2], &dev).expect("b");
    let x = kiln::linalg::solve(&a, &b);
    let cap = kiln::capture(&[&x]).expect("capture");
    let plan = schedule(&cap.graph);
    let routines: Vec<_> = plan.launches.iter().filter(|l| l.kernel.routine.is_some()).collect();
    assert_eq!(routines.len(), 3, "an LU and two triangular solves");
    let wgsl: String =
        routines.iter().map(|l| kiln_jit::render::wgsl::render(&l.kernel).expect("renders").source).collect();
    check_golden("solve.wgsl.txt", &wgsl);
    let cuda: String = routines.iter().map(|l| render(&l.kernel, Flavor::Cuda).expect("renders").source).collect();
    check_golden("solve.cu.txt", &cuda);
}

/// A zoo of the per-instruction table's rows: f32 transcendental, division, pow and max with NaN care; i32, u32 and
/// u8 wrapping arithmetic, division by zero and pow; bool logic and `where`; f16 arithmetic rounded per op; casts
/// between every 32-bit dtype (float -> int through the saturating helper); padded loads; uniform and normal random
/// numbers in f32 and f16. One golden file, so a change to the shared C-like table shows as a WGSL diff.
#[test]
fn table_zoo_wgsl() {
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin() * 3.0).collect::<Vec<f32>>();
    let a = Tensor::from_vec(f(24, 0.7), [4, 6], &dev).expect("a");
    let b = Tensor::from_vec(f(24, 1.3), [4, 6], &dev).expect("b");
    let floats = (a.sin().mul(b.cos()) + a.div(&b).pow(b.abs()).maximum(a.exp().log()).tanh()).sqrt().recip();
    let i = a.to_dtype(DType::I32);
    let j = b.to_dtype(DType::I32);
    let ints = (i.mul(&j).sub(&i).div(&j).pow(j.abs()).minimum(i.neg())).to_dtype(DType::F32);
    let u = a.to_dtype(DType::U32).add(b.to_dtype(DType::U32)).div(a.to_dtype(DType::U32)).pow(b.to_dtype(DType::U32));
    let bytes = a.to_dtype(DType::U8).mul(b.to_dtype(DType::U8)).neg().pow(a.to_dtype(DType::U8));
    let mask = a.lt(&b).logical_and(a.ne(&b)).logical_or(b.ge(&a).logical_not());
    let picked = mask.where_(&a, &b).to_dtype(DType::F16);
    let halves = (picked.mul(b.to_dtype(DType::F16)) + a.to_dtype(DType::F16).exp()).to_dtype(DType::I32);
    let padded = a.pad(&[(1, 2), (0, 3)], 0.5);
    let noise = Tensor::rand([4, 6], DType::F32, &dev) + Tensor::randn([4, 6], DType::F16, &dev).to_dtype(DType::F32);
    let text = plan_wgsl(&[&floats, &ints, &u, &bytes, &mask, &halves, &padded, &noise]);
    check_golden("table_zoo.wgsl.txt", &text);
    // The same rows in CUDA C.
    let cap = kiln::capture(&[&floats, &ints, &u, &bytes, &mask, &halves, &padded, &noise]).expect("capture");
    let cuda: String = schedule(&cap.graph)
        .launches
        .iter()
        .map(|l| {
            kiln_jit::render::cuda::render(&l.kernel, kiln_jit::render::cuda::Flavor::Cuda).expect("renders").source
        })
        .collect();
    check_golden("table_zoo.cu.txt", &cuda);
}

/// The tiled GEMM template with a fused bias + relu epilogue, batched with a broadcast right operand and ragged
/// M, N and K, in one tile configuration.
#[test]
fn gemm_template_wgsl() {
    use kiln_jit::kernel::gemm::GemmView;
    use kiln_jit::render::wgsl::{GemmTile, render_gemm};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(2 * 5 * 7, 0.7), [2, 5, 7], &dev).expect("x");
    // A right operand with a batch dim of 1, broadcast: `[2, 5, 7] x [7, 9]` would be folded into one
    // `[10, 7] x [7, 9]` product (`Tensor::matmul`).
    let w = Tensor::from_vec(f(7 * 9, 1.3), [1, 7, 9], &dev).expect("w");
    let bias = Tensor::from_vec(f(9, 0.3), [9], &dev).expect("bias");
    let y = (x.matmul(&w) + &bias).relu();
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = schedule(&cap.graph);
    assert_eq!(plan.launches.len(), 1, "expected one GEMM with its epilogue");
    let k = &plan.launches[0].kernel;
    let view = GemmView::of(k).expect("a GEMM");
    let tile = GemmTile { tm: 16, tn: 32, rm: 2, rn: 4, kt: 8 };
    let text = render_gemm(k, &view, tile).expect("renders").source;
    assert_eq!(text, render_gemm(k, &view, tile).expect("renders").source, "rendering is deterministic");
    check_golden("gemm_template.wgsl.txt", &text);
}

/// The one GEMM kernel of the GPU devices' plan for `y`, recognized.
fn gpu_gemm(y: &Tensor) -> (kiln_jit::kernel::KernelIr, kiln_jit::kernel::gemm::GemmView) {
    let cap = kiln::capture(&[y]).expect("capture");
    let plan = kiln_backends::gpu_cache::schedule(&cap.graph);
    let mut gemms = plan.launches.into_iter().filter_map(|l| {
        let v = kiln_jit::kernel::gemm::GemmView::of(&l.kernel)?;
        Some((l.kernel, v))
    });
    let gemm = gemms.next().expect("a GEMM");
    assert!(gemms.next().is_none(), "expected one GEMM");
    gemm
}

/// The tiled (SIMT) GEMM template in CUDA C, f32: `x @ w.t() + bias` with a ragged M and strides of 4, so both
/// operands are staged 4 elements (16 bytes) a load along K, with checked element loads at the ragged edge.
#[test]
fn gemm_template_cuda_vector_loads() {
    use kiln_jit::render::cstyle::GemmTile;
    use kiln_jit::render::cuda::{Flavor, render_gemm};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(5 * 12, 0.7), [5, 12], &dev).expect("x");
    let w = Tensor::from_vec(f(8 * 12, 1.3), [8, 12], &dev).expect("w");
    let b = Tensor::from_vec(f(8, 0.3), [8], &dev).expect("b");
    let y = x.matmul(&w.t()) + &b;
    let (k, view) = &gpu_gemm(&y);
    let tile = GemmTile { tm: 16, tn: 16, rm: 2, rn: 2, kt: 8 };
    let text = render_gemm(k, view, tile, 1, Flavor::Cuda).expect("renders").source;
    assert!(text.matches("kiln_ld4f(").count() >= 3, "both operands read as vectors:\n{text}");
    check_golden("gemm_template_vector_loads.cu.txt", &text);
}

/// The CUDA tensor-core GEMM template (bf16 operands, the GPU devices' schedule): the product rounded to bf16 and
/// its relu (computed in bf16) fused as the epilogue, a transposed weight as `nn::Linear` reads it, ragged M, N, K.
#[test]
fn gemm_tensor_core_template_cuda() {
    use kiln_jit::render::cuda::{Flavor, MmaTile, render_gemm_mma};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(5 * 7, 0.7), [5, 7], &dev).expect("x").to_dtype(DType::BF16);
    let w = Tensor::from_vec(f(9 * 7, 1.3), [9, 7], &dev).expect("w").to_dtype(DType::BF16);
    let y = x.matmul(&w.t()).relu();
    let (k, view) = &gpu_gemm(&y);
    assert_eq!((view.operands, view.out), (DType::BF16, DType::BF16));
    let text = render_gemm_mma(k, view, MmaTile::SQUARE, 1, Flavor::Cuda).expect("renders").source;
    check_golden("gemm_tensor_cores.cu.txt", &text);
}

/// The same template double-buffered: bf16 `x @ w.t()` with strides of 8, both operands copied 16 bytes at a time
/// by `cp.async` into one buffer while the other is multiplied; M ragged (a vector past it goes through registers).
#[test]
fn gemm_tensor_core_template_cuda_pipelined() {
    use kiln_jit::render::cuda::{Flavor, MmaTile, render_gemm_mma};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(5 * 64, 0.7), [5, 64], &dev).expect("x").to_dtype(DType::BF16);
    let w = Tensor::from_vec(f(16 * 64, 1.3), [16, 64], &dev).expect("w").to_dtype(DType::BF16);
    let y = x.matmul(&w.t());
    let (k, view) = &gpu_gemm(&y);
    let tile = MmaTile { wm: 1, wn: 1, fm: 1, fn_: 2 };
    let text = render_gemm_mma(k, view, tile, 1, Flavor::Cuda).expect("renders").source;
    assert!(text.contains("kiln_cp_wait1();"), "double-buffered:\n{text}");
    check_golden("gemm_tensor_cores_pipelined.cu.txt", &text);
}

/// The same template for f32 operands in TF32 (`m16n8k8`, each fragment element rounded with `cvt.rna`), as the
/// GPU devices run it where TF32 is allowed: a bias and a relu fused, a transposed weight, ragged M, N, K, and K
/// split two ways (the last block's sum of the partials).
#[test]
fn gemm_tf32_template_cuda_split_k() {
    use kiln_jit::render::cuda::{Flavor, MmaTile, render_gemm_mma};
    let dev = Device::cpu();
    let f = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<f32>>();
    let x = Tensor::from_vec(f(5 * 70, 0.7), [5, 70], &dev).expect("x");
    let w = Tensor::from_vec(f(9 * 70, 1.3), [9, 70], &dev).expect("w");
    let b = Tensor::from_vec(f(9, 0.3), [9], &dev).expect("b");
    let y = (x.matmul(&w.t()) + &b).relu();
    let (k, view) = &gpu_gemm(&y);
    assert_eq!((view.operands, view.out), (DType::F32, DType::F32));
    let text = render_gemm_mma(k, view, MmaTile::SQUARE, 2, Flavor::Cuda).expect("renders").source;
    check_golden("gemm_tf32_split_k.cu.txt", &text);
}

/// An elementwise kernel of a few elements is rendered without its unrolled body (six vectors per step): it runs in
/// microseconds either way, and each copy of a body with many loads cost compile time (a GPT step's 52-element
/// gradient-norm stack compiled in 15-18 ms unrolled, 3 without). A large one keeps it. Counted as the vector loads
/// of `x * 2` in the vectorized CLIF: one per vector of each body.
#[test]
fn small_elementwise_kernels_are_not_unrolled() {
    let vector_loads = |rows: usize| {
        let x = Tensor::from_vec(vec![0.5f32; rows * 32], [rows, 32], &Device::cpu()).expect("x");
        let cap = kiln::capture(&[&(&x * 2.0)]).expect("capture");
        let plan = schedule(&cap.graph);
        let k = &plan.launches.last().expect("a launch").kernel;
        clif::render(k, 0, target(), true).display().to_string().matches("load.f32x4").count()
    };
    assert_eq!(vector_loads(8), 1, "256 elements: only the one-vector body");
    assert_eq!(vector_loads(256), 7, "8192 elements: the six-vector body and the one-vector body");
}
