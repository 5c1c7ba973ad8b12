//! The GEMM workloads of issue 5's benchmarks and their same-run baselines, shared by `benches/gemm.rs`
//! (criterion) and `examples/bench_gemm/main.rs` (one table), so both measure the same thing.
//!
//! | workload | kiln measures | same-run baseline | target |
//! |---|---|---|---|
//! | square 1024^3, 2048^3 | build + realize `a.matmul(&b)` (plan-cache hit + GEMM) | the `gemm` crate, same threads; FMA peak | >= 0.95x PyTorch (`benches/compare/gemm_torch.py`) |
//! | skinny M = 1, 8, 64, K = N = 4096 | `x.matmul(&w_i)`, cycling through 4 weights (256 MiB) so each comes from DRAM | reading the same weights (sum), same threads: read bandwidth | >= 1.0x PyTorch; M = 1 at >= 90% of read bandwidth |
//! | GEMM + bias + relu 1024^3 | `(a.matmul(&b) + bias).relu()`, one fused kernel | the same three ops realized one by one in kiln; PyTorch in the compare script | >= 1.1x PyTorch matmul then add and relu |
//! | tuned vs default | the tuned winner | the untuned default (best analytic score) | never slower beyond noise |
//! | warm vs cold first step | first step of the benchmark MLP (batch 128) in a process that imported a bundle | the same in a cold process with tuning on (`KILN_AUTOTUNE=fast`, empty cache) | >= 20x faster |
//!
//! Each file that includes this uses a subset of it, hence `dead_code`.
#![allow(dead_code)]

use kiln::{Device, Tensor};
use std::hint::black_box;
use std::time::{Duration, Instant};

pub const SKINNY_K: usize = 4096;
pub const SKINNY_N: usize = 4096;
/// Weights cycled by the skinny workloads: 4 x 64 MiB, far beyond any cache here (32 MiB L3).
pub const SKINNY_WEIGHTS: usize = 4;

#[path = "../common/mod.rs"]
mod common;
// Each includer uses a subset (as with the rest of this file).
#[allow(unused_imports)]
pub use common::{FMA_ITERS, fma_peak_avx512_gflops, fma_peak_gflops, loadavg, median, threads};

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * (2 * seed + 7) + seed) % 61) as f32 / 30.5 - 1.0).collect()
}

pub fn tensor(rows: usize, cols: usize, seed: usize) -> Tensor {
    Tensor::from_vec(values(rows * cols, seed), [rows, cols], &Device::cpu()).expect("upload")
}

/// Seconds of one build + realize; the output is dropped after the clock stops.
pub fn timed(build: impl FnOnce() -> Tensor) -> f64 {
    let t0 = Instant::now();
    let y = build();
    y.realize().expect("realize");
    let s = t0.elapsed().as_secs_f64();
    drop(black_box(y));
    s
}

/// The `gemm` crate on `m x k` @ `k x n` (row-major, f32), columns split over `threads` scoped threads, each
/// calling the library single-threaded (as kiln's library candidate does).
pub fn library_gemm(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize, threads: usize) {
    let strips = threads.min(n.div_ceil(16)).max(1);
    let cols_per = n.div_ceil(strips);
    let c_ptr = c.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..strips {
            let n0 = (t * cols_per).min(n);
            let n1 = ((t + 1) * cols_per).min(n);
            if n0 == n1 {
                continue;
            }
            s.spawn(move || {
                // SAFETY: a is m x k, b is k x n, c is m x n, all row-major and alive for the scope; threads write
                // disjoint column strips of c.
                unsafe {
                    gemm::gemm(
                        m,
                        n1 - n0,
                        k,
                        (c_ptr as *mut f32).add(n0),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        1,
                        k as isize,
                        b.as_ptr().add(n0),
                        1,
                        n as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            });
        }
    });
}

/// Seconds to read `data` once (a sum over `threads` chunks): the read-bandwidth baseline.
pub fn read_once(data: &[f32], threads: usize) -> f64 {
    let t0 = Instant::now();
    let chunk = data.len().div_ceil(threads);
    let total: f32 = std::thread::scope(|s| {
        let hs: Vec<_> = data
            .chunks(chunk)
            .map(|c| {
                s.spawn(move || {
                    let mut acc = [0f32; 16];
                    for blk in c.chunks_exact(16) {
                        for (a, x) in acc.iter_mut().zip(blk) {
                            *a += x;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    });
    black_box(total);
    t0.elapsed().as_secs_f64()
}

/// The first training step of the benchmark MLP (784 -> 256 -> 128 -> 10, no bias, leaky relu, MSE-sum, SGD lr
/// 1e-3, as `examples/train_mlp.rs`) at `batch`, in a fresh process state: its seconds, compile and tuning included.
pub fn mlp_first_step(batch: usize) -> Duration {
    use kiln::nn::{self, Param};
    kiln::manual_seed(0);
    let dev = Device::cpu();
    let layer = |name: &str, i: usize, o: usize| Param::new(name, nn::init::kaiming_normal([o, i], i, &dev));
    let w = [layer("w1", 784, 256), layer("w2", 256, 128), layer("w3", 128, 10)];
    let x = tensor(batch, 784, 1);
    let t = tensor(batch, 10, 2) * 0.1;
    kiln::realize(&[&x, &t]).expect("inputs");
    for p in &w {
        p.get().realize().expect("params");
    }
    use kiln::optim::Optimizer;
    let mut opt = kiln::optim::Sgd::new(w.to_vec(), 1e-3);
    let t0 = Instant::now();
    let h = nn::functional::leaky_relu(&x.matmul(&w[0].get().t()), 0.01);
    let h = nn::functional::leaky_relu(&h.matmul(&w[1].get().t()), 0.01);
    let loss = (h.matmul(&w[2].get().t()) - &t).square().sum_all();
    let grads = loss.backward().expect("backward");
    opt.step(grads, &[&loss]).expect("step");
    t0.elapsed()
}
