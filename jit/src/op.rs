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
}

impl BinaryOp {
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
}

/// Counter-based random distributions (see `rng`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandDist {
    /// Uniform in [0, 1).
    Uniform,
    /// Standard normal (Box-Muller).
    Normal,
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
        }
    }

    /// Number of sources this op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input { .. } | Op::Const(_) | Op::Iota { .. } | Op::Rand { .. } => 0,
            Op::Binary(_) | Op::Matmul => 2,
            Op::Where => 3,
            _ => 1,
        }
    }

    pub fn is_movement(&self) -> bool {
        matches!(self, Op::Reshape | Op::Permute(_) | Op::Expand | Op::Slice(_) | Op::Pad { .. })
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
