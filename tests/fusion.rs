//! Fusion: kernel counts for the shapes of graph DESIGN.md promises to fuse, and the fused plan (run by the kernel
//! IR evaluator) against the reference interpreter.

// The graphs are built on the CPU (cargo feature `cpu`); the kernel counts are the scheduler's, for every device.
#![cfg(feature = "cpu")]

mod test_cache;

mod common;

use common::{Kind, tol};
use kiln::{DType, Device, Tensor};
use kiln_jit::kernel::{eval, schedule};

fn rand(shape: &[usize]) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F32, &Device::cpu())
}

/// Schedules `t`'s graph, checks the fused plan against the interpreter, and returns the kernel names.
fn kernels(t: &Tensor) -> Vec<String> {
    kernels_of(&[t])
}

/// [`kernels`] of one graph computing every tensor of `ts`, each checked.
fn kernels_of(ts: &[&Tensor]) -> Vec<String> {
    let cap = kiln::capture(ts).expect("capture");
    let plan = schedule(&cap.graph);
    check_plan(&cap, &plan);
    plan.launches.iter().map(|l| l.kernel.name.clone()).collect()
}

/// Runs `plan` (a schedule of `cap`'s graph) on the kernel evaluator and checks each output against the interpreter.
fn check_plan(cap: &kiln::Captured, plan: &kiln_jit::kernel::KernelPlan) {
    let inputs: Vec<_> = cap.inputs.iter().collect();
    let fused = eval::run_plan(plan, &inputs, &cap.rng);
    let reference = cap.reference().expect("interpreter");
    assert_eq!(fused.len(), reference.len());
    for (fused, reference) in fused.iter().zip(&reference) {
        let (a, b) = (fused.to_f64(), reference.to_f64());
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            // The fused plan sums in a different order than the interpreter: the f32 accumulate tolerance.
            let t = tol(DType::F32, Kind::Accumulate);
            assert!(
                (x - y).abs() <= t.abs + t.rel * y.abs() || (x.is_nan() && y.is_nan()),
                "element {i}: fused {x} vs {y}"
            );
        }
    }
}

#[test]
fn mul_add_relu_sum_is_one_kernel() {
    let (a, b, c) = (rand(&[8, 16]), rand(&[8, 16]), rand(&[16]));
    kiln::realize(&[&a, &b, &c]).unwrap();
    let k = kernels(&(&a * &b + &c).relu().sum(1, false));
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("R_"), "{k:?}");
}

#[test]
fn twenty_op_chain_is_one_kernel() {
    let x = rand(&[1000]);
    x.realize().unwrap();
    let mut y = x.clone();
    for i in 0..20 {
        y = match i % 4 {
            0 => &y * 0.9,
            1 => &y + 0.1,
            2 => y.tanh(),
            _ => y.maximum(-0.5),
        };
    }
    let k = kernels(&y);
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("E_"), "{k:?}");
}

/// Rule 1c: a value too costly to recompute (a tanh and three ops) that two nodes of one kernel read is computed in
/// that kernel, once per element, instead of stored by a kernel of its own.
#[test]
fn a_costly_value_read_twice_by_one_kernel_is_computed_there() {
    let x = rand(&[64, 32]);
    x.realize().unwrap();
    let s = (x.tanh() * 2.0 + 1.0) * 3.0;
    let k = kernels(&(s.exp() * s.tanh()));
    assert_eq!(k.len(), 1, "{k:?}");
}

/// Rule 1d: that value, read by two kernels that both read `x` anyway, is computed by each (two kernels, not three);
/// read by two kernels that do not read `x`, it is stored.
#[test]
fn a_value_whose_readers_load_its_inputs_anyway_is_recomputed_by_each() {
    let x = rand(&[64, 32]);
    x.realize().unwrap();
    let s = (x.tanh() * 2.0 + 1.0) * 3.0;
    let k = kernels_of(&[&(&s * &x), &(s.exp() + &x)]);
    assert_eq!(k.len(), 2, "{k:?}");
    let k = kernels_of(&[&(&s * 2.0), &s.exp()]);
    assert_eq!(k.len(), 3, "{k:?}");
}

