//! The bf16 GEMM's drivers (`CompiledGemm::run` calls them for a `GemmImpl::Bf16` configuration): the threads split
//! C into rectangles (`run_bf16_item`: A packed once per thread, B packed per block of columns, every row block of
//! the rectangle over it, on AMX with a long K in blocks of K; each element of C stored once, after its epilogue)
//! or, for a few rows, split K (`run_bf16_depth`: per-thread partial sums added and rounded into C). The kernels
//! they call are `bf16`'s.

use super::asm::MicroFn;
use super::config::{Bf16Config, Split};
use super::{CompiledGemm, Ctx, SCRATCH, bf16, bf16_pack, epilogue};
use crate::cpu::pool;
use kiln_jit::{DType, HostBuffer};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

impl CompiledGemm {
    /// A packed once for every thread's column strip (`bf16_pack::pack_a`, row blocks split between the threads), where
    /// several threads run strips of an unbatched GEMM and all of A fits `BF16_A_BYTES`: each strip reads every
    /// row of A, and each thread had packed all of it (bf16 2048^3 on two threads, 8 MiB a thread: five interleaved
    /// pairs, median 8.43 -> 8.16 ms). The guard holds the packed blocks, `mr * steps * 32` words each, 64-byte
    /// aligned, until the strips are done, then gives the buffer back to the host pool; `None` where the strips
    /// pack their own.
    ///
    /// # Safety
    /// `cx.a` must be the view's A buffer (the run's pointer contract).
    pub(super) unsafe fn pack_bf16_a_shared(&self, a: &Bf16Config, cx: &Ctx) -> Option<SharedA> {
        let v = &self.view;
        let (mr, steps) = (a.mr, v.k.div_ceil(bf16::KSTEP));
        let (blocks, block_words) = (v.m.div_ceil(mr), mr * steps * bf16::KSTEP);
        let bytes = (blocks * block_words * 2) as u64;
        if a.split != Split::Cols
            || self.parts < 2
            || !v.batch.is_empty()
            || bytes > BF16_A_BYTES.load(Ordering::Relaxed)
            || bytes < SHARED_A_MIN_BYTES.load(Ordering::Relaxed)
        {
            return None;
        }
        // From the host pool (64-byte aligned, given back when the strips are done), so a search's candidates and a
        // plan's replays reuse faulted-in memory: a buffer per compiled GEMM took ~15 ms more of the bf16 GPT's
        // first step (141 -> 153-157 ms), each candidate's first run faulting its pages in.
        let mut buf = crate::host_pool::take(DType::BF16, blocks * block_words);
        let HostBuffer::BF16(room) = &mut buf else { unreachable!("host_pool::take gives the dtype asked for") };
        let base = PartialsPtr(room.spare_capacity_mut().as_mut_ptr() as *mut f32);
        let a0 = self.batch_offsets(0).a;
        let pack = |lo: usize, hi: usize| {
            let base = &base;
            for blk in lo..hi {
                // SAFETY: block `blk` of the area sized for `blocks`; the caller's pointer contract.
                unsafe { self.pack_a_rows(a, cx, a0, blk * mr, v.m, (base.0 as *mut u16).add(blk * block_words)) };
            }
        };
        pool::global().parallel_for_work(blocks, blocks * block_words, &pack);
        let at = base.0 as *const u16;
        Some(SharedA { buf: Some(buf), at })
    }

    /// Packs the row block of A from row `ic` (up to `mr` rows, none past `m_end`) of the batch element whose A
    /// starts at element `a0` into `dst` (`bf16_pack::pack_a`'s layout, all of K).
    ///
    /// # Safety
    /// `cx.a` must be the view's A buffer; `dst` must hold `mr * steps * 32` u16.
    unsafe fn pack_a_rows(&self, a: &Bf16Config, cx: &Ctx, a0: i64, ic: usize, m_end: usize, dst: *mut u16) {
        let v = &self.view;
        let rows = (m_end - ic).min(a.mr);
        // SAFETY: rows `ic..ic + rows` of A lie in its buffer (the view's affine indices); `dst` as the caller says.
        unsafe {
            let src = (cx.a as *const u16).offset((a0 + ic as i64 * v.a.rows) as isize);
            bf16_pack::pack_a(dst, src, v.a.rows, v.a.cols, rows, v.k, a.mr, v.k.div_ceil(bf16::KSTEP));
        }
    }

