//! Every test binary that includes this module runs on a cache of its own: before `main`, unless `KILN_CACHE_DIR`
//! is already set, it points `KILN_CACHE_DIR` at a fresh folder under the system's temp dir and removes that folder
//! when the process exits. Tests must never fill the user's `~/.cache/kiln` (a plain `cargo test` once wrote 16,000
//! files there); children the tests spawn inherit the variable, so they share the parent's private cache. Tests of
//! the default location set their own `KILN_CACHE_DIR` on a child process.

use std::path::PathBuf;
use std::sync::OnceLock;

static PRIVATE_ROOT: OnceLock<PathBuf> = OnceLock::new();

#[ctor::ctor(unsafe)]
fn use_a_private_cache() {
    if std::env::var_os("KILN_CACHE_DIR").is_some() {
        return;
    }
    let Ok(dir) = tempfile::Builder::new().prefix("kiln-test-cache-").tempdir() else {
        // No temp dir: run memory-only rather than fall back to the user's cache.
        // SAFETY: this runs before `main`, so no other thread exists to read the environment concurrently.
        unsafe { std::env::set_var("KILN_CACHE_DIR", "off") };
        return;
    };
    let dir = dir.keep();
    // SAFETY: as above, before `main` and so before any other thread.
    unsafe { std::env::set_var("KILN_CACHE_DIR", &dir) };
    if PRIVATE_ROOT.set(dir).is_ok() {
        // SAFETY: `remove_private_root` is an `extern "C" fn()` that does not unwind (it ignores every error).
        unsafe { libc::atexit(remove_private_root) };
    }
}

extern "C" fn remove_private_root() {
    if let Some(dir) = PRIVATE_ROOT.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
