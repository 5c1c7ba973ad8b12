//! The generated GEMM: every candidate configuration the tuner may pick is forced once on GEMMs with ragged edges,
//! several K blocks, transposed and batched operands and every epilogue kind (in registers or as a pass), and
//! checked against the reference interpreter. A tuner that can pick a wrong kernel is the worst bug this area has.
//! Those are the CPU's (cargo feature `cpu`); the last test runs on every device.

mod test_cache;

mod common;

use kiln::{DType, Tensor};

#[cfg(feature = "cpu")]
use common::{compare, gemm_tol, rand_f32 as rand, tensor};
#[cfg(feature = "cpu")]
use kiln::HostBuffer;
#[cfg(feature = "cpu")]
use kiln_backends::cpu::PreparedGemm;
#[cfg(feature = "cpu")]
use kiln_backends::cpu::gemm::config::{self, GemmImpl, Split};
#[cfg(feature = "cpu")]
use kiln_backends::cpu::isa::Isa;
#[cfg(feature = "cpu")]
use kiln_jit::kernel::gemm::GemmView;
#[cfg(feature = "cpu")]
use kiln_jit::kernel::{ScheduleOptions, schedule_with};

#[cfg(feature = "cpu")]
/// Forces every candidate (and each tile with tiny blocks, for the middle K mode and edge tiles) on the GEMM of
/// `out` and compares with the interpreter's value of the graph. Returns the candidates run.
fn check_all_candidates(name: &str, out: &Tensor) -> usize {
    common::with_last_gemm(name, out, |kernel, args, want| check_candidates_on(name, kernel, args, want))
}

#[cfg(feature = "cpu")]
/// [`check_all_candidates`] on a GEMM kernel, its inputs and the value it must compute.
fn check_candidates_on(
    name: &str,
    kernel: &kiln_jit::kernel::KernelIr,
    args: &[&HostBuffer],
    want: &HostBuffer,
) -> usize {
    {
        let view = GemmView::of_patched(kernel).unwrap();
        // Every family this CPU has, whatever `KILN_CPU_ISA` narrows the tuner to.
        let mut cands = config::candidates_for(&view, view.batch.is_empty(), &present_isas());
        let extra: Vec<GemmImpl> = cands
            .iter()
            .filter_map(|c| match c {
                GemmImpl::Asm(c) => {
                    Some(GemmImpl::Asm(config::GemmConfig { kc: 16, mc: c.mr * 2, nc: c.nr() * 2, ..*c }))
                }
                GemmImpl::Transposed(c) => {
                    Some(GemmImpl::Transposed(config::GemmConfig { kc: 16, mc: c.mr * 2, nc: c.nr() * 2, ..*c }))
                }
                GemmImpl::Library | GemmImpl::Dot | GemmImpl::SplitK | GemmImpl::Bf16(_) => None,
            })
            .collect();
        cands.extend(extra);
        for imp in &cands {
            let gemm = PreparedGemm::new(kernel, *imp).unwrap_or_else(|e| panic!("{name}: {}: {e}", imp.name()));
            let got = gemm.run_guarded(args).unwrap_or_else(|e| panic!("{name}: {}: {e}", imp.name()));
            if let Err(e) = compare(&got, want, gemm_tol(view.k)) {
                panic!("{name}: candidate {} is wrong: {e}\n{kernel}", imp.name());
            }
        }
        cands.len()
    }
}

