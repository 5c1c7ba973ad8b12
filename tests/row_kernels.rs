//! Row kernels (persistent reductions, `jit/src/kernel/rows.rs`): softmax, log_softmax, layer norm and an RMS norm
//! each schedule as one kernel over their rows, and cross entropy's pick of the target (a fold over the row that
//! reads each class's position) as one kernel with its row max and log-sum-exp; on every device they match the
//! interpreter, the kernels they replace (`KILN_ROW_KERNELS=off`'s schedule) and values PyTorch printed; a value
//! read off its row keeps the kernels apart; on the CPU every vector width of the generated row kernel, and the
//! Cranelift rendering of every row kernel, match the interpreter.

mod common;

use common::{Kind, data, devices, runs_on, tensor, tol, vals};
use kiln::nn::functional::{self as F, Reduction};
use kiln::{DType, Device, HostBuffer, Tensor};
use kiln_jit::kernel::{KernelIr, ScheduleOptions, eval, schedule, schedule_with};

/// The row ops under test, on `x` of shape `[.., cols]` (and class targets `t`, for a `[rows, cols]` `x`).
fn row_ops(x: &Tensor, t: &Tensor) -> Vec<(&'static str, Tensor)> {
    let cols = x.dims()[x.rank() - 1];
    let w: Vec<f64> = (0..cols).map(|c| 1.0 + 0.25 * (c % 5) as f64).collect();
    let b: Vec<f64> = w.iter().map(|v| 0.5 - v).collect();
    let w = tensor(x.dtype(), &w, &[cols]).to_device(&x.device()).unwrap();
    let b = tensor(x.dtype(), &b, &[cols]).to_device(&x.device()).unwrap();
    kiln::realize(&[&w, &b]).unwrap();
    let rms = |x: &Tensor| x.mul(x.square().mean(-1, true).add(1e-6).rsqrt());
    vec![
        ("softmax", x.softmax(-1)),
        ("log_softmax", x.log_softmax(-1)),
        ("layer_norm", F::layer_norm(x, &[cols], None, None, 1e-5)),
        ("layer_norm_affine", F::layer_norm(x, &[cols], Some(&w), Some(&b), 1e-5)),
        ("rms_norm", rms(x)),
        ("cross_entropy", if x.rank() == 2 { F::cross_entropy(x, t, Reduction::None) } else { x.clone() }),
        ("minus_row_max", x.sub(x.max(-1, true))),
    ]
}

/// Class targets for `rows` samples of `cols` classes: i64, or i32 on a device without 64-bit integers.
fn targets(rows: usize, cols: usize, dev: &Device) -> Tensor {
    let t: Vec<i64> = (0..rows).map(|r| ((r * 7 + 3) % cols) as i64).collect();
    if dev.supports(DType::I64) {
        Tensor::from_vec(t, [rows], dev).unwrap()
    } else {
        Tensor::from_vec(t.iter().map(|&c| c as i32).collect::<Vec<_>>(), [rows], dev).unwrap()
    }
}

/// Asserts `got` is within `tol` of `want` element by element (NaN matches NaN).
fn close(what: &str, got: &[f64], want: &[f64], t: common::Tol) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= t.abs + t.rel * w.abs() || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}: element {i}: {g} vs {w}");
    }
}

#[test]
fn each_row_op_is_one_kernel() {
    let Some(dev) = common::data_device() else { return };
    let x = tensor(DType::F32, &data(DType::F32, 6 * 16, 1, common::Dom::Cont(-3.0, 3.0)), &[6, 16]);
    let t = targets(6, 16, &dev);
    kiln::realize(&[&x, &t]).unwrap();
    for (name, y) in row_ops(&x, &t) {
        let cap = kiln::capture(&[&y]).unwrap();
        if name == "cross_entropy" {
            cross_entropy_is_one_row_kernel(&cap.graph);
            continue;
        }
        let plan = schedule(&cap.graph);
        let names: Vec<String> = plan.launches.iter().map(|l| l.kernel.name.clone()).collect();
        assert_eq!(names.len(), 1, "{name}: {names:?}");
        assert!(names[0].starts_with("W_"), "{name}: {names:?}");
        // The CPU's plan takes it (it generates it), where kernels are generated at all (AVX2, and not
        // `KILN_ELEMENTWISE=clif`).
        #[cfg(feature = "cpu")]
        if kiln_backends::cpu::gemm::asm::host_supported()
            && std::env::var("KILN_ELEMENTWISE").map_or(true, |v| v != "clif")
        {
            let k = &plan.launches[0].kernel;
            assert!(kiln_backends::cpu::takes_row_kernel(k), "{name}: the CPU declines\n{k}");
        }
        let off = ScheduleOptions { row_kernels: false, ..Default::default() };
        let before = schedule_with(&cap.graph, off).launches.len();
        assert!(before > names.len(), "{name}: {before} kernels without row kernels");
    }
}

