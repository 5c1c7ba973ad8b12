//! kiln's CPU benchmark suite (criterion). Each group times one kiln workload and its same-run baseline; the
//! workloads live in `benches/common` and are shared with `examples/bench_table.rs`.
//!
//! `cargo bench --bench cpu` (about a minute; `-- <filter>` runs a subset, e.g. `-- replay`). After criterion's
//! own report it prints one markdown table with the ratios kiln/baseline and the targets, computed from the medians
//! of criterion's measurement samples (warm-up excluded). Criterion prints throughput in GiB/s; the table uses GB/s.
//!
//! | group | kiln | baseline |
//! |---|---|---|
//! | `chain_16M` | `a * b + c`: build + realize (cache hit + kernel), bytes = 16/elem | STREAM triad in Rust, in place (12 B/elem); the same into a fresh Vec; `a * b + c` in Rust |
//! | `sin_chain_16M` | `sin(a)^2 * b + c`, same unit | Rust `f32::sin` loop (torch.compile's 34.6 ms is a fixed reference) |
//! | `replay_50_nodes` | `realize()` of an already built 50-node graph (cache hit) | building that graph |
//! | `compile_fused_kernel` | `realize()` of a 6-op graph that misses the plan and kernel caches | the same graph on a hit |
//! | `matmul_1024` | build + realize of `a.matmul(&b)` | peak f32 FMA throughput in Rust |
//! | `rows_4096x1024` | softmax over rows; GELU (tanh form); bytes = 8/elem | the same in Rust with libm `exp`/`tanh` |
//!
//! Outputs of timed realizations are dropped outside the timed region. Thread count: `KILN_NUM_THREADS` (default
//! all cores) for kiln and the baselines alike.

mod common;

use common::*;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, black_box, measurement::WallTime};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Seconds per iteration of each criterion sample, per benchmark, in call order (warm-up calls first).
static SAMPLES: Mutex<BTreeMap<&'static str, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(key: &'static str, total: Duration, iters: u64) {
    SAMPLES.lock().unwrap().entry(key).or_default().push(total.as_secs_f64() / iters.max(1) as f64);
}

/// Median seconds per iteration over the last `n` records of `key` (criterion's measurement samples come after
/// its warm-up calls).
fn measured(key: &str, n: usize) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap();
    let v = samples.get(key)?;
    Some(median(&v[v.len().saturating_sub(n)..]))
}

const SAMPLE_SIZE: usize = 10;

fn group<'a>(c: &'a mut Criterion, name: &str, flat: bool) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(SAMPLE_SIZE).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    if flat {
        // Iterations of tens to hundreds of ms: the same count per sample, not criterion's linear ramp.
        g.sampling_mode(SamplingMode::Flat);
    }
    g
}

/// Times `iters` build+realize calls, dropping each output untimed (its drop time goes to `drop_key`).
fn realize_loop(iters: u64, build: impl Fn() -> kiln::Tensor, drop_key: Option<&'static str>) -> Duration {
    let (mut total, mut dropping) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..iters {
        let (t, y) = timed_realize(&build);
        total += t;
        let t0 = Instant::now();
        drop(y);
        dropping += t0.elapsed();
    }
    if let Some(k) = drop_key {
        record(k, dropping, iters);
    }
    total
}

fn streaming(c: &mut Criterion) {
    let inp = Inputs::new(N);
    let mut st = Stream::new(N, threads());

    let mut g = group(c, "chain_16M", true);
    g.throughput(Throughput::Bytes((CHAIN_BYTES_PER_ELEM * N) as u64));
    g.bench_function("kiln_a*b+c", |b| {
        b.iter_custom(|iters| {
            let t = realize_loop(iters, || chain(&inp.a, &inp.b, &inp.c), Some("drop"));
            record("chain", t, iters);
            t
        })
    });
    g.bench_function("rust_a*b+c", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                st.chain();
            }
            let t = t0.elapsed();
            record("chain_rust", t, iters);
            t
        })
    });
    g.throughput(Throughput::Bytes((TRIAD_BYTES_PER_ELEM * N) as u64));
    g.bench_function("stream_triad_in_place", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                st.triad();
            }
            let t = t0.elapsed();
            record("triad", t, iters);
            t
        })
    });
    g.bench_function("stream_triad_fresh_output", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                let out = st.triad_fresh();
                total += t0.elapsed();
                drop(out);
            }
            record("triad_fresh", total, iters);
            total
        })
    });
    g.finish();

    let mut g = group(c, "sin_chain_16M", true);
    g.throughput(Throughput::Bytes((SIN_BYTES_PER_ELEM * N) as u64));
    g.bench_function("kiln_sin(a)^2*b+c", |b| {
        b.iter_custom(|iters| {
            let t = realize_loop(iters, || sin_chain(&inp.a, &inp.b, &inp.c), None);
            record("sin", t, iters);
            t
        })
    });
    g.bench_function("rust_f32_sin_loop", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                st.sin_chain();
            }
            let t = t0.elapsed();
            record("sin_rust", t, iters);
            t
        })
    });
    g.finish();
}

