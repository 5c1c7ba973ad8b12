//! The wgpu device: graphs are fused and scheduled exactly as for the CPU, every kernel is rendered to WGSL
//! (`kiln_jit::render::wgsl`), compiled by wgpu into a compute pipeline, and a plan's launches are recorded into one
//! command encoder per run. Vulkan is preferred; wgpu falls back to GL where Vulkan is absent (`WGPU_BACKEND=gl`
//! forces it), but not to a software GL (Mesa's llvmpipe) unless `WGPU_BACKEND` names GL: its compute shaders
//! compile through LLVM's coroutine passes, and one tiled GEMM shader took minutes. On a machine without a GPU,
//! Mesa's lavapipe (`apt-get install mesa-vulkan-drivers libvulkan1`) gives a Vulkan device on the CPU: that is
//! what CI runs.
//!
//! Memory: `DeviceBuffer`s come from a pool of wgpu buffers bucketed by size (powers of two up to 1 MiB, then whole
//! MiB), returned to it on drop. Every element is one 32-bit word (bool and u8 widened on upload, narrowed on
//! download) except f16, which is two bytes (buffers are still sized at 4 bytes per element: the bucket and the
//! 4-byte copy granularity need no special case); f64 and i64 are refused at upload and at compile with an error
//! naming the dtype.
//!
//! f16 needs the adapter feature `SHADER_F16` (WGSL `enable f16;`, 16-bit storage): it is requested at device
//! creation when the adapter offers it (`KILN_WGPU_F16=off` declines it, to test the other path). Without it, f16
//! is refused like the 64-bit dtypes, naming the missing feature: at op construction, upload and compile, never run
//! elsewhere. Data crosses between
//! host and device only in `upload` and `download`, which `kiln` calls for `from_vec`, `to_vec`, `to_device` and
//! friends: a run never reads back, and nothing runs on the CPU behind the user's back.
//!
//! Pipelines are cached by rendered source (the map hashes the text and compares it whole, so two kernels can never
//! share a pipeline by collision); bind group layouts by (inputs, rng, fault record). Shader compile errors are caught with an
//! error scope and returned with the WGSL source.
//!
//! A run (`plan.rs`) allocates its outputs and temps from the pool, writes the rng keys (when the plan draws random
//! numbers), records every launch in one compute pass and submits. An output may take a donated input's buffer
//! instead (an optimizer's update of an elementwise kind; `plan.rs` says how and which). The queue orders runs, so a temp returned to the pool at
//! the end of `run` is only reused by work submitted later.
//!
//! GEMM kernels (`kernel::gemm::GemmView`) run as the tiled WGSL template in a tile the autotuner picks (`gemm.rs`)
//! among those legal on the adapter (`tiles.rs`: the search space and its score).
//!
//! On an OpenGL adapter every entry point (compile, upload, download, synchronize, and each step of a run) holds
//! `Ctx::exclusive` first. wgpu's GL backend has one context, locked per call with a timeout (6 s) after which it
//! panics ("Could not lock adapter context", gfx-rs/wgpu#5299): on llvmpipe a wait for a long run, or a large
//! shader's compile with both cores busy, holds it longer than that, and a second thread's call panicked. Serialized
//! in kiln first, the second thread waits without a timeout; GL had run one call at a time anyway.
//!
//! Deliberately not done yet: bind groups are created per launch per run (a cache keyed by buffer identities would
//! save them on replay); `KILN_PROFILE` does not time wgpu launches (it would need timestamp queries).

mod gemm;
mod plan;
pub mod tiles;

pub use gemm::{fingerprint, gemm_candidates, run_gemm_with, take_last_tune_record};

use crate::{Backend, BackendError, Buffer, Executable};
use kiln_jit::render::wgsl::{self, WgslKernel};
use kiln_jit::{DType, Graph, HostBuffer};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

const NAME: &str = "wgpu";

/// Trips of one shader loop in one invocation after which llvmpipe stops the loop (see `loop_trip_cap`).
const LLVMPIPE_LOOP_CAP: usize = 65_535;

