//! kiln's CPU benchmark suite in a few seconds: the workloads of `benches/cpu.rs` (same code, from
//! `benches/common`), each with its same-run baseline, as medians of a few runs, printed as one markdown table.
//!
//! `cargo run --release --example bench_table [-- --runs N] [--json]`
//!
//! Unless `KILN_CACHE_DIR` is set, the run keeps no persistent cache (the compile row must compile, not map a previous
//! run's kernels from disk).
//!
//! `--json` adds one last line holding the medians as JSON (what `benches/compare/torch_cpu.py` reads).
//!
//! The machine this runs on may be shared and noisy: read the ratios (kiln against a baseline measured in the same
//! run, interleaved with it) rather than absolute figures, and rerun when the load average printed above the table is
//! high. `KILN_NUM_THREADS` sets kiln's thread count and the baselines'. For criterion's statistics run
//! `cargo bench --bench cpu`.

#[path = "../benches/common/mod.rs"]
mod common;

use common::*;
use std::time::Instant;

/// kiln's CPU benchmark table: each workload against a baseline measured in the same run.
#[derive(clap::Parser)]
#[command(name = "bench_table")]
struct Args {
    /// Runs per row (the table gives medians).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Also print the medians as one JSON line (what benches/compare/torch_cpu.py reads).
    #[arg(long)]
    json: bool,
}

