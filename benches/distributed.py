#!/usr/bin/env python3
"""Data-parallel training over MPI against one process, in one session (issue 24's targets).

Runs, interleaved over `--rounds` rounds (this host has slow phases):
  - `train_digits` in one process with 2 threads (`KILN_NUM_THREADS=2`), batch 32;
  - `train_digits --distributed` as 2 MPI ranks with 1 thread each, 16 samples a rank (the same global batch);
  - the same pair for `train_gpt` (16 sequences a step in all);
then `bench_allreduce` (an all-reduce of 10 M f32 against a memcpy, in the same MPI job).

Prints the medians of each side's step time and the ratio (one process's time / the ranks', so >= 0.85 meets the
target). Builds the examples with `--features mpi` first (needs Open MPI and libclang: see docs/distributed.md).

    python3 benches/distributed.py [--rounds 5] [--epochs 10] [--gpt-steps 60] [--mca-none]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "target", "release", "examples")


def run(cmd, env):
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def digits_step_us(text):
    # The last epoch's median step (every epoch after the first replays compiled plans).
    steps = re.findall(r"([\d.]+) µs/step", text)
    return float(steps[-1])


def gpt_step_ms(text):
    return float(re.search(r"then ([\d.]+) ms/step", text).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--gpt-steps", type=int, default=60)
    ap.add_argument("--mca-none", action="store_true",
                    help="pass `--mca btl_vader_single_copy_mechanism none` to mpirun (faster here; see the docs)")
    args = ap.parse_args()

    subprocess.run(["cargo", "build", "--release", "--features", "mpi", "--example", "train_digits",
                    "--example", "train_gpt", "--example", "bench_allreduce"], cwd=ROOT, check=True)
    env = dict(os.environ)
    env.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-dist-bench-"))
    # Open MPI refuses to start as root without these (CI and this host run as root).
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    mpirun = ["mpirun", "-np", "2", "-x", "KILN_NUM_THREADS=1"]
    if args.mca_none:
        mpirun += ["--mca", "btl_vader_single_copy_mechanism", "none"]
    one = dict(env, KILN_NUM_THREADS="2")

    digits = os.path.join(EXAMPLES, "train_digits")
    gpt = os.path.join(EXAMPLES, "train_gpt")
    rows = {"digits 1x2": [], "digits 2x1": [], "gpt 1x2": [], "gpt 2x1": []}
    for r in range(args.rounds):
        rows["digits 1x2"].append(digits_step_us(run([digits, "--epochs", str(args.epochs)], one)))
        rows["digits 2x1"].append(digits_step_us(
            run(mpirun + [digits, "--distributed", "--epochs", str(args.epochs)], env)))
        gpt_args = ["--steps", str(args.gpt_steps), "--sample", "0"]
        rows["gpt 1x2"].append(gpt_step_ms(run([gpt] + gpt_args, one)))
        rows["gpt 2x1"].append(gpt_step_ms(run(mpirun + [gpt, "--distributed"] + gpt_args, env)))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()), flush=True)

    print(f"\nmedians of {args.rounds} rounds (load average {os.getloadavg()[0]:.2f}):")
    print("| workload | 1 process x 2 threads | 2 ranks x 1 thread | ratio (>= 0.85 is the target) |")
    print("|---|---|---|---|")
    for name, unit, a, b in [("train_digits step (batch 32)", "µs", "digits 1x2", "digits 2x1"),
                             ("train_gpt step (16 sequences)", "ms", "gpt 1x2", "gpt 2x1")]:
        ma, mb = statistics.median(rows[a]), statistics.median(rows[b])
        ratios = [x / y for x, y in zip(rows[a], rows[b])]
        print(f"| {name} | {ma:.1f} {unit} | {mb:.1f} {unit} | {ma / mb:.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] |")
    print()
    print(run(mpirun + [os.path.join(EXAMPLES, "bench_allreduce")], env), end="")


if __name__ == "__main__":
    main()
