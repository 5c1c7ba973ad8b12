//! The routines (`kernel::routine`) in WGSL, written by hand: a factorization is a sequence of dependent steps,
//! not an element function, so it does not go through the shared C-like emitter. The scatter-sum is `scatter.rs`;
//! the linear algebra routines are here:
//!
//! - LU and Cholesky run one 64-invocation workgroup per matrix. Each column step is a few phases over the matrix
//!   (the pivot's search as a tree reduction in workgroup memory, the row swap, the column's scaling, the trailing
//!   update), separated by barriers; the invocations split each phase's elements. The matrix lives in the output
//!   buffer the whole time (`storageBarrier` orders its reads and writes within the workgroup).
//! - A triangular solve runs one invocation per right-hand column of each matrix: plain substitution, no barriers.
//!
//! Barriers stay in uniform control flow: every loop around one has a bound fixed in the source, and the
//! data-dependent choices (a zero pivot, a fault) only guard loops without barriers. A shader loop runs at most
//! [`max_trips`] times, which the backend holds to its adapter's limit. f32 only (WGSL has no f64).

use super::{MAX_GROUPS_PER_DIM, WgslKernel, groups_for};
use crate::dtype::DType;
use crate::kernel::fault::{FAULT_NOT_POSITIVE_DEFINITE, FAULT_SINGULAR};
use crate::kernel::routine::{LinalgRoutine, Routine};
use crate::op::LinalgOp;

/// Invocations per workgroup.
const WG: usize = 64;

/// The most trips any loop of `r`'s shader makes (for adapters that stop long loops).
pub fn max_trips(r: &Routine) -> usize {
    match r {
        Routine::Linalg(l) => linalg_trips(l),
        Routine::Scatter(s) => super::scatter::layout(s).trips,
        Routine::Sort(_) => 0,
    }
}

/// The shader of routine `r`.
pub fn render(r: &Routine) -> Result<WgslKernel, String> {
    match r {
        Routine::Linalg(l) => render_linalg(l),
        Routine::Scatter(s) => super::scatter::render(s),
        // `Tensor::sort` builds a sorting network for this device (`kernel::sort`).
        Routine::Sort(_) => Err("the row sort routine runs on the CPU only".into()),
    }
}

fn linalg_trips(r: &LinalgRoutine) -> usize {
    match r.op {
        LinalgOp::TriSolve { .. } => r.n,
        _ => r.n.max((r.n * r.n).div_ceil(WG)),
    }
}

/// Claims the fault record (as `math.rs`'s index check: a weak compare-and-swap retried while the record is free).
pub(super) const FAULT_FN: &str = r#"
fn kiln_fault(kind: i32, a: u32, b: u32) {
    loop {
        let r = atomicCompareExchangeWeak(&fault[0], 0, kind);
        if (r.exchanged) {
            atomicStore(&fault[1], i32(a));
            atomicStore(&fault[2], i32(b));
            break;
        }
        if (r.old_value != 0) { break; }
    }
}
"#;

