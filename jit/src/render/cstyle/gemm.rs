//! The tiled GEMM template, written once for every C-like dialect: what `kernel::gemm::GemmView` recognizes, as
//! one kernel in a given tile configuration ([`GemmTile`]).
//!
//! A workgroup (a CUDA block) computes a `tm x tn` tile of C (one batch entry); each invocation a `rm x rn`
//! sub-tile held in registers, its rows and columns strided by the thread grid (row `ty + i * tm/rm`, column
//! `tx + j * tn/rn`) so that neighbouring invocations read neighbouring shared words. K is stepped in `kt` slices:
//! the workgroup loads a `tm x kt` slice of A and a `kt x tn` slice of B cooperatively into workgroup (shared)
//! arrays (bounds-checked, zero outside, so ragged M, N and K need no special case), with a barrier before and
//! after the slice is consumed. The load order follows the operand's contiguous dimension (from the view's
//! strides), so transposed operands are read coalesced too. Operands are widened to f32 as they are staged (bf16
//! exactly: the product of two bf16 values and the f32 sum are then what the interpreter computes); the shared
//! arrays hold f32 either way, which spends twice the shared memory a bf16 tile needs but keeps one inner loop.
//!
//! The epilogue is the kernel's outer code, rendered by the shared per-instruction table with `acc` bound to the
//! element's accumulator and the output loop variables to its coordinates; loads in it index exactly as in the
//! generic kernel.
//!
//! This file writes the epilogue function, the shared arrays and the entry point's body; the dialect's module
//! writes the entry point's signature (which declares the group id and the local index this body reads) and
//! places the pieces. Does not own: which tile to use (the backend's search space and score), or whether a kernel
//! is a GEMM (`GemmView::of`).

use super::{Dialect, Emitter};
use crate::dtype::DType;
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

    /// Bytes of workgroup memory (the A and B slices).
    pub fn shared_bytes(&self) -> u32 {
        (self.tm + self.tn) * self.kt * 4
    }

    /// Whether the sub-tile divides the tile (the template's only structural requirement).
    pub fn well_formed(&self) -> bool {
        let pos = self.tm > 0 && self.tn > 0 && self.rm > 0 && self.rn > 0 && self.kt > 0;
        pos && self.tm.is_multiple_of(self.rm) && self.tn.is_multiple_of(self.rn)
    }

    /// A stable name in the WGSL search space, e.g. `wgsl:64x64:r4x4:k16`: tuning records store it and
    /// [`GemmTile::parse`] reads it back.
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

/// Split K, for products with few tiles of C and a long K (a GPU's decode shapes): `splits` blocks share each tile,
/// the one with split index `ks` summing K over `[ks * chunk, min(K, (ks + 1) * chunk))`. The grid's x then holds
/// both (`x = ks * tiles_n + tile of N`); the template leaves each block's partial sums in its accumulators
/// ([`GemmParts::accumulators`]) and the dialect adds the splits up (`render::cuda::gemm::split_end`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KSplit {
    pub splits: u32,
    /// K per split: a multiple of the template's K slice, so only the last split's last slice is ragged.
    pub chunk: usize,
}

impl KSplit {
    /// `splits` ways over a K of `k` in slices of `kt`.
    pub fn of(k: usize, kt: u32, splits: u32) -> KSplit {
        let kt = kt.max(1) as usize;
        KSplit { splits, chunk: k.div_ceil(splits.max(1) as usize).div_ceil(kt) * kt }
    }
}

/// One accumulator of a thread: its value's variable and its row and column in the block's tile of C.
pub struct Acc {
    pub row: String,
    pub col: String,
    pub value: String,
}