/// In training, softmax's forward stays one row kernel and its gradient reads the output (PyTorch's `y * (g - Σ g
/// y)`, `Tensor::softmax`'s own rule): two kernels for both, where the composition's rules had stored the exponent
/// and the reciprocal for the backward (four kernels).
#[test]
fn softmax_forward_and_backward_are_a_row_kernel_each() {
    let Some(dev) = common::data_device() else { return };
    let x = tensor(DType::F32, &data(DType::F32, 6 * 16, 1, common::Dom::Cont(-3.0, 3.0)), &[6, 16]).requires_grad();
    let w = tensor(DType::F32, &data(DType::F32, 6 * 16, 2, common::Dom::Cont(-1.0, 1.0)), &[6, 16]);
    kiln::realize(&[&x, &w]).unwrap();
    let y = x.softmax(-1);
    let dx = (&y * &w).sum_all().backward().unwrap().get(&x).unwrap().clone();
    let cap = kiln::capture(&[&y, &dx]).unwrap();
    let plan = schedule(&cap.graph);
    let names: Vec<String> = plan.launches.iter().map(|l| l.kernel.name.clone()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("W_")), "{names:?}");
    let want = cap.reference().unwrap();
    let got = [y.to_host().unwrap(), dx.to_host().unwrap()];
    let tol = common::tol(DType::F32, common::Kind::Accumulate);
    for (what, g, w) in [("softmax", &got[0], &want[0]), ("its gradient", &got[1], &want[1])] {
        if let Err(e) = common::compare(g, w, tol) {
            panic!("{what} on {}: {e}", dev.describe());
        }
    }
}

/// softmax's own gradient rule computes in the input's dtype where it is not a half one, as the forward does: an f64
/// softmax's gradient matches `y * (g - Σ g y)` evaluated in f64 to f64 rounding (the rule had computed in f32:
/// errors of ~1e-8).
#[test]
fn softmax_gradient_keeps_f64() {
    let Some(dev) = common::data_device() else { return };
    if !dev.supports(DType::F64) {
        eprintln!("note: {} holds no f64: the f64 softmax gradient is not checked there", dev.describe());
        return;
    }
    let (rows, cols) = (6, 16);
    let xs = data(DType::F64, rows * cols, 3, common::Dom::Cont(-3.0, 3.0));
    let ws = data(DType::F64, rows * cols, 4, common::Dom::Cont(-1.0, 1.0));
    let x = tensor(DType::F64, &xs, &[rows, cols]).requires_grad();
    let w = tensor(DType::F64, &ws, &[rows, cols]);
    let dx = (&x.softmax(-1) * &w).sum_all().backward().unwrap().get(&x).unwrap().clone();
    let got = vals(&dx);
    for r in 0..rows {
        let (x, w) = (&xs[r * cols..][..cols], &ws[r * cols..][..cols]);
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        let y: Vec<f64> = e.iter().map(|v| v / sum).collect();
        let gy: f64 = w.iter().zip(&y).map(|(a, b)| a * b).sum();
        for c in 0..cols {
            let want = y[c] * (w[c] - gy);
            let g = got[r * cols + c];
            assert!((g - want).abs() <= 1e-13 * (1.0 + want.abs()), "row {r}, column {c}: {g} against {want}");
        }
    }
}

