//! `sort`, `argsort`, `topk`, `cumsum` and `cumprod` on every device: against a plain-Rust reference (a stable sort
//! with NaN above every number; running sums and products in f64), and against values PyTorch 2.15 printed for the
//! subtle cases (NaN and ties in both directions, f16 and bf16 running sums over both of kiln's scan forms). Their
//! gradients are in `tests/gradcheck.rs`.

mod test_cache;

mod common;

use common::*;
use kiln::{DType, Device, Tensor};

use DType::{BF16, F16, F32, F64, I32, I64, U8};

/// Ascending or descending stable order of `v` with NaN above every number: the indices.
fn reference_order(v: &[f64], descending: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let key = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    let rank = |x: f64| (x.is_nan(), key(x));
    idx.sort_by(|&a, &b| {
        let (ra, rb) = (rank(v[a]), rank(v[b]));
        let o = ra.partial_cmp(&rb).expect("no NaN keys");
        if descending { o.reverse() } else { o }
    });
    idx
}

fn up(d: DType, v: &[f64], shape: &[usize], dev: &Device) -> Tensor {
    tensor(d, v, shape).to_device(dev).expect("upload")
}

/// Checks `x` (`rows x n`, values `v` row-major) sorted along its rows in both directions against the reference
/// (indices, values, the index dtype), and `t.topk(k, 0, largest)` against the first `k` of each column's order,
/// where `columns[c]` lists column `c` of `t` (2-d).
#[allow(clippy::too_many_arguments)]
fn check_sorts(
    dev: &Device,
    d: DType,
    x: &Tensor,
    v: &[f64],
    (rows, n): (usize, usize),
    t: &Tensor,
    columns: &[Vec<f64>],
    (k, largest): (usize, bool),
    failures: &mut Vec<String>,
) {
    for descending in [false, true] {
        let (values, indices) = x.sort(-1, descending);
        let (got_i, got_v) = (values_of(&indices), values_of(&values));
        for row in 0..rows {
            let slice = &v[row * n..(row + 1) * n];
            let want = reference_order(slice, descending);
            let gi: Vec<usize> = got_i[row * n..(row + 1) * n].iter().map(|&i| i as usize).collect();
            if let Some(at) = (0..n).find(|&i| gi[i] != want[i]) {
                failures.push(format!(
                    "[{dev}] {d} sort desc={descending} row {row}: position {at} holds {} want {}",
                    gi[at], want[at]
                ));
            }
            let same = got_v[row * n..(row + 1) * n]
                .iter()
                .zip(want.iter().map(|&i| slice[i]))
                .all(|(&a, b)| a == b || a.is_nan() && b.is_nan());
            if !same {
                failures.push(format!("[{dev}] {d} sorted values desc={descending} row {row}"));
            }
        }
        if indices.dtype() != if dev.supports(I64) { I64 } else { I32 } {
            failures.push(format!("[{dev}] {d} indices are {}", indices.dtype()));
        }
    }
    let (tv, ti) = t.topk(k, 0, largest);
    let (tv, ti) = (values_of(&tv), values_of(&ti));
    let cols = columns.len();
    for (col, column) in columns.iter().enumerate() {
        let want = reference_order(column, largest);
        for i in 0..k {
            let (gi, gv) = (ti[i * cols + col] as usize, tv[i * cols + col]);
            let wv = column[want[i]];
            if gi != want[i] || !(gv == wv || gv.is_nan() && wv.is_nan()) {
                failures.push(format!("[{dev}] {d} topk col {col} #{i}: ({gi}, {gv}) want ({}, {wv})", want[i]));
            }
        }
    }
}

