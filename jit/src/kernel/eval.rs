//! A host evaluator for the kernel IR: the executable specification of what every renderer must produce.
//!
//! Unlike the graph interpreter (f64 everywhere, rounded per op), this computes each instruction in its own dtype,
//! as generated code does, and folds reductions in loop order into an accumulator of the reduce dtype. Comparing
//! it with the graph interpreter checks fusion and lowering; comparing a backend with it checks the renderer.
//!
//! f16 and bf16 instructions compute in f32 and round the result to their dtype (`half`, ties to even), which is
//! what every renderer emits: for `+ - * /` and `sqrt` that equals the correctly rounded result (f32 has at least
//! 2 * 11 + 2 significant bits, so the double rounding is innocuous); transcendentals carry f32's error plus one
//! rounding.

use crate::buffer::HostBuffer;
use crate::dtype::{DType, Scalar};
use crate::kernel::ir::{Inst, InstOp, KernelIr, Reduce, Valid};
use crate::kernel::schedule::{KernelPlan, Slot};
use crate::op::{BinaryOp, RandDist, ReduceOp, RngKey, UnaryOp};
use crate::rng;
use crate::semantics;
use crate::shape::for_each_index;
use half::{bf16, f16};

/// One scalar value: floats in their own width, ints and bools as i64 wrapped to their dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
enum V {
    F16(f16),
    BF16(bf16),
    F32(f32),
    F64(f64),
    I(i64),
}

fn scalar(d: DType, s: Scalar) -> V {
    match d {
        DType::F16 => V::F16(f16::from_f64(s.as_f64())),
        DType::BF16 => V::BF16(crate::dtype::bf16_from_f64(s.as_f64())),
        DType::F32 => V::F32(s.as_f64() as f32),
        DType::F64 => V::F64(s.as_f64()),
        _ => V::I(d.wrap_int(s.as_i64())),
    }
}

fn cast(d: DType, v: V) -> V {
    match (d, v) {
        (DType::F16, V::F16(x)) => V::F16(x),
        (DType::F16, V::F32(x)) => V::F16(f16::from_f32(x)),
        (DType::F16, V::F64(x)) => V::F16(f16::from_f64(x)),
        // Exact in f64 below 2^53; anything larger is inf in f16 either way.
        (DType::F16, V::I(x)) => V::F16(f16::from_f64(x as f64)),
        (_, V::F16(x)) => cast(d, V::F32(x.to_f32())),
        (DType::BF16, V::BF16(x)) => V::BF16(x),
        (DType::BF16, V::F32(x)) => V::BF16(bf16::from_f32(x)),
        (DType::BF16, V::F64(x)) => V::BF16(crate::dtype::bf16_from_f64(x)),
        // As PyTorch: to f32 (nearest), then to bf16.
        (DType::BF16, V::I(x)) => V::BF16(bf16::from_f32(x as f32)),
        (_, V::BF16(x)) => cast(d, V::F32(x.to_f32())),
        (DType::F32, V::F32(x)) => V::F32(x),
        (DType::F32, V::F64(x)) => V::F32(x as f32),
        (DType::F32, V::I(x)) => V::F32(x as f32),
        (DType::F64, V::F32(x)) => V::F64(x as f64),
        (DType::F64, V::F64(x)) => V::F64(x),
        (DType::F64, V::I(x)) => V::F64(x as f64),
        (DType::Bool, V::F32(x)) => V::I((x != 0.0) as i64),
        (DType::Bool, V::F64(x)) => V::I((x != 0.0) as i64),
        (_, V::F32(x)) => V::I(d.wrap_int(x as i64)),
        (_, V::F64(x)) => V::I(d.wrap_int(x as i64)),
        (_, V::I(x)) => V::I(d.wrap_int(x)),
    }
}

fn load(b: &HostBuffer, i: usize) -> V {
    match b {
        HostBuffer::F16(v) => V::F16(v[i]),
        HostBuffer::BF16(v) => V::BF16(v[i]),
        HostBuffer::F32(v) => V::F32(v[i]),
        HostBuffer::F64(v) => V::F64(v[i]),
        other => V::I(other.get(i).as_i64()),
    }
}

// The scalar meaning of each op is `crate::semantics`'s (shared with the interpreter); this file only moves values
// between the evaluator's representation and it. f16 and bf16 compute in f32 and round once.
fn unary(u: UnaryOp, d: DType, a: V) -> V {
    match a {
        V::F16(x) => V::F16(f16::from_f32(semantics::float_unary(u, x.to_f32()))),
        V::BF16(x) => V::BF16(bf16::from_f32(semantics::float_unary(u, x.to_f32()))),
        V::F32(x) => V::F32(semantics::float_unary(u, x)),
        V::F64(x) => V::F64(semantics::float_unary(u, x)),
        V::I(x) => {
            V::I(d.wrap_int(semantics::int_unary(u, x).unwrap_or_else(|| unreachable!("float op {u:?} on an integer"))))
        }
    }
}