/// Cross entropy (per sample) schedules one row kernel: the pick of the target's log-probability, folding the row
/// with the row max and the log-sum-exp inside; the class targets' narrowing and the per-sample range check are
/// kernels of their own (with the default schedule the check runs after the fold in the row kernel; the CPU, whose
/// generated code does not compare i64, keeps it apart, and must then take the row kernel).
fn cross_entropy_is_one_row_kernel(graph: &kiln_jit::graph::Graph) {
    let row_kernels = |opts: ScheduleOptions| {
        let plan = schedule_with(graph, opts);
        let rows: Vec<KernelIr> =
            plan.launches.iter().filter(|l| !l.kernel.rows.is_empty()).map(|l| l.kernel.clone()).collect();
        (rows, plan.launches.len())
    };
    let (rows, n) = row_kernels(ScheduleOptions::default());
    assert_eq!(rows.len(), 1, "cross_entropy: row kernels {:?}", rows.iter().map(|k| &k.name).collect::<Vec<_>>());
    assert_eq!(rows[0].rows.len(), 2, "cross_entropy: the max and the log-sum-exp join the pick\n{}", rows[0]);
    let apart = schedule_with(graph, ScheduleOptions { row_kernels: false, ..Default::default() }).launches.len();
    assert!(apart > n, "cross_entropy: {apart} kernels apart, {n} with row kernels");
    #[cfg(feature = "cpu")]
    if kiln_backends::cpu::gemm::asm::host_supported()
        && std::env::var("KILN_ELEMENTWISE").map_or(true, |v| v != "clif")
    {
        let cpu = ScheduleOptions { row_kernel_ok: Some(kiln_backends::cpu::takes_row_kernel), ..Default::default() };
        let (rows, _) = row_kernels(cpu);
        assert_eq!(rows.len(), 1, "cross_entropy on the CPU");
        assert_eq!(rows[0].rows.len(), 2, "cross_entropy on the CPU\n{}", rows[0]);
        assert!(kiln_backends::cpu::takes_row_kernel(&rows[0]), "cross_entropy: the CPU declines\n{}", rows[0]);
    }
}

/// Schedules `out` with `options`, runs its launches with the kernel evaluator up to the first row kernel, and calls
/// `check(kernel, inputs, want)` with that kernel, its input buffers and the evaluator's value of it.
#[cfg(feature = "cpu")]
fn with_row_launch(
    name: &str,
    out: &Tensor,
    options: ScheduleOptions,
    check: impl FnOnce(&KernelIr, &[&HostBuffer], &HostBuffer),
) {
    let (k, args, rng) = common::with_launch(name, out, options, |_, l| !l.kernel.rows.is_empty())
        .unwrap_or_else(|| panic!("{name}: no row kernel"));
    let args: Vec<&HostBuffer> = args.iter().collect();
    check(&k, &args, &eval::run(&k, &args, &rng));
}

#[test]
fn row_kernels_match_the_interpreter_and_the_kernels_they_replace_on_every_device() {
    let shapes = [(2, 2), (3, 7), (5, 37), (9, 200), (64, 1024), (4, 33), (17, 16)];
    for dev in devices() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            if !runs_on(&dev, &[dtype]) {
                continue;
            }
            for (s, &(rows, cols)) in shapes.iter().enumerate() {
                let v = data(dtype, rows * cols, 40 + s as u64, common::Dom::Cont(-4.0, 4.0));
                let x = tensor(dtype, &v, &[rows, cols]).to_device(&dev).unwrap();
                let t = targets(rows, cols, &dev);
                kiln::realize(&[&x, &t]).unwrap();
                for (name, y) in row_ops(&x, &t) {
                    let what = format!("{name} {rows}x{cols} {dtype} on {}", dev.describe());
                    let cap = kiln::capture(&[&y]).unwrap();
                    let want = cap.reference().unwrap()[0].to_f64();
                    // Folded in another order than the interpreter's: the accumulate tolerance of the dtype.
                    let t = tol(dtype, Kind::Accumulate);
                    close(&what, &vals(&y), &want, t);
                    let inputs: Vec<&HostBuffer> = cap.inputs.iter().collect();
                    let off = ScheduleOptions { row_kernels: false, ..Default::default() };
                    let apart = eval::run_plan(&schedule_with(&cap.graph, off), &inputs, &cap.rng)[0].to_f64();
                    let fused = eval::run_plan(&schedule(&cap.graph), &inputs, &cap.rng)[0].to_f64();
                    close(&format!("{what}, kernels apart"), &fused, &apart, t);
                }
            }
        }
    }
}