    /// One rectangle of C on the bf16 kernels: batch element and column/row strip `item`. A's row blocks packed
    /// (`bf16_pack::pack_a`, or taken from `shared`); per block of `nc` columns, B packed into tile pairs
    /// (`bf16_pack::pack_b`), then every row block of `mr`, one kernel call per panel.
    pub(super) unsafe fn run_bf16_item(&self, a: &Bf16Config, cx: &Ctx, item: usize, shared: Option<&SharedA>) {
        let v = &self.view;
        let (mr, nr) = (a.mr, a.nr());
        let (bidx, [m0, m1, n0, n1]) = self.item_rect(item, a.split == Split::Rows, mr, nr);
        let bo = self.batch_offsets(bidx);
        let steps = v.k.div_ceil(bf16::KSTEP);
        let esz = if v.out == DType::BF16 { 2 } else { 4 };
        let bbase = cx.b as *const u16;
        let mut ep: [*const u8; 2 + epilogue::MAX_OPERANDS] = [null(); 2 + epilogue::MAX_OPERANDS];
        ep[0] = crate::cpu::isa::lane_mask(crate::cpu::isa::Isa::Avx512, self.ragged);
        ep[1] = cx.uniforms;
        // u16 words of one step of a panel (`nt` tiles of 16 x 32), and of a whole-K panel.
        let step_words = a.nt * bf16::TILE * bf16::KSTEP;
        let panel_words = steps * step_words;
        let block_words = mr * steps * bf16::KSTEP;
        // K in blocks (`generate_bf16`): the kernels of the first and later blocks, the tile stubs.
        let blocked: Option<[MicroFn; 4]> = match self.table.get(4..BLOCKED_SLOTS) {
            Some(&[Some(first), Some(next), Some(config), Some(release)]) => Some([first, next, config, release]),
            _ => None,
        };
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // A is packed (`bf16_pack::pack_a`): its rows read in place, a power of two apart, share cache sets (bf16
            // 2048^3, 2 threads: 7.9-8.5 ms packed against 9.8-9.9 in place). Every row block once, here, for every
            // block of B's columns, unless that passes `BF16_A_BYTES`: then one block at a time, repacked per
            // block of columns.
            let blocks = (m1 - m0).div_ceil(mr);
            let once = shared.is_some() || (blocks * block_words * 2) as u64 <= BF16_A_BYTES.load(Ordering::Relaxed);
            let apack = match shared {
                // Column strips start at row 0: the shared blocks are this rectangle's.
                Some(sh) => sh.at as *mut u16,
                None => s.a((if once { blocks } else { 1 } * block_words).div_ceil(2)) as *mut u16,
            };
            // SAFETY: the run's pointer contract; `dst` holds one block.
            let pack = |blk: usize, dst: *mut u16| unsafe { self.pack_a_rows(a, cx, bo.a, m0 + blk * mr, m1, dst) };
            // B's rows `k0..k0 + depth`, columns `j0..j0 + cols`, packed into `dst` (`bf16_pack::pack_b`).
            let pack_b = |dst: *mut u16, k0: usize, depth: usize, j0: usize, cols: usize| {
                // SAFETY: the view's affine indices keep those rows and columns of B in its buffer; each caller's
                // `dst` holds what `pack_b` writes for them.
                unsafe {
                    let src = bbase.offset((bo.b + k0 as i64 * v.b.rows) as isize);
                    bf16_pack::pack_b(dst, src, v.b.rows, v.b.cols, j0, cols, depth, a.nt);
                }
            };
            if once && shared.is_none() {
                for blk in 0..blocks {
                    // SAFETY: block `blk` of the area sized for `blocks`.
                    pack(blk, unsafe { apack.add(blk * block_words) });
                }
            }
            // Row block `blk`'s packed A.
            let a_block = |blk: usize| {
                if once {
                    // SAFETY: block `blk` of the area packed above.
                    unsafe { apack.add(blk * block_words) as *const u16 }
                } else {
                    pack(blk, apack);
                    apack as *const u16
                }
            };
            // The kernel that stores C's `rows x nr` block at (ic, n_at) (a narrower `tail` one at the last
            // panel), after its epilogue: `(a, b, k)` are its products' operands, or (K in blocks) the finished sums
            // and no steps.
            let mut finish = |ic: usize, rows: usize, n_at: usize, tail: bool, a: *const f32, b: *const f32, k| {
                self.epilogue_operands_in(cx, &bo, ic, n_at, &mut ep);
                let f = self.table[usize::from(rows != mr) * 2 + tail as usize]
                    .unwrap_or_else(|| unreachable!("bf16 kernel {rows} rows, tail {tail} generated"));
                // SAFETY: C's rows x nv tile at (ic, n_at) lies in C (the view's bounds); the caller's operands are
                // what the kernel reads.
                unsafe {
                    let cptr = (cx.c as *mut u8).offset((bo.c + (ic * v.n + n_at) as i64) as isize * esz);
                    f(a, b, cptr as *mut f32, k, ep.as_ptr())
                }
            };
            if let Some([_, _, config, _]) = blocked {
                // SAFETY: the stub only loads the tile configuration; the release below ends it.
                unsafe { config(null(), null(), null_mut(), 0, null()) };
            }
            // K in blocks with few rows: block of K outermost, over the whole strip (see `k_outer_fits`).
            if let Some([first, next, _, release]) = blocked
                && once
                && k_outer_fits(v.k * v.n * 2, m1 - m0, n1 - n0, mr, nr, k_outer_l2())
            {
                let kbs = bf16::K_BLOCK_STEPS;
                let (row_blocks, panels) = ((m1 - m0).div_ceil(mr), (n1 - n0).div_ceil(nr));
                let block_sums = panels * mr * nr;
                let sums = s.c(row_blocks * block_sums);
                let bpack = s.b((panels * kbs * step_words).div_ceil(2)) as *mut u16;
                for (kb, k0) in (0..steps).step_by(kbs).enumerate() {
                    let (ks, depth) = ((steps - k0).min(kbs), (v.k - k0 * bf16::KSTEP).min(kbs * bf16::KSTEP));
                    // The area holds `panels` panels of `ks` steps.
                    pack_b(bpack, k0 * bf16::KSTEP, depth, n0, n1 - n0);
                    let f = if kb == 0 { first } else { next };
                    for ib in 0..row_blocks {
                        // SAFETY: A's steps `k0..k0 + ks` of row block `ib`, this block of K's packed B, row block
                        // `ib`'s partial sums (`panels` blocks); the tiles are configured.
                        unsafe {
                            let at = a_block(ib).add(k0 * mr * 32) as *const f32;
                            f(at, bpack as *const f32, sums.add(ib * block_sums), bf16::blocked_k(ks, panels), null())
                        };
                    }
                }
                for ib in 0..row_blocks {
                    let ic = m0 + ib * mr;
                    for q in 0..panels {
                        // SAFETY: panel q's finished sums in row block `ib`'s (mr x nr f32).
                        let at = unsafe { sums.add(ib * block_sums + q * mr * nr) };
                        finish(ic, (m1 - ic).min(mr), n0 + q * nr, n1 - n0 - q * nr < nr, at, null(), 0);
                    }
                }
                // SAFETY: ends the configuration loaded above.
                unsafe { release(null(), null(), null_mut(), 0, null()) };
                return;
            }
            let mut jc = n0;
            while jc < n1 {
                let nb = (n1 - jc).min(a.nc);
                let panels = nb.div_ceil(nr);
                // Scratch is sized in f32s: two bf16 each.
                let bpack = s.b((panels * panel_words).div_ceil(2)) as *mut u16;
                if let Some([first, next, _, _]) = blocked {
                    // K in blocks (`bf16::emit_blocked`): B packed block of K after block, each block's panels
                    // together; per row block, every block of K into the partial sums, then the epilogue over them.
                    let kbs = bf16::K_BLOCK_STEPS;
                    let sums = s.c(panels * mr * nr);
                    let kb_words = panels * kbs * step_words;
                    for (kb, k0) in (0..steps).step_by(kbs).enumerate() {
                        let depth = (v.k - k0 * bf16::KSTEP).min(kbs * bf16::KSTEP);
                        // SAFETY: block `kb` of the packed B holds `panels` panels of `depth`'s steps.
                        pack_b(unsafe { bpack.add(kb * kb_words) }, k0 * bf16::KSTEP, depth, jc, nb);
                    }
                    let mut ic = m0;
                    while ic < m1 {
                        let rows = (m1 - ic).min(mr);
                        let aptr = a_block((ic - m0) / mr);
                        for (kb, k0) in (0..steps).step_by(kbs).enumerate() {
                            let ks = (steps - k0).min(kbs);
                            let f = if kb == 0 { first } else { next };
                            // SAFETY: A's steps `k0..k0 + ks` (mr rows of 64 bytes a step), block `kb` of the
                            // packed B, `panels` blocks of partial sums; the tiles are configured.
                            unsafe {
                                f(
                                    aptr.add(k0 * mr * 32) as *const f32,
                                    bpack.add(kb * kb_words) as *const f32,
                                    sums,
                                    bf16::blocked_k(ks, panels),
                                    null(),
                                )
                            };
                        }
                        for q in 0..panels {
                            // SAFETY: panel q's finished sums (mr x nr f32).
                            finish(
                                ic,
                                rows,
                                jc + q * nr,
                                nb - q * nr < nr,
                                unsafe { sums.add(q * mr * nr) },
                                null(),
                                0,
                            );
                        }
                        ic += rows;
                    }
                    jc += nb;
                    continue;
                }
                // The kernels read `steps` steps of a packed A block (mr rows of 64 bytes a step) and of the panel,
                // and write a rows x nv tile of C.
                pack_b(bpack, 0, v.k, jc, nb);
                let mut ic = m0;
                while ic < m1 {
                    let rows = (m1 - ic).min(mr);
                    let aptr = a_block((ic - m0) / mr);
                    for q in 0..panels {
                        // SAFETY: panel q of the packed B (steps steps of nt tiles).
                        let b = unsafe { bpack.add(q * panel_words) as *const f32 };
                        finish(ic, rows, jc + q * nr, nb - q * nr < nr, aptr as *const f32, b, steps);
                    }
                    ic += rows;
                }
                jc += nb;
            }
            if let Some([_, _, _, release]) = blocked {
                // SAFETY: ends the configuration loaded above.
                unsafe { release(null(), null(), null_mut(), 0, null()) };
            }
        });
    }

    /// The K-split AMX GEMM: thread `t` adds its share of K's steps for all of C into its partial block, packing B
    /// one chunk of rows at a time across the whole width (read front to back), then the partials are added and
    /// rounded into C.
    pub(super) unsafe fn run_bf16_depth(&self, a: &Bf16Config, cx: &Ctx) {
        let v = &self.view;
        let (mr, nr) = (a.mr, a.nr());
        let (mp, np) = (v.m.next_multiple_of(mr), v.n.next_multiple_of(nr));
        let steps = v.k.div_ceil(bf16::KSTEP);
        let chunk = depth_chunk(np);
        let mut partials = self.partials.lock();
        let base = PartialsPtr(partials.as_mut_ptr());
        let (first, next) = match self.table[..] {
            [Some(f), Some(n)] => (f, n),
            _ => unreachable!("both partial kernels generated"),
        };
        let parts = self.parts;
        let work = (v.flops() / 16.0) as usize;
        // Unbatched (`config::depth_split_legal`), but A and B may start inside their buffers (a narrowed view).
        let bo = self.batch_offsets(0);
        let sum = |lo: usize, hi: usize| {
            let base = &base;
            // SAFETY: the operands' first elements (the view's offsets lie within their buffers).
            let (abase, bbase) =
                unsafe { ((cx.a as *const u16).offset(bo.a as isize), (cx.b as *const u16).offset(bo.b as isize)) };
            for t in lo..hi {
                let (s0, s1) = (t * steps / parts, (t + 1) * steps / parts);
                // SAFETY: thread t's block of the buffer sized parts x mp x np.
                let part = unsafe { base.0.add(t * mp * np) };
                SCRATCH.with(|s| {
                    let mut s = s.borrow_mut();
                    let bpack = s.b((np * chunk * bf16::KSTEP).div_ceil(2)) as *mut u16;
                    let apack = s.a((mr * chunk * bf16::KSTEP).div_ceil(2)) as *mut u16;
                    let mut c0 = s0;
                    while c0 < s1 {
                        let c1 = (c0 + chunk).min(s1);
                        let k0 = c0 * bf16::KSTEP;
                        let depth = (c1 * bf16::KSTEP).min(v.k) - k0;
                        let panel_words = (c1 - c0) * a.nt * bf16::TILE * 32;
                        let f = if c0 == s0 { first } else { next };
                        // SAFETY (packing, pointer arithmetic, calls): the view's indices stay in each buffer for
                        // every (m, n, k) in range; the pack areas hold what `pack_b`/`pack_a` write (np columns and
                        // mr rows of at most `chunk` steps); each kernel reads `c1 - c0` steps of its A rows and B
                        // panel and writes a whole tile block of the padded partials.
                        unsafe {
                            bf16_pack::pack_b(
                                bpack,
                                bbase.offset(k0 as isize * v.b.rows as isize),
                                v.b.rows,
                                v.b.cols,
                                0,
                                v.n,
                                depth,
                                a.nt,
                            );
                            for ib in 0..mp / mr {
                                let rows = (v.m - ib * mr).min(mr);
                                let asrc = abase
                                    .offset((ib * mr) as isize * v.a.rows as isize + k0 as isize * v.a.cols as isize);
                                bf16_pack::pack_a(apack, asrc, v.a.rows, v.a.cols, rows, depth, a.mr, c1 - c0);
                                for q in 0..np / nr {
                                    let c = part.add(ib * mr * np + q * nr);
                                    f(
                                        apack as *const f32,
                                        bpack.add(q * panel_words) as *const f32,
                                        c,
                                        c1 - c0,
                                        null(),
                                    );
                                }
                            }
                        }
                        c0 = c1;
                    }
                });
            }
        };
        pool::global().parallel_for_work(parts, work, &sum);
        // Add the partials and round: rows of C split over the threads.
        let out = PartialsPtr(cx.c);
        let bf16 = v.out == DType::BF16;
        let add = |lo: usize, hi: usize| {
            let (base, out) = (&base, &out);
            for m in lo..hi {
                for n in 0..v.n {
                    // SAFETY: (t, m, n) lies in the partials; (m, n) in C (of the view's M x N).
                    unsafe {
                        let mut x = *base.0.add(m * np + n);
                        for t in 1..parts {
                            x += *base.0.add(t * mp * np + m * np + n);
                        }
                        if bf16 {
                            *(out.0 as *mut u16).add(m * v.n + n) = kiln_jit::bf16::from_f32(x).to_bits();
                        } else {
                            *out.0.add(m * v.n + n) = x;
                        }
                    }
                }
            }
        };
        pool::global().parallel_for_work(v.m, v.m * v.n * parts, &add);
        drop(partials);
    }
}

