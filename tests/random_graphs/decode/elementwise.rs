//! The decoder's elementwise steps: unary math, arithmetic with scalars and tensors, comparisons, `where_`, casts.

use super::*;

impl Decoder {
    pub(super) fn unary(&mut self, p: [u16; 5]) {
        const OPS: [Un; 18] = [
            Un::Exp,
            Un::Neg,
            Un::Tanh,
            Un::Abs,
            Un::Log,
            Un::Sin,
            Un::Cos,
            Un::Sqrt,
            Un::Recip,
            Un::Rsqrt,
            Un::Sigmoid,
            Un::Relu,
            Un::Square,
            Un::LogicalNot,
            Un::Floor,
            Un::Ceil,
            Un::Round,
            Un::Trunc,
        ];
        let v = self.pick(p[0], |_| true).expect("a value");
        let mut u = OPS[p[1] as usize % OPS.len()];
        let (dtype, dims) = (self.var(v).dtype, self.var(v).dims.clone());
        if dtype == DType::Bool && matches!(u, Un::Neg | Un::Abs | Un::Relu) {
            u = Un::LogicalNot; // neg and relu reject bool; abs of bool is the identity (the same tensor)
        }
        match u {
            Un::LogicalNot => {
                if !self.var(v).meta.val {
                    self.realize(v);
                }
                let meta = Meta { acc: self.var(v).meta.acc, ..Meta::exact(0.0, 1.0, false) };
                self.push(Step::Unary(u, v), DType::Bool, dims, meta);
            }
            Un::Relu => {
                let m = binary_meta(Bin::Maximum, dtype, &self.var(v).meta, &Meta::exact(0.0, 0.0, false));
                if let Some(m) = m.filter(|m| fits(dtype, m)) {
                    self.push(Step::Unary(u, v), dtype, dims, m);
                }
            }
            Un::Square if dtype == DType::Bool => {
                self.push(Step::Unary(u, v), DType::I64, dims, Meta::exact(0.0, 1.0, false));
            }
            Un::Square => {
                let x = self.var(v).meta;
                let m = binary_meta(Bin::Mul, dtype, &x, &x).map(|m| Meta { lo: m.lo.max(0.0), ..m });
                match m.filter(|m| fits(dtype, m)) {
                    Some(m) => {
                        self.push(Step::Unary(u, v), dtype, dims, m);
                    }
                    None => self.realize(v),
                }
            }
            // An integer or bool tensor is integral already: the op returns it unchanged.
            Un::Floor | Un::Ceil | Un::Round | Un::Trunc if !dtype.is_float() => {
                let x = self.var(v).meta;
                self.push(Step::Unary(u, v), dtype, dims, x);
            }
            Un::Neg | Un::Abs if !dtype.is_float() => {
                let x = self.var(v).meta;
                let (lo, hi) = if u == Un::Neg { (-x.hi, -x.lo) } else { (x.min_abs(), x.mag()) };
                let (lo, hi) = wrap(dtype, lo, hi);
                self.push(Step::Unary(u, v), dtype, dims, Meta { lo, hi, ..x });
            }
            _ => {
                let fd = if dtype.is_float() { dtype } else { DType::F32 };
                let mut v = v;
                let mut m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                if m.is_none()
                    && matches!(u, Un::Log | Un::Sqrt | Un::Recip | Un::Rsqrt)
                    && p[2].is_multiple_of(2)
                    && let Some(w) = self.safe(v)
                {
                    v = w;
                    m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                }
                if m.is_none() {
                    self.settle(v);
                    m = unary_meta(u, fd, &self.var(v).meta).filter(|m| fits(fd, m));
                }
                if let Some(m) = m {
                    let dims = self.var(v).dims.clone();
                    self.push(Step::Unary(u, v), fd, dims, m);
                }
            }
        }
    }

