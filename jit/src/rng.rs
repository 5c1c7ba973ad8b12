//! Counter-based random numbers: Philox-4x32-10 (Salmon et al., SC'11), as cuRAND and JAX use.
//!
//! Element i of a `Rand` node with run-time key (seed, offset) is a pure function of (seed, offset + i), so every
//! backend, every thread split and every later run produce the same stream: no generator state lives on a device.
//! Uniform values are bit-exact on every backend (integer ops and one exact scaling). Normal values go through
//! log/cos/sqrt and agree to those functions' accuracy on each backend.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox-4x32 with 10 rounds.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The four 32-bit words for element `index` of a stream.
pub fn words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32_10([index as u32, (index >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

/// Uniform in [0, 1) with 24 bits (exactly representable in f32).
pub fn uniform_f32(w: [u32; 4]) -> f32 {
    (w[0] >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Uniform in [0, 1) with 11 bits: exact in f16 (rounding a wider uniform to f16 could give 1.0). The same as
/// `uniform_f32` truncated to 11 bits.
pub fn uniform_f16(w: [u32; 4]) -> f32 {
    (w[0] >> 21) as f32 * (1.0 / 2048.0)
}

/// Uniform in [0, 1) with 8 bits: exact in bf16 (rounding a wider uniform to bf16 could give 1.0). The same as
/// `uniform_f32` truncated to 8 bits.
pub fn uniform_bf16(w: [u32; 4]) -> f32 {
    (w[0] >> 24) as f32 * (1.0 / 256.0)
}

/// Uniform in [0, 1) with 53 bits.
pub fn uniform_f64(w: [u32; 4]) -> f64 {
    let bits = ((w[0] as u64) << 32 | w[1] as u64) >> 11;
    bits as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// Standard normal by Box-Muller from words 2 and 3 (u1 in (0, 1], so the log is finite).
pub fn normal_f64(w: [u32; 4]) -> f64 {
    let u1 = ((w[2] >> 8) as f64 + 1.0) * (1.0 / 16_777_216.0);
    let u2 = (w[3] >> 8) as f64 * (1.0 / 16_777_216.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn normal_moments_are_standard() {
        let n = 200_000u64;
        let xs: Vec<f64> = (0..n).map(|i| normal_f64(words(7, i))).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
        let u: Vec<f32> = (0..1000u64).map(|i| uniform_f32(words(1, i))).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    }
}
