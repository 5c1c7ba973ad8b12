//! f16 conversions and rounding in generated code, bit for bit against the `half` crate (the reference: correctly
//! rounded, ties to even). One body per device: the CPU's Cranelift bit manipulation (vector loops and scalar
//! tails: every length here leaves a tail) and the WGSL helpers on wgpu, where the adapter has SHADER_F16.
//!
//! Covered: every one of the 65536 f16 bit patterns widened to f32; f32 -> f16 at every edge (signed zeros,
//! infinities, NaN, the largest finite value and the first value that overflows, subnormals and the boundaries
//! between subnormal and normal and between zero and the smallest subnormal, ties to even in both ranges) and on
//! 2^16 random f32 bit patterns spanning all exponents; f64 -> f16 where rounding through f32 would differ (CPU:
//! wgpu has no f64); an op whose exact result is a tie (computed in f32, rounded to f16); int -> f16.

mod test_cache;

mod common;

use common::{Rng, devices, runs_on};
use kiln::{DType, Device, Tensor, f16};

/// `got` and `want` as f16 bit patterns: equal bits, or both NaN (a NaN's payload is not asserted).
fn same_f16(got: &[f16], want: &[f16]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements (want {})", got.len(), want.len()));
    }
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())))
        .take(8)
        .map(|(i, (g, w))| format!("[{i}] got {:#06x} ({g}), want {:#06x} ({w})", g.to_bits(), w.to_bits()))
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(bad.join(", ")) }
}

/// The devices that hold f16 (the CPU always; wgpu with SHADER_F16, else one line says it is skipped).
fn f16_devices() -> Vec<Device> {
    devices().into_iter().filter(|d| runs_on(d, &[DType::F16])).collect()
}

/// f32 values whose f16 rounding is an edge case.
fn f32_edges() -> Vec<f32> {
    let p = |e: i32| 2f32.powi(e);
    let mut v = vec![
        0.0,
        f32::INFINITY,
        f32::NAN,
        f32::from_bits(0x7f80_0001), // a signalling NaN
        65504.0,                     // the largest finite f16
        65519.99,                    // rounds down to it
        65520.0,                     // the tie: rounds to even, which is inf
        65536.0,
        1e10,
        f32::MAX,
        p(-14),                // the smallest normal f16
        p(-14) - p(-25),       // rounds up to it
        p(-14) - p(-24),       // the largest subnormal, exactly
        p(-24),                // the smallest subnormal
        p(-25),                // half of it: a tie, rounds to even (zero)
        p(-25) + p(-40),       // just above the tie: the smallest subnormal
        3.0 * p(-25),          // a tie between 1 and 2 units: rounds to 2
        5.0 * p(-25),          // a tie between 2 and 3 units: rounds to 2
        p(-26),                // rounds to zero
        f32::from_bits(1),     // the smallest f32 subnormal
        f32::MIN_POSITIVE,     // the smallest normal f32
        1.0 + p(-11),          // a tie: rounds to even, 1.0
        1.0 + 3.0 * p(-11),    // a tie: rounds to even, 1 + 2^-9
        1.0 + p(-11) + p(-20), // above the tie: rounds up
        2049.0,                // a tie at the integer limit: 2048
        2051.0,                // a tie: 2052
        0.1,
        std::f32::consts::PI,
        1.0 / 3.0,
    ];
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// Runs `f` on every f16 device, collecting every failure.
fn on_devices(what: &str, f: impl Fn(&Device) -> Result<(), String>) {
    let errors: Vec<String> = f16_devices().iter().filter_map(|d| f(d).err().map(|e| format!("[{d}] {e}"))).collect();
    assert!(errors.is_empty(), "{what}:\n  {}", errors.join("\n  "));
}

#[test]
fn every_f16_widens_exactly() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    on_devices("f16 -> f32", |dev| {
        let x = Tensor::from_vec(all.clone(), [all.len()], dev).map_err(|e| e.to_string())?;
        let got = x.to_dtype(DType::F32).to_vec::<f32>().map_err(|e| e.to_string())?;
        let bad: Vec<String> = got
            .iter()
            .zip(&all)
            .filter(|(g, h)| !(g.to_bits() == h.to_f32().to_bits() || (g.is_nan() && h.is_nan())))
            .take(8)
            .map(|(g, h)| format!("{:#06x}: got {g:e}, want {:e}", h.to_bits(), h.to_f32()))
            .collect();
        if bad.is_empty() { Ok(()) } else { Err(bad.join(", ")) }
    });
}

