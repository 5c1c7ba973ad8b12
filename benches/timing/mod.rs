//! The timing loop the comparison examples share (`examples/bench_conv.rs`, `examples/bench_linalg.rs`, included
//! by path): the median of a number of calls after two warm-up calls, the first of which compiles the plan.

use std::time::Instant;

/// The median seconds of `runs` calls of `call`, after two warm-up calls.
pub fn median_of_calls(runs: u32, call: impl Fn()) -> f64 {
    call();
    call();
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t0 = Instant::now();
            call();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
