//! Indexing by data, with PyTorch's semantics: `gather`, `index_select`, `take_along_dim` and `masked_fill` read,
//! `scatter_add` and `index_add` accumulate.
//!
//! The reads are one primitive, `Op::Gather` (`out[j] = src[j with j[dim] = index[j]]`): each op here shapes its
//! operands for it (narrows the source, broadcasts the index) and records one node, which fuses like any load. An
//! index outside its dimension is an error when the result is read (`kiln::Error::Backend` with the index and the
//! size, from the kernel's fault record), never a read outside the source or a silent value. Indices are i64 as in
//! PyTorch, or i32 (a device without 64-bit integers, wgpu, has only those: indices up to 2^31).
//!
//! The accumulations (and the gradient of a gather) are one routine, `Op::ScatterRows` (`kernel::scatter`): the
//! destination's dim moved first, each source row (or element) added into the row its index names, in a fixed
//! order, so the result is the same bits run to run and device to device, repeated indices included (PyTorch's CUDA
//! kernel adds with atomics, in no fixed order), at O(indices x width) work. An index out of range is an error when
//! the result is read, as for a gather. Integer values keep a comparison of every index with every position
//! ([`scatter_sum`]).

use crate::args::{fail, resolve_dim};
use crate::tensor::Tensor;
use kiln_jit::{DType, Op, Scalar, Shape};

/// Panics unless `index` holds integer indices a gather takes.
#[track_caller]
fn check_index(op: &str, index: &Tensor) {
    if !matches!(index.dtype(), DType::I64 | DType::I32) {
        fail!(op, "indices must be i64 (as in PyTorch) or i32, not {}", index.dtype());
    }
}