#[cfg(feature = "cpu")]
/// Convolutions whose patches the GEMM reads where the padded input stores them (a patched B, implicit im2col):
/// ragged columns (output positions) and K blocks, channel groups, a dilated, a strided and a non-square window, the
/// weight's gradient (the patches transposed), a bias and relu in the epilogue. Every candidate offered (only those that pack B) against the interpreter, and no other
/// candidate builds for such a GEMM.
#[test]
fn every_candidate_on_patched_convolution_operands() {
    use kiln::nn::functional::{Conv2dOptions, conv2d};
    if common::skip_without_avx2() {
        return;
    }
    let same = Conv2dOptions { padding: [1, 1], ..Default::default() };
    let cases: Vec<(&str, Tensor)> = vec![
        ("3x3, 5 -> 7, 10 x 10, batch 2", conv2d(&rand(&[2, 5, 10, 10], 30), &rand(&[7, 5, 3, 3], 31), None, &same)),
        // Rows of 70 output positions: most panels of columns are one run of the padded row (a vector copy).
        ("3x3, 2 -> 5, 4 x 70", conv2d(&rand(&[1, 2, 4, 70], 37), &rand(&[5, 2, 3, 3], 38), None, &same)),
        ("3x3 dilated 2, 2 groups, 12 x 11", {
            let o = Conv2dOptions { padding: [2, 2], dilation: [2, 2], groups: 2, ..Default::default() };
            conv2d(&rand(&[1, 4, 12, 11], 32), &rand(&[6, 2, 3, 3], 33), None, &o)
        }),
        // Columns two apart and a window's columns in K order: packed element by element.
        ("3x3 stride 2, 3 -> 8, 15 x 13", {
            let o = Conv2dOptions { stride: [2, 2], padding: [1, 1], ..Default::default() };
            conv2d(&rand(&[2, 3, 15, 13], 39), &rand(&[8, 3, 3, 3], 40), None, &o)
        }),
        ("the weight's gradient, 3x3, 4 -> 6, 9 x 10", {
            let w = rand(&[6, 4, 3, 3], 41).requires_grad();
            let y = conv2d(&rand(&[1, 4, 9, 10], 42), &w, None, &same);
            y.mul(rand(&[1, 6, 9, 10], 43)).sum_all().backward().unwrap().get(&w).unwrap().clone()
        }),
        ("5x3 with bias and relu, 9 x 21", {
            let o = Conv2dOptions { padding: [2, 1], ..Default::default() };
            conv2d(&rand(&[1, 3, 9, 21], 34), &rand(&[8, 3, 5, 3], 35), Some(&rand(&[8], 36)), &o).relu()
        }),
        // 49 window taps, more row classes than a padding is folded for; columns two apart, gathered.
        ("7x7 stride 2, 2 -> 6, 23 x 29", {
            let o = Conv2dOptions { stride: [2, 2], padding: [3, 3], ..Default::default() };
            conv2d(&rand(&[2, 2, 23, 29], 44), &rand(&[6, 2, 7, 7], 45), None, &o)
        }),
    ];
    // The padding is folded into the patches where AVX-512 runs (the only family whose panels read it).
    let fold = Isa::Avx512.present();
    let options = kiln_jit::kernel::ScheduleOptions {
        transpose_copy: false,
        patched_b: Some(1),
        patched_pad: fold,
        ..Default::default()
    };
    let mut folded = Vec::new();
    for (name, y) in cases {
        let ran = common::with_last_launch(name, &y, options, |kernel, args, want| {
            let view = GemmView::of_patched(kernel).unwrap_or_else(|| panic!("{name}: not a GEMM:\n{kernel}"));
            assert!(view.b.patch.is_some(), "{name}: B is not read as patches:\n{kernel}");
            if view.b.patch.as_ref().is_some_and(|p| !p.ranges.is_empty()) {
                folded.push(name);
            }
            assert!(GemmView::of(kernel).is_none(), "{name}: a patched B is only recognized by of_patched");
            let mut plain = view.clone();
            plain.b.patch = None;
            for imp in config::candidates_for(&plain, true, &present_isas()) {
                let built = PreparedGemm::new(kernel, imp);
                assert_eq!(built.is_ok(), imp.legal_for(&view), "{name}: {} built where illegal", imp.name());
            }
            check_candidates_on(name, kernel, args, want)
        });
        assert!(ran > 0, "{name}: no candidate");
    }
    // Every padded window of at most 16 taps, and the weight's gradient (its rows, output positions, in nine
    // classes: by the edges they lie on); not the 7x7 window, whose taps keep more than 16 sets of columns here.
    let expected: &[&str] = if fold {
        &[
            "3x3, 5 -> 7, 10 x 10, batch 2",
            "3x3, 2 -> 5, 4 x 70",
            "3x3 dilated 2, 2 groups, 12 x 11",
            "3x3 stride 2, 3 -> 8, 15 x 13",
            "the weight's gradient, 3x3, 4 -> 6, 9 x 10",
            "5x3 with bias and relu, 9 x 21",
        ]
    } else {
        &[]
    };
    assert_eq!(folded, expected, "the patches with their padding folded in");
}

#[cfg(feature = "cpu")]
/// The instruction families of the generated kernels this host can run; says once which (the AVX-512 kernels are
/// checked only where the CPU has AVX-512F).
fn present_isas() -> Vec<Isa> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.present()).collect();
    SAID.call_once(|| {
        let names: Vec<&str> = isas.iter().map(|i| i.name()).collect();
        eprintln!("gemm: generated kernels checked for {names:?} (the families this CPU has)");
        let bf16 = kiln_backends::cpu::isa::bf16_units();
        eprintln!("gemm: bf16 units present {bf16:?} (tests/bf16_gemm.rs checks the kernels that use them)");
    });
    isas
}

#[cfg(feature = "cpu")]
#[test]
fn every_candidate_on_ragged_and_blocked_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    for (m, n, k) in [(13, 45, 70), (64, 64, 300), (6, 16, 2), (1, 37, 19), (30, 100, 33), (200, 24, 40)] {
        let c = rand(&[m, k], 1).matmul(&rand(&[k, n], 2));
        assert!(check_all_candidates(&format!("{m}x{n}x{k}"), &c) > 0);
    }
}

