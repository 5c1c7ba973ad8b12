//! Linear algebra timings (`kiln::linalg`, f32): `solve` with one right-hand side, `inv` and `cholesky` of one
//! matrix of order 64, 256, 512 and 1024, and `solve` of 4096 batched 8 x 8 systems. The matrices are `rand + n I`
//! (well-conditioned); every figure is the median of `--runs` calls after two warm-up calls, each a build of the
//! lazy graph and its realize.
//!
//! `cargo run --release --example bench_linalg [-- --runs N] [--json]`
//!
//! `benches/compare/linalg_torch.py` runs this with `--json` and `torch.linalg` on the same shapes in the same
//! session, and prints the ratios.

use kiln::{DType, Device, Tensor, linalg};
#[path = "../benches/timing/mod.rs"]
mod timing;

use timing::median_of_calls;

#[derive(clap::Parser)]
#[command(name = "bench_linalg")]
struct Args {
    /// Calls timed per row (the table gives medians; at least 3).
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(3..))]
    runs: u32,
    /// Also print the medians as one JSON line (what benches/compare/linalg_torch.py reads).
    #[arg(long)]
    json: bool,
}

/// One row: name, batch (matrices), order, and which function.
type Row = (&'static str, usize, usize, Op);

#[derive(Clone, Copy)]
enum Op {
    Solve,
    Inv,
    Cholesky,
}

/// The rows, in the order `linalg_torch.py` reads them.
const ROWS: [Row; 13] = [
    ("solve 64", 1, 64, Op::Solve),
    ("inv 64", 1, 64, Op::Inv),
    ("cholesky 64", 1, 64, Op::Cholesky),
    ("solve 256", 1, 256, Op::Solve),
    ("inv 256", 1, 256, Op::Inv),
    ("cholesky 256", 1, 256, Op::Cholesky),
    ("solve 512", 1, 512, Op::Solve),
    ("inv 512", 1, 512, Op::Inv),
    ("cholesky 512", 1, 512, Op::Cholesky),
    ("solve 1024", 1, 1024, Op::Solve),
    ("inv 1024", 1, 1024, Op::Inv),
    ("cholesky 1024", 1, 1024, Op::Cholesky),
    ("solve 4096 x 8x8", 4096, 8, Op::Solve),
];

/// Seconds per call of `row`.
fn time_row(&(_, batch, n, op): &Row, runs: u32) -> f64 {
    let dev = Device::cpu();
    let a = Tensor::rand([batch, n, n], DType::F32, &dev).add(Tensor::eye(n, DType::F32, &dev).mul(n as f64));
    let b = Tensor::rand([batch, n, 1], DType::F32, &dev);
    let spd = a.transpose(-1, -2).matmul(&a);
    kiln::realize(&[&a, &b, &spd]).expect("inputs");
    let call = || {
        let y = match op {
            Op::Solve => linalg::solve(&a, &b),
            Op::Inv => linalg::inv(&a),
            Op::Cholesky => linalg::cholesky(&spd),
        };
        y.realize().expect("realize");
    };
    median_of_calls(runs, call)
}

fn main() {
    let args: Args = clap::Parser::parse();
    let mut json = Vec::new();
    println!("| function | kiln ms |");
    println!("|---|---|");
    for row in &ROWS {
        let s = time_row(row, args.runs);
        println!("| {} | {:.3} |", row.0, s * 1e3);
        json.push(format!("\"{}\": {s}", row.0));
    }
    if args.json {
        println!("{{{}}}", json.join(", "));
    }
}
