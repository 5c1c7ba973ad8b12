//! The CPU JIT: schedules a graph into kernels, renders each to CLIF, compiles it with Cranelift for the host
//! (cranelift-native picks up AVX/FMA/SSE4 flags), and replays the resulting launch list.
//!
//! Compilation goes through one process-wide `JITModule` behind a mutex (compiling is the slow path), and a
//! kernel cache keyed by the kernel IR's full text plus the vectorization choice: the IR determines the CLIF, and
//! the module is this process's host, so the text is a complete key. Code is never freed: plans live as long as the
//! process's plan cache, which has no eviction either.
//!
//! Replay (`JitPlan::run`) does no hashing and takes no lock per kernel: launches are a flat list with pre-bound
//! slots; the only allocations are the output buffers handed to the caller and one pointer table per run. A
//! launch runs split over the thread pool when its work passes `pool::min_parallel_work()`, else inline.
//!
//! Deliberately not done yet: pooling output buffers across runs, and a per-kernel profile line.

use super::{libcalls, pool};
use crate::{BackendError, Buffer, Executable};
use cranelift_codegen::Context;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};
use kiln_jit::buffer::HostBuffer;
use kiln_jit::dtype::DType;
use kiln_jit::kernel::{KernelIr, KernelPlan, Slot};
use kiln_jit::render::clif::{self, Libcall};
use kiln_jit::{Graph, RngKey};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

const NAME: &str = "cpu";

/// `fn(args, rng, start, end)`: see `kiln_jit::render::clif`.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, *const u64, i64, i64);

struct Compiler {
    module: JITModule,
    isa: OwnedTargetIsa,
    /// Whether the host has FMA (cranelift-native enabled `has_fma`), so `fma` lowers to an instruction.
    fma: bool,
    kernels: HashMap<(String, bool), KernelFn>,
    next: u32,
}

// SAFETY: the JITModule owns raw code pointers and is only touched under the COMPILER mutex; the finalized code
// it hands out is immutable and callable from any thread.
unsafe impl Send for Compiler {}

static COMPILER: LazyLock<Result<Mutex<Compiler>, String>> = LazyLock::new(|| Compiler::new().map(Mutex::new));

impl Compiler {
    fn new() -> Result<Compiler, String> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
        flags.set("is_pic", "false").map_err(|e| e.to_string())?;
        let isa = cranelift_native::builder()
            .map_err(|e| format!("host ISA not supported by Cranelift: {e}"))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())?;
        let mut jb = JITBuilder::with_isa(isa.clone(), cranelift_module::default_libcall_names());
        for l in Libcall::ALL {
            jb.symbol(l.name(), libcalls::address(*l));
        }
        let mut module = JITModule::new(jb);
        let call_conv = isa.default_call_conv();
        for (i, l) in Libcall::ALL.iter().enumerate() {
            let id = module
                .declare_function(l.name(), Linkage::Import, &l.signature(call_conv))
                .map_err(|e| e.to_string())?;
            // The renderer names libcall i as user function (0, i); that is only right if ids match positions.
            if id.as_u32() as usize != i {
                return Err(format!("libcall {} declared as function {}", l.name(), id.as_u32()));
            }
        }
        let fma = isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        Ok(Compiler { module, isa, fma, kernels: HashMap::new(), next: 0 })
    }

    /// Compiles `k` (or finds it), returning the entry point and, for dumps, the CLIF and disassembly.
    fn kernel(&mut self, k: &KernelIr, dump: bool) -> Result<(KernelFn, Option<(String, String)>), String> {
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

    fn compile(
        &mut self,
        k: &KernelIr,
        vectorize: bool,
        dump: bool,
    ) -> Result<(KernelFn, Option<(String, String)>), String> {
        let index = self.next;
        self.next += 1;
        let opts = clif::RenderOptions { vectorize, fma: self.fma, tile: clif::TileConfig::default() };
        let func = clif::render_with(k, index, self.isa.frontend_config(), opts);
        let clif_text = dump.then(|| func.display().to_string());
        let id = self.module.declare_anonymous_function(&func.signature).map_err(|e| e.to_string())?;
        let mut ctx = Context::for_function(func);
        ctx.set_disasm(dump);
        self.module.define_function(id, &mut ctx).map_err(|e| format!("{}: {e:?}", k.name))?;
        let disasm = ctx.compiled_code().and_then(|c| c.vcode.clone()).unwrap_or_default();
        self.module.finalize_definitions().map_err(|e| e.to_string())?;
        let ptr = self.module.get_finalized_function(id);
        // SAFETY: the function was compiled from `kernel_signature`, which is exactly `KernelFn`'s ABI, and its
        // code stays mapped for the life of the module (the process).
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
        Ok((f, clif_text.map(|c| (c, disasm))))
    }
}

