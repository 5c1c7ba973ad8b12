//! The generated elementwise kernels (`backends/src/cpu/wide/`), held bit for bit to the reference interpreter:
//! they compute the same correctly rounded f32 operations in the same order, so there is no tolerance to write
//! down. Each case runs as the realize path picks it and then at every width the host has (8 lanes with AVX2, 16
//! with AVX-512F), forced.
//!
//! Shapes walk every edge of the generated loop: one row split into 8-column chunks over the threads (a ragged last
//! chunk), rows shorter than one vector, rows of whole vectors (where the output's first 32-byte boundary may start
//! with a masked head) and ragged rows (a masked tail), row counts large enough to split over the threads. Values
//! include NaN, infinities, signed zeros and subnormals. Each case asserts that its kernel is an `ElementwiseView`
//! and that a wide kernel was generated for it, so the test cannot pass on Cranelift code.

// The CPU's 8-lane kernels (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::{Dom, data, tensor};
use kiln::{DType, HostBuffer, Tensor};
use kiln_backends::cpu::isa::Isa;
use kiln_jit::kernel::gemm::ElementwiseView;
use kiln_jit::kernel::{ScheduleOptions, schedule_with};

/// f32 data in [-2, 2) with specials sprinkled in (at positions that move with the seed).
fn special_f32(shape: &[usize], seed: u64) -> Tensor {
    special(DType::F32, shape, seed)
}

/// [`special_f32`]'s values stored as `dtype` (realized: a bf16 one is loaded as bf16 by the kernel that reads it).
fn special(dtype: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v = data(DType::F32, n, seed, Dom::Cont(-2.0, 2.0));
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0, 0.0, 1e-40, -3e-39];
    for (i, s) in specials.iter().enumerate() {
        let at = (seed as usize * 7 + i * 13) % n.max(1);
        if n > 2 * specials.len() {
            v[at] = *s;
        }
    }
    tensor(dtype, &v, shape)
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Realizes `out` on the CPU and compares every element with the interpreter's, bit for bit (any NaN matches any
/// NaN: the IR does not define payloads). Asserts the kernel that writes the output is one the wide path accepts
/// (a per-row operand computed from a broadcast may be its own kernel first).
fn check(name: &str, out: &Tensor) {
    let cap = kiln::capture(&[out]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions::default());
    let k = &plan.launches.last().expect("a launch").kernel.clone().without_unit_loops();
    assert!(ElementwiseView::of(k).is_some(), "{name}: not an elementwise view:\n{k}");
    let want = cap.reference().unwrap().remove(0);
    // Each width this host has, forced (the realize below runs the one the host picks): the same bits again.
    common::with_last_launch(name, out, ScheduleOptions::default(), |kernel, args, want| {
        for isa in Isa::ALL.into_iter().filter(|i| i.present()) {
            let got = kiln_backends::cpu::run_wide_at(kernel, isa, args)
                .unwrap_or_else(|e| panic!("{name}: {}: {e}", isa.name()));
            // bf16 values are generated at 16 lanes only (masked 2-byte loads and stores).
            if isa == Isa::Avx2 && touches_bf16(kernel) {
                assert!(got.is_none(), "{name}: an 8-lane kernel with bf16 values");
                continue;
            }
            let got = got.unwrap_or_else(|| panic!("{name}: no {}-lane kernel:\n{kernel}", isa.lanes()));
            same_bits(&format!("{name} at {} lanes", isa.lanes()), &got, want, kernel);
        }
    });
    // The build counter is process-wide and this file's tests run on parallel threads: one realize at a time, so
    // the count moves only for this one.
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = kiln::stats().wide_kernel_builds;
    let got = out.to_host().unwrap();
    assert!(kiln::stats().wide_kernel_builds > before, "{name}: no wide kernel was generated:\n{k}");
    drop(serial);
    same_bits(name, &got, &want, k);
}

