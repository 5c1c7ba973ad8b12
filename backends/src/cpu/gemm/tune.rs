//! Choosing a GEMM configuration: the library candidate's entry point, and (with `kiln-autotune`) the search.

use super::Ctx;
use super::config::{self, GemmImpl};
use kiln_jit::kernel::gemm::GemmView;

/// The `gemm` crate on the whole problem (batch 1; its epilogue runs as the backend's pass).
///
/// # Safety
/// As [`super::CompiledGemm::run`].
pub unsafe fn library_gemm(v: &GemmView, cx: &Ctx) {
    let threads = super::pool::global().threads();
    let par =
        if v.flops() < 2.0e6 || threads == 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(threads) };
    // SAFETY: A, B and C cover every (m, k), (k, n), (m, n) with the view's strides (caller's contract); C is
    // written, not read (`read_dst` false).
    unsafe {
        gemm::gemm(
            v.m,
            v.n,
            v.k,
            cx.c,
            1,
            v.n as isize,
            false,
            cx.a.offset(v.a.offset as isize),
            v.a.cols as isize,
            v.a.rows as isize,
            cx.b.offset(v.b.offset as isize),
            v.b.cols as isize,
            v.b.rows as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// The analytic winner: the best-scored candidate, without running anything (`KILN_AUTOTUNE=off`).
pub fn analytic_best(v: &GemmView, threads: usize) -> Option<GemmImpl> {
    let mut best: Option<(f64, GemmImpl)> = None;
    for c in config::candidates(v, false) {
        let s = config::score(v, &c, threads);
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}
