//! Rules 5-8 (`schedule/mod.rs` states them): the stored nodes as kernels in the order they launch, a parameter
//! update after the last reader of the input it replaces; each lowered to the kernel IR, a large full reduction
//! split in two and an elementwise kernel's loops split where its indices divide them; and every kernel within the
//! buffers a launch may bind, or the nodes to store so that it is.

use super::Round;
use crate::graph::Graph;
use crate::kernel::ir::KernelIr;
use crate::kernel::lower::lower;
use crate::kernel::split::{split_full_reduction, with_merged_reduce_loops};
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;
use std::collections::HashMap;

/// A kernel lowered for its launch: the node it stores, its IR, the stored nodes it reads (its inputs, in order),
/// and, for a full reduction split in two (rule 6), the partial and combining kernels that run instead.
pub(super) type Lowered = (NodeIndex, KernelIr, Vec<NodeIndex>, Option<(KernelIr, KernelIr)>);

impl Round<'_> {
    /// Rules 5-8 over the decisions so far: the kernels in launch order, lowered; `Err` names nodes to store
    /// first (rule 8: the plan is then scheduled again).
    pub(super) fn lower_kernels(
        &self,
        stage: &[Option<NodeIndex>],
        rows_of: &[Option<Vec<NodeIndex>>],
    ) -> Result<Vec<Lowered>, Vec<NodeIndex>> {
        let Round { graph, opts, pinned, order, consumers, ref mat, .. } = *self;
        // In order (the slots follow it: rule 4).
        let kernels: Vec<NodeIndex> = order
            .iter()
            .copied()
            .filter(|&n| mat[n.index()] && !matches!(graph.node(n).op, Op::Input { .. }))
            .collect();
        // Rule 5: a replacement of an input (an output nothing reads, computed from an input of its dtype and size: a
        // parameter's update) runs after every other kernel that reads such an input, so no later kernel reads the
        // input it replaces and the output may be written over it (`donate.rs`; the batch-1 MLP step updated W2
        // before its backward GEMV read W2). Moving a kernel nothing reads later never breaks a dependency.
        let replaced = |k: NodeIndex, reads: &[NodeIndex]| -> Vec<NodeIndex> {
            let d = graph.node(k);
            if !graph.outputs.contains(&k) || !consumers[k.index()].is_empty() {
                return Vec::new();
            }
            reads
                .iter()
                .copied()
                .filter(|&r| {
                    let i = graph.node(r);
                    matches!(i.op, Op::Input { .. }) && i.dtype == d.dtype && i.shape.numel() == d.shape.numel()
                })
                .collect()
        };
        let lowered = |k: NodeIndex| {
            let rows = rows_of[k.index()].as_deref().unwrap_or(&[]);
            let (ir, reads) =
                lower(graph, k, stage[k.index()], rows, mat).expect("row groups are formed where lowering takes them");
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
            if region_reads(graph, k, mat, &mut memo).len() < budget {
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
        let launches: Vec<Lowered> =
            kernels.iter().map(|&k| counted.remove(&k).unwrap_or_else(|| lowered(k))).collect();
        Ok(replacements_after_readers(launches, replaced))
    }
}

/// Rule 5's order: `launches` (in topological order) with each replacement of inputs (`replaced` names the inputs
/// a launch's output may be written over; empty for any other launch) moved to just after the last other launch
/// that reads one of them. As late as that and no later: an optimizer's updates of one parameter (AdamW's moments,
/// then the parameter from them) then run one after another, each reading the one before from cache, where all the
/// parameters' updates after all the moments' had read every moment back from memory. Replacements that wait on each
/// other (each reads what the other replaces) run last, in order.
fn replacements_after_readers(
    launches: Vec<Lowered>,
    replaced: impl Fn(NodeIndex, &[NodeIndex]) -> Vec<NodeIndex>,
) -> Vec<Lowered> {
    let targets: Vec<Vec<NodeIndex>> = launches.iter().map(|(k, _, reads, _)| replaced(*k, reads)).collect();
    // Per input, the launches that read it and have not run yet (a replacement's own read excluded).
    let mut readers_left: HashMap<NodeIndex, usize> = HashMap::new();
    for (i, (_, _, reads, _)) in launches.iter().enumerate() {
        for r in reads {
            if !targets[i].contains(r) {
                *readers_left.entry(*r).or_default() += 1;
            }
        }
    }
    let ready =
        |t: &[NodeIndex], left: &HashMap<NodeIndex, usize>| t.iter().all(|r| left.get(r).is_none_or(|&n| n == 0));
    // Launches `l` (replacing `t`): its reads are done.
    let run = |(l, t): (Lowered, Vec<NodeIndex>), left: &mut HashMap<NodeIndex, usize>, out: &mut Vec<Lowered>| {
        for r in l.2.iter().filter(|r| !t.contains(r)) {
            if let Some(n) = left.get_mut(r) {
                *n -= 1;
            }
        }
        out.push(l);
    };
    let mut out = Vec::with_capacity(launches.len());
    let mut waiting: Vec<(Lowered, Vec<NodeIndex>)> = Vec::new();
    for (l, t) in launches.into_iter().zip(targets) {
        if t.is_empty() {
            run((l, t), &mut readers_left, &mut out);
        } else {
            waiting.push((l, t));
        }
        // Release, in order, every waiting replacement whose inputs no launch left reads; one released may let
        // another go (it read what the other replaces).
        while let Some(i) = waiting.iter().position(|(_, t)| ready(t, &readers_left)) {
            run(waiting.remove(i), &mut readers_left, &mut out);
        }
    }
    out.extend(waiting.into_iter().map(|(l, _)| l));
    out
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
