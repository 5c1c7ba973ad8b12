//! What the `kiln` crate asks of the devices as a whole rather than of one [`Backend`](crate::Backend): the
//! process-wide compile counters, the warm-up after a bundle import, the `KILN_PROFILE` report, and the note for a
//! cache entry that could not be written. Each function answers for every device built into this binary (its cargo
//! feature on), so the caller names no device. A device with nothing to say adds nothing: wgpu counts no compiles,
//! has nothing to warm and times no launches, so a build with only wgpu reports zeros and an empty profile.
//!
//! Per-device questions (compiling, memory, a device's tuning records) stay on the `Backend` trait.

/// Counters of the devices' compile paths since the process started (surfaced by `kiln::stats()`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// GEMM searches run (a tuning-cache miss with `KILN_AUTOTUNE` fast or full).
    pub tunings: u64,
    /// GEMM tuning records reused from memory, disk or an imported bundle.
    pub tune_hits: u64,
    /// GEMM kernel sets generated for plans (code generation ran).
    pub kernel_compiles: u64,
    /// GEMM kernel sets mapped from cached code (no code generation).
    pub kernel_loads: u64,
    /// Cranelift kernels compiled.
    pub clif_compiles: u64,
    /// Cranelift kernels mapped from the kernel cache (no compilation).
    pub clif_loads: u64,
    /// Executable mappings made for compiled code (see `kiln::Stats::code_mappings`).
    pub code_mappings: u64,
    /// Elementwise kernels run at full width instead of compiled by Cranelift (`cpu::wide`), per kernel a plan runs.
    pub wide_builds: u64,
    /// Of those, the kernels generated (the others reused the code of an earlier kernel of the same IR).
    pub wide_generations: u64,
}

/// The compile counters now. Only the CPU counts (the wgpu device's compiles and tunings are not counted).
pub fn stats() -> CompileStats {
    #[cfg(feature = "cpu")]
    return crate::cpu::gemm::stats();
    #[cfg(not(feature = "cpu"))]
    return CompileStats::default();
}

/// Pays now what a process would otherwise pay in its first plan runs, for what the process-wide store holds
/// (`kiln::tune::import_bundle` and `warm_from_cache` call it once the store's memory holds the entries): on the
/// CPU, mapping the cached kernels, the GEMM runtime's start-up and the host pool's profiled buffers
/// (`cpu::warm_runtime`).
pub fn warm_up() {
    #[cfg(feature = "cpu")]
    crate::cpu::warm_runtime();
}

/// With `KILN_PROFILE=1`: the time spent in each kernel so far, per device, heaviest first (empty otherwise; see
/// `profile.rs` for how each device times a launch).
pub fn profile_report() -> String {
    crate::profile::report()
}

/// A cache entry could not be written (a read-only or full cache dir): the result still holds for this process.
/// Said once per process on stderr, not once per entry; `KILN_LOG` shows every one.
pub fn cache_write_failed(what: &str, e: &dyn std::fmt::Display) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "kiln: cannot write to the kernel and tuning cache ({e}); results hold for this process only \
             (set KILN_CACHE_DIR to a writable dir, or to `off`)"
        );
    } else {
        tracing_note(&format!("{what} not cached: {e}"));
    }
}

/// Diagnostics that are not errors go to stderr only when `KILN_LOG` is set (the tracing layer comes later).
pub(crate) fn tracing_note(msg: &str) {
    if std::env::var_os("KILN_LOG").is_some() {
        eprintln!("kiln: {msg}");
    }
}
