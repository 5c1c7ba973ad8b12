//! A compiled CPU plan: the graph's schedule with one executable per launch (a generated GEMM, an 8-lane
//! elementwise kernel, or a Cranelift kernel from `compiler`), and its replay.
//!
//! Replay (the shared executor, `plan_run`, with this file's `DevicePlan` half) does no hashing and takes no lock per
//! kernel: launches are a flat list with pre-bound slots, and outputs and temps come from the host buffer pool
//! (`host_pool`). A launch runs split over the thread
//! pool when its work passes `pool::min_parallel_work()`, else inline. With `KILN_PROFILE=1` every launch is timed
//! (`profile`).

use super::buffers::{finish_output, read_ptr, write_ptr};
use super::compiler::{COMPILER, KernelFn};
use super::pool;
use crate::plan_run::{DevicePlan, Place, PlanShape, Run};
use crate::profile;
use crate::{BackendError, Buffer};
use kiln_jit::buffer::HostBuffer;
use kiln_jit::dtype::DType;
use kiln_jit::kernel::{FAULT_WORDS, Fault};
use kiln_jit::kernel::{KernelIr, KernelPlan, Slot};
use kiln_jit::{Graph, RngKey};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicI64, Ordering};

const NAME: &str = "cpu";

/// How a launch runs: a Cranelift kernel split by rows, or a generated GEMM or 8-lane elementwise kernel (whose
/// drivers split themselves).
enum Exec {
    Clif(KernelFn),
    Gemm(Box<super::gemm::CompiledGemm>),
    Wide(std::sync::Arc<super::wide::WideKernel>),
    Rows(Box<super::wide::rows::RowKernel>),
    /// A linear algebra routine (`routines.rs`).
    Routine(kiln_jit::kernel::routine::Routine),
}

struct CompiledLaunch {
    name: String,
    exec: Exec,
    /// The kernel gathers: its pointer table ends with the run's fault record (`kernel::fault`).
    can_fault: bool,
    /// Extent of output loop 0 (1 for a zero-dim output): the range the kernel splits over threads.
    rows: usize,
    /// Element-operations of the whole launch, for the pool's inline-or-split decision.
    work: usize,
    /// The launch computes a constant into a slot of its own (`KernelPlan::constant`: a causal mask): an arena
    /// that has completed a run holds it already, and skips the launch.
    constant: bool,
}

pub(crate) struct JitPlan {
    /// Launch slots, outputs, passthroughs, and the schedule's donation candidates whose launch loads each element
    /// before storing it (see `compile`).
    shape: PlanShape,
    launches: Vec<CompiledLaunch>,
    /// Where each temp lies in the run's one region of temps.
    temps: TempLayout,
    /// Scratch reused by the next run if no other thread holds it.
    arena: Mutex<Arena>,
    /// The first run's temps, being faulted in (taken by the first run that builds an arena).
    prefault: Mutex<Option<Prefault>>,
}

/// Per-run scratch: intermediate buffers, the pointer table of the current launch, the rng words, the outputs'
/// data pointers.
#[derive(Default)]
struct Arena {
    /// The plan's temps, all in one buffer (`TempLayout`), from the host pool and given back to it when the arena
    /// is dropped. A temp is written by its producing launch before any launch reads it, so its initial contents do
    /// not matter.
    region: Option<HostBuffer>,
    /// Each temp's first byte in `region`.
    temps: Vec<*mut u8>,
    /// Runs begun on this arena.
    runs: u32,
    /// A run on this arena has completed: its constant slots hold their values (`CompiledLaunch::constant`).
    constants_ready: bool,
    ptrs: Vec<*mut u8>,
    rng_words: Vec<u64>,
    out_ptrs: Vec<*mut u8>,
    /// The run's fault record (`kernel::fault`), zeroed when a run begins, read when it ends.
    fault: [AtomicI64; FAULT_WORDS],
}

impl Drop for Arena {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            crate::host_pool::give(r);
        }
    }
}

// SAFETY: the raw pointers in `ptrs` and `out_ptrs` are scratch, rewritten in every run before they are read and
// never read across runs.
unsafe impl Send for Arena {}

