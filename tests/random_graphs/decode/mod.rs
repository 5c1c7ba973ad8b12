//! Decoding raw numbers into a program: the decoder's state and its core steps (leaves, realizations, the step
//! selector); the op families' steps are in `elementwise.rs`, `reduce.rs` and `movement.rs`.

use super::*;

mod elementwise;
mod movement;
mod reduce;

/// One raw step: a selector and five parameters. Small numbers decode to simple steps, so shrinking simplifies.
pub(super) type Raw = (u8, [u16; 5]);

pub(super) const DIMS: [usize; 16] = [1, 2, 3, 4, 5, 7, 9, 1, 2, 8, 0, 3, 13, 6, 17, 11];
pub(super) const DTYPES: [DType; 11] = [
    DType::F32,
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::Bool,
    DType::F32,
    DType::U32,
    DType::F16,
    DType::BF16,
];
pub(super) const MAX_NUMEL: usize = 256;

pub(super) fn float_sc(r: u16) -> Sc {
    Sc::F([1.0, 2.0, 0.5, -1.5, 0.0, -0.25, 3.0, -0.0][r as usize % 8])
}

pub(super) fn int_sc(r: u16) -> Sc {
    Sc::I([1, 2, -1, 3, 0, 7, -4, 200][r as usize % 8])
}

/// The dims encoded in `r` (4 bits per dim), at most `MAX_NUMEL` elements.
pub(super) fn dims_from(rank: usize, r: u16) -> Vec<usize> {
    let mut dims: Vec<usize> = (0..rank).map(|i| DIMS[(r as usize >> (4 * i)) & 15]).collect();
    while dims.iter().product::<usize>() > MAX_NUMEL {
        let i = (0..rank).max_by_key(|&i| dims[i]).expect("a dim");
        dims[i] /= 2;
    }
    dims
}

pub(super) struct Var {
    pub(super) dtype: DType,
    pub(super) dims: Vec<usize>,
    pub(super) meta: Meta,
    /// Holds a buffer when the program runs (a realized input, or realized by a `Realize` step).
    pub(super) realized: bool,
}

pub(super) struct Decoder {
    pub(super) steps: Vec<Step>,
    /// The current state of each step's value (`None` for `Realize` steps).
    pub(super) vars: Vec<Option<Var>>,
    /// Per step: the value's class when it was defined, or for `Realize`, when it was realized.
    pub(super) infos: Vec<Info>,
}

impl Decoder {
    pub(super) fn var(&self, v: usize) -> &Var {
        self.vars[v].as_ref().expect("a value")
    }

    pub(super) fn push(&mut self, step: Step, dtype: DType, dims: Vec<usize>, meta: Meta) -> usize {
        debug_assert!(fits(dtype, &meta), "generator admitted {} with {meta:?}", step.code());
        let meta = overflowed(dtype, meta);
        let realized = matches!(step, Step::Input { .. });
        self.steps.push(step);
        self.infos.push(Info { dtype, dims: dims.clone(), meta });
        self.vars.push(Some(Var { dtype, dims, meta, realized }));
        self.vars.len() - 1
    }

    /// The `r`-th most recent value satisfying `ok`.
    pub(super) fn pick(&self, r: u16, ok: impl Fn(&Var) -> bool) -> Option<usize> {
        let cands: Vec<usize> =
            (0..self.vars.len()).rev().filter(|&i| self.vars[i].as_ref().is_some_and(&ok)).collect();
        // Mostly one of the three most recent (long chains fuse into deep kernels), sometimes any.
        let r = r as usize;
        let i = if r.is_multiple_of(4) { (r / 4) % cands.len().max(1) } else { (r / 4) % cands.len().clamp(1, 3) };
        (!cands.is_empty()).then(|| cands[i])
    }

    /// Realizes `v` (checked first), so that later steps read it as an input: exact on both sides.
    pub(super) fn realize(&mut self, v: usize) {
        let var = self.vars[v].as_mut().expect("a value");
        if var.realized {
            return;
        }
        let info = Info { dtype: var.dtype, dims: var.dims.clone(), meta: var.meta };
        var.realized = true;
        var.meta = Meta { bit: true, val: true, ea: 0.0, er: 0.0, acc: false, coarse: false, ..var.meta };
        self.steps.push(Step::Realize(v));
        self.infos.push(info);
        self.vars.push(None);
    }

