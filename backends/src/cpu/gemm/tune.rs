//! Choosing a GEMM configuration: the library candidate's entry point, and (with `kiln-autotune`) the search.

use super::Ctx;
use super::config::{self, GemmImpl};
use kiln_autotune::{TuneKey, bucket, checksum_of};
use kiln_jit::dtype::Scalar;
use kiln_jit::kernel::gemm::{GemmOperand, GemmView, Role};
use kiln_jit::kernel::{BufParam, IExpr, Inst, InstOp, KernelIr, Reduce};
use kiln_jit::op::{BinaryOp, ReduceOp};
use kiln_jit::{DType, HostBuffer};

/// The `gemm` crate (batch 1; its epilogue runs as the backend's pass), on this crate's pool: each thread takes a
/// strip of columns and calls the library single-threaded, so no second thread pool competes for the cores.
///
/// # Safety
/// As [`super::CompiledGemm::run`].
pub unsafe fn library_gemm(v: &GemmView, cx: &Ctx) {
    let threads = super::pool::global().threads();
    let strips = threads.min(v.n.div_ceil(16)).max(1);
    let run = |s: usize, e: usize| {
        for strip in s..e {
            let n0 = strip * v.n / strips;
            let n1 = (strip + 1) * v.n / strips;
            if n1 == n0 {
                continue;
            }
            // SAFETY: A, B and C cover every (m, k), (k, n), (m, n) with the view's strides (caller's contract);
            // strips write disjoint columns of C, which is written, not read.
            unsafe {
                gemm_f32(
                    (v.m, n1 - n0, v.k),
                    (cx.c.add(n0), v.n as isize),
                    (cx.a.offset(v.a.offset as isize), v.a.cols as isize, v.a.rows as isize),
                    (cx.b.offset((v.b.offset + n0 as i64 * v.b.cols) as isize), v.b.cols as isize, v.b.rows as isize),
                )
            }
        }
    };
    super::pool::global().parallel_for_work(strips, (v.flops() / 2.0) as usize, &run);
}

/// `C = A @ B` through the `gemm` crate on the calling thread (C overwritten, not accumulated): dims (m, n, k),
/// C with its row stride, A and B each with their column and row strides.
///
/// # Safety
/// Every element those strides address for the given dims must lie in its buffer; C must not overlap A or B.
unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    (c, ldc): (*mut f32, isize),
    (a, a_cs, a_rs): (*const f32, isize, isize),
    (b, b_cs, b_rs): (*const f32, isize, isize),
) {
    // SAFETY: the caller's contract; `read_dst` is false, so C's old contents are never read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc,
            false,
            a,
            a_cs,
            a_rs,
            b,
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Pays now the one-time costs a process would otherwise pay inside its first library GEMM: the `gemm` crate reads
/// the cache hierarchy from sysfs on its first call (0.9 ms measured on this VM, against ~75 µs for a 128x128x256
/// product). Warm-before-deploy calls it (`kiln::tune::import_bundle`) so a service's first step does not; the cost
/// moves to start-up, it does not vanish. Runs once per process; cheap afterwards.
pub fn warm_runtime() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let _ = super::pool::global();
        let (a, b, mut c) = ([1f32; 16], [1f32; 16], [0f32; 16]);
        // SAFETY: 4x4 row-major matrices with leading dimension 4, all 16 elements long; C is written only.
        unsafe { gemm_f32((4, 4, 4), (c.as_mut_ptr(), 4), (a.as_ptr(), 1, 4), (b.as_ptr(), 1, 4)) };
    });
}

/// The analytic winner: the best-scored candidate, without running anything (`KILN_AUTOTUNE=off`).
pub fn analytic_best(v: &GemmView, threads: usize) -> Option<GemmImpl> {
    let mut best: Option<(f64, GemmImpl)> = None;
    for c in config::candidates(v, false) {
        let s = config::score(v, &c, threads);
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, c));
        }
    }
    best.map(|(_, c)| c)
}

/// What a GEMM's tuning result is valid for, and the canonical problem it is tuned on: the real problem's dims
/// rounded up to their power-of-two buckets, its operand layouts and its epilogue, with fresh data.
pub struct TuneProblem {
    pub key: TuneKey,
    pub dims: Vec<(String, u64)>,
    /// The canonical kernel (same epilogue, canonical strides, bucketed dims).
    pub kernel: KernelIr,
    pub view: GemmView,
}

