//! A generated program: its steps (`Step`), their operands and scalars, and how a program prints as code.

use super::*;

/// How a realized input's values are drawn (see `input`).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Data {
    /// `common::Dom::Cont`: floats anywhere in [lo, hi), ints in [lo, hi].
    Cont(f64, f64),
    /// `common::Dom::Grid`: multiples of 0.5 (ties and exact zeros, for comparisons and argmax).
    Grid(f64, f64),
    /// `Cont(-2, 2)` with NaN, +-inf and -0.0 sprinkled in.
    Specials,
}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Data::Cont(a, b) => write!(f, "Cont({a:?}, {b:?})"),
            Data::Grid(a, b) => write!(f, "Grid({a:?}, {b:?})"),
            Data::Specials => write!(f, "Specials"),
        }
    }
}

/// A Rust scalar operand, printed as the literal a user would write.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Sc {
    F(f64),
    I(i64),
    B(bool),
}

impl fmt::Debug for Sc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Sc::F(x) if x.is_nan() => write!(f, "f64::NAN"),
            Sc::F(x) if x == f64::INFINITY => write!(f, "f64::INFINITY"),
            Sc::F(x) if x == f64::NEG_INFINITY => write!(f, "f64::NEG_INFINITY"),
            Sc::F(x) => write!(f, "{x:?}"),
            Sc::I(x) => write!(f, "{x}"),
            Sc::B(x) => write!(f, "{x}"),
        }
    }
}

impl Sc {
    pub(super) fn operand(self) -> kiln::Operand {
        match self {
            Sc::F(x) => x.into(),
            Sc::I(x) => x.into(),
            Sc::B(x) => x.into(),
        }
    }

    pub(super) fn scalar(self) -> kiln::Scalar {
        match self {
            Sc::F(x) => x.into(),
            Sc::I(x) => x.into(),
            Sc::B(x) => x.into(),
        }
    }

    pub(super) fn natural(self) -> DType {
        self.scalar().natural_dtype()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Un {
    Neg,
    Abs,
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sqrt,
    Recip,
    Rsqrt,
    Sigmoid,
    Relu,
    Square,
    LogicalNot,
    Floor,
    Ceil,
    Round,
    Trunc,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    LogicalAnd,
    LogicalOr,
}

impl Bin {
    pub(super) fn is_comparison(self) -> bool {
        matches!(self, Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge | Bin::Eq | Bin::Ne | Bin::LogicalAnd | Bin::LogicalOr)
    }

    pub(super) fn method(self) -> &'static str {
        match self {
            Bin::Add => "add",
            Bin::Sub => "sub",
            Bin::Mul => "mul",
            Bin::Div => "div",
            Bin::Maximum => "maximum",
            Bin::Minimum => "minimum",
            Bin::Pow => "pow",
            Bin::Lt => "lt",
            Bin::Le => "le",
            Bin::Gt => "gt",
            Bin::Ge => "ge",
            Bin::Eq => "eq",
            Bin::Ne => "ne",
            Bin::LogicalAnd => "logical_and",
            Bin::LogicalOr => "logical_or",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Red {
    Sum,
    Prod,
    Max,
    Min,
    Mean,
}

/// The right-hand side of a binary op or a branch of `where_`.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Rhs {
    Var(usize),
    Sc(Sc),
}

impl fmt::Debug for Rhs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rhs::Var(v) => write!(f, "&v{v}"),
            Rhs::Sc(s) => write!(f, "{s:?}"),
        }
    }
}

/// One step; step i defines `v{i}` (except `Realize`, which realizes an earlier value in place).
#[derive(Clone, PartialEq)]
pub(super) enum Step {
    Input {
        dtype: DType,
        dims: Vec<usize>,
        data: Data,
        seed: u64,
    },
    Full {
        dtype: DType,
        dims: Vec<usize>,
        value: Sc,
    },
    Rand {
        dtype: DType,
        dims: Vec<usize>,
        normal: bool,
    },
    Arange {
        n: usize,
        dims: Vec<usize>,
    },
    Scalar {
        dtype: DType,
        value: Sc,
    },
    Unary(Un, usize),
    Binary(Bin, usize, Rhs),
    /// `scalar - v` or `scalar / v` through the operator impls.
    Reversed(Bin, Sc, usize),
    Where(usize, Rhs, Rhs),
    Cast(usize, DType),
    Reduce(Red, usize, Vec<isize>, bool),
    Arg {
        max: bool,
        v: usize,
        dim: isize,
        keepdim: bool,
    },
    Reshape(usize, Vec<i64>),
    Permute(usize, Vec<isize>),
    Transpose(usize, isize, isize),
    Expand {
        v: usize,
        spec: Vec<i64>,
        broadcast_to: bool,
    },
    Slice {
        v: usize,
        dim: isize,
        start: isize,
        end: isize,
        step: usize,
    },
    Narrow {
        v: usize,
        dim: isize,
        start: usize,
        len: usize,
    },
    Flip(usize, Vec<isize>),
    Pad(usize, Vec<(usize, usize)>, Sc),
    Unfold {
        v: usize,
        dim: isize,
        size: usize,
        step: usize,
    },
    Cat(Vec<usize>, isize),
    Stack(Vec<usize>, isize),
    Unsqueeze(usize, isize),
    Squeeze(usize, Vec<isize>),
    Contiguous(usize),
    Matmul(usize, usize),
    Softmax {
        v: usize,
        dim: isize,
        log: bool,
    },
    /// Realizes `v` (after checking it against the reference); later steps read it as an input.
    Realize(usize),
}

