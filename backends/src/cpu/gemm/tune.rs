//! Choosing a GEMM configuration: the library candidate's entry point, and (with `kiln-autotune`) the search.

use super::Ctx;
use super::config::{self, GemmImpl, StepContext};
use kiln_autotune::{TuneKey, bucket, checksum_of_each, dim_named};
use kiln_jit::dtype::Scalar;
use kiln_jit::kernel::gemm::{GemmView, Role};
use kiln_jit::kernel::{BufParam, IExpr, Inst, InstOp, KernelIr, Reduce};
use kiln_jit::op::{BinaryOp, ReduceOp};
use kiln_jit::{DType, HostBuffer};

/// The `gemm` crate (batch 1; its epilogue runs as the backend's pass), on this crate's pool: each thread takes a
/// strip of columns and calls the library single-threaded, so no second thread pool competes for the cores.
///
/// # Safety
/// As [`super::CompiledGemm::run`].
pub unsafe fn library_gemm(v: &GemmView, cx: &Ctx) {
    // SAFETY: A, B and C cover every (m, k), (k, n), (m, n) with the view's strides (caller's contract).
    unsafe {
        library_strips(
            (v.m, v.n, v.k),
            (cx.c, v.n as isize),
            (cx.a.offset(v.a.offset as isize), v.a.cols as isize, v.a.rows as isize),
            (cx.b.offset(v.b.offset as isize), v.b.cols as isize, v.b.rows as isize),
            Update::Write,
        )
    }
}

/// How a product lands in C: written over it, or subtracted from it (`C -= A @ B`: the blocked linear algebra's
/// updates, `cpu/blocked.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    Write,
    Subtract,
}

/// The float types the `gemm` crate runs here.
pub(crate) trait LibFloat: Copy + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
    const MINUS_ONE: Self;
}

impl LibFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const MINUS_ONE: Self = -1.0;
}

impl LibFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const MINUS_ONE: Self = -1.0;
}

/// `C = A @ B` or `C -= A @ B` (`update`) through the `gemm` crate, in column strips of C over the pool's threads,
/// each strip's product single-threaded in the crate (so no second thread pool competes for the cores): dims
/// (m, n, k), C with its row stride (columns contiguous), A and B each with their column and row strides. A pool
/// launch already running (a matrix of a batch factored on its own thread) runs the strips inline.
///
/// # Safety
/// Every element those strides address for the given dims lies in live memory; C overlaps neither A nor B.
pub(crate) unsafe fn library_strips<T: LibFloat>(
    (m, n, k): (usize, usize, usize),
    (c, ldc): (*mut T, isize),
    (a, a_cs, a_rs): (*const T, isize, isize),
    (b, b_cs, b_rs): (*const T, isize, isize),
    update: Update,
) {
    let threads = super::pool::global().threads();
    let strips = threads.min(n.div_ceil(16)).max(1);
    let (c, a, b) = (SendPtr(c), SendPtr(a as *mut T), SendPtr(b as *mut T));
    let run = |s: usize, e: usize| {
        for strip in s..e {
            let n0 = strip * n / strips;
            let n1 = (strip + 1) * n / strips;
            if n1 == n0 {
                continue;
            }
            // SAFETY: the caller's contract; strips write disjoint columns of C.
            unsafe {
                gemm_call(
                    (m, n1 - n0, k),
                    (c.get().add(n0), ldc),
                    (a.get(), a_cs, a_rs),
                    (b.get().offset(n0 as isize * b_cs), b_cs, b_rs),
                    update,
                )
            }
        }
    };
    super::pool::global().parallel_for_work(strips, m * n * k, &run);
}

/// A pointer the strips of one library or dot-product GEMM share (each writes its own columns of C; A and B are
/// only read).
#[derive(Clone, Copy)]
pub(super) struct SendPtr<T = f32>(pub(super) *mut T);

