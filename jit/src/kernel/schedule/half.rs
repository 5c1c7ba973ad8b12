//! Half-precision GEMMs in the schedule (rules 1b and 2e): which casts widen a bf16 or f16 value for a GEMM that
//! could read it where it is stored, and which ops a bf16 GEMM's epilogue computes after rounding its product.

use super::ScheduleOptions;
use super::region::scrambled;
use crate::graph::Graph;
use crate::op::{Op, UnaryOp};
use petgraph::stable_graph::NodeIndex;

/// Whether the backend runs GEMMs on stored operands of half-precision `dtype` (rule 2e): bf16 with
/// `bf16_gemm`, f16 with `f16_gemm`.
pub(super) fn half_gemm(opts: &ScheduleOptions, dtype: crate::DType) -> bool {
    (dtype == crate::DType::BF16 && opts.bf16_gemm) || (dtype == crate::DType::F16 && opts.f16_gemm)
}

/// The half-precision node that `n` widens to f32 (`n` a cast), if it is one of a dtype the backend's GEMMs read
/// ([`half_gemm`]).
pub(super) fn half_widening(graph: &Graph, n: NodeIndex, opts: &ScheduleOptions) -> Option<NodeIndex> {
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
pub(super) fn half_gemm_operands(
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
pub(super) fn bf16_epilogue_op(op: &Op) -> bool {
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
pub(super) fn constant(graph: &Graph, n: NodeIndex) -> bool {
    let mut cur = n;
    while matches!(graph.node(cur).op, Op::Expand | Op::Reshape) {
        cur = graph.srcs(cur)[0];
    }
    matches!(graph.node(cur).op, Op::Const(_))
}