/// Whether `k` has a bf16 value (an input, arithmetic in its outer or reduce code, its output).
fn touches_bf16(k: &kiln_jit::kernel::KernelIr) -> bool {
    let mut code = k.outer.iter().chain(k.reduce.iter().flat_map(|r| r.inner.iter()));
    k.output.dtype == DType::BF16
        || k.inputs.iter().any(|b| b.dtype == DType::BF16)
        || code.any(|i| i.dtype == DType::BF16)
}

/// On every host with AVX2: kernels with bf16 values, including a row sum whose bf16 loads are in its reduce code
/// (a gradient norm of bf16 gradients), are declined at 8 lanes (they need masked 2-byte loads), never generated
/// with 4-byte loads; the plan then runs them as the host allows and matches the interpreter. An AVX2-only host
/// once generated the row sum at 8 lanes (found by the bf16 GPT test on an AMD EPYC).
#[test]
fn bf16_kernels_are_declined_at_8_lanes() {
    if common::skip_without_avx2() {
        return;
    }
    let bf = DType::BF16;
    let (a, b) = (special(bf, &[37, 33], 71), special(bf, &[33], 72));
    let cases = [
        ("bf16 row sum of squares", a.to_dtype(DType::F32).square().sum(1, false)),
        ("bf16 times f32", &a.to_dtype(DType::F32) * &special_f32(&[37, 33], 73)),
        ("bf16 update", &a - &(&b * 0.01)),
    ];
    for (name, out) in &cases {
        common::with_last_launch(name, out, ScheduleOptions::default(), |kernel, args, _| {
            assert!(touches_bf16(kernel), "{name}: no bf16 value in\n{kernel}");
            let got =
                kiln_backends::cpu::run_wide_at(kernel, Isa::Avx2, args).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(got.is_none(), "{name}: an 8-lane kernel with bf16 values:\n{kernel}");
        });
        let want = kiln::capture(&[out]).unwrap().reference().unwrap().remove(0);
        let got = out.to_host().unwrap();
        common::compare(&got, &want, common::tol(out.dtype(), common::Kind::Accumulate))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// Asserts `got` equals `want` bit for bit (any NaN matches any NaN).
fn same_bits(name: &str, got: &HostBuffer, want: &HostBuffer, k: &kiln_jit::kernel::KernelIr) {
    if let (HostBuffer::BF16(g), HostBuffer::BF16(w)) = (got, want) {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{name}: element {i}: got {a} ({:#06x}), interpreter {b} ({:#06x})\n{k}",
                a.to_bits(),
                b.to_bits()
            );
        }
        return;
    }
    let (HostBuffer::F32(g), HostBuffer::F32(w)) = (got, want) else { panic!("{name}: not f32 or bf16") };
    assert_eq!(g.len(), w.len());
    for (i, (a, b)) in g.iter().zip(w).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{name}: element {i}: got {a:e} ({:#010x}), interpreter {b:e} ({:#010x})\n{k}",
            a.to_bits(),
            b.to_bits()
        );
    }
}

/// Every expression on one `[m, n]` (or `[n]` when `m` is `None`) shape: an SGD update with an outer product (per
/// row, per column and launch-uniform operands), arithmetic with constants, and a select over comparisons and
/// boolean logic.
fn all_expressions(m: Option<usize>, n: usize, seed: u64) {
    let shape: Vec<usize> = m.into_iter().chain([n]).collect();
    let name = format!("{shape:?}");
    let a = special_f32(&shape, seed);
    let b = special_f32(&shape, seed + 1);
    let row = special_f32(&[n], seed + 2);
    let col = match m {
        Some(m) => special_f32(&[m, 1], seed + 3),
        None => special_f32(&[1], seed + 3),
    };
    let lr = tensor(DType::F32, &[0.01], &[]);
    // The batch-1 weight update: w - (dy ⊗ x) * lr, with lr read from a buffer.
    check(&format!("{name} update"), &(&a - &(&(&row * &col) * &lr)));
    check(&format!("{name} arithmetic"), &(&(&(&(&a + &b) * 0.5) - &row) / &(&col.abs() + 1.0)));
    let mask = a.lt(&b).logical_and(a.eq(&row).logical_not()).logical_or(b.ne(&col));
    check(&format!("{name} select"), &mask.where_(a.sqrt(), b.neg()));
    // The same value used twice by one operation (one register for both operands).
    let s = &a - &row;
    check(&format!("{name} square"), &(&(&s * &s) - &b));
    // i32 operands (per element, per column, per row) compared for equality: the integer compare, 32-bit lanes.
    let small = |shape: &[usize], seed: u64| {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| ((i as u64 * 7 + seed * 3) % 4) as f64 - 1.0).collect();
        tensor(DType::I32, &v, shape)
    };
    let (ia, irow) = (small(&shape, seed), small(&[n], seed + 1));
    let icol = match m {
        Some(m) => small(&[m, 1], seed + 2),
        None => small(&[1], seed + 2),
    };
    let mask = ia.eq(&irow).logical_or(ia.ne(&icol).logical_and(irow.eq(&icol)));
    check(&format!("{name} int select"), &mask.where_(&a, &b));
}

#[test]
fn wide_kernels_match_the_interpreter_bit_for_bit() {
    if common::skip_without_avx2() {
        return;
    }
    for (i, n) in [2, 5, 8, 13, 16, 37, 100, 20003].into_iter().enumerate() {
        all_expressions(None, n, 10 * i as u64);
    }
    for (i, (m, n)) in
        [(2, 1), (3, 7), (4, 8), (5, 9), (37, 33), (64, 100), (200, 64), (256, 784)].into_iter().enumerate()
    {
        all_expressions(Some(m), n, 100 + 10 * i as u64);
    }
}

/// bf16 elementwise kernels (loads of 2-byte elements widened to f32, each bf16 result rounded in the program,
/// 2-byte stores), generated at 16 lanes only: bit for bit against the interpreter over the same edges as the f32
/// cases, with bf16 loads per element, per column, per row and uniform, a bf16 result that is a value uniform over
/// the launch, and casts both ways (f32 ties, overflow to infinity, NaN, subnormals rounded as PyTorch).
#[test]
fn wide_bf16_kernels_match_the_interpreter_bit_for_bit() {
    if common::skip_without_avx2() {
        return;
    }
    // The realize generates them only where AVX-512 is allowed: present, and not ruled out by `KILN_CPU_ISA=avx2`.
    if !kiln_backends::cpu::isa::allows(Isa::Avx512) {
        eprintln!(
            "note: AVX-512F absent or ruled out by KILN_CPU_ISA: bf16 elementwise kernels stay Cranelift's, nothing \
             generated to check"
        );
        return;
    }
    let bf = DType::BF16;
    for (i, shape) in
        [vec![5], vec![37], vec![20003], vec![3, 7], vec![4, 16], vec![37, 33], vec![256, 784]].into_iter().enumerate()
    {
        let seed = 1000 + 10 * i as u64;
        let name = format!("bf16 {shape:?}");
        let n = *shape.last().unwrap();
        let col_shape: Vec<usize> = if shape.len() == 2 { vec![shape[0], 1] } else { vec![1] };
        let (a, b) = (special(bf, &shape, seed), special(bf, &shape, seed + 1));
        let (row, col) = (special(bf, &[n], seed + 2), special(bf, &col_shape, seed + 3));
        let lr = tensor(bf, &[0.01], &[]);
        // The bf16 SGD step's update, every value bf16: w - (dy ⊗ x) * lr.
        check(&format!("{name} update"), &(&a - &(&(&row * &col) * &lr)));
        check(&format!("{name} arithmetic"), &(&(&(&(&a + &b) * 0.5) - &row) / &(&col.abs() + 1.0)));
        let mask = a.lt(&b).logical_and(a.eq(&row).logical_not()).logical_or(b.ne(&col));
        check(&format!("{name} select"), &mask.where_(a.sqrt(), b.neg()));
        // Widened to f32 (exact) and computed there; f32 rounded to bf16 (ties to even, overflow, NaN).
        check(&format!("{name} to f32"), &(&a.to_dtype(DType::F32) * 3.0));
        let x = &special_f32(&shape, seed + 4) * 1.0e38;
        check(&format!("{name} from f32"), &(&x + &special_f32(&shape, seed + 5)).to_dtype(bf));
        // Promotion: bf16 + f32 computes in f32.
        check(&format!("{name} bf16 + f32"), &(&a + &special_f32(&shape, seed + 6)));
        // A result uniform over the launch (a hoisted register, stored again for every row).
        check(&format!("{name} uniform"), &(&lr * 2.0).expand(shape.as_slice()));
    }
}

/// A view that starts inside a buffer: the output and the operands' rows start off the 32-byte grid by different
/// amounts, and operand rows are further apart than the output's (`ld` > n); a view with its rows reversed.
#[test]
fn wide_kernels_on_offset_and_strided_operands() {
    if common::skip_without_avx2() {
        return;
    }
    for (m, n, skip) in [(6, 16, 1), (9, 24, 3), (33, 40, 5), (3, 9, 2)] {
        let big = special_f32(&[m, n + skip + 2], m as u64);
        let a = big.slice(1, skip as isize, (skip + n) as isize, 1);
        let b = special_f32(&[m, n], 7 + m as u64);
        let row = special_f32(&[n], 9 + m as u64);
        check(&format!("[{m}, {n}] slice at {skip}"), &(&(&a * &row) + &b));
        // Rows read bottom-up: a negative row step.
        check(&format!("[{m}, {n}] rows flipped"), &(&b.flip([0]) - &(&a * 2.0)));
    }
}

/// Kernels of rank 3 and 4: merged to `[m, n]` where every operand allows it (contiguous, a bias over the last dim,
/// a value per row), batched where one does not (a row per batch element, a conv-style per-channel bias).
#[test]
fn wide_kernels_on_batched_shapes() {
    if common::skip_without_avx2() {
        return;
    }
    let full = special_f32(&[3, 5, 17], 1);
    check("[3, 5, 17] contiguous", &(&(&full * 3.0) - &special_f32(&[3, 5, 17], 2)));
    let x = special_f32(&[4, 6, 20], 3);
    check("[4, 6, 20] + bias [20]", &(&x + &special_f32(&[20], 4)));
    check("[4, 6, 20] * per-row [4, 6, 1]", &(&x * &special_f32(&[4, 6, 1], 5)));
    let y = special_f32(&[2, 3, 4, 9], 6);
    check("[2, 3, 4, 9] - per-batch row [2, 1, 1, 9]", &(&y - &special_f32(&[2, 1, 1, 9], 7)));
    let conv = special_f32(&[2, 3, 4, 5], 8);
    let bias = special_f32(&[1, 3, 1, 1], 9);
    let biased = &(&conv + &bias) / &(&bias.abs() + 0.5);
    // The shapes the loops were merged to.
    let shape_of = |t: &Tensor| {
        let cap = kiln::capture(&[t]).unwrap();
        let plan = schedule_with(&cap.graph, ScheduleOptions::default());
        let k = &plan.launches.last().unwrap().kernel;
        let listing = kiln_backends::cpu::wide_listing(k).unwrap().unwrap_or_else(|| panic!("not wide:\n{k}"));
        listing.lines().next().unwrap().split(',').next().unwrap().to_string()
    };
    assert_eq!(shape_of(&biased), "elementwise 2 x 3 x 20");
    check("[2, 3, 4, 5] conv bias [1, 3, 1, 1]", &biased);
    assert_eq!(shape_of(&(&x + &special_f32(&[20], 4))), "elementwise 24 x 20");
    assert_eq!(shape_of(&(&y - &special_f32(&[2, 1, 1, 9], 7))), "elementwise 2 x 12 x 9");
    assert_eq!(shape_of(&(&full * 3.0)), "elementwise 1 x 255");
    let big = special_f32(&[5, 40, 100], 10);
    check("[5, 40, 100] - per-batch row [5, 1, 100]", &(&big - &special_f32(&[5, 1, 100], 11)));
    // Rows of 2 under a loop of 40 (`wide::with_longest_rows`): the 40 become the rows, written 38 elements apart,
    // and the 2 a batch dim; with a per-row value of the new rows and one of the old.
    let t = special_f32(&[5, 2, 40, 19], 12).permute([0, 2, 1, 3]);
    let swapped = &(&t * 2.0) + &special_f32(&[1, 40, 1, 1], 13);
    assert_eq!(shape_of(&swapped), "elementwise 5 x 2 x 40 x 19");
    check("[5, 40, 2, 19] rows of 2 under 40", &swapped);
    check("[5, 40, 2, 19] a value per old row", &(&t - &special_f32(&[5, 40, 2, 1], 14)));
}

/// Zero pads along outer dims, summed: the masked loads' ranges each test one outer loop, so the kernel runs by
/// regions, each reading its one part unmasked (`kiln_jit::kernel::regions`), in f32 and through a cast to bf16 (a
/// bf16 model's q/k/v gradients put back into one tensor). Specials include -0.0, which the pads' +0 turns into +0.
#[test]
fn wide_kernels_run_padded_parts_by_regions() {
    if common::skip_without_avx2() {
        return;
    }
    let parts: Vec<Tensor> = (0..3).map(|i| special_f32(&[3, 5, 1, 2, 19], 20 + i)).collect();
    // bf16 kernels are generated only where AVX-512 is allowed (`wide_bf16_kernels_match_the_interpreter_bit_for_bit`).
    let bf16 = kiln_backends::cpu::isa::allows(Isa::Avx512);
    if !bf16 {
        eprintln!("note: AVX-512F absent or ruled out by KILN_CPU_ISA: the bf16 case is not generated, not checked");
    }
    for dtype in [DType::F32, DType::BF16].into_iter().filter(|&d| bf16 || d == DType::F32) {
        let pad = |p: &Tensor, before: usize| {
            p.to_dtype(dtype).pad(&[(0, 0), (0, 0), (before, 2 - before), (0, 0), (0, 0)], 0.0)
        };
        let z = pad(&parts[0], 2) + pad(&parts[1], 1) + pad(&parts[2], 0);
        check(&format!("{dtype} parts padded along an outer dim"), &z);
    }
    // The same with 20 positions above the pad's dim and rows of 2: the 20 become the rows (the pad's dim stays a
    // batch dim, a region per part).
    let long: Vec<Tensor> = (0..3).map(|i| special_f32(&[3, 20, 1, 2, 19], 40 + i)).collect();
    let pad = |p: &Tensor, before: usize| p.pad(&[(0, 0), (0, 0), (before, 2 - before), (0, 0), (0, 0)], 0.0);
    let z = pad(&long[0], 2) + pad(&long[1], 1) + pad(&long[2], 0);
    let plan = schedule_with(&kiln::capture(&[&z]).unwrap().graph, ScheduleOptions::default());
    let listing = kiln_backends::cpu::wide_listing(&plan.launches.last().unwrap().kernel).unwrap().unwrap();
    assert!(listing.starts_with("elementwise 3 x 3 x 2 x 20 x 19,"), "{listing}");
    assert!(listing.contains("cut into regions: row intervals from [0], 3 boxes, 3 variants"), "{listing}");
    check("parts padded along an outer dim, 20 rows", &z);
    // Parts read at different indices (one a slice of a wider tensor).
    let sliced = special_f32(&[3, 20, 1, 2, 25], 43).slice(4, 3, 22, 1);
    check("parts read at different indices", &(pad(&long[0], 2) + pad(&sliced, 1) + pad(&long[2], 0)));
    // A pad whose range leaves some batch positions with no load at all (a region of constants).
    let x = special_f32(&[3, 4, 1, 2, 21], 30);
    check("one part padded on both sides", &x.pad(&[(0, 0), (0, 0), (2, 3), (0, 0), (0, 0)], 0.0).mul(2.0));
}

/// Inputs across `exp`'s whole f32 domain: uniform over [-110, 95] (overflow past 88.72, subnormal results below
/// -87.3, zero below -103.9), the clamp bounds and the edges of those ranges exactly, and NaN, infinities, signed
/// zeros and subnormals.
fn exp_domain(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v = data(DType::F32, n, seed, Dom::Cont(-110.0, 95.0));
    let edges = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -1e-40,
        -104.0,
        89.0,
        88.72283,
        88.72284,
        -87.33655,
        -103.97208,
        -103.9721,
        1e-7,
        -1e-7,
    ];
    for (i, &e) in edges.iter().enumerate() {
        v[(seed as usize * 31 + i * 97) % n] = e;
    }
    tensor(DType::F32, &v, shape)
}

