//! Random tensor programs, built through the public API, realized by the CPU JIT and held to the reference
//! interpreter; the fused kernel-IR evaluator (`kernel::eval::run_plan` over `kernel::schedule`) is held to it too.
//!
//! A program is a list of `let vN = ...;` steps over realized inputs (`from_vec`) and lazy leaves (`full`, `arange`,
//! `rand`/`randn`, zero-dim `scalar`): unary math, binary ops with broadcasting, Rust scalars and zero-dim tensors
//! (promotion included), comparisons and `where_`, casts between all dtypes, reductions (`keepdim` both ways, empty
//! dims lists), `argmax`/`argmin`, every movement op, `cat`, `matmul` (1-D, batched, broadcast batch), softmax and
//! log_softmax. Shapes include 0- and 1-sized dims and odd innermost sizes (the f32x4 loops' scalar tails). Some steps
//! realize an intermediate on the way (checked first), and the outputs are realized together with `kiln::realize`
//! or one by one with `to_host`/`to_vec`.
//!
//! Comparisons use the per-dtype tolerances of `tests/common` and nothing else. To keep them meaningful the generator
//! tracks, for every value, an interval holding its finite elements, whether it may hold NaN/inf, and whether the JIT
//! and the interpreter compute it bit for bit (moves, casts, comparisons and correctly rounded `+ - * / sqrt` of such
//! values) or only approximately (transcendentals, accumulations), with an estimate of the absolute and relative
//! difference. An op is generated only if that estimate stays within half the tolerance of the result's class
//! (`Kind::Accumulate` if an accumulation is in its history, else `Kind::Elementwise`; `Kind::Exact` for bit-exact
//! values; f32 tolerances once f32 rounding is in the history, even for an f64 result). Where a raw op would be
//! ill-conditioned on an approximate value (log, sqrt, division near 0, comparisons, casts to int, argmax, inf times
//! a value near 0), the generator either realizes that value first (it is then an input, the same for both) or uses
//! a safe form (`log(|x| + 1)`). Bit-exact values may go anywhere, NaN and inf included: NaN matches NaN.
//!
//! 256 cases per run by default; `PROPTEST_CASES` raises it. A failure prints the shrunk program as code, e.g.
//! `let v1 = v0.exp(); let v2 = v1.sum([-1], false);`; `input(F32, [3, 5], Cont(-2.0, 2.0), 7)` is this file's
//! helper for a realized input. Setting `KILN_CPU_ENGINE=interp` makes realize run the interpreter, which tells a
//! JIT bug from a generator bug.

// Programs run on the CPU (cargo feature `cpu`), which other devices are held to.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::{Kind, Tol, compare, tol};
use kiln::{DType, Device, HostBuffer, Tensor};
use kiln_jit::dtype::{Priority, result_type};
use proptest::prelude::*;
use std::fmt;

