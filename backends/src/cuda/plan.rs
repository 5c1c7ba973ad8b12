//! A compiled CUDA plan: one loaded function per launch, launched in order on the device's stream.
//!
//! Parameters follow the CUDA dialect's signature (`kiln_jit::render::cuda`): each input's device address, the
//! output's, then the rng keys (4 words per `Rand` slot) when the kernel draws random numbers and the fault record
//! when it can fault. A plan that can fault zeroes the record before its first launch and reads it back after the
//! last (the one wait for the device such a run costs; other runs return while the GPU works).

use super::{Ctx, CudaBackend, DeviceBuffer, NAME};
use crate::plan_run::{DevicePlan, Place, PlanShape, Planned, Run};
use crate::{BackendError, Buffer, Executable};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg, sys};
use kiln_jit::kernel::{FAULT_WORDS, Fault, KernelPlan, Slot};
use kiln_jit::{DType, Graph, RngKey};
use smallvec::SmallVec;
use std::sync::Arc;

struct CompiledLaunch {
    function: CudaFunction,
    block: u32,
    /// (0, 0) for an empty output: nothing to launch.
    grid: (u32, u32),
    uses_rng: bool,
    can_fault: bool,
}

struct CudaPlan {
    ctx: Arc<Ctx>,
    shape: PlanShape,
    launches: Vec<CompiledLaunch>,
    /// Bytes of each temp slot (the largest kernel output placed there).
    temps: Vec<usize>,
    uses_rng: bool,
    can_fault: bool,
}

pub(super) fn compile(backend: &CudaBackend, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
    let ctx = &backend.ctx;
    let err = |reason: String| BackendError::Compile { device: NAME, reason };
    graph.verify().map_err(err)?;
    let plan: KernelPlan = crate::cuda_cache::schedule(graph);
    crate::gpu_check::note(&plan).map_err(err)?;
    let dump = crate::dump::Dump::start(graph, &plan);
    let mut launches = Vec::with_capacity(plan.launches.len());
    let mut temps = vec![0usize; plan.temps.len()];
    let rendered = plan
        .launches
        .iter()
        .map(|l| {
            crate::cuda_cache::render(&l.kernel).map_err(|e| {
                err(format!("{e}; run this graph on Device::cpu() (CUDA does not run everything kiln has yet)"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Every kernel's cubin at once: the ones not cached compile in parallel.
    let sources: Vec<(&str, &str)> = rendered.iter().map(|k| (k.source.as_str(), k.name.as_str())).collect();
    crate::cuda_cache::cubins(&sources, &ctx.arch).map_err(err)?;
    for (l, k) in plan.launches.iter().zip(&rendered) {
        if let Some(d) = &dump {
            d.kernel_files(&l.kernel, "cu", &k.source, "");
        }
        let function = ctx.function(k).map_err(err)?;
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
    Ok(Box::new(Planned(CudaPlan {
        ctx: ctx.clone(),
        uses_rng: launches.iter().any(|l| l.uses_rng),
        can_fault: launches.iter().any(|l| l.can_fault),
        // No donations: the kernels' parameters are `__restrict__` (see the module doc of `cuda`).
        shape: PlanShape::of(&plan, Vec::new()),
        launches,
        temps,
    })))
}

/// One run: every buffer's device address, and the buffers the run owns (temps, rng keys, fault record).
pub(super) struct CudaRun {
    inputs: SmallVec<[sys::CUdeviceptr; 16]>,
    outputs: SmallVec<[sys::CUdeviceptr; 8]>,
    temps: Vec<DeviceBuffer>,
    rng: Option<DeviceBuffer>,
    fault: Option<DeviceBuffer>,
}

/// The CUDA buffer of a buffer the executor checked to be ours.
fn dev(b: &Buffer) -> &DeviceBuffer {
    match b {
        Buffer::Cuda(d) => d,
        _ => unreachable!("the executor checked every buffer"),
    }
}

impl DevicePlan for CudaPlan {
    const DEVICE: &'static str = NAME;
    type State<'a> = CudaRun;

    fn shape(&self) -> &PlanShape {
        &self.shape
    }

    fn ours(b: &Buffer) -> bool {
        matches!(b, Buffer::Cuda(_))
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        Ok(Buffer::Cuda(self.ctx.alloc(dtype, len)?))
    }

    fn begin<'a>(
        &'a self,
        _run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<CudaRun, BackendError> {
        let ctx = &self.ctx;
        // Another GPU's memory is not this one's to read (the outputs were allocated here: this plan donates nothing).
        if inputs.iter().any(|b| !dev(b).on(ctx)) {
            return Err(BackendError::ForeignBuffer { device: NAME });
        }
        for &(o, i) in &self.shape.passthrough {
            let bytes = self.shape.outputs[o].1 * self.shape.outputs[o].0.size_of();
            let Buffer::Cuda(out) = &mut outputs[o] else { unreachable!("outputs are allocated here") };
            ctx.copy(dev(inputs[i]), out, bytes)?;
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
        Ok(CudaRun {
            inputs: inputs.iter().map(|b| dev(b).ptr()).collect(),
            outputs: outputs.iter().map(|b| dev(b).ptr()).collect(),
            temps,
            rng,
            fault,
        })
    }

    fn launch(&self, st: &mut CudaRun, _run: &Run, index: usize, places: &[Place]) -> Result<(), BackendError> {
        let l = &self.launches[index];
        if l.grid.0 == 0 {
            return Ok(()); // an empty output: nothing to compute
        }
        let addr = |p: Place| match p {
            Place::Input(i) => st.inputs[i],
            Place::Output(o) => st.outputs[o],
            Place::Temp(t) => st.temps[t].ptr(),
        };
        let mut params: SmallVec<[sys::CUdeviceptr; 16]> = places.iter().map(|&p| addr(p)).collect();
        if l.uses_rng {
            let Some(r) = &st.rng else {
                return Err(BackendError::Execute { device: NAME, reason: "random kernel without rng keys".into() });
            };
            params.push(r.ptr());
        }
        if l.can_fault {
            let Some(f) = &st.fault else {
                return Err(BackendError::Execute {
                    device: NAME,
                    reason: "gathering kernel without a fault record".into(),
                });
            };
            params.push(f.ptr());
        }
        let mut args = self.ctx.stream.launch_builder(&l.function);
        for p in &params {
            args.arg(p);
        }
        let cfg = LaunchConfig { grid_dim: (l.grid.0, l.grid.1, 1), block_dim: (l.block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the function was compiled from the CUDA dialect's rendering of this launch's kernel, whose
        // parameters are exactly these device addresses in this order (inputs, output, rng keys, fault record),
        // each a live allocation of this device holding at least the elements the kernel indexes (the plan's
        // buffer lengths); the grid covers the kernel's threads and surplus threads return at once.
        unsafe { args.launch(cfg) }
            .map_err(|e| BackendError::Execute { device: NAME, reason: format!("launching {index}: {e}") })?;
        Ok(())
    }

    fn finish(&self, st: CudaRun, _outputs: &mut [Buffer]) -> Result<(), BackendError> {
        if let Some(f) = &st.fault {
            let bytes = self.ctx.read(f, FAULT_WORDS * 4)?;
            if let Some(fault) = Fault::decode_i32_bytes(&bytes) {
                return Err(BackendError::Fault { device: NAME, fault });
            }
        }
        Ok(())
    }
}
