//! Packing A and B into the panel layouts the micro-kernels stream: A as MR-tall panels (for each k, MR consecutive
//! rows), B as NR-wide panels (for each k, NR consecutive columns), both zero-padded at ragged edges so a kernel
//! never needs a bounds check. Plain Rust: packing is O(M*K + K*N) against the kernel's O(M*N*K), and the
//! contiguous cases (a row-major B row, a transposed A column) become slice copies. One case is worth registers: a B
//! stored transposed (every linear layer's weight) is packed in 8 x 8 blocks transposed with AVX2 shuffles.

/// Packs rows `m0..m0 + mb` and `kb` k-steps of A (element (m, k) at `src + m*rs + k*ks`) into `dst`.
///
/// # Safety
/// `src` must be valid for every (m, k) in range, and `dst` for `ceil(mb / mr) * mr * kb` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pack_a(dst: *mut f32, src: *const f32, rs: i64, ks: i64, m0: usize, mb: usize, kb: usize, mr: usize) {
    let panels = mb.div_ceil(mr);
    let mut first = 0;
    if rs == 1 && ks != 1 && mb >= mr {
        // A stored transposed (a weight gradient's `dy.t()`): the full panels k-step by k-step.
        first = mb / mr;
        // SAFETY: rows m0 .. m0 + first * mr are in range for k < kb, per the caller; `dst` holds the panels; A
        // packing only runs for the generated kernels, which need AVX2.
        unsafe { copy_lines_to_panels(dst, mr, first, src.add(m0), ks, kb) };
    }
    for p in first..panels {
        // SAFETY: within `dst`'s `panels * mr * kb` floats.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(p * mr * kb), mr * kb) };
        let rows = (mb - p * mr).min(mr);
        if rows < mr {
            out.fill(0.0);
        }
        if rs == 1 && ks != 1 {
            // A stored transposed (a gradient's `x.t()`): the panel's rows are contiguous for each k.
            let base = (m0 + p * mr) as i64;
            for k in 0..kb {
                // SAFETY: rows base..base + rows are in range at this k, contiguous, per the caller.
                let col = unsafe { std::slice::from_raw_parts(src.offset((base + k as i64 * ks) as isize), rows) };
                out[k * mr..k * mr + rows].copy_from_slice(col);
            }
            continue;
        }
        // A row-major (contiguous along k): four rows (then two) by eight k-steps at a time, transposed in registers
        // (as B stored transposed, below); the row and k-steps left over one by one.
        let (quad_rows, full_k) = if ks == 1 { (rows / 2 * 2, kb / 8 * 8) } else { (0, 0) };
        let first = (m0 + p * mr) as i64;
        // SAFETY: rows first..first + quad_rows are in range for k < kb (the caller's contract), every position
        // written is within `out`; A packing only runs for the generated kernels, which need AVX2.
        unsafe { transpose_4x8_blocks(out.as_mut_ptr(), mr, src.offset((first * rs) as isize), rs, quad_rows, full_k) };
        for r in 0..rows {
            let m = (m0 + p * mr + r) as i64;
            // SAFETY: (m, k) is in range for every k < kb, per the caller.
            let row = unsafe { src.offset((m * rs) as isize) };
            if ks == 1 {
                // SAFETY: contiguous along k for kb elements.
                let s = unsafe { std::slice::from_raw_parts(row, kb) };
                let done = if r < quad_rows { full_k } else { 0 };
                for (k, &x) in s.iter().enumerate().skip(done) {
                    out[k * mr + r] = x;
                }
            } else {
                for k in 0..kb {
                    // SAFETY: as above.
                    out[k * mr + r] = unsafe { *row.offset((k as i64 * ks) as isize) };
                }
            }
        }
    }
}

