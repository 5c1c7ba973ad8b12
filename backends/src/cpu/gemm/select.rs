//! Which GEMM kernels run as generated code, in which configuration, and how that choice is made and remembered:
//! the glue between the CPU JIT (`cpu::jit`, which compiles a plan), the tuner (`kiln_autotune`: search, store) and
//! the generated GEMM (`CompiledGemm`). Also the entry points that force a configuration (`PreparedGemm`, for the
//! tests that check every candidate and for benchmarks) and the `kiln tune` hooks.

use super::super::buffers::{check_inputs, finish_output, read_ptr, write_ptr};
use super::super::compiler::{COMPILER, Compiler};
use super::super::pool;
use crate::runtime::cache_write_failed;
use kiln_jit::HostBuffer;
use kiln_jit::kernel::KernelIr;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// GEMMs smaller than this (M*N*K) stay Cranelift kernels: the blocked driver's fixed costs would dominate.
pub(crate) const GEMM_MIN_VOLUME: usize = 4096;

/// Whether GEMMs run as generated AVX2 code: the host has AVX2+FMA and `KILN_GEMM=clif` (Cranelift kernels only, to
/// bisect) is not set.
pub(crate) fn generated_gemm_enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| super::asm::host_supported() && std::env::var("KILN_GEMM").map_or(true, |v| v != "clif"));
    *ON
}

/// `KILN_AUTOTUNE` (read once), unless [`set_autotune_mode`] overrides it.
fn tune_mode() -> kiln_autotune::Mode {
    MODE_OVERRIDE.lock().unwrap_or_else(crate::gemm_check::env_mode)
}

/// How much searching one plan compile may do with `KILN_AUTOTUNE=fast` (`KILN_TUNE_BUDGET_MS`, default
/// [`DEFAULT_TUNE_BUDGET`]): a GEMM key whose search would, by its estimate, take the compile's searches past it
/// takes the cost model's choice instead, recorded as untuned (mode `off`), so the next compile that meets the key,
/// in this process or a later one, searches it (a `fast` lookup does not accept an `off` record). A first step
/// thus never waits on more than about the budget of searching, and a cache warms up over a few starts; `kiln
/// tune` and `full` have no budget. A key whose search alone is estimated past the budget (a convolution's GEMM of
/// a few images) is never searched in fast mode, and its record says so: its fast race would get one cold run per
/// candidate, which picked the slower of two tiles when it was tried (`bench_conv`'s 3x3 layer).
///
/// Why: a batch-1024 MLP step meets eight GEMM keys; searching all of them took ~40 ms of its first step (~55-85 ms
/// in all on this 2-core VM, against ~13 ms for compiling with `off`).
pub(crate) struct TuneBudget {
    limit: std::time::Duration,
    spent: std::time::Duration,
}

/// The default of `KILN_TUNE_BUDGET_MS`.
pub const DEFAULT_TUNE_BUDGET: std::time::Duration = std::time::Duration::from_millis(30);

impl TuneBudget {
    /// The budget of one plan compile (`KILN_TUNE_BUDGET_MS`, read once).
    pub(crate) fn for_compile() -> TuneBudget {
        static LIMIT: LazyLock<std::time::Duration> = LazyLock::new(|| {
            std::env::var("KILN_TUNE_BUDGET_MS")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(DEFAULT_TUNE_BUDGET, std::time::Duration::from_millis)
        });
        TuneBudget { limit: *LIMIT, spent: std::time::Duration::ZERO }
    }
}

/// What a fast-mode search of `timed` should cost: its verification and timed runs (`Mode::Fast`'s budget) at a
/// conservative 100 GFLOP/s plus ~20 µs of set-up each, and the reference values (`gemm_check::sample_count`
/// sampled outputs, ~60 ns per reduction step of the interpreter, split over the threads).
fn search_estimate(timed: &super::tune::TuneProblem, threads: usize) -> std::time::Duration {
    let b = kiln_autotune::Mode::Fast.budget();
    let runs = (b.top_k * (1 + b.warmup + b.max_reps)) as f64;
    let per_run = timed.view.flops() / 100e9 + 20e-6;
    let samples = crate::gemm_check::sample_count(timed.kernel.out_extents.len()) as f64;
    let reference = samples * timed.view.k as f64 * 60e-9 / threads.max(1) as f64;
    std::time::Duration::from_secs_f64(runs * per_run + reference)
}

