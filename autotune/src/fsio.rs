//! Crash-safe file writes: a reader sees the old file or the complete new one, never a torn one.
//!
//! Owns: the temp-file naming scheme (so listings can tell temp files from entries) and write-fsync-rename.
//! Deliberately not: cleaning up temp files left by a crash. Another process may be mid-write to one; they are
//! never read as entries, and `kiln cache clear` removes the whole namespace directory with them.

use std::fs;
use std::io::{self, Write as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Temp files are `.<target name>.<pid>.<counter>.tmp`: the leading dot and the suffix keep them from ever
/// matching an entry's `<digest>.rec` / `<digest>.bin`.
pub(crate) fn is_temp_name(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.ends_with(".tmp")
}

/// Writes `bytes` to `path` atomically ([`replace_file`]), creating missing parent directories first (the store's
/// namespace folders, a bundle's folder).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    replace_file(path, bytes, durable)
}

/// Writes `bytes` to `path` atomically: a unique temp file in the same directory (same filesystem, so the rename
/// is atomic), renamed over the target. The directory must exist. The file gets the mode `File::create` would
/// give it: the replaced file's, or 0o666 less the umask for a new one (a temp-file crate's 0600 is for secrets).
/// kiln's own saves (`save_safetensors`) use it too.
///
/// `durable`: also fsync the file before the rename and the directory after it, so the new content survives a power
/// cut. Bundles and saved weights (files the user asked for) are durable; cache entries are not, on purpose: an
/// fsync costs ~8 ms on a typical disk, paid on a compile's critical path, while a cache entry needs no durability
/// to be safe. A crash can leave a renamed entry with missing or zeroed content, and its checksum then rejects it
/// (it is rebuilt); a reader never sees a half-written file either way, because of the rename.
pub fn replace_file(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path does not end in a file name"))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".{}.{}.{n}.tmp", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        // create_new: a stale temp of a dead process with a recycled pid must not be appended to or raced. It opens
        // with std's default mode (0o666 less the umask), as `File::create` does.
        let mut file = fs::OpenOptions::new().write(true).create_new(true).open(&temp)?;
        if let Ok(old) = fs::metadata(path) {
            file.set_permissions(old.permissions())?;
        }
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&temp, path)
    })();
    if result.is_err() {
        // Best effort: the temp file is never read as an entry, this only saves the space.
        let _ = fs::remove_file(&temp);
        return result;
    }
    if durable {
        sync_dir(dir);
    }
    Ok(())
}

#[cfg(unix)]
fn sync_dir(dir: &Path) {
    // Not fatal if it fails (some filesystems refuse fsync on directories): the data itself is synced.
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_and_leave_no_temp_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("a/b/x.rec");
        write_atomic(&path, b"one", true).expect("first write");
        write_atomic(&path, b"two", false).expect("second write");
        assert_eq!(fs::read(&path).expect("read back"), b"two");
        let names: Vec<_> =
            fs::read_dir(dir.path().join("a/b")).expect("list").flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.rec")]);
        assert!(is_temp_name(".x.rec.123.0.tmp"));
        assert!(!is_temp_name("0123456789abcdef.rec"));
    }
}
