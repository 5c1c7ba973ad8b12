//! Fusion and scheduling: which graph nodes get a buffer, which kernel computes each, and where buffers are reused.
//!
//! Rules (docs/architecture.md, "Fusion"), applied in this order:
//! 1. Materialized ("realized into a buffer"): inputs, graph outputs, `Contiguous`, every `Reduce`, `Matmul` and
//!    `Linalg` and the sources of a `Linalg` (a routine, `routine.rs`), the source of every `Gather` (read at
//!    data-dependent places), and any node that several nodes read (or that feeds an `Expand`) unless recomputing
//!    it is cheap: at most `CHEAP_OPS` ALU ops and no transcendental or random op on the way back to materialized
//!    nodes.
//!    1b. Where such a node widens bf16 to f32 and the backend has a bf16 GEMM, its bf16 source is stored instead.
//!    1c. A node stored only for its several readers, all of which are inlined into one kernel, is computed in that
//!    kernel instead (lowering memoizes it per element).
//!    1d. One whose reading kernels each evaluate everything it is computed from at the same element anyway is
//!    recomputed by each of them, when that costs at most `RECOMPUTE_OPS` ALU ops.
//! 2. Everything else is inlined into each kernel that reads it: elementwise chains fuse, elementwise ops fuse into
//!    a reduction's input, and movement ops become index math (no copies).
//!    A value a broadcast fans out (a vector expanded over a matrix) is stored if it costs any ALU op (rule 2d).
//!    A matmul of bf16 values widened to f32 reads them in bf16 where the backend has a bf16 GEMM (rule 2e); f16
//!    likewise where it has an f16 GEMM.
//! 3. A reduction (or matmul) whose value flows only through elementwise ops and reshapes into one materialized
//!    node becomes that node's *reduce stage*: its buffer disappears and the ops after it run in the same kernel
//!    as an epilogue (`(a * b + c).relu().sum(1)` and `x.matmul(&w) + b` then relu are one kernel each).
//!    3b. A reduction over a row that only one kernel over the same rows reads becomes that kernel's row reduction
//!    (a row kernel, `rows.rs`): softmax, log_softmax, layer norm and cross entropy run as one kernel each.
//! 4. Kernels run in topological order. Intermediate buffers live from the launch that writes them to the last
//!    launch that reads them, and share arena slots when their lifetimes do not overlap; a constant's
//!    (`KernelIr::is_constant`) is its own for the whole plan (`KernelPlan::constant`).
//! 5. Except that a kernel replacing an input (a parameter update) runs after every other reader of that input (and
//!    no later), so its output may take the input's buffer (`donate.rs`).
//! 6. A reduction to one value folds adjacent reduce loops that its indices walk as one into one loop, and a large
//!    one runs as two kernels, partial results over all cores and then their fold (`split.rs`); the partials take
//!    an arena slot between the two launches.
//!
//! 7. An elementwise kernel whose indices divide a loop variable (a reshape across a permutation) has its output
//!    loops split where that makes them affine (`loop_split.rs`): same elements, same order, no division per
//!    element, and vector loads along the innermost loop.
//!
//! 8. A kernel reads at most [`MAX_KERNEL_INPUTS`] buffers (fewer where the backend binds fewer,
//!    `ScheduleOptions::max_inputs`): past that, nodes inlined into it are stored (`cut_point`, as many as bring it
//!    within the budget) and the graph scheduled again.
//!
//! The rules live beside this file, one concern a file: which nodes are stored (`store.rs`: rule 1 and its
//! exceptions 1b-1d; `operands.rs`: what a GEMM reads, rules 2b-2e; `patch.rs`: rule 2f), the walks they share
//! (`region.rs`), half-precision GEMMs (`half.rs`), reduce stages and row kernels (`stage.rs`: rules 3, 3b, 3c),
//! the kernels lowered in order within their input budget (`kernels.rs`: rules 5-8) and the arena (`slots.rs`:
//! rule 4). `schedule_pinned` runs them in that order over one `Round`.
//!
//! Deliberately not done yet: multi-output kernels (two reductions of the same input, both stored, run as two
//! kernels).

mod half;
mod kernels;
mod operands;
mod patch;
mod region;
mod slots;
mod stage;
mod store;

