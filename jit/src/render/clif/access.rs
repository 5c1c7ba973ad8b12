//! Memory and indices in a kernel's code, written once for any lane count: constants, index arithmetic, validity
//! masks, loads (plain, masked, strided, per lane), checked gathers with their fault record, and stores.

use super::*;

/// Where a gather reads (the fields of `InstOp::Gather` but its index value).
pub(super) struct Gathered<'a> {
    pub(super) buf: usize,
    pub(super) base: &'a IExpr,
    pub(super) stride: i64,
    pub(super) len: i64,
    pub(super) valid: &'a Option<Valid>,
}

impl Emitter<'_> {
    pub(super) fn konst(&mut self, s: Scalar, d: DType, lanes: usize) -> Value {
        let scalar = match d {
            DType::F32 => self.b.ins().f32const(s.as_f64() as f32),
            DType::F16 => self.b.ins().f32const(::half::f16::from_f64(s.as_f64()).to_f32()),
            DType::BF16 => self.b.ins().f32const(crate::dtype::bf16_from_f64(s.as_f64()).to_f32()),
            DType::F64 => self.b.ins().f64const(s.as_f64()),
            DType::Bool if lanes > 1 => self.b.ins().iconst(types::I32, if s.as_f64() != 0.0 { -1 } else { 0 }),
            DType::Bool => self.b.ins().iconst(types::I8, (s.as_f64() != 0.0) as i64),
            DType::U8 => self.b.ins().iconst(types::I8, s.as_i64() as u8 as i64),
            DType::I32 => self.b.ins().iconst(types::I32, s.as_i64() as i32 as i64),
            DType::U32 => self.b.ins().iconst(types::I32, s.as_i64() as u32 as i64),
            DType::I64 => self.b.ins().iconst(types::I64, s.as_i64()),
        };
        if lanes > 1 { self.b.ins().splat(ty(d, lanes), scalar) } else { scalar }
    }

    /// The scalar value of an index expression at the current tile offset, with the column advanced by `lane`.
    pub(super) fn iexpr(&mut self, e: &IExpr, lane: i64) -> Value {
        match e {
            IExpr::Var(v) => {
                let x = self.b.use_var(self.vars[*v]);
                let mut off = 0;
                if Some(*v) == self.row_dim {
                    off += self.at.0;
                }
                if Some(*v) == self.col_dim {
                    off += self.at.1 + lane;
                }
                if off != 0 { self.b.ins().iadd_imm_s(x, off) } else { x }
            }
            IExpr::Const(c) => self.b.ins().iconst(types::I64, *c),
            IExpr::Add(ts) => {
                let mut acc: Option<Value> = None;
                for t in ts {
                    let v = self.iexpr(t, lane);
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.b.ins().iadd(a, v),
                    });
                }
                acc.unwrap_or_else(|| self.b.ins().iconst(types::I64, 0))
            }
            IExpr::Mul(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().imul_imm_s(x, *k)
            }
            // Index values are non-negative by construction, so unsigned division is floor division.
            IExpr::Div(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().udiv_imm_u(x, *k)
            }
            IExpr::Mod(x, k) => {
                let x = self.iexpr(x, lane);
                self.b.ins().urem_imm_u(x, *k)
            }
            // What it stands for (lowering removes wraps; see `IExpr::Wrap`).
            IExpr::Wrap(x, _) => self.iexpr(x, lane),
        }
    }

    /// An index expression whose coefficient along the column dim is 1, split into its value at the tile's first
    /// column and the tile's column offset. Folding the offset into the load or store instruction's displacement
    /// makes every vector of a tile row share one address computation (Cranelift's GVN merges them), instead of
    /// an add and a scaled index per vector.
    pub(super) fn iexpr_tile_col0(&mut self, e: &IExpr) -> (Value, i64) {
        let col = self.at.1;
        self.at.1 = 0;
        let v = self.iexpr(e, 0);
        self.at.1 = col;
        (v, col)
    }

    /// A bool (i8 0/1) saying whether every range of `valid` holds at `lane`.
    pub(super) fn valid(&mut self, valid: &Valid, lane: i64) -> Value {
        let mut ok = self.b.ins().iconst(types::I8, 1);
        for (e, lo, hi) in &valid.0 {
            let x = self.iexpr(e, lane);
            let a = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, x, *lo);
            let c = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, *hi);
            let both = self.b.ins().band(a, c);
            ok = self.b.ins().band(ok, both);
        }
        ok
    }

    /// A scalar element load of `buf[index]` at `lane`, honouring `valid` (the index is clamped to 0 and the
    /// value replaced by `fill` where invalid, so no load ever leaves the buffer).
    pub(super) fn load_scalar(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lane: i64,
    ) -> Value {
        let mut i = self.iexpr(index, lane);
        let ok = valid.as_ref().map(|v| self.valid(v, lane));
        if let Some(ok) = ok {
            let zero = self.b.ins().iconst(types::I64, 0);
            i = self.b.ins().select(ok, i, zero);
        }
        let addr = self.b.ins().imul_imm_s(i, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.bases[buf], addr);
        let v = if d.is_half() {
            self.load_half(d, addr, 0)
        } else {
            self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, 0)
        };
        match ok {
            Some(ok) => {
                let f = self.konst(fill, d, 1);
                self.b.ins().select(ok, v, f)
            }
            None => v,
        }
    }

    pub(super) fn load(
        &mut self,
        buf: usize,
        index: &IExpr,
        valid: &Option<Valid>,
        fill: Scalar,
        d: DType,
        lanes: usize,
    ) -> Value {
        if self.k.inputs[buf].len == 0 {
            return self.konst(fill, d, lanes); // an empty buffer is never read; its pointer may dangle
        }
        if valid.is_none()
            && let IExpr::Const(c) = index
            && let Some(&v) = self.uniform_loads.get(&(buf, *c))
        {
            return self.vector_of(v, d, lanes);
        }
        if lanes == 1 {
            return self.load_scalar(buf, index, valid, fill, d, 0);
        }
        let col = self.col_dim.expect("vector code has a column dim");
        let coef = index.affine(self.vars.len()).map(|(c, _)| c[col]);
        match (coef, valid, d) {
            (Some(0), None, _) => {
                let s = self.load_scalar(buf, index, valid, fill, d, 0);
                self.lanes_from_scalars(&[s], d, lanes)
            }
            (Some(1), None, DType::F16 | DType::BF16) => {
                let i = self.iexpr(index, 0);
                let addr = self.b.ins().imul_imm_s(i, 2);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                self.load_halfx4(d, addr, 0)
            }
            (Some(1), None, DType::F32 | DType::I32 | DType::U32) => {
                let (i, col) = self.iexpr_tile_col0(index);
                let addr = self.b.ins().imul_imm_s(i, 4);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                self.b.ins().load(ty(d, lanes), vector_flags(), addr, (col * 4) as i32)
            }
            // A masked load whose ranges do not move along the vector (a pad or concatenation along another dim):
            // one vector load, at element 0 where the vector is outside (the buffer holds at least one vector),
            // and the fill selected for the whole vector.
            (Some(1), Some(v), DType::F32 | DType::I32 | DType::U32)
                if self.k.inputs[buf].len >= lanes && v.0.iter().all(|(e, _, _)| !mentions_var(e, col)) =>
            {
                let ok = self.valid(v, 0);
                let i = self.iexpr(index, 0);
                let zero = self.b.ins().iconst(types::I64, 0);
                let i = self.b.ins().select(ok, i, zero);
                let addr = self.b.ins().imul_imm_s(i, 4);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                let loaded = self.b.ins().load(ty(d, lanes), vector_flags(), addr, 0);
                let f = self.konst(fill, d, lanes);
                self.b.ins().select(ok, loaded, f)
            }
            // A masked load whose ranges move along the vector (a pad or an im2col window along the columns): every
            // range is affine, so monotone along the lanes, and all lanes are inside exactly where the first and the
            // last are. There one vector load; elsewhere (the vectors at an edge) lane by lane.
            (Some(1), Some(v), DType::F32 | DType::I32 | DType::U32)
                if self.k.inputs[buf].len >= lanes
                    && v.0.iter().all(|(e, _, _)| e.affine(self.vars.len()).is_some()) =>
            {
                let first = self.valid(v, 0);
                let last = self.valid(v, lanes as i64 - 1);
                let all = self.b.ins().band(first, last);
                let vt = ty(d, lanes);
                let (fast, slow, merge) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
                let result = self.b.append_block_param(merge, vt);
                self.b.ins().brif(all, fast, &[], slow, &[]);
                self.b.switch_to_block(fast);
                self.b.seal_block(fast);
                let i = self.iexpr(index, 0);
                let addr = self.b.ins().imul_imm_s(i, 4);
                let addr = self.b.ins().iadd(self.bases[buf], addr);
                let loaded = self.b.ins().load(vt, vector_flags(), addr, 0);
                self.b.ins().jump(merge, &[loaded.into()]);
                self.b.switch_to_block(slow);
                self.b.seal_block(slow);
                let scalars: Vec<Value> =
                    (0..lanes as i64).map(|l| self.load_scalar(buf, index, valid, fill, d, l)).collect();
                let lanes_value = self.lanes_from_scalars(&scalars, d, lanes);
                self.b.ins().jump(merge, &[lanes_value.into()]);
                self.b.switch_to_block(merge);
                self.b.seal_block(merge);
                result
            }
            _ => {
                let scalars: Vec<Value> =
                    (0..lanes as i64).map(|l| self.load_scalar(buf, index, valid, fill, d, l)).collect();
                self.lanes_from_scalars(&scalars, d, lanes)
            }
        }
    }

    /// A checked data-dependent load (`InstOp::Gather`), one lane at a time: each lane's index is compared with
    /// the dimension's length (unsigned, so a negative index fails too); a failing one branches to a cold block
    /// that records the fault (`Libcall::IndexFault`) and then reads element `base` instead, so no load leaves the
    /// buffer. Lanes where `valid` fails read nothing and check nothing.
    pub(super) fn gather(&mut self, at: Gathered, index: Value, index_d: DType, d: DType, lanes: usize) -> Value {
        let fault = self.fault.expect("a kernel that gathers is given a fault record");
        let empty = self.k.inputs[at.buf].len == 0;
        let varies = self.b.func.dfg.value_type(index).is_vector();
        // One index for every lane (an embedding's row) and lanes along the gathered row: the lanes' loads are
        // one vector's, so one check and one vector load at lane 0's element.
        let col = self.col_dim;
        let along_row = col.is_some_and(|c| at.base.affine(self.vars.len()).is_some_and(|(coef, _)| coef[c] == 1));
        if lanes > 1
            && !varies
            && !empty
            && at.valid.is_none()
            && along_row
            && matches!(d, DType::F32 | DType::I32 | DType::U32)
        {
            return self.gather_row(at, index, index_d, d, lanes, fault);
        }
        let mut scalars = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let i = if varies { self.b.ins().extractlane(index, l as u8) } else { index };
            let i = if index_d == DType::I64 { i } else { self.b.ins().sextend(types::I64, i) };
            let outside = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, i, at.len);
            let live = at.valid.as_ref().map(|v| self.valid(v, l as i64));
            let bad = match live {
                Some(live) => self.b.ins().band(outside, live),
                None => outside,
            };
            self.fault_if(bad, fault, at.len, i);
            if empty {
                // An empty source is never read (its pointer may dangle): every index faulted above.
                scalars.push(self.konst(Scalar::Int(0), d, 1));
                continue;
            }
            let zero = self.b.ins().iconst(types::I64, 0);
            let ok = match live {
                Some(live) => {
                    let inside = self.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, i, at.len);
                    self.b.ins().band(inside, live)
                }
                None => self.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, i, at.len),
            };
            let i = self.b.ins().select(ok, i, zero);
            let base = self.iexpr(at.base, l as i64);
            let off = self.b.ins().imul_imm_s(i, at.stride);
            let elem = self.b.ins().iadd(base, off);
            let addr = self.b.ins().imul_imm_s(elem, d.size_of() as i64);
            let addr = self.b.ins().iadd(self.bases[at.buf], addr);
            let v = if d.is_half() {
                self.load_half(d, addr, 0)
            } else {
                self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, 0)
            };
            let v = match live {
                Some(live) => {
                    let z = self.konst(Scalar::Int(0), d, 1);
                    self.b.ins().select(live, v, z)
                }
                None => v,
            };
            scalars.push(v);
        }
        if lanes == 1 { scalars[0] } else { self.lanes_from_scalars(&scalars, d, lanes) }
    }

    /// Where `bad` holds, a cold block records `Fault::Index { len, index }` in the run's `fault` record
    /// (`Libcall::IndexFault`); code goes on after it either way.
    fn fault_if(&mut self, bad: Value, fault: Value, len: i64, index: Value) {
        let cold = self.b.create_block();
        let merge = self.b.create_block();
        self.b.ins().brif(bad, cold, &[], merge, &[]);
        self.b.switch_to_block(cold);
        self.b.seal_block(cold);
        self.b.set_cold_block(cold);
        let len = self.b.ins().iconst(types::I64, len);
        self.libcall(Libcall::IndexFault, &[fault, len, index]);
        self.b.ins().jump(merge, &[]);
        self.b.switch_to_block(merge);
        self.b.seal_block(merge);
    }

    /// [`Self::gather`]'s vector form: index `index` (the same for every lane) checked once, then the `lanes`
    /// consecutive elements from lane 0's in one load (the addresses the lanes would read one by one; a failed
    /// check reads from row 0, as the lane form does).
    fn gather_row(
        &mut self,
        at: Gathered,
        index: Value,
        index_d: DType,
        d: DType,
        lanes: usize,
        fault: Value,
    ) -> Value {
        let i = if index_d == DType::I64 { index } else { self.b.ins().sextend(types::I64, index) };
        let outside = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, i, at.len);
        self.fault_if(outside, fault, at.len, i);
        let zero = self.b.ins().iconst(types::I64, 0);
        let i = self.b.ins().select(outside, zero, i);
        let base = self.iexpr(at.base, 0);
        let off = self.b.ins().imul_imm_s(i, at.stride);
        let elem = self.b.ins().iadd(base, off);
        let addr = self.b.ins().imul_imm_s(elem, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.bases[at.buf], addr);
        self.b.ins().load(ty(d, lanes), vector_flags(), addr, 0)
    }

    /// `v` as a `lanes`-wide value: unchanged if it already is one, else splatted (a uniform scalar).
    pub(super) fn vector_of(&mut self, v: Value, d: DType, lanes: usize) -> Value {
        if lanes == 1 || self.b.func.dfg.value_type(v).is_vector() {
            v
        } else if let Some(&splat) = self.splats.get(&(v, lanes)) {
            splat
        } else {
            self.lanes_from_scalars(&[v], d, lanes)
        }
    }

    /// Builds a vector from one scalar (splat) or one scalar per lane; bool bytes become lane masks.
    pub(super) fn lanes_from_scalars(&mut self, scalars: &[Value], d: DType, lanes: usize) -> Value {
        let conv = |s: &mut Self, v: Value| -> Value {
            if d == DType::Bool {
                let w = s.b.ins().uextend(types::I32, v);
                s.b.ins().ineg(w)
            } else {
                v
            }
        };
        let vt = ty(d, lanes);
        if let [one] = scalars {
            let v = conv(self, *one);
            return self.b.ins().splat(vt, v);
        }
        let first = conv(self, scalars[0]);
        let mut vec = self.b.ins().splat(vt, first);
        for (l, &s) in scalars.iter().enumerate().skip(1) {
            let v = conv(self, s);
            vec = self.b.ins().insertlane(vec, v, l as u8);
        }
        vec
    }

    /// Stores `v` at output element `o + col` (`col`: a constant offset in elements, see `iexpr_tile_col0`).
    pub(super) fn store(&mut self, o: Value, col: i64, v: Value, lanes: usize) {
        let d = self.k.output.dtype;
        let addr = self.b.ins().imul_imm_s(o, d.size_of() as i64);
        let addr = self.b.ins().iadd(self.out_ptr, addr);
        let at = (col * d.size_of() as i64) as i32;
        match (d, lanes) {
            (DType::F16 | DType::BF16, _) => self.store_half(d, v, addr, at, lanes),
            (_, 1) => {
                self.b.ins().store(MemFlagsData::trusted(), v, addr, at);
            }
            (DType::Bool, _) => {
                for l in 0..lanes {
                    let x = self.b.ins().extractlane(v, l as u8);
                    let x = self.b.ins().band_imm_s(x, 1);
                    self.b.ins().istore8(MemFlagsData::trusted(), x, addr, at + l as i32);
                }
            }
            _ => {
                self.b.ins().store(vector_flags(), v, addr, at);
            }
        }
    }
}
