#!/usr/bin/env python3
"""A recurrent model's training step in PyTorch eager and in kiln (examples/bench_rnn.rs), in one session.

The model: a 2-layer LSTM or GRU (input 32, hidden 64) over 20 steps of a batch of 16, a linear head on the last
step's output to 8 values, loss ((out - t)^2).sum(), SGD lr 1e-3, f32, the same x and t every step. A step is
zero_grad + forward + loss + backward + optimizer step. PyTorch runs its own fused LSTM and GRU kernels (`nn.LSTM`,
`nn.GRU`); kiln composes them (nn/recurrent.rs). Each of `--rounds R` (default 3) runs
`cargo run --release --example bench_rnn -- --json` and then PyTorch's steps, close in time; every figure is the
median of `--runs` steps after 10 warm-up steps, and the table gives each side's median over the rounds and the
ratio of the medians (PyTorch time / kiln time, > 1 meaning kiln is faster), with the per-round ratios' range.

    python3 benches/compare/rnn_torch.py [--threads T] [--runs N] [--rounds R]

Threads: T (default 2): torch.set_num_threads(T), and kiln runs with KILN_NUM_THREADS=T. See README.md here for
installing PyTorch.
"""

from __future__ import annotations

import argparse

from rounds import import_torch, median_time, race

SEQ, BATCH, WARMUP = 20, 16, 10


def torch_times(torch, runs: int) -> dict[str, float]:
    """The median seconds of `runs` training steps for each cell, after `WARMUP` steps."""
    out = {}
    for cell, cls in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
        torch.manual_seed(0)
        rnn, head = cls(32, 64, num_layers=2), torch.nn.Linear(64, 8)
        x, t = torch.randn(SEQ, BATCH, 32), torch.randn(BATCH, 8) * 0.1
        opt = torch.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=1e-3)

        def step():
            opt.zero_grad()
            y, _ = rnn(x)
            loss = ((head(y[-1]) - t) ** 2).sum()
            loss.backward()
            opt.step()

        out[f"{cell} step"] = median_time(step, runs, warmup=WARMUP)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch = import_torch(args.threads)
    race("bench_rnn", torch, lambda runs: torch_times(torch, runs), ["lstm step", "gru step"], "model", 2, args)


if __name__ == "__main__":
    main()