/// GEMMs smaller than this (M*N*K) stay Cranelift kernels: the blocked driver's fixed costs would dominate.
const GEMM_MIN_VOLUME: usize = 4096;

/// Whether GEMMs run as generated AVX2 code: the host has AVX2+FMA and `KILN_GEMM=clif` (Cranelift kernels only, to
/// bisect) is not set.
fn generated_gemm_enabled() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| {
        super::gemm::asm::host_supported() && std::env::var("KILN_GEMM").map_or(true, |v| v != "clif")
    });
    *ON
}

/// `KILN_AUTOTUNE` (read once), unless [`set_autotune_mode`] overrides it.
fn tune_mode() -> kiln_autotune::Mode {
    static MODE: LazyLock<kiln_autotune::Mode> = LazyLock::new(kiln_autotune::Mode::from_env);
    MODE_OVERRIDE.lock().unwrap_or(*MODE)
}

static LAST_RECORD: Mutex<Option<kiln_autotune::TuneRecord>> = Mutex::new(None);

/// Takes the tuning record of the GEMM compiled last (searched or reused) since the previous call, for
/// `kiln tune`'s report.
pub fn take_last_tune_record() -> Option<kiln_autotune::TuneRecord> {
    LAST_RECORD.lock().take()
}

static MODE_OVERRIDE: Mutex<Option<kiln_autotune::Mode>> = Mutex::new(None);

/// Overrides `KILN_AUTOTUNE` for GEMMs compiled from now on (`None` restores it): `kiln tune` searches with `full`
/// whatever the environment says.
pub fn set_autotune_mode(mode: Option<kiln_autotune::Mode>) {
    *MODE_OVERRIDE.lock() = mode;
}

/// The generated-GEMM form of `k` if it is a GEMM worth it on this host, in the configuration the tuning cache
/// holds for its key, or the one a search picks now (`KILN_AUTOTUNE`), with its epilogue pass compiled when the
/// epilogue is not in registers.
fn gemm_for(
    c: &mut Compiler,
    k: &KernelIr,
    dump: Option<&crate::dump::Dump>,
) -> Result<Option<super::gemm::CompiledGemm>, String> {
    if !generated_gemm_enabled() {
        return Ok(None);
    }
    let Some(view) = kiln_jit::kernel::gemm::GemmView::of(k) else { return Ok(None) };
    if view.m * view.n * view.k < GEMM_MIN_VOLUME {
        return Ok(None);
    }
    let threads = pool::global().threads();
    let store = kiln_autotune::Store::global();
    let (imp, record) = choose_gemm(c, k, &view, threads, store, tune_mode())?;
    let g = build_gemm(c, k, view, imp, threads, Some(store), dump)?;
    if let Some(d) = dump {
        let table = record.map_or_else(|| "not tuned (analytic choice)\n".to_string(), |r| r.table());
        d.gemm_files(k, &imp.name(), g.code_bytes(), &table);
    }
    Ok(Some(g))
}

