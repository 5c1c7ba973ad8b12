//! The CUDA device (feature `cuda`): graphs are fused and scheduled exactly as for the other devices, every kernel
//! is rendered to CUDA C (`kiln_jit::render::cuda`), compiled by NVRTC for this GPU's exact architecture
//! (`sm_XY` from its compute capability) to a cubin, loaded as a module, and a plan's launches go in order on the
//! device's one stream.
//!
//! Nothing of CUDA is linked at build time. The driver API comes through `cudarc` with dynamic loading (its CUDA
//! version feature pinned to 12.8, the oldest driver API this supports; newer drivers keep that ABI), NVRTC through
//! kiln's own loader (`crate::rtc`, which also serves the build-machine compile checks). cudarc panics when it
//! calls into a library it cannot find, so `init` asks first whether the driver library is there at all, and every
//! missing piece (no driver library, no device at that ordinal, no NVRTC) is an `Err` that says what to install,
//! never a panic and never a fallback to another device.
//!
//! Memory: `DeviceBuffer`s come from a pool of device allocations bucketed by size (powers of two up to 1 MiB, then
//! whole MiB, as the wgpu device's), returned to it on drop: a replayed plan allocates nothing from the driver.
//! Elements are stored in their own width (bool and u8 one byte, f16 and bf16 two, i64 and f64 eight: the CUDA
//! dialect's storage types). Host and device exchange data only in `upload` and `download`.
//!
//! One stream per device; a buffer returned to the pool while a launch that reads it is still queued is only
//! handed out to work queued later on the same stream, so stream order keeps it safe (cudarc's per-buffer event
//! tracking, meant for several streams, is switched off). `download` and a plan that can fault wait for the stream.
//!
//! Cubins are cached on disk per architecture and NVRTC version, and can be compiled ahead of time on a machine
//! without a GPU and imported as a bundle (`gpu_cache`).
//!
//! A plan's kernels missing from the store compile in parallel (`gpu_cache::compiled`: a GPT training step's 205
//! cubins for sm_90 took 20.3 s on one core and 10.0 s on two, ~100 ms per NVRTC compile).
//!
//! The plan itself is the GPU devices' shared one (`gpu::plan`); this module is its `Driver` over cudarc. A GEMM runs
//! as the winner of a race on this GPU (`gpu::tune`, remembered under its name and architecture): for bf16 and f16 on
//! sm_80 and later the tensor-core template (`kiln_jit::render::cuda::render_gemm_mma`: `mma.sync` m16n8k16 tiles, f32
//! accumulators, the same fused epilogues) against the SIMT tiled template (shared-memory staging, register tiles,
//! bf16 widened to f32 as it is staged) in a few tiles, each also with K split across blocks where the product has too
//! few tiles to fill the GPU; other dtypes as the generic reduction kernel.
//!
//! Replays: from its second run a plan launches as one CUDA graph (`gpu::plan`'s module doc), built from explicit
//! kernel nodes (`cuGraphAddKernelNode`, each after the one before) rather than stream capture, and patched per run
//! with `cuGraphExecKernelNodeSetParams` where a node's buffers changed. `KILN_CUDA_GRAPHS=0` launches one by one
//! (to bisect, and to measure what graphs save).
//!
//! cuBLASLt races beside the templates (`cublaslt.rs`, opened at run time; its GEMMs with its own bias and relu
//! epilogues, verified like every contestant before it can win); in a replayed plan its call is a child graph
//! captured from the stream.
//!
//! f32 GEMMs race the tensor-core tiles in TF32 too where the user allows it (`gpu_gemm::allow_tf32`).
//!
//! Deliberately not done yet (issue 21's later points): Hopper's `wgmma`, and buffer donation (the CUDA kernels'
//! parameters are `__restrict__`, so an output may not alias an input). The routines (scatter-sum, LU, Cholesky,
//! triangular solves) render as every other kernel.

