//! Fusion and scheduling: which graph nodes get a buffer, which kernel computes each, and where buffers are reused.
//!
//! Rules (docs/architecture.md, "Fusion"), applied in this order:
//! 1. Materialized ("realized into a buffer"): inputs, graph outputs, `Contiguous`, every `Reduce`, `Matmul` and
//!    `Linalg` and the sources of a `Linalg` (a routine, `routine.rs`), the source of every `Gather` (read at data-dependent places), and any node that several nodes read (or that feeds an `Expand`) unless recomputing it is cheap: at most
//!    `CHEAP_OPS` ALU ops and no transcendental or random op on the way back to materialized nodes.
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
//! 5. Except that a kernel replacing an input (a parameter update) runs last, so its output may take the input's
//!    buffer (`donate.rs`).
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
//! Deliberately not done yet: multi-output kernels (two reductions of the same input, both stored, run as two
//! kernels).

use crate::dtype::Scalar;
use crate::graph::Graph;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{BufParam, Inst, InstOp, KernelIr};
use crate::kernel::lower::lower;
use crate::kernel::split::{split_full_reduction, with_merged_reduce_loops};
use crate::op::{Op, UnaryOp};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::NodeIndexable;
use std::collections::HashMap;

/// The most buffers one kernel reads (rule 8), unless the backend asks for fewer (`ScheduleOptions::max_inputs`).
/// With its output, random-number keys and fault record that is at most 27 bindings: within every desktop wgpu
/// adapter's storage buffers per shader stage on Vulkan and Metal (Metal's 31, lavapipe's 32), where a gradient norm
/// over a 4-layer GPT's 52 parameters, one sum over 52 stored norms, had asked for 53. Not the largest budget any
/// device allows: the CPU and CUDA could take more, and a device whose plans differ only here gains nothing by it.
pub const MAX_KERNEL_INPUTS: usize = 24;

/// Recompute a multi-use value instead of storing it when it costs at most this many ALU ops per element.
const CHEAP_OPS: usize = 3;

/// Rule 1d: the most ALU ops a stored value may cost to be recomputed instead by each kernel that reads it, and
/// the most kernels that may each recompute it. Its readers already read its inputs, so recomputing trades a store
/// and a load of every element for these ops.
const RECOMPUTE_OPS: usize = 12;
const RECOMPUTE_READERS: usize = 3;

/// What one transcendental op (`exp`, `tanh`, `log`, ...) counts toward [`RECOMPUTE_OPS`]: its polynomial is
/// tens of instructions a vector, not one. A GELU's tanh (five arithmetic ops and the tanh: 13) is stored by its
/// forward kernel and read by its gradient, where counting the tanh as one op had recomputed it in the gradient's
/// GEMM epilogue: the GELU's kernels 1200 -> 1107 µs a layer, the GPT step 1-2.5 % faster (docs/benchmarks.md).
const TRANSCENDENTAL_OPS: usize = 8;

/// Rule 2c: a matmul operand that is a slice keeping at least 1 / this of what it views is read in place from its
/// stored source rather than stored itself.
const SLICE_READ_IN_PLACE: usize = 4;

/// Rows of A from which a transposed B is copied to contiguous memory before the GEMM (rule 2b).
const TRANSPOSE_COPY_MIN_ROWS: usize = 8;

/// Whether `n` is, through expands and reshapes, a permutation that swaps the last two dims of a materialized node.
fn is_transposed_view(graph: &Graph, n: NodeIndex, mat: &[bool]) -> bool {
    let mut cur = n;
    loop {
        match &graph.node(cur).op {
            Op::Expand | Op::Reshape => cur = graph.srcs(cur)[0],
            Op::Permute(p) => {
                let r = p.len();
                let swaps_last = r >= 2 && p[r - 1] == r - 2 && p[r - 2] == r - 1;
                let src = graph.srcs(cur)[0];
                return swaps_last && (mat[src.index()] || matches!(graph.node(src).op, Op::Input { .. }));
            }
            _ => return false,
        }
    }
}

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

/// Ops not worth recomputing in each kernel that reads a shared value: transcendentals, random draws, and gathers
/// (each kernel would check the indices again, and a kernel that gathers runs as generic code: a GEMM whose
/// epilogue recomputed an embedding lookup lost the generated GEMM).
fn is_transcendental(op: &Op) -> bool {
    matches!(op, Op::Rand { .. } | Op::Binary(crate::op::BinaryOp::Pow) | Op::Gather { .. })
        || matches!(op, Op::Unary(u) if !matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::Recip))
}

fn alu_cost(op: &Op) -> usize {
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Gather { .. } => 1,
        _ => 0,
    }
}

/// Whether the backend runs GEMMs on stored operands of half-precision `dtype` (rule 2e): bf16 with
/// `bf16_gemm`, f16 with `f16_gemm`.
fn half_gemm(opts: &ScheduleOptions, dtype: crate::DType) -> bool {
    (dtype == crate::DType::BF16 && opts.bf16_gemm) || (dtype == crate::DType::F16 && opts.f16_gemm)
}

/// The half-precision node that `n` widens to f32 (`n` a cast), if it is one of a dtype the backend's GEMMs read
/// ([`half_gemm`]).
fn half_widening(graph: &Graph, n: NodeIndex, opts: &ScheduleOptions) -> Option<NodeIndex> {
    let from = *graph.srcs(n).first()?;
    (matches!(graph.node(n).op, Op::Cast)
        && graph.node(n).dtype == crate::DType::F32
        && half_gemm(opts, graph.node(from).dtype))
    .then_some(from)
}