#[test]
fn f32_edges_round_to_nearest_even() {
    rounds_like_half("f32 -> f16 at the edges", f32_edges());
}

/// `to_dtype(F16)` of `xs` on every device gives `half`'s f16 for each, bit for bit.
fn rounds_like_half(what: &str, xs: Vec<f32>) {
    let want: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
    on_devices(what, |dev| {
        let x = Tensor::from_vec(xs.clone(), [xs.len()], dev).map_err(|e| e.to_string())?;
        same_f16(&x.to_dtype(DType::F16).to_vec::<f16>().map_err(|e| e.to_string())?, &want)
    });
}

#[test]
fn random_f32_round_to_nearest_even() {
    let mut r = Rng(0xf16);
    // Random bits: every exponent equally likely, so about a third of them land in f16's range or its rounding
    // boundaries, the rest overflow to inf or round to zero.
    rounds_like_half("f32 -> f16 on random bits", (0..1 << 16).map(|_| f32::from_bits(r.next_u64() as u32)).collect());
}

#[test]
fn f64_rounds_once() {
    let p = |e: i32| 2f64.powi(e);
    // Through f32 these would first become the tie 1 + 2^-11 and then round to 1.0; rounded once they go up.
    let xs = vec![1.0 + p(-11) + p(-40), -(1.0 + p(-11) + p(-40)), 65519.999999, p(-25) + p(-60), 1e300, -0.0];
    let want: Vec<f16> = xs.iter().map(|&x| f16::from_f64(x)).collect();
    on_devices("f64 -> f16", |dev| {
        if !runs_on(dev, &[DType::F64]) {
            return Ok(()); // no f64 on wgpu (errors.rs checks the refusal)
        }
        let x = Tensor::from_vec(xs.clone(), [xs.len()], dev).map_err(|e| e.to_string())?;
        same_f16(&x.to_dtype(DType::F16).to_vec::<f16>().map_err(|e| e.to_string())?, &want)
    });
}

#[test]
fn ops_round_each_result() {
    // 2048 + 1 = 2049 is a tie in f16 (rounds to 2048), 2048 + 3 rounds to 2052; x * x of 1 + 2^-10 is
    // 1 + 2^-9 + 2^-20, which rounds to 1 + 2^-9. The sum is then reused, so a missing rounding shows.
    let a: Vec<f16> = [2048.0f32, 2048.0, 1.0 + 2f32.powi(-10), 65504.0, -2048.0, 0.5].map(f16::from_f32).to_vec();
    let b: Vec<f16> = [1.0f32, 3.0, 0.0, 65504.0, -1.0, 2f32.powi(-24)].map(f16::from_f32).to_vec();
    let r = |x: f32| f16::from_f32(x);
    let want: Vec<f16> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| {
            let s = r(x.to_f32() + y.to_f32());
            let p = r(x.to_f32() * x.to_f32());
            r(s.to_f32() - p.to_f32())
        })
        .collect();
    on_devices("(a + b) - a * a in f16", |dev| {
        let x = Tensor::from_vec(a.clone(), [a.len()], dev).map_err(|e| e.to_string())?;
        let y = Tensor::from_vec(b.clone(), [b.len()], dev).map_err(|e| e.to_string())?;
        let out = (&x + &y) - x.mul(&x);
        same_f16(&out.to_vec::<f16>().map_err(|e| e.to_string())?, &want)
    });
}

