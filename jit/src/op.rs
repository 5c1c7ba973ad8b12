//! The primitive op set: every backend implements exactly these, so no op can be missing on a device.
//!
//! Everything else the user sees (softmax, argmax, eye, linspace, cat, relu, ...) is a composition of these in the
//! `kiln` crate. Each node also carries its output shape and dtype (see `graph::NodeData`), so an op holds only
//! the parameters that the shape and dtype do not already say: `Reshape` and `Expand` carry nothing because the
//! node's shape is their target.

use crate::dtype::Scalar;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sqrt,
    Recip,
    Abs,
    /// Logical not on bool.
    Not,
    /// Rounding to an integral value (floats only): toward -inf, toward +inf, to nearest with ties to even (as
    /// PyTorch's `round`), toward zero.
    Floor,
    Ceil,
    Round,
    Trunc,
    /// `log(1 + x)` and `exp(x) - 1` (floats only), accurate where `x` is near 0 (where the composed forms lose
    /// every digit to the rounding of `1 + x` or of `exp(x)`).
    Log1p,
    Expm1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// On bool: logical or (as PyTorch's `True + True == True`).
    Add,
    Sub,
    /// On bool: logical and.
    Mul,
    /// True division on floats, truncating on ints (the `kiln` crate promotes ints to float for `/`).
    Div,
    Max,
    Min,
    Pow,
    /// Comparisons produce bool; operands have equal dtypes.
    Lt,
    Le,
    Eq,
    Ne,
    And,
    Or,
    /// The remainder of truncating division (C's `fmod` on floats, exact; `%` on ints, 0 for a zero divisor): the
    /// sign of the dividend. Appended, so persisted signatures keep their codes.
    Rem,
}

impl UnaryOp {
    /// Every unary op, in declaration order (so `ALL[op as usize] == op`, which [`Op::decode`] relies on).
    pub const ALL: [UnaryOp; 16] = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
        UnaryOp::Abs,
        UnaryOp::Not,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
    ];
}

impl BinaryOp {
    /// Every binary op, in declaration order (`ALL[op as usize] == op`).
    pub const ALL: [BinaryOp; 14] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Rem,
    ];

    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Lt | BinaryOp::Le | BinaryOp::Eq | BinaryOp::Ne)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    /// NaN propagates, as in PyTorch.
    Max,
    Min,
}

impl ReduceOp {
    /// Every reduction, in declaration order (`ALL[op as usize] == op`).
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min];

    /// The accumulator's starting value for dtype `d` (what an empty reduction gives).
    pub fn identity(self, d: crate::dtype::DType) -> Scalar {
        match (self, d.is_float()) {
            (ReduceOp::Sum, _) => Scalar::Int(0),
            (ReduceOp::Prod, _) => Scalar::Int(1),
            (ReduceOp::Max, true) => Scalar::Float(f64::NEG_INFINITY),
            (ReduceOp::Min, true) => Scalar::Float(f64::INFINITY),
            (ReduceOp::Max, false) => Scalar::Int(d.int_range().0),
            (ReduceOp::Min, false) => Scalar::Int(d.int_range().1),
        }
    }

    /// The binary op that folds one more value into the accumulator.
    pub fn fold(self) -> BinaryOp {
        match self {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        }
    }
}

/// Counter-based random distributions (see `rng`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandDist {
    /// Uniform in [0, 1).
    Uniform,
    /// Standard normal (Box-Muller).
    Normal,
}

impl RandDist {
    /// Every distribution, in declaration order (`ALL[dist as usize] == dist`).
    pub const ALL: [RandDist; 2] = [RandDist::Uniform, RandDist::Normal];
}

/// A matrix factorization or solve over the last two dims, batched over the leading ones: a kernel of its own on
/// every device (`kernel::routine`), never fused. Its sources and output are stored row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinalgOp {
    /// LU with partial pivoting of square `[.., n, n]`: `[.., n, n + 2]`, each row the packed factors (L's unit
    /// diagonal not stored), then the row permutation (`(P A)[i] = A[perm[i]]`, 0-based) and LAPACK's pivot of that
    /// step (1-based, PyTorch's `pivots`), both as values of the dtype. With `check`, a numerically zero pivot is a
    /// fault (`Fault::Singular`); without, elimination skips it (a determinant's zero).
    Lu { check: bool },
    /// The lower Cholesky factor of a symmetric positive definite `[.., n, n]` (its lower triangle is read); a
    /// leading minor that is not positive is a fault (`Fault::NotPositiveDefinite`).
    Cholesky,
    /// `X` with `A X = B` for triangular `A [.., n, n]` and `B [.., n, k]`: only `A`'s upper or lower triangle is
    /// read, and with `unit` not its diagonal (taken as ones). A zero diagonal element is a `Fault::Singular`.
    TriSolve { upper: bool, unit: bool },
}

