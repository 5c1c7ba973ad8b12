//! Stable 64-bit FNV-1a: the one hash behind fingerprint ids, key digests, candidate-set checksums and the
//! checksums of cache entries and bundles.
//!
//! Owns: a hash whose value never depends on the process, platform, Rust version or a random seed (std's
//! `RandomState` would give a different value in every process, useless for file names that must be found again).
//! Deliberately not: cryptographic. Cache files are written by this user's own runs; the checksum catches torn
//! writes and bit rot, not an attacker (who could rewrite the checksum too).

/// Streaming FNV-1a, 64 bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub(crate) fn new() -> Self {
        Self(Self::OFFSET)
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
        self
    }

    /// Hashes the length first, so that a sequence of fields has one encoding: ("ab", "c") and ("a", "bc")
    /// must not collide by construction.
    pub(crate) fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes)
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of one byte string.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    Fnv64::new().write(bytes).finish()
}

/// The 16-hex-digit form used in ids and file names.
pub(crate) fn hex16(x: u64) -> String {
    format!("{x:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_published_fnv1a64_vectors() {
        // Reference values of the FNV-1a 64 specification: if these move, every file name on disk moves with them.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fields_are_length_prefixed() {
        let ab_c = Fnv64::new().field(b"ab").field(b"c").finish();
        let a_bc = Fnv64::new().field(b"a").field(b"bc").finish();
        assert_ne!(ab_c, a_bc);
        assert_eq!(hex16(1), "0000000000000001");
    }
}
