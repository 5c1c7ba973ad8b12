//! `kiln::distributed` across processes. The tests named `*_under_mpirun` launch this test binary as two MPI ranks
//! (`mpirun -np 2 <this binary> --ignored --exact <worker>`; feature `mpi`, Open MPI or MPICH on the PATH), and the
//! ranks run a `worker_*` function, which checks its own results and fails (a non-zero exit) where they are wrong.
//! The parent checks each launch's exit status, time and output.
//!
//! - Collectives on every dtype, odd sizes (one that spans several 1 MiB all-reduce pieces) and empty tensors;
//!   `all_reduce_into` in place and, for a shared input, not; ranks that pass different shapes get the same
//!   error, and the group keeps working.
//! - Two ranks with half the batch each reproduce the losses of one process with the whole batch for 50 steps
//!   (SGD with momentum, gradient clipping after the averaging, gradient accumulation in the last steps): within
//!   2e-6 relative in f32, as the sums run in another order (per step the losses differ by a few ulps; the figure
//!   leaves room for that to compound over the steps), and end with bit-identical parameters on both ranks.
//! - Models that differ across ranks are refused at `DataParallel::new`, naming the parameter.
//! - A rank that hangs makes the other fail within the timeout, naming it; a rank that is killed makes mpirun end
//!   the job, naming it.
//! - A checkpoint rank 0 wrote during a two-rank run resumes in one process with the same next loss.
//!
//! Without the `mpi` feature only the world-of-one tests run (a group of one, the sampler, the launcher check).

#![cfg(feature = "cpu")]

mod test_cache;

use kiln::distributed::{self, DataParallel, ProcessGroup, ReduceOp};
use kiln::nn::functional::{self as F, Reduction};
use kiln::nn::{Linear, Module, ReLU, Sequential, clip_grad_norm};
use kiln::optim::{GradAccumulator, Optimizer, Sgd};
use kiln::{DType, Device, HostBuffer, Tensor};
use std::ops::Range;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

// ---- The training both sides run ----------------------------------------------------------------------------

const IN: usize = 16;
const OUT: usize = 4;
const SAMPLES: usize = 64;
/// The global batch: one process takes all of it, each of two ranks half.
const BATCH: usize = 16;
const STEPS: usize = 50;
/// The last steps accumulate two micro-batches per step (`GradAccumulator`) before averaging.
const ACCUMULATE_FROM: usize = 40;
/// Relative agreement of a two-rank loss with one process's, per step (see the module doc).
const LOSS_RTOL: f64 = 2e-6;

fn model(hidden: usize, seed: u64, dev: &Device) -> Sequential {
    kiln::manual_seed(seed);
    Sequential::new().add(Linear::new(IN, hidden, true, dev)).add(ReLU).add(Linear::new(hidden, OUT, true, dev))
}

fn optimizer(model: &Sequential) -> Sgd {
    Sgd::new(model.params(), 0.05).momentum(0.9)
}

/// Sample `i`: a smooth deterministic input and a label that depends on it.
fn sample(i: usize) -> ([f32; IN], i64) {
    let x: [f32; IN] = std::array::from_fn(|j| ((i * 7 + j * 3) as f32 * 0.37).sin());
    let label = (x[0] + x[1] > 0.0) as i64 + 2 * (x[2] > 0.3) as i64;
    (x, label)
}

/// Rows `part` of step `step`'s global batch (samples `step * BATCH ..` modulo the data set).
fn batch(step: usize, part: Range<usize>, dev: &Device) -> (Tensor, Tensor) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for r in part.clone() {
        let (x, y) = sample((step * BATCH + r) % SAMPLES);
        xs.extend_from_slice(&x);
        ys.push(y);
    }
    (Tensor::from_vec(xs, [part.len(), IN], dev).unwrap(), Tensor::from_vec(ys, [part.len()], dev).unwrap())
}

/// This rank's rows of a global batch (all of them for one process).
fn my_rows(rank: usize, world: usize) -> Range<usize> {
    let per = BATCH / world;
    rank * per..(rank + 1) * per
}