mod cublaslt;
#[cfg(feature = "nccl")]
pub mod nccl;

use crate::gpu::{Driver, Node};
use crate::{Backend, BackendError, Buffer, Executable};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg, sys};
use kiln_jit::render::cuda::{Flavor, GpuKernel};
use kiln_jit::{DType, Graph, HostBuffer};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

const NAME: &str = "cuda";

/// What to install when the driver is missing.
pub const INSTALL_HINT: &str = "no CUDA driver found (libcuda.so.1 is not on the loader's path): install the NVIDIA \
                                driver for this GPU (Debian/Ubuntu: the nvidia-driver package; in a container, run \
                                it with the NVIDIA container toolkit)";

/// One CUDA device, opened on first use.
pub struct CudaBackend {
    ctx: Arc<Ctx>,
}

pub(crate) struct Ctx {
    pub(crate) stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    /// `sm_XY`: what NVRTC compiles for.
    pub(crate) arch: String,
    pool: Mutex<HashMap<usize, Vec<CudaSlice<u8>>>>,
    /// Loaded kernels by rendered source (compared whole: two kernels never share a function by collision).
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Whether plans replay as CUDA graphs (`gpu::plan`): on unless `KILN_CUDA_GRAPHS=0`.
    graphs: bool,
    /// What tuning records measured here depend on besides the name and arch, read once at open.
    tuning: Vec<String>,
    /// cuBLASLt, opened at the first GEMM that could use it (or why it is not there).
    lt: OnceLock<Result<cublaslt::Lt, String>>,
}

type Opened = Mutex<HashMap<usize, Result<&'static CudaBackend, String>>>;

/// The CUDA backend of device `ordinal`, opening it on first call. A failure (no driver, no such device, no
/// NVRTC) is remembered: a process asks the driver once per device.
pub fn backend(ordinal: usize) -> Result<&'static CudaBackend, BackendError> {
    static OPENED: OnceLock<Opened> = OnceLock::new();
    let mut opened = OPENED.get_or_init(Default::default).lock();
    let entry = opened.entry(ordinal).or_insert_with(|| init(ordinal).map(|b| &*Box::leak(Box::new(b))));
    entry.as_ref().copied().map_err(|reason| BackendError::Unavailable { device: NAME, reason: reason.clone() })
}

fn init(ordinal: usize) -> Result<CudaBackend, String> {
    // SAFETY: only tries to open the driver library by its usual names (dlopen); no CUDA call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err(INSTALL_HINT.into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("the CUDA driver did not start: {e}"))?;
    if ordinal >= count.max(0) as usize {
        return Err(format!("there is no CUDA device {ordinal}: the driver sees {count}"));
    }
    let context = CudaContext::new(ordinal).map_err(|e| format!("CUDA device {ordinal} did not open: {e}"))?;
    // SAFETY: kiln uses one stream per device (below), so stream order alone orders every use of a buffer.
    unsafe { context.disable_event_tracking() };
    let name = context.name().unwrap_or_else(|_| "unknown".into());
    let (major, minor) = context.compute_capability().map_err(|e| format!("reading the compute capability: {e}"))?;
    // NVRTC and the cubin store for this architecture (`gpu_cache`): kernels compile once per architecture and
    // NVRTC version, on this machine or on a build machine that exported them.
    let arch = format!("sm_{major}{minor}");
    crate::gpu_cache::store(Flavor::Cuda, &arch)?;
    let stream = context.new_stream().map_err(|e| format!("creating a stream: {e}"))?;
    let sms = context.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    let mut driver = 0i32;
    // SAFETY: writes the driver's version into `driver`; no other state is touched.
    let driver = unsafe { sys::cuDriverGetVersion(&mut driver) }.result().map(|()| driver);
    let nvrtc = crate::gpu_cache::compiler(Flavor::Cuda).and_then(|r| r.version());
    let tuning = vec![
        format!("sms={}", sms.map_or("?".into(), |n| n.to_string())),
        format!("driver={}", driver.map_or("?".into(), |v| v.to_string())),
        format!("nvrtc={}", nvrtc.map_or("?".into(), |(a, b)| format!("{a}.{b}"))),
    ];
    Ok(CudaBackend {
        ctx: Arc::new(Ctx {
            stream,
            ordinal,
            name,
            arch,
            pool: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            graphs: std::env::var("KILN_CUDA_GRAPHS").map_or(true, |v| v != "0" && v != "off"),
            tuning,
            lt: OnceLock::new(),
        }),
    })
}