fn binary(op: BinaryOp, d: DType, a: V, b: V) -> V {
    fn float<F: semantics::Float>(op: BinaryOp, x: F, y: F, wrap: fn(F) -> V) -> V {
        match semantics::float_binary(op, x, y) {
            Some(semantics::FloatResult::Value(z)) => wrap(z),
            Some(semantics::FloatResult::Bool(c)) => V::I(c as i64),
            None => unreachable!("logical op {op:?} on floats"),
        }
    }
    match (a, b) {
        (V::F16(x), V::F16(y)) => float(op, x.to_f32(), y.to_f32(), |z| V::F16(f16::from_f32(z))),
        (V::BF16(x), V::BF16(y)) => float(op, x.to_f32(), y.to_f32(), |z| V::BF16(bf16::from_f32(z))),
        (V::F32(x), V::F32(y)) => float(op, x, y, V::F32),
        (V::F64(x), V::F64(y)) => float(op, x, y, V::F64),
        (V::I(x), V::I(y)) => V::I(d.wrap_int(semantics::int_binary(op, x, y))),
        _ => unreachable!("binary operands of different kinds"),
    }
}

/// The value of an ALU instruction (unary, binary, where, cast) from the values before it; `None` for the others.
fn alu(op: &InstOp, d: DType, vals: &[V]) -> Option<V> {
    Some(match op {
        InstOp::Unary(u, a) => unary(*u, d, vals[*a]),
        InstOp::Binary(b, x, y) => binary(*b, d, vals[*x], vals[*y]),
        InstOp::Where(c, a, b) => {
            if vals[*c] == V::I(0) {
                vals[*b]
            } else {
                vals[*a]
            }
        }
        InstOp::Cast(a) => cast(d, vals[*a]),
        _ => return None,
    })
}

fn valid(v: &Option<Valid>, vars: &[i64]) -> bool {
    v.as_ref().is_none_or(|Valid(rs)| rs.iter().all(|(e, lo, hi)| (*lo..*hi).contains(&e.eval(vars))))
}

/// What instructions read besides memory: the inputs, rng keys, the finished reduction, the row's reductions.
struct Ctx<'a> {
    inputs: &'a [&'a HostBuffer],
    rng: &'a [RngKey],
    acc: Option<V>,
    rows: &'a [V],
}

fn run_insts(insts: &[Inst], vars: &[i64], cx: &Ctx, vals: &mut Vec<V>) {
    let (inputs, rng) = (cx.inputs, cx.rng);
    vals.clear();
    for inst in insts {
        let d = inst.dtype;
        let v = match &inst.op {
            InstOp::Const(s) => scalar(d, *s),
            InstOp::Index(e) => cast(d, V::I(e.eval(vars))),
            InstOp::Load { buf, index, valid: m, fill } => {
                if valid(m, vars) {
                    load(inputs[*buf], index.eval(vars) as usize)
                } else {
                    scalar(d, *fill)
                }
            }
            InstOp::Gather { buf, base, index, stride, len, valid: m } => {
                if valid(m, vars) {
                    let V::I(i) = vals[*index] else { unreachable!("a gather's index is an integer") };
                    // The evaluator is a test oracle: a fault is a test's mistake, and stops it here.
                    assert!((0..*len).contains(&i), "kernel {}", crate::kernel::Fault::Index { len: *len, index: i });
                    load(inputs[*buf], (base.eval(vars) + i * stride) as usize)
                } else {
                    scalar(d, Scalar::Int(0))
                }
            }
            InstOp::Rand { dist, slot, index } => {
                let key = rng[*slot];
                let w = rng::words(key.seed, key.offset.wrapping_add(index.eval(vars) as u64));
                match (dist, d) {
                    (RandDist::Uniform, DType::F32) => V::F32(rng::uniform_f32(w)),
                    (RandDist::Uniform, DType::F16) => V::F16(f16::from_f32(rng::uniform_f16(w))),
                    (RandDist::Uniform, DType::BF16) => V::BF16(bf16::from_f32(rng::uniform_bf16(w))),
                    (RandDist::Uniform, _) => V::F64(rng::uniform_f64(w)),
                    (RandDist::Normal, _) => cast(d, V::F64(rng::normal_f64(w))),
                }
            }
            InstOp::Acc => cx.acc.expect("acc read outside a reduce kernel"),
            InstOp::RowAcc(j) => cx.rows[*j],
            op => alu(op, d, vals).unwrap_or_else(|| unreachable!("every other op is ALU")),
        };
        vals.push(v);
    }
}

