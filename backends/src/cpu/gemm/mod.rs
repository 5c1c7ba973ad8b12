//! The CPU GEMM: a kernel the scheduler produced as `G_...` (a reduce kernel that [`GemmView`] recognizes) runs as a
//! blocked GEMM around generated micro-kernels (`asm` for AVX2, `asm512` for AVX-512F), in the configuration the tuner
//! picked (`config`, `tune`), with its epilogue in registers (`epilogue`) or, when that cannot express it, as a
//! compiled pass over C.
//!
//! This file builds a `CompiledGemm`; `drive.rs` runs the f32 kernels and `bf16_drive.rs` the bf16 ones.
//!
//! Loop nest per thread (BLIS order): columns by NC, K by KC (pack a KC x NC block of B into NR-wide panels), rows by
//! MC (pack an MC x KC block of A into MR-tall panels), then NR x MR tiles, each one micro-kernel call. The first K
//! block stores C, later ones add to it, the last applies the epilogue: all in the micro-kernel. Skinny problems
//! (M <= 16) read A and B in place, which saves a full copy of the weights per call; a ragged last column panel is
//! still copied (zero-padded), so no kernel reads past a buffer.
//!
//! Threads take disjoint rectangles of C (column or row strips, per batch element), each with its own pack buffers,
//! so results do not depend on timing; or, for a weight gradient summed over a step's tokens, shares of K
//! (`config::Split::Depth`, `run_depth`: each thread over all of C into a partial of its own, the partials then added
//! in thread order, and an epilogue beyond the sum, such as an optimizer's update, applied after them as a pass).
//! Deliberately not done: packing shared between threads.
//!
//! Three more candidates race the generated kernels: the `gemm` crate (`tune::library_gemm`), for a few rows against
//! a weight stored N x K dot products (`dot`), and for a few rows against one stored K x N a split-K GEMV
//! (`splitk`); all leave their epilogue to the pass.
//!
//! A GEMM of bf16 operands (`GemmView::operands`) has its own family: AMX tile and AVX512-BF16 kernels (`bf16`),
//! driven by `bf16_drive`'s `run_bf16_item` (A packed once per thread, B packed per block of columns, every row
//! block of the thread's rectangle over it, the sums in registers over the whole K, so each element of C is stored
//! once, after its epilogue) or, for a few rows, `run_bf16_depth` (the threads split K).

pub mod asm;
pub(crate) mod asm512;
pub mod bf16;
mod bf16_drive;
mod bf16_pack;
pub use bf16_drive::{set_bf16_a_limit, set_bf16_k_outer_l2, set_bf16_shared_a_min};
pub mod config;
pub mod cost;
mod dot;
mod drive;
pub mod epilogue;
pub(crate) mod evex;
mod pack;
mod patch;
pub mod program;
pub(crate) mod program_asm;
mod program_math;
pub(crate) mod select;
mod splitk;
mod transposed;
pub mod tune;

use super::pool;
use asm::{KernelSet, MicroFn, MicroSpec, Mode};
use config::{Bf16Config, Bf16Unit, GemmConfig, GemmImpl, Split};
use epilogue::Epilogue;
use kiln_jit::DType;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::kernel::{Inst, KernelIr};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The epilogue pass of a GEMM whose epilogue is not in the micro-kernels' registers (a candidate that applies none,
/// or an epilogue they cannot express): an elementwise kernel over C, reading C as its last input (see
/// `kiln_jit::kernel::gemm::epilogue_pass`); 8-lane generated code where it qualifies (`cpu::wide`), else a
/// Cranelift kernel.
#[derive(Clone)]
pub(crate) enum Pass {
    Clif(super::compiler::KernelFn),
    Wide(std::sync::Arc<super::wide::WideKernel>),
}

fn mode_index(m: Mode) -> usize {
    match m {
        Mode::First => 0,
        Mode::Middle => 1,
        Mode::Last => 2,
        Mode::Single => 3,
    }
}

