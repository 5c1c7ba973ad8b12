//! `Display` for `Tensor`: realizes the tensor and prints its values the way PyTorch's `repr` does, so output reads
//! the same in both (`tensor([[1.0000, 2.5000],\n        [3.0000, 4.0000]])`). `{:?}` stays metadata only and never
//! computes anything.
//!
//! PyTorch's rules (`torch/_tensor_str.py`, default print options), followed here:
//! - Past 1000 elements the output is summarized: each dim longer than 6 shows its first and last 3 entries
//!   around `...`.
//! - Floats share one format, chosen from the shown nonzero finite values: whole numbers print as `1.`; otherwise
//!   4 decimals (`0.5000`), or scientific (`1.0000e-05`) when the largest is over 1e8, the smallest under 1e-4,
//!   or their ratio over 1000. Every element is right-aligned to the widest.
//! - A 1-d run wraps at 80 columns; rows of a matrix are separated by a line break, blocks of higher dims by
//!   blank lines.
//! - `dtype=` is noted unless it is f32, i64 or bool (PyTorch's defaults), `device=` unless it is the CPU.
//!
//! kiln's names stand where PyTorch's would (`dtype=f64`, `device=wgpu`). A tensor that cannot be computed prints
//! the error inside `tensor(...)`: `Display` has no way to return it.

use crate::tensor::Tensor;
use kiln_jit::{DType, HostBuffer};
use std::fmt;

const THRESHOLD: usize = 1000;
const EDGE_ITEMS: usize = 3;
const LINE_WIDTH: usize = 80;
const PRECISION: usize = 4;

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match self.to_host() {
            Ok(h) => h,
            Err(e) => return write!(f, "tensor(<not computed: {e}>)"),
        };
        let mut suffix = String::new();
        // As PyTorch: the device is named unless it is the CPU.
        let named = match self.device() {
            #[cfg(feature = "cpu")]
            crate::Device::Cpu => false,
            #[cfg(feature = "wgpu")]
            crate::Device::Wgpu(_) => true,
            #[cfg(feature = "cuda")]
            crate::Device::Cuda(_) => true, // `device=cuda:0`, as PyTorch prints it
            #[cfg(feature = "hip")]
            crate::Device::Hip(_) => true,
        };
        if named {
            suffix.push_str(&format!(", device={}", self.device()));
        }
        let dims = self.dims().to_vec();
        if dims.contains(&0) && dims.len() != 1 {
            let sizes: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            suffix.push_str(&format!(", size=({})", sizes.join(", ")));
        }
        if !matches!(self.dtype(), DType::F32 | DType::I64 | DType::Bool) {
            suffix.push_str(&format!(", dtype={}", self.dtype()));
        }
        write!(f, "tensor({}{suffix})", render(&values(&host), &dims))
    }
}

/// One element, as `tolist()` would hand it to Python's formatter.
#[derive(Clone, Copy)]
enum Value {
    Float(f64),
    Int(i128),
    Bool(bool),
}

fn values(host: &HostBuffer) -> Vec<Value> {
    match host {
        HostBuffer::Bool(v) => v.iter().map(|&x| Value::Bool(x)).collect(),
        HostBuffer::U8(v) => v.iter().map(|&x| Value::Int(x.into())).collect(),
        HostBuffer::U32(v) => v.iter().map(|&x| Value::Int(x.into())).collect(),
        HostBuffer::I32(v) => v.iter().map(|&x| Value::Int(x.into())).collect(),
        HostBuffer::I64(v) => v.iter().map(|&x| Value::Int(x.into())).collect(),
        HostBuffer::F16(v) => v.iter().map(|&x| Value::Float(x.to_f64())).collect(),
        HostBuffer::BF16(v) => v.iter().map(|&x| Value::Float(x.to_f64())).collect(),
        HostBuffer::F32(v) => v.iter().map(|&x| Value::Float(x.into())).collect(),
        HostBuffer::F64(v) => v.iter().map(|&x| Value::Float(x)).collect(),
    }
}

/// The values of `data` (row-major, `dims`) as PyTorch prints them inside `tensor(...)`.
fn render(data: &[Value], dims: &[usize]) -> String {
    if data.is_empty() {
        return "[]".to_string();
    }
    let summarize = data.len() > THRESHOLD;
    let strides: Vec<usize> = (0..dims.len()).map(|d| dims[d + 1..].iter().product()).collect();
    let mut shown = Vec::new();
    collect_shown(data, dims, &strides, 0, 0, summarize, &mut shown);
    let format = Format::new(&shown);
    let indent = "tensor(".len();
    let mut out = String::new();
    write_dim(&mut out, data, dims, &strides, 0, 0, indent, summarize, &format);
    out
}

