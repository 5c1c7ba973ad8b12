"""What the comparison scripts that race a kiln example's `--json` rows against PyTorch share: timing a call, running
the example, and the rounds with their table (conv_torch.py, linalg_torch.py; gemm_torch.py and torch_cpu.py time
their calls with it).

The host alternates between fast and slow phases, so each round runs kiln's example and then PyTorch's rows close
in time; the table gives each side's median over the rounds and the ratio of the medians (PyTorch time / kiln
time, > 1 meaning kiln is faster), with the per-round ratios' range in brackets.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def median_time(call: Callable[[], object], runs: int, warmup: int = 2) -> float:
    """The median seconds of `runs` calls after `warmup` warm-up calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kiln_times(example: str, runs: int, threads: int) -> dict[str, float]:
    """The rows of `cargo run --release --example EXAMPLE -- --json --runs RUNS` (its last line), in seconds."""
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    proc = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", example, "--", "--json", "--runs", str(runs)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_torch(threads: int):
    """PyTorch with `threads` threads, or exit 2 saying how to install it."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: see benches/compare/README.md", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(threads)
    return torch


def race(
    example: str,
    torch,
    torch_times: Callable[[int], dict[str, float]],
    names: list[str],
    header: str,
    digits: int,
    args,
) -> None:
    """Builds `example`, runs `args.rounds` rounds of kiln's rows then `torch_times(args.runs)`, and prints the table
    (a row per name, times in ms with `digits` decimals; `header` names the first column)."""
    subprocess.run(["cargo", "build", "--quiet", "--release", "--example", example], cwd=ROOT, check=True)
    rounds = []
    for _ in range(args.rounds):
        rounds.append((kiln_times(example, args.runs, args.threads), torch_times(args.runs)))
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print(f"| {header} | PyTorch ms | kiln ms | kiln / PyTorch |")
    print("|---|---|---|---|")
    for name in names:
        ks = [k[name] for k, _ in rounds]
        ts = [t[name] for _, t in rounds]
        ratios = [b / a for a, b in zip(ks, ts)]
        km, tm = statistics.median(ks), statistics.median(ts)
        print(
            f"| {name} | {tm * 1e3:.{digits}f} | {km * 1e3:.{digits}f} | {tm / km:.2f}x "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] |"
        )
