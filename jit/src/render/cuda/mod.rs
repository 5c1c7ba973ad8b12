//! Kernel IR -> CUDA C (for NVRTC) and HIP C (for hiprtc): one dialect of the shared C-like renderer
//! (`render::cstyle`) with a [`Flavor`] for what the two differ in. Both are C++ with the same kernel syntax
//! (`extern "C" __global__`, `blockIdx`, `threadIdx`, `__shared__`, `__syncthreads`, `atomicCAS`), so the deltas
//! are few: the comment naming the language, and (with the tensor-core GEMM, later) the warp size and the
//! half-precision headers. Generated code includes no header: hiprtc must not see `hip/hip_runtime.h`, and the
//! builtins used (`__uint_as_float`, `atomicCAS`, the math functions) are predefined by both compilers.
//!
//! One kernel is one `__global__` function: parameters `in0..` (const, restrict) in the buffers' element types
//! (`dialect::storage_ty`: bool and u8 one byte, f16 its bits), `out`, then the rng keys (`const unsigned int*`, 4
//! words per slot) when the kernel draws random numbers and the fault record (`int*`, `kernel::fault`) when it can
//! fault. Thread `t` of the grid (x-major over blocks, then y) computes output element `t` (a row kernel: row `t`)
//! with the shared `element` (and `row`) function, a lambda in the kernel body. The launch shape: 256-thread
//! blocks for elementwise kernels, 64 for short reductions over many outputs (each thread runs its whole reduce
//! loop, as on WGSL); blocks along x up to 2^31 - 1. Longer reductions and row kernels are cooperative
//! (`cstyle::Coop`): block `g` folds its outputs (its row) together, the partial results meeting in `__shared__`
//! memory, through the shared `coop` lambda.
//!
//! Every dtype: f64 and i64 are themselves (the shared table's f64 rows are its f32 rows, with the helpers
//! overloaded on `double`), f16 and bf16 are stored as their bits and computed in f32, rounded per op.
//!
//! The routines are written by hand: the scatter-sum (`scatter.rs`) and the linear algebra routines
//! (`linalg.rs`). Not here yet: warp-shuffle reductions (the block's tree stays in shared memory: `cstyle/coop.rs`
//! says why).

mod dialect;
mod gemm;
pub mod host;
mod linalg;
mod math;
mod mma;
mod scatter;

pub use crate::render::cstyle::KSplit;
pub use dialect::CudaC;
pub use gemm::{DEFAULT_TILE, render_gemm};
pub use mma::{BK as MMA_BK, MmaTile, mma_arch, render_gemm_mma};

use crate::dtype::DType;
use crate::kernel::KernelIr;
use crate::kernel::routine::Routine;
use crate::render::cstyle::{self, Emitter};
use dialect::storage_ty;
use std::fmt::Write;

/// Which C++ GPU language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// CUDA C, compiled by NVRTC.
    Cuda,
    /// HIP C, compiled by hiprtc.
    Hip,
}

impl Flavor {
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Cuda => "CUDA C",
            Flavor::Hip => "HIP C",
        }
    }

    /// The file extension of a source in this language (`KILN_DUMP`'s kernel files).
    pub fn extension(self) -> &'static str {
        match self {
            Flavor::Cuda => "cu",
            Flavor::Hip => "hip",
        }
    }
}

/// A rendered kernel and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuKernel {
    /// The `__global__` function's name (the kernel IR's).
    pub name: String,
    pub source: String,
    /// Threads per block.
    pub block: u32,
    /// Blocks along x and y; (0, 0) for an empty output (nothing to launch).
    pub grid: (u32, u32),
    /// Threads that compute (the rest of the last block returns at once); a cooperative kernel's every block.
    pub threads: u64,
    pub uses_rng: bool,
    pub can_fault: bool,
    /// Device memory the kernel needs besides its buffers (a split-K GEMM's), passed after them.
    pub workspace: Option<Workspace>,
}

/// A split-K GEMM's scratch (`gemm::split_end`), two parameters after the kernel's buffers: `counters` u32 words,
/// zero before the kernel's first launch and left zero by every launch (so one allocation serves every later
/// launch and graph replay), then room for `partials` f32 words, overwritten by each launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workspace {
    pub counters: usize,
    pub partials: usize,
}

/// The most blocks along x (CUDA's `maxGridDimX`; HIP's is larger).
const MAX_GRID_X: u64 = (1 << 31) - 1;

