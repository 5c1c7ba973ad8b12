//! `kiln-backends`: the devices kiln runs on, one module per device.
//!
//! Owns: device memory (`Buffer`), turning a graph (later: rendered kernels) into something runnable on a device
//! (`Backend::compile` -> `Executable`), running it, host <-> device copies, the device fingerprint that keys
//! caches, and each device's tuning (its search space, cost model and timed runs; `kiln-autotune` only searches and
//! stores). Each device is a cargo feature; `cpu` is the default and needs nothing installed, and any one of them
//! builds alone. What the `kiln` crate asks of one device goes through [`Backend`]; what it asks of all of them at
//! once (counters, warm-up, the profile) through [`runtime`], so it never names a device's module for either.
//!
//! Must not know: the user-facing `Tensor` API, autograd, or how the plan cache is keyed.
//!
//! A backend never hands work to another device: if a device cannot run a graph, `compile` returns an error.

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dump;
mod dynlib;
pub mod gemm_check;
#[cfg(any(feature = "cuda", feature = "hip", feature = "host-gpu"))]
mod gpu;
#[cfg(feature = "host-gpu")]
pub use gpu::host::{HostGpu, HostMem};
#[cfg(any(feature = "cuda", feature = "hip", feature = "host-gpu"))]
pub use gpu::plan::graph_counts;
#[cfg(any(feature = "cuda", feature = "hip", feature = "host-gpu"))]
pub use gpu::tune::tune_records as gpu_tune_records;
pub mod gpu_cache;
pub mod gpu_check;
pub mod gpu_gemm;
pub mod gpu_library;
#[cfg(feature = "hip")]
pub mod hip;
pub mod host_pool;
mod plan_run;
mod profile;
pub mod rtc;
pub mod runtime;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use kiln_autotune::{Mode, TuneRecord};

/// The pool bucket (bytes) of a device buffer of `bytes` (the wgpu, CUDA and HIP devices' pools): powers of two up to
/// 1 MiB, then whole MiB; at least 256. At most 2x the size for small buffers and under 1 MiB more for large ones,
/// while a replayed plan's buffers of nearby sizes share buckets.
#[cfg(any(feature = "wgpu", feature = "cuda", feature = "hip"))]
pub(crate) fn pool_bucket(bytes: usize) -> usize {
    const MIB: usize = 1 << 20;
    if bytes <= MIB { bytes.max(256).next_power_of_two() } else { bytes.div_ceil(MIB) * MIB }
}

#[cfg(all(test, any(feature = "wgpu", feature = "cuda", feature = "hip")))]
#[test]
fn pool_buckets_grow_by_powers_of_two_then_whole_mebibytes() {
    assert_eq!(pool_bucket(0), 256);
    assert_eq!(pool_bucket(300), 512);
    assert_eq!(pool_bucket(1 << 20), 1 << 20);
    assert_eq!(pool_bucket((1 << 20) + 1), 2 << 20);
}
use kiln_jit::kernel::Donation;
use kiln_jit::{Graph, HostBuffer, RngKey};

/// Memory owned by one device.
#[derive(Debug)]
pub enum Buffer {
    /// Host memory: the CPU backend's buffers, and what every device's `upload` takes and `download` returns (so it
    /// exists in every build, the CPU's feature on or not).
    Host(HostBuffer),
    /// Memory on the wgpu device (returned to its pool on drop).
    #[cfg(feature = "wgpu")]
    Wgpu(wgpu::DeviceBuffer),
    /// Memory on a CUDA device (returned to its pool on drop).
    #[cfg(feature = "cuda")]
    Cuda(cuda::DeviceBuffer),
    /// Memory on a HIP device (returned to its pool on drop).
    #[cfg(feature = "hip")]
    Hip(hip::DeviceBuffer),
    /// Memory of the GPU plan's host stand-in (feature `host-gpu`, for tests).
    #[cfg(feature = "host-gpu")]
    HostGpu(gpu::host::HostMem),
}

