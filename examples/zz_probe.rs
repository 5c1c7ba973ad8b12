#[path = "../benches/common/mod.rs"]
mod common;
use common::*;
use kiln::{DType, Device, Tensor};
use std::time::Instant;
fn main() {
    let dev = Device::cpu();
    for (m, k, n) in [(256usize, 256usize, 256usize), (512, 512, 512), (1024, 1024, 64), (1024, 64, 1024), (64, 1024, 1024), (1024, 1024, 1024), (1024, 1024, 1024), (2048, 2048, 2048)] {
        let a = Tensor::rand([m, k], DType::F32, &dev); a.realize().unwrap();
        let b = Tensor::rand([k, n], DType::F32, &dev); b.realize().unwrap();
        let flops = 2.0 * (m * k * n) as f64;
        let reps = ((2e9 / flops) as usize).clamp(1, 200);
        let mut ts = vec![];
        for _ in 0..(if m == 2048 { 3 } else { 7 }) {
            let t0 = Instant::now();
            for _ in 0..reps { let y = a.matmul(&b); y.realize().unwrap(); drop(y); }
            ts.push(t0.elapsed().as_secs_f64() / reps as f64);
        }
        let t = median(&ts);
        println!("{m}x{k}x{n}: {:.2} ms {:.1} GFLOP/s", t * 1e3, flops / t / 1e9);
    }
}
