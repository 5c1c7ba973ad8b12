//! NCCL for the CUDA device (feature `nccl`): collectives between processes on device memory, for
//! `kiln::distributed`'s process groups when their tensors live on CUDA devices (one GPU per rank).
//!
//! NCCL is opened at run time as the other vendor libraries are (`KILN_NCCL` names a file, else `libnccl.so.2`,
//! the soname NVIDIA's packages and the `nvidia-nccl-cu12`/`-cu13` wheels ship, then `libnccl.so`), with its entry
//! points resolved once: nothing is linked at build time, and a machine without NCCL gets an error that says what
//! to install, never a panic (cudarc's NCCL bindings panic when the library is missing, and do not look for
//! `libnccl.so.2`, so kiln does not use them).
//!
//! A communicator is made from a unique id that one rank creates and every rank receives by another channel (the
//! MPI group's, in `kiln::distributed`), then `ncclCommInitRank` on each rank's device. Collectives are queued on
//! the device's one stream, so they are ordered with the plans' launches like any kernel, and the result is a new
//! device buffer. Every rank gets the same bits from an all-reduce (NCCL reduces each chunk once and passes the
//! result around).
//!
//! Compiled and its missing-library error checked in CI; not yet run on a GPU (NCCL refuses two ranks on one GPU,
//! so a one-GPU machine can run a world of one).

use super::{Ctx, DeviceBuffer, NAME, backend};
use crate::gpu::Driver;
use crate::{BackendError, Buffer};
use kiln_jit::DType;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// Bytes in a unique id (what the other ranks must receive).
pub const ID_BYTES: usize = 128;

type RawComm = *mut c_void;
type Status = c_int;

// ncclDataType_t and ncclRedOp_t values (nccl.h; stable since NCCL 2.0, bfloat16 since 2.10).
const NCCL_INT32: c_int = 2;
const NCCL_UINT8: c_int = 1;
const NCCL_UINT32: c_int = 3;
const NCCL_INT64: c_int = 4;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_FLOAT64: c_int = 8;
const NCCL_BFLOAT16: c_int = 9;
const NCCL_SUM: c_int = 0;
const NCCL_MAX: c_int = 2;

type Stream = *mut c_void;

struct Nccl {
    path: String,
    version: unsafe extern "C" fn(*mut c_int) -> Status,
    unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> Status,
    destroy: unsafe extern "C" fn(RawComm) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> Status,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, RawComm, Stream) -> Status,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, Stream) -> Status,
    _lib: Library,
}

/// What to install when NCCL is missing.
pub const INSTALL_HINT: &str = "install NCCL (Debian/Ubuntu: NVIDIA's libnccl2 package, libnccl.so.2; or `pip \
                                install nvidia-nccl-cu12` and put its nvidia/nccl/lib on LD_LIBRARY_PATH), or name \
                                the library with KILN_NCCL";

fn nccl() -> Result<&'static Nccl, String> {
    static LIB: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Nccl, String> {
    let (lib, path) = crate::dynlib::open("KILN_NCCL", &["libnccl.so.2", "libnccl.so"], "NCCL", INSTALL_HINT)?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: each field's type is the symbol's C signature from nccl.h.
            unsafe { crate::dynlib::sym(&lib, &path, $name) }
        };
    }
    Ok(Nccl {
        version: sym!("ncclGetVersion")?,
        unique_id: sym!("ncclGetUniqueId")?,
        init_rank: sym!("ncclCommInitRank")?,
        destroy: sym!("ncclCommDestroy")?,
        error_string: sym!("ncclGetErrorString")?,
        all_reduce: sym!("ncclAllReduce")?,
        broadcast: sym!("ncclBroadcast")?,
        all_gather: sym!("ncclAllGather")?,
        path,
        _lib: lib,
    })
}

impl Nccl {
    fn check(&self, status: Status, call: &str) -> Result<(), String> {
        crate::dynlib::check(status, call, self.error_string)
    }
}

/// NCCL's version (`2.21.5`), or why it cannot be used here.
pub fn probe() -> Result<String, String> {
    let lib = nccl()?;
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer.
    lib.check(unsafe { (lib.version)(&mut v) }, "ncclGetVersion")?;
    // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
    Ok(format!("{}.{}.{} ({})", v / 10000, v / 100 % 100, v % 100, lib.path))
}

/// A fresh unique id, for one rank to create and send to the others.
pub fn unique_id() -> Result<[u8; ID_BYTES], String> {
    let lib = nccl()?;
    let mut id = UniqueId { internal: [0; ID_BYTES] };
    // SAFETY: a valid out-pointer to a 128-byte id.
    lib.check(unsafe { (lib.unique_id)(&mut id) }, "ncclGetUniqueId")?;
    Ok(id.internal.map(|c| c as u8))
}

