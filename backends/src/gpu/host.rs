//! The GPU devices' plan on the host (feature `host-gpu`, for tests): a [`Driver`] whose memory is host memory and
//! whose kernels are the rendered CUDA C compiled by the host's C++ compiler under the shim
//! (`kiln_jit::render::cuda::host::kernel_unit`), a plan's new kernels in one shared library.
//! So the plan the CUDA and HIP devices run (`gpu::plan`: rendering, loading, temps, passthrough copies, the rng
//! keys, the fault record, launch order, upload and download) runs end to end and is compared with the interpreter
//! on a machine without a GPU (`tests/gpu_plan_host.rs`). What the shim cannot stand in for (the device's math
//! library, its memory model, timing) is in `host.rs`'s doc; this adds nothing a GPU driver does beyond the plan.

use super::{Driver, Node};
use crate::gpu_library::LibGemm;
use crate::{Backend, BackendError, Buffer, Executable};
use kiln_jit::render::cuda::{Flavor, GpuKernel, host};
use kiln_jit::{DType, Graph, HostBuffer};
use libloading::Library;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const NAME: &str = "host-gpu";

type Run = unsafe extern "C" fn(*mut *mut c_void, u32, u32, u32);

/// A stand-in GPU on the host; see the module doc.
pub struct HostGpu {
    ctx: Arc<Ctx>,
}

pub(crate) struct Ctx {
    /// The C++ compiler (`c++`).
    cxx: String,
    /// Where the kernels' libraries are written (removed with the device).
    dir: std::path::PathBuf,
    functions: Mutex<HashMap<String, Arc<Loaded>>>,
    /// Whether plans replay as graphs, as on a CUDA device.
    graphs: bool,
    /// Whether GEMM kernels are raced, as on a GPU device.
    races: bool,
    /// Whether the library's contestant races alone where it takes a GEMM (`HostGpu::racing_the_library_alone`).
    library_alone: bool,
    /// Graphs built, graph launches and nodes patched on this stand-in (`HostGpu::graph_counts`).
    graph_counts: [AtomicUsize; 3],
    /// C++ units compiled for this stand-in (`HostGpu::compile_units`).
    units: AtomicUsize,
}

/// A kernel's driver in its plan's library.
pub(crate) struct Loaded {
    run: Run,
    _lib: Arc<Library>,
}

/// Host memory standing for device memory: 8-byte words (every dtype's alignment), written by the kernels through
/// raw pointers (hence the interior mutability).
pub struct HostMem {
    words: Box<[std::cell::UnsafeCell<u64>]>,
    dtype: DType,
    len: usize,
}

// SAFETY: a plan's launches run one after another on the calling thread and every access goes through raw pointers
// taken from the cells; nothing reads a buffer while a kernel writes it (the plan orders them as on a GPU stream).
unsafe impl Sync for HostMem {}

impl HostMem {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }
}

impl std::fmt::Debug for HostMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostMem({}[{}])", self.dtype, self.len)
    }
}

impl HostGpu {
    /// A stand-in GPU whose kernels `cxx` (a C++20 compiler) compiles; its plans replay as graphs from their second
    /// run, as a CUDA device's do. Its GEMMs run their best-scored candidate: a race costs a C++ compile per
    /// candidate here and times nothing a GPU would ([`HostGpu::racing`] races).
    pub fn new(cxx: &str) -> HostGpu {
        HostGpu::with(cxx, true, false, false)
    }

    /// The same stand-in whose plans launch one by one in every run (no graph replays), to compare with.
    pub fn without_graphs(cxx: &str) -> HostGpu {
        HostGpu::with(cxx, false, false, false)
    }

    /// The GEMM kernel `k` run once as the race's library contestant on `inputs` (the stand-in's library GEMM,
    /// `gpu_library::run_on_host`, with the epilogue or followed by the epilogue pass under the shim), and whether it
    /// ran a pass.
    pub fn run_library_with(
        &self,
        k: &kiln_jit::kernel::KernelIr,
        inputs: &[&HostBuffer],
    ) -> Result<(HostBuffer, bool), String> {
        super::tune::run_library(&self.ctx, k, inputs)
    }

