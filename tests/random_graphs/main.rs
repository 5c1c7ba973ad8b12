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
//!
//! Files: this one runs programs and holds the tests and the regressions the generator found; `program.rs` is what a
//! program is, `meta.rs` the value classes, `decode/` how raw numbers become a program (its core, then one file per
//! family of steps).

// Programs run on the CPU (cargo feature `cpu`), which other devices are held to.
#![cfg(feature = "cpu")]

#[path = "../test_cache/mod.rs"]
mod test_cache;

#[path = "../common/mod.rs"]
mod common;

mod decode;
mod meta;
mod program;

use decode::*;
use meta::*;
use program::*;

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