use crate::graph::Graph;
use crate::kernel::ir::{BufParam, KernelIr};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::NodeIndexable;

/// The most buffers one kernel reads (rule 8), unless the backend asks for fewer (`ScheduleOptions::max_inputs`).
/// With its output, random-number keys and fault record that is at most 27 bindings: within every desktop wgpu
/// adapter's storage buffers per shader stage on Vulkan and Metal (Metal's 31, lavapipe's 32), where a gradient norm
/// over a 4-layer GPT's 52 parameters, one sum over 52 stored norms, had asked for 53. Not the largest budget any
/// device allows: the CPU and CUDA could take more, and a device whose plans differ only here gains nothing by it.
pub const MAX_KERNEL_INPUTS: usize = 24;

/// Longest chain of inlined nodes in one kernel. Past it a node is materialized: this bounds kernel size (and so
/// compile time) and the recursion depth of lowering, whatever the user's graph.
const MAX_FUSED_DEPTH: usize = 128;

/// Where a launch reads or writes a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The plan's input `n` (a realized tensor).
    Input(usize),
    /// Arena slot `n` (an intermediate).
    Temp(usize),
    /// The plan's output `n` (handed back to the caller).
    Output(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: KernelIr,
    pub inputs: Vec<Slot>,
    pub output: Slot,
}

/// A whole graph as kernels: what a backend compiles.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelPlan {
    pub launches: Vec<Launch>,
    /// Byte size of each arena slot.
    pub temps: Vec<usize>,
    /// dtype and length of each output.
    pub outputs: Vec<BufParam>,
    /// Graph outputs that are plain inputs (the caller already has them): output n is input m.
    pub passthrough: Vec<(usize, usize)>,
}

impl KernelPlan {
    /// Whether launch `i` computes a constant ([`KernelIr::is_constant`]) into a temp slot no other value shares:
    /// after one complete run, an arena that keeps its temps holds that value and may skip the launch.
    pub fn constant(&self, i: usize) -> bool {
        let l = &self.launches[i];
        matches!(l.output, Slot::Temp(_)) && l.kernel.is_constant()
    }
}

/// Choices a backend makes about scheduling.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleOptions {
    /// Rule 2b: copy a transposed right operand to contiguous memory before a GEMM with M >= 8. A backend whose
    /// GEMM packs its operands (the CPU's generated GEMM reads any strides while packing) turns it off: the copy
    /// would be a second pass over the weights every step.
    pub transpose_copy: bool,
    /// Rule 3b: row kernels. On unless `KILN_ROW_KERNELS=off` (read once; to compare them with the kernels they
    /// replace, and to bisect).
    pub row_kernels: bool,
    /// Which row kernels the backend takes (`None`: every one). The CPU takes those it generates at full vector
    /// width: elsewhere its 4-lane Cranelift code, evaluating `exp` once per pass, costs more than the passes over
    /// memory a row kernel saves, and the kernels stay apart.
    pub row_kernel_ok: Option<fn(&KernelIr) -> bool>,
    /// Rule 2e: the backend runs GEMMs on bf16 operands (`GemmView::operands`), so a matmul of two bf16 values
    /// widened to f32 reads them where they are stored instead of storing f32 copies, and a cast of its result
    /// to bf16 joins it as the epilogue's store. Without it, the matmul's result is stored in f32 first.
    pub bf16_gemm: bool,
    /// Rule 2e for f16: the backend runs GEMMs on f16 operands too (the GPU devices), read where they are stored.
    pub f16_gemm: bool,
    /// Rule 2f: the backend's GEMM reads a patched B (`gemm::Patch`, `GemmView::of_patched`) in GEMMs of at least
    /// this volume (M * N * K), so such a B is read where it is stored instead of copied into the GEMM's layout.
    pub patched_b: Option<usize>,
    /// Rule 2f with a zero padding folded into the patched B (`gemm::Patch::ranges`): the backend packs what lies
    /// inside it and zeros the rest, so the padded input is not stored.
    pub patched_pad: bool,
    /// Rule 8's budget: the most buffers one kernel reads. [`MAX_KERNEL_INPUTS`] unless the device binds fewer
    /// (wgpu on an OpenGL adapter: 16 storage buffers per shader stage, so at most 13 inputs).
    pub max_inputs: usize,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        static ROWS: std::sync::LazyLock<bool> =
            std::sync::LazyLock::new(|| std::env::var("KILN_ROW_KERNELS").map_or(true, |v| v != "off"));
        ScheduleOptions {
            transpose_copy: true,
            row_kernels: *ROWS,
            row_kernel_ok: None,
            bf16_gemm: false,
            f16_gemm: false,
            patched_b: None,
            patched_pad: false,
            max_inputs: MAX_KERNEL_INPUTS,
        }
    }
}

