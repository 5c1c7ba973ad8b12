//! The rendered CUDA C under a host shim, for tests on machines without a GPU: a few definitions make the kernel
//! plain C++ (`__global__` and `__device__` vanish, `blockIdx` / `threadIdx` are thread-local globals, the bit
//! casts go through `memcpy`, the atomics are `std::atomic_ref`'s), and a driver per kernel
//! (`kiln_run_<i>(args, grid x, grid y, block)`) runs every block in turn. A kernel without barriers runs its
//! block's threads one after another; one with `__syncthreads` (the tiled GEMM, cooperative reductions, factorizations) runs them as real threads meeting
//! at a `std::barrier`, with its `__shared__` arrays shared by them, so a tile staged by the whole block is
//! staged. Compiled by the host's C++ compiler (C++20) and compared with the interpreter, a wrong index, fold,
//! helper or staging step fails without a GPU.
//!
//! What it cannot cover: the device's own math library (the host's libm stands in for `sinf`, `expf`, ...), the
//! GPU's memory model (a race the host's scheduling hides, or a non-atomic reduction, can pass here; blocks run one
//! after another, so a split-K GEMM's last block is always the last in order), whether the tensor-core fragment
//! layouts the shim's `kiln_mma_bf16_16816`, `kiln_mma_tf32_1688` and `kiln_ldsm_x4` follow (the PTX ISA's) are the
//! hardware's, and timing.

use super::GpuKernel;
use super::dialect::storage_ty;
use crate::kernel::KernelIr;
use std::fmt::Write;

