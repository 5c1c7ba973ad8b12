//! Which vector instruction sets the CPU kernels may use: detected at run time, narrowed by `KILN_CPU_ISA`, and
//! each one's FMA peak measured once per machine.
//!
//! A family is chosen by what the host has and by measurement, never by vendor: an AVX-512 core with two full
//! 512-bit FMA units (Intel server parts) doubles the 8-lane peak, one that splits 512-bit FMAs into two 256-bit
//! halves (AMD Zen 4) does not. Both families are GEMM candidates wherever present; the cost model weighs each by
//! its measured peak ([`peak_ratio`]) and the tuner's race decides, so a double-pumped core keeps AVX2 without a
//! rule saying so.
//!
//! `KILN_CPU_ISA=avx2|avx512|auto` (default `auto`) narrows the generated GEMM register tiles to one family, so both
//! are exercised on an AVX-512 host; asking for a family the CPU lacks is an error, never a silent fallback. The
//! dot-product and split-K GEMVs have an 8-lane form only and run under either; the elementwise and row kernels
//! take 16 lanes wherever the setting allows AVX-512 (`cpu::wide`: they are not FMA-bound, so the peaks do not
//! decide them).

use std::sync::LazyLock;

/// A vector instruction set a generated kernel is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// AVX2 + FMA: 16 ymm registers of 8 f32 lanes.
    Avx2,
    /// AVX-512F: 32 zmm registers of 16 f32 lanes, opmask registers for ragged edges.
    Avx512,
}

impl Isa {
    pub const ALL: [Isa; 2] = [Isa::Avx2, Isa::Avx512];

    /// f32 lanes per vector.
    pub const fn lanes(self) -> usize {
        match self {
            Isa::Avx2 => 8,
            Isa::Avx512 => 16,
        }
    }

    /// Vector registers.
    pub const fn registers(self) -> usize {
        match self {
            Isa::Avx2 => 16,
            Isa::Avx512 => 32,
        }
    }

    /// The name in `KILN_CPU_ISA` and in tuning records (`avx2:6x16:...`).
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s)
    }

    /// Whether this host can run the family's kernels.
    pub fn present(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
            match self {
                Isa::Avx2 => avx2,
                Isa::Avx512 => avx2 && std::arch::is_x86_feature_detected!("avx512f"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// The bf16 dot-product units this host has (CPUID). Both run bf16 GEMMs (`gemm::bf16`, which also asks for AMX's
/// tile state); where neither is present a bf16 matmul runs the f32 GEMM on operands converted to f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Units {
    /// AVX512-BF16 (`vdpbf16ps`: pairs of bf16 products summed into f32 lanes).
    pub avx512_bf16: bool,
    /// AMX-BF16 with AMX-TILE in CPUID (`tdpbf16ps` on 16 x 32 tiles). Using them also needs the kernel's
    /// permission per process (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), not asked here.
    pub amx_bf16: bool,
}

/// What [`Bf16Units`] this host has (CPUID).
pub fn bf16_units() -> Bf16Units {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 7 (a CPU without it returns zeros for it: no features).
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let (amx_bf16, amx_tile) = (leaf7.edx >> 22 & 1 == 1, leaf7.edx >> 24 & 1 == 1);
        Bf16Units { avx512_bf16: std::arch::is_x86_feature_detected!("avx512bf16"), amx_bf16: amx_bf16 && amx_tile }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Bf16Units { avx512_bf16: false, amx_bf16: false }
    }
}

/// Whether this host has AVX512BW (`vpbroadcastw`: a bf16 GEMM epilogue's per-row bf16 operand).
pub fn has_avx512bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The families the generated GEMM may use: those present, narrowed by `KILN_CPU_ISA` (read once), or why the
/// setting cannot be honoured.
pub fn allowed() -> Result<&'static [Isa], String> {
    static ALLOWED: LazyLock<Result<Vec<Isa>, String>> =
        LazyLock::new(|| resolve(std::env::var("KILN_CPU_ISA").ok().as_deref(), Isa::present));
    ALLOWED.as_deref().map_err(Clone::clone)
}

/// Whether `isa`'s kernels may run: present, and not ruled out by `KILN_CPU_ISA` (an unusable setting allows none).
pub fn allows(isa: Isa) -> bool {
    allowed().is_ok_and(|a| a.contains(&isa))
}

