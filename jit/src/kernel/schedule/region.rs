//! The walks over the graph that several rules share: the region of elementwise readers a value flows through
//! into the kernels that read it (rules 1c, 1d, 3), and whether a view reads its source with affine indices (rules
//! 2c, 2e).

use crate::graph::Graph;
use crate::kernel::lower::lower;
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

/// The stored node that every value read from `from` flows into (rules 1c and 3), with the nodes on the way
/// (`from` first). Every node reached from `from` through its readers must be an elementwise op or a reshape of
/// `from`'s element count (so it is evaluated at the element's own index), and every path must end in the same
/// materialized node, which is then the one kernel that reads `from` (relu's `where(x <= 0, 0, x)` reads x twice: a
/// diamond, still one kernel). `None` where a path leaves the region (a reduction, a matmul, a movement, a graph
/// output) or paths end in different kernels.
pub(super) fn region_target(
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
pub(super) fn region_targets(
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

/// Whether `n` computes its element from its sources' elements at the same place: an elementwise op, a reshape or
/// a `Contiguous` (a copy, element for element), of `numel` elements.
pub(super) fn elementwise_at(graph: &Graph, n: NodeIndex, numel: usize) -> bool {
    matches!(graph.node(n).op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Reshape | Op::Contiguous)
        && graph.node(n).shape.numel() == numel
}

/// Whether reading node `n` (a movement view, not stored) in a kernel of its own needs an index that is not affine
/// in its dims, or a masked one (rule 2c): what a GEMM cannot read in place.
pub(super) fn scrambled(graph: &Graph, n: NodeIndex, mat: &[bool]) -> bool {
    if mat[n.index()] || !graph.node(n).op.is_movement() {
        return false;
    }
    lower(graph, n, None, &[], mat)
        .is_some_and(|(ir, _)| crate::kernel::ir::affine_indices(&ir.outer, ir.out_rank()).is_none())
}
