//! Recognizing a GEMM in a kernel: which reduce kernels are `C[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n])`,
//! with the strides of A and B and the role of every value the epilogue reads. Target-neutral: the CPU backend's
//! generated AVX2 kernels and a GPU's tiled GEMM both start from a [`GemmView`]; the tuner keys on it.
//!
//! A kernel qualifies when its reduction is an f32 sum over one variable of exactly `load * load` (no masks, affine
//! indices), and its output is `[batch.., m, n]`, `[m, n]` or `[n]` (a batch-1 layer, whose unit M loop was
//! dropped). Anything else (a padded operand, an int matmul) stays on the generic path, and so does a GEMM whose
//! epilogue draws random numbers (`x @ w + randn(..)`): the tuners verify candidates against the evaluator and
//! launch them without random keys, and such an epilogue is rare enough not to need them.
//!
//! A bf16 GEMM is the one mixed form: `f32(load bf16) * f32(load bf16)` summed in f32 ([`GemmView::operands`] is
//! bf16), its output f32 or rounded once to bf16 by a last `cast` of the outer code ([`GemmView::out`]); an f16
//! GEMM likewise. The scheduler leaves the casts in the GEMM's loads only where the backend asked
//! (`ScheduleOptions::bf16_gemm`, `f16_gemm`: the CPU asks for bf16 only, the GPU devices for both).
//!
//! The epilogue is the kernel's outer code; each value is classified by what it varies with ([`Role`]), which is what
//! a renderer needs to place it in registers.

use crate::dtype::DType;
use crate::kernel::index::IExpr;
use crate::kernel::ir::{InstOp, KernelIr, Valid};

/// One GEMM operand: element `(b, i, j)` is at `offset + sum(batch[d] * b_d) + i * rows + j * cols` in input `buf`.
/// For A, `i` is m and `j` is k; for B, `i` is k and `j` is n. A patched operand (`patch`, see [`Patch`]) is at
/// `offset + sum(batch[d] * b_d) + patch.rows(i) + patch.cols(j)` instead.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmOperand {
    pub buf: usize,
    pub offset: i64,
    pub batch: Vec<i64>,
    /// For a patched operand, what a row-major operand would have (`n`, 1): what cost models see.
    pub rows: i64,
    pub cols: i64,
    pub patch: Option<Patch>,
}

/// A B operand whose row and column offsets are any function of the row and of the column, not a stride each: a
/// convolution's patches read where the input stores them (implicit im2col), element (k, n) of
/// `[C * KH * KW, OH * OW]` at `rows(k) + cols(n)` with `rows = (k / 9) * Hp * Wp + ((k / 3) % 3) * Wp + k % 3`
/// and `cols = (n / OW) * Wp + n % OW` for a 3 x 3 window. Each expression reads variable 0 only. Where a zero
/// padding is folded in (`ranges`), the element is read only where every range holds and is zero elsewhere, so the
/// padded input is never stored. Only [`GemmView::of_patched`] recognizes one, for a backend that packs B through
/// tables of these offsets; every other reader of a [`GemmView`] sees strided operands only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Patch {
    pub rows: IExpr,
    pub cols: IExpr,
    pub ranges: Vec<PatchRange>,
}

/// One range of a patched operand's padding: element (k, n) lies inside where `lo <= rows(k) + cols(n) < hi` (a
/// padded dim's source position: the window tap's offset plus the output position's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PatchRange {
    pub rows: IExpr,
    pub cols: IExpr,
    pub lo: i64,
    pub hi: i64,
}