impl CudaBackend {
    /// The GPU in words: `name (sm_XY, device N)`.
    pub fn describe(&self) -> String {
        format!("{} ({}, device {})", self.ctx.name, self.ctx.arch, self.ctx.ordinal)
    }

    /// The architecture kernels are compiled for (`sm_90` on an H100/H200).
    pub fn arch(&self) -> &str {
        &self.ctx.arch
    }

    /// GEMM kernel `k` forced to candidate `c` of the race (`gpu_gemm`), run once on `inputs`: for the tests that
    /// check every candidate on the GPU.
    pub fn run_gemm_with(
        &self,
        k: &kiln_jit::kernel::KernelIr,
        c: crate::gpu_gemm::GpuGemm,
        inputs: &[&HostBuffer],
    ) -> Result<HostBuffer, String> {
        crate::gpu::tune::run_with(&self.ctx, k, c, inputs)
    }

    /// GEMM kernel `k` run once as the race's library contestant (`gpu_library`: cuBLASLt with the epilogue, or its
    /// product then the epilogue pass) on `inputs`, and whether it ran a pass: for the tests that check the library
    /// contestant on the GPU. An error where cuBLASLt is not installed or cannot describe `k`'s operands.
    pub fn run_library_with(
        &self,
        k: &kiln_jit::kernel::KernelIr,
        inputs: &[&HostBuffer],
    ) -> Result<(HostBuffer, bool), String> {
        crate::gpu::tune::run_library(&self.ctx, k, inputs)
    }
}

/// Device memory for `len` elements of `dtype`.
pub struct DeviceBuffer {
    slice: Option<CudaSlice<u8>>,
    dtype: DType,
    len: usize,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({}[{}] on cuda:{})", self.dtype, self.len, self.ctx.ordinal)
    }
}

impl DeviceBuffer {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slice(&self) -> &CudaSlice<u8> {
        self.slice.as_ref().expect("a live DeviceBuffer holds its memory until drop")
    }

    /// The device address, for a kernel parameter.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        // Event tracking is off (one stream), so the guard records nothing.
        let (p, _guard) = self.slice().device_ptr(&self.ctx.stream);
        p
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(s) = self.slice.take() {
            self.ctx.pool.lock().entry(s.len()).or_default().push(s);
        }
    }
}

fn exec(reason: String) -> BackendError {
    BackendError::Execute { device: NAME, reason }
}

impl Driver for Ctx {
    const NAME: &'static str = NAME;
    const FLAVOR: Flavor = Flavor::Cuda;
    type Mem = DeviceBuffer;
    type Function = CudaFunction;

    fn arch(&self) -> &str {
        &self.arch
    }

    fn model(&self) -> String {
        self.name.clone()
    }

    fn tuning_features(&self) -> Vec<String> {
        self.tuning.clone()
    }

    fn wrap(m: DeviceBuffer) -> Buffer {
        Buffer::Cuda(m)
    }

    fn unwrap(b: &Buffer) -> Option<&DeviceBuffer> {
        match b {
            Buffer::Cuda(d) => Some(d),
            _ => None,
        }
    }

    fn unwrap_mut(b: &mut Buffer) -> Option<&mut DeviceBuffer> {
        match b {
            Buffer::Cuda(d) => Some(d),
            _ => None,
        }
    }

