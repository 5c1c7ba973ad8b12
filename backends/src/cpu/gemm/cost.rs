//! The CPU GEMM cost model: the analytic score that ranks `config`'s candidates before any is timed (the search
//! times only the best few: `kiln_autotune::search`).
//!
//! The score is a roofline estimate in GFLOP/s, not a promise; its job is to put the few worth timing on top:
//! - compute: this core's 8-lane FMA peak (100 GFLOP/s per core, the model's unit) times the family's measured peak
//!   ratio (`isa::peak_ratio`: ~2 for AVX-512 on a core with two 512-bit FMA units, ~1 where they are double-pumped)
//!   times the register tiles' efficiency over C (`tiles_efficiency`: FMA latency needs >= 10 independent
//!   accumulators on Zen 3 / Skylake, and loads per FMA must stay under 1.5, in each tile, the edge tiles with
//!   fewer rows or vectors included, weighted by the lanes each computes);
//! - memory: bytes of packing, C traffic per K block and re-streamed unpacked operands, at a per-thread
//!   bandwidth of 12 GB/s;
//! - fit: a B micro-panel over half of L1 (where the tile reads B faster than L2 keeps up, `b_demand`, and its
//!   512-bit FMAs are not full width: `l1_rule_applies`), an A block over 256 KiB or a B block over a thread's
//!   share of L3 cost 20% each, a packed B block over half of L2 12% (L2 as the host describes it: `cpu::caches`);
//! - parallel balance: the largest thread's share of tiles.

use super::config::{Bf16Config, Bf16Unit, GemmConfig, GemmImpl, SKINNY_M, SPLITK_STREAMED_PART_BYTES, Split};
use crate::cpu::isa::{self, Isa};
use kiln_jit::kernel::gemm::GemmView;

/// GB/s per thread the cost model assumes for operands streamed from memory (a mix of cache and DRAM).
const BW: f64 = 12.0;

/// Estimated GFLOP/s of `c` on `v` with `threads` threads on this host (see the module doc).
pub fn score(v: &GemmView, imp: &GemmImpl, threads: usize) -> f64 {
    score_with_l2(v, imp, threads, crate::cpu::caches::l2_bytes())
}

