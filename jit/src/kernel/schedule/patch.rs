//! Rule 2f: a GEMM's B read as patches of a stored input (a convolution's windows), its padding folded into the
//! packing where the backend asks, instead of an im2col copy.

use crate::graph::Graph;
use crate::kernel::ir::InstOp;
use crate::kernel::lower::lower;
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

/// M * N * K of matmul `n` (per batch element).
pub(super) fn gemm_volume(graph: &Graph, n: NodeIndex) -> usize {
    let a = graph.node(graph.srcs(n)[0]).shape.dims();
    let out = graph.node(n).shape.dims();
    out[out.len() - 2..].iter().product::<usize>() * a[a.len() - 1]
}

/// Rule 2f: whether matmul operand `b` (a view of `[.., K, N]`) can be read as a patched B, the data it views
/// stored and its index separable into a part per K and per N
/// ([`IExpr::separate`](crate::kernel::index::IExpr::separate)); if so, marks that data stored. Whatever the
/// steps along N: a packing that gathers element by element (a strided convolution's columns, the weight
/// gradient's `patches^T` stepping through the window) still beats copying the patches and packing the
/// copy (a 3 x 3 convolution at stride 2, 64 -> 128 channels at 56 x 56: 5.1 -> 3.3 ms; its forward + backward at
/// stride 1: 33 -> 25 ms).
///
/// Where the backend asks (`fold_pad`: `ScheduleOptions::patched_pad`), a zero padding under the view is folded into
/// the patch (its ranges, `gemm::Patch::ranges`) where the rows fall into at most [`FOLDED_PAD_CLASSES`] classes (a
/// window's taps; a weight gradient's output positions, by the edges they lie on): the packing then zero-fills
/// what lies outside and the padded input is never stored, one pass over the input saved. Elsewhere (a 7 x 7
/// window's 49 taps) the padded input is stored and read as before.
pub(super) fn patch(
    graph: &Graph,
    b: NodeIndex,
    mat: &mut [bool],
    fold_pad: bool,
    consumers: &[Vec<NodeIndex>],
) -> bool {
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
