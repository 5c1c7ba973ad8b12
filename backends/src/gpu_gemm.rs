//! The GEMM candidates of the GPU devices (CUDA, HIP) and their analytic score: the tensor-core template (bf16 on
//! CUDA sm_80 and later) and the SIMT tiled template in a few tiles ([`GpuGemm`]). The race among them runs on the
//! device (`gpu/tune.rs`); this part needs no device, so an ahead-of-time compile (`gpu_cache::render`) takes the
//! same best-scored candidate a device takes with `KILN_AUTOTUNE=off`.

use kiln_jit::DType;
use kiln_jit::kernel::KernelIr;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::cstyle::GemmTile;
use kiln_jit::render::cuda::{self, Flavor, GpuKernel, MmaTile};

/// One way to run a GEMM on a GPU device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuGemm {
    /// The SIMT tiled template (`cuda::render_gemm`) in this tile.
    Simt(GemmTile),
    /// The tensor-core template (`cuda::render_gemm_mma`) in this tile: bf16 operands, CUDA sm_80 and later.
    Mma(MmaTile),
}

impl GpuGemm {
    /// A stable name, e.g. `simt:64x64:r4x4:k16` or `mma:64x64:w2x2`: tuning records store it.
    pub fn name(&self) -> String {
        match self {
            GpuGemm::Simt(t) => format!("simt:{}x{}:r{}x{}:k{}", t.tm, t.tn, t.rm, t.rn, t.kt),
            GpuGemm::Mma(t) => format!("mma:{}x{}:w{}x{}", t.bm(), t.bn(), t.wm, t.wn),
        }
    }

    /// GEMM kernel `k` (recognized as `v`) as this candidate in `flavor`.
    pub fn render(&self, k: &KernelIr, v: &GemmView, flavor: Flavor) -> Result<GpuKernel, String> {
        match self {
            GpuGemm::Simt(t) => cuda::render_gemm(k, v, *t, flavor),
            GpuGemm::Mma(t) => cuda::render_gemm_mma(k, v, *t, flavor),
        }
    }
}

/// The SIMT tiles raced, in a fixed order (part of the candidate-set checksum): the default first, larger register
/// tiles for large products, thin ones for decode shapes (few rows, long K). Each within both languages' limits
/// (at most 1024 threads and 48 KiB of shared memory a block).
const TILES: [(u32, u32, u32, u32, u32); 7] = [
    (64, 64, 4, 4, 16),
    (128, 128, 8, 8, 8),
    (128, 64, 8, 4, 16),
    (64, 128, 4, 8, 16),
    (64, 64, 4, 4, 8),
    (32, 64, 2, 4, 16),
    (16, 64, 1, 4, 32),
];

/// The tensor-core tiles raced, in a fixed order: (warps along M, along N, instruction tiles per warp along M, along
/// N). 64 x 64 and 128 x 64 for large products; 16-row tiles of 64 and 128 columns for decode shapes (M of 8 to
/// 64), where a 64-row tile would be mostly padding and too few blocks.
const MMA_TILES: [(u32, u32, u32, u32); 5] = [(2, 2, 2, 4), (4, 2, 2, 4), (2, 4, 2, 4), (1, 4, 1, 4), (1, 2, 1, 4)];

/// Blocks that fill a large GPU (a few per multiprocessor of a 100-odd SM part); below it the score drops.
const TARGET_BLOCKS: f64 = 256.0;

/// The candidates for `v` in `flavor` on `arch`, in a fixed order: the tensor-core template first where it applies.
pub fn candidates(flavor: Flavor, arch: &str, v: &GemmView) -> Vec<GpuGemm> {
    let mma = flavor == Flavor::Cuda && cuda::mma_arch(arch) && v.operands == DType::BF16;
    let mma = MMA_TILES.iter().filter(|_| mma).map(|&(wm, wn, fm, fn_)| GpuGemm::Mma(MmaTile { wm, wn, fm, fn_ }));
    let simt = TILES.iter().map(|&(tm, tn, rm, rn, kt)| GpuGemm::Simt(GemmTile { tm, tn, rm, rn, kt }));
    mma.chain(simt).collect()
}

