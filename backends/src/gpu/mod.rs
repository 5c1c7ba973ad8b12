//! What the C-like GPU devices (CUDA, HIP) share above their drivers: the layout of elements in device memory
//! ([`to_bytes`], [`from_bytes`]) and the compiled plan ([`plan`]), written once against [`Driver`], the few calls
//! in which the CUDA driver API and the HIP runtime differ (allocate, copy, load a code object, launch, a vendor
//! library's GEMM: `gpu_library`). Both
//! devices schedule and render through `gpu_cache` (the shared renderer's two dialects) and keep their compiled
//! code in its stores.

#[cfg(feature = "host-gpu")]
pub mod host;
pub mod plan;
pub mod tune;

use crate::{BackendError, Buffer};
use kiln_jit::render::cuda::{Flavor, GpuKernel, Workspace};
use kiln_jit::{DType, HostBuffer, HostVec};
use std::sync::Arc;

/// One GPU device's driver, as the shared plan uses it. Addresses are 64-bit device pointers (`CUdeviceptr`,
/// `hipDeviceptr_t`), passed to kernels by value.
pub(crate) trait Driver: Send + Sync + Sized + 'static {
    /// The device's name in errors (`cuda`, `hip`).
    const NAME: &'static str;
    /// The dialect its kernels are rendered in.
    const FLAVOR: Flavor;
    /// Device memory for some elements, returned to the device's pool on drop.
    type Mem: Send + Sync;
    /// A loaded kernel.
    type Function: Send + Sync;

    /// The architecture kernels are compiled for (`sm_90`, `gfx90a`).
    fn arch(&self) -> &str;
    /// The GPU's name as its driver reports it (`NVIDIA H200`): with the architecture, what tuning records are
    /// valid for.
    fn model(&self) -> String;
    /// What else tuning records measured here depend on (multiprocessors, driver and compiler versions).
    fn tuning_features(&self) -> Vec<String> {
        Vec::new()
    }
    fn wrap(m: Self::Mem) -> Buffer;
    /// The device memory of `b`, if it is this kind of device's.
    fn unwrap(b: &Buffer) -> Option<&Self::Mem>;
    fn unwrap_mut(b: &mut Buffer) -> Option<&mut Self::Mem>;
    /// Whether `m` lives on this device (not another GPU of the same kind).
    fn owns(&self, m: &Self::Mem) -> bool;
    /// `m`'s device address.
    fn addr(m: &Self::Mem) -> u64;
    /// A pooled buffer for `len` elements of `dtype` (contents undefined).
    fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<Self::Mem, BackendError>;
    /// Copies the first `bytes` of `src` into `dst`, in stream order.
    fn copy(&self, src: &Self::Mem, dst: &mut Self::Mem, bytes: usize) -> Result<(), BackendError>;
    /// Writes `bytes` to the start of `dst`, in stream order.
    fn write(&self, dst: &mut Self::Mem, bytes: &[u8]) -> Result<(), BackendError>;
    /// The first `bytes` of `src`, after everything queued before (waits for the device).
    fn read(&self, src: &Self::Mem, bytes: usize) -> Result<Vec<u8>, BackendError>;
    /// The compiled code of rendered kernels `(source, name)`, in order: from the device's store, or compiled for
    /// its architecture (the devices' default; the host stand-in compiles at `load` instead).
    fn compile(&self, kernels: &[(&str, &str)]) -> Result<Vec<Vec<u8>>, String> {
        crate::gpu_cache::compiled(Self::FLAVOR, kernels, self.arch())
    }
    /// Whether GEMM kernels are raced on this device (`tune`); without, each runs its best-scored candidate.
    fn races_gemms(&self) -> bool {
        true
    }
    /// Whether `source` is already compiled for this device (in its code store), so using it calls no compiler.
    fn precompiled(&self, source: &str) -> bool {
        crate::gpu_cache::is_compiled(Self::FLAVOR, self.arch(), source)
    }
    /// The loaded function of kernel `k` from its compiled `code` (loaded once per source).
    fn load(&self, k: &GpuKernel, code: &[u8]) -> Result<Self::Function, String>;
    /// Queues `f` on the device's stream over a `grid` of `block`-thread blocks with these parameters.
    ///
    /// # Safety
    /// `params` must be exactly the parameters of the kernel `f` was loaded from, in order, each the address of
    /// live memory of this device holding every element the kernel indexes.
    unsafe fn launch(&self, f: &Self::Function, grid: (u32, u32), block: u32, params: &[u64]) -> Result<(), String>;

    /// A vendor library's GEMM prepared for one problem (cuBLASLt's descriptors and algorithm on CUDA): a contestant
    /// in the GEMM race (`tune`, `gpu_library`).
    type Library: Send + Sync;
    /// Whether this device has a GEMM library (installed and opened). None by default.
    fn has_library(&self) -> bool {
        false
    }
    /// Whether the library's contestant races alone where it takes a GEMM (a test stand-in's setting; never on a
    /// device).
    fn library_alone(&self) -> bool {
        false
    }
    /// The library's GEMM for `g`, or why there is none (no library on this device, it is not installed, or it
    /// declines the problem).
    fn library(&self, g: &crate::gpu_library::LibGemm) -> Result<Self::Library, String> {
        Err(format!("{} has no GEMM library for {}", Self::NAME, g.describe()))
    }
    /// Queues library GEMM `g` on the device's stream: `ptrs` are A's, B's, the bias's (0 without one) and the
    /// output's addresses.
    ///
    /// # Safety
    /// Each address is live memory of this device holding what `g` indexes.
    unsafe fn library_launch(&self, _g: &Self::Library, _ptrs: [u64; 4]) -> Result<(), String> {
        Err(format!("{} has no GEMM library", Self::NAME))
    }

    /// A plan's launches built into one graph the device replays with a single call (a CUDA graph).
    type Graph: Send;
    /// Whether plans replay as graphs on this device (see `plan`'s module doc). Off by default: a driver that
    /// says yes implements the three calls below.
    fn graphs(&self) -> bool {
        false
    }
    /// An executable graph of `nodes`, each depending on the one before (stream order).
    ///
    /// # Safety
    /// As `launch`, for every node: its parameters are its function's, each the address of live memory of this
    /// device when the graph is launched.
    unsafe fn graph_build(&self, _nodes: &[Node<'_, Self>]) -> Result<Self::Graph, String> {
        Err(format!("{} does not replay graphs", Self::NAME))
    }
    /// Replaces the parameters of node `i` of `g` (built from the same functions, grids and blocks) for its later
    /// launches; launches already queued keep theirs.
    ///
    /// # Safety
    /// As `graph_build`, for `node`.
    unsafe fn graph_set(&self, _g: &mut Self::Graph, _i: usize, _node: &Node<'_, Self>) -> Result<(), String> {
        Err(format!("{} does not replay graphs", Self::NAME))
    }
    /// Queues `g` on the device's stream, after everything queued before.
    ///
    /// # Safety
    /// Every parameter of every node (as last built or set) is live memory of this device.
    unsafe fn graph_launch(&self, _g: &Self::Graph) -> Result<(), String> {
        Err(format!("{} does not replay graphs", Self::NAME))
    }
}