#[cfg(feature = "cpu")]
/// Asserts that `imp` is a candidate for the GEMM of `c`, then forces every candidate on it (`check_all_candidates`).
fn offered_and_checked(imp: GemmImpl, name: &str, c: &Tensor) {
    let k = gemm_kernel(c);
    let cands = config::candidates(&GemmView::of(&k).unwrap(), true);
    assert!(cands.contains(&imp), "{name}: {} is not offered", imp.name());
    assert!(check_all_candidates(name, c) > 0);
}

#[cfg(feature = "cpu")]
/// The dot-product candidate (`x @ W^T`) on the shapes its loops split: K below, at and between its 8- and 16-float
/// steps, N not a multiple of its 4-column blocks (and below one block), M below, at and past its 3-row tiles with
/// rows left over, and A read from a slice whose rows are further apart than K; with an epilogue (its pass). Each is forced through `check_all_candidates` like every other candidate, which is asserted
/// to include it.
#[test]
fn dot_candidate_on_ragged_linear_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    let dot_runs = |name: &str, c: &Tensor| offered_and_checked(GemmImpl::Dot, name, c);
    // Tiles of three rows and four columns with rows, columns and K left over.
    let shapes = [(1, 3, 5), (1, 4, 8), (2, 9, 16), (3, 13, 23), (8, 37, 40), (5, 64, 130), (1, 256, 784)];
    let tiled = [(7, 9, 17), (6, 21, 33), (8, 64, 100)];
    for (m, n, k) in shapes.into_iter().chain(tiled) {
        let c = rand(&[m, k], 11).matmul(&rand(&[n, k], 12).t());
        dot_runs(&format!("dot {m}x{n}x{k}"), &c);
    }
    let wide = rand(&[4, 50], 13);
    let sliced = wide.narrow(1, 5, 30); // rows 50 floats apart, 30 long
    dot_runs("dot, A a slice", &sliced.matmul(&rand(&[21, 30], 14).t()));
    let with_epilogue = kiln::nn::functional::leaky_relu(&rand(&[2, 33], 15).matmul(&rand(&[19, 33], 16).t()), 0.01);
    dot_runs("dot with an epilogue", &with_epilogue);
    // Not offered past its row limit or for a B whose columns are not contiguous.
    let rows = config::DOT_MAX_M + 1;
    let k = gemm_kernel(&rand(&[rows, 16], 17).matmul(&rand(&[8, 16], 18).t()));
    assert!(!config::candidates(&GemmView::of(&k).unwrap(), true).contains(&GemmImpl::Dot));
    let k = gemm_kernel(&rand(&[2, 16], 17).matmul(&rand(&[16, 8], 18)));
    assert!(!config::candidates(&GemmView::of(&k).unwrap(), true).contains(&GemmImpl::Dot));
}

#[cfg(feature = "cpu")]
/// The transposed candidate (`x @ W^T` computed as `(W x^T)^T`) on linear-layer shapes from just past the dot
/// products' row limit to its own: rows, columns and K left over against its 6- and 4-row tiles and the 8 x 8
/// transpose blocks, with and without an epilogue (its pass). Each is forced through `check_all_candidates`, which is
/// asserted to include it; it is not offered past its row limit or for a weight stored K x N.
#[test]
fn transposed_candidate_on_linear_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    for (m, n, k) in [(9, 16, 40), (13, 37, 23), (32, 100, 70), (17, 64, 300), (64, 24, 33)] {
        let c = rand(&[m, k], 11).matmul(&rand(&[n, k], 12).t());
        let v = GemmView::of(&gemm_kernel(&c)).unwrap();
        assert!(config::candidates(&v, true).iter().any(|c| matches!(c, GemmImpl::Transposed(_))), "{m}x{n}x{k}");
        assert!(check_all_candidates(&format!("transposed {m}x{n}x{k}"), &c) > 0);
    }
    let layer = (rand(&[24, 33], 15).matmul(&rand(&[40, 33], 16).t()) + rand(&[40], 17)).relu();
    let v = GemmView::of(&gemm_kernel(&layer)).unwrap();
    assert!(config::candidates(&v, true).iter().any(|c| matches!(c, GemmImpl::Transposed(_))));
    assert!(check_all_candidates("transposed with bias + relu", &layer) > 0);
    for c in [
        rand(&[config::TRANSPOSED_MAX_M + 1, 16], 3).matmul(&rand(&[16, 16], 4).t()),
        rand(&[16, 16], 3).matmul(&rand(&[16, 16], 4)),
    ] {
        let v = GemmView::of(&gemm_kernel(&c)).unwrap();
        assert!(!config::candidates(&v, true).iter().any(|c| matches!(c, GemmImpl::Transposed(_))));
    }
}

