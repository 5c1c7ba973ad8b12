//! Cooperative reductions: a workgroup (a CUDA block) folds one reduction together, where the generic form gives
//! each invocation a whole reduce loop of its own. Written once here for every C-like dialect (WGSL, CUDA C,
//! HIP C); each dialect only launches it (one workgroup per [`Coop::lanes`] outputs or per row) and calls
//! `coop(g, lid)` with the workgroup's linear id and the invocation's index in it.
//!
//! Why: one invocation per output leaves a GPU idle when outputs are few (a loss, a norm, the rows of a small batch:
//! 64 rows are one workgroup on one SM of 132), and for a reduction over the contiguous dim (softmax, layer norm,
//! a row sum) neighbouring invocations read addresses a row apart, so no load is coalesced. Here `slices`
//! invocations stride over one output's reduce range (neighbours read neighbouring elements), each folds its share
//! in registers, and a tree over workgroup memory folds the partial results (`slices / 2`, `/ 4`, .. 1 apart, a
//! barrier after each level). A reduction over a strided dim (a column sum) puts 32 neighbouring outputs across the
//! lanes instead (`lanes = 32`), so each load of a slice is coalesced across lanes.
//!
//! The fold order is fixed by the launch shape (the slices' strided partial folds, then the tree), so results are
//! the same bits run to run; they differ from the interpreter's sequential order by rounding only (float sums),
//! within the dtype tolerances every GPU kernel is held to. Max, min and integer sums are exact in any order.
//!
//! A row kernel (softmax, log_softmax, layer norm) folds each of its row reductions this way in turn (a later one
//! reads the earlier ones' results, broadcast to the workgroup through workgroup memory), then the workgroup writes
//! the row's elements, each invocation every `slices`-th one.
//!
//! Not done: warp shuffles for the last levels (`__shfl_down_sync`; HIP's wave is 64 wide on CDNA, 32 on RDNA):
//! the tree stays in workgroup memory on every target, one form to test (the CUDA host shim runs it with real
//! threads at a barrier); a two-stage form for a single huge reduction (the schedule's split full reduction
//! already makes the partial sums a kernel of many outputs).

use super::{Dialect, Emitter, konst};
use crate::kernel::{InstOp, KernelIr, Reduce};
use std::fmt::Write;

/// How a cooperative kernel spreads over its workgroup: `lanes` outputs per workgroup, `slices` invocations per
/// output (both powers of two). Invocation `lid` serves output `lid % lanes` of its group and slice `lid / lanes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Coop {
    pub lanes: u32,
    pub slices: u32,
}

impl Coop {
    /// Invocations per workgroup.
    pub fn width(self) -> u32 {
        self.lanes * self.slices
    }

    /// The shape for `k`, or `None` where one invocation per output (or row) is the better form: no reduction, a
    /// routine, or a short reduce loop over many outputs. A reduce range of at least 256, or of at least 32 over at
    /// most 16384 outputs, goes cooperative: up to 256 slices, at least 2 elements each. Over a strided dim (the
    /// reduce's first load does not step by 1 along the innermost reduce variable) 32 lanes of 8 slices (as many
    /// lanes as outputs where they are fewer, 256 invocations in all). Chosen by
    /// the reasoning above, not yet by timing on a GPU; the wgpu device on a CPU driver (lavapipe) was measured
    /// (docs/benchmarks.md).
    pub fn choose(k: &KernelIr) -> Option<Coop> {
        if k.routine.is_some() {
            return None;
        }
        let r = k.rows.first().or(k.reduce.as_ref())?;
        let outputs = k.units();
        let len: usize = r.extents.iter().product();
        if outputs == 0 || !(len >= 256 || (len >= 32 && outputs <= 16384)) {
            return None;
        }
        if k.rows.is_empty() && !steps_by_one(k, r) {
            // Fewer lanes where there are fewer outputs (a [300, 5] column sum: 8 lanes of 32 slices).
            let lanes = outputs.next_power_of_two().min(32);
            return Some(Coop { lanes: lanes as u32, slices: (256 / lanes) as u32 });
        }
        let slices = (len / 2).next_power_of_two().clamp(32, 256);
        let slices = if slices > len / 2 { slices / 2 } else { slices }.max(16);
        Some(Coop { lanes: 1, slices: slices as u32 })
    }