fn replay(c: &mut Criterion) {
    let rp = Replay::new();
    rp.build().realize().expect("first realize compiles the plan");
    let mut g = group(c, "replay_50_nodes", false);
    g.throughput(Throughput::Elements(1));
    g.bench_function("kiln_realize_cached", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let k = left.min(REPLAY_BATCH);
                let graphs: Vec<kiln::Tensor> = (0..k).map(|_| rp.build()).collect();
                let t0 = Instant::now();
                for y in &graphs {
                    y.realize().expect("realize");
                }
                total += t0.elapsed();
                left -= k;
            }
            record("replay_realize", total, iters);
            total
        })
    });
    g.bench_function("build_graph_only", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let k = left.min(REPLAY_BATCH);
                let t0 = Instant::now();
                let graphs: Vec<kiln::Tensor> = (0..k).map(|_| rp.build()).collect();
                total += t0.elapsed();
                drop(black_box(graphs));
                left -= k;
            }
            record("replay_build", total, iters);
            total
        })
    });
    g.finish();
}

/// (Cranelift compiles counted by `kiln::stats()`, realizations timed) in the cache-miss benchmark.
static COMPILE_COUNTS: Mutex<(u64, u64)> = Mutex::new((0, 0));

fn compile(c: &mut Criterion) {
    let cp = Compile::new();
    cp.fresh().realize().expect("warm-up compile");
    cp.same().realize().expect("warm-up hit");
    let mut g = group(c, "compile_fused_kernel", false);
    g.bench_function("kiln_realize_cache_miss", |b| {
        b.iter_custom(|iters| {
            let before = kiln::stats().kernel_compiles;
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let y = cp.fresh();
                let t0 = Instant::now();
                y.realize().expect("realize");
                total += t0.elapsed();
            }
            let mut counts = COMPILE_COUNTS.lock().unwrap();
            counts.0 += kiln::stats().kernel_compiles - before;
            counts.1 += iters;
            record("compile", total, iters);
            total
        })
    });
    g.bench_function("kiln_realize_cache_hit", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let y = cp.same();
                let t0 = Instant::now();
                y.realize().expect("realize");
                total += t0.elapsed();
            }
            record("compile_hit", total, iters);
            total
        })
    });
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let (a, b) = matmul_inputs();
    let threads = threads();
    let mut g = group(c, "matmul_1024", true);
    g.throughput(Throughput::Elements(MATMUL_FLOPS as u64));
    g.bench_function("kiln_matmul", |bch| {
        bch.iter_custom(|iters| {
            let t = realize_loop(iters, || a.matmul(&b), None);
            record("matmul", t, iters);
            t
        })
    });
    let fma_iters = FMA_ITERS / 4;
    g.throughput(Throughput::Elements(fma_flops(threads, fma_iters) as u64));
    g.bench_function("rust_fma_peak", |bch| {
        bch.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                black_box(fma_peak_gflops(threads, fma_iters));
            }
            let t = t0.elapsed();
            record("fma", t, iters);
            t
        })
    });
    g.finish();
}

