//! Shared helpers for kiln's integration tests: the devices every test body runs on, the tolerance for each dtype
//! (written here and nowhere else), comparison of results against expected values, deterministic test data, and
//! `Nd`, a naive n-d array for computing expected values in plain Rust.
//!
//! Every test crate that says `mod common;` compiles its own copy and uses a subset of it, hence `dead_code`.
#![allow(dead_code)]

use kiln::{DType, Device, HostBuffer, Tensor, f16};

/// Every device the device-generic test bodies run on: those this build has (cargo features `cpu`, `wgpu`). Adding
/// a backend is one line here. A backend that is missing must not make a test pass by skipping: CI says which
/// backends are required, and a missing required one fails there.
pub fn devices() -> Vec<Device> {
    let mut v = Vec::new();
    #[cfg(feature = "cpu")]
    v.push(Device::cpu());
    v.extend(wgpu_device());
    v.extend(cuda_device());
    v.extend(hip_device());
    v
}

/// CUDA device 0 if this build has the `cuda` feature and this machine a GPU, its driver and NVRTC. Without them: a
/// panic when `KILN_REQUIRE_CUDA=1` (a GPU machine's check script sets it), else one line on stderr per test binary
/// saying what is missing, and `None`. A build without the feature has no CUDA device to test and says nothing.
pub fn cuda_device() -> Option<Device> {
    #[cfg(feature = "cuda")]
    {
        static DEV: GpuSlot = GpuSlot::new();
        DEV.get("cuda", "KILN_REQUIRE_CUDA", || Device::cuda(0))
    }
    #[cfg(not(feature = "cuda"))]
    None
}

/// HIP device 0 if this build has the `hip` feature and this machine an AMD GPU, the HIP runtime and hiprtc; as
/// `cuda_device` otherwise (`KILN_REQUIRE_HIP=1` makes its absence a panic).
pub fn hip_device() -> Option<Device> {
    #[cfg(feature = "hip")]
    {
        static DEV: GpuSlot = GpuSlot::new();
        DEV.get("hip", "KILN_REQUIRE_HIP", || Device::hip(0))
    }
    #[cfg(not(feature = "hip"))]
    None
}

/// A GPU device opened once per test binary, or why it could not be (said once).
struct GpuSlot {
    dev: std::sync::OnceLock<Result<Device, String>>,
    said: std::sync::Once,
}

impl GpuSlot {
    const fn new() -> GpuSlot {
        GpuSlot { dev: std::sync::OnceLock::new(), said: std::sync::Once::new() }
    }

    /// The device `open` gives; without it a panic when `require=1`, else a line on stderr and `None`.
    fn get(&self, name: &str, require: &str, open: impl FnOnce() -> kiln::Result<Device>) -> Option<Device> {
        match self.dev.get_or_init(|| open().map_err(|e| e.to_string())) {
            Ok(d) => Some(*d),
            Err(e) if std::env::var(require).is_ok_and(|v| v == "1") => {
                panic!("{require}=1 but the {name} device is missing: {e}")
            }
            Err(e) => {
                self.said.call_once(|| eprintln!("skipping {name}: {e}"));
                None
            }
        }
    }
}

/// The device a test makes its data on when any device will do (a graph to capture, values to move to the device
/// under test): the CPU where the build has it, else the wgpu device, `None` without an adapter (`wgpu_device` says
/// so, and fails under `KILN_REQUIRE_WGPU=1`).
pub fn data_device() -> Option<Device> {
    #[cfg(feature = "cpu")]
    return Some(Device::cpu());
    #[cfg(not(feature = "cpu"))]
    return wgpu_device();
}

/// Whether this host lacks AVX2+FMA, where kiln's generated GEMM (and with it GEMM tuning) never runs: says so on
/// stderr in the one-line form CI's log is searched for, so a test that returns early is never a silent pass.
#[cfg(feature = "cpu")]
pub fn skip_without_avx2() -> bool {
    let no = !kiln_backends::cpu::gemm::asm::host_supported();
    if no {
        eprintln!("skipping: this host has no AVX2+FMA, so kiln's generated GEMM never runs here");
    }
    no
}

/// The wgpu device if this build has it and this machine has an adapter. Without: a panic when `KILN_REQUIRE_WGPU=1`
/// (CI sets it, so a missing driver fails there), else one line on stderr per test binary saying what is missing,
/// and `None`.
pub fn wgpu_device() -> Option<Device> {
    static DEV: std::sync::OnceLock<Result<Device, String>> = std::sync::OnceLock::new();
    static SAID: std::sync::Once = std::sync::Once::new();
    match DEV.get_or_init(|| "wgpu".parse::<Device>().map_err(|e| e.to_string())) {
        Ok(d) => Some(*d),
        Err(e) if std::env::var("KILN_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("KILN_REQUIRE_WGPU=1 but the wgpu device is missing: {e}")
        }
        Err(e) if e.contains("unknown device") => {
            SAID.call_once(|| eprintln!("skipping wgpu: this build has no `wgpu` feature"));
            None
        }
        Err(_) => {
            SAID.call_once(|| eprintln!("skipping wgpu: no adapter (apt-get install mesa-vulkan-drivers libvulkan1)"));
            None
        }
    }
}

