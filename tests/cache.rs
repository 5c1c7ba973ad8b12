//! The plan cache and memory behaviour, through `kiln::stats()`.
//!
//! The counters are process-wide and the tests of one file run on parallel threads, so every test here takes the
//! `SERIAL` lock first and asserts on differences of the counters before and after. Each test uses constants no
//! other test uses, so a plan it expects to compile cannot already be cached by another test.

// The plan cache is the same for every device; these tests drive it on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

use kiln::{DType, Device, Stats, Tensor};
use std::sync::{Barrier, Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the file-wide lock; a test that failed while holding it must not fail the others (poison is ignored).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Counter differences `after - before`.
#[derive(Debug, PartialEq, Eq)]
struct Delta {
    hits: u64,
    misses: u64,
    compiles: u64,
    realizes: u64,
}

fn delta(before: Stats, after: Stats) -> Delta {
    Delta {
        hits: after.plan_hits - before.plan_hits,
        misses: after.plan_misses - before.plan_misses,
        compiles: after.compiles - before.compiles,
        realizes: after.realizes - before.realizes,
    }
}

/// Runs `f` and returns the counter differences it caused.
fn counting(f: impl FnOnce()) -> Delta {
    let before = kiln::stats();
    f();
    delta(before, kiln::stats())
}

fn dev() -> Device {
    Device::cpu()
}

fn close(got: &[f32], want: &[f32], tol: f32) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= tol * (1.0 + w.abs()))
}

// Tensors are handles to shared lazy nodes: they must be usable from any thread. A compile-time check.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Tensor>();
    send_sync::<Device>();
    send_sync::<Stats>();
};

/// (a) A training-style loop that rebuilds the same graph each step from new data compiles once: 1 miss, 9 hits.
#[test]
fn ten_identical_steps_compile_once() {
    let _serial = serial();
    let before = kiln::stats();
    for step in 0..10 {
        let xs: Vec<f32> = (0..12).map(|i| (i as f32 - 5.0) * (step + 1) as f32).collect();
        let bs = vec![step as f32 - 3.0; 4];
        let x = Tensor::from_vec(xs.clone(), [3, 4], &dev()).unwrap();
        let b = Tensor::from_vec(bs.clone(), [4], &dev()).unwrap();
        let y = (&x * 0.731 + &b).relu().sum(1, false);
        let got = y.to_vec::<f32>().unwrap();
        let want: Vec<f32> =
            (0..3).map(|r| (0..4).map(|c| (xs[r * 4 + c] * 0.731 + bs[c]).max(0.0)).sum::<f32>()).collect();
        assert!(close(&got, &want, 1e-5), "step {step}: {got:?} vs {want:?}");
    }
    let after = kiln::stats();
    assert_eq!(delta(before, after), Delta { hits: 9, misses: 1, compiles: 1, realizes: 10 });
    assert_eq!(after.cached_plans - before.cached_plans, 1);
}

fn input(dtype: DType, dims: [usize; 2]) -> Tensor {
    let n = dims[0] * dims[1];
    match dtype {
        DType::F32 => Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), dims, &dev()),
        DType::F64 => Tensor::from_vec((0..n).map(|i| i as f64).collect::<Vec<_>>(), dims, &dev()),
        DType::I64 => Tensor::from_vec((0..n).map(|i| i as i64).collect::<Vec<_>>(), dims, &dev()),
        other => unreachable!("no input of {other} here"),
    }
    .unwrap()
}

fn graph(dtype: DType, dims: [usize; 2], scale: f64, axis: usize) -> Tensor {
    (input(dtype, dims) * scale + 0.25).sum(axis, false)
}