impl<T> SendPtr<T> {
    /// Through a method, so closures capture the `Sync` wrapper rather than the raw pointer field.
    pub(super) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: used only inside `library_strips`, `dot::dot_gemm` and `splitk`, whose callers guarantee the pointers
// stay valid for the call and whose strips write disjoint columns of C.
unsafe impl<T> Sync for SendPtr<T> {}

/// [`library_strips`]'s product on the calling thread.
///
/// # Safety
/// As [`library_strips`].
unsafe fn gemm_call<T: LibFloat>(
    (m, n, k): (usize, usize, usize),
    (c, ldc): (*mut T, isize),
    (a, a_cs, a_rs): (*const T, isize, isize),
    (b, b_cs, b_rs): (*const T, isize, isize),
    update: Update,
) {
    // dst = alpha dst + beta A B; with `read_dst` false (a write) C's old contents are never read.
    let (read_dst, alpha, beta) = match update {
        Update::Write => (false, T::ZERO, T::ONE),
        Update::Subtract => (true, T::ONE, T::MINUS_ONE),
    };
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc,
            read_dst,
            a,
            a_cs,
            a_rs,
            b,
            b_cs,
            b_rs,
            alpha,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Pays now the one-time costs a process would otherwise pay inside its first GEMMs: the thread pool's start, the
/// `gemm` crate's reading of the cache hierarchy from sysfs on its first call (0.9 ms measured on this VM, against
/// ~75 µs for a 128x128x256 product) and its first call at each stored library winner's size, and growing every
/// thread's pack buffers to what the stored generated winners need (page faults: ~0.9 µs per 4 KiB page here). The
/// first two happen once per process; the rest again for what later records add.
pub fn warm_gemms() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let _ = super::pool::global();
        let (a, b, mut c) = ([1f32; 16], [1f32; 16], [0f32; 16]);
        // SAFETY: 4x4 row-major matrices with leading dimension 4, all 16 elements long; C is written only.
        unsafe { gemm_call((4, 4, 4), (c.as_mut_ptr(), 4), (a.as_ptr(), 1, 4), (b.as_ptr(), 1, 4), Update::Write) };
    });
    // The library's first call at a size allocates its packing memory on each thread (and the allocator adapts its
    // thresholds to it), ~0.3 ms for the MLP's 128x256x784 layer here: run each library winner's shape once. Dims
    // are capped at `LIBRARY_WARM_DIM` (its packing blocks are smaller), so a huge stored shape costs an import at
    // most ~2 GFLOP and 12 MiB, not the real problem.
    const LIBRARY_WARM_DIM: usize = 1024;
    let (mut a, mut b) = (0, 0);
    let mut library = Vec::new();
    for rec in kiln_autotune::Store::global().records() {
        let dim = |name: &str| (dim_named(&rec.key.dims, name).unwrap_or(1) as usize).min(LIBRARY_WARM_DIM);
        match GemmImpl::parse(&rec.winner) {
            Some(GemmImpl::Asm(c)) if rec.key.op == "gemm" => {
                let (ca, cb) = super::pack_lens(&c);
                (a, b) = (a.max(ca), b.max(cb));
            }
            Some(GemmImpl::Library) if rec.key.op == "gemm" => library.push((dim("m"), dim("n"), dim("k"))),
            _ => {}
        }
    }
    if a + b > 0 {
        super::reserve_scratch(a, b);
    }
    library.sort_unstable();
    library.dedup();
    for (m, n, k) in library {
        let (x, w, mut y) = (vec![0f32; m * k], vec![0f32; k * n], vec![0f32; m * n]);
        // SAFETY: x is m x k, w is k x n and y is m x n, all row-major and dense.
        unsafe {
            library_strips(
                (m, n, k),
                (y.as_mut_ptr(), n as isize),
                (x.as_ptr(), 1, k as isize),
                (w.as_ptr(), 1, n as isize),
                Update::Write,
            )
        };
    }
}

