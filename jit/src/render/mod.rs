//! Renderers from the kernel IR to backend code: CLIF for the CPU (`clif`, with its vector math `clif_math`), and
//! the shared C-like renderer (`cstyle`) with its dialects (`wgsl`; `cuda`, CUDA C and HIP C).

pub mod clif;
pub mod clif_math;
pub mod cstyle;
pub mod cuda;
pub mod wgsl;
