//! The workloads of kiln's CPU benchmark suite and their same-run baselines, shared by `benches/cpu.rs`
//! (criterion) and `examples/bench_table.rs` (quick medians), so both measure exactly the same thing.
//!
//! | workload | kiln measures | same-run baseline | target |
//! |---|---|---|---|
//! | `a * b + c`, 16M f32 | build the lazy graph + realize (plan-cache hit + kernel), 16 B/elem | STREAM triad `a = b + s*c` in plain Rust, in place, 12 B/elem | >= 85 % of triad GB/s |
//! | `sin(a)^2 * b + c`, 16M f32 | same unit as above | Rust `f32::sin` loop, same threads; torch.compile anchor 34.6 ms | <= 17.3 ms (2x torch.compile) |
//! | replay, cached 50-node graph, 1-elem | `realize()` of an already built graph (cache hit) | building the graph alone | <= 5 µs per realize |
//! | compile one fused kernel | `realize()` of a graph whose constant changes each time (cache miss) | `realize()` of the same graph on a hit | median <= 2 ms |
//! | matmul 1024^3 f32 | build + realize | peak f32 FMA throughput in plain Rust (AVX2+FMA) | report GFLOP/s |
//!
//! Rust baselines use as many threads as kiln's pool (`KILN_NUM_THREADS`, default all cores), via
//! `std::thread::scope`. Outputs of timed kiln realizations are dropped outside the timed region; the cost of
//! dropping a 64 MiB output is reported separately by the table (`drop_s`).
//!
//! Each of the two crates that include this file uses a subset of it, hence `dead_code`.
#![allow(dead_code)]

use kiln::{Device, Tensor};
use kiln_backends::cpu::isa::{self, Isa};
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Elements of the streaming workloads (16M f32 = 64 MiB per array).
pub const N: usize = 16 << 20;
/// `a * b + c`: three arrays read, one written.
pub const CHAIN_BYTES_PER_ELEM: usize = 16;
/// STREAM's count for triad: two arrays read, one written (write-allocate traffic not counted, as in STREAM).
pub const TRIAD_BYTES_PER_ELEM: usize = 12;
/// `sin(a)^2 * b + c`: counted like the chain.
pub const SIN_BYTES_PER_ELEM: usize = 16;
/// torch.compile (default mode, 2 threads, no THP) on `sin(a)**2 * b + c` over 16M f32 on this machine:
/// 34.6 ms, a reference figure measured on an idle machine and recorded in docs/benchmarks.md. Not a same-run figure.
pub const TORCH_COMPILE_SIN_MS: f64 = 34.6;
/// Lazy nodes in the replay graph.
pub const REPLAY_NODES: usize = 50;
/// Graphs built per timed batch in the replay measurements.
pub const REPLAY_BATCH: usize = 32;
/// Side of the square matmul.
pub const MATMUL_N: usize = 1024;
/// Flops of one `MATMUL_N`^3 matmul.
pub const MATMUL_FLOPS: f64 = 2.0 * (MATMUL_N * MATMUL_N * MATMUL_N) as f64;

/// Threads kiln's CPU pool uses (env `KILN_NUM_THREADS`, default all cores); the Rust baselines use as many.
pub fn threads() -> usize {
    kiln_backends::cpu::pool::default_threads()
}

/// The 1-minute load average, to print next to timings (this machine is shared).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub fn median(xs: &[f64]) -> f64 {
    assert!(!xs.is_empty(), "median of no samples");
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { 0.5 * (v[m - 1] + v[m]) }
}

// ---------------------------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------------------------

/// Deterministic inputs: `a` spans about [-3, 3] (so `sin` sees a realistic range), `b` and `c` are small positive.
pub fn host_inputs(n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let a = (0..n).map(|i| ((i % 4096) as f32 / 4096.0 - 0.5) * 6.0).collect();
    let b = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    let c = (0..n).map(|i| (i % 13) as f32 * 0.1).collect();
    (a, b, c)
}

/// Realized kiln tensors holding `host_inputs(n)`.
pub struct Inputs {
    pub a: Tensor,
    pub b: Tensor,
    pub c: Tensor,
}

impl Inputs {
    pub fn new(n: usize) -> Inputs {
        let dev = Device::cpu();
        let (a, b, c) = host_inputs(n);
        let t = |v: Vec<f32>| Tensor::from_vec(v, [n], &dev).expect("input upload");
        Inputs { a: t(a), b: t(b), c: t(c) }
    }
}

pub fn chain(a: &Tensor, b: &Tensor, c: &Tensor) -> Tensor {
    a * b + c
}

