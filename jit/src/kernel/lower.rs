//! Lowering: one scheduled kernel (a materialized root, maybe with a reduce stage) to `KernelIr`.
//!
//! Values are built by walking the graph backwards from the root with an index (one `IExpr` per dim of the node
//! being read). Elementwise ops pass the index through, movement ops rewrite it (see `index.rs`), and a
//! materialized node becomes a load at the row-major offset of its index. `Pad` evaluates its source under a
//! validity range (loads outside it are skipped) and selects the pad value there. Values are memoized per (node,
//! index, validity), so a node read twice at the same place is computed once.
//!
//! A row kernel (`KernelIr::rows`) lowers each row reduction's source at (row, reduce variables) into its own
//! instruction list, and a read of a row reduction's node becomes `RowAcc`. That read must be at the current row
//! (the row's output variables, zeros along the reduced dims): a value read at another row (through a flip or a
//! shift of the rows) is not the one this row folded, so lowering reports it and the schedule keeps the kernels
//! apart.
//!
//! An f16 reduction or matmul accumulates in f32 (as PyTorch does): its inner value is converted to f32 (a matmul's
//! operands before the product, which is exact in f32), the accumulator is f32, and reading it converts to f16,
//! the one rounding. Per-step f16 rounding would lose a bit of the sum at every addition.

use crate::dtype::{DType, Scalar};
use crate::graph::Graph;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{BufParam, Inst, InstOp, KernelIr, Reduce, Valid, ValueId};
use crate::op::{BinaryOp, Op, ReduceOp};
use crate::shape::contiguous_strides;
use petgraph::stable_graph::NodeIndex;

struct Lowerer<'a> {
    graph: &'a Graph,
    mat: &'a [bool],
    root: NodeIndex,
    stage: Option<NodeIndex>,
    /// The row reductions' nodes, in fold order (`RowAcc` j reads `rows[j]`).
    rows: &'a [NodeIndex],
    /// Output loops of a row (see `KernelIr::row_rank`).
    row_rank: usize,
    /// Set when a row reduction is read off the current row: the kernel cannot be a row kernel.
    off_row: bool,
    extents: Vec<usize>,
    reads: Vec<NodeIndex>,
    insts: Vec<Inst>,
    memo: rustc_hash::FxHashMap<(NodeIndex, Vec<IExpr>, Option<Valid>), ValueId>,
    valid: Option<Valid>,
    names: Vec<String>,
    /// Set while building the outer code, where the stage node's value is the accumulator.
    acc_enabled: bool,
}

/// The accumulator dtype of a reduction or matmul producing `d`: f32 for f16 and bf16, else `d`.
fn acc_dtype(d: DType) -> DType {
    if d.is_half() { DType::F32 } else { d }
}

/// Row-major offset of `idx` in `dims`, simplified.
fn linear(idx: &[IExpr], dims: &[usize], extents: &[usize]) -> IExpr {
    let strides = contiguous_strides(dims);
    let terms: Vec<IExpr> =
        idx.iter().zip(&strides).filter(|&(_, &s)| s != 0).map(|(e, &s)| e.clone().times(s as i64)).collect();
    IExpr::Add(terms).simplify(extents)
}

/// The multi-index in `dims` of row-major offset `flat`, simplified.
fn unflatten(flat: &IExpr, dims: &[usize], extents: &[usize]) -> Vec<IExpr> {
    if dims.contains(&0) {
        // An empty tensor is never read: any index will do (and strides of 0 would divide by zero).
        return vec![IExpr::Const(0); dims.len()];
    }
    let strides = contiguous_strides(dims);
    dims.iter()
        .zip(&strides)
        .map(
            |(&d, &s)| {
                if d == 1 {
                    IExpr::Const(0)
                } else {
                    flat.clone().floor_div(s as i64).modulo(d as i64).simplify(extents)
                }
            },
        )
        .collect()
}