/// (b) A different shape, dtype, constant or structure is a different plan; the original is still a hit after.
#[test]
fn a_different_shape_dtype_constant_or_structure_misses() {
    let _serial = serial();
    let realize = |t: Tensor| move || t.realize().unwrap();
    let miss = Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 };
    let hit = Delta { hits: 1, misses: 0, compiles: 0, realizes: 1 };
    let base = || graph(DType::F32, [4, 3], 0.577, 0);
    assert_eq!(counting(realize(base())), miss, "first time");
    assert_eq!(counting(realize(base())), hit, "same graph, same data");
    assert_eq!(counting(realize(graph(DType::F32, [5, 3], 0.577, 0))), miss, "shape");
    assert_eq!(counting(realize(graph(DType::F32, [3, 4], 0.577, 0))), miss, "shape with the same element count");
    assert_eq!(counting(realize(graph(DType::F64, [4, 3], 0.577, 0))), miss, "dtype");
    assert_eq!(counting(realize(graph(DType::I64, [4, 3], 0.577, 0))), miss, "int dtype");
    assert_eq!(counting(realize(graph(DType::F32, [4, 3], 0.578, 0))), miss, "constant");
    assert_eq!(counting(realize(graph(DType::F32, [4, 3], 0.577, 1))), miss, "reduced axis");
    assert_eq!(counting(realize(base().exp())), miss, "one more op");
    // Every variant is cached now, next to the original.
    assert_eq!(counting(realize(base())), hit);
    assert_eq!(counting(realize(graph(DType::F32, [5, 3], 0.577, 0))), hit);
    assert_eq!(counting(realize(graph(DType::F64, [4, 3], 0.577, 0))), hit);
    // Realizing what is already realized (or is an input) runs nothing.
    let t = base();
    t.realize().unwrap();
    assert_eq!(counting(realize(t.clone())), Delta { hits: 0, misses: 0, compiles: 0, realizes: 0 });
    assert_eq!(counting(realize(input(DType::F32, [2, 2]))), Delta { hits: 0, misses: 0, compiles: 0, realizes: 0 });
}

/// (c) 1000 steps of `w = w - 0.1 * f(w)`, each realized: one compile, and the node count does not grow.
#[test]
fn a_long_update_loop_compiles_once_and_stays_bounded() {
    let _serial = serial();
    let init: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 16.0).collect();
    let mut w = Tensor::from_vec(init.clone(), [64], &dev()).unwrap();
    let mut shadow = init; // the same loop in plain Rust
    let before = kiln::stats();
    let mut live_at_10 = 0;
    for step in 1..=1000 {
        let f = w.tanh() * w.square().mean(0, true) + &w * 0.0123;
        w = &w - f * 0.1;
        w.realize().unwrap();
        let m = shadow.iter().map(|x| x * x).sum::<f32>() / 64.0;
        shadow = shadow.iter().map(|&x| x - (x.tanh() * m + x * 0.0123) * 0.1).collect();
        if step == 10 {
            live_at_10 = kiln::stats().live_nodes;
        }
    }
    let after = kiln::stats();
    assert_eq!(delta(before, after), Delta { hits: 999, misses: 1, compiles: 1, realizes: 1000 });
    assert_eq!(after.cached_plans - before.cached_plans, 1);
    // Only `w` is alive at the end of every step: the node count is what it was before the loop.
    assert_eq!(after.live_nodes, live_at_10, "live nodes grew between step 10 and step 1000");
    assert_eq!(after.live_nodes, before.live_nodes, "live nodes grew over the loop");
    let got = w.to_vec::<f32>().unwrap();
    assert!(close(&got, &shadow, 1e-4), "{got:?}\nvs\n{shadow:?}");
    drop(w);
    assert_eq!(kiln::stats().live_nodes, before.live_nodes - 1);
}

/// (c) A lazy chain of 100_000 ops is dropped without overflowing the stack (on a deliberately small stack), and a
/// chain of 100_000 steps (400_000 nodes) realizes on that stack too; afterwards its history is gone.
#[test]
fn deep_lazy_chains_drop_and_realize() {
    let _serial = serial();
    const DEEP: usize = 100_000;
    let base = kiln::stats().live_nodes;
    let small_stack = std::thread::Builder::new().stack_size(256 * 1024);
    let handle = small_stack
        .spawn(move || {
            let x = Tensor::from_vec(vec![0.5f32; 4], [4], &dev()).unwrap();
            let mut y = x.clone();
            for _ in 0..DEEP {
                y = &y + 1.0;
            }
            let built = kiln::stats().live_nodes;
            drop(y);
            let dropped = kiln::stats().live_nodes;

            let mut z = x.clone();
            for _ in 0..DEEP {
                z = &z * 1.0 + 1.0;
            }
            z.realize().unwrap();
            let after_realize = kiln::stats().live_nodes;
            let values = z.to_vec::<f32>().unwrap();
            (built, dropped, after_realize, values)
        })
        .unwrap();
    let (built, dropped, after_realize, values) = handle.join().expect("the chains overflowed a 256 KiB stack");
    // Each `y + 1.0` is a constant and an add.
    assert!(built >= base + 1 + 2 * DEEP, "{built} live nodes for a chain of {DEEP}");
    assert_eq!(dropped, base + 1, "dropping the chain freed every node but the input");
    assert_eq!(after_realize, base + 2, "the realized chain keeps only its value (and the input)");
    assert_eq!(values, vec![0.5 + DEEP as f32; 4]);
    assert_eq!(kiln::stats().live_nodes, base);
}