thread_local! {
    /// Set while generating programs for a WGSL device, where float arithmetic is not bit-exact: `/` and `sqrt` are
    /// not correctly rounded (WGSL allows 2.5 ulp, and lavapipe uses that latitude), and the driver may reassociate
    /// a fused chain (`-1 - (x + -1)` came back as `-x`). The generator then treats float `+ - * / sqrt` as
    /// approximate ops of that accuracy instead of bit-exact ones.
    static WGSL_ROUNDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Relative error of one WGSL float op (2.5 ulp, what WGSL allows `/` and `sqrt`), or `None` where float ops are
/// correctly rounded and evaluated as written.
fn loose_rounding(d: DType) -> Option<f64> {
    WGSL_ROUNDING.with(|f| f.get()).then(|| 2.5 * ulp(d))
}

/// Absolute error allowed a WGSL device's `sin`/`cos`, or `None` where they are kiln's own polynomials (the CPU).
/// The renderer reduces the argument to [-pi, pi] first (`kiln_reduce_2pi`), where WGSL promises only 2^-11
/// absolute; drivers do far better, but not always to a few ulp: NVIDIA's hardware sine is specified by an absolute
/// error near 2^-21 (seen: 1.2e-5 before the reduction at x = 500 on an H200, within 6e-7 after). 2^-19 holds a
/// device to about 2 f32 ulp at 1.0, and below 0.06 to an absolute bound rather than a relative one.
fn wgsl_trig_abs() -> f64 {
    if WGSL_ROUNDING.with(|f| f.get()) { 2f64.powi(-19) } else { 0.0 }
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256);
    // No regression files in the source tree: a failure prints its minimal program instead.
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------------------------
// Programs
// ---------------------------------------------------------------------------------------------------------------

/// How a realized input's values are drawn (see `input`).
#[derive(Clone, Copy, PartialEq)]
enum Data {
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
enum Sc {
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
    fn operand(self) -> kiln::Operand {
        match self {
            Sc::F(x) => x.into(),
            Sc::I(x) => x.into(),
            Sc::B(x) => x.into(),
        }
    }

    fn scalar(self) -> kiln::Scalar {
        match self {
            Sc::F(x) => x.into(),
            Sc::I(x) => x.into(),
            Sc::B(x) => x.into(),
        }
    }

    fn natural(self) -> DType {
        self.scalar().natural_dtype()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Un {
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
enum Bin {
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
    fn is_comparison(self) -> bool {
        matches!(self, Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge | Bin::Eq | Bin::Ne | Bin::LogicalAnd | Bin::LogicalOr)
    }

    fn method(self) -> &'static str {
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
enum Red {
    Sum,
    Prod,
    Max,
    Min,
    Mean,
}

/// The right-hand side of a binary op or a branch of `where_`.
#[derive(Clone, Copy, PartialEq)]
enum Rhs {
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
enum Step {
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

fn list<T: fmt::Debug>(xs: &[T]) -> String {
    format!("[{}]", xs.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "))
}

fn vars(vs: &[usize]) -> String {
    format!("[{}]", vs.iter().map(|v| format!("&v{v}")).collect::<Vec<_>>().join(", "))
}

impl Step {
    /// The values this step reads.
    fn operands(&self) -> Vec<usize> {
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
    fn remap(&self, map: &[usize]) -> Step {
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
    fn code(&self) -> String {
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
struct Prog {
    steps: Vec<Step>,
    /// Per step: the class of the value it defines, or for `Realize`, of the value it realizes.
    info: Vec<Info>,
    outputs: Vec<usize>,
    /// `kiln::realize(&outputs)` first, or each output realized on its own by `to_host`/`to_vec`.
    together: bool,
    /// For `kiln::manual_seed`, which the `rand`/`randn` leaves draw from.
    seed: u64,
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

// ---------------------------------------------------------------------------------------------------------------
// Value classes: what the generator knows about each value
// ---------------------------------------------------------------------------------------------------------------

/// What the generator knows about a value: bounds, special values, and how closely the JIT must match.
#[derive(Clone, Copy, PartialEq)]
struct Meta {
    /// Bounds of the finite elements (ints: exact bounds within the dtype's range).
    lo: f64,
    hi: f64,
    /// May hold NaN or an infinity.
    special: bool,
    /// The JIT and the interpreter compute it bit for bit.
    bit: bool,
    /// They compute equal values (but maybe zeros of different sign: max/min do not fix it).
    val: bool,
    /// Estimated absolute and relative difference between the two (both 0 when `val`).
    ea: f64,
    er: f64,
    /// A reduction, matmul or softmax is in its history (`Kind::Accumulate`).
    acc: bool,
    /// f32 rounding differences are in its history (f32 tolerances apply, even for an f64 value).
    coarse: bool,
}

impl Meta {
    fn exact(lo: f64, hi: f64, special: bool) -> Meta {
        Meta { lo, hi, special, bit: true, val: true, ea: 0.0, er: 0.0, acc: false, coarse: false }
    }

    fn mag(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }

    /// `min |x|` over the finite elements (0 if the bounds straddle zero).
    fn min_abs(&self) -> f64 {
        if self.lo > 0.0 {
            self.lo
        } else if self.hi < 0.0 {
            -self.hi
        } else {
            0.0
        }
    }

    /// Absolute difference bound, relative differences turned absolute.
    fn abs_err(&self) -> f64 {
        self.ea + self.er * self.mag()
    }

    /// Flags of a value computed from `parts` (error terms are the caller's).
    fn joined(parts: &[&Meta], lo: f64, hi: f64) -> Meta {
        Meta {
            lo,
            hi,
            special: parts.iter().any(|m| m.special),
            bit: parts.iter().all(|m| m.bit),
            val: parts.iter().all(|m| m.val),
            ea: 0.0,
            er: 0.0,
            acc: parts.iter().any(|m| m.acc),
            coarse: parts.iter().any(|m| m.coarse),
        }
    }

    /// Marks the value approximate, with the given error terms, from an op computed in `d`.
    fn approx(mut self, d: DType, ea: f64, er: f64) -> Meta {
        self.bit = false;
        self.val = false;
        self.ea = ea;
        self.er = er;
        self.coarse |= d == DType::F32;
        self
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in [{:.3e}, {:.3e}]", self.lo, self.hi)?;
        if self.special {
            write!(f, " + nan/inf")?;
        }
        if self.bit {
            write!(f, ", bit-exact")
        } else if self.val {
            write!(f, ", exact up to the sign of zero")
        } else {
            write!(f, ", approx (abs {:.1e}, rel {:.1e})", self.ea, self.er)
        }
    }
}

/// dtype, shape and value class of one value.
#[derive(Clone, PartialEq)]
struct Info {
    dtype: DType,
    dims: Vec<usize>,
    meta: Meta,
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}{}, {:?}", self.dtype, list(&self.dims), self.meta)
    }
}

/// Unit roundoff-ish: one ulp at 1.0.
fn ulp(d: DType) -> f64 {
    match d {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => f32::EPSILON as f64,
    }
}

/// The tolerance a value is compared with.
fn tolerance(dtype: DType, m: &Meta) -> Tol {
    if !dtype.is_float() || m.bit {
        return tol(dtype, Kind::Exact);
    }
    // An f16 value is held to f16's tolerance whatever its history (it is the coarsest class).
    let class = if m.coarse && dtype != DType::F16 { DType::F32 } else { dtype };
    tol(class, if m.acc { Kind::Accumulate } else { Kind::Elementwise })
}

/// Whether the estimated difference stays within half the tolerance.
fn fits(dtype: DType, m: &Meta) -> bool {
    if !dtype.is_float() || m.val {
        return m.val;
    }
    let t = tolerance(dtype, m);
    m.ea <= t.abs / 2.0 && m.er <= t.rel / 2.0 && m.mag() < 1e6
}

/// `m` stored in float dtype `d`: bounds past the largest finite value round to an infinity there (an exact u32
/// of 4e9 cast to f16 is inf, and inf times 0 is NaN), so such a value may hold one, and its finite elements lie
/// within the finite range.
fn overflowed(d: DType, mut m: Meta) -> Meta {
    let max = match d {
        DType::F16 => 65504.0,
        DType::BF16 => f64::from(f32::from_bits(0x7f7f_0000)),
        DType::F32 => f64::from(f32::MAX),
        _ => return m,
    };
    if m.mag() > max {
        m.special = true;
        m.lo = m.lo.max(-max);
        m.hi = m.hi.min(max);
    }
    m
}

fn int_range(d: DType) -> (f64, f64) {
    match d {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (0.0, 255.0),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    }
}

/// Bounds of an int value that may have wrapped (bool: `x != 0`).
fn wrap(d: DType, lo: f64, hi: f64) -> (f64, f64) {
    let (a, b) = int_range(d);
    if lo >= a && hi <= b { (lo, hi) } else { (a, b) }
}

fn corners(pairs: &[f64]) -> (f64, f64) {
    let lo = pairs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = pairs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// The value class of `m` converted to `to` (from `from`), or `None` if that is ill-conditioned.
fn cast_meta(from: DType, to: DType, m: &Meta) -> Option<Meta> {
    if from == to {
        return Some(*m);
    }
    if to.is_float() {
        // The interpreter converts ints to floats through f64, which rounds twice above 2^53 (1 ulp off for f32):
        // a known defect of the reference (reported), so such conversions are not generated.
        if !from.is_float() && to == DType::F32 && m.mag() >= 2f64.powi(53) {
            return None;
        }
        let mut out = *m;
        // Narrowing an approximate value: the two sides may round it differently.
        if from.is_float() && to.size_of() < from.size_of() && !m.val {
            out = out.approx(to, m.ea, m.er + ulp(to) / 2.0);
        }
        return Some(out);
    }
    // To an int or bool: the values must be the same on both sides (a rounding difference could cross an integer).
    if !m.val {
        return None;
    }
    let (lo, hi) = if to == DType::Bool {
        (0.0, 1.0)
    } else if m.special {
        int_range(to)
    } else {
        wrap(to, m.lo.trunc(), m.hi.trunc())
    };
    Some(Meta { acc: m.acc, ..Meta::exact(lo, hi, false) })
}

/// The value class of an elementwise binary op computed in `d` (operands already converted to `d`).
fn binary_meta(op: Bin, d: DType, a: &Meta, b: &Meta) -> Option<Meta> {
    let u = ulp(d) / 2.0;
    if op.is_comparison() {
        // A comparison of approximate values could flip.
        return (a.val && b.val).then(|| Meta { acc: a.acc || b.acc, ..Meta::exact(0.0, 1.0, false) });
    }
    if !d.is_float() {
        let (lo, hi) = match op {
            _ if d == DType::Bool => (0.0, 1.0),
            Bin::Add => (a.lo + b.lo, a.hi + b.hi),
            Bin::Sub => (a.lo - b.hi, a.hi - b.lo),
            Bin::Mul => corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]),
            Bin::Maximum => (a.lo.max(b.lo), a.hi.max(b.hi)),
            Bin::Minimum => (a.lo.min(b.lo), a.hi.min(b.hi)),
            Bin::Pow if b.hi < 0.0 => (-1.0, 1.0),
            Bin::Pow => {
                let m = a.mag().max(1.0).powf(b.hi.max(0.0));
                (-m, m)
            }
            _ => unreachable!("{op:?} on {d}"),
        };
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta::joined(&[a, b], lo, hi));
    }
    let (ma, mb) = (a.mag(), b.mag());
    let same_sign = |x: &Meta, y: &Meta| (x.lo >= 0.0 && y.lo >= 0.0) || (x.hi <= 0.0 && y.hi <= 0.0);
    // inf or NaN times (or over) a value that may differ slightly near zero could change sign or become NaN.
    let special_hazard = (a.special && !b.val) || (b.special && !a.val);
    let m = match op {
        Bin::Add | Bin::Sub => {
            let nb = if op == Bin::Sub { Meta { lo: -b.hi, hi: -b.lo, ..*b } } else { *b };
            let j = Meta::joined(&[a, &nb], a.lo + nb.lo, a.hi + nb.hi);
            if let Some(r) = loose_rounding(d) {
                // The driver may reassociate a fused chain of sums: off by an ulp of the largest operand.
                j.approx(d, a.abs_err() + nb.abs_err() + r * ma.max(mb), r)
            } else if j.val {
                j
            } else if same_sign(a, &nb) {
                j.approx(d, a.ea + nb.ea, a.er.max(nb.er) + u)
            } else {
                j.approx(d, a.abs_err() + nb.abs_err(), u)
            }
        }
        Bin::Mul => {
            if special_hazard {
                return None;
            }
            let (lo, hi) = corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]);
            let j = Meta::joined(&[a, b], lo, hi);
            if j.val && loose_rounding(d).is_none() {
                j
            } else {
                j.approx(d, a.ea * mb + b.ea * ma + a.ea * b.ea, a.er + b.er + loose_rounding(d).unwrap_or(u))
            }
        }
        Bin::Div => {
            if special_hazard && !b.special {
                return None;
            }
            let bmin = b.min_abs();
            if bmin > 0.0 {
                let (lo, hi) = corners(&[a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]);
                let j = Meta::joined(&[a, b], lo, hi);
                match loose_rounding(d) {
                    Some(r) => j.approx(d, a.ea / bmin, a.er + b.er + b.ea / bmin + r),
                    None if j.bit => j,
                    None => j.approx(d, a.ea / bmin, a.er + b.er + b.ea / bmin + u),
                }
            } else if a.bit && b.bit && loose_rounding(d).is_none() {
                // x / 0 is +-inf or NaN on both sides; the quotient of tiny divisors is unbounded.
                let mut j = Meta::joined(&[a, b], -1e30, 1e30);
                j.special = true;
                j
            } else {
                return None;
            }
        }
        Bin::Maximum | Bin::Minimum => {
            let (lo, hi) =
                if op == Bin::Maximum { (a.lo.max(b.lo), a.hi.max(b.hi)) } else { (a.lo.min(b.lo), a.hi.min(b.hi)) };
            let mut j = Meta::joined(&[a, b], lo, hi);
            // max(-0.0, 0.0) may give either zero.
            j.bit = false;
            if j.val { j } else { j.approx(d, a.ea.max(b.ea), a.er.max(b.er)) }
        }
        Bin::Pow => {
            if special_hazard {
                return None;
            }
            let e = b.mag();
            if a.lo > 0.0 {
                let (l1, l2) = (a.lo.ln(), a.hi.ln());
                let (lo, hi) = corners(&[b.lo * l1, b.lo * l2, b.hi * l1, b.hi * l2]);
                let j = Meta::joined(&[a, b], lo.exp(), hi.exp());
                let er_base = if a.val { 0.0 } else { e * (a.er + a.ea / a.lo) };
                let er_exp = if b.val { 0.0 } else { l1.abs().max(l2.abs()) * b.abs_err() };
                j.approx(d, 0.0, er_base + er_exp + 2.0 * ulp(d))
            } else if a.bit && b.bit {
                let big = if b.lo < 0.0 { 1e30 } else { ma.max(1.0).powf(e) };
                let mut j = Meta::joined(&[a, b], -big, big).approx(d, 0.0, 2.0 * ulp(d));
                // 0 ** negative is inf and a negative base to a fractional power is NaN.
                j.special = true;
                if !fits(d, &j) {
                    return None;
                }
                j
            } else {
                return None;
            }
        }
        _ => unreachable!("{op:?}"),
    };
    Some(m)
}

/// The value class of a float unary function applied to `a` in `d`, or `None` if ill-conditioned there.
fn unary_meta(u: Un, d: DType, a: &Meta) -> Option<Meta> {
    let h = ulp(d) / 2.0;
    let j = |lo: f64, hi: f64| Meta { lo, hi, ..*a };
    let abs_in = a.abs_err();
    let m = match u {
        Un::Neg => j(-a.hi, -a.lo),
        Un::Abs => {
            let (lo, hi) = if a.lo >= 0.0 { (a.lo, a.hi) } else { (a.min_abs(), a.mag()) };
            j(lo, hi)
        }
        Un::Exp => {
            if a.hi > 12.0 {
                return None;
            }
            j(a.lo.max(-200.0).exp(), a.hi.exp()).approx(d, 0.0, abs_in + ulp(d))
        }
        Un::Log => {
            if a.lo > 0.0 {
                j(a.lo.ln(), a.hi.ln()).approx(d, if a.val { 0.0 } else { a.ea / a.lo + a.er }, ulp(d))
            } else if a.val {
                // log(0) = -inf and log(x < 0) = NaN on both sides; tiny positives give large negatives.
                let mut m = j(-104.0, a.hi.max(1e-30).ln().max(-104.0)).approx(d, 0.0, ulp(d));
                m.special = true;
                m
            } else {
                return None;
            }
        }
        Un::Sin | Un::Cos => {
            if a.mag() > 1e4 {
                return None;
            }
            j(-1.0, 1.0).approx(d, abs_in + wgsl_trig_abs(), 3.0 * ulp(d))
        }
        Un::Tanh => j(a.lo.tanh(), a.hi.tanh()).approx(d, abs_in, 2.0 * ulp(d)),
        Un::Sigmoid => {
            let s = |x: f64| 1.0 / (1.0 + (-x).exp());
            j(s(a.lo), s(a.hi)).approx(d, abs_in / 4.0, 3.0 * ulp(d))
        }
        Un::Sqrt => {
            if a.lo > 0.0 {
                let m = j(a.lo.sqrt(), a.hi.sqrt());
                match loose_rounding(d) {
                    Some(r) => m.approx(d, a.ea / (2.0 * a.lo.sqrt()), a.er / 2.0 + r),
                    None if a.bit => m,
                    None => m.approx(d, a.ea / (2.0 * a.lo.sqrt()), a.er / 2.0 + h),
                }
            } else if a.bit && loose_rounding(d).is_none() {
                let mut m = j(0.0, a.hi.max(0.0).sqrt());
                m.special |= a.lo < 0.0;
                m
            } else {
                return None;
            }
        }
        Un::Recip | Un::Rsqrt => {
            let base = if u == Un::Rsqrt { unary_meta(Un::Sqrt, d, a)? } else { *a };
            let bmin = base.min_abs();
            if bmin > 0.0 {
                let (lo, hi) = corners(&[1.0 / base.lo, 1.0 / base.hi]);
                let m = Meta { lo, hi, ..base };
                match loose_rounding(d) {
                    Some(r) => m.approx(d, 0.0, base.er + base.ea / bmin + r),
                    None if base.bit => m,
                    None => m.approx(d, 0.0, base.er + base.ea / bmin + h),
                }
            } else if base.bit && loose_rounding(d).is_none() {
                let mut m = Meta { lo: -1e30, hi: 1e30, ..base };
                m.special = true;
                m
            } else {
                return None;
            }
        }
        // Monotone, exact, but discontinuous: equal inputs give equal outputs, an input off by an ulp may not.
        Un::Floor | Un::Ceil | Un::Round | Un::Trunc => {
            if !a.val {
                return None;
            }
            let f = |x: f64| match u {
                Un::Floor => x.floor(),
                Un::Ceil => x.ceil(),
                Un::Round => x.round_ties_even(),
                _ => x.trunc(),
            };
            j(f(a.lo), f(a.hi))
        }
        Un::Relu | Un::Square | Un::LogicalNot => unreachable!("composite {u:?}"),
    };
    Some(m)
}

// ---------------------------------------------------------------------------------------------------------------
// Decoding raw numbers into a program
// ---------------------------------------------------------------------------------------------------------------

/// One raw step: a selector and five parameters. Small numbers decode to simple steps, so shrinking simplifies.
type Raw = (u8, [u16; 5]);

const DIMS: [usize; 16] = [1, 2, 3, 4, 5, 7, 9, 1, 2, 8, 0, 3, 13, 6, 17, 11];
const DTYPES: [DType; 11] = [
    DType::F32,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
    DType::F32,
    DType::U32,
    DType::F16,
    DType::BF16,
];
const MAX_NUMEL: usize = 256;

fn float_sc(r: u16) -> Sc {
    Sc::F([1.0, 2.0, 0.5, -1.5, 0.0, -0.25, 3.0, -0.0][r as usize % 8])
}

fn int_sc(r: u16) -> Sc {
    Sc::I([1, 2, -1, 3, 0, 7, -4, 200][r as usize % 8])
}

/// The dims encoded in `r` (4 bits per dim), at most `MAX_NUMEL` elements.
fn dims_from(rank: usize, r: u16) -> Vec<usize> {
    let mut dims: Vec<usize> = (0..rank).map(|i| DIMS[(r as usize >> (4 * i)) & 15]).collect();
    while dims.iter().product::<usize>() > MAX_NUMEL {
        let i = (0..rank).max_by_key(|&i| dims[i]).expect("a dim");
        dims[i] /= 2;
    }
    dims
}

struct Var {
    dtype: DType,
    dims: Vec<usize>,
    meta: Meta,
    /// Holds a buffer when the program runs (a realized input, or realized by a `Realize` step).
    realized: bool,
}

struct Decoder {
    steps: Vec<Step>,
    /// The current state of each step's value (`None` for `Realize` steps).
    vars: Vec<Option<Var>>,
    /// Per step: the value's class when it was defined, or for `Realize`, when it was realized.
    infos: Vec<Info>,
}

impl Decoder {
    fn var(&self, v: usize) -> &Var {
        self.vars[v].as_ref().expect("a value")
    }

    fn push(&mut self, step: Step, dtype: DType, dims: Vec<usize>, meta: Meta) -> usize {
        debug_assert!(fits(dtype, &meta), "generator admitted {} with {meta:?}", step.code());
        let meta = overflowed(dtype, meta);
        let realized = matches!(step, Step::Input { .. });
        self.steps.push(step);
        self.infos.push(Info { dtype, dims: dims.clone(), meta });
        self.vars.push(Some(Var { dtype, dims, meta, realized }));
        self.vars.len() - 1
    }

    /// The `r`-th most recent value satisfying `ok`.
    fn pick(&self, r: u16, ok: impl Fn(&Var) -> bool) -> Option<usize> {
        let cands: Vec<usize> =
            (0..self.vars.len()).rev().filter(|&i| self.vars[i].as_ref().is_some_and(&ok)).collect();
        // Mostly one of the three most recent (long chains fuse into deep kernels), sometimes any.
        let r = r as usize;
        let i = if r.is_multiple_of(4) { (r / 4) % cands.len().max(1) } else { (r / 4) % cands.len().clamp(1, 3) };
        (!cands.is_empty()).then(|| cands[i])
    }

    /// Realizes `v` (checked first), so that later steps read it as an input: exact on both sides.
    fn realize(&mut self, v: usize) {
        let var = self.vars[v].as_mut().expect("a value");
        if var.realized {
            return;
        }
        let info = Info { dtype: var.dtype, dims: var.dims.clone(), meta: var.meta };
        var.realized = true;
        var.meta = Meta { bit: true, val: true, ea: 0.0, er: 0.0, acc: false, coarse: false, ..var.meta };
        self.steps.push(Step::Realize(v));
        self.infos.push(info);
        self.vars.push(None);
    }

    /// Realizes `v` if the JIT may differ from the reference on it.
    fn settle(&mut self, v: usize) {
        if !self.var(v).meta.bit {
            self.realize(v);
        }
    }

    /// A new leaf of `dtype` and `dims`; `r` picks a realized input or a lazy leaf, `s` the values.
    fn leaf(&mut self, dtype: DType, dims: Vec<usize>, r: u16, s: u16) -> usize {
        let numel: usize = dims.iter().product();
        let value = match dtype {
            DType::Bool => Sc::B(s % 2 == 1),
            d if d.is_float() => float_sc(s),
            _ => int_sc(s),
        };
        let konst = Meta::exact(stored(dtype, value), stored(dtype, value), false);
        match r % 16 {
            10 => self.push(Step::Full { dtype, dims: dims.clone(), value }, dtype, dims, konst),
            11 if dtype.is_float() => {
                let normal = s % 2 == 1;
                // Box-Muller from 32-bit uniforms stays within 6.7 sigma.
                let meta = if normal { Meta::exact(-7.0, 7.0, false) } else { Meta::exact(0.0, 1.0, false) };
                self.push(Step::Rand { dtype, dims: dims.clone(), normal }, dtype, dims, meta)
            }
            12 if dtype == DType::I64 => {
                let meta = Meta::exact(0.0, numel.max(1) as f64 - 1.0, false);
                self.push(Step::Arange { n: numel, dims: dims.clone() }, dtype, dims, meta)
            }
            13 if dims.is_empty() => self.push(Step::Scalar { dtype, value }, dtype, dims, konst),
            k => {
                let data = match (dtype.is_float(), k % 5) {
                    (true, 0 | 1) => Data::Cont(-2.0, 2.0),
                    (true, 2) => Data::Grid(-2.0, 2.0),
                    (true, 3) => Data::Cont(0.25, 2.0),
                    (true, _) => Data::Specials,
                    (false, 4) if dtype == DType::U8 => Data::Cont(0.0, 255.0),
                    // Large u32 values: wrapping arithmetic, unsigned compares and conversions above 2^31.
                    (false, 4) if dtype == DType::U32 => Data::Cont(0.0, 4_294_967_295.0),
                    (false, 3) => Data::Cont(0.0, 9.0),
                    (false, _) => Data::Cont(-5.0, 5.0),
                };
                let meta = match (data, dtype) {
                    (Data::Specials, _) => Meta::exact(-2.0, 2.0, true),
                    (_, DType::Bool) => Meta::exact(0.0, 1.0, false),
                    (Data::Cont(a, b) | Data::Grid(a, b), DType::U8 | DType::U32) => Meta::exact(a.max(0.0), b, false),
                    (Data::Cont(a, b) | Data::Grid(a, b), _) => Meta::exact(a, b, false),
                };
                self.push(Step::Input { dtype, dims: dims.clone(), data, seed: s as u64 }, dtype, dims, meta)
            }
        }
    }

    /// A leaf whose shape broadcasts with `dims`: some dims set to 1, some leading dims dropped, and dims of 1
    /// in `dims` maybe stretched.
    fn leaf_like(&mut self, dims: &[usize], dtype: DType, p: [u16; 3]) -> usize {
        let drop = if dims.is_empty() { 0 } else { p[0] as usize % (dims.len() + 1) };
        let mut out: Vec<usize> = Vec::new();
        for (i, &d) in dims.iter().enumerate().skip(drop) {
            let bits = (p[1] as usize >> (2 * i)) & 3;
            out.push(match bits {
                1 => 1,
                2 if d == 1 => DIMS[(p[0] as usize >> 4) % 16],
                _ => d,
            });
        }
        if out.iter().product::<usize>() > MAX_NUMEL {
            out.iter_mut().for_each(|d| *d = (*d).min(1));
        }
        self.leaf(dtype, out, p[2], p[0] >> 8)
    }

    /// Decodes one raw step. Steps that would be invalid or ill-conditioned decode to nothing.
    fn step(&mut self, (sel, p): Raw) {
        const KINDS: [(u8, u32); 25] = [
            (0, 5),  // leaf
            (1, 14), // unary
            (2, 8),  // binary with a Rust scalar
            (3, 12), // binary with a tensor
            (4, 3),  // scalar - v, scalar / v
            (5, 6),  // comparison
            (6, 5),  // where_
            (7, 6),  // cast
            (8, 10), // reduction
            (9, 3),  // argmax / argmin
            (10, 6), // reshape
            (11, 5), // permute / transpose
            (12, 4), // expand / broadcast_to
            (13, 5), // slice
            (14, 2), // narrow
            (15, 3), // flip
            (16, 4), // pad
            (17, 4), // cat / stack
            (18, 3), // unsqueeze
            (19, 3), // squeeze
            (20, 2), // contiguous
            (21, 7), // matmul
            (22, 4), // softmax / log_softmax
            (23, 3), // realize
            (24, 3), // unfold
        ];
        let total: u32 = KINDS.iter().map(|k| k.1).sum();
        let mut r = sel as u32 % total;
        let kind = KINDS
            .iter()
            .find(|k| {
                r < k.1 || {
                    r -= k.1;
                    false
                }
            })
            .expect("a kind")
            .0;
        match kind {
            0 => {
                let dtype = DTYPES[p[0] as usize % DTYPES.len()];
                let rank = [1, 2, 0, 3, 4][p[1] as usize % 5];
                self.leaf(dtype, dims_from(rank, p[2]), p[3], p[4]);
            }
            1 => self.unary(p),
            2 => self.binary_scalar(p),
            3 => self.binary_tensor(p),
            4 => self.reversed(p),
            5 => self.comparison(p),
            6 => self.where_(p),
            7 => self.cast(p),
            8 => self.reduce(p),
            9 => self.arg(p),
            10 => self.reshape(p),
            11 => self.permute(p),
            12 => self.expand(p),
            13 => self.slice(p),
            14 => self.narrow(p),
            24 => self.unfold(p),
            15 => self.flip(p),
            16 => self.pad(p),
            17 => self.cat(p),
            18 => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let r = self.var(v).dims.len() as isize;
                let d = (p[1] as isize % (2 * r + 2)) - (r + 1);
                let mut dims = self.var(v).dims.clone();
                dims.insert(if d < 0 { (d + r + 1) as usize } else { d as usize }, 1);
                let (dtype, meta) = (self.var(v).dtype, self.var(v).meta);
                self.push(Step::Unsqueeze(v, d), dtype, dims, meta);
            }
            19 => {
                let Some(v) = self.pick(p[0], |x| x.dims.contains(&1)) else { return };
                let x = self.var(v);
                let r = x.dims.len();
                // Some dims of size 1 (at least one) and maybe others, which squeeze leaves alone.
                let mut axes: Vec<usize> = (0..r).filter(|&a| (p[1] >> a) & 1 == 1).collect();
                let ones: Vec<usize> = (0..r).filter(|&a| x.dims[a] == 1).collect();
                if !axes.iter().any(|a| ones.contains(a)) {
                    axes.push(ones[p[2] as usize % ones.len()]);
                }
                axes.sort_unstable();
                axes.dedup();
                let dims: Vec<usize> =
                    (0..r).filter(|a| !(x.dims[*a] == 1 && axes.contains(a))).map(|a| x.dims[a]).collect();
                let spec: Vec<isize> = axes
                    .iter()
                    .map(|&a| if (p[3] >> a) & 1 == 1 { a as isize - r as isize } else { a as isize })
                    .collect();
                let (dtype, meta) = (x.dtype, x.meta);
                self.push(Step::Squeeze(v, spec), dtype, dims, meta);
            }
            20 => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let x = self.var(v);
                let (dtype, dims, meta) = (x.dtype, x.dims.clone(), x.meta);
                self.push(Step::Contiguous(v), dtype, dims, meta);
            }
            21 => self.matmul(p),
            22 => self.softmax(p),
            _ => {
                if let Some(v) = self.pick(p[0], |x| !x.realized) {
                    self.realize(v);
                }
            }
        }
    }

    /// `x.abs() + 1.0`: the safe operand for log, sqrt and division when `x` is approximate (float `x` only;
    /// `None` if the sum would not be admissible).
    fn safe(&mut self, v: usize) -> Option<usize> {
        let x = self.var(v);
        let (dtype, dims) = (x.dtype, x.dims.clone());
        let abs = unary_meta(Un::Abs, dtype, &x.meta)?;
        let sum = binary_meta(Bin::Add, dtype, &abs, &Meta::exact(1.0, 1.0, false))?;
        if !dtype.is_float() || !fits(dtype, &sum) {
            return None;
        }
        let a = self.push(Step::Unary(Un::Abs, v), dtype, dims.clone(), abs);
        Some(self.push(Step::Binary(Bin::Add, a, Rhs::Sc(Sc::F(1.0))), dtype, dims, sum))
    }

    fn unary(&mut self, p: [u16; 5]) {
        const OPS: [Un; 18] = [
            Un::Exp,
            Un::Neg,
            Un::Tanh,
            Un::Abs,
            Un::Log,
            Un::Sin,
            Un::Cos,
            Un::Sqrt,
            Un::Recip,
            Un::Rsqrt,
            Un::Sigmoid,
            Un::Relu,
            Un::Square,
            Un::LogicalNot,
            Un::Floor,
            Un::Ceil,
            Un::Round,
            Un::Trunc,
        ];
        let v = self.pick(p[0], |_| true).expect("a value");
        let mut u = OPS[p[1] as usize % OPS.len()];
        let (dtype, dims) = (self.var(v).dtype, self.var(v).dims.clone());
        if dtype == DType::Bool && matches!(u, Un::Neg | Un::Abs | Un::Relu) {
            u = Un::LogicalNot; // neg and relu reject bool; abs of bool is the identity (the same tensor)
        }
        match u {
            Un::LogicalNot => {
                if !self.var(v).meta.val {
                    self.realize(v);
                }
                let meta = Meta { acc: self.var(v).meta.acc, ..Meta::exact(0.0, 1.0, false) };
                self.push(Step::Unary(u, v), DType::Bool, dims, meta);
            }
            Un::Relu => {
                let m = binary_meta(Bin::Maximum, dtype, &self.var(v).meta, &Meta::exact(0.0, 0.0, false));
                if let Some(m) = m.filter(|m| fits(dtype, m)) {
                    self.push(Step::Unary(u, v), dtype, dims, m);
                }
            }
            Un::Square if dtype == DType::Bool => {
                self.push(Step::Unary(u, v), DType::I64, dims, Meta::exact(0.0, 1.0, false));
            }
            Un::Square => {
                let x = self.var(v).meta;
                let m = binary_meta(Bin::Mul, dtype, &x, &x).map(|m| Meta { lo: m.lo.max(0.0), ..m });
                match m.filter(|m| fits(dtype, m)) {
                    Some(m) => {
                        self.push(Step::Unary(u, v), dtype, dims, m);
                    }
                    None => self.realize(v),
                }
            }
            // An integer or bool tensor is integral already: the op returns it unchanged.
            Un::Floor | Un::Ceil | Un::Round | Un::Trunc if !dtype.is_float() => {
                let x = self.var(v).meta;
                self.push(Step::Unary(u, v), dtype, dims, x);
            }
            Un::Neg | Un::Abs if !dtype.is_float() => {
                let x = self.var(v).meta;
                let (lo, hi) = if u == Un::Neg { (-x.hi, -x.lo) } else { (x.min_abs(), x.mag()) };
                let (lo, hi) = wrap(dtype, lo, hi);
                self.push(Step::Unary(u, v), dtype, dims, Meta { lo, hi, ..x });
            }
            _ => {
                let fd = if dtype.is_float() { dtype } else { DType::F32 };
                let mut v = v;
                let mut m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                if m.is_none()
                    && matches!(u, Un::Log | Un::Sqrt | Un::Recip | Un::Rsqrt)
                    && p[2].is_multiple_of(2)
                    && let Some(w) = self.safe(v)
                {
                    v = w;
                    m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                }
                if m.is_none() {
                    self.settle(v);
                    m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                }
                if let Some(m) = m {
                    let dims = self.var(v).dims.clone();
                    self.push(Step::Unary(u, v), fd, dims, m);
                }
            }
        }
    }

    /// Pushes `op` of `a` and `b` if its value class is admissible, realizing approximate operands if needed.
    fn arith(&mut self, op: Bin, a: usize, rhs: Rhs, p: u16) -> Option<usize> {
        let (prio_a, da) = (priority(&self.var(a).dims), self.var(a).dtype);
        let (db, prio_b, dims_b) = match rhs {
            Rhs::Var(b) => (self.var(b).dtype, priority(&self.var(b).dims), self.var(b).dims.clone()),
            Rhs::Sc(s) => (s.natural(), Priority::Scalar, Vec::new()),
        };
        let mut d = result_type(&[(da, prio_a), (db, prio_b)]);
        if matches!(op, Bin::LogicalAnd | Bin::LogicalOr) {
            d = DType::Bool;
        }
        if op == Bin::Div && !d.is_float() {
            d = DType::F32;
        }
        if d == DType::Bool && matches!(op, Bin::Sub | Bin::Pow | Bin::Div) {
            return None;
        }
        let dims = common::broadcast_shape(&self.var(a).dims, &dims_b)?;
        if dims.iter().product::<usize>() > 4 * MAX_NUMEL {
            return None;
        }
        let out = if op.is_comparison() { DType::Bool } else { d };
        let meta = |s: &Self| -> Option<Meta> {
            let ma = cast_meta(da, d, &s.var(a).meta)?;
            let mb = match rhs {
                Rhs::Var(b) => cast_meta(db, d, &s.var(b).meta)?,
                Rhs::Sc(sc) => Meta::exact(stored(d, sc), stored(d, sc), stored(d, sc).is_nan()),
            };
            binary_meta(op, d, &ma, &mb).filter(|m| fits(out, m))
        };
        let m = match meta(self) {
            Some(m) => m,
            None if !p.is_multiple_of(4) => {
                self.settle(a);
                if let Rhs::Var(b) = rhs {
                    self.settle(b);
                }
                meta(self)?
            }
            None => return None,
        };
        Some(self.push(Step::Binary(op, a, rhs), out, dims, m))
    }

    fn binary_scalar(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 7] = [Bin::Add, Bin::Mul, Bin::Sub, Bin::Div, Bin::Maximum, Bin::Minimum, Bin::Pow];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let s = match (op, p[2] % 3) {
            (Bin::Pow, _) if self.var(v).dtype.is_float() => Sc::F([2.0, 0.5, -1.0, 3.0, 0.0, 1.5][p[3] as usize % 6]),
            (Bin::Pow, _) => Sc::I([2, 3, 0, -1, 1][p[3] as usize % 5]),
            (_, 0) => float_sc(p[3]),
            (_, 1) => int_sc(p[3]),
            _ => Sc::B(p[3] % 2 == 1),
        };
        if self.arith(op, v, Rhs::Sc(s), p[4]).is_none() && op != Bin::Add {
            self.arith(Bin::Add, v, Rhs::Sc(s), p[4]);
        }
    }

    /// A second operand for `v`: an earlier value whose shape broadcasts with it, or a new leaf.
    fn partner(&mut self, v: usize, p: [u16; 3], same_dtype: bool) -> usize {
        let (dims, dtype) = (self.var(v).dims.clone(), self.var(v).dtype);
        let dt = if same_dtype || !p[2].is_multiple_of(3) { dtype } else { DTYPES[(p[2] as usize / 3) % DTYPES.len()] };
        match p[0] % 4 {
            0 | 1 => {
                let found = self.pick(p[1], |x| {
                    common::broadcast_shape(&dims, &x.dims).is_some_and(|b| b.iter().product::<usize>() <= MAX_NUMEL)
                        && (!same_dtype || x.dtype == dtype)
                });
                found.unwrap_or_else(|| self.leaf_like(&dims, dt, [p[1], p[2], p[0] >> 2]))
            }
            2 => self.leaf_like(&dims, dt, [p[1], p[2], p[0] >> 2]),
            _ => self.leaf(dt, Vec::new(), p[1], p[2]),
        }
    }

    fn binary_tensor(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 7] = [Bin::Add, Bin::Mul, Bin::Sub, Bin::Maximum, Bin::Div, Bin::Minimum, Bin::Pow];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let w = self.partner(v, [p[2], p[3], p[4]], false);
        if op == Bin::Pow && self.var(v).dtype.is_float() && self.var(w).meta.mag() > 3.0 {
            return;
        }
        if self.arith(op, v, Rhs::Var(w), p[4]).is_none() && op != Bin::Add {
            self.arith(Bin::Add, v, Rhs::Var(w), p[4]);
        }
    }

    fn reversed(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dtype != DType::Bool) else { return };
        let op = if p[1].is_multiple_of(2) { Bin::Sub } else { Bin::Div };
        let s = if p[2].is_multiple_of(2) { float_sc(p[3]) } else { int_sc(p[3]) };
        let x = self.var(v);
        let (prio, dx, dims) = (priority(&x.dims), x.dtype, x.dims.clone());
        let mut d = result_type(&[(s.natural(), Priority::Scalar), (dx, prio)]);
        if op == Bin::Div && !d.is_float() {
            d = DType::F32;
        }
        let meta = |s2: &Self| -> Option<Meta> {
            let mx = cast_meta(dx, d, &s2.var(v).meta)?;
            let ms = Meta::exact(stored(d, s), stored(d, s), false);
            binary_meta(op, d, &ms, &mx).filter(|m| fits(d, m))
        };
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Reversed(op, s, v), d, dims, m);
        }
    }

    fn comparison(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 8] = [Bin::Lt, Bin::Eq, Bin::Ge, Bin::Ne, Bin::Le, Bin::Gt, Bin::LogicalAnd, Bin::LogicalOr];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let rhs = if p[2].is_multiple_of(3) {
            let d = self.var(v).dtype;
            Rhs::Sc(if d.is_float() { float_sc(p[3]) } else { int_sc(p[3]) })
        } else {
            Rhs::Var(self.partner(v, [p[2] / 3, p[3], p[4]], false))
        };
        self.settle(v);
        if let Rhs::Var(w) = rhs {
            self.settle(w);
        }
        self.arith(op, v, rhs, 1);
    }

    fn where_(&mut self, p: [u16; 5]) {
        let c = match self.pick(p[0], |x| x.dtype == DType::Bool) {
            Some(c) => c,
            None => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let dims = self.var(v).dims.clone();
                self.leaf(DType::Bool, dims, p[1], p[2])
            }
        };
        let branch = |s: &mut Self, r: u16, q: u16| -> Rhs {
            match r % 4 {
                0 => Rhs::Sc(float_sc(q)),
                1 => Rhs::Sc(int_sc(q)),
                _ => {
                    let dims = s.var(c).dims.clone();
                    let found = s.pick(q, |x| {
                        x.dtype != DType::Bool
                            && common::broadcast_shape(&dims, &x.dims)
                                .is_some_and(|b| b.iter().product::<usize>() <= MAX_NUMEL)
                    });
                    Rhs::Var(found.unwrap_or_else(|| s.leaf_like(&dims, DType::F32, [q, r, q >> 3])))
                }
            }
        };
        let a = branch(self, p[1], p[3]);
        let b = branch(self, p[2], p[4]);
        let key = |s: &Self, r: Rhs| match r {
            Rhs::Var(v) => (s.var(v).dtype, priority(&s.var(v).dims)),
            Rhs::Sc(x) => (x.natural(), Priority::Scalar),
        };
        let (ka, kb) = (key(self, a), key(self, b));
        let d = result_type(&[ka, kb]);
        let dims_of = |s: &Self, r: Rhs| match r {
            Rhs::Var(v) => s.var(v).dims.clone(),
            Rhs::Sc(_) => Vec::new(),
        };
        let Some(dims) = common::broadcast_shape(&self.var(c).dims, &dims_of(self, a))
            .and_then(|x| common::broadcast_shape(&x, &dims_of(self, b)))
        else {
            return;
        };
        let meta_of = |s: &Self, r: Rhs, k: (DType, Priority)| match r {
            Rhs::Var(v) => cast_meta(k.0, d, &s.var(v).meta),
            Rhs::Sc(x) => Some(Meta::exact(stored(d, x), stored(d, x), false)),
        };
        let (Some(ma), Some(mb)) = (meta_of(self, a, ka), meta_of(self, b, kb)) else { return };
        let mut m = Meta::joined(&[&ma, &mb], ma.lo.min(mb.lo), ma.hi.max(mb.hi));
        m.acc |= self.var(c).meta.acc;
        if !m.val {
            m = m.approx(d, ma.ea.max(mb.ea), ma.er.max(mb.er));
            m.coarse = ma.coarse || mb.coarse;
        }
        if fits(d, &m) && dims.iter().product::<usize>() <= 4 * MAX_NUMEL {
            self.push(Step::Where(c, a, b), d, dims, m);
        }
    }

    fn cast(&mut self, p: [u16; 5]) {
        let v = self.pick(p[0], |_| true).expect("a value");
        let from = self.var(v).dtype;
        let mut to = DTYPES[p[1] as usize % DTYPES.len()];
        if to == from {
            to = DTYPES[(p[1] as usize + 3) % DTYPES.len()];
        }
        if to == from {
            return;
        }
        if !to.is_float() {
            self.settle(v);
        }
        if let Some(m) = cast_meta(from, to, &self.var(v).meta).filter(|m| fits(to, m)) {
            let dims = self.var(v).dims.clone();
            self.push(Step::Cast(v, to), to, dims, m);
        }
    }

    fn reduce(&mut self, p: [u16; 5]) {
        const OPS: [Red; 6] = [Red::Sum, Red::Max, Red::Sum, Red::Min, Red::Mean, Red::Prod];
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let (dtype, r) = (x.dtype, x.dims.len());
        let mut op = OPS[p[1] as usize % OPS.len()];
        let all = p[2].is_multiple_of(6);
        let mut axes: Vec<usize> =
            if all { (0..r).collect() } else { (0..r).filter(|&a| (p[3] >> a) & 1 == 1).collect() };
        if axes.is_empty() {
            axes.push(p[3] as usize % r);
        }
        let k: usize = axes.iter().map(|&a| x.dims[a]).product();
        if matches!(op, Red::Max | Red::Min) && k == 0 {
            op = Red::Sum; // max/min of an empty dim panic
        }
        if op == Red::Mean && !dtype.is_float() {
            op = Red::Sum;
        }
        if op == Red::Prod && k > 4 {
            op = Red::Sum;
        }
        let keepdim = p[4].is_multiple_of(2);
        let spec: Vec<isize> = if all {
            Vec::new()
        } else {
            axes.iter()
                .map(|&a| if (p[4] >> (a + 1)) & 1 == 1 { a as isize - r as isize } else { a as isize })
                .collect()
        };
        let dims: Vec<usize> = (0..r)
            .filter_map(|a| match (axes.contains(&a), keepdim) {
                (false, _) => Some(x.dims[a]),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        let out = match op {
            Red::Sum | Red::Prod if !dtype.is_float() => DType::I64,
            _ => dtype,
        };
        let meta = |s: &Self| reduce_meta(op, out, &cast_meta(dtype, out, &s.var(v).meta)?, k).filter(|m| fits(out, m));
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Reduce(op, v, spec, keepdim), out, dims, m);
        }
    }

    fn arg(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d > 0) && !x.dims.contains(&0)) else { return };
        let r = self.var(v).dims.len();
        let a = p[1] as usize % r;
        let n = self.var(v).dims[a];
        let dim = if p[2] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let keepdim = p[3].is_multiple_of(2);
        self.settle(v);
        let x = self.var(v);
        let mut dims = x.dims.clone();
        if keepdim {
            dims[a] = 1;
        } else {
            dims.remove(a);
        }
        let meta = Meta { acc: x.meta.acc, ..Meta::exact(0.0, n as f64 - 1.0, false) };
        self.push(Step::Arg { max: p[4].is_multiple_of(2), v, dim, keepdim }, DType::I64, dims, meta);
    }

    fn reshape(&mut self, p: [u16; 5]) {
        let v = self.pick(p[0], |_| true).expect("a value");
        let x = self.var(v);
        let numel: usize = x.dims.iter().product();
        let mut dims: Vec<usize> = match p[1] % 4 {
            0 => vec![numel],
            _ if numel == 0 => {
                let mut d = vec![DIMS[p[2] as usize % 10] % 4 + 1; 1 + p[3] as usize % 3];
                let i = p[4] as usize % d.len();
                d[i] = 0;
                d
            }
            _ => {
                // Split numel into factors, in a random order, with 1s inserted.
                let mut f = Vec::new();
                let mut n = numel;
                let mut q = 2;
                while n > 1 {
                    while n.is_multiple_of(q) {
                        f.push(q);
                        n /= q;
                    }
                    q += 1;
                }
                let groups = 1 + p[2] as usize % 3;
                let mut d = vec![1usize; groups];
                for (i, x) in f.iter().enumerate() {
                    d[(p[3] as usize >> i) % groups] *= x;
                }
                if p[4].is_multiple_of(3) {
                    d.insert(p[4] as usize % (d.len() + 1), 1);
                }
                d
            }
        };
        if dims == x.dims {
            dims.insert(0, 1);
        }
        let mut spec: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        if numel > 0 && p[4] % 2 == 1 {
            let i = (p[4] as usize >> 1) % spec.len();
            spec[i] = -1;
        }
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Reshape(v, spec), dtype, dims, meta);
    }

    fn permute(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.len() >= 2) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let (dtype, meta) = (x.dtype, x.meta);
        if p[1].is_multiple_of(3) {
            let a = p[2] as usize % r;
            let b = (a + 1 + p[3] as usize % (r - 1)) % r;
            let mut dims = x.dims.clone();
            dims.swap(a, b);
            let b = if p[4] % 2 == 1 { b as isize - r as isize } else { b as isize };
            self.push(Step::Transpose(v, a as isize, b), dtype, dims, meta);
            return;
        }
        // The p[2]-th permutation (Lehmer code), moved off the identity.
        let mut left: Vec<usize> = (0..r).collect();
        let mut perm = Vec::with_capacity(r);
        let mut code = p[2] as usize;
        for i in (1..=r).rev() {
            perm.push(left.remove(code % i));
            code /= i;
        }
        if perm.iter().enumerate().all(|(i, &q)| i == q) {
            perm.swap(0, r - 1);
        }
        let dims: Vec<usize> = perm.iter().map(|&q| x.dims[q]).collect();
        let spec: Vec<isize> = perm
            .iter()
            .enumerate()
            .map(|(i, &q)| if (p[3] >> i) & 1 == 1 { q as isize - r as isize } else { q as isize })
            .collect();
        self.push(Step::Permute(v, spec), dtype, dims, meta);
    }

    fn expand(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.len() <= 3) else { return };
        let x = self.var(v);
        let lead = p[1] as usize % 3;
        let mut dims: Vec<usize> = (0..lead).map(|i| DIMS[(p[2] as usize >> (4 * i)) % 10]).collect();
        let mut spec: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        for (i, &d) in x.dims.iter().enumerate() {
            let stretch = d == 1 && (p[3] >> i) & 1 == 1;
            let n = if stretch { DIMS[(p[4] as usize >> (3 * i)) % 16] } else { d };
            dims.push(n);
            spec.push(if !stretch && (p[1] >> (i + 2)) & 1 == 1 { -1 } else { n as i64 });
        }
        if dims == x.dims {
            dims.insert(0, 2);
            spec.insert(0, 2);
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Expand { v, spec, broadcast_to: p[1] % 2 == 1 }, dtype, dims, meta);
    }

    fn slice(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let a = p[1] as usize % r;
        let n = x.dims[a] as isize;
        let mut start = (p[2] as isize % (n + 3)) - 1;
        let end = n + 1 - (p[3] as isize % (n + 3));
        let mut step = 1 + p[4] as usize % 3;
        let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let len = |s: isize, st: usize| {
            let (b, e) = (clamp(s), clamp(end));
            if e > b { ((e - b) as usize).div_ceil(st) } else { 0 }
        };
        if clamp(start) == 0 && len(start, step) == n as usize && step == 1 {
            if n >= 2 {
                step = 2;
            } else {
                start = end; // an empty slice: the only non-identity slice of a dim of size <= 1 with step 1
            }
        }
        let mut dims = x.dims.clone();
        dims[a] = len(start, step);
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Slice { v, dim, start, end, step }, dtype, dims, meta);
    }

    fn narrow(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let a = p[1] as usize % r;
        let n = x.dims[a];
        let start = p[2] as usize % (n + 1);
        let mut len = p[3] as usize % (n - start + 1);
        if start == 0 && len == n {
            len = n.saturating_sub(1);
        }
        let mut dims = x.dims.clone();
        dims[a] = len;
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Narrow { v, dim, start, len }, dtype, dims, meta);
    }

    /// Windows of 1..=3 elements, 1..=3 apart (overlapping, tiling or with gaps), along a dim they fit.
    fn unfold(&mut self, p: [u16; 5]) {
        let size = 1 + p[2] as usize % 3;
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d >= size)) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let fits: Vec<usize> = (0..r).filter(|&a| x.dims[a] >= size).collect();
        let a = fits[p[1] as usize % fits.len()];
        let step = 1 + p[3] as usize % 3;
        let mut dims = x.dims.clone();
        dims[a] = (dims[a] - size) / step + 1;
        dims.push(size);
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Unfold { v, dim, size, step }, dtype, dims, meta);
    }

    fn flip(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d > 1)) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let mut axes: Vec<usize> = (0..r).filter(|&a| (p[1] >> a) & 1 == 1).collect();
        if !axes.iter().any(|&a| x.dims[a] > 1) {
            let big: Vec<usize> = (0..r).filter(|&a| x.dims[a] > 1).collect();
            axes.push(big[p[2] as usize % big.len()]);
        }
        let spec: Vec<isize> =
            axes.iter().map(|&a| if (p[3] >> a) & 1 == 1 { a as isize - r as isize } else { a as isize }).collect();
        let (dtype, dims, meta) = (x.dtype, x.dims.clone(), x.meta);
        self.push(Step::Flip(v, spec), dtype, dims, meta);
    }

    fn pad(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let n = 1 + p[1] as usize % r.min(3);
        let mut pads: Vec<(usize, usize)> =
            (0..n).map(|i| ((p[2] as usize >> (4 * i)) % 3, (p[2] as usize >> (4 * i + 2)) % 3)).collect();
        if pads.iter().all(|&q| q == (0, 0)) {
            pads[0] = (1, 0);
        }
        let mut dims = x.dims.clone();
        for (i, &(b, a)) in pads.iter().enumerate() {
            dims[r - 1 - i] += b + a;
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let value = match x.dtype {
            DType::Bool => Sc::B(p[3] % 2 == 1),
            d if d.is_float() => float_sc(p[3]),
            _ => int_sc(p[3]),
        };
        let s = stored(x.dtype, value);
        let meta = Meta { lo: x.meta.lo.min(s), hi: x.meta.hi.max(s), ..x.meta };
        let dtype = x.dtype;
        self.push(Step::Pad(v, pads, value), dtype, dims, meta);
    }

    fn cat(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let (dims, dtype) = (self.var(v).dims.clone(), self.var(v).dtype);
        let r = dims.len();
        let stack = p[1].is_multiple_of(4);
        let a = p[2] as usize % if stack { r + 1 } else { r };
        let parts_n = 2 + p[3] as usize % 2;
        let mut parts = vec![v];
        for i in 1..parts_n {
            let q = p[4] >> (4 * i);
            if q.is_multiple_of(3) {
                parts.push(v);
                continue;
            }
            let mut d = dims.clone();
            if !stack {
                d[a] = [0, 1, 2, 3, 5][(q as usize / 3) % 5];
            }
            let dt = if q % 5 == 1 { DTYPES[(q as usize / 5) % DTYPES.len()] } else { dtype };
            parts.push(self.leaf(dt, d, q, q >> 2));
        }
        let out_dims = if stack {
            let mut d = dims.clone();
            d.insert(a, parts.len());
            d
        } else {
            let mut d = dims.clone();
            d[a] = parts.iter().map(|&q| self.var(q).dims[a]).sum();
            d
        };
        if out_dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let d = result_type(&parts.iter().map(|&q| (self.var(q).dtype, Priority::Tensor)).collect::<Vec<_>>());
        let metas: Option<Vec<Meta>> =
            parts.iter().map(|&q| cast_meta(self.var(q).dtype, d, &self.var(q).meta)).collect();
        let Some(metas) = metas else { return };
        let refs: Vec<&Meta> = metas.iter().collect();
        let lo = metas.iter().map(|m| m.lo).fold(f64::INFINITY, f64::min);
        let hi = metas.iter().map(|m| m.hi).fold(f64::NEG_INFINITY, f64::max);
        let mut m = Meta::joined(&refs, lo, hi);
        if !m.val {
            let ea = metas.iter().map(|m| m.ea).fold(0.0, f64::max);
            let er = metas.iter().map(|m| m.er).fold(0.0, f64::max);
            m = m.approx(d, ea, er);
            m.coarse = metas.iter().any(|m| m.coarse);
        }
        let dim = if p[4] % 2 == 1 { a as isize - (r + stack as usize) as isize } else { a as isize };
        let step = if stack { Step::Stack(parts, dim) } else { Step::Cat(parts, dim) };
        if fits(d, &m) {
            self.push(step, d, out_dims, m);
        }
    }

    fn matmul(&mut self, p: [u16; 5]) {
        let Some(a) = self.pick(p[0], |x| x.dtype != DType::Bool && (1..=3).contains(&x.dims.len())) else {
            return;
        };
        let ad = self.var(a).dims.clone();
        let ra = ad.len();
        let k = ad[ra - 1];
        if k > 32 {
            return;
        }
        // The right operand: [k], [k, n] or [batch, k, n] with a batch that broadcasts with the left one's.
        let n = DIMS[p[1] as usize % 16];
        let bd: Vec<usize> = match p[2] % 4 {
            0 => vec![k],
            1 => vec![k, n],
            _ => {
                let batch = if ra == 3 && !p[3].is_multiple_of(3) {
                    if p[3].is_multiple_of(2) { ad[0] } else { 1 }
                } else {
                    1 + p[3] as usize % 3
                };
                vec![batch, k, n]
            }
        };
        let dt = if p[4].is_multiple_of(3) { DTYPES[(p[4] as usize / 3) % DTYPES.len()] } else { self.var(a).dtype };
        let found = self.pick(p[3], |x| x.dims == bd);
        let b = match found {
            Some(b) if p[4].is_multiple_of(2) => b,
            _ => self.leaf(dt, bd.clone(), p[3] >> 4, p[4] >> 4),
        };
        let d = result_type(&[(self.var(a).dtype, Priority::Tensor), (self.var(b).dtype, Priority::Tensor)]);
        if d == DType::Bool {
            return;
        }
        let rb = bd.len();
        let a2 = if ra == 1 { vec![1, k] } else { ad.clone() };
        let b2 = if rb == 1 { vec![k, 1] } else { bd.clone() };
        let Some(batch) = common::broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2]) else { return };
        let mut dims = batch;
        if ra > 1 {
            dims.push(a2[a2.len() - 2]);
        }
        if rb > 1 {
            dims.push(b2[b2.len() - 1]);
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let meta = |s: &Self| -> Option<Meta> {
            let ma = cast_meta(s.var(a).dtype, d, &s.var(a).meta)?;
            let mb = cast_meta(s.var(b).dtype, d, &s.var(b).meta)?;
            matmul_meta(d, &ma, &mb, k).filter(|m| fits(d, m))
        };
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(a);
                self.settle(b);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Matmul(a, b), d, dims, m);
        }
    }

    fn softmax(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dtype.is_float() && !x.dims.contains(&0)) else { return };
        let r = self.var(v).dims.len();
        let a = p[1] as usize % r.max(1);
        let k = if r == 0 { 1 } else { self.var(v).dims[a] };
        let dim = if p[2] % 2 == 1 { a as isize - r.max(1) as isize } else { a as isize };
        let log = p[3] % 2 == 1;
        let d = self.var(v).dtype;
        let meta = |s: &Self| softmax_meta(d, &s.var(v).meta, k, log).filter(|m| fits(d, m));
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            let dims = self.var(v).dims.clone();
            self.push(Step::Softmax { v, dim, log }, d, dims, m);
        }
    }
}

