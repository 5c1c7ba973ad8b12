//! The tiled GEMM template (`render::cstyle::gemm_parts`) as one CUDA C / HIP C kernel: the shared template's
//! epilogue (a lambda, as the dialect's functions are: it reads the kernel's parameters), the two `__shared__`
//! slices and the staging body inside one `__global__` function with the generic kernels' parameter list. The grid
//! is (tiles of N) x (tiles of M * batch), one block of `tile.threads()` threads per tile, as on WGSL.
//!
//! **Split K** (both templates, [`KSplit`]): for products with few tiles of C and a long K, `splits` blocks share
//! each tile, each summing its range of K; the grid's x holds both (`x = ks * tiles_n + tile of N`). Each block
//! writes its partial tile to the kernel's workspace, then counts itself in (an `atomicAdd` on the tile's counter,
//! after a `__threadfence` so its partials are visible first); the block that counts last adds every split's
//! partials in split order (so the sum, and the result, do not depend on which block came last), runs the
//! epilogue, and resets the counter to zero for the next launch. One launch, deterministic, no float atomics; the
//! cost is the partials' round trip through L2 (`splits x` the tile), small next to a skinny product's operand
//! traffic.
//!
//! **Vector loads**: an operand whose layout allows it (`cstyle::vectorizable`: contiguous along the way
//! the slice is read, offset and strides multiples of 4 elements) is staged 4 elements a load, 16 bytes of f32 or
//! 8 of bf16/f16 (`Dialect::load4`, the helpers below), checked element loads where a vector crosses a ragged edge.
//! The host shim aborts on a misaligned vector, as a GPU faults.
//!
//! Does not own: which tile to use (the device's default or its tuner), or whether a kernel is a GEMM
//! (`GemmView::of`). Operands are f32, bf16 or f16 (widened to f32 as they are staged), the output f32 or the
//! operands' half dtype. Not done: asynchronous copies (`cp.async`) and double-buffered slices.

use super::{CudaC, Flavor, GpuKernel, MAX_GRID_X, Workspace, check, math, params};
use crate::dtype::DType;
use crate::kernel::KernelIr;
use crate::kernel::gemm::GemmView;
use crate::render::cstyle::{self, Acc, Emitter, GemmTile, KSplit, gemm_parts};
use std::fmt::Write;

/// The tile a CUDA GEMM uses until the device tunes its own: 64 x 64 of C per block, 4 x 4 per thread (256
/// threads), K in slices of 16 (8 KiB of shared memory).
pub const DEFAULT_TILE: GemmTile = GemmTile { tm: 64, tn: 64, rm: 4, rn: 4, kt: 16 };

/// Renders GEMM kernel `k` (recognized as `v`) with tile `t` for `flavor`, K split `splits` ways (1: not split).
/// Errors for a kernel the dialect cannot render, a malformed tile, one that gathers (its fault record is not
/// threaded through the template), or a grid beyond the launch limits (the caller then renders the generic kernel).
pub fn render_gemm(k: &KernelIr, v: &GemmView, t: GemmTile, splits: u32, flavor: Flavor) -> Result<GpuKernel, String> {
    check(k)?;
    if !t.well_formed() {
        return Err(format!("malformed GEMM tile {t:?}"));
    }
    if k.can_fault() {
        return Err(format!("kernel {}: a GEMM that gathers runs as the generic kernel", k.name));
    }
    // The template stages both operands widened to f32 (exact for f32, bf16 and f16, the dtypes `GemmView` takes)
    // and accumulates in f32; a half output is the epilogue's rounding of that sum, as in the interpreter.
    if !matches!(v.operands, DType::F32 | DType::BF16 | DType::F16)
        || !matches!(v.out, DType::F32 | DType::BF16 | DType::F16)
    {
        return Err(format!("kernel {}: the tiled GEMM takes f32, bf16 or f16 operands and output", k.name));
    }
    let split = split_of(v, t.kt, splits)?;
    let (_, blocks) = grid(v, t.tm, t.tn, splits)?;
    let dialect = CudaC { flavor };
    let mut em = Emitter::new(&dialect, k);
    let parts = gemm_parts(&mut em, v, t, split);
    if k.inputs.iter().chain([&k.output]).any(|b| b.dtype == DType::F16) {
        em.helpers.insert(cstyle::Helper::F16);
    }
    let split_name = if splits > 1 { format!(", K split {splits} ways") } else { String::new() };
    let mut head = format!("// kiln kernel {} ({}, tiled GEMM {}{split_name})\n", k.name, flavor.name(), t.name());
    head.push_str(math::PRELUDE);
    head.push_str(&em.helpers_source());
    if parts.vector_loads {
        head.push_str(VECTOR_LOADS);
    }
    let (tail, workspace) = split_end(v, (t.tm, t.tn), split, blocks, &parts.accumulators)?;
    let lines = parts.epilogue.lines().chain(parts.shared.lines()).chain(parts.body.lines()).chain(tail.lines());
    Ok(assemble(k, head, t.threads(), lines, blocks, em.uses_rng, workspace))
}