/// Whether every dtype in `dtypes` can live on `dev` (f64 and i64 cannot on wgpu: WGSL has no 64-bit types; f16
/// needs the adapter feature SHADER_F16). Test bodies skip such cases on such devices explicitly, and `errors.rs`
/// checks that trying gives a clear error. A wgpu device without f16 says so once per test binary; with
/// `KILN_REQUIRE_WGPU_F16=1` (for a machine whose GPU is known to have it) that is a failure instead.
pub fn runs_on(dev: &Device, dtypes: &[DType]) -> bool {
    if dtypes.contains(&DType::F16) && !dev.supports(DType::F16) {
        static SAID: std::sync::Once = std::sync::Once::new();
        if std::env::var("KILN_REQUIRE_WGPU_F16").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_WGPU_F16=1 but {} has no SHADER_F16", dev.describe());
        }
        SAID.call_once(|| eprintln!("skipping f16 on wgpu: {} has no SHADER_F16", dev.describe()));
    }
    dtypes.iter().all(|&d| dev.supports(d))
}

pub const ALL_DTYPES: [DType; 9] =
    [DType::Bool, DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::F32, DType::F64, DType::BF16];
pub const NON_BOOL: [DType; 8] =
    [DType::U8, DType::U32, DType::I32, DType::I64, DType::F16, DType::F32, DType::F64, DType::BF16];
pub const FLOATS: [DType; 4] = [DType::F16, DType::F32, DType::F64, DType::BF16];

// ---------------------------------------------------------------------------------------------------------------
// Tolerances
// ---------------------------------------------------------------------------------------------------------------

/// How a result is computed, which decides how far it may lie from the exact reference value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Moves, selects, compares or converts values, or is an IEEE-exact special case (sqrt(-0.0), recip(inf)):
    /// bit-exact, including the sign of zero.
    Exact,
    /// One elementwise op, or a short fixed composition of them (sigmoid, rsqrt, linspace), per element.
    Elementwise,
    /// Accumulates many terms: sum, prod, mean, matmul, softmax, log_softmax.
    Accumulate,
    /// One elementwise op whose result is small because its input is (tanh(1e-6)), not by cancellation: relative
    /// only, since `Elementwise`'s absolute term would accept any value below 1e-6.
    Relative,
    /// A factorization, solve, inverse or determinant (`kiln::linalg`) of matrices of order <= 8 whose condition
    /// number is at most 10 (the tests' matrices), or a gradient through one.
    Factorize,
}

/// `|got - want| <= abs + rel * |want|`; `Tol::EXACT` compares bits (any NaN matches any NaN).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    pub rel: f64,
    pub abs: f64,
}

impl Tol {
    pub const EXACT: Tol = Tol { rel: 0.0, abs: 0.0 };
}