fn priority(dims: &[usize]) -> Priority {
    if dims.is_empty() { Priority::ZeroDim } else { Priority::Tensor }
}

/// A Rust scalar as a constant of `d` holds it.
fn stored(d: DType, s: Sc) -> f64 {
    let x = s.scalar();
    match d {
        DType::F16 => kiln::f16::from_f64(x.as_f64()).to_f64(),
        DType::BF16 => kiln_jit::dtype::bf16_from_f64(x.as_f64()).to_f64(),
        DType::F32 => x.as_f64() as f32 as f64,
        DType::F64 => x.as_f64(),
        DType::Bool => (x.as_i64() != 0) as u8 as f64,
        DType::U8 => x.as_i64() as u8 as f64,
        DType::U32 => x.as_i64() as u32 as f64,
        DType::I32 => x.as_i64() as i32 as f64,
        _ => x.as_i64() as f64,
    }
}

/// Value class of a reduction over `k` elements (the input already converted to `d`).
fn reduce_meta(op: Red, d: DType, a: &Meta, k: usize) -> Option<Meta> {
    let kf = k as f64;
    let u = ulp(d) / 2.0;
    if !d.is_float() {
        let (lo, hi) = match op {
            Red::Sum => (a.lo.min(0.0) * kf, a.hi.max(0.0) * kf),
            Red::Prod => {
                let m = a.mag().max(1.0).powf(kf);
                (-m, m)
            }
            _ => (a.lo, a.hi),
        };
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta { lo, hi, ..*a });
    }
    let mut m = match op {
        Red::Max | Red::Min => Meta { bit: false, ..*a },
        Red::Sum | Red::Mean if k == 0 => {
            // 0 (sum) or 0 / 0 (mean).
            let mut m = Meta { acc: true, ..Meta::exact(0.0, 0.0, op == Red::Mean) };
            m.acc = true;
            return Some(m);
        }
        Red::Sum | Red::Mean => {
            let j = Meta { acc: true, ..Meta::joined(&[a], kf * a.lo.min(0.0), kf * a.hi.max(0.0)) };
            let j = if a.lo >= 0.0 {
                Meta { lo: kf * a.lo, ..j }
            } else if a.hi <= 0.0 {
                Meta { hi: kf * a.hi, ..j }
            } else {
                j
            };
            if k == 1 {
                j
            } else if a.lo >= 0.0 || a.hi <= 0.0 {
                j.approx(d, kf * a.ea, a.er + u * kf / 2.0 + u)
            } else {
                j.approx(d, kf * a.abs_err() + u * a.mag() * kf / 2.0, u)
            }
        }
        Red::Prod if k == 0 => return Some(Meta { acc: true, ..Meta::exact(1.0, 1.0, false) }),
        Red::Prod => {
            if a.special && !a.val {
                return None;
            }
            let big = a.mag().powf(kf);
            let lo = if a.lo >= 0.0 { a.lo.powf(kf) } else { -big };
            let j = Meta { acc: true, ..Meta::joined(&[a], lo, big) };
            if k == 1 { j } else { j.approx(d, kf * a.ea * a.mag().powf(kf - 1.0), kf * (a.er + u)) }
        }
    };
    if op == Red::Mean && k > 0 {
        let (lo, hi) = (m.lo / kf, m.hi / kf);
        m = Meta { lo, hi, ..m };
        if !m.bit {
            let (ea, er) = (m.ea / kf, m.er + u);
            m = m.approx(d, ea, er);
        }
    }
    Some(m)
}

