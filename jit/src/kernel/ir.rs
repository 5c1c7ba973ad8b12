//! The kernel IR: one fused kernel as a loop nest over its output, an optional reduction loop nest inside it, and
//! straight-line SSA code for each element. It knows no device: CLIF, WGSL, CUDA C and HIP C are all rendered from
//! it, and `eval` runs it on the host as a check of the lowering.
//!
//! Shape of every kernel:
//! ```text
//! for o in output space (loop vars 0..out_rank):          // split across threads/workgroups on dim 0
//!     [for r in reduce space (loop vars out_rank..):      // only when `reduce` is set
//!         acc = combine(acc, <inner code>)]
//!     out[row-major(o)] = <outer code>                    // may read `Acc`
//! ```
//! Inner code may use all loop variables; outer code only the output ones. Each instruction has a dtype; ints
//! and bools travel as the renderer's integer types, floats as floats.
//!
//! A *row kernel* (Inductor's persistent reduction) adds row reductions (`KernelIr::rows`) before all of that:
//! ```text
//! for o in output space:
//!     once per row (a value of loops 0..row_rank):        // before the row's first element
//!         for each row reduction j, in order:
//!             row_j = fold over r in reduce space: <row code j>   // may read row_0 .. row_{j-1}
//!     [acc = ...]                                           // as above; inner code may read every row_j
//!     out[row-major(o)] = <outer code>                      // may read every row_j
//! ```
//! Softmax over rows is one such kernel: the row's max, the sum of `exp(x - max)`, then `exp(x - max) / sum` for
//! each element, so the row comes from memory once and later passes find it in cache.

use crate::dtype::{DType, Scalar};
use crate::kernel::index::IExpr;
use crate::op::{BinaryOp, RandDist, ReduceOp, UnaryOp};
use std::fmt::{self, Write};

/// Index of an instruction in its list (`inner` or `outer`).
pub type ValueId = usize;

/// A buffer the kernel reads or writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufParam {
    pub dtype: DType,
    /// Element count.
    pub len: usize,
}

/// `lo <= index < hi` for every listed range: a load outside them yields the fill value without touching memory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Valid(pub Vec<(IExpr, i64, i64)>);

#[derive(Clone, Debug, PartialEq)]
pub enum InstOp {
    Const(Scalar),
    /// The value of an index expression (used by iota).
    Index(IExpr),
    /// `buf[index]`, or `fill` where `valid` fails. `buf` indexes `KernelIr::inputs`.
    Load {
        buf: usize,
        index: IExpr,
        valid: Option<Valid>,
        fill: Scalar,
    },
    /// A data-dependent load: `buf[base + i * stride]` where `i` is value `index` (an i32 or i64), checked against
    /// `0 <= i < len`. Outside that range the kernel records a `Fault::Index` (see `fault.rs`) and reads
    /// `buf[base]` instead; where `valid` fails it reads nothing, checks nothing and yields 0.
    Gather {
        buf: usize,
        base: IExpr,
        index: ValueId,
        stride: i64,
        len: i64,
        valid: Option<Valid>,
    },
    /// Philox random value for element `index` of a `Rand` node keyed by the plan's `rng[slot]`.
    Rand {
        dist: RandDist,
        slot: usize,
        index: IExpr,
    },
    Unary(UnaryOp, ValueId),
    /// Comparisons yield bool; other ops the operands' dtype.
    Binary(BinaryOp, ValueId, ValueId),
    Where(ValueId, ValueId, ValueId),
    /// Converts the operand to this instruction's dtype.
    Cast(ValueId),
    /// The finished reduction (outer code only).
    Acc,
    /// The finished row reduction `j` of the current row (`KernelIr::rows`; read by later row reductions, the
    /// reduce stage and the outer code).
    RowAcc(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub op: InstOp,
    pub dtype: DType,
}

impl Inst {
    /// Every index expression this instruction reads (a load's validity ranges included), in a fixed order.
    pub fn indices(&self) -> Vec<&IExpr> {
        match &self.op {
            InstOp::Index(e) | InstOp::Rand { index: e, .. } => vec![e],
            InstOp::Load { index, valid, .. } | InstOp::Gather { base: index, valid, .. } => {
                let mut v = vec![index];
                v.extend(valid.iter().flat_map(|v| v.0.iter().map(|(e, _, _)| e)));
                v
            }
            InstOp::Const(_)
            | InstOp::Unary(..)
            | InstOp::Binary(..)
            | InstOp::Where(..)
            | InstOp::Cast(_)
            | InstOp::Acc
            | InstOp::RowAcc(_) => Vec::new(),
        }
    }

