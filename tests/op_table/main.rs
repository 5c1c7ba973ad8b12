//! The op table: every public op of kiln x every dtype it supports x shape cases (0-dim, 1-D, n-D, broadcasting,
//! size-0 dims, negative dims, keepdim both ways), each with its expected values either written by hand from
//! PyTorch's semantics or computed in plain Rust by the naive reference in `common::Nd`. Tolerances come from
//! `common::tol` only.
//!
//! One test body per group: each `#[test]` below runs its group's cases on every device in `common::devices()`,
//! collects every failure (a panic inside kiln included) and reports them all at once. `coverage` asserts that the
//! table covers `REQUIRED` and prints an ops x dtypes summary (`cargo test --test op_table -- --nocapture`).
//!
//! This file holds the table's machinery, the reference helpers the groups share and the coverage check; each group's
//! rows live in a file of their own (`creation.rs`, `unary.rs`, `binary.rs`, `promotion.rs`, `casts.rs`,
//! `reduce.rs`, `movement.rs`, `linalg.rs`, `random.rs`).
//!
//! Where PyTorch raises or leaves a result undefined and kiln documents its own choice (int ** negative int,
//! float -> int casts out of range or of NaN), the case says "kiln-defined" in its description.

#[path = "../test_cache/mod.rs"]
mod test_cache;

#[path = "../common/mod.rs"]
mod common;

mod binary;
mod casts;
mod creation;
mod linalg;
mod movement;
mod promotion;
mod random;
mod reduce;
mod unary;

use binary::*;
use casts::*;
use creation::*;
use linalg::*;
use movement::*;
use promotion::*;
use random::*;
use reduce::*;
use unary::*;

use common::*;
use kiln::{DType, Device, HostBuffer, Tensor, f16};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;

use DType::{BF16, Bool, F16, F32, F64, I32, I64, U8, U32};

const INF: f64 = f64::INFINITY;
const NAN: f64 = f64::NAN;

// ---------------------------------------------------------------------------------------------------------------
// The table machinery
// ---------------------------------------------------------------------------------------------------------------

