//! The CPU JIT: schedules a graph into kernels, renders each to CLIF, compiles it with Cranelift for the host
//! (cranelift-native picks up AVX/FMA/SSE4 flags), and replays the resulting launch list.
//!
//! Compilation goes through one process-wide `JITModule` behind a mutex (compiling is the slow path), and a
//! kernel cache keyed by the kernel IR's full text plus the vectorization choice: the IR determines the CLIF, and
//! the module is this process's host, so the text is a complete key. Code is never freed: plans live as long as the
//! process's plan cache, which has no eviction either.
//!
//! Replay (`JitPlan::run`) does no hashing and takes no lock per kernel: launches are a flat list with pre-bound
//! slots, and outputs and temps come from the host buffer pool (`host_pool`). A launch runs split over the thread
//! pool when its work passes `pool::min_parallel_work()`, else inline. With `KILN_PROFILE=1` every launch is timed
//! (`profile_report`).

use super::pool;
use crate::plan_run::{Place, Run};
use crate::{BackendError, Buffer, Executable};
use cranelift_codegen::Context;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use kiln_jit::buffer::HostBuffer;
use kiln_jit::dtype::DType;
use kiln_jit::kernel::{Donation, KernelIr, KernelPlan, Slot};
use kiln_jit::render::clif;
use kiln_jit::{Graph, RngKey};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

const NAME: &str = "cpu";

/// `fn(args, rng, start, end)`: see `kiln_jit::render::clif`.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, *const u64, i64, i64);

pub(crate) struct Compiler {
    isa: OwnedTargetIsa,
    /// Whether the host has FMA (cranelift-native enabled `has_fma`), so `fma` lowers to an instruction.
    fma: bool,
    kernels: rustc_hash::FxHashMap<(String, bool), KernelFn>,
    /// The mappings every handed-out `KernelFn` points into, kept for the life of the process.
    code: Vec<dynasmrt::ExecutableBuffer>,
    /// Cached kernels mapped ahead of use ([`premap_cached_kernels`]), by artifact name.
    premapped: rustc_hash::FxHashMap<String, KernelFn>,
    next: u32,
}

// SAFETY: the code mappings are immutable once made executable, and the compiler is only touched under the
// COMPILER mutex; the kernels it hands out are callable from any thread.
unsafe impl Send for Compiler {}

/// Cranelift kernels compiled, and loaded from the kernel cache instead of compiled, since the process started.
pub(crate) static CLIF_COMPILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static CLIF_LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) static COMPILER: LazyLock<Result<Mutex<Compiler>, String>> =
    LazyLock::new(|| Compiler::new().map(Mutex::new));

