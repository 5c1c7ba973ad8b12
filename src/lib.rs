//! kiln: a lazy, graph-tracing JIT tensor runtime.
//!
//! Code reads like eager PyTorch; each op only records a node. When a value is needed (`to_vec`, `item`,
//! `realize`), the reachable graph is checked, compiled for its device (once per graph signature) and run.
//!
//! ```
//! # kiln::tune::set_cache_dir(None).ok(); // doc tests keep off the user's cache
//! # #[cfg(feature = "cpu")] {
//! use kiln::{DType, Device, Tensor};
//! let dev = Device::cpu();
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], [2, 2], &dev)?;
//! let w = Tensor::ones([2, 3], DType::F32, &dev);
//! let y = (x.matmul(&w) + 1.0).relu().sum(1, false);
//! assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0]);
//! # }
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! This crate owns the user API, op constructors, `realize` and the plan cache, and errors. It must not know how a
//! kernel is written: that is `kiln-jit` (graph IR, passes, interpreter, renderers) and `kiln-backends` (devices,
//! reached through its `Backend` trait and `runtime` module; `device.rs` is the one place that names a device).
//! Each device is a cargo feature (`cpu`, `wgpu`, both on by default); either builds alone.
//!
//! Errors: a misuse of an op (shapes that do not broadcast, a bad dim) panics at the op with the caller's
//! file:line in the message; anything that depends on data or the outside world returns `Result<_, Error>`.

#[cfg(not(any(feature = "cpu", feature = "wgpu")))]
compile_error!("kiln needs a device: enable its `cpu` feature, its `wgpu` feature, or both (the default)");

mod args;
mod autograd;
mod device;
mod display;
pub mod distributed;
mod error;
mod io;
pub mod linalg;
mod macro_support;
pub mod nn;
mod ops;
pub mod optim;
// Persisted plans are CPU plans (a wgpu plan is compiled against one adapter): `plan_store.rs` says why.
#[cfg(feature = "cpu")]
mod plan_store;
mod random;
mod realize;
mod signature;
mod tensor;
mod thread_flag;
pub mod tune;
mod typed;

#[cfg(test)]
#[path = "../tests/test_cache/mod.rs"]
mod test_cache;

pub use args::{Dims, ShapeSpec};
pub use autograd::{Gradients, is_grad_enabled, no_grad};
#[cfg(feature = "cuda")]
pub use device::CudaDevice;
pub use device::Device;
#[cfg(feature = "hip")]
pub use device::HipDevice;
#[cfg(feature = "wgpu")]
pub use device::WgpuDevice;
pub use error::{Error, Result};
pub use io::{
    load_generator, load_module, load_optimizer, load_safetensors, save_generator, save_module, save_optimizer,
    save_safetensors,
};
/// A data-dependent error a kernel found while it ran (an index out of range, a singular matrix): `Error::fault`.
pub use kiln_jit::kernel::Fault;
pub use kiln_jit::{DType, Element, HostBuffer, Scalar, Shape, bf16, f16};
pub use ops::{Operand, PadMode};
pub use random::{DEFAULT_SEED, Generator, RngState, default_generator, manual_seed, rng_state, set_rng_state};
pub use realize::{
    Captured, DEFAULT_PLAN_CACHE, Stats, capture, clear_plan_cache, plan_cache_limit, set_plan_cache_limit, stats,
};
pub use tensor::Tensor;
pub use typed::{Tensor1, Tensor2, Tensor3, Tensor4};

/// Compile-time checked macros: `fuse!(expr)` (one kernel, guaranteed) and `einsum!` (subscripts checked).
///
/// ```
/// # kiln::tune::set_cache_dir(None).ok(); // doc tests keep off the user's cache
/// # #[cfg(feature = "cpu")] {
/// use kiln::{DType, Device, Tensor, einsum, fuse};
/// let dev = Device::cpu();
/// let a = Tensor::randn([3, 4], DType::F32, &dev);
/// let b = Tensor::randn([4, 5], DType::F32, &dev);
/// let c = einsum!((i, j) = a[i, k] * b[k, j]); // nabla's form
/// let d = einsum!("ik,kj->ij", a, b); // PyTorch's
/// let y = fuse!((a.sin() * 2.0 + 1.0).sum(1, false)); // one kernel
/// assert_eq!(c.dims(), d.dims());
/// assert_eq!(y.dims(), [3]);
/// # }
/// ```
pub use kiln_macros::{einsum, fuse};

#[doc(hidden)]
pub mod __private {
    pub use crate::macro_support::{Probe, ViaOther, ViaTensor, fused, kernel_count};
    pub use crate::typed::{
        AsTensor, Axis, Const, Dynamic, Rank, SameRank, SameSize, axis_pair, rank_and, same_rank, same_size,
    };
}

/// With `KILN_PROFILE=1`: the time spent in each kernel so far, heaviest first (empty otherwise).
pub fn profile_report() -> String {
    kiln_backends::runtime::profile_report()
}

/// Computes several tensors as one graph (shared work is done once).
pub fn realize(tensors: &[&Tensor]) -> Result<()> {
    realize::realize(tensors)
}
