//! What the GEMM tuners of every device share to decide whether a candidate may win: deterministic data for a
//! kernel's inputs, and a check of a candidate's output against the kernel IR evaluator at sampled positions
//! (the corners, the last row and column, and a spread in between). One copy, so a device cannot quietly check
//! less than another. Also what their tuning keys share: the mode, the operand layouts, the exact dims.

use kiln_autotune::Mode;
use kiln_jit::kernel::gemm::{GemmOperand, GemmView};
use kiln_jit::kernel::{BufParam, KernelIr};
use kiln_jit::{DType, HostBuffer};
use std::sync::LazyLock;

/// `KILN_AUTOTUNE`, read once: the mode every device's GEMM search runs in (the CPU's may be overridden per backend).
pub fn env_mode() -> Mode {
    static MODE: LazyLock<Mode> = LazyLock::new(Mode::from_env);
    *MODE
}

/// A and B's layout classes for a tuning key: `mk` or `km` (A), `kn` or `nk` (B). An operand is `contiguous` when
/// its rows are (unit stride along its second index), else transposed when its columns are; any other strides are
/// tuned as if contiguous.
pub fn operand_layouts(v: &GemmView) -> (&'static str, &'static str) {
    fn class(op: &GemmOperand, contiguous: &'static str, transposed: &'static str) -> &'static str {
        if op.cols != 1 && op.rows == 1 { transposed } else { contiguous }
    }
    (class(&v.a, "mk", "km"), class(&v.b, "kn", "nk"))
}

/// The exact dims of GEMM `v` as a record's tuned dims (batch, m, n, k): the devices that tune the kernel itself.
pub fn exact_dims(v: &GemmView) -> Vec<(String, u64)> {
    let d = |n: &str, x: usize| (n.to_string(), x as u64);
    vec![d("batch", v.batch_count().max(1)), d("m", v.m), d("n", v.n), d("k", v.k)]
}

/// Deterministic data for every input of `k` (input `i` seeded with `i`).
pub fn synthetic_inputs(k: &KernelIr) -> Vec<HostBuffer> {
    k.inputs.iter().enumerate().map(|(i, b)| synthetic(b, i as u64)).collect()
}

/// Deterministic data for input `seed`: floats in [-1, 1), ints in 0..4, bools alternating. Generated straight
/// into the buffer's type (an f64 copy of every input first cost a tuning search ~10 ms of its ~45 on a 1024 x 1024
/// operand, mostly page faults of the copy).
fn synthetic(b: &BufParam, seed: u64) -> HostBuffer {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    match b.dtype {
        DType::F32 => HostBuffer::F32((0..b.len).map(|_| next() as f32).collect()),
        DType::F64 => HostBuffer::F64((0..b.len).map(|_| next()).collect()),
        d => HostBuffer::from_i64(d, &(0..b.len).map(|_| ((next() + 1.0) * 2.0) as i64).collect::<Vec<_>>()),
    }
}

/// Positions checked against the reference besides the corners.
const SPREAD_SAMPLES: usize = 40;

/// How many positions [`sample_positions`] gives for an output of `rank` dims (what a reference costs to compute).
pub fn sample_count(rank: usize) -> usize {
    (1 << rank) + SPREAD_SAMPLES
}

/// Positions checked against the reference: the corners (which cover the last row and column), and a spread in
/// between; [`sample_count`] of them.
pub fn sample_positions(extents: &[usize]) -> Vec<Vec<usize>> {
    let mut out = Vec::with_capacity(sample_count(extents.len()));
    let r = extents.len();
    let corners = 1usize << r;
    for c in 0..corners {
        out.push((0..r).map(|d| if c >> d & 1 == 1 { extents[d] - 1 } else { 0 }).collect());
    }
    let total: usize = extents.iter().product();
    let step = (total / SPREAD_SAMPLES).max(1) | 1;
    let mut flat = 7 % total.max(1);
    for _ in 0..SPREAD_SAMPLES {
        let mut rem = flat;
        let mut idx = vec![0; r];
        for d in (0..r).rev() {
            idx[d] = rem % extents[d];
            rem /= extents[d];
        }
        out.push(idx);
        flat = (flat + step) % total;
    }
    out
}

/// The kernel IR evaluator's values of GEMM kernel `k` at [`sample_positions`], computed once per tuning search
/// and compared with every candidate's output (the evaluator is slow: 44 positions of a K = 1024 reduction took
/// ~2.5 ms, which a search paid once per candidate before).
pub struct Reference {
    /// Flat output index and expected value of each sampled position.
    samples: Vec<(usize, Vec<usize>, f64)>,
    /// Absolute tolerance for this reduction length.
    abs: f64,
}

