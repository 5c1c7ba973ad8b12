//! Packing a patched B (`kiln_jit::kernel::gemm::Patch`): a convolution's patches read where its input stores them
//! (implicit im2col), element (k, n) at `rows[k] + cols[n]` through offset tables evaluated once per compiled
//! GEMM, and zero where a folded padding's ranges fail.
//!
//! With AVX-512 and panels a multiple of 16 wide, columns are packed in groups of 16, each described once per row
//! class (rows that keep the same columns inside the padding, `Patch::row_classes`: a 3 x 3 window's nine taps) by
//! at most two runs of consecutive elements inside the padding: a group that is one whole run is one 16-lane load
//! per k-step, one of two runs a masked load each (what lies outside the padding or past the last column is a
//! masked-off lane, never read, left zero), one with more runs (a strided convolution's columns) one gather
//! instruction of lane offsets precomputed per group. No masked load is issued with an empty mask: its address may
//! lie outside the buffer, where a masked load costs a fault-suppression assist. Whole runs are plain loads (masked,
//! they measured slower). Elsewhere
//! (AVX2 panels of 16 or 24) a patch without a padding is packed in pieces: runs of at least [`MIN_COPY`]
//! consecutive elements as slice copies, the rest element by element. The schedule folds a padding only where
//! AVX-512 runs (`ScheduleOptions::patched_pad`) and only configurations with such panels read it
//! (`config::reads_patch`); element by element is the fallback that never runs in practice.
//!
//! Measured by packing a 3 x 3 convolution's patches (64 channels, 56 x 56, K blocks of 192 by 1024 columns, 32
//! wide) in a loop, one thread: the pieces 300-330 µs an image from the padded input, the groups 205-270 from the
//! padded input and 220-300 with the padding folded in; the same groups read 8 lanes at a time with `vmaskmovps`
//! 630. With the pieces reading the folded input the whole convolution was slower than storing the padded input
//! first (more, shorter pieces); with the groups it is faster (`bench_conv`'s 3x3 layer).

use kiln_jit::kernel::gemm::Patch;

use crate::cpu::isa::{self, Isa};

/// Columns per group.
const GROUP: usize = 16;

/// Consecutive elements at least this long are packed as one slice copy per k-step by the pieces; shorter pieces
/// element by element (a slice copy of a few floats costs a call, and per-run bookkeeping costs more than the plain
/// gather: measured on a 3 x 3 stride-2 convolution and the weight gradient's 3-wide runs).
const MIN_COPY: usize = 16;

/// A patched B's offsets, evaluated for one GEMM, and each row class's column groups.
pub(super) struct PatchTables {
    /// Offset of each k-step's elements.
    rows: Vec<i64>,
    /// Offset of each column's elements.
    cols: Vec<i64>,
    /// Each k-step's row class (all 0 where no padding is folded).
    class: Vec<u32>,
    /// A padding is folded in (`Patch::ranges`): columns outside it are zeros, never read.
    folded: bool,
    /// Groups of 16 columns: `ceil(n / 16)`.
    groups: usize,
    /// Group `g` of class `c`: `group[c * groups + g]`.
    group: Vec<Group>,
    /// Per group, its columns' offsets from its first column's, for a gather (the same for every class); `None`
    /// past 32 bits (read lane by lane). Empty where no group gathers.
    lanes: Vec<Option<[i32; GROUP]>>,
    /// Whether the 16-lane groups may run (`KILN_CPU_ISA` allows AVX-512), decided once.
    wide: bool,
}

/// How one group of 16 columns is read for one row class: at most two runs of consecutive elements (lanes of
/// `mask[i]` from `off[i]` on: lane `j` at `off[i] + j`; an empty mask is no run), or where `gather`, each lane of
/// `mask[0]` at its own column's offset (`PatchTables::lanes`).
#[derive(Clone, Copy, Default)]
struct Group {
    off: [i64; 2],
    mask: [u16; 2],
    gather: bool,
}

/// The part of B one call packs: k-steps `k0..k0 + kb` and columns `n0..n0 + nb`, into panels `nr` wide.
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub k0: usize,
    pub kb: usize,
    pub n0: usize,
    pub nb: usize,
    pub nr: usize,
}

