//! Gradient checks: for every differentiable op of the public API (the op table's list), the gradients that
//! `backward` builds are compared with central finite differences of the same forward, in f64.
//!
//! Each check takes a few f64 leaves and a forward `f`, forms the scalar loss `L = sum(f(inputs) * R)` with a fixed
//! random weight tensor `R` (magnitudes in [0.5, 1.5], random signs, so every output element matters and no two
//! carry the same weight), and compares, for every input element `x_j`:
//!
//! * analytic: `backward()`'s gradient, realized by kiln, both when the loss is left lazy (forward and backward
//!   fuse into one graph) and when the loss is realized before `backward` (a training loop that logs its loss);
//! * numeric: `(L(x_j + EPS) - L(x_j - EPS)) / (2 EPS)`, each loss a fresh graph realized by kiln.
//!
//! Inputs are drawn away from the points where an op is not differentiable (0 for abs/relu/recip, ties for
//! maximum/minimum/max/min, bounds for clamp), and kept small (<= 24 elements) so the whole file runs in seconds.
//! The tests at the end cover autograd's semantics: ties, accumulation, which leaves get gradients, detach,
//! no_grad, errors, graph freeing and memory.

// Finite differences run on the CPU (cargo feature `cpu`), which other devices' gradients are held to.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::{Kind, Nd, Rng, Tol, tol, values};
use kiln::nn::functional::{self as F, Reduction};
use kiln::{DType, Device, Tensor};
use std::panic::AssertUnwindSafe;
use std::sync::{RwLock, RwLockReadGuard};

use DType::{F32, F64, I64};

/// Central-difference step.
const EPS: f64 = 1e-6;

/// THE gradient tolerance: `|analytic - numeric| <= 1e-6 * (1 + |numeric|)`. A central difference errs by
/// O(EPS^2 * |f'''| / 6) from truncation (~1e-12 * |f'''|, at most ~1e-10 for the steepest inputs here) plus
/// O(ulp(L) / EPS) from rounding the two losses (L sums <= ~100 terms of size ~1: a few 1e-15 each, divided by
/// 2 EPS: ~1e-9). The largest f64 error observed over all checks here is ~2e-9, so 1e-6 leaves a wide margin,
/// while a wrong VJP (a missing factor, sign, or broadcast sum) is off by O(|gradient|).
const GRAD_TOL: Tol = Tol { rel: 1e-6, abs: 1e-6 };

/// `live_nodes` is process-wide and tests run on parallel threads: every test that builds tensors holds this
/// shared, the live-node test holds it exclusively.
static NODES: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    NODES.read().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The device the current check builds its tensors on: the CPU, or another device during `on_other_devices`.
    static DEV: std::cell::Cell<Device> = const { std::cell::Cell::new(Device::Cpu) };
}

fn dev() -> Device {
    DEV.with(|d| d.get())
}

/// The gradient tolerance on a device without f64, where a check compares backward's f32 gradients with the CPU's
/// f64 gradients (which `gradcheck` has just held to finite differences): `1e-4 * (1 + |g|)`. The forwards here are
/// a few ops over <= 24 elements of magnitude ~1; each f32 op errs by <= 0.6e-7 relative (a driver's
/// transcendentals by a few ulp, `/` and `sqrt` by 2.5 ulp in WGSL), and forward plus backward chain a few dozen of
/// them, with sums of <= 24 terms: ~1e-5 in the worst compositions (pow, softmax, log_softmax). 1e-4 leaves a
/// margin, while a wrong VJP on the device is off by O(|gradient|).
const GRAD_TOL_F32: Tol = Tol { rel: 1e-4, abs: 1e-4 };

// ---------------------------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------------------------

/// One input of a check: shape, values (exactly representable in `dtype`), and the leaf dtype.
#[derive(Clone, Debug)]
struct In {
    shape: Vec<usize>,
    vals: Vec<f64>,
    dtype: DType,
}

impl In {
    fn nd(&self) -> Nd {
        Nd::new(&self.shape, self.vals.clone())
    }

    /// The same values as an f32 leaf (rounded to f32).
    fn f32(mut self) -> In {
        self.vals = self.vals.iter().map(|&x| x as f32 as f64).collect();
        self.dtype = F32;
        self
    }

    /// Moves every value within `gap` of one of `points` to `2 gap` away from it (keeping its side).
    fn away_from(mut self, points: &[f64], gap: f64) -> In {
        for v in &mut self.vals {
            for &p in points {
                if (*v - p).abs() < gap {
                    *v = if *v >= p { p + 2.0 * gap } else { p - 2.0 * gap };
                }
            }
        }
        self
    }

    fn tensor(&self, dtype: DType) -> Tensor {
        let t = match dtype {
            F64 => Tensor::from_vec(self.vals.clone(), self.shape.clone(), &dev()),
            F32 => Tensor::from_vec(self.vals.iter().map(|&x| x as f32).collect(), self.shape.clone(), &dev()),
            d => unreachable!("test bug: leaf dtype {d}"),
        };
        t.expect("from_vec")
    }
}

/// Deterministic test data (SplitMix64 from `common`), one stream per test.
struct Gen(Rng);

impl Gen {
    fn new(name: &str) -> Gen {
        // FNV-1a of the name: every test draws different numbers.
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        Gen(Rng(h))
    }

    fn make(&mut self, shape: &[usize], mut f: impl FnMut(&mut Rng) -> f64) -> In {
        let n = shape.iter().product();
        In { shape: shape.to_vec(), vals: (0..n).map(|_| f(&mut self.0)).collect(), dtype: F64 }
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, shape: &[usize], lo: f64, hi: f64) -> In {
        self.make(shape, |r| lo + r.unit() * (hi - lo))
    }

    /// Magnitude uniform in [lo, hi), random sign: away from 0.
    fn signed(&mut self, shape: &[usize], lo: f64, hi: f64) -> In {
        self.make(shape, |r| {
            let m = lo + r.unit() * (hi - lo);
            if r.unit() < 0.5 { -m } else { m }
        })
    }

    /// Values in [-2, 2] at least `2 / n` apart (a jittered random permutation of a grid): no ties for max/min.
    fn distinct(&mut self, shape: &[usize]) -> In {
        let n: usize = shape.iter().product();
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            perm.swap(i, (self.0.next_u64() % (i as u64 + 1)) as usize);
        }
        let step = 4.0 / n as f64;
        let vals = perm.iter().map(|&k| -2.0 + (k as f64 + 0.25 + 0.5 * self.0.unit()) * step).collect();
        In { shape: shape.to_vec(), vals, dtype: F64 }
    }
}

/// Asserts (a test bug otherwise) that `a` and `b` differ by more than `gap` wherever they meet by broadcasting.
fn assert_apart(a: &In, b: &In, gap: f64) {
    let d = a.nd().zip(&b.nd(), |x, y| (x - y).abs());
    let min = d.v.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(min > gap, "test bug: inputs {:?} and {:?} come within {min} of each other", a.shape, b.shape);
}

// ---------------------------------------------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------------------------------------------

type Forward<'a> = &'a dyn Fn(&[Tensor]) -> Tensor;

/// Collects failures of many checks and reports them together.
struct Suite {
    name: &'static str,
    checks: usize,
    failures: Vec<String>,
    _guard: RwLockReadGuard<'static, ()>,
}

impl Suite {
    fn new(name: &'static str) -> Suite {
        Suite { name, checks: 0, failures: Vec::new(), _guard: shared() }
    }

    /// Gradient check of `f` against central differences of `f` itself, in f64.
    fn check(&mut self, what: &str, ins: &[In], f: impl Fn(&[Tensor]) -> Tensor) {
        self.check_with(what, ins, &f, &f, GRAD_TOL);
    }

    /// Gradient check of `f` (leaves of each input's dtype) against central differences of `f_ref` evaluated on f64
    /// leaves, within `tol`. `f_ref` computes the same function as `f` without the lower precision `f` may use.
    fn check_with(&mut self, what: &str, ins: &[In], f: Forward, f_ref: Forward, tol: Tol) {
        self.checks += 1;
        let seed = self.checks as u64;
        let res = std::panic::catch_unwind(AssertUnwindSafe(|| gradcheck(ins, f, f_ref, tol, seed)));
        let err = match res {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "non-string panic".into());
                format!("panicked: {msg}")
            }
        };
        let shapes: Vec<_> = ins.iter().map(|i| (&i.shape, i.dtype.name())).collect();
        self.failures.push(format!("{what} {shapes:?}: {err}"));
    }

    fn finish(self) {
        use std::sync::atomic::Ordering::Relaxed;
        common::check_gpu_sources(self.name);
        eprintln!(
            "{}: {} checks; on other devices so far (all suites): {} run, {} needing f64/i64 inside not run",
            self.name,
            self.checks,
            RAN_ON_DEVICES.load(Relaxed),
            SKIPPED_ON_DEVICES.load(Relaxed)
        );
        assert!(
            self.failures.is_empty(),
            "{}: {} of {} gradient checks failed:\n  {}",
            self.name,
            self.failures.len(),
            self.checks,
            self.failures.join("\n  ")
        );
    }
}

/// The weight tensor `R`: magnitudes in [0.5, 1.5] with random signs.
fn weights(dims: &[usize], seed: u64) -> Tensor {
    let mut r = Rng(0x5EED ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let n = dims.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let m = 0.5 + r.unit();
            if r.unit() < 0.5 { -m } else { m }
        })
        .collect();
    Tensor::from_vec(v, dims.to_vec(), &dev()).expect("weights")
}

fn loss_of(out: &Tensor, r: &Tensor) -> Result<Tensor, String> {
    if out.dtype() != r.dtype() {
        return Err(format!("test bug: the forward gives {}, not {}", out.dtype(), r.dtype()));
    }
    if out.dims() != r.dims() {
        return Err(format!("forward shape {:?} changed to {:?}", r.dims(), out.dims()));
    }
    Ok(out.mul(r).sum_all())
}