impl Patch {
    /// A load of `index` under `valid` (yielding `fill` outside) over `nvars` loop variables as a patch with rows
    /// along `kvar` and columns along `nvar`: also the index's part per variable (each reads only its own) and its
    /// constant. `None` where the fill is not zero (the packing writes zeros outside), the index or a range is not
    /// separable, or a range moves with a variable other than `kvar` and `nvar`.
    pub fn of_load(
        index: &IExpr,
        valid: Option<&Valid>,
        fill: crate::Scalar,
        nvars: usize,
        kvar: usize,
        nvar: usize,
    ) -> Option<(Vec<IExpr>, i64, Patch)> {
        if !fill.is_zero_bits() {
            return None;
        }
        let one = |e: &IExpr| e.map_vars(&|_| IExpr::Var(0));
        let (parts, c) = index.separate(nvars)?;
        let mut ranges = Vec::new();
        for (e, lo, hi) in valid.map_or(&[][..], |v| &v.0) {
            let (p, at) = e.separate(nvars)?;
            if p.iter().enumerate().any(|(v, part)| v != kvar && v != nvar && *part != IExpr::Const(0)) {
                return None;
            }
            ranges.push(PatchRange { rows: one(&p[kvar]), cols: one(&p[nvar]), lo: lo - at, hi: hi - at });
        }
        let patch = Patch { rows: one(&parts[kvar]), cols: one(&parts[nvar]), ranges };
        Some((parts, c, patch))
    }

    /// The classes of the first `k` rows over `n` columns: rows for which the same columns lie inside the padding
    /// (a 3 x 3 window's nine taps; a weight gradient's output positions, nine kinds: the top, bottom, left and
    /// right edges, the corners and the inside). Packing describes each class's columns once. One class where
    /// nothing is folded.
    ///
    /// Row `i`'s columns inside range `r` are those whose part `c` has `lo - rows(i) <= c < hi - rows(i)`: an
    /// interval of `c`, so two rows agree on a range where the same of its distinct column parts fall below each
    /// bound. The key is that count at both bounds, per range.
    pub fn row_classes(&self, k: usize, n: usize) -> Vec<usize> {
        let parts: Vec<Vec<i64>> = self
            .ranges
            .iter()
            .map(|r| {
                let mut c: Vec<i64> = (0..n as i64).map(|j| r.cols.eval(&[j])).collect();
                c.sort_unstable();
                c.dedup();
                c
            })
            .collect();
        let mut keys: rustc_hash::FxHashMap<Vec<(usize, usize)>, usize> = Default::default();
        (0..k as i64)
            .map(|i| {
                let key: Vec<(usize, usize)> = self
                    .ranges
                    .iter()
                    .zip(&parts)
                    .map(|(r, c)| {
                        let at = r.rows.eval(&[i]);
                        (c.partition_point(|&x| x < r.lo - at), c.partition_point(|&x| x < r.hi - at))
                    })
                    .collect();
                let next = keys.len();
                *keys.entry(key).or_insert(next)
            })
            .collect()
    }
}

/// A load's buffer and affine index (coefficients per loop variable, constant), and where the index is only
/// separable or the load masked (a patched operand), its part per variable (the coefficient is then 1 for a
/// variable it reads) and the patch.
type AffineLoad = (usize, Vec<i64>, i64, Option<(Vec<IExpr>, Patch)>);

/// What an epilogue value varies with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The same for the whole launch (constants, a learning rate read from a buffer, ...).
    Uniform,
    /// An f32 (or i32, or bf16) load varying with m and n: `(b, m, n)` at `offset + batch.b + m * ld + n` (n contiguous).
    Mat { buf: usize, offset: i64, batch: Vec<i64>, ld: i64 },
    /// An f32 (or i32, or bf16) load varying with n only (a bias over columns), n contiguous.
    Row { buf: usize, offset: i64, batch: Vec<i64> },
    /// An f32 (or i32, or bf16) load varying with m only (a per-row scale or bias, a class index per row).
    Col { buf: usize, offset: i64, batch: Vec<i64>, stride: i64 },
    /// An i32 position along n: `n + offset` (an `arange(C) == target` mask's `arange`).
    Position { offset: i64 },
    /// The accumulator, or a value computed from it and loads (per element).
    Computed,
    /// Something the register epilogue cannot express (a gather, an iota, a masked load).
    Other,
}

