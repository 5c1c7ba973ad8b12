//! Collectives on CUDA tensors through NCCL (feature `nccl`): the data stays on the GPUs. The group's own checks
//! run first as for every collective (every rank's call described and compared over the group's link, with its
//! timeout); then NCCL moves the data on the device's stream, ordered with the plans' launches.
//!
//! A communicator per CUDA device is made at the first collective on a tensor there: every rank says over the
//! group whether it can use NCCL, rank 0 creates the unique id, and every rank takes it from the exchange (the
//! MPI group's, or nothing to send in a group of one) before `ncclCommInitRank`. A rank without NCCL makes every
//! rank fail at that exchange with the ranks named, rather than leave the others waiting inside NCCL.
//!
//! f16 and bf16 all-reduces are summed in f32 and rounded once, as on the host path (NCCL would sum in the
//! narrow type); the cast kernels run on the GPU.

use super::{Coll, ProcessGroup, ReduceOp, describe};
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use kiln_backends::cuda::nccl::{self, Comm, ID_BYTES};
use kiln_jit::{DType, Shape};
use std::sync::Arc;

fn err(message: String) -> Error {
    Error::Distributed { op: "nccl", message }
}

/// The communicator of CUDA device `ordinal` in `group`, made on first use (see the module doc).
fn comm(group: &ProcessGroup, ordinal: usize) -> Result<Arc<Comm>> {
    if let Some(c) = group.inner.nccl.lock().get(&ordinal) {
        return Ok(c.clone());
    }
    let here = nccl::probe();
    let id = match (&here, group.is_root()) {
        (Ok(_), true) => nccl::unique_id(),
        _ => Ok([0; ID_BYTES]),
    };
    // Status word (0 ready; 1 no NCCL on this rank; 2 rank 0 could not create the id), then the id in 16 words.
    let status = match (&here, &id) {
        (Err(_), _) => 1,
        (_, Err(_)) => 2,
        _ => 0,
    };
    const WORDS: usize = 1 + ID_BYTES / 8;
    let mut words = vec![status];
    let id_bytes = id.as_ref().copied().unwrap_or([0; ID_BYTES]);
    words.extend(id_bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))));
    let all = group.exchange(&words)?;
    let failed: Vec<usize> = (0..group.world_size()).filter(|&r| all[r * WORDS] != 0).collect();
    if !failed.is_empty() {
        let mine = here.err().or(id.err()).map_or(String::new(), |e| format!("; this rank: {e}"));
        return Err(err(format!("NCCL cannot start on ranks {failed:?} (each says why in its own error){mine}")));
    }
    let mut id = [0u8; ID_BYTES];
    for (chunk, w) in id.chunks_exact_mut(8).zip(&all[1..WORDS]) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    let c = Arc::new(Comm::new(ordinal, group.rank(), group.world_size(), id).map_err(err)?);
    group.inner.nccl.lock().insert(ordinal, c.clone());
    Ok(c)
}

/// `ProcessGroup::all_reduce` of a tensor on CUDA device `ordinal`.
pub(super) fn all_reduce(group: &ProcessGroup, t: &Tensor, ordinal: usize, op: ReduceOp) -> Result<Tensor> {
    let comm = comm(group, ordinal)?;
    let dtype = t.dtype();
    let narrow = matches!(dtype, DType::F16 | DType::BF16);
    let src = if narrow { crate::no_grad(|| t.to_dtype(DType::F32)) } else { t.clone() };
    let buffer = src.buffer()?;
    let desc = |seq| describe(seq, Coll::AllReduce, Some(dtype), 0, t.dims());
    let summed = group.collective(Coll::AllReduce, desc, |_| Ok(comm.all_reduce(&buffer)?))?;
    let mut out = Tensor::from_buffer(Arc::new(summed), t.shape().clone(), t.device());
    // Rounded to the narrow type before a mean's division, as the host path rounds its sum.
    if narrow {
        out = crate::no_grad(|| out.to_dtype(dtype));
    }
    if op == ReduceOp::Mean && group.world_size() > 1 {
        out = crate::no_grad(|| out.div(group.world_size() as f64));
    }
    out.realize()?;
    Ok(out)
}

/// `ProcessGroup::broadcast` of a tensor on CUDA device `ordinal`.
pub(super) fn broadcast(group: &ProcessGroup, t: &Tensor, ordinal: usize, root: usize) -> Result<Tensor> {
    let comm = comm(group, ordinal)?;
    let buffer = t.buffer()?;
    let desc = |seq| describe(seq, Coll::Broadcast, Some(t.dtype()), root, t.dims());
    let out = group.collective(Coll::Broadcast, desc, |_| Ok(comm.broadcast(&buffer, root)?))?;
    Ok(Tensor::from_buffer(Arc::new(out), t.shape().clone(), t.device()))
}

/// `ProcessGroup::all_gather` of a tensor on CUDA device `ordinal`: shape `[world_size, ..t's dims]`.
pub(super) fn all_gather(group: &ProcessGroup, t: &Tensor, ordinal: usize) -> Result<Tensor> {
    let comm = comm(group, ordinal)?;
    let buffer = t.buffer()?;
    let desc = |seq| describe(seq, Coll::AllGather, Some(t.dtype()), 0, t.dims());
    let out = group.collective(Coll::AllGather, desc, |_| Ok(comm.all_gather(&buffer)?))?;
    let mut dims = vec![group.world_size()];
    dims.extend_from_slice(t.dims());
    Ok(Tensor::from_buffer(Arc::new(out), Shape::from(dims), t.device()))
}
