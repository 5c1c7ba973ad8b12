//! Row kernels (rule 3b of the schedule): reductions over a row whose only readers are one kernel's code over the
//! same rows join that kernel as its row reductions (`KernelIr::rows`), so softmax, log_softmax, layer norm and an
//! RMS norm each run as one kernel that reads a row from memory once, where they were three or four kernels and as
//! many passes over memory.
//!
//! The group of a kernel (its *root*) grows from the materialized values its code reads, until nothing more joins:
//! - a reduction kernel over the trailing axes of a source shaped as the group's rows (`[rows.., reduced..]`), with
//!   or without an epilogue on its per-row result (a layer norm's `1 / sqrt(var + eps)`): its reduction becomes a
//!   row reduction and its epilogue is inlined where read;
//! - a value stored only because it was read twice and is expensive (softmax's `exp(x - max)`, read by the sum and
//!   by the division), of the row space's shape or of one value per row: it is recomputed where read instead;
//!
//! each only when every node that reads it is inlined into the group's kernels and no other kernel's. The root is
//! an elementwise kernel over the row space or a reduction over the same trailing axes (a log-sum-exp's sum after
//! the row's max). A group with no reduction is left as it was. Lowering then checks that every read of a row
//! reduction is at the current row (not through a flip or shift of the rows); where one is not, the group is
//! dropped. Last, the backend may decline a row kernel (`ScheduleOptions::row_kernel_ok`: the CPU takes those it
//! generates at full width), and its kernels stay apart.
//!
//! What it costs: a recomputed value is computed once per reader (softmax computes `exp` twice per element, unless
//! the backend keeps the first pass's value, as the CPU's generated row kernels do); what it saves: every pass
//! over memory but the first read and the last write.
//!
//! Code that reads an element's position (an iota: cross entropy's `class == target` mask) joins no group: the
//! CPU computes positions one lane at a time, so such a kernel folding a row several times costs more than the
//! pass over memory it saves. Cross entropy therefore keeps its kernels: its pick of the target's logit reads the
//! row max too, so the max does not join the log-sum-exp either.

use crate::graph::Graph;
use crate::kernel::lower::lower;
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

/// The longest row a row kernel folds: 128 KiB of f32, so that a row read by the first reduction is still in
/// the core's L2 for the next ones (the point of the kernel). Longer rows, and a whole tensor as one row (which
/// one thread would fold while the other cores wait), keep the kernels that split their work over all cores.
const MAX_ROW: usize = 1 << 15;

/// What the schedule knows when it forms row groups.
pub(crate) struct Groups<'a> {
    pub graph: &'a Graph,
    pub order: &'a [NodeIndex],
    pub consumers: &'a [Vec<NodeIndex>],
    pub outputs: &'a [NodeIndex],
    /// The backend's say over each row kernel (`ScheduleOptions::row_kernel_ok`).
    pub accept: Option<fn(&crate::kernel::KernelIr) -> bool>,
}

/// The row space of a group: the source shape of its reductions and how many leading dims index a row.
#[derive(Clone, PartialEq, Eq)]
struct RowSpace {
    shape: Vec<usize>,
    row_rank: usize,
}

impl RowSpace {
    /// The row space a reduction `r` folds over: `None` unless its axes are trailing and fold between 2 and
    /// [`MAX_ROW`] elements, over at least two rows.
    fn of_reduce(graph: &Graph, r: NodeIndex) -> Option<RowSpace> {
        let Op::Reduce { axes, .. } = &graph.node(r).op else { return None };
        let shape = graph.node(graph.srcs(r)[0]).shape.to_vec();
        let row_rank = shape.len().checked_sub(axes.len())?;
        let trailing = axes.iter().all(|&a| a >= row_rank) && axes.len() == shape.len() - row_rank;
        let folded: usize = shape[row_rank..].iter().product();
        let rows: usize = shape[..row_rank].iter().product();
        let fits = (2..=MAX_ROW).contains(&folded) && rows >= 2;
        (trailing && fits && !shape.contains(&0)).then_some(RowSpace { shape, row_rank })
    }

    /// The shape of one value per row (the reduced dims kept as 1).
    fn per_row(&self) -> Vec<usize> {
        self.shape.iter().enumerate().map(|(a, &d)| if a < self.row_rank { d } else { 1 }).collect()
    }
}

