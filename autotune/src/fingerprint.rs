//! Device fingerprints: what a tuning result or compiled artifact was measured on, reduced to a stable id.
//!
//! Owns: the host CPU's fingerprint (architecture, model name, the SIMD features a kernel may use) and the id that
//! namespaces the on-disk cache and is part of every tuning key. A fingerprint can also be built by hand (public
//! fields), so a GPU backend can describe its device and tests can simulate a foreign machine.
//! Deliberately not: GPU discovery (each backend fingerprints its own devices) or cache lookups.

use serde::{Deserialize, Serialize};

use crate::hash::{Fnv64, hex16};

/// What a device is, as far as kernel choice and tuning results are concerned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceFingerprint {
    /// Instruction-set architecture, e.g. `x86_64`.
    pub arch: String,
    /// Marketing model name (`/proc/cpuinfo` "model name" on Linux), or `unknown`.
    pub model: String,
    /// Features that change which code is legal or fast (e.g. `avx2`, `fma`).
    pub features: Vec<String>,
}

impl DeviceFingerprint {
    /// The CPU this process runs on.
    pub fn host_cpu() -> Self {
        Self {
            arch: std::env::consts::ARCH.to_string(),
            model: cpu_model().unwrap_or_else(|| "unknown".to_string()),
            features: host_features(),
        }
    }

    /// A 16-hex-digit digest of every field, the same in every process and run. Features are compared as a set
    /// (sorted, deduplicated) so a hand-built fingerprint does not depend on the order its author listed them in.
    pub fn id(&self) -> String {
        let mut features: Vec<&str> = self.features.iter().map(String::as_str).collect();
        features.sort_unstable();
        features.dedup();
        let mut h = Fnv64::new();
        // A tag, so a change to what goes into the id can never reproduce an old id by accident.
        h.field(b"kiln-device-fingerprint/1").field(self.arch.as_bytes()).field(self.model.as_bytes());
        h.write(&(features.len() as u64).to_le_bytes());
        for f in features {
            h.field(f.as_bytes());
        }
        hex16(h.finish())
    }

    /// One human-readable line, e.g. `x86_64 "Intel(R) Xeon(R) ..." [avx avx2 fma] (id 0123456789abcdef)`.
    pub fn describe(&self) -> String {
        let features =
            if self.features.is_empty() { "no listed features".to_string() } else { self.features.join(" ") };
        format!("{} \"{}\" [{}] (id {})", self.arch, self.model, features, self.id())
    }
}

fn cpu_model() -> Option<String> {
    // Unreadable (not Linux, sandboxed /proc) is normal: the model is a refinement of the id, not a requirement.
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    parse_model_name(&text)
}

/// The first "model name" line of a `/proc/cpuinfo` text, whitespace collapsed (some kernels pad it).
fn parse_model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if key.trim() != "model name" {
            return None;
        }
        let model = value.split_whitespace().collect::<Vec<_>>().join(" ");
        (!model.is_empty()).then_some(model)
    })
}

#[cfg(target_arch = "x86_64")]
fn host_features() -> Vec<String> {
    let mut present = Vec::new();
    macro_rules! probe {
        ($($feature:tt),* $(,)?) => {
            $(if std::arch::is_x86_feature_detected!($feature) {
                present.push($feature.to_string());
            })*
        };
    }
    probe!("sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "bmi2");
    present.sort();
    present
}

/// Other architectures list no features yet: their kernels do not branch on any, and arch + model still separate
/// machines. Add a probe here when a backend starts choosing code by feature.
#[cfg(not(target_arch = "x86_64"))]
fn host_features() -> Vec<String> {
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(features: &[&str]) -> DeviceFingerprint {
        DeviceFingerprint {
            arch: "x86_64".into(),
            model: "Test CPU".into(),
            features: features.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn id_is_16_hex_and_stable() {
        let id = fp(&["avx2", "fma"]).id();
        assert_eq!(id.len(), 16);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        // Pinned: the id names directories on users' disks, so it must not change between builds or processes.
        assert_eq!(id, fp(&["avx2", "fma"]).id());
        assert_eq!(id, fp(&["fma", "avx2", "fma"]).id(), "features are a set");
    }

    #[test]
    fn every_field_changes_the_id() {
        let base = fp(&["avx2", "fma"]);
        assert_ne!(base.id(), fp(&["avx2"]).id());
        assert_ne!(base.id(), DeviceFingerprint { arch: "aarch64".into(), ..base.clone() }.id());
        assert_ne!(base.id(), DeviceFingerprint { model: "Other CPU".into(), ..base.clone() }.id());
    }

    #[test]
    fn parses_model_name() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R)   CPU @ 2.20GHz\n";
        assert_eq!(parse_model_name(text).as_deref(), Some("Intel(R) Xeon(R) CPU @ 2.20GHz"));
        assert_eq!(parse_model_name("processor : 0\n"), None);
        assert_eq!(parse_model_name("model name :   \n"), None);
    }

    #[test]
    fn host_fingerprint_is_consistent() {
        let host = DeviceFingerprint::host_cpu();
        assert_eq!(host.arch, std::env::consts::ARCH);
        assert!(!host.model.is_empty());
        let mut sorted = host.features.clone();
        sorted.sort();
        assert_eq!(sorted, host.features);
        assert_eq!(host.id(), DeviceFingerprint::host_cpu().id());
        assert!(host.describe().contains(&host.id()));
    }
}
