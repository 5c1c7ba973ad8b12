//! The GEMM candidates of the GPU devices (CUDA, HIP) and their analytic score: the tensor-core template (bf16 on CUDA
//! sm_80 and later, f16 likewise, and f32 in TF32 where the user allows it: [`allow_tf32`]) and the SIMT tiled template
//! in a few tiles, each also with K split where the product has too few tiles of C to fill the GPU ([`GpuGemm`]). The
//! race among them runs on the device (`gpu/tune.rs`); this part needs no device, so an ahead-of-time compile
//! (`gpu_cache::render`) takes the same best-scored candidate a device takes with `KILN_AUTOTUNE=off`.

use kiln_jit::DType;
use kiln_jit::kernel::KernelIr;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::cstyle::GemmTile;
use kiln_jit::render::cuda::{self, Flavor, GpuKernel, MmaTile};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// One way to run a GEMM on a GPU device: a template in a tile, K split `splits` ways (1: not split).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuGemm {
    pub tile: GpuTile,
    pub splits: u32,
}

/// A GEMM template in one tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuTile {
    /// The SIMT tiled template (`cuda::render_gemm`) in this tile.
    Simt(GemmTile),
    /// The tensor-core template (`cuda::render_gemm_mma`) in this tile: bf16 or f16 operands (f32 in TF32 where
    /// allowed), CUDA sm_80 and later.
    Mma(MmaTile),
}

impl GpuGemm {
    /// The SIMT template in tile `t`, K whole.
    pub const fn simt(t: GemmTile) -> GpuGemm {
        GpuGemm { tile: GpuTile::Simt(t), splits: 1 }
    }

    /// The tensor-core template in tile `t`, K whole.
    pub const fn mma(t: MmaTile) -> GpuGemm {
        GpuGemm { tile: GpuTile::Mma(t), splits: 1 }
    }

    /// A stable name, e.g. `simt:64x64:r4x4:k16`, `mma:64x64:w2x2` or `mma:16x128:w1x4:s8` (K split 8 ways):
    /// tuning records store it.
    pub fn name(&self) -> String {
        let tile = match self.tile {
            GpuTile::Simt(t) => format!("simt:{}x{}:r{}x{}:k{}", t.tm, t.tn, t.rm, t.rn, t.kt),
            GpuTile::Mma(t) => format!("mma:{}x{}:w{}x{}", t.bm(), t.bn(), t.wm, t.wn),
        };
        if self.splits > 1 { format!("{tile}:s{}", self.splits) } else { tile }
    }

    /// GEMM kernel `k` (recognized as `v`) as this candidate in `flavor`.
    pub fn render(&self, k: &KernelIr, v: &GemmView, flavor: Flavor) -> Result<GpuKernel, String> {
        match self.tile {
            GpuTile::Simt(t) => cuda::render_gemm(k, v, t, self.splits, flavor),
            GpuTile::Mma(t) => cuda::render_gemm_mma(k, v, t, self.splits, flavor),
        }
    }

    /// The block's tile of C and its K slice.
    fn dims(&self) -> (u32, u32, u32) {
        match self.tile {
            GpuTile::Simt(t) => (t.tm, t.tn, t.kt),
            GpuTile::Mma(t) => (t.bm(), t.bn(), cuda::MMA_BK),
        }
    }