#[test]
fn sort_argsort_and_topk_match_a_stable_reference_on_every_device() {
    let mut failures = Vec::new();
    for dev in devices() {
        for d in [F32, F16, BF16, F64, I32, I64, U8] {
            if !runs_on(&dev, &[d]) {
                continue;
            }
            // Rows of 3 x 37 small integers: many ties.
            let (rows, n) = (3, 37);
            let mut r = Rng(d as u64 + 11);
            let mut v: Vec<f64> = (0..rows * n).map(|_| (r.next_u64() % 9) as f64).collect();
            if d.is_float() {
                v[5] = f64::NAN;
                v[40] = f64::NAN;
                v[41] = f64::NEG_INFINITY;
                v[80] = -0.5;
            }
            let x = up(d, &v, &[rows, n], &dev);
            // topk along dim 0: columns of `rows`.
            let columns: Vec<Vec<f64>> = (0..n).map(|c| (0..rows).map(|r| v[r * n + c]).collect()).collect();
            check_sorts(&dev, d, &x, &v, (rows, n), &x, &columns, (2, true), &mut failures);
        }
    }
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

/// Rows past `BITONIC_MIN` (on the devices without the row sort routine: through the bitonic network, padded to a
/// power of two; on the CPU through the routine, as every row): the same checks, along the last dim and along dim 0
/// of the transpose (`topk` over columns of 2100).
#[test]
fn long_rows_sort_like_the_reference_on_every_device() {
    let mut failures = Vec::new();
    // Past the network's threshold (`BITONIC_MIN`, 2048, in src/ops/sorting.rs); 4096 slots, 78 stages.
    let (rows, n) = (2, 2100);
    for dev in devices() {
        for d in [F32, I32] {
            if !runs_on(&dev, &[d]) {
                continue;
            }
            // Small integers: long runs of ties, which only the index order separates.
            let mut r = Rng(d as u64 + 29);
            let mut v: Vec<f64> = (0..rows * n).map(|_| (r.next_u64() % 97) as f64 - 40.0).collect();
            if d.is_float() {
                for i in [7, 300, n + 11] {
                    v[i] = f64::NAN;
                }
                v[n + 12] = f64::NEG_INFINITY;
                v[n - 1] = f64::INFINITY;
            }
            let x = up(d, &v, &[rows, n], &dev);
            let columns: Vec<Vec<f64>> = v.chunks(n).map(<[f64]>::to_vec).collect();
            check_sorts(&dev, d, &x, &v, (rows, n), &x.t(), &columns, (5, false), &mut failures);
        }
    }
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

/// The gradient of the sorted values of a long row reaches each element at its place: `d/dx sum(sort(x) * w)` is
/// `w[place(i)]` at element `i` (the values are a gather by the sort's indices, whichever form computed them).
#[test]
fn long_row_sort_gradient_follows_the_sort_order_on_every_device() {
    let n = 2100;
    let mut r = Rng(5);
    let v: Vec<f64> = (0..n).map(|_| (r.next_u64() % 1_000_000) as f64 / 8.0 - 60_000.0).collect();
    let w: Vec<f64> = (0..n).map(|i| (i % 13) as f64 - 6.0).collect();
    for dev in devices() {
        let x = up(F32, &v, &[1, n], &dev).requires_grad();
        let (values, indices) = x.sort(-1, true);
        let loss = values.mul(up(F32, &w, &[1, n], &dev)).sum_all();
        let grads = loss.backward().expect("backward");
        let g = values_of(grads.get(&x).expect("gradient"));
        let order = values_of(&indices);
        for (p, &i) in order.iter().enumerate() {
            assert_eq!(g[i as usize], w[p], "[{dev}] element {i} at place {p}");
        }
    }
}

/// On the CPU a sort is one row sort routine (`Op::SortRows`, `kernel::sort`) over the sorted dim moved last, for
/// short and long rows, which compares every dtype exactly: i64 values 1 apart past 2^53 (one f64 apart would be
/// none), `-0` tied with `+0` in index order, bool, and empty dims.
#[cfg(feature = "cpu")]
#[test]
fn the_cpu_sorts_rows_with_its_routine_exactly_in_every_dtype() {
    let dev = Device::cpu();
    let x = Tensor::from_vec(vec![5i64, 1, 4, 3, 2, 0], [2, 3], &dev).expect("upload");
    let order = x.argsort(0, false);
    let cap = kiln::capture(&[&order]).expect("capture");
    let sorts =
        cap.graph.topo_order().into_iter().filter(|&n| matches!(cap.graph.node(n).op, kiln_jit::Op::SortRows { .. }));
    assert_eq!(sorts.count(), 1, "one row sort, over the dim moved last");
    assert_eq!(values_of(&order), [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);

    let big = 1i64 << 60;
    let x = Tensor::from_vec(vec![big + 1, big, -big - 1, -big, i64::MAX, i64::MIN], [6], &dev).expect("upload");
    assert_eq!(values_of(&x.argsort(0, false)), [5.0, 2.0, 3.0, 1.0, 0.0, 4.0]);
    assert_eq!(values_of(&x.argsort(0, true)), [4.0, 0.0, 1.0, 3.0, 2.0, 5.0]);

    let z = Tensor::from_vec(vec![0.0f32, -0.0, 1.0, -0.0, f32::NAN, 0.0], [6], &dev).expect("upload");
    assert_eq!(values_of(&z.argsort(0, false)), [0.0, 1.0, 3.0, 5.0, 2.0, 4.0]);
    assert_eq!(values_of(&z.argsort(0, true)), [4.0, 2.0, 0.0, 1.0, 3.0, 5.0]);

    let b = Tensor::from_vec(vec![true, false, true, false], [4], &dev).expect("upload");
    assert_eq!(values_of(&b.argsort(0, true)), [0.0, 2.0, 1.0, 3.0]);

    for shape in [[0usize, 4], [3, 0]] {
        let e = Tensor::zeros(shape, F32, &dev);
        let (v, i) = e.sort(-1, false);
        assert_eq!((v.dims(), i.dims(), i.dtype()), (&shape[..], &shape[..], I64));
        assert!(values_of(&i).is_empty());
    }
}

/// `topk` on the CPU selects through a threshold filter (f32 compared as floats, other dtypes through their keys), a
/// path of its own beside the sort's radix sort: over long rows with NaNs, signed zeros and runs of ties, its indices
/// are the stable sort's first k in both directions, for k from 1 to all but one.
#[cfg(feature = "cpu")]
#[test]
fn the_cpu_topk_keeps_the_stable_sorts_first_k() {
    let dev = Device::cpu();
    let (rows, n) = (3, 3000);
    let mut r = Rng(17);
    let v: Vec<f64> = (0..rows * n)
        .map(|i| match r.next_u64() % 50 {
            0 => f64::NAN,
            1 => -0.0,
            2 => 0.0,
            3 => f64::NEG_INFINITY,
            // Few distinct values, rising along the row in the last row (every key a candidate, descending).
            _ if i >= 2 * n => (i % n) as f64 / 4.0,
            k => (k % 9) as f64 - 4.0,
        })
        .collect();
    for d in [F32, F16, I32] {
        let x = up(d, &v, &[rows, n], &dev);
        for descending in [true, false] {
            let order = values_of(&x.argsort(-1, descending));
            for k in [1, 2, 50, 64, 65, 700, n - 1] {
                let (_, top) = x.topk(k, -1, descending);
                let want: Vec<f64> = order.chunks(n).flat_map(|row| row[..k].to_vec()).collect();
                assert_eq!(values_of(&top), want, "{d}, descending {descending}, k {k}");
            }
        }
    }
}

/// The values of a tensor as f64, through the host.
fn values_of(t: &Tensor) -> Vec<f64> {
    values(&t.to_host().expect("download"))
}

#[test]
fn sort_and_topk_match_pytorch_on_nan_and_ties() {
    let x = [3.0, f64::NAN, 1.0, 3.0, f64::NEG_INFINITY, f64::NAN, 0.0];
    for dev in devices() {
        let t = up(F32, &x, &[7], &dev);
        // torch.sort(x, stable=True) and descending=True.
        let (v, i) = t.sort(0, false);
        assert_eq!(values_of(&i), [4.0, 6.0, 2.0, 0.0, 3.0, 1.0, 5.0], "[{dev}]");
        assert_eq!(values_of(&v)[..5], [f64::NEG_INFINITY, 0.0, 1.0, 3.0, 3.0], "[{dev}]");
        let (v, i) = t.sort(0, true);
        assert_eq!(values_of(&i), [1.0, 5.0, 0.0, 3.0, 2.0, 6.0, 4.0], "[{dev}]");
        assert_eq!(values_of(&v)[2..], [3.0, 3.0, 1.0, 0.0, f64::NEG_INFINITY], "[{dev}]");
        // torch.topk([1, 3, 3, 2, 3], 2) gives values [3, 3] (indices [2, 4] in 2.15: PyTorch leaves the order of
        // ties unspecified; kiln takes the lower index first) and, smallest, [1, 2] at [0, 3].
        let t = up(F32, &[1.0, 3.0, 3.0, 2.0, 3.0], &[5], &dev);
        let (v, i) = t.topk(2, 0, true);
        assert_eq!((values_of(&v), values_of(&i)), (vec![3.0, 3.0], vec![1.0, 2.0]), "[{dev}]");
        let (v, i) = t.topk(2, 0, false);
        assert_eq!((values_of(&v), values_of(&i)), (vec![1.0, 2.0], vec![0.0, 3.0]), "[{dev}]");
    }
}

#[test]
fn cumsum_and_cumprod_match_the_reference_on_every_device() {
    let mut failures = Vec::new();
    for dev in devices() {
        for d in [F32, F64, I32, I64, U8] {
            if !runs_on(&dev, &[d]) {
                continue;
            }
            // Rows short enough for the fused scan and long enough for the doubling one.
            for n in [5usize, 300, 1500] {
                let mut r = Rng(n as u64 + d as u64);
                let v: Vec<f64> =
                    (0..2 * n).map(|_| (r.next_u64() % 7) as f64 - if d == U8 { 0.0 } else { 3.0 }).collect();
                let x = up(d, &v, &[2, n], &dev);
                let got = values_of(&x.cumsum(1));
                let want: Vec<f64> = (0..2)
                    .flat_map(|row| {
                        let mut acc = 0.0;
                        v[row * n..(row + 1) * n]
                            .iter()
                            .map(move |&a| {
                                acc += a;
                                acc
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                // Small integers: every sum is exact in f32 and f64.
                if got != want {
                    failures.push(format!("[{dev}] {d} cumsum n={n}"));
                }
                let want_dtype = if d.is_float() {
                    d
                } else if dev.supports(I64) {
                    I64
                } else {
                    I32
                };
                if x.cumsum(1).dtype() != want_dtype {
                    failures.push(format!("[{dev}] {d} cumsum gives {}", x.cumsum(1).dtype()));
                }
            }
            if d.is_float() {
                let x = up(d, &[1.5, -2.0, 0.5, 4.0], &[4], &dev);
                // torch.tensor([1.5, -2., 0.5, 4.]).cumprod(0)
                if values_of(&x.cumprod(0)) != [1.5, -3.0, -1.5, -6.0] {
                    failures.push(format!("[{dev}] {d} cumprod"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

#[test]
fn half_precision_running_sums_match_pytorch() {
    // (torch.arange(1, n + 1) * 0.01).to(dtype).cumsum(0) at [0, 9, 99, 599, n - 1], PyTorch 2.15 on the CPU: f32
    // accumulation, each output rounded once. n = 1000 is one fused scan, 1200 the doubling form.
    let cases: [(DType, usize, [f64; 5]); 4] = [
        (F16, 1000, [0.01000213623046875, 0.5498046875, 50.5, 1803.0, 5004.0]),
        (F16, 1200, [0.01000213623046875, 0.5498046875, 50.5, 1803.0, 7208.0]),
        (BF16, 1000, [0.010009765625, 0.55078125, 50.5, 1800.0, 4992.0]),
        (BF16, 1200, [0.010009765625, 0.55078125, 50.5, 1800.0, 7200.0]),
    ];
    for dev in devices() {
        for (d, n, want) in cases {
            if !runs_on(&dev, &[d]) {
                continue;
            }
            let x: Vec<f64> = (1..=n).map(|k| k as f64 * 0.01).collect();
            let c = values_of(&up(d, &x, &[n], &dev).cumsum(0));
            let got = [c[0], c[9], c[99], c[599], c[n - 1]];
            assert_eq!(got, want, "[{dev}] {d} n = {n}");
        }
    }
}
