//! Rearrangements composed from the movement primitives, with PyTorch's semantics: `tril`/`triu` (a mask from two
//! iotas and a select), `roll` (two narrows and a cat per dim), `repeat`/`tile` (a broadcast of interleaved unit
//! dims, then a reshape), `chunk`/`split` (narrows, which are views until something reads them), and the border
//! modes of `pad` (reflect, replicate, circular: narrows, flips and broadcasts concatenated).

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::Scalar;

/// How [`Tensor::pad_with`] fills the border (`torch.nn.functional.pad`'s modes besides `constant`, which is
/// [`Tensor::pad`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// The elements mirrored about the edge, the edge itself not repeated (`[1 2 3]` padded by 2: `3 2 [1 2 3] 2 1`);
    /// each pad must be shorter than its dim.
    Reflect,
    /// The edge element repeated (`1 1 [1 2 3] 3 3`); the dim must not be empty.
    Replicate,
    /// The other end wrapped around (`2 3 [1 2 3] 1 2`); each pad at most its dim.
    Circular,
}

impl Tensor {
    /// Pads in `mode`: `pads[0]` is (before, after) for the last dim, `pads[1]` for the one before it, and so on,
    /// as [`Tensor::pad`]. Unlike PyTorch, any dims may be padded, whatever the rank.
    #[track_caller]
    pub fn pad_with(&self, pads: &[(usize, usize)], mode: PadMode) -> Tensor {
        if pads.len() > self.rank() {
            fail!("pad", "{} (before, after) pairs given for a tensor of rank {}", pads.len(), self.rank());
        }
        let mut out = self.clone();
        for (i, &(before, after)) in pads.iter().enumerate() {
            let d = self.rank() - 1 - i;
            let n = self.dims()[d];
            let ok = match mode {
                PadMode::Reflect => before < n && after < n,
                PadMode::Replicate => n > 0 || before + after == 0,
                PadMode::Circular => before <= n && after <= n,
            };
            if !ok {
                fail!("pad", "{mode:?} padding ({before}, {after}) does not fit dim {d} of length {n}");
            }
            let edge = |start: usize, len: usize, at_end: bool| -> Tensor {
                match mode {
                    PadMode::Reflect => {
                        out.narrow(d as isize, if at_end { n - 1 - len } else { 1 }, len).flip(d as isize)
                    }
                    PadMode::Replicate => {
                        let mut dims = out.dims().to_vec();
                        dims[d] = len;
                        out.narrow(d as isize, if at_end { n - 1 } else { 0 }, 1).expand_to("pad", &dims)
                    }
                    PadMode::Circular => out.narrow(d as isize, start, len),
                }
            };
            let mut parts = Vec::with_capacity(3);
            if before > 0 {
                parts.push(edge(n - before, before, false));
            }
            parts.push(out.clone());
            if after > 0 {
                parts.push(edge(0, after, true));
            }
            if parts.len() > 1 {
                out = Tensor::cat(&parts.iter().collect::<Vec<_>>(), d as isize);
            }
        }
        out
    }

    /// The lower triangle of the last two dims: elements with `col - row <= diagonal` kept, the rest 0 (PyTorch's
    /// `tril`; `diagonal` 0 is the main diagonal, positive above it, negative below). Leading dims are a batch.
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Tensor {
        self.triangle("tril", diagonal, true)
    }

    /// The upper triangle of the last two dims: elements with `col - row >= diagonal` kept, the rest 0 (`triu`).
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Tensor {
        self.triangle("triu", diagonal, false)
    }

    #[track_caller]
    fn triangle(&self, name: &str, diagonal: i64, lower: bool) -> Tensor {
        if self.rank() < 2 {
            fail!(name, "needs at least 2 dims, got shape {:?}", self.dims());
        }
        let (r, c) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        let (dev, idx) = (self.device(), self.device().index_dtype());
        // col - row over [r, c], as the device's index dtype (an i32 on wgpu: shapes there are far below 2^31).
        let rows = Tensor::iota(Scalar::Int(0), Scalar::Int(1), r, idx, &dev).reshape_prim(vec![r, 1]);
        let cols = Tensor::iota(Scalar::Int(0), Scalar::Int(1), c, idx, &dev).reshape_prim(vec![1, c]);
        let offset = cols.sub(&rows);
        let keep = if lower { offset.le(diagonal) } else { offset.ge(diagonal) };
        keep.where_(self, self.zeros_like())
    }

