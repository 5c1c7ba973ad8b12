//! Reverse-mode automatic differentiation on the lazy graph.
//!
//! A tensor marked `requires_grad` is a leaf. Every op built (outside `no_grad`) from a tensor that requires
//! gradients keeps its operands in `Node::grad_srcs`, even after it is realized, so `backward` can walk back from a
//! scalar loss. `backward` builds the gradients as ordinary lazy tensors with one vector-Jacobian product (VJP) per
//! primitive op, each a composition of public ops. Nothing is computed: forward, backward and an optimizer update
//! are realized later as one graph, fused and compiled into one plan. After `backward` the autograd links it
//! walked are emptied, freeing the forward graph (PyTorch's default `retain_graph=False`).
//!
//! Gradient conventions follow PyTorch: a tie in `maximum`/`minimum` sends half the gradient to each side; `max`
//! and `min` reductions share the gradient equally among tied extremes; `prod`'s gradient is the product of the
//! other elements (`g * y / x` where no input is 0); `pow`'s is masked where PyTorch masks it (a zero exponent, a
//! zero base); `abs` has gradient 0 at 0; comparisons, casts to non-float, and integer tensors carry no gradient.
//! A composite whose own rule is cheaper than its parts', or defined where theirs is not (`softmax`, `sigmoid`,
//! `logit`), gives it with [`unary_with_rule`].

use crate::error::{Error, Result};
use crate::tensor::{Node, Srcs, Tensor};
use kiln_jit::{BinaryOp, DType, Op, ReduceOp, UnaryOp};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    /// Nodes the last `backward` on this thread walked: the next one's initial capacities.
    static LAST_WALK: Cell<usize> = const { Cell::new(0) };
}

/// A node's own vector-Jacobian product (`Tensor::with_grad_fn`): given the node's gradient, the node itself (its
/// value, for a rule written in terms of the output: read where the forward stored it) and its autograd links, the
/// gradient of link `i`, or `None` for none. Values it needs beyond these are links too (without gradients of their
/// own), not captures: `backward` frees the links, and a capture would hold them (a weight's buffer, which an
/// optimizer then could not update in place) for as long as the node lives.
pub(crate) type GradFn = Arc<dyn Fn(&Tensor, &Tensor, &[Tensor], usize) -> Option<Tensor> + Send + Sync>;

/// `forward(x)`, differentiated by `rule(g, y, x)` (the output's gradient, the output as the forward stored it,
/// the input; each detached, in f32 for a half input, else in its dtype) instead of through `forward`'s ops, the
/// result rounded to `x`'s dtype: a unary composite with PyTorch's own vector-Jacobian product (PyTorch's
/// `autograd.Function`), where the composition's is costlier or not defined (`0 * inf`). Without gradient
/// recording, or where `x` needs none, `forward(x)` alone.
pub(crate) fn unary_with_rule(
    x: &Tensor,
    forward: impl FnOnce(&Tensor) -> Tensor,
    rule: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor + Send + Sync + 'static,
) -> Tensor {
    if !is_grad_enabled() || !x.is_requires_grad() {
        return forward(x);
    }
    let at = if x.dtype().is_half() { DType::F32 } else { x.dtype() };
    let grad: GradFn = Arc::new(move |g: &Tensor, y: &Tensor, links: &[Tensor], _| {
        let x = &links[0];
        let [g, y, xd] = [g.clone(), y.detach(), x.detach()].map(|t| t.to_dtype(at));
        Some(rule(&g, &y, &xd).to_dtype(x.dtype()))
    });
    forward(&x.detach()).with_grad_fn(smallvec::smallvec![x.clone()], grad)
}

/// Whether ops on this thread record autograd links.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` with gradient recording off on this thread (`torch.no_grad()`).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    crate::thread_flag::with_flag(&GRAD_ENABLED, false, f)
}

/// Gradients of one `backward` call, looked up by the leaf tensor they belong to.
#[derive(Default)]
pub struct Gradients {
    /// Leaf node address -> (the leaf, keeping the address valid; its gradient).
    map: FxHashMap<*const Node, (Tensor, Tensor)>,
}

