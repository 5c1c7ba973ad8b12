//! With `KILN_CHECK_GPU_C=1`, every kernel plan this process schedules (on any device) is also rendered to CUDA C
//! and HIP C (`kiln_jit::render::cuda`) and put through the front ends of NVRTC for sm_80 and sm_90 and of hiprtc
//! for gfx90a and gfx1030 (`rtc`: preprocessing, parsing, types, overloads, each target's builtins): how CI holds the
//! GPU renderers to every kernel the op table, the random graphs and the gradient checks produce, on a machine
//! without a GPU. `KILN_CHECK_GPU_C=codegen` generates code for sm_90 and gfx90a (a cubin, a code object; their
//! front ends run as its first stage), which catches what only a back end refuses (an instruction the target cannot
//! select); it costs about three times the front ends of all four targets, so CI runs it over the op table's corpus
//! (every op and dtype) only. NVRTC's targets and hiprtc's are checked on two threads at once.
//!
//! Kernels are queued (once per distinct source) and compiled in batches of [`BATCH`], one translation unit each
//! (every kernel in a namespace of its own); a batch that fails is compiled kernel by kernel to name the one at
//! fault, and the error carries its source and the compiler's log. A kernel the renderers refuse (an index
//! expression past i32: `cuda::check`) is counted, not compiled. A GEMM kernel is also compiled as the tiled template
//! in the CUDA device's default tile (`cuda::render_gemm`), and a bf16 one as the tensor-core template
//! (`cuda::render_gemm_mma`, for the CUDA targets only), as the devices run them.
//!
//! A backend calls [`note`] when it compiles a plan (a failed auto-flush fails that compile); a test calls
//! [`flush`] when it ends, which compiles what is left and reports what was checked.

use kiln_jit::kernel::KernelPlan;
use kiln_jit::kernel::gemm::GemmView;
use kiln_jit::render::cuda::{DEFAULT_TILE, Flavor, MmaTile, render, render_gemm, render_gemm_mma};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

/// Kernels per translation unit.
pub const BATCH: usize = 200;

/// The targets whose front ends check each kernel, and whether `codegen` generates code for it instead.
const TARGETS: [(Flavor, &str, bool); 4] = [
    (Flavor::Cuda, "sm_80", false),
    (Flavor::Cuda, "sm_90", true),
    (Flavor::Hip, "gfx90a", true),
    (Flavor::Hip, "gfx1030", false),
];

/// How far `KILN_CHECK_GPU_C` takes each kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Unset (or any other value): nothing is checked.
    Off,
    /// `1`: the four targets' front ends.
    FrontEnd,
    /// `codegen`: code generation for sm_90 and gfx90a, the front ends for the other two.
    Codegen,
}

/// The level `KILN_CHECK_GPU_C` asks for, read once.
pub fn level() -> Level {
    static L: OnceLock<Level> = OnceLock::new();
    *L.get_or_init(|| match std::env::var("KILN_CHECK_GPU_C").as_deref() {
        Ok("1") => Level::FrontEnd,
        Ok("codegen") => Level::Codegen,
        _ => Level::Off,
    })
}

/// Whether kernels are checked at all.
pub fn enabled() -> bool {
    level() != Level::Off
}

#[derive(Default)]
struct State {
    seen: HashSet<u64>,
    /// Queued (name, CUDA source, HIP source): a kernel only one language has (the tensor-core GEMM) has `None`
    /// for the other.
    queue: Vec<(String, Option<String>, Option<String>)>,
    compiled: usize,
    refused: usize,
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn compilers() -> &'static Result<(crate::rtc::Rtc, crate::rtc::Rtc), String> {
    static C: OnceLock<Result<(crate::rtc::Rtc, crate::rtc::Rtc), String>> = OnceLock::new();
    C.get_or_init(|| Ok((crate::rtc::Rtc::nvrtc()?, crate::rtc::Rtc::hiprtc()?)))
}