/// Packs columns `n0..n0 + nb` and `kb` k-steps of B (element (k, n) at `src + k*ks + n*ns`) into `dst`.
///
/// # Safety
/// `src` must be valid for every (k, n) in range, and `dst` for `ceil(nb / nr) * nr * kb` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pack_b(dst: *mut f32, src: *const f32, ks: i64, ns: i64, n0: usize, nb: usize, kb: usize, nr: usize) {
    let panels = nb.div_ceil(nr);
    let mut first = 0;
    if ns == 1 && nb >= nr {
        // A row-major B: the full panels row by row.
        first = nb / nr;
        // SAFETY: (k, n0 .. n0 + first * nr) is in range for k < kb, per the caller; `dst` holds the panels; B
        // packing only runs for the generated kernels, which need AVX2.
        unsafe { copy_lines_to_panels(dst, nr, first, src.add(n0), ks, kb) };
    }
    for p in first..panels {
        // SAFETY: within `dst`'s `panels * nr * kb` floats.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.add(p * nr * kb), nr * kb) };
        let cols = (nb - p * nr).min(nr);
        let col0 = (n0 + p * nr) as i64;
        if ks == 1 && ns != 1 {
            // B stored transposed (a linear layer's weight): read each column contiguously along k, write strided
            // into the panel (which stays in L1), instead of gathering across rows.
            if cols < nr {
                out.fill(0.0);
            }
            // Eight columns by eight k-steps at a time, transposed in registers: the scalar loop below stored one
            // float per element, and on an MLP's 256 x 784 weight packing took about as long as the multiply
            // itself at batch 32. The rest (columns past a multiple of 8, the k-steps after the last 8) below.
            let (full_cols, full_k) = (cols / 8 * 8, kb / 8 * 8);
            // SAFETY: every column read lies in range for k < kb (the caller's contract) and every panel position
            // written is within `out`; this B packing only runs for the generated kernels, which need AVX2.
            unsafe { transpose_8x8_blocks(out.as_mut_ptr(), nr, src, col0, ns, full_cols, full_k) };
            for j in 0..cols {
                let first_k = if j < full_cols { full_k } else { 0 };
                // SAFETY: column col0 + j is in range for k < kb, contiguous along k, per the caller.
                let col = unsafe { std::slice::from_raw_parts(src.offset(((col0 + j as i64) * ns) as isize), kb) };
                for (k, &x) in col.iter().enumerate().skip(first_k) {
                    out[k * nr + j] = x;
                }
            }
            continue;
        }
        for k in 0..kb {
            let o = &mut out[k * nr..(k + 1) * nr];
            // SAFETY: (k, col0 + j) is in range for j < cols, per the caller.
            let row = unsafe { src.offset((k as i64 * ks + col0 * ns) as isize) };
            if ns == 1 {
                // SAFETY: contiguous along n for `cols` elements.
                o[..cols].copy_from_slice(unsafe { std::slice::from_raw_parts(row, cols) });
            } else {
                for (j, x) in o[..cols].iter_mut().enumerate() {
                    // SAFETY: as above.
                    *x = unsafe { *row.offset((j as i64 * ns) as isize) };
                }
            }
            o[cols..].fill(0.0);
        }
    }
}

/// Lines that [`copy_lines_to_panels`] prefetches ahead of the one it copies. Lines a page or more apart (a weight's
/// rows) defeat the hardware prefetchers, which stop at page boundaries, so each line's first misses were waited
/// for: packing a 64 x 4096 x 4096 GEMM's weight (f32, from memory, 2 threads, the kernels skipped) took 4.7 ms
/// without, 3.8 ms with 4 lines ahead, 3.9-4.0 with 8 and 4.2-4.3 with 16; the whole GEMM 10.7 -> 10.35 ms.
///
/// The prefetches go to L2 (`prefetcht1`), not L1. The likely reason that pays: a prefetch to L1 holds one of the
/// core's few line fill buffers until its line arrives from memory, and the copy's own loads wait for them. The
/// whole 64 x 4096 x 4096 GEMM, weights cycled from memory, three interleaved rounds (ms, fastest / median of 24
/// calls): to L1 9.88-9.92 / 9.99-10.03, to L2 9.52-9.64 / 9.66-9.72 (2 to 8 lines ahead alike); a 128 x 512 x 1024
/// weight gradient packing a B out of the caches 0.485-0.497 -> 0.475-0.492; B in cache (1024^3) the same.
const PREFETCH_LINES: i64 = 4;

