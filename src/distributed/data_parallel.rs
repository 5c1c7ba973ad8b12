//! Data-parallel training (`DistributedDataParallel`): each rank runs the same model on its share of the batch,
//! and `average` turns its gradients into the mean over every rank's, so every rank takes the same optimizer step
//! and the replicas stay identical.
//!
//! How a step runs:
//! 1. `average(grads, &[&loss])` flattens the gradients into **buckets** (one contiguous tensor per run of
//!    parameters of one dtype and device, up to `bucket_bytes`, 25 MiB by default as PyTorch's `bucket_cap_mb`) and
//!    realizes them with `also_realize` in one graph: the forward and backward passes and the flattening are one
//!    plan.
//! 2. Each bucket is summed over the ranks (one all-reduce per bucket, not one per parameter: a two-layer MLP's
//!    four gradients are one message): in host memory, or on the GPU through NCCL for a CUDA bucket in a build
//!    with the `nccl` feature (flattened there by the backward pass's plan).
//! 3. Each gradient comes back as a lazy slice of its summed bucket divided by the world size, so the division and
//!    the unflattening fuse into the optimizer's update plan.
//!
//! A parameter without a gradient on this rank (the loss did not use it) contributes zeros, so the ranks still
//! send buckets of the same size; it then gets the average of the other ranks' gradients (PyTorch's DDP with
//! `find_unused_parameters=True` does the same). Clipping (`nn::clip_grad_norm`) after `average` sees the averaged
//! gradient, as in PyTorch; gradient accumulation (`optim::GradAccumulator`) sums micro-batches locally and
//! averages once, as DDP's `no_sync`.
//!
//! `new` checks that every rank has the same parameters (count, dtypes, shapes, in order) and copies rank 0's
//! values to the others, as DDP's constructor does.

use super::ProcessGroup;
use crate::autograd::{Gradients, no_grad};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::Param;
use crate::tensor::Tensor;
use kiln_jit::DType;

/// PyTorch's default bucket size (`bucket_cap_mb=25`).
const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Averages gradients over a process group; see the module doc.
pub struct DataParallel {
    group: ProcessGroup,
    params: Vec<Param>,
    buckets: Vec<Bucket>,
}

/// Parameters whose gradients travel as one tensor.
struct Bucket {
    /// (index into `params`, offset in the bucket, element count).
    members: Vec<(usize, usize, usize)>,
    numel: usize,
    dtype: DType,
    device: Device,
}

impl DataParallel {
    /// Checks that every rank passes the same parameter list (count, dtypes, shapes) and gives every rank rank 0's
    /// values. Every rank must call it (it communicates).
    pub fn new(group: &ProcessGroup, params: Vec<Param>) -> Result<DataParallel> {
        DataParallel::with_bucket_bytes(group, params, DEFAULT_BUCKET_BYTES)
    }

    /// `new` with another bucket size (bytes of gradient per all-reduce; a parameter larger than that is a bucket
    /// of its own).
    pub fn with_bucket_bytes(group: &ProcessGroup, params: Vec<Param>, bucket_bytes: usize) -> Result<DataParallel> {
        let params = crate::optim::dedup(params);
        check_same_params(group, &params)?;
        let buckets = plan_buckets(&params, bucket_bytes);
        let ddp = DataParallel { group: group.clone(), params, buckets };
        ddp.broadcast_params()?;
        Ok(ddp)
    }

    /// The group gradients are averaged over.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The parameters, in the order given (duplicates removed).
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// How many all-reduces `average` runs per step.
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// Replaces every rank's parameter values by rank 0's (`new` does this once; call it again after loading a
    /// checkpoint on rank 0 only).
    pub fn broadcast_params(&self) -> Result<()> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        for bucket in &self.buckets {
            let flat = no_grad(|| self.flatten(bucket, |i| Some(self.params[i].get())));
            let root = self.group.broadcast(&flat, 0)?;
            if self.group.is_root() {
                continue;
            }
            let values: Vec<Tensor> =
                bucket.members.iter().map(|&(i, off, n)| no_grad(|| self.unflatten(&root, i, off, n))).collect();
            crate::realize(&values.iter().collect::<Vec<_>>())?;
            for (&(i, _, _), v) in bucket.members.iter().zip(values) {
                self.params[i].set(v);
            }
        }
        Ok(())
    }

    /// The mean of every rank's `grads` for this module's parameters (see the module doc), computed with
    /// `also_realize` (the loss, say) in the backward pass's plan. Gradients of other tensors are dropped. With
    /// one process it returns `grads` as they are.
    pub fn average(&self, grads: Gradients, also_realize: &[&Tensor]) -> Result<Gradients> {
        if self.group.world_size() == 1 {
            return Ok(grads);
        }
        // Each gradient is an output of the backward pass's plan; the buckets are assembled in host memory, in
        // the copy that brings them to the communication library anyway (a concatenation kernel on the device
        // cost more than the all-reduce of a small model's bucket). A bucket that NCCL sums (`on_device`) is
        // instead flattened on its GPU in the same plan, and never leaves it.
        let values: Vec<Vec<Tensor>> = no_grad(|| {
            self.buckets
                .iter()
                .map(|b| {
                    let grad = |i: usize| grads.get(&self.params[i].get()).cloned();
                    if on_device(b) {
                        return vec![self.flatten(b, grad)];
                    }
                    b.members
                        .iter()
                        .map(|&(i, _, n)| grad(i).unwrap_or_else(|| Tensor::zeros([n], b.dtype, &b.device)))
                        .collect()
                })
                .collect()
        });
        drop(grads);
        let mut targets: Vec<&Tensor> = values.iter().flatten().collect();
        targets.extend_from_slice(also_realize);
        crate::realize(&targets)?;
        let world = self.group.world_size() as f64;
        let mut out = Gradients::default();
        drop(targets);
        for (bucket, parts) in self.buckets.iter().zip(values) {
            let summed = if on_device(bucket) {
                self.group.all_reduce(&parts[0], super::ReduceOp::Sum)?
            } else {
                // A gradient nothing else holds (the usual case) is summed in its own buffer.
                let host = parts
                    .into_iter()
                    .map(|t| match t.into_unique_host() {
                        Ok(h) => Ok(super::HostData::Owned(h)),
                        Err(t) => super::host_of(&t),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let summed = self.group.all_reduce_host(host, bucket.dtype, &[bucket.numel])?;
                Tensor::from_host(summed, [bucket.numel], &bucket.device)?
            };
            for &(i, off, n) in &bucket.members {
                let g = no_grad(|| self.unflatten(&summed, i, off, n).div(world));
                out.insert(self.params[i].get(), g);
            }
        }
        Ok(out)
    }

    /// One bucket's values end to end (zeros where `value_of` has none), lazy.
    fn flatten(&self, bucket: &Bucket, value_of: impl Fn(usize) -> Option<Tensor>) -> Tensor {
        let parts: Vec<Tensor> = bucket
            .members
            .iter()
            .map(|&(i, _, n)| match value_of(i) {
                Some(v) => v.reshape([n]),
                None => Tensor::zeros([n], bucket.dtype, &bucket.device),
            })
            .collect();
        match parts.as_slice() {
            [one] => one.clone(),
            _ => Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0),
        }
    }

    /// Parameter `i`'s part of a flat bucket, in its shape (lazy).
    fn unflatten(&self, flat: &Tensor, i: usize, off: usize, n: usize) -> Tensor {
        flat.narrow(0, off, n).reshape(self.params[i].dims())
    }
}

