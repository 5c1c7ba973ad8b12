#!/usr/bin/env python3
"""torch.linalg (LAPACK) and kiln::linalg on the rows of examples/bench_linalg.rs, f32, in one session.

Each of `--rounds R` (default 3) runs `cargo run --release --example bench_linalg -- --json` and then PyTorch's
`torch.linalg.solve` / `inv` / `cholesky` on the same shapes (matrices `rand + n I`; Cholesky of `a^T a`), close in
time. Every figure is the median of `--runs` calls after two warm-up calls; the table gives each side's median over
the rounds and the ratio of the medians (PyTorch time / kiln time, so > 1 means kiln is faster), with the per-round
ratios' range in brackets.

    python3 benches/compare/linalg_torch.py [--threads T] [--runs N] [--rounds R]

Threads: T (default 2): torch.set_num_threads(T), and kiln runs with KILN_NUM_THREADS=T. See README.md here for
installing PyTorch.
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
# (name, batch, order, function): examples/bench_linalg.rs's ROWS, in order.
ROWS = [
    ("solve 64", 1, 64, "solve"),
    ("inv 64", 1, 64, "inv"),
    ("cholesky 64", 1, 64, "cholesky"),
    ("solve 256", 1, 256, "solve"),
    ("inv 256", 1, 256, "inv"),
    ("cholesky 256", 1, 256, "cholesky"),
    ("solve 512", 1, 512, "solve"),
    ("inv 512", 1, 512, "inv"),
    ("cholesky 512", 1, 512, "cholesky"),
    ("solve 4096 x 8x8", 4096, 8, "solve"),
]


def torch_times(torch, runs: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, batch, n, fn in ROWS:
        a = torch.rand(batch, n, n, generator=g) + n * torch.eye(n)
        b = torch.rand(batch, n, 1, generator=g)
        spd = a.mT @ a

        def call():
            if fn == "solve":
                torch.linalg.solve(a, b)
            elif fn == "inv":
                torch.linalg.inv(a)
            else:
                torch.linalg.cholesky(spd)

        call()
        call()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def kiln_times(runs: int, threads: int) -> dict[str, float]:
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    proc = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", "bench_linalg", "--", "--json", "--runs", str(runs)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: see benches/compare/README.md", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "bench_linalg"], cwd=ROOT, check=True)
    rounds = []
    for _ in range(args.rounds):
        k = kiln_times(args.runs, args.threads)
        t = torch_times(torch, args.runs)
        rounds.append((k, t))
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print("| function | PyTorch ms | kiln ms | kiln / PyTorch |")
    print("|---|---|---|---|")
    for name, *_ in ROWS:
        ks = [k[name] for k, _ in rounds]
        ts = [t[name] for _, t in rounds]
        ratios = [b / a for a, b in zip(ks, ts)]
        km, tm = statistics.median(ks), statistics.median(ts)
        print(
            f"| {name} | {tm * 1e3:.3f} | {km * 1e3:.3f} | {tm / km:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] |"
        )


if __name__ == "__main__":
    main()