    /// Each element moved `shifts[i]` places along `dims[i]`, wrapping around (PyTorch's `roll`); with no dims the
    /// tensor is rolled as if flattened, and keeps its shape.
    #[track_caller]
    pub fn roll(&self, shifts: &[i64], dims: &[isize]) -> Tensor {
        if dims.is_empty() {
            if shifts.len() != 1 {
                fail!("roll", "without dims, give exactly one shift (got {})", shifts.len());
            }
            return self.flatten().roll(shifts, &[0]).reshape_prim(self.dims().to_vec());
        }
        if shifts.len() != dims.len() {
            fail!("roll", "{} shifts for {} dims: give one shift per dim", shifts.len(), dims.len());
        }
        let mut out = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let d = resolve_dim("roll", dim, self.rank());
            let n = self.dims()[d] as i64;
            let s = if n == 0 { 0 } else { shift.rem_euclid(n) };
            if s == 0 {
                continue;
            }
            let (tail, head) =
                (out.narrow(d as isize, (n - s) as usize, s as usize), out.narrow(d as isize, 0, (n - s) as usize));
            out = Tensor::cat(&[&tail, &head], d as isize);
        }
        out
    }

    /// The tensor repeated `sizes[i]` times along each dim (PyTorch's `repeat`): `sizes` has at least as many
    /// entries as the tensor has dims, and extra leading entries add dims.
    #[track_caller]
    pub fn repeat(&self, sizes: &[usize]) -> Tensor {
        if sizes.len() < self.rank() {
            fail!("repeat", "{} repeats for a tensor of {} dims: give at least one per dim", sizes.len(), self.rank());
        }
        let lead = sizes.len() - self.rank();
        let dims: Vec<usize> = std::iter::repeat_n(1, lead).chain(self.dims().iter().copied()).collect();
        // [d0, d1, ..] -> [1, d0, 1, d1, ..] -> broadcast to [s0, d0, s1, d1, ..] -> [s0 * d0, s1 * d1, ..].
        let interleaved: Vec<usize> = dims.iter().flat_map(|&d| [1, d]).collect();
        let target: Vec<usize> = sizes.iter().zip(&dims).flat_map(|(&s, &d)| [s, d]).collect();
        let out: Vec<usize> = sizes.iter().zip(&dims).map(|(&s, &d)| s * d).collect();
        self.reshape_prim(interleaved).expand_to("repeat", &target).contiguous().reshape_prim(out)
    }

    /// `repeat` with `reps` padded with leading 1s to the tensor's rank (PyTorch's `tile`).
    #[track_caller]
    pub fn tile(&self, reps: &[usize]) -> Tensor {
        let pad = self.rank().saturating_sub(reps.len());
        let sizes: Vec<usize> = std::iter::repeat_n(1, pad).chain(reps.iter().copied()).collect();
        self.repeat(&sizes)
    }

    /// Up to `chunks` pieces along `dim`, each `ceil(n / chunks)` long but the last (PyTorch's `chunk`: fewer pieces
    /// where the length does not fill them, e.g. 5 elements in 4 chunks give 3 of 2, 2 and 1).
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: isize) -> Vec<Tensor> {
        if chunks == 0 {
            fail!("chunk", "chunks must be at least 1");
        }
        let d = resolve_dim("chunk", dim, self.rank());
        let size = self.dims()[d].div_ceil(chunks).max(1);
        self.split(size, dim)
    }

    /// Pieces of `size` along `dim`, the last shorter where the length is not a multiple (PyTorch's `split` with an
    /// int).
    #[track_caller]
    pub fn split(&self, size: usize, dim: isize) -> Vec<Tensor> {
        if size == 0 {
            fail!("split", "the piece size must be at least 1");
        }
        let d = resolve_dim("split", dim, self.rank());
        let n = self.dims()[d];
        let sizes: Vec<usize> = (0..n.div_ceil(size).max(1)).map(|i| size.min(n - (i * size).min(n))).collect();
        self.split_sizes(&sizes, dim)
    }

    /// Pieces of the given lengths along `dim`, which must add up to its length (PyTorch's `split` with a list).
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Vec<Tensor> {
        let d = resolve_dim("split", dim, self.rank());
        let n = self.dims()[d];
        if sizes.iter().sum::<usize>() != n {
            fail!("split", "sizes {sizes:?} add up to {}, but dim {d} has length {n}", sizes.iter().sum::<usize>());
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow(d as isize, start, len);
                start += len;
                piece
            })
            .collect()
    }
}
