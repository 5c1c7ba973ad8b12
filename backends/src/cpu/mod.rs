//! The CPU device: a graph's schedule becomes a plan (`plan`) of generated GEMMs (`gemm`), 8- or 16-lane elementwise
//! kernels (`wide`) and Cranelift kernels (`compiler`), run on a thread pool (`pool`). `KILN_CPU_ENGINE=interp` runs the reference interpreter instead, to bisect a suspected codegen bug.

mod blocked;
mod buffers;
mod caches;
mod code;
mod compiler;
pub mod gemm;
pub mod isa;
mod plan;
mod routines;
mod scatter;
mod sort;
pub use gemm::select::{PreparedGemm, run_gemm_with, set_autotune_mode, take_last_tune_record};
mod libcalls;
pub mod pool;
mod wide;

/// The 8-lane elementwise kernel generated for `k` (its register program, loop shape and code size, as `KILN_DUMP`
/// writes it), or `None` where `k` stays a Cranelift kernel (not such a kernel, or no AVX2 here). Always the 8-lane
/// form, so a golden listing reads the same on every host (a plan may run the 16-lane one: `wide`'s `width`).
pub fn wide_listing(k: &kiln_jit::kernel::KernelIr) -> Result<Option<String>, String> {
    Ok(wide::WideKernel::build_for(k, isa::Isa::Avx2)?.map(|w| w.listing()))
}

/// Runs `k` once as the generated elementwise or row kernel of width `isa` on `inputs` (checked against the kernel's
/// buffers), on the pool; `Ok(None)` where `k` is not such a kernel or this host lacks `isa`. For the tests that
/// hold every width to the same results.
pub fn run_wide_at(
    k: &kiln_jit::kernel::KernelIr,
    isa: isa::Isa,
    inputs: &[&HostBuffer],
) -> Result<Option<HostBuffer>, String> {
    enum Either {
        Wide(Box<wide::WideKernel>),
        Rows(wide::rows::RowKernel),
    }
    let w = if k.rows.is_empty() {
        wide::WideKernel::build_for(k, isa)?.map(|w| Either::Wide(Box::new(w)))
    } else {
        wide::rows::RowKernel::build_for(k, isa)?.map(Either::Rows)
    };
    let Some(w) = w else { return Ok(None) };
    buffers::check_inputs(k, inputs)?;
    let mut out = crate::host_pool::take(k.output.dtype, k.output.len);
    let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| buffers::read_ptr(b)).collect();
    ptrs.push(buffers::write_ptr(&mut out));
    // SAFETY: the inputs were checked against the kernel's buffers above and the output allocated at its length;
    // the output aliases no input.
    unsafe {
        match &w {
            Either::Wide(w) => w.run(&ptrs),
            Either::Rows(r) => r.run(&ptrs),
        }
        buffers::finish_output(&mut out, k.output.len);
    }
    Ok(Some(out))
}

/// Whether a CPU plan takes row kernel `k` (the schedule's `row_kernel_ok` here): it generates it at this host's
/// width. For the tests that check softmax and its kin do run as one generated kernel.
pub fn takes_row_kernel(k: &kiln_jit::kernel::KernelIr) -> bool {
    wide::rows::generates(k)
}

/// Runs `k` once as a Cranelift kernel (the code a plan runs where nothing generated takes a kernel) on `inputs`
/// (checked against the kernel's buffers), on this thread. For the tests that hold the Cranelift rendering of
/// kernels a plan on this host would generate (row kernels) to the interpreter. Random draws read zero keys.
pub fn run_clif_at(k: &kiln_jit::kernel::KernelIr, inputs: &[&HostBuffer]) -> Result<HostBuffer, String> {
    let f = {
        let compiler = compiler::COMPILER.as_ref().map_err(|e| e.clone())?;
        let mut c = compiler.lock();
        c.kernel(k, false)?.0
    };
    buffers::check_inputs(k, inputs)?;
    let mut out = crate::host_pool::take(k.output.dtype, k.output.len);
    let mut ptrs: Vec<*mut u8> = inputs.iter().map(|b| buffers::read_ptr(b)).collect();
    ptrs.push(buffers::write_ptr(&mut out));
    let rng = vec![0u64; 64];
    let rows = k.out_extents.first().copied().unwrap_or(1) as i64;
    // SAFETY: the inputs were checked against the kernel's buffers above and the output allocated at its length;
    // `rng` holds zero keys for up to 32 slots, and `0..rows` is output loop 0.
    unsafe {
        f(ptrs.as_ptr(), rng.as_ptr(), 0, rows);
        buffers::finish_output(&mut out, k.output.len);
    }
    Ok(out)
}

