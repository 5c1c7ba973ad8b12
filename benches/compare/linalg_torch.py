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

from rounds import import_torch, median_time, race

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
    ("solve 1024", 1, 1024, "solve"),
    ("inv 1024", 1, 1024, "inv"),
    ("cholesky 1024", 1, 1024, "cholesky"),
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

        out[name] = median_time(call, runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch = import_torch(args.threads)
    names = [name for name, *_ in ROWS]
    race("bench_linalg", torch, lambda runs: torch_times(torch, runs), names, "function", 3, args)


if __name__ == "__main__":
    main()
