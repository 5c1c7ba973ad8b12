//! Kernel IR -> WGSL compute shaders, for the wgpu backend.
//!
//! One kernel becomes one compute shader: `@group(0)` binds the inputs as read-only storage arrays (bindings
//! `0..n`), the output as a read-write storage array (binding `n`), and, when the kernel draws random numbers, the
//! plan's rng keys as a read-only `array<u32>` (binding `n + 1`: seed lo, seed hi, offset lo, offset hi per slot).
//! Invocation `t` computes output elements `t, t + T, t + 2T, ..` (`per_thread` of them, `T` threads in all), each
//! with the whole reduction inside (a row kernel: row `t`, its reductions and then its elements, `row_fn`); elements
//! are in row-major output order, so neighbouring invocations write neighbouring words. Long reductions and row
//! kernels are cooperative instead (`cstyle::Coop`): workgroup `g` folds its outputs (its row) together. What `kernel::gemm::GemmView` recognizes can instead be rendered by the tiled template in
//! `gemm.rs` (`render_gemm`, one configuration per call; the wgpu backend chooses it).
//!
//! WGSL is a dialect of the shared C-like renderer (`render::cstyle`), which writes the element function and the
//! per-instruction table. Files: this one decides the launch shape, checks what WGSL can hold and writes the shader
//! around the element (bindings, helpers, entry point); `dialect.rs` is WGSL's spelling of types, literals,
//! conversions, builtins and statements; `math.rs` the WGSL source of each helper (Philox, `pow`, NaN tests on the
//! bits, division by zero, the float -> int conversion of the spec); `gemm.rs` the tiled GEMM template.
//!
//! Types: f32, i32 and u32 are themselves; f16 is stored as `f16` (the shader says `enable f16;`, so the device
//! needs `SHADER_F16`; the backend checks) and computed as f32, each result rounded to f16 by `kiln_round_f16`
//! (u32 arithmetic: WGSL leaves the rounding of `f16(x)` to the implementation); u8 travels as `u32` (masked to
//! 8 bits after arithmetic that can leave the range) and bool as `bool`, both stored as one `u32` per element in
//! device buffers (WGSL has no 8-bit storage; the backend converts on upload and download). f64 and i64 have no
//! WGSL type: `render` refuses them in buffers and accumulators, naming the dtype; the lowering's own 64-bit index
//! and iota arithmetic is computed in 32 bits (see `check`). Index math is i32: a kernel whose index expressions
//! leave the i32 range is refused too.
//!
//! Semantics are those of `kernel::eval` (the executable spec): ints wrap, integer division by zero gives 0,
//! float -> int casts saturate through i64 then wrap, max/min propagate NaN, comparisons with NaN are false except
//! `!=`. Where WGSL differs it is overridden here: WGSL's `x / 0` is `x` (we select 0), its float -> int conversion
//! clamps to the target type (we compute the low 32 bits of the saturated i64 in `math.rs`), its `max`/`min` do not
//! promise NaN propagation (we test for NaN), and its `pow` is undefined for negative bases (we handle the cases).
//! What cannot be matched bit for bit is the accuracy of the driver's `exp`, `log`, `sin`, `cos`, `tanh`, `sqrt`
//! (Vulkan allows a few ulp); the tests hold them to `tests/common::tol`.

mod dialect;
mod gemm;
mod math;
pub mod routine;
mod scatter;

pub use dialect::Wgsl;
pub use gemm::{GemmTile, render_gemm};

use crate::dtype::DType;
use crate::kernel::KernelIr;
use crate::render::cstyle;
use dialect::storage_ty;
use std::fmt::Write;

/// The shared emitter, writing WGSL.
type Emitter<'a> = cstyle::Emitter<'a, Wgsl>;

/// Whether WGSL can hold values of `d` (f64 and i64 have no WGSL type).
pub fn supports(d: DType) -> bool {
    // bf16: WGSL has no such type, and kiln does not emulate it in u32 lanes (yet): the device refuses it.
    !matches!(d, DType::F64 | DType::I64 | DType::BF16)
}

/// Bytes per element of `d` in a device buffer: every supported dtype is one 32-bit word.
pub const WORD: usize = 4;

/// The launch shape of a generic kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgslOptions {
    /// Invocations per workgroup.
    pub workgroup: u32,
    /// Output elements per invocation.
    pub per_thread: u32,
}

impl WgslOptions {
    /// The choice for `k` in the generic form: 64-wide workgroups and one element per invocation for the short
    /// reductions `cstyle::Coop::choose` leaves to it (each invocation runs a whole reduce loop, and fewer threads
    /// per group keep more groups in flight); 256-wide groups for
    /// elementwise kernels, with 4 elements per invocation once there are more than 2^18 elements (fewer, fatter
    /// invocations amortize the index decomposition and, on a CPU driver such as lavapipe, the per-invocation cost).
    pub fn choose(k: &KernelIr) -> WgslOptions {
        let total: usize = k.out_extents.iter().product();
        if k.reduce.is_some() || !k.rows.is_empty() {
            WgslOptions { workgroup: 64, per_thread: 1 }
        } else if total > 1 << 18 {
            WgslOptions { workgroup: 256, per_thread: 4 }
        } else {
            WgslOptions { workgroup: 256, per_thread: 1 }
        }
    }
}

