//! The CPU GEMM search space (x86-64, AVX2 + FMA and AVX-512F register tiles): every legal configuration for a
//! problem. What each should cost is `cost.rs`'s; the kernels are the rest of `cpu/gemm`, the search loop and the
//! store `kiln_autotune`'s: this file only knows what a configuration is and which ones fit the machine.
//!
//! A configuration is the instruction family (`cpu::isa`) and register tile (MR x lanes*NV), the cache blocking (KC
//! x MC of A in L2, KC x NC of B in L3, one KC x NR micro-panel of B in L1), whether A and B are packed into panels
//! or read in place, and how the threads split the work (C by columns or by rows, or, for a weight gradient, K:
//! [`Split`]). The library GEMM (`gemm` crate)
//! is one more candidate, and so is a dot-product GEMV (`Dot`) for a few rows of A against a B whose columns are
//! contiguous (`x @ W^T`, every linear layer's forward at a small batch), which no packed or broadcast kernel serves
//! well, and a split-K GEMV (`SplitK`) for a few rows of A against a B whose rows are contiguous (`dy @ W`, a linear
//! layer's input gradient), whose threads take rows of B rather than columns of C. A GEMM of bf16 operands has only
//! the AMX configurations (`Bf16Config`: AMX tiles or AVX512-BF16 dot products, block of C per kernel, B block
//! width, thread split), scored by the unit's throughput and reuse.

use crate::cpu::isa::{self, Isa};
use kiln_jit::kernel::gemm::GemmView;

/// One candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmImpl {
    Asm(GemmConfig),
    /// The `gemm` crate; its epilogue runs as a separate pass.
    Library,
    /// Each output a dot product of a row of A and a column of B, both contiguous along K, in tiles of three rows by
    /// four columns of 8-lane FMAs (`cpu/gemm/dot.rs`); its epilogue runs as a separate pass.
    Dot,
    /// Rows of A times a B whose rows are contiguous, the threads splitting K (`cpu/gemm/splitk.rs`: why); its
    /// epilogue runs as a separate pass.
    SplitK,
    /// `C^T = B^T A^T` by the generated kernel in this configuration (on [`GemmView::transposed`]), into scratch,
    /// then transposed into C; its epilogue runs as a separate pass. For a linear layer's forward at a few dozen
    /// rows (`x @ W^T`, W stored N x K), where the direct kernels pack all of W on every call and this one reads W in
    /// place and packs only x (`cpu/gemm/transposed.rs`: measurements). [`transposed_legal`] says where.
    Transposed(GemmConfig),
    /// bf16 operands on AMX tiles or AVX512-BF16 dot products (`cpu/gemm/bf16.rs`), epilogue in registers.
    Bf16(Bf16Config),
}

/// The bf16 unit a [`Bf16Config`]'s kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Unit {
    /// AMX tiles (`tdpbf16ps`): blocks of 16 or 32 rows.
    Amx,
    /// AVX512-BF16 `vdpbf16ps` on zmm accumulators: any rows that fit the registers. A host with AVX512-BF16 but no
    /// AMX (AMD Zen 4, Intel Cooper Lake) runs bf16 GEMMs on these.
    Avx512Bf16,
}

/// A bf16 GEMM configuration: the unit, the block of C one kernel computes (`mr` x `16 * nt`), the columns of B
/// packed at once, and how the threads split the work. Both units read B packed in the same pair layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bf16Config {
    pub unit: Bf16Unit,
    pub mr: usize,
    pub nt: usize,
    /// Columns per packed block of B (a multiple of `16 * nt`): its K x NC bf16 panels stay in L2 while every row
    /// block of the thread's rectangle passes over them.
    pub nc: usize,
    /// How the threads share the work.
    pub split: Split,
}

/// How the threads of a GEMM share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// Column strips of C.
    Cols,
    /// Row strips of C.
    Rows,
    /// K: each thread sums its share of K for all of C (the first thread into C, the others into f32 partials),
    /// and a last pass adds the partials in thread order (and, bf16, rounds).
    /// - bf16 (AMX): up to 16 rows against a weight from memory, where reading B is the cost and column strips
    ///   read it in short runs a page apart (`depth_split_legal`); identity epilogues only.
    /// - f32 (generated kernels): a weight gradient, `x^T dy` summed over a step's tokens (`f32_depth_legal`).
    ///   Thread `t` takes the `t`-th contiguous share of K, the tokens whose rows the step's row-split kernels
    ///   wrote on that same thread, so each thread reads its own cache's half of both operands; split over M or N,
    ///   each thread reads every token, half of them from the other core's cache. Any epilogue, run as a pass
    ///   over the sums.
    Depth,
}

impl Bf16Config {
    pub fn nr(&self) -> usize {
        16 * self.nt
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    pub isa: Isa,
    pub mr: usize,
    pub nv: usize,
    pub kc: usize,
    pub mc: usize,
    pub nc: usize,
    pub pack_a: bool,
    pub pack_b: bool,
    /// How the threads share the problem: column strips, row strips, or (unbatched, identity epilogue) K.
    pub split: Split,
    pub unroll: usize,
    /// Software prefetch distance for B read in place, in k-steps (0: none).
    pub prefetch: usize,
}

impl GemmConfig {
    pub fn nr(&self) -> usize {
        self.isa.lanes() * self.nv
    }
}

impl GemmImpl {
    /// A stable name: the tuning record stores it, and `parse` must read it back.
    pub fn name(&self) -> String {
        let mut s = String::new();
        self.write_name(&mut s);
        s
    }

