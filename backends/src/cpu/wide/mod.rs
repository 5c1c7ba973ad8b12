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
//! per element or per column, loads that stand still along a row, values uniform over the launch). A kernel whose
//! masks each test one outer loop (a concatenation, a sum of padded pieces) is cut into regions where every mask
//! has one value (`kiln_jit::kernel::regions`), one kernel generated per distinct region code, with no masks and
//! only the loads live there; the launch runs each piece of rows with its region's (`build_regions`,
//! `run_regions`). Any other masked load stays a Cranelift kernel. It *is* an epilogue
//! without an accumulator, so it is translated by the same code and its arithmetic emitted by the same emitter
//! (`program_asm::emit_insts`); only the loop around it is this file's. bf16 runs too, at 16 lanes only: loads
//! widen 2-byte elements to their exact f32 values (`vpmovzxwd`, shift), each bf16 result of arithmetic is rounded in the program
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
//! `cols.rs`.
//!
//! Code: `extern "sysv64" fn(table, rows, cols)`, `table` = `[out, tail mask, uniforms, head mask, head bytes,
//! operand 0, ..]`, every pointer at the first element of the chunk. Uniforms are loaded into registers once per
//! call. Per row: values that stand still along it (per-row loads) are broadcast into registers once; a masked head
//! (`vmaskmovps`, or opmask k1 at 16 lanes) runs up to the output's first vector-size boundary (32 or 64 bytes)
//! when every row starts at the same alignment (host buffers start on a 64-byte boundary, `kiln_jit::HostVec`, but
//! a view may start inside one; a store that straddles two cache lines costs about two); then
//! `unroll` vectors per iteration (their programs interleaved instruction by instruction,
//! `program_asm::emit_insts_interleaved`, so a transcendental's long dependent chain does not fill the schedulers
//! alone), single vectors, and a masked tail, so nothing is read or written past a row; then every pointer steps one row.
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
//! (on the Zen 4, interleaved `bench_table` runs: softmax over 4096 x 1024 1.8 -> 1.4 ms, GELU 2.4-3.3 -> 1.7-1.8).
//!
//! The column offset (rax) counts 4 bytes per element, or 2 in a kernel with a bf16 operand or output (its f32
//! accesses scale it by 2). Both widths run the same loop and register program (`program_asm::VecIsa`); the 16-lane
//! one's vector moves are EVEX (`gemm::evex`), its constants read through rbp. Elementwise results are bit-identical at
//! both widths; a row sum's lanes are added in another order (within the row-sum tolerance).
//!
//! Each element is loaded before it is stored, so a donated input may be the output (a weight updated in place).
//! Kernels are cached in memory by IR text (`GENERATED`: a model's layers repeat them). Deliberately not done:
//! caching the code on disk (generating and mapping one costs about what mapping a cached copy does); hoisting
//! arithmetic on per-row values out of the column loop (the batch-1 update multiplies the per-row gradient by the
//! row's inputs first, so nothing there would hoist); unrolling past 4 vectors (8 measured no faster on the update).
//!
//! This file chooses and runs the kernels; `rewrite.rs` brings a kernel's IR into the loop's shape, `emit.rs`
//! assembles the loop (its loads, stores and prologue shared with the others), `cols.rs` and `rows.rs` are the
//! column-sum and row-kernel loops.

use crate::cpu::gemm::asm;
use crate::cpu::gemm::epilogue::{self, Epilogue, OperandKind, Uniforms};
use crate::cpu::gemm::program::{EpInst, EpProgram};
use crate::cpu::isa::{self, Isa};
use crate::cpu::pool;
use dynasmrt::ExecutableBuffer;
use kiln_jit::kernel::gemm::ElementwiseView;
use kiln_jit::kernel::{Inst, KernelIr, regions};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, LazyLock};

mod cols;
mod emit;
mod rewrite;
pub(super) mod rows;

use cols::ColLayout;
use emit::{Layout, emit, unit};
use rewrite::{row_major_strides, sum_parts, touches_bf16, with_longest_rows};

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
    /// A kernel cut into regions: the other variants and which box runs which (this kernel's own code is
    /// variant 0).
    regions: Option<Box<RegionTable>>,
    /// Column sums split over rows (`col_parts`): the sums of every part but the first, `n` each.
    partials: parking_lot::Mutex<Vec<f32>>,
    code: ExecutableBuffer,
    f: WideFn,
}

