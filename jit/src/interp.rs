//! The reference interpreter: evaluates a `Graph` node by node on the host.
//!
//! It is the oracle every backend is tested against, so it is written to be obviously right, not fast:
//! - every float is computed in f64 and rounded to the node's dtype after each op (so each op is correctly rounded
//!   up to the f64 library's accuracy, f16 included: rounded straight from f64); sums, products and matmul
//!   accumulate in f64 and round once at the end;
//! - every integer and bool is held as i64 and wrapped to the node's dtype after each op (u8, u32 and
//!   i32 wrap as C would; bool is 0 or 1);
//! - movement ops are gathers through explicit index maps: no strides are shared with any backend's code.
//!
//! Deliberate choices where C or PyTorch is undefined or raises: integer division by zero gives 0; float -> int
//! casts truncate to i64 (saturating, NaN -> 0) and then wrap to the target width; an int raised to a negative
//! power gives `1/x` truncated (0 unless x is 1 or -1). Values are freed after their last use, so memory is bounded
//! by the live set, not the graph.

use crate::buffer::HostBuffer;
use crate::dtype::DType;
use crate::graph::{Graph, NodeData};
use crate::op::{BinaryOp, Op, RandDist, ReduceOp, RngKey, UnaryOp};
use crate::rng;
use crate::semantics;
use crate::shape::{contiguous_strides, for_each_index};
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::NodeIndexable;

/// Values of one node: floats as f64, ints and bools as i64, row-major.
#[derive(Clone, Debug)]
enum Vals {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Vals {
    fn len(&self) -> usize {
        match self {
            Vals::F(v) => v.len(),
            Vals::I(v) => v.len(),
        }
    }

    fn from_buffer(b: &HostBuffer) -> Vals {
        if b.dtype().is_float() { Vals::F(b.to_f64()) } else { Vals::I(b.to_i64()) }
    }

    fn into_buffer(self, dtype: DType) -> HostBuffer {
        match self {
            Vals::F(v) => HostBuffer::from_f64(dtype, &v),
            Vals::I(v) => HostBuffer::from_i64(dtype, &v),
        }
    }