/// Compiles every kernel of `graph`'s schedule.
pub(crate) fn compile(graph: &Graph) -> Result<JitPlan, BackendError> {
    use super::gemm::config::Bf16Unit;
    let err = |reason: String| BackendError::Compile { device: NAME, reason };
    // The generated GEMM packs operands of any layout, so a transposed weight is not copied first.
    let opts = kiln_jit::kernel::ScheduleOptions {
        transpose_copy: !super::gemm::select::generated_gemm_enabled(),
        row_kernel_ok: Some(super::wide::rows::generates),
        // bf16 matmuls read their operands in bf16 where a bf16 GEMM family runs here (`gemm::bf16`).
        bf16_gemm: super::gemm::select::generated_gemm_enabled()
            && [Bf16Unit::Amx, Bf16Unit::Avx512Bf16].into_iter().any(super::gemm::bf16::unit_ready),
        // The generated GEMM packs a patched B through offset tables (a convolution's implicit im2col).
        patched_b: super::gemm::select::generated_gemm_enabled().then_some(super::gemm::select::GEMM_MIN_VOLUME),
        // ... with its zero padding folded in where the AVX-512 kernels may run (`gemm::patch`: their packing reads
        // it in 16-lane groups; AVX2's pieces would read it slower than storing the padded input).
        patched_pad: super::gemm::select::generated_gemm_enabled() && super::isa::allows(super::isa::Isa::Avx512),
        ..Default::default()
    };
    let plan: KernelPlan = kiln_jit::kernel::schedule_with(graph, opts);
    crate::gpu_check::note(&plan).map_err(err)?;
    crate::gpu_cache::precompile(graph).map_err(err)?;
    let dump = crate::dump::Dump::start(graph, &plan);
    let compiler = COMPILER.as_ref().map_err(|e| err(e.clone()))?;
    let mut budget = super::gemm::select::TuneBudget::for_compile();
    // Inputs the plan writes over (a training step's weights) and the launches that write them: a GEMM reading one
    // as B, or writing one, is chosen for that (`config::step_candidates`).
    let candidates = plan.donation_candidates();
    let temps = TempLayout::of(&plan.temps);
    // Two passes: the GEMMs first (their tuning times kernels on every core), then the other kernels on this thread
    // while the arena's pages are faulted in on another (`Prefault`). A dump keeps one pass, in launch order.
    let two_passes = dump.is_none();
    let mut execs: Vec<Option<Exec>> = Vec::with_capacity(plan.launches.len());
    {
        let mut c = compiler.lock();
        for (index, l) in plan.launches.iter().enumerate() {
            let view = kiln_jit::kernel::gemm::GemmView::of(&l.kernel);
            let temp = |buf: usize| matches!(l.inputs.get(buf), Some(Slot::Temp(_)));
            let cx = super::gemm::config::StepContext {
                b_rewritten: view.as_ref().is_some_and(|v| {
                    matches!(l.inputs.get(v.b.buf), Some(&Slot::Input(i)) if candidates.iter().any(|d| d.input == i))
                }),
                operand_written_here: view.as_ref().is_some_and(|v| temp(v.a.buf) || temp(v.b.buf)),
                output_replaces_input: candidates.iter().any(|d| d.launch == index),
                output_read_later: matches!(l.output, Slot::Temp(_)),
                // Set by `gemm_for`, which recognizes the GEMM.
                patched_b: false,
            };
            let gemm = match l.kernel.routine {
                Some(_) => Ok(None),
                None => super::gemm::select::gemm_for(&mut c, &l.kernel, dump.as_ref(), &mut budget, cx),
            };
            execs.push(match gemm.map_err(err)? {
                None if let Some(r) = l.kernel.routine => Some(Exec::Routine(r)),
                Some(g) => Some(Exec::Gemm(Box::new(g))),
                None if two_passes => None,
                None => Some(generate(&mut c, &l.kernel, dump.as_ref()).map_err(err)?),
            });
        }
    }
    let prefault = if two_passes { Prefault::start(&temps) } else { None };
    let mut launches = Vec::with_capacity(plan.launches.len());
    {
        let mut c = compiler.lock();
        for (index, (l, exec)) in plan.launches.iter().zip(execs).enumerate() {
            let exec = match exec {
                Some(e) => e,
                None => generate(&mut c, &l.kernel, None).map_err(err)?,
            };
            let rows = l.kernel.out_extents.first().copied().unwrap_or(1);
            let can_fault = l.kernel.can_fault();
            let constant = plan.constant(index);
            launches.push(CompiledLaunch {
                name: l.kernel.name.clone(),
                exec,
                rows,
                work: l.kernel.work(),
                can_fault,
                constant,
            });
        }
    }
    // The buffers live while this plan runs (what it takes from the host pool, and its inputs), for the buffer
    // profile a warm process pre-allocates. An output that will take a donated input's buffer is counted anyway:
    // whether it does is decided per run (something may hold the old value), and a spare pooled buffer costs
    // memory only, where a missing one costs page faults in the first step.
    let inputs = graph.g.node_weights().filter(|n| matches!(n.op, kiln_jit::Op::Input { .. }));
    crate::host_pool::remember_plan_buffers(
        plan.outputs
            .iter()
            .map(|b| (b.dtype, b.len))
            .chain([(DType::I64, temps.words())])
            .chain(inputs.map(|n| (n.dtype, n.shape.numel()))),
    );
    // A Cranelift or wide kernel loads an element's operands before it stores the element; a GEMM does so only with one K
    // block and its epilogue in registers (otherwise C holds partial sums, or the GEMM's result before the
    // epilogue pass reads the operand).
    // A plan that can fault donates nothing: a fault is found after the run, when a donated input would already be
    // written over, and a failed run must leave its inputs as they were.
    let faults = launches.iter().any(|l| l.can_fault);
    let donations = candidates
        .into_iter()
        .filter(|_| !faults)
        .filter(|d| match &launches[d.launch].exec {
            Exec::Clif(_) | Exec::Wide(_) => true,
            // A row kernel reads its rows before writing them, but the schedule never offers it a donation.
            // Nor a routine (it reads whole matrices).
            Exec::Rows(_) | Exec::Routine(_) => false,
            Exec::Gemm(g) => g.reads_epilogue_before_store(),
        })
        .collect();
    Ok(JitPlan {
        shape: PlanShape::of(&plan, donations),
        launches,
        temps,
        arena: Mutex::new(Arena::default()),
        prefault: Mutex::new(prefault),
    })
}

