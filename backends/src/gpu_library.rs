//! A vendor library's GEMM as a contestant in the GPU devices' race (cuBLASLt on CUDA: `cuda/cublaslt.rs`), as
//! Inductor races ATen's GEMMs against its own templates: which GEMM kernels a library can run ([`LibGemm::of`]),
//! and the host stand-in's emulation of one ([`run_on_host`]) so that the plan and the race around it are tested
//! without a GPU.
//!
//! A library runs what it can describe: operands stored row- or column-major (one stride 1, the other the leading
//! dimension), batches with one stride each (0 for a shared operand), a contiguous output, and an epilogue it has
//! itself: nothing, `+ bias[n]`, then optionally `relu` or the tanh-form GELU, then the output's rounding. Anything
//! else a kernel fuses (the exact, erf-form GELU, a residual, a scale, a bf16 rounding before the bias, a mask) the
//! library cannot apply itself: there the library's contestant is its product alone ([`LibGemm::product_of`], f32
//! into scratch), then the epilogue as a kernel of its own (`kiln_jit::kernel::gemm::epilogue_pass`), which races
//! the templates' fused kernels like any contestant.
//!
//! The GELU is recognized by its expression, not by evaluating the epilogue at sample points: the outer code from
//! the bias on must be exactly one of the tanh-form GELU's two trees, `nn::functional::gelu(x, Approximate::Tanh)`'s
//! `x * sigmoid((x + x^3 * 0.044715) * 2 sqrt(2/pi))` (sigmoid as kiln records it, `1 / (exp(-v) + 1)`) or the
//! textbook `x * 0.5 * (tanh((x + x^3 * 0.044715) * sqrt(2/pi)) + 1)` (the same function: `(1 + tanh(u)) / 2 =
//! sigmoid(2u)`), up to the order of each product's and sum's operands, every instruction of it used and every
//! constant equal in f32 (cuBLASLt's `CUBLASLT_EPILOGUE_GELU` computes the tanh formula in f32). A
//! function that merely agrees with a GELU where it was sampled could be handed to the library and be wrong
//! elsewhere; a tree that is a GELU cannot. The race still verifies the library's output before it can win: a
//! library whose GELU is coarser than the output's tolerance (a hardware `tanh` approximation, say) loses the race
//! rather than the result. How close cuBLASLt's is has not been measured yet (no GPU here).

use kiln_jit::BinaryOp;
use kiln_jit::DType;
use kiln_jit::UnaryOp;
use kiln_jit::kernel::gemm::{GemmOperand, GemmView};
use kiln_jit::kernel::{InstOp, KernelIr};

/// A GEMM a library can run: `out[b][i][j] = epilogue(sum_p A[b][i][p] * B[b][p][j])` over `batch` entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LibGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// The operands' dtype (f32, bf16 or f16) and the output's (f32 or the operands').
    pub operands: DType,
    pub out: DType,
    /// A (`m x k`) and B (`k x n`), and which of the kernel's inputs each is.
    pub a: LibOperand,
    pub b: LibOperand,
    /// The bias added along the output's columns (`bias[j]`): which input, and its dtype.
    pub bias: Option<(usize, DType)>,
    /// The activation after the bias.
    pub act: Option<LibAct>,
}

/// An activation a library applies in its epilogue, after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LibAct {
    /// `max(x, 0)`, written `where(x <= 0, 0, x)`.
    Relu,
    /// `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`.
    GeluTanh,
}

impl LibAct {
    /// The activation as the library computes it, in f32 (the host stand-in's library).
    pub fn apply(self, x: f32) -> f32 {
        match self {
            LibAct::Relu if x <= 0.0 => 0.0,
            LibAct::Relu => x,
            LibAct::GeluTanh => x * 0.5 * (1.0 + (SQRT_2_OVER_PI as f32 * (x + 0.044715 * x * x * x)).tanh()),
        }
    }
}

/// `sqrt(2 / pi)`, the GELU's tanh-form constant, as `nn::functional::gelu` writes it.
const SQRT_2_OVER_PI: f64 = 0.7978845608028654;

/// One operand as a library describes it: row-major (`row[i]` at `i * ld`) or column-major (`col[j]` at `j * ld`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LibOperand {
    pub buf: usize,
    pub row_major: bool,
    pub ld: i64,
    /// Elements between batch entries (0: every entry reads the same matrix).
    pub batch_stride: i64,
}

impl LibOperand {
    /// Element (`i`, `j`) of batch entry `b`, in elements from the buffer's start.
    pub fn at(&self, b: usize, i: usize, j: usize) -> usize {
        let (major, minor) = if self.row_major { (i, j) } else { (j, i) };
        (b as i64 * self.batch_stride + major as i64 * self.ld + minor as i64) as usize
    }
}

