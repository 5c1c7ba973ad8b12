//! Tensor data as the communication library sends it: one vector of an element type MPI has a built-in datatype
//! for, converted from and to kiln's host buffers.
//!
//! Two forms, because sums and copies want different things of the 16-bit floats:
//! - `for_reduce`: f16 and bf16 widen to f32, are summed in f32 and rounded once when converted back (PyTorch's
//!   NCCL sums bf16 in bf16 at every hop; one rounding is never less accurate, and MPI has no 16-bit float type).
//!   bool becomes u8 and reduces with logical or (a sum of bools that stays a bool).
//! - `for_copy` (broadcast, all-gather): the bits travel unchanged: f16 and bf16 as u16, bool as u8.

use crate::error::{Error, Result};
use kiln_jit::{DType, HostBuffer, HostVec, bf16, f16};

/// Data in an MPI-native element type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Wire {
    U8(HostVec<u8>),
    U16(HostVec<u16>),
    U32(HostVec<u32>),
    I32(HostVec<i32>),
    I64(HostVec<i64>),
    F32(HostVec<f32>),
    F64(HostVec<f64>),
}

/// Data to send, borrowed: a CPU tensor's buffer is sent where it lies, without a copy.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WireRef<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

/// How elements combine in an all-reduce, after `Wire::for_reduce` chose the element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    /// Logical or (bool tensors).
    Or,
}

/// The elements of `host` to sum (see the module doc), and how they combine: borrowed where `host` already holds
/// an MPI element type, converted otherwise.
pub(crate) fn reduce_view(host: &HostBuffer) -> (Result<WireRef<'_>, Wire>, Combine) {
    match host {
        HostBuffer::Bool(v) => (Err(Wire::U8(v.iter().map(|&b| u8::from(b)).collect())), Combine::Or),
        HostBuffer::F16(v) => (Err(Wire::F32(v.iter().map(|x| x.to_f32()).collect())), Combine::Sum),
        HostBuffer::BF16(v) => (Err(Wire::F32(v.iter().map(|x| x.to_f32()).collect())), Combine::Sum),
        HostBuffer::U8(v) => (Ok(WireRef::U8(v)), Combine::Sum),
        HostBuffer::U32(v) => (Ok(WireRef::U32(v)), Combine::Sum),
        HostBuffer::I32(v) => (Ok(WireRef::I32(v)), Combine::Sum),
        HostBuffer::I64(v) => (Ok(WireRef::I64(v)), Combine::Sum),
        HostBuffer::F32(v) => (Ok(WireRef::F32(v)), Combine::Sum),
        HostBuffer::F64(v) => (Ok(WireRef::F64(v)), Combine::Sum),
    }
}

impl Wire {
    /// The elements to sum (see the module doc), owned, and how they combine.
    pub(crate) fn for_reduce(host: &HostBuffer) -> (Wire, Combine) {
        match reduce_view(host) {
            (Ok(view), combine) => (view.to_owned(), combine),
            (Err(wire), combine) => (wire, combine),
        }
    }

    /// `for_reduce` of a buffer kiln owns: moved, not copied, where it is of an MPI element type.
    pub(crate) fn for_reduce_owned(host: HostBuffer) -> (Wire, Combine) {
        match host {
            HostBuffer::Bool(_) | HostBuffer::F16(_) | HostBuffer::BF16(_) => Wire::for_reduce(&host),
            other => (Wire::for_copy(other), Combine::Sum),
        }
    }

