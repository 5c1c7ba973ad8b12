//! The one plan executor: what every device's plan does the same way when it runs. It checks the inputs and the
//! donated buffers, builds the outputs (a donated input's buffer, or a fresh one from the device), walks the
//! launches in order and says which buffer each kernel slot reads or writes ([`Place`]). A device brings what
//! differs through [`DevicePlan`]: allocation, the per-run state (a CPU arena of temps and raw pointers; a wgpu
//! command encoder and compute pass), one launch given its places, and the end of the run (marking host outputs
//! written; submitting the recorded work). [`Planned`] makes any `DevicePlan` an [`Executable`].
//!
//! Donation: `Executable::run_donating` may hand over an input's buffer for an output the plan writes over it
//! (`KernelPlan::donation_candidates`). That output then *is* the input's buffer, so every launch that reads the
//! input reads it there ([`Place::Output`]), and the caller's `inputs` entry for it is a placeholder never touched.

use crate::{BackendError, Buffer, Executable};
use kiln_jit::kernel::{Donation, KernelPlan, Slot};
use kiln_jit::{DType, RngKey};
use smallvec::SmallVec;

/// What a compiled plan is, whatever the device: its launches' slots, outputs, passthroughs and donations.
pub(crate) struct PlanShape {
    /// Each launch's input slots and output slot, in run order.
    pub(crate) launches: Vec<(Vec<Slot>, Slot)>,
    /// Each output's dtype and length.
    pub(crate) outputs: Vec<(DType, usize)>,
    /// (output, input): outputs that are an input's value unchanged.
    pub(crate) passthrough: Vec<(usize, usize)>,
    /// The donations this plan accepts (a subset of the schedule's candidates the device can honour).
    pub(crate) donations: Vec<Donation>,
}

impl PlanShape {
    /// The shape of schedule `plan`, accepting `donations`.
    pub(crate) fn of(plan: &KernelPlan, donations: Vec<Donation>) -> PlanShape {
        PlanShape {
            launches: plan.launches.iter().map(|l| (l.inputs.clone(), l.output)).collect(),
            outputs: plan.outputs.iter().map(|b| (b.dtype, b.len)).collect(),
            passthrough: plan.passthrough.clone(),
            donations,
        }
    }
}

/// A device's half of running a plan (see the module doc).
pub(crate) trait DevicePlan: Send + Sync {
    /// The device's name in errors.
    const DEVICE: &'static str;
    /// One run's state: the device's handles on the buffers launches bind, scratch, what launches are recorded into.
    type State<'a>
    where
        Self: 'a;

    fn shape(&self) -> &PlanShape;
    /// Whether `b` lives on this device.
    fn ours(b: &Buffer) -> bool;
    /// A fresh output buffer.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Buffer, BackendError>;
    /// Starts a run over `inputs` (a donated input's entry is a placeholder: read it at its output) and `outputs`
    /// (allocated or donated), with the passthrough outputs filled from their inputs.
    fn begin<'a>(
        &'a self,
        run: &Run,
        inputs: &'a [&'a Buffer],
        outputs: &mut [Buffer],
        rng: &[RngKey],
    ) -> Result<Self::State<'a>, BackendError>;
    /// Runs (or records) launch `index`, whose slots are at `places`: its inputs, then its output.
    fn launch(
        &self,
        state: &mut Self::State<'_>,
        run: &Run,
        index: usize,
        places: &[Place],
    ) -> Result<(), BackendError>;
    /// Ends the run: every launch has been run or recorded.
    fn finish(&self, state: Self::State<'_>, outputs: &mut [Buffer]) -> Result<(), BackendError>;
}

/// A device plan as an `Executable`.
pub(crate) struct Planned<P>(pub(crate) P);

impl<P: DevicePlan> Executable for Planned<P> {
    fn donations(&self) -> &[Donation] {
        &self.0.shape().donations
    }

