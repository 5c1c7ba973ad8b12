#!/usr/bin/env python3
"""kiln against PyTorch on the CPU, in one session, with the same thread count.

Runs kiln's elementwise chain `a * b + c` and `sin(a)**2 * b + c` over 16M f32, a 1024^3 f32 matmul, and softmax,
log_softmax, layer_norm and mean cross-entropy over the rows of 4096 x 1024 f32 and GELU (tanh form) over the same
elements in PyTorch eager and under torch.compile (Inductor), and a descending sort and a top-50 of 16 x 32000 f32
logits (eager only), then `cargo run --release --example bench_table -- --json` for kiln's figures, and prints one
markdown table with the ratios.

    python3 benches/compare/torch_cpu.py [--runs N] [--threads T] [--skip-kiln]

Threads: T, else env KILN_NUM_THREADS, else all cores; the script sets torch.set_num_threads(T) and runs kiln with
KILN_NUM_THREADS=T. What is timed matches kiln's unit: one call that allocates its output (PyTorch eager and compiled
code both allocate; kiln recycles freed buffers through its pool), median of N runs after warm-up. torch.compile's first
call (compile time, with a fresh empty Inductor cache) is reported separately.

PyTorch is not a dependency of kiln. Install it with `pip install torch` (PyPI; only PyPI is reachable from the
machines this was written on, so PyTorch's own CPU-only wheel index cannot be used: the default wheel is the CUDA
build, ~540 MB plus ~4.5 GB of nvidia-* wheels; it runs fine on the CPU). torch.compile also needs a C++ compiler (g++) on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import median_time

ROOT = Path(__file__).resolve().parents[2]
N = 16 << 20
MATMUL_N = 1024
ROWS, COLS = 4096, 1024
VOCAB_ROWS, VOCAB, TOPK = 16, 32000, 50
INSTALL_HELP = """\
PyTorch is not installed in this Python ({exe}).

Install it from PyPI (a virtual environment is recommended):
    python3 -m venv .venv-torch && .venv-torch/bin/pip install torch numpy
    .venv-torch/bin/python benches/compare/torch_cpu.py
