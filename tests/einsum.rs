//! `Tensor::einsum` against what `torch.einsum` computed for the same operands (`tests/fixtures/einsum_torch.py`
//! writes `einsum_torch.safetensors`, operands and results in f32, for the equations below in the same order), on
//! every device in f32 and (where it runs) f64; gradients by finite differences in `tests/gradcheck.rs`; misuse
//! refused naming the subscript.

mod test_cache;

mod common;

use common::*;
use kiln::{DType, Tensor};

/// The fixture's equations and operand counts, in its order.
const CASES: [(&str, usize); 16] = [
    ("ij,jk->ik", 2),
    ("bij,bjk->bik", 2),
    ("ij->ji", 1),
    ("ii", 1),
    ("ii->i", 1),
    ("i,j->ij", 2),
    ("bn,anm,bm->ba", 3),
    ("...ij,...jk->...ik", 2),
    ("ij,jk,kl->il", 3),
    ("ba,ca", 2),
    ("ijk->", 1),
    ("ij,jk->ik", 2),
    ("iij,jk->ik", 2),
    ("Ab,aB", 2),
    ("...ij->ij", 1),
    ("bhqd,bhkd->bhqk", 2),
];

#[test]
fn einsum_matches_pytorch() {
    let Some(fixture) = Fixture::load("einsum_torch.safetensors") else { return };
    let get = |name: &str| fixture.get(name);
    for dev in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            for (i, (eq, n)) in CASES.iter().enumerate() {
                let ops: Vec<Tensor> =
                    (0..*n).map(|j| get(&format!("c{i}_in{j}")).to_dtype(dtype).to_device(&dev).unwrap()).collect();
                let refs: Vec<&Tensor> = ops.iter().collect();
                let got = Tensor::einsum(eq, &refs);
                let want = get(&format!("c{i}_out"));
                assert_eq!(got.dims(), want.dims(), "{eq} ({dtype} on {}): shape", dev.describe());
                // The fixture holds f32 (every device loads it): compared in f32 at f32's tolerance.
                let want = want.to_host().unwrap();
                if let Err(e) = check_tensor(&got.to_dtype(DType::F32), got.dims(), &want, Kind::Accumulate) {
                    panic!("{eq} ({dtype} on {}): {e}", dev.describe());
                }
            }
        }
    }
}

/// A batched matmul by einsum is the GEMM `matmul` runs: the same values, bit for bit.
#[test]
fn a_batched_product_is_the_matmul() {
    let Some(_) = data_device() else { return };
    let a = tensor(DType::F32, &(0..24).map(|i| (i as f64 * 0.37).sin()).collect::<Vec<_>>(), &[2, 3, 4]);
    let b = tensor(DType::F32, &(0..40).map(|i| (i as f64 * 0.21).cos()).collect::<Vec<_>>(), &[2, 4, 5]);
    let got = Tensor::einsum("bij,bjk->bik", &[&a, &b]).to_vec::<f32>().unwrap();
    assert_eq!(got, a.matmul(&b).to_vec::<f32>().unwrap());
}

/// Misuse panics at the caller naming what is wrong: the operand count, a size that does not broadcast, a
/// repeated or unknown output subscript, a character that is not a subscript, a rank the subscripts do not name.
#[test]
fn misuse_is_refused_naming_the_subscript() {
    let Some(_) = data_device() else { return };
    let x = tensor(DType::F32, &[0.5; 6], &[2, 3]);
    let y = tensor(DType::F32, &[0.5; 8], &[2, 4]);
    let msg = |eq: &'static str, ops: Vec<Tensor>| {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let refs: Vec<&Tensor> = ops.iter().collect();
            Tensor::einsum(eq, &refs);
        }))
        .expect_err("refused");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    };
    let m = msg("ij,jk->ik", vec![x.clone()]);
    assert!(m.contains("2 operands, 1 were given"), "{m}");
    let m = msg("ij,jk->ik", vec![x.clone(), y.clone()]);
    assert!(m.contains("subscript j has size 2") && m.contains("size 3"), "{m}");
    let m = msg("ij->ii", vec![x.clone()]);
    assert!(m.contains("i appears more than once"), "{m}");
    let m = msg("ij->ik", vec![x.clone()]);
    assert!(m.contains("k appears in no operand"), "{m}");
    let m = msg("i1->i", vec![x.clone()]);
    assert!(m.contains("'1'"), "{m}");
    let m = msg("ijk->i", vec![x.clone()]);
    assert!(m.contains("has 2 dims") && m.contains("name 3"), "{m}");
    let m = msg("ii->i", vec![x]);
    assert!(m.contains("subscript i has size 3") && m.contains("size 2"), "{m}");
}