/// The key of the GEMM compiled last; its record is in the store (memory at least).
static LAST_KEY: Mutex<Option<kiln_autotune::TuneKey>> = Mutex::new(None);

/// Takes the tuning record of the GEMM compiled last (searched or reused) since the previous call, for
/// `kiln tune`'s report.
pub fn take_last_tune_record() -> Option<kiln_autotune::TuneRecord> {
    let key = LAST_KEY.lock().take()?;
    kiln_autotune::Store::global().get_record(&key)
}

static MODE_OVERRIDE: Mutex<Option<kiln_autotune::Mode>> = Mutex::new(None);

/// Overrides `KILN_AUTOTUNE` for GEMMs compiled from now on (`None` restores it): `kiln tune` searches with `full`
/// whatever the environment says.
pub fn set_autotune_mode(mode: Option<kiln_autotune::Mode>) {
    *MODE_OVERRIDE.lock() = mode;
}

/// The generated-GEMM form of `k` if it is a GEMM worth it on this host, in the configuration the tuning cache
/// holds for its key, or the one a search picks now (`KILN_AUTOTUNE`), with its epilogue pass compiled when the
/// epilogue is not in registers. `cx`: what the plan does around the GEMM (`config::step_candidates`).
pub(crate) fn gemm_for(
    c: &mut Compiler,
    k: &KernelIr,
    dump: Option<&crate::dump::Dump>,
    budget: &mut TuneBudget,
    cx: super::config::StepContext,
) -> Result<Option<super::CompiledGemm>, String> {
    // A kernel that gathers (in its operands or epilogue) is the Cranelift renderer's, which checks its indices.
    if !generated_gemm_enabled() || k.can_fault() {
        return Ok(None);
    }
    // A `KILN_CPU_ISA` this CPU cannot honour is the user's error to see, not a quiet fallback.
    crate::cpu::isa::allowed()?;
    let Some(view) = kiln_jit::kernel::gemm::GemmView::of_patched(k) else { return Ok(None) };
    // f16 operands reach a GEMM only where a backend asks (`ScheduleOptions::f16_gemm`: the GPU devices); the CPU
    // has no f16 family, so such a kernel (never scheduled here) would be the generic kernel's.
    if view.operands == kiln_jit::DType::F16 || view.out == kiln_jit::DType::F16 {
        return Ok(None);
    }
    let cx = super::config::StepContext { patched_b: view.b.patch.is_some(), ..cx };
    if view.m * view.n * view.k < GEMM_MIN_VOLUME {
        return Ok(None);
    }
    let threads = pool::global().threads();
    let store = kiln_autotune::Store::global();
    // A bf16 GEMM has only its own families; with none here, or none that can express its epilogue, the generic
    // kernel computes it (the schedule keeps bf16 operands out of GEMMs where no family runs: this is the rare case).
    let bf16 = view.operands == kiln_jit::DType::BF16;
    if bf16 && super::config::candidates(&view, false).is_empty() {
        return Ok(None);
    }
    let (imp, key) = choose_gemm(c, k, &view, threads, store, budget, cx)?;
    let g = match build_gemm(c, k, view, imp, threads, Some(store), dump) {
        Err(e) if bf16 => {
            crate::runtime::tracing_note(&format!("bf16 GEMM {} runs as a generic kernel: {e}", k.name));
            return Ok(None);
        }
        g => g?,
    };
    if let Some(d) = dump {
        let table = store.get_record(&key).map_or_else(|| "not tuned (analytic choice)\n".to_string(), |r| r.table());
        d.gemm_files(k, &imp.name(), g.code_bytes(), &table);
    }
    Ok(Some(g))
}

