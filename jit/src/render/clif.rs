//! Kernel IR -> Cranelift IR (CLIF), for the CPU backend.
//!
//! Every kernel becomes `fn(args: *const *mut u8, rng: *const u64, start: i64, end: i64)`: `args` holds the
//! input pointers then the output pointer, `rng` holds (seed, offset) pairs, and the function computes rows
//! `start..end` of output loop 0 (all of it for a zero-dim output), so the backend can split rows over threads.
//!
//! Code for each instruction comes from one place, `Emitter::op`, which is written once for any lane count:
//! a kernel whose values are all f32, i32 or bool runs its innermost output loop 4 lanes at a time (f32x4, the
//! widest vector Cranelift emits on x86-64), with a scalar tail; other kernels run scalar. Loads whose index moves
//! by 1 along the vectorized loop are vector loads, by 0 are splats, otherwise gathers. Bools are 0/1 bytes in
//! memory and scalar code, all-ones/zero lane masks in vector code.
//!
//! exp, log, sin, cos and tanh are inlined polynomials from `clif_math` (1-3 ulp, documented there); `pow`, random
//! numbers and out-of-range trig arguments are calls to `Libcall`s, which the backend binds to Rust functions.
//!
//! Semantics are those of `kernel::eval` (the executable spec): ints wrap, integer division by zero gives 0,
//! float -> int casts saturate through i64 then wrap, max/min propagate NaN, comparisons with NaN are false except
//! `!=`.

use crate::dtype::{DType, Scalar};
use crate::kernel::{IExpr, Inst, InstOp, KernelIr, Valid};
use crate::op::{BinaryOp, RandDist, ReduceOp, UnaryOp};
use crate::render::clif_math;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, Endianness, ExtFuncData, ExternalName, FuncRef, Function, InstBuilder, MemFlagsData, Signature, Type,
    UserExternalName, UserFuncName, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use std::collections::HashMap;

/// Defines `Libcall` from one table: variant, symbol, parameter types, return type.
macro_rules! libcalls {
    ($($(#[$doc:meta])* $v:ident => $name:literal, ($($p:ident),*) -> $r:ident;)*) => {
        /// Host functions a kernel may call. The backend declares them first, in this order, so that a libcall's
        /// index is its function id in the module.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Libcall {
            $($(#[$doc])* $v,)*
        }

        impl Libcall {
            pub const ALL: &'static [Libcall] = &[$(Libcall::$v,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $(Libcall::$v => $name,)*
                }
            }

            /// (parameter types, return type).
            pub fn types(self) -> (&'static [Type], Type) {
                match self {
                    $(Libcall::$v => (&[$(types::$p),*], types::$r),)*
                }
            }
        }
    };
}

libcalls! {
    ExpF32 => "kiln_exp_f32", (F32) -> F32;
    LogF32 => "kiln_log_f32", (F32) -> F32;
    SinF32 => "kiln_sin_f32", (F32) -> F32;
    CosF32 => "kiln_cos_f32", (F32) -> F32;
    TanhF32 => "kiln_tanh_f32", (F32) -> F32;
    PowF32 => "kiln_pow_f32", (F32, F32) -> F32;
    ExpF64 => "kiln_exp_f64", (F64) -> F64;
    LogF64 => "kiln_log_f64", (F64) -> F64;
    SinF64 => "kiln_sin_f64", (F64) -> F64;
    CosF64 => "kiln_cos_f64", (F64) -> F64;
    TanhF64 => "kiln_tanh_f64", (F64) -> F64;
    PowF64 => "kiln_pow_f64", (F64, F64) -> F64;
    /// `(i64, i64) -> i64` wrapping integer power (see `interp::int_pow`).
    PowI64 => "kiln_pow_i64", (I64, I64) -> I64;
    /// `(seed, index) -> f32` uniform in [0, 1).
    UniformF32 => "kiln_uniform_f32", (I64, I64) -> F32;
    /// `(seed, index) -> f64` uniform in [0, 1).
    UniformF64 => "kiln_uniform_f64", (I64, I64) -> F64;
    /// `(seed, index) -> f64` standard normal.
    NormalF64 => "kiln_normal_f64", (I64, I64) -> F64;
}

impl Libcall {
    pub fn signature(self, call_conv: CallConv) -> Signature {
        let (params, ret) = self.types();
        let mut sig = Signature::new(call_conv);
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(ret));
        sig
    }

    fn index(self) -> u32 {
        Libcall::ALL.iter().position(|&l| l == self).expect("listed") as u32
    }

    fn unary(u: UnaryOp, d: DType) -> Option<Libcall> {
        let f64 = d == DType::F64;
        Some(match u {
            UnaryOp::Exp => {
                if f64 {
                    Libcall::ExpF64
                } else {
                    Libcall::ExpF32
                }
            }
            UnaryOp::Log => {
                if f64 {
                    Libcall::LogF64
                } else {
                    Libcall::LogF32
                }
            }
            UnaryOp::Sin => {
                if f64 {
                    Libcall::SinF64
                } else {
                    Libcall::SinF32
                }
            }
            UnaryOp::Cos => {
                if f64 {
                    Libcall::CosF64
                } else {
                    Libcall::CosF32
                }
            }
            UnaryOp::Tanh => {
                if f64 {
                    Libcall::TanhF64
                } else {
                    Libcall::TanhF32
                }
            }
            _ => return None,
        })
    }
}

/// The kernel entry signature.
pub fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([types::I64; 4].map(AbiParam::new));
    sig
}

/// Lanes of the vectorized innermost loop.
const LANES: usize = 4;

/// Whether every value of the kernel fits the f32x4 / i32x4 / mask lane model and it has an output loop to
/// vectorize.
pub fn vectorizable(k: &KernelIr) -> bool {
    !k.out_extents.is_empty() && vectorizable_values(k)
}

/// Whether every value that varies along the vectorized (innermost output) loop fits the f32x4 / i32x4 / mask lane
/// model. Values that do not vary along it (a learning rate read from an f64 scalar, an iota over another dim) are
/// computed once per vector as scalars, whatever their dtype, and splatted where a vector op reads them.
fn vectorizable_values(k: &KernelIr) -> bool {
    let rank = k.out_rank();
    let lane_ok = |d: DType| matches!(d, DType::F32 | DType::I32 | DType::Bool);
    let ok = |insts: &[Inst]| {
        let deps = deps(insts, rank);
        insts
            .iter()
            .zip(&deps)
            .all(|(i, &(_, varies))| !varies || (lane_ok(i.dtype) && !matches!(i.op, InstOp::Rand { .. })))
    };
    let inner_ok = k.reduce.as_ref().is_none_or(|r| lane_ok(r.dtype) && ok(&r.inner));
    lane_ok(k.output.dtype) && ok(&k.outer) && inner_ok
}

