//! Indexing by data on every device: `gather`, `index_select`, `take_along_dim`, `masked_fill`, `embedding`
//! against a plain-Rust reference (bit-exact: they move values), `scatter_add` / `index_add` against values PyTorch
//! gives (and the same bits on every run, repeated indices included), out-of-range indices as errors that name the
//! index and leave the inputs and the plan cache usable, and a gather fusing with what reads it.

mod test_cache;

mod common;

use common::*;
use kiln::{DType, Device, Tensor};

use DType::{BF16, Bool, F16, F32, F64, I32, I64, U8};

/// Every data dtype the reads are checked in.
const DATA: [DType; 8] = [F32, F16, BF16, F64, I32, I64, U8, Bool];

/// `n` indices in `0..bound`, deterministic in `seed`.
fn indices(n: usize, bound: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n).map(|_| (r.next_u64() % bound as u64) as f64).collect()
}

/// Values of `dtype` (small integers, exact in every dtype; 0/1 for bool).
fn values_of(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n).map(|_| if dtype == Bool { (r.next_u64() % 2) as f64 } else { (r.next_u64() % 50) as f64 }).collect()
}

/// Runs `body` for every device and (data, index) dtype pair the device holds; collects failures.
fn each_case(mut body: impl FnMut(&Device, DType, DType) -> Result<(), String>) {
    let mut failures = Vec::new();
    for dev in devices() {
        for d in DATA {
            for ix in [I32, I64] {
                if !runs_on(&dev, &[d, ix]) {
                    continue;
                }
                if let Err(e) = body(&dev, d, ix) {
                    failures.push(format!("[{dev}] {d} data, {ix} indices: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

#[test]
fn gather_reads_along_every_dim_as_the_reference() {
    each_case(|dev, d, ix| {
        let shape = [3usize, 4, 5];
        let x = Nd::new(&shape, values_of(d, 60, 1));
        let xt = tensor(d, &x.v, &shape).to_device(dev).map_err(|e| e.to_string())?;
        for dim in 0..3 {
            // An index smaller than the input in the other dims (the input is narrowed), larger along `dim`.
            let mut ishape = vec![2usize, 3, 4];
            ishape[dim] = 6;
            let n: usize = ishape.iter().product();
            let idx = Nd::new(&ishape, indices(n, shape[dim], 7 + dim as u64));
            let it = tensor(ix, &idx.v, &ishape).to_device(dev).map_err(|e| e.to_string())?;
            let want = Nd::from_fn(&ishape, |j| {
                let mut at = j.to_vec();
                at[dim] = idx.at(j) as usize;
                x.at(&at)
            });
            check_tensor(&xt.gather(dim as isize, &it), &ishape, &buffer(d, &want.v), Kind::Exact)
                .map_err(|e| format!("gather dim {dim}: {e}"))?;
            // Negative dims count from the end.
            check_tensor(&xt.gather(dim as isize - 3, &it), &ishape, &buffer(d, &want.v), Kind::Exact)
                .map_err(|e| format!("gather dim {}: {e}", dim as isize - 3))?;
        }
        Ok(())
    });
}

#[test]
fn index_select_take_along_dim_and_masked_fill_match_the_reference() {
    each_case(|dev, d, ix| {
        let up = |t: Tensor| t.to_device(dev).map_err(|e| e.to_string());
        let shape = [4usize, 3];
        let x = Nd::new(&shape, values_of(d, 12, 2));
        let xt = up(tensor(d, &x.v, &shape))?;
        // index_select along each dim, with a repeated index.
        for (dim, sel) in [(0usize, vec![3.0, 0.0, 3.0]), (1, vec![2.0, 2.0, 1.0, 0.0, 1.0])] {
            let st = up(tensor(ix, &sel, &[sel.len()]))?;
            let mut oshape = shape.to_vec();
            oshape[dim] = sel.len();
            let want = Nd::from_fn(&oshape, |j| {
                let mut at = j.to_vec();
                at[dim] = sel[j[dim]] as usize;
                x.at(&at)
            });
            check_tensor(&xt.index_select(dim as isize, &st), &oshape, &buffer(d, &want.v), Kind::Exact)
                .map_err(|e| format!("index_select dim {dim}: {e}"))?;
        }
        // take_along_dim: indices [4, 1] along dim 1 ([4, 1] result); indices [2, 1] along dim 0, broadcast over
        // the columns ([2, 3] result).
        let idx = [2.0, 0.0, 1.0, 2.0];
        let it = up(tensor(ix, &idx, &[4, 1]))?;
        let want = Nd::from_fn(&[4, 1], |j| x.at(&[j[0], idx[j[0]] as usize]));
        check_tensor(&xt.take_along_dim(&it, Some(1)), &[4, 1], &buffer(d, &want.v), Kind::Exact)
            .map_err(|e| format!("take_along_dim: {e}"))?;
        let rows = [3.0, 1.0];
        let rt = up(tensor(ix, &rows, &[2, 1]))?;
        let want = Nd::from_fn(&[2, 3], |j| x.at(&[rows[j[0]] as usize, j[1]]));
        check_tensor(&xt.take_along_dim(&rt, Some(0)), &[2, 3], &buffer(d, &want.v), Kind::Exact)
            .map_err(|e| format!("take_along_dim broadcast: {e}"))?;
        let flat = up(tensor(ix, &[11.0, 0.0, 5.0], &[3]))?;
        check_tensor(&xt.take_along_dim(&flat, None), &[3], &buffer(d, &[x.v[11], x.v[0], x.v[5]]), Kind::Exact)
            .map_err(|e| format!("take_along_dim flat: {e}"))?;
        // masked_fill, the mask broadcast over rows.
        if d != Bool {
            let mask = up(tensor(Bool, &[1.0, 0.0, 1.0], &[3]))?;
            let want = Nd::from_fn(&shape, |j| if j[1] != 1 { 7.0 } else { x.at(j) });
            check_tensor(&xt.masked_fill(&mask, 7.0), &shape, &buffer(d, &want.v), Kind::Exact)
                .map_err(|e| format!("masked_fill: {e}"))?;
        }
        Ok(())
    });
}

#[test]
fn embedding_rows_fuse_with_a_position_add() {
    for dev in devices() {
        let w = Nd::from_fn(&[10, 4], |j| (j[0] * 10 + j[1]) as f64);
        let pos = Nd::from_fn(&[3, 4], |j| 0.5 * (j[0] as f64 + 1.0));
        let wt = tensor(F32, &w.v, &[10, 4]).to_device(&dev).unwrap();
        let pt = tensor(F32, &pos.v, &[3, 4]).to_device(&dev).unwrap();
        let ids = [9.0, 0.0, 4.0, 4.0, 1.0, 2.0];
        let it = tensor(I32, &ids, &[2, 3]).to_device(&dev).unwrap();
        let out = kiln::nn::functional::embedding(&it, &wt).add(&pt);
        let want = Nd::from_fn(&[2, 3, 4], |j| w.at(&[ids[j[0] * 3 + j[1]] as usize, j[2]]) + pos.at(&[j[1], j[2]]));
        if let Err(e) = check_tensor(&out, &[2, 3, 4], &buffer(F32, &want.v), Kind::Exact) {
            panic!("[{dev}] {e}");
        }
    }
}

/// One kernel: the lookup is a load of the add's kernel, not a buffer of its own; and i64 indices (the CPU's)
/// through a kernel vectorized along the embedding dim.
#[cfg(feature = "cpu")]
#[test]
fn an_embedding_and_its_add_are_one_kernel() {
    let dev = Device::cpu();
    let wt = Tensor::randn([10, 4], F32, &dev);
    let pt = Tensor::randn([3, 4], F32, &dev);
    let it = tensor(I64, &[9.0, 0.0, 4.0, 4.0, 1.0, 2.0], &[2, 3]);
    let out = kiln::nn::functional::embedding(&it, &wt).add(&pt);
    kiln::realize(&[&wt, &pt, &it]).unwrap();
    let cap = kiln::capture(&[&out]).expect("capture");
    let plan = kiln_jit::kernel::schedule(&cap.graph);
    let names: Vec<&str> = plan.launches.iter().map(|l| l.kernel.name.as_str()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].contains("gather") && names[0].contains("add"), "{names:?}");
    // i64 indices, the same along each row's vector of 4 (a CPU kernel vectorized along the embedding dim reads
    // one scalar index for all lanes).
    let (w, p) = (vals(&wt), vals(&pt));
    let ids = [9usize, 0, 4, 4, 1, 2];
    let want: Vec<f64> =
        (0..24).map(|k| (w[ids[k / 4] * 4 + k % 4] + p[(k / 4 % 3) * 4 + k % 4]) as f32 as f64).collect();
    assert_eq!(vals(&out), want);
}

#[test]
fn scatter_add_and_index_add_match_pytorch_and_repeat_bit_for_bit() {
    // torch.zeros(3, 4).scatter_add(1, torch.tensor([[0, 1, 0], [3, 3, 3], [2, 0, 2]]),
    //     torch.tensor([[1., 2., 4.], [.1, .2, .3], [5., 6., 7.]]))
    let want = [5.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.6000000238418579, 6.0, 0.0, 12.0, 0.0];
    // torch.ones(4, 2).index_add(0, torch.tensor([3, 0, 3]), torch.tensor([[1., 2.], [3., 4.], [5., 6.]]), alpha=2)
    let want_index_add = [7.0, 9.0, 1.0, 1.0, 1.0, 1.0, 13.0, 17.0];
    for dev in devices() {
        for ix in [I32, I64] {
            if !runs_on(&dev, &[ix]) {
                continue;
            }
            let idx = tensor(ix, &[0.0, 1.0, 0.0, 3.0, 3.0, 3.0, 2.0, 0.0, 2.0], &[3, 3]).to_device(&dev).unwrap();
            let src = tensor(F32, &[1.0, 2.0, 4.0, 0.1, 0.2, 0.3, 5.0, 6.0, 7.0], &[3, 3]).to_device(&dev).unwrap();
            let base = Tensor::zeros([3, 4], F32, &dev);
            let first = base.scatter_add(1, &idx, &src).to_host().unwrap();
            if let Err(e) = compare_on(&dev, &first, &buffer(F32, &want), tol(F32, Kind::Accumulate)) {
                panic!("[{dev}] scatter_add: {e}");
            }
            for _ in 0..3 {
                let again = base.scatter_add(1, &idx, &src).to_host().unwrap();
                assert_eq!(again.to_f64(), first.to_f64(), "[{dev}] scatter_add is not deterministic");
            }
            let ones = Tensor::ones([4, 2], F32, &dev);
            let sel = tensor(ix, &[3.0, 0.0, 3.0], &[3]).to_device(&dev).unwrap();
            let source = tensor(F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).to_device(&dev).unwrap();
            let got = ones.index_add(0, &sel, &source, 2.0);
            if let Err(e) = check_tensor(&got, &[4, 2], &buffer(F32, &want_index_add), Kind::Exact) {
                panic!("[{dev}] index_add: {e}");
            }
        }
    }
}

#[test]
fn an_index_out_of_range_is_an_error_naming_it_and_leaves_everything_usable() {
    for dev in devices() {
        let x = tensor(F32, &(0..12).map(f64::from).collect::<Vec<_>>(), &[3, 4]).to_device(&dev).unwrap();
        for (bad, name) in [(4.0, "4"), (-1.0, "-1"), (1e6, "1000000")] {
            let idx = tensor(I32, &[0.0, 1.0, bad, 2.0], &[4]).to_device(&dev).unwrap();
            let err = x.index_select(1, &idx).mul(2.0).to_host().unwrap_err().to_string();
            let want = format!("gather: index {name} is out of range for a dimension of size 4");
            assert!(err.contains(&want), "[{dev}] {err}");
            // The same plan again, with good indices: the cache and the inputs are intact.
            let good = tensor(I32, &[3.0, 1.0, 0.0, 2.0], &[4]).to_device(&dev).unwrap();
            let got = x.index_select(1, &good).mul(2.0).to_host().unwrap().to_f64();
            assert_eq!(got[..4], [6.0, 2.0, 0.0, 4.0], "[{dev}]");
            assert_eq!(x.to_host().unwrap().to_f64(), (0..12).map(f64::from).collect::<Vec<_>>(), "[{dev}]");
        }
        // A gather from an empty dim: every index is out of range.
        let empty = Tensor::zeros([2, 0], F32, &dev);
        let idx = tensor(I32, &[0.0, 0.0], &[2, 1]).to_device(&dev).unwrap();
        let err = empty.gather(1, &idx).to_host().unwrap_err().to_string();
        assert!(err.contains("index 0 is out of range for a dimension of size 0"), "[{dev}] {err}");
    }
}

/// An embedding summed against weights (`sum(embedding(ids, table) * dy)`, a loss's forward): one reduction that
/// gathers, which the CPU runs along the embedding dim four lanes at a time with one index check per vector
/// (`render/clif`'s gather rows). 36 columns are vectors only, 37 leave a scalar tail. Against a plain-Rust sum in
/// i32 and i64 indices; an index out of range in that reduction is still an error naming it.
#[test]
fn an_embedding_summed_against_weights_checks_every_row() {
    for dev in devices() {
        // 300 tokens split into partial sums; 6 are one kernel with no output dims.
        for (cols, n) in [(36usize, 300usize), (37, 300), (36, 6)] {
            let rows = 50usize;
            let table: Vec<f64> = (0..rows * cols).map(|k| ((k * 37 % 101) as f64 - 50.0) / 64.0).collect();
            let dy: Vec<f64> = (0..n * cols).map(|k| ((k * 13 % 29) as f64 - 14.0) / 16.0).collect();
            let ids = indices(n, rows, 17);
            let row = |t: usize| (0..cols).map(|c| table[ids[t] as usize * cols + c] * dy[t * cols + c]).sum::<f64>();
            let want: f64 = (0..n).map(row).sum();
            let tt = tensor(F32, &table, &[rows, cols]).to_device(&dev).unwrap();
            let dt = tensor(F32, &dy, &[n, cols]).to_device(&dev).unwrap();
            let loss = |ids: &Tensor| kiln::nn::functional::embedding(ids, &tt).mul(&dt).sum_all();
            for ix in [I32, I64] {
                if !runs_on(&dev, &[ix]) {
                    continue;
                }
                let what = format!("[{dev}] {cols} columns, {ix}");
                let got = loss(&tensor(ix, &ids, &[n]).to_device(&dev).unwrap()).item::<f32>().unwrap();
                assert!((f64::from(got) - want).abs() <= 1e-4 * (1.0 + want.abs()), "{what}: {got} vs {want}");
                let mut bad = ids.clone();
                bad[n / 2] = rows as f64;
                let err = loss(&tensor(ix, &bad, &[n]).to_device(&dev).unwrap()).to_host().unwrap_err().to_string();
                let named = format!("index {rows} is out of range for a dimension of size {rows}");
                assert!(err.contains(&named), "{what}: {err}");
            }
        }
    }
}

#[test]
fn gather_gradients_accumulate_repeated_indices() {
    for dev in devices() {
        let x = tensor(F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).to_device(&dev).unwrap().requires_grad();
        let idx = tensor(I32, &[2.0, 2.0, 0.0, 1.0, 1.0, 1.0], &[2, 3]).to_device(&dev).unwrap();
        let w = tensor(F32, &[1.0, 10.0, 100.0, 1.0, 2.0, 3.0], &[2, 3]).to_device(&dev).unwrap();
        let g = x.gather(1, &idx).mul(&w).sum_all().backward().unwrap();
        let want = [100.0, 0.0, 11.0, 0.0, 6.0, 0.0];
        if let Err(e) = check_tensor(g.get(&x).unwrap(), &[2, 3], &buffer(F32, &want), Kind::Exact) {
            panic!("[{dev}] {e}");
        }
    }
}

/// The sums of `vals` (`[j, w]`) into `positions` rows by `index` (one per row, or one per element), added in row
/// order and rounded to f32 after each add for f32 and narrower values (f64 stays f64): the semantics of kiln's
/// scatter routine (`kernel::scatter`), written out independently here.
fn scatter_rows(vals: &[f64], index: &[f64], w: usize, positions: usize, dtype: DType) -> Vec<f64> {
    let per_element = index.len() == vals.len() && w > 1;
    let mut out = vec![0.0; positions * w];
    for (k, &v) in vals.iter().enumerate() {
        let p = index[if per_element { k } else { k / w }] as usize;
        let o = &mut out[p * w + k % w];
        *o = if dtype == F64 { *o + v } else { (*o + v) as f32 as f64 };
    }
    out
}

#[test]
fn scatter_sums_at_a_large_vocabulary_are_exact_in_row_order() {
    // An embedding gradient with 700 tokens (many repeated) over 5000 rows of odd width 9, and a scatter_add with an
    // index per element: bit for bit the row-order sums on every device, whatever its threads.
    let (rows, p, w) = (700usize, 5000usize, 9usize);
    let mut failures = Vec::new();
    for dev in devices() {
        for d in FLOATS {
            for ix in [I32, I64] {
                if !runs_on(&dev, &[d, ix]) {
                    continue;
                }
                let mut r = Rng(11);
                let up = values(&buffer(d, &(0..rows * w).map(|_| r.unit() * 2.0 - 1.0).collect::<Vec<_>>()));
                // Indices bunched into the first 50 rows (repeats) and spread over the rest.
                let ids: Vec<f64> = (0..rows)
                    .map(|t| if t % 2 == 0 { (r.next_u64() % 50) as f64 } else { (r.next_u64() % p as u64) as f64 })
                    .collect();
                let table = Tensor::zeros([p, w], d, &dev).requires_grad();
                let it = tensor(ix, &ids, &[rows]).to_device(&dev).unwrap();
                let upt = tensor(d, &up, &[rows, w]).to_device(&dev).unwrap();
                let loss = kiln::nn::functional::embedding(&it, &table).mul(&upt).sum_all();
                let grads = loss.backward().unwrap();
                let want = buffer(d, &scatter_rows(&up, &ids, w, p, d));
                if let Err(e) = check_tensor(grads.get(&table).unwrap(), &[p, w], &want, Kind::Exact) {
                    failures.push(format!("[{dev}] {d} embedding gradient by {ix}: {e}"));
                }
                let each: Vec<f64> = (0..rows * w).map(|_| (r.next_u64() % 40) as f64).collect();
                let et = tensor(ix, &each, &[rows, w]).to_device(&dev).unwrap();
                let got = Tensor::zeros([40, w], d, &dev).scatter_add(0, &et, &upt);
                let want = buffer(d, &scatter_rows(&up, &each, w, 40, d));
                if let Err(e) = check_tensor(&got, &[40, w], &want, Kind::Exact) {
                    failures.push(format!("[{dev}] {d} scatter_add by {ix}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

#[test]
fn a_scattered_index_out_of_range_is_an_error_naming_it() {
    for dev in devices() {
        let src = tensor(F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).to_device(&dev).unwrap();
        let base = Tensor::zeros([4, 2], F32, &dev);
        for (bad, name) in [(4.0, "4"), (-2.0, "-2")] {
            let sel = tensor(I32, &[3.0, bad, 0.0], &[3]).to_device(&dev).unwrap();
            let err = base.index_add(0, &sel, &src, 1.0).to_host().unwrap_err().to_string();
            let want = format!("scatter_add: index {name} is out of range for a dimension of size 4");
            assert!(err.contains(&want), "[{dev}] {err}");
            let each = tensor(I32, &[3.0, 0.0, 1.0, bad, 2.0, 2.0], &[3, 2]).to_device(&dev).unwrap();
            let err = base.scatter_add(0, &each, &src).to_host().unwrap_err().to_string();
            assert!(err.contains(&want), "[{dev}] {err}");
        }
        // The same plan with good indices: nothing was left behind.
        let sel = tensor(I32, &[3.0, 3.0, 0.0], &[3]).to_device(&dev).unwrap();
        let got = base.index_add(0, &sel, &src, 1.0).to_host().unwrap().to_f64();
        assert_eq!(got, [5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 4.0, 6.0], "[{dev}]");
    }
}
