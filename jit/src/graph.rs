//! The graph IR: primitives (`Op`) with their shapes and dtypes on a petgraph `StableGraph`.
//!
//! The `kiln` crate copies the reachable, unrealized part of a user's lazy DAG into one of these on a plan-cache
//! miss; every pass (verify, and in later layers fusion and scheduling) and the reference interpreter read it.
//! Edge weights are operand positions, so `srcs` returns operands in order. It is a `StableGraph` so that passes
//! may remove and rewrite nodes without renumbering the rest.

use crate::dtype::DType;
use crate::op::{BinaryOp, Op, UnaryOp};
use crate::shape::{Shape, broadcast_shapes};
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use std::fmt::Write;

/// One node of the graph IR.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeData {
    pub op: Op,
    pub shape: Shape,
    pub dtype: DType,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub g: StableGraph<NodeData, usize>,
    /// The nodes whose values the caller wants back, in the caller's order.
    pub outputs: Vec<NodeIndex>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, data: NodeData, srcs: &[NodeIndex]) -> NodeIndex {
        let n = self.g.add_node(data);
        for (pos, &s) in srcs.iter().enumerate() {
            self.g.add_edge(s, n, pos);
        }
        n
    }

    pub fn node(&self, n: NodeIndex) -> &NodeData {
        &self.g[n]
    }

    /// The operands of `n`, in operand order.
    pub fn srcs(&self, n: NodeIndex) -> Vec<NodeIndex> {
        let mut e: Vec<(usize, NodeIndex)> =
            self.g.edges_directed(n, Direction::Incoming).map(|e| (*e.weight(), e.source())).collect();
        e.sort_unstable_by_key(|(pos, _)| *pos);
        e.into_iter().map(|(_, s)| s).collect()
    }

    /// Nodes in an order where every operand comes before its users.
    pub fn topo_order(&self) -> Vec<NodeIndex> {
        // A graph built from Arc'd lazy nodes cannot have a cycle; a failure here is a bug in a pass.
        petgraph::algo::toposort(&self.g, None).expect("graph IR has a cycle")
    }

    /// Number of `Input` slots the graph reads.
    pub fn input_count(&self) -> usize {
        self.g
            .node_weights()
            .filter_map(|d| if let Op::Input { slot } = d.op { Some(slot + 1) } else { None })
            .max()
            .unwrap_or(0)
    }

    /// Number of run-time `RngKey` slots the graph reads.
    pub fn rand_count(&self) -> usize {
        self.g
            .node_weights()
            .filter_map(|d| if let Op::Rand { slot, .. } = d.op { Some(slot + 1) } else { None })
            .max()
            .unwrap_or(0)
    }

    /// Checks every node's shape and dtype against its operands. The `kiln` crate already checks user input at
    /// each op; this catches a pass or a constructor that builds an inconsistent node.
    pub fn verify(&self) -> Result<(), String> {
        for n in self.topo_order() {
            let d = &self.g[n];
            let srcs: Vec<&NodeData> = self.srcs(n).into_iter().map(|s| &self.g[s]).collect();
            check_node(d, &srcs).map_err(|e| format!("node {} ({}): {e}", n.index(), d.op))?;
        }
        Ok(())
    }

    /// One line per node, in topological order: `%3 = add(%1, %2) : f32[2, 3]`.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for n in self.topo_order() {
            let d = &self.g[n];
            let srcs: Vec<String> = self.srcs(n).iter().map(|s| format!("%{}", s.index())).collect();
            let out = if self.outputs.contains(&n) { "  (output)" } else { "" };
            let _ = writeln!(s, "%{} = {}({}) : {}{}{out}", n.index(), d.op, srcs.join(", "), d.dtype, d.shape);
        }
        s
    }

    /// Graphviz DOT of the graph.
    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph kiln {\n  node [shape=box, fontname=monospace];\n");
        for n in self.g.node_indices() {
            let d = &self.g[n];
            let style = if self.outputs.contains(&n) { ", style=bold" } else { "" };
            let _ =
                writeln!(s, "  n{} [label=\"%{} {}\\n{}{}\"{style}];", n.index(), n.index(), d.op, d.dtype, d.shape);
        }
        for e in (&self.g).edge_references() {
            let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", e.source().index(), e.target().index(), e.weight());
        }
        s.push_str("}\n");
        s
    }
}

