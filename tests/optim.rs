//! `kiln::optim`: SGD (momentum, dampening, Nesterov, weight decay, maximize), Adam (L2, AMSGrad) and AdamW
//! against PyTorch's update formulas computed in plain Rust (f64) over three steps; and the runtime contract of a
//! step: forward + backward + update compile into ONE plan that later steps replay, and memory stays flat.
//!
//! The plan-cache counters and the node count are process-wide, and the tests of this file run on parallel
//! threads, so every test takes `SERIAL` first.

// Every body runs on the CPU (cargo feature `cpu`), the benchmark MLP's weights are read there.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::*;
use kiln::nn::functional::{self as F, Reduction};
use kiln::nn::{Dropout, Linear, Module, Param, ReLU, Sequential};
use kiln::optim::{Adagrad, Adam, AdamW, GroupOptions, Optimizer, RmsProp, Sgd};
use kiln::{DType, Device, Stats, Tensor};
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn dev() -> Device {
    Device::cpu()
}

#[track_caller]
fn close(got: &[f64], want: &[f64], tol: Tol, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol.abs + tol.rel * w.abs(), "{what}[{i}]: got {g:e}, want {w:e} ({tol:?})");
    }
}

/// The objective every formula test minimizes: `f(p) = Σ a/2 p² + b p`, so `∇f = a p + b`, a gradient that
/// depends on the parameter (and so on the trajectory).
struct Quadratic {
    a: Vec<f64>,
    b: Vec<f64>,
    p0: Vec<f64>,
}

const N: usize = 6;

impl Quadratic {
    fn new(seed: u64) -> Quadratic {
        Quadratic {
            a: data(DType::F64, N, seed, Dom::Cont(0.5, 2.0)),
            b: data(DType::F64, N, seed + 1, Dom::Cont(-1.0, 1.0)),
            p0: data(DType::F64, N, seed + 2, Dom::Cont(-2.0, 2.0)),
        }
    }

    fn grad(&self, p: &[f64]) -> Vec<f64> {
        p.iter().zip(&self.a).zip(&self.b).map(|((p, a), b)| a * p + b).collect()
    }

    fn loss(&self, p: &Tensor) -> Tensor {
        let dtype = p.dtype();
        let a = tensor(dtype, &self.a, &[2, 3]);
        let b = tensor(dtype, &self.b, &[2, 3]);
        p.square().mul(&a).mul(0.5).add(p.mul(&b)).sum_all()
    }

    /// Runs `steps` steps of `opt` over the parameter `param`; the parameter's values after each step.
    fn run(&self, param: &Param, opt: &mut dyn Optimizer, steps: usize) -> Vec<Vec<f64>> {
        (0..steps)
            .map(|_| {
                let loss = self.loss(&param.get());
                let grads = loss.backward().unwrap();
                opt.step(grads, &[&loss]).unwrap();
                assert!(loss.is_realized(), "the loss is realized by the step");
                let p = param.get();
                assert!(p.is_realized() && p.is_requires_grad(), "the new value is a realized leaf");
                vals(&p)
            })
            .collect()
    }
}

#[derive(Clone, Copy, Default)]
struct SgdCfg {
    lr: f64,
    momentum: f64,
    dampening: f64,
    weight_decay: f64,
    nesterov: bool,
    maximize: bool,
}

/// PyTorch's `_single_tensor_sgd`, in f64.
fn sgd_ref(q: &Quadratic, c: SgdCfg, steps: usize) -> Vec<Vec<f64>> {
    let mut p = q.p0.clone();
    let mut buf: Option<Vec<f64>> = None;
    let mut out = Vec::new();
    for _ in 0..steps {
        let mut g = q.grad(&p);
        if c.maximize {
            g.iter_mut().for_each(|v| *v = -*v);
        }
        if c.weight_decay != 0.0 {
            g = g.iter().zip(&p).map(|(g, p)| g + c.weight_decay * p).collect();
        }
        if c.momentum != 0.0 {
            let b = match buf {
                None => g.clone(),
                Some(b) => b.iter().zip(&g).map(|(b, g)| c.momentum * b + (1.0 - c.dampening) * g).collect(),
            };
            g = if c.nesterov { g.iter().zip(&b).map(|(g, b)| g + c.momentum * b).collect() } else { b.clone() };
            buf = Some(b);
        }
        p = p.iter().zip(&g).map(|(p, g)| p - c.lr * g).collect();
        out.push(p.clone());
    }
    out
}

#[derive(Clone, Copy)]
struct AdamCfg {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    amsgrad: bool,
    maximize: bool,
}

impl Default for AdamCfg {
    fn default() -> Self {
        AdamCfg {
            lr: 0.1,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            amsgrad: false,
            maximize: false,
        }
    }
}