    /// Replaces every value this instruction reads (those [`Inst::operands`] lists) by `f` of it: renumbering
    /// after instructions are inserted or dropped.
    pub fn map_operands(&mut self, f: impl Fn(ValueId) -> ValueId) {
        match &mut self.op {
            InstOp::Unary(_, a) | InstOp::Cast(a) | InstOp::Gather { index: a, .. } => *a = f(*a),
            InstOp::Binary(_, a, b) => {
                *a = f(*a);
                *b = f(*b);
            }
            InstOp::Where(c, a, b) => {
                *c = f(*c);
                *a = f(*a);
                *b = f(*b);
            }
            InstOp::Const(_)
            | InstOp::Index(_)
            | InstOp::Load { .. }
            | InstOp::Rand { .. }
            | InstOp::Acc
            | InstOp::RowAcc(_) => {}
        }
    }

    /// Every value this instruction reads (a gather's index included), in a fixed order.
    pub fn operands(&self) -> Vec<ValueId> {
        match self.op {
            InstOp::Unary(_, a) | InstOp::Cast(a) | InstOp::Gather { index: a, .. } => vec![a],
            InstOp::Binary(_, a, b) => vec![a, b],
            InstOp::Where(c, a, b) => vec![c, a, b],
            InstOp::Const(_)
            | InstOp::Index(_)
            | InstOp::Load { .. }
            | InstOp::Rand { .. }
            | InstOp::Acc
            | InstOp::RowAcc(_) => Vec::new(),
        }
    }