/// The strict form, for vectorizing along a reduce loop: every value in the lane model.
fn all_values_vectorizable(k: &KernelIr) -> bool {
    let ok_inst = |i: &Inst| {
        matches!(i.dtype, DType::F32 | DType::I32 | DType::Bool)
            && !matches!(i.op, InstOp::Index(_) | InstOp::Rand { .. })
    };
    let inner_ok = k
        .reduce
        .as_ref()
        .is_none_or(|r| matches!(r.dtype, DType::F32 | DType::I32 | DType::Bool) && r.inner.iter().all(ok_inst));
    k.inputs.iter().chain([&k.output]).all(|b| matches!(b.dtype, DType::F32 | DType::I32 | DType::Bool))
        && k.outer.iter().all(ok_inst)
        && inner_ok
}

/// Code generation choices that depend on the host (and, for tiles, on a tuner), not on the kernel's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Run the innermost output loop 4 lanes at a time where the kernel allows it (`vectorizable`).
    pub vectorize: bool,
    /// Fold `acc + x * y` reductions (matmul) with a fused multiply-add. Only when the host has FMA: otherwise
    /// Cranelift would turn it into a libcall. It rounds once instead of twice, within the matmul tolerance.
    pub fma: bool,
    /// Register tiling and cache blocking of reduce kernels (the GEMM micro-kernel): the seam the autotuner
    /// drives. Any value renders a correct kernel; the tile only changes speed.
    pub tile: TileConfig,
}

/// The register tile and row blocking of a reduce kernel's output loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileConfig {
    /// Output rows per register tile.
    pub rows: usize,
    /// 4-lane column vectors per register tile.
    pub vecs: usize,
    /// Rows per cache block (a block of A is reused from L2 across all column tiles).
    pub block_rows: usize,
    /// Vectors per iteration of a kernel without a reduction: independent dependency chains for the out-of-order
    /// core (a polynomial sin is one long chain per vector).
    pub elementwise_vecs: usize,
}

impl Default for TileConfig {
    /// 4 x 2 f32x4 accumulators + 2 column loads + 1 broadcast = 11 of the 16 xmm registers; 64 rows of A at
    /// K = 1024 f32 are 256 KiB, which stays in L2. Six vectors per elementwise iteration: measured on
    /// `sin(a)^2 * b + c` over 16M f32 (bench_table), 2 -> 19.2 ms, 4 -> 18.0, 6 -> 17.4, 8 -> 17.1-18.6.
    fn default() -> Self {
        TileConfig { rows: 4, vecs: 2, block_rows: 64, elementwise_vecs: 6 }
    }
}

/// Whether a reduce kernel should run its innermost reduce loop 4 lanes at a time (partial results per lane,
/// folded across lanes at the end) rather than its innermost output loop. That is the better choice when its
/// inputs are contiguous along the reduction and not along the output: a sum over the last axis, or a matmul with
/// a transposed right operand (`x.matmul(&w.t())`, every linear layer), which vectorized over the output would load
/// every lane separately.
pub fn reduce_vectorizable(k: &KernelIr) -> bool {
    let Some(r) = &k.reduce else { return false };
    let rank = k.out_rank();
    let nvars = rank + r.extents.len();
    let last = nvars - 1;
    if r.dtype != DType::F32 || r.extents.last().copied().unwrap_or(0) < LANES || !all_values_vectorizable(k) {
        return false;
    }
    let mut contiguous_reduce = false;
    let mut output_gather = false;
    for inst in &r.inner {
        if let InstOp::Load { index, .. } = &inst.op {
            let Some((coef, _)) = index.affine(nvars) else { return false };
            match coef[last] {
                0 => {}
                1 => contiguous_reduce = true,
                _ => return false,
            }
            if rank > 0 && !matches!(coef[rank - 1], 0 | 1) {
                output_gather = true;
            }
        }
    }
    let narrow_output = k.out_extents.last().is_none_or(|&e| e < LANES);
    contiguous_reduce && (output_gather || narrow_output)
}

/// Renders `k` as a CLIF function named `user1:index`, vectorized where possible, without FMA.
pub fn render(k: &KernelIr, index: u32, target: TargetFrontendConfig, vectorize: bool) -> Function {
    render_with(k, index, target, RenderOptions { vectorize, fma: false, tile: TileConfig::default() })
}

/// Renders `k` with explicit options.
pub fn render_with(k: &KernelIr, index: u32, target: TargetFrontendConfig, opts: RenderOptions) -> Function {
    let call_conv = target.default_call_conv;
    let mut func = Function::with_name_signature(UserFuncName::user(1, index), kernel_signature(call_conv));
    let mut ctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut ctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let [args, rng, start, end] = b.block_params(entry).try_into().expect("four params");
    let trusted = MemFlagsData::trusted().with_readonly();
    let mut bases = Vec::with_capacity(k.inputs.len() + 1);
    for i in 0..=k.inputs.len() {
        bases.push(b.ins().load(types::I64, trusted, args, (i * 8) as i32));
    }
    let out_ptr = bases.pop().expect("output pointer");
    let nvars = k.extents().len();
    let vars: Vec<Variable> = (0..nvars).map(|_| b.declare_var(types::I64)).collect();
    let rank = k.out_rank();
    let strides = crate::shape::contiguous_strides(&k.out_extents);
    let out_index =
        IExpr::from_affine(&(0..nvars).map(|v| if v < rank { strides[v] as i64 } else { 0 }).collect::<Vec<_>>(), 0);
    // A vector body only pays when the innermost loop has at least one full vector; rendering it for a smaller
    // extent would only cost compile time (a polynomial sin is hundreds of instructions).
    let innermost = k.out_extents.last().copied().unwrap_or(0);
    let reduce_vec = opts.vectorize && reduce_vectorizable(k);
    let vec_ok = !reduce_vec && opts.vectorize && vectorizable(k) && innermost >= LANES;
    let tiled = vec_ok && rank >= 2 && k.reduce.is_some();
    let mut em = Emitter {
        b,
        k,
        bases,
        out_ptr,
        rng,
        vars,
        call_conv,
        libcalls: HashMap::new(),
        row_dim: (rank >= 2).then(|| rank - 2),
        col_dim: rank.checked_sub(1),
        at: (0, 0),
        out_index,
        vec_ok,
        tiled,
        reduce_vec,
        fma: opts.fma,
        tile_cfg: opts.tile,
        inner_deps: k.reduce.as_ref().map_or(Vec::new(), |r| deps(&r.inner, rank)),
        outer_deps: deps(&k.outer, rank),
        hoisted: HashMap::new(),
    };
    if rank == 0 {
        em.tile(1, 1, 1);
    } else {
        em.loops(0, start, end);
    }
    em.b.ins().return_(&[]);
    em.b.finalize(target);
    func
}