    /// The same stand-in racing its GEMM kernels, and its library GEMM, as a GPU device does (`gpu/tune.rs`), to
    /// test the race.
    pub fn racing(cxx: &str) -> HostGpu {
        HostGpu::with(cxx, true, true, false)
    }

    /// GEMM kernel `k` forced to candidate `c` of the GPU devices' race, run once on `inputs` under the shim.
    pub fn run_gemm_with(
        &self,
        k: &kiln_jit::kernel::KernelIr,
        c: crate::gpu_gemm::GpuGemm,
        inputs: &[&HostBuffer],
    ) -> Result<HostBuffer, String> {
        super::tune::run_with(&self.ctx, k, c, inputs)
    }

    /// The racing stand-in whose race, where its library takes a GEMM, has the library's contestant alone: the
    /// tests that must see the library's launches in a plan (its product, then an epilogue pass) whichever would win.
    pub fn racing_the_library_alone(cxx: &str) -> HostGpu {
        HostGpu::with(cxx, true, true, true)
    }

    fn with(cxx: &str, graphs: bool, races: bool, library_alone: bool) -> HostGpu {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kiln-host-gpu-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let functions = Mutex::new(HashMap::new());
        let graph_counts = Default::default();
        let ctx = Ctx { cxx: cxx.into(), dir, functions, graphs, races, library_alone, graph_counts, units: 0.into() };
        HostGpu { ctx: Arc::new(ctx) }
    }

    /// Compiles the kernels the plans of `graphs` will run into `units` libraries, compiled side by side, so that
    /// compiling the plans afterwards finds every kernel loaded: a test of many small plans then pays the C++
    /// compiler's start-up (most of a small plan's compile) once per unit, not once per plan. Renders as a plan
    /// does on a stand-in that does not race its GEMMs (a racing one compiles its candidates as it races).
    pub fn compile_ahead(&self, graphs: &[&Graph], units: usize) -> Result<(), String> {
        let mut rendered = Vec::new();
        for g in graphs {
            for l in crate::gpu_cache::schedule(g).launches {
                rendered.push(crate::gpu_cache::render(Flavor::Cuda, self.ctx.arch(), &l.kernel)?);
            }
        }
        let kernels: Vec<(&str, &str)> = rendered.iter().map(|k| (k.source.as_str(), k.name.as_str())).collect();
        let new = self.ctx.not_loaded(&kernels);
        let per = new.len().div_ceil(units.max(1)).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = new.chunks(per).map(|c| s.spawn(|| self.ctx.compile_unit(c))).collect();
            handles.into_iter().try_for_each(|h| h.join().map_err(|_| "a compiling thread panicked".to_string())?)
        })
    }

    /// How many C++ units (one compiler run each, a shared library of kernels) this stand-in has compiled: a plan
    /// whose kernels, race contestants included, are compiled in one batch costs one.
    pub fn compile_units(&self) -> usize {
        self.ctx.units.load(Ordering::Relaxed)
    }

    /// (graphs built, graph launches, nodes patched) by this stand-in's plans so far: what its replays did, apart
    /// from any other device in the process.
    pub fn graph_counts(&self) -> (usize, usize, usize) {
        let [b, l, p] = &self.ctx.graph_counts;
        (b.load(Ordering::Relaxed), l.load(Ordering::Relaxed), p.load(Ordering::Relaxed))
    }
}

