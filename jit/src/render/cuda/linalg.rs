//! The linear algebra routines (`kernel::routine`) in CUDA C and HIP C, with the WGSL form's layout and phases
//! (`render/wgsl/routine.rs`), in f32 and f64:
//!
//! - LU and Cholesky run one block of [`BLOCK`] threads per matrix. Each column step is a few phases over the
//!   matrix in the output buffer (the pivot's search as a tree in `__shared__` memory, the row swap, the column's
//!   scaling, the trailing update), separated by `__syncthreads()`, which also orders the block's global-memory
//!   reads and writes; the threads split each phase's elements.
//! - A triangular solve runs one thread per right-hand column of each matrix: plain substitution, no barriers.
//!
//! Every barrier is reached by the whole block: loops around one have bounds fixed in the source, and the
//! data-dependent choices (a zero pivot, a fault) only guard work between barriers. One block per matrix keeps a
//! large single matrix on one SM (what `routine.rs`'s semantics need, not what a fast factorization does: a
//! blocked one with GEMM trailing updates is not built on any device).

use super::dialect::storage_ty;
use super::{Flavor, GpuKernel, MAX_GRID_X};
use crate::dtype::DType;
use crate::kernel::fault::{FAULT_NOT_POSITIVE_DEFINITE, FAULT_SINGULAR};
use crate::kernel::routine::LinalgRoutine;
use crate::op::LinalgOp;
use std::fmt::Write;

/// Threads per block (a power of two: the pivot search folds in halves).
const BLOCK: u32 = 128;

/// Claims the fault record once (the first claim wins, as on every device).
const FAULT_FN: &str = r#"__device__ __forceinline__ void kiln_fault(int* fault, int kind, long long a, long long b) {
    if (atomicCAS(fault, 0, kind) == 0) {
        atomicExch(fault + 1, (int)a);
        atomicExch(fault + 2, (int)b);
    }
}
"#;

/// The C names a routine's body uses for its dtype.
struct Names {
    /// The element type.
    t: &'static str,
    abs: &'static str,
    sqrt: &'static str,
    max: &'static str,
    /// The dtype's machine epsilon, as a literal.
    eps: String,
}

fn names(d: DType) -> Result<Names, String> {
    match d {
        DType::F32 => {
            Ok(Names { t: "float", abs: "fabsf", sqrt: "sqrtf", max: "fmaxf", eps: format!("{:e}f", f32::EPSILON) })
        }
        DType::F64 => {
            Ok(Names { t: "double", abs: "fabs", sqrt: "sqrt", max: "fmax", eps: format!("{:e}", f64::EPSILON) })
        }
        d => Err(format!("linear algebra routines take f32 or f64, not {d}")),
    }
}

/// The kernel of `r` for `flavor`.
pub(super) fn render(r: &LinalgRoutine, flavor: Flavor) -> Result<GpuKernel, String> {
    let nm = names(r.dtype)?;
    let k = r.kernel();
    let t = nm.t;
    debug_assert!(k.inputs.iter().chain([&k.output]).all(|b| storage_ty(b.dtype) == t));
    let per_matrix = !matches!(r.op, LinalgOp::TriSolve { .. });
    // A factorization: a block per matrix; a solve: a thread per right-hand column of each matrix.
    let (blocks, threads) = if per_matrix {
        (r.batch as u64, r.batch as u64 * BLOCK as u64)
    } else {
        let t = (r.batch * r.k) as u64;
        (t.div_ceil(BLOCK as u64), t)
    };
    let grid = if blocks == 0 { (0, 0) } else { (blocks.min(MAX_GRID_X) as u32, blocks.div_ceil(MAX_GRID_X) as u32) };
    let mut params = vec![format!("const {t}* __restrict__ in0")];
    if k.inputs.len() == 2 {
        params.push(format!("const {t}* __restrict__ in1"));
    }
    params.push(format!("{t}* __restrict__ out"));
    if r.can_fault() {
        params.push("int* __restrict__ fault".into());
    }
    let mut s = format!("// kiln kernel {} ({})\n", k.name, flavor.name());
    if r.can_fault() {
        s += FAULT_FN;
    }
    let _ = writeln!(s, "extern \"C\" __global__ void __launch_bounds__({BLOCK}) {}({}) {{", k.name, params.join(", "));
    if threads > 0 {
        if per_matrix {
            let _ = writeln!(
                s,
                "    const long long m = (long long)blockIdx.y * gridDim.x + blockIdx.x;\n    \
                 if (m >= {}ll) {{ return; }}\n    const int lid = threadIdx.x;",
                r.batch
            );
        } else {
            let _ = writeln!(
                s,
                "    const long long t = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * {BLOCK} + threadIdx.x;\n    \
                 if (t >= {threads}ll) {{ return; }}"
            );
        }
        s += &match r.op {
            LinalgOp::Lu { check } => lu(r.n, check, &nm),
            LinalgOp::Cholesky => cholesky(r.n, &nm),
            LinalgOp::TriSolve { upper, unit } => tri_solve(r.n, r.k, upper, unit, t),
        };
    }
    s += "}\n";
    Ok(GpuKernel {
        name: k.name,
        source: s,
        block: BLOCK,
        grid,
        threads,
        uses_rng: false,
        can_fault: r.can_fault(),
        workspace: None,
    })
}