fn init(op: ReduceOp, d: DType) -> V {
    scalar(d, op.identity(d))
}

fn fold(op: ReduceOp, d: DType, acc: V, x: V) -> V {
    binary(op.fold(), d, acc, x)
}

/// `r` folded in loop order at the output variables already in `vars`.
fn fold_all(r: &Reduce, out_rank: usize, vars: &mut [i64], cx: &Ctx, vals: &mut Vec<V>) -> V {
    let mut acc = init(r.op, r.dtype);
    for_each_index(&r.extents, |ri| {
        for (v, &i) in vars[out_rank..].iter_mut().zip(ri) {
            *v = i as i64;
        }
        run_insts(&r.inner, vars, cx, vals);
        acc = fold(r.op, r.dtype, acc, vals[r.value]);
    });
    acc
}

/// The row reductions of the row holding output element `o`, in order (`rows` is cleared first).
fn row_values(kernel: &KernelIr, o: &[usize], cx: &Ctx, vars: &mut [i64], vals: &mut Vec<V>, rows: &mut Vec<V>) {
    rows.clear();
    for (v, &i) in vars.iter_mut().zip(o) {
        *v = i as i64;
    }
    for r in &kernel.rows {
        let cx = Ctx { rows: rows.as_slice(), ..*cx };
        let v = fold_all(r, kernel.out_rank(), vars, &cx, vals);
        rows.push(v);
    }
}

/// The value of output element `o` (an index into `out_extents`): its reduction in loop order, then the outer code
/// (`cx.rows` holds the row's reductions).
fn element(kernel: &KernelIr, o: &[usize], cx: &Ctx, vars: &mut [i64], vals: &mut Vec<V>) -> V {
    let out_rank = kernel.out_rank();
    for (v, &i) in vars.iter_mut().zip(o) {
        *v = i as i64;
    }
    let acc = kernel.reduce.as_ref().map(|r| fold_all(r, out_rank, vars, cx, vals));
    run_insts(&kernel.outer, vars, &Ctx { acc, ..*cx }, vals);
    vals[kernel.result]
}

/// Each output element in row-major order, with its row's reductions (computed once per row).
fn for_each_element(kernel: &KernelIr, inputs: &[&HostBuffer], rng: &[RngKey], mut f: impl FnMut(V)) {
    let mut vals = Vec::new();
    let mut vars = vec![0i64; kernel.extents().len()];
    let mut rows: Vec<V> = Vec::new();
    let mut row: Option<Vec<usize>> = None;
    for_each_index(&kernel.out_extents, |o| {
        let base = Ctx { inputs, rng, acc: None, rows: &[] };
        if !kernel.rows.is_empty() && row.as_deref() != Some(&o[..kernel.row_rank]) {
            row_values(kernel, o, &base, &mut vars, &mut vals, &mut rows);
            row = Some(o[..kernel.row_rank].to_vec());
        }
        f(element(kernel, o, &Ctx { rows: &rows, ..base }, &mut vars, &mut vals));
    });
}

/// Runs `kernel` over `inputs` and returns its output buffer.
pub fn run(kernel: &KernelIr, inputs: &[&HostBuffer], rng: &[RngKey]) -> HostBuffer {
    if let Some(r) = &kernel.routine {
        // The plan evaluator reports no faults (as for a gather): a faulting routine's output is zeros.
        let ins: Vec<Vec<f64>> = inputs.iter().map(|b| b.to_f64()).collect();
        let ins: Vec<&[f64]> = ins.iter().map(Vec::as_slice).collect();
        let out = crate::kernel::routine::reference(r, &ins).unwrap_or_else(|_| vec![0.0; kernel.output.len]);
        return HostBuffer::from_f64(r.dtype(), &out);
    }
    let mut out: Vec<V> = Vec::with_capacity(kernel.output.len);
    for_each_element(kernel, inputs, rng, |v| out.push(v));
    let d = kernel.output.dtype;
    match d {
        DType::F16 => HostBuffer::F16(out.into_iter().map(|v| if let V::F16(x) = v { x } else { f16::ZERO }).collect()),
        DType::BF16 => {
            HostBuffer::BF16(out.into_iter().map(|v| if let V::BF16(x) = v { x } else { bf16::ZERO }).collect())
        }
        DType::F32 => HostBuffer::F32(out.into_iter().map(|v| if let V::F32(x) = v { x } else { 0.0 }).collect()),
        DType::F64 => HostBuffer::F64(out.into_iter().map(|v| if let V::F64(x) = v { x } else { 0.0 }).collect()),
        _ => HostBuffer::from_i64(d, &out.into_iter().map(|v| if let V::I(x) = v { x } else { 0 }).collect::<Vec<_>>()),
    }
}

