//! `nn::TransformerEncoderLayer`, `TransformerDecoderLayer`, `TransformerEncoder`, `TransformerDecoder` and
//! `Transformer` against PyTorch 2.15 (`tests/fixtures/transformer_torch.py` writes the parameters, inputs, outputs
//! and gradients): a post-norm ReLU encoder layer with key padding, a pre-norm GELU encoder stack without biases
//! (causal, batch first, a final norm), a post-norm decoder layer (causal target, padded memory), a pre-norm GELU
//! decoder stack and an encoder-decoder `Transformer` (a float causal mask, padded source); the outputs and the
//! gradients of a weighted sum of them for the inputs and every parameter, on every device in f32 and f64. Plus
//! PyTorch's parameter names and the stacks' copies.

mod test_cache;

mod common;

use common::*;
use kiln::nn::{
    AttentionMasks, DecoderMasks, LayerNorm, Module, Transformer, TransformerActivation, TransformerDecoder,
    TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer, TransformerMasks, TransformerOptions,
};
use kiln::{DType, Tensor};

const E: usize = 16;
const H: usize = 4;

fn opts(gelu: bool, batch_first: bool, norm_first: bool, bias: bool) -> TransformerOptions {
    let activation = if gelu { TransformerActivation::Gelu } else { TransformerActivation::Relu };
    TransformerOptions {
        dim_feedforward: 24,
        dropout: 0.0,
        activation,
        batch_first,
        norm_first,
        bias,
        ..Default::default()
    }
}

#[test]
fn transformer_layers_and_stacks_match_pytorch_with_gradients() {
    let Some(fixture) = Fixture::load("transformer_torch.safetensors") else { return };
    let cpu = data_device().expect("the fixture loaded");
    // The masks PyTorch was given: a causal triangle (true = not allowed) and key padding.
    let causal = Tensor::ones([5, 5], DType::F32, &cpu).triu(1).gt(0.0);
    let pad = |s: usize, padded: usize| {
        let v: Vec<bool> = (0..2 * s).map(|i| i >= 2 * s - padded).collect();
        Tensor::from_vec(v, [2, s], &cpu).unwrap()
    };
    let (pad_src, pad_mem) = (pad(5, 2), pad(6, 1));
    let enc = TransformerEncoderLayer::new(E, H, opts(false, false, false, true), &cpu);
    let layer = TransformerEncoderLayer::new(E, H, opts(true, true, true, false), &cpu);
    let enc_stack = TransformerEncoder::new(&layer, 2, Some(LayerNorm::new([E], &cpu)));
    let dec = TransformerDecoderLayer::new(E, H, opts(false, false, false, true), &cpu);
    let dlayer = TransformerDecoderLayer::new(E, H, opts(true, true, true, true), &cpu);
    let dec_stack = TransformerDecoder::new(&dlayer, 2, Some(LayerNorm::new([E], &cpu)));
    let model = Transformer::new(E, H, 2, 2, opts(false, true, false, true), &cpu);
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let (causal, pad_src, pad_mem) = (on(&causal), on(&pad_src), on(&pad_mem));
            let square = Transformer::generate_square_subsequent_mask(5, &dev);
            assert_close_to_torch(&square, &fixture.get("square_subsequent_mask"), "generate_square_subsequent_mask");
            type Run<'a> = Box<dyn Fn(&[Tensor]) -> Tensor + 'a>;
            let cases: [(&str, &dyn Module, usize, Run); 5] = [
                (
                    "enc",
                    &enc,
                    1,
                    Box::new(|x| {
                        enc.forward_with(
                            &x[0],
                            AttentionMasks { key_padding_mask: Some(&pad_src), ..Default::default() },
                        )
                    }),
                ),
                (
                    "enc_stack",
                    &enc_stack,
                    1,
                    Box::new(|x| {
                        enc_stack.forward_with(
                            &x[0],
                            AttentionMasks { mask: Some(&causal), is_causal: true, ..Default::default() },
                        )
                    }),
                ),
                (
                    "dec",
                    &dec,
                    2,
                    Box::new(|x| {
                        let masks = DecoderMasks {
                            tgt: AttentionMasks { is_causal: true, ..Default::default() },
                            memory: AttentionMasks { key_padding_mask: Some(&pad_mem), ..Default::default() },
                        };
                        dec.forward_with(&x[0], &x[1], masks)
                    }),
                ),
                (
                    "dec_stack",
                    &dec_stack,
                    2,
                    Box::new(|x| dec_stack.forward_with(&x[0], &x[1], DecoderMasks::default())),
                ),
                (
                    "transformer",
                    &model,
                    2,
                    Box::new(|x| {
                        let padded = AttentionMasks { key_padding_mask: Some(&pad_mem), ..Default::default() };
                        let tgt = AttentionMasks { mask: Some(&square), ..Default::default() };
                        model.forward_with(&x[0], &x[1], TransformerMasks { src: padded, tgt, memory: padded })
                    }),
                ),
            ];
            for (prefix, module, inputs, run) in cases {
                let at = format!("{prefix} ({dtype} on {})", dev.describe());
                fixture.load_params(module, prefix, dtype, &dev);
                let xs: Vec<Tensor> = (0..inputs)
                    .map(|i| {
                        fixture.get(&format!("{prefix}.in{i}")).to_dtype(dtype).to_device(&dev).unwrap().requires_grad()
                    })
                    .collect();
                let y = run(&xs);
                assert_close_to_torch(&y, &fixture.get(&format!("{prefix}.out")), &format!("{at}: output"));
                let w = sines(y.dims(), 0.7, dtype, &dev);
                let grads = y.mul(&w).sum_all().backward().unwrap();
                for (i, x) in xs.iter().enumerate() {
                    assert_close_to_torch(
                        grads.get(x).unwrap(),
                        &fixture.get(&format!("{prefix}.grad.in{i}")),
                        &format!("{at}: input {i}'s gradient"),
                    );
                }
                for (name, p) in module.named_params() {
                    let g = grads.get(&p.get()).unwrap_or_else(|| panic!("{at}: no gradient for {name}"));
                    assert_close_to_torch(
                        g,
                        &fixture.get(&format!("{prefix}.grad.{name}")),
                        &format!("{at}: {name}'s gradient"),
                    );
                }
            }
        }
    }
}