/// Value class of a matmul with inner dim `k` (operands already converted to `d`).
fn matmul_meta(d: DType, a: &Meta, b: &Meta, k: usize) -> Option<Meta> {
    let kf = k as f64;
    let (lo, hi) = corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]);
    let (lo, hi) = (kf * lo.min(0.0), kf * hi.max(0.0));
    if !d.is_float() {
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta::joined(&[a, b], lo, hi));
    }
    if (a.special && !b.val) || (b.special && !a.val) {
        return None;
    }
    let mut j = Meta { acc: true, ..Meta::joined(&[a, b], lo, hi) };
    if k == 0 {
        j.bit = false; // a sum of nothing: zeros, maybe of either sign
        return Some(j);
    }
    let u = ulp(d) / 2.0;
    let (ma, mb) = (a.mag(), b.mag());
    let (ea_t, er_t) = (a.ea * mb + b.ea * ma, a.er + b.er + u);
    let signed = |m: &Meta| m.lo >= 0.0 || m.hi <= 0.0;
    Some(if signed(a) && signed(b) {
        j.approx(d, kf * ea_t, er_t + u * kf / 2.0 + u)
    } else {
        j.approx(d, kf * (ea_t + er_t * ma * mb) + u * ma * mb * kf / 2.0, u)
    })
}

