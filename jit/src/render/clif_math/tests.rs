//! JIT-compiles `dst[i] = f(src[i])` loops with each emitter and compares against Rust's `f64` functions.
//!
//! Run the exhaustive `f32` check and the micro-benchmark by hand:
//! `cargo test -p kiln-jit --release clif_math -- --ignored --nocapture`. With `CLIF_MATH_DISASM` set in the
//! environment every compiled test kernel's machine code is printed.

use super::*;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, UserFuncName};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};

type Emit = fn(&mut FunctionBuilder, Value, Type) -> Value;
/// `(src, dst, len_in_bytes)`; the length is a multiple of the vector size.
type KernelFn = unsafe extern "C" fn(*const u8, *mut u8, usize);

struct Kernel {
    module: Option<JITModule>,
    f: KernelFn,
    ty: Type,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: `self.f` is the only pointer into the module's code and dies with `self`.
            unsafe { m.free_memory() };
        }
    }
}

impl Kernel {
    fn new(emit: Emit, ty: Type) -> Kernel {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").unwrap();
        flags.set("is_pic", "false").unwrap();
        let isa = cranelift_native::builder().unwrap().finish(settings::Flags::new(flags)).unwrap();
        let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let ptr = module.target_config().pointer_type();
        let mut sig = module.make_signature();
        sig.params.extend([AbiParam::new(ptr); 3]);
        let id = module.declare_function("kernel", Linkage::Local, &sig).unwrap();
        let mut ctx = module.make_context();
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let (entry, body, exit) = (b.create_block(), b.create_block(), b.create_block());
        b.append_block_params_for_function_params(entry);
        b.append_block_param(body, ptr);
        b.switch_to_block(entry);
        let (src, dst, len) = (b.block_params(entry)[0], b.block_params(entry)[1], b.block_params(entry)[2]);
        let zero = b.ins().iconst(ptr, 0);
        let nonempty = b.ins().icmp_imm_u(IntCC::NotEqual, len, 0);
        b.ins().brif(nonempty, body, &[zero.into()], exit, &[]);
        b.switch_to_block(body);
        let off = b.block_params(body)[0];
        let sa = b.ins().iadd(src, off);
        let da = b.ins().iadd(dst, off);
        let mf = MemFlagsData::new().with_notrap();
        let x = b.ins().load(ty, mf, sa, 0);
        let y = emit(&mut b, x, ty);
        b.ins().store(mf, y, da, 0);
        let next = b.ins().iadd_imm_u(off, i64::from(ty.bytes()));
        let more = b.ins().icmp(IntCC::UnsignedLessThan, next, len);
        b.ins().brif(more, body, &[next.into()], exit, &[]);
        b.switch_to_block(exit);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
        if std::env::var_os("CLIF_MATH_DISASM").is_some() {
            ctx.set_disasm(true);
        }
        module.define_function(id, &mut ctx).unwrap();
        if let Some(vcode) = ctx.compiled_code().and_then(|c| c.vcode.as_ref()) {
            eprintln!("{vcode}");
        }
        module.finalize_definitions().unwrap();
        let code = module.get_finalized_function(id);
        // SAFETY: `code` is the finalized entry of a function compiled with exactly this signature (three
        // pointer-sized integer arguments, no results) in the host's default calling convention.
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        Kernel { module: Some(module), f, ty }
    }

    /// Applies the kernel to `xs` (any length; padded to whole vectors).
    fn run<T: Copy + Default>(&self, xs: &[T]) -> Vec<T> {
        let lanes = self.ty.lane_count() as usize;
        let n = xs.len().div_ceil(lanes) * lanes;
        let mut src = xs.to_vec();
        src.resize(n, T::default());
        let mut dst = vec![T::default(); n];
        self.run_into(&src, &mut dst);
        dst.truncate(xs.len());
        dst
    }

