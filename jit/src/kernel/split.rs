//! A large reduction to one value, split in two kernels so that all cores share it.
//!
//! A kernel's output loop is what a backend spreads over its threads (or workgroups); a reduction to a single value
//! has none, so it ran on one core (an MSE-sum loss over a 1024 x 784 output read memory at under a quarter of what
//! two cores stream). [`split_full_reduction`] rewrites such a kernel as
//!
//! ```text
//! partial[p] = fold over rows p*C .. (p+1)*C of the reduction        (P outputs: the cores share them)
//! out        = outer code of fold over partial[0..P]                  (P loads)
//! ```
//!
//! Adjacent reduce loops that every index walks as one row-major counter are merged first (a sum over `[1024, 10]` is
//! one loop of 10240), so the partial kernel's inner loop is long enough to vectorize. Sum, product, max and min
//! all combine partials with the same fold. P divides the first reduce loop (`part_count`: about 32768 elements a
//! part, at least 16 parts where each keeps 4096): it depends on the shape only, never on the machine's core count,
//! so a plan computes the same bits on every machine. (A sum's bits differ from the single loop's, as any
//! vectorized or split reduction's do; the interpreter comparison holds them to the accumulation tolerance.)
//!
//! Deliberately not done: reductions with several outputs but fewer than the cores (column sums of a tall matrix
//! still run one output per core), and a first loop with no divisor (a prime row count stays one kernel).

use crate::dtype::Scalar;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{BufParam, Inst, InstOp, KernelIr, Reduce, affine_indices, regroup, row_major_groups};

/// Reductions of fewer elements stay one kernel: a second launch would cost more than the other cores save. (Two
/// parts also buy the partial kernel an output loop, along which renderers vectorize a reduction: the Cranelift
/// renderer runs a kernel with no output loop as scalar code.)
pub const MIN_SPLIT_ELEMS: usize = 2 * MIN_PART_ELEMS;

/// Most partial results: few enough that folding them is negligible (a loop of 1024 loads).
pub const MAX_PARTS: usize = 1024;

/// Parts a split aims for at least: the threads of a many-core CPU.
pub const MIN_PARTS: usize = 16;

/// Elements a part aims to fold at most. Longer parts run faster on the CPU (a 4096 x 1024 sum on 2 threads: 431-468
/// µs in parts of 32768 or 65536, 546-568 in parts of 4096), and parts within the 65535 loop trips of Mesa's
/// llvmpipe Vulkan driver run there at all (`kiln-backends`' wgpu backend refuses longer reduce loops on it:
/// `loop_trip_cap`).
pub const TARGET_PART_ELEMS: usize = 32768;

/// Fewest elements a part folds.
pub const MIN_PART_ELEMS: usize = 4096;

/// How many parts a reduction of `total` elements whose first loop runs `first` times splits into: the smallest
/// divisor of `first` from `max(MIN_PARTS, total / TARGET_PART_ELEMS)` up to [`MAX_PARTS`], else the largest
/// divisor under that, leaving each part at least [`MIN_PART_ELEMS`]; `None` when no divisor does.
fn part_count(first: usize, total: usize) -> Option<usize> {
    let want = MIN_PARTS.max(total.div_ceil(TARGET_PART_ELEMS));
    let ok = |p: &usize| first.is_multiple_of(*p) && total / p >= MIN_PART_ELEMS;
    (want..=MAX_PARTS.min(first)).find(ok).or_else(|| (2..want.min(first + 1)).rev().find(ok))
}

/// What a partial kernel's name holds between its reduction's name and its part count.
const PARTIAL: &str = "_part";

