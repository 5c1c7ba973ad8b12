//! Recurrent layers (`torch.nn.LSTM`, `torch.nn.GRU`): stacked layers over a sequence, with PyTorch's gate order,
//! parameter names (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`, ...), initialization (every
//! parameter uniform in `± 1 / sqrt(hidden_size)`) and input layouts (`[T, N, I]`, `[N, T, I]` with `batch_first`,
//! or unbatched `[T, I]`).
//!
//! A composition like everything in `nn`: each layer projects the whole sequence's inputs in one GEMM
//! (`[T * N, I] x [I, G * H]`), then runs the recurrence a step at a time, a `[N, H] x [H, G * H]` product and the
//! gates' elementwise code per step, all recorded into one lazy graph (the step loop unrolls; the plan cache keys
//! it by the sequence length, so a fixed length compiles once). The recurrent weight's gradient is one product over
//! every step's (`direction`), not a sum of one per step. A bidirectional layer runs a second set of
//! weights (`..._reverse`) from the last step to the first and concatenates both directions' outputs, as PyTorch.
//! `dropout` zeroes the outputs between layers in training mode (`Module::train`), as PyTorch. Not done:
//! `proj_size`, packed sequences.

use super::{Module, Param, init};
use crate::args::fail;
use crate::device::Device;
use crate::random::{Generator, default_generator};
use crate::tensor::{Tensor, WeakTensor};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// PyTorch's keyword arguments of `nn.LSTM` and `nn.GRU` that kiln has (`Default`: one layer, biases, `[T, N, I]`,
/// one direction, no dropout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RnnOptions {
    pub num_layers: usize,
    pub bias: bool,
    /// Inputs and outputs are `[N, T, ..]` instead of `[T, N, ..]` (the states stay `[layers, N, H]`).
    pub batch_first: bool,
    /// Each layer also runs from the last step to the first with its own weights: outputs `[.., 2 * H]`, states
    /// `[2 * layers, N, H]` (layer 0 forward, layer 0 backward, layer 1 forward, ...).
    pub bidirectional: bool,
    /// The probability of zeroing each output of every layer but the last, in training mode (the rest scaled by
    /// `1 / (1 - p)`), as `functional::dropout`.
    pub dropout: f64,
}

impl Default for RnnOptions {
    fn default() -> Self {
        RnnOptions { num_layers: 1, bias: true, batch_first: false, bidirectional: false, dropout: 0.0 }
    }
}

/// Which recurrence: the gates a layer's weights hold, in PyTorch's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    /// Input, forget, cell and output gates (`4 * H` rows).
    Lstm,
    /// Reset, update and new gates (`3 * H` rows).
    Gru,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
        }
    }
}

/// One layer's parameters in one direction.
#[derive(Clone, Debug)]
struct Layer {
    weight_ih: Param,
    weight_hh: Param,
    bias_ih: Option<Param>,
    bias_hh: Option<Param>,
}

/// The layers of an LSTM or GRU and how they read their input.
#[derive(Debug)]
struct Stack {
    cell: Cell,
    input_size: usize,
    hidden_size: usize,
    opts: RnnOptions,
    /// Layer by layer, each direction's parameters (forward first).
    layers: Vec<Layer>,
    /// Training mode (`Module::train`): whether `dropout` applies.
    training: AtomicBool,
}

impl Clone for Stack {
    /// The same parameters (shared handles, as every module's clone) and the same mode, which the clone then sets on
    /// its own.
    fn clone(&self) -> Self {
        Stack {
            cell: self.cell,
            input_size: self.input_size,
            hidden_size: self.hidden_size,
            opts: self.opts,
            layers: self.layers.clone(),
            training: AtomicBool::new(self.training.load(Ordering::Relaxed)),
        }
    }
}

