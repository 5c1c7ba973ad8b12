//! `rms_norm`, `group_norm`, `normalize`, `cosine_similarity`, `pairwise_distance` and `cdist` (`torch.nn.functional`,
//! `torch.cdist`), compositions as PyTorch's reference formulas; half inputs
//! compute in f32 and round once. `layer_norm` is in `functional.rs`.

use super::float_only;
use crate::args::fail;
use crate::tensor::Tensor;
use kiln_jit::DType;

/// `x / sqrt(mean(x², trailing dims) + eps) * weight` over the trailing `normalized_shape` dims (PyTorch's
/// `rms_norm`); `eps: None` is the machine epsilon of the input's dtype, as PyTorch's default.
#[track_caller]
pub fn rms_norm(x: &Tensor, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Tensor {
    float_only("rms_norm", x);
    let k = normalized_shape.len();
    if k == 0 || x.rank() < k || &x.dims()[x.rank() - k..] != normalized_shape {
        fail!(
            "rms_norm",
            "the input's trailing dims must be normalized_shape {normalized_shape:?}, got an input of shape {:?}",
            x.dims()
        );
    }
    if let Some(w) = weight
        && w.dims() != normalized_shape
    {
        fail!("rms_norm", "weight has shape {:?}, expected normalized_shape {normalized_shape:?}", w.dims());
    }
    let eps = eps.unwrap_or(match x.dtype() {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => f64::from(f32::EPSILON),
    });
    let axes: Vec<isize> = (1..=k as isize).map(|i| -i).collect();
    x.in_f32(|x| {
        let y = x.mul(x.square().mean(axes, true).add(eps).rsqrt());
        match weight {
            Some(w) => y.mul(w),
            None => y,
        }
    })
}

/// Group normalization (PyTorch's `group_norm`): the channels (dim 1 of `[N, C, ..]`) split into `num_groups`
/// groups, each normalized over its channels and the spatial dims by its mean and biased variance, then scaled and
/// shifted per channel by `weight` and `bias` (`[C]` each).
#[track_caller]
pub fn group_norm(x: &Tensor, num_groups: usize, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Tensor {
    float_only("group_norm", x);
    if x.rank() < 2 {
        fail!("group_norm", "expects an input [N, C, ..], got shape {:?}", x.dims());
    }
    let (n, c) = (x.dims()[0], x.dims()[1]);
    if num_groups == 0 || !c.is_multiple_of(num_groups) {
        fail!("group_norm", "{c} channels do not split into {num_groups} groups");
    }
    for (what, p) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = p
            && p.dims() != [c]
        {
            fail!("group_norm", "{what} has shape {:?}, expected [{c}] (one per channel)", p.dims());
        }
    }
    // Each channel's parameter broadcast over the spatial dims.
    let mut per_channel = vec![1usize; x.rank() - 1];
    per_channel[0] = c;
    x.in_f32(|x| {
        let groups = x.reshape(vec![n as isize, num_groups as isize, -1]);
        let mean = groups.mean(-1, true);
        let centered = groups.sub(&mean);
        let var = centered.square().mean(-1, true);
        let mut y = centered.mul(var.add(eps).rsqrt()).reshape(x.dims().to_vec());
        if let Some(w) = weight {
            y = y.mul(w.reshape(per_channel.clone()));
        }
        if let Some(b) = bias {
            y = y.add(b.reshape(per_channel.clone()));
        }
        y
    })
}

/// `x / max(‖x‖_p, eps)` along `dim` (PyTorch's `normalize`; its defaults are `p = 2`, `dim = 1`, `eps = 1e-12`).
#[track_caller]
pub fn normalize(x: &Tensor, p: f64, dim: isize, eps: f64) -> Tensor {
    float_only("normalize", x);
    x.div(x.norm(p, dim, true).clamp_min(eps))
}

/// The cosine of the angle between `x1` and `x2` along `dim` (PyTorch's `cosine_similarity`, defaults `dim = 1`,
/// `eps = 1e-8`), as PyTorch computes it: each side divided by its norm first (clamped to at least `eps`, the
/// clamp outside the gradient as PyTorch's is), then the dot product. The sides broadcast.
#[track_caller]
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: isize, eps: f64) -> Tensor {
    float_only("cosine_similarity", x1);
    float_only("cosine_similarity", x2);
    let unit = |x: &Tensor| {
        let n = x.norm(2.0, dim, true);
        // The clamp's value with the unclamped norm's gradient: `n + (max(n, eps) - n)`, the difference detached.
        x.div(n.add(n.clamp_min(eps).sub(&n).detach()))
    };
    unit(x1).mul(unit(x2)).sum(dim, false)
}

/// The `p`-norm of `x1 - x2 + eps` along the last dim (PyTorch's `pairwise_distance`, defaults `p = 2`, `eps =
/// 1e-6`, `keepdim = false`); the sides broadcast.
#[track_caller]
pub fn pairwise_distance(x1: &Tensor, x2: &Tensor, p: f64, eps: f64, keepdim: bool) -> Tensor {
    float_only("pairwise_distance", x1);
    x1.sub(x2).add(eps).norm(p, -1, keepdim)
}

/// The `p`-norm distance between each row of `x1` (`[.., P, M]`) and each row of `x2` (`[.., R, M]`): `[.., P, R]`
/// (`torch.cdist`). Computed directly, `‖x1_i - x2_j‖_p` (PyTorch's `donot_use_mm_for_euclid_dist`), so a distance of
/// 0 is exactly 0 and its gradient is `norm`'s defined 0; PyTorch's default path for p = 2 past 25 rows goes through
/// a matrix product instead and can differ from this in its last digits. Memory: `P x R x M` for the differences.
#[track_caller]
pub fn cdist(x1: &Tensor, x2: &Tensor, p: f64) -> Tensor {
    float_only("cdist", x1);
    float_only("cdist", x2);
    if x1.rank() < 2 || x2.rank() < 2 || x1.dims()[x1.rank() - 1] != x2.dims()[x2.rank() - 1] {
        fail!("cdist", "takes [.., P, M] and [.., R, M] with the same M, got {:?} and {:?}", x1.dims(), x2.dims());
    }
    if p.is_nan() || p < 0.0 {
        fail!("cdist", "p must be >= 0, got {p}");
    }
    x1.unsqueeze(-2).sub(x2.unsqueeze(-3)).norm(p, -1, false)
}