#[test]
fn nan_and_infinite_rows_behave_as_in_the_interpreter() {
    let inf = f64::INFINITY;
    let v = [
        [1.0, f64::NAN, 2.0, 0.5, -1.0, 3.0, 0.0, 1.5],
        [-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf],
        [inf, 1.0, 2.0, 3.0, -1.0, 0.0, 0.5, 2.5],
        [-inf, 1.0, 2.0, 3.0, -1.0, 0.0, 0.5, 2.5],
        [0.25, -0.5, 1.0, 2.0, -3.0, 4.0, 0.0, f64::NAN],
    ]
    .concat();
    for dev in devices() {
        let x = tensor(DType::F32, &v, &[5, 8]).to_device(&dev).unwrap();
        let t = targets(5, 8, &dev);
        kiln::realize(&[&x, &t]).unwrap();
        for (name, y) in row_ops(&x, &t) {
            let want = kiln::capture(&[&y]).unwrap().reference().unwrap()[0].to_f64();
            let got = vals(&y);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{name} on {}: element {i}: {g} vs {w}", dev.describe());
                assert_eq!(g.is_nan(), w.is_nan(), "{what}");
                if w.is_infinite() {
                    assert_eq!(g, w, "{what}");
                } else if !w.is_nan() {
                    let t = tol(DType::F32, Kind::Accumulate);
                    assert!((g - w).abs() <= t.abs + t.rel * w.abs(), "{what}");
                }
            }
        }
    }
}

#[test]
fn a_row_value_read_at_another_row_keeps_the_kernels_apart() {
    let Some(_) = common::data_device() else { return };
    let x = tensor(DType::F32, &data(DType::F32, 6 * 16, 3, common::Dom::Cont(-3.0, 3.0)), &[6, 16]);
    x.realize().unwrap();
    // Each row minus the max of the row mirrored across the rows: not a row kernel, and right.
    let y = x.sub(x.max(-1, true).flip(0));
    let cap = kiln::capture(&[&y]).unwrap();
    let names: Vec<String> = schedule(&cap.graph).launches.iter().map(|l| l.kernel.name.clone()).collect();
    assert!(names.iter().all(|n| !n.starts_with("W_")), "{names:?}");
    assert_eq!(names.len(), 2, "{names:?}");
    let want = cap.reference().unwrap()[0].to_f64();
    close("flipped row max", &vals(&y), &want, common::Tol::EXACT);
}

/// PyTorch's values for `tests/fixtures/row_ops_torch.py`'s input (f32, CPU).
#[test]
fn row_ops_match_values_pytorch_printed() {
    #[rustfmt::skip]
    let x = [
        0.5, -1.25, 2.0, 0.125, 3.5, -0.75, 1.0,
        1.5, 0.25, -0.75, 3.0, -2.5, 0.0, 0.625,
        -2.0, 0.0, 0.5, 1.0, 8.0, -3.25, 2.25,
        0.75, 0.75, -0.5, 2.5, 0.875, 1.125, -1.0,
    ];
    let w = [0.5, 1.0, 2.0, -0.25, 1.5, 0.75, 1.25];
    let b = [0.1, -0.2, 0.3, 0.0, -0.5, 0.25, 1.0];
    let torch = torch_values();
    for dev in devices() {
        let x = tensor(DType::F32, &x, &[4, 7]).to_device(&dev).unwrap();
        let (w, b) = (tensor(DType::F32, &w, &[7]).to_device(&dev).unwrap(), tensor(DType::F32, &b, &[7]));
        let b = b.to_device(&dev).unwrap();
        let t = tensor(DType::I32, &[2.0, 6.0, 4.0, 0.0], &[4]).to_device(&dev).unwrap();
        let ours = [
            ("softmax", x.softmax(-1)),
            ("log_softmax", x.log_softmax(-1)),
            ("layer_norm", F::layer_norm(&x, &[7], Some(&w), Some(&b), 1e-5)),
            ("cross_entropy", F::cross_entropy(&x, &t, Reduction::None)),
        ];
        for ((name, y), (tname, want)) in ours.iter().zip(&torch) {
            assert_eq!(name, tname);
            // Another summation order and exp polynomial than PyTorch's: f32 elementwise-plus-accumulate.
            let what = format!("{name} on {}", dev.describe());
            close(&what, &vals(y), want, tol(DType::F32, Kind::Accumulate));
        }
    }
}