    fn owns(&self, m: &DeviceBuffer) -> bool {
        m.ctx.ordinal == self.ordinal
    }

    fn addr(m: &DeviceBuffer) -> u64 {
        m.ptr()
    }

    fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<DeviceBuffer, BackendError> {
        let bytes = crate::pool_bucket(len * dtype.size_of());
        let pooled = self.pool.lock().get_mut(&bytes).and_then(Vec::pop);
        let slice = match pooled {
            Some(s) => s,
            // SAFETY: u8 has no invalid bit patterns; every byte a kernel reads was written by an upload, a copy
            // or an earlier launch of the same plan first.
            None => unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(|e| exec(format!("allocating {bytes} bytes on {}: {e}", self.name)))?,
        };
        Ok(DeviceBuffer { slice: Some(slice), dtype, len, ctx: self.clone() })
    }

    fn load(&self, k: &GpuKernel, cubin: &[u8]) -> Result<CudaFunction, String> {
        if let Some(f) = self.functions.lock().get(&k.source) {
            return Ok(f.clone());
        }
        let module = self
            .stream
            .context()
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
            .map_err(|e| format!("kernel {}: loading its cubin: {e}", k.name))?;
        let f = module.load_function(&k.name).map_err(|e| format!("kernel {}: {e}", k.name))?;
        self.functions.lock().insert(k.source.clone(), f.clone());
        Ok(f)
    }

    fn copy(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, bytes: usize) -> Result<(), BackendError> {
        if bytes == 0 {
            return Ok(());
        }
        let from = src.slice().slice(0..bytes);
        let to = dst.slice.as_mut().expect("a live DeviceBuffer holds its memory until drop");
        let mut to = to.slice_mut(0..bytes);
        self.stream.memcpy_dtod(&from, &mut to).map_err(|e| exec(format!("copying on the device: {e}")))
    }