/// The docs' Adam / AdamW pseudo-code, in f64.
fn adam_ref(q: &Quadratic, c: AdamCfg, steps: usize) -> Vec<Vec<f64>> {
    let mut p = q.p0.clone();
    let (mut m, mut v, mut vmax) = (vec![0.0f64; N], vec![0.0f64; N], vec![0.0f64; N]);
    let (b1, b2) = c.betas;
    let mut out = Vec::new();
    for t in 1..=steps as i32 {
        let mut g = q.grad(&p);
        if c.maximize {
            g.iter_mut().for_each(|v| *v = -*v);
        }
        if c.weight_decay != 0.0 {
            if c.decoupled {
                p.iter_mut().for_each(|p| *p *= 1.0 - c.lr * c.weight_decay);
            } else {
                g = g.iter().zip(&p).map(|(g, p)| g + c.weight_decay * p).collect();
            }
        }
        for i in 0..N {
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            vmax[i] = vmax[i].max(v[i]);
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let second = if c.amsgrad { vmax[i] } else { v[i] };
            let v_hat = second / (1.0 - b2.powi(t));
            p[i] -= c.lr * m_hat / (v_hat.sqrt() + c.eps);
        }
        out.push(p.clone());
    }
    out
}

fn sgd_from(params: Vec<Param>, c: SgdCfg) -> Sgd {
    Sgd::new(params, c.lr)
        .momentum(c.momentum)
        .dampening(c.dampening)
        .weight_decay(c.weight_decay)
        .nesterov(c.nesterov)
        .maximize(c.maximize)
}

fn adam_from(params: Vec<Param>, c: AdamCfg) -> Box<dyn Optimizer> {
    if c.decoupled {
        let o = AdamW::new(params, c.lr).betas(c.betas.0, c.betas.1).eps(c.eps).weight_decay(c.weight_decay);
        Box::new(o.amsgrad(c.amsgrad).maximize(c.maximize))
    } else {
        let o = Adam::new(params, c.lr).betas(c.betas.0, c.betas.1).eps(c.eps).weight_decay(c.weight_decay);
        Box::new(o.amsgrad(c.amsgrad).maximize(c.maximize))
    }
}

/// f64 parameters follow the f64 reference to rounding; f32 ones to f32 rounding amplified over three steps; f16 and
/// bf16 ones (every op of a step rounded to the dtype) to the dtype's accumulation tolerance.
fn tol_for(dtype: DType) -> Tol {
    match dtype {
        DType::F64 => tol(DType::F64, Kind::Accumulate),
        DType::F16 => tol(DType::F16, Kind::Accumulate),
        DType::BF16 => tol(DType::BF16, Kind::Accumulate),
        _ => Tol { rel: 2e-5, abs: 2e-6 },
    }
}

#[test]
fn sgd_variants_match_pytorch_formulas_over_three_steps() {
    let _s = serial();
    let base = SgdCfg { lr: 0.1, ..SgdCfg::default() };
    let cases = [
        ("plain", base),
        ("momentum", SgdCfg { momentum: 0.9, ..base }),
        ("dampening", SgdCfg { momentum: 0.8, dampening: 0.3, ..base }),
        ("nesterov", SgdCfg { momentum: 0.9, nesterov: true, ..base }),
        ("weight decay", SgdCfg { momentum: 0.5, weight_decay: 0.05, ..base }),
        ("maximize", SgdCfg { momentum: 0.9, weight_decay: 0.01, maximize: true, ..base }),
    ];
    for (seed, (name, cfg)) in cases.into_iter().enumerate() {
        let q = Quadratic::new(100 + seed as u64 * 3);
        let want = sgd_ref(&q, cfg, 3);
        for dtype in FLOATS {
            let param = Param::new("p", tensor(dtype, &q.p0, &[2, 3]));
            let mut opt = sgd_from(vec![param.clone()], cfg);
            let got = q.run(&param, &mut opt, 3);
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                close(g, w, tol_for(dtype), &format!("sgd {name} {dtype} step {}", step + 1));
            }
            assert_eq!(opt.momentum_buffer(0).is_some(), cfg.momentum != 0.0, "{name}");
        }
    }
}

#[test]
fn adam_and_adamw_match_pytorch_formulas_over_three_steps() {
    let _s = serial();
    let base = AdamCfg::default();
    let cases = [
        ("adam", base),
        ("adam betas eps", AdamCfg { betas: (0.8, 0.95), eps: 1e-3, ..base }),
        ("adam l2", AdamCfg { weight_decay: 0.1, ..base }),
        ("adam amsgrad", AdamCfg { amsgrad: true, lr: 0.5, ..base }),
        ("adam maximize", AdamCfg { maximize: true, ..base }),
        ("adamw", AdamCfg { decoupled: true, weight_decay: 0.01, ..base }),
        ("adamw strong decay", AdamCfg { decoupled: true, weight_decay: 0.5, amsgrad: true, ..base }),
    ];
    for (seed, (name, cfg)) in cases.into_iter().enumerate() {
        let q = Quadratic::new(200 + seed as u64 * 3);
        let want = adam_ref(&q, cfg, 3);
        for dtype in FLOATS {
            let param = Param::new("p", tensor(dtype, &q.p0, &[2, 3]));
            let mut opt = adam_from(vec![param.clone()], cfg);
            let got = q.run(&param, &mut *opt, 3);
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                close(g, w, tol_for(dtype), &format!("{name} {dtype} step {}", step + 1));
            }
        }
    }
    // AdamW's default weight decay is PyTorch's 0.01; Adam's is 0.
    let q = Quadratic::new(300);
    let param = Param::new("p", tensor(DType::F64, &q.p0, &[2, 3]));
    let got = q.run(&param, &mut AdamW::new(vec![param.clone()], 0.1), 2);
    let want = adam_ref(&q, AdamCfg { decoupled: true, weight_decay: 0.01, ..base }, 2);
    close(&got[1], &want[1], tol_for(DType::F64), "AdamW default weight decay");
}