    fn run_donating(
        &self,
        inputs: &[&Buffer],
        donated: &mut [Option<Buffer>],
        rng: &[RngKey],
    ) -> Result<Vec<Buffer>, BackendError> {
        let (plan, shape) = (&self.0, self.0.shape());
        let run = Run::start(P::DEVICE, &shape.donations, &shape.outputs, donated, P::ours)?;
        // A donated slot's `inputs` entry is a placeholder from the caller: never looked at.
        if (0..inputs.len()).any(|i| run.output_of_input(i).is_none() && !P::ours(inputs[i])) {
            return Err(BackendError::ForeignBuffer { device: P::DEVICE });
        }
        let mut outputs = run.outputs(&shape.outputs, donated, |d, n| plan.alloc(d, n))?;
        let mut state = plan.begin(&run, inputs, &mut outputs, rng)?;
        let mut places: SmallVec<[Place; 16]> = SmallVec::new();
        for (index, (ins, out)) in shape.launches.iter().enumerate() {
            places.clear();
            places.extend(ins.iter().chain([out]).map(|s| run.place(*s)));
            plan.launch(&mut state, &run, index, &places)?;
        }
        plan.finish(state, &mut outputs)?;
        Ok(outputs)
    }
}

/// Where a slot's buffer is in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// The caller's input `i`.
    Input(usize),
    /// Output `o` (also for an input donated to output `o`).
    Output(usize),
    /// The plan's temporary `t`.
    Temp(usize),
}

/// One run's donations: which outputs take which inputs' buffers.
pub(crate) struct Run {
    /// (output, input) of each donation given.
    donor_of_output: SmallVec<[(usize, usize); 8]>,
}

impl Run {
    /// Checks the donated buffers (`check_donated`) and notes which are given. `ours`: whether a buffer is of
    /// this device's kind.
    pub(crate) fn start(
        device: &'static str,
        donations: &[Donation],
        outputs: &[(DType, usize)],
        donated: &[Option<Buffer>],
        ours: impl Fn(&Buffer) -> bool,
    ) -> Result<Run, BackendError> {
        check_donated(device, donations, outputs, donated, ours)?;
        let donor_of_output = donations
            .iter()
            .filter(|d| donated.get(d.input).is_some_and(Option::is_some))
            .map(|d| (d.output, d.input))
            .collect();
        Ok(Run { donor_of_output })
    }

    /// Whether any input was donated.
    #[cfg(feature = "wgpu")]
    pub(crate) fn any_donated(&self) -> bool {
        !self.donor_of_output.is_empty()
    }

    /// The output that input `i`'s buffer became, if it was donated.
    pub(crate) fn output_of_input(&self, i: usize) -> Option<usize> {
        self.donor_of_output.iter().find(|&&(_, s)| s == i).map(|&(o, _)| o)
    }

    /// The outputs handed back: each donated input's buffer where one was given for it, else `alloc(dtype, len)`.
    pub(crate) fn outputs(
        &self,
        outputs: &[(DType, usize)],
        donated: &mut [Option<Buffer>],
        mut alloc: impl FnMut(DType, usize) -> Result<Buffer, BackendError>,
    ) -> Result<Vec<Buffer>, BackendError> {
        let mut out = Vec::with_capacity(outputs.len());
        for (o, &(d, n)) in outputs.iter().enumerate() {
            let donor = self.donor_of_output.iter().find(|&&(out, _)| out == o).and_then(|&(_, s)| donated[s].take());
            out.push(match donor {
                Some(b) => b,
                None => alloc(d, n)?,
            });
        }
        Ok(out)
    }

    /// Where `slot`'s buffer is in this run.
    pub(crate) fn place(&self, slot: Slot) -> Place {
        match slot {
            Slot::Input(i) => self.output_of_input(i).map_or(Place::Input(i), Place::Output),
            Slot::Temp(t) => Place::Temp(t),
            Slot::Output(o) => Place::Output(o),
        }
    }
}

/// Checks the buffers given to `run_donating` before any is taken (so that on an error the caller still has them
/// all): each must be for a slot `donations` names, of `device`'s kind (`ours`), and of its output's dtype and
/// length.
fn check_donated(
    device: &'static str,
    donations: &[Donation],
    outputs: &[(DType, usize)],
    donated: &[Option<Buffer>],
    ours: impl Fn(&Buffer) -> bool,
) -> Result<(), BackendError> {
    for (slot, given) in donated.iter().enumerate() {
        let Some(b) = given else { continue };
        let fits = |d: &Donation| d.input == slot && (b.dtype(), b.len()) == outputs[d.output];
        if !ours(b) || !donations.iter().any(fits) {
            return Err(BackendError::Execute { device, reason: format!("input {slot} cannot be donated") });
        }
    }
    Ok(())
}