#[cfg(feature = "cpu")]
/// The split-K candidate (`dy @ W`, W stored K x N) on the shapes its loops split: N below, at and between its 96-,
/// 64-, 32-, 16- and 8-column steps with columns left over, K not a multiple of the part count and at its 32-row
/// minimum, up to its 8-row limit, A read from a slice and transposed (strided along K), with an epilogue (its pass);
/// and parts too large for a core's cache, whose rows it reads a few at a time with the sums carried between blocks
/// (ragged blocks and columns; up to 8 rows of A sharing each strip of B). Forced through `check_all_candidates` like every other candidate, which is asserted to
/// include it.
#[test]
fn splitk_candidate_on_ragged_input_gradient_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    let runs = |name: &str, c: &Tensor| offered_and_checked(GemmImpl::SplitK, name, c);
    let shapes = [(1, 3, 32), (1, 8, 33), (1, 100, 64), (2, 161, 77), (1, 256, 128), (3, 250, 40), (8, 97, 131)];
    for (m, n, k) in shapes {
        runs(&format!("splitk {m}x{n}x{k}"), &rand(&[m, k], 21).matmul(&rand(&[k, n], 22)));
    }
    let threads = kiln_backends::cpu::pool::global().threads();
    for (m, n, k) in [(1, 1000, 2101), (3, 1001, 2099), (8, 1003, 2100)] {
        let part_bytes = k / threads.min(k / 16) * n * 4;
        assert!(part_bytes > config::SPLITK_STREAMED_PART_BYTES, "{m}x{n}x{k}: parts of {part_bytes} bytes are cached");
        runs(&format!("splitk streamed {m}x{n}x{k}"), &rand(&[m, k], 31).matmul(&rand(&[k, n], 32)));
    }
    let wide = rand(&[2, 90], 23);
    runs("splitk, A a slice", &wide.narrow(1, 10, 70).matmul(&rand(&[70, 40], 24)));
    runs("splitk, A transposed", &rand(&[50, 2], 25).t().matmul(&rand(&[50, 33], 26)));
    let with_epilogue = kiln::nn::functional::leaky_relu(&rand(&[1, 64], 27).matmul(&rand(&[64, 45], 28)), 0.01);
    runs("splitk with an epilogue", &with_epilogue);
    // Not offered past its row limit, for K under two parts, or for a B whose rows are not contiguous.
    for (a, b) in [
        (rand(&[config::DOT_MAX_M + 1, 64], 29), rand(&[64, 16], 30)),
        (rand(&[1, 31], 29), rand(&[31, 16], 30)),
        (rand(&[1, 64], 29), rand(&[16, 64], 30).t()),
    ] {
        let k = gemm_kernel(&a.matmul(&b));
        assert!(!config::candidates(&GemmView::of(&k).unwrap(), true).contains(&GemmImpl::SplitK));
    }
}

#[cfg(feature = "cpu")]
/// The K split of the generated kernels (`Split::Depth`: a weight gradient `x^T dy`, each thread summing its share
/// of the tokens) on ragged tiles and columns, a few rows (the skinny tiles), K odd (the threads' shares of two lengths: at K blocks of 256, 513
/// splits into one block for the first thread and two for the second, so both the one-block and the blocked
/// kernels run), A and B stored K-major or row-major, forced through `check_all_candidates`, which is asserted to
/// include every K-split configuration, also with an epilogue (run as a pass over the summed partials). Not offered
/// for a batched product, or where K is not long against M and N.
#[test]
fn depth_split_candidates_on_weight_gradient_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    let depth = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Depth);
    let offered = |c: &Tensor| config::candidates(&GemmView::of(&gemm_kernel(c)).unwrap(), true);
    for (m, n, k) in [(23, 45, 300), (64, 64, 513), (30, 128, 1000), (128, 7, 777), (10, 100, 520), (300, 280, 400)] {
        let grad = rand(&[k, m], 41).t().matmul(&rand(&[k, n], 42));
        let name = format!("depth {m}x{n}x{k}");
        assert!(offered(&grad).iter().any(depth), "{name}: no K split offered");
        assert!(check_all_candidates(&name, &grad) > 0);
    }
    let plain = rand(&[40, 600], 43).matmul(&rand(&[600, 24], 44));
    assert!(offered(&plain).iter().any(depth));
    assert!(check_all_candidates("depth, row-major operands", &plain) > 0);
    // An epilogue beyond the sum runs as a pass over the added partials: an SGD update fused into its weight
    // gradient (the weight read by the epilogue), and an activation.
    let w = rand(&[40, 24], 51);
    let update = &w - rand(&[600, 40], 45).t().matmul(&rand(&[600, 24], 46)) * 0.01;
    let with_relu = rand(&[601, 40], 52).t().matmul(&rand(&[601, 24], 53)).relu();
    for (name, c) in [("depth, SGD update epilogue", &update), ("depth, relu epilogue", &with_relu)] {
        assert!(offered(c).iter().any(depth), "{name}: no K split offered");
        assert!(check_all_candidates(name, c) > 0);
    }
    let batched = rand(&[2, 600, 40], 47).transpose(1, 2).matmul(&rand(&[2, 600, 24], 48));
    let short = rand(&[40, 200], 49).matmul(&rand(&[200, 24], 50));
    for c in [batched, short] {
        assert!(!offered(&c).iter().any(depth));
    }
}