/// A tanh GELU between two linear layers, forward and backward, with its own gradient rule
/// (`nn::functional::gelu`): the forward runs two elementwise kernels over the pre-activation, the activation and
/// its derivative, each computing its own sigmoid (rule 1c keeps the derivative's sigmoid, read twice, inside its
/// kernel); the gradient's product reads the stored derivative and multiplies in its epilogue, with no
/// transcendental of its own.
#[test]
fn gelu_stores_its_derivative_and_its_gradient_product_reads_it() {
    use kiln::nn::functional::{Approximate, gelu};
    let (x, w1, b1, w2, dy) = (rand(&[32, 16]), rand(&[24, 16]), rand(&[24]), rand(&[8, 24]), rand(&[32, 8]));
    kiln::realize(&[&x, &w1, &b1, &w2, &dy]).unwrap();
    let w1 = w1.detach().requires_grad();
    let y = gelu(&(x.matmul(&w1.t()) + &b1), Approximate::Tanh).matmul(&w2.t());
    let grads = y.mul(&dy).sum_all().backward().unwrap();
    let dw1 = grads.get(&w1).unwrap();
    let names = kernels_of(&[&y, dw1]);
    let elementwise: Vec<&String> = names.iter().filter(|n| n.starts_with("E_") && n.ends_with("_32x24")).collect();
    // The activation's kernel and the derivative's, each with its exp.
    assert_eq!(elementwise.len(), 2, "{names:?}");
    assert!(elementwise.iter().all(|n| n.matches("exp").count() == 1), "{names:?}");
    // The gradient's product: one multiply in its epilogue.
    let gradient: Vec<&String> =
        names.iter().filter(|n| n.starts_with("G_matmul_") && n.ends_with("_32x24_8")).collect();
    assert_eq!(gradient.len(), 1, "{names:?}");
    assert_eq!(gradient[0], "G_matmul_mul_32x24_8", "{names:?}");
}

/// A matmul with K = 1 (the outer product of an SGD update at batch 1) is recorded as a broadcast product, lowered
/// to elementwise code with no reduce loop left, and through the CPU JIT gives the interpreter's bits. A one-term
/// sum is its term, so a `-0.0` product stays `-0.0` (IEEE; a `+0.0`-started fold would turn it into `+0.0`).
#[test]
fn k1_matmul_is_elementwise_and_bit_exact() {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1.0f32, -0.0, 2.0, -3.0, 0.5, 0.0], [6, 1], &dev).unwrap();
    let bv: Vec<f32> = (0..37).map(|i| if i == 3 { -0.0 } else { i as f32 * 0.25 - 4.0 }).collect();
    let b = Tensor::from_vec(bv, [1, 37], &dev).unwrap();
    let w = rand(&[6, 37]);
    kiln::realize(&[&w]).unwrap();
    let update = &w - a.matmul(&b) * 0.01;
    let cap = kiln::capture(&[&update]).expect("capture");
    let plan = schedule(&cap.graph);
    for l in &plan.launches {
        assert!(l.kernel.reduce.is_none(), "a K = 1 matmul kept its reduction:\n{}", l.kernel);
    }
    kernels(&update);
    let outer: Vec<f32> = a.matmul(&b).to_vec().unwrap();
    assert_eq!(outer[37 + 20].to_bits(), (-0.0f32).to_bits(), "-0.0 * 1.0 must stay -0.0");
    for t in [a.matmul(&b), update] {
        let want = kiln::capture(&[&t]).unwrap().reference().unwrap()[0].to_f64();
        let got: Vec<f32> = t.to_vec().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), (*w as f32).to_bits(), "element {i}: {g} vs {w}");
        }
    }
}

#[test]
fn matmul_bias_relu_is_one_gemm_kernel() {
    let (x, w, b) = (rand(&[16, 8]), rand(&[16, 12]), rand(&[12]));
    kiln::realize(&[&x, &w, &b]).unwrap();
    let k = kernels(&(x.t().matmul(&w) + &b).relu());
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("G_"), "{k:?}");
}