#[derive(Clone, Copy)]
struct RmsCfg {
    lr: f64,
    alpha: f64,
    eps: f64,
    weight_decay: f64,
    momentum: f64,
    centered: bool,
    maximize: bool,
}

impl Default for RmsCfg {
    fn default() -> Self {
        RmsCfg { lr: 0.01, alpha: 0.99, eps: 1e-8, weight_decay: 0.0, momentum: 0.0, centered: false, maximize: false }
    }
}

/// PyTorch's `_single_tensor_rmsprop`, in f64.
fn rmsprop_ref(q: &Quadratic, c: RmsCfg, steps: usize) -> Vec<Vec<f64>> {
    let mut p = q.p0.clone();
    let (mut v, mut ga, mut buf) = (vec![0.0f64; N], vec![0.0f64; N], vec![0.0f64; N]);
    let mut out = Vec::new();
    for _ in 0..steps {
        let mut g = q.grad(&p);
        if c.maximize {
            g.iter_mut().for_each(|v| *v = -*v);
        }
        if c.weight_decay != 0.0 {
            g = g.iter().zip(&p).map(|(g, p)| g + c.weight_decay * p).collect();
        }
        for i in 0..N {
            v[i] = c.alpha * v[i] + (1.0 - c.alpha) * g[i] * g[i];
            let avg = if c.centered {
                ga[i] += (g[i] - ga[i]) * (1.0 - c.alpha);
                (v[i] - ga[i] * ga[i]).sqrt() + c.eps
            } else {
                v[i].sqrt() + c.eps
            };
            if c.momentum > 0.0 {
                buf[i] = c.momentum * buf[i] + g[i] / avg;
                p[i] -= c.lr * buf[i];
            } else {
                p[i] -= c.lr * g[i] / avg;
            }
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn rmsprop_variants_match_pytorch_formulas_over_three_steps() {
    let _s = serial();
    let base = RmsCfg::default();
    let cases = [
        ("plain", base),
        ("alpha eps lr", RmsCfg { alpha: 0.9, eps: 1e-3, lr: 0.05, ..base }),
        ("momentum", RmsCfg { momentum: 0.9, ..base }),
        ("centered", RmsCfg { centered: true, lr: 0.02, ..base }),
        ("centered momentum decay", RmsCfg { centered: true, momentum: 0.5, weight_decay: 0.1, ..base }),
        ("maximize", RmsCfg { maximize: true, momentum: 0.3, ..base }),
    ];
    for (seed, (name, c)) in cases.into_iter().enumerate() {
        let q = Quadratic::new(400 + seed as u64 * 3);
        let want = rmsprop_ref(&q, c, 3);
        for dtype in FLOATS {
            let param = Param::new("p", tensor(dtype, &q.p0, &[2, 3]));
            let mut opt = RmsProp::new(vec![param.clone()], c.lr)
                .alpha(c.alpha)
                .eps(c.eps)
                .weight_decay(c.weight_decay)
                .momentum(c.momentum)
                .centered(c.centered)
                .maximize(c.maximize);
            let got = q.run(&param, &mut opt, 3);
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                close(g, w, tol_for(dtype), &format!("rmsprop {name} {dtype} step {}", step + 1));
            }
            assert_eq!(opt.step_count(0), 3, "{name}");
            assert!(opt.square_avg(0).is_some(), "{name}");
        }
    }
    // The reference against PyTorch itself: `torch.optim.RMSprop([p], lr=0.01, momentum=0.9, centered=True)` on
    // this quadratic from p0 = [1, -2, 0.5, 3, -0.25, 0], a = [1, 2, 0.5, 1.5, 1, 0.75], b = [0.5, -0.5, 0.25, 0, 1,
    // -1], three steps (torch 2.15 printed the final parameters).
    let q = Quadratic {
        a: vec![1.0, 2.0, 0.5, 1.5, 1.0, 0.75],
        b: vec![0.5, -0.5, 0.25, 0.0, 1.0, -1.0],
        p0: vec![1.0, -2.0, 0.5, 3.0, -0.25, 0.0],
    };
    let got = rmsprop_ref(&q, RmsCfg { momentum: 0.9, centered: true, ..base }, 3);
    close(&got[2], &TORCH_RMSPROP, Tol { rel: 1e-12, abs: 1e-12 }, "the f64 reference against PyTorch");
}

/// PyTorch's `_single_tensor_adagrad`, in f64: (lr, lr_decay, weight_decay, initial_accumulator_value, eps,
/// maximize).
fn adagrad_ref(q: &Quadratic, c: (f64, f64, f64, f64, f64, bool), steps: usize) -> Vec<Vec<f64>> {
    let (lr, lr_decay, weight_decay, initial, eps, maximize) = c;
    let mut p = q.p0.clone();
    let mut sum = [initial; N];
    let mut out = Vec::new();
    for t in 1..=steps {
        let mut g = q.grad(&p);
        if maximize {
            g.iter_mut().for_each(|v| *v = -*v);
        }
        if weight_decay != 0.0 {
            g = g.iter().zip(&p).map(|(g, p)| g + weight_decay * p).collect();
        }
        let clr = lr / (1.0 + (t - 1) as f64 * lr_decay);
        for i in 0..N {
            sum[i] += g[i] * g[i];
            p[i] -= clr * g[i] / (sum[i].sqrt() + eps);
        }
        out.push(p.clone());
    }
    out
}

#[test]
fn adagrad_variants_match_pytorch_formulas_over_three_steps() {
    let _s = serial();
    let cases = [
        ("plain", (0.01, 0.0, 0.0, 0.0, 1e-10, false)),
        ("decay and accumulator", (0.1, 0.05, 0.02, 0.3, 1e-10, false)),
        ("eps maximize", (0.05, 0.0, 0.0, 0.0, 1e-3, true)),
    ];
    for (seed, (name, c)) in cases.into_iter().enumerate() {
        let q = Quadratic::new(500 + seed as u64 * 3);
        let want = adagrad_ref(&q, c, 3);
        for dtype in FLOATS {
            let param = Param::new("p", tensor(dtype, &q.p0, &[2, 3]));
            let (lr, lr_decay, weight_decay, initial, eps, maximize) = c;
            let mut opt = Adagrad::new(vec![param.clone()], lr)
                .lr_decay(lr_decay)
                .weight_decay(weight_decay)
                .initial_accumulator_value(initial)
                .eps(eps)
                .maximize(maximize);
            let got = q.run(&param, &mut opt, 3);
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                close(g, w, tol_for(dtype), &format!("adagrad {name} {dtype} step {}", step + 1));
            }
            assert_eq!(opt.step_count(0), 3, "{name}");
            assert!(opt.sum(0).is_some(), "{name}");
        }
    }
    // The decayed rate is a run-time input and the first step's sum is realized like every later one's: after the
    // first step, steps compile nothing.
    let q = Quadratic::new(530);
    let param = Param::new("p", tensor(DType::F32, &q.p0, &[2, 3]));
    let mut opt = Adagrad::new(vec![param.clone()], 0.1).lr_decay(0.1).initial_accumulator_value(0.5);
    q.run(&param, &mut opt, 1);
    let before = kiln::stats();
    q.run(&param, &mut opt, 4);
    assert_eq!(kiln::stats().plan_misses, before.plan_misses, "Adagrad's later steps recompiled");
    // The reference against PyTorch itself: `torch.optim.Adagrad([p], lr=0.1, lr_decay=0.05, weight_decay=0.02,
    // initial_accumulator_value=0.3)`, three steps on the quadratic of the RMSprop check (torch 2.15's parameters).
    let q = Quadratic {
        a: vec![1.0, 2.0, 0.5, 1.5, 1.0, 0.75],
        b: vec![0.5, -0.5, 0.25, 0.0, 1.0, -1.0],
        p0: vec![1.0, -2.0, 0.5, 3.0, -0.25, 0.0],
    };
    let torch = [
        0.7944141345788597,
        -1.7847003807816662,
        0.3398345019416447,
        2.7838045588046203,
        -0.4288049894970816,
        0.19485983222006104,
    ];
    let got = adagrad_ref(&q, (0.1, 0.05, 0.02, 0.3, 1e-10, false), 3);
    close(&got[2], &torch, Tol { rel: 1e-12, abs: 1e-12 }, "the f64 reference against PyTorch");
}

/// See `rmsprop_variants_match_pytorch_formulas_over_three_steps`.
const TORCH_RMSPROP: [f64; N] = [
    0.5435555375798897,
    -1.539743118374706,
    0.0496502230981131,
    2.5379088839052883,
    -0.6937800309295671,
    0.4549639089092121,
];

#[test]
fn parameter_groups_follow_their_own_learning_rate_scale_and_weight_decay() {
    let _s = serial();
    let (q1, q2) = (Quadratic::new(400), Quadratic::new(403));
    let options = GroupOptions { lr_scale: Some(0.5), weight_decay: Some(0.2) };
    let sgd = SgdCfg { lr: 0.1, momentum: 0.9, weight_decay: 0.01, ..SgdCfg::default() };
    let adam = AdamCfg { weight_decay: 0.05, ..AdamCfg::default() };
    let adamw = AdamCfg { decoupled: true, ..adam };
    for which in 0..3 {
        let (p1, p2) = (
            Param::new("p1", tensor(DType::F64, &q1.p0, &[2, 3])),
            Param::new("p2", tensor(DType::F64, &q2.p0, &[2, 3])),
        );
        let (mut opt, want1, want2): (Box<dyn Optimizer>, _, _) = match which {
            0 => {
                let in_group = SgdCfg { lr: 0.05, weight_decay: 0.2, ..sgd };
                (
                    Box::new(sgd_from(vec![p1.clone()], sgd).group(vec![p2.clone()], options)),
                    sgd_ref(&q1, sgd, 3),
                    sgd_ref(&q2, in_group, 3),
                )
            }
            _ => {
                let c = if which == 1 { adam } else { adamw };
                let in_group = AdamCfg { lr: c.lr * 0.5, weight_decay: 0.2, ..c };
                let opt: Box<dyn Optimizer> = if which == 1 {
                    Box::new(
                        Adam::new(vec![p1.clone()], c.lr).weight_decay(c.weight_decay).group(vec![p2.clone()], options),
                    )
                } else {
                    Box::new(
                        AdamW::new(vec![p1.clone()], c.lr)
                            .weight_decay(c.weight_decay)
                            .group(vec![p2.clone()], options),
                    )
                };
                (opt, adam_ref(&q1, c, 3), adam_ref(&q2, in_group, 3))
            }
        };
        assert_eq!(opt.params().len(), 2);
        for step in 0..3 {
            let loss = q1.loss(&p1.get()).add(q2.loss(&p2.get()));
            opt.step(loss.backward().unwrap(), &[]).unwrap();
            let what = format!("optimizer {which} step {}", step + 1);
            close(&vals(&p1.get()), &want1[step], tol_for(DType::F64), &format!("{what}: default group"));
            close(&vals(&p2.get()), &want2[step], tol_for(DType::F64), &format!("{what}: second group"));
        }
    }
}

#[test]
#[should_panic(expected = "Sgd: parameter `p` appears in more than one parameter group")]
fn a_parameter_in_two_groups_is_refused() {
    let p = Param::new("p", tensor(DType::F32, &[1.0], &[1]));
    let _ = Sgd::new(vec![p.clone()], 0.1).group(vec![p], GroupOptions::default());
}

#[test]
fn parameters_without_a_gradient_are_left_unchanged() {
    let _s = serial();
    let used = Param::new("used", tensor(DType::F32, &[1.0, 2.0], &[2]));
    let unused = Param::new("unused", tensor(DType::F32, &[5.0, 6.0], &[2]));
    let mut opt = Adam::new(vec![used.clone(), unused.clone(), used.clone()], 0.1);
    assert_eq!(opt.params().len(), 2, "a repeated handle counts once");
    for _ in 0..2 {
        let loss = used.get().square().sum_all();
        let grads = loss.backward().unwrap();
        opt.step(grads, &[&loss]).unwrap();
    }
    assert_eq!(opt.step_count(0), 2);
    assert_eq!(opt.step_count(1), 0, "no gradient, no step: the state does not advance");
    assert!(opt.moments(1).is_none());
    assert_eq!(unused.get().to_vec::<f32>().unwrap(), [5.0, 6.0]);
    // Adam moves each coordinate by about lr on the first steps.
    let moved = used.get().to_vec::<f32>().unwrap();
    assert!(moved[0] < 0.85 && moved[1] < 1.85, "{moved:?}");
}

fn delta(before: Stats, after: Stats) -> (u64, u64, u64, u64) {
    (
        after.compiles - before.compiles,
        after.plan_misses - before.plan_misses,
        after.plan_hits - before.plan_hits,
        after.realizes - before.realizes,
    )
}

/// A small classification task: 4 classes from a fixed random linear map of 8 features.
fn task(n: usize) -> (Tensor, Tensor) {
    let x = data(DType::F32, n * 8, 77, Dom::Cont(-1.0, 1.0));
    let w = data(DType::F64, 8 * 4, 78, Dom::Cont(-1.0, 1.0));
    let y: Vec<i64> = (0..n)
        .map(|i| {
            let scores: Vec<f64> = (0..4).map(|c| (0..8).map(|k| x[i * 8 + k] * w[k * 4 + c]).sum()).collect();
            (0..4).max_by(|&a, &b| scores[a].total_cmp(&scores[b])).unwrap() as i64
        })
        .collect();
    (tensor(DType::F32, &x, &[n, 8]), Tensor::from_vec(y, [n], &dev()).unwrap())
}

#[test]
fn one_hundred_training_steps_compile_one_plan_and_keep_memory_flat() {
    let _s = serial();
    kiln::manual_seed(2024);
    let dev = dev();
    // Shapes no other test uses, so the plan cannot already be cached.
    let model = Sequential::new()
        .add(Linear::new(8, 24, true, &dev))
        .add(ReLU)
        .add(Dropout::new(0.1))
        .add(Linear::new(24, 4, true, &dev));
    model.realize_params().unwrap();
    let (x, y) = task(64);
    let mut opt = Adam::new(model.params(), 1e-2);
    let before = kiln::stats();
    let mut losses = Vec::new();
    let mut live_after_step = Vec::new();
    for _ in 0..100 {
        {
            let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean);
            let grads = loss.backward().unwrap();
            opt.step(grads, &[&loss]).unwrap();
            losses.push(loss.item::<f32>().unwrap());
        }
        live_after_step.push(kiln::stats().live_nodes);
    }
    let after = kiln::stats();
    // Forward + backward + Adam update (and the loss) are one plan: compiled by step 1, replayed by 2..=100. The
    // dropout masks' random keys and the bias corrections are run-time inputs, so they change nothing.
    assert_eq!(delta(before, after), (1, 1, 99, 100), "compiles, misses, hits, realizes");
    assert_eq!(after.cached_plans - before.cached_plans, 1);
    // Nothing from one step survives into the next: the node count after every step is the same.
    assert!(live_after_step.iter().all(|&n| n == live_after_step[0]), "live nodes grew: {live_after_step:?}");
    assert!(losses[99] < 0.5 * losses[0], "the loss falls: {} -> {}", losses[0], losses[99]);
}

