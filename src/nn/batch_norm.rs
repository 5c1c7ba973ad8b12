//! `BatchNorm1d` and `BatchNorm2d` (`torch.nn`): normalization over the batch (and spatial) dims of each channel
//! (dim 1), with PyTorch's running statistics.
//!
//! In training mode a forward pass normalizes with the batch's mean and biased variance and updates the running
//! statistics, `running = (1 - momentum) * running + momentum * batch` (the variance unbiased, `n / (n - 1)`; with
//! `momentum: None` a cumulative average over the batches seen); in eval mode it normalizes with the running
//! statistics. The update is a side effect PyTorch performs in place during the forward pass; kiln's forward pass
//! records it lazily and hands the new statistics to the runtime (`realize::defer`), which computes them with the
//! next value this thread realizes (the step's loss): the batch's statistics are computed once, in the step's plan,
//! and the update does not hold the batch's graph until some later read.
//!
//! The running statistics are buffers (`named_buffers`: `running_mean`, `running_var`, and `num_batches_tracked`,
//! the training batches seen, a scalar of the device's index dtype: i64 as PyTorch's, i32 on wgpu), saved and
//! loaded with the parameters by `save_module` / `load_module` (a PyTorch `state_dict` loads strictly), never seen
//! by an optimizer. The count is a tensor, updated with the statistics: `momentum: None` divides by it, so a loaded
//! checkpoint's cumulative average goes on where it stopped.

use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::tensor::Tensor;
use kiln_jit::DType;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Batch normalization of the channels (dim 1) of `[N, C]`, `[N, C, L]` (`BatchNorm1d`) or `[N, C, H, W]`
/// (`BatchNorm2d`) inputs.
pub struct BatchNorm {
    name: &'static str,
    /// The input ranks this layer takes.
    ranks: &'static [usize],
    num_features: usize,
    eps: f64,
    /// `None`: the cumulative average over the batches seen.
    momentum: Option<f64>,
    weight: Option<Param>,
    bias: Option<Param>,
    /// Mean and variance (f32 buffers) and the batches seen; `None` without running statistics (always the
    /// batch's). The lock keeps a forward pass's read-and-replace of all three whole.
    running: Option<Running>,
    training: AtomicBool,
}

/// A [`BatchNorm`]'s running statistics.
struct Running {
    lock: Mutex<()>,
    mean: Param,
    var: Param,
    /// `num_batches_tracked`: a scalar of the device's index dtype.
    batches: Param,
}

/// `BatchNorm1d(num_features)`: inputs `[N, C]` or `[N, C, L]`.
pub struct BatchNorm1d;
/// `BatchNorm2d(num_features)`: inputs `[N, C, H, W]`.
pub struct BatchNorm2d;

impl BatchNorm1d {
    /// Weight 1, bias 0, running mean 0 and variance 1, eps 1e-5, momentum 0.1, training mode (PyTorch's defaults).
    #[allow(clippy::new_ret_no_self)]
    pub fn new(num_features: usize, device: &Device) -> BatchNorm {
        BatchNorm::with("BatchNorm1d", &[2, 3], num_features, device)
    }
}

impl BatchNorm2d {
    /// As [`BatchNorm1d::new`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new(num_features: usize, device: &Device) -> BatchNorm {
        BatchNorm::with("BatchNorm2d", &[4], num_features, device)
    }
}

impl BatchNorm {
    fn with(name: &'static str, ranks: &'static [usize], c: usize, device: &Device) -> BatchNorm {
        BatchNorm {
            name,
            ranks,
            num_features: c,
            eps: 1e-5,
            momentum: Some(0.1),
            weight: Some(Param::new("weight", init::ones([c], device))),
            bias: Some(Param::new("bias", init::zeros([c], device))),
            running: Some(Running {
                lock: Mutex::new(()),
                mean: Param::buffer("running_mean", init::zeros([c], device)),
                var: Param::buffer("running_var", init::ones([c], device)),
                batches: Param::buffer("num_batches_tracked", Tensor::scalar(0i64, device.index_dtype(), device)),
            }),
            training: AtomicBool::new(true),
        }
    }

    pub fn eps(mut self, eps: f64) -> BatchNorm {
        self.eps = eps;
        self
    }

    /// The weight of a batch's statistics in the running ones; `None`: a cumulative average.
    pub fn momentum(mut self, momentum: Option<f64>) -> BatchNorm {
        self.momentum = momentum;
        self
    }

    /// `affine=False`: no weight and bias.
    pub fn no_affine(mut self) -> BatchNorm {
        self.weight = None;
        self.bias = None;
        self
    }

    /// `track_running_stats=False`: every forward pass, in eval mode too, uses the batch's statistics.
    pub fn no_running_stats(mut self) -> BatchNorm {
        self.running = None;
        self
    }