/// THE tolerance table: every float comparison in the tests goes through here. Never widen a number to make a test
/// pass; find out whether kiln or the expectation is wrong. Expected values are computed in f64 from the exact input
/// values (or written by hand), then rounded once to the result dtype.
pub fn tol(dtype: DType, kind: Kind) -> Tol {
    match (dtype, kind) {
        // Ints and bool are exact for every op: wrapping is defined, and there is nothing to round.
        (d, _) if !d.is_float() => Tol::EXACT,
        (_, Kind::Exact) => Tol::EXACT,
        // f32 eps is 1.19e-7. One correctly rounded op is within 0.6e-7 relative; short compositions (sigmoid is
        // three rounded ops, rsqrt two, linspace rounds its step to f32) and a device libm's few-ulp
        // transcendentals stay within ~8 ulp = 1e-6. The abs term is for results near 0 by cancellation
        // (sin(pi), exp(-x) underflowing), where a relative bound means nothing.
        (DType::F32, Kind::Elementwise) => Tol { rel: 1e-6, abs: 1e-6 },
        // A device accumulates k f32 terms in an order the test does not fix (the reference interpreter sums in
        // f64 and rounds once, so it is exact here). Sequential summation errs by about eps/2 * sigma * k/sqrt(2)
        // for random-sign terms of size sigma, i.e. ~5e-6 absolute at the table's largest reduction (k = 64,
        // |x| <= 2); 1e-5 relative + absolute covers that. Keep reductions in the table that small.
        (DType::F32, Kind::Accumulate) => Tol { rel: 1e-5, abs: 1e-5 },
        // The same ~8 ulp as `Elementwise`, with no absolute term.
        (DType::F32, Kind::Relative) => Tol { rel: 1e-6, abs: 0.0 },
        // f64 eps is 2.2e-16: the same reasoning, with the libm's few ulp and short compositions well inside 1e-13.
        (DType::F64, Kind::Elementwise) => Tol { rel: 1e-13, abs: 1e-13 },
        (DType::F64, Kind::Accumulate) => Tol { rel: 1e-12, abs: 1e-12 },
        // The same few ulp as `Elementwise`, with no absolute term (log1p and expm1 near 0).
        (DType::F64, Kind::Relative) => Tol { rel: 1e-13, abs: 0.0 },
        // A factorization's backward error is about n * eps * |A| per step, and a solve's forward error that times
        // the condition number: n <= 8 and cond <= 10 give 80 eps, ~1e-5 in f32 (the device works in f32, the
        // reference in f64 and rounds once) on values of order 1; a determinant multiplies n such values, and a
        // gradient composes three solves: 1e-4 relative + 1e-5 absolute covers those. f64: the same 80 eps is
        // 2e-14; 1e-11 covers the compositions with room.
        (DType::F32, Kind::Factorize) => Tol { rel: 1e-4, abs: 1e-5 },
        (DType::F64, Kind::Factorize) => Tol { rel: 1e-11, abs: 1e-12 },
        // f16 has 11 significant bits: eps is 2^-10 = 9.8e-4, one rounding 2^-11 = 4.9e-4 relative. kiln computes
        // each op in f32 and rounds it to f16, which for + - * / sqrt is the correctly rounded result (f32 has
        // 2 * 11 + 2 bits), but an expected value here is computed in f64 and rounded once, while kiln rounds
        // every step of a composition (sigmoid: three roundings), and an f32 transcendental's few-ulp error can
        // move an f16 rounding by one step. Four f16 ulps, 3.9e-3, bound that; the abs term is ~1 ulp at 1.0,
        // for results near 0 by cancellation, as for f32.
        (DType::F16, Kind::Elementwise) => Tol { rel: 4e-3, abs: 1e-3 },
        // Reductions and matmuls accumulate in f32 and round once (exact to ~2^-11 then), but compositions over
        // them (mean, softmax, log_softmax) round every step and the table's sums reach |x| <= 2 * 64: 8 ulps.
        (DType::F16, Kind::Accumulate) => Tol { rel: 8e-3, abs: 8e-3 },
        // bf16 has 8 significant bits: eps is 2^-7 = 7.8e-3, one rounding 3.9e-3 relative. The same reasoning as
        // f16's: four bf16 ulps (3.1e-2) for a composition rounded at every step, the abs term ~1 ulp at 1.0.
        (DType::BF16, Kind::Elementwise) => Tol { rel: 3.2e-2, abs: 8e-3 },
        // Sums accumulate in f32 and round once; compositions over them round every step: 8 ulps, as f16's.
        (DType::BF16, Kind::Accumulate) => Tol { rel: 6.3e-2, abs: 6.3e-2 },
        (d, k) => unreachable!("no tolerance for {d} {k:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Buffers and comparison
// ---------------------------------------------------------------------------------------------------------------

/// A host buffer of `dtype` from f64 values: floats round to nearest, ints truncate toward zero and wrap (two's
/// complement, as PyTorch does for in-range int conversions), bool is `x != 0` (NaN is true).
pub fn buffer(dtype: DType, vals: &[f64]) -> HostBuffer {
    let int = |x: f64| x as i64; // exact for the integer values the tests use (|x| < 2^53)
    match dtype {
        DType::Bool => HostBuffer::Bool(vals.iter().map(|&x| x != 0.0).collect()),
        DType::U8 => HostBuffer::U8(vals.iter().map(|&x| int(x) as u8).collect()),
        DType::U32 => HostBuffer::U32(vals.iter().map(|&x| int(x) as u32).collect()),
        DType::I32 => HostBuffer::I32(vals.iter().map(|&x| int(x) as i32).collect()),
        DType::I64 => HostBuffer::I64(vals.iter().map(|&x| int(x)).collect()),
        DType::F16 => HostBuffer::F16(vals.iter().map(|&x| f16::from_f64(x)).collect()),
        DType::F32 => HostBuffer::F32(vals.iter().map(|&x| x as f32).collect()),
        DType::F64 => HostBuffer::F64(kiln_jit::HostVec::from_slice(vals)),
        DType::BF16 => HostBuffer::BF16(vals.iter().map(|&x| kiln_jit::dtype::bf16_from_f64(x)).collect()),
    }
}

/// The elements as f64 (exact for every dtype the tests build: ints stay below 2^53 unless written as i64 by hand).
pub fn values(b: &HostBuffer) -> Vec<f64> {
    match b {
        HostBuffer::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        HostBuffer::U8(v) => v.iter().map(|&x| x as f64).collect(),
        HostBuffer::U32(v) => v.iter().map(|&x| x as f64).collect(),
        HostBuffer::I32(v) => v.iter().map(|&x| x as f64).collect(),
        HostBuffer::I64(v) => v.iter().map(|&x| x as f64).collect(),
        HostBuffer::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
        HostBuffer::F32(v) => v.iter().map(|&x| x as f64).collect(),
        HostBuffer::F64(v) => v.to_vec(),
        HostBuffer::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
    }
}

fn float_bits(b: &HostBuffer) -> Option<Vec<u64>> {
    match b {
        HostBuffer::F16(v) => Some(v.iter().map(|x| x.to_bits() as u64).collect()),
        HostBuffer::BF16(v) => Some(v.iter().map(|x| x.to_bits() as u64).collect()),
        HostBuffer::F32(v) => Some(v.iter().map(|x| x.to_bits() as u64).collect()),
        HostBuffer::F64(v) => Some(v.iter().map(|x| x.to_bits()).collect()),
        _ => None,
    }
}

fn int_values(b: &HostBuffer) -> Vec<i64> {
    match b {
        HostBuffer::Bool(v) => v.iter().map(|&x| x as i64).collect(),
        HostBuffer::U8(v) => v.iter().map(|&x| x as i64).collect(),
        HostBuffer::U32(v) => v.iter().map(|&x| x as i64).collect(),
        HostBuffer::I32(v) => v.iter().map(|&x| x as i64).collect(),
        HostBuffer::I64(v) => v.to_vec(),
        HostBuffer::F16(_) | HostBuffer::F32(_) | HostBuffer::F64(_) | HostBuffer::BF16(_) => {
            unreachable!("int_values on a float buffer")
        }
    }
}

/// An f32 GEMM over `k` products of operands in [-1, 1] against the exact (f64) reference. A device sums in an
/// order of its own (K blocks, FMA, lanes), so the bound is that of recursive summation, `k * eps * sum|a_i b_i|`
/// <= `k^2 * eps` in the worst case; random signs keep the observed error near `sqrt(k) * eps * sqrt(k)`. The
/// absolute term `4 * k * eps` (about 5e-7 per product) covers that with margin for k <= 512, without admitting a
/// wrong element (a missing product is >= 1e-3 here, whatever k). Relative 1e-5 as for `Accumulate`.
pub fn gemm_tol(k: usize) -> Tol {
    Tol { rel: 1e-5, abs: 4.0 * k as f64 * f32::EPSILON as f64 }
}

/// Compares two buffers of the same dtype: ints and bool exactly, floats within `tol` (bit-exact for
/// `Tol::EXACT`). NaN matches NaN; an infinite expected value needs the same infinity.
pub fn compare(got: &HostBuffer, want: &HostBuffer, tol: Tol) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("buffer dtype {} (want {})", got.dtype(), want.dtype()));
    }
    if got.len() != want.len() {
        return Err(format!("{} elements (want {})", got.len(), want.len()));
    }
    let mut bad = Vec::new();
    if want.dtype().is_float() {
        let (g, w) = (values(got), values(want));
        let (gb, wb) = (float_bits(got).expect("float"), float_bits(want).expect("float"));
        for (i, ((&g, &w), (gb, wb))) in g.iter().zip(&w).zip(gb.iter().zip(&wb)).enumerate() {
            let ok = if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if tol == Tol::EXACT {
                gb == wb
            } else if w.is_infinite() {
                g == w
            } else {
                (g - w).abs() <= tol.abs + tol.rel * w.abs()
            };
            if !ok {
                bad.push(format!("[{i}] got {g:?}, want {w:?}"));
            }
        }
    } else {
        for (i, (g, w)) in int_values(got).into_iter().zip(int_values(want)).enumerate() {
            if g != w {
                bad.push(format!("[{i}] got {g}, want {w}"));
            }
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    let n = bad.len();
    bad.truncate(6);
    Err(format!("{n} of {} elements differ (tol {tol:?}): {}", want.len(), bad.join(", ")))
}

/// Whether `dev` computes the sign of a zero result as IEEE says. WGSL does not promise it (the spec lets an
/// implementation ignore the sign of zero, and lavapipe's LLVM compiles with no-signed-zeros: `sqrt` of a `where`
/// that selects +0.0 came back -0.0), so on wgpu a zero matches a zero of either sign; every other bit must match.
pub fn zero_sign_defined(dev: &Device) -> bool {
    match dev {
        #[cfg(feature = "cpu")]
        Device::Cpu => true,
        #[cfg(feature = "wgpu")]
        Device::Wgpu(_) => false,
        // NVRTC compiles without fast-math flags: IEEE signed zeros.
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => true,
        // hiprtc (clang) compiles without fast-math flags as well.
        #[cfg(feature = "hip")]
        Device::Hip(_) => true,
    }
}

/// `compare` for a result computed on `dev`: `got` and `want` with every -0.0 made +0.0 first where the device
/// does not define the sign of zero (`zero_sign_defined`).
pub fn compare_on(dev: &Device, got: &HostBuffer, want: &HostBuffer, tol: Tol) -> Result<(), String> {
    if zero_sign_defined(dev) {
        return compare(got, want, tol);
    }
    let unsign = |b: &HostBuffer| match b {
        HostBuffer::F16(v) => HostBuffer::F16(v.iter().map(|&x| if x == f16::ZERO { f16::ZERO } else { x }).collect()),
        HostBuffer::BF16(v) => {
            HostBuffer::BF16(v.iter().map(|&x| if x == kiln::bf16::ZERO { kiln::bf16::ZERO } else { x }).collect())
        }
        HostBuffer::F32(v) => HostBuffer::F32(v.iter().map(|&x| if x == 0.0 { 0.0 } else { x }).collect()),
        HostBuffer::F64(v) => HostBuffer::F64(v.iter().map(|&x| if x == 0.0 { 0.0 } else { x }).collect()),
        other => other.clone(),
    };
    compare(&unsign(got), &unsign(want), tol)
}

/// Checks a tensor's dtype, shape and values against an expected buffer.
pub fn check_tensor(t: &Tensor, shape: &[usize], want: &HostBuffer, kind: Kind) -> Result<(), String> {
    if t.dtype() != want.dtype() {
        return Err(format!("dtype {} (want {})", t.dtype(), want.dtype()));
    }
    if t.dims() != shape {
        return Err(format!("shape {:?} (want {shape:?})", t.dims()));
    }
    let got = t.to_host().map_err(|e| format!("realize failed: {e}"))?;
    compare_on(&t.device(), &got, want, tol(want.dtype(), kind))
}

/// `sin(0.37 i + c)` over `shape`, rounded to f32 and then to `dtype`, on `dev`: the values the fixture scripts build
/// their inputs and weights from (`tests/fixtures/fixture_values.py`).
pub fn sines(shape: &[usize], c: f64, dtype: DType, dev: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (0.37 * i as f64 + c).sin() as f32 as f64).collect();
    tensor(dtype, &v, shape).to_device(dev).unwrap()
}

/// `got` (any float dtype, on any device) against `want`, a value PyTorch computed in f32 (a fixture's), within f32's
/// accumulate tolerance (summation orders differ), panicking with `what`: an f64 run is held to PyTorch's f32 result
/// at f32's precision.
pub fn assert_close_to_torch(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let want = want.to_host().unwrap();
    if let Err(e) = check_tensor(&got.to_dtype(DType::F32), got.dims(), &want, Kind::Accumulate) {
        panic!("{what}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Deterministic data
// ---------------------------------------------------------------------------------------------------------------

/// SplitMix64: test data independent of kiln's own random stream (so tests never race on `manual_seed`).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Where test inputs are drawn from.
#[derive(Clone, Copy, Debug)]
pub enum Dom {
    /// Floats anywhere in [lo, hi); ints are the integers in [lo, hi].
    Cont(f64, f64),
    /// Multiples of 0.5 in [lo, hi] (integers for int dtypes): many ties and exact zeros, for comparisons.
    Grid(f64, f64),
}

/// `n` values of `dtype` drawn from `dom` (clipped to what the dtype holds), already rounded to `dtype`.
pub fn data(dtype: DType, n: usize, seed: u64, dom: Dom) -> Vec<f64> {
    let mut r = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ n as u64);
    let (lo, hi) = match dom {
        Dom::Cont(a, b) | Dom::Grid(a, b) => (a, b),
    };
    let (lo, hi) = match dtype {
        DType::Bool => (0.0, 1.0),
        DType::U8 => (lo.max(0.0), hi.min(255.0)),
        DType::U32 => (lo.max(0.0), hi.min(u32::MAX as f64)),
        _ => (lo, hi),
    };
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let u = r.unit();
            match (dtype.is_float(), dom) {
                (true, Dom::Cont(..)) => lo + u * (hi - lo),
                (true, Dom::Grid(..)) => {
                    let steps = ((hi - lo) * 2.0).floor();
                    lo + (u * (steps + 1.0)).floor().min(steps) * 0.5
                }
                (false, _) => {
                    let (a, b) = (lo.ceil(), hi.floor());
                    a + (u * (b - a + 1.0)).floor().min(b - a)
                }
            }
        })
        .collect();
    values(&buffer(dtype, &v))
}

// ---------------------------------------------------------------------------------------------------------------
// Nd: a naive reference array
// ---------------------------------------------------------------------------------------------------------------

/// A row-major n-d array of f64, for expected values. Deliberately naive: every op is a loop over multi-indices.
#[derive(Clone, Debug, PartialEq)]
pub struct Nd {
    pub shape: Vec<usize>,
    pub v: Vec<f64>,
}

/// Calls `f` with every multi-index of `shape` in row-major order (once for a zero-dim shape, never if empty).
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0; shape.len()];
    for _ in 0..n {
        f(&idx);
        for a in (0..shape.len()).rev() {
            idx[a] += 1;
            if idx[a] < shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
}

/// NumPy broadcasting of two shapes, or `None`.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
            let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
            match (x, y) {
                _ if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// A possibly negative dim resolved against `rank` (a zero-dim tensor's pseudo-dim is 0).
pub fn resolve(d: isize, rank: usize) -> usize {
    let r = rank.max(1) as isize;
    assert!(d >= -r && d < r, "test bug: dim {d} for rank {rank}");
    if d < 0 { (d + r) as usize } else { d as usize }
}

impl Nd {
    pub fn new(shape: &[usize], v: Vec<f64>) -> Nd {
        assert_eq!(shape.iter().product::<usize>(), v.len(), "test bug: Nd shape {shape:?}");
        Nd { shape: shape.to_vec(), v }
    }

    pub fn scalar(x: f64) -> Nd {
        Nd::new(&[], vec![x])
    }

    /// Element `i` is `f(multi-index)`.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Nd {
        let mut v = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |i| v.push(f(i)));
        Nd::new(shape, v)
    }

    pub fn numel(&self) -> usize {
        self.v.len()
    }

    pub fn flat(&self, idx: &[usize]) -> usize {
        idx.iter().zip(&self.shape).fold(0, |acc, (&i, &n)| {
            assert!(i < n, "test bug: index {idx:?} outside {:?}", self.shape);
            acc * n + i
        })
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        self.v[self.flat(idx)]
    }

    /// The element that broadcasting reads for output index `out` (dims aligned right, size-1 dims stretched).
    pub fn at_broadcast(&self, out: &[usize]) -> f64 {
        let lead = out.len() - self.shape.len();
        let idx: Vec<usize> =
            self.shape.iter().enumerate().map(|(a, &n)| if n == 1 { 0 } else { out[lead + a] }).collect();
        self.at(&idx)
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> Nd {
        Nd::new(&self.shape, self.v.iter().map(|&x| f(x)).collect())
    }

    pub fn reshape(&self, shape: &[usize]) -> Nd {
        Nd::new(shape, self.v.clone())
    }

    /// `f(a, b)` with broadcasting.
    pub fn zip(&self, other: &Nd, f: impl Fn(f64, f64) -> f64) -> Nd {
        let shape = broadcast_shape(&self.shape, &other.shape).expect("test bug: shapes do not broadcast");
        Nd::from_fn(&shape, |i| f(self.at_broadcast(i), other.at_broadcast(i)))
    }

    pub fn broadcast_to(&self, shape: &[usize]) -> Nd {
        Nd::from_fn(shape, |i| self.at_broadcast(i))
    }

    /// Folds `axes` (resolved, any order) with `f` from `init`; `keepdim` as in PyTorch.
    pub fn reduce(&self, axes: &[usize], keepdim: bool, init: f64, f: impl Fn(f64, f64) -> f64) -> Nd {
        let mut kept = self.shape.clone();
        for &a in axes {
            kept[a] = 1;
        }
        let mut acc = Nd::new(&kept, vec![init; kept.iter().product()]);
        for_each_index(&self.shape, |i| {
            let o: Vec<usize> = i.iter().enumerate().map(|(a, &j)| if axes.contains(&a) { 0 } else { j }).collect();
            let k = acc.flat(&o);
            acc.v[k] = f(acc.v[k], self.at(i));
        });
        if keepdim {
            return acc;
        }
        let dropped: Vec<usize> = kept.iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, &n)| n).collect();
        acc.reshape(&dropped)
    }

    pub fn permute(&self, perm: &[usize]) -> Nd {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        Nd::from_fn(&shape, |i| {
            let mut src = vec![0; perm.len()];
            for (o, &p) in perm.iter().enumerate() {
                src[p] = i[o];
            }
            self.at(&src)
        })
    }

    /// Python `x[.., start:end:step, ..]` on `dim` with already clamped, non-negative bounds.
    pub fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> Nd {
        let len = if end > start { (end - start).div_ceil(step) } else { 0 };
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Nd::from_fn(&shape, |i| {
            let mut src = i.to_vec();
            src[dim] = start + i[dim] * step;
            self.at(&src)
        })
    }

    pub fn flip(&self, dims: &[usize]) -> Nd {
        Nd::from_fn(&self.shape, |i| {
            let src: Vec<usize> =
                i.iter().enumerate().map(|(a, &j)| if dims.contains(&a) { self.shape[a] - 1 - j } else { j }).collect();
            self.at(&src)
        })
    }

    /// Pads dim `a` with `pads[a] = (before, after)` copies of `value`.
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Nd {
        let shape: Vec<usize> = self.shape.iter().zip(pads).map(|(n, (b, a))| n + b + a).collect();
        Nd::from_fn(&shape, |i| {
            let mut src = Vec::with_capacity(i.len());
            for (a, &j) in i.iter().enumerate() {
                match j.checked_sub(pads[a].0) {
                    Some(k) if k < self.shape[a] => src.push(k),
                    _ => return value,
                }
            }
            self.at(&src)
        })
    }

    pub fn cat(parts: &[&Nd], dim: usize) -> Nd {
        let mut shape = parts[0].shape.clone();
        shape[dim] = parts.iter().map(|p| p.shape[dim]).sum();
        Nd::from_fn(&shape, |i| {
            let mut j = i[dim];
            for p in parts {
                if j < p.shape[dim] {
                    let mut src = i.to_vec();
                    src[dim] = j;
                    return p.at(&src);
                }
                j -= p.shape[dim];
            }
            unreachable!("index past the parts")
        })
    }

    /// Batched matmul of `[.., m, k] x [.., k, n]` with broadcast batch dims (both operands at least 2-D).
    pub fn matmul(&self, other: &Nd) -> Nd {
        let (ra, rb) = (self.shape.len(), other.shape.len());
        let (m, k, n) = (self.shape[ra - 2], self.shape[ra - 1], other.shape[rb - 1]);
        assert_eq!(k, other.shape[rb - 2], "test bug: inner dims");
        let batch = broadcast_shape(&self.shape[..ra - 2], &other.shape[..rb - 2]).expect("test bug: batch dims");
        let shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
        Nd::from_fn(&shape, |i| {
            let b = &i[..i.len() - 2];
            let (r, c) = (i[i.len() - 2], i[i.len() - 1]);
            let idx = |x: &Nd, rank: usize, p: usize, q: usize| -> f64 {
                let lead = b.len() - (rank - 2);
                let mut src: Vec<usize> = x.shape[..rank - 2]
                    .iter()
                    .enumerate()
                    .map(|(a, &s)| if s == 1 { 0 } else { b[lead + a] })
                    .collect();
                src.extend([p, q]);
                x.at(&src)
            };
            (0..k).map(|p| idx(self, ra, r, p) * idx(other, rb, p, c)).sum()
        })
    }
}

