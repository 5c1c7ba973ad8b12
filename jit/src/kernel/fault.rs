//! Kernel faults: what a kernel finds wrong with its data while it runs (an index outside the dimension it
//! gathers along), reported through one *fault record* per run instead of a wrong value or a read outside a
//! buffer.
//!
//! Every backend gives the kernels that can fault (`KernelIr::can_fault`) the address of a record of
//! [`FAULT_WORDS`] integers, zeroed before the run: `[kind, a, b]`. A kernel that finds a fault claims the record
//! with a compare-and-swap of `kind` from 0 (so of several faults, one whole record wins) and then writes `a` and
//! `b`; it goes on with a value that reads inside the buffer (index 0), so the run finishes. After the run the
//! backend decodes the record ([`Fault::decode`]) and returns an error instead of the outputs. The words are i64 on
//! the CPU and 32-bit on wgpu (which has no 64-bit integers: its indices are i32 anyway).
//!
//! This is the one channel for data-dependent errors, which carries the index check and the linear algebra routines'
//! findings (a singular matrix, one not positive definite): a kind is a number here and a message in `Display`.

use std::fmt;

/// Integers in a fault record.
pub const FAULT_WORDS: usize = 3;

/// A data-dependent error a kernel found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A gathered index outside `0..len`.
    Index { len: i64, index: i64 },
    /// Matrix `batch_index` (counted over the leading dims, row-major) is singular: its LU factorization met a
    /// numerically zero pivot in column `pivot`, or a triangular solve a zero diagonal element in row `pivot`
    /// (`kernel::routine`).
    Singular { batch_index: i64, pivot: i64 },
    /// Matrix `batch_index` is not positive definite: its leading minor of order `minor` is not (Cholesky).
    NotPositiveDefinite { batch_index: i64, minor: i64 },
    /// A scattered index outside `0..len` (`kernel::scatter`).
    ScatterIndex { len: i64, index: i64 },
    /// A record with a kind this build does not know (a kernel and a runtime out of step).
    Unknown { kind: i64 },
}

/// `kind` of [`Fault::Index`].
pub const FAULT_INDEX: i64 = 1;
/// `kind` of [`Fault::Singular`].
pub const FAULT_SINGULAR: i64 = 2;
/// `kind` of [`Fault::NotPositiveDefinite`].
pub const FAULT_NOT_POSITIVE_DEFINITE: i64 = 3;
/// `kind` of [`Fault::ScatterIndex`].
pub const FAULT_SCATTER_INDEX: i64 = 4;

impl Fault {
    /// The record's words as a kernel writes them.
    pub fn encode(self) -> [i64; FAULT_WORDS] {
        match self {
            Fault::Index { len, index } => [FAULT_INDEX, len, index],
            Fault::Singular { batch_index, pivot } => [FAULT_SINGULAR, batch_index, pivot],
            Fault::NotPositiveDefinite { batch_index, minor } => [FAULT_NOT_POSITIVE_DEFINITE, batch_index, minor],
            Fault::ScatterIndex { len, index } => [FAULT_SCATTER_INDEX, len, index],
            Fault::Unknown { kind } => [kind, 0, 0],
        }
    }

    /// The fault a record of 32-bit words holds (a GPU's: little-endian bytes), `None` when no kernel wrote one.
    pub fn decode_i32_bytes(bytes: &[u8]) -> Option<Fault> {
        let words: [i64; FAULT_WORDS] = std::array::from_fn(|i| {
            let w = bytes.get(4 * i..4 * i + 4).map_or([0; 4], |b| [b[0], b[1], b[2], b[3]]);
            i32::from_le_bytes(w) as i64
        });
        Fault::decode(words)
    }

    /// The fault a record holds, `None` when no kernel wrote one.
    pub fn decode(words: [i64; FAULT_WORDS]) -> Option<Fault> {
        match words[0] {
            0 => None,
            FAULT_INDEX => Some(Fault::Index { len: words[1], index: words[2] }),
            FAULT_SINGULAR => Some(Fault::Singular { batch_index: words[1], pivot: words[2] }),
            FAULT_NOT_POSITIVE_DEFINITE => Some(Fault::NotPositiveDefinite { batch_index: words[1], minor: words[2] }),
            FAULT_SCATTER_INDEX => Some(Fault::ScatterIndex { len: words[1], index: words[2] }),
            kind => Some(Fault::Unknown { kind }),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Index { len, index } => {
                write!(f, "gather: index {index} is out of range for a dimension of size {len} (valid: 0..{len})")
            }
            Fault::Singular { batch_index, pivot } => write!(
                f,
                "the matrix at batch index {batch_index} is singular (pivot {pivot}, counted from 0, is zero to \
                 working precision); a solve or inverse would divide by it"
            ),
            Fault::NotPositiveDefinite { batch_index, minor } => write!(
                f,
                "the matrix at batch index {batch_index} is not positive definite (its leading minor of order \
                 {minor} is not)"
            ),
            Fault::ScatterIndex { len, index } => {
                write!(f, "scatter_add: index {index} is out of range for a dimension of size {len} (valid: 0..{len})")
            }
            Fault::Unknown { kind } => write!(f, "a kernel reported a fault of unknown kind {kind}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        assert_eq!(Fault::decode([0; FAULT_WORDS]), None);
        let f = Fault::Index { len: 10, index: -3 };
        assert_eq!(Fault::decode(f.encode()), Some(f));
        assert_eq!(f.to_string(), "gather: index -3 is out of range for a dimension of size 10 (valid: 0..10)");
        assert_eq!(Fault::decode([7, 1, 2]), Some(Fault::Unknown { kind: 7 }));
        for f in [
            Fault::Singular { batch_index: 2, pivot: 1 },
            Fault::NotPositiveDefinite { batch_index: 0, minor: 3 },
            Fault::ScatterIndex { len: 4, index: 9 },
        ] {
            assert_eq!(Fault::decode(f.encode()), Some(f));
        }
    }
}
