//! The tiled WGSL GEMM template: what `kernel::gemm::GemmView` recognizes, rendered as one compute shader in a
//! given tile configuration ([`GemmTile`]).
//!
//! Owns: the shader text and its launch shape. A workgroup computes a `tm x tn` tile of C (one batch entry);
//! each invocation a `rm x rn` sub-tile held in registers, its rows and columns strided by the thread grid (row
//! `ty + i * tm/rm`, column `tx + j * tn/rn`) so that neighbouring invocations read neighbouring shared words. K is
//! stepped in `kt` slices: the workgroup loads a `tm x kt` slice of A and a `kt x tn` slice of B cooperatively
//! into `var<workgroup>` arrays (bounds-checked, zero outside, so ragged M, N and K need no special case), with a
//! `workgroupBarrier()` before and after the slice is consumed. The load order follows the operand's contiguous
//! dimension (from the view's strides), so transposed operands are read coalesced too.
//!
//! The epilogue is the kernel's outer code, rendered by the same per-instruction table as generic kernels
//! (`values.rs`) with `acc` bound to the element's accumulator and the output loop variables to its coordinates;
//! loads in it index exactly as in the generic kernel.
//!
//! Does not own: which tile to use (the search space and score live in `kiln_autotune::wgsl_gemm`, the choice in
//! the wgpu backend), or whether a kernel is a GEMM (`GemmView::of`).

use super::{Emitter, WgslKernel, groups_for, values};
use crate::kernel::KernelIr;
use crate::kernel::gemm::{GemmOperand, GemmView};
use std::fmt::Write;

/// One tile configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTile {
    /// Rows of C per workgroup.
    pub tm: u32,
    /// Columns of C per workgroup.
    pub tn: u32,
    /// Rows of C per invocation.
    pub rm: u32,
    /// Columns of C per invocation.
    pub rn: u32,
    /// K per shared-memory stage.
    pub kt: u32,
}

impl GemmTile {
    /// Invocations per workgroup.
    pub fn threads(&self) -> u32 {
        (self.tm / self.rm.max(1)) * (self.tn / self.rn.max(1))
    }

    /// Bytes of `var<workgroup>` memory (the A and B slices).
    pub fn shared_bytes(&self) -> u32 {
        (self.tm + self.tn) * self.kt * 4
    }

    /// Whether the sub-tile divides the tile (the template's only structural requirement).
    pub fn well_formed(&self) -> bool {
        let pos = self.tm > 0 && self.tn > 0 && self.rm > 0 && self.rn > 0 && self.kt > 0;
        pos && self.tm.is_multiple_of(self.rm) && self.tn.is_multiple_of(self.rn)
    }

    /// A stable name, e.g. `wgsl:64x64:r4x4:k16`: tuning records store it and [`GemmTile::parse`] reads it back.
    pub fn name(&self) -> String {
        format!("wgsl:{}x{}:r{}x{}:k{}", self.tm, self.tn, self.rm, self.rn, self.kt)
    }

