//! Training past one process: a process group with collectives on tensors, data-parallel gradient averaging
//! (`DataParallel`) and a sampler that shards each epoch (`DistributedSampler`), as PyTorch's
//! `torch.distributed`, `DistributedDataParallel` and `DistributedSampler`.
//!
//! ```no_run
//! use kiln::distributed::{self, DataParallel, DistributedSampler};
//! use kiln::nn::{Linear, Module};
//! use kiln::optim::{Optimizer, Sgd};
//! # fn main() -> kiln::Result<()> {
//! let group = distributed::init()?; // under `mpirun -np 4`: rank 0..3 of 4; alone: rank 0 of 1
//! let dev: kiln::Device = "cpu".parse()?;
//! let model = Linear::new(64, 10, true, &dev);
//! let ddp = DataParallel::new(&group, model.params())?; // same shapes everywhere; rank 0's values everywhere
//! let mut opt = Sgd::new(model.params(), 0.1);
//! let sampler = DistributedSampler::new(1000, &group).seed(7);
//! for epoch in 0..3 {
//!     for batch in sampler.indices(epoch).chunks(16) {
//!         # let x = kiln::Tensor::randn([batch.len(), 64], kiln::DType::F32, &dev);
//!         let loss = model.forward(&x).square().mean_all();
//!         let grads = ddp.average(loss.backward()?, &[&loss])?; // the mean over every rank's batch
//!         opt.step(grads, &[])?;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! **Where the group comes from.** `init` reads the launcher's environment: under `mpirun` (Open MPI's
//! `OMPI_COMM_WORLD_SIZE`, MPICH's and Intel MPI's `PMI_SIZE`) it joins the MPI job, which needs kiln built with the
//! `mpi` feature; started alone it is a group of one process whose collectives return their input, so the same
//! program runs with and without a launcher. A launcher's environment in a build without `mpi` is an error, never
//! a silent group of one (each process would train alone). `WORLD_SIZE` > 1 without MPI (torchrun's variables) is
//! an error that says so: kiln's groups start over MPI.
//!
//! **Collectives** (`all_reduce`, `broadcast`, `all_gather`, `barrier`) take realized or lazy tensors on any device
//! and return new realized tensors on the same device; the data crosses through host memory, except on CUDA devices
//! in a build with the `nccl` feature: there NCCL moves it between the GPUs (`nccl.rs`; one communicator per device,
//! made at the first collective on it, its unique id sent over the group). Every rank must call
//! the same collectives in the same order with the same dtypes and shapes: each collective first checks that
//! (`mpi.rs`), and a difference is an error on every rank, naming what each passed. A rank that does not arrive
//! within the group's timeout (`set_timeout`, default 300 s; env `KILN_DIST_TIMEOUT` in seconds) fails the others
//! with `Error::RankTimeout` naming it; the group is unusable afterwards.
//!
//! Every dtype kiln has works: integer and float sums; bool all-reduce is a logical or; f16 and bf16 are summed in
//! f32 and rounded once; `Mean` is the sum divided by the world size (float dtypes only, as NCCL's average).
//!
//! Deliberately not done: overlapping the gradient all-reduce with the backward pass (PyTorch's DDP starts a
//! bucket's all-reduce as soon as its gradients exist; kiln's backward pass is one compiled plan, so the averaging
//! runs after it), sub-groups, point-to-point sends, and reduce ops other than sum, mean and or.

mod data_parallel;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod sampler;
mod wire;

pub use data_parallel::DataParallel;
pub use sampler::DistributedSampler;

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use kiln_jit::{DType, HostBuffer, Shape};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use wire::Wire;

/// A tensor's data in host memory: a CPU tensor's own buffer (no copy), another device's downloaded.
pub(crate) enum HostData {
    Shared(Arc<kiln_backends::Buffer>),
    Owned(HostBuffer),
}

impl std::ops::Deref for HostData {
    type Target = HostBuffer;
    fn deref(&self) -> &HostBuffer {
        match self {
            HostData::Shared(b) => match &**b {
                kiln_backends::Buffer::Host(h) => h,
                #[allow(unreachable_patterns)] // only with another device's feature on
                _ => unreachable!("host_of shares host buffers only"),
            },
            HostData::Owned(h) => h,
        }
    }
}

/// `t`'s data on the host, realizing it first.
pub(crate) fn host_of(t: &Tensor) -> Result<HostData> {
    let buffer = t.buffer()?;
    if matches!(&*buffer, kiln_backends::Buffer::Host(_)) {
        return Ok(HostData::Shared(buffer));
    }
    Ok(HostData::Owned(t.to_host()?))
}

