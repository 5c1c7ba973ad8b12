//! bf16 GEMMs: the schedule reads bf16 operands in place where the backend asks (`ScheduleOptions::bf16_gemm`),
//! every candidate of each bf16 unit this host has (AMX tiles, AVX512-BF16 dot products) is forced and compared
//! with the interpreter (ragged M, N and K, a transposed weight, a batch,
//! an epilogue in registers, f32 and bf16 outputs), and a bf16 matmul through the CPU device agrees with the
//! interpreter whatever this host runs it on.
//!
//! Tolerance: the f32 sums of the interpreter and of a kernel differ by the summation-order bound `gemm_tol(k)`
//! (bf16 products are exact in f32, so the sums see the same terms); a bf16 output is then rounded once by each,
//! which may land on neighbouring bf16 values: one bf16 step, 2^-7 of the value at most, on top. The inputs here keep
//! every sum far from f32's subnormal range, which the bf16 units flush to zero (`cpu/gemm/bf16.rs`).

mod test_cache;

mod common;

#[cfg(feature = "cpu")]
use common::{compare, gemm_tol, rand_f32};
#[cfg(feature = "cpu")]
use kiln::{DType, Device, HostBuffer, Tensor};
#[cfg(feature = "cpu")]
use kiln_backends::cpu::PreparedGemm;
#[cfg(feature = "cpu")]
use kiln_backends::cpu::gemm::config::{self, Bf16Config, Bf16Unit, GemmImpl, Split};
#[cfg(feature = "cpu")]
use kiln_jit::kernel::gemm::GemmView;
#[cfg(feature = "cpu")]
use kiln_jit::kernel::{ScheduleOptions, schedule_with};

#[cfg(feature = "cpu")]
/// A realized bf16 tensor (an input of the graphs built from it, as a model's weights and activations are).
fn bf16_rand(shape: &[usize], seed: u64) -> Tensor {
    let t = rand_f32(shape, seed).to_dtype(DType::BF16);
    t.realize().expect("bf16 values");
    t
}

#[cfg(feature = "cpu")]
fn tol(k: usize, out: DType) -> common::Tol {
    let t = gemm_tol(k);
    if out == DType::BF16 { common::Tol { rel: t.rel + 1.0 / 128.0, ..t } } else { t }
}

#[cfg(feature = "cpu")]
/// The bf16 units whose kernels this host runs (AMX, AVX512-BF16); says once which these tests force.
fn units() -> (bool, bool) {
    use kiln_backends::cpu::gemm::{bf16::unit_ready, config::Bf16Unit};
    static SAID: std::sync::Once = std::sync::Once::new();
    let ready = (unit_ready(Bf16Unit::Amx), unit_ready(Bf16Unit::Avx512Bf16));
    SAID.call_once(|| {
        let units = kiln_backends::cpu::isa::bf16_units();
        eprintln!(
            "bf16_gemm: kernels forced and checked: AMX {}, AVX512-BF16 {} ({units:?}); with neither, only the \
             schedule and the f32 path are checked",
            ready.0, ready.1
        );
    });
    ready
}

#[cfg(feature = "cpu")]
fn any_unit() -> bool {
    let (amx, dot) = units();
    amx || dot
}

