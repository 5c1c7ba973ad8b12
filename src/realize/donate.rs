//! Buffer donation at run time: which of the plan's donation candidates (`kiln_jit::kernel::Donation`) this
//! realize may use, decided from who still holds what.
//!
//! An input's buffer may become an output's only if nothing can read the input's old value after the realize.
//! Reference counts answer that exactly, with no user annotation: every holder of a node is either an edge of the
//! walked graph (a consumer's operand list), the walk's own handle, or something outside the graph (a user's
//! tensor, a lazy node the targets do not need, a `Gradients` map, an autograd record). After the run, each output
//! drops its history, so the graph's own edges die with the realize. So the old value is unobservable when:
//! - the input node has no holder outside the graph, except the ones the caller names in `replaced` (an
//!   optimizer's parameter slot, which it overwrites with the new value right after); and
//! - every node that depends on the input and is not an output has no holder outside the graph (a user holding
//!   an intermediate, or the gradients of a `backward` still alive, could realize it later and need the old
//!   input); outputs are exempt: they are computed by this run and keep no history; and
//! - no other node shares the input's buffer (a realized `detach` does).
//!
//! Anything else (a count that does not match for any reason, including races with other threads, which could
//! only add holders) keeps the input's own buffer and the output gets a fresh one: donation is an optimization and
//! never changes a value. The donated node, which no one can read, ends up holding the new buffer (as a tensor
//! updated in place does in PyTorch), so even a count this analysis got wrong could never expose freed memory.

use super::{Kind, Walk, Walked};
use crate::tensor::{Node, State};
use kiln_backends::Buffer;
use kiln_jit::HostBuffer;
use kiln_jit::kernel::Donation;
use parking_lot::MutexGuard;
use std::sync::{Arc, LazyLock};

/// What the walk passes for a donated slot's `&Buffer` (the plan reads the donated buffer itself).
static PLACEHOLDER: LazyLock<Arc<Buffer>> =
    LazyLock::new(|| Arc::new(Buffer::Host(HostBuffer::F32(kiln_jit::HostVec::new()))));

/// A donated input: its slot, the output that takes its buffer, and its node's state, locked from the moment the
/// buffer is taken until the node holds the output's buffer (or its own again): another thread that obtained a
/// handle meanwhile (a `Param::get` racing the step) waits for the new value instead of finding no buffer.
pub(super) struct Taken<'a> {
    slot: usize,
    output: usize,
    state: MutexGuard<'a, State>,
}

impl Walk {
    /// The donations of `donations` this realize may use (module docs), as (walked input id, donation). `outputs`
    /// are the plan's outputs (walked ids); `replaced` the nodes whose one outside handle the caller replaces right
    /// after.
    pub(super) fn usable_donations(
        &mut self,
        donations: &[Donation],
        outputs: &[u32],
        replaced: &[*const Node],
    ) -> smallvec::SmallVec<[(u32, Donation); 4]> {
        let n = self.nodes.len();
        // Kept in the walk between realizations: a replayed step allocates nothing here.
        let mut uses = std::mem::take(&mut self.uses);
        uses.clear();
        uses.resize(n, 0);
        for &s in &self.src_ids {
            uses[s as usize] += 1;
        }
        // Bit j of `reach[id]`: node `id` depends on the input of candidate j (at most 64 candidates are tried).
        let mut reach = std::mem::take(&mut self.reach);
        reach.clear();
        reach.resize(n, 0);
        let mut blocked = 0u64;
        let mut inputs_at: smallvec::SmallVec<[(u32, usize); 8]> = smallvec::SmallVec::new();
        for (id, w) in self.nodes.iter().enumerate() {
            let mut bits = 0u64;
            if let Kind::Input { slot } = w.kind
                && let Some(j) = donations.iter().take(64).position(|d| d.input == slot)
            {
                bits |= 1 << j;
                inputs_at.push((id as u32, j));
            }
            for &s in &self.src_ids[w.srcs.clone()] {
                bits |= reach[s as usize];
            }
            reach[id] = bits;
            if bits == 0 || outputs.contains(&(id as u32)) {
                continue;
            }
            let node = &w.tensor.node;
            let allowed = matches!(w.kind, Kind::Input { .. }) && replaced.contains(&Arc::as_ptr(node));
            // The walk's own handle, one per edge of the walked graph, and the caller's replaced handle.
            if Arc::strong_count(node) != 1 + uses[id] as usize + allowed as usize {
                blocked |= bits;
            }
        }
        self.uses = uses;
        self.reach = reach;
        inputs_at
            .into_iter()
            .filter(|&(_, j)| blocked & (1 << j) == 0 && Arc::strong_count(&self.inputs[donations[j].input]) == 2)
            .map(|(id, j)| (id, donations[j]))
            .collect()
    }
}

/// Takes the buffer of each of `usable` into `donated[slot]` (a placeholder stays in `inputs[slot]`), locking its
/// node (see `Taken`). A buffer that turns out to be shared after all stays where it was.
pub(super) fn take<'a>(
    nodes: &'a [Walked],
    inputs: &mut [Arc<Buffer>],
    usable: &[(u32, Donation)],
    donated: &mut smallvec::SmallVec<[Option<Buffer>; 8]>,
) -> smallvec::SmallVec<[Taken<'a>; 4]> {
    let mut taken = smallvec::SmallVec::new();
    for &(id, d) in usable {
        let mut state = nodes[id as usize].tensor.node.state.lock();
        let State::Realized(buffer) = std::mem::replace(&mut *state, State::Spare) else {
            unreachable!("an input node is realized");
        };
        inputs[d.input] = PLACEHOLDER.clone();
        match Arc::try_unwrap(buffer) {
            Ok(b) => {
                if donated.len() <= d.input {
                    donated.resize_with(d.input + 1, || None);
                }
                donated[d.input] = Some(b);
                taken.push(Taken { slot: d.input, output: d.output, state });
            }
            Err(buffer) => {
                inputs[d.input] = buffer.clone();
                *state = State::Realized(buffer);
            }
        }
    }
    taken
}

/// After a successful run: each donated node holds its output's buffer (`results[output]`), and is unlocked.
pub(super) fn finish(taken: smallvec::SmallVec<[Taken<'_>; 4]>, results: &[Arc<Buffer>]) {
    for mut t in taken {
        *t.state = State::Realized(results[t.output].clone());
    }
}

/// After a failed run: gives each donated node back the buffer the plan did not take (a plan takes donated
/// buffers only once it can no longer fail, so all of them are still there), and unlocks it.
pub(super) fn restore(taken: smallvec::SmallVec<[Taken<'_>; 4]>, donated: &mut [Option<Buffer>]) {
    for mut t in taken {
        let buffer = donated[t.slot].take().unwrap_or_else(|| unreachable!("a failed run takes none"));
        *t.state = State::Realized(Arc::new(buffer));
    }
}