/// [`score`] for a core with `l2_bytes` of L2.
pub(super) fn score_with_l2(v: &GemmView, imp: &GemmImpl, threads: usize, l2_bytes: usize) -> f64 {
    const PEAK: f64 = 100.0; // GFLOP/s per core, measured FMA peak here
    let c = match imp {
        // Measured here at 1024^3 on 2 threads: 120 GFLOP/s, 60% of peak; its epilogue is a second pass over C. A
        // skinny GEMM is bound by reading B, where its GEMV path trails the broadcast kernels (1 x 256 x 784 on one
        // thread: 12.3 µs against 8.2 for the dot products); without that bound `KILN_AUTOTUNE=off` picked it for
        // every batch-1 layer.
        // A weight stored N x K (`x @ W^T`) at up to 128 rows is its weak case: 3-5x the generated kernels' time at
        // 16, 32 and 64 x 256 x 784 (`kiln tune --mode full`), where a flat score made it `KILN_AUTOTUNE=off`'s pick.
        GemmImpl::Library => {
            let mut s = 0.6 * PEAK * threads.min(v.n.div_ceil(16)) as f64;
            if v.m <= SKINNY_M {
                s = s.min(0.6 * streaming_b_score(v, threads));
            }
            if v.b.rows == 1 && v.b.cols != 1 && v.m <= 128 {
                s *= 0.3;
            }
            return s;
        }
        GemmImpl::Dot => return dot_score(v, threads, PEAK),
        GemmImpl::SplitK => return splitk_score(v, threads, PEAK),
        // The transposed problem's own estimate, less the transpose and the epilogue pass over C: 0.85 ranks it under
        // the direct kernels at 64 rows, where it was timed 3-13 % slower (202 against 208-229 µs at 64 x 256 x 784,
        // `kiln tune --mode full`), and over them at 16 and 32 rows, where it was 10-27 % faster.
        GemmImpl::Transposed(c) => return 0.85 * score_with_l2(&v.transposed(), &GemmImpl::Asm(*c), threads, l2_bytes),
        GemmImpl::Bf16(a) => return bf16_score(v, a, threads),
        GemmImpl::Asm(c) => c,
    };
    let (m, n, k) = (v.m as f64, v.n as f64, v.k as f64);
    let (mr, nr) = (c.mr as f64, c.nr() as f64);
    let mut eff = tiles_efficiency(c, v.m, v.n);
    let kc = c.kc.min(v.k) as f64;
    if !c.pack_b && v.m <= 4 && kc > 8.0 {
        // B streamed in place: a tile sweep reads `kc` rows at once, one prefetch stream each, and the hardware
        // prefetchers keep up with only a few (measured at M = 1, K = N = 4096, 2 threads, weights from DRAM: kc 4
        // reads them at up to 30 GB/s, kc 32 at 25, kc 128-384 at 10-25, noisy).
        eff *= if kc > 32.0 { 0.5 } else { 0.8 };
    }
    if !c.pack_b && v.m <= SKINNY_M {
        // B streamed in place by a column split: a thread reads each of its B rows in one pass per NC block, so an
        // NC under the thread's columns restarts every prefetch stream that many times per row. Measured at M = 1,
        // K = N = 4096, 2 threads, weights cycled from DRAM, interleaved with a plain read of the same size: 1 x 64,
        // kc 8 at 78-79 % of the read bandwidth with NC 1024 (two passes per row) and 96-98 % with NC 4096 (one).
        // The model had scored the two alike, and the race took the first.
        let cols = n / (threads as f64).min((n / nr).ceil()).max(1.0);
        if (c.nc as f64) < cols {
            eff *= 0.9;
        }
    }
    if !c.pack_b && v.m > SKINNY_M && v.b.rows * 4 >= 4096 && kc > 64.0 {
        // B read in place with its rows a page or more apart: every micro-kernel call walks `kc` pages of B, for
        // each of the block's row tiles, and the TLB misses cost more than packing saves. Measured at 64 x 4096 x
        // 4096 on 2 threads (`kiln tune --mode full`): 6x64 and 14x32 with B in place at KC 384 took 25.2 and 32.1
        // ms, packed B 14.7 ms; the model had ranked the in-place ones first.
        eff *= 0.5;
    }
    if !c.pack_a && v.a.rows == 1 && v.a.cols * 4 >= 1024 && k * m * 4.0 > l2_bytes as f64 / 2.0 {
        // A stored K x M (a weight gradient's activations, `x^T`) past half of L2, read in place: a tile's
        // broadcasts walk `kc` rows of A a row (1 KiB or more) apart, a stride no prefetcher follows, and in a
        // training step those rows come from memory (written in the forward pass, long before). The race times
        // them hot and cannot see it. Measured in the GPT step (`KILN_PROFILE=1 ... train_gpt`, each candidate
        // forced, 512 x 128 x 1024, A 2 MiB): A in place at KC 1024 792 µs a launch (the model's pick), at KC 256
        // 628, packed A at KC 1024 668 and at 256 609; the race had timed KC 1024 at 555 µs hot.
        eff *= if kc > 256.0 { 0.7 } else { 0.85 };
    } else if !c.pack_a && v.a.rows == 1 && v.a.cols * 4 >= 1024 && kc > 128.0 {
        // Within half of L2 too, at long K blocks: each broadcast of a tile's A strip is a line of its own (`kc`
        // lines, 56 of their 64 bytes used), which with the B panel the strip is multiplied by (`kc` x 128 bytes)
        // outgrow L1, where a packed strip is `kc` x 56 contiguous bytes. Measured in the MLP step (`train_mlp`,
        // candidates forced, three interleaved rounds): the 256 x 784 weight gradient with A (`dy^T`, rows 1 KiB
        // apart) packed took the step 1827-1848 against 1864-1921 µs at batch 512 (A 512 KiB, KC 512; the model
        // had picked it in place) and 3599-3659 against 3694-3712 at batch 1024 (A 1 MiB, KC 384).
        eff *= 0.9;
    }
    if !c.pack_b
        && v.m > SKINNY_M
        && v.b.cols == 1
        && (1024..4096).contains(&(v.b.rows * 4))
        && k * n * 4.0 > l2_bytes as f64 / 2.0
    {
        // B stored K x N (a weight gradient's output gradient, `dy`) past half of L2, read in place with its rows
        // under a page apart (the rule above takes those a page or more apart): each micro-kernel call reads `kc`
        // rows of a column strip, and in a training step they come from memory. Measured in the GPT step
        // (`KILN_PROFILE=1 ... train_gpt`, 128 x 512 x 1024, B 2 MiB, candidates forced): B in place 620 µs a
        // launch (the model's pick), packed 559-566; timed hot, the race prefers it in place.
        eff *= 0.85;
    }
    if kc * nr * 4.0 > 16.0 * 1024.0 && l1_rule_applies(c, isa::peak_ratio(Isa::Avx512)) {
        eff *= 0.8;
    }
    // Parallel split: tiles per thread along the split dimension, or whole batch elements per thread
    // (`parts_per_batch_element`).
    let whole = super::config::parts_per_batch_element(v, c, threads) == 1 && v.batch_count() > 1;
    let (units, t) = if whole {
        (v.batch_count() as f64, threads as f64)
    } else {
        let units = match c.split {
            Split::Rows => (m / mr).ceil(),
            Split::Cols => (n / nr).ceil(),
            Split::Depth => (k / super::config::DEPTH_MIN_K_PER_PART as f64).floor(),
        };
        (units, threads as f64)
    };
    let used = t.min(units).max(1.0);
    let n_part = if c.split != Split::Cols || whole { n } else { n / used };
    let m_part = if c.split != Split::Rows || whole { m } else { m / used };
    // A K split's thread sums its share of K over all of C.
    let k_part = if c.split == Split::Depth && !whole { k / used } else { k };
    eff *= tokens_split_factor(v, c, used);
    if c.pack_a && c.mc as f64 * kc * 4.0 > 256.0 * 1024.0 {
        eff *= 0.8;
    }
    if c.pack_b && kc * c.nc as f64 * 4.0 > 8.0 * 1024.0 * 1024.0 / threads as f64 {
        eff *= 0.8;
    }
    if c.pack_b && kc * n_part.min(c.nc as f64) * 4.0 > l2_bytes as f64 / 2.0 {
        // A packed B block past half of L2: packing it pushes its own first panels (and the A block) out to L3,
        // and the row blocks read them back from there. Measured on a 2 MiB-L2 Xeon (`KILN_AUTOTUNE=full` timing
        // every candidate, a 256 x 784 x 1024 weight gradient, 2 threads, 392-512 columns each): KC 1024 (a 1.6-2
        // MiB block) 1.87-1.98 ms, KC 256-384 1.69-1.81 ms, for every tile and either A; at 1024 x 256 x 1024
        // (128 columns each, a 512 KiB block at KC 1024) KC 1024 was the fastest. The model had ranked KC 1024
        // first in both, for its single pass over C.
        eff *= 0.88;
    }
    let balance = if c.split == Split::Depth { 1.0 } else { (units / used) / (units / used).ceil() };
    let batch = v.batch_count() as f64;
    let flops = 2.0 * m * n * k * batch;
    let peak = PEAK * isa::peak_ratio(c.isa);
    let compute_s = flops / (peak * 1e9 * used * eff * balance.max(0.05));
    // Bytes per thread.
    let kblocks = (k_part / kc).ceil();
    // C is read and written once per K block; a thread's C block within half of L2 stays there and costs about an
    // eighth of DRAM traffic (a skinny GEMM's C row, re-read every few k-steps, is such a block). Half of the
    // host's L2, not a constant: with 2 MiB, 64 x 4096 x 4096 (512 KiB of C a thread) had been priced for 31 passes
    // over C from memory at K blocks of 256, and the model ranked 1024 first, which ran 10.9-11.5 ms against
    // 10.2-10.3 with the weights from memory (`KILN_AUTOTUNE=off`'s pick before and after, interleaved).
    let c_block = m_part * n_part * 4.0;
    let c_weight = if c_block <= l2_bytes as f64 / 2.0 { 0.125 } else { 1.0 };
    let mut bytes = c_weight * c_block * (2.0 * kblocks - 1.0);
    bytes += if c.pack_b { 8.0 * k_part * n_part } else { 4.0 * k_part * n_part * (m_part / c.mc as f64).ceil() };
    bytes += if c.pack_a { 8.0 * k_part * m_part * (n_part / c.nc as f64).ceil() } else { 4.0 * k_part * m_part };
    if c.split == Split::Depth && used > 1.0 {
        // The last pass: a thread's rows of C and of every partial read, its rows of C written.
        bytes += m * n * 4.0 * (used + 1.0) / used;
        if v.roles.len() > 1 {
            // The epilogue as a pass over the sums: a thread's rows of C read and written again.
            bytes += m * n * 8.0 / used;
        }
    }
    // A thread's traffic: its share of every batch element, or its whole ones.
    let elements = if whole { (batch / used).ceil() } else { batch };
    let mem_s = elements * bytes / (BW * 1e9);
    flops / (compute_s + mem_s) / 1e9
}