#[cfg(feature = "cpu")]
/// Where the plan writes over B (a training step's weight), a small-M GEMM with B stored K x N runs split K, chosen
/// rather than raced (`config::step_candidates`), under a key of its own.
#[test]
fn a_rewritten_weight_selects_split_k_under_its_own_key() {
    use config::StepContext;
    use kiln_backends::cpu::gemm::tune::problem;
    let rewritten = StepContext { b_rewritten: true, ..Default::default() };
    let k = gemm_kernel(&rand(&[1, 128], 31).matmul(&rand(&[128, 256], 32)));
    let v = GemmView::of(&k).unwrap();
    assert_eq!(config::step_candidates(&v, true, rewritten), vec![GemmImpl::SplitK]);
    assert_eq!(config::step_candidates(&v, true, StepContext::default()), config::candidates(&v, true));
    assert_ne!(problem(&k, &v, 2, "cpu-a", rewritten).key, problem(&k, &v, 2, "cpu-a", StepContext::default()).key);
    // Where split K is not legal (B stored N x K), nothing changes.
    let k = gemm_kernel(&rand(&[1, 128], 31).matmul(&rand(&[256, 128], 32).t()));
    let v = GemmView::of(&k).unwrap();
    assert_eq!(config::step_candidates(&v, true, rewritten), config::candidates(&v, true));
    // A GEMM whose output replaces an input (a weight's update) keeps only the row-split generated kernels.
    let update = StepContext { output_replaces_input: true, ..Default::default() };
    let k = gemm_kernel(&rand(&[32, 256], 33).t().matmul(&rand(&[32, 784], 34)));
    let v = GemmView::of(&k).unwrap();
    let rows = config::step_candidates(&v, true, update);
    assert!(
        !rows.is_empty() && rows.iter().all(|c| matches!(c, GemmImpl::Asm(c) if c.split == Split::Rows)),
        "{rows:?}"
    );
    assert!(rows.len() < config::candidates(&v, true).len());
    // Past `UPDATE_MAX_K` an update is bound by its FMAs: every candidate races.
    let k =
        gemm_kernel(&rand(&[config::UPDATE_MAX_K + 1, 64], 33).t().matmul(&rand(&[config::UPDATE_MAX_K + 1, 80], 34)));
    let v = GemmView::of(&k).unwrap();
    assert_eq!(config::step_candidates(&v, true, update), config::candidates(&v, true));
}

#[cfg(feature = "cpu")]
/// A tall intermediate (rows a step's tokens, read by later kernels that cut them by rows) with K short against M
/// is offered no column split of the generated kernels, under a key of its own; a plan output, a short one or a
/// long K keep every candidate.
#[test]
fn a_tall_intermediate_is_not_split_by_columns() {
    use config::StepContext;
    use kiln_backends::cpu::gemm::tune::problem;
    let later = StepContext { output_read_later: true, ..Default::default() };
    let cols = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Cols);
    let k = gemm_kernel(&rand(&[1024, 128], 35).matmul(&rand(&[128, 512], 36)));
    let v = GemmView::of(&k).unwrap();
    let kept = config::step_candidates(&v, true, later);
    assert!(config::candidates(&v, true).iter().any(cols));
    assert!(!kept.iter().any(cols) && kept.iter().any(|c| matches!(c, GemmImpl::Asm(c) if c.split == Split::Rows)));
    assert_ne!(problem(&k, &v, 2, "cpu-a", later).key, problem(&k, &v, 2, "cpu-a", StepContext::default()).key);
    assert_eq!(config::step_candidates(&v, true, StepContext::default()), config::candidates(&v, true));
    for (m, kk) in [(config::TALL_ROWS - 1, 32), (512, 784)] {
        let k = gemm_kernel(&rand(&[m, kk], 37).matmul(&rand(&[kk, 256], 38)));
        let v = GemmView::of(&k).unwrap();
        assert_eq!(config::step_candidates(&v, true, later), config::candidates(&v, true), "{m} x 256 x {kk}");
    }
}

#[cfg(feature = "cpu")]
/// A weight gradient over tokens (`x^T dy`, both operands stored token by token) with an operand the plan wrote is
/// offered the K split alone (its threads read the tokens their own earlier kernels wrote), also with an SGD update
/// as its epilogue, under a key of its own; plan inputs, or A stored row by row, keep every candidate.
#[test]
fn a_weight_gradient_of_plan_tokens_splits_k() {
    use config::StepContext;
    use kiln_backends::cpu::gemm::tune::problem;
    let written = StepContext { operand_written_here: true, ..Default::default() };
    let depth = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Depth);
    let w = rand(&[128, 256], 39);
    let grad = rand(&[512, 128], 40).t().matmul(&rand(&[512, 256], 41));
    for c in [grad.clone(), &w - grad * 0.01] {
        let k = gemm_kernel(&c);
        let v = GemmView::of(&k).unwrap();
        let all = config::candidates(&v, true);
        let kept = config::step_candidates(&v, true, written);
        assert!(all.iter().any(|c| !depth(c)) && !kept.is_empty() && kept.iter().all(depth), "{kept:?}");
        assert_eq!(kept, all.iter().copied().filter(depth).collect::<Vec<_>>());
        assert_ne!(problem(&k, &v, 2, "cpu-a", written).key, problem(&k, &v, 2, "cpu-a", StepContext::default()).key);
        assert_eq!(config::step_candidates(&v, true, StepContext::default()), all);
    }
    let rows = gemm_kernel(&rand(&[128, 512], 42).matmul(&rand(&[512, 256], 43)));
    let v = GemmView::of(&rows).unwrap();
    assert!(config::candidates(&v, true).iter().any(depth));
    assert_eq!(config::step_candidates(&v, true, written), config::candidates(&v, true));
}