/// The configuration for GEMM `k`: a cached record's winner (never re-raced), else a search on the canonical
/// problem of its key (or, with `KILN_AUTOTUNE=off`, the best analytic score), recorded in `store`.
fn choose_gemm(
    c: &mut Compiler,
    k: &KernelIr,
    view: &kiln_jit::kernel::gemm::GemmView,
    threads: usize,
    store: &kiln_autotune::Store,
    mode: kiln_autotune::Mode,
) -> Result<(super::gemm::config::GemmImpl, Option<kiln_autotune::TuneRecord>), String> {
    use super::gemm::{self, config, config::GemmImpl, tune};
    use std::sync::atomic::Ordering;
    let problem = tune::problem(k, view, threads, &store.fingerprint().id());
    let legal_here = |imp: &GemmImpl| match imp {
        GemmImpl::Asm(cfg) => config::legal(view, cfg),
        GemmImpl::Library => view.batch.is_empty(),
    };
    if let Some(rec) = store.get_record(&problem.key)
        && let Some(imp) = GemmImpl::parse(&rec.winner).filter(legal_here)
    {
        gemm::TUNE_HITS.fetch_add(1, Ordering::Relaxed);
        *LAST_RECORD.lock() = Some(rec.clone());
        return Ok((imp, Some(rec)));
    }
    let cands = config::candidates(&problem.view, problem.view.batch.is_empty());
    let scored: Vec<kiln_autotune::Candidate<'_, GemmImpl>> = cands
        .iter()
        .map(|imp| kiln_autotune::Candidate {
            config: imp,
            name: imp.name(),
            score: config::score(&problem.view, imp, threads),
        })
        .collect();
    // The epilogue pass (when the epilogue is not in registers) is the same for every candidate: compile it once.
    let pass = {
        let pk = gemm::epilogue_pass_kernel(&problem.kernel);
        c.kernel(&pk, false)?.0
    };
    let run = |imp: &GemmImpl| -> Result<(HostBuffer, std::time::Duration), String> {
        let mut g = gemm::CompiledGemm::build(&problem.kernel, problem.view.clone(), *imp, threads, None)?;
        g.pass = Some(pass);
        let mut out = crate::host_pool::take(DType::F32, problem.kernel.output.len);
        let mut ptrs: Vec<*mut u8> = problem.inputs.iter().map(read_ptr).collect();
        ptrs.push(write_ptr(&mut out));
        let t0 = std::time::Instant::now();
        // SAFETY: the canonical problem's inputs were made with exactly the lengths and dtypes its kernel declares,
        // and the output was allocated with its length.
        unsafe {
            g.run(&ptrs);
            finish_output(&mut out, problem.kernel.output.len);
        }
        Ok((out, t0.elapsed()))
    };
    let record = kiln_autotune::search(
        &problem.key,
        problem.dims.clone(),
        scored,
        mode,
        |imp| run(imp).and_then(|(out, _)| tune::verify(&problem, &out)),
        |imp| run(imp).map(|(_, t)| t),
    )?;
    let imp = GemmImpl::parse(&record.winner).ok_or_else(|| format!("unparsable winner {}", record.winner))?;
    if mode != kiln_autotune::Mode::Off {
        gemm::TUNINGS.fetch_add(1, Ordering::Relaxed);
    }
    *LAST_RECORD.lock() = Some(record.clone());
    if let Err(e) = store.put_record(&record) {
        eprintln!("kiln: could not save the tuning record ({e}); the choice holds for this process");
    }
    // A winner tuned at the bucket's bound may not be legal at this exact shape (an i32 stride); the analytic
    // best for this shape is.
    let imp = if legal_here(&imp) {
        imp
    } else {
        super::gemm::tune::analytic_best(view, threads).ok_or("no legal GEMM config")?
    };
    Ok((imp, Some(record)))
}