impl Compiler {
    fn new() -> Result<Compiler, String> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
        flags.set("is_pic", "false").map_err(|e| e.to_string())?;
        let isa = cranelift_native::builder()
            .map_err(|e| format!("host ISA not supported by Cranelift: {e}"))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())?;
        let fma = isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        Ok(Compiler { isa, fma, kernels: Default::default(), code: Vec::new(), premapped: Default::default(), next: 0 })
    }

    /// Compiles `k` (or finds it), returning the entry point and, for dumps, the CLIF and disassembly.
    pub(crate) fn kernel(&mut self, k: &KernelIr, dump: bool) -> Result<(KernelFn, Option<(String, String)>), String> {
        let text = k.to_text();
        for vectorize in [true, false] {
            if vectorize && !clif::vectorizable(k) {
                continue;
            }
            if !dump && let Some(&f) = self.kernels.get(&(text.clone(), vectorize)) {
                return Ok((f, None));
            }
            match self.compile(k, vectorize, dump) {
                Ok((f, d)) => {
                    self.kernels.insert((text, vectorize), f);
                    return Ok((f, d));
                }
                // A vector form the host cannot lower (say, i32x4 multiply without SSE4.1) falls back to scalar.
                Err(e) if vectorize => tracing_note(&format!("{}: vector form failed ({e}); using scalar", k.name)),
                Err(e) => return Err(e),
            }
        }
        unreachable!("the scalar form either compiles or errors")
    }

    /// Compiles `k` with Cranelift, or maps its machine code from the kernel cache (keyed by everything that
    /// determines the code: the kernel IR text, the render options and the renderer's revision; the store's
    /// namespace adds the kiln version, which pins the Cranelift version, and the CPU fingerprint). With `dump`, it
    /// always compiles (for the text).
    fn compile(
        &mut self,
        k: &KernelIr,
        vectorize: bool,
        dump: bool,
    ) -> Result<(KernelFn, Option<(String, String)>), String> {
        use std::sync::atomic::Ordering;
        let index = self.next;
        self.next += 1;
        let opts = clif::RenderOptions { vectorize, fma: self.fma, tile: clif::TileConfig::default() };
        let store = kiln_autotune::Store::global();
        let key = format!("{}|{opts:?}|r{}", k.to_text(), clif::REVISION);
        let name = format!(
            "{CLIF_ARTIFACT_PREFIX}{:016x}-{:016x}",
            kiln_autotune::checksum_of([key.as_str()]),
            kiln_autotune::checksum_of([key.as_str(), "kiln"])
        );
        if !dump && let Some(&f) = self.premapped.get(&name) {
            CLIF_LOADS.fetch_add(1, Ordering::Relaxed);
            return Ok((f, None));
        }
        if !dump
            && let Some(bytes) = store.get_artifact(&name)
            && let Ok(code) = super::code::RelocatableCode::from_artifact(&bytes)
            && let Ok(f) = self.map(&code)
        {
            CLIF_LOADS.fetch_add(1, Ordering::Relaxed);
            return Ok((f, None));
        }
        let func = clif::render_with(k, index, self.isa.frontend_config(), opts);
        let clif_text = dump.then(|| func.display().to_string());
        let mut ctx = Context::for_function(func);
        ctx.set_disasm(dump);
        let mut ctrl = cranelift_codegen::control::ControlPlane::default();
        let (bytes, raw_relocs, disasm) = {
            let c = ctx.compile(&*self.isa, &mut ctrl).map_err(|e| format!("{}: {:?}", k.name, e.inner))?;
            (c.code_buffer().to_vec(), c.buffer.relocs().to_vec(), c.vcode.clone().unwrap_or_default())
        };
        let mut relocs = Vec::with_capacity(raw_relocs.len());
        for r in raw_relocs {
            use cranelift_codegen::FinalizedRelocTarget;
            use cranelift_codegen::binemit::Reloc;
            use cranelift_codegen::ir::ExternalName;
            match (r.kind, &r.target) {
                (Reloc::Abs8, FinalizedRelocTarget::ExternalName(ExternalName::User(u))) => {
                    let callee = &ctx.func.params.user_named_funcs()[*u];
                    relocs.push((r.offset, callee.index, r.addend));
                }
                (kind, target) => return Err(format!("{}: unexpected relocation {kind:?} to {target:?}", k.name)),
            }
        }
        let code = super::code::RelocatableCode { code: bytes, relocs };
        let f = self.map(&code)?;
        CLIF_COMPILES.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = store.put_artifact(&name, &code.to_artifact()) {
            cache_write_failed(&format!("kernel {}", k.name), &e);
        }
        Ok((f, clif_text.map(|c| (c, disasm))))
    }

    /// Maps relocatable code and returns its entry point (the code starts with the function).
    fn map(&mut self, code: &super::code::RelocatableCode) -> Result<KernelFn, String> {
        let buf = code.load()?;
        // SAFETY: the code is a function compiled from `kernel_signature`, which is exactly `KernelFn`'s ABI, starting
        // at offset 0, with its libcall addresses patched for this process; `buf` is kept in `self.code` for the life
        // of the process, so the pointer stays valid.
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(buf.ptr(dynasmrt::AssemblyOffset(0))) };
        self.code.push(buf);
        Ok(f)
    }
}