/// For each instruction: does it depend on the tile's row variable, on its column variable?
fn deps(insts: &[Inst], rank: usize) -> Vec<(bool, bool)> {
    let (row, col) = (rank.checked_sub(2), rank.checked_sub(1));
    let mentions = |e: &IExpr, v: Option<usize>| v.is_some_and(|v| mentions_var(e, v));
    let mut out: Vec<(bool, bool)> = Vec::with_capacity(insts.len());
    for inst in insts {
        let d = match &inst.op {
            InstOp::Const(_) => (false, false),
            InstOp::Acc => (true, true),
            InstOp::Index(e) | InstOp::Rand { index: e, .. } => (mentions(e, row), mentions(e, col)),
            InstOp::Load { index, valid, .. } => {
                let ranges: Vec<&IExpr> = valid.iter().flat_map(|v| v.0.iter().map(|(e, _, _)| e)).collect();
                let any = |v| mentions(index, v) || ranges.iter().any(|e| mentions(e, v));
                (any(row), any(col))
            }
            InstOp::Unary(_, a) | InstOp::Cast(a) => out[*a],
            InstOp::Binary(_, a, b) => (out[*a].0 || out[*b].0, out[*a].1 || out[*b].1),
            InstOp::Where(c, a, b) => (out[*c].0 || out[*a].0 || out[*b].0, out[*c].1 || out[*a].1 || out[*b].1),
        };
        out.push(d);
    }
    out
}

fn mentions_var(e: &IExpr, v: usize) -> bool {
    match e {
        IExpr::Var(x) => *x == v,
        IExpr::Const(_) => false,
        IExpr::Add(ts) => ts.iter().any(|t| mentions_var(t, v)),
        IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) => mentions_var(x, v),
    }
}

struct Emitter<'a> {
    b: FunctionBuilder<'a>,
    k: &'a KernelIr,
    bases: Vec<Value>,
    out_ptr: Value,
    rng: Value,
    vars: Vec<Variable>,
    call_conv: CallConv,
    libcalls: HashMap<Libcall, FuncRef>,
    /// The output loop a register tile spans several rows of (second innermost), and the one it spans lanes and
    /// vectors of (innermost).
    row_dim: Option<usize>,
    col_dim: Option<usize>,
    /// Offsets of the element being emitted within its tile: (rows, columns).
    at: (i64, i64),
    /// Row-major output offset of the loop variables.
    out_index: IExpr,
    vec_ok: bool,
    tiled: bool,
    /// Vectorize the innermost reduce loop instead of the output loop (see `reduce_vectorizable`).
    reduce_vec: bool,
    fma: bool,
    tile_cfg: TileConfig,
    inner_deps: Vec<(bool, bool)>,
    outer_deps: Vec<(bool, bool)>,
    /// Inner-code loads whose address is split into a loop-invariant base (computed once per tile, before the
    /// reduction loops) and a part that depends only on reduce variables: inst index -> (base pointer of tile
    /// element 0, reduce part of the index, index coefficients).
    hoisted: HashMap<usize, (Value, IExpr, Vec<i64>)>,
}

/// CLIF type of a dtype: bools and u8 are bytes in scalar code; in vector code bools are i32 lane masks.
fn ty(d: DType, lanes: usize) -> Type {
    match (d, lanes) {
        (DType::Bool | DType::U8, 1) => types::I8,
        (DType::I32, 1) => types::I32,
        (DType::I64, 1) => types::I64,
        (DType::F32, 1) => types::F32,
        (DType::F64, 1) => types::F64,
        (DType::F32, _) => types::F32X4,
        (DType::I32 | DType::Bool, _) => types::I32X4,
        (d, l) => unreachable!("{d} has no {l}-lane form"),
    }
}

/// Vector loads and stores: in bounds but not necessarily 16-byte aligned.
fn vector_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