    /// Realizes `v` if the JIT may differ from the reference on it.
    pub(super) fn settle(&mut self, v: usize) {
        if !self.var(v).meta.bit {
            self.realize(v);
        }
    }

    /// A new leaf of `dtype` and `dims`; `r` picks a realized input or a lazy leaf, `s` the values.
    pub(super) fn leaf(&mut self, dtype: DType, dims: Vec<usize>, r: u16, s: u16) -> usize {
        let numel: usize = dims.iter().product();
        let value = match dtype {
            DType::Bool => Sc::B(s % 2 == 1),
            d if d.is_float() => float_sc(s),
            _ => int_sc(s),
        };
        let konst = Meta::exact(stored(dtype, value), stored(dtype, value), false);
        match r % 16 {
            10 => self.push(Step::Full { dtype, dims: dims.clone(), value }, dtype, dims, konst),
            11 if dtype.is_float() => {
                let normal = s % 2 == 1;
                // Box-Muller from 32-bit uniforms stays within 6.7 sigma.
                let meta = if normal { Meta::exact(-7.0, 7.0, false) } else { Meta::exact(0.0, 1.0, false) };
                self.push(Step::Rand { dtype, dims: dims.clone(), normal }, dtype, dims, meta)
            }
            12 if dtype == DType::I64 => {
                let meta = Meta::exact(0.0, numel.max(1) as f64 - 1.0, false);
                self.push(Step::Arange { n: numel, dims: dims.clone() }, dtype, dims, meta)
            }
            13 if dims.is_empty() => self.push(Step::Scalar { dtype, value }, dtype, dims, konst),
            k => {
                let data = match (dtype.is_float(), k % 5) {
                    (true, 0 | 1) => Data::Cont(-2.0, 2.0),
                    (true, 2) => Data::Grid(-2.0, 2.0),
                    (true, 3) => Data::Cont(0.25, 2.0),
                    (true, _) => Data::Specials,
                    (false, 4) if dtype == DType::U8 => Data::Cont(0.0, 255.0),
                    // Large u32 values: wrapping arithmetic, unsigned compares and conversions above 2^31.
                    (false, 4) if dtype == DType::U32 => Data::Cont(0.0, 4_294_967_295.0),
                    (false, 3) => Data::Cont(0.0, 9.0),
                    (false, _) => Data::Cont(-5.0, 5.0),
                };
                let meta = match (data, dtype) {
                    (Data::Specials, _) => Meta::exact(-2.0, 2.0, true),
                    (_, DType::Bool) => Meta::exact(0.0, 1.0, false),
                    (Data::Cont(a, b) | Data::Grid(a, b), DType::U8 | DType::U32) => Meta::exact(a.max(0.0), b, false),
                    (Data::Cont(a, b) | Data::Grid(a, b), _) => Meta::exact(a, b, false),
                };
                self.push(Step::Input { dtype, dims: dims.clone(), data, seed: s as u64 }, dtype, dims, meta)
            }
        }
    }

    /// A leaf whose shape broadcasts with `dims`: some dims set to 1, some leading dims dropped, and dims of 1
    /// in `dims` maybe stretched.
    pub(super) fn leaf_like(&mut self, dims: &[usize], dtype: DType, p: [u16; 3]) -> usize {
        let drop = if dims.is_empty() { 0 } else { p[0] as usize % (dims.len() + 1) };
        let mut out: Vec<usize> = Vec::new();
        for (i, &d) in dims.iter().enumerate().skip(drop) {
            let bits = (p[1] as usize >> (2 * i)) & 3;
            out.push(match bits {
                1 => 1,
                2 if d == 1 => DIMS[(p[0] as usize >> 4) % 16],
                _ => d,
            });
        }
        if out.iter().product::<usize>() > MAX_NUMEL {
            out.iter_mut().for_each(|d| *d = (*d).min(1));
        }
        self.leaf(dtype, out, p[2], p[0] >> 8)
    }

