//! A compiled GPU plan (CUDA or HIP): one loaded function per launch, launched in order on the device's stream.
//!
//! Parameters follow the C-like dialect's signature (`kiln_jit::render::cuda`): each input's device address, the
//! output's, then the rng keys (4 words per `Rand` slot) when the kernel draws random numbers and the fault record
//! when it can fault. A plan that can fault zeroes the record before its first launch and reads it back after the
//! last (the one wait for the device such a run costs; other runs return while the GPU works).
//!
//! No donations: the kernels' parameters are `__restrict__`, so an output may not alias an input.

use super::Driver;
use crate::plan_run::{DevicePlan, Place, PlanShape, Planned, Run};
use crate::{BackendError, Buffer, Executable};
use kiln_jit::kernel::{FAULT_WORDS, Fault, KernelPlan, Slot};
use kiln_jit::{DType, Graph, RngKey};
use smallvec::SmallVec;
use std::sync::Arc;

struct CompiledLaunch<F> {
    function: F,
    block: u32,
    /// (0, 0) for an empty output: nothing to launch.
    grid: (u32, u32),
    uses_rng: bool,
    can_fault: bool,
}

struct GpuPlan<D: Driver> {
    ctx: Arc<D>,
    shape: PlanShape,
    launches: Vec<CompiledLaunch<D::Function>>,
    /// Bytes of each temp slot (the largest kernel output placed there).
    temps: Vec<usize>,
    uses_rng: bool,
    can_fault: bool,
}