#[test]
fn the_first_step_realizes_a_lazy_init_separately_and_set_lr_does_not_recompile() {
    let _s = serial();
    kiln::manual_seed(7);
    let dev = dev();
    let model = Sequential::new().add(Linear::new(8, 5, true, &dev)).add(ReLU).add(Linear::new(5, 4, false, &dev));
    let (x, y) = task(16);
    let mut opt = Sgd::new(model.params(), 0.05).momentum(0.9);
    let before = kiln::stats();
    for step in 0..10 {
        let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean);
        let grads = loss.backward().unwrap();
        opt.set_lr(0.05 / (1.0 + step as f64)); // a schedule: the learning rate is an input, not a constant
        opt.step(grads, &[&loss]).unwrap();
    }
    // One plan for the random init (realized on its own by the first step), one for the training step.
    assert_eq!(delta(before, kiln::stats()), (2, 2, 9, 11), "compiles, misses, hits, realizes");
    assert_eq!(opt.lr(), 0.05 / 10.0);
    for p in opt.params() {
        assert!(p.get().is_realized() && p.get().is_requires_grad());
    }
}

/// SGD keeps its learning-rate input across steps and uploads a new one only when the value changes: each step
/// uses the learning rate set before it, back to an earlier value included.
#[test]
fn sgd_uses_the_learning_rate_of_each_step() {
    let _s = serial();
    let p = Param::new("p", tensor(DType::F32, &[1.0], &[1]));
    let mut opt = Sgd::new(vec![p.clone()], 0.1);
    let mut want = 1.0f32;
    for lr in [0.1, 0.1, 0.01, 0.1, 0.25] {
        opt.set_lr(lr);
        let loss = p.get().mul(3.0).sum_all(); // gradient 3
        let grads = loss.backward().unwrap();
        opt.step(grads, &[&loss]).unwrap();
        want -= 3.0f32 * lr as f32;
        assert_eq!(p.get().to_vec::<f32>().unwrap(), [want], "after a step with lr {lr}");
    }
}

