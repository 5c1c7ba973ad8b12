//! The HIP device (feature `hip`): AMD GPUs through the HIP runtime. Graphs are fused and scheduled exactly as for
//! the CUDA device (`gpu_cache::schedule`), every kernel is rendered in the shared renderer's HIP dialect
//! (`kiln_jit::render::cuda`, `Flavor::Hip`), compiled by hiprtc for this GPU's architecture (`gfx90a`, with its
//! target features as the runtime names them) to a code object, loaded as a module, and a plan's launches go in
//! order on the device's one stream. The plan is the GPU devices' shared one (`gpu::plan`); this module is its
//! `Driver` over the HIP runtime.
//!
//! Nothing of ROCm is linked at build time: the runtime (`runtime`) and hiprtc (`rtc`) are opened at run time, and
//! no runtime library, no GPU at that ordinal, or no hiprtc is an `Err` that says what to install, never a panic
//! and never a fallback to another device. The architecture comes from the device's properties; where they hold
//! none, from `KILN_HIP_ARCH`'s first entry (else the error asks for it).
//!
//! Memory: device allocations pooled by size bucket as the CUDA device's (a replayed plan allocates nothing from
//! the runtime), elements in their own width (`gpu::to_bytes`). Host-to-device writes wait for the stream before
//! returning, so the host bytes need not outlive the call (HIP does not promise that a pageable source is read
//! before an asynchronous copy returns); reads wait as well. Launches do not wait.
//!
//! Code objects are cached on disk per architecture and hiprtc version (`gpu_cache`), and can be compiled ahead
//! of time with `KILN_HIP_ARCH` on a machine without a GPU and imported as a bundle.
//!
//! What ran where: this module has been built and its error paths run on machines without an AMD GPU (CI: ROCm
//! 5.2's runtime, which reports no device); every kernel it would run is compiled by hiprtc for gfx90a and gfx1030
//! in CI (`gpu_check`). It has not run a kernel on AMD hardware.

mod runtime;

pub use runtime::{ARCH_OFFSET_R0000, ARCH_OFFSET_R0600, INSTALL_HINT};

use crate::gpu::Driver;
use crate::{Backend, BackendError, Buffer, Executable};
use kiln_jit::render::cuda::{Flavor, GpuKernel};
use kiln_jit::{DType, Graph, HostBuffer};
use parking_lot::Mutex;
use runtime::Runtime;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

const NAME: &str = "hip";

/// One HIP device, opened on first use.
pub struct HipBackend {
    ctx: Arc<Ctx>,
}

/// A HIP runtime handle (stream, function).
#[derive(Clone, Copy)]
pub(crate) struct Handle(*mut c_void);

// SAFETY: HIP runtime handles are plain references into the runtime, which is thread-safe: a stream or a loaded
// function may be used from any thread (the current device is set per thread before each use: `Ctx::current`).
unsafe impl Send for Handle {}
// SAFETY: as above; kiln never mutates through a handle, it only passes it to the runtime.
unsafe impl Sync for Handle {}

pub(crate) struct Ctx {
    rt: &'static Runtime,
    stream: Handle,
    ordinal: usize,
    name: String,
    /// What hiprtc compiles for (`gfx90a:sramecc+:xnack-`).
    arch: String,
    /// Free device allocations (addresses) by bucket size.
    pool: Mutex<HashMap<usize, Vec<u64>>>,
    /// Loaded kernels by rendered source (compared whole: two kernels never share a function by collision).
    functions: Mutex<HashMap<String, Handle>>,
}

type Opened = Mutex<HashMap<usize, Result<&'static HipBackend, String>>>;

/// The HIP runtime, opened once per process.
fn runtime() -> Result<&'static Runtime, String> {
    static RT: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RT.get_or_init(Runtime::open).as_ref().map_err(Clone::clone)
}

/// The HIP backend of device `ordinal`, opening it on first call. A failure (no runtime, no such device, no
/// hiprtc) is remembered: a process asks the runtime once per device.
pub fn backend(ordinal: usize) -> Result<&'static HipBackend, BackendError> {
    static OPENED: OnceLock<Opened> = OnceLock::new();
    let mut opened = OPENED.get_or_init(Default::default).lock();
    let entry = opened.entry(ordinal).or_insert_with(|| init(ordinal).map(|b| &*Box::leak(Box::new(b))));
    entry.as_ref().copied().map_err(|reason| BackendError::Unavailable { device: NAME, reason: reason.clone() })
}

fn init(ordinal: usize) -> Result<HipBackend, String> {
    let rt = runtime()?;
    let which = format!("the HIP runtime ({}, ROCm {})", rt.path, rt.version());
    let count = rt.device_count().map_err(|e| format!("{which} did not start: {e}"))?;
    if ordinal >= count {
        return Err(format!(
            "there is no HIP device {ordinal}: {which} sees {count} (an AMD GPU needs the amdgpu kernel driver, and \
             this user read and write access to /dev/kfd and /dev/dri)"
        ));
    }
    rt.set_device(ordinal)?;
    let name = rt.name(ordinal).unwrap_or_else(|_| "unknown".into());
    let arch = match rt.arch(ordinal)? {
        Some(a) => a,
        None => crate::gpu_cache::precompile_archs(Flavor::Hip).first().cloned().ok_or_else(|| {
            format!("HIP device {ordinal} ({name}) does not name its architecture: set KILN_HIP_ARCH (gfx90a, ...)")
        })?,
    };
    // hiprtc and the code object store for this architecture: kernels compile once per architecture and hiprtc
    // version, on this machine or on a build machine that exported them.
    crate::gpu_cache::store(Flavor::Hip, &arch)?;
    let stream = Handle(rt.stream()?);
    Ok(HipBackend {
        ctx: Arc::new(Ctx {
            rt,
            stream,
            ordinal,
            name,
            arch,
            pool: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }),
    })
}