PyTorch's own CPU-only wheel index would give a small build, but it may be unreachable (it was where this script was
written): the PyPI wheel is the CUDA build (~540 MB + ~4.5 GB
of nvidia-* wheels, ~2 minutes to install there) and works on the CPU. torch.compile also needs g++ on PATH.
Use --skip-torch to print kiln's figures only.
"""


def torch_figures(threads: int, runs: int) -> dict:
    # A fresh Inductor cache, so the first compiled call is a real cold compile (as kiln's compile figure is).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-inductor-"))
    import torch

    torch.set_num_threads(threads)
    f32 = torch.float32
    i = torch.arange(N, dtype=torch.int64)
    # The same data as kiln's benches/common `host_inputs`.
    a = (((i % 4096).to(f32) / 4096.0) - 0.5) * 6.0
    b = 1.0 + (i % 7).to(f32) * 0.25
    c = (i % 13).to(f32) * 0.1
    k = torch.arange(MATMUL_N * MATMUL_N, dtype=torch.int64)
    ma = (((k * 7 + 3) % 61).to(f32) / 30.5 - 1.0).reshape(MATMUL_N, MATMUL_N)
    mb = (((k * 13 + 5) % 47).to(f32) / 23.5 - 1.0).reshape(MATMUL_N, MATMUL_N)

    def chain(a, b, c):
        return a * b + c

    def sin_chain(a, b, c):
        return torch.sin(a) ** 2 * b + c

    def matmul(x, y):
        return x @ y

    # The same data as kiln's benches/common `rows_host`.
    r = torch.arange(ROWS * COLS, dtype=torch.int64)
    x = (((r * 7 + 3) % 97).to(f32) / 12.0 - 4.0).reshape(ROWS, COLS)

    def softmax(x):
        return torch.softmax(x, -1)

    def gelu(x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    def log_softmax(x):
        return torch.log_softmax(x, -1)

    def layer_norm(x):
        return torch.nn.functional.layer_norm(x, (COLS,), eps=1e-5)

    # The same classes as kiln's `rows_targets`.
    targets = (torch.arange(ROWS, dtype=torch.int64) * 7) % COLS

    def cross_entropy(x, t):
        return torch.nn.functional.cross_entropy(x, t)

    out = {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability()}
    with torch.no_grad():
        for name, fn, args in [
            ("chain", chain, (a, b, c)),
            ("sin", sin_chain, (a, b, c)),
            ("matmul", matmul, (ma, mb)),
            ("softmax", softmax, (x,)),
            ("gelu", gelu, (x,)),
            ("log_softmax", log_softmax, (x,)),
            ("layer_norm", layer_norm, (x,)),
            ("cross_entropy", cross_entropy, (x, targets)),
        ]:
            out[f"{name}_eager_s"] = median_time(lambda: fn(*args), runs, warmup=1)
            compiled = torch.compile(fn, dynamic=False)
            t0 = time.perf_counter()
            compiled(*args)
            out[f"{name}_compile_first_s"] = time.perf_counter() - t0
            out[f"{name}_compiled_s"] = median_time(lambda: compiled(*args), runs, warmup=1)
            ref = fn(*args)
            got = compiled(*args)
            out[f"{name}_compiled_maxerr"] = float((got - ref).abs().max())
        # The same data as kiln's benches/common `vocab_input`; eager only (torch.compile runs ATen's sort).
        lv = torch.arange(VOCAB_ROWS * VOCAB, dtype=torch.int64)
        lv = ((lv * 7919 + 13) % 32749).to(f32).div(100.0).sub(160.0).reshape(VOCAB_ROWS, VOCAB)
        out["sort_eager_s"] = median_time(lambda: torch.sort(lv, stable=True, dim=-1, descending=True), runs, warmup=1)
        out["topk_eager_s"] = median_time(lambda: torch.topk(lv, TOPK, -1), runs, warmup=1)
    return out


def kiln_figures(threads: int, runs: int) -> dict:
    env = dict(os.environ, KILN_NUM_THREADS=str(threads))
    cmd = ["cargo", "run", "--release", "--quiet", "--example", "bench_table", "--", "--runs", str(runs), "--json"]
    print("running:", " ".join(cmd), f"(KILN_NUM_THREADS={threads})", file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"bench_table failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    lines = res.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    figures["table"] = "\n".join(lines[:-1])
    return figures


NAMES = ("chain", "sin", "matmul", "softmax", "gelu", "log_softmax", "layer_norm", "cross_entropy")


def ms(s):
    return "n/a" if s is None else f"{s * 1e3:.1f} ms"


def ratio(torch_s, kiln_s):
    """How many times faster kiln is (torch time / kiln time)."""
    if torch_s is None or kiln_s is None:
        return "n/a"
    return f"{torch_s / kiln_s:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=9, help="timed runs per measurement (median is reported)")
    p.add_argument("--threads", type=int, default=None, help="threads for both (default: KILN_NUM_THREADS or all cores)")
    p.add_argument("--skip-kiln", action="store_true", help="only run the PyTorch side")
    p.add_argument("--skip-torch", action="store_true", help="only run the kiln side")
    args = p.parse_args()
    threads = args.threads or int(os.environ.get("KILN_NUM_THREADS", "0") or 0) or os.cpu_count() or 1

    t = {}
    if not args.skip_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print(INSTALL_HELP.format(exe=sys.executable), file=sys.stderr)
            sys.exit(2)
        t = torch_figures(threads, args.runs)
    k = {} if args.skip_kiln else kiln_figures(threads, args.runs)

    load = os.getloadavg()[0]
    print(f"# kiln vs PyTorch on the CPU, {threads} threads, medians of {args.runs} runs, load average {load:.2f}")
    if t:
        print(f"PyTorch {t['torch']} (CPU capability {t['capability']}); ratios are torch time / kiln time "
              "(> 1: kiln is faster).")
    print()
    print("| benchmark | kiln | torch eager | torch.compile | kiln vs eager | kiln vs torch.compile | target | met? |")
    print("|---|---|---|---|---|---|---|---|")

    def gbs(s, bytes_per_elem=16):
        return "" if s is None else f" ({bytes_per_elem * N / s / 1e9:.1f} GB/s)"

    rows = [
        ("`a * b + c`, 16M f32", "chain_s", "chain", gbs, None),
        ("`sin(a)**2 * b + c`, 16M f32", "sin_s", "sin", gbs, 2.0),
        (f"matmul {MATMUL_N}^3 f32", "matmul_s", "matmul", None, None),
        (f"softmax over rows, {ROWS} x {COLS} f32", "softmax_s", "softmax", None, None),
        (f"GELU (tanh form), {ROWS} x {COLS} f32", "gelu_s", "gelu", None, None),
        (f"log_softmax over rows, {ROWS} x {COLS} f32", "log_softmax_s", "log_softmax", None, None),
        (f"layer_norm over rows, {ROWS} x {COLS} f32", "layer_norm_s", "layer_norm", None, None),
        (f"cross_entropy (mean, class indices), {ROWS} x {COLS} f32", "cross_entropy_s", "cross_entropy", None, None),
        (f"sort, descending, {VOCAB_ROWS} x {VOCAB} f32", "sort_s", "sort", None, None),
        (f"topk, k = {TOPK}, {VOCAB_ROWS} x {VOCAB} f32", "topk_s", "topk", None, None),
    ]
    for label, kkey, tkey, extra, target in rows:
        ks, es, cs = k.get(kkey), t.get(f"{tkey}_eager_s"), t.get(f"{tkey}_compiled_s")
        if tkey == "matmul":
            fl = 2.0 * MATMUL_N**3

            def fmt(s):
                return "n/a" if s is None else f"{s * 1e3:.1f} ms ({fl / s / 1e9:.1f} GFLOP/s)"
        elif extra is None:

            def fmt(s):
                return "n/a" if s is None else f"{s * 1e3:.2f} ms"
        else:

            def fmt(s):
                return "n/a" if s is None else ms(s) + extra(s)

        if target is None:
            tgt, met = "-", "-"
        else:
            tgt = f">= {target:g}x torch.compile"
            met = "n/a" if ks is None or cs is None else ("yes" if cs / ks >= target else "**no**")
        print(f"| {label} | {fmt(ks)} | {fmt(es)} | {fmt(cs)} | {ratio(es, ks)} | {ratio(cs, ks)} | {tgt} | {met} |")
    if t:
        first = ", ".join(f"{n} {t[f'{n}_compile_first_s']:.1f} s" for n in NAMES)
        print()
        print(f"torch.compile first call (cold Inductor cache): {first}. "
              f"kiln compile (one fused kernel, median): {ms(k.get('compile_s'))}.")
        errs = ", ".join(f"{n} {t[f'{n}_compiled_maxerr']:.1e}" for n in NAMES)
        print(f"torch.compile max |compiled - eager|: {errs}.")
    if k:
        print()
        print("kiln's own table (same session):")
        print()
        print(k["table"])


if __name__ == "__main__":
    main()