/// A kernel seen as a (batched) GEMM.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmView {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: GemmOperand,
    pub b: GemmOperand,
    /// Per outer instruction.
    pub roles: Vec<Role>,
    /// The dtype A and B are stored in: f32, bf16 or f16 (each element widened to f32 exactly before the product).
    pub operands: DType,
    /// The output's dtype: f32, or the operands' half dtype (the outer code rounds the f32 sum to it, and what
    /// follows computes in it).
    pub out: DType,
}

impl GemmView {
    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.batch_count() as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// The GEMM that computes `C^T = B^T A^T`: M and N swapped, A^T read as its B and B^T as its A. Its epilogue is
    /// the identity (the roles describe the original's, which a caller applies to C afterwards).
    pub fn transposed(&self) -> GemmView {
        let swap = |o: &GemmOperand| GemmOperand { rows: o.cols, cols: o.rows, ..o.clone() };
        GemmView {
            batch: self.batch.clone(),
            m: self.n,
            n: self.m,
            k: self.k,
            a: swap(&self.b),
            b: swap(&self.a),
            roles: Vec::new(),
            operands: self.operands,
            out: DType::F32,
        }
    }

    /// Recognizes `k` as a GEMM; `None` when it is not one (see the module doc).
    pub fn of(k: &KernelIr) -> Option<GemmView> {
        Self::recognize(k, false)
    }

    /// As [`GemmView::of`], and also where B's index is only separable into a part per variable (a [`Patch`]).
    pub fn of_patched(k: &KernelIr) -> Option<GemmView> {
        Self::recognize(k, true)
    }

    fn recognize(k: &KernelIr, patched: bool) -> Option<GemmView> {
        let r = k.reduce.as_ref().filter(|_| k.rows.is_empty())?;
        if r.op != crate::op::ReduceOp::Sum || r.dtype != DType::F32 || r.extents.len() != 1 {
            return None;
        }
        if k.out_extents.is_empty() || k.out_extents.contains(&0) || r.extents[0] == 0 {
            return None;
        }
        if k.outer.iter().any(|i| matches!(i.op, InstOp::Rand { .. })) {
            return None;
        }
        let rank = k.out_rank();
        let nvars = rank + 1;
        let kvar = rank;
        let (batch_rank, mvar, nvar) = if rank == 1 { (0, None, 0) } else { (rank - 2, Some(rank - 2), rank - 1) };
        let inner = &r.inner;
        // Operand `i`: an f32 load, or a bf16 load widened by a cast; its dtype, buffer and affine index.
        let operand_of = |i: usize| -> Option<(DType, AffineLoad)> {
            let (dtype, inst) = match inner[i].op {
                InstOp::Cast(j)
                    if inner[i].dtype == DType::F32 && matches!(inner[j].dtype, DType::BF16 | DType::F16) =>
                {
                    (inner[j].dtype, &inner[j])
                }
                _ if inner[i].dtype == DType::F32 => (DType::F32, &inner[i]),
                _ => return None,
            };
            let InstOp::Load { buf, index, valid, fill } = &inst.op else { return None };
            if valid.is_none()
                && let Some((coef, c)) = index.affine(nvars)
            {
                return Some((dtype, (*buf, coef, c, None)));
            }
            // A patched operand: an index only separable, or a load masked by a zero padding.
            if !patched {
                return None;
            }
            let (parts, c, patch) = Patch::of_load(index, valid.as_ref(), *fill, nvars, kvar, nvar)?;
            let coef = parts.iter().map(|p| i64::from(*p != IExpr::Const(0))).collect();
            Some((dtype, (*buf, coef, c, Some((parts, patch)))))
        };
        let (x, y) = match inner.get(r.value).map(|i| &i.op) {
            Some(&InstOp::Binary(crate::op::BinaryOp::Mul, p, q)) if p != q => (operand_of(p)?, operand_of(q)?),
            _ => return None,
        };
        // Nothing but the two operands and their product: [load, load, mul] or [load, cast, load, cast, mul].
        let operands = x.0;
        let expected = if operands == DType::F32 { 3 } else { 5 };
        if y.0 != operands || inner.len() != expected || r.value != expected - 1 {
            return None;
        }
        let out = k.output.dtype;
        let out_ok = match out {
            DType::F32 => true,
            // Its outer code rounds the f32 product to bf16 (f16) (a cast), and may compute on in it.
            DType::BF16 | DType::F16 => operands == out,
            _ => false,
        };
        if !out_ok {
            return None;
        }
        let (x, y) = (x.1, y.1);
        let coef_m = |c: &[i64]| mvar.map_or(0, |m| c[m]);
        // A does not move with n, B does not move with m.
        let (a, b) = if x.1[nvar] == 0 && coef_m(&y.1) == 0 {
            (x, y)
        } else if y.1[nvar] == 0 && coef_m(&x.1) == 0 {
            (y, x)
        } else {
            return None;
        };
        let operand = |(buf, coef, c, _): AffineLoad, i: i64, j: i64| GemmOperand {
            buf,
            offset: c,
            batch: coef[..batch_rank].to_vec(),
            rows: i,
            cols: j,
            patch: None,
        };
        // Only B may be patched (its packing is what reads the tables), f32 only, and its batch parts stay strides.
        if a.3.is_some() || (b.3.is_some() && operands != DType::F32) {
            return None;
        }
        let n = k.out_extents[nvar];
        let patch = match &b.3 {
            None => None,
            Some((parts, patch)) => {
                let mut batch = Vec::with_capacity(batch_rank);
                for (v, part) in parts[..batch_rank].iter().enumerate() {
                    let (coef, c) = part.affine(nvars)?;
                    debug_assert_eq!(c, 0, "a separated part carries no constant");
                    batch.push(coef[v]);
                }
                Some((batch, patch.clone()))
            }
        };
        let a = {
            let (am, ak) = (coef_m(&a.1), a.1[kvar]);
            operand(a, am, ak)
        };
        let b = match patch {
            None => {
                let (bk, bn) = (b.1[kvar], b.1[nvar]);
                operand(b, bk, bn)
            }
            Some((batch, patch)) => {
                GemmOperand { buf: b.0, offset: b.2, batch, rows: n as i64, cols: 1, patch: Some(patch) }
            }
        };
        let m = mvar.map_or(1, |v| k.out_extents[v]);
        let view = GemmView {
            batch: k.out_extents[..batch_rank].to_vec(),
            m,
            n,
            k: r.extents[0],
            a,
            b,
            roles: roles(k, batch_rank, mvar, nvar),
            operands,
            out,
        };
        Some(view)
    }
}

