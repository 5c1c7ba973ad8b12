//! Weights on disk in the safetensors format (Hugging Face's; what `safetensors.torch.save_file` writes): an 8-byte
//! little-endian header length, a JSON header naming each tensor's dtype, shape and byte range, then the raw data,
//! little-endian and row-major. kiln reads and writes BF16, F16, F32, F64, I32, I64, U32, U8 and BOOL, which map one
//! to one onto its dtypes (bit for bit: a bf16 file `safetensors.torch` wrote reads back as the same bits); anything
//! else (I8, F8, ...) is refused with `Error::UnsupportedDType`, never converted silently. Files kiln writes carry the metadata `{"format": "pt"}`, as PyTorch-side tools expect.
//!
//! `save_module` / `load_module` store a `Module`'s `named_params` under their paths (`0.weight`, `fc1.bias`), the
//! keys of a PyTorch `state_dict`, so a `Sequential` of `Linear`s reads a file saved from the same PyTorch model.
//! `load_module` checks the whole file against the module before changing anything: missing or (when strict)
//! unexpected names and shape mismatches are all reported in one `Error::StateDict`, and the module is untouched.
//!
//! `save_optimizer` / `load_optimizer` store an optimizer's state (`Optimizer::state_dict`) in the same format:
//! tensors named `state.{i}.{name}` (parameter `i` in the optimizer's order, PyTorch's names: `state.0.exp_avg`), and
//! in the metadata `kiln.optimizer` (the kind), `kiln.params` (how many parameters), `kiln.hyper.{name}` (each
//! hyperparameter, written so it reads back to the same bits) and `kiln.step.{i}` (each nonzero step count).
//!
//! `save_generator` / `load_generator` store a random generator's state (`kiln.generator.seed` and `.offset` in the
//! metadata of a file without tensors), the third part of a checkpoint beside the module and the optimizer.
//!
//! Writes go through `kiln_autotune::replace_file` (the cache's writer): a temporary file in the target's folder,
//! synced and renamed into place, so a failed save never leaves a truncated file behind, and the file gets the mode
//! `File::create` would give it (an existing file's, else 0o666 less the umask); the `safetensors` crate's own
//! writer makes 0600 files, a mode for secrets.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::{Module, Param};
use crate::optim::{Optimizer, OptimizerState, ParamState};
use crate::random::{Generator, RngState};
use crate::tensor::Tensor;
use kiln_jit::{DType, HostBuffer, HostVec};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};
use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::path::Path;