    /// Appends [`GemmImpl::name`] to `out` (a key's candidate checksum writes ~100 names into one buffer, once per
    /// GEMM a plan compile looks up: written piece by piece, not through `write!`, which took ~175 ns a name and
    /// ~0.1 ms of a warm process's first step).
    pub fn write_name(&self, out: &mut String) {
        let c = match self {
            GemmImpl::Bf16(a) => {
                out.push_str(match a.unit {
                    Bf16Unit::Amx => "amx:",
                    Bf16Unit::Avx512Bf16 => "dpbf16:",
                });
                push_num(out, a.mr);
                out.push('x');
                push_num(out, a.nr());
                out.push_str(":nc");
                push_num(out, a.nc);
                return out.push_str(match a.split {
                    Split::Cols => ":sN",
                    Split::Rows => ":sM",
                    Split::Depth => ":sK",
                });
            }
            GemmImpl::Library => return out.push_str("lib:gemm"),
            GemmImpl::Dot => return out.push_str("dot:avx2"),
            GemmImpl::SplitK => return out.push_str("splitk:avx2"),
            GemmImpl::Asm(c) => c,
            GemmImpl::Transposed(c) => {
                out.push_str("tr:");
                c
            }
        };
        out.push_str(c.isa.name());
        out.push(':');
        push_num(out, c.mr);
        out.push('x');
        push_num(out, c.nr());
        out.push_str(":kc");
        push_num(out, c.kc);
        out.push_str(":mc");
        push_num(out, c.mc);
        out.push_str(":nc");
        push_num(out, c.nc);
        out.push_str(if c.pack_a { ":pA" } else { ":rA" });
        out.push_str(if c.pack_b { "pB" } else { "rB" });
        out.push_str(match c.split {
            Split::Rows => ":sM:u",
            Split::Cols => ":sN:u",
            Split::Depth => ":sK:u",
        });
        push_num(out, c.unroll);
        out.push_str(":pf");
        push_num(out, c.prefetch);
    }

    /// Whether this candidate can run `v`: [`legal`] for a generated config, an unbatched view for the library,
    /// [`dot_legal`] for the dot products. The one check a tuner's pick and a forced build both go through.
    pub fn legal_for(&self, v: &GemmView) -> bool {
        let f32s = v.operands == kiln_jit::DType::F32 && v.out == kiln_jit::DType::F32;
        match self {
            GemmImpl::Bf16(a) => {
                v.operands == kiln_jit::DType::BF16 && super::bf16::unit_ready(a.unit) && bf16_legal(v, a)
            }
            // Every other candidate reads and writes f32.
            _ if !f32s => false,
            _ if !reads_patch(self, v) => false,
            GemmImpl::Asm(c) => c.isa.present() && legal(v, c),
            GemmImpl::Library => v.batch.is_empty(),
            GemmImpl::Dot => dot_legal(v),
            GemmImpl::SplitK => splitk_legal(v),
            GemmImpl::Transposed(c) => c.isa.present() && transposed_legal(v) && legal(&v.transposed(), c),
        }
    }

    /// The structural family (what the cost model may mis-rank as a whole): the library, or the generated kernel
    /// by instruction set and by how A and B are read (packed or in place) and, for B streamed in place, whether
    /// its K blocks are short (a few rows streamed at once) or long: which of those wins depends on the memory
    /// system more than the model knows (measured at M = 1: 4-8-row blocks from 25 to 42 GB/s, 32-row blocks
    /// 24-27, in different sessions). The instruction set is part of it because the model prices 8- and 16-lane
    /// kernels by their measured FMA peaks only, not by what the front end and load ports make of them: on a
    /// double-pumped AVX-512 host (both peaks alike) it scored AVX2 6x16 first for a 128x512x1024 weight gradient
    /// (A transposed), which `KILN_AUTOTUNE=full` timed at 1075 µs against AVX-512 8x48's 723, so fast mode's two
    /// timed slots never raced the two instruction sets there.
    pub fn family(&self) -> String {
        let c = match self {
            GemmImpl::Bf16(a) => {
                return match a.unit {
                    Bf16Unit::Amx => "AMX tiles",
                    Bf16Unit::Avx512Bf16 => "AVX512-BF16 dot products",
                }
                .to_string();
            }
            GemmImpl::Library => return "library".to_string(),
            GemmImpl::Dot => return "dot products".to_string(),
            GemmImpl::SplitK => return "split K".to_string(),
            GemmImpl::Transposed(_) => return "transposed, W in place".to_string(),
            GemmImpl::Asm(c) => c,
        };
        let packing = match (c.pack_a, c.pack_b, c.kc <= 8) {
            (true, true, _) => "packed A, packed B",
            (true, false, true) => "packed A, B in place, short K blocks",
            (true, false, false) => "packed A, B in place",
            (false, true, _) => "A in place, packed B",
            (false, false, true) => "A and B in place, short K blocks",
            (false, false, false) => "A and B in place",
        };
        format!("{}: {packing}", c.isa.name())
    }

    /// The search's coarsest axis (`Candidate::group`), what the cost model ranks least well; fast mode's two
    /// timed slots go to the best of two groups first. A generated kernel's (the transposed form's included) is its
    /// instruction set where the host's 16-lane FMA peak is within [`FULL_WIDTH_PEAK_RATIO`] of the 8-lane one
    /// (`full_width` false: 512-bit FMAs double-pumped, or no AVX-512), and its register tile where it is above:
    /// - double-pumped (Zen 4), the model prices the two families alike and cannot tell them apart: it had scored
    ///   AVX2 6x16 first for a 128 x 512 x 1024 weight gradient that AVX-512's 8x48 ran 1.5x faster;
    /// - full width, the measured peak ranks the families (AVX2 reaches at most ~60 % of AVX-512 there), and a slot
    ///   for AVX2 is a slot lost; what the model then mis-ranks is the tile. On an Ice Lake Xeon (1.25 MiB of L2,
    ///   peaks 208 / 337 GFLOP/s on 2 threads) it scored 14x32 first, and 6x64 and 8x48 ran 8-24 % faster at
    ///   1024^3 and 14-17 % at 2048^3 (interleaved, three runs), but fast mode timed 14x32 and AVX2's 6x16 only.
    ///
    /// Otherwise the family.
    pub fn group(&self, full_width: bool) -> String {
        match self {
            GemmImpl::Asm(_) | GemmImpl::Transposed(_) if full_width => self.shape(),
            GemmImpl::Asm(c) | GemmImpl::Transposed(c) => c.isa.name().to_string(),
            _ => self.family(),
        }
    }

    /// The register tile (`6x16`) of a generated kernel, the search's second axis of diversity within a family
    /// (`Candidate::shape`); empty for the library and the dot products.
    pub fn shape(&self) -> String {
        match self {
            GemmImpl::Asm(c) | GemmImpl::Transposed(c) => format!("{} {}x{}", c.isa.name(), c.mr, c.nr()),
            GemmImpl::Bf16(a) => format!("{:?} {}x{}", a.unit, a.mr, a.nr()),
            GemmImpl::Library | GemmImpl::Dot | GemmImpl::SplitK => String::new(),
        }
    }