/// (d) `kiln::realize(&[&a, &b])` of two tensors that share a subgraph is one realization of one plan.
#[test]
fn realizing_several_tensors_is_one_realization() {
    let _serial = serial();
    let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], [2, 3], &dev()).unwrap();
    let shared = (&x * 0.37).exp();
    let a = shared.sum(1, false);
    let b = (&shared * 2.0).max(0, false);
    let c = &a + 1.0; // depends on `a`, which is also a target
    let d = counting(|| kiln::realize(&[&a, &b, &c, &a]).unwrap());
    assert_eq!(d, Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 });
    assert!(a.is_realized() && b.is_realized() && c.is_realized());
    let e: Vec<f32> = (0..6).map(|i| (i as f32 * 0.37).exp()).collect();
    let want_a = [e[0] + e[1] + e[2], e[3] + e[4] + e[5]];
    assert!(close(&a.to_vec::<f32>().unwrap(), &want_a, 1e-5));
    assert!(close(&b.to_vec::<f32>().unwrap(), &[2.0 * e[3], 2.0 * e[4], 2.0 * e[5]], 1e-5));
    assert!(close(&c.to_vec::<f32>().unwrap(), &[want_a[0] + 1.0, want_a[1] + 1.0], 1e-5));
    // Nothing left to do: a second call runs nothing.
    assert_eq!(counting(|| kiln::realize(&[&a, &b, &c]).unwrap()).realizes, 0);
    // The same structure on new data replays the multi-output plan; realizing the parts one by one would be two
    // realizations of two other plans.
    let x2 = Tensor::from_vec(vec![1.0f32; 6], [2, 3], &dev()).unwrap();
    let shared2 = (&x2 * 0.37).exp();
    let (a2, b2) = (shared2.sum(1, false), (&shared2 * 2.0).max(0, false));
    let c2 = &a2 + 1.0;
    let d = counting(|| kiln::realize(&[&a2, &b2, &c2, &a2]).unwrap());
    assert_eq!(d, Delta { hits: 1, misses: 0, compiles: 0, realizes: 1 });
    let x3 = Tensor::from_vec(vec![2.0f32; 6], [2, 3], &dev()).unwrap();
    let shared3 = (&x3 * 0.37).exp();
    let (a3, b3) = (shared3.sum(1, false), (&shared3 * 2.0).max(0, false));
    let d = counting(|| {
        a3.realize().unwrap();
        b3.realize().unwrap();
    });
    assert_eq!(d.realizes, 2);
    assert_eq!(d.hits + d.misses, 2);
}

/// (e) Building and realizing from several threads at once gives the right results, including threads racing to
/// realize the same lazy tensor.
#[test]
fn threads_build_and_realize_concurrently() {
    let _serial = serial();
    const THREADS: usize = 8;
    const STEPS: usize = 25;
    let base = Tensor::from_vec((0..16).map(|i| i as f32 / 8.0).collect::<Vec<_>>(), [4, 4], &dev()).unwrap();
    let shared = (&base * 0.4321).exp(); // lazy, realized by whichever thread gets there first
    let want_shared: Vec<f32> = (0..16).map(|i| (i as f32 / 8.0 * 0.4321).exp()).collect();
    let barrier = Barrier::new(THREADS);
    let before = kiln::stats();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (shared, base, barrier, want_shared) = (&shared, &base, &barrier, &want_shared);
            s.spawn(move || {
                barrier.wait();
                let mine = shared + t as f64;
                let got = if t % 2 == 0 { shared.to_vec::<f32>().unwrap() } else { mine.to_vec::<f32>().unwrap() };
                let offset = if t % 2 == 0 { 0.0 } else { t as f32 };
                let want: Vec<f32> = want_shared.iter().map(|v| v + offset).collect();
                assert!(close(&got, &want, 1e-5), "thread {t}: {got:?}");
                for step in 0..STEPS {
                    let data: Vec<f32> = (0..4).map(|i| (t * 100 + step * 4 + i) as f32).collect();
                    let x = Tensor::from_vec(data.clone(), [4], &dev()).unwrap();
                    let y = (base.matmul(&x) * 0.5 - &x).sum_all();
                    let want: f32 = (0..4)
                        .map(|r| (0..4).map(|c| (r * 4 + c) as f32 / 8.0 * data[c]).sum::<f32>() * 0.5 - data[r])
                        .sum();
                    let got = y.item::<f32>().unwrap();
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "thread {t} step {step}: {got} vs {want}");
                }
            });
        }
    });
    let d = delta(before, kiln::stats());
    assert_eq!(d.hits + d.misses, d.realizes, "every realization either hit or missed");
    assert!(d.realizes >= (THREADS * STEPS + 1) as u64, "{d:?}");
    // Two plans at least (the shared tensor and the per-step graph); racing misses may compile a plan twice.
    assert!(d.compiles >= 2 && d.compiles <= 3 * THREADS as u64, "{d:?}");
    assert!(shared.is_realized());
}