type Body = Box<dyn Fn(&Device) -> Result<(), String>>;
type Build = Box<dyn Fn(&Device) -> Tensor>;
type UnOp = fn(&Tensor) -> Tensor;
type BinOp = fn(&Tensor, &Tensor) -> Tensor;
type WhereOp = fn(&Tensor, &Tensor, &Tensor) -> Tensor;
type ArgOp = fn(&Tensor, isize, bool) -> Tensor;
type Fold = fn(f64, f64) -> f64;
/// Hand-written rows: (op, description, op applied to the input, input, result dtype, expected values).
type Row1 = (&'static str, &'static str, UnOp, In, DType, &'static [f64]);
/// (op, op applied to the two inputs, lhs, rhs, result dtype, expected values).
type Row2 = (&'static str, BinOp, In, In, DType, &'static [f64]);
/// (description, where_ applied to (cond, a, b), a, b, result dtype, expected values).
type WhereRow = (&'static str, WhereOp, In, In, DType, &'static [f64]);

/// One row: an op, the dtypes it exercises (input dtypes; the created dtype for creation ops), what shapes or
/// values it uses, and a body that builds the op on a device and checks the result.
struct Case {
    op: &'static str,
    dtypes: Vec<DType>,
    /// The result's dtype where the case knows it (a device that cannot hold it does not run the case).
    out: Option<DType>,
    what: String,
    body: Body,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Creation,
    Unary,
    Binary,
    Promotion,
    Cast,
    Reduce,
    Movement,
    Linalg,
    Random,
}

const GROUPS: [Group; 9] = [
    Group::Creation,
    Group::Unary,
    Group::Binary,
    Group::Promotion,
    Group::Cast,
    Group::Reduce,
    Group::Movement,
    Group::Linalg,
    Group::Random,
];

/// A tensor input: host data and shape.
#[derive(Clone)]
struct In {
    shape: Vec<usize>,
    buf: HostBuffer,
}

impl In {
    fn new(dtype: DType, shape: &[usize], vals: &[f64]) -> In {
        assert_eq!(shape.iter().product::<usize>(), vals.len(), "test bug: input shape {shape:?}");
        In { shape: shape.to_vec(), buf: buffer(dtype, vals) }
    }

    /// Deterministic data for `shape`, seeded by the case so that every case sees different numbers.
    fn random(dtype: DType, shape: &[usize], seed: u64, dom: Dom) -> In {
        let n = shape.iter().product();
        In::new(dtype, shape, &data(dtype, n, seed, dom))
    }

    fn buf(shape: &[usize], buf: HostBuffer) -> In {
        assert_eq!(shape.iter().product::<usize>(), buf.len(), "test bug: input shape {shape:?}");
        In { shape: shape.to_vec(), buf }
    }

    fn dtype(&self) -> DType {
        self.buf.dtype()
    }

    /// The stored values (after rounding to the dtype) as a reference array.
    fn nd(&self) -> Nd {
        Nd::new(&self.shape, values(&self.buf))
    }
}

/// An expected result.
struct Want {
    shape: Vec<usize>,
    buf: HostBuffer,
    kind: Kind,
}

impl Want {
    fn new(dtype: DType, shape: &[usize], vals: &[f64], kind: Kind) -> Want {
        assert_eq!(shape.iter().product::<usize>(), vals.len(), "test bug: expected shape {shape:?}");
        Want { shape: shape.to_vec(), buf: buffer(dtype, vals), kind }
    }

    fn nd(dtype: DType, nd: &Nd, kind: Kind) -> Want {
        Want::new(dtype, &nd.shape, &nd.v, kind)
    }

    fn buf(shape: &[usize], buf: HostBuffer, kind: Kind) -> Want {
        Want { shape: shape.to_vec(), buf, kind }
    }
}

/// A 1-D input.
fn v(dtype: DType, vals: &[f64]) -> In {
    In::new(dtype, &[vals.len()], vals)
}

fn label(ins: &[In]) -> String {
    ins.iter().map(|i| format!("{}{:?}", i.dtype(), i.shape)).collect::<Vec<_>>().join(", ")
}

#[derive(Default)]
struct Table {
    cases: Vec<Case>,
}

impl Table {
    /// A case with a hand-written body.
    fn custom(
        &mut self,
        op: &'static str,
        dtypes: &[DType],
        what: impl Into<String>,
        body: impl Fn(&Device) -> Result<(), String> + 'static,
    ) {
        self.cases.push(Case { op, dtypes: dtypes.to_vec(), out: None, what: what.into(), body: Box::new(body) });
    }

    /// `f(device)` must equal `want`.
    fn build(
        &mut self,
        op: &'static str,
        dtypes: &[DType],
        what: impl Into<String>,
        f: impl Fn(&Device) -> Tensor + 'static,
        want: Want,
    ) {
        let out = want.buf.dtype();
        self.custom(op, dtypes, what, move |dev| {
            let out = f(dev);
            if out.device() != *dev {
                return Err(format!("result on {} (want {dev})", out.device()));
            }
            check_tensor(&out, &want.shape, &want.buf, want.kind)
        });
        self.set_out(out);
    }

    /// Records the result dtype of the case just added.
    fn set_out(&mut self, d: DType) {
        if let Some(c) = self.cases.last_mut() {
            c.out = Some(d);
        }
    }

    /// `f(inputs uploaded to the device)` must equal `want`. The case's dtypes are the inputs' dtypes.
    fn check(
        &mut self,
        op: &'static str,
        note: &str,
        ins: Vec<In>,
        f: impl Fn(&[Tensor]) -> Tensor + 'static,
        want: Want,
    ) {
        let mut dtypes: Vec<DType> = ins.iter().map(In::dtype).collect();
        dtypes.sort();
        dtypes.dedup();
        let what = if note.is_empty() { label(&ins) } else { format!("{} {note}", label(&ins)) };
        let out_dtype = want.buf.dtype();
        self.custom(op, &dtypes, what, move |dev| {
            let ts = ins
                .iter()
                .map(|i| Tensor::from_host(i.buf.clone(), i.shape.clone(), dev))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("upload failed: {e}"))?;
            let out = f(&ts);
            if out.device() != *dev {
                return Err(format!("result on {} (want {dev})", out.device()));
            }
            check_tensor(&out, &want.shape, &want.buf, want.kind)
        });
        self.set_out(out_dtype);
    }
}