    pub fn parse(s: &str) -> Option<GemmImpl> {
        if s == "lib:gemm" {
            return Some(GemmImpl::Library);
        }
        if s == "dot:avx2" {
            return Some(GemmImpl::Dot);
        }
        if s == "splitk:avx2" {
            return Some(GemmImpl::SplitK);
        }
        let bf16 = s.strip_prefix("amx:").map(|r| (Bf16Unit::Amx, r));
        if let Some((unit, rest)) = bf16.or_else(|| s.strip_prefix("dpbf16:").map(|r| (Bf16Unit::Avx512Bf16, r))) {
            let f: Vec<&str> = rest.split(':').collect();
            let [tile, nc, split] = f[..] else { return None };
            let (mr, nr) = tile.split_once('x')?;
            let a = Bf16Config {
                unit,
                mr: mr.parse().ok()?,
                nt: nr.parse::<usize>().ok()? / 16,
                nc: nc.strip_prefix("nc")?.parse().ok()?,
                split: match split {
                    "sN" => Split::Cols,
                    "sM" => Split::Rows,
                    "sK" => Split::Depth,
                    _ => return None,
                },
            };
            let imp = GemmImpl::Bf16(a);
            return (imp.name() == s).then_some(imp);
        }
        if let Some(rest) = s.strip_prefix("tr:") {
            return match GemmImpl::parse(rest)? {
                GemmImpl::Asm(c) => Some(GemmImpl::Transposed(c)),
                _ => None,
            };
        }
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 9 {
            return None;
        }
        let isa = Isa::parse(f[0])?;
        let (mr, nr) = f[1].split_once('x')?;
        let num = |p: &str, pre: &str| p.strip_prefix(pre)?.parse::<usize>().ok();
        let c = GemmConfig {
            isa,
            mr: mr.parse().ok()?,
            nv: nr.parse::<usize>().ok()? / isa.lanes(),
            kc: num(f[2], "kc")?,
            mc: num(f[3], "mc")?,
            nc: num(f[4], "nc")?,
            pack_a: f[5].starts_with("pA"),
            pack_b: f[5].ends_with("pB"),
            split: match f[6] {
                "sM" => Split::Rows,
                "sN" => Split::Cols,
                "sK" => Split::Depth,
                _ => return None,
            },
            unroll: num(f[7], "u")?,
            prefetch: num(f[8], "pf")?,
        };
        (GemmImpl::Asm(c).name() == s).then_some(GemmImpl::Asm(c))
    }
}

/// Appends `x` in decimal.
fn push_num(out: &mut String, mut x: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (x % 10) as u8;
        x /= 10;
        if x == 0 {
            break;
        }
    }
    // The bytes are ASCII digits.
    out.extend(digits[i..].iter().map(|&d| d as char));
}

/// Rows at or below which a GEMM is "skinny" (a GEMV-like layer at small batch): B is streamed in place rather than
/// packed, and short tiles compete.
pub const SKINNY_M: usize = 16;

/// The AVX-512 to AVX2 FMA-peak ratio (`isa::peak_ratio`) from which a host's 512-bit FMAs count as full width for
/// the search's groups ([`GemmImpl::group`]): measured ~1.0 on double-pumped Zen 4 cores, 1.4-2.2 on the Xeon
/// guests kiln has run on (the AMX-class ones and an Ice Lake).
pub const FULL_WIDTH_PEAK_RATIO: f64 = 1.3;

/// Whether a host whose AVX-512 FMA peak is `avx512_ratio` times its 8-lane one (`isa::peak_ratio`) has full-width
/// 512-bit FMAs ([`FULL_WIDTH_PEAK_RATIO`]): what the search's groups ([`GemmImpl::group`]) and the cost model's L1
/// rule (`cost::l1_rule_applies`) both ask.
pub fn full_width(avx512_ratio: f64) -> bool {
    avx512_ratio >= FULL_WIDTH_PEAK_RATIO
}

/// B (one batch element's, f32) at most this large may be read in place together with A: it stays in L2 while the
/// row tiles sweep it. Larger ones are packed or paired with a packed A: a weight gradient's 1024 x 512 B read in
/// place with A (128 x 512 x 1024) won the hot-cache race and then ran 1.1 ms a step against 0.72 with A packed,
/// its B arriving from L3 between the steps' other kernels (`KILN_PROFILE=1 ... train_gpt`).
pub const SMALL_B_BYTES: usize = 128 * 1024;

/// Every legal candidate for `v` among the families `KILN_CPU_ISA` allows on this host ([`isa::allowed`]; none of
/// the generated ones where that setting is an error, which `select` reports), in a fixed order (the order is part
/// of the candidate-set checksum).
pub fn candidates(v: &GemmView, library: bool) -> Vec<GemmImpl> {
    candidates_for(v, library, isa::allowed().unwrap_or(&[]))
}

/// Whether `c` can read `v`'s B: any candidate for a plain B; for a patched B, a generated f32 kernel that packs
/// B (the one family that reads it, through its offset tables), with panels a multiple of 16 wide where a padding
/// is folded in (`patch`: only 16-column groups read one at speed).
pub(super) fn reads_patch(c: &GemmImpl, v: &GemmView) -> bool {
    match &v.b.patch {
        None => true,
        Some(p) => matches!(c, GemmImpl::Asm(c) if c.pack_b && (p.ranges.is_empty() || c.nr() % 16 == 0)),
    }
}

/// The register tiles (MR, NV) a family offers: large problems, and skinny ones (a few rows streaming B).
pub(super) fn tiles(isa: Isa, skinny: bool) -> &'static [(usize, usize)] {
    match (isa, skinny) {
        (Isa::Avx2, false) => &[(6, 2), (4, 3)],
        (Isa::Avx2, true) => &[(1, 4), (1, 8), (2, 4), (4, 2), (4, 3), (6, 2)],
        // 14x32 has the most accumulators per B load, 6x64 the fewest broadcasts per FMA; 8x48 sits between.
        (Isa::Avx512, false) => &[(14, 2), (8, 3), (6, 4)],
        (Isa::Avx512, true) => &[(1, 2), (1, 4), (2, 4), (4, 3), (8, 2), (8, 3)],
    }
}