/// One training step on this rank's rows; returns the loss over the global batch (the ranks' mean).
fn train_step(
    step: usize,
    model: &Sequential,
    opt: &mut Sgd,
    ddp: Option<&DataParallel>,
    group: &ProcessGroup,
    dev: &Device,
) -> kiln::Result<f64> {
    let rows = my_rows(group.rank(), group.world_size());
    let mut losses = Vec::new();
    let grads = if step >= ACCUMULATE_FROM {
        // Two micro-batches, each loss scaled by 1/2: the sum of their gradients is the whole share's mean.
        let mut acc = GradAccumulator::new(model.params());
        let half = rows.len() / 2;
        for micro in [rows.start..rows.start + half, rows.start + half..rows.end] {
            let (x, y) = batch(step, micro, dev);
            let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean).div(2.0);
            acc.add(loss.backward()?, &[&loss])?;
            losses.push(loss);
        }
        acc.take()
    } else {
        let (x, y) = batch(step, rows, dev);
        let loss = F::cross_entropy(&model.forward(&x), &y, Reduction::Mean);
        let grads = loss.backward()?;
        losses.push(loss);
        grads
    };
    let refs: Vec<&Tensor> = losses.iter().collect();
    let mut grads = match ddp {
        Some(ddp) => ddp.average(grads, &refs)?,
        None => grads,
    };
    clip_grad_norm(&mut grads, &model.params(), 0.5);
    opt.step(grads, &refs)?;
    let local: f64 = losses.iter().map(|l| f64::from(l.item::<f32>().unwrap())).sum();
    let global = group.all_reduce(&Tensor::from_vec(vec![local], [1], dev)?, ReduceOp::Mean)?;
    global.item::<f64>()
}