/// Inputs across `log`'s domain: positive values from the smallest subnormal to near f32::MAX (e^u for u uniform in
/// [-103, 88]), exact powers of two and 1, and zeros of both signs, negative values, NaN and infinities.
fn log_domain(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = data(DType::F64, n, seed, Dom::Cont(-103.0, 88.0)).iter().map(|u| u.exp()).collect();
    let edges = [
        0.0,
        -0.0,
        -1.0,
        -1e-30,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-45,
        f32::MIN_POSITIVE as f64,
        1.0,
        2.0,
        0.5,
        f32::MAX as f64,
        1.0000001,
        0.99999994,
    ];
    for (i, &e) in edges.iter().enumerate() {
        v[(seed as usize * 31 + i * 97) % n] = e;
    }
    tensor(DType::F32, &v, shape)
}

/// The transcendental programs of `transcendental_kernels_match_cranelift_bit_for_bit`, in order.
fn transcendental_cases() -> Vec<(&'static str, Tensor)> {
    let x = exp_domain(&[37, 301], 1);
    let col = special_f32(&[37, 1], 2);
    let small = &special_f32(&[37, 301], 3) * 40.0;
    vec![
        ("exp", x.exp()),
        ("sigmoid", x.sigmoid()),
        ("exp(x - per-row)", (&x - &col).exp()),
        ("recip", small.recip()),
        ("exp of a long row", exp_domain(&[20011], 4).exp()),
        // Both of tanh's branches (|x| below and above 0.625), its cap at 2|x| = 40, and the specials.
        ("tanh", (&exp_domain(&[37, 301], 5) * 0.1).tanh()),
        ("gelu (tanh)", kiln::nn::functional::gelu(&small, kiln::nn::functional::Approximate::Tanh)),
        ("log", log_domain(&[37, 301], 6).log()),
        ("softplus, log(e^x + 1)", (&(&x * 0.5).exp() + 1.0).log()),
    ]
}