/// One tensor's bytes for the serializer.
struct Blob {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_safetensors_dtype(d: DType) -> Dtype {
    match d {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
    }
}

/// Little-endian bytes of a host buffer.
fn to_le_bytes(b: &HostBuffer) -> Vec<u8> {
    match b {
        HostBuffer::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        HostBuffer::U8(v) => v.to_vec(),
        HostBuffer::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostBuffer::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// A host buffer from little-endian bytes of a supported dtype (`None` for any other dtype).
fn from_le_bytes(dtype: Dtype, data: &[u8]) -> Option<HostBuffer> {
    fn words<const N: usize, T>(data: &[u8], f: fn([u8; N]) -> T) -> HostVec<T> {
        data.chunks_exact(N).map(|c| f(c.try_into().expect("chunk of N bytes"))).collect()
    }
    Some(match dtype {
        Dtype::BOOL => HostBuffer::Bool(data.iter().map(|&x| x != 0).collect()),
        Dtype::U8 => HostBuffer::U8(HostVec::from_slice(data)),
        Dtype::U32 => HostBuffer::U32(words(data, u32::from_le_bytes)),
        Dtype::I32 => HostBuffer::I32(words(data, i32::from_le_bytes)),
        Dtype::I64 => HostBuffer::I64(words(data, i64::from_le_bytes)),
        Dtype::F16 => HostBuffer::F16(words(data, kiln_jit::f16::from_le_bytes)),
        Dtype::F32 => HostBuffer::F32(words(data, f32::from_le_bytes)),
        Dtype::F64 => HostBuffer::F64(words(data, f64::from_le_bytes)),
        Dtype::BF16 => HostBuffer::BF16(words(data, kiln_jit::bf16::from_le_bytes)),
        _ => return None,
    })
}

fn st_error(op: &'static str, path: &Path, e: SafeTensorError) -> Error {
    match e {
        SafeTensorError::IoError(source) => Error::Io { op, path: path.to_path_buf(), source },
        other => Error::SafeTensors { op, path: path.to_path_buf(), message: other.to_string() },
    }
}

/// Writes named tensors to a safetensors file at `path` (replacing it). The tensors are realized together first.
/// Names must be distinct. `tensors` may hold `(&str, &Tensor)`, `(String, Tensor)`, ...
pub fn save_safetensors<S: AsRef<str>, T: Borrow<Tensor>>(path: impl AsRef<Path>, tensors: &[(S, T)]) -> Result<()> {
    write(path.as_ref(), tensors, HashMap::new())
}

/// `save_safetensors` with more metadata entries.
fn write<S: AsRef<str>, T: Borrow<Tensor>>(
    path: &Path,
    tensors: &[(S, T)],
    mut metadata: HashMap<String, String>,
) -> Result<()> {
    const OP: &str = "save_safetensors";
    let mut seen: HashMap<&str, ()> = HashMap::with_capacity(tensors.len());
    for (name, _) in tensors {
        if seen.insert(name.as_ref(), ()).is_some() {
            return Err(Error::DuplicateName(name.as_ref().to_string()));
        }
    }
    let refs: Vec<&Tensor> = tensors.iter().map(|(_, t)| t.borrow()).collect();
    crate::realize(&refs)?;
    let mut blobs = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t: &Tensor = t.borrow();
        let host = t.to_host()?;
        let blob = Blob { dtype: to_safetensors_dtype(t.dtype()), shape: t.dims().to_vec(), data: to_le_bytes(&host) };
        blobs.push((name.as_ref().to_string(), blob));
    }
    metadata.insert("format".to_string(), "pt".to_string());
    let views = blobs.iter().map(|(n, b)| (n.as_str(), b));
    let bytes = safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| st_error(OP, path, e))?;
    drop(blobs);
    // Durable, as any file the user asked for: a checkpoint must survive a power cut once the call returned.
    kiln_autotune::replace_file(path, &bytes, true).map_err(|source| Error::Io {
        op: OP,
        path: path.to_path_buf(),
        source,
    })
}

/// A tensor read from a file, on the host.
struct Loaded {
    name: String,
    shape: Vec<usize>,
    data: HostBuffer,
}

/// Reads and checks every tensor of a safetensors file, in the file's order.
fn read_all(path: &Path) -> Result<Vec<Loaded>> {
    Ok(read_with_metadata(path)?.0)
}

/// `read_all`, and the file's metadata entries.
fn read_with_metadata(path: &Path) -> Result<(Vec<Loaded>, HashMap<String, String>)> {
    const OP: &str = "load_safetensors";
    let bytes = std::fs::read(path).map_err(|source| Error::Io { op: OP, path: path.to_path_buf(), source })?;
    let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| st_error(OP, path, e))?;
    let entries = metadata.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(&bytes).map_err(|e| st_error(OP, path, e))?;
    let mut out = Vec::new();
    for name in metadata.offset_keys() {
        let view = file.tensor(&name).map_err(|e| st_error(OP, path, e))?;
        let Some(data) = from_le_bytes(view.dtype(), view.data()) else {
            return Err(Error::UnsupportedDType { path: path.to_path_buf(), name, dtype: view.dtype().to_string() });
        };
        let shape = view.shape().to_vec();
        if data.len() != shape.iter().product::<usize>() {
            let message = format!("tensor `{name}` of shape {shape:?} holds {} elements", data.len());
            return Err(Error::SafeTensors { op: OP, path: path.to_path_buf(), message });
        }
        out.push(Loaded { name, shape, data });
    }
    Ok((out, entries))
}

/// Reads every tensor of a safetensors file onto `device`, in the file's order, as `(name, tensor)`.
pub fn load_safetensors(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    read_all(path.as_ref())?.into_iter().map(|l| Ok((l.name, Tensor::from_host(l.data, l.shape, device)?))).collect()
}

/// Saves a module's parameters and buffers (`named_state`: a batch norm's running statistics too) to a
/// safetensors file.
pub fn save_module(module: &dyn Module, path: impl AsRef<Path>) -> Result<()> {
    let named: Vec<(String, Tensor)> = module.named_state().into_iter().map(|(n, p)| (n, p.get())).collect();
    save_safetensors(path, &named)
}

