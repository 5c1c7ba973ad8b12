//! Helpers shared by `tests/props.rs` and `tests/errors.rs`: catching an expected panic with its message and
//! location, and moving data between `f64` reference values and kiln tensors of any dtype.
//!
//! Expected panics (inside `catch_panic`) are recorded and kept off stderr, so that hundreds of them do not flood
//! the output or pay for a backtrace each (`RUST_BACKTRACE=1` is common); any other panic goes to the previous
//! hook unchanged, so real failures still print.

#![allow(dead_code)]

use kiln::{DType, Device, Tensor};
use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

/// What an expected panic said, and where the panic itself says it happened.
#[derive(Clone, Debug)]
pub struct Caught {
    pub message: String,
    /// `(file, line, column)` from the panic hook's `Location`.
    pub location: Option<(String, u32, u32)>,
}

thread_local! {
    static EXPECTING: Cell<bool> = const { Cell::new(false) };
    static LAST_LOCATION: RefCell<Option<(String, u32, u32)>> = const { RefCell::new(None) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if EXPECTING.with(Cell::get) {
                let at = info.location().map(|l| (l.file().to_string(), l.line(), l.column()));
                LAST_LOCATION.with(|l| *l.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `f`; `None` if it returned, else the panic's message and location. Tensors are not `UnwindSafe` (they hold
/// a lock), so the closure is asserted unwind-safe: checking that kiln stays usable after a panic is the point.
pub fn catch_panic<R>(f: impl FnOnce() -> R) -> Option<Caught> {
    install_hook();
    EXPECTING.with(|e| e.set(true));
    LAST_LOCATION.with(|l| *l.borrow_mut() = None);
    let result = catch_unwind(AssertUnwindSafe(f));
    EXPECTING.with(|e| e.set(false));
    let payload = result.err()?;
    let message = if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "<non-string panic payload>".to_string()
    };
    Some(Caught { message, location: LAST_LOCATION.with(|l| l.borrow_mut().take()) })
}

/// `x` as a value of `dtype` (rounded, wrapped or made 0/1), held in an `f64`: what a cast to `dtype` gives.
pub fn normalize(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::Bool => (x != 0.0) as u8 as f64,
        DType::U8 => x as i64 as u8 as f64,
        DType::U32 => x as i64 as u32 as f64,
        DType::I32 => x as i64 as i32 as f64,
        DType::I64 => x as i64 as f64,
        DType::F16 => kiln::f16::from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        DType::F64 => x,
        DType::BF16 => kiln_jit::dtype::bf16_from_f64(x).to_f64(),
    }
}

/// A tensor of `dtype` holding `data` (each value must already be exact in `dtype`, see `normalize`).
pub fn tensor_of(dtype: DType, data: &[f64], dims: &[usize], dev: &Device) -> Tensor {
    let dims = dims.to_vec();
    let t = match dtype {
        DType::Bool => Tensor::from_vec(data.iter().map(|&x| x != 0.0).collect::<Vec<_>>(), dims, dev),
        DType::U8 => Tensor::from_vec(data.iter().map(|&x| x as u8).collect::<Vec<_>>(), dims, dev),
        DType::U32 => Tensor::from_vec(data.iter().map(|&x| x as u32).collect::<Vec<_>>(), dims, dev),
        DType::I32 => Tensor::from_vec(data.iter().map(|&x| x as i32).collect::<Vec<_>>(), dims, dev),
        DType::I64 => Tensor::from_vec(data.iter().map(|&x| x as i64).collect::<Vec<_>>(), dims, dev),
        DType::F16 => Tensor::from_vec(data.iter().map(|&x| kiln::f16::from_f64(x)).collect::<Vec<_>>(), dims, dev),
        DType::F32 => Tensor::from_vec(data.iter().map(|&x| x as f32).collect::<Vec<_>>(), dims, dev),
        DType::F64 => Tensor::from_vec(data.to_vec(), dims, dev),
        DType::BF16 => {
            Tensor::from_vec(data.iter().map(|&x| kiln_jit::dtype::bf16_from_f64(x)).collect::<Vec<_>>(), dims, dev)
        }
    };
    t.expect("from_vec with a matching length")
}

/// The tensor's elements (row-major) as `f64`, read with `to_vec` of its own dtype.
pub fn values_of(t: &Tensor) -> Vec<f64> {
    let v = match t.dtype() {
        DType::Bool => t.to_vec::<bool>().map(|v| v.into_iter().map(|x| x as u8 as f64).collect()),
        DType::U8 => t.to_vec::<u8>().map(|v| v.into_iter().map(f64::from).collect()),
        DType::U32 => t.to_vec::<u32>().map(|v| v.into_iter().map(f64::from).collect()),
        DType::I32 => t.to_vec::<i32>().map(|v| v.into_iter().map(f64::from).collect()),
        DType::I64 => t.to_vec::<i64>().map(|v| v.into_iter().map(|x| x as f64).collect()),
        DType::F16 => t.to_vec::<kiln::f16>().map(|v| v.into_iter().map(|x| x.to_f64()).collect()),
        DType::F32 => t.to_vec::<f32>().map(|v| v.into_iter().map(f64::from).collect()),
        DType::F64 => t.to_vec::<f64>(),
        DType::BF16 => t.to_vec::<kiln::bf16>().map(|v| v.into_iter().map(|x| x.to_f64()).collect()),
    };
    v.expect("realize and read back")
}

/// Exact equality, bit for bit (so -0.0 differs from 0.0), except that any NaN equals any NaN.
pub fn same_value(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// The first index where `got` and `want` differ (`same_value`), or where their lengths part.
pub fn first_difference(got: &[f64], want: &[f64]) -> Option<usize> {
    if let Some(i) = got.iter().zip(want).position(|(&g, &w)| !same_value(g, w)) {
        return Some(i);
    }
    (got.len() != want.len()).then(|| got.len().min(want.len()))
}
