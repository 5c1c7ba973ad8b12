//! `bench_gemm --device D` for a device other than the CPU (CUDA, HIP, wgpu): the GPU issue's GEMM shapes through
//! kiln's API, each timed as build + realize + `Device::synchronize` (so a queued GPU is waited for), median of the
//! runs after one untimed run that compiles (and tunes): f32 and (where the device holds them) bf16 and f16
//! squares, decode shapes M = 8..64 with K = N = 4096, and GEMM + bias + gelu (tanh) at M = 16, K = N = 4096.
//!
//! No baseline is measured here: the same shapes through `torch.matmul` on the same GPU, in the same run, come from
//! `benches/compare/gpu_torch.py`, which runs this with `--json` and prints the ratios.

use kiln::nn::functional::{Approximate, gelu};
use kiln::{DType, Device, Tensor};
use std::time::Instant;

/// Deterministic values in [-1, 1) as a `rows x cols` tensor of `dtype` on `dev`, realized.
fn operand(rows: usize, cols: usize, seed: usize, dtype: DType, dev: &Device) -> kiln::Result<Tensor> {
    let vals = (0..rows * cols).map(|i| ((i * (2 * seed + 7) + seed) % 61) as f32 / 30.5 - 1.0).collect();
    let t = Tensor::from_vec(vals, [rows, cols], dev)?.to_dtype(dtype);
    t.realize()?;
    Ok(t)
}

/// Median seconds of `runs` builds + realizes of `build` on `dev`, after one untimed.
fn median_time(dev: &Device, runs: usize, build: impl Fn() -> Tensor) -> kiln::Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for i in 0..=runs {
        let t0 = Instant::now();
        let y = build();
        y.realize()?;
        dev.synchronize()?;
        if i > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Prints the device table (and, with `json`, its medians in ms as one JSON line: `f32_sq1024_ms`, `bf16_m8_ms`,
/// `f32_gelu16_ms`, ...).
pub fn run(dev: &Device, runs: usize, json: bool) -> kiln::Result<()> {
    let mut rows = Vec::new();
    let mut keys = Vec::new();
    let mut row = |name: String, key: String, flops: f64, s: f64| {
        rows.push(format!("| {name} | {:.3} ms | {:.1} GFLOP/s |", s * 1e3, flops / s / 1e9));
        keys.push(format!("\"{key}_ms\": {:.4}", s * 1e3));
    };
    // bf16 and f16 where the device holds them (wgpu has no bf16).
    for dtype in [DType::F32, DType::BF16, DType::F16].into_iter().filter(|&d| dev.supports(d)) {
        for n in [1024usize, 2048, 4096] {
            let (a, b) = (operand(n, n, 1, dtype, dev)?, operand(n, n, 2, dtype, dev)?);
            let s = median_time(dev, runs, || a.matmul(&b))?;
            row(format!("{dtype} GEMM {n}^3"), format!("{dtype}_sq{n}"), 2.0 * (n * n * n) as f64, s);
        }
        let (k, n) = (4096usize, 4096usize);
        let w = operand(k, n, 3, dtype, dev)?;
        for m in [8usize, 16, 32, 64] {
            let x = operand(m, k, 4, dtype, dev)?;
            let s = median_time(dev, runs, || x.matmul(&w))?;
            row(format!("{dtype} decode M = {m}, K = N = {k}"), format!("{dtype}_m{m}"), 2.0 * (m * n * k) as f64, s);
        }
        let (x, bias) = (operand(16, k, 5, dtype, dev)?, operand(1, n, 6, dtype, dev)?);
        let s = median_time(dev, runs, || gelu(&(x.matmul(&w) + &bias), Approximate::Tanh))?;
        row(format!("{dtype} GEMM + bias + gelu, M = 16"), format!("{dtype}_gelu16"), 2.0 * (16 * n * k) as f64, s);
    }
    println!("kiln GEMMs on {}: medians of {runs} runs (build + realize + synchronize)\n", dev.describe());
    println!("| benchmark | kiln | |\n|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    if json {
        println!("{{{}}}", keys.join(", "));
    }
    Ok(())
}