/// LU of matrix `m` in `out` (rows of n + 2: the factors, the permutation, the pivot rows 1-based).
fn lu(n: usize, check: bool, nm: &Names) -> String {
    let Names { t, abs, max, eps, .. } = nm;
    let (cols, nn, half) = (n + 2, n * n, BLOCK / 2);
    let mut s = format!(
        r#"    __shared__ {t} best_v[{BLOCK}];
    __shared__ int best_i[{BLOCK}];
    const long long ib = m * {nn}ll;
    const long long ob = m * {ob}ll;
    for (long long e = lid; e < {nn}ll; e += {BLOCK}) {{
        out[ob + (e / {n}) * {cols} + e % {n}] = in0[ib + e];
    }}
    for (int i = lid; i < {n}; i += {BLOCK}) {{
        out[ob + (long long)i * {cols} + {n}] = ({t})i;
    }}
"#,
        ob = n * cols,
    );
    if check {
        // The largest magnitude, for the singularity threshold (`routine::singular_tol`).
        s += &format!(
            r#"    {t} mx = 0;
    for (long long e = lid; e < {nn}ll; e += {BLOCK}) {{ mx = {max}(mx, {abs}(in0[ib + e])); }}
    best_v[lid] = mx;
    __syncthreads();
    for (int h = {half}; h > 0; h >>= 1) {{
        if (lid < h) {{ best_v[lid] = {max}(best_v[lid], best_v[lid + h]); }}
        __syncthreads();
    }}
    const {t} tol = ({t}){n} * {eps} * best_v[0];
"#
        );
    }
    s += &format!(
        r#"    __syncthreads();
    for (int k = 0; k < {n}; k++) {{
        {t} bv = -1;
        int bi = k;
        for (int i = k + lid; i < {n}; i += {BLOCK}) {{
            const {t} v = {abs}(out[ob + (long long)i * {cols} + k]);
            if (v > bv) {{ bv = v; bi = i; }}
        }}
        best_v[lid] = bv;
        best_i[lid] = bi;
        __syncthreads();
        for (int h = {half}; h > 0; h >>= 1) {{
            if (lid < h) {{
                const {t} ov = best_v[lid + h];
                const int oi = best_i[lid + h];
                if (ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid])) {{
                    best_v[lid] = ov;
                    best_i[lid] = oi;
                }}
            }}
            __syncthreads();
        }}
        const int p = best_i[0];
        if (p != k) {{
            for (int j = lid; j < {n1}; j += {BLOCK}) {{
                const {t} x = out[ob + (long long)k * {cols} + j];
                out[ob + (long long)k * {cols} + j] = out[ob + (long long)p * {cols} + j];
                out[ob + (long long)p * {cols} + j] = x;
            }}
        }}
        if (lid == 0) {{ out[ob + (long long)k * {cols} + {n1}] = ({t})(p + 1); }}
        __syncthreads();
        const {t} piv = out[ob + (long long)k * {cols} + k];
"#,
        n1 = n + 1,
    );
    if check {
        s +=
            &format!("        if (lid == 0 && !({abs}(piv) > tol)) {{ kiln_fault(fault, {FAULT_SINGULAR}, m, k); }}\n");
    }
    s += &format!(
        r#"        if (piv != 0) {{
            for (int i = k + 1 + lid; i < {n}; i += {BLOCK}) {{
                out[ob + (long long)i * {cols} + k] = out[ob + (long long)i * {cols} + k] / piv;
            }}
        }}
        __syncthreads();
        const long long w = {n} - 1 - k;
        if (piv != 0) {{
            for (long long e = lid; e < w * w; e += {BLOCK}) {{
                const long long i = k + 1 + e / w;
                const long long j = k + 1 + e % w;
                out[ob + i * {cols} + j] = out[ob + i * {cols} + j] - out[ob + i * {cols} + k] * out[ob + (long long)k * {cols} + j];
            }}
        }}
        __syncthreads();
    }}
