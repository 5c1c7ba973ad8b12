//! A compiled wgpu plan: one pipeline per launch, recorded into one compute pass per run.
//!
//! Buffer donation (`Executable::run_donating`): an output may be written over an input's buffer
//! (`KernelPlan::donation_candidates`: every other reader of the input runs earlier, and the writing kernel reads
//! the input only at the element it writes). WebGPU refuses one buffer bound read-only and read-write in the same
//! dispatch, so a donating launch runs a second pipeline of its kernel that reads that input through its output
//! binding (`wgsl::render_as` with the aliased inputs), with a one-word placeholder bound where the input was; launches before it read
//! the input (the old values) from the same buffer. GEMM launches (the tiled template) do not donate: their
//! epilogue reads are not checked to precede every write of a tile, so a GEMM output always gets a new buffer.

use super::{Ctx, DeviceBuffer, NAME, Pipeline, WgpuBackend, gemm, unsupported};
use crate::plan_run::{DevicePlan, Place, PlanShape, Planned, Run};
use crate::{BackendError, Buffer, Executable};
use kiln_jit::kernel::{KernelPlan, Slot};
use kiln_jit::render::wgsl;
use kiln_jit::{DType, Graph, RngKey};
use smallvec::SmallVec;
use std::sync::Arc;

struct CompiledLaunch {
    /// The kernel's name (for `KILN_PROFILE`).
    name: String,
    pipeline: Arc<Pipeline>,
    /// Where this launch may write over an input (a donation): that input's slot, and the pipeline that reads it
    /// through the output binding.
    donating: Option<(usize, Arc<Pipeline>)>,
    groups: (u32, u32),
    uses_rng: bool,
    /// The kernel gathers: it binds the run's fault record (`kernel::fault`) last.
    can_fault: bool,
}

struct WgpuPlan {
    ctx: Arc<Ctx>,
    /// Launch slots, outputs, passthroughs and the donations of generic launches.
    shape: PlanShape,
    launches: Vec<CompiledLaunch>,
    /// Elements of each temp slot (the largest kernel output placed there).
    temps: Vec<usize>,
    uses_rng: bool,
    /// Some launch can fault: each run zeroes a fault record first and reads it back at the end.
    can_fault: bool,
}

pub(super) fn compile(backend: &WgpuBackend, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
    let ctx = &backend.ctx;
    let err = |reason: String| BackendError::Compile { device: NAME, reason };
    graph.verify().map_err(err)?;
    // 64-bit values are refused at op construction already; this catches graphs built any other way.
    for n in graph.topo_order() {
        let node = graph.node(n);
        if !backend.supports(node.dtype) {
            return Err(err(format!("node {} is {}: {}", node.op.name(), node.dtype, unsupported(node.dtype))));
        }
    }
    // The tiled GEMM stages any operand strides through workgroup memory, so a transposed weight is read in
    // place rather than copied every step. Kernels read no more buffers than the adapter binds.
    let opts = kiln_jit::kernel::ScheduleOptions {
        transpose_copy: !gemm::tiled_enabled(),
        max_inputs: ctx.max_kernel_inputs(),
        ..Default::default()
    };
    let plan: KernelPlan = kiln_jit::kernel::schedule_with(graph, opts);
    crate::gpu_check::note(&plan).map_err(err)?;
    crate::gpu_cache::precompile(graph).map_err(err)?;
    if let Some(b) = plan.outputs.iter().find(|b| !backend.supports(b.dtype)) {
        return Err(unsupported(b.dtype));
    }
    let dump = crate::dump::Dump::start(graph, &plan);
    let mut launches = Vec::with_capacity(plan.launches.len());
    let mut temps = vec![0usize; plan.temps.len()];
    // Whether each launch runs as a generic kernel (not the GEMM template): only those donate.
    let mut generic = Vec::with_capacity(plan.launches.len());
    for l in &plan.launches {
        let (k, record) = match l.kernel.routine {
            Some(r) => (wgsl::routine::render(&r).map_err(err)?, None),
            None => match gemm::gemm_kernel(ctx, &l.kernel) {
                Some((k, record)) => (k, Some(record)),
                None => (wgsl::render_as(&l.kernel, backend.reduce_form(), &[]).map_err(err)?, None),
            },
        };
        // The renderer counts the longest loop of one invocation (a whole reduce loop in the generic form, a
        // slice of it in the cooperative one; the GEMM template's K loop; a routine's).
        let trips = k.trips;
        if let Some(cap) = backend.loop_trip_cap()
            && trips > cap
        {
            return Err(err(format!(
                "kernel {} runs a loop of {trips} trips in one shader invocation; this adapter ({}) stops a shader loop \
                 after {cap} trips and would return wrong values. Run it on Device::cpu(), or on a GPU driver",
                l.kernel.name,
                backend.adapter()
            )));
        }
        if let Some(d) = &dump {
            match &record {
                Some(r) => d.tuned_kernel_files(&l.kernel, "wgsl", &k.source, &r.winner, &r.table()),
                None => d.kernel_files(&l.kernel, "wgsl", &k.source, ""),
            }
        }
        let pipeline = ctx.pipeline(&k).map_err(err)?;
        generic.push(record.is_none() && l.kernel.routine.is_none());
        if let Slot::Temp(t) = l.output {
            temps[t] = temps[t].max(l.kernel.output.len);
        }
        let (uses_rng, can_fault) = (k.uses_rng, k.can_fault);
        let name = l.kernel.name.clone();
        launches.push(CompiledLaunch { name, pipeline, donating: None, groups: k.groups, uses_rng, can_fault });
    }
    let mut donations = Vec::new();
    // A plan that can fault donates nothing: a fault is found after the run, when a donated input would already be
    // written over, and a failed run must leave its inputs as they were.
    let can_fault = launches.iter().any(|l| l.can_fault);
    for d in plan.donation_candidates() {
        let l = &plan.launches[d.launch];
        if !generic[d.launch] || can_fault {
            continue;
        }
        let aliased: Vec<usize> = (0..l.inputs.len()).filter(|&i| l.inputs[i] == Slot::Input(d.input)).collect();
        let k = wgsl::render_as(&l.kernel, backend.reduce_form(), &aliased).map_err(err)?;
        launches[d.launch].donating = Some((d.input, ctx.pipeline(&k).map_err(err)?));
        donations.push(d);
    }
    Ok(Box::new(Planned(WgpuPlan {
        ctx: ctx.clone(),
        uses_rng: launches.iter().any(|l| l.uses_rng),
        can_fault,
        shape: PlanShape::of(&plan, donations),
        launches,
        temps,
    })))
}

