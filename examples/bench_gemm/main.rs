//! Issue 5's GEMM benchmarks in one table: square and skinny GEMMs, the fused epilogue, tuned against untuned,
//! and a warm process's first step against a cold one's, each with a baseline measured in the same run.
//!
//! `cargo run --release --example bench_gemm [-- --runs N] [--json]`
//! `cargo run --release --features cuda --example bench_gemm -- --device cuda [--runs N] [--json]`: the GPU shapes
//! (`device.rs`), without the CPU's baselines; `benches/compare/gpu_torch.py` adds PyTorch's on the same GPU.
//!
//! The first run on a machine tunes each shape (the cache lives under `KILN_CACHE_DIR`); later runs reuse the
//! winners. PyTorch's figures come from `benches/compare/gemm_torch.py`, which runs this with `--json`. Read the
//! ratios, not the absolute figures, on a shared machine; the load average is printed with the table.

mod device;
#[path = "../../benches/gemm_common/mod.rs"]
mod gemm_common;

use gemm_common::*;
use std::process::Command;

/// kiln's GEMM benchmark table: square and skinny GEMMs, the fused epilogue, tuned against untuned, and a warm
/// process's first step against a cold one's, each against a baseline measured in the same run.
#[derive(clap::Parser)]
#[command(name = "bench_gemm")]
struct Args {
    /// Runs per row (the table gives medians; at least 3).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(3..))]
    runs: u32,
    /// Also print the medians as one JSON line (what benches/compare/gemm_torch.py reads).
    #[arg(long)]
    json: bool,
    /// `cpu` (the table below, with its baselines), or a GPU device (`cuda`, `hip`, `wgpu`): its GEMM shapes.
    #[arg(long, default_value = "cpu")]
    device: kiln::Device,
    /// Internal: run as the child that times one first step.
    #[arg(long, hide = true)]
    child_first_step: bool,
    /// Internal, with --child-first-step: import this bundle first.
    #[arg(long, hide = true)]
    import: Option<std::path::PathBuf>,
}

fn gflops(m: usize, n: usize, k: usize, s: f64) -> f64 {
    2.0 * (m * n * k) as f64 / s / 1e9
}