    /// Decodes one raw step. Steps that would be invalid or ill-conditioned decode to nothing.
    pub(super) fn step(&mut self, (sel, p): Raw) {
        const KINDS: [(u8, u32); 25] = [
            (0, 5),  // leaf
            (1, 14), // unary
            (2, 8),  // binary with a Rust scalar
            (3, 12), // binary with a tensor
            (4, 3),  // scalar - v, scalar / v
            (5, 6),  // comparison
            (6, 5),  // where_
            (7, 6),  // cast
            (8, 10), // reduction
            (9, 3),  // argmax / argmin
            (10, 6), // reshape
            (11, 5), // permute / transpose
            (12, 4), // expand / broadcast_to
            (13, 5), // slice
            (14, 2), // narrow
            (15, 3), // flip
            (16, 4), // pad
            (17, 4), // cat / stack
            (18, 3), // unsqueeze
            (19, 3), // squeeze
            (20, 2), // contiguous
            (21, 7), // matmul
            (22, 4), // softmax / log_softmax
            (23, 3), // realize
            (24, 3), // unfold
        ];
        let total: u32 = KINDS.iter().map(|k| k.1).sum();
        let mut r = sel as u32 % total;
        let kind = KINDS
            .iter()
            .find(|k| {
                r < k.1 || {
                    r -= k.1;
                    false
                }
            })
            .expect("a kind")
            .0;
        match kind {
            0 => {
                let dtype = DTYPES[p[0] as usize % DTYPES.len()];
                let rank = [1, 2, 0, 3, 4][p[1] as usize % 5];
                self.leaf(dtype, dims_from(rank, p[2]), p[3], p[4]);
            }
            1 => self.unary(p),
            2 => self.binary_scalar(p),
            3 => self.binary_tensor(p),
            4 => self.reversed(p),
            5 => self.comparison(p),
            6 => self.where_(p),
            7 => self.cast(p),
            8 => self.reduce(p),
            9 => self.arg(p),
            10 => self.reshape(p),
            11 => self.permute(p),
            12 => self.expand(p),
            13 => self.slice(p),
            14 => self.narrow(p),
            24 => self.unfold(p),
            15 => self.flip(p),
            16 => self.pad(p),
            17 => self.cat(p),
            18 => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let r = self.var(v).dims.len() as isize;
                let d = (p[1] as isize % (2 * r + 2)) - (r + 1);
                let mut dims = self.var(v).dims.clone();
                dims.insert(if d < 0 { (d + r + 1) as usize } else { d as usize }, 1);
                let (dtype, meta) = (self.var(v).dtype, self.var(v).meta);
                self.push(Step::Unsqueeze(v, d), dtype, dims, meta);
            }
            19 => {
                let Some(v) = self.pick(p[0], |x| x.dims.contains(&1)) else { return };
                let x = self.var(v);
                let r = x.dims.len();
                // Some dims of size 1 (at least one) and maybe others, which squeeze leaves alone.
                let mut axes: Vec<usize> = (0..r).filter(|&a| (p[1] >> a) & 1 == 1).collect();
                let ones: Vec<usize> = (0..r).filter(|&a| x.dims[a] == 1).collect();
                if !axes.iter().any(|a| ones.contains(a)) {
                    axes.push(ones[p[2] as usize % ones.len()]);
                }
                axes.sort_unstable();
                axes.dedup();
                let dims: Vec<usize> =
                    (0..r).filter(|a| !(x.dims[*a] == 1 && axes.contains(a))).map(|a| x.dims[a]).collect();
                let spec: Vec<isize> = axes
                    .iter()
                    .map(|&a| if (p[3] >> a) & 1 == 1 { a as isize - r as isize } else { a as isize })
                    .collect();
                let (dtype, meta) = (x.dtype, x.meta);
                self.push(Step::Squeeze(v, spec), dtype, dims, meta);
            }
            20 => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let x = self.var(v);
                let (dtype, dims, meta) = (x.dtype, x.dims.clone(), x.meta);
                self.push(Step::Contiguous(v), dtype, dims, meta);
            }
            21 => self.matmul(p),
            22 => self.softmax(p),
            _ => {
                if let Some(v) = self.pick(p[0], |x| !x.realized) {
                    self.realize(v);
                }
            }
        }
    }

    /// `x.abs() + 1.0`: the safe operand for log, sqrt and division when `x` is approximate (float `x` only;
    /// `None` if the sum would not be admissible).
    pub(super) fn safe(&mut self, v: usize) -> Option<usize> {
        let x = self.var(v);
        let (dtype, dims) = (x.dtype, x.dims.clone());
        let abs = unary_meta(Un::Abs, dtype, &x.meta)?;
        let sum = binary_meta(Bin::Add, dtype, &abs, &Meta::exact(1.0, 1.0, false))?;
        if !dtype.is_float() || !fits(dtype, &sum) {
            return None;
        }
        let a = self.push(Step::Unary(Un::Abs, v), dtype, dims.clone(), abs);
        Some(self.push(Step::Binary(Bin::Add, a, Rhs::Sc(Sc::F(1.0))), dtype, dims, sum))
    }
}