impl Groups<'_> {
    /// Forms the row groups: for each root that gets one, its row reductions in fold order. Members leave `mat`
    /// (they are inlined into the root's kernel now).
    pub(crate) fn form(&self, mat: &mut [bool], stage: &[Option<NodeIndex>]) -> Vec<Option<Vec<NodeIndex>>> {
        let g = self.graph;
        let bound = mat.len();
        let mut rows_of: Vec<Option<Vec<NodeIndex>>> = vec![None; bound];
        // Which kernels each node is inlined into (a shared cheap value may be in several).
        let kernels: Vec<NodeIndex> = self
            .order
            .iter()
            .copied()
            .filter(|&n| mat[n.index()] && !matches!(g.node(n).op, Op::Input { .. }))
            .collect();
        let mut owners: Vec<Vec<NodeIndex>> = vec![Vec::new(); bound];
        for &k in &kernels {
            for n in self.region(k, mat) {
                owners[n.index()].push(k);
            }
        }
        let mut absorbed = vec![false; bound];
        // Sinks first, so that a group forms at the last kernel of a chain.
        for &root in kernels.iter().rev() {
            if absorbed[root.index()] {
                continue;
            }
            let root_space = match stage[root.index()] {
                Some(r) => match RowSpace::of_reduce(g, r) {
                    Some(s) => Some(s),
                    None => continue,
                },
                None if matches!(g.node(root).op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast) => None,
                None => continue,
            };
            let mut space = root_space.clone();
            let mut members: Vec<NodeIndex> = vec![root];
            let mut region = self.region(root, mat);
            if self.reads_a_position(&region) {
                continue;
            }
            let mut reductions: Vec<NodeIndex> = Vec::new();
            loop {
                let mut joined = false;
                let frontier: Vec<NodeIndex> = {
                    let mut f: Vec<NodeIndex> = region
                        .iter()
                        .flat_map(|&n| g.srcs(n))
                        .filter(|s| mat[s.index()] && !members.contains(s))
                        .collect();
                    f.sort();
                    f.dedup();
                    f
                };
                for f in frontier {
                    let node = g.node(f);
                    if self.outputs.contains(&f)
                        || !matches!(node.op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Reduce { .. })
                    {
                        continue;
                    }
                    // Every reader inlined into this group's kernels only.
                    let only_ours = self.consumers[f.index()]
                        .iter()
                        .all(|c| region.contains(c) && owners[c.index()].iter().all(|o| members.contains(o)));
                    let joining = self.region(f, mat);
                    if !only_ours || self.reads_a_position(&joining) {
                        continue;
                    }
                    let reduction = match stage[f.index()] {
                        Some(r) => {
                            let Some(s) = RowSpace::of_reduce(g, r) else { continue };
                            if space.as_ref().is_some_and(|sp| *sp != s) {
                                continue;
                            }
                            space = Some(s);
                            Some(r)
                        }
                        None => {
                            // A stored value recomputed where read: of the row space's shape or one per row.
                            let Some(sp) = &space else { continue };
                            let dims = node.shape.dims();
                            if dims != sp.shape.as_slice() && dims != sp.per_row().as_slice() {
                                continue;
                            }
                            None
                        }
                    };
                    members.push(f);
                    reductions.extend(reduction);
                    for n in joining {
                        if !region.contains(&n) {
                            region.push(n);
                        }
                    }
                    joined = true;
                }
                if !joined {
                    break;
                }
            }
            let Some(space) = space else { continue };
            if reductions.is_empty() {
                continue;
            }
            // The root computes over the row space: elementwise over all of it, or reducing its trailing axes.
            if root_space.is_none() && g.node(root).shape.dims() != space.shape.as_slice() {
                continue;
            }
            // Fold order: the graph's (a reduction read by another comes first).
            reductions.sort_by_key(|r| self.order.iter().position(|o| o == r));
            let mut trial = mat.to_vec();
            for &m in &members[1..] {
                trial[m.index()] = false;
            }
            match lower(g, root, stage[root.index()], &reductions, &trial) {
                Some((ir, _)) if self.accept.is_none_or(|ok| ok(&ir)) => {}
                _ => continue,
            }
            for &m in &members[1..] {
                mat[m.index()] = false;
                absorbed[m.index()] = true;
            }
            rows_of[root.index()] = Some(reductions);
        }
        rows_of
    }

    /// Whether any of `nodes` is an iota (see the module doc).
    fn reads_a_position(&self, nodes: &[NodeIndex]) -> bool {
        nodes.iter().any(|&n| matches!(self.graph.node(n).op, Op::Iota { .. }))
    }

    /// The nodes inlined into kernel `k`'s code (with `k` itself): everything reached from it through sources that
    /// are not materialized, its reduce stage included.
    fn region(&self, k: NodeIndex, mat: &[bool]) -> Vec<NodeIndex> {
        let mut seen = vec![k];
        let mut stack = vec![k];
        while let Some(n) = stack.pop() {
            for s in self.graph.srcs(n) {
                if !mat[s.index()] && !seen.contains(&s) {
                    seen.push(s);
                    stack.push(s);
                }
            }
        }
        seen
    }
}