/// One run: handles on every buffer a launch may bind, and the command encoder with the compute pass every launch
/// is recorded into (submitted once, by `finish`).
pub(super) struct WgpuRun {
    /// Each input's buffer; a donated input's is its output's.
    inputs: Vec<wgpu::Buffer>,
    outputs: Vec<wgpu::Buffer>,
    temps: Vec<DeviceBuffer>,
    /// Bound where a donating launch's aliased input was (read through the output binding instead).
    placeholder: Option<DeviceBuffer>,
    rng: Option<DeviceBuffer>,
    /// The fault record, zeroed before the first launch (a plan that can fault).
    fault: Option<DeviceBuffer>,
    pass: wgpu::ComputePass<'static>,
    enc: wgpu::CommandEncoder,
}

/// The wgpu buffer of a buffer the executor checked to be ours.
fn raw(b: &Buffer) -> &wgpu::Buffer {
    match b {
        Buffer::Wgpu(d) => d.raw(),
        _ => unreachable!("the executor checked every buffer"),
    }
}

impl DevicePlan for WgpuPlan {
    const DEVICE: &'static str = NAME;
    type State<'a> = WgpuRun;

    fn shape(&self) -> &PlanShape {
        &self.shape
    }

    fn ours(b: &Buffer) -> bool {
        matches!(b, Buffer::Wgpu(_))
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError> {
        let _turn = self.ctx.exclusive();
        Ok(Buffer::Wgpu(self.ctx.alloc(dtype, len)?))
    }

    fn begin<'a>(
        &'a self,
        run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<WgpuRun, BackendError> {
        let ctx = &self.ctx;
        let _turn = ctx.exclusive();
        let outputs: Vec<wgpu::Buffer> = outputs.iter().map(|b| raw(b).clone()).collect();
        let inputs: Vec<wgpu::Buffer> = (0..inputs.len())
            .map(|i| match run.output_of_input(i) {
                Some(o) => outputs[o].clone(),
                None => raw(inputs[i]).clone(),
            })
            .collect();
        let temps = self.temps.iter().map(|&n| ctx.alloc(DType::F32, n)).collect::<Result<_, _>>()?;
        let placeholder = if run.any_donated() { Some(ctx.alloc(DType::F32, 1)?) } else { None };
        let rng = if self.uses_rng && !rng.is_empty() {
            let words = RngKey::gpu_bytes(rng);
            let b = ctx.alloc(DType::I32, words.len() / 4)?;
            ctx.queue.write_buffer(b.raw(), 0, &words);
            Some(b)
        } else {
            None
        };
        let fault = if self.can_fault {
            let b = ctx.alloc(DType::I32, kiln_jit::kernel::FAULT_WORDS)?;
            ctx.queue.write_buffer(b.raw(), 0, &[0u8; kiln_jit::kernel::FAULT_WORDS * wgsl::WORD]);
            Some(b)
        } else {
            None
        };
        let mut enc = ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln run") });
        for &(o, i) in &self.shape.passthrough {
            let bytes = (self.shape.outputs[o].1 * wgsl::WORD) as u64;
            if bytes > 0 {
                enc.copy_buffer_to_buffer(&inputs[i], 0, &outputs[o], 0, bytes);
            }
        }
        // The pass no longer borrows the encoder (`forget_lifetime`); `finish` ends it before finishing the encoder.
        let pass = enc
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None })
            .forget_lifetime();
        Ok(WgpuRun { inputs, outputs, temps, placeholder, rng, fault, pass, enc })
    }

    fn launch(&self, st: &mut WgpuRun, run: &Run, index: usize, places: &[Place]) -> Result<(), BackendError> {
        let l = &self.launches[index];
        if l.groups.0 == 0 {
            return Ok(()); // an empty output: nothing to compute
        }
        let WgpuRun { inputs, outputs, temps, placeholder, rng, fault, pass, .. } = st;
        let slot = |p: Place| -> &wgpu::Buffer {
            match p {
                Place::Input(i) => &inputs[i],
                Place::Temp(t) => temps[t].raw(),
                Place::Output(o) => &outputs[o],
            }
        };
        // This launch writes over a donated input: it reads it through its output binding, and a placeholder is
        // bound where the input was.
        let donating = match (&l.donating, placeholder) {
            (Some((input, p)), Some(ph)) if run.output_of_input(*input).is_some() => {
                Some((p, Slot::Input(*input), ph.raw()))
            }
            _ => None,
        };
        let (ins, out) = places.split_at(places.len() - 1);
        let mut bufs: SmallVec<[&wgpu::Buffer; 16]> = ins
            .iter()
            .zip(&self.shape.launches[index].0)
            .map(|(&p, &s)| match donating {
                Some((_, aliased, ph)) if s == aliased => ph,
                _ => slot(p),
            })
            .collect();
        bufs.push(slot(out[0]));
        if l.uses_rng {
            let Some(r) = rng else {
                return Err(BackendError::Execute { device: NAME, reason: "random kernel without rng keys".into() });
            };
            bufs.push(r.raw());
        }
        if l.can_fault {
            let Some(f) = fault else {
                return Err(BackendError::Execute {
                    device: NAME,
                    reason: "gathering kernel without a fault record".into(),
                });
            };
            bufs.push(f.raw());
        }
        let pipeline = donating.map_or(&l.pipeline, |(p, _, _)| p);
        let _turn = self.ctx.exclusive();
        self.ctx.dispatch(pass, pipeline, &bufs, l.groups);
        if crate::profile::profiling() {
            // Submit what is recorded so far (this launch last), wait for it, and go on in a new encoder
            // (`profile.rs` says what this measures).
            let mut enc =
                self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("kiln run") });
            let next = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            drop(std::mem::replace(pass, next.forget_lifetime()));
            let done = std::mem::replace(&mut st.enc, enc);
            let t0 = std::time::Instant::now();
            self.ctx.queue.submit([done.finish()]);
            self.ctx.wait()?;
            crate::profile::record(NAME, &l.name, t0.elapsed());
        }
        Ok(())
    }

    fn finish(&self, st: WgpuRun, _outputs: &mut [Buffer]) -> Result<(), BackendError> {
        let _turn = self.ctx.exclusive();
        let WgpuRun { pass, enc, fault, .. } = st;
        drop(pass); // the pass must end before its encoder finishes
        self.ctx.queue.submit([enc.finish()]);
        // A plan that can fault waits for its run to read the record (the one sync it costs; others return
        // before the device has finished).
        if let Some(f) = fault {
            let bytes = self.ctx.read_words(f.raw(), kiln_jit::kernel::FAULT_WORDS)?;
            if let Some(fault) = kiln_jit::kernel::Fault::decode_i32_bytes(&bytes) {
                return Err(BackendError::Fault { device: NAME, fault });
            }
        }
        Ok(())
    }
}