/// The analytic gradients of `f` at `ins`, realizing the loss before `backward` if `loss_first`.
fn analytic(ins: &[In], f: Forward, r: &Tensor, loss_first: bool) -> Result<Vec<Vec<f64>>, String> {
    let leaves: Vec<Tensor> = ins.iter().map(|i| i.tensor(i.dtype).requires_grad()).collect();
    let loss = loss_of(&f(&leaves), r)?;
    if loss_first {
        loss.item::<f64>().map_err(|e| format!("forward: {e}"))?;
    }
    let grads = loss.backward().map_err(|e| format!("backward: {e}"))?;
    let mut gs = Vec::new();
    for (k, leaf) in leaves.iter().enumerate() {
        let g = grads.get(leaf).ok_or_else(|| format!("input {k} got no gradient"))?;
        if g.dims() != leaf.dims() || g.dtype() != leaf.dtype() {
            return Err(format!(
                "gradient {k} is {}{:?}, its leaf {}{:?}",
                g.dtype(),
                g.dims(),
                leaf.dtype(),
                leaf.dims()
            ));
        }
        gs.push(g.clone());
    }
    kiln::realize(&gs.iter().collect::<Vec<_>>()).map_err(|e| format!("realizing gradients: {e}"))?;
    gs.iter().map(|g| Ok(values(&g.to_host().map_err(|e| e.to_string())?))).collect()
}

fn gradcheck(ins: &[In], f: Forward, f_ref: Forward, tol: Tol, seed: u64) -> Result<(), String> {
    let out_dims = kiln::no_grad(|| f(&ins.iter().map(|i| i.tensor(i.dtype)).collect::<Vec<_>>())).dims().to_vec();
    let r = weights(&out_dims, seed);
    let lazy = analytic(ins, f, &r, false)?;
    let eager = analytic(ins, f, &r, true)?;

    let loss_at = |vals: &[Vec<f64>]| -> Result<f64, String> {
        let leaves: Vec<Tensor> = ins
            .iter()
            .zip(vals)
            .map(|(i, v)| Tensor::from_vec(v.clone(), i.shape.clone(), &dev()).expect("from_vec"))
            .collect();
        loss_of(&f_ref(&leaves), &r)?.item::<f64>().map_err(|e| format!("forward: {e}"))
    };
    let mut vals: Vec<Vec<f64>> = ins.iter().map(|i| i.vals.clone()).collect();
    let mut bad = Vec::new();
    let mut count = 0;
    for k in 0..ins.len() {
        for j in 0..vals[k].len() {
            let x = vals[k][j];
            // Divide by the step actually taken: x +- EPS are rounded.
            let (xp, xm) = (x + EPS, x - EPS);
            vals[k][j] = xp;
            let plus = loss_at(&vals)?;
            vals[k][j] = xm;
            let minus = loss_at(&vals)?;
            vals[k][j] = x;
            let numeric = (plus - minus) / (xp - xm);
            for (path, a) in [("lazy", lazy[k][j]), ("loss realized first", eager[k][j])] {
                // Written so that a NaN on either side fails.
                let ok = (a - numeric).abs() <= tol.abs + tol.rel * numeric.abs();
                if !ok {
                    count += 1;
                    if bad.len() < 6 {
                        bad.push(format!("input {k}[{j}] ({path}): analytic {a:.9}, numeric {numeric:.9}"));
                    }
                }
            }
        }
    }
    if !bad.is_empty() {
        return Err(format!("{count} mismatches (tol {tol:?}): {}", bad.join("; ")));
    }
    on_other_devices(ins, f, &r, &lazy)
}

/// Whether `dev` holds the check's forward: it builds there (an f64 or i64 value inside, or a CPU tensor the
/// closure captured, makes building panic).
fn forward_builds_on(ins: &[In], f: Forward) -> bool {
    let leaves = || ins.iter().map(|i| i.tensor(F32)).collect::<Vec<_>>();
    std::panic::catch_unwind(AssertUnwindSafe(|| kiln::no_grad(|| f(&leaves())))).is_ok()
}

/// Backward on every device of `common::devices()` other than the CPU, with f32 leaves there, held to the CPU's
/// f64 gradients `want` (already checked against finite differences) within `GRAD_TOL_F32`. A forward that does
/// not build on a device (it needs f64 or i64 inside) is counted in `SKIPPED_ON_DEVICES`.
fn on_other_devices(ins: &[In], f: Forward, r: &Tensor, want: &[Vec<f64>]) -> Result<(), String> {
    let others: Vec<Device> = common::devices().into_iter().filter(|d| *d != Device::cpu()).collect();
    for d in others {
        let prev = DEV.with(|c| c.replace(d));
        let res = (|| {
            if !forward_builds_on(ins, f) {
                SKIPPED_ON_DEVICES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(());
            }
            RAN_ON_DEVICES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r32 = r.to_dtype(F32).to_device(&d).map_err(|e| e.to_string())?;
            let leaves: Vec<Tensor> = ins.iter().map(|i| i.tensor(F32).requires_grad()).collect();
            let loss = loss_of(&f(&leaves), &r32)?;
            let grads = loss.backward().map_err(|e| format!("[{d}] backward: {e}"))?;
            let mut bad = Vec::new();
            for (k, leaf) in leaves.iter().enumerate() {
                let g = grads.get(leaf).ok_or_else(|| format!("[{d}] input {k} got no gradient"))?;
                let got = values(&g.to_host().map_err(|e| format!("[{d}] {e}"))?);
                for (j, (&a, &w)) in got.iter().zip(&want[k]).enumerate() {
                    // Written so that a NaN on either side fails.
                    let ok = (a - w).abs() <= GRAD_TOL_F32.abs + GRAD_TOL_F32.rel * w.abs();
                    if !ok && bad.len() < 6 {
                        bad.push(format!("input {k}[{j}]: {d} {a:.7}, cpu f64 {w:.9}"));
                    }
                }
            }
            if bad.is_empty() { Ok(()) } else { Err(format!("[{d}] (tol {GRAD_TOL_F32:?}): {}", bad.join("; "))) }
        })();
        DEV.with(|c| c.set(prev));
        res?;
    }
    Ok(())
}