/// What to install when no adapter is found.
pub const INSTALL_HINT: &str = "no wgpu adapter (Vulkan or GL) found; on Debian/Ubuntu without a GPU: apt-get install mesa-vulkan-drivers libvulkan1";

/// The process's wgpu device, created on first use.
pub struct WgpuBackend {
    ctx: Arc<Ctx>,
}

pub(crate) struct Ctx {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    /// The device was created with `SHADER_F16`: f16 buffers and arithmetic are available.
    f16: bool,
    /// How long reductions are rendered here (`reduce_form`).
    reduce_form: wgsl::ReduceForm,
    pool: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    pipelines: Mutex<HashMap<String, Arc<Pipeline>>>,
    layouts: Mutex<HashMap<(usize, bool, bool), Arc<Layout>>>,
    /// Held by every entry point on an OpenGL adapter (`exclusive`; the module doc says why); `None` elsewhere.
    /// Reentrant: a compile allocates, and a tuning run inside a compile uploads.
    gl_calls: Option<parking_lot::ReentrantMutex<()>>,
}

pub(crate) struct Layout {
    bind: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
}

pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: Arc<Layout>,
}

static BACKEND: OnceLock<Result<WgpuBackend, String>> = OnceLock::new();

/// The wgpu backend, initializing the device on first call. Errors (no adapter, device request refused) are
/// remembered: a process asks the driver once.
pub fn backend() -> Result<&'static WgpuBackend, BackendError> {
    BACKEND
        .get_or_init(init)
        .as_ref()
        .map_err(|reason| BackendError::Unavailable { device: NAME, reason: reason.clone() })
}

fn init() -> Result<WgpuBackend, String> {
    // Vulkan first, GL only where Vulkan has no adapter (probing GL first would print EGL noise on headless
    // machines); `WGPU_BACKEND=vulkan|gl|...` chooses instead.
    provide_runtime_dir();
    // Empty counts as unset, as for kiln's own variables (`KILN_DUMP=`, `KILN_CACHE_DIR=`).
    let (tries, chosen) = match std::env::var("WGPU_BACKEND") {
        Ok(list) if !list.trim().is_empty() => (vec![parse_backends(&list)?], true),
        _ => (vec![wgpu::Backends::VULKAN, wgpu::Backends::GL], false),
    };
    let mut errors = Vec::new();
    let mut found = None;
    for backends in tries {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        match pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        })) {
            // A software GL (llvmpipe) only where the user names GL: its compute shaders compile through LLVM's
            // coroutine passes, minutes for one tiled GEMM, where lavapipe's Vulkan takes a second.
            Ok(a)
                if !chosen
                    && a.get_info().backend == wgpu::Backend::Gl
                    && a.get_info().device_type == wgpu::DeviceType::Cpu =>
            {
                errors.push(format!(
                    "{backends:?}: only {}, a software rasterizer whose compute shaders compile very slowly; set \
                     WGPU_BACKEND=gl to use it anyway",
                    a.get_info().name
                ));
            }
            Ok(a) => {
                found = Some(a);
                break;
            }
            Err(e) => errors.push(format!("{backends:?}: {e}")),
        }
    }
    let adapter = found.ok_or_else(|| format!("{INSTALL_HINT} ({})", errors.join("; ")))?;
    let info = adapter.get_info();
    // Everything the adapter offers: kernels bind one storage buffer per input, and big tensors need big bindings.
    let limits = adapter.limits();
    let f16 = adapter.features().contains(wgpu::Features::SHADER_F16)
        && !std::env::var("KILN_WGPU_F16").is_ok_and(|v| v == "off" || v == "0");
    let features = if f16 { wgpu::Features::SHADER_F16 } else { wgpu::Features::empty() };
    let reduce_form = reduce_form(&info, std::env::var("KILN_WGSL_COOP").ok().as_deref())?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("kiln"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }))
    .map_err(|e| format!("the {} adapter {} refused a device: {e}", info.backend, info.name))?;
    // Errors outside an error scope (none are expected: compile catches its own) go to stderr, not to a panic.
    device.on_uncaptured_error(Arc::new(|e| eprintln!("kiln: wgpu error: {e}")));
    let gl_calls = (info.backend == wgpu::Backend::Gl).then(|| parking_lot::ReentrantMutex::new(()));
    let ctx = Ctx {
        device,
        queue,
        info,
        limits,
        f16,
        reduce_form,
        pool: Mutex::new(HashMap::new()),
        pipelines: Mutex::new(HashMap::new()),
        layouts: Mutex::new(HashMap::new()),
        gl_calls,
    };
    Ok(WgpuBackend { ctx: Arc::new(ctx) })
}