/// What splitting a weight gradient (`x^T dy`, both operands stored token by token) over M or N costs in a
/// training step, over `used` threads: every thread reads every token, and the row-split kernels before it wrote
/// half of them on the other core, where a K split reads only its own (`config::Split::Depth`). Timed hot, the race
/// cannot see it. Measured in the GPT step (`KILN_PROFILE=1 ... train_gpt`, fresh caches, the race's picks): 512 x
/// 128 x 1024 602 -> 546 µs a launch with the K split, 384 x 128 x 1024 455 -> 389, 128 x 128 x 1024 182 -> 144;
/// 128 x 512 x 1024, which the model had ranked split over N, 627-689 against 524-607 with it forced.
pub(super) fn tokens_split_factor(v: &GemmView, c: &GemmConfig, used: f64) -> f64 {
    if c.split != Split::Depth && used > 1.0 && super::config::over_tokens(v) { 0.9 } else { 1.0 }
}

/// How efficiently `c`'s register tiles cover an `m x n` C: the useful elements over the tiles' work, each tile's
/// work its computed elements (whole vectors) over its own efficiency. A tile's efficiency is its FMA-latency term
/// (FMA latency needs >= 10 independent accumulators) times its load term (loads per FMA under 1.5). The edge tiles
/// are the kernels with fewer rows or vectors (`CompiledGemm::build`), so a ragged edge costs its lanes and also
/// its shorter FMA chains: 4 x 24 on 32 columns runs a 4 x 8 tile (4 accumulators) for the last 8, which the race
/// timed 18 % slower than 6 x 16's whole tiles (64 x (64 x 64 @ 64 x 32), 130 against 110 µs), where a score that
/// counted only the lanes had ranked 4 x 24 first.
fn tiles_efficiency(c: &GemmConfig, m: usize, n: usize) -> f64 {
    let lanes = c.isa.lanes();
    let tile = |rows: usize, nv: usize| {
        let accs = (rows * nv) as f64;
        let latency = (accs / 10.0).min(1.0);
        let loads = if rows == 1 { nv as f64 + 1.0 } else { (nv + rows) as f64 };
        latency * ((accs / 2.0) / (loads / 3.0)).min(1.0)
    };
    let (full_rows, tail_rows) = (m / c.mr, m % c.mr);
    let (full_cols, tail_vectors) = (n / c.nr(), (n % c.nr()).div_ceil(lanes));
    let mut work = 0.0;
    for (count, rows) in [(full_rows, c.mr), (usize::from(tail_rows > 0), tail_rows)] {
        for (blocks, nv) in [(full_cols, c.nv), (usize::from(tail_vectors > 0), tail_vectors)] {
            if count > 0 && blocks > 0 {
                work += (count * blocks * rows * nv * lanes) as f64 / tile(rows, nv);
            }
        }
    }
    if work == 0.0 { 0.0 } else { (m * n) as f64 / work }
}