static RAN_ON_DEVICES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SKIPPED_ON_DEVICES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// ---------------------------------------------------------------------------------------------------------------
// Elementwise unary
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn unary_ops() {
    let mut s = Suite::new("unary");
    let mut g = Gen::new("unary");
    type U = fn(&Tensor) -> Tensor;
    // (name, op, input domain)
    let ops: Vec<(&str, U, In)> = vec![
        ("neg", |x| x.neg(), g.uniform(&[3, 4], -2.0, 2.0)),
        ("neg operator", |x| -x, g.uniform(&[3, 4], -2.0, 2.0)),
        ("abs", |x| x.abs(), g.signed(&[3, 4], 0.1, 2.0)),
        ("exp", |x| x.exp(), g.uniform(&[3, 4], -2.0, 2.0)),
        ("log", |x| x.log(), g.uniform(&[3, 4], 0.2, 3.0)),
        ("sin", |x| x.sin(), g.uniform(&[3, 4], -3.0, 3.0)),
        ("cos", |x| x.cos(), g.uniform(&[3, 4], -3.0, 3.0)),
        ("tanh", |x| x.tanh(), g.uniform(&[3, 4], -2.0, 2.0)),
        ("sqrt", |x| x.sqrt(), g.uniform(&[3, 4], 0.2, 3.0)),
        ("recip", |x| x.recip(), g.signed(&[3, 4], 0.3, 2.0)),
        ("rsqrt", |x| x.rsqrt(), g.uniform(&[3, 4], 0.2, 3.0)),
        ("sigmoid", |x| x.sigmoid(), g.uniform(&[3, 4], -3.0, 3.0)),
        ("relu", |x| x.relu(), g.signed(&[3, 4], 0.1, 2.0)),
        ("square", |x| x.square(), g.uniform(&[3, 4], -2.0, 2.0)),
        ("powf 2.5", |x| x.powf(2.5), g.uniform(&[3, 4], 0.3, 2.0)),
        ("powf -0.5", |x| x.powf(-0.5), g.uniform(&[3, 4], 0.3, 2.0)),
        ("powf 3 (negative base)", |x| x.powf(3.0), g.signed(&[3, 4], 0.3, 2.0)),
        ("clamp", |x| x.clamp(-0.7, 0.9), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.7, 0.9], 0.01)),
        ("clamp_min", |x| x.clamp_min(0.3), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[0.3], 0.01)),
        ("clamp_max", |x| x.clamp_max(-0.2), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.2], 0.01)),
        // Piecewise constant: zero gradients, checked away from the jumps (and times x, so the chain rule is seen).
        ("floor * x", |x| x.floor().mul(x), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-1.0, 0.0, 1.0], 0.01)),
        ("ceil * x", |x| x.ceil().mul(x), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-1.0, 0.0, 1.0], 0.01)),
        ("round * x", |x| x.round().mul(x), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-1.5, -0.5, 0.5, 1.5], 0.01)),
        ("trunc * x", |x| x.trunc().mul(x), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-1.0, 0.0, 1.0], 0.01)),
        ("sign * x", |x| x.sign().mul(x), g.signed(&[3, 4], 0.1, 2.0)),
        ("log1p", |x| x.log1p(), g.uniform(&[3, 4], -0.8, 3.0)),
        ("expm1", |x| x.expm1(), g.uniform(&[3, 4], -2.0, 2.0)),
        ("softplus", |x| F::softplus(x, 1.0, 20.0), g.uniform(&[3, 4], -3.0, 3.0)),
        (
            "softplus beta 2 threshold 1",
            |x| F::softplus(x, 2.0, 1.0),
            g.uniform(&[3, 4], -2.0, 2.0).away_from(&[0.5], 0.01),
        ),
        ("elu", |x| F::elu(x, 0.7), g.signed(&[3, 4], 0.05, 2.0)),
        ("selu", F::selu, g.signed(&[3, 4], 0.05, 2.0)),
        ("celu", |x| F::celu(x, 0.5), g.signed(&[3, 4], 0.05, 2.0)),
        ("mish", F::mish, g.uniform(&[3, 4], -3.0, 3.0)),
        ("gelu", |x| F::gelu(x, F::Approximate::None), g.uniform(&[3, 4], -3.0, 3.0)),
        // Its own rule (the stored derivative).
        ("gelu (tanh)", |x| F::gelu(x, F::Approximate::Tanh), g.uniform(&[3, 4], -3.0, 3.0)),
        ("hardsigmoid", F::hardsigmoid, g.uniform(&[3, 4], -4.0, 4.0).away_from(&[-3.0, 3.0], 0.01)),
        ("hardswish", F::hardswish, g.uniform(&[3, 4], -4.0, 4.0).away_from(&[-3.0, 3.0], 0.01)),
        ("logsigmoid", F::logsigmoid, g.uniform(&[3, 4], -3.0, 3.0).away_from(&[0.0], 0.01)),
        ("glu", |x| F::glu(x, -1), g.uniform(&[4, 4], -2.0, 2.0)),
        ("normalize", |x| F::normalize(x, 2.0, 1, 1e-12), g.signed(&[3, 4], 0.2, 2.0)),
        (
            "cosine_similarity",
            |x| F::cosine_similarity(x, &x.square().add(0.5), 1, 1e-8).unsqueeze(1),
            g.signed(&[3, 4], 0.2, 2.0),
        ),
        (
            "interpolate linear",
            |x| {
                let o = F::InterpolateOptions {
                    size: Some(vec![7]),
                    mode: F::InterpolateMode::Linear,
                    ..Default::default()
                };
                F::interpolate(&x.unsqueeze(0), &o).squeeze(0)
            },
            g.uniform(&[3, 4], -2.0, 2.0),
        ),
        (
            "interpolate nearest",
            |x| {
                F::interpolate(&x.unsqueeze(0), &F::InterpolateOptions { size: Some(vec![6]), ..Default::default() })
                    .squeeze(0)
            },
            g.uniform(&[3, 4], -2.0, 2.0),
        ),
        ("hardtanh", |x| F::hardtanh(x, -0.7, 0.9), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.7, 0.9], 0.01)),
        ("lerp scalar", |x| x.lerp(&x.square(), 0.3), g.uniform(&[3, 4], -2.0, 2.0)),
        ("lerp scalar past 0.5", |x| x.lerp(&x.square(), 0.8), g.uniform(&[3, 4], -2.0, 2.0)),
        ("lerp tensor", |x| x.lerp(&x.square(), x.sigmoid()), g.uniform(&[3, 4], -2.0, 2.0)),
        ("addcmul", |x| x.addcmul(&x.sin(), &x.cos(), 0.5), g.uniform(&[3, 4], -2.0, 2.0)),
        ("addcdiv", |x| x.addcdiv(&x.sin(), &x.square().add(1.0), 2.0), g.uniform(&[3, 4], -2.0, 2.0)),
        ("diagonal", |x| x.diagonal(1, 0, 1).unsqueeze(1), g.uniform(&[3, 4], -2.0, 2.0)),
        ("diag of a vector", |x| x.flatten().diag(-1), g.uniform(&[3, 4], -2.0, 2.0)),
        ("outer", |x| x.flatten().outer(&x.flatten().sin()), g.uniform(&[3, 4], -2.0, 2.0)),
        ("softsign", F::softsign, g.signed(&[3, 4], 0.05, 2.0)),
        ("tanhshrink", F::tanhshrink, g.uniform(&[3, 4], -2.0, 2.0)),
        ("hardshrink", |x| F::hardshrink(x, 0.5), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.5, 0.5], 0.01)),
        ("softshrink", |x| F::softshrink(x, 0.5), g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.5, 0.5], 0.01)),
        ("logit", |x| x.logit(None), g.uniform(&[3, 4], 0.1, 0.9)),
        ("cdist", |x| F::cdist(x, &x.add(0.5).sin(), 2.0), g.uniform(&[3, 4], -2.0, 2.0)),
        ("pairwise_distance", |x| F::pairwise_distance(x, &x.cos(), 2.0, 1e-6, true), g.uniform(&[3, 4], -2.0, 2.0)),
        ("logaddexp", |x| x.logaddexp(&x.sin().mul(2.0)), g.uniform(&[3, 4], -2.0, 2.0)),
        ("nansum", |x| x.nansum(1, true), g.uniform(&[3, 4], -2.0, 2.0)),
        ("repeat_interleave", |x| x.repeat_interleave(2, 1), g.uniform(&[3, 4], -2.0, 2.0)),
        ("movedim", |x| x.movedim(0, 1), g.uniform(&[3, 4], -2.0, 2.0)),
        // The losses per element (reduction none) against a constant target of 0.3, away from their kinks.
        (
            "l1_loss",
            |x| F::l1_loss(x, &x.mul(0.0).add(0.3), Reduction::None),
            g.uniform(&[3, 4], -2.0, 2.0).away_from(&[0.3], 0.01),
        ),
        (
            "smooth_l1_loss",
            |x| F::smooth_l1_loss(x, &x.mul(0.0).add(0.3), Reduction::None, 0.5),
            g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.2, 0.3, 0.8], 0.01),
        ),
        (
            "huber_loss",
            |x| F::huber_loss(x, &x.mul(0.0).add(0.3), Reduction::None, 1.0),
            g.uniform(&[3, 4], -2.0, 2.0).away_from(&[-0.7, 0.3, 1.3], 0.01),
        ),
        (
            "kl_div",
            |x| F::kl_div(&x.log_softmax(1), &x.mul(0.0).add(0.25), F::KlReduction::None, false),
            g.uniform(&[3, 4], -2.0, 2.0),
        ),
        (
            "binary_cross_entropy_with_logits",
            |x| F::binary_cross_entropy_with_logits(x, &x.mul(0.0).add(0.3), Reduction::None),
            g.uniform(&[3, 4], -3.0, 3.0),
        ),
    ];
    for (name, op, x) in ops {
        s.check(name, std::slice::from_ref(&x), |t| op(&t[0]));
        // The same op on a transposed (non-contiguous) view, followed by a reduction.
        s.check(&format!("{name} of a transposed view"), &[x], |t| op(&t[0].t()).sum(1, false));
    }
    s.finish();
}