/// A copy of GEMM kernel `k` that applies only its epilogue to an already computed product: the reduction is gone
/// and `Acc` reads element `out[row-major]` of an extra last input, the product `C` in f32 with the output's
/// extents (`[batch.., m, n]`, contiguous). Backends whose fast GEMM cannot apply an epilogue itself (a library's
/// GEMM, a split-K reduction, the CPU's transposed candidate) run the product, then this kernel: the CPU writes C
/// into an f32 output and passes it again as C (updated in place); the GPU devices keep C in scratch of its own.
pub fn epilogue_pass(k: &KernelIr) -> KernelIr {
    let mut e = k.clone();
    e.reduce = None;
    let c_in = e.inputs.len();
    e.inputs.push(crate::kernel::ir::BufParam { dtype: DType::F32, len: k.output.len });
    let coef: Vec<i64> = crate::shape::contiguous_strides(&e.out_extents).iter().map(|&s| s as i64).collect();
    let index = IExpr::from_affine(&coef, 0);
    for inst in &mut e.outer {
        if matches!(inst.op, InstOp::Acc) {
            inst.op = InstOp::Load { buf: c_in, index: index.clone(), valid: None, fill: crate::Scalar::Float(0.0) };
        }
    }
    e.name = format!("{}_epilogue", k.name);
    e.flops_per_elem = e.outer.len();
    e
}

