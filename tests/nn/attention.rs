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

/// A query whose every key the mask leaves out attends to nothing, as PyTorch 2.15's (`_safe_softmax`, every
/// backend): its output row is 0 and so are its gradients, where a plain softmax of a row of `-inf` would be NaN.
/// q, k and v as in `attention_matches_pytorch`; a bool mask with its second row all false, and a float mask with
/// its last row all `-inf` (and one `-inf` elsewhere); the loss `sum(out * sines([1, 2, 3, 3], 0.5))`. Values and
/// gradients from PyTorch (`F.scaled_dot_product_attention(q, k, v, attn_mask=m)`), on every device in f32 and f64.
#[test]
fn fully_masked_rows_attend_to_nothing_as_pytorch() {
    let bmask = [true, false, true, true, false, false, false, false, false, false, false, false, true, true, true];
    let mut fmask: Vec<f64> = (0..15).map(|i| 2.0 * ((0.37 * i as f64 + 2.0).sin() as f32 as f64)).collect();
    fmask[1] = f64::NEG_INFINITY;
    for x in &mut fmask[10..] {
        *x = f64::NEG_INFINITY;
    }
    #[rustfmt::skip]
    let want: [(&str, [&[f64]; 4]); 2] = [
        ("bool", [&[0.4946108, 0.4958053, 0.429895, 0.0, 0.0, 0.0, -0.5813146, -0.7070728, -0.737132, 0.2483471, -0.0564417, -0.3535914, 0.0, 0.0, 0.0, -0.8260884, -0.7954737, -0.6571954], &[0.5441941, 0.6103896, 0.5939718, 0.4971627, 0.0, 0.0, 0.0, 0.0, -0.0008971, -0.0219529, -0.0400376, -0.0527033, -0.0435273, 0.0037015, 0.0504293, 0.0903317, 0.0, 0.0, 0.0, 0.0, 0.0345818, 0.0217362, 0.0059488, -0.0106438], &[0.0380951, 0.1728155, 0.2841462, 0.3570189, 0.0, 0.0, 0.0, 0.0, -0.0085308, -0.0646901, -0.1120938, -0.1443263, -0.0284234, -0.112107, -0.1806174, -0.2246822, -0.0011409, 0.0039816, 0.0085651, 0.0119895, 0.0735272, 0.0731809, 0.06293, 0.0441617, 0.0, 0.0, 0.0, 0.0, 0.0307879, 0.0306097, 0.0262885, 0.0184094, -0.1356833, -0.1372279, -0.1201993, -0.0869023, 0.0313682, 0.0334373, 0.0309808, 0.0243312], &[0.3506588, 0.5590413, 0.6917602, 0.0, 0.0, 0.0, 0.2781263, 0.0996135, -0.0923814, 0.2117224, 0.1511782, 0.0701726, 0.0481322, 0.0060657, -0.0368218, -0.0423283, -0.05807, -0.0659522, 0.0, 0.0, 0.0, -0.5325382, -0.7144085, -0.7995868, -0.1404646, -0.0518654, 0.0437535, -0.1510546, 0.0891565, 0.3173007]]),
        ("float", [&[0.7456324, 0.7846546, 0.7174774, 0.4285918, 0.4760955, 0.4591618, 0.0, 0.0, 0.0, 0.3157707, 0.0761603, -0.1737582, -0.1139042, -0.0882411, -0.050635, 0.0, 0.0, 0.0], &[0.1886119, 0.2161599, 0.2144516, 0.1837183, 0.1845252, 0.1901408, 0.1700217, 0.126891, 0.0, 0.0, 0.0, 0.0, -0.2514522, -0.1967013, -0.1153277, -0.0183451, -0.0394353, 0.1119369, 0.248159, 0.350794, 0.0, 0.0, 0.0, 0.0], &[0.3509477, 0.3927177, 0.3813351, 0.3183407, -0.0181705, -0.0168804, -0.0133056, -0.0079299, -0.0362185, -0.0555856, -0.0674294, -0.070147, -0.058224, -0.0773752, -0.0860539, -0.0830857, -0.2383348, -0.2428766, -0.2145463, -0.1571781, 0.2398702, 0.1314936, 0.0053201, -0.1215736, 0.0290525, -0.0119056, -0.0512524, -0.0836624, -0.0933596, -0.0993098, -0.0918189, -0.0719007, -0.1088971, -0.0333638, 0.0466851, 0.1204154, -0.0666659, 0.0130856, 0.0910661, 0.1567212], &[0.9165125, 1.1204643, 1.1727666, 0.1766151, 0.162158, 0.1257536, 0.0396666, 0.0488243, 0.0513738, 0.0457434, 0.0536583, 0.0543107, 0.3001195, 0.296662, 0.2530527, -0.4040278, -0.4008216, -0.3433662, -0.0949227, -0.0805484, -0.0552722, -0.5912527, -0.7563471, -0.8190733, -0.257403, -0.2346841, -0.1802018, -0.2619102, -0.2258568, -0.1592349]]),
    ];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            let on = |t: Tensor| t.to_device(&dev).unwrap();
            let b = on(Tensor::from_vec(bmask.to_vec(), [3, 5], &data_device().unwrap()).unwrap());
            let f = on(tensor(dtype, &fmask, &[3, 5]));
            for ((name, want), mask) in want.iter().zip([b, f]) {
                let (q, k, v) = (
                    on(sines(&[1, 2, 3, 4], 0.1, dtype)).requires_grad(),
                    on(sines(&[1, 2, 5, 4], 0.7, dtype)).requires_grad(),
                    on(sines(&[1, 2, 5, 3], 1.3, dtype)).requires_grad(),
                );
                let opts = F::AttentionOptions { mask: Some(mask), ..Default::default() };
                let out = F::scaled_dot_product_attention(&q, &k, &v, &opts);
                let g = out.mul(on(sines(&[1, 2, 3, 3], 0.5, dtype))).sum_all().backward().unwrap();
                let got = [
                    ("output", out.clone(), vec![1, 2, 3, 3]),
                    ("q's gradient", g.get(&q).unwrap().clone(), vec![1, 2, 3, 4]),
                    ("k's gradient", g.get(&k).unwrap().clone(), vec![1, 2, 5, 4]),
                    ("v's gradient", g.get(&v).unwrap().clone(), vec![1, 2, 5, 3]),
                ];
                for ((what, t, shape), want) in got.iter().zip(want) {
                    let t = t.to_dtype(DType::F32);
                    if let Err(e) = check_tensor(&t, shape, &buffer(DType::F32, want), Kind::Accumulate) {
                        panic!("{name} mask, {what} ({dtype} on {}): {e}", dev.describe());
                    }
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