// SAFETY: the raw pointers are only used as identities of nodes that the map itself keeps alive (the `Tensor` next
// to each key); they are never dereferenced.
unsafe impl Send for Gradients {}
// SAFETY: as above; shared access only reads the map.
unsafe impl Sync for Gradients {}

impl Gradients {
    /// The gradient of the loss with respect to `leaf`, if `leaf` requires gradients and the loss depends on it.
    pub fn get(&self, leaf: &Tensor) -> Option<&Tensor> {
        self.map.get(&Arc::as_ptr(&leaf.node)).map(|(_, g)| g)
    }

    /// Every (leaf, gradient) pair.
    pub fn iter(&self) -> impl Iterator<Item = (&Tensor, &Tensor)> {
        self.map.values().map(|(l, g)| (l, g))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Sets the gradient of `leaf` (gradient accumulation builds its sums this way).
    pub(crate) fn insert(&mut self, leaf: Tensor, grad: Tensor) {
        self.map.insert(Arc::as_ptr(&leaf.node), (leaf, grad));
    }

    /// Replaces the gradient of `leaf` (if it has one) by `f` of it: gradient clipping.
    pub(crate) fn update(&mut self, leaf: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) {
        if let Some((_, g)) = self.map.get_mut(&Arc::as_ptr(&leaf.node)) {
            *g = f(g);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Tensor {
    /// Marks this tensor as a leaf whose gradient `backward` reports, and returns it. Only float tensors can.
    #[track_caller]
    pub fn requires_grad(self) -> Tensor {
        if !self.dtype().is_float() {
            crate::args::fail!("requires_grad", "only float tensors have gradients, not {}", self.dtype());
        }
        self.node.leaf_grad.store(true, Ordering::Relaxed);
        self
    }

    /// Whether gradients flow to or through this tensor.
    pub fn is_requires_grad(&self) -> bool {
        self.node.leaf_grad.load(Ordering::Relaxed) || self.node.grad_srcs.is_some()
    }

    /// The same values with no autograd history: gradients do not flow through the result. A realized tensor
    /// shares its buffer; a lazy one becomes an identity node outside autograd.
    pub fn detach(&self) -> Tensor {
        if let crate::tensor::State::Realized(b) = &*self.node.state.lock() {
            return Tensor::from_buffer(b.clone(), self.shape().clone(), self.device());
        }
        no_grad(|| Tensor::from_op(Op::Reshape, smallvec::smallvec![self.clone()], self.shape().clone(), self.dtype()))
    }

    /// Gradients of this scalar with respect to every leaf it depends on that requires gradients, as lazy
    /// tensors. Frees the autograd graph it walks: a second `backward` through the same nodes is an error (as
    /// PyTorch's without `retain_graph`).
    pub fn backward(&self) -> Result<Gradients> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward needs a one-element loss, got shape {:?}; reduce it first (e.g. sum_all())",
                self.dims()
            )));
        }
        if !self.is_requires_grad() {
            return Err(Error::Autograd(
                "the loss does not depend on any tensor that requires gradients (mark parameters with requires_grad())"
                    .into(),
            ));
        }
        no_grad(|| self.backward_inner())
    }

    fn backward_inner(&self) -> Result<Gradients> {
        // Post-order over autograd links (operands before users), iteratively. Operand lists are inline (`Srcs`)
        // and the maps sized for a typical step up front: a training step walks this every iteration, and a
        // `Vec` per node plus the maps' regrowth were ~15% of recording an MLP step.
        // Sized for the last walk on this thread: a training step walks as many nodes every time (4000 for a small
        // LSTM), and growing the maps and the order from 64 rehashed them six times.
        let hint = LAST_WALK.get().max(64);
        let mut order: Vec<(Tensor, Srcs)> = Vec::with_capacity(hint);
        let mut seen: FxHashSet<*const Node> = FxHashSet::with_capacity_and_hasher(hint, Default::default());
        let mut stack: Vec<(Tensor, Option<Srcs>, usize)> = vec![(self.clone(), None, 0)];
        seen.insert(Arc::as_ptr(&self.node));
        while let Some((t, srcs, next)) = stack.last_mut() {
            if srcs.is_none() {
                // Taken, not cloned: the walk frees the forward graph anyway (below), and each clone and later drop
                // of an operand handle is a locked update of its count.
                let links = t.node.grad_srcs.as_ref().map_or(Srcs::new(), |g| std::mem::take(&mut *g.lock()));
                if t.node.grad_srcs.is_some() && links.is_empty() && t.node.op.arity() > 0 {
                    return Err(Error::Autograd(format!(
                        "the graph through this {} node was freed by an earlier backward; build the forward again",
                        t.node.op
                    )));
                }
                *srcs = Some(links);
            }
            let s = srcs.as_ref().expect("read");
            if *next < s.len() {
                let child = &s[*next];
                *next += 1;
                // Cloned only when walked into: an operand seen before (a shared weight) or without a gradient
                // costs no update of its count.
                let walk = child.is_requires_grad() && seen.insert(Arc::as_ptr(&child.node));
                if let Some(child) = walk.then(|| child.clone()) {
                    stack.push((child, None, 0));
                }
                continue;
            }
            let (t, srcs, _) = stack.pop().expect("frame");
            order.push((t, srcs.expect("read")));
        }

        LAST_WALK.set(order.len());
        let mut grads: FxHashMap<*const Node, Tensor> = FxHashMap::with_capacity_and_hasher(hint, Default::default());
        grads.insert(Arc::as_ptr(&self.node), self.ones_like());
        let mut out = Gradients::default();
        for (t, srcs) in order.iter().rev() {
            let Some(g) = grads.remove(&Arc::as_ptr(&t.node)) else { continue };
            if t.node.leaf_grad.load(Ordering::Relaxed) {
                out.map.insert(Arc::as_ptr(&t.node), (t.clone(), g.clone()));
            }
            if srcs.is_empty() {
                continue;
            }
            // `x * x` (`square`): one gradient `(g * x) * 2` for the operand both sides share, bit for bit the sum
            // `g * x + g * x` of the two operands' rules (doubling is exact), one node less and one op less.
            let squared = matches!(t.node.op, Op::Binary(BinaryOp::Mul)) && Arc::ptr_eq(&srcs[0].node, &srcs[1].node);
            for (i, src) in srcs.iter().enumerate() {
                if !src.is_requires_grad() || !src.dtype().is_float() || squared && i == 1 {
                    continue;
                }
                let gi = match &t.node.grad_fn {
                    Some(f) => f(&g, t, srcs, i),
                    None if squared => Some(g.mul(src).mul(2.0)),
                    None => vjp(t, srcs, i, &g),
                };
                let Some(gi) = gi else { continue };
                debug_assert_eq!(gi.dims(), src.dims(), "vjp of {} operand {i}", t.node.op);
                let key = Arc::as_ptr(&src.node);
                let acc = match grads.remove(&key) {
                    Some(prev) => prev.add(&gi),
                    None => gi,
                };
                grads.insert(key, acc);
            }
        }
        // The forward graph is freed (its links were taken above, and drop with `order`; the nodes' lazy history is
        // unaffected).
        Ok(out)
    }
}