#[test]
fn ints_convert_with_one_rounding() {
    let xs: Vec<i32> = vec![0, 1, -1, 2049, 2051, 65504, 65519, 65520, -65520, i32::MAX, i32::MIN, 16_777_217];
    let want: Vec<f16> = xs.iter().map(|&x| f16::from_f64(x as f64)).collect();
    on_devices("i32 -> f16", |dev| {
        let x = Tensor::from_vec(xs.clone(), [xs.len()], dev).map_err(|e| e.to_string())?;
        same_f16(&x.to_dtype(DType::F16).to_vec::<f16>().map_err(|e| e.to_string())?, &want)
    });
}

/// f16 leaves take gradients by the same rules as f32 ones: the gradient has the leaf's dtype, each backward op
/// rounds to f16, and a matmul's gradient accumulates in f32. Held to f16's tolerances against the exact values.
#[test]
fn gradients_flow_through_f16() {
    use common::{Kind, compare_on, tol};
    let xs: Vec<f32> = vec![0.5, -1.25, 2.0, 0.75, -0.125, 1.5];
    let ws: Vec<f32> = vec![0.25, -0.5, 1.0, 0.125, -2.0, 0.375];
    on_devices("d/dw sum(tanh(x @ w)) and d/dx", |dev| {
        let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
        let x = Tensor::from_vec(h(&xs), [2, 3], dev).map_err(|e| e.to_string())?.requires_grad();
        let w = Tensor::from_vec(h(&ws), [3, 2], dev).map_err(|e| e.to_string())?.requires_grad();
        let grads = x.matmul(&w).tanh().sum_all().backward().map_err(|e| e.to_string())?;
        let (gx, gw) = (grads.get(&x).ok_or("no grad for x")?, grads.get(&w).ok_or("no grad for w")?);
        if gx.dtype() != DType::F16 || gw.dtype() != DType::F16 {
            return Err(format!("gradient dtypes {} and {}", gx.dtype(), gw.dtype()));
        }
        // Exact: y = x @ w, d = 1 - tanh(y)^2; dx = d @ w^T, dw = x^T @ d.
        let at = |v: &[f32], r: usize, c: usize, cols: usize| v[r * cols + c] as f64;
        let d: Vec<f64> = (0..4)
            .map(|i| {
                let y: f64 = (0..3).map(|k| at(&xs, i / 2, k, 3) * at(&ws, k, i % 2, 2)).sum();
                1.0 - y.tanh().powi(2)
            })
            .collect();
        let dx: Vec<f64> = (0..6).map(|i| (0..2).map(|j| d[(i / 3) * 2 + j] * at(&ws, i % 3, j, 2)).sum()).collect();
        let dw: Vec<f64> = (0..6).map(|i| (0..2).map(|r| at(&xs, r, i / 2, 3) * d[r * 2 + i % 2]).sum()).collect();
        let t = tol(DType::F16, Kind::Accumulate);
        let got = |g: &Tensor| g.to_host().map_err(|e| e.to_string());
        compare_on(dev, &got(gx)?, &common::buffer(DType::F16, &dx), t)?;
        compare_on(dev, &got(gw)?, &common::buffer(DType::F16, &dw), t)
    });
}