#[cfg(feature = "cpu")]
/// Forces every bf16 candidate of `out`'s GEMM (each unit present), plus narrow B blocks (several blocks per
/// thread), and compares each with the interpreter. Returns how many ran (0 without a unit) and whether one split K
/// between the threads.
fn check_bf16_candidates(name: &str, out: &Tensor) -> (usize, bool) {
    let options = ScheduleOptions { transpose_copy: false, bf16_gemm: true, ..Default::default() };
    common::with_last_launch(name, out, options, |kernel, args, want| {
        let view = GemmView::of(kernel).unwrap_or_else(|| panic!("{name}: not a GEMM:\n{kernel}"));
        assert_eq!(view.operands, DType::BF16, "{name}: operands\n{kernel}");
        if !any_unit() {
            return (0, false);
        }
        let mut cands = config::candidates(&view, false);
        for (present, unit) in [(units().0, Bf16Unit::Amx), (units().1, Bf16Unit::Avx512Bf16)] {
            let offered = cands.iter().any(|c| matches!(c, GemmImpl::Bf16(a) if a.unit == unit));
            // One row is left to the generic kernel (`config::bf16_candidates`).
            assert_eq!(offered, present && view.m > 1, "{name}: {unit:?} candidates");
        }
        let narrow: Vec<GemmImpl> = cands
            .iter()
            .filter_map(|c| match c {
                GemmImpl::Bf16(a) => Some(GemmImpl::Bf16(Bf16Config { nc: a.nr(), ..*a })),
                _ => None,
            })
            .collect();
        cands.extend(narrow);
        run_candidates(name, kernel, args, &cands, |imp, got| {
            if let Err(e) = compare(&got, want, tol(view.k, view.out)) {
                panic!("{name}: candidate {} is wrong: {e}\n{kernel}", imp.name());
            }
        });
        let split_k = cands.iter().any(|c| matches!(c, GemmImpl::Bf16(a) if a.split == Split::Depth));
        (cands.len(), split_k)
    })
}

#[cfg(feature = "cpu")]
/// Builds and runs each of `cands` (all bf16 configurations) on GEMM `kernel`'s `args`, handing each output to
/// `check`.
fn run_candidates(
    name: &str,
    kernel: &kiln_jit::kernel::KernelIr,
    args: &[&HostBuffer],
    cands: &[GemmImpl],
    mut check: impl FnMut(&GemmImpl, HostBuffer),
) {
    for imp in cands {
        assert!(matches!(imp, GemmImpl::Bf16(_)), "{name}: {} offered for bf16 operands", imp.name());
        let got = PreparedGemm::new(kernel, *imp).and_then(|g| g.run_guarded(args));
        check(imp, got.unwrap_or_else(|e| panic!("{name}: {}: {e}", imp.name())));
    }
}

#[cfg(feature = "cpu")]
/// The bf16 candidates of a GEMM of several rows: one family per unit present (so none, and a check of nothing,
/// only on a host without either).
fn bf16_candidates_of(name: &str, view: &GemmView) -> Vec<GemmImpl> {
    let cands = config::candidates(view, false);
    assert_eq!(!cands.is_empty(), any_unit(), "{name}: candidates {:?}", cands.len());
    cands
}

#[cfg(feature = "cpu")]
#[test]
fn every_bf16_candidate_matches_the_interpreter() {
    // (m, n, k): whole tiles, ragged everything, one row, K under one step, N under one tile.
    // The last three split K between the threads (at most 16 rows, K of 4 steps or more), one of them ragged; one
    // row has no bf16 candidates (the generic kernel reads the weight in place), which the device test runs.
    for (m, n, k) in [
        (64, 64, 64),
        (37, 45, 70),
        (1, 50, 33),
        (33, 17, 5),
        (20, 8, 100),
        (96, 130, 257),
        (5, 70, 300),
        (16, 40, 129),
        (1, 64, 1024),
    ] {
        let (a, b) = (bf16_rand(&[m, k], 1), bf16_rand(&[k, n], 2));
        let (ran, split_k) = check_bf16_candidates(&format!("{m}x{n}x{k}"), &a.matmul(&b));
        assert_eq!(split_k, units().0 && ran > 0 && m <= 16 && k >= 128, "{m}x{n}x{k}: K-split candidates");
    }
}