/// Maps every cached Cranelift kernel the store holds in memory (after `import_bundle`: the bundle's) into one
/// executable mapping, so that the plans of a warm process find their kernels mapped already instead of paying a
/// mapping each (see `code`'s module doc). Kernels mapped before are skipped; a failure only logs (`KILN_LOG`):
/// the kernels then map one by one when used, as without this.
pub(crate) fn premap_cached_kernels(store: &kiln_autotune::Store) {
    let Ok(compiler) = COMPILER.as_ref() else { return };
    let mut c = compiler.lock();
    let mut names = Vec::new();
    let mut blobs = Vec::new();
    for (name, bytes) in store.artifacts_with_prefix(CLIF_ARTIFACT_PREFIX) {
        if c.premapped.contains_key(&name) {
            continue;
        }
        match super::code::RelocatableCode::from_artifact(&bytes).and_then(|code| code.patched()) {
            Ok(code) => {
                names.push(name);
                blobs.push(code);
            }
            Err(e) => tracing_note(&format!("cached kernel {name} not premapped: {e}")),
        }
    }
    if blobs.is_empty() {
        return;
    }
    let slices: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    match super::code::map_together(&slices) {
        Ok((buf, offsets)) => {
            for (name, off) in names.into_iter().zip(offsets) {
                // SAFETY: as in `Compiler::map`: each blob is a kernel compiled from `kernel_signature` (`KernelFn`'s
                // ABI) starting at its offset, patched for this process; `buf` is kept in `code` for the life of the
                // process.
                let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(buf.ptr(dynasmrt::AssemblyOffset(off))) };
                c.premapped.insert(name, f);
            }
            c.code.push(buf);
        }
        Err(e) => tracing_note(&format!("cached kernels not premapped: {e}")),
    }
}

/// Names of cached Cranelift kernels in the store start with this.
const CLIF_ARTIFACT_PREFIX: &str = "clif-";

/// A cache entry could not be written (a read-only or full cache dir): the result still holds for this process.
/// Said once per process on stderr, not once per kernel; `KILN_LOG` shows every one.
pub fn cache_write_failed(what: &str, e: &dyn std::fmt::Display) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "kiln: cannot write to the kernel and tuning cache ({e}); results hold for this process only \
             (set KILN_CACHE_DIR to a writable dir, or to `off`)"
        );
    } else {
        tracing_note(&format!("{what} not cached: {e}"));
    }
}

/// Diagnostics that are not errors go to stderr only when `KILN_LOG` is set (the tracing layer comes later).
pub(crate) fn tracing_note(msg: &str) {
    if std::env::var_os("KILN_LOG").is_some() {
        eprintln!("kiln: {msg}");
    }
}

/// How a launch runs: a Cranelift kernel split by rows, or a generated GEMM or 8-lane elementwise kernel (whose
/// drivers split themselves).
enum Exec {
    Clif(KernelFn),
    Gemm(Box<super::gemm::CompiledGemm>),
    Wide(Box<super::wide::WideKernel>),
}

struct CompiledLaunch {
    name: String,
    exec: Exec,
    inputs: Vec<Slot>,
    output: Slot,
    /// Extent of output loop 0 (1 for a zero-dim output): the range the kernel splits over threads.
    rows: usize,
    /// Element-operations of the whole launch, for the pool's inline-or-split decision.
    work: usize,
}

pub(crate) struct JitPlan {
    launches: Vec<CompiledLaunch>,
    /// Each temp's length in `i64` elements (8-byte aligned, whatever dtype the kernels store in it).
    temps: Vec<usize>,
    outputs: Vec<(DType, usize)>,
    passthrough: Vec<(usize, usize)>,
    /// The schedule's donation candidates whose launch loads each element before storing it (see `compile`).
    donations: Vec<Donation>,
    /// Scratch reused by the next run if no other thread holds it.
    arena: Mutex<Arena>,
}

/// Per-run scratch: intermediate buffers, the pointer table of the current launch, the rng words, the outputs'
/// data pointers.
#[derive(Default)]
struct Arena {
    /// One buffer per plan temp (`i64` elements, for 8-byte alignment), from the host pool and given back to it
    /// when the arena is dropped. A temp is written by its producing launch before any launch reads it, so its
    /// initial contents do not matter.
    temps: Vec<HostBuffer>,
    ptrs: Vec<*mut u8>,
    rng_words: Vec<u64>,
    out_ptrs: Vec<*mut u8>,
}