    /// `dst[i] = f(src[i])`; the length must be a whole number of vectors.
    fn run_into<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        assert_eq!(std::mem::size_of::<T>() as u32, self.ty.lane_bits() / 8);
        assert_eq!(src.len(), dst.len());
        assert_eq!(src.len() % self.ty.lane_count() as usize, 0);
        // SAFETY: src and dst hold len elements of the kernel's lane type, len is a multiple of the lane count,
        // and the kernel reads exactly src[..len] and writes exactly dst[..len], with unaligned loads/stores.
        unsafe { (self.f)(src.as_ptr().cast(), dst.as_mut_ptr().cast(), std::mem::size_of_val(src)) };
    }
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn ord32(x: f32) -> i64 {
    let b = x.to_bits() as i32;
    if b < 0 { i64::from(i32::MIN) - i64::from(b) } else { i64::from(b) }
}

fn ord64(x: f64) -> i128 {
    let b = x.to_bits() as i64;
    if b < 0 { i128::from(i64::MIN) - i128::from(b) } else { i128::from(b) }
}

/// ULPs between `got` and `want`; NaN only matches NaN.
fn ulp32(got: f32, want: f32) -> u64 {
    match (got.is_nan(), want.is_nan()) {
        (true, true) => 0,
        (false, false) => (ord32(got) - ord32(want)).unsigned_abs(),
        _ => u64::MAX,
    }
}

fn ulp64(got: f64, want: f64) -> u64 {
    match (got.is_nan(), want.is_nan()) {
        (true, true) => 0,
        (false, false) => u64::try_from((ord64(got) - ord64(want)).unsigned_abs()).unwrap_or(u64::MAX),
        _ => u64::MAX,
    }
}

struct Case {
    name: &'static str,
    emit: Emit,
    reference: fn(f64) -> f64,
    /// The documented f32 bound, which the exhaustive test checks.
    bound32: u64,
}

const EXP: Case = Case { name: "exp", emit: exp, reference: f64::exp, bound32: 1 };
const LOG: Case = Case { name: "log", emit: log, reference: f64::ln, bound32: 1 };
const SIN: Case = Case { name: "sin", emit: sin, reference: f64::sin, bound32: 3 };
const COS: Case = Case { name: "cos", emit: cos, reference: f64::cos, bound32: 3 };
const TANH: Case = Case { name: "tanh", emit: tanh, reference: f64::tanh, bound32: 1 };
// The f32 FMA forms of sin/cos are a different algorithm (pi reduction, one polynomial); their special values
// and range behaviour are checked like the plain forms'.
const SIN_FMA: Case = Case { name: "sin/fma", emit: sin_fma, reference: f64::sin, bound32: 2 };
const COS_FMA: Case = Case { name: "cos/fma", emit: cos_fma, reference: f64::cos, bound32: 2 };

// The FMA forms (`emit(.., fma: true)`), which the CPU backend uses on hosts with FMA.
fn exp_fma(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    emit(MathFn::Exp, b, x, ty, true)
}
fn log_fma(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    emit(MathFn::Log, b, x, ty, true)
}
fn sin_fma(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    emit(MathFn::Sin, b, x, ty, true)
}
fn cos_fma(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    emit(MathFn::Cos, b, x, ty, true)
}
fn tanh_fma(b: &mut FunctionBuilder, x: Value, ty: Type) -> Value {
    emit(MathFn::Tanh, b, x, ty, true)
}

/// The FMA forms keep the documented bounds (sampled, not exhaustive).
#[test]
fn clif_math_fma_forms() {
    let cases = [
        Case { name: "exp/fma", emit: exp_fma, reference: f64::exp, bound32: 1 },
        Case { name: "log/fma", emit: log_fma, reference: f64::ln, bound32: 1 },
        SIN_FMA,
        COS_FMA,
        Case { name: "tanh/fma", emit: tanh_fma, reference: f64::tanh, bound32: 1 },
    ];
    let ranges = [(-104.0, 89.0), (1e-30, 1e30), (-F32_TRIG_MAX_ARG, F32_TRIG_MAX_ARG), (-4.0, 4.0), (-10.0, 10.0)];
    for (i, (case, (lo, hi))) in cases.iter().zip(ranges).enumerate() {
        check32(case, "sampled", &uniform32(40 + i as u64, N / 2, lo, hi), case.bound32);
        check64(case, "sampled", &uniform64(50 + i as u64, N / 4, lo, hi), if i == 4 { 2 } else { 1 });
    }
    check32(&cases[2], "near multiples of pi/2", &hard_trig32(), 2);
    check32(&cases[3], "near multiples of pi/2", &hard_trig32(), 2);
}
const ALL: [Case; 5] = [EXP, LOG, SIN, COS, TANH];