impl Tensor {
    /// `out[..., j, ...] = self[..., index[..., j, ...], ...]` along `dim` (`torch.gather`): `index` has the rank of
    /// `self` and, in every other dim, at most its size; the result has `index`'s shape. An index outside
    /// `0..self.dims()[dim]` is an error when the result is read.
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Tensor) -> Tensor {
        check_index("gather", index);
        let d = resolve_dim("gather", dim, self.rank());
        if index.rank() != self.rank() {
            fail!("gather", "index has rank {}, the input {} (they must match)", index.rank(), self.rank());
        }
        let mut src = self.clone();
        for (a, (&n, &m)) in self.dims().iter().zip(index.dims()).enumerate() {
            if a == d {
                continue;
            }
            if m > n {
                fail!("gather", "index is {:?}, larger than the input {:?} in dim {a}", index.dims(), self.dims());
            }
            if m < n {
                src = src.narrow(a as isize, 0, m);
            }
        }
        src.gather_prim(d, index)
    }

    /// The `Gather` node: `src` matches `index` in every dim but `axis`.
    #[track_caller]
    pub(crate) fn gather_prim(&self, axis: usize, index: &Tensor) -> Tensor {
        let srcs = smallvec::smallvec![self.clone(), index.clone()];
        Tensor::from_op(Op::Gather { axis }, srcs, Shape::new(index.dims()), self.dtype())
    }

    /// The slices of `self` at positions `index` (1-d) along `dim` (`torch.index_select`).
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Tensor {
        check_index("index_select", index);
        let d = resolve_dim("index_select", dim, self.rank());
        if index.rank() > 1 {
            fail!("index_select", "index must be 1-d, got shape {:?}", index.dims());
        }
        if self.rank() == 0 {
            return self.reshape([1]).gather_prim(0, &index.reshape([index.numel()])).reshape(index.dims().to_vec());
        }
        let mut dims = self.dims().to_vec();
        dims[d] = index.numel();
        let mut at = vec![1usize; self.rank()];
        at[d] = index.numel();
        self.gather_prim(d, &index.reshape(at).expand_to("index_select", &dims))
    }

    /// `gather` with `self` and `indices` broadcast together in every dim but `dim` (`torch.take_along_dim`); with
    /// `dim` `None`, both are flattened first.
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: Option<isize>) -> Tensor {
        check_index("take_along_dim", indices);
        let Some(dim) = dim else { return self.flatten().gather_prim(0, &indices.flatten()) };
        let d = resolve_dim("take_along_dim", dim, self.rank());
        if indices.rank() != self.rank() {
            fail!("take_along_dim", "indices have rank {}, the input {}", indices.rank(), self.rank());
        }
        let mut src_dims = self.dims().to_vec();
        let mut idx_dims = indices.dims().to_vec();
        for a in (0..self.rank()).filter(|&a| a != d) {
            let (n, m) = (src_dims[a], idx_dims[a]);
            let both = match (n, m) {
                _ if n == m => n,
                (1, m) => m,
                (n, 1) => n,
                _ => fail!(
                    "take_along_dim",
                    "shapes {:?} and {:?} do not broadcast in dim {a}",
                    self.dims(),
                    indices.dims()
                ),
            };
            src_dims[a] = both;
            idx_dims[a] = both;
        }
        let src = self.expand_to("take_along_dim", &src_dims);
        src.gather_prim(d, &indices.expand_to("take_along_dim", &idx_dims))
    }

    /// `value` (converted to `self`'s dtype) where `mask` (bool, broadcast to `self`) holds, `self` elsewhere
    /// (`Tensor.masked_fill`).
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Tensor {
        if mask.dtype() != DType::Bool {
            fail!("masked_fill", "the mask must be bool, not {}", mask.dtype());
        }
        let fill = Tensor::full(self.dims(), value, self.dtype(), &self.device());
        mask.expand_to("masked_fill", self.dims()).where_(&fill, self)
    }

    /// `self` plus `src` added at positions `index` along `dim` (`Tensor.scatter_add`): for every position `j` of
    /// `index`, `out[..., index[j], ...] += src[j]`. `index` has the rank of `self` and, in every dim, at most
    /// `src`'s size (and, but in `dim`, at most `self`'s). Deterministic, repeated indices included. A float
    /// index out of range is an error when the result is read (as PyTorch raises); integer values skip it.
    #[track_caller]
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Tensor {
        check_index("scatter_add", index);
        let d = resolve_dim("scatter_add", dim, self.rank());
        if index.rank() != self.rank() || src.rank() != self.rank() {
            fail!(
                "scatter_add",
                "index, src and the input must have one rank: {:?}, {:?}, {:?}",
                index.dims(),
                src.dims(),
                self.dims()
            );
        }
        let mut part = src.clone();
        for (a, &m) in index.dims().iter().enumerate() {
            if m > src.dims()[a] || (a != d && m > self.dims()[a]) {
                fail!(
                    "scatter_add",
                    "index {:?} is larger than src {:?} or the input {:?} in dim {a}",
                    index.dims(),
                    src.dims(),
                    self.dims()
                );
            }
            if m < src.dims()[a] {
                part = part.narrow(a as isize, 0, m);
            }
        }
        if !src.dtype().is_float() && src.dtype() != self.dtype() {
            fail!("scatter_add", "src is {}, the input {}", src.dtype(), self.dtype());
        }
        let sum = scatter_sum(&part.to_dtype(self.dtype()), d, index, self.dims()[d]);
        // Dims where the index covers only part of the input: the rest gets nothing.
        let pads: Vec<(usize, usize)> = (0..self.rank()).rev().map(|a| (0, self.dims()[a] - sum.dims()[a])).collect();
        let sum = if pads.iter().any(|&(_, p)| p > 0) { sum.pad(&pads, 0.0) } else { sum };
        self.add(&sum)
    }

    /// `self` plus the slices of `source` added at positions `index` (1-d) along `dim`, times `alpha`
    /// (`Tensor.index_add`): `out[..., index[i], ...] += alpha * source[..., i, ...]`. Deterministic, as
    /// [`Tensor::scatter_add`].
    #[track_caller]
    pub fn index_add(&self, dim: isize, index: &Tensor, source: &Tensor, alpha: f64) -> Tensor {
        check_index("index_add", index);
        let d = resolve_dim("index_add", dim, self.rank());
        if index.rank() > 1 || source.rank() != self.rank() || source.dims()[d] != index.numel() {
            fail!(
                "index_add",
                "index must be 1-d with one entry per slice of source along dim {d}: index {:?}, source {:?}",
                index.dims(),
                source.dims()
            );
        }
        let same = (0..self.rank()).all(|a| a == d || source.dims()[a] == self.dims()[a]);
        if !same {
            fail!("index_add", "source {:?} must match the input {:?} but in dim {d}", source.dims(), self.dims());
        }
        let mut at = vec![1usize; self.rank()];
        at[d] = index.numel();
        let index = index.reshape(at).expand_to("index_add", source.dims());
        let source = if alpha == 1.0 { source.clone() } else { source.mul(alpha) };
        self.add(scatter_sum(&source.to_dtype(self.dtype()), d, &index, self.dims()[d]))
    }
}