fn main() {
    let args: Args = clap::Parser::parse();
    memory_only_cache_unless_chosen();
    let runs = args.runs as usize;
    let threads = threads();
    let load_before = loadavg();
    let t_start = Instant::now();
    verify();

    let mut r = Results { threads, ..Results::default() };

    // Streaming workloads: kiln and the Rust baselines interleaved, so load changes hit both alike.
    {
        let inp = Inputs::new(N);
        let mut st = Stream::new(N, threads);
        let (mut chain_s, mut sin_s, mut drop_s) = (vec![], vec![], vec![]);
        let (mut triad_s, mut fresh_s, mut sin_rust_s, mut chain_rust_s) = (vec![], vec![], vec![], vec![]);
        for i in 0..=runs {
            let (t, y) = timed_realize(|| chain(&inp.a, &inp.b, &inp.c));
            let (d, ()) = timed(|| drop(y));
            let (ts, y) = timed_realize(|| sin_chain(&inp.a, &inp.b, &inp.c));
            drop(y);
            let (tt, ()) = timed(|| st.triad());
            let (tf, out) = timed(|| st.triad_fresh());
            drop(out);
            let (tr, ()) = timed(|| st.sin_chain());
            let (tc, ()) = timed(|| st.chain());
            if i > 0 {
                // run 0 is warm-up (first compile, first touch of the baselines' pages)
                chain_s.push(t.as_secs_f64());
                drop_s.push(d.as_secs_f64());
                sin_s.push(ts.as_secs_f64());
                triad_s.push(tt.as_secs_f64());
                fresh_s.push(tf.as_secs_f64());
                sin_rust_s.push(tr.as_secs_f64());
                chain_rust_s.push(tc.as_secs_f64());
            }
        }
        r.chain_s = Some(median(&chain_s));
        r.drop_s = Some(median(&drop_s));
        r.sin_s = Some(median(&sin_s));
        r.triad_s = Some(median(&triad_s));
        r.triad_fresh_s = Some(median(&fresh_s));
        r.sin_rust_s = Some(median(&sin_rust_s));
        r.chain_rust_s = Some(median(&chain_rust_s));
    }

    // Replay of a cached graph.
    {
        let rp = Replay::new();
        r.replay_nodes = rp.nodes_per_build();
        rp.batch(16); // compiles the plan
        let (mut build, mut realize) = (vec![], vec![]);
        for _ in 0..runs.max(5) * 2 {
            let (b, z) = rp.batch(REPLAY_BATCH);
            build.push(b);
            realize.push(z);
        }
        r.replay_build_s = Some(median(&build));
        r.replay_realize_s = Some(median(&realize));
    }

    // Compile time: every realize misses the cache.
    {
        let cp = Compile::new();
        cp.fresh().realize().expect("warm-up compile");
        let (mut miss, mut hit) = (vec![], vec![]);
        let before = kiln::stats().kernel_compiles;
        let calls = (runs * 10).max(50);
        for _ in 0..calls {
            let g = cp.fresh();
            let t0 = Instant::now();
            g.realize().expect("realize");
            miss.push(t0.elapsed().as_secs_f64());
        }
        r.compiles = kiln::stats().kernel_compiles - before;
        r.compile_calls = calls as u64;
        cp.same().realize().expect("warm-up hit");
        for _ in 0..calls {
            let g = cp.same();
            let t0 = Instant::now();
            g.realize().expect("realize");
            hit.push(t0.elapsed().as_secs_f64());
        }
        r.compile_s = Some(median(&miss));
        r.compile_hit_s = Some(median(&hit));
    }

    // Matmul, interleaved with the FMA peak.
    {
        let (a, b) = matmul_inputs();
        let (mut mm, mut peak) = (vec![], vec![]);
        for i in 0..=runs.div_ceil(2).max(3) {
            let (t, y) = timed_realize(|| a.matmul(&b));
            drop(y);
            let p = kernel_fma_peak_gflops(threads, FMA_ITERS / 4);
            if i > 0 {
                mm.push(t.as_secs_f64());
                if let Some(p) = p {
                    peak.push(p);
                }
            }
        }
        r.matmul_s = Some(median(&mm));
        r.fma_gflops = (!peak.is_empty()).then(|| median(&peak));
    }

    // Row workloads: GELU interleaved with the Rust baselines; the row kernels interleaved with each other (one
    // input that stays in cache between them, as it does between the calls of `torch_cpu.py`'s loop of one op; a
    // Rust baseline's two 16 MiB buffers in between would evict it, and time memory instead of the kernels).
    {
        let x = rows_input();
        let mut rust = RowsRust::new(threads);
        let (mut smr, mut ge, mut ger) = (vec![], vec![], vec![]);
        for i in 0..=runs {
            let (tr, ()) = timed(|| rust.softmax());
            let (tg, y) = timed_realize(|| gelu_tanh(&x));
            drop(y);
            let (tgr, ()) = timed(|| rust.gelu());
            if i > 0 {
                smr.push(tr.as_secs_f64());
                ge.push(tg.as_secs_f64());
                ger.push(tgr.as_secs_f64());
            }
        }
        r.softmax_rust_s = Some(median(&smr));
        r.gelu_s = Some(median(&ge));
        r.gelu_rust_s = Some(median(&ger));
        let targets = rows_targets();
        let (mut sm, mut ls, mut ln, mut ce) = (vec![], vec![], vec![], vec![]);
        for i in 0..=runs {
            let (t0, y) = timed_realize(|| softmax_rows(&x));
            drop(y);
            let (t1, y) = timed_realize(|| log_softmax_rows(&x));
            drop(y);
            let (t2, y) = timed_realize(|| layer_norm_rows(&x));
            drop(y);
            let (t3, y) = timed_realize(|| cross_entropy_rows(&x, &targets));
            drop(y);
            if i > 0 {
                sm.push(t0.as_secs_f64());
                ls.push(t1.as_secs_f64());
                ln.push(t2.as_secs_f64());
                ce.push(t3.as_secs_f64());
            }
        }
        r.softmax_s = Some(median(&sm));
        r.log_softmax_s = Some(median(&ls));
        r.layer_norm_s = Some(median(&ln));
        r.cross_entropy_s = Some(median(&ce));
    }

    // Sorting a batch of vocabulary logits, and their top k (a sampler's work): the values (the indices are the sort
    // routine's output, computed either way).
    {
        let x = vocab_input();
        let (mut so, mut tk) = (vec![], vec![]);
        for i in 0..=runs {
            let (t0, y) = timed_realize(|| x.sort(-1, true).0);
            drop(y);
            let (t1, y) = timed_realize(|| x.topk(TOPK, -1, true).0);
            drop(y);
            if i > 0 {
                so.push(t0.as_secs_f64());
                tk.push(t1.as_secs_f64());
            }
        }
        r.sort_s = Some(median(&so));
        r.topk_s = Some(median(&tk));
    }

    println!(
        "kiln CPU benchmarks: {threads} threads, medians of {runs} runs; load average {load_before} before, {} after; \
         {:.1} s",
        loadavg(),
        t_start.elapsed().as_secs_f64()
    );
    println!();
    print!("{}", r.table());
    if args.json {
        println!("{}", r.to_json());
    }
}