impl Lowerer<'_> {
    fn push(&mut self, op: InstOp, dtype: DType) -> ValueId {
        let mut inst = Inst { op, dtype };
        // A padded dim's wrapped source index is in range wherever the instruction's value is used (under the
        // pad's range check): it is the index itself there (`IExpr::Wrap`).
        if inst.indices().iter().any(|e| e.has_wrap()) {
            let extents = &self.extents;
            inst.map_indices(&|e| if e.has_wrap() { e.unwrap_known().simplify(extents) } else { e.clone() });
        }
        self.insts.push(inst);
        self.insts.len() - 1
    }

    fn konst(&mut self, s: Scalar, dtype: DType) -> ValueId {
        self.push(InstOp::Const(s), dtype)
    }

    fn buffer(&mut self, n: NodeIndex) -> usize {
        match self.reads.iter().position(|&r| r == n) {
            Some(i) => i,
            None => {
                self.reads.push(n);
                self.reads.len() - 1
            }
        }
    }

    fn note(&mut self, name: String) {
        if self.names.last() != Some(&name) {
            self.names.push(name);
        }
    }

    /// The value folded by `Reduce` node `r`: its source at kept axes as output variables `0..` and reduced axes as
    /// variables from `first`, converted to the accumulator's dtype. Returns the op, the reduced extents, the
    /// accumulator dtype and the value.
    fn reduce_source(&mut self, r: NodeIndex, first: usize) -> (ReduceOp, Vec<usize>, DType, ValueId) {
        let g = self.graph;
        let Op::Reduce { op, axes } = &g.node(r).op else { unreachable!("{} is not a reduction", g.node(r).op) };
        let src = g.srcs(r)[0];
        let sd = g.node(src).shape.to_vec();
        let (mut k, mut q) = (0, first);
        let idx: Vec<IExpr> = (0..sd.len())
            .map(|a| {
                let v = if axes.contains(&a) { &mut q } else { &mut k };
                *v += 1;
                IExpr::Var(*v - 1)
            })
            .collect();
        let value = self.value(src, &idx);
        let acc = acc_dtype(g.node(r).dtype);
        let value = if acc == g.node(src).dtype { value } else { self.push(InstOp::Cast(value), acc) };
        self.note(format!("{op:?}").to_lowercase());
        (*op, axes.iter().map(|&a| sd[a]).collect(), acc, value)
    }

    /// The value of node `n` at multi-index `idx`.
    fn value(&mut self, n: NodeIndex, idx: &[IExpr]) -> ValueId {
        let key = (n, idx.to_vec(), self.valid.clone());
        if let Some(&v) = self.memo.get(&key) {
            return v;
        }
        let v = self.compute(n, idx);
        self.memo.insert(key, v);
        v
    }

    fn compute(&mut self, n: NodeIndex, idx: &[IExpr]) -> ValueId {
        let g = self.graph;
        let node = g.node(n);
        let d = node.dtype;
        if Some(n) == self.stage && self.acc_enabled {
            let acc = self.push(InstOp::Acc, acc_dtype(d));
            return if acc_dtype(d) == d { acc } else { self.push(InstOp::Cast(acc), d) };
        }
        if let Some(j) = self.rows.iter().position(|&r| r == n) {
            let dims = node.shape.dims();
            let at_row = idx.iter().enumerate().all(|(a, e)| {
                *e == IExpr::Const(0) && (a >= self.row_rank || dims[a] == 1)
                    || a < self.row_rank && *e == IExpr::Var(a)
            });
            self.off_row |= !at_row;
            let acc = self.push(InstOp::RowAcc(j), acc_dtype(d));
            return if acc_dtype(d) == d { acc } else { self.push(InstOp::Cast(acc), d) };
        }
        if n != self.root && self.mat[n.index()] {
            let buf = self.buffer(n);
            let index = linear(idx, node.shape.dims(), &self.extents);
            let fill = Scalar::Int(0);
            return self.push(InstOp::Load { buf, index, valid: self.valid.clone(), fill }, d);
        }
        let srcs = g.srcs(n);
        let src_dims = |i: usize| g.node(srcs[i]).shape.to_vec();
        match &node.op {
            Op::Input { .. } => unreachable!("inputs are materialized"),
            Op::Reduce { .. } | Op::Matmul => unreachable!("a reduction is materialized or a reduce stage"),
            Op::Linalg(_) | Op::ScatterRows { .. } | Op::SortRows { .. } => {
                unreachable!("a routine's result is materialized")
            }
            Op::Const(s) => self.konst(*s, d),
            Op::Iota { start, step } => {
                self.note("iota".into());
                // A 32-bit int iota is computed in its own type: `start + i * step` wraps to the same low 32 bits
                // as in i64, and 32-bit lanes vectorize (an `iota == target` mask folded along a row).
                let narrow = matches!(d, DType::I32 | DType::U32);
                let wide = if d.is_float() {
                    DType::F64
                } else if narrow {
                    d
                } else {
                    DType::I64
                };
                let index = if narrow { d } else { DType::I64 };
                let i = self.push(InstOp::Index(idx[0].clone()), index);
                let i = if wide == index { i } else { self.push(InstOp::Cast(i), wide) };
                // An int iota's `* 1` and `+ 0` are left out (exact in wrapping arithmetic): `arange(C) == target`
                // is then a plain position, which the CPU's generated row kernels compute a vector at a time.
                let int = !d.is_float();
                let prod = if int && step.as_f64() == 1.0 {
                    i
                } else {
                    let step = self.konst(*step, wide);
                    self.push(InstOp::Binary(BinaryOp::Mul, i, step), wide)
                };
                let v = if int && start.as_f64() == 0.0 {
                    prod
                } else {
                    let start = self.konst(*start, wide);
                    self.push(InstOp::Binary(BinaryOp::Add, prod, start), wide)
                };
                if wide == d { v } else { self.push(InstOp::Cast(v), d) }
            }
            Op::Rand { dist, slot } => {
                self.note("rand".into());
                let index = linear(idx, node.shape.dims(), &self.extents);
                self.push(InstOp::Rand { dist: *dist, slot: *slot, index }, d)
            }
            Op::Unary(u) => {
                let a = self.value(srcs[0], idx);
                self.note(format!("{u:?}").to_lowercase());
                self.push(InstOp::Unary(*u, a), d)
            }
            Op::Binary(b) => {
                let x = self.value(srcs[0], idx);
                let y = self.value(srcs[1], idx);
                self.note(format!("{b:?}").to_lowercase());
                self.push(InstOp::Binary(*b, x, y), d)
            }
            Op::Where => {
                let c = self.value(srcs[0], idx);
                let a = self.value(srcs[1], idx);
                let b = self.value(srcs[2], idx);
                self.note("where".into());
                self.push(InstOp::Where(c, a, b), d)
            }
            Op::Cast => {
                let a = self.value(srcs[0], idx);
                self.note(format!("to{d}"));
                self.push(InstOp::Cast(a), d)
            }
            Op::Contiguous => self.value(srcs[0], idx),
            Op::Gather { axis } => {
                // The schedule stores every gather's source (rule 1), so it is a row-major buffer here.
                let index = self.value(srcs[1], idx);
                let sd = src_dims(0);
                let strides = contiguous_strides(&sd);
                let terms: Vec<IExpr> = idx
                    .iter()
                    .zip(&strides)
                    .enumerate()
                    .filter(|&(a, (_, &s))| a != *axis && s != 0)
                    .map(|(_, (e, &s))| e.clone().times(s as i64))
                    .collect();
                let base = IExpr::Add(terms).simplify(&self.extents);
                let buf = self.buffer(srcs[0]);
                self.note("gather".into());
                let (stride, len) = (strides[*axis] as i64, sd[*axis] as i64);
                self.push(InstOp::Gather { buf, base, index, stride, len, valid: self.valid.clone() }, d)
            }
            Op::Reshape => {
                let flat = linear(idx, node.shape.dims(), &self.extents);
                let src_idx = unflatten(&flat, &src_dims(0), &self.extents);
                self.value(srcs[0], &src_idx)
            }
            Op::Permute(p) => {
                let mut src_idx = vec![IExpr::Const(0); p.len()];
                for (i, &pi) in p.iter().enumerate() {
                    src_idx[pi] = idx[i].clone();
                }
                self.value(srcs[0], &src_idx)
            }
            Op::Expand => {
                let sd = src_dims(0);
                let src_idx: Vec<IExpr> = sd
                    .iter()
                    .zip(idx)
                    .zip(node.shape.dims())
                    .map(|((&s, e), &o)| if s == 1 && o != 1 { IExpr::Const(0) } else { e.clone() })
                    .collect();
                self.value(srcs[0], &src_idx)
            }
            Op::Slice(spec) => {
                let src_idx: Vec<IExpr> = spec
                    .iter()
                    .zip(idx)
                    .map(|(&(start, step), e)| {
                        IExpr::Add(vec![IExpr::Const(start as i64), e.clone().times(step as i64)])
                            .simplify(&self.extents)
                    })
                    .collect();
                self.value(srcs[0], &src_idx)
            }
            Op::Unfold { axis, step, dilation, .. } => {
                let (win, tap) = idx.split_at(idx.len() - 1);
                let mut src_idx = win.to_vec();
                src_idx[*axis] =
                    IExpr::Add(vec![win[*axis].clone().times(*step as i64), tap[0].clone().times(*dilation as i64)])
                        .simplify(&self.extents);
                self.value(srcs[0], &src_idx)
            }
            Op::Pad { pads, value } => {
                let sd = src_dims(0);
                let mut ranges = Vec::new();
                let mut src_idx = Vec::with_capacity(idx.len());
                for ((e, &(before, _)), &n) in idx.iter().zip(pads).zip(&sd) {
                    let (lo, hi) = e.bounds(&self.extents);
                    let (b, n) = (before as i64, n as i64);
                    let checked = lo < b || hi >= b + n;
                    if checked {
                        ranges.push((e.clone(), b, b + n));
                    }
                    // A source dim of one element is read at 0 wherever the pad lets it be read (a stacked slice:
                    // `e - b` would carry the position along the stack into every index after it, through the
                    // reshapes that merge dims, as divisions the kernel computes per element).
                    // Where the range is checked, the source index is read only inside it: wrapped, its bounds
                    // are the source dim's, so the reshapes above the pad split it like an index that never
                    // leaves the dim (a convolution's input gradient reads each window tap through the patches'
                    // reshape, which otherwise divided per element).
                    let shifted = IExpr::Add(vec![e.clone(), IExpr::Const(-b)]).simplify(&self.extents);
                    src_idx.push(if n == 1 {
                        IExpr::Const(0)
                    } else if checked {
                        IExpr::Wrap(Box::new(shifted), n)
                    } else {
                        shifted
                    });
                }
                if ranges.is_empty() {
                    return self.value(srcs[0], &src_idx);
                }
                let outer = self.valid.clone();
                let mut inner = outer.clone().map_or(Vec::new(), |Valid(v)| v);
                inner.extend(ranges.iter().cloned());
                let valid = Some(Valid(inner));
                self.valid = valid.clone();
                let v = self.value(srcs[0], &src_idx);
                self.valid = outer;
                // A load under these ranges (and maybe more: a pad of a pad) already gives zero outside them:
                // padding with +0 needs no select (and a GEMM operand that is a padded load stays a plain masked
                // load, `GemmView::of_patched`).
                let zero = value.is_zero_bits();
                let within = |vv: &Option<Valid>| match (vv, &valid) {
                    (Some(Valid(have)), Some(Valid(need))) => need.iter().all(|r| have.contains(r)),
                    _ => false,
                };
                let masked_load =
                    |id: ValueId| matches!(&self.insts[id].op, InstOp::Load { valid: vv, .. } if within(vv));
                // Likewise a cast of such a load (a bf16 model's gradient padded after its cast from f32: the qkv
                // gradient's three pads): a cast maps the load's zero to zero in every dtype.
                let cast_of_masked = matches!(self.insts[v].op, InstOp::Cast(src) if masked_load(src));
                if zero && (masked_load(v) || cast_of_masked) {
                    self.note("pad".into());
                    return v;
                }
                let mut cond: Option<ValueId> = None;
                for (e, lo, hi) in ranges {
                    // Compared in i32 where everything fits (32-bit lanes vectorize; an i64 varying along the
                    // vectorized loop kept a whole padded kernel scalar), else in i64.
                    let (elo, ehi) = e.bounds(&self.extents);
                    let fits = [elo, ehi, lo, hi].iter().all(|&x| i32::try_from(x).is_ok());
                    let t = if fits { DType::I32 } else { DType::I64 };
                    let i = self.push(InstOp::Index(e), t);
                    let lo = self.konst(Scalar::Int(lo), t);
                    let hi = self.konst(Scalar::Int(hi), t);
                    let a = self.push(InstOp::Binary(BinaryOp::Le, lo, i), DType::Bool);
                    let b = self.push(InstOp::Binary(BinaryOp::Lt, i, hi), DType::Bool);
                    let both = self.push(InstOp::Binary(BinaryOp::And, a, b), DType::Bool);
                    cond = Some(match cond {
                        None => both,
                        Some(c) => self.push(InstOp::Binary(BinaryOp::And, c, both), DType::Bool),
                    });
                }
                let fill = self.konst(*value, d);
                self.note("pad".into());
                self.push(InstOp::Where(cond.expect("a range"), v, fill), d)
            }
        }
    }
}