/// How this adapter renders long reductions (`wgsl::ReduceForm`): cooperatively on a GPU; on a CPU driver
/// (lavapipe, `DeviceType::Cpu`) one invocation per output, cooperatively only where that form's loop would pass
/// the driver's loop cap. Measured on lavapipe (docs/benchmarks.md): softmax over 4096 x 1024 took 1.7x as long
/// cooperatively, a row sum 3x: there a workgroup's invocations are SIMD lanes of one CPU thread, so the generic
/// form vectorizes across outputs, and each barrier is a switch between them. `KILN_WGSL_COOP=on|off|auto`
/// (default `auto`) forces a form, so both are tested on any adapter; another value is an error.
fn reduce_form(info: &wgpu::AdapterInfo, env: Option<&str>) -> Result<wgsl::ReduceForm, String> {
    let cap = info.name.contains("llvmpipe").then_some(LLVMPIPE_LOOP_CAP);
    let generic = wgsl::ReduceForm::Generic { cap };
    match env.unwrap_or("auto") {
        "on" => Ok(wgsl::ReduceForm::Cooperative),
        "off" => Ok(generic),
        "auto" if info.device_type == wgpu::DeviceType::Cpu => Ok(generic),
        "auto" => Ok(wgsl::ReduceForm::Cooperative),
        other => Err(format!("KILN_WGSL_COOP={other:?}: use on, off or auto")),
    }
}

/// Mesa's window-system code looks for `XDG_RUNTIME_DIR` when a Vulkan or GL device is opened, even headless, and
/// prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` per device where it is missing (as
/// root, in containers, under CI). When it is unset, kiln points it at a private folder of its own,
/// `<temp dir>/kiln-runtime-<uid>` (0700, owned by this user; reused by later processes), so users never see that
/// noise. A folder of that name owned by someone else, or open to others, is left alone, and so is the variable.
fn provide_runtime_dir() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
            return;
        }
        let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
        let dir = std::env::temp_dir().join(format!("kiln-runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        let Ok(meta) = std::fs::symlink_metadata(&dir) else { return };
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
            return;
        }
        // SAFETY: `set_var` races a C `getenv` on another thread. This runs once, inside the wgpu backend's
        // `OnceLock` initialisation and before wgpu or Mesa start (they are the only C code here that reads the
        // environment); Rust's own reads take std's environment lock.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
    }
}

/// The names `WGPU_BACKEND` may list (comma-separated), as wgpu reads them. wgpu itself skips an unknown name with
/// a log line nobody sees and then finds no adapter, so a typo read as "install a driver"; kiln refuses it instead.
const BACKEND_NAMES: [(&str, wgpu::Backends); 10] = [
    ("vulkan", wgpu::Backends::VULKAN),
    ("vk", wgpu::Backends::VULKAN),
    ("gl", wgpu::Backends::GL),
    ("gles", wgpu::Backends::GL),
    ("opengl", wgpu::Backends::GL),
    ("metal", wgpu::Backends::METAL),
    ("mtl", wgpu::Backends::METAL),
    ("dx12", wgpu::Backends::DX12),
    ("d3d12", wgpu::Backends::DX12),
    ("webgpu", wgpu::Backends::BROWSER_WEBGPU),
];

/// The backends a `WGPU_BACKEND` value names, or an error naming the valid values.
fn parse_backends(list: &str) -> Result<wgpu::Backends, String> {
    let mut backends = wgpu::Backends::empty();
    for name in list.split(',').map(|n| n.trim().to_ascii_lowercase()) {
        match BACKEND_NAMES.iter().find(|(n, _)| *n == name) {
            Some((_, b)) => backends |= *b,
            None => {
                let valid: Vec<&str> = BACKEND_NAMES.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "WGPU_BACKEND={list:?}: unknown backend {name:?}; use one or more of {} (comma-separated), or \
                     unset it to try Vulkan, then GL",
                    valid.join(", ")
                ));
            }
        }
    }
    Ok(backends)
}

