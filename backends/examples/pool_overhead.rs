//! Measures the CPU thread pool (`kiln_backends::cpu::pool`): the overhead of an empty `parallel_for` with hot
//! (spinning) workers, the wake-up latency after the pool has gone idle, and the crossover work size from which
//! splitting a simple memory-bound loop over the pool beats running it inline. The numbers in the pool's module doc
//! come from:
//!
//! ```text
//! cargo run --release -p kiln-backends --example pool_overhead
//! ```
//!
//! `KILN_NUM_THREADS` and `KILN_POOL_SPIN_US` apply as usual. Throughputs are the best of interleaved batches,
//! latencies medians and 90th percentiles of single launches. Run it on an otherwise idle machine; on a shared one,
//! give it priority over the neighbours, e.g. (as root)
//! `setsid sh -c 'echo -20 > /proc/self/autogroup; exec nice -n -20 target/release/examples/pool_overhead'`.

#[cfg(feature = "cpu")]
fn main() {
    bench::run();
}

#[cfg(not(feature = "cpu"))]
fn main() {
    eprintln!("pool_overhead needs the `cpu` feature");
}

#[cfg(feature = "cpu")]
mod bench {
    use kiln_backends::cpu::pool;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::thread;
    use std::time::{Duration, Instant};

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    }

    /// Batch length (calls) so that one batch of `f` runs about `target`.
    fn calibrate(target: Duration, mut f: impl FnMut()) -> usize {
        let mut reps = 1usize;
        loop {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            let elapsed = t.elapsed();
            if elapsed >= target / 4 || reps >= 1 << 24 {
                return (reps as f64 * target.as_secs_f64() / elapsed.as_secs_f64()).ceil() as usize;
            }
            reps *= 2;
        }
    }

    /// Mean time (ns) of one call of `f` over a batch of `reps` calls.
    fn batch(reps: usize, mut f: impl FnMut()) -> f64 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_nanos() as f64 / reps as f64
    }

    /// Best (minimum) over `batches` interleaved batches of the mean time per call of `a` and of `b`: the minimum
    /// filters out batches disturbed by other load on the machine; interleaving exposes both to the same conditions.
    fn best_of_pair(batches: usize, target: Duration, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
        let (ra, rb) = (calibrate(target, &mut a), calibrate(target, &mut b));
        let (mut best_a, mut best_b) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..batches {
            best_a = best_a.min(batch(ra, &mut a));
            best_b = best_b.min(batch(rb, &mut b));
        }
        (best_a, best_b)
    }

    /// `y[i] += a * x[i]` over shared buffers, callable from several threads on disjoint ranges.
    struct Saxpy {
        x: *const f32,
        y: *mut f32,
    }

    // SAFETY: `Saxpy::run` is only called on disjoint ranges of `y` (the chunks of one `parallel_for`, or one inline
    // call), and the buffers outlive every call.
    unsafe impl Sync for Saxpy {}

    impl Saxpy {
        fn run(&self, start: usize, end: usize) {
            // SAFETY: `start..end` lies within both buffers (callers pass sub-ranges of `0..len`), and no other thread
            // touches this range of `y` concurrently (see `unsafe impl Sync`).
            let (x, y) = unsafe {
                (
                    std::slice::from_raw_parts(self.x.add(start), end - start),
                    std::slice::from_raw_parts_mut(self.y.add(start), end - start),
                )
            };
            for (y, x) in y.iter_mut().zip(x) {
                *y += 1.0001 * *x;
            }
        }
    }

    pub fn run() {
        let pool = pool::global();
        let threads = pool.threads();
        println!(
            "pool: {threads} threads, spin {:?}, available_parallelism {}",
            pool.spin(),
            thread::available_parallelism().map_or(0, |n| n.get())
        );
        if threads < 2 {
            println!("only one thread: parallel_for always runs inline; nothing to measure");
            return;
        }
        let empty = |_: usize, _: usize| {};

        // 1. Empty launch, hot: back-to-back calls, workers spinning.
        let (inline_call, hot) = best_of_pair(
            15,
            Duration::from_millis(5),
            || {
                let f: &(dyn Fn(usize, usize) + Sync) = black_box(&empty);
                f(0, threads)
            },
            || pool.parallel_for(threads, black_box(&empty)),
        );
        let on_workers = AtomicUsize::new(0);
        let caller = thread::current().id();
        let count_workers = |_: usize, _: usize| {
            if thread::current().id() != caller {
                on_workers.fetch_add(1, Ordering::Relaxed);
            }
        };
        let calls = 100_000;
        for _ in 0..calls {
            pool.parallel_for(threads, &count_workers);
        }
        println!("\n== empty parallel_for(n = {threads}), hot (back-to-back)");
        println!("inline call of f:        {inline_call:8.1} ns (best batch)");
        println!("parallel_for:            {hot:8.1} ns/call (best batch)");
        println!(
            "chunks run by workers:   {:8.1} % (the rest were taken by the caller before a worker started them)",
            100.0 * on_workers.load(Ordering::Relaxed) as f64 / (calls * (threads - 1)) as f64
        );

        // 2. Hot, every chunk forced onto its worker: time from publishing to the worker starting its chunk, and
        //    the round trip of a launch whose chunk 0 waits for all others to start.
        let (mut start_lat, mut round_trip) = (Vec::new(), Vec::new());
        let (mut idle_start_lat, mut idle_round_trip, mut idle_empty) = (Vec::new(), Vec::new(), Vec::new());
        let epoch = Instant::now();
        let started = AtomicUsize::new(0);
        let last_start = AtomicU64::new(0);
        let wait_all = |start: usize, _: usize| {
            if start != 0 {
                last_start.fetch_max(epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            started.fetch_add(1, Ordering::SeqCst);
            // Spin, then yield: a woken worker may have been queued on this thread's core.
            let t = Instant::now();
            while started.load(Ordering::SeqCst) < threads && t.elapsed() < Duration::from_millis(50) {
                if t.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                } else {
                    thread::yield_now();
                }
            }
        };
        let forced = |start_lat: &mut Vec<f64>, round_trip: &mut Vec<f64>| {
            started.store(0, Ordering::SeqCst);
            let t0 = epoch.elapsed().as_nanos() as u64;
            pool.parallel_for(threads, &wait_all);
            let t1 = epoch.elapsed().as_nanos() as u64;
            start_lat.push((last_start.load(Ordering::Relaxed) - t0) as f64);
            round_trip.push((t1 - t0) as f64);
        };
        for _ in 0..20_000 {
            forced(&mut start_lat, &mut round_trip);
        }
        // 3. After idle: sleep well past the spin time so every worker has parked, then launch once.
        let idle = pool.spin() * 10 + Duration::from_millis(2);
        for _ in 0..300 {
            thread::sleep(idle);
            forced(&mut idle_start_lat, &mut idle_round_trip);
            thread::sleep(idle);
            let t = Instant::now();
            pool.parallel_for(threads, &empty);
            idle_empty.push(t.elapsed().as_nanos() as f64);
        }
        println!("\n== launch latency (every chunk on its own thread; chunk 0 waits for the others to start)");
        println!("                          median      p90  (ns)");
        let row = |name: &str, v: &Vec<f64>| {
            println!("{name:24} {:8.0} {:8.0}", median(v.clone()), percentile(v.clone(), 0.9));
        };
        row("hot: worker start", &start_lat);
        row("hot: round trip", &round_trip);
        row("after idle: worker start", &idle_start_lat);
        row("after idle: round trip", &idle_round_trip);
        row("after idle: empty call", &idle_empty);

        // 4. Gap sweep: the caller busy for `gap` between launches (e.g. running small kernels inline). Within the
        //    spin time the workers are still spinning and the launch is hot; beyond it they have parked.
        println!("\n== launch round trip after the caller was busy for a gap (spin = {:?})", pool.spin());
        println!("{:>10} {:>10} {:>10}  (ns)", "gap us", "median", "p90");
        for gap_us in [0u64, 10, 50, 100, 150, 180, 250, 400, 1000, 5000] {
            let gap = Duration::from_micros(gap_us);
            let (mut lat, mut trip) = (Vec::new(), Vec::new());
            for _ in 0..(if gap_us >= 1000 { 100 } else { 400 }) {
                let t = Instant::now();
                while t.elapsed() < gap {
                    std::hint::spin_loop();
                }
                forced(&mut lat, &mut trip);
            }
            println!("{gap_us:>10} {:>10.0} {:>10.0}", median(trip.clone()), percentile(trip, 0.9));
        }

        // 5. Crossover for a memory-bound loop (y += a * x, f32), back-to-back launches.
        println!("\n== y[i] += a * x[i] (f32), back-to-back launches: inline vs parallel_for, best ns per launch");
        println!("{:>10} {:>12} {:>12} {:>8}", "elements", "inline", "parallel", "speedup");
        let max = 1 << 24;
        let x: Vec<f32> = (0..max).map(|i| (i % 7) as f32).collect();
        let mut y = vec![0.0f32; max];
        let saxpy = Saxpy { x: x.as_ptr(), y: y.as_mut_ptr() };
        let mut sizes = Vec::new();
        let mut n = 256usize;
        while n <= max {
            sizes.push(n);
            if n * 3 / 2 <= max {
                sizes.push(n * 3 / 2);
            }
            n *= 2;
        }
        let mut crossover = None;
        for &n in &sizes {
            let kernel = |start: usize, end: usize| saxpy.run(start, end);
            let (inline, parallel) = best_of_pair(
                15,
                Duration::from_millis(2),
                || black_box(&kernel)(0, n),
                || pool.parallel_for(n, black_box(&kernel)),
            );
            let speedup = inline / parallel;
            println!("{n:>10} {inline:>12.0} {parallel:>12.0} {speedup:>8.2}");
            if speedup > 1.0 {
                crossover.get_or_insert(n);
            } else {
                crossover = None;
            }
        }
        black_box(&y);
        match crossover {
            Some(n) => println!(
                "\ncrossover: parallel_for wins from {n} elements on (min_parallel_work() = {})",
                pool::min_parallel_work()
            ),
            None => println!("\ncrossover: parallel_for never won"),
        }
    }
}