/// Which form a kernel with a long reduction takes, chosen per adapter by the wgpu backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceForm {
    /// Cooperative wherever `cstyle::Coop::choose` takes the kernel: what a GPU wants ([`render`]'s form).
    Cooperative,
    /// One invocation per output (a CPU driver such as lavapipe runs a workgroup's invocations as SIMD lanes of one
    /// thread, where that form vectorizes across outputs and barriers cost more), except where one invocation's loop
    /// would pass `cap` trips (the driver's loop cap): there the cooperative form keeps each loop short.
    Generic { cap: Option<usize> },
}

/// A rendered kernel and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslKernel {
    pub name: String,
    pub source: String,
    /// Invocations per workgroup (the shader's `@workgroup_size`).
    pub workgroup: u32,
    /// Workgroups to dispatch as (x, y); (0, 0) for an empty output (nothing to launch).
    pub groups: (u32, u32),
    /// Number of input bindings (the output is binding `inputs`, the rng keys `inputs + 1`).
    pub inputs: usize,
    /// Whether the shader binds the rng keys.
    pub uses_rng: bool,
    /// Whether the shader binds a fault record (it gathers: `kernel::fault`), after the rng keys if any.
    pub can_fault: bool,
    /// The most trips of any one loop in one invocation (a driver may cap them: the wgpu backend's
    /// `loop_trip_cap`).
    pub trips: usize,
}

/// The most workgroups along one dispatch dimension (WebGPU's `maxComputeWorkgroupsPerDimension` default).
pub const MAX_GROUPS_PER_DIM: u32 = 65_535;

/// Workgroups for `threads` invocations: `x` up to `MAX_GROUPS_PER_DIM`, the rest along `y`. The shader
/// linearizes `(x, y)` and drops invocations past `threads`.
pub fn groups_for(threads: u64, workgroup: u32) -> Result<(u32, u32), String> {
    let groups = threads.div_ceil(workgroup as u64);
    if groups == 0 {
        return Ok((0, 0));
    }
    let x = groups.min(MAX_GROUPS_PER_DIM as u64);
    let y = groups.div_ceil(x);
    if y > MAX_GROUPS_PER_DIM as u64 {
        return Err(format!("{threads} invocations exceed the dispatch limits"));
    }
    Ok((x as u32, y as u32))
}

/// Checks that WGSL can run `k` (`cstyle::check_narrowed`: no 64-bit or bf16 buffers, indices in i32).
pub fn check(k: &KernelIr) -> Result<(), String> {
    cstyle::check_narrowed(k, "WGSL")
}

/// Renders `k` with the launch shape `WgslOptions::choose` picks, long reductions cooperatively.
pub fn render(k: &KernelIr) -> Result<WgslKernel, String> {
    render_as(k, ReduceForm::Cooperative, &[])
}

/// Renders `k` with an explicit launch shape for the generic form (a kernel `cstyle::Coop::choose` takes is
/// rendered cooperatively whatever `opts` says).
pub fn render_with(k: &KernelIr, opts: WgslOptions) -> Result<WgslKernel, String> {
    render_full(k, opts, &[], ReduceForm::Cooperative)
}

/// Renders `k` with long reductions in `form`, reading the inputs at `aliased` through the output (see
/// [`render_aliased`]; empty for none).
pub fn render_as(k: &KernelIr, form: ReduceForm, aliased: &[usize]) -> Result<WgslKernel, String> {
    if let Some(&i) = aliased.iter().find(|&&i| k.inputs.get(i).is_none_or(|b| *b != k.output)) {
        return Err(format!("kernel {}: input {i} cannot be read through the output", k.name));
    }
    render_full(k, WgslOptions::choose(k), aliased, form)
}

/// `render`, for a launch whose output is written over one of its inputs (buffer donation): the inputs at
/// positions `aliased` are read from `out` instead of their own bindings, which stay declared (the bind group
/// layout is the same) but are never used, so the caller binds any placeholder there. WebGPU refuses one buffer
/// bound read-only and read-write in the same dispatch; this reads it through the one read-write binding. Correct
/// only where each invocation reads an aliased input at the element it writes, before writing it (what
/// `KernelPlan::donation_candidates` checks) and `aliased` holds inputs of the output's dtype and length.
pub fn render_aliased(k: &KernelIr, aliased: &[usize]) -> Result<WgslKernel, String> {
    render_as(k, ReduceForm::Cooperative, aliased)
}