/// Value class of softmax (or log_softmax) over a dim of `k` elements.
fn softmax_meta(d: DType, a: &Meta, k: usize, log: bool) -> Option<Meta> {
    let kf = k as f64;
    let u = ulp(d) / 2.0;
    let shifted = 2.0 * a.abs_err() + 2.0 * u * a.mag();
    let e = shifted + ulp(d); // relative error of exp(x - max)
    let s = e + u * kf / 2.0 + u; // relative error of the sum
    let j = Meta { acc: true, ..Meta::joined(&[a], 0.0, 1.0) };
    Some(if log {
        let lo = a.lo - a.hi - kf.ln() - 1.0;
        Meta { lo, hi: 0.0, ..j }.approx(d, shifted + s + ulp(d) * (kf.ln() + 1.0), u)
    } else {
        j.approx(d, 0.0, e + s + u)
    })
}

fn decode(leaves: Vec<Raw>, raw: Vec<Raw>, outs: Vec<u16>, together: bool, seed: u16) -> Prog {
    let mut dec = Decoder { steps: Vec::new(), vars: Vec::new(), infos: Vec::new() };
    for (sel, p) in leaves {
        let dtype = DTYPES[sel as usize % DTYPES.len()];
        let rank = [1, 2, 0, 3, 4][p[0] as usize % 5];
        dec.leaf(dtype, dims_from(rank, p[1]), p[2], p[3]);
    }
    for r in raw {
        dec.step(r);
    }
    let last = dec.vars.iter().rposition(Option::is_some).expect("a value");
    let mut outputs = vec![last];
    for o in outs {
        let v = dec.pick(o, |_| true).expect("a value");
        if !outputs.contains(&v) {
            outputs.push(v);
        }
    }
    prune(Prog { steps: dec.steps, info: dec.infos, outputs, together, seed: seed as u64 })
}

