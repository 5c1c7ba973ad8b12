//! Property tests: movement ops, broadcasting binary ops, `where_` and reductions against a naive strided reference.
//!
//! The reference (`Naive`) is deliberately the textbook one and shares nothing with kiln: a flat `Vec<f64>` with a
//! shape, signed strides and an offset. Permute, transpose, expand, unsqueeze, squeeze, slice, narrow and flip are
//! stride tricks (expand and broadcasting use stride 0, flip a negative stride); reshape, pad, cat and stack are
//! index loops over row-major order. Movement is exact, so results are compared bit for bit (NaN equals NaN, and
//! -0.0 must stay -0.0: `cat` pads with -0.0 and adds).
//!
//! Every property runs 256 cases by default; `PROPTEST_CASES` overrides. Failures print the op chain in kiln's
//! terms, e.g. `start f32[2, 0, 3]; permute([2, -3, 1]); cat(dim 1, 3 parts, sizes [0, 2, 1])`.

// Every property runs on the CPU (cargo feature `cpu`).
#![cfg(feature = "cpu")]

mod test_cache;

mod common;
mod common_props;

use common_props::{catch_panic, first_difference, normalize, tensor_of, values_of};
use kiln::{DType, Device, Scalar, Tensor};
use proptest::prelude::*;
use std::rc::Rc;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(256);
    // No regression files: this suite must not write into the source tree; a failure prints its minimal input.
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------------------------
// The naive strided reference.
// ---------------------------------------------------------------------------------------------------------------

/// A strided view of a flat buffer: element `idx` is `data[offset + sum(idx[d] * strides[d])]`.
#[derive(Clone, Debug)]
struct Naive {
    data: Rc<Vec<f64>>,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: isize,
}

/// Every multi-index of `shape` in row-major order (the last dim fastest), by division and remainder.
fn all_indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let numel: usize = shape.iter().product();
    (0..numel)
        .map(|flat| {
            let mut idx = vec![0; shape.len()];
            let mut rest = flat;
            for d in (0..shape.len()).rev() {
                idx[d] = rest % shape[d];
                rest /= shape[d];
            }
            idx
        })
        .collect()
}

/// NumPy broadcasting of two shapes, written out independently of kiln's.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, rank - s.len()).chain(s.iter().copied()).collect() };
    let (a, b) = (pad(a), pad(b));
    let dim = |x: usize, y: usize| match (x, y) {
        _ if x == y => Some(x),
        (1, y) => Some(y),
        (x, 1) => Some(x),
        _ => None,
    };
    a.iter().zip(&b).map(|(&x, &y)| dim(x, y)).collect()
}