pub fn sin_chain(a: &Tensor, b: &Tensor, c: &Tensor) -> Tensor {
    a.sin().square() * b + c
}

/// Builds a graph with `build` and realizes it; returns the time of both together and the realized tensor (for
/// the caller to drop outside the timed region).
pub fn timed_realize(build: impl FnOnce() -> Tensor) -> (Duration, Tensor) {
    timed(|| {
        let y = build();
        y.realize().expect("realize");
        y
    })
}

/// How long `f` took, and its result (dropped by the caller, after the clock stopped).
pub fn timed<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t0 = Instant::now();
    let y = f();
    (t0.elapsed(), y)
}

// ---------------------------------------------------------------------------------------------------------------
// Plain-Rust baselines
// ---------------------------------------------------------------------------------------------------------------

/// Calls `f(offset, chunk)` on `threads` contiguous chunks of `out`, one per thread (the caller takes the first).
pub fn par_chunks(out: &mut [f32], threads: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = out.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let mut chunks = out.chunks_mut(chunk).enumerate();
        let first = chunks.next();
        for (i, ch) in chunks {
            let f = &f;
            s.spawn(move || f(i * chunk, ch));
        }
        if let Some((i, ch)) = first {
            f(i * chunk, ch);
        }
    });
}

/// STREAM-style arrays in host memory, already touched (no page faults in the timed loops).
pub struct Stream {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
    /// Output of `chain`, so that its three inputs are left as they are.
    pub d: Vec<f32>,
    pub threads: usize,
}

impl Stream {
    pub fn new(n: usize, threads: usize) -> Stream {
        let (a, b, c) = host_inputs(n);
        Stream { a, b, c, d: vec![1.0; n], threads }
    }

    /// kiln's first workload in plain Rust: `d = a * b + c` into an existing buffer (16 B/elem, like kiln's).
    pub fn chain(&mut self) {
        let (a, b, c) = (&self.a, &self.b, &self.c);
        par_chunks(&mut self.d, self.threads, |off, out| {
            let r = off..off + out.len();
            for (((o, &x), &y), &z) in out.iter_mut().zip(&a[r.clone()]).zip(&b[r.clone()]).zip(&c[r]) {
                *o = x * y + z;
            }
        });
        black_box(&mut self.d);
    }

    /// STREAM triad in place: `a[i] = b[i] + s * c[i]`.
    pub fn triad(&mut self) {
        let (b, c, s) = (&self.b, &self.c, 3.0f32);
        par_chunks(&mut self.a, self.threads, |off, out| {
            let (b, c) = (&b[off..off + out.len()], &c[off..off + out.len()]);
            for ((o, &x), &y) in out.iter_mut().zip(b).zip(c) {
                *o = x + s * y;
            }
        });
        black_box(&mut self.a);
    }

    /// The triad into a freshly allocated output, as kiln's realize does today: measures what page faults on a
    /// new 64 MiB buffer cost. Returns the output so the caller can drop it outside the timed region.
    pub fn triad_fresh(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.b.len()];
        let (b, c, s) = (&self.b, &self.c, 3.0f32);
        par_chunks(&mut out, self.threads, |off, out| {
            let (b, c) = (&b[off..off + out.len()], &c[off..off + out.len()]);
            for ((o, &x), &y) in out.iter_mut().zip(b).zip(c) {
                *o = x + s * y;
            }
        });
        black_box(out)
    }

    /// `a = sin(b)^2 * c + b` with Rust's `f32::sin` (the platform libm; not vectorized), in place, into `a`.
    pub fn sin_chain(&mut self) {
        let (b, c) = (&self.b, &self.c);
        par_chunks(&mut self.a, self.threads, |off, out| {
            let (b, c) = (&b[off..off + out.len()], &c[off..off + out.len()]);
            for ((o, &x), &y) in out.iter_mut().zip(b).zip(c) {
                let s = x.sin();
                *o = s * s * y + x;
            }
        });
        black_box(&mut self.a);
    }
}

/// Peak f32 multiply-add throughput of `threads` threads each running `iters` rounds of the FMA chains kiln measures
/// its own peaks with (`kiln_backends::cpu::isa::fma_chains`) at `isa`'s width; GFLOP/s, or `None` where the CPU
/// lacks `isa`.
fn fma_peak(isa: Isa, threads: usize, iters: u64) -> Option<f64> {
    isa.present().then_some(())?;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || black_box(isa::fma_chains(isa, black_box(iters))));
        }
    });
    Some(threads as f64 * isa::fma_flops(isa, iters) / t0.elapsed().as_secs_f64() / 1e9)
}

