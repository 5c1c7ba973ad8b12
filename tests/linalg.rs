//! `kiln::linalg` on every device: each function against the reference interpreter (f32 and, where the device has
//! it, f64), against what PyTorch computed (`tests/fixtures/linalg_torch.py`: well-conditioned, ill-conditioned and
//! batched matrices), and the errors: a singular matrix or one that is not positive definite fails the realization
//! naming its batch index, on every device, and the device keeps working. Gradients by finite differences are in
//! `tests/gradcheck.rs` (`linear_algebra`).

mod test_cache;

mod common;

use common::*;
use kiln::linalg::{self, Fault};
use kiln::{DType, Device, Tensor};

/// Well-conditioned matrices of order `n` (`2 I + R / n`, R uniform in [-1, 1): condition number <= 3) with their
/// rows reversed, so partial pivoting swaps rows.
fn well_conditioned(dev: &Device, dtype: DType, batch: &[usize], n: usize, seed: u64) -> Tensor {
    conditioned(dev, dtype, batch, n, seed, true)
}

/// `well_conditioned`'s matrices, with their rows reversed or not: unreversed, each triangle is well-conditioned
/// too (its diagonal is about 2), where a reversed matrix's triangles have diagonals of about `1 / n`, whose
/// substitutions grow without bound (past f32's range by order 160).
fn conditioned(dev: &Device, dtype: DType, batch: &[usize], n: usize, seed: u64, reversed: bool) -> Tensor {
    let count: usize = batch.iter().product();
    let r = data(DType::F64, count * n * n, seed, Dom::Cont(-1.0, 1.0));
    let mut v = vec![0.0; count * n * n];
    for m in 0..count {
        for i in 0..n {
            for j in 0..n {
                let x = r[(m * n + i) * n + j] / n as f64 + if i == j { 2.0 } else { 0.0 };
                let row = if reversed { n - 1 - i } else { i };
                v[(m * n + row) * n + j] = x;
            }
        }
    }
    let shape: Vec<usize> = batch.iter().copied().chain([n, n]).collect();
    Tensor::from_host(buffer(dtype, &v), shape, dev).unwrap()
}

fn values_on(dev: &Device, dtype: DType, v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_host(buffer(dtype, v), shape.to_vec(), dev).unwrap()
}

/// Realizes `outs` on their device and compares each with the interpreter's values of the same graph.
fn check_against_interpreter(what: &str, dev: &Device, outs: &[Tensor], kind: Kind) {
    let refs: Vec<&Tensor> = outs.iter().collect();
    let want = kiln::capture(&refs).unwrap().reference().unwrap_or_else(|e| panic!("{what}: interpreter: {e}"));
    for (t, w) in outs.iter().zip(&want) {
        let got = t.to_host().unwrap_or_else(|e| panic!("{what} on {}: {e}", dev.describe()));
        let k = if t.dtype().is_float() { kind } else { Kind::Exact };
        if let Err(e) = compare_on(dev, &got, w, tol(t.dtype(), k)) {
            panic!("{what} ({} on {}): {e}", t.dtype(), dev.describe());
        }
    }
}

#[test]
fn every_function_matches_the_interpreter() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            // Orders 1 (no elimination), 5, 70 (more rows than a wgpu workgroup has invocations), 160 and 150 (the
            // CPU factors and solves them blocked, `backends/src/cpu/blocked.rs`: two of order 160, each on a thread
            // of its own, whose products then run inline on it; one of order 150, whose products run in column
            // strips over the pool's threads, its last block of rows and columns ragged).
            for (batch, n) in [(&[3usize][..], 1usize), (&[2, 3], 5), (&[1], 70), (&[2], 160), (&[1], 150)] {
                let a = well_conditioned(&dev, dtype, batch, n, 7 + n as u64);
                let mut shape_b = batch.to_vec();
                shape_b.extend([n, 3]);
                let b = values_on(
                    &dev,
                    dtype,
                    &data(DType::F64, shape_b.iter().product(), 11, Dom::Cont(-1.0, 1.0)),
                    &shape_b,
                );
                let what = format!("{batch:?} x {n}");
                let (lu, pivots) = linalg::lu_factor(&a);
                let (sign, logabsdet) = linalg::slogdet(&a);
                let vector = b.narrow(-1, 0, 1).squeeze(-1);
                // Symmetric positive definite, condition number <= 9.
                let spd = a.transpose(-1, -2).matmul(&a);
                let outs = [
                    lu,
                    pivots,
                    linalg::solve(&a, &b),
                    linalg::solve(&a, &vector),
                    linalg::inv(&a),
                    linalg::det(&a),
                    sign,
                    logabsdet,
                    linalg::cholesky(&spd),
                ];
                check_against_interpreter(&what, &dev, &outs, Kind::Factorize);
                let tri = conditioned(&dev, dtype, batch, n, 7 + n as u64, false);
                for upper in [false, true] {
                    for unit in [false, true] {
                        let left = linalg::solve_triangular(&tri, &b, upper, true, unit);
                        let right = linalg::solve_triangular(&tri, &b.transpose(-1, -2), upper, false, unit);
                        let what = format!("{what}: solve_triangular upper {upper} unit {unit}");
                        check_against_interpreter(&what, &dev, &[left, right], Kind::Factorize);
                    }
                }
            }
        }
    }
    // Every routine above (f32 and f64, orders 1 to 70, each triangular form) as CUDA C and HIP C, under CI.
    check_gpu_sources("linalg");
}

