//! The transposed candidate (`tr:avx2:...`): `C = A B` computed as `C^T = B^T A^T` by a generated kernel, into
//! scratch, then transposed into C (the epilogue follows as the backend's pass over C).
//!
//! Why: a linear layer's forward at a few dozen rows (`x @ W^T`, W stored N x K) has B = W^T contiguous along K,
//! which the direct kernels must pack, all of W on every call (800 KB for the benchmark MLP's first layer at batch
//! 32, as large as the multiply's own traffic). Transposed, W is the A operand, which the micro-kernels read in
//! place by broadcasts, and only x is packed (100 KB). On the bucketed 32 x 256 x 1024 problem that takes about a
//! quarter less time than the direct kernels' best (the transposed problem gains nothing when it packs W too: the
//! saving is the packing). The transpose of C^T (32 x 256) back into C is 8 x 8 register blocks
//! ([`super::pack`]'s), a microsecond or two.
//!
//! Threads split the transposed problem's rows (W's rows), as the forward's other candidates and the weight's update
//! do, so a weight's cache lines stay with the core that updates them. The scratch is per calling thread and kept.

use super::CompiledGemm;
use kiln_jit::kernel::gemm::GemmView;
use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `inner` (the GEMM over `v.transposed()`, identity epilogue) into scratch and writes its transpose into C.
///
/// # Safety
/// As [`CompiledGemm::run`] for `v`: `ptrs` holds the kernel's input pointers, then C (`v.m x v.n`, dense); the host
/// has AVX2 (generated GEMMs run only there).
pub(super) unsafe fn run(inner: &CompiledGemm, v: &GemmView, ptrs: &[*mut u8], n_in: usize) {
    let (m, n) = (v.m, v.n);
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < m * n {
            s.resize(m * n, 0.0);
        }
        let mut args: smallvec::SmallVec<[*mut u8; 16]> = ptrs[..n_in].iter().copied().collect();
        args.push(s.as_mut_ptr() as *mut u8);
        // SAFETY: the inner GEMM reads the same input buffers through the transposed view (valid by the caller's
        // contract) and writes its n x m output, which the scratch holds.
        unsafe { inner.run(&args) };
        // SAFETY: C holds m x n floats (the caller's contract), the scratch n x m.
        unsafe { transpose(ptrs[n_in] as *mut f32, s.as_ptr(), m, n) };
    });
}

/// `c[i * n + j] = s[j * m + i]` for `i < m`, `j < n`: 8 x 8 blocks in registers, the ragged edges one by one.
///
/// # Safety
/// `c` valid for `m * n` floats, `s` for `n * m`; AVX2 present.
unsafe fn transpose(c: *mut f32, s: *const f32, m: usize, n: usize) {
    let (m8, n8) = (m / 8 * 8, n / 8 * 8);
    if m8 > 0 && n8 > 0 {
        // Columns of the block routine are rows of `s` (stride m, contiguous along i), its panel is C (width n).
        // SAFETY: rows 0..n8 of `s` hold m >= m8 floats each; C rows 0..m8 hold n >= n8 floats.
        unsafe { super::pack::transpose_8x8_blocks(c, n, s, 0, m as i64, n8, m8) };
    }
    for i in 0..m {
        let cols = if i < m8 { n8..n } else { 0..n };
        for j in cols {
            // SAFETY: i < m, j < n.
            unsafe { *c.add(i * n + j) = *s.add(j * m + i) };
        }
    }
}