impl LinalgOp {
    /// Short name for kernel names and dumps.
    pub fn name(self) -> &'static str {
        match self {
            LinalgOp::Lu { check: true } => "lu",
            LinalgOp::Lu { check: false } => "lu_unchecked",
            LinalgOp::Cholesky => "cholesky",
            LinalgOp::TriSolve { upper: false, unit: false } => "trsm_lower",
            LinalgOp::TriSolve { upper: false, unit: true } => "trsm_lower_unit",
            LinalgOp::TriSolve { upper: true, unit: false } => "trsm_upper",
            LinalgOp::TriSolve { upper: true, unit: true } => "trsm_upper_unit",
        }
    }

    /// One word for signatures: every variant a distinct number.
    fn code(self) -> u64 {
        match self {
            LinalgOp::Lu { check } => check as u64,
            LinalgOp::Cholesky => 2,
            LinalgOp::TriSolve { upper, unit } => 3 + upper as u64 * 2 + unit as u64,
        }
    }

    fn from_code(c: u64) -> Option<LinalgOp> {
        Some(match c {
            0 | 1 => LinalgOp::Lu { check: c == 1 },
            2 => LinalgOp::Cholesky,
            3..=6 => LinalgOp::TriSolve { upper: (c - 3) / 2 == 1, unit: (c - 3) % 2 == 1 },
            _ => return None,
        })
    }

    /// Every variant (for tests of the encoding).
    pub const ALL: [LinalgOp; 7] = [
        LinalgOp::Lu { check: false },
        LinalgOp::Lu { check: true },
        LinalgOp::Cholesky,
        LinalgOp::TriSolve { upper: false, unit: false },
        LinalgOp::TriSolve { upper: false, unit: true },
        LinalgOp::TriSolve { upper: true, unit: false },
        LinalgOp::TriSolve { upper: true, unit: true },
    ];
}

/// One primitive. Operands are the node's sources, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A realized buffer bound at run time; `slot` is its position in the plan's input list.
    Input {
        slot: usize,
    },
    /// A scalar broadcast to the node's shape.
    Const(Scalar),
    /// `start + i * step` along a 1-D node (computed in the node's dtype).
    Iota {
        start: Scalar,
        step: Scalar,
    },
    /// Random numbers for flat index i from (seed, offset + i). Seed and offset are run-time arguments of a plan
    /// (`slot` indexes the plan's list of `RngKey`s), not part of its signature, so a training loop that draws fresh
    /// dropout masks replays one plan.
    Rand {
        dist: RandDist,
        slot: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `where(cond, a, b)`: sources are (bool cond, a, b), already broadcast to the node's shape.
    Where,
    Cast,
    /// Reduces the listed axes to size 1 (keepdim); the caller reshapes to drop them.
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
    },
    /// Same element count, new shape (the node's), over a contiguous (row-major) reading of the source.
    Reshape,
    /// Output dim i is source dim `perm[i]`.
    Permute(Vec<usize>),
    /// Stretch dims of size 1 to the node's shape (same rank).
    Expand,
    /// Per dim: `(start, step)`; output index j reads source index `start + j * step` (step may not be 0).
    /// Covers narrow, strided slicing and flip (start = n - 1, step = -1).
    Slice(Vec<(usize, isize)>),
    /// Per dim: `(before, after)` elements of `value` around the source.
    Pad {
        pads: Vec<(usize, usize)>,
        value: Scalar,
    },
    /// Batched matmul: sources [B.., M, K] and [B.., K, N] with equal batch dims.
    Matmul,
    /// Forces materialization; numerically the identity.
    Contiguous,
    /// A data-dependent load (PyTorch's `gather`): sources (src, index), index of dtype i32 or i64 shaped as the
    /// node, src of the node's shape except along `axis`; `out[j] = src[j with j[axis] = index[j]]`. An index
    /// outside `0..src.shape[axis]` is a run-time error (the plan's fault word, `kernel::fault`), never a read
    /// outside the source.
    Gather {
        axis: usize,
    },
    /// Sliding windows (PyTorch's `Tensor.unfold`, with a dilation): source dim `axis` of length `n` becomes the
    /// window count `(n - dilation * (size - 1) - 1) / step + 1`, and a new last dim of length `size` holds each
    /// window, `out[.., o, .., i] = src[.., o * step + i * dilation, ..]`. A view: its index stays affine (a
    /// convolution's patches are two of these, read by the GEMM with no division per element).
    Unfold {
        axis: usize,
        size: usize,
        step: usize,
        dilation: usize,
    },
    /// A factorization or triangular solve (`LinalgOp`): sources `[A]`, or `[A, B]` for a solve, with the node's
    /// leading (batch) dims.
    Linalg(LinalgOp),
    /// `out[p, w]` = the sum of `values[t, w]` over the rows `t` whose index is `p`, added in row order (sources
    /// `[index [J, 1] or [J, W], values [J, W]]`, result `[positions, W]`): a routine (`kernel::scatter`), never
    /// fused. An index outside `0..positions` is a fault.
    ScatterRows {
        positions: usize,
    },
    /// For each row of `[rows, n]` values, the indices that sort it (`torch.argsort(stable=True)`), the first
    /// `keep` of them (`[rows, keep]`; `keep = n` for a whole sort, `topk`'s k for a selection): a routine
    /// (`kernel::sort`), never fused; the node's dtype is the index dtype (i64, or i32 on a device without 64-bit
    /// integers). Ascending or `descending` by value, every NaN after every number ascending, ties (`-0 == +0`,
    /// NaN with NaN) in index order.
    SortRows {
        descending: bool,
        keep: usize,
    },
}