/// Whether `k` is the partial pass of a split reduction ([`split_full_reduction`] names it `<name>_part<P>`): with
/// its combining kernel, one reduction.
pub fn is_partial(k: &KernelIr) -> bool {
    k.name.rsplit_once(PARTIAL).is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The partial and the combining kernel of `k` when it is a reduction to one value of at least [`MIN_SPLIT_ELEMS`]
/// elements whose first reduce loop has a usable divisor; `None` otherwise. The schedule passes `k` with its loops
/// merged already ([`with_merged_reduce_loops`]), so the first loop is as long as the indices allow. The partial kernel reads `k`'s
/// inputs and writes `P` values of the accumulator's dtype; the combining kernel reads `k`'s inputs followed by those
/// partials and writes `k`'s output.
pub fn split_full_reduction(k: &KernelIr) -> Option<(KernelIr, KernelIr)> {
    let r = k.reduce.as_ref().filter(|_| k.rows.is_empty())?;
    let total: usize = r.extents.iter().product();
    if !k.out_extents.is_empty() || total < MIN_SPLIT_ELEMS {
        return None;
    }
    let parts = part_count(r.extents[0], total)?;
    let chunk = r.extents[0] / parts;

    // Partial kernel: output loop p (variable 0); reduce loops: the first one's chunk, then the others (variables
    // 1..). Every index read at first-loop row `v` now reads it at `p * chunk + v`.
    let split = |e: &IExpr| {
        e.map_vars(&|v| match v {
            0 => IExpr::Add(vec![IExpr::Mul(Box::new(IExpr::Var(0)), chunk as i64), IExpr::Var(1)]),
            v => IExpr::Var(v + 1),
        })
    };
    let mut extents = vec![chunk];
    extents.extend(&r.extents[1..]);
    let mut all = vec![parts];
    all.extend(&extents);
    let mut inner = r.inner.clone();
    for inst in &mut inner {
        inst.map_indices(&|e| split(e).simplify(&all));
    }
    let acc = BufParam { dtype: r.dtype, len: parts };
    let partial = KernelIr {
        name: format!("{}{PARTIAL}{parts}", k.name),
        inputs: k.inputs.clone(),
        output: acc.clone(),
        out_extents: vec![parts],
        reduce: Some(Reduce { op: r.op, extents, dtype: r.dtype, inner, value: r.value }),
        rows: Vec::new(),
        row_rank: 1,
        outer: vec![Inst { op: InstOp::Acc, dtype: r.dtype }],
        result: 0,
        flops_per_elem: k.flops_per_elem.div_ceil(parts),
        routine: None,
    };

    // Combining kernel: `k` with its reduction folding the partials (the last input) instead.
    let load = InstOp::Load { buf: k.inputs.len(), index: IExpr::Var(0), valid: None, fill: Scalar::Int(0) };
    let mut combine = k.clone();
    combine.inputs.push(acc);
    combine.reduce = Some(Reduce {
        op: r.op,
        extents: vec![parts],
        dtype: r.dtype,
        inner: vec![Inst { op: load, dtype: r.dtype }],
        value: 0,
    });
    combine.flops_per_elem = parts + k.outer.len();
    Some((partial, combine))
}

/// A reduction to one value with adjacent reduce loops merged where every index walks them as one row-major counter
/// (a sum over a contiguous `[1024, 10]` becomes one loop of 10240, which vectorizes; the elements are folded in the
/// same order). Other kernels, and those with a masked or non-affine index, are returned as they are.
pub fn with_merged_reduce_loops(k: &KernelIr) -> KernelIr {
    match &k.reduce {
        Some(r) if k.out_extents.is_empty() && k.rows.is_empty() => {
            KernelIr { reduce: Some(merged_reduce_loops(r)), ..k.clone() }
        }
        _ => k.clone(),
    }
}

/// `r` merged as [`with_merged_reduce_loops`] says (its loops are the kernel's only variables).
fn merged_reduce_loops(r: &Reduce) -> Reduce {
    let Some(affine) = affine_indices(&r.inner, r.extents.len()) else { return r.clone() };
    let Some((extents, group)) = row_major_groups(&r.extents, &affine) else { return r.clone() };
    let mut out = r.clone();
    for inst in &mut out.inner {
        inst.map_indices(&|e| regroup(e, &group, extents.len()));
    }
    out.extents = extents;
    out
}