    fn write(&self, dst: &mut DeviceBuffer, bytes: &[u8]) -> Result<(), BackendError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let to = dst.slice.as_mut().expect("a live DeviceBuffer holds its memory until drop");
        let mut to = to.slice_mut(0..bytes.len());
        self.stream.memcpy_htod(bytes, &mut to).map_err(|e| exec(format!("copying to the device: {e}")))
    }

    fn read(&self, src: &DeviceBuffer, bytes: usize) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; bytes];
        if bytes > 0 {
            let from = src.slice().slice(0..bytes);
            self.stream.memcpy_dtoh(&from, &mut out[..]).map_err(|e| exec(format!("copying from the device: {e}")))?;
        }
        self.stream.synchronize().map_err(|e| exec(format!("waiting for the device: {e}")))?;
        Ok(out)
    }

    unsafe fn launch(&self, f: &CudaFunction, grid: (u32, u32), block: u32, params: &[u64]) -> Result<(), String> {
        let mut args = self.stream.launch_builder(f);
        for p in params {
            args.arg(p);
        }
        let cfg = LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the caller's contract (`Driver::launch`): these are the kernel's parameters, each live memory of
        // this device covering what the kernel indexes.
        unsafe { args.launch(cfg) }.map(|_| ()).map_err(|e| e.to_string())
    }

    type Library = cublaslt::LtGemm;

    fn has_library(&self) -> bool {
        self.lt().is_ok()
    }

    fn library(&self, g: &crate::gpu_library::LibGemm) -> Result<cublaslt::LtGemm, String> {
        self.lt()?.prepare(g)
    }

    unsafe fn library_launch(&self, g: &cublaslt::LtGemm, ptrs: [u64; 4]) -> Result<(), String> {
        // SAFETY: the caller's contract (`Driver::library_launch`).
        unsafe { self.lt()?.launch(g, ptrs) }
    }

    type Graph = CudaGraph;

    fn graphs(&self) -> bool {
        self.graphs
    }

    unsafe fn graph_build(&self, nodes: &[Node<'_, Self>]) -> Result<CudaGraph, String> {
        let context = self.stream.context().clone();
        context.bind_to_thread().map_err(|e| e.to_string())?;
        let mut g = CudaGraph { context, graph: std::ptr::null_mut(), exec: std::ptr::null_mut(), nodes: Vec::new() };
        // SAFETY: creates an empty graph into `g.graph` (dropped with `g` on any error below).
        unsafe { sys::cuGraphCreate(&mut g.graph, 0) }.result().map_err(|e| format!("cuGraphCreate: {e}"))?;
        for n in nodes {
            let mut node = std::ptr::null_mut();
            let deps: &[sys::CUgraphNode] = g.nodes.last().map_or(&[], std::slice::from_ref);
            match n {
                Node::Kernel { function, grid, block, params } => {
                    let mut ptrs = pointers(params);
                    let params = kernel_params(function, *grid, *block, &mut ptrs);
                    // SAFETY: `params` names a function of this context and points at the node's parameters, one
                    // 8-byte device address per kernel parameter (the caller's contract); the driver copies the
                    // values before returning.
                    unsafe { sys::cuGraphAddKernelNode_v2(&mut node, g.graph, deps.as_ptr(), deps.len(), &params) }
                        .result()
                        .map_err(|e| format!("cuGraphAddKernelNode: {e}"))?;
                }
                Node::Library { gemm, params } => {
                    // SAFETY: the caller's contract: the library GEMM's addresses are live when the graph runs.
                    let child = unsafe { self.capture_library(gemm, *params) }?;
                    // SAFETY: `child` is a graph just captured; the driver clones it into the node.
                    let added =
                        unsafe { sys::cuGraphAddChildGraphNode(&mut node, g.graph, deps.as_ptr(), deps.len(), child) };
                    // SAFETY: captured above and cloned into the node (or not added): destroyed only here.
                    let _ = unsafe { sys::cuGraphDestroy(child) };
                    added.result().map_err(|e| format!("cuGraphAddChildGraphNode: {e}"))?;
                }
            }
            g.nodes.push(node);
        }
        // SAFETY: `g.graph` is the graph just built.
        g.exec = unsafe { cudarc::driver::result::graph::instantiate(g.graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| format!("cuGraphInstantiate: {e}"))?;
        Ok(g)
    }

    unsafe fn graph_set(&self, g: &mut CudaGraph, i: usize, n: &Node<'_, Self>) -> Result<(), String> {
        let node = *g.nodes.get(i).ok_or_else(|| format!("the graph has no node {i}"))?;
        g.context.bind_to_thread().map_err(|e| e.to_string())?;
        match n {
            Node::Kernel { function, grid, block, params } => {
                let mut ptrs = pointers(params);
                let params = kernel_params(function, *grid, *block, &mut ptrs);
                // SAFETY: node `i` of `g.exec` launches the same function with the same grid and block (the
                // caller's contract); the driver copies the new parameter values and applies them from the next
                // launch of the graph.
                unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, node, &params) }
                    .result()
                    .map_err(|e| format!("cuGraphExecKernelNodeSetParams: {e}"))
            }
            Node::Library { gemm, params } => {
                // The library call captured again with the new addresses: the same work, so the same topology.
                // SAFETY: the caller's contract: the addresses are live when the graph runs.
                let child = unsafe { self.capture_library(gemm, *params) }?;
                // SAFETY: node `i` is the child-graph node built from this library GEMM; the driver copies
                // `child`'s parameters into the executable graph.
                let set = unsafe { sys::cuGraphExecChildGraphNodeSetParams(g.exec, node, child) };
                // SAFETY: captured above, destroyed only here.
                let _ = unsafe { sys::cuGraphDestroy(child) };
                set.result().map_err(|e| format!("cuGraphExecChildGraphNodeSetParams: {e}"))
            }
        }
    }

    unsafe fn graph_launch(&self, g: &CudaGraph) -> Result<(), String> {
        g.context.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: `g.exec` is an instantiated graph of this context; the caller guarantees its parameters are live.
        unsafe { cudarc::driver::result::graph::launch(g.exec, self.stream.cu_stream()) }
            .map_err(|e| format!("cuGraphLaunch: {e}"))
    }
}

