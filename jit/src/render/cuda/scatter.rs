//! The scatter-sum routine (`kernel::scatter`) in CUDA C and HIP C: the WGSL form's layout and loop
//! (`render/wgsl/scatter.rs`), one thread per column of a block of output rows, no atomics but the fault record's.

use super::dialect::storage_ty;
use super::{Flavor, GpuKernel, MAX_GRID_X};
use crate::kernel::fault::FAULT_SCATTER_INDEX;
use crate::kernel::scatter::ScatterRows;

/// Threads per block.
const BLOCK: u32 = 256;

/// Threads a launch aims at: a few per core of a large GPU (an H200's 132 SMs), each walking every index.
const TARGET_THREADS: usize = 16384;

/// The kernel of `s` for `flavor`.
pub(super) fn render(s: &ScatterRows, flavor: Flavor) -> GpuKernel {
    let k = s.kernel();
    let l = s.gpu_layout(TARGET_THREADS);
    let (w, p) = (s.width, s.positions);
    let index_at = if s.per_element { format!("t * {w}ll + w") } else { "t".to_string() };
    let (idx_ty, val_ty) = (storage_ty(s.index), storage_ty(s.dtype));
    let blocks = (l.threads as u64).div_ceil(BLOCK as u64);
    let grid =
        if l.threads == 0 { (0, 0) } else { (blocks.min(MAX_GRID_X) as u32, blocks.div_ceil(MAX_GRID_X) as u32) };
    let source = format!(
        r#"// kiln kernel {name} ({lang})
extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(const {idx_ty}* __restrict__ in0, const {val_ty}* __restrict__ in1, {val_ty}* __restrict__ out, int* __restrict__ fault) {{
    const long long g = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * {BLOCK} + threadIdx.x;
    if (g >= {threads}ll) {{ return; }}
    const long long w = g % {w}ll;
    const long long lo = (g / {w}ll) * {block_rows}ll;
    const long long hi = lo + {block_rows}ll < {p}ll ? lo + {block_rows}ll : {p}ll;
    for (long long r = lo; r < hi; r++) {{
        out[r * {w}ll + w] = 0;
    }}
    for (long long t = 0; t < {rows}ll; t++) {{
        const long long i = in0[{index_at}];
        if (i < 0 || i >= {p}ll) {{
            if (lo == 0 && atomicCAS(fault, 0, {FAULT_SCATTER_INDEX}) == 0) {{
                atomicExch(fault + 1, {p});
                atomicExch(fault + 2, (int)i);
            }}
            continue;
        }}
        if (i >= lo && i < hi) {{
            out[i * {w}ll + w] += in1[t * {w}ll + w];
        }}
    }}
}}
"#,
        name = k.name,
        lang = flavor.name(),
        threads = l.threads,
        block_rows = l.block_rows,
        rows = s.rows,
    );
    GpuKernel {
        name: k.name,
        source,
        block: BLOCK,
        grid,
        threads: l.threads as u64,
        uses_rng: false,
        can_fault: true,
        workspace: None,
    }
}
