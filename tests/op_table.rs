//! The op table: every public op of kiln x every dtype it supports x shape cases (0-dim, 1-D, n-D, broadcasting,
//! size-0 dims, negative dims, keepdim both ways), each with its expected values either written by hand from
//! PyTorch's semantics or computed in plain Rust by the naive reference in `common::Nd`. Tolerances come from
//! `common::tol` only.
//!
//! One test body per group: each `#[test]` below runs its group's cases on every device in `common::devices()`,
//! collects every failure (a panic inside kiln included) and reports them all at once. `coverage` asserts that the
//! table covers `REQUIRED` and prints an ops x dtypes summary (`cargo test --test op_table -- --nocapture`).
//!
//! Where PyTorch raises or leaves a result undefined and kiln documents its own choice (int ** negative int,
//! float -> int casts out of range or of NaN), the case says "kiln-defined" in its description.

mod test_cache;

mod common;

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

// ---------------------------------------------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------------------------------------------

/// from_vec / from_slice / to_vec / item round trips, bit for bit.
fn roundtrip<T: kiln::Element>(t: &mut Table, data: Vec<T>) {
    let d = T::DTYPE;
    assert_eq!(data.len(), 6);
    let shapes: [Vec<usize>; 6] = [vec![6], vec![2, 3], vec![3, 1, 2], vec![], vec![0], vec![2, 0]];
    for shape in shapes {
        let n: usize = shape.iter().product();
        let part = data[..n].to_vec();
        let want = Want::buf(&shape, T::into_buffer(part.clone()), Kind::Exact);
        let what = format!("{shape:?}");
        t.build(
            "from_vec",
            &[d],
            what,
            move |dev| Tensor::from_vec(part.clone(), shape.clone(), dev).expect("from_vec"),
            want,
        );
    }
    // from_slice, to_vec and item are checked as plain values rather than via HostBuffer.
    let p = data.clone();
    t.custom("from_slice", &[d], "[2, 3] and []", move |dev| {
        let x = Tensor::from_slice(&p, [2, 3], dev).map_err(|e| e.to_string())?;
        let got = T::into_buffer(x.to_vec::<T>().map_err(|e| e.to_string())?);
        compare(&got, &T::into_buffer(p.clone()), Tol::EXACT)?;
        let s = Tensor::from_slice(&p[..1], [], dev).map_err(|e| e.to_string())?;
        if s.dims() != [0usize; 0] || s.dtype() != d {
            return Err(format!("0-dim from_slice gave {s:?}"));
        }
        compare(
            &T::into_buffer(s.to_vec::<T>().map_err(|e| e.to_string())?),
            &T::into_buffer(p[..1].to_vec()),
            Tol::EXACT,
        )
    });
    let p = data.clone();
    t.custom("to_vec", &[d], "[3, 2] after a reshape", move |dev| {
        let x = Tensor::from_vec(p.clone(), [2, 3], dev).map_err(|e| e.to_string())?.reshape([3, 2]);
        compare(&T::into_buffer(x.to_vec::<T>().map_err(|e| e.to_string())?), &T::into_buffer(p.clone()), Tol::EXACT)
    });
    for (shape, idx) in [(vec![], 0usize), (vec![1, 1], 3), (vec![1], 5)] {
        let p = data.clone();
        t.custom("item", &[d], format!("{shape:?}"), move |dev| {
            let x = Tensor::from_vec(vec![p[idx]], shape.clone(), dev).map_err(|e| e.to_string())?;
            let v: T = x.item::<T>().map_err(|e| e.to_string())?;
            compare(&T::into_buffer(vec![v]), &T::into_buffer(vec![p[idx]]), Tol::EXACT)
        });
    }
}

