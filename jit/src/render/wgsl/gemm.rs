//! The tiled GEMM template (`render::cstyle::gemm_parts`) as one WGSL compute shader: the bindings and helpers, the
//! epilogue function, the two `var<workgroup>` slices, and the entry point that declares the workgroup id (`wid`)
//! and local index (`lid`) the shared body reads. Also the launch grid: (tiles of N) x (tiles of M * batch).
//!
//! Does not own: which tile to use (the search space and score live in the wgpu backend), or whether a kernel is a
//! GEMM (`GemmView::of`).

use super::{Emitter, Wgsl, WgslKernel, groups_for, header};
use crate::kernel::KernelIr;
use crate::kernel::gemm::GemmView;
pub use crate::render::cstyle::GemmTile;
use crate::render::cstyle::gemm_parts;

/// Renders GEMM kernel `k` (recognized as `v`) with tile `t`. Errors when the kernel cannot be rendered in WGSL
/// (see `check`), the tile is malformed, or the grid exceeds the dispatch limits (the caller falls back to the
/// generic kernel).
pub fn render_gemm(k: &KernelIr, v: &GemmView, t: GemmTile) -> Result<WgslKernel, String> {
    super::check(k)?;
    if !t.well_formed() {
        return Err(format!("malformed GEMM tile {t:?}"));
    }
    let tiles_m = v.m.div_ceil(t.tm as usize) as u64;
    let tiles_n = v.n.div_ceil(t.tn as usize) as u64;
    let rows = tiles_m * v.batch_count().max(1) as u64;
    // The grid is (tiles of N) x (tiles of M * batch): both must fit one dispatch dimension.
    let (gx, gy) = (groups_for(tiles_n, 1)?, groups_for(rows, 1)?);
    if gx.1 != 1 || gy.1 != 1 {
        return Err(format!("GEMM grid {tiles_n} x {rows} exceeds the dispatch limits"));
    }
    let mut em = Emitter::new(&Wgsl, k);
    let parts = gemm_parts(&mut em, v, t, None);
    let mut s = header(&em);
    s.push_str(&parts.epilogue);
    s.push_str(&parts.shared);
    s.push_str(&format!(
        "\n@compute @workgroup_size({})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32) {{\n",
        t.threads()
    ));
    s.push_str(&parts.body);
    s.push_str("}\n");
    Ok(WgslKernel {
        name: k.name.clone(),
        source: s,
        workgroup: t.threads(),
        groups: (gx.0, gy.0),
        inputs: k.inputs.len(),
        uses_rng: em.uses_rng,
        // Never a kernel that gathers (`gemm_kernel` in the wgpu backend declines those).
        can_fault: false,
        // The K loop steps by a stage of `kt`, and each stage's loop runs `kt` trips (its staging loops fewer).
        trips: v.k.div_ceil(t.kt as usize).max(t.kt as usize),
    })
}