impl Reference {
    /// Evaluates `k` (reduction length `k_len`) on `inputs` at the sampled positions, the positions split over the
    /// CPU pool's threads (`for_chunks`): the interpreter takes ~80 ns per reduction step, so the 44 samples of a
    /// K = 1024 GEMM cost ~3.6 ms on one thread, and a first training step at batch 1024 verified eight keys.
    pub fn of(k: &KernelIr, k_len: usize, inputs: &[&HostBuffer]) -> Reference {
        let positions = sample_positions(&k.out_extents);
        let want = parking_lot::Mutex::new(vec![0.0; positions.len()]);
        for_chunks(positions.len(), &|s, e| {
            let got = kiln_jit::kernel::eval::run_at(k, inputs, &[], &positions[s..e]);
            want.lock()[s..e].copy_from_slice(&got);
        });
        let want = want.into_inner();
        let strides = kiln_jit::shape::contiguous_strides(&k.out_extents);
        let samples = positions
            .into_iter()
            .zip(want)
            .map(|(pos, w)| (pos.iter().zip(&strides).map(|(i, s)| i * s).sum(), pos, w))
            .collect();
        Reference { samples, abs: 8.0 * k_len as f64 * f32::EPSILON as f64 }
    }

    /// Checks `got`, a candidate's output on the same inputs (widened to f32). Tolerance: the summation-order bound
    /// of `tests/common::gemm_tol` (relative 1e-5 plus 4*k*eps), doubled because the evaluator's own f32 sum errs
    /// too, plus `rounded` relative for an output rounded to a narrower type; a wrong tile, block or epilogue is off
    /// by orders of magnitude more. NaN matches NaN.
    pub fn check(&self, got: &[f32], rounded: f64) -> Result<(), String> {
        for (flat, pos, w) in &self.samples {
            let g = got.get(*flat).copied().ok_or_else(|| format!("output has {} elements", got.len()))? as f64;
            let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= self.abs + (2e-5 + rounded) * w.abs();
            if !ok {
                return Err(format!("element {pos:?}: got {g}, want {w}"));
            }
        }
        Ok(())
    }

    /// Checks a candidate's whole output buffer: f32 exactly as [`Reference::check`], bf16 (rounded once by both
    /// the kernel and the evaluator) within one bf16 step more, since the two may differ by one step (2^-8 to 2^-7
    /// of the value) where the f32 sums, added in different orders, fall on either side of a rounding boundary.
    pub fn check_output(&self, got: &HostBuffer) -> Result<(), String> {
        match got {
            HostBuffer::F32(got) => self.check(got, 0.0),
            HostBuffer::BF16(got) => {
                let wide: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
                self.check(&wide, 1.0 / 128.0)
            }
            // One f16 step likewise (10 mantissa bits).
            HostBuffer::F16(got) => {
                let wide: Vec<f32> = got.iter().map(|x| x.to_f32()).collect();
                self.check(&wide, 1.0 / 1024.0)
            }
            _ => Err("the GEMM output is not f32, bf16 or f16".into()),
        }
    }
}

/// Runs `f(start, end)` over chunks covering `0..n`: on the CPU backend's thread pool where the build has it, else
/// as one chunk on this thread (a build with wgpu alone has no pool, and evaluates a search's samples serially).
fn for_chunks(n: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    #[cfg(feature = "cpu")]
    crate::cpu::pool::global().parallel_for(n, f);
    #[cfg(not(feature = "cpu"))]
    f(0, n);
}

/// `x` rounded to TF32 as the tensor cores' `cvt.rna.tf32.f32` does: 10 mantissa bits, to nearest, ties away from
/// zero; infinities and NaNs as they are.
pub fn round_tf32(x: f32) -> f32 {
    let b = x.to_bits();
    if b & 0x7f80_0000 == 0x7f80_0000 {
        return x;
    }
    f32::from_bits(b.wrapping_add(0x1000) & 0xffff_e000)
}

#[cfg(test)]
mod tf32_tests {
    use super::round_tf32;

    #[test]
    fn tf32_rounds_to_ten_mantissa_bits_ties_away() {
        let ulp = 2f32.powi(-10);
        assert_eq!(round_tf32(1.0 + ulp), 1.0 + ulp, "representable");
        assert_eq!(round_tf32(1.0 + ulp / 2.0), 1.0 + ulp, "a tie rounds away from zero");
        assert_eq!(round_tf32(-(1.0 + ulp / 2.0)), -(1.0 + ulp), "on the magnitude");
        assert_eq!(round_tf32(1.0 + ulp / 2.0 - 2f32.powi(-23)), 1.0, "below the tie");
        assert!(round_tf32(f32::NAN).is_nan());
        assert_eq!(round_tf32(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_tf32(f32::MAX), f32::INFINITY, "past the largest TF32");
    }
}