impl LibGemm {
    /// GEMM kernel `k` (recognized as `v`) as a library runs it, or `None` where the layouts or the epilogue are not
    /// ones a library has (the module doc).
    pub fn of(k: &KernelIr, v: &GemmView) -> Option<LibGemm> {
        if !(v.out == DType::F32 || v.out == v.operands) {
            return None;
        }
        let (bias, act) = epilogue(k, v.out)?;
        Some(LibGemm { out: v.out, bias, act, ..LibGemm::product_of(k, v)? })
    }

    /// The product alone of GEMM kernel `k` (recognized as `v`), summed in f32 into a contiguous f32 `[batch, m, n]`
    /// (no bias, no activation), where a library can describe its operands: what the library computes when the
    /// kernel's epilogue is not one it has, before `kiln_jit::kernel::gemm::epilogue_pass` applies that epilogue
    /// as a kernel of its own (as Inductor runs an ATen GEMM and then its fused epilogue). `None` where the
    /// layouts are not a library's.
    pub fn product_of(k: &KernelIr, v: &GemmView) -> Option<LibGemm> {
        if k.can_fault() || k.routine.is_some() || !matches!(v.operands, DType::F32 | DType::BF16 | DType::F16) {
            return None;
        }
        Some(LibGemm {
            m: v.m,
            n: v.n,
            k: v.k,
            batch: v.batch_count().max(1),
            operands: v.operands,
            out: DType::F32,
            a: operand(&v.a, (v.m, v.k), &v.batch)?,
            b: operand(&v.b, (v.k, v.n), &v.batch)?,
            bias: None,
            act: None,
        })
    }

    /// The library call's addresses (A, B, the bias or 0, the output) from the kernel's: `input(i)` is input
    /// `i`'s address, `out` the output's.
    pub fn ptrs<E>(&self, input: impl Fn(usize) -> Result<u64, E>, out: u64) -> Result<[u64; 4], E> {
        let bias = match self.bias {
            Some((b, _)) => input(b)?,
            None => 0,
        };
        Ok([input(self.a.buf)?, input(self.b.buf)?, bias, out])
    }

    /// A stable description for tuning records and errors, e.g. `bf16 16x4096x4096 bias relu` (or `bias gelu`).
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}x{}x{}", self.operands, self.m, self.n, self.k);
        if self.batch > 1 {
            s = format!("{s} batch {}", self.batch);
        }
        if self.bias.is_some() {
            s.push_str(" bias");
        }
        match self.act {
            Some(LibAct::Relu) => s.push_str(" relu"),
            Some(LibAct::GeluTanh) => s.push_str(" gelu"),
            None => {}
        }
        s
    }
}

/// The parameters of the epilogue pass after a library's product (`LibGemm::product_of`) from its kernel's
/// (`params`: the inputs' addresses, then the output's): the inputs, the product's address, the output's. `None`
/// for parameters without an output.
#[cfg(any(feature = "cuda", feature = "hip", feature = "host-gpu"))]
pub(crate) fn pass_params(params: &[u64], product: u64) -> Option<smallvec::SmallVec<[u64; 8]>> {
    let (&out, inputs) = params.split_last()?;
    Some(inputs.iter().copied().chain([product, out]).collect())
}

/// `op` (a `rows x cols` matrix per batch entry of `batch`) as a library operand: unpatched, at offset 0 (device
/// allocations are aligned as libraries want), one stride 1 and the other at least the row (column) length, and
/// batch strides that flatten to one (or are all 0).
fn operand(op: &GemmOperand, (rows, cols): (usize, usize), batch: &[usize]) -> Option<LibOperand> {
    if op.patch.is_some() || op.offset != 0 {
        return None;
    }
    let (row_major, ld) = if op.cols == 1 && op.rows >= cols.max(1) as i64 {
        (true, op.rows)
    } else if op.rows == 1 && op.cols >= rows.max(1) as i64 {
        (false, op.cols)
    } else {
        return None;
    };
    let batch_stride = match op.batch.last() {
        None => 0,
        Some(&inner) => {
            // Each outer batch stride must step over the inner ones whole: one stride for the flattened batch.
            let flat = op.batch.windows(2).zip(&batch[1..]).all(|(w, &e)| w[0] == w[1] * e as i64);
            if !flat {
                return None;
            }
            inner
        }
    };
    Some(LibOperand { buf: op.buf, row_major, ld, batch_stride })
}

/// A bias along the output's columns: which input, stored in which dtype.
type Bias = Option<(usize, DType)>;

