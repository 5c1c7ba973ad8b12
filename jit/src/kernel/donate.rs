//! Buffer donation: which plan outputs may be written over which plan inputs.
//!
//! A training step reads each parameter and writes its replacement of the same size (`W - lr * g`). When nothing
//! else will read the old value after the step, the new one can be written into the old buffer: the parameters
//! then need one buffer each instead of two while a step runs, and the update reads and writes the same cache
//! lines (JAX's `donate_argnums`, PyTorch's in-place `p.add_`). Whether nothing else will read the old value is the
//! runtime's question (it knows who holds the tensor); this module answers the compile-time one: could the plan
//! write output `o` over input `s` and still compute every output exactly as it would with separate buffers?
//!
//! That holds when:
//! 1. `o` and `s` have the same dtype and length, `o` is written by a launch (not a passthrough of an input), and
//!    `s` is not itself passed through to an output;
//! 2. every launch that reads `s` runs no later than the launch `L` that writes `o` (launches run one after the
//!    other, each finished before the next starts), and no launch reads `o` before `L` writes it;
//! 3. `L` reads `s` only at the element it is writing: in its per-element (outer) code, at the output's own
//!    row-major index, unmasked, and never in its reduction loop. Each element is then loaded before it is
//!    stored, by the same thread, and no other element's computation reads it.
//!
//! Condition 3 is about the kernel IR. A backend must also run `L` so that each element's load precedes its
//! store: a Cranelift elementwise kernel does; a GEMM whose epilogue runs as a separate pass over C, or that
//! stores partial sums into C between K blocks, does not. So the backend filters these candidates by how it will
//! run each launch ([`Donation::launch`]).

use crate::kernel::ir::{InstOp, KernelIr};
use crate::kernel::schedule::{KernelPlan, Slot};

/// Output `output` may be written into the buffer of input slot `input`; `launch` is the launch that writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Donation {
    pub output: usize,
    pub input: usize,
    pub launch: usize,
}

impl KernelPlan {
    /// Every (output, input) pair that satisfies conditions 1-3 of the module docs, at most one input per output
    /// and one output per input (the first found, in output order).
    pub fn donation_candidates(&self) -> Vec<Donation> {
        let mut found: Vec<Donation> = Vec::new();
        let readers_of = |slot: Slot| {
            self.launches.iter().enumerate().filter(move |(_, l)| l.inputs.contains(&slot)).map(|(i, _)| i)
        };
        for (o, out) in self.outputs.iter().enumerate() {
            if self.passthrough.iter().any(|&(p, _)| p == o) {
                continue;
            }
            let Some(writer) = self.launches.iter().position(|l| l.output == Slot::Output(o)) else { continue };
            // Condition 2, second half: the output slot is read by nobody before its writer (true of today's
            // schedules; checked so a future schedule cannot break donation silently).
            if readers_of(Slot::Output(o)).any(|r| r <= writer) {
                continue;
            }
            let l = &self.launches[writer];
            let candidates = l.inputs.iter().filter_map(|s| match *s {
                Slot::Input(i) => Some(i),
                _ => None,
            });
            for s in candidates {
                let same_buffer_shape = l
                    .inputs
                    .iter()
                    .zip(&l.kernel.inputs)
                    .filter(|(slot, _)| **slot == Slot::Input(s))
                    .all(|(_, b)| b.dtype == out.dtype && b.len == out.len);
                let ok = same_buffer_shape
                    && !self.passthrough.iter().any(|&(_, p)| p == s)
                    && !found.iter().any(|d| d.input == s || d.output == o)
                    && readers_of(Slot::Input(s)).all(|r| r <= writer)
                    && reads_only_own_element(&l.kernel, &l.inputs, Slot::Input(s));
                if ok {
                    found.push(Donation { output: o, input: s, launch: writer });
                    break;
                }
            }
        }
        found
    }
}

