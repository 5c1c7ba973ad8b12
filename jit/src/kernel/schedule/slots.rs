//! Rule 4 (`schedule/mod.rs` states it): the buffers of a plan. Every launch reads its inputs' slots and writes
//! its own; an intermediate lives in an arena slot from the launch that writes it to the last that reads it, and
//! values whose lives do not overlap share a slot.

use super::kernels::Lowered;
use super::{KernelPlan, Launch, Slot};
use crate::dtype::Scalar;
use crate::graph::Graph;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{BufParam, Inst, InstOp, KernelIr};
use crate::op::Op;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::NodeIndexable;

/// The plan of `launches_raw` (in launch order): each launch's input and output slots, the arena's slot sizes, and
/// a copy for each graph output listed twice.
pub(super) fn place(graph: &Graph, order: &[NodeIndex], launches_raw: Vec<Lowered>) -> KernelPlan {
    let bound = graph.g.node_bound();
    let mut last_read = vec![0usize; bound];
    for (step, (_, _, reads, _)) in launches_raw.iter().enumerate() {
        for &r in reads {
            last_read[r.index()] = step;
        }
    }

    let mut slot_of: Vec<Option<Slot>> = vec![None; bound];
    for &n in order {
        if let Op::Input { slot } = graph.node(n).op {
            slot_of[n.index()] = Some(Slot::Input(slot));
        }
    }
    let mut outputs = Vec::new();
    let mut passthrough = Vec::new();
    for (i, &o) in graph.outputs.iter().enumerate() {
        let d = graph.node(o);
        outputs.push(BufParam { dtype: d.dtype, len: d.shape.numel() });
        if let Op::Input { slot } = d.op {
            passthrough.push((i, slot));
        }
    }
    let mut temps: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    // Per slot, whether it holds a constant (`slot_for`): never freed.
    let mut constant: Vec<bool> = Vec::new();
    let mut launches = Vec::with_capacity(launches_raw.len());
    for (step, (k, kernel, reads, split)) in launches_raw.into_iter().enumerate() {
        let mut inputs: Vec<Slot> = reads.iter().map(|r| slot_of[r.index()].expect("read after write")).collect();
        let (kernel, partials) = match split {
            Some((partial, combine)) => {
                let slot = slot_for(&mut temps, &mut free, &mut constant, &partial);
                launches.push(Launch { kernel: partial, inputs: inputs.clone(), output: Slot::Temp(slot) });
                inputs.push(Slot::Temp(slot));
                (combine, Some(slot))
            }
            None => (kernel, None),
        };
        let output = match graph.outputs.iter().position(|&o| o == k) {
            Some(i) => Slot::Output(i),
            None => Slot::Temp(slot_for(&mut temps, &mut free, &mut constant, &kernel)),
        };
        // The partials are read by the combining kernel only: free after it (not before its output is placed).
        free.extend(partials.filter(|&p| !constant[p]));
        slot_of[k.index()] = Some(output);
        for r in &reads {
            if last_read[r.index()] == step
                && let Some(Slot::Temp(t)) = slot_of[r.index()]
                && !free.contains(&t)
                && !constant[t]
            {
                free.push(t);
            }
        }
        launches.push(Launch { kernel, inputs, output });
    }
    // A graph may list one node as several outputs (`kiln::capture(&[&t, &t])`). Its kernel writes the first of
    // them; each later one is a copy, so that every output is written (the CPU backend allocates them uninitialized).
    for (i, &o) in graph.outputs.iter().enumerate() {
        let first = graph.outputs.iter().position(|&p| p == o).expect("listed");
        if first != i && !matches!(graph.node(o).op, Op::Input { .. }) {
            launches.push(Launch {
                kernel: copy(&outputs[i]),
                inputs: vec![Slot::Output(first)],
                output: Slot::Output(i),
            });
        }
    }
    KernelPlan { launches, temps, outputs, passthrough }
}

/// The arena slot for kernel `k`'s output. A constant's (`KernelIr::is_constant`) is a new one, marked in
/// `constant` (one flag per slot) and never freed: no value before or after it shares it, so it holds the constant
/// from one run to the next (`KernelPlan::constant`). Any other's is [`take_slot`]'s.
fn slot_for(temps: &mut Vec<usize>, free: &mut Vec<usize>, constant: &mut Vec<bool>, k: &KernelIr) -> usize {
    let slot = if k.is_constant() {
        temps.push(k.output.len * k.output.dtype.size_of());
        temps.len() - 1
    } else {
        take_slot(temps, free, &k.output)
    };
    constant.resize(temps.len(), false);
    constant[slot] |= k.is_constant();
    slot
}

/// An arena slot for `b`: the best fit among the `free` slots, the most recently freed of those, or a new one.
///
/// Most recently freed: `free` is in the order the slots were freed, and of several slots of one size (a model's
/// activations mostly are) the last one freed is the one a kernel read last, so its lines are likeliest still in
/// cache; the oldest would make the kernel's stores fetch lines from memory first. Removal keeps that order.
fn take_slot(temps: &mut Vec<usize>, free: &mut Vec<usize>, b: &BufParam) -> usize {
    let bytes = b.len * b.dtype.size_of();
    let pick = free.iter().enumerate().rev().filter(|&(_, &s)| temps[s] >= bytes).min_by_key(|&(_, &s)| temps[s]);
    match pick {
        Some((i, _)) => free.remove(i),
        None => {
            temps.push(bytes);
            temps.len() - 1
        }
    }
}

/// A kernel that copies a buffer.
fn copy(b: &BufParam) -> KernelIr {
    let load = InstOp::Load { buf: 0, index: IExpr::Var(0), valid: None, fill: Scalar::Int(0) };
    KernelIr {
        name: format!("E_copy_{}", b.len),
        inputs: vec![b.clone()],
        output: b.clone(),
        out_extents: vec![b.len],
        reduce: None,
        rows: Vec::new(),
        row_rank: 1,
        outer: vec![Inst { op: load, dtype: b.dtype }],
        result: 0,
        flops_per_elem: 0,
        routine: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// Best fit first; of the slots that fit best, the one freed last (its lines likeliest in cache), and the rest
    /// keep the order they were freed in.
    #[test]
    fn take_slot_reuses_the_best_fit_freed_last() {
        let f32s = |len| BufParam { dtype: DType::F32, len };
        let mut temps = vec![400, 800, 400, 400];
        let mut free = vec![2, 1, 0, 3];
        assert_eq!(take_slot(&mut temps, &mut free, &f32s(100)), 3);
        assert_eq!(free, vec![2, 1, 0]);
        assert_eq!(take_slot(&mut temps, &mut free, &f32s(100)), 0);
        assert_eq!(take_slot(&mut temps, &mut free, &f32s(150)), 1);
        assert_eq!(take_slot(&mut temps, &mut free, &f32s(150)), 4, "none fits: a new slot");
        assert_eq!((temps.len(), free), (5, vec![2]));
    }
}