/// The kernel's outer code as a library's epilogue: `acc`, then optionally `+ bias[j]` (a load along the output's
/// last dim, cast to f32 where stored in bf16), optionally `relu` (`where(x <= 0, 0, x)`) or the tanh-form GELU
/// (the module doc), each matched as an expression tree (`Tree`), then optionally the cast to the output's dtype,
/// and nothing else. `(bias input and dtype,
/// activation)`.
fn epilogue(k: &KernelIr, out: DType) -> Option<(Bias, Option<LibAct>)> {
    let o = &k.outer;
    let rank = k.out_rank();
    let nvars = rank + 1;
    let mut i = 0;
    let next = |i: &mut usize| {
        let inst = o.get(*i);
        *i += 1;
        inst
    };
    let first = next(&mut i)?;
    if first.op != InstOp::Acc || first.dtype != DType::F32 {
        return None;
    }
    let mut cur = 0;
    let mut bias = None;
    let mut act = None;
    // `+ bias[j]`
    if let Some(InstOp::Load { buf, index, valid: None, .. }) = o.get(i).map(|x| &x.op) {
        let mut along_n = vec![0; nvars];
        along_n[rank - 1] = 1;
        if index.affine(nvars) != Some((along_n, 0)) {
            return None;
        }
        let stored = o[i].dtype;
        let mut b = i;
        i += 1;
        if stored != DType::F32 {
            let cast = next(&mut i)?;
            if cast.op != InstOp::Cast(b) || cast.dtype != DType::F32 {
                return None;
            }
            b = i - 1;
        }
        let add = next(&mut i)?;
        let sum = matches!(add.op, InstOp::Binary(BinaryOp::Add, x, y) if (x, y) == (cur, b) || (x, y) == (b, cur));
        if !sum || add.dtype != DType::F32 {
            return None;
        }
        cur = i - 1;
        bias = Some((*buf, stored));
    }
    // The activation: the instructions up to the result (or to its rounding) are exactly one activation's tree
    // over `cur`.
    if i < o.len() {
        let root = match o[k.result].op {
            InstOp::Cast(r) => r,
            _ => k.result,
        };
        let acts = [(LibAct::Relu, &RELU), (LibAct::GeluTanh, &GELU_SIGMOID), (LibAct::GeluTanh, &GELU_TANH)];
        if root >= i
            && let Some((a, _)) = acts.into_iter().find(|(_, p)| Tree::new(o, i, cur).uses_all(root, p, i..=root))
        {
            act = Some(a);
            cur = root;
            i = root + 1;
        }
    }
    // The output's rounding.
    if let Some(cast) = o.get(i)
        && cast.op == InstOp::Cast(cur)
    {
        cur = i;
        i += 1;
    }
    (i == o.len() && k.result == cur && o[cur].dtype == out).then_some((bias, act))
}