impl Naive {
    fn new(data: Vec<f64>, shape: &[usize]) -> Naive {
        assert_eq!(data.len(), shape.iter().product::<usize>(), "reference: data length vs shape {shape:?}");
        let mut strides = vec![0isize; shape.len()];
        let mut acc = 1isize;
        for d in (0..shape.len()).rev() {
            strides[d] = acc;
            acc *= shape[d] as isize;
        }
        Naive { data: Rc::new(data), shape: shape.to_vec(), strides, offset: 0 }
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn at(&self, idx: &[usize]) -> f64 {
        let pos = self.offset + idx.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
        self.data[usize::try_from(pos).expect("reference: index inside the buffer")]
    }

    fn to_vec(&self) -> Vec<f64> {
        all_indices(&self.shape).iter().map(|i| self.at(i)).collect()
    }

    fn reshape(&self, shape: &[usize]) -> Naive {
        Naive::new(self.to_vec(), shape)
    }

    fn permute(&self, perm: &[usize]) -> Naive {
        let mut out = self.clone();
        out.shape = perm.iter().map(|&p| self.shape[p]).collect();
        out.strides = perm.iter().map(|&p| self.strides[p]).collect();
        out
    }

    fn transpose(&self, a: usize, b: usize) -> Naive {
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.strides.swap(a, b);
        out
    }

    /// Broadcast to `target`: new leading dims and stretched dims of size 1 get stride 0.
    fn expand(&self, target: &[usize]) -> Naive {
        let lead = target.len() - self.shape.len();
        let mut out = self.clone();
        out.shape = target.to_vec();
        out.strides = (0..target.len())
            .map(|i| {
                if i < lead {
                    return 0;
                }
                let (s, t) = (self.shape[i - lead], target[i]);
                assert!(s == t || s == 1, "reference: cannot expand {:?} to {target:?}", self.shape);
                if s == t { self.strides[i - lead] } else { 0 }
            })
            .collect();
        out
    }

    fn unsqueeze(&self, d: usize) -> Naive {
        let mut out = self.clone();
        out.shape.insert(d, 1);
        out.strides.insert(d, 0);
        out
    }

    /// Drops the listed dims that have size 1.
    fn squeeze(&self, dims: &[usize]) -> Naive {
        let keep: Vec<usize> = (0..self.shape.len()).filter(|d| !(dims.contains(d) && self.shape[*d] == 1)).collect();
        let mut out = self.clone();
        out.shape = keep.iter().map(|&d| self.shape[d]).collect();
        out.strides = keep.iter().map(|&d| self.strides[d]).collect();
        out
    }

    /// `len` elements of `dim` from `start` every `step`.
    fn slice(&self, dim: usize, start: usize, len: usize, step: usize) -> Naive {
        let mut out = self.clone();
        if len > 0 {
            out.offset += start as isize * self.strides[dim];
        }
        out.shape[dim] = len;
        out.strides[dim] *= step as isize;
        out
    }

    fn flip(&self, dims: &[usize]) -> Naive {
        let mut out = self.clone();
        for &d in dims {
            if out.shape[d] > 0 {
                out.offset += (out.shape[d] as isize - 1) * out.strides[d];
                out.strides[d] = -out.strides[d];
            }
        }
        out
    }

    /// Constant padding, `per_dim[d] = (before, after)`, by an index loop over the output.
    fn pad(&self, per_dim: &[(usize, usize)], value: f64) -> Naive {
        let shape: Vec<usize> = self.shape.iter().zip(per_dim).map(|(&n, &(b, a))| b + n + a).collect();
        let data = all_indices(&shape)
            .iter()
            .map(|idx| {
                let src: Option<Vec<usize>> = idx
                    .iter()
                    .zip(per_dim)
                    .zip(&self.shape)
                    .map(|((&i, &(b, _)), &n)| (i >= b && i - b < n).then(|| i - b))
                    .collect();
                src.map_or(value, |s| self.at(&s))
            })
            .collect();
        Naive::new(data, &shape)
    }

    /// Concatenation along `dim` by an index loop: each output index is looked up in the part that holds it.
    fn cat(parts: &[Naive], dim: usize) -> Naive {
        let mut shape = parts[0].shape.clone();
        shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
        let data = all_indices(&shape)
            .iter()
            .map(|idx| {
                let mut i = idx[dim];
                for p in parts {
                    if i < p.shape[dim] {
                        let mut local = idx.clone();
                        local[dim] = i;
                        return p.at(&local);
                    }
                    i -= p.shape[dim];
                }
                unreachable!("index inside the concatenation")
            })
            .collect();
        Naive::new(data, &shape)
    }

    fn stack(parts: &[Naive], dim: usize) -> Naive {
        let parts: Vec<Naive> = parts.iter().map(|p| p.unsqueeze(dim)).collect();
        Naive::cat(&parts, dim)
    }

    /// `f` elementwise over the broadcast of `xs`' shapes.
    fn map_broadcast(xs: &[&Naive], f: impl Fn(&[f64]) -> f64) -> Naive {
        let shape = xs.iter().try_fold(Vec::new(), |s, x| broadcast(&s, &x.shape)).expect("reference: broadcastable");
        let expanded: Vec<Naive> = xs.iter().map(|x| x.expand(&shape)).collect();
        let data =
            all_indices(&shape).iter().map(|idx| f(&expanded.iter().map(|x| x.at(idx)).collect::<Vec<_>>())).collect();
        Naive::new(data, &shape)
    }
}

#[test]
fn the_reference_itself() {
    // A 2x3 row-major [[0 1 2] [3 4 5]]: a few hand-checked results, so the oracle is not only trusted.
    let x = Naive::new((0..6).map(f64::from).collect(), &[2, 3]);
    assert_eq!(x.transpose(0, 1).to_vec(), [0., 3., 1., 4., 2., 5.]);
    assert_eq!(x.flip(&[1]).to_vec(), [2., 1., 0., 5., 4., 3.]);
    assert_eq!(x.slice(1, 0, 2, 2).to_vec(), [0., 2., 3., 5.]);
    assert_eq!(x.flip(&[0, 1]).slice(1, 1, 2, 1).to_vec(), [4., 3., 1., 0.]);
    assert_eq!(x.unsqueeze(1).expand(&[2, 2, 3]).to_vec(), [0., 1., 2., 0., 1., 2., 3., 4., 5., 3., 4., 5.]);
    assert_eq!(x.pad(&[(0, 0), (1, 0)], 9.0).to_vec(), [9., 0., 1., 2., 9., 3., 4., 5.]);
    assert_eq!(Naive::cat(&[x.clone(), x.slice(0, 1, 1, 1)], 0).to_vec(), [0., 1., 2., 3., 4., 5., 3., 4., 5.]);
    assert_eq!(Naive::stack(&[x.slice(0, 0, 1, 1), x.slice(0, 1, 1, 1)], 2).shape, [1, 3, 2]);
    assert_eq!(broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
    assert_eq!(broadcast(&[0], &[1]), Some(vec![0]));
    assert_eq!(broadcast(&[2, 3], &[3, 3]), None);
}

// ---------------------------------------------------------------------------------------------------------------
// Random data and parameters.
// ---------------------------------------------------------------------------------------------------------------

const DTYPES: [DType; 9] =
    [DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U32, DType::U8, DType::Bool];
const MAX_RANK: usize = 6;
const MAX_NUMEL: usize = 2048;

/// Derives an op's parameters from one seed (the tests' SplitMix64, `common::Rng`), so proptest only has to
/// generate (kind, seed) pairs.
struct Rng(common::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(common::Rng(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: isize, hi: isize) -> isize {
        lo + self.below((hi - lo + 1) as usize) as isize
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }

    /// A new dim's size: 0 now and then, else 1..=3.
    fn size(&mut self) -> usize {
        if self.below(10) == 0 { 0 } else { 1 + self.below(3) }
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }

    /// A dim index for `rank` dims, written negatively half the time (`rank == 0` allows 0 and -1).
    fn dim(&mut self, rank: usize) -> isize {
        let d = self.below(rank.max(1)) as isize;
        if self.coin() { d - rank.max(1) as isize } else { d }
    }
}

fn resolve(d: isize, rank: usize) -> usize {
    if d < 0 { (d + rank.max(1) as isize) as usize } else { d as usize }
}

/// The `k`-th fresh value of a stream, exact in `dtype`. Values are distinct where the dtype allows, so a wrong
/// index shows; floats include -0.0 and NaN.
fn fresh_value(dtype: DType, k: usize) -> f64 {
    let signed = if k % 2 == 1 { -(k as f64) } else { k as f64 };
    match dtype {
        DType::Bool => k.is_multiple_of(3) as u8 as f64,
        DType::U8 => (k % 251) as f64,
        // Spread over the whole range (above 2^31 too), distinct for the first 2^16 values.
        DType::U32 => (k as u64 * 65_537 % (1 << 32)) as f64,
        DType::I32 | DType::I64 => signed,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => match k % 13 {
            0 => -0.0,
            7 => f64::NAN,
            // f16 holds x + 0.5 exactly only for |x| < 1024, bf16 only for |x| < 128.
            _ if dtype == DType::F16 => (signed % 1021.0) + 0.5,
            _ if dtype == DType::BF16 => (signed % 127.0) + 0.5,
            _ => signed + 0.5,
        },
    }
}

/// A pad value of `dtype`'s kind, as kiln takes it and as the reference sees it.
fn pad_value(rng: &mut Rng, dtype: DType) -> (Scalar, f64) {
    let s = match dtype {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {
            Scalar::Float(rng.pick(&[0.0, -0.0, 2.5, -7.0, f64::NAN]))
        }
        DType::U8 => Scalar::Int(rng.pick(&[0, 3, 200])),
        DType::U32 => Scalar::Int(rng.pick(&[0, 3, 4_000_000_000])),
        DType::I32 | DType::I64 => Scalar::Int(rng.pick(&[0, 3, -2])),
        DType::Bool => Scalar::Bool(rng.coin()),
    };
    let v = match s {
        Scalar::Float(f) => f,
        Scalar::Int(i) => i as f64,
        Scalar::Bool(b) => b as u8 as f64,
    };
    (s, normalize(dtype, v))
}

/// A random shape holding exactly `numel` elements, of rank 0..=4 (at least 1 when `numel != 1`).
fn shape_with_numel(rng: &mut Rng, numel: usize) -> Vec<usize> {
    if numel == 0 {
        let mut dims: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(6)).collect();
        let z = rng.below(dims.len());
        dims[z] = 0;
        return dims;
    }
    let rank = match rng.below(5) {
        0 if numel != 1 => 1,
        r => r,
    };
    if rank == 0 {
        return Vec::new();
    }
    let mut dims = Vec::with_capacity(rank);
    let mut rest = numel;
    for _ in 1..rank {
        let divisors: Vec<usize> = (1..=rest).filter(|&d| rest.is_multiple_of(d)).collect();
        let d = rng.pick(&divisors);
        dims.push(d);
        rest /= d;
    }
    dims.push(rest);
    rng.shuffle(&mut dims);
    dims
}

// ---------------------------------------------------------------------------------------------------------------
// Movement chains.
// ---------------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Move {
    Reshape,
    View,
    Flatten,
    Permute,
    Transpose,
    T,
    Expand,
    BroadcastTo,
    Unsqueeze,
    Squeeze,
    SqueezeAll,
    Narrow,
    Slice,
    Flip,
    Pad,
    Cat,
    Stack,
    Contiguous,
    Realize,
}

const MOVES: [Move; 19] = [
    Move::Reshape,
    Move::View,
    Move::Flatten,
    Move::Permute,
    Move::Transpose,
    Move::T,
    Move::Expand,
    Move::BroadcastTo,
    Move::Unsqueeze,
    Move::Squeeze,
    Move::SqueezeAll,
    Move::Narrow,
    Move::Slice,
    Move::Flip,
    Move::Pad,
    Move::Cat,
    Move::Stack,
    Move::Contiguous,
    Move::Realize,
];

/// The same value built twice: lazily in kiln and eagerly in the reference.
struct Chain {
    dev: Device,
    dtype: DType,
    kiln: Tensor,
    naive: Naive,
    next_value: usize,
    log: Vec<String>,
}

impl Chain {
    fn new(dtype: DType, dims: &[usize]) -> Chain {
        let dev = Device::cpu();
        let mut chain = Chain {
            dev,
            dtype,
            kiln: Tensor::from_vec(Vec::<f64>::new(), [0], &dev).expect("empty"),
            naive: Naive::new(Vec::new(), &[0]),
            next_value: 0,
            log: vec![format!("start {dtype}{dims:?}")],
        };
        (chain.kiln, chain.naive) = chain.fresh(dims);
        chain
    }

