//! The timing loop the step benchmarks share (`bench_rnn`, `bench_transformer`): a first step timed alone (it
//! compiles), warm-up steps, then the median of the timed ones; and the one JSON line the comparison scripts read.

use kiln::Tensor;
use std::time::Instant;

/// What [`time_steps`] measured.
pub struct Timing {
    /// Median seconds of a timed step.
    pub median: f64,
    /// Seconds of the first step (compiling, tuning).
    pub first: f64,
    /// The last step's loss.
    pub loss: f32,
}

/// Runs `step` once alone, `warmup - 1` more times, then `steps` timed times; the last step's loss is read.
pub fn time_steps(steps: usize, warmup: usize, mut step: impl FnMut() -> kiln::Result<Tensor>) -> kiln::Result<Timing> {
    let t0 = Instant::now();
    let mut loss = step()?;
    let first = t0.elapsed().as_secs_f64();
    for _ in 1..warmup {
        loss = step()?;
    }
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t0 = Instant::now();
        loss = step()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(Timing { median, first, loss: loss.item::<f32>()? })
}

impl Timing {
    /// `name: X µs/step (median of N after W warm-up), first step Y ms` (ms/step with `in_ms`), then the loss.
    pub fn print(&self, name: &str, steps: usize, warmup: usize, in_ms: bool) {
        let per_step =
            if in_ms { format!("{:.2} ms", self.median * 1e3) } else { format!("{:.0} µs", self.median * 1e6) };
        println!(
            "{name}: {per_step}/step (median of {steps} after {warmup} warm-up), first step {:.1} ms",
            self.first * 1e3
        );
        println!("{name}: loss {:.6}", self.loss);
    }
}

/// With `json`, `{"name step": seconds, ...}`: the last line the comparison scripts read
/// (`benches/compare/rounds.py`); then, with KILN_PROFILE=1, where the steps' time went.
pub fn finish(rows: &[(String, f64)], json: bool) {
    if json {
        let fields: Vec<String> = rows.iter().map(|(name, s)| format!("\"{name} step\": {s}")).collect();
        println!("{{{}}}", fields.join(", "));
    }
    print!("{}", kiln::profile_report());
}