    /// Gathers element `map(i)` for each output element i (`None` -> `fill`).
    fn gather(&self, n: usize, fill: (f64, i64), mut map: impl FnMut(usize) -> Option<usize>) -> Vals {
        match self {
            Vals::F(v) => Vals::F((0..n).map(|i| map(i).map_or(fill.0, |j| v[j])).collect()),
            Vals::I(v) => Vals::I((0..n).map(|i| map(i).map_or(fill.1, |j| v[j])).collect()),
        }
    }
}

fn round_f(d: DType, x: f64) -> f64 {
    match d {
        DType::F32 => x as f32 as f64,
        // `half`'s from_f64, which rounds as through f32 does (equal on 2e7 values drawn next to f16 ties), as
        // PyTorch converts: a value just past a tie by less than f32 resolves lands on it and goes to even.
        DType::F16 => half::f16::from_f64(x).to_f64(),
        // Through f32, as PyTorch converts (see `bf16_from_f64`).
        DType::BF16 => crate::dtype::bf16_from_f64(x).to_f64(),
        _ => x,
    }
}

/// Rounds or wraps every value to `d`, converting between float and int representation as a cast does.
fn normalize(d: DType, v: Vals) -> Vals {
    match (d.is_float(), v) {
        (true, Vals::F(v)) => Vals::F(v.into_iter().map(|x| round_f(d, x)).collect()),
        // Straight from i64 to the float width: via f64 first would round twice above 2^53.
        (true, Vals::I(v)) => Vals::F(
            v.into_iter()
                .map(|x| match d {
                    DType::F32 => x as f32 as f64,
                    // Exact in f64 below 2^53; anything larger is inf in f16 either way.
                    DType::F16 => round_f(d, x as f64),
                    // As PyTorch: to f32 (nearest), then to bf16.
                    DType::BF16 => half::bf16::from_f32(x as f32).to_f64(),
                    _ => x as f64,
                })
                .collect(),
        ),
        (false, Vals::I(v)) => Vals::I(v.into_iter().map(|x| d.wrap_int(x)).collect()),
        (false, Vals::F(v)) if d == DType::Bool => Vals::I(v.into_iter().map(|x| (x != 0.0) as i64).collect()),
        (false, Vals::F(v)) => Vals::I(v.into_iter().map(|x| d.wrap_int(x as i64)).collect()),
    }
}

/// Evaluates `graph` and returns its outputs' values. `inputs[slot]` feeds `Op::Input { slot }`, `rng[slot]` feeds
/// `Op::Rand { slot }`.
pub fn run(graph: &Graph, inputs: &[&HostBuffer], rng: &[RngKey]) -> Result<Vec<HostBuffer>, String> {
    let order = graph.topo_order();
    let mut last_use = vec![0usize; graph.g.node_bound()];
    for (step, &n) in order.iter().enumerate() {
        for s in graph.srcs(n) {
            last_use[s.index()] = step;
        }
    }
    for &o in &graph.outputs {
        last_use[o.index()] = usize::MAX;
    }
    let mut vals: Vec<Option<Vals>> = vec![None; graph.g.node_bound()];
    for (step, &n) in order.iter().enumerate() {
        let srcs = graph.srcs(n);
        let args: Vec<&Vals> = srcs.iter().map(|s| vals[s.index()].as_ref().expect("operand evaluated")).collect();
        let srcs_data: Vec<&NodeData> = srcs.iter().map(|&s| graph.node(s)).collect();
        let v = eval(graph.node(n), &srcs_data, &args, inputs, rng)
            .map_err(|e| format!("interpreter: node %{} {}: {e}", n.index(), graph.node(n).op))?;
        debug_assert_eq!(v.len(), graph.node(n).shape.numel());
        vals[n.index()] = Some(v);
        for s in srcs {
            if last_use[s.index()] == step {
                vals[s.index()] = None;
            }
        }
    }
    Ok(graph
        .outputs
        .iter()
        .map(|&o: &NodeIndex| {
            let v = vals[o.index()].clone().expect("output evaluated");
            v.into_buffer(graph.node(o).dtype)
        })
        .collect())
}

fn eval(
    node: &NodeData,
    srcs: &[&NodeData],
    args: &[&Vals],
    inputs: &[&HostBuffer],
    rng: &[RngKey],
) -> Result<Vals, String> {
    let d = node.dtype;
    let n = node.shape.numel();
    let out_dims = node.shape.dims();
    Ok(match &node.op {
        Op::Input { slot } => {
            let b = inputs.get(*slot).ok_or(format!("no input bound to slot {slot}"))?;
            if b.dtype() != d || b.len() != n {
                return Err(format!("input {slot} is {}[{}], expected {d}{}", b.dtype(), b.len(), node.shape));
            }
            Vals::from_buffer(b)
        }
        Op::Const(s) => {
            if d.is_float() {
                Vals::F(vec![round_f(d, s.as_f64()); n])
            } else {
                Vals::I(vec![d.wrap_int(s.as_i64()); n])
            }
        }
        Op::Iota { start, step } => {
            if d.is_float() {
                let (a, b) = (start.as_f64(), step.as_f64());
                Vals::F((0..n).map(|i| round_f(d, a + i as f64 * b)).collect())
            } else {
                let (a, b) = (start.as_i64(), step.as_i64());
                Vals::I((0..n as i64).map(|i| d.wrap_int(a.wrapping_add(i.wrapping_mul(b)))).collect())
            }
        }
        Op::Rand { dist, slot } => {
            let key = rng.get(*slot).ok_or(format!("no rng key bound to slot {slot}"))?;
            let w = |i: usize| rng::words(key.seed, key.offset.wrapping_add(i as u64));
            Vals::F(match (dist, d) {
                (RandDist::Uniform, DType::F32) => (0..n).map(|i| rng::uniform_f32(w(i)) as f64).collect(),
                (RandDist::Uniform, DType::F16) => (0..n).map(|i| rng::uniform_f16(w(i)) as f64).collect(),
                (RandDist::Uniform, DType::BF16) => (0..n).map(|i| rng::uniform_bf16(w(i)) as f64).collect(),
                (RandDist::Uniform, _) => (0..n).map(|i| rng::uniform_f64(w(i))).collect(),
                (RandDist::Normal, _) => (0..n).map(|i| round_f(d, rng::normal_f64(w(i)))).collect(),
            })
        }
        Op::Unary(u) => unary(*u, d, args[0])?,
        Op::Binary(b) => binary(*b, srcs[0].dtype, args[0], args[1])?,
        Op::Where => match (args[0], args[1], args[2]) {
            (Vals::I(c), Vals::F(a), Vals::F(b)) => {
                Vals::F(c.iter().zip(a.iter().zip(b)).map(|(&c, (&a, &b))| if c != 0 { a } else { b }).collect())
            }
            (Vals::I(c), Vals::I(a), Vals::I(b)) => {
                Vals::I(c.iter().zip(a.iter().zip(b)).map(|(&c, (&a, &b))| if c != 0 { a } else { b }).collect())
            }
            _ => return Err("where operands".into()),
        },
        Op::Cast => normalize(d, args[0].clone()),
        Op::Contiguous | Op::Reshape => args[0].clone(),
        Op::Reduce { op, axes } => reduce(*op, d, srcs[0].shape.dims(), axes, args[0]),
        Op::Permute(perm) => {
            let src_strides = contiguous_strides(srcs[0].shape.dims());
            let map = index_map(out_dims, |j| Some(j.iter().zip(perm).map(|(&j, &p)| j * src_strides[p]).sum()));
            args[0].gather(n, (0.0, 0), |i| map[i])
        }
        Op::Expand => {
            let src = srcs[0].shape.dims();
            let st = contiguous_strides(src);
            let map = index_map(out_dims, |j| {
                Some(j.iter().enumerate().map(|(a, &j)| if src[a] == 1 { 0 } else { j * st[a] }).sum())
            });
            args[0].gather(n, (0.0, 0), |i| map[i])
        }
        Op::Slice(sl) => {
            let st = contiguous_strides(srcs[0].shape.dims());
            let map = index_map(out_dims, |j| {
                Some(
                    j.iter()
                        .zip(sl)
                        .zip(&st)
                        .map(|((&j, &(a, s)), &st)| (a as isize + j as isize * s) as usize * st)
                        .sum(),
                )
            });
            args[0].gather(n, (0.0, 0), |i| map[i])
        }
        Op::Unfold { axis, step, dilation, .. } => {
            let st = contiguous_strides(srcs[0].shape.dims());
            let map = index_map(out_dims, |j| {
                let (win, tap) = j.split_at(j.len() - 1);
                let at = |a: usize| if a == *axis { win[a] * step + tap[0] * dilation } else { win[a] };
                Some((0..win.len()).map(|a| at(a) * st[a]).sum())
            });
            args[0].gather(n, (0.0, 0), |i| map[i])
        }
        Op::Pad { pads, value } => {
            let src = srcs[0].shape.dims();
            let st = contiguous_strides(src);
            let map = index_map(out_dims, |j| {
                let mut flat = 0;
                for a in 0..j.len() {
                    let k = j[a].checked_sub(pads[a].0).filter(|&k| k < src[a])?;
                    flat += k * st[a];
                }
                Some(flat)
            });
            args[0].gather(n, (round_f(d, value.as_f64()), d.wrap_int(value.as_i64())), |i| map[i])
        }
        Op::Matmul => matmul(d, srcs[0].shape.dims(), srcs[1].shape.dims(), args[0], args[1])?,
        Op::Gather { axis } => {
            let Vals::I(index) = args[1] else { return Err("gather indices are not integers".into()) };
            let src = srcs[0].shape.dims();
            let st = contiguous_strides(src);
            let mut map = Vec::with_capacity(n);
            let mut fault = None;
            for_each_index(out_dims, |j| {
                let at: usize =
                    j.iter().zip(&st).enumerate().filter(|&(a, _)| a != *axis).map(|(_, (j, s))| j * s).sum();
                let i = index[map.len()];
                match usize::try_from(i).ok().filter(|&i| i < src[*axis]) {
                    Some(i) => map.push(at + i * st[*axis]),
                    None => {
                        fault.get_or_insert(i);
                        map.push(0);
                    }
                }
            });
            if let Some(i) = fault {
                return Err(crate::kernel::Fault::Index { len: src[*axis] as i64, index: i }.to_string());
            }
            args[0].gather(n, (0.0, 0), |i| Some(map[i]))
        }
        Op::Linalg(_) | Op::ScatterRows { .. } | Op::SortRows { .. } => {
            let r = crate::kernel::routine::Routine::of(node, srcs).ok_or("not a routine")?;
            // Linear algebra reads floats; a scatter's indices, and a sort's integer values, are exact in f64 below
            // 2^53.
            let ins: Vec<Vec<f64>> = args
                .iter()
                .map(|a| match a {
                    Vals::F(v) => v.clone(),
                    Vals::I(v) => v.iter().map(|&i| i as f64).collect(),
                })
                .collect();
            let ins: Vec<&[f64]> = ins.iter().map(Vec::as_slice).collect();
            let out = crate::kernel::routine::reference(&r, &ins).map_err(|f| f.to_string())?;
            Vals::F(out.into_iter().map(|x| round_f(d, x)).collect())
        }
    })
}

/// The source flat index (or `None` for padding) of every output element, in row-major output order.
fn index_map(out_dims: &[usize], mut f: impl FnMut(&[usize]) -> Option<usize>) -> Vec<Option<usize>> {
    let mut map = Vec::with_capacity(out_dims.iter().product());
    for_each_index(out_dims, |j| map.push(f(j)));
    map
}

// The scalar meaning of each op is `crate::semantics`'s (shared with the kernel evaluator); the interpreter applies
// it in f64 / i64 over whole arrays and rounds each float result to its dtype.
fn unary(u: UnaryOp, d: DType, a: &Vals) -> Result<Vals, String> {
    Ok(match a {
        Vals::F(_) if u == UnaryOp::Not => return Err("not on a float".into()),
        Vals::F(v) => Vals::F(v.iter().map(|&x| round_f(d, semantics::float_unary(u, x))).collect()),
        Vals::I(v) => {
            let y: Option<Vec<i64>> = v.iter().map(|&x| semantics::int_unary(u, x).map(|y| d.wrap_int(y))).collect();
            Vals::I(y.ok_or_else(|| format!("{u:?} on an integer"))?)
        }
    })
}

/// `operand_dtype` is the operands' dtype (the result is bool for comparisons).
fn binary(op: BinaryOp, operand_dtype: DType, a: &Vals, b: &Vals) -> Result<Vals, String> {
    let d = operand_dtype;
    Ok(match (a, b) {
        (Vals::F(a), Vals::F(b)) => {
            use semantics::FloatResult;
            let r: Option<Vec<FloatResult<f64>>> =
                a.iter().zip(b).map(|(&x, &y)| semantics::float_binary(op, x, y)).collect();
            let r = r.ok_or_else(|| format!("{op:?} on floats"))?;
            if op.is_comparison() {
                Vals::I(r.into_iter().map(|z| (z == FloatResult::Bool(true)) as i64).collect())
            } else {
                Vals::F(
                    r.into_iter()
                        .map(|z| match z {
                            FloatResult::Value(z) => round_f(d, z),
                            FloatResult::Bool(c) => c as i64 as f64,
                        })
                        .collect(),
                )
            }
        }
        (Vals::I(a), Vals::I(b)) => {
            let out = if op.is_comparison() { DType::Bool } else { d };
            Vals::I(a.iter().zip(b).map(|(&x, &y)| out.wrap_int(semantics::int_binary(op, x, y))).collect())
        }
        _ => return Err("operands of different kinds".into()),
    })
}

fn reduce(op: ReduceOp, d: DType, src: &[usize], axes: &[usize], a: &Vals) -> Vals {
    let mut out_dims = src.to_vec();
    for &ax in axes {
        out_dims[ax] = 1;
    }
    let out_strides = contiguous_strides(&out_dims);
    let n_out: usize = out_dims.iter().product();
    // For each source element (row-major), the output element it folds into.
    let mut target = Vec::with_capacity(a.len());
    for_each_index(src, |j| {
        target.push(
            j.iter()
                .zip(&out_dims)
                .zip(&out_strides)
                .map(|((&j, &o), &s)| if o == 1 { 0 } else { j * s })
                .sum::<usize>(),
        )
    });
    match a {
        Vals::F(v) => {
            let (init, f): (f64, fn(f64, f64) -> f64) = match op {
                ReduceOp::Sum => (0.0, |x, y| x + y),
                ReduceOp::Prod => (1.0, |x, y| x * y),
                ReduceOp::Max => (f64::NEG_INFINITY, |x, y| if x.is_nan() || y.is_nan() { f64::NAN } else { x.max(y) }),
                ReduceOp::Min => (f64::INFINITY, |x, y| if x.is_nan() || y.is_nan() { f64::NAN } else { x.min(y) }),
            };
            let mut acc = vec![init; n_out];
            for (&t, &x) in target.iter().zip(v) {
                acc[t] = f(acc[t], x);
            }
            Vals::F(acc.into_iter().map(|x| round_f(d, x)).collect())
        }
        Vals::I(v) => {
            let (init, f): (i64, fn(i64, i64) -> i64) = match op {
                ReduceOp::Sum => (0, i64::wrapping_add),
                ReduceOp::Prod => (1, i64::wrapping_mul),
                ReduceOp::Max => (i64::MIN, i64::max),
                ReduceOp::Min => (i64::MAX, i64::min),
            };
            let mut acc = vec![init; n_out];
            for (&t, &x) in target.iter().zip(v) {
                acc[t] = f(acc[t], x);
            }
            Vals::I(acc.into_iter().map(|x| d.wrap_int(x)).collect())
        }
    }
}

fn matmul(d: DType, a_dims: &[usize], b_dims: &[usize], a: &Vals, b: &Vals) -> Result<Vals, String> {
    let r = a_dims.len();
    let (m, k, n) = (a_dims[r - 2], a_dims[r - 1], b_dims[r - 1]);
    let batch: usize = a_dims[..r - 2].iter().product();
    Ok(match (a, b) {
        (Vals::F(a), Vals::F(b)) => {
            let mut out = vec![0.0; batch * m * n];
            for bi in 0..batch {
                let (a, b) = (&a[bi * m * k..], &b[bi * k * n..]);
                for i in 0..m {
                    for j in 0..n {
                        // fold from +0.0: `Iterator::sum` starts at -0.0, which an empty (k = 0) product would return.
                        let acc: f64 = (0..k).fold(0.0, |acc, p| acc + a[i * k + p] * b[p * n + j]);
                        out[bi * m * n + i * n + j] = round_f(d, acc);
                    }
                }
            }
            Vals::F(out)
        }
        (Vals::I(a), Vals::I(b)) => {
            let mut out = vec![0; batch * m * n];
            for bi in 0..batch {
                let (a, b) = (&a[bi * m * k..], &b[bi * k * n..]);
                for i in 0..m {
                    for j in 0..n {
                        let acc = (0..k).fold(0i64, |acc, p| acc.wrapping_add(a[i * k + p].wrapping_mul(b[p * n + j])));
                        out[bi * m * n + i * n + j] = d.wrap_int(acc);
                    }
                }
            }
            Vals::I(out)
        }
        _ => return Err("matmul operands of different kinds".into()),
    })
}