/// K blocks a family offers for large problems. AVX-512 adds long blocks: at 16 lanes a tile's FMAs outrun the
/// C traffic of short ones, and its B micro-panel streams from L2 fast enough. Measured at 1024^3 on 2 threads,
/// interleaved (medians of 21; best runs): 14x32 with KC 1024 and A in place 277 GFLOP/s (311), KC 384 213-227
/// (230-240) for every tile; shorter blocks that keep the panel in L1 (6x64 at KC 96-128) 165-178.
fn large_kcs(isa: Isa) -> &'static [usize] {
    match isa {
        Isa::Avx2 => &[256, 384],
        Isa::Avx512 => &[256, 384, 1024],
    }
}

/// Whether bf16 configuration `a` can run `v` (bf16 operands, checked by the caller): a block its unit holds
/// (AMX: 16 or 32 rows, 1 or 2 tiles of columns; AVX512-BF16: `mr * nt` accumulators, `nt` B vectors and a
/// broadcast in 32 registers), B blocks of whole panels, and C's row stride times a block's rows within the
/// kernels' 32-bit displacements (A is always packed, its strides fixed).
pub fn bf16_legal(v: &GemmView, a: &Bf16Config) -> bool {
    let fit = |x: i64| x.unsigned_abs() < (1 << 30);
    let elem = if v.out == kiln_jit::DType::BF16 { 2 } else { 4 };
    let block = match a.unit {
        Bf16Unit::Amx => (a.mr == 16 || a.mr == 32) && (1..=2).contains(&a.nt),
        Bf16Unit::Avx512Bf16 => a.mr >= 1 && a.nt >= 1 && a.mr * a.nt + a.nt < 32,
    };
    block
        && a.nc > 0
        && a.nc.is_multiple_of(a.nr())
        && fit(v.n as i64 * elem * a.mr as i64)
        && (a.split != Split::Depth || a.unit == Bf16Unit::Amx && depth_split_legal(v))
}

/// Whether K may be split between threads: an unbatched GEMM of one row tile (at most 16 rows: the partials, M x N
/// per thread, are loaded and stored once per chunk of K) with K of several steps, and an epilogue that is the
/// accumulator, or its rounding to bf16 (the last pass applies nothing else). Measured against column strips, bf16,
/// K = N = 4096, B from memory, 2 threads (ms, two runs each): M = 16 2.28 / 2.25 against 2.56 / 2.54, M = 32 3.13
/// / 3.16 against 2.95 / 3.08, M = 64 5.11 / 4.72 against 3.68 / 3.74.
fn depth_split_legal(v: &GemmView) -> bool {
    let identity = v.roles.len() == if v.out == kiln_jit::DType::BF16 { 2 } else { 1 };
    v.batch.is_empty() && v.m <= 16 && v.k >= 4 * super::bf16::KSTEP && identity
}

/// The candidates for a bf16 GEMM, for each unit this host has. AMX: 32 x 32 blocks (four accumulator tiles, each A
/// and B tile read twice) and the narrower ones for a few rows or columns. AVX512-BF16: register tiles as the
/// AVX-512 f32 family's (14 x 32, 6 x 64), 1 x 64 and 4 x 48 for a few rows. B blocks as wide as L2 holds (1 MiB of
/// packed B), of 1024 columns or the whole width; threads splitting columns, rows or (AMX, a few rows) K.
fn bf16_candidates(v: &GemmView, out: &mut Vec<GemmImpl>) {
    // One row (a batch-1 layer) is left to the generic kernel, which reads the bf16 weight where it is: packing the
    // weight costs more than the product (the batch-1 MLP's 1 x 256 x 784: 37 µs on AMX against 13).
    if v.m == 1 {
        return;
    }
    let strip_cap = ((1usize << 20) / (v.k.next_multiple_of(super::bf16::KSTEP) * 2)).max(32);
    let amx: &[(usize, usize)] = &[(32, 2), (16, 2), (32, 1)];
    let dot: &[(usize, usize)] = if v.m <= 16 { &[(1, 4), (4, 3), (8, 2)] } else { &[(14, 2), (6, 4), (8, 3)] };
    for (unit, blocks) in [(Bf16Unit::Amx, amx), (Bf16Unit::Avx512Bf16, dot)] {
        if !super::bf16::unit_ready(unit) {
            continue;
        }
        for &(mr, nt) in blocks {
            if unit == Bf16Unit::Amx && (mr == 32 && v.m <= 16 || nt == 2 && v.n <= 16) {
                continue;
            }
            // Wider blocks too: a few rows use each packed panel once or twice, and a wide block reads each of B's
            // rows in a longer run (AMX, B from memory at M = 8 and 64, K = N = 4096: 1024 columns 2.43 / 3.74 ms,
            // 128 columns 2.74 / 3.69, 64 columns 4.29 / 5.44; the tuner's race runs on operands in cache and does
            // not see this, so the set is what keeps a bad width out).
            for nc in [strip_cap.next_multiple_of(16 * nt), 1024, v.n.next_multiple_of(16 * nt)] {
                for split in [Split::Cols, Split::Rows, Split::Depth] {
                    let a = Bf16Config { unit, mr, nt, nc: nc.min(v.n.next_multiple_of(16 * nt)), split };
                    let imp = GemmImpl::Bf16(a);
                    if bf16_legal(v, &a) && !out.contains(&imp) {
                        out.push(imp);
                    }
                }
            }
        }
    }
}