/// Packs `panels` full panels of width `w` from `kb` lines (line `k` at `src + k * ks`, panel `p`'s elements at
/// `p * w` along it) into `dst` (element `j` of line `k` of panel `p` at `dst[(p * kb + k) * w + j]`): A stored
/// transposed (a line is a k-step across the rows, `w` = MR) and a row-major B (a line is a row of B, `w` = NR) both
/// pack this way. Line by line, so each line is one contiguous read across every panel; each panel's part is a
/// fixed-size copy (inline vector moves). Panel by panel with `copy_from_slice`, every 6 or 16 floats were a
/// `memmove` call and every line was fetched again for each panel: about 10 % of a batch-1024 MLP step's samples,
/// 3.8 % of a 1024^3 GEMM's.
///
/// # Safety
/// Every line must be valid for `panels * w` floats and `dst` for `panels * kb * w`; AVX2 present.
#[target_feature(enable = "avx2")]
unsafe fn copy_lines_to_panels(dst: *mut f32, w: usize, panels: usize, src: *const f32, ks: i64, kb: usize) {
    /// As the caller, with `W == w`.
    ///
    /// # Safety
    /// As for the caller.
    #[target_feature(enable = "avx2")]
    unsafe fn fixed<const W: usize>(dst: *mut f32, panels: usize, src: *const f32, ks: i64, kb: usize) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        for k in 0..kb {
            // SAFETY: line k holds `panels * W` readable floats, and line k of each panel `W` writable ones, per
            // the caller; unaligned accesses, as the buffers are only f32-aligned.
            unsafe {
                let line = src.offset((k as i64 * ks) as isize);
                let ahead = line.wrapping_offset((PREFETCH_LINES * ks) as isize) as *const i8;
                for p in 0..panels {
                    // The same bytes `PREFETCH_LINES` lines on (a prefetch never faults, so past the last line
                    // it is harmless).
                    for byte in (0..W * 4).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(p * W * 4 + byte));
                    }
                    let v = (line.add(p * W) as *const [f32; W]).read_unaligned();
                    (dst.add((p * kb + k) * W) as *mut [f32; W]).write_unaligned(v);
                }
            }
        }
    }
    // SAFETY (each arm): the caller's contract, with the arm's W equal to `w`.
    unsafe {
        match w {
            1 => fixed::<1>(dst, panels, src, ks, kb),
            2 => fixed::<2>(dst, panels, src, ks, kb),
            4 => fixed::<4>(dst, panels, src, ks, kb),
            6 => fixed::<6>(dst, panels, src, ks, kb),
            8 => fixed::<8>(dst, panels, src, ks, kb),
            16 => fixed::<16>(dst, panels, src, ks, kb),
            24 => fixed::<24>(dst, panels, src, ks, kb),
            32 => fixed::<32>(dst, panels, src, ks, kb),
            64 => fixed::<64>(dst, panels, src, ks, kb),
            _ => {
                for k in 0..kb {
                    let line = src.offset((k as i64 * ks) as isize);
                    for p in 0..panels {
                        std::ptr::copy_nonoverlapping(line.add(p * w), dst.add((p * kb + k) * w), w);
                    }
                }
            }
        }
    }
}

/// Packs columns `0..cols` (a multiple of 8) and k-steps `0..kb` (a multiple of 8) of a B stored transposed (column
/// `j` at `src + (col0 + j) * ns`, contiguous along k) into a panel of width `nr` at `out` (element (k, j) at
/// `out[k * nr + j]`), as 8 x 8 blocks transposed in registers.
///
/// # Safety
/// Every column read must be valid for `kb` floats and `out` for `kb * nr` floats, with `cols <= nr`; AVX2 present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_8x8_blocks(
    out: *mut f32,
    nr: usize,
    src: *const f32,
    col0: i64,
    ns: i64,
    cols: usize,
    kb: usize,
) {
    use std::arch::x86_64::*;
    for j in (0..cols).step_by(8) {
        // SAFETY: columns col0 + j .. + 8 are in range (j + 8 <= cols), per the caller.
        let column = |q: usize| unsafe { src.offset(((col0 + (j + q) as i64) * ns) as isize) };
        let cs = [0, 1, 2, 3, 4, 5, 6, 7].map(column);
        for k in (0..kb).step_by(8) {
            // SAFETY: k + 8 <= kb floats of each column, and rows k..k + 8 of the panel at columns j..j + 8.
            unsafe {
                let r = cs.map(|c| _mm256_loadu_ps(c.add(k)));
                let u = quad_lanes([r[0], r[1], r[2], r[3]]);
                let v = quad_lanes([r[4], r[5], r[6], r[7]]);
                // Row kk of the block: k = kk of the first quad's lanes beside k = kk of the second's.
                let rows = [
                    _mm256_permute2f128_ps::<0x20>(u[0], v[0]),
                    _mm256_permute2f128_ps::<0x20>(u[1], v[1]),
                    _mm256_permute2f128_ps::<0x20>(u[2], v[2]),
                    _mm256_permute2f128_ps::<0x20>(u[3], v[3]),
                    _mm256_permute2f128_ps::<0x31>(u[0], v[0]),
                    _mm256_permute2f128_ps::<0x31>(u[1], v[1]),
                    _mm256_permute2f128_ps::<0x31>(u[2], v[2]),
                    _mm256_permute2f128_ps::<0x31>(u[3], v[3]),
                ];
                for (kk, row) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(out.add((k + kk) * nr + j), row);
                }
            }
        }
    }
}

