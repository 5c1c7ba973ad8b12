//! Host-side typed storage: what users hand in and get back, and what the interpreter reads and writes.

use crate::dtype::{DType, Scalar};
use crate::host_vec::HostVec;
use half::{bf16, f16};

/// A contiguous, row-major host buffer of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostBuffer {
    Bool(HostVec<bool>),
    U8(HostVec<u8>),
    U32(HostVec<u32>),
    I32(HostVec<i32>),
    I64(HostVec<i64>),
    F16(HostVec<f16>),
    F32(HostVec<f32>),
    F64(HostVec<f64>),
    BF16(HostVec<bf16>),
}

/// A Rust type that can be a tensor element.
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug {
    const DTYPE: DType;
    /// The values as a host buffer: one copy, into storage aligned for the kernels (`HostVec`).
    fn into_buffer(v: Vec<Self>) -> HostBuffer {
        Self::copy_into_buffer(&v)
    }
    /// A copy of the values as a host buffer.
    fn copy_into_buffer(v: &[Self]) -> HostBuffer;
    fn from_buffer(b: &HostBuffer) -> Option<&[Self]>;
    fn to_scalar(self) -> Scalar;
}

macro_rules! element {
    ($($t:ty => $v:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$v;
            fn copy_into_buffer(v: &[Self]) -> HostBuffer { HostBuffer::$v(HostVec::from_slice(v)) }
            fn from_buffer(b: &HostBuffer) -> Option<&[Self]> {
                match b { HostBuffer::$v(v) => Some(v), _ => None }
            }
            fn to_scalar(self) -> Scalar { Scalar::from(self) }
        }
    )*};
}
element!(bool => Bool, u8 => U8, u32 => U32, i32 => I32, i64 => I64, f16 => F16, f32 => F32, f64 => F64,
    bf16 => BF16);

impl HostBuffer {
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::Bool(_) => DType::Bool,
            HostBuffer::U8(_) => DType::U8,
            HostBuffer::U32(_) => DType::U32,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::I64(_) => DType::I64,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F64(_) => DType::F64,
            HostBuffer::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            HostBuffer::Bool(v) => v.len(),
            HostBuffer::U8(v) => v.len(),
            HostBuffer::U32(v) => v.len(),
            HostBuffer::I32(v) => v.len(),
            HostBuffer::I64(v) => v.len(),
            HostBuffer::F16(v) => v.len(),
            HostBuffer::F32(v) => v.len(),
            HostBuffer::F64(v) => v.len(),
            HostBuffer::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_in_bytes(&self) -> usize {
        self.len() * self.dtype().size_of()
    }

    /// Float elements widened to f64 (ints and bools converted), for the interpreter.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            HostBuffer::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            HostBuffer::U8(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::U32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::I64(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            HostBuffer::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::F64(v) => v.to_vec(),
            HostBuffer::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
        }
    }

    /// Integer elements widened to i64 (floats truncated), for the interpreter.
    pub fn to_i64(&self) -> Vec<i64> {
        match self {
            HostBuffer::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::U8(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::U32(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::I32(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::I64(v) => v.to_vec(),
            HostBuffer::F16(v) => v.iter().map(|&x| x.to_f64() as i64).collect(),
            HostBuffer::F32(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::F64(v) => v.iter().map(|&x| x as i64).collect(),
            HostBuffer::BF16(v) => v.iter().map(|&x| x.to_f64() as i64).collect(),
        }
    }

    /// Builds a buffer of `dtype` from f64 values (rounding to f32, or converting to ints as Rust's `as`).
    pub fn from_f64(dtype: DType, v: &[f64]) -> HostBuffer {
        match dtype {
            DType::Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0.0).collect()),
            DType::U8 => HostBuffer::U8(v.iter().map(|&x| x as i64 as u8).collect()),
            DType::U32 => HostBuffer::U32(v.iter().map(|&x| x as i64 as u32).collect()),
            DType::I32 => HostBuffer::I32(v.iter().map(|&x| x as i64 as i32).collect()),
            DType::I64 => HostBuffer::I64(v.iter().map(|&x| x as i64).collect()),
            DType::F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => HostBuffer::F64(HostVec::from_slice(v)),
            DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| crate::dtype::bf16_from_f64(x)).collect()),
        }
    }

    /// Builds a buffer of `dtype` from i64 values (wrapping to the narrower int types).
    pub fn from_i64(dtype: DType, v: &[i64]) -> HostBuffer {
        match dtype {
            DType::Bool => HostBuffer::Bool(v.iter().map(|&x| x != 0).collect()),
            DType::U8 => HostBuffer::U8(v.iter().map(|&x| x as u8).collect()),
            DType::U32 => HostBuffer::U32(v.iter().map(|&x| x as u32).collect()),
            DType::I32 => HostBuffer::I32(v.iter().map(|&x| x as i32).collect()),
            DType::I64 => HostBuffer::I64(HostVec::from_slice(v)),
            // Through f64: exact below 2^53, and anything larger is inf in f16 either way.
            DType::F16 => HostBuffer::F16(v.iter().map(|&x| f16::from_f64(x as f64)).collect()),
            DType::F32 => HostBuffer::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => HostBuffer::F64(v.iter().map(|&x| x as f64).collect()),
            // As PyTorch: through f32 (`x as f32` rounds to nearest), then to bf16.
            DType::BF16 => HostBuffer::BF16(v.iter().map(|&x| bf16::from_f32(x as f32)).collect()),
        }
    }

    /// The element at flat index `i` as a scalar.
    pub fn get(&self, i: usize) -> Scalar {
        match self {
            HostBuffer::Bool(v) => Scalar::Bool(v[i]),
            HostBuffer::U8(v) => Scalar::Int(v[i] as i64),
            HostBuffer::U32(v) => Scalar::Int(v[i] as i64),
            HostBuffer::I32(v) => Scalar::Int(v[i] as i64),
            HostBuffer::I64(v) => Scalar::Int(v[i]),
            HostBuffer::F16(v) => Scalar::Float(v[i].to_f64()),
            HostBuffer::F32(v) => Scalar::Float(v[i] as f64),
            HostBuffer::F64(v) => Scalar::Float(v[i]),
            HostBuffer::BF16(v) => Scalar::Float(v[i].to_f64()),
        }
    }
}