/// The vector loads `Dialect::load4` renders for this template: 4 elements as one aligned load (the host shim
/// defines its own, checking the alignment). `alignas` rather than CUDA's `__align__`: HIP C has it too.
const VECTOR_LOADS: &str = r#"// 4 operand elements as one load (16 bytes of f32, 8 of 16-bit values), aligned.
#ifndef KILN_HOST_SHIM
template <typename T> struct alignas(4 * sizeof(T)) kiln_v4 { T v[4]; };
__device__ __forceinline__ kiln_v4<float> kiln_ld4f(const float* p) { return *(const kiln_v4<float>*)p; }
__device__ __forceinline__ kiln_v4<unsigned short> kiln_ld4h(const unsigned short* p) {
    return *(const kiln_v4<unsigned short>*)p;
}
#endif
"#;

/// `splits` ways over `v`'s K in slices of `kt`: `None` for 1; an error for 0, or for more splits than K has
/// slices (a split would sum nothing).
pub(super) fn split_of(v: &GemmView, kt: u32, splits: u32) -> Result<Option<KSplit>, String> {
    match splits {
        0 => Err("a GEMM split 0 ways".into()),
        1 => Ok(None),
        s if (s as usize) > v.k.div_ceil(kt as usize) => Err(format!("K = {} has fewer than {s} slices of {kt}", v.k)),
        s => Ok(Some(KSplit::of(v.k, kt, s))),
    }
}