/// The single-process losses for `steps` steps from rank 0's initial weights (seed 1).
fn single_process_losses(steps: Range<usize>, model: &Sequential, opt: &mut Sgd, dev: &Device) -> Vec<f64> {
    let one = ProcessGroup::single();
    steps.map(|s| train_step(s, model, opt, None, &one, dev).unwrap()).collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

// ---- Workers: each runs in every rank of an mpirun launch ------------------------------------------------------

/// The group of a worker launch, or `None` when this binary was not started as a worker (the workers are ignored
/// tests so that a plain `cargo test` never runs them outside mpirun, and never counts them as passes).
fn worker_group() -> Option<ProcessGroup> {
    std::env::var_os("KILN_DIST_WORKER")?;
    let group = distributed::init().expect("joining the MPI job");
    assert_eq!(group.world_size(), 2, "the launcher tests start two ranks");
    Some(group)
}

/// Rank-dependent values that every dtype holds exactly (small integers; bools).
fn rank_values(dtype: DType, n: usize, rank: usize) -> HostBuffer {
    let v: Vec<f64> = (0..n)
        .map(|i| match dtype {
            DType::Bool => (i + rank).is_multiple_of(3) as u8 as f64,
            _ => ((i % 13) + 3 * rank) as f64,
        })
        .collect();
    HostBuffer::from_f64(dtype, &v)
}

#[test]
#[ignore = "a worker: run by collectives_under_mpirun in each rank"]
fn worker_collectives() {
    let Some(group) = worker_group() else { return };
    let dev = Device::cpu();
    let (rank, world) = (group.rank(), group.world_size());
    // 300_001 f64 elements span three 1 MiB all-reduce pieces, the last one ragged.
    for dtype in DType::ALL {
        for n in [0, 1, 7, 300_001] {
            let t = Tensor::from_host(rank_values(dtype, n, rank), [n], &dev).unwrap();
            let sum = group.all_reduce(&t, ReduceOp::Sum).unwrap();
            let want: Vec<f64> = (0..n)
                .map(|i| match dtype {
                    DType::Bool => (0..world).any(|r| (i + r).is_multiple_of(3)) as u8 as f64,
                    _ => (0..world).map(|r| ((i % 13) + 3 * r) as f64).sum(),
                })
                .collect();
            assert_eq!(sum.to_host().unwrap(), HostBuffer::from_f64(dtype, &want), "all_reduce {dtype}[{n}]");
            assert_eq!(sum.dims(), [n]);
            if dtype.is_float() {
                let mean = group.all_reduce(&t, ReduceOp::Mean).unwrap();
                let halves: Vec<f64> = want.iter().map(|s| s / world as f64).collect();
                assert_eq!(mean.to_host().unwrap(), HostBuffer::from_f64(dtype, &halves), "mean {dtype}[{n}]");
            } else {
                let err = group.all_reduce(&t, ReduceOp::Mean).unwrap_err().to_string();
                assert!(err.contains("needs a float tensor"), "{err}");
            }
            let from_1 = group.broadcast(&t, 1).unwrap();
            assert_eq!(from_1.to_host().unwrap(), rank_values(dtype, n, 1), "broadcast {dtype}[{n}]");
            let gathered = group.all_gather(&t).unwrap();
            assert_eq!(gathered.dims(), [world, n]);
            for r in 0..world {
                let row = gathered.narrow(0, r, 1).reshape([n]);
                assert_eq!(row.to_host().unwrap(), rank_values(dtype, n, r), "all_gather {dtype}[{n}] row {r}");
            }
        }
    }
    // Bits travel unchanged in broadcasts and gathers: a NaN payload and a subnormal bf16.
    let odd = Tensor::from_host(
        HostBuffer::BF16(vec![kiln::bf16::from_bits(0x7fc1 + rank as u16), kiln::bf16::from_bits(1)].into()),
        [2],
        &dev,
    )
    .unwrap();
    let HostBuffer::BF16(b) = group.broadcast(&odd, 1).unwrap().to_host().unwrap() else { panic!("bf16") };
    assert_eq!(b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), [0x7fc2, 1]);
    // Shapes are kept.
    let m = Tensor::full([3, 5], (rank + 1) as f64, DType::F32, &dev);
    let s = group.all_reduce(&m, ReduceOp::Sum).unwrap();
    assert_eq!((s.dims(), s.to_vec::<f32>().unwrap()), (&[3usize, 5][..], vec![3.0f32; 15]));
    // Different shapes (and then different dtypes) on the ranks: the same error on both, nothing sent.
    let bad = Tensor::zeros([3 + rank], DType::F32, &dev);
    let err = group.all_reduce(&bad, ReduceOp::Sum).unwrap_err().to_string();
    assert!(err.contains("rank 0: all_reduce") && err.contains("f32 [3]") && err.contains("f32 [4]"), "{err}");
    let bad = Tensor::zeros([2], if rank == 0 { DType::F32 } else { DType::F64 }, &dev);
    let err = group.broadcast(&bad, 0).unwrap_err().to_string();
    assert!(err.contains("disagree") && err.contains("f64 [2]"), "{err}");
    // The group still works, and a barrier passes.
    let ok = group.all_reduce(&Tensor::ones([2], DType::I64, &dev), ReduceOp::Sum).unwrap();
    assert_eq!(ok.to_vec::<i64>().unwrap(), [2, 2]);
    group.barrier().unwrap();
    // all_reduce_into sums in the tensor's own buffer when nothing else holds it, and never touches a shared one.
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        let n = 300_001;
        let mine = || Tensor::from_host(rank_values(dtype, n, rank), [n], &dev).unwrap();
        let want = group.all_reduce(&mine(), ReduceOp::Sum).unwrap().to_host().unwrap();
        assert_eq!(group.all_reduce_into(mine(), ReduceOp::Sum).unwrap().to_host().unwrap(), want, "{dtype} owned");
        let shared = mine();
        let keep = shared.clone();
        assert_eq!(group.all_reduce_into(shared, ReduceOp::Sum).unwrap().to_host().unwrap(), want, "{dtype} shared");
        assert_eq!(keep.to_host().unwrap(), rank_values(dtype, n, rank), "{dtype}: a shared input is left alone");
    }
    // A lazy tensor is realized first.
    let lazy = Tensor::arange(0.0, 4.0, 1.0, &dev).mul((rank + 1) as f64);
    assert_eq!(group.all_reduce(&lazy, ReduceOp::Sum).unwrap().to_vec::<f32>().unwrap(), [0.0, 3.0, 6.0, 9.0]);
    println!("rank {rank}: collectives on every dtype agree");
}