/// A tensor of `dtype` holding `v` (rounded to `dtype` as `buffer` does), on `data_device()`: the CPU where the
/// build has it. A test that calls it in a build without the CPU returns early when `data_device()` is `None`.
pub fn tensor(dtype: DType, v: &[f64], shape: &[usize]) -> Tensor {
    let dev = data_device().expect("a device to hold test data (a test without one returns before it asks)");
    Tensor::from_host(buffer(dtype, v), shape.to_vec(), &dev).unwrap()
}

/// A tensor's elements as f64 (realizing it).
pub fn vals(t: &Tensor) -> Vec<f64> {
    values(&t.to_host().unwrap())
}

// ---------------------------------------------------------------------------------------------------------------
// GEMM candidates: one harness for every device's forced-configuration tests
// ---------------------------------------------------------------------------------------------------------------

/// An f32 tensor of `shape` with values in [-1, 1).
pub fn rand_f32(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    tensor(DType::F32, &data(DType::F32, n, seed, Dom::Cont(-1.0, 1.0)), shape)
}

/// Schedules `out` as a backend with a packing GEMM does (transposed operands read in place, not copied), runs the
/// launches before its last one (the GEMM) with the kernel evaluator, and calls `check(kernel, inputs, want)` with
/// the GEMM kernel, its input buffers and the interpreter's value of the whole graph. Returns what `check` returns.
pub fn with_last_gemm<R>(
    name: &str,
    out: &Tensor,
    check: impl FnOnce(&kiln_jit::kernel::KernelIr, &[&HostBuffer], &HostBuffer) -> R,
) -> R {
    with_last_launch(
        name,
        out,
        kiln_jit::kernel::ScheduleOptions { transpose_copy: false, ..Default::default() },
        |k, args, want| {
            assert!(kiln_jit::kernel::gemm::GemmView::of(k).is_some(), "{name}: not a GEMM:\n{k}");
            check(k, args, want)
        },
    )
}

