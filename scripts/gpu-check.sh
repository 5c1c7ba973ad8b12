#!/usr/bin/env bash
# kiln's CUDA checks on a machine with an NVIDIA GPU, from test binaries built on another machine (a GPU machine
# lent for minutes has no Rust toolchain and no network).
#
#   scripts/gpu-check.sh build [TESTS..]  # here: release test binaries (cpu + cuda + nccl, no wgpu), stripped and
#                                         # gzipped into gpu-bin/ (the device tool carries 64 MiB a call: ~6-8 fit)
#   scripts/gpu-check.sh run [TESTS..]    # there: each binary with KILN_REQUIRE_CUDA=1, so a missing GPU fails
#   scripts/gpu-check.sh compare [ARGS..] # there: benches/compare/gpu_torch.py with the carried train_mlp and
#                                         # bench_gemm (kiln vs PyTorch eager and CUDA graph, same GPU, same run)
#
# `build` also builds the examples train_mlp and bench_gemm with `--features cuda` into gpu-bin/ for `compare`.
# Plans replay as CUDA graphs from their second run; `KILN_CUDA_GRAPHS=0 scripts/gpu-check.sh run ...` runs the
# suites with launches one by one instead.
#
# `run` finds NVRTC where the machine has one (KILN_NVRTC if set, else libnvrtc.so.13/.12 under python3's
# site-packages (the nvidia-cuda-nvrtc wheel) or the CUDA toolkit), and NCCL likewise (KILN_NCCL, else
# libnccl.so.2 under site-packages or the system's: `cuda_device` then runs a group of one through it, and says it
# skips where there is none), and cuBLASLt (libcublasLt.so.12/13 likewise: the GEMM race's library contestant;
# found, KILN_REQUIRE_CUBLASLT=1 makes cuda_device fail if kiln cannot use it),
# then runs each carried binary (`cuda_device` opens the GPU and round-trips every
# dtype; the device-generic suites run every case on the CPU and on CUDA device 0). Each binary's last lines go to stdout and its whole log to
# ${OUT:-.}/gpu-check/<name>.log.
set -uo pipefail
cd "$(dirname "$0")/.."

# Device-generic test binaries (their bodies loop over common::devices()): cuda_device op_table remainders
# full_reductions row_kernels indexing sort_scan f16 bf16 einsum nn optim optim_state clip gemm conv attention
# batch_norm gradcheck random_graphs donation gpt linalg. `build` without names builds twelve of them.

case "${1:-}" in
build)
    shift
    tests=("$@")
    [ ${#tests[@]} -eq 0 ] && tests=(cuda_device op_table random_graphs gradcheck indexing full_reductions row_kernels f16 bf16 nn optim linalg)
    rm -rf gpu-bin && mkdir -p gpu-bin
    args=()
    for t in "${tests[@]}"; do args+=(--test "$t"); done
    cargo test --release --no-default-features --features cpu,cuda,nccl --no-run --message-format=json "${args[@]}" |
        python3 -c 'import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable") if m.get("reason") == "compiler-artifact" else None
    if exe and m["target"]["kind"] == ["test"]:
        shutil.copy(exe, os.path.join("gpu-bin", m["target"]["name"]))'
    cargo build --release --no-default-features --features cpu,cuda,nccl --example train_mlp --example bench_gemm &&
        cp target/release/examples/train_mlp target/release/examples/bench_gemm gpu-bin/
    for f in gpu-bin/*; do strip "$f" && gzip -9 "$f"; done
    ls -l gpu-bin
    du -sh gpu-bin
    ;;
run | compare)
    mode=$1
    shift
    if [ -z "${KILN_NVRTC:-}" ]; then
        KILN_NVRTC=$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
for root in roots:
    for name in ("libnvrtc.so.13", "libnvrtc.so.12"):
        hits = glob.glob(f"{root}/**/{name}", recursive=True)
        if hits:
            print(hits[0]); sys.exit(0)
PY
        )
        export KILN_NVRTC
    fi
    if [ -z "${KILN_NCCL:-}" ]; then
        KILN_NCCL=$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
for root in site.getsitepackages() + [site.getusersitepackages(), "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64"]:
    hits = glob.glob(f"{root}/**/libnccl.so.2", recursive=True)
    if hits:
        print(hits[0]); sys.exit(0)
PY
        )
        [ -n "$KILN_NCCL" ] && export KILN_NCCL
    fi
    # cuBLASLt (the GEMM race's library contestant) is opened by name: put its folder on the loader's path.
    cublaslt=$(python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
for root in site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]:
    for name in ("libcublasLt.so.12", "libcublasLt.so.13", "libcublasLt.so"):
        hits = glob.glob(f"{root}/**/{name}", recursive=True)
        if hits:
            print(hits[0]); sys.exit(0)
PY
    )
    echo "== NVRTC: ${KILN_NVRTC:-not found (the tests will say so)}"
    echo "== NCCL: ${KILN_NCCL:-not found (the NCCL group test skips)}"
    echo "== cuBLASLt: ${cublaslt:-not found (GEMMs race the kiln templates alone)}"
    [ -n "${KILN_NVRTC:-}" ] && export LD_LIBRARY_PATH="$(dirname "$KILN_NVRTC")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -n "$cublaslt" ] && export LD_LIBRARY_PATH="$(dirname "$cublaslt"):$LD_LIBRARY_PATH" KILN_REQUIRE_CUBLASLT=1
    nvidia-smi -L 2>/dev/null || echo "== nvidia-smi: not available"
    export KILN_REQUIRE_CUDA=1 KILN_CACHE_DIR="${KILN_CACHE_DIR:-$(mktemp -d)}"
    logs="${OUT:-.}/gpu-check"
    mkdir -p "$logs"
    failed=0
    bins=$(mktemp -d)
    if [ "$mode" = compare ]; then
        for e in train_mlp bench_gemm; do
            [ -f "gpu-bin/$e.gz" ] || { echo "== $e: not built (scripts/gpu-check.sh build)"; exit 1; }
            gunzip -c "gpu-bin/$e.gz" >"$bins/$e" && chmod +x "$bins/$e"
        done
        python3 benches/compare/gpu_torch.py --train-mlp "$bins/train_mlp" --bench-gemm "$bins/bench_gemm" "$@" 2>&1 |
            tee "$logs/gpu_torch.log"
        exit "${PIPESTATUS[0]}"
    fi
    tests=("$@")
    if [ ${#tests[@]} -eq 0 ]; then
        for f in gpu-bin/*.gz; do
            t=$(basename "$f" .gz)
            case "$t" in train_mlp | bench_gemm) ;; *) tests+=("$t") ;; esac
        done
    fi
    for t in "${tests[@]}"; do
        [ -f "gpu-bin/$t.gz" ] || { echo "== $t: not built (scripts/gpu-check.sh build $t)"; failed=1; continue; }
        gunzip -c "gpu-bin/$t.gz" >"$bins/$t" && chmod +x "$bins/$t"
        start=$(date +%s)
        if "$bins/$t" --test-threads 4 >"$logs/$t.log" 2>&1; then status=ok; else status=FAILED; failed=1; fi
        echo "== $t: $status in $(($(date +%s) - start)) s: $(grep -E '^test result' "$logs/$t.log" | tail -n 1)"
        [ "$status" = ok ] || grep -E '^(thread|---- |test .* FAILED)|panicked' "$logs/$t.log" | head -n 12
    done
    exit $failed
    ;;
*)
    echo "usage: $0 build [TESTS..] | run [TESTS..] | compare [ARGS..]" >&2
    exit 2
    ;;
esac