impl Stack {
    #[track_caller]
    fn new(
        cell: Cell,
        input_size: usize,
        hidden_size: usize,
        opts: RnnOptions,
        device: &Device,
        g: &Generator,
    ) -> Self {
        if !(0.0..=1.0).contains(&opts.dropout) {
            fail!(cell.name(), "dropout has to be between 0 and 1, but got {}", opts.dropout);
        }
        if hidden_size == 0 || opts.num_layers == 0 {
            fail!(
                cell.name(),
                "hidden_size and num_layers must be at least 1, got {hidden_size} and {}",
                opts.num_layers
            );
        }
        let bound = 1.0 / (hidden_size as f64).sqrt();
        let rows = cell.gates() * hidden_size;
        let uniform =
            |name: String, shape: Vec<usize>| Param::new(name, init::uniform_with(shape, -bound, bound, device, g));
        let dirs = if opts.bidirectional { 2 } else { 1 };
        let layers = (0..opts.num_layers * dirs)
            .map(|i| {
                let (l, sfx) = (i / dirs, if i % dirs == 1 { "_reverse" } else { "" });
                let fan = if l == 0 { input_size } else { hidden_size * dirs };
                Layer {
                    weight_ih: uniform(format!("weight_ih_l{l}{sfx}"), vec![rows, fan]),
                    weight_hh: uniform(format!("weight_hh_l{l}{sfx}"), vec![rows, hidden_size]),
                    bias_ih: opts.bias.then(|| uniform(format!("bias_ih_l{l}{sfx}"), vec![rows])),
                    bias_hh: opts.bias.then(|| uniform(format!("bias_hh_l{l}{sfx}"), vec![rows])),
                }
            })
            .collect();
        Stack { cell, input_size, hidden_size, opts, layers, training: AtomicBool::new(true) }
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        for l in &self.layers {
            for p in
                [Some(&l.weight_ih), Some(&l.weight_hh), l.bias_ih.as_ref(), l.bias_hh.as_ref()].into_iter().flatten()
            {
                out.push((p.name().to_string(), p.clone()));
            }
        }
        out
    }

    /// `x` as `[T, N, I]` (and whether it was unbatched), checked.
    #[track_caller]
    fn sequence_first(&self, x: &Tensor) -> (Tensor, bool) {
        let name = self.cell.name();
        let ok = matches!(x.rank(), 2 | 3) && x.dims()[x.rank() - 1] == self.input_size && x.dtype().is_float();
        if !ok {
            fail!(
                name,
                "expects a float input [T, N, {i}] ([N, T, {i}] with batch_first) or [T, {i}], got {}{:?}",
                x.dtype(),
                x.dims(),
                i = self.input_size
            );
        }
        match (x.rank(), self.opts.batch_first) {
            (2, _) => (x.unsqueeze(1), true),
            (_, true) => (x.transpose(0, 1), false),
            (_, false) => (x.clone(), false),
        }
    }

    /// A state given by the caller as `[layers, N, H]` (or `[layers, H]` for an unbatched input), checked, or
    /// zeros.
    #[track_caller]
    fn initial(&self, state: Option<&Tensor>, what: &str, batch: usize, unbatched: bool, like: &Tensor) -> Tensor {
        let (layers, h) = (self.layers.len(), self.hidden_size);
        match state {
            None => Tensor::zeros([layers, batch, h], like.dtype(), &like.device()),
            Some(s) => {
                let want: Vec<usize> = if unbatched { vec![layers, h] } else { vec![layers, batch, h] };
                if s.dims() != want.as_slice() {
                    fail!(self.cell.name(), "{what} must be {want:?} for this input, got {:?}", s.dims());
                }
                if unbatched { s.unsqueeze(1) } else { s.clone() }
            }
        }
    }

