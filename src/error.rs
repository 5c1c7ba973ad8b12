//! Errors for everything that depends on data or the outside world. Programmer errors (a shape or dtype mismatch
//! in an op) are panics at the op instead: see `args::op_panic`.

use kiln_jit::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The device names this build has (its device features), for `Error::UnknownDevice`.
fn known_devices() -> String {
    let names = [
        (cfg!(feature = "cpu"), "cpu"),
        (cfg!(feature = "wgpu"), "wgpu"),
        (cfg!(feature = "cuda"), "cuda:N"),
        (cfg!(feature = "hip"), "hip:N"),
    ];
    names.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect::<Vec<_>>().join(", ")
}

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
    /// A file could not be read or written (weights: `load_safetensors`, `save_safetensors`).
    #[error("{op}: {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid safetensors (bad header, offsets that do not match shapes and dtypes, truncated data),
    /// or the data could not be serialized.
    #[error("{op}: {}: not a valid safetensors file: {message}", path.display())]
    SafeTensors { op: &'static str, path: std::path::PathBuf, message: String },
    /// A safetensors tensor has a dtype kiln has no equivalent for (I8, F8, ...).
    #[error(
        "load_safetensors: {}: tensor `{name}` has dtype {dtype}, which kiln does not support (it reads BF16, F16, \
         F32, F64, I32, I64, U32, U8 and BOOL; convert it before saving, e.g. `t.float()` in PyTorch)",
        path.display()
    )]
    UnsupportedDType { path: std::path::PathBuf, name: String, dtype: String },
    /// `save_safetensors` was given one name twice.
    #[error("save_safetensors: the name `{0}` is given more than once")]
    DuplicateName(String),
    /// A weights file does not fit a module: missing or unexpected names, or shapes that differ (all listed).
    #[error("load_module: {} does not fit the module: {}", path.display(), problems.join("; "))]
    StateDict { path: std::path::PathBuf, problems: Vec<String> },
    /// An optimizer state (`load_state_dict`, `load_optimizer`) does not fit the optimizer: another kind, another
    /// number of parameters, a missing or invalid hyperparameter, state tensors missing or of another shape (all
    /// listed). The optimizer is unchanged.
    #[error("load_state_dict: the state does not fit this {kind}: {}", problems.join("; "))]
    OptimizerState { kind: &'static str, problems: Vec<String> },
    /// An optimizer file is not one `save_optimizer` wrote (its metadata or tensor names are not kiln's).
    #[error("load_optimizer: {}: not a kiln optimizer file: {message}", path.display())]
    OptimizerFile { path: std::path::PathBuf, message: String },
    /// A generator file is not one `save_generator` wrote.
    #[error("load_generator: {}: not a kiln generator file: {message}", path.display())]
    GeneratorFile { path: std::path::PathBuf, message: String },
    #[error(transparent)]
    Backend(#[from] kiln_backends::BackendError),
    /// A device name that is not one this build has (`cpu`, `wgpu`: its cargo features).
    #[error("unknown device `{0}` (this build knows: {known})", known = known_devices())]
    UnknownDevice(String),
    /// The tuning and kernel cache could not be read or written, or a bundle was refused (another CPU or version).
    #[error(transparent)]
    Cache(#[from] kiln_autotune::StoreError),
    /// A `kiln::distributed` operation failed: ranks disagree on what they pass, the launcher and the build do not
    /// match, or the communication library reported an error.
    #[error("distributed {op}: {message}")]
    Distributed { op: &'static str, message: String },
    /// Ranks did not reach a collective within the process group's timeout: they died or hang. The group cannot be
    /// used any more (a collective cannot be taken back from the ranks that did arrive).
    #[error(
        "distributed {op} (collective #{seq}): rank(s) {missing:?} did not arrive within {timeout:?}: it died or \
         hangs (this rank waited; the process group is unusable now)"
    )]
    RankTimeout { op: &'static str, seq: u64, missing: Vec<usize>, timeout: std::time::Duration },
}

impl Error {
    /// The data-dependent error a kernel found, if that is what this is: a gathered index out of range, or from
    /// `kiln::linalg` a singular matrix or one that is not positive definite (with the matrix's batch index).
    pub fn fault(&self) -> Option<kiln_jit::kernel::Fault> {
        match self {
            Error::Backend(kiln_backends::BackendError::Fault { fault, .. }) => Some(*fault),
            _ => None,
        }
    }
}