/// A matmul operand that is a reshape across a permutation (attention's heads merged back: `[B, H, T, Dh]` read as
/// `[B * T, H * Dh]`) is stored once in the layout the GEMM reads (its index would divide per element), with the
/// loops of that copy split so it runs without divisions; the product is then a GEMM with strided operands.
#[test]
fn a_scrambled_matmul_operand_is_stored_for_the_gemm() {
    let (x, w) = (rand(&[2, 4, 8, 16]), rand(&[64, 12]));
    kiln::realize(&[&x, &w]).unwrap();
    let merged = x.sin().permute([0, 2, 1, 3]).reshape([16, 64]);
    let y = merged.matmul(&w);
    let cap = kiln::capture(&[&y]).expect("capture");
    let plan = schedule(&cap.graph);
    assert_eq!(plan.launches.len(), 2, "{:?}", plan.launches.iter().map(|l| &l.kernel.name).collect::<Vec<_>>());
    let gemm = &plan.launches[1].kernel;
    assert!(kiln_jit::kernel::gemm::GemmView::of(gemm).is_some(), "not a GEMM:\n{gemm}");
    // The copy (with the sin inlined) runs over split loops, every index affine.
    let copy = &plan.launches[0].kernel;
    assert_eq!(copy.out_extents, [2, 8, 4, 16], "{copy}");
    kernels(&y);
}

/// A fused q/k/v projection (`x @ w + b` viewed as `[B, T, 3, H, Dh]`, its parts narrowed out): the projection
/// stores its output once, the bias in its GEMM's epilogue, and both attention products read q, k and v in place
/// as strided views; storing each part had cost a pass over the projection's output per part (three kernels).
#[test]
fn the_parts_of_a_fused_projection_are_read_in_place() {
    // Scaled so that the logits stay near 1: the check's tolerance is relative to each result.
    let (x, w, b) = (rand(&[2 * 8, 16]) * 0.25, rand(&[16, 3 * 16]) * 0.25, rand(&[3 * 16]));
    kiln::realize(&[&x, &w, &b]).unwrap();
    let qkv = (x.matmul(&w) + &b).reshape([2, 8, 3, 4, 4]).permute([2, 0, 3, 1, 4]);
    let part = |i: usize| qkv.narrow(0, i, 1).squeeze(0);
    let (q, k, v) = (part(0), part(1), part(2));
    let y = q.matmul(&k.transpose(-1, -2)).mul(0.5).matmul(&v);
    let names = kernels(&y);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("G_")), "{names:?}");
    assert!(names[0].starts_with("G_matmul_add"), "{names:?}");
    // And as the CPU runs it (strided batched operands).
    let want = kiln::capture(&[&y]).unwrap().reference().unwrap().remove(0);
    if let Err(e) = common::compare(&y.to_host().unwrap(), &want, tol(DType::F32, Kind::Accumulate)) {
        panic!("{e}");
    }
}

/// Rule 3c: attention's logits (`q kᵀ * scale + bias`) feed two kernels (the row max and the exponent): the product
/// stores the scaled, biased logits as its epilogue, so neither kernel finishes the product again.
#[test]
fn a_product_feeding_several_kernels_stores_its_epilogue() {
    let (q, k, bias) = (rand(&[2, 8, 16]), rand(&[2, 8, 16]), rand(&[8, 8]));
    kiln::realize(&[&q, &k, &bias]).unwrap();
    let logits = q.matmul(&k.transpose(-1, -2)).mul(0.25).add(&bias);
    let names = kernels(&logits.softmax(-1));
    assert!(names.iter().any(|n| n.starts_with("G_matmul_mul_add")), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with('G') && !n.contains("mul_add")), "{names:?}");
}