/// The executable of a kernel that is neither a GEMM nor a routine: an 8-lane elementwise or row kernel where the
/// generator takes it, else Cranelift's.
fn generate(c: &mut super::compiler::Compiler, k: &KernelIr, dump: Option<&crate::dump::Dump>) -> Result<Exec, String> {
    if let Some(w) = super::wide::for_plan(k, dump)? {
        return Ok(Exec::Wide(w));
    }
    if let Some(r) = super::wide::rows::for_plan(k, dump)? {
        return Ok(Exec::Rows(Box::new(r)));
    }
    let (f, text) = c.kernel(k, dump.is_some())?;
    if let (Some(d), Some((clif_text, disasm))) = (dump, text) {
        d.kernel_files(k, "clif", &clif_text, &disasm);
    }
    Ok(Exec::Clif(f))
}

/// A plan's arena, faulted in on a thread of its own while the plan's kernels compile, for its first run.
///
/// Why: fresh memory page-faults on first write, and on a VM that costs ~3.5 µs per 4 KiB page (the GPT step's
/// 72 MB of temps: ~65 ms of CPU, ~35 ms of its first run's wall time on two cores). The compile of the kernels
/// after the GEMMs runs on one thread, so the faults are paid on the other core meanwhile. Plans whose temps are
/// small skip it (a thread costs more than their faults).
struct Prefault(std::thread::JoinHandle<HostBuffer>);

impl Prefault {
    /// Temps of at least this many bytes in all are faulted in ahead.
    const MIN_BYTES: usize = 4 << 20;

    /// Starts faulting in the region for `temps`; `None` for small temps, or where no thread starts (the run then
    /// faults them itself).
    fn start(temps: &TempLayout) -> Option<Prefault> {
        if temps.bytes < Self::MIN_BYTES {
            return None;
        }
        let words = temps.words();
        let job = move || {
            let mut b = crate::host_pool::take_region(words);
            crate::host_pool::touch(&mut b);
            b
        };
        std::thread::Builder::new().name("kiln-prefault".into()).spawn(job).ok().map(Prefault)
    }

    /// The faulted-in region (waiting for the thread if it is still at work); `None` if it failed.
    fn join(self) -> Option<HostBuffer> {
        self.0.join().ok()
    }
}

/// Where a plan's temps lie: one region, each temp on a 64-byte boundary after the one before. Why one region:
/// with a buffer per temp (most of a model's under 4 MiB: an activation of 1024 x 128 f32 is 512 KiB) every temp
/// sat on 4 KiB pages, and a training step's ~70 MB of them is ~18000 pages, far past what the TLB holds, so its
/// kernels walked page tables through the step (two-dimensional walks in a virtual machine). A region of at least
/// [`HUGE_PAGE_MIN`](kiln_jit::host_vec::HUGE_PAGE_MIN) bytes starts its temps on a 2 MiB boundary inside the buffer
/// and spans whole 2 MiB pages, which the plan's arena has collapsed into huge ones from its second run on
/// (`host_vec::collapse_huge_pages_later`); a smaller one is packed from the buffer's start.
#[derive(Clone, Debug)]
struct TempLayout {
    /// Each temp's offset in bytes from the region's start.
    offsets: Vec<usize>,
    /// The region's bytes (whole 2 MiB pages where it is large).
    bytes: usize,
}