    /// A new input tensor of `dims` with values not used before in this chain.
    fn fresh(&mut self, dims: &[usize]) -> (Tensor, Naive) {
        let n: usize = dims.iter().product();
        let data: Vec<f64> = (self.next_value..self.next_value + n).map(|k| fresh_value(self.dtype, k)).collect();
        self.next_value += n;
        (tensor_of(self.dtype, &data, dims, &self.dev), Naive::new(data, dims))
    }

    fn dims(&self) -> Vec<usize> {
        self.naive.shape.clone()
    }

    /// Applies one op with parameters drawn from `seed` to both sides; ops that do not fit the current shape (or
    /// would grow it past the caps) are logged as skipped.
    fn apply(&mut self, mv: Move, seed: u64) {
        let mut rng = Rng::new(seed);
        let dims = self.dims();
        let rank = dims.len();
        let numel = self.naive.numel();
        let entry = match mv {
            Move::Reshape | Move::View => {
                let target = shape_with_numel(&mut rng, numel);
                let mut spec: Vec<i64> = target.iter().map(|&d| d as i64).collect();
                if numel > 0 && !spec.is_empty() && rng.coin() {
                    let i = rng.below(spec.len());
                    spec[i] = -1;
                }
                self.kiln = match mv {
                    Move::View => self.kiln.view(spec.clone()),
                    _ => self.kiln.reshape(spec.clone()),
                };
                self.naive = self.naive.reshape(&target);
                format!("{}({spec:?})", if matches!(mv, Move::View) { "view" } else { "reshape" })
            }
            Move::Flatten => {
                self.kiln = self.kiln.flatten();
                self.naive = self.naive.reshape(&[numel]);
                "flatten()".into()
            }
            Move::Permute => {
                let mut perm: Vec<usize> = (0..rank).collect();
                rng.shuffle(&mut perm);
                let given: Vec<isize> =
                    perm.iter().map(|&p| if rng.coin() { p as isize - rank as isize } else { p as isize }).collect();
                self.kiln = self.kiln.permute(given.clone());
                self.naive = self.naive.permute(&perm);
                format!("permute({given:?})")
            }
            Move::Transpose => {
                let (a, b) = (rng.dim(rank), rng.dim(rank));
                self.kiln = self.kiln.transpose(a, b);
                if rank > 0 {
                    self.naive = self.naive.transpose(resolve(a, rank), resolve(b, rank));
                }
                format!("transpose({a}, {b})")
            }
            Move::T if rank <= 2 => {
                self.kiln = self.kiln.t();
                if rank == 2 {
                    self.naive = self.naive.transpose(0, 1);
                }
                "t()".into()
            }
            Move::Expand | Move::BroadcastTo => {
                let lead = rng.below(3).min(MAX_RANK - rank);
                let mut spec: Vec<i64> = (0..lead).map(|_| rng.size() as i64).collect();
                for &d in &dims {
                    spec.push(match (d, rng.below(3)) {
                        (_, 0) => -1,
                        (1, _) => rng.size() as i64,
                        (d, _) => d as i64,
                    });
                }
                let target: Vec<usize> =
                    spec.iter().enumerate().map(|(i, &s)| if s < 0 { dims[i - lead] } else { s as usize }).collect();
                if target.iter().product::<usize>() > MAX_NUMEL {
                    return self.log.push(format!("(skipped {mv:?} to {target:?})"));
                }
                self.kiln = match mv {
                    Move::Expand => self.kiln.expand(spec.clone()),
                    _ => self.kiln.broadcast_to(spec.clone()),
                };
                self.naive = self.naive.expand(&target);
                format!("{}({spec:?})", if matches!(mv, Move::Expand) { "expand" } else { "broadcast_to" })
            }
            Move::Unsqueeze if rank < MAX_RANK => {
                let d = rng.range(-(rank as isize) - 1, rank as isize);
                self.kiln = self.kiln.unsqueeze(d);
                self.naive = self.naive.unsqueeze(if d < 0 { (d + rank as isize + 1) as usize } else { d as usize });
                format!("unsqueeze({d})")
            }
            Move::Squeeze => {
                let mut given: Vec<isize> = Vec::new();
                let mut chosen: Vec<usize> = Vec::new();
                for d in 0..rank.max(1) {
                    if rng.coin() || (d + 1 == rank.max(1) && given.is_empty()) {
                        given.push(if rng.coin() { d as isize - rank.max(1) as isize } else { d as isize });
                        chosen.push(d);
                    }
                }
                rng.shuffle(&mut given);
                self.kiln = self.kiln.squeeze(given.clone());
                self.naive = self.naive.squeeze(&chosen);
                format!("squeeze({given:?})")
            }
            Move::SqueezeAll => {
                self.kiln = self.kiln.squeeze_all();
                self.naive = self.naive.squeeze(&(0..rank).collect::<Vec<_>>());
                "squeeze_all()".into()
            }
            Move::Narrow if rank > 0 => {
                let d = rng.dim(rank);
                let n = dims[resolve(d, rank)];
                let start = rng.below(n + 1);
                // Mostly non-empty results, so that later ops have something to move.
                let len =
                    if start < n && rng.below(8) != 0 { 1 + rng.below(n - start) } else { rng.below(n - start + 1) };
                self.kiln = self.kiln.narrow(d, start, len);
                self.naive = self.naive.slice(resolve(d, rank), start, len, 1);
                format!("narrow({d}, {start}, {len})")
            }
            Move::Slice if rank > 0 => {
                let d = rng.dim(rank);
                let n = dims[resolve(d, rank)] as isize;
                let (mut start, mut end, step) = (rng.range(-n - 2, n + 2), rng.range(-n - 2, n + 2), rng.range(1, 3));
                // Python's rule: negative bounds count from the end, then both are clamped into 0..=n.
                let clamp = |i: isize| (if i < 0 { i + n } else { i }).clamp(0, n) as usize;
                if clamp(start) > clamp(end) && rng.below(4) != 0 {
                    (start, end) = (end, start); // mostly non-empty
                }
                let (a, b) = (clamp(start), clamp(end));
                let len = if b > a { (b - a).div_ceil(step as usize) } else { 0 };
                self.kiln = self.kiln.slice(d, start, end, step as usize);
                self.naive = self.naive.slice(resolve(d, rank), a, len, step as usize);
                format!("slice({d}, {start}, {end}, {step})")
            }
            Move::Flip => {
                let mut given: Vec<isize> = Vec::new();
                let mut chosen: Vec<usize> = Vec::new();
                for d in 0..rank.max(1) {
                    if rng.coin() {
                        given.push(if rng.coin() { d as isize - rank.max(1) as isize } else { d as isize });
                        chosen.push(d);
                    }
                }
                rng.shuffle(&mut given);
                self.kiln = self.kiln.flip(given.clone());
                if rank > 0 {
                    self.naive = self.naive.flip(&chosen);
                }
                format!("flip({given:?})")
            }
            Move::Pad => {
                let pairs: Vec<(usize, usize)> =
                    (0..rng.below(rank + 1)).map(|_| (rng.below(3), rng.below(3))).collect();
                let mut per_dim = vec![(0, 0); rank];
                for (i, &p) in pairs.iter().enumerate() {
                    per_dim[rank - 1 - i] = p;
                }
                let grown: usize = dims.iter().zip(&per_dim).map(|(&n, &(b, a))| n + b + a).product();
                if grown > MAX_NUMEL {
                    return self.log.push(format!("(skipped pad {pairs:?})"));
                }
                let (scalar, value) = pad_value(&mut rng, self.dtype);
                self.kiln = self.kiln.pad(&pairs, scalar);
                self.naive = self.naive.pad(&per_dim, value);
                format!("pad({pairs:?}, {scalar})")
            }
            Move::Cat if rank > 0 => {
                let d = rng.dim(rank);
                let axis = resolve(d, rank);
                let count = 2 + rng.below(2);
                let me = rng.below(count);
                let mut sizes: Vec<usize> = (0..count).map(|_| rng.size()).collect();
                sizes[me] = dims[axis];
                let total: usize = sizes.iter().sum();
                if numel / dims[axis].max(1) * total > MAX_NUMEL {
                    return self.log.push(format!("(skipped cat of sizes {sizes:?})"));
                }
                let mut parts: Vec<(Tensor, Naive)> = Vec::new();
                for (i, &s) in sizes.iter().enumerate() {
                    if i == me {
                        parts.push((self.kiln.clone(), self.naive.clone()));
                    } else {
                        let mut part_dims = dims.clone();
                        part_dims[axis] = s;
                        parts.push(self.fresh(&part_dims));
                    }
                }
                let refs: Vec<&Tensor> = parts.iter().map(|(t, _)| t).collect();
                self.kiln = Tensor::cat(&refs, d);
                self.naive = Naive::cat(&parts.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(), axis);
                format!("cat(dim {d}, {count} parts, sizes {sizes:?})")
            }
            Move::Stack if rank < MAX_RANK => {
                let count = 1 + rng.below(3);
                if numel * count > MAX_NUMEL {
                    return self.log.push(format!("(skipped stack of {count})"));
                }
                let d = rng.range(-(rank as isize) - 1, rank as isize);
                let me = rng.below(count);
                let parts: Vec<(Tensor, Naive)> = (0..count)
                    .map(|i| if i == me { (self.kiln.clone(), self.naive.clone()) } else { self.fresh(&dims) })
                    .collect();
                let refs: Vec<&Tensor> = parts.iter().map(|(t, _)| t).collect();
                self.kiln = Tensor::stack(&refs, d);
                let axis = if d < 0 { (d + rank as isize + 1) as usize } else { d as usize };
                self.naive = Naive::stack(&parts.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(), axis);
                format!("stack(dim {d}, {count} parts, this one at {me})")
            }
            Move::Contiguous => {
                self.kiln = self.kiln.contiguous();
                "contiguous()".into()
            }
            Move::Realize => {
                self.kiln.realize().expect("realize");
                "realize()".into()
            }
            Move::T | Move::Unsqueeze | Move::Narrow | Move::Slice | Move::Cat | Move::Stack => {
                format!("(skipped {mv:?} at rank {rank})")
            }
        };
        self.log.push(entry);
    }

