//! `Display for Tensor` against PyTorch's `repr`: the tensors of `tests/fixtures/tensor_display.py`, built here
//! the same way, must print exactly what PyTorch printed for them (`tests/fixtures/tensor_display.txt`, kiln's
//! dtype names substituted): float formats (whole, fixed, scientific, non-finite), integer and bool alignment,
//! line wrapping, summarization past 1000 elements, 0-d and empty tensors, the dtype suffix. `{:?}` stays metadata
//! and never computes.

mod test_cache;

mod common;

use kiln::{DType, Tensor};
#[cfg(feature = "cpu")]
use kiln::{Device, f16};

#[cfg(feature = "cpu")]
fn t<T: kiln::Element>(v: Vec<T>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(v, dims.to_vec(), &Device::cpu()).unwrap()
}

#[cfg(feature = "cpu")]
fn cases() -> Vec<(&'static str, Tensor)> {
    let range = |n: usize| (0..n).map(|i| i as f32).collect::<Vec<_>>();
    vec![
        ("whole_matrix", t(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])),
        ("fixed", t(vec![0.5f32, 1.25, -3.0], &[3])),
        ("scientific", t(vec![1e-5f32, 1.0, -250.0], &[3])),
        ("non_finite", t(vec![1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0], &[5])),
        ("f64_3d", t((0..12).map(|i| i as f64 / 3.0).collect(), &[2, 2, 3])),
        ("i64", t((0..5i64).collect(), &[5])),
        ("i32", t(vec![-1i32, 20, 300], &[3])),
        ("bool", t(vec![true, false, true], &[3])),
        ("u8", t(vec![0u8, 7, 255], &[3])),
        ("f16", t(vec![f16::from_f32(0.1), f16::from_f32(2.0)], &[2])),
        ("zeros", Tensor::zeros([3], DType::F32, &Device::cpu())),
        ("scalar", t(vec![3.5f32], &[])),
        ("empty", t(Vec::<f32>::new(), &[0])),
        ("empty_2d", t(Vec::<f32>::new(), &[0, 3])),
        ("wrap", t(range(30).into_iter().map(|x| x * 1.5).collect(), &[30])),
        ("summarized_2d", t(range(2000).into_iter().map(|x| x / 7.0).collect(), &[40, 50])),
        ("summarized_3d", t((0..3000i64).collect(), &[10, 10, 30])),
        ("big_whole", t(vec![1e9f32, 2.0], &[2])),
        ("summarized_1d", t(range(1001), &[1001])),
    ]
}

#[cfg(feature = "cpu")]
/// The fixture's `=== name` sections.
fn expected() -> Vec<(String, String)> {
    let text = include_str!("fixtures/tensor_display.txt");
    text.split("=== ")
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (name, body) = s.split_once('\n').unwrap();
            (name.to_string(), body.trim_end_matches('\n').to_string())
        })
        .collect()
}

#[cfg(feature = "cpu")]
#[test]
fn tensors_print_as_pytorch_prints_them() {
    let want = expected();
    let cases = cases();
    assert_eq!(want.len(), cases.len(), "one fixture section per case");
    for ((name, t), (want_name, want)) in cases.iter().zip(&want) {
        assert_eq!(name, want_name);
        assert_eq!(format!("{t}"), *want, "{name}");
    }
}

#[cfg(feature = "cpu")]
#[test]
fn a_lazy_tensor_is_computed_for_display_and_not_for_debug() {
    let x = t(vec![1.0f32, 2.0], &[2]).exp().mul(0.0).add(1.0);
    let debug = format!("{x:?}");
    assert!(debug.contains("lazy"), "{debug}");
    // The tensor's own state, not the process-wide counters: the other tests here realize in parallel.
    assert!(!x.is_realized(), "Debug realizes nothing");
    assert_eq!(format!("{x}"), "tensor([1., 1.])");
}

#[test]
fn other_devices_are_named() {
    let Some(w) = common::wgpu_device() else { return };
    let x = Tensor::from_vec(vec![0.5f32, 1.0], [2], &w).unwrap();
    assert_eq!(format!("{x}"), "tensor([0.5000, 1.0000], device=wgpu)");
    assert_eq!(format!("{}", x.to_dtype(DType::I32)), "tensor([0, 1], device=wgpu, dtype=i32)");
}