/// The work the pool is told a GEMV-like launch (the dot products, split K) does, for its decision to split it over
/// threads: its weight's element count times the larger of its rows and [`WEIGHT_PASS_OPS`], not its multiply-adds.
/// Why: the weight a training step's batch-1 GEMVs read is rewritten by the optimizer's elementwise update, and
/// every kernel touching the weight must make the same choice, or the half that one kernel reads on the other core
/// moves between the cores' caches each step (docs/benchmarks.md, "Thread pool": a 784-256-100-10 MLP's batch-1
/// step was 28 % slower so).
pub(super) fn weight_pass_work(m: usize, n: usize, k: usize) -> usize {
    n.saturating_mul(k).saturating_mul(m.max(WEIGHT_PASS_OPS))
}

/// What `KernelIr::work` counts per element for SGD's update `w - lr * outer(dy, x)`: one plus its seven outer
/// instructions (three loads, the learning rate, two products, the difference). An update with more instructions
/// (momentum, AdamW) splits at smaller weights than its GEMVs; under ~4K elements, where that costs little.
pub(super) const WEIGHT_PASS_OPS: usize = 8;

/// A GEMM launch ready to run.
pub struct CompiledGemm {
    pub view: GemmView,
    pub imp: GemmImpl,
    set: Option<KernelSet>,
    /// Micro-kernels by `(rows - 1) * 8 + tail * 4 + mode`.
    table: Vec<Option<MicroFn>>,
    /// The in-register epilogue, or `None` when `pass` applies it.
    epilogue: Option<Epilogue>,
    /// The outer code (for the host-evaluated uniform values).
    outer: Vec<Inst>,
    input_dtypes: Vec<DType>,
    /// Columns in the ragged last vector of a row (0: none; `isa::lane_mask` is its mask).
    ragged: usize,
    /// Output rectangles per batch element (column or row strips), or shares of K (`Split::Depth`).
    parts: usize,
    /// The transposed candidate's GEMM (`C^T` into scratch, identity epilogue).
    transposed: Option<Box<CompiledGemm>>,
    /// A K split's f32 partial sums (allocated when built): the AMX GEMM's one padded M x N block per thread, the
    /// generated kernels' one M x N block per thread but the first (which sums into C).
    partials: parking_lot::Mutex<Vec<f32>>,
    /// A patched B's offsets (`view.b.patch` evaluated).
    b_tables: Option<patch::PatchTables>,
    /// Set by the backend when the epilogue is not in registers.
    pub(crate) pass: Option<Pass>,
    pub uses_pass: bool,
}

// SAFETY: the micro-kernel pointers point into `set`'s immutable executable mapping, owned here; the pass function
// is immutable code owned by the process-wide JIT module.
unsafe impl Send for CompiledGemm {}
// SAFETY: as for Send; running only reads `self`.
unsafe impl Sync for CompiledGemm {}