/// [`allowed`] for a setting and a feature probe.
fn resolve(setting: Option<&str>, present: impl Fn(Isa) -> bool) -> Result<Vec<Isa>, String> {
    let setting = setting.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("auto");
    if setting == "auto" {
        return Ok(Isa::ALL.into_iter().filter(|&i| present(i)).collect());
    }
    let Some(isa) = Isa::parse(setting) else {
        return Err(format!("KILN_CPU_ISA={setting} is not one of auto, avx2, avx512"));
    };
    if !present(isa) {
        return Err(format!(
            "KILN_CPU_ISA={setting}, but this CPU lacks {} (unset KILN_CPU_ISA or set it to auto to use what it has)",
            match isa {
                Isa::Avx2 => "AVX2 and FMA",
                Isa::Avx512 => "AVX-512F",
            }
        ));
    }
    Ok(vec![isa])
}

/// Lane masks of the first `n` lanes of an 8-lane vector (`vmaskmovps` reads each lane's sign bit), `n` <= 8.
static MASKS8: [[i32; 8]; 9] = {
    let mut m = [[0i32; 8]; 9];
    let mut n = 0;
    while n < 9 {
        let mut l = 0;
        while l < n {
            m[n][l] = -1;
            l += 1;
        }
        n += 1;
    }
    m
};

/// Opmasks of the first `n` lanes of a 16-lane vector (`kmovw`), `n` <= 16.
static MASKS16: [u16; 17] = {
    let mut m = [0u16; 17];
    let mut n = 1;
    while n < 17 {
        m[n] = ((1u32 << n) - 1) as u16;
        n += 1;
    }
    m
};

/// Where the mask of a vector's first `n` lanes (`n` <= lanes) lies, in the form `isa`'s generated kernels load it
/// (the GEMM's ragged column tail, an elementwise row's head and tail): static, so a launch builds none.
pub(crate) fn lane_mask(isa: Isa, n: usize) -> *const u8 {
    match isa {
        Isa::Avx2 => MASKS8[n].as_ptr() as *const u8,
        Isa::Avx512 => &MASKS16[n] as *const u16 as *const u8,
    }
}

/// Measured single-core FMA peaks in GFLOP/s, by family (0 where absent).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peaks {
    pub avx2: f64,
    pub avx512: f64,
}

/// Name of the store artifact holding this machine's [`Peaks`] (the store is namespaced by CPU fingerprint).
const PEAKS_ARTIFACT: &str = "cpu-fma-peaks-v1";

/// This machine's peaks: read from the tuning store, else measured now (~10 ms) and stored, so every process on
/// the machine ranks candidates alike.
pub fn peaks() -> Peaks {
    static PEAKS: LazyLock<Peaks> = LazyLock::new(|| {
        let store = kiln_autotune::Store::global();
        if let Some(p) = store.get_artifact(PEAKS_ARTIFACT).and_then(|b| parse_peaks(&b)) {
            return p;
        }
        let p = measure_peaks();
        if let Err(e) = store.put_artifact(PEAKS_ARTIFACT, format_peaks(&p).as_bytes()) {
            crate::runtime::cache_write_failed("CPU FMA peaks", &e);
        }
        p
    });
    *PEAKS
}

/// How many times the 8-lane peak `isa`'s kernels can reach on this machine: 1 for AVX2, about 2 for AVX-512 on a
/// core with two 512-bit FMA units, about 1 on one that splits them. Clamped to [0.25, 4] against a wild
/// measurement.
pub fn peak_ratio(isa: Isa) -> f64 {
    match isa {
        Isa::Avx2 => 1.0,
        Isa::Avx512 => {
            let p = peaks();
            if p.avx2 > 0.0 { (p.avx512 / p.avx2).clamp(0.25, 4.0) } else { 1.0 }
        }
    }
}

fn format_peaks(p: &Peaks) -> String {
    format!("avx2 {:.3}\navx512 {:.3}\n", p.avx2, p.avx512)
}

fn parse_peaks(bytes: &[u8]) -> Option<Peaks> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut p = Peaks { avx2: -1.0, avx512: -1.0 };
    for line in text.lines() {
        let (name, value) = line.split_once(' ')?;
        let v: f64 = value.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
        match name {
            "avx2" => p.avx2 = v,
            "avx512" => p.avx512 = v,
            _ => return None,
        }
    }
    (p.avx2 >= 0.0 && p.avx512 >= 0.0).then_some(p)
}

/// Best of five ~1 ms runs of 12 independent FMA chains per family on the calling thread.
fn measure_peaks() -> Peaks {
    let best = |f: &dyn Fn() -> Option<f64>| (0..5).filter_map(|_| f()).fold(0.0, f64::max);
    Peaks { avx2: best(&|| fma_gflops(Isa::Avx2)), avx512: best(&|| fma_gflops(Isa::Avx512)) }
}