impl WgpuBackend {
    /// The adapter, for logs and cache keys: `name (backend, driver info)`.
    pub fn adapter(&self) -> String {
        let i = &self.ctx.info;
        format!("{} ({:?}, {} {})", i.name, i.backend, i.driver, i.driver_info)
    }

    /// The most trips this adapter's driver runs of one shader loop in one invocation, where it caps them: Mesa's
    /// llvmpipe (lavapipe, what CI and GPU-less machines run) stops every loop after 65535 trips, counted over the
    /// invocation, and drops that invocation's stores (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`): a sum over 65536
    /// elements read 0.0 there, with no error. `None` for drivers without such a cap.
    pub(crate) fn loop_trip_cap(&self) -> Option<usize> {
        self.ctx.info.name.contains("llvmpipe").then_some(LLVMPIPE_LOOP_CAP)
    }

    /// How kernels with long reductions are rendered on this adapter (see `reduce_form`).
    pub(crate) fn reduce_form(&self) -> wgsl::ReduceForm {
        self.ctx.reduce_form
    }

    /// Whether tensors of `d` can live here: not the 64-bit types (no WGSL type), and f16 only with `SHADER_F16`.
    pub fn supports(&self, d: DType) -> bool {
        wgsl::supports(d) && (d != DType::F16 || self.ctx.f16)
    }
}

/// A buffer on the wgpu device: `len` elements of `dtype`, one 32-bit word each.
pub struct DeviceBuffer {
    buf: Option<wgpu::Buffer>,
    dtype: DType,
    len: usize,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({}[{}] on wgpu)", self.dtype, self.len)
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

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("a live DeviceBuffer holds its buffer until drop")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.ctx.pool.lock().entry(b.size()).or_default().push(b);
        }
    }
}