impl Drop for Arena {
    fn drop(&mut self) {
        for t in self.temps.drain(..) {
            crate::host_pool::give(t);
        }
    }
}

// SAFETY: the raw pointers in `ptrs` and `out_ptrs` are scratch, rewritten in every run before they are read and
// never read across runs.
unsafe impl Send for Arena {}

/// Compiles every kernel of `graph`'s schedule.
pub(crate) fn compile(graph: &Graph) -> Result<JitPlan, BackendError> {
    let err = |reason: String| BackendError::Compile { device: NAME, reason };
    // The generated GEMM packs operands of any layout, so a transposed weight is not copied first.
    let opts = kiln_jit::kernel::ScheduleOptions { transpose_copy: !super::gemm::select::generated_gemm_enabled() };
    let plan: KernelPlan = kiln_jit::kernel::schedule_with(graph, opts);
    let dump = crate::dump::Dump::start(graph, &plan);
    let compiler = COMPILER.as_ref().map_err(|e| err(e.clone()))?;
    let mut launches = Vec::with_capacity(plan.launches.len());
    let mut budget = super::gemm::select::TuneBudget::for_compile();
    // Inputs the plan writes over (a training step's weights) and the launches that write them: a GEMM reading one
    // as B, or writing one, is chosen for that (`config::step_candidates`).
    let candidates = plan.donation_candidates();
    {
        let mut c = compiler.lock();
        for (index, l) in plan.launches.iter().enumerate() {
            let cx = super::gemm::config::StepContext {
                b_rewritten: kiln_jit::kernel::gemm::GemmView::of(&l.kernel).is_some_and(|v| {
                    matches!(l.inputs.get(v.b.buf), Some(&Slot::Input(i)) if candidates.iter().any(|d| d.input == i))
                }),
                output_replaces_input: candidates.iter().any(|d| d.launch == index),
            };
            let gemm = super::gemm::select::gemm_for(&mut c, &l.kernel, dump.as_ref(), &mut budget, cx);
            let exec = match gemm.map_err(err)? {
                Some(g) => Exec::Gemm(Box::new(g)),
                None if let Some(w) = super::wide::for_plan(&l.kernel, dump.as_ref()).map_err(err)? => {
                    Exec::Wide(Box::new(w))
                }
                None => {
                    let (f, text) = c.kernel(&l.kernel, dump.is_some()).map_err(err)?;
                    if let (Some(d), Some((clif_text, disasm))) = (&dump, text) {
                        d.kernel_files(&l.kernel, "clif", &clif_text, &disasm);
                    }
                    Exec::Clif(f)
                }
            };
            let rows = l.kernel.out_extents.first().copied().unwrap_or(1);
            launches.push(CompiledLaunch {
                name: l.kernel.name.clone(),
                exec,
                inputs: l.inputs.clone(),
                output: l.output,
                rows,
                work: l.kernel.work(),
            });
        }
    }
    let temps: Vec<usize> = plan.temps.iter().map(|&bytes| bytes.div_ceil(8)).collect();
    let outputs: Vec<(DType, usize)> = plan.outputs.iter().map(|b| (b.dtype, b.len)).collect();
    // The buffers live while this plan runs (what it takes from the host pool, and its inputs), for the buffer
    // profile a warm process pre-allocates. An output that will take a donated input's buffer is counted anyway:
    // whether it does is decided per run (something may hold the old value), and a spare pooled buffer costs
    // memory only, where a missing one costs page faults in the first step.
    let inputs = graph.g.node_weights().filter(|n| matches!(n.op, kiln_jit::Op::Input { .. }));
    crate::host_pool::remember_plan_buffers(
        outputs
            .iter()
            .copied()
            .chain(temps.iter().map(|&w| (DType::I64, w)))
            .chain(inputs.map(|n| (n.dtype, n.shape.numel()))),
    );
    // A Cranelift or wide kernel loads an element's operands before it stores the element; a GEMM does so only with one K
    // block and its epilogue in registers (otherwise C holds partial sums, or the GEMM's result before the
    // epilogue pass reads the operand).
    let donations = candidates
        .into_iter()
        .filter(|d| match &launches[d.launch].exec {
            Exec::Clif(_) | Exec::Wide(_) => true,
            Exec::Gemm(g) => g.reads_epilogue_before_store(),
        })
        .collect();
    Ok(JitPlan {
        launches,
        temps,
        outputs,
        passthrough: plan.passthrough.clone(),
        donations,
        arena: Mutex::new(Arena::default()),
    })
}

