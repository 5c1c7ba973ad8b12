//! An elementwise kernel cut into boxes of its outer loops within which every mask has one value, each box with its
//! code specialized to it: a masked load the box never reads becomes its fill, one it always reads a plain load,
//! and a comparison of a loop position with a constant becomes that constant (so a `where` on it picks one side).
//!
//! Why: a concatenation, or a sum of padded pieces, along outer dims is one kernel whose every element evaluates
//! every piece's masked load, all but one or a few of them discarded. Attention's q, k and v gradients put back
//! into one `[B * T, 3 * D]` are three such pieces; with causal attention run by blocks of queries
//! (`nn::functional::attention`), k's and v's gradients are each a sum over the blocks of a padded piece, 12 masked
//! loads an element for 4 blocks. Within a box (one of q, k and v, and one block of positions) the code reads only
//! the pieces that are live there, unmasked: what a backend's full-width kernels run (they take no masks on these
//! loops), with the work of the live loads only.
//!
//! The boxes come from the masks: each range of a masked load and each comparison of a loop position with a
//! constant must test one loop variable, not the last one (the loop a backend vectorizes), and its truth along that
//! variable gives the cut points. Anything else (a range over two variables, a masked load tested on the last loop)
//! and there are no regions: the kernel runs as it is; a comparison of the last loop's position stays in the code
//! (a one-hot's `arange == target`, which full-width kernels compute). A variant computes exactly what the kernel
//! computes in its box (the fill where a load is never valid, the same arithmetic after it: `x + 0.0` stays, it
//! turns -0.0 into +0.0; values of constants alone are folded with the interpreter's arithmetic), so running the
//! variants gives the kernel's own bits.

use crate::dtype::Scalar;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{Inst, InstOp, KernelIr, ValueId};
use crate::op::{BinaryOp, UnaryOp};
use std::collections::HashMap;

/// The longest loop a mask may test: its truth is evaluated at every position of the loop when the kernel is
/// compiled.
const MAX_TESTED_EXTENT: usize = 1 << 16;

/// An elementwise kernel's boxes and the specialized code of each ([`regions`]).
#[derive(Clone, Debug)]
pub struct Regions {
    /// Per output loop variable, where its intervals start: `[0]` for a variable no mask tests, else `0` and every
    /// position where some mask changes along it.
    pub cuts: Vec<Vec<usize>>,
    /// The distinct specialized kernels: the original's inputs, output and loops, no masked loads and no tested
    /// comparisons left.
    pub variants: Vec<KernelIr>,
    /// Per box, row-major over the variables' intervals, the variant that computes it.
    pub variant_of: Vec<usize>,
}

impl Regions {
    /// The interval of variable `var` that holds position `x`.
    pub fn interval(&self, var: usize, x: usize) -> usize {
        self.cuts[var].partition_point(|&c| c <= x) - 1
    }

    /// Where interval `i` of variable `var` ends (exclusive), given the variable's extent.
    pub fn interval_end(&self, var: usize, i: usize, extent: usize) -> usize {
        self.cuts[var].get(i + 1).copied().unwrap_or(extent)
    }
}

/// A condition that one loop variable alone decides: its truth at each position of that variable.
struct Leaf {
    /// The instruction: a masked load (its every range) or a comparison.
    inst: ValueId,
    var: usize,
    truth: Vec<bool>,
}