#[test]
fn clamp_with_tensor_bounds() {
    let mut s = Suite::new("clamp with tensor bounds");
    let mut g = Gen::new("clamp tensor bounds");
    let x = g.uniform(&[3, 4], -2.0, 2.0);
    let lo = g.uniform(&[3, 1], -1.5, -0.3);
    let hi = g.uniform(&[4], 0.3, 1.5);
    assert_apart(&x, &lo, 1e-3);
    assert_apart(&x, &hi, 1e-3);
    s.check("clamp(x, lo, hi)", &[x.clone(), lo, hi.clone()], |t| t[0].clamp(&t[1], &t[2]));
    s.check("clamp_max(x, hi)", &[x, hi], |t| t[0].clamp_max(&t[1]));
    s.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// Elementwise binary
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn binary_ops() {
    let mut s = Suite::new("binary");
    let mut g = Gen::new("binary");
    type B = fn(&Tensor, &Tensor) -> Tensor;
    /// An input domain (lo, hi, signed): "signed" draws magnitudes in [lo, hi) with both signs.
    type D = (f64, f64, bool);
    // (name, op, lhs domain, rhs domain)
    let ops: Vec<(&str, B, D, D)> = vec![
        ("add", |a, b| a.add(b), (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("add operator", |a, b| a + b, (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("sub", |a, b| a.sub(b), (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("sub operator", |a, b| a - b, (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("mul", |a, b| a.mul(b), (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("mul operator", |a, b| a * b, (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("div", |a, b| a.div(b), (-2.0, 2.0, false), (0.4, 2.0, true)),
        ("div operator", |a, b| a / b, (-2.0, 2.0, false), (0.4, 2.0, true)),
        ("maximum", |a, b| a.maximum(b), (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("minimum", |a, b| a.minimum(b), (-2.0, 2.0, false), (-2.0, 2.0, false)),
        ("pow", |a, b| a.pow(b), (0.4, 2.0, false), (-1.5, 1.5, false)),
    ];
    let draw = |g: &mut Gen, shape: &[usize], (lo, hi, signed): D| {
        if signed { g.signed(shape, lo, hi) } else { g.uniform(shape, lo, hi) }
    };
    // Broadcasting on both sides, a 0-dim tensor on either side, equal shapes with a transposed operand.
    let shapes: [(&[usize], &[usize]); 4] =
        [(&[2, 1, 3], &[4, 1]), (&[4, 1], &[2, 1, 3]), (&[2, 3], &[]), (&[], &[2, 3])];
    for &(name, op, da, db) in &ops {
        for (sa, sb) in shapes {
            let (a, b) = (draw(&mut g, sa, da), draw(&mut g, sb, db));
            if name.starts_with("max") || name.starts_with("min") {
                assert_apart(&a, &b, 1e-3);
            }
            s.check(&format!("{name} {sa:?} {sb:?}"), &[a, b], |t| op(&t[0], &t[1]));
        }
        let (a, b) = (draw(&mut g, &[3, 4], da), draw(&mut g, &[4, 3], db));
        if name.starts_with("max") || name.starts_with("min") {
            assert_apart(&a, &b.nd().permute(&[1, 0]).into_in(), 1e-3);
        }
        s.check(&format!("{name} with a transposed rhs"), &[a, b], |t| op(&t[0], &t[1].t()));
    }
    s.finish();
}

trait IntoIn {
    fn into_in(self) -> In;
}

impl IntoIn for Nd {
    fn into_in(self) -> In {
        In { shape: self.shape, vals: self.v, dtype: F64 }
    }
}

#[test]
fn binary_with_scalars() {
    let mut s = Suite::new("binary with scalars");
    let mut g = Gen::new("binary scalars");
    let x = g.uniform(&[2, 3], -2.0, 2.0);
    let nz = g.signed(&[2, 3], 0.4, 2.0);
    let pos = g.uniform(&[2, 3], 0.4, 2.0);
    let one = |x: &In| std::slice::from_ref(x).to_vec();
    s.check("x + 1.5", &one(&x), |t| t[0].add(1.5));
    s.check("1.5 + x", &one(&x), |t| 1.5 + &t[0]);
    s.check("x - 1.5", &one(&x), |t| t[0].sub(1.5));
    s.check("1.5 - x", &one(&x), |t| 1.5 - &t[0]);
    s.check("x * -2.5", &one(&x), |t| t[0].mul(-2.5));
    s.check("-2.5 * x", &one(&x), |t| -2.5 * &t[0]);
    s.check("x / 3", &one(&x), |t| t[0].div(3.0));
    s.check("3 / x", &one(&nz), |t| 3.0 / &t[0]);
    s.check("x * 2 (int scalar)", &one(&x), |t| t[0].mul(2i64));
    s.check("maximum(x, 0.25)", &[x.clone().away_from(&[0.25], 0.01)], |t| t[0].maximum(0.25));
    s.check("minimum(x, 0.25)", &[x.clone().away_from(&[0.25], 0.01)], |t| t[0].minimum(0.25));
    s.check("pow(x, 1.7)", &one(&pos), |t| t[0].pow(1.7));
    s.check("pow(x, 2) (int scalar, both signs)", &one(&nz), |t| t[0].pow(2i64));
    s.finish();
}

#[test]
fn where_both_branches() {
    let mut s = Suite::new("where_");
    let mut g = Gen::new("where");
    let cond_vals = [true, false, false, true, true, false, true, true];
    let cond = || Tensor::from_vec(cond_vals.to_vec(), [2, 1, 4], &dev()).expect("cond");
    let a = g.uniform(&[3, 4], -2.0, 2.0);
    let b = g.uniform(&[2, 1, 1], -2.0, 2.0);
    s.check("where_(cond, a, b) broadcasting", &[a.clone(), b.clone()], |t| cond().where_(&t[0], &t[1]));
    s.check("where_(cond, a, 0.5)", std::slice::from_ref(&a), |t| cond().where_(&t[0], 0.5));
    s.check("where_(cond, 1.0, b)", std::slice::from_ref(&b), |t| cond().where_(1.0, &t[0]));
    s.check("where_(cond, a, a * b) (a on both sides)", &[a.clone(), b], |t| cond().where_(&t[0], t[0].mul(&t[1])));
    // A condition computed from a leaf: no gradient flows into the comparison.
    let x = g.signed(&[3, 4], 0.1, 2.0);
    s.check("where_(x > 0, x.exp(), x.sin())", &[x], |t| t[0].gt(0.0).where_(t[0].exp(), t[0].sin()));
    s.finish();
}

#[test]
fn dtype_round_trips() {
    let mut s = Suite::new("to_dtype");
    let mut g = Gen::new("casts");
    let f32_tol = tol(F32, Kind::Elementwise);
    let x = g.uniform(&[2, 3], -2.0, 2.0);
    // f64 -> f32 -> f64: the gradient crosses both casts and is computed partly in f32; the reference is the same
    // function in f64 (finite differences through f32 rounding would measure the rounding).
    s.check_with(
        "f64 -> f32 -> f64 around sin(2x)",
        std::slice::from_ref(&x),
        &|t| t[0].to_dtype(F32).mul(2.0).sin().to_dtype(F64),
        &|t| t[0].mul(2.0).sin(),
        f32_tol,
    );
    s.check_with(
        "f64 -> f32 -> f64 (identity)",
        std::slice::from_ref(&x),
        &|t| t[0].to_dtype(F32).to_dtype(F64),
        &|t| t[0].clone(),
        f32_tol,
    );
    // An f32 leaf: its gradient comes back as f32.
    s.check_with("f32 leaf -> f64 exp", &[x.clone().f32()], &|t| t[0].to_dtype(F64).exp(), &|t| t[0].exp(), f32_tol);
    // An f32 leaf promoted by a binary op with an f64 leaf.
    let y = g.uniform(&[3], -2.0, 2.0);
    s.check_with(
        "f64 leaf * f32 leaf (promotion)",
        &[x.clone(), y.f32()],
        &|t| t[0].mul(&t[1]),
        &|t| t[0].mul(&t[1]),
        f32_tol,
    );
    // Through an int cast no gradient flows: d/dx (trunc(x) * x) = trunc(x) away from integers.
    let xi = x.away_from(&[-2.0, -1.0, 0.0, 1.0, 2.0], 0.01);
    s.check("trunc(x) * x through an i64 cast", &[xi], |t| t[0].to_dtype(I64).to_dtype(F64).mul(&t[0]));
    s.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn reductions() {
    let mut s = Suite::new("reductions");
    let mut g = Gen::new("reductions");
    let x = g.uniform(&[2, 3, 4], -2.0, 2.0);
    let nz = g.signed(&[2, 3, 4], 0.5, 1.5);
    let dx = g.distinct(&[2, 3, 4]);
    type R = fn(&Tensor, Vec<isize>, bool) -> Tensor;
    type A = fn(&Tensor) -> Tensor;
    let ops: Vec<(&str, R, A, &In)> = vec![
        ("sum", |t, d, k| t.sum(d, k), |t| t.sum_all(), &x),
        ("mean", |t, d, k| t.mean(d, k), |t| t.mean_all(), &x),
        ("prod", |t, d, k| t.prod(d, k), |t| t.prod_all(), &nz),
        ("max", |t, d, k| t.max(d, k), |t| t.max_all(), &dx),
        ("min", |t, d, k| t.min(d, k), |t| t.min_all(), &dx),
        ("logsumexp", |t, d, k| t.logsumexp(d, k), |t| t.logsumexp(Vec::<isize>::new(), false), &x),
        ("var", |t, d, k| t.var(d, 1.0, k), |t| t.var(Vec::<isize>::new(), 0.0, false), &x),
        ("std", |t, d, k| t.std(d, 1.0, k), |t| t.std(Vec::<isize>::new(), 1.0, false), &x),
        ("norm 2", |t, d, k| t.norm(2.0, d, k), |t| t.norm(2.0, Vec::<isize>::new(), false), &x),
        ("norm 3", |t, d, k| t.norm(3.0, d, k), |t| t.norm(3.0, Vec::<isize>::new(), false), &nz),
    ];
    let dim_sets: [Vec<isize>; 5] = [vec![1], vec![-1], vec![0, 2], vec![0, 1, 2], vec![]];
    for (name, op, all, input) in ops {
        for dims in &dim_sets {
            for keepdim in [false, true] {
                s.check(&format!("{name}({dims:?}, keepdim={keepdim})"), std::slice::from_ref(input), |t| {
                    op(&t[0], dims.clone(), keepdim)
                });
            }
        }
        s.check(&format!("{name}_all"), std::slice::from_ref(input), |t| all(&t[0]));
        // Over a permuted view, and composed with elementwise work after the reduction.
        s.check(&format!("{name} of a permuted view"), std::slice::from_ref(input), |t| {
            op(&t[0].permute([2, 0, 1]), vec![1], false).exp()
        });
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// Movement
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn movement_ops() {
    let mut s = Suite::new("movement");
    let mut g = Gen::new("movement");
    let x = g.uniform(&[2, 3, 4], -2.0, 2.0);
    let m = g.uniform(&[4, 6], -2.0, 2.0);
    let c = g.uniform(&[3, 1], -2.0, 2.0);
    let one = |x: &In| std::slice::from_ref(x).to_vec();
    // A position-dependent factor after the op so a gradient routed to the wrong element shows.
    s.check("reshape", &one(&x), |t| t[0].reshape([6, 4]).sin());
    s.check("reshape -1", &one(&x), |t| t[0].reshape([-1, 2]).sin());
    s.check("view", &one(&x), |t| t[0].view([4, 6]).sin());
    s.check("flatten", &one(&x), |t| t[0].flatten().sin());
    s.check("permute", &one(&x), |t| t[0].permute([2, 0, 1]).sin());
    s.check("permute negative dims", &one(&x), |t| t[0].permute([-1, -3, -2]).sin());
    s.check("transpose(0, 2)", &one(&x), |t| t[0].transpose(0, 2).sin());
    s.check("transpose(-1, -2)", &one(&x), |t| t[0].transpose(-1, -2).sin());
    s.check("t", &one(&m), |t| t[0].t().sin());
    s.check("expand", &one(&c), |t| t[0].expand([2, 3, 4]).sin());
    s.check("expand -1", &one(&c), |t| t[0].expand([2, -1, 4]));
    s.check("broadcast_to", &one(&c), |t| t[0].broadcast_to([4, 3, 2]));
    s.check("unsqueeze", &one(&x), |t| t[0].unsqueeze(1).sin());
    s.check("unsqueeze -1", &one(&x), |t| t[0].unsqueeze(-1).expand([2, 3, 4, 2]));
    s.check("squeeze", &one(&c), |t| t[0].squeeze(1).sin());
    s.check("squeeze_all", &one(&c), |t| t[0].unsqueeze(0).squeeze_all().sin());
    s.check("narrow", &one(&x), |t| t[0].narrow(1, 1, 2).sin());
    s.check("narrow last dim", &one(&x), |t| t[0].narrow(-1, 2, 2).sin());
    for (dim, start, end, step) in [
        (1, 1, 5, 1),
        (1, 0, 6, 2),
        (1, 1, 6, 2),
        (1, 0, 6, 3),
        (1, 1, 6, 3),
        (1, 2, 100, 3),
        (0, -3, 4, 2),
        (0, 0, 4, 3),
        (-1, -5, -1, 1),
    ] {
        s.check(&format!("slice({dim}, {start}, {end}, {step})"), &one(&m), |t| {
            t[0].slice(dim, start, end, step).sin()
        });
    }
    s.check("slice on both dims", &one(&m), |t| t[0].slice(0, 1, 4, 2).slice(1, 0, 6, 3).sin());
    s.check("slice of a transposed view", &one(&m), |t| t[0].t().slice(0, 1, 6, 2).sin());
    s.check("flip 0", &one(&m), |t| t[0].flip(0).sin());
    s.check("flip [0, 1]", &one(&m), |t| t[0].flip([0, 1]).sin());
    s.check("flip -1 then slice step 2", &one(&m), |t| t[0].flip(-1).slice(1, 1, 6, 2).sin());
    s.check("pad last dim", &one(&m), |t| t[0].pad(&[(1, 2)], 0.0).sin());
    s.check("pad two dims, value 1.5", &one(&m), |t| t[0].pad(&[(1, 0), (0, 2)], 1.5).sin());
    s.check("contiguous of a permuted view", &one(&x), |t| t[0].permute([1, 2, 0]).contiguous().sin());
    s.check("tril", &one(&x), |t| t[0].tril(0).sin());
    s.check("triu -1", &one(&m), |t| t[0].triu(-1).sin());
    s.check("roll", &one(&x), |t| t[0].roll(&[1, -2], &[0, 2]).sin());
    s.check("roll flat", &one(&m), |t| t[0].roll(&[5], &[]).sin());
    s.check("repeat", &one(&c), |t| t[0].repeat(&[2, 1, 3]).sin());
    s.check("tile", &one(&m), |t| t[0].tile(&[2]).sin());
    s.check("chunk", &one(&x), |t| t[0].chunk(2, 2)[1].sin());
    s.check("split_sizes", &one(&m), |t| t[0].split_sizes(&[1, 3], 0)[1].sin());
    for mode in [kiln::PadMode::Reflect, kiln::PadMode::Replicate, kiln::PadMode::Circular] {
        s.check(&format!("pad_with {mode:?}"), &one(&m), move |t| t[0].pad_with(&[(2, 1), (1, 3)], mode).sin());
    }
    s.finish();
}

/// Reads and accumulations by data: gradients flow to the source (never to the indices), repeated indices add up.
#[test]
fn indexing_ops() {
    let mut s = Suite::new("indexing");
    let mut g = Gen::new("indexing");
    let m = g.uniform(&[4, 6], -2.0, 2.0);
    let small = g.uniform(&[3, 2], -2.0, 2.0);
    let one = |x: &In| std::slice::from_ref(x).to_vec();
    // i32 indices: they live on every device (wgpu has no i64).
    let ix = |t: &Tensor, v: &[i32], shape: &[usize]| {
        Tensor::from_vec(v.to_vec(), shape.to_vec(), &t.device()).expect("indices")
    };
    s.check("gather dim 1", &one(&m), move |t| t[0].gather(1, &ix(&t[0], &[5, 0, 5, 1, 2, 2, 3, 4], &[4, 2])).sin());
    s.check("gather dim 0, narrowed", &one(&m), move |t| {
        t[0].gather(0, &ix(&t[0], &[3, 3, 0, 1, 2, 0], &[2, 3])).sin()
    });
    s.check("index_select", &one(&m), move |t| t[0].index_select(1, &ix(&t[0], &[4, 4, 0], &[3])).sin());
    s.check("take_along_dim", &one(&m), move |t| t[0].take_along_dim(&ix(&t[0], &[1, 3], &[2, 1]), Some(0)).sin());
    s.check("embedding", &one(&m), move |t| {
        kiln::nn::functional::embedding(&ix(&t[0], &[2, 0, 2, 3, 1, 2], &[2, 3]), &t[0]).sin()
    });
    s.check("masked_fill", &one(&m), move |t| {
        let mask = ix(&t[0], &[1, 0, 0, 1, 0, 1], &[6]).to_dtype(DType::Bool);
        t[0].masked_fill(&mask, 0.5).sin()
    });
    s.check("scatter_add", &[m.clone(), small.clone()], move |t| {
        t[0].scatter_add(1, &ix(&t[0], &[5, 5, 0, 1, 2, 0], &[3, 2]), &t[1]).sin()
    });
    // Operands away from the jumps (quotients near integers).
    let (num, den) = (g.uniform(&[2, 3], 2.2, 2.8), g.uniform(&[2, 3], 0.9, 1.0));
    s.check("fmod", &[num.clone(), den.clone()], |t| t[0].fmod(&t[1]).sin());
    s.check("remainder", &[num, den], |t| t[0].neg().remainder(&t[1]).sin());
    s.check("cumsum", &one(&m), |t| t[0].cumsum(1).sin());
    s.check("cumprod (no zeros)", &one(&g.uniform(&[3, 5], 0.5, 1.5)), |t| t[0].cumprod(1).sin());
    s.check("sort values", &one(&g.distinct(&[4, 6])), |t| t[0].sort(1, false).0.sin());
    s.check("topk values", &one(&g.distinct(&[4, 6])), |t| t[0].topk(3, 0, true).0.sin());
    s.check("index_add", &[m.clone(), small.clone()], move |t| {
        let src = t[1].repeat(&[1, 3]);
        t[0].index_add(0, &ix(&t[0], &[3, 3, 0], &[3]), &src, 1.5).sin()
    });
    s.finish();
}

/// `MultiheadAttention` (through its input) and rotary embeddings.
#[test]
fn attention_layers() {
    let mut s = Suite::new("attention layers");
    let mut g = Gen::new("attention layers");
    let x = g.uniform(&[3, 2, 4], -1.0, 1.0);
    let r = g.uniform(&[2, 5, 6], -1.0, 1.0);
    let one = |x: &In| std::slice::from_ref(x).to_vec();
    s.check("multihead attention", &one(&x), |t| {
        let dev = t[0].device();
        let w =
            Tensor::from_vec((0..48).map(|i| ((i * 7 % 11) as f64 - 5.0) / 10.0).collect::<Vec<_>>(), [12, 4], &dev)
                .expect("weights")
                .to_dtype(t[0].dtype());
        let out = kiln::nn::Linear::from_weight(w.narrow(0, 0, 4), None);
        let mha = kiln::nn::MultiheadAttention::from_params(2, w, None, out);
        let causal = kiln::nn::MhaOptions { is_causal: true, need_weights: false, ..Default::default() };
        mha.attend(&t[0], &t[0], &t[0], &causal).0.sin()
    });
    s.check("rotary embedding", &one(&r), |t| kiln::nn::RotaryEmbedding::new(6).apply(&t[0], 3).sin());
    s.finish();
}

#[test]
fn cat_and_stack() {
    let mut s = Suite::new("cat and stack");
    let mut g = Gen::new("cat");
    let a = g.uniform(&[2, 3], -2.0, 2.0);
    let b = g.uniform(&[1, 3], -2.0, 2.0);
    let c = g.uniform(&[3, 3], -2.0, 2.0);
    let d = g.uniform(&[2, 4], -2.0, 2.0);
    let abc = [a.clone(), b.clone(), c.clone()];
    s.check("cat dim 0", &abc, |t| Tensor::cat(&[&t[0], &t[1], &t[2]], 0).sin());
    s.check("cat dim -1", &[a.clone(), d.clone()], |t| Tensor::cat(&[&t[0], &t[1]], -1).sin());
    s.check("cat of a transposed view", &[a.clone(), c.clone()], |t| Tensor::cat(&[&t[0].t(), &t[1]], 1).sin());
    s.check("cat of one tensor twice", std::slice::from_ref(&a), |t| Tensor::cat(&[&t[0], &t[0]], 0).sin());
    let e = g.uniform(&[2, 3], -2.0, 2.0);
    for dim in [0, 1, 2, -1] {
        s.check(&format!("stack dim {dim}"), &[a.clone(), e.clone()], |t| Tensor::stack(&[&t[0], &t[1]], dim).sin());
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// Linear algebra and softmax
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn matmul_cases() {
    let mut s = Suite::new("matmul");
    let mut g = Gen::new("matmul");
    let cases: [(&[usize], &[usize]); 13] = [
        (&[3, 4], &[4, 2]),
        // K = 1: recorded as a broadcast product, so its gradients come from `mul`'s rules.
        (&[3, 1], &[1, 4]),
        (&[2, 3, 1], &[1, 1, 4]),
        (&[1], &[1, 3]),
        (&[2, 3, 4], &[2, 4, 2]),
        (&[2, 1, 3, 2], &[3, 2, 2]),
        (&[3, 2], &[2, 2, 2, 3]),
        (&[4], &[4]),
        (&[3], &[3, 4]),
        (&[3, 4], &[4]),
        (&[3], &[2, 3, 2]),
        (&[2, 2, 3], &[3]),
        (&[1, 4], &[4, 1]),
    ];
    for (sa, sb) in cases {
        let (a, b) = (g.uniform(sa, -2.0, 2.0), g.uniform(sb, -2.0, 2.0));
        s.check(&format!("matmul {sa:?} x {sb:?}"), &[a, b], |t| t[0].matmul(&t[1]));
    }
    let (a, b) = (g.uniform(&[4, 3], -2.0, 2.0), g.uniform(&[2, 4], -2.0, 2.0));
    s.check("matmul of transposed views", &[a, b], |t| t[0].t().matmul(&t[1].t()));
    let a = g.uniform(&[3, 3], -2.0, 2.0);
    s.check("x @ x.t()", &[a], |t| t[0].matmul(&t[0].t()));
    s.finish();
}

/// Well-conditioned `[.., n, n]` matrices (`3 I` plus noise in [-0.5, 0.5)), rows reversed when `pivoting` so the
/// LU swaps rows.
fn well_conditioned(g: &mut Gen, shape: &[usize], pivoting: bool) -> In {
    let n = shape[shape.len() - 1];
    let mut m = g.uniform(shape, -0.5, 0.5);
    let mats = m.vals.len() / (n * n);
    let mut vals = m.vals.clone();
    for b in 0..mats {
        for i in 0..n {
            for j in 0..n {
                let row = if pivoting { n - 1 - i } else { i };
                vals[(b * n + row) * n + j] = m.vals[(b * n + i) * n + j] + if i == j { 3.0 } else { 0.0 };
            }
        }
    }
    m.vals = vals;
    m
}

#[test]
fn linear_algebra() {
    use kiln::linalg;
    let mut s = Suite::new("linalg");
    let mut g = Gen::new("linalg");
    let a = well_conditioned(&mut g, &[2, 3, 3], true);
    let b = g.uniform(&[2, 3, 2], -1.0, 1.0);
    s.check("solve", &[a.clone(), b.clone()], |t| linalg::solve(&t[0], &t[1]));
    s.check("solve of a vector", &[a.clone(), g.uniform(&[3], -1.0, 1.0)], |t| linalg::solve(&t[0], &t[1]));
    s.check("inv", std::slice::from_ref(&a), |t| linalg::inv(&t[0]));
    s.check("det", std::slice::from_ref(&a), |t| linalg::det(&t[0]));
    s.check("slogdet", std::slice::from_ref(&a), |t| linalg::slogdet(&t[0]).1);
    s.check("lu_factor", std::slice::from_ref(&a), |t| linalg::lu_factor(&t[0]).0);
    // Through its symmetric part (a perturbation of one element moves both of its mirror images), as PyTorch's
    // gradient assumes.
    let spd = well_conditioned(&mut g, &[2, 3, 3], false);
    s.check("cholesky", &[spd], |t| linalg::cholesky(&t[0].add(t[0].transpose(-1, -2)).mul(0.5)));
    for upper in [false, true] {
        for left in [false, true] {
            for unit in [false, true] {
                let rhs = if left { b.clone() } else { g.uniform(&[2, 2, 3], -1.0, 1.0) };
                s.check(&format!("solve_triangular upper {upper} left {left} unit {unit}"), &[a.clone(), rhs], |t| {
                    linalg::solve_triangular(&t[0], &t[1], upper, left, unit)
                });
            }
        }
    }
    s.finish();
}

#[test]
fn softmax_family() {
    let mut s = Suite::new("softmax");
    let mut g = Gen::new("softmax");
    let x = g.uniform(&[3, 4], -2.0, 2.0);
    let y = g.uniform(&[2, 3, 4], -2.0, 2.0);
    for dim in [-1, 0] {
        s.check(&format!("softmax {dim}"), std::slice::from_ref(&x), |t| t[0].softmax(dim));
        s.check(&format!("log_softmax {dim}"), std::slice::from_ref(&x), |t| t[0].log_softmax(dim));
    }
    s.check("softmax 1 of 3-D", std::slice::from_ref(&y), |t| t[0].softmax(1));
    s.check("log_softmax 1 of 3-D", std::slice::from_ref(&y), |t| t[0].log_softmax(1));
    s.check("softmax of a transposed view", std::slice::from_ref(&x), |t| t[0].t().softmax(-1));
    s.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// Compositions
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn compositions() {
    let mut s = Suite::new("compositions");
    let mut g = Gen::new("compositions");
    let x = g.uniform(&[4, 3], -2.0, 2.0);
    let w = g.uniform(&[3, 2], -1.0, 1.0);
    let b = g.uniform(&[2], -1.0, 1.0);
    s.check("mlp: softmax(tanh(x @ w + b))", &[x.clone(), w.clone(), b.clone()], |t| {
        (t[0].matmul(&t[1]) + &t[2]).tanh().softmax(-1)
    });
    let (q, k, v) =
        (g.uniform(&[2, 3, 4], -1.0, 1.0), g.uniform(&[2, 5, 4], -1.0, 1.0), g.uniform(&[2, 5, 3], -1.0, 1.0));
    s.check("scaled_dot_product_attention, causal", &[q.clone(), k.clone(), v.clone()], |t| {
        let o = F::AttentionOptions { is_causal: true, ..Default::default() };
        F::scaled_dot_product_attention(&t[0], &t[1], &t[2], &o)
    });
    s.check("scaled_dot_product_attention, float mask", &[q, k, v, g.uniform(&[3, 5], -1.0, 1.0)], |t| {
        let o = F::AttentionOptions { mask: Some(t[3].clone()), scale: Some(0.7), ..Default::default() };
        F::scaled_dot_product_attention(&t[0], &t[1], &t[2], &o)
    });
    let (x4, w3, w4, b4) = (
        g.uniform(&[2, 4, 3], -2.0, 2.0),
        g.uniform(&[3], 0.5, 1.5),
        g.uniform(&[4], 0.5, 1.5),
        g.uniform(&[4], -1.0, 1.0),
    );
    s.check("rms_norm with weight", &[x4.clone(), w3.clone()], |t| F::rms_norm(&t[0], &[3], Some(&t[1]), Some(1e-6)));
    // layer_norm has PyTorch's rule of its own (not its parts'): each combination of weight and bias, one and two
    // normalized dims, and an input with no leading dims (the weight's gradient sums over none).
    let b3 = g.uniform(&[3], -1.0, 1.0);
    s.check("layer_norm, weight and bias", &[x4.clone(), w3.clone(), b3.clone()], |t| {
        F::layer_norm(&t[0], &[3], Some(&t[1]), Some(&t[2]), 1e-5)
    });
    s.check("layer_norm, weight only", &[x4.clone(), w3.clone()], |t| {
        F::layer_norm(&t[0], &[3], Some(&t[1]), None, 1e-5)
    });
    s.check("layer_norm, bias only", &[x4.clone(), b3.clone()], |t| {
        F::layer_norm(&t[0], &[3], None, Some(&t[1]), 1e-5)
    });
    s.check("layer_norm, no affine", std::slice::from_ref(&x4), |t| F::layer_norm(&t[0], &[3], None, None, 1e-5));
    let w43 = g.uniform(&[4, 3], 0.5, 1.5);
    s.check("layer_norm over two dims", &[x4.clone(), w43.clone(), g.uniform(&[4, 3], -1.0, 1.0)], |t| {
        F::layer_norm(&t[0], &[4, 3], Some(&t[1]), Some(&t[2]), 1e-3)
    });
    s.check("layer_norm, no leading dims", &[g.uniform(&[4, 3], -2.0, 2.0), w43], |t| {
        F::layer_norm(&t[0], &[4, 3], Some(&t[1]), None, 1e-5)
    });
    s.check("group_norm, 2 groups, affine", &[x4, w4, b4], |t| F::group_norm(&t[0], 2, Some(&t[1]), Some(&t[2]), 1e-5));
    let (img, kern, kb) =
        (g.uniform(&[1, 4, 5, 6], -1.0, 1.0), g.uniform(&[6, 2, 3, 2], -1.0, 1.0), g.uniform(&[6], -1.0, 1.0));
    s.check("conv2d, strided, dilated, 2 groups, bias", &[img.clone(), kern, kb], |t| {
        let o = F::Conv2dOptions { stride: [2, 1], padding: [1, 0], dilation: [1, 2], groups: 2 };
        F::conv2d(&t[0], &t[1], Some(&t[2]), &o)
    });
    // At stride 1 the input's gradient is a transposed convolution (conv2d's own rule): grouped, dilated, a padding
    // past the dilated window (the transposed convolution crops) and one short of it (it pads).
    s.check(
        "conv2d, stride 1, dilated, 2 groups, bias",
        &[g.uniform(&[2, 4, 6, 5], -1.0, 1.0), g.uniform(&[6, 2, 3, 2], -1.0, 1.0), g.uniform(&[6], -1.0, 1.0)],
        |t| {
            let o = F::Conv2dOptions { stride: [1, 1], padding: [2, 1], dilation: [2, 1], groups: 2 };
            F::conv2d(&t[0], &t[1], Some(&t[2]), &o)
        },
    );
    s.check(
        "conv2d, stride 1, padding past the window",
        &[g.uniform(&[1, 3, 4, 5], -1.0, 1.0), g.uniform(&[2, 3, 2, 3], -1.0, 1.0)],
        |t| {
            let o = F::Conv2dOptions { stride: [1, 1], padding: [2, 0], dilation: [1, 1], groups: 1 };
            F::conv2d(&t[0], &t[1], None, &o)
        },
    );
    s.check(
        "conv_transpose2d, strided, dilated, 2 groups",
        &[g.uniform(&[1, 4, 3, 2], -1.0, 1.0), g.uniform(&[4, 3, 2, 2], -1.0, 1.0)],
        |t| {
            let o = F::ConvTranspose2dOptions {
                stride: [2, 3],
                padding: [1, 0],
                output_padding: [1, 1],
                dilation: [1, 2],
                groups: 2,
            };
            F::conv_transpose2d(&t[0], &t[1], None, &o)
        },
    );
    s.check(
        "conv2d, strided both ways, dilated, 3x3 taps",
        &[g.uniform(&[1, 2, 7, 6], -1.0, 1.0), g.uniform(&[3, 2, 3, 3], -1.0, 1.0)],
        |t| {
            let o = F::Conv2dOptions { stride: [2, 2], padding: [1, 2], dilation: [2, 1], groups: 1 };
            F::conv2d(&t[0], &t[1], None, &o)
        },
    );
    // Overlapping windows (each element read up to twice), then windows with gaps (some never read).
    s.check("unfold, overlapping", &[g.uniform(&[2, 7, 3], -1.0, 1.0)], |t| t[0].unfold(1, 3, 2));
    s.check("unfold, gapped, of a permuted view", &[g.uniform(&[2, 8, 3], -1.0, 1.0)], |t| {
        t[0].transpose(1, 2).unfold(-1, 2, 3)
    });
    s.check(
        "einsum, bilinear",
        &[g.uniform(&[2, 3], -1.0, 1.0), g.uniform(&[4, 3, 2], -1.0, 1.0), g.uniform(&[2, 2], -1.0, 1.0)],
        |t| Tensor::einsum("bn,anm,bm->ba", &[&t[0], &t[1], &t[2]]),
    );
    s.check(
        "einsum, a trace and a diagonal beside a product",
        &[g.uniform(&[3, 3, 2], -1.0, 1.0), g.uniform(&[2, 4], -1.0, 1.0)],
        |t| Tensor::einsum("iij,jk->ik", &[&t[0], &t[1]]).add(Tensor::einsum("iij", &[&t[0]]).sum_all()),
    );
    s.check(
        "einsum, broadcast ellipsis",
        &[g.uniform(&[2, 1, 2, 3], -1.0, 1.0), g.uniform(&[3, 3, 2], -1.0, 1.0)],
        |t| Tensor::einsum("...ij,...jk->...ik", &[&t[0], &t[1]]),
    );
    s.check("conv1d, padded", &[g.uniform(&[2, 3, 7], -1.0, 1.0), g.uniform(&[4, 3, 3], -1.0, 1.0)], |t| {
        F::conv1d(&t[0], &t[1], None, 2, 1, 1, 1)
    });
    let pool = F::Pool2dOptions { stride: Some([2, 2]), padding: [1, 1], ..F::Pool2dOptions::new([2, 3]) };
    s.check("max_pool2d", &[g.distinct(&[1, 2, 5, 6])], move |t| F::max_pool2d(&t[0], &pool));
    s.check("max_pool2d, tiled", &[g.distinct(&[1, 2, 5, 6])], |t| {
        F::max_pool2d(&t[0], &F::Pool2dOptions::new([2, 2]))
    });
    s.check("avg_pool2d without the padding", std::slice::from_ref(&img), move |t| F::avg_pool2d(&t[0], &pool, false));
    let dilated = F::Pool2dOptions { dilation: [2, 1], ceil_mode: true, ..pool };
    s.check("max_pool2d, dilated, ceil mode", &[g.distinct(&[1, 2, 5, 6])], move |t| F::max_pool2d(&t[0], &dilated));
    let ceil = F::Pool2dOptions { ceil_mode: true, ..F::Pool2dOptions::new([3, 3]) };
    s.check("avg_pool2d, ceil mode", std::slice::from_ref(&img), move |t| F::avg_pool2d(&t[0], &ceil, true));
    s.check("adaptive_max_pool2d, overlapping windows", &[g.distinct(&[1, 2, 5, 6])], |t| {
        F::adaptive_max_pool2d(&t[0], [3, 4])
    });
    s.check("adaptive_avg_pool2d", &[img], |t| F::adaptive_avg_pool2d(&t[0], [2, 4]));
    let pool1 = F::Pool1dOptions { stride: Some(2), padding: 1, ..F::Pool1dOptions::new(3) };
    s.check("max_pool1d", &[g.distinct(&[2, 3, 7])], move |t| F::max_pool1d(&t[0], &pool1));
    let seq = g.uniform(&[2, 3, 7], -1.0, 1.0);
    s.check("avg_pool1d without the padding", std::slice::from_ref(&seq), move |t| F::avg_pool1d(&t[0], &pool1, false));
    s.check("adaptive_avg_pool1d", &[seq], |t| F::adaptive_avg_pool1d(&t[0], 3));
    let labels = || Tensor::from_vec(vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0], [4, 2], &dev()).expect("labels");
    s.check("cross-entropy: -mean(labels * log_softmax(relu(x @ w) + b))", &[x.clone(), w, b], |t| {
        labels().mul((t[0].matmul(&t[1]).relu() + &t[2]).log_softmax(-1)).sum(-1, false).mean_all().neg()
    });
    let v = g.uniform(&[2, 3, 4], -2.0, 2.0);
    let gamma = g.uniform(&[4], 0.5, 1.5);
    s.check("layer norm over the last dim", &[v.clone(), gamma], |t| {
        let mu = t[0].mean(-1, true);
        let centered = t[0].sub(&mu);
        let var = centered.square().mean(-1, true);
        centered.mul((var + 1e-5).rsqrt()).mul(&t[1])
    });
    s.check("x * sin(x) + exp(x) (x used three times)", std::slice::from_ref(&x), |t| {
        t[0].mul(t[0].sin()).add(t[0].exp())
    });
    s.check("x * x.t() (x used twice, once transposed)", &[g.uniform(&[3, 3], -2.0, 2.0)], |t| t[0].mul(t[0].t()));
    s.check("diamond: a = exp(x); a * sin(a)", std::slice::from_ref(&x), |t| {
        let a = t[0].mul(0.5).exp();
        a.mul(a.sin())
    });
    s.check("slice, flip, pad, exp of a transposed view", std::slice::from_ref(&v), |t| {
        t[0].transpose(0, 2).slice(0, 0, 4, 3).flip(1).pad(&[(1, 1)], 0.0).exp()
    });
    s.check("expand, permute, reduce, mul", &[g.uniform(&[3, 1], -2.0, 2.0), g.uniform(&[4, 3], -2.0, 2.0)], |t| {
        t[0].expand([3, 4]).t().mul(&t[1]).sum(0, true).sigmoid()
    });
    s.check("cat of slices, then matmul", &[g.uniform(&[4, 4], -2.0, 2.0), g.uniform(&[4, 2], -2.0, 2.0)], |t| {
        let top = t[0].slice(0, 0, 4, 2);
        let bottom = t[0].slice(0, 1, 4, 2).flip(1);
        Tensor::cat(&[&top, &bottom], 0).matmul(&t[1]).tanh()
    });
    s.check(
        "pow, div, max, stack",
        &[g.uniform(&[2, 3], 0.5, 2.0), g.uniform(&[3], -1.0, 1.0), g.signed(&[2, 1], 0.5, 1.5)],
        |t| {
            let p = t[0].pow(&t[1]).div(&t[2]);
            Tensor::stack(&[&p, &p.max(1, true).expand([2, 3])], 0).log_softmax(0)
        },
    );
    s.check("sigmoid(x) * log(y) + where", &[g.uniform(&[2, 3], -2.0, 2.0), g.uniform(&[3], 0.3, 2.0)], |t| {
        let p = t[0].sigmoid().mul(t[1].log());
        p.gt(0.0).where_(p.clone(), p.square())
    });
    s.finish();
}

#[test]
fn non_differentiable_ops_pass_no_gradient() {
    let mut s = Suite::new("non-differentiable ops");
    let mut g = Gen::new("non-differentiable");
    // Step functions: their finite differences are 0 away from the steps, so only the smooth paths contribute.
    let x = g.distinct(&[3, 4]).away_from(&[-1.0, 0.3], 0.01);
    let y = g.uniform(&[4], -2.0, 2.0);
    assert_apart(&x, &y, 1e-3);
    s.check("comparisons, logical ops, argmax/argmin and int casts", &[x, y], |t| {
        let (x, y) = (&t[0], &t[1]);
        let mask = x.lt(y).logical_and(x.gt(-1.0)).logical_or(x.ge(0.3).logical_not()).to_dtype(F64);
        let idx = x.argmax(1, true).add(x.argmin(0, false)).add(x.argmax_all()).to_dtype(F64);
        mask.mul(y).add(x.ge(0.3).to_dtype(F64).mul(x)).add(idx).add(x.eq(y).to_dtype(F64)).add(x.ne(0.3).to_dtype(F64))
    });
    // Constants made from a leaf carry no gradient.
    let z = g.uniform(&[2, 3], -2.0, 2.0);
    s.check("ones_like(x) * x + full_like(x, 2) + zeros_like(x)", &[z], |t| {
        t[0].ones_like().mul(&t[0]).add(t[0].full_like(2.0)).add(t[0].zeros_like())
    });
    s.finish();
}

#[test]
fn zero_dim_and_empty() {
    let mut s = Suite::new("zero-dim and empty");
    let mut g = Gen::new("zero-dim");
    let x = g.uniform(&[], 0.5, 2.0);
    let v = g.uniform(&[3], -2.0, 2.0);
    let one = |x: &In| std::slice::from_ref(x).to_vec();
    s.check("exp of a zero-dim tensor", &one(&x), |t| t[0].exp().log().sqrt());
    s.check("sum(0) / mean_all / max_all / prod(-1) of a zero-dim tensor", &one(&x), |t| {
        t[0].sum(0, false).add(t[0].mean_all()).mul(t[0].max_all()).mul(t[0].prod(-1, true))
    });
    s.check("unsqueeze and expand a zero-dim tensor", &[x.clone(), v.clone()], |t| {
        t[0].unsqueeze(0).expand([2, 3]).mul(&t[1]).softmax(0)
    });
    s.check("a zero-dim tensor times a vector, summed", &[x, v.clone()], |t| t[1].mul(&t[0]).sum_all());
    s.check("reductions over a dim of size 1", &[g.distinct(&[3, 1, 2])], |t| {
        t[0].max(1, false).add(t[0].min(1, true).squeeze(1)).add(t[0].prod(1, false)).add(t[0].mean(1, false))
    });
    s.check("cat with an empty slice", &[g.uniform(&[2, 3], -2.0, 2.0), v], |t| {
        let empty = t[0].slice(1, 1, 1, 1);
        Tensor::cat(&[&empty, &t[1].unsqueeze(0).expand([2, 3]), &t[0].narrow(1, 1, 2)], 1).sin()
    });
    s.finish();
}

/// At a zero vector the 2-norm's gradient is 0, as PyTorch's, not the 0 * inf = NaN of `sqrt` at 0; the
/// log-sum-exp's gradient is the softmax (its shift by the maximum carries none).
#[test]
fn norm_at_zero_and_logsumexp_have_their_defined_gradients() {
    let _guard = shared();
    let x = t64(&[0.0, 0.0, 0.0, 3.0, 4.0, 0.0], &[2, 3]).requires_grad();
    let g = x.norm(2.0, 1, false).sum_all().backward().unwrap();
    let got = vals(g.get(&x).unwrap());
    assert_eq!(got[..3], [0.0, 0.0, 0.0], "the zero row");
    assert!((got[3] - 0.6).abs() < 1e-15 && (got[4] - 0.8).abs() < 1e-15 && got[5] == 0.0, "{got:?}");
    let y = t64(&[1.0, 2.0, 3.0], &[3]).requires_grad();
    let g = y.logsumexp(0, false).backward().unwrap();
    let want: Vec<f64> = [1f64, 2.0, 3.0].iter().map(|v| v.exp() / (1f64.exp() + 2f64.exp() + 3f64.exp())).collect();
    for (a, b) in vals(g.get(&y).unwrap()).iter().zip(&want) {
        assert!((a - b).abs() < 1e-15, "logsumexp gradient {a} vs softmax {b}");
    }
}

/// Where the composed formula divides by 0 or multiplies 0 by inf, the gradient is PyTorch's (values printed by
/// PyTorch 2.15): `prod` and `cumprod` over zeros get the product of the others (0 where a reduction holds two
/// zeros), `std` of a constant 0, `erfc` at 0 its slope -2/√π, sigmoid in its f32 tails 0, `pow` at a zero base
/// PyTorch's masked values, `logit` at 0 and 1 +inf.
#[test]
fn gradients_at_zeros_and_tails_are_pytorchs() {
    let _guard = shared();
    let grad = |x: &Tensor, y: Tensor| vals(&y.sum_all().backward().unwrap().get(x).unwrap().to_dtype(F64));
    let x = t64(&[2.0, 0.0, 3.0, 5.0, 2.0, 0.0, 3.0, 0.0], &[2, 4]).requires_grad();
    assert_eq!(grad(&x, x.prod(1, false)), [0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], "prod");
    assert_eq!(grad(&x, x.cumprod(1)), [1.0, 38.0, 0.0, 0.0, 1.0, 8.0, 0.0, 0.0], "cumprod");
    let c = t64(&[2.0, 2.0, 2.0], &[1, 3]).requires_grad();
    assert_eq!(grad(&c, c.std(1, 1.0, false)), [0.0, 0.0, 0.0], "std of a constant");
    let z = t64(&[0.0], &[1]).requires_grad();
    let slope = grad(&z, F::erfc(&z))[0];
    // erfc is Numerical Recipes' approximation (1.2e-7 relative in value); its slope at 0 is within 1e-5.
    assert!((slope + 2.0 / std::f64::consts::PI.sqrt()).abs() < 1e-5, "erfc'(0) = {slope}");
    let tails = Tensor::from_vec(vec![-100.0f32, -89.0, -80.0, 0.0, 80.0, 100.0], [6], &dev()).unwrap().requires_grad();
    let want = [0.0, 0.0, 1.8048513285848406e-35, 0.25, 0.0, 0.0];
    assert_eq!(grad(&tails, tails.sigmoid()), want, "sigmoid in f32");
    // pow at a zero base: none to the base where the exponent is 0, none to the exponent where it is not negative.
    let (a, b) = (t64(&[0.0, 0.0, 0.0, 2.0], &[4]).requires_grad(), t64(&[0.0, 2.0, 0.5, 0.0], &[4]).requires_grad());
    let g = a.pow(&b).sum_all().backward().unwrap();
    assert_eq!(vals(g.get(&a).unwrap()), [0.0, 0.0, f64::INFINITY, 0.0], "pow's base");
    assert_eq!(vals(g.get(&b).unwrap()), [0.0, 0.0, 0.0, 2f64.ln()], "pow's exponent");
    // logit without eps: g / (x (1 - x)), +inf at 0 and 1.
    let p = t64(&[0.0, 1.0, 0.5], &[3]).requires_grad();
    assert_eq!(grad(&p, p.logit(None)), [f64::INFINITY, f64::INFINITY, 4.0], "logit");
}

// ---------------------------------------------------------------------------------------------------------------
// Autograd semantics
// ---------------------------------------------------------------------------------------------------------------

fn t64(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec(), &dev()).expect("from_vec")
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().expect("realize")
}

#[test]
fn ties_share_the_gradient() {
    let _g = shared();
    // maximum/minimum: each side of a tie gets half (PyTorch's maximum/minimum).
    let x = t64(&[1.0, 2.0, 3.0, -1.0], &[4]).requires_grad();
    let y = t64(&[1.0, 0.0, 3.0, 5.0], &[4]).requires_grad();
    let r = t64(&[1.0, 10.0, 100.0, 1000.0], &[4]);
    let grads = x.maximum(&y).mul(&r).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), [0.5, 10.0, 50.0, 0.0]);
    assert_eq!(vals(grads.get(&y).unwrap()), [0.5, 0.0, 50.0, 1000.0]);
    let grads = x.minimum(&y).mul(&r).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), [0.5, 0.0, 50.0, 1000.0]);
    assert_eq!(vals(grads.get(&y).unwrap()), [0.5, 10.0, 50.0, 0.0]);
    // relu and clamp are selects, not maximum/minimum, so at 0 and at a bound they follow PyTorch: relu's gradient
    // is 0 at 0, clamp's is 1 at (and inside) its bounds.
    let z = t64(&[0.0, 1.0, -1.0], &[3]).requires_grad();
    let grads = z.relu().sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&z).unwrap()), [0.0, 1.0, 0.0]);
    let grads = z.clamp(-1.0, 0.0).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&z).unwrap()), [1.0, 0.0, 1.0]);
    // max/min reductions: tied extremes share the gradient equally (PyTorch's amax/amin).
    let m = t64(&[1.0, 3.0, 3.0, 0.0, 2.0, 2.0, 2.0, 5.0], &[2, 4]).requires_grad();
    let grads = m.max(1, false).mul(t64(&[6.0, 12.0], &[2])).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&m).unwrap()), [0.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0, 12.0]);
    let grads = m.min_all().backward().unwrap();
    assert_eq!(vals(grads.get(&m).unwrap()), [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    let grads = m.min(1, true).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&m).unwrap()), [0.0, 0.0, 0.0, 1.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0]);
    // abs at 0: gradient 0.
    let a = t64(&[0.0, -2.0, 2.0], &[3]).requires_grad();
    let grads = a.abs().sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&a).unwrap()), [0.0, -1.0, 1.0]);
}

#[test]
fn gradients_accumulate_over_uses() {
    let _g = shared();
    let x = t64(&[1.0, -2.0, 0.5], &[3]).requires_grad();
    // x * x + x + x.sum(): d/dx_i = 2 x_i + 1 + 3 (the sum feeds all three outputs).
    let loss = x.mul(&x).add(&x).add(x.sum_all()).sum_all();
    let grads = loss.backward().unwrap();
    assert_eq!(grads.len(), 1);
    assert_eq!(vals(grads.get(&x).unwrap()), [6.0, 0.0, 5.0]);
    // The same leaf on both sides of one op, and again through a separate branch.
    let y = t64(&[3.0, -1.0], &[2]).requires_grad();
    let grads = y.mul(&y).mul(&y).sub(y.mul(2.0)).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&y).unwrap()), [25.0, 1.0]); // 3 y^2 - 2
}