#[test]
fn a_step_with_no_gradients_only_realizes_what_it_is_given() {
    let _s = serial();
    let p = Param::new("p", tensor(DType::F32, &[1.0], &[1]));
    let mut opt = Sgd::new(vec![p.clone()], 0.1);
    let other = Tensor::from_vec(vec![2.0f32], [1], &dev()).unwrap().requires_grad();
    let loss = other.mul(3.0).sum_all();
    let grads = loss.backward().unwrap();
    opt.step(grads, &[&loss]).unwrap();
    assert_eq!(loss.item::<f32>().unwrap(), 6.0);
    assert_eq!(p.get().to_vec::<f32>().unwrap(), [1.0]);
}

#[test]
#[should_panic(expected = "Nesterov momentum requires a momentum and zero dampening")]
fn nesterov_without_momentum_is_refused() {
    let _s = serial();
    let p = Param::new("p", Tensor::from_vec(vec![1.0f32], [1], &dev()).unwrap());
    let loss = p.get().sum_all();
    let grads = loss.backward().unwrap();
    let _ = Sgd::new(vec![p], 0.1).nesterov(true).step(grads, &[]);
}

#[test]
#[should_panic(expected = "invalid learning rate: -1")]
fn a_negative_learning_rate_is_refused() {
    let _s = serial();
    let _ = Adam::new(Vec::new(), -1.0);
}

