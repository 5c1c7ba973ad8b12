//! Packing A and B into the panel layouts the micro-kernels stream: A as MR-tall panels (for each k, MR consecutive
//! rows), B as NR-wide panels (for each k, NR consecutive columns), both zero-padded at ragged edges so a kernel
//! never needs a bounds check. Plain Rust: packing is O(M*K + K*N) against the kernel's O(M*N*K), and the
//! contiguous cases (a row-major B row, a transposed A column) become slice copies.

/// Packs rows `m0..m0 + mb` and `kb` k-steps of A (element (m, k) at `src + m*rs + k*ks`) into `dst`.
///
/// # Safety
/// `src` must be valid for every (m, k) in range, and `dst` for `ceil(mb / mr) * mr * kb` floats.
#[allow(clippy::too_many_arguments)]
pub unsafe fn pack_a(dst: *mut f32, src: *const f32, rs: i64, ks: i64, m0: usize, mb: usize, kb: usize, mr: usize) {
    let panels = mb.div_ceil(mr);
    for p in 0..panels {
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
        for r in 0..rows {
            let m = (m0 + p * mr + r) as i64;
            // SAFETY: (m, k) is in range for every k < kb, per the caller.
            let row = unsafe { src.offset((m * rs) as isize) };
            if ks == 1 {
                // SAFETY: contiguous along k for kb elements.
                let s = unsafe { std::slice::from_raw_parts(row, kb) };
                for (k, &x) in s.iter().enumerate() {
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
    for p in 0..panels {
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
            for j in 0..cols {
                // SAFETY: column col0 + j is in range for k < kb, contiguous along k, per the caller.
                let col = unsafe { std::slice::from_raw_parts(src.offset(((col0 + j as i64) * ns) as isize), kb) };
                for (k, &x) in col.iter().enumerate() {
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
