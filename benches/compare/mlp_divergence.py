#!/usr/bin/env python3
"""Where the seed's MLP benchmark diverges in PyTorch: the step (1-based) at which the loss is first not finite, per
batch size, over the 110 steps `train_mlp` runs (10 warm-up + 100 timed). Same model, init, data and optimizer as
`mlp_torch.py` (784 -> 256 -> 128 -> 10, no bias, leaky_relu(0.01), Kaiming-normal, ((out - t)^2).sum(), SGD lr
1e-3, f32). The benchmark's sum loss grows with the batch, so at lr 1e-3 large batches blow up: that is the
benchmark's definition, not a kiln bug; `train_mlp` prints the step at which its own loss stops being finite, to
compare with this table.

    python3 benches/compare/mlp_divergence.py [--batches 1,32,64,128,256,512,1024] [--steps 110]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlp_torch import benchmark_step  # noqa: E402


def first_non_finite(batch: int, steps: int) -> tuple[float, float, int | None]:
    step = benchmark_step(torch, batch)
    first = last = None
    diverged = None
    for i in range(1, steps + 1):
        loss = step()
        v = loss.item()
        first = v if first is None else first
        last = v
        if diverged is None and not torch.isfinite(loss):
            diverged = i
    return first, last, diverged


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,64,128,256,512,1024")
    ap.add_argument("--steps", type=int, default=110)
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(f"PyTorch {torch.__version__}")
    for b in [int(s) for s in args.batches.split(",")]:
        first, last, diverged = first_non_finite(b, args.steps)
        where = f"not finite from step {diverged}" if diverged else "finite throughout"
        print(f"batch {b}: loss {first:.1f} -> {last:.4g}, {where}")


if __name__ == "__main__":
    main()