/// An elementwise kernel (no reduction) over `[batch.., m, n]`, `[m, n]`, or `[n]` with `m = 1`, seen as a GEMM
/// epilogue without an accumulator: every value classified by what it varies with, as for a GEMM's outer code. A CPU
/// renderer that already places an epilogue in registers runs such a kernel with the same translation. Callers merge
/// loops first (`KernelIr::with_merged_loops`) so that batch dims remain only where an operand needs them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseView {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    /// Per outer instruction.
    pub roles: Vec<Role>,
}

impl ElementwiseView {
    /// `None` for a reduce kernel, an output that is not f32 or bf16, of rank 0, or empty.
    pub fn of(k: &KernelIr) -> Option<ElementwiseView> {
        let rank = k.out_rank();
        if k.reduce.is_some()
            || !k.rows.is_empty()
            || !matches!(k.output.dtype, DType::F32 | DType::BF16)
            || rank == 0
            || k.out_extents.contains(&0)
        {
            return None;
        }
        let (batch_rank, mvar, nvar) = if rank == 1 { (0, None, 0) } else { (rank - 2, Some(rank - 2), rank - 1) };
        Some(ElementwiseView {
            batch: k.out_extents[..batch_rank].to_vec(),
            m: mvar.map_or(1, |v| k.out_extents[v]),
            n: k.out_extents[nvar],
            roles: roles(k, batch_rank, mvar, nvar),
        })
    }

    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }
}

/// Classifies every outer instruction (see [`Role`]).
fn roles(k: &KernelIr, batch_rank: usize, mvar: Option<usize>, nvar: usize) -> Vec<Role> {
    let nvars = k.out_rank();
    let mut out: Vec<Role> = Vec::with_capacity(k.outer.len());
    for inst in &k.outer {
        let role = match &inst.op {
            InstOp::Const(_) => Role::Uniform,
            InstOp::Acc => Role::Computed,
            InstOp::RowAcc(_) => Role::Other,
            InstOp::Index(e) => match e.affine(nvars) {
                Some((coef, c))
                    if inst.dtype == DType::I32
                        && coef.iter().enumerate().all(|(v, &x)| x == i64::from(v == nvar))
                        && i32::try_from(c).is_ok() =>
                {
                    Role::Position { offset: c }
                }
                _ => Role::Other,
            },
            InstOp::Rand { .. } | InstOp::Gather { .. } => Role::Other,
            InstOp::Load { buf, index, valid, .. } => match index.affine(nvars) {
                Some((coef, c)) if valid.is_none() => {
                    let cm = mvar.map_or(0, |v| coef[v]);
                    let cn = coef[nvar];
                    let batch = coef[..batch_rank].to_vec();
                    // 32-bit lanes either way; an i32 value translates only where an int op reads it, a bf16 one
                    // only where the renderer widens 2-byte loads (the CPU's `epilogue::Allow::bf16_loads`).
                    let f32 = matches!(inst.dtype, DType::F32 | DType::I32 | DType::BF16);
                    match (cm, cn) {
                        (0, 0) if batch.iter().all(|&b| b == 0) => Role::Uniform,
                        (_, 1) if f32 && cm != 0 => Role::Mat { buf: *buf, offset: c, batch, ld: cm },
                        (0, 1) if f32 => Role::Row { buf: *buf, offset: c, batch },
                        (_, 0) if f32 && cm != 0 => Role::Col { buf: *buf, offset: c, batch, stride: cm },
                        _ => Role::Other,
                    }
                }
                _ => Role::Other,
            },
            InstOp::Unary(_, a) | InstOp::Cast(a) => combine(&[&out[*a]]),
            InstOp::Binary(_, a, b) => combine(&[&out[*a], &out[*b]]),
            InstOp::Where(c, a, b) => combine(&[&out[*c], &out[*a], &out[*b]]),
        };
        out.push(role);
    }
    out
}

fn combine(srcs: &[&Role]) -> Role {
    if srcs.iter().any(|r| matches!(r, Role::Other)) {
        Role::Other
    } else if srcs.iter().all(|r| matches!(r, Role::Uniform)) {
        Role::Uniform
    } else {
        Role::Computed
    }
}