/// Steps of 32 of K per packed chunk of the K-split AMX GEMM: as many as keep the chunk's B (all `np` columns) within
/// 1 MiB, at least one.
fn depth_chunk(np: usize) -> usize {
    ((1 << 20) / (np * 2 * bf16::KSTEP)).max(1)
}

/// Whether a K-blocked rectangle of `rows x cols` runs block of K outermost, over all its columns at once: where B
/// (`b_bytes`) is larger than L2, so it streams from L3 or memory, and the rows are few enough that every row
/// block's partial sums for the whole strip take at most a quarter of L2 and a block of K of the packed strip at
/// most half. Then B is read a block of K at a time in runs as long as the strip (4 KiB at 64 x 4096 x 4096 on two
/// threads) where column blocks of `nc` read runs of `2 * nc` bytes, too short for the hardware prefetchers: bf16
/// 64 x 4096 x 4096 with weights cycled from DRAM, four interleaved runs each, median 3.6 ms in blocks of 128
/// columns, 3.1 over the whole strip (K outermost in blocks of 512 columns 3.2, in blocks of 128 the same as
/// before). Where B stays in cache the sums' extra traffic is all it changes: the bf16 MLP step at batch 128 (its
/// 128 x 256 x 784 forward) 354-355 -> 363-364 µs.
fn k_outer_fits(b_bytes: usize, rows: usize, cols: usize, mr: usize, nr: usize, l2: usize) -> bool {
    let (rows, cols) = (rows.next_multiple_of(mr), cols.next_multiple_of(nr));
    b_bytes > l2 && rows * cols * 4 <= l2 / 4 && cols * bf16::K_BLOCK_STEPS * bf16::KSTEP * 2 <= l2 / 2
}