/// Pays now what a process would otherwise pay in its first plan runs (warm before deploy: `kiln::tune::
/// import_bundle` calls it after storing a bundle): the GEMM runtime's one-time costs for the stored winners
/// ([`gemm::tune::warm_gemms`]) and the host pool's buffers of the stored profile
/// ([`crate::host_pool::warm_from_profile`]), and the mapping of the stored compiled code: every cached Cranelift
/// kernel in one executable mapping, every cached GEMM kernel set in another, instead of one mapping per kernel at
/// first use. The cost moves to start-up, it does not vanish.
pub fn warm_runtime() {
    let store = kiln_autotune::Store::global();
    compiler::premap_cached_kernels(store);
    gemm::premap_cached_sets(store);
    gemm::tune::warm_gemms();
    crate::host_pool::warm_from_profile();
}

use crate::{Backend, BackendError, Buffer, Executable};
use kiln_jit::{Graph, HostBuffer, RngKey, interp};

const NAME: &str = "cpu";

#[derive(Debug, Default)]
pub struct CpuBackend;

/// The CPU device (it needs no opening: every call returns the same one).
pub fn backend() -> &'static CpuBackend {
    static CPU: CpuBackend = CpuBackend;
    &CPU
}

struct Interpreted {
    graph: Graph,
}

impl Executable for Interpreted {
    fn run_donating(
        &self,
        inputs: &[&Buffer],
        donated: &mut [Option<Buffer>],
        rng: &[RngKey],
    ) -> Result<Vec<Buffer>, BackendError> {
        if donated.iter().any(Option::is_some) {
            return Err(BackendError::Unsupported {
                device: NAME,
                reason: "the reference interpreter's plans take no donated buffers".into(),
            });
        }
        let host = host_inputs(inputs)?;
        let out =
            interp::run(&self.graph, &host, rng).map_err(|reason| BackendError::Execute { device: NAME, reason })?;
        Ok(out.into_iter().map(Buffer::Host).collect())
    }
}

/// A buffer's host memory, or an error if it lives on another device.
pub(crate) fn as_host(b: &Buffer) -> Result<&HostBuffer, BackendError> {
    match b {
        Buffer::Host(h) => Ok(h),
        #[allow(unreachable_patterns)] // only with another device's feature on
        _ => Err(BackendError::ForeignBuffer { device: NAME }),
    }
}

/// The host buffers of a run's inputs, or an error if one lives on another device.
pub(crate) fn host_inputs<'a>(inputs: &[&'a Buffer]) -> Result<Vec<&'a HostBuffer>, BackendError> {
    inputs.iter().map(|b| as_host(b)).collect()
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        graph.verify().map_err(|reason| BackendError::Compile { device: NAME, reason })?;
        if std::env::var("KILN_CPU_ENGINE").is_ok_and(|e| e == "interp") {
            return Ok(Box::new(Interpreted { graph: graph.clone() }));
        }
        Ok(Box::new(crate::plan_run::Planned(plan::compile(graph)?)))
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        Ok(Buffer::Host(data))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        match buffer {
            Buffer::Host(h) => Ok(h.clone()),
            #[allow(unreachable_patterns)] // only with another device's feature on
            _ => Err(BackendError::ForeignBuffer { device: NAME }),
        }
    }

    fn set_autotune_mode(&self, mode: Option<kiln_autotune::Mode>) {
        set_autotune_mode(mode);
    }

    fn take_last_tune_record(&self) -> Option<kiln_autotune::TuneRecord> {
        take_last_tune_record()
    }
}
