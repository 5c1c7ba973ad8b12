//! The dot-product GEMM candidate (`dot:avx2`): each output `C[m, n]` is the dot product of row `m` of A and column
//! `n` of B, both contiguous along K. That is the layout of a linear layer's forward at a small batch (`x @ W^T`, W
//! stored N x K), where the generated micro-kernels would pack all of W on every call (B's columns are its rows)
//! and the library's GEMV kernel took about 1.5x as long as these loops (a 256 x 784 weight in L2, one thread).
//!
//! Four columns of B at a time against three rows of A: twelve 8-lane accumulators, seven loads per twelve FMAs, so
//! the loop is bound by the FMA units, not by loads (a row alone: two accumulators per column, eight FMA chains;
//! the 3 x 4 tiles made 8 x 256 x 784 about 1.5x faster). Threads take strips of columns. The epilogue runs as the
//! backend's pass over C, as for the library candidate. Why it stops at a few rows: `config::DOT_MAX_M`.
//!
//! Written with `std::arch` intrinsics: the loop is fixed (nothing to specialize at run time that the tuner could
//! choose), so rustc's code is as good as generated code would be, and is checked like every candidate
//! (`tests/gemm.rs` forces it on every shape).

use super::Ctx;
use super::tune::SendPtr as Ptr;
use kiln_jit::kernel::gemm::GemmView;
use std::arch::x86_64::*;

/// `C = A @ B` for `v` (unbatched, A's rows and B's columns contiguous along K: `config::dot_legal`), in column
/// strips over the pool's threads.
///
/// # Safety
/// As [`super::CompiledGemm::run`], and the host has AVX2 and FMA (`asm::host_supported`).
pub unsafe fn dot_gemm(v: &GemmView, cx: &Ctx) {
    debug_assert!(super::config::dot_legal(v));
    // SAFETY: the offsets are within A and B (the view was read from the kernel's index math).
    let (a, b) = unsafe {
        (Ptr(cx.a.offset(v.a.offset as isize) as *mut f32), Ptr(cx.b.offset(v.b.offset as isize) as *mut f32))
    };
    let c = Ptr(cx.c);
    let (m, n, k) = (v.m, v.n, v.k);
    let (a_rs, b_ns) = (v.a.rows as isize, v.b.cols as isize);
    let blocks = n.div_ceil(4);
    let strips = super::pool::global().threads().min(blocks).max(1);
    let run = |s: usize, e: usize| {
        for strip in s..e {
            // Strip bounds on multiples of 4 columns, so every strip but the last runs whole blocks.
            let (j0, j1) = ((strip * blocks / strips * 4).min(n), ((strip + 1) * blocks / strips * 4).min(n));
            // SAFETY: the caller's contract: every (row, k) of A and (k, column) of B lies in its buffer, C is
            // M x N dense and written here only, each strip its own columns.
            unsafe { strip_cols(a.get(), a_rs, b.get(), b_ns, c.get(), (m, n, k), j0, j1) };
        }
    };
    super::pool::global().parallel_for_work(strips, super::weight_pass_work(m, n, k), &run);
}

/// Columns `j0..j1` of C, every row: four columns at a time for three rows at a time (the rows left over one by one,
/// as are the columns left after blocks of four).
///
/// # Safety
/// As [`dot_gemm`].
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn strip_cols(
    a: *const f32,
    a_rs: isize,
    b: *const f32,
    b_ns: isize,
    c: *mut f32,
    (m, n, k): (usize, usize, usize),
    j0: usize,
    j1: usize,
) {
    let mut j = j0;
    while j < j1 {
        let cols = (j1 - j).min(4);
        // Twelve accumulators, seven loads per twelve FMAs.
        let tiled = if cols == 4 { m / 3 * 3 } else { 0 };
        for row in (0..tiled).step_by(3) {
            // SAFETY: row + 2 < m and j + 4 <= n: in bounds by the caller's contract.
            unsafe {
                let x = [0, 1, 2].map(|r| a.offset((row + r) as isize * a_rs));
                let w = [0, 1, 2, 3].map(|q| b.offset((j + q) as isize * b_ns));
                let s = dot3x4(x, w, k);
                for (r, sums) in s.iter().enumerate() {
                    std::ptr::copy_nonoverlapping(sums.as_ptr(), c.add((row + r) * n + j), 4);
                }
            }
        }
        for row in tiled..m {
            // SAFETY: row < m and j + cols <= n: in bounds by the caller's contract.
            unsafe {
                let x = a.offset(row as isize * a_rs);
                let out = c.add(row * n + j);
                if cols == 4 {
                    let w = [0, 1, 2, 3].map(|q| b.offset((j + q) as isize * b_ns));
                    let s = dot4(x, w, k);
                    std::ptr::copy_nonoverlapping(s.as_ptr(), out, 4);
                } else {
                    for q in 0..cols {
                        *out.add(q) = dot1(x, b.offset((j + q) as isize * b_ns), k);
                    }
                }
            }
        }
        j += cols;
    }
}

