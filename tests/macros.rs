//! `fuse!` and `einsum!` as a user writes them (these compiling is the compile-pass half; the compile-fail half is
//! `macros/tests/compile_fail.rs`): `fuse!` equals the unfused expression bit for bit and schedules to one kernel,
//! `einsum!`'s two forms equal `Tensor::einsum`, and a size mismatch panics at the macro's line naming the index.

mod test_cache;

mod common;

use common::*;
use kiln::{DType, Tensor, einsum, fuse};

fn values(n: usize, c: f64) -> Vec<f64> {
    (0..n).map(|i| (0.37 * i as f64 + c).sin()).collect()
}

#[test]
fn fuse_is_the_expression_in_one_kernel() {
    let Some(_) = data_device() else { return };
    let a = tensor(DType::F32, &values(6 * 5, 0.1), &[6, 5]);
    let b = tensor(DType::F32, &values(5, 0.7), &[5]);
    let big = tensor(DType::F32, &values(1 << 18, 0.3), &[1 << 18]);
    let scale = 0.5;
    let bref = &b;
    // (what fuse! returned, the same expression unfused, the kernels its graph schedules to)
    let cases: Vec<(&str, Tensor, Tensor)> = vec![
        ("sin, powf", fuse!(a.sin().powf(2.0)), a.sin().powf(2.0)),
        ("broadcast bias, scalar variable, reference", fuse!((&a * scale + bref).relu()), (&a * scale + bref).relu()),
        ("cast and compare", fuse!(a.gt(0.0).to_dtype(DType::F32) * a.exp()), a.gt(0.0).to_dtype(DType::F32) * a.exp()),
        ("a reduction last", fuse!((a.sin() * 2.0 + 1.0).sum(1, false)), (a.sin() * 2.0 + 1.0).sum(1, false)),
        // Large enough to run as partial sums over all cores and their fold: one kernel all the same.
        ("a full sum of 2^18", fuse!((big.cos() * &big).sum_all()), (big.cos() * &big).sum_all()),
    ];
    // The count sees more than one kernel where there is more (what the debug check would catch).
    let two = a.matmul(&a.t()).softmax(-1);
    assert!(kiln::__private::kernel_count(&two).is_some_and(|k| k > 1));
    for (name, got, want) in cases {
        let kernels = kiln::__private::kernel_count(&got);
        assert_eq!(kernels, Some(1), "{name}: {kernels:?} kernels");
        assert_eq!(got.dims(), want.dims(), "{name}");
        assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "{name}: not bit for bit");
    }
}

#[test]
fn einsum_forms_equal_the_runtime_einsum() {
    let Some(_) = data_device() else { return };
    let a = tensor(DType::F32, &values(2 * 3 * 4, 0.2), &[2, 3, 4]);
    let b = tensor(DType::F32, &values(2 * 4 * 5, 0.9), &[2, 4, 5]);
    let want = Tensor::einsum("bij,bjk->bik", &[&a, &b]).to_vec::<f32>().unwrap();
    let index_form = einsum!((batch, i, j) = a[batch, i, k] * b[batch, k, j]);
    let text_form = einsum!("bij,bjk->bik", a, b);
    assert_eq!(index_form.to_vec::<f32>().unwrap(), want);
    assert_eq!(text_form.to_vec::<f32>().unwrap(), want);
    // Operands as expressions, a trace (no output index), an outer product.
    let m = tensor(DType::F32, &values(9, 0.4), &[3, 3]);
    let trace = einsum!(() = (m.t())[i, i]);
    assert_eq!(trace.to_vec::<f32>().unwrap(), Tensor::einsum("ii", &[&m]).to_vec::<f32>().unwrap());
    let u = tensor(DType::F32, &values(3, 0.5), &[3]);
    let outer = einsum!((i, j) = u[i] * u[j]);
    assert_eq!(outer.to_vec::<f32>().unwrap(), Tensor::einsum("i,j->ij", &[&u, &u]).to_vec::<f32>().unwrap());
}

/// Typed operands (sizes in their types, checked when this file compiles) give what plain tensors give, alone,
/// mixed with plain tensors, and with a repeated index (a diagonal).
#[test]
fn einsum_of_typed_operands() {
    use kiln::{Tensor1, Tensor2, Tensor3};
    let Some(_) = data_device() else { return };
    let a = tensor(DType::F32, &values(2 * 3 * 4, 0.2), &[2, 3, 4]);
    let b = tensor(DType::F32, &values(2 * 4 * 5, 0.9), &[2, 4, 5]);
    let want = Tensor::einsum("bij,bjk->bik", &[&a, &b]).to_vec::<f32>().unwrap();
    let (ta, tb): (Tensor3<2, 3, 4>, Tensor3<2, 4, 5>) = (Tensor3::new(a.clone()), Tensor3::new(b.clone()));
    assert_eq!(einsum!((n, i, j) = ta[n, i, k] * tb[n, k, j]).to_vec::<f32>().unwrap(), want);
    assert_eq!(einsum!("bij,bjk->bik", ta, b).to_vec::<f32>().unwrap(), want);
    assert_eq!(einsum!("bij,bjk->bik", &a, &tb).to_vec::<f32>().unwrap(), want);
    let m: Tensor2<3, 3> = Tensor2::new(tensor(DType::F32, &values(9, 0.4), &[3, 3]));
    let v: Tensor1<3> = Tensor1::new(tensor(DType::F32, &values(3, 0.5), &[3]));
    let got = einsum!((i) = m[i, i] * v[i]).to_vec::<f32>().unwrap();
    assert_eq!(got, Tensor::einsum("ii,i->i", &[&m, &v]).to_vec::<f32>().unwrap());
    // A tensor whose shape is not its type's is refused where it is wrapped.
    let line = line!() + 1;
    let wrap = || drop(Tensor2::<3, 4>::new(a.clone()));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wrap)).expect_err("refused");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("[2, 3, 4]") && msg.contains(&format!("macros.rs:{line}")), "{msg}");
}

/// With shapes known only at run time, a mismatch panics at the macro's line, naming the index and both sizes.
#[test]
fn einsum_size_mismatch_panics_at_the_macro() {
    let Some(_) = data_device() else { return };
    let a = tensor(DType::F32, &values(6, 0.0), &[2, 3]);
    let b = tensor(DType::F32, &values(8, 0.0), &[2, 4]);
    let line = line!() + 2;
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        einsum!((i, j) = a[i, k] * b[k, j]);
    }))
    .expect_err("refused");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("subscript b has size 2") && msg.contains("size 3"), "{msg}");
    assert!(msg.contains(&format!("tests/macros.rs:{line}")), "not at the macro's line {line}: {msg}");
}
