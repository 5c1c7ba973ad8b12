//! Packing for the bf16 GEMM kernels (`bf16`): B into the AMX tiles' pair layout (a 16 x 16 tile of dword pairs
//! `(B[2p, j], B[2p + 1, j])`), A into rows of 64 bytes, step after step. Rust with AVX-512 intrinsics where the
//! host has them (a row-major B's pairs interleaved two rows at a time, a transposed one's gathered, a transposed
//! A's scattered), scalar code for the edges. `bf16_drive` calls these; the kernels read what they write.

use super::bf16::{B_TILE_BYTES, KSTEP, TILE, unit_ready};
use super::config::Bf16Unit;

/// Rows of B that packing prefetches ahead of the pair it reads.
const PREFETCH_ROWS: i64 = 8;

/// Packs columns `n0..n0 + cols` of bf16 matrix B (element `(k, n)` at `b[k * rs + n * cs]`, `k < depth`) into
/// panels of `16 * nt` columns, each `steps` steps of `nt` tiles (1 KiB each: row `p` holds the pairs
/// `(B[32s + 2p, j], B[32s + 2p + 1, j])` of the tile's 16 columns), zeros past `depth` and past `cols`.
///
/// B is walked two rows at a time across the whole block: each row is read front to back (a K x N weight then
/// streams from memory), and each pair of rows fills one row of every tile of the step.
///
/// # Safety
/// `dst` must hold `cols.div_ceil(16 * nt) * steps * nt * 512` u16, and every `(k, n)` in range must be in `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pack_b(dst: *mut u16, b: *const u16, rs: i64, cs: i64, n0: usize, cols: usize, depth: usize, nt: usize) {
    let steps = depth.div_ceil(KSTEP);
    let tile_words = B_TILE_BYTES / 2;
    // Every tile of the last panel, also those wholly past `cols` (zeros).
    let tiles = cols.div_ceil(TILE * nt) * nt;
    let vector = unit_ready(Bf16Unit::Avx512Bf16);
    // Row-major B: two rows interleaved; B stored N x K (a linear layer's weight): each pair is a dword of a row of
    // B^T, gathered across 16 of them.
    let (by_rows, by_cols) = (vector && cs == 1, vector && rs == 1 && cs < (1 << 26));
    for s in 0..steps {
        for p in 0..TILE {
            let k = s * KSTEP + 2 * p;
            // SAFETY: within the area the caller sized (step s, row p of every tile).
            let row0 = unsafe { dst.add(s * nt * tile_words + p * 32) };
            let full = if (by_rows || by_cols) && k + 1 < depth { cols / TILE } else { 0 };
            if full > 0 {
                // SAFETY: rows k and k + 1 hold `cols` elements from column n0 (the caller's bounds).
                let src = unsafe { b.offset((k as i64 * rs + n0 as i64 * cs) as isize) };
                // SAFETY: as above (the columns' pairs at k lie in B).
                unsafe {
                    if by_rows {
                        pair_rows_avx512(row0, steps, nt, full, src, rs)
                    } else {
                        pair_cols_avx512(row0, steps, nt, full, src, cs)
                    }
                };
            }
            for t in full..tiles {
                let width = cols.saturating_sub(t * TILE).min(TILE);
                // SAFETY: as above; the scalar path reads only (k', n) with k' < depth and n < n0 + cols.
                unsafe { pair_row_scalar(row0.add(tile_at(t, steps, nt)), b, rs, cs, k, depth, n0 + t * TILE, width) };
            }
        }
    }
}

/// The `vpermt2w` indices that interleave two vectors of 16 words (`a`, then `b` as words 32..): word i of the
/// result is word i/2 of `a` (i even) or of `b` (i odd): the pairs of two rows of K.
const PAIR_WORDS: [u16; 32] = {
    let mut w = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        w[i] = (i / 2 + if i % 2 == 1 { 32 } else { 0 }) as u16;
        i += 1;
    }
    w
};

/// Words from tile 0 of a step's row to tile `t` (t = panel * nt + j) of the same step and row: panel * steps * nt
/// + j tiles.
fn tile_at(t: usize, steps: usize, nt: usize) -> usize {
    (t / nt * steps * nt + t % nt) * (B_TILE_BYTES / 2)
}

/// `(t, tile_at(t))` for the first `tiles` tiles of a row, walked without a division (it sits in packing's inner
/// loop).
fn tile_rows(steps: usize, nt: usize, tiles: usize) -> impl Iterator<Item = (usize, usize)> {
    let (tile_words, panel_words) = (B_TILE_BYTES / 2, steps * nt * (B_TILE_BYTES / 2));
    (0..tiles).scan((0usize, 0usize), move |(panel_at, j), t| {
        let at = *panel_at + *j * tile_words;
        *j += 1;
        if *j == nt {
            *j = 0;
            *panel_at += panel_words;
        }
        Some((t, at))
    })
}

