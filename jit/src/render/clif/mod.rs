//! Kernel IR -> Cranelift IR (CLIF), for the CPU backend.
//!
//! Every kernel becomes `fn(args: *const *mut u8, rng: *const u64, start: i64, end: i64)`: `args` holds the
//! input pointers then the output pointer (then, for a kernel that gathers, the run's fault record: see
//! `kernel::fault`), `rng` holds (seed, offset) pairs, and the function computes rows
//! `start..end` of output loop 0 (all of it for a zero-dim output), so the backend can split rows over threads.
//!
//! Files: this one decides per kernel (which loop to vectorize, whether to register-tile) and holds the emitter;
//! `loops.rs` writes the loop nests, tiles and reductions; `values.rs` is the one table of code per instruction,
//! written once for any lane count, over `access.rs`'s indices, loads, gathers and stores; `libcall.rs` lists the
//! host functions a kernel may call.
//!
//! Vectorization is 4 lanes (f32x4, the widest Cranelift emits on x86-64) with scalar tails, along one of:
//! - the innermost output loop, when every value varying along it is f16, f32, i32, u32 or bool (uniform values of
//!   other dtypes stay scalar and are splatted); elementwise kernels run several vectors per iteration, and reduce
//!   kernels with two or more output dims are register-tiled like a GEMM micro-kernel (`TileConfig`);
//! - the innermost reduce loop, when inputs are contiguous along it but not along the output (`reduce_vectorizable`).
//!
//! Loads whose index moves by 1 along the vectorized loop are vector loads, by 0 are splats, otherwise gathers. Bools
//! are 0/1 bytes in memory and scalar code, all-ones/zero lane masks in vector code. f16 values are 16-bit words in
//! memory and f32 in registers, rounded to f16 after every op (`half.rs`).
//!
//! exp, log, sin, cos and tanh are inlined polynomials from `clif_math` (1-3 ulp, documented there); `pow`, random
//! numbers and out-of-range trig arguments are calls to `Libcall`s, which the backend binds to Rust functions.
//!
//! Semantics are those of `kernel::eval` (the executable spec): ints wrap, integer division by zero gives 0,
//! float -> int casts saturate through i64 then wrap, max/min propagate NaN, comparisons with NaN are false except
//! `!=`.

use crate::dtype::{DType, Scalar};
use crate::kernel::{IExpr, Inst, InstOp, KernelIr, Reduce, Valid};
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

mod access;
mod half;
mod libcall;
mod loops;
mod values;

pub use libcall::Libcall;

/// The renderer's revision, part of every compiled-kernel cache key: bump it when a renderer change alters the code
/// of an unchanged kernel IR, so kernels cached on disk by an earlier build of the same kiln version are not mapped
/// in place of the new code. 2: a tile's column offset is the load/store displacement. 3: u32 and f16, and bool
/// lanes built from per-lane code are 0/1 (they were 0/0xFF). 4: f32 sin/cos with FMA reduce modulo pi. 5: what
/// depends on no loop variable is computed once, before the loops. 6: what depends only on outer loops is computed
/// once per row of an untiled kernel. 7: a reduction vectorized along its reduce loop keeps four accumulators.
/// 8: a masked load whose ranges do not move along the vector is one vector load. 9: one whose affine ranges
/// move along it is a vector load where the whole vector is inside. 10: a gather with one index for every lane
/// along its row is one check and one vector load, and a reduction that gathers so vectorizes along its reduce loop.
/// 11: an elementwise kernel of fewer than `loops::UNROLL_MIN_ELEMENTS` elements has no unrolled body. 12: a
/// column sum walks strips of `TileConfig::column_vecs` vectors.
pub const REVISION: u32 = 12;

/// The kernel entry signature.
pub fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    sig.params.extend([types::I64; 4].map(AbiParam::new));
    sig
}

/// Lanes of the vectorized innermost loop.
const LANES: usize = 4;