fn check_node(d: &NodeData, srcs: &[&NodeData]) -> Result<(), String> {
    if srcs.len() != d.op.arity() {
        return Err(format!("expects {} operands, has {}", d.op.arity(), srcs.len()));
    }
    let same_shape = |i: usize| -> Result<(), String> {
        if srcs[i].shape != d.shape {
            return Err(format!("operand {i} has shape {}, node has {}", srcs[i].shape, d.shape));
        }
        Ok(())
    };
    match &d.op {
        Op::Input { .. } | Op::Const(_) => {}
        Op::Iota { .. } if d.shape.rank() != 1 => return Err("iota must be 1-D".into()),
        Op::Iota { .. } => {}
        Op::Rand { .. } if !d.dtype.is_float() => return Err("rand must be float".into()),
        Op::Rand { .. } => {}
        Op::Unary(u) => {
            same_shape(0)?;
            let ok = match u {
                UnaryOp::Not => d.dtype == DType::Bool,
                UnaryOp::Neg | UnaryOp::Abs => d.dtype != DType::Bool,
                _ => d.dtype.is_float(),
            };
            if !ok || srcs[0].dtype != d.dtype {
                return Err(format!("{u:?} on {} -> {}", srcs[0].dtype, d.dtype));
            }
        }
        Op::Binary(b) => {
            same_shape(0)?;
            same_shape(1)?;
            if srcs[0].dtype != srcs[1].dtype {
                return Err(format!("operand dtypes differ: {} vs {}", srcs[0].dtype, srcs[1].dtype));
            }
            let want = if b.is_comparison() { DType::Bool } else { srcs[0].dtype };
            if d.dtype != want {
                return Err(format!("result dtype {} (expected {want})", d.dtype));
            }
            if matches!(b, BinaryOp::And | BinaryOp::Or) && d.dtype != DType::Bool {
                return Err("logical op on non-bool".into());
            }
        }
        Op::Where => {
            (0..3).try_for_each(same_shape)?;
            if srcs[0].dtype != DType::Bool || srcs[1].dtype != d.dtype || srcs[2].dtype != d.dtype {
                return Err("where wants (bool, T, T) -> T".into());
            }
        }
        Op::Cast | Op::Contiguous => {
            same_shape(0)?;
            if matches!(d.op, Op::Contiguous) && srcs[0].dtype != d.dtype {
                return Err("contiguous changes dtype".into());
            }
        }
        Op::Reduce { axes, .. } => {
            let s = &srcs[0].shape;
            let mut want = s.to_vec();
            for &a in axes {
                *want.get_mut(a).ok_or("reduce axis out of range")? = 1;
            }
            if want != d.shape.dims() {
                return Err(format!("reduce of {s} over {axes:?} gives {:?}, node has {}", want, d.shape));
            }
        }
        Op::Reshape if srcs[0].shape.numel() != d.shape.numel() => {
            return Err(format!("reshape {} -> {}", srcs[0].shape, d.shape));
        }
        Op::Reshape => {}
        Op::Permute(p) => {
            let mut seen = p.clone();
            seen.sort_unstable();
            if seen != (0..p.len()).collect::<Vec<_>>() || p.len() != srcs[0].shape.rank() {
                return Err(format!("bad permutation {p:?}"));
            }
            let want: Vec<usize> = p.iter().map(|&i| srcs[0].shape.dims()[i]).collect();
            if want != d.shape.dims() {
                return Err(format!("permute gives {want:?}, node has {}", d.shape));
            }
        }
        Op::Expand => {
            if broadcast_shapes(srcs[0].shape.dims(), d.shape.dims()).as_deref() != Some(d.shape.dims())
                || srcs[0].shape.rank() != d.shape.rank()
            {
                return Err(format!("cannot expand {} to {}", srcs[0].shape, d.shape));
            }
        }
        Op::Slice(sl) => {
            let s = srcs[0].shape.dims();
            if sl.len() != s.len() {
                return Err("slice rank".into());
            }
            for (i, (&(start, step), &out)) in sl.iter().zip(d.shape.dims()).enumerate() {
                // In i128: a graph read back from bytes (a persisted plan) may hold any values, and must not overflow.
                let last = start as i128 + step as i128 * (out as i128 - 1);
                if step == 0 || (out > 0 && (start >= s[i] || last < 0 || last >= s[i] as i128)) {
                    return Err(format!("slice dim {i} reads outside 0..{}", s[i]));
                }
            }
        }
        Op::Unfold { axis, size, step, dilation } => {
            let s = srcs[0].shape.dims();
            let n = s.get(*axis).copied().ok_or("unfold axis out of range")?;
            let Some(windows) = crate::shape::window_count(n, *size, *step, *dilation) else {
                return Err(format!("unfold of {size} every {step} (dilation {dilation}) does not fit {n}"));
            };
            let mut want = s.to_vec();
            want[*axis] = windows;
            want.push(*size);
            if want != d.shape.dims() {
                return Err(format!("unfold gives {want:?}, node has {}", d.shape));
            }
        }
        Op::Pad { pads, .. } => {
            let want: Option<Vec<usize>> =
                srcs[0].shape.dims().iter().zip(pads).map(|(s, (b, a))| s.checked_add(*b)?.checked_add(*a)).collect();
            let want = want.ok_or("pad overflows")?;
            if want != d.shape.dims() || pads.len() != d.shape.rank() {
                return Err(format!("pad gives {want:?}, node has {}", d.shape));
            }
        }
        Op::Gather { axis } => {
            let (s, i) = (srcs[0].shape.dims(), srcs[1].shape.dims());
            let fits = i == d.shape.dims()
                && s.len() == i.len()
                && *axis < s.len()
                && s.iter().zip(i).enumerate().all(|(a, (x, y))| a == *axis || x == y);
            if !fits {
                return Err(format!("gather along {axis} of {} with indices {}", srcs[0].shape, srcs[1].shape));
            }
            if !matches!(srcs[1].dtype, DType::I32 | DType::I64) || srcs[0].dtype != d.dtype {
                return Err(format!("gather of {} by {} indices -> {}", srcs[0].dtype, srcs[1].dtype, d.dtype));
            }
        }
        Op::Matmul => {
            let (a, b) = (srcs[0].shape.dims(), srcs[1].shape.dims());
            let r = a.len();
            if r < 2 || b.len() != r || a[..r - 2] != b[..r - 2] || a[r - 1] != b[r - 2] {
                return Err(format!("matmul {:?} x {:?}", a, b));
            }
            let mut want = a.to_vec();
            want[r - 1] = b[r - 1];
            if want != d.shape.dims() || srcs[0].dtype != d.dtype || srcs[1].dtype != d.dtype {
                return Err("matmul result".into());
            }
        }
        Op::Linalg(l) => crate::kernel::routine::check(*l, srcs, d)?,
        Op::ScatterRows { positions } => crate::kernel::scatter::check(*positions, srcs, d)?,
        Op::SortRows { keep, .. } => crate::kernel::sort::check(*keep, srcs, d)?,
    }
    Ok(())
}