impl Op {
    /// A short name for dumps and kernel names.
    pub fn name(&self) -> String {
        match self {
            Op::Input { slot } => format!("input{slot}"),
            Op::Const(s) => format!("const({s})"),
            Op::Iota { start, step } => format!("iota({start},{step})"),
            Op::Rand { dist, slot } => format!("rand_{dist:?}{slot}").to_lowercase(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Where => "where".into(),
            Op::Cast => "cast".into(),
            Op::Reduce { op, axes } => format!("reduce_{op:?}{axes:?}").to_lowercase(),
            Op::Reshape => "reshape".into(),
            Op::Permute(p) => format!("permute{p:?}"),
            Op::Expand => "expand".into(),
            Op::Slice(s) => format!("slice{s:?}"),
            Op::Pad { pads, value } => format!("pad{pads:?}={value}"),
            Op::Matmul => "matmul".into(),
            Op::Contiguous => "contiguous".into(),
            Op::Gather { axis } => format!("gather{axis}"),
            Op::Unfold { axis, size, step, dilation } => format!("unfold{axis}[{size}/{step}/{dilation}]"),
            Op::Linalg(l) => l.name().into(),
            Op::ScatterRows { positions } => format!("scatter_rows{positions}"),
            Op::SortRows { descending, keep } => {
                format!("sort_rows_{}{keep}", if *descending { "desc" } else { "asc" })
            }
        }
    }

    /// Appends a stable encoding of the op (kind and parameters, not run-time arguments) to a signature.
    pub fn encode(&self, out: &mut Vec<u64>) {
        let list = |out: &mut Vec<u64>, xs: &mut dyn Iterator<Item = u64>| {
            let at = out.len();
            out.push(0);
            let mut n = 0;
            for x in xs {
                out.push(x);
                n += 1;
            }
            out[at] = n;
        };
        match self {
            Op::Input { slot } => out.extend([1, *slot as u64]),
            Op::Const(s) => {
                out.push(2);
                out.extend(s.key());
            }
            Op::Iota { start, step } => {
                out.push(3);
                out.extend(start.key());
                out.extend(step.key());
            }
            Op::Rand { dist, slot } => out.extend([4, *dist as u64, *slot as u64]),
            Op::Unary(u) => out.extend([5, *u as u64]),
            Op::Binary(b) => out.extend([6, *b as u64]),
            Op::Where => out.push(7),
            Op::Cast => out.push(8),
            Op::Reduce { op, axes } => {
                out.extend([9, *op as u64]);
                list(out, &mut axes.iter().map(|&a| a as u64));
            }
            Op::Reshape => out.push(10),
            Op::Permute(p) => {
                out.push(11);
                list(out, &mut p.iter().map(|&a| a as u64));
            }
            Op::Expand => out.push(12),
            Op::Slice(s) => {
                out.push(13);
                list(out, &mut s.iter().flat_map(|&(a, b)| [a as u64, b as u64]));
            }
            Op::Pad { pads, value } => {
                out.push(14);
                out.extend(value.key());
                list(out, &mut pads.iter().flat_map(|&(a, b)| [a as u64, b as u64]));
            }
            Op::Matmul => out.push(15),
            Op::Contiguous => out.push(16),
            Op::Gather { axis } => out.extend([17, *axis as u64]),
            Op::Unfold { axis, size, step, dilation } => {
                out.extend([18, *axis as u64, *size as u64, *step as u64, *dilation as u64])
            }
            Op::Linalg(l) => out.extend([19, l.code()]),
            Op::ScatterRows { positions } => out.extend([20, *positions as u64]),
            Op::SortRows { descending, keep } => out.extend([21, *descending as u64, *keep as u64]),
        }
    }

    /// Reads one op written by [`Op::encode`] from the start of `words`; returns it and the number of words it
    /// took. `None` when the words are not an encoding (unknown kind or parameter, or cut short): a persisted
    /// signature is checked by its store, and this is the guard against a format change, so it never panics.
    pub fn decode(words: &[u64]) -> Option<(Op, usize)> {
        let mut r = Words { words, at: 0 };
        let op = match r.next()? {
            1 => Op::Input { slot: r.index()? },
            2 => Op::Const(r.scalar()?),
            3 => Op::Iota { start: r.scalar()?, step: r.scalar()? },
            4 => Op::Rand { dist: r.pick(&RandDist::ALL)?, slot: r.index()? },
            5 => Op::Unary(r.pick(&UnaryOp::ALL)?),
            6 => Op::Binary(r.pick(&BinaryOp::ALL)?),
            7 => Op::Where,
            8 => Op::Cast,
            9 => Op::Reduce { op: r.pick(&ReduceOp::ALL)?, axes: r.list(1)?.map(|a| a[0] as usize).collect() },
            10 => Op::Reshape,
            11 => Op::Permute(r.list(1)?.map(|a| a[0] as usize).collect()),
            12 => Op::Expand,
            13 => Op::Slice(r.list(2)?.map(|p| (p[0] as usize, p[1] as i64 as isize)).collect()),
            14 => {
                let value = r.scalar()?;
                Op::Pad { pads: r.list(2)?.map(|p| (p[0] as usize, p[1] as usize)).collect(), value }
            }
            15 => Op::Matmul,
            16 => Op::Contiguous,
            17 => Op::Gather { axis: r.index()? },
            18 => Op::Unfold { axis: r.index()?, size: r.index()?, step: r.index()?, dilation: r.index()? },
            19 => Op::Linalg(LinalgOp::from_code(r.next()?)?),
            20 => Op::ScatterRows { positions: r.index()? },
            21 => Op::SortRows {
                descending: match r.next()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                keep: r.index()?,
            },
            _ => return None,
        };
        Some((op, r.at))
    }

    /// Number of sources this op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Const(_) | Op::Iota { .. } | Op::Rand { .. } => 0,
            Op::Binary(_)
            | Op::Matmul
            | Op::Gather { .. }
            | Op::Linalg(LinalgOp::TriSolve { .. })
            | Op::ScatterRows { .. } => 2,
            Op::Where => 3,
            _ => 1,
        }
    }

    pub fn is_movement(&self) -> bool {
        matches!(self, Op::Reshape | Op::Permute(_) | Op::Expand | Op::Slice(_) | Op::Pad { .. } | Op::Unfold { .. })
    }
}

