//! Movement ops. None of them copies: each records a primitive that later layers fold into index math, so a
//! permuted, expanded or sliced tensor costs nothing until a kernel reads it (`contiguous` asks for a copy).
//!
//! kiln tensors have no user-visible strides, so `view` is `reshape` (it never fails for a non-contiguous input
//! the way PyTorch's `view` can). `cat` is a composition: each part is padded into place with the additive
//! identity and the parts are added; floats pad with -0.0 so that x + pad == x bit for bit, including -0.0.

use crate::args::{Dims, ShapeSpec, fail, resolve_dim, resolve_dims};
use crate::tensor::Tensor;
use kiln_jit::dtype::result_type;
use kiln_jit::{DType, Op, Priority, Scalar, Shape};

impl Tensor {
    /// A tensor with the same elements (row-major order) in a new shape; one dim may be -1 (inferred).
    #[track_caller]
    pub fn reshape(&self, shape: impl ShapeSpec) -> Tensor {
        let spec = shape.to_spec();
        let dims = infer_shape("reshape", &spec, self.dims());
        self.reshape_prim(dims)
    }

    /// Same as `reshape` (kiln tensors have no user-visible strides, so every reshape is a view).
    #[track_caller]
    pub fn view(&self, shape: impl ShapeSpec) -> Tensor {
        let spec = shape.to_spec();
        let dims = infer_shape("view", &spec, self.dims());
        self.reshape_prim(dims)
    }

    /// Flattens to one dim.
    #[track_caller]
    pub fn flatten(&self) -> Tensor {
        self.reshape_prim(vec![self.numel()])
    }

    /// Dim `dim` split into `sizes` (`Tensor.unflatten`; one size may be -1, inferred), the others kept: the
    /// inverse of [`flatten_dims`](Tensor::flatten_dims), as attention code splits `[B, T, H * D]` into heads.
    #[track_caller]
    pub fn unflatten(&self, dim: isize, sizes: &[isize]) -> Tensor {
        let d = resolve_dim("unflatten", dim, self.rank());
        let n = self.dims()[d];
        let known: usize = sizes.iter().filter(|&&s| s >= 0).map(|&s| s as usize).product();
        let inferred = sizes.iter().filter(|&&s| s == -1).count();
        if inferred > 1 || sizes.iter().any(|&s| s < -1) || sizes.is_empty() {
            fail!("unflatten", "sizes {sizes:?} must be sizes >= 0 with at most one -1");
        }
        let fill = if inferred == 1 && known > 0 && n.is_multiple_of(known) { n / known } else { 0 };
        let split: Vec<usize> = sizes.iter().map(|&s| if s == -1 { fill } else { s as usize }).collect();
        if split.iter().product::<usize>() != n {
            fail!("unflatten", "sizes {sizes:?} do not multiply to dim {dim}'s size {n}");
        }
        let dims = self.dims();
        self.reshape_prim(dims[..d].iter().copied().chain(split).chain(dims[d + 1..].iter().copied()).collect())
    }

    /// Dims `start..=end` merged into one, the others kept (`torch.flatten(x, start_dim, end_dim)`; negative dims
    /// count from the end). A zero-dim tensor becomes 1-d, as in PyTorch.
    #[track_caller]
    pub fn flatten_dims(&self, start: isize, end: isize) -> Tensor {
        if self.rank() == 0 {
            return self.reshape_prim(vec![1]);
        }
        let (s, e) = (resolve_dim("flatten", start, self.rank()), resolve_dim("flatten", end, self.rank()));
        if s > e {
            fail!("flatten", "start_dim {start} comes after end_dim {end} in a {}-d tensor", self.rank());
        }
        let d = self.dims();
        let merged: usize = d[s..=e].iter().product();
        self.reshape_prim(d[..s].iter().copied().chain([merged]).chain(d[e + 1..].iter().copied()).collect())
    }

    /// Reorders dims: output dim i is input dim `dims[i]`.
    #[track_caller]
    pub fn permute(&self, dims: impl Dims) -> Tensor {
        let given = dims.to_isize();
        if given.len() != self.rank() {
            fail!("permute", "got {} dims {:?} for a tensor of rank {}", given.len(), given, self.rank());
        }
        // A loop, not `map`: a closure would break the `#[track_caller]` chain and report kiln's line, not the user's.
        let mut perm: Vec<usize> = Vec::with_capacity(given.len());
        for &d in &given {
            perm.push(resolve_dim("permute", d, self.rank()));
        }
        self.permute_resolved(perm, &given)
    }

