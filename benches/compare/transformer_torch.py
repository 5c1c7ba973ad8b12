#!/usr/bin/env python3
"""A transformer's training step in PyTorch eager and in kiln (examples/bench_transformer.rs), in one session.

The models: a 2-layer `nn.TransformerEncoder` and a 2 + 2-layer `nn.Transformer` (d_model 128, 4 heads,
feed-forward 512, dropout 0, batch first) over a batch of 16 sequences of 64, loss ((out - t)^2).mean(), SGD lr
1e-2, f32, the same inputs every step (the decoder's target under a causal mask). A step is zero_grad + forward +
loss + backward + optimizer step. Each of `--rounds R` (default 3) runs
`cargo run --release --example bench_transformer -- --json` and then PyTorch's steps, close in time; every figure is
the median of `--runs` steps after 5 warm-up steps, and the table gives each side's median over the rounds and the
ratio of the medians (PyTorch time / kiln time, > 1 meaning kiln is faster), with the per-round ratios' range.

    python3 benches/compare/transformer_torch.py [--threads T] [--runs N] [--rounds R]

Threads: T (default 2): torch.set_num_threads(T), and kiln runs with KILN_NUM_THREADS=T. See README.md here for
installing PyTorch.
"""

from __future__ import annotations

import argparse

from rounds import import_torch, median_time, race

BATCH, LEN, D, WARMUP = 16, 64, 128, 5


def torch_times(torch, runs: int) -> dict[str, float]:
    """The median seconds of `runs` training steps for each model, after `WARMUP` steps."""
    nn = torch.nn
    out = {}
    torch.manual_seed(0)
    src, tgt, t = (torch.randn(BATCH, LEN, D) for _ in range(3))
    causal = nn.Transformer.generate_square_subsequent_mask(LEN)
    kw = dict(dim_feedforward=512, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 4, **kw), 2, enable_nested_tensor=False)
    transformer = nn.Transformer(D, 4, 2, 2, **kw)
    for name, model, run in (
        ("encoder", encoder, lambda: encoder(src)),
        ("transformer", transformer, lambda: transformer(src, tgt, tgt_mask=causal)),
    ):
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)

        def step():
            opt.zero_grad()
            loss = ((run() - t) ** 2).mean()
            loss.backward()
            opt.step()

        out[f"{name} step"] = median_time(step, runs, warmup=WARMUP)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch = import_torch(args.threads)
    race("bench_transformer", torch, lambda runs: torch_times(torch, runs), ["encoder step", "transformer step"],
         "model", 2, args)


if __name__ == "__main__":
    main()