impl PatchTables {
    /// `p` evaluated for `k` k-steps and `n` columns.
    pub(super) fn new(p: &Patch, k: usize, n: usize) -> PatchTables {
        let table = |e: &kiln_jit::kernel::IExpr, n: usize| (0..n as i64).map(|i| e.eval(&[i])).collect::<Vec<_>>();
        let (rows, cols) = (table(&p.rows, k), table(&p.cols, n));
        let class: Vec<u32> = p.row_classes(k, n).into_iter().map(|c| c as u32).collect();
        let range_cols: Vec<Vec<i64>> = p.ranges.iter().map(|r| table(&r.cols, n)).collect();
        let classes = class.iter().max().map_or(1, |&c| c as usize + 1);
        // One k-step of each class: its range parts decide the class's columns inside the padding.
        let mut first = vec![0; classes];
        for (i, &c) in class.iter().enumerate().rev() {
            first[c as usize] = i as i64;
        }
        let groups = n.div_ceil(GROUP);
        let mut group = Vec::with_capacity(classes * groups);
        for &i in &first {
            let at: Vec<i64> = p.ranges.iter().map(|r| r.rows.eval(&[i])).collect();
            let inside = |j: usize| {
                p.ranges.iter().zip(&at).zip(&range_cols).all(|((r, a), c)| (r.lo..r.hi).contains(&(a + c[j])))
            };
            for g in 0..groups {
                let j0 = g * GROUP;
                let (mut runs, mut all) = (0, 0u16);
                let mut x = Group::default();
                for j in j0..(j0 + GROUP).min(n) {
                    if !inside(j) {
                        continue;
                    }
                    let bit = 1u16 << (j - j0);
                    if all & (bit >> 1) == 0 || cols[j] != cols[j - 1] + 1 {
                        runs += 1;
                        if runs <= 2 {
                            x.off[runs - 1] = cols[j] - (j - j0) as i64;
                        }
                    }
                    if runs <= 2 {
                        x.mask[runs - 1] |= bit;
                    }
                    all |= bit;
                }
                if runs > 2 {
                    x = Group { off: [0; 2], mask: [all, 0], gather: true };
                }
                group.push(x);
            }
        }
        let lanes = if group.iter().any(|g| g.gather) {
            let offsets = |g: usize| -> Option<[i32; GROUP]> {
                let (j0, mut out) = (g * GROUP, [0; GROUP]);
                for (j, x) in out.iter_mut().enumerate() {
                    *x = i32::try_from(cols.get(j0 + j).map_or(0, |c| c - cols[j0])).ok()?;
                }
                Some(out)
            };
            (0..groups).map(offsets).collect()
        } else {
            Vec::new()
        };
        let (folded, wide) = (!p.ranges.is_empty(), isa::allows(Isa::Avx512));
        PatchTables { rows, cols, class, folded, groups, group, lanes, wide }
    }

    /// Packs block `b` of the patched B at `src` into NR-wide panels as `pack::pack_b`, zero-padded past the last
    /// column.
    ///
    /// # Safety
    /// `src + rows[k] + cols[n]` must be valid for every k and n in range whose element lies inside the padding,
    /// and `dst` for `ceil(nb / nr) * nr * kb` floats.
    pub(super) unsafe fn pack(&self, dst: *mut f32, src: *const f32, b: Block) {
        // SAFETY (each arm): the caller's contract; AVX-512F where the host has it.
        unsafe {
            if self.wide && b.n0.is_multiple_of(GROUP) && b.nr.is_multiple_of(GROUP) {
                self.pack_groups(dst, src, b)
            } else if !self.folded {
                self.pack_pieces(dst, src, b)
            } else {
                self.pack_by_element(dst, src, b)
            }
        }
    }