/// An f32 expression of one value `x`, to match outer code against (see `Tree`).
enum Pat {
    X,
    Const(f64),
    Add(&'static Pat, &'static Pat),
    Mul(&'static Pat, &'static Pat),
    /// A unary op of a value: `tanh`, and the sigmoid's `neg`, `exp` and `recip`.
    Unary(UnaryOp, &'static Pat),
    /// `a <= b`, a bool.
    Le(&'static Pat, &'static Pat),
    /// `where(cond, then, else)`.
    Where(&'static Pat, &'static Pat, &'static Pat),
}

/// `where(x <= 0, 0, x)`, as `relu` builds it.
const RELU: Pat = Pat::Where(&Pat::Le(&Pat::X, &Pat::Const(0.0)), &Pat::Const(0.0), &Pat::X);

/// `x + x * x * x * 0.044715`, the tanh-form GELU's polynomial.
const GELU_POLY: Pat = {
    use Pat::*;
    Add(&X, &Mul(&Mul(&Mul(&X, &X), &X), &Const(0.044715)))
};

/// `x * 0.5 * (tanh((x + x * x * x * 0.044715) * sqrt(2 / pi)) + 1)`, the tanh-form GELU as it is usually written.
const GELU_TANH: Pat = {
    use Pat::*;
    const TANH: Pat = Unary(UnaryOp::Tanh, &Mul(&GELU_POLY, &Const(SQRT_2_OVER_PI)));
    Mul(&Mul(&X, &Const(0.5)), &Add(&TANH, &Const(1.0)))
};

/// `x * recip(exp(-((x + x * x * x * 0.044715) * 2 sqrt(2 / pi))) + 1)`: the same function as a sigmoid, as
/// `nn::functional::gelu` builds it.
const GELU_SIGMOID: Pat = {
    use Pat::*;
    const V: Pat = Mul(&GELU_POLY, &Const(2.0 * SQRT_2_OVER_PI));
    const E: Pat = Unary(UnaryOp::Exp, &Unary(UnaryOp::Neg, &V));
    Mul(&X, &Unary(UnaryOp::Recip, &Add(&E, &Const(1.0))))
};

/// Matches outer-code instructions at or after `from` against a `Pat` whose `X` is instruction `x`, every
/// instruction f32 (a comparison bool), sums and products in either operand order.
struct Tree<'a> {
    o: &'a [kiln_jit::kernel::Inst],
    from: usize,
    x: usize,
    /// The instructions the last match used (with repeats).
    used: Vec<usize>,
}

impl<'a> Tree<'a> {
    fn new(o: &'a [kiln_jit::kernel::Inst], from: usize, x: usize) -> Tree<'a> {
        Tree { o, from, x, used: Vec::new() }
    }

    /// Whether instruction `id` computes `p`, and the match used every instruction of `range`.
    fn uses_all(&mut self, id: usize, p: &Pat, range: std::ops::RangeInclusive<usize>) -> bool {
        if !self.matches(id, p) {
            return false;
        }
        let mut used = std::mem::take(&mut self.used);
        used.sort_unstable();
        used.dedup();
        used.into_iter().eq(range)
    }

    fn matches(&mut self, id: usize, p: &Pat) -> bool {
        if let Pat::X = p {
            return id == self.x;
        }
        let dtype = if matches!(p, Pat::Le(..)) { DType::Bool } else { DType::F32 };
        let Some(inst) = self.o.get(id).filter(|inst| id >= self.from && inst.dtype == dtype) else {
            return false;
        };
        let mark = self.used.len();
        self.used.push(id);
        let ok = match (p, &inst.op) {
            (Pat::Const(c), InstOp::Const(s)) => s.as_f64() as f32 == *c as f32,
            (Pat::Unary(u, a), InstOp::Unary(op, v)) if u == op => self.matches(*v, a),
            (Pat::Add(a, b), InstOp::Binary(BinaryOp::Add, l, r))
            | (Pat::Mul(a, b), InstOp::Binary(BinaryOp::Mul, l, r)) => {
                self.both(*l, *r, a, b) || self.both(*r, *l, a, b)
            }
            (Pat::Le(a, b), InstOp::Binary(BinaryOp::Le, l, r)) => self.both(*l, *r, a, b),
            (Pat::Where(c, a, b), InstOp::Where(wc, wa, wb)) => self.matches(*wc, c) && self.both(*wa, *wb, a, b),
            _ => false,
        };
        if !ok {
            self.used.truncate(mark);
        }
        ok
    }

    /// `l` matches `a` and `r` matches `b` (nothing recorded otherwise).
    fn both(&mut self, l: usize, r: usize, a: &Pat, b: &Pat) -> bool {
        let mark = self.used.len();
        let ok = self.matches(l, a) && self.matches(r, b);
        if !ok {
            self.used.truncate(mark);
        }
        ok
    }
}

/// Runs `g` on the host as a library would (f32 products summed in f32 in K order, the epilogue, one rounding to
/// the output's dtype): the host stand-in's library GEMM. `ptrs` are the addresses of A, B, the bias (0 without one)
/// and the output.
///
/// # Safety
/// Each address holds the elements of its dtype that `g` indexes (the plan's buffer lengths).
pub unsafe fn run_on_host(g: &LibGemm, ptrs: [u64; 4]) {
    let read = |p: u64, dtype: DType, i: usize| -> f32 {
        // SAFETY: the caller's contract: `p` holds element `i` of `dtype`.
        unsafe {
            match dtype {
                DType::BF16 => kiln_jit::bf16::from_bits(*(p as *const u16).add(i)).to_f32(),
                DType::F16 => kiln_jit::f16::from_bits(*(p as *const u16).add(i)).to_f32(),
                _ => *(p as *const f32).add(i),
            }
        }
    };
    for b in 0..g.batch {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0.0f32;
                for p in 0..g.k {
                    acc += read(ptrs[0], g.operands, g.a.at(b, i, p)) * read(ptrs[1], g.operands, g.b.at(b, p, j));
                }
                if let Some((_, dtype)) = g.bias {
                    acc += read(ptrs[2], dtype, j);
                }
                if let Some(act) = g.act {
                    acc = act.apply(acc);
                }
                let at = (b * g.m + i) * g.n + j;
                // SAFETY: the caller's contract: the output holds `batch * m * n` elements of its dtype.
                unsafe {
                    match g.out {
                        DType::BF16 => *(ptrs[3] as *mut u16).add(at) = kiln_jit::bf16::from_f32(acc).to_bits(),
                        DType::F16 => *(ptrs[3] as *mut u16).add(at) = kiln_jit::f16::from_f32(acc).to_bits(),
                        _ => *(ptrs[3] as *mut f32).add(at) = acc,
                    }
                }
            }
        }
    }
}