impl Ctx {
    /// This thread's turn at the device, on an OpenGL adapter (the module doc says why); `None` elsewhere, where
    /// wgpu takes calls from several threads at once.
    pub(crate) fn exclusive(&self) -> Option<parking_lot::ReentrantMutexGuard<'_, ()>> {
        self.gl_calls.as_ref().map(|m| m.lock())
    }

    /// The most buffers a kernel may read here (the schedule's rule 8): the adapter's storage buffers per shader
    /// stage less the output, random-number keys and fault record every kernel may bind, within the schedule's
    /// default. OpenGL adapters allow 16 (llvmpipe), Vulkan's lavapipe 32.
    pub(crate) fn max_kernel_inputs(&self) -> usize {
        let bindings = self.limits.max_storage_buffers_per_shader_stage as usize;
        bindings.saturating_sub(3).clamp(2, kiln_jit::kernel::schedule::MAX_KERNEL_INPUTS)
    }

    /// A pooled buffer for `len` elements of `dtype` (contents undefined).
    pub(crate) fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<DeviceBuffer, BackendError> {
        let bytes = crate::pool_bucket(len * wgsl::WORD) as u64;
        let max = self.limits.max_storage_buffer_binding_size.min(self.limits.max_buffer_size);
        if bytes > max {
            return Err(BackendError::Execute {
                device: NAME,
                reason: format!(
                    "a buffer of {len} x {dtype} ({bytes} bytes) exceeds this adapter's limit of {max} bytes"
                ),
            });
        }
        let pooled = self.pool.lock().get_mut(&bytes).and_then(Vec::pop);
        let buf = pooled.unwrap_or_else(|| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        Ok(DeviceBuffer { buf: Some(buf), dtype, len, ctx: self.clone() })
    }

    fn layout(&self, inputs: usize, rng: bool, fault: bool) -> Arc<Layout> {
        let mut layouts = self.layouts.lock();
        layouts
            .entry((inputs, rng, fault))
            .or_insert_with(|| {
                let entry = |binding: usize, read_only: bool| wgpu::BindGroupLayoutEntry {
                    binding: binding as u32,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                };
                let mut entries: Vec<_> = (0..inputs).map(|i| entry(i, true)).collect();
                entries.push(entry(inputs, false));
                if rng {
                    entries.push(entry(inputs + 1, true));
                }
                if fault {
                    entries.push(entry(inputs + 1 + rng as usize, false));
                }
                let bind = self
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries });
                let pipeline = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: None,
                    bind_group_layouts: &[Some(&bind)],
                    immediate_size: 0,
                });
                Arc::new(Layout { bind, pipeline })
            })
            .clone()
    }

    /// The pipeline for a rendered kernel (cached by source), or the shader compiler's error with the source.
    pub(crate) fn pipeline(&self, k: &WgslKernel) -> Result<Arc<Pipeline>, String> {
        if let Some(p) = self.pipelines.lock().get(&k.source) {
            return Ok(p.clone());
        }
        let bindings = k.inputs + 1 + k.uses_rng as usize + k.can_fault as usize;
        let max = self.limits.max_storage_buffers_per_shader_stage as usize;
        if bindings > max {
            return Err(format!(
                "kernel {} binds {bindings} storage buffers; this adapter allows {max} per shader stage",
                k.name
            ));
        }
        let layout = self.layout(k.inputs, k.uses_rng, k.can_fault);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&k.name),
            source: wgpu::ShaderSource::Wgsl(k.source.as_str().into()),
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&k.name),
            layout: Some(&layout.pipeline),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("kernel {}: the WGSL did not compile: {e}\n{}", k.name, k.source));
        }
        let p = Arc::new(Pipeline { pipeline, layout });
        self.pipelines.lock().insert(k.source.clone(), p.clone());
        Ok(p)
    }

    /// Binds `buffers` (inputs, output, then rng and the fault record if any) and records one dispatch.
    pub(crate) fn dispatch(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        p: &Pipeline,
        buffers: &[&wgpu::Buffer],
        groups: (u32, u32),
    ) {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
            .collect();
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.layout.bind,
            entries: &entries,
        });
        pass.set_pipeline(&p.pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
    }

    /// Waits for everything submitted so far.
    pub(crate) fn wait(&self) -> Result<(), BackendError> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map(|_| ())
            .map_err(|e| BackendError::Execute { device: NAME, reason: format!("waiting for the device: {e}") })
    }

    /// Copies `len` words of `src` into host memory (blocking).
    pub(crate) fn read_words(&self, src: &wgpu::Buffer, len: usize) -> Result<Vec<u8>, BackendError> {
        let bytes = (len * wgsl::WORD) as u64;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let exec = |reason: String| BackendError::Execute { device: NAME, reason };
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: None })
            .map_err(|e| exec(format!("waiting for the device: {e}")))?;
        rx.recv()
            .map_err(|_| exec("the readback was dropped".into()))?
            .map_err(|e| exec(format!("mapping the readback buffer: {e}")))?;
        let data =
            staging.get_mapped_range(..).map_err(|e| exec(format!("reading the readback buffer: {e}")))?.to_vec();
        staging.unmap();
        Ok(data)
    }
}

/// The words a host buffer becomes on the device, or an error for dtypes WGSL cannot hold.
fn to_words(data: &HostBuffer) -> Result<Vec<u8>, BackendError> {
    let words: Vec<u8> = match data {
        HostBuffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F16(v) => {
            // Two bytes each, padded to whole 4-byte words (wgpu copies in multiples of 4).
            let mut b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            b.resize(b.len().next_multiple_of(4), 0);
            b
        }
        HostBuffer::U8(v) => v.iter().flat_map(|&x| (x as u32).to_le_bytes()).collect(),
        HostBuffer::Bool(v) => v.iter().flat_map(|&x| (x as u32).to_le_bytes()).collect(),
        HostBuffer::I64(_) | HostBuffer::F64(_) | HostBuffer::BF16(_) => return Err(unsupported(data.dtype())),
    };
    Ok(words)
}