impl CompiledGemm {
    /// Generates the micro-kernels of `imp` for the GEMM `k` (recognized as `view`).
    /// `cache`: where generated code is looked up and stored (`None` while tuning: candidates are not kept).
    pub fn build(
        k: &KernelIr,
        view: GemmView,
        imp: GemmImpl,
        threads: usize,
        cache: Option<&kiln_autotune::Store>,
    ) -> Result<CompiledGemm, String> {
        let epilogue = epilogue::translate(k, &view.roles);
        let input_dtypes: Vec<DType> = k.inputs.iter().map(|b| b.dtype).collect();
        let mut g = CompiledGemm::unbuilt(view, imp, k.outer.clone(), input_dtypes);
        if !imp.legal_for(&g.view) {
            return Err(format!("{} is not legal for this GEMM", imp.name()));
        }
        if let Some(p) = &g.view.b.patch {
            g.b_tables = Some(patch::PatchTables::new(p, g.view.k, g.view.n));
        }
        let c = match imp {
            GemmImpl::Bf16(a) => {
                g.generate_bf16(k, a, threads, cache)?;
                return Ok(g);
            }
            GemmImpl::Asm(c) => c,
            GemmImpl::Transposed(c) => {
                let view = g.view.transposed();
                let mut inner = CompiledGemm::unbuilt(view, GemmImpl::Asm(c), Vec::new(), g.input_dtypes.clone());
                inner.generate(c, &program::EpProgram::identity(), threads, cache)?;
                g.transposed = Some(Box::new(inner));
                g.uses_pass = !is_identity(k);
                return Ok(g);
            }
            GemmImpl::Library | GemmImpl::Dot | GemmImpl::SplitK => {
                g.uses_pass = !is_identity(k);
                return Ok(g);
            }
        };
        let program = if c.split == Split::Depth {
            // C holds thread 0's partial sums until the last pass has added the others' (`run_depth`): an epilogue
            // beyond the accumulator runs after that, as a pass over the sums.
            g.uses_pass = !is_identity(k);
            program::EpProgram::identity()
        } else {
            g.epilogue_program(k, &epilogue)
        };
        match g.generate(c, &program, threads, cache) {
            Ok(()) => {}
            Err(_) if g.epilogue.is_some() => {
                // The program did not fit the registers this tile leaves: apply it as a pass instead.
                g.epilogue = None;
                g.uses_pass = !is_identity(k);
                g.generate(c, &program::EpProgram::identity(), threads, cache)?;
            }
            Err(e) => return Err(e),
        }
        Ok(g)
    }

    /// `imp` on `view`, with no code generated yet and no epilogue chosen.
    fn unbuilt(view: GemmView, imp: GemmImpl, outer: Vec<Inst>, input_dtypes: Vec<DType>) -> CompiledGemm {
        CompiledGemm {
            view,
            imp,
            set: None,
            table: Vec::new(),
            epilogue: None,
            outer,
            input_dtypes,
            ragged: 0,
            parts: 1,
            transposed: None,
            partials: parking_lot::Mutex::new(Vec::new()),
            b_tables: None,
            pass: None,
            uses_pass: false,
        }
    }

    /// Generates (or maps from `cache`) the micro-kernels of generated config `c` for `self.view`, with `program`
    /// as the epilogue of their last K block.
    fn generate(
        &mut self,
        c: GemmConfig,
        program: &program::EpProgram,
        threads: usize,
        cache: Option<&kiln_autotune::Store>,
    ) -> Result<(), String> {
        let g = self;
        let v = &g.view;
        let lanes = c.isa.lanes();
        let tail_cols = v.n % c.nr();
        let ragged = tail_cols % lanes;
        g.ragged = ragged;
        g.parts = config::parts_per_batch_element(v, &c, threads);
        let mut specs = Vec::new();
        let mut slots = Vec::new();
        let row_counts: Vec<usize> = [c.mr, v.m % c.mr].into_iter().filter(|&r| r > 0 && r <= v.m).collect();
        // A K split's threads each sum a share of K (of two lengths at most), each share in its own K blocks.
        let shares = if c.split == Split::Depth { [v.k / g.parts, v.k.div_ceil(g.parts)] } else { [v.k, v.k] };
        let mut modes = Vec::new();
        if shares[0] <= c.kc {
            modes.push(Mode::Single);
        }
        if shares[1] > c.kc {
            modes.extend([Mode::First, Mode::Middle, Mode::Last]);
        }
        if c.split == Split::Depth {
            *g.partials.get_mut() = vec![0.0; (g.parts - 1) * v.m * v.n];
        }
        for &rows in &row_counts {
            for tail in [false, true] {
                if tail && tail_cols == 0 {
                    continue;
                }
                if !tail && v.n < c.nr() {
                    continue;
                }
                let nv = if tail { tail_cols.div_ceil(lanes) } else { c.nv };
                let packed_b = c.pack_b || tail;
                for &mode in &modes {
                    specs.push(MicroSpec {
                        isa: c.isa,
                        mr: rows,
                        nv,
                        a_ks: if c.pack_a { (c.mr * 4) as i32 } else { (v.a.cols * 4) as i32 },
                        a_rs: if c.pack_a { 4 } else { (v.a.rows * 4) as i32 },
                        b_ks: if packed_b { (c.nr() * 4) as i32 } else { (v.b.rows * 4) as i32 },
                        ldc: (v.n * 4) as i32,
                        mode,
                        masked: tail && ragged != 0,
                        unroll: c.unroll,
                        prefetch: if packed_b { 0 } else { c.prefetch as i32 },
                    });
                    slots.push((rows - 1) * 8 + tail as usize * 4 + mode_index(mode));
                }
            }
        }
        let set = kernel_set(&specs, program, cache)?;
        g.table = vec![None; c.mr * 8];
        for (&slot, &f) in slots.iter().zip(&set.fns) {
            g.table[slot] = Some(f);
        }
        g.set = Some(set);
        Ok(())
    }