/// Runs this example as a child that measures one first step; returns its seconds.
fn child_first_step(cache: &std::path::Path, bundle: Option<&std::path::Path>) -> f64 {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.arg("--child-first-step").env("KILN_CACHE_DIR", cache).env("KILN_AUTOTUNE", "fast");
    if let Some(b) = bundle {
        cmd.arg("--import").arg(b);
    }
    let out = cmd.output().expect("spawn child");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("FIRST_STEP_S ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("child failed: {text}{}", String::from_utf8_lossy(&out.stderr)))
}

fn main() {
    let args: Args = clap::Parser::parse();
    if args.child_first_step {
        let t0 = std::time::Instant::now();
        if let Some(b) = &args.import {
            kiln::tune::import_bundle(b).expect("import");
        }
        let import = t0.elapsed().as_secs_f64();
        let before = kiln::stats();
        let t = mlp_first_step(128).as_secs_f64();
        let s = kiln::stats();
        println!("FIRST_STEP_S {t}");
        eprintln!(
            "first step {:.2} ms (import {:.1} ms): {} tunings, {} GEMM generations, {} GEMM loads, {} compiles, {} kernel \
             loads, {} plan misses",
            t * 1e3,
            import * 1e3,
            s.tunings,
            s.tuned_kernel_compiles,
            s.tuned_kernel_loads,
            s.kernel_compiles,
            s.kernel_loads,
            s.plan_misses - before.plan_misses
        );
        return;
    }
    let runs = args.runs as usize;
    if args.device != kiln::Device::cpu() {
        if let Err(e) = device::run(&args.device, runs, args.json) {
            eprintln!("bench_gemm on {}: {e}", args.device);
            std::process::exit(1);
        }
        return;
    }
    let threads = threads();
    let load = loadavg();
    let mut rows: Vec<String> = Vec::new();
    let mut json: Vec<String> = Vec::new();

    // Square GEMMs against the gemm crate on the same threads.
    for n in [1024usize, 2048] {
        let reps = if n == 2048 { runs.div_ceil(2) } else { runs };
        let (a, b) = (tensor(n, n, 1), tensor(n, n, 2));
        let _ = timed(|| a.matmul(&b)); // compile (and tune, on a cold cache)
        let kiln_s = median(&(0..reps).map(|_| timed(|| a.matmul(&b))).collect::<Vec<_>>());
        let (ha, hb) = (values(n * n, 1), values(n * n, 2));
        let mut hc = vec![0f32; n * n];
        let lib_s = median(
            &(0..reps)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    library_gemm(&ha, &hb, &mut hc, n, n, n, threads);
                    t0.elapsed().as_secs_f64()
                })
                .collect::<Vec<_>>(),
        );
        let (kg, lg) = (gflops(n, n, n, kiln_s), gflops(n, n, n, lib_s));
        rows.push(format!(
            "| f32 GEMM {n}^3 | {kg:.1} GFLOP/s ({:.2} ms) | gemm crate: {lg:.1} GFLOP/s | {:.2}x | >= 1.0x PyTorch (compare script) |",
            kiln_s * 1e3,
            kg / lg
        ));
        json.push(format!("\"gemm{n}_gflops\": {kg:.2}"));
    }

    // What the two kernel families can reach here: the FMA peak with 8-lane and 16-lane FMAs, same threads.
    let avx2 = median(&(0..3).map(|_| fma_peak_gflops(threads, FMA_ITERS / 4).unwrap_or(0.0)).collect::<Vec<_>>());
    match fma_peak_avx512_gflops(threads, FMA_ITERS / 8) {
        Some(_) => {
            let avx512 = median(
                &(0..3).map(|_| fma_peak_avx512_gflops(threads, FMA_ITERS / 8).unwrap_or(0.0)).collect::<Vec<_>>(),
            );
            rows.push(format!(
                "| (info) FMA peak, AVX2 vs AVX-512 | AVX2: {avx2:.1} GFLOP/s | AVX-512: {avx512:.1} GFLOP/s | {:.2}x | the tuner races both families |",
                avx512 / avx2
            ));
        }
        None => rows.push(format!("| (info) FMA peak, AVX2 | {avx2:.1} GFLOP/s | no AVX-512 here | - | - |")),
    }

    // Skinny GEMMs with weights cycled from DRAM, against the read bandwidth of the same weights.
    let weights: Vec<kiln::Tensor> = (0..SKINNY_WEIGHTS).map(|i| tensor(SKINNY_K, SKINNY_N, 10 + i)).collect();
    let host_w: Vec<Vec<f32>> = (0..SKINNY_WEIGHTS).map(|i| values(SKINNY_K * SKINNY_N, 10 + i)).collect();
    let w_bytes = (SKINNY_K * SKINNY_N * 4) as f64;
    for m in [1usize, 8, 64] {
        let x = tensor(m, SKINNY_K, 3);
        for w in &weights {
            let _ = timed(|| x.matmul(w));
        }
        // The read baseline interleaved with the GEMM, call by call: this host's DRAM bandwidth moves by 1.5x
        // within minutes (27 to 54 GB/s in one session), so a baseline measured before the GEMMs compared them
        // with another moment's memory system.
        let (mut reads, mut gemms) = (Vec::new(), Vec::new());
        for j in 0..runs.max(8) {
            reads.push(read_once(&host_w[j % SKINNY_WEIGHTS], threads));
            gemms.push(timed(|| x.matmul(&weights[(j + 1) % SKINNY_WEIGHTS])));
        }
        let (read_s, s) = (median(&reads), median(&gemms));
        let read_gbs = w_bytes / read_s / 1e9;
        let gbs = w_bytes / s / 1e9;
        rows.push(format!(
            "| M = {m}, K = N = 4096, weights from DRAM | {:.1} GFLOP/s, weights at {gbs:.1} GB/s ({:.2} ms) | read bandwidth: {read_gbs:.1} GB/s | {:.0} % of read BW | >= 1.0x PyTorch{} |",
            gflops(m, SKINNY_N, SKINNY_K, s),
            s * 1e3,
            100.0 * gbs / read_gbs,
            if m == 1 { "; >= 90 % of read BW" } else { "" }
        ));
        json.push(format!("\"skinny{m}_gflops\": {:.2}", gflops(m, SKINNY_N, SKINNY_K, s)));
    }
    drop(weights);
    drop(host_w);

    // GEMM + bias + relu: one fused kernel against the same ops realized one at a time.
    let n = 1024;
    let (a, b) = (tensor(n, n, 1), tensor(n, n, 2));
    let bias = kiln::Tensor::from_vec(values(n, 5), [n], &kiln::Device::cpu()).expect("bias");
    let fused = || timed(|| (a.matmul(&b) + &bias).relu());
    let unfused = || {
        let t0 = std::time::Instant::now();
        let y = a.matmul(&b);
        y.realize().expect("mm");
        let y = &y + &bias;
        y.realize().expect("add");
        let y = y.relu();
        y.realize().expect("relu");
        t0.elapsed().as_secs_f64()
    };
    let _ = (fused(), unfused());
    let (f, u) = (
        median(&(0..runs).map(|_| fused()).collect::<Vec<_>>()),
        median(&(0..runs).map(|_| unfused()).collect::<Vec<_>>()),
    );
    rows.push(format!(
        "| GEMM + bias + relu 1024^3, fused | {:.2} ms | matmul, add, relu realized one by one in kiln: {:.2} ms | {:.2}x | >= 1.1x PyTorch matmul + add + relu |",
        f * 1e3,
        u * 1e3,
        u / f
    ));
    json.push(format!("\"fused1024_ms\": {:.3}", f * 1e3));

    // bf16 operands (f32 accumulation, one rounding): square, and skinny against bf16 weights cycled from DRAM.
    // PyTorch's bf16 `matmul` is the baseline, in the compare script.
    let bf16 = |t: kiln::Tensor| {
        let t = t.to_dtype(kiln::DType::BF16);
        t.realize().expect("bf16 operand");
        t
    };
    for n in [1024usize, 2048] {
        let reps = if n == 2048 { runs.div_ceil(2) } else { runs };
        let (a, b) = (bf16(tensor(n, n, 1)), bf16(tensor(n, n, 2)));
        let _ = timed(|| a.matmul(&b));
        let s = median(&(0..reps).map(|_| timed(|| a.matmul(&b))).collect::<Vec<_>>());
        rows.push(format!(
            "| bf16 GEMM {n}^3 | {:.1} GFLOP/s ({:.2} ms) | - | - | >= 1.0x PyTorch bf16 (compare script) |",
            gflops(n, n, n, s),
            s * 1e3
        ));
        json.push(format!("\"bf16_gemm{n}_gflops\": {:.2}", gflops(n, n, n, s)));
    }
    let weights: Vec<kiln::Tensor> = (0..SKINNY_WEIGHTS).map(|i| bf16(tensor(SKINNY_K, SKINNY_N, 10 + i))).collect();
    for m in [8usize, 64] {
        let x = bf16(tensor(m, SKINNY_K, 3));
        for w in &weights {
            let _ = timed(|| x.matmul(w));
        }
        let s = median(&(0..runs.max(8)).map(|j| timed(|| x.matmul(&weights[j % SKINNY_WEIGHTS]))).collect::<Vec<_>>());
        rows.push(format!(
            "| bf16, M = {m}, K = N = 4096, weights from DRAM | {:.1} GFLOP/s ({:.2} ms) | - | - | >= 1.0x PyTorch bf16 |",
            gflops(m, SKINNY_N, SKINNY_K, s),
            s * 1e3
        ));
        json.push(format!("\"bf16_skinny{m}_gflops\": {:.2}", gflops(m, SKINNY_N, SKINNY_K, s)));
    }
    drop(weights);

    // Tuned winner against the untuned default (best analytic score), on the kernels of this process's plans.
    for (m, n, k) in [(1024usize, 1024usize, 1024usize), (32, 256, 784), (1, 4096, 4096)] {
        let (x, w) = (tensor(m, k, 1), tensor(k, n, 2));
        let y = x.matmul(&w);
        let cap = kiln::capture(&[&y]).expect("capture");
        let plan = kiln_jit::kernel::schedule_with(
            &cap.graph,
            kiln_jit::kernel::ScheduleOptions { transpose_copy: false, ..Default::default() },
        );
        let kernel = &plan.launches.last().expect("a launch").kernel;
        let view = kiln_jit::kernel::gemm::GemmView::of(kernel).expect("a GEMM");
        y.realize().expect("realize (tunes on a cold cache)");
        let store = kiln_autotune::Store::global();
        let key = kiln_backends::cpu::gemm::tune::problem(
            kernel,
            &view,
            threads,
            &store.fingerprint().id(),
            Default::default(),
        )
        .key;
        let tuned = store
            .get_record(&key)
            .and_then(|r| kiln_backends::cpu::gemm::config::GemmImpl::parse(&r.winner))
            .expect("a tuning record");
        let default = kiln_backends::cpu::gemm::tune::analytic_best(&view, threads).expect("a default");
        let inputs: Vec<&kiln::HostBuffer> = cap.inputs.iter().collect();
        // Interleaved reps (the order alternating), as the tuner times candidates: a burst of host noise then hits
        // both alike instead of deciding the ratio.
        let build = |imp| kiln_backends::cpu::PreparedGemm::new(kernel, imp).expect("build");
        let gs = [build(tuned), build(default)];
        let mut times = [Vec::new(), Vec::new()];
        for g in &gs {
            let _ = g.run(&inputs);
        }
        for r in 0..runs {
            for i in [r % 2, 1 - r % 2] {
                let t0 = std::time::Instant::now();
                let out = gs[i].run(&inputs).expect("run");
                times[i].push(t0.elapsed().as_secs_f64());
                drop(out);
            }
        }
        let (ts, ds) = (median(&times[0]), median(&times[1]));
        rows.push(format!(
            "| tuned vs default {m}x{n}x{k} | {} {:.1} GFLOP/s | default {} {:.1} GFLOP/s | {:.2}x | never slower beyond noise |",
            tuned.name(),
            gflops(m, n, k, ts),
            default.name(),
            gflops(m, n, k, ds),
            ds / ts
        ));
    }

    // A warm process (imported bundle) against a cold one with tuning on, first training step: medians over
    // CHILDREN processes of each, interleaved (one child's first step is a single sample, and on this VM it is
    // bimodal: ~1.4 ms when the pool's worker starts at once, ~2 ms when it does not and the caller runs the
    // step's GEMMs alone). The bundle comes from the first cold child's cache.
    const CHILDREN: usize = 5;
    let dir = |what: &str, i: usize| std::env::temp_dir().join(format!("kiln-bench-{what}{i}-{}", std::process::id()));
    let fp = kiln_autotune::DeviceFingerprint::host_cpu();
    let bundle = dir("bundle", 0).with_extension("kiln");
    let (mut colds, mut warms) = (Vec::new(), Vec::new());
    for i in 0..CHILDREN {
        let (cold_dir, warm_dir) = (dir("cold", i), dir("warm", i));
        let _ = std::fs::remove_dir_all(&cold_dir);
        let _ = std::fs::remove_dir_all(&warm_dir);
        colds.push(child_first_step(&cold_dir, None));
        if i == 0 {
            kiln_autotune::Store::open(cold_dir.clone(), &fp).export_bundle(&bundle).expect("export");
        }
        warms.push(child_first_step(&warm_dir, Some(&bundle)));
        let _ = std::fs::remove_dir_all(&cold_dir);
        let _ = std::fs::remove_dir_all(&warm_dir);
    }
    let _ = std::fs::remove_file(&bundle);
    let (cold, warm) = (median(&colds), median(&warms));
    rows.push(format!(
        "| first step, MLP batch 128: warm process (imported bundle), median of {CHILDREN} | {:.2} ms | cold process, empty cache, KILN_AUTOTUNE=fast: {:.2} ms | {:.1}x faster | >= 20x |",
        warm * 1e3,
        cold * 1e3,
        cold / warm
    ));

    println!(
        "kiln GEMM benchmarks: {threads} threads, medians of {runs} runs; load average {load} before, {} after\n",
        loadavg()
    );
    println!("| benchmark | kiln | baseline (same run) | ratio | target |\n|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    if args.json {
        println!("{{{}}}", json.join(", "));
    }
}