/// Schedules `out` with `options`, runs the launches before its last one with the kernel evaluator, and calls
/// `check(kernel, inputs, want)` with the last kernel (which writes `out`), its input buffers and the
/// interpreter's value of the whole graph.
pub fn with_last_launch<R>(
    name: &str,
    out: &Tensor,
    options: kiln_jit::kernel::ScheduleOptions,
    check: impl FnOnce(&kiln_jit::kernel::KernelIr, &[&HostBuffer], &HostBuffer) -> R,
) -> R {
    let want = kiln::capture(&[out]).unwrap().reference().unwrap().remove(0);
    with_launch(name, out, options, |last, l| {
        assert!(!last || l.output == kiln_jit::kernel::Slot::Output(0), "{name}: the output's kernel is not last");
        last
    })
    .map(|(kernel, args, _)| check(&kernel, &args.iter().collect::<Vec<_>>(), &want))
    .unwrap_or_else(|| panic!("{name}: no launches"))
}

/// Schedules `out` with `options` and runs its launches with the kernel evaluator up to the first that `pick(is
/// the last launch, launch)` takes, which is not run: that launch's kernel, its input buffers and the graph's
/// random-number keys (to run it with).
pub fn with_launch(
    name: &str,
    out: &Tensor,
    options: kiln_jit::kernel::ScheduleOptions,
    pick: impl Fn(bool, &kiln_jit::kernel::Launch) -> bool,
) -> Option<(kiln_jit::kernel::KernelIr, Vec<HostBuffer>, Vec<kiln_jit::RngKey>)> {
    use kiln_jit::kernel::{Slot, eval, schedule_with};
    let cap = kiln::capture(&[out]).unwrap();
    let plan = schedule_with(&cap.graph, options);
    let mut temps: Vec<Option<HostBuffer>> = vec![None; plan.temps.len()];
    for (li, l) in plan.launches.iter().enumerate() {
        let args: Vec<HostBuffer> = l
            .inputs
            .iter()
            .map(|s| match *s {
                Slot::Input(i) => cap.inputs[i].clone(),
                Slot::Temp(t) => temps[t].clone().unwrap(),
                Slot::Output(_) => unreachable!("single-output test graphs"),
            })
            .collect();
        if pick(li + 1 == plan.launches.len(), l) {
            return Some((l.kernel.clone(), args, cap.rng.clone()));
        }
        let refs: Vec<&HostBuffer> = args.iter().collect();
        match l.output {
            Slot::Temp(t) => temps[t] = Some(eval::run(&l.kernel, &refs, &cap.rng)),
            _ => panic!("{name}: the output's kernel is not the last launch:\n{}", l.kernel),
        }
    }
    None
}