/// The shader of linear algebra routine `r`.
fn render_linalg(r: &LinalgRoutine) -> Result<WgslKernel, String> {
    if r.dtype != DType::F32 {
        return Err(format!("{} in {}: WGSL has only f32 among the routines' dtypes", r.op.name(), r.dtype));
    }
    let k = r.kernel();
    let inputs = k.inputs.len();
    let mut s = format!("// kiln routine {}\n", k.name);
    s += "@group(0) @binding(0) var<storage, read> a: array<f32>;\n";
    if inputs == 2 {
        s += "@group(0) @binding(1) var<storage, read> rhs: array<f32>;\n";
    }
    s += &format!("@group(0) @binding({inputs}) var<storage, read_write> out: array<f32>;\n");
    if r.can_fault() {
        s += &format!("@group(0) @binding({}) var<storage, read_write> fault: array<atomic<i32>, 3>;\n", inputs + 1);
        s += FAULT_FN;
    }
    let (n, batch) = (r.n, r.batch);
    let threads = match r.op {
        LinalgOp::TriSolve { .. } => batch * r.k,
        _ => batch * WG,
    };
    let groups = groups_for(threads as u64, WG as u32)?;
    let body = match r.op {
        LinalgOp::Lu { check } => lu(n, check),
        LinalgOp::Cholesky => cholesky(n),
        LinalgOp::TriSolve { upper, unit } => tri_solve(n, r.k, upper, unit),
    };
    let per_matrix = !matches!(r.op, LinalgOp::TriSolve { .. });
    if let LinalgOp::Lu { .. } = r.op {
        // The pivot search's (and the largest magnitude's) tree reduction.
        s += &format!("var<workgroup> best_v: array<f32, {WG}>;\nvar<workgroup> best_i: array<u32, {WG}>;\n");
    }
    s += &format!(
        "\n@compute @workgroup_size({WG})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {{\n"
    );
    if per_matrix {
        s += &format!("    let m = wid.x + wid.y * nwg.x;\n    if (m >= {batch}u) {{ return; }}\n");
    } else {
        s += &format!(
            "    let t = (wid.x + wid.y * nwg.x) * {WG}u + lid;\n    if (t >= {}u) {{ return; }}\n",
            batch * r.k
        );
    }
    s += &body;
    s += "}\n";
    debug_assert!(groups.0 <= MAX_GROUPS_PER_DIM);
    Ok(WgslKernel {
        name: k.name,
        source: s,
        workgroup: WG as u32,
        groups,
        inputs,
        uses_rng: false,
        can_fault: r.can_fault(),
        trips: linalg_trips(r),
    })
}

/// LU of matrix `m`, in `out` (rows of n + 2).
fn lu(n: usize, check: bool) -> String {
    let cols = n + 2;
    let eps = f32::EPSILON;
    let mut s = format!(
        r#"    let ib = m * {nn}u;
    let ob = m * {ncols}u;
    for (var e = lid; e < {nn}u; e += {WG}u) {{
        out[ob + (e / {n}u) * {cols}u + e % {n}u] = a[ib + e];
    }}
    for (var i = lid; i < {n}u; i += {WG}u) {{
        out[ob + i * {cols}u + {n}u] = f32(i);
    }}
"#,
        nn = n * n,
        ncols = n * cols,
    );
    if check {
        // The largest magnitude, for the singularity threshold.
        s += &format!(
            r#"    var mx = 0.0f;
    for (var e = lid; e < {nn}u; e += {WG}u) {{ mx = max(mx, abs(a[ib + e])); }}
    best_v[lid] = mx;
    workgroupBarrier();
    for (var h = {half}u; h > 0u; h >>= 1u) {{
        if (lid < h) {{ best_v[lid] = max(best_v[lid], best_v[lid + h]); }}
        workgroupBarrier();
    }}
    let tol = f32({n}) * {eps:e}f * best_v[0];
    workgroupBarrier();
"#,
            nn = n * n,
            half = WG / 2,
        );
    }
    s += &format!(
        r#"    storageBarrier();
    for (var k = 0u; k < {n}u; k++) {{
        var bv = -1.0f;
        var bi = k;
        for (var i = k + lid; i < {n}u; i += {WG}u) {{
            let v = abs(out[ob + i * {cols}u + k]);
            if (v > bv) {{ bv = v; bi = i; }}
        }}
        best_v[lid] = bv;
        best_i[lid] = bi;
        workgroupBarrier();
        for (var h = {half}u; h > 0u; h >>= 1u) {{
            if (lid < h) {{
                let ov = best_v[lid + h];
                let oi = best_i[lid + h];
                if (ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid])) {{
                    best_v[lid] = ov;
                    best_i[lid] = oi;
                }}
            }}
            workgroupBarrier();
        }}
        let p = best_i[0];
        if (p != k) {{
            for (var j = lid; j < {n1}u; j += {WG}u) {{
                let x = out[ob + k * {cols}u + j];
                out[ob + k * {cols}u + j] = out[ob + p * {cols}u + j];
                out[ob + p * {cols}u + j] = x;
            }}
        }}
        if (lid == 0u) {{ out[ob + k * {cols}u + {n}u + 1u] = f32(p + 1u); }}
        workgroupBarrier();
        storageBarrier();
        let piv = out[ob + k * {cols}u + k];
"#,
        half = WG / 2,
        n1 = n + 1,
    );
    if check {
        s += &format!("        if (lid == 0u && !(abs(piv) > tol)) {{ kiln_fault({FAULT_SINGULAR}, m, k); }}\n");
    }
    s += &format!(
        r#"        if (piv != 0.0f) {{
            for (var i = k + 1u + lid; i < {n}u; i += {WG}u) {{
                out[ob + i * {cols}u + k] = out[ob + i * {cols}u + k] / piv;
            }}
        }}
        storageBarrier();
        let w = {n}u - 1u - k;
        if (piv != 0.0f) {{
            for (var e = lid; e < w * w; e += {WG}u) {{
                let i = k + 1u + e / w;
                let j = k + 1u + e % w;
                out[ob + i * {cols}u + j] = out[ob + i * {cols}u + j] - out[ob + i * {cols}u + k] * out[ob + k * {cols}u + j];
            }}
        }}
        storageBarrier();
    }}