/// The analytic winner: the best-scored candidate, without running anything (`KILN_AUTOTUNE=off`).
pub fn analytic_best(v: &GemmView, threads: usize) -> Option<GemmImpl> {
    let mut best: Option<(f64, GemmImpl)> = None;
    for c in config::candidates(v, false) {
        let s = super::cost::score(v, &c, threads);
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
    /// The size of dim `name` (`batch`, `m`, `n`, `k`) this problem is built at; 1 for one it does not name.
    pub fn dim(&self, name: &str) -> usize {
        dim_named(&self.dims, name).unwrap_or(1) as usize
    }

    /// Deterministic data for the canonical problem (made only when a search runs: it is megabytes for a large
    /// GEMM, and a cache hit needs only the key).
    pub fn inputs(&self) -> Vec<HostBuffer> {
        crate::gemm_check::synthetic_inputs(&self.kernel)
    }
}

/// Builds the tuning key and canonical problem of GEMM kernel `k` (recognized as `v`) for `threads` threads.
/// `cx`: what the plan running `k` does around it (`config::step_candidates`).
pub fn problem(k: &KernelIr, v: &GemmView, threads: usize, device: &str, cx: StepContext) -> TuneProblem {
    let bb = if v.batch.is_empty() { 1 } else { bucket(v.batch_count() as u64) as usize };
    let mm = if v.m == 1 { 1 } else { bucket(v.m as u64) as usize };
    let (nn, kk) = (bucket(v.n as u64) as usize, bucket(v.k as u64) as usize);
    build(k, v, [bb, mm, nn, kk], threads, device, cx)
}

/// `KILN_AUTOTUNE=fast` times a smaller problem than the canonical one when one run of that would cost more than
/// this many flops (~0.8 ms at the ~170 GFLOP/s two threads reach here): a first training step at batch 1024 tuned
/// eight GEMM keys in ~90 ms, 55 ms of it in the two keys whose canonical runs take 3-3.5 ms (1024 x 256 x 1024 and
/// 256 x 1024 x 1024; a race is two verification runs and three timed rounds of two).
pub const FAST_TIMED_FLOPS: usize = 1 << 27;

/// The smallest M or N (a power of two) a fast-mode proxy cuts to: a few MC blocks and NC panels per thread, so the
/// configs' blocking and thread split still show (at 128 rows, one 144-row MC block would cover them all).
pub const FAST_MIN_DIM: usize = 256;

/// The problem `KILN_AUTOTUNE=fast` times for `full` (the canonical problem of `k`, recognized as `v`), when that one
/// is larger than [`FAST_TIMED_FLOPS`]: the same key, layouts and epilogue with the batch halved down to 2, then
/// the larger of M and N halved down to [`FAST_MIN_DIM`] (N only where M is at least that: a GEMM with few rows is
/// bound by streaming B, and a B that fits the caches would rank its configs wrongly). K is kept: it decides the K
/// blocking and the packing the configs differ in. Time per run scales with what is cut; the ranking is what
/// matters, and `full` (`kiln tune`) measures the canonical problem itself. The record's `tuned_dims` are the
/// proxy's. `None` when the canonical problem is cheap enough (or cannot be cut).
pub fn fast_proxy(k: &KernelIr, v: &GemmView, full: &TuneProblem, threads: usize, device: &str) -> Option<TuneProblem> {
    let [mut bb, mut mm, mut nn, kk] = ["batch", "m", "n", "k"].map(|d| full.dim(d));
    let flops = |bb: usize, mm: usize, nn: usize| 2 * bb * mm * nn * kk;
    let original = (bb, mm, nn);
    while flops(bb, mm, nn) > FAST_TIMED_FLOPS {
        if bb > 2 {
            bb /= 2;
        } else if mm > FAST_MIN_DIM && mm >= nn {
            mm /= 2;
        } else if nn > FAST_MIN_DIM && mm >= FAST_MIN_DIM {
            nn /= 2;
        } else if mm > FAST_MIN_DIM {
            mm /= 2;
        } else {
            break;
        }
    }
    if (bb, mm, nn) == original {
        return None;
    }
    // The key is the full problem's (its candidate set included); the proxy only changes what is timed.
    let mut proxy = build(k, v, [bb, mm, nn, kk], threads, device, StepContext::default());
    proxy.key = full.key.clone();
    Some(proxy)
}

/// The tuning problem of `k` (recognized as `v`) at dims `[batch, m, n, k]` (batch 1: unbatched; m 1: a GEMV).
fn build(
    k: &KernelIr,
    v: &GemmView,
    [bb, mm, nn, kk]: [usize; 4],
    threads: usize,
    device: &str,
    cx: StepContext,
) -> TuneProblem {
    let (a_layout, b_layout) = crate::gemm_check::operand_layouts(v);
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
    let operand = |len: usize| BufParam { dtype: v.operands, len };
    let mut inputs = vec![operand(bb * mm * kk), operand(bb * kk * nn)];
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
        dtype: v.operands,
    };
    let f32inst = |op: InstOp| Inst { op, dtype: DType::F32 };
    // The kernel IR `GemmView::of` recognizes: bf16 operands are widened by a cast each.
    let inner = if v.operands == DType::F32 {
        vec![load(0, a_index), load(1, b_index), f32inst(InstOp::Binary(BinaryOp::Mul, 0, 1))]
    } else {
        vec![
            load(0, a_index),
            f32inst(InstOp::Cast(0)),
            load(1, b_index),
            f32inst(InstOp::Cast(2)),
            f32inst(InstOp::Binary(BinaryOp::Mul, 1, 3)),
        ]
    };
    let value = inner.len() - 1;
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
    let row_rank = out_extents.len();
    let canonical = KernelIr {
        name: format!("tune_{}", k.name),
        inputs,
        output: BufParam { dtype: v.out, len: bb * mm * nn },
        out_extents,
        reduce: Some(Reduce { op: ReduceOp::Sum, extents: vec![kk], dtype: DType::F32, inner, value }),
        rows: Vec::new(),
        row_rank,
        outer,
        result: k.result,
        flops_per_elem: k.flops_per_elem,
        routine: None,
    };
    let view = GemmView::of(&canonical).unwrap_or_else(|| unreachable!("the canonical problem is a GEMM"));
    let dims: Vec<(String, u64)> = [("batch", bb), ("m", mm), ("n", nn), ("k", kk), ("threads", threads)]
        .iter()
        .map(|&(n, x)| (n.to_string(), x as u64))
        .collect();
    let candidates = config::step_candidates(&view, view.batch.is_empty(), cx);
    let key = TuneKey {
        op: "gemm".into(),
        dims: dims.clone(),
        dtypes: format!("{0},{0}->{1}", v.operands, v.out),
        layout: format!("{a_layout},{b_layout}"),
        epilogue: epilogue.join(";"),
        device: device.to_string(),
        candidates: checksum_of_each(&candidates, |c, out| c.write_name(out)),
    };
    TuneProblem { key, dims, kernel: canonical, view }
}

/// The kernel IR evaluator's values of the canonical problem on `inputs` at the sampled positions, to check every
/// candidate's output against (see [`crate::gemm_check::Reference`]).
pub fn reference(p: &TuneProblem, inputs: &[HostBuffer]) -> crate::gemm_check::Reference {
    let refs: Vec<&HostBuffer> = inputs.iter().collect();
    crate::gemm_check::Reference::of(&p.kernel, p.view.k, &refs)
}