#[cfg(feature = "cpu")]
#[test]
fn every_candidate_on_transposed_and_batched_operands() {
    if common::skip_without_avx2() {
        return;
    }
    let cases: Vec<(&str, Tensor)> = vec![
        ("a.t() @ b", rand(&[50, 20], 3).t().matmul(&rand(&[50, 33], 4))),
        ("a @ b.t() (linear)", rand(&[5, 40], 5).matmul(&rand(&[27, 40], 6).t())),
        ("a @ b.t(), M=12", rand(&[12, 40], 5).matmul(&rand(&[27, 40], 6).t())),
        ("batched", rand(&[3, 17, 20], 7).matmul(&rand(&[3, 20, 33], 8))),
        // Enough elements that the threads take them whole (`parts_per_batch_element`), and small enough to read
        // both operands in place; A transposed as attention's `p^T @ dy`.
        ("batched, whole elements", rand(&[33, 17, 20], 11).matmul(&rand(&[33, 20, 35], 12))),
        ("batched a.t(), whole elements", rand(&[33, 20, 17], 13).transpose(-2, -1).matmul(&rand(&[33, 20, 35], 14))),
        ("batch-1 vector", rand(&[1, 64], 9).matmul(&rand(&[64, 70], 10))),
        // Nine batch dims no merge can join (A's reversed): every one must move the operands.
        ("nine batch dims", {
            let a = rand(&[2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 4], 15).permute([8, 7, 6, 5, 4, 3, 2, 1, 0, 9, 10]);
            a.matmul(&rand(&[2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 5], 16))
        }),
    ];
    for (name, c) in cases {
        assert!(check_all_candidates(name, &c) > 0);
        let k = &gemm_kernel(&c);
        if name.contains("whole elements") {
            let view = GemmView::of(k).unwrap();
            let both_in_place = |imp: &GemmImpl| matches!(imp, GemmImpl::Asm(c) if !c.pack_a && !c.pack_b);
            let cands = config::candidates_for(&view, false, &present_isas());
            assert!(cands.iter().any(both_in_place), "{name}: no candidate reads both operands in place");
        }
        // The register epilogue must cover the common kinds; the others go through the pass.
        let in_registers = kiln_backends::cpu::gemm::epilogue::translate(k, &GemmView::of(k).unwrap().roles).is_some();
        assert_eq!(in_registers, !name.contains("(a pass)"), "{name}: epilogue in registers = {in_registers}");
    }
}