/// The error for a dtype the device cannot hold.
pub fn unsupported(d: DType) -> BackendError {
    if d == DType::F16 {
        let adapter = backend().map_or_else(|_| "this adapter".to_string(), |b| b.ctx.info.name.clone());
        return BackendError::Unsupported {
            device: NAME,
            reason: format!(
                "f16 needs the wgpu feature SHADER_F16, which {adapter} does not offer{}; keep f16 tensors on \
                 Device::cpu() or convert them to f32 first",
                if std::env::var("KILN_WGPU_F16").is_ok_and(|v| v == "off" || v == "0") {
                    " (declined: KILN_WGPU_F16=off)"
                } else {
                    ""
                }
            ),
        };
    }
    if d == DType::BF16 {
        return BackendError::Unsupported {
            device: NAME,
            reason: "bf16 is not supported on wgpu (WGSL has no bf16 type, and kiln does not emulate one); keep bf16 \
                     tensors on Device::cpu() or convert them to f32 (or f16) first"
                .to_string(),
        };
    }
    BackendError::Unsupported {
        device: NAME,
        reason: format!(
            "{d} is not supported (WGSL has no 64-bit types); keep {d} tensors on Device::cpu() or convert them to {} first",
            if d.is_float() { "f32" } else { "i32" }
        ),
    }
}

fn from_words(dtype: DType, bytes: &[u8], len: usize) -> HostBuffer {
    if dtype == DType::F16 {
        let halves = bytes.chunks_exact(2).take(len);
        return HostBuffer::F16(halves.map(|c| kiln_jit::f16::from_le_bytes([c[0], c[1]])).collect());
    }
    let words = bytes.chunks_exact(4).take(len).map(|c| [c[0], c[1], c[2], c[3]]);
    match dtype {
        DType::F32 => HostBuffer::F32(words.map(f32::from_le_bytes).collect()),
        DType::I32 => HostBuffer::I32(words.map(i32::from_le_bytes).collect()),
        DType::U32 => HostBuffer::U32(words.map(u32::from_le_bytes).collect()),
        DType::U8 => HostBuffer::U8(words.map(|w| u32::from_le_bytes(w) as u8).collect()),
        DType::Bool => HostBuffer::Bool(words.map(|w| u32::from_le_bytes(w) != 0).collect()),
        DType::I64 | DType::F64 | DType::F16 | DType::BF16 => unreachable!("never allocated on wgpu, or read above"),
    }
}

/// How one launch runs.
impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        let _turn = self.ctx.exclusive();
        plan::compile(self, graph)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        let _turn = self.ctx.exclusive();
        self.ctx.wait()
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        if !self.supports(data.dtype()) {
            return Err(unsupported(data.dtype()));
        }
        let words = to_words(&data)?;
        let _turn = self.ctx.exclusive();
        let b = self.ctx.alloc(data.dtype(), data.len())?;
        if !words.is_empty() {
            self.ctx.queue.write_buffer(b.raw(), 0, &words);
        }
        Ok(Buffer::Wgpu(b))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        let Buffer::Wgpu(b) = buffer else { return Err(BackendError::ForeignBuffer { device: NAME }) };
        if b.len == 0 {
            return Ok(from_words(b.dtype, &[], 0));
        }
        let _turn = self.ctx.exclusive();
        let bytes = self.ctx.read_words(b.raw(), b.len)?;
        Ok(from_words(b.dtype, &bytes, b.len))
    }

    // No `set_autotune_mode`: this device's GEMM searches follow `KILN_AUTOTUNE` (read once).
    fn take_last_tune_record(&self) -> Option<kiln_autotune::TuneRecord> {
        take_last_tune_record()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_backends;

    #[test]
    fn wgpu_backend_names_parse_and_an_unknown_one_is_refused_with_the_valid_ones() {
        assert_eq!(parse_backends("vulkan"), Ok(wgpu::Backends::VULKAN));
        assert_eq!(parse_backends(" GL , vk"), Ok(wgpu::Backends::GL | wgpu::Backends::VULKAN));
        let err = parse_backends("vulkan,bogus").unwrap_err();
        assert!(err.contains("unknown backend \"bogus\"") && err.contains("vulkan, vk, gl"), "{err}");
        assert!(parse_backends("vulkan,").is_err(), "an empty name in a list names nothing");
    }
}
