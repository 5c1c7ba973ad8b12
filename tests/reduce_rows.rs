//! Reductions along a contiguous last axis, which the CPU backend vectorizes along the reduce loop with several
//! independent accumulators (groups of 4 vectors, then single vectors, then a scalar tail: see
//! `jit/src/render/clif/loops.rs`, `reduce_loops_vec`), held to the reference interpreter on every row length from 1
//! to 70 and a few long ones, so that each accumulator, each loop and each way of combining them is exercised.
//!
//! Exact comparisons, no tolerance: the data are small integers, so every partial sum is exact in f32 and every
//! summation order gives the same bits, and max/min do not depend on the order at all. NaN and infinities sit at
//! positions that move across the accumulators from row to row. Zeros are left out of the max/min rows: the sign
//! of a tie between -0 and +0 is the one thing an order could change there.

mod common;

use common::{Tol, compare, tensor};
use kiln::{DType, Tensor};
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

/// Realizes `out` on the CPU and compares it bit for bit with the interpreter. When the row is long enough for a
/// vector, asserts that the reduction is one the backend vectorizes along its reduce loop (so the test checks that
/// code, not a scalar loop).
fn check(name: &str, out: &Tensor, len: usize) {
    let cap = kiln::capture(&[out]).unwrap();
    let plan = schedule_with(&cap.graph, ScheduleOptions::default());
    let k = plan.launches.last().expect("a launch").kernel.clone().without_unit_loops();
    if len >= 4 {
        assert!(kiln_jit::render::clif::reduce_vectorizable(&k), "{name}: not vectorized along its reduce loop:\n{k}");
    }
    let want = cap.reference().unwrap().remove(0);
    let got = out.to_host().unwrap();
    if let Err(e) = compare(&got, &want, Tol::EXACT) {
        panic!("{name}: {e}\n{k}");
    }
}

#[test]
fn row_sums_maxima_and_minima_of_every_length() {
    let lens: Vec<usize> = (1..=70).chain([127, 128, 129, 1027]).collect();
    for (i, &len) in lens.iter().enumerate() {
        let seed = 100 + i as u64;
        let x = rows(11, len, seed, true);
        check(&format!("sum, len {len}"), &x.sum([-1], false), len);
        let nz = rows(11, len, seed + 1000, false);
        check(&format!("max, len {len}"), &nz.max([-1], false), len);
        check(&format!("min, len {len}"), &nz.min([-1], false), len);
        // A weight that varies along the reduction only, and a per-row scale that does not vary along it: the
        // first must be loaded for every vector of a group, the second may be shared by all of them.
        let w = rows(1, len, seed + 2000, true).reshape([len]);
        let s = rows(11, 1, seed + 3000, false);
        check(&format!("weighted sum, len {len}"), &(&x * &w).sum([-1], false), len);
        check(&format!("scaled max, len {len}"), &(&nz * &s).max([-1], true), len);
    }
}
