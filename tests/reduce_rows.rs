//! Reductions along a contiguous last axis, held to the reference interpreter on every row length from 1 to 70 and
//! a few long ones. Two CPU paths run them: an f32 sum as an 8-lane row-sum kernel (`backends/src/cpu/wide/`,
//! `RowSum`: groups of up to 4 vectors into their own accumulators, a masked last vector), and the rest (max, min,
//! and everything with `KILN_ELEMENTWISE=clif`) as Cranelift kernels vectorized along the reduce loop with four
//! accumulators (`jit/src/render/clif/loops.rs`, `reduce_loops_vec`). The same cases run in this process and, for
//! the Cranelift path, in a child process with `KILN_ELEMENTWISE=clif`, so that each accumulator, each loop and
//! each way of combining them is exercised on both.
//!
//! Column sums (`[rows, cols] -> [cols]`, a bias gradient) run the other way: a Cranelift kernel vectorized along
//! its output, strips of 8 vectors (32 columns) walking down the rows, then single vectors, then scalars
//! (`TileConfig::column_vecs`); every width from 1 to 70 reaches each of those loops.
//!
//! Exact comparisons, no tolerance: the data are small integers, so every partial sum is exact in f32 and every
//! summation order gives the same bits, and max/min do not depend on the order at all. NaN and infinities sit at
//! positions that move across the accumulators from row to row. Zeros are left out of the max/min rows: the sign
//! of a tie between -0 and +0 is the one thing an order could change there. A log-sum-exp (a row sum with `exp`
//! inside and `log` after) is held to the table's f32 accumulation tolerance.

// The CPU's row-reduction kernels (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::{Kind, Tol, compare, tensor, tol};
use kiln::{DType, Tensor};
use kiln_backends::cpu::isa::Isa;
use kiln_jit::kernel::{ScheduleOptions, schedule_with};