/// Independent vector accumulators of a reduction vectorized along its reduce loop (see `reduce_loops_vec`).
const REDUCE_VECS: usize = 4;

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
    let ok = |insts: &[Inst]| {
        let deps = deps(insts, rank, k.row_rank);
        insts
            .iter()
            .zip(&deps)
            .all(|(i, &(_, varies))| !varies || (has_lanes(i.dtype) && !matches!(i.op, InstOp::Rand { .. })))
    };
    let inner_ok = k.reduce.as_ref().is_none_or(|r| has_lanes(r.dtype) && ok(&r.inner));
    has_lanes(k.output.dtype) && ok(&k.outer) && inner_ok
}

/// Whether `r` folds 4 lanes at a time along its innermost reduce loop (`reduce_loops_vec`): an f32 or 32-bit int
/// accumulator, every inner value in the lane model, and a loop of at least one vector.
fn lanes_fold(r: &Reduce) -> bool {
    let lanes_ok = |i: &Inst| has_lanes(i.dtype) && !matches!(i.op, InstOp::Rand { .. });
    matches!(r.dtype, DType::F32 | DType::I32 | DType::U32)
        && r.inner.iter().all(lanes_ok)
        && r.extents.last().is_some_and(|&e| e >= LANES)
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
    /// Vectors per strip of an untiled reduction vectorized along its output (a column sum, `[rows, cols] ->
    /// [cols]`, as a bias gradient is): each strip walks the reduce loop down the rows, so a strip of 2 vectors
    /// used half of each 64-byte line it fetched per row (the other half a strip later, by then out of L1) and
    /// kept two add chains; 8 vectors read two whole lines a row and keep eight.
    pub column_vecs: usize,
}

impl Default for TileConfig {
    /// 4 x 2 f32x4 accumulators + 2 column loads + 1 broadcast = 11 of the 16 xmm registers; 64 rows of A at
    /// K = 1024 f32 are 256 KiB, which stays in L2. Six vectors per elementwise iteration: measured on
    /// `sin(a)^2 * b + c` over 16M f32 (bench_table), 2 -> 19.2 ms, 4 -> 18.0, 6 -> 17.4, 8 -> 17.1-18.6.
    fn default() -> Self {
        TileConfig { rows: 4, vecs: 2, block_rows: 64, elementwise_vecs: 6, column_vecs: 8 }
    }
}

/// Whether a reduce kernel should run its innermost reduce loop 4 lanes at a time (partial results per lane,
/// folded across lanes at the end) rather than its innermost output loop. That is the better choice when its
/// inputs are contiguous along the reduction and not along the output: a sum over the last axis, or a matmul with
/// a transposed right operand (`x.matmul(&w.t())`, every linear layer), which vectorized over the output would load
/// every lane separately.
///
/// A kernel that gathers qualifies where each gather reads along the reduce loop with one index per vector (an
/// embedding's rows summed: `sum(embedding(ids, table) * dy)`): the index, and only the index, may be an i64 value
/// that does not vary along the loop (computed once per vector, as a scalar), and the gather reads f32 or 32-bit
/// ints contiguous along it without a mask (`Emitter::gather_row`: one check and one vector load).
pub fn reduce_vectorizable(k: &KernelIr) -> bool {
    let Some(r) = &k.reduce else { return false };
    let rank = k.out_rank();
    let nvars = rank + r.extents.len();
    let last = nvars - 1;
    if r.dtype != DType::F32 || r.extents.last().copied().unwrap_or(0) < LANES || !reduce_values_vectorizable(k, r) {
        return false;
    }
    let mut contiguous_reduce = false;
    let mut output_gather = false;
    for inst in &r.inner {
        let index = match &inst.op {
            InstOp::Load { index, .. } => index,
            InstOp::Gather { base, valid: None, .. } if matches!(inst.dtype, DType::F32 | DType::I32 | DType::U32) => {
                base
            }
            InstOp::Gather { .. } => return false,
            _ => continue,
        };
        let Some((coef, _)) = index.affine(nvars) else { return false };
        match (coef[last], &inst.op) {
            (0, InstOp::Load { .. }) => {}
            (1, _) => contiguous_reduce = true,
            _ => return false,
        }
        if rank > 0 && !matches!(coef[rank - 1], 0 | 1) {
            output_gather = true;
        }
    }
    let narrow_output = k.out_extents.last().is_none_or(|&e| e < LANES);
    contiguous_reduce && (output_gather || narrow_output)
}