#[cfg(feature = "cpu")]
#[test]
fn bf16_epilogues_layouts_and_batches_match_the_interpreter() {
    // K of 10 steps, the last ragged: AMX runs it in blocks of K (`bf16::K_BLOCK_STEPS`), the epilogue over the
    // finished sums; the next test's K of 3 steps runs the one-block kernels.
    let (m, n, k) = (40, 70, 300);
    // Column strips share one packed A here whatever its size (`set_bf16_shared_a_min`); the other tests run the
    // default, where A this small is packed by each strip.
    kiln_backends::cpu::gemm::set_bf16_shared_a_min(0);
    let x = bf16_rand(&[m, k], 3);
    let w = bf16_rand(&[n, k], 4);
    let bias = bf16_rand(&[n], 5);
    // A linear layer's product: the weight stored N x K, B read through its strides.
    check_bf16_candidates("linear", &x.matmul(&w.t()));
    // f32 operands widened from bf16: the same kernels with an f32 output and an f32 epilogue in registers (a bf16
    // epilogue rounds after every op, so it runs elementwise after a product stored in f32: see the next test).
    let wide = |t: &Tensor| t.to_dtype(DType::F32);
    let f32_out = (wide(&x).matmul(&wide(&w.t())) * 0.5 + &wide(&bias)).relu();
    assert_eq!(check_bf16_candidates("f32 out", &f32_out).0 > 0, any_unit());
    let few_rows = wide(&bf16_rand(&[5, 300], 10)).matmul(&wide(&bf16_rand(&[300, 40], 11)));
    assert_eq!(check_bf16_candidates("f32 out, K split", &few_rows).1, units().0);
    // Operands narrowed out of larger tensors (the schedule stores such a view in bf16 before the GEMM), K split too.
    let (big_a, big_b) = (bf16_rand(&[9, 300], 12), bf16_rand(&[300, 50], 13));
    let narrowed = big_a.narrow(0, 3, 5).matmul(&big_b.narrow(1, 7, 40));
    assert_eq!(check_bf16_candidates("narrowed, K split", &narrowed).1, units().0);
    // A batch of 3 and A stored transposed (packed, never read in place).
    let a = bf16_rand(&[3, m, k], 6);
    let b = bf16_rand(&[3, k, n], 7);
    check_bf16_candidates("batched", &a.matmul(&b));
    // Few rows against a B larger than L2 (`bf16_drive::k_outer_fits`): K blocks outermost over each thread's whole
    // strip, here with the L2 taken as 64 KiB (B 84 KB; 19 steps of K, the last ragged, in blocks of 8, 8 and 3).
    kiln_backends::cpu::gemm::set_bf16_k_outer_l2(64 << 10);
    check_bf16_candidates("K outermost", &bf16_rand(&[m, 600], 13).matmul(&bf16_rand(&[600, n], 14)).relu());
    check_bf16_candidates("K outermost, batched", &bf16_rand(&[2, m, 600], 15).matmul(&bf16_rand(&[2, 600, n], 16)));
    kiln_backends::cpu::gemm::set_bf16_k_outer_l2(0);
    // A packed one row block at a time (a problem past the packed-A limit), here on a small one.
    kiln_backends::cpu::gemm::set_bf16_a_limit(1);
    check_bf16_candidates("A per block", &a.matmul(&b));
    kiln_backends::cpu::gemm::set_bf16_a_limit(32 << 20);
    check_bf16_candidates("A transposed", &bf16_rand(&[k, m], 8).t().matmul(&bf16_rand(&[k, n], 9)));
    kiln_backends::cpu::gemm::set_bf16_shared_a_min(512 << 10);
}