/// PyTorch's parameter names and shapes, the stacks' layers as copies (the same values, parameters of their own),
/// a Transformer's Xavier redraw, and a decoder's (or a Transformer's) forward of one input refused with the call
/// to make.
#[test]
fn transformer_parameters_are_named_as_pytorch_and_stacks_copy() {
    let Some(dev) = data_device() else { return };
    let enc = TransformerEncoderLayer::new(E, H, TransformerOptions::default(), &dev);
    let names: Vec<(String, Vec<usize>)> = enc.named_params().into_iter().map(|(n, p)| (n, p.dims())).collect();
    let want: Vec<(String, Vec<usize>)> = [
        ("self_attn.in_proj_weight", vec![3 * E, E]),
        ("self_attn.in_proj_bias", vec![3 * E]),
        ("self_attn.out_proj.weight", vec![E, E]),
        ("self_attn.out_proj.bias", vec![E]),
        ("linear1.weight", vec![2048, E]),
        ("linear1.bias", vec![2048]),
        ("linear2.weight", vec![E, 2048]),
        ("linear2.bias", vec![E]),
        ("norm1.weight", vec![E]),
        ("norm1.bias", vec![E]),
        ("norm2.weight", vec![E]),
        ("norm2.bias", vec![E]),
    ]
    .into_iter()
    .map(|(n, d)| (n.to_string(), d))
    .collect();
    assert_eq!(names, want);
    let dec = TransformerDecoderLayer::new(E, H, opts(false, false, false, false), &dev);
    let dec_names: Vec<String> = dec.named_params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        dec_names,
        [
            "self_attn.in_proj_weight",
            "self_attn.out_proj.weight",
            "multihead_attn.in_proj_weight",
            "multihead_attn.out_proj.weight",
            "linear1.weight",
            "linear2.weight",
            "norm1.weight",
            "norm2.weight",
            "norm3.weight"
        ]
    );
    let stack = TransformerEncoder::new(&enc, 2, None);
    let params = stack.named_params();
    assert_eq!(params.len(), 24);
    assert_eq!(params[0].0, "layers.0.self_attn.in_proj_weight");
    assert_eq!(params[12].0, "layers.1.self_attn.in_proj_weight");
    let vals = |t: Tensor| t.to_dtype(DType::F32).to_vec::<f32>().unwrap();
    assert_eq!(vals(params[0].1.get()), vals(params[12].1.get()), "the layers start from the layer's values");
    assert!(!params[0].1.ptr_eq(&params[12].1), "each layer has parameters of its own");
    // A Transformer draws every parameter of two or more dims anew (Xavier-uniform), so its layers differ.
    let model = Transformer::new(E, H, 2, 1, TransformerOptions { dim_feedforward: 32, ..Default::default() }, &dev);
    let named = model.named_params();
    let get = |name: &str| named.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1.get();
    for name in ["encoder.norm.weight", "decoder.norm.bias", "decoder.layers.0.multihead_attn.in_proj_weight"] {
        get(name);
    }
    let (a, b) = (vals(get("encoder.layers.0.linear1.weight")), vals(get("encoder.layers.1.linear1.weight")));
    assert_ne!(a, b, "the encoder's layers are drawn apart");
    let bound = (6.0 / (E + 32) as f64).sqrt() as f32;
    assert!(a.iter().all(|v| v.abs() <= bound) && a.iter().any(|v| v.abs() > 0.9 * bound), "Xavier-uniform bound");
    assert_eq!(vals(get("encoder.norm.weight")), vec![1.0; E], "vectors keep their init");
    let x = Tensor::zeros([3, 2, E], DType::F32, &dev);
    for (m, name) in [(&dec as &dyn Module, "TransformerDecoderLayer"), (&model, "Transformer")] {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.forward(&x))).expect_err("refused");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(name) && msg.contains("forward_with"), "{msg}");
    }
}