/// Every element's bits, as hex words on one line per case (what the Cranelift child prints).
fn case_bits(t: &Tensor) -> Vec<u32> {
    match t.to_host().unwrap() {
        HostBuffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        other => panic!("not f32: {other:?}"),
    }
}

/// `exp`, `tanh`, `log` and `recip` (and so `sigmoid`, `gelu`, `softmax`'s exponent) in 8-lane kernels compute the same
/// sequence as the Cranelift kernels on a host with FMA (`clif_math`'s f32 functions with fused multiply-adds), so
/// the two agree bit for bit: the child process runs the same cases with `KILN_ELEMENTWISE=clif` (asserting that it generated no wide
/// kernel) and prints every element's bits. Against the interpreter (f64 `exp`, rounded once) the results stay
/// within the tolerance table's f32 `Elementwise` entry.
#[test]
fn transcendental_kernels_match_cranelift_bit_for_bit() {
    if common::skip_without_avx2() {
        return;
    }
    if std::env::var_os("KILN_WIDE_CHILD").is_some() {
        for (name, t) in transcendental_cases() {
            let words: Vec<String> = case_bits(&t).iter().map(|b| format!("{b:x}")).collect();
            println!("case {name}: {}", words.join(" "));
        }
        assert_eq!(kiln::stats().wide_kernel_builds, 0, "the Cranelift run generated wide kernels");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "transcendental_kernels_match_cranelift_bit_for_bit", "--nocapture", "--test-threads=1"])
        .env("KILN_WIDE_CHILD", "1")
        .env("KILN_ELEMENTWISE", "clif")
        .env("KILN_CACHE_DIR", "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // A line may start with libtest's "test ... " (its name line has no newline under --nocapture).
    let clif: Vec<Vec<u32>> = stdout
        .lines()
        .filter_map(|l| l.find("case ").and_then(|at| l[at..].split_once(": ")))
        .map(|(_, w)| w.split(' ').map(|h| u32::from_str_radix(h, 16).unwrap()).collect())
        .collect();
    let cases = transcendental_cases();
    assert_eq!(clif.len(), cases.len(), "child output lines: {}", stdout.lines().count());
    for ((name, t), want) in cases.iter().zip(&clif) {
        let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = kiln::stats().wide_kernel_builds;
        let got = case_bits(t);
        assert!(kiln::stats().wide_kernel_builds > before, "{name}: no wide kernel was generated");
        drop(serial);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let (gf, wf) = (f32::from_bits(g), f32::from_bits(w));
            assert!(
                g == w || gf.is_nan() && wf.is_nan(),
                "{name}: element {i}: wide {gf:e} ({g:#010x}), Cranelift {wf:e} ({w:#010x})"
            );
        }
        let cap = kiln::capture(&[t]).unwrap();
        let reference = cap.reference().unwrap().remove(0);
        let tol = common::tol(DType::F32, common::Kind::Elementwise);
        if let Err(e) =
            common::compare(&HostBuffer::F32(got.iter().map(|&b| f32::from_bits(b)).collect()), &reference, tol)
        {
            panic!("{name}: against the interpreter: {e}");
        }
    }
}