    /// `permute` with resolved dims (`given`: the caller's spelling, for the error message). Allocates only the
    /// permutation the node keeps: a training step records a dozen transposes (weights, their gradients).
    #[track_caller]
    pub(crate) fn permute_resolved(&self, perm: Vec<usize>, given: &[isize]) -> Tensor {
        let mut seen = smallvec::SmallVec::<[bool; 8]>::from_elem(false, perm.len());
        for &p in &perm {
            if std::mem::replace(&mut seen[p], true) {
                fail!("permute", "dims {:?} repeat a dim", given);
            }
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return self.clone();
        }
        let shape = Shape::from_iter(perm.iter().map(|&p| self.dims()[p]));
        Tensor::from_op(Op::Permute(perm), smallvec::smallvec![self.clone()], shape, self.dtype())
    }

    /// Swaps two dims.
    #[track_caller]
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Tensor {
        let rank = self.rank();
        if rank == 0 {
            resolve_dim("transpose", dim0, 0);
            resolve_dim("transpose", dim1, 0);
            return self.clone();
        }
        let (a, b) = (resolve_dim("transpose", dim0, rank), resolve_dim("transpose", dim1, rank));
        if a == b {
            return self.clone();
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        self.permute_resolved(perm, &[])
    }

    /// Transpose of a tensor with at most 2 dims (`torch.t`): 0-D and 1-D tensors are returned as they are.
    #[track_caller]
    pub fn t(&self) -> Tensor {
        match self.rank() {
            0 | 1 => self.clone(),
            2 => self.transpose(0, 1),
            r => fail!("t", "expects a tensor with <= 2 dims, got {r} dims {:?}; use transpose", self.dims()),
        }
    }

    /// Broadcasts to `shape` (`torch.expand`): new dims are added on the left, a dim of size 1 stretches, and -1
    /// keeps a dim's size.
    #[track_caller]
    pub fn expand(&self, shape: impl ShapeSpec) -> Tensor {
        let spec = shape.to_spec();
        if spec.len() < self.rank() {
            fail!("expand", "target {:?} has fewer dims than the tensor's shape {:?}", spec, self.dims());
        }
        let lead = spec.len() - self.rank();
        let mut dims = Vec::with_capacity(spec.len());
        for (i, &s) in spec.iter().enumerate() {
            dims.push(match s {
                -1 if i >= lead => self.dims()[i - lead],
                s if s >= 0 => s as usize,
                _ => fail!("expand", "size {s} at position {i} of {:?} is not allowed", spec),
            });
        }
        self.expand_to("expand", &dims)
    }

    /// Broadcasts to `shape` (`torch.broadcast_to`).
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl ShapeSpec) -> Tensor {
        self.expand(shape)
    }