/// The seed's benchmark MLP against a recorded PyTorch run (`tests/fixtures/make_mlp_parity.py`): the same initial
/// weights, data, loss and SGD, 200 steps, on every device of `common::devices()` (the file is read on the CPU and
/// moved with `to_device`). Exercises `load_safetensors` on a file written by `safetensors.torch`,
/// `Linear::from_weight`, `leaky_relu`, autograd and `Sgd` together.
#[test]
fn sgd_on_the_benchmark_mlp_matches_a_recorded_pytorch_run() {
    let _s = serial();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mlp_parity.safetensors");
    let file: std::collections::HashMap<String, Tensor> =
        kiln::load_safetensors(path, &Device::cpu()).unwrap().into_iter().collect();
    let want: Vec<f64> = vals(&file["losses"]);
    for dev in common::devices() {
        let on = |n: &str| file[n].to_device(&dev).unwrap();
        let layers: Vec<Linear> = ["w1", "w2", "w3"].iter().map(|n| Linear::from_weight(on(n), None)).collect();
        let (x, t) = (&on("x"), &on("t"));
        let params: Vec<Param> = layers.iter().flat_map(|l| l.params()).collect();
        let mut opt = Sgd::new(params, 1e-3);
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let h = F::leaky_relu(&layers[0].forward(x), 0.01);
            let h = F::leaky_relu(&layers[1].forward(&h), 0.01);
            let loss = layers[2].forward(&h).sub(t).square().sum_all();
            let grads = loss.backward().unwrap();
            opt.step(grads, &[&loss]).unwrap();
            got.push(loss.item::<f32>().unwrap() as f64);
        }
        // Summation order differs from PyTorch's (f32 GEMMs of K = 784), and the run passes through a loss spike
        // (898 -> 7802 -> 650), yet every loss agreed to 5.4e-6 relative on the CPU when this was written; 1e-4
        // leaves room for other GEMM tilings and WGSL's 2.5-ulp division without hiding a wrong formula (a wrong
        // gradient or update is off by far more).
        close(&got, &want, Tol { rel: 1e-4, abs: 0.0 }, &format!("loss on {dev}"));
    }
}