/// With `KILN_CHECK_GPU_C=1` or `codegen` (CI): checks for the GPUs every kernel this test binary has scheduled since
/// the last call (`kiln_backends::gpu_check`: CUDA C by NVRTC, HIP C by hiprtc) and says how many; a kernel that does
/// not compile fails the test with its source and the compiler's log. Nothing without the variable.
pub fn check_gpu_sources(what: &str) {
    match kiln_backends::gpu_check::flush() {
        Ok((0, 0)) => {}
        Ok((compiled, refused)) => eprintln!(
            "{what}: {compiled} distinct kernels so far checked as CUDA C (sm_80, sm_90) and HIP C (gfx90a, gfx1030){}; \
             {refused} launches refused (an index expression past i32)",
            if kiln_backends::gpu_check::level() == kiln_backends::gpu_check::Level::Codegen {
                ", with code generated for sm_90 and gfx90a"
            } else {
                ""
            }
        ),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The tensors of `tests/fixtures/<file>` (a safetensors file written by a script beside it) on the data device;
/// `None` where there is no device (`data_device` says why).
pub struct Fixture(Vec<(String, Tensor)>);

impl Fixture {
    pub fn load(file: &str) -> Option<Fixture> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(file);
        let host = data_device()?;
        Some(Fixture(kiln::load_safetensors(&path, &host).unwrap_or_else(|e| panic!("loading {file}: {e}"))))
    }

    /// The tensor called `name`; panics naming it when the fixture has none.
    pub fn get(&self, name: &str) -> Tensor {
        self.0.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("the fixture has no {name}")).1.clone()
    }

    /// Casts `m` to `dtype` and sets each of its parameters to the fixture's `prefix.name`, on `dev`.
    pub fn load_params(&self, m: &dyn kiln::nn::Module, prefix: &str, dtype: DType, dev: &Device) {
        m.to_dtype(dtype);
        for (name, p) in m.named_params() {
            p.set(self.get(&format!("{prefix}.{name}")).to_dtype(dtype).to_device(dev).unwrap());
        }
    }
}
