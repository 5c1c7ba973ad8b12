//! Errors for everything that depends on data or the outside world. Programmer errors (a shape or dtype mismatch
//! in an op) are panics at the op instead: see `args::op_panic`.

use kiln_jit::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: {len} elements given, but shape {shape:?} holds {expected}")]
    DataLength { op: &'static str, len: usize, shape: Vec<usize>, expected: usize },
    #[error("{op}: the tensor holds {actual}, but {requested} was asked for (convert with `to_dtype` first)")]
    DType { op: &'static str, actual: DType, requested: DType },
    #[error("item: the tensor has shape {shape:?} ({numel} elements); item() needs exactly one element")]
    NotOneElement { shape: Vec<usize>, numel: usize },
    #[error("backward: {0}")]
    Autograd(String),
    #[error(transparent)]
    Backend(#[from] kiln_backends::BackendError),
}
