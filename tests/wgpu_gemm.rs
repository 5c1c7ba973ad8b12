//! The tiled WGSL GEMM: every tile configuration the tuner may pick is forced once on GEMMs with ragged edges,
//! several K slices, a transposed operand, a batch and the common epilogues, and checked against the reference
//! interpreter; then a whole graph through `Device::wgpu` (tuned choice) against the same reference. Skips with one
//! line without an adapter (fails under `KILN_REQUIRE_WGPU=1`, see `common::wgpu_device`). Built only with the
//! `wgpu` feature (on by default).

#![cfg(feature = "wgpu")]

mod test_cache;

mod common;

use common::{compare, gemm_tol};
use kiln::Tensor;
use kiln_backends::wgpu::{gemm_candidates, run_gemm_with};
use kiln_jit::kernel::gemm::GemmView;

use common::rand_f32 as rand;

/// Forces every tile on the GEMM of `out` and compares with the interpreter's value of the graph.
fn check_all_tiles(name: &str, out: &Tensor) -> usize {
    common::with_last_gemm(name, out, |kernel, args, want| {
        let view = GemmView::of(kernel).unwrap();
        let tiles = gemm_candidates().unwrap();
        assert!(!tiles.is_empty());
        for t in &tiles {
            let got = run_gemm_with(kernel, *t, args).unwrap_or_else(|e| panic!("{name}: {}: {e}", t.name()));
            if let Err(e) = compare(&got, want, gemm_tol(view.k)) {
                panic!("{name}: tile {} is wrong: {e}\n{kernel}", t.name());
            }
        }
        tiles.len()
    })
}

#[test]
fn every_tile_on_ragged_shapes() {
    if common::wgpu_device().is_none() {
        return;
    }
    for (m, n, k) in [(13, 45, 70), (64, 64, 300), (1, 37, 19), (70, 130, 33)] {
        let c = rand(&[m, k], 1).matmul(&rand(&[k, n], 2));
        assert!(check_all_tiles(&format!("{m}x{n}x{k}"), &c) > 0);
    }
}

#[test]
fn every_tile_on_transposed_and_batched_operands() {
    if common::wgpu_device().is_none() {
        return;
    }
    let cases: Vec<(&str, Tensor)> = vec![
        ("x @ w.t()", rand(&[12, 40], 5).matmul(&rand(&[27, 40], 6).t())),
        ("a.t() @ b", rand(&[50, 20], 3).t().matmul(&rand(&[50, 33], 4))),
        ("batched", rand(&[3, 17, 20], 7).matmul(&rand(&[3, 20, 33], 8))),
        ("batched @ broadcast weight", rand(&[3, 17, 20], 7).matmul(&rand(&[20, 33], 8))),
        ("broadcast @ batched", rand(&[17, 20], 7).matmul(&rand(&[2, 20, 33], 8))),
        ("batch-1 vector", rand(&[1, 64], 9).matmul(&rand(&[64, 70], 10))),
    ];
    for (name, c) in cases {
        assert!(check_all_tiles(name, &c) > 0);
    }
}

#[test]
fn every_tile_with_each_epilogue() {
    if common::wgpu_device().is_none() {
        return;
    }
    let (m, n, k) = (14, 41, 37);
    let a = rand(&[m, k], 11);
    let w = rand(&[k, n], 12);
    let mm = || a.matmul(&w);
    let bias = rand(&[n], 13);
    let res = rand(&[m, n], 15);
    let scale = rand(&[], 16);
    let cases: Vec<(&str, Tensor)> = vec![
        ("bias + relu", (mm() + &bias).relu()),
        ("residual", mm() + &res),
        ("scale by a tensor scalar", mm() * &scale),
        ("per-row bias", mm() + rand(&[m, 1], 14)),
        ("gelu", kiln::nn::functional::gelu(&mm(), kiln::nn::functional::Approximate::Tanh)),
        ("batched, residual and per-batch bias", {
            let (a3, w3) = (rand(&[3, m, k], 17), rand(&[3, k, n], 18));
            a3.matmul(&w3) + rand(&[3, m, n], 19) + rand(&[3, 1, n], 20)
        }),
    ];
    for (name, c) in cases {
        assert!(check_all_tiles(name, &c) > 0);
    }
}

/// A graph through the device: the tuned (or stored) tile of each GEMM, inside a plan with other kernels.
#[test]
fn tuned_gemms_through_the_device_match_the_reference() {
    let Some(dev) = common::wgpu_device() else { return };
    let x = rand(&[33, 70], 21);
    let w1 = rand(&[70, 50], 22);
    let w2 = rand(&[40, 50], 23);
    let b1 = rand(&[50], 24);
    let y = (x.matmul(&w1) + &b1).relu().matmul(&w2.t());
    let want = kiln::capture(&[&y]).unwrap().reference().unwrap().remove(0);
    let on = |t: &Tensor| t.to_device(&dev).unwrap();
    let got = (on(&x).matmul(&on(&w1)) + on(&b1)).relu().matmul(&on(&w2).t()).to_host().unwrap();
    compare(&got, &want, gemm_tol(70 * 50)).unwrap();
    // The last GEMM's tile came from a record keyed on this adapter, naming a legal tile that (when searched in
    // this process) passed verification.
    let rec = kiln_backends::wgpu::take_last_tune_record().expect("a GEMM tile was chosen");
    assert_eq!(rec.key.op, "wgsl-gemm");
    assert_eq!(rec.key.device, kiln_backends::wgpu::fingerprint().unwrap().id());
    let tile = kiln_backends::wgpu::tiles::GemmTile::parse(&rec.winner).expect("the winner is a tile name");
    assert!(gemm_candidates().unwrap().contains(&tile), "{} is not a candidate here", rec.winner);
    if rec.mode != "off" {
        let won = rec.trials.iter().find(|t| t.config == rec.winner).expect("the winner is a trial");
        assert_eq!(won.verified, Some(true), "{}", rec.table());
        assert!(won.time_ns.is_some(), "{}", rec.table());
    }
}