/// A communicator of one rank, on one CUDA device.
pub struct Comm {
    raw: RawComm,
    ctx: Arc<Ctx>,
    rank: usize,
    world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one collective at a time; `kiln::distributed` calls it
// under its group's lock.
unsafe impl Send for Comm {}
// SAFETY: as above: the lock serializes every use.
unsafe impl Sync for Comm {}

impl Comm {
    /// Joins the communicator `id` names as `rank` of `world`, on CUDA device `ordinal`. Every rank must call this
    /// (NCCL waits for all of them).
    pub fn new(ordinal: usize, rank: usize, world: usize, id: [u8; ID_BYTES]) -> Result<Comm, String> {
        let lib = nccl()?;
        let ctx = backend(ordinal).map_err(|e| e.to_string())?.ctx.clone();
        ctx.stream.context().bind_to_thread().map_err(|e| format!("making CUDA device {ordinal} current: {e}"))?;
        let id = UniqueId { internal: id.map(|b| b as c_char) };
        let mut raw: RawComm = std::ptr::null_mut();
        let (n, r) = (c_int::try_from(world), c_int::try_from(rank));
        let (Ok(n), Ok(r)) = (n, r) else { return Err(format!("rank {rank} of {world}: past NCCL's int")) };
        // SAFETY: a valid out-pointer; the id is the one every rank received; the device is current.
        lib.check(unsafe { (lib.init_rank)(&mut raw, n, id, r) }, "ncclCommInitRank")?;
        Ok(Comm { raw, ctx, rank, world })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// The device memory of `b`, checked to be this communicator's device.
    fn mem<'b>(&self, b: &'b Buffer) -> Result<&'b DeviceBuffer, BackendError> {
        match Ctx::unwrap(b) {
            Some(m) if self.ctx.owns(m) => Ok(m),
            _ => Err(BackendError::ForeignBuffer { device: NAME }),
        }
    }

    /// Runs one collective into a fresh buffer of `out_len` elements of `b`'s dtype.
    fn run(
        &self,
        b: &Buffer,
        out_len: usize,
        call: &str,
        f: impl FnOnce(&Nccl, *const c_void, *mut c_void, c_int, Stream) -> Status,
    ) -> Result<Buffer, BackendError> {
        let err = |reason: String| BackendError::Execute { device: NAME, reason };
        let lib = nccl().map_err(err)?;
        let src = self.mem(b)?;
        let dtype = b.dtype();
        let out = self.ctx.alloc(dtype, out_len)?;
        self.ctx.stream.context().bind_to_thread().map_err(|e| err(format!("making the device current: {e}")))?;
        let status =
            f(lib, Ctx::addr(src) as *const c_void, Ctx::addr(&out) as *mut c_void, nccl_type(dtype), self.stream());
        lib.check(status, call).map_err(err)?;
        Ok(Ctx::wrap(out))
    }

    fn stream(&self) -> Stream {
        self.ctx.stream.cu_stream() as Stream
    }

    /// The element-wise sum over every rank of `b` (bool: logical or), on every rank. f16 and bf16 are summed in
    /// their own precision by NCCL: `kiln::distributed` sums them in f32 (casting first) to match its MPI path.
    pub fn all_reduce(&self, b: &Buffer) -> Result<Buffer, BackendError> {
        let (len, op) = (b.len(), if b.dtype() == DType::Bool { NCCL_MAX } else { NCCL_SUM });
        self.run(b, len, "ncclAllReduce", |lib, src, dst, ty, stream| {
            // SAFETY: `src` and `dst` are this device's buffers of `len` elements of the dtype `ty` names; the
            // stream is the device's; every rank queues the same collective (checked by the group before).
            unsafe { (lib.all_reduce)(src, dst, len, ty, op, self.raw, stream) }
        })
    }

    /// Rank `root`'s `b` on every rank.
    pub fn broadcast(&self, b: &Buffer, root: usize) -> Result<Buffer, BackendError> {
        let len = b.len();
        let root = c_int::try_from(root).unwrap_or(c_int::MAX);
        self.run(b, len, "ncclBroadcast", |lib, src, dst, ty, stream| {
            // SAFETY: as in `all_reduce`; `root` is a rank of this communicator (the group checked it).
            unsafe { (lib.broadcast)(src, dst, len, ty, root, self.raw, stream) }
        })
    }

    /// Every rank's `b`, end to end in rank order.
    pub fn all_gather(&self, b: &Buffer) -> Result<Buffer, BackendError> {
        let len = b.len();
        self.run(b, len * self.world, "ncclAllGather", |lib, src, dst, ty, stream| {
            // SAFETY: `src` holds `len` elements and `dst` `len * world` of the dtype `ty` names, on this device.
            unsafe { (lib.all_gather)(src, dst, len, ty, self.raw, stream) }
        })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Ok(lib) = nccl() {
            // SAFETY: created by ncclCommInitRank, destroyed once; queued collectives finish first (NCCL waits).
            unsafe { (lib.destroy)(self.raw) };
        }
    }
}

/// NCCL's type for kiln's storage of `dtype` (bool as bytes: its all-reduce is a max, a logical or of 0 and 1).
fn nccl_type(dtype: DType) -> c_int {
    match dtype {
        DType::Bool | DType::U8 => NCCL_UINT8,
        DType::U32 => NCCL_UINT32,
        DType::I32 => NCCL_INT32,
        DType::I64 => NCCL_INT64,
        DType::F16 => NCCL_FLOAT16,
        DType::BF16 => NCCL_BFLOAT16,
        DType::F32 => NCCL_FLOAT32,
        DType::F64 => NCCL_FLOAT64,
    }
}
