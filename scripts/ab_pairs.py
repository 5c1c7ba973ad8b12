#!/usr/bin/env python3
"""Two builds of a kiln example, A and B, timed as alternating process pairs: is B faster than A, on a host whose
speed drifts?

The hosts kiln is developed on alternate between fast and slow phases lasting seconds to minutes (a 30-step
`train_gpt` run between ~28 and ~40 ms within minutes), so one run of each build, or a batch of A runs and then a
batch of B runs, measures the phases as much as the change. Here each pair runs A and B back to back (A first in odd
pairs, B first in even ones, so neither side always gets the warmer cache or the later phase), and what is reported
is about the pairs: how many B won, the median of the per-pair differences B - A, and a two-sided sign-test p-value
for "B and A are equally fast". A change that matters shows up as a lopsided count and a p-value near 0; 10 of 20
with a median difference near zero is noise, however the two medians happen to differ.

    python3 scripts/ab_pairs.py A_BINARY B_BINARY [--pairs 20] [--pattern REGEX] [-- ARGS...]

ARGS go to both binaries (default: `--steps 20`, for `train_gpt` and `train_mlp`). `--pattern` is a regular
expression whose first group is the figure to compare, lower being better (default: `train_gpt`'s
`then X ms/step`; for `train_mlp`: `'batch \\d+: ([0-9.]+) µs/step'`). Build the two binaries first, e.g.

    cargo build --release --example train_gpt && cp target/release/examples/train_gpt /tmp/gpt_B
    git stash && cargo build --release --example train_gpt && cp target/release/examples/train_gpt /tmp/gpt_A
    git stash pop
    python3 scripts/ab_pairs.py /tmp/gpt_A /tmp/gpt_B --pairs 20
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys


def figure(binary: str, args: list[str], pattern: re.Pattern[str]) -> float:
    """The first group of `pattern` in the output of one run of `binary`."""
    proc = subprocess.run([binary, *args], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    m = pattern.search(out)
    if proc.returncode != 0 or m is None:
        sys.exit(f"{binary} {' '.join(args)}: exit {proc.returncode}, no match for {pattern.pattern!r}:\n{out}")
    return float(m.group(1))


def sign_test_p(wins: int, n: int) -> float:
    """Two-sided p-value of `wins` successes in `n` fair coin flips (ties dropped by the caller)."""
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the baseline binary")
    ap.add_argument("b", help="the changed binary")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--pattern", default=r"then ([0-9.]+) ms/step", help="regex; group 1 is the figure (lower is better)")
    argv = sys.argv[1:]
    # Everything after `--` goes to the binaries.
    split = argv.index("--") if "--" in argv else len(argv)
    opts = ap.parse_args(argv[:split])
    pattern = re.compile(opts.pattern)
    args = argv[split + 1 :] or ["--steps", "20"]
    pairs = []
    for i in range(opts.pairs):
        if i % 2 == 0:
            a = figure(opts.a, args, pattern)
            b = figure(opts.b, args, pattern)
        else:
            b = figure(opts.b, args, pattern)
            a = figure(opts.a, args, pattern)
        pairs.append((a, b))
        print(f"pair {i + 1:2}: A {a:10.3f}  B {b:10.3f}  B - A {b - a:+.3f}", flush=True)
    diffs = [b - a for a, b in pairs]
    wins = sum(d < 0 for d in diffs)
    losses = sum(d > 0 for d in diffs)
    print(
        f"{len(pairs)} pairs: median A {statistics.median(a for a, _ in pairs):.3f}, "
        f"median B {statistics.median(b for _, b in pairs):.3f}; B faster in {wins}, slower in {losses}; "
        f"median B - A {statistics.median(diffs):+.3f}; sign test p = {sign_test_p(wins, wins + losses):.3f}"
    )


if __name__ == "__main__":
    main()
