//! `scaled_dot_product_attention` against PyTorch's math backend (masks, causal, grouped-query heads) and its
//! refusals. Blocked causal attention and `MultiheadAttention` are in `tests/attention.rs`.

use super::*;

/// scaled_dot_product_attention against PyTorch 2.15's math backend (`F.scaled_dot_product_attention` under
/// `sdpa_kernel([SDPBackend.MATH])`, q `[1, 2, 3, 4]`, k `[1, 2, 5, 4]`, v `[1, 2, 5, 3]` from `sines`): plain,
/// causal, a bool mask and a float mask with an explicit scale, on every device in f32 and f64.
#[test]
fn attention_matches_pytorch() {
    let bmask = [true, false, true, true, false, true, true, false, false, false, false, true, true, true, true];
    let want: [(&str, [f64; 18]); 4] = [
        (
            "plain",
            [
                0.18089377880096436,
                0.24879901111125946,
                0.2830304801464081,
                0.32707270979881287,
                0.3633776009082794,
                0.350501149892807,
                -0.22949227690696716,
                -0.3759308457374573,
                -0.47148895263671875,
                0.4667249321937561,
                0.24500183761119843,
                -0.00988113135099411,
                -0.17682355642318726,
                -0.20824167132377625,
                -0.2114752233028412,
                -0.34376469254493713,
                -0.24403338134288788,
                -0.11127330362796783,
            ],
        ),
        (
            "causal",
            [
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                0.063603475689888,
                -0.20672094821929932,
                -0.4490666687488556,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.6921190023422241,
                0.8338817954063416,
                0.8627825379371643,
                0.5664563179016113,
                0.7606595158576965,
                0.8519110679626465,
            ],
        ),
        (
            "bool mask",
            [
                0.4946107566356659,
                0.4958053231239319,
                0.4298950433731079,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                -0.337502121925354,
                -0.5000522136688232,
                -0.594922661781311,
                0.24834710359573364,
                -0.05644167587161064,
                -0.35359135270118713,
                0.6921190023422241,
                0.8338817954063416,
                0.8627825379371643,
                -0.738215446472168,
                -0.7141737937927246,
                -0.5934720039367676,
            ],
        ),
        (
            "float mask, scale 0.3",
            [
                0.6519885063171387,
                0.5959458351135254,
                0.45924463868141174,
                0.3347664177417755,
                0.36486607789993286,
                0.34558290243148804,
                -0.5271095037460327,
                -0.49802181124687195,
                -0.4015291631221771,
                0.6074720621109009,
                0.4933474659919739,
                0.3124506175518036,
                -0.038292884826660156,
                -0.01759551465511322,
                0.005483321845531464,
                -0.7520922422409058,
                -0.6960276961326599,
                -0.5457590818405151,
            ],
        ),
    ];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |t: Tensor| t.to_device(&dev).unwrap();
            let (q, k, v) = (
                on(sines(&[1, 2, 3, 4], 0.1, dtype)),
                on(sines(&[1, 2, 5, 4], 0.7, dtype)),
                on(sines(&[1, 2, 5, 3], 1.3, dtype)),
            );
            let b = on(Tensor::from_vec(bmask.to_vec(), [3, 5], &data_device().unwrap()).unwrap());
            let f = on(sines(&[3, 5], 2.0, dtype).mul(2.0));
            let opts = [
                F::AttentionOptions::default(),
                F::AttentionOptions { is_causal: true, ..Default::default() },
                F::AttentionOptions { mask: Some(b), ..Default::default() },
                F::AttentionOptions { mask: Some(f), scale: Some(0.3), ..Default::default() },
            ];
            for ((name, want), o) in want.iter().zip(&opts) {
                let got = F::scaled_dot_product_attention(&q, &k, &v, o).to_dtype(DType::F32);
                if let Err(e) = check_tensor(&got, &[1, 2, 3, 3], &buffer(DType::F32, want), Kind::Accumulate) {
                    panic!("attention, {name} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
}

/// Grouped-query attention (`enable_gqa`) against PyTorch 2.15's math backend: q `[1, 4, 3, 4]` (4 heads) over k
/// `[1, 2, 5, 4]` and v `[1, 2, 5, 3]` (2 heads, each serving two query heads), from `sines`, plain and causal, on
/// every device. Query heads 0 and 1 read key head 0, so the first head's rows equal `attention_matches_pytorch`'s.
#[test]
fn grouped_query_attention_matches_pytorch() {
    let want: [(&str, [f64; 36]); 2] = [
        (
            "plain",
            [
                0.18089377880096436,
                0.24879901111125946,
                0.2830304801464081,
                0.32707270979881287,
                0.3633776009082794,
                0.350501149892807,
                -0.22949227690696716,
                -0.3759308457374573,
                -0.47148895263671875,
                -0.4883125424385071,
                -0.6369902491569519,
                -0.6994541883468628,
                0.033275529742240906,
                0.07225628197193146,
                0.10145751386880875,
                0.33560308814048767,
                0.3953161835670471,
                0.4015251696109772,
                0.18348419666290283,
                0.14552363753318787,
                0.08786718547344208,
                0.5078018307685852,
                0.2893945574760437,
                0.031818993389606476,
                0.02191944420337677,
                -0.08057275414466858,
                -0.17215986549854279,
                -0.36421632766723633,
                -0.2764684855937958,
                -0.15130189061164856,
                -0.03393298387527466,
                0.0015724152326583862,
                0.036865025758743286,
                0.5202587246894836,
                0.3178533911705017,
                0.07242804765701294,
            ],
        ),
        (
            "causal",
            [
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8579846620559692,
                0.765960693359375,
                0.5702676177024841,
                0.063603475689888,
                -0.20672094821929932,
                -0.4490666687488556,
                0.9635581970214844,
                0.9950833320617676,
                0.8919286727905273,
                0.8612896800041199,
                0.7731335759162903,
                0.5803375244140625,
                0.831832766532898,
                0.7510301470756531,
                0.5685791373252869,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.9517601132392883,
                0.88107830286026,
                0.6911466717720032,
                0.5852118730545044,
                0.4576016962528229,
                0.2680572271347046,
                0.5369476079940796,
                0.8056753277778625,
                0.9653587341308594,
                0.7035096883773804,
                0.8359522819519043,
                0.855252742767334,
                0.6459369659423828,
                0.43092596530914307,
                0.15759111940860748,
            ],
        ),
    ];
    for dev in devices() {
        let on = |t: Tensor| t.to_device(&dev).unwrap();
        let (q, k, v) = (
            on(sines(&[1, 4, 3, 4], 0.1, DType::F32)),
            on(sines(&[1, 2, 5, 4], 0.7, DType::F32)),
            on(sines(&[1, 2, 5, 3], 1.3, DType::F32)),
        );
        for ((name, want), is_causal) in want.iter().zip([false, true]) {
            let o = F::AttentionOptions { is_causal, enable_gqa: true, ..Default::default() };
            let got = F::scaled_dot_product_attention(&q, &k, &v, &o);
            if let Err(e) = check_tensor(&got, &[1, 4, 3, 3], &buffer(DType::F32, want), Kind::Accumulate) {
                panic!("grouped-query attention, {name} on {}: {e}", dev.describe());
            }
        }
    }
}

#[test]
#[should_panic(expected = "enable_gqa: key's 2 heads do not divide the query's 3 heads")]
fn grouped_query_attention_needs_dividing_heads() {
    let (q, k) = (sines(&[1, 3, 3, 4], 0.1, DType::F32), sines(&[1, 2, 5, 4], 0.7, DType::F32));
    let o = F::AttentionOptions { enable_gqa: true, ..Default::default() };
    F::scaled_dot_product_attention(&q, &k, &k, &o);
}

/// Misuse of scaled_dot_product_attention is refused at the caller's line, naming what does not fit.
#[test]
#[should_panic(expected = "give a mask or is_causal, not both")]
fn attention_refuses_a_mask_with_is_causal() {
    let q = sines(&[2, 3], 0.0, DType::F32);
    let o = F::AttentionOptions { is_causal: true, mask: Some(sines(&[2, 2], 0.0, DType::F32)), ..Default::default() };
    F::scaled_dot_product_attention(&q, &q, &q, &o);
}

#[test]
#[should_panic(expected = "key's last dim 2 is not the query's 3")]
fn attention_refuses_mismatched_head_dims() {
    let (q, k) = (sines(&[2, 3], 0.0, DType::F32), sines(&[4, 2], 0.0, DType::F32));
    F::scaled_dot_product_attention(&q, &k, &k, &F::AttentionOptions::default());
}