/// Four dot products of `x` with `w[0..4]`, each `k` long.
///
/// # Safety
/// `x` and each `w[q]` point at `k` readable floats; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4(x: *const f32, w: [*const f32; 4], k: usize) -> [f32; 4] {
    // SAFETY: every load below reads within the first `k` floats of `x` or `w[q]`.
    unsafe {
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 16 <= k {
            let (x0, x1) = (_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(x.add(i + 8)));
            for q in 0..4 {
                lo[q] = _mm256_fmadd_ps(_mm256_loadu_ps(w[q].add(i)), x0, lo[q]);
                hi[q] = _mm256_fmadd_ps(_mm256_loadu_ps(w[q].add(i + 8)), x1, hi[q]);
            }
            i += 16;
        }
        if i + 8 <= k {
            let x0 = _mm256_loadu_ps(x.add(i));
            for q in 0..4 {
                lo[q] = _mm256_fmadd_ps(_mm256_loadu_ps(w[q].add(i)), x0, lo[q]);
            }
            i += 8;
        }
        let mut out = [0f32; 4];
        for q in 0..4 {
            out[q] = hsum(_mm256_add_ps(lo[q], hi[q]));
            for t in i..k {
                out[q] = (*w[q].add(t)).mul_add(*x.add(t), out[q]);
            }
        }
        out
    }
}

/// The twelve dot products of `x[0..3]` with `w[0..4]`, each `k` long: one 8-lane accumulator per pair.
///
/// # Safety
/// Each `x[r]` and `w[q]` points at `k` readable floats; AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot3x4(x: [*const f32; 3], w: [*const f32; 4], k: usize) -> [[f32; 4]; 3] {
    // SAFETY: every load below reads within the first `k` floats of an `x[r]` or `w[q]`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 4]; 3];
        let mut i = 0;
        while i + 8 <= k {
            let xs = x.map(|p| _mm256_loadu_ps(p.add(i)));
            for q in 0..4 {
                let wq = _mm256_loadu_ps(w[q].add(i));
                for r in 0..3 {
                    acc[r][q] = _mm256_fmadd_ps(wq, xs[r], acc[r][q]);
                }
            }
            i += 8;
        }
        let mut out = [[0f32; 4]; 3];
        for r in 0..3 {
            for q in 0..4 {
                out[r][q] = hsum(acc[r][q]);
                for t in i..k {
                    out[r][q] = (*w[q].add(t)).mul_add(*x[r].add(t), out[r][q]);
                }
            }
        }
        out
    }
}

/// One dot product (the columns left after blocks of four).
///
/// # Safety
/// As [`dot4`].
#[target_feature(enable = "avx2,fma")]
unsafe fn dot1(x: *const f32, w: *const f32, k: usize) -> f32 {
    // SAFETY: every load below reads within the first `k` floats of `x` or `w`.
    unsafe {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= k {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(x.add(i)), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i + 8)), _mm256_loadu_ps(x.add(i + 8)), hi);
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(lo, hi));
        for t in i..k {
            s = (*w.add(t)).mul_add(*x.add(t), s);
        }
        s
    }
}

/// The sum of the eight lanes of `v`.
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}
