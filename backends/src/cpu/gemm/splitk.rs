//! The split-K GEMV candidate (`splitk:avx2`): a few rows of A times a B whose rows are contiguous along N (a linear
//! layer's input gradient at a small batch, `dy @ W` with W stored N_out x N_in), the threads splitting K, that is
//! the rows of B, instead of the columns of C.
//!
//! Why split K: in a training step the same weight is read by the forward GEMV (threads split its rows: `dot.rs`),
//! read by this one, and rewritten by the optimizer's update (threads split its rows: elementwise chunks). A GEMV
//! splitting C's columns has each thread read half of every row, so half the weight's cache lines move between the
//! cores' L2 caches twice a step (read here by the other core, then written back by the update's owner). A scratch C
//! program of exactly that sequence on this 2-core Zen 4 (a 128 x 256 weight, 2 threads): the update took 4.9-7.3 µs
//! after a column-split GEMV and 0.8-1.0 µs after a K-split one. Splitting K keeps each thread on the rows it owns in
//! the other two kernels (both take contiguous halves, caller first).
//!
//! Each part sums its rows of B into its own M x N partial (part 0 straight into C, the others into scratch); the
//! partials are then added into C in part order, so results do not depend on timing. The epilogue runs as the
//! backend's pass over C, as for the library and dot candidates.
//!
//! Deliberately not done: register tiles over several rows of A (each row streams the part's rows of B once: right
//! for the one or two rows it is for; at eight rows the packing kernels are faster and win the race).

use super::Ctx;
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
                    for row in 0..m {
                        let a_row = a.get().offset(row as isize * v.a.rows as isize);
                        rows_times_b(
                            a_row,
                            v.a.cols as isize,
                            b.get(),
                            v.b.rows as isize,
                            (k0, k1),
                            n,
                            out.add(row * n),
                        );
                    }
                }
            }
        };
        pool.parallel_for_work(parts, m * n * k, &part);
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

/// `out[j] = Σ_{k0 <= t < k1} a[t] * B[t, j]` for `j < n` (`a` strided by `a_ks`, B's rows `b_ks` apart and
/// contiguous): 96 columns at a time in twelve 8-lane accumulators, then 64, 32, 16, 8, then one by one.
///
/// # Safety
/// `a[t * a_ks]` and `B[t, 0..n]` readable for `t` in `k0..k1`, `out[0..n]` writable; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_times_b(
    a: *const f32,
    a_ks: isize,
    b: *const f32,
    b_ks: isize,
    (k0, k1): (usize, usize),
    n: usize,
    out: *mut f32,
) {
    let mut j = 0;
    // SAFETY: each call reads columns j..j + 8 * NV < n of rows k0..k1 and writes out[j..j + 8 * NV].
    unsafe {
        while j + 96 <= n {
            columns::<12>(a, a_ks, b.add(j), b_ks, (k0, k1), out.add(j));
            j += 96;
        }
        for (nv, width) in [(8, 64), (4, 32), (2, 16), (1, 8)] {
            if j + width <= n {
                match nv {
                    8 => columns::<8>(a, a_ks, b.add(j), b_ks, (k0, k1), out.add(j)),
                    4 => columns::<4>(a, a_ks, b.add(j), b_ks, (k0, k1), out.add(j)),
                    2 => columns::<2>(a, a_ks, b.add(j), b_ks, (k0, k1), out.add(j)),
                    _ => columns::<1>(a, a_ks, b.add(j), b_ks, (k0, k1), out.add(j)),
                }
                j += width;
            }
        }
        for col in j..n {
            let mut sum = 0f32;
            for t in k0..k1 {
                sum = (*b.offset(t as isize * b_ks + col as isize)).mul_add(*a.offset(t as isize * a_ks), sum);
            }
            *out.add(col) = sum;
        }
    }
}

/// `8 * NV` columns of [`rows_times_b`]: one FMA chain per 8-lane column group, along K.
///
/// # Safety
/// As [`rows_times_b`] for columns `0..8 * NV`.
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<const NV: usize>(
    a: *const f32,
    a_ks: isize,
    b: *const f32,
    b_ks: isize,
    (k0, k1): (usize, usize),
    out: *mut f32,
) {
    // SAFETY: the loads read row t's columns 0..8 * NV and a[t]; the stores write out[0..8 * NV].
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NV];
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