    /// Rewrites every index expression this instruction reads (a load's validity ranges included).
    pub fn map_indices(&mut self, f: &impl Fn(&IExpr) -> IExpr) {
        match &mut self.op {
            InstOp::Index(e) | InstOp::Rand { index: e, .. } => *e = f(e),
            InstOp::Load { index, valid, .. } | InstOp::Gather { base: index, valid, .. } => {
                *index = f(index);
                if let Some(Valid(ranges)) = valid {
                    for (e, _, _) in ranges.iter_mut() {
                        *e = f(e);
                    }
                }
            }
            _ => {}
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Reduce {
    pub op: ReduceOp,
    /// Extents of the reduce loop variables (numbered after the output variables).
    pub extents: Vec<usize>,
    /// The accumulator's dtype (the reduce node's dtype).
    pub dtype: DType,
    /// Inner code, evaluated once per reduce iteration.
    pub inner: Vec<Inst>,
    /// The value folded into the accumulator.
    pub value: ValueId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct KernelIr {
    /// `E_`/`R_`/`G_` + op chain + shape, e.g. `E_mul_add_relu_1024`.
    pub name: String,
    pub inputs: Vec<BufParam>,
    pub output: BufParam,
    /// Extents of the output loop variables (row-major; the output buffer is written contiguously).
    pub out_extents: Vec<usize>,
    pub reduce: Option<Reduce>,
    /// Row reductions (see the module doc), empty for every kernel but a row kernel. They loop over the same
    /// reduce variables as `reduce` (numbered after the output variables; with `reduce` set, over the same
    /// extents), and their code reads only the row's output variables (`0..row_rank`), reduce variables, and the
    /// row reductions before them.
    pub rows: Vec<Reduce>,
    /// The output loops that index a row: `rows` is folded once per value of loops `0..row_rank`. The output
    /// rank where `rows` is empty.
    pub row_rank: usize,
    /// Outer code, evaluated once per output element.
    pub outer: Vec<Inst>,
    /// The value stored.
    pub result: ValueId,
    /// Floating-point operations per output element, for profiles and thread-split decisions.
    pub flops_per_elem: usize,
    /// Set on a routine's descriptor (`routine.rs`): a kernel each device writes itself, with no code here
    /// (`outer` is empty). Every pass and renderer that reads code leaves such a kernel alone.
    pub routine: Option<crate::kernel::routine::Routine>,
}

impl KernelIr {
    /// All loop extents: output variables, then reduce variables.
    pub fn extents(&self) -> Vec<usize> {
        let mut e = self.out_extents.clone();
        if let Some(r) = self.reduce.as_ref().or(self.rows.first()) {
            e.extend(&r.extents);
        }
        e
    }

    /// Every instruction: the outer code's, then the reduction's and the row reductions' inner code.
    fn code(&self) -> impl Iterator<Item = &Inst> {
        self.outer.iter().chain(self.reduce.iter().chain(&self.rows).flat_map(|r| r.inner.iter()))
    }

    /// Whether the kernel can record a fault (it gathers): its backend must give it a fault record.
    pub fn can_fault(&self) -> bool {
        if let Some(r) = &self.routine {
            return r.can_fault();
        }
        self.code().any(|i| matches!(i.op, InstOp::Gather { .. }))
    }

    pub fn out_rank(&self) -> usize {
        self.out_extents.len()
    }

    /// Whether the kernel computes the same values on every run: it reads no buffer and draws no random numbers (a
    /// causal mask, an iota). The schedule keeps such a kernel's temp slot to itself (`KernelPlan::constant`), so
    /// a backend whose arena outlives a run may run it once.
    pub fn is_constant(&self) -> bool {
        self.inputs.is_empty() && self.routine.is_none() && !self.code().any(|i| matches!(i.op, InstOp::Rand { .. }))
    }

    /// What a GPU launch spreads over its threads (or workgroups): the output elements, or the rows of a row kernel.
    pub fn units(&self) -> usize {
        let rank = if self.rows.is_empty() { self.out_rank() } else { self.row_rank };
        self.out_extents[..rank].iter().product()
    }

    /// Total work in element-operations (for choosing single- vs multi-threaded execution).
    pub fn work(&self) -> usize {
        if let Some(r) = &self.routine {
            return r.work();
        }
        let out: usize = self.out_extents.iter().product();
        let inner = self.reduce.as_ref().map_or(1, |r| r.extents.iter().product::<usize>().max(1) * (r.inner.len()));
        let row_elems: usize = self.out_extents[self.row_rank..].iter().product();
        let rows: usize = self.rows.iter().map(|r| r.extents.iter().product::<usize>().max(1) * r.inner.len()).sum();
        out * (inner + self.outer.len()) + (out / row_elems.max(1)) * rows
    }

    /// The same kernel without loops of extent 1 (their variable is always 0). The output's row-major order is
    /// unchanged, and loop 0, the one split over threads, becomes the first loop with real work: a `[1, 256]` GEMM
    /// output (a batch-1 linear layer) runs 256 rows in parallel instead of one.
    pub fn without_unit_loops(mut self) -> KernelIr {
        let extents = self.extents();
        if !extents.contains(&1) {
            return self;
        }
        let mut renumber = Vec::with_capacity(extents.len());
        let mut next = 0;
        for &e in &extents {
            renumber.push((e != 1).then(|| {
                next += 1;
                next - 1
            }));
        }
        let kept: Vec<usize> = extents.iter().copied().filter(|&e| e != 1).collect();
        let map = |v: usize| renumber[v].map_or(IExpr::Const(0), IExpr::Var);
        let fix = |e: &IExpr| e.map_vars(&map).simplify(&kept);
        let fix_insts = |insts: &mut Vec<Inst>| {
            for inst in insts.iter_mut() {
                inst.map_indices(&fix);
            }
        };
        fix_insts(&mut self.outer);
        for r in self.reduce.iter_mut().chain(self.rows.iter_mut()) {
            fix_insts(&mut r.inner);
            r.extents.retain(|&e| e != 1);
        }
        self.row_rank = self.out_extents[..self.row_rank].iter().filter(|&&e| e != 1).count();
        self.out_extents.retain(|&e| e != 1);
        self.without_single_reductions()
    }

    /// The same elementwise kernel with adjacent output loops merged wherever every index moves as one row-major
    /// counter across them (`coef[d] == coef[d + 1] * extent[d + 1]` for every index): a `[B, S, D]` kernel whose
    /// operands are contiguous or broadcast over the leading dims becomes `[B * S, D]`. The output is row-major
    /// either way, so the elements and their order are unchanged. Kernels with a reduction, a masked load or an
    /// index that is not affine are returned as they are.
    pub fn with_merged_loops(&self) -> KernelIr {
        let rank = self.out_rank();
        if self.reduce.is_some() || !self.rows.is_empty() || rank < 2 {
            return self.clone();
        }
        let Some(affine) = affine_indices(&self.outer, rank) else { return self.clone() };
        let Some((extents, group)) = row_major_groups(&self.out_extents, &affine) else { return self.clone() };
        let remap = |e: &IExpr| regroup(e, &group, extents.len());
        let mut k = self.clone();
        for inst in &mut k.outer {
            inst.map_indices(&remap);
        }
        k.row_rank = extents.len();
        k.out_extents = extents;
        k
    }

    /// A row kernel with its row loops merged into one where every index walks them as one row-major counter (a
    /// layer norm over `[batch, seq, dim]` becomes `batch * seq` rows of `dim`); other kernels, and those whose
    /// indices do not allow it, as they are. Rows and their elements keep their order.
    pub fn with_merged_row_loops(&self) -> KernelIr {
        let rr = self.row_rank;
        if self.rows.is_empty() || rr < 2 {
            return self.clone();
        }
        let ext = self.extents();
        let nvars = ext.len();
        let code: Vec<Inst> = self
            .outer
            .iter()
            .chain(self.rows.iter().chain(&self.reduce).flat_map(|r| r.inner.iter()))
            .cloned()
            .collect();
        let Some(affine) = affine_indices(&code, nvars) else { return self.clone() };
        if !(1..rr).all(|d| affine.iter().all(|(coef, _)| coef[d - 1] == coef[d] * ext[d] as i64)) {
            return self.clone();
        }
        let group: Vec<usize> = (0..nvars).map(|v| if v < rr { 0 } else { v + 1 - rr }).collect();
        let remap = |e: &IExpr| regroup(e, &group, nvars + 1 - rr);
        let mut k = self.clone();
        for inst in
            k.outer.iter_mut().chain(k.rows.iter_mut().chain(k.reduce.iter_mut()).flat_map(|r| r.inner.iter_mut()))
        {
            inst.map_indices(&remap);
        }
        let rows: usize = self.out_extents[..rr].iter().product();
        k.out_extents = [rows].into_iter().chain(self.out_extents[rr..].iter().copied()).collect();
        k.row_rank = 1;
        k
    }

    /// A reduction over one element (a sum over a size-1 dim; a matmul with K = 1 is recorded as a broadcast
    /// product already, see `Tensor::matmul`) becomes plain outer code. As a reduce kernel it would be rendered as
    /// a register-tiled GEMM with no K loop, which costs several times an elementwise pass over the same output; as
    /// elementwise code it streams rows with vector loads. The value is the interpreter's `identity ⊕ v`:
    /// exactly `v` for prod, max and min, and `v + 0` for a float sum (which turns -0.0 into +0.0, as the fold
    /// does), so results are bit-identical to the reduce form.
    fn without_single_reductions(mut self) -> KernelIr {
        // Row reductions share the reduce loops (so never over one element: the schedule makes row kernels of
        // longer rows only).
        let Some(r) = self.reduce.take_if(|r| r.extents.is_empty() && self.rows.is_empty()) else { return self };
        let mut outer = r.inner;
        let mut acc = r.value;
        if outer[acc].dtype != r.dtype {
            outer.push(Inst { op: InstOp::Cast(acc), dtype: r.dtype });
            acc = outer.len() - 1;
        }
        if r.op == ReduceOp::Sum && r.dtype.is_float() {
            outer.push(Inst { op: InstOp::Const(Scalar::Float(0.0)), dtype: r.dtype });
            outer.push(Inst { op: InstOp::Binary(BinaryOp::Add, acc, outer.len() - 1), dtype: r.dtype });
            acc = outer.len() - 1;
        }
        // Outer values follow the inner ones in order, without the `Acc`, whose readers now read the folded value.
        let mut ids: Vec<ValueId> = Vec::with_capacity(self.outer.len());
        let mut next = outer.len();
        for inst in &self.outer {
            if inst.op == InstOp::Acc {
                ids.push(acc);
            } else {
                ids.push(next);
                next += 1;
            }
        }
        for mut inst in std::mem::take(&mut self.outer) {
            if inst.op == InstOp::Acc {
                continue;
            }
            inst.map_operands(|a| ids[a]);
            outer.push(inst);
        }
        self.result = ids[self.result];
        self.outer = outer;
        self
    }

    /// A readable listing, for dumps and golden tests.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "kernel {}", self.name);
        for (i, b) in self.inputs.iter().enumerate() {
            let _ = writeln!(s, "  in{i}: {}[{}]", b.dtype, b.len);
        }
        let _ = writeln!(s, "  out: {}[{}]", self.output.dtype, self.output.len);
        let vars: Vec<String> = self.out_extents.iter().enumerate().map(|(v, e)| format!("i{v}<{e}")).collect();
        let _ = writeln!(s, "  for {} {{", if vars.is_empty() { "()".to_string() } else { vars.join(", ") });
        let n = self.out_extents.len();
        let reduce_vars = |r: &Reduce| -> String {
            let rv: Vec<String> = r.extents.iter().enumerate().map(|(v, e)| format!("i{}<{e}", v + n)).collect();
            rv.join(", ")
        };
        for (j, r) in self.rows.iter().enumerate() {
            let per: Vec<String> = (0..self.row_rank).map(|v| format!("i{v}")).collect();
            let per = if per.is_empty() { "()".to_string() } else { per.join(", ") };
            let _ = writeln!(s, "    row{j}: {} = {:?} over {} once per {per} {{", r.dtype, r.op, reduce_vars(r));
            write_insts(&mut s, "      p", &r.inner);
            let _ = writeln!(s, "      fold p{}", r.value);
            let _ = writeln!(s, "    }}");
        }
        if let Some(r) = &self.reduce {
            let _ = writeln!(s, "    acc: {} = {:?} over {} {{", r.dtype, r.op, reduce_vars(r));
            write_insts(&mut s, "      r", &r.inner);
            let _ = writeln!(s, "      fold r{}", r.value);
            let _ = writeln!(s, "    }}");
        }
        write_insts(&mut s, "    v", &self.outer);
        let _ = writeln!(s, "    out[row-major] = v{}", self.result);
        let _ = writeln!(s, "  }}");
        s
    }
}

/// The affine form (`(coef, constant)` over `nvars` loop variables) of every index `insts` read; `None` when one is
/// masked or not affine.
pub(crate) fn affine_indices(insts: &[Inst], nvars: usize) -> Option<Vec<(Vec<i64>, i64)>> {
    let mut out = Vec::new();
    for inst in insts {
        let e = match &inst.op {
            InstOp::Index(e)
            | InstOp::Rand { index: e, .. }
            | InstOp::Load { index: e, valid: None, .. }
            | InstOp::Gather { base: e, valid: None, .. } => e,
            InstOp::Load { .. } | InstOp::Gather { .. } => return None,
            _ => continue,
        };
        out.push(e.affine(nvars)?);
    }
    Some(out)
}

/// Adjacent loops of `ext` that every affine index (`(coef, constant)` over those loops) walks as one row-major
/// counter (`coef[d] == coef[d + 1] * ext[d + 1]`), merged: the merged extents and, for each loop, the merged loop it
/// joins. `None` when no two loops merge.
pub(crate) fn row_major_groups(ext: &[usize], affine: &[(Vec<i64>, i64)]) -> Option<(Vec<usize>, Vec<usize>)> {
    let rank = ext.len();
    let mut group = vec![0usize; rank];
    for d in 1..rank {
        let joins = affine.iter().all(|(coef, _)| coef[d - 1] == coef[d] * ext[d] as i64);
        group[d] = group[d - 1] + usize::from(!joins);
    }
    let merged = group.last().map_or(0, |g| g + 1);
    if merged == rank {
        return None;
    }
    let mut extents = vec![1usize; merged];
    for d in 0..rank {
        extents[group[d]] *= ext[d];
    }
    Some((extents, group))
}

/// An affine index over the loops that `group` (from [`row_major_groups`]) merges, over the merged loops: a merged
/// loop's coefficient is that of its innermost loop.
pub(crate) fn regroup(e: &IExpr, group: &[usize], merged: usize) -> IExpr {
    let rank = group.len();
    let (coef, c) = e.affine(rank).expect("grouped from affine indices");
    let mut out = vec![0i64; merged];
    for d in 0..rank {
        if d + 1 == rank || group[d + 1] != group[d] {
            out[group[d]] = coef[d];
        }
    }
    IExpr::from_affine(&out, c)
}

fn write_insts(s: &mut String, prefix: &str, insts: &[Inst]) {
    let p = prefix.trim_start();
    for (i, inst) in insts.iter().enumerate() {
        let _ = write!(s, "{prefix}{i}: {} = ", inst.dtype);
        let _ = match &inst.op {
            InstOp::Const(c) => writeln!(s, "const {c}"),
            InstOp::Index(e) => writeln!(s, "index {e}"),
            InstOp::Load { buf, index, valid, fill } => match valid {
                None => writeln!(s, "load in{buf}[{index}]"),
                Some(Valid(rs)) => {
                    let conds: Vec<String> = rs.iter().map(|(e, lo, hi)| format!("{lo}<={e}<{hi}")).collect();
                    writeln!(s, "load in{buf}[{index}] if {} else {fill}", conds.join(" && "))
                }
            },
            InstOp::Gather { buf, base, index, stride, len, valid } => {
                let at = format!("gather in{buf}[{base} + {p}{index} * {stride}] checked < {len}");
                match valid {
                    None => writeln!(s, "{at}"),
                    Some(Valid(rs)) => {
                        let conds: Vec<String> = rs.iter().map(|(e, lo, hi)| format!("{lo}<={e}<{hi}")).collect();
                        writeln!(s, "{at} if {} else 0", conds.join(" && "))
                    }
                }
            }
            InstOp::Rand { dist, slot, index } => writeln!(s, "rand_{dist:?} key{slot} [{index}]"),
            InstOp::Unary(u, a) => writeln!(s, "{u:?} {p}{a}"),
            InstOp::Binary(b, x, y) => writeln!(s, "{b:?} {p}{x}, {p}{y}"),
            InstOp::Where(c, a, b) => writeln!(s, "where {p}{c}, {p}{a}, {p}{b}"),
            InstOp::Cast(a) => writeln!(s, "cast {p}{a}"),
            InstOp::Acc => writeln!(s, "acc"),
            InstOp::RowAcc(j) => writeln!(s, "row{j}"),
        };
    }
}

impl fmt::Display for KernelIr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