/// Most boxes, distinct variants and batch elements of a kernel cut into regions (`WideKernel::build_regions`): each
/// variant is code generated and mapped (~75 µs each when a plan is compiled: a stack of 64 pieces, a recurrent
/// layer's 64 steps' gradients, costs ~5 ms once), and each batch element has an entry in the box table. Past them
/// the kernel runs whole, its masks on Cranelift's 4-lane code.
const MAX_REGION_BOXES: usize = 4096;
const MAX_REGION_VARIANTS: usize = 64;
const MAX_REGION_BATCH: usize = 1 << 16;

/// How a kernel cut into regions runs its boxes: per batch element, the index of its box over the batch loops'
/// intervals, to which the row interval's index is added; per box, its variant.
struct RegionTable {
    batch_box: Vec<u32>,
    /// Where the row loop's intervals start (`0` first).
    row_cuts: Vec<usize>,
    variant_of: Vec<u8>,
    /// Variants `1..`.
    others: Vec<WideKernel>,
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
    /// `[k, cols]` (the reduce loop as its rows), each column's rows added in order (`cols.rs`).
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
        if !reduces && let Some(w) = Self::build_regions(&merged, isa)? {
            return Ok(Some(w));
        }
        // The output's strides per batch dim and per row: row-major, unless the row loop is another one.
        let (merged, out_strides) = match (!reduces).then(|| with_longest_rows(&merged)).flatten() {
            Some((permuted, strides)) => (permuted, Some(strides)),
            None => (merged, None),
        };
        Self::generate(&merged, sum, out_strides, isa)
    }

    /// The elementwise kernel `merged` cut into regions ([`regions::regions`]: boxes of its outer loops where every
    /// mask has one value), one generated kernel per distinct box code, where it has such masks and every variant
    /// generates; `Ok(None)` otherwise. Its rows are the longest loop's, masks or not ([`with_longest_rows`]): the
    /// launch splits each batch element's rows where the row loop's intervals end.
    fn build_regions(merged: &KernelIr, isa: Isa) -> Result<Option<WideKernel>, String> {
        let (k, out_strides) = match with_longest_rows(merged) {
            Some((permuted, strides)) => (permuted, Some(strides)),
            None => (merged.clone(), None),
        };
        let Some(r) = regions::regions(&k, MAX_REGION_BOXES) else { return Ok(None) };
        let rank = k.out_rank();
        let batch: usize = k.out_extents[..rank - 2].iter().product();
        if r.variants.len() > MAX_REGION_VARIANTS || batch > MAX_REGION_BATCH {
            return Ok(None);
        }
        let mut variants = Vec::with_capacity(r.variants.len());
        for v in &r.variants {
            match Self::generate(v, None, out_strides.clone(), isa)? {
                Some(w) => variants.push(w),
                None => return Ok(None),
            }
        }
        // Box index = Σ interval(v) * radix(v), row-major over the variables' intervals (the last loop has one).
        let mut radix = vec![1usize; rank];
        for v in (0..rank - 1).rev() {
            radix[v] = radix[v + 1] * r.cuts[v + 1].len();
        }
        let batch_box: Vec<u32> = (0..batch)
            .map(|b| {
                let mut rest = b;
                let mut at = 0;
                for v in (0..rank - 2).rev() {
                    at += r.interval(v, rest % k.out_extents[v]) * radix[v];
                    rest /= k.out_extents[v];
                }
                at as u32
            })
            .collect();
        let mut host = variants.remove(0);
        host.work = k.work();
        host.regions = Some(Box::new(RegionTable {
            batch_box,
            row_cuts: r.cuts[rank - 2].clone(),
            variant_of: r.variant_of.iter().map(|&v| v as u8).collect(),
            others: variants,
        }));
        Ok(Some(host))
    }

    /// Generates the elementwise form `k` (a sum's inner code where `sum` is given) with its output strides (row-major
    /// where `None`).
    fn generate(
        k: &KernelIr,
        sum: Option<Sum>,
        out_strides: Option<(Vec<usize>, usize)>,
        isa: Isa,
    ) -> Result<Option<WideKernel>, String> {
        let row_outer = sum.as_ref().filter(|s| s.along == Along::Rows).map(|s| &s.outer);
        let col_outer = sum.as_ref().filter(|s| s.along == Along::Cols).map(|s| &s.outer);
        let Some(view) = ElementwiseView::of(k) else { return Ok(None) };
        let (out_batch, out_ld) = out_strides.unwrap_or_else(|| {
            let dims: Vec<usize> = view.batch.iter().copied().chain([view.m, view.n]).collect();
            let strides = row_major_strides(&dims);
            (strides[..view.batch.len()].to_vec(), view.n)
        });
        let allow = epilogue::Allow {
            bf16: true,
            bf16_loads: true,
            positions: false,
            scalef: isa == Isa::Avx512,
            register_buf: None,
        };
        let Some(ep) = epilogue::translate_with(k, &view.roles, allow) else { return Ok(None) };
        let out_bf16 = k.output.dtype == kiln_jit::DType::BF16;
        // Row steps are instruction immediates.
        let steps_fit = i32::try_from(4 * out_ld).is_ok()
            && ep.operands.iter().all(|o| match o.kind {
                OperandKind::Mat { ld } => i32::try_from(4 * ld).is_ok(),
                OperandKind::Col { stride } => i32::try_from(4 * stride).is_ok(),
                OperandKind::Row => true,
            });
        if !steps_fit || col_outer.is_some() && !cols::panel_steps_fit(&ep) {
            return Ok(None);
        }
        let (code, unroll) = if let Some(outer) = col_outer {
            let Some(layout) = ColLayout::plan(&ep.program, outer, view.n, isa) else { return Ok(None) };
            (cols::emit(&ep, &layout, outer, isa, unit(&ep, out_bf16))?, layout.widest())
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
            regions: None,
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
        if let Some(t) = &self.regions {
            let _ = writeln!(
                s,
                "cut into regions: row intervals from {:?}, {} boxes, {} variants (above: variant 0; the .bin holds \
                 variant 0's code); variant per box {:?}",
                t.row_cuts,
                t.variant_of.len(),
                t.others.len() + 1,
                t.variant_of
            );
            for (i, v) in t.others.iter().enumerate() {
                let _ = write!(s, "variant {}: {}", i + 1, v.listing());
            }
        }
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
        if let Some(t) = &self.regions {
            // SAFETY: the caller's pointer contract.
            unsafe { self.run_regions(t, ptrs) };
            return;
        }
        // SAFETY: the caller's pointer contract.
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

    /// Runs a kernel cut into regions: rows of all batch elements in one range over the threads, as an elementwise
    /// launch, each chunk cut where a batch element or a row interval ends, and each piece run by its box's variant.
    ///
    /// # Safety
    /// As [`WideKernel::run`].
    unsafe fn run_regions(&self, t: &RegionTable, ptrs: &[*mut u8]) {
        let variants: smallvec::SmallVec<[&WideKernel; 8]> = std::iter::once(self).chain(&t.others).collect();
        // SAFETY: the caller's pointer contract (the variants read the kernel's own inputs).
        let uniforms: smallvec::SmallVec<[Uniforms; 4]> =
            variants.iter().map(|v| unsafe { Uniforms::for_launch(Some(&v.ep), &v.outer, ptrs) }).collect();
        let args: smallvec::SmallVec<[Args; 8]> =
            uniforms.iter().map(|u| Args { ptrs, uniforms: u.as_ptr() }).collect();
        let f = |s: usize, e: usize| {
            let mut r = s;
            while r < e {
                let (b, r0) = (r / self.m, r % self.m);
                let interval = t.row_cuts.partition_point(|&c| c <= r0) - 1;
                let ends = t.row_cuts.get(interval + 1).copied().unwrap_or(self.m);
                let end = e.min(b * self.m + ends);
                let v = usize::from(t.variant_of[t.batch_box[b] as usize + interval]);
                // SAFETY: the caller's pointer contract; rows `r0..r0 + end - r` of batch element `b` exist and
                // lie in one box, where variant `v` computes what the kernel does.
                unsafe { variants[v].call(&args[v], b, r0, end - r, 0, self.n) };
                r = end;
            }
        };
        pool::global().parallel_for_work(self.batch.iter().product::<usize>() * self.m, self.work, &f);
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

/// The launch's pointers, shared with the pool's threads.
struct Args<'a> {
    ptrs: &'a [*mut u8],
    uniforms: *const u8,
}

// SAFETY: read-only for the duration of one launch; the threads write disjoint rows or columns of the output.
unsafe impl Sync for Args<'_> {}

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