/// `[rows, len]` f32 integers in -8..=8 (without 0 when `zeros` is false), with NaN, +inf and -inf in some rows at
/// positions that differ per row.
fn rows(rows: usize, len: usize, seed: u64, zeros: bool) -> Tensor {
    let mut rng = common::Rng(seed);
    let mut v: Vec<f64> = (0..rows * len)
        .map(|_| {
            loop {
                let x = (rng.next_u64() % 17) as f64 - 8.0;
                if zeros || x != 0.0 {
                    break x;
                }
            }
        })
        .collect();
    for r in 0..rows {
        let at = |k: usize| r * len + (r * 5 + k * 7) % len;
        match r % 5 {
            1 => v[at(0)] = f64::NAN,
            2 => v[at(1)] = f64::INFINITY,
            3 => v[at(2)] = f64::NEG_INFINITY,
            4 if len > 1 => {
                v[r * len] = f64::INFINITY;
                v[r * len + len - 1] = f64::NEG_INFINITY;
            }
            _ => {}
        }
    }
    tensor(DType::F32, &v, &[rows, len])
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Whether this process runs f32 row sums as 8-lane kernels (AVX2 + FMA, and not `KILN_ELEMENTWISE=clif`).
fn wide_sums() -> bool {
    kiln_backends::cpu::gemm::asm::host_supported() && std::env::var("KILN_ELEMENTWISE").map_or(true, |v| v != "clif")
}

/// Realizes `out` on the CPU and compares it with the interpreter (bit for bit under `Tol::EXACT`). When the row is
/// long enough for a vector, asserts that the reduction is one Cranelift vectorizes along its reduce loop, and for a
/// sum where row sums are generated, that an 8-lane kernel was built (so the test checks that code, not a scalar
/// loop). `sum`: whether the kernel is a row sum (`None`: either way, as for a product summed over a row, which
/// the GEMM path may take instead).
fn check_with(name: &str, out: &Tensor, len: usize, sum: Option<bool>, tol: Tol) {
    let cap = kiln::capture(&[out]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions::default());
    let k = plan.launches.last().expect("a launch").kernel.clone().without_unit_loops();
    if len >= 4 {
        assert!(kiln_jit::render::clif::reduce_vectorizable(&k), "{name}: not vectorized along its reduce loop:\n{k}");
    }
    let want = cap.reference().unwrap().remove(0);
    // The build counter is process-wide and this file's tests run on parallel threads.
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = kiln::stats().wide_kernel_builds;
    let got = out.to_host().unwrap();
    let built = kiln::stats().wide_kernel_builds > before;
    drop(serial);
    // A reduction of one element is a copy, whichever kernel runs it.
    if let Some(sum) = sum
        && len > 1
    {
        assert_eq!(built, sum && wide_sums(), "{name}: an 8-lane row sum was built: {built}\n{k}");
    }
    if let Err(e) = compare(&got, &want, tol) {
        panic!("{name}: {e}\n{k}");
    }
}

fn check(name: &str, out: &Tensor, len: usize, sum: Option<bool>) {
    check_with(name, out, len, sum, Tol::EXACT)
}

/// Runs `test` in a child process with `KILN_ELEMENTWISE=clif` (Cranelift kernels only).
fn in_cranelift_child(test: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1"])
        .env("KILN_ELEMENTWISE", "clif")
        .env("KILN_CACHE_DIR", "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("1 passed"),
        "{test} with KILN_ELEMENTWISE=clif:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn row_sums_maxima_and_minima_of_every_length_with_cranelift_kernels() {
    if std::env::var("KILN_ELEMENTWISE").is_ok_and(|v| v == "clif") {
        return; // already the Cranelift run
    }
    in_cranelift_child("row_sums_maxima_and_minima_of_every_length");
    in_cranelift_child("column_sums_maxima_and_minima_of_every_width");
    in_cranelift_child("log_sum_exp_rows");
}

/// `log(sum(exp(x - max)))` per row, as `log_softmax` computes it: one reduce kernel with `exp` inside and `log`
/// after, a row sum in registers where row sums are generated.
#[test]
fn log_sum_exp_rows() {
    for (i, len) in [1, 7, 8, 15, 16, 17, 33, 100, 1000, 1027].into_iter().enumerate() {
        let x = &common::rand_f32(&[13, len], 7 + i as u64) * 4.0;
        let max = x.max([-1], true);
        {
            // First (the checked plan is then the reduce kernel alone), under the lock that keeps the other test's
            // build count to its own kernels.
            let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            kiln::realize(&[&x, &max]).unwrap();
        }
        let lse = (&x - &max).exp().sum([-1], false).log();
        check_with(&format!("log-sum-exp, len {len}"), &lse, len, Some(true), tol(DType::F32, Kind::Accumulate));
        let mean = (&x * 0.5).mean([-1], false);
        check_with(&format!("mean, len {len}"), &mean, len, Some(true), tol(DType::F32, Kind::Accumulate));
    }
}

#[test]
fn row_sums_maxima_and_minima_of_every_length() {
    let lens: Vec<usize> = (1..=70).chain([127, 128, 129, 1027]).collect();
    for (i, &len) in lens.iter().enumerate() {
        let seed = 100 + i as u64;
        let x = rows(11, len, seed, true);
        check(&format!("sum, len {len}"), &x.sum([-1], false), len, Some(true));
        let nz = rows(11, len, seed + 1000, false);
        check(&format!("max, len {len}"), &nz.max([-1], false), len, Some(false));
        check(&format!("min, len {len}"), &nz.min([-1], false), len, Some(false));
        // A weight that varies along the reduction only, and a per-row scale that does not vary along it: the
        // first must be loaded for every vector of a group, the second may be shared by all of them.
        let w = rows(1, len, seed + 2000, true).reshape([len]);
        let s = rows(11, 1, seed + 3000, false);
        check(&format!("weighted sum, len {len}"), &(&x * &w).sum([-1], false), len, None);
        check(&format!("scaled max, len {len}"), &(&nz * &s).max([-1], true), len, Some(false));
    }
}

/// Sums, maxima, minima and products summed down the columns of `[rows, cols]`, every width from 1 to 70 and a few
/// wide ones, against the interpreter, exactly: each column's rows are folded in order whichever kernel runs it. f32
/// sums (and means, and sums of bf16 values widened) are generated column-sum kernels where row sums are generated
/// (`backends/src/cpu/wide/cols.rs`: blocks of 8, 4, 2 and 1 vectors, a masked last vector, panels of 16 rows, so
/// 37 and 64 rows reach full and partial panels; 300 rows are shared out between the threads, two shares of 150 on
/// two, whose sums the launch adds: exact too, the data being small integers), each also forced at every width the
/// host has; max and min (and everything with `KILN_ELEMENTWISE=clif`) are Cranelift kernels vectorized along their
/// output.
#[test]
fn column_sums_maxima_and_minima_of_every_width() {
    let widths: Vec<usize> = (1..=70).chain([127, 128, 129, 300]).collect();
    for (i, &cols) in widths.iter().enumerate() {
        for n in [1, 5, 37, 64, 300] {
            let seed = 5000 + 10 * i as u64 + n as u64;
            let x = rows(n, cols, seed, true);
            let nz = rows(n, cols, seed + 1000, false);
            let y = rows(n, cols, seed + 2000, true);
            // A weight per column (read as the columns are) and a scale per row (broadcast per row).
            let w = rows(1, cols, seed + 3000, true).reshape([cols]);
            let sc = rows(n, 1, seed + 4000, false);
            let xb = x.to_dtype(DType::BF16);
            {
                let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                kiln::realize(&[&xb]).unwrap();
            }
            // `generated`: whether the plan runs a column-sum kernel (`None`: either way, as for a product with a
            // per-row scale, which is a GEMV the GEMM path may take).
            for (what, out, generated) in [
                ("sum", x.sum([0], false), Some(true)),
                ("max", nz.max([0], false), Some(false)),
                ("min", nz.min([0], false), Some(false)),
                ("product sum", (&x * &y).sum([0], false), Some(true)),
                ("mean", x.mean([0], false), Some(true)),
                ("bf16 sum", xb.to_dtype(DType::F32).sum([0], false), Some(true)),
                ("weighted sum", (&x * &w).sum([0], false), Some(true)),
                ("row-scaled sum", (&x * &sc).sum([0], false), None),
            ] {
                let name = format!("{what} over {n} rows, {cols} columns");
                let cap = kiln::capture(&[&out]).unwrap();
                let plan = schedule_with(&cap.graph, ScheduleOptions::default());
                let k = plan.launches.last().expect("a launch").kernel.clone().without_unit_loops();
                if n > 1 && cols >= 4 {
                    assert!(kiln_jit::render::clif::vectorizable(&k), "{name}: not vectorized:\n{k}");
                    assert!(!kiln_jit::render::clif::reduce_vectorizable(&k), "{name}: vectorized along rows:\n{k}");
                }
                // A reduction over one row is a copy, and one of a single column a full reduction, whichever kernel
                // runs them; bf16 loads need 16 lanes.
                let bf16 = what.starts_with("bf16");
                let generated = generated.map(|g| g && cols > 1);
                // Each width the host has, forced (before the realize below, which leaves nothing to launch).
                if generated != Some(false) && cols > 1 && n > 1 && wide_sums() {
                    common::with_last_launch(&name, &out, ScheduleOptions::default(), |kernel, args, want| {
                        for isa in Isa::ALL.into_iter().filter(|i| i.present() && (!bf16 || *i == Isa::Avx512)) {
                            let got = kiln_backends::cpu::run_wide_at(kernel, isa, args)
                                .unwrap_or_else(|e| panic!("{name}: {}: {e}", isa.name()))
                                .unwrap_or_else(|| panic!("{name}: no {}-lane kernel:\n{kernel}", isa.lanes()));
                            if let Err(e) = compare(&got, want, Tol::EXACT) {
                                panic!("{name} at {} lanes: {e}\n{kernel}", isa.lanes());
                            }
                        }
                    });
                }
                let want = cap.reference().unwrap().remove(0);
                // Under the lock: the other tests count the builds of their own kernels.
                let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let before = kiln::stats().wide_kernel_builds;
                let got = out.to_host().unwrap();
                let built = kiln::stats().wide_kernel_builds > before;
                drop(serial);
                if let Err(e) = compare(&got, &want, Tol::EXACT) {
                    panic!("{name}: {e}\n{k}");
                }
                if n > 1
                    && let Some(generated) = generated
                {
                    let expected = generated && wide_sums() && (!bf16 || wide_bf16());
                    assert_eq!(built, expected, "{name}: a column-sum kernel was built: {built}\n{k}");
                }
            }
        }
    }
}

/// Whether 16-lane kernels run here (bf16 loads are generated at 16 lanes only).
fn wide_bf16() -> bool {
    Isa::Avx512.present() && kiln_backends::cpu::isa::allows(Isa::Avx512)
}

/// A value uniform over the launch, summed per row (a lazy constant): the 8-lane kernel holds it in one register for
/// every row, and clearing a masked head's or tail's lanes in place cleared them for the rows after (rows of 100
/// ones summed to 100, then 52). Every row length with a tail, against the interpreter, exactly.
#[test]
fn row_sums_of_a_value_uniform_over_the_launch() {
    for len in (2..=70).chain([100, 127, 1027]) {
        let out = Tensor::full([11, len], 0.5, DType::F32, &kiln::Device::cpu()).sum([-1], false);
        let want = kiln::capture(&[&out]).unwrap().reference().unwrap().remove(0);
        let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = kiln::stats().wide_kernel_builds;
        let got = out.to_host().unwrap();
        let built = kiln::stats().wide_kernel_builds > before;
        drop(serial);
        assert_eq!(built, wide_sums(), "len {len}: an 8-lane row sum was built: {built}");
        if let Err(e) = compare(&got, &want, Tol::EXACT) {
            panic!("len {len}: {e}");
        }
    }
}