/// Compiles `graph` for the device `ctx`: scheduled and rendered as `gpu_cache` says, every kernel's code from the
/// store or compiled (those missing in parallel), then loaded.
pub(crate) fn compile<D: Driver>(ctx: &Arc<D>, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
    let err = |reason: String| BackendError::Compile { device: D::NAME, reason };
    graph.verify().map_err(err)?;
    let plan: KernelPlan = crate::gpu_cache::schedule(graph);
    crate::gpu_check::note(&plan).map_err(err)?;
    let dump = crate::dump::Dump::start(graph, &plan);
    let rendered = plan
        .launches
        .iter()
        .map(|l| {
            crate::gpu_cache::render(D::FLAVOR, &l.kernel).map_err(|e| {
                err(format!(
                    "{e}; run this graph on Device::cpu() ({} does not run everything kiln has yet)",
                    D::FLAVOR.name()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sources: Vec<(&str, &str)> = rendered.iter().map(|k| (k.source.as_str(), k.name.as_str())).collect();
    let codes = ctx.compile(&sources).map_err(err)?;
    let mut launches = Vec::with_capacity(plan.launches.len());
    let mut temps = vec![0usize; plan.temps.len()];
    let ext = D::FLAVOR.extension();
    for ((l, k), code) in plan.launches.iter().zip(&rendered).zip(&codes) {
        if let Some(d) = &dump {
            d.kernel_files(&l.kernel, ext, &k.source, "");
        }
        let function = ctx.load(k, code).map_err(err)?;
        if let Slot::Temp(t) = l.output {
            temps[t] = temps[t].max(l.kernel.output.len * l.kernel.output.dtype.size_of());
        }
        launches.push(CompiledLaunch {
            function,
            block: k.block,
            grid: k.grid,
            uses_rng: k.uses_rng,
            can_fault: k.can_fault,
        });
    }
    Ok(Box::new(Planned(GpuPlan {
        ctx: ctx.clone(),
        uses_rng: launches.iter().any(|l| l.uses_rng),
        can_fault: launches.iter().any(|l| l.can_fault),
        shape: PlanShape::of(&plan, Vec::new()),
        launches,
        temps,
    })))
}

/// One run: every buffer's device address, and the buffers the run owns (temps, rng keys, fault record).
struct GpuRun<M> {
    inputs: SmallVec<[u64; 16]>,
    outputs: SmallVec<[u64; 8]>,
    temps: Vec<M>,
    rng: Option<M>,
    fault: Option<M>,
}

/// The device memory of a buffer the executor checked to be ours.
fn mem<D: Driver>(b: &Buffer) -> &D::Mem {
    D::unwrap(b).expect("the executor checked every buffer")
}

impl<D: Driver> DevicePlan for GpuPlan<D> {
    const DEVICE: &'static str = D::NAME;
    type State<'a> = GpuRun<D::Mem>;

    fn shape(&self) -> &PlanShape {
        &self.shape
    }

    fn ours(b: &Buffer) -> bool {
        D::unwrap(b).is_some()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        Ok(D::wrap(self.ctx.alloc(dtype, len)?))
    }

    fn begin<'a>(
        &'a self,
        _run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<GpuRun<D::Mem>, BackendError> {
        let ctx = &self.ctx;
        // Another GPU's memory is not this one's to read (the outputs were allocated here: this plan donates nothing).
        if inputs.iter().any(|b| !ctx.owns(mem::<D>(b))) {
            return Err(BackendError::ForeignBuffer { device: D::NAME });
        }
        for &(o, i) in &self.shape.passthrough {
            let bytes = self.shape.outputs[o].1 * self.shape.outputs[o].0.size_of();
            let out = D::unwrap_mut(&mut outputs[o]).expect("outputs are allocated here");
            ctx.copy(mem::<D>(inputs[i]), out, bytes)?;
        }
        let temps = self.temps.iter().map(|&n| ctx.alloc(DType::U8, n)).collect::<Result<_, _>>()?;
        let rng = if self.uses_rng && !rng.is_empty() {
            let words = RngKey::gpu_bytes(rng);
            let mut b = ctx.alloc(DType::U32, words.len() / 4)?;
            ctx.write(&mut b, &words)?;
            Some(b)
        } else {
            None
        };
        let fault = if self.can_fault {
            let mut b = ctx.alloc(DType::I32, FAULT_WORDS)?;
            ctx.write(&mut b, &[0u8; FAULT_WORDS * 4])?;
            Some(b)
        } else {
            None
        };
        Ok(GpuRun {
            inputs: inputs.iter().map(|b| D::addr(mem::<D>(b))).collect(),
            outputs: outputs.iter().map(|b| D::addr(mem::<D>(b))).collect(),
            temps,
            rng,
            fault,
        })
    }

    fn launch(&self, st: &mut GpuRun<D::Mem>, _run: &Run, index: usize, places: &[Place]) -> Result<(), BackendError> {
        let l = &self.launches[index];
        if l.grid.0 == 0 {
            return Ok(()); // an empty output: nothing to compute
        }
        let addr = |p: Place| match p {
            Place::Input(i) => st.inputs[i],
            Place::Output(o) => st.outputs[o],
            Place::Temp(t) => D::addr(&st.temps[t]),
        };
        let exec = |reason: &str| BackendError::Execute { device: D::NAME, reason: reason.into() };
        let mut params: SmallVec<[u64; 16]> = places.iter().map(|&p| addr(p)).collect();
        if l.uses_rng {
            let r = st.rng.as_ref().ok_or_else(|| exec("random kernel without rng keys"))?;
            params.push(D::addr(r));
        }
        if l.can_fault {
            let f = st.fault.as_ref().ok_or_else(|| exec("gathering kernel without a fault record"))?;
            params.push(D::addr(f));
        }
        // SAFETY: the function was compiled from the dialect's rendering of this launch's kernel, whose parameters
        // are exactly these device addresses in this order (inputs, output, rng keys, fault record), each a live
        // allocation of this device holding at least the elements the kernel indexes (the plan's buffer lengths);
        // the grid covers the kernel's threads and surplus threads return at once.
        unsafe { self.ctx.launch(&l.function, l.grid, l.block, &params) }
            .map_err(|e| exec(&format!("launching {index}: {e}")))
    }

    fn finish(&self, st: GpuRun<D::Mem>, _outputs: &mut [Buffer]) -> Result<(), BackendError> {
        if let Some(f) = &st.fault {
            let bytes = self.ctx.read(f, FAULT_WORDS * 4)?;
            if let Some(fault) = Fault::decode_i32_bytes(&bytes) {
                return Err(BackendError::Fault { device: D::NAME, fault });
            }
        }
        Ok(())
    }
}