/// One tile row from any strides: the pairs of rows `k`, `k + 1` (zeros from `depth`) over `width` columns from
/// `n`, zeros past them.
#[allow(clippy::too_many_arguments)]
unsafe fn pair_row_scalar(
    t: *mut u16,
    b: *const u16,
    rs: i64,
    cs: i64,
    k: usize,
    depth: usize,
    n: usize,
    width: usize,
) {
    for j in 0..TILE {
        for h in 0..2 {
            let x = if j < width && k + h < depth {
                // SAFETY: (k + h, n + j) is in range (the caller's bounds).
                unsafe { *b.offset(((k + h) as i64 * rs + (n + j) as i64 * cs) as isize) }
            } else {
                0
            };
            // SAFETY: a tile row holds 32 words.
            unsafe { *t.add(2 * j + h) = x };
        }
    }
}

/// Row `p` of the first `tiles` full tiles of a step from row-major B (`src` at row 2p, column 0 of the block):
/// rows `2p` and `2p + 1` interleaved word by word, 16 columns per tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair_rows_avx512(row0: *mut u16, steps: usize, nt: usize, tiles: usize, src: *const u16, rs: i64) {
    use std::arch::x86_64::*;
    // SAFETY: `PAIR_WORDS` is 64 bytes.
    let idx = unsafe { _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _) };
    for (t, at) in tile_rows(steps, nt, tiles) {
        if t % 2 == 0 {
            // The rows PREFETCH_ROWS ahead, one cache line (two tiles' columns) at a time: B's rows are a page or
            // more apart, where the hardware prefetchers do not follow, and each pair of rows is a short run.
            let ahead = src.wrapping_offset((PREFETCH_ROWS * rs) as isize).wrapping_add(16 * t);
            // A prefetch does not fault, whatever the address (safe to call inside this function's features).
            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_offset(rs as isize) as *const i8);
        }
        // SAFETY: both rows hold 16 words at column 16 t (the caller's bounds); the tile row is 64 bytes.
        unsafe {
            let even = _mm512_castsi256_si512(_mm256_loadu_si256(src.add(16 * t) as *const _));
            let odd = _mm512_castsi256_si512(_mm256_loadu_si256(src.offset(rs as isize).add(16 * t) as *const _));
            _mm512_storeu_si512(row0.add(at) as *mut _, _mm512_permutex2var_epi16(even, idx, odd));
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_rows_avx512(_: *mut u16, _: usize, _: usize, _: usize, _: *const u16, _: i64) {
    unreachable!("AMX kernels run only on x86-64")
}

/// As [`pair_rows_avx512`] for B stored N x K (`src` at row k of column 0 of the block, columns `cs` words apart,
/// pairs contiguous): each tile row is 16 dwords gathered across 16 columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pair_cols_avx512(row0: *mut u16, steps: usize, nt: usize, tiles: usize, src: *const u16, cs: i64) {
    use std::arch::x86_64::*;
    let offsets: [i32; 16] = std::array::from_fn(|j| j as i32 * cs as i32 * 2);
    // SAFETY: `offsets` is 64 bytes.
    let vindex = unsafe { _mm512_loadu_si512(offsets.as_ptr() as *const _) };
    for (t, at) in tile_rows(steps, nt, tiles) {
        // SAFETY: the 16 columns from 16 t hold the pair at k (the caller's bounds); the tile row is 64 bytes.
        unsafe {
            let base = src.offset((16 * t) as isize * cs as isize) as *const u8;
            let pairs = _mm512_i32gather_epi32::<1>(vindex, base as *const _);
            _mm512_storeu_si512(row0.add(at) as *mut _, pairs);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_cols_avx512(_: *mut u16, _: usize, _: usize, _: usize, _: *const u16, _: i64) {
    unreachable!("AMX kernels run only on x86-64")
}

/// Packs `rows` rows of bf16 matrix A (element `(m, k)` at `a[m * rs + k * cs]`, `k < depth`) for the kernels, `mr`
/// rows (zeros past `rows`) by `steps` steps of 32 (zeros past `depth`), step by step: step `s` holds row `m`'s 32
/// elements at words `(s * mr + m) * 32`, so a tile is 1 KiB of contiguous 64-byte rows (`A_ROW_BYTES` 64, a step 64 *
/// mr). Rows read in place a power of two apart share cache sets; packed ones do not.
///
/// # Safety
/// `dst` must hold `mr * steps * 32` u16; every `(m, k)` in range must be in `a`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pack_a(
    dst: *mut u16,
    a: *const u16,
    rs: i64,
    cs: i64,
    rows: usize,
    depth: usize,
    mr: usize,
    steps: usize,
) {
    // SAFETY: the caller sized `dst`.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, mr * steps * KSTEP) };
    // A stored K x M (a weight gradient's `x^T`): up to 16 rows at a time, each pair of K's rows interleaved and
    // scattered into the rows' dwords. Every row of the block, whatever `mr`: the AVX512-BF16 kernels' 6- and
    // 14-row blocks had gathered their rows element by element below, ~13 % of the bf16 GPT step's time.
    let by_cols = rs == 1 && unit_ready(Bf16Unit::Avx512Bf16);
    let vector_rows = if by_cols { rows } else { 0 };
    for g in (0..vector_rows).step_by(TILE) {
        // SAFETY: rows g..g + 16 (those below `rows`) of `dst` and of A (the caller's bounds).
        unsafe {
            pair_rows_scattered(dst.add(g * KSTEP), a.add(g), cs, depth, mr, steps, (rows - g).min(TILE));
        }
    }
    for m in vector_rows..mr {
        for s in 0..steps {
            let row = &mut out[(s * mr + m) * KSTEP..][..KSTEP];
            let k0 = s * KSTEP;
            if m >= rows || k0 >= depth {
                row.fill(0);
                continue;
            }
            let n = (depth - k0).min(KSTEP);
            if cs == 1 && n == KSTEP {
                // A whole step, one fixed-size copy the compiler inlines rather than a `memmove` call per 64 bytes
                // (the time is the reads from memory either way: bf16 2048^3 measured the same).
                // SAFETY: row m holds `depth` contiguous elements (the caller's bounds).
                let src = unsafe { &*(a.offset((m as i64 * rs + k0 as i64) as isize) as *const [u16; KSTEP]) };
                row.copy_from_slice(src);
                continue;
            }
            if cs == 1 {
                // SAFETY: row m holds `depth` contiguous elements (the caller's bounds).
                let src = unsafe { std::slice::from_raw_parts(a.offset((m as i64 * rs + k0 as i64) as isize), n) };
                row[..n].copy_from_slice(src);
            } else {
                for (kk, x) in row[..n].iter_mut().enumerate() {
                    // SAFETY: (m, k0 + kk) is in range (the caller's bounds).
                    *x = unsafe { *a.offset((m as i64 * rs + (k0 + kk) as i64 * cs) as isize) };
                }
            }
            row[n..].fill(0);
        }
    }
}

/// `n` (1 to 16) rows of packed A (`dst` at the first of them in the step-major layout of [`pack_a`], `mr` rows a
/// step) from A stored K x M (`a` at the first row, element `(m, k)` at `a[m + k * cs]`): for each pair of K, rows k
/// and k + 1 (`n` contiguous words each, read by masked loads) interleaved into dwords, one per row, zeros past
/// `depth`; a step's 16 such vectors are then transposed in registers ([`transpose_16x16`]) into the rows' 64-byte
/// runs, the first `n` stored whole. (Scattering each vector's dwords to the rows instead, `vpscatterdd`, took about
/// twice as long: a scatter is 16 stores.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair_rows_scattered(dst: *mut u16, a: *const u16, cs: i64, depth: usize, mr: usize, steps: usize, n: usize) {
    use std::arch::x86_64::*;
    debug_assert!((1..=TILE).contains(&n) && n <= mr);
    // SAFETY: `PAIR_WORDS` is 64 bytes.
    let idx = unsafe { _mm512_loadu_si512(PAIR_WORDS.as_ptr() as *const _) };
    let mask: __mmask32 = (1u32 << n) - 1;
    for s in 0..steps {
        let pairs: [__m512i; TILE] = std::array::from_fn(|p| {
            let k = s * KSTEP + 2 * p;
            // SAFETY: rows k and k + 1, when below `depth`, hold `n` words (the caller's bounds); the masked load
            // reads no others.
            let row = |k: usize| unsafe {
                if k < depth {
                    _mm512_maskz_loadu_epi16(mask, a.offset(k as isize * cs as isize) as *const _)
                } else {
                    _mm512_setzero_si512()
                }
            };
            _mm512_permutex2var_epi16(row(k), idx, row(k + 1))
        });
        for (m, run) in transpose_16x16(pairs).into_iter().take(n).enumerate() {
            // SAFETY: row m of step s, 32 words, lies within `dst`'s `mr * steps * 32` words (m < n <= mr).
            unsafe { _mm512_storeu_si512(dst.add((s * mr + m) * KSTEP) as *mut _, run) };
        }
    }
}

/// The 16 x 16 dword transpose: dword j of result i is dword i of `r[j]`. Interleaved dwords, then quadwords, within
/// each 128-bit lane, then the lanes themselves in two rounds of `vshufi32x4` (64 shuffles in all).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose_16x16(r: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved, columns 4L, 4L + 1 | 4L + 2, 4L + 3 of each lane L.
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (x, y) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 { _mm512_unpacklo_epi32(x, y) } else { _mm512_unpackhi_epi32(x, y) }
    });
    // u[4g + c]: rows 4g..4g + 4 at column 4L + c of each lane L.
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (g, c) = (i / 4, i % 4);
        let (x, y) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
        if c % 2 == 0 { _mm512_unpacklo_epi64(x, y) } else { _mm512_unpackhi_epi64(x, y) }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        // Lanes 0, 1 (x0) and 2, 3 (x1) of the groups of rows 0..8, then of rows 8..16 (x2, x3).
        let x0 = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
        let x1 = _mm512_shuffle_i32x4::<0xEE>(u[c], u[4 + c]);
        let x2 = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
        let x3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_i32x4::<0x88>(x0, x2);
        out[4 + c] = _mm512_shuffle_i32x4::<0xDD>(x0, x2);
        out[8 + c] = _mm512_shuffle_i32x4::<0x88>(x1, x3);
        out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(x1, x3);
    }
    out
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_rows_scattered(_: *mut u16, _: *const u16, _: i64, _: usize, _: usize, _: usize, _: usize) {
    unreachable!("AMX kernels run only on x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed A holds row m's K elements step by step, then zeros, `mr` rows (zeros past `rows`), from A stored M x K
    /// or K x M.
    #[test]
    fn packed_a_is_rows_of_k() {
        // A 48-row block of 37 rows (whole groups of 16, then a ragged one), and the 6- and 14-row blocks of the
        // AVX512-BF16 kernels, full and ragged.
        for (m, mr) in [(37usize, 48usize), (6, 6), (5, 6), (14, 14), (9, 14)] {
            packed_a_is_rows_of_k_for(m, mr);
        }
    }

    fn packed_a_is_rows_of_k_for(m: usize, mr: usize) {
        let (k, steps) = (70usize, 3usize);
        let a: Vec<u16> = (0..m * k).map(|i| i as u16 + 1).collect();
        let at: Vec<u16> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
        for (src, rs, cs) in [(&a, k as i64, 1i64), (&at, 1, m as i64)] {
            let mut dst = vec![0xffffu16; mr * steps * 32];
            // SAFETY: sized as documented; every (m, k) below the bounds is in `src`.
            unsafe { pack_a(dst.as_mut_ptr(), src.as_ptr(), rs, cs, m, k, mr, steps) };
            for r in 0..mr {
                for c in 0..steps * 32 {
                    let want = if r < m && c < k { a[r * k + c] } else { 0 };
                    assert_eq!(dst[(c / 32 * mr + r) * 32 + c % 32], want, "{m} of {mr} rows, rs {rs}: row {r} k {c}");
                }
            }
        }
    }

    /// Packing puts `B[32s + 2p + h, j]` at word `32p + 2j + h` of tile (s, j/16), zeros outside, in both paths.
    #[test]
    fn packed_b_is_the_pair_layout() {
        let (k, n) = (70usize, 40usize);
        let b: Vec<u16> = (0..k * n).map(|i| i as u16 + 1).collect();
        for (nt, cs_rs) in [(2usize, false), (1, false), (2, true)] {
            // cs_rs: B stored n-major (a transposed weight), read through the strides.
            let bt: Vec<u16> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
            let (src, rs, cs) = if cs_rs { (&bt, 1i64, k as i64) } else { (&b, n as i64, 1i64) };
            let steps = k.div_ceil(KSTEP);
            let panels = n.div_ceil(16 * nt);
            let mut dst = vec![0xffffu16; panels * steps * nt * 512];
            // SAFETY: sized as documented; every (k, n) below the bounds is in `src`.
            unsafe { pack_b(dst.as_mut_ptr(), src.as_ptr(), rs, cs, 0, n, k, nt) };
            for q in 0..panels {
                for s in 0..steps {
                    for j in 0..nt {
                        for p in 0..16 {
                            for c in 0..16 {
                                for h in 0..2 {
                                    let (kk, nn) = (s * 32 + 2 * p + h, q * 16 * nt + j * 16 + c);
                                    let want = if kk < k && nn < n { b[kk * n + nn] } else { 0 };
                                    let at = ((q * steps + s) * nt + j) * 512 + p * 32 + 2 * c + h;
                                    assert_eq!(dst[at], want, "nt {nt} transposed {cs_rs} k {kk} n {nn}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
