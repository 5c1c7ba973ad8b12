#[path = "../benches/common/mod.rs"]
mod common;
use common::*;
fn main() {
    let rp = Replay::new();
    println!("nodes {}", rp.nodes_per_build());
    rp.build().realize().unwrap();
    for _ in 0..5 {
        let (b, r) = rp.batch(256);
        println!("build {:.2} us realize {:.2} us", b * 1e6, r * 1e6);
    }
    let cp = Compile::new();
    cp.same().realize().unwrap();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            let g = cp.same();
            g.realize().unwrap();
        }
        println!("small hit {:.2} us", t.elapsed().as_secs_f64() * 1e3);
    }
}