/// One sequence `[L, E]` (PyTorch's unbatched input) runs as a batch of one, a key padding mask `[S]` with it;
/// a decoder given one sequence and a batch, and an input of another width than d_model, are refused.
#[test]
fn unbatched_inputs_run_as_a_batch_of_one() {
    let Some(dev) = data_device() else { return };
    let o = TransformerOptions { dim_feedforward: 24, dropout: 0.0, ..Default::default() };
    let (src, tgt) = (sines(&[5, E], 0.1, DType::F32, &dev), sines(&[4, E], 0.2, DType::F32, &dev));
    let pad = Tensor::from_vec(vec![false, false, false, true, true], [5], &dev).unwrap();
    let enc = TransformerEncoderLayer::new(E, H, o, &dev);
    let masks = AttentionMasks { key_padding_mask: Some(&pad), ..Default::default() };
    let batch_masks = AttentionMasks { key_padding_mask: Some(&pad.unsqueeze(0)), ..Default::default() };
    let one = enc.forward_with(&src, masks);
    assert_close_to_torch(
        &one,
        &enc.forward_with(&src.unsqueeze(1), batch_masks).squeeze(1),
        "encoder layer, one sequence",
    );
    let dec = TransformerDecoderLayer::new(E, H, o, &dev);
    let one = dec.forward_with(&tgt, &src, DecoderMasks::default());
    let batch = dec.forward_with(&tgt.unsqueeze(1), &src.unsqueeze(1), DecoderMasks::default());
    assert_close_to_torch(&one, &batch.squeeze(1), "decoder layer, one sequence");
    let model = Transformer::new(E, H, 1, 1, TransformerOptions { batch_first: true, ..o }, &dev);
    let one = model.forward_with(&src, &tgt, TransformerMasks::default());
    let batch = model.forward_with(&src.unsqueeze(0), &tgt.unsqueeze(0), TransformerMasks::default());
    assert_close_to_torch(&one, &batch.squeeze(0), "transformer, one sequence");
    let refused = |f: &dyn Fn()| {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).expect_err("refused");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let msg = refused(&|| {
        dec.forward_with(&tgt, &src.unsqueeze(1), DecoderMasks::default());
    });
    assert!(msg.contains("TransformerDecoderLayer") && msg.contains("both"), "{msg}");
    let msg = refused(&|| {
        enc.forward_with(&sines(&[5, 2, E + 1], 0.3, DType::F32, &dev), AttentionMasks::default());
    });
    assert!(msg.contains("d_model 16"), "{msg}");
}