/// Table length of a K-blocked AMX GEMM: the four epilogue kernels (over finished sums), the first and later
/// K-block kernels, the tile configuration and release stubs.
pub(super) const BLOCKED_SLOTS: usize = 8;

/// A packed for every strip ([`CompiledGemm::pack_bf16_a_shared`]): the buffer and its first block.
pub(super) struct SharedA {
    buf: Option<HostBuffer>,
    at: *const u16,
}

impl Drop for SharedA {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            crate::host_pool::give(b);
        }
    }
}

// SAFETY: the strips only read the packed blocks, which the guard keeps alive and unchanged while they run.
unsafe impl Sync for SharedA {}

/// The partial buffers' base (or C's, or the shared packed A's), shared by the threads of one run, which touch
/// disjoint parts of it.
struct PartialsPtr(*mut f32);

// SAFETY: see the type's doc: each thread writes its own block (or rows), and the run holds the buffer's lock.
unsafe impl Sync for PartialsPtr {}

/// Bytes of packed A per thread above which `run_bf16_item` packs one row block at a time (again for every block of
/// B's columns) rather than all of the thread's rows once: 32 MiB, lowered by [`set_bf16_a_limit`].
static BF16_A_BYTES: AtomicU64 = AtomicU64::new(32 << 20);

/// Sets the packed-A limit of the bf16 GEMMs (tests lower it to run the one-block-at-a-time path on small
/// problems; both paths compute the same values).
#[doc(hidden)]
pub fn set_bf16_a_limit(bytes: u64) {
    BF16_A_BYTES.store(bytes, Ordering::Relaxed);
}