/// `x` converted to `d` if it is not already (masks built from comparisons are bool).
fn as_dtype(x: Tensor, d: DType) -> Tensor {
    x.to_dtype(d)
}

/// The gradient flowing to operand `i` of `y` given the gradient `g` of `y`.
fn vjp(y: &Tensor, srcs: &[Tensor], i: usize, g: &Tensor) -> Option<Tensor> {
    let d = y.dtype();
    let x = &srcs[i];
    Some(match &y.node.op {
        Op::Input { .. } | Op::Const(_) | Op::Iota { .. } | Op::Rand { .. } => return None,
        Op::Unary(u) => match u {
            UnaryOp::Neg => g.neg(),
            UnaryOp::Exp => g.mul(y),
            UnaryOp::Log => g.div(x),
            UnaryOp::Sin => g.mul(x.cos()),
            UnaryOp::Cos => g.mul(x.sin()).neg(),
            UnaryOp::Tanh => g.mul(y.square().rsub(1.0)),
            UnaryOp::Sqrt => g.mul(0.5).div(y),
            UnaryOp::Recip => g.mul(y.square()).neg(),
            UnaryOp::Abs => g.mul(as_dtype(x.gt(0.0), d).sub(as_dtype(x.lt(0.0), d))),
            UnaryOp::Not => return None,
            // Piecewise constant: zero wherever the derivative exists, as PyTorch's.
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc => g.zeros_like(),
            UnaryOp::Log1p => g.div(x.add(1.0)),
            UnaryOp::Expm1 => g.mul(y.add(1.0)),
        },
        Op::Binary(b) => {
            let (a, c) = (&srcs[0], &srcs[1]);
            match (b, i) {
                (BinaryOp::Add, _) => g.clone(),
                (BinaryOp::Sub, 0) => g.clone(),
                (BinaryOp::Sub, _) => g.neg(),
                (BinaryOp::Mul, 0) => g.mul(c),
                (BinaryOp::Mul, _) => g.mul(a),
                (BinaryOp::Div, 0) => g.div(c),
                (BinaryOp::Div, _) => g.mul(y).div(c).neg(),
                (BinaryOp::Max | BinaryOp::Min, _) => {
                    let (me, other) = if i == 0 { (a, c) } else { (c, a) };
                    let wins = if *b == BinaryOp::Max { me.gt(other) } else { me.lt(other) };
                    let share = as_dtype(wins, d).add(as_dtype(me.eq(other), d).mul(0.5));
                    g.mul(share)
                }
                // fmod(a, c) = a - trunc(a / c) c, the quotient piecewise constant (PyTorch's rule).
                (BinaryOp::Rem, 0) => g.clone(),
                (BinaryOp::Rem, _) => g.mul(a.div(c).trunc()).neg(),
                // PyTorch's masks: no gradient to the base where the exponent is 0 (`0 * 0^-1` would be NaN at a
                // zero base), none to the exponent where the base is 0 and the exponent not negative (`0 * log 0`).
                (BinaryOp::Pow, 0) => c.eq(0.0).where_(0.0, g.mul(c).mul(a.pow(c.sub(1.0)))),
                (BinaryOp::Pow, _) => a.eq(0.0).logical_and(c.ge(0.0)).where_(0.0, g.mul(y).mul(a.log())),
                _ => return None, // comparisons and logical ops
            }
        }
        Op::Where => match i {
            0 => return None,
            1 => srcs[0].where_(g, 0.0),
            _ => srcs[0].where_(0.0, g),
        },
        Op::Cast => g.to_dtype(x.dtype()),
        Op::Contiguous => g.clone(),
        Op::Reshape => g.reshape(x.dims().to_vec()),
        Op::Permute(p) => {
            let mut inverse = vec![0usize; p.len()];
            for (k, &pk) in p.iter().enumerate() {
                inverse[pk] = k;
            }
            g.permute_resolved(inverse, &[])
        }
        Op::Expand => {
            let axes: Vec<usize> = (0..x.rank()).filter(|&a| x.dims()[a] == 1 && y.dims()[a] != 1).collect();
            if axes.is_empty() { g.clone() } else { g.sum(axes, true) }
        }
        Op::Reduce { op, axes } => {
            let ge = g.expand_to("backward", x.dims());
            match op {
                ReduceOp::Sum => ge,
                // The product of the others: `y / x` where `x` is not 0 (PyTorch's rule), and at a zero the
                // product of the non-zero others where it is its reduction's only zero, else 0; `y / x` alone was
                // `0 / 0 = NaN` there.
                ReduceOp::Prod => {
                    let zero = x.eq(0.0);
                    let spread = |t: Tensor| t.expand_to("backward", x.dims());
                    let others = spread(zero.where_(1.0, x).prod(axes.clone(), true));
                    let zeros = spread(as_dtype(zero.clone(), d).sum(axes.clone(), true));
                    let at_zero = zeros.eq(1.0).where_(others, 0.0);
                    ge.mul(zero.where_(at_zero, spread(y.clone()).div(x)))
                }
                ReduceOp::Max | ReduceOp::Min => {
                    let mask = as_dtype(x.eq(y.expand_to("backward", x.dims())), d);
                    let count = mask.sum(axes.clone(), true).expand_to("backward", x.dims());
                    ge.mul(mask).div(count)
                }
            }
        }
        Op::Slice(spec) => slice_vjp(g, x.dims(), spec),
        // Each tap of the windows is a strided slice of the source; overlapping windows add their gradients.
        Op::Unfold { axis, step, dilation, size } => {
            let last = g.rank() as isize - 1;
            let tap = |i: usize| {
                let mut spec = vec![(0usize, 1isize); x.rank()];
                spec[*axis] = (i * dilation, *step as isize);
                slice_vjp(&g.narrow(last, i, 1).squeeze(last), x.dims(), &spec)
            };
            // The graph check keeps `size >= 1`. With a step past 1 the sum is stored: read through the taps of
            // another unfold's gradient (a convolution's two spatial dims), its taps' zero interleaving (a reshape
            // each) composes into one another's index expressions (3 x 3 taps at stride 2 made a kernel of 8 MB of
            // kernel IR that compiled for seconds). At step 1 the taps are pads, and a convolution's input
            // gradient is one kernel adding its KH x KW shifted reads, in the input's layout.
            let sum = (1..*size).fold(tap(0), |sum, i| sum.add(tap(i)));
            if *step > 1 { sum.contiguous() } else { sum }
        }
        Op::Pad { pads, .. } => {
            let mut out = g.clone();
            for (a, (&(before, _), &n)) in pads.iter().zip(x.dims()).enumerate() {
                out = out.narrow(a as isize, before, n);
            }
            out
        }
        // The source's gradient: `g` added back at the gathered positions (the index has none).
        Op::Gather { axis } if i == 0 => crate::ops::scatter_sum(g, *axis, &srcs[1], x.dims()[*axis]),
        Op::Gather { .. } => return None,
        // Each value's gradient is the output gradient at the row its index named.
        Op::ScatterRows { .. } if i == 1 => g.gather_prim(0, &srcs[0].expand_to("scatter_add", x.dims())),
        Op::ScatterRows { .. } => return None,
        // Indices: piecewise constant in the values (a sort's values get theirs through the gather that picks them).
        Op::SortRows { .. } => return None,
        Op::Linalg(l) => return crate::linalg::vjp(*l, y, srcs, i, g),
        Op::Matmul => {
            let (a, b) = (&srcs[0], &srcs[1]);
            if i == 0 { g.matmul(&b.transpose(-1, -2)) } else { a.transpose(-1, -2).matmul(g) }
        }
    })
}

