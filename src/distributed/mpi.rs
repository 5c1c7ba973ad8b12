//! The MPI link of a process group (feature `mpi`): rsmpi over the system's MPI library, one duplicated
//! communicator of `MPI_COMM_WORLD` (so kiln's messages never match a user's own MPI traffic).
//!
//! **Arrival check before every collective.** A blocking MPI collective waits forever for a rank that died or
//! hangs, and one whose buffers differ between ranks is undefined (garbage, a truncation error, an abort). So each
//! collective starts with every rank sending a small descriptor of what it is about to do (`Desc`: sequence
//! number, operation, dtype, element count, shape) to every other rank and receiving theirs, non-blocking, polled
//! until all have arrived or the group's timeout has passed. A timeout names the ranks whose descriptor never came;
//! differing descriptors are an error on every rank alike (each sees all of them). Only then does the collective
//! itself run, blocking: Open MPI's blocking all-reduce was 2.5x faster than its non-blocking one on 2 ranks here
//! (`MPI_Iallreduce` polled with `MPI_Test`: 43 against 17 ms for 10 M f32), and once every rank has arrived only a
//! rank dying *during* the transfer can stall it, which the launcher handles (mpirun aborts the job when a rank
//! dies: `tests/distributed.rs` kills one).
//!
//! The check costs `2 (world - 1)` messages of 96 bytes per rank and collective: ~1 µs at two ranks, against the
//! `log2(world)` rounds an all-gather would take; past a few dozen ranks a tree-shaped check would be cheaper (not
//! done). A timed-out check leaves its requests pending, so their buffers are leaked and the group is unusable: the
//! process then exits without `MPI_Finalize`, which makes mpirun end the job's other processes.
//!
//! **All-reduce in 1 MiB pieces.** One `MPI_Allreduce` over 10 M f32 ran at 34 % of a memcpy's bandwidth here;
//! the same data in 1 MiB pieces (each fits in L2 while it is summed) at 59-72 % (Open MPI 4.1, two ranks on two
//! cores; `docs/distributed.md`).

use super::wire::{Combine, Wire};
use super::{DESC, Desc};
use crate::error::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Bytes per all-reduce piece (see the module doc).
const PIECE_BYTES: usize = 1 << 20;
/// The tag of arrival descriptors on kiln's communicator.
const ARRIVE_TAG: i32 = 0x6b69;

pub(crate) struct MpiLink {
    /// Dropped before `universe` (`MPI_Comm_free` must precede `MPI_Finalize`).
    comm: Option<SimpleCommunicator>,
    universe: Option<Universe>,
    rank: usize,
    world: usize,
    /// Set by a timed-out arrival check: pending requests point into leaked buffers, so MPI must not be finalized.
    broken: bool,
}