    /// Pushes `op` of `a` and `b` if its value class is admissible, realizing approximate operands if needed.
    pub(super) fn arith(&mut self, op: Bin, a: usize, rhs: Rhs, p: u16) -> Option<usize> {
        let (prio_a, da) = (priority(&self.var(a).dims), self.var(a).dtype);
        let (db, prio_b, dims_b) = match rhs {
            Rhs::Var(b) => (self.var(b).dtype, priority(&self.var(b).dims), self.var(b).dims.clone()),
            Rhs::Sc(s) => (s.natural(), Priority::Scalar, Vec::new()),
        };
        let mut d = result_type(&[(da, prio_a), (db, prio_b)]);
        if matches!(op, Bin::LogicalAnd | Bin::LogicalOr) {
            d = DType::Bool;
        }
        if op == Bin::Div && !d.is_float() {
            d = DType::F32;
        }
        if d == DType::Bool && matches!(op, Bin::Sub | Bin::Pow | Bin::Div) {
            return None;
        }
        let dims = common::broadcast_shape(&self.var(a).dims, &dims_b)?;
        if dims.iter().product::<usize>() > 4 * MAX_NUMEL {
            return None;
        }
        let out = if op.is_comparison() { DType::Bool } else { d };
        let meta = |s: &Self| -> Option<Meta> {
            let ma = cast_meta(da, d, &s.var(a).meta)?;
            let mb = match rhs {
                Rhs::Var(b) => cast_meta(db, d, &s.var(b).meta)?,
                Rhs::Sc(sc) => Meta::exact(stored(d, sc), stored(d, sc), stored(d, sc).is_nan()),
            };
            binary_meta(op, d, &ma, &mb).filter(|m| fits(out, m))
        };
        let m = match meta(self) {
            Some(m) => m,
            None if !p.is_multiple_of(4) => {
                self.settle(a);
                if let Rhs::Var(b) = rhs {
                    self.settle(b);
                }
                meta(self)?
            }
            None => return None,
        };
        Some(self.push(Step::Binary(op, a, rhs), out, dims, m))
    }