/// Bytes of packed A under which the column strips pack their own A rather than share one
/// ([`CompiledGemm::pack_bf16_a_shared`]): sharing costs one more launch of the pool's threads, which a small A's
/// packing does not repay (the bf16 MLP step at batch 32, whose A are 50 KB at most, three interleaved runs: 220-251
/// µs before the sharing, 228-264 with every A shared, 219-226 with this floor). 512 KiB, lowered by
/// [`set_bf16_shared_a_min`].
static SHARED_A_MIN_BYTES: AtomicU64 = AtomicU64::new(512 << 10);

/// Sets the size under which bf16 column strips pack their own A (tests lower it to share A on small problems;
/// both paths compute the same values).
#[doc(hidden)]
pub fn set_bf16_shared_a_min(bytes: u64) {
    SHARED_A_MIN_BYTES.store(bytes, Ordering::Relaxed);
}

/// The L2 size [`k_outer_fits`] plans with: the host's (`cpu::caches`), unless [`set_bf16_k_outer_l2`] set one.
static K_OUTER_L2: AtomicUsize = AtomicUsize::new(0);

fn k_outer_l2() -> usize {
    match K_OUTER_L2.load(Ordering::Relaxed) {
        0 => crate::cpu::caches::l2_bytes(),
        l2 => l2,
    }
}

/// Sets the L2 size the bf16 GEMMs plan their K-outermost order with (0: the host's): tests shrink it to run that
/// order on small problems; both orders compute the same values.
#[doc(hidden)]
pub fn set_bf16_k_outer_l2(bytes: usize) {
    K_OUTER_L2.store(bytes, Ordering::Relaxed);
}
