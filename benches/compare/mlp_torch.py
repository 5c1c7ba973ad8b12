#!/usr/bin/env python3
"""The seed's MLP training step in PyTorch eager, in torch.compile and in kiln, in one session, one table.

Model 784 -> 256 -> 128 -> 10, no bias, leaky_relu(0.01) after layers 1 and 2, Kaiming-normal init; loss
((out - t)^2).sum(); SGD lr 1e-3; f32; the same x (B x 784) and t (B x 10, scaled by 0.1) every step. A step is
zero_grad + forward + loss + backward + optimizer step. Timing: 10 warm-up steps, then the median of 100 steps;
"first step" is the first call (torch.compile compiles there, with a fresh Inductor cache). kiln runs
`cargo run --release --example train_mlp -- --batch B` and its printed line is parsed.

Rounds: the host this was written on alternates between fast and slow phases lasting tens of seconds, which hit
kiln and PyTorch independently, so one pass over kiln and then over PyTorch can give either side the slow phase
(one such pair of runs: 5.9x and 1.4x at batch 32). Each of `--rounds R` (default 3) runs, batch by batch, kiln's
step and then PyTorch's, close in time; the table gives each side's median over the rounds, the ratio of those
medians and, in brackets, the range of the per-round ratios. First steps are the first round's: kiln's cache and Inductor's start
empty there (later rounds find both warm).

    python3 benches/compare/mlp_torch.py [--threads T] [--batches 1,32,1024] [--rounds R] [--dtype f32|bf16] [--skip-kiln]

--dtype bf16: weights, x and t in bf16 on both sides, every op rounding to bf16 (PyTorch's bf16 tensors; kiln's
`train_mlp --dtype bf16`), SGD on the bf16 weights.

Threads: T, else env KILN_NUM_THREADS, else all cores: torch.set_num_threads(T), and kiln runs with
KILN_NUM_THREADS=T. See README.md in this folder for installing PyTorch.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCHES = [1, 32, 128, 256, 512, 1024]
WARMUP, STEPS = 10, 100


def benchmark_step(torch, batch: int, compiled: bool = False, dtype=None):
    """The benchmark's model, data and optimizer for `batch` (seeded), as a function running one step and returning
    its loss, in `dtype` (default f32). `mlp_divergence.py` uses it too."""
    dtype = dtype or torch.float32
    torch.manual_seed(0)
    w = [torch.empty(o, i) for i, o in [(784, 256), (256, 128), (128, 10)]]
    for p in w:
        torch.nn.init.kaiming_normal_(p)
    params = [p.to(dtype).requires_grad_() for p in w]
    x = torch.randn(batch, 784).to(dtype)
    t = (torch.randn(batch, 10) * 0.1).to(dtype)
    opt = torch.optim.SGD(params, lr=1e-3)
    F = torch.nn.functional

    def loss_fn(x, t):
        h = F.leaky_relu(x @ params[0].T, 0.01)
        h = F.leaky_relu(h @ params[1].T, 0.01)
        return ((h @ params[2].T - t) ** 2).sum()

    fn = torch.compile(loss_fn) if compiled else loss_fn

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fn(x, t)
        loss.backward()
        opt.step()
        return loss

    return step


def torch_step_times(torch, batch: int, compiled: bool, dtype) -> tuple[float, float]:
    """(median seconds per step, seconds of the first step)."""
    step = benchmark_step(torch, batch, compiled, dtype)
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(WARMUP - 1):
        step()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def kiln_step_times(batch: int, threads: int, dtype: str) -> tuple[float, float]:
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "--example", "train_mlp", "--", "--batch", str(batch), "--dtype",
         dtype],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"batch (\d+): ([\d.]+) µs/step .*first step ([\d.]+) ms", out)
    if not m:
        sys.exit(f"could not parse train_mlp output:\n{out}")
    return float(m.group(2)) * 1e-6, float(m.group(3)) * 1e-3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--skip-kiln", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    try:
        import torch
    except ImportError:
        sys.exit(f"PyTorch is not installed in {sys.executable}; see benches/compare/README.md")
    torch.set_num_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-"))
    if not args.skip_kiln:
        subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "train_mlp"], cwd=ROOT, check=True)

    rounds = []
    for r in range(args.rounds):
        kiln, eager, comp = {}, {}, {}
        # Per batch, kiln and PyTorch back to back, so both sides of a ratio see the same host phase. PyTorch's
        # OpenMP threads keep spinning for a while after their work and would steal kiln's cores: a pause first.
        for b in batches:
            if not args.skip_kiln:
                time.sleep(1.0)
                kiln[b] = kiln_step_times(b, args.threads, args.dtype)
            eager[b] = torch_step_times(torch, b, compiled=False, dtype=dtype)
            comp[b] = torch_step_times(torch, b, compiled=True, dtype=dtype)
        rounds.append((kiln, eager, comp))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)

    print(f"{args.dtype}; threads: {args.threads}; torch {torch.__version__}; median of {STEPS} steps after {WARMUP} warm-up; "
          f"{args.rounds} rounds: medians over rounds, [range of per-round ratios]\n")
    print("| batch | kiln µs/step | torch eager µs | torch.compile µs | kiln vs eager | kiln vs compile "
          "| kiln first step | torch.compile first step |")
    print("|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for b in batches:
        eager = med(e[b][0] for _, e, _ in rounds)
        comp = med(c[b][0] for _, _, c in rounds)
        comp_first = rounds[0][2][b][1]
        if args.skip_kiln:
            print(f"| {b} | - | {eager * 1e6:.0f} | {comp * 1e6:.0f} | - | - | - | {comp_first:.2f} s |")
            continue
        k = med(kl[b][0] for kl, _, _ in rounds)
        k_first = rounds[0][0][b][1]

        def ratio(med_ratio: float, per_round: list[float]) -> str:
            return f"{med_ratio:.1f}x [{min(per_round):.1f}-{max(per_round):.1f}]"

        vs_eager = ratio(eager / k, [e[b][0] / kl[b][0] for kl, e, _ in rounds])
        vs_comp = ratio(comp / k, [c[b][0] / kl[b][0] for kl, _, c in rounds])
        print(f"| {b} | {k * 1e6:.0f} | {eager * 1e6:.0f} | {comp * 1e6:.0f} | {vs_eager} | {vs_comp} "
              f"| {k_first * 1e3:.1f} ms | {comp_first:.2f} s |")


if __name__ == "__main__":
    main()
