//! `interpolate` (`torch.nn.functional.interpolate`): nearest, nearest-exact and (bi/tri)linear resampling of the
//! spatial dims of `[N, C, *spatial]`, to a size or by a scale factor, with PyTorch's source-index rules
//! (`area_pixel_compute_source_index`, `nearest_neighbor_compute_source_index`), computed on the host in the
//! precision PyTorch computes them (f32 for f32 and half inputs, f64 for f64).
//!
//! A composition: along each resized dim the output reads its source rows through `index_select` (a gather, so the
//! gradient is the deterministic scatter-add), and linear modes blend two of them, `x0 (1 - w) + x1 w`, with the
//! weights a constant tensor. One dim after another: for a 2-d bilinear resize the same value as PyTorch's
//! four-corner sum up to rounding. Values PyTorch printed are checked in `tests/nn/interpolate.rs`
//! (`tests/fixtures/interpolate.py`).
//!
//! Deliberately not done: `bicubic` and `area` modes, `antialias`, and `recompute_scale_factor` (the given scale
//! factor is used for the indices, PyTorch's default).

use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::DType;

/// How `interpolate` computes each output element (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InterpolateMode {
    /// The source element at `floor(i * scale)` (`'nearest'`, the default).
    #[default]
    Nearest,
    /// The source element at `floor((i + 0.5) * scale)` (`'nearest-exact'`, which matches other libraries).
    NearestExact,
    /// Linear in each spatial dim: `'linear'` (1-d), `'bilinear'` (2-d), `'trilinear'` (3-d).
    Linear,
}

/// PyTorch's keyword arguments of `interpolate`: exactly one of `size` and `scale_factor`, one entry per spatial
/// dim (or one for all of them).
#[derive(Clone, Debug, Default)]
pub struct InterpolateOptions {
    pub size: Option<Vec<usize>>,
    pub scale_factor: Option<Vec<f64>>,
    pub mode: InterpolateMode,
    /// Linear modes only: the corner pixels' centres are aligned (`scale = (in - 1) / (out - 1)`).
    pub align_corners: bool,
}

/// Resamples the spatial dims (all after the first two) of `x` (`[N, C, *spatial]`, 1 to 3 spatial dims) as
/// `torch.nn.functional.interpolate` does; see [`InterpolateOptions`] and the module doc.
#[track_caller]
pub fn interpolate(x: &Tensor, opts: &InterpolateOptions) -> Tensor {
    float_only("interpolate", x);
    let spatial = x.rank().saturating_sub(2);
    if !(1..=3).contains(&spatial) {
        fail!("interpolate", "the input must be [N, C, *spatial] with 1 to 3 spatial dims, got {:?}", x.dims());
    }
    if opts.align_corners && opts.mode != InterpolateMode::Linear {
        fail!("interpolate", "align_corners is for the linear modes only, not {:?}", opts.mode);
    }
    let per_dim = |n: usize, what: &str| {
        if n != 1 && n != spatial {
            fail!("interpolate", "{what} needs 1 or {spatial} entries for the {spatial} spatial dims, got {n}");
        }
    };
    // Each spatial dim: (input size, output size, the scale factor given).
    let dims: Vec<(usize, usize, Option<f64>)> = match (&opts.size, &opts.scale_factor) {
        (Some(size), None) => {
            per_dim(size.len(), "size");
            (0..spatial).map(|d| (x.dims()[2 + d], size[d.min(size.len() - 1)], None)).collect()
        }
        (None, Some(scale)) => {
            per_dim(scale.len(), "scale_factor");
            (0..spatial)
                .map(|d| {
                    let (input, s) = (x.dims()[2 + d], scale[d.min(scale.len() - 1)]);
                    if !(s.is_finite() && s > 0.0) {
                        fail!("interpolate", "scale factors must be finite and positive, got {s}");
                    }
                    (input, (input as f64 * s).floor() as usize, Some(s))
                })
                .collect()
        }
        _ => fail!("interpolate", "give exactly one of size and scale_factor"),
    };
    if dims.iter().any(|&(input, out, _)| input == 0 || out == 0) {
        fail!("interpolate", "input and output spatial sizes must be positive: {:?} to {:?}", x.dims(), dims);
    }
    x.in_f32(|x| {
        let mut y = x.clone();
        for (d, &(input, out, scale)) in dims.iter().enumerate() {
            y = resample(&y, 2 + d as isize, input, out, scale, opts);
        }
        y
    })
}

