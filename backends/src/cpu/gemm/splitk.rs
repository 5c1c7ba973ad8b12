//! The split-K GEMV candidate (`splitk:avx2`): a few rows of A times a B whose rows are contiguous along N (a linear
//! layer's input gradient at a small batch, `dy @ W` with W stored N_out x N_in), the threads splitting K, that is
//! the rows of B, instead of the columns of C.
//!
//! Why split K: in a training step the same weight is read by the forward GEMV (threads split its rows: `dot.rs`),
//! read by this one, and rewritten by the optimizer's update (threads split its rows: elementwise chunks). A GEMV
//! splitting C's columns has each thread read half of every row, so half the weight's cache lines move between the
//! cores' L2 caches twice a step (read here by the other core, then written back by the update's owner): on a
//! 2-core Zen 4 with a 128 x 256 weight, the update was 5-9x slower after a column-split GEMV than after a K-split
//! one. Splitting K keeps each thread on the rows it owns in the other two kernels (both take contiguous halves,
//! caller first).
//!
//! Each part sums its rows of B into its own M x N partial (part 0 straight into C, the others into scratch); the
//! partials are then added into C in part order, so results do not depend on timing. The epilogue runs as the
//! backend's pass over C, as for the library and dot candidates.
//!
//! A part whose rows of B do not fit a core's cache (a GEMV over a large weight in memory) reads them front to back,
//! [`STREAM_ROWS`] rows at a time, each thread one contiguous half of B: the best order for DRAM (see there).
//!
//! Several rows of A (up to [`super::config::DOT_MAX_M`]) take each column strip of B in turn, so B comes from
//! memory once per part whatever the rows, and from L1 for every row after the first. Deliberately not done:
//! register tiles over several rows of A (each row reloads the strip from L1; its loads then outnumber its FMAs
//! slightly, which matters only where B is in cache).

use super::Ctx;
use super::config::SPLITK_STREAMED_PART_BYTES;
use super::tune::SendPtr as Ptr;
use kiln_jit::kernel::gemm::GemmView;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Fewest rows of B per part: below that a part's FMAs cost less than joining it.
const MIN_ROWS_PER_PART: usize = 16;

thread_local! {
    /// The partials of parts 1.., kept by the calling thread between calls (the replay path allocates nothing).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `C = A @ B` for `v` (`config::splitk_legal`: unbatched, B's rows contiguous along N), K split over the pool's
/// threads.
///
/// # Safety
/// As [`super::CompiledGemm::run`], and the host has AVX2 and FMA (`asm::host_supported`).
pub unsafe fn splitk_gemm(v: &GemmView, cx: &Ctx) {
    debug_assert!(super::config::splitk_legal(v));
    let pool = super::pool::global();
    let (m, n, k) = (v.m, v.n, v.k);
    let parts = pool.threads().min(k / MIN_ROWS_PER_PART).max(1);
    SCRATCH.with(|cell| {
        let mut own = Vec::new();
        let mut held = cell.try_borrow_mut();
        let scratch: &mut Vec<f32> = match held.as_deref_mut() {
            Ok(s) => s,
            Err(_) => &mut own,
        };
        let len = (parts - 1) * m * n;
        if scratch.len() < len {
            scratch.resize(len, 0.0);
        }
        // SAFETY: the offsets are within A and B (the view was read from the kernel's index math).
        let (a, b) = unsafe {
            (Ptr(cx.a.offset(v.a.offset as isize) as *mut f32), Ptr(cx.b.offset(v.b.offset as isize) as *mut f32))
        };
        let (c, s) = (Ptr(cx.c), Ptr(scratch.as_mut_ptr()));
        let part = |p0: usize, p1: usize| {
            for p in p0..p1 {
                let (k0, k1) = (p * k / parts, (p + 1) * k / parts);
                // SAFETY: part 0 writes C (M x N dense), part p >= 1 its own M x N slice of the scratch; every row
                // of A and B read lies in its buffer by the caller's contract.
                unsafe {
                    let out = if p == 0 { c.get() } else { s.get().add((p - 1) * m * n) };
                    let a = Rows { a: a.get(), rs: v.a.rows as isize, ks: v.a.cols as isize, m };
                    rows_times_b(a, b.get(), v.b.rows as isize, (k0, k1), n, out);
                }
            }
        };
        pool.parallel_for_work(parts, super::weight_pass_work(m, n, k), &part);
        if parts > 1 {
            let total = m * n;
            let strips = pool.threads().min(total.div_ceil(64)).max(1);
            let add = |s0: usize, s1: usize| {
                for strip in s0..s1 {
                    let (x0, x1) = (strip * total / strips, (strip + 1) * total / strips);
                    // SAFETY: strips cover disjoint ranges of C's M x N elements; the scratch holds parts - 1
                    // partials of that size, written above (the pool's join orders them before these reads).
                    unsafe {
                        for x in x0..x1 {
                            let mut sum = *c.get().add(x);
                            for p in 1..parts {
                                sum += *s.get().add((p - 1) * total + x);
                            }
                            *c.get().add(x) = sum;
                        }
                    }
                }
            };
            pool.parallel_for_work(strips, total * (parts - 1), &add);
        }
    });
}

/// Rows of B read together when B streams from memory. The column strips then sweep each block's rows side by side,
/// so a part reads its rows of B front to back, a few rows at a time, instead of one strip of every row per sweep
/// (the order for a B in cache: the accumulators stay in registers across all of K). Measured at 1 x 4096 x 4096, 2
/// threads, four weights cycled from DRAM, interleaved with a plain read of the same size (a scratch program of this
/// loop): 8 rows at 92-107 % of the read bandwidth, 4 rows 81-102 %, 16 rows 74-89 %, unblocked (strips over every
/// row) 37 %; the generated kernels' best column split read 81-101 % in the same runs.
const STREAM_ROWS: usize = 8;

/// The rows of A a part multiplies: `m` rows `rs` apart, each strided by `ks` along K.
#[derive(Clone, Copy)]
struct Rows {
    a: *const f32,
    rs: isize,
    ks: isize,
    m: usize,
}

/// `out[r][j] = Σ_{k0 <= t < k1} A[r, t] * B[t, j]` for `r < m`, `j < n` (`out` dense, rows `n` apart; B's rows `b_ks`
/// apart and contiguous): 96 columns at a time in twelve 8-lane accumulators, then 64, 32, 16, 8, then one by one; in
/// blocks of [`STREAM_ROWS`] rows of B when the part's rows do not fit a core's cache, each block's sums carried in
/// `out` to the next. Every row of A takes each column strip in turn before the next strip, so a strip of a block
/// comes from memory once and from L1 for the other rows: B streams from memory once per part, not once per row of
/// A. Every output's sum is one FMA chain along K in order whatever the blocks and the order of the rows (a partial
/// stored and reloaded is the same f32), so they change the memory order, not the result.
///
/// # Safety
/// `A[r, t]` (at `a + r * rs + t * ks`) and `B[t, 0..n]` readable for `r < m`, `t` in `k0..k1`; `out[0..m * n]`
/// writable; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_times_b(a: Rows, b: *const f32, b_ks: isize, (k0, k1): (usize, usize), n: usize, out: *mut f32) {
    // The cost model ranks the candidate by the same bound (`splitk_score`).
    let block = if (k1 - k0) * n * 4 > SPLITK_STREAMED_PART_BYTES { STREAM_ROWS } else { k1 - k0 };
    let mut t0 = k0;
    while t0 < k1 {
        let rows = (t0, (t0 + block).min(k1));
        // SAFETY: rows t0..t1 lie within k0..k1, the caller's contract.
        unsafe { block_times_b(a, b, b_ks, rows, t0 > k0, n, out) };
        t0 = rows.1;
    }
}