/// Marks `len` elements of an output written.
///
/// # Safety
/// The plan's launches must have written all `len` elements, each with a valid value of the element type.
pub(crate) unsafe fn finish_output(b: &mut HostBuffer, len: usize) {
    // SAFETY: the caller guarantees all `len` elements were written; capacity is `len` (output_with_capacity).
    unsafe {
        match b {
            HostBuffer::Bool(v) => v.set_len(len),
            HostBuffer::U8(v) => v.set_len(len),
            HostBuffer::U32(v) => v.set_len(len),
            HostBuffer::I32(v) => v.set_len(len),
            HostBuffer::I64(v) => v.set_len(len),
            HostBuffer::F16(v) => v.set_len(len),
            HostBuffer::F32(v) => v.set_len(len),
            HostBuffer::F64(v) => v.set_len(len),
        }
    }
}

/// A pointer kernels only read through.
pub(crate) fn read_ptr(b: &HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_ptr() as *mut u8,
        HostBuffer::U32(v) => v.as_ptr() as *mut u8,
        HostBuffer::I32(v) => v.as_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_ptr() as *mut u8,
        HostBuffer::F16(v) => v.as_ptr() as *mut u8,
        HostBuffer::F32(v) => v.as_ptr() as *mut u8,
        HostBuffer::F64(v) => v.as_ptr() as *mut u8,
    }
}

/// A pointer kernels write through.
pub(crate) fn write_ptr(b: &mut HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_mut_ptr(),
        HostBuffer::U32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::I32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F16(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F64(v) => v.as_mut_ptr() as *mut u8,
    }
}

/// Raw pointers shared with pool threads for one launch.
struct LaunchArgs {
    f: KernelFn,
    args: *const *mut u8,
    rng: *const u64,
}

impl LaunchArgs {
    fn call(&self, start: usize, end: usize) {
        // SAFETY: `args` holds one valid pointer per kernel buffer, each sized as the kernel IR says (inputs come
        // from the graph's shapes, temps and outputs were sized by the plan), `rng` holds two words per rng slot,
        // and `start..end` lies within output loop 0.
        unsafe { (self.f)(self.args, self.rng, start as i64, end as i64) }
    }
}

// SAFETY: the pointers are only read during `parallel_for`, which returns before the buffers they point into are
// touched again; chunks write disjoint output rows.
unsafe impl Sync for LaunchArgs {}

impl Executable for JitPlan {
    fn run(&self, inputs: &[&Buffer], rng: &[RngKey]) -> Result<Vec<Buffer>, BackendError> {
        self.run_donating(inputs, &mut [], rng)
    }

    fn donations(&self) -> &[Donation] {
        &self.donations
    }