    /// Workgroups to launch for `k`: one per `lanes` outputs, or per row.
    pub fn groups(self, k: &KernelIr) -> usize {
        k.units().div_ceil(self.lanes as usize)
    }
}

/// The most trips of any one loop in one invocation of `k`, rendered generically (`None`: each invocation folds
/// whole reduce loops, and a row kernel's invocation loops over its row's elements) or cooperatively: a driver
/// that caps shader loops (llvmpipe: 65535 trips) refuses kernels past its cap by this count.
pub fn loop_trips(k: &KernelIr, coop: Option<Coop>) -> usize {
    let slices = coop.map_or(1, |c| c.slices as usize);
    let folds = k.rows.iter().chain(if k.rows.is_empty() { k.reduce.as_ref() } else { None });
    let folds = folds.map(|r| r.extents.iter().product::<usize>().div_ceil(slices));
    let row_elems = if k.rows.is_empty() { 0 } else { k.out_extents[k.row_rank..].iter().product::<usize>() };
    // A row kernel's elements fold their own reduction (if any) whole, in either form.
    let element_fold = if k.rows.is_empty() { None } else { k.reduce.as_ref().map(|r| r.extents.iter().product()) };
    folds.chain([row_elems.div_ceil(slices)]).chain(element_fold).max().unwrap_or(0)
}

/// Whether the reduce loop's first load steps by one element along the innermost reduce variable (or is not
/// affine, or there is none: taken as contiguous).
fn steps_by_one(k: &KernelIr, r: &Reduce) -> bool {
    let nvars = k.out_rank() + r.extents.len();
    let first = r.inner.iter().find_map(|i| match &i.op {
        InstOp::Load { index, .. } => Some(index),
        _ => None,
    });
    match first.and_then(|e| e.affine(nvars)) {
        Some((coef, _)) => coef[nvars - 1].abs() == 1,
        None => true,
    }
}

impl<'a, D: Dialect> Emitter<'a, D> {
    /// The workgroup arrays, `element` and `row` where needed, and `coop(g, lid)`: the whole body of a cooperative
    /// kernel (see the module doc). `g` is the workgroup's linear id (the launch skips ids past
    /// [`Coop::groups`]), `lid` the invocation's index in it; every invocation of a workgroup must call it (it
    /// meets the others at barriers).
    pub fn coop_fns(&mut self, c: Coop) -> String {
        let (d, k) = (self.d, self.k);
        let idx = d.index_dtype();
        let mut s = String::new();
        let folds: Vec<&Reduce> = if k.rows.is_empty() { k.reduce.iter().collect() } else { k.rows.iter().collect() };
        for (j, r) in folds.iter().enumerate() {
            let _ = writeln!(
                s,
                "{}",
                d.workgroup_array(&format!("kiln_red{j}"), d.compute_dtype(r.dtype), c.width() as usize)
            );
        }
        s.push_str(&self.element_fn_with(k.rows.is_empty()));
        let _ = writeln!(s, "\n{}", d.fn_open("coop", &[("g", idx), ("lid", idx)]));
        let (lanes, slices) = (c.lanes as usize, c.slices as usize);
        if lanes == 1 {
            let _ = writeln!(s, "    {}\n    {}", d.let_index("lane", "0"), d.let_index("slice", "lid"));
        } else {
            let _ = writeln!(s, "    {}", d.let_index("lane", &format!("lid % {lanes}")));
            let _ = writeln!(s, "    {}", d.let_index("slice", &format!("lid / {lanes}")));
        }
        if k.rows.is_empty() {
            // One output per lane: the last group's lanes past the outputs fold nothing and store nothing.
            let Some(r) = &k.reduce else { unreachable!("Coop::choose: a reduction") };
            let outputs: usize = k.out_extents.iter().product();
            let flat = if lanes == 1 { "g".to_string() } else { format!("g * {lanes} + lane") };
            let _ = writeln!(s, "    {}", d.let_index("flat", &flat));
            let _ = writeln!(
                s,
                "    {}",
                d.var_value("acc", d.compute_dtype(r.dtype), &konst(d, r.op.identity(r.dtype), r.dtype))
            );
            let _ = writeln!(s, "    if (flat < {outputs}) {{");
            let mut inner = String::new();
            self.decompose(&mut inner, "flat", &k.out_extents);
            self.strided_fold(&mut inner, r, "acc", "v", "slice", slices);
            for line in inner.lines() {
                let _ = writeln!(s, "    {line}");
            }
            let _ = writeln!(s, "    }}");
            self.tree(&mut s, r, 0, "acc", c);
            let _ = writeln!(s, "    if ((flat < {outputs}) && (slice == 0)) {{");
            let _ = writeln!(s, "        element(flat, kiln_red0[lane]);");
            let _ = writeln!(s, "    }}");
        } else {
            // One row per workgroup (lanes = 1).
            self.decompose(&mut s, "g", &k.out_extents[..k.row_rank]);
            for (j, r) in k.rows.iter().enumerate() {
                let acc = format!("a{j}");
                let identity = konst(d, r.op.identity(r.dtype), r.dtype);
                let _ = writeln!(s, "    {}", d.var_value(&acc, d.compute_dtype(r.dtype), &identity));
                self.strided_fold(&mut s, r, &acc, &format!("p{j}_"), "slice", slices);
                self.tree(&mut s, r, j, &acc, c);
                let _ = writeln!(
                    s,
                    "    {}",
                    d.let_value(&format!("row{j}"), d.compute_dtype(r.dtype), &format!("kiln_red{j}[0]"))
                );
            }
            let per_row: usize = k.out_extents[k.row_rank..].iter().product();
            let rows: Vec<String> = (0..k.rows.len()).map(|j| format!(", row{j}")).collect();
            let _ = writeln!(s, "    {}", d.for_step_open("c", "slice", &per_row.to_string(), &slices.to_string()));
            let _ = writeln!(s, "        element(g * {per_row} + c{});", rows.concat());
            let _ = writeln!(s, "    }}");
        }
        let _ = writeln!(s, "{}", d.fn_close());
        s
    }

