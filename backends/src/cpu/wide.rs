//! Elementwise f32 kernels at full vector width (8 lanes with AVX2, 16 with AVX-512F), generated at run time.
//!
//! Why: Cranelift 0.135 emits 128-bit vectors only on x86-64, so a Cranelift elementwise kernel issues twice the
//! loads, stores and arithmetic instructions of an 8-lane one (four times a 16-lane one's), and on this machine (Zen 4, one 256-bit store per
//! cycle) a weight update that streams from L2 is bound by exactly those: the batch-1 training step's update of its
//! 256 x 784 weight, `w - (dy ⊗ x) * lr`, takes about a third less time here than as a Cranelift kernel (~1.8
//! instructions per element there).
//!
//! What runs here: a kernel without a reduction, its loops merged where its indices allow
//! (`KernelIr::with_merged_loops`), over `[batch.., m, n]` or `[n]` (`ElementwiseView`), whose outer code the GEMM
//! epilogue's register program can express (`gemm::epilogue::translate`: f32 `+ - * /`, `sqrt`, `neg`, `abs`, `recip`,
//! `exp`, `tanh`, `log`, comparisons, `where`, bool `and`/`or`/`not`, i32 `==`/`!=`; loads that walk n contiguously,
//! per element or per column, loads that stand still along a row, values uniform over the launch; masked loads
//! whose masks test only batch positions, read through a gate per row, `gate_batch_masks`, a closed gate's load
//! reading an open one's bytes where the parts are read alike, `shared_gate_reads`). It *is* an epilogue
//! without an accumulator, so it is translated by the same code and its arithmetic emitted by the same emitter
//! (`asm::emit_insts`); only the loop around it is this file's. bf16 runs too, at 16 lanes only: loads widen 2-byte
//! elements to their exact f32 values (`vpmovzxwd`, shift), each bf16 result of arithmetic is rounded in the program
//! with the Cranelift kernels' integer rounding, and a bf16 output is stored as each lane's top half (`vpmovdw`),
//! all masked by k1 at the edges; AVX2 has no 2-byte masked moves, so an 8-lane-only host keeps bf16 on Cranelift.
//! Anything else (another dtype, sin/cos, max/min with their NaN rule, a gather, a value uniform per batch element
//! only) stays a Cranelift kernel. Results are
//! bit-identical to the Cranelift kernel's: the same IEEE operations in the same order, never contracted into an FMA
//! the Cranelift kernel does not use; for everything but `exp`, `tanh` and `log` (whose polynomials the interpreter
//! does not share) that is also the interpreter's value. At 8 lanes, `exp`, sigmoid and softmax over large f32
//! tensors run about twice as fast as the Cranelift kernels.
//!
//! Row sums run here too (`Along::Rows`): a reduce kernel that sums f32 over its innermost loop, with the inner code as
//! the register program over `[rows, k]` and the outer code (the sum and constants only, e.g. the `log` of a
//! log-sum-exp) applied once per row; each copy of the unrolled loop accumulates into its own register
//! (`log_softmax`'s log-sum-exp runs about twice as fast as the Cranelift kernel). Column sums (a sum over another
//! loop whose loads walk the output's loop contiguously: `dy.sum(0)`) are built here too, with the loop of
//! `wide_cols.rs`.
//!
//! Code: `extern "sysv64" fn(table, rows, cols)`, `table` = `[out, tail mask, uniforms, head mask, head bytes,
//! operand 0, ..]`, every pointer at the first element of the chunk. Uniforms are loaded into registers once per
//! call. Per row: values that stand still along it (per-row loads) are broadcast into registers once; a masked head
//! (`vmaskmovps`, or opmask k1 at 16 lanes) runs up to the output's first vector-size boundary (32 or 64 bytes)
//! when every row starts at the same alignment (host buffers start on a 64-byte boundary, `kiln_jit::HostVec`, but
//! a view may start inside one; a store that straddles two cache lines costs about two); then
//! `unroll` vectors per iteration (their programs interleaved instruction by instruction,
//! `asm::emit_insts_interleaved`, so a transcendental's long dependent chain does not fill the schedulers alone),
//! single vectors, and a masked tail, so nothing is read or written past a row; then every pointer steps one row.
//! Operand pointers live in rcx, r8-r11 and rbx, the column offset in rax, so a load is one instruction with no
//! address arithmetic. The caller splits rows over threads (the Cranelift kernels' split,
//! so a weight's rows stay on the core that updates them; rows of all batch elements form one range, a call never
//! crosses a batch element), or for one row, chunks of one vector's columns. A call per batch element makes a
//! kernel of many short batch elements mostly calls, so where the row loop is short and a longer loop above it is
//! free of masks, that loop becomes the row loop and the output is written through its original strides
//! (`with_longest_rows`).
//!
//! The width (`width`): 16 lanes wherever AVX-512 is allowed (`cpu::isa`), else 8. Unlike the GEMM's families it is
//! not weighed by the FMA peaks: these kernels are not FMA-bound, and their polynomials, compares, blends and loop
//! overhead take half as many instructions at 16 lanes, which pays on a core that splits 512-bit operations too
//! (docs/benchmarks.md, the double-pumped host's section, has the interleaved measurement).
//!
//! The column offset (rax) counts 4 bytes per element, or 2 in a kernel with a bf16 operand or output (its f32
//! accesses scale it by 2). Both widths run the same loop and register program (`asm::VecIsa`); the 16-lane one's
//! vector moves are EVEX (`gemm::evex`), its constants read through rbp. Elementwise results are bit-identical at
//! both widths; a row sum's lanes are added in another order (within the row-sum tolerance).
//!
//! Each element is loaded before it is stored, so a donated input may be the output (a weight updated in place).
//! Kernels are cached in memory by IR text (`GENERATED`: a model's layers repeat them). Deliberately not done:
//! caching the code on disk (generating and mapping one costs about what mapping a cached copy does); hoisting
//! arithmetic on per-row values out of the column loop (the batch-1 update multiplies the per-row gradient by the
//! row's inputs first, so nothing there would hoist); unrolling past 4 vectors (8 measured no faster on the update).

// `dynasm!` converts every run-time register number with `.into()`, a no-op for the `u8`s used here.
#![allow(clippy::useless_conversion)]

use super::gemm::asm::{self, EpInst, EpProgram, VecIsa};
use super::gemm::asm512::Zmm;
use super::gemm::epilogue::{self, Epilogue, OperandKind, Uniforms};
use super::gemm::evex::{Enc, gpr, mem, mem_indexed};
use super::isa::{self, Isa};
use super::pool;
use super::wide_cols::{self, ColLayout};
use dynasmrt::x64::Assembler;
use dynasmrt::{DynasmApi, DynasmLabelApi, ExecutableBuffer, dynasm};
use kiln_jit::kernel::gemm::ElementwiseView;
use kiln_jit::kernel::{IExpr, Inst, KernelIr};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, LazyLock};

/// `table, rows, cols`: see the module doc.
type WideFn = unsafe extern "sysv64" fn(*const *const u8, usize, usize);

/// Entries of the table before the operand pointers: output, tail mask, uniforms, head mask, head bytes.
const TABLE_OPERANDS: usize = 5;

/// GPRs holding operand pointers, by operand index (caller-saved ones first; rbx is pushed).
pub(super) const OPERAND_REGS: [u8; epilogue::MAX_OPERANDS] = [1, 8, 9, 10, 11, 3];
/// The mask of a row's partial first or last vector.
pub(super) const MASK_REG: u8 = 15;

/// Whether elementwise kernels are generated here: AVX2 + FMA hosts, unless `KILN_ELEMENTWISE=clif` (for
/// comparisons and bisecting; read once).
pub(crate) fn enabled() -> bool {
    static ON: LazyLock<bool> =
        LazyLock::new(|| asm::host_supported() && std::env::var("KILN_ELEMENTWISE").map_or(true, |v| v != "clif"));
    *ON
}