#[test]
fn solutions_solve_and_batches_broadcast() {
    for dev in devices() {
        let a = well_conditioned(&dev, DType::F32, &[2, 1], 4, 3);
        let b = values_on(&dev, DType::F32, &data(DType::F64, 3 * 4 * 2, 5, Dom::Cont(-1.0, 1.0)), &[3, 4, 2]);
        let x = linalg::solve(&a, &b);
        assert_eq!(x.dims(), &[2, 3, 4, 2]);
        // A X = B to f32 precision, and A inv(A) = I.
        check_tensor(&a.matmul(&x), &[2, 3, 4, 2], &b.expand([2usize, 3, 4, 2]).to_host().unwrap(), Kind::Factorize)
            .unwrap_or_else(|e| panic!("A X = B on {}: {e}", dev.describe()));
        let eye = Tensor::eye(4, DType::F32, &dev).expand([2usize, 1, 4, 4]).to_host().unwrap();
        check_tensor(&a.matmul(&linalg::inv(&a)), &[2, 1, 4, 4], &eye, Kind::Factorize)
            .unwrap_or_else(|e| panic!("A inv(A) = I on {}: {e}", dev.describe()));
    }
}

/// `[[1, 2, 3], [4, 5, 6], [7, 8, 9]]` is singular, but its LU's last pivot comes out near 1e-16 in f64 rather
/// than 0: the threshold makes it an error all the same. A matrix with a zero column is exactly singular at its
/// first pivot.
const NEAR: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
const EXACT: [f64; 9] = [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 5.0, 7.0];

fn fault_of(t: &Tensor) -> Fault {
    match t.to_host() {
        Ok(_) => panic!("realized a result of a singular matrix"),
        Err(e) => e.fault().unwrap_or_else(|| panic!("not a kernel fault: {e}")),
    }
}

#[test]
fn singular_matrices_are_errors_naming_the_batch_index() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |dev: &Device| format!("{dtype} on {}", dev.describe());
            for (singular, pivot) in [(NEAR, 2), (EXACT, 0)] {
                let good = [2.0, 1.0, 0.0, 1.0, 3.0, 1.0, 0.0, 1.0, 4.0];
                let v: Vec<f64> = good.iter().chain(&singular).chain(&good).copied().collect();
                let a = values_on(&dev, dtype, &v, &[3, 3, 3]);
                let b = values_on(&dev, dtype, &[1.0; 9], &[3, 3, 1]);
                let want = Fault::Singular { batch_index: 1, pivot };
                assert_eq!(fault_of(&linalg::solve(&a, &b)), want, "solve ({})", on(&dev));
                assert_eq!(fault_of(&linalg::inv(&a)), want, "inv ({})", on(&dev));
                assert_eq!(fault_of(&linalg::lu_factor(&a).0), want, "lu_factor ({})", on(&dev));
                let err = linalg::inv(&a).to_host().expect_err("an error").to_string();
                assert!(err.contains("batch index 1 is singular"), "{err}");
                // The determinant of a singular matrix is defined (0 exactly for a zero column).
                let det = vals(&linalg::det(&a));
                assert!(det.iter().all(|x| x.is_finite()), "det ({}): {det:?}", on(&dev));
                if singular == EXACT {
                    assert_eq!(det[1], 0.0, "det ({})", on(&dev));
                    let (sign, logabsdet) = linalg::slogdet(&a);
                    assert_eq!((vals(&sign)[1], vals(&logabsdet)[1]), (0.0, f64::NEG_INFINITY), "{}", on(&dev));
                }
                // A triangular solve fails on an exactly zero diagonal element only.
                let zero_diag = values_on(&dev, dtype, &[1.0, 0.0, 0.0, 5.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 3]);
                let rhs = values_on(&dev, dtype, &[1.0; 3], &[3, 1]);
                let t = linalg::solve_triangular(&zero_diag, &rhs, false, true, false);
                assert_eq!(fault_of(&t), Fault::Singular { batch_index: 0, pivot: 1 }, "{}", on(&dev));
                let unit = linalg::solve_triangular(&zero_diag, &rhs, false, true, true);
                assert_eq!(vals(&unit), vec![1.0, -4.0, 4.0], "{}", on(&dev));
                // The device keeps working, and the inputs are intact.
                assert_eq!(vals(&a), v, "{}", on(&dev));
                let ok = linalg::solve(&a.narrow(0, 0, 1), &b.narrow(0, 0, 1));
                check_against_interpreter("after a fault", &dev, &[ok], Kind::Factorize);
            }
        }
    }
}