    pub(super) fn binary_scalar(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 7] = [Bin::Add, Bin::Mul, Bin::Sub, Bin::Div, Bin::Maximum, Bin::Minimum, Bin::Pow];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let s = match (op, p[2] % 3) {
            (Bin::Pow, _) if self.var(v).dtype.is_float() => Sc::F([2.0, 0.5, -1.0, 3.0, 0.0, 1.5][p[3] as usize % 6]),
            (Bin::Pow, _) => Sc::I([2, 3, 0, -1, 1][p[3] as usize % 5]),
            (_, 0) => float_sc(p[3]),
            (_, 1) => int_sc(p[3]),
            _ => Sc::B(p[3] % 2 == 1),
        };
        if self.arith(op, v, Rhs::Sc(s), p[4]).is_none() && op != Bin::Add {
            self.arith(Bin::Add, v, Rhs::Sc(s), p[4]);
        }
    }

    /// A second operand for `v`: an earlier value whose shape broadcasts with it, or a new leaf.
    pub(super) fn partner(&mut self, v: usize, p: [u16; 3], same_dtype: bool) -> usize {
        let (dims, dtype) = (self.var(v).dims.clone(), self.var(v).dtype);
        let dt = if same_dtype || !p[2].is_multiple_of(3) { dtype } else { DTYPES[(p[2] as usize / 3) % DTYPES.len()] };
        match p[0] % 4 {
            0 | 1 => {
                let found = self.pick(p[1], |x| {
                    common::broadcast_shape(&dims, &x.dims).is_some_and(|b| b.iter().product::<usize>() <= MAX_NUMEL)
                        && (!same_dtype || x.dtype == dtype)
                });
                found.unwrap_or_else(|| self.leaf_like(&dims, dt, [p[1], p[2], p[0] >> 2]))
            }
            2 => self.leaf_like(&dims, dt, [p[1], p[2], p[0] >> 2]),
            _ => self.leaf(dt, Vec::new(), p[1], p[2]),
        }
    }

    pub(super) fn binary_tensor(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 7] = [Bin::Add, Bin::Mul, Bin::Sub, Bin::Maximum, Bin::Div, Bin::Minimum, Bin::Pow];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let w = self.partner(v, [p[2], p[3], p[4]], false);
        if op == Bin::Pow && self.var(v).dtype.is_float() && self.var(w).meta.mag() > 3.0 {
            return;
        }
        if self.arith(op, v, Rhs::Var(w), p[4]).is_none() && op != Bin::Add {
            self.arith(Bin::Add, v, Rhs::Var(w), p[4]);
        }
    }

    pub(super) fn reversed(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dtype != DType::Bool) else { return };
        let op = if p[1].is_multiple_of(2) { Bin::Sub } else { Bin::Div };
        let s = if p[2].is_multiple_of(2) { float_sc(p[3]) } else { int_sc(p[3]) };
        let x = self.var(v);
        let (prio, dx, dims) = (priority(&x.dims), x.dtype, x.dims.clone());
        let mut d = result_type(&[(s.natural(), Priority::Scalar), (dx, prio)]);
        if op == Bin::Div && !d.is_float() {
            d = DType::F32;
        }
        let meta = |s2: &Self| -> Option<Meta> {
            let mx = cast_meta(dx, d, &s2.var(v).meta)?;
            let ms = Meta::exact(stored(d, s), stored(d, s), false);
            binary_meta(op, d, &ms, &mx).filter(|m| fits(d, m))
        };
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Reversed(op, s, v), d, dims, m);
        }
    }

    pub(super) fn comparison(&mut self, p: [u16; 5]) {
        const OPS: [Bin; 8] = [Bin::Lt, Bin::Eq, Bin::Ge, Bin::Ne, Bin::Le, Bin::Gt, Bin::LogicalAnd, Bin::LogicalOr];
        let v = self.pick(p[0], |_| true).expect("a value");
        let op = OPS[p[1] as usize % OPS.len()];
        let rhs = if p[2].is_multiple_of(3) {
            let d = self.var(v).dtype;
            Rhs::Sc(if d.is_float() { float_sc(p[3]) } else { int_sc(p[3]) })
        } else {
            Rhs::Var(self.partner(v, [p[2] / 3, p[3], p[4]], false))
        };
        self.settle(v);
        if let Rhs::Var(w) = rhs {
            self.settle(w);
        }
        self.arith(op, v, rhs, 1);
    }

    pub(super) fn where_(&mut self, p: [u16; 5]) {
        let c = match self.pick(p[0], |x| x.dtype == DType::Bool) {
            Some(c) => c,
            None => {
                let v = self.pick(p[0], |_| true).expect("a value");
                let dims = self.var(v).dims.clone();
                self.leaf(DType::Bool, dims, p[1], p[2])
            }
        };
        let branch = |s: &mut Self, r: u16, q: u16| -> Rhs {
            match r % 4 {
                0 => Rhs::Sc(float_sc(q)),
                1 => Rhs::Sc(int_sc(q)),
                _ => {
                    let dims = s.var(c).dims.clone();
                    let found = s.pick(q, |x| {
                        x.dtype != DType::Bool
                            && common::broadcast_shape(&dims, &x.dims)
                                .is_some_and(|b| b.iter().product::<usize>() <= MAX_NUMEL)
                    });
                    Rhs::Var(found.unwrap_or_else(|| s.leaf_like(&dims, DType::F32, [q, r, q >> 3])))
                }
            }
        };
        let a = branch(self, p[1], p[3]);
        let b = branch(self, p[2], p[4]);
        let key = |s: &Self, r: Rhs| match r {
            Rhs::Var(v) => (s.var(v).dtype, priority(&s.var(v).dims)),
            Rhs::Sc(x) => (x.natural(), Priority::Scalar),
        };
        let (ka, kb) = (key(self, a), key(self, b));
        let d = result_type(&[ka, kb]);
        let dims_of = |s: &Self, r: Rhs| match r {
            Rhs::Var(v) => s.var(v).dims.clone(),
            Rhs::Sc(_) => Vec::new(),
        };
        let Some(dims) = common::broadcast_shape(&self.var(c).dims, &dims_of(self, a))
            .and_then(|x| common::broadcast_shape(&x, &dims_of(self, b)))
        else {
            return;
        };
        let meta_of = |s: &Self, r: Rhs, k: (DType, Priority)| match r {
            Rhs::Var(v) => cast_meta(k.0, d, &s.var(v).meta),
            Rhs::Sc(x) => Some(Meta::exact(stored(d, x), stored(d, x), false)),
        };
        let (Some(ma), Some(mb)) = (meta_of(self, a, ka), meta_of(self, b, kb)) else { return };
        let mut m = Meta::joined(&[&ma, &mb], ma.lo.min(mb.lo), ma.hi.max(mb.hi));
        m.acc |= self.var(c).meta.acc;
        if !m.val {
            m = m.approx(d, ma.ea.max(mb.ea), ma.er.max(mb.er));
            m.coarse = ma.coarse || mb.coarse;
        }
        if fits(d, &m) && dims.iter().product::<usize>() <= 4 * MAX_NUMEL {
            self.push(Step::Where(c, a, b), d, dims, m);
        }
    }

    pub(super) fn cast(&mut self, p: [u16; 5]) {
        let v = self.pick(p[0], |_| true).expect("a value");
        let from = self.var(v).dtype;
        let mut to = DTYPES[p[1] as usize % DTYPES.len()];
        if to == from {
            to = DTYPES[(p[1] as usize + 3) % DTYPES.len()];
        }
        if to == from {
            return;
        }
        if !to.is_float() {
            self.settle(v);
        }
        if let Some(m) = cast_meta(from, to, &self.var(v).meta).filter(|m| fits(to, m)) {
            let dims = self.var(v).dims.clone();
            self.push(Step::Cast(v, to), to, dims, m);
        }
    }
}