#[test]
fn only_leaves_that_require_grad_get_gradients() {
    let _g = shared();
    let a = t64(&[1.0, 2.0], &[2]).requires_grad();
    let b = t64(&[3.0, 4.0], &[2]);
    let n = Tensor::from_vec(vec![2i64, 3], [2], &dev()).unwrap();
    let hidden = a.mul(&b);
    assert!(hidden.is_requires_grad() && !b.is_requires_grad());
    let loss = hidden.add(b.exp()).mul(&n).sum_all();
    let grads = loss.backward().unwrap();
    assert_eq!(grads.len(), 1, "only `a` requires grad");
    assert!(grads.get(&b).is_none());
    assert!(grads.get(&n).is_none());
    assert!(grads.get(&hidden).is_none(), "intermediate results are not leaves");
    assert!(grads.get(&loss).is_none());
    assert_eq!(vals(grads.get(&a).unwrap()), [6.0, 12.0]);
    let (leaf, g) = grads.iter().next().unwrap();
    assert_eq!(vals(leaf), [1.0, 2.0]);
    assert_eq!(vals(g), [6.0, 12.0]);
    // A leaf the loss does not depend on gets no entry.
    let c = t64(&[5.0], &[1]).requires_grad();
    let grads = a.sum_all().backward().unwrap();
    assert!(grads.get(&c).is_none());
    // The loss itself a leaf: its gradient is 1.
    let s = Tensor::from_vec(vec![2.5], [], &dev()).unwrap().requires_grad();
    assert_eq!(vals(s.backward().unwrap().get(&s).unwrap()), [1.0]);
}

