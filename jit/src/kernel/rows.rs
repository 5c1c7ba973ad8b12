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
//! Code that reads an element's position (an iota: cross entropy's `class == target` mask) joins like any other,
//! so cross entropy's pick of the target's log-probability is the root of a group holding the row max and the
//! log-sum-exp: one kernel. The backend's say still decides: the CPU generates positions a vector at a time
//! (`cpu/wide/rows/`), and a kernel it does not generate would compute them a lane at a time, which is why it
//! declines the ones it cannot generate.

use crate::graph::Graph;
use crate::kernel::lower::lower;
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;

/// The longest row a row kernel folds: 128 KiB of f32, so that a row read by the first reduction is still in
/// the core's L2 for the next ones (the point of the kernel). Longer rows, and a whole tensor as one row (which
/// one thread would fold while the other cores wait), keep the kernels that split their work over all cores.
const MAX_ROW: usize = 1 << 15;

/// Which kernels each node is inlined into, as `grow` asks it: a table computed for every node at once, or found
/// per node by walking up from it under a trial materialization (what one trial asks of it is a few nodes, where
/// the table would walk every kernel of the graph again).
enum Owners<'a> {
    Table(Vec<Vec<NodeIndex>>),
    Walk(&'a [bool]),
}

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
    /// (they are inlined into the root's kernel now). A reduction root whose code after the fold the backend
    /// declines (cross entropy's per-sample range check on i64 targets) is tried without that code: the fold is
    /// then materialized as the group's root (`stage` updated) and the code after it stays a kernel of its own.
    pub(crate) fn form(&self, mat: &mut [bool], stage: &mut [Option<NodeIndex>]) -> Vec<Option<Vec<NodeIndex>>> {
        let g = self.graph;
        let mut rows_of: Vec<Option<Vec<NodeIndex>>> = vec![None; mat.len()];
        let kernels = self.kernels(mat);
        // Computed once, before any group forms (the groups below read it as it was then).
        let owners = Owners::Table(self.owners(mat));
        let mut absorbed = vec![false; mat.len()];
        // Sinks first, so that a group forms at the last kernel of a chain.
        for &root in kernels.iter().rev() {
            if absorbed[root.index()] {
                continue;
            }
            let mut found = self.grow(root, stage[root.index()], stage, mat, &owners).map(|f| (root, f));
            if found.is_none()
                && let Some(r) = stage[root.index()]
                && r != root
                && matches!(g.node(r).op, Op::Reduce { .. })
            {
                let mut trial = mat.to_vec();
                trial[r.index()] = true;
                found = self.grow(r, Some(r), stage, &trial, &Owners::Walk(&trial)).map(|f| (r, f));
            }
            let Some((at, (members, reductions))) = found else { continue };
            if at != root {
                mat[at.index()] = true;
                stage[at.index()] = Some(at);
                stage[root.index()] = None;
            }
            for &m in &members[1..] {
                mat[m.index()] = false;
                absorbed[m.index()] = true;
            }
            rows_of[at.index()] = Some(reductions);
        }
        rows_of
    }

    /// The kernels of `mat`: materialized nodes other than inputs, in graph order.
    fn kernels(&self, mat: &[bool]) -> Vec<NodeIndex> {
        let g = self.graph;
        self.order.iter().copied().filter(|&n| mat[n.index()] && !matches!(g.node(n).op, Op::Input { .. })).collect()
    }

    /// Which kernels of `mat` each node is inlined into (a shared cheap value may be in several).
    fn owners(&self, mat: &[bool]) -> Vec<Vec<NodeIndex>> {
        let mut owners: Vec<Vec<NodeIndex>> = vec![Vec::new(); mat.len()];
        for k in self.kernels(mat) {
            for n in self.region(k, mat) {
                owners[n.index()].push(k);
            }
        }
        owners
    }

    /// The kernels node `n` is inlined into (see [`Owners`]).
    fn owners_of<'o>(&self, owners: &'o Owners, n: NodeIndex) -> std::borrow::Cow<'o, [NodeIndex]> {
        match owners {
            Owners::Table(t) => std::borrow::Cow::Borrowed(&t[n.index()]),
            Owners::Walk(mat) => std::borrow::Cow::Owned(self.owners_walk(mat, n)),
        }
    }

    /// The kernels of `mat` whose code inlines `n`, found from `n` upwards: `n` itself if stored (a kernel's own
    /// node), else every stored reader reached through readers that are not stored. The same set as
    /// [`Groups::owners`]'s entry for `n`, found without walking every kernel.
    fn owners_walk(&self, mat: &[bool], n: NodeIndex) -> Vec<NodeIndex> {
        if mat[n.index()] {
            return if matches!(self.graph.node(n).op, Op::Input { .. }) { Vec::new() } else { vec![n] };
        }
        let (mut found, mut seen, mut stack) = (Vec::new(), vec![n], vec![n]);
        while let Some(x) = stack.pop() {
            for &c in &self.consumers[x.index()] {
                if seen.contains(&c) {
                    continue;
                }
                seen.push(c);
                if mat[c.index()] {
                    found.push(c);
                } else {
                    stack.push(c);
                }
            }
        }
        found
    }

    /// The group rooted at kernel `root` (reduce stage `root_stage`) under `mat`: its members (`root` first) and
    /// row reductions in fold order, where one forms, lowers and the backend takes it.
    fn grow(
        &self,
        root: NodeIndex,
        root_stage: Option<NodeIndex>,
        stage: &[Option<NodeIndex>],
        mat: &[bool],
        owners: &Owners,
    ) -> Option<(Vec<NodeIndex>, Vec<NodeIndex>)> {
        let g = self.graph;
        // A reshape to the same dims is its source under another name: the node a custom gradient hangs on
        // (`Tensor::with_grad_fn`, softmax's), which a model's step stores as the value.
        let same_dims =
            |n: NodeIndex| g.srcs(n).first().is_some_and(|&s| g.node(s).shape.dims() == g.node(n).shape.dims());
        let root_space = match root_stage {
            Some(r) => Some(RowSpace::of_reduce(g, r)?),
            None if matches!(g.node(root).op, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast) => None,
            None if matches!(g.node(root).op, Op::Reshape) && same_dims(root) => None,
            None => return None,
        };
        let mut space = root_space.clone();
        let mut members: Vec<NodeIndex> = vec![root];
        let mut region = self.region(root, mat);
        let mut reductions: Vec<NodeIndex> = Vec::new();
        loop {
            let mut joined = false;
            let frontier: Vec<NodeIndex> = {
                let mut f: Vec<NodeIndex> =
                    region.iter().flat_map(|&n| g.srcs(n)).filter(|s| mat[s.index()] && !members.contains(s)).collect();
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
                    .all(|c| region.contains(c) && self.owners_of(owners, *c).iter().all(|o| members.contains(o)));
                if !only_ours {
                    continue;
                }
                let joining = self.region(f, mat);
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
        let space = space?;
        if reductions.is_empty() {
            return None;
        }
        // The root computes over the row space: elementwise over all of it, or reducing its trailing axes.
        if root_space.is_none() && g.node(root).shape.dims() != space.shape.as_slice() {
            return None;
        }
        // Fold order: the graph's (a reduction read by another comes first).
        reductions.sort_by_key(|r| self.order.iter().position(|o| o == r));
        let mut trial = mat.to_vec();
        for &m in &members[1..] {
            trial[m.index()] = false;
        }
        match lower(g, root, root_stage, &reductions, &trial) {
            Some((ir, _)) if self.accept.is_none_or(|ok| ok(&ir)) => Some((members, reductions)),
            _ => None,
        }
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