/// The pieces of a GEMM kernel, for the dialect to place.
pub struct GemmParts {
    /// `epilogue(bz, m, n, acc)`: the kernel's outer code for one output element.
    pub epilogue: String,
    /// The declarations of the two shared arrays, `sa` and `sb`.
    pub shared: String,
    /// The entry point's body, reading the dialect's `group_id` and `local_index`; with a split, it ends after the
    /// K loop (the dialect sums the splits and calls the epilogue).
    pub body: String,
    /// The thread's accumulators, relative to the tile's corner (`m0`, `n0`).
    pub accumulators: Vec<Acc>,
    /// Whether the body reads an operand 4 elements a load (`Dialect::load4`: the dialect declares what that
    /// statement calls).
    pub vector_loads: bool,
}

/// Writes GEMM kernel `em.k` (recognized as `v`) in tile `t` (well-formed: the caller checks), K split as `split`
/// says (the CUDA/HIP dialect only).
pub fn gemm_parts<D: Dialect>(em: &mut Emitter<'_, D>, v: &GemmView, t: GemmTile, split: Option<KSplit>) -> GemmParts {
    let epilogue = epilogue_fn(em, v);
    let d = em.d;
    let GemmTile { tm, kt, tn, .. } = t;
    let mut shared = String::new();
    let _ = writeln!(shared, "\n{} // [kt][tm]", d.workgroup_array("sa", DType::F32, (tm * kt) as usize));
    let _ = writeln!(shared, "{} // [kt][tn]", d.workgroup_array("sb", DType::F32, (kt * tn) as usize));
    let (body, accumulators, vector_loads) = main_body(d, v, t, split);
    GemmParts { epilogue, shared, body, accumulators, vector_loads }
}

/// `epilogue(bz, m, n, acc)`: the kernel's outer code for output element (batch `bz`, row `m`, column `n`). Also the
/// tensor-core template's (`render::cuda::mma`).
pub fn epilogue_fn<D: Dialect>(em: &mut Emitter<'_, D>, v: &GemmView) -> String {
    let (d, k) = (em.d, em.k);
    let rank = k.out_rank();
    let ix = d.index_dtype();
    let params = [("bz", ix), ("m", ix), ("n", ix), ("acc", DType::F32)];
    let mut s = format!("\n{}\n", d.fn_open("epilogue", &params));
    // Output variables: batch dims decomposed from bz (row-major), then m (absent for a rank-1 output), then n.
    let batch_rank = v.batch.len();
    s.push_str(&batch_vars(d, &v.batch, "bz"));
    if rank >= 2 {
        let _ = writeln!(s, "    {}", d.let_index(&format!("i{}", rank - 2), "m"));
    }
    let _ = writeln!(s, "    {}", d.let_index(&format!("i{}", rank - 1), "n"));
    debug_assert_eq!(rank, batch_rank + if rank >= 2 { 2 } else { 1 });
    em.insts(&mut s, &k.outer, "v", "    ");
    let stored = d.store_word(k.output.dtype, &format!("v{}", k.result));
    let _ = writeln!(s, "    out[(bz * {} + m) * {} + n] = {stored};\n{}", v.m, v.n, d.fn_close());
    s
}

/// `i<d> = ..` for each batch dim `d`, decomposed from the flat batch index `flat`.
fn batch_vars<D: Dialect>(d: &D, batch: &[usize], flat: &str) -> String {
    let mut stride = 1usize;
    let mut lines = Vec::new();
    for (i, &e) in batch.iter().enumerate().rev() {
        lines.push(format!("    {}\n", d.let_index(&format!("i{i}"), &format!("({flat} / {stride}) % {e}"))));
        stride *= e;
    }
    lines.into_iter().rev().collect()
}

