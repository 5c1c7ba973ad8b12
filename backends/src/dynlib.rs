//! Opening a vendor library at run time (NVRTC, hiprtc, the HIP runtime, NCCL): the candidates tried in order (a
//! file the user names in an environment variable, else the usual sonames on the loader's path), the entry points
//! resolved by name, and a call's status turned into the library's own words. One place for what every loader does,
//! so each says only which library, which names and what to install.

use libloading::Library;

/// The first of `names` that loads (only the file `var` names, where it is set), with the name it loaded from; an
/// error says `what` was not found, what was tried and `install`.
pub(crate) fn open(var: &str, names: &[&str], what: &str, install: &str) -> Result<(Library, String), String> {
    let candidates: Vec<String> = match std::env::var(var) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => names.iter().map(|s| s.to_string()).collect(),
    };
    let mut tried = Vec::new();
    for path in candidates {
        // SAFETY: loading a vendor's library runs its initializers, which only set up the library itself (no
        // device is touched before the first call).
        match unsafe { Library::new(&path) } {
            Ok(lib) => return Ok((lib, path)),
            Err(e) => tried.push(format!("{path}: {e}")),
        }
    }
    Err(format!("{what} not found (tried {}); {install}", tried.join("; ")))
}

/// The entry point `name` of `lib` (loaded from `path`, for the message).
///
/// # Safety
/// `T` must be the symbol's C signature from the vendor's header.
pub(crate) unsafe fn sym<T: Copy>(lib: &Library, path: &str, name: &str) -> Result<T, String> {
    // SAFETY: the caller's contract on `T`.
    unsafe { lib.get::<T>(format!("{name}\0").as_bytes()).map(|s| *s) }.map_err(|e| format!("{path} lacks {name}: {e}"))
}

/// `Ok` for a zero status, else an error naming `call` with the library's text for `status` (from
/// `error_string`, its `...GetErrorString`).
#[cfg(any(feature = "hip", feature = "nccl"))]
pub(crate) fn check(
    status: std::ffi::c_int,
    call: &str,
    error_string: unsafe extern "C" fn(std::ffi::c_int) -> *const std::ffi::c_char,
) -> Result<(), String> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: the vendors' error-string functions return a static NUL-terminated string for any status, or null.
    let text = unsafe { error_string(status) };
    let text = if text.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated and static (above).
        unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    Err(format!("{call} failed: {text} ({status})"))
}