    /// Compares kiln's shape, dtype and values with the reference; `Err` describes the first difference.
    fn check(&self) -> Result<(), String> {
        let chain = self.log.join("; ");
        if self.kiln.dims() != self.naive.shape.as_slice() {
            return Err(format!("shape {:?}, reference {:?}\n  chain: {chain}", self.kiln.dims(), self.naive.shape));
        }
        if self.kiln.dtype() != self.dtype {
            return Err(format!("dtype {} changed to {}\n  chain: {chain}", self.dtype, self.kiln.dtype()));
        }
        let (got, want) = (values_of(&self.kiln), self.naive.to_vec());
        match first_difference(&got, &want) {
            None => Ok(()),
            Some(i) => Err(format!(
                "element {i} differs: kiln {:?}, reference {:?}\n  kiln: {got:?}\n  reference: {want:?}\n  chain: {chain}",
                got.get(i),
                want.get(i)
            )),
        }
    }
}

/// Rank 0-4, dims 0-5: 0 in about one dim of twelve (an empty tensor is a case, not the common one), 1 often.
fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![1 => Just(0usize), 3 => Just(1usize), 8 => 2usize..=5], 0..=4)
}

fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop::sample::select(DTYPES.to_vec())
}

proptest! {
    #![proptest_config(config())]

    /// Random chains of 1 to 8 movement ops (with realizations and `contiguous` mixed in) from a random tensor of
    /// rank 0-4 with dims 0-5, in every dtype, give exactly the reference's shape and elements.
    #[test]
    fn movement_chains_match_reference(
        dtype in dtype_strategy(),
        dims in shape_strategy(),
        steps in prop::collection::vec((0..MOVES.len(), any::<u64>()), 1..=8),
    ) {
        let mut chain = Chain::new(dtype, &dims);
        for (k, seed) in steps {
            chain.apply(MOVES[k], seed);
        }
        if let Err(e) = chain.check() {
            prop_assert!(false, "{}", e);
        }
    }

    /// Every intermediate of a chain is right too, not only the end (a chain realized step by step reads each
    /// result back, so each op is also checked once on a realized, contiguous input).
    #[test]
    fn movement_steps_match_reference(
        dtype in dtype_strategy(),
        dims in shape_strategy(),
        steps in prop::collection::vec((0..MOVES.len(), any::<u64>()), 1..=5),
    ) {
        let mut chain = Chain::new(dtype, &dims);
        for (k, seed) in steps {
            chain.apply(MOVES[k], seed);
            if let Err(e) = chain.check() {
                prop_assert!(false, "{}", e);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Broadcasting.
// ---------------------------------------------------------------------------------------------------------------

/// `torch.promote_types`, written out as a table of categories and widths.
fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    let rank = |d: DType| match d {
        Bool => 0,
        U8 => 1,
        U32 => 2,
        I32 => 3,
        I64 => 4,
        F16 | BF16 => 5,
        F32 => 6,
        F64 => 7,
    };
    // An unsigned int with a signed one of no more width needs the next wider signed type; f16 with bf16 (neither
    // holds the other) needs f32.
    if matches!((a, b), (U32, I32) | (I32, U32)) {
        return I64;
    }
    if matches!((a, b), (F16, BF16) | (BF16, F16)) {
        return F32;
    }
    if rank(a) >= rank(b) { a } else { b }
}

/// `torch.result_type` of two tensors: a zero-dim tensor only decides the dtype when its category (bool < int <
/// float) is higher than the dimensioned one's.
fn result_type(a: (DType, usize), b: (DType, usize)) -> DType {
    let category = |d: DType| match d {
        DType::Bool => 0,
        DType::U8 | DType::U32 | DType::I32 | DType::I64 => 1,
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => 2,
    };
    match (a.1 == 0, b.1 == 0) {
        (false, true) if category(b.0) <= category(a.0) => a.0,
        (true, false) if category(a.0) <= category(b.0) => b.0,
        (false, true) => b.0,
        (true, false) => a.0,
        _ => promote(a.0, b.0),
    }
}

/// A shape that broadcasts to `out`: some leading dims dropped, some dims turned into 1.
fn operand_shape(rng: &mut Rng, out: &[usize]) -> Vec<usize> {
    let drop = rng.below(out.len() + 1);
    out[drop..].iter().map(|&d| if rng.below(3) == 0 { 1 } else { d }).collect()
}

/// A random operand of `dims` and `dtype` (small integers, and NaN now and then in floats); when it has two or more
/// dims it is made a transposed view half the time, so operands are not always contiguous.
fn operand(rng: &mut Rng, dtype: DType, dims: &[usize], dev: &Device) -> (Tensor, Naive) {
    let n: usize = dims.iter().product();
    let data: Vec<f64> = (0..n)
        .map(|_| {
            let x = rng.range(-9, 9) as f64;
            if dtype.is_float() && rng.below(16) == 0 {
                f64::NAN
            } else {
                normalize(dtype, if dtype.is_unsigned() { x.abs() } else { x })
            }
        })
        .collect();
    let r = dims.len();
    if r >= 2 && rng.coin() {
        let mut stored = dims.to_vec();
        stored.swap(r - 2, r - 1);
        let t = tensor_of(dtype, &data, &stored, dev).transpose(-1, -2);
        return (t, Naive::new(data, &stored).transpose(r - 2, r - 1));
    }
    (tensor_of(dtype, &data, dims, dev), Naive::new(data, dims))
}

/// An op's name and a call of it that is expected to panic.
type NamedOp<'a> = (&'static str, Box<dyn Fn() -> Tensor + 'a>);

#[derive(Clone, Copy, Debug)]
enum Bin {
    Add,
    Sub,
    Mul,
    Maximum,
    Minimum,
}

const BINS: [Bin; 5] = [Bin::Add, Bin::Sub, Bin::Mul, Bin::Maximum, Bin::Minimum];

fn apply_bin(op: Bin, a: &Tensor, b: &Tensor) -> Tensor {
    match op {
        Bin::Add => a + b,
        Bin::Sub => a - b,
        Bin::Mul => a.mul(b),
        Bin::Maximum => a.maximum(b),
        Bin::Minimum => a.minimum(b),
    }
}

/// The reference op on values already cast to the result dtype (NaN propagates through maximum and minimum, as
/// `torch.maximum`); the caller rounds or wraps the result to that dtype.
fn reference_bin(op: Bin, x: f64, y: f64) -> f64 {
    match op {
        Bin::Add => x + y,
        Bin::Sub => x - y,
        Bin::Mul => x * y,
        Bin::Maximum | Bin::Minimum if x.is_nan() || y.is_nan() => f64::NAN,
        Bin::Maximum => x.max(y),
        Bin::Minimum => x.min(y),
    }
}

fn compare(what: &str, got: &Tensor, want: &Naive, dtype: DType) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.dims(), want.shape.as_slice(), "{}: shape", what);
    prop_assert_eq!(got.dtype(), dtype, "{}: dtype", what);
    let (g, w) = (values_of(got), want.to_vec());
    if let Some(i) = first_difference(&g, &w) {
        prop_assert!(false, "{}: element {} differs\n  kiln: {:?}\n  reference: {:?}", what, i, g, w);
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// add/sub/mul/maximum/minimum of two broadcast-compatible tensors (random ranks 0-4, dims 0-5, any pair of
    /// dtypes, zero-dim and transposed operands included) match the reference in shape, dtype and value.
    #[test]
    fn binary_ops_broadcast_like_reference(
        out in shape_strategy(),
        da in dtype_strategy(),
        db in dtype_strategy(),
        op in 0..BINS.len(),
        seed in any::<u64>(),
    ) {
        let dev = Device::cpu();
        let mut rng = Rng::new(seed);
        let (sa, sb) = (operand_shape(&mut rng, &out), operand_shape(&mut rng, &out));
        let (ta, na) = operand(&mut rng, da, &sa, &dev);
        let (tb, nb) = operand(&mut rng, db, &sb, &dev);
        let rt = result_type((da, sa.len()), (db, sb.len()));
        let op = if matches!(BINS[op], Bin::Sub) && rt == DType::Bool { Bin::Add } else { BINS[op] };
        let got = apply_bin(op, &ta, &tb);
        let want = Naive::map_broadcast(&[&na, &nb], |v| {
            normalize(rt, reference_bin(op, normalize(rt, v[0]), normalize(rt, v[1])))
        });
        compare(&format!("{op:?} of {da}{sa:?} and {db}{sb:?}"), &got, &want, rt)?;
    }

    /// `cond.where_(a, b)` with three independently broadcast shapes and promoted branch dtypes.
    #[test]
    fn where_broadcasts_like_reference(
        out in shape_strategy(),
        da in dtype_strategy(),
        db in dtype_strategy(),
        seed in any::<u64>(),
    ) {
        let dev = Device::cpu();
        let mut rng = Rng::new(seed);
        let (sc, sa, sb) = (operand_shape(&mut rng, &out), operand_shape(&mut rng, &out), operand_shape(&mut rng, &out));
        let (tc, nc) = operand(&mut rng, DType::Bool, &sc, &dev);
        let (ta, na) = operand(&mut rng, da, &sa, &dev);
        let (tb, nb) = operand(&mut rng, db, &sb, &dev);
        let rt = result_type((da, sa.len()), (db, sb.len()));
        let got = tc.where_(&ta, &tb);
        let want = Naive::map_broadcast(&[&nc, &na, &nb], |v| normalize(rt, if v[0] != 0.0 { v[1] } else { v[2] }));
        compare(&format!("where_({sc:?}, {da}{sa:?}, {db}{sb:?})"), &got, &want, rt)?;
    }

    /// Shapes that clash in one dim (sizes that differ and are not 1) make add, mul, maximum and where_ panic at
    /// the call, naming the op and both shapes, whichever operand is longer.
    #[test]
    fn incompatible_shapes_panic(
        out in prop::collection::vec(0usize..=5, 1..=4),
        sizes in prop::sample::subsequence(vec![0usize, 2, 3, 4, 5], 2),
        seed in any::<u64>(),
    ) {
        let dev = Device::cpu();
        let mut rng = Rng::new(seed);
        let axis = rng.below(out.len());
        let (mut sa, mut sb) = (out.clone(), out.clone());
        sa[axis] = sizes[0];
        sb[axis] = sizes[1];
        // Drop some leading dims of one side (never the clashing one).
        let drop = rng.below(axis + 1);
        if rng.coin() { sa.drain(..drop); } else { sb.drain(..drop); }
        if rng.coin() { std::mem::swap(&mut sa, &mut sb); }
        let (ta, _) = operand(&mut rng, DType::F32, &sa, &dev);
        let (tb, _) = operand(&mut rng, DType::F32, &sb, &dev);
        let (sa_s, sb_s) = (format!("{sa:?}"), format!("{sb:?}"));
        let cond = ta.gt(0.0);
        let cases: [NamedOp; 5] = [
            ("add", Box::new(|| &ta + &tb)),
            ("mul", Box::new(|| ta.mul(&tb))),
            ("maximum", Box::new(|| ta.maximum(&tb))),
            ("where_", Box::new(|| cond.where_(&tb, 1.0))),
            ("where_", Box::new(|| cond.where_(1.0, &tb))),
        ];
        for (name, f) in cases {
            let caught = catch_panic(f);
            prop_assert!(caught.is_some(), "{} of {} and {} did not panic", name, sa_s, sb_s);
            let msg = caught.unwrap().message;
            prop_assert!(msg.starts_with(&format!("kiln: {name}: ")), "message: {}", msg);
            prop_assert!(msg.contains(&sa_s) && msg.contains(&sb_s), "message lacks {} or {}: {}", sa_s, sb_s, msg);
            prop_assert!(msg.contains("tests/props.rs:"), "message lacks the caller's location: {}", msg);
        }
        // Nothing half-built is left behind: the operands still work.
        prop_assert_eq!(values_of(&ta.mul(0.0).sum_all()).len(), 1);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions (they reuse the same shapes; zero-dim tensors and empty dims included).
// ---------------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Red {
    Sum,
    Max,
    Min,
}

proptest! {
    #![proptest_config(config())]

    /// sum/max/min over a random set of dims (negative, empty = all, dim 0 of a zero-dim tensor), with and
    /// without keepdim, match an index-loop reference; max/min over an empty dim panic instead.
    #[test]
    fn reductions_match_reference(
        dims in shape_strategy(),
        dtype in prop::sample::select(vec![DType::F64, DType::F32, DType::I64, DType::I32, DType::Bool]),
        red in prop::sample::select(vec![Red::Sum, Red::Max, Red::Min]),
        keepdim in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dev = Device::cpu();
        let mut rng = Rng::new(seed);
        let (t, n) = operand(&mut rng, dtype, &dims, &dev);
        let rank = dims.len();
        let mut given: Vec<isize> = Vec::new();
        for d in 0..rank.max(1) {
            if rng.below(3) == 0 {
                given.push(if rng.coin() { d as isize - rank.max(1) as isize } else { d as isize });
            }
        }
        let axes: Vec<usize> = if given.is_empty() {
            (0..rank).collect()
        } else {
            given.iter().map(|&d| resolve(d, rank)).filter(|&a| a < rank).collect()
        };
        let what = format!("{red:?}({given:?}, keepdim {keepdim}) of {dtype}{dims:?}");
        let run = || match red {
            Red::Sum => t.sum(given.clone(), keepdim),
            Red::Max => t.max(given.clone(), keepdim),
            Red::Min => t.min(given.clone(), keepdim),
        };
        if !matches!(red, Red::Sum) && axes.iter().any(|&a| dims[a] == 0) {
            let caught = catch_panic(run);
            prop_assert!(caught.is_some(), "{} did not panic", what);
            let msg = caught.unwrap().message;
            prop_assert!(msg.contains("empty") && msg.contains(&format!("{dims:?}")), "{}: {}", what, msg);
            return Ok(());
        }
        let got = run();
        let out_dtype = match red {
            Red::Sum if !dtype.is_float() => DType::I64,
            _ => dtype,
        };
        // Reference: fold every source element into its output cell.
        let kept: Vec<usize> = (0..rank).map(|d| if axes.contains(&d) { 1 } else { dims[d] }).collect();
        let cells: usize = kept.iter().product();
        let init = match red {
            Red::Sum => 0.0,
            Red::Max => f64::NEG_INFINITY,
            Red::Min => f64::INFINITY,
        };
        let mut acc = vec![init; cells];
        let src = n.to_vec();
        for (flat, idx) in all_indices(&dims).iter().enumerate() {
            let cell = idx.iter().zip(&kept).fold(0, |c, (&i, &k)| c * k + if k == 1 { 0 } else { i });
            let (a, x) = (acc[cell], src[flat]);
            acc[cell] = match red {
                Red::Sum => a + x,
                _ if a.is_nan() || x.is_nan() => f64::NAN,
                Red::Max => a.max(x),
                Red::Min => a.min(x),
            };
        }
        let out_dims: Vec<usize> = if keepdim {
            kept.clone()
        } else {
            (0..rank).filter(|d| !axes.contains(d)).map(|d| dims[d]).collect()
        };
        let want = Naive::new(acc.into_iter().map(|x| normalize(out_dtype, x)).collect(), &out_dims);
        compare(&what, &got, &want, out_dtype)?;
    }
}