    /// Generates (or maps from `cache`) the bf16 kernels of `a` for `self.view` (bf16 operands), the epilogue of `k`
    /// in their registers; where it cannot be, an f32 C takes it as a pass and a bf16 C is refused.
    fn generate_bf16(
        &mut self,
        k: &KernelIr,
        a: Bf16Config,
        threads: usize,
        cache: Option<&kiln_autotune::Store>,
    ) -> Result<(), String> {
        if a.split == Split::Depth {
            return self.generate_bf16_partial(a, threads, cache);
        }
        let v = &self.view;
        let out_bf16 = v.out == DType::BF16;
        // bf16 values in the outer code are rounded in the program, so a bf16 C's last value is a bf16 value, which
        // the store narrows exactly. bf16 operands (a bias) are widened by their loads.
        let allow = epilogue::Allow {
            bf16: true,
            bf16_loads: super::isa::has_avx512bw(),
            positions: false,
            scalef: false,
            register_buf: None,
        };
        let ep = epilogue::translate_with(k, &v.roles, allow)
            // A program needing more registers than the block leaves (exp beside 28 accumulators) runs as a pass.
            .filter(|e| e.program.temps_needed() <= bf16::epilogue_registers(a.unit, a.mr, a.nt));
        let program = match &ep {
            Some(e) => e.program.clone(),
            None if !out_bf16 => {
                self.uses_pass = !is_identity(k);
                program::EpProgram::identity()
            }
            None => return Err("this epilogue cannot run in registers, and a bf16 output has no pass".into()),
        };
        self.epilogue = ep;
        let ldc = (v.n * if out_bf16 { 2 } else { 4 }) as i32;
        let (mr, nr) = (a.mr, a.nr());
        let tail_cols = v.n % nr;
        self.ragged = tail_cols % bf16::TILE;
        let units = if a.split == Split::Rows { v.m.div_ceil(mr) } else { v.n.div_ceil(nr) };
        self.parts = threads.clamp(1, units.max(1));
        // Long K on AMX: the K-blocked drive (`bf16::emit_blocked`), whose last step is the epilogue over the sums.
        let blocked = a.unit == Bf16Unit::Amx && v.k.div_ceil(bf16::KSTEP) > bf16::K_BLOCK_STEPS;
        let mut specs = Vec::new();
        let mut slots = Vec::new();
        for (ri, rows) in [(0, mr), (1, v.m % mr)] {
            if rows == 0 || rows > v.m || ri == 0 && v.m < mr {
                continue;
            }
            for tail in [false, true] {
                if tail && tail_cols == 0 || !tail && v.n < nr {
                    continue;
                }
                let nv = if tail { tail_cols.div_ceil(bf16::TILE) } else { a.nt };
                let masked = tail && self.ragged != 0;
                let (unit, mr, nt, from_sums) = (a.unit, a.mr, a.nt, blocked);
                specs.push(bf16::Bf16Spec { unit, mr, nt, rows, nv, masked, ldc, out_bf16, from_sums });
                slots.push(ri * 2 + tail as usize);
            }
        }
        let mt = a.mr / bf16::TILE;
        let extra: Vec<bf16::BlockedSpec> = if blocked {
            [true, false].map(|first| bf16::BlockedSpec { mt, nt: a.nt, first }).to_vec()
        } else {
            Vec::new()
        };
        let key = format!("bf16|{specs:?}|{extra:?}|{program:?}|r{}", asm::REVISION);
        let (ns, nb) = (specs.len(), extra.len());
        let count = ns + if blocked { nb + 2 } else { 0 };
        let set = kernel_set_with(key, count, cache, || {
            KernelSet::assemble(count, |ops, i| match i {
                i if i < ns => bf16::emit(ops, &specs[i], &program),
                i if i < ns + nb => bf16::emit_blocked(ops, &extra[i - ns]),
                i if i == ns + nb => bf16::emit_tile_config(ops),
                _ => bf16::emit_tile_release(ops),
            })
        })?;
        self.table = vec![None; if blocked { bf16_drive::BLOCKED_SLOTS } else { 4 }];
        for (&slot, &f) in slots.iter().zip(&set.fns) {
            self.table[slot] = Some(f);
        }
        for (i, &f) in set.fns[ns..].iter().enumerate() {
            self.table[4 + i] = Some(f);
        }
        self.set = Some(set);
        Ok(())
    }