#[test]
fn softmax_movement_and_padding_match_the_interpreter() {
    let x = rand(&[3, 4, 5]);
    x.realize().unwrap();
    let k = kernels(&x.softmax(-1));
    // One row kernel: the row's max, the sum of exp(x - max), then exp(x - max) / sum per element.
    assert_eq!(k.len(), 1, "{k:?}");
    assert!(k[0].starts_with("W_"), "{k:?}");
    kernels(&x.permute([2, 0, 1]).reshape([5, 12]).flip(1).slice(1, 1, 11, 3));
    kernels(&x.pad(&[(1, 2), (0, 1)], 7.0).sum(0, false));
    kernels(&Tensor::cat(&[&x, &x.exp()], 1).transpose(0, 2).contiguous());
    kernels(&x.argmax(1, true).to_dtype(DType::F32));
    kernels(&x.reshape([12, 5]).matmul(&x.reshape([5, 12])).log_softmax(0));
}

/// A zero pad of a cast of a stored value (a bf16 model's slice gradients, cast from an f32 product and padded
/// into place) reads the value as a masked load and casts it: no select of its own per element.
#[test]
fn zero_pads_of_casts_are_masked_loads() {
    let (x, y) = (rand(&[3, 4, 5]), rand(&[3, 2, 5]));
    kiln::realize(&[&x, &y]).unwrap();
    let z = x.to_dtype(DType::BF16).pad(&[(0, 0), (0, 2)], 0.0) + y.to_dtype(DType::BF16).pad(&[(0, 0), (4, 0)], 0.0);
    assert_eq!(kernels(&z).len(), 1);
    let cap = kiln::capture(&[&z]).unwrap();
    let plan = schedule(&cap.graph);
    let selects =
        plan.launches[0].kernel.outer.iter().filter(|i| matches!(i.op, kiln_jit::kernel::ir::InstOp::Where(..)));
    assert_eq!(selects.count(), 0, "{}", plan.launches[0].kernel);
}

/// The JIT's unrolled vector bodies (several f32x4 per iteration), the single-vector loop and the scalar tail all
/// run for a long odd-length input, split over threads: every element matches the interpreter.
#[test]
fn long_elementwise_kernels_match_the_interpreter_through_the_jit() {
    for n in [1usize, 7, 23, 24, 25, 1001, 70_001] {
        let (a, b) = (rand(&[n]), rand(&[n]));
        kiln::realize(&[&a, &b]).unwrap();
        let y = a.sin().square() * &b + a.exp().tanh() - b.clamp(-0.5, 0.5);
        let reference = kiln::capture(&[&y]).unwrap().reference().unwrap()[0].to_f64();
        let got = y.to_vec::<f32>().unwrap();
        for (i, (x, r)) in got.iter().zip(&reference).enumerate() {
            let t = tol(DType::F32, Kind::Elementwise);
            assert!((*x as f64 - r).abs() <= t.abs + t.rel * r.abs(), "n={n} element {i}: {x} vs {r}");
        }
    }
}