/// [`candidates`] for an explicit list of families (tests force each).
pub fn candidates_for(v: &GemmView, library: bool, isas: &[Isa]) -> Vec<GemmImpl> {
    let mut out = Vec::new();
    if v.operands == kiln_jit::DType::BF16 {
        bf16_candidates(v, &mut out);
        return out;
    }
    // Clamping makes many configs equal on small problems; a set keeps the dedup linear (it was the bulk of a
    // warm process's first GEMM lookup: ~50 µs for 97 candidates with `Vec::contains`, still 46 µs for the 720
    // configs a skinny problem walks with std's SipHash set; Fx hashing is enough for a dedup).
    let mut seen = rustc_hash::FxHashSet::default();
    let b_inplace_ok = v.b.cols == 1;
    let skinny = v.m <= SKINNY_M;
    // K split: B packed only. Its B is an output gradient stored token by token, read in place a row apart per
    // k-step; forced in the GPT step (128 x 512 x 1024, K blocks of 256) packed B ran 546-581 µs a launch, in place
    // 594-685 (the model had scored the two alike). Skinny ones too: the benchmark MLP's last weight gradient (10 x
    // 128 x 1024, its update fused) ran 39-41 µs a launch in the step on the `gemm` crate, 26-28 split over K.
    let depth = f32_depth_legal(v);
    let small_b = v.k * v.n * 4 <= SMALL_B_BYTES;
    for &isa in isas {
        let lanes = isa.lanes();
        // Skinny problems stream B from memory: short K blocks keep the rows a tile sweep touches few enough for
        // the hardware prefetchers (a 4096-wide row is read in one pass per block instead of in 64 separate
        // strips).
        let kcs: &[usize] = if skinny { &[4, 8, 32, 128, 384] } else { large_kcs(isa) };
        for &(mr, nv) in tiles(isa, skinny) {
            for &kc in kcs {
                for mc_mult in [12, 24] {
                    for nc in [1024, 4096] {
                        // A skinny problem reads A (a few rows) in place. A larger one packs A, or reads it in
                        // place with B packed: the kernel then broadcasts from MR row streams instead of one
                        // packed panel, and no thread spends time transposing A into panels. Measured (`kiln tune
                        // --mode full`, 2 threads, AVX2, each shape's best of either): 1024 x 128 x 256 310-313 ->
                        // 294 µs, 1024 x 256 x 128 310-314 -> 297-300, 128 x 256 x 784 331-351 -> 317-322, 1024 x
                        // 256 x 1024 (W stored N x K) 2501-2516 -> 2462, 1024^3 10070 -> 9865; 2048^3 and A stored
                        // transposed (a weight gradient's `dy.t()`) within noise either way. The races decide per
                        // shape.
                        // Both in place also where B is small (a batch element's B within `SMALL_B_BYTES`)
                        // and A one block with B's rows contiguous (the filter below): attention's batched
                        // products (64 x (64 x 64 @ 64 x 32)) then pack nothing, where each batch element had
                        // packed one operand.
                        let reads: &[(bool, bool)] = if skinny {
                            &[(false, true), (false, false)]
                        } else if small_b {
                            &[(true, true), (true, false), (false, true), (false, false)]
                        } else {
                            &[(true, true), (true, false), (false, true)]
                        };
                        for &(pack_a, pack_b) in reads {
                            // B in place needs its rows contiguous (kn); it saves packing a weight that is read by
                            // few row blocks (skinny, or M within one MC block).
                            if !(pack_b || b_inplace_ok && (skinny || v.m <= mr * mc_mult)) {
                                continue;
                            }
                            for (split, prefetch) in
                                [(Split::Cols, 0), (Split::Rows, 0), (Split::Cols, 8), (Split::Depth, 0)]
                            {
                                if split == Split::Rows && skinny
                                    || prefetch > 0 && pack_b
                                    || split == Split::Depth && !(depth && pack_b)
                                {
                                    continue;
                                }
                                // Blocks larger than the problem behave like the problem's size: clamp, then drop
                                // duplicates, so the configs timed first really differ.
                                let c = GemmConfig {
                                    isa,
                                    mr,
                                    nv,
                                    kc: kc.min(v.k.next_multiple_of(16)),
                                    mc: (mr * mc_mult).min(v.m.next_multiple_of(mr)),
                                    nc: nc.min(v.n.next_multiple_of(lanes * nv)),
                                    pack_a,
                                    pack_b,
                                    split,
                                    unroll: 4,
                                    prefetch,
                                };
                                if legal(v, &c) && seen.insert(c) {
                                    out.push(GemmImpl::Asm(c));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if library && v.batch.is_empty() {
        out.push(GemmImpl::Library);
    }
    if dot_legal(v) {
        out.push(GemmImpl::Dot);
    }
    if splitk_legal(v) {
        out.push(GemmImpl::SplitK);
    }
    if transposed_legal(v) {
        let t = v.transposed();
        for &isa in isas {
            for &(mr, nv) in tiles(isa, false) {
                for kc in [256, 384] {
                    // Threads split the transposed problem's rows: W's rows, as the forward's other candidates and
                    // the weight's update do.
                    let c = GemmConfig {
                        isa,
                        mr,
                        nv,
                        kc: kc.min(t.k.next_multiple_of(16)),
                        mc: (mr * 12).min(t.m.next_multiple_of(mr)),
                        nc: t.n.next_multiple_of(isa.lanes() * nv),
                        pack_a: false,
                        pack_b: true,
                        split: Split::Rows,
                        unroll: 4,
                        prefetch: 0,
                    };
                    if legal(&t, &c) && seen.insert(c) {
                        out.push(GemmImpl::Transposed(c));
                    }
                }
            }
        }
    }
    out.retain(|c| reads_patch(c, v));
    out
}

/// Rows of A up to which the transposed candidate is offered: past that, packing A (x) costs as much as packing B
/// (W) and the transpose is extra.
pub const TRANSPOSED_MAX_M: usize = 64;

/// Whether the transposed candidate can run `v`: unbatched, more rows than the dot products take and at most
/// [`TRANSPOSED_MAX_M`], B's columns contiguous along K (W stored N x K: `x @ W^T`, so W is the transposed
/// problem's A, read in place), and N at least a register tile.
pub fn transposed_legal(v: &GemmView) -> bool {
    v.batch.is_empty() && v.m > DOT_MAX_M && v.m <= TRANSPOSED_MAX_M && v.b.rows == 1 && v.n >= 16 && v.k > 0
}

/// Rows of A up to which the dot-product candidate is offered. Past that its speed would still win (32 x 256 x 784:
/// ~200 GFLOP/s on two threads against ~100 for the packing kernels), but its sums run along K in eight lanes and
/// are added at the end, an order unlike every other candidate's and PyTorch's (one FMA chain along K per output
/// element, in K blocks): more accurate against f64 (mean error 1.1e-8 against 2.2e-8 there), yet the recorded
/// PyTorch run of the benchmark MLP at batch 32 (`tests/optim.rs`, 1e-4 relative on every loss, as issue 4 asks)
/// drifted to 2.7e-4 through its loss spike with it, against 1.1e-5 without. A linear layer at a few rows has no
/// other fast candidate (the packing kernels copy all of W per call).
pub const DOT_MAX_M: usize = 8;

/// Whether the dot-product candidate can run `v`: unbatched, at most [`DOT_MAX_M`] rows, and A's rows and B's
/// columns contiguous along K (B stored N x K: `x @ W^T`).
pub fn dot_legal(v: &GemmView) -> bool {
    v.batch.is_empty() && v.m <= DOT_MAX_M && v.a.cols == 1 && v.b.rows == 1 && v.k > 0
}

/// Whether the split-K candidate can run `v`: unbatched, at most [`DOT_MAX_M`] rows (each row of A streams B once),
/// B's rows contiguous along N (B stored K x N: `dy @ W`), and K long enough for two parts of 16 rows.
pub fn splitk_legal(v: &GemmView) -> bool {
    v.batch.is_empty() && v.m <= DOT_MAX_M && v.b.cols == 1 && v.k >= 32 && v.n > 0
}

/// Bytes of B in one split-K part (its rows of B) above which they come from memory rather than a core's L2 (512 KiB
/// on Zen 3, 1 MiB on Zen 4): the split-K GEMV then reads them a few rows at a time (`cpu/gemm/splitk.rs`), front
/// to back.
pub const SPLITK_STREAMED_PART_BYTES: usize = 512 * 1024;

/// The largest K (a batch, for a weight's update `dy^T x`) at which the update is bound by reading and writing the
/// weight rather than by its FMAs, so that where the weight's lines live decides its speed ([`step_candidates`]).
/// At batch 256 (K = 256) restricting it to row splits cost ~1 %.
pub const UPDATE_MAX_K: usize = 64;

/// What a compiled plan does around one of its GEMMs, beyond the GEMM itself: whether it writes over the GEMM's B
/// (a training step's weight, read here by an input gradient `dy @ W`) or writes the GEMM's output over one of its
/// inputs (the weight's update `W - lr * dy^T x`). Timed alone, a GEMM cannot show what these cost: which core's
/// cache holds the weight's lines when the next kernel reads or writes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StepContext {
    pub b_rewritten: bool,
    pub output_replaces_input: bool,
    /// B is a patched operand (`kiln_jit::kernel::gemm::Patch`): only generated kernels that pack B read it. Its
    /// canonical tuning problem is a plain GEMM, so the context carries this, and it narrows the candidates (and
    /// so the tuning key, which holds them).
    pub patched_b: bool,
    /// The output is an intermediate the plan's later kernels read (not a plan output).
    pub output_read_later: bool,
    /// A or B is an intermediate the plan's earlier kernels wrote (not a plan input).
    pub operand_written_here: bool,
}

/// The candidates for a GEMM in a compiled plan: [`candidates`], narrowed where the plan around it decides what is
/// fast better than an isolated race can (`cpu/gemm/splitk.rs` has the measurements):
/// - B rewritten and split K legal: split K alone. Its threads take W's rows, as the forward GEMV and the update do;
///   timed alone the broadcast kernels win by ~15 % (see `splitk_score`), in the step they make half of W's cache
///   lines move between the cores twice (batch-1 benchmark MLP: 34-42 µs a step with split K, 39-69 without).
/// - The output replaces an input (a weight's update) and K is at most [`UPDATE_MAX_K`]: only generated kernels
///   whose threads split the rows (M), as the forward GEMM splits the weight's rows, where any exists (the library
///   and column splits write lines the other core holds). The batch-32 benchmark MLP step (its two updates at K =
///   32): 220.6-225.3 -> 212.1-216.2 µs, five interleaved pairs; batch 256 and 1024 unchanged within noise.
/// - The output is an intermediate of at least [`TALL_ROWS`] rows that later kernels read, and K is at most a
///   quarter of M: no generated kernel whose threads split the columns, where one splitting the rows exists. The
///   rows are a step's tokens, and the elementwise and row kernels after it cut them between the threads by rows: a
///   column split leaves half of every row they read in the other core's cache. The GPT step's two `1024 x 512 x
///   128` products (the first MLP layer and its gradient with GELU's, which the race had split by columns), split
///   by rows: 19.38-19.71 -> 19.05-19.36 ms a step, four interleaved pairs, fresh caches. Split by rows, each thread
///   packs all of B, which costs where K is long against M: the benchmark MLP's `512 x 256 x 784` forward ran 487
///   -> 523 µs a launch so (its step 1415 -> 1480 µs), hence the bound on K.
/// - A weight gradient over tokens (`x^T dy`, A and B stored token by token, [`f32_depth_legal`]) with an operand
///   the plan wrote: only the K split (`Split::Depth`), whose threads read the tokens their own earlier kernels
///   wrote. Split over M or N every thread reads every token, and leaves its lines shared between the caches, so
///   the kernel writing that buffer in the next step pays for taking them back. Timed alone the column split can
///   win, so a race would pick it: in the batch-512 benchmark MLP step the `128 x 256 x 512` weight gradient (SGD
///   update fused) ran 145 µs a launch split over N against 125 split over K, and the `512 x 128 x 10` input
///   gradient that writes its A in the next step 32 against 12 µs (the step 1888 -> 1845 µs, three interleaved
///   pairs, each candidate forced).
///
/// The candidate set is part of the tuning key, so these records never mix with an isolated GEMM's.
pub fn step_candidates(v: &GemmView, library: bool, cx: StepContext) -> Vec<GemmImpl> {
    if cx.patched_b {
        return candidates(v, library).into_iter().filter(|c| reads_patch(c, v)).collect();
    }
    if cx.b_rewritten && splitk_legal(v) {
        return vec![GemmImpl::SplitK];
    }
    let mut all = candidates(v, library);
    let cols = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Cols);
    let rows = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Rows);
    if cx.output_read_later && v.batch.is_empty() && v.m >= TALL_ROWS && v.k * 4 <= v.m && all.iter().any(rows) {
        all.retain(|c| !cols(c));
    }
    let depth = |c: &GemmImpl| matches!(c, GemmImpl::Asm(c) if c.split == Split::Depth);
    if cx.operand_written_here && over_tokens(v) && all.iter().any(depth) {
        all.retain(depth);
        return all;
    }
    if cx.output_replaces_input && v.k <= UPDATE_MAX_K {
        let split_rows: Vec<GemmImpl> = all.iter().copied().filter(rows).collect();
        if !split_rows.is_empty() {
            return split_rows;
        }
    }
    all
}

/// Fewest rows of an intermediate GEMM output that `step_candidates` keeps from column splits.
pub const TALL_ROWS: usize = 256;

/// Whether an `mr x lanes*nv` register tile fits the family's registers (16 ymm, 32 zmm): `mr * nv` accumulators,
/// `nv` B vectors (none for one row, whose FMAs read B from memory) and one broadcast register.
pub fn fits(isa: Isa, mr: usize, nv: usize) -> bool {
    let b_regs = if mr == 1 { 0 } else { nv };
    mr >= 1 && nv >= 1 && mr * nv + b_regs < isa.registers()
}

/// Into how many rectangles (row or column strips) the threads cut each batch element of `c` on `v`. A batch of at
/// least four elements a thread is shared out whole: cut in two, each half of a small element packed the operand
/// both halves read (the cost model weighs the split the same way, `cost::score`).
pub fn parts_per_batch_element(v: &GemmView, c: &GemmConfig, threads: usize) -> usize {
    if v.batch_count() >= 4 * threads {
        return 1;
    }
    let units = match c.split {
        Split::Rows => v.m.div_ceil(c.mr),
        Split::Cols => v.n.div_ceil(c.nr()),
        Split::Depth => v.k / DEPTH_MIN_K_PER_PART,
    };
    threads.clamp(1, units.max(1))
}

/// Fewest steps of K a thread of a K-split f32 GEMM takes: below that its partial's pass costs more than its share
/// of the products saves.
pub const DEPTH_MIN_K_PER_PART: usize = 128;

/// Largest C (bytes) a K-split f32 GEMM is offered for: each thread but the first writes a partial of C's size,
/// which the last pass reads back from that thread's cache.
pub const DEPTH_MAX_C_BYTES: usize = 1 << 20;

/// Whether the f32 generated kernels may split K between threads (`Split::Depth`): an unbatched GEMM, K at least M
/// and N (a sum over a step's tokens: a weight gradient `x^T dy`), at least two parts' worth of K, and a C within
/// [`DEPTH_MAX_C_BYTES`]. Any epilogue: the partials are added after every thread's products, and an epilogue beyond
/// the accumulator (an optimizer's update fused into its weight gradient) then runs as a pass over the sums.
///
/// K at least twice M and N had left out the benchmark MLP's first weight gradient (`256 x 784 x 1024` with its SGD
/// update): in the batch-1024 step it ran 1500-1583 µs a launch split over K against 1516-1643 split over N, and
/// the input gradient writing its A in the next step 234-252 against 244-262.
pub fn f32_depth_legal(v: &GemmView) -> bool {
    v.batch.is_empty()
        && v.out == kiln_jit::DType::F32
        && v.k >= 2 * DEPTH_MIN_K_PER_PART
        && v.k >= v.m.max(v.n)
        && v.m * v.n * 4 <= DEPTH_MAX_C_BYTES
}

/// Whether `v` is a weight gradient summed over a step's tokens (`x^T dy`): A and B stored token by token (K-major
/// A, row-major B) and the K split legal. The plan offers such a product the K split alone (`step_candidates`),
/// and the cost model prices its other splits for reading tokens the other core wrote (`cost::tokens_split_factor`).
pub fn over_tokens(v: &GemmView) -> bool {
    v.a.rows == 1 && v.b.cols == 1 && f32_depth_legal(v)
}

/// Whether every displacement the kernels need fits an i32 (a stride of a huge matrix might not).
pub fn legal(v: &GemmView, c: &GemmConfig) -> bool {
    let fit = |x: i64| x.unsigned_abs() < (1 << 30);
    let ldc = v.n as i64 * 4;
    let a_ok = c.pack_a || (fit(v.a.cols * 4 * c.unroll as i64) && fit(v.a.rows * 4 * c.mr as i64));
    let b_ok = c.pack_b || (v.b.cols == 1 && fit(v.b.rows * 4 * c.unroll as i64));
    fits(c.isa, c.mr, c.nv)
        && (c.split != Split::Depth || f32_depth_legal(v))
        && a_ok
        && b_ok
        && fit(ldc * c.mr as i64)
        && c.mc.is_multiple_of(c.mr)
        && c.nc.is_multiple_of(c.nr())
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::cost::score;
    use super::*;
    use kiln_jit::kernel::gemm::GemmOperand;

    /// A plain `m x n x k` GEMM view: A and B stored row-major, f32.
    pub(in crate::cpu::gemm) fn view(m: usize, n: usize, k: usize) -> GemmView {
        let op = |rows: i64, cols: i64| GemmOperand { buf: 0, offset: 0, batch: vec![], rows, cols, patch: None };
        GemmView {
            batch: vec![],
            m,
            n,
            k,
            a: op(k as i64, 1),
            b: op(n as i64, 1),
            roles: vec![],
            operands: kiln_jit::DType::F32,
            out: kiln_jit::DType::F32,
        }
    }

    /// A problem past the skinny rows offers each register tile with A packed and with A read in place (B
    /// packed), as two families, so fast mode's two timed slots race one of each (`kiln_autotune`'s
    /// `search::timed_set` takes the best of each family first); a skinny one never packs A. The AVX2 family's
    /// tiles, whatever `KILN_CPU_ISA` says.
    #[test]
    fn larger_problems_offer_a_packed_and_in_place() {
        for (m, n, k) in [(1024, 1024, 1024), (1024, 128, 256), (17, 300, 77)] {
            let cands = candidates_for(&view(m, n, k), true, &[Isa::Avx2]);
            for (mr, nv) in [(6, 2), (4, 3)] {
                for pack_a in [true, false] {
                    assert!(
                        cands.iter().any(|c| matches!(c, GemmImpl::Asm(c)
                            if c.mr == mr && c.nv == nv && c.pack_a == pack_a && c.pack_b)),
                        "{m}x{n}x{k}: no {mr}x{} candidate with pack_a = {pack_a}",
                        8 * nv
                    );
                }
            }
            let families: std::collections::BTreeSet<String> = cands.iter().map(|c| c.family()).collect();
            assert!(families.contains("avx2: packed A, packed B") && families.contains("avx2: A in place, packed B"));
        }
        let skinny = candidates_for(&view(SKINNY_M, 300, 77), true, &Isa::ALL);
        assert!(!skinny.iter().any(|c| matches!(c, GemmImpl::Asm(c) if c.pack_a)));
    }

    /// The instruction set is part of a generated kernel's family and is its group (`GemmImpl::group`), so fast
    /// mode's two timed slots (the best of each group first) race AVX2 against AVX-512 wherever both are
    /// candidates, instead of two packings of one of them.
    #[test]
    fn each_instruction_set_is_a_family_of_its_own() {
        let cands = candidates_for(&view(128, 512, 1024), true, &Isa::ALL);
        let family_of = |isa: Isa| {
            cands
                .iter()
                .find(|c| matches!(c, GemmImpl::Asm(a) if a.isa == isa && a.pack_a && a.pack_b))
                .map(|c| c.family())
        };
        let (avx2, avx512) = (family_of(Isa::Avx2), family_of(Isa::Avx512));
        assert_eq!(avx2.as_deref(), Some("avx2: packed A, packed B"));
        assert_eq!(avx512.as_deref(), Some("avx512: packed A, packed B"));
    }

    /// Fast mode's two timed slots (the best of each group first, `kiln_autotune::timed_configs`) with the scores
    /// the model gave 1024^3 on the Ice Lake Xeon: where the 512-bit FMAs are double-pumped they race AVX2 against
    /// AVX-512; where they are full width, AVX-512's best 14x32 against its best other tile (6x64, which won there),
    /// not against AVX2, which the measured peaks already rank below. The library keeps its group either way.
    #[test]
    fn groups_are_instruction_sets_where_double_pumped_and_tiles_where_full_width() {
        let v = view(1024, 1024, 1024);
        let cands = candidates_for(&v, true, &Isa::ALL);
        let find = |isa: Isa, mr: usize, nv: usize, kc: usize, pack_a: bool| {
            cands
                .iter()
                .find(|c| {
                    matches!(c, GemmImpl::Asm(a) if a.isa == isa && a.mr == mr && a.nv == nv && a.kc == kc
                        && a.pack_a == pack_a && a.split == Split::Cols && a.prefetch == 0)
                })
                .copied()
                .unwrap_or_else(|| panic!("no {isa:?} {mr}x{nv} kc{kc} candidate"))
        };
        let scored = [
            (find(Isa::Avx512, 14, 2, 1024, false), 252.0),
            (find(Isa::Avx512, 14, 2, 256, true), 245.0),
            (find(Isa::Avx512, 6, 4, 256, false), 208.0),
            (find(Isa::Avx2, 6, 2, 256, false), 169.0),
            (GemmImpl::Library, 120.0),
        ];
        let timed = |full_width: bool| -> Vec<String> {
            let list: Vec<kiln_autotune::Candidate<'_, GemmImpl>> = scored
                .iter()
                .map(|(imp, score)| kiln_autotune::Candidate {
                    config: imp,
                    name: imp.name(),
                    score: *score,
                    group: imp.group(full_width),
                    family: imp.family(),
                    shape: imp.shape(),
                })
                .collect();
            kiln_autotune::timed_configs(&list, kiln_autotune::Mode::Fast).iter().map(|c| c.name()).collect()
        };
        assert_eq!(timed(false), [scored[0].0.name(), scored[3].0.name()]);
        assert_eq!(timed(true), [scored[0].0.name(), scored[2].0.name()]);
        assert_eq!(GemmImpl::Library.group(true), GemmImpl::Library.group(false));
    }

    #[test]
    fn every_candidate_is_legal_distinct_and_named_reversibly() {
        for (m, n, k) in [(1, 4096, 4096), (8, 300, 77), (64, 64, 64), (1024, 1024, 1024), (1000, 17, 3)] {
            let v = view(m, n, k);
            let cands = candidates(&v, true);
            assert!(!cands.is_empty());
            for (i, c) in cands.iter().enumerate() {
                assert_eq!(GemmImpl::parse(&c.name()), Some(*c), "{}", c.name());
                assert!(!cands[..i].contains(c), "duplicate {}", c.name());
                if let GemmImpl::Asm(cfg) = c {
                    assert!(legal(&v, cfg) && fits(cfg.isa, cfg.mr, cfg.nv));
                }
                assert!(score(&v, c, 2).is_finite());
            }
        }
        // B stored N x K (a linear layer): the dot-product candidate joins at a few rows, named reversibly.
        let mut linear = view(4, 300, 77);
        linear.b = GemmOperand { buf: 0, offset: 0, batch: vec![], rows: 1, cols: 77, patch: None };
        let cands = candidates(&linear, true);
        assert!(cands.contains(&GemmImpl::Dot) && dot_legal(&linear));
        assert_eq!(GemmImpl::parse(&GemmImpl::Dot.name()), Some(GemmImpl::Dot));
        assert!(score(&linear, &GemmImpl::Dot, 2).is_finite());
        linear.m = DOT_MAX_M + 1;
        assert!(!candidates(&linear, true).contains(&GemmImpl::Dot));
        assert_eq!(GemmImpl::parse("avx2:6x16:kc256"), None);
        // The hand-written name is the format the records on disk hold.
        let c = GemmConfig {
            isa: Isa::Avx2,
            mr: 6,
            nv: 2,
            kc: 256,
            mc: 72,
            nc: 1024,
            pack_a: true,
            pack_b: false,
            split: Split::Rows,
            unroll: 4,
            prefetch: 0,
        };
        assert_eq!(GemmImpl::Asm(c).name(), "avx2:6x16:kc256:mc72:nc1024:pArB:sM:u4:pf0");
        let c = GemmConfig {
            isa: Isa::Avx2,
            mr: 1,
            nv: 15,
            kc: 4,
            mc: 1,
            nc: 120,
            pack_a: false,
            pack_b: true,
            split: Split::Cols,
            unroll: 10,
            prefetch: 8,
        };
        assert_eq!(GemmImpl::Asm(c).name(), "avx2:1x120:kc4:mc1:nc120:rApB:sN:u10:pf8");
        assert!(!fits(Isa::Avx2, 3, 4) && fits(Isa::Avx2, 6, 2) && fits(Isa::Avx2, 1, 15));
        assert!(fits(Isa::Avx512, 14, 2) && fits(Isa::Avx512, 6, 4) && !fits(Isa::Avx512, 8, 4));
        let wide = GemmConfig { isa: Isa::Avx512, mr: 14, nv: 2, ..c };
        assert_eq!(GemmImpl::Asm(wide).name(), "avx512:14x32:kc4:mc1:nc120:rApB:sN:u10:pf8");
        assert_eq!(GemmImpl::parse(&GemmImpl::Asm(wide).name()), Some(GemmImpl::Asm(wide)));
    }
}