    /// The K-split form of AMX config `a` (`Split::Depth`): the two partial-sum kernels (first block of K, and
    /// the later ones) and the partial buffers. Its epilogue is the identity or a rounding to bf16 (`config`'s
    /// legality check), applied by the pass that adds the partials.
    fn generate_bf16_partial(
        &mut self,
        a: Bf16Config,
        threads: usize,
        cache: Option<&kiln_autotune::Store>,
    ) -> Result<(), String> {
        let v = &self.view;
        let (mp, np) = (v.m.next_multiple_of(a.mr), v.n.next_multiple_of(a.nr()));
        self.parts = threads.clamp(1, v.k.div_ceil(bf16::KSTEP));
        let specs: Vec<bf16::PartialSpec> = [true, false]
            .map(|first| bf16::PartialSpec { mt: a.mr / bf16::TILE, nt: a.nt, ldc: (np * 4) as i32, first })
            .to_vec();
        let key = format!("bf16-partial|{specs:?}|r{}", asm::REVISION);
        let set = kernel_set_with(key, specs.len(), cache, || {
            KernelSet::assemble(specs.len(), |ops, i| bf16::emit_partial(ops, &specs[i]))
        })?;
        self.table = set.fns.iter().map(|&f| Some(f)).collect();
        self.set = Some(set);
        *self.partials.get_mut() = vec![0.0; self.parts * mp * np];
        Ok(())
    }

    /// Whether every element of C is stored only after the epilogue read its operands at that element, so C may
    /// be written over one of them (a donated input, see `kiln_jit::kernel::Donation`): one K block with the
    /// epilogue in registers. With several K blocks C holds partial sums first; the library and dot-product
    /// candidates, and a register tile that left its epilogue to a pass, store the product before the pass reads.
    pub fn reads_epilogue_before_store(&self) -> bool {
        // A bf16 kernel keeps its sums in tiles, registers or (AMX with K in blocks) a scratch block over the whole
        // K, and stores each element once, after its epilogue.
        // A K split's C holds thread 0's partial sums before the last pass adds the others.
        (matches!(self.imp, GemmImpl::Asm(c) if self.view.k <= c.kc && c.split != Split::Depth)
            || matches!(self.imp, GemmImpl::Bf16(_)))
            && !self.uses_pass
    }

    /// Chooses between the register epilogue and the pass; returns the program to generate.
    fn epilogue_program(&mut self, k: &KernelIr, ep: &Option<Epilogue>) -> program::EpProgram {
        match ep {
            Some(e) => {
                self.epilogue = Some(e.clone());
                e.program.clone()
            }
            None => {
                self.uses_pass = !is_identity(k);
                program::EpProgram::identity()
            }
        }
    }

