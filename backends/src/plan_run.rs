//! What every device's plan does the same way when it runs: check the donated buffers, build the outputs (a donated
//! input's buffer, or a fresh one from the device), and say which buffer each kernel slot reads or writes. A backend
//! brings allocation and the launches themselves; the bookkeeping of donation, passthrough and slots is here once.
//!
//! Donation: `Executable::run_donating` may hand over an input's buffer for an output the plan writes over it
//! (`KernelPlan::donation_candidates`). That output then *is* the input's buffer, so every launch that reads the
//! input reads it there ([`Place::Output`]), and the caller's `inputs` entry for it is a placeholder never touched.

use crate::{BackendError, Buffer};
use kiln_jit::DType;
use kiln_jit::kernel::{Donation, Slot};
use smallvec::SmallVec;

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

    /// Whether input `i` was donated (its `inputs` entry is a placeholder).
    #[cfg(feature = "wgpu")]
    pub(crate) fn is_donated(&self, i: usize) -> bool {
        self.output_of_input(i).is_some()
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
