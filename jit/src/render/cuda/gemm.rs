//! The tiled GEMM template (`render::cstyle::gemm_parts`) as one CUDA C / HIP C kernel: the shared template's
//! epilogue (a lambda, as the dialect's functions are: it reads the kernel's parameters), the two `__shared__`
//! slices and the staging body inside one `__global__` function with the generic kernels' parameter list. The grid
//! is (tiles of N) x (tiles of M * batch), one block of `tile.threads()` threads per tile, as on WGSL.
//!
//! Does not own: which tile to use (the device's default or its tuner), or whether a kernel is a GEMM
//! (`GemmView::of`). Operands are f32 or bf16 (widened to f32 as they are staged), the output f32 or bf16. Not yet:
//! tensor-core (`mma.sync`) tiles, vector loads, split K.

use super::{CudaC, Flavor, GpuKernel, MAX_GRID_X, check, math, params};
use crate::dtype::DType;
use crate::kernel::KernelIr;
use crate::kernel::gemm::GemmView;
use crate::render::cstyle::{self, Emitter, GemmTile, gemm_parts};
use std::fmt::Write;

/// The tile a CUDA GEMM uses until the device tunes its own: 64 x 64 of C per block, 4 x 4 per thread (256
/// threads), K in slices of 16 (8 KiB of shared memory).
pub const DEFAULT_TILE: GemmTile = GemmTile { tm: 64, tn: 64, rm: 4, rn: 4, kt: 16 };

/// Renders GEMM kernel `k` (recognized as `v`) with tile `t` for `flavor`. Errors for a kernel the dialect cannot
/// render, a malformed tile, one that gathers (its fault record is not threaded through the template), or a grid
/// beyond the launch limits (the caller then renders the generic kernel).
pub fn render_gemm(k: &KernelIr, v: &GemmView, t: GemmTile, flavor: Flavor) -> Result<GpuKernel, String> {
    check(k)?;
    if !t.well_formed() {
        return Err(format!("malformed GEMM tile {t:?}"));
    }
    if k.can_fault() {
        return Err(format!("kernel {}: a GEMM that gathers runs as the generic kernel", k.name));
    }
    // The template stages both operands widened to f32 (exact for f32 and bf16, the two dtypes `GemmView` takes)
    // and accumulates in f32; a bf16 output is the epilogue's rounding of that sum, as in the interpreter.
    if !matches!(v.operands, DType::F32 | DType::BF16) || !matches!(v.out, DType::F32 | DType::BF16) {
        return Err(format!("kernel {}: the tiled GEMM takes f32 or bf16 operands and output", k.name));
    }
    let (_, blocks) = grid(v, t.tm, t.tn)?;
    let dialect = CudaC { flavor };
    let mut em = Emitter::new(&dialect, k);
    let parts = gemm_parts(&mut em, v, t);
    if k.inputs.iter().chain([&k.output]).any(|b| b.dtype == DType::F16) {
        em.helpers.insert(cstyle::Helper::F16);
    }
    let mut head = format!("// kiln kernel {} ({}, tiled GEMM {})\n", k.name, flavor.name(), t.name());
    head.push_str(math::PRELUDE);
    head.push_str(&em.helpers_source());
    let lines = parts.epilogue.lines().chain(parts.shared.lines()).chain(parts.body.lines());
    Ok(assemble(k, head, t.threads(), lines, blocks, em.uses_rng))
}

/// The grid of a GEMM template whose blocks take `bm x bn` of C: the tiles of M, and the blocks launched (N's tiles
/// by M's times the batch); an error past the launch limits (the caller then renders another kernel).
pub(super) fn grid(v: &GemmView, bm: u32, bn: u32) -> Result<(u64, (u32, u32)), String> {
    let tiles_m = v.m.div_ceil(bm as usize) as u64;
    let tiles_n = v.n.div_ceil(bn as usize) as u64;
    let rows = tiles_m * v.batch_count().max(1) as u64;
    if tiles_n > MAX_GRID_X || rows > 65_535 {
        return Err(format!("GEMM grid {tiles_n} x {rows} exceeds the launch limits"));
    }
    Ok((tiles_m, (tiles_n as u32, rows as u32)))
}

/// A GEMM template's kernel: `head` (comment, prelude, helpers), then one `__global__` function of `threads`-thread
/// blocks with the generic kernels' parameter list whose body is `lines`, launched over `blocks` (`grid`).
pub(super) fn assemble<'a>(
    k: &KernelIr,
    mut head: String,
    threads: u32,
    lines: impl Iterator<Item = &'a str>,
    blocks: (u32, u32),
    uses_rng: bool,
) -> GpuKernel {
    let _ = write!(
        head,
        "\nextern \"C\" __global__ void __launch_bounds__({threads}) {}({}) {{\n",
        k.name,
        params(k, uses_rng, false)
    );
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
    }
}
