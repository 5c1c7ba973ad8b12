//! Renderers from the kernel IR to backend code.

pub mod clif;
pub mod clif_math;
pub mod wgsl;