/// How an all-reduce combines the ranks' tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum (logical or for bool).
    Sum,
    /// The sum divided by the world size (float dtypes).
    Mean,
}

/// The default time a rank waits for the others at a collective.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Words in a collective's arrival descriptor: sequence number, operation, dtype code, root, element count,
/// rank of the shape, the shape's hash, its first `DESC - 7` dims (more are covered by the hash).
pub(crate) const DESC: usize = 12;
pub(crate) type Desc = [u64; DESC];

/// The processes that train together (`torch.distributed`'s default group): a rank in `0..world_size`. Cloning
/// shares the group. The last clone dropped finalizes MPI, so keep one alive while collectives may run.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Inner>,
}

struct Inner {
    rank: usize,
    world: usize,
    state: Mutex<State>,
    /// NCCL communicators by CUDA device ordinal (made by `nccl::comm`, outside the state's lock: making one runs
    /// a collective).
    #[cfg(feature = "nccl")]
    nccl: Mutex<std::collections::HashMap<usize, Arc<kiln_backends::cuda::nccl::Comm>>>,
}

struct State {
    link: Link,
    /// Collectives started so far (each rank counts the same).
    seq: u64,
    timeout: Duration,
    /// Why the group stopped working, once it has.
    broken: Option<String>,
}

/// What carries the data.
enum Link {
    /// A world of one process: every collective returns its input.
    Single,
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiLink),
}

/// `op` on a tensor of `dtype`: a mean needs a float (as NCCL's average), refused before any data moves.
fn check_op(op: ReduceOp, dtype: DType) -> Result<()> {
    if op == ReduceOp::Mean && !dtype.is_float() {
        return Err(Error::Distributed {
            op: "all_reduce",
            message: format!("ReduceOp::Mean needs a float tensor, not {dtype} (use Sum)"),
        });
    }
    Ok(())
}

/// The environment variables launchers set, and what they say about the world size.
fn launcher_world() -> Option<(&'static str, String)> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"].into_iter().find_map(|k| std::env::var(k).ok().map(|v| (k, v)))
}

/// Only one MPI group per process: MPI is initialized once, and finalized when its group is dropped.
static STARTED: Mutex<Option<std::sync::Weak<Inner>>> = Mutex::new(None);

/// The process group of this job, from the launcher's environment (see the module doc): the MPI world under
/// `mpirun` (feature `mpi`), else a group of one. Calling it again while a group is alive returns that group; after
/// the group was dropped (MPI finalized) it is an error.
pub fn init() -> Result<ProcessGroup> {
    let mut started = STARTED.lock();
    if let Some(weak) = started.as_ref() {
        return match weak.upgrade() {
            Some(inner) => Ok(ProcessGroup { inner }),
            None => Err(Error::Distributed {
                op: "init",
                message: "the process group was dropped, which finalized MPI; MPI cannot start twice in one \
                          process: keep the group alive (clone it) for as long as the program communicates"
                    .into(),
            }),
        };
    }
    let group = match launcher_world() {
        Some((var, size)) => from_launcher(var, &size)?,
        None => {
            if let Ok(size) = std::env::var("WORLD_SIZE")
                && size.trim() != "1"
            {
                return Err(Error::Distributed {
                    op: "init",
                    message: format!(
                        "WORLD_SIZE={size} but no MPI launcher started this process: kiln's process groups start over \
                         MPI (start with `mpirun -np N`, feature `mpi`; CUDA tensors then move through NCCL with the \
                         `nccl` feature); torchrun-style groups without MPI are not supported"
                    ),
                });
            }
            ProcessGroup::single()
        }
    };
    *started = Some(Arc::downgrade(&group.inner));
    Ok(group)
}

#[cfg(feature = "mpi")]
fn from_launcher(_var: &str, _size: &str) -> Result<ProcessGroup> {
    let link = mpi::MpiLink::init()?;
    Ok(ProcessGroup::with_link(link.rank(), link.world(), Link::Mpi(link)))
}

#[cfg(not(feature = "mpi"))]
fn from_launcher(var: &str, size: &str) -> Result<ProcessGroup> {
    Err(Error::Distributed {
        op: "init",
        message: format!(
            "this process was started by an MPI launcher ({var}={size}), but kiln was built without its `mpi` \
             feature; rebuild with `--features mpi` (Debian: libopenmpi-dev openmpi-bin libclang-dev), or run \
             without mpirun to train in one process"
        ),
    })
}