/// The batch variables decomposed from the block's batch index `bz`, then `abase` and `bbase`: where A's and B's
/// matrices of that batch entry start. One statement a line. Also the tensor-core template's.
pub fn operand_bases<D: Dialect>(d: &D, v: &GemmView) -> String {
    let mut s: String = batch_vars(d, &v.batch, "bz").lines().map(|l| format!("{}\n", l.trim())).collect();
    for (name, op) in [("abase", &v.a), ("bbase", &v.b)] {
        let mut e = format!("{}", op.offset);
        for (var, st) in op.batch.iter().enumerate() {
            if *st != 0 {
                let _ = write!(e, " + i{var} * {st}");
            }
        }
        let _ = writeln!(s, "{}", d.let_index(name, &e));
    }
    s
}

/// `in<buf>[base + i * rows + j * cols]`: an operand's element (row `i`, column `j`) in its batch entry at `base`.
/// Also the tensor-core template's.
pub fn operand_at(op: &GemmOperand, base: &str, i: &str, j: &str) -> String {
    format!("in{}[{base} + {i} * {} + {j} * {}]", op.buf, op.rows, op.cols)
}

/// The entry point's body: staging loop over K slices (the split's, with one), register tile, then (without a
/// split) the epilogue per element in bounds; and the thread's accumulators.
fn main_body<D: Dialect>(d: &D, v: &GemmView, t: GemmTile, split: Option<KSplit>) -> (String, Vec<Acc>, bool) {
    let GemmTile { tm, tn, rm, rn, kt } = t;
    let (ty_n, tx_n) = (tm / rm, tn / rn);
    let wg = t.threads();
    let (m, n, kk) = (v.m, v.n, v.k);
    let tiles_m = m.div_ceil(tm as usize) as i64;
    let (ix, u) = (d.index_dtype(), DType::U32);
    let idx = |e: String| d.convert(ix, &e);
    let mut s = String::new();
    let line = |s: &mut String, indent: &str, stmt: String| {
        let _ = writeln!(s, "{indent}{stmt}");
    };
    let (gx, gy) = (d.group_id(0), d.group_id(1));
    line(&mut s, "    ", d.let_index("bz", &idx(format!("{gy} / {}", d.int_lit(tiles_m, u)))));
    line(&mut s, "    ", d.let_index("m0", &format!("{} * {tm}", idx(format!("{gy} % {}", d.int_lit(tiles_m, u))))));
    // The K range: all of it, or the split's.
    let splits = split.is_some();
    let (kbeg, kend) = match split {
        None => {
            line(&mut s, "    ", d.let_index("n0", &format!("{} * {tn}", idx(gx.to_string()))));
            ("0".to_string(), kk.to_string())
        }
        Some(KSplit { chunk, .. }) => {
            let tiles_n = d.int_lit(n.div_ceil(tn as usize) as i64, u);
            line(&mut s, "    ", d.let_index("ks", &idx(format!("{gx} / {tiles_n}"))));
            line(&mut s, "    ", d.let_index("n0", &format!("{} * {tn}", idx(format!("{gx} % {tiles_n}")))));
            line(&mut s, "    ", d.let_index("kbeg", &format!("ks * {chunk}")));
            line(&mut s, "    ", d.let_index("kend", &format!("min({kk}, kbeg + {chunk})")));
            ("kbeg".to_string(), "kend".to_string())
        }
    };
    line(&mut s, "    ", d.let_index("l", &idx(d.local_index().to_string())));
    line(&mut s, "    ", d.let_index("tx", &format!("l % {tx_n}")));
    line(&mut s, "    ", d.let_index("ty", &format!("l / {tx_n}")));
    for l in operand_bases(d, v).lines() {
        line(&mut s, "    ", l.to_string());
    }
    let zero = d.float_lit(0.0, DType::F32);
    for i in 0..rm {
        for j in 0..rn {
            line(&mut s, "    ", d.var_value(&format!("c{i}_{j}"), DType::F32, &zero));
        }
    }
    line(&mut s, "    ", d.for_step_open("k0", &kbeg, &kend, &kt.to_string()));
    // A's slice is read along k where A's rows are contiguous in k, else along m; B's along n, else along k: so
    // neighbouring threads read neighbouring words.
    let a = Slice {
        rows: tm,
        cols: kt,
        along_cols: v.a.cols == 1,
        names: ("gm", "gk"),
        origin: ("m0", "k0"),
        bounds: (m.to_string(), kend.clone()),
        op: &v.a,
        base: "abase",
        shared: &|r, c| format!("sa[{c} * {tm} + {r}]"),
    };
    let b = Slice {
        rows: kt,
        cols: tn,
        along_cols: v.b.cols == 1,
        names: ("gk", "gn"),
        origin: ("k0", "n0"),
        bounds: (kend.clone(), n.to_string()),
        op: &v.b,
        base: "bbase",
        shared: &|r, c| format!("sb[{r} * {tn} + {c}]"),
    };
    let vectors = [a, b].map(|sl| stage(d, &mut s, &sl, v.operands, wg));
    line(&mut s, "        ", d.barrier().to_string());
    line(&mut s, "        ", d.for_open("q", kt as usize));
    for i in 0..rm {
        line(
            &mut s,
            "            ",
            d.let_value(&format!("a{i}"), DType::F32, &format!("sa[q * {tm} + ty + {}]", i * ty_n)),
        );
    }
    for j in 0..rn {
        line(
            &mut s,
            "            ",
            d.let_value(&format!("b{j}"), DType::F32, &format!("sb[q * {tn} + tx + {}]", j * tx_n)),
        );
    }
    for i in 0..rm {
        for j in 0..rn {
            line(&mut s, "            ", format!("c{i}_{j} += a{i} * b{j};"));
        }
    }
    line(&mut s, "        ", "}".to_string());
    line(&mut s, "        ", d.barrier().to_string());
    line(&mut s, "    ", "}".to_string());
    let mut accs = Vec::new();
    for i in 0..rm {
        for j in 0..rn {
            let (mi, nj) = (i * ty_n, j * tx_n);
            if !splits {
                line(
                    &mut s,
                    "    ",
                    format!(
                        "if (m0 + ty + {mi} < {m} && n0 + tx + {nj} < {n}) \
                         {{ epilogue(bz, m0 + ty + {mi}, n0 + tx + {nj}, c{i}_{j}); }}"
                    ),
                );
            }
            accs.push(Acc { row: format!("ty + {mi}"), col: format!("tx + {nj}"), value: format!("c{i}_{j}") });
        }
    }
    (s, accs, vectors.contains(&true))
}

