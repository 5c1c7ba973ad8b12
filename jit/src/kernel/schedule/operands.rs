//! Rules 2b-2e (`schedule/mod.rs` states them): what a GEMM reads. Its operands are stored where reading them in
//! place would cost more than a pass over memory (a transposed weight, a computed operand, a view needing a
//! division per element), a broadcast source is stored once, and a bf16 or f16 GEMM reads half-precision
//! operands where they are stored.

use super::Round;
use super::half::{half_gemm, half_gemm_operands};
use super::patch::{gemm_volume, patch};
use super::region::scrambled;
use crate::graph::Graph;
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

/// Rule 2c: a matmul operand that is a slice keeping at least 1 / this of what it views is read in place from its
/// stored source rather than stored itself.
const SLICE_READ_IN_PLACE: usize = 4;

/// Rows of A from which a transposed B is copied to contiguous memory before the GEMM (rule 2b).
const TRANSPOSE_COPY_MIN_ROWS: usize = 8;

impl Round<'_> {
    /// Rules 2b-2f, in the order that lets a half-precision GEMM read its operands before an f32 rule stores them.
    pub(super) fn store_gemm_operands(&mut self) {
        let Round { graph, opts, order, consumers, ref mut mat, ref cost, ref mut half_operands, .. } = *self;
        let opts = *opts;
        // Rule 2e (before 2b and 2c, which would store the operands in f32): a bf16 (f16) GEMM reads its operands in
        // bf16 (f16). `half_operands[n]`: the dtype matmul `n` reads.
        if opts.bf16_gemm || opts.f16_gemm {
            for &n in order {
                if matches!(graph.node(n).op, Op::Matmul)
                    && let Some((dtype, stored)) = half_gemm_operands(graph, n, mat, &opts)
                {
                    for s in stored {
                        mat[s.index()] = true;
                    }
                    half_operands[n.index()] = Some(dtype);
                }
            }
        }

        // Rule 2b: a matmul whose right operand is a transposed view (`x.matmul(&w.t())`, every linear layer)
        // would read B across its rows. With enough rows of A to amortize it, store the transposed B once (a copy
        // of K x N) so the GEMM reads it contiguously; with fewer, the renderer's dot-product form (vectorized
        // along K) is cheaper.
        for &n in order {
            if !matches!(graph.node(n).op, Op::Matmul) || half_operands[n.index()].is_some() {
                continue;
            }
            let srcs = graph.srcs(n);
            let (a, b) = (graph.node(srcs[0]), srcs[1]);
            let m = a.shape.dims()[a.shape.rank() - 2];
            if opts.transpose_copy
                && m >= TRANSPOSE_COPY_MIN_ROWS
                && !mat[b.index()]
                && is_transposed_view(graph, b, mat)
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
                        && SLICE_READ_IN_PLACE * graph.node(c).shape.numel()
                            >= graph.node(graph.srcs(c)[0]).shape.numel()
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
                    if patch(graph, src, mat, opts.patched_pad, consumers) {
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
        for &n in order {
            if matches!(graph.node(n).op, Op::Matmul) && half_operands[n.index()].is_none() {
                store_computed_operands(n, mat);
            }
        }

        // Rule 2d: a broadcast recomputes its source for every output element it fans out to. A source vector that
        // costs ALU ops (through movement ops, read back to its first computed node) is stored once instead: it then
        // usually runs as the epilogue of the matmul or reduction it comes from (rule 3), so it costs no launch. The
        // batch-1 MLP's weight update `W - lr * (g * mask)^T x` recomputed a 3-op mask product for each of 784
        // columns (4.5 µs of a 61 µs step on one thread). A one-element source stays inlined: its value is the same
        // for every element, so the kernel reads it as a uniform, and storing it would cost a launch of its own.
        for &n in order {
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
        for &n in order {
            if half_operands[n.index()].is_some()
                && half_gemm_operands(graph, n, mat, &opts).is_none_or(|(_, s)| !s.is_empty())
            {
                half_operands[n.index()] = None;
                store_computed_operands(n, mat);
            }
        }
    }
}

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