/// Rows `t0..t1` of B in [`rows_times_b`]: `out[r][j]` (`+=` when `carry`, else `=`) the block's sums, in column
/// strips, every row of A per strip.
///
/// # Safety
/// As [`rows_times_b`] for rows `t0..t1` of B.
#[target_feature(enable = "avx2,fma")]
unsafe fn block_times_b(
    a: Rows,
    b: *const f32,
    b_ks: isize,
    rows: (usize, usize),
    carry: bool,
    n: usize,
    out: *mut f32,
) {
    // SAFETY: row r of A lies at a + r * rs (the caller's contract); its outputs at out[r * n..].
    let row = |r: usize| unsafe { (a.a.offset(r as isize * a.rs), out.add(r * n)) };
    let mut j = 0;
    // SAFETY: each call reads columns j..j + 8 * NV <= n of the block's rows of B and one row of A, and reads and
    // writes that row's out[j..j + 8 * NV].
    unsafe {
        while j + 96 <= n {
            for r in 0..a.m {
                let (ar, or) = row(r);
                columns::<12>(ar, a.ks, b.add(j), b_ks, rows, carry, or.add(j));
            }
            j += 96;
        }
        for (nv, width) in [(8, 64), (4, 32), (2, 16), (1, 8)] {
            if j + width <= n {
                for r in 0..a.m {
                    let (ar, or) = row(r);
                    let (bj, oj) = (b.add(j), or.add(j));
                    match nv {
                        8 => columns::<8>(ar, a.ks, bj, b_ks, rows, carry, oj),
                        4 => columns::<4>(ar, a.ks, bj, b_ks, rows, carry, oj),
                        2 => columns::<2>(ar, a.ks, bj, b_ks, rows, carry, oj),
                        _ => columns::<1>(ar, a.ks, bj, b_ks, rows, carry, oj),
                    }
                }
                j += width;
            }
        }
        for r in 0..a.m {
            let (ar, or) = row(r);
            for col in j..n {
                let mut sum = if carry { *or.add(col) } else { 0f32 };
                for t in rows.0..rows.1 {
                    sum = (*b.offset(t as isize * b_ks + col as isize)).mul_add(*ar.offset(t as isize * a.ks), sum);
                }
                *or.add(col) = sum;
            }
        }
    }
}

/// `8 * NV` columns of [`block_times_b`]: one FMA chain per 8-lane column group, along K, starting from `out` when
/// `carry`.
///
/// # Safety
/// As [`block_times_b`] for columns `0..8 * NV`.
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<const NV: usize>(
    a: *const f32,
    a_ks: isize,
    b: *const f32,
    b_ks: isize,
    (k0, k1): (usize, usize),
    carry: bool,
    out: *mut f32,
) {
    // SAFETY: the loads read row t's columns 0..8 * NV, a[t] and (when carrying) out[0..8 * NV]; the stores write
    // out[0..8 * NV].
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NV];
        if carry {
            for (q, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_loadu_ps(out.add(8 * q));
            }
        }
        for t in k0..k1 {
            let x = _mm256_set1_ps(*a.offset(t as isize * a_ks));
            let row = b.offset(t as isize * b_ks);
            for (q, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * q)), x, *acc);
            }
        }
        for (q, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(8 * q), *acc);
        }
    }
}