#[test]
fn learning_rate_schedules_match_pytorchs() {
    use kiln::optim::schedule::{
        Anneal, CosineAnnealingLr, ExponentialLr, LinearLr, LrSchedule, OneCycleLr, Sequential, StepLr,
    };
    // Printed by `tests/fixtures/lr_schedules.py` (torch 2.15), base rate 0.1, steps 0..10.
    let torch: [(&str, Box<dyn LrSchedule>, [f64; 10]); 7] = [
        ("step", Box::new(StepLr::new(0.1, 3, 0.5)), [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125]),
        (
            "exponential",
            Box::new(ExponentialLr::new(0.1, 0.9)),
            [
                0.1,
                0.09000000000000001,
                0.08100000000000002,
                0.07290000000000002,
                0.06561000000000002,
                0.05904900000000002,
                0.05314410000000002,
                0.04782969000000002,
                0.043046721000000024,
                0.03874204890000002,
            ],
        ),
        (
            "cosine",
            Box::new(CosineAnnealingLr::new(0.1, 6, 0.01)),
            [
                0.1,
                0.09397114317029975,
                0.07750000000000001,
                0.055000000000000014,
                0.032500000000000015,
                0.01602885682970026,
                0.01,
                0.01602885682970026,
                0.03250000000000001,
                0.05500000000000004,
            ],
        ),
        (
            "linear",
            Box::new(LinearLr::new(0.1, 0.25, 1.0, 4)),
            [
                0.025,
                0.043750000000000004,
                0.06250000000000001,
                0.08125000000000002,
                0.10000000000000002,
                0.10000000000000002,
                0.10000000000000002,
                0.10000000000000002,
                0.10000000000000002,
                0.10000000000000002,
            ],
        ),
        (
            "one_cycle",
            Box::new(OneCycleLr::new(1.0, 10)),
            [
                0.040000000000000036,
                0.52,
                1.0,
                0.9504846320134737,
                0.8117456539497631,
                0.6112620219362893,
                0.38874197806371075,
                0.18825834605023697,
                0.049519367986526286,
                4e-06,
            ],
        ),
        (
            "one_cycle_linear_three_phase",
            Box::new(
                OneCycleLr::new(0.5, 12)
                    .pct_start(0.25)
                    .anneal(Anneal::Linear)
                    .three_phase(true)
                    .div_factor(10.0)
                    .final_div_factor(100.0),
            ),
            [
                0.05,
                0.275,
                0.5,
                0.275,
                0.04999999999999999,
                0.042928571428571434,
                0.03585714285714286,
                0.02878571428571429,
                0.021714285714285717,
                0.014642857142857145,
            ],
        ),
        (
            "warmup_cosine",
            Box::new(Sequential::new(
                vec![Box::new(LinearLr::new(0.1, 0.1, 1.0, 3)), Box::new(CosineAnnealingLr::new(0.1, 5, 0.0))],
                vec![3],
            )),
            [
                0.010000000000000002,
                0.04,
                0.07,
                0.1,
                0.09045084971874738,
                0.06545084971874737,
                0.03454915028125263,
                0.009549150281252633,
                0.0,
                0.009549150281252628,
            ],
        ),
    ];
    for (name, schedule, want) in &torch {
        let got: Vec<f64> = (0..10).map(|t| schedule.lr(t)).collect();
        // Closed forms against PyTorch's chained updates: equal to a few ulps.
        close(&got, want, Tol { rel: 1e-14, abs: 1e-17 }, name);
    }
    // A closure is a schedule too.
    let half = |t: u64| 0.1 / (t + 1) as f64;
    assert_eq!(half.lr(1), 0.05);
}