    /// The generated code, for dumps and caches.
    pub fn code_bytes(&self) -> &[u8] {
        let inner = self.transposed.as_ref().and_then(|t| t.set.as_ref());
        self.set.as_ref().or(inner).map_or(&[], |s| &s.bytes)
    }
}

pub(crate) static TUNINGS: AtomicU64 = AtomicU64::new(0);
pub(crate) static TUNE_HITS: AtomicU64 = AtomicU64::new(0);
static KERNEL_COMPILES: AtomicU64 = AtomicU64::new(0);
static KERNEL_LOADS: AtomicU64 = AtomicU64::new(0);

/// The CPU's compile counters (what `crate::runtime::stats` reports).
pub fn stats() -> crate::runtime::CompileStats {
    crate::runtime::CompileStats {
        tunings: TUNINGS.load(Ordering::Relaxed),
        tune_hits: TUNE_HITS.load(Ordering::Relaxed),
        kernel_compiles: KERNEL_COMPILES.load(Ordering::Relaxed),
        kernel_loads: KERNEL_LOADS.load(Ordering::Relaxed),
        clif_compiles: super::compiler::CLIF_COMPILES.load(Ordering::Relaxed),
        clif_loads: super::compiler::CLIF_LOADS.load(Ordering::Relaxed),
        code_mappings: super::code::MAPPINGS.load(Ordering::Relaxed),
        wide_builds: super::wide::BUILDS.load(Ordering::Relaxed),
        wide_generations: super::wide::GENERATIONS.load(Ordering::Relaxed),
    }
}

/// The kernel set for `specs`, from `cache` when it holds this exact code (keyed by specs and program; the store
/// namespaces by kiln version and CPU fingerprint), else generated (and stored).
fn kernel_set(
    specs: &[MicroSpec],
    program: &program::EpProgram,
    cache: Option<&kiln_autotune::Store>,
) -> Result<KernelSet, String> {
    let key = format!("{specs:?}|{program:?}|r{}", asm::REVISION);
    kernel_set_with(key, specs.len(), cache, || KernelSet::build(specs, program))
}

/// The kernel set of `count` kernels whose code `key` fixes: from `cache`, else `build` (and stored).
fn kernel_set_with(
    key: String,
    count: usize,
    cache: Option<&kiln_autotune::Store>,
    build: impl FnOnce() -> Result<KernelSet, String>,
) -> Result<KernelSet, String> {
    let Some(store) = cache else { return build() };
    let name = format!("{GEMM_ARTIFACT_PREFIX}{:016x}", kiln_autotune::checksum_of([key]));
    let premapped = PREMAPPED.lock().get(&name).cloned();
    if let Some(set) = premapped.filter(|s| s.fns.len() == count) {
        KERNEL_LOADS.fetch_add(1, Ordering::Relaxed);
        return Ok(set);
    }
    if let Some(bytes) = store.get_artifact(&name)
        && let Ok(set) = KernelSet::from_artifact(&bytes, count)
    {
        KERNEL_LOADS.fetch_add(1, Ordering::Relaxed);
        return Ok(set);
    }
    let set = build()?;
    KERNEL_COMPILES.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = store.put_artifact(&name, &set.to_artifact()) {
        crate::runtime::cache_write_failed("GEMM code", &e);
    }
    Ok(set)
}

/// Names of cached GEMM kernel sets in the store start with this.
const GEMM_ARTIFACT_PREFIX: &str = "gemm-x86-";

/// Cached kernel sets mapped ahead of use, by artifact name ([`premap_cached_sets`]).
static PREMAPPED: parking_lot::Mutex<rustc_hash::FxHashMap<String, KernelSet>> =
    parking_lot::Mutex::new(rustc_hash::FxHashMap::with_hasher(rustc_hash::FxBuildHasher));