#[cfg(feature = "cpu")]
/// Epilogues computing in bf16 after the rounding (each op rounded in the register program, as the Cranelift
/// kernels and the interpreter round it): an activation, a scale and `exp`, and a scale into bf16's subnormal range,
/// which the program's integer rounding keeps (`vcvtneps2bf16` would flush it to zero). Tolerance: the sums'
/// order, then a bf16 step for the product's rounding and one for each rounding after it.
#[test]
fn bf16_epilogues_round_each_op_as_the_interpreter() {
    let (m, n, k) = (37, 70, 96);
    let x = bf16_rand(&[m, k], 21);
    let w = bf16_rand(&[n, k], 22);
    let y = x.matmul(&w.t());
    let two_steps = common::Tol { rel: gemm_tol(k).rel + 2.0 / 128.0, abs: gemm_tol(k).abs };
    for (name, out) in [
        ("leaky_relu", kiln::nn::functional::leaky_relu(&y, 0.01)),
        ("scale, exp", (y.clone() * 0.25).exp()),
        ("subnormal scale", y.clone() * 1e-39),
    ] {
        let options = ScheduleOptions { transpose_copy: false, bf16_gemm: true, ..Default::default() };
        common::with_last_launch(name, &out, options, |kernel, args, want| {
            let view = GemmView::of(kernel).unwrap_or_else(|| panic!("{name}: not one GEMM kernel:\n{kernel}"));
            assert_eq!((view.operands, view.out), (DType::BF16, DType::BF16), "{name}");
            run_candidates(name, kernel, args, &bf16_candidates_of(name, &view), |imp, got| {
                let tol = if name == "subnormal scale" {
                    // Every value is a bf16 subnormal: one step of 2^-133 on top.
                    common::Tol { abs: two_steps.abs + 1e-40, ..two_steps }
                } else {
                    two_steps
                };
                if let Err(e) = compare(&got, want, tol) {
                    panic!("{name}: {} is wrong: {e}\n{kernel}", imp.name());
                }
                if name == "subnormal scale" {
                    let kept = common::values(&got).iter().filter(|v| **v != 0.0).count();
                    assert!(kept > got.len() / 2, "{name}: {}: subnormals flushed ({kept} kept)", imp.name());
                }
            });
        });
    }
}