impl HipBackend {
    /// The GPU in words: `name (gfxXXXX, device N)`.
    pub fn describe(&self) -> String {
        format!("{} ({}, device {})", self.ctx.name, self.ctx.arch, self.ctx.ordinal)
    }

    /// The architecture kernels are compiled for (`gfx90a`, with the runtime's target features).
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
}

/// Device memory for `len` elements of `dtype`.
pub struct DeviceBuffer {
    addr: u64,
    /// The pool bucket it came from (its allocation's size).
    bucket: usize,
    dtype: DType,
    len: usize,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({}[{}] on hip:{})", self.dtype, self.len, self.ctx.ordinal)
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

    fn ptr(&self) -> *mut c_void {
        self.addr as *mut c_void
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Back to the pool, never freed: work queued before on the one stream may still use it, and only work
        // queued later can be handed it.
        self.ctx.pool.lock().entry(self.bucket).or_default().push(self.addr);
    }
}

fn exec(reason: String) -> BackendError {
    BackendError::Execute { device: NAME, reason }
}

impl Ctx {
    /// Makes this device the calling thread's current one (the HIP runtime's state is per thread), once per thread
    /// until another HIP device is used on it.
    fn current(&self) -> Result<(), String> {
        thread_local!(static CURRENT: Cell<Option<usize>> = const { Cell::new(None) });
        if CURRENT.get() != Some(self.ordinal) {
            self.rt.set_device(self.ordinal)?;
            CURRENT.set(Some(self.ordinal));
        }
        Ok(())
    }
}

impl Driver for Ctx {
    const NAME: &'static str = NAME;
    const FLAVOR: Flavor = Flavor::Hip;
    type Mem = DeviceBuffer;
    type Function = Handle;
    /// No graph replays on HIP yet (hipGraph mirrors CUDA's API, but no machine here could run it): plans launch
    /// one by one.
    type Graph = std::convert::Infallible;
    /// No vendor library yet (hipBLASLt would be the counterpart of cuBLASLt): GEMMs race kiln's templates only.
    type Library = std::convert::Infallible;

    fn arch(&self) -> &str {
        &self.arch
    }

    fn model(&self) -> String {
        self.name.clone()
    }

    fn wrap(m: DeviceBuffer) -> Buffer {
        Buffer::Hip(m)
    }

    fn unwrap(b: &Buffer) -> Option<&DeviceBuffer> {
        match b {
            Buffer::Hip(d) => Some(d),
            _ => None,
        }
    }

    fn unwrap_mut(b: &mut Buffer) -> Option<&mut DeviceBuffer> {
        match b {
            Buffer::Hip(d) => Some(d),
            _ => None,
        }
    }

    fn owns(&self, m: &DeviceBuffer) -> bool {
        m.ctx.ordinal == self.ordinal
    }

    fn addr(m: &DeviceBuffer) -> u64 {
        m.addr
    }

    fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<DeviceBuffer, BackendError> {
        let bucket = crate::pool_bucket(len * dtype.size_of());
        let pooled = self.pool.lock().get_mut(&bucket).and_then(Vec::pop);
        let addr = match pooled {
            Some(a) => a,
            None => {
                self.current().map_err(exec)?;
                let p = self
                    .rt
                    .malloc(bucket)
                    .map_err(|e| exec(format!("allocating {bucket} bytes on {}: {e}", self.name)))?;
                p as u64
            }
        };
        Ok(DeviceBuffer { addr, bucket, dtype, len, ctx: self.clone() })
    }

    fn load(&self, k: &GpuKernel, code: &[u8]) -> Result<Handle, String> {
        if let Some(f) = self.functions.lock().get(&k.source) {
            return Ok(*f);
        }
        self.current()?;
        let f = Handle(self.rt.load(code, &k.name).map_err(|e| format!("kernel {}: {e}", k.name))?);
        self.functions.lock().insert(k.source.clone(), f);
        Ok(f)
    }

    fn copy(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, bytes: usize) -> Result<(), BackendError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: both buffers hold at least `bytes` (the plan copies a passthrough output from its input, of one
        // dtype and length).
        unsafe { self.rt.copy(dst.ptr(), src.ptr(), bytes, self.stream.0) }.map_err(exec)
    }

    fn write(&self, dst: &mut DeviceBuffer, bytes: &[u8]) -> Result<(), BackendError> {
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` holds `len * size_of` bytes, and callers write at most that (an upload of its elements, the
        // rng keys or the fault record it was allocated for).
        unsafe { self.rt.write(dst.ptr(), bytes, self.stream.0) }.map_err(exec)
    }

    fn read(&self, src: &DeviceBuffer, bytes: usize) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; bytes];
        if bytes > 0 {
            // SAFETY: callers read at most the bytes `src` holds.
            unsafe { self.rt.read(&mut out, src.ptr(), self.stream.0) }.map_err(exec)?;
        } else {
            self.rt.synchronize(self.stream.0).map_err(exec)?;
        }
        Ok(out)
    }

    unsafe fn launch(&self, f: &Handle, grid: (u32, u32), block: u32, params: &[u64]) -> Result<(), String> {
        self.current()?;
        // SAFETY: the caller's contract (`Driver::launch`).
        unsafe { self.rt.launch(f.0, grid, block, params, self.stream.0) }
    }
}

impl Backend for HipBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        crate::gpu::plan::compile(&self.ctx, graph)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.ctx.rt.synchronize(self.ctx.stream.0).map_err(exec)
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        crate::gpu::upload(&self.ctx, data)
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        crate::gpu::download(&*self.ctx, buffer)
    }
}
