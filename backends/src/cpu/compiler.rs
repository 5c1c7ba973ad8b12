//! The Cranelift compiler for CPU kernels and its kernel cache: renders a kernel's IR to CLIF, compiles it for the
//! host (cranelift-native picks up AVX/FMA/SSE4 flags) and maps the code.
//!
//! Compilation goes through one process-wide `JITModule` behind a mutex (compiling is the slow path), and a
//! kernel cache keyed by the kernel IR's full text plus the vectorization choice: the IR determines the CLIF, and
//! the module is this process's host, so the text is a complete key. Code is never freed: plans live as long as the
//! process's plan cache, which has no eviction either. Compiled kernels also persist in the store (`clif-*`
//! artifacts) and are mapped from there by later processes.

use crate::runtime::{cache_write_failed, tracing_note};
use cranelift_codegen::Context;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use kiln_jit::kernel::KernelIr;
use kiln_jit::render::clif;
use parking_lot::Mutex;
use std::sync::LazyLock;

/// `fn(args, rng, start, end)`: see `kiln_jit::render::clif`.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, *const u64, i64, i64);

pub(crate) struct Compiler {
    isa: OwnedTargetIsa,
    /// Whether the host has FMA (cranelift-native enabled `has_fma`), so `fma` lowers to an instruction.
    fma: bool,
    kernels: rustc_hash::FxHashMap<(String, bool), KernelFn>,
    /// The mappings every handed-out `KernelFn` points into, kept for the life of the process.
    code: Vec<dynasmrt::ExecutableBuffer>,
    /// Cached kernels mapped ahead of use ([`premap_cached_kernels`]), by artifact name.
    premapped: rustc_hash::FxHashMap<String, KernelFn>,
    next: u32,
}

// SAFETY: the code mappings are immutable once made executable, and the compiler is only touched under the
// COMPILER mutex; the kernels it hands out are callable from any thread.
unsafe impl Send for Compiler {}

/// Cranelift kernels compiled, and loaded from the kernel cache instead of compiled, since the process started.
pub(crate) static CLIF_COMPILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static CLIF_LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) static COMPILER: LazyLock<Result<Mutex<Compiler>, String>> =
    LazyLock::new(|| Compiler::new().map(Mutex::new));

impl Compiler {
    fn new() -> Result<Compiler, String> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
        flags.set("is_pic", "false").map_err(|e| e.to_string())?;
        // The verifier checks the CLIF the renderer produced: a renderer bug caught there is clearer than one caught
        // running the kernel, so debug builds (the tests) keep it; a release build skips its ~10 % of compile time.
        let verify = if cfg!(debug_assertions) { "true" } else { "false" };
        flags.set("enable_verifier", verify).map_err(|e| e.to_string())?;
        let isa = cranelift_native::builder()
            .map_err(|e| format!("host ISA not supported by Cranelift: {e}"))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())?;
        let fma = isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        Ok(Compiler { isa, fma, kernels: Default::default(), code: Vec::new(), premapped: Default::default(), next: 0 })
    }

    /// Compiles `k` (or finds it), returning the entry point and, for dumps, the CLIF and disassembly.
    pub(crate) fn kernel(&mut self, k: &KernelIr, dump: bool) -> Result<(KernelFn, Option<(String, String)>), String> {
        let text = k.to_text();
        for vectorize in [true, false] {
            // A reduction that gathers rows (an embedding summed against weights) has no vector form along its
            // output (its i64 index varies there) but has one along its reduce loop. Other kernels without an output
            // vector form stay scalar: a product over a few partials folded in vector order can overflow where the
            // scalar order does not.
            let along_reduce = k.can_fault() && clif::reduce_vectorizable(k);
            if vectorize && !clif::vectorizable(k) && !along_reduce {
                continue;
            }
            if !dump && let Some(&f) = self.kernels.get(&(text.clone(), vectorize)) {
                return Ok((f, None));
            }
            match self.compile(k, vectorize, dump) {
                Ok((f, d)) => {
                    self.kernels.insert((text, vectorize), f);
                    return Ok((f, d));
                }
                // A vector form the host cannot lower (say, i32x4 multiply without SSE4.1) falls back to scalar;
                // CLIF the verifier rejects is the renderer's bug, never hidden by a fallback.
                Err(Failed::Lowering(e)) if vectorize => {
                    tracing_note(&format!("{}: vector form failed ({e}); using scalar", k.name))
                }
                Err(Failed::Lowering(e) | Failed::Fatal(e)) => return Err(e),
            }
        }
        unreachable!("the scalar form either compiles or errors")
    }

    /// Compiles `k` with Cranelift, or maps its machine code from the kernel cache (keyed by everything that
    /// determines the code: the kernel IR text, the render options and the renderer's revision; the store's
    /// namespace adds the kiln version, which pins the Cranelift version, and the CPU fingerprint). With `dump`, it
    /// always compiles (for the text).
    fn compile(
        &mut self,
        k: &KernelIr,
        vectorize: bool,
        dump: bool,
    ) -> Result<(KernelFn, Option<(String, String)>), Failed> {
        use std::sync::atomic::Ordering;
        let index = self.next;
        self.next += 1;
        let opts = clif::RenderOptions { vectorize, fma: self.fma, tile: clif::TileConfig::default() };
        let store = kiln_autotune::Store::global();
        let key = format!("{}|{opts:?}|r{}", k.to_text(), clif::REVISION);
        let name = format!(
            "{CLIF_ARTIFACT_PREFIX}{:016x}-{:016x}",
            kiln_autotune::checksum_of([key.as_str()]),
            kiln_autotune::checksum_of([key.as_str(), "kiln"])
        );
        if !dump && let Some(&f) = self.premapped.get(&name) {
            CLIF_LOADS.fetch_add(1, Ordering::Relaxed);
            return Ok((f, None));
        }
        if !dump
            && let Some(bytes) = store.get_artifact(&name)
            && let Ok(code) = super::code::RelocatableCode::from_artifact(&bytes)
            && let Ok(f) = self.map(&code)
        {
            CLIF_LOADS.fetch_add(1, Ordering::Relaxed);
            return Ok((f, None));
        }
        let func = clif::render_with(k, index, self.isa.frontend_config(), opts);
        let clif_text = dump.then(|| func.display().to_string());
        let mut ctx = Context::for_function(func);
        ctx.set_disasm(dump);
        let mut ctrl = cranelift_codegen::control::ControlPlane::default();
        let (bytes, raw_relocs, disasm) = {
            let c = ctx.compile(&*self.isa, &mut ctrl).map_err(|e| {
                let text = format!("{}: {:?}", k.name, e.inner);
                match e.inner {
                    cranelift_codegen::CodegenError::Verifier(_) => Failed::Fatal(text),
                    _ => Failed::Lowering(text),
                }
            })?;
            (c.code_buffer().to_vec(), c.buffer.relocs().to_vec(), c.vcode.clone().unwrap_or_default())
        };
        let mut relocs = Vec::with_capacity(raw_relocs.len());
        for r in raw_relocs {
            use cranelift_codegen::FinalizedRelocTarget;
            use cranelift_codegen::binemit::Reloc;
            use cranelift_codegen::ir::ExternalName;
            match (r.kind, &r.target) {
                (Reloc::Abs8, FinalizedRelocTarget::ExternalName(ExternalName::User(u))) => {
                    let callee = &ctx.func.params.user_named_funcs()[*u];
                    relocs.push((r.offset, callee.index, r.addend));
                }
                (kind, target) => {
                    return Err(Failed::Fatal(format!("{}: unexpected relocation {kind:?} to {target:?}", k.name)));
                }
            }
        }
        let code = super::code::RelocatableCode { code: bytes, relocs };
        let f = self.map(&code).map_err(Failed::Fatal)?;
        CLIF_COMPILES.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = store.put_artifact(&name, &code.to_artifact()) {
            cache_write_failed(&format!("kernel {}", k.name), &e);
        }
        Ok((f, clif_text.map(|c| (c, disasm))))
    }

    /// Maps relocatable code and returns its entry point (the code starts with the function).
    fn map(&mut self, code: &super::code::RelocatableCode) -> Result<KernelFn, String> {
        let buf = code.load()?;
        // SAFETY: the code is a function compiled from `kernel_signature`, which is exactly `KernelFn`'s ABI, starting
        // at offset 0, with its libcall addresses patched for this process; `buf` is kept in `self.code` for the life
        // of the process, so the pointer stays valid.
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(buf.ptr(dynasmrt::AssemblyOffset(0))) };
        self.code.push(buf);
        Ok(f)
    }
}

