//! Tensors made from nothing: constants, ranges, identity, random numbers.
//!
//! None of these allocates until realized: `zeros` is one `Const` node, `eye` is two iotas and a comparison, and
//! `rand` is a `Rand` node whose (seed, offset) key is drawn from the global stream now, so the numbers do not
//! depend on when or where the tensor is realized.

use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::Tensor;
use kiln_jit::{DType, Op, RandDist, Scalar, Shape};

impl Tensor {
    /// `value` everywhere.
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, value: impl Into<Scalar>, dtype: DType, device: &Device) -> Tensor {
        Tensor::on_device(Op::Const(value.into()), crate::tensor::Srcs::new(), shape.into(), dtype, *device, None)
    }

    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::full(shape, 0, dtype, device)
    }

    #[track_caller]
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::full(shape, 1, dtype, device)
    }

    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Tensor {
        Tensor::full(self.shape().clone(), value, self.dtype(), &self.device())
    }

    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(0)
    }

    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        self.full_like(1)
    }

    /// `start + i * step` for `i` in `0..n`, as `dtype`.
    #[track_caller]
    pub(crate) fn iota(start: Scalar, step: Scalar, n: usize, dtype: DType, device: &Device) -> Tensor {
        Tensor::on_device(Op::Iota { start, step }, crate::tensor::Srcs::new(), Shape::new([n]), dtype, *device, None)
    }

    /// Values from `start` up to (not including) `end` by `step` (`torch.arange`). The dtype is i64 if all three
    /// are integers, else f32, as in PyTorch.
    #[track_caller]
    pub fn arange(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        step: impl Into<Scalar>,
        device: &Device,
    ) -> Tensor {
        let (start, end, step) = (start.into(), end.into(), step.into());
        let any_float = [start, end, step].iter().any(|s| matches!(s, Scalar::Float(_)));
        let dtype = if any_float { DType::F32 } else { DType::I64 };
        let (a, b, s) = (start.as_f64(), end.as_f64(), step.as_f64());
        if s == 0.0 || !s.is_finite() || !a.is_finite() || !b.is_finite() {
            fail!("arange", "start {start}, end {end} and step {step} must be finite with a non-zero step");
        }
        if (b - a) * s < 0.0 {
            fail!("arange", "end {end} cannot be reached from start {start} with step {step}");
        }
        let n = ((b - a) / s).ceil() as usize;
        Tensor::iota(start, step, n, dtype, device)
    }

    /// `steps` values evenly spaced from `start` to `end` inclusive (`torch.linspace`), with PyTorch's symmetric
    /// formula: the first half counts up from `start`, the second half down from `end`, so both ends are exact.
    #[track_caller]
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType, device: &Device) -> Tensor {
        if !dtype.is_float() {
            fail!("linspace", "dtype must be float, not {dtype}");
        }
        if steps <= 1 {
            return Tensor::full([steps], start, dtype, device);
        }
        if dtype.is_half() {
            // As PyTorch: computed in f32 and rounded once. In the dtype itself the rounded step's error grows
            // with the index (bf16 linspace(-3.5, 10, 100) was off by 0.017 next to 0).
            return Tensor::linspace(start, end, steps, DType::F32, device).to_dtype(dtype);
        }
        let step = (end - start) / (steps - 1) as f64;
        let i = Tensor::iota(Scalar::Int(0), Scalar::Int(1), steps, dtype, device);
        let up = i.mul(step).add(start);
        let down = i.rsub((steps - 1) as f64).mul(-step).add(end);
        i.lt((steps / 2) as f64).where_(&up, &down)
    }

    /// The `n x n` identity matrix.
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Tensor {
        let i = Tensor::iota(Scalar::Int(0), Scalar::Int(1), n, device.index_dtype(), device);
        i.reshape_prim(vec![n, 1]).eq(i.reshape_prim(vec![1, n])).to_dtype(dtype)
    }

    #[track_caller]
    fn random(
        name: &str,
        dist: RandDist,
        shape: Shape,
        dtype: DType,
        device: &Device,
        generator: &Generator,
    ) -> Tensor {
        if !dtype.is_float() {
            fail!(name, "dtype must be float, not {dtype}");
        }
        let key = generator.take(shape.numel());
        Tensor::on_device(Op::Rand { dist, slot: 0 }, crate::tensor::Srcs::new(), shape, dtype, *device, Some(key))
    }

    /// Uniform in [0, 1), from the calling thread's default generator (seeded by `kiln::manual_seed`).
    #[track_caller]
    pub fn rand(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::rand_with(shape, dtype, device, &default_generator())
    }

    /// Standard normal, from the calling thread's default generator (seeded by `kiln::manual_seed`).
    #[track_caller]
    pub fn randn(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::randn_with(shape, dtype, device, &default_generator())
    }

    /// `rand` drawing from `generator` (`torch.rand(..., generator=g)`).
    #[track_caller]
    pub fn rand_with(shape: impl Into<Shape>, dtype: DType, device: &Device, generator: &Generator) -> Tensor {
        Tensor::random("rand", RandDist::Uniform, shape.into(), dtype, device, generator)
    }

    /// `randn` drawing from `generator` (`torch.randn(..., generator=g)`).
    #[track_caller]
    pub fn randn_with(shape: impl Into<Shape>, dtype: DType, device: &Device, generator: &Generator) -> Tensor {
        Tensor::random("randn", RandDist::Normal, shape.into(), dtype, device, generator)
    }

    #[track_caller]
    pub fn rand_like(&self) -> Tensor {
        self.rand_like_with(&default_generator())
    }

    #[track_caller]
    pub fn randn_like(&self) -> Tensor {
        self.randn_like_with(&default_generator())
    }

    /// `rand_like` drawing from `generator`.
    #[track_caller]
    pub fn rand_like_with(&self, generator: &Generator) -> Tensor {
        Tensor::random("rand_like", RandDist::Uniform, self.shape().clone(), self.dtype(), &self.device(), generator)
    }

    /// `randn_like` drawing from `generator`.
    #[track_caller]
    pub fn randn_like_with(&self, generator: &Generator) -> Tensor {
        Tensor::random("randn_like", RandDist::Normal, self.shape().clone(), self.dtype(), &self.device(), generator)
    }
}