impl TuneProblem {
    /// Deterministic data for the canonical problem (made only when a search runs: it is megabytes for a large
    /// GEMM, and a cache hit needs only the key).
    pub fn inputs(&self) -> Vec<HostBuffer> {
        self.kernel.inputs.iter().enumerate().map(|(i, b)| synthetic(b, i as u64)).collect()
    }
}

/// An operand's layout class: `contiguous` when its rows are contiguous (unit stride along its second index), else
/// `transposed` when its columns are; any other strides are tuned as if contiguous.
fn layout(op: &GemmOperand, contiguous: &'static str, transposed: &'static str) -> &'static str {
    if op.cols != 1 && op.rows == 1 { transposed } else { contiguous }
}

/// Builds the tuning key and canonical problem of GEMM kernel `k` (recognized as `v`) for `threads` threads.
pub fn problem(k: &KernelIr, v: &GemmView, threads: usize, device: &str) -> TuneProblem {
    let bb = if v.batch.is_empty() { 1 } else { bucket(v.batch_count() as u64) as usize };
    let mm = if v.m == 1 { 1 } else { bucket(v.m as u64) as usize };
    let (nn, kk) = (bucket(v.n as u64) as usize, bucket(v.k as u64) as usize);
    let a_layout = layout(&v.a, "mk", "km");
    let b_layout = layout(&v.b, "kn", "nk");
    // Output dims and loop variables of the canonical kernel: [b?, m?, n], then k.
    let mut out_extents = Vec::new();
    if bb > 1 {
        out_extents.push(bb);
    }
    if mm > 1 {
        out_extents.push(mm);
    }
    out_extents.push(nn);
    let rank = out_extents.len();
    let nvars = rank + 1;
    let var = |name: char| -> Option<usize> {
        match name {
            'b' => (bb > 1).then_some(0),
            'm' => (mm > 1).then(|| rank - 2),
            'n' => Some(rank - 1),
            _ => Some(rank),
        }
    };
    // An affine index from (variable, coefficient) terms.
    let index = |terms: &[(char, usize)]| {
        let mut coef = vec![0i64; nvars];
        for &(v, c) in terms {
            if let Some(i) = var(v) {
                coef[i] += c as i64;
            }
        }
        IExpr::from_affine(&coef, 0)
    };
    let f32buf = |len: usize| BufParam { dtype: DType::F32, len };
    let mut inputs = vec![f32buf(bb * mm * kk), f32buf(bb * kk * nn)];
    let a_index = if a_layout == "mk" {
        index(&[('b', mm * kk), ('m', kk), ('k', 1)])
    } else {
        index(&[('b', mm * kk), ('k', mm), ('m', 1)])
    };
    let b_index = if b_layout == "kn" {
        index(&[('b', kk * nn), ('k', nn), ('n', 1)])
    } else {
        index(&[('b', kk * nn), ('n', kk), ('k', 1)])
    };
    let load = |buf: usize, index: IExpr| Inst {
        op: InstOp::Load { buf, index, valid: None, fill: Scalar::Float(0.0) },
        dtype: DType::F32,
    };
    let inner =
        vec![load(0, a_index), load(1, b_index), Inst { op: InstOp::Binary(BinaryOp::Mul, 0, 1), dtype: DType::F32 }];
    let mut outer = k.outer.clone();
    let mut epilogue = Vec::with_capacity(outer.len());
    for (inst, role) in outer.iter_mut().zip(&v.roles) {
        if let InstOp::Load { buf, index: ix, .. } = &mut inst.op {
            // Canonical operands always carry the batch (a no-op at batch 1).
            let (len, new, what) = match role {
                Role::Mat { .. } | Role::Other => (bb * mm * nn, index(&[('b', mm * nn), ('m', nn), ('n', 1)]), "mat"),
                Role::Row { .. } => (bb * nn, index(&[('b', nn), ('n', 1)]), "row"),
                Role::Col { .. } => (bb * mm, index(&[('b', mm), ('m', 1)]), "col"),
                _ => (1, index(&[]), "uniform"),
            };
            *buf = inputs.len();
            *ix = new;
            inputs.push(BufParam { dtype: inst.dtype, len });
            epilogue.push(format!("{}:load.{what}", inst.dtype));
        } else {
            epilogue.push(format!("{}:{:?}", inst.dtype, inst.op));
        }
    }
    epilogue.push(format!("result v{}", k.result));
    let canonical = KernelIr {
        name: format!("tune_{}", k.name),
        inputs,
        output: f32buf(bb * mm * nn),
        out_extents,
        reduce: Some(Reduce { op: ReduceOp::Sum, extents: vec![kk], dtype: DType::F32, inner, value: 2 }),
        outer,
        result: k.result,
        flops_per_elem: k.flops_per_elem,
    };
    let view = GemmView::of(&canonical).unwrap_or_else(|| unreachable!("the canonical problem is a GEMM"));
    let dims: Vec<(String, u64)> = [("batch", bb), ("m", mm), ("n", nn), ("k", kk), ("threads", threads)]
        .iter()
        .map(|&(n, x)| (n.to_string(), x as u64))
        .collect();
    let names: Vec<String> = config::candidates(&view, view.batch.is_empty()).iter().map(|c| c.name()).collect();
    let key = TuneKey {
        op: "gemm".into(),
        dims: dims.clone(),
        dtypes: "f32,f32->f32".into(),
        layout: format!("{a_layout},{b_layout}"),
        epilogue: epilogue.join(";"),
        device: device.to_string(),
        candidates: checksum_of(&names),
    };
    TuneProblem { key, dims, kernel: canonical, view }
}

