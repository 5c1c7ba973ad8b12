//! The WGSL GEMM search space: the tile configurations (`kiln_jit::render::wgsl::GemmTile`: workgroup tile,
//! per-invocation register tile, K slice) legal on an adapter, and the analytic score that ranks them before any is
//! timed. The shader template is `kiln_jit`'s (`render::wgsl::render_gemm`), the timing and verification `gemm.rs`'s,
//! the search loop `kiln_autotune`'s: this file only knows which tiles exist, which fit the device, and what each
//! should cost.
//!
//! The score is a relative estimate, not a promise; its job is to put the few worth timing on top:
//! - reuse: a `tm x tn` tile reads `(tm + tn) * kt` words per `tm * tn * kt` multiply-adds, so shared-memory
//!   traffic per FMA falls as `tm * tn / (tm + tn)` grows; a register tile of `rm x rn` reads `rm + rn` shared
//!   words per `rm * rn` FMAs, the same trade one level down (capped at 4x4: more accumulators spill on most GPUs);
//! - waste: the fraction of the padded grid (`ceil(m / tm) * tm` by `ceil(n / tn) * tn`) that is real output;
//! - occupancy: fewer workgroups than `TARGET_GROUPS` leave compute units idle, so the score scales by the fraction
//!   filled; very short K wastes the staging of a long `kt` slice.

use kiln_jit::kernel::gemm::GemmView;
pub use kiln_jit::render::wgsl::GemmTile;

/// The adapter limits a tile must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileLimits {
    /// `maxComputeInvocationsPerWorkgroup`.
    pub max_invocations: u32,
    /// `maxComputeWorkgroupSizeX` (the template's workgroups are one-dimensional).
    pub max_size_x: u32,
    /// `maxComputeWorkgroupStorageSize`, bytes.
    pub max_shared_bytes: u32,
}

impl TileLimits {
    /// WebGPU's default limits, which every adapter meets.
    pub const WEBGPU_DEFAULT: TileLimits =
        TileLimits { max_invocations: 256, max_size_x: 256, max_shared_bytes: 16384 };
}

/// Workgroups that keep a mid-size GPU's compute units busy (a few per unit); below it the score drops linearly.
const TARGET_GROUPS: f64 = 64.0;

/// The fixed list every search starts from, in a fixed order (the order is part of the candidate-set checksum).
const TILES: [(u32, u32, u32, u32, u32); 9] = [
    (64, 64, 4, 4, 8),
    (64, 64, 4, 4, 16),
    (32, 64, 2, 4, 16),
    (32, 32, 2, 2, 16),
    (32, 32, 4, 4, 16),
    (16, 64, 1, 4, 16),
    (16, 32, 2, 2, 32),
    (8, 64, 1, 4, 32),
    (16, 16, 1, 1, 16),
];

/// Whether `t` is well formed and fits `lim`.
pub fn legal(t: &GemmTile, lim: &TileLimits) -> bool {
    let threads = t.threads();
    t.well_formed()
        && threads <= lim.max_invocations
        && threads <= lim.max_size_x
        && t.shared_bytes() <= lim.max_shared_bytes
}

/// Every candidate legal under `lim`, in a fixed order.
pub fn candidates(lim: &TileLimits) -> Vec<GemmTile> {
    TILES.iter().map(|&(tm, tn, rm, rn, kt)| GemmTile { tm, tn, rm, rn, kt }).filter(|t| legal(t, lim)).collect()
}

/// The analytic score of `t` on `v` (higher is better; see the module doc).
pub fn score(v: &GemmView, t: &GemmTile) -> f64 {
    let (tm, tn, kt) = (t.tm as f64, t.tn as f64, t.kt as f64);
    let (rm, rn) = (t.rm as f64, t.rn as f64);
    let shared_reuse = tm * tn / (tm + tn);
    let reg_reuse = (rm * rn / (rm + rn)).min(2.0);
    let padded_m = (v.m as f64 / tm).ceil() * tm;
    let padded_n = (v.n as f64 / tn).ceil() * tn;
    let useful = (v.m * v.n) as f64 / (padded_m * padded_n);
    let groups = (padded_m / tm) * (padded_n / tn) * v.batch_count().max(1) as f64;
    let occupancy = (groups / TARGET_GROUPS).min(1.0);
    let k_useful = v.k as f64 / ((v.k as f64 / kt).ceil() * kt);
    shared_reuse.sqrt() * (1.0 + reg_reuse) * useful * (0.25 + 0.75 * occupancy) * k_useful
}

/// The best-scored legal tile for `v`, without running anything (`KILN_AUTOTUNE=off`).
pub fn analytic_best(v: &GemmView, lim: &TileLimits) -> Option<GemmTile> {
    let mut best: Option<(f64, GemmTile)> = None;
    for t in candidates(lim) {
        let s = score(v, &t);
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, t));
        }
    }
    best.map(|(_, t)| t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_defaults_are_legal() {
        let all = candidates(&TileLimits::WEBGPU_DEFAULT);
        assert_eq!(all.len(), TILES.len(), "every listed tile fits WebGPU's default limits");
        for t in all {
            assert_eq!(GemmTile::parse(&t.name()), Some(t));
        }
        assert_eq!(GemmTile::parse("wgsl:64x64:r3x4:k8"), None, "3 does not divide 64");
        let small = TileLimits { max_invocations: 64, max_size_x: 64, max_shared_bytes: 4096 };
        assert!(candidates(&small).iter().all(|t| t.threads() <= 64 && t.shared_bytes() <= 4096));
    }
}
