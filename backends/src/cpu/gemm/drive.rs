//! The f32 GEMM's drivers (`CompiledGemm::run`): the threads split C into rectangles (`rect`: the BLIS loop nest
//! of the module doc, one micro-kernel call per tile) or, for a weight gradient summed over tokens, split K
//! (`run_depth`: partials added in thread order, then the epilogue as a pass); the library, dot-product, split-K
//! and transposed candidates run their own loops, and an epilogue the registers cannot hold runs as a pass over C.
//! The bf16 kernels' drivers are `bf16_drive`'s.

use super::asm::Mode;
use super::config::{GemmConfig, GemmImpl, Split};
use super::epilogue::OperandKind;
use super::{
    BatchOffsets, CompiledGemm, Ctx, Pass, PassArgs, SCRATCH, Scratch, dot, epilogue, mode_index, pack, patch, splitk,
    transposed, tune,
};
use crate::cpu::pool;

impl CompiledGemm {
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
    pub(super) fn epilogue_operands_in(
        &self,
        cx: &Ctx,
        bo: &BatchOffsets,
        m_at: usize,
        n_at: usize,
        ep: &mut [*const u8],
    ) {
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
    pub(super) fn item_rect(&self, item: usize, split_rows: bool, mr: usize, nr: usize) -> (usize, [usize; 4]) {
        let v = &self.view;
        let (bidx, part) = (item / self.parts, item % self.parts);
        let (unit, total) = if split_rows { (mr, v.m) } else { (nr, v.n) };
        let units = total.div_ceil(unit);
        let lo = (part * units / self.parts * unit).min(total);
        let hi = ((part + 1) * units / self.parts * unit).min(total);
        (bidx, if split_rows { [lo, hi, 0, v.n] } else { [0, v.m, lo, hi] })
    }

    /// Element offsets of batch element `bidx`: A, B, C, then each epilogue operand.
    pub(super) fn batch_offsets(&self, bidx: usize) -> BatchOffsets {
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