fn build_gemm(
    c: &mut Compiler,
    k: &KernelIr,
    view: kiln_jit::kernel::gemm::GemmView,
    imp: super::gemm::config::GemmImpl,
    threads: usize,
    cache: Option<&kiln_autotune::Store>,
    dump: Option<&crate::dump::Dump>,
) -> Result<super::gemm::CompiledGemm, String> {
    let mut g = super::gemm::CompiledGemm::build(k, view, imp, threads, cache)?;
    if g.uses_pass {
        let pass = super::gemm::epilogue_pass_kernel(k);
        let (f, text) = c.kernel(&pass, dump.is_some())?;
        if let (Some(d), Some((clif_text, disasm))) = (dump, text) {
            d.kernel_files(&pass, "clif", &clif_text, &disasm);
        }
        g.pass = Some(f);
    }
    Ok(g)
}

/// Runs kernel `k` as a GEMM with the given configuration on host buffers (tests force every candidate through
/// this and compare with the kernel IR evaluator). Errors when `k` is not a GEMM or the host cannot run it.
pub fn run_gemm_with(
    k: &KernelIr,
    imp: super::gemm::config::GemmImpl,
    inputs: &[&HostBuffer],
) -> Result<HostBuffer, String> {
    if !super::gemm::asm::host_supported() {
        return Err("this host has no AVX2+FMA".into());
    }
    let view = kiln_jit::kernel::gemm::GemmView::of(k).ok_or("not a GEMM")?;
    let compiler = COMPILER.as_ref().map_err(|e| e.clone())?;
    let g = build_gemm(&mut compiler.lock(), k, view, imp, pool::global().threads(), None, None)?;
    let mut out = crate::host_pool::take(k.output.dtype, k.output.len);
    let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| read_ptr(b)).collect();
    ptrs.push(write_ptr(&mut out));
    // SAFETY: the caller's buffers are checked against the kernel's declared inputs below before running.
    for (b, p) in inputs.iter().zip(&k.inputs) {
        if b.dtype() != p.dtype || b.len() < p.len {
            return Err(format!(
                "input {} is {}[{}], the kernel wants {}[{}]",
                p.len,
                b.dtype(),
                b.len(),
                p.dtype,
                p.len
            ));
        }
    }
    // SAFETY: inputs were checked above; the output was allocated with the kernel's length.
    unsafe {
        g.run(&ptrs);
        finish_output(&mut out, k.output.len);
    }
    Ok(out)
}

/// Diagnostics that are not errors go to stderr only when `KILN_LOG` is set (the tracing layer comes later).
fn tracing_note(msg: &str) {
    if std::env::var_os("KILN_LOG").is_some() {
        eprintln!("kiln: {msg}");
    }
}

/// How a launch runs: a Cranelift kernel split by rows, or the generated-GEMM driver (which splits itself).
enum Exec {
    Clif(KernelFn),
    Gemm(Box<super::gemm::CompiledGemm>),
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
    temps: Vec<usize>,
    outputs: Vec<(DType, usize)>,
    passthrough: Vec<(usize, usize)>,
    /// Scratch reused by the next run if no other thread holds it.
    arena: Mutex<Arena>,
}

/// Per-run scratch: intermediate buffers, the pointer table of the current launch, the rng words.
#[derive(Default)]
struct Arena {
    temps: Vec<Vec<u64>>,
    ptrs: Vec<*mut u8>,
    rng_words: Vec<u64>,
}

// SAFETY: the raw pointers in `ptrs` are scratch, rewritten before every launch and never read across runs.
unsafe impl Send for Arena {}