    /// Blocks over `v` before any split.
    fn tiles(&self, v: &GemmView) -> u64 {
        let (bm, bn, _) = self.dims();
        (v.m.div_ceil(bm as usize) * v.n.div_ceil(bn as usize) * v.batch_count().max(1)) as u64
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

/// The most ways K is split, and the least K each split sums (below that, the partials' round trip costs about
/// what the block's share of the product does; the score weighs the two above it).
const MAX_SPLITS: u32 = 16;
const MIN_K_PER_SPLIT: usize = 128;

/// Whether f32 GEMMs may run on the tensor cores in TF32 (10 mantissa bits per operand, f32 accumulation), as
/// PyTorch's `torch.backends.cuda.matmul.allow_tf32`: off unless `KILN_ALLOW_TF32=1` or [`set_allow_tf32`]. Read
/// when a plan compiles: plans compiled before a change keep what they were compiled with.
pub fn allow_tf32() -> bool {
    TF32.load(Ordering::Relaxed)
}

/// Allows (or forbids) TF32 for the f32 GEMMs of plans compiled from now on ([`allow_tf32`]).
pub fn set_allow_tf32(on: bool) {
    TF32.store(on, Ordering::Relaxed);
}

static TF32: LazyLock<AtomicBool> =
    LazyLock::new(|| AtomicBool::new(std::env::var("KILN_ALLOW_TF32").is_ok_and(|v| v == "1" || v == "on")));

/// The candidates for `v` in `flavor` on `arch`, in a fixed order: the tensor-core template first where it applies
/// (bf16 and f16 operands; f32 ones in TF32 where [`allow_tf32`]); each tile whole, then (where its blocks would
/// not fill the GPU) with K split ([`split_for`]).
pub fn candidates(flavor: Flavor, arch: &str, v: &GemmView) -> Vec<GpuGemm> {
    candidates_with(flavor, arch, v, allow_tf32())
}

/// [`candidates`] with TF32 allowed or not.
pub fn candidates_with(flavor: Flavor, arch: &str, v: &GemmView, tf32: bool) -> Vec<GpuGemm> {
    let types = matches!(v.operands, DType::BF16 | DType::F16) || (v.operands == DType::F32 && tf32);
    let mma = flavor == Flavor::Cuda && cuda::mma_arch(arch) && types;
    let mma = MMA_TILES.iter().filter(|_| mma).map(|&(wm, wn, fm, fn_)| GpuGemm::mma(MmaTile { wm, wn, fm, fn_ }));
    let simt = TILES.iter().map(|&(tm, tn, rm, rn, kt)| GpuGemm::simt(GemmTile { tm, tn, rm, rn, kt }));
    mma.chain(simt).flat_map(|c| [Some(c), split_for(v, c)]).flatten().collect()
}

/// Candidate `c` with K split so its blocks about fill the GPU (the smallest power of two that reaches
/// `TARGET_BLOCKS`, at most `MAX_SPLITS`, each split summing at least `MIN_K_PER_SPLIT`), or `None` where its
/// tiles alone are at least half the target or K is too short to split.
pub fn split_for(v: &GemmView, c: GpuGemm) -> Option<GpuGemm> {
    let tiles = c.tiles(v) as f64;
    if tiles >= TARGET_BLOCKS / 2.0 {
        return None;
    }
    let mut splits = 1u32;
    while tiles * (splits as f64) < TARGET_BLOCKS
        && splits < MAX_SPLITS
        && v.k / (2 * splits as usize) >= MIN_K_PER_SPLIT
    {
        splits *= 2;
    }
    (splits > 1).then_some(GpuGemm { splits, ..c })
}

/// The analytic score of `c` on `v` (higher is better): a relative estimate whose job is to put the few worth timing on
/// top. Shared-memory reuse grows with the block tile (`tm * tn / (tm + tn)`), register reuse with the thread's (`rm *
/// rn / (rm + rn)`); the fraction of the padded grid that is real output and the occupancy (blocks, splits included,
/// against `TARGET_BLOCKS`: below it the blocks run side by side, so the time is one block's and the rate grows with
/// their number) scale it; the tensor cores multiply a tile's throughput by ~8 (dense bf16 MMA against f32 FMA on the
/// same SM, A100 to H100 alike; TF32 by ~4). A split pays for its partials: a block writes its f32 tile and the last
/// reads every split's, against the operand bytes the block streams for its share of K.
pub fn score(v: &GemmView, c: &GpuGemm) -> f64 {
    let (tm, tn, rm, rn, speed) = match c.tile {
        GpuTile::Simt(t) => (t.tm as f64, t.tn as f64, t.rm as f64, t.rn as f64, 1.0),
        // A warp's accumulators stand for the register tile: 16 x 8 per instruction tile, over 32 lanes. TF32 runs
        // at half the bf16 rate.
        GpuTile::Mma(t) => {
            let speed = if v.operands == DType::F32 { 4.0 } else { 8.0 };
            (t.bm() as f64, t.bn() as f64, (4 * t.fm) as f64, (2 * t.fn_) as f64, speed)
        }
    };
    let (_, _, kt) = c.dims();
    let splits = c.splits.max(1);
    let shared_reuse = tm * tn / (tm + tn);
    let reg_reuse = rm * rn / (rm + rn);
    let padded_m = (v.m as f64 / tm).ceil() * tm;
    let padded_n = (v.n as f64 / tn).ceil() * tn;
    let useful = (v.m * v.n) as f64 / (padded_m * padded_n);
    let blocks = c.tiles(v) as f64 * splits as f64;
    let occupancy = (blocks / TARGET_BLOCKS).min(1.0);
    // K as the blocks step it: each split's range in whole slices.
    let chunk = cuda::KSplit::of(v.k, kt, splits).chunk as f64;
    let k_useful = v.k as f64 / (chunk * splits as f64);
    let fixup = if splits > 1 {
        let operand_bytes = (tm + tn) * chunk * v.operands.size_of() as f64;
        1.0 / (1.0 + 2.0 * 4.0 * tm * tn / operand_bytes)
    } else {
        1.0
    };
    speed * shared_reuse.sqrt() * (1.0 + reg_reuse) * useful * occupancy * k_useful * fixup
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
            assert!(names.insert(GpuGemm::simt(t).name()));
        }
        for &(wm, wn, fm, fn_) in &MMA_TILES {
            let t = MmaTile { wm, wn, fm, fn_ };
            assert!(t.well_formed(), "{t:?}");
            assert!(names.insert(GpuGemm::mma(t).name()));
        }
    }