/// A `rows x cols` slice of an operand staged into shared memory: element (r, c) of the slice is the operand's
/// (`origin.0 + r`, `origin.1 + c`), named `names` in the loop, in bounds below `bounds`; `shared` writes the shared
/// element of (r, c). The slice is read along its columns where `along_cols` (the operand is contiguous that way),
/// along its rows else.
struct Slice<'a> {
    rows: u32,
    cols: u32,
    along_cols: bool,
    names: (&'static str, &'static str),
    origin: (&'static str, &'static str),
    bounds: (String, String),
    op: &'a GemmOperand,
    base: &'static str,
    shared: &'a dyn Fn(&str, &str) -> String,
}

/// Whether operand `op` can be read `width` elements a load along its contiguous dimension (`cols` where
/// `along_cols`): contiguous that way, and its offset, its other stride and every batch stride multiples of
/// `width`, so that every vector starting at a multiple of `width` from a matrix's start is aligned to `width`
/// elements (device allocations are at least 256-byte aligned). A patched operand never is. Also the tensor-core
/// template's (16 bytes: 8 halves, or 4 floats in TF32).
pub fn vectorizable(op: &GemmOperand, along_cols: bool, width: i64) -> bool {
    let other = if along_cols { op.rows } else { op.cols };
    let contiguous = if along_cols { op.cols } else { op.rows };
    op.patch.is_none() && contiguous == 1 && [op.offset, other].iter().chain(&op.batch).all(|x| x % width == 0)
}