/// [`fma_peak`] with 8-lane AVX2 FMAs (`None` where the CPU lacks AVX2/FMA).
pub fn fma_peak_gflops(threads: usize, iters: u64) -> Option<f64> {
    fma_peak(Isa::Avx2, threads, iters)
}

/// Flops of one `fma_peak_gflops(threads, iters)` call.
pub fn fma_flops(threads: usize, iters: u64) -> f64 {
    threads as f64 * isa::fma_flops(Isa::Avx2, iters)
}

/// [`fma_peak`] with 16-lane AVX-512 FMAs, or `None` where the CPU lacks AVX-512F. On a CPU that splits 512-bit FMAs
/// into two 256-bit halves (AMD Zen 4) it equals the AVX2 figure; on one with two 512-bit FMA units (Intel Xeon) it
/// is about twice that.
pub fn fma_peak_avx512_gflops(threads: usize, iters: u64) -> Option<f64> {
    fma_peak(Isa::Avx512, threads, iters)
}

/// The FMA peak of the widest family kiln's kernels may use here: the AVX-512 figure where the CPU has it and
/// `KILN_CPU_ISA` is not `avx2`, if higher, else the AVX2 one (`iters` 8-lane rounds' worth of time).
pub fn kernel_fma_peak_gflops(threads: usize, iters: u64) -> Option<f64> {
    let avx2 = fma_peak_gflops(threads, iters)?;
    if std::env::var("KILN_CPU_ISA").is_ok_and(|v| v.trim() == "avx2") {
        return Some(avx2);
    }
    Some(fma_peak_avx512_gflops(threads, iters / 2).map_or(avx2, |p| p.max(avx2)))
}

/// FMA rounds per call of `fma_peak_gflops` that take about 0.1 s per thread at ~3 GHz.
pub const FMA_ITERS: u64 = 25_000_000;

// ---------------------------------------------------------------------------------------------------------------
// Replay of a cached graph
// ---------------------------------------------------------------------------------------------------------------

/// Two realized 1-element inputs from which `build` records `REPLAY_NODES` lazy nodes: ten rounds of
/// `y = tanh(y * w + 0.5) - x` (mul, const, add, tanh, sub: unary, binary-with-tensor and binary-with-scalar ops).
/// Every build has the same signature, so after the first realize each one is a plan-cache hit.
pub struct Replay {
    pub x: Tensor,
    pub w: Tensor,
}

impl Replay {
    pub fn new() -> Replay {
        let dev = Device::cpu();
        let x = Tensor::from_vec(vec![0.25f32], [1], &dev).expect("upload");
        let w = Tensor::from_vec(vec![0.9f32], [1], &dev).expect("upload");
        Replay { x, w }
    }

    pub fn build(&self) -> Tensor {
        let mut y = self.x.clone();
        for _ in 0..REPLAY_NODES / 5 {
            y = ((&y * &self.w) + 0.5).tanh() - &self.x;
        }
        y
    }

    /// Lazy nodes one `build` records (`REPLAY_NODES` unless the op constructors change what they record).
    pub fn nodes_per_build(&self) -> usize {
        let before = kiln::stats().live_nodes;
        let y = self.build();
        let n = kiln::stats().live_nodes - before;
        drop(y);
        n
    }

    /// One timed batch of `k` graphs: (seconds per build, seconds per realize). Building and realizing are timed
    /// separately; dropping the results is not timed.
    pub fn batch(&self, k: usize) -> (f64, f64) {
        let t0 = Instant::now();
        let graphs: Vec<Tensor> = (0..k).map(|_| self.build()).collect();
        let build = t0.elapsed();
        let t1 = Instant::now();
        for g in &graphs {
            g.realize().expect("realize");
        }
        let realize = t1.elapsed();
        drop(graphs);
        (build.as_secs_f64() / k as f64, realize.as_secs_f64() / k as f64)
    }
}