/// Maps every cached GEMM kernel set the store holds in memory (after `import_bundle`: the bundle's) into one
/// executable mapping, so that a warm process's plans find them mapped (see the CPU backend's `code` module).
/// Sets mapped before are skipped; a failure only logs (`KILN_LOG`): the sets then map one by one when used.
pub(crate) fn premap_cached_sets(store: &kiln_autotune::Store) {
    let mut map = PREMAPPED.lock();
    let todo: Vec<(String, Vec<u8>)> =
        store.artifacts_with_prefix(GEMM_ARTIFACT_PREFIX).into_iter().filter(|(n, _)| !map.contains_key(n)).collect();
    if todo.is_empty() {
        return;
    }
    let blobs: Vec<&[u8]> = todo.iter().map(|(_, b)| b.as_slice()).collect();
    match KernelSet::map_artifacts(&blobs) {
        Ok(sets) => {
            for ((name, _), set) in todo.into_iter().zip(sets) {
                match set {
                    Some(set) => {
                        map.insert(name, set);
                    }
                    None => crate::runtime::tracing_note(&format!("cached GEMM code {name} not premapped: malformed")),
                }
            }
        }
        Err(e) => crate::runtime::tracing_note(&format!("cached GEMM code not premapped: {e}")),
    }
}

fn is_identity(k: &KernelIr) -> bool {
    matches!(k.outer.get(k.result).map(|i| &i.op), Some(kiln_jit::kernel::InstOp::Acc))
}

/// Base pointers of one run.
pub struct Ctx<'a> {
    pub a: *const f32,
    pub b: *const f32,
    pub c: *mut f32,
    uniforms: *const u8,
    ptrs: &'a [*mut u8],
}

// SAFETY: read-only pointer bundle shared by the pool's threads for the duration of one run; the threads write
// disjoint rectangles of C.
unsafe impl Sync for Ctx<'_> {}

struct PassArgs(*const *mut u8);

// SAFETY: the pointer table outlives the pass launch, which only reads it; chunks write disjoint rows of C.
unsafe impl Sync for PassArgs {}

struct BatchOffsets {
    a: i64,
    b: i64,
    c: i64,
    ops: [i64; epilogue::MAX_OPERANDS],
}

/// Per-thread pack buffers, 64-byte aligned, grown on demand and kept.
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
    /// The K-blocked AMX drive's partial sums.
    c: Vec<f32>,
}

impl Scratch {
    fn a(&mut self, len: usize) -> *mut f32 {
        aligned(&mut self.a, len)
    }
    fn b(&mut self, len: usize) -> *mut f32 {
        aligned(&mut self.b, len)
    }
    fn c(&mut self, len: usize) -> *mut f32 {
        aligned(&mut self.c, len)
    }
}

fn aligned(v: &mut Vec<f32>, len: usize) -> *mut f32 {
    if v.len() < len + 16 {
        v.resize(len + 16, 0.0);
    }
    let p = v.as_mut_ptr();
    let skip = (p as usize).next_multiple_of(64) - p as usize;
    // SAFETY: `skip` is at most 60 bytes (15 floats) and the vector has 16 spare floats past `len`.
    unsafe { p.add(skip / 4) }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Floats of packed A and of packed B that `CompiledGemm::rect` asks the scratch for in configuration `c`, at most
/// (its blocks are clamped to the problem, so a smaller problem asks for less).
pub(crate) fn pack_lens(c: &GemmConfig) -> (usize, usize) {
    let a = if c.pack_a { c.mc.next_multiple_of(c.mr) * c.kc } else { 0 };
    let b = if c.pack_b { c.nc.next_multiple_of(c.nr()) * c.kc } else { c.nr() * c.kc };
    (a, b)
}

/// Grows every pool thread's pack buffers to hold `a` and `b` floats now, so that the first GEMM launch of a warm
/// process does not pay the page faults (and zero-filling) of growing them: ~0.9 µs per 4 KiB page here, a few
/// hundred pages per thread for the MLP's layers. Buffers never shrink, so this only moves a cost earlier.
pub fn reserve_scratch(a: usize, b: usize) {
    let grow = || {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.a(a);
            s.b(b);
        })
    };
    pool::global().on_each_thread(std::time::Duration::from_millis(20), &grow);
}