/// One launch of a plan, as a graph node: a kernel, or a library GEMM.
pub(crate) enum Node<'a, D: Driver> {
    Kernel {
        function: &'a D::Function,
        grid: (u32, u32),
        block: u32,
        params: &'a [u64],
    },
    /// `params`: A's, B's, the bias's (0 without one) and the output's addresses.
    Library {
        gemm: &'a D::Library,
        params: [u64; 4],
    },
}

impl<D: Driver> Node<'_, D> {
    /// Queues this launch on the device's stream.
    ///
    /// # Safety
    /// As `Driver::launch` (a kernel) or `Driver::library_launch` (a library GEMM).
    pub(crate) unsafe fn launch(&self, ctx: &D) -> Result<(), String> {
        match self {
            // SAFETY: the caller's contract.
            Node::Kernel { function, grid, block, params } => unsafe { ctx.launch(function, *grid, *block, params) },
            // SAFETY: the caller's contract.
            Node::Library { gemm, params } => unsafe { ctx.library_launch(gemm, *params) },
        }
    }
}

/// A host buffer's elements as the GPU devices store them (little-endian, each in its own width: bool and u8 one
/// byte, f16 and bf16 two, i64 and f64 eight, as the CUDA/HIP dialect's storage types).
pub(crate) fn to_bytes(data: &HostBuffer) -> Vec<u8> {
    match data {
        HostBuffer::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        HostBuffer::U8(v) => v.to_vec(),
        HostBuffer::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostBuffer::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostBuffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// The host buffer of `len` elements of `dtype` stored as `bytes`.
pub(crate) fn from_bytes(dtype: DType, bytes: &[u8], len: usize) -> HostBuffer {
    fn words<const N: usize>(b: &[u8], len: usize) -> impl Iterator<Item = [u8; N]> + '_ {
        b.chunks_exact(N).take(len).map(|c| std::array::from_fn(|i| c[i]))
    }
    match dtype {
        DType::Bool => HostBuffer::Bool(bytes[..len].iter().map(|&b| b != 0).collect()),
        DType::U8 => HostBuffer::U8(HostVec::from_slice(&bytes[..len])),
        DType::U32 => HostBuffer::U32(words(bytes, len).map(u32::from_le_bytes).collect()),
        DType::I32 => HostBuffer::I32(words(bytes, len).map(i32::from_le_bytes).collect()),
        DType::I64 => HostBuffer::I64(words(bytes, len).map(i64::from_le_bytes).collect()),
        DType::F16 => {
            HostBuffer::F16(words(bytes, len).map(|w| kiln_jit::f16::from_bits(u16::from_le_bytes(w))).collect())
        }
        DType::BF16 => {
            HostBuffer::BF16(words(bytes, len).map(|w| kiln_jit::bf16::from_bits(u16::from_le_bytes(w))).collect())
        }
        DType::F32 => HostBuffer::F32(words(bytes, len).map(f32::from_le_bytes).collect()),
        DType::F64 => HostBuffer::F64(words(bytes, len).map(f64::from_le_bytes).collect()),
    }
}

/// Bytes before a workspace's partials: its counters, rounded up to 256 bytes (the partials stay aligned for any
/// access width).
fn counter_bytes(w: Workspace) -> usize {
    (w.counters * 4).div_ceil(256) * 256
}

/// Device memory for kernels whose workspace is at most `w` (a split-K GEMM's, `kiln_jit::render::cuda::Workspace`):
/// the counters zeroed, in stream order; the partials left as they are (each launch writes them before reading).
pub(crate) fn workspace<D: Driver>(ctx: &Arc<D>, w: Workspace) -> Result<D::Mem, BackendError> {
    let mut m = ctx.alloc(DType::U8, counter_bytes(w) + w.partials * 4)?;
    ctx.write(&mut m, &vec![0u8; counter_bytes(w)])?;
    Ok(m)
}

/// A kernel's two workspace parameters (its counters' address, its partials') in memory `m` laid out for `w`.
pub(crate) fn workspace_params<D: Driver>(m: &D::Mem, w: Workspace) -> [u64; 2] {
    let base = D::addr(m);
    [base, base + counter_bytes(w) as u64]
}

/// The workspace that serves every kernel of `ws`: the most counters and partials any needs. Kernels of one
/// plan share it: they run in stream order, each leaving the counters zero.
pub(crate) fn shared_workspace(ws: impl IntoIterator<Item = Workspace>) -> Option<Workspace> {
    ws.into_iter()
        .reduce(|a, b| Workspace { counters: a.counters.max(b.counters), partials: a.partials.max(b.partials) })
}

/// `Backend::upload` for a GPU device.
pub(crate) fn upload<D: Driver>(ctx: &Arc<D>, data: HostBuffer) -> Result<Buffer, BackendError> {
    upload_mem(ctx, &data).map(D::wrap)
}

/// Device memory holding `data`.
pub(crate) fn upload_mem<D: Driver>(ctx: &Arc<D>, data: &HostBuffer) -> Result<D::Mem, BackendError> {
    let mut b = ctx.alloc(data.dtype(), data.len())?;
    ctx.write(&mut b, &to_bytes(data))?;
    Ok(b)
}

/// `Backend::download` for a GPU device: `buffer`'s elements of `dtype`, `len` of them.
pub(crate) fn download<D: Driver>(ctx: &D, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
    let foreign = BackendError::ForeignBuffer { device: D::NAME };
    let Some(m) = D::unwrap(buffer) else { return Err(foreign) };
    if !ctx.owns(m) {
        return Err(foreign);
    }
    let (dtype, len) = (buffer.dtype(), buffer.len());
    let bytes = ctx.read(m, len * dtype.size_of())?;
    Ok(from_bytes(dtype, &bytes, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_bytes_round_trip_in_every_dtype() {
        for dtype in DType::ALL {
            let vals: Vec<f64> =
                (0..7).map(|i| if dtype == DType::Bool { (i % 2) as f64 } else { i as f64 * 1.5 }).collect();
            let vals: Vec<f64> = if dtype.is_float() { vals } else { vals.iter().map(|v| v.floor()).collect() };
            let host = HostBuffer::from_f64(dtype, &vals);
            let bytes = to_bytes(&host);
            assert_eq!(bytes.len(), 7 * dtype.size_of(), "{dtype}: the device stores each element in its width");
            assert_eq!(from_bytes(dtype, &bytes, 7), host, "{dtype}");
        }
    }
}
