//! Issue 5's GEMM benchmarks (criterion): each group times kiln and its same-run baseline; the workloads live in
//! `benches/gemm_common` and are shared with `examples/bench_gemm/main.rs`, which adds the tuned-vs-default and the
//! warm-vs-cold-process rows (they need several processes) and prints one table.
//!
//! `cargo bench --bench gemm` (a few minutes; `-- <filter>` runs a subset, e.g. `-- skinny`). After criterion's
//! report it prints kiln/baseline ratios from the medians of criterion's samples.

#[path = "gemm_common/mod.rs"]
mod gemm_common;

use criterion::{Criterion, SamplingMode, black_box};
use gemm_common::*;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(key: &str, total: Duration, iters: u64) {
    let mut s = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    s.entry(key.to_string()).or_default().push(total.as_secs_f64() / iters.max(1) as f64);
}

fn med(key: &str) -> Option<f64> {
    let s = SAMPLES.lock().unwrap_or_else(|e| e.into_inner());
    s.get(key).filter(|v| !v.is_empty()).map(|v| median(v))
}

fn bench(c: &mut Criterion) {
    let threads = threads();
    for n in [1024usize, 2048] {
        let mut g = c.benchmark_group(format!("square_{n}"));
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        let (a, b) = (tensor(n, n, 1), tensor(n, n, 2));
        let _ = timed(|| a.matmul(&b));
        let key = format!("kiln {n}");
        g.bench_function("kiln", |bch| {
            bch.iter_custom(|iters| {
                let t: Duration = (0..iters).map(|_| Duration::from_secs_f64(timed(|| a.matmul(&b)))).sum();
                record(&key, t, iters);
                t
            })
        });
        let (ha, hb) = (values(n * n, 1), values(n * n, 2));
        let mut hc = vec![0f32; n * n];
        let key = format!("gemm crate {n}");
        g.bench_function("gemm_crate", |bch| {
            bch.iter_custom(|iters| {
                let t0 = Instant::now();
                for _ in 0..iters {
                    library_gemm(&ha, &hb, &mut hc, n, n, n, threads);
                }
                let t = t0.elapsed();
                record(&key, t, iters);
                t
            })
        });
        g.finish();
    }
    let weights: Vec<kiln::Tensor> = (0..SKINNY_WEIGHTS).map(|i| tensor(SKINNY_K, SKINNY_N, 10 + i)).collect();
    let host_w: Vec<Vec<f32>> = (0..SKINNY_WEIGHTS).map(|i| values(SKINNY_K * SKINNY_N, 10 + i)).collect();
    let mut g = c.benchmark_group("skinny_4096");
    g.sampling_mode(SamplingMode::Flat).sample_size(20);
    for m in [1usize, 8, 64] {
        let x = tensor(m, SKINNY_K, 3);
        for w in &weights {
            let _ = timed(|| x.matmul(w));
        }
        let key = format!("kiln M={m}");
        let mut j = 0;
        g.bench_function(format!("kiln_m{m}"), |bch| {
            bch.iter_custom(|iters| {
                let t: Duration = (0..iters)
                    .map(|_| {
                        j += 1;
                        Duration::from_secs_f64(timed(|| x.matmul(&weights[j % SKINNY_WEIGHTS])))
                    })
                    .sum();
                record(&key, t, iters);
                t
            })
        });
    }
    let mut j = 0;
    g.bench_function("read_bandwidth", |bch| {
        bch.iter_custom(|iters| {
            let t: Duration = (0..iters)
                .map(|_| {
                    j += 1;
                    Duration::from_secs_f64(read_once(black_box(&host_w[j % SKINNY_WEIGHTS]), threads))
                })
                .sum();
            record("read", t, iters);
            t
        })
    });
    g.finish();
    drop((weights, host_w));

    let mut g = c.benchmark_group("fused_1024");
    g.sampling_mode(SamplingMode::Flat).sample_size(10);
    let (a, b) = (tensor(1024, 1024, 1), tensor(1024, 1024, 2));
    let bias = kiln::Tensor::from_vec(values(1024, 5), [1024], &kiln::Device::cpu()).expect("bias");
    g.bench_function("fused", |bch| {
        bch.iter_custom(|iters| {
            let t: Duration =
                (0..iters).map(|_| Duration::from_secs_f64(timed(|| (a.matmul(&b) + &bias).relu()))).sum();
            record("fused", t, iters);
            t
        })
    });
    g.bench_function("unfused", |bch| {
        bch.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                let y = a.matmul(&b);
                y.realize().expect("mm");
                let y = (&y + &bias).realize_into();
                y.relu().realize().expect("relu");
            }
            let t = t0.elapsed();
            record("unfused", t, iters);
            t
        })
    });
    g.finish();

    let flops = |m: usize, n: usize, k: usize, s: f64| 2.0 * (m * n * k) as f64 / s / 1e9;
    println!("\n| benchmark | kiln | baseline | ratio |\n|---|---|---|---|");
    for n in [1024usize, 2048] {
        if let (Some(k), Some(l)) = (med(&format!("kiln {n}")), med(&format!("gemm crate {n}"))) {
            println!(
                "| {n}^3 | {:.1} GFLOP/s | gemm crate {:.1} GFLOP/s | {:.2}x |",
                flops(n, n, n, k),
                flops(n, n, n, l),
                l / k
            );
        }
    }
    let bytes = (SKINNY_K * SKINNY_N * 4) as f64;
    if let Some(r) = med("read") {
        for m in [1usize, 8, 64] {
            if let Some(k) = med(&format!("kiln M={m}")) {
                println!(
                    "| M={m} K=N=4096 | {:.1} GFLOP/s ({:.1} GB/s of weights) | read {:.1} GB/s | {:.0} % |",
                    flops(m, SKINNY_N, SKINNY_K, k),
                    bytes / k / 1e9,
                    bytes / r / 1e9,
                    100.0 * r / k
                );
            }
        }
    }
    if let (Some(f), Some(u)) = (med("fused"), med("unfused")) {
        println!("| GEMM+bias+relu 1024^3 | fused {:.2} ms | unfused {:.2} ms | {:.2}x |", f * 1e3, u * 1e3, u / f);
    }
}

trait RealizeInto {
    fn realize_into(self) -> kiln::Tensor;
}

impl RealizeInto for kiln::Tensor {
    fn realize_into(self) -> kiln::Tensor {
        self.realize().expect("realize");
        self
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