/// Rule 2e: where matmul `n` multiplies two bf16 (or two f16) values widened to f32 (`cast` to f32 of a half
/// node, through movement ops on either side of the cast) and the backend reads that dtype ([`half_gemm`]), the
/// operands' dtype and the half nodes the GEMM then reads, which must be stored (those not stored yet: a computed
/// half operand is stored once, in its dtype, and so is a view whose indices are not affine); `None` where an
/// operand is anything else.
fn half_gemm_operands(
    graph: &Graph,
    n: NodeIndex,
    mat: &[bool],
    opts: &ScheduleOptions,
) -> Option<(crate::DType, Vec<NodeIndex>)> {
    let movement = |cur: NodeIndex| matches!(graph.node(cur).op, Op::Permute(_) | Op::Reshape | Op::Expand);
    let mut stored = Vec::new();
    let mut dtype = None;
    for src in graph.srcs(n) {
        let mut cur = src;
        while movement(cur) && !mat[cur.index()] {
            cur = graph.srcs(cur)[0];
        }
        if mat[cur.index()] || !matches!(graph.node(cur).op, Op::Cast) || graph.node(cur).dtype != crate::DType::F32 {
            return None;
        }
        let view = graph.srcs(cur)[0];
        let d = graph.node(view).dtype;
        if !half_gemm(opts, d) || dtype.is_some_and(|x| x != d) {
            return None;
        }
        dtype = Some(d);
        let mut from = view;
        while movement(from) && !mat[from.index()] {
            from = graph.srcs(from)[0];
        }
        if scrambled(graph, view, mat) {
            // A view the GEMM cannot read with affine indices (attention's heads merged across a permutation, read
            // in place by the generic reduce kernel at a twentieth of the GEMM's speed) is stored, in bf16, in the
            // layout the GEMM reads, as rule 2c stores an f32 one.
            stored.push(view);
        } else if !mat[from.index()] {
            stored.push(from);
        }
    }
    Some((dtype?, stored))
}

/// The ops a bf16 GEMM's epilogue computes after the rounding of its product (rule 2e): arithmetic, comparisons,
/// selects, and the unary ops with a register form on every backend that sets `bf16_gemm` (the CPU's
/// `gemm::epilogue`). Anything else (max/min with their NaN rule, sin, a floor) keeps the product stored in f32.
fn bf16_epilogue_op(op: &Op) -> bool {
    use crate::op::BinaryOp as B;
    match op {
        Op::Cast | Op::Reshape | Op::Where => true,
        Op::Binary(b) => {
            matches!(b, B::Add | B::Sub | B::Mul | B::Div | B::Lt | B::Le | B::Eq | B::Ne | B::And | B::Or)
        }
        Op::Unary(u) => matches!(
            u,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Log
        ),
        _ => false,
    }
}