fn rows(c: &mut Criterion) {
    let x = rows_input();
    let mut rust = RowsRust::new(threads());
    let mut g = group(c, "rows_4096x1024", true);
    g.throughput(Throughput::Bytes((8 * ROWS * COLS) as u64));
    for (name, key, f) in [
        ("kiln_softmax", "softmax", softmax_rows as fn(&kiln::Tensor) -> kiln::Tensor),
        ("kiln_gelu_tanh", "gelu", gelu_tanh),
        ("kiln_log_softmax", "log_softmax", log_softmax_rows),
        ("kiln_layer_norm", "layer_norm", layer_norm_rows),
    ] {
        g.bench_function(name, |bch| {
            bch.iter_custom(|iters| {
                let t = realize_loop(iters, || f(&x), None);
                record(key, t, iters);
                t
            })
        });
    }
    let targets = rows_targets();
    g.bench_function("kiln_cross_entropy", |bch| {
        bch.iter_custom(|iters| {
            let t = realize_loop(iters, || cross_entropy_rows(&x, &targets), None);
            record("cross_entropy", t, iters);
            t
        })
    });
    for (name, key) in [("rust_softmax", "softmax_rust"), ("rust_gelu_tanh", "gelu_rust")] {
        g.bench_function(name, |bch| {
            bch.iter_custom(|iters| {
                let t0 = Instant::now();
                for _ in 0..iters {
                    if key == "softmax_rust" { rust.softmax() } else { rust.gelu() }
                }
                let t = t0.elapsed();
                record(key, t, iters);
                t
            })
        });
    }
    g.finish();
    // A sampler's sort and top k of a batch of vocabulary logits (the values: the indices are the sort routine's
    // output, computed either way).
    let v = vocab_input();
    let mut g = group(c, "vocab_16x32000", true);
    for (name, key, f) in [
        ("kiln_sort", "sort", (|v: &kiln::Tensor| v.sort(-1, true).0) as fn(&kiln::Tensor) -> kiln::Tensor),
        ("kiln_topk", "topk", |v: &kiln::Tensor| v.topk(TOPK, -1, true).0),
    ] {
        g.bench_function(name, |bch| {
            bch.iter_custom(|iters| {
                let t = realize_loop(iters, || f(&v), None);
                record(key, t, iters);
                t
            })
        });
    }
    g.finish();
}

fn main() {
    memory_only_cache_unless_chosen();
    verify();
    let mut c = Criterion::default().configure_from_args();
    streaming(&mut c);
    replay(&mut c);
    compile(&mut c);
    matmul(&mut c);
    rows(&mut c);
    c.final_summary();

    let n = SAMPLE_SIZE;
    let threads = threads();
    let (compiles, compile_calls) = *COMPILE_COUNTS.lock().unwrap();
    let fma_s = measured("fma", n);
    let has_fma = fma_peak_gflops(1, 1).is_some();
    let r = Results {
        threads,
        chain_s: measured("chain", n),
        triad_s: measured("triad", n),
        triad_fresh_s: measured("triad_fresh", n),
        chain_rust_s: measured("chain_rust", n),
        drop_s: measured("drop", usize::MAX),
        sin_s: measured("sin", n),
        sin_rust_s: measured("sin_rust", n),
        replay_realize_s: measured("replay_realize", n),
        replay_build_s: measured("replay_build", n),
        replay_nodes: Replay::new().nodes_per_build(),
        compile_s: measured("compile", n),
        compile_hit_s: measured("compile_hit", n),
        compiles,
        compile_calls,
        matmul_s: measured("matmul", n),
        fma_gflops: fma_s.filter(|_| has_fma).map(|s| fma_flops(threads, FMA_ITERS / 4) / s / 1e9),
        softmax_s: measured("softmax", n),
        softmax_rust_s: measured("softmax_rust", n),
        gelu_s: measured("gelu", n),
        gelu_rust_s: measured("gelu_rust", n),
        log_softmax_s: measured("log_softmax", n),
        layer_norm_s: measured("layer_norm", n),
        cross_entropy_s: measured("cross_entropy", n),
        sort_s: measured("sort", n),
        topk_s: measured("topk", n),
    };
    let how = if std::env::args().any(|a| a == "--test") {
        "--test mode: one un-warmed call each, not a measurement"
    } else {
        "criterion medians of the measurement samples"
    };
    println!("\nkiln CPU benchmarks ({how}), load average now {}:\n", loadavg());
    print!("{}", r.table());
}
