//! Loop nests of a kernel: output loops (split over threads on loop 0), register tiles, row blocks, and the
//! reduction loops inside each tile, scalar or vectorized along K.

use super::*;

/// Output elements below which an elementwise kernel is rendered without its unrolled body: it runs in
/// microseconds either way, while each unrolled copy of a body with many loads costs compile time (a gradient
/// norm's 52-element stack of 24 masked loads compiled in 15-18 ms unrolled, 3 ms without; the first step of a
/// 4-layer GPT compiled 49 ms of Cranelift code, 24 without). Larger kernels keep it: their code is cached on
/// disk, their run time is paid every step.
pub(super) const UNROLL_MIN_ELEMENTS: usize = 4096;

impl Emitter<'_> {
    /// Output loops from `dim` inward. A register-tiled kernel walks its last two output dims as a GEMM does:
    /// blocks of `TileConfig::block_rows` rows (a block of A stays in L2), and within a block, column tiles outer and row tiles
    /// inner (a column panel of B stays in L1 while every row tile of the block uses it).
    pub(super) fn loops(&mut self, dim: usize, lo: Value, hi: Value) {
        if dim == self.k.row_rank && !self.k.rows.is_empty() {
            // Every loop of a row is inside: fold the row reductions here, once per row.
            self.fold_rows();
            self.loops_from(dim, lo, hi);
            self.row_accs.clear();
        } else {
            self.loops_from(dim, lo, hi);
        }
    }

    fn loops_from(&mut self, dim: usize, lo: Value, hi: Value) {
        let rank = self.k.out_rank();
        if dim + 1 == rank {
            // In the body of the loop around the innermost one (a row), what is the same for the whole row.
            let per_row = rank >= 2 && !self.tiled && self.compute_row_invariants();
            self.col_loops(lo, hi, 1);
            if per_row {
                self.row_insts.clear();
            }
            return;
        }
        let var = self.vars[dim];
        if self.tiled && dim + 2 == rank {
            let block = self.b.declare_var(types::I64);
            self.b.def_var(block, lo);
            self.step_loop(block, hi, self.tile_cfg.block_rows.max(1) as i64, |s, first, last| {
                s.row_block(first, last)
            });
            return;
        }
        let inner_extent = self.k.out_extents[dim + 1] as i64;
        self.b.def_var(var, lo);
        self.counted_loop(var, hi, 1, |s| {
            let (zero, n) = (s.b.ins().iconst(types::I64, 0), s.b.ins().iconst(types::I64, inner_extent));
            s.loops(dim + 1, zero, n);
        });
    }

    /// Rows `first..last` of a tiled kernel: for each column step (tiles, single vectors, scalars), all row tiles.
    pub(super) fn row_block(&mut self, first: Value, last: Value) {
        let rank = self.k.out_rank();
        let (row, col) = (self.vars[rank - 2], self.vars[rank - 1]);
        let zero = self.b.ins().iconst(types::I64, 0);
        let cols = self.b.ins().iconst(types::I64, self.k.out_extents[rank - 1] as i64);
        self.b.def_var(col, zero);
        for (step, vecs, lanes) in self.col_steps() {
            self.counted_loop(col, cols, step as i64, |s| {
                s.b.def_var(row, first);
                let rows = s.tile_cfg.rows.max(1);
                s.counted_loop(row, last, rows as i64, |s| s.tile(rows, vecs, lanes));
                s.counted_loop(row, last, 1, |s| s.tile(1, vecs, lanes));
            });
        }
    }

    /// `while var < hi { body(var, min(var + step, hi)); var += step }`.
    pub(super) fn step_loop(
        &mut self,
        var: Variable,
        hi: Value,
        step: i64,
        body: impl FnOnce(&mut Self, Value, Value),
    ) {
        self.loop_while(
            var,
            |s, v| s.b.ins().icmp(IntCC::SignedLessThan, v, hi),
            |s, v| {
                let end = s.b.ins().iadd_imm_s(v, step);
                let end = s.b.ins().smin(end, hi);
                body(s, v, end);
                end
            },
        );
    }

    /// The steps of the innermost loop as (columns per step, vectors, lanes): several vectors at a time
    /// (independent dependency chains for the out-of-order core; in a GEMM, a 4 x 8 register tile; in a column sum,
    /// whole cache lines per row), one vector, then scalars. Bodies that can never run for this extent are not
    /// rendered, and an elementwise kernel of fewer than [`UNROLL_MIN_ELEMENTS`] elements gets no unrolled body.
    pub(super) fn col_steps(&self) -> Vec<(usize, usize, usize)> {
        let innermost = self.k.out_extents.last().copied().unwrap_or(0);
        let mut steps = Vec::with_capacity(3);
        let vecs = match (&self.k.reduce, self.tiled) {
            (None, _) => self.tile_cfg.elementwise_vecs,
            (Some(_), true) => self.tile_cfg.vecs,
            (Some(_), false) if self.k.rows.is_empty() => self.tile_cfg.column_vecs,
            // A row kernel: one vector of a row's elements at a time, each with its rows' reductions.
            (Some(_), false) => self.tile_cfg.vecs,
        }
        .max(1);
        let small = self.k.reduce.is_none() && self.k.out_extents.iter().product::<usize>() < UNROLL_MIN_ELEMENTS;
        if self.vec_ok && vecs > 1 && innermost >= vecs * LANES && !small {
            steps.push((vecs * LANES, vecs, LANES));
        }
        if self.vec_ok {
            steps.push((LANES, 1, LANES));
        }
        steps.push((1, 1, 1));
        steps
    }

    /// The innermost output loop over `lo..hi`, for `rows` rows at once.
    pub(super) fn col_loops(&mut self, lo: Value, hi: Value, rows: usize) {
        let var = self.vars[self.k.out_rank() - 1];
        self.b.def_var(var, lo);
        for (step, vecs, lanes) in self.col_steps() {
            self.counted_loop(var, hi, step as i64, |s| s.tile(rows, vecs, lanes));
        }
    }

    /// `while var + step <= hi { body; var += step }`, continuing from `var`'s current value.
    pub(super) fn counted_loop(&mut self, var: Variable, hi: Value, step: i64, body: impl FnOnce(&mut Self)) {
        self.loop_while(
            var,
            |s, v| {
                let next = s.b.ins().iadd_imm_s(v, step);
                s.b.ins().icmp(IntCC::SignedLessThanOrEqual, next, hi)
            },
            |s, _| {
                body(s);
                let v = s.b.use_var(var);
                s.b.ins().iadd_imm_s(v, step)
            },
        );
    }

    /// The one loop skeleton: `while test(var) { var = body(var) }`. `body` gets `var`'s value on entry and
    /// returns its next value.
    fn loop_while(
        &mut self,
        var: Variable,
        test: impl FnOnce(&mut Self, Value) -> Value,
        body: impl FnOnce(&mut Self, Value) -> Value,
    ) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let v = self.b.use_var(var);
        let go = test(self, v);
        self.b.ins().brif(go, body_block, &[], exit, &[]);
        self.b.switch_to_block(body_block);
        self.b.seal_block(body_block);
        let v = self.b.use_var(var);
        let next = body(self, v);
        self.b.def_var(var, next);
        self.b.ins().jump(header, &[]);
        self.b.seal_block(header);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// A `rows` x `vecs` tile of output elements, each `lanes` wide, at the current loop variables: the reduction
    /// (instructions that do not depend on the row or the column are emitted once for the tile, so a GEMM loads
    /// each B vector once per k for all rows and each A element once for all columns), then the outer code and
    /// the store of each element.
    pub(super) fn tile(&mut self, rows: usize, vecs: usize, lanes: usize) {
        let k = self.k;
        // A row kernel whose rows are its output elements (a reduction reading row reductions) folds them here.
        let per_element_rows = !k.rows.is_empty() && k.row_rank == k.out_rank();
        if per_element_rows {
            debug_assert_eq!((rows, vecs, lanes), (1, 1, 1), "one row at a time");
            self.fold_rows();
        }
        self.tile_body(rows, vecs, lanes);
        if per_element_rows {
            self.row_accs.clear();
        }
    }

    fn tile_body(&mut self, rows: usize, vecs: usize, lanes: usize) {
        let k = self.k;
        let n = rows * vecs;
        let accs: Vec<Value> = match &k.reduce {
            Some(r) if self.reduce_vec => {
                debug_assert_eq!((rows, vecs, lanes), (1, 1, 1));
                vec![self.fold_vectorized(r)]
            }
            Some(r) => {
                let vars: Vec<Variable> = (0..n).map(|_| self.b.declare_var(ty(r.dtype, lanes))).collect();
                for &v in &vars {
                    let init = self.init(r.op, r.dtype, lanes);
                    self.b.def_var(v, init);
                }
                self.hoist_loads(&r.inner, lanes);
                let deps = std::mem::take(&mut self.inner_deps);
                self.reduce_loops(r, &deps, 0, &vars, rows, vecs, lanes);
                self.inner_deps = deps;
                self.hoisted.clear();
                vars.iter().map(|&v| self.b.use_var(v)).collect()
            }
            None => Vec::new(),
        };
        let deps = std::mem::take(&mut self.outer_deps);
        let vals = self.tile_insts(&k.outer, &deps, rows, vecs, lanes, &accs);
        self.outer_deps = deps;
        for (e, &v) in vals[k.result].iter().enumerate() {
            self.at = ((e / vecs) as i64, ((e % vecs) * lanes) as i64);
            let out_index = self.out_index.clone();
            // The output is row-major, so its index moves by 1 along the column dim (when there is one).
            let (o, col) =
                if self.col_dim.is_some() { self.iexpr_tile_col0(&out_index) } else { (self.iexpr(&out_index, 0), 0) };
            let v = self.vector_of(v, k.output.dtype, lanes);
            self.store(o, col, v, lanes);
        }
        self.at = (0, 0);
    }

    /// Precomputes, for each unmasked affine load of the inner code, the part of its address that the reduction
    /// loops do not change, so the loop body adds only the reduce-variable part (strength reduction that
    /// Cranelift does not do across our nested loops).
    pub(super) fn hoist_loads(&mut self, inner: &[Inst], lanes: usize) {
        let rank = self.k.out_rank();
        let nvars = self.vars.len();
        for (i, inst) in inner.iter().enumerate() {
            let InstOp::Load { buf, index, valid: None, .. } = &inst.op else { continue };
            if self.k.inputs[*buf].len == 0 {
                continue;
            }
            let Some((coef, c)) = index.affine(nvars) else { continue };
            let col = self.col_dim.map_or(0, |d| coef[d]);
            if lanes > 1
                && !(col == 0
                    || (col == 1
                        && matches!(inst.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::I32 | DType::U32)))
            {
                continue; // gathers keep the general path
            }
            let outer: Vec<i64> = (0..nvars).map(|v| if v < rank { coef[v] } else { 0 }).collect();
            let reduce: Vec<i64> = (0..nvars).map(|v| if v < rank { 0 } else { coef[v] }).collect();
            let p = self.iexpr(&IExpr::from_affine(&outer, c), 0);
            let bytes = self.b.ins().imul_imm_s(p, inst.dtype.size_of() as i64);
            let base = self.b.ins().iadd(self.bases[*buf], bytes);
            self.hoisted.insert(i, (base, IExpr::from_affine(&reduce, 0), coef));
        }
    }

    /// A hoisted load at the current tile offset.
    pub(super) fn hoisted_load(&mut self, i: usize, d: DType, lanes: usize) -> Option<Value> {
        let (base, reduce, coef) = self.hoisted.get(&i).cloned()?;
        let col = self.col_dim.map_or(0, |c| coef[c]);
        let row = self.row_dim.map_or(0, |r| coef[r]);
        let offset = (row * self.at.0 + col * self.at.1) * d.size_of() as i64;
        let r = self.iexpr(&reduce, 0);
        let r = self.b.ins().imul_imm_s(r, d.size_of() as i64);
        let addr = self.b.ins().iadd(base, r);
        if lanes > 1 && col == 1 {
            if d.is_half() {
                return Some(self.load_halfx4(d, addr, offset as i32));
            }
            return Some(self.b.ins().load(ty(d, lanes), vector_flags(), addr, offset as i32));
        }
        let v = if d.is_half() {
            self.load_half(d, addr, offset as i32)
        } else {
            self.b.ins().load(ty(d, 1), MemFlagsData::trusted(), addr, offset as i32)
        };
        Some(if lanes > 1 { self.lanes_from_scalars(&[v], d, lanes) } else { v })
    }

    /// Reduce loops whose innermost loop runs `vaccs.len()` vectors of 4 lanes at a time ([`REDUCE_VECS`] where the
    /// loop is long enough, else 1), each into its own accumulator, then single vectors into `vaccs[0]`, then a
    /// scalar tail into `sacc`.
    ///
    /// Several accumulators, because one is a single dependency chain: a float `max` is eight instructions in
    /// Cranelift's lowering (NaN and signed-zero rules) and each vector waited for the previous one, so a row max
    /// ran at ~10 cycles per 4 elements (1.55 ms for 4096 x 1024 on 2 threads, 3x a pass over memory).
    pub(super) fn reduce_loops_vec(&mut self, r: &Reduce, level: usize, vaccs: &[Variable], sacc: Variable) {
        let var = self.vars[self.k.out_rank() + level];
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().iconst(types::I64, r.extents[level] as i64);
        self.b.def_var(var, zero);
        if level + 1 < r.extents.len() {
            self.counted_loop(var, n, 1, |s| s.reduce_loops_vec(r, level + 1, vaccs, sacc));
            return;
        }
        // Which instructions vary along the reduce loop (the tile's column axis here), so that a value that does
        // not is computed once per group of vectors rather than once per vector.
        let rank = self.k.out_rank();
        let col = rank + r.extents.len() - 1;
        let deps = deps_on(&r.inner, None, Some(col), self.k.row_rank);
        let groups: &[(usize, usize)] =
            if vaccs.len() > 1 { &[(vaccs.len(), LANES), (1, LANES), (1, 1)] } else { &[(1, LANES), (1, 1)] };
        for &(vecs, lanes) in groups {
            self.counted_loop(var, n, (vecs * lanes) as i64, |s| {
                let vals = s.tile_insts(&r.inner, &deps, 1, vecs, lanes, &[]);
                for (e, &v) in vals[r.value].iter().enumerate() {
                    let acc = if lanes == 1 { sacc } else { vaccs[e] };
                    let a = s.b.use_var(acc);
                    let folded = s.fold(r.op, r.dtype, lanes, a, v);
                    s.b.def_var(acc, folded);
                }
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce_loops(
        &mut self,
        r: &Reduce,
        deps: &[(bool, bool)],
        level: usize,
        accs: &[Variable],
        rows: usize,
        vecs: usize,
        lanes: usize,
    ) {
        if level == r.extents.len() {
            let vals = self.tile_insts(&r.inner, deps, rows, vecs, lanes, &[]);
            let fma_operands = match r.inner[r.value].op {
                InstOp::Binary(BinaryOp::Mul, x, y) if self.fma && r.op == ReduceOp::Sum && r.dtype.is_float() => {
                    Some((x, y))
                }
                _ => None,
            };
            for (e, &acc) in accs.iter().enumerate() {
                let a = self.b.use_var(acc);
                let folded = match fma_operands {
                    Some((x, y)) => {
                        let (x, y) =
                            (self.vector_of(vals[x][e], r.dtype, lanes), self.vector_of(vals[y][e], r.dtype, lanes));
                        self.b.ins().fma(x, y, a)
                    }
                    None => {
                        let x = self.vector_of(vals[r.value][e], r.dtype, lanes);
                        self.fold(r.op, r.dtype, lanes, a, x)
                    }
                };
                self.b.def_var(acc, folded);
            }
            return;
        }
        let var = self.vars[self.k.out_rank() + level];
        let zero = self.b.ins().iconst(types::I64, 0);
        let n = self.b.ins().iconst(types::I64, r.extents[level] as i64);
        self.b.def_var(var, zero);
        self.counted_loop(var, n, 1, |s| s.reduce_loops(r, deps, level + 1, accs, rows, vecs, lanes));
    }

    /// `vaccs` folded pairwise, (a0 + a1) + (a2 + a3), then across the lanes into the scalar `sacc`.
    fn combine_lanes(&mut self, r: &Reduce, vaccs: &[Variable], sacc: Variable) -> Value {
        let mut parts: Vec<Value> = vaccs.iter().map(|&a| self.b.use_var(a)).collect();
        while parts.len() > 1 {
            parts = parts
                .chunks(2)
                .map(|p| if p.len() == 2 { self.fold(r.op, r.dtype, LANES, p[0], p[1]) } else { p[0] })
                .collect();
        }
        let (v, mut s) = (parts[0], self.b.use_var(sacc));
        for l in 0..LANES {
            let x = self.b.ins().extractlane(v, l as u8);
            s = self.fold(r.op, r.dtype, 1, s, x);
        }
        s
    }

    /// Folds the current row's reductions (`KernelIr::rows`) in order into `row_accs`, each along its innermost
    /// reduce loop 4 lanes at a time where its code fits the lane model (as `reduce_loops_vec`), else scalar.
    pub(super) fn fold_rows(&mut self) {
        let k = self.k;
        for r in &k.rows {
            let v = if self.vectorize && lanes_fold(r) {
                self.fold_vectorized(r)
            } else {
                let sacc = self.b.declare_var(ty(r.dtype, 1));
                let sinit = self.init(r.op, r.dtype, 1);
                self.b.def_var(sacc, sinit);
                let deps = deps_on(&r.inner, None, None, k.row_rank);
                self.reduce_loops(r, &deps, 0, &[sacc], 1, 1, 1);
                self.b.use_var(sacc)
            };
            self.row_accs.push(v);
        }
    }

    /// `r` folded at the current output position along its innermost reduce loop, 4 lanes at a time into
    /// [`REDUCE_VECS`] accumulators (one where the loop is too short for a group: less code to compile), the
    /// remainder scalar; combined into one scalar.
    fn fold_vectorized(&mut self, r: &Reduce) -> Value {
        let saved = (self.col_dim, self.reduce_vec);
        self.col_dim = Some(self.k.out_rank() + r.extents.len() - 1);
        self.reduce_vec = true;
        let groups = if r.extents.last().is_some_and(|&e| e >= REDUCE_VECS * LANES) { REDUCE_VECS } else { 1 };
        let vaccs: Vec<Variable> = (0..groups).map(|_| self.b.declare_var(ty(r.dtype, LANES))).collect();
        for &v in &vaccs {
            let init = self.init(r.op, r.dtype, LANES);
            self.b.def_var(v, init);
        }
        let sacc = self.b.declare_var(ty(r.dtype, 1));
        let sinit = self.init(r.op, r.dtype, 1);
        self.b.def_var(sacc, sinit);
        self.reduce_loops_vec(r, 0, &vaccs, sacc);
        (self.col_dim, self.reduce_vec) = saved;
        self.combine_lanes(r, &vaccs, sacc)
    }

    pub(super) fn init(&mut self, op: ReduceOp, d: DType, lanes: usize) -> Value {
        self.konst(op.identity(d), d, lanes)
    }

    pub(super) fn fold(&mut self, op: ReduceOp, d: DType, lanes: usize, acc: Value, x: Value) -> Value {
        self.binary(op.fold(), d, lanes, acc, x)
    }
}