    /// [`PatchTables::pack`] a group of 16 columns at a time.
    ///
    /// # Safety
    /// As [`PatchTables::pack`], `n0` and `nr` multiples of 16, and the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack_groups(&self, dst: *mut f32, src: *const f32, b: Block) {
        let Block { k0, kb, n0, nb, nr } = b;
        use std::arch::x86_64::*;
        let (first, last) = (n0 / GROUP, (n0 + nb).div_ceil(GROUP));
        // The lanes of the block's last group up to its last column (a block ending inside a group: the groups
        // describe all of N).
        let tail: u16 = match (n0 + nb) % GROUP {
            0 => u16::MAX,
            r => (1 << r) - 1,
        };
        for p in 0..nb.div_ceil(nr) {
            let g0 = first + p * nr / GROUP;
            // Groups past the block's last column stay zeros (the kernels read whole panels).
            let live = last.min(g0 + nr / GROUP) - g0;
            for k in 0..kb {
                let (r, c) = (self.rows[k0 + k], self.class[k0 + k] as usize);
                let groups = &self.group[c * self.groups + g0..c * self.groups + g0 + live];
                // SAFETY: panel p's line k is within `dst`'s `panels * nr * kb` floats.
                let line = unsafe { dst.add((p * kb + k) * nr) };
                for i in 0..nr / GROUP {
                    let x = match groups.get(i) {
                        None => _mm512_setzero_ps(),
                        Some(e) if e.mask[0] == 0 => _mm512_setzero_ps(),
                        Some(e) if e.gather => {
                            let j0 = (g0 + i) * GROUP;
                            match &self.lanes[g0 + i] {
                                // SAFETY: the gather reads only the mask's lanes, each an element inside the
                                // padding at its column's offset from the group's first, readable per the caller.
                                Some(offsets) => unsafe {
                                    let idx = _mm512_loadu_si512(offsets.as_ptr().cast());
                                    let at = src.wrapping_offset((r + self.cols[j0]) as isize);
                                    _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), e.mask[0], idx, at)
                                },
                                None => {
                                    let mut lanes = [0f32; GROUP];
                                    let inside = lanes.iter_mut().enumerate().filter(|&(j, _)| e.mask[0] >> j & 1 != 0);
                                    for (j, x) in inside {
                                        // SAFETY: lane j's element is inside the padding, per the caller.
                                        *x = unsafe { *src.offset((r + self.cols[j0 + j]) as isize) };
                                    }
                                    // SAFETY: `lanes` holds 16 floats.
                                    unsafe { _mm512_loadu_ps(lanes.as_ptr()) }
                                }
                            }
                        }
                        // (A gather group may have every lane inside too.)
                        Some(e) if e.mask == [u16::MAX, 0] => {
                            // SAFETY: all 16 lanes are inside the padding, readable per the caller.
                            unsafe { _mm512_loadu_ps(src.offset((r + e.off[0]) as isize)) }
                        }
                        Some(e) => {
                            let at = |i: usize| src.wrapping_offset((r + e.off[i]) as isize);
                            // SAFETY: each run's lanes are readable, per the caller; masked-off lanes are not read
                            // and do not fault, their addresses only formed (wrapping); an empty run is not loaded.
                            unsafe {
                                let x = _mm512_maskz_loadu_ps(e.mask[0], at(0));
                                if e.mask[1] == 0 { x } else { _mm512_mask_loadu_ps(x, e.mask[1], at(1)) }
                            }
                        }
                    };
                    let x = if g0 + i + 1 == last { _mm512_maskz_mov_ps(tail, x) } else { x };
                    // SAFETY: within the line's nr floats.
                    unsafe { _mm512_storeu_ps(line.add(i * GROUP), x) };
                }
            }
        }
    }

    /// [`PatchTables::pack`] for a patch without a padding: each panel split once into pieces, runs of at least
    /// [`MIN_COPY`] consecutive elements (a row of output positions at stride 1) copied as slices per k-step, the
    /// columns between them read element by element.
    ///
    /// # Safety
    /// As [`PatchTables::pack`].
    unsafe fn pack_pieces(&self, dst: *mut f32, src: *const f32, b: Block) {
        let Block { k0, kb, n0, nb, nr } = b;
        let rows = &self.rows[k0..k0 + kb];
        // (first column in the panel, columns, whether they are consecutive elements): at most NR, inline (this runs
        // on every replay; no allocation).
        let mut pieces: smallvec::SmallVec<[(usize, usize, bool); 64]> = smallvec::SmallVec::new();
        for (p, panel) in self.cols[n0..n0 + nb].chunks(nr).enumerate() {
            // SAFETY: panel p of `dst` holds nr * kb floats, per the caller.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.add(p * nr * kb), nr * kb) };
            if panel.len() < nr {
                out.fill(0.0);
            }
            pieces.clear();
            let mut j = 0;
            while j < panel.len() {
                let mut len = 1;
                while j + len < panel.len() && panel[j + len] == panel[j + len - 1] + 1 {
                    len += 1;
                }
                let copy = len >= MIN_COPY;
                match pieces.last_mut() {
                    Some((_, n, false)) if !copy => *n += len,
                    _ => pieces.push((j, len, copy)),
                }
                j += len;
            }
            for (k, &r) in rows.iter().enumerate() {
                let line = &mut out[k * nr..k * nr + panel.len()];
                for &(j, len, copy) in &pieces {
                    if copy {
                        // SAFETY: the piece's elements at this k-step are `len` consecutive floats from
                        // `r + panel[j]`.
                        let from = unsafe { std::slice::from_raw_parts(src.offset((r + panel[j]) as isize), len) };
                        line[j..j + len].copy_from_slice(from);
                    } else {
                        for (x, &c) in line[j..j + len].iter_mut().zip(&panel[j..j + len]) {
                            // SAFETY: (k, n) is in range, per the caller.
                            *x = unsafe { *src.offset((r + c) as isize) };
                        }
                    }
                }
            }
        }
    }

    /// [`PatchTables::pack`] element by element: a folded padding in panels the groups do not fit.
    ///
    /// # Safety
    /// As [`PatchTables::pack`].
    unsafe fn pack_by_element(&self, dst: *mut f32, src: *const f32, b: Block) {
        let Block { k0, kb, n0, nb, nr } = b;
        for p in 0..nb.div_ceil(nr) {
            for k in 0..kb {
                let (r, c) = (self.rows[k0 + k], self.class[k0 + k] as usize);
                // SAFETY: panel p's line k is within `dst`'s `panels * nr * kb` floats.
                let line = unsafe { std::slice::from_raw_parts_mut(dst.add((p * kb + k) * nr), nr) };
                for (i, x) in line.iter_mut().enumerate() {
                    let j = n0 + p * nr + i;
                    *x = if j < n0 + nb && self.inside(c, j) {
                        // SAFETY: (k, j) is in range and inside the padding, per the caller.
                        unsafe { *src.offset((r + self.cols[j]) as isize) }
                    } else {
                        0.0
                    };
                }
            }
        }
    }

    /// Whether column `j` lies inside the padding for row class `c`.
    fn inside(&self, c: usize, j: usize) -> bool {
        let e = &self.group[c * self.groups + j / GROUP];
        (e.mask[0] | e.mask[1]) & (1 << (j % GROUP)) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_jit::kernel::IExpr;
    use kiln_jit::kernel::gemm::PatchRange;

    /// Channels, height, width, window height and width, stride, padding.
    type Case = (i64, i64, i64, i64, i64, i64, i64);

    /// A `kh x kw` window at `stride` over `c` channels of `h x w`, padded by `pad` on every side, as the patched B
    /// of its convolution: folded (the input unpadded, ranges), or read in the padded input.
    fn conv(case: Case, folded: bool) -> (Patch, usize, usize) {
        let (c, h, w, kh, kw, stride, pad) = case;
        let (oh, ow) = ((h + 2 * pad - kh) / stride + 1, (w + 2 * pad - kw) / stride + 1);
        let v = || IExpr::Var(0);
        let (ch, dy, dx) = (v().floor_div(kh * kw), v().floor_div(kw).modulo(kh), v().modulo(kw));
        let (oy, ox) = (v().floor_div(ow).times(stride), v().modulo(ow).times(stride));
        let (hs, ws) = if folded { (h, w) } else { (h + 2 * pad, w + 2 * pad) };
        let shift = if folded { -pad } else { 0 };
        let rows = IExpr::Add(vec![
            ch.times(hs * ws),
            dy.clone().plus(IExpr::Const(shift)).times(ws),
            dx.clone().plus(IExpr::Const(shift)),
        ]);
        let cols = IExpr::Add(vec![oy.clone().times(ws), ox.clone()]);
        let ranges = if folded {
            vec![
                PatchRange { rows: dy.plus(IExpr::Const(shift)), cols: oy, lo: 0, hi: h },
                PatchRange { rows: dx.plus(IExpr::Const(shift)), cols: ox, lo: 0, hi: w },
            ]
        } else {
            Vec::new()
        };
        (Patch { rows, cols, ranges }, (c * kh * kw) as usize, (oh * ow) as usize)
    }

    /// Every packing path against element (k, n) computed from the patch's expressions, over windows at strides
    /// 1-3 (runs, two runs a group, gathers), folded or not, as a convolution's patches and transposed (a weight
    /// gradient's: rows by the edges they lie on), ragged column blocks and K blocks, panels 16-64 wide.
    #[test]
    fn every_packing_reads_the_patch() {
        if !Isa::Avx2.present() {
            return;
        }
        let cases: [Case; 8] = [
            (3, 10, 10, 3, 3, 1, 1),
            (2, 9, 40, 3, 3, 1, 1),
            (2, 13, 15, 3, 3, 2, 1),
            (1, 30, 30, 7, 7, 2, 3),
            (2, 12, 17, 5, 3, 1, 2),
            (2, 9, 9, 3, 3, 3, 0),
            (1, 40, 36, 1, 1, 1, 0),
            // One row class with columns outside the padding (a 1x1 window, padded).
            (2, 9, 11, 1, 1, 1, 1),
        ];
        for case in cases {
            let (c, h, w, kh, kw, stride, pad) = case;
            for (folded, transposed) in [(false, false), (true, false), (false, true), (true, true)] {
                let (patch, k, n) = conv(case, folded);
                // The weight gradient's patches: rows the output positions, columns the window's taps.
                let (patch, k, n) = if transposed {
                    let swap = |r: &PatchRange| PatchRange { rows: r.cols.clone(), cols: r.rows.clone(), ..r.clone() };
                    let ranges = patch.ranges.iter().map(swap).collect();
                    (Patch { rows: patch.cols, cols: patch.rows, ranges }, n, k)
                } else {
                    (patch, k, n)
                };
                let t = PatchTables::new(&patch, k, n);
                let len = (c * (h + 2 * pad) * (w + 2 * pad)) as usize;
                let src: Vec<f32> = (0..len).map(|i| i as f32 + 1.0).collect();
                let want = |kk: usize, j: usize| {
                    let inside = patch
                        .ranges
                        .iter()
                        .all(|r| (r.lo..r.hi).contains(&(r.rows.eval(&[kk as i64]) + r.cols.eval(&[j as i64]))));
                    let at = patch.rows.eval(&[kk as i64]) + patch.cols.eval(&[j as i64]);
                    if inside { src[at as usize] } else { 0.0 }
                };
                for nr in [16, 24, 32, 48, 64] {
                    for (k0, kb) in [(0, k), (k / 3, k - k / 3)] {
                        for (n0, nb) in [(0, n), (nr, n.saturating_sub(nr)), (0, n.min(nr * 2 + 5))] {
                            if nb == 0 {
                                continue;
                            }
                            let size = nb.div_ceil(nr) * nr * kb;
                            let block = Block { k0, kb, n0, nb, nr };
                            let mut paths: Vec<(&str, Vec<f32>)> = Vec::new();
                            let mut run = |name, f: &dyn Fn(*mut f32)| {
                                let mut dst = vec![f32::NAN; size];
                                f(dst.as_mut_ptr());
                                paths.push((name, dst));
                            };
                            let p = src.as_ptr();
                            // SAFETY: the patch's elements inside its padding lie within `src`; `dst` is sized
                            // as `pack` needs; each path runs only where its instructions are present.
                            run("pack", &|d| unsafe { t.pack(d, p, block) });
                            run("by element", &|d| unsafe { t.pack_by_element(d, p, block) });
                            if !folded {
                                run("pieces", &|d| unsafe { t.pack_pieces(d, p, block) });
                            }
                            if Isa::Avx512.present() && nr % GROUP == 0 {
                                run("groups", &|d| unsafe { t.pack_groups(d, p, block) });
                            }
                            for (name, got) in &paths {
                                for (i, &x) in got.iter().enumerate() {
                                    let (panel, kk, lane) = (i / (nr * kb), i / nr % kb, i % nr);
                                    let j = n0 + panel * nr + lane;
                                    let expected = if j < n0 + nb { want(k0 + kk, j) } else { 0.0 };
                                    assert_eq!(
                                        x.to_bits(),
                                        expected.to_bits(),
                                        "{name}: window {kh}x{kw} stride {stride} pad {pad} folded {folded} \
                                         transposed {transposed}, nr {nr}, k {} n {j}: {x} against {expected}",
                                        k0 + kk
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