    fn view(m: usize, k: usize, n: usize) -> GemmView {
        view_of(DType::BF16, m, k, n)
    }

    fn view_of(dtype: DType, m: usize, k: usize, n: usize) -> GemmView {
        use kiln_jit::{Graph, NodeData, Op, Shape};
        let node = |op: Op, dims: Vec<usize>| NodeData { op, shape: Shape::new(dims), dtype };
        let mut g = Graph::new();
        let a = g.add(node(Op::Input { slot: 0 }, vec![m, k]), &[]);
        let b = g.add(node(Op::Input { slot: 1 }, vec![k, n]), &[]);
        let c = g.add(node(Op::Matmul, vec![m, n]), &[a, b]);
        g.outputs.push(c);
        let plan = crate::gpu_cache::schedule(&g);
        plan.launches.iter().find_map(|l| GemmView::of(&l.kernel)).expect("a GEMM kernel")
    }

    /// Decode shapes split K until the blocks about fill the GPU, and the split outscores the whole tile; a large
    /// square product splits nothing.
    #[test]
    fn decode_shapes_split_k_and_large_products_do_not() {
        let decode = view(16, 4096, 4096);
        let cands = candidates(Flavor::Cuda, "sm_90", &decode);
        let thin = GpuGemm::mma(MmaTile { wm: 1, wn: 4, fm: 1, fn_: 4 });
        let split = split_for(&decode, thin).expect("32 tiles of 16 x 128 split");
        assert_eq!(split.splits, 8, "32 tiles x 8 splits = 256 blocks");
        assert!(cands.contains(&split) && split.name().ends_with(":s8"));
        assert!(score(&decode, &split) > score(&decode, &thin));
        assert!(best_scored(&decode, &cands).is_some_and(|c| c.splits > 1), "a decode shape runs split");
        let square = view(4096, 4096, 4096);
        assert!(candidates(Flavor::Cuda, "sm_90", &square).iter().all(|c| c.splits == 1));
        // f32 operands: the tensor cores only in TF32, where allowed; never on HIP or before sm_80.
        let f32_view = view_of(DType::F32, 512, 512, 512);
        let mma = |c: &GpuGemm| matches!(c.tile, GpuTile::Mma(_));
        assert!(!candidates_with(Flavor::Cuda, "sm_90", &f32_view, false).iter().any(mma));
        let tf32 = candidates_with(Flavor::Cuda, "sm_90", &f32_view, true);
        assert_eq!(tf32.iter().filter(|c| mma(c) && c.splits == 1).count(), MMA_TILES.len());
        assert!(best_scored(&f32_view, &tf32).is_some_and(|c| mma(&c)), "TF32 outscores f32 FMAs");
        assert!(!candidates_with(Flavor::Cuda, "sm_75", &f32_view, true).iter().any(mma));
        assert!(!candidates_with(Flavor::Hip, "gfx90a", &f32_view, true).iter().any(mma));
        // Short K: nothing to split.
        let short = view(16, 64, 4096);
        assert!(candidates(Flavor::Cuda, "sm_90", &short).iter().all(|c| c.splits == 1));
    }
}