/// A convolution's GEMM reads its patches where the padded input stores them (rule 2f, where the backend reads a
/// patched B): two kernels, the pad and the GEMM, no im2col copy (one, the GEMM, with the padding folded in). Its
/// input gradient is a GEMM over the output gradient's patches; the windows' own gradient is one kernel adding the
/// window taps, each read with an index free of divisions: the pads' wrapped source indices let the reshapes above
/// them simplify (`IExpr::Wrap`).
#[test]
fn a_convolution_reads_its_patches_in_place_and_its_input_gradient_as_a_convolution() {
    use kiln::nn::functional::{Conv2dOptions, conv2d};
    use kiln_jit::kernel::{IExpr, ScheduleOptions, schedule_with};
    let (x, w) = (rand(&[2, 8, 12, 12]), rand(&[16, 8, 3, 3]));
    kiln::realize(&[&x, &w]).unwrap();
    let same = Conv2dOptions { padding: [1, 1], ..Default::default() };
    let y = conv2d(&x, &w, None, &same);
    let cap = kiln::capture(&[&y]).expect("capture");
    let patched = ScheduleOptions { patched_b: Some(1), ..Default::default() };
    let plan = schedule_with(&cap.graph, patched);
    // The patches, [2, 72, 144], are never stored: the kernels are the pad, the GEMM and the weight's small copy.
    let patches = 2 * 72 * 144;
    let stored = |plan: &kiln_jit::kernel::KernelPlan| {
        plan.launches.iter().filter(|l| !l.kernel.name.starts_with("G_")).any(|l| l.kernel.output.len >= patches)
    };
    let names: Vec<&String> = plan.launches.iter().map(|l| &l.kernel.name).collect();
    assert!(!stored(&plan), "{names:?}");
    let gemm = &plan.launches.last().unwrap().kernel;
    let view = kiln_jit::kernel::gemm::GemmView::of_patched(gemm).unwrap_or_else(|| panic!("not a GEMM:\n{gemm}"));
    assert!(view.b.patch.is_some(), "B is not read as patches:\n{gemm}");
    // Without the option, the patches are stored in the GEMM's layout first.
    assert!(stored(&schedule(&cap.graph)));
    // With the padding folded in, the GEMM reads the input itself (a masked patch) and nothing else is stored but
    // the weight's copy: no padded input.
    let folded = schedule_with(&cap.graph, ScheduleOptions { patched_pad: true, ..patched });
    let names: Vec<&String> = folded.launches.iter().map(|l| &l.kernel.name).collect();
    assert!(folded.launches.iter().all(|l| l.kernel.output.len < 2 * 8 * 12 * 12 || l.kernel.name.starts_with("G_")));
    assert!(!names.iter().any(|n| n.starts_with("E_pad")), "{names:?}");
    let gemm = &folded.launches.last().unwrap().kernel;
    let view = kiln_jit::kernel::gemm::GemmView::of_patched(gemm).unwrap_or_else(|| panic!("not a GEMM:\n{gemm}"));
    let patch = view.b.patch.unwrap_or_else(|| panic!("B is not read as patches:\n{gemm}"));
    assert_eq!(patch.ranges.len(), 2, "one range per padded dim:\n{gemm}");
    assert_eq!(gemm.inputs[view.b.buf].len, 2 * 8 * 12 * 12, "B reads the unpadded input:\n{gemm}");

    // At stride 1 the input's gradient is a convolution of the output's gradient: one GEMM reading its patches in
    // place (with the padding folded in where asked), no patches' gradient stored.
    let xg = x.detach().requires_grad();
    let dy = rand(&[2, 16, 12, 12]);
    let grads = conv2d(&xg, &w, None, &same).mul(&dy).sum_all().backward().unwrap();
    let dx = grads.get(&xg).unwrap();
    let cap = kiln::capture(&[dx]).expect("capture");
    let plan = schedule_with(&cap.graph, ScheduleOptions { patched_pad: true, ..patched });
    let names: Vec<&String> = plan.launches.iter().map(|l| &l.kernel.name).collect();
    assert!(!stored(&plan), "{names:?}");
    let gemm = &plan.launches.last().unwrap().kernel;
    let view = kiln_jit::kernel::gemm::GemmView::of_patched(gemm).unwrap_or_else(|| panic!("not a GEMM:\n{gemm}"));
    assert!(view.b.patch.is_some_and(|p| p.ranges.len() == 2), "B is not the padded patches of dy:\n{gemm}");
    kernels(dx);

    // The windows' own gradient (an unfold's, a strided convolution's input gradient) adds each tap's gradient
    // back in one kernel of 9 reads without divisions.
    let xp = xg.pad(&[(1, 1), (1, 1)], 0.0);
    let windows = xp.unfold(2, 3, 1).unfold(3, 3, 1);
    let grads = windows.mul(rand(windows.dims())).sum_all().backward().unwrap();
    let dx = grads.get(&xg).unwrap();
    let cap = kiln::capture(&[dx]).expect("capture");
    let plan = schedule(&cap.graph);
    let last = &plan.launches.last().unwrap().kernel;
    fn divides(e: &IExpr) -> bool {
        match e {
            IExpr::Div(..) | IExpr::Mod(..) | IExpr::Wrap(..) => true,
            IExpr::Add(ts) => ts.iter().any(divides),
            IExpr::Mul(x, _) => divides(x),
            IExpr::Var(_) | IExpr::Const(_) => false,
        }
    }
    let loads = last.outer.iter().filter(|i| matches!(i.op, kiln_jit::kernel::InstOp::Load { .. })).count();
    assert_eq!(loads, 9, "one load per window tap:\n{last}");
    assert!(!last.outer.iter().flat_map(|i| i.indices()).any(divides), "an index divides:\n{last}");
    kernels(dx);
}