impl Ctx {
    /// Those of `kernels` (`(source, name)`) not loaded yet, each once.
    fn not_loaded<'a>(&self, kernels: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let loaded = self.functions.lock();
        let mut new: Vec<(&str, &str)> = Vec::new();
        for &(source, name) in kernels {
            if !loaded.contains_key(source) && !new.iter().any(|(s, _)| *s == source) {
                new.push((source, name));
            }
        }
        new
    }

    /// Compiles `new` into one library under the shim and loads each kernel's driver (nothing for none).
    fn compile_unit(&self, new: &[(&str, &str)]) -> Result<(), String> {
        if new.is_empty() {
            return Ok(());
        }
        static UNITS: AtomicUsize = AtomicUsize::new(0);
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let n = UNITS.fetch_add(1, Ordering::Relaxed);
        self.units.fetch_add(1, Ordering::Relaxed);
        let lib = self.dir.join(format!("plan{n}.so"));
        host::compile_library(&self.cxx, &host::kernel_unit(new), &lib)?;
        // SAFETY: a library just compiled from the shim and the plan's kernels; its initializers are the C++
        // runtime's.
        let library = Arc::new(unsafe { Library::new(&lib) }.map_err(|e| format!("loading {}: {e}", lib.display()))?);
        let mut loaded = self.functions.lock();
        for (i, (source, _)) in new.iter().enumerate() {
            let symbol = format!("kiln_run_{i}\0");
            // SAFETY: each driver's signature as `host::kernel_unit` writes it.
            let run = unsafe { library.get::<Run>(symbol.as_bytes()).map(|s| *s) }.map_err(|e| e.to_string())?;
            loaded.insert(source.to_string(), Arc::new(Loaded { run, _lib: library.clone() }));
        }
        Ok(())
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Driver for Ctx {
    const NAME: &'static str = NAME;
    const FLAVOR: Flavor = Flavor::Cuda;
    type Mem = HostMem;
    type Function = Arc<Loaded>;

    fn arch(&self) -> &str {
        "host"
    }

    fn model(&self) -> String {
        "host stand-in".into()
    }

    fn wrap(m: HostMem) -> Buffer {
        Buffer::HostGpu(m)
    }

    fn unwrap(b: &Buffer) -> Option<&HostMem> {
        match b {
            Buffer::HostGpu(m) => Some(m),
            _ => None,
        }
    }

    fn unwrap_mut(b: &mut Buffer) -> Option<&mut HostMem> {
        match b {
            Buffer::HostGpu(m) => Some(m),
            _ => None,
        }
    }

    fn owns(&self, _m: &HostMem) -> bool {
        true
    }

    fn addr(m: &HostMem) -> u64 {
        m.ptr() as u64
    }

    fn alloc(self: &Arc<Self>, dtype: DType, len: usize) -> Result<HostMem, BackendError> {
        let words = (len * dtype.size_of()).div_ceil(8).max(1);
        // Filled with a pattern, not zeros: a kernel that reads memory nothing wrote shows up in the results.
        let words = (0..words).map(|_| std::cell::UnsafeCell::new(0x7fc0_0000_7fc0_0000)).collect();
        Ok(HostMem { words, dtype, len })
    }

    /// Compiles the kernels not loaded yet into one library (one C++ compile per plan) and loads them; `load` then
    /// finds each by its source. There is no code object to hand back.
    fn compile(&self, kernels: &[(&str, &str)]) -> Result<Vec<Vec<u8>>, String> {
        let new = self.not_loaded(kernels);
        self.compile_unit(&new)?;
        Ok(vec![Vec::new(); kernels.len()])
    }

    fn load(&self, k: &GpuKernel, _code: &[u8]) -> Result<Arc<Loaded>, String> {
        let loaded = self.functions.lock();
        loaded.get(&k.source).cloned().ok_or_else(|| format!("kernel {} was not compiled", k.name))
    }

    fn copy(&self, src: &HostMem, dst: &mut HostMem, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: both hold at least `bytes` (the plan copies an output from an input of its dtype and length), and
        // are distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr(), dst.ptr(), bytes) };
        Ok(())
    }

    fn write(&self, dst: &mut HostMem, bytes: &[u8]) -> Result<(), BackendError> {
        // SAFETY: `dst` holds at least `bytes.len()` bytes (callers write at most what they allocated).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.ptr(), bytes.len()) };
        Ok(())
    }

    fn read(&self, src: &HostMem, bytes: usize) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; bytes];
        // SAFETY: `src` holds at least `bytes` bytes (callers read at most its elements).
        unsafe { std::ptr::copy_nonoverlapping(src.ptr(), out.as_mut_ptr(), bytes) };
        Ok(out)
    }

    unsafe fn launch(&self, f: &Arc<Loaded>, grid: (u32, u32), block: u32, params: &[u64]) -> Result<(), String> {
        let mut args: Vec<*mut c_void> = params.iter().map(|&p| p as *mut c_void).collect();
        // SAFETY: the caller's contract (`Driver::launch`): `params` are the kernel's buffers in its order, each
        // covering what it indexes; the driver runs every thread of the grid before it returns.
        unsafe { (f.run)(args.as_mut_ptr(), grid.0, grid.1, block) };
        Ok(())
    }

    /// The stand-in's library GEMM is the problem itself, run by `gpu_library::run_on_host` as a library would.
    type Library = LibGemm;

    fn has_library(&self) -> bool {
        true
    }

    fn library(&self, g: &LibGemm) -> Result<LibGemm, String> {
        Ok(g.clone())
    }

    unsafe fn library_launch(&self, g: &LibGemm, ptrs: [u64; 4]) -> Result<(), String> {
        // SAFETY: the caller's contract (`Driver::library_launch`): each address holds what `g` indexes.
        unsafe { crate::gpu_library::run_on_host(g, ptrs) };
        Ok(())
    }

    /// The nodes with their parameters copied, as a CUDA graph holds them: a replay runs what was built or set
    /// last, never the run's own values, so a node the plan forgot to patch reads stale buffers and the tests see it.
    type Graph = Vec<HostNode>;

    fn graphs(&self) -> bool {
        self.graphs
    }

    fn races_gemms(&self) -> bool {
        self.races
    }

    fn library_alone(&self) -> bool {
        self.library_alone
    }

    unsafe fn graph_build(&self, nodes: &[Node<'_, Self>]) -> Result<Self::Graph, String> {
        self.graph_counts[0].fetch_add(1, Ordering::Relaxed);
        Ok(nodes.iter().map(HostNode::of).collect())
    }

    unsafe fn graph_set(&self, g: &mut Self::Graph, i: usize, node: &Node<'_, Self>) -> Result<(), String> {
        let held = g.get_mut(i).ok_or_else(|| format!("the graph has no node {i}"))?;
        *held = HostNode::of(node);
        self.graph_counts[2].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn graph_launch(&self, g: &Self::Graph) -> Result<(), String> {
        self.graph_counts[1].fetch_add(1, Ordering::Relaxed);
        for n in g {
            // SAFETY: the caller's contract (`Driver::graph_launch`): every node's parameters are live memory.
            match n {
                HostNode::Kernel(f, grid, block, params) => unsafe { self.launch(f, *grid, *block, params) }?,
                HostNode::Library(l, params) => unsafe { self.library_launch(l, *params) }?,
            }
        }
        Ok(())
    }
}

/// A node of the stand-in's graph, its parameters copied.
pub(crate) enum HostNode {
    Kernel(Arc<Loaded>, (u32, u32), u32, Vec<u64>),
    Library(LibGemm, [u64; 4]),
}

impl HostNode {
    fn of(n: &Node<'_, Ctx>) -> HostNode {
        match n {
            Node::Kernel { function, grid, block, params } => {
                HostNode::Kernel((*function).clone(), *grid, *block, params.to_vec())
            }
            Node::Library { gemm, params } => HostNode::Library((*gemm).clone(), *params),
        }
    }
}

impl Backend for HostGpu {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        super::plan::compile(&self.ctx, graph)
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        super::upload(&self.ctx, data)
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        super::download(&*self.ctx, buffer)
    }
}