/// `x` resampled along `dim` from `input` to `out` elements.
fn resample(x: &Tensor, dim: isize, input: usize, out: usize, scale: Option<f64>, opts: &InterpolateOptions) -> Tensor {
    let dev = x.device();
    let index = |v: Vec<i32>| {
        Tensor::from_vec(v, [out], &dev).unwrap_or_else(|e| fail!("interpolate", "the source indices: {e}"))
    };
    let sources = Sources::new(input, out, scale, opts, x.dtype() == DType::F64);
    match opts.mode {
        InterpolateMode::Nearest | InterpolateMode::NearestExact => {
            x.index_select(dim, &index(sources.nearest(opts.mode == InterpolateMode::NearestExact)))
        }
        InterpolateMode::Linear => {
            let (i0, i1, w) = sources.linear();
            // The weights along `dim`, broadcast over the others.
            let mut shape = vec![1usize; x.rank()];
            shape[dim as usize] = out;
            let w = if x.dtype() == DType::F64 {
                Tensor::from_vec(w, shape, &dev)
            } else {
                Tensor::from_vec(w.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape, &dev)
            }
            .unwrap_or_else(|e| fail!("interpolate", "the weights: {e}"));
            let (x0, x1) = (x.index_select(dim, &index(i0)), x.index_select(dim, &index(i1)));
            x0.mul(w.neg().add(1.0)).add(x1.mul(&w))
        }
    }
}

/// PyTorch's source positions for one resized dim, in f32 arithmetic (f64 for an f64 input), as its kernels use.
struct Sources {
    input: usize,
    out: usize,
    /// Source positions per output step.
    scale: f64,
    align_corners: bool,
    f64: bool,
}

impl Sources {
    fn new(input: usize, out: usize, factor: Option<f64>, opts: &InterpolateOptions, f64: bool) -> Sources {
        let round = |v: f64| if f64 { v } else { v as f32 as f64 };
        let scale = if opts.align_corners {
            if out > 1 { round((input - 1) as f64) / round((out - 1) as f64) } else { 0.0 }
        } else {
            match factor {
                Some(s) => round(1.0 / s),
                None => round(input as f64) / round(out as f64),
            }
        };
        Sources { input, out, scale: round(scale), align_corners: opts.align_corners, f64 }
    }

    /// `x` rounded to the working precision.
    fn round(&self, x: f64) -> f64 {
        if self.f64 { x } else { x as f32 as f64 }
    }

    fn nearest(&self, exact: bool) -> Vec<i32> {
        let offset = if exact { 0.5 } else { 0.0 };
        (0..self.out)
            .map(|i| {
                (self.round(self.round(i as f64 + offset) * self.scale).floor() as usize).min(self.input - 1) as i32
            })
            .collect()
    }

    /// Output `i`'s position in the input (`area_pixel_compute_source_index`): `scale i` with aligned corners,
    /// else `scale (i + 0.5) - 0.5`, not below 0.
    fn source(&self, i: usize) -> f64 {
        if self.align_corners {
            self.round(self.scale * i as f64)
        } else {
            self.round(self.round(self.scale * self.round(i as f64 + 0.5)) - 0.5).max(0.0)
        }
    }

    /// For each output: the two source indices and the second one's weight.
    fn linear(&self) -> (Vec<i32>, Vec<i32>, Vec<f64>) {
        let mut i0 = Vec::with_capacity(self.out);
        let mut i1 = Vec::with_capacity(self.out);
        let mut w = Vec::with_capacity(self.out);
        for i in 0..self.out {
            let src = self.source(i);
            let lo = (src.floor() as usize).min(self.input - 1);
            i0.push(lo as i32);
            i1.push((lo + usize::from(lo + 1 < self.input)) as i32);
            w.push(self.round(src - lo as f64));
        }
        (i0, i1, w)
    }
}