const SHIM: &str = r#"// kiln: CUDA C under a host shim (render/cuda/host.rs)
#include <cmath>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <barrier>
#include <thread>
#include <vector>
struct kiln_dim3 { unsigned int x, y, z; };
static thread_local kiln_dim3 threadIdx, blockIdx;
static kiln_dim3 blockDim, gridDim;
static std::barrier<>* kiln_bar = nullptr;
inline void __syncthreads() { kiln_bar->arrive_and_wait(); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static
inline float __uint_as_float(unsigned int b) { float f; std::memcpy(&f, &b, 4); return f; }
inline float __int_as_float(int b) { float f; std::memcpy(&f, &b, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int b; std::memcpy(&b, &f, 4); return b; }
inline int __float_as_int(float f) { int b; std::memcpy(&b, &f, 4); return b; }
inline double __longlong_as_double(long long b) { double f; std::memcpy(&f, &b, 8); return f; }
inline long long __double_as_longlong(double f) { long long b; std::memcpy(&b, &f, 8); return b; }
inline int atomicCAS(int* p, int expected, int v) { std::atomic_ref<int>(*p).compare_exchange_strong(expected, v); return expected; }
inline int atomicExch(int* p, int v) { return std::atomic_ref<int>(*p).exchange(v); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) { return std::atomic_ref<unsigned int>(*p).fetch_add(v); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// CUDA's vector type, and 16-byte loads and stores through memcpy (no aliasing assumptions on the host).
struct uint4 { unsigned int x, y, z, w; };
// A GPU faults on a misaligned one: so does the shim.
#define __align__(n) __attribute__((aligned(n)))
inline void kiln_aligned(const void* p, unsigned long bytes) {
    if (reinterpret_cast<unsigned long>(p) % bytes) std::abort();
}
inline void kiln_aligned16(const void* p) { kiln_aligned(p, 16); }
inline uint4 kiln_ld16(const void* p) { kiln_aligned16(p); uint4 x; std::memcpy(&x, p, 16); return x; }
inline void kiln_st16(void* p, uint4 x) { kiln_aligned16(p); std::memcpy(p, &x, 16); }
// The tiled GEMM's 4-element loads (render/cuda/gemm.rs), aligned to their size or aborting.
template <typename T> struct alignas(4 * sizeof(T)) kiln_v4 { T v[4]; };
template <typename T> inline kiln_v4<T> kiln_ld4(const T* p) {
    kiln_aligned(p, sizeof(kiln_v4<T>));
    kiln_v4<T> x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
inline kiln_v4<float> kiln_ld4f(const float* p) { return kiln_ld4(p); }
inline kiln_v4<unsigned short> kiln_ld4h(const unsigned short* p) { return kiln_ld4(p); }
// The tensor-core GEMM's cp.async (render/cuda/mma.rs): a thread's copies land when it waits for their group, the
// latest the PTX ISA allows, so reading a slice before waiting for it reads stale data here as it may on a GPU.
struct kiln_cp_op { void* dst; const void* src; };
static thread_local std::vector<kiln_cp_op> kiln_cp_pending;
// The end of each committed group still in flight, in `kiln_cp_pending`.
static thread_local std::vector<size_t> kiln_cp_groups;
inline void kiln_cp16(void* dst, const void* src) {
    kiln_aligned16(dst);
    kiln_aligned16(src);
    kiln_cp_pending.push_back({dst, src});
}
inline void kiln_cp_commit() { kiln_cp_groups.push_back(kiln_cp_pending.size()); }
inline void kiln_cp_wait1() {
    if (kiln_cp_groups.size() < 2) return;
    size_t landed = kiln_cp_groups[kiln_cp_groups.size() - 2];
    for (size_t i = 0; i < landed; i++) std::memcpy(kiln_cp_pending[i].dst, kiln_cp_pending[i].src, 16);
    kiln_cp_pending.erase(kiln_cp_pending.begin(), kiln_cp_pending.begin() + landed);
    std::vector<size_t> left;
    for (size_t g : kiln_cp_groups) if (g > landed) left.push_back(g - landed);
    kiln_cp_groups = left;
}
using std::max;
using std::min;
// The tensor-core GEMM's warp-level products (render/cuda/mma.rs): each lane leaves its fragments here, the block
// meets, and each lane computes its four accumulators (C's m16n8 layout: rows g, g + 8 at columns 2q, 2q + 1) from
// its warp's fragments by the PTX ISA's layouts.
#define KILN_HOST_SHIM 1
static unsigned int kiln_mma_frag[1024][6];
// Leaves this lane's A and B registers where its warp reads them and meets the block; its warp's first thread.
inline unsigned int kiln_mma_share(const unsigned int* a, const unsigned int* b) {
    unsigned int t = threadIdx.x;
    for (int r = 0; r < 4; r++) kiln_mma_frag[t][r] = a[r];
    kiln_mma_frag[t][4] = b[0];
    kiln_mma_frag[t][5] = b[1];
    __syncthreads();
    return t - t % 32;
}
// d[e] += the sum over k < kn of a(row, k) * b(k, col) for this lane's accumulators, then the block meets again.
template <typename A, typename B>
inline void kiln_mma_accumulate(float* d, unsigned int kn, A a, B b) {
    unsigned int lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
    for (unsigned int e = 0; e < 4; e++) {
        unsigned int row = g + (e >= 2 ? 8 : 0), col = q * 2 + (e & 1);
        float sum = 0.0f;
        for (unsigned int k = 0; k < kn; k++) sum += a(row, k) * b(k, col);
        d[e] += sum;
    }
    __syncthreads();
}
// `ldmatrix` (m8n8, 16-bit): each lane leaves its row address, the block meets, and lane t takes from matrix i row
// t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 (the lower in the low half) as register i, by the PTX ISA's layout;
// the rows must be 16-byte aligned, as on a GPU.
static const unsigned short* kiln_ldsm_rows[1024];
inline void kiln_ldsm(unsigned int* r, const unsigned short* row, unsigned int count) {
    unsigned int t = threadIdx.x, w = t - t % 32, lane = t % 32;
    if (lane < 8 * count) kiln_aligned16(row);
    kiln_ldsm_rows[t] = row;
    __syncthreads();
    for (unsigned int i = 0; i < count; i++) {
        const unsigned short* p = kiln_ldsm_rows[w + i * 8 + lane / 4];
        r[i] = (unsigned int)p[2 * (lane % 4)] | ((unsigned int)p[2 * (lane % 4) + 1] << 16);
    }
    __syncthreads();
}
inline void kiln_ldsm_x4(unsigned int* r, const unsigned short* row) { kiln_ldsm(r, row, 4); }
inline void kiln_ldsm_x2(unsigned int* r, const unsigned short* row) { kiln_ldsm(r, row, 2); }
// The bf16 and the IEEE f16 value of 16 bits.
inline float kiln_mma_bf16(unsigned int h) { return __uint_as_float(h << 16); }
inline float kiln_mma_f16(unsigned int h) {
    unsigned int sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * (1.0f / 16777216.0f);
    return __uint_as_float(sign | (e == 31 ? 0x7f800000u : (e + 112) << 23) | (m << 13));
}
// m16n8k16 (bf16 and f16 alike): A[row][k] is element (k >= 8 ? 4 : 0) + (row >= 8 ? 2 : 0) + (k & 1) of lane
// (row % 8) * 4 + (k % 8) / 2; B[k][col] element (k >= 8 ? 2 : 0) + (k & 1) of lane col * 4 + (k % 8) / 2; an
// element is the low (even) or high (odd) half of its register, read by `value`.
template <typename V>
inline void kiln_mma_16816(float* d, const unsigned int* a, const unsigned int* b, V value) {
    unsigned int w = kiln_mma_share(a, b);
    auto half = [value](unsigned int word, unsigned int hi) { return value(hi ? word >> 16 : word & 0xffffu); };
    auto at_a = [w, half](unsigned int row, unsigned int k) {
        unsigned int i = (k >= 8 ? 4 : 0) + (row >= 8 ? 2 : 0) + (k & 1);
        return half(kiln_mma_frag[w + (row % 8) * 4 + (k % 8) / 2][i / 2], i & 1);
    };
    auto at_b = [w, half](unsigned int k, unsigned int col) {
        unsigned int i = (k >= 8 ? 2 : 0) + (k & 1);
        return half(kiln_mma_frag[w + col * 4 + (k % 8) / 2][4 + i / 2], i & 1);
    };
    kiln_mma_accumulate(d, 16, at_a, at_b);
}
inline void kiln_mma_bf16_16816(float* d, const unsigned int* a, const unsigned int* b) {
    kiln_mma_16816(d, a, b, kiln_mma_bf16);
}
inline void kiln_mma_f16_16816(float* d, const unsigned int* a, const unsigned int* b) {
    kiln_mma_16816(d, a, b, kiln_mma_f16);
}
// TF32 (`cvt.rna.tf32.f32`: to nearest, ties away from zero; infinities and NaNs as they are).
inline unsigned int kiln_tf32(float x) {
    unsigned int b = __float_as_uint(x);
    if ((b & 0x7f800000u) == 0x7f800000u) return b;
    return (b + 0x1000u) & 0xffffe000u;
}
// m16n8k8, TF32: A[row][k] is register (row >= 8) + 2 (k >= 4) of lane (row % 8) * 4 + k % 4; B[k][col] register
// (k >= 4) of lane col * 4 + k % 4.
inline void kiln_mma_tf32_1688(float* d, const unsigned int* a, const unsigned int* b) {
    unsigned int w = kiln_mma_share(a, b);
    auto at_a = [w](unsigned int row, unsigned int k) {
        return __uint_as_float(kiln_mma_frag[w + (row % 8) * 4 + k % 4][(row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)]);
    };
    auto at_b = [w](unsigned int k, unsigned int col) {
        return __uint_as_float(kiln_mma_frag[w + col * 4 + k % 4][4 + (k >= 4 ? 1 : 0)]);
    };
    kiln_mma_accumulate(d, 8, at_a, at_b);
}
"#;

/// Compiles `source` (a unit of [`host_unit`] or [`kernel_unit`]) with the C++ compiler `cxx` into the shared
/// library `lib`, the source written beside it (`.cpp`). C++20 and threads for the shim's barriers;
/// `-ffp-contract=off`: no fused multiply-adds the interpreter does not have either (NVRTC contracts by default), so
/// a difference from it is a semantic one.
pub fn compile_library(cxx: &str, source: &str, lib: &std::path::Path) -> Result<(), String> {
    let src = lib.with_extension("cpp");
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    let out = std::process::Command::new(cxx)
        .args(["-std=c++20", "-pthread", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o"])
        .arg(lib)
        .arg(&src)
        .output()
        .map_err(|e| format!("running {cxx}: {e}"))?;
    if !out.status.success() {
        return Err(format!("the host compile failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// One translation unit: the shim, then each `(kernel, its IR)` in a namespace with its driver `kiln_run_<i>`.
/// `args` holds the kernel's buffers in parameter order (inputs, output, then rng words, fault record and the
/// workspace's counters and partials where the kernel has them).
pub fn host_unit(kernels: &[(&GpuKernel, &KernelIr)]) -> String {
    let mut s = String::from(SHIM);
    for (i, (g, k)) in kernels.iter().enumerate() {
        let _ = write!(s, "namespace kiln_k{i} {{\n{}\n}}\n", g.source.replace("extern \"C\" ", ""));
        let mut args: Vec<String> =
            k.inputs.iter().enumerate().map(|(j, b)| format!("(const {}*)args[{j}]", storage_ty(b.dtype))).collect();
        args.push(format!("({}*)args[{}]", storage_ty(k.output.dtype), k.inputs.len()));
        let mut next = k.inputs.len() + 1;
        if g.uses_rng {
            args.push(format!("(const unsigned int*)args[{next}]"));
            next += 1;
        }
        if g.can_fault {
            args.push(format!("(int*)args[{next}]"));
            next += 1;
        }
        if g.workspace.is_some() {
            args.push(format!("(unsigned int*)args[{next}]"));
            args.push(format!("(float*)args[{}]", next + 1));
        }
        let call = format!("kiln_k{i}::{}({})", k.name, args.join(", "));
        driver(&mut s, &format!("kiln_run_{i}"), &call, &g.source);
    }
    s
}

/// Kernels `(source, name)` under the shim, each in a namespace of its own with a driver `kiln_run_<i>(args, grid x,
/// grid y, block)` that casts each of `args` to the kernel's parameter type itself (through the function's own
/// signature, so no kernel IR is needed): what the host stand-in for a GPU device (`kiln_backends`' `host-gpu`
/// feature) compiles for a plan.
pub fn kernel_unit(kernels: &[(&str, &str)]) -> String {
    let mut s = String::from(SHIM);
    s.push_str(
        "#include <cstddef>\n#include <utility>\n\
         template <typename... P, std::size_t... I>\n\
         void kiln_call_at(void (*f)(P...), void** a, std::index_sequence<I...>) { f(static_cast<P>(a[I])...); }\n\
         template <typename... P> void kiln_call(void (*f)(P...), void** a) {\n    \
         kiln_call_at(f, a, std::index_sequence_for<P...>{});\n}\n",
    );
    for (i, (source, name)) in kernels.iter().enumerate() {
        let _ = write!(s, "namespace kiln_k{i} {{\n{}\n}}\n", source.replace("extern \"C\" ", ""));
        driver(&mut s, &format!("kiln_run_{i}"), &format!("kiln_call(kiln_k{i}::{name}, args)"), source);
    }
    s
}

/// The driver `name(args, gx, gy, block)` that runs `call` for every thread of every block: in turn, or, for a
/// kernel with barriers, the block's threads at once meeting at a `std::barrier`.
fn driver(s: &mut String, name: &str, call: &str, source: &str) {
    let _ = write!(
        s,
        "extern \"C\" void {name}(void** args, unsigned int gx, unsigned int gy, unsigned int block) {{\n    \
         gridDim = {{gx, gy, 1}};\n    blockDim = {{block, 1, 1}};\n    \
         for (unsigned int by = 0; by < gy; by++)\n        for (unsigned int bx = 0; bx < gx; bx++) {{\n"
    );
    if source.contains("__syncthreads") {
        let _ = write!(
            s,
            "            std::barrier<> bar(block);\n            kiln_bar = &bar;\n            \
             std::vector<std::thread> ts;\n            for (unsigned int t = 0; t < block; t++)\n                \
             ts.emplace_back([=] {{ blockIdx = {{bx, by, 0}}; threadIdx = {{t, 0, 0}}; {call}; }});\n            \
             for (auto& th : ts) th.join();\n        }}\n}}\n"
        );
    } else {
        let _ = write!(
            s,
            "            for (unsigned int t = 0; t < block; t++) {{\n                blockIdx = {{bx, by, 0}};\n                \
             threadIdx = {{t, 0, 0}};\n                {call};\n            }}\n        }}\n}}\n"
        );
    }
}