/// Bytes of B a register tile reads per cycle of its FMAs at its family's peak, `peak_ratio` times the 8-lane one
/// ([`isa::peak_ratio`]): `NR * 4` bytes per k-step against `MR * NV` FMAs, two 8-lane FMAs a cycle scaled by the
/// ratio (so one 16-lane FMA a cycle where 512-bit FMAs are double-pumped, ratio ~1, about two where they are not,
/// ~1.8). AVX2's 6 x 16 reads 10.7, 4 x 24 16; AVX-512's 8 x 48 reads 8 at ratio 1 and 14 at 1.8, 14 x 32 5 and 8.
pub(super) fn b_demand(c: &GemmConfig, peak_ratio: f64) -> f64 {
    let lanes = c.isa.lanes() as f64;
    let fmas_per_cycle = 2.0 * peak_ratio * 8.0 / lanes;
    c.nr() as f64 * 4.0 * fmas_per_cycle / (c.mr * c.nv) as f64
}

/// Whether a B micro-panel past L1 costs `c` (`score`), on a host whose AVX-512 peak is `avx512_ratio` times its
/// 8-lane one ([`isa::peak_ratio`]): where `c` reads B faster than L2 keeps up ([`b_demand`] over
/// [`L2_B_BYTES_PER_CYCLE`]), except for AVX-512 tiles where the 512-bit FMAs are full width
/// ([`super::config::full_width`]). The rule was measured on a double-pumped Zen 4; on the full-width Ice
/// Lake Xeon it had the model rank 14x32 first where 6x64 (17 bytes a cycle at its peak ratio) ran 8-24 % faster at
/// 1024^3, 14-17 % at 2048^3 and 15-40 % at 64 x 4096 x 4096 (interleaved A/B of forced configurations), and there
/// the model's pick is what runs wherever fast mode does not search (a key past its budget, `KILN_AUTOTUNE=off`).
pub(super) fn l1_rule_applies(c: &GemmConfig, avx512_ratio: f64) -> bool {
    match c.isa {
        Isa::Avx2 => b_demand(c, 1.0) > L2_B_BYTES_PER_CYCLE,
        Isa::Avx512 => !super::config::full_width(avx512_ratio) && b_demand(c, avx512_ratio) > L2_B_BYTES_PER_CYCLE,
    }
}

/// Above this many bytes of B per FMA cycle ([`b_demand`]) a B micro-panel that outgrows L1 costs: read from L2
/// instead, it slows the tile. Below it the tile's FMAs hide L2's latency and bandwidth. Every AVX2 tile reads
/// more than this, so their scores are what they were; AVX-512's 8 x 48 on a double-pumped core reads 8, and there
/// it ran 12-15 % faster than the best AVX2 tile at 512 x 256 x 784 and 256 x 784 x 512 (an MLP's first layer and
/// its weight gradient, `kiln tune --mode full`, KC 512 and 1024), where the flat rule had scored it 15 % under
/// them and `KILN_AUTOTUNE=fast`, timing the two best-scored, never tried it (`train_mlp` at batch 512 and 1024,
/// and `bench_conv`, whose GEMM runs the model's pick, were faster with the rule).
pub(super) const L2_B_BYTES_PER_CYCLE: f64 = 10.0;