#[cfg(feature = "cpu")]
/// Where the sums are exact (small integers), a bf16 epilogue of `+ - *` and a select matches the interpreter bit
/// for bit: every rounding in the program is the interpreter's.
#[test]
fn bf16_epilogue_roundings_are_the_interpreters() {
    let ints = |shape: [usize; 2], seed: usize| {
        let n = shape[0] * shape[1];
        // Hashed indices, so that rows and columns differ (the sums vary).
        let hash = |i: usize| ((i + 1000 * seed) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59;
        let v: Vec<f32> = (0..n).map(|i| (hash(i) % 5) as f32 - 2.0).collect();
        let t = Tensor::from_vec(v, shape, &Device::cpu()).unwrap().to_dtype(DType::BF16);
        t.realize().unwrap();
        t
    };
    let y = ints([33, 40], 1).matmul(&ints([40, 50], 2));
    let out = kiln::nn::functional::leaky_relu(&(&y * 0.1 + 0.3), 0.01);
    check_exact_epilogue("exact sums", &out);
    // bf16 operands read by the epilogue (a bias per column, a scale per row, a residual per element), widened by
    // their loads, with an f32 result (a bias before an activation computed in f32): one GEMM, bit for bit.
    let (bias, scale, residual) = (ints([1, 50], 3).reshape([50]), ints([33, 1], 4), ints([33, 50], 5));
    let out = ((&y + &bias) * &scale + &residual).to_dtype(DType::F32);
    check_exact_epilogue("bf16 operands", &out);
    let allow = kiln_backends::cpu::gemm::epilogue::Allow { bf16: true, bf16_loads: true, ..Default::default() };
    let cap = kiln::capture(&[&out]).unwrap();
    let options = ScheduleOptions { transpose_copy: false, bf16_gemm: true, ..Default::default() };
    let plan = schedule_with(&cap.graph, options);
    let k = &plan.launches.last().unwrap().kernel;
    let view = GemmView::of(k).unwrap_or_else(|| panic!("not one GEMM kernel:\n{k}"));
    let ep = kiln_backends::cpu::gemm::epilogue::translate_with(k, &view.roles, allow).expect("in registers");
    assert_eq!(ep.operands.iter().filter(|o| o.bf16).count(), 3, "{ep:?}");
}

/// Runs every bf16 candidate for `out`'s last launch (one GEMM kernel) and holds it to the interpreter bit for bit.
#[cfg(feature = "cpu")]
fn check_exact_epilogue(name: &str, out: &Tensor) {
    let options = ScheduleOptions { transpose_copy: false, bf16_gemm: true, ..Default::default() };
    common::with_last_launch(name, out, options, |kernel, args, want| {
        let view = GemmView::of(kernel).unwrap_or_else(|| panic!("not one GEMM kernel:\n{kernel}"));
        let distinct: std::collections::HashSet<u64> = common::values(want).iter().map(|v| v.to_bits()).collect();
        assert!(distinct.len() > 20, "the sums vary: {} distinct outputs", distinct.len());
        run_candidates(name, kernel, args, &bf16_candidates_of(name, &view), |imp, got| {
            if let Err(e) = compare(&got, want, common::Tol::EXACT) {
                panic!("{name}: {} is not the interpreter's rounding: {e}\n{kernel}", imp.name());
            }
        });
    });
}

#[cfg(feature = "cpu")]
/// With `bf16_gemm` a bf16 matmul is one kernel reading both operands in bf16 and rounding at its store; without
/// it, the operands are stored in f32 for the f32 GEMM and its result rounded by an elementwise kernel.
#[test]
fn the_schedule_reads_bf16_operands_only_where_asked() {
    let (a, b) = (bf16_rand(&[24, 40], 1), bf16_rand(&[40, 56], 2));
    let y = a.matmul(&b.t().contiguous().t());
    let cap = kiln::capture(&[&y]).unwrap();
    let with = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    let names: Vec<&str> = with.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    assert_eq!(with.launches.iter().filter(|l| l.kernel.reduce.is_some()).count(), 1, "{names:?}");
    let gemm = with.launches.last().unwrap();
    let view = GemmView::of(&gemm.kernel).unwrap_or_else(|| panic!("{}", gemm.kernel));
    assert_eq!((view.operands, view.out), (DType::BF16, DType::BF16), "{}", gemm.kernel);
    let without = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: false, ..Default::default() });
    let f32_gemms: Vec<GemmView> = without.launches.iter().filter_map(|l| GemmView::of(&l.kernel)).collect();
    assert_eq!(f32_gemms.len(), 1, "{:?}", without.launches.iter().map(|l| &l.kernel.name).collect::<Vec<_>>());
    assert_eq!((f32_gemms[0].operands, f32_gemms[0].out), (DType::F32, DType::F32));
    assert_eq!(without.launches.last().unwrap().kernel.output.dtype, DType::BF16);
    // An activation in bf16 after the rounding, reading no other tensor, joins the GEMM.
    let act = kiln::nn::functional::leaky_relu(&a.matmul(&bf16_rand(&[40, 56], 4)), 0.01);
    let cap = kiln::capture(&[&act]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    assert_eq!(plan.launches.len(), 1, "{:?}", plan.launches.iter().map(|l| &l.kernel.name).collect::<Vec<_>>());
    let view = GemmView::of(&plan.launches[0].kernel).unwrap_or_else(|| panic!("{}", plan.launches[0].kernel));
    assert_eq!((view.operands, view.out), (DType::BF16, DType::BF16));
    // A widened operand shared with an f32 matmul (a training step's weight gradient reads the same activation):
    // the f32 matmul stores it in f32, and the bf16 one then runs as an f32 GEMM, not a generic kernel.
    let (x, w, g) = (bf16_rand(&[40, 24], 5), bf16_rand(&[24, 56], 6), rand_f32(&[40, 8], 7));
    let xf = x.to_dtype(DType::F32);
    let fwd = kiln::nn::functional::leaky_relu(&xf.matmul(&w.to_dtype(DType::F32)).to_dtype(DType::BF16), 0.01);
    let grad = xf.t().matmul(&g);
    let cap = kiln::capture(&[&fwd, &grad]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    for l in plan.launches.iter().filter(|l| l.kernel.reduce.is_some()) {
        assert!(GemmView::of(&l.kernel).is_some(), "a matmul left to the generic kernel:\n{}", l.kernel);
    }
    // Rule 1b: a computed bf16 gradient widened to f32 that two matmuls read (a layer's output gradient, read by
    // its weight's gradient and its input's) is stored once in bf16, and both matmuls run as bf16 GEMMs.
    let (x, w, h) = (bf16_rand(&[40, 24], 8), bf16_rand(&[56, 24], 9), bf16_rand(&[40, 56], 10));
    let g = (&(&x.matmul(&w.t()) * 2.0) - &h).abs().sqrt().to_dtype(DType::F32);
    let dw = x.to_dtype(DType::F32).t().matmul(&g);
    let dx = g.matmul(&w.to_dtype(DType::F32));
    let cap = kiln::capture(&[&dw, &dx]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    let names: Vec<&str> = plan.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    let views: Vec<GemmView> = plan.launches.iter().filter_map(|l| GemmView::of(&l.kernel)).collect();
    assert_eq!(views.len(), 3, "{names:?}");
    assert!(views.iter().all(|v| v.operands == DType::BF16), "{names:?}");
    let stored_in_bf16 =
        plan.launches.iter().any(|l| l.kernel.output.dtype == DType::BF16 && l.kernel.output.len == 40 * 56);
    assert!(stored_in_bf16, "the gradient is not stored in bf16: {names:?}");
    // A bf16 operand viewed across a permutation (attention's heads merged back, `[B, H, T, D] -> [B * T, H * D]`)
    // is stored in bf16 in the GEMM's layout, not read in place by the generic reduce kernel.
    let heads = bf16_rand(&[2, 4, 8, 16], 11).permute([0, 2, 1, 3]).reshape([16, 64]);
    let proj = heads.matmul(&bf16_rand(&[32, 64], 12).t());
    let cap = kiln::capture(&[&proj]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    let names: Vec<&str> = plan.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    let reduces: Vec<&kiln_jit::kernel::KernelIr> =
        plan.launches.iter().filter(|l| l.kernel.reduce.is_some()).map(|l| &l.kernel).collect();
    assert_eq!(reduces.len(), 1, "{names:?}");
    let view = GemmView::of(reduces[0]).unwrap_or_else(|| panic!("not a GEMM:\n{}", reduces[0]));
    assert_eq!(view.operands, DType::BF16, "{names:?}");
    assert!(plan.launches[0].kernel.output.dtype == DType::BF16, "the merged heads are not stored in bf16: {names:?}");
    // A bf16 bias and relu after the rounding: the product is stored in f32 by the bf16 GEMM, then one kernel.
    let layer = (a.matmul(&bf16_rand(&[40, 56], 4)) + &bf16_rand(&[56], 3)).relu();
    let cap = kiln::capture(&[&layer]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions { bf16_gemm: true, ..Default::default() });
    let views: Vec<GemmView> = plan.launches.iter().filter_map(|l| GemmView::of(&l.kernel)).collect();
    assert_eq!(views.len(), 1);
    assert_eq!((views[0].operands, views[0].out), (DType::BF16, DType::F32));
    assert_eq!(plan.launches.len(), 2);
}

#[cfg(feature = "cpu")]
/// Through the device (the plan, the tuner's race and the store): a bf16 linear layer and a square product agree
/// with the interpreter, on AMX where this host has it and on the f32 GEMM elsewhere.
#[test]
fn bf16_matmuls_on_the_cpu_device_match_the_interpreter() {
    if common::skip_without_avx2() {
        return;
    }
    units();
    let (m, n, k) = (67, 96, 160);
    let x = bf16_rand(&[m, k], 11);
    let w = bf16_rand(&[n, k], 12);
    let bias = bf16_rand(&[n], 13);
    let square = bf16_rand(&[130, 130], 14);
    for (name, y, depth) in [
        ("linear", (x.matmul(&w.t()) + &bias).relu(), k),
        ("square", square.matmul(&square), 130),
        ("vector", bf16_rand(&[k], 15).matmul(&w.t()), k),
    ] {
        let cap = kiln::capture(&[&y]).unwrap();
        let want = cap.reference().unwrap().remove(0);
        let got: HostBuffer = y.to_device(&Device::cpu()).unwrap().to_host().unwrap();
        if let Err(e) = compare(&got, &want, tol(depth, DType::BF16)) {
            panic!("{name}: {e}");
        }
    }
}
