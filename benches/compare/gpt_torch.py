#!/usr/bin/env python3
"""The GPT training step of examples/train_gpt.rs in PyTorch eager, in torch.compile and in kiln, in one session.

The model, initialization, loss, AdamW, schedule and clipping are tests/fixtures/make_gpt_parity.py's (which the
parity test holds kiln to); here at the example's default size: 4 layers, d_model 128, 4 heads, context 64,
batch 16, vocabulary 56 (the characters of examples/data/sonnets.txt), f32. Every side starts from the same weights
and trains on the same batch each step: the script writes them to a safetensors file and kiln runs
`cargo run --release --example train_gpt -- --init FILE`. A step is zero_grad + forward + loss + backward + clipping
+ AdamW. Timing: the median of the steps after 3 warm-up steps; "first step" is the first call (torch.compile
compiles there, with a fresh Inductor cache; kiln compiles its plan there, with a fresh KILN_CACHE_DIR). kiln starts
every round from an empty cache, so its first step is the median over the rounds (range in brackets); PyTorch's is
the first round's (later rounds reuse what the process already compiled and initialized).

Rounds: the host alternates between fast and slow phases, so each of `--rounds R` (default 3) runs kiln and then
both PyTorch modes close in time; the table gives each side's median over the rounds and the ratio of the medians,
with the per-round ratios' range in brackets.

    python3 benches/compare/gpt_torch.py [--threads T] [--steps N] [--rounds R] [--skip-kiln] [--dtype bf16]
                                         [--context T] [--batch B]

`--context` and `--batch` change the sequence length and the sequences per step (default 64 and 16); the rest of
the model stays at the example's default size.

`--dtype bf16`: kiln trains with `--dtype bf16` (bf16 weights and activations, AdamW on f32 master weights), PyTorch
with its forward under `torch.autocast("cpu", dtype=torch.bfloat16)` (bf16 matmuls, f32 weights and optimizer):
each library's own mixed-precision path, on the same weights and batch.

Threads: T (default 2): torch.set_num_threads(T), and kiln runs with KILN_NUM_THREADS=T. See README.md here for
installing PyTorch.
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
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
T, D, H, L, B, PEAK, WARMUP = 64, 128, 4, 4, 16, 3e-3, 3


def setup(torch):
    """The shared weights and batch (seeded)."""
    import make_gpt_parity as gpt

    V, data = gpt.vocab_and_data()
    g = torch.Generator().manual_seed(0)
    init = gpt.init_weights(V, T, D, L, g)
    starts = torch.randint(0, len(data) - T - 1, (B,), generator=g)
    tokens = torch.stack([data[s : s + T + 1] for s in starts])
    return gpt, init, tokens


def torch_times(torch, gpt, init, tokens, steps: int, compiled: bool, bf16: bool) -> tuple[float, float]:
    """(first step s, median step s) of PyTorch eager or torch.compile."""
    P = {k: v.clone().requires_grad_() for k, v in init.items()}
    step = gpt.make_step(P, H, L, steps, PEAK, compiled=compiled, bf16=bf16)
    x, y = tokens[:, :T].long(), tokens[:, 1:].long()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(i, x, y).item()
        times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[WARMUP:])


def target_dir() -> Path:
    """Where cargo puts its builds: CARGO_TARGET_DIR when set (relative to the repository, where cargo runs)."""
    return ROOT / os.environ.get("CARGO_TARGET_DIR", "target")


def kiln_times(path: str, steps: int, threads: int, cache: str, dtype: str) -> tuple[float, float]:
    env = dict(os.environ, KILN_NUM_THREADS=str(threads), KILN_CACHE_DIR=cache)
    out = subprocess.run(
        [str(target_dir() / "release" / "examples" / "train_gpt"), "--init", path, "--steps", str(steps),
         "--sample", "0", "--dtype", dtype, "--context", str(T), "--batch", str(B)],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"first step ([\d.]+) ms, then ([\d.]+) ms/step", out)
    if not m:
        sys.exit(f"could not parse train_gpt's output:\n{out}")
    return float(m.group(1)) / 1e3, float(m.group(2)) / 1e3


def main() -> None:
    global T, B
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-kiln", action="store_true")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--context", type=int, default=T)
    ap.add_argument("--batch", type=int, default=B)
    args = ap.parse_args()
    T, B = args.context, args.batch
    bf16 = args.dtype == "bf16"
    import torch
    from safetensors.torch import save_file

    torch.set_num_threads(args.threads)
    gpt, init, tokens = setup(torch)
    tmp = tempfile.mkdtemp(prefix="gpt_torch_")
    path = os.path.join(tmp, "init.safetensors")
    save_file({**init, "tokens": tokens.contiguous()}, path)
    if not args.skip_kiln:
        subprocess.run(["cargo", "build", "--quiet", "--release", "--example", "train_gpt"], cwd=ROOT, check=True)
    rows = {"kiln": [], "eager": [], "compile": []}
    for r in range(args.rounds):
        if not args.skip_kiln:
            cache = os.path.join(tmp, f"cache{r}")
            rows["kiln"].append(kiln_times(path, args.steps, args.threads, cache, args.dtype))
        rows["eager"].append(torch_times(torch, gpt, init, tokens, args.steps, False, bf16))
        if r == 0:
            torch._dynamo.reset()
        rows["compile"].append(torch_times(torch, gpt, init, tokens, args.steps, True, bf16))
    precision = "bf16 (kiln: bf16 weights and activations, f32 master weights; PyTorch: autocast)" if bf16 else "f32"
    print(f"GPT step ({L} layers, d_model {D}, {H} heads, context {T}, batch {B}), {precision}, {args.threads} "
          f"threads, torch {torch.__version__}, median of {args.steps - WARMUP} steps, {args.rounds} rounds")
    print(f"{'':10} {'first step':>17} {'step':>9} {'tokens/s':>9}  kiln vs it")
    for name, vals in rows.items():
        if not vals:
            continue
        first, step = vals[0][0], statistics.median(v[1] for v in vals)
        first_text = f"{first * 1e3:9.0f}ms"
        if name == "kiln":
            firsts = [v[0] for v in vals]
            first_text = f"{statistics.median(firsts) * 1e3:5.0f}ms [{min(firsts) * 1e3:.0f}-{max(firsts) * 1e3:.0f}]"
        ratio = ""
        if name != "kiln" and rows["kiln"]:
            kiln = statistics.median(v[1] for v in rows["kiln"])
            per = [o[1] / k[1] for o, k in zip(vals, rows["kiln"])]
            ratio = f"{step / kiln:.2f}x [{min(per):.2f}-{max(per):.2f}]"
        print(f"{name:10} {first_text:>17} {step * 1e3:7.2f}ms {B * T / step:9.0f}  {ratio}")


if __name__ == "__main__":
    main()