/// FMA rounds per measurement: ~1 ms at 3 GHz and two FMAs a cycle.
const ROUNDS: u64 = 250_000;

fn fma_gflops(isa: Isa) -> Option<f64> {
    let t0 = std::time::Instant::now();
    std::hint::black_box(fma_chains(isa, std::hint::black_box(ROUNDS))?);
    Some(fma_flops(isa, ROUNDS) / t0.elapsed().as_secs_f64() / 1e9)
}

/// Independent FMA chains per round of [`fma_chains`]: enough to cover the FMA latency on two units.
pub const FMA_CHAINS: usize = 12;

/// Flops of one [`fma_chains`] call of `rounds` rounds.
pub fn fma_flops(isa: Isa, rounds: u64) -> f64 {
    rounds as f64 * FMA_CHAINS as f64 * isa.lanes() as f64 * 2.0
}

/// Runs `rounds` rounds of [`FMA_CHAINS`] independent FMA chains of `isa`'s width on the calling thread (what a
/// peak measurement times; the benchmarks' FMA-peak rows run it on several threads), returning a value that
/// depends on every FMA; `None` where the CPU lacks `isa`.
pub fn fma_chains(isa: Isa, rounds: u64) -> Option<f32> {
    if !isa.present() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the family's features were detected above.
    let sink = unsafe {
        match isa {
            Isa::Avx2 => chains_avx2(rounds),
            Isa::Avx512 => chains_avx512(rounds),
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let sink = 0.0f32;
    Some(sink)
}

/// [`FMA_CHAINS`] independent 8-lane FMA chains.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains_avx2(rounds: u64) -> f32 {
    use std::arch::x86_64::*;
    let (m, k) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); FMA_CHAINS];
    for _ in 0..rounds {
        for a in &mut acc {
            *a = _mm256_fmadd_ps(*a, m, k);
        }
    }
    let mut lanes = [0.0f32; 8];
    let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
    // SAFETY: `lanes` holds 8 f32s; the store is unaligned.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    lanes.iter().sum()
}

/// As [`chains_avx2`] with 16-lane FMAs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chains_avx512(rounds: u64) -> f32 {
    use std::arch::x86_64::*;
    let (m, k) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); FMA_CHAINS];
    for _ in 0..rounds {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, m, k);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kiln_cpu_isa_narrows_or_refuses() {
        let all = |_: Isa| true;
        let no512 = |i: Isa| i == Isa::Avx2;
        assert_eq!(resolve(None, all).unwrap(), vec![Isa::Avx2, Isa::Avx512]);
        assert_eq!(resolve(Some("auto"), no512).unwrap(), vec![Isa::Avx2]);
        assert_eq!(resolve(Some(" avx2 "), all).unwrap(), vec![Isa::Avx2]);
        assert_eq!(resolve(Some("avx512"), all).unwrap(), vec![Isa::Avx512]);
        let e = resolve(Some("avx512"), no512).unwrap_err();
        assert!(e.contains("lacks AVX-512F"), "{e}");
        let e = resolve(Some("sse2"), all).unwrap_err();
        assert!(e.contains("not one of auto, avx2, avx512"), "{e}");
    }

    #[test]
    fn peaks_round_trip_and_reject_garbage() {
        let p = Peaks { avx2: 128.5, avx512: 0.0 };
        assert_eq!(parse_peaks(format_peaks(&p).as_bytes()), Some(p));
        assert_eq!(parse_peaks(b"avx2 nan\navx512 1\n"), None);
        assert_eq!(parse_peaks(b"avx2 1\n"), None);
        assert_eq!(parse_peaks(b"\xff"), None);
    }

    /// CPUID agrees with the flags Linux lists in /proc/cpuinfo.
    #[test]
    fn bf16_units_match_the_kernels_cpu_flags() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return };
        let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else { return };
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        let u = bf16_units();
        assert_eq!(u.avx512_bf16, has("avx512_bf16"), "{u:?}");
        assert_eq!(u.amx_bf16, has("amx_bf16") && has("amx_tile"), "{u:?}");
    }

    /// The measurement itself: positive for each family present, zero for one absent.
    #[test]
    fn measured_peaks_follow_the_features() {
        let p = measure_peaks();
        assert_eq!(p.avx2 > 0.0, Isa::Avx2.present());
        assert_eq!(p.avx512 > 0.0, Isa::Avx512.present());
    }
}