/// The timeout from `KILN_DIST_TIMEOUT` (seconds, fractions allowed), else the default.
fn env_timeout() -> Duration {
    std::env::var("KILN_DIST_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64)
}

/// Operation codes in descriptors (and their names).
#[derive(Clone, Copy)]
enum Coll {
    AllReduce = 1,
    Broadcast = 2,
    AllGather = 3,
    Barrier = 4,
    Exchange = 5,
}

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::AllGather => "all_gather",
            Coll::Barrier => "barrier",
            Coll::Exchange => "exchange",
        }
    }

    fn from_code(code: u64) -> &'static str {
        [Coll::AllReduce, Coll::Broadcast, Coll::AllGather, Coll::Barrier, Coll::Exchange]
            .into_iter()
            .find(|c| *c as u64 == code)
            .map_or("?", Coll::name)
    }
}

/// What one rank passes to a collective, for the arrival check.
fn describe(seq: u64, coll: Coll, dtype: Option<DType>, root: usize, dims: &[usize]) -> Desc {
    let mut d = [0u64; DESC];
    d[0] = seq;
    d[1] = coll as u64;
    d[2] = dtype.map_or(0, DType::code);
    d[3] = root as u64;
    d[4] = dims.iter().product::<usize>() as u64;
    d[5] = dims.len() as u64;
    // FNV-1a over the dims: a difference past the first few listed ones still shows.
    d[6] = dims.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x0100_0000_01b3));
    for (slot, &x) in d[7..].iter_mut().zip(dims) {
        *slot = x as u64;
    }
    d
}

/// A descriptor in words: "all_reduce of f32 [128, 64]".
fn show(d: &Desc) -> String {
    let dtype = DType::from_code(d[2]).map_or("no data".to_string(), |t| t.to_string());
    let shown = (d[5] as usize).min(DESC - 7);
    let mut dims: Vec<String> = d[7..7 + shown].iter().map(u64::to_string).collect();
    if d[5] as usize > shown {
        dims.push("..".into());
    }
    let root = if d[1] == Coll::Broadcast as u64 { format!(" from rank {}", d[3]) } else { String::new() };
    format!("{} #{} of {dtype} [{}]{root}", Coll::from_code(d[1]), d[0], dims.join(", "))
}

impl ProcessGroup {
    /// A world of one process (rank 0 of 1): collectives return their input. What `init` gives without a launcher.
    pub fn single() -> ProcessGroup {
        ProcessGroup::with_link(0, 1, Link::Single)
    }

    fn with_link(rank: usize, world: usize, link: Link) -> ProcessGroup {
        let state = State { link, seq: 0, timeout: env_timeout(), broken: None };
        ProcessGroup {
            inner: Arc::new(Inner {
                rank,
                world,
                state: Mutex::new(state),
                #[cfg(feature = "nccl")]
                nccl: Mutex::new(Default::default()),
            }),
        }
    }

