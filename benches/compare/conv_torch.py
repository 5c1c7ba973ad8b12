#!/usr/bin/env python3
"""conv2d, embedding and cross_entropy in PyTorch (oneDNN) and in kiln on the rows of examples/bench_conv.rs, in one
session.

Each of `--rounds R` (default 3) runs `cargo run --release --example bench_conv -- --json` and then PyTorch's
`F.conv2d` on the same shapes, close in time (the host alternates between fast and slow phases). Every figure is the
median of `--runs` calls after two warm-up calls; the table gives each side's median over the rounds and the ratio
of the medians (PyTorch time / kiln time, so > 1 means kiln is faster), with the per-round ratios' range in brackets.
The forward + backward row times `y = conv2d(x, w)`, `(y * dy).sum().backward()` with both gradients (`dy` fixed
random values). The lookup rows (32k vocabulary, 4096 int64 tokens) time `(F.embedding(ids, table) * dy).sum()`
with the table's gradient (dense, as `nn.Embedding` without `sparse=True`) and `F.cross_entropy(logits, ids)` with
the logits' gradient.

    python3 benches/compare/conv_torch.py [--threads T] [--runs N] [--rounds R]

Threads: T (default 2): torch.set_num_threads(T), and kiln runs with KILN_NUM_THREADS=T. See README.md here for
installing PyTorch.
"""

from __future__ import annotations

import argparse

from rounds import import_torch, median_time, race

# (name, input, weight, stride, padding, backward): examples/bench_conv.rs's LAYERS, in order.
LAYERS = [
    ("3x3 64->64 56x56 b8", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1, False),
    ("3x3 s2 64->128 56x56 b8", (8, 64, 56, 56), (128, 64, 3, 3), 2, 1, False),
    ("1x1 256->64 56x56 b8", (8, 256, 56, 56), (64, 256, 1, 1), 1, 0, False),
    ("7x7 s2 3->64 224x224 b8", (8, 3, 224, 224), (64, 3, 7, 7), 2, 3, False),
    ("3x3 64->64 56x56 b8, fwd+bwd", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1, True),
]
# (name, vocabulary, tokens, embedding width or 0 for cross_entropy): bench_conv.rs's LOOKUPS, in order.
LOOKUPS = [
    ("embedding 32k x 128, 4096 tokens, fwd+bwd", 32_000, 4096, 128),
    ("cross_entropy 4096 x 32k, fwd+bwd", 32_000, 4096, 0),
]


def torch_lookup_times(torch, runs: int) -> dict[str, float]:
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, vocab, tokens, dim in LOOKUPS:
        ids = (torch.arange(tokens, dtype=torch.int64) * 7919 + 13) % vocab
        if dim:
            table = torch.randn(vocab, dim, generator=g)
            dy = torch.randn(tokens, dim, generator=g)

            def call():
                t = table.detach().requires_grad_()
                (F.embedding(ids, t) * dy).sum().backward()

        else:
            logits = torch.randn(tokens, vocab, generator=g)

            def call():
                x = logits.detach().requires_grad_()
                F.cross_entropy(x, ids).backward()

        out[name] = median_time(call, runs)
    return out


def torch_times(torch, runs: int) -> dict[str, float]:
    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, xs, ws, stride, padding, backward in LAYERS:
        x = torch.randn(xs, generator=g)
        w = torch.randn(ws, generator=g) * 0.05

        dy = torch.randn(F.conv2d(x, w, stride=stride, padding=padding).shape, generator=g)

        def call():
            if backward:
                xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
                (F.conv2d(xg, wg, stride=stride, padding=padding) * dy).sum().backward()
            else:
                with torch.no_grad():
                    F.conv2d(x, w, stride=stride, padding=padding)

        out[name] = median_time(call, runs)
    out.update(torch_lookup_times(torch, runs))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch = import_torch(args.threads)
    names = [name for name, *_ in LAYERS + LOOKUPS]
    race("bench_conv", torch, lambda runs: torch_times(torch, runs), names, "layer", 2, args)


if __name__ == "__main__":
    main()
