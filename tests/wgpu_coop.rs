//! The cooperative form of long reductions (`render::cstyle::Coop`: a workgroup folds each output, its invocations
//! striding over the reduce range, their partial results meeting in a tree over workgroup memory) run for real on the
//! wgpu device, forced with `KILN_WGSL_COOP=on` whatever the adapter (lavapipe, where CI runs, takes the generic form
//! by default: `backends/src/wgpu/mod.rs`, `reduce_form`). Held to the reference interpreter: sums, maxima with NaN,
//! minima and products over the contiguous dim (one output per workgroup) and over a strided one (32 outputs across the
//! lanes, or 8 where there are 5), lengths around the slice counts (31 to 70000, odd ones leaving slices idle), f32,
//! f16, i32 and u8 (integer sums exact in any order), and the row kernels (softmax, log_softmax, layer norm: each row
//! reduction in turn, the row's elements written by the whole workgroup). The CUDA rendering of the same form is run by
//! `tests/cuda_host.rs` and compiled by NVRTC and hiprtc in CI.
//!
//! The only test in this binary: the variable must be set before the wgpu device is created (once per process).

#![cfg(feature = "wgpu")]

mod test_cache;

mod common;

use common::{Dom, Kind, compare_on, data, tol};
use kiln::{DType, Tensor};

#[test]
fn cooperative_reductions_match_the_interpreter_on_wgpu() {
    // SAFETY: nothing else in this process reads or writes the environment yet: this is the binary's only test, and
    // no device (whose creation reads the variable) exists before this line.
    unsafe { std::env::set_var("KILN_WGSL_COOP", "on") };
    let Some(dev) = common::wgpu_device() else { return };
    let mut dtypes = vec![DType::F32, DType::I32, DType::U8];
    if dev.supports(DType::F16) {
        dtypes.push(DType::F16);
    }
    let shapes: [&[usize]; 8] =
        [&[3, 700], &[64, 1024], &[5, 33], &[300, 40], &[300, 5], &[2, 70000], &[1000, 37], &[4, 3, 257]];
    let mut checked = 0;
    for (s, shape) in shapes.iter().enumerate() {
        for (d, &dtype) in dtypes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let seed = (10 * s + d) as u64;
            // Integers in [-4, 4] (u8: [0, 4]): sums exact in f32 and i32 in any order, so the long rows compare
            // without an accumulation error that grows with the length.
            let clean = data(dtype, n, seed, Dom::Grid(if dtype == DType::U8 { 0.0 } else { -4.0 }, 4.0));
            let mut v = clean.clone();
            if dtype.is_float() {
                v[n / 2 + 1] = f64::NAN;
            }
            let x = Tensor::from_host(common::buffer(dtype, &v), shape.to_vec(), &dev).unwrap();
            let last = shape.len() as isize - 1;
            let mut outs = vec![
                ("sum over the last dim", x.sum(last, false)),
                ("max over the last dim", x.max(last, true)),
                ("min over dim 0", x.min(0, false)),
                ("sum over dim 0", x.sum(0, false)),
            ];
            if dtype == DType::F32 {
                let y = Tensor::from_host(common::buffer(dtype, &clean), shape.to_vec(), &dev).unwrap().mul(0.25);
                outs.push(("softmax", y.softmax(-1)));
                outs.push(("log_softmax", y.log_softmax(-1)));
                let cols = shape[shape.len() - 1];
                outs.push(("layer_norm", kiln::nn::functional::layer_norm(&y, &[cols], None, None, 1e-5)));
                outs.push(("product of a short range", y.narrow(last, 0, cols.min(31)).add(1.5).prod(last, false)));
            }
            for (name, out) in &outs {
                let want = kiln::capture(&[out]).unwrap().reference().unwrap().remove(0);
                let got = out.to_host().unwrap_or_else(|e| panic!("{shape:?} {dtype} {name}: {e}"));
                compare_on(&dev, &got, &want, tol(out.dtype(), Kind::Accumulate))
                    .unwrap_or_else(|e| panic!("{shape:?} {dtype} {name}: {e}"));
                checked += 1;
            }
        }
    }
    eprintln!("note: {checked} cooperative reductions checked on {}", dev.describe());
}
