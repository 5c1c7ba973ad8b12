//! The decoder's reductions, `argmax`/`argmin`, `matmul` and softmax, and the value classes of their results.

use super::*;

impl Decoder {
    pub(super) fn reduce(&mut self, p: [u16; 5]) {
        const OPS: [Red; 6] = [Red::Sum, Red::Max, Red::Sum, Red::Min, Red::Mean, Red::Prod];
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let (dtype, r) = (x.dtype, x.dims.len());
        let mut op = OPS[p[1] as usize % OPS.len()];
        let all = p[2].is_multiple_of(6);
        let mut axes: Vec<usize> =
            if all { (0..r).collect() } else { (0..r).filter(|&a| (p[3] >> a) & 1 == 1).collect() };
        if axes.is_empty() {
            axes.push(p[3] as usize % r);
        }
        let k: usize = axes.iter().map(|&a| x.dims[a]).product();
        if matches!(op, Red::Max | Red::Min) && k == 0 {
            op = Red::Sum; // max/min of an empty dim panic
        }
        if op == Red::Mean && !dtype.is_float() {
            op = Red::Sum;
        }
        if op == Red::Prod && k > 4 {
            op = Red::Sum;
        }
        let keepdim = p[4].is_multiple_of(2);
        let spec: Vec<isize> = if all {
            Vec::new()
        } else {
            axes.iter()
                .map(|&a| if (p[4] >> (a + 1)) & 1 == 1 { a as isize - r as isize } else { a as isize })
                .collect()
        };
        let dims: Vec<usize> = (0..r)
            .filter_map(|a| match (axes.contains(&a), keepdim) {
                (false, _) => Some(x.dims[a]),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        let out = match op {
            Red::Sum | Red::Prod if !dtype.is_float() => DType::I64,
            _ => dtype,
        };
        let meta = |s: &Self| reduce_meta(op, out, &cast_meta(dtype, out, &s.var(v).meta)?, k).filter(|m| fits(out, m));
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Reduce(op, v, spec, keepdim), out, dims, m);
        }
    }

    pub(super) fn arg(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d > 0) && !x.dims.contains(&0)) else { return };
        let r = self.var(v).dims.len();
        let a = p[1] as usize % r;
        let n = self.var(v).dims[a];
        let dim = if p[2] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let keepdim = p[3].is_multiple_of(2);
        self.settle(v);
        let x = self.var(v);
        let mut dims = x.dims.clone();
        if keepdim {
            dims[a] = 1;
        } else {
            dims.remove(a);
        }
        let meta = Meta { acc: x.meta.acc, ..Meta::exact(0.0, n as f64 - 1.0, false) };
        self.push(Step::Arg { max: p[4].is_multiple_of(2), v, dim, keepdim }, DType::I64, dims, meta);
    }

    pub(super) fn matmul(&mut self, p: [u16; 5]) {
        let Some(a) = self.pick(p[0], |x| x.dtype != DType::Bool && (1..=3).contains(&x.dims.len())) else {
            return;
        };
        let ad = self.var(a).dims.clone();
        let ra = ad.len();
        let k = ad[ra - 1];
        if k > 32 {
            return;
        }
        // The right operand: [k], [k, n] or [batch, k, n] with a batch that broadcasts with the left one's.
        let n = DIMS[p[1] as usize % 16];
        let bd: Vec<usize> = match p[2] % 4 {
            0 => vec![k],
            1 => vec![k, n],
            _ => {
                let batch = if ra == 3 && !p[3].is_multiple_of(3) {
                    if p[3].is_multiple_of(2) { ad[0] } else { 1 }
                } else {
                    1 + p[3] as usize % 3
                };
                vec![batch, k, n]
            }
        };
        let dt = if p[4].is_multiple_of(3) { DTYPES[(p[4] as usize / 3) % DTYPES.len()] } else { self.var(a).dtype };
        let found = self.pick(p[3], |x| x.dims == bd);
        let b = match found {
            Some(b) if p[4].is_multiple_of(2) => b,
            _ => self.leaf(dt, bd.clone(), p[3] >> 4, p[4] >> 4),
        };
        let d = result_type(&[(self.var(a).dtype, Priority::Tensor), (self.var(b).dtype, Priority::Tensor)]);
        if d == DType::Bool {
            return;
        }
        let rb = bd.len();
        let a2 = if ra == 1 { vec![1, k] } else { ad.clone() };
        let b2 = if rb == 1 { vec![k, 1] } else { bd.clone() };
        let Some(batch) = common::broadcast_shape(&a2[..a2.len() - 2], &b2[..b2.len() - 2]) else { return };
        let mut dims = batch;
        if ra > 1 {
            dims.push(a2[a2.len() - 2]);
        }
        if rb > 1 {
            dims.push(b2[b2.len() - 1]);
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let meta = |s: &Self| -> Option<Meta> {
            let ma = cast_meta(s.var(a).dtype, d, &s.var(a).meta)?;
            let mb = cast_meta(s.var(b).dtype, d, &s.var(b).meta)?;
            matmul_meta(d, &ma, &mb, k).filter(|m| fits(d, m))
        };
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(a);
                self.settle(b);
                meta(self)
            }
        };
        if let Some(m) = m {
            self.push(Step::Matmul(a, b), d, dims, m);
        }
    }

    pub(super) fn softmax(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dtype.is_float() && !x.dims.contains(&0)) else { return };
        let r = self.var(v).dims.len();
        let a = p[1] as usize % r.max(1);
        let k = if r == 0 { 1 } else { self.var(v).dims[a] };
        let dim = if p[2] % 2 == 1 { a as isize - r.max(1) as isize } else { a as isize };
        let log = p[3] % 2 == 1;
        let d = self.var(v).dtype;
        let meta = |s: &Self| softmax_meta(d, &s.var(v).meta, k, log).filter(|m| fits(d, m));
        let m = match meta(self) {
            Some(m) => Some(m),
            None => {
                self.settle(v);
                meta(self)
            }
        };
        if let Some(m) = m {
            let dims = self.var(v).dims.clone();
            self.push(Step::Softmax { v, dim, log }, d, dims, m);
        }
    }
}

