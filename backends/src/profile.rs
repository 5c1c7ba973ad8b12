//! `KILN_PROFILE=1`: the time spent in each kernel, summed per device and kernel name over the process.
//!
//! How a launch is timed: on the CPU, a clock read before and after it (the launch runs on the calling thread and
//! the pool; nothing else changes). On wgpu, each launch is submitted alone and waited for, the host's clock around
//! the wait: this serializes the device and adds a submit and a wait to every launch, so the figures are each
//! kernel's time plus a fixed cost, and a profiled run is slower than a plain one (timestamp queries would time the
//! device alone; not every adapter has them, lavapipe included).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// `KILN_PROFILE=1`: time every launch (off by default).
pub(crate) fn profiling() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os("KILN_PROFILE").is_some_and(|v| v != "0"));
    *ON
}

/// (device, kernel) -> (launches, time).
type Profile = HashMap<(&'static str, String), (u64, std::time::Duration)>;

static PROFILE: Mutex<Option<Profile>> = Mutex::new(None);

/// Adds one launch of kernel `name` on `device` taking `t`.
pub(crate) fn record(device: &'static str, name: &str, t: std::time::Duration) {
    let mut p = PROFILE.lock();
    let e = p.get_or_insert_with(HashMap::new).entry((device, name.to_string())).or_default();
    e.0 += 1;
    e.1 += t;
}

/// One line per kernel run since the process started (with `KILN_PROFILE=1`): launches, total and mean time,
/// heaviest first. Empty when profiling is off.
pub(crate) fn report() -> String {
    let p = PROFILE.lock();
    let Some(map) = p.as_ref() else { return String::new() };
    let mut rows: Vec<_> = map.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let mut s = String::from("kernel profile (KILN_PROFILE): total ms | launches | mean µs | device | kernel\n");
    for ((device, name), (n, t)) in rows {
        s += &format!(
            "{:10.2} | {n:8} | {:9.2} | {device:6} | {name}\n",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e6 / *n as f64
        );
    }
    s
}