/// Queues `plan`'s kernels (when enabled), compiling a batch once [`BATCH`] are queued.
pub fn note(plan: &KernelPlan) -> Result<(), String> {
    if !enabled() {
        return Ok(());
    }
    let full = {
        let mut st = state().lock();
        for l in &plan.launches {
            let (cuda, hip) = match (render(&l.kernel, Flavor::Cuda), render(&l.kernel, Flavor::Hip)) {
                (Ok(c), Ok(h)) => (c.source, h.source),
                _ => {
                    st.refused += 1;
                    continue;
                }
            };
            let mut h = std::collections::hash_map::DefaultHasher::new();
            cuda.hash(&mut h);
            if st.seen.insert(h.finish()) {
                st.queue.push((l.kernel.name.clone(), Some(cuda), Some(hip)));
            }
            // A GEMM also as the tiled template the GPU devices run it with, and a bf16 one as the tensor-core
            // template (CUDA only; both CUDA targets have its `mma.sync`). Not every split or TF32 form: their own
            // code is the same for every GEMM (only the epilogue, checked here, differs), and `tests/cuda_host.rs`
            // compiles each split tile and the TF32 template for sm_80 and sm_90.
            let Some(v) = GemmView::of(&l.kernel) else { continue };
            let mut queue = |name: String, cuda: String, hip: Option<String>| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                cuda.hash(&mut h);
                if st.seen.insert(h.finish()) {
                    st.queue.push((name, Some(cuda), hip));
                }
            };
            let tiled = |f| render_gemm(&l.kernel, &v, DEFAULT_TILE, 1, f).ok();
            if let (Some(cuda), Some(hip)) = (tiled(Flavor::Cuda), tiled(Flavor::Hip)) {
                queue(format!("{} (tiled)", l.kernel.name), cuda.source, Some(hip.source));
            }
            if v.operands == kiln_jit::DType::BF16
                && let Ok(mma) = render_gemm_mma(&l.kernel, &v, MmaTile::SQUARE, 1, Flavor::Cuda)
            {
                queue(format!("{} (tensor cores)", l.kernel.name), mma.source, None);
            }
        }
        st.queue.len() >= BATCH
    };
    if full { flush().map(|_| ()) } else { Ok(()) }
}

/// Compiles every queued kernel; returns (kernels compiled so far, kernels refused so far).
pub fn flush() -> Result<(usize, usize), String> {
    if !enabled() {
        return Ok((0, 0));
    }
    // One batch at a time (it already keeps two cores busy, one per compiler).
    static COMPILING: Mutex<()> = Mutex::new(());
    let _one = COMPILING.lock();
    let batch = std::mem::take(&mut state().lock().queue);
    if batch.is_empty() {
        let st = state().lock();
        return Ok((st.compiled, st.refused));
    }
    let (nvrtc, hiprtc) = compilers().as_ref().map_err(|e| format!("KILN_CHECK_GPU_C=1: {e}"))?;
    // NVRTC's stages on this thread and hiprtc's on another: the two libraries share nothing, and each one's stages
    // stay in order (hiprtc serializes its own programs anyway, `rtc`), so the check takes the longer of the two.
    let (cuda, hip) = std::thread::scope(|s| {
        let hip = s.spawn(|| check_batch(&batch, Flavor::Hip, hiprtc));
        let cuda = check_batch(&batch, Flavor::Cuda, nvrtc);
        (cuda, hip.join().unwrap_or_else(|_| Err("the hiprtc checking thread panicked".into())))
    });
    cuda.and(hip)?;
    let mut st = state().lock();
    st.compiled += batch.len();
    Ok((st.compiled, st.refused))
}

/// Puts `batch` through `flavor`'s targets: each target's front end, or with `codegen` code generation instead where
/// the target generates code (which runs the front end first, so checking both would parse every kernel twice).
fn check_batch(
    batch: &[(String, Option<String>, Option<String>)],
    flavor: Flavor,
    rtc: &crate::rtc::Rtc,
) -> Result<(), String> {
    let pick =
        |k: &(String, Option<String>, Option<String>)| if flavor == Flavor::Cuda { k.1.clone() } else { k.2.clone() };
    let batch: Vec<(&str, String)> = batch.iter().filter_map(|k| pick(k).map(|s| (k.0.as_str(), s))).collect();
    if batch.is_empty() {
        return Ok(());
    }
    let targets = TARGETS.iter().filter(|t| t.0 == flavor);
    for &(_, arch, emit) in targets {
        let codegen = emit && level() == Level::Codegen;
        let run = |source: &str, name: &str| {
            if codegen { rtc.compile(source, name, arch).map(|_| ()) } else { rtc.check(source, name, arch) }
        };
        let what = if codegen { "generate code" } else { "pass the front end" };
        let unit: String = batch
            .iter()
            .enumerate()
            .map(|(i, (_, source))| format!("namespace kiln_k{i} {{\n{}\n}}\n", source.replace("extern \"C\" ", "")))
            .collect();
        if run(&unit, "kiln_batch.cu").is_ok() {
            continue;
        }
        for (name, source) in &batch {
            if let Err(log) = run(source, &format!("{name}.cu")) {
                return Err(format!(
                    "{} kernel {name} does not {what} for {arch}:\n{log}\n--- source:\n{source}",
                    flavor.name(),
                ));
            }
        }
        return Err(format!(
            "{}: a batch of {} kernels does not {what} for {arch}, though each alone does",
            flavor.name(),
            batch.len()
        ));
    }
    Ok(())
}
