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
//! **All-reduce in place, in 1 MiB pieces.** One `MPI_Allreduce` over 10 M f32 ran at 20-34 % of a memcpy's
//! bandwidth here; the same data in 1 MiB pieces (each fits in L2 while it is summed) at 57-72 %, in place
//! (`MPI_IN_PLACE`); with separate send and receive buffers 25-46 % (Open MPI 4.1, two ranks on two cores;
//! `docs/distributed.md`). rsmpi does not export `MPI_IN_PLACE` (a macro, `((void *) 1)` in Open MPI and
//! `(void *) -1` in MPICH and its derivatives, both fixed by their ABIs), so `init` takes it from the library's
//! version string; another library gets separate buffers. Data kiln owns (a bucket it assembled, converted
//! elements) is summed where it is; a borrowed tensor buffer is copied piece by piece into the result, each piece
//! summed while it is in cache.

use super::wire::{Combine, Pooled, Wire, WireRef};
use super::{DESC, Desc};
use crate::error::{Error, Result};
use kiln_jit::HostVec;
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
    /// The library's `MPI_IN_PLACE`, where it is known (see the module doc).
    in_place: Option<*mut c_void>,
}

/// `MPI_IN_PLACE` of the library that `version` (`MPI_Get_library_version`) names, if it is one whose value is known.
fn in_place_of(version: &str) -> Option<*mut c_void> {
    if version.starts_with("Open MPI") {
        Some(std::ptr::without_provenance_mut(1))
    } else if ["MPICH", "Intel(R) MPI", "MVAPICH", "CRAY MPICH"].iter().any(|n| version.contains(n)) {
        Some(std::ptr::without_provenance_mut(usize::MAX))
    } else {
        None
    }
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
        let in_place = mpi::environment::library_version().ok().and_then(|v| in_place_of(&v));
        Ok(MpiLink { comm: Some(comm), universe: Some(universe), rank, world, broken: false, in_place })
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
    /// The element-wise combination of every rank's `data` (same length everywhere: the arrival check saw to it),
    /// into a new buffer.
    pub(crate) fn all_reduce(&mut self, data: WireRef<'_>, combine: Combine) -> Wire {
        let r = Reducer { comm: self.comm(), in_place: self.in_place, combine };
        match data {
            WireRef::U8(v) => Wire::U8(r.copy(v)),
            WireRef::U16(v) => Wire::U16(r.copy(v)),
            WireRef::U32(v) => Wire::U32(r.copy(v)),
            WireRef::I32(v) => Wire::I32(r.copy(v)),
            WireRef::I64(v) => Wire::I64(r.copy(v)),
            WireRef::F32(v) => Wire::F32(r.copy(v)),
            WireRef::F64(v) => Wire::F64(r.copy(v)),
        }
    }

    /// As `all_reduce`, summing `data` where it is.
    pub(crate) fn all_reduce_owned(&mut self, mut data: Wire, combine: Combine) -> Wire {
        let r = Reducer { comm: self.comm(), in_place: self.in_place, combine };
        match &mut data {
            Wire::U8(v) => r.own(v),
            Wire::U16(v) => r.own(v),
            Wire::U32(v) => r.own(v),
            Wire::I32(v) => r.own(v),
            Wire::I64(v) => r.own(v),
            Wire::F32(v) => r.own(v),
            Wire::F64(v) => r.own(v),
        }
        data
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

/// Sums in pieces of `PIECE_BYTES` (see the module doc).
struct Reducer<'a> {
    comm: &'a SimpleCommunicator,
    in_place: Option<*mut c_void>,
    combine: Combine,
}

impl Reducer<'_> {
    fn op(&self) -> SystemOperation {
        match self.combine {
            Combine::Sum => SystemOperation::sum(),
            Combine::Or => SystemOperation::logical_or(),
        }
    }

    fn piece<T>() -> usize {
        (PIECE_BYTES / size_of::<T>()).max(1)
    }

    /// The combination of every rank's `data`, in a new buffer.
    fn copy<T: Equivalence + Copy + Default + Pooled>(&self, data: &[T]) -> HostVec<T> {
        if self.in_place.is_some() {
            // Each piece is copied (which brings it into cache, where the in-place sum finds it) and summed before
            // the next: one pass over the result's memory, not a zeroing, a copy and a sum. The memory comes from
            // kiln's host-buffer pool where it can.
            let mut out = T::pooled(data.len());
            for src in data.chunks(Self::piece::<T>()) {
                let start = out.len();
                out.extend_from_slice(src);
                self.in_place_piece(&mut out[start..]);
            }
            return out;
        }
        let mut out = HostVec::filled(data.len(), T::default());
        for (src, dst) in data.chunks(Self::piece::<T>()).zip(out.chunks_mut(Self::piece::<T>())) {
            self.comm.all_reduce_into(src, dst, self.op());
        }
        out
    }

    /// The combination of every rank's `data`, written over it.
    fn own<T: Equivalence + Copy + Default + Pooled>(&self, data: &mut [T]) {
        if self.in_place.is_none() {
            let summed = self.copy(data);
            data.copy_from_slice(&summed);
            return;
        }
        for piece in data.chunks_mut(Self::piece::<T>()) {
            self.in_place_piece(piece);
        }
    }

    fn in_place_piece<T: Equivalence>(&self, piece: &mut [T]) {
        let Some(in_place) = self.in_place else { unreachable!("only called with MPI_IN_PLACE known") };
        // SAFETY: `in_place` is this library's MPI_IN_PLACE (`in_place_of`), with which MPI reads and writes only
        // `piece`: `piece.len()` (below 2^31: pieces are 1 MiB) elements of T's MPI datatype; the communicator is
        // this link's.
        unsafe {
            ffi::MPI_Allreduce(
                in_place,
                piece.as_mut_ptr().cast::<c_void>(),
                piece.len() as i32,
                T::equivalent_datatype().as_raw(),
                self.op().as_raw(),
                self.comm.as_raw(),
            );
        }
    }
}

fn broadcast_pieces<T: Equivalence>(root: &mpi::topology::Process<'_>, data: &mut [T]) {
    // Pieces keep each call's count far below MPI's i32 limit.
    for piece in data.chunks_mut(1 << 28) {
        root.broadcast_into(piece);
    }
}

fn gather<T: Equivalence + Copy + Default>(comm: &SimpleCommunicator, data: &[T], world: usize) -> HostVec<T> {
    let mut out = HostVec::filled(data.len() * world, T::default());
    if !data.is_empty() {
        comm.all_gather_into(data, &mut out[..]);
    }
    out
}
