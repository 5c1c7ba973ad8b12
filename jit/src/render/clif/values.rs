//! The code of each kernel IR instruction, written once for any lane count: constants, index arithmetic, loads
//! and stores, libcalls, and the unary / binary / cast table.

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

    pub(super) fn libcall(&mut self, l: Libcall, args: &[Value]) -> Value {
        let f = match self.libcalls.get(&l) {
            Some(&f) => f,
            None => {
                let sig = self.b.import_signature(l.signature(self.call_conv));
                let name = self.b.func.declare_imported_user_function(UserExternalName::new(0, l.index()));
                let f = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature: sig,
                    colocated: false,
                    patchable: false,
                });
                self.libcalls.insert(l, f);
                f
            }
        };
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// Applies a scalar operation lane by lane (for ops with no vector instruction).
    pub(super) fn per_lane(
        &mut self,
        args: &[Value],
        arg_d: DType,
        out_d: DType,
        lanes: usize,
        f: impl Fn(&mut Self, &[Value]) -> Value,
    ) -> Value {
        if lanes == 1 {
            return f(self, args);
        }
        let mut out = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let xs: Vec<Value> = args
                .iter()
                .map(|&a| {
                    let x = self.b.ins().extractlane(a, l as u8);
                    if arg_d == DType::Bool {
                        // A lane mask (all ones or zero) becomes this backend's scalar bool (1 or 0).
                        let b = self.b.ins().ireduce(types::I8, x);
                        self.b.ins().band_imm_s(b, 1)
                    } else {
                        x
                    }
                })
                .collect();
            out.push(f(self, &xs));
        }
        let out: Vec<Value> =
            out.into_iter().map(|v| if out_d == DType::Bool { self.b.ins().band_imm_s(v, 1) } else { v }).collect();
        self.lanes_from_scalars(&out, out_d, lanes)
    }

    /// Emits `insts` for every element of a `rows` x `vecs` tile. Returns, per instruction, its value for each
    /// element (row-major in the tile). An instruction that does not depend on the row (or column) is emitted once
    /// and its value shared along that axis. `accs` holds each element's finished reduction.
    pub(super) fn tile_insts(
        &mut self,
        insts: &[Inst],
        deps: &[(bool, bool)],
        rows: usize,
        vecs: usize,
        lanes: usize,
        accs: &[Value],
    ) -> Vec<Vec<Value>> {
        let n = rows * vecs;
        let mut vals: Vec<Vec<Value>> = Vec::with_capacity(insts.len());
        for (i, inst) in insts.iter().enumerate() {
            let (dr, dc) = deps[i];
            let mut per: Vec<Value> = Vec::with_capacity(n);
            for e in 0..n {
                let (r, c) = (e / vecs, e % vecs);
                // The element whose value this one shares (itself if it depends on both axes).
                let owner = if dr { r } else { 0 } * vecs + if dc { c } else { 0 };
                if owner != e {
                    per.push(per[owner]);
                    continue;
                }
                self.at = (r as i64, (c * lanes) as i64);
                // A value that does not vary along the vector lanes is computed once, as a scalar.
                // (Along a vectorized reduce loop only values without lanes are: a gather's i64 index.)
                let l = if lanes > 1 && !dc && (!self.reduce_vec || !has_lanes(inst.dtype)) { 1 } else { lanes };
                let key = inst as *const Inst;
                let v = if let Some(&u) = self.uniform_insts.get(&key).or_else(|| self.row_insts.get(&key)) {
                    u
                } else {
                    match self.hoisted_load(i, inst.dtype, l) {
                        Some(v) if matches!(inst.op, InstOp::Load { .. }) => v,
                        _ => self.inst(inst, insts, &vals, e, l, accs.get(e).copied()),
                    }
                };
                per.push(v);
            }
            vals.push(per);
        }
        self.at = (0, 0);
        vals
    }

    /// One instruction for tile element `e` (at `self.at`); operands come from `vals[..][e]`.
    pub(super) fn inst(
        &mut self,
        inst: &Inst,
        insts: &[Inst],
        vals: &[Vec<Value>],
        e: usize,
        lanes: usize,
        acc: Option<Value>,
    ) -> Value {
        let d = inst.dtype;
        let operands: Vec<usize> = match &inst.op {
            // The index is read as it is: one scalar for every lane where it does not vary along the vector (an
            // embedding's row), lanes otherwise (an i64 index has no vector form, so it is never splatted).
            InstOp::Gather { .. } => Vec::new(),
            _ => inst.operands(),
        };
        let mut ready: Vec<(usize, Value)> = Vec::with_capacity(operands.len());
        for &i in &operands {
            let v = self.vector_of(vals[i][e], insts[i].dtype, lanes);
            ready.push((i, v));
        }
        let val = |i: usize| ready.iter().find(|(j, _)| *j == i).map_or(vals[i][e], |&(_, v)| v);
        match &inst.op {
            InstOp::Const(s) => self.konst(*s, d, lanes),
            InstOp::Index(x) => {
                // A 32-bit index has lanes (an iota along a vectorized loop): lane 0's value plus the lane times
                // its step where it is affine in the vectorized variable, else one scalar per lane.
                let affine = x.affine(self.vars.len()).zip(self.col_dim).map(|((coef, _), col)| coef[col]);
                if let (true, Some(step)) = (lanes > 1, affine) {
                    let v0 = self.iexpr(x, 0);
                    let v0 = self.int_resize(v0, DType::I64, d);
                    let base = self.b.ins().splat(ty(d, lanes), v0);
                    let bytes: Vec<u8> = (0..lanes as i64).flat_map(|l| ((step * l) as i32).to_le_bytes()).collect();
                    let offsets = self.b.func.dfg.constants.insert(bytes.into());
                    let offsets = self.b.ins().vconst(ty(d, lanes), offsets);
                    return self.b.ins().iadd(base, offsets);
                }
                let scalars: Vec<Value> = (0..lanes as i64)
                    .map(|l| {
                        let v = self.iexpr(x, l);
                        self.int_resize(v, DType::I64, d)
                    })
                    .collect();
                if lanes == 1 { scalars[0] } else { self.lanes_from_scalars(&scalars, d, lanes) }
            }
            InstOp::Load { buf, index, valid, fill } => self.load(*buf, index, valid, *fill, d, lanes),
            InstOp::Gather { buf, base, index, stride, len, valid } => {
                let at = Gathered { buf: *buf, base, stride: *stride, len: *len, valid };
                self.gather(at, vals[*index][e], insts[*index].dtype, d, lanes)
            }
            InstOp::Rand { dist, slot, index } => {
                let i = self.iexpr(index, 0);
                let seed = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16) as i32);
                let off = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.rng, (*slot * 16 + 8) as i32);
                let i = self.b.ins().iadd(off, i);
                match (dist, d) {
                    (RandDist::Uniform, DType::F32) => self.libcall(Libcall::UniformF32, &[seed, i]),
                    (RandDist::Uniform, DType::F16) => self.libcall(Libcall::UniformF16, &[seed, i]),
                    (RandDist::Normal, DType::F16) => self.libcall(Libcall::NormalF16, &[seed, i]),
                    (RandDist::Uniform, DType::BF16) => self.libcall(Libcall::UniformBF16, &[seed, i]),
                    (RandDist::Normal, DType::BF16) => {
                        // As the interpreter: the f64 normal through f32 to bf16 (`dtype::bf16_from_f64`).
                        let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                        let x = self.b.ins().fdemote(types::F32, x);
                        self.round_half(DType::BF16, x, 1)
                    }
                    (RandDist::Uniform, _) => self.libcall(Libcall::UniformF64, &[seed, i]),
                    (RandDist::Normal, DType::F32) => {
                        let x = self.libcall(Libcall::NormalF64, &[seed, i]);
                        self.b.ins().fdemote(types::F32, x)
                    }
                    (RandDist::Normal, _) => self.libcall(Libcall::NormalF64, &[seed, i]),
                }
            }
            InstOp::Unary(u, a) => self.unary(*u, d, lanes, val(*a)),
            InstOp::Binary(op, x, y) => self.binary(*op, insts[*x].dtype, lanes, val(*x), val(*y)),
            InstOp::Where(c, a, b) => {
                if lanes == 1 {
                    self.b.ins().select(val(*c), val(*a), val(*b))
                } else {
                    let mask = if ty(d, lanes) == types::F32X4 {
                        let little = MemFlagsData::new().with_endianness(Endianness::Little);
                        self.b.ins().bitcast(types::F32X4, little, val(*c))
                    } else {
                        val(*c)
                    };
                    self.b.ins().bitselect(mask, val(*a), val(*b))
                }
            }
            InstOp::Cast(a) => self.cast(insts[*a].dtype, d, lanes, val(*a)),
            InstOp::Acc => acc.expect("acc only in reduce kernels"),
            InstOp::RowAcc(j) => {
                let v = self.row_accs[*j];
                if lanes > 1 { self.vector_of(v, d, lanes) } else { v }
            }
        }
    }

    pub(super) fn unary(&mut self, u: UnaryOp, d: DType, lanes: usize, a: Value) -> Value {
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (negation and abs are exact).
            let r = self.unary(u, DType::F32, lanes, a);
            return if matches!(u, UnaryOp::Neg | UnaryOp::Abs) { r } else { self.round_half(d, r, lanes) };
        }
        if let Some(l) = Libcall::unary(u, d) {
            if matches!(u, UnaryOp::Log1p | UnaryOp::Expm1) {
                // No vector form: libm's, a lane at a time (the evaluator's value, bit for bit).
                return self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
            }
            return self.transcendental(u, l, d, lanes, a);
        }
        let ins = self.b.ins();
        match (u, d.is_float()) {
            (UnaryOp::Neg, true) => ins.fneg(a),
            (UnaryOp::Neg, false) => ins.ineg(a),
            (UnaryOp::Abs, true) => ins.fabs(a),
            (UnaryOp::Abs, false) if d.is_unsigned() => a, // iabs would read the bits as signed
            (UnaryOp::Abs, false) => ins.iabs(a),
            (UnaryOp::Sqrt, _) => ins.sqrt(a),
            // Floats only (the graph refuses them on ints); `nearest` rounds ties to even.
            (UnaryOp::Floor, _) => ins.floor(a),
            (UnaryOp::Ceil, _) => ins.ceil(a),
            (UnaryOp::Round, _) => ins.nearest(a),
            (UnaryOp::Trunc, _) => ins.trunc(a),
            (UnaryOp::Recip, _) => {
                let one = self.konst(Scalar::Float(1.0), d, lanes);
                self.b.ins().fdiv(one, a)
            }
            (UnaryOp::Not, _) if lanes == 1 => ins.bxor_imm_s(a, 1),
            (UnaryOp::Not, _) => ins.bnot(a),
            // Transcendentals took the libcall path above (floats only; an integer one is refused at the op).
            (
                op @ (UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Log1p
                | UnaryOp::Expm1),
                _,
            ) => {
                unreachable!("unary {op:?} on {d}")
            }
        }
    }

    /// exp/log/sin/cos/tanh inline from `clif_math` (the same polynomial in vector and scalar code, so an element's
    /// value does not depend on whether it fell in a vector body or a tail). sin/cos beyond the range where the
    /// reduction is accurate branch to the libcall for the whole vector; that branch is never taken in practice.
    pub(super) fn transcendental(&mut self, u: UnaryOp, l: Libcall, d: DType, lanes: usize, a: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        let f = match u {
            UnaryOp::Exp => clif_math::MathFn::Exp,
            UnaryOp::Log => clif_math::MathFn::Log,
            UnaryOp::Sin => clif_math::MathFn::Sin,
            UnaryOp::Cos => clif_math::MathFn::Cos,
            UnaryOp::Tanh => clif_math::MathFn::Tanh,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Not
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Trunc
            | UnaryOp::Log1p
            | UnaryOp::Expm1 => unreachable!("{u:?} is not one of clif_math's"),
        };
        let fast = clif_math::emit(f, &mut self.b, a, t, self.fma);
        if !matches!(u, UnaryOp::Sin | UnaryOp::Cos) {
            return fast;
        }
        let max = if d == DType::F64 { clif_math::F64_TRIG_MAX_ARG } else { clif_math::F32_TRIG_MAX_ARG };
        let limit = self.konst(Scalar::Float(max), d, lanes);
        let abs = self.b.ins().fabs(a);
        let big = self.b.ins().fcmp(FloatCC::GreaterThan, abs, limit);
        let any = if lanes > 1 { self.b.ins().vany_true(big) } else { big };
        let slow_block = self.b.create_block();
        let merge = self.b.create_block();
        let result = self.b.append_block_param(merge, t);
        self.b.ins().brif(any, slow_block, &[], merge, &[fast.into()]);
        self.b.switch_to_block(slow_block);
        self.b.seal_block(slow_block);
        let slow = self.per_lane(&[a], d, d, lanes, |s, x| s.libcall(l, x));
        self.b.ins().jump(merge, &[slow.into()]);
        self.b.switch_to_block(merge);
        self.b.seal_block(merge);
        result
    }

    /// `op` on operands of dtype `d` (the result is bool for comparisons).
    pub(super) fn binary(&mut self, op: BinaryOp, d: DType, lanes: usize, x: Value, y: Value) -> Value {
        use BinaryOp::*;
        if d.is_half() {
            // Computed in f32, rounded to f16 or bf16 (comparisons, max and min are exact).
            let r = self.binary(op, DType::F32, lanes, x, y);
            return if op.is_comparison() || matches!(op, Max | Min) { r } else { self.round_half(d, r, lanes) };
        }
        let unsigned = d.is_unsigned();
        if d.is_float() {
            let cmp = |cc| -> Option<FloatCC> { Some(cc) };
            let cc = match op {
                Lt => cmp(FloatCC::LessThan),
                Le => cmp(FloatCC::LessThanOrEqual),
                Eq => cmp(FloatCC::Equal),
                Ne => cmp(FloatCC::NotEqual),
                Add | Sub | Mul | Div | Rem | Max | Min | Pow | And | Or => None,
            };
            if let Some(cc) = cc {
                return self.b.ins().fcmp(cc, x, y);
            }
            return match op {
                Add => self.b.ins().fadd(x, y),
                Sub => self.b.ins().fsub(x, y),
                Mul => self.b.ins().fmul(x, y),
                Div => self.b.ins().fdiv(x, y),
                Max => self.b.ins().fmax(x, y),
                Min => self.b.ins().fmin(x, y),
                Pow => {
                    let l = if d == DType::F64 { Libcall::PowF64 } else { Libcall::PowF32 };
                    self.per_lane(&[x, y], d, d, lanes, |s, a| s.libcall(l, a))
                }
                Rem => {
                    let l = if d == DType::F64 { Libcall::FmodF64 } else { Libcall::FmodF32 };
                    self.per_lane(&[x, y], d, d, lanes, |s, a| s.libcall(l, a))
                }
                And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on floats"),
            };
        }
        let cc = match op {
            Lt if unsigned => Some(IntCC::UnsignedLessThan),
            Le if unsigned => Some(IntCC::UnsignedLessThanOrEqual),
            Lt => Some(IntCC::SignedLessThan),
            Le => Some(IntCC::SignedLessThanOrEqual),
            Eq => Some(IntCC::Equal),
            Ne => Some(IntCC::NotEqual),
            Add | Sub | Mul | Div | Rem | Max | Min | Pow | And | Or => None,
        };
        if let Some(cc) = cc {
            // Vector compares give lane masks, scalar compares 0/1 bytes: both are this backend's bools.
            return self.b.ins().icmp(cc, x, y);
        }
        let is_bool = d == DType::Bool;
        match op {
            Add | Or if is_bool => self.b.ins().bor(x, y),
            Mul | And if is_bool => self.b.ins().band(x, y),
            Max if is_bool => self.b.ins().bor(x, y),
            Min if is_bool => self.b.ins().band(x, y),
            Add => self.b.ins().iadd(x, y),
            Sub => self.b.ins().isub(x, y),
            Mul => self.b.ins().imul(x, y),
            Max if unsigned => self.b.ins().umax(x, y),
            Min if unsigned => self.b.ins().umin(x, y),
            Max => self.b.ins().smax(x, y),
            Min => self.b.ins().smin(x, y),
            Div => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned, false)),
            Rem => self.per_lane(&[x, y], d, d, lanes, |s, a| s.safe_div(a[0], a[1], unsigned, true)),
            Pow => self.per_lane(&[x, y], d, d, lanes, |s, a| {
                let wide = [s.int_resize(a[0], d, DType::I64), s.int_resize(a[1], d, DType::I64)];
                let r = s.libcall(Libcall::PowI64, &wide);
                s.int_resize(r, DType::I64, d)
            }),
            And | Or | Lt | Le | Eq | Ne => unreachable!("{op:?} on {d}"),
        }
    }

    /// Integer division (or, with `rem`, remainder) that never traps: x / 0 == x % 0 == 0, MIN / -1 wraps to MIN
    /// and MIN % -1 is 0 (the divisor is made 1 where it is 0 or -1, and those cases selected after).
    pub(super) fn safe_div(&mut self, x: Value, y: Value, unsigned: bool, rem: bool) -> Value {
        let t = self.b.func.dfg.value_type(x);
        let zero = self.b.ins().iconst(t, 0);
        let one = self.b.ins().iconst(t, 1);
        let is_zero = self.b.ins().icmp(IntCC::Equal, y, zero);
        let safe = self.b.ins().select(is_zero, one, y);
        let r = match (unsigned, rem) {
            (true, false) => self.b.ins().udiv(x, safe),
            (true, true) => self.b.ins().urem(x, safe),
            (false, _) => {
                let is_neg_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let safe = self.b.ins().select(is_neg_one, one, safe);
                if rem {
                    // x % 1 is 0, as x % -1 must be.
                    self.b.ins().srem(x, safe)
                } else {
                    let q = self.b.ins().sdiv(x, safe);
                    let neg = self.b.ins().ineg(x);
                    self.b.ins().select(is_neg_one, neg, q)
                }
            }
        };
        self.b.ins().select(is_zero, zero, r)
    }

    /// Converts a scalar integer between int dtypes (wrapping when narrowing; bool means != 0).
    pub(super) fn int_resize(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        if to == DType::Bool {
            return self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0);
        }
        let (ft, tt) = (ty(from, 1), ty(to, 1));
        if ft.bits() == tt.bits() {
            v
        } else if ft.bits() > tt.bits() {
            self.b.ins().ireduce(tt, v)
        } else if from.is_unsigned() {
            self.b.ins().uextend(tt, v)
        } else {
            self.b.ins().sextend(tt, v)
        }
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, lanes: usize, v: Value) -> Value {
        if from == to {
            return v;
        }
        // f16 and bf16 are f32s in registers: widening is free, narrowing is a rounding. An int converts to f32
        // first: exact below 2^24, and anything larger is inf in f16 either way, so the double rounding is
        // innocuous there (for bf16 it is PyTorch's conversion).
        match (from, to) {
            (DType::F16, DType::F32) => return v,
            (DType::F16, _) => return self.cast(DType::F32, to, lanes, v),
            (DType::F64, DType::F16) => {
                return self.per_lane(&[v], from, to, lanes, |s, x| s.libcall(Libcall::F64ToF16, x));
            }
            (_, DType::F16) => {
                let f = self.cast(from, DType::F32, lanes, v);
                return self.round_half(DType::F16, f, lanes);
            }
            // bf16 likewise; every source, f64 included, goes through f32 first, as PyTorch converts.
            (DType::BF16, DType::F32) => return v,
            (DType::BF16, _) => return self.cast(DType::F32, to, lanes, v),
            (_, DType::BF16) => {
                let f = self.cast(from, DType::F32, lanes, v);
                return self.round_half(DType::BF16, f, lanes);
            }
            _ => {}
        }
        if lanes > 1 {
            return match (from, to) {
                (DType::I32, DType::F32) => self.b.ins().fcvt_from_sint(types::F32X4, v),
                (DType::Bool, DType::F32) => {
                    let (one, zero) =
                        (self.konst(Scalar::Float(1.0), to, lanes), self.konst(Scalar::Float(0.0), to, lanes));
                    let m =
                        self.b.ins().bitcast(types::F32X4, MemFlagsData::new().with_endianness(Endianness::Little), v);
                    self.b.ins().bitselect(m, one, zero)
                }
                (DType::Bool, DType::I32 | DType::U32) => {
                    let one = self.konst(Scalar::Int(1), to, lanes);
                    self.b.ins().band(v, one)
                }
                // Same lane width, same bits: the wrapping conversion of eval.
                (DType::I32, DType::U32) | (DType::U32, DType::I32) => v,
                (DType::F32, DType::Bool) => {
                    let zero = self.konst(Scalar::Float(0.0), from, lanes);
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                }
                (DType::I32 | DType::U32, DType::Bool) => {
                    let zero = self.konst(Scalar::Int(0), from, lanes);
                    self.b.ins().icmp(IntCC::NotEqual, v, zero)
                }
                // float -> int saturates through i64 then wraps; do it lane by lane to match the spec exactly.
                _ => self.per_lane(&[v], from, to, lanes, |s, x| s.cast(from, to, 1, x[0])),
            };
        }
        match (from.is_float(), to.is_float()) {
            (true, true) => {
                if to == DType::F64 {
                    self.b.ins().fpromote(types::F64, v)
                } else {
                    self.b.ins().fdemote(types::F32, v)
                }
            }
            (true, false) if to == DType::Bool => {
                let zero = self.konst(Scalar::Float(0.0), from, 1);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (true, false) => {
                let wide = self.b.ins().fcvt_to_sint_sat(types::I64, v);
                self.int_resize(wide, DType::I64, to)
            }
            (false, true) => {
                let t = ty(to, 1);
                if from.is_unsigned() { self.b.ins().fcvt_from_uint(t, v) } else { self.b.ins().fcvt_from_sint(t, v) }
            }
            (false, false) => self.int_resize(v, from, to),
        }
    }
}
