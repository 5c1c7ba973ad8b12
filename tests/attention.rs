//! `nn::MultiheadAttention` and `nn::RotaryEmbedding` against PyTorch 2.15 (`tests/fixtures/attention_torch.py`:
//! parameters, inputs and outputs) on every device: masks in PyTorch's conventions for the module (bool true =
//! not allowed, key padding), causal with batch-first and per-head weights, keys and values of other widths
//! (kdim, vdim), and rotary embeddings at an offset.
//! `scaled_dot_product_attention` itself is checked in `tests/nn/attention.rs`.

// The fixture is read on the CPU (cargo feature `cpu`) and moved to each device.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::*;
use kiln::nn::functional as F;
use kiln::nn::{Linear, MhaOptions, Module, MultiheadAttention, RotaryEmbedding};
use kiln::{Device, Tensor};
use std::collections::HashMap;

/// `got` against `want` (PyTorch's), within the stated tolerance: summation orders differ (GEMMs, row reductions).
fn close(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    if let Err(e) = compare(&got.to_host().unwrap(), &want.to_host().unwrap(), Tol { rel: 1e-5, abs: 2e-6 }) {
        panic!("{what}: {e}");
    }
}

#[test]
fn multihead_attention_and_rotary_embeddings_match_pytorch() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/attention_torch.safetensors");
    let file: HashMap<String, Tensor> = kiln::load_safetensors(path, &Device::cpu()).unwrap().into_iter().collect();
    for dev in devices() {
        let on = |n: &str| file[n].to_device(&dev).unwrap();
        let out_proj = Linear::from_weight(on("out_proj.weight"), Some(on("out_proj.bias")));
        let mha = MultiheadAttention::from_params(2, on("in_proj_weight"), Some(on("in_proj_bias")), out_proj.clone());
        let mask = Tensor::from_vec(
            vec![false, false, true, false, false, true, false, false, false, false, false, false],
            [3, 4],
            &dev,
        )
        .unwrap();
        let pad = Tensor::from_vec(vec![false, false, false, true, false, false, false, false], [2, 4], &dev).unwrap();
        let opts = MhaOptions { attn_mask: Some(mask), key_padding_mask: Some(pad), ..Default::default() };
        let (out, w) = mha.attend(&on("q"), &on("k"), &on("v"), &opts);
        close(&out, &on("out"), &format!("[{dev}] output"));
        close(&w.unwrap(), &on("weights"), &format!("[{dev}] weights"));
        // The same through scaled_dot_product_attention (no weights asked).
        let (out2, none) = mha.attend(&on("q"), &on("k"), &on("v"), &MhaOptions { need_weights: false, ..opts });
        assert!(none.is_none());
        close(&out2, &on("out"), &format!("[{dev}] output without weights"));

        let mha_bf = MultiheadAttention::from_params(2, on("in_proj_weight"), Some(on("in_proj_bias")), out_proj)
            .batch_first(true);
        let xb = on("xb");
        let causal = MhaOptions { is_causal: true, average_attn_weights: false, ..Default::default() };
        let (out, w) = mha_bf.attend(&xb, &xb, &xb, &causal);
        close(&out, &on("out_causal"), &format!("[{dev}] causal output"));
        close(&w.unwrap(), &on("weights_causal"), &format!("[{dev}] per-head weights"));

        // Keys and values of other widths: a projection weight per input.
        let out_proj = Linear::from_weight(on("kv.out_proj.weight"), Some(on("kv.out_proj.bias")));
        let weights = ["kv.q_proj_weight", "kv.k_proj_weight", "kv.v_proj_weight"].map(&on);
        let mha_kv = MultiheadAttention::from_separate_params(2, weights, Some(on("kv.in_proj_bias")), out_proj);
        let pad = Tensor::from_vec(vec![false, false, false, true, false, false, false, false], [2, 4], &dev).unwrap();
        let opts = MhaOptions { key_padding_mask: Some(pad), ..Default::default() };
        let (out, w) = mha_kv.attend(&on("q"), &on("kv.k"), &on("kv.v"), &opts);
        close(&out, &on("kv.out"), &format!("[{dev}] kdim/vdim output"));
        close(&w.unwrap(), &on("kv.weights"), &format!("[{dev}] kdim/vdim weights"));
        let names: Vec<String> = mha_kv.named_params().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
        );

        let fresh = MultiheadAttention::with_kv_dims(8, 2, 5, 3, &dev);
        let shapes: Vec<Vec<usize>> = fresh.named_params().into_iter().map(|(_, p)| p.dims()).collect();
        assert_eq!(shapes, [vec![8, 8], vec![8, 5], vec![8, 3], vec![24], vec![8, 8], vec![8]]);

        let rope = RotaryEmbedding::new(8).apply(&on("xr"), 2);
        close(&rope, &on("rope"), &format!("[{dev}] rotary"));
    }
}

/// `sin(0.37 i + c)` over `shape` on `dev`: deterministic inputs with no fixture.
fn sines(shape: &[usize], c: f64, dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (0.37 * i as f64 + c).sin() as f32).collect();
    Tensor::from_vec(v, shape.to_vec(), dev).unwrap()
}

/// Causal attention over more than 32 queries and keys runs by blocks of queries, each over only the keys it sees:
/// its output and its gradients for q, k and v against the full product under the same triangle given as a bool
/// mask (the unblocked path, itself checked against PyTorch in `tests/nn/attention.rs`), on every device: as many
/// queries as keys in 2 blocks, in 4 with a ragged last one, more queries than keys (the last block runs to the
/// end), more keys than queries, and 33 queries over 40 keys (a last block of one query).
/// Within f32's accumulate tolerance: the left-out keys' weights are exactly 0 in the full product, but its sums
/// run over more terms in another order.
#[test]
fn blocked_causal_attention_matches_the_masked_product() {
    let tol = tol(kiln::DType::F32, Kind::Accumulate);
    for dev in devices() {
        for (l, s) in [(64, 64), (200, 200), (300, 150), (150, 300), (33, 40)] {
            let q = sines(&[1, 2, l, 16], 0.1, &dev).requires_grad();
            let k = sines(&[1, 2, s, 16], 0.7, &dev).requires_grad();
            let v = sines(&[1, 2, s, 8], 1.3, &dev).requires_grad();
            let dy = sines(&[1, 2, l, 8], 2.1, &dev);
            let causal = F::AttentionOptions { is_causal: true, ..Default::default() };
            let tril = Tensor::ones([l, s], kiln::DType::F32, &dev).tril(0).gt(0);
            let masked = F::AttentionOptions { mask: Some(tril), ..Default::default() };
            let run = |o: &F::AttentionOptions| {
                let y = F::scaled_dot_product_attention(&q, &k, &v, o);
                let g = y.mul(&dy).sum_all().backward().unwrap();
                let grads: Vec<Tensor> = [&q, &k, &v].iter().map(|t| g.get(t).unwrap().clone()).collect();
                (y, grads)
            };
            let ((y, gs), (want, wants)) = (run(&causal), run(&masked));
            let named = std::iter::once(("output", &y, &want))
                .chain(["dq", "dk", "dv"].into_iter().zip(&gs).zip(&wants).map(|((n, g), w)| (n, g, w)));
            for (name, got, want) in named {
                assert_eq!(got.dims(), want.dims());
                if let Err(e) = compare(&got.to_host().unwrap(), &want.to_host().unwrap(), tol) {
                    panic!("[{dev}] L {l}, S {s}, {name}: {e}");
                }
            }
        }
    }
}