/// (f) A realized tensor drops its history: intermediates nobody else holds are freed by `realize`.
#[test]
fn realizing_drops_history() {
    let _serial = serial();
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &dev()).unwrap();
    let base = kiln::stats().live_nodes;
    let y = ((&x + 1.0) * 2.0).exp().sum_all();
    let built = kiln::stats().live_nodes;
    assert!(built >= base + 5, "the lazy graph holds its intermediates ({built} vs {base})");
    y.realize().unwrap();
    assert!(y.is_realized());
    assert_eq!(kiln::stats().live_nodes, base + 1, "only the realized value is left");
    let want: f32 = [4.0f32, 6.0, 8.0].iter().map(|v| v.exp()).sum();
    assert!(close(&[y.item::<f32>().unwrap()], &[want], 1e-5));

    // An intermediate the user still holds stays alive (and lazy, and computable); the rest is freed.
    let h = &x + 1.0; // a constant and an add
    let z = (&h * 3.0).sum_all();
    z.realize().unwrap();
    assert!(!h.is_realized());
    assert_eq!(kiln::stats().live_nodes, base + 1 + 2 + 1);
    assert_eq!(h.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    assert_eq!(z.item::<f32>().unwrap(), 27.0);
    drop(h);
    assert_eq!(kiln::stats().live_nodes, base + 1 + 1, "the realized h's history went with it");
    drop((y, z));
    assert_eq!(kiln::stats().live_nodes, base);
}

/// The live-node count is kept per thread and summed (`tensor::live`): nodes made on a thread that has ended, then
/// dropped on another thread that is still running, leave it where it started.
#[test]
fn live_nodes_count_across_threads() {
    let _serial = serial();
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], &dev()).unwrap();
    let base = kiln::stats().live_nodes;
    let made: Vec<Tensor> =
        std::thread::scope(|s| s.spawn(|| (0..10).map(|i| &x + f64::from(i)).collect()).join().unwrap());
    // Each add records a constant node and the add.
    assert_eq!(kiln::stats().live_nodes, base + 20, "nodes of an ended thread still count while alive");
    let read = Barrier::new(2);
    std::thread::scope(|s| {
        let dropper = s.spawn(|| {
            drop(made);
            let seen = kiln::stats().live_nodes;
            read.wait(); // still running while the main thread reads the count
            seen
        });
        read.wait();
        assert_eq!(kiln::stats().live_nodes, base, "dropped on another thread than the one that made them");
        assert_eq!(dropper.join().unwrap(), base);
    });
    assert_eq!(kiln::stats().live_nodes, base, "and after that thread ends too");
}