/// The configuration for GEMM `k`: a cached record's winner (never re-raced), else a search on the canonical
/// problem of its key (or, with `KILN_AUTOTUNE=off`, the best analytic score), recorded in `store`. Also returns
/// the key that record is stored under.
fn choose_gemm(
    c: &mut Compiler,
    k: &KernelIr,
    view: &kiln_jit::kernel::gemm::GemmView,
    threads: usize,
    store: &kiln_autotune::Store,
    budget: &mut TuneBudget,
    cx: super::config::StepContext,
) -> Result<(super::config::GemmImpl, kiln_autotune::TuneKey), String> {
    let mode = tune_mode();
    use super::{self as gemm, config, config::GemmImpl, tune};
    use std::sync::atomic::Ordering;
    let problem = tune::problem(k, view, threads, &store.fingerprint().id(), cx);
    let legal_here = |imp: &GemmImpl| imp.legal_for(view);
    // Only the winner: a plan compile of a warm process does this once per GEMM, and a record's hundred trials
    // are only wanted by a dump or `kiln tune` (fetched by key then). A record of a lighter mode than this one is
    // not reused: `kiln tune` (full) replaces what a `fast` run recorded.
    if let Some(winner) = store.get_winner(&problem.key, mode)
        && let Some(imp) = GemmImpl::parse(&winner).filter(legal_here)
    {
        gemm::TUNE_HITS.fetch_add(1, Ordering::Relaxed);
        *LAST_KEY.lock() = Some(problem.key.clone());
        return Ok((imp, problem.key));
    }
    // Candidates and scores are the canonical problem's (the key's); the runs may be on a smaller proxy of it
    // (`KILN_AUTOTUNE=fast`, see `tune::fast_proxy`).
    let proxy = if mode == kiln_autotune::Mode::Fast {
        tune::fast_proxy(k, view, &problem, threads, &store.fingerprint().id())
    } else {
        None
    };
    let timed = proxy.as_ref().unwrap_or(&problem);
    // Made at the first candidate run, so `KILN_AUTOTUNE=off` (no run) pays for none of them: synthetic inputs of
    // the canonical problem (~5 ms at 1024 x 1024), the evaluator's reference values, and the epilogue pass kernel
    // (one Cranelift compile, needed only by candidates whose epilogue is not in registers). With `off`, a 512-batch
    // MLP step's plan spent ~9 of its ~20 ms compile on these.
    let inputs: std::cell::OnceCell<Vec<HostBuffer>> = std::cell::OnceCell::new();
    let reference = std::cell::OnceCell::new();
    let pass: std::cell::OnceCell<gemm::Pass> = std::cell::OnceCell::new();
    let compiler = std::cell::RefCell::new(c);
    let cands = config::step_candidates(&problem.view, problem.view.batch.is_empty(), cx);
    let full_width = config::full_width(crate::cpu::isa::peak_ratio(crate::cpu::isa::Isa::Avx512));
    let scored: Vec<kiln_autotune::Candidate<'_, GemmImpl>> = cands
        .iter()
        .map(|imp| kiln_autotune::Candidate {
            config: imp,
            name: imp.name(),
            score: super::cost::score(&problem.view, imp, threads),
            group: imp.group(full_width),
            family: imp.family(),
            shape: imp.shape(),
        })
        .collect();
    // Each candidate is generated once and kept for its verification and timed runs.
    let built: std::cell::RefCell<HashMap<GemmImpl, std::rc::Rc<gemm::CompiledGemm>>> = Default::default();
    let run = |imp: &GemmImpl| -> Result<(HostBuffer, std::time::Duration), String> {
        let existing = built.borrow().get(imp).cloned();
        let g = match existing {
            Some(g) => g,
            None => {
                let mut g = gemm::CompiledGemm::build(&timed.kernel, timed.view.clone(), *imp, threads, None)?;
                if g.uses_pass {
                    // The same pass for every candidate: compiled once.
                    let f = match pass.get() {
                        Some(f) => f.clone(),
                        None => {
                            let f = compile_pass(&mut compiler.borrow_mut(), &timed.kernel, None)?;
                            pass.get_or_init(|| f).clone()
                        }
                    };
                    g.pass = Some(f);
                }
                let g = std::rc::Rc::new(g);
                built.borrow_mut().insert(*imp, g.clone());
                g
            }
        };
        let mut out = crate::host_pool::take(timed.kernel.output.dtype, timed.kernel.output.len);
        let mut ptrs: Vec<*mut u8> = inputs.get_or_init(|| timed.inputs()).iter().map(read_ptr).collect();
        ptrs.push(write_ptr(&mut out));
        let t0 = std::time::Instant::now();
        // SAFETY: the timed problem's inputs were made with exactly the lengths and dtypes its kernel declares,
        // and the output was allocated with its length.
        unsafe {
            g.run(&ptrs);
            finish_output(&mut out, timed.kernel.output.len);
        }
        Ok((out, t0.elapsed()))
    };
    let estimate = search_estimate(timed, threads);
    let over_budget = mode == kiln_autotune::Mode::Fast && budget.spent.saturating_add(estimate) > budget.limit;
    let run_mode = if over_budget { kiln_autotune::Mode::Off } else { mode };
    let searched_at = std::time::Instant::now();
    let mut record = kiln_autotune::search(
        &problem.key,
        // Nothing is measured when the budget is spent: the record names the canonical dims then.
        if over_budget { problem.dims.clone() } else { timed.dims.clone() },
        scored,
        run_mode,
        |imp| {
            let inputs = inputs.get_or_init(|| timed.inputs());
            let reference = reference.get_or_init(|| tune::reference(timed, inputs));
            run(imp).and_then(|(out, _)| {
                let checked = reference.check_output(&out);
                crate::host_pool::give(out);
                checked
            })
        },
        // Each run's output goes back to the pool for the next: a dropped one was unmapped, and every timed run
        // of a large GEMM paid its page faults (1024 x 512 x 128, 2 MiB of C: 1.3-1.5 ms a fast-mode run against
        // 0.44 ms warm, so the race compared faults, and picked AVX2 over AVX-512 tiles 40 % faster in the step).
        |imp| {
            run(imp).map(|(out, t)| {
                crate::host_pool::give(out);
                t
            })
        },
    )?;
    budget.spent += searched_at.elapsed();
    if over_budget {
        // A key whose search alone passes the budget is never searched in fast mode, by this compile or a later
        // one: say so, and what does search it.
        let later = if estimate > budget.limit {
            "its search alone passes the budget, so no fast-mode compile with this budget searches it: `kiln tune`, \
             KILN_AUTOTUNE=full or a larger KILN_TUNE_BUDGET_MS does"
        } else {
            "a later compile searches it"
        };
        let why = format!(
            "not run: this compile's fast-tuning budget ({} ms, KILN_TUNE_BUDGET_MS) would be passed (~{:.1} ms \
             spent, ~{:.1} ms estimated for this key); {later}",
            budget.limit.as_millis(),
            budget.spent.as_secs_f64() * 1e3,
            estimate.as_secs_f64() * 1e3
        );
        for t in &mut record.trials {
            t.note = Some(why.clone());
        }
    }
    let imp = GemmImpl::parse(&record.winner).ok_or_else(|| format!("unparsable winner {}", record.winner))?;
    if run_mode != kiln_autotune::Mode::Off {
        gemm::TUNINGS.fetch_add(1, Ordering::Relaxed);
    }
    *LAST_KEY.lock() = Some(problem.key.clone());
    if let Err(e) = store.put_record(&record) {
        cache_write_failed("a GEMM tuning record", &e);
    }
    // A winner tuned at the bucket's bound may not be legal at this exact shape (an i32 stride); the analytic
    // best for this shape is.
    let imp =
        if legal_here(&imp) { imp } else { super::tune::analytic_best(view, threads).ok_or("no legal GEMM config")? };
    Ok((imp, problem.key))
}