impl Default for Replay {
    fn default() -> Self {
        Replay::new()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Compile time
// ---------------------------------------------------------------------------------------------------------------

/// Benchmarks time compilation, so they must not find a previous run's kernels in the persistent kernel cache
/// (the constants of [`Compile::fresh`] restart at 2 in every process): unless the user chose a cache dir, the
/// process runs with `KILN_CACHE_DIR=off` (memory only; GEMMs are tuned in process, outside the timed calls). Call
/// first thing in `main`.
pub fn memory_only_cache_unless_chosen() {
    if std::env::var_os("KILN_CACHE_DIR").is_none() {
        // SAFETY: called at the start of `main`, before this process starts any other thread.
        unsafe { std::env::set_var("KILN_CACHE_DIR", "off") };
    }
}

/// Distinct constants across the whole process, so no two compile measurements share a signature or a kernel.
static NEXT_CONSTANT: AtomicU64 = AtomicU64::new(0);

/// `(a * k).sin().square() * b + c` on 1-element tensors: one fused kernel of six ops. `fresh` uses a new `k`
/// each call (an integer, exact in f32, so the kernel IR text and with it the kernel cache key differ too) and so
/// misses both the plan cache and the kernel cache; `same` uses a fixed `k` and hits.
pub struct Compile {
    pub a: Tensor,
    pub b: Tensor,
    pub c: Tensor,
}

impl Compile {
    pub fn new() -> Compile {
        let dev = Device::cpu();
        let t = |v: f32| Tensor::from_vec(vec![v], [1], &dev).expect("upload");
        Compile { a: t(0.5), b: t(2.0), c: t(0.25) }
    }

    fn graph(&self, k: f64) -> Tensor {
        (&self.a * k).sin().square() * &self.b + &self.c
    }

    pub fn fresh(&self) -> Tensor {
        let k = NEXT_CONSTANT.fetch_add(1, Ordering::Relaxed) as f64 + 2.0;
        assert!(k < (1u64 << 24) as f64, "constants stay exact in f32");
        self.graph(k)
    }

    pub fn same(&self) -> Tensor {
        self.graph(1.0)
    }
}

impl Default for Compile {
    fn default() -> Self {
        Compile::new()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------------------------------

/// Two realized `MATMUL_N x MATMUL_N` f32 matrices with values in [-1, 1).
/// Rows of the row-wise workloads: softmax over each row of 4096 x 1024 f32 (an attention score matrix's shape),
/// and GELU (tanh form) over the same 4M elements.
pub const ROWS: usize = 4096;
pub const COLS: usize = 1024;

/// Logit-like values in [-4, 4), the same in PyTorch's script (`benches/compare/torch_cpu.py`).
pub fn rows_host() -> Vec<f32> {
    (0..ROWS * COLS).map(|i| ((i * 7 + 3) % 97) as f32 / 12.0 - 4.0).collect()
}

pub fn rows_input() -> Tensor {
    Tensor::from_vec(rows_host(), [ROWS, COLS], &Device::cpu()).expect("upload")
}

pub fn softmax_rows(x: &Tensor) -> Tensor {
    x.softmax(-1)
}

pub fn gelu_tanh(x: &Tensor) -> Tensor {
    kiln::nn::functional::gelu(x, kiln::nn::functional::Approximate::Tanh)
}

/// `log_softmax` over the rows.
pub fn log_softmax_rows(x: &Tensor) -> Tensor {
    x.log_softmax(-1)
}

/// `layer_norm` over each row's 1024 values, no affine parameters, eps 1e-5 (PyTorch's default).
pub fn layer_norm_rows(x: &Tensor) -> Tensor {
    kiln::nn::functional::layer_norm(x, &[COLS], None, None, 1e-5)
}

/// The class of row `r` for the cross-entropy workload: `(7 * r) % COLS`, the same in `torch_cpu.py`.
pub fn rows_targets() -> Tensor {
    let t: Vec<i64> = (0..ROWS as i64).map(|r| 7 * r % COLS as i64).collect();
    Tensor::from_vec(t, [ROWS], &Device::cpu()).expect("upload")
}

/// A batch of vocabulary logits, as a sampler sorts them (`sort` and `topk` rows).
pub const VOCAB_ROWS: usize = 16;
pub const VOCAB: usize = 32000;
/// The `k` of the `topk` row.
pub const TOPK: usize = 50;

/// Near-distinct values in [-160, 167.5), the same in PyTorch's script (`benches/compare/torch_cpu.py`).
pub fn vocab_input() -> Tensor {
    let v: Vec<f32> = (0..VOCAB_ROWS * VOCAB).map(|i| ((i * 7919 + 13) % 32749) as f32 / 100.0 - 160.0).collect();
    Tensor::from_vec(v, [VOCAB_ROWS, VOCAB], &Device::cpu()).expect("upload")
}

/// Mean cross-entropy of the rows as logits against [`rows_targets`].
pub fn cross_entropy_rows(x: &Tensor, targets: &Tensor) -> Tensor {
    kiln::nn::functional::cross_entropy(x, targets, kiln::nn::Reduction::Mean)
}

/// The row workloads in plain Rust (`f32::exp` / `f32::tanh` from the platform libm, scalar), rows split over the
/// threads, into an existing buffer.
pub struct RowsRust {
    pub x: Vec<f32>,
    pub out: Vec<f32>,
    pub threads: usize,
}

impl RowsRust {
    pub fn new(threads: usize) -> RowsRust {
        RowsRust { x: rows_host(), out: vec![1.0; ROWS * COLS], threads }
    }

    /// Calls `f(first row, rows of out)` on whole rows, one block per thread.
    fn par_rows(&mut self, f: impl Fn(&[f32], &mut [f32]) + Sync) {
        let per = ROWS.div_ceil(self.threads.max(1)) * COLS;
        let x = &self.x;
        std::thread::scope(|s| {
            for (i, out) in self.out.chunks_mut(per).enumerate() {
                let f = &f;
                let x = &x[i * per..i * per + out.len()];
                s.spawn(move || f(x, out));
            }
        });
    }

    pub fn softmax(&mut self) {
        self.par_rows(|x, out| {
            for (xr, or) in x.chunks(COLS).zip(out.chunks_mut(COLS)) {
                let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = (v - m).exp();
                    sum += *o;
                }
                for o in or.iter_mut() {
                    *o /= sum;
                }
            }
        });
        black_box(&mut self.out);
    }

    pub fn gelu(&mut self) {
        const K: f32 = 0.797_884_6; // sqrt(2 / pi)
        self.par_rows(|x, out| {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = 0.5 * v * (1.0 + (K * (v + 0.044_715 * v * v * v)).tanh());
            }
        });
        black_box(&mut self.out);
    }
}

pub fn matmul_inputs() -> (Tensor, Tensor) {
    let dev = Device::cpu();
    let n = MATMUL_N;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7 + 3) % 61) as f32 / 30.5 - 1.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 13 + 5) % 47) as f32 / 23.5 - 1.0).collect();
    let a = Tensor::from_vec(a, [n, n], &dev).expect("upload");
    let b = Tensor::from_vec(b, [n, n], &dev).expect("upload");
    (a, b)
}

