//! Graph rewrites applied before scheduling. Each keeps every value bit for bit (same products, same sums, in the
//! same order) and only changes how kernels will read memory.
//!
//! - `(A @ B)^T -> B^T @ A^T` when the transpose is the product's only reader. Autograd produces this for every
//!   linear layer's weight gradient (the gradient of `w.t()` is a transposed product); rewritten, the GEMM writes
//!   the gradient in the weight's own layout, so the optimizer update reads it contiguously and can fuse into the
//!   GEMM's epilogue.

use crate::graph::{Graph, NodeData};
use crate::op::Op;
use petgraph::Direction;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;

/// Whether `perm` swaps the last two dims and keeps the rest.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

fn transposed(g: &mut Graph, n: NodeIndex) -> NodeIndex {
    let d = g.node(n).clone();
    let r = d.shape.rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let mut dims = d.shape.to_vec();
    dims.swap(r - 2, r - 1);
    g.add(NodeData { op: Op::Permute(perm), shape: dims.into(), dtype: d.dtype }, &[n])
}

/// Applies the rewrites in place.
pub fn simplify(g: &mut Graph) {
    for p in g.topo_order() {
        let Op::Permute(perm) = &g.node(p).op else { continue };
        if !swaps_last_two(perm) {
            continue;
        }
        let m = g.srcs(p)[0];
        let readers = g.g.edges_directed(m, Direction::Outgoing).count();
        if !matches!(g.node(m).op, Op::Matmul) || readers != 1 || g.outputs.contains(&m) {
            continue;
        }
        let [a, b] = g.srcs(m)[..] else { continue };
        let (at, bt) = (transposed(g, a), transposed(g, b));
        let incoming: Vec<_> = g.g.edges_directed(p, Direction::Incoming).map(|e| e.id()).collect();
        for e in incoming {
            g.g.remove_edge(e);
        }
        g.g[p].op = Op::Matmul;
        g.g.add_edge(bt, p, 0);
        g.g.add_edge(at, p, 1);
        g.g.remove_node(m);
    }
}
