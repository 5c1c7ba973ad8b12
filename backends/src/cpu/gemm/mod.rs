//! The CPU GEMM: a kernel the scheduler produced as `G_...` (a reduce kernel that [`GemmView`] recognizes) runs as a
//! blocked GEMM around generated micro-kernels (`asm` for AVX2, `asm512` for AVX-512F), in the configuration the tuner
//! picked (`config`, `tune`), with its epilogue in registers (`epilogue`) or, when that cannot express it, as a
//! compiled pass over C.
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
use epilogue::{Epilogue, OperandKind};
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
        let allow =
            epilogue::Allow { bf16: true, bf16_loads: super::isa::has_avx512bw(), positions: false, scalef: false };
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

    /// Runs the GEMM: `ptrs` holds the kernel's input pointers, then the output pointer.
    ///
    /// # Safety
    /// Every pointer must be valid for the buffer the kernel IR declares at that position (its dtype and length),
    /// and the output must not alias an input, except an epilogue operand read at the output's own element when
    /// [`Self::reads_epilogue_before_store`] holds.
    pub unsafe fn run(&self, ptrs: &[*mut u8]) {
        let n_in = self.input_dtypes.len();
        // SAFETY: the caller's pointer contract covers the buffers the uniform values are read from.
        let uniforms = unsafe { epilogue::Uniforms::for_launch(self.epilogue.as_ref(), &self.outer, ptrs) };
        let cx = Ctx {
            a: ptrs[self.view.a.buf] as *const f32,
            b: ptrs[self.view.b.buf] as *const f32,
            c: ptrs[n_in] as *mut f32,
            uniforms: uniforms.as_ptr(),
            ptrs,
        };
        match self.imp {
            // SAFETY: the caller's pointer contract.
            GemmImpl::Asm(c) if c.split == Split::Depth => unsafe { self.run_depth(&c, &cx) },
            GemmImpl::Asm(c) => {
                let items = self.view.batch_count() * self.parts;
                let work = (self.view.flops() / 2.0) as usize;
                let f = |s: usize, e: usize| {
                    for item in s..e {
                        // SAFETY: the caller's pointer contract; items cover disjoint rectangles of C.
                        unsafe { self.run_item(&c, &cx, item) };
                    }
                };
                pool::global().parallel_for_work(items, work, &f);
            }
            // SAFETY: the caller's pointer contract.
            GemmImpl::Bf16(a) if a.split == Split::Depth => unsafe { self.run_bf16_depth(&a, &cx) },
            GemmImpl::Bf16(a) => {
                let items = self.view.batch_count() * self.parts;
                let work = (self.view.flops() / 16.0) as usize;
                // SAFETY: the caller's pointer contract.
                let shared = unsafe { self.pack_bf16_a_shared(&a, &cx) };
                let f = |s: usize, e: usize| {
                    for item in s..e {
                        // SAFETY: the caller's pointer contract; items cover disjoint rectangles of C.
                        unsafe { self.run_bf16_item(&a, &cx, item, shared.as_ref()) };
                    }
                };
                pool::global().parallel_for_work(items, work, &f);
            }
            // SAFETY: the caller's pointer contract.
            GemmImpl::Library => unsafe { tune::library_gemm(&self.view, &cx) },
            // SAFETY: the caller's pointer contract; `build` accepted the view (`legal_for`), and generated GEMMs
            // (this candidate among them) run only on hosts with AVX2 and FMA.
            GemmImpl::Dot => unsafe { dot::dot_gemm(&self.view, &cx) },
            // SAFETY: as for the dot products (`legal_for` accepted the view: `splitk_legal`).
            GemmImpl::SplitK => unsafe { splitk::splitk_gemm(&self.view, &cx) },
            GemmImpl::Transposed(_) => {
                let inner = self.transposed.as_deref().unwrap_or_else(|| unreachable!("built with the candidate"));
                // SAFETY: the caller's pointer contract; the inner GEMM reads the same inputs (A and B swapped).
                unsafe { transposed::run(inner, &self.view, ptrs, n_in) }
            }
        }
        if self.uses_pass
            && let Some(pass) = &self.pass
        {
            // Inline for up to 16 buffers: no allocation per launch on the replay path.
            let mut args: smallvec::SmallVec<[*mut u8; 16]> = ptrs[..n_in].iter().copied().collect();
            args.push(ptrs[n_in]);
            args.push(ptrs[n_in]);
            match pass {
                // SAFETY: the pass was built from `epilogue_pass_kernel` of this GEMM's kernel, whose inputs are this
                // kernel's inputs plus C, and it loads each element of C before storing it.
                Pass::Wide(w) => unsafe { w.run(&args) },
                Pass::Clif(f) => {
                    let rows = if self.view.batch.is_empty() {
                        if self.view.m == 1 { self.view.n } else { self.view.m }
                    } else {
                        self.view.batch[0]
                    };
                    let work = self.view.batch_count() * self.view.m * self.view.n * self.outer.len();
                    let a = PassArgs(args.as_ptr());
                    let call = |s: usize, e: usize| {
                        let a = &a;
                        // SAFETY: as above, and `s..e` lies within the pass kernel's output loop 0.
                        unsafe { f(a.0, std::ptr::null(), s as i64, e as i64) }
                    };
                    pool::global().parallel_for_work(rows, work, &call);
                }
            }
        }
    }

    /// One rectangle of C: batch element and column/row strip `item`.
    unsafe fn run_item(&self, c: &GemmConfig, cx: &Ctx, item: usize) {
        let (bidx, [m0, m1, n0, n1]) = self.item_rect(item, c.split == Split::Rows, c.mr, c.nr());
        let bo = self.batch_offsets(bidx);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // SAFETY: the caller's pointer contract.
            unsafe { self.rect(c, cx, &bo, m0, m1, n0, n1, (0, self.view.k), &mut s) }
        });
    }

    /// `Split::Depth`: thread `t` sums the `t`-th of `parts` contiguous shares of K over all of C (the pool's chunk
    /// bounds, as every row-split kernel of the step cuts its rows: a weight gradient's tokens are then the ones
    /// this thread wrote), thread 0 into C and the others into their partials; then the threads add the partials
    /// into their rows of C, in thread order, so the sum does not depend on timing.
    ///
    /// # Safety
    /// As [`CompiledGemm::run`].
    unsafe fn run_depth(&self, c: &GemmConfig, cx: &Ctx) {
        let v = &self.view;
        let (m, n, parts) = (v.m, v.n, self.parts);
        let mut partials = self.partials.lock();
        let base = tune::SendPtr(partials.as_mut_ptr());
        // Unbatched (`config::f32_depth_legal`), but A and B may start inside their buffers (a narrowed view).
        let bo = self.batch_offsets(0);
        let sum = |lo: usize, hi: usize| {
            for t in lo..hi {
                let share = pool::chunk_bounds(v.k, parts, t);
                // Thread t's partial: the buffer holds `parts - 1` of them, M x N each, C's layout.
                let out = if t == 0 { cx.c } else { base.get().wrapping_add((t - 1) * m * n) };
                let part = Ctx { a: cx.a, b: cx.b, c: out, uniforms: cx.uniforms, ptrs: cx.ptrs };
                SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    // SAFETY: the caller's pointer contract for A and B; `out` is C or a partial of C's size.
                    unsafe { self.rect(c, &part, &bo, 0, m, 0, n, share, &mut s) }
                });
            }
        };
        pool::global().parallel_for_work(parts, (v.flops() / 2.0) as usize, &sum);
        let out = tune::SendPtr(cx.c);
        let add = |lo: usize, hi: usize| {
            // SAFETY: rows lo..hi of C (M x N, dense: the kernels' `ldc`) and of each partial (M x N apart); the
            // threads' rows are disjoint, and every partial was written before `parallel_for_work` returned.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(out.get().add(lo * n), (hi - lo) * n);
                pool::add_partials(dst, base.get().wrapping_add(lo * n), parts - 1, m * n);
            }
        };
        pool::global().parallel_for_work(m, m * n * parts, &add);
    }

    /// Points `ep[2..]` at each epilogue operand's element (m_at, n_at) of the batch element at `bo`.
    fn epilogue_operands_in(&self, cx: &Ctx, bo: &BatchOffsets, m_at: usize, n_at: usize, ep: &mut [*const u8]) {
        let ops = self.epilogue.as_ref().map_or(&[][..], |e| &e.operands[..]);
        for (o, op) in ops.iter().enumerate() {
            let e = bo.ops[o]
                + match op.kind {
                    OperandKind::Mat { ld } => m_at as i64 * ld + n_at as i64,
                    OperandKind::Row => n_at as i64,
                    OperandKind::Col { stride } => m_at as i64 * stride,
                };
            ep[2 + o] = cx.ptrs[op.buf].wrapping_offset((e * op.elem_bytes() as i64) as isize) as *const u8;
        }
    }

    /// Work item `item`'s batch element and rectangle `[m0, m1, n0, n1]` of C: part `item % parts` of the rows (in
    /// whole blocks of `mr`) where `split_rows`, else of the columns (blocks of `nr`).
    fn item_rect(&self, item: usize, split_rows: bool, mr: usize, nr: usize) -> (usize, [usize; 4]) {
        let v = &self.view;
        let (bidx, part) = (item / self.parts, item % self.parts);
        let (unit, total) = if split_rows { (mr, v.m) } else { (nr, v.n) };
        let units = total.div_ceil(unit);
        let lo = (part * units / self.parts * unit).min(total);
        let hi = ((part + 1) * units / self.parts * unit).min(total);
        (bidx, if split_rows { [lo, hi, 0, v.n] } else { [0, v.m, lo, hi] })
    }

    /// Element offsets of batch element `bidx`: A, B, C, then each epilogue operand.
    fn batch_offsets(&self, bidx: usize) -> BatchOffsets {
        let v = &self.view;
        // Every batch dim's position (inline up to 8; past that a fixed array had dropped the outer ones, and a
        // GEMM over nine unmergeable batch dims read the wrong elements).
        let mut idx: smallvec::SmallVec<[i64; 8]> = smallvec::smallvec![0; v.batch.len()];
        let mut rem = bidx;
        for (d, &e) in v.batch.iter().enumerate().rev() {
            idx[d] = (rem % e) as i64;
            rem /= e;
        }
        let dot = |s: &[i64]| s.iter().zip(&idx).map(|(a, b)| a * b).sum::<i64>();
        let mut ops = [0i64; epilogue::MAX_OPERANDS];
        if let Some(ep) = &self.epilogue {
            for (o, op) in ep.operands.iter().enumerate() {
                ops[o] = op.offset + dot(&op.batch);
            }
        }
        BatchOffsets {
            a: v.a.offset + dot(&v.a.batch),
            b: v.b.offset + dot(&v.b.batch),
            c: (bidx * v.m * v.n) as i64,
            ops,
        }
    }

    /// Rows `m0..m1` and columns `n0..n1` of C (of the batch element at `bo`) over K steps `k_lo..k_hi`: all of K,
    /// or a K split's share (`run_depth`), whose first block stores and whose last applies the epilogue.
    #[allow(clippy::too_many_arguments)]
    unsafe fn rect(
        &self,
        c: &GemmConfig,
        cx: &Ctx,
        bo: &BatchOffsets,
        m0: usize,
        m1: usize,
        n0: usize,
        n1: usize,
        (k_lo, k_hi): (usize, usize),
        s: &mut Scratch,
    ) {
        let v = &self.view;
        let (mr, nr) = (c.mr, c.nr());
        let mut ep: [*const u8; 2 + epilogue::MAX_OPERANDS] = [std::ptr::null(); 2 + epilogue::MAX_OPERANDS];
        // Read only by the kernels of a ragged tail (`MicroSpec::masked`).
        ep[0] = crate::cpu::isa::lane_mask(c.isa, self.ragged);
        ep[1] = cx.uniforms;
        let mut jc = n0;
        while jc < n1 {
            let nb = (n1 - jc).min(c.nc);
            let panels = nb.div_ceil(nr);
            // K blocks of equal depth, at most `kc`: 784 in blocks of 256 left a last block of 16, a whole pass of
            // loads and stores of C for 16 k-steps (3 blocks of 262 would pass `kc`; 4 of 196 do not).
            let depth = k_hi - k_lo;
            let kc = depth.div_ceil(depth.div_ceil(c.kc)).max(1);
            let mut pc = k_lo;
            while pc < k_hi {
                let kb = (k_hi - pc).min(kc);
                let mode = match (pc == k_lo, pc + kb == k_hi) {
                    (true, true) => Mode::Single,
                    (true, false) => Mode::First,
                    (false, true) => Mode::Last,
                    (false, false) => Mode::Middle,
                };
                // SAFETY (all pack calls and pointer arithmetic below): the GEMM view was recognized from the
                // kernel IR, whose affine indices stay within each declared buffer for every (b, m, n, k) in range;
                // every index formed here is such an index.
                let bsrc = unsafe { cx.b.offset((bo.b + pc as i64 * v.b.rows) as isize) };
                let bpack = if let Some(tables) = &self.b_tables {
                    // (legal_for: a patched B is only read by configurations that pack it.)
                    let dst = s.b(panels * nr * kb);
                    let base = unsafe { cx.b.offset(bo.b as isize) };
                    let block = patch::Block { k0: pc, kb, n0: jc, nb, nr };
                    unsafe { tables.pack(dst, base, block) };
                    dst as *const f32
                } else if c.pack_b {
                    let dst = s.b(panels * nr * kb);
                    unsafe { pack::pack_b(dst, bsrc, v.b.rows, v.b.cols, jc, nb, kb, nr) };
                    dst as *const f32
                } else if !nb.is_multiple_of(nr) {
                    let dst = s.b(nr * kb);
                    let last = (panels - 1) * nr;
                    unsafe { pack::pack_b(dst, bsrc, v.b.rows, v.b.cols, jc + last, nb - last, kb, nr) };
                    dst as *const f32
                } else {
                    std::ptr::null()
                };
                let mut ic = m0;
                while ic < m1 {
                    let mb = (m1 - ic).min(c.mc);
                    let asrc = unsafe { cx.a.offset((bo.a + pc as i64 * v.a.cols) as isize) };
                    let apack = if c.pack_a {
                        let dst = s.a(mb.div_ceil(mr) * mr * kb);
                        unsafe { pack::pack_a(dst, asrc, v.a.rows, v.a.cols, ic, mb, kb, mr) };
                        dst as *const f32
                    } else {
                        std::ptr::null()
                    };
                    for q in 0..panels {
                        let jr = q * nr;
                        let tail = nb - jr < nr;
                        let bptr = if c.pack_b {
                            unsafe { bpack.add(q * kb * nr) }
                        } else if tail {
                            bpack
                        } else {
                            unsafe { bsrc.offset(((jc + jr) as i64 * v.b.cols) as isize) }
                        };
                        let n_at = jc + jr;
                        let mut ir = 0;
                        while ir < mb {
                            let rows = (mb - ir).min(mr);
                            let m_at = ic + ir;
                            let aptr = if c.pack_a {
                                unsafe { apack.add(ir / mr * mr * kb) }
                            } else {
                                unsafe { asrc.offset((m_at as i64 * v.a.rows) as isize) }
                            };
                            let cptr = unsafe { cx.c.offset((bo.c + (m_at * v.n + n_at) as i64) as isize) };
                            self.epilogue_operands_in(cx, bo, m_at, n_at, &mut ep);
                            let f = self.table[(rows - 1) * 8 + tail as usize * 4 + mode_index(mode)]
                                .unwrap_or_else(|| unreachable!("kernel {rows} rows, tail {tail}, {mode:?} generated"));
                            // SAFETY: the micro-kernel reads `kb` steps of A and B panels laid out as generated
                            // (packed here or in place with the view's strides), writes a rows x NR tile of C
                            // (masked at a ragged edge), and reads epilogue operands at the tile.
                            unsafe { f(aptr, bptr, cptr, kb, ep.as_ptr()) };
                            ir += rows;
                        }
                    }
                    ic += mb;
                }
                pc += kb;
            }
            jc += nb;
        }
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