#[test]
#[ignore = "a worker: run by data_parallel_under_mpirun in each rank"]
fn worker_data_parallel() {
    let Some(group) = worker_group() else { return };
    let dev = Device::cpu();
    // Each rank starts from its own weights: DataParallel::new must replace them with rank 0's.
    let model_ = model(32, 1 + group.rank() as u64, &dev);
    let ddp = DataParallel::new(&group, model_.params()).unwrap();
    assert_eq!(ddp.bucket_count(), 1, "four small f32 gradients travel as one bucket");
    let mut opt = optimizer(&model_);
    let losses: Vec<f64> =
        (0..STEPS).map(|s| train_step(s, &model_, &mut opt, Some(&ddp), &group, &dev).unwrap()).collect();

    let one = model(32, 1, &dev);
    let mut one_opt = optimizer(&one);
    let reference = single_process_losses(0..STEPS, &one, &mut one_opt, &dev);
    let mut worst = (0.0, 0);
    for (s, (a, b)) in losses.iter().zip(&reference).enumerate() {
        let r = rel(*a, *b);
        assert!(r <= LOSS_RTOL, "step {s}: two ranks {a}, one process {b} (relative {r:.2e})");
        if r > worst.0 {
            worst = (r, s);
        }
    }
    assert!(reference[STEPS - 1] < 0.8 * reference[0], "the model learns: {reference:?}");
    // Identical parameters on both ranks, bit for bit.
    for (name, p) in model_.named_params() {
        let both = group.all_gather(&p.get()).unwrap();
        let n = p.get().numel();
        let bits = both.reshape([2 * n]).to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits[..n], bits[n..], "parameter {name} differs between the ranks");
    }
    println!(
        "rank {}: {STEPS} steps, loss {:.4} -> {:.4}; largest relative difference from one process {:.2e} (step {})",
        group.rank(),
        losses[0],
        losses[STEPS - 1],
        worst.0,
        worst.1
    );
}

#[test]
#[ignore = "a worker: run by mismatched_models_under_mpirun in each rank"]
fn worker_mismatched_models() {
    let Some(group) = worker_group() else { return };
    let dev = Device::cpu();
    let hidden = if group.is_root() { 32 } else { 24 };
    let m = model(hidden, 1, &dev);
    let err = DataParallel::new(&group, m.params()).err().expect("different models must be refused").to_string();
    assert!(
        err.contains("parameter #0 `weight`") && err.contains("f32[32, 16]") && err.contains("f32[24, 16]"),
        "{err}"
    );
    // A different parameter count is refused too.
    let fewer: Vec<_> = m.params().into_iter().take(if group.is_root() { 4 } else { 3 }).collect();
    let err = DataParallel::new(&group, fewer).err().expect("different counts must be refused").to_string();
    assert!(err.contains("4 parameters") || err.contains("3 parameters"), "{err}");
    println!("rank {}: {err}", group.rank());
}

