//! Reductions to one value, on every device: a large one runs as a partial kernel over all cores and a kernel that
//! folds the partials (`jit/src/kernel/split.rs`), with adjacent reduce loops merged first where the indices allow.
//! Each case asserts how the plan ran it (split into how many parts, or one kernel) and compares with the reference
//! interpreter bit for bit: the data are small integers (sums exact in any order) or powers of two (products exact),
//! and max/min do not depend on the order; NaN and infinities sit in some of them.

mod test_cache;

mod common;

use common::{Tol, compare_on, tensor};
use kiln::DType;
// The split checks schedule CPU data (`large_reductions_...`).
#[cfg(feature = "cpu")]
use {
    common::{devices, runs_on},
    kiln::Tensor,
    kiln_jit::kernel::{KernelIr, ScheduleOptions, schedule_with},
};

/// `n` integers in -8..=8, with NaN and infinities at a few positions when `specials`.
fn ints(n: usize, seed: u64, specials: bool) -> Vec<f64> {
    let mut rng = common::Rng(seed);
    let mut v: Vec<f64> = (0..n).map(|_| (rng.next_u64() % 17) as f64 - 8.0).collect();
    if specials {
        v[n / 3] = f64::INFINITY;
        v[n / 2] = f64::NEG_INFINITY;
        v[n - 5] = f64::NAN;
    }
    v
}

#[cfg(feature = "cpu")]
/// The kernels the plan of `out` launches, as a backend is given them.
fn launches(out: &Tensor) -> Vec<KernelIr> {
    let cap = kiln::capture(&[out]).unwrap();
    schedule_with(&cap.graph, ScheduleOptions::default()).launches.into_iter().map(|l| l.kernel).collect()
}

#[cfg(feature = "cpu")]
/// Checks how `out` (a reduction to one value of `x`) is scheduled, `parts` partial results (`None`: one kernel),
/// then realizes it on every device `x`'s dtype lives on and compares with the interpreter bit for bit.
fn check(name: &str, x: &Tensor, out: impl Fn(&Tensor) -> Tensor, parts: Option<usize>) {
    let y = out(x);
    let ks = launches(&y);
    let last = ks.last().expect("a launch");
    assert_eq!(last.output.len, 1, "{name}: {last}");
    match parts {
        Some(p) => {
            let partial = &ks[ks.len() - 2];
            assert!(partial.name.ends_with(&format!("_part{p}")), "{name}: {partial}");
            assert_eq!((partial.out_extents.as_slice(), partial.output.len), (&[p][..], p), "{name}: {partial}");
            assert_eq!(last.reduce.as_ref().map(|r| r.extents.clone()), Some(vec![p]), "{name}: {last}");
            assert_eq!(last.inputs.last(), Some(&partial.output), "{name}: the fold reads the partials");
        }
        None => assert!(ks.iter().all(|k| !k.name.contains("_part")), "{name}: split, expected one kernel"),
    }
    let want = kiln::capture(&[&y]).unwrap().reference().unwrap().remove(0);
    for dev in devices() {
        if !runs_on(&dev, &[x.dtype(), y.dtype()]) {
            continue;
        }
        let got = out(&x.to_device(&dev).unwrap()).to_host().unwrap();
        if let Err(e) = compare_on(&dev, &got, &want, Tol::EXACT) {
            panic!("{name} on {dev}: {e}");
        }
    }
}