/// Lowers the kernel computing `root` (with `stage` as its reduction, if any, and `rows` as its row reductions, in
/// fold order: each a `Reduce` node over trailing axes of a source shaped as the kernel's row space). Returns the IR
/// and the materialized nodes it reads, in input order; `None` when a row reduction is read off the current row.
pub(crate) fn lower(
    graph: &Graph,
    root: NodeIndex,
    stage: Option<NodeIndex>,
    rows: &[NodeIndex],
    mat: &[bool],
) -> Option<(KernelIr, Vec<NodeIndex>)> {
    // A routine (`routine.rs`) reads its stored sources as they are.
    let srcs = graph.srcs(root);
    let nodes: Vec<&crate::graph::NodeData> = srcs.iter().map(|&s| graph.node(s)).collect();
    if let Some(routine) = crate::kernel::routine::Routine::of(graph.node(root), &nodes) {
        return Some((routine.kernel(), srcs.to_vec()));
    }
    let mut lw = Lowerer {
        graph,
        mat,
        root,
        stage,
        rows,
        row_rank: 0,
        off_row: false,
        extents: Vec::new(),
        reads: Vec::new(),
        insts: Vec::new(),
        memo: Default::default(),
        valid: None,
        names: Vec::new(),
        acc_enabled: false,
    };
    let root_dims = graph.node(root).shape.to_vec();
    let var = IExpr::Var;
    let (kind, out_extents, reduce) = match stage.map(|r| (r, &graph.node(r).op)) {
        None => ("E", root_dims.clone(), None),
        Some((r, Op::Reduce { op, axes })) => {
            let src = graph.srcs(r)[0];
            let sd = graph.node(src).shape.to_vec();
            let kept: Vec<usize> = (0..sd.len()).filter(|a| !axes.contains(a)).map(|a| sd[a]).collect();
            let red: Vec<usize> = axes.iter().map(|&a| sd[a]).collect();
            lw.extents = kept.iter().chain(&red).copied().collect();
            let reduce =
                Reduce { op: *op, extents: red, dtype: acc_dtype(graph.node(r).dtype), inner: Vec::new(), value: 0 };
            ("R", kept, Some(reduce))
        }
        Some((r, Op::Matmul)) => {
            let srcs = graph.srcs(r);
            let out = graph.node(r).shape.to_vec();
            let nb = out.len() - 2;
            let k = graph.node(srcs[0]).shape.dims()[nb + 1];
            lw.extents = out.iter().copied().chain([k]).collect();
            let reduce = Reduce {
                op: ReduceOp::Sum,
                extents: vec![k],
                dtype: acc_dtype(graph.node(r).dtype),
                inner: Vec::new(),
                value: 0,
            };
            ("G", out, Some(reduce))
        }
        Some((_, op)) => unreachable!("stage {op} is not a reduction"),
    };
    let out_rank = out_extents.len();
    // Row reductions, each into its own instruction list.
    let mut row_reduces = Vec::with_capacity(rows.len());
    lw.row_rank = out_rank;
    if let Some(&first) = rows.first() {
        // Every row reduction folds the same trailing axes of the same row space.
        let Op::Reduce { axes, .. } = &graph.node(first).op else { unreachable!("row reductions are reductions") };
        let sd = graph.node(graph.srcs(first)[0]).shape.to_vec();
        lw.row_rank = sd.len() - axes.len();
        if reduce.is_none() {
            lw.extents = out_extents.iter().chain(axes.iter().map(|&a| &sd[a])).copied().collect();
        }
    }
    for &r in rows {
        lw.memo.clear();
        let (op, extents, dtype, value) = lw.reduce_source(r, out_rank);
        let inner = std::mem::take(&mut lw.insts);
        row_reduces.push(Reduce { op, extents, dtype, inner, value });
    }
    lw.memo.clear();
    let reduce = reduce.map(|mut red| {
        let r = stage.expect("a reduce stage");
        let srcs = graph.srcs(r);
        let value = match &graph.node(r).op {
            Op::Reduce { .. } => lw.reduce_source(r, out_rank).3,
            _ => {
                let nb = out_rank - 2;
                let batch: Vec<IExpr> = (0..nb).map(var).collect();
                let ia: Vec<IExpr> = batch.iter().cloned().chain([var(nb), var(nb + 2)]).collect();
                let ib: Vec<IExpr> = batch.iter().cloned().chain([var(nb + 2), var(nb + 1)]).collect();
                let x = lw.value(srcs[0], &ia);
                let y = lw.value(srcs[1], &ib);
                let d = red.dtype;
                let (x, y) = if d == graph.node(r).dtype {
                    (x, y)
                } else {
                    (lw.push(InstOp::Cast(x), d), lw.push(InstOp::Cast(y), d))
                };
                let value = lw.push(InstOp::Binary(BinaryOp::Mul, x, y), d);
                lw.note("matmul".into());
                value
            }
        };
        red.inner = std::mem::take(&mut lw.insts);
        red.value = value;
        red
    });
    if reduce.is_none() && rows.is_empty() {
        lw.extents = out_extents.clone();
    }
    lw.memo.clear();
    lw.acc_enabled = true;
    let out_vars: Vec<IExpr> = (0..out_extents.len()).map(var).collect();
    let root_idx = if stage.is_some() && root_dims != out_extents {
        let flat = linear(&out_vars, &out_extents, &lw.extents);
        unflatten(&flat, &root_dims, &lw.extents)
    } else {
        out_vars
    };
    let result = lw.value(root, &root_idx);
    if lw.off_row {
        return None;
    }
    let shape = |d: &[usize]| {
        if d.is_empty() { "1".to_string() } else { d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x") }
    };
    let kind = if rows.is_empty() { kind } else { "W" };
    let mut name = format!("{kind}_{}_{}", lw.names.join("_"), shape(&out_extents));
    if let Some(r) = reduce.as_ref().or(row_reduces.first()) {
        name = format!("{name}_{}", shape(&r.extents));
    }
    let alu = |insts: &[Inst]| {
        insts.iter().filter(|i| matches!(i.op, InstOp::Unary(..) | InstOp::Binary(..) | InstOp::Where(..))).count()
    };
    let folds = |r: &Reduce| (alu(&r.inner) + 1) * r.extents.iter().product::<usize>();
    let row_elems: usize = out_extents[lw.row_rank..].iter().product();
    let flops_per_elem = alu(&lw.insts)
        + reduce.as_ref().map_or(0, folds)
        + row_reduces.iter().map(folds).sum::<usize>().div_ceil(row_elems.max(1));
    let inputs =
        lw.reads.iter().map(|&n| BufParam { dtype: graph.node(n).dtype, len: graph.node(n).shape.numel() }).collect();
    let root_node = graph.node(root);
    let ir = KernelIr {
        name,
        inputs,
        output: BufParam { dtype: root_node.dtype, len: root_node.shape.numel() },
        out_extents,
        reduce,
        rows: row_reduces,
        row_rank: lw.row_rank,
        outer: lw.insts,
        result,
        flops_per_elem,
        routine: None,
    };
    Some((ir.without_unit_loops(), lw.reads))
}