    /// A borrowed view of this data.
    pub(crate) fn as_ref(&self) -> WireRef<'_> {
        match self {
            Wire::U8(v) => WireRef::U8(v),
            Wire::U16(v) => WireRef::U16(v),
            Wire::U32(v) => WireRef::U32(v),
            Wire::I32(v) => WireRef::I32(v),
            Wire::I64(v) => WireRef::I64(v),
            Wire::F32(v) => WireRef::F32(v),
            Wire::F64(v) => WireRef::F64(v),
        }
    }

    /// The elements bit for bit.
    pub(crate) fn for_copy(host: HostBuffer) -> Wire {
        match host {
            HostBuffer::Bool(v) => Wire::U8(v.iter().copied().map(u8::from).collect()),
            HostBuffer::U8(v) => Wire::U8(v),
            HostBuffer::U32(v) => Wire::U32(v),
            HostBuffer::I32(v) => Wire::I32(v),
            HostBuffer::I64(v) => Wire::I64(v),
            HostBuffer::F16(v) => Wire::U16(v.iter().copied().map(f16::to_bits).collect()),
            HostBuffer::BF16(v) => Wire::U16(v.iter().copied().map(bf16::to_bits).collect()),
            HostBuffer::F32(v) => Wire::F32(v),
            HostBuffer::F64(v) => Wire::F64(v),
        }
    }

    /// Back to a host buffer of `dtype`, from either form. A pairing no conversion above makes is an internal error.
    pub(crate) fn into_host(self, dtype: DType) -> Result<HostBuffer> {
        Ok(match (dtype, self) {
            (DType::Bool, Wire::U8(v)) => HostBuffer::Bool(v.iter().copied().map(|x| x != 0).collect()),
            (DType::U8, Wire::U8(v)) => HostBuffer::U8(v),
            (DType::U32, Wire::U32(v)) => HostBuffer::U32(v),
            (DType::I32, Wire::I32(v)) => HostBuffer::I32(v),
            (DType::I64, Wire::I64(v)) => HostBuffer::I64(v),
            (DType::F32, Wire::F32(v)) => HostBuffer::F32(v),
            (DType::F64, Wire::F64(v)) => HostBuffer::F64(v),
            (DType::F16, Wire::F32(v)) => HostBuffer::F16(v.iter().copied().map(f16::from_f32).collect()),
            (DType::BF16, Wire::F32(v)) => HostBuffer::BF16(v.iter().copied().map(bf16::from_f32).collect()),
            (DType::F16, Wire::U16(v)) => HostBuffer::F16(v.iter().copied().map(f16::from_bits).collect()),
            (DType::BF16, Wire::U16(v)) => HostBuffer::BF16(v.iter().copied().map(bf16::from_bits).collect()),
            (dtype, wire) => {
                return Err(Error::Distributed {
                    op: "receive",
                    message: format!("internal: {} elements cannot become {dtype}", wire.kind()),
                });
            }
        })
    }

    /// Appends `more` (of the same element type) to this data.
    pub(crate) fn extend(&mut self, more: WireRef<'_>) -> Result<()> {
        match (self, more) {
            (Wire::U8(a), WireRef::U8(b)) => a.extend_from_slice(b),
            (Wire::U16(a), WireRef::U16(b)) => a.extend_from_slice(b),
            (Wire::U32(a), WireRef::U32(b)) => a.extend_from_slice(b),
            (Wire::I32(a), WireRef::I32(b)) => a.extend_from_slice(b),
            (Wire::I64(a), WireRef::I64(b)) => a.extend_from_slice(b),
            (Wire::F32(a), WireRef::F32(b)) => a.extend_from_slice(b),
            (Wire::F64(a), WireRef::F64(b)) => a.extend_from_slice(b),
            (a, _) => {
                return Err(Error::Distributed {
                    op: "all_reduce",
                    message: format!("internal: a bucket of {} elements gets elements of another type", a.kind()),
                });
            }
        }
        Ok(())
    }

    /// The element type's name, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Wire::U8(_) => "u8",
            Wire::U16(_) => "u16",
            Wire::U32(_) => "u32",
            Wire::I32(_) => "i32",
            Wire::I64(_) => "i64",
            Wire::F32(_) => "f32",
            Wire::F64(_) => "f64",
        }
    }

    /// `world` copies of this data end to end: what an all-gather returns in a world of one process.
    pub(crate) fn repeated(&self, world: usize) -> Wire {
        fn rep<T: Copy>(v: &[T], n: usize) -> HostVec<T> {
            let mut out = HostVec::with_capacity(v.len() * n);
            for _ in 0..n {
                out.extend_from_slice(v);
            }
            out
        }
        match self {
            Wire::U8(v) => Wire::U8(rep(v, world)),
            Wire::U16(v) => Wire::U16(rep(v, world)),
            Wire::U32(v) => Wire::U32(rep(v, world)),
            Wire::I32(v) => Wire::I32(rep(v, world)),
            Wire::I64(v) => Wire::I64(rep(v, world)),
            Wire::F32(v) => Wire::F32(rep(v, world)),
            Wire::F64(v) => Wire::F64(rep(v, world)),
        }
    }
}