/// Sums of overlapping padded pieces along outer dims, put next to each other along another: the shape of causal
/// attention's q, k and v gradients when it runs by blocks of queries (k's and v's gradients a sum over the blocks
/// of each block's prefix of the positions, q's a concatenation of the blocks'). Every mask tests one outer loop,
/// so the kernel is cut into regions (`kiln_jit::kernel::regions`), each with only its live loads, the position
/// loop as the rows and split where the pieces end; bit for bit against the interpreter, in f32 and, where
/// AVX-512 is allowed, through a cast to bf16.
#[test]
fn wide_kernels_cut_sums_of_padded_pieces_into_regions() {
    if common::skip_without_avx2() {
        return;
    }
    let bf16 = kiln_backends::cpu::isa::allows(Isa::Avx512);
    for dtype in [DType::F32, DType::BF16].into_iter().filter(|&d| bf16 || d == DType::F32) {
        // [batch 2, positions 40, heads 2, 19]: 4 blocks of 10 positions.
        let piece = |len: usize, seed: u64| special_f32(&[2, len, 2, 19], seed).to_dtype(dtype);
        let prefix_sum = |seed: u64| {
            (1..=4)
                .map(|j| piece(10 * j, seed + j as u64).pad(&[(0, 0), (0, 0), (0, 40 - 10 * j), (0, 0)], 0.0))
                .reduce(|a, b| a + b)
                .unwrap()
        };
        let blocks: Vec<Tensor> = (0..4).map(|j| piece(10, 60 + j)).collect();
        let blocks: Vec<&Tensor> = blocks.iter().collect();
        let q = Tensor::cat(&blocks, 1);
        let parts = [q, prefix_sum(70), prefix_sum(80)];
        let parts: Vec<Tensor> = parts.iter().map(|p| p.unsqueeze(2)).collect();
        let parts: Vec<&Tensor> = parts.iter().collect();
        let z = Tensor::cat(&parts, 2);
        let plan = schedule_with(&kiln::capture(&[&z]).unwrap().graph, ScheduleOptions::default());
        let k = &plan.launches.last().unwrap().kernel;
        // The listing is the 8-lane kernel's, which a bf16 kernel has none of (`check` asserts one was generated).
        if dtype == DType::F32 {
            let listing = kiln_backends::cpu::wide_listing(k).unwrap().unwrap_or_else(|| panic!("none:\n{k}"));
            assert!(listing.contains("cut into regions: row intervals from [0, 10, 20, 30]"), "{listing}");
        }
        check(&format!("{dtype} sums of padded pieces, concatenated"), &z);
    }
    // Twenty pieces stacked along an outer dim (a recurrent layer's per-step gate gradients as one tensor): each
    // region adds its one piece to the other nineteen's fills, which fold into one constant (the region code would
    // otherwise carry a chain of 19 uniform values, past what the generated kernels hold).
    let steps: Vec<Tensor> = (0..20).map(|t| special_f32(&[1, 3, 37], 90 + t)).collect();
    let z = (0..20).map(|t| steps[t].pad(&[(0, 0), (0, 0), (t, 19 - t)], 0.0)).reduce(|a, b| a + b).unwrap();
    let plan = schedule_with(&kiln::capture(&[&z]).unwrap().graph, ScheduleOptions::default());
    let listing = kiln_backends::cpu::wide_listing(&plan.launches.last().unwrap().kernel).unwrap().unwrap();
    assert!(listing.contains("20 boxes, 20 variants"), "{listing}");
    check("twenty stacked pieces", &z);
}