#[cfg(feature = "cpu")]
#[test]
fn large_reductions_to_one_value_split_and_match_the_interpreter() {
    let f32s =
        |shape: &[usize], seed, specials| tensor(DType::F32, &ints(shape.iter().product(), seed, specials), shape);
    let sum = |x: &Tensor| x.sum_all();
    // A training loss's shape: [1024, 10] merges into one loop of 10240, two parts.
    check("mse-sum 1024x10", &f32s(&[1024, 10], 1, false), |x| x.square().sum_all(), Some(2));
    // Merged 256 x 257: 16 parts of 4112.
    check("sum 256x257", &f32s(&[256, 257], 2, false), sum, Some(16));
    check("sum 256x257 with inf and NaN", &f32s(&[256, 257], 3, true), sum, Some(16));
    // A prime factor: 3 x 20011 merges into 60033 = 3 x 20011, three parts.
    check("sum 3x20011", &f32s(&[3, 20011], 4, false), sum, Some(3));
    // Large: parts of about 32768 elements (4M elements, 128 parts).
    check("sum 2048x2048", &f32s(&[2048, 2048], 14, false), sum, Some(128));
    for (name, f) in [("max", Tensor::max_all as fn(&Tensor) -> Tensor), ("min", Tensor::min_all)] {
        check(&format!("{name} 1031x64"), &f32s(&[1031, 64], 5, false), f, Some(16));
        check(&format!("{name} 1031x64 with inf and NaN"), &f32s(&[1031, 64], 6, true), f, Some(16));
    }
    // The mean's scale runs in the fold's outer code.
    check("mean 4096x33", &f32s(&[4096, 33], 7, false), |x| x.mean_all(), Some(16));
    // Products of powers of two are exact in any order: +-1 mostly, some 2 and 0.5, a few -1.
    let pows: Vec<f64> =
        ints(65536, 8, false).iter().map(|&v| [1.0, -1.0, 2.0, 0.5, 1.0, 1.0][(v + 8.0) as usize % 6]).collect();
    check("prod 65536", &tensor(DType::F32, &pows, &[65536]), |x| x.prod_all(), Some(16));
    // A transposed read cannot merge its loops: the first (1030 rows of the view) splits, 10 parts.
    check("sum of a transpose", &f32s(&[64, 1030], 9, false).t(), sum, Some(10));
    // Masked loads (padding) are not merged either; the split carries their bounds: 110 rows, two parts.
    check("sum of a padded view", &f32s(&[100, 100], 10, false).pad(&[(5, 5), (3, 7)], 0.0), sum, Some(2));
    // Integers (an i32 sum is an i64, which lives on the CPU only).
    check("i32 sum 300x300", &tensor(DType::I32, &ints(90000, 11, false), &[300, 300]), sum, Some(16));
    // Not split: no divisor (10007 is prime), and too few elements.
    check("sum of 10007 (prime)", &f32s(&[10007], 12, false), sum, None);
    check("sum 64x64 (small)", &f32s(&[64, 64], 13, false), sum, None);
}

/// Mesa's llvmpipe Vulkan driver stops every shader loop after 65535 trips and drops the invocation's stores (a
/// row sum over 70000 elements read 0.0 there, silently, when one invocation folded a whole row). A long reduction
/// is cooperative now (`render::cstyle::Coop`: 256 invocations stride over each row), so that row sum runs on every
/// adapter and matches the interpreter; a kernel whose loop still passes the cap on llvmpipe (the LU routine of a
/// 2048 x 2048 matrix: its column updates run n^2 / 64 trips per invocation) is refused with an error that says
/// why; on any other adapter it runs.
#[test]
fn a_reduce_loop_past_the_drivers_loop_cap_is_refused_not_wrong() {
    let Some(dev) = common::wgpu_device() else { return };
    let x = tensor(DType::F32, &ints(2 * 70000, 15, false), &[2, 70000]);
    let want = kiln::capture(&[&x.sum(1, false)]).unwrap().reference().unwrap().remove(0);
    let got = x.to_device(&dev).unwrap().sum(1, false).to_host().unwrap();
    compare_on(&dev, &got, &want, Tol::EXACT).unwrap();
    if dev.describe().contains("llvmpipe") {
        let n = 2048;
        let a: Vec<f32> = (0..n * n).map(|i| if i % (n + 1) == 0 { 4.0 } else { 0.0 }).collect();
        let a = kiln::Tensor::from_vec(a, [n, n], &dev).unwrap();
        let (lu, _) = kiln::linalg::lu_factor(&a);
        let e = lu.to_host().expect_err("llvmpipe cannot run a 65536-trip loop").to_string();
        assert!(e.contains("65536 trips") && e.contains("65535") && e.contains("Device::cpu()"), "{e}");
    }
}