    /// Runs every layer over `x`: the last layer's outputs and each layer's final states (`h`, and `c` for an
    /// LSTM), in the caller's layout.
    #[track_caller]
    fn run(&self, x: &Tensor, h0: Option<&Tensor>, c0: Option<&Tensor>) -> (Tensor, Tensor, Option<Tensor>) {
        let (mut seq, unbatched) = self.sequence_first(x);
        let (t, n) = (seq.dims()[0], seq.dims()[1]);
        if t == 0 {
            fail!(self.cell.name(), "the sequence is empty");
        }
        let h0 = self.initial(h0, "h_0", n, unbatched, &seq);
        let c0 = (self.cell == Cell::Lstm).then(|| self.initial(c0, "c_0", n, unbatched, &seq));
        let (mut hn, mut cn) = (Vec::new(), Vec::new());
        let dirs = if self.opts.bidirectional { 2 } else { 1 };
        for pair in self.layers.chunks(dirs) {
            let mut outs = Vec::with_capacity(dirs);
            for (d, layer) in pair.iter().enumerate() {
                let i = hn.len();
                let c = c0.as_ref().map(|c| c.narrow(0, i, 1).squeeze(0));
                let (out, h, c) = self.direction(layer, &seq, h0.narrow(0, i, 1).squeeze(0), c, d == 1);
                outs.push(out);
                hn.push(h);
                cn.extend(c);
            }
            let refs: Vec<&Tensor> = outs.iter().collect();
            seq = if dirs == 1 { outs[0].clone() } else { Tensor::cat(&refs, 2) };
            let p = self.opts.dropout;
            if p > 0.0 && hn.len() < self.layers.len() {
                seq = super::functional::dropout(&seq, p, self.training.load(Ordering::Relaxed));
            }
        }
        let stack = |v: &[Tensor]| {
            let refs: Vec<&Tensor> = v.iter().collect();
            let s = Tensor::stack(&refs, 0);
            if unbatched { s.squeeze(1) } else { s }
        };
        let out = match (unbatched, self.opts.batch_first) {
            (true, _) => seq.squeeze(1),
            (false, true) => seq.transpose(0, 1),
            (false, false) => seq,
        };
        let c = (!cn.is_empty()).then(|| stack(&cn));
        (out, stack(&hn), c)
    }