/// The boxes of the elementwise kernel `k` and their specialized code (module doc), or `None`: a kernel with a
/// reduction, row reductions or a routine, an empty one, one with no mask to cut by, a mask that is not one
/// variable's (or tests the last loop, or one longer than 65536), or more than `max_boxes` boxes.
pub fn regions(k: &KernelIr, max_boxes: usize) -> Option<Regions> {
    let rank = k.out_rank();
    if k.reduce.is_some() || !k.rows.is_empty() || k.routine.is_some() || rank < 2 || k.out_extents.contains(&0) {
        return None;
    }
    let leaves = leaves(k)?;
    if leaves.is_empty() {
        return None;
    }
    let mut cuts: Vec<Vec<usize>> = vec![vec![0]; rank];
    for leaf in &leaves {
        let changes = (1..leaf.truth.len()).filter(|&x| leaf.truth[x] != leaf.truth[x - 1]);
        cuts[leaf.var].extend(changes);
    }
    for c in &mut cuts {
        c.sort_unstable();
        c.dedup();
    }
    let boxes = cuts.iter().try_fold(1usize, |n, c| n.checked_mul(c.len())).filter(|&n| n <= max_boxes)?;
    let mut variants = Vec::new();
    let mut by_pattern: HashMap<Vec<bool>, usize> = HashMap::new();
    let mut variant_of = Vec::with_capacity(boxes);
    for b in 0..boxes {
        // The box's first position along each variable (row-major over the intervals, the last variable fastest).
        let mut start = vec![0usize; rank];
        let mut rest = b;
        for v in (0..rank).rev() {
            start[v] = cuts[v][rest % cuts[v].len()];
            rest /= cuts[v].len();
        }
        let pattern: Vec<bool> = leaves.iter().map(|l| l.truth[start[l.var]]).collect();
        let id = match by_pattern.get(&pattern) {
            Some(&id) => id,
            None => {
                // A load is live where every one of its ranges holds.
                let mut values: HashMap<ValueId, bool> = HashMap::new();
                for (l, &t) in leaves.iter().zip(&pattern) {
                    *values.entry(l.inst).or_insert(true) &= t;
                }
                let v = specialize(k, &values, variants.len());
                // Boxes whose masks differ only in what their code no longer reads share a variant.
                let same = variants.iter().position(|w: &KernelIr| w.outer == v.outer && w.result == v.result);
                let id = same.unwrap_or(variants.len());
                if same.is_none() {
                    variants.push(v);
                }
                by_pattern.insert(pattern, id);
                id
            }
        };
        variant_of.push(id);
    }
    Some(Regions { cuts, variants, variant_of })
}