/// Rank 1 stops answering after three collectives; rank 0 must fail within its 2 s timeout, naming rank 1.
#[test]
#[ignore = "a worker: run by hung_rank_under_mpirun in each rank"]
fn worker_hung_rank() {
    let Some(group) = worker_group() else { return };
    group.set_timeout(Duration::from_secs(2));
    let dev = Device::cpu();
    let t = Tensor::ones([10], DType::F32, &dev);
    for _ in 0..3 {
        group.all_reduce(&t, ReduceOp::Sum).unwrap();
    }
    if group.rank() == 1 {
        std::thread::sleep(Duration::from_secs(600));
    }
    let started = Instant::now();
    match group.all_reduce(&t, ReduceOp::Sum) {
        Err(e @ kiln::Error::RankTimeout { .. }) => {
            eprintln!("rank 0 after {:.1} s: {e}", started.elapsed().as_secs_f64());
            // The group is unusable now, and says so.
            let again = group.barrier().unwrap_err().to_string();
            assert!(again.contains("unusable"), "{again}");
            std::process::exit(3);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

/// Rank 1 is killed (SIGKILL) mid-run; rank 0 keeps calling collectives (with a long timeout).
#[test]
#[ignore = "a worker: run by killed_rank_under_mpirun in each rank"]
fn worker_killed_rank() {
    let Some(group) = worker_group() else { return };
    group.set_timeout(Duration::from_secs(120));
    let dev = Device::cpu();
    let t = Tensor::ones([1000], DType::F32, &dev);
    for i in 0..1000 {
        if group.rank() == 1 && i == 5 {
            // SAFETY: raising a signal in this process; SIGKILL cannot be caught, so nothing runs after it.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        group.all_reduce(&t, ReduceOp::Sum).unwrap();
    }
    panic!("rank {} finished 1000 collectives without its peer", group.rank());
}

/// Ten steps on two ranks, a checkpoint from rank 0, the eleventh step's loss written next to it.
#[test]
#[ignore = "a worker: run by checkpoint_resumes_in_one_process in each rank"]
fn worker_checkpoint() {
    let Some(group) = worker_group() else { return };
    let dir = PathBuf::from(std::env::var_os("KILN_DIST_DIR").expect("the launcher sets KILN_DIST_DIR"));
    let dev = Device::cpu();
    let m = model(32, 1 + group.rank() as u64, &dev);
    let ddp = DataParallel::new(&group, m.params()).unwrap();
    let mut opt = optimizer(&m);
    for s in 0..10 {
        train_step(s, &m, &mut opt, Some(&ddp), &group, &dev).unwrap();
    }
    if group.is_root() {
        kiln::save_module(&m, dir.join("model.safetensors")).unwrap();
        kiln::save_optimizer(&opt, dir.join("optimizer.safetensors")).unwrap();
    }
    group.barrier().unwrap();
    let next = train_step(10, &m, &mut opt, Some(&ddp), &group, &dev).unwrap();
    if group.is_root() {
        std::fs::write(dir.join("next_loss"), next.to_string()).unwrap();
    }
}

// ---- The launcher tests -----------------------------------------------------------------------------------------

/// What an mpirun launch of a worker did.
#[cfg(feature = "mpi")]
struct Launch {
    status: std::process::ExitStatus,
    elapsed: Duration,
    output: String,
}

/// Runs `worker` in two ranks under mpirun (`KILN_MPIRUN` overrides the command), killing it after `limit`.
#[cfg(feature = "mpi")]
fn mpirun(worker: &str, env: &[(&str, &std::path::Path)], limit: Duration) -> Launch {
    let exe = std::env::current_exe().expect("this test binary");
    let mpirun = std::env::var("KILN_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let out_path = std::env::temp_dir().join(format!("kiln-dist-{worker}-{}.log", std::process::id()));
    let log = std::fs::File::create(&out_path).expect("a log file");
    let mut cmd = Command::new(&mpirun);
    cmd.args(["-np", "2"])
        .arg(&exe)
        .args(["--ignored", "--exact", worker, "--nocapture", "--test-threads", "1"])
        .env("KILN_DIST_WORKER", "1")
        // One kernel thread per rank: two ranks on two cores.
        .env("KILN_NUM_THREADS", "1")
        // Open MPI refuses root without these (CI runs as root); other MPIs ignore them.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot start `{mpirun}` ({e}): the `mpi` feature's tests need an MPI launcher (Debian: openmpi-bin)")
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = std::fs::read_to_string(&out_path).unwrap_or_default();
            panic!("{worker} under mpirun still ran after {limit:?}; its output:\n{output}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    Launch { status, elapsed: started.elapsed(), output }
}

#[cfg(feature = "mpi")]
fn expect_success(worker: &str, env: &[(&str, &std::path::Path)]) -> String {
    let l = mpirun(worker, env, Duration::from_secs(300));
    assert!(l.status.success(), "{worker} failed ({}):\n{}", l.status, l.output);
    // Both ranks ran the worker (a filter that matched nothing would pass vacuously).
    assert_eq!(l.output.matches("1 passed").count(), 2, "{worker}: both ranks must run it:\n{}", l.output);
    l.output
}

#[cfg(feature = "mpi")]
#[test]
fn collectives_under_mpirun() {
    let out = expect_success("worker_collectives", &[]);
    assert!(out.contains("rank 0: collectives") && out.contains("rank 1: collectives"), "{out}");
}

#[cfg(feature = "mpi")]
#[test]
fn data_parallel_under_mpirun() {
    let out = expect_success("worker_data_parallel", &[]);
    for line in out.lines().filter(|l| l.contains("largest relative difference")) {
        println!("{line}");
    }
}

#[cfg(feature = "mpi")]
#[test]
fn mismatched_models_under_mpirun() {
    expect_success("worker_mismatched_models", &[]);
}

#[cfg(feature = "mpi")]
#[test]
fn hung_rank_under_mpirun() {
    let l = mpirun("worker_hung_rank", &[], Duration::from_secs(120));
    assert!(!l.status.success(), "a hung rank must fail the job:\n{}", l.output);
    assert!(l.output.contains("rank(s) [1] did not arrive within 2s"), "the error must name rank 1:\n{}", l.output);
    // 2 s of timeout plus start-up and mpirun ending the hung rank; far below the hung rank's 600 s sleep.
    assert!(l.elapsed < Duration::from_secs(60), "took {:?}:\n{}", l.elapsed, l.output);
    println!("hung rank: the job failed after {:.1} s", l.elapsed.as_secs_f64());
}

#[cfg(feature = "mpi")]
#[test]
fn killed_rank_under_mpirun() {
    let l = mpirun("worker_killed_rank", &[], Duration::from_secs(120));
    assert!(!l.status.success(), "a killed rank must fail the job:\n{}", l.output);
    assert!(l.output.contains("rank 1"), "the launcher must name rank 1:\n{}", l.output);
    // Well within rank 0's 120 s timeout: the launcher ends the job as soon as a rank dies.
    assert!(l.elapsed < Duration::from_secs(60), "took {:?}:\n{}", l.elapsed, l.output);
    println!("killed rank: the job failed after {:.1} s", l.elapsed.as_secs_f64());
}

#[cfg(feature = "mpi")]
#[test]
fn checkpoint_resumes_in_one_process() {
    let dir = tempfile::tempdir().unwrap();
    expect_success("worker_checkpoint", &[("KILN_DIST_DIR", dir.path())]);
    let two_ranks: f64 = std::fs::read_to_string(dir.path().join("next_loss")).unwrap().parse().unwrap();
    let dev = Device::cpu();
    // A model of other weights, which the checkpoint replaces.
    let m = model(32, 99, &dev);
    kiln::load_module(&m, dir.path().join("model.safetensors"), true).unwrap();
    let mut opt = optimizer(&m);
    kiln::load_optimizer(&mut opt, dir.path().join("optimizer.safetensors")).unwrap();
    let one = single_process_losses(10..11, &m, &mut opt, &dev)[0];
    assert!(rel(one, two_ranks) <= LOSS_RTOL, "resumed in one process {one}, two ranks {two_ranks}");
}

// ---- A world of one process: no launcher needed -----------------------------------------------------------------

#[test]
fn a_group_of_one_returns_its_input() {
    let g = ProcessGroup::single();
    assert_eq!((g.rank(), g.world_size(), g.is_root()), (0, 1, true));
    let dev = Device::cpu();
    let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.0], [3], &dev).unwrap();
    assert_eq!(g.all_reduce(&t, ReduceOp::Sum).unwrap().to_vec::<f32>().unwrap(), [1.5, -2.0, 3.0]);
    assert_eq!(g.all_reduce(&t, ReduceOp::Mean).unwrap().to_vec::<f32>().unwrap(), [1.5, -2.0, 3.0]);
    assert_eq!(g.broadcast(&t, 0).unwrap().to_vec::<f32>().unwrap(), [1.5, -2.0, 3.0]);
    assert!(g.broadcast(&t, 1).unwrap_err().to_string().contains("root rank 1 is not in this group of 1"));
    let all = g.all_gather(&t).unwrap();
    assert_eq!(all.dims(), [1, 3]);
    g.barrier().unwrap();
    // DataParallel over one process: the gradients pass through unchanged, and training is plain training.
    let m = model(8, 3, &dev);
    let ddp = DataParallel::new(&g, m.params()).unwrap();
    let mut opt = optimizer(&m);
    let with: Vec<f64> = (0..5).map(|s| train_step(s, &m, &mut opt, Some(&ddp), &g, &dev).unwrap()).collect();
    let m2 = model(8, 3, &dev);
    let mut opt2 = optimizer(&m2);
    let without = single_process_losses(0..5, &m2, &mut opt2, &dev);
    assert_eq!(with, without);
}

/// `init` under a launcher's environment in a build without the `mpi` feature must refuse (each process would
/// otherwise train alone); with it, `WORLD_SIZE` without MPI is refused. Run in a child process with the variables set.
#[test]
fn init_refuses_a_launcher_it_cannot_join() {
    if let Some(expect) = std::env::var_os("KILN_DIST_INIT_CHILD") {
        let err = distributed::init().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(expect.to_str().unwrap()), "init said: {err:?}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let run = |vars: &[(&str, &str)], expect: &str| {
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "init_refuses_a_launcher_it_cannot_join", "--test-threads", "1"]);
        cmd.env("KILN_DIST_INIT_CHILD", expect);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[("WORLD_SIZE", "2")], "WORLD_SIZE=2 but no MPI launcher");
    if !cfg!(feature = "mpi") {
        run(&[("OMPI_COMM_WORLD_SIZE", "2")], "built without its `mpi` feature");
    }
}

#[test]
fn sampler_shards_an_epoch() {
    let g = ProcessGroup::single();
    let s = distributed::DistributedSampler::new(10, &g).shuffle(false);
    assert_eq!(s.indices(0), (0..10).collect::<Vec<_>>());
    let shares: Vec<Vec<usize>> =
        (0..3).map(|r| distributed::DistributedSampler::for_rank(10, r, 3).seed(4).indices(2)).collect();
    assert!(shares.iter().all(|s| s.len() == 4), "{shares:?}");
    let mut all = shares.concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "together the ranks visit every sample");
}