/// (g) A plan whose intermediate buffers are large (a 4 MiB `exp` read by two reductions, so stored) has them
/// faulted in on another thread while its kernels compile (`cpu/plan.rs`'s `Prefault`), and its first run takes
/// them. The values are the same in that first run, in replays, and when two threads run a new plan's first run at
/// once (one takes the prefaulted buffers, the other builds its own).
#[test]
fn plans_with_large_temps_compute_alike_in_first_runs_and_replays() {
    let _serial = serial();
    let (rows, cols) = (1024usize, 1024usize);
    let data: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    let x = Tensor::from_vec(data.clone(), [rows, cols], &dev()).unwrap();
    let sums = |scale: f64| {
        let e = (&x * scale).exp();
        (e.sum(0, false), e.sum(1, false))
    };
    let want = |scale: f32| {
        let e: Vec<f64> = data.iter().map(|&v| f64::from(v * scale).exp()).collect();
        let cols_sum: Vec<f32> = (0..cols).map(|c| (0..rows).map(|r| e[r * cols + c]).sum::<f64>() as f32).collect();
        let rows_sum: Vec<f32> = (0..rows).map(|r| e[r * cols..(r + 1) * cols].iter().sum::<f64>() as f32).collect();
        (cols_sum, rows_sum)
    };
    let check = |(a, b): (Tensor, Tensor), scale: f32, what: &str| {
        let (wa, wb) = want(scale);
        kiln::realize(&[&a, &b]).unwrap();
        assert!(close(&a.to_vec::<f32>().unwrap(), &wa, 1e-5), "{what}: column sums");
        assert!(close(&b.to_vec::<f32>().unwrap(), &wb, 1e-5), "{what}: row sums");
    };
    let d = counting(|| {
        check(sums(0.6125), 0.6125, "first run");
        check(sums(0.6125), 0.6125, "replay");
    });
    assert_eq!((d.compiles, d.hits), (1, 1), "{d:?}");
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (barrier, sums, check) = (&barrier, &sums, &check);
            s.spawn(move || {
                barrier.wait();
                check(sums(0.3875), 0.3875, &format!("thread {t}'s first run"));
            });
        }
    });
}

/// Restores the plan cache's limit when dropped (a failing test must not leave the file's other tests a small cache).
struct LimitGuard(Option<usize>);

impl Drop for LimitGuard {
    fn drop(&mut self) {
        kiln::set_plan_cache_limit(self.0);
    }
}

/// (h) Past its limit the plan cache drops the plan used least recently, and a dropped graph compiles again on its
/// next realize, with the same result; `clear_plan_cache` drops every plan.
#[test]
fn the_plan_cache_keeps_its_limit_and_drops_the_least_recently_used() {
    let _serial = serial();
    let _restore = LimitGuard(kiln::plan_cache_limit());
    assert_eq!(kiln::plan_cache_limit(), Some(kiln::DEFAULT_PLAN_CACHE), "KILN_PLAN_CACHE is unset in the tests");
    // One plan per length: the sum of n copies of 0.5173 (a constant no other test uses).
    let run = |n: usize| {
        let x = Tensor::from_vec(vec![1.0f32; n], [n], &dev()).unwrap();
        let got = x.mul(0.5173).sum_all().to_vec::<f32>().unwrap()[0];
        assert!(close(&[got], &[0.5173 * n as f32], 1e-6), "n = {n}: {got}");
    };
    kiln::set_plan_cache_limit(Some(2));
    assert!(kiln::stats().cached_plans <= 2, "setting the limit drops plans at once");
    let evicted = kiln::stats().plan_evictions;
    assert_eq!(counting(|| run(3)), Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 });
    assert_eq!(counting(|| run(4)), Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 });
    // 3 is used again, so 4 is now the least recently used: 5 takes its place.
    assert_eq!(counting(|| run(3)), Delta { hits: 1, misses: 0, compiles: 0, realizes: 1 });
    assert_eq!(counting(|| run(5)), Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 });
    let s = kiln::stats();
    assert_eq!(s.cached_plans, 2);
    assert!(s.plan_evictions > evicted);
    assert_eq!(counting(|| run(3)), Delta { hits: 1, misses: 0, compiles: 0, realizes: 1 });
    let kernels = kiln::stats();
    assert_eq!(counting(|| run(4)), Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 }, "4 was dropped");
    // Compiled again from the kernel caches: the plan's kernels outlived it.
    let again = kiln::stats();
    assert_eq!(again.kernel_compiles - kernels.kernel_compiles, 0);
    assert_eq!(again.wide_kernels_generated - kernels.wide_kernels_generated, 0);
    assert_eq!(kiln::stats().cached_plans, 2);
    kiln::clear_plan_cache();
    assert_eq!(kiln::stats().cached_plans, 0);
    assert_eq!(counting(|| run(3)), Delta { hits: 0, misses: 1, compiles: 1, realizes: 1 });
    kiln::set_plan_cache_limit(None);
    assert_eq!(kiln::plan_cache_limit(), None);
}