/// Drops the steps no output depends on (and renumbers), so that a shrunk program shows only what matters.
fn prune(prog: Prog) -> Prog {
    let n = prog.steps.len();
    let mut live = vec![false; n];
    for &o in &prog.outputs {
        live[o] = true;
    }
    for i in (0..n).rev() {
        let keep = match &prog.steps[i] {
            Step::Realize(v) => live[*v],
            _ => live[i],
        };
        if keep {
            live[i] = true;
            for v in prog.steps[i].operands() {
                live[v] = true;
            }
        }
    }
    let mut map = vec![usize::MAX; n];
    let mut steps = Vec::new();
    let mut info = Vec::new();
    for i in (0..n).filter(|&i| live[i]) {
        map[i] = steps.len();
        steps.push(prog.steps[i].remap(&map));
        info.push(prog.info[i].clone());
    }
    let outputs = prog.outputs.iter().map(|&o| map[o]).collect();
    Prog { steps, info, outputs, ..prog }
}

fn program() -> impl Strategy<Value = Prog> {
    let raw = || (any::<u8>(), prop::array::uniform5(any::<u16>()));
    (
        prop::collection::vec(raw(), 1..3),
        prop::collection::vec(raw(), 1..24),
        prop::collection::vec(any::<u16>(), 0..3),
        any::<bool>(),
        any::<u16>(),
    )
        .prop_map(|(leaves, steps, outs, together, seed)| decode(leaves, steps, outs, together, seed))
}

