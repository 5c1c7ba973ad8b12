//! What the code `fuse!` expands to calls (`kiln::__private`): not a public API.

use crate::tensor::Tensor;

/// A `fuse!` operand as written: a tensor (by value or reference) or anything else (a scalar, a dim).
pub struct Probe<'a, T>(pub &'a T);

/// Picked for a tensor operand (method resolution tries this impl before the autoref'd fallback).
pub trait ViaTensor {
    fn leaf(&self) -> Option<Tensor>;
}

impl ViaTensor for Probe<'_, Tensor> {
    fn leaf(&self) -> Option<Tensor> {
        Some(self.0.clone())
    }
}

impl ViaTensor for Probe<'_, &Tensor> {
    fn leaf(&self) -> Option<Tensor> {
        Some((*self.0).clone())
    }
}

/// Picked for any other operand: nothing to realize.
pub trait ViaOther {
    fn leaf(&self) -> Option<Tensor>;
}

impl<T> ViaOther for &Probe<'_, T> {
    fn leaf(&self) -> Option<Tensor> {
        None
    }
}

/// Runs a `fuse!` expression: realizes its tensor operands first (an error there is not lost: those tensors stay
/// lazy, and realizing the result reports it again), then builds the expression, which kiln realizes as one kernel
/// over the operands' buffers. Debug builds assert that one kernel (schedule of the expression's graph; a
/// reduction to one value large enough to run as partial sums over all cores and their fold counts as one).
#[track_caller]
pub fn fused(operands: &[Tensor], build: impl FnOnce() -> Tensor) -> Tensor {
    let refs: Vec<&Tensor> = operands.iter().collect();
    let realized = crate::realize(&refs).is_ok();
    let y = build();
    if cfg!(debug_assertions) && realized && !y.is_realized() {
        let kernels = kernel_count(&y);
        assert!(kernels == Some(1), "fuse!: the expression ran as {kernels:?} kernels, not one (a kiln bug)");
    }
    y
}

/// The kernels `y`'s graph schedules to (target-neutral rules), a split full reduction's partial pass not
/// counted; `None` when the graph cannot be captured.
pub fn kernel_count(y: &Tensor) -> Option<usize> {
    let cap = crate::capture(&[y]).ok()?;
    let plan = kiln_jit::kernel::schedule(&cap.graph);
    Some(plan.launches.iter().filter(|l| !kiln_jit::kernel::split::is_partial(&l.kernel)).count())
}