/// A cursor over encoded words, for [`Op::decode`].
struct Words<'a> {
    words: &'a [u64],
    at: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self) -> Option<u64> {
        let w = self.words.get(self.at).copied();
        self.at += 1;
        w
    }

    fn index(&mut self) -> Option<usize> {
        usize::try_from(self.next()?).ok()
    }

    fn scalar(&mut self) -> Option<Scalar> {
        Scalar::from_key([self.next()?, self.next()?])
    }

    /// The enum value whose discriminant is the next word.
    fn pick<T: Copy>(&mut self, all: &[T]) -> Option<T> {
        all.get(self.index()?).copied()
    }

    /// A length-prefixed list of `width`-word elements, as `encode` writes them (the prefix counts words).
    fn list(&mut self, width: usize) -> Option<std::slice::ChunksExact<'a, u64>> {
        let n = self.index()?;
        let items = self.words.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        (n % width == 0).then(|| items.chunks_exact(width))
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The run-time key of one `Rand` node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RngKey {
    pub seed: u64,
    pub offset: u64,
}

impl RngKey {
    /// Keys as the GPU kernels read them: four 32-bit words each (seed low, seed high, offset low, offset high),
    /// little-endian bytes, one slot after another.
    pub fn gpu_bytes(keys: &[RngKey]) -> Vec<u8> {
        keys.iter()
            .flat_map(|k| [k.seed as u32, (k.seed >> 32) as u32, k.offset as u32, (k.offset >> 32) as u32])
            .flat_map(u32::to_le_bytes)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_decodes_to_itself() {
        // `ALL[x as usize] == x` is what decoding a discriminant relies on.
        assert!(UnaryOp::ALL.iter().enumerate().all(|(i, &u)| u as usize == i));
        assert!(BinaryOp::ALL.iter().enumerate().all(|(i, &b)| b as usize == i));
        assert!(ReduceOp::ALL.iter().enumerate().all(|(i, &r)| r as usize == i));
        assert!(RandDist::ALL.iter().enumerate().all(|(i, &d)| d as usize == i));
        let mut ops = vec![
            Op::Input { slot: 3 },
            Op::Const(Scalar::Float(-0.0)),
            Op::Const(Scalar::Float(f64::NAN)),
            Op::Const(Scalar::Int(-7)),
            Op::Const(Scalar::Bool(true)),
            Op::Iota { start: Scalar::Int(2), step: Scalar::Float(0.5) },
            Op::Where,
            Op::Cast,
            Op::Reshape,
            Op::Permute(vec![2, 0, 1]),
            Op::Expand,
            Op::Slice(vec![(0, 1), (9, -1), (2, 3)]),
            Op::Pad { pads: vec![(1, 2), (0, 0)], value: Scalar::Float(-1.5) },
            Op::Matmul,
            Op::Contiguous,
            Op::Gather { axis: 2 },
            Op::ScatterRows { positions: 32000 },
            Op::SortRows { descending: false, keep: 32000 },
            Op::SortRows { descending: true, keep: 50 },
            Op::Unfold { axis: 1, size: 3, step: 2, dilation: 4 },
        ];
        ops.extend(RandDist::ALL.map(|dist| Op::Rand { dist, slot: 1 }));
        ops.extend(LinalgOp::ALL.map(Op::Linalg));
        ops.extend(UnaryOp::ALL.map(Op::Unary));
        ops.extend(BinaryOp::ALL.map(Op::Binary));
        ops.extend(ReduceOp::ALL.map(|op| Op::Reduce { op, axes: vec![0, 2] }));
        for op in ops {
            let mut words = vec![];
            op.encode(&mut words);
            words.push(99); // what follows the op is not read
            let (back, used) = Op::decode(&words).unwrap_or_else(|| panic!("{op:?} did not decode"));
            // Debug, since a NaN constant is not equal to itself.
            assert_eq!((format!("{back:?}"), used), (format!("{op:?}"), words.len() - 1));
            // Cut short anywhere: refused, not a panic.
            for cut in 0..used {
                assert_eq!(Op::decode(&words[..cut]), None, "{op:?} cut at {cut}");
            }
        }
        // Unknown kinds and parameters.
        let (unary_past, binary_past) = (UnaryOp::ALL.len() as u64, BinaryOp::ALL.len() as u64);
        for bad in [
            &[0u64][..],
            &[18],
            &[17],
            &[19, 7],
            &[5, unary_past],
            &[6, binary_past],
            &[9, 4, 0],
            &[4, 2, 0],
            &[2, 1, 2],
            &[2, 9, 0],
        ] {
            assert_eq!(Op::decode(bad), None, "{bad:?}");
        }
    }
}