fn build_gemm(
    c: &mut Compiler,
    k: &KernelIr,
    view: kiln_jit::kernel::gemm::GemmView,
    imp: super::config::GemmImpl,
    threads: usize,
    cache: Option<&kiln_autotune::Store>,
    dump: Option<&crate::dump::Dump>,
) -> Result<super::CompiledGemm, String> {
    let mut g = super::CompiledGemm::build(k, view, imp, threads, cache)?;
    if g.uses_pass {
        g.pass = Some(compile_pass(c, k, dump)?);
    }
    Ok(g)
}

/// The epilogue pass of GEMM `k`: 8-lane generated code where it qualifies, else a Cranelift kernel.
fn compile_pass(c: &mut Compiler, k: &KernelIr, dump: Option<&crate::dump::Dump>) -> Result<super::Pass, String> {
    let pass = kiln_jit::kernel::gemm::epilogue_pass(k);
    if let Some(w) = crate::cpu::wide::for_plan(&pass, dump)? {
        return Ok(super::Pass::Wide(w));
    }
    let (f, text) = c.kernel(&pass, dump.is_some())?;
    if let (Some(d), Some((clif_text, disasm))) = (dump, text) {
        d.kernel_files(&pass, "clif", &clif_text, &disasm);
    }
    Ok(super::Pass::Clif(f))
}