fn torch_values() -> Vec<(&'static str, Vec<f64>)> {
    vec![
        (
            "softmax",
            vec![
                0.035256557166576385,
                0.006126671563833952,
                0.15800894796848297,
                0.024231454357504845,
                0.7081469297409058,
                0.01010117307305336,
                0.0581282414495945,
                0.1530948132276535,
                0.043862394988536835,
                0.01613607443869114,
                0.6861233115196228,
                0.002804029267281294,
                0.034160066395998,
                0.06381941586732864,
                4.5172189857112244e-05,
                0.00033377984073013067,
                0.0005503098946064711,
                0.0009073076653294265,
                0.9949836730957031,
                1.294204867008375e-05,
                0.003166815033182502,
                0.09256669878959656,
                0.09256669878959656,
                0.026520801708102226,
                0.5326845645904541,
                0.1048918142914772,
                0.1346837431192398,
                0.016085680574178696,
            ],
        ),
        (
            "log_softmax",
            vec![
                -3.3451037406921387,
                -5.095103740692139,
                -1.8451037406921387,
                -3.7201037406921387,
                -0.3451036810874939,
                -4.595103740692139,
                -2.8451037406921387,
                -1.8766978979110718,
                -3.1266980171203613,
                -4.126698017120361,
                -0.37669792771339417,
                -5.876698017120361,
                -3.3766980171203613,
                -2.7516980171203613,
                -10.00502872467041,
                -8.00502872467041,
                -7.50502872467041,
                -7.00502872467041,
                -0.005028932821005583,
                -11.25502872467041,
                -5.75502872467041,
                -2.3798258304595947,
                -2.3798258304595947,
                -3.6298258304595947,
                -0.6298258304595947,
                -2.2548258304595947,
                -2.0048258304595947,
                -4.129825592041016,
            ],
        ),
        (
            "layer_norm",
            vec![
                0.022956959903240204,
                -1.5156581401824951,
                1.9830939769744873,
                0.10074859112501144,
                2.255770206451416,
                -0.4878352880477905,
                1.2222394943237305,
                0.47440028190612793,
                -0.23352839052677155,
                -1.0187830924987793,
                -0.42189884185791016,
                -3.1319782733917236,
                0.10750436037778854,
                1.2514629364013672,
                -0.3363181948661804,
                -0.47668957710266113,
                0.044594258069992065,
                -0.005320955533534288,
                2.660646438598633,
                -0.68382728099823,
                1.4921882152557373,
                0.15086913108825684,
                -0.0982617512345314,
                -1.8704173564910889,
                -0.44086596369743347,
                -0.16935059428215027,
                0.5933667421340942,
                -0.9499841332435608,
            ],
        ),
        ("cross_entropy", vec![1.8451037406921387, 2.7516980171203613, 0.005028932821005583, 2.3798258304595947]),
    ]
}

/// Row kernel `k` generated at every vector width this host has, forced, on `args`: within the f32 accumulate
/// tolerance of `want` (the kernel evaluator's values). The names of the widths that ran.
#[cfg(feature = "cpu")]
fn each_width_matches(name: &str, k: &KernelIr, args: &[&HostBuffer], want: &HostBuffer) -> Vec<&'static str> {
    use kiln_backends::cpu::isa::Isa;
    let mut ran = Vec::new();
    for isa in Isa::ALL.into_iter().filter(|i| i.present()) {
        let what = format!("{name} at {} lanes", isa.lanes());
        let got = kiln_backends::cpu::run_wide_at(k, isa, args)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .unwrap_or_else(|| panic!("{what}: not generated:\n{k}"));
        close(&what, &got.to_f64(), &want.to_f64(), tol(DType::F32, Kind::Accumulate));
        ran.push(isa.name());
    }
    ran
}

/// The CPU's generated row kernel at every vector width the host has, forced, and its Cranelift rendering: the
/// kernel evaluator's values (held to the interpreter above) within the f32 accumulate tolerance. Cross entropy's
/// pick compares each lane's class with the target: positions across unrolled copies, single vectors and ragged
/// tails.
#[cfg(feature = "cpu")]
#[test]
fn every_vector_width_of_the_generated_row_kernel_matches_the_interpreter() {
    if common::skip_without_avx2() {
        return;
    }
    let mut ran = Vec::new();
    // Rows over two loops (a layer norm over [batch, seq, dim]) merge into one.
    // 3 x 4096 splits over two or more threads into a chunk of one row and one of two: the first pass of a kernel
    // with a per-row value runs a row ahead (`wide::rows::emit`), so a chunk's last row and a one-row chunk are cases.
    let shapes: [&[usize]; 8] =
        [&[3, 7], &[5, 37], &[9, 200], &[64, 1024], &[17, 16], &[2, 65], &[4, 6, 24], &[3, 4096]];
    for shape in shapes {
        let (rows, cols) = (shape[..shape.len() - 1].iter().product::<usize>(), shape[shape.len() - 1]);
        let x = common::rand_f32(shape, 7 + cols as u64);
        let t = targets(rows, cols, &Device::cpu());
        kiln::realize(&[&x, &t]).unwrap();
        for (name, y) in row_ops(&x, &t) {
            if name == "cross_entropy" && shape.len() != 2 {
                continue; // `row_ops` has none over more than one row dim
            }
            // The CPU's schedule: cross entropy's range check is a kernel after the row kernel (the pick).
            let cpu =
                ScheduleOptions { row_kernel_ok: Some(kiln_backends::cpu::takes_row_kernel), ..Default::default() };
            with_row_launch(name, &y, cpu, |k, args, want| {
                assert!(!k.rows.is_empty(), "{name}: not a row kernel:\n{k}");
                let clif = kiln_backends::cpu::run_clif_at(k, args).unwrap_or_else(|e| panic!("{name}: {e}"));
                let what = format!("{name} {rows}x{cols} as a Cranelift kernel");
                close(&what, &clif.to_f64(), &want.to_f64(), tol(DType::F32, Kind::Accumulate));
                for isa in each_width_matches(&format!("{name} {rows}x{cols}"), k, args, want) {
                    if !ran.contains(&isa) {
                        ran.push(isa);
                    }
                }
            });
        }
    }
    eprintln!("generated row kernels ran at: {ran:?}");
}