/// Checks that CUDA C / HIP C as rendered here can run `k`: every index expression of a kernel IR kernel in i32
/// (the routines index in 64 bits), and no row sort (`kernel::sort`: the CPU's routine; `Tensor::sort` builds a
/// sorting network for these devices).
pub fn check(k: &KernelIr) -> Result<(), String> {
    match k.routine {
        Some(Routine::Sort(_)) => Err(NO_SORT_ROUTINE.into()),
        Some(_) => Ok(()),
        None => cstyle::check_i32_indices(k),
    }
}

/// Why a row sort routine is refused here.
const NO_SORT_ROUTINE: &str =
    "the row sort routine runs on the CPU only; Tensor::sort builds a sorting network for this device";

/// A kernel's parameter list: its inputs (const, restrict) in their storage types, the output, then the rng keys
/// and the fault record where it has them.
fn params(k: &KernelIr, uses_rng: bool, can_fault: bool) -> String {
    let mut params: Vec<String> = k
        .inputs
        .iter()
        .enumerate()
        .map(|(i, b)| format!("const {}* __restrict__ in{i}", storage_ty(b.dtype)))
        .collect();
    params.push(format!("{}* __restrict__ out", storage_ty(k.output.dtype)));
    if uses_rng {
        params.push("const unsigned int* __restrict__ rng".into());
    }
    if can_fault {
        params.push("int* __restrict__ fault".into());
    }
    params.join(", ")
}

/// Renders `k` for `flavor`.
pub fn render(k: &KernelIr, flavor: Flavor) -> Result<GpuKernel, String> {
    check(k)?;
    match &k.routine {
        Some(Routine::Scatter(s)) => return Ok(scatter::render(s, flavor)),
        Some(Routine::Linalg(l)) => return linalg::render(l, flavor),
        Some(Routine::Sort(_)) => return Err(NO_SORT_ROUTINE.into()),
        None => {}
    }
    let coop = cstyle::Coop::choose(k);
    let outputs = k.units() as u64;
    // A cooperative kernel runs a block per `lanes` outputs (or per row); the generic one a thread per output.
    let (block, blocks): (u32, u64) = match coop {
        Some(c) => (c.width(), c.groups(k) as u64),
        None => {
            let block = if k.reduce.is_some() || !k.rows.is_empty() { 64 } else { 256 };
            (block, outputs.div_ceil(block as u64))
        }
    };
    let threads = if coop.is_some() { blocks * block as u64 } else { outputs };
    let grid = if blocks == 0 { (0, 0) } else { (blocks.min(MAX_GRID_X) as u32, blocks.div_ceil(MAX_GRID_X) as u32) };
    let dialect = CudaC { flavor };
    let mut em = Emitter::new(&dialect, k);
    let body = match (threads, coop) {
        (0, _) => String::new(),
        (_, Some(c)) => em.coop_fns(c),
        (_, None) => {
            let mut b = em.element_fn();
            if !k.rows.is_empty() {
                b.push_str(&em.row_fn());
            }
            b
        }
    };
    // Every kernel with an f16 buffer converts it on the bits (`math::F16`); bf16 buffers need only the prelude.
    if k.inputs.iter().chain([&k.output]).any(|b| b.dtype == DType::F16) {
        em.helpers.insert(cstyle::Helper::F16);
    }
    let mut s = format!("// kiln kernel {} ({})\n", k.name, flavor.name());
    s.push_str(math::PRELUDE);
    s.push_str(&em.helpers_source());
    let _ = write!(
        s,
        "\nextern \"C\" __global__ void __launch_bounds__({block}) {}({}) {{\n",
        k.name,
        params(k, em.uses_rng, k.can_fault())
    );
    if threads > 0 {
        for line in body.lines().skip_while(|l| l.is_empty()) {
            if line.is_empty() {
                s.push('\n');
            } else {
                let _ = writeln!(s, "    {line}");
            }
        }
        if coop.is_some() {
            // The whole block returns or none of it: `coop` meets the block's threads at barriers.
            let _ = write!(
                s,
                "    const long long g = (long long)blockIdx.y * gridDim.x + blockIdx.x;\n    \
                 if (g >= {blocks}ll) {{ return; }}\n    coop((int)g, (int)threadIdx.x);\n"
            );
        } else {
            let call = if k.rows.is_empty() { "element" } else { "row" };
            let _ = write!(
                s,
                "    const long long t = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * {block} + threadIdx.x;\n    \
                 if (t >= {threads}ll) {{ return; }}\n    {call}((int)t);\n"
            );
        }
    }
    s.push_str("}\n");
    Ok(GpuKernel {
        name: k.name.clone(),
        source: s,
        block,
        grid,
        threads,
        uses_rng: em.uses_rng,
        can_fault: k.can_fault(),
        workspace: None,
    })
}