/// The MXCSR register of this thread (x86's SSE/AVX control and status flags).
#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut v = 0u32;
    // SAFETY: `stmxcsr` writes the 4 bytes at the pointer, a local that lives across the instruction.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack)) };
    v
}

/// Sets this thread's MXCSR (its flag bits, here; the control bits are written back as they were read).
#[cfg(target_arch = "x86_64")]
fn set_mxcsr(v: u32) {
    // SAFETY: `ldmxcsr` reads the 4 bytes at the pointer; the value keeps every reserved bit as `stmxcsr` gave it.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, readonly)) };
}

/// `exp` below its lower clamp (a causal mask's -inf, scores past -104) is +0, and reaching it must not underflow:
/// x86 finishes an underflowing vector instruction in a microcode assist (~100 cycles), which made a softmax over
/// causally masked scores 5x slower at 16 lanes. Each width runs the kernel on this thread (a launch this small is
/// not split) between a clear and a read of MXCSR's underflow flag, which an instruction sets exactly when it
/// produced a tiny inexact result. Values are also compared with the interpreter. Subnormal results themselves
/// (-103.97 < x < -87.3) underflow, as they must, and are not in these inputs.
#[cfg(target_arch = "x86_64")]
#[test]
fn exp_below_its_clamp_does_not_underflow() {
    if common::skip_without_avx2() {
        return;
    }
    const UNDERFLOW: u32 = 1 << 4;
    const FLAGS: u32 = 0x3f;
    let n = 64;
    let mut v = data(DType::F32, 4 * n, 9, Dom::Cont(-3.0, 3.0));
    for r in 0..4 {
        for c in 0..n {
            if c > r * 16 + 7 {
                v[r * n + c] = [f64::NEG_INFINITY, -104.0, -1e30, -150.0][c % 4];
            }
        }
    }
    let x = tensor(DType::F32, &v, &[4, n]);
    let cases = [("exp", x.exp()), ("softmax", x.softmax(-1)), ("sigmoid of -x", x.neg().sigmoid())];
    for (name, out) in cases {
        common::with_last_launch(name, &out, ScheduleOptions::default(), |kernel, args, want| {
            for isa in Isa::ALL.into_iter().filter(|i| i.present()) {
                let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let saved = mxcsr();
                set_mxcsr(saved & !FLAGS);
                let got = kiln_backends::cpu::run_wide_at(kernel, isa, args);
                let flags = mxcsr();
                set_mxcsr(saved);
                let got = got
                    .unwrap_or_else(|e| panic!("{name}: {}: {e}", isa.name()))
                    .unwrap_or_else(|| panic!("{name}: {}: no kernel was generated", isa.name()));
                assert_eq!(flags & UNDERFLOW, 0, "{name} at {}: an instruction underflowed", isa.name());
                let tol = common::tol(DType::F32, common::Kind::Elementwise);
                if let Err(e) = common::compare(&got, want, tol) {
                    panic!("{name} at {}: against the interpreter: {e}", isa.name());
                }
            }
        });
    }
}