/// Value class of a reduction over `k` elements (the input already converted to `d`).
pub(super) fn reduce_meta(op: Red, d: DType, a: &Meta, k: usize) -> Option<Meta> {
    let kf = k as f64;
    let u = ulp(d) / 2.0;
    if !d.is_float() {
        let (lo, hi) = match op {
            Red::Sum => (a.lo.min(0.0) * kf, a.hi.max(0.0) * kf),
            Red::Prod => {
                let m = a.mag().max(1.0).powf(kf);
                (-m, m)
            }
            _ => (a.lo, a.hi),
        };
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta { lo, hi, ..*a });
    }
    let mut m = match op {
        Red::Max | Red::Min => Meta { bit: false, ..*a },
        Red::Sum | Red::Mean if k == 0 => {
            // 0 (sum) or 0 / 0 (mean).
            let mut m = Meta { acc: true, ..Meta::exact(0.0, 0.0, op == Red::Mean) };
            m.acc = true;
            return Some(m);
        }
        Red::Sum | Red::Mean => {
            let j = Meta { acc: true, ..Meta::joined(&[a], kf * a.lo.min(0.0), kf * a.hi.max(0.0)) };
            let j = if a.lo >= 0.0 {
                Meta { lo: kf * a.lo, ..j }
            } else if a.hi <= 0.0 {
                Meta { hi: kf * a.hi, ..j }
            } else {
                j
            };
            if k == 1 {
                j
            } else if a.lo >= 0.0 || a.hi <= 0.0 {
                j.approx(d, kf * a.ea, a.er + u * kf / 2.0 + u)
            } else {
                j.approx(d, kf * a.abs_err() + u * a.mag() * kf / 2.0, u)
            }
        }
        Red::Prod if k == 0 => return Some(Meta { acc: true, ..Meta::exact(1.0, 1.0, false) }),
        Red::Prod => {
            if a.special && !a.val {
                return None;
            }
            let big = a.mag().powf(kf);
            let lo = if a.lo >= 0.0 { a.lo.powf(kf) } else { -big };
            let j = Meta { acc: true, ..Meta::joined(&[a], lo, big) };
            if k == 1 { j } else { j.approx(d, kf * a.ea * a.mag().powf(kf - 1.0), kf * (a.er + u)) }
        }
    };
    if op == Red::Mean && k > 0 {
        let (lo, hi) = (m.lo / kf, m.hi / kf);
        m = Meta { lo, hi, ..m };
        if !m.bit {
            let (ea, er) = (m.ea / kf, m.er + u);
            m = m.approx(d, ea, er);
        }
    }
    Some(m)
}

/// Value class of a matmul with inner dim `k` (operands already converted to `d`).
pub(super) fn matmul_meta(d: DType, a: &Meta, b: &Meta, k: usize) -> Option<Meta> {
    let kf = k as f64;
    let (lo, hi) = corners(&[a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]);
    let (lo, hi) = (kf * lo.min(0.0), kf * hi.max(0.0));
    if !d.is_float() {
        let (lo, hi) = wrap(d, lo, hi);
        return Some(Meta::joined(&[a, b], lo, hi));
    }
    if (a.special && !b.val) || (b.special && !a.val) {
        return None;
    }
    let mut j = Meta { acc: true, ..Meta::joined(&[a, b], lo, hi) };
    if k == 0 {
        j.bit = false; // a sum of nothing: zeros, maybe of either sign
        return Some(j);
    }
    let u = ulp(d) / 2.0;
    let (ma, mb) = (a.mag(), b.mag());
    let (ea_t, er_t) = (a.ea * mb + b.ea * ma, a.er + b.er + u);
    let signed = |m: &Meta| m.lo >= 0.0 || m.hi <= 0.0;
    Some(if signed(a) && signed(b) {
        j.approx(d, kf * ea_t, er_t + u * kf / 2.0 + u)
    } else {
        j.approx(d, kf * (ea_t + er_t * ma * mb) + u * ma * mb * kf / 2.0, u)
    })
}

/// Value class of softmax (or log_softmax) over a dim of `k` elements.
pub(super) fn softmax_meta(d: DType, a: &Meta, k: usize, log: bool) -> Option<Meta> {
    let kf = k as f64;
    let u = ulp(d) / 2.0;
    let shifted = 2.0 * a.abs_err() + 2.0 * u * a.mag();
    let e = shifted + ulp(d); // relative error of exp(x - max)
    let s = e + u * kf / 2.0 + u; // relative error of the sum
    let j = Meta { acc: true, ..Meta::joined(&[a], 0.0, 1.0) };
    Some(if log {
        let lo = a.lo - a.hi - kf.ln() - 1.0;
        Meta { lo, hi: 0.0, ..j }.approx(d, shifted + s + ulp(d) * (kf.ln() + 1.0), u)
    } else {
        j.approx(d, 0.0, e + s + u)
    })
}