#[test]
fn detach_stops_the_flow() {
    let _g = shared();
    let x = t64(&[1.0, -2.0, 3.0], &[3]).requires_grad();
    // Lazy detach: (x.detach() * x) has gradient x, not 2x.
    let e = x.exp();
    let grads = e.detach().mul(&x).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), vals(&x.detach().exp()));
    assert!(!e.detach().is_requires_grad());
    // Detach of a realized tensor shares its buffer and carries no history either.
    let y = x.mul(2.0);
    y.realize().unwrap();
    let yd = y.detach();
    assert!(!yd.is_requires_grad());
    let grads = yd.mul(&x).sum_all().backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), [2.0, -4.0, 6.0]);
    // A loss built only from detached values has nothing to differentiate.
    assert!(x.detach().sum_all().backward().is_err());
}

#[test]
fn no_grad_records_no_history() {
    let _g = shared();
    let x = t64(&[1.0, 2.0], &[2]).requires_grad();
    assert!(kiln::is_grad_enabled());
    let loss = kiln::no_grad(|| {
        assert!(!kiln::is_grad_enabled());
        x.mul(&x).sum_all()
    });
    assert!(kiln::is_grad_enabled(), "no_grad restores recording");
    assert!(!loss.is_requires_grad());
    let err = loss.backward().err().expect("backward without history is an error");
    assert!(matches!(err, kiln::Error::Autograd(_)), "{err}");
    assert_eq!(loss.item::<f64>().unwrap(), 5.0, "no_grad still computes");
    // Recording resumes after the closure, also after a panic inside it.
    let caught = std::panic::catch_unwind(|| kiln::no_grad(|| panic!("inside no_grad")));
    assert!(caught.is_err());
    assert!(kiln::is_grad_enabled());
    assert!(x.mul(&x).sum_all().backward().is_ok());
}

