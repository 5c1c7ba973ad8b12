//! The scatter-sum routine (`kernel::scatter`) in WGSL: one invocation per column of a block of output rows
//! (`ScatterRows::gpu_layout`), which zeroes its rows and then walks every index in row order, adding the values that
//! land in them. Each element is written by one invocation, in row order: no atomics, the same bits as the CPU and
//! the reference. Indices are i32 (the only integers the wgpu device stores); values f32.
//!
//! An index out of range is reported by the invocations of the first block (every invocation reads every index, so
//! they see them all) and skipped.

use super::routine::FAULT_FN;
use super::{WgslKernel, groups_for};
use crate::dtype::DType;
use crate::kernel::fault::FAULT_SCATTER_INDEX;
use crate::kernel::scatter::{GpuLayout, ScatterRows};

/// Invocations per workgroup.
const WG: u32 = 64;

/// Invocations a launch aims at: enough to fill a GPU's cores at a few per core without every one of many
/// thousands re-reading all the indices; a CPU adapter (lavapipe) runs them on its few threads either way.
const TARGET_THREADS: usize = 4096;

/// The layout WGSL launches `s` with.
pub(super) fn layout(s: &ScatterRows) -> GpuLayout {
    s.gpu_layout(TARGET_THREADS)
}

/// The shader of `s`.
pub(super) fn render(s: &ScatterRows) -> Result<WgslKernel, String> {
    if s.dtype != DType::F32 || s.index != DType::I32 {
        return Err(format!(
            "scatter of {} values by {} indices: WGSL runs f32 values and i32 indices only",
            s.dtype, s.index
        ));
    }
    let k = s.kernel();
    let l = layout(s);
    let (w, p) = (s.width, s.positions);
    let index_at = if s.per_element { format!("t * {w}u + w") } else { "t".to_string() };
    let src = format!(
        r#"// kiln routine {name}
@group(0) @binding(0) var<storage, read> idx: array<i32>;
@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> fault: array<atomic<i32>, 3>;
{FAULT_FN}
@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let g = (wid.x + wid.y * nwg.x) * {WG}u + lid;
    if (g >= {threads}u) {{ return; }}
    let w = g % {w}u;
    let lo = (g / {w}u) * {block_rows}u;
    let hi = min(lo + {block_rows}u, {p}u);
    for (var r = lo; r < hi; r++) {{
        out[r * {w}u + w] = 0.0f;
    }}
    for (var t = 0u; t < {rows}u; t++) {{
        let i = idx[{index_at}];
        if (i < 0 || i >= {p}) {{
            if (lo == 0u) {{ kiln_fault({FAULT_SCATTER_INDEX}, {p}u, bitcast<u32>(i)); }}
            continue;
        }}
        let r = u32(i);
        if (r >= lo && r < hi) {{
            out[r * {w}u + w] += vals[t * {w}u + w];
        }}
    }}
}}
"#,
        name = k.name,
        threads = l.threads,
        block_rows = l.block_rows,
        rows = s.rows,
    );
    Ok(WgslKernel {
        name: k.name,
        source: src,
        workgroup: WG,
        groups: groups_for(l.threads as u64, WG)?,
        inputs: 2,
        uses_rng: false,
        can_fault: true,
        trips: l.trips,
    })
}