/// Loads a module's parameters and buffers from a safetensors file (`load_state_dict`). Every one must be in the file
/// with its shape; with `strict`, the file must hold nothing else. A tensor of another dtype is converted to the
/// parameter's (as PyTorch's `copy_` does). Nothing changes unless everything fits.
pub fn load_module(module: &dyn Module, path: impl AsRef<Path>, strict: bool) -> Result<()> {
    let path = path.as_ref();
    let mut file: HashMap<String, Loaded> = read_all(path)?.into_iter().map(|l| (l.name.clone(), l)).collect();
    let named = module.named_state();
    let mut problems = Vec::new();
    let mut values = Vec::with_capacity(named.len());
    for (name, param) in &named {
        let Some(l) = file.remove(name) else {
            problems.push(format!("missing `{name}`"));
            continue;
        };
        let want = param.get();
        if l.shape != want.dims() {
            problems.push(format!(
                "size mismatch for `{name}`: the file has {:?}, the module {:?}",
                l.shape,
                want.dims()
            ));
            continue;
        }
        let data = if l.data.dtype() == want.dtype() {
            l.data
        } else if want.dtype().is_float() {
            HostBuffer::from_f64(want.dtype(), &l.data.to_f64())
        } else {
            HostBuffer::from_i64(want.dtype(), &l.data.to_i64())
        };
        values.push((param.clone(), data, l.shape, want.device()));
    }
    if strict && !file.is_empty() {
        let mut extra: Vec<&String> = file.keys().collect();
        extra.sort();
        problems.push(format!("unexpected {}", extra.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
    }
    if !problems.is_empty() {
        return Err(Error::StateDict { path: path.to_path_buf(), problems });
    }
    let mut uploaded = Vec::with_capacity(values.len());
    for (param, data, shape, device) in values {
        uploaded.push((param, Tensor::from_host(data, shape, &device)?));
    }
    for (param, t) in uploaded {
        param.set(t);
    }
    Ok(())
}

/// Saves an optimizer's state (`state_dict`: hyperparameters, step counts, state tensors) to a safetensors file.
/// With `save_module` for the parameters (and `rng_state` where training draws random numbers), that is a
/// checkpoint training resumes from exactly:
/// ```
/// use kiln::nn::{Linear, Module};
/// use kiln::optim::{Adam, Optimizer};
/// # fn main() -> kiln::Result<()> {
/// # kiln::tune::set_cache_dir(None).ok(); // doc tests keep off the user's cache
/// # let dir = tempfile::tempdir().unwrap();
/// # let (weights, state) = (dir.path().join("model.safetensors"), dir.path().join("optim.safetensors"));
/// # #[cfg(feature = "cpu")] {
/// let dev = kiln::Device::cpu();
/// let model = Linear::new(4, 2, true, &dev);
/// let mut opt = Adam::new(model.params(), 1e-3);
/// let x = kiln::Tensor::ones([8, 4], kiln::DType::F32, &dev);
/// let loss = model.forward(&x).square().mean_all();
/// opt.step(loss.backward()?, &[&loss])?;
/// kiln::save_module(&model, &weights)?;
/// kiln::save_optimizer(&opt, &state)?;
///
/// // Later, in another process: build the same model and optimizer, then load both.
/// let resumed = Linear::new(4, 2, true, &dev);
/// let mut opt = Adam::new(resumed.params(), 1e-3);
/// kiln::load_module(&resumed, &weights, true)?;
/// kiln::load_optimizer(&mut opt, &state)?;
/// assert_eq!(opt.step_count(0), 1);
/// # }
/// # Ok(())
/// # }
/// ```
pub fn save_optimizer(optimizer: &dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    let state = optimizer.state_dict();
    let mut metadata = HashMap::from([
        ("kiln.optimizer".to_string(), state.kind.clone()),
        ("kiln.params".to_string(), state.params.len().to_string()),
    ]);
    // `Display` for f64 prints the shortest text that parses back to the same bits.
    metadata.extend(state.hyper.iter().map(|(k, v)| (format!("kiln.hyper.{k}"), v.to_string())));
    let mut tensors = Vec::new();
    for (i, p) in state.params.iter().enumerate() {
        if p.step != 0 {
            metadata.insert(format!("kiln.step.{i}"), p.step.to_string());
        }
        tensors.extend(p.tensors.iter().map(|(name, t)| (format!("state.{i}.{name}"), t.clone())));
    }
    write(path.as_ref(), &tensors, metadata)
}

/// Loads an optimizer's state saved by `save_optimizer` (`load_state_dict`): the file must be of the same kind of
/// optimizer over parameters of the same shapes. Nothing changes unless everything fits.
pub fn load_optimizer(optimizer: &mut dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let (tensors, metadata) = read_with_metadata(path)?;
    let state = optimizer_state(tensors, metadata, optimizer.params())
        .map_err(|message| Error::OptimizerFile { path: path.to_path_buf(), message })?;
    optimizer.load_state_dict(&state)
}

/// The `OptimizerState` a file's tensors and metadata describe (tensors on `staging_device`), or what is wrong.
/// `loading`: the loading optimizer's parameters (a file for another count is refused before anything is
/// allocated).
fn optimizer_state(
    tensors: Vec<Loaded>,
    metadata: HashMap<String, String>,
    loading: &[Param],
) -> std::result::Result<OptimizerState, String> {
    let expected = loading.len();
    let kind = metadata.get("kiln.optimizer").ok_or("no `kiln.optimizer` entry in its metadata")?.clone();
    let count = metadata.get("kiln.params").ok_or("no `kiln.params` entry in its metadata")?;
    let count: usize = count.parse().map_err(|_| format!("kiln.params = {count:?} is not a count"))?;
    if count != expected {
        return Err(format!("it holds the state of {count} parameters, the optimizer has {expected}"));
    }
    let mut params = vec![ParamState::default(); count];
    // The parameter a `state.{i}.*` name or `kiln.step.{i}` key refers to.
    let index = |i: &str, what: &str| match i.parse::<usize>() {
        Ok(i) if i < count => Ok(i),
        _ => Err(format!("{what} names parameter {i:?}, but the file has {count}")),
    };
    let mut hyper = std::collections::BTreeMap::new();
    for (key, value) in &metadata {
        if let Some(name) = key.strip_prefix("kiln.hyper.") {
            let v: f64 = value.parse().map_err(|_| format!("{key} = {value:?} is not a number"))?;
            hyper.insert(name.to_string(), v);
        } else if let Some(i) = key.strip_prefix("kiln.step.") {
            let step = value.parse().map_err(|_| format!("{key} = {value:?} is not a step count"))?;
            params[index(i, key)?].step = step;
        } else if key.starts_with("kiln.") && key != "kiln.optimizer" && key != "kiln.params" {
            return Err(format!("unknown metadata entry `{key}`"));
        }
    }
    for l in tensors {
        let parts = l.name.strip_prefix("state.").and_then(|rest| rest.split_once('.'));
        let Some((i, name)) = parts else {
            return Err(format!("tensor `{}` is not named state.<parameter>.<name>", l.name));
        };
        let i = index(i, &format!("tensor `{}`", l.name))?;
        let t = Tensor::from_host(l.data, l.shape, &staging_device(&loading[i])).map_err(|e| e.to_string())?;
        params[i].tensors.insert(name.to_string(), t);
    }
    Ok(OptimizerState { kind, hyper, params })
}

/// Where a loaded state tensor waits until the optimizer checks it (on the host) and uploads it to its parameter's
/// device (`load_state_dict`): the CPU where the build has it, so no device memory is taken for it.
#[cfg(feature = "cpu")]
fn staging_device(_param: &Param) -> Device {
    Device::cpu()
}

/// Where a loaded state tensor waits until the optimizer checks it: in a build without the CPU, its parameter's
/// own device.
#[cfg(not(feature = "cpu"))]
fn staging_device(param: &Param) -> Device {
    param.get().device()
}

const GENERATOR_SEED: &str = "kiln.generator.seed";
const GENERATOR_OFFSET: &str = "kiln.generator.offset";

/// Saves a random generator's state (seed and offset) to a safetensors file with no tensors: with `save_module`
/// and `save_optimizer`, training that draws random numbers (dropout, shuffles through kiln) resumes bit for bit.
/// For the calling thread's default generator, pass `kiln::default_generator()`.
pub fn save_generator(generator: &Generator, path: impl AsRef<Path>) -> Result<()> {
    let RngState { seed, offset } = generator.state();
    let metadata = HashMap::from([
        (GENERATOR_SEED.to_string(), seed.to_string()),
        (GENERATOR_OFFSET.to_string(), offset.to_string()),
    ]);
    write(path.as_ref(), &[] as &[(&str, &Tensor)], metadata)
}

/// Puts `generator` back in the state `save_generator` stored: its next draws repeat the ones that followed the
/// save. The generator is unchanged unless the whole file reads.
pub fn load_generator(generator: &Generator, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let (tensors, metadata) = read_with_metadata(path)?;
    let bad = |message: String| Error::GeneratorFile { path: path.to_path_buf(), message };
    if let Some(t) = tensors.first() {
        return Err(bad(format!("it holds tensors (`{}`): a generator file has none", t.name)));
    }
    let number = |key: &str| -> Result<u64> {
        let text = metadata.get(key).ok_or_else(|| bad(format!("no `{key}` entry in its metadata")))?;
        text.parse().map_err(|_| bad(format!("{key} = {text:?} is not a whole number")))
    };
    generator.set_state(RngState { seed: number(GENERATOR_SEED)?, offset: number(GENERATOR_OFFSET)? });
    Ok(())
}