#[test]
fn backward_needs_a_one_element_loss() {
    let _g = shared();
    let x = t64(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).requires_grad();
    let err = x.mul(2.0).backward().err().expect("a [2, 2] loss is rejected");
    assert!(matches!(err, kiln::Error::Autograd(_)), "{err}");
    assert!(x.sum(0, false).backward().is_err(), "a [2] loss is rejected");
    // One element of any rank is fine.
    let grads = x.sum([0, 1], true).backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), [1.0; 4]);
}

/// A second `backward` through a graph whose links the first one freed is an error, as in PyTorch.
#[test]
fn second_backward_is_an_error() {
    let _g = shared();
    let x = t64(&[1.0, 2.0], &[2]).requires_grad();
    let hidden = x.exp();
    let loss = hidden.sum_all();
    let first = loss.backward().unwrap();
    assert_eq!(vals(first.get(&x).unwrap()), vals(&x.detach().exp()));
    let err = loss.backward().err().expect("a second backward fails");
    assert!(err.to_string().contains("freed by an earlier backward"), "{err}");
    // So does a new loss built on the freed intermediate.
    assert!(hidden.mul(2.0).sum_all().backward().is_err());
    // A fresh forward from the same leaf works as before.
    let fresh = x.exp().sum_all().backward().unwrap();
    assert_eq!(vals(fresh.get(&x).unwrap()), vals(&x.detach().exp()));
}

#[test]
fn repeated_backward_does_not_grow_live_nodes() {
    let _exclusive = NODES.write().unwrap_or_else(|e| e.into_inner());
    let w = t64(&[0.5, -1.0, 1.5, 2.0, -0.5, 1.0], &[3, 2]).requires_grad();
    let x = t64(&[1.0, 2.0, -1.0, 0.5, 0.0, 3.0], &[2, 3]);
    let step = || {
        let loss = x.matmul(&w).tanh().softmax(-1).log().mean_all();
        let grads = loss.backward().unwrap();
        let g = grads.get(&w).unwrap().clone();
        kiln::realize(&[&loss, &g]).unwrap();
        g.to_vec::<f64>().unwrap()
    };
    let first = step(); // compiles the plan and warms caches
    let before = kiln::stats().live_nodes;
    let mut peak = before;
    for i in 0..1000 {
        let g = step();
        assert_eq!(g, first, "step {i} differs");
        peak = peak.max(kiln::stats().live_nodes);
    }
    let after = kiln::stats().live_nodes;
    assert_eq!(after, before, "live nodes grew from {before} to {after} over 1000 backward calls");
    assert_eq!(peak, before, "live nodes between steps peaked at {peak} (baseline {before})");
}