/// The bf16 estimate: AMX tile throughput (a 16 x 16 x 32 `tdpbf16ps` per 16 cycles, 1024 flops a cycle a core,
/// taken as 8x the model's 8-lane FMA unit) or `vdpbf16ps`'s (twice an f32 FMA's flops), scaled by the useful
/// fraction of each padded block and by how often each load is reused (AMX: a 2 x 2 block loads 4 tiles for 4
/// products, a 1 x 2 one 3 for 2; the dot products: the f32 family's tile efficiency), the threads' balance, and the
/// packing of B (read and written once per row split).
fn bf16_score(v: &GemmView, a: &Bf16Config, threads: usize) -> f64 {
    let (mr, nr) = (a.mr, a.nr());
    let (peak, reuse) = match a.unit {
        Bf16Unit::Amx => {
            let mt = (mr / 16).max(1);
            (800.0, (mt * a.nt) as f64 / (mt + a.nt) as f64)
        }
        Bf16Unit::Avx512Bf16 => {
            // As the f32 kernels: enough accumulators to hide the latency, few loads per product.
            let accs = (mr * a.nt) as f64;
            (4.0 * 100.0 * isa::peak_ratio(Isa::Avx512), (accs / 12.0).min(1.0) * 0.9)
        }
    };
    let useful = |x: usize, t: usize| x as f64 / x.next_multiple_of(t) as f64;
    let units = match a.split {
        Split::Cols => v.n.div_ceil(nr),
        Split::Rows => v.m.div_ceil(mr),
        Split::Depth => v.k.div_ceil(super::bf16::KSTEP),
    };
    let workers = threads.min(units).max(1);
    let balance = units as f64 / (units.div_ceil(workers) * workers) as f64;
    let compute = peak * workers as f64 * balance * useful(v.m, mr) * useful(v.n, nr) * reuse;
    let flops = v.flops();
    // Packing reads and writes B once per row strip; split by K it reads B's rows front to back (counted at twice
    // the bandwidth of the strided walk), and the partials of every thread are added once more.
    let (pack_bytes, bw) = match a.split {
        Split::Cols => (4.0 * (v.k * v.n) as f64, BW),
        Split::Rows => (4.0 * (v.k * v.n) as f64 * workers as f64, BW),
        Split::Depth => (4.0 * (v.k * v.n) as f64 + 8.0 * (v.m * v.n * workers) as f64, 2.0 * BW),
    };
    let seconds = flops / (compute * 1e9) + pack_bytes / (bw * workers as f64 * 1e9);
    flops / seconds / 1e9
}

/// The dot-product candidate's estimate. One or two rows are bound by reading B, once per row, at ~25 GB/s a thread
/// from L2/L3 (a 256 x 784 weight in 8.2 µs on one thread): 2 flops per 4 bytes. From three rows, tiles of 3 x 4
/// dot products are bound by the FMA units at ~90 % of `peak`, less the horizontal sums that end every dot product
/// (~48 FMAs' worth per tile and K) and the rows left over (half speed). At its 8-row limit that is far above the
/// packing kernels, which copy all of B per call (8 x 256 x 784: ~164 GFLOP/s measured against ~55).
fn dot_score(v: &GemmView, threads: usize, peak: f64) -> f64 {
    let t = threads.min(v.n.div_ceil(4)) as f64;
    if v.m < 3 {
        return 0.5 * 25.0 * t / v.m.max(1) as f64;
    }
    let tiled = (v.m / 3 * 3) as f64 / v.m as f64;
    let k = v.k as f64;
    0.9 * peak * t * (tiled + (1.0 - tiled) * 0.5) * (k / (k + 48.0))
}

/// The split-K candidate's estimate on its own: bound by reading B once per row of A, like the broadcast kernels
/// that stream B in place. With B in cache, plus a reduction and the epilogue pass, it is ranked under them (at 1 x
/// 256 x 128 on 2 threads, alone and warm: 1.81 µs against 1.54 for the best broadcast tile); where it wins in a
/// training step, it is not ranked but chosen ([`step_candidates`]). With B streamed from memory each thread reads
/// its contiguous half of B front to back, which beat every column split: 1 x 4096 x 4096, four weights cycled from
/// DRAM, interleaved with a plain read, four runs: 104-113 % of the read bandwidth against 95-108 % for the best
/// generated kernel (a scratch timing of each on the real kernel), so it is ranked over them there.
///
/// Streamed, the rows of A share each strip of B (`splitk::block_times_b`), so B comes from memory once for all of
/// them and the estimate grows with the rows, up to the FMAs' bound: each 8-lane FMA then reads its B vector from L1
/// (about 80 % of `peak`). That ranks it over the broadcast kernels that stream B in place, as measured on 2 threads
/// of a Zen 3 (`kiln tune --mode full`, same B every run): 2, 4 and 8 x 4096 x 4096 in 2.6, 2.9 and 4.8 ms against
/// 2.8, 3.6 and 5.5 for the best generated kernel (1 x 64, KC 8), 8 x 1024 x 4096 in 1.0 ms against 1.35. With B in
/// L3 it is close and the race decides (8 x 1024 x 1024: 259 against 266 µs; at 4 rows the library won, 128 against
/// 177).
fn splitk_score(v: &GemmView, threads: usize, peak: f64) -> f64 {
    let t = threads.min(v.k / 16).max(1);
    let streamed = v.k / t * v.n * 4 > SPLITK_STREAMED_PART_BYTES;
    if streamed {
        (1.1 * streaming_b_score(v, t)).min(0.8 * peak * t as f64)
    } else {
        0.6 * streaming_b_score(v, t) / v.m.max(1) as f64
    }
}