/// Runs every launch of `plan` in order and returns its outputs.
pub fn run_plan(plan: &KernelPlan, inputs: &[&HostBuffer], rng: &[RngKey]) -> Vec<HostBuffer> {
    let mut temps: Vec<Option<HostBuffer>> = vec![None; plan.temps.len()];
    let mut outputs: Vec<Option<HostBuffer>> = vec![None; plan.outputs.len()];
    for launch in &plan.launches {
        let args: Vec<&HostBuffer> = launch
            .inputs
            .iter()
            .map(|s| match *s {
                Slot::Input(i) => inputs[i],
                Slot::Temp(t) => temps[t].as_ref().expect("temp written before read"),
                Slot::Output(o) => outputs[o].as_ref().expect("output written before read"),
            })
            .collect();
        let out = run(&launch.kernel, &args, rng);
        match launch.output {
            Slot::Temp(t) => temps[t] = Some(out),
            Slot::Output(o) => outputs[o] = Some(out),
            Slot::Input(_) => unreachable!("kernels never write inputs"),
        }
    }
    for &(o, i) in &plan.passthrough {
        outputs[o] = Some(inputs[i].clone());
    }
    outputs.into_iter().map(|o| o.expect("every output written")).collect()
}

/// Evaluates the instructions of `insts` marked in `uniform` (they read no loop variable and no accumulator; their
/// loads have constant indices) with `load(buf, index, dtype)` supplying memory, and returns each marked value as a
/// `Scalar` (floats widened to f64 exactly, bools as `Bool`). Unmarked entries are `None`. A GEMM epilogue uses this
/// to compute per launch, on the host, the values it then splats into registers (a learning rate read from a
/// buffer and cast, a constant).
pub fn eval_uniform(
    insts: &[Inst],
    uniform: &[bool],
    load: &mut dyn FnMut(usize, usize, DType) -> Scalar,
) -> smallvec::SmallVec<[Option<Scalar>; 16]> {
    // Inline for the usual epilogue lengths: this runs on every launch of a GEMM whose epilogue reads a uniform
    // (the learning rate of an SGD update), so it must not allocate.
    let mut vals: smallvec::SmallVec<[V; 16]> = smallvec::SmallVec::with_capacity(insts.len());
    let mut out = smallvec::SmallVec::with_capacity(insts.len());
    for (i, inst) in insts.iter().enumerate() {
        let d = inst.dtype;
        let v = if !uniform[i] {
            V::I(0)
        } else {
            match &inst.op {
                InstOp::Const(s) => scalar(d, *s),
                InstOp::Load { buf, index, .. } => scalar(d, load(*buf, index.eval(&[0; 32]).max(0) as usize, d)),
                InstOp::Index(_) | InstOp::Gather { .. } | InstOp::Rand { .. } | InstOp::Acc | InstOp::RowAcc(_) => {
                    V::I(0)
                }
                op => alu(op, d, &vals).unwrap_or(V::I(0)),
            }
        };
        out.push(uniform[i].then_some(match (d, v) {
            (DType::Bool, V::I(x)) => Scalar::Bool(x != 0),
            (_, V::F16(x)) => Scalar::Float(x.to_f64()),
            (_, V::BF16(x)) => Scalar::Float(x.to_f64()),
            (_, V::F32(x)) => Scalar::Float(x as f64),
            (_, V::F64(x)) => Scalar::Float(x),
            (_, V::I(x)) => Scalar::Int(x),
        }));
        vals.push(v);
    }
    out
}

/// Evaluates `kernel` at the given output positions only (each a full index into `out_extents`), for checking a
/// large kernel's output on a sample: the reference a GEMM candidate is verified against while tuning.
pub fn run_at(kernel: &KernelIr, inputs: &[&HostBuffer], rng: &[RngKey], positions: &[Vec<usize>]) -> Vec<f64> {
    let mut vals = Vec::new();
    let mut vars = vec![0i64; kernel.extents().len()];
    let mut rows = Vec::new();
    positions
        .iter()
        .map(|o| {
            let base = Ctx { inputs, rng, acc: None, rows: &[] };
            row_values(kernel, o, &base, &mut vars, &mut vals, &mut rows);
            element(kernel, o, &Ctx { rows: &rows, ..base }, &mut vars, &mut vals)
        })
        .map(|v| match v {
            V::F16(x) => x.to_f64(),
            V::BF16(x) => x.to_f64(),
            V::F32(x) => x as f64,
            V::F64(x) => x,
            V::I(x) => x as f64,
        })
        .collect()
}