// ---------------------------------------------------------------------------------------------------------------
// Correctness: a benchmark of a wrong result is worthless, so every workload is checked once before timing.
// ---------------------------------------------------------------------------------------------------------------

fn close(got: f32, want: f64, tol: f64, what: &str, i: usize) {
    let err = (got as f64 - want).abs();
    assert!(err <= tol * (1.0 + want.abs()), "{what}: element {i} is {got}, expected {want} (|err| {err:e})");
}

/// Checks sampled elements of every workload against an f64 reference; panics on a mismatch.
pub fn verify() {
    let n = 1 << 16;
    let (ha, hb, hc) = host_inputs(n);
    let inp = Inputs::new(n);
    let y = chain(&inp.a, &inp.b, &inp.c).to_vec::<f32>().expect("chain");
    let s = sin_chain(&inp.a, &inp.b, &inp.c).to_vec::<f32>().expect("sin chain");
    for i in (0..n).step_by(997) {
        let (a, b, c) = (ha[i] as f64, hb[i] as f64, hc[i] as f64);
        close(y[i], a * b + c, 1e-6, "a * b + c", i);
        close(s[i], a.sin().powi(2) * b + c, 1e-5, "sin(a)^2 * b + c", i);
    }

    let r = Replay::new();
    let mut want = 0.25f64;
    for _ in 0..REPLAY_NODES / 5 {
        want = (want * 0.9f32 as f64 + 0.5).tanh() - 0.25;
    }
    close(r.build().item::<f32>().expect("replay"), want, 1e-5, "replay graph", 0);

    let c = Compile::new();
    let k = 1.0f64;
    close(
        c.same().item::<f32>().expect("compile graph"),
        (0.5 * k).sin().powi(2) * 2.0 + 0.25,
        1e-6,
        "compile graph",
        0,
    );

    let x = rows_host();
    let sm = softmax_rows(&rows_input()).to_vec::<f32>().expect("softmax");
    let ge = gelu_tanh(&rows_input()).to_vec::<f32>().expect("gelu");
    for r in [0, 1, 2047, ROWS - 1] {
        let row = &x[r * COLS..(r + 1) * COLS];
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
        let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for j in [0, 5, 500, COLS - 1] {
            let i = r * COLS + j;
            close(sm[i], (x[i] as f64 - m).exp() / z, 1e-6, "softmax", i);
            let v = x[i] as f64;
            let want = 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
            close(ge[i], want, 1e-5, "gelu", i);
        }
    }

    let (a, b) = matmul_inputs();
    let m = MATMUL_N;
    let got = a.matmul(&b).to_vec::<f32>().expect("matmul");
    let (ha, hb) = (a.to_vec::<f32>().expect("a"), b.to_vec::<f32>().expect("b"));
    for &(i, j) in &[(0, 0), (1, 517), (m - 1, m - 1), (400, 3), (777, 1000)] {
        let want: f64 = (0..m).map(|k| ha[i * m + k] as f64 * hb[k * m + j] as f64).sum();
        close(got[i * m + j], want, 1e-4, "matmul", i * m + j);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The summary table
// ---------------------------------------------------------------------------------------------------------------

/// Medians in seconds (per call), `None` where a measurement was not run (e.g. filtered out of a criterion run).
#[derive(Clone, Debug, Default)]
pub struct Results {
    pub threads: usize,
    pub chain_s: Option<f64>,
    pub triad_s: Option<f64>,
    pub triad_fresh_s: Option<f64>,
    /// `d = a * b + c` in plain Rust, into an existing buffer.
    pub chain_rust_s: Option<f64>,
    /// Dropping the realized 64 MiB output of the chain (not part of `chain_s`).
    pub drop_s: Option<f64>,
    pub sin_s: Option<f64>,
    pub sin_rust_s: Option<f64>,
    pub replay_realize_s: Option<f64>,
    pub replay_build_s: Option<f64>,
    pub replay_nodes: usize,
    pub compile_s: Option<f64>,
    pub compile_hit_s: Option<f64>,
    /// Cranelift compiles (`kiln::stats().kernel_compiles`) the compile measurements caused, and how many
    /// realizations they timed (equal when every timed realize compiled its kernel).
    pub compiles: u64,
    pub compile_calls: u64,
    pub matmul_s: Option<f64>,
    pub fma_gflops: Option<f64>,
    /// Softmax over the rows of `ROWS x COLS`, and GELU (tanh) over as many elements: kiln, and plain Rust.
    pub softmax_s: Option<f64>,
    pub softmax_rust_s: Option<f64>,
    pub gelu_s: Option<f64>,
    pub gelu_rust_s: Option<f64>,
    /// log_softmax and layer_norm over the rows, and their mean cross-entropy against class indices: kiln only
    /// (PyTorch's figures come from the compare script).
    pub log_softmax_s: Option<f64>,
    pub layer_norm_s: Option<f64>,
    pub cross_entropy_s: Option<f64>,
    /// A descending sort and a `topk` of [`vocab_input`]'s rows (the values realized): kiln only.
    pub sort_s: Option<f64>,
    pub topk_s: Option<f64>,
}

fn gbs(bytes_per_elem: usize, s: f64) -> f64 {
    (bytes_per_elem * N) as f64 / s / 1e9
}

fn yes(ok: bool) -> &'static str {
    if ok { "yes" } else { "**no**" }
}

const NA: &str = "n/a";

impl Results {
    /// The medians as one line of JSON (seconds per call; `null` where not measured), for scripts such as
    /// `benches/compare/torch_cpu.py`.
    pub fn to_json(&self) -> String {
        let f = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:e}"));
        format!(
            "{{\"threads\": {}, \"n\": {N}, \"chain_s\": {}, \"triad_s\": {}, \"triad_fresh_s\": {}, \
             \"chain_rust_s\": {}, \"drop_s\": {}, \"sin_s\": {}, \"sin_rust_s\": {}, \"replay_realize_s\": {}, \
             \"replay_build_s\": {}, \"replay_nodes\": {}, \"compile_s\": {}, \"compile_hit_s\": {}, \
             \"compiles\": {}, \"compile_calls\": {}, \"matmul_s\": {}, \"matmul_n\": {MATMUL_N}, \
             \"fma_gflops\": {}, \"softmax_s\": {}, \"softmax_rust_s\": {}, \"gelu_s\": {}, \"gelu_rust_s\": {}, \
             \"log_softmax_s\": {}, \"layer_norm_s\": {}, \"cross_entropy_s\": {}, \"rows\": {ROWS}, \"cols\": {COLS}, \
             \"sort_s\": {}, \"topk_s\": {}, \"vocab_rows\": {VOCAB_ROWS}, \"vocab\": {VOCAB}, \"topk\": {TOPK}}}",
            self.threads,
            f(self.chain_s),
            f(self.triad_s),
            f(self.triad_fresh_s),
            f(self.chain_rust_s),
            f(self.drop_s),
            f(self.sin_s),
            f(self.sin_rust_s),
            f(self.replay_realize_s),
            f(self.replay_build_s),
            self.replay_nodes,
            f(self.compile_s),
            f(self.compile_hit_s),
            self.compiles,
            self.compile_calls,
            f(self.matmul_s),
            f(self.fma_gflops),
            f(self.softmax_s),
            f(self.softmax_rust_s),
            f(self.gelu_s),
            f(self.gelu_rust_s),
            f(self.log_softmax_s),
            f(self.layer_norm_s),
            f(self.cross_entropy_s),
            f(self.sort_s),
            f(self.topk_s),
        )
    }

    /// One markdown table: benchmark | kiln | baseline | ratio | target | met?
    pub fn table(&self) -> String {
        let mut t = String::new();
        let row = |t: &mut String, cells: [String; 6]| {
            let _ = writeln!(t, "| {} |", cells.join(" | "));
        };
        let s = |x: &str| x.to_string();
        row(&mut t, ["benchmark", "kiln", "baseline (same run unless noted)", "ratio", "target", "met?"].map(s));
        let _ = writeln!(t, "|---|---|---|---|---|---|");
        let th = self.threads;

        match (self.chain_s, self.triad_s) {
            (Some(k), Some(b)) => {
                let (kg, bg) = (gbs(CHAIN_BYTES_PER_ELEM, k), gbs(TRIAD_BYTES_PER_ELEM, b));
                let r = kg / bg;
                row(
                    &mut t,
                    [
                        format!("`a * b + c`, 16M f32, {th}T (16 B/elem)"),
                        format!("{kg:.1} GB/s ({:.1} ms)", k * 1e3),
                        format!("STREAM triad, Rust, {th}T, in place: {bg:.1} GB/s ({:.1} ms)", b * 1e3),
                        format!("{:.0} % of triad", r * 100.0),
                        s(">= 85 %"),
                        s(yes(r >= 0.85)),
                    ],
                );
            }
            _ => row(&mut t, [s("`a * b + c`, 16M f32"), s(NA), s(NA), s(NA), s(">= 85 %"), s(NA)]),
        }
        if let (Some(k), Some(c)) = (self.chain_s, self.chain_rust_s) {
            let (kg, cg) = (gbs(CHAIN_BYTES_PER_ELEM, k), gbs(CHAIN_BYTES_PER_ELEM, c));
            row(
                &mut t,
                [
                    s("(info) same op in plain Rust, existing output"),
                    format!("{kg:.1} GB/s"),
                    format!("Rust `d = a * b + c`, {th}T: {cg:.1} GB/s ({:.1} ms)", c * 1e3),
                    format!("{:.0} %", kg / cg * 100.0),
                    s("-"),
                    s("-"),
                ],
            );
        }
        if let (Some(f), Some(b)) = (self.triad_fresh_s, self.triad_s) {
            let (fg, bg) = (gbs(TRIAD_BYTES_PER_ELEM, f), gbs(TRIAD_BYTES_PER_ELEM, b));
            row(
                &mut t,
                [
                    s("(info) triad into a fresh 64 MiB Vec each call"),
                    format!("{fg:.1} GB/s ({:.1} ms), Rust", f * 1e3),
                    format!("triad in place {bg:.1} GB/s"),
                    format!("{:.0} %", fg / bg * 100.0),
                    s("-"),
                    s("-"),
                ],
            );
        }
        if let Some(d) = self.drop_s {
            row(
                &mut t,
                [
                    s("(info) dropping a realized 64 MiB output"),
                    format!("{:.1} ms (not in the chain time)", d * 1e3),
                    s("-"),
                    s("-"),
                    s("-"),
                    s("-"),
                ],
            );
        }

        match self.sin_s {
            Some(k) => {
                let speedup = TORCH_COMPILE_SIN_MS / (k * 1e3);
                row(
                    &mut t,
                    [
                        format!("`sin(a)^2 * b + c`, 16M f32, {th}T"),
                        format!("{:.1} ms ({:.1} GB/s)", k * 1e3, gbs(SIN_BYTES_PER_ELEM, k)),
                        format!("torch.compile 2T: {TORCH_COMPILE_SIN_MS} ms (reference file, not this run)"),
                        format!("{speedup:.2}x faster"),
                        format!(">= 2x (<= {:.1} ms)", TORCH_COMPILE_SIN_MS / 2.0),
                        s(yes(speedup >= 2.0)),
                    ],
                );
                if let Some(r) = self.sin_rust_s {
                    row(
                        &mut t,
                        [
                            s("(info) same, vs plain Rust `f32::sin` loop"),
                            format!("{:.1} ms", k * 1e3),
                            format!("Rust {th}T, in place: {:.1} ms ({:.1} GB/s)", r * 1e3, gbs(SIN_BYTES_PER_ELEM, r)),
                            format!("{:.2}x faster", r / k),
                            s("-"),
                            s("-"),
                        ],
                    );
                }
            }
            None => row(&mut t, [s("`sin(a)^2 * b + c`, 16M f32"), s(NA), s(NA), s(NA), s(">= 2x"), s(NA)]),
        }

        match (self.replay_realize_s, self.replay_build_s) {
            (Some(r), Some(b)) => row(
                &mut t,
                [
                    format!("replay, cached {}-node graph, 1-elem tensors", self.replay_nodes),
                    format!("{:.2} µs per realize", r * 1e6),
                    format!("building the graph alone: {:.2} µs", b * 1e6),
                    format!("{:.1}x build", r / b),
                    s("<= 5 µs"),
                    s(yes(r <= 5e-6)),
                ],
            ),
            _ => row(&mut t, [s("replay, cached 50-node graph"), s(NA), s(NA), s(NA), s("<= 5 µs"), s(NA)]),
        }

        match self.compile_s {
            Some(c) => {
                let hit = self.compile_hit_s;
                row(
                    &mut t,
                    [
                        s("compile one fused kernel (6 ops, 1-elem, cache miss)"),
                        format!(
                            "median {:.2} ms ({} Cranelift compiles in {} realizes)",
                            c * 1e3,
                            self.compiles,
                            self.compile_calls
                        ),
                        hit.map_or(s(NA), |h| format!("same graph, cache hit: {:.2} µs", h * 1e6)),
                        hit.map_or(s(NA), |h| format!("{:.0}x a hit", c / h)),
                        s("median <= 2 ms"),
                        s(yes(c <= 2e-3 && self.compiles == self.compile_calls)),
                    ],
                );
            }
            None => row(&mut t, [s("compile one fused kernel"), s(NA), s(NA), s(NA), s("<= 2 ms"), s(NA)]),
        }

        match self.matmul_s {
            Some(m) => {
                let g = MATMUL_FLOPS / m / 1e9;
                row(
                    &mut t,
                    [
                        format!("matmul 1024^3 f32, {th}T"),
                        format!("{g:.1} GFLOP/s ({:.0} ms)", m * 1e3),
                        self.fma_gflops
                            .map_or(s("FMA peak: n/a"), |p| format!("FMA peak, Rust, {th}T: {p:.0} GFLOP/s")),
                        self.fma_gflops.map_or(s(NA), |p| format!("{:.1} % of peak", g / p * 100.0)),
                        s("report (torch 2T: 172, gemm crate 2T: 120, reference)"),
                        s("-"),
                    ],
                );
            }
            None => row(&mut t, [s("matmul 1024^3 f32"), s(NA), s(NA), s(NA), s("report"), s(NA)]),
        }

        let rows_gbs = |x: f64| (8 * ROWS * COLS) as f64 / x / 1e9;
        for (label, k, b, what) in [
            ("softmax over rows", self.softmax_s, self.softmax_rust_s, "max, exp, sum, divide per row"),
            ("GELU (tanh form)", self.gelu_s, self.gelu_rust_s, "one pass"),
        ] {
            match (k, b) {
                (Some(k), Some(b)) => row(
                    &mut t,
                    [
                        format!("{label}, {ROWS} x {COLS} f32, {th}T"),
                        format!("{:.2} ms ({:.1} GB/s read + written)", k * 1e3, rows_gbs(k)),
                        format!("Rust libm, {th}T, {what}, existing output: {:.2} ms", b * 1e3),
                        format!("{:.2}x faster", b / k),
                        s("report (PyTorch: compare script)"),
                        s("-"),
                    ],
                ),
                _ => row(&mut t, [format!("{label}, {ROWS} x {COLS} f32"), s(NA), s(NA), s(NA), s("report"), s(NA)]),
            }
        }
        for (label, k) in [
            ("log_softmax over rows", self.log_softmax_s),
            ("layer_norm over rows", self.layer_norm_s),
            ("cross_entropy (mean, class indices)", self.cross_entropy_s),
            ("sort, descending", self.sort_s),
            ("topk", self.topk_s),
        ] {
            let time = k.map_or(s(NA), |k| format!("{:.2} ms", k * 1e3));
            let shape = if label.starts_with("sort") || label.starts_with("topk") {
                let k = if label == "topk" { format!("k = {TOPK}, ") } else { s("") };
                format!("{k}{VOCAB_ROWS} x {VOCAB}")
            } else {
                format!("{ROWS} x {COLS}")
            };
            row(
                &mut t,
                [
                    format!("{label}, {shape} f32, {th}T"),
                    time,
                    s("-"),
                    s("-"),
                    s("report (PyTorch: compare script)"),
                    s("-"),
                ],
            );
        }
        t
    }
}