impl TempLayout {
    const HUGE: usize = 2 << 20;

    /// The layout of temps of `sizes` bytes.
    fn of(sizes: &[usize]) -> TempLayout {
        let mut at = 0;
        let offsets = sizes
            .iter()
            .map(|&b| {
                let o = at;
                at = (at + b).next_multiple_of(kiln_jit::host_vec::HOST_ALIGN);
                o
            })
            .collect();
        let bytes = if at >= kiln_jit::host_vec::HUGE_PAGE_MIN { at.next_multiple_of(Self::HUGE) } else { at };
        TempLayout { offsets, bytes }
    }

    fn huge(&self) -> bool {
        self.bytes >= kiln_jit::host_vec::HUGE_PAGE_MIN
    }

    /// `i64` words of the buffer holding the region: a large one has room to start on a 2 MiB boundary.
    fn words(&self) -> usize {
        (self.bytes + if self.huge() { Self::HUGE } else { 0 }).div_ceil(8)
    }

    /// The region's first byte in a buffer of [`TempLayout::words`] words at `start` (64-byte aligned).
    fn base(&self, start: *mut u8) -> *mut u8 {
        if self.huge() { start.wrapping_add(start.align_offset(Self::HUGE)) } else { start }
    }
}

impl Drop for JitPlan {
    /// A plan dropped before its first run gives the prefaulted buffers to the pool.
    fn drop(&mut self) {
        if let Some(p) = self.prefault.get_mut().take() {
            p.join().into_iter().for_each(crate::host_pool::give);
        }
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

/// One run's state: the plan's arena (or a private one while another thread replays the same plan) and the inputs.
pub(crate) struct CpuRun<'a> {
    guard: Option<MutexGuard<'a, Arena>>,
    own: Arena,
    inputs: &'a [&'a Buffer],
}

impl CpuRun<'_> {
    fn arena(&mut self) -> &mut Arena {
        match self.guard.as_deref_mut() {
            Some(a) => a,
            None => &mut self.own,
        }
    }
}

/// Host memory of a buffer the executor checked to be ours.
fn host(b: &Buffer) -> &HostBuffer {
    super::as_host(b).unwrap_or_else(|_| unreachable!("the executor checked every input"))
}

impl DevicePlan for JitPlan {
    const DEVICE: &'static str = NAME;
    type State<'a> = CpuRun<'a>;

    fn shape(&self) -> &PlanShape {
        &self.shape
    }

    fn ours(b: &Buffer) -> bool {
        matches!(b, Buffer::Host(_))
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        Ok(Buffer::Host(crate::host_pool::take(dtype, len)))
    }