    /// Inserts a dim of size 1 at `dim` (which may be `rank`, or negative).
    #[track_caller]
    pub fn unsqueeze(&self, dim: isize) -> Tensor {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1);
        let mut dims = self.dims().to_vec();
        dims.insert(d, 1);
        self.reshape_prim(dims)
    }

    /// Removes the listed dims where they have size 1 (others are left as they are, as in PyTorch).
    #[track_caller]
    pub fn squeeze(&self, dims: impl Dims) -> Tensor {
        let axes = resolve_dims("squeeze", &dims, self.rank());
        let kept: Vec<usize> =
            self.dims().iter().enumerate().filter(|&(i, &d)| !(d == 1 && axes.contains(&i))).map(|(_, &d)| d).collect();
        self.reshape_prim(kept)
    }

    /// Removes every dim of size 1.
    pub fn squeeze_all(&self) -> Tensor {
        let kept: Vec<usize> = self.dims().iter().copied().filter(|&d| d != 1).collect();
        self.reshape_prim(kept)
    }

    /// `len` elements of `dim` starting at `start` (`torch.narrow`).
    #[track_caller]
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Tensor {
        if self.rank() == 0 {
            fail!("narrow", "cannot be applied to a zero-dim tensor");
        }
        let d = resolve_dim("narrow", dim, self.rank());
        let n = self.dims()[d];
        if start + len > n {
            fail!("narrow", "start {start} + length {len} exceeds size {n} of dim {d} (shape {:?})", self.dims());
        }
        self.slice_prim(d, start, len, 1)
    }

    /// Sliding windows of `size` elements every `step` along `dim`, as a new last dim (PyTorch's `Tensor.unfold`):
    /// `[.., n, ..]` becomes `[.., (n - size) / step + 1, .., size]`. A view; overlapping windows share elements.
    #[track_caller]
    pub fn unfold(&self, dim: isize, size: usize, step: usize) -> Tensor {
        if self.rank() == 0 {
            fail!("unfold", "cannot be applied to a zero-dim tensor");
        }
        let d = resolve_dim("unfold", dim, self.rank());
        self.unfold_dilated(d, size, step, 1)
    }

    /// [`Tensor::unfold`] with `dilation - 1` elements skipped between the taps of a window (a dilated
    /// convolution's patches).
    #[track_caller]
    pub(crate) fn unfold_dilated(&self, dim: usize, size: usize, step: usize, dilation: usize) -> Tensor {
        let n = self.dims()[dim];
        let Some(windows) = kiln_jit::shape::window_count(n, size, step, dilation) else {
            fail!(
                "unfold",
                "a window of {size} every {step} (dilation {dilation}) must be at least 1 and fit dim {dim} of size {n}"
            );
        };
        let mut dims = self.dims().to_vec();
        dims[dim] = windows;
        dims.push(size);
        let op = Op::Unfold { axis: dim, size, step, dilation };
        Tensor::from_op(op, smallvec::smallvec![self.clone()], Shape::new(dims), self.dtype())
    }

    /// Python-style `x[.., start:end:step, ..]` on `dim`: negative `start`/`end` count from the end and are
    /// clamped to the dim; `step` must be positive (use `flip` to reverse).
    #[track_caller]
    pub fn slice(&self, dim: isize, start: isize, end: isize, step: usize) -> Tensor {
        if self.rank() == 0 {
            fail!("slice", "cannot be applied to a zero-dim tensor");
        }
        let d = resolve_dim("slice", dim, self.rank());
        if step == 0 {
            fail!("slice", "step must be positive");
        }
        let n = self.dims()[d] as isize;
        let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let (a, b) = (clamp(start), clamp(end));
        let len = if b > a { ((b - a) as usize).div_ceil(step) } else { 0 };
        self.slice_prim(d, a as usize, len, step as isize)
    }

    #[track_caller]
    fn slice_prim(&self, dim: usize, start: usize, len: usize, step: isize) -> Tensor {
        let n = self.dims()[dim];
        if start == 0 && len == n && step == 1 {
            return self.clone();
        }
        let mut spec: Vec<(usize, isize)> = vec![(0, 1); self.rank()];
        spec[dim] = (if len == 0 { 0 } else { start }, step);
        let mut dims = self.dims().to_vec();
        dims[dim] = len;
        Tensor::from_op(Op::Slice(spec), smallvec::smallvec![self.clone()], Shape::new(dims), self.dtype())
    }

    /// Reverses the order of elements along `dims`.
    #[track_caller]
    pub fn flip(&self, dims: impl Dims) -> Tensor {
        let axes = resolve_dims("flip", &dims, self.rank());
        // `get`: a zero-dim tensor's pseudo-dim 0 has no entry in dims(), and flipping it is the identity.
        let axes: Vec<usize> = axes.into_iter().filter(|&a| self.dims().get(a).is_some_and(|&n| n > 1)).collect();
        if axes.is_empty() {
            return self.clone();
        }
        let spec =
            (0..self.rank()).map(|a| if axes.contains(&a) { (self.dims()[a] - 1, -1) } else { (0, 1) }).collect();
        Tensor::from_op(Op::Slice(spec), smallvec::smallvec![self.clone()], self.shape().clone(), self.dtype())
    }

    /// Pads with `value` (`torch.nn.functional.pad`, constant mode): `pads[0]` is (before, after) for the last
    /// dim, `pads[1]` for the one before it, and so on.
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: impl Into<Scalar>) -> Tensor {
        if pads.len() > self.rank() {
            fail!("pad", "{} (before, after) pairs given for a tensor of rank {}", pads.len(), self.rank());
        }
        let mut per_dim = vec![(0, 0); self.rank()];
        for (i, &p) in pads.iter().enumerate() {
            per_dim[self.rank() - 1 - i] = p;
        }
        self.pad_prim(per_dim, value.into())
    }

    pub(crate) fn pad_prim(&self, per_dim: Vec<(usize, usize)>, value: Scalar) -> Tensor {
        if per_dim.iter().all(|&p| p == (0, 0)) {
            return self.clone();
        }
        let dims: Vec<usize> = self.dims().iter().zip(&per_dim).map(|(d, (b, a))| d + b + a).collect();
        Tensor::from_op(
            Op::Pad { pads: per_dim, value },
            smallvec::smallvec![self.clone()],
            Shape::new(dims),
            self.dtype(),
        )
    }

    /// Concatenates along `dim` (`torch.cat`); dtypes promote, all other dims must match.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Tensor {
        let Some(first) = tensors.first() else { fail!("cat", "expects at least one tensor") };
        if let Some(i) = tensors.iter().position(|t| t.rank() == 0) {
            fail!("cat", "tensor {i} is zero-dim and cannot be concatenated (use stack)");
        }
        let d = resolve_dim("cat", dim, first.rank());
        for (i, t) in tensors.iter().enumerate() {
            if t.rank() != first.rank()
                || t.dims().iter().zip(first.dims()).enumerate().any(|(a, (x, y))| a != d && x != y)
            {
                fail!(
                    "cat",
                    "tensor {i} has shape {:?}, which does not match {:?} outside dim {d}",
                    t.dims(),
                    first.dims()
                );
            }
            if t.device() != first.device() {
                fail!("cat", "tensor {i} is on {}, tensor 0 on {}", t.device(), first.device());
            }
        }
        let dtype = result_type(&tensors.iter().map(|t| (t.dtype(), Priority::Tensor)).collect::<Vec<_>>());
        let total: usize = tensors.iter().map(|t| t.dims()[d]).sum();
        let identity = match dtype {
            DType::Bool => Scalar::Bool(false),
            d if d.is_float() => Scalar::Float(-0.0),
            _ => Scalar::Int(0),
        };
        let mut offset = 0;
        let mut acc: Option<Tensor> = None;
        for t in tensors {
            let n = t.dims()[d];
            let mut per_dim = vec![(0, 0); first.rank()];
            per_dim[d] = (offset, total - offset - n);
            offset += n;
            let part = t.to_dtype(dtype).pad_prim(per_dim, identity);
            acc = Some(match acc {
                None => part,
                Some(a) => a.add(&part),
            });
        }
        acc.expect("at least one tensor")
    }

    /// Stacks equally shaped tensors along a new dim `dim` (`torch.stack`).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Tensor {
        let Some(first) = tensors.first() else { fail!("stack", "expects at least one tensor") };
        if let Some((i, t)) = tensors.iter().enumerate().find(|(_, t)| t.dims() != first.dims()) {
            fail!(
                "stack",
                "tensor {i} has shape {:?}, tensor 0 has {:?}; stack needs equal shapes",
                t.dims(),
                first.dims()
            );
        }
        let d = resolve_dim("stack", dim, first.rank() + 1);
        let parts: Vec<Tensor> = tensors.iter().map(|t| t.unsqueeze(d as isize)).collect();
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), d as isize)
    }

    /// A copy laid out contiguously: materializes permuted, expanded or sliced views when realized.
    pub fn contiguous(&self) -> Tensor {
        Tensor::from_op(Op::Contiguous, smallvec::smallvec![self.clone()], self.shape().clone(), self.dtype())
    }
}

/// Resolves a reshape spec (with at most one -1) against the source dims.
#[track_caller]
fn infer_shape(op: &str, spec: &[i64], src: &[usize]) -> Vec<usize> {
    let numel: usize = src.iter().product();
    let infer: Vec<usize> = spec.iter().enumerate().filter(|&(_, &s)| s == -1).map(|(i, _)| i).collect();
    if infer.len() > 1 || spec.iter().any(|&s| s < -1) {
        fail!(op, "shape {:?} may hold at most one -1 and no other negative size", spec);
    }
    let known: usize = spec.iter().filter(|&&s| s >= 0).map(|&s| s as usize).product();
    let mut dims: Vec<usize> = spec.iter().map(|&s| s.max(0) as usize).collect();
    if let Some(&i) = infer.first() {
        if known == 0 || !numel.is_multiple_of(known) {
            fail!(op, "cannot reshape shape {:?} ({numel} elements) into {:?}", src, spec);
        }
        dims[i] = numel / known;
    } else if known != numel {
        fail!(op, "cannot reshape shape {:?} ({numel} elements) into {:?} ({known} elements)", src, spec);
    }
    dims
}