/// The staging loop of slice `sl` of an operand stored as `dtype` over a workgroup of `wg` invocations: where the
/// dialect has vector loads ([`Dialect::load4`]), the operand's layout allows them ([`vectorizable`]) and the slice
/// divides into vectors along the way it is read, each invocation reads 4 elements a step, one load where all 4
/// are in bounds and 4 checked loads at a ragged edge, and stores them one by one (the shared arrays are read by
/// the inner loop one word at a time); else one element a step. Returns whether it reads vectors.
fn stage<D: Dialect>(d: &D, s: &mut String, sl: &Slice<'_>, dtype: DType, wg: u32) -> bool {
    let (rows, cols) = (sl.rows, sl.cols);
    let (o_r, o_c) = sl.origin;
    let (n_r, n_c) = sl.names;
    let (b_r, b_c) = (&sl.bounds.0, &sl.bounds.1);
    let load = |r: &str, c: &str| d.load_word(dtype, &operand_at(sl.op, sl.base, r, c));
    let mut line = |indent: &str, stmt: String| {
        let _ = writeln!(s, "{indent}{stmt}");
    };
    let zero = d.float_lit(0.0, DType::F32);
    let along = if sl.along_cols { cols } else { rows };
    let vector = (along % 4 == 0 && vectorizable(sl.op, sl.along_cols, 4))
        .then(|| d.load4(dtype, &operand_at(sl.op, sl.base, n_r, n_c), "x"))
        .flatten();
    // Step `e` reads `w` elements from (r, c): (r, c .. c + w - 1) along the columns, (r .. r + w - 1, c) along the
    // rows.
    let w = if vector.is_some() { 4 } else { 1 };
    let per = along / w;
    let first = |x: String| if w == 1 { x } else { format!("({x}) * {w}") };
    let (r, c) = if sl.along_cols {
        (format!("e / {per}"), first(format!("e % {per}")))
    } else {
        (first(format!("e % {per}")), format!("e / {per}"))
    };
    line("        ", d.for_step_open("e", "l", &(rows * cols / w).to_string(), &wg.to_string()));
    line("            ", format!("{} {}", d.let_index("r", &r), d.let_index("c", &c)));
    line("            ", d.let_index(n_r, &format!("{o_r} + r")));
    line("            ", d.let_index(n_c, &format!("{o_c} + c")));
    let Some(vector) = vector else {
        line("            ", d.var_value("x", DType::F32, &zero));
        line("            ", format!("if ({n_r} < {b_r} && {n_c} < {b_c}) {{ x = {}; }}", load(n_r, n_c)));
        line("            ", format!("{} = x;", (sl.shared)("r", "c")));
        line("        ", "}".to_string());
        return false;
    };
    let full = if sl.along_cols {
        format!("{n_r} < {b_r} && {n_c} + 4 <= {b_c}")
    } else {
        format!("{n_r} + 4 <= {b_r} && {n_c} < {b_c}")
    };
    let at = |i: u32, (r, c): (&str, &str)| {
        if sl.along_cols { (r.to_string(), format!("({c} + {i})")) } else { (format!("({r} + {i})"), c.to_string()) }
    };
    for i in 0..4 {
        line("            ", d.var_value(&format!("x{i}"), DType::F32, &zero));
    }
    line("            ", format!("if ({full}) {{"));
    line("                ", vector);
    line("            ", "} else {".to_string());
    for i in 0..4 {
        let (er, ec) = at(i, (n_r, n_c));
        line("                ", format!("if ({er} < {b_r} && {ec} < {b_c}) {{ x{i} = {}; }}", load(&er, &ec)));
    }
    line("            ", "}".to_string());
    for i in 0..4 {
        let (sr, sc) = at(i, ("r", "c"));
        line("            ", format!("{} = x{i};", (sl.shared)(&sr, &sc)));
    }
    line("        ", "}".to_string());
    true
}
