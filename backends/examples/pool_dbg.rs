use kiln_backends::cpu::pool::Pool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
fn main() {
    let threads = 2;
    let pool = Pool::new(threads);
    for nmax in [4usize, 2, 3, 4, 8, 2] {
        let total = AtomicUsize::new(0);
        let mut lat = Vec::with_capacity(20000);
        let t = Instant::now();
        for i in 0..20_000 {
            let t0 = Instant::now();
            pool.parallel_for(1 + i % nmax, &|start, end| {
                total.fetch_add(end - start, Ordering::Relaxed);
            });
            lat.push(t0.elapsed());
        }
        let el = t.elapsed();
        lat.sort();
        let big = lat.iter().filter(|d| **d > Duration::from_micros(50)).count();
        println!(
            "threads {threads} nmax {nmax}: {:?}/call  p50 {:?} p99 {:?} max {:?} >50us: {big}",
            el / 20_000,
            lat[10000],
            lat[19800],
            lat[19999]
        );
    }
}