/// `out[..., s, ...] = sum over j of (index[..., j, ...] == s) * src[..., j, ...]` for `s` in `0..positions` along
/// `dim` (`src` and `index` of one shape).
///
/// Float values go through the scatter routine (`Op::ScatterRows`, `kernel::scatter`): `dim` moved first and the
/// rest flattened, `[j, rest] -> [positions, rest]`, one index per row where the index is one per position along
/// `dim` broadcast over the rest (`index_select`, `embedding`, `index_add`: the broadcast is not materialized), else
/// one per element. It walks the values once (an embedding gradient at a 32k vocabulary costs its tokens x dim adds,
/// not a 32k x tokens x dim one-hot product), adds in a fixed order, and faults on an index out of range; f16 and
/// bf16 values are summed in f32 and rounded once.
///
/// Integer values take a comparison of every index with every position, summed as one fused reduction
/// (O(positions x values), deterministic; an index out of range adds nothing): integer scatters are small.
pub(crate) fn scatter_sum(src: &Tensor, dim: usize, index: &Tensor, positions: usize) -> Tensor {
    if !src.dtype().is_float() {
        return scatter_compare(src, dim, index, positions);
    }
    // `dim` first, the rest flattened: [j, rest] -> [positions, rest], then back in place.
    let mut perm: Vec<isize> = vec![dim as isize];
    perm.extend((0..src.rank() as isize).filter(|&a| a != dim as isize));
    let mut inverse = vec![0isize; perm.len()];
    for (k, &p) in perm.iter().enumerate() {
        inverse[p as usize] = k as isize;
    }
    let moved = src.permute(perm.clone());
    let rest: Vec<usize> = moved.dims()[1..].to_vec();
    let (j, w) = (src.dims()[dim], rest.iter().product::<usize>());
    let mut dims = vec![positions];
    dims.extend(&rest);
    if j == 0 || w == 0 || positions == 0 {
        return Tensor::zeros(dims, src.dtype(), &src.device()).permute(inverse);
    }
    let line = index.expanded_from().filter(|l| l.dims().iter().enumerate().all(|(a, &n)| a == dim || n == 1));
    let index = match line {
        Some(line) => line.reshape([j, 1]),
        None => index.permute(perm).reshape([j, w]),
    };
    let sum_dtype = if src.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let vals = moved.reshape([j, w]).to_dtype(sum_dtype);
    let srcs = smallvec::smallvec![index, vals];
    let out = Tensor::from_op(Op::ScatterRows { positions }, srcs, Shape::new([positions, w]), sum_dtype);
    out.to_dtype(src.dtype()).reshape(dims).permute(inverse)
}

/// [`scatter_sum`] as a reduction over a new dim of the `[..., positions, j, ...]` comparison.
fn scatter_compare(src: &Tensor, dim: usize, index: &Tensor, positions: usize) -> Tensor {
    let dtype = match index.dtype() {
        DType::I32 => DType::I32,
        _ => index.device().index_dtype(),
    };
    let device = index.device();
    let mut wide = src.dims().to_vec();
    wide.insert(dim, positions);
    let mut at = vec![1usize; wide.len()];
    at[dim] = positions;
    let pos = Tensor::iota(Scalar::Int(0), Scalar::Int(1), positions, dtype, &device).reshape(at);
    let hit = index
        .to_dtype(dtype)
        .unsqueeze(dim as isize)
        .expand_to("scatter_add", &wide)
        .eq(pos.expand_to("scatter_add", &wide));
    let vals = src.unsqueeze(dim as isize).expand_to("scatter_add", &wide);
    hit.where_(&vals, vals.zeros_like()).sum([dim as isize + 1], false)
}