// ---------------------------------------------------------------------------------------------------------------
// Running a program
// ---------------------------------------------------------------------------------------------------------------

/// A realized CPU input: `n` values of `dtype` from `data` (see `common::data`), seeded by `seed`.
fn input(dtype: DType, dims: &[usize], data: Data, seed: u64) -> Tensor {
    input_on(&Device::cpu(), dtype, dims, data, seed)
}

/// `input` on `dev`.
fn input_on(dev: &Device, dtype: DType, dims: &[usize], data: Data, seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let vals = match data {
        Data::Cont(a, b) => common::data(dtype, n, seed, common::Dom::Cont(a, b)),
        Data::Grid(a, b) => common::data(dtype, n, seed, common::Dom::Grid(a, b)),
        Data::Specials => {
            let mut v = common::data(dtype, n, seed, common::Dom::Cont(-2.0, 2.0));
            let mut r = common::Rng(seed ^ 0x5eed);
            for x in v.iter_mut() {
                if r.next_u64().is_multiple_of(4) {
                    *x = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0][(r.next_u64() % 4) as usize];
                }
            }
            v
        }
    };
    let dims = dims.to_vec();
    match common::buffer(dtype, &vals) {
        HostBuffer::Bool(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::U8(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::U32(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::I32(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::I64(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::F16(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::F32(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::F64(v) => Tensor::from_vec(v.into_vec(), dims, dev),
        HostBuffer::BF16(v) => Tensor::from_vec(v.into_vec(), dims, dev),
    }
    .expect("input")
}

fn build(dev: &Device, step: &Step, t: &[Option<Tensor>]) -> Tensor {
    let dev = *dev;
    let v = |i: usize| t[i].as_ref().expect("a value");
    let rhs = |r: &Rhs| -> kiln::Operand {
        match r {
            Rhs::Var(i) => v(*i).into(),
            Rhs::Sc(s) => s.operand(),
        }
    };
    match step {
        Step::Input { dtype, dims, data, seed } => input_on(&dev, *dtype, dims, *data, *seed),
        Step::Full { dtype, dims, value } => Tensor::full(dims.clone(), value.scalar(), *dtype, &dev),
        Step::Rand { dtype, dims, normal: true } => Tensor::randn(dims.clone(), *dtype, &dev),
        Step::Rand { dtype, dims, normal: false } => Tensor::rand(dims.clone(), *dtype, &dev),
        Step::Arange { n, dims } => Tensor::arange(0, *n as i64, 1, &dev).reshape(dims.clone()),
        Step::Scalar { dtype, value } => Tensor::scalar(value.scalar(), *dtype, &dev),
        Step::Unary(u, i) => {
            let x = v(*i);
            match u {
                Un::Neg => x.neg(),
                Un::Abs => x.abs(),
                Un::Exp => x.exp(),
                Un::Log => x.log(),
                Un::Sin => x.sin(),
                Un::Cos => x.cos(),
                Un::Tanh => x.tanh(),
                Un::Sqrt => x.sqrt(),
                Un::Recip => x.recip(),
                Un::Rsqrt => x.rsqrt(),
                Un::Sigmoid => x.sigmoid(),
                Un::Relu => x.relu(),
                Un::Square => x.square(),
                Un::LogicalNot => x.logical_not(),
                Un::Floor => x.floor(),
                Un::Ceil => x.ceil(),
                Un::Round => x.round(),
                Un::Trunc => x.trunc(),
            }
        }
        Step::Binary(b, i, r) => {
            let (x, y) = (v(*i), rhs(r));
            match b {
                Bin::Add => x.add(y),
                Bin::Sub => x.sub(y),
                Bin::Mul => x.mul(y),
                Bin::Div => x.div(y),
                Bin::Maximum => x.maximum(y),
                Bin::Minimum => x.minimum(y),
                Bin::Pow => x.pow(y),
                Bin::Lt => x.lt(y),
                Bin::Le => x.le(y),
                Bin::Gt => x.gt(y),
                Bin::Ge => x.ge(y),
                Bin::Eq => x.eq(y),
                Bin::Ne => x.ne(y),
                Bin::LogicalAnd => x.logical_and(y),
                Bin::LogicalOr => x.logical_or(y),
            }
        }
        Step::Reversed(b, s, i) => match (b, s) {
            (Bin::Sub, Sc::F(s)) => *s - v(*i),
            (Bin::Sub, Sc::I(s)) => *s - v(*i),
            (Bin::Div, Sc::F(s)) => *s / v(*i),
            (Bin::Div, Sc::I(s)) => *s / v(*i),
            _ => unreachable!("reversed {b:?} {s:?}"),
        },
        Step::Where(c, a, b) => v(*c).where_(rhs(a), rhs(b)),
        Step::Cast(i, d) => v(*i).to_dtype(*d),
        Step::Reduce(r, i, dims, keepdim) => {
            let (x, dims, k) = (v(*i), dims.clone(), *keepdim);
            match r {
                Red::Sum => x.sum(dims, k),
                Red::Prod => x.prod(dims, k),
                Red::Max => x.max(dims, k),
                Red::Min => x.min(dims, k),
                Red::Mean => x.mean(dims, k),
            }
        }
        Step::Arg { max: true, v: i, dim, keepdim } => v(*i).argmax(*dim, *keepdim),
        Step::Arg { max: false, v: i, dim, keepdim } => v(*i).argmin(*dim, *keepdim),
        Step::Reshape(i, spec) => v(*i).reshape(spec.clone()),
        Step::Permute(i, perm) => v(*i).permute(perm.clone()),
        Step::Transpose(i, a, b) => v(*i).transpose(*a, *b),
        Step::Expand { v: i, spec, broadcast_to: true } => v(*i).broadcast_to(spec.clone()),
        Step::Expand { v: i, spec, broadcast_to: false } => v(*i).expand(spec.clone()),
        Step::Slice { v: i, dim, start, end, step } => v(*i).slice(*dim, *start, *end, *step),
        Step::Narrow { v: i, dim, start, len } => v(*i).narrow(*dim, *start, *len),
        Step::Unfold { v: i, dim, size, step } => v(*i).unfold(*dim, *size, *step),
        Step::Flip(i, dims) => v(*i).flip(dims.clone()),
        Step::Pad(i, pads, value) => v(*i).pad(pads, value.scalar()),
        Step::Cat(parts, dim) => Tensor::cat(&parts.iter().map(|&p| v(p)).collect::<Vec<_>>(), *dim),
        Step::Stack(parts, dim) => Tensor::stack(&parts.iter().map(|&p| v(p)).collect::<Vec<_>>(), *dim),
        Step::Unsqueeze(i, d) => v(*i).unsqueeze(*d),
        Step::Squeeze(i, dims) => v(*i).squeeze(dims.clone()),
        Step::Contiguous(i) => v(*i).contiguous(),
        Step::Matmul(a, b) => v(*a).matmul(v(*b)),
        Step::Softmax { v: i, dim, log: false } => v(*i).softmax(*dim),
        Step::Softmax { v: i, dim, log: true } => v(*i).log_softmax(*dim),
        Step::Realize(_) => unreachable!("realize defines no value"),
    }
}

/// The elements through `to_vec` (the typed path) as a host buffer.
fn via_to_vec(t: &Tensor) -> kiln::Result<HostBuffer> {
    Ok(match t.dtype() {
        DType::Bool => HostBuffer::Bool(t.to_vec()?.into()),
        DType::U8 => HostBuffer::U8(t.to_vec()?.into()),
        DType::U32 => HostBuffer::U32(t.to_vec()?.into()),
        DType::I32 => HostBuffer::I32(t.to_vec()?.into()),
        DType::I64 => HostBuffer::I64(t.to_vec()?.into()),
        DType::F16 => HostBuffer::F16(t.to_vec()?.into()),
        DType::F32 => HostBuffer::F32(t.to_vec()?.into()),
        DType::F64 => HostBuffer::F64(t.to_vec()?.into()),
        DType::BF16 => HostBuffer::BF16(t.to_vec()?.into()),
    })
}

/// Captures `outs` (each: the value, and the step whose class it is checked with), computes the reference and the
/// fused evaluator's results, realizes through the JIT, and compares.
fn check(prog: &Prog, t: &[Option<Tensor>], outs: &[(usize, usize)], together: bool) -> Result<(), String> {
    let ts: Vec<&Tensor> = outs.iter().map(|&(o, _)| t[o].as_ref().expect("a value")).collect();
    let cap = kiln::capture(&ts).map_err(|e| format!("capture: {e}"))?;
    let want = cap.reference()?;
    let inputs: Vec<&HostBuffer> = cap.inputs.iter().collect();
    let plan = kiln_jit::kernel::schedule(&cap.graph);
    let fused = kiln_jit::kernel::eval::run_plan(&plan, &inputs, &cap.rng);
    if together {
        kiln::realize(&ts).map_err(|e| format!("realize: {e}"))?;
    }
    let kernels = || plan.launches.iter().map(|l| l.kernel.name.clone()).collect::<Vec<_>>().join(", ");
    for (i, (&(o, at), t)) in outs.iter().zip(&ts).enumerate() {
        let info = &prog.info[at];
        if t.dtype() != info.dtype || t.dims() != info.dims.as_slice() {
            return Err(format!(
                "v{o}: {}{:?}, generator expected {:?}{:?}",
                t.dtype(),
                t.dims(),
                info.dtype,
                info.dims
            ));
        }
        let got = if i % 2 == 0 { t.to_host() } else { via_to_vec(t) }.map_err(|e| format!("v{o}: {e}"))?;
        let tol = tolerance(info.dtype, &info.meta);
        common::compare_on(&t.device(), &got, &want[i], tol)
            .map_err(|e| format!("v{o} by the JIT vs the reference: {e}\nkernels: {}", kernels()))?;
        compare(&fused[i], &want[i], tol)
            .map_err(|e| format!("v{o} by the kernel IR evaluator vs the reference: {e}\nkernels: {}", kernels()))?;
    }
    Ok(())
}

fn run(dev: &Device, prog: &Prog) -> Result<(), String> {
    kiln::manual_seed(prog.seed);
    let mut t: Vec<Option<Tensor>> = Vec::with_capacity(prog.steps.len());
    for (i, step) in prog.steps.iter().enumerate() {
        if let Step::Realize(v) = step {
            check(prog, &t, &[(*v, i)], true).map_err(|e| format!("[{dev}] {e}"))?;
            t.push(None);
            continue;
        }
        t.push(Some(build(dev, step, &t)));
    }
    let outs: Vec<(usize, usize)> = prog.outputs.iter().map(|&o| (o, o)).collect();
    check(prog, &t, &outs, prog.together).map_err(|e| format!("[{dev}] {e}"))
}

/// Whether `prog` can be held to this file's tolerances on `dev`. On the CPU, always. On wgpu (the only other
/// device so far), three documented limits apply:
/// - every value has a dtype the device holds (no f64 or i64);
/// - no `randn` leaf: the generator treats an f32 `randn` as bit-exact (the CPU computes Box-Muller in f64 and
///   rounds once), while a device without f64 computes it in f32, within ~1e-6 relative (as `kiln_jit::rng` says),
///   which the generator would then feed to ill-conditioned ops; the op table covers `randn` there;
/// - no value that may hold NaN or inf: WGSL lets a compiler assume floats are finite, and lavapipe folds
///   `0.0 / x` to 0 for a NaN `x`. kiln makes comparisons, max/min, casts and division by zero IEEE-correct on
///   the bits, and the op table checks those special values one op at a time; chains of arithmetic on NaN and inf
///   are not promised there.
fn holds(dev: &Device, prog: &Prog) -> bool {
    if *dev == Device::cpu() {
        return true;
    }
    prog.info.iter().all(|i| dev.supports(i.dtype) && !i.meta.special)
        && !prog.steps.iter().any(|s| matches!(s, Step::Rand { normal: true, .. }))
}

/// On the CPU: every generated program.
#[test]
fn random_programs_match_the_reference() {
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let result = runner.run(&program(), |prog| run(&Device::cpu(), &prog).map_err(TestCaseError::fail));
    common::check_gpu_sources("random programs");
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// On every other device of `common::devices()`: as many programs, drawn from those the device can be held to
/// (`holds`; proptest draws until it has them, so a device is never tested on fewer), generated with that device's
/// rounding (`WGSL_ROUNDING`).
#[test]
fn random_programs_match_the_reference_on_other_devices() {
    let others: Vec<Device> = common::devices().into_iter().filter(|d| *d != Device::cpu()).collect();
    if others.is_empty() {
        return; // `devices()` said what is missing (and fails when it is required)
    }
    WGSL_ROUNDING.with(|f| f.set(true));
    let strategy = program().prop_filter("a value the device cannot be held to", {
        let others = others.clone();
        move |p| others.iter().all(|d| holds(d, p))
    });
    let mut runner = proptest::test_runner::TestRunner::new(config());
    let result = runner.run(&strategy, |prog| {
        for dev in &others {
            run(dev, &prog).map_err(TestCaseError::fail)?;
        }
        Ok(())
    });
    common::check_gpu_sources("random programs on other devices");
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Regressions: minimal programs the generator found
// ---------------------------------------------------------------------------------------------------------------

/// Holds `ts` to the reference, through both the JIT and the kernel IR evaluator (bit-exact: moves and ints).
fn check_exact(ts: &[&Tensor]) {
    let cap = kiln::capture(ts).expect("capture");
    let want = cap.reference().expect("reference");
    let inputs: Vec<&HostBuffer> = cap.inputs.iter().collect();
    let fused = kiln_jit::kernel::eval::run_plan(&kiln_jit::kernel::schedule(&cap.graph), &inputs, &cap.rng);
    kiln::realize(ts).expect("realize");
    for (i, t) in ts.iter().enumerate() {
        let got = t.to_host().expect("to_host");
        compare(&got, &want[i], Tol::EXACT).unwrap_or_else(|e| panic!("output {i} by the JIT: {e}"));
        compare(&fused[i], &want[i], Tol::EXACT).unwrap_or_else(|e| panic!("output {i} by the evaluator: {e}"));
    }
}

/// `abs` of u8 is the identity: the CLIF renderer used a signed `iabs` on the byte, so 249 became 7.
#[test]
fn abs_of_u8_is_the_identity() {
    let x = input(DType::U8, &[2, 2, 13], Data::Cont(0.0, 255.0), 0);
    check_exact(&[&x.minimum(&x).abs()]);
}

/// A tensor captured twice is a graph that lists one node as two outputs; the schedule wrote only the first, so
/// the kernel IR evaluator panicked and the CPU backend returned the second one uninitialized.
#[test]
fn a_tensor_captured_twice_gives_two_equal_outputs() {
    use kiln_backends::Backend;
    let x = input(DType::F32, &[7], Data::Cont(-2.0, 2.0), 3);
    let y = x.mul(3.0).add(1.0);
    let z = x.exp();
    let cap = kiln::capture(&[&y, &z, &y, &x, &x]).expect("capture");
    let want = cap.reference().expect("reference");
    let inputs: Vec<&HostBuffer> = cap.inputs.iter().collect();
    let fused = kiln_jit::kernel::eval::run_plan(&kiln_jit::kernel::schedule(&cap.graph), &inputs, &cap.rng);
    let cpu = kiln_backends::cpu::CpuBackend;
    let buffers: Vec<kiln_backends::Buffer> =
        cap.inputs.iter().map(|b| cpu.upload(b.clone()).expect("upload")).collect();
    let args: Vec<&kiln_backends::Buffer> = buffers.iter().collect();
    let out = cpu.compile(&cap.graph).expect("compile").run(&args, &cap.rng).expect("run");
    for (i, w) in want.iter().enumerate() {
        let t = tol(DType::F32, Kind::Elementwise); // exp
        compare(&fused[i], w, t).unwrap_or_else(|e| panic!("output {i} by the evaluator: {e}"));
        let got = cpu.download(&out[i]).expect("download");
        compare(&got, w, t).unwrap_or_else(|e| panic!("output {i} by the CPU backend: {e}"));
    }
    // Through the public path as well: a slice of an empty dim is a no-op that returns the same tensor.
    let e = input(DType::I32, &[1, 0], Data::Cont(-5.0, 5.0), 0).abs();
    check_exact(&[&e, &e.slice(-1, 1, 1, 1)]);
}
