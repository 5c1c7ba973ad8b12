//! Rules 3, 3b and 3c (`schedule/mod.rs` states them): a reduction or GEMM becomes the *reduce stage* of the one
//! stored node its value flows into (that node's kernel computes it, and the ops after it run as its epilogue),
//! and reductions over rows join the kernel over the same rows as its row reductions.

use super::Round;
use super::half::{bf16_epilogue_op, constant};
use super::region::{elementwise_at, region_target};
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

impl Round<'_> {
    /// Rule 3 (with 3c): per stored node, the reduction or GEMM it computes as its stage, if any.
    pub(super) fn reduce_stages(&mut self) -> Vec<Option<NodeIndex>> {
        let Round { graph, pinned, order, consumers, ref mut mat, ref half_operands, .. } = *self;
        let mut stage: Vec<Option<NodeIndex>> = vec![None; mat.len()];
        for &r in order {
            if !matches!(graph.node(r).op, Op::Reduce { .. } | Op::Matmul) {
                continue;
            }
            let numel = graph.node(r).shape.numel();
            let fusable = |n: NodeIndex| elementwise_at(graph, n, numel);
            let walk = |mat: &[bool]| region_target(graph, consumers, r, mat);
            if graph.outputs.contains(&r) {
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
            let (target, seen) = walk(mat);
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
                    let (target, seen) = walk(mat);
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
        stage
    }

    /// Rule 3b: per stored node, the row reductions its kernel computes first (a row kernel), if any.
    pub(super) fn row_kernels(&mut self, stage: &mut [Option<NodeIndex>]) -> Vec<Option<Vec<NodeIndex>>> {
        let Round { graph, opts, order, consumers, ref mut mat, .. } = *self;

        if opts.row_kernels {
            let groups = crate::kernel::rows::Groups {
                graph,
                order,
                consumers,
                outputs: &graph.outputs,
                accept: opts.row_kernel_ok,
            };
            groups.form(mat, stage)
        } else {
            vec![None; mat.len()]
        }
    }
}
