//! The decoder's movement steps: reshape, permute, expand, slices, narrow, unfold, flip, pad, cat.

use super::*;

impl Decoder {
    pub(super) fn reshape(&mut self, p: [u16; 5]) {
        let v = self.pick(p[0], |_| true).expect("a value");
        let x = self.var(v);
        let numel: usize = x.dims.iter().product();
        let mut dims: Vec<usize> = match p[1] % 4 {
            0 => vec![numel],
            _ if numel == 0 => {
                let mut d = vec![DIMS[p[2] as usize % 10] % 4 + 1; 1 + p[3] as usize % 3];
                let i = p[4] as usize % d.len();
                d[i] = 0;
                d
            }
            _ => {
                // Split numel into factors, in a random order, with 1s inserted.
                let mut f = Vec::new();
                let mut n = numel;
                let mut q = 2;
                while n > 1 {
                    while n.is_multiple_of(q) {
                        f.push(q);
                        n /= q;
                    }
                    q += 1;
                }
                let groups = 1 + p[2] as usize % 3;
                let mut d = vec![1usize; groups];
                for (i, x) in f.iter().enumerate() {
                    d[(p[3] as usize >> i) % groups] *= x;
                }
                if p[4].is_multiple_of(3) {
                    d.insert(p[4] as usize % (d.len() + 1), 1);
                }
                d
            }
        };
        if dims == x.dims {
            dims.insert(0, 1);
        }
        let mut spec: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        if numel > 0 && p[4] % 2 == 1 {
            let i = (p[4] as usize >> 1) % spec.len();
            spec[i] = -1;
        }
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Reshape(v, spec), dtype, dims, meta);
    }

    pub(super) fn permute(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.len() >= 2) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let (dtype, meta) = (x.dtype, x.meta);
        if p[1].is_multiple_of(3) {
            let a = p[2] as usize % r;
            let b = (a + 1 + p[3] as usize % (r - 1)) % r;
            let mut dims = x.dims.clone();
            dims.swap(a, b);
            let b = if p[4] % 2 == 1 { b as isize - r as isize } else { b as isize };
            self.push(Step::Transpose(v, a as isize, b), dtype, dims, meta);
            return;
        }
        // The p[2]-th permutation (Lehmer code), moved off the identity.
        let mut left: Vec<usize> = (0..r).collect();
        let mut perm = Vec::with_capacity(r);
        let mut code = p[2] as usize;
        for i in (1..=r).rev() {
            perm.push(left.remove(code % i));
            code /= i;
        }
        if perm.iter().enumerate().all(|(i, &q)| i == q) {
            perm.swap(0, r - 1);
        }
        let dims: Vec<usize> = perm.iter().map(|&q| x.dims[q]).collect();
        let spec: Vec<isize> = perm
            .iter()
            .enumerate()
            .map(|(i, &q)| if (p[3] >> i) & 1 == 1 { q as isize - r as isize } else { q as isize })
            .collect();
        self.push(Step::Permute(v, spec), dtype, dims, meta);
    }

    pub(super) fn expand(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.len() <= 3) else { return };
        let x = self.var(v);
        let lead = p[1] as usize % 3;
        let mut dims: Vec<usize> = (0..lead).map(|i| DIMS[(p[2] as usize >> (4 * i)) % 10]).collect();
        let mut spec: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        for (i, &d) in x.dims.iter().enumerate() {
            let stretch = d == 1 && (p[3] >> i) & 1 == 1;
            let n = if stretch { DIMS[(p[4] as usize >> (3 * i)) % 16] } else { d };
            dims.push(n);
            spec.push(if !stretch && (p[1] >> (i + 2)) & 1 == 1 { -1 } else { n as i64 });
        }
        if dims == x.dims {
            dims.insert(0, 2);
            spec.insert(0, 2);
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Expand { v, spec, broadcast_to: p[1] % 2 == 1 }, dtype, dims, meta);
    }

    pub(super) fn slice(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let a = p[1] as usize % r;
        let n = x.dims[a] as isize;
        let mut start = (p[2] as isize % (n + 3)) - 1;
        let end = n + 1 - (p[3] as isize % (n + 3));
        let mut step = 1 + p[4] as usize % 3;
        let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let len = |s: isize, st: usize| {
            let (b, e) = (clamp(s), clamp(end));
            if e > b { ((e - b) as usize).div_ceil(st) } else { 0 }
        };
        if clamp(start) == 0 && len(start, step) == n as usize && step == 1 {
            if n >= 2 {
                step = 2;
            } else {
                start = end; // an empty slice: the only non-identity slice of a dim of size <= 1 with step 1
            }
        }
        let mut dims = x.dims.clone();
        dims[a] = len(start, step);
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Slice { v, dim, start, end, step }, dtype, dims, meta);
    }

    pub(super) fn narrow(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let a = p[1] as usize % r;
        let n = x.dims[a];
        let start = p[2] as usize % (n + 1);
        let mut len = p[3] as usize % (n - start + 1);
        if start == 0 && len == n {
            len = n.saturating_sub(1);
        }
        let mut dims = x.dims.clone();
        dims[a] = len;
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Narrow { v, dim, start, len }, dtype, dims, meta);
    }

    /// Windows of 1..=3 elements, 1..=3 apart (overlapping, tiling or with gaps), along a dim they fit.
    pub(super) fn unfold(&mut self, p: [u16; 5]) {
        let size = 1 + p[2] as usize % 3;
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d >= size)) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let fits: Vec<usize> = (0..r).filter(|&a| x.dims[a] >= size).collect();
        let a = fits[p[1] as usize % fits.len()];
        let step = 1 + p[3] as usize % 3;
        let mut dims = x.dims.clone();
        dims[a] = (dims[a] - size) / step + 1;
        dims.push(size);
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let dim = if p[4] % 2 == 1 { a as isize - r as isize } else { a as isize };
        let (dtype, meta) = (x.dtype, x.meta);
        self.push(Step::Unfold { v, dim, size, step }, dtype, dims, meta);
    }

    pub(super) fn flip(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| x.dims.iter().any(|&d| d > 1)) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let mut axes: Vec<usize> = (0..r).filter(|&a| (p[1] >> a) & 1 == 1).collect();
        if !axes.iter().any(|&a| x.dims[a] > 1) {
            let big: Vec<usize> = (0..r).filter(|&a| x.dims[a] > 1).collect();
            axes.push(big[p[2] as usize % big.len()]);
        }
        let spec: Vec<isize> =
            axes.iter().map(|&a| if (p[3] >> a) & 1 == 1 { a as isize - r as isize } else { a as isize }).collect();
        let (dtype, dims, meta) = (x.dtype, x.dims.clone(), x.meta);
        self.push(Step::Flip(v, spec), dtype, dims, meta);
    }

    pub(super) fn pad(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let x = self.var(v);
        let r = x.dims.len();
        let n = 1 + p[1] as usize % r.min(3);
        let mut pads: Vec<(usize, usize)> =
            (0..n).map(|i| ((p[2] as usize >> (4 * i)) % 3, (p[2] as usize >> (4 * i + 2)) % 3)).collect();
        if pads.iter().all(|&q| q == (0, 0)) {
            pads[0] = (1, 0);
        }
        let mut dims = x.dims.clone();
        for (i, &(b, a)) in pads.iter().enumerate() {
            dims[r - 1 - i] += b + a;
        }
        if dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let value = match x.dtype {
            DType::Bool => Sc::B(p[3] % 2 == 1),
            d if d.is_float() => float_sc(p[3]),
            _ => int_sc(p[3]),
        };
        let s = stored(x.dtype, value);
        let meta = Meta { lo: x.meta.lo.min(s), hi: x.meta.hi.max(s), ..x.meta };
        let dtype = x.dtype;
        self.push(Step::Pad(v, pads, value), dtype, dims, meta);
    }

    pub(super) fn cat(&mut self, p: [u16; 5]) {
        let Some(v) = self.pick(p[0], |x| !x.dims.is_empty()) else { return };
        let (dims, dtype) = (self.var(v).dims.clone(), self.var(v).dtype);
        let r = dims.len();
        let stack = p[1].is_multiple_of(4);
        let a = p[2] as usize % if stack { r + 1 } else { r };
        let parts_n = 2 + p[3] as usize % 2;
        let mut parts = vec![v];
        for i in 1..parts_n {
            let q = p[4] >> (4 * i);
            if q.is_multiple_of(3) {
                parts.push(v);
                continue;
            }
            let mut d = dims.clone();
            if !stack {
                d[a] = [0, 1, 2, 3, 5][(q as usize / 3) % 5];
            }
            let dt = if q % 5 == 1 { DTYPES[(q as usize / 5) % DTYPES.len()] } else { dtype };
            parts.push(self.leaf(dt, d, q, q >> 2));
        }
        let out_dims = if stack {
            let mut d = dims.clone();
            d.insert(a, parts.len());
            d
        } else {
            let mut d = dims.clone();
            d[a] = parts.iter().map(|&q| self.var(q).dims[a]).sum();
            d
        };
        if out_dims.iter().product::<usize>() > 2 * MAX_NUMEL {
            return;
        }
        let d = result_type(&parts.iter().map(|&q| (self.var(q).dtype, Priority::Tensor)).collect::<Vec<_>>());
        let metas: Option<Vec<Meta>> =
            parts.iter().map(|&q| cast_meta(self.var(q).dtype, d, &self.var(q).meta)).collect();
        let Some(metas) = metas else { return };
        let refs: Vec<&Meta> = metas.iter().collect();
        let lo = metas.iter().map(|m| m.lo).fold(f64::INFINITY, f64::min);
        let hi = metas.iter().map(|m| m.hi).fold(f64::NEG_INFINITY, f64::max);
        let mut m = Meta::joined(&refs, lo, hi);
        if !m.val {
            let ea = metas.iter().map(|m| m.ea).fold(0.0, f64::max);
            let er = metas.iter().map(|m| m.er).fold(0.0, f64::max);
            m = m.approx(d, ea, er);
            m.coarse = metas.iter().any(|m| m.coarse);
        }
        let dim = if p[4] % 2 == 1 { a as isize - (r + stack as usize) as isize } else { a as isize };
        let step = if stack { Step::Stack(parts, dim) } else { Step::Cat(parts, dim) };
        if fits(d, &m) {
            self.push(step, d, out_dims, m);
        }
    }
}