    /// A loop over reduce indices `slice, slice + slices, ..` (flat over `r`'s
    /// extents, decomposed into the reduce variables) folding `r`'s inner code into `acc` (which the caller declares).
    fn strided_fold(&mut self, s: &mut String, r: &Reduce, acc: &str, prefix: &str, slice: &str, slices: usize) {
        let d = self.d;
        let rank = self.k.out_rank();
        let len: usize = r.extents.iter().product();
        let _ = writeln!(s, "    {}", d.for_step_open("q", slice, &len.to_string(), &slices.to_string()));
        let strides = crate::shape::contiguous_strides(&r.extents);
        for (j, (&e, &st)) in r.extents.iter().zip(&strides).enumerate() {
            let expr = match (j, st) {
                (0, 1) => "q".to_string(),
                (0, st) => format!("q / {st}"),
                (_, 1) => format!("q % {e}"),
                _ => format!("(q / {st}) % {e}"),
            };
            let _ = writeln!(s, "        {}", d.let_index(&format!("i{}", rank + j), &expr));
        }
        self.insts(s, &r.inner, prefix, "        ");
        let folded = self.binary(r.op.fold(), r.dtype, acc, &format!("{prefix}{}", r.value));
        let _ = writeln!(s, "        {acc} = {folded};\n    }}");
    }

    /// Folds each invocation's `acc` over the workgroup through `kiln_red<j>`: after it, `kiln_red<j>[lane]` holds
    /// the output's result, visible to every invocation.
    fn tree(&mut self, s: &mut String, r: &Reduce, j: usize, acc: &str, c: Coop) {
        let d = self.d;
        let arr = format!("kiln_red{j}");
        let _ = writeln!(s, "    {arr}[lid] = {acc};\n    {}", d.barrier());
        let mut half = c.slices / 2;
        while half > 0 {
            let other = format!("{arr}[lid + {}]", half * c.lanes);
            let folded = self.binary(r.op.fold(), r.dtype, &format!("{arr}[lid]"), &other);
            let _ =
                writeln!(s, "    if (slice < {half}) {{\n        {arr}[lid] = {folded};\n    }}\n    {}", d.barrier());
            half /= 2;
        }
    }
}