    /// One layer in one direction over `seq` (`[T, N, I]`, from step `T - 1` down to 0 when `reverse`) from the
    /// states `h` and `c`: its outputs `[T, N, H]` in step order and its final states.
    fn direction(
        &self,
        layer: &Layer,
        seq: &Tensor,
        mut h: Tensor,
        mut c: Option<Tensor>,
        reverse: bool,
    ) -> (Tensor, Tensor, Option<Tensor>) {
        let (t, n, hs) = (seq.dims()[0], seq.dims()[1], self.hidden_size);
        // Every step's input projection in one GEMM: [T * N, I] x [I, G * H].
        let rows = self.cell.gates() * hs;
        let wi = layer.weight_ih.get();
        let mut xi = seq.reshape(vec![t * n, wi.dims()[1]]).matmul(&wi.transpose(0, 1));
        if let Some(b) = &layer.bias_ih {
            xi = xi.add(b.get());
        }
        let mut xi = xi.reshape(vec![t, n, rows]);
        // The recurrent weight's and bias's gradients are sums over the steps, `sum_s dhh_s^T h_prev(s)` and
        // `sum_s dhh_s` (`hh` the step's `h W_hh^T + b_hh`): one product over every step at once, computed from the
        // stacked `dhh`, where through each step's own product they were T small GEMMs, T reductions and their
        // nodes. So the steps multiply by the weight without its gradient, and a collector `[T, N, G * H]` whose
        // gradient is the stacked `dhh` sends it to the weight (and the bias): for an LSTM `xi` itself (each step
        // adds `hh` to its slice of `xi` whole, so their gradients are one; the bias is then added to `xi` once,
        // not at each step), for a GRU zeros each step adds to `hh` (its new gate multiplies `hh`'s third part by
        // `r` before adding `xi`'s).
        let wh = layer.weight_hh.get();
        let bh = layer.bias_hh.as_ref().map(Param::get);
        let lstm = self.cell == Cell::Lstm;
        if lstm && let Some(b) = &bh {
            xi = xi.add(b);
        }
        // The steps' own bias: a GRU's, without its gradient (the collector sends it).
        let step_bias = bh.as_ref().filter(|_| !lstm).map(Tensor::detach);
        let wht = wh.detach().t();
        // The state each step starts from, in step order, once the loop has run. Weak handles: the states are
        // recorded after the collector, so strong ones would make a cycle through its gradient function that no
        // handle of the caller's frees. While `backward` runs they are alive: each is an operand of its step's
        // product, whose links the walk holds until it ends.
        let prev_states: Arc<Mutex<Vec<WeakTensor>>> = Arc::new(Mutex::new(Vec::new()));
        // The collector's links: for an LSTM `xi` (its gradient passed on) and the weight; for a GRU the weight and
        // the bias.
        let collect = {
            let prev_states = prev_states.clone();
            move |g: &Tensor, i: usize| -> Option<Tensor> {
                let dhh = g.reshape(vec![t * n, rows]);
                match (lstm, i) {
                    (true, 0) => Some(g.clone()),
                    (true, _) | (false, 0) => {
                        let prev: Vec<Tensor> = prev_states
                            .lock()
                            .iter()
                            .map(|w| w.upgrade().map(|h| h.detach()))
                            .collect::<Option<_>>()
                            .unwrap_or_else(|| unreachable!("a step's state outlives the backward walk"));
                        let refs: Vec<&Tensor> = prev.iter().collect();
                        Some(dhh.transpose(0, 1).matmul(&Tensor::stack(&refs, 0).reshape(vec![t * n, hs])))
                    }
                    (false, _) => Some(dhh.sum(0, false)),
                }
            }
        };
        let grad: crate::autograd::GradFn = Arc::new(move |g: &Tensor, _: &Tensor, _: &[Tensor], i| collect(g, i));
        let (xi, zeros) = if lstm {
            let links: crate::tensor::Srcs = smallvec::smallvec![xi.clone(), wh.clone()];
            (xi.with_grad_fn(links, grad), None)
        } else {
            let mut links: crate::tensor::Srcs = smallvec::smallvec![wh.clone()];
            links.extend(bh.iter().cloned());
            let zeros = Tensor::zeros([t, n, rows], xi.dtype(), &xi.device());
            (xi, Some(zeros.with_grad_fn(links, grad)))
        };
        let mut prevs: Vec<Option<WeakTensor>> = vec![None; t];
        let mut outs = Vec::with_capacity(t);
        for step in 0..t {
            let s = if reverse { t - 1 - step } else { step };
            prevs[s] = Some(h.downgrade());
            let mut hh = h.matmul(&wht);
            if let Some(b) = &step_bias {
                hh = hh.add(b);
            }
            if let Some(z) = &zeros {
                hh = hh.add(z.narrow(0, s, 1).squeeze(0));
            }
            let xs = xi.narrow(0, s, 1).squeeze(0);
            // A gate as a slice of a middle dim of `[N, G, H]`, not of the `G * H` columns: its gradient puts the
            // gates back into one tensor along an outer loop, a kernel the CPU runs by regions of whole gates
            // (`kernel::regions`), where a cut along the columns would leave it a masked 4-lane kernel.
            let by_gate = |v: &Tensor| v.reshape(vec![n, self.cell.gates(), hs]);
            let gate = |v: &Tensor, i: usize| v.narrow(1, i, 1).squeeze(1);
            match (self.cell, &c) {
                (Cell::Lstm, Some(prev)) => {
                    let z = by_gate(&xs.add(&hh));
                    // One sigmoid over all four gates, `g`'s included and unused: one kernel and one gradient
                    // where three would be, and on gates this narrow the launches are what a step costs.
                    let s = z.sigmoid();
                    let (i, f, o) = (gate(&s, 0), gate(&s, 1), gate(&s, 3));
                    let g = gate(&z, 2).tanh();
                    let next = f.mul(prev).add(i.mul(&g));
                    h = o.mul(next.tanh());
                    c = Some(next);
                }
                _ => {
                    let (xs, hh) = (by_gate(&xs), by_gate(&hh));
                    // `r` and `z` under one sigmoid, as the LSTM's gates.
                    let rz = xs.narrow(1, 0, 2).add(hh.narrow(1, 0, 2)).sigmoid();
                    let (r, z) = (gate(&rz, 0), gate(&rz, 1));
                    let new = gate(&xs, 2).add(r.mul(gate(&hh, 2))).tanh();
                    // (1 - z) * n + z * h, as PyTorch writes it.
                    h = z.neg().add(1.0).mul(&new).add(z.mul(&h));
                }
            }
            outs.push(h.clone());
        }
        *prev_states.lock() = prevs.into_iter().flatten().collect();
        if reverse {
            outs.reverse();
        }
        let refs: Vec<&Tensor> = outs.iter().collect();
        (Tensor::stack(&refs, 0), h, c)
    }
}