impl MpiLink {
    /// Initializes MPI (serialized threading: the group's lock orders every call) and duplicates the world.
    pub(crate) fn init() -> Result<MpiLink> {
        let fail = |message: String| Error::Distributed { op: "init", message };
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| fail("MPI was initialized already in this process (by kiln or by other code)".into()))?;
        if threading < mpi::Threading::Serialized {
            return Err(fail(format!(
                "the MPI library offers only {threading:?} threading; kiln needs Serialized (one call at a time from \
                 any thread)"
            )));
        }
        let comm = universe.world().duplicate();
        let (rank, world) = (comm.rank() as usize, comm.size() as usize);
        Ok(MpiLink { comm: Some(comm), universe: Some(universe), rank, world, broken: false })
    }

    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn world(&self) -> usize {
        self.world
    }

    fn comm(&self) -> &SimpleCommunicator {
        self.comm.as_ref().expect("the communicator lives until drop")
    }

    /// Every rank's descriptor (index = rank), once all have arrived; `Err(missing ranks)` after `timeout`.
    pub(crate) fn arrive(&mut self, mine: &Desc, timeout: Duration) -> std::result::Result<Vec<Desc>, Vec<usize>> {
        let world = self.world;
        let raw_comm = self.comm().as_raw();
        // Boxed so the buffers stay put while requests point at them, and can be leaked on a timeout.
        let send: Box<Desc> = Box::new(*mine);
        let mut recv: Box<[Desc]> = vec![[0u64; DESC]; world].into_boxed_slice();
        // SAFETY: reading an immutable handle constant the MPI library exports.
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        // (peer, is a receive, request): MPI_Test sets a finished request to MPI_REQUEST_NULL.
        let mut requests: Vec<(usize, bool, ffi::MPI_Request)> = Vec::with_capacity(2 * world);
        for peer in (0..world).filter(|&p| p != self.rank) {
            // SAFETY: `send` and `recv[peer]` are heap buffers of DESC u64s that outlive the requests: they are
            // completed below, or leaked with the requests on a timeout. `raw_comm` is this link's communicator.
            unsafe {
                let mut rq = null;
                ffi::MPI_Irecv(
                    recv[peer].as_mut_ptr().cast::<c_void>(),
                    DESC as i32,
                    u64::equivalent_datatype().as_raw(),
                    peer as i32,
                    ARRIVE_TAG,
                    raw_comm,
                    &mut rq,
                );
                requests.push((peer, true, rq));
                let mut rq = null;
                ffi::MPI_Isend(
                    send.as_ptr().cast::<c_void>(),
                    DESC as i32,
                    u64::equivalent_datatype().as_raw(),
                    peer as i32,
                    ARRIVE_TAG,
                    raw_comm,
                    &mut rq,
                );
                requests.push((peer, false, rq));
            }
        }
        recv[self.rank] = *mine;
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let mut pending = 0;
            for (_, _, rq) in requests.iter_mut() {
                if *rq == null {
                    continue;
                }
                let mut flag = 0;
                // SAFETY: `rq` is a live request of this link (MPI_Test sets it to MPI_REQUEST_NULL when done).
                unsafe { ffi::MPI_Test(rq, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if flag == 0 {
                    pending += 1;
                }
            }
            if pending == 0 {
                return Ok(recv.into_vec());
            }
            if start.elapsed() >= timeout {
                let mut missing: Vec<usize> = requests
                    .iter()
                    .filter(|(_, is_recv, rq)| *is_recv && *rq != null)
                    .map(|(peer, _, _)| *peer)
                    .collect();
                missing.sort_unstable();
                missing.dedup();
                // The pending requests may still write into `recv` or read `send` if a late rank shows up.
                std::mem::forget(send);
                std::mem::forget(recv);
                self.broken = true;
                return Err(missing);
            }
            // Spin briefly (a collective's peers usually arrive within microseconds), then back off so a long wait
            // for a slow rank does not burn a core its own kernels could use.
            polls += 1;
            if polls > 2000 {
                std::thread::sleep(Duration::from_micros(if polls > 20_000 { 500 } else { 50 }));
            } else if polls > 200 {
                std::thread::yield_now();
            }
        }
    }

    /// The element-wise combination of every rank's `data` (same length everywhere: the arrival check saw to it).
    pub(crate) fn all_reduce(&mut self, data: Wire, combine: Combine) -> Wire {
        let comm = self.comm();
        match data {
            Wire::U8(v) => Wire::U8(reduce_pieces(comm, &v, combine)),
            Wire::U16(v) => Wire::U16(reduce_pieces(comm, &v, combine)),
            Wire::U32(v) => Wire::U32(reduce_pieces(comm, &v, combine)),
            Wire::I32(v) => Wire::I32(reduce_pieces(comm, &v, combine)),
            Wire::I64(v) => Wire::I64(reduce_pieces(comm, &v, combine)),
            Wire::F32(v) => Wire::F32(reduce_pieces(comm, &v, combine)),
            Wire::F64(v) => Wire::F64(reduce_pieces(comm, &v, combine)),
        }
    }

    /// `root`'s `data` on every rank.
    pub(crate) fn broadcast(&mut self, data: &mut Wire, root: usize) {
        let root = self.comm().process_at_rank(root as i32);
        match data {
            Wire::U8(v) => broadcast_pieces(&root, v),
            Wire::U16(v) => broadcast_pieces(&root, v),
            Wire::U32(v) => broadcast_pieces(&root, v),
            Wire::I32(v) => broadcast_pieces(&root, v),
            Wire::I64(v) => broadcast_pieces(&root, v),
            Wire::F32(v) => broadcast_pieces(&root, v),
            Wire::F64(v) => broadcast_pieces(&root, v),
        }
    }

    /// Every rank's `data` end to end, in rank order.
    pub(crate) fn all_gather(&mut self, data: &Wire) -> Wire {
        let (comm, world) = (self.comm(), self.world);
        match data {
            Wire::U8(v) => Wire::U8(gather(comm, v, world)),
            Wire::U16(v) => Wire::U16(gather(comm, v, world)),
            Wire::U32(v) => Wire::U32(gather(comm, v, world)),
            Wire::I32(v) => Wire::I32(gather(comm, v, world)),
            Wire::I64(v) => Wire::I64(gather(comm, v, world)),
            Wire::F32(v) => Wire::F32(gather(comm, v, world)),
            Wire::F64(v) => Wire::F64(gather(comm, v, world)),
        }
    }
}

// SAFETY: MPI is initialized with MPI_THREAD_SERIALIZED, which allows calls from any thread one at a time; the link
// lives inside the process group's mutex, which makes every call from one thread at a time.
unsafe impl Send for MpiLink {}

impl Drop for MpiLink {
    fn drop(&mut self) {
        if self.broken {
            // Requests into leaked buffers are pending: freeing the communicator or finalizing would wait for
            // ranks that are gone. The process exits without MPI_Finalize, and mpirun ends the others.
            std::mem::forget(self.comm.take());
            std::mem::forget(self.universe.take());
        } else {
            drop(self.comm.take());
            drop(self.universe.take());
        }
    }
}

fn reduce_pieces<T: Equivalence + Copy + Default>(comm: &SimpleCommunicator, data: &[T], combine: Combine) -> Vec<T> {
    let mut out = vec![T::default(); data.len()];
    let piece = (PIECE_BYTES / size_of::<T>()).max(1);
    for (src, dst) in data.chunks(piece).zip(out.chunks_mut(piece)) {
        match combine {
            Combine::Sum => comm.all_reduce_into(src, dst, SystemOperation::sum()),
            Combine::Or => comm.all_reduce_into(src, dst, SystemOperation::logical_or()),
        }
    }
    out
}

fn broadcast_pieces<T: Equivalence>(root: &mpi::topology::Process<'_>, data: &mut [T]) {
    // Pieces keep each call's count far below MPI's i32 limit.
    for piece in data.chunks_mut(1 << 28) {
        root.broadcast_into(piece);
    }
}

fn gather<T: Equivalence + Copy + Default>(comm: &SimpleCommunicator, data: &[T], world: usize) -> Vec<T> {
    let mut out = vec![T::default(); data.len() * world];
    if !data.is_empty() {
        comm.all_gather_into(data, &mut out[..]);
    }
    out
}