/// An empty vector with room for `len` elements, from kiln's pool of freed host buffers where it has one of that
/// size (a fresh 40 MB allocation page-faults on first write, which costs more than summing it here).
pub(crate) trait Pooled: Sized {
    fn pooled(len: usize) -> HostVec<Self>;
}

macro_rules! pooled {
    ($($t:ty => $variant:ident),*) => {$(
        impl Pooled for $t {
            fn pooled(len: usize) -> HostVec<$t> {
                match kiln_backends::host_pool::take(DType::$variant, len) {
                    HostBuffer::$variant(v) => v,
                    _ => HostVec::with_capacity(len),
                }
            }
        }
    )*};
}
pooled!(u8 => U8, u32 => U32, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

impl Pooled for u16 {
    fn pooled(len: usize) -> HostVec<u16> {
        HostVec::with_capacity(len) // no 16-bit integer dtype: f16 and bf16 are summed as f32
    }
}

impl WireRef<'_> {
    /// An empty `Wire` of this element type with room for `len` elements (pooled).
    pub(crate) fn empty_like(&self, len: usize) -> Wire {
        match self {
            WireRef::U8(_) => Wire::U8(Pooled::pooled(len)),
            WireRef::U16(_) => Wire::U16(Pooled::pooled(len)),
            WireRef::U32(_) => Wire::U32(Pooled::pooled(len)),
            WireRef::I32(_) => Wire::I32(Pooled::pooled(len)),
            WireRef::I64(_) => Wire::I64(Pooled::pooled(len)),
            WireRef::F32(_) => Wire::F32(Pooled::pooled(len)),
            WireRef::F64(_) => Wire::F64(Pooled::pooled(len)),
        }
    }

    pub(crate) fn to_owned(self) -> Wire {
        match self {
            WireRef::U8(v) => Wire::U8(HostVec::from_slice(v)),
            WireRef::U16(v) => Wire::U16(HostVec::from_slice(v)),
            WireRef::U32(v) => Wire::U32(HostVec::from_slice(v)),
            WireRef::I32(v) => Wire::I32(HostVec::from_slice(v)),
            WireRef::I64(v) => Wire::I64(HostVec::from_slice(v)),
            WireRef::F32(v) => Wire::F32(HostVec::from_slice(v)),
            WireRef::F64(v) => Wire::F64(HostVec::from_slice(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        for dtype in DType::ALL {
            let values: Vec<f64> = vec![0.0, 1.0, -2.5, 3.0];
            let values: Vec<f64> = match dtype {
                DType::Bool => vec![0.0, 1.0, 1.0, 0.0],
                DType::U8 | DType::U32 => vec![0.0, 1.0, 250.0, 3.0],
                _ => values,
            };
            let host = HostBuffer::from_f64(dtype, &values);
            assert_eq!(Wire::for_copy(host.clone()).into_host(dtype).unwrap(), host, "{dtype} copy");
            assert_eq!(Wire::for_reduce(&host).0.into_host(dtype).unwrap(), host, "{dtype} reduce");
        }
    }

    #[test]
    fn sixteen_bit_floats_travel_as_bits_and_sum_in_f32() {
        let host = HostBuffer::BF16(vec![bf16::from_bits(0x7fc1), bf16::from_bits(0x0001)].into());
        assert_eq!(Wire::for_copy(host.clone()), Wire::U16(vec![0x7fc1, 0x0001].into()));
        let (wire, combine) = Wire::for_reduce(&HostBuffer::F16(vec![f16::from_f32(0.5)].into()));
        assert_eq!((wire, combine), (Wire::F32(vec![0.5].into()), Combine::Sum));
        assert_eq!(Wire::for_reduce(&HostBuffer::Bool(vec![true].into())).1, Combine::Or);
    }
}
