//! The host's per-core L2 size, read once from Linux's sysfs cache description: the GEMM cost model sizes the
//! blocks it expects to stay in L2 against it (`gemm::cost`).
//!
//! Read, not assumed by vendor or model: the cores kiln has run on have 512 KiB (Zen 3), 1 MiB (Zen 4) and 2 MiB
//! (the Xeon guests) of L2, and a block that stays in one spills from another. Where sysfs does not say (another
//! OS, a sandboxed /sys), [`FALLBACK_L2_BYTES`]: the size the model's constants were first measured with, so the
//! model ranks as it did before it read the size.

use std::path::Path;
use std::sync::LazyLock;

/// The L2 assumed where the host does not describe its caches: 512 KiB, the Zen 3 core's.
pub const FALLBACK_L2_BYTES: usize = 512 * 1024;

/// Bytes of the L2 cache of the core this process first asked from (cpu0's; kiln's targets have one L2 size per
/// package). Read once per process.
pub fn l2_bytes() -> usize {
    static L2: LazyLock<usize> =
        LazyLock::new(|| l2_bytes_in(Path::new("/sys/devices/system/cpu/cpu0/cache")).unwrap_or(FALLBACK_L2_BYTES));
    *L2
}

/// The level-2 data or unified cache's size among `dir`'s `index*` entries (each with `level`, `type` and `size`
/// files, as Linux writes them), or `None` where there is none or it cannot be read.
fn l2_bytes_in(dir: &Path) -> Option<usize> {
    let read = |entry: &Path, name: &str| std::fs::read_to_string(entry.join(name)).ok();
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let path = e.path();
        let level = read(&path, "level")?;
        let kind = read(&path, "type")?;
        if level.trim() != "2" || !matches!(kind.trim(), "Data" | "Unified") {
            return None;
        }
        parse_size(&read(&path, "size")?)
    })
}

/// A sysfs cache size (`2048K`, `1M`, or plain bytes) in bytes.
fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let scale = match unit.trim() {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("2048K\n"), Some(2 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("524288"), Some(512 << 10));
        assert_eq!(parse_size("12 MiB"), None);
        assert_eq!(parse_size("0K"), None);
        assert_eq!(parse_size(""), None);
    }

    /// A directory laid out as Linux's: the level-2 unified entry is found among the L1 and L3 ones; an
    /// instruction-only L2 or a missing directory gives none.
    #[test]
    fn the_level_2_entry_is_found_among_the_others() {
        let root = std::env::temp_dir().join(format!("kiln-caches-test-{}", std::process::id()));
        let entry = |i: usize, level: &str, kind: &str, size: &str| {
            let d = root.join(format!("index{i}"));
            std::fs::create_dir_all(&d).expect("temp dir");
            for (name, text) in [("level", level), ("type", kind), ("size", size)] {
                std::fs::write(d.join(name), format!("{text}\n")).expect("temp file");
            }
        };
        entry(0, "1", "Data", "48K");
        entry(1, "2", "Instruction", "64K");
        assert_eq!(l2_bytes_in(&root), None);
        entry(2, "2", "Unified", "2048K");
        entry(3, "3", "Unified", "491520K");
        assert_eq!(l2_bytes_in(&root), Some(2 << 20));
        std::fs::remove_dir_all(&root).expect("temp dir removed");
        assert_eq!(l2_bytes_in(&root), None);
        assert!(l2_bytes() >= 64 << 10);
    }
}