pub(super) fn list<T: fmt::Debug>(xs: &[T]) -> String {
    format!("[{}]", xs.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "))
}

pub(super) fn vars(vs: &[usize]) -> String {
    format!("[{}]", vs.iter().map(|v| format!("&v{v}")).collect::<Vec<_>>().join(", "))
}

impl Step {
    /// The values this step reads.
    pub(super) fn operands(&self) -> Vec<usize> {
        let rhs = |r: &Rhs| match r {
            Rhs::Var(v) => vec![*v],
            Rhs::Sc(_) => Vec::new(),
        };
        match self {
            Step::Input { .. } | Step::Full { .. } | Step::Rand { .. } | Step::Arange { .. } | Step::Scalar { .. } => {
                Vec::new()
            }
            Step::Binary(_, v, r) => [vec![*v], rhs(r)].concat(),
            Step::Where(c, a, b) => [vec![*c], rhs(a), rhs(b)].concat(),
            Step::Cat(vs, _) | Step::Stack(vs, _) => vs.clone(),
            Step::Matmul(a, b) => vec![*a, *b],
            Step::Unary(_, v)
            | Step::Reversed(_, _, v)
            | Step::Cast(v, _)
            | Step::Reduce(_, v, _, _)
            | Step::Arg { v, .. }
            | Step::Reshape(v, _)
            | Step::Permute(v, _)
            | Step::Transpose(v, _, _)
            | Step::Expand { v, .. }
            | Step::Slice { v, .. }
            | Step::Narrow { v, .. }
            | Step::Unfold { v, .. }
            | Step::Flip(v, _)
            | Step::Pad(v, _, _)
            | Step::Unsqueeze(v, _)
            | Step::Squeeze(v, _)
            | Step::Contiguous(v)
            | Step::Softmax { v, .. }
            | Step::Realize(v) => vec![*v],
        }
    }

    /// The step with every value `v` it reads renamed to `map[v]`.
    pub(super) fn remap(&self, map: &[usize]) -> Step {
        let mut s = self.clone();
        let rhs = |r: &mut Rhs| {
            if let Rhs::Var(v) = r {
                *v = map[*v];
            }
        };
        match &mut s {
            Step::Input { .. } | Step::Full { .. } | Step::Rand { .. } | Step::Arange { .. } | Step::Scalar { .. } => {}
            Step::Binary(_, v, r) => {
                *v = map[*v];
                rhs(r);
            }
            Step::Where(c, a, b) => {
                *c = map[*c];
                rhs(a);
                rhs(b);
            }
            Step::Cat(vs, _) | Step::Stack(vs, _) => vs.iter_mut().for_each(|v| *v = map[*v]),
            Step::Matmul(a, b) => {
                *a = map[*a];
                *b = map[*b];
            }
            Step::Unary(_, v)
            | Step::Reversed(_, _, v)
            | Step::Cast(v, _)
            | Step::Reduce(_, v, _, _)
            | Step::Arg { v, .. }
            | Step::Reshape(v, _)
            | Step::Permute(v, _)
            | Step::Transpose(v, _, _)
            | Step::Expand { v, .. }
            | Step::Slice { v, .. }
            | Step::Narrow { v, .. }
            | Step::Unfold { v, .. }
            | Step::Flip(v, _)
            | Step::Pad(v, _, _)
            | Step::Unsqueeze(v, _)
            | Step::Squeeze(v, _)
            | Step::Contiguous(v)
            | Step::Softmax { v, .. }
            | Step::Realize(v) => *v = map[*v],
        }
        s
    }

    /// The step as Rust code (without `let vN = ` and `;`).
    pub(super) fn code(&self) -> String {
        match self {
            Step::Input { dtype, dims, data, seed } => format!("input({dtype:?}, {}, {data:?}, {seed})", list(dims)),
            Step::Full { dtype, dims, value } => format!("Tensor::full({}, {value:?}, {dtype:?}, &dev)", list(dims)),
            Step::Rand { dtype, dims, normal } => {
                format!("Tensor::{}({}, {dtype:?}, &dev)", if *normal { "randn" } else { "rand" }, list(dims))
            }
            Step::Arange { n, dims } => format!("Tensor::arange(0, {n}, 1, &dev).reshape({})", list(dims)),
            Step::Scalar { dtype, value } => format!("Tensor::scalar({value:?}, {dtype:?}, &dev)"),
            Step::Unary(u, v) => {
                format!("v{v}.{}()", format!("{u:?}").to_lowercase().replace("logicalnot", "logical_not"))
            }
            Step::Binary(b, v, r) => format!("v{v}.{}({r:?})", b.method()),
            Step::Reversed(b, s, v) => format!("{s:?} {} &v{v}", if *b == Bin::Sub { "-" } else { "/" }),
            Step::Where(c, a, b) => format!("v{c}.where_({a:?}, {b:?})"),
            Step::Cast(v, d) => format!("v{v}.to_dtype({d:?})"),
            Step::Reduce(r, v, dims, keepdim) => {
                format!("v{v}.{}({}, {keepdim})", format!("{r:?}").to_lowercase(), list(dims))
            }
            Step::Arg { max, v, dim, keepdim } => {
                format!("v{v}.{}({dim}, {keepdim})", if *max { "argmax" } else { "argmin" })
            }
            Step::Reshape(v, spec) => format!("v{v}.reshape({})", list(spec)),
            Step::Permute(v, p) => format!("v{v}.permute({})", list(p)),
            Step::Transpose(v, a, b) => format!("v{v}.transpose({a}, {b})"),
            Step::Expand { v, spec, broadcast_to } => {
                format!("v{v}.{}({})", if *broadcast_to { "broadcast_to" } else { "expand" }, list(spec))
            }
            Step::Slice { v, dim, start, end, step } => format!("v{v}.slice({dim}, {start}, {end}, {step})"),
            Step::Narrow { v, dim, start, len } => format!("v{v}.narrow({dim}, {start}, {len})"),
            Step::Unfold { v, dim, size, step } => format!("v{v}.unfold({dim}, {size}, {step})"),
            Step::Flip(v, dims) => format!("v{v}.flip({})", list(dims)),
            Step::Pad(v, pads, value) => format!("v{v}.pad(&{}, {value:?})", list(pads)),
            Step::Cat(vs, dim) => format!("Tensor::cat(&{}, {dim})", vars(vs)),
            Step::Stack(vs, dim) => format!("Tensor::stack(&{}, {dim})", vars(vs)),
            Step::Unsqueeze(v, d) => format!("v{v}.unsqueeze({d})"),
            Step::Squeeze(v, dims) => format!("v{v}.squeeze({})", list(dims)),
            Step::Contiguous(v) => format!("v{v}.contiguous()"),
            Step::Matmul(a, b) => format!("v{a}.matmul(&v{b})"),
            Step::Softmax { v, dim, log } => format!("v{v}.{}({dim})", if *log { "log_softmax" } else { "softmax" }),
            Step::Realize(v) => format!("v{v}.realize()?"),
        }
    }
}

/// A generated program: its steps, the type and value class of each value, and how its outputs are realized.
#[derive(Clone)]
pub(super) struct Prog {
    pub(super) steps: Vec<Step>,
    /// Per step: the class of the value it defines, or for `Realize`, of the value it realizes.
    pub(super) info: Vec<Info>,
    pub(super) outputs: Vec<usize>,
    /// `kiln::realize(&outputs)` first, or each output realized on its own by `to_host`/`to_vec`.
    pub(super) together: bool,
    /// For `kiln::manual_seed`, which the `rand`/`randn` leaves draw from.
    pub(super) seed: u64,
}

impl fmt::Debug for Prog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{{")?;
        writeln!(f, "    kiln::manual_seed({});", self.seed)?;
        for (i, (s, info)) in self.steps.iter().zip(&self.info).enumerate() {
            match s {
                Step::Realize(_) => writeln!(f, "    {};  // checked first, as {info:?}", s.code())?,
                _ => writeln!(f, "    let v{i} = {};  // {info:?}", s.code())?,
            }
        }
        let outs = vars(&self.outputs);
        if self.together {
            writeln!(f, "    kiln::realize(&{outs})?;  // then to_host/to_vec each")?;
        } else {
            writeln!(f, "    // to_host/to_vec each of {outs}, in order")?;
        }
        write!(f, "}}")
    }
}