pub(super) fn priority(dims: &[usize]) -> Priority {
    if dims.is_empty() { Priority::ZeroDim } else { Priority::Tensor }
}

/// A Rust scalar as a constant of `d` holds it.
pub(super) fn stored(d: DType, s: Sc) -> f64 {
    let x = s.scalar();
    match d {
        DType::F16 => kiln::f16::from_f64(x.as_f64()).to_f64(),
        DType::BF16 => kiln_jit::dtype::bf16_from_f64(x.as_f64()).to_f64(),
        DType::F32 => x.as_f64() as f32 as f64,
        DType::F64 => x.as_f64(),
        DType::Bool => (x.as_i64() != 0) as u8 as f64,
        DType::U8 => x.as_i64() as u8 as f64,
        DType::U32 => x.as_i64() as u32 as f64,
        DType::I32 => x.as_i64() as i32 as f64,
        _ => x.as_i64() as f64,
    }
}

pub(super) fn decode(leaves: Vec<Raw>, raw: Vec<Raw>, outs: Vec<u16>, together: bool, seed: u16) -> Prog {
    let mut dec = Decoder { steps: Vec::new(), vars: Vec::new(), infos: Vec::new() };
    for (sel, p) in leaves {
        let dtype = DTYPES[sel as usize % DTYPES.len()];
        let rank = [1, 2, 0, 3, 4][p[0] as usize % 5];
        dec.leaf(dtype, dims_from(rank, p[1]), p[2], p[3]);
    }
    for r in raw {
        dec.step(r);
    }
    let last = dec.vars.iter().rposition(Option::is_some).expect("a value");
    let mut outputs = vec![last];
    for o in outs {
        let v = dec.pick(o, |_| true).expect("a value");
        if !outputs.contains(&v) {
            outputs.push(v);
        }
    }
    prune(Prog { steps: dec.steps, info: dec.infos, outputs, together, seed: seed as u64 })
}

/// Drops the steps no output depends on (and renumbers), so that a shrunk program shows only what matters.
pub(super) fn prune(prog: Prog) -> Prog {
    let n = prog.steps.len();
    let mut live = vec![false; n];
    for &o in &prog.outputs {
        live[o] = true;
    }
    for i in (0..n).rev() {
        let keep = match &prog.steps[i] {
            Step::Realize(v) => live[*v],
            _ => live[i],
        };
        if keep {
            live[i] = true;
            for v in prog.steps[i].operands() {
                live[v] = true;
            }
        }
    }
    let mut map = vec![usize::MAX; n];
    let mut steps = Vec::new();
    let mut info = Vec::new();
    for i in (0..n).filter(|&i| live[i]) {
        map[i] = steps.len();
        steps.push(prog.steps[i].remap(&map));
        info.push(prog.info[i].clone());
    }
    let outputs = prog.outputs.iter().map(|&o| map[o]).collect();
    Prog { steps, info, outputs, ..prog }
}

pub(super) fn program() -> impl Strategy<Value = Prog> {
    let raw = || (any::<u8>(), prop::array::uniform5(any::<u16>()));
    (
        prop::collection::vec(raw(), 1..3),
        prop::collection::vec(raw(), 1..24),
        prop::collection::vec(any::<u16>(), 0..3),
        any::<bool>(),
        any::<u16>(),
    )
        .prop_map(|(leaves, steps, outs, together, seed)| decode(leaves, steps, outs, together, seed))
}