/// Runs `case` over `xs` as f32x4 and as scalar f32 (which must agree bit for bit) and returns the max error in
/// ULPs and an input where it occurs.
fn sweep32(case: &Case, xs: &[f32]) -> (u64, f32) {
    let v = Kernel::new(case.emit, types::F32X4).run(xs);
    let s = Kernel::new(case.emit, types::F32).run(xs);
    let mut worst = (0, 0.0);
    for ((&x, &gv), &gs) in xs.iter().zip(&v).zip(&s) {
        assert!(
            gv.to_bits() == gs.to_bits() || (gv.is_nan() && gs.is_nan()),
            "{}({x:e}): vector {gv:e} scalar {gs:e}",
            case.name
        );
        let u = ulp32(gv, (case.reference)(f64::from(x)) as f32);
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

fn sweep64(case: &Case, xs: &[f64]) -> (u64, f64) {
    let v = Kernel::new(case.emit, types::F64X2).run(xs);
    let s = Kernel::new(case.emit, types::F64).run(xs);
    let mut worst = (0, 0.0);
    for ((&x, &gv), &gs) in xs.iter().zip(&v).zip(&s) {
        assert!(
            gv.to_bits() == gs.to_bits() || (gv.is_nan() && gs.is_nan()),
            "{}({x:e}): vector {gv:e} scalar {gs:e}",
            case.name
        );
        let u = ulp64(gv, (case.reference)(x));
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

fn check32(case: &Case, what: &str, xs: &[f32], bound: u64) {
    let (u, x) = sweep32(case, xs);
    eprintln!("{} f32 {what}: max {u} ulp at {x:e}", case.name);
    assert!(u <= bound, "{} f32 {what}: {u} ulp at x = {x:e} (bits {:#010x}), bound {bound}", case.name, x.to_bits());
}

fn check64(case: &Case, what: &str, xs: &[f64], bound: u64) {
    let (u, x) = sweep64(case, xs);
    eprintln!("{} f64 {what}: max {u} ulp at {x:e}", case.name);
    assert!(u <= bound, "{} f64 {what}: {u} ulp at x = {x:e} (bits {:#018x}), bound {bound}", case.name, x.to_bits());
}

const N: usize = 1 << 20;

fn uniform32(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.uniform(lo, hi) as f32).collect()
}

fn uniform64(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.uniform(lo, hi)).collect()
}

/// Random bit patterns of finite floats with |x| <= max (so every binade is hit about equally often).
fn bits32(seed: u64, n: usize, max: f32, signed: bool) -> Vec<f32> {
    let mut r = Rng(seed);
    let top = u64::from(max.to_bits()) + 1;
    (0..n)
        .map(|_| {
            let x = f32::from_bits((r.next() % top) as u32);
            if signed && r.next() & 1 == 1 { -x } else { x }
        })
        .collect()
}

fn bits64(seed: u64, n: usize, max: f64, signed: bool) -> Vec<f64> {
    let mut r = Rng(seed);
    let top = max.to_bits() + 1;
    (0..n)
        .map(|_| {
            let x = f64::from_bits(r.next() % top);
            if signed && r.next() & 1 == 1 { -x } else { x }
        })
        .collect()
}

/// f32 inputs within a few ULPs of a multiple of pi/2 (found by exhaustive search over [1, 51471]), both signs.
fn hard_trig32() -> Vec<f32> {
    let centers = [
        0x437c_e5f1_u32,
        0x43fc_e5f1,
        0x4096_cbe4,
        0x447c_e5f1,
        0x4116_cbe4,
        0x44fc_e5f1,
        0x4162_31d6,
        0x3fc9_0fdb,
        0x4196_cbe4,
        0x450b_e628,
        0x41bc_7edd,
        0x457c_e5f1,
        0x41e2_31d6,
        0x3fc9_0fda,
        0x4049_0fdb,
        0x4357_32f8,
    ];
    let mut xs = Vec::new();
    for c in centers {
        for d in 0..5 {
            let x = f32::from_bits(c + d - 2);
            xs.extend([x, -x]);
        }
    }
    xs
}

#[test]
fn clif_math_exp() {
    check32(&EXP, "[-104, 89]", &uniform32(1, N, -104.0, 89.0), 1);
    check32(&EXP, "[-1, 1]", &uniform32(2, N / 4, -1.0, 1.0), 1);
    check32(&EXP, "|x| < 1 bit patterns", &bits32(3, N / 4, 1.0, true), 1);
    check64(&EXP, "[-746, 710]", &uniform64(4, N, -746.0, 710.0), 1);
    check64(&EXP, "[-1, 1]", &uniform64(5, N / 4, -1.0, 1.0), 1);
    check64(&EXP, "|x| < 1 bit patterns", &bits64(6, N / 4, 1.0, true), 1);
}

#[test]
fn clif_math_log() {
    check32(&LOG, "all positive bit patterns", &bits32(11, N, f32::MAX, false), 1);
    check32(&LOG, "[0.5, 2]", &uniform32(12, N / 4, 0.5, 2.0), 1);
    check64(&LOG, "all positive bit patterns", &bits64(13, N, f64::MAX, false), 1);
    check64(&LOG, "[0.5, 2]", &uniform64(14, N / 4, 0.5, 2.0), 1);
}

#[test]
fn clif_math_sin_cos() {
    let hard = hard_trig32();
    for case in [&SIN, &COS] {
        check32(case, "[-51471, 51471]", &uniform32(21, N, -F32_TRIG_MAX_ARG, F32_TRIG_MAX_ARG), 3);
        check32(case, "[-4, 4]", &uniform32(22, N / 4, -4.0, 4.0), 3);
        check32(case, "|x| < 51471 bit patterns", &bits32(23, N / 4, F32_TRIG_MAX_ARG as f32, true), 3);
        check32(case, "near multiples of pi/2", &hard, 3);
        check64(case, "[-1.6e6, 1.6e6]", &uniform64(24, N, -F64_TRIG_MAX_ARG, F64_TRIG_MAX_ARG), 1);
        check64(case, "[-4, 4]", &uniform64(25, N / 4, -4.0, 4.0), 1);
        check64(case, "|x| < 1.6e6 bit patterns", &bits64(26, N / 4, F64_TRIG_MAX_ARG, true), 1);
    }
}

#[test]
fn clif_math_tanh() {
    check32(&TANH, "[-10, 10]", &uniform32(31, N, -10.0, 10.0), 1);
    check32(&TANH, "[-1, 1]", &uniform32(32, N / 4, -1.0, 1.0), 1);
    check32(&TANH, "all bit patterns", &bits32(33, N / 4, f32::MAX, true), 1);
    check64(&TANH, "[-20, 20]", &uniform64(34, N, -20.0, 20.0), 2);
    check64(&TANH, "[-1, 1]", &uniform64(35, N / 4, -1.0, 1.0), 2);
    check64(&TANH, "all bit patterns", &bits64(36, N / 4, f64::MAX, true), 2);
}

/// Exact expectations (bit-for-bit, NaN as "any NaN") on special inputs, for all four types.
#[test]
fn clif_math_special_values() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let tiny32 = f64::from(f32::from_bits(1)); // smallest f32 subnormal
    let tiny64 = f64::from_bits(1);
    #[rustfmt::skip]
    let cases: [(&Case, &[(f64, f64)]); 7] = [
        (&EXP, &[(0.0, 1.0), (-0.0, 1.0), (inf, inf), (-inf, 0.0), (nan, nan), (1000.0, inf), (-1000.0, 0.0)]),
        (&LOG, &[(1.0, 0.0), (0.0, -inf), (-0.0, -inf), (inf, inf), (-inf, nan), (-1.0, nan), (nan, nan)]),
        (&SIN, &[(0.0, 0.0), (-0.0, -0.0), (inf, nan), (-inf, nan), (nan, nan)]),
        (&COS, &[(0.0, 1.0), (-0.0, 1.0), (inf, nan), (-inf, nan), (nan, nan)]),
        (&SIN_FMA, &[(0.0, 0.0), (-0.0, -0.0), (inf, nan), (-inf, nan), (nan, nan)]),
        (&COS_FMA, &[(0.0, 1.0), (-0.0, 1.0), (inf, nan), (-inf, nan), (nan, nan)]),
        (&TANH, &[(0.0, 0.0), (-0.0, -0.0), (inf, 1.0), (-inf, -1.0), (nan, nan), (30.0, 1.0), (-30.0, -1.0)]),
    ];
    for (case, pairs) in cases {
        let xs32: Vec<f32> = pairs.iter().map(|p| p.0 as f32).collect();
        let xs64: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        for ty in [types::F32X4, types::F32] {
            let got = Kernel::new(case.emit, ty).run(&xs32);
            for (&(x, want), g) in pairs.iter().zip(got) {
                let want = want as f32;
                let ok = if want.is_nan() { g.is_nan() } else { g.to_bits() == want.to_bits() };
                assert!(ok, "{}({x}) as {ty}: got {g:e}, want {want:e}", case.name);
            }
        }
        for ty in [types::F64X2, types::F64] {
            let got = Kernel::new(case.emit, ty).run(&xs64);
            for (&(x, want), g) in pairs.iter().zip(got) {
                let ok = if want.is_nan() { g.is_nan() } else { g.to_bits() == want.to_bits() };
                assert!(ok, "{}({x}) as {ty}: got {g:e}, want {want:e}", case.name);
            }
        }
    }
    // Subnormal inputs and outputs.
    check32(&LOG, "subnormals", &[tiny32 as f32, 1e-40, 3e-39, f32::MIN_POSITIVE], 1);
    check64(&LOG, "subnormals", &[tiny64, 1e-310, 3e-320, f64::MIN_POSITIVE], 1);
    check32(&EXP, "subnormal results", &uniform32(41, 4096, -103.9, -87.0), 1);
    check64(&EXP, "subnormal results", &uniform64(42, 4096, -745.1, -708.0), 1);
    for case in [&SIN, &SIN_FMA, &TANH] {
        check32(case, "subnormals", &[tiny32 as f32, -1e-40, 1e-30, -1e-20], 0);
        check64(case, "subnormals", &[tiny64, -1e-310, 1e-200, -1e-100], 0);
    }
    // Far beyond the accurate range sin/cos are inaccurate but stay in [-1, 1].
    for case in [&SIN, &COS, &SIN_FMA, &COS_FMA] {
        let xs = bits32(43, 1 << 14, f32::MAX, true);
        let ys = Kernel::new(case.emit, types::F32X4).run(&xs);
        if let Some((x, y)) = xs.iter().zip(&ys).find(|(_, y)| y.abs() > 1.0 || y.is_nan()) {
            panic!("{}({x:e}) = {y:e}, outside [-1, 1]", case.name);
        }
        let xs = bits64(44, 1 << 14, f64::MAX, true);
        assert!(Kernel::new(case.emit, types::F64X2).run(&xs).iter().all(|y| y.abs() <= 1.0), "{}", case.name);
    }
}

#[test]
#[should_panic(expected = "unsupported type")]
fn clif_math_rejects_other_types() {
    Kernel::new(exp, types::F32X8);
}

/// Every f32 in each function's documented range (both signs), on all cores; prints the max error. Release mode:
/// about 7 minutes in all on 2 cores.
#[test]
#[ignore]
fn clif_math_exhaustive_f32() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    // KILN_EXHAUSTIVE=sin/fma,cos/fma runs only those cases.
    let only = std::env::var("KILN_EXHAUSTIVE").ok();
    for case in ALL.iter().chain([&SIN_FMA, &COS_FMA]) {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|n| n == case.name)) {
            continue;
        }
        let trig = case.name.starts_with("sin") || case.name.starts_with("cos");
        let max_bits = if trig { (F32_TRIG_MAX_ARG as f32).to_bits() } else { 0x7f80_0000 };
        let results: Vec<(u64, f32)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let k = Kernel::new(case.emit, types::F32X4);
                        let mut worst = (0u64, 0f32);
                        let chunk = 1u32 << 20;
                        let mut start = t * chunk;
                        while start <= max_bits {
                            let end = start.saturating_add(chunk - 1).min(max_bits);
                            let xs: Vec<f32> =
                                (start..=end).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]).collect();
                            for (&x, g) in xs.iter().zip(k.run(&xs)) {
                                let u = ulp32(g, (case.reference)(f64::from(x)) as f32);
                                if u > worst.0 {
                                    worst = (u, x);
                                }
                            }
                            start = match start.checked_add(threads * chunk) {
                                Some(s) => s,
                                None => break,
                            };
                        }
                        worst
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let worst = results.into_iter().max_by_key(|w| w.0).unwrap();
        eprintln!(
            "{} f32 exhaustive (|x| <= {:e}): max {} ulp at {:e}",
            case.name,
            f32::from_bits(max_bits),
            worst.0,
            worst.1
        );
        assert!(
            worst.0 <= case.bound32,
            "{}: {} ulp at {:e}, documented {}",
            case.name,
            worst.0,
            worst.1,
            case.bound32
        );
    }
}