/// Whether every value of `k` fits the lane model when reduce `r`'s innermost loop is vectorized: every buffer the
/// lanes read and every value, but for values without lanes that do not vary along that loop and are read only as
/// a gather's index (a row of an embedding, picked by an i64 id).
fn reduce_values_vectorizable(k: &KernelIr, r: &Reduce) -> bool {
    let ok_inst = |i: &Inst| has_lanes(i.dtype) && !matches!(i.op, InstOp::Rand { .. });
    let rank = k.out_rank();
    let varies = deps_on(&r.inner, None, Some(rank + r.extents.len() - 1), k.row_rank);
    let only_an_index = |at: usize| {
        r.value != at
            && r.inner.iter().all(|i| match &i.op {
                InstOp::Gather { index, .. } => *index == at || !i.operands().contains(&at),
                _ => !i.operands().contains(&at),
            })
    };
    let inner_ok = matches!(r.dtype, DType::F32 | DType::I32 | DType::U32 | DType::Bool)
        && r.inner
            .iter()
            .enumerate()
            .all(|(at, i)| ok_inst(i) || (!varies[at].1 && !matches!(i.op, InstOp::Rand { .. }) && only_an_index(at)));
    has_lanes(k.output.dtype) && k.outer.iter().all(ok_inst) && inner_ok
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
    let fault = k.can_fault().then(|| b.ins().load(types::I64, trusted, args, ((k.inputs.len() + 1) * 8) as i32));
    let nvars = k.extents().len();
    let vars: Vec<Variable> = (0..nvars).map(|_| b.declare_var(types::I64)).collect();
    let rank = k.out_rank();
    let strides = crate::shape::contiguous_strides(&k.out_extents);
    let out_index =
        IExpr::from_affine(&(0..nvars).map(|v| if v < rank { strides[v] as i64 } else { 0 }).collect::<Vec<_>>(), 0);
    // A vector body only pays when the innermost loop has at least one full vector; rendering it for a smaller
    // extent would only cost compile time (a polynomial sin is hundreds of instructions).
    let innermost = k.out_extents.last().copied().unwrap_or(0);
    // A row kernel's reduce stage (one output per row) folds along its reduce loop, as its row reductions do (not
    // one that gathers: its per-lane gathers are written for lanes along the output loop).
    let reduce_vec = opts.vectorize
        && (reduce_vectorizable(k)
            || !k.can_fault() && k.reduce.as_ref().is_some_and(|r| !k.rows.is_empty() && lanes_fold(r)));
    // A row kernel vectorizes along its row's elements only (a vector never spans two rows), and is not tiled.
    let rows_apart = k.rows.is_empty() || k.row_rank < rank;
    let vec_ok = !reduce_vec && opts.vectorize && vectorizable(k) && innermost >= LANES && rows_apart;
    let tiled = vec_ok && rank >= 2 && k.reduce.is_some() && k.rows.is_empty();
    let mut em = Emitter {
        b,
        k,
        bases,
        out_ptr,
        fault,
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
        inner_deps: k.reduce.as_ref().map_or(Vec::new(), |r| deps(&r.inner, rank, k.row_rank)),
        outer_deps: deps(&k.outer, rank, k.row_rank),
        vectorize: opts.vectorize,
        row_accs: Vec::new(),
        hoisted: HashMap::new(),
        uniform_loads: HashMap::new(),
        uniform_insts: HashMap::new(),
        splats: HashMap::new(),
        row_insts: HashMap::new(),
    };
    em.compute_uniforms();
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
fn deps(insts: &[Inst], rank: usize, row_rank: usize) -> Vec<(bool, bool)> {
    deps_on(insts, rank.checked_sub(2), rank.checked_sub(1), row_rank)
}

/// For each instruction: does it depend on loop variable `row`, on `col`? (A row reduction's value depends on the
/// first `row_rank` output loops.)
fn deps_on(insts: &[Inst], row: Option<usize>, col: Option<usize>, row_rank: usize) -> Vec<(bool, bool)> {
    let mentions = |e: &IExpr, v: Option<usize>| v.is_some_and(|v| mentions_var(e, v));
    let of_row = |v: Option<usize>| v.is_some_and(|v| v < row_rank);
    let mut out: Vec<(bool, bool)> = Vec::with_capacity(insts.len());
    for inst in insts {
        let d = match &inst.op {
            InstOp::Const(_) => (false, false),
            InstOp::Acc => (true, true),
            InstOp::RowAcc(_) => (of_row(row), of_row(col)),
            InstOp::Index(_) | InstOp::Rand { .. } | InstOp::Load { .. } => {
                let any = |v| inst.indices().iter().any(|e| mentions(e, v));
                (any(row), any(col))
            }
            // Its index expressions, and the index value it reads.
            InstOp::Gather { index, .. } => {
                let any = |v| inst.indices().iter().any(|e| mentions(e, v));
                (any(row) || out[*index].0, any(col) || out[*index].1)
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
        IExpr::Mul(x, _) | IExpr::Div(x, _) | IExpr::Mod(x, _) | IExpr::Wrap(x, _) => mentions_var(x, v),
    }
}

struct Emitter<'a> {
    b: FunctionBuilder<'a>,
    k: &'a KernelIr,
    bases: Vec<Value>,
    out_ptr: Value,
    /// The run's fault record, for a kernel that gathers.
    fault: Option<Value>,
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
    /// Loads at a constant index (a scalar operand: a learning rate, a scale), read once in the entry block:
    /// (buffer, index) -> value.
    uniform_loads: HashMap<(usize, i64), Value>,
    /// Outer instructions that depend on no loop variable (constant-index loads and the ops on them), computed once
    /// in the entry block, keyed by the instruction's address in `k.outer`.
    uniform_insts: HashMap<*const Inst, Value>,
    /// The vector splat of each uniform value, made in the entry block too: (scalar, lanes) -> vector.
    splats: HashMap<(Value, usize), Value>,
    /// Outer instructions of an untiled kernel that depend on no loop variable but outer ones (a per-row operand
    /// of a broadcast, and the ops on it): computed once per row, before the innermost loop, keyed as
    /// `uniform_insts` (their splats go to `splats`). Empty outside a row's body.
    row_insts: HashMap<*const Inst, Value>,
    /// `RenderOptions::vectorize`.
    vectorize: bool,
    /// The current row's finished row reductions (scalars), while its code is emitted (see `fold_rows`).
    row_accs: Vec<Value>,
}

impl Emitter<'_> {
    /// Computes, before any loop, what does not change inside them: every constant-index unmasked load (outer and
    /// inner code), every outer instruction computed only from those and constants, and the splats vector code
    /// uses. Cranelift neither moves loads out of loops nor, in this version, the pure ops on them: an SGD update
    /// loaded its f64 learning rate, converted it to f32 and splatted it once per 4-lane vector. Empty buffers are
    /// never read (their pointer may dangle).
    fn compute_uniforms(&mut self) {
        let k = self.k;
        let inner = k.reduce.as_ref().map_or(&[][..], |r| &r.inner[..]);
        for inst in k.outer.iter().chain(inner) {
            let InstOp::Load { buf, index: IExpr::Const(c), valid: None, fill } = &inst.op else { continue };
            if k.inputs[*buf].len == 0 || self.uniform_loads.contains_key(&(*buf, *c)) {
                continue;
            }
            let v = self.load_scalar(*buf, &IExpr::Const(*c), &None, *fill, inst.dtype, 0);
            self.uniform_loads.insert((*buf, *c), v);
        }
        let mut uniform = vec![false; k.outer.len()];
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(k.outer.len());
        for (i, inst) in k.outer.iter().enumerate() {
            uniform[i] = match &inst.op {
                InstOp::Load { buf, index: IExpr::Const(c), valid: None, .. } => {
                    self.uniform_loads.contains_key(&(*buf, *c))
                }
                InstOp::Unary(_, a) | InstOp::Cast(a) => uniform[*a],
                InstOp::Binary(_, a, b) => uniform[*a] && uniform[*b],
                InstOp::Where(c, a, b) => uniform[*c] && uniform[*a] && uniform[*b],
                // Constants are rendered where used (an immediate); everything else depends on a loop variable.
                InstOp::Const(_)
                | InstOp::Index(_)
                | InstOp::Load { .. }
                | InstOp::Gather { .. }
                | InstOp::Rand { .. }
                | InstOp::Acc
                | InstOp::RowAcc(_) => false,
            };
            // A uniform instruction with a constant operand reads it from `vals`, so constants get a value here too.
            let computed = uniform[i] || matches!(inst.op, InstOp::Const(_));
            let v = if computed { Some(self.inst(inst, &k.outer, &vals, 0, 1, None)) } else { None };
            if let (true, Some(v)) = (uniform[i], v) {
                self.uniform_insts.insert(inst as *const Inst, v);
                self.presplat(v, inst.dtype);
            }
            vals.push(v.into_iter().collect());
        }
    }
}

impl Emitter<'_> {
    /// Makes, at the current point, the vector splat of a scalar computed ahead of the loops that vector code will
    /// read, so `vector_of` finds it instead of splatting once per vector.
    fn presplat(&mut self, v: Value, d: DType) {
        if (self.vec_ok || self.tiled) && has_lanes(d) {
            let splat = self.vector_of(v, d, LANES);
            self.splats.insert((v, LANES), splat);
        }
    }

    /// Computes, at the current point (the body of the loop around the innermost output loop), every outer
    /// instruction that does not depend on the innermost variable and is not uniform, and the splats vector code
    /// uses; returns whether there was any. An SGD update of a linear layer at batch 1, `W - lr * (g x^T)`, loaded
    /// and splatted `g[row]` once per vector of 24 elements, since Cranelift does not hoist it out of the column
    /// loop. Values are exactly those the loop would compute (the same instructions, evaluated earlier).
    fn compute_row_invariants(&mut self) -> bool {
        let k = self.k;
        let mut any = false;
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(k.outer.len());
        for (i, inst) in k.outer.iter().enumerate() {
            let key = inst as *const Inst;
            let v = if let Some(&u) = self.uniform_insts.get(&key) {
                Some(u)
            } else if matches!(inst.op, InstOp::Const(_)) {
                // Operands of the instructions below (a constant is otherwise an immediate where used).
                Some(self.inst(inst, &k.outer, &vals, 0, 1, None))
            } else if !self.outer_deps[i].1 && !matches!(inst.op, InstOp::Acc) {
                // Not depending on the column means no operand does either: each has a value here.
                let v = self.inst(inst, &k.outer, &vals, 0, 1, None);
                self.row_insts.insert(key, v);
                self.presplat(v, inst.dtype);
                any = true;
                Some(v)
            } else {
                None
            };
            vals.push(v.into_iter().collect());
        }
        any
    }
}

/// Whether values of `d` have a 4-lane vector form (f16, bf16 and f32 as f32x4, i32 and u32 as i32x4, bool as i32
/// masks).
fn has_lanes(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::I32 | DType::U32 | DType::Bool)
}

/// CLIF type of a dtype: bools and u8 are bytes in scalar code; in vector code bools are i32 lane masks.
fn ty(d: DType, lanes: usize) -> Type {
    match (d, lanes) {
        (DType::Bool | DType::U8, 1) => types::I8,
        (DType::I32 | DType::U32, 1) => types::I32,
        (DType::I64, 1) => types::I64,
        // f16 and bf16 values are computed as f32 (see `half.rs`).
        (DType::F16 | DType::BF16 | DType::F32, 1) => types::F32,
        (DType::F64, 1) => types::F64,
        (DType::F16 | DType::BF16 | DType::F32, _) => types::F32X4,
        (DType::I32 | DType::U32 | DType::Bool, _) => types::I32X4,
        (d, l) => unreachable!("{d} has no {l}-lane form"),
    }
}

/// Vector loads and stores: in bounds but not necessarily 16-byte aligned.
fn vector_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}