    fn run_donating(
        &self,
        inputs: &[&Buffer],
        donated: &mut [Option<Buffer>],
        rng: &[RngKey],
    ) -> Result<Vec<Buffer>, BackendError> {
        // Checked once up front instead of collected into a Vec: replay allocates nothing it does not hand back.
        for b in inputs {
            super::as_host(b)?;
        }
        let run = Run::start(NAME, &self.donations, &self.outputs, donated, |b| matches!(b, Buffer::Host(_)))?;
        let host =
            |i: usize| -> &HostBuffer { super::as_host(inputs[i]).unwrap_or_else(|_| unreachable!("checked above")) };
        // Built as the `Buffer`s handed back, so the run allocates one Vec for them and nothing else of its own.
        let mut outputs = run.outputs(&self.outputs, donated, |d, n| Ok(Buffer::Host(crate::host_pool::take(d, n))))?;
        for &(o, i) in &self.passthrough {
            outputs[o] = Buffer::Host(host(i).clone());
        }
        let mut guard = self.arena.try_lock();
        let mut own = Arena::default();
        let arena: &mut Arena = match guard.as_deref_mut() {
            Some(a) => a,
            None => &mut own,
        };
        if arena.temps.len() != self.temps.len() {
            arena.temps = self.temps.iter().map(|&words| crate::host_pool::take(DType::I64, words)).collect();
        }
        let Arena { temps, ptrs, rng_words, out_ptrs } = arena;
        out_ptrs.clear();
        out_ptrs.extend(outputs.iter_mut().map(|b| match b {
            Buffer::Host(h) => write_ptr(h),
            #[allow(unreachable_patterns)] // only with another device's feature on
            _ => unreachable!("outputs are host buffers"),
        }));
        rng_words.clear();
        rng_words.extend(rng.iter().flat_map(|k| [k.seed, k.offset]));
        for l in &self.launches {
            ptrs.clear();
            for s in l.inputs.iter().chain([&l.output]) {
                ptrs.push(match run.place(*s) {
                    Place::Input(i) => read_ptr(host(i)),
                    Place::Temp(t) => write_ptr(&mut temps[t]),
                    Place::Output(o) => out_ptrs[o],
                });
            }
            let t0 = profiling().then(std::time::Instant::now);
            match &l.exec {
                Exec::Clif(f) => {
                    let a = LaunchArgs { f: *f, args: ptrs.as_ptr(), rng: rng_words.as_ptr() };
                    let call = |start: usize, end: usize| a.call(start, end);
                    pool::global().parallel_for_work(l.rows, l.work, &call);
                }
                // SAFETY: `ptrs` holds the launch's input buffers then its output, sized as its kernel IR declares
                // (the same contract as a Cranelift kernel). An output is an input of its own launch only as a
                // donation, which `compile` kept for this GEMM because it loads each element before storing it.
                Exec::Gemm(g) => unsafe { g.run(ptrs) },
                // SAFETY: as for a GEMM; the generated code loads each element before storing it (module doc).
                Exec::Wide(w) => unsafe { w.run(ptrs) },
            }
            if let Some(t0) = t0 {
                record(&l.name, t0.elapsed());
            }
        }
        for (o, (b, &(_, len))) in outputs.iter_mut().zip(&self.outputs).enumerate() {
            if let Buffer::Host(b) = b
                && !self.passthrough.iter().any(|&(p, _)| p == o)
            {
                // SAFETY: the schedule makes exactly one launch write each non-passthrough output, and a kernel
                // stores every element of its row-major output range (all rows were launched above); stored
                // values are valid for the element type (bools as 0 or 1).
                unsafe { finish_output(b, len) };
            }
        }
        Ok(outputs)
    }
}

/// `KILN_PROFILE=1`: time every launch (one clock read before and after; off by default).
fn profiling() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os("KILN_PROFILE").is_some_and(|v| v != "0"));
    *ON
}

static PROFILE: Mutex<Option<HashMap<String, (u64, std::time::Duration)>>> = Mutex::new(None);

fn record(name: &str, t: std::time::Duration) {
    let mut p = PROFILE.lock();
    let e = p.get_or_insert_with(HashMap::new).entry(name.to_string()).or_default();
    e.0 += 1;
    e.1 += t;
}

/// One line per kernel run since the process started (with `KILN_PROFILE=1`): launches, total and mean time,
/// heaviest first. Empty when profiling is off.
pub fn profile_report() -> String {
    let p = PROFILE.lock();
    let Some(map) = p.as_ref() else { return String::new() };
    let mut rows: Vec<_> = map.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let mut s = String::from("kernel profile (KILN_PROFILE): total ms | launches | mean µs | kernel\n");
    for (name, (n, t)) in rows {
        s += &format!("{:10.2} | {n:8} | {:9.2} | {name}\n", t.as_secs_f64() * 1e3, t.as_secs_f64() * 1e6 / *n as f64);
    }
    s
}