impl Drop for Buffer {
    fn drop(&mut self) {
        match self {
            Buffer::Host(h) => host_pool::give(std::mem::replace(h, HostBuffer::U8(kiln_jit::HostVec::new()))),
            #[cfg(feature = "wgpu")]
            Buffer::Wgpu(_) => {} // the device buffer returns itself to its pool
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => {} // likewise
            #[cfg(feature = "hip")]
            Buffer::Hip(_) => {}
            #[cfg(feature = "host-gpu")]
            Buffer::HostGpu(_) => {}
        }
    }
}

impl Buffer {
    pub fn dtype(&self) -> kiln_jit::DType {
        match self {
            Buffer::Host(h) => h.dtype(),
            #[cfg(feature = "wgpu")]
            Buffer::Wgpu(d) => d.dtype(),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(d) => d.dtype(),
            #[cfg(feature = "hip")]
            Buffer::Hip(d) => d.dtype(),
            #[cfg(feature = "host-gpu")]
            Buffer::HostGpu(d) => d.dtype(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buffer::Host(h) => h.len(),
            #[cfg(feature = "wgpu")]
            Buffer::Wgpu(d) => d.len(),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(d) => d.len(),
            #[cfg(feature = "hip")]
            Buffer::Hip(d) => d.len(),
            #[cfg(feature = "host-gpu")]
            Buffer::HostGpu(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{device}: cannot compile graph: {reason}")]
    Compile { device: &'static str, reason: String },
    #[error("{device}: execution failed: {reason}")]
    Execute { device: &'static str, reason: String },
    #[error("{device}: buffer belongs to another device")]
    ForeignBuffer { device: &'static str },
    /// The device cannot hold or run something (a dtype it has no type for).
    #[error("{device}: {reason}")]
    Unsupported { device: &'static str, reason: String },
    /// A kernel found the data wrong while it ran (an index out of range: `kiln_jit::kernel::Fault`); the run's
    /// outputs are discarded, and no input was written over.
    #[error("{device}: {fault}")]
    Fault { device: &'static str, fault: kiln_jit::kernel::Fault },
    /// The device is not there (no adapter, no driver); the reason says what to install.
    #[error("{device} is unavailable: {reason}")]
    Unavailable { device: &'static str, reason: String },
}

/// A compiled graph, ready to run many times.
pub trait Executable: Send + Sync {
    /// Runs with `inputs[slot]` bound to `Input { slot }` and `rng[slot]` to `Rand { slot }`; returns the graph's
    /// outputs in order.
    fn run(&self, inputs: &[&Buffer], rng: &[RngKey]) -> Result<Vec<Buffer>, BackendError> {
        self.run_donating(inputs, &mut [], rng)
    }

    /// The outputs this plan can write over an input's buffer (`kiln_jit::kernel::Donation`: the plan computes
    /// the same values either way). Empty where the backend does not donate.
    fn donations(&self) -> &[Donation] {
        &[]
    }

    /// `run`, given by value the buffers of the input slots the caller will never read again: `donated[slot]`
    /// (`inputs[slot]` is then a placeholder and is not read). Only slots named in `donations()` may be given;
    /// each one given is taken and becomes its output's buffer, and one not taken (an error before any launch)
    /// is left in `donated` for the caller to restore. A plan that donates nothing refuses any buffer given.
    fn run_donating(
        &self,
        inputs: &[&Buffer],
        donated: &mut [Option<Buffer>],
        rng: &[RngKey],
    ) -> Result<Vec<Buffer>, BackendError>;
}

/// One device.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError>;
    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError>;
    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError>;
    /// Waits until all work submitted so far has finished (a no-op where runs are synchronous, as on the CPU).
    fn synchronize(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Overrides `KILN_AUTOTUNE` for the kernels this device tunes from now on (`None` restores it): `kiln tune`
    /// searches in the mode it is given, whatever the environment says. A device without an override ignores it
    /// (the default), and its searches follow `KILN_AUTOTUNE`.
    fn set_autotune_mode(&self, mode: Option<Mode>) {
        let _ = mode;
    }

    /// Takes the tuning record of the kernel this device chose last (searched, or reused from the store), since the
    /// previous call: for `kiln tune`'s report. `None` when there is none (the default: a device that tunes
    /// nothing).
    fn take_last_tune_record(&self) -> Option<TuneRecord> {
        None
    }
}
