//! Shapes: row-major dims, strides, and NumPy/PyTorch broadcasting.

use std::fmt;

/// The dims of a tensor, outermost first. A zero-dim shape (`[]`) holds one element.
///
/// Up to `INLINE_RANK` dims are stored inline: every lazy node holds a shape, and a separate heap block per node
/// cost a malloc when the op is recorded and a free when its history is dropped (measured ~15 ns a node when a
/// replayed step frees its graph).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Dims);

/// Rank up to which a `Shape` needs no heap allocation (NCHW fits).
pub const INLINE_RANK: usize = 4;

type Dims = smallvec::SmallVec<[usize; INLINE_RANK]>;

impl FromIterator<usize> for Shape {
    /// Collects dims without a heap block up to `INLINE_RANK` (op constructors build shapes this way).
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        Shape(iter.into_iter().collect())
    }
}

impl Shape {
    #[inline]
    pub fn new(dims: impl AsRef<[usize]>) -> Self {
        Shape(Dims::from_slice(dims.as_ref()))
    }

    #[inline]
    pub fn scalar() -> Self {
        Shape(Dims::new())
    }

    #[inline]
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The dims as a `Vec` (for callers that edit them).
    pub fn to_vec(&self) -> Vec<usize> {
        self.0.to_vec()
    }

    #[inline]
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    #[inline]
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major (C-contiguous) strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        contiguous_strides(&self.0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &self.0[..])
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &self.0[..])
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape::new(d)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(Dims::from_vec(d))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape::new(d)
    }
}

/// How many windows of `size` taps, `dilation` apart, fit a dim of `n` elements when slid by `step` (`Op::Unfold`'s
/// window count, a convolution's or pooling's output length over its padded input); `None` where none fits or a
/// size is zero. Checked: a graph read back from bytes may hold any values.
pub fn window_count(n: usize, size: usize, step: usize, dilation: usize) -> Option<usize> {
    if size == 0 || step == 0 || dilation == 0 {
        return None;
    }
    let span = dilation.checked_mul(size - 1)?.checked_add(1)?;
    (span <= n).then(|| (n - span) / step + 1)
}

pub fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; dims.len()];
    let mut acc = 1;
    for (s, d) in strides.iter_mut().zip(dims).rev() {
        *s = acc;
        acc *= *d;
    }
    strides
}

/// The broadcast of two shapes (dims aligned from the right; a dim of 1 stretches), or `None` if they clash.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    broadcast_shape(a, b).map(|s| s.to_vec())
}

/// `broadcast_shapes` as a `Shape` (no heap allocation up to `INLINE_RANK` dims: op constructors call it).
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Shape> {
    let rank = a.len().max(b.len());
    let mut out = Dims::from_elem(0, rank);
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(Shape(out))
}

/// Calls `f` with every multi-index of `dims` in row-major order. Used by the interpreter: simple, not fast.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx);
        let mut axis = dims.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < dims[axis] {
                break;
            }
            idx[axis] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shapes(&[0, 1], &[3]), Some(vec![0, 3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[4]), None);
    }

    #[test]
    fn index_walk_is_row_major() {
        let mut seen = Vec::new();
        for_each_index(&[2, 2], |i| seen.push(i.to_vec()));
        assert_eq!(seen, vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
        let mut n = 0;
        for_each_index(&[], |_| n += 1);
        assert_eq!(n, 1, "a zero-dim shape has one element");
        for_each_index(&[3, 0], |_| n += 1);
        assert_eq!(n, 1, "an empty shape has none");
    }
}
