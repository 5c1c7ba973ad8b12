//! All-reduce bandwidth between the ranks of an MPI job, against a memcpy of the same bytes measured in the same
//! run (issue 24's target: an all-reduce of 10 M f32 at >= 50 % of a memcpy's bandwidth).
//!
//! ```text
//! cargo build --release --features mpi --example bench_allreduce
//! mpirun -np 2 -x KILN_NUM_THREADS=1 target/release/examples/bench_allreduce [--numel 10000000] [--rounds 15]
//! ```
//!
//! Rows, each the median over `--rounds` rounds that run the rows interleaved (this host has slow phases), rank 0's
//! clock, every call after a barrier:
//! - `memcpy`: one rank copies the bytes between two buffers it has touched before (a plain read and write of the
//!   data, the bar the target sets);
//! - `MPI_Allreduce, one call` and `MPI_Allreduce, 1 MiB pieces`: the communication library alone on buffers it
//!   has touched before (what `kiln::distributed` runs is the second);
//! - `kiln all_reduce`: `ProcessGroup::all_reduce` of a realized CPU tensor, as a user calls it: the arrival check,
//!   the pieces (each copied into the result, then summed there in place), a new tensor for the result (memory
//!   from kiln's host-buffer pool: the previous round's result);
//! - `kiln all_reduce_into`: the same, consuming a tensor nothing else holds, summed in its own buffer.
//!
//! Bandwidth is the tensor's bytes over the time (algorithm bandwidth, as `nccl-tests` reports `algbw`).

use kiln::distributed::{self, ReduceOp};
use kiln::{Device, Tensor};
use mpi::collective::SystemOperation;
use mpi::traits::CommunicatorCollectives;
use std::time::{Duration, Instant};

#[derive(clap::Parser)]
struct Args {
    /// f32 elements per all-reduce.
    #[arg(long, default_value_t = 10_000_000)]
    numel: usize,
    /// Interleaved rounds (the median is reported).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> kiln::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let group = distributed::init()?;
    if group.world_size() < 2 {
        eprintln!("bench_allreduce: start it under an MPI launcher, e.g. `mpirun -np 2 {}`", env!("CARGO_CRATE_NAME"));
        std::process::exit(2);
    }
    // The same world, for the library-only rows: rsmpi's handle to MPI_COMM_WORLD (kiln initialized MPI).
    let world = mpi::topology::SimpleCommunicator::world();
    let n = args.numel;
    let dev = Device::cpu();
    let values: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 + group.rank() as f32).collect();
    let t = Tensor::from_vec(values.clone(), [n], &dev)?;
    let mut dst = vec![0f32; n];
    let mut src = values;
    // Touch every page of both buffers once, so no row pays the first-touch page faults of these buffers.
    dst.copy_from_slice(&src);
    src.copy_from_slice(&dst);

    let piece = (1 << 20) / size_of::<f32>();
    let mut rows: [Vec<Duration>; 5] = Default::default();
    let mut owned = Tensor::from_vec(src.clone(), [n], &dev)?;
    for _ in 0..args.rounds + 1 {
        group.barrier()?;
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        rows[0].push(t0.elapsed());

        group.barrier()?;
        let t0 = Instant::now();
        world.all_reduce_into(&src[..], &mut dst[..], SystemOperation::sum());
        rows[1].push(t0.elapsed());

        group.barrier()?;
        let t0 = Instant::now();
        for (s, d) in src.chunks(piece).zip(dst.chunks_mut(piece)) {
            world.all_reduce_into(s, d, SystemOperation::sum());
        }
        rows[2].push(t0.elapsed());

        group.barrier()?;
        let t0 = Instant::now();
        let sum = group.all_reduce(&t, ReduceOp::Sum)?;
        rows[3].push(t0.elapsed());
        drop(std::hint::black_box(sum));

        group.barrier()?;
        let t0 = Instant::now();
        owned = group.all_reduce_into(owned, ReduceOp::Sum)?;
        rows[4].push(t0.elapsed());
    }
    // The first round warms up (kiln's first all-reduce also compiles nothing, but pages and MPI's buffers are cold).
    for r in &mut rows {
        r.remove(0);
    }
    if group.is_root() {
        let bytes = (n * size_of::<f32>()) as f64;
        let memcpy = median(rows[0].clone()).as_secs_f64();
        println!(
            "all-reduce of {n} f32 ({:.1} MB) between {} ranks, medians of {} rounds:",
            bytes / 1e6,
            group.world_size(),
            args.rounds
        );
        let names = [
            "memcpy (one rank)",
            "MPI_Allreduce, one call",
            "MPI_Allreduce, 1 MiB pieces",
            "kiln all_reduce",
            "kiln all_reduce_into",
        ];
        for (name, r) in names.iter().zip(&rows) {
            let s = median(r.clone()).as_secs_f64();
            println!(
                "  {name:<28} {:>8.2} ms {:>6.2} GB/s  {:>5.1} % of memcpy",
                s * 1e3,
                bytes / s / 1e9,
                memcpy / s * 100.0
            );
        }
    }
    Ok(())
}