fn render_full(k: &KernelIr, opts: WgslOptions, aliased: &[usize], form: ReduceForm) -> Result<WgslKernel, String> {
    check(k)?;
    // A row kernel runs one invocation per row (its reductions, then its elements).
    let total = k.units() as u64;
    let per_thread = opts.per_thread.max(1) as u64;
    let threads = total.div_ceil(per_thread);
    let groups = groups_for(threads, opts.workgroup)?;
    let mut em = Emitter::new(&Wgsl, k);
    em.aliased = aliased.to_vec();
    if total == 0 {
        // Nothing to compute (a size-0 dim): a valid shader that is never dispatched.
        let s = header(&em) + "\n@compute @workgroup_size(1)\nfn main() {}\n";
        return Ok(WgslKernel {
            name: k.name.clone(),
            source: s,
            workgroup: 1,
            groups,
            inputs: k.inputs.len(),
            uses_rng: false,
            can_fault: k.can_fault(),
            trips: 0,
        });
    }
    let coop = cstyle::Coop::choose(k).filter(|_| match form {
        ReduceForm::Cooperative => true,
        ReduceForm::Generic { cap } => cap.is_some_and(|cap| cstyle::loop_trips(k, None) > cap),
    });
    if let Some(c) = coop {
        return render_coop(em, c);
    }
    let mut body = em.element_fn();
    if !k.rows.is_empty() {
        body.push_str(&em.row_fn());
    }
    let call = if k.rows.is_empty() { "element" } else { "row" };
    let mut s = header(&em);
    s.push_str(&body);
    let _ = write!(
        s,
        "\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, \
         @builtin(num_workgroups) nwg: vec3<u32>) {{\n    let t = gid.x + gid.y * nwg.x * {wg}u;\n    \
         if (t >= {threads}u) {{ return; }}\n",
        wg = opts.workgroup
    );
    if per_thread == 1 {
        let _ = write!(s, "    {call}(i32(t));\n}}\n");
    } else {
        let _ = write!(
            s,
            "    for (var j = 0u; j < {per_thread}u; j++) {{\n        let e = t + j * {threads}u;\n        \
             if (e >= {total}u) {{ return; }}\n        {call}(i32(e));\n    }}\n}}\n"
        );
    }
    Ok(WgslKernel {
        name: k.name.clone(),
        source: s,
        workgroup: opts.workgroup,
        groups,
        inputs: k.inputs.len(),
        uses_rng: em.uses_rng,
        can_fault: k.can_fault(),
        trips: cstyle::loop_trips(k, None).max(per_thread as usize),
    })
}

/// A cooperative reduction (`cstyle::Coop`): one workgroup per `lanes` outputs (a row kernel: per row), the
/// groups linearized over `(x, y)` as in the generic form; groups past the last return before any barrier (the
/// test is uniform: it reads only the workgroup id).
fn render_coop(mut em: Emitter<'_>, c: cstyle::Coop) -> Result<WgslKernel, String> {
    let k = em.k;
    let n = c.groups(k);
    let groups = groups_for(n as u64 * c.width() as u64, c.width())?;
    let body = em.coop_fns(c);
    let mut s = header(&em);
    s.push_str(&body);
    let _ = write!(
        s,
        "\n@compute @workgroup_size({w})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, \
         @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{\n    \
         let g = wid.x + wid.y * nwg.x;\n    if (g >= {n}u) {{ return; }}\n    coop(i32(g), i32(lid));\n}}\n",
        w = c.width()
    );
    Ok(WgslKernel {
        name: k.name.clone(),
        source: s,
        workgroup: c.width(),
        groups,
        inputs: k.inputs.len(),
        uses_rng: em.uses_rng,
        can_fault: k.can_fault(),
        trips: cstyle::loop_trips(k, Some(c)),
    })
}

/// The comment line, `enable f16;` where a buffer holds f16, the bindings, and the helper functions the body used
/// (call after rendering the body).
fn header(em: &Emitter<'_>) -> String {
    let k = em.k;
    let mut s = format!("// kiln kernel {}\n", k.name);
    if k.inputs.iter().chain([&k.output]).any(|b| b.dtype == DType::F16) {
        s.push_str("enable f16;\n");
    }
    for (i, b) in k.inputs.iter().enumerate() {
        let _ = writeln!(
            s,
            "@group(0) @binding({i}) var<storage, read> in{i}: array<{}>; // {}[{}]",
            storage_ty(b.dtype),
            b.dtype,
            b.len
        );
    }
    let _ = writeln!(
        s,
        "@group(0) @binding({}) var<storage, read_write> out: array<{}>; // {}[{}]",
        k.inputs.len(),
        storage_ty(k.output.dtype),
        k.output.dtype,
        k.output.len
    );
    if em.uses_rng {
        let _ = writeln!(s, "@group(0) @binding({}) var<storage, read> rng: array<u32>;", k.inputs.len() + 1);
    }
    if k.can_fault() {
        let at = k.inputs.len() + 1 + usize::from(em.uses_rng);
        let _ = writeln!(s, "@group(0) @binding({at}) var<storage, read_write> fault: array<atomic<i32>, 3>;");
    }
    s.push_str(&em.helpers_source());
    s
}