/// Every mask of `k`'s outer code with the variable that decides it, or `None` where a mask is not one variable's
/// (a range over several variables or the last one, a comparison of a position that is not with a constant).
fn leaves(k: &KernelIr) -> Option<Vec<Leaf>> {
    let rank = k.out_rank();
    let last = rank - 1;
    // The truth of `test(e)` along the one variable `e` reads (a constant expression is not a cut).
    let along = |e: &IExpr, test: &dyn Fn(i64) -> bool| -> Option<(usize, Vec<bool>)> {
        let vars = e.vars();
        let [var] = vars[..] else { return None };
        if var == last || k.out_extents[var] > MAX_TESTED_EXTENT {
            return None;
        }
        let mut at = vec![0i64; rank];
        let truth = (0..k.out_extents[var])
            .map(|x| {
                at[var] = x as i64;
                test(e.eval(&at))
            })
            .collect();
        Some((var, truth))
    };
    let mut out = Vec::new();
    for (i, inst) in k.outer.iter().enumerate() {
        match &inst.op {
            InstOp::Load { valid: Some(v), .. } => {
                // A load's ranges may test different variables: the load is live where all hold, so each range is
                // a leaf of its own and the load's value is their conjunction (`specialize`).
                for (e, lo, hi) in &v.0 {
                    let (var, truth) = along(e, &|x| (*lo..*hi).contains(&x))?;
                    out.push(Leaf { inst: i, var, truth });
                }
            }
            InstOp::Binary(op @ (BinaryOp::Lt | BinaryOp::Le | BinaryOp::Eq | BinaryOp::Ne), a, b) => {
                let (lhs, rhs) = (&k.outer[*a].op, &k.outer[*b].op);
                let (e, c, flipped) = match (lhs, rhs) {
                    (InstOp::Index(e), InstOp::Const(Scalar::Int(c))) => (e, *c, false),
                    (InstOp::Const(Scalar::Int(c)), InstOp::Index(e)) => (e, *c, true),
                    _ => continue,
                };
                let op = *op;
                let test = move |x: i64| {
                    let (l, r) = if flipped { (c, x) } else { (x, c) };
                    match op {
                        BinaryOp::Lt => l < r,
                        BinaryOp::Le => l <= r,
                        BinaryOp::Eq => l == r,
                        _ => l != r,
                    }
                };
                // A comparison of the vectorized loop's position (a one-hot's `arange == target`) is left as it is.
                match along(e, &test) {
                    Some((var, truth)) => out.push(Leaf { inst: i, var, truth }),
                    None if e.vars().contains(&last) => {}
                    None => return None,
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// `k` with each leaf given its value in a box (`values`: per leaf instruction, a load's ranges all holding or a
/// comparison's result), constants folded through `and`, `or`, `not` and `where` and then through every operation
/// on constants alone, and what the result no longer reads dropped. Named after `k` with the variant's number.
fn specialize(k: &KernelIr, values: &HashMap<ValueId, bool>, variant: usize) -> KernelIr {
    let mut code: Vec<Inst> = Vec::with_capacity(k.outer.len());
    // Per original instruction, the instruction of `code` that holds its value.
    let mut id: Vec<ValueId> = Vec::with_capacity(k.outer.len());
    let bool_of = |code: &[Inst], v: ValueId| match code[v].op {
        InstOp::Const(Scalar::Bool(b)) => Some(b),
        _ => None,
    };
    for (i, inst) in k.outer.iter().enumerate() {
        let mut inst = inst.clone();
        inst.map_operands(|a| id[a]);
        let op = match (&inst.op, values.get(&i)) {
            (InstOp::Load { buf, index, fill, .. }, Some(&open)) => {
                if open {
                    InstOp::Load { buf: *buf, index: index.clone(), valid: None, fill: *fill }
                } else {
                    InstOp::Const(*fill)
                }
            }
            (InstOp::Binary(..), Some(&b)) => InstOp::Const(Scalar::Bool(b)),
            (InstOp::Where(c, a, b), _) if bool_of(&code, *c).is_some() => {
                id.push(if bool_of(&code, *c) == Some(true) { *a } else { *b });
                continue;
            }
            (InstOp::Binary(op @ (BinaryOp::And | BinaryOp::Or), a, b), _) => {
                let (x, y) = (bool_of(&code, *a), bool_of(&code, *b));
                // The identity keeps the other operand; the absorbing value decides.
                let (absorb, other) = match op {
                    BinaryOp::And => (false, true),
                    _ => (true, false),
                };
                match (x, y) {
                    (Some(x), _) if x == absorb => InstOp::Const(Scalar::Bool(absorb)),
                    (_, Some(y)) if y == absorb => InstOp::Const(Scalar::Bool(absorb)),
                    (Some(x), _) if x == other => {
                        id.push(*b);
                        continue;
                    }
                    (_, Some(y)) if y == other => {
                        id.push(*a);
                        continue;
                    }
                    _ => inst.op.clone(),
                }
            }
            (InstOp::Unary(UnaryOp::Not, a), _) if inst.dtype == crate::DType::Bool && bool_of(&code, *a).is_some() => {
                InstOp::Const(Scalar::Bool(bool_of(&code, *a) != Some(true)))
            }
            _ => inst.op.clone(),
        };
        code.push(Inst { op, dtype: inst.dtype });
        id.push(code.len() - 1);
    }
    // Values computed from constants alone (the fills of a region's dead loads added up) become one constant each,
    // computed as the interpreter does, in each instruction's dtype: the same bits, and no chain of uniform values
    // for a backend to carry.
    let mut constant = Vec::with_capacity(code.len());
    for inst in &code {
        let c = match &inst.op {
            InstOp::Const(_) => true,
            InstOp::Unary(..) | InstOp::Binary(..) | InstOp::Where(..) | InstOp::Cast(_) => {
                inst.operands().iter().all(|&a| constant[a])
            }
            _ => false,
        };
        constant.push(c);
    }
    let values = crate::kernel::eval::eval_uniform(&code, &constant, &mut |_, _, _| Scalar::Int(0));
    for (inst, v) in code.iter_mut().zip(values) {
        if let (Some(v), false) = (v, matches!(inst.op, InstOp::Const(_))) {
            inst.op = InstOp::Const(v);
        }
    }
    let result = id[k.result];
    // Keep what the result reads, in order.
    let mut used = vec![false; code.len()];
    used[result] = true;
    for i in (0..code.len()).rev() {
        if used[i] {
            for a in code[i].operands() {
                used[a] = true;
            }
        }
    }
    let mut renumber = vec![usize::MAX; code.len()];
    let mut outer = Vec::new();
    for (i, mut inst) in code.into_iter().enumerate() {
        if used[i] {
            inst.map_operands(|a| renumber[a]);
            renumber[i] = outer.len();
            outer.push(inst);
        }
    }
    KernelIr { name: format!("{}_r{variant}", k.name), outer, result: renumber[result], ..k.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::HostBuffer;
    use crate::graph::{Graph, NodeData};
    use crate::op::Op;
    use crate::{DType, Shape};

    /// `pad(pad(x0) + pad(x1)) + pad(x2)`: a sum of two overlapping pieces padded along dim 1 (masked loads), padded
    /// along dim 0 (a `where` on the position), plus a third piece below it: every box's variant gives the kernel's
    /// value at every position of the box, and the variants read no masked load and test no outer position.
    #[test]
    fn each_box_computes_what_the_kernel_does() {
        let node = |op: Op, dims: &[usize]| NodeData { op, shape: Shape::new(dims), dtype: DType::F32 };
        let pad = |pads: Vec<(usize, usize)>| Op::Pad { pads, value: Scalar::Float(0.0) };
        let mut g = Graph::new();
        let x0 = g.add(node(Op::Input { slot: 0 }, &[2, 5, 8]), &[]);
        let x1 = g.add(node(Op::Input { slot: 1 }, &[2, 7, 8]), &[]);
        let x2 = g.add(node(Op::Input { slot: 2 }, &[3, 12, 8]), &[]);
        let p0 = g.add(node(pad(vec![(0, 0), (0, 7), (0, 0)]), &[2, 12, 8]), &[x0]);
        let p1 = g.add(node(pad(vec![(0, 0), (3, 2), (0, 0)]), &[2, 12, 8]), &[x1]);
        let y = g.add(node(Op::Binary(BinaryOp::Add), &[2, 12, 8]), &[p0, p1]);
        let py = g.add(node(pad(vec![(0, 3), (0, 0), (0, 0)]), &[5, 12, 8]), &[y]);
        let p2 = g.add(node(pad(vec![(2, 0), (0, 0), (0, 0)]), &[5, 12, 8]), &[x2]);
        let out = g.add(node(Op::Binary(BinaryOp::Add), &[5, 12, 8]), &[py, p2]);
        g.outputs.push(out);
        let plan = crate::kernel::schedule(&g);
        let [launch] = &plan.launches[..] else { panic!("{} launches", plan.launches.len()) };
        let k = &launch.kernel;
        let r = regions(k, 64).expect("regions");
        // Dim 0: rows 0..2 hold the sum, 2..5 the third piece; dim 1: the sum's pieces cover 0..5 and 3..10.
        assert_eq!(r.cuts, vec![vec![0, 2], vec![0, 3, 5, 10], vec![0]], "{}", k.to_text());
        // x0 alone, both, x1 alone, nothing (the sum's pad); the third piece: one variant for its 4 boxes.
        assert_eq!(r.variants.len(), 5);
        assert_eq!(r.variant_of[4..], [4, 4, 4, 4]);
        for v in &r.variants {
            for inst in &v.outer {
                let masked = matches!(inst.op, InstOp::Load { valid: Some(_), .. } | InstOp::Index(_));
                assert!(!masked, "a variant kept a mask:\n{}", v.to_text());
            }
        }
        let values = |n: usize, c: f32| HostBuffer::F32((0..n).map(|i| (i as f32 * 0.37 + c).sin()).collect());
        let inputs = [values(80, 0.1), values(112, 0.7), values(288, 1.3)];
        let inputs: Vec<&HostBuffer> = inputs.iter().collect();
        let mut positions = Vec::new();
        for a in 0..5 {
            for b in 0..12 {
                for c in 0..8 {
                    positions.push(vec![a, b, c]);
                }
            }
        }
        let want = crate::kernel::eval::run_at(k, &inputs, &[], &positions);
        for (p, w) in positions.iter().zip(want) {
            let (i0, i1) = (r.interval(0, p[0]), r.interval(1, p[1]));
            let v = &r.variants[r.variant_of[i0 * 4 + i1]];
            let got = crate::kernel::eval::run_at(v, &inputs, &[], std::slice::from_ref(p))[0];
            assert_eq!(got.to_bits(), w.to_bits(), "at {p:?}");
        }
    }
}