/// GFLOP/s of a skinny GEMM bound by reading B once per row of A from memory at the cost model's bandwidth, on `t`
/// threads: what the broadcast kernels that stream B in place reach at best (before their tile's efficiency).
fn streaming_b_score(v: &GemmView, t: usize) -> f64 {
    // Flops per byte of B per row of A: 2 per 4-byte element.
    BW * t as f64 * 0.5 * v.m.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::super::config::tests::view;
    use super::super::config::{candidates, tiles};
    use super::*;
    use kiln_jit::kernel::gemm::GemmOperand;

    /// The L1 rule's exemption (`l1_rule_applies`): every AVX2 tile stays under the rule (its peak ratio is 1 by
    /// definition), so an AVX2-only host ranks its candidates as before. Where 512-bit FMAs are double-pumped
    /// (ratio ~1) AVX-512's 8 x 48 and 14 x 32 are exempt (they read B slowly: 8x48 was measured faster there) and
    /// 6 x 64 is not; where they are full width (~1.6-1.8) every AVX-512 tile is exempt (6x64 measured fastest).
    #[test]
    fn the_l1_rule_spares_only_tiles_that_read_b_slowly() {
        let config = |isa, mr, nv| GemmConfig {
            isa,
            mr,
            nv,
            kc: 1024,
            mc: mr * 12,
            nc: 1024,
            pack_a: true,
            pack_b: true,
            split: Split::Cols,
            unroll: 4,
            prefetch: 0,
        };
        let exempt = |isa, mr, nv, ratio| !l1_rule_applies(&config(isa, mr, nv), ratio);
        for skinny in [false, true] {
            for &(mr, nv) in tiles(Isa::Avx2, skinny) {
                for ratio in [0.25, 1.0, 1.8] {
                    assert!(!exempt(Isa::Avx2, mr, nv, ratio), "AVX2 {mr}x{} exempt at {ratio}", 8 * nv);
                }
            }
        }
        assert!(exempt(Isa::Avx512, 8, 3, 1.0) && exempt(Isa::Avx512, 14, 2, 1.0) && !exempt(Isa::Avx512, 6, 4, 1.0));
        assert!(exempt(Isa::Avx512, 8, 3, 1.8) && exempt(Isa::Avx512, 14, 2, 1.8) && exempt(Isa::Avx512, 6, 4, 1.8));
        // Above the rule's bytes a cycle at 1.8 (it would apply but for the full width).
        assert!(b_demand(&config(Isa::Avx512, 6, 4), 1.8) > L2_B_BYTES_PER_CYCLE);
    }

    /// A packed B block past half of L2 is priced (`score`): with 2 MiB of L2, a 256 x 784 x 1024 weight gradient
    /// (A stored K x M, two threads of 392 columns) ranks K blocks of 384 over 1024, as the race timed them, where
    /// without the rule (a 64 MiB L2) the single pass over C ranked 1024 first; the 1024 x 256 x 1024 forward GEMM
    /// (128 columns a thread: a 512 KiB block at KC 1024) keeps KC 1024 first.
    #[test]
    fn a_packed_b_block_past_half_of_l2_is_priced() {
        let tile = |kc: usize, nc: usize, pack_b: bool| avx512_14x32(kc, 168, nc, pack_b);
        let grad = {
            let v = view(256, 784, 1024);
            GemmView { a: GemmOperand { rows: 1, cols: 256, ..v.a.clone() }, ..v }
        };
        let s = |v: &GemmView, kc: usize, nc: usize, l2: usize| score_with_l2(v, &tile(kc, nc, true), 2, l2);
        assert!(s(&grad, 384, 1024, 2 << 20) > s(&grad, 1024, 1024, 2 << 20));
        assert!(s(&grad, 384, 1024, 64 << 20) < s(&grad, 1024, 1024, 64 << 20));
        let forward = view(1024, 256, 1024);
        assert!(s(&forward, 1024, 256, 2 << 20) > s(&forward, 384, 256, 2 << 20));
        // Only packed B is priced so: B read in place scores alike whatever the L2.
        let in_place = |l2: usize| score_with_l2(&forward, &tile(1024, 256, false), 2, l2);
        assert_eq!(in_place(2 << 20), in_place(64 << 20));
    }

    /// A weight gradient's A (stored K x M, 2 MiB) read in place ranks its short K blocks or a packed A first, as
    /// they ran in the training step; stored M x K, or within half of L2, every candidate scores as it did.
    #[test]
    fn activations_read_in_place_from_memory_take_short_k_blocks() {
        let l2 = 2 << 20;
        let transposed = |m: usize| {
            let v = view(m, 128, 1024);
            GemmView { a: GemmOperand { rows: 1, cols: m as i64, ..v.a.clone() }, ..v }
        };
        let cands = |v: &GemmView| super::super::config::candidates_for(v, false, &[Isa::Avx512]);
        let big = transposed(512);
        let best = cands(&big)
            .into_iter()
            .max_by(|a, b| score_with_l2(&big, a, 2, l2).total_cmp(&score_with_l2(&big, b, 2, l2)));
        let Some(GemmImpl::Asm(c)) = best else { panic!("{best:?}") };
        assert!(c.kc <= 256 || c.pack_a, "512 x 128 x 1024, A stored K x M: {}", GemmImpl::Asm(c).name());
        // B stored N x K here, so that the transposed view is no weight gradient over tokens (`tokens_split_factor`).
        let b_nk = |v: GemmView| GemmView { b: GemmOperand { rows: 1, cols: 1024, ..v.b.clone() }, ..v };
        for m in [512, 128] {
            let (t, plain) = (b_nk(transposed(m)), b_nk(view(m, 128, 1024)));
            for imp in cands(&plain) {
                let (st, sp) = (score_with_l2(&t, &imp, 2, l2), score_with_l2(&plain, &imp, 2, l2));
                let in_place = matches!(imp, GemmImpl::Asm(c) if !c.pack_a);
                if m == 512 && in_place {
                    assert!(st < sp, "{}: {st} against {sp}", imp.name());
                } else {
                    assert_eq!(st, sp, "{m} rows, {}", imp.name());
                }
            }
        }
    }

    /// The MLP's first weight gradient (256 x 784, A `dy^T` stored K x M with its rows 1 KiB apart, 512 KiB at
    /// batch 512 and 1 MiB at 1024: within half of L2) ranks a packed A first, as it ran in the training step.
    #[test]
    fn activations_within_half_of_l2_read_at_long_k_blocks_are_packed() {
        for k in [512, 1024] {
            let v = view(256, 784, k);
            let v = GemmView { a: GemmOperand { rows: 1, cols: 256, ..v.a.clone() }, ..v };
            let cands = super::super::config::candidates_for(&v, false, &[Isa::Avx512]);
            let s = |imp: &GemmImpl| score_with_l2(&v, imp, 2, 2 << 20);
            let best = cands.iter().max_by(|a, b| s(a).total_cmp(&s(b)));
            let Some(GemmImpl::Asm(c)) = best else { panic!("{best:?}") };
            assert!(c.pack_a, "256 x 784 x {k}, A stored K x M: {}", GemmImpl::Asm(*c).name());
        }
    }

    /// The GPT's weight gradients (`x^T dy` over 1024 tokens, both operands stored token by token) rank a K split
    /// first on two threads, as they ran fastest in the training step.
    #[test]
    fn weight_gradients_over_tokens_split_k() {
        let depth = |imp: &GemmImpl| matches!(imp, GemmImpl::Asm(c) if c.split == Split::Depth);
        for (m, n) in [(512, 128), (384, 128), (128, 512), (128, 128)] {
            let v = view(m, n, 1024);
            let grad = GemmView { a: GemmOperand { rows: 1, cols: m as i64, ..v.a.clone() }, ..v.clone() };
            let cands = super::super::config::candidates_for(&grad, false, &[Isa::Avx512]);
            let s = |v: &GemmView, imp: &GemmImpl| score_with_l2(v, imp, 2, 2 << 20);
            let best = cands.iter().max_by(|a, b| s(&grad, a).total_cmp(&s(&grad, b)));
            assert!(best.is_some_and(depth), "{m} x {n} x 1024: {best:?}");
        }
    }

    /// A weight gradient's output gradient (B stored K x N, 2 MiB, its rows 2 KiB apart) ranks a packed B first, as
    /// it ran in the training step: every candidate reading it in place scores lower with 2 MiB of L2 than with
    /// 64; within half of L2 (128 columns, 512 KiB) they score alike.
    #[test]
    fn output_gradients_read_in_place_from_memory_are_packed() {
        let grad = |n: usize| {
            let v = view(128, n, 1024);
            GemmView { a: GemmOperand { rows: 1, cols: 128, ..v.a.clone() }, ..v }
        };
        let cands = |v: &GemmView| super::super::config::candidates_for(v, false, &[Isa::Avx512]);
        let big = grad(512);
        let s = |v: &GemmView, imp: &GemmImpl, l2: usize| score_with_l2(v, imp, 2, l2);
        let best = cands(&big).into_iter().max_by(|a, b| s(&big, a, 2 << 20).total_cmp(&s(&big, b, 2 << 20)));
        let Some(GemmImpl::Asm(c)) = best else { panic!("{best:?}") };
        assert!(c.pack_b, "128 x 512 x 1024, B stored K x N: {}", GemmImpl::Asm(c).name());
        for (n, slower) in [(512, true), (128, false)] {
            let v = grad(n);
            for imp in cands(&v).iter().filter(|i| matches!(i, GemmImpl::Asm(c) if !c.pack_b)) {
                let (near, far) = (s(&v, imp, 2 << 20), s(&v, imp, 64 << 20));
                if slower {
                    assert!(near < far, "{n} columns, {}: {near} against {far}", imp.name());
                } else {
                    assert_eq!(near, far, "{n} columns, {}", imp.name());
                }
            }
        }
    }

    /// A thread's C block within half of L2 is re-read from there, once per K block, at an eighth of the memory
    /// cost: with 2 MiB of L2, 64 x 4096 x 4096 (a 512 KiB C block a thread) ranks K blocks of 256 over 1024, as
    /// they ran with the weights from memory; with 512 KiB of L2 the C traffic of 16 K blocks keeps 1024 first.
    #[test]
    fn a_c_block_in_half_of_l2_is_cheap_to_revisit() {
        let v = view(64, 4096, 4096);
        let s = |kc: usize, l2: usize| score_with_l2(&v, &avx512_14x32(kc, 70, 1024, true), 2, l2);
        assert!(s(256, 2 << 20) > s(1024, 2 << 20));
        assert!(s(256, 512 << 10) < s(1024, 512 << 10));
    }

    /// AVX-512's 14 x 32 tile with A read in place, threads splitting the columns.
    fn avx512_14x32(kc: usize, mc: usize, nc: usize, pack_b: bool) -> GemmImpl {
        GemmImpl::Asm(GemmConfig {
            isa: Isa::Avx512,
            mr: 14,
            nv: 2,
            kc,
            mc,
            nc,
            pack_a: false,
            pack_b,
            split: Split::Cols,
            unroll: 4,
            prefetch: 0,
        })
    }

    /// The model's first choice for a batch-1 layer, and for a linear layer (W stored N x K) at 16-64 rows, is a
    /// generated kernel, not the library or split K, which were timed slower there (see `splitk_score` and `score`);
    /// for up to 8 rows times a B (stored K x N) streamed from memory, split K, which reads it once for all rows and
    /// was timed faster than the generated kernels there.
    #[test]
    fn skinny_gemms_rank_generated_kernels_first() {
        let linear = |m: usize, n: usize, k: usize| GemmView {
            b: GemmOperand { buf: 0, offset: 0, batch: vec![], rows: 1, cols: k as i64, patch: None },
            ..view(m, n, k)
        };
        let kn = [(1, 256, 128), (1, 128, 256)].map(|(m, n, k)| view(m, n, k));
        let nk = [(16, 256, 784), (32, 256, 784), (64, 256, 784)].map(|(m, n, k)| linear(m, n, k));
        for v in kn.iter().chain(&nk) {
            let (m, n, k) = (v.m, v.n, v.k);
            let v = v.clone();
            let best = candidates(&v, true)
                .into_iter()
                .max_by(|a, b| score(&v, a, 2).total_cmp(&score(&v, b, 2)))
                .expect("candidates");
            assert!(matches!(best, GemmImpl::Asm(_) | GemmImpl::Transposed(_)), "{m}x{n}x{k}: {}", best.name());
        }
        for (m, n, k) in [(1, 4096, 4096), (1, 2048, 8192), (2, 4096, 4096), (8, 4096, 4096), (8, 1024, 4096)] {
            let v = view(m, n, k);
            let best = candidates(&v, true).into_iter().max_by(|a, b| score(&v, a, 2).total_cmp(&score(&v, b, 2)));
            assert_eq!(best, Some(GemmImpl::SplitK), "{m}x{n}x{k}");
        }
        // Large problems keep their ranking: the library stays a contender at 1024^3.
        let v = view(1024, 1024, 1024);
        assert!(score(&v, &GemmImpl::Library, 2) > 100.0);
    }

    /// A skinny GEMM streaming B in place is scored best with one pass over each of a thread's B rows (an NC
    /// block covering its columns), which streamed the weights from DRAM 20 % faster than two passes.
    #[test]
    fn skinny_b_in_place_reads_each_row_in_one_pass() {
        for (m, n) in [(1, 4096), (4, 4096), (1, 2000)] {
            let v = view(m, n, 4096);
            let cands = candidates(&v, true);
            // The first of the best scores among the generated kernels, as the search ranks them (a stable sort:
            // ties keep candidate order).
            let mut ranked: Vec<&GemmImpl> = cands.iter().filter(|c| matches!(c, GemmImpl::Asm(_))).collect();
            ranked.sort_by(|a, b| score(&v, b, 2).total_cmp(&score(&v, a, 2)));
            let best = ranked[0];
            match best {
                GemmImpl::Asm(c) => {
                    assert!(!c.pack_b && c.nc >= n / 2, "{m}x{n}: {}", best.name())
                }
                other => panic!("{m}x{n}: the model's first choice is {}", other.name()),
            }
        }
    }

    /// The register tiles' coverage counts an edge tile's own FMA chains, not only its lanes: 4 x 24 on 32 columns
    /// (a 24-column tile, then a 4 x 8 one with 4 accumulators) ranks under 6 x 16's two whole tiles, as the race
    /// timed it (`tiles_efficiency`), while where both tile the problem exactly they keep the whole tile's terms.
    #[test]
    fn edge_tiles_cost_their_short_fma_chains() {
        let config = |mr, nv| GemmConfig {
            isa: Isa::Avx2,
            mr,
            nv,
            kc: 64,
            mc: mr * 8,
            nc: 48,
            pack_a: false,
            pack_b: true,
            split: Split::Cols,
            unroll: 4,
            prefetch: 0,
        };
        let (wide, square) = (config(4, 3), config(6, 2));
        assert!(tiles_efficiency(&wide, 64, 32) < 0.8 * tiles_efficiency(&square, 64, 32));
        let v = view(64, 32, 64);
        assert!(score(&v, &GemmImpl::Asm(square), 2) > score(&v, &GemmImpl::Asm(wide), 2));
        // Exact tilings: the whole tile's efficiency (4 x 24: 12 accumulators, 7 loads; 6 x 16: 12 and 8).
        assert!((tiles_efficiency(&wide, 96, 96) - 1.0).abs() < 1e-9);
        assert!((tiles_efficiency(&square, 96, 96) - 1.0).abs() < 1e-9);
        // A single row of one vector: 1 accumulator, 2 loads.
        assert!((tiles_efficiency(&square, 1, 8) - 0.1 * 0.75).abs() < 1e-9);
    }
}
