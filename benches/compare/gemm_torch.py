#!/usr/bin/env python3
"""Issue 5's GEMM targets: PyTorch `matmul` (eager) against kiln's tuned GEMM, one session, one table.

Workloads (the same shapes and value patterns as `benches/gemm_common/mod.rs`):
- f32 GEMM 1024^3 and 2048^3: `a @ b`;
- M = 1, 8, 64 with K = N = 4096: `x @ w_i`, cycling through 4 weights of 64 MiB so each comes from DRAM;
- GEMM + bias + relu 1024^3: kiln's fused kernel against PyTorch's `torch.relu(a @ b + bias)` (three ops).
Every figure is a median of --runs calls after a warm-up. kiln's figures come from
`cargo run --release --example bench_gemm -- --json` run in the same session (its table is printed after ours).

    python3 benches/compare/gemm_torch.py [--threads T] [--runs N] [--skip-kiln]

Threads: T, else env KILN_NUM_THREADS, else all cores (torch.set_num_threads and KILN_NUM_THREADS alike). See
README.md in this folder for installing PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def values(torch, n: int, seed: int):
    i = torch.arange(n, dtype=torch.int64)
    return (((i * (2 * seed + 7) + seed) % 61).to(torch.float32) / 30.5 - 1.0)


def median_time(fn, runs: int) -> float:
    fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_figures(torch, runs: int) -> dict:
    out = {}
    for n in (1024, 2048):
        a = values(torch, n * n, 1).reshape(n, n)
        b = values(torch, n * n, 2).reshape(n, n)
        s = median_time(lambda: a @ b, runs if n == 1024 else max(3, runs // 2))
        out[f"gemm{n}_gflops"] = 2 * n**3 / s / 1e9
    k = nn = 4096
    weights = [values(torch, k * nn, 10 + i).reshape(k, nn) for i in range(4)]
    for m in (1, 8, 64):
        x = values(torch, m * k, 3).reshape(m, k)
        state = {"j": 0}

        def call():
            state["j"] += 1
            return x @ weights[state["j"] % 4]

        s = median_time(call, max(runs, 8))
        out[f"skinny{m}_gflops"] = 2 * m * nn * k / s / 1e9
    del weights
    n = 1024
    a = values(torch, n * n, 1).reshape(n, n)
    b = values(torch, n * n, 2).reshape(n, n)
    bias = values(torch, n, 5)
    out["fused1024_ms"] = median_time(lambda: torch.relu(a @ b + bias), runs) * 1e3
    out["matmul1024_ms"] = 2 * n**3 / out["gemm1024_gflops"] / 1e9 * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--skip-kiln", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: see benches/compare/README.md", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    t = torch_figures(torch, args.runs)
    kiln, kiln_table = None, ""
    if not args.skip_kiln:
        env = dict(os.environ, KILN_NUM_THREADS=str(args.threads))
        cmd = ["cargo", "run", "--release", "--quiet", "--example", "bench_gemm", "--", "--json", "--runs", str(args.runs)]
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return 1
        lines = res.stdout.strip().splitlines()
        kiln = json.loads(lines[-1])
        kiln_table = "\n".join(lines[:-1])
    print(f"PyTorch {torch.__version__} vs kiln, {args.threads} threads, medians of {args.runs}; load average {load:.2f}\n")
    print("| benchmark | PyTorch | kiln | kiln / PyTorch | target |")
    print("|---|---|---|---|---|")
    rows = [
        ("f32 GEMM 1024^3", "gemm1024_gflops", "GFLOP/s", ">= 0.95x"),
        ("f32 GEMM 2048^3", "gemm2048_gflops", "GFLOP/s", ">= 0.95x"),
        ("M = 1, K = N = 4096, weights from DRAM", "skinny1_gflops", "GFLOP/s", ">= 1.0x"),
        ("M = 8, K = N = 4096, weights from DRAM", "skinny8_gflops", "GFLOP/s", ">= 1.0x"),
        ("M = 64, K = N = 4096, weights from DRAM", "skinny64_gflops", "GFLOP/s", ">= 1.0x"),
    ]
    for name, key, unit, target in rows:
        k = kiln.get(key) if kiln else None
        ratio = f"{k / t[key]:.2f}x" if k else "-"
        ks = f"{k:.1f} {unit}" if k else "-"
        print(f"| {name} | {t[key]:.1f} {unit} | {ks} | {ratio} | {target} |")
    if kiln:
        fused = kiln["fused1024_ms"]
        print(
            f"| GEMM + bias + relu 1024^3 | matmul + add + relu: {t['fused1024_ms']:.2f} ms (matmul alone "
            f"{t['matmul1024_ms']:.2f} ms) | fused: {fused:.2f} ms | {t['fused1024_ms'] / fused:.2f}x faster | >= 1.1x |"
        )
    if kiln_table:
        print("\nkiln's own table (same session):\n")
        print(kiln_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