/// The end of a GEMM kernel whose blocks are `bm x bn` tiles of C, launched over `blocks`, and its workspace:
/// nothing without a split (the body called the epilogue itself); with one (x: splits x tiles of N), each thread's
/// accumulators `accs` (relative to the tile's corner `m0`, `n0`; the body declared `ks`, `bz`, `m0`, `n0`) stored
/// as the block's partials, the count, and the last block's sum and epilogue (see the module doc). An error where
/// the partials would not fit 32-bit indices.
pub(super) fn split_end(
    v: &GemmView,
    (bm, bn): (u32, u32),
    split: Option<KSplit>,
    blocks: (u32, u32),
    accs: &[Acc],
) -> Result<(String, Option<Workspace>), String> {
    let Some(KSplit { splits, .. }) = split else { return Ok((String::new(), None)) };
    let tiles_n = blocks.0 / splits;
    let tiles = u64::from(tiles_n) * u64::from(blocks.1);
    let tile_len = u64::from(bm) * u64::from(bn);
    let partials = u64::from(splits) * tiles * tile_len;
    if partials > i32::MAX as u64 {
        return Err(format!("a {splits}-way split's partials ({partials} floats) exceed 32-bit indices"));
    }
    let (m, n) = (v.m, v.n);
    let mut s = String::new();
    let _ = writeln!(s, "const int tile = (int)blockIdx.y * {tiles_n} + (int)(blockIdx.x % {tiles_n}u);");
    let _ = writeln!(s, "float* mine = kiln_part + (ks * {tiles} + tile) * {tile_len};");
    for a in accs {
        let _ = writeln!(s, "mine[({}) * {bn} + {}] = {};", a.row, a.col, a.value);
    }
    s.push_str(
        "// Partials visible device-wide before this block counts itself in.\n__threadfence();\n__syncthreads();\n\
         __shared__ int kiln_last;\nif (threadIdx.x == 0) {\n",
    );
    let _ = writeln!(s, "    kiln_last = atomicAdd(kiln_count + tile, 1u) == {}u;", splits - 1);
    s.push_str(
        "    // Every split has counted: reset for the next launch.\n    if (kiln_last) { kiln_count[tile] = 0u; }\n}\n\
         __syncthreads();\nif (!kiln_last) { return; }\n__threadfence();\n",
    );
    // Volatile: other multiprocessors wrote these during this launch, so they are read past this one's L1.
    let _ = writeln!(s, "const volatile float* parts = kiln_part + tile * {tile_len};");
    for a in accs {
        let (r, c) = (&a.row, &a.col);
        let _ = writeln!(
            s,
            "if (m0 + {r} < {m} && n0 + {c} < {n}) {{\n    float sum = 0.0f;\n    \
             for (int p = 0; p < {splits}; p++) {{ sum += parts[p * {} + ({r}) * {bn} + {c}]; }}\n    \
             epilogue(bz, m0 + {r}, n0 + {c}, sum);\n}}",
            tiles * tile_len
        );
    }
    Ok((s, Some(Workspace { counters: tiles as usize, partials: partials as usize })))
}

/// The grid of a GEMM template whose blocks take `bm x bn` of C, K split `splits` ways: the tiles of M, and the
/// blocks launched (N's tiles times the splits by M's times the batch); an error past the launch limits (the
/// caller then renders another kernel).
pub(super) fn grid(v: &GemmView, bm: u32, bn: u32, splits: u32) -> Result<(u64, (u32, u32)), String> {
    let tiles_m = v.m.div_ceil(bm as usize) as u64;
    let tiles_n = v.n.div_ceil(bn as usize) as u64 * u64::from(splits.max(1));
    let rows = tiles_m * v.batch_count().max(1) as u64;
    if tiles_n > MAX_GRID_X || rows > 65_535 {
        return Err(format!("GEMM grid {tiles_n} x {rows} exceeds the launch limits"));
    }
    Ok((tiles_m, (tiles_n as u32, rows as u32)))
}

/// A GEMM template's kernel: `head` (comment, prelude, helpers), then one `__global__` function of `threads`-thread
/// blocks with the generic kernels' parameter list (and the split-K workspace's two, with one) whose body is
/// `lines`, launched over `blocks` (`grid`).
pub(super) fn assemble<'a>(
    k: &KernelIr,
    mut head: String,
    threads: u32,
    lines: impl Iterator<Item = &'a str>,
    blocks: (u32, u32),
    uses_rng: bool,
    workspace: Option<Workspace>,
) -> GpuKernel {
    let mut params = params(k, uses_rng, false);
    if workspace.is_some() {
        params.push_str(", unsigned int* __restrict__ kiln_count, float* __restrict__ kiln_part");
    }
    let _ = write!(head, "\nextern \"C\" __global__ void __launch_bounds__({threads}) {}({params}) {{\n", k.name);
    for line in lines.filter(|l| !l.is_empty()) {
        let _ = writeln!(head, "    {line}");
    }
    head.push_str("}\n");
    GpuKernel {
        name: k.name.clone(),
        source: head,
        block: threads,
        grid: blocks,
        threads: u64::from(threads) * u64::from(blocks.0) * u64::from(blocks.1),
        uses_rng,
        can_fault: false,
        workspace,
    }
}