/// Condition 3: every load of a buffer bound to `slot` is in the outer code, unmasked, at the output's row-major
/// index (not in a reduction: a row reduction reads its row before the row is written, but may read other rows).
fn reads_only_own_element(k: &KernelIr, bound: &[Slot], slot: Slot) -> bool {
    if k.routine.is_some() {
        return false; // a routine reads whole matrices
    }
    let bufs: Vec<usize> = bound.iter().enumerate().filter(|(_, s)| **s == slot).map(|(b, _)| b).collect();
    let loads_it = |op: &InstOp| matches!(op, InstOp::Load { buf, .. } if bufs.contains(buf));
    if k.reduce.iter().chain(&k.rows).any(|r| r.inner.iter().any(|i| loads_it(&i.op))) {
        return false;
    }
    let rank = k.out_extents.len();
    let mut stride = 1i64;
    let mut strides = vec![0i64; rank];
    for v in (0..rank).rev() {
        strides[v] = stride;
        stride *= k.out_extents[v] as i64;
    }
    k.outer.iter().all(|inst| match &inst.op {
        InstOp::Load { buf, index, valid, .. } if bufs.contains(buf) => {
            let Some((coef, c)) = index.simplify(&k.out_extents).affine(rank) else { return false };
            valid.is_none()
                && c == 0
                && coef.iter().zip(&strides).zip(&k.out_extents).all(|((&a, &s), &e)| e == 1 || a == s)
        }
        _ => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::Graph;
    use crate::graph::NodeData;
    use crate::kernel::schedule::schedule;
    use crate::op::{BinaryOp, Op};
    use crate::shape::Shape;

    fn node(op: Op, dims: &[usize]) -> NodeData {
        NodeData { op, shape: Shape::new(dims), dtype: DType::F32 }
    }

    /// The candidates of `w' - x * x` over [4, 8], where `w'` is `w` or `w` read through a transpose.
    fn update_graph(transposed_read: bool) -> Vec<Donation> {
        let mut g = Graph::new();
        let w = g.add(node(Op::Input { slot: 0 }, &[4, 8]), &[]);
        let x = g.add(node(Op::Input { slot: 1 }, &[4, 8]), &[]);
        let read = if transposed_read {
            let t = g.add(node(Op::Permute(vec![1, 0]), &[8, 4]), &[w]);
            g.add(node(Op::Reshape, &[4, 8]), &[t])
        } else {
            w
        };
        let d = g.add(node(Op::Binary(BinaryOp::Mul), &[4, 8]), &[x, x]);
        let new = g.add(node(Op::Binary(BinaryOp::Sub), &[4, 8]), &[read, d]);
        g.outputs = vec![new];
        schedule(&g).donation_candidates()
    }

    #[test]
    fn an_elementwise_update_may_write_over_the_input_it_replaces() {
        let c = update_graph(false);
        assert_eq!(c, vec![Donation { output: 0, input: 0, launch: 0 }]);
    }

    #[test]
    fn a_kernel_that_reads_other_elements_of_the_input_may_not() {
        // out[i, j] reads w at a transposed position: writing out[0, 1] would clobber w[0, 1], which out[1, 0]
        // still needs.
        let c = update_graph(true);
        assert!(c.iter().all(|d| d.input != 0), "{c:?}");
    }

    #[test]
    fn an_input_read_by_a_later_launch_may_not() {
        // new = w - x, then s = (w * new).sum(), which must run later and still needs the old w.
        let mut g = Graph::new();
        let w = g.add(node(Op::Input { slot: 0 }, &[4, 8]), &[]);
        let x = g.add(node(Op::Input { slot: 1 }, &[4, 8]), &[]);
        let new = g.add(node(Op::Binary(BinaryOp::Sub), &[4, 8]), &[w, x]);
        let wn = g.add(node(Op::Binary(BinaryOp::Mul), &[4, 8]), &[w, new]);
        let s = g.add(node(Op::Reduce { op: crate::op::ReduceOp::Sum, axes: vec![0, 1] }, &[1, 1]), &[wn]);
        g.outputs = vec![new, s];
        let plan = schedule(&g);
        let writer = plan.launches.iter().position(|l| l.output == Slot::Output(0)).expect("writer");
        let reader = plan.launches.iter().position(|l| l.output == Slot::Output(1)).expect("reader");
        assert!(reader > writer, "the fixture wants the reduction after the update");
        // x, read by the update alone, may take the new value instead.
        assert_eq!(plan.donation_candidates(), vec![Donation { output: 0, input: 1, launch: writer }]);
    }

    #[test]
    fn a_differently_sized_or_typed_input_may_not() {
        let mut g = Graph::new();
        let w = g.add(node(Op::Input { slot: 0 }, &[4, 1]), &[]);
        let e = g.add(node(Op::Expand, &[4, 8]), &[w]);
        let x = g.add(node(Op::Input { slot: 1 }, &[4, 8]), &[]);
        let h = g.add(NodeData { op: Op::Input { slot: 2 }, shape: Shape::new(vec![4, 8]), dtype: DType::F64 }, &[]);
        let hc = g.add(node(Op::Cast, &[4, 8]), &[h]);
        let a = g.add(node(Op::Binary(BinaryOp::Add), &[4, 8]), &[e, hc]);
        let out = g.add(node(Op::Binary(BinaryOp::Add), &[4, 8]), &[a, x]);
        g.outputs = vec![out];
        // Only x (same dtype, same length, read at the output's index) qualifies.
        assert_eq!(schedule(&g).donation_candidates(), vec![Donation { output: 0, input: 1, launch: 0 }]);
    }

    #[test]
    fn a_passed_through_input_is_never_donated() {
        let mut g = Graph::new();
        let w = g.add(node(Op::Input { slot: 0 }, &[4, 8]), &[]);
        let n = g.add(node(Op::Unary(crate::op::UnaryOp::Neg), &[4, 8]), &[w]);
        g.outputs = vec![n, w];
        assert!(schedule(&g).donation_candidates().is_empty());
    }
}