    fn begin<'a>(
        &'a self,
        _run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<CpuRun<'a>, BackendError> {
        for &(o, i) in &self.shape.passthrough {
            outputs[o] = Buffer::Host(host(inputs[i]).clone());
        }
        let mut st = CpuRun { guard: self.arena.try_lock(), own: Arena::default(), inputs };
        let shared = st.guard.is_some();
        let arena = st.arena();
        if arena.region.is_none() {
            let mut region = match self.prefault.lock().take().and_then(Prefault::join) {
                Some(r) if crate::host_pool::capacity(&r) >= self.temps.words() => r,
                _ => crate::host_pool::take_region(self.temps.words()),
            };
            let base = self.temps.base(write_ptr(&mut region));
            arena.temps = self.temps.offsets.iter().map(|&o| base.wrapping_add(o)).collect();
            arena.region = Some(region);
        }
        // The plan's own arena, kept from run to run, has its pages made huge ones from its second run on (a private
        // arena of a concurrent replay lives for one run): collapsing them while the first run faults in and
        // computes had cost that run 10-150 ms on two cores.
        arena.runs += 1;
        if shared && arena.runs == 2 && self.temps.huge() {
            let base = arena.temps.first().copied().unwrap_or(std::ptr::null_mut());
            kiln_jit::host_vec::collapse_huge_pages_later(base, self.temps.bytes);
        }
        arena.out_ptrs.clear();
        arena.out_ptrs.extend(outputs.iter_mut().map(|b| match b {
            Buffer::Host(h) => write_ptr(h),
            #[allow(unreachable_patterns)] // only with another device's feature on
            _ => unreachable!("outputs are host buffers"),
        }));
        arena.rng_words.clear();
        arena.rng_words.extend(rng.iter().flat_map(|k| [k.seed, k.offset]));
        for w in &arena.fault {
            w.store(0, Ordering::Relaxed);
        }
        Ok(st)
    }

    fn launch(&self, st: &mut CpuRun<'_>, _run: &Run, index: usize, places: &[Place]) -> Result<(), BackendError> {
        let l = &self.launches[index];
        let inputs = st.inputs;
        let Arena { temps, ptrs, rng_words, out_ptrs, fault, constants_ready, .. } = st.arena();
        if l.constant && *constants_ready {
            return Ok(());
        }
        ptrs.clear();
        for p in places {
            ptrs.push(match *p {
                Place::Input(i) => read_ptr(host(inputs[i])),
                Place::Temp(t) => temps[t],
                Place::Output(o) => out_ptrs[o],
            });
        }
        if l.can_fault {
            ptrs.push(fault.as_ptr() as *mut u8);
        }
        let t0 = profile::profiling().then(std::time::Instant::now);
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
            // SAFETY: as for a GEMM; a row kernel is never given a donated output (`compile`).
            Exec::Rows(r) => unsafe { r.run(ptrs) },
            // SAFETY: `ptrs` holds the routine's input buffers then its output (then the fault record, not passed),
            // sized as its descriptor declares; routine outputs are never donated (`donate.rs`).
            Exec::Routine(r) => unsafe { super::routines::run(r, &ptrs[..ptrs.len() - l.can_fault as usize], fault) },
        }
        if let Some(t0) = t0 {
            profile::record(NAME, &l.name, t0.elapsed());
        }
        Ok(())
    }

    fn finish(&self, mut st: CpuRun<'_>, outputs: &mut [Buffer]) -> Result<(), BackendError> {
        let words = st.arena().fault.each_ref().map(|w| w.load(Ordering::Acquire));
        if let Some(fault) = Fault::decode(words) {
            return Err(BackendError::Fault { device: NAME, fault });
        }
        for (o, (b, &(_, len))) in outputs.iter_mut().zip(&self.shape.outputs).enumerate() {
            if let Buffer::Host(b) = b
                && !self.shape.passthrough.iter().any(|&(p, _)| p == o)
            {
                // SAFETY: the schedule makes exactly one launch write each non-passthrough output, and a kernel
                // stores every element of its row-major output range (all rows were launched before `finish`);
                // stored values are valid for the element type (bools as 0 or 1).
                unsafe { finish_output(b, len) };
            }
        }
        st.arena().constants_ready = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::TempLayout;

    /// Temps lie one after another on 64-byte boundaries without overlapping; a region of 4 MiB or more spans
    /// whole 2 MiB pages from a 2 MiB boundary inside its buffer, for any 64-byte-aligned buffer start.
    #[test]
    fn temps_share_one_region() {
        let huge = TempLayout::HUGE;
        for sizes in [
            vec![],
            vec![8],
            vec![100, 3, 4096, 1 << 20],
            vec![524288, 262144, 20480, 20480, 262144, 524288],
            vec![3 << 20, 1, 2 << 20, 12345],
        ] {
            let l = TempLayout::of(&sizes);
            let mut end = 0;
            for (&o, &b) in l.offsets.iter().zip(&sizes) {
                assert!(o % 64 == 0 && o >= end, "{sizes:?}: {:?}", l.offsets);
                end = o + b;
            }
            assert!(l.bytes >= end, "{sizes:?}");
            assert_eq!(l.huge(), end >= kiln_jit::host_vec::HUGE_PAGE_MIN, "{sizes:?}");
            if !l.huge() {
                assert_eq!(l.bytes, end.next_multiple_of(64), "{sizes:?}");
                continue;
            }
            assert_eq!(l.bytes % huge, 0);
            for start in [0x7f00_0000_0040usize, 0x7f00_0020_0000, 0x7f00_001f_ffc0] {
                let base = l.base(start as *mut u8) as usize;
                assert_eq!(base % huge, 0);
                assert!(base >= start && base + l.bytes <= start + 8 * l.words(), "{sizes:?} at {start:#x}");
            }
        }
    }
}