/// Kernels run here for plans (launches and GEMM epilogue passes, each one counted, generated or reused from
/// [`GENERATED`]) since the process started.
pub(crate) static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Of [`BUILDS`], the kernels generated (the rest reused [`GENERATED`]'s code).
pub(crate) static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The kernels generated so far, by kernel IR text (the IR fixes the code, as it keys the Cranelift kernels; the
/// width is fixed per process, [`width`]), with the kernels found not to qualify (`None`). A model's layers repeat
/// kernels: a 4-layer GPT step launches 267 of 56 distinct IRs, and each generation costs its code, an executable
/// mapping and its protection change (~75 µs there; 20 ms of that step's 130 ms compile before this cache). Like
/// Cranelift's module, it keeps what it generated for the life of the process.
static GENERATED: LazyLock<Mutex<HashMap<String, Option<Arc<WideKernel>>>>> = LazyLock::new(Default::default);

/// The wide kernel a plan runs for `k` where generation is [`enabled`] and `k` qualifies (counted in [`BUILDS`],
/// and written to the dump), else `Ok(None)`: the caller compiles it with Cranelift. The one entry point for plan
/// launches and GEMM epilogue passes alike.
pub(crate) fn for_plan(k: &KernelIr, dump: Option<&crate::dump::Dump>) -> Result<Option<Arc<WideKernel>>, String> {
    // A kernel that gathers is the Cranelift renderer's (its per-lane checked loads and the fault record).
    if !enabled() || k.can_fault() {
        return Ok(None);
    }
    let text = k.to_text();
    let cached = GENERATED.lock().get(&text).cloned();
    let w = match cached {
        Some(w) => w,
        None => {
            let w = WideKernel::build(k)?.map(Arc::new);
            if w.is_some() {
                GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            GENERATED.lock().insert(text, w.clone());
            w
        }
    };
    let Some(w) = w else { return Ok(None) };
    BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(d) = dump {
        d.generated_files(k, "wide.txt", &w.listing(), w.code_bytes());
    }
    Ok(Some(w))
}

/// A generated elementwise kernel, ready to launch.
pub(crate) struct WideKernel {
    batch: Vec<usize>,
    m: usize,
    n: usize,
    /// The output's element stride per batch dim and per row: row-major over `[batch.., m, n]`, or the original
    /// layout's strides where [`with_longest_rows`] chose another loop as the row loop.
    out_batch: Vec<usize>,
    out_ld: usize,
    ep: Epilogue,
    /// The outer code (for the host-evaluated uniform values).
    outer: Vec<Inst>,
    n_inputs: usize,
    /// Element-operations of one launch, for the pool's split decision.
    work: usize,
    /// Vectors per column-loop iteration.
    unroll: usize,
    /// A reduce kernel's sums ([`Sum`]): each call writes one value per row (a row sum) or per column (column
    /// sums, where `m` is the reduce loop and each call sums every row of its columns) instead of a row.
    sum: Option<Sum>,
    /// 8 lanes (AVX2) or 16 (AVX-512F).
    isa: Isa,
    /// The output is bf16 (2-byte elements, rounded by the program and stored as their top halves).
    out_bf16: bool,
    /// The gate tables of masked loads read whole or not at all per batch element ([`gate_batch_masks`]): inputs
    /// after the kernel's own, before its output.
    gates: Vec<Vec<i32>>,
    /// Per gate, the epilogue operand its load reads, where a closed gate's load may read what an open one reads
    /// ([`shared_gate_reads`]: each such buffer is read by that one load); empty otherwise.
    gate_operands: Vec<usize>,
    /// Column sums split over rows (`col_parts`): the sums of every part but the first, `n` each.
    partials: parking_lot::Mutex<Vec<f32>>,
    code: ExecutableBuffer,
    f: WideFn,
}

/// Fewest rows a share of a split column sum takes (`WideKernel::col_parts`): below that the sums are a
/// microsecond or two, less than the partials' pass and the threads' sync.
const COL_PART_ROWS: usize = 128;

/// A reduce kernel run here: an f32 sum over one loop of an elementwise program (the kernel's inner code), and
/// `outer`, a register program of the sum alone (`Acc`) and constants applied to each sum (`log` for a
/// log-sum-exp, a mean's division).
#[derive(Clone, Debug)]
struct Sum {
    along: Along,
    outer: EpProgram,
}

/// Which loop a [`Sum`] reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Along {
    /// The innermost, its loads walking it contiguously: `sum over k of inner(row, k)` per row, the inner code over
    /// `[rows, k]` (the reduce loop as its columns). Vectors accumulate into one register each of an unrolled
    /// iteration's copies (a row's last partial vector masked to +0 first), which are added pairwise, then across
    /// lanes: a different summation order from the Cranelift kernel's, so results agree within the f32
    /// accumulation tolerance, not bit for bit.
    Rows,
    /// Another loop, the loads walking the output's loop contiguously (`dy.sum(0)`): the inner code over
    /// `[k, cols]` (the reduce loop as its rows), each column's rows added in order (`wide_cols.rs`).
    Cols,
}

// SAFETY: `f` points into `code`, an immutable executable mapping owned here; running only reads `self`.
unsafe impl Send for WideKernel {}
// SAFETY: as for Send.
unsafe impl Sync for WideKernel {}

/// The width elementwise kernels are generated at: 16 lanes where `KILN_CPU_ISA` allows AVX-512, else 8 (the module
/// doc says why the FMA peaks do not decide it).
pub(super) fn width() -> Isa {
    static WIDTH: LazyLock<Isa> = LazyLock::new(|| if isa::allows(Isa::Avx512) { Isa::Avx512 } else { Isa::Avx2 });
    *WIDTH
}

impl WideKernel {
    /// Generates `k` at this host's [`width`], or `Ok(None)` when it is not such a kernel (see the module doc) or
    /// this host cannot run it.
    pub(crate) fn build(k: &KernelIr) -> Result<Option<WideKernel>, String> {
        // A kernel with bf16 values needs the 16-lane form's masked 2-byte loads and stores: on an AVX2-only host
        // (or under `KILN_CPU_ISA=avx2`) it is left to Cranelift.
        Self::build_for(k, width())
    }

    /// [`WideKernel::build`] at an explicit width (`Ok(None)` where the host lacks it, and for a kernel with bf16
    /// values at 8 lanes).
    pub(crate) fn build_for(k: &KernelIr, isa: Isa) -> Result<Option<WideKernel>, String> {
        if !asm::host_supported() || !isa.present() || (isa == Isa::Avx2 && touches_bf16(k)) {
            return Ok(None);
        }
        // A sum over the innermost loop whose loads walk it contiguously is a row sum; else one whose loads walk
        // the output's loop contiguously, column sums. (A reduce kernel is no elementwise view: the last build
        // declines it.)
        for along in [Along::Rows, Along::Cols] {
            if let Some((inner, outer)) = sum_parts(k, along)
                && let Some(w) = Self::build_from(inner, Some(Sum { along, outer }), isa)?
            {
                return Ok(Some(w));
            }
        }
        Self::build_from(k.with_merged_loops(), None, isa)
    }

    /// [`WideKernel::build_for`] of `merged`, the elementwise form of the kernel: a sum's inner code where one is
    /// given.
    fn build_from(merged: KernelIr, sum: Option<Sum>, isa: Isa) -> Result<Option<WideKernel>, String> {
        let reduces = sum.is_some();
        let row_outer = sum.as_ref().filter(|s| s.along == Along::Rows).map(|s| &s.outer);
        let col_outer = sum.as_ref().filter(|s| s.along == Along::Cols).map(|s| &s.outer);
        // The output's strides per batch dim and per row: row-major, unless the row loop is another one.
        let (merged, out_strides) = match (!reduces).then(|| with_longest_rows(&merged)).flatten() {
            Some((permuted, strides)) => (permuted, Some(strides)),
            None => (merged, None),
        };
        let gate_bufs = shared_gate_reads(&merged);
        let (merged, gates) = match (!reduces).then(|| gate_batch_masks(&merged)).flatten() {
            Some((gated, gates)) => (gated, gates),
            None => (merged, Vec::new()),
        };
        let gate_bufs = if gates.is_empty() { Vec::new() } else { gate_bufs };
        let k = &merged;
        let Some(view) = ElementwiseView::of(k) else { return Ok(None) };
        let (out_batch, out_ld) = out_strides.unwrap_or_else(|| {
            let dims: Vec<usize> = view.batch.iter().copied().chain([view.m, view.n]).collect();
            let strides = row_major_strides(&dims);
            (strides[..view.batch.len()].to_vec(), view.n)
        });
        let allow = epilogue::Allow { bf16: true, bf16_loads: true, positions: false, scalef: isa == Isa::Avx512 };
        let Some(ep) = epilogue::translate_with(k, &view.roles, allow) else { return Ok(None) };
        let gate_operands: Vec<usize> =
            gate_bufs.iter().filter_map(|&b| ep.operands.iter().position(|o| o.buf == b)).collect();
        let gate_operands = if gate_operands.len() == gate_bufs.len() { gate_operands } else { Vec::new() };
        let out_bf16 = k.output.dtype == kiln_jit::DType::BF16;
        // Row steps are instruction immediates.
        let steps_fit = i32::try_from(4 * out_ld).is_ok()
            && ep.operands.iter().all(|o| match o.kind {
                OperandKind::Mat { ld } => i32::try_from(4 * ld).is_ok(),
                OperandKind::Col { stride } => i32::try_from(4 * stride).is_ok(),
                OperandKind::Row => true,
            });
        if !steps_fit || col_outer.is_some() && !wide_cols::panel_steps_fit(&ep) {
            return Ok(None);
        }
        let (code, unroll) = if let Some(outer) = col_outer {
            let Some(layout) = ColLayout::plan(&ep.program, outer, view.n, isa) else { return Ok(None) };
            (wide_cols::emit(&ep, &layout, outer, isa, unit(&ep, out_bf16))?, layout.widest())
        } else {
            let Some(layout) = Layout::plan(&ep.program, view.n, row_outer, isa) else { return Ok(None) };
            (emit(&ep, &layout, out_ld, row_outer, isa, out_bf16)?, layout.unroll)
        };
        crate::cpu::code::MAPPINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the code at offset 0 is a function emitted by `emit` with `WideFn`'s sysv64 signature, and `code`
        // (kept in the returned kernel) keeps it mapped executable.
        let f = unsafe { std::mem::transmute::<*const u8, WideFn>(code.ptr(dynasmrt::AssemblyOffset(0))) };
        Ok(Some(WideKernel {
            batch: view.batch,
            m: view.m,
            n: view.n,
            out_batch,
            out_ld,
            ep,
            outer: k.outer.clone(),
            n_inputs: k.inputs.len(),
            work: k.work(),
            unroll,
            sum,
            isa,
            out_bf16,
            gates,
            gate_operands,
            partials: parking_lot::Mutex::new(Vec::new()),
            code,
            f,
        }))
    }

    /// The register program, its loop shape and the machine code's size, for `KILN_DUMP`.
    pub(crate) fn listing(&self) -> String {
        let batch: String = self.batch.iter().map(|b| format!("{b} x ")).collect();
        let what = match self.along() {
            Some(Along::Rows) => "row sums of",
            Some(Along::Cols) => "column sums of",
            None => "elementwise",
        };
        let mut s = format!(
            "{what} {batch}{} x {}, {} vectors of {} lanes per iteration\n",
            self.m,
            self.n,
            self.unroll,
            self.isa.lanes()
        );
        for (i, o) in self.ep.operands.iter().enumerate() {
            let dtype = if o.bf16 { ", bf16" } else { "" };
            let _ = writeln!(s, "  op{i}: in{} + {}, {:?}{dtype}", o.buf, o.offset, o.kind);
        }
        for (slot, i) in self.ep.uniforms.iter().enumerate() {
            let _ = writeln!(s, "  uniform{slot}: outer v{i}");
        }
        for (i, inst) in self.ep.program.insts.iter().enumerate() {
            let _ = writeln!(s, "  v{i} = {inst:?}");
        }
        let _ = writeln!(s, "  out = v{}{}", self.ep.program.result, if self.out_bf16 { " as bf16" } else { "" });
        if let Some(sum) = &self.sum {
            let per = if sum.along == Along::Rows { "row" } else { "column" };
            for (i, inst) in sum.outer.insts.iter().enumerate() {
                let _ = writeln!(s, "  {per} w{i} = {inst:?}");
            }
            let _ = writeln!(s, "  {per} out = w{}", sum.outer.result);
        }
        let _ = writeln!(s, "  ({} bytes of code)", self.code.len());
        s
    }

    /// The machine code (`objdump -D -b binary -mi386:x86-64` disassembles it).
    pub(crate) fn code_bytes(&self) -> &[u8] {
        &self.code
    }

    /// Runs the kernel: `ptrs` holds its input pointers, then the output pointer.
    ///
    /// # Safety
    /// Every pointer must be valid for the buffer the kernel IR declares at that position (its dtype and length),
    /// and the output must not alias an input other than one read at the output's own element (a donation).
    pub(crate) unsafe fn run(&self, ptrs: &[*mut u8]) {
        // The gate tables go between the kernel's own inputs and its output, where the gated IR declares them (a
        // kernel without gates takes the caller's pointers as they are: no copy on its replays).
        let with_gates: smallvec::SmallVec<[*mut u8; 16]>;
        let ptrs = if self.gates.is_empty() {
            ptrs
        } else {
            let own = self.n_inputs - self.gates.len();
            with_gates = ptrs[..own]
                .iter()
                .copied()
                .chain(self.gates.iter().map(|g| g.as_ptr() as *mut u8))
                .chain(ptrs[own..].iter().copied())
                .collect();
            &with_gates[..]
        };
        // SAFETY: the caller's pointer contract; each gate table holds what its BufParam declares (only read).
        let uniforms = unsafe { Uniforms::for_launch(Some(&self.ep), &self.outer, ptrs) };
        let args = Args { ptrs, uniforms: uniforms.as_ptr() };
        let parts = self.col_parts();
        if parts > 1 {
            // SAFETY: the caller's pointer contract.
            unsafe { self.run_col_parts(&args, parts) };
        } else if self.along() == Some(Along::Cols) {
            // Column sums: whole vectors of columns a thread, every row.
            let lanes = self.isa.lanes();
            let f = |s: usize, e: usize| {
                let (c0, c1) = (lanes * s, (lanes * e).min(self.n));
                // SAFETY: the caller's pointer contract; `c0..c1` are columns of every row.
                unsafe { self.call(&args, 0, 0, self.m, c0, c1 - c0) };
            };
            pool::global().parallel_for_work(self.n.div_ceil(lanes), self.work, &f);
        } else if self.batch.is_empty() && self.m == 1 && self.sum.is_none() {
            // One row: chunks of whole vectors, the last one ragged.
            let lanes = self.isa.lanes();
            let f = |s: usize, e: usize| {
                let (c0, c1) = (lanes * s, (lanes * e).min(self.n));
                // SAFETY: the caller's pointer contract; `c0..c1` lies within the row.
                unsafe { self.call(&args, 0, 0, 1, c0, c1 - c0) };
            };
            pool::global().parallel_for_work(self.n.div_ceil(lanes), self.work, &f);
        } else {
            // Rows of all batch elements in one range; a chunk is cut where a batch element ends.
            let f = |s: usize, e: usize| {
                let mut r = s;
                while r < e {
                    let (b, r0) = (r / self.m, r % self.m);
                    let end = e.min((b + 1) * self.m);
                    // SAFETY: the caller's pointer contract; rows `r0..r0 + end - r` of batch element `b` exist.
                    unsafe { self.call(&args, b, r0, end - r, 0, self.n) };
                    r = end;
                }
            };
            pool::global().parallel_for_work(self.batch.iter().product::<usize>() * self.m, self.work, &f);
        }
    }

    /// Into how many shares of its rows a column sum is split: one a thread, each at least [`COL_PART_ROWS`] rows,
    /// for an f32 sum whose outer code is the sum itself (a bias's or a norm weight's gradient); 1 otherwise (all
    /// rows a call, threads on vectors of columns). Why rows: the rows are a training step's tokens, and the
    /// kernels before it (row-split elementwise and row kernels, the weight gradient's K split) wrote each thread's
    /// share of them on that thread; split by columns, each thread reads every token, half from the other core.
    fn col_parts(&self) -> usize {
        let plain_sum = self.sum.as_ref().is_some_and(|s| {
            s.along == Along::Cols && !self.out_bf16 && matches!(s.outer.insts[s.outer.result], EpInst::Acc)
        });
        if !plain_sum {
            return 1;
        }
        pool::global().threads().min(self.m / COL_PART_ROWS).max(1)
    }

    /// Column sums over `parts` shares of the rows (`col_parts`): share `t` (the pool's chunk bounds, as the row
    /// kernels cut rows) into the output for `t == 0`, into its partial otherwise; then the partials are added into
    /// the output in share order, so the sums do not depend on timing (they are not the single pass's bits: each
    /// column is the sum of its shares' sums).
    ///
    /// # Safety
    /// As [`WideKernel::run`], with `a` built from its pointers.
    unsafe fn run_col_parts(&self, a: &Args, parts: usize) {
        let n = self.n;
        let mut partials = self.partials.lock();
        partials.resize((parts - 1) * n, 0.0);
        let base = partials.as_mut_ptr() as usize;
        let f = |s: usize, e: usize| {
            for t in s..e {
                let (r0, r1) = pool::chunk_bounds(self.m, parts, t);
                let mut ptrs: smallvec::SmallVec<[*mut u8; 16]> = a.ptrs.iter().copied().collect();
                if t > 0 {
                    ptrs[self.n_inputs] = (base as *mut f32).wrapping_add((t - 1) * n) as *mut u8;
                }
                let share = Args { ptrs: &ptrs, uniforms: a.uniforms };
                // SAFETY: the caller's pointer contract for the inputs; rows `r0..r1` exist; the output pointer is
                // the kernel's (n f32 sums) or a partial of `n` f32s.
                unsafe { self.call(&share, 0, r0, r1 - r0, 0, n) };
            }
        };
        pool::global().parallel_for_work(parts, self.work, &f);
        // SAFETY: the output holds `n` f32 sums (an f32 column sum, `col_parts`), the partials `(parts - 1) * n`,
        // all written before `parallel_for_work` returned.
        unsafe {
            let out = std::slice::from_raw_parts_mut(a.ptrs[self.n_inputs] as *mut f32, n);
            pool::add_partials(out, partials.as_ptr(), parts - 1, n);
        }
    }

    /// Calls the code on `rows` rows from `r0` of batch element `b` (row-major over `batch`), columns
    /// `c0..c0 + cols`.
    unsafe fn call(&self, a: &Args, b: usize, r0: usize, rows: usize, c0: usize, cols: usize) {
        let mut table = [std::ptr::null::<u8>(); TABLE_OPERANDS + epilogue::MAX_OPERANDS];
        // Batch element b's position, decomposed once for every operand (a kernel of many small batch elements,
        // such as a concatenation's, makes a call per element); inline up to 8 dims.
        let mut at: smallvec::SmallVec<[isize; 8]> = smallvec::smallvec![0; self.batch.len()];
        let mut rest = b;
        for (d, &e) in self.batch.iter().enumerate().rev() {
            at[d] = (rest % e) as isize;
            rest /= e;
        }
        let batch_offset = |coef: &[i64]| -> isize { coef.iter().zip(&at).map(|(&c, &i)| c as isize * i).sum() };
        let out_row = (b * self.m + r0) as isize;
        let (r0, c0) = (r0 as isize, c0 as isize);
        // SAFETY: every offset formed is that of an element the kernel IR's affine indices reach for some (row,
        // column) in range, so it stays inside its buffer (the caller's contract); the code reads and writes only
        // the `rows` x `cols` elements from those pointers (masked at both ends), as `emit` generates it.
        unsafe {
            // A row sum writes one value per row, column sums one per column.
            let out_at = match self.along() {
                Some(Along::Rows) => out_row,
                Some(Along::Cols) => c0,
                None => {
                    let batch: isize = self.out_batch.iter().zip(&at).map(|(&s, &i)| s as isize * i).sum();
                    batch + r0 * self.out_ld as isize + c0
                }
            };
            let os = if self.out_bf16 { 2 } else { 4 };
            let out = (a.ptrs[self.n_inputs] as *const u8).offset(out_at * os as isize);
            // Columns before the output's first vector-size boundary (32 or 64 bytes), when every row starts at the
            // same alignment: a vector store that straddles two cache lines costs about two (buffers start on a
            // 64-byte boundary, but a view may start inside one). A row sum stores no vectors.
            let (lanes, vb) = (self.isa.lanes(), os * self.isa.lanes());
            let head = if self.sum.is_some() {
                0
            } else if rows == 1 || (os * self.out_ld).is_multiple_of(vb) {
                (((vb - out as usize % vb) % vb) / os).min(cols)
            } else {
                0
            };
            let mask = |n: usize| isa::lane_mask(self.isa, n);
            table[0] = out;
            table[1] = mask((cols - head) % lanes);
            table[2] = a.uniforms;
            table[3] = mask(head);
            table[4] = std::ptr::without_provenance(unit(&self.ep, self.out_bf16) * head);
            for (i, o) in self.ep.operands.iter().enumerate() {
                let at = o.offset as isize
                    + batch_offset(&o.batch)
                    + match o.kind {
                        OperandKind::Mat { ld } => r0 * ld as isize + c0,
                        OperandKind::Row => c0,
                        OperandKind::Col { stride } => r0 * stride as isize,
                    };
                table[TABLE_OPERANDS + i] = (a.ptrs[o.buf] as *const u8).offset(at * o.elem_bytes() as isize);
            }
            // Gates are constant over a batch element's rows: a closed gate's load reads the open one's bytes
            // (the same index into a buffer of the same dtype, so the same addresses, from cache), not its own.
            let gate_row = b * self.m + r0 as usize;
            if let Some(&open) = self.gate_operands.iter().zip(&self.gates).find(|(_, g)| g[gate_row] != 0).map(|x| x.0)
            {
                let from = table[TABLE_OPERANDS + open];
                for (&o, g) in self.gate_operands.iter().zip(&self.gates) {
                    if g[gate_row] == 0 {
                        table[TABLE_OPERANDS + o] = from;
                    }
                }
            }
            (self.f)(table.as_ptr(), rows, cols)
        }
    }
}

impl WideKernel {
    /// Which loop the kernel's sums reduce; `None` for an elementwise kernel.
    fn along(&self) -> Option<Along> {
        self.sum.as_ref().map(|s| s.along)
    }
}

/// The elementwise kernel `k` (loops merged) with another output loop as its row loop, where its row loop is short
/// and a longer loop before it takes no part in a mask: the loops reordered (the columns stay last) and the output's
/// original strides per batch dim and per row, which the kernel then writes through. Each call of the generated code
/// runs the rows of one batch element, so the row loop sets the number of calls: attention's q/k/v gradients put
/// back into one `[B, T, 3 * D]` (`[16, 64, 3, 4, 32]`, rows of 4 head-dim vectors) made 3072 calls of 4 rows, and
/// with T as the row loop make 192 of 64. The elements and what each computes are unchanged (each element is still
/// loaded before its own store, so a donated input stays safe); only their order differs. `None` where the kernel
/// keeps its loops.
fn with_longest_rows(k: &KernelIr) -> Option<(KernelIr, (Vec<usize>, usize))> {
    use kiln_jit::kernel::{IExpr, InstOp};
    /// Rows a call must have before another loop is considered, and how many times longer that loop must be.
    const SHORT_ROWS: usize = 16;
    const LONGER: usize = 4;
    let rank = k.out_rank();
    if k.reduce.is_some() || !k.rows.is_empty() || rank < 3 {
        return None;
    }
    let (mvar, nvar) = (rank - 2, rank - 1);
    let m = k.out_extents[mvar];
    if m >= SHORT_ROWS {
        return None;
    }
    // A masked load's tested loops must stay batch loops (`gate_batch_masks` reads them per batch element).
    let tested: Vec<usize> = k
        .outer
        .iter()
        .filter_map(|i| match &i.op {
            InstOp::Load { valid: Some(v), .. } => Some(v.0.iter().flat_map(|(e, _, _)| e.vars()).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    let best = (0..mvar).filter(|v| !tested.contains(v)).max_by_key(|&v| (k.out_extents[v], v))?;
    if k.out_extents[best] < LONGER * m {
        return None;
    }
    let order: Vec<usize> = (0..nvar).filter(|&v| v != best).chain([best, nvar]).collect();
    let mut new_of_old = vec![0; rank];
    for (i, &o) in order.iter().enumerate() {
        new_of_old[o] = i;
    }
    let extents: Vec<usize> = order.iter().map(|&o| k.out_extents[o]).collect();
    let remap = |e: &IExpr| e.map_vars(&|v| IExpr::Var(new_of_old[v])).simplify(&extents);
    let mut out = k.clone();
    out.out_extents = extents.clone();
    for inst in &mut out.outer {
        inst.map_indices(&remap);
    }
    let row_major = row_major_strides(&k.out_extents);
    let strides: Vec<usize> = order.iter().map(|&o| row_major[o]).collect();
    Some((out, (strides[..rank - 2].to_vec(), strides[rank - 2])))
}

/// For a kernel whose masked loads [`gate_batch_masks`] will gate: the buffer each gated load reads, in gate order,
/// where a closed gate's load may read another's bytes instead of its own (empty where not): every gated load reads
/// a buffer of its own (no other load reads it) at the same index, in the same dtype, so within a batch element the
/// loads of every part read the same addresses. A concatenation's parts are such loads: each output element takes
/// one part and the others' loads, whose values the gates discard, read the taken part's element again (from cache)
/// instead of their own part's, which a pass over the output would otherwise read in full once per part.
fn shared_gate_reads(k: &KernelIr) -> Vec<usize> {
    use kiln_jit::kernel::InstOp;
    let rank = k.out_rank();
    if rank < 3 {
        return Vec::new();
    }
    let mut gated = Vec::new();
    let mut reads = vec![0usize; k.inputs.len()];
    for inst in &k.outer {
        if let InstOp::Load { buf, index, .. } = &inst.op {
            reads[*buf] += 1;
            if batch_gated(&inst.op, rank) {
                gated.push((*buf, index, inst.dtype));
            }
        }
    }
    let alike = gated.windows(2).all(|w| w[0].1 == w[1].1 && w[0].2 == w[1].2);
    let own = gated.iter().all(|&(buf, _, _)| reads[buf] == 1 && k.inputs[buf].len == k.inputs[gated[0].0].len);
    if gated.len() < 2 || !alike || !own {
        return Vec::new();
    }
    gated.iter().map(|&(buf, _, _)| buf).collect()
}

/// Whether `op` is a load [`gate_batch_masks`] reads through a gate: masked, its ranges testing only batch positions
/// (loop variables before the last two of `rank`), its index independent of the variables they test.
fn batch_gated(op: &kiln_jit::kernel::InstOp, rank: usize) -> bool {
    let kiln_jit::kernel::InstOp::Load { index, valid: Some(v), .. } = op else { return false };
    let tested: Vec<usize> = v.0.iter().flat_map(|(e, _, _)| e.vars()).collect();
    let coef = index.affine(rank).map(|(c, _)| c);
    tested.iter().all(|&t| t + 2 < rank) && coef.is_some_and(|c| tested.iter().all(|&t| c[t] == 0))
}

/// Element strides of a row-major layout over `extents`.
fn row_major_strides(extents: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; extents.len()];
    for d in (0..extents.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * extents[d + 1];
    }
    strides
}

/// `k` with its masked loads whose ranges test only batch positions (loop variables before the last two: a pad or a
/// concatenation along an outer dim, such as attention's q/k/v gradients put back into one `[B * T, 3 * D]`)
/// rewritten as unmasked loads selected by a gate: an i32 table, 1 where the load's ranges hold, read per row (a
/// per-row operand), built here from the ranges, one table per load (`None`: no such load). The register program
/// then runs such a kernel at full width, where the masks had left it to a 4-lane Cranelift kernel. The same
/// values: where a gate is 0 the `where` gives the load's fill, as the masked load did.
///
/// Only loads whose index does not depend on the variables their ranges test (a padded dim of one element reads
/// its element 0): the address read where the gate is 0 is then one read where it is 1, inside the buffer.
fn gate_batch_masks(k: &KernelIr) -> Option<(KernelIr, Vec<Vec<i32>>)> {
    const MAX_GATE_ROWS: usize = 1 << 20;
    use kiln_jit::kernel::index::IExpr;
    use kiln_jit::kernel::ir::{BufParam, InstOp};
    use kiln_jit::{DType, Scalar, op::BinaryOp};
    let rank = k.out_rank();
    if k.reduce.is_some() || !k.rows.is_empty() || rank < 3 {
        return None;
    }
    let batch_rank = rank - 2;
    let gated = |op: &InstOp| batch_gated(op, rank);
    if !k.outer.iter().any(|i| gated(&i.op)) {
        return None;
    }
    let (batch, m) = (&k.out_extents[..batch_rank], k.out_extents[batch_rank]);
    let rows: usize = batch.iter().product::<usize>() * m;
    // A table entry per row: past a few MiB (rows of a few elements over a large tensor) the Cranelift kernel's
    // masks are the cheaper way.
    if rows > MAX_GATE_ROWS {
        return None;
    }
    // Row r's batch position and its index in the table (`b * m + row`): the per-row operand's index.
    let row_index = {
        let mut stride = m as i64;
        let mut terms = vec![IExpr::Var(batch_rank)];
        for d in (0..batch_rank).rev() {
            terms.push(IExpr::Var(d).times(stride));
            stride *= batch[d] as i64;
        }
        IExpr::Add(terms)
    };
    let mut out = k.clone();
    out.outer.clear();
    let mut gates = Vec::new();
    let mut ids = Vec::with_capacity(k.outer.len());
    let push = |out: &mut KernelIr, op: InstOp, dtype: DType| {
        out.outer.push(Inst { op, dtype });
        out.outer.len() - 1
    };
    for inst in &k.outer {
        if gated(&inst.op) {
            let InstOp::Load { buf, index, valid: Some(v), fill } = inst.op.clone() else {
                unreachable!("gated loads are masked")
            };
            let mut vars = vec![0i64; rank];
            let table: Vec<i32> = (0..rows)
                .map(|r| {
                    let mut rest = r / m;
                    for d in (0..batch_rank).rev() {
                        vars[d] = (rest % batch[d]) as i64;
                        rest /= batch[d];
                    }
                    i32::from(v.0.iter().all(|(e, lo, hi)| (*lo..*hi).contains(&e.eval(&vars))))
                })
                .collect();
            let gate_buf = k.inputs.len() + gates.len();
            gates.push(table);
            out.inputs.insert(gate_buf, BufParam { dtype: DType::I32, len: rows });
            let load = push(&mut out, InstOp::Load { buf, index, valid: None, fill }, inst.dtype);
            let gate = InstOp::Load { buf: gate_buf, index: row_index.clone(), valid: None, fill: Scalar::Int(0) };
            let gate = push(&mut out, gate, DType::I32);
            let zero = push(&mut out, InstOp::Const(Scalar::Int(0)), DType::I32);
            let open = push(&mut out, InstOp::Binary(BinaryOp::Ne, gate, zero), DType::Bool);
            let fill = push(&mut out, InstOp::Const(fill), inst.dtype);
            ids.push(push(&mut out, InstOp::Where(open, load, fill), inst.dtype));
            continue;
        }
        let mut inst = inst.clone();
        inst.map_operands(|a| ids[a]);
        out.outer.push(inst);
        ids.push(out.outer.len() - 1);
    }
    out.result = ids[k.result];
    Some((out, gates))
}

/// Whether `k` has bf16 values (an input, arithmetic in its outer or reduce code, its output): such a kernel is
/// generated at 16 lanes only. The reduce code counts: a row sum's loads live there (`sum_parts`).
fn touches_bf16(k: &KernelIr) -> bool {
    let bf16 = kiln_jit::DType::BF16;
    let mut code = k.outer.iter().chain(k.reduce.iter().flat_map(|r| r.inner.iter()));
    k.output.dtype == bf16 || k.inputs.iter().any(|b| b.dtype == bf16) || code.any(|i| i.dtype == bf16)
}

/// Bytes the column offset (rax) advances per element: 4, or 2 where an operand or the output is bf16 (its 4-byte
/// accesses then scale the offset by 2), so that a kernel without bf16 is the same code as before bf16 existed.
pub(super) fn unit(ep: &Epilogue, out_bf16: bool) -> usize {
    if out_bf16 || ep.operands.iter().any(|o| o.bf16) { 2 } else { 4 }
}

/// The launch's pointers, shared with the pool's threads.
struct Args<'a> {
    ptrs: &'a [*mut u8],
    uniforms: *const u8,
}

// SAFETY: read-only for the duration of one launch; the threads write disjoint rows or columns of the output.
unsafe impl Sync for Args<'_> {}

/// For a reduce kernel this file runs as sums `along` one of its loops ([`Sum`]): its inner code as an elementwise
/// kernel over `[rows, k]` for row sums (the reduce loop as the columns) or `[k, cols]` for column sums (the reduce
/// loop as the rows), and its outer code as a register program of the sum. `None` for any other kernel: another
/// reduction than an f32 sum over one non-empty loop, an output of rank other than 1, outer code with loads or ops
/// the register program lacks. Whether the inner code's loads walk the view's columns contiguously is the view's
/// check (`ElementwiseView`, `epilogue::translate_with`).
fn sum_parts(k: &KernelIr, along: Along) -> Option<(KernelIr, EpProgram)> {
    let k = k.clone().without_unit_loops();
    let r = k.reduce.as_ref().filter(|_| k.rows.is_empty())?;
    if r.op != kiln_jit::ReduceOp::Sum
        || r.dtype != kiln_jit::DType::F32
        || r.extents.len() != 1
        || r.extents[0] == 0
        || k.out_rank() != 1
        || k.output.dtype != kiln_jit::DType::F32
    {
        return None;
    }
    let (out, red) = (k.out_extents[0], r.extents[0]);
    let outer = epilogue::translate_row_outer(&k.outer, k.result)?;
    // The inner code reads the output's loop as variable 0 and the reduce loop as 1: a row sum's view keeps them,
    // column sums' view swaps them.
    let extents = match along {
        Along::Rows => [out, red],
        Along::Cols => [red, out],
    };
    let mut code = r.inner.clone();
    if along == Along::Cols {
        let swap = |e: &IExpr| e.map_vars(&|v| IExpr::Var(1 - v)).simplify(&extents);
        for inst in &mut code {
            inst.map_indices(&swap);
        }
    }
    let inner = KernelIr {
        name: format!("{}_inner", k.name),
        inputs: k.inputs.clone(),
        output: kiln_jit::kernel::BufParam { dtype: kiln_jit::DType::F32, len: out * red },
        out_extents: extents.to_vec(),
        reduce: None,
        rows: Vec::new(),
        row_rank: 2,
        outer: code,
        result: r.value,
        flops_per_elem: 0,
        routine: None,
    };
    Some((inner, outer))
}

/// Where each value lives: values that stand still along a row (per-row loads, uniforms) in registers of their own
/// from the top down (14 with 8 lanes, whose tail mask is in 15; 31 with 16, whose mask is in opmask k1), each
/// unrolled copy's temporaries in its own block from 0 up.
struct Layout {
    hoisted: Vec<Option<u8>>,
    /// Registers per copy.
    temps: usize,
    unroll: usize,
    /// A row sum's accumulators, one per copy, just under the hoisted values.
    accs: Vec<u8>,
}

impl Layout {
    fn plan(p: &EpProgram, n: usize, row_outer: Option<&EpProgram>, isa: Isa) -> Option<Layout> {
        let mut hoisted = vec![None; p.insts.len()];
        let mut next = match isa {
            Isa::Avx2 => MASK_REG,
            Isa::Avx512 => 32,
        };
        for (i, inst) in p.insts.iter().enumerate() {
            if matches!(inst, EpInst::Col { .. } | EpInst::Uniform(_)) {
                next = next.checked_sub(1)?;
                hoisted[i] = Some(next);
            }
            if matches!(inst, EpInst::Acc) {
                return None;
            }
        }
        let temps = p.temps_needed_besides(&|i| hoisted[i].is_some());
        let room = next as usize;
        // A row sum takes one accumulator per copy, and at each row's end the broadcast sum (register 0) and its
        // outer program's temporaries, from the registers below the accumulators.
        let accs_per_copy = usize::from(row_outer.is_some());
        let fits = |u: usize| {
            u * (temps + accs_per_copy) <= room
                && row_outer.is_none_or(|o| room >= u + 2 && o.temps_needed() < room - u)
        };
        // More vectors per iteration than the row has buys nothing; a program that does not fit once stays Cranelift's.
        let unroll = [4, 2, 1].into_iter().find(|&u| fits(u) && (u == 1 || isa.lanes() * u <= n))?;
        let accs = (0..unroll * accs_per_copy).map(|c| (room - 1 - c) as u8).collect();
        Some(Layout { hoisted, temps, unroll, accs })
    }

    fn copy_regs(&self, copy: usize) -> Vec<u8> {
        (copy * self.temps..(copy + 1) * self.temps).map(|r| r as u8).collect()
    }
}

/// Appends the EVEX bytes `f` encodes (the 16-lane form's vector instructions).
pub(super) fn put(ops: &mut Assembler, f: impl FnOnce(&mut Enc)) {
    let mut e = Enc::default();
    f(&mut e);
    ops.extend(e.bytes);
}

/// The 16-lane form's tail and head mask.
pub(super) const KMASK: u8 = 1;

/// Assembles the kernel (see the module doc for its shape) at `isa`'s width: the same loop either way, its vector
/// moves spelled per width (8 lanes: `vmaskmovps` with a lane mask in ymm15; 16: opmask k1 and EVEX moves).
fn emit(
    ep: &Epilogue,
    l: &Layout,
    out_ld: usize,
    row_outer: Option<&EpProgram>,
    isa: Isa,
    out_bf16: bool,
) -> Result<ExecutableBuffer, String> {
    let p = &ep.program;
    let last = p.last_uses();
    let wide = isa == Isa::Avx512;
    let zmm = Zmm { pool: gpr::RBP };
    let vec_isa: &dyn VecIsa = if wide { &zmm } else { &asm::Ymm };
    let lanes = isa.lanes() as i32;
    // The column offset counts `unit` bytes per element; an access of `size`-byte elements scales it by
    // `size / unit`, and copy `c` of an iteration is `size * lanes * c` bytes further.
    let unit = unit(ep, out_bf16) as i32;
    let access = |size: i32, c: usize| ((size / unit) as u8, size * lanes * c as i32);
    let out_size = if out_bf16 { 2 } else { 4 };
    let mut ops = Assembler::new().map_err(|e| e.to_string())?;
    let (row, main, single, tail, row_end, done) = (
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
        ops.new_dynamic_label(),
    );
    save_registers(&mut ops);
    dynasm!(ops ; .arch x64
        ; mov r15, QWORD [rdi + 8]
        ; mov r14, QWORD [rdi + 24]
        ; mov r13, QWORD [rdi + 32]
        ; mov rax, QWORD [rdi + 16]
    );
    hoist_uniforms(&mut ops, p, &l.hoisted, wide);
    load_operand_pointers(&mut ops, ep.operands.len(), gpr::RDI);
    let mut consts = const_pool(&mut ops, wide);
    let unit_shift = unit.trailing_zeros() as i8;
    dynasm!(ops ; .arch x64
        ; mov rdi, QWORD [rdi]
        ; shl rdx, unit_shift
        ; test rsi, rsi
        ; jz =>done
        ; =>row
    );
    // (r12 is free until the column loop.)
    broadcast_row_values(&mut ops, ep, &l.hoisted, wide);
    for &a in &l.accs {
        if wide {
            put(&mut ops, |e| e.zero(a));
        } else {
            dynasm!(ops ; .arch x64 ; vxorps Ry(a), Ry(a), Ry(a));
        }
    }
    let body = ops.new_dynamic_label();
    dynasm!(ops ; .arch x64
        ; xor eax, eax
        ; test r13, r13
        ; jz =>body
    );
    let load_mask = |ops: &mut Assembler, from: u8| {
        if wide {
            put(ops, |e| e.kmov_load(KMASK, mem(from, 0)));
        } else if from == gpr::R14 {
            dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r14]);
        } else {
            dynasm!(ops ; .arch x64 ; vmovups Ry(MASK_REG), [r15]);
        }
    };
    load_mask(&mut ops, gpr::R14);
    let fixed = |i: usize| l.hoisted[i];
    // The program for copies 0..n (their vectors at `access(.., c)`), interleaved (`emit_insts_interleaved`);
    // each copy's result register.
    let program = |ops: &mut Assembler, consts: &mut asm::ConstPool, n: usize, masked: bool| {
        let regs: Vec<Vec<u8>> = (0..n).map(|c| l.copy_regs(c)).collect();
        let frees: Vec<&[u8]> = regs.iter().map(|r| r.as_slice()).collect();
        let mut load = |ops: &mut Assembler, c: usize, inst: &EpInst, d: u8| {
            load_element_vector(ops, ep, isa, inst, d, |size| access(size, c), masked)
        };
        asm::emit_insts_interleaved(vec_isa, ops, p, &last, &frees, &fixed, &mut load, consts)
    };
    // Copy `c`'s result `res` summed into its accumulator or stored.
    let finish = |ops: &mut Assembler, c: usize, res: u8, masked: bool| {
        if let Some(&acc) = l.accs.get(c) {
            // A row sum: the lanes past the row's end hold the program's value of the masked loads' zeros, which
            // may be anything (log(0) = -inf): cleared to +0 before they are added. Not in place when the result
            // is a hoisted register (a value uniform over the launch, summed): that would clear its lanes for every
            // later row. Then into the copy's first temporary, or register 0, which a program without temporaries
            // leaves free (`Layout::plan` keeps registers 0 and 1 under the accumulators).
            let cleared = if masked {
                let dst =
                    if l.hoisted.contains(&Some(res)) { l.copy_regs(c).first().copied().unwrap_or(0) } else { res };
                if wide {
                    put(ops, |e| e.mov_masked_zero(dst, KMASK, res));
                } else {
                    dynasm!(ops ; .arch x64 ; vandps Ry(dst), Ry(res), Ry(MASK_REG));
                }
                dst
            } else {
                res
            };
            vec_isa.bin(ops, asm::VBin::Add, acc, acc, cleared);
        } else {
            let (scale, disp) = access(out_size, c);
            let res = if out_bf16 {
                // The program's result is a bf16 value (`epilogue::translate_with` rounds it): its top half,
                // shifted down in place, or into a temporary where it is a hoisted value later rows read again
                // (every temporary is free once the result is computed; register 0 where the program has none).
                let dst =
                    if l.hoisted.contains(&Some(res)) { l.copy_regs(c).first().copied().unwrap_or(0) } else { res };
                put(ops, |e| e.shift(2, dst, res, 16));
                dst
            } else {
                res
            };
            store_vector(ops, isa, res, Access { scale, disp, bf16: out_bf16 }, masked);
        }
    };
    let mut copies = |ops: &mut Assembler, n: usize, masked: bool| -> Result<(), String> {
        let res = program(ops, &mut consts, n, masked)?;
        for (c, r) in res.into_iter().enumerate() {
            finish(ops, c, r, masked);
        }
        Ok(())
    };
    copies(&mut ops, 1, true)?;
    dynasm!(ops ; .arch x64 ; mov rax, r13 ; =>body);
    let vb = unit * lanes;
    if l.unroll > 1 {
        let span = vb * l.unroll as i32;
        dynasm!(ops ; .arch x64
            ; =>main
            ; lea r12, [rax + span]
            ; cmp r12, rdx
            ; ja =>single
        );
        copies(&mut ops, l.unroll, false)?;
        dynasm!(ops ; .arch x64 ; mov rax, r12 ; jmp =>main);
    }
    dynasm!(ops ; .arch x64
        ; =>single
        ; lea r12, [rax + vb]
        ; cmp r12, rdx
        ; ja =>tail
    );
    copies(&mut ops, 1, false)?;
    dynasm!(ops ; .arch x64
        ; mov rax, r12
        ; jmp =>single
        ; =>tail
        ; cmp rax, rdx
        ; jae =>row_end
    );
    load_mask(&mut ops, gpr::R15);
    copies(&mut ops, 1, true)?;
    dynasm!(ops ; .arch x64 ; =>row_end);
    let out_step = if let Some(outer) = row_outer {
        // Pairwise (a0 + a1) + (a2 + a3), then the lanes (16 folded to 8 first), into lane 0 of register 0,
        // broadcast; then the outer program; lane 0 stored.
        let a = &l.accs;
        if a.len() == 4 {
            vec_isa.bin(&mut ops, asm::VBin::Add, a[0], a[0], a[1]);
            vec_isa.bin(&mut ops, asm::VBin::Add, a[2], a[2], a[3]);
            vec_isa.bin(&mut ops, asm::VBin::Add, a[0], a[0], a[2]);
        } else if a.len() == 2 {
            vec_isa.bin(&mut ops, asm::VBin::Add, a[0], a[0], a[1]);
        }
        if wide {
            put(&mut ops, |e| {
                e.shuffle_quarters(1, a[0], a[0], 0x4e);
                e.op3(super::gemm::evex::VADDPS, 0, a[0], super::gemm::evex::Rm::Reg(1));
            });
        } else {
            let a0 = a[0];
            dynasm!(ops ; .arch x64 ; vmovaps ymm0, Ry(a0));
        }
        dynasm!(ops ; .arch x64
            ; vextractf128 xmm1, ymm0, 1
            ; vaddps xmm0, xmm0, xmm1
            ; vmovhlps xmm1, xmm1, xmm0
            ; vaddps xmm0, xmm0, xmm1
            ; vmovshdup xmm1, xmm0
            ; vaddss xmm0, xmm0, xmm1
        );
        if wide {
            put(&mut ops, |e| e.broadcast_lane0(0, 0));
        } else {
            dynasm!(ops ; .arch x64 ; vbroadcastss ymm0, xmm0);
        }
        let outer_last = outer.last_uses();
        // Below the accumulators, and within xmm0-15, which the VEX store of the result can name.
        let free: Vec<u8> = (1..a[a.len() - 1].min(16)).collect();
        let acc_fixed = |i: usize| matches!(outer.insts[i], EpInst::Acc).then_some(0u8);
        let mut no_load =
            |_: &mut Assembler, _: &EpInst, _: u8| unreachable!("a row sum's outer program loads nothing");
        let res = asm::emit_insts(vec_isa, &mut ops, outer, &outer_last, &free, &acc_fixed, &mut no_load, &mut consts)?;
        dynasm!(ops ; .arch x64 ; vmovss DWORD [rdi], Rx(res));
        4
    } else {
        out_size * out_ld as i32
    };
    dynasm!(ops ; .arch x64 ; add rdi, out_step);
    for (o, operand) in ep.operands.iter().enumerate() {
        let r = OPERAND_REGS[o];
        let size = operand.elem_bytes() as i32;
        let step = match operand.kind {
            OperandKind::Mat { ld } => size * ld as i32,
            OperandKind::Col { stride } => size * stride as i32,
            OperandKind::Row => continue,
        };
        dynasm!(ops ; .arch x64 ; add Rq(r), step);
    }
    dynasm!(ops ; .arch x64 ; dec rsi ; jnz =>row ; =>done);
    restore_registers_and_return(&mut ops);
    consts.emit(&mut ops);
    ops.finalize().map_err(|_| "finalizing an elementwise kernel failed".to_string())
}

/// Where a vector access is relative to its row pointer: `[row + rax*scale + disp]`, and whether its elements are
/// bf16 (16-lane form only).
#[derive(Clone, Copy, Debug)]
pub(super) struct Access {
    pub scale: u8,
    pub disp: i32,
    pub bf16: bool,
}

impl Access {
    /// 32-bit elements, the column offset in bytes.
    pub(super) fn f32(disp: i32) -> Access {
        Access { scale: 1, disp, bf16: false }
    }
}

/// `d` = the vector at `a` from `base`, lanes past the mask zero when `masked` (ymm15 at 8 lanes, k1 at 16); bf16
/// elements are widened to their exact f32 values (zero-extended into the top half of each lane).
pub(super) fn load_vector(ops: &mut Assembler, isa: Isa, d: u8, base: u8, a: Access, masked: bool) {
    let disp = a.disp;
    if isa == Isa::Avx512 {
        let (m, k) = (mem_indexed(base, gpr::RAX, a.scale, disp), if masked { KMASK } else { 0 });
        put(ops, |e| {
            if a.bf16 {
                e.load_words_zx(d, m, k);
                e.shift(6, d, d, 16);
            } else {
                e.load(d, m, k);
            }
        });
    } else if masked {
        debug_assert!(a.scale == 1 && !a.bf16, "8 lanes: f32, the column offset in bytes");
        dynasm!(ops ; .arch x64 ; vmaskmovps Ry(d), Ry(MASK_REG), [Rq(base) + rax + disp]);
    } else {
        dynasm!(ops ; .arch x64 ; vmovups Ry(d), [Rq(base) + rax + disp]);
    }
}

/// Stores `x` at `a` from rdi (the output), only the mask's lanes when `masked`; bf16 elements are the low words of
/// `x`'s lanes.
pub(super) fn store_vector(ops: &mut Assembler, isa: Isa, x: u8, a: Access, masked: bool) {
    let disp = a.disp;
    if isa == Isa::Avx512 {
        let (m, k) = (mem_indexed(gpr::RDI, gpr::RAX, a.scale, disp), if masked { KMASK } else { 0 });
        put(ops, |e| if a.bf16 { e.store_low_words(m, x, k) } else { e.store(m, x, k) });
    } else if masked {
        debug_assert!(a.scale == 1 && !a.bf16, "8 lanes: f32, the column offset in bytes");
        dynasm!(ops ; .arch x64 ; vmaskmovps [rdi + rax + disp], Ry(MASK_REG), Ry(x));
    } else {
        dynasm!(ops ; .arch x64 ; vmovups [rdi + rax + disp], Ry(x));
    }
}

/// Loads the launch-uniform values of `p` into their hoisted registers, from the splatted slots rax points at (the
/// table's uniforms entry): 8 lanes load a slot, 16 broadcast its first lane.
pub(super) fn hoist_uniforms(ops: &mut Assembler, p: &EpProgram, hoisted: &[Option<u8>], wide: bool) {
    for (i, inst) in p.insts.iter().enumerate() {
        if let (EpInst::Uniform(slot), Some(h)) = (inst, hoisted[i]) {
            let off = 32 * *slot as i32;
            if wide {
                put(ops, |e| e.broadcast(h, mem(gpr::RAX, off)));
            } else {
                dynasm!(ops ; .arch x64 ; vmovups Ry(h), [rax + off]);
            }
        }
    }
}

/// Points each of `n` operands' registers ([`OPERAND_REGS`]) at its pointer in the table that GPR `table` holds.
pub(super) fn load_operand_pointers(ops: &mut Assembler, n: usize, table: u8) {
    for (o, &r) in OPERAND_REGS.iter().enumerate().take(n) {
        let off = 8 * (TABLE_OPERANDS + o) as i32;
        dynasm!(ops ; .arch x64 ; mov Rq(r), QWORD [Rq(table) + off]);
    }
}

/// The code's constant pool; at 16 lanes its base goes into rbp, which nothing else in these loops uses.
pub(super) fn const_pool(ops: &mut Assembler, wide: bool) -> asm::ConstPool {
    let mut consts = asm::ConstPool::default();
    if wide {
        let base = consts.base(ops);
        dynasm!(ops ; .arch x64 ; lea rbp, [=>base]);
    }
    consts
}

/// Broadcasts each per-row value (a load that stands still along a row) into its hoisted register, read at its
/// operand's current row pointer; a bf16 one as the top half of a dword through r12.
pub(super) fn broadcast_row_values(ops: &mut Assembler, ep: &Epilogue, hoisted: &[Option<u8>], wide: bool) {
    for (i, inst) in ep.program.insts.iter().enumerate() {
        if let (EpInst::Col { op, .. }, Some(h)) = (inst, hoisted[i]) {
            let r = OPERAND_REGS[*op];
            if ep.operands[*op].bf16 {
                dynasm!(ops ; .arch x64 ; movzx r12d, WORD [Rq(r)] ; shl r12d, 16);
                put(ops, |e| e.broadcast_gpr(h, gpr::R12));
            } else if wide {
                put(ops, |e| e.broadcast(h, mem(r, 0)));
            } else {
                dynasm!(ops ; .arch x64 ; vpbroadcastd Ry(h), DWORD [Rq(r)]);
            }
        }
    }
}

/// The load of a per-element or per-column value `inst` (`Mat`, `Row`) into `d`, at the column offset (rax) from
/// its operand's row pointer: `at(element bytes)` gives the access's scale and displacement.
pub(super) fn load_element_vector(
    ops: &mut Assembler,
    ep: &Epilogue,
    isa: Isa,
    inst: &EpInst,
    d: u8,
    at: impl Fn(i32) -> (u8, i32),
    masked: bool,
) {
    let (EpInst::Mat { op, .. } | EpInst::Row { op, .. }) = *inst else {
        unreachable!("per-row values and uniforms are hoisted")
    };
    let bf16 = ep.operands[op].bf16;
    let (scale, disp) = at(if bf16 { 2 } else { 4 });
    load_vector(ops, isa, d, OPERAND_REGS[op], Access { scale, disp, bf16 }, masked);
}

/// Pushes the callee-saved registers the generated loops use (rbp, rbx, r12-r15).
pub(super) fn save_registers(ops: &mut Assembler) {
    dynasm!(ops ; .arch x64 ; push rbp ; push rbx ; push r12 ; push r13 ; push r14 ; push r15);
}

/// Clears the upper vector halves, pops what [`save_registers`] pushed, and returns.
pub(super) fn restore_registers_and_return(ops: &mut Assembler) {
    dynasm!(ops ; .arch x64 ; vzeroupper ; pop r15 ; pop r14 ; pop r13 ; pop r12 ; pop rbx ; pop rbp ; ret);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_jit::graph::{Graph, NodeData};
    use kiln_jit::op::{BinaryOp, Op, UnaryOp};
    use kiln_jit::{DType, Shape};

    /// Kernels of one IR share their generated code: a plan whose two kernels compute the same ops on two inputs
    /// of one shape (as a model's layers do) generates one kernel and runs it for both.
    #[test]
    fn kernels_of_one_ir_share_their_code() {
        if !enabled() {
            eprintln!("note: kernels_of_one_ir_share_their_code skipped: no AVX2 + FMA (or KILN_ELEMENTWISE=clif)");
            return;
        }
        let node = |op: Op| NodeData { op, shape: Shape::new(vec![37, 53]), dtype: DType::F32 };
        let mut g = Graph::new();
        for slot in 0..2 {
            let x = g.add(node(Op::Input { slot }), &[]);
            // A constant no other test uses, so this process has not generated the kernel before.
            let c = g.add(node(Op::Const(kiln_jit::dtype::Scalar::Float(1.234_567))), &[]);
            let m = g.add(node(Op::Binary(BinaryOp::Mul)), &[x, c]);
            let out = g.add(node(Op::Unary(UnaryOp::Sqrt)), &[m]);
            g.outputs.push(out);
        }
        let plan = kiln_jit::kernel::schedule(&g);
        let [a, b] = &plan.launches[..] else { panic!("{} launches", plan.launches.len()) };
        assert_eq!(a.kernel.to_text(), b.kernel.to_text());
        let first = for_plan(&a.kernel, None).unwrap().expect("a wide kernel");
        let second = for_plan(&b.kernel, None).unwrap().expect("a wide kernel");
        assert!(Arc::ptr_eq(&first, &second), "the second kernel was generated again");
    }
}