#[cfg(feature = "cpu")]
#[test]
fn every_candidate_with_each_epilogue() {
    if common::skip_without_avx2() {
        return;
    }
    let (m, n, k) = (14, 41, 37);
    let a = rand(&[m, k], 11);
    let w = rand(&[k, n], 12);
    let mm = || a.matmul(&w);
    let bias = rand(&[n], 13);
    let col = rand(&[m, 1], 14);
    let res = rand(&[m, n], 15);
    let lr = tensor(DType::F64, &[0.125], &[]);
    let cases: Vec<(&str, Tensor)> = vec![
        ("bias + relu", (mm() + &bias).relu()),
        ("scale", mm() * 0.5),
        ("per-row bias", mm() + &col),
        ("residual", mm() + &res),
        ("sgd update", res.sub(mm().mul(lr.to_dtype(DType::F32)))),
        ("leaky relu backward", res.gt(0.0).where_(mm(), mm() * 0.01)),
        ("neg abs sqrt", (-mm()).abs().sqrt()),
        ("div", mm() / (res.abs() + 1.0)),
        // One value read twice by one operation, then a load: the register must be released once, not twice.
        ("square, then a residual", {
            let t = mm() + &bias;
            &(&t * &t) - &res
        }),
        // exp, tanh and log in registers where the tile leaves them the room, else as an 8-lane pass.
        ("bias + sigmoid", (mm() + &bias).sigmoid()),
        ("exp", (mm() * 0.25).exp()),
        ("log", (mm().abs() + 0.5).log()),
        ("gelu (tanh)", kiln::nn::functional::gelu(&mm(), kiln::nn::functional::Approximate::Tanh)),
        // The tanh GELU's gradient at the pre-activation `res` (as the backward pass fuses it into the product of
        // the next layer's gradient): literals on either side of `+ - *`, in registers or in an 8-lane pass.
        ("gelu (tanh) gradient", {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = ((&res + &res * &res * &res * 0.044715) * c).tanh();
            let inner = 1.0 - &t * &t;
            mm() * ((&t + 1.0) * 0.5 + &res * 0.5 * inner * c * (3.0 * 0.044715 * (&res * &res) + 1.0))
        }),
        // A literal on the left of ops that commute and of one that does not.
        ("literals on the left", {
            let full = |v: f64| Tensor::full([m, n], v, DType::F32, &kiln::Device::cpu());
            &(&full(0.75) * &mm()) + &full(2.0) - &res
        }),
        ("max (a pass)", mm().maximum(&res)),
        ("batch-1 layer, bias + relu", (rand(&[1, k], 16).matmul(&w) + &bias).relu()),
        ("batched, residual and per-batch bias", {
            let (a3, w3) = (rand(&[3, m, k], 17), rand(&[3, k, n], 18));
            a3.matmul(&w3) + rand(&[3, m, n], 19) + rand(&[3, 1, n], 20)
        }),
    ];
    for (name, c) in cases {
        assert!(check_all_candidates(name, &c) > 0);
        let k = &gemm_kernel(&c);
        if name.contains("whole elements") {
            let view = GemmView::of(k).unwrap();
            let both_in_place = |imp: &GemmImpl| matches!(imp, GemmImpl::Asm(c) if !c.pack_a && !c.pack_b);
            let cands = config::candidates_for(&view, false, &present_isas());
            assert!(cands.iter().any(both_in_place), "{name}: no candidate reads both operands in place");
        }
        // The register epilogue must cover the common kinds; the others go through the pass.
        let ep = kiln_backends::cpu::gemm::epilogue::translate(k, &GemmView::of(k).unwrap().roles);
        assert_eq!(ep.is_some(), !name.contains("(a pass)"), "{name}: epilogue in registers = {}", ep.is_some());
        // Literals are read where they are used, never held in a uniform slot (only the learning rate, a value
        // read from a buffer, takes one); so the GELU's gradient fits the 15 registers of an 8-lane pass.
        if let Some(ep) = ep {
            assert_eq!(ep.uniforms.len(), usize::from(name == "sgd update"), "{name}: uniforms {:?}", ep.uniforms);
            if name == "gelu (tanh) gradient" {
                assert!(ep.program.temps_needed() <= 14, "{name}: {} temporaries", ep.program.temps_needed());
            }
        }
    }
}

#[cfg(feature = "cpu")]
/// The GEMM kernel of `out`'s plan (the last launch).
fn gemm_kernel(out: &Tensor) -> kiln_jit::kernel::KernelIr {
    let cap = kiln::capture(&[out]).unwrap();
    schedule_with(&cap.graph, ScheduleOptions { transpose_copy: false, ..Default::default() })
        .launches
        .pop()
        .unwrap()
        .kernel
}

#[cfg(feature = "cpu")]
#[test]
fn tuning_keys_bucket_shapes_and_separate_what_changes_the_kernel() {
    use kiln_backends::cpu::gemm::tune::problem;
    let key = |t: &Tensor, device: &str| {
        let k = gemm_kernel(t);
        problem(&k, &GemmView::of(&k).unwrap(), 2, device, Default::default()).key
    };
    let mm = |m: usize, n: usize, k: usize| rand(&[m, k], 1).matmul(&rand(&[k, n], 2));
    let base = key(&mm(1000, 300, 200), "cpu-a");
    // Same buckets (M 1000 -> 1024, N 300 -> 512, K 200 -> 256): the same key, tuned at the bucket's bound.
    assert_eq!(base, key(&mm(1024, 512, 256), "cpu-a"));
    assert_eq!(base, key(&mm(600, 260, 130), "cpu-a"));
    assert!(base.dims.contains(&("m".to_string(), 1024)));
    // Another bucket, device, layout or epilogue: another key.
    assert_ne!(base, key(&mm(1025, 300, 200), "cpu-a"));
    assert_ne!(base, key(&mm(1000, 300, 200), "cpu-b"));
    assert_ne!(base, key(&rand(&[1000, 200], 1).matmul(&rand(&[300, 200], 2).t()), "cpu-a"));
    assert_ne!(base, key(&mm(1000, 300, 200).relu(), "cpu-a"));
    assert_ne!(key(&mm(1000, 300, 200).relu(), "cpu-a"), key(&(mm(1000, 300, 200) * 2.0).relu(), "cpu-a"));
    // The candidate set is part of the key (skinny problems have another set).
    assert_ne!(key(&mm(8, 300, 200), "cpu-a").candidates, base.candidates);
}