    pub fn parse(s: &str) -> Option<GemmTile> {
        let f: Vec<&str> = s.split(':').collect();
        if f.len() != 4 || f[0] != "wgsl" {
            return None;
        }
        let pair = |p: &str| -> Option<(u32, u32)> {
            let (a, b) = p.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        let (tm, tn) = pair(f[1])?;
        let (rm, rn) = pair(f[2].strip_prefix('r')?)?;
        let kt = f[3].strip_prefix('k')?.parse().ok()?;
        let t = GemmTile { tm, tn, rm, rn, kt };
        (t.well_formed() && t.name() == s).then_some(t)
    }
}

/// Renders GEMM kernel `k` (recognized as `v`) with tile `t`. Errors when the kernel cannot be rendered in WGSL
/// (see `check`), the tile is malformed, or the grid exceeds the dispatch limits (the caller falls back to the
/// generic kernel).
pub fn render_gemm(k: &KernelIr, v: &GemmView, t: GemmTile) -> Result<WgslKernel, String> {
    super::check(k)?;
    if !t.well_formed() {
        return Err(format!("malformed GEMM tile {t:?}"));
    }
    let tiles_m = v.m.div_ceil(t.tm as usize) as u64;
    let tiles_n = v.n.div_ceil(t.tn as usize) as u64;
    let rows = tiles_m * v.batch_count().max(1) as u64;
    // The grid is (tiles of N) x (tiles of M * batch): both must fit one dispatch dimension.
    let (gx, gy) = (groups_for(tiles_n, 1)?, groups_for(rows, 1)?);
    if gx.1 != 1 || gy.1 != 1 {
        return Err(format!("GEMM grid {tiles_n} x {rows} exceeds the dispatch limits"));
    }
    let mut em = Emitter::new(k);
    let epilogue = epilogue_fn(&mut em, k, v);
    let mut s = em.header();
    s.push_str(&epilogue);
    s.push_str(&main_fn(v, t));
    Ok(WgslKernel {
        name: k.name.clone(),
        source: s,
        workgroup: t.threads(),
        groups: (gx.0, gy.0),
        inputs: k.inputs.len(),
        uses_rng: em.uses_rng,
    })
}

/// `fn epilogue(bz, m, n, acc)`: the kernel's outer code for output element (batch `bz`, row `m`, column `n`).
fn epilogue_fn(em: &mut Emitter<'_>, k: &KernelIr, v: &GemmView) -> String {
    let rank = k.out_rank();
    let mut s = String::from("\nfn epilogue(bz: i32, m: i32, n: i32, acc: f32) {\n");
    // Output variables: batch dims decomposed from bz (row-major), then m (absent for a rank-1 output), then n.
    let batch_rank = v.batch.len();
    s.push_str(&batch_vars(&v.batch, "bz"));
    if rank >= 2 {
        let _ = writeln!(s, "    let i{} = m;", rank - 2);
    }
    let _ = writeln!(s, "    let i{} = n;", rank - 1);
    debug_assert_eq!(rank, batch_rank + if rank >= 2 { 2 } else { 1 });
    em.insts(&mut s, &k.outer, "v", "    ");
    let stored = values::store(k.output.dtype, &format!("v{}", k.result));
    let _ = writeln!(s, "    out[(bz * {} + m) * {} + n] = {stored};\n}}", v.m, v.n);
    s
}

/// `let i<d> = ..;` for each batch dim `d`, decomposed from the flat batch index `flat`.
fn batch_vars(batch: &[usize], flat: &str) -> String {
    let mut s = String::new();
    let mut stride = 1usize;
    let mut lines = Vec::new();
    for (d, &e) in batch.iter().enumerate().rev() {
        lines.push(format!("    let i{d} = ({flat} / {stride}) % {e};\n"));
        stride *= e;
    }
    for l in lines.into_iter().rev() {
        s.push_str(&l);
    }
    s
}

/// `base + i * rows + j * cols` of an operand, as WGSL i32 arithmetic.
fn at(op: &GemmOperand, base: &str, i: &str, j: &str) -> String {
    format!("in{}[{base} + {i} * {} + {j} * {}]", op.buf, op.rows, op.cols)
}

/// The entry point: staging loop over K slices, register tile, then the epilogue per element in bounds.
fn main_fn(v: &GemmView, t: GemmTile) -> String {
    let GemmTile { tm, tn, rm, rn, kt } = t;
    let (ty_n, tx_n) = (tm / rm, tn / rn);
    let wg = t.threads();
    let (m, n, kk) = (v.m, v.n, v.k);
    let mut s = String::new();
    let _ = writeln!(s, "\nvar<workgroup> sa: array<f32, {}>; // [kt][tm]", tm * kt);
    let _ = writeln!(s, "var<workgroup> sb: array<f32, {}>; // [kt][tn]", kt * tn);
    let _ = writeln!(
        s,
        "\n@compute @workgroup_size({wg})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32) {{"
    );
    let tiles_m = m.div_ceil(tm as usize);
    let _ = writeln!(s, "    let bz = i32(wid.y / {tiles_m}u);");
    let _ = writeln!(s, "    let m0 = i32(wid.y % {tiles_m}u) * {tm};");
    let _ = writeln!(s, "    let n0 = i32(wid.x) * {tn};");
    let _ = writeln!(s, "    let l = i32(lid);\n    let tx = l % {tx_n};\n    let ty = l / {tx_n};");
    // Per-batch operand bases.
    let vars: Vec<String> = (0..v.batch.len()).map(|d| format!("i{d}")).collect();
    s.push_str(&batch_vars(&v.batch, "bz"));
    for (name, op) in [("abase", &v.a), ("bbase", &v.b)] {
        let mut e = format!("{}", op.offset);
        for (var, st) in vars.iter().zip(&op.batch) {
            if *st != 0 {
                let _ = write!(e, " + {var} * {st}");
            }
        }
        let _ = writeln!(s, "    let {name} = {e};");
    }
    for i in 0..rm {
        for j in 0..rn {
            let _ = writeln!(s, "    var c{i}_{j}: f32 = 0.0;");
        }
    }
    let _ = writeln!(s, "    for (var k0 = 0; k0 < {kk}; k0 += {kt}) {{");
    // A slice: coalesced along k when A's rows are contiguous in k, else along m.
    let (a_split, b_split) = (
        if v.a.cols == 1 {
            format!("let r = e / {kt}; let c = e % {kt};")
        } else {
            format!("let r = e % {tm}; let c = e / {tm};")
        },
        if v.b.cols == 1 {
            format!("let r = e / {tn}; let c = e % {tn};")
        } else {
            format!("let r = e % {kt}; let c = e / {kt};")
        },
    );
    let _ = writeln!(
        s,
        "        for (var e = l; e < {}; e += {wg}) {{\n            {a_split}\n            \
         let gm = m0 + r;\n            let gk = k0 + c;\n            var x = 0.0;\n            \
         if (gm < {m} && gk < {kk}) {{ x = {}; }}\n            sa[c * {tm} + r] = x;\n        }}",
        tm * kt,
        at(&v.a, "abase", "gm", "gk")
    );
    let _ = writeln!(
        s,
        "        for (var e = l; e < {}; e += {wg}) {{\n            {b_split}\n            \
         let gk = k0 + r;\n            let gn = n0 + c;\n            var x = 0.0;\n            \
         if (gk < {kk} && gn < {n}) {{ x = {}; }}\n            sb[r * {tn} + c] = x;\n        }}",
        kt * tn,
        at(&v.b, "bbase", "gk", "gn")
    );
    s.push_str("        workgroupBarrier();\n");
    let _ = writeln!(s, "        for (var q = 0; q < {kt}; q++) {{");
    for i in 0..rm {
        let _ = writeln!(s, "            let a{i} = sa[q * {tm} + ty + {}];", i * ty_n);
    }
    for j in 0..rn {
        let _ = writeln!(s, "            let b{j} = sb[q * {tn} + tx + {}];", j * tx_n);
    }
    for i in 0..rm {
        for j in 0..rn {
            let _ = writeln!(s, "            c{i}_{j} += a{i} * b{j};");
        }
    }
    s.push_str("        }\n        workgroupBarrier();\n    }\n");
    for i in 0..rm {
        for j in 0..rn {
            let _ = writeln!(
                s,
                "    if (m0 + ty + {mi} < {m} && n0 + tx + {nj} < {n}) {{ epilogue(bz, m0 + ty + {mi}, n0 + tx + {nj}, c{i}_{j}); }}",
                mi = i * ty_n,
                nj = j * tx_n
            );
        }
    }
    s.push_str("}\n");
    s
}