/// A stacked LSTM (`torch.nn.LSTM`): `i, f, g, o` gates, `c' = f c + i g`, `h' = o tanh(c')`.
#[derive(Clone, Debug)]
pub struct LSTM {
    stack: Stack,
}

impl LSTM {
    /// `LSTM(input_size, hidden_size, **opts)`, f32, drawn from the default generator.
    #[track_caller]
    pub fn new(input_size: usize, hidden_size: usize, opts: RnnOptions, device: &Device) -> LSTM {
        LSTM::new_with(input_size, hidden_size, opts, device, &default_generator())
    }

    /// `new` drawing the initial values from `generator`.
    #[track_caller]
    pub fn new_with(input_size: usize, hidden_size: usize, opts: RnnOptions, device: &Device, g: &Generator) -> LSTM {
        LSTM { stack: Stack::new(Cell::Lstm, input_size, hidden_size, opts, device, g) }
    }

    /// The outputs (the last layer's `h` at every step) and the final `(h_n, c_n)`, each `[layers, N, H]`, from
    /// initial states `(h_0, c_0)` (zeros where `None`), as PyTorch's `lstm(x, (h_0, c_0))`.
    #[track_caller]
    pub fn forward_with(&self, x: &Tensor, state: Option<(&Tensor, &Tensor)>) -> (Tensor, (Tensor, Tensor)) {
        let (h0, c0) = state.map_or((None, None), |(h, c)| (Some(h), Some(c)));
        let (out, h, c) = self.stack.run(x, h0, c0);
        (out, (h, c.expect("an LSTM has a cell state")))
    }
}

impl Module for LSTM {
    /// The outputs from zero states (`lstm(x)[0]`).
    fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_with(x, None).0
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        self.stack.named_params()
    }

    fn train(&self, mode: bool) {
        self.stack.training.store(mode, Ordering::Relaxed);
    }
}

/// A stacked GRU (`torch.nn.GRU`): `r, z, n` gates, `n = tanh(W_in x + b_in + r (W_hn h + b_hn))`,
/// `h' = (1 - z) n + z h`.
#[derive(Clone, Debug)]
pub struct GRU {
    stack: Stack,
}

impl GRU {
    /// `GRU(input_size, hidden_size, **opts)`, f32, drawn from the default generator.
    #[track_caller]
    pub fn new(input_size: usize, hidden_size: usize, opts: RnnOptions, device: &Device) -> GRU {
        GRU::new_with(input_size, hidden_size, opts, device, &default_generator())
    }

    /// `new` drawing the initial values from `generator`.
    #[track_caller]
    pub fn new_with(input_size: usize, hidden_size: usize, opts: RnnOptions, device: &Device, g: &Generator) -> GRU {
        GRU { stack: Stack::new(Cell::Gru, input_size, hidden_size, opts, device, g) }
    }

    /// The outputs and the final `h_n` (`[layers, N, H]`) from `h_0` (zeros where `None`), as PyTorch's
    /// `gru(x, h_0)`.
    #[track_caller]
    pub fn forward_with(&self, x: &Tensor, h0: Option<&Tensor>) -> (Tensor, Tensor) {
        let (out, h, _) = self.stack.run(x, h0, None);
        (out, h)
    }
}

impl Module for GRU {
    /// The outputs from a zero state (`gru(x)[0]`).
    fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_with(x, None).0
    }

    fn named_params(&self) -> Vec<(String, Param)> {
        self.stack.named_params()
    }

    fn train(&self, mode: bool) {
        self.stack.training.store(mode, Ordering::Relaxed);
    }
}