/// Deterministic data for input `seed`: floats in [-1, 1), ints in 0..4, bools alternating.
fn synthetic(b: &BufParam, seed: u64) -> HostBuffer {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let vals: Vec<f64> = (0..b.len).map(|_| next() * 2.0 - 1.0).collect();
    match b.dtype {
        DType::F32 => HostBuffer::F32(vals.iter().map(|&x| x as f32).collect()),
        DType::F64 => HostBuffer::F64(vals),
        d => HostBuffer::from_i64(d, &vals.iter().map(|&x| ((x + 1.0) * 2.0) as i64).collect::<Vec<_>>()),
    }
}

/// Positions checked against the reference: the four corners, the last row and column, and a spread in between.
pub fn sample_positions(extents: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let r = extents.len();
    let corners = 1usize << r;
    for c in 0..corners {
        out.push((0..r).map(|d| if c >> d & 1 == 1 { extents[d] - 1 } else { 0 }).collect());
    }
    let total: usize = extents.iter().product();
    let step = (total / 40).max(1) | 1;
    let mut flat = 7 % total.max(1);
    for _ in 0..40 {
        let mut rem = flat;
        let mut idx = vec![0; r];
        for d in (0..r).rev() {
            idx[d] = rem % extents[d];
            rem /= extents[d];
        }
        out.push(idx);
        flat = (flat + step) % total;
    }
    out
}

/// Checks a candidate's output on the canonical problem against the kernel IR evaluator at sampled positions.
/// Tolerance: the summation-order bound of `tests/common::gemm_tol` (relative 1e-5 plus 4*k*eps), doubled because
/// the evaluator's own f32 sum errs too; a wrong tile, block or epilogue is off by orders of magnitude more.
pub fn verify(p: &TuneProblem, inputs: &[HostBuffer], got: &HostBuffer) -> Result<(), String> {
    let positions = sample_positions(&p.kernel.out_extents);
    let refs: Vec<&HostBuffer> = inputs.iter().collect();
    let want = kiln_jit::kernel::eval::run_at(&p.kernel, &refs, &[], &positions);
    let HostBuffer::F32(got) = got else { return Err("the GEMM output is not f32".into()) };
    let strides = kiln_jit::shape::contiguous_strides(&p.kernel.out_extents);
    let abs = 8.0 * p.view.k as f64 * f32::EPSILON as f64;
    for (pos, w) in positions.iter().zip(want) {
        let flat: usize = pos.iter().zip(&strides).map(|(i, s)| i * s).sum();
        let g = got[flat] as f64;
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= abs + 2e-5 * w.abs();
        if !ok {
            return Err(format!("element {pos:?}: got {g}, want {w}"));
        }
    }
    Ok(())
}