/// The elements a summarized print shows (PyTorch computes the format from those alone).
fn collect_shown(
    data: &[Value],
    dims: &[usize],
    strides: &[usize],
    d: usize,
    at: usize,
    summarize: bool,
    out: &mut Vec<Value>,
) {
    if d == dims.len() {
        out.push(data[at]);
        return;
    }
    for i in shown_indices(dims[d], summarize).into_iter().flatten() {
        collect_shown(data, dims, strides, d + 1, at + i * strides[d], summarize, out);
    }
}

/// The indices of a dim of `len` that are printed, `None` standing for the `...`.
fn shown_indices(len: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && len > 2 * EDGE_ITEMS {
        let head = (0..EDGE_ITEMS).map(Some);
        head.chain([None]).chain((len - EDGE_ITEMS..len).map(Some)).collect()
    } else {
        (0..len).map(Some).collect()
    }
}

#[allow(clippy::too_many_arguments)] // one recursive walk; bundling its state in a struct reads worse
fn write_dim(
    out: &mut String,
    data: &[Value],
    dims: &[usize],
    strides: &[usize],
    d: usize,
    at: usize,
    indent: usize,
    summarize: bool,
    format: &Format,
) {
    if d == dims.len() {
        out.push_str(&format.pad(data[at]));
        return;
    }
    let indices = shown_indices(dims[d], summarize);
    out.push('[');
    if d + 1 == dims.len() {
        // A run of elements, wrapped to the line width.
        let per_line = ((LINE_WIDTH.saturating_sub(indent)) / (format.width + 2)).max(1);
        let items: Vec<String> = indices
            .iter()
            .map(|i| match i {
                Some(i) => format.pad(data[at + i * strides[d]]),
                None => " ...".to_string(),
            })
            .collect();
        let lines: Vec<String> = items.chunks(per_line).map(|c| c.join(", ")).collect();
        out.push_str(&lines.join(&format!(",\n{}", " ".repeat(indent + 1))));
    } else {
        let separator = format!(",{}{}", "\n".repeat(dims.len() - d - 1), " ".repeat(indent + 1));
        for (n, i) in indices.iter().enumerate() {
            if n > 0 {
                out.push_str(&separator);
            }
            match i {
                Some(i) => {
                    write_dim(out, data, dims, strides, d + 1, at + i * strides[d], indent + 1, summarize, format)
                }
                None => out.push_str("..."),
            }
        }
    }
    out.push(']');
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Integers, booleans: as they are.
    Plain,
    /// Floats that are all whole numbers: `1.`
    Whole,
    /// `0.5000`
    Fixed,
    /// `1.0000e-05`
    Scientific,
}

/// One format for every element of a print, and the width they are aligned to.
struct Format {
    mode: Mode,
    width: usize,
}

impl Format {
    fn new(shown: &[Value]) -> Format {
        if !shown.iter().any(|v| matches!(v, Value::Float(_))) {
            let mut f = Format { mode: Mode::Plain, width: 1 };
            f.width = shown.iter().map(|&v| f.text(v).len()).max().unwrap_or(1);
            return f;
        }
        // The format is chosen from the nonzero finite values, as PyTorch's is.
        let finite: Vec<f64> = shown
            .iter()
            .filter_map(|v| match *v {
                Value::Float(x) if x.is_finite() && x != 0.0 => Some(x),
                _ => None,
            })
            .collect();
        if finite.is_empty() {
            return Format { mode: Mode::Whole, width: 1 };
        }
        let max = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let min = finite.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
        let whole = finite.iter().all(|x| x.ceil() == *x);
        let wide_range = max / min > 1000.0 || max > 1e8;
        let mode = match (whole, wide_range) {
            (true, false) => Mode::Whole,
            (false, false) if min >= 1e-4 => Mode::Fixed,
            _ => Mode::Scientific,
        };
        let mut f = Format { mode, width: 1 };
        // So does the width ('1.' is one longer than '1').
        f.width = finite.iter().map(|&x| f.text(Value::Float(x)).len()).max().unwrap_or(1);
        f
    }

    fn text(&self, v: Value) -> String {
        match v {
            Value::Bool(b) => (if b { "True" } else { "False" }).to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) if x.is_nan() => "nan".to_string(),
            Value::Float(x) if x.is_infinite() => (if x > 0.0 { "inf" } else { "-inf" }).to_string(),
            Value::Float(x) => match self.mode {
                Mode::Whole => format!("{x:.0}."),
                Mode::Fixed | Mode::Plain => format!("{x:.PRECISION$}"),
                Mode::Scientific => python_exponent(&format!("{x:.PRECISION$e}")),
            },
        }
    }

    fn pad(&self, v: Value) -> String {
        let t = self.text(v);
        format!("{}{t}", " ".repeat(self.width.saturating_sub(t.len())))
    }
}

/// Rust's `1.0000e-5` as Python's `1.0000e-05`: a signed exponent of at least two digits.
fn python_exponent(rust: &str) -> String {
    match rust.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => rust.to_string(),
    }
}