/// Scatters `g` (the gradient of a strided slice) back into a zero tensor of the source's shape.
fn slice_vjp(g: &Tensor, src: &[usize], spec: &[(usize, isize)]) -> Tensor {
    let mut out = g.clone();
    for (a, (&(start, step), &n)) in spec.iter().zip(src).enumerate() {
        let m = out.dims()[a];
        if m == n && start == 0 && step == 1 {
            continue;
        }
        if m == 0 {
            let mut dims = out.dims().to_vec();
            dims[a] = n;
            out = Tensor::zeros(dims, out.dtype(), &out.device());
            continue;
        }
        // Element j of this dim came from source index start + j * step. Make the step positive first.
        let (first, s) = if step < 0 {
            out = out.flip(a as isize);
            (start as isize + step * (m as isize - 1), (-step) as usize)
        } else {
            (start as isize, step as usize)
        };
        let first = first as usize;
        if s > 1 {
            // Interleave s - 1 zeros after each element: [.., m, ..] -> [.., m, s, ..] -> [.., m * s, ..].
            let widened = out.unsqueeze(a as isize + 1);
            let mut pads = vec![(0, 0); widened.rank()];
            pads[a + 1] = (0, s - 1);
            let mut dims = out.dims().to_vec();
            dims[a] = m * s;
            out = widened.pad_prim(pads, kiln_jit::Scalar::Float(0.0)).reshape(dims);
        }
        let have = out.dims()[a];
        let want = n - first;
        if have > want {
            out = out.narrow(a as isize, 0, want);
        }
        let mut pads = vec![(0, 0); out.rank()];
        pads[a] = (first, want - out.dims()[a].min(want));
        out = out.pad_prim(pads, kiln_jit::Scalar::Float(0.0));
    }
    out
}