fn build(group: Group) -> Vec<Case> {
    let mut t = Table::default();
    match group {
        Group::Creation => creation(&mut t),
        Group::Unary => unary(&mut t),
        Group::Binary => binary(&mut t),
        Group::Promotion => {
            promotion(&mut t);
            unsigned32(&mut t);
        }
        Group::Cast => cast(&mut t),
        Group::Reduce => reduce(&mut t),
        Group::Movement => movement(&mut t),
        Group::Linalg => linalg(&mut t),
        Group::Random => random(&mut t),
    }
    t.cases
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Runs a group's cases on every device and fails with the list of every failing case.
fn run_group(group: Group) {
    let cases = build(group);
    assert!(!cases.is_empty(), "group {group:?} has no cases");
    let mut failures = Vec::new();
    let mut ran = 0;
    for dev in devices() {
        let mut skipped = 0;
        for c in &cases {
            if !runs_on(&dev, &c.dtypes) || c.out.is_some_and(|d| !dev.supports(d)) {
                skipped += 1;
                continue;
            }
            ran += 1;
            let err = match std::panic::catch_unwind(AssertUnwindSafe(|| (c.body)(&dev))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(p) => format!("panicked: {}", panic_message(p)),
            };
            let dtypes: Vec<&str> = c.dtypes.iter().map(|d| d.name()).collect();
            failures.push(format!("[{dev}] {} ({}) {}: {err}", c.op, dtypes.join(","), c.what));
        }
        if skipped > 0 {
            eprintln!(
                "{group:?} on {dev}: {skipped} cases whose inputs or result {dev} cannot hold (f64, i64, bf16; f16 without \
                 SHADER_F16) not run"
            );
        }
    }
    check_gpu_sources(&format!("{group:?}"));
    if !failures.is_empty() {
        let n = failures.len();
        failures.truncate(400);
        panic!("{group:?}: {n} of {ran} cases failed:\n  {}", failures.join("\n  "));
    }
}

#[test]
fn creation_ops() {
    run_group(Group::Creation);
}

#[test]
fn unary_ops() {
    run_group(Group::Unary);
}

#[test]
fn binary_ops() {
    run_group(Group::Binary);
}

#[test]
fn promotion_and_operators() {
    run_group(Group::Promotion);
}

#[test]
fn casts() {
    run_group(Group::Cast);
}

#[test]
fn reductions() {
    run_group(Group::Reduce);
}

#[test]
fn movement_ops() {
    run_group(Group::Movement);
}

#[test]
fn linalg_ops() {
    run_group(Group::Linalg);
}

/// The random ops: `manual_seed` and the draws act on this test thread's default generator.
#[test]
fn random_ops() {
    run_group(Group::Random);
}

// ---------------------------------------------------------------------------------------------------------------
// Shared reference helpers
// ---------------------------------------------------------------------------------------------------------------

/// The float dtype an int or bool input becomes under a float-only function (PyTorch's default dtype, f32).
fn float_of(d: DType) -> DType {
    if d.is_float() { d } else { F32 }
}

/// A seed per case from its description, so inputs differ between cases but never between runs.
fn seed(parts: &[&dyn std::fmt::Debug]) -> u64 {
    let s = format!("{parts:?}");
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Default input domain for ops that just move or compare values.
fn any_dom(d: DType) -> Dom {
    match d {
        F32 | F64 => Dom::Cont(-4.0, 4.0),
        _ => Dom::Cont(-100.0, 100.0),
    }
}

fn resolve_all(dims: &[isize], rank: usize) -> Vec<usize> {
    if rank == 0 {
        return Vec::new(); // a zero-dim tensor's pseudo-dim reduces nothing
    }
    if dims.is_empty() {
        return (0..rank).collect(); // an empty list reduces every dim, as in PyTorch
    }
    dims.iter().map(|&d| resolve(d, rank)).collect()
}

/// The result dtype of an elementwise op, from its input dtype (the unary and binary tables).
#[derive(Clone, Copy)]
enum Out {
    /// The input dtype.
    Same,
    /// Float inputs keep their dtype; ints and bool become f32.
    Float,
    Bool,
    /// `square`: bool becomes i64 (PyTorch's square is pow(x, 2)); others keep their dtype.
    Square,
}

impl Out {
    fn of(self, d: DType) -> DType {
        match self {
            Out::Same => d,
            Out::Float => float_of(d),
            Out::Bool => Bool,
            Out::Square if d == Bool => I64,
            Out::Square => d,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Coverage
// ---------------------------------------------------------------------------------------------------------------

/// Every op of the public API and the dtypes it must be covered with (for creation ops: the dtype created).
const REQUIRED: &[(&str, &[DType])] = &[
    // creation
    ("from_vec", &ALL_DTYPES),
    ("from_slice", &ALL_DTYPES),
    ("to_vec", &ALL_DTYPES),
    ("item", &ALL_DTYPES),
    ("zeros", &ALL_DTYPES),
    ("ones", &ALL_DTYPES),
    ("full", &ALL_DTYPES),
    ("arange", &[I64, F32]),
    ("linspace", &FLOATS),
    ("eye", &ALL_DTYPES),
    ("rand", &FLOATS),
    ("randn", &FLOATS),
    ("manual_seed", &FLOATS),
    // binary elementwise and operators
    ("add", &ALL_DTYPES),
    ("sub", &NON_BOOL),
    ("mul", &ALL_DTYPES),
    ("div", &ALL_DTYPES),
    ("operator +", &ALL_DTYPES),
    ("operator -", &NON_BOOL),
    ("operator *", &ALL_DTYPES),
    ("operator /", &ALL_DTYPES),
    ("operator -x", &NON_BOOL),
    ("maximum", &ALL_DTYPES),
    ("minimum", &ALL_DTYPES),
    ("pow", &NON_BOOL),
    ("powf", &ALL_DTYPES),
    ("lt", &ALL_DTYPES),
    ("le", &ALL_DTYPES),
    ("gt", &ALL_DTYPES),
    ("ge", &ALL_DTYPES),
    ("eq", &ALL_DTYPES),
    ("ne", &ALL_DTYPES),
    ("logical_and", &ALL_DTYPES),
    ("logical_or", &ALL_DTYPES),
    ("logical_not", &ALL_DTYPES),
    // unary elementwise
    ("neg", &NON_BOOL),
    ("abs", &ALL_DTYPES),
    ("exp", &ALL_DTYPES),
    ("log", &ALL_DTYPES),
    ("sin", &ALL_DTYPES),
    ("cos", &ALL_DTYPES),
    ("tanh", &ALL_DTYPES),
    ("sqrt", &ALL_DTYPES),
    ("recip", &ALL_DTYPES),
    ("rsqrt", &ALL_DTYPES),
    ("sigmoid", &ALL_DTYPES),
    ("log1p", &ALL_DTYPES),
    ("expm1", &ALL_DTYPES),
    ("sign", &ALL_DTYPES),
    ("floor", &ALL_DTYPES),
    ("ceil", &ALL_DTYPES),
    ("round", &ALL_DTYPES),
    ("trunc", &ALL_DTYPES),
    ("relu", &NON_BOOL),
    ("square", &ALL_DTYPES),
    ("clamp", &NON_BOOL),
    ("clamp_min", &NON_BOOL),
    ("clamp_max", &NON_BOOL),
    ("where_", &ALL_DTYPES),
    ("to_dtype", &ALL_DTYPES),
    // reductions
    ("sum", &ALL_DTYPES),
    ("prod", &ALL_DTYPES),
    ("max", &ALL_DTYPES),
    ("min", &ALL_DTYPES),
    ("mean", &FLOATS),
    ("logsumexp", &FLOATS),
    ("var", &FLOATS),
    ("std", &FLOATS),
    ("norm", &FLOATS),
    ("sum_all", &ALL_DTYPES),
    ("prod_all", &ALL_DTYPES),
    ("max_all", &ALL_DTYPES),
    ("min_all", &ALL_DTYPES),
    ("mean_all", &FLOATS),
    ("argmax", &NON_BOOL),
    ("argmin", &NON_BOOL),
    ("argmax_all", &NON_BOOL),
    ("argmin_all", &NON_BOOL),
    // movement
    ("reshape", &ALL_DTYPES),
    ("view", &ALL_DTYPES),
    ("flatten", &ALL_DTYPES),
    ("permute", &ALL_DTYPES),
    ("transpose", &ALL_DTYPES),
    ("t", &ALL_DTYPES),
    ("expand", &ALL_DTYPES),
    ("broadcast_to", &ALL_DTYPES),
    ("unsqueeze", &ALL_DTYPES),
    ("squeeze", &ALL_DTYPES),
    ("squeeze_all", &ALL_DTYPES),
    ("narrow", &ALL_DTYPES),
    ("slice", &ALL_DTYPES),
    ("flip", &ALL_DTYPES),
    ("pad_with", &ALL_DTYPES),
    ("tril", &ALL_DTYPES),
    ("triu", &ALL_DTYPES),
    ("roll", &ALL_DTYPES),
    ("repeat", &ALL_DTYPES),
    ("tile", &ALL_DTYPES),
    ("chunk", &ALL_DTYPES),
    ("split", &ALL_DTYPES),
    ("pad", &ALL_DTYPES),
    ("cat", &ALL_DTYPES),
    ("stack", &ALL_DTYPES),
    ("contiguous", &ALL_DTYPES),
    // linalg
    ("matmul", &[U8, U32, I32, I64, F16, F32, F64]),
    ("softmax", &FLOATS),
    ("log_softmax", &FLOATS),
];

#[test]
fn coverage() {
    let mut covered: BTreeMap<&str, BTreeSet<DType>> = BTreeMap::new();
    let mut cases: BTreeMap<&str, usize> = BTreeMap::new();
    let mut total = 0;
    for g in GROUPS {
        for c in build(g) {
            covered.entry(c.op).or_default().extend(&c.dtypes);
            *cases.entry(c.op).or_default() += 1;
            total += 1;
        }
    }
    let mut missing = Vec::new();
    for &(op, dtypes) in REQUIRED {
        let have = covered.get(op).cloned().unwrap_or_default();
        let lacking: Vec<&str> = dtypes.iter().filter(|d| !have.contains(d)).map(|d| d.name()).collect();
        if !lacking.is_empty() {
            missing.push(format!("{op}: {}", lacking.join(",")));
        }
    }
    let unlisted: Vec<&str> = covered.keys().filter(|op| !REQUIRED.iter().any(|(r, _)| r == *op)).copied().collect();

    let pairs: usize = covered.values().map(BTreeSet::len).sum();
    println!("op table coverage: {} ops, {pairs} op x dtype pairs, {total} cases per device", covered.len());
    println!("{:<14} {:>5}  {}", "op", "cases", ALL_DTYPES.map(|d| format!("{:<5}", d.name())).join(""));
    for (op, dtypes) in &covered {
        let row: String = ALL_DTYPES
            .iter()
            .map(|d| if dtypes.contains(d) { format!("{:<5}", "x") } else { format!("{:<5}", ".") })
            .collect();
        println!("{op:<14} {:>5}  {row}", cases[op]);
    }
    assert!(missing.is_empty(), "the op table misses required op x dtype pairs:\n  {}", missing.join("\n  "));
    assert!(unlisted.is_empty(), "ops in the table but not in REQUIRED (add them there): {unlisted:?}");
}

/// tanh near zero, in relative terms, and of NaN, on every device. The op table's f32 tolerance has an absolute term
/// that hides a relative error at 1e-6 (WGSL's builtin read tanh(1e-6) as 1.0133e-6 on Vulkan drivers), and a
/// driver may lose NaN (Mesa's GL driver gave -1). 0.125 is where the C-like renderer's series hands over to the
/// builtin.
#[test]
fn tanh_is_relatively_accurate_near_zero_and_keeps_nan() {
    let xs = [1e-6, -1e-6, 1e-4, 1e-3, -3e-3, 0.05, 0.1249, 0.125, -0.2, 1e-30, 0.0, f64::NAN];
    let want = buffer(F32, &xs.iter().map(|&x| (x as f32 as f64).tanh()).collect::<Vec<_>>());
    for dev in devices() {
        let x = Tensor::from_vec(xs.iter().map(|&x| x as f32).collect::<Vec<_>>(), [xs.len()], &dev).expect("upload");
        let got = x.tanh().to_host().expect("tanh");
        if let Err(e) = compare_on(&dev, &got, &want, tol(F32, Kind::Relative)) {
            panic!("[{dev}] tanh: {e}");
        }
    }
}