/// Rule 8: a gradient norm over 60 parameters (one sum of 60 stored norms, as `clip_grad_norm` builds it) or a sum
/// of 60 inputs is cut into kernels reading at most `MAX_KERNEL_INPUTS` buffers each (a wgpu adapter binds 31 or
/// 32 on Vulkan and Metal), or the smaller budget a backend asks for (13 on an OpenGL adapter's 16 bindings), and
/// still computes the interpreter's value.
#[test]
fn no_kernel_reads_more_buffers_than_its_budget() {
    let xs: Vec<Tensor> = (0..60).map(|i| rand(&[3 + i % 4, 5])).collect();
    kiln::realize(&xs.iter().collect::<Vec<_>>()).unwrap();
    let norms: Vec<Tensor> = xs.iter().map(|x| x.square().sum_all().sqrt()).collect();
    let refs: Vec<&Tensor> = norms.iter().collect();
    let total = Tensor::stack(&refs, 0).square().sum_all().sqrt();
    let sum = xs.iter().skip(1).fold(xs[0].narrow(0, 0, 3), |acc, x| acc.add(x.narrow(0, 0, 3)));
    for t in [&total, &sum] {
        kernels(t);
        let cap = kiln::capture(&[t]).expect("capture");
        for budget in [kiln_jit::kernel::schedule::MAX_KERNEL_INPUTS, 13, 5] {
            let opts = kiln_jit::kernel::ScheduleOptions { max_inputs: budget, ..Default::default() };
            let plan = kiln_jit::kernel::schedule_with(&cap.graph, opts);
            let widest = plan.launches.iter().map(|l| l.inputs.len()).max().unwrap_or(0);
            assert!(widest <= budget, "a kernel reads {widest} buffers, over a budget of {budget}");
            assert!(widest > budget / 2, "cut more than the budget asks: {widest} of {budget}");
            check_plan(&cap, &plan);
        }
    }
}

/// A kernel that reads no buffer and draws no random numbers (a causal mask) computes the same values on every
/// run: the schedule gives it an arena slot no other value shares, so the CPU runs it in a plan's first run only,
/// and later runs (new inputs, the same plan) read what it left there, with the plan's other temps written around
/// it on every run.
#[test]
fn a_constant_kernel_keeps_its_slot_from_run_to_run() {
    let mask = || {
        let keep = Tensor::ones([8, 8], DType::F32, &Device::cpu()).tril(0).gt(0);
        keep.where_(0.0, f64::NEG_INFINITY)
    };
    // Temps before and after the mask, so that a shared slot would be written over.
    let step = |x: &Tensor| ((x.exp() * 0.5).sin() + mask()).softmax(-1).sum([0], false).cos();
    let x = rand(&[4, 8, 8]);
    kiln::realize(&[&x]).unwrap();
    let cap = kiln::capture(&[&step(&x)]).expect("capture");
    let plan = schedule(&cap.graph);
    let constants: Vec<usize> = (0..plan.launches.len()).filter(|&i| plan.constant(i)).collect();
    assert_eq!(constants.len(), 1, "{:?}", plan.launches.iter().map(|l| &l.kernel.name).collect::<Vec<_>>());
    let own = plan.launches[constants[0]].output;
    for (i, l) in plan.launches.iter().enumerate() {
        assert!(i == constants[0] || l.output != own, "launch {i} ({}) writes the constant's slot", l.kernel.name);
    }
    for seed in 0..4 {
        let x = &rand(&[4, 8, 8]) * (1.0 + seed as f64);
        kiln::realize(&[&x]).unwrap();
        let y = step(&x);
        let want = kiln::capture(&[&y]).unwrap().reference().unwrap().remove(0);
        if let Err(e) = common::compare(&y.to_host().unwrap(), &want, tol(DType::F32, Kind::Accumulate)) {
            panic!("run {seed}: {e}");
        }
    }
}