/// Elements per second for each function and type (in-cache buffers, no allocation in the timed loop), next to
/// Rust's scalar std functions on the same data.
#[test]
#[ignore]
fn clif_math_bench() {
    let n = 1 << 14;
    let reps = 2000;
    let xs32 = uniform32(51, n, 0.1, 10.0);
    let xs64 = uniform64(52, n, 0.1, 10.0);
    let (mut out32, mut out64) = (vec![0f32; n], vec![0f64; n]);
    let rate = |f: &mut dyn FnMut()| {
        f();
        let t = std::time::Instant::now();
        for _ in 0..reps {
            f();
        }
        (n * reps) as f64 / t.elapsed().as_secs_f64() / 1e6
    };
    for case in ALL.iter().chain([&SIN_FMA, &COS_FMA]) {
        let mut line = format!("{:>5}:", case.name);
        for ty in [types::F32X4, types::F32, types::F64X2, types::F64] {
            let k = Kernel::new(case.emit, ty);
            let r = if ty.lane_type() == types::F32 {
                rate(&mut || k.run_into(std::hint::black_box(&xs32), &mut out32))
            } else {
                rate(&mut || k.run_into(std::hint::black_box(&xs64), &mut out64))
            };
            line += &format!("  {ty} {r:7.1}");
        }
        let std32: fn(f32) -> f32 = match case.name {
            "exp" => f32::exp,
            "log" => f32::ln,
            "sin" | "sin/fma" => f32::sin,
            "cos" | "cos/fma" => f32::cos,
            _ => f32::tanh,
        };
        let r = rate(&mut || {
            for (o, &x) in out32.iter_mut().zip(std::hint::black_box(&xs32)) {
                *o = std32(x);
            }
        });
        line += &format!("  std-f32 {r:7.1}");
        let r = rate(&mut || {
            for (o, &x) in out64.iter_mut().zip(std::hint::black_box(&xs64)) {
                *o = (case.reference)(x);
            }
        });
        line += &format!("  std-f64 {r:7.1}  (M elements/s)");
        eprintln!("{line}");
    }
}