#[cfg(feature = "cpu")]
/// The tuner's check (`gemm_check::Reference`, evaluated once per search and shared by every candidate) accepts the
/// interpreter's output of a GEMM with an epilogue and rejects it with one sampled element off by a wrong tile's
/// error (a missing product), and rejects a short output instead of reading past it.
#[test]
fn tuner_reference_accepts_the_right_output_and_rejects_a_wrong_one() {
    use kiln_backends::gemm_check::{Reference, sample_positions};
    let (m, n, k) = (21, 37, 50);
    let out = (rand(&[m, k], 3).matmul(&rand(&[k, n], 4)) + &rand(&[n], 5)).relu();
    common::with_last_gemm("reference", &out, |kernel, args, want| {
        let reference = Reference::of(kernel, k, args);
        let HostBuffer::F32(good) = want.clone() else { panic!("f32 GEMM") };
        reference.check(&good, 0.0).unwrap();
        // The last sampled position is in the middle of the output (a corner could be a relu zero).
        let pos = sample_positions(&kernel.out_extents).pop().unwrap();
        let flat = pos[0] * n + pos[1];
        let mut bad = good.clone();
        bad[flat] += 1e-3 + bad[flat].abs() * 1e-3;
        let e = reference.check(&bad, 0.0).unwrap_err();
        assert!(e.contains(&format!("{pos:?}")), "{e}");
        assert!(reference.check(&good[..good.len() - 1], 0.0).is_err());
    });
}

#[cfg(feature = "cpu")]
/// `KILN_AUTOTUNE=fast` times a cut-down problem of the same key when one canonical run would be expensive: batch
/// first, then the larger of M and N, never K, never below 256, and never N of a GEMM with few rows (bound by
/// streaming B, whose size must stay). The proxy is itself a GEMM with the key's layouts and epilogue.
#[test]
fn fast_mode_times_a_smaller_problem_of_the_same_key() {
    use kiln_backends::cpu::gemm::tune::{FAST_TIMED_FLOPS, fast_proxy, problem};
    let dims = |p: &kiln_backends::cpu::gemm::tune::TuneProblem| ["batch", "m", "n", "k"].map(|d| p.dim(d));
    let proxy_of = |t: &Tensor| {
        let k = gemm_kernel(t);
        let v = GemmView::of(&k).unwrap();
        let full = problem(&k, &v, 2, "cpu-a", Default::default());
        fast_proxy(&k, &v, &full, 2, "cpu-a").map(|p| (full, p))
    };
    let mm = |m: usize, n: usize, k: usize| (rand(&[m, k], 1).matmul(&rand(&[n, k], 2).t()) + &rand(&[n], 3)).relu();
    // The MLP's first layer at batch 1024 (K 784 -> 1024): M is cut to 256.
    let (full, p) = proxy_of(&mm(1024, 256, 784)).expect("a 1024 x 256 x 1024 run is over the budget");
    assert_eq!((dims(&full), dims(&p)), ([1, 1024, 256, 1024], [1, 256, 256, 1024]));
    assert_eq!(p.key, full.key, "the record is the full problem's");
    let pv = &p.view;
    assert_eq!((pv.m, pv.n, pv.k, pv.roles.len()), (256, 256, 1024, full.view.roles.len()), "same epilogue");
    assert_eq!(p.kernel.outer, full.kernel.outer);
    const { assert!(2 * 256 * 256 * 1024 <= FAST_TIMED_FLOPS) };
    // N is cut when it is the larger one.
    assert_eq!(dims(&proxy_of(&mm(300, 2000, 1000)).unwrap().1), [1, 256, 256, 1024]);
    // Batched: the batch goes first, down to 2.
    let b = rand(&[64, 256, 256], 4).matmul(&rand(&[64, 256, 256], 5));
    assert_eq!(dims(&proxy_of(&b).unwrap().1), [4, 256, 256, 256]);
    // Cheap problems, and few-row GEMMs that stream a large B, are timed as they are.
    assert!(proxy_of(&mm(128, 256, 1000)).is_none());
    assert!(proxy_of(&mm(64, 4096, 4096)).is_none());
}

/// A GEMM whose epilogue draws random numbers (`x @ w + rand(..) * 0.01`) runs on every device and matches the
/// reference interpreter; tuning it indexed a random key the verification did not have, and panicked.
#[test]
fn a_gemm_with_a_random_epilogue_matches_the_interpreter() {
    for dev in common::devices() {
        let g = kiln::Generator::new(5);
        let x = Tensor::rand_with([256, 64], DType::F32, &dev, &g);
        let w = Tensor::rand_with([64, 8], DType::F32, &dev, &g);
        kiln::realize(&[&x, &w]).unwrap();
        let y = x.matmul(&w) + Tensor::rand_with([256, 8], DType::F32, &dev, &g) * 0.01;
        let want = kiln::capture(&[&y]).unwrap().reference().unwrap().remove(0);
        common::compare(&y.to_host().unwrap(), &want, common::gemm_tol(64)).unwrap_or_else(|e| panic!("{dev:?}: {e}"));
    }
}
