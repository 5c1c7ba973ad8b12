#!/usr/bin/env python3
"""kiln against PyTorch on one GPU, in one run: the MLP training step (eager and CUDA-graph-captured PyTorch) and the
GPU issue's GEMM shapes (`torch.matmul`), each beside kiln's figure and the ratio (PyTorch time / kiln time, > 1
meaning kiln is faster).

MLP: the seed's step exactly as `mlp_torch.py` defines it (784 -> 256 -> 128 -> 10, no bias, leaky_relu(0.01),
Kaiming-normal init, loss ((out - t)^2).sum(), SGD lr 1e-3, f32), on the GPU. A timed step ends with the device
synchronized on both sides (kiln's `train_mlp` calls `Device::synchronize` each step; PyTorch
`torch.cuda.synchronize()`), 10 warm-up steps, median of `--steps`. PyTorch's CUDA-graph row captures the whole
step (forward, backward, SGD) once, as PyTorch's docs show for whole-network capture, and replays it. kiln runs
twice: as it ships (plans replay as CUDA graphs from their second run) and with `KILN_CUDA_GRAPHS=0` (launches one
by one), to show what its graphs save. Each of `--rounds` runs, batch by batch, kiln's rows and then PyTorch's close
in time; the table gives medians over rounds and, in brackets, the range of per-round ratios.

GEMMs: `bench_gemm --device cuda --json` (build + realize + synchronize, median of its runs) against
`torch.matmul` on the same shapes and dtypes (f32 with TF32 off, PyTorch's default; bf16; f16), timed the same way
(wall clock around the call and `torch.cuda.synchronize()`), and `gelu(x @ w + bias, approximate="tanh")` for the
fused row.

The GPU machine has no Rust toolchain: build the two examples with `--features cuda` elsewhere and pass them
(`scripts/gpu-check.sh build` puts them in gpu-bin/; `scripts/gpu-check.sh run` runs this with them):

    python3 benches/compare/gpu_torch.py --train-mlp PATH --bench-gemm PATH [--batches 1,1024] [--rounds 3]
                                         [--steps 100] [--skip-gemm] [--device cuda]

`--device cpu` runs the same script against kiln's CPU device and PyTorch on the CPU without the CUDA-graph row (to
check the script on a machine without a GPU; its figures mean nothing for the GPU issue).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WARMUP = 10


def mlp_step(torch, batch: int, device: str):
    """mlp_torch.py's model, data and optimizer for `batch` (same seed, initialized on the CPU then moved), and
    (step, params, x, t, opt): `step()` runs one eager step and returns its loss."""
    torch.manual_seed(0)
    w = [torch.empty(o, i) for i, o in [(784, 256), (256, 128), (128, 10)]]
    for p in w:
        torch.nn.init.kaiming_normal_(p)
    params = [p.to(device).requires_grad_() for p in w]
    x = torch.randn(batch, 784).to(device)
    t = (torch.randn(batch, 10) * 0.1).to(device)
    opt = torch.optim.SGD(params, lr=1e-3)
    F = torch.nn.functional

    def loss_fn():
        h = F.leaky_relu(x @ params[0].T, 0.01)
        h = F.leaky_relu(h @ params[1].T, 0.01)
        return ((h @ params[2].T - t) ** 2).sum()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        return loss

    return step, loss_fn, opt


def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(torch, device: str, step, steps: int, warmup: int = WARMUP) -> float:
    """Median seconds of `steps` calls of `step` after `warmup` untimed, each ending with the device synchronized."""
    for _ in range(warmup):
        step()
    sync(torch, device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(torch, device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_eager(torch, batch: int, device: str, steps: int) -> float:
    step, _, _ = mlp_step(torch, batch, device)
    return timed_steps(torch, device, step, steps)


def torch_graph(torch, batch: int, steps: int) -> float:
    """The whole step captured as one CUDA graph (PyTorch's documented recipe: warm up on a side stream, capture
    with the gradients unset so backward allocates them in the graph's pool, then replay)."""
    step, loss_fn, opt = mlp_step(torch, batch, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = loss_fn()
        loss.backward()
        opt.step()
    return timed_steps(torch, "cuda", graph.replay, steps)


def kiln_mlp(binary: str, batch: int, device: str, steps: int, graphs: bool) -> tuple[float, float]:
    """(median seconds per step, first step seconds) from `train_mlp`'s line."""
    env = dict(os.environ)
    if not graphs:
        env["KILN_CUDA_GRAPHS"] = "0"
    out = subprocess.run(
        [binary, "--device", device, "--batch", str(batch), "--steps", str(steps)],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    m = re.search(r"batch (\d+): ([\d.]+) µs/step .*first step ([\d.]+) ms", out)
    if not m:
        sys.exit(f"could not parse train_mlp output:\n{out}")
    return float(m.group(2)) * 1e-6, float(m.group(3)) * 1e-3


def torch_gemms(torch, device: str, runs: int, dtypes: list[str]) -> dict[str, float]:
    """bench_gemm's device rows in PyTorch: ms per key (`f32_sq1024`, `bf16_m8`, `f32_gelu16`, ...)."""
    F = torch.nn.functional
    out = {}

    def operand(rows: int, cols: int, seed: int, dtype):
        i = torch.arange(rows * cols, dtype=torch.int64)
        v = ((i * (2 * seed + 7) + seed) % 61).to(torch.float32) / 30.5 - 1.0
        return v.reshape(rows, cols).to(device=device, dtype=dtype)

    def med(call) -> float:
        return timed_steps(torch, device, call, runs, warmup=1) * 1e3

    for name in dtypes:
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]
        for n in (1024, 2048, 4096):
            a, b = operand(n, n, 1, dtype), operand(n, n, 2, dtype)
            out[f"{name}_sq{n}"] = med(lambda: a @ b)
        w = operand(4096, 4096, 3, dtype)
        for m in (8, 16, 32, 64):
            x = operand(m, 4096, 4, dtype)
            out[f"{name}_m{m}"] = med(lambda: x @ w)
        x, bias = operand(16, 4096, 5, dtype), operand(1, 4096, 6, dtype)
        out[f"{name}_gelu16"] = med(lambda: F.gelu(x @ w + bias, approximate="tanh"))
    return out


def kiln_gemms(binary: str, device: str, runs: int) -> dict[str, float]:
    out = subprocess.run([binary, "--device", device, "--runs", str(runs), "--json"], check=True,
                         capture_output=True, text=True).stdout
    line = next((l for l in reversed(out.splitlines()) if l.startswith("{")), None)
    if line is None:
        sys.exit(f"no JSON line in bench_gemm's output:\n{out}")
    return {k[: -len("_ms")]: v for k, v in json.loads(line).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-mlp", default=str(ROOT / "target/release/examples/train_mlp"))
    ap.add_argument("--bench-gemm", default=str(ROOT / "target/release/examples/bench_gemm"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--gemm-runs", type=int, default=11)
    ap.add_argument("--skip-gemm", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit(f"PyTorch is not installed in {sys.executable}; see benches/compare/README.md")
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("torch.cuda.is_available() is false: run this on the GPU machine (or with --device cpu)")
    batches = [int(b) for b in args.batches.split(",")]
    gpu = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    print(f"{gpu}; torch {torch.__version__}; MLP: median of {args.steps} steps after {WARMUP} warm-up, "
          f"{args.rounds} rounds: medians over rounds, [range of per-round ratios]\n")

    rounds = []
    for r in range(args.rounds):
        row = {}
        for b in batches:
            kg = kiln_mlp(args.train_mlp, b, dev, args.steps, graphs=True)
            k1 = kiln_mlp(args.train_mlp, b, dev, args.steps, graphs=False) if dev == "cuda" else None
            eager = torch_eager(torch, b, dev, args.steps)
            graph = torch_graph(torch, b, args.steps) if dev == "cuda" else None
            row[b] = (kg, k1, eager, graph)
        rounds.append(row)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)

    med = statistics.median
    us = lambda s: "-" if s is None else f"{s * 1e6:.1f}"

    def ratio(theirs: list[float], ours: list[float]) -> str:
        if any(x is None for x in theirs):
            return "-"
        per = [t / k for t, k in zip(theirs, ours)]
        return f"{med(theirs) / med(ours):.2f}x [{min(per):.2f}-{max(per):.2f}]"

    print("| MLP batch | kiln µs/step | kiln, KILN_CUDA_GRAPHS=0 | torch eager | torch CUDA graph | kiln vs eager "
          "| kiln vs CUDA graph | kiln first step |")
    print("|---|---|---|---|---|---|---|---|")
    for b in batches:
        kg = [r[b][0][0] for r in rounds]
        k1 = [r[b][1][0] if r[b][1] else None for r in rounds]
        eager = [r[b][2] for r in rounds]
        graph = [r[b][3] for r in rounds]
        k1_med = None if None in k1 else med(k1)
        g_med = None if None in graph else med(graph)
        print(f"| {b} | {us(med(kg))} | {us(k1_med)} | {us(med(eager))} | {us(g_med)} | {ratio(eager, kg)} "
              f"| {ratio(graph, kg)} | {rounds[0][b][0][1] * 1e3:.1f} ms |")

    if args.skip_gemm:
        return
    dtypes = ["f32", "bf16", "f16"] if dev == "cuda" else ["f32"]
    theirs = torch_gemms(torch, dev, args.gemm_runs, dtypes)
    ours = kiln_gemms(args.bench_gemm, dev, args.gemm_runs) if dev == "cuda" else {}
    print(f"\n| GEMM (ms, median of {args.gemm_runs}) | kiln | torch | kiln vs torch |\n|---|---|---|---|")
    for key, t in theirs.items():
        k = ours.get(key)
        if k is None:
            print(f"| {key} | - | {t:.3f} | - |")
        else:
            print(f"| {key} | {k:.3f} | {t:.3f} | {t / k:.2f}x |")


if __name__ == "__main__":
    main()