#[test]
fn reduce_lr_on_plateau_matches_pytorchs() {
    use kiln::optim::schedule::{PlateauMode, ReduceLrOnPlateau};
    // Printed by `tests/fixtures/lr_schedules.py` (torch 2.15): the rate after each metric, base rate 0.1. The NaN
    // counts as no improvement; in the second case the last reduction (1e-8 to 1e-9) is below eps and skipped.
    let metrics = [1.0, 0.9, 0.95, 0.95, 0.95, 0.89995, 0.5, 0.6, 0.6, 0.6, 0.6, f64::NAN, 0.4, 0.4, 0.4, 0.4];
    let mut min_rel =
        ReduceLrOnPlateau::new(0.1, PlateauMode::Min).factor(0.5).patience(2).threshold(1e-4).cooldown(1).min_lr(0.03);
    let want = [0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.03, 0.03, 0.03, 0.03, 0.03, 0.03, 0.03];
    let got: Vec<f64> = metrics.iter().map(|&m| min_rel.step(m)).collect();
    assert_eq!(got, want);
    assert_eq!(min_rel.best(), 0.4);
    let mut max_abs = ReduceLrOnPlateau::new(0.1, PlateauMode::Max).factor(0.1).patience(1).threshold_abs(0.05);
    let want = [
        0.1,
        0.1,
        0.010000000000000002,
        0.010000000000000002,
        0.0010000000000000002,
        0.0010000000000000002,
        0.00010000000000000003,
        0.00010000000000000003,
        1.0000000000000004e-05,
        1.0000000000000004e-05,
        1.0000000000000004e-06,
        1.0000000000000004e-06,
        1.0000000000000005e-07,
        1.0000000000000005e-07,
        1.0000000000000005e-08,
        1.0000000000000005e-08,
    ];
    let got: Vec<f64> = metrics.iter().map(|&m| max_abs.step(m)).collect();
    assert_eq!(got, want);
    assert_eq!(max_abs.lr(), 1.0000000000000005e-08);
}

#[test]
#[should_panic(expected = "ReduceLrOnPlateau: factor must be below 1.0 (got 1)")]
fn a_plateau_factor_must_reduce() {
    let _ = kiln::optim::schedule::ReduceLrOnPlateau::new(0.1, kiln::optim::schedule::PlateauMode::Min).factor(1.0);
}

#[test]
#[should_panic(expected = "Sequential: milestones must increase (got [5, 5])")]
fn a_sequential_schedule_needs_increasing_milestones() {
    use kiln::optim::schedule::{ExponentialLr, LrSchedule, Sequential};
    let part = || Box::new(ExponentialLr::new(0.1, 0.9)) as Box<dyn LrSchedule>;
    let _ = Sequential::new(vec![part(), part(), part()], vec![5, 5]);
}

/// A linear layer 6 -> 3 in f64 (`w`, `b`) with fixed values, and 8 samples.
fn accumulation_setup() -> ([Param; 2], Tensor, Tensor) {
    let w = Param::new("w", tensor(DType::F64, &data(DType::F64, 18, 41, Dom::Cont(-1.0, 1.0)), &[3, 6]));
    let b = Param::new("b", tensor(DType::F64, &data(DType::F64, 3, 42, Dom::Cont(-1.0, 1.0)), &[3]));
    let x = tensor(DType::F64, &data(DType::F64, 8 * 6, 43, Dom::Cont(-1.0, 1.0)), &[8, 6]);
    let t = tensor(DType::F64, &data(DType::F64, 8 * 3, 44, Dom::Cont(-1.0, 1.0)), &[8, 3]);
    ([w, b], x, t)
}

#[test]
fn accumulated_micro_batch_gradients_equal_the_full_batch_gradients_and_replay_their_plans() {
    let _s = serial();
    use kiln::optim::GradAccumulator;
    let (params, x, t) = accumulation_setup();
    let loss_of = |x: &Tensor, t: &Tensor| (x.matmul(&params[0].get().t()) + params[1].get() - t).square().sum_all();
    let full = loss_of(&x, &t).backward().unwrap();
    let want: Vec<Vec<f64>> = params.iter().map(|p| vals(full.get(&p.get()).unwrap())).collect();
    drop(full);

    let mut acc = GradAccumulator::new(params.to_vec());
    let mut opt = Sgd::new(params.to_vec(), 0.05);
    let before = kiln::stats();
    for round in 0..3 {
        for half in 0..2 {
            let (xs, ts) = (x.slice(0, half * 4, half * 4 + 4, 1), t.slice(0, half * 4, half * 4 + 4, 1));
            let loss = loss_of(&xs, &ts);
            acc.add(loss.backward().unwrap(), &[&loss]).unwrap();
            assert!(loss.is_realized(), "the micro-step realizes its loss in the same plan");
        }
        let grads = acc.take();
        if round == 0 {
            // Summed over the two halves: the full batch's gradients, up to the order of the additions.
            for (p, w) in params.iter().zip(&want) {
                close(&vals(grads.get(&p.get()).unwrap()), w, Tol { rel: 1e-12, abs: 1e-14 }, p.name());
            }
            assert_eq!(acc.take().len(), 0, "take starts over");
        }
        opt.step(grads, &[]).unwrap();
    }
    let after = kiln::stats();
    // The first micro-step (gradients), the second (gradients + running sums) and the update: three plans,
    // compiled in the first round and replayed in the next two; the second micro-step writes the sums in place.
    assert_eq!(after.compiles - before.compiles, 3, "compiles");
    assert_eq!(after.plan_hits - before.plan_hits, 6, "plan hits");
    // Per round: the two running sums (second micro-step) and the two parameters (the update), in place.
    assert_eq!(after.donated_buffers - before.donated_buffers, 3 * (2 + 2), "donations");
}