"#
    );
    s
}

/// Cholesky of matrix `m`'s lower triangle into `out`, right-looking (zeros above the diagonal).
fn cholesky(n: usize, nm: &Names) -> String {
    let Names { t, sqrt, .. } = nm;
    format!(
        r#"    const long long b = m * {nn}ll;
    for (long long e = lid; e < {nn}ll; e += {BLOCK}) {{
        out[b + e] = e % {n} <= e / {n} ? in0[b + e] : ({t})0;
    }}
    __syncthreads();
    for (int j = 0; j < {n}; j++) {{
        const {t} d = out[b + (long long)j * {n} + j];
        __syncthreads();
        if (lid == 0 && !(d > 0)) {{ kiln_fault(fault, {FAULT_NOT_POSITIVE_DEFINITE}, m, j + 1); }}
        const {t} l = d > 0 ? {sqrt}(d) : ({t})1;
        if (lid == 0) {{ out[b + (long long)j * {n} + j] = l; }}
        for (int i = j + 1 + lid; i < {n}; i += {BLOCK}) {{
            out[b + (long long)i * {n} + j] = out[b + (long long)i * {n} + j] / l;
        }}
        __syncthreads();
        const long long w = {n} - 1 - j;
        for (long long e = lid; e < w * w; e += {BLOCK}) {{
            const long long i = j + 1 + e / w;
            const long long c = j + 1 + e % w;
            if (c <= i) {{
                out[b + i * {n} + c] = out[b + i * {n} + c] - out[b + i * {n} + j] * out[b + c * {n} + j];
            }}
        }}
        __syncthreads();
    }}
"#,
        nn = n * n
    )
}

/// Substitution for column `t % k` of matrix `t / k`.
fn tri_solve(n: usize, k: usize, upper: bool, unit: bool, t: &str) -> String {
    let (row, known) = if upper {
        (format!("{} - s", n - 1), format!("for (int j = i + 1; j < {n}; j++)"))
    } else {
        ("s".to_string(), "for (int j = 0; j < i; j++)".to_string())
    };
    let divide = if unit {
        String::new()
    } else {
        format!(
            "        const {t} d = in0[ab + (long long)i * {n} + i];\n        \
             if (d == 0) {{ kiln_fault(fault, {FAULT_SINGULAR}, mi, i); }}\n        x = x / d;\n"
        )
    };
    format!(
        r#"    const long long mi = t / {k};
    const long long ab = mi * {nn}ll;
    const long long xb = mi * {nk}ll + t % {k};
    for (int s = 0; s < {n}; s++) {{
        const int i = {row};
        {t} x = in1[xb + (long long)i * {k}];
        {known} {{
            x = x - in0[ab + (long long)i * {n} + j] * out[xb + (long long)j * {k}];
        }}
{divide}        out[xb + (long long)i * {k}] = x;
    }}
"#,
        nn = n * n,
        nk = n * k
    )
}