/// Whether `bucket` is summed on its device by NCCL (a CUDA bucket in a build with the `nccl` feature) rather than
/// in host memory.
fn on_device(bucket: &Bucket) -> bool {
    #[cfg(feature = "nccl")]
    return matches!(bucket.device, Device::Cuda(_));
    #[cfg(not(feature = "nccl"))]
    {
        let _ = bucket;
        false
    }
}

/// Consecutive parameters of one dtype and device, up to `bucket_bytes` each.
fn plan_buckets(params: &[Param], bucket_bytes: usize) -> Vec<Bucket> {
    let mut buckets: Vec<Bucket> = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let t = p.get();
        let (n, dtype, device) = (t.numel(), t.dtype(), t.device());
        let bytes = |b: &Bucket| (b.numel + n) * dtype.size_of();
        match buckets.last_mut() {
            Some(b) if b.dtype == dtype && b.device == device && bytes(b) <= bucket_bytes => {
                b.members.push((i, b.numel, n));
                b.numel += n;
            }
            _ => buckets.push(Bucket { members: vec![(i, 0, n)], numel: n, dtype, device }),
        }
    }
    buckets
}

/// Words describing one parameter for the cross-rank check: dtype, rank, up to four dims, a hash of all dims.
const PARAM_WORDS: usize = 7;

fn param_words(p: &Param) -> [u64; PARAM_WORDS] {
    let t = p.get();
    let mut w = [0u64; PARAM_WORDS];
    w[0] = t.dtype().code();
    w[1] = t.rank() as u64;
    for (slot, &d) in w[2..6].iter_mut().zip(t.dims()) {
        *slot = d as u64;
    }
    w[6] = t.dims().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x0100_0000_01b3));
    w
}

fn show_param(w: &[u64]) -> String {
    let dtype = DType::from_code(w[0]).map_or("?".to_string(), |d| d.to_string());
    let shown = (w[1] as usize).min(4);
    let mut dims: Vec<String> = w[2..2 + shown].iter().map(u64::to_string).collect();
    if w[1] as usize > shown {
        dims.push("..".into());
    }
    format!("{dtype}[{}]", dims.join(", "))
}

/// The same parameter count, dtypes and shapes on every rank, or an error (the same on every rank) naming the
/// first difference.
fn check_same_params(group: &ProcessGroup, params: &[Param]) -> Result<()> {
    let fail = |message: String| Error::Distributed { op: "DataParallel::new", message };
    let counts = group.exchange(&[params.len() as u64])?;
    if let Some(r) = counts.iter().position(|&c| c != params.len() as u64) {
        return Err(fail(format!(
            "the ranks' models differ: {} parameters on rank {}, {} on rank {r}",
            params.len(),
            group.rank(),
            counts[r]
        )));
    }
    let mine: Vec<u64> = params.iter().flat_map(param_words).collect();
    let all = group.exchange(&mine)?;
    for (r, theirs) in all.chunks(mine.len().max(1)).enumerate().take(group.world_size()) {
        for (i, (a, b)) in mine.chunks(PARAM_WORDS).zip(theirs.chunks(PARAM_WORDS)).enumerate() {
            if a != b {
                return Err(fail(format!(
                    "the ranks' models differ: parameter #{i} `{}` is {} on rank {} and {} on rank {r}",
                    params[i].name(),
                    show_param(a),
                    group.rank(),
                    show_param(b)
                )));
            }
        }
    }
    Ok(())
}
