//! bf16 against PyTorch: conversions, arithmetic, a reduction, promotion, autograd and safetensors, with the values
//! PyTorch 2.15 printed (`tests/fixtures/bf16_values.py` regenerates them and `bf16_torch.safetensors`). bf16 is a
//! storage format: every op computes in f32 and rounds its result once, ties to even, as PyTorch; a sum accumulates
//! in f32. Conversions and `+ - * /` are exact functions of their operands, so those are compared bit for bit; `exp`
//! (f32's polynomial, then one rounding) may differ from PyTorch's by one bf16 ulp where the f32 result sits near a
//! bf16 tie. NaN payloads are not compared (PyTorch's vectorized conversion gives 0xffff for every NaN).
//!
//! Every device that holds bf16 runs each body; wgpu refuses bf16 (WGSL has no such type and kiln does not emulate
//! it), which `tests/errors.rs` checks at the op, at upload and at `to_device`.

mod test_cache;

mod common;

use common::devices;
use kiln::{DType, Device, Tensor, bf16, f16};

/// The devices that hold bf16: the CPU (wgpu refuses it, see `tests/errors.rs`).
fn bf16_devices() -> Vec<Device> {
    devices().into_iter().filter(|d| d.supports(DType::BF16)).collect()
}

/// `got` against PyTorch's bits `want`: equal, or both NaN.
fn same_bits(what: &str, dev: &Device, got: &[bf16], want: &[u16]) {
    assert_eq!(got.len(), want.len(), "[{dev}] {what}");
    for (i, (g, &w)) in got.iter().zip(want).enumerate() {
        let w = bf16::from_bits(w);
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "[{dev}] {what}[{i}]: got {:#06x} ({g}), PyTorch {:#06x} ({w})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

fn bits(t: &Tensor) -> Vec<bf16> {
    t.to_vec::<bf16>().expect("bf16 values")
}

// f32 bit pattern -> bf16 bits: zeros, ties both ways, the largest finite bf16 and past it, NaN, inf, subnormals
// (rounded, not flushed), and 1/3.
const F32_TO_BF16: [(u32, u16); 24] = [
    (0x00000000, 0x0000),
    (0x80000000, 0x8000),
    (0x3F800000, 0x3F80),
    (0x3F808000, 0x3F80),
    (0x3F818000, 0x3F82),
    (0x3F808001, 0x3F81),
    (0x3F807FFF, 0x3F80),
    (0xBF808000, 0xBF80),
    (0x7F7F7FFF, 0x7F7F),
    (0x7F7F8000, 0x7F80),
    (0x7F7FFFFF, 0x7F80),
    (0x7F800000, 0x7F80),
    (0xFF800000, 0xFF80),
    (0x7FC00000, 0xFFFF),
    (0x7F800001, 0xFFFF),
    (0xFFC00001, 0xFFFF),
    (0x00000001, 0x0000),
    (0x00008000, 0x0000),
    (0x00018000, 0x0002),
    (0x00010000, 0x0001),
    (0x007FFFFF, 0x0080),
    (0x00800000, 0x0080),
    (0x80008001, 0x8001),
    (0x3E2AAAAB, 0x3E2B),
];

// f64 -> bf16 (PyTorch converts through f32: the first value lands on a tie there and goes to even).
const F64_TO_BF16: [(f64, u16); 7] = [
    (1.0039062500000002, 0x3F80),
    (-1.0039062500009095, 0xBF80),
    (0.1, 0x3DCD),
    (0.3333333333333333, 0x3EAB),
    (3.3961775292304548e+38, 0x7F80),
    (1e-40, 0x0001),
    (65504.0, 0x4780),
];

// i64 -> bf16 (through f32 as well: 16777217 and -16777219 round there first).
const I64_TO_BF16: [(i64, u16); 10] = [
    (0, 0x0000),
    (1, 0x3F80),
    (-1, 0xBF80),
    (255, 0x437F),
    (256, 0x4380),
    (257, 0x4380),
    (258, 0x4381),
    (16777217, 0x4B80),
    (-16777219, 0xCB80),
    (1103806595073, 0x5380),
];

// Operands and results, as bits.
const A: [u16; 8] = [0x3F80, 0x3F81, 0x4040, 0xC020, 0x006D, 0x4396, 0x3DCD, 0x40E0];
const B: [u16; 8] = [0x3B80, 0x3B80, 0x40E0, 0x3E9A, 0x4040, 0x3FC0, 0x3E4D, 0x8000];
const ADD: [u16; 8] = [0x3F80, 0x3F82, 0x4120, 0xC00D, 0x4040, 0x4397, 0x3E9A, 0x40E0];
const MUL: [u16; 8] = [0x3B80, 0x3B81, 0x41A8, 0xBF40, 0x0124, 0x43E1, 0x3CA4, 0x8000];
const DIV: [u16; 8] = [0x4380, 0x4381, 0x3EDB, 0xC105, 0x0024, 0x4348, 0x3F00, 0xFF80];
const EXP: [u16; 8] = [0x402E, 0x402F, 0x41A1, 0x3DA8, 0x3F80, 0x7F80, 0x3F8D, 0x4489];
/// `(torch.arange(1000).to(bfloat16) * 0.01).sum()`: each product rounded to bf16, the sum accumulated in f32 and
/// rounded once.
const SUM_1000: u16 = 0x459C;
/// `(torch.arange(12.).reshape(3, 4) / 7).to(bfloat16)`, the fixture file's `matrix`.
const MATRIX: [u16; 12] =
    [0x0000, 0x3E12, 0x3E92, 0x3EDB, 0x3F12, 0x3F37, 0x3F5B, 0x3F80, 0x3F92, 0x3FA5, 0x3FB7, 0x3FC9];

fn from_bits(v: &[u16], dev: &Device) -> Tensor {
    let x: Vec<bf16> = v.iter().map(|&b| bf16::from_bits(b)).collect();
    Tensor::from_vec(x, [v.len()], dev).expect("upload")
}

#[test]
fn every_bf16_widens_exactly() {
    let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    for dev in bf16_devices() {
        let x = Tensor::from_vec(all.clone(), [all.len()], &dev).unwrap();
        let got = x.to_dtype(DType::F32).to_vec::<f32>().unwrap();
        for (g, h) in got.iter().zip(&all) {
            let w = f32::from_bits((h.to_bits() as u32) << 16);
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "[{dev}] {:#06x}: {g:e}", h.to_bits());
        }
    }
}

#[test]
fn conversions_match_pytorch() {
    for dev in bf16_devices() {
        let xs: Vec<f32> = F32_TO_BF16.iter().map(|&(b, _)| f32::from_bits(b)).collect();
        // Long enough for vector loops and a scalar tail: the edges three times over, plus one.
        let reps: Vec<f32> = xs.iter().cycle().take(3 * xs.len() + 1).copied().collect();
        let want: Vec<u16> = F32_TO_BF16.iter().map(|&(_, h)| h).cycle().take(reps.len()).collect();
        let x = Tensor::from_vec(reps, [want.len()], &dev).unwrap();
        same_bits("f32 -> bf16", &dev, &bits(&x.to_dtype(DType::BF16)), &want);

        let xs: Vec<f64> = F64_TO_BF16.iter().map(|&(x, _)| x).collect();
        let want: Vec<u16> = F64_TO_BF16.iter().map(|&(_, h)| h).collect();
        let x = Tensor::from_vec(xs, [want.len()], &dev).unwrap();
        same_bits("f64 -> bf16", &dev, &bits(&x.to_dtype(DType::BF16)), &want);

        let xs: Vec<i64> = I64_TO_BF16.iter().map(|&(x, _)| x).collect();
        let want: Vec<u16> = I64_TO_BF16.iter().map(|&(_, h)| h).collect();
        let x = Tensor::from_vec(xs, [want.len()], &dev).unwrap();
        same_bits("i64 -> bf16", &dev, &bits(&x.to_dtype(DType::BF16)), &want);

        // And back: bf16 -> f16 rounds the exact f32 value once; bf16 -> i32 truncates.
        let h = from_bits(&A, &dev);
        let want: Vec<f16> = A.iter().map(|&b| f16::from_f32(bf16::from_bits(b).to_f32())).collect();
        assert_eq!(h.to_dtype(DType::F16).to_vec::<f16>().unwrap(), want, "[{dev}] bf16 -> f16");
        let want: Vec<i32> = A.iter().map(|&b| bf16::from_bits(b).to_f32() as i32).collect();
        assert_eq!(h.to_dtype(DType::I32).to_vec::<i32>().unwrap(), want, "[{dev}] bf16 -> i32");
    }
}

#[test]
fn arithmetic_rounds_each_result_once() {
    for dev in bf16_devices() {
        let (a, b) = (from_bits(&A, &dev), from_bits(&B, &dev));
        same_bits("a + b", &dev, &bits(&(&a + &b)), &ADD);
        same_bits("a * b", &dev, &bits(&(&a * &b)), &MUL);
        same_bits("a / b", &dev, &bits(&(&a / &b)), &DIV);
        // exp: f32's polynomial then one rounding; the tolerance is one bf16 ulp (see the module doc).
        let got = bits(&a.exp());
        for (i, (g, &w)) in got.iter().zip(&EXP).enumerate() {
            let d = (g.to_bits() as i32 - w as i32).abs();
            assert!(d <= 1, "[{dev}] exp[{i}]: got {:#06x}, PyTorch {w:#06x}", g.to_bits());
        }
        let r = Tensor::arange(0, 1000, 1, &dev).to_dtype(DType::BF16);
        let s = (&r * 0.01).sum_all();
        assert_eq!(s.dtype(), DType::BF16);
        same_bits("sum", &dev, &bits(&s), &[SUM_1000]);
    }
}

#[test]
fn promotion_follows_pytorch() {
    for dev in bf16_devices() {
        let b = Tensor::ones([2], DType::BF16, &dev);
        let h = Tensor::ones([2], DType::F16, &dev);
        let f = Tensor::ones([2], DType::F32, &dev);
        let i = Tensor::ones([2], DType::I32, &dev);
        assert_eq!((&b + &h).dtype(), DType::F32, "bf16 + f16");
        assert_eq!((&b + &f).dtype(), DType::F32, "bf16 + f32");
        assert_eq!((&b + &i).dtype(), DType::BF16, "bf16 + i32");
        assert_eq!((&b + 2.5).dtype(), DType::BF16, "bf16 + a float scalar");
        assert_eq!(b.matmul(&Tensor::ones([2, 3], DType::BF16, &dev)).dtype(), DType::BF16);
        assert_eq!((&b + &h).to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    }
}

/// A matmul of bf16 operands accumulates in f32 and rounds once, as PyTorch's: 1 + 256 * 2^-8 in f32 is 2 exactly,
/// where rounding each partial sum to bf16 would stop at 1 + 2^-7 (1 + 2^-8 is a tie that goes to even).
#[test]
fn matmul_accumulates_in_f32() {
    for dev in bf16_devices() {
        let k = 257;
        let mut a = vec![bf16::from_f32(2f32.powi(-8)); k];
        a[0] = bf16::ONE;
        let x = Tensor::from_vec(a, [1, k], &dev).unwrap();
        let w = Tensor::ones([k, 1], DType::BF16, &dev);
        assert_eq!(bits(&x.matmul(&w)), vec![bf16::from_f32(2.0)], "[{dev}]");
        assert_eq!(bits(&x.sum_all()), vec![bf16::from_f32(2.0)], "[{dev}]");
    }
}

/// Gradients of bf16 leaves are bf16: d/dx sum(x * x * 0.5) = x, exact here.
#[test]
fn autograd_through_bf16() {
    for dev in bf16_devices() {
        let x = from_bits(&A[..4], &dev).requires_grad();
        let loss = (&(&x * &x) * 0.5).sum_all();
        let g = loss.backward().expect("backward");
        let gx = g.get(&x).expect("a gradient");
        assert_eq!(gx.dtype(), DType::BF16);
        same_bits("grad", &dev, &bits(gx), &A[..4]);
    }
}

/// A file `safetensors.torch.save_file` wrote loads bit for bit; kiln writes it back with the same bytes of data.
#[test]
fn safetensors_from_pytorch_load_bit_for_bit() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bf16_torch.safetensors");
    let Some(dev) = bf16_devices().into_iter().next() else { return };
    let loaded = kiln::load_safetensors(&path, &dev).expect("load");
    let get = |name: &str| &loaded.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1;
    let m = get("matrix");
    assert_eq!((m.dtype(), m.dims().to_vec()), (DType::BF16, vec![3, 4]));
    same_bits("matrix", &dev, &bits(m), &MATRIX);
    let want: Vec<u16> = F32_TO_BF16.iter().map(|&(_, h)| h).collect();
    let e = get("edges");
    // PyTorch wrote its NaNs as 0xffff: the file's bits, payloads included, come back unchanged.
    assert_eq!(bits(e).iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("again.safetensors");
    kiln::save_safetensors(&out, &[("matrix", m), ("edges", e)]).expect("save");
    let again = kiln::load_safetensors(&out, &dev).expect("reload");
    let raw = |t: &Tensor| bits(t).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (name, t) in &again {
        assert_eq!(raw(t), raw(get(name)), "{name}");
    }
}