/// A GEMM kernel built in one configuration, to run many times on host buffers (tests force every candidate
/// through this and compare with the kernel IR evaluator; benchmarks time configurations against each other).
pub struct PreparedGemm {
    kernel: KernelIr,
    gemm: super::CompiledGemm,
}

impl PreparedGemm {
    /// Builds `k` as a GEMM with configuration `imp`. Errors when `k` is not a GEMM, the configuration is not
    /// legal for it, or the host cannot run generated code.
    pub fn new(k: &KernelIr, imp: super::config::GemmImpl) -> Result<PreparedGemm, String> {
        if !super::asm::host_supported() {
            return Err("this host has no AVX2+FMA".into());
        }
        let view = kiln_jit::kernel::gemm::GemmView::of_patched(k).ok_or("not a GEMM")?;
        let compiler = COMPILER.as_ref().map_err(|e| e.clone())?;
        let gemm = build_gemm(&mut compiler.lock(), k, view, imp, pool::global().threads(), None, None)?;
        Ok(PreparedGemm { kernel: k.clone(), gemm })
    }

    /// Runs on `inputs` (checked against the kernel's declared buffers) and returns the output.
    pub fn run(&self, inputs: &[&HostBuffer]) -> Result<HostBuffer, String> {
        let k = &self.kernel;
        check_inputs(k, inputs)?;
        let mut out = crate::host_pool::take(k.output.dtype, k.output.len);
        let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| read_ptr(b)).collect();
        ptrs.push(write_ptr(&mut out));
        // SAFETY: inputs were checked against the kernel's buffers above; the output was allocated with its length.
        unsafe {
            self.gemm.run(&ptrs);
            finish_output(&mut out, k.output.len);
        }
        Ok(out)
    }
}

impl PreparedGemm {
    /// Like [`PreparedGemm::run`], but the output starts as all-ones bytes (NaN in every float dtype, so an element
    /// the kernel does not write fails a comparison) and is followed by a guard as long as itself (at least 4096
    /// elements) of the same bytes, checked after the run: a kernel that writes past its output (a ragged edge
    /// stored whole, a wrong stride) is an `Err` here, where the tests that force every candidate see it, instead of
    /// a corrupted heap somewhere later.
    pub fn run_guarded(&self, inputs: &[&HostBuffer]) -> Result<HostBuffer, String> {
        const PATTERN: u8 = 0xff;
        let k = &self.kernel;
        check_inputs(k, inputs)?;
        let (len, size) = (k.output.len, k.output.dtype.size_of());
        let total = len + len.max(4096);
        let mut out = crate::host_pool::take(k.output.dtype, total);
        let base = write_ptr(&mut out);
        // SAFETY: `take` allocated `total` elements; the whole of them is filled before it becomes the length.
        unsafe {
            std::ptr::write_bytes(base, PATTERN, total * size);
            finish_output(&mut out, total);
        }
        let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| read_ptr(b)).collect();
        ptrs.push(base);
        // SAFETY: inputs were checked against the kernel's buffers above; the output holds `len` elements and more.
        unsafe { self.gemm.run(&ptrs) };
        // SAFETY: the `total * size` bytes from `base` are the buffer's initialized elements.
        let bytes = unsafe { std::slice::from_raw_parts(base, total * size) };
        if let Some(i) = bytes[len * size..].iter().position(|&b| b != PATTERN) {
            return Err(format!(
                "wrote past its output: byte {} after the end of {len} {} elements changed",
                i, k.output.dtype
            ));
        }
        // SAFETY: shrinking to the `len` elements the kernel wrote.
        unsafe { finish_output(&mut out, len) };
        Ok(out)
    }
}

/// Builds and runs `k` once as a GEMM in configuration `imp` (see [`PreparedGemm`]).
pub fn run_gemm_with(k: &KernelIr, imp: super::config::GemmImpl, inputs: &[&HostBuffer]) -> Result<HostBuffer, String> {
    PreparedGemm::new(k, imp)?.run(inputs)
}
