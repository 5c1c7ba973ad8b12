//! Mixed precision: `.master_weights(true)` on `Sgd`, `Adam` and `AdamW` keeps bf16 and f16 parameters in f32
//! (`kiln::optim`'s `master.rs`). Small updates that round away in bf16 accumulate in the master; the master follows
//! an f32 parameter trained on the same (exactly representable) gradients bit for bit; the master is part of the
//! state dict, so a resumed run continues from the f32 values; an f32 parameter gets no master.

// Every body runs on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod common;

use common::{tensor, vals};
use kiln::nn::Param;
use kiln::optim::{Adam, AdamW, Optimizer, Sgd};
use kiln::{DType, Tensor};

/// `loss = Σ p · c` with `c` exactly representable in bf16: the gradient is `c` in any dtype.
fn loss(p: &Tensor) -> Tensor {
    let c: Vec<f64> = (0..p.numel()).map(|i| 0.5 + 0.25 * (i % 3) as f64).collect();
    p.mul(tensor(p.dtype(), &c, p.dims())).sum_all()
}

fn step(opt: &mut dyn Optimizer, param: &Param) {
    let l = loss(&param.get());
    let grads = l.backward().unwrap();
    opt.step(grads, &[&l]).unwrap();
}

fn param(dtype: DType, v: f64) -> Param {
    Param::new("p", tensor(dtype, &[v; 6], &[6]))
}

type Make = fn(Vec<Param>, bool) -> Box<dyn Optimizer>;

fn optimizers() -> Vec<(&'static str, Make)> {
    vec![
        ("Sgd", |p, m| Box::new(Sgd::new(p, 1e-4).momentum(0.9).master_weights(m))),
        ("Adam", |p, m| Box::new(Adam::new(p, 1e-4).master_weights(m))),
        ("AdamW", |p, m| Box::new(AdamW::new(p, 1e-4).weight_decay(0.1).master_weights(m))),
    ]
}

#[test]
fn small_updates_round_away_in_bf16_and_accumulate_with_master_weights() {
    for (name, make) in optimizers() {
        let (plain, mixed) = (param(DType::BF16, 1.0), param(DType::BF16, 1.0));
        let (mut a, mut b) = (make(vec![plain.clone()], false), make(vec![mixed.clone()], true));
        for _ in 0..100 {
            step(a.as_mut(), &plain);
            step(b.as_mut(), &mixed);
        }
        // Each step moves a value near 1 by 1e-4 to 1e-3 (momentum), under half of bf16's spacing there (2^-8).
        assert!(vals(&plain.get()).iter().all(|&v| v == 1.0), "{name}: {:?}", vals(&plain.get()));
        let moved = vals(&mixed.get());
        assert!(moved.iter().all(|&v| v < 0.995 && v > 0.9), "{name}: {moved:?}");
        assert_eq!(mixed.get().dtype(), DType::BF16, "{name}");
    }
}

#[test]
fn the_master_follows_an_f32_parameter_bit_for_bit() {
    for (name, make) in optimizers() {
        for half in [DType::BF16, DType::F16] {
            let (p16, p32) = (param(half, 0.75), param(DType::F32, 0.75));
            let (mut a, mut b) = (make(vec![p16.clone()], true), make(vec![p32.clone()], false));
            for _ in 0..20 {
                step(a.as_mut(), &p16);
                step(b.as_mut(), &p32);
            }
            let master = &a.state_dict().params[0].tensors["master_param"];
            assert_eq!(master.dtype(), DType::F32, "{name} {half}");
            assert_eq!(vals(master), vals(&p32.get()), "{name} {half}: the master against the f32 run");
            // The parameter is the master rounded once.
            let rounded = vals(&master.to_dtype(half));
            assert_eq!(vals(&p16.get()), rounded, "{name} {half}");
        }
    }
}

#[test]
fn a_run_resumed_from_a_state_dict_continues_from_the_masters() {
    for (name, make) in optimizers() {
        let whole = param(DType::BF16, 1.0);
        let mut a = make(vec![whole.clone()], true);
        let first = param(DType::BF16, 1.0);
        let mut b = make(vec![first.clone()], true);
        for _ in 0..30 {
            step(a.as_mut(), &whole);
            step(b.as_mut(), &first);
        }
        // A fresh process: the rounded parameter and the optimizer state.
        let resumed = Param::new("p", first.get().contiguous());
        resumed.get().realize().unwrap();
        let mut c = make(vec![resumed.clone()], false);
        c.load_state_dict(&b.state_dict()).unwrap();
        drop(b);
        for _ in 0..30 {
            step(a.as_mut(), &whole);
            step(c.as_mut(), &resumed);
        }
        assert_eq!(vals(&resumed.get()), vals(&whole.get()), "{name}");
        let (sa, sc) = (a.state_dict(), c.state_dict());
        assert_eq!(vals(&sa.params[0].tensors["master_param"]), vals(&sc.params[0].tensors["master_param"]), "{name}");
    }
}

#[test]
fn f32_parameters_get_no_master_and_a_master_without_the_option_is_refused() {
    let p = param(DType::F32, 1.0);
    let mut opt = Sgd::new(vec![p.clone()], 0.1).master_weights(true);
    step(&mut opt, &p);
    assert!(!opt.state_dict().params[0].tensors.contains_key("master_param"));
    let h = param(DType::BF16, 1.0);
    let mut mixed = Sgd::new(vec![h.clone()], 0.1).momentum(0.5).master_weights(true);
    step(&mut mixed, &h);
    let mut state = mixed.state_dict();
    state.hyper.remove("master_weights");
    let mut plain = Sgd::new(vec![h.clone()], 0.1);
    let err = plain.load_state_dict(&state).expect_err("a master the optimizer does not keep");
    assert!(err.to_string().contains("master_param"), "{err}");
}