/// Compiles every kernel of `graph`'s schedule.
pub(crate) fn compile(graph: &Graph) -> Result<JitPlan, BackendError> {
    let err = |reason: String| BackendError::Compile { device: NAME, reason };
    // The generated GEMM packs operands of any layout, so a transposed weight is not copied first.
    let opts = kiln_jit::kernel::ScheduleOptions { transpose_copy: !generated_gemm_enabled() };
    let plan: KernelPlan = kiln_jit::kernel::schedule_with(graph, opts);
    let dump = crate::dump::Dump::start(graph, &plan);
    let compiler = COMPILER.as_ref().map_err(|e| err(e.clone()))?;
    let mut launches = Vec::with_capacity(plan.launches.len());
    {
        let mut c = compiler.lock();
        for l in &plan.launches {
            let exec = match gemm_for(&mut c, &l.kernel, dump.as_ref()).map_err(err)? {
                Some(g) => Exec::Gemm(Box::new(g)),
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
    Ok(JitPlan {
        launches,
        temps: plan.temps.clone(),
        outputs: plan.outputs.iter().map(|b| (b.dtype, b.len)).collect(),
        passthrough: plan.passthrough.clone(),
        arena: Mutex::new(Arena::default()),
    })
}

/// Marks `len` elements of an output written.
///
/// # Safety
/// The plan's launches must have written all `len` elements, each with a valid value of the element type.
unsafe fn finish_output(b: &mut HostBuffer, len: usize) {
    // SAFETY: the caller guarantees all `len` elements were written; capacity is `len` (output_with_capacity).
    unsafe {
        match b {
            HostBuffer::Bool(v) => v.set_len(len),
            HostBuffer::U8(v) => v.set_len(len),
            HostBuffer::I32(v) => v.set_len(len),
            HostBuffer::I64(v) => v.set_len(len),
            HostBuffer::F32(v) => v.set_len(len),
            HostBuffer::F64(v) => v.set_len(len),
        }
    }
}

/// A pointer kernels only read through.
fn read_ptr(b: &HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_ptr() as *mut u8,
        HostBuffer::I32(v) => v.as_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_ptr() as *mut u8,
        HostBuffer::F32(v) => v.as_ptr() as *mut u8,
        HostBuffer::F64(v) => v.as_ptr() as *mut u8,
    }
}

/// A pointer kernels write through.
fn write_ptr(b: &mut HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_mut_ptr(),
        HostBuffer::I32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_mut_ptr() as *mut u8,
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
        let hosts = super::host_inputs(inputs)?;
        let host = |i: usize| -> &HostBuffer { hosts[i] };
        let mut outputs: Vec<HostBuffer> = self.outputs.iter().map(|&(d, n)| crate::host_pool::take(d, n)).collect();
        for &(o, i) in &self.passthrough {
            outputs[o] = host(i).clone();
        }
        let out_ptrs: Vec<*mut u8> = outputs.iter_mut().map(write_ptr).collect();
        let mut guard = self.arena.try_lock();
        let mut own = Arena::default();
        let arena: &mut Arena = match guard.as_deref_mut() {
            Some(a) => a,
            None => &mut own,
        };
        if arena.temps.len() != self.temps.len() {
            arena.temps = self.temps.iter().map(|&bytes| vec![0u64; bytes.div_ceil(8)]).collect();
        }
        let Arena { temps, ptrs, rng_words } = arena;
        rng_words.clear();
        rng_words.extend(rng.iter().flat_map(|k| [k.seed, k.offset]));
        for l in &self.launches {
            ptrs.clear();
            for s in l.inputs.iter().chain([&l.output]) {
                ptrs.push(match *s {
                    Slot::Input(i) => read_ptr(host(i)),
                    Slot::Temp(t) => temps[t].as_mut_ptr() as *mut u8,
                    Slot::Output(o) => out_ptrs[o],
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
                // (the same contract as a Cranelift kernel), and the schedule never makes an output an input.
                Exec::Gemm(g) => unsafe { g.run(ptrs) },
            }
            if let Some(t0) = t0 {
                record(&l.name, t0.elapsed());
            }
        }
        for (o, (b, &(_, len))) in outputs.iter_mut().zip(&self.outputs).enumerate() {
            if !self.passthrough.iter().any(|&(p, _)| p == o) {
                // SAFETY: the schedule makes exactly one launch write each non-passthrough output, and a kernel
                // stores every element of its row-major output range (all rows were launched above); stored
                // values are valid for the element type (bools as 0 or 1).
                unsafe { finish_output(b, len) };
            }
        }
        Ok(outputs.into_iter().map(Buffer::Host).collect())
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