/// Decides materialization and reduce stages, lowers every kernel and plans memory.
pub fn schedule(graph: &Graph) -> KernelPlan {
    schedule_with(graph, ScheduleOptions::default())
}

/// [`schedule`] with explicit options.
pub fn schedule_with(graph: &Graph, opts: ScheduleOptions) -> KernelPlan {
    let mut simplified = graph.clone();
    crate::kernel::simplify::simplify(&mut simplified);
    let graph = &simplified;
    // Rule 8: a kernel over its buffer budget names a node to store; schedule again with it stored (each round
    // stores one more node, so this ends).
    let mut pinned = vec![false; graph.g.node_bound()];
    loop {
        match schedule_pinned(graph, opts, &pinned) {
            Ok(plan) => return plan,
            Err(cuts) => cuts.into_iter().for_each(|n| pinned[n.index()] = true),
        }
    }
}

/// One round of [`schedule_pinned`]: the graph with its order and readers, and the decisions the rules make, filled
/// in rule by rule (each file of this folder adds its rules as methods).
struct Round<'g> {
    graph: &'g Graph,
    opts: &'g ScheduleOptions,
    /// The nodes rule 8 asked to store in earlier rounds.
    pinned: &'g [bool],
    /// The graph's nodes in topological order.
    order: &'g [NodeIndex],
    /// Per node, the nodes that read it (each once).
    consumers: &'g [Vec<NodeIndex>],
    /// Per node: stored in a buffer of its own ("materialized"); everything else is inlined into its readers.
    mat: Vec<bool>,
    /// Per node (rule 1): the ALU ops of its code with what it inlines, whether a transcendental op is among
    /// them, and the longest chain of inlined nodes ending at it.
    cost: Vec<usize>,
    expensive: Vec<bool>,
    depth: Vec<usize>,
    /// Stored by rule 1 only because several nodes read it (rules 1c and 1d may take that back).
    stored_for_readers: Vec<bool>,
    /// Rule 2e: the dtype matmul `n` reads its operands in, where that is bf16 or f16.
    half_operands: Vec<Option<crate::DType>>,
}

impl<'g> Round<'g> {
    fn new(
        graph: &'g Graph,
        opts: &'g ScheduleOptions,
        pinned: &'g [bool],
        order: &'g [NodeIndex],
        consumers: &'g [Vec<NodeIndex>],
    ) -> Self {
        let bound = graph.g.node_bound();
        Round {
            graph,
            opts,
            pinned,
            order,
            consumers,
            mat: vec![false; bound],
            cost: vec![0; bound],
            expensive: vec![false; bound],
            depth: vec![0; bound],
            stored_for_readers: vec![false; bound],
            half_operands: vec![None; bound],
        }
    }
}

/// [`schedule_with`] on a simplified graph, with the `pinned` nodes stored; `Err` names more nodes to store (rule
/// 8).
fn schedule_pinned(graph: &Graph, opts: ScheduleOptions, pinned: &[bool]) -> Result<KernelPlan, Vec<NodeIndex>> {
    let order = graph.topo_order();
    let mut consumers: Vec<Vec<NodeIndex>> = vec![Vec::new(); graph.g.node_bound()];
    for &n in &order {
        for s in graph.srcs(n) {
            if !consumers[s.index()].contains(&n) {
                consumers[s.index()].push(n);
            }
        }
    }
    let mut round = Round::new(graph, &opts, pinned, &order, &consumers);
    round.store_by_kind_and_readers();
    round.store_gemm_operands();
    round.unstore_inlinable();
    let mut stage = round.reduce_stages();
    let rows_of = round.row_kernels(&mut stage);
    let lowered = round.lower_kernels(&stage, &rows_of)?;
    Ok(slots::place(graph, &order, lowered))
}