/// Whether `n` is a constant, through the movement ops that broadcast it.
fn constant(graph: &Graph, n: NodeIndex) -> bool {
    let mut cur = n;
    while matches!(graph.node(cur).op, Op::Expand | Op::Reshape) {
        cur = graph.srcs(cur)[0];
    }
    matches!(graph.node(cur).op, Op::Const(_))
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

/// The stored node that every value read from `from` flows into (rules 1c and 3), with the nodes on the way
/// (`from` first). Every node reached from `from` through its readers must be an elementwise op or a reshape of
/// `from`'s element count (so it is evaluated at the element's own index), and every path must end in the same
/// materialized node, which is then the one kernel that reads `from` (relu's `where(x <= 0, 0, x)` reads x twice: a
/// diamond, still one kernel). `None` where a path leaves the region (a reduction, a matmul, a movement, a graph
/// output) or paths end in different kernels.
fn region_target(
    graph: &Graph,
    consumers: &[Vec<NodeIndex>],
    from: NodeIndex,
    mat: &[bool],
) -> (Option<NodeIndex>, Vec<NodeIndex>) {
    match region_targets(graph, consumers, from, mat) {
        Some((targets, seen)) if targets.len() == 1 => (Some(targets[0]), seen),
        _ => (None, Vec::new()),
    }
}

/// Every stored node that values read from `from` flow into through elementwise ops and reshapes of `from`'s
/// element count (at least one), with the nodes on the way (`from` first); `None` where a path leaves that region
/// (a reduction, a matmul, a movement, a graph output).
fn region_targets(
    graph: &Graph,
    consumers: &[Vec<NodeIndex>],
    from: NodeIndex,
    mat: &[bool],
) -> Option<(Vec<NodeIndex>, Vec<NodeIndex>)> {
    let numel = graph.node(from).shape.numel();
    let mut targets: Vec<NodeIndex> = Vec::new();
    if graph.outputs.contains(&from) || consumers[from.index()].is_empty() {
        return None;
    }
    let (mut stack, mut seen) = (vec![from], vec![from]);
    while let Some(cur) = stack.pop() {
        for &next in &consumers[cur.index()] {
            if !elementwise_at(graph, next, numel) {
                return None;
            }
            if mat[next.index()] {
                if !targets.contains(&next) {
                    targets.push(next);
                }
            } else if !seen.contains(&next) {
                seen.push(next);
                stack.push(next);
            }
        }
    }
    Some((targets, seen))
}

/// Whether `n` computes its element from its sources' elements at the same place: an elementwise op or a reshape,
/// of `numel` elements.
fn elementwise_at(graph: &Graph, n: NodeIndex, numel: usize) -> bool {
    matches!(graph.node(n).op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Reshape)
        && graph.node(n).shape.numel() == numel
}

/// What `n`'s kernel evaluates at `n`'s own element (rule 1d): walking from its sources through inlined
/// elementwise ops and reshapes of its element count, every node reached (`reach`), those where the walk stops
/// (`frontier`: stored nodes, which the kernel loads, and inlined views such as a broadcast bias, which it
/// evaluates at this element; constants aside), and the ALU ops on the way.
struct Inline {
    reach: Vec<NodeIndex>,
    frontier: Vec<NodeIndex>,
    ops: usize,
}

fn inline_at_element(graph: &Graph, n: NodeIndex, mat: &[bool]) -> Inline {
    let numel = graph.node(n).shape.numel();
    let weight = |op: &Op| if is_transcendental(op) { TRANSCENDENTAL_OPS } else { alu_cost(op) };
    let mut inline = Inline { reach: Vec::new(), frontier: Vec::new(), ops: weight(&graph.node(n).op) };
    let mut stack = graph.srcs(n);
    while let Some(cur) = stack.pop() {
        if inline.reach.contains(&cur) {
            continue;
        }
        inline.reach.push(cur);
        if !mat[cur.index()] && elementwise_at(graph, cur, numel) {
            inline.ops += weight(&graph.node(cur).op);
            stack.extend(graph.srcs(cur));
        } else if !matches!(graph.node(cur).op, Op::Const(_)) {
            inline.frontier.push(cur);
        }
    }
    inline
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

/// [`schedule_with`] on a simplified graph, with the `pinned` nodes stored; `Err` names more nodes to store (rule
/// 8).
fn schedule_pinned(graph: &Graph, opts: ScheduleOptions, pinned: &[bool]) -> Result<KernelPlan, Vec<NodeIndex>> {
    let order = graph.topo_order();
    let bound = graph.g.node_bound();
    let mut consumers: Vec<Vec<NodeIndex>> = vec![Vec::new(); bound];
    for &n in &order {
        for s in graph.srcs(n) {
            if !consumers[s.index()].contains(&n) {
                consumers[s.index()].push(n);
            }
        }
    }
    let is_output = |n: NodeIndex| graph.outputs.contains(&n);

    // Rule 1.
    let mut mat = vec![false; bound];
    let mut cost = vec![0usize; bound];
    let mut expensive = vec![false; bound];
    let mut depth = vec![0usize; bound];
    // Stored by rule 1 only because several nodes read it (rules 1c and 1d may take that back).
    let mut stored_for_readers = vec![false; bound];
    for &n in &order {
        let op = &graph.node(n).op;
        mat[n.index()] = pinned[n.index()]
            || is_output(n)
            || matches!(
                op,
                Op::Input { .. }
                    | Op::Contiguous
                    | Op::Reduce { .. }
                    | Op::Matmul
                    | Op::Linalg(_)
                    | Op::ScatterRows { .. }
                    | Op::SortRows { .. }
            );
        // A routine reads its sources row-major from buffers (`routine.rs`).
        if matches!(op, Op::Linalg(_) | Op::ScatterRows { .. } | Op::SortRows { .. }) {
            for s in graph.srcs(n) {
                mat[s.index()] = true;
            }
        }
        // A gather reads its source at data-dependent places: from a buffer, row-major (`lower`).
        if matches!(op, Op::Gather { .. }) {
            mat[graph.srcs(n)[0].index()] = true;
        }
        let inlined: Vec<NodeIndex> = graph.srcs(n).into_iter().filter(|s| !mat[s.index()]).collect();
        cost[n.index()] = alu_cost(op) + inlined.iter().map(|s| cost[s.index()]).sum::<usize>();
        expensive[n.index()] = is_transcendental(op) || inlined.iter().any(|s| expensive[s.index()]);
        for s in graph.srcs(n) {
            // An expand or overlapping windows read each source element more than once.
            let reused = consumers[s.index()].len() > 1 || matches!(op, Op::Expand | Op::Unfold { .. });
            if reused && !mat[s.index()] && (cost[s.index()] > CHEAP_OPS || expensive[s.index()]) {
                // Rule 1b: a bf16 value widened to f32 is stored in bf16 (half the bytes; each reader widens it
                // again, exactly) where the backend has a bf16 GEMM: a gradient that two matmuls read then reaches
                // both in bf16 (rule 2e) instead of making them f32 GEMMs.
                match half_widening(graph, s, &opts) {
                    Some(from) => {
                        mat[from.index()] = true;
                        (cost[s.index()], expensive[s.index()], depth[s.index()]) = (1, false, 1);
                    }
                    None => {
                        mat[s.index()] = true;
                        stored_for_readers[s.index()] = true;
                    }
                }
            }
        }
        for s in graph.srcs(n) {
            if !mat[s.index()] && depth[s.index()] >= MAX_FUSED_DEPTH {
                mat[s.index()] = true;
            }
        }
        // `n` was costed before a source became materialized; recost so its users see the right figure.
        let inlined: Vec<NodeIndex> = graph.srcs(n).into_iter().filter(|s| !mat[s.index()]).collect();
        cost[n.index()] = alu_cost(op) + inlined.iter().map(|s| cost[s.index()]).sum::<usize>();
        expensive[n.index()] = is_transcendental(op) || inlined.iter().any(|s| expensive[s.index()]);
        depth[n.index()] = 1 + inlined.iter().map(|s| depth[s.index()]).max().unwrap_or(0);
    }

    // Rule 2e (before 2b and 2c, which would store the operands in f32): a bf16 (f16) GEMM reads its operands in
    // bf16 (f16). `half_operands[n]`: the dtype matmul `n` reads.
    let mut half_operands: Vec<Option<crate::DType>> = vec![None; bound];
    if opts.bf16_gemm || opts.f16_gemm {
        for &n in &order {
            if matches!(graph.node(n).op, Op::Matmul)
                && let Some((dtype, stored)) = half_gemm_operands(graph, n, &mat, &opts)
            {
                for s in stored {
                    mat[s.index()] = true;
                }
                half_operands[n.index()] = Some(dtype);
            }
        }
    }

    // Rule 2b: a matmul whose right operand is a transposed view (`x.matmul(&w.t())`, every linear layer) would read
    // B across its rows. With enough rows of A to amortize it, store the transposed B once (a copy of K x N) so the
    // GEMM reads it contiguously; with fewer, the renderer's dot-product form (vectorized along K) is cheaper.
    for &n in &order {
        if !matches!(graph.node(n).op, Op::Matmul) || half_operands[n.index()].is_some() {
            continue;
        }
        let srcs = graph.srcs(n);
        let (a, b) = (graph.node(srcs[0]), srcs[1]);
        let m = a.shape.dims()[a.shape.rank() - 2];
        if opts.transpose_copy && m >= TRANSPOSE_COPY_MIN_ROWS && !mat[b.index()] && is_transposed_view(graph, b, &mat)
        {
            mat[b.index()] = true;
        }
    }

    // Rule 2c: a matmul operand computed by ALU ops (a relu derivative times an upstream gradient, say) would be
    // recomputed for every register tile that reads it (N / 8 times for A, M / 4 times for B): store it once. And a
    // GEMM reads strided operands, not views needing a division per element (a reshape across a permutation: the
    // `[B * T, 3 * D]` gradient of attention's `[3, B, H, T, D / H]` heads; read in place, that product fell to the
    // generic reduce kernel, 20x slower than the generated GEMM): such an operand is stored at its reshape, in the
    // layout the GEMM reads, with what it is computed from inlined into that store.
    let store_computed_operands = |n: NodeIndex, mat: &mut Vec<bool>| {
        for (i, src) in graph.srcs(n).into_iter().enumerate() {
            let mut cur = src;
            let mut reshape = None;
            // Through a slice that keeps a large part of what it views (one of q, k and v, viewed from a fused
            // projection's `[B, T, 3 * D]`): the whole is stored once (the projection's bias then runs as its
            // GEMM's epilogue) and each part read in place, where storing each part had cost a pass over the
            // projection's output per part.
            let large_slice = |c: NodeIndex| {
                matches!(graph.node(c).op, Op::Slice(_))
                    && SLICE_READ_IN_PLACE * graph.node(c).shape.numel() >= graph.node(graph.srcs(c)[0]).shape.numel()
            };
            while (matches!(graph.node(cur).op, Op::Permute(_) | Op::Reshape | Op::Expand) || large_slice(cur))
                && !mat[cur.index()]
            {
                if reshape.is_none() && matches!(graph.node(cur).op, Op::Reshape) {
                    reshape = Some(cur);
                }
                cur = graph.srcs(cur)[0];
            }
            let stored_here = !mat[cur.index()] && cost[cur.index()] > 0;
            if stored_here {
                mat[cur.index()] = true;
            }
            if !scrambled(graph, src, mat) {
                continue;
            }
            if i == 1 && opts.patched_b.is_some_and(|least| gemm_volume(graph, n) >= least) {
                // The patches' source is what gets stored (their views are read in place): a computed input is
                // stored below its windows, once, not as the windows (the im2col copy this rule avoids).
                mat[cur.index()] &= !stored_here;
                if patch(graph, src, mat, opts.patched_pad, &consumers) {
                    continue;
                }
                mat[cur.index()] |= stored_here;
            }
            match reshape {
                Some(r) => {
                    mat[cur.index()] &= !stored_here;
                    mat[r.index()] = true;
                    if scrambled(graph, src, mat) {
                        mat[src.index()] = true;
                    }
                }
                None => mat[src.index()] = true,
            }
        }
    };
    for &n in &order {
        if matches!(graph.node(n).op, Op::Matmul) && half_operands[n.index()].is_none() {
            store_computed_operands(n, &mut mat);
        }
    }

    // Rule 2d: a broadcast recomputes its source for every output element it fans out to. A source vector that
    // costs ALU ops (through movement ops, read back to its first computed node) is stored once instead: it then
    // usually runs as the epilogue of the matmul or reduction it comes from (rule 3), so it costs no launch. The
    // batch-1 MLP's weight update `W - lr * (g * mask)^T x` recomputed a 3-op mask product for each of 784
    // columns (4.5 µs of a 61 µs step on one thread). A one-element source stays inlined: its value is the same
    // for every element, so the kernel reads it as a uniform, and storing it would cost a launch of its own.
    for &n in &order {
        if !matches!(graph.node(n).op, Op::Expand) {
            continue;
        }
        let mut cur = graph.srcs(n)[0];
        if graph.node(cur).shape.numel() <= 1 || graph.node(cur).shape.numel() >= graph.node(n).shape.numel() {
            continue;
        }
        while matches!(graph.node(cur).op, Op::Permute(_) | Op::Reshape) && !mat[cur.index()] {
            cur = graph.srcs(cur)[0];
        }
        // Not a bare widening that a bf16 GEMM reads in place (the batch-1 step's input, also broadcast by its
        // weight's outer-product gradient): storing it in f32 would make that GEMM an f32 one, which stores its
        // weight in f32 on every step (59 µs of the bf16 batch-1 step's 300).
        let widening_for_bf16_gemm = matches!(graph.node(cur).op, Op::Cast)
            && half_gemm(&opts, graph.node(graph.srcs(cur)[0]).dtype)
            && consumers[cur.index()].iter().any(|c| half_operands[c.index()].is_some());
        if !mat[cur.index()] && cost[cur.index()] > 0 && !widening_for_bf16_gemm {
            mat[cur.index()] = true;
        }
    }

    // Rule 2e, settled: rules 2b-2d may have stored an operand's cast to f32 that another matmul shares (a weight
    // gradient with an f32 operand reads the same widened activation); a matmul that now reads it in f32 is an f32
    // GEMM, its other operand stored in f32 too (rule 2c).
    for &n in &order {
        if half_operands[n.index()].is_some()
            && half_gemm_operands(graph, n, &mat, &opts).is_none_or(|(_, s)| !s.is_empty())
        {
            half_operands[n.index()] = None;
            store_computed_operands(n, &mut mat);
        }
    }

    // Rule 1c: a value stored only because several nodes read it, where every reader is inlined into one kernel
    // (each path from it runs through elementwise ops into the same stored node), is computed in that kernel
    // instead: lowering memoizes a value per element, so it is still computed once, and storing it only cost a
    // launch, a write and a read. An activation's gradient is such a diamond: GELU's `d/dx` reads the tanh
    // input's gradient twice, which had been a kernel of its own between the product and the rest of the
    // gradient. Readers in several kernels keep it stored (they would each compute it).
    let reconsidered = |s: NodeIndex, mat: &[bool]| {
        stored_for_readers[s.index()]
            && mat[s.index()]
            && !pinned[s.index()]
            && matches!(graph.node(s).op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast)
    };
    for &s in &order {
        if !reconsidered(s, &mat) {
            continue;
        }
        if let (Some(target), _) = region_target(graph, &consumers, s, &mat)
            && depth[s.index()] + depth[target.index()] <= MAX_FUSED_DEPTH
        {
            mat[s.index()] = false;
        }
    }

    // Rule 1d: a value stored only because several kernels read it, where each of those kernels reads everything
    // the value is computed from anyway, at the same element, is computed again by each of them when that costs
    // at most `RECOMPUTE_OPS` ALU ops (a transcendental counting `TRANSCENDENTAL_OPS`): its buffer cost a launch, a
    // write and a read per reader, the recomputation costs no memory traffic at all. Inductor's partitioner
    // recomputes such values for the same reason. (GELU's tanh had been recomputed so, and storing it had first
    // measured slower, on an AVX2 host; with the 16-lane kernels storing it measured faster, so it now counts 13.)
    for &s in &order {
        if !reconsidered(s, &mat) {
            continue;
        }
        let mine = inline_at_element(graph, s, &mat);
        if mine.ops > RECOMPUTE_OPS {
            continue;
        }
        let Some((targets, _)) = region_targets(graph, &consumers, s, &mat) else { continue };
        // Each reader evaluates everything `s` stops at, at the same element: recomputing `s` there loads nothing.
        let reads_the_same = |t: &NodeIndex| {
            let theirs = inline_at_element(graph, *t, &mat);
            mine.frontier.iter().all(|f| theirs.reach.contains(f))
                && depth[s.index()] + depth[t.index()] <= MAX_FUSED_DEPTH
        };
        if targets.len() <= RECOMPUTE_READERS && targets.iter().all(reads_the_same) {
            mat[s.index()] = false;
        }
    }

    // Rule 3: pull reductions into the materialized node they flow into.
    let mut stage: Vec<Option<NodeIndex>> = vec![None; bound];
    for &r in &order {
        if !matches!(graph.node(r).op, Op::Reduce { .. } | Op::Matmul) {
            continue;
        }
        let numel = graph.node(r).shape.numel();
        let fusable = |n: NodeIndex| elementwise_at(graph, n, numel);
        let walk = |mat: &[bool]| region_target(graph, &consumers, r, mat);
        if is_output(r) {
            stage[r.index()] = Some(r);
            continue;
        }
        // A GEMM's epilogue computes in f32 and stores f32, or, where its operands are bf16 (rule 2e), may round
        // its result to bf16 and compute on in bf16 (an activation), rounding each op's result, before its store.
        // Reading another tensor in bf16 there (a bf16 bias) is not taken: the product is stored in f32 and the
        // rest runs elementwise.
        let half_out = |m: NodeIndex, seen: &[NodeIndex]| {
            let bf16_epilogue = half_operands[r.index()] == Some(graph.node(m).dtype)
                && seen.iter().chain([&m]).all(|&n| {
                    n == r
                        || bf16_epilogue_op(&graph.node(n).op)
                            && graph.srcs(n).iter().all(|&s| s == r || seen.contains(&s) || constant(graph, s))
                });
            matches!(graph.node(r).op, Op::Matmul) && graph.node(m).dtype != graph.node(r).dtype && !bf16_epilogue
        };
        let takes = |target: Option<NodeIndex>, seen: &[NodeIndex], stage: &[Option<NodeIndex>]| {
            target.filter(|&m| {
                stage[m.index()].is_none()
                    && !matches!(graph.node(m).op, Op::Reduce { .. } | Op::Matmul)
                    && !half_out(m, seen)
            })
        };
        let (target, seen) = walk(&mat);
        let mut taken = takes(target, &seen, &stage).filter(|_| !pinned[r.index()]);
        // Rule 3c: a product whose chain of elementwise ops (a scale and a bias: attention's logits) then feeds
        // several kernels (a row's max and the exponent) stores the chain's end as its epilogue, instead of the
        // raw product that each of those kernels would finish again (with its own loads of the bias).
        if taken.is_none() && matches!(graph.node(r).op, Op::Matmul) && !pinned[r.index()] {
            let mut end = r;
            while let [next] = consumers[end.index()][..]
                && fusable(next)
                && !mat[next.index()]
            {
                end = next;
            }
            if end != r && consumers[end.index()].len() > 1 {
                mat[end.index()] = true;
                let (target, seen) = walk(&mat);
                taken = takes(target, &seen, &stage);
                mat[end.index()] = taken.is_some();
            }
        }
        match taken {
            Some(m) => {
                stage[m.index()] = Some(r);
                mat[r.index()] = false;
            }
            None => stage[r.index()] = Some(r),
        }
    }

    // Rule 3b: row kernels.
    let rows_of = if opts.row_kernels {
        let groups = crate::kernel::rows::Groups {
            graph,
            order: &order,
            consumers: &consumers,
            outputs: &graph.outputs,
            accept: opts.row_kernel_ok,
        };
        groups.form(&mut mat, &mut stage)
    } else {
        vec![None; bound]
    };

    // Rule 4: kernels in order, then slots.
    let kernels: Vec<NodeIndex> =
        order.iter().copied().filter(|&n| mat[n.index()] && !matches!(graph.node(n).op, Op::Input { .. })).collect();
    // Rule 5: a replacement of an input (an output nothing reads, computed from an input of its dtype and size: a
    // parameter's update) runs after every other kernel, so no later kernel reads the input it replaces and the
    // output may be written over it (`donate.rs`; the batch-1 MLP step updated W2 before its backward GEMV read
    // W2). Moving a kernel nothing reads to the end never breaks a dependency.
    let replaces_input = |k: NodeIndex, reads: &[NodeIndex]| {
        let d = graph.node(k);
        is_output(k)
            && consumers[k.index()].is_empty()
            && reads.iter().any(|&r| {
                let i = graph.node(r);
                matches!(i.op, Op::Input { .. }) && i.dtype == d.dtype && i.shape.numel() == d.shape.numel()
            })
    };
    let lowered = |k: NodeIndex| {
        let rows = rows_of[k.index()].as_deref().unwrap_or(&[]);
        let (ir, reads) =
            lower(graph, k, stage[k.index()], rows, &mat).expect("row groups are formed where lowering takes them");
        // Rule 6 (reductions only: a GEMM's reduce loop is its K, which its own kernels split).
        let reduces = stage[k.index()].is_some_and(|r| matches!(graph.node(r).op, Op::Reduce { .. }));
        let ir = if reduces { with_merged_reduce_loops(&ir) } else { ir };
        // Rule 7: an elementwise kernel whose indices divide its loops runs over the loops they divide into.
        let ir = if stage[k.index()].is_none() && rows.is_empty() && ir.routine.is_none() {
            ir.with_split_loops()
        } else {
            ir
        };
        let split = if reduces { split_full_reduction(&ir) } else { None };
        (k, ir, reads, split)
    };
    // Rule 8: at most `opts.max_inputs` buffers read per kernel (a split reduction's combining kernel reads its
    // partials too). A kernel reads some of the stored nodes its inlined code reaches (`region_reads`), so only
    // those reaching more than the budget less one are lowered to count their reads, before any other kernel is:
    // a round that stores more nodes is redone without having lowered the plan (a GPT step's gradient norm over 52
    // parameters needs a cut: its schedule took 15-17 ms, now 12.6-13.1).
    // Every cut a kernel needs is found in this round: after each, the kernel's reads are counted again as if the
    // cut were stored (a gradient norm over 52 tensors needs two), so the next round usually passes.
    let mut cuts = Vec::new();
    let mut memo = HashMap::new();
    // The kernels lowered here, kept for the plan when the round passes.
    let mut counted = HashMap::new();
    let budget = opts.max_inputs;
    for &k in &kernels {
        if region_reads(graph, k, &mat, &mut memo).len() < budget {
            continue;
        }
        let launch = counted.entry(k).or_insert_with(|| lowered(k));
        let extra = launch.3.is_some() as usize;
        if launch.2.len() + extra <= budget {
            continue;
        }
        let (mut stored, mut pins) = (mat.clone(), pinned.to_vec());
        while let Some(cut) = cut_point(graph, k, &stored, &pins, budget) {
            cuts.push(cut);
            stored[cut.index()] = true;
            pins[cut.index()] = true;
            if region_reads(graph, k, &stored, &mut HashMap::new()).len() + extra <= budget {
                break;
            }
        }
    }
    if !cuts.is_empty() {
        return Err(cuts);
    }
    let (mut launches_raw, last): (Vec<_>, Vec<_>) = kernels
        .iter()
        .map(|&k| counted.remove(&k).unwrap_or_else(|| lowered(k)))
        .partition(|(k, _, reads, _)| !replaces_input(*k, reads));
    launches_raw.extend(last);
    let mut last_read = vec![0usize; bound];
    for (step, (_, _, reads, _)) in launches_raw.iter().enumerate() {
        for &r in reads {
            last_read[r.index()] = step;
        }
    }

    let mut slot_of: Vec<Option<Slot>> = vec![None; bound];
    for &n in &order {
        if let Op::Input { slot } = graph.node(n).op {
            slot_of[n.index()] = Some(Slot::Input(slot));
        }
    }
    let mut outputs = Vec::new();
    let mut passthrough = Vec::new();
    for (i, &o) in graph.outputs.iter().enumerate() {
        let d = graph.node(o);
        outputs.push(BufParam { dtype: d.dtype, len: d.shape.numel() });
        if let Op::Input { slot } = d.op {
            passthrough.push((i, slot));
        }
    }
    let mut temps: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    // Per slot, whether it holds a constant (`slot_for`): never freed.
    let mut constant: Vec<bool> = Vec::new();
    let mut launches = Vec::with_capacity(launches_raw.len());
    for (step, (k, kernel, reads, split)) in launches_raw.into_iter().enumerate() {
        let mut inputs: Vec<Slot> = reads.iter().map(|r| slot_of[r.index()].expect("read after write")).collect();
        let (kernel, partials) = match split {
            Some((partial, combine)) => {
                let slot = slot_for(&mut temps, &mut free, &mut constant, &partial);
                launches.push(Launch { kernel: partial, inputs: inputs.clone(), output: Slot::Temp(slot) });
                inputs.push(Slot::Temp(slot));
                (combine, Some(slot))
            }
            None => (kernel, None),
        };
        let output = match graph.outputs.iter().position(|&o| o == k) {
            Some(i) => Slot::Output(i),
            None => Slot::Temp(slot_for(&mut temps, &mut free, &mut constant, &kernel)),
        };
        // The partials are read by the combining kernel only: free after it (not before its output is placed).
        free.extend(partials.filter(|&p| !constant[p]));
        slot_of[k.index()] = Some(output);
        for r in &reads {
            if last_read[r.index()] == step
                && let Some(Slot::Temp(t)) = slot_of[r.index()]
                && !free.contains(&t)
                && !constant[t]
            {
                free.push(t);
            }
        }
        launches.push(Launch { kernel, inputs, output });
    }
    // A graph may list one node as several outputs (`kiln::capture(&[&t, &t])`). Its kernel writes the first of
    // them; each later one is a copy, so that every output is written (the CPU backend allocates them uninitialized).
    for (i, &o) in graph.outputs.iter().enumerate() {
        let first = graph.outputs.iter().position(|&p| p == o).expect("listed");
        if first != i && !matches!(graph.node(o).op, Op::Input { .. }) {
            launches.push(Launch {
                kernel: copy(&outputs[i]),
                inputs: vec![Slot::Output(first)],
                output: Slot::Output(i),
            });
        }
    }
    Ok(KernelPlan { launches, temps, outputs, passthrough })
}

/// The node to store so that kernel `k`, over its `budget` of buffers, reads fewer (rule 8): of the nodes inlined
/// into it that read at least two buffers, the one reading the most that still fits the budget once stored (a
/// chain of 50 adds of stored tensors is cut every 23 adds at the default budget), else the one reading the fewest.
/// `None` when no such node is left (then the plan keeps the kernel, and a device with fewer bindings refuses it by
/// name).
fn cut_point(graph: &Graph, k: NodeIndex, mat: &[bool], pinned: &[bool], budget: usize) -> Option<NodeIndex> {
    let mut memo = HashMap::new();
    let (mut region, mut stack) = (Vec::new(), vec![k]);
    while let Some(n) = stack.pop() {
        for s in graph.srcs(n) {
            if !mat[s.index()] && !region.contains(&s) {
                region.push(s);
                stack.push(s);
            }
        }
    }
    let counted: Vec<(NodeIndex, usize)> = region
        .into_iter()
        .filter(|n| !pinned[n.index()])
        .map(|n| (n, region_reads(graph, n, mat, &mut memo).len()))
        .filter(|&(_, r)| r >= 2)
        .collect();
    let fits = counted.iter().filter(|&&(_, r)| r < budget).max_by_key(|&&(n, r)| (r, n.index()));
    fits.or_else(|| counted.iter().min_by_key(|&&(n, r)| (r, n.index()))).map(|&(n, _)| n)
}

/// The stored nodes that node `n`'s code reads when it is inlined (through the nodes it inlines in turn), sorted;
/// `memo` keeps each node's answer for the next call under the same `mat`.
fn region_reads(
    graph: &Graph,
    n: NodeIndex,
    mat: &[bool],
    memo: &mut HashMap<NodeIndex, Vec<NodeIndex>>,
) -> Vec<NodeIndex> {
    if let Some(r) = memo.get(&n) {
        return r.clone();
    }
    let mut out = Vec::new();
    for s in graph.srcs(n) {
        if mat[s.index()] {
            out.push(s);
        } else {
            out.extend(region_reads(graph, s, mat, memo));
        }
    }
    out.sort();
    out.dedup();
    memo.insert(n, out.clone());
    out
}

/// Whether reading node `n` (a movement view, not stored) in a kernel of its own needs an index that is not affine
/// in its dims, or a masked one (rule 2c): what a GEMM cannot read in place.
fn scrambled(graph: &Graph, n: NodeIndex, mat: &[bool]) -> bool {
    if mat[n.index()] || !graph.node(n).op.is_movement() {
        return false;
    }
    lower(graph, n, None, &[], mat)
        .is_some_and(|(ir, _)| crate::kernel::ir::affine_indices(&ir.outer, ir.out_rank()).is_none())
}

/// M * N * K of matmul `n` (per batch element).
fn gemm_volume(graph: &Graph, n: NodeIndex) -> usize {
    let a = graph.node(graph.srcs(n)[0]).shape.dims();
    let out = graph.node(n).shape.dims();
    out[out.len() - 2..].iter().product::<usize>() * a[a.len() - 1]
}

/// Rule 2f: whether matmul operand `b` (a view of `[.., K, N]`) can be read as a patched B, the data it views
/// stored and its index separable into a part per K and per N ([`IExpr::separate`]); if so, marks that data
/// stored. Whatever the steps along N: a packing that gathers element by element (a strided convolution's columns,
/// the weight gradient's `patches^T` stepping through the window) still beats copying the patches and packing the
/// copy (a 3 x 3 convolution at stride 2, 64 -> 128 channels at 56 x 56: 5.1 -> 3.3 ms; its forward + backward at
/// stride 1: 33 -> 25 ms).
///
/// Where the backend asks (`fold_pad`: `ScheduleOptions::patched_pad`), a zero padding under the view is folded into
/// the patch (its ranges, `gemm::Patch::ranges`) where the rows fall into at most [`FOLDED_PAD_CLASSES`] classes (a
/// window's taps; a weight gradient's output positions, by the edges they lie on): the packing then zero-fills
/// what lies outside and the padded input is never stored, one pass over the input saved. Elsewhere (a 7 x 7
/// window's 49 taps) the padded input is stored and read as before.
fn patch(graph: &Graph, b: NodeIndex, mat: &mut [bool], fold_pad: bool, consumers: &[Vec<NodeIndex>]) -> bool {
    if graph.node(b).dtype != crate::DType::F32 || graph.node(b).shape.rank() < 2 {
        return false;
    }
    let zero_pad = |op: &Op| matches!(op, Op::Pad { value, .. } if value.is_zero_bits());
    for fold in [true, false].into_iter().filter(|&f| fold_pad || !f) {
        let mut base = b;
        let mut through = false;
        // Pads rule 1 chose to store (one whose source is computed, read once per window tap): folded, their
        // source is stored instead, which the taps then read under the pad's ranges. Only where nothing else reads
        // the views between (`alone`): another GEMM reading the same patches may rely on the stored pad (one whose
        // rows fall into too many classes to fold).
        let mut unstored: smallvec::SmallVec<[NodeIndex; 2]> = smallvec::SmallVec::new();
        let mut alone = true;
        loop {
            let op = &graph.node(base).op;
            if fold && zero_pad(op) && (!mat[base.index()] || alone) {
                through = true;
                if mat[base.index()] {
                    unstored.push(base);
                }
            } else if mat[base.index()]
                || !matches!(op, Op::Permute(_) | Op::Reshape | Op::Expand | Op::Slice(_) | Op::Unfold { .. })
            {
                break;
            }
            alone &= consumers[base.index()].len() <= 1;
            base = graph.srcs(base)[0];
        }
        if fold && !through {
            continue;
        }
        for &p in &unstored {
            mat[p.index()] = false;
        }
        let was = mat[base.index()];
        mat[base.index()] = true;
        let readable = lower(graph, b, None, &[], mat).is_some_and(|(ir, _)| {
            let rank = ir.out_rank();
            let [inst] = ir.outer.as_slice() else { return false };
            let InstOp::Load { index, valid, fill, .. } = &inst.op else { return false };
            if valid.is_some() != fold {
                return false;
            }
            let Some((parts, _, patch)) =
                crate::kernel::gemm::Patch::of_load(index, valid.as_ref(), *fill, rank, rank - 2, rank - 1)
            else {
                return false;
            };
            let (k, n) = (ir.out_extents[rank - 2], ir.out_extents[rank - 1]);
            let classes = || patch.row_classes(k, n).into_iter().max().unwrap_or(0) + 1;
            parts[..rank - 2].iter().all(|p| p.affine(rank).is_some()) && (!fold || classes() <= FOLDED_PAD_CLASSES)
        });
        if readable {
            return true;
        }
        mat[base.index()] = was;
        for &p in &unstored {
            mat[p.index()] = true;
        }
    }
    false
}

/// The most row classes (`gemm::Patch::row_classes`) a patched B folds its padding for: a 3 x 3 window's 9 taps, a
/// weight gradient's 9 kinds of output position, a 7 x 7 stride-2 stem's 16 at 224 x 224. The packing keeps a table
/// of column groups per class: classed by their range values, that stem's 49 taps (3.3 MB of tables with the
/// gather offsets) measured slower folded than reading a stored padding (13.3 against 10.3 ms, batch 8, 2 threads).
const FOLDED_PAD_CLASSES: usize = 16;

/// The arena slot for kernel `k`'s output. A constant's (`KernelIr::is_constant`) is a new one, marked in
/// `constant` (one flag per slot) and never freed: no value before or after it shares it, so it holds the constant
/// from one run to the next (`KernelPlan::constant`). Any other's is [`take_slot`]'s.
fn slot_for(temps: &mut Vec<usize>, free: &mut Vec<usize>, constant: &mut Vec<bool>, k: &KernelIr) -> usize {
    let slot = if k.is_constant() {
        temps.push(k.output.len * k.output.dtype.size_of());
        temps.len() - 1
    } else {
        take_slot(temps, free, &k.output)
    };
    constant.resize(temps.len(), false);
    constant[slot] |= k.is_constant();
    slot
}

/// An arena slot for `b`: the best fit among the `free` slots, or a new one.
fn take_slot(temps: &mut Vec<usize>, free: &mut Vec<usize>, b: &BufParam) -> usize {
    let bytes = b.len * b.dtype.size_of();
    let pick = free.iter().enumerate().filter(|&(_, &s)| temps[s] >= bytes).min_by_key(|&(_, &s)| temps[s]);
    match pick {
        Some((i, _)) => free.swap_remove(i),
        None => {
            temps.push(bytes);
            temps.len() - 1
        }
    }
}

/// A kernel that copies a buffer.
fn copy(b: &BufParam) -> KernelIr {
    let load = InstOp::Load { buf: 0, index: IExpr::Var(0), valid: None, fill: Scalar::Int(0) };
    KernelIr {
        name: format!("E_copy_{}", b.len),
        inputs: vec![b.clone()],
        output: b.clone(),
        out_extents: vec![b.len],
        reduce: None,
        rows: Vec::new(),
        row_rank: 1,
        outer: vec![Inst { op: load, dtype: b.dtype }],
        result: 0,
        flops_per_elem: 0,
        routine: None,
    }
}