impl Emitter<'_> {
    /// Output loops from `dim` inward. A register-tiled kernel walks its last two output dims as a GEMM does:
    /// blocks of `TileConfig::block_rows` rows (a block of A stays in L2), and within a block, column tiles outer and row tiles
    /// inner (a column panel of B stays in L1 while every row tile of the block uses it).
    fn loops(&mut self, dim: usize, lo: Value, hi: Value) {
        let rank = self.k.out_rank();
        if dim + 1 == rank {
            self.col_loops(lo, hi, 1);
            return;
        }
        let var = self.vars[dim];
        if self.tiled && dim + 2 == rank {
            let block = self.b.declare_var(types::I64);
            self.b.def_var(block, lo);
            self.step_loop(block, hi, self.tile_cfg.block_rows.max(1) as i64, |s, first, last| {
                s.row_block(first, last)
            });
            return;
        }
        let inner_extent = self.k.out_extents[dim + 1] as i64;
        self.b.def_var(var, lo);
        self.counted_loop(var, hi, 1, |s| {
            let (zero, n) = (s.b.ins().iconst(types::I64, 0), s.b.ins().iconst(types::I64, inner_extent));
            s.loops(dim + 1, zero, n);
        });
    }

    /// Rows `first..last` of a tiled kernel: for each column step (tiles, single vectors, scalars), all row tiles.
    fn row_block(&mut self, first: Value, last: Value) {
        let rank = self.k.out_rank();
        let (row, col) = (self.vars[rank - 2], self.vars[rank - 1]);
        let zero = self.b.ins().iconst(types::I64, 0);
        let cols = self.b.ins().iconst(types::I64, self.k.out_extents[rank - 1] as i64);
        self.b.def_var(col, zero);
        for (step, vecs, lanes) in self.col_steps() {
            self.counted_loop(col, cols, step as i64, |s| {
                s.b.def_var(row, first);
                let rows = s.tile_cfg.rows.max(1);
                s.counted_loop(row, last, rows as i64, |s| s.tile(rows, vecs, lanes));
                s.counted_loop(row, last, 1, |s| s.tile(1, vecs, lanes));
            });
        }
    }

    /// `while var < hi { body(var, min(var + step, hi)); var += step }`.
    fn step_loop(&mut self, var: Variable, hi: Value, step: i64, body: impl FnOnce(&mut Self, Value, Value)) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let v = self.b.use_var(var);
        let go = self.b.ins().icmp(IntCC::SignedLessThan, v, hi);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        let v = self.b.use_var(var);
        let end = self.b.ins().iadd_imm_s(v, step);
        let end = self.b.ins().smin(end, hi);
        body(self, v, end);
        self.b.def_var(var, end);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// The steps of the innermost loop as (columns per step, vectors, lanes): two vectors at a time (two
    /// independent dependency chains for the out-of-order core; in a GEMM, a 4 x 8 register tile), one vector,
    /// then scalars. Bodies that can never run for this extent are not rendered.
    fn col_steps(&self) -> Vec<(usize, usize, usize)> {
        let innermost = self.k.out_extents.last().copied().unwrap_or(0);
        let mut steps = Vec::with_capacity(3);
        let vecs = if self.k.reduce.is_some() { self.tile_cfg.vecs } else { self.tile_cfg.elementwise_vecs }.max(1);
        if self.vec_ok && vecs > 1 && innermost >= vecs * LANES {
            steps.push((vecs * LANES, vecs, LANES));
        }
        if self.vec_ok {
            steps.push((LANES, 1, LANES));
        }
        steps.push((1, 1, 1));
        steps
    }

    /// The innermost output loop over `lo..hi`, for `rows` rows at once.
    fn col_loops(&mut self, lo: Value, hi: Value, rows: usize) {
        let var = self.vars[self.k.out_rank() - 1];
        self.b.def_var(var, lo);
        for (step, vecs, lanes) in self.col_steps() {
            self.counted_loop(var, hi, step as i64, |s| s.tile(rows, vecs, lanes));
        }
    }

    /// `while var + step <= hi { body; var += step }`, continuing from `var`'s current value.
    fn counted_loop(&mut self, var: Variable, hi: Value, step: i64, body: impl FnOnce(&mut Self)) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let v = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(v, step);
        let go = self.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        body(self);
        let v = self.b.use_var(var);
        let next = self.b.ins().iadd_imm_s(v, step);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// A `rows` x `vecs` tile of output elements, each `lanes` wide, at the current loop variables: the reduction
    /// (instructions that do not depend on the row or the column are emitted once for the tile, so a GEMM loads
    /// each B vector once per k for all rows and each A element once for all columns), then the outer code and
    /// the store of each element.
    fn tile(&mut self, rows: usize, vecs: usize, lanes: usize) {
        let k = self.k;
        let n = rows * vecs;
        let accs: Vec<Value> = match &k.reduce {
            Some(r) if self.reduce_vec => {
                debug_assert_eq!((rows, vecs, lanes), (1, 1, 1));
                let saved = self.col_dim;
                self.col_dim = Some(k.out_rank() + r.extents.len() - 1);
                let vacc = self.b.declare_var(ty(r.dtype, LANES));
                let sacc = self.b.declare_var(ty(r.dtype, 1));
                let (vinit, sinit) = (self.init(r.op, r.dtype, LANES), self.init(r.op, r.dtype, 1));
                self.b.def_var(vacc, vinit);
                self.b.def_var(sacc, sinit);
                self.reduce_loops_vec(0, vacc, sacc);
                self.col_dim = saved;
                let (v, mut s) = (self.b.use_var(vacc), self.b.use_var(sacc));
                for l in 0..LANES {
                    let x = self.b.ins().extractlane(v, l as u8);
                    s = self.fold(r.op, r.dtype, 1, s, x);
                }
                vec![s]
            }
            Some(r) => {
                let vars: Vec<Variable> = (0..n).map(|_| self.b.declare_var(ty(r.dtype, lanes))).collect();
                for &v in &vars {
                    let init = self.init(r.op, r.dtype, lanes);
                    self.b.def_var(v, init);
                }
                self.hoist_loads(&r.inner, lanes);
                self.reduce_loops(0, &vars, rows, vecs, lanes);
                self.hoisted.clear();
                vars.iter().map(|&v| self.b.use_var(v)).collect()
            }
            None => Vec::new(),
        };
        let deps = std::mem::take(&mut self.outer_deps);
        let vals = self.tile_insts(&k.outer, &deps, rows, vecs, lanes, &accs);
        self.outer_deps = deps;
        for (e, &v) in vals[k.result].iter().enumerate() {
            self.at = ((e / vecs) as i64, ((e % vecs) * lanes) as i64);
            let out_index = self.out_index.clone();
            let o = self.iexpr(&out_index, 0);
            let v = self.vector_of(v, k.output.dtype, lanes);
            self.store(o, v, lanes);
        }
        self.at = (0, 0);
    }

    /// Precomputes, for each unmasked affine load of the inner code, the part of its address that the reduction
    /// loops do not change, so the loop body adds only the reduce-variable part (strength reduction that
    /// Cranelift does not do across our nested loops).
    fn hoist_loads(&mut self, inner: &[Inst], lanes: usize) {
        let rank = self.k.out_rank();
        let nvars = self.vars.len();
        for (i, inst) in inner.iter().enumerate() {
            let InstOp::Load { buf, index, valid: None, .. } = &inst.op else { continue };
            if self.k.inputs[*buf].len == 0 {
                continue;
            }
            let Some((coef, c)) = index.affine(nvars) else { continue };
            let col = self.col_dim.map_or(0, |d| coef[d]);
            if lanes > 1 && !(col == 0 || (col == 1 && matches!(inst.dtype, DType::F32 | DType::I32))) {
                continue; // gathers keep the general path
            }
            let outer: Vec<i64> = (0..nvars).map(|v| if v < rank { coef[v] } else { 0 }).collect();
            let reduce: Vec<i64> = (0..nvars).map(|v| if v < rank { 0 } else { coef[v] }).collect();
            let p = self.iexpr(&IExpr::from_affine(&outer, c), 0);
            let bytes = self.b.ins().imul_imm_s(p, inst.dtype.size_of() as i64);
            let base = self.b.ins().iadd(self.bases[*buf], bytes);
            self.hoisted.insert(i, (base, IExpr::from_affine(&reduce, 0), coef));
        }
    }

    /// A hoisted load at the current tile offset.
    fn hoisted_load(&mut self, i: usize, d: DType, lanes: usize) -> Option<Value> {
        let (base, reduce, coef) = self.hoisted.get(&i).cloned()?;
        let col = self.col_dim.map_or(0, |c| coef[c]);
        let row = self.row_dim.map_or(0, |r| coef[r]);
        let offset = (row * self.at.0 + col * self.at.1) * d.size_of() as i64;
        let r = self.iexpr(&reduce, 0);
        let r = self.b.ins().imul_imm_s(r, d.size_of() as i64);
        let addr = self.b.ins().iadd(base, r);
        if lanes > 1 && col == 1 {
            return Some(self.b.ins().load(ty(d, lanes), vector_flags(), addr, offset as i32));
        }
        let v = self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, offset as i32);
        Some(if lanes > 1 { self.lanes_from_scalars(&[v], d, lanes) } else { v })
    }

    /// Reduce loops whose innermost loop runs 4 lanes at a time into `vacc`, then a scalar tail into `sacc`.
    fn reduce_loops_vec(&mut self, level: usize, vacc: Variable, sacc: Variable) {
        let r = self.k.reduce.as_ref().expect("reduce kernel");
        let var = self.vars[self.k.out_rank() + level];
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().iconst(types::I64, r.extents[level] as i64);
        self.b.def_var(var, zero);
        if level + 1 < r.extents.len() {
            self.counted_loop(var, n, 1, |s| s.reduce_loops_vec(level + 1, vacc, sacc));
            return;
        }
        let deps = std::mem::take(&mut self.inner_deps);
        for (lanes, acc) in [(LANES, vacc), (1, sacc)] {
            self.counted_loop(var, n, lanes as i64, |s| {
                let vals = s.tile_insts(&r.inner, &deps, 1, 1, lanes, &[]);
                let a = s.b.use_var(acc);
                let folded = s.fold(r.op, r.dtype, lanes, a, vals[r.value][0]);
                s.b.def_var(acc, folded);
            });
        }
        self.inner_deps = deps;
    }

    fn reduce_loops(&mut self, level: usize, accs: &[Variable], rows: usize, vecs: usize, lanes: usize) {
        let r = self.k.reduce.as_ref().expect("reduce kernel");
        if level == r.extents.len() {
            let deps = std::mem::take(&mut self.inner_deps);
            let vals = self.tile_insts(&r.inner, &deps, rows, vecs, lanes, &[]);
            self.inner_deps = deps;
            let fma_operands = match r.inner[r.value].op {
                InstOp::Binary(BinaryOp::Mul, x, y) if self.fma && r.op == ReduceOp::Sum && r.dtype.is_float() => {
                    Some((x, y))
                }
                _ => None,
            };
            for (e, &acc) in accs.iter().enumerate() {
                let a = self.b.use_var(acc);
                let folded = match fma_operands {
                    Some((x, y)) => {
                        let (x, y) =
                            (self.vector_of(vals[x][e], r.dtype, lanes), self.vector_of(vals[y][e], r.dtype, lanes));
                        self.b.ins().fma(x, y, a)
                    }
                    None => {
                        let x = self.vector_of(vals[r.value][e], r.dtype, lanes);
                        self.fold(r.op, r.dtype, lanes, a, x)
                    }
                };
                self.b.def_var(acc, folded);
            }
            return;
        }
        let var = self.vars[self.k.out_rank() + level];
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().iconst(types::I64, r.extents[level] as i64);
        self.b.def_var(var, zero);
        self.counted_loop(var, n, 1, |s| s.reduce_loops(level + 1, accs, rows, vecs, lanes));
    }

    fn init(&mut self, op: ReduceOp, d: DType, lanes: usize) -> Value {
        self.konst(op.identity(d), d, lanes)
    }

    fn fold(&mut self, op: ReduceOp, d: DType, lanes: usize, acc: Value, x: Value) -> Value {
        let b = match op {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Prod => BinaryOp::Mul,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
        };
        self.binary(b, d, lanes, acc, x)
    }

    fn konst(&mut self, s: Scalar, d: DType, lanes: usize) -> Value {
        let scalar = match d {
            DType::F32 => self.b.ins().f32const(s.as_f64() as f32),
            DType::F64 => self.b.ins().f64const(s.as_f64()),
            DType::Bool if lanes > 1 => self.b.ins().iconst(types::I32, if s.as_f64() != 0.0 { -1 } else { 0 }),
            DType::Bool => self.b.ins().iconst(types::I8, (s.as_f64() != 0.0) as i64),
            DType::U8 => self.b.ins().iconst(types::I8, s.as_i64() as u8 as i64),
            DType::I32 => self.b.ins().iconst(types::I32, s.as_i64() as i32 as i64),
            DType::I64 => self.b.ins().iconst(types::I64, s.as_i64()),
        };
        if lanes > 1 { self.b.ins().splat(ty(d, lanes), scalar) } else { scalar }
    }

    /// The scalar value of an index expression at the current tile offset, with the column advanced by `lane`.
    fn iexpr(&mut self, e: &IExpr, lane: i64) -> Value {
        match e {
            IExpr::Var(v) => {
                let x = self.b.use_var(self.vars[*v]);
                let mut off = 0;
                if Some(*v) == self.row_dim {
                    off += self.at.0;
                }
                if Some(*v) == self.col_dim {
                    off += self.at.1 + lane;
                }
                if off != 0 { self.b.ins().iadd_imm_s(x, off) } else { x }
            }
            IExpr::Const(c) => self.b.ins().iconst(types::I64, *c),
            IExpr::Add(ts) => {
                let mut acc: Option<Value> = None;
                for t in ts {
                    let v = self.iexpr(t, lane);
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.b.ins().iadd(a, v),
                    });
                }
                acc.unwrap_or_else(|| self.b.ins().iconst(types::I64, 0))
            }
            IExpr::Mul(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().imul_imm_s(x, *k)
            }
            // Index values are non-negative by construction, so unsigned division is floor division.
            IExpr::Div(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().udiv_imm_u(x, *k)
            }
            IExpr::Mod(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().urem_imm_u(x, *k)
            }
        }
    }

    /// A bool (i8 0/1) saying whether every range of `valid` holds at `lane`.
    fn valid(&mut self, valid: &Valid, lane: i64) -> Value {
        let mut ok = self.b.ins().iconst(types::I8, 1);
        for (e, lo, hi) in &valid.0 {
            let x = self.iexpr(e, lane);
            let a = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, x, *lo);
            let c = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, *hi);
            let both = self.b.ins().band(a, c);
            ok = self.b.ins().band(ok, both);
        }
        ok
    }

    /// A scalar element load of `buf[index]` at `lane`, honouring `valid` (the index is clamped to 0 and the
    /// value replaced by `fill` where invalid, so no load ever leaves the buffer).
    fn load_scalar(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lane: i64,
    ) -> Value {
        let mut i = self.iexpr(index, lane);
        let ok = valid.as_ref().map(|v| self.valid(v, lane));
        if let Some(ok) = ok {
            let zero = self.b.ins().iconst(types::I64, 0);
            i = self.b.ins().select(ok, i, zero);
        }
        let addr = self.b.ins().imul_imm_s(i, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.bases[buf], addr);
        let v = self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, 0);
        match ok {
            Some(ok) => {
                let f = self.konst(fill, d, 1);
                self.b.ins().select(ok, v, f)
            }
            None => v,
        }
    }

    fn load(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lanes: usize,
    ) -> Value {
        if self.k.inputs[buf].len == 0 {
            return self.konst(fill, d, lanes); // an empty buffer is never read; its pointer may dangle
        }
        if lanes == 1 {
            return self.load_scalar(buf, index, valid, fill, d, 0);
        }
        let col = self.col_dim.expect("vector code has a column dim");
        let coef = index.affine(self.vars.len()).map(|(c, _)| c[col]);
        match (coef, valid, d) {
            (Some(0), None, _) => {
                let s = self.load_scalar(buf, index, valid, fill, d, 0);
                self.lanes_from_scalars(&[s], d, lanes)
            }
            (Some(1), None, DType::F32 | DType::I32) => {
                let i = self.iexpr(index, 0);
                let addr = self.b.ins().imul_imm_s(i, 4);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                self.b.ins().load(ty(d, lanes), vector_flags(), addr, 0)
            }
            _ => {
                let scalars: Vec<Value> =
                    (0..lanes as i64).map(|l| self.load_scalar(buf, index, valid, fill, d, l)).collect();
                self.lanes_from_scalars(&scalars, d, lanes)
            }
        }
    }

    /// `v` as a `lanes`-wide value: unchanged if it already is one, else splatted (a uniform scalar).
    fn vector_of(&mut self, v: Value, d: DType, lanes: usize) -> Value {
        if lanes == 1 || self.b.func.dfg.value_type(v).is_vector() {
            v
        } else {
            self.lanes_from_scalars(&[v], d, lanes)
        }
    }

    /// Builds a vector from one scalar (splat) or one scalar per lane; bool bytes become lane masks.
    fn lanes_from_scalars(&mut self, scalars: &[Value], d: DType, lanes: usize) -> Value {
        let conv = |s: &mut Self, v: Value| -> Value {
            if d == DType::Bool {
                let w = s.b.ins().uextend(types::I32, v);
                s.b.ins().ineg(w)
            } else {
                v
            }
        };
        let vt = ty(d, lanes);
        if let [one] = scalars {
            let v = conv(self, *one);
            return self.b.ins().splat(vt, v);
        }
        let first = conv(self, scalars[0]);
        let mut vec = self.b.ins().splat(vt, first);
        for (l, &s) in scalars.iter().enumerate().skip(1) {
            let v = conv(self, s);
            vec = self.b.ins().insertlane(vec, v, l as u8);
        }
        vec
    }

    fn store(&mut self, o: Value, v: Value, lanes: usize) {
        let d = self.k.output.dtype;
        let addr = self.b.ins().imul_imm_s(o, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.out_ptr, addr);
        match (d, lanes) {
            (_, 1) => {
                self.b.ins().store(MemFlagsData::trusted(), v, addr, 0);
            }
            (DType::Bool, _) => {
                for l in 0..lanes {
                    let x = self.b.ins().extractlane(v, l as u8);
                    let x = self.b.ins().band_imm_s(x, 1);
                    self.b.ins().istore8(MemFlagsData::trusted(), x, addr, l as i32);
                }
            }
            _ => {
                self.b.ins().store(vector_flags(), v, addr, 0);
            }
        }
    }

    fn libcall(&mut self, l: Libcall, args: &[Value]) -> Value {
        let f = match self.libcalls.get(&l) {
            Some(&f) => f,
            None => {
                let sig = self.b.import_signature(l.signature(self.call_conv));
                let name = self.b.func.declare_imported_user_function(UserExternalName::new(0, l.index()));
                let f = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature: sig,
                    colocated: false,
                    patchable: false,
                });
                self.libcalls.insert(l, f);
                f
            }
        };
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// Applies a scalar operation lane by lane (for ops with no vector instruction).
    fn per_lane(
        &mut self,
        args: &[Value],
        arg_d: DType,
        out_d: DType,
        lanes: usize,
        f: impl Fn(&mut Self, &[Value]) -> Value,
    ) -> Value {
        if lanes == 1 {
            return f(self, args);
        }
        let mut out = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let xs: Vec<Value> = args
                .iter()
                .map(|&a| {
                    let x = self.b.ins().extractlane(a, l as u8);
                    if arg_d == DType::Bool { self.b.ins().ireduce(types::I8, x) } else { x }
                })
                .collect();
            out.push(f(self, &xs));
        }
        let out: Vec<Value> =
            out.into_iter().map(|v| if out_d == DType::Bool { self.b.ins().band_imm_s(v, 1) } else { v }).collect();
        self.lanes_from_scalars(&out, out_d, lanes)
    }

    /// Emits `insts` for every element of a `rows` x `vecs` tile. Returns, per instruction, its value for each
    /// element (row-major in the tile). An instruction that does not depend on the row (or column) is emitted once
    /// and its value shared along that axis. `accs` holds each element's finished reduction.
    fn tile_insts(
        &mut self,
        insts: &[Inst],
        deps: &[(bool, bool)],
        rows: usize,
        vecs: usize,
        lanes: usize,
        accs: &[Value],
    ) -> Vec<Vec<Value>> {
        let n = rows * vecs;
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(insts.len());
        for (i, inst) in insts.iter().enumerate() {
            let (dr, dc) = deps[i];
            let mut per: Vec<Value> = Vec::with_capacity(n);
            for e in 0..n {
                let (r, c) = (e / vecs, e % vecs);
                // The element whose value this one shares (itself if it depends on both axes).
                let owner = if dr { r } else { 0 } * vecs + if dc { c } else { 0 };
                if owner != e {
                    per.push(per[owner]);
                    continue;
                }
                self.at = (r as i64, (c * lanes) as i64);
                // A value that does not vary along the vector lanes is computed once, as a scalar.
                let l = if lanes > 1 && !self.reduce_vec && !dc { 1 } else { lanes };
                let v = match self.hoisted_load(i, inst.dtype, l) {
                    Some(v) if matches!(inst.op, InstOp::Load { .. }) => v,
                    _ => self.inst(inst, insts, &vals, e, l, accs.get(e).copied()),
                };
                per.push(v);
            }
            vals.push(per);
        }
        self.at = (0, 0);
        vals
    }

    /// One instruction for tile element `e` (at `self.at`); operands come from `vals[..][e]`.
    fn inst(
        &mut self,
        inst: &Inst,
        insts: &[Inst],
        vals: &[Vec<Value>],
        e: usize,
        lanes: usize,
        acc: Option<Value>,
    ) -> Value {
        let d = inst.dtype;
        let operands: Vec<usize> = match &inst.op {
            InstOp::Unary(_, a) | InstOp::Cast(a) => vec![*a],
            InstOp::Binary(_, x, y) => vec![*x, *y],
            InstOp::Where(c, a, b) => vec![*c, *a, *b],
            _ => Vec::new(),
        };
        let mut ready: Vec<(usize, Value)> = Vec::with_capacity(operands.len());
        for &i in &operands {
            let v = self.vector_of(vals[i][e], insts[i].dtype, lanes);
            ready.push((i, v));
        }
        let val = |i: usize| ready.iter().find(|(j, _)| *j == i).map_or(vals[i][e], |&(_, v)| v);
        match &inst.op {
            InstOp::Const(s) => self.konst(*s, d, lanes),
            InstOp::Index(x) => {
                debug_assert_eq!(lanes, 1, "index values are scalar-only");
                let x = self.iexpr(x, 0);
                self.int_resize(x, DType::I64, d)
            }
            InstOp::Load { buf, index, valid, fill } => self.load(*buf, index, valid, *fill, d, lanes),
            InstOp::Rand { dist, slot, index } => {
                let i = self.iexpr(index, 0);
                let seed = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16) as i32);
                let off = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16 + 8) as i32);
                let i = self.b.ins().iadd(off, i);
                match (dist, d) {
                    (RandDist::Uniform, DType::F32) => self.libcall(Libcall::UniformF32, &[seed, i]),
                    (RandDist::Uniform, _) => self.libcall(Libcall::UniformF64, &[seed, i]),
                    (RandDist::Normal, DType::F32) => {
                        let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                        self.b.ins().fdemote(types::F32, x)
                    }
                    (RandDist::Normal, _) => self.libcall(Libcall::NormalF64, &[seed, i]),
                }
            }
            InstOp::Unary(u, a) => self.unary(*u, d, lanes, val(*a)),
            InstOp::Binary(op, x, y) => self.binary(*op, insts[*x].dtype, lanes, val(*x), val(*y)),
            InstOp::Where(c, a, b) => {
                if lanes == 1 {
                    self.b.ins().select(val(*c), val(*a), val(*b))
                } else {
                    let mask = if d == DType::F32 {
                        let little = MemFlagsData::new().with_endianness(Endianness::Little);
                        self.b.ins().bitcast(types::F32X4, little, val(*c))
                    } else {
                        val(*c)
                    };
                    self.b.ins().bitselect(mask, val(*a), val(*b))
                }
            }
            InstOp::Cast(a) => self.cast(insts[*a].dtype, d, lanes, val(*a)),
            InstOp::Acc => acc.expect("acc only in reduce kernels"),
        }
    }

    fn unary(&mut self, u: UnaryOp, d: DType, lanes: usize, a: Value) -> Value {
        if let Some(l) = Libcall::unary(u, d) {
            return self.transcendental(u, l, d, lanes, a);
        }
        let ins = self.b.ins();
        match (u, d.is_float()) {
            (UnaryOp::Neg, true) => ins.fneg(a),
            (UnaryOp::Neg, false) => ins.ineg(a),
            (UnaryOp::Abs, true) => ins.fabs(a),
            (UnaryOp::Abs, false) if matches!(d, DType::U8 | DType::Bool) => a, // unsigned: iabs would read i8
            (UnaryOp::Abs, false) => ins.iabs(a),
            (UnaryOp::Sqrt, _) => ins.sqrt(a),
            (UnaryOp::Recip, _) => {
                let one = self.konst(Scalar::Float(1.0), d, lanes);
                self.b.ins().fdiv(one, a)
            }
            (UnaryOp::Not, _) if lanes == 1 => ins.bxor_imm_s(a, 1),
            (UnaryOp::Not, _) => ins.bnot(a),
            (op, _) => unreachable!("unary {op:?} on {d}"),
        }
    }

    /// exp/log/sin/cos/tanh inline from `clif_math` (the same polynomial in vector and scalar code, so an element's
    /// value does not depend on whether it fell in a vector body or a tail). sin/cos beyond the range where the
    /// reduction is accurate branch to the libcall for the whole vector; that branch is never taken in practice.
    fn transcendental(&mut self, u: UnaryOp, l: Libcall, d: DType, lanes: usize, a: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        let f = match u {
            UnaryOp::Exp => clif_math::MathFn::Exp,
            UnaryOp::Log => clif_math::MathFn::Log,
            UnaryOp::Sin => clif_math::MathFn::Sin,
            UnaryOp::Cos => clif_math::MathFn::Cos,
            UnaryOp::Tanh => clif_math::MathFn::Tanh,
            _ => unreachable!("{u:?} is not transcendental"),
        };
        let fast = clif_math::emit(f, &mut self.b, a, t, self.fma);
        if !matches!(u, UnaryOp::Sin | UnaryOp::Cos) {
            return fast;
        }
        let max = if d == DType::F64 { clif_math::F64_TRIG_MAX_ARG } else { clif_math::F32_TRIG_MAX_ARG };
        let limit = self.konst(Scalar::Float(max), d, lanes);
        let abs = self.b.ins().fabs(a);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, abs, limit);
        let any = if lanes > 1 { self.b.ins().vany_true(big) } else { big };
        let slow_block = self.b.create_block();
        let merge = self.b.create_block();
        let result = self.b.append_block_param(merge, t);
        self.b.ins().brif(any, slow_block, &[], merge, &[fast.into()]);
        self.b.switch_to_block(slow_block);
        self.b.seal_block(slow_block);
        let slow = self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
        self.b.ins().jump(merge, &[slow.into()]);
        self.b.switch_to_block(merge);
        self.b.seal_block(merge);
        result
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    fn binary(&mut self, op: BinaryOp, d: DType, lanes: usize, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        let unsigned = matches!(d, DType::U8 | DType::Bool);
        if d.is_float() {
            let cmp = |cc| -> Option<FloatCC> { Some(cc) };
            let cc = match op {
                Lt => cmp(FloatCC::LessThan),
                Le => cmp(FloatCC::LessThanOrEqual),
                Eq => cmp(FloatCC::Equal),
                Ne => cmp(FloatCC::NotEqual),
                _ => None,
            };
            if let Some(cc) = cc {
                return self.b.ins().fcmp(cc, x, y);
            }
            return match op {
                Add => self.b.ins().fadd(x, y),
                Sub => self.b.ins().fsub(x, y),
                Mul => self.b.ins().fmul(x, y),
                Div => self.b.ins().fdiv(x, y),
                Max => self.b.ins().fmax(x, y),
                Min => self.b.ins().fmin(x, y),
                Pow => {
                    let l = if d == DType::F64 { Libcall::PowF64 } else { Libcall::PowF32 };
                    self.per_lane(&[x, y], d, d, lanes, |s, a| s.libcall(l, a))
                }
                And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on floats"),
            };
        }
        let cc = match op {
            Lt if unsigned => Some(IntCC::UnsignedLessThan),
            Le if unsigned => Some(IntCC::UnsignedLessThanOrEqual),
            Lt => Some(IntCC::SignedLessThan),
            Le => Some(IntCC::SignedLessThanOrEqual),
            Eq => Some(IntCC::Equal),
            Ne => Some(IntCC::NotEqual),
            _ => None,
        };
        if let Some(cc) = cc {
            // Vector compares give lane masks, scalar compares 0/1 bytes: both are this backend's bools.
            return self.b.ins().icmp(cc, x, y);
        }
        let is_bool = d == DType::Bool;
        match op {
            Add | Or if is_bool => self.b.ins().bor(x, y),
            Mul | And if is_bool => self.b.ins().band(x, y),
            Max if is_bool => self.b.ins().bor(x, y),
            Min if is_bool => self.b.ins().band(x, y),
            Add => self.b.ins().iadd(x, y),
            Sub => self.b.ins().isub(x, y),
            Mul => self.b.ins().imul(x, y),
            Max if unsigned => self.b.ins().umax(x, y),
            Min if unsigned => self.b.ins().umin(x, y),
            Max => self.b.ins().smax(x, y),
            Min => self.b.ins().smin(x, y),
            Div => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned)),
            Pow => self.per_lane(&[x, y], d, d, lanes, |s, a| {
                let wide = [s.int_resize(a[0], d, DType::I64), s.int_resize(a[1], d, DType::I64)];
                let r = s.libcall(Libcall::PowI64, &wide);
                s.int_resize(r, DType::I64, d)
            }),
            And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on {d}"),
        }
    }

    /// Integer division that never traps: x / 0 == 0 and MIN / -1 wraps to MIN.
    fn safe_div(&mut self, x: Value, y: Value, unsigned: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let zero = self.b.ins().iconst(t, 0);
        let one = self.b.ins().iconst(t, 1);
        let is_zero = self.b.ins().icmp(IntCC::Equal, y, zero);
        let safe = self.b.ins().select(is_zero, one, y);
        if unsigned {
            let q = self.b.ins().udiv(x, safe);
            return self.b.ins().select(is_zero, zero, q);
        }
        let is_neg_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
        let safe = self.b.ins().select(is_neg_one, one, safe);
        let q = self.b.ins().sdiv(x, safe);
        let neg = self.b.ins().ineg(x);
        let q = self.b.ins().select(is_neg_one, neg, q);
        self.b.ins().select(is_zero, zero, q)
    }

    /// Converts a scalar integer between int dtypes (wrapping when narrowing; bool means != 0).
    fn int_resize(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        if to == DType::Bool {
            return self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0);
        }
        let (ft, tt) = (ty(from, 1), ty(to, 1));
        if ft.bits() == tt.bits() {
            v
        } else if ft.bits() > tt.bits() {
            self.b.ins().ireduce(tt, v)
        } else if matches!(from, DType::U8 | DType::Bool) {
            self.b.ins().uextend(tt, v)
        } else {
            self.b.ins().sextend(tt, v)
        }
    }

    fn cast(&mut self, from: DType, to: DType, lanes: usize, v: Value) -> Value {
        if from == to {
            return v;
        }
        if lanes > 1 {
            return match (from, to) {
                (DType::I32, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, v),
                (DType::Bool, DType::F32) => {
                    let (one, zero) =
                        (self.konst(Scalar::Float(1.0), to, lanes), self.konst(Scalar::Float(0.0), to, lanes));
                    let m =
                        self.b.ins().bitcast(types::F32X4, MemFlagsData::new().with_endianness(Endianness::Little), v);
                    self.b.ins().bitselect(m, one, zero)
                }
                (DType::Bool, DType::I32) => {
                    let one = self.konst(Scalar::Int(1), to, lanes);
                    self.b.ins().band(v, one)
                }
                (DType::F32, DType::Bool) => {
                    let zero = self.konst(Scalar::Float(0.0), from, lanes);
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                }
                (DType::I32, DType::Bool) => {
                    let zero = self.konst(Scalar::Int(0), from, lanes);
                    self.b.ins().icmp(IntCC::NotEqual, v, zero)
                }
                // float -> int saturates through i64 then wraps; do it lane by lane to match the spec exactly.
                _ => self.per_lane(&[v], from, to, lanes, |s, x| s.cast(from, to, 1, x[0])),
            };
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if to == DType::F64 {
                    self.b.ins().fpromote(types::F64, v)
                } else {
                    self.b.ins().fdemote(types::F32, v)
                }
            }
            (true, false) if to == DType::Bool => {
                let zero = self.konst(Scalar::Float(0.0), from, 1);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (true, false) => {
                let wide = self.b.ins().fcvt_to_sint_sat(types::I64, v);
                self.int_resize(wide, DType::I64, to)
            }
            (false, true) => {
                let t = ty(to, 1);
                if matches!(from, DType::U8 | DType::Bool) {
                    self.b.ins().fcvt_from_uint(t, v)
                } else {
                    self.b.ins().fcvt_from_sint(t, v)
                }
            }
            (false, false) => self.int_resize(v, from, to),
        }
    }
}