    /// This process's rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.inner.world
    }

    /// Whether this is rank 0 (the one that prints and writes checkpoints).
    pub fn is_root(&self) -> bool {
        self.inner.rank == 0
    }

    /// How long a collective waits for the other ranks before failing with `Error::RankTimeout`.
    pub fn timeout(&self) -> Duration {
        self.inner.state.lock().timeout
    }

    /// Sets the timeout (every rank should use the same one).
    pub fn set_timeout(&self, timeout: Duration) {
        self.inner.state.lock().timeout = timeout;
    }

    /// The element-wise sum (or mean) of `t` over every rank, on every rank: the same bits everywhere.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        check_op(op, t.dtype())?;
        #[cfg(feature = "nccl")]
        if let crate::Device::Cuda(d) = t.device() {
            return nccl::all_reduce(self, t, d.ordinal(), op);
        }
        self.reduce_to_tensor(host_of(t)?, t.shape().clone(), t.dtype(), t.device(), op)
    }

    /// The sum (or mean) of `host` over every rank as a realized tensor of `shape` on `device`.
    fn reduce_to_tensor(
        &self,
        host: HostData,
        shape: Shape,
        dtype: DType,
        device: crate::Device,
        op: ReduceOp,
    ) -> Result<Tensor> {
        let summed = self.all_reduce_host(vec![host], dtype, shape.dims())?;
        let out = Tensor::from_host(summed, shape, &device)?;
        if op == ReduceOp::Mean && self.world_size() > 1 {
            let mean = crate::no_grad(|| out.div(self.world_size() as f64));
            mean.realize()?;
            return Ok(mean);
        }
        Ok(out)
    }

    /// The element-wise sum over every rank of `parts` laid end to end (all of `dtype`): `all_reduce`'s work, and
    /// `DataParallel`'s buckets, which are assembled here from several gradients. `dims` is the shape the ranks
    /// compare (the parts' total element count). A single part of an MPI element type is summed where it lies if
    /// kiln owns it, else copied into the result piece by piece.
    pub(crate) fn all_reduce_host(&self, parts: Vec<HostData>, dtype: DType, dims: &[usize]) -> Result<HostBuffer> {
        let (single, combine) = match <[HostData; 1]>::try_from(parts) {
            Ok([HostData::Owned(h)]) => {
                let (wire, combine) = Wire::for_reduce_owned(h);
                (Err(wire), combine)
            }
            Ok([shared]) => {
                // Borrowed below, for the length of the collective.
                let keep = shared;
                return self.all_reduce_shared(&keep, dtype, dims);
            }
            Err(parts) => {
                // One buffer (pooled) for the bucket, each part copied in (converted where it must be).
                let total: usize = parts.iter().map(|p| p.len()).sum();
                let empty = HostBuffer::from_f64(dtype, &[]);
                let (first, combine) = wire::reduce_view(parts.first().map_or(&empty, |p| p));
                let mut all = match &first {
                    Ok(view) => view.empty_like(total),
                    Err(owned) => owned.as_ref().empty_like(total),
                };
                for p in &parts {
                    match wire::reduce_view(p).0 {
                        Ok(view) => all.extend(view)?,
                        Err(owned) => all.extend(owned.as_ref())?,
                    }
                }
                (Err(all), combine)
            }
        };
        self.run_all_reduce(single, combine, dtype, dims)
    }

    /// `all_reduce_host` of one buffer kiln does not own (a CPU tensor's).
    fn all_reduce_shared(&self, host: &HostBuffer, dtype: DType, dims: &[usize]) -> Result<HostBuffer> {
        let (view, combine) = wire::reduce_view(host);
        self.run_all_reduce(view, combine, dtype, dims)
    }

    fn run_all_reduce(
        &self,
        single: std::result::Result<wire::WireRef<'_>, Wire>,
        combine: wire::Combine,
        dtype: DType,
        dims: &[usize],
    ) -> Result<HostBuffer> {
        let desc = |seq| describe(seq, Coll::AllReduce, Some(dtype), 0, dims);
        let summed = self.collective(Coll::AllReduce, desc, |link| match (link, single) {
            (Link::Single, Ok(view)) => Ok(view.to_owned()),
            (Link::Single, Err(owned)) => Ok(owned),
            #[cfg(feature = "mpi")]
            (Link::Mpi(m), Ok(view)) => Ok(m.all_reduce(view, combine)),
            #[cfg(feature = "mpi")]
            (Link::Mpi(m), Err(owned)) => Ok(m.all_reduce_owned(owned, combine)),
        })?;
        let _ = combine;
        summed.into_host(dtype)
    }

    /// `all_reduce` that consumes `t`: where nothing else holds its buffer (a tensor just computed, not cloned),
    /// the sum is written over it and no new memory is taken (PyTorch's `dist.all_reduce` works in place the same
    /// way); otherwise it is `all_reduce`. A large result in new memory pays the first touch of every page, which
    /// costs more than the all-reduce on some hosts (`docs/distributed.md`).
    pub fn all_reduce_into(&self, t: Tensor, op: ReduceOp) -> Result<Tensor> {
        check_op(op, t.dtype())?;
        let (shape, dtype, device) = (t.shape().clone(), t.dtype(), t.device());
        t.realize()?;
        match t.into_unique_host() {
            Ok(h) => self.reduce_to_tensor(HostData::Owned(h), shape, dtype, device, op),
            Err(t) => self.all_reduce(&t, op),
        }
    }

    /// Rank `root`'s `t` on every rank (each passes a tensor of the same dtype and shape; the others' values are
    /// not read).
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.check_root("broadcast", root)?;
        #[cfg(feature = "nccl")]
        if let crate::Device::Cuda(d) = t.device() {
            return nccl::broadcast(self, t, d.ordinal(), root);
        }
        let wire = Wire::for_copy(t.to_host()?);
        let desc = |seq| describe(seq, Coll::Broadcast, Some(t.dtype()), root, t.dims());
        let wire = self.collective(Coll::Broadcast, desc, |link| match link {
            Link::Single => Ok(wire),
            #[cfg(feature = "mpi")]
            Link::Mpi(m) => {
                let mut wire = wire;
                m.broadcast(&mut wire, root);
                Ok(wire)
            }
        })?;
        Tensor::from_host(wire.into_host(t.dtype())?, t.shape().clone(), &t.device())
    }

    /// Every rank's `t`, stacked along a new first dim in rank order: shape `[world_size, ..t's dims]`
    /// (`all_gather_into_tensor` of a stack).
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        if t.numel().saturating_mul(self.world_size()) > i32::MAX as usize {
            return Err(Error::Distributed {
                op: "all_gather",
                message: format!(
                    "{} elements from each of {} ranks exceed MPI's count limit",
                    t.numel(),
                    self.world_size()
                ),
            });
        }
        #[cfg(feature = "nccl")]
        if let crate::Device::Cuda(d) = t.device() {
            return nccl::all_gather(self, t, d.ordinal());
        }
        let wire = Wire::for_copy(t.to_host()?);
        let desc = |seq| describe(seq, Coll::AllGather, Some(t.dtype()), 0, t.dims());
        let world = self.world_size();
        let gathered = self.collective(Coll::AllGather, desc, |link| match link {
            Link::Single => Ok(wire.repeated(world)),
            #[cfg(feature = "mpi")]
            Link::Mpi(m) => Ok(m.all_gather(&wire)),
        })?;
        let mut dims = vec![world];
        dims.extend_from_slice(t.dims());
        Tensor::from_host(gathered.into_host(t.dtype())?, Shape::from(dims), &t.device())
    }

    /// Waits until every rank has reached this call (or fails after the timeout, naming the ranks that did not).
    pub fn barrier(&self) -> Result<()> {
        let desc = |seq| describe(seq, Coll::Barrier, None, 0, &[]);
        self.collective(Coll::Barrier, desc, |_| Ok(()))
    }

    /// Every rank's `words`, end to end in rank order: a host-side all-gather for the group's own checks (the
    /// counts must agree; `DataParallel` compares parameter lists with it).
    pub(crate) fn exchange(&self, words: &[u64]) -> Result<Vec<u64>> {
        let desc = |seq| describe(seq, Coll::Exchange, Some(DType::I64), 0, &[words.len()]);
        let world = self.world_size();
        let wire = Wire::I64(words.iter().map(|&w| w as i64).collect());
        let out = self.collective(Coll::Exchange, desc, |link| match link {
            Link::Single => Ok(wire.repeated(world)),
            #[cfg(feature = "mpi")]
            Link::Mpi(m) => Ok(m.all_gather(&wire)),
        })?;
        match out {
            Wire::I64(v) => Ok(v.iter().map(|&w| w as u64).collect()),
            other => unreachable!("an i64 all-gather returned {}", other.kind()),
        }
    }

    fn check_root(&self, op: &'static str, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::Distributed {
                op,
                message: format!("root rank {root} is not in this group of {}", self.world_size()),
            });
        }
        Ok(())
    }

    /// Runs one collective: the arrival check (every rank's descriptor equal, within the timeout), then `run`.
    fn collective<R>(
        &self,
        coll: Coll,
        desc: impl FnOnce(u64) -> Desc,
        run: impl FnOnce(&mut Link) -> Result<R>,
    ) -> Result<R> {
        let op = coll.name();
        let mut state = self.inner.state.lock();
        if let Some(why) = &state.broken {
            return Err(Error::Distributed { op, message: format!("the process group is unusable: {why}") });
        }
        state.seq += 1;
        let (seq, timeout) = (state.seq, state.timeout);
        let mine = desc(seq);
        let all: Vec<Desc> = match &mut state.link {
            Link::Single => vec![mine],
            #[cfg(feature = "mpi")]
            Link::Mpi(m) => match m.arrive(&mine, timeout) {
                Ok(all) => all,
                Err(missing) => {
                    let err = Error::RankTimeout { op, seq, missing, timeout };
                    state.broken = Some(err.to_string());
                    return Err(err);
                }
            },
        };
        let _ = timeout;
        if all.iter().any(|d| *d != mine) {
            let views: Vec<String> = all.iter().enumerate().map(|(r, d)| format!("rank {r}: {}", show(d))).collect();
            return Err(Error::Distributed {
                op,
                message: format!(
                    "the ranks disagree on this collective (every rank must make the same calls with the same dtypes \
                     and shapes): {}",
                    views.join("; ")
                ),
            });
        }
        run(&mut state.link)
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessGroup(rank {} of {})", self.rank(), self.world_size())
    }
}