/// The CPU runs a constant kernel in a plan's first run only: in a child process with `KILN_PROFILE=1`, four runs of
/// one plan launch the causal mask's kernel once and the kernels around it four times.
#[test]
fn a_constant_kernel_runs_once_per_plan() {
    if std::env::var_os("KILN_PROFILE").is_none_or(|v| v == "0") {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_constant_kernel_runs_once_per_plan", "--test-threads=1"])
            .env("KILN_PROFILE", "1")
            .env("KILN_CACHE_DIR", "off")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("1 passed"), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let mask = Tensor::ones([8, 8], DType::F32, &Device::cpu()).tril(0).gt(0).where_(0.0, f64::NEG_INFINITY);
    for _ in 0..4 {
        let x = rand(&[4, 8, 8]);
        kiln::realize(&[&x]).unwrap();
        (&(&x.exp() + &mask).softmax(-1) * 2.0).to_host().unwrap();
    }
    // `total ms | launches | mean µs | device | kernel`, one line per kernel: (kernel, launches).
    let report = kiln::profile_report();
    let rows: Vec<(&str, u64)> = report
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            Some((*f.get(4)?, f.get(1)?.parse().ok()?))
        })
        .collect();
    let (masks, others): (Vec<&(&str, u64)>, Vec<_>) = rows.iter().partition(|(k, _)| k.starts_with("E_iota"));
    assert_eq!(masks.iter().map(|r| r.1).collect::<Vec<_>>(), [1], "{report}");
    assert!(others.len() > 2 && others.iter().all(|r| r.1 == 4), "{report}");
}

/// Rule 5 moves a replacement of an input (a parameter's update) only as late as the last other kernel reading
/// what it replaces, not to the end of the plan: in two parameters' AdamW-like updates (two moments, then the
/// parameter from them, each written over its input), each parameter's update stays next to its moments (which it
/// reads from cache), where all the parameters' updates had run after every moment. A parameter that a later
/// kernel still reads (a loss recorded after the update) is updated after that kernel.
#[test]
fn a_parameter_update_runs_after_the_last_reader_of_the_parameter_and_no_later() {
    let t = |r: usize| rand(&[r, 16]);
    let (pa, ma, va, ga, pb, mb, vb, gb) = (t(8), t(8), t(8), t(8), t(4), t(4), t(4), t(4));
    kiln::realize(&[&pa, &ma, &va, &ga, &pb, &mb, &vb, &gb]).unwrap();
    let update = |p: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor| {
        let m2 = m * 0.9 + g * 0.1;
        let v2 = v * 0.99 + g * g * 0.01;
        let p2 = p - &m2 / (v2.sqrt() + 1e-8) * 0.01;
        (m2, v2, p2)
    };
    let (ma2, va2, pa2) = update(&pa, &ma, &va, &ga);
    let (mb2, vb2, pb2) = update(&pb, &mb, &vb, &gb);
    let names = kernels_of(&[&ma2, &va2, &pa2, &mb2, &vb2, &pb2]);
    assert_eq!(names.len(), 6, "{names:?}");
    let shape_of = |n: &String| n.rsplit('_').next().unwrap().to_string();
    let shapes: Vec<String> = names.iter().map(shape_of).collect();
    // Each parameter's three kernels together, its update (the one with the square root) last.
    assert!(shapes[..3].iter().all(|s| *s == shapes[0]) && shapes[3..].iter().all(|s| *s == shapes[3]), "{names:?}");
    assert!(names[2].contains("sqrt") && names[5].contains("sqrt"), "{names:?}");
    // A later reader of `pa` (recorded after its update) runs before the update overwrites it.
    let read_late = (&pa * 2.0).sum_all();
    let names = kernels_of(&[&ma2, &va2, &pa2, &mb2, &vb2, &pb2, &read_late]);
    let at = |f: &dyn Fn(&String) -> bool| names.iter().position(f).unwrap();
    assert!(at(&|n| n.starts_with("R_")) < at(&|n| n.contains("sqrt") && n.ends_with("_8x16")), "{names:?}");
}