"#
    );
    s
}

/// Cholesky of matrix `m`'s lower triangle into `out`, right-looking.
fn cholesky(n: usize) -> String {
    format!(
        r#"    let b = m * {nn}u;
    for (var e = lid; e < {nn}u; e += {WG}u) {{
        out[b + e] = select(0.0f, a[b + e], e % {n}u <= e / {n}u);
    }}
    storageBarrier();
    for (var j = 0u; j < {n}u; j++) {{
        let d = out[b + j * {n}u + j];
        workgroupBarrier();
        storageBarrier();
        if (lid == 0u && !(d > 0.0f)) {{ kiln_fault({FAULT_NOT_POSITIVE_DEFINITE}, m, j + 1u); }}
        let l = select(1.0f, sqrt(d), d > 0.0f);
        if (lid == 0u) {{ out[b + j * {n}u + j] = l; }}
        for (var i = j + 1u + lid; i < {n}u; i += {WG}u) {{
            out[b + i * {n}u + j] = out[b + i * {n}u + j] / l;
        }}
        storageBarrier();
        let w = {n}u - 1u - j;
        for (var e = lid; e < w * w; e += {WG}u) {{
            let i = j + 1u + e / w;
            let c = j + 1u + e % w;
            if (c <= i) {{
                out[b + i * {n}u + c] = out[b + i * {n}u + c] - out[b + i * {n}u + j] * out[b + c * {n}u + j];
            }}
        }}
        storageBarrier();
    }}
"#,
        nn = n * n
    )
}

/// Substitution for column `t % k` of matrix `t / k`.
fn tri_solve(n: usize, k: usize, upper: bool, unit: bool) -> String {
    let (row, known) = if upper {
        (format!("{}u - s", n - 1), format!("for (var j = i + 1u; j < {n}u; j++)"))
    } else {
        ("s".to_string(), "for (var j = 0u; j < i; j++)".to_string())
    };
    let divide = if unit {
        String::new()
    } else {
        format!(
            "        let d = a[ab + i * {n}u + i];\n        if (d == 0.0f) {{ kiln_fault({FAULT_SINGULAR}, mi, i); }}\n        x = x / d;\n"
        )
    };
    format!(
        r#"    let mi = t / {k}u;
    let ab = mi * {nn}u;
    let xb = mi * {nk}u + t % {k}u;
    for (var s = 0u; s < {n}u; s++) {{
        let i = {row};
        var x = rhs[xb + i * {k}u];
        {known} {{
            x = x - a[ab + i * {n}u + j] * out[xb + j * {k}u];
        }}
{divide}        out[xb + i * {k}u] = x;
    }}
"#,
        nn = n * n,
        nk = n * k
    )
}