#[cfg(feature = "cpu")]
/// An f16 matmul runs as the f32 GEMM (operands converted and materialized, one rounding of the f32 result), so the
/// generated GEMM and the tiled WGSL template serve it; and its value is the interpreter's.
#[test]
fn f16_matmul_is_an_f32_gemm() {
    use kiln_jit::kernel::{gemm::GemmView, schedule};
    let a = common::tensor(DType::F16, &common::data(DType::F16, 64 * 48, 1, common::Dom::Cont(-1.0, 1.0)), &[64, 48]);
    let b = common::tensor(DType::F16, &common::data(DType::F16, 48 * 32, 2, common::Dom::Cont(-1.0, 1.0)), &[48, 32]);
    let out = a.matmul(&b);
    assert_eq!(out.dtype(), DType::F16);
    let cap = kiln::capture(&[&out]).unwrap();
    let plan = schedule(&cap.graph);
    let gemms: Vec<_> = plan.launches.iter().filter(|l| GemmView::of(&l.kernel).is_some()).collect();
    assert_eq!(gemms.len(), 1, "one f32 GEMM kernel expected:\n{:#?}", plan.launches.iter().map(|l| &l.kernel.name));
    let want = cap.reference().unwrap().remove(0);
    on_devices("f16 matmul", |dev| {
        let got = a.to_device(dev).unwrap().matmul(&b.to_device(dev).unwrap()).to_host().map_err(|e| e.to_string())?;
        common::compare_on(dev, &got, &want, common::tol(DType::F16, common::Kind::Accumulate))
    });
}

#[cfg(feature = "cpu")]
/// An f16 matmul with K = 1 is the broadcast product, as in f32: no GEMM, no reduction, and each element is the
/// product rounded once (exact in f32, so what the f32-accumulating GEMM would give), a `-0.0` product included.
#[test]
fn f16_k1_matmul_is_the_rounded_product() {
    let av = [1.5f32, -0.0, 3.0e-3, -2.0, 7.0];
    let bv = [0.333f32, -1.0, 0.0, 65504.0, -6.1e-5, 2.5];
    let a: Vec<f16> = av.iter().map(|&x| f16::from_f32(x)).collect();
    let b: Vec<f16> = bv.iter().map(|&x| f16::from_f32(x)).collect();
    let want: Vec<f16> = a.iter().flat_map(|x| b.iter().map(move |y| f16::from_f32(x.to_f32() * y.to_f32()))).collect();
    let at = Tensor::from_vec(a.clone(), [5, 1], &Device::cpu()).unwrap();
    let bt = Tensor::from_vec(b.clone(), [1, 6], &Device::cpu()).unwrap();
    let plan = kiln_jit::kernel::schedule(&kiln::capture(&[&at.matmul(&bt)]).unwrap().graph);
    assert!(plan.launches.iter().all(|l| l.kernel.reduce.is_none()), "a K = 1 f16 matmul kept a reduction");
    on_devices("f16 K = 1 matmul", |dev| {
        let out = at.to_device(dev).unwrap().matmul(&bt.to_device(dev).unwrap());
        let got: Vec<f16> = out.to_vec().map_err(|e| e.to_string())?;
        same_f16(&got, &want)
    });
}

/// Sums and means of f16 accumulate in f32, as PyTorch's: a sum past 65504 overflows only when rounded to f16 (inf),
/// and a mean is divided in f32 before its one rounding (the mean of 100000 ones was NaN: the count was an f16 inf).
/// Values PyTorch 2.15 printed: `torch.ones(n, dtype=torch.float16).sum()` 1000 / 10000 / inf,
/// `.mean()` 1.0 for each n; `torch.full((70000,), 0.1, dtype=torch.float16).mean()` 0.0999755859375.
#[test]
fn sums_and_means_accumulate_in_f32() {
    on_devices("sums and means of f16", |dev| {
        for (n, sum) in [(1000usize, 1000.0f32), (10000, 10000.0), (100000, f32::INFINITY)] {
            let x = Tensor::ones([n], DType::F16, dev);
            let got = x.sum_all().to_host().map_err(|e| e.to_string())?.to_f64()[0] as f32;
            let mean = x.mean_all().to_host().map_err(|e| e.to_string())?.to_f64()[0];
            if got != sum || mean != 1.0 {
                return Err(format!("{n} ones: sum {got} (want {sum}), mean {mean} (want 1)"));
            }
        }
        let x = Tensor::full([70000], 0.1, DType::F16, dev);
        let mean = x.mean([0], false).to_host().map_err(|e| e.to_string())?.to_f64()[0];
        if mean != 0.0999755859375 {
            return Err(format!("mean of 70000 x f16(0.1): {mean}, want 0.0999755859375"));
        }
        Ok(())
    });
}

