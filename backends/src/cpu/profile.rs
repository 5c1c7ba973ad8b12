//! `KILN_PROFILE=1`: the time spent in each CPU kernel, summed per kernel name over the process.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

/// `KILN_PROFILE=1`: time every launch (one clock read before and after; off by default).
pub(crate) fn profiling() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| std::env::var_os("KILN_PROFILE").is_some_and(|v| v != "0"));
    *ON
}

static PROFILE: Mutex<Option<HashMap<String, (u64, std::time::Duration)>>> = Mutex::new(None);

pub(crate) fn record(name: &str, t: std::time::Duration) {
    let mut p = PROFILE.lock();
    let e = p.get_or_insert_with(HashMap::new).entry(name.to_string()).or_default();
    e.0 += 1;
    e.1 += t;
}

/// One line per kernel run since the process started (with `KILN_PROFILE=1`): launches, total and mean time,
/// heaviest first. Empty when profiling is off.
pub fn profile_report() -> String {
    let p = PROFILE.lock();
    let Some(map) = p.as_ref() else { return String::new() };
    let mut rows: Vec<_> = map.iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.1));
    let mut s = String::from("kernel profile (KILN_PROFILE): total ms | launches | mean µs | kernel\n");
    for (name, (n, t)) in rows {
        s += &format!("{:10.2} | {n:8} | {:9.2} | {name}\n", t.as_secs_f64() * 1e3, t.as_secs_f64() * 1e6 / *n as f64);
    }
    s
}
