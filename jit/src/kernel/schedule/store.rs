//! Rule 1 and its exceptions (`schedule/mod.rs` states them): which nodes get a buffer of their own because of
//! what they are (inputs, outputs, reductions, GEMMs, routines and their sources) or because several nodes read
//! them (1b: a bf16 one stored in bf16), and which of those shared values are computed again where they are read
//! instead (1c: one kernel reads them; 1d: each reader has their inputs at hand anyway).

use super::half::half_widening;
use super::region::{elementwise_at, region_target, region_targets};
use super::{MAX_FUSED_DEPTH, Round};
use crate::graph::Graph;
use crate::op::{Op, UnaryOp};
use petgraph::stable_graph::NodeIndex;

/// Recompute a multi-use value instead of storing it when it costs at most this many ALU ops per element.
const CHEAP_OPS: usize = 3;

/// Rule 1d: the most ALU ops a stored value may cost to be recomputed instead by each kernel that reads it, and
/// the most kernels that may each recompute it. Its readers already read its inputs, so recomputing trades a store
/// and a load of every element for these ops.
const RECOMPUTE_OPS: usize = 12;
const RECOMPUTE_READERS: usize = 3;

/// What one transcendental op (`exp`, `tanh`, `log`, ...) counts toward [`RECOMPUTE_OPS`]: its polynomial is
/// tens of instructions a vector, not one. A tanh GELU written as a composition (five arithmetic ops and the tanh:
/// 13) has its tanh stored by its forward kernel and read by its gradient, where counting the tanh as one op had
/// recomputed it in the gradient's GEMM epilogue: the GELU's kernels 1200 -> 1107 µs a layer, the GPT step 1-2.5 %
/// faster, when `nn::functional::gelu` was that composition (it has its own gradient rule now).
const TRANSCENDENTAL_OPS: usize = 8;

impl Round<'_> {
    /// Rules 1 and 1b, and [`MAX_FUSED_DEPTH`]: fills `mat`, and `cost`, `expensive` and `depth` for the rules after.
    pub(super) fn store_by_kind_and_readers(&mut self) {
        let Round {
            graph,
            opts,
            pinned,
            order,
            consumers,
            ref mut mat,
            ref mut cost,
            ref mut expensive,
            ref mut depth,
            ref mut stored_for_readers,
            ..
        } = *self;
        for &n in order {
            let op = &graph.node(n).op;
            mat[n.index()] = pinned[n.index()]
                || graph.outputs.contains(&n)
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
                    match half_widening(graph, s, opts) {
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
    }

    /// Rules 1c and 1d: shared values that rule 1 stored, computed where they are read instead.
    pub(super) fn unstore_inlinable(&mut self) {
        let Round { graph, pinned, order, consumers, ref mut mat, ref depth, ref stored_for_readers, .. } = *self;
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
        for &s in order {
            if !reconsidered(s, mat) {
                continue;
            }
            if let (Some(target), _) = region_target(graph, consumers, s, mat)
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
        for &s in order {
            if !reconsidered(s, mat) {
                continue;
            }
            let mine = inline_at_element(graph, s, mat);
            if mine.ops > RECOMPUTE_OPS {
                continue;
            }
            let Some((targets, _)) = region_targets(graph, consumers, s, mat) else { continue };
            // Each reader evaluates everything `s` stops at, at the same element: recomputing `s` there loads nothing.
            let reads_the_same = |t: &NodeIndex| {
                let theirs = inline_at_element(graph, *t, mat);
                mine.frontier.iter().all(|f| theirs.reach.contains(f))
                    && depth[s.index()] + depth[t.index()] <= MAX_FUSED_DEPTH
            };
            if targets.len() <= RECOMPUTE_READERS && targets.iter().all(reads_the_same) {
                mat[s.index()] = false;
            }
        }
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