/// The Cranelift rendering of row kernels the CPU does not generate (f64, f16, bf16; a reduce stage after row
/// reductions; rows over several loops), forced: the interpreter's values.
#[cfg(feature = "cpu")]
#[test]
fn cranelift_row_kernels_match_the_interpreter() {
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for &(shape, seed) in &[(&[3usize, 7][..], 1u64), (&[5, 37], 2), (&[2, 3, 40], 3), (&[9, 200], 4)] {
            let n: usize = shape.iter().product();
            let x = tensor(dtype, &data(dtype, n, seed, common::Dom::Cont(-4.0, 4.0)), shape);
            x.realize().unwrap();
            let cols = shape[shape.len() - 1];
            let cases = [
                ("softmax", x.softmax(-1)),
                ("layer_norm", F::layer_norm(&x, &[cols], None, None, 1e-5)),
                ("sum_exp_minus_max", x.sub(x.max(-1, true)).exp().sum(-1, false)),
            ];
            for (name, y) in cases {
                let what = format!("{name} {shape:?} {dtype} as a Cranelift kernel");
                common::with_last_launch(name, &y, ScheduleOptions::default(), |k, args, want| {
                    assert!(!k.rows.is_empty(), "{what}: not a row kernel:\n{k}");
                    let got = kiln_backends::cpu::run_clif_at(k, args).unwrap_or_else(|e| panic!("{what}: {e}"));
                    close(&what, &got.to_f64(), &want.to_f64(), tol(dtype, Kind::Accumulate));
                });
            }
        }
    }
}

/// A pre-norm block's layer norm gradient, with the residual's added (`dx = ln'(x) g + g_residual`): one row kernel
/// folding `mean(g w)` and `mean(g w x)`, which the CPU generates (its output pass reads five inputs and per-row
/// values from the kernel's scratch, which take no pointer slots), at every width, within the f32 accumulate
/// tolerance of the kernel evaluator.
#[cfg(feature = "cpu")]
#[test]
fn layer_norm_gradient_with_a_residual_is_one_generated_row_kernel() {
    if common::skip_without_avx2() {
        return;
    }
    for (s, &(rows, cols)) in [(3usize, 7usize), (17, 16), (9, 200), (64, 128)].iter().enumerate() {
        let seed = 90 + 4 * s as u64;
        let x = common::rand_f32(&[rows, cols], seed).requires_grad();
        let w = common::rand_f32(&[cols], seed + 1);
        let (g, g_res) = (common::rand_f32(&[rows, cols], seed + 2), common::rand_f32(&[rows, cols], seed + 3));
        kiln::realize(&[&x, &w, &g, &g_res]).unwrap();
        let y = F::layer_norm(&x, &[cols], Some(&w), None, 1e-5);
        let grads = y.mul(&g).add(x.mul(&g_res)).sum_all().backward().unwrap();
        let dx = grads.get(&x).unwrap();
        let cpu = ScheduleOptions { row_kernel_ok: Some(kiln_backends::cpu::takes_row_kernel), ..Default::default() };
        let name = format!("layer_norm gradient {rows}x{cols}");
        with_row_launch(&name, dx, cpu, |k, args, want| {
            assert_eq!(k.rows.len(), 2, "{name}: mean(g w) and mean(g w x) fold in the kernel\n{k}");
            each_width_matches(&name, k, args, want);
        });
    }
}
