//! `fmod` and `remainder` against PyTorch 2.15's values on every device: signs of both operands, a quotient far
//! past 2^24 (where `x - y * trunc(x / y)` loses every digit and an exact fmod does not), zeros, infinities and
//! NaN, integer semantics. Gradients in `tests/gradcheck.rs`.

mod test_cache;

mod common;

use common::*;
use kiln::DType::{F32, F64, I32, I64};

const A: [f64; 12] = [5.5, -5.5, 5.5, -5.5, 1e10, -3e9, 7.0, 0.0, -0.0, 1.0, f64::INFINITY, 2.5];
const B: [f64; 12] = [2.0, 2.0, -2.0, -2.0, 3.3, 0.7, f64::INFINITY, 3.0, 3.0, 0.0, 2.0, f64::NAN];

#[test]
fn fmod_and_remainder_match_pytorch() {
    // torch.fmod / torch.remainder on the f32 tensors A and B.
    let fmod =
        [1.5, -1.5, 1.5, -1.5, 0.2961106300354004, -0.4896963834762573, 7.0, 0.0, -0.0, f64::NAN, f64::NAN, f64::NAN];
    let rem =
        [1.5, 0.5, -0.5, -1.5, 0.2961106300354004, 0.21030360460281372, 7.0, 0.0, -0.0, f64::NAN, f64::NAN, f64::NAN];
    for dev in devices() {
        let a = tensor(F32, &A, &[12]).to_device(&dev).unwrap();
        let b = tensor(F32, &B, &[12]).to_device(&dev).unwrap();
        for (name, got, want) in [("fmod", a.fmod(&b), &fmod), ("remainder", a.remainder(&b), &rem)] {
            if let Err(e) = check_tensor(&got, &[12], &buffer(F32, want), Kind::Exact) {
                panic!("[{dev}] {name}: {e}");
            }
        }
        for d in [I32, I64] {
            if !runs_on(&dev, &[d]) {
                continue;
            }
            let ai = tensor(d, &[7.0, -7.0, 7.0, -7.0, 0.0], &[5]).to_device(&dev).unwrap();
            let bi = tensor(d, &[3.0, 3.0, -3.0, -3.0, 5.0], &[5]).to_device(&dev).unwrap();
            assert_eq!(vals(&ai.fmod(&bi)), [1.0, -1.0, 1.0, -1.0, 0.0], "[{dev}] {d} fmod");
            assert_eq!(vals(&ai.remainder(&bi)), [1.0, 2.0, -2.0, -1.0, 0.0], "[{dev}] {d} remainder");
            // kiln-defined (PyTorch raises): x % 0 is 0.
            assert_eq!(vals(&ai.fmod(0)), [0.0; 5], "[{dev}] {d} fmod by zero");
        }
        if runs_on(&dev, &[F64]) {
            let a = tensor(F64, &[1e300, 5.5], &[2]).to_device(&dev).unwrap();
            let b = tensor(F64, &[3.3, -2.0], &[2]).to_device(&dev).unwrap();
            assert_eq!(vals(&a.fmod(&b)), [0.6893925374809653, 1.5], "[{dev}] f64");
        }
        // A scalar divisor.
        assert_eq!(vals(&tensor(F32, &[-7.5], &[1]).to_device(&dev).unwrap().remainder(2.0)), [0.5], "[{dev}]");
    }
}
