#!/usr/bin/env python3
"""Issue 5's GEMM targets: PyTorch `matmul` (eager) against kiln's tuned GEMM, one session, one table.

Workloads (the same shapes and value patterns as `benches/gemm_common/mod.rs`):
- f32 GEMM 1024^3 and 2048^3: `a @ b`;
- M = 1, 8, 64 with K = N = 4096: `x @ w_i`, cycling through 4 weights of 64 MiB so each comes from DRAM;
- GEMM + bias + relu 1024^3: kiln's fused kernel against PyTorch's `torch.relu(a @ b + bias)` (three ops);
- bf16 GEMM 1024^3 and 2048^3, and M = 8, 64 against bf16 weights from DRAM: PyTorch's bf16 `matmul`.
Every figure is a median of --runs calls after a warm-up. kiln's figures come from
`cargo run --release --example bench_gemm -- --json` run in the same session (its table is printed after ours).

Rounds: the development host has slow phases of tens of seconds that hit kiln and PyTorch independently, so the
comparison runs `--rounds R` times (default 3), PyTorch then kiln close in time in each; the table gives each
side's median over the rounds, the ratio of those medians and, in brackets, the range of the per-round ratios.

    python3 benches/compare/gemm_torch.py [--threads T] [--runs N] [--rounds R] [--skip-kiln]

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

from rounds import median_time

ROOT = Path(__file__).resolve().parents[2]


def values(torch, n: int, seed: int):
    i = torch.arange(n, dtype=torch.int64)
    return (((i * (2 * seed + 7) + seed) % 61).to(torch.float32) / 30.5 - 1.0)


def torch_figures(torch, runs: int) -> dict:
    out = {}
    k = nn = 4096
    weights = [values(torch, k * nn, 10 + i).reshape(k, nn) for i in range(4)]
    # f32, then bf16 operands (PyTorch's bf16 matmul: oneDNN, AMX where the CPU exposes it).
    for prefix, dtype, skinny_ms in (("", torch.float32, (1, 8, 64)), ("bf16_", torch.bfloat16, (8, 64))):
        for n in (1024, 2048):
            a = values(torch, n * n, 1).reshape(n, n).to(dtype)
            b = values(torch, n * n, 2).reshape(n, n).to(dtype)
            s = median_time(lambda: a @ b, runs if n == 1024 else max(3, runs // 2), warmup=1)
            out[f"{prefix}gemm{n}_gflops"] = 2 * n**3 / s / 1e9
        ws = [w.to(dtype) for w in weights]
        for m in skinny_ms:
            x = values(torch, m * k, 3).reshape(m, k).to(dtype)
            state = {"j": 0}

            def call():
                state["j"] += 1
                return x @ ws[state["j"] % 4]

            s = median_time(call, max(runs, 8), warmup=1)
            out[f"{prefix}skinny{m}_gflops"] = 2 * m * nn * k / s / 1e9
        del ws
    del weights
    n = 1024
    a = values(torch, n * n, 1).reshape(n, n)
    b = values(torch, n * n, 2).reshape(n, n)
    bias = values(torch, n, 5)
    out["fused1024_ms"] = median_time(lambda: torch.relu(a @ b + bias), runs, warmup=1) * 1e3
    out["matmul1024_ms"] = 2 * n**3 / out["gemm1024_gflops"] / 1e9 * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-kiln", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: see benches/compare/README.md", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rounds = []
    kiln_table = ""
    for r in range(args.rounds):
        t = torch_figures(torch, args.runs)
        # PyTorch's OpenMP threads keep spinning for a while after their work and would steal kiln's cores.
        time.sleep(1.0)
        kiln = None
        if not args.skip_kiln:
            env = dict(os.environ, KILN_NUM_THREADS=str(args.threads))
            cmd = ["cargo", "run", "--release", "--quiet", "--example", "bench_gemm", "--", "--json", "--runs",
                   str(args.runs)]
            res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                print(res.stdout + res.stderr, file=sys.stderr)
                return 1
            lines = res.stdout.strip().splitlines()
            kiln = json.loads(lines[-1])
            kiln_table = "\n".join(lines[:-1])
        rounds.append((t, kiln))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    med = statistics.median

    def torch_med(key: str) -> float:
        return med(t[key] for t, _ in rounds)

    def kiln_med(key: str) -> float | None:
        return None if args.skip_kiln else med(k[key] for _, k in rounds)

    def ratio(kiln_over_torch) -> str:
        per_round = [kiln_over_torch(t, k) for t, k in rounds]
        return f"[{min(per_round):.2f}-{max(per_round):.2f}]"

    print(f"PyTorch {torch.__version__} vs kiln, {args.threads} threads, medians of {args.runs}, {args.rounds} rounds "
          f"(medians over rounds, [range of per-round ratios]); load average {load:.2f} at the start\n")
    print("| benchmark | PyTorch | kiln | kiln / PyTorch | target |")
    print("|---|---|---|---|---|")
    rows = [
        ("f32 GEMM 1024^3", "gemm1024_gflops", "GFLOP/s", ">= 1.0x"),
        ("f32 GEMM 2048^3", "gemm2048_gflops", "GFLOP/s", ">= 1.0x"),
        ("M = 1, K = N = 4096, weights from DRAM", "skinny1_gflops", "GFLOP/s", ">= 1.0x"),
        ("M = 8, K = N = 4096, weights from DRAM", "skinny8_gflops", "GFLOP/s", ">= 1.0x"),
        ("M = 64, K = N = 4096, weights from DRAM", "skinny64_gflops", "GFLOP/s", ">= 1.0x"),
        ("bf16 GEMM 1024^3", "bf16_gemm1024_gflops", "GFLOP/s", ">= 1.0x"),
        ("bf16 GEMM 2048^3", "bf16_gemm2048_gflops", "GFLOP/s", ">= 1.0x"),
        ("bf16, M = 8, K = N = 4096, weights from DRAM", "bf16_skinny8_gflops", "GFLOP/s", ">= 1.0x"),
        ("bf16, M = 64, K = N = 4096, weights from DRAM", "bf16_skinny64_gflops", "GFLOP/s", ">= 1.0x"),
    ]
    for name, key, unit, target in rows:
        tm, k = torch_med(key), kiln_med(key)
        if k is None:
            print(f"| {name} | {tm:.1f} {unit} | - | - | {target} |")
            continue
        spread = ratio(lambda t, kl, key=key: kl[key] / t[key])
        print(f"| {name} | {tm:.1f} {unit} | {k:.1f} {unit} | {k / tm:.2f}x {spread} | {target} |")
    if not args.skip_kiln:
        fused, tf, tm = kiln_med("fused1024_ms"), torch_med("fused1024_ms"), torch_med("matmul1024_ms")
        spread = ratio(lambda t, kl: t["fused1024_ms"] / kl["fused1024_ms"])
        print(
            f"| GEMM + bias + relu 1024^3 | matmul + add + relu: {tf:.2f} ms (matmul alone {tm:.2f} ms) "
            f"| fused: {fused:.2f} ms | {tf / fused:.2f}x faster {spread} | >= 1.1x |"
        )
    if kiln_table:
        print("\nkiln's own table (same session, last round):\n")
        print(kiln_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
