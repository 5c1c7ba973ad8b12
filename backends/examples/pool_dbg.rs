use kiln_backends::cpu::pool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
fn main() {
    let p = pool::global();
    let caller = std::thread::current().id();
    let on_w = AtomicUsize::new(0);
    let mut y = vec![0f32; 65536];
    let yp = y.as_mut_ptr() as usize;
    let k = |s: usize, e: usize| {
        if std::thread::current().id() != caller {
            on_w.fetch_add(1, Ordering::Relaxed);
        }
        let y = unsafe { std::slice::from_raw_parts_mut((yp as *mut f32).add(s), e - s) };
        for v in y {
            *v = *v * 1.0001 + 1.0;
        }
    };
    for round in 0..5 {
        on_w.store(0, Ordering::Relaxed);
        let t = Instant::now();
        for _ in 0..10000 {
            p.parallel_for(65536, &k);
        }
        println!("round {round}: {:?}/call, worker chunks {}", t.elapsed() / 10000, on_w.load(Ordering::Relaxed));
    }
    std::hint::black_box(&mut y);
    let me = std::process::id();
    for e in std::fs::read_dir(format!("/proc/{me}/task")).unwrap() {
        let st = std::fs::read_to_string(e.unwrap().path().join("stat")).unwrap();
        let f: Vec<&str> = st.split_whitespace().collect();
        println!("{} {} utime {} stime {} nice {}", f[0], f[1], f[13], f[14], f[18]);
    }
}