/// f16 softmax, log_softmax and layer_norm are computed in f32 and rounded once, as PyTorch computes them (float
/// accumulation): bits PyTorch 2.15 printed for 64 values `((i * 37 % 101) - 50) / 10` as f16 (`layer_norm` with eps
/// 1e-5). Softmax and layer_norm match bit for bit; log_softmax within one f16 ulp (PyTorch orders its terms
/// differently). Step by step in f16, layer_norm's mean and variance were rounded first (up to 2 ulps off here, and a
/// drift of the output's mean).
#[test]
fn softmax_and_layer_norm_round_once_like_pytorch() {
    const LAYER_NORM: [u16; 64] = [
        48829, 46826, 14992, 48482, 44542, 15523, 48136, 13271, 15869, 47450, 14507, 48725, 46410, 15199, 48378, 8208,
        15626, 47935, 13707, 15973, 47242, 14715, 48620, 45909, 15384, 48274, 12034, 15731, 47728, 14123, 16077, 46965,
        14923, 48517, 45076, 15488, 48170, 12993, 15835, 47519, 14437, 48760, 46548, 15130, 48413, 42658, 15592, 48005,
        13568, 15939, 47311, 14646, 48656, 46132, 15339, 48309, 11479, 15696, 47797, 13984, 16042, 47103, 14853, 48551,
    ];
    const LOG_SOFTMAX: [u16; 64] = [
        51704, 51231, 50314, 51576, 51005, 49940, 51448, 50749, 49429, 51320, 50493, 51666, 51184, 50238, 51538, 50928,
        49787, 51410, 50672, 49275, 51282, 50416, 51627, 51108, 50145, 51500, 50852, 49633, 51372, 50596, 49090, 51244,
        50340, 51589, 51031, 49991, 51461, 50775, 49479, 51333, 50519, 51679, 51205, 50263, 51551, 50954, 49838, 51423,
        50698, 49325, 51295, 50442, 51640, 51133, 50186, 51512, 50877, 49684, 51384, 50621, 49173, 51256, 50366, 51602,
    ];
    const SOFTMAX: [u16; 64] = [
        110, 3156, 8569, 298, 4578, 10096, 810, 6143, 11531, 2124, 7535, 148, 3543, 9057, 402, 5104, 10500, 1094, 6501,
        11984, 2509, 8021, 200, 4066, 9468, 542, 5468, 10950, 1474, 6984, 12442, 3028, 8436, 269, 4435, 9915, 733,
        5948, 11411, 1992, 7402, 134, 3402, 8878, 363, 4911, 10378, 988, 6370, 11822, 2368, 7843, 181, 3875, 9347, 491,
        5337, 10786, 1335, 6807, 12329, 2838, 8314, 244,
    ];
    let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.1).collect();
    on_devices("f16 composites", |dev| {
        let x = Tensor::from_vec(x.clone(), [1, 64], dev).map_err(|e| e.to_string())?.to_dtype(DType::F16);
        let bits = |t: Tensor| -> Result<Vec<u16>, String> {
            Ok(t.to_vec::<f16>().map_err(|e| e.to_string())?.iter().map(|h| h.to_bits()).collect())
        };
        let ln = bits(kiln::nn::functional::layer_norm(&x, &[64], None, None, 1e-5))?;
        let ls = bits(x.log_softmax(-1))?;
        let sm = bits(x.softmax(-1))?;
        for (name, got, want, ulps) in
            [("layer_norm", ln, LAYER_NORM, 0), ("log_softmax", ls, LOG_SOFTMAX, 1), ("softmax", sm, SOFTMAX, 0)]
        {
            if let Some(i) = (0..64).find(|&i| got[i].abs_diff(want[i]) > ulps) {
                return Err(format!("{name}[{i}]: {:#06x}, PyTorch {:#06x}", got[i], want[i]));
            }
        }
        Ok(())
    });
}