    /// The running mean (lazy until the next realize after a training step; f32).
    pub fn running_mean(&self) -> Option<Tensor> {
        self.running.as_ref().map(|r| r.mean.get())
    }

    /// The running (unbiased) variance, as [`BatchNorm::running_mean`].
    pub fn running_var(&self) -> Option<Tensor> {
        self.running.as_ref().map(|r| r.var.get())
    }

    /// Training batches seen (`num_batches_tracked`, a scalar tensor of the device's index dtype), as
    /// [`BatchNorm::running_mean`].
    pub fn batches_tracked(&self) -> Option<Tensor> {
        self.running.as_ref().map(|r| r.batches.get())
    }

    /// Sets the running statistics (`[C]`, converted to the buffers' dtype, f32 unless the module was cast): a
    /// checkpoint's, or PyTorch's.
    #[track_caller]
    pub fn set_running(&self, mean: &Tensor, var: &Tensor) {
        let c = self.num_features;
        if mean.dims() != [c] || var.dims() != [c] {
            fail!(self.name, "running statistics must be [{c}], got {:?} and {:?}", mean.dims(), var.dims());
        }
        match &self.running {
            Some(r) => {
                let _whole = r.lock.lock();
                r.mean.set(mean.to_dtype(r.mean.dtype()));
                r.var.set(var.to_dtype(r.var.dtype()));
            }
            None => fail!(self.name, "this layer keeps no running statistics"),
        }
    }
}

impl Module for BatchNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let c = self.num_features;
        if !self.ranks.contains(&x.rank()) || x.dims()[1] != c || !x.dtype().is_float() {
            fail!(
                self.name,
                "expects a float input of rank {:?} with {c} channels in dim 1, got {}{:?}",
                self.ranks,
                x.dtype(),
                x.dims()
            );
        }
        let axes: Vec<isize> = (0..x.rank() as isize).filter(|&a| a != 1).collect();
        let per_channel = |t: &Tensor| {
            let mut dims = vec![1usize; x.rank()];
            dims[1] = c;
            t.reshape(dims)
        };
        let n = x.numel() / c.max(1);
        let training = self.training.load(Ordering::Relaxed);
        let x32 = x.to_dtype(DType::F32);
        let (mean, var) = match &self.running {
            Some(r) if !training => {
                let _whole = r.lock.lock();
                (per_channel(&r.mean.get().to_dtype(DType::F32)), per_channel(&r.var.get().to_dtype(DType::F32)))
            }
            _ => {
                if n <= 1 {
                    fail!(self.name, "training needs more than one value per channel, got input {:?}", x.dims());
                }
                let mean = x32.mean(axes.clone(), true);
                let var = x32.var(axes.clone(), 0.0, true);
                if let (Some(r), true) = (&self.running, training) {
                    let _whole = r.lock.lock();
                    let seen = r.batches.get().add(1i64);
                    // The batch's weight: the momentum, or 1 / batches seen (a cumulative average), as a tensor
                    // so that the count need not be read back.
                    let m = match self.momentum {
                        Some(m) => Tensor::scalar(m, DType::F32, &x.device()),
                        None => seen.to_dtype(DType::F32).recip(),
                    };
                    let keep = m.neg().add(1.0);
                    let unbiased = var.detach().mul(n as f64 / (n - 1) as f64).reshape([c]);
                    // Computed in f32, kept in the buffers' dtype (f32 unless `Module::to_dtype` changed it).
                    let new_mean = r.mean.get().to_dtype(DType::F32).mul(&keep).add(mean.detach().reshape([c]).mul(&m));
                    let new_var = r.var.get().to_dtype(DType::F32).mul(&keep).add(unbiased.mul(&m));
                    let (new_mean, new_var) = (new_mean.to_dtype(r.mean.dtype()), new_var.to_dtype(r.var.dtype()));
                    for t in [&new_mean, &new_var, &seen] {
                        crate::realize::defer(t.clone());
                    }
                    r.mean.set(new_mean);
                    r.var.set(new_var);
                    r.batches.set(seen);
                }
                (mean, var)
            }
        };
        let mut y = x32.sub(&mean).div(var.add(self.eps).sqrt());
        if let Some(w) = &self.weight {
            y = y.mul(per_channel(&w.get().to_dtype(DType::F32)));
        }
        if let Some(b) = &self.bias {
            y = y.add(per_channel(&b.get().to_dtype(DType::F32)));
        }
        y.to_dtype(x.dtype())
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        super::present(&[&self.weight, &self.bias])
    }

    fn named_buffers(&self) -> Vec<(String, Param)> {
        self.running
            .iter()
            .flat_map(|r| {
                [("running_mean", &r.mean), ("running_var", &r.var), ("num_batches_tracked", &r.batches)]
                    .map(|(n, p)| (n.to_string(), p.clone()))
            })
            .collect()
    }

    fn train(&self, mode: bool) {
        self.training.store(mode, Ordering::Relaxed);
    }
}