/// A plan's CUDA graph: the graph, its executable instance and its kernel nodes in launch order.
pub(crate) struct CudaGraph {
    context: Arc<CudaContext>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
}

// SAFETY: the handles are plain driver objects with no thread affinity (the context is bound before each call);
// CUDA asks that calls on one graph be serialized, which the plan's lock on its replay state does.
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let _ = self.context.bind_to_thread();
        // A queued launch of the graph must end before the graph goes (the one wait a dropped plan costs).
        // SAFETY: waits for the context bound just above; no handle involved.
        let _ = unsafe { sys::cuCtxSynchronize() }.result();
        if !self.exec.is_null() {
            // SAFETY: instantiated by `graph_build` and destroyed only here.
            let _ = unsafe { cudarc::driver::result::graph::exec_destroy(self.exec) };
        }
        if !self.graph.is_null() {
            // SAFETY: created by `graph_build` and destroyed only here (its nodes with it).
            let _ = unsafe { cudarc::driver::result::graph::destroy(self.graph) };
        }
    }
}

impl Ctx {
    /// This device's cuBLASLt, opened on first use.
    fn lt(&self) -> Result<&cublaslt::Lt, String> {
        self.lt.get_or_init(|| cublaslt::Lt::open(&self.stream)).as_ref().map_err(Clone::clone)
    }

    /// Library GEMM `gemm` on `params` captured from the stream into a graph of its own (cuBLASLt's launches are
    /// its own, so a graph node for them is a captured child graph). The capture is thread-local, records only
    /// this call, and runs nothing.
    ///
    /// # Safety
    /// As `Driver::library_launch`, for when the graph runs.
    unsafe fn capture_library(&self, gemm: &cublaslt::LtGemm, params: [u64; 4]) -> Result<sys::CUgraph, String> {
        let stream = self.stream.cu_stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: begins capturing this device's stream, which only this thread queues to while a plan holds its
        // replay lock.
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }
            .result()
            .map_err(|e| format!("cuStreamBeginCapture: {e}"))?;
        // SAFETY: the caller's contract; while capturing, the call is recorded, not run.
        let queued = unsafe { self.lt()?.launch(gemm, params) };
        let mut child = std::ptr::null_mut();
        // SAFETY: ends the capture begun above (also after a failed call, so the stream is not left capturing).
        let ended = unsafe { sys::cuStreamEndCapture(stream, &mut child) }.result();
        queued?;
        ended.map_err(|e| format!("cuStreamEndCapture: {e}"))?;
        Ok(child)
    }
}

/// The driver's description of a kernel node launching `function` over `grid` x `block`, whose parameter values
/// are at `ptrs` (one pointer per value).
fn kernel_params(
    function: &CudaFunction,
    grid: (u32, u32),
    block: u32,
    ptrs: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: function.cu_function(),
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        kernelParams: ptrs.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        // Read only when `func` is null.
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

/// Pointers to each of `words`, as the driver takes kernel parameters (`void**`: it only reads through them), on
/// the stack for the usual few: patching a node on a replay allocates nothing.
fn pointers(words: &[u64]) -> smallvec::SmallVec<[*mut c_void; 8]> {
    words.iter().map(|w| (w as *const u64).cast_mut().cast::<c_void>()).collect()
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        crate::gpu::plan::compile(&self.ctx, graph)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.ctx.stream.synchronize().map_err(|e| exec(format!("waiting for the device: {e}")))
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        crate::gpu::upload(&self.ctx, data)
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        crate::gpu::download(&*self.ctx, buffer)
    }
}