/// Maps every cached Cranelift kernel the store holds in memory (after `import_bundle`: the bundle's) into one
/// executable mapping, so that the plans of a warm process find their kernels mapped already instead of paying a
/// mapping each (see `code`'s module doc). Kernels mapped before are skipped; a failure only logs (`KILN_LOG`):
/// the kernels then map one by one when used, as without this.
pub(crate) fn premap_cached_kernels(store: &kiln_autotune::Store) {
    let Ok(compiler) = COMPILER.as_ref() else { return };
    let mut c = compiler.lock();
    let mut names = Vec::new();
    let mut blobs = Vec::new();
    for (name, bytes) in store.artifacts_with_prefix(CLIF_ARTIFACT_PREFIX) {
        if c.premapped.contains_key(&name) {
            continue;
        }
        match super::code::RelocatableCode::from_artifact(&bytes).and_then(|code| code.patched()) {
            Ok(code) => {
                names.push(name);
                blobs.push(code);
            }
            Err(e) => tracing_note(&format!("cached kernel {name} not premapped: {e}")),
        }
    }
    if blobs.is_empty() {
        return;
    }
    let slices: Vec<&[u8]> = blobs.iter().map(|b| b.as_slice()).collect();
    match super::code::map_together(&slices) {
        Ok((buf, offsets)) => {
            for (name, off) in names.into_iter().zip(offsets) {
                // SAFETY: as in `Compiler::map`: each blob is a kernel compiled from `kernel_signature` (`KernelFn`'s
                // ABI) starting at its offset, patched for this process; `buf` is kept in `code` for the life of the
                // process.
                let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(buf.ptr(dynasmrt::AssemblyOffset(off))) };
                c.premapped.insert(name, f);
            }
            c.code.push(buf);
        }
        Err(e) => tracing_note(&format!("cached kernels not premapped: {e}")),
    }
}

/// Why a Cranelift compile failed.
enum Failed {
    /// A form the host's ISA cannot lower: a vector form falls back to scalar code.
    Lowering(String),
    /// CLIF the verifier rejects (a renderer bug; the verifier runs in debug builds only), or code that cannot be
    /// mapped: the scalar form would not do better.
    Fatal(String),
}

/// Names of cached Cranelift kernels in the store start with this.
const CLIF_ARTIFACT_PREFIX: &str = "clif-";