/// The analytic score of `c` on `v` (higher is better): a relative estimate whose job is to put the few worth
/// timing on top. Shared-memory reuse grows with the block tile (`tm * tn / (tm + tn)`), register reuse with the
/// thread's (`rm * rn / (rm + rn)`); the fraction of the padded grid that is real output and the occupancy (blocks
/// against `TARGET_BLOCKS`) scale it; the tensor cores multiply a tile's throughput by ~8 (dense bf16 MMA against
/// f32 FMA on the same SM, A100 to H100 alike).
pub fn score(v: &GemmView, c: &GpuGemm) -> f64 {
    let (tm, tn, rm, rn, kt, speed) = match c {
        GpuGemm::Simt(t) => (t.tm as f64, t.tn as f64, t.rm as f64, t.rn as f64, t.kt as f64, 1.0),
        // A warp's accumulators stand for the register tile: 16 x 8 per instruction tile, over 32 lanes.
        GpuGemm::Mma(t) => (t.bm() as f64, t.bn() as f64, (4 * t.fm) as f64, (2 * t.fn_) as f64, 32.0, 8.0),
    };
    let shared_reuse = tm * tn / (tm + tn);
    let reg_reuse = rm * rn / (rm + rn);
    let padded_m = (v.m as f64 / tm).ceil() * tm;
    let padded_n = (v.n as f64 / tn).ceil() * tn;
    let useful = (v.m * v.n) as f64 / (padded_m * padded_n);
    let blocks = (padded_m / tm) * (padded_n / tn) * v.batch_count().max(1) as f64;
    let occupancy = (blocks / TARGET_BLOCKS).min(1.0);
    let k_useful = v.k as f64 / ((v.k as f64 / kt).ceil() * kt);
    speed * shared_reuse.sqrt() * (1.0 + reg_reuse) * useful * (0.2 + 0.8 * occupancy) * k_useful
}

/// The candidates for GEMM kernel `k` (recognized as `v`) in `flavor` on `arch` that render it, in
/// [`candidates`]' order: those a race may choose from.
pub fn renderable(flavor: Flavor, arch: &str, k: &KernelIr, v: &GemmView) -> Vec<GpuGemm> {
    candidates(flavor, arch, v).into_iter().filter(|c| c.render(k, v, flavor).is_ok()).collect()
}

/// The best-scored of `cands` for `v` (the first of equals), without running anything.
pub fn best_scored(v: &GemmView, cands: &[GpuGemm]) -> Option<GpuGemm> {
    let mut best: Option<(f64, GpuGemm)> = None;
    for &c in cands {
        let s = score(v, &c);
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}

/// The best-scored candidate for `k` that renders it: what `KILN_AUTOTUNE=off` and an ahead-of-time compile take.
pub fn analytic_best(flavor: Flavor, arch: &str, k: &KernelIr, v: &GemmView) -> Option<GpuGemm> {
    best_scored(v, &renderable(flavor, arch, k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_fits_both_languages_and_names_are_distinct() {
        let mut names = std::collections::HashSet::new();
        for &(tm, tn, rm, rn, kt) in &TILES {
            let t = GemmTile { tm, tn, rm, rn, kt };
            assert!(t.well_formed() && t.threads() <= 1024 && t.shared_bytes() <= 48 * 1024, "{t:?}");
            assert!(names.insert(GpuGemm::Simt(t).name()));
        }
        for &(wm, wn, fm, fn_) in &MMA_TILES {
            let t = MmaTile { wm, wn, fm, fn_ };
            assert!(t.well_formed(), "{t:?}");
            assert!(names.insert(GpuGemm::Mma(t).name()));
        }
    }
}