#[test]
fn matrices_that_are_not_positive_definite_are_errors() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let spd = [4.0, 2.0, 0.0, 2.0, 5.0, 1.0, 0.0, 1.0, 3.0];
            // Leading minors 1, -3: fails at order 2. Then one with a zero first pivot.
            let indefinite = [1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0];
            let semidefinite = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
            for (bad, minor) in [(indefinite, 2), (semidefinite, 1)] {
                let v: Vec<f64> = spd.iter().chain(&spd).chain(&bad).copied().collect();
                let a = values_on(&dev, dtype, &v, &[3, 3, 3]);
                let want = Fault::NotPositiveDefinite { batch_index: 2, minor };
                assert_eq!(fault_of(&linalg::cholesky(&a)), want, "{dtype} on {}", dev.describe());
            }
            let l = linalg::cholesky(&values_on(&dev, dtype, &spd, &[3, 3]));
            check_against_interpreter("cholesky after a fault", &dev, &[l], Kind::Factorize);
        }
    }
}

#[test]
fn misuse_panics_at_the_call() {
    let Some(dev) = data_device() else { return };
    let rect = Tensor::zeros([2, 3], DType::F32, &dev);
    let msg = |f: &dyn Fn()| {
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("should panic");
        e.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    assert!(msg(&|| drop(linalg::inv(&rect))).contains("square"), "{}", msg(&|| drop(linalg::inv(&rect))));
    let ints = Tensor::zeros([2, 2], DType::I32, &dev);
    assert!(msg(&|| drop(linalg::det(&ints))).contains("f32 and f64"));
    let a = Tensor::eye(3, DType::F32, &dev);
    let b = Tensor::zeros([4, 1], DType::F32, &dev);
    assert!(msg(&|| drop(linalg::solve(&a, &b))).contains("does not fit"));
}

/// What `torch.linalg` computed in f64 (`tests/fixtures/linalg_torch.py`), held to a bound from each case's
/// condition number: a backward-stable solve in precision eps errs by about `n * cond * eps` in norm (its input
/// rounded to f32 is one more such error), so each result must lie within `8 n cond eps * max |want|` of PyTorch's
/// in every element. Cholesky's input `a^T a + I` has a squared condition number: it is compared where that bound
/// stays below 1e-3, and a case whose own bound does (hilbert6 in f32: 8 * 6 * 1.5e7 * 1.2e-7 = 86) is f64 only.
#[test]
fn linalg_matches_pytorch() {
    let Some(host) = data_device() else { return };
    // In f64 where the data device holds it; a build with only the wgpu device checks f32 against the values
    // rounded to f32 (far inside the f32 bound).
    let file = if host.supports(DType::F64) { "linalg_torch.safetensors" } else { "linalg_torch_f32.safetensors" };
    let Some(fixture) = Fixture::load(file) else { return };
    let get = |name: &str| fixture.get(name);
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let eps = if dtype == DType::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
            for case in ["well", "batched", "hilbert3", "hilbert6"] {
                let on = |t: Tensor| t.to_dtype(dtype).to_device(&dev).unwrap();
                let (a, b, spd) =
                    (on(get(&format!("{case}_a"))), on(get(&format!("{case}_b"))), on(get(&format!("{case}_spd"))));
                let n = a.dims()[a.rank() - 1] as f64;
                let cond = vals(&get(&format!("{case}_cond"))).into_iter().fold(0.0, f64::max);
                let bound = 8.0 * n * cond * eps;
                if bound > 1e-3 {
                    continue;
                }
                // Within `bound` times the largest magnitude of the result (`normwise`), or within `bound`.
                let compare = |what: &str, got: &Tensor, bound: f64, normwise: bool| {
                    let want = get(&format!("{case}_{what}"));
                    assert_eq!(got.dims(), want.dims(), "{case} {what}: shape");
                    let scale = if normwise { vals(&want).iter().fold(0.0f64, |m, x| m.max(x.abs())) } else { 1.0 };
                    let t = if want.dtype().is_float() { Tol { rel: 0.0, abs: bound * scale } } else { Tol::EXACT };
                    let got = got.to_device(&host).unwrap().to_dtype(want.dtype()).to_host().unwrap();
                    if let Err(e) = compare(&got, &want.to_host().unwrap(), t) {
                        panic!("{case} {what} ({dtype} on {}): {e}", dev.describe());
                    }
                };
                let (lu, pivots) = linalg::lu_factor(&a);
                let (sign, logabsdet) = linalg::slogdet(&a);
                compare("solve", &linalg::solve(&a, &b), bound, true);
                compare("inv", &linalg::inv(&a), bound, true);
                compare("det", &linalg::det(&a), bound, true);
                compare("sign", &sign, 0.0, false);
                // log |det| to an absolute error of det's relative one.
                compare("logabsdet", &logabsdet, bound, false);
                compare("lu", &lu, bound, true);
                compare("pivots", &pivots, 0.0, false);
                compare("solve_upper", &linalg::solve_triangular(&a.triu(0), &b, true, true, false), bound, true);
                let spd_bound = 8.0 * n * (cond * cond + 1.0) * eps;
                if spd_bound <= 1e-3 {
                    compare("cholesky", &linalg::cholesky(&spd), spd_bound, true);
                }
            }
        }
    }
}