/// Packs rows `0..rows` (a multiple of 2) and k-steps `0..kb` (a multiple of 8) of a row-major A (row `r` at
/// `src + r * rs`, contiguous along k) into a panel of height `mr` at `out` (element (r, k) at `out[k * mr + r]`), as
/// 4 x 8 blocks transposed in registers, and a 2 x 8 block per k-block for the last two rows of a 6-row panel.
///
/// # Safety
/// Every row read must be valid for `kb` floats and `out` for `kb * mr` floats, with `rows <= mr`; AVX2 present.
#[target_feature(enable = "avx2")]
unsafe fn transpose_4x8_blocks(out: *mut f32, mr: usize, src: *const f32, rs: i64, rows: usize, kb: usize) {
    use std::arch::x86_64::*;
    if rows % 4 == 2 {
        let r0 = rows - 2;
        // SAFETY: rows r0 and r0 + 1 are in range, per the caller.
        let (p0, p1) = unsafe { (src.offset((r0 as i64 * rs) as isize), src.offset(((r0 + 1) as i64 * rs) as isize)) };
        for k in (0..kb).step_by(8) {
            // SAFETY: k + 8 <= kb floats of both rows, and panel rows k..k + 8 at positions r0, r0 + 1.
            unsafe {
                let (a, b) = (_mm256_loadu_ps(p0.add(k)), _mm256_loadu_ps(p1.add(k)));
                // Pairs (row r0, row r0 + 1) for k = 0, 1 | 4, 5 and k = 2, 3 | 6, 7 of this block.
                let (lo, hi) = (_mm256_castps_pd(_mm256_unpacklo_ps(a, b)), _mm256_castps_pd(_mm256_unpackhi_ps(a, b)));
                for (v, first) in [(lo, 0), (hi, 2)] {
                    let (l, h) = (_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
                    let at = |kk: usize| out.add((k + kk) * mr + r0) as *mut f64;
                    _mm_storel_pd(at(first), l);
                    _mm_storeh_pd(at(first + 1), l);
                    _mm_storel_pd(at(first + 4), h);
                    _mm_storeh_pd(at(first + 5), h);
                }
            }
        }
    }
    for r0 in (0..rows / 4 * 4).step_by(4) {
        // SAFETY: rows r0..r0 + 4 are in range (r0 + 4 <= rows), per the caller.
        let rp = [0, 1, 2, 3].map(|q| unsafe { src.offset(((r0 + q) as i64 * rs) as isize) });
        for k in (0..kb).step_by(8) {
            // SAFETY: k + 8 <= kb floats of each row, and panel rows k..k + 8 at positions r0..r0 + 4.
            unsafe {
                let u = quad_lanes(rp.map(|p| _mm256_loadu_ps(p.add(k))));
                for (kk, v) in u.into_iter().enumerate() {
                    _mm_storeu_ps(out.add((k + kk) * mr + r0), _mm256_castps256_ps128(v));
                    _mm_storeu_ps(out.add((k + kk + 4) * mr + r0), _mm256_extractf128_ps::<1>(v));
                }
            }
        }
    }
}

/// Four 8-float vectors `r[q]` (element k of line q) regrouped by k: vector i holds the four lines' elements k = i
/// in its low half and k = i + 4 in its high half.
#[target_feature(enable = "avx2")]
fn quad_lanes(r: [std::arch::x86_64::__m256; 4]) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
    ]
}