fn creation(t: &mut Table) {
    roundtrip(t, vec![true, false, false, true, true, false]);
    roundtrip(t, vec![0u8, 1, 127, 128, 254, 255]);
    roundtrip(t, vec![0u32, 1, 65_535, 1 << 31, u32::MAX - 1, u32::MAX]);
    roundtrip(t, vec![i32::MIN, -1, 0, 1, 7, i32::MAX]);
    roundtrip(t, vec![i64::MIN, -1, 0, 1, 1 << 40, i64::MAX]);
    roundtrip(t, vec![-0.0f32, 1.5, -2.25, f32::INFINITY, f32::NAN, 1e-40]);
    roundtrip(t, [-0.0f32, 1.5, -65504.0, f32::INFINITY, f32::NAN, 6e-8].map(f16::from_f32).to_vec());
    roundtrip(t, vec![-0.0f64, 0.1, -1e300, f64::NEG_INFINITY, f64::NAN, 5e-324]);
    roundtrip(t, [-0.0f32, 1.5, -3.3895314e38, f32::INFINITY, f32::NAN, 9.2e-41].map(kiln::bf16::from_f32).to_vec());

    for d in ALL_DTYPES {
        for shape in [vec![], vec![0], vec![2, 3], vec![2, 0, 3]] {
            let n: usize = shape.iter().product();
            let s = shape.clone();
            t.build(
                "zeros",
                &[d],
                format!("{shape:?}"),
                move |dev| Tensor::zeros(s.clone(), d, dev),
                Want::new(d, &shape, &vec![0.0; n], Kind::Exact),
            );
            let s = shape.clone();
            t.build(
                "ones",
                &[d],
                format!("{shape:?}"),
                move |dev| Tensor::ones(s.clone(), d, dev),
                Want::new(d, &shape, &vec![1.0; n], Kind::Exact),
            );
            let s = shape.clone();
            t.build(
                "full",
                &[d],
                format!("{shape:?} value 3"),
                move |dev| Tensor::full(s.clone(), 3, d, dev),
                Want::new(d, &shape, &vec![3.0; n], Kind::Exact),
            );
        }
        // A float value into an int dtype truncates toward zero (torch.full(.., 2.7, dtype=int32) is 2); bool is
        // value != 0.
        t.build(
            "full",
            &[d],
            "[3] value 2.7",
            move |dev| Tensor::full([3], 2.7, d, dev),
            Want::new(d, &[3], &[2.7; 3], Kind::Exact),
        );
        t.build(
            "full",
            &[d],
            "[2] value true",
            move |dev| Tensor::full([2], true, d, dev),
            Want::new(d, &[2], &[1.0; 2], Kind::Exact),
        );
        if d != U8 && d != Bool {
            t.build(
                "full",
                &[d],
                "[2] value -2.7",
                move |dev| Tensor::full([2], -2.7, d, dev),
                Want::new(d, &[2], &[-2.7; 2], Kind::Exact),
            );
        }
        for n in [0usize, 1, 3] {
            let want = Nd::from_fn(&[n, n], |i| (i[0] == i[1]) as u8 as f64);
            t.build(
                "eye",
                &[d],
                format!("n = {n}"),
                move |dev| Tensor::eye(n, d, dev),
                Want::nd(d, &want, Kind::Exact),
            );
        }
    }

    // arange: i64 when start, end and step are all integers, else f32; the length is ceil((end - start) / step).
    let ar: Vec<(&str, Build, DType, Vec<f64>)> = vec![
        ("0..5 by 1", Box::new(|d| Tensor::arange(0, 5, 1, d)), I64, vec![0.0, 1.0, 2.0, 3.0, 4.0]),
        ("0..10 by 3", Box::new(|d| Tensor::arange(0, 10, 3, d)), I64, vec![0.0, 3.0, 6.0, 9.0]),
        ("5..0 by -2", Box::new(|d| Tensor::arange(5, 0, -2, d)), I64, vec![5.0, 3.0, 1.0]),
        ("-3..3 by 2", Box::new(|d| Tensor::arange(-3, 3, 2, d)), I64, vec![-3.0, -1.0, 1.0]),
        ("3..3 (empty)", Box::new(|d| Tensor::arange(3, 3, 1, d)), I64, vec![]),
        ("i32 args", Box::new(|d| Tensor::arange(1i32, 4i32, 1i32, d)), I64, vec![1.0, 2.0, 3.0]),
        ("0.0..1.0 by 0.25", Box::new(|d| Tensor::arange(0.0, 1.0, 0.25, d)), F32, vec![0.0, 0.25, 0.5, 0.75]),
        ("1.0..-1.0 by -0.5", Box::new(|d| Tensor::arange(1.0, -1.0, -0.5, d)), F32, vec![1.0, 0.5, 0.0, -0.5]),
        ("0.5..3 by 1 (mixed)", Box::new(|d| Tensor::arange(0.5, 3, 1, d)), F32, vec![0.5, 1.5, 2.5]),
        ("0..1.0 by 0.1", Box::new(|d| Tensor::arange(0, 1.0, 0.1, d)), F32, (0..10).map(|i| i as f64 * 0.1).collect()),
    ];
    for (what, f, d, v) in ar {
        let n = v.len();
        t.build("arange", &[d], what, f, Want::new(d, &[n], &v, Kind::Elementwise));
    }

    // linspace: both ends exact, evenly spaced in between (PyTorch's symmetric formula).
    for (a, b, n, d) in
        [(0.0, 1.0, 5, F32), (1.0, -1.0, 3, F64), (0.0, 1.0, 0, F32), (2.0, 3.0, 1, F64), (0.0, 1.0, 7, F32)]
            .into_iter()
            .chain([(-3.5, 10.0, 100, F64), (-3.5, 10.0, 100, F32), (0.1, 0.7, 4, F32)])
            .chain([(0.0, 1.0, 5, F16), (-3.5, 10.0, 100, F16), (0.0, 1.0, 5, BF16), (-3.5, 10.0, 100, BF16)])
    {
        let v: Vec<f64> = (0..n).map(|i| if n == 1 { a } else { a + (b - a) * i as f64 / (n - 1) as f64 }).collect();
        t.build(
            "linspace",
            &[d],
            format!("{a}..={b}, {n} steps"),
            move |dev| Tensor::linspace(a, b, n, d, dev),
            Want::new(d, &[n], &v, Kind::Elementwise),
        );
    }
    t.build(
        "linspace",
        &[F32],
        "0.1..=0.7: the endpoints are bit-exact",
        |dev| {
            let x = Tensor::linspace(0.1, 0.7, 4, F32, dev);
            Tensor::cat(&[&x.narrow(0, 0, 1), &x.narrow(0, 3, 1)], 0)
        },
        Want::new(F32, &[2], &[0.1, 0.7], Kind::Exact),
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Unary elementwise
// ---------------------------------------------------------------------------------------------------------------

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

struct Un {
    op: &'static str,
    f: fn(&Tensor) -> Tensor,
    r: fn(f64) -> f64,
    dtypes: &'static [DType],
    dom: Dom,
    out: Out,
    kind: Kind,
}

fn un(
    op: &'static str,
    f: fn(&Tensor) -> Tensor,
    r: fn(f64) -> f64,
    dtypes: &'static [DType],
    dom: Dom,
    out: Out,
    kind: Kind,
) -> Un {
    Un { op, f, r, dtypes, dom, out, kind }
}

const UNARY_SHAPES: [&[usize]; 5] = [&[], &[5], &[2, 3], &[2, 0, 3], &[2, 3, 4]];

fn unary(t: &mut Table) {
    use Kind::{Elementwise as E, Exact as X};
    use Out::{Bool as B, Float as Fl, Same as S};
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let ops = [
        un("exp", Tensor::exp, f64::exp, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("log", Tensor::log, f64::ln, &ALL_DTYPES, Dom::Cont(0.05, 20.0), Fl, E),
        un("sin", Tensor::sin, f64::sin, &ALL_DTYPES, Dom::Cont(-6.0, 6.0), Fl, E),
        un("cos", Tensor::cos, f64::cos, &ALL_DTYPES, Dom::Cont(-6.0, 6.0), Fl, E),
        un("tanh", Tensor::tanh, f64::tanh, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("sqrt", Tensor::sqrt, f64::sqrt, &ALL_DTYPES, Dom::Cont(0.0, 50.0), Fl, E),
        un("recip", Tensor::recip, |x| 1.0 / x, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un("rsqrt", Tensor::rsqrt, |x| 1.0 / x.sqrt(), &ALL_DTYPES, Dom::Cont(0.05, 50.0), Fl, E),
        un("sigmoid", Tensor::sigmoid, sigmoid, &ALL_DTYPES, Dom::Cont(-8.0, 8.0), Fl, E),
        un("neg", Tensor::neg, |x| -x, &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("abs", Tensor::abs, f64::abs, &ALL_DTYPES, Dom::Cont(-100.0, 100.0), S, X),
        un("relu", Tensor::relu, |x| x.max(0.0), &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("square", Tensor::square, |x| x * x, &ALL_DTYPES, Dom::Cont(-100.0, 100.0), Out::Square, E),
        un("logical_not", Tensor::logical_not, |x| (x == 0.0) as u8 as f64, &ALL_DTYPES, Dom::Grid(-2.0, 2.0), B, X),
        un("operator -x", |x| -x, |x| -x, &NON_BOOL, Dom::Cont(-100.0, 100.0), S, X),
        un("floor", Tensor::floor, f64::floor, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("ceil", Tensor::ceil, f64::ceil, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("round", Tensor::round, f64::round_ties_even, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("trunc", Tensor::trunc, f64::trunc, &ALL_DTYPES, Dom::Cont(-20.0, 20.0), S, X),
        un("log1p", Tensor::log1p, f64::ln_1p, &ALL_DTYPES, Dom::Cont(-0.9, 20.0), Fl, E),
        un("expm1", Tensor::expm1, f64::exp_m1, &ALL_DTYPES, Dom::Cont(-4.0, 4.0), Fl, E),
        un(
            "sign",
            Tensor::sign,
            |x| (x > 0.0) as u8 as f64 - (x < 0.0) as u8 as f64,
            &ALL_DTYPES,
            Dom::Grid(-2.0, 2.0),
            S,
            X,
        ),
    ];
    for u in ops {
        for &d in u.dtypes {
            for shape in UNARY_SHAPES {
                let x = In::random(d, shape, seed(&[&u.op, &d, &shape]), u.dom);
                let od = u.out.of(d);
                // Int and bool inputs are small integers, exact in f32, so the reference needs no conversion.
                let want = x.nd().map(u.r);
                let f = u.f;
                t.check(u.op, "", vec![x], move |a| f(&a[0]), Want::nd(od, &want, u.kind));
            }
        }
    }

    // IEEE special values, bit-exact (the sign of zero included).
    let specials: [(&str, UnOp, &[f64], &[f64]); 21] = [
        ("exp", Tensor::exp, &[-INF, INF, NAN, 0.0, -0.0], &[0.0, INF, NAN, 1.0, 1.0]),
        ("log", Tensor::log, &[0.0, -0.0, -1.0, INF, 1.0], &[-INF, -INF, NAN, INF, 0.0]),
        ("sin", Tensor::sin, &[0.0, -0.0, INF, NAN], &[0.0, -0.0, NAN, NAN]),
        ("cos", Tensor::cos, &[0.0, INF, NAN], &[1.0, NAN, NAN]),
        ("tanh", Tensor::tanh, &[INF, -INF, NAN, 0.0, -0.0], &[1.0, -1.0, NAN, 0.0, -0.0]),
        ("sqrt", Tensor::sqrt, &[-1.0, -0.0, INF, 4.0, 0.0], &[NAN, -0.0, INF, 2.0, 0.0]),
        ("recip", Tensor::recip, &[0.0, -0.0, INF, -INF, 4.0], &[INF, -INF, 0.0, -0.0, 0.25]),
        ("rsqrt", Tensor::rsqrt, &[0.0, INF, 4.0, -1.0], &[INF, 0.0, 0.5, NAN]),
        ("sigmoid", Tensor::sigmoid, &[INF, -INF, NAN, 0.0], &[1.0, 0.0, NAN, 0.5]),
        ("neg", Tensor::neg, &[0.0, -0.0, INF, NAN], &[-0.0, 0.0, -INF, NAN]),
        ("abs", Tensor::abs, &[-0.0, -INF, NAN, -2.5], &[0.0, INF, NAN, 2.5]),
        ("relu", Tensor::relu, &[-INF, INF, NAN, -3.0, 2.5], &[0.0, INF, NAN, 0.0, 2.5]),
        ("square", Tensor::square, &[INF, -INF, NAN, -0.0], &[INF, INF, NAN, 0.0]),
        ("logical_not", Tensor::logical_not, &[NAN, 0.0, -0.0, INF], &[0.0, 1.0, 1.0, 0.0]),
        ("floor", Tensor::floor, &[-0.0, 0.5, -0.5, INF, NAN, -2.5], &[-0.0, 0.0, -1.0, INF, NAN, -3.0]),
        ("ceil", Tensor::ceil, &[-0.5, 0.5, -0.0, -INF, NAN, 2.5], &[-0.0, 1.0, -0.0, -INF, NAN, 3.0]),
        ("round", Tensor::round, &[0.5, 1.5, 2.5, -0.5, -2.5, NAN, INF], &[0.0, 2.0, 2.0, -0.0, -2.0, NAN, INF]),
        ("trunc", Tensor::trunc, &[-0.7, 2.9, -INF, NAN, -0.0], &[-0.0, 2.0, -INF, NAN, -0.0]),
        ("log1p", Tensor::log1p, &[-1.0, -0.0, INF, -2.0, NAN, 0.0], &[-INF, -0.0, INF, NAN, NAN, 0.0]),
        ("expm1", Tensor::expm1, &[-0.0, -INF, INF, NAN, 0.0], &[-0.0, -1.0, INF, NAN, 0.0]),
        // PyTorch's sign: 0 for NaN and for -0.0 (a +0.0).
        ("sign", Tensor::sign, &[-0.0, NAN, -INF, INF, 0.0, -2.5], &[0.0, 0.0, -1.0, 1.0, 0.0, -1.0]),
    ];
    for (op, f, x, want) in specials {
        for d in FLOATS {
            let od = if op == "logical_not" { Bool } else { d };
            let n = x.len();
            t.check(
                op,
                "IEEE special values",
                vec![In::new(d, &[n], x)],
                move |a| f(&a[0]),
                Want::new(od, &[n], want, Kind::Exact),
            );
        }
    }
    // log1p and expm1 near 0, where log(1 + x) and exp(x) - 1 keep no digit of x: relative accuracy.
    for d in [F32, F64] {
        let x = [1e-10f64, -1e-7, 3e-5, -2e-3, 0.1, -0.12, 0.13];
        for (op, f, r) in
            [("log1p", Tensor::log1p as UnOp, f64::ln_1p as fn(f64) -> f64), ("expm1", Tensor::expm1, f64::exp_m1)]
        {
            let want: Vec<f64> = x.iter().map(|&v| r(v)).collect();
            t.check(
                op,
                "near 0, relative",
                vec![In::new(d, &[7], &x)],
                move |a| f(&a[0]),
                Want::new(d, &[7], &want, Kind::Relative),
            );
        }
    }
    // Sigmoid far in the tails: exp(-x) overflows (or is 0) without making the result NaN.
    for d in FLOATS {
        let x = [-1000.0f64, -100.0, 100.0, 1000.0];
        let want: Vec<f64> = x.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect();
        t.check(
            "sigmoid",
            "tails",
            vec![In::new(d, &[4], &x)],
            |a| a[0].sigmoid(),
            Want::new(d, &[4], &want, Kind::Elementwise),
        );
    }
    // Integer wrapping at the type's bounds (PyTorch wraps too).
    t.check(
        "neg",
        "u8 wraps",
        vec![v(U8, &[0.0, 1.0, 255.0])],
        |a| a[0].neg(),
        Want::new(U8, &[3], &[0.0, 255.0, 1.0], Kind::Exact),
    );
    let (mn, mx) = (i32::MIN as f64, i32::MAX as f64);
    t.check(
        "neg",
        "i32 bounds wrap",
        vec![v(I32, &[mn, mx])],
        |a| a[0].neg(),
        Want::new(I32, &[2], &[mn, -mx], Kind::Exact),
    );
    t.check(
        "abs",
        "i32::MIN wraps",
        vec![v(I32, &[mn, -mx])],
        |a| a[0].abs(),
        Want::new(I32, &[2], &[mn, mx], Kind::Exact),
    );
    let i64s = In::buf(&[3], HostBuffer::I64(vec![i64::MIN, i64::MAX, -5].into()));
    t.check(
        "abs",
        "i64 bounds",
        vec![i64s.clone()],
        |a| a[0].abs(),
        Want::buf(&[3], HostBuffer::I64(vec![i64::MIN, i64::MAX, 5].into()), Kind::Exact),
    );
    t.check(
        "neg",
        "i64 bounds",
        vec![i64s],
        |a| a[0].neg(),
        Want::buf(&[3], HostBuffer::I64(vec![i64::MIN, -i64::MAX, 5].into()), Kind::Exact),
    );
    t.check(
        "square",
        "u8 wraps",
        vec![v(U8, &[16.0, 255.0, 3.0])],
        |a| a[0].square(),
        Want::new(U8, &[3], &[0.0, 1.0, 9.0], Kind::Exact),
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Binary elementwise (same dtype on both sides, broadcasting)
// ---------------------------------------------------------------------------------------------------------------

struct Bin {
    op: &'static str,
    f: fn(&Tensor, &Tensor) -> Tensor,
    /// Reference on the promoted values; the dtype is the promoted (compute) dtype.
    r: fn(f64, f64, DType) -> f64,
    dtypes: &'static [DType],
    doms: fn(DType) -> (Dom, Dom),
    out: Out,
    kind: Kind,
}

fn bin(
    op: &'static str,
    f: fn(&Tensor, &Tensor) -> Tensor,
    r: fn(f64, f64, DType) -> f64,
    dtypes: &'static [DType],
    doms: fn(DType) -> (Dom, Dom),
    out: Out,
    kind: Kind,
) -> Bin {
    Bin { op, f, r, dtypes, doms, out, kind }
}

const BINARY_SHAPES: [(&[usize], &[usize]); 7] = [
    (&[2, 3], &[2, 3]),
    (&[2, 1, 3], &[4, 1]),
    (&[], &[3]),
    (&[4], &[]),
    (&[], &[]),
    (&[0, 3], &[3]),
    (&[2, 3, 4], &[3, 1]),
];

fn int_pow(x: f64, y: f64) -> f64 {
    let (mut acc, x) = (1i64, x as i64);
    for _ in 0..y as i64 {
        acc = acc.wrapping_mul(x);
    }
    acc as f64
}

fn cmp(b: bool) -> f64 {
    b as u8 as f64
}

fn wide(_: DType) -> (Dom, Dom) {
    (Dom::Cont(-100.0, 100.0), Dom::Cont(-100.0, 100.0))
}

fn grid(_: DType) -> (Dom, Dom) {
    (Dom::Grid(-3.0, 3.0), Dom::Grid(-3.0, 3.0))
}

fn truth(_: DType) -> (Dom, Dom) {
    (Dom::Grid(-1.0, 1.0), Dom::Grid(-1.0, 1.0))
}

/// Zeros on the right, so x/0 = +-inf and 0/0 = NaN are covered.
fn divisor(_: DType) -> (Dom, Dom) {
    (Dom::Cont(-100.0, 100.0), Dom::Grid(-4.0, 4.0))
}

fn pow_doms(d: DType) -> (Dom, Dom) {
    if d.is_float() {
        (Dom::Cont(0.1, 4.0), Dom::Cont(-2.0, 3.0))
    } else {
        (Dom::Cont(-4.0, 6.0), Dom::Cont(0.0, 5.0)) // u8 6^5 wraps
    }
}

fn pow_ref(x: f64, y: f64, d: DType) -> f64 {
    if d.is_float() { x.powf(y) } else { int_pow(x, y) }
}

fn binary(t: &mut Table) {
    use Kind::{Elementwise as E, Exact as X};
    let ops = [
        bin("add", |a, b| a.add(b), |x, y, _| x + y, &ALL_DTYPES, wide, Out::Same, E),
        bin("sub", |a, b| a.sub(b), |x, y, _| x - y, &NON_BOOL, wide, Out::Same, E),
        bin("mul", |a, b| a.mul(b), |x, y, _| x * y, &ALL_DTYPES, wide, Out::Same, E),
        bin("div", |a, b| a.div(b), |x, y, _| x / y, &ALL_DTYPES, divisor, Out::Float, E),
        bin("maximum", |a, b| a.maximum(b), |x, y, _| x.max(y), &ALL_DTYPES, grid, Out::Same, X),
        bin("minimum", |a, b| a.minimum(b), |x, y, _| x.min(y), &ALL_DTYPES, grid, Out::Same, X),
        bin("pow", |a, b| a.pow(b), pow_ref, &NON_BOOL, pow_doms, Out::Same, E),
        bin("lt", |a, b| a.lt(b), |x, y, _| cmp(x < y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("le", |a, b| a.le(b), |x, y, _| cmp(x <= y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("gt", |a, b| a.gt(b), |x, y, _| cmp(x > y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("ge", |a, b| a.ge(b), |x, y, _| cmp(x >= y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("eq", |a, b| a.eq(b), |x, y, _| cmp(x == y), &ALL_DTYPES, grid, Out::Bool, X),
        bin("ne", |a, b| a.ne(b), |x, y, _| cmp(x != y), &ALL_DTYPES, grid, Out::Bool, X),
        bin(
            "logical_and",
            |a, b| a.logical_and(b),
            |x, y, _| cmp(x != 0.0 && y != 0.0),
            &ALL_DTYPES,
            truth,
            Out::Bool,
            X,
        ),
        bin(
            "logical_or",
            |a, b| a.logical_or(b),
            |x, y, _| cmp(x != 0.0 || y != 0.0),
            &ALL_DTYPES,
            truth,
            Out::Bool,
            X,
        ),
        bin("clamp_min", |a, b| a.clamp_min(b), |x, y, _| x.max(y), &NON_BOOL, grid, Out::Same, X),
        bin("clamp_max", |a, b| a.clamp_max(b), |x, y, _| x.min(y), &NON_BOOL, grid, Out::Same, X),
        bin("operator +", |a, b| a + b, |x, y, _| x + y, &ALL_DTYPES, wide, Out::Same, E),
        bin("operator -", |a, b| a - b, |x, y, _| x - y, &NON_BOOL, wide, Out::Same, E),
        bin("operator *", |a, b| a * b, |x, y, _| x * y, &ALL_DTYPES, wide, Out::Same, E),
        bin("operator /", |a, b| a / b, |x, y, _| x / y, &ALL_DTYPES, divisor, Out::Float, E),
    ];
    for b in ops {
        for &d in b.dtypes {
            let (da, db) = (b.doms)(d);
            for (sa, sb) in BINARY_SHAPES {
                let x = In::random(d, sa, seed(&[&b.op, &d, &sa, &0]), da);
                let y = In::random(d, sb, seed(&[&b.op, &d, &sb, &1]), db);
                let cd = if b.op.contains('/') || b.op == "div" { float_of(d) } else { d };
                let r = b.r;
                let want = x.nd().zip(&y.nd(), |p, q| r(p, q, cd));
                let f = b.f;
                t.check(b.op, "", vec![x, y], move |a| f(&a[0], &a[1]), Want::nd(b.out.of(d), &want, b.kind));
            }
        }
    }

    // NaN and infinities.
    for d in FLOATS {
        let a = v(d, &[1.0, NAN, 3.0, NAN, -INF]);
        let b = v(d, &[NAN, 2.0, 1.0, NAN, 5.0]);
        // torch.maximum / torch.minimum propagate NaN from either side.
        t.check(
            "maximum",
            "NaN propagates",
            vec![a.clone(), b.clone()],
            |x| x[0].maximum(&x[1]),
            Want::new(d, &[5], &[NAN, NAN, 3.0, NAN, 5.0], Kind::Exact),
        );
        t.check(
            "minimum",
            "NaN propagates",
            vec![a.clone(), b.clone()],
            |x| x[0].minimum(&x[1]),
            Want::new(d, &[5], &[NAN, NAN, 1.0, NAN, -INF], Kind::Exact),
        );
        let cmps: [(&str, BinOp, [f64; 5]); 6] = [
            ("lt", |x, y| x.lt(y), [0.0, 0.0, 0.0, 0.0, 1.0]),
            ("le", |x, y| x.le(y), [0.0, 0.0, 0.0, 0.0, 1.0]),
            ("gt", |x, y| x.gt(y), [0.0, 0.0, 1.0, 0.0, 0.0]),
            ("ge", |x, y| x.ge(y), [0.0, 0.0, 1.0, 0.0, 0.0]),
            ("eq", |x, y| x.eq(y), [0.0, 0.0, 0.0, 0.0, 0.0]),
            ("ne", |x, y| x.ne(y), [1.0, 1.0, 1.0, 1.0, 1.0]),
        ];
        for (op, f, want) in cmps {
            t.check(
                op,
                "NaN compares false (ne true)",
                vec![a.clone(), b.clone()],
                move |x| f(&x[0], &x[1]),
                Want::new(Bool, &[5], &want, Kind::Exact),
            );
        }
        let p = v(d, &[INF, 0.0, INF, -0.0]);
        let q = v(d, &[-INF, INF, INF, 0.0]);
        t.check(
            "add",
            "inf + -inf is NaN",
            vec![p.clone(), q.clone()],
            |x| &x[0] + &x[1],
            Want::new(d, &[4], &[NAN, INF, INF, 0.0], Kind::Exact),
        );
        t.check(
            "mul",
            "0 * inf is NaN",
            vec![p.clone(), q.clone()],
            |x| &x[0] * &x[1],
            Want::new(d, &[4], &[-INF, NAN, INF, -0.0], Kind::Exact),
        );
        t.check(
            "eq",
            "-0.0 == 0.0, inf == inf",
            vec![p, q],
            |x| x[0].eq(&x[1]),
            Want::new(Bool, &[4], &[0.0, 0.0, 1.0, 1.0], Kind::Exact),
        );
        t.check(
            "clamp_min",
            "NaN stays NaN",
            vec![v(d, &[NAN, -5.0, 5.0])],
            |x| x[0].clamp_min(0),
            Want::new(d, &[3], &[NAN, 0.0, 5.0], Kind::Exact),
        );
        t.check(
            "clamp_max",
            "NaN stays NaN",
            vec![v(d, &[NAN, -5.0, 5.0])],
            |x| x[0].clamp_max(0),
            Want::new(d, &[3], &[NAN, -5.0, 0.0], Kind::Exact),
        );
    }

    // Integer wrapping (two's complement, as PyTorch).
    let (mn, mx) = (i32::MIN as f64, i32::MAX as f64);
    t.check(
        "add",
        "i32 wraps",
        vec![v(I32, &[mx, mn]), v(I32, &[1.0, -1.0])],
        |x| x[0].add(&x[1]),
        Want::new(I32, &[2], &[mn, mx], Kind::Exact),
    );
    t.check(
        "mul",
        "i32 wraps",
        vec![v(I32, &[65536.0, 65537.0]), v(I32, &[65536.0, 65537.0])],
        |x| x[0].mul(&x[1]),
        Want::new(I32, &[2], &[0.0, 131073.0], Kind::Exact),
    );
    t.check(
        "add",
        "i64 wraps",
        vec![
            In::buf(&[2], HostBuffer::I64(vec![i64::MAX, i64::MIN].into())),
            In::buf(&[2], HostBuffer::I64(vec![1, -1].into())),
        ],
        |x| x[0].add(&x[1]),
        Want::buf(&[2], HostBuffer::I64(vec![i64::MIN, i64::MAX].into()), Kind::Exact),
    );
    t.check(
        "sub",
        "u8 wraps",
        vec![v(U8, &[3.0, 250.0, 0.0]), v(U8, &[5.0, 255.0, 1.0])],
        |x| x[0].sub(&x[1]),
        Want::new(U8, &[3], &[254.0, 251.0, 255.0], Kind::Exact),
    );
    // True division of ints: f32, with x/0 = +-inf and 0/0 = NaN.
    for d in [U8, U32, I32, I64] {
        let (a, w): (&[f64], &[f64]) = if d.is_unsigned() {
            (&[7.0, 255.0, 0.0, 1.0], &[3.5, 127.5, NAN, INF])
        } else {
            (&[7.0, -7.0, 0.0, 1.0], &[3.5, -3.5, NAN, INF])
        };
        t.check(
            "div",
            "int / int -> f32",
            vec![In::new(d, &[4], a), v(d, &[2.0, 2.0, 0.0, 0.0])],
            |x| x[0].div(&x[1]),
            Want::new(F32, &[4], w, Kind::Exact),
        );
    }
    // Integer powers; a negative exponent gives 1/x truncated (kiln-defined: PyTorch raises).
    t.check(
        "pow",
        "i64 exact",
        vec![v(I64, &[2.0, -3.0, 0.0, 5.0, 3.0, -2.0, 10.0]), v(I64, &[10.0, 3.0, 0.0, 0.0, 1.0, 4.0, 15.0])],
        |x| x[0].pow(&x[1]),
        Want::new(I64, &[7], &[1024.0, -27.0, 1.0, 1.0, 3.0, 16.0, 1e15], Kind::Exact),
    );
    t.check(
        "pow",
        "int ** negative int (kiln-defined)",
        vec![v(I32, &[1.0, -1.0, 2.0, -1.0]), v(I32, &[-2.0, -3.0, -1.0, -2.0])],
        |x| x[0].pow(&x[1]),
        Want::new(I32, &[4], &[1.0, -1.0, 0.0, 1.0], Kind::Exact),
    );
    for d in FLOATS {
        t.check(
            "pow",
            "float special cases",
            vec![v(d, &[-8.0, 0.0, 0.0, 2.0, -2.0, INF]), v(d, &[1.0 / 3.0, -1.0, 0.0, 0.5, 2.0, -1.0])],
            |x| x[0].pow(&x[1]),
            Want::new(d, &[6], &[NAN, INF, 1.0, 2f64.sqrt(), 4.0, 0.0], Kind::Elementwise),
        );
    }
    // powf: a float exponent; ints and bool are promoted to f32.
    for d in ALL_DTYPES {
        let x = In::random(d, &[2, 3], seed(&[&"powf", &d]), Dom::Cont(0.0, 9.0));
        for e in [0.5, 2.0, -1.5] {
            let want = x.nd().map(|v| v.powf(e));
            t.check(
                "powf",
                &format!("** {e}"),
                vec![x.clone()],
                move |a| a[0].powf(e),
                Want::nd(float_of(d), &want, Kind::Elementwise),
            );
        }
    }

    // clamp: maximum then minimum; NaN stays, min > max gives max everywhere (as torch.clamp).
    for d in NON_BOOL {
        for shape in [&[][..], &[7], &[2, 0], &[2, 3]] {
            let x = In::random(d, shape, seed(&[&"clamp", &d, &shape]), Dom::Grid(-3.0, 3.0));
            let want = x.nd().map(|v| v.clamp(1.0, 2.0));
            t.check("clamp", "to [1, 2]", vec![x], |a| a[0].clamp(1, 2), Want::nd(d, &want, Kind::Exact));
        }
        let x = In::random(d, &[2, 3], seed(&[&"clamp t", &d]), Dom::Grid(-3.0, 3.0));
        let lo = In::random(d, &[3], seed(&[&"clamp lo", &d]), Dom::Grid(-1.0, 0.0));
        let hi = In::random(d, &[2, 1], seed(&[&"clamp hi", &d]), Dom::Grid(1.0, 2.0));
        let want = x.nd().zip(&lo.nd(), f64::max).zip(&hi.nd(), f64::min);
        t.check(
            "clamp",
            "broadcast tensor bounds",
            vec![x, lo, hi],
            |a| a[0].clamp(&a[1], &a[2]),
            Want::nd(d, &want, Kind::Exact),
        );
        t.check(
            "clamp",
            "min > max gives max",
            vec![v(d, &[0.0, 5.0, 3.0])],
            |a| a[0].clamp(2, 1),
            Want::new(d, &[3], &[1.0; 3], Kind::Exact),
        );
    }
    for d in FLOATS {
        t.check(
            "clamp",
            "NaN stays NaN",
            vec![v(d, &[NAN, 5.0, -5.0])],
            |a| a[0].clamp(-1.0, 1.0),
            Want::new(d, &[3], &[NAN, 1.0, -1.0], Kind::Exact),
        );
    }

    // where_: the condition selects; the other branch's NaN never leaks.
    for d in ALL_DTYPES {
        for (sc, sa, sb) in [
            (&[2, 3][..], &[2, 3][..], &[2, 3][..]),
            (&[3, 1], &[1, 4], &[]),
            (&[], &[2], &[2]),
            (&[0, 1], &[3], &[1]),
            (&[4], &[2, 1], &[4]),
        ] {
            let c = In::random(Bool, sc, seed(&[&"where c", &d, &sc]), Dom::Grid(0.0, 1.0));
            let a = In::random(d, sa, seed(&[&"where a", &d, &sa]), any_dom(d));
            let b = In::random(d, sb, seed(&[&"where b", &d, &sb]), any_dom(d));
            let shape = broadcast_shape(&broadcast_shape(sc, sa).unwrap(), sb).unwrap();
            let (cn, an, bn) = (c.nd(), a.nd(), b.nd());
            let want =
                Nd::from_fn(
                    &shape,
                    |i| {
                        if cn.at_broadcast(i) != 0.0 { an.at_broadcast(i) } else { bn.at_broadcast(i) }
                    },
                );
            t.check("where_", "", vec![c, a, b], |x| x[0].where_(&x[1], &x[2]), Want::nd(d, &want, Kind::Exact));
        }
    }
    for d in FLOATS {
        t.check(
            "where_",
            "NaN in the unselected branch",
            vec![v(Bool, &[1.0, 0.0, 1.0]), v(d, &[1.0, NAN, INF]), v(d, &[NAN, 2.0, NAN])],
            |x| x[0].where_(&x[1], &x[2]),
            Want::new(d, &[3], &[1.0, 2.0, INF], Kind::Exact),
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Promotion: mixed dtypes, zero-dim tensors, Rust scalars, and the operators
// ---------------------------------------------------------------------------------------------------------------

/// u32: C-like wrapping, and unsigned compares, min/max, power and conversions on values above 2^31 (where a
/// signed instruction would read them as negative), and PyTorch's promotion with signed ints (u32 + i32 -> i64).
fn unsigned32(t: &mut Table) {
    const M: f64 = u32::MAX as f64;
    const H: f64 = 2_147_483_648.0; // 2^31
    let rows: [Row2; 12] = [
        ("add", |a, b| a.add(b), v(U32, &[M, 5.0, H]), v(U32, &[1.0, 3.0, H]), U32, &[0.0, 8.0, 0.0]),
        ("sub", |a, b| a.sub(b), v(U32, &[0.0, 5.0, 1.0]), v(U32, &[1.0, 3.0, M]), U32, &[M, 2.0, 2.0]),
        ("mul", |a, b| a.mul(b), v(U32, &[65_536.0, 3.0, M]), v(U32, &[65_536.0, 5.0, M]), U32, &[0.0, 15.0, 1.0]),
        ("maximum", |a, b| a.maximum(b), v(U32, &[H, 1.0, 7.0]), v(U32, &[1.0, M, 7.0]), U32, &[H, M, 7.0]),
        ("minimum", |a, b| a.minimum(b), v(U32, &[H, 1.0, 7.0]), v(U32, &[1.0, M, 7.0]), U32, &[1.0, 1.0, 7.0]),
        ("lt", |a, b| a.lt(b), v(U32, &[3e9, 1.0, H]), v(U32, &[1.0, 3e9, H]), Bool, &[0.0, 1.0, 0.0]),
        ("le", |a, b| a.le(b), v(U32, &[3e9, 1.0, H]), v(U32, &[1.0, 3e9, H]), Bool, &[0.0, 1.0, 1.0]),
        ("pow", |a, b| a.pow(b), v(U32, &[2.0, 3.0, M]), v(U32, &[32.0, 2.0, 3e9]), U32, &[0.0, 9.0, 1.0]),
        ("div", |a, b| a.div(b), v(U32, &[3e9, 7.0, M]), v(U32, &[2.0, 2.0, 1.0]), F32, &[1.5e9, 3.5, M]),
        ("add", |a, b| a.add(b), v(U32, &[M, 0.0]), v(I32, &[1.0, -1.0]), I64, &[M + 1.0, -1.0]),
        ("sub", |a, b| a.sub(b), v(U32, &[0.0, M]), v(I64, &[1.0, -1.0]), I64, &[-1.0, M + 1.0]),
        ("add", |a, b| a.add(b), v(U32, &[M, 1.0]), v(U8, &[1.0, 255.0]), U32, &[0.0, 256.0]),
    ];
    for (op, f, a, b, d, want) in rows {
        let shape = a.shape.clone();
        t.check(op, "u32", vec![a, b], move |x| f(&x[0], &x[1]), Want::new(d, &shape, want, Kind::Exact));
    }
    let scalars: [Row1; 8] = [
        // Eight elements: the 4-lane vector loop, where bools are lane masks, not 0/1 bytes.
        (
            "to_dtype",
            "bool -> u32, vectorized",
            |a| a.to_dtype(U32),
            v(Bool, &[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
            U32,
            &[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0],
        ),
        ("add", "u32 + (-1) wraps in u32", |a| a.add(-1), v(U32, &[0.0, 5.0]), U32, &[M, 4.0]),
        ("gt", "u32 > 2^31 - 1", |a| a.gt(2_147_483_647i64), v(U32, &[H, 5.0]), Bool, &[1.0, 0.0]),
        ("neg", "-(u32) wraps", |a| a.neg(), v(U32, &[1.0, 0.0, H]), U32, &[M, 0.0, H]),
        ("abs", "abs(u32) is the identity", |a| a.abs(), v(U32, &[M, H]), U32, &[M, H]),
        ("to_dtype", "u32 -> f32 above 2^31", |a| a.to_dtype(F32), v(U32, &[3e9, M]), F32, &[3e9, 4_294_967_296.0]),
        ("to_dtype", "u32 -> i32 wraps", |a| a.to_dtype(I32), v(U32, &[M, H]), I32, &[-1.0, -H]),
        ("max_all", "unsigned", |a| a.max_all(), v(U32, &[1.0, 3e9, H]), U32, &[3e9]),
    ];
    for (op, note, f, a, d, want) in scalars {
        let shape = if op == "max_all" { vec![] } else { a.shape.clone() };
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Exact));
    }
    // Sums of u32 are i64, as in PyTorch (no wrapping at 2^32).
    t.check(
        "sum_all",
        "u32 -> i64",
        vec![v(U32, &[M, M, 2.0])],
        |x| x[0].sum_all(),
        Want::new(I64, &[], &[2.0 * M + 2.0], Kind::Exact),
    );
}

fn promotion(t: &mut Table) {
    // Tensor op tensor, both dimensioned: torch.promote_types.
    let pairs: [Row2; 14] = [
        ("add", |a, b| a.add(b), v(I32, &[1.0, 2.0, 3.0]), v(F32, &[0.5; 3]), F32, &[1.5, 2.5, 3.5]),
        ("add", |a, b| a.add(b), v(U8, &[200.0, 1.0, 255.0]), v(I32, &[100.0, -2.0, 1.0]), I32, &[300.0, -1.0, 256.0]),
        ("add", |a, b| a.add(b), v(Bool, &[1.0, 0.0, 1.0]), v(U8, &[255.0, 3.0, 4.0]), U8, &[0.0, 3.0, 5.0]),
        ("mul", |a, b| a.mul(b), v(I32, &[3.0, -4.0]), v(I64, &[1e10, 2.0]), I64, &[3e10, -8.0]),
        ("add", |a, b| a.add(b), v(F32, &[0.1]), v(F64, &[0.2]), F64, &[0.1f32 as f64 + 0.2]),
        ("sub", |a, b| a.sub(b), v(U8, &[3.0, 200.0]), v(I64, &[5.0, 1.0]), I64, &[-2.0, 199.0]),
        ("add", |a, b| a.add(b), v(Bool, &[1.0, 0.0]), v(F64, &[0.25, 0.25]), F64, &[1.25, 0.25]),
        ("mul", |a, b| a.mul(b), v(I64, &[3.0, -1.0]), v(F32, &[0.5, 2.0]), F32, &[1.5, -2.0]),
        ("maximum", |a, b| a.maximum(b), v(I32, &[1.0, 5.0, -2.0]), v(F32, &[1.5, 2.5, NAN]), F32, &[1.5, 5.0, NAN]),
        ("minimum", |a, b| a.minimum(b), v(U8, &[1.0, 200.0]), v(I32, &[-1.0, 300.0]), I32, &[-1.0, 200.0]),
        ("div", |a, b| a.div(b), v(I32, &[1.0, 3.0]), v(F64, &[3.0, 2.0]), F64, &[1.0 / 3.0, 1.5]),
        ("pow", |a, b| a.pow(b), v(F32, &[2.0, 9.0]), v(I64, &[3.0, 2.0]), F32, &[8.0, 81.0]),
        ("pow", |a, b| a.pow(b), v(I32, &[4.0, 2.0]), v(F32, &[0.5, -1.0]), F32, &[2.0, 0.5]),
        (
            "logical_and",
            |a, b| a.logical_and(b),
            v(F32, &[0.5, 0.0, NAN]),
            v(I32, &[2.0, 1.0, 3.0]),
            Bool,
            &[1.0, 0.0, 1.0],
        ),
    ];
    for (op, f, a, b, d, want) in pairs {
        let shape = a.shape.clone();
        t.check(
            op,
            "promote_types",
            vec![a, b],
            move |x| f(&x[0], &x[1]),
            Want::new(d, &shape, want, Kind::Elementwise),
        );
    }
    // Zero-dim tensors count only when they raise the category (then with their own dtype).
    let zero_dim: [(In, In, DType, &[f64]); 7] = [
        (v(F32, &[1.0, 2.0, 3.0]), In::new(F64, &[], &[0.5]), F32, &[1.5, 2.5, 3.5]),
        (v(I32, &[1.0, 2.0, 3.0]), In::new(F64, &[], &[0.5]), F64, &[1.5, 2.5, 3.5]),
        (In::new(I32, &[], &[7.0]), In::new(I64, &[], &[1e10]), I64, &[1e10 + 7.0]),
        (v(U8, &[1.0, 2.0, 250.0]), In::new(I64, &[], &[10.0]), U8, &[11.0, 12.0, 4.0]),
        (v(Bool, &[1.0, 0.0]), In::new(I32, &[], &[5.0]), I32, &[6.0, 5.0]),
        (In::new(F64, &[], &[0.1]), In::new(F32, &[], &[0.5]), F64, &[0.6]),
        (v(I64, &[1.0, 2.0]), In::new(Bool, &[], &[1.0]), I64, &[2.0, 3.0]),
    ];
    for (a, b, d, want) in zero_dim {
        let shape = broadcast_shape(&a.shape, &b.shape).unwrap();
        t.check(
            "add",
            "zero-dim operand",
            vec![a, b],
            |x| x[0].add(&x[1]),
            Want::new(d, &shape, want, Kind::Elementwise),
        );
    }
    t.check(
        "add",
        "size-0 with a zero-dim",
        vec![In::new(I32, &[0, 2], &[]), In::new(F64, &[], &[1.0])],
        |x| x[0].add(&x[1]),
        Want::new(F64, &[0, 2], &[], Kind::Exact),
    );

    // Rust scalars ("wrapped numbers") widen only the category, to i64 or f32.
    let scalars: [Row1; 20] = [
        ("add", "i32 + 2.5", |a| a.add(2.5), v(I32, &[1.0, 2.0]), F32, &[3.5, 4.5]),
        ("add", "bool + 1", |a| a.add(1), v(Bool, &[1.0, 0.0]), I64, &[2.0, 1.0]),
        ("add", "bool + true", |a| a.add(true), v(Bool, &[1.0, 0.0]), Bool, &[1.0, 1.0]),
        ("add", "u8 + 10 wraps", |a| a.add(10), v(U8, &[1.0, 250.0]), U8, &[11.0, 4.0]),
        ("mul", "u8 * 2 wraps", |a| a.mul(2), v(U8, &[200.0, 3.0]), U8, &[144.0, 6.0]),
        ("sub", "u8 - 3 wraps", |a| a.sub(3), v(U8, &[1.0, 3.0]), U8, &[254.0, 0.0]),
        ("mul", "i64 * 2.5", |a| a.mul(2.5), v(I64, &[2.0, -3.0]), F32, &[5.0, -7.5]),
        ("add", "f64 + 0.1 stays f64", |a| a.add(0.1), v(F64, &[1.0]), F64, &[1.1]),
        ("add", "f32 + 0.1", |a| a.add(0.1), v(F32, &[1.0]), F32, &[1.1]),
        ("div", "i32 / 2", |a| a.div(2), v(I32, &[7.0, -7.0]), F32, &[3.5, -3.5]),
        ("mul", "bool * 2.5", |a| a.mul(2.5), v(Bool, &[1.0, 0.0]), F32, &[2.5, 0.0]),
        ("add", "i32 + 2.5f32", |a| a.add(2.5f32), v(I32, &[1.0]), F32, &[3.5]),
        ("add", "i32 + i64 scalar wraps in i32", |a| a.add(1i64), v(I32, &[2147483647.0]), I32, &[-2147483648.0]),
        ("mul", "f32 * 3", |a| a.mul(3), v(F32, &[0.5, -1.0]), F32, &[1.5, -3.0]),
        ("lt", "i32 < 2.5 compares as f32", |a| a.lt(2.5), v(I32, &[1.0, 2.0, 3.0]), Bool, &[1.0, 1.0, 0.0]),
        ("gt", "u8 > 100", |a| a.gt(100), v(U8, &[0.0, 200.0]), Bool, &[0.0, 1.0]),
        ("eq", "f32 == 0.1 (scalar rounded to f32)", |a| a.eq(0.1), v(F32, &[0.1]), Bool, &[1.0]),
        ("eq", "f64 == 0.1 (not rounded)", |a| a.eq(0.1), v(F64, &[0.1f32 as f64]), Bool, &[0.0]),
        ("ge", "i64 >= 3.0", |a| a.ge(3.0), v(I64, &[3.0, 2.0]), Bool, &[1.0, 0.0]),
        ("maximum", "i32 max 0.5", |a| a.maximum(0.5), v(I32, &[0.0, 2.0]), F32, &[0.5, 2.0]),
    ];
    for (op, note, f, a, d, want) in scalars {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }
    let more: [Row1; 8] = [
        ("ne", "bool != 1 (as i64)", |a| a.ne(1), v(Bool, &[1.0, 0.0]), Bool, &[0.0, 1.0]),
        ("le", "f32 <= 1 (int scalar)", |a| a.le(1), v(F32, &[1.0, 1.5]), Bool, &[1.0, 0.0]),
        ("pow", "f32 ** 2", |a| a.pow(2), v(F32, &[1.5, -3.0]), F32, &[2.25, 9.0]),
        ("pow", "i32 ** 2.0 -> f32", |a| a.pow(2.0), v(I32, &[3.0, -2.0]), F32, &[9.0, 4.0]),
        ("pow", "u8 ** 2 wraps", |a| a.pow(2), v(U8, &[16.0, 3.0]), U8, &[0.0, 9.0]),
        (
            "clamp",
            "i32 into [0.5, 2.5] -> f32",
            |a| a.clamp(0.5, 2.5),
            v(I32, &[-1.0, 1.0, 3.0]),
            F32,
            &[0.5, 1.0, 2.5],
        ),
        ("logical_or", "i32 or false", |a| a.logical_or(false), v(I32, &[0.0, -3.0]), Bool, &[0.0, 1.0]),
        ("logical_and", "f64 and 2.5", |a| a.logical_and(2.5), v(F64, &[0.0, NAN]), Bool, &[0.0, 1.0]),
    ];
    for (op, note, f, a, d, want) in more {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }

    // The operators, with Rust scalars on both sides (operators take f64 and i64; f32/i32 go through the methods).
    let ops: [Row1; 24] = [
        ("operator +", "x + 1.5", |a| a + 1.5, v(F32, &[1.0, -2.0]), F32, &[2.5, -0.5]),
        ("operator +", "1.5 + x", |a| 1.5 + a, v(F32, &[1.0, -2.0]), F32, &[2.5, -0.5]),
        ("operator +", "2.5 + i32", |a| 2.5 + a, v(I32, &[1.0, -2.0]), F32, &[3.5, 0.5]),
        ("operator +", "i64 + 3", |a| a + 3, v(I64, &[1.0, -2.0]), I64, &[4.0, 1.0]),
        ("operator +", "owned u8 + 6", |a| a.clone() + 6, v(U8, &[1.0, 250.0]), U8, &[7.0, 0.0]),
        ("operator -", "2.0 - x", |a| 2.0 - a, v(F32, &[0.5, 3.0]), F32, &[1.5, -1.0]),
        ("operator -", "10 - i32", |a| 10 - a, v(I32, &[3.0, 12.0]), I32, &[7.0, -2.0]),
        ("operator -", "10i64 - u8 wraps", |a| 10i64 - a, v(U8, &[3.0, 12.0]), U8, &[7.0, 254.0]),
        ("operator -", "2.0 - i64", |a| 2.0 - a, v(I64, &[5.0]), F32, &[-3.0]),
        ("operator -", "x - 1.0 (f64)", |a| a - 1.0, v(F64, &[0.5, 3.0]), F64, &[-0.5, 2.0]),
        ("operator -", "owned x - 1i64", |a| a.clone() - 1i64, v(I32, &[0.0]), I32, &[-1.0]),
        ("operator *", "3 * x", |a| 3 * a, v(I32, &[2.0, -5.0]), I32, &[6.0, -15.0]),
        ("operator *", "2.5 * i32", |a| 2.5 * a, v(I32, &[2.0, -5.0]), F32, &[5.0, -12.5]),
        ("operator *", "x * 0.5 (f64 scalar, f64 x)", |a| a * 0.5, v(F64, &[3.0]), F64, &[1.5]),
        ("operator *", "2i64 * bool -> i64", |a| 2i64 * a, v(Bool, &[1.0, 0.0]), I64, &[2.0, 0.0]),
        ("mul", "f64 x * 2.0f32", |a| a.mul(2.0f32), v(F64, &[0.1]), F64, &[0.2]),
        ("operator /", "2.0 / i64 -> f32", |a| 2.0 / a, v(I64, &[4.0, -1.0, 0.0]), F32, &[0.5, -2.0, INF]),
        ("operator /", "x / 2 (i32 -> f32)", |a| a / 2, v(I32, &[7.0, -1.0]), F32, &[3.5, -0.5]),
        ("operator /", "1i64 / u8 -> f32", |a| 1i64 / a, v(U8, &[4.0, 0.0]), F32, &[0.25, INF]),
        ("operator /", "3 / f64", |a| 3 / a, v(F64, &[4.0]), F64, &[0.75]),
        ("operator /", "owned x / 4.0", |a| a.clone() / 4.0, v(F32, &[1.0]), F32, &[0.25]),
        ("operator -x", "-(f32)", |a| -a, v(F32, &[1.0, -0.0, INF]), F32, &[-1.0, 0.0, -INF]),
        ("operator -x", "-(owned i64)", |a| -(a.clone()), v(I64, &[5.0, -3.0]), I64, &[-5.0, 3.0]),
        ("operator -x", "-(u8) wraps", |a| -a, v(U8, &[1.0, 0.0]), U8, &[255.0, 0.0]),
    ];
    for (op, note, f, a, d, want) in ops {
        let shape = a.shape.clone();
        t.check(op, note, vec![a], move |x| f(&x[0]), Want::new(d, &shape, want, Kind::Elementwise));
    }
    // Tensor operators on owned and borrowed operands, mixed dtypes.
    let tensor_ops: [(&str, &str, BinOp, DType, &[f64]); 8] = [
        ("operator +", "&a + &b", |a, b| a + b, F32, &[1.5, 0.5]),
        ("operator +", "a + b owned", |a, b| a.clone() + b.clone(), F32, &[1.5, 0.5]),
        ("operator -", "&a - b", |a, b| a - b.clone(), F32, &[0.5, -4.5]),
        ("operator -", "a - &b", |a, b| a.clone() - b, F32, &[0.5, -4.5]),
        ("operator *", "a * &b", |a, b| a.clone() * b, F32, &[0.5, -5.0]),
        ("operator *", "&a * b", |a, b| a * b.clone(), F32, &[0.5, -5.0]),
        ("operator /", "&a / &b", |a, b| a / b, F32, &[2.0, -0.8]),
        ("operator /", "a / b owned", |a, b| a.clone() / b.clone(), F32, &[2.0, -0.8]),
    ];
    for (op, note, f, d, want) in tensor_ops {
        let ins = vec![v(I32, &[1.0, -2.0]), v(F32, &[0.5, 2.5])];
        t.check(op, note, ins, move |x| f(&x[0], &x[1]), Want::new(d, &[2], want, Kind::Elementwise));
    }

    // where_ promotes its two branches like a binary op (the condition takes no part).
    let c = || v(Bool, &[1.0, 0.0, 1.0]);
    let wheres: [WhereRow; 7] = [
        ("i32 | f32", |c, a, b| c.where_(a, b), v(I32, &[1.0, 2.0, 3.0]), v(F32, &[0.5; 3]), F32, &[1.0, 0.5, 3.0]),
        ("u8 | i64", |c, a, b| c.where_(a, b), v(U8, &[200.0; 3]), v(I64, &[-1.0; 3]), I64, &[200.0, -1.0, 200.0]),
        ("i32 | 2.5", |c, a, _| c.where_(a, 2.5), v(I32, &[1.0, 2.0, 3.0]), v(I32, &[]), F32, &[1.0, 2.5, 3.0]),
        ("1.0 | 0.0", |c, _, _| c.where_(1.0, 0.0), v(I32, &[]), v(I32, &[]), F32, &[1.0, 0.0, 1.0]),
        ("1 | 0", |c, _, _| c.where_(1, 0), v(I32, &[]), v(I32, &[]), I64, &[1.0, 0.0, 1.0]),
        ("false | true", |c, _, _| c.where_(false, true), v(I32, &[]), v(I32, &[]), Bool, &[0.0, 1.0, 0.0]),
        (
            "f32 | f64 zero-dim",
            |c, a, b| c.where_(a, b),
            v(F32, &[1.0; 3]),
            In::new(F64, &[], &[0.1]),
            F32,
            &[1.0, 0.1, 1.0],
        ),
    ];
    for (note, f, a, b, d, want) in wheres {
        t.check(
            "where_",
            note,
            vec![c(), a, b],
            move |x| f(&x[0], &x[1], &x[2]),
            Want::new(d, &[3], want, Kind::Elementwise),
        );
    }
    t.check(
        "cat",
        "i32 with f32 -> f32",
        vec![v(I32, &[1.0, -2.0]), v(F32, &[0.5])],
        |x| Tensor::cat(&[&x[0], &x[1]], 0),
        Want::new(F32, &[3], &[1.0, -2.0, 0.5], Kind::Exact),
    );
    t.check(
        "cat",
        "u8 with bool -> u8, i64 -> i64",
        vec![v(U8, &[255.0, 1.0]), v(Bool, &[1.0]), v(I64, &[-7.0])],
        |x| Tensor::cat(&[&Tensor::cat(&[&x[0], &x[1]], 0), &x[2]], 0),
        Want::new(I64, &[4], &[255.0, 1.0, 1.0, -7.0], Kind::Exact),
    );
    t.check(
        "matmul",
        "i32 x f32 -> f32",
        vec![In::new(I32, &[1, 2], &[1.0, 2.0]), In::new(F32, &[2, 1], &[0.5, 0.25])],
        |x| x[0].matmul(&x[1]),
        Want::new(F32, &[1, 1], &[1.0], Kind::Accumulate),
    );
}

// ---------------------------------------------------------------------------------------------------------------
// to_dtype: every (source, target) pair
// ---------------------------------------------------------------------------------------------------------------

/// The conversion of one value, as Rust's `as`: floats to ints truncate toward zero (NaN -> 0, out of range
/// saturates), ints wrap (two's complement, as PyTorch), anything to bool is `!= 0` (NaN is true), ints to floats
/// round to nearest. The table feeds float -> int casts only values in the target's range, NaN, and out-of-range
/// values for i64 (see `cast` for why).
fn cast_ref(src: &HostBuffer, dst: DType) -> HostBuffer {
    let ints: Option<Vec<i64>> = match src {
        HostBuffer::Bool(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::U8(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::U32(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::I32(v) => Some(v.iter().map(|&x| x as i64).collect()),
        HostBuffer::I64(v) => Some(v.to_vec()),
        _ => None,
    };
    if let Some(v) = ints {
        return match dst {
            Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0).collect()),
            U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
            U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
            I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
            I64 => HostBuffer::I64(v.into()),
            F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x as f64)).collect()),
            F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
            F64 => HostBuffer::F64(v.iter().map(|&x| x as f64).collect()),
            // PyTorch's int -> bf16: to f32 (nearest), then to bf16.
            BF16 => HostBuffer::BF16(v.iter().map(|&x| kiln::bf16::from_f32(x as f32)).collect()),
        };
    }
    let v = values(src);
    match dst {
        Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0.0).collect()),
        U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
        U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
        I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
        I64 => HostBuffer::I64(v.iter().map(|&x| x as i64).collect()),
        F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
        F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
        F64 => HostBuffer::F64(v.into()),
        BF16 => HostBuffer::BF16(v.iter().map(|&x| kiln_jit::dtype::bf16_from_f64(x)).collect()),
    }
}

/// Float values to cast to `dst`: all in `dst`'s range (a float outside an int type's range is undefined in
/// PyTorch, and kiln's engines and docs disagree there, see the report in `cast`).
fn float_cast_values(src: DType, dst: DType) -> Vec<f64> {
    let mut v = vec![0.0, -0.0, 0.4, 1.5, 2.7, 100.9, 255.99];
    if !dst.is_unsigned() {
        v.extend([-0.4, -2.7, -100.9, 1e5, -1e5]);
    }
    if dst == U32 {
        v.extend([1e5, 65535.5, 2_147_483_648.0, 4_000_000_000.0, 4_294_967_040.0]);
    }
    if src.is_half() && dst.is_int() {
        // In f16, 255.99 is 256 and 1e5 is inf (in bf16, 255.99 is 256 too): outside the target's range once the
        // input is rounded.
        let (lo, hi) = match dst {
            U8 => (0.0, 255.0),
            U32 => (0.0, u32::MAX as f64),
            I32 => (i32::MIN as f64, i32::MAX as f64),
            _ => (f64::MIN, f64::MAX),
        };
        let rounded =
            |x: f64| if src == F16 { f16::from_f64(x).to_f64() } else { kiln_jit::dtype::bf16_from_f64(x).to_f64() };
        v.retain(|&x| (lo..=hi).contains(&rounded(x)));
    }
    if dst.is_float() || dst == Bool {
        v.extend([INF, -INF, NAN, 0.1, 1e-40, 16_777_217.0, 3.4e38]);
        if src == F64 {
            v.extend([1e300, -1e-50, 1e-50, 0.1 + 0.2, -1e300]);
        }
    }
    v
}

fn cast(t: &mut Table) {
    let int_sources: [HostBuffer; 5] = [
        HostBuffer::Bool(vec![true, false, true].into()),
        HostBuffer::U8(vec![0, 1, 7, 128, 200, 255].into()),
        // Above 2^31 (negative as i32) and above 2^24 (rounded as f32), to catch signed conversions.
        HostBuffer::U32(vec![0, 1, 7, 255, 256, 65_535, 16_777_217, 1 << 31, 3_000_000_001, u32::MAX].into()),
        HostBuffer::I32(vec![0, 1, -1, 7, 300, -300, 100_000, i32::MIN, i32::MAX].into()),
        HostBuffer::I64(vec![0, 1, -1, 300, -3, (1 << 33) + 5, 16_777_217, i64::MIN, i64::MAX].into()),
    ];
    for src_dtype in ALL_DTYPES {
        for dst in ALL_DTYPES {
            let src = match src_dtype {
                F16 | BF16 | F32 | F64 => buffer(src_dtype, &float_cast_values(src_dtype, dst)),
                d => int_sources.iter().find(|b| b.dtype() == d).expect("an int source").clone(),
            };
            let n = src.len();
            let want = cast_ref(&src, dst);
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::buf(&[n], src)],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[n], want, Kind::Exact),
            );
            // Zero-dim and size-0 tensors, for every pair.
            let one = cast_ref(&buffer(src_dtype, &[1.0]), dst);
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::new(src_dtype, &[], &[1.0])],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[], one.clone(), Kind::Exact),
            );
            t.check(
                "to_dtype",
                &format!("-> {dst}"),
                vec![In::new(src_dtype, &[2, 0], &[])],
                move |a| a[0].to_dtype(dst),
                Want::new(dst, &[2, 0], &[], Kind::Exact),
            );
        }
    }
    // kiln-defined (PyTorch leaves these undefined): NaN -> 0 for every int type, and float -> i64 saturates.
    // Out-of-range floats to u8/i32 are not asserted: to_dtype's doc says "saturates", but the interpreter and the
    // CPU JIT both go through i64 and wrap (3e9 -> i32 is -1294967296), so the spec itself is unsettled.
    for src in FLOATS {
        for dst in [U8, U32, I32, I64] {
            let x: &[f64] = if dst == I64 { &[NAN, INF, -INF, 1e19, -1e19, -1.5] } else { &[NAN, -0.0, 0.99] };
            let b = buffer(src, x);
            let want = cast_ref(&b, dst);
            let n = x.len();
            t.check(
                "to_dtype",
                &format!("-> {dst}: NaN -> 0, saturating to i64 (kiln-defined)"),
                vec![In::buf(&[n], b)],
                move |a| a[0].to_dtype(dst),
                Want::buf(&[n], want, Kind::Exact),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------------------------

/// (shape, dims, keepdim). An empty dims list reduces every dim; a zero-dim tensor's dim is 0 or -1.
const REDUCE_CASES: [(&[usize], &[isize], bool); 19] = [
    (&[], &[0], false),
    (&[], &[-1], true),
    (&[], &[], false),
    (&[5], &[0], false),
    (&[5], &[-1], true),
    (&[2, 3, 4], &[0], false),
    (&[2, 3, 4], &[1], true),
    (&[2, 3, 4], &[-1], false),
    (&[2, 3, 4], &[0, 2], false),
    (&[2, 3, 4], &[-1, -3], true),
    (&[2, 3, 4], &[], false),
    (&[2, 3, 4], &[], true),
    (&[4, 16], &[1], false),
    (&[64], &[0], true),
    (&[2, 0, 3], &[1], false),
    (&[2, 0, 3], &[1], true),
    (&[2, 0, 3], &[0, 2], false),
    (&[2, 0, 3], &[2], false),
    (&[2, 0, 3], &[], false),
];

/// logsumexp, var, std and norm over `REDUCE_CASES`, against the naive reference in f64: `log Σ exp`, the
/// two-pass variance with PyTorch's `correction` (NaN or inf where `N - correction <= 0`), the p-norms.
fn statistics(t: &mut Table) {
    for d in FLOATS {
        for (shape, dims, keepdim) in REDUCE_CASES {
            let axes = resolve_all(dims, shape.len());
            let n: usize = axes.iter().map(|&a| shape[a]).product();
            let x = In::random(d, shape, seed(&[&"statistics", &d, &shape, &dims, &keepdim]), Dom::Cont(-2.0, 2.0));
            let nd = x.nd();
            let dv = dims.to_vec();
            let what = format!("dims {dims:?} keepdim {keepdim}");
            let lse = nd.map(f64::exp).reduce(&axes, keepdim, 0.0, |a, b| a + b).map(f64::ln);
            let dl = dv.clone();
            t.check(
                "logsumexp",
                &what,
                vec![x.clone()],
                move |a| a[0].logsumexp(dl.clone(), keepdim),
                Want::nd(d, &lse, Kind::Accumulate),
            );
            let mean = nd.reduce(&axes, true, 0.0, |a, b| a + b).map(|s| s / n as f64);
            let sq =
                nd.zip(&mean.broadcast_to(&nd.shape), |v, m| (v - m) * (v - m))
                    .reduce(&axes, keepdim, 0.0, |a, b| a + b);
            for correction in [0.0, 1.0] {
                let var = sq.map(|s| s / (n as f64 - correction).max(0.0));
                let std = var.map(f64::sqrt);
                let (dvar, dstd) = (dv.clone(), dv.clone());
                let what = format!("{what} correction {correction}");
                t.check(
                    "var",
                    &what,
                    vec![x.clone()],
                    move |a| a[0].var(dvar.clone(), correction, keepdim),
                    Want::nd(d, &var, Kind::Accumulate),
                );
                t.check(
                    "std",
                    &what,
                    vec![x.clone()],
                    move |a| a[0].std(dstd.clone(), correction, keepdim),
                    Want::nd(d, &std, Kind::Accumulate),
                );
            }
            for p in [2.0, 1.0, 3.0, 0.0, INF, -INF] {
                if p.is_infinite() && n == 0 {
                    continue; // the max or min over an empty dim is an error, as for `max` (and in PyTorch)
                }
                let norm = match p {
                    INF => nd.map(f64::abs).reduce(&axes, keepdim, 0.0, f64::max),
                    _ if p == -INF => nd.map(f64::abs).reduce(&axes, keepdim, INF, f64::min),
                    0.0 => nd.map(|v| (v != 0.0) as u8 as f64).reduce(&axes, keepdim, 0.0, |a, b| a + b),
                    _ => nd.map(|v| v.abs().powf(p)).reduce(&axes, keepdim, 0.0, |a, b| a + b).map(|s| s.powf(1.0 / p)),
                };
                let dn = dv.clone();
                t.check(
                    "norm",
                    &format!("{what} p {p}"),
                    vec![x.clone()],
                    move |a| a[0].norm(p, dn.clone(), keepdim),
                    Want::nd(d, &norm, Kind::Accumulate),
                );
            }
        }
    }
    // PyTorch's logsumexp where the maximum is infinite: a row of -inf gives -inf, a +inf gives +inf; NaN stays.
    for d in FLOATS {
        let x = In::new(d, &[4, 3], &[-INF, -INF, -INF, INF, 1.0, 2.0, 1.0, 2.0, 3.0, NAN, 0.0, 1.0]);
        let want = [-INF, INF, (1f64.exp() + 2f64.exp() + 3f64.exp()).ln(), NAN];
        t.check(
            "logsumexp",
            "infinite maxima",
            vec![x],
            |a| a[0].logsumexp(1, false),
            Want::new(d, &[4], &want, Kind::Accumulate),
        );
    }
    // Int input: logsumexp in f32 (PyTorch); var of one element with Bessel's correction is NaN (0 / 0).
    let ints = In::new(I32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let want = [(1f64.exp() + 2f64.exp()).ln(), (3f64.exp() + 4f64.exp()).ln()];
    t.check(
        "logsumexp",
        "i32 input",
        vec![ints],
        |a| a[0].logsumexp(1, false),
        Want::new(F32, &[2], &want, Kind::Accumulate),
    );
    t.check(
        "var",
        "one element",
        vec![In::new(F32, &[1], &[3.0])],
        |a| a[0].var(0, 1.0, false),
        Want::new(F32, &[], &[NAN], Kind::Exact),
    );
}

type Red = fn(&Tensor, Vec<isize>, bool) -> Tensor;
/// (name, op, dtypes, identity, fold, float-only)
type RedCase = (&'static str, Red, &'static [DType], f64, Fold, bool);

fn reduce(t: &mut Table) {
    let ops: [RedCase; 5] = [
        ("sum", |x, d, k| x.sum(d, k), &ALL_DTYPES, 0.0, |a, b| a + b, false),
        ("prod", |x, d, k| x.prod(d, k), &ALL_DTYPES, 1.0, |a, b| a * b, false),
        ("max", |x, d, k| x.max(d, k), &ALL_DTYPES, -INF, f64::max, true),
        ("min", |x, d, k| x.min(d, k), &ALL_DTYPES, INF, f64::min, true),
        ("mean", |x, d, k| x.mean(d, k), &FLOATS, 0.0, |a, b| a + b, false),
    ];
    for (op, f, dtypes, init, fold, needs_nonempty) in ops {
        for &d in dtypes {
            for (shape, dims, keepdim) in REDUCE_CASES {
                let axes = resolve_all(dims, shape.len());
                if needs_nonempty && axes.iter().any(|&a| shape[a] == 0) {
                    continue; // max/min over an empty dim is an error (as in PyTorch), tested elsewhere
                }
                let dom = if op == "prod" {
                    if d.is_float() { Dom::Cont(0.5, 1.5) } else { Dom::Grid(-2.0, 2.0) }
                } else if d.is_float() {
                    Dom::Cont(-2.0, 2.0)
                } else {
                    Dom::Cont(-100.0, 100.0)
                };
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dims, &keepdim]), dom);
                let mut want = x.nd().reduce(&axes, keepdim, init, fold);
                if op == "mean" {
                    let count: usize = axes.iter().map(|&a| shape[a]).product();
                    want = want.map(|s| s / count as f64);
                }
                // Sums and products of bool and ints are i64; everything else keeps its dtype.
                let od = if (op == "sum" || op == "prod") && !d.is_float() { I64 } else { d };
                let kind = if needs_nonempty { Kind::Exact } else { Kind::Accumulate };
                let dv = dims.to_vec();
                t.check(
                    op,
                    &format!("dims {dims:?} keepdim {keepdim}"),
                    vec![x],
                    move |a| f(&a[0], dv.clone(), keepdim),
                    Want::nd(od, &want, kind),
                );
            }
        }
    }
    statistics(t);
    // The *_all forms: a zero-dim result.
    let alls: [(&str, UnOp, &[DType], f64, Fold); 5] = [
        ("sum_all", Tensor::sum_all, &ALL_DTYPES, 0.0, |a, b| a + b),
        ("prod_all", Tensor::prod_all, &ALL_DTYPES, 1.0, |a, b| a * b),
        ("max_all", Tensor::max_all, &ALL_DTYPES, -INF, f64::max),
        ("min_all", Tensor::min_all, &ALL_DTYPES, INF, f64::min),
        ("mean_all", Tensor::mean_all, &FLOATS, 0.0, |a, b| a + b),
    ];
    for (op, f, dtypes, init, fold) in alls {
        for &d in dtypes {
            for shape in [&[][..], &[5], &[2, 3, 4], &[2, 0, 3]] {
                let n: usize = shape.iter().product();
                if n == 0 && (op == "max_all" || op == "min_all") {
                    continue;
                }
                let dom = if op == "prod_all" { Dom::Grid(-1.0, 1.5) } else { any_dom(d) };
                let x = In::random(d, shape, seed(&[&op, &d, &shape]), dom);
                let mut v = x.nd().v.iter().fold(init, |a, &b| fold(a, b));
                if op == "mean_all" {
                    v /= n as f64;
                }
                let od = if (op == "sum_all" || op == "prod_all") && !d.is_float() { I64 } else { d };
                let kind = if op.starts_with("max") || op.starts_with("min") { Kind::Exact } else { Kind::Accumulate };
                t.check(op, "", vec![x], move |a| f(&a[0]), Want::new(od, &[], &[v], kind));
            }
        }
    }
    // NaN propagates through max/min (PyTorch) and sums; infinities.
    for d in FLOATS {
        let x = In::new(d, &[2, 3], &[1.0, NAN, 3.0, 4.0, 5.0, 6.0]);
        t.check(
            "max",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max(1, false),
            Want::new(d, &[2], &[NAN, 6.0], Kind::Exact),
        );
        t.check(
            "min",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].min(-1, true),
            Want::new(d, &[2, 1], &[NAN, 4.0], Kind::Exact),
        );
        t.check(
            "max",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max(0, false),
            Want::new(d, &[3], &[4.0, NAN, 6.0], Kind::Exact),
        );
        t.check(
            "max_all",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].max_all(),
            Want::new(d, &[], &[NAN], Kind::Exact),
        );
        t.check(
            "min_all",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].min_all(),
            Want::new(d, &[], &[NAN], Kind::Exact),
        );
        t.check(
            "sum",
            "NaN propagates",
            vec![x.clone()],
            |a| a[0].sum(1, false),
            Want::new(d, &[2], &[NAN, 15.0], Kind::Accumulate),
        );
        t.check(
            "mean",
            "NaN propagates",
            vec![x],
            |a| a[0].mean(1, false),
            Want::new(d, &[2], &[NAN, 5.0], Kind::Accumulate),
        );
        let y = In::new(d, &[2, 2], &[-INF, -INF, INF, -INF]);
        t.check(
            "max",
            "all -inf",
            vec![y.clone()],
            |a| a[0].max(1, false),
            Want::new(d, &[2], &[-INF, INF], Kind::Exact),
        );
        t.check(
            "sum",
            "inf + -inf",
            vec![y.clone()],
            |a| a[0].sum(1, false),
            Want::new(d, &[2], &[-INF, NAN], Kind::Exact),
        );
        t.check("prod", "inf * -inf", vec![y], |a| a[0].prod(1, false), Want::new(d, &[2], &[INF, -INF], Kind::Exact));
    }
    t.check(
        "prod",
        "i64 wraps",
        vec![In::buf(&[2], HostBuffer::I64(vec![1 << 32, 1 << 32].into()))],
        |a| a[0].prod(0, false),
        Want::buf(&[], HostBuffer::I64(vec![0].into()), Kind::Exact),
    );
    t.check(
        "sum",
        "i32 sums as i64 (no i32 overflow)",
        vec![v(I32, &[2147483647.0, 1.0])],
        |a| a[0].sum(0, false),
        Want::new(I64, &[], &[2147483648.0], Kind::Exact),
    );
    t.check(
        "sum",
        "u8 sums as i64 (no wrap)",
        vec![v(U8, &[255.0, 255.0, 2.0])],
        |a| a[0].sum_all(),
        Want::new(I64, &[], &[512.0], Kind::Exact),
    );

    // argmax / argmin: i64 indices; the first extreme wins ties; NaN counts as the extreme (the first NaN).
    let args: [(&str, ArgOp, bool); 2] =
        [("argmax", |x, d, k| x.argmax(d, k), true), ("argmin", |x, d, k| x.argmin(d, k), false)];
    let arg_cases: [(&[usize], isize, bool); 11] = [
        (&[], 0, false),
        (&[], -1, true),
        (&[7], 0, false),
        (&[7], -1, true),
        (&[3, 4], 0, false),
        (&[3, 4], 1, true),
        (&[3, 4], -1, false),
        (&[2, 3, 4], 1, false),
        (&[2, 3, 4], -3, true),
        (&[0, 3], 1, false),
        (&[0, 3], -1, true),
    ];
    for (op, f, is_max) in args {
        for d in NON_BOOL {
            for (shape, dim, keepdim) in arg_cases {
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dim]), Dom::Grid(-2.0, 2.0));
                let want = arg_ref(&x.nd(), dim, keepdim, is_max);
                t.check(
                    op,
                    &format!("dim {dim} keepdim {keepdim}"),
                    vec![x],
                    move |a| f(&a[0], dim, keepdim),
                    Want::nd(I64, &want, Kind::Exact),
                );
            }
            for shape in [&[][..], &[1, 1], &[2, 3], &[2, 3, 4]] {
                let x = In::random(d, shape, seed(&[&op, &"all", &d, &shape]), Dom::Grid(-2.0, 2.0));
                let flat = x.nd().reshape(&[x.nd().numel()]);
                let want = arg_ref(&flat, 0, false, is_max);
                let all: fn(&Tensor) -> Tensor = if is_max { Tensor::argmax_all } else { Tensor::argmin_all };
                t.check(
                    if is_max { "argmax_all" } else { "argmin_all" },
                    "",
                    vec![x],
                    move |a| all(&a[0]),
                    Want::nd(I64, &want, Kind::Exact),
                );
            }
        }
        for d in FLOATS {
            let x = In::new(d, &[2, 4], &[1.0, NAN, 3.0, NAN, -INF, -INF, INF, INF]);
            let w = if is_max { [1.0, 2.0] } else { [1.0, 0.0] };
            t.check(
                op,
                "first NaN; ties pick the first",
                vec![x.clone()],
                move |a| f(&a[0], 1, false),
                Want::new(I64, &[2], &w, Kind::Exact),
            );
            // Columns: [1, -inf], [NaN, -inf], [3, inf], [NaN, inf].
            let w = if is_max { [0.0, 0.0, 1.0, 0.0] } else { [1.0, 0.0, 0.0, 0.0] };
            t.check(
                op,
                "dim 0 with NaN and infinities",
                vec![x.clone()],
                move |a| f(&a[0], 0, false),
                Want::new(I64, &[4], &w, Kind::Exact),
            );
            let all: fn(&Tensor) -> Tensor = if is_max { Tensor::argmax_all } else { Tensor::argmin_all };
            t.check(
                if is_max { "argmax_all" } else { "argmin_all" },
                "first NaN",
                vec![x],
                move |a| all(&a[0]),
                Want::new(I64, &[], &[1.0], Kind::Exact),
            );
        }
        for d in [U8, U32, I32, I64, F16, F32, F64] {
            let x = v(d, &[3.0, 1.0, 3.0, 1.0, 2.0, 3.0]);
            let w = if is_max { 0.0 } else { 1.0 };
            t.check(
                op,
                "ties pick the first",
                vec![x],
                move |a| f(&a[0], 0, false),
                Want::new(I64, &[], &[w], Kind::Exact),
            );
        }
    }
}

/// Index of the first extreme (or first NaN) along `dim`.
fn arg_ref(x: &Nd, dim: isize, keepdim: bool, is_max: bool) -> Nd {
    if x.shape.is_empty() {
        return Nd::scalar(0.0);
    }
    let d = resolve(dim, x.shape.len());
    let mut kept = x.shape.clone();
    kept[d] = 1;
    let out = Nd::from_fn(&kept, |i| {
        let mut best: Option<(usize, f64)> = None;
        for j in 0..x.shape[d] {
            let mut idx = i.to_vec();
            idx[d] = j;
            let v = x.at(&idx);
            let better = match best {
                None => true,
                Some((_, b)) if b.is_nan() => false,
                Some((_, b)) => v.is_nan() || if is_max { v > b } else { v < b },
            };
            if better {
                best = Some((j, v));
            }
        }
        best.expect("non-empty dim").0 as f64
    });
    if keepdim {
        return out;
    }
    let mut shape = x.shape.clone();
    shape.remove(d);
    out.reshape(&shape)
}

// ---------------------------------------------------------------------------------------------------------------
// Movement
// ---------------------------------------------------------------------------------------------------------------

type Mv = Box<dyn Fn(&Tensor) -> Tensor>;
type MvRef = Box<dyn Fn(&Nd) -> Nd>;
/// (op, input shape, description, kiln op, reference).
type MvCase = (&'static str, Vec<usize>, String, Mv, MvRef);

/// The border modes against what PyTorch 2.15 printed (`F.pad(arange(6.).reshape(1, 2, 3), ..., mode=...)`).
fn pad_modes_as_pytorch(t: &mut Table) {
    use kiln::PadMode::{Circular, Reflect, Replicate};
    let x = In::new(F32, &[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    /// (what, the last dim's pad, mode, result shape, values)
    type PadRow = (&'static str, (usize, usize), kiln::PadMode, &'static [usize], &'static [f64]);
    let cases: [PadRow; 3] = [
        ("reflect (2, 1)", (2, 1), Reflect, &[2, 6], &[2.0, 1.0, 0.0, 1.0, 2.0, 1.0, 5.0, 4.0, 3.0, 4.0, 5.0, 4.0]),
        (
            "circular (3, 2)",
            (3, 2),
            Circular,
            &[2, 8],
            &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0],
        ),
        ("replicate (1, 2)", (1, 2), Replicate, &[2, 6], &[0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 5.0]),
    ];
    for (what, pad, mode, shape, want) in cases {
        t.check(
            "pad_with",
            &format!("{what}, as PyTorch printed"),
            vec![x.clone()],
            move |a| a[0].pad_with(&[pad], mode),
            Want::new(F32, shape, want, Kind::Exact),
        );
    }
}

fn movement(t: &mut Table) {
    pad_modes_as_pytorch(t);
    for d in ALL_DTYPES {
        let mut cases: Vec<MvCase> = Vec::new();
        let mut add = |op: &'static str, shape: &[usize], what: String, f: Mv, r: MvRef| {
            cases.push((op, shape.to_vec(), what, f, r));
        };
        for (shape, spec, out) in [
            (&[2, 3, 4][..], &[4, 6][..], &[4, 6][..]),
            (&[2, 3, 4], &[-1, 4], &[6, 4]),
            (&[2, 3, 4], &[24], &[24]),
            (&[2, 3, 4], &[2, -1, 2], &[2, 6, 2]),
            (&[], &[1], &[1]),
            (&[], &[1, 1], &[1, 1]),
            (&[1], &[], &[]),
            (&[0, 3], &[3, 0], &[3, 0]),
            (&[0, 3], &[0], &[0]),
        ] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "reshape",
                shape,
                format!("to {spec:?}"),
                Box::new(move |x| x.reshape(sp.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for (shape, spec, out) in [(&[2, 3][..], &[3, 2][..], &[3, 2][..]), (&[6], &[-1, 2], &[3, 2])] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "view",
                shape,
                format!("as {spec:?}"),
                Box::new(move |x| x.view(sp.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for shape in [&[2, 3, 4][..], &[], &[0, 3]] {
            let n: usize = shape.iter().product();
            add("flatten", shape, String::new(), Box::new(Tensor::flatten), Box::new(move |x| x.reshape(&[n])));
        }
        for (shape, perm) in [
            (&[2, 3, 4][..], &[2, 0, 1][..]),
            (&[2, 3, 4], &[-1, 0, -2]),
            (&[2, 3], &[1, 0]),
            (&[2, 3], &[0, 1]),
            (&[], &[]),
            (&[2, 0, 3], &[2, 1, 0]),
        ] {
            let p = perm.to_vec();
            let rp: Vec<usize> = perm.iter().map(|&q| resolve(q, shape.len())).collect();
            add(
                "permute",
                shape,
                format!("{perm:?}"),
                Box::new(move |x| x.permute(p.clone())),
                Box::new(move |x| x.permute(&rp)),
            );
        }
        for (shape, a, b) in
            [(&[2, 3, 4][..], 0, 2), (&[2, 3, 4], -1, -2), (&[2, 3], 1, 1), (&[3], 0, -1), (&[], 0, -1)]
        {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            if !shape.is_empty() {
                perm.swap(resolve(a, shape.len()), resolve(b, shape.len()));
            }
            add(
                "transpose",
                shape,
                format!("({a}, {b})"),
                Box::new(move |x| x.transpose(a, b)),
                Box::new(move |x| x.permute(&perm)),
            );
        }
        for shape in [&[2, 3][..], &[5], &[]] {
            let perm: Vec<usize> = (0..shape.len()).rev().collect();
            add("t", shape, String::new(), Box::new(Tensor::t), Box::new(move |x| x.permute(&perm)));
        }
        for (shape, spec, out) in [
            (&[3, 1][..], &[2, 3, 4][..], &[2, 3, 4][..]),
            (&[3, 1], &[-1, 4], &[3, 4]),
            (&[1], &[0], &[0]),
            (&[], &[2, 2], &[2, 2]),
            (&[2, 1, 3], &[2, 5, 3], &[2, 5, 3]),
            (&[1, 3], &[2, -1], &[2, 3]),
            (&[2, 3], &[2, 3], &[2, 3]),
        ] {
            let (sp, o) = (spec.to_vec(), out.to_vec());
            add(
                "expand",
                shape,
                format!("to {spec:?}"),
                Box::new(move |x| x.expand(sp.clone())),
                Box::new(move |x| x.broadcast_to(&o)),
            );
        }
        for (shape, out) in [(&[3][..], &[2, 3][..]), (&[], &[4]), (&[2, 1], &[2, 0]), (&[1, 1], &[3, 1, 2])] {
            let o = out.to_vec();
            let o2 = o.clone();
            add(
                "broadcast_to",
                shape,
                format!("{out:?}"),
                Box::new(move |x| x.broadcast_to(o.clone())),
                Box::new(move |x| x.broadcast_to(&o2)),
            );
        }
        for (shape, dim) in
            [(&[2, 3][..], 0), (&[2, 3], 2), (&[2, 3], -1), (&[2, 3], -3), (&[], 0), (&[], -1), (&[0], 1)]
        {
            let mut out = shape.to_vec();
            out.insert(resolve(dim, shape.len() + 1), 1);
            add(
                "unsqueeze",
                shape,
                format!("{dim}"),
                Box::new(move |x| x.unsqueeze(dim)),
                Box::new(move |x| x.reshape(&out)),
            );
        }
        for (shape, dims, out) in [
            (&[1, 3, 1][..], &[0][..], &[3, 1][..]),
            (&[1, 3, 1], &[-1], &[1, 3]),
            (&[1, 3, 1], &[0, 2], &[3]),
            (&[1, 3, 1], &[1], &[1, 3, 1]),
            (&[], &[0], &[]),
            (&[2, 1, 0], &[1], &[2, 0]),
        ] {
            let (dv, o) = (dims.to_vec(), out.to_vec());
            add(
                "squeeze",
                shape,
                format!("{dims:?}"),
                Box::new(move |x| x.squeeze(dv.clone())),
                Box::new(move |x| x.reshape(&o)),
            );
        }
        for (shape, out) in
            [(&[1, 3, 1, 1][..], &[3][..]), (&[1], &[]), (&[], &[]), (&[2, 3], &[2, 3]), (&[1, 0, 1], &[0])]
        {
            let o = out.to_vec();
            add("squeeze_all", shape, String::new(), Box::new(Tensor::squeeze_all), Box::new(move |x| x.reshape(&o)));
        }
        for (shape, dim, start, len) in
            [(&[4, 5][..], 1, 1, 3), (&[4, 5], -1, 0, 2), (&[4, 5], 0, 4, 0), (&[4, 5], 0, 0, 4), (&[6], 0, 2, 3)]
        {
            let dd = resolve(dim, shape.len());
            add(
                "narrow",
                shape,
                format!("dim {dim} start {start} len {len}"),
                Box::new(move |x| x.narrow(dim, start, len)),
                Box::new(move |x| x.slice(dd, start, start + len, 1)),
            );
        }
        for (shape, dim, start, end, step) in [
            (&[10][..], 0, 1, 8, 3),
            (&[10], 0, -3, 100, 1),
            (&[10], 0, 5, 2, 1),
            (&[10], -1, -100, -7, 2),
            (&[4, 5], 1, 0, 5, 2),
            (&[4, 5], -2, 1, -1, 1),
            (&[4, 5], 0, -1, 4, 1),
            (&[0, 5], 1, 1, 4, 2),
        ] {
            let dd = resolve(dim, shape.len());
            let n = shape[dd] as isize;
            let clamp = |i: isize| if i < 0 { (i + n).max(0) as usize } else { i.min(n) as usize };
            let (a, b) = (clamp(start), clamp(end));
            add(
                "slice",
                shape,
                format!("dim {dim} [{start}:{end}:{step}]"),
                Box::new(move |x| x.slice(dim, start, end, step)),
                Box::new(move |x| x.slice(dd, a, b, step)),
            );
        }
        for (shape, dims) in [
            (&[2, 3, 4][..], &[0][..]),
            (&[2, 3, 4], &[0, 2]),
            (&[2, 3, 4], &[-1]),
            (&[5], &[0]),
            (&[], &[0]),
            (&[2, 0], &[0, 1]),
            (&[1, 3], &[0, -1]),
        ] {
            let dv = dims.to_vec();
            let rd: Vec<usize> =
                if shape.is_empty() { Vec::new() } else { dims.iter().map(|&q| resolve(q, shape.len())).collect() };
            add(
                "flip",
                shape,
                format!("{dims:?}"),
                Box::new(move |x| x.flip(dv.clone())),
                Box::new(move |x| x.flip(&rd)),
            );
        }
        for (shape, pads) in [
            (&[2, 3][..], &[(1usize, 2usize)][..]),
            (&[2, 3], &[(1, 0), (0, 2)]),
            (&[3], &[(0, 0)]),
            (&[2, 3, 4], &[(0, 1)]),
            (&[0, 2], &[(1, 1), (1, 0)]),
            (&[], &[]),
        ] {
            let p = pads.to_vec();
            let mut per_dim = vec![(0, 0); shape.len()];
            for (i, &q) in pads.iter().enumerate() {
                per_dim[shape.len() - 1 - i] = q;
            }
            add(
                "pad",
                shape,
                format!("{pads:?} with 1"),
                Box::new(move |x| x.pad(&p, 1)),
                Box::new(move |x| x.pad(&per_dim, 1.0)),
            );
        }
        for (shape, k) in
            [(&[3, 4][..], 0i64), (&[3, 4], -1), (&[4, 3], 1), (&[2, 3, 4], 2), (&[2, 3, 3], -5), (&[0, 3], 0)]
        {
            let keep = |lower: bool, k: i64| {
                move |x: &Nd| {
                    let r = x.shape.len();
                    Nd::from_fn(&x.shape, |i| {
                        let off = i[r - 1] as i64 - i[r - 2] as i64;
                        if (lower && off <= k) || (!lower && off >= k) { x.at(i) } else { 0.0 }
                    })
                }
            };
            add("tril", shape, format!("diagonal {k}"), Box::new(move |x| x.tril(k)), Box::new(keep(true, k)));
            add("triu", shape, format!("diagonal {k}"), Box::new(move |x| x.triu(k)), Box::new(keep(false, k)));
        }
        for (shape, shifts, dims) in [
            (&[2, 3][..], &[1i64][..], &[][..]),
            (&[2, 3], &[1, -1], &[0isize, 1]),
            (&[5], &[7], &[0]),
            (&[4, 5], &[-12], &[-1]),
            (&[3, 0], &[2], &[0]),
            (&[2, 3, 4], &[1, 2], &[0, 2]),
        ] {
            let (sh, dm) = (shifts.to_vec(), dims.to_vec());
            let (rsh, rdm) = (shifts.to_vec(), dims.to_vec());
            add(
                "roll",
                shape,
                format!("shifts {shifts:?} dims {dims:?}"),
                Box::new(move |x| x.roll(&sh, &dm)),
                Box::new(move |x| {
                    if rdm.is_empty() {
                        // Rolled as if flat.
                        let n = x.numel() as i64;
                        let flat = x.reshape(&[x.numel()]);
                        let rolled =
                            Nd::from_fn(&[x.numel()], |i| flat.at(&[(i[0] as i64 - rsh[0]).rem_euclid(n) as usize]));
                        return rolled.reshape(&x.shape);
                    }
                    let axes: Vec<usize> = rdm.iter().map(|&q| resolve(q, x.shape.len())).collect();
                    Nd::from_fn(&x.shape, |i| {
                        let mut src = i.to_vec();
                        for (&a, &s) in axes.iter().zip(&rsh) {
                            let n = x.shape[a] as i64;
                            src[a] = (i[a] as i64 - s).rem_euclid(n) as usize;
                        }
                        x.at(&src)
                    })
                }),
            );
        }
        for (shape, sizes, tile) in [
            (&[2][..], &[2usize, 2][..], false),
            (&[2, 3], &[1, 2], false),
            (&[2, 3], &[3, 1, 2], false),
            (&[], &[3], false),
            (&[2, 3], &[2], true),
            (&[2, 0], &[2, 2], false),
        ] {
            let sz = sizes.to_vec();
            let full: Vec<usize> =
                std::iter::repeat_n(1, shape.len().saturating_sub(sizes.len())).chain(sizes.iter().copied()).collect();
            let op = if tile { "tile" } else { "repeat" };
            add(
                op,
                shape,
                format!("{sizes:?}"),
                Box::new(move |x| if tile { x.tile(&sz) } else { x.repeat(&sz) }),
                Box::new(move |x| {
                    let lead = full.len() - x.shape.len();
                    let out: Vec<usize> = full
                        .iter()
                        .enumerate()
                        .map(|(i, &s)| s * if i < lead { 1 } else { x.shape[i - lead] })
                        .collect();
                    Nd::from_fn(&out, |i| {
                        let src: Vec<usize> = (0..x.shape.len()).map(|k| i[k + lead] % x.shape[k]).collect();
                        x.at(&src)
                    })
                }),
            );
        }
        // chunk and split: each piece is a narrow of the input.
        for (shape, dim, how, pieces) in [
            (&[7][..], 0isize, "chunk 3", &[(0usize, 3usize), (3, 3), (6, 1)][..]),
            (&[5, 2], 0, "chunk 4", &[(0, 2), (2, 2), (4, 1)]),
            (&[2, 7], -1, "split 3", &[(0, 3), (3, 3), (6, 1)]),
            (&[2, 7], 1, "split [2, 5]", &[(0, 2), (2, 5)]),
            (&[0, 2], 0, "split 2", &[(0, 0)]),
        ] {
            for (p, &(start, len)) in pieces.iter().enumerate() {
                let dd = resolve(dim, shape.len());
                let how = how.to_string();
                let h = how.clone();
                add(
                    if how.starts_with("chunk") { "chunk" } else { "split" },
                    shape,
                    format!("{how} along {dim}, piece {p}"),
                    Box::new(move |x| {
                        let parts = match h.as_str() {
                            "chunk 3" => x.chunk(3, dim),
                            "chunk 4" => x.chunk(4, dim),
                            "split 3" => x.split(3, dim),
                            "split 2" => x.split(2, dim),
                            _ => x.split_sizes(&[2, 5], dim),
                        };
                        assert_eq!(parts.len(), pieces.len(), "pieces");
                        parts[p].clone()
                    }),
                    Box::new(move |x| x.slice(dd, start, start + len, 1)),
                );
            }
        }
        // The border modes: each padded dim maps an output position to a source one (PyTorch's definitions).
        for (shape, pads) in [
            (&[5][..], &[(2usize, 3usize)][..]),
            (&[2, 3, 4], &[(1, 2), (2, 0)]),
            (&[3, 3], &[(0, 0), (1, 1)]),
            (&[2, 3], &[(3, 2)]),
        ] {
            for mode in [kiln::PadMode::Reflect, kiln::PadMode::Replicate, kiln::PadMode::Circular] {
                let fits = pads.iter().enumerate().all(|(i, &(b, a))| {
                    let n = shape[shape.len() - 1 - i];
                    match mode {
                        kiln::PadMode::Reflect => b < n && a < n,
                        kiln::PadMode::Replicate => n > 0,
                        kiln::PadMode::Circular => b <= n && a <= n,
                    }
                });
                if !fits {
                    continue; // refused with a message (tests/errors.rs)
                }
                let p = pads.to_vec();
                let rp = pads.to_vec();
                add(
                    "pad_with",
                    shape,
                    format!("{pads:?} {mode:?}"),
                    Box::new(move |x| x.pad_with(&p, mode)),
                    Box::new(move |x| {
                        let r = x.shape.len();
                        let mut before = vec![0usize; r];
                        let mut out = x.shape.clone();
                        for (i, &(b, a)) in rp.iter().enumerate() {
                            before[r - 1 - i] = b;
                            out[r - 1 - i] += b + a;
                        }
                        Nd::from_fn(&out, |o| {
                            let src: Vec<usize> = (0..r)
                                .map(|k| {
                                    let n = x.shape[k] as i64;
                                    let i = o[k] as i64 - before[k] as i64;
                                    (match mode {
                                        kiln::PadMode::Reflect => {
                                            if i < 0 {
                                                -i
                                            } else if i >= n {
                                                2 * (n - 1) - i
                                            } else {
                                                i
                                            }
                                        }
                                        kiln::PadMode::Replicate => i.clamp(0, n - 1),
                                        kiln::PadMode::Circular => i.rem_euclid(n),
                                    }) as usize
                                })
                                .collect();
                            x.at(&src)
                        })
                    }),
                );
            }
        }
        for shape in [&[2, 3, 4][..], &[3, 4]] {
            add("contiguous", shape, "plain".into(), Box::new(Tensor::contiguous), Box::new(|x| x.clone()));
        }
        add(
            "contiguous",
            &[2, 3, 4],
            "of a permute".into(),
            Box::new(|x| x.permute([2, 0, 1]).contiguous()),
            Box::new(|x| x.permute(&[2, 0, 1])),
        );
        add(
            "contiguous",
            &[3, 1],
            "of an expand".into(),
            Box::new(|x| x.expand([3, 4]).contiguous()),
            Box::new(|x| x.broadcast_to(&[3, 4])),
        );
        add(
            "contiguous",
            &[4, 5],
            "of a strided flip".into(),
            Box::new(|x| x.flip(0).slice(1, 0, 5, 2).contiguous()),
            Box::new(|x| x.flip(&[0]).slice(1, 0, 5, 2)),
        );

        for (i, (op, shape, what, f, r)) in cases.into_iter().enumerate() {
            let x = In::random(d, &shape, seed(&[&op, &d, &i]), any_dom(d));
            let want = r(&x.nd());
            t.check(op, &what, vec![x], move |a| f(&a[0]), Want::nd(d, &want, Kind::Exact));
        }

        // cat and stack: several inputs.
        for (shapes, dim) in [
            (vec![vec![2, 3], vec![2, 1]], 1isize),
            (vec![vec![2, 3], vec![1, 3], vec![3, 3]], 0),
            (vec![vec![2, 3], vec![2, 2]], -1),
            (vec![vec![2, 3], vec![0, 3]], 0),
            (vec![vec![3], vec![4]], 0),
            (vec![vec![2, 3, 4], vec![2, 1, 4]], 1),
            (vec![vec![1, 2], vec![1, 2]], -2),
            (vec![vec![2, 2]], 0),
            (vec![vec![0, 2], vec![0, 3]], 1),
        ] {
            let ins: Vec<In> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| In::random(d, s, seed(&[&"cat", &d, &shapes, &k]), any_dom(d)))
                .collect();
            let nds: Vec<Nd> = ins.iter().map(In::nd).collect();
            let want = Nd::cat(&nds.iter().collect::<Vec<_>>(), resolve(dim, shapes[0].len()));
            t.check(
                "cat",
                &format!("dim {dim}"),
                ins,
                move |a| Tensor::cat(&a.iter().collect::<Vec<_>>(), dim),
                Want::nd(d, &want, Kind::Exact),
            );
        }
        for (shape, n, dim) in [
            (vec![2, 3], 3, 0isize),
            (vec![2, 3], 3, 1),
            (vec![2, 3], 2, 2),
            (vec![2, 3], 2, -1),
            (vec![2, 3], 2, -3),
            (vec![], 3, 0),
            (vec![0, 2], 2, 1),
        ] {
            let ins: Vec<In> =
                (0..n).map(|k| In::random(d, &shape, seed(&[&"stack", &d, &shape, &dim, &k]), any_dom(d))).collect();
            let at = resolve(dim, shape.len() + 1);
            let mut one = shape.clone();
            one.insert(at, 1);
            let nds: Vec<Nd> = ins.iter().map(|i| i.nd().reshape(&one)).collect();
            let want = Nd::cat(&nds.iter().collect::<Vec<_>>(), at);
            t.check(
                "stack",
                &format!("dim {dim}"),
                ins,
                move |a| Tensor::stack(&a.iter().collect::<Vec<_>>(), dim),
                Want::nd(d, &want, Kind::Exact),
            );
        }
    }
    // Floats: cat keeps -0.0, NaN and infinities bit for bit; pad with a float value and -inf.
    for d in FLOATS {
        t.check(
            "cat",
            "-0.0, NaN and inf survive",
            vec![v(d, &[-0.0, 1.0]), v(d, &[-0.0, 0.0, NAN]), v(d, &[-INF])],
            |a| Tensor::cat(&[&a[0], &a[1], &a[2]], 0),
            Want::new(d, &[6], &[-0.0, 1.0, -0.0, 0.0, NAN, -INF], Kind::Exact),
        );
        t.check(
            "stack",
            "-0.0 survives",
            vec![v(d, &[-0.0]), v(d, &[-0.0])],
            |a| Tensor::stack(&[&a[0], &a[1]], 0),
            Want::new(d, &[2, 1], &[-0.0, -0.0], Kind::Exact),
        );
        t.check(
            "pad",
            "value 2.5 and -inf",
            vec![In::new(d, &[1, 2], &[1.0, -0.0])],
            |a| a[0].pad(&[(1, 0)], 2.5).pad(&[(0, 0), (0, 1)], f64::NEG_INFINITY),
            Want::new(d, &[2, 3], &[2.5, 1.0, -0.0, -INF, -INF, -INF], Kind::Exact),
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// matmul, softmax, log_softmax
// ---------------------------------------------------------------------------------------------------------------

/// torch.matmul's rank rules on the reference: 1-D operands become a row (left) or column (right) and lose that
/// dim again.
fn matmul_ref(a: &Nd, b: &Nd) -> Nd {
    let a2 = if a.shape.len() == 1 { a.reshape(&[1, a.shape[0]]) } else { a.clone() };
    let b2 = if b.shape.len() == 1 { b.reshape(&[b.shape[0], 1]) } else { b.clone() };
    let out = a2.matmul(&b2);
    let mut shape = out.shape.clone();
    let r = shape.len();
    match (a.shape.len(), b.shape.len()) {
        (1, 1) => shape.clear(),
        (1, _) => {
            shape.remove(r - 2);
        }
        (_, 1) => {
            shape.remove(r - 1);
        }
        _ => {}
    }
    out.reshape(&shape)
}

fn softmax_ref(x: &Nd, dim: isize, log: bool) -> Nd {
    if x.shape.is_empty() {
        return Nd::scalar(if log { 0.0 } else { 1.0 });
    }
    let d = resolve(dim, x.shape.len());
    Nd::from_fn(&x.shape, |i| {
        let row: Vec<f64> = (0..x.shape[d])
            .map(|j| {
                let mut k = i.to_vec();
                k[d] = j;
                x.at(&k)
            })
            .collect();
        let m = row.iter().fold(-INF, |a, &b| if a.is_nan() || b.is_nan() { NAN } else { a.max(b) });
        let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
        let v = x.at(i);
        if log { v - m - s.ln() } else { (v - m).exp() / s }
    })
}

fn linalg(t: &mut Table) {
    let shapes: [(&[usize], &[usize]); 13] = [
        (&[4], &[4]),
        (&[3], &[3, 2]),
        (&[2, 3], &[3]),
        (&[2, 3], &[3, 4]),
        (&[1, 1], &[1, 1]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[2, 4, 3]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[2, 0], &[0, 3]),
        (&[0, 3], &[3, 2]),
        (&[3, 8], &[8, 3]),
        (&[2, 2, 3], &[2, 3, 2]),
    ];
    for d in [U8, U32, I32, I64, F16, F32, F64] {
        let dom = if d.is_float() { Dom::Cont(-2.0, 2.0) } else { Dom::Cont(-5.0, 20.0) };
        for (sa, sb) in shapes {
            let a = In::random(d, sa, seed(&[&"matmul a", &d, &sa, &sb]), dom);
            let b = In::random(d, sb, seed(&[&"matmul b", &d, &sa, &sb]), dom);
            let want = matmul_ref(&a.nd(), &b.nd());
            t.check("matmul", "", vec![a, b], |x| x[0].matmul(&x[1]), Want::nd(d, &want, Kind::Accumulate));
        }
    }
    t.check(
        "matmul",
        "u8 wraps",
        vec![In::new(U8, &[1, 2], &[16.0, 1.0]), In::new(U8, &[2, 1], &[16.0, 3.0])],
        |x| x[0].matmul(&x[1]),
        Want::new(U8, &[1, 1], &[3.0], Kind::Exact),
    );

    let cases: [(&[usize], isize); 10] = [
        (&[], 0),
        (&[], -1),
        (&[5], 0),
        (&[2, 3, 4], 0),
        (&[2, 3, 4], 1),
        (&[2, 3, 4], -1),
        (&[3, 64], -1),
        (&[0, 3], 1),
        (&[0, 3], 0),
        (&[2, 0], -1),
    ];
    for d in FLOATS {
        for (shape, dim) in cases {
            for (op, log) in [("softmax", false), ("log_softmax", true)] {
                let x = In::random(d, shape, seed(&[&op, &d, &shape, &dim]), Dom::Cont(-4.0, 4.0));
                let want = softmax_ref(&x.nd(), dim, log);
                t.check(
                    op,
                    &format!("dim {dim}"),
                    vec![x],
                    move |a| if log { a[0].log_softmax(dim) } else { a[0].softmax(dim) },
                    Want::nd(d, &want, Kind::Accumulate),
                );
            }
        }
        // Stable for large inputs (exp overflows f32 past 88.7); -inf entries are masked out; NaN poisons its row
        // only. bf16 holds consecutive integers only up to 256.
        let big = if d == BF16 { 128.0 } else { 1000.0 };
        let x = In::new(d, &[3, 3], &[big, big + 1.0, big + 2.0, -INF, 0.0, -INF, NAN, 1.0, 2.0]);
        let e = [(-2f64).exp(), (-1f64).exp(), 1.0];
        let s: f64 = e.iter().sum();
        let soft = [e[0] / s, e[1] / s, e[2] / s, 0.0, 1.0, 0.0, NAN, NAN, NAN];
        let logs = [-2.0 - s.ln(), -1.0 - s.ln(), -s.ln(), -INF, 0.0, -INF, NAN, NAN, NAN];
        t.check(
            "softmax",
            "large, -inf, NaN rows",
            vec![x.clone()],
            |a| a[0].softmax(-1),
            Want::new(d, &[3, 3], &soft, Kind::Accumulate),
        );
        t.check(
            "log_softmax",
            "large, -inf, NaN rows",
            vec![x],
            |a| a[0].log_softmax(1),
            Want::new(d, &[3, 3], &logs, Kind::Accumulate),
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Random numbers
// ---------------------------------------------------------------------------------------------------------------

fn draw(f: fn(&[usize], DType, &Device) -> Tensor, n: usize, d: DType, dev: &Device) -> Result<Vec<f64>, String> {
    let x = f(&[n], d, dev);
    if x.dtype() != d || x.dims() != [n] {
        return Err(format!("got {x:?}"));
    }
    Ok(values(&x.to_host().map_err(|e| e.to_string())?))
}

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n)
}

fn random(t: &mut Table) {
    type R = fn(&[usize], DType, &Device) -> Tensor;
    let rand: R = |s, d, dev| Tensor::rand(s.to_vec(), d, dev);
    let randn: R = |s, d, dev| Tensor::randn(s.to_vec(), d, dev);
    for d in FLOATS {
        for (op, f) in [("rand", rand), ("randn", randn)] {
            t.custom(op, &[d], "manual_seed: same seed, same numbers; the stream advances", move |dev| {
                kiln::manual_seed(1234);
                let a = draw(f, 1000, d, dev)?;
                let a2 = draw(f, 1000, d, dev)?;
                kiln::manual_seed(1234);
                let b = draw(f, 1000, d, dev)?;
                let b2 = draw(f, 1000, d, dev)?;
                kiln::manual_seed(1235);
                let c = draw(f, 1000, d, dev)?;
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                if bits(&a) != bits(&b) || bits(&a2) != bits(&b2) {
                    return Err("the same seed gave different numbers".into());
                }
                if a == a2 || a == c {
                    return Err("consecutive draws or different seeds gave the same numbers".into());
                }
                Ok(())
            });
            t.custom(op, &[d], "numbers do not depend on when or with what they are realized", move |dev| {
                kiln::manual_seed(99);
                let (a, b) = (f(&[50], d, dev), f(&[2, 25], d, dev));
                let bv = values(&b.to_host().map_err(|e| e.to_string())?);
                let av = values(&a.to_host().map_err(|e| e.to_string())?);
                kiln::manual_seed(99);
                let (a2, b2) = (f(&[50], d, dev), f(&[50], d, dev));
                let both = Tensor::cat(&[&a2, &b2], 0);
                let v = values(&both.to_host().map_err(|e| e.to_string())?);
                if v[..50] != av[..] || v[50..] != bv[..] {
                    return Err("realization order or graph changed the numbers".into());
                }
                Ok(())
            });
        }
        t.custom("rand", &[d], "10k samples: all in [0, 1), mean 1/2, variance 1/12", move |dev| {
            kiln::manual_seed(7);
            let v = draw(rand, 10_000, d, dev)?;
            if let Some(x) = v.iter().find(|x| !(0.0..1.0).contains(*x)) {
                return Err(format!("{x} outside [0, 1)"));
            }
            let (m, var) = moments(&v);
            // Standard errors: 0.0029 for the mean, 0.00075 for the variance; the bounds are ~5 of them.
            if (m - 0.5).abs() > 0.015 || (var - 1.0 / 12.0).abs() > 0.004 {
                return Err(format!("mean {m}, variance {var}"));
            }
            Ok(())
        });
        t.custom("randn", &[d], "10k samples: mean 0, variance 1", move |dev| {
            kiln::manual_seed(7);
            let v = draw(randn, 10_000, d, dev)?;
            if v.iter().any(|x| !x.is_finite()) {
                return Err("a non-finite normal sample".into());
            }
            let (m, var) = moments(&v);
            // Standard errors: 0.01 for the mean, 0.014 for the variance; the bounds are 5 of them.
            if m.abs() > 0.05 || (var - 1.0).abs() > 0.07 {
                return Err(format!("mean {m}, variance {var}"));
            }
            Ok(())
        });
        t.custom("manual_seed", &[d], "rand and randn share one stream", move |dev| {
            kiln::manual_seed(5);
            let _ = rand(&[10], d, dev);
            let a = draw(randn, 10, d, dev)?;
            kiln::manual_seed(5);
            let _ = randn(&[10], d, dev);
            let b = draw(randn, 10, d, dev)?;
            if a != b {
                return Err("the second draw depends on the first draw's distribution".into());
            }
            Ok(())
        });
    }
    // Golden values: a seed gives the same numbers on every backend and in every later version of kiln (Philox
    // 4x32-10; uniform f32 values are bit-exact, normals agree to the libm's accuracy).
    t.build(
        "rand",
        &[F32],
        "golden values for seed 0",
        |dev| {
            kiln::manual_seed(0);
            Tensor::rand([4], F32, dev)
        },
        Want::buf(&[4], HostBuffer::F32(vec![0.39904642, 0.97224116, 0.019449413, 0.78736776].into()), Kind::Exact),
    );
    t.build(
        "randn",
        &[F64],
        "golden values for seed 0",
        |dev| {
            kiln::manual_seed(0);
            Tensor::randn([4], F64, dev)
        },
        Want::new(
            F64,
            &[4],
            &[-0.6176090549848544, 0.8317351265968663, -0.2696493043774042, -0.8988259151924168],
            Kind::Elementwise,
        ),
    );
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
