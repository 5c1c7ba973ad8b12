//! `kiln-jit`: the graph IR and everything that transforms or evaluates it without touching a device.
//!
//! Owns: element types and promotion (`dtype`), shapes and broadcasting (`shape`), the primitive op set (`op`),
//! the graph IR on a petgraph `StableGraph` (`graph`), the scalar meaning of each elementwise op (`semantics`), counter-based random numbers (`rng`), host buffers
//! (`buffer`) and the reference interpreter (`interp`), which is the oracle for every backend. Fusion, scheduling,
//! the kernel IR and its renderers (CLIF, CUDA C, HIP C, WGSL) come here too, as pure functions of the graph.
//!
//! Must not know: devices, drivers, memory on a device, or the user-facing `Tensor` API.

pub mod buffer;
pub mod dtype;
pub mod graph;
pub mod host_vec;
pub mod interp;
pub mod kernel;
pub mod op;
pub mod render;
pub mod rng;
pub mod semantics;
pub mod shape;

pub use buffer::{Element, HostBuffer};
pub use dtype::{Category, DType, Priority, Scalar};
pub use graph::{Graph, NodeData};
/// The f16 element type (`half::f16`), so users need not depend on `half` themselves.
pub use half::{bf16, f16};
pub use host_vec::{HOST_ALIGN, HostVec};
pub use op::{BinaryOp, LinalgOp, Op, RandDist, ReduceOp, RngKey, UnaryOp};
pub use shape::Shape;
