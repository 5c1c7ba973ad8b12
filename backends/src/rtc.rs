//! The GPU runtime compilers, loaded at run time: NVRTC (CUDA C -> cubin for an `sm_XX`) and hiprtc (HIP C -> a
//! code object for a `gfxXXXX`). Neither needs a GPU or a driver, so kernels compile for a named architecture on a
//! build machine, and CI compiles every kernel the tests produce (`gpu_check`). Nothing is linked at build time:
//! [`Rtc::nvrtc`] and [`Rtc::hiprtc`] open the library (`KILN_NVRTC` / `KILN_HIPRTC` name a file; else the usual
//! sonames on the loader's path) and fail with what to install when it is missing, never a panic.
//!
//! The two APIs have one shape (create a program from source, compile with options, read the log, read the code),
//! so one loader serves both with the function names' prefix.
//!
//! Threads: NVRTC compiles distinct programs concurrently. hiprtc does not: ROCm 5's comgr corrupts its heap when
//! two threads compile at once (seen in CI as `malloc_consolidate(): unaligned fastbin chunk detected` under two
//! concurrent `hiprtcCompileProgram`s), and newer comgr takes a lock inside, so parallel hiprtc calls never gain.
//! Every hiprtc program here therefore lives under one process-wide lock (see [`Rtc::concurrent`]).

use libloading::Library;
use parking_lot::{Mutex, MutexGuard};
use std::ffi::{CString, c_char, c_int, c_void};

/// Which compiler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RtcKind {
    Nvrtc,
    Hiprtc,
}

/// A loaded runtime compiler.
pub struct Rtc {
    kind: RtcKind,
    lib: Library,
    /// Where it was loaded from (for messages).
    pub path: String,
}

type Program = *mut c_void;

impl Rtc {
    /// NVRTC: `KILN_NVRTC`, else `libnvrtc.so.13`, `.12`, `libnvrtc.so` on the loader's path.
    pub fn nvrtc() -> Result<Rtc, String> {
        Rtc::open(
            RtcKind::Nvrtc,
            "KILN_NVRTC",
            &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            "install NVRTC (the CUDA toolkit, or `pip install nvidia-cuda-nvrtc` and put its nvidia/cu13/lib on \
             LD_LIBRARY_PATH)",
        )
    }

    /// hiprtc: `KILN_HIPRTC`, else ROCm 6's `libhiprtc.so`, or `libamdhip64.so.5` (Debian's, with hiprtc inside).
    pub fn hiprtc() -> Result<Rtc, String> {
        Rtc::open(
            RtcKind::Hiprtc,
            "KILN_HIPRTC",
            &["libhiprtc.so", "libhiprtc.so.6", "libamdhip64.so.5", "libamdhip64.so"],
            "install hiprtc (ROCm, or Debian's libamdhip64-5 libamd-comgr2 libhiprtc-builtins5 rocm-device-libs)",
        )
    }

    fn open(kind: RtcKind, var: &str, names: &[&str], install: &str) -> Result<Rtc, String> {
        let (lib, path) = crate::dynlib::open(var, names, &format!("{kind:?}"), install)?;
        let rtc = Rtc { kind, lib, path };
        // Refuse a library without the entry points (a libamdhip64 built without hiprtc).
        rtc.sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>("Version")?;
        Ok(rtc)
    }

    /// Whether this compiler may run on several threads at once (NVRTC) or not (hiprtc: see the module doc).
    pub fn concurrent(&self) -> bool {
        match self.kind {
            RtcKind::Nvrtc => true,
            RtcKind::Hiprtc => false,
        }
    }

    /// The process-wide hiprtc lock, held from a program's creation to its destruction; `None` for NVRTC. One lock
    /// for every `Rtc` value, since two values opened from one library share its state.
    fn serial(&self) -> Option<MutexGuard<'static, ()>> {
        static HIPRTC: Mutex<()> = Mutex::new(());
        (!self.concurrent()).then(|| HIPRTC.lock())
    }

    fn prefix(&self) -> &'static str {
        match self.kind {
            RtcKind::Nvrtc => "nvrtc",
            RtcKind::Hiprtc => "hiprtc",
        }
    }

    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        // SAFETY: each call site names the symbol with its C signature from the vendor's header (nvrtc.h,
        // hiprtc.h: the two agree on every function used here).
        unsafe { crate::dynlib::sym(&self.lib, &self.path, &format!("{}{name}", self.prefix())) }
    }

    /// The compiler's version, (major, minor).
    pub fn version(&self) -> Result<(i32, i32), String> {
        let f: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int = self.sym("Version")?;
        let (mut a, mut b) = (0, 0);
        // SAFETY: two valid out-pointers.
        let rc = unsafe { f(&mut a, &mut b) };
        if rc != 0 { Err(format!("{}Version failed: {rc}", self.prefix())) } else { Ok((a, b)) }
    }

    /// Compiles `source` (program name `name`) for `arch` (`sm_90`, `gfx90a`) to a cubin or code object; an error
    /// holds the compiler's log.
    pub fn compile(&self, source: &str, name: &str, arch: &str) -> Result<Vec<u8>, String> {
        self.run(source, name, arch, false)
    }

    /// Runs only the compiler's front end on `source` for `arch`: preprocessing, parsing, types, overloads and
    /// the target's builtins, no code generation (NVRTC `--fdevice-syntax-only`, hiprtc `-fsyntax-only`): a
    /// fifth to a seventh of [`Rtc::compile`]'s time, for checking many kernels. An error holds the log.
    pub fn check(&self, source: &str, name: &str, arch: &str) -> Result<(), String> {
        self.run(source, name, arch, true).map(|_| ())
    }

    fn run(&self, source: &str, name: &str, arch: &str, front_end_only: bool) -> Result<Vec<u8>, String> {
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
        type Read = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
        let create: Create = self.sym("CreateProgram")?;
        let compile: Compile = self.sym("CompileProgram")?;
        let log_size: Size = self.sym("GetProgramLogSize")?;
        let log: Read = self.sym("GetProgramLog")?;
        let (code_size, code): (Size, Read) = match self.kind {
            RtcKind::Nvrtc => (self.sym("GetCUBINSize")?, self.sym("GetCUBIN")?),
            RtcKind::Hiprtc => (self.sym("GetCodeSize")?, self.sym("GetCode")?),
        };
        let destroy: Destroy = self.sym("DestroyProgram")?;
        let src = CString::new(source).map_err(|_| "a NUL byte in the source".to_string())?;
        let cname = CString::new(name).map_err(|_| "a NUL byte in the name".to_string())?;
        let mut opts: Vec<String> = match self.kind {
            RtcKind::Nvrtc => vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
            RtcKind::Hiprtc => vec![format!("--offload-arch={arch}"), "-std=c++17".into()],
        };
        if front_end_only {
            opts.extend(match self.kind {
                RtcKind::Nvrtc => vec!["--fdevice-syntax-only".to_string()],
                // hiprtc always passes `-c`, which clang reports as unused under `-fsyntax-only`.
                RtcKind::Hiprtc => vec!["-fsyntax-only".into(), "-Wno-unused-command-line-argument".into()],
            });
        }
        let opts: Vec<CString> = opts.into_iter().map(|o| CString::new(o).unwrap_or_default()).collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let _serial = self.serial();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings and an out-pointer; no headers are passed (0, null, null).
        let rc = unsafe { create(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if rc != 0 {
            return Err(format!("{}CreateProgram failed: {rc}", self.prefix()));
        }
        // SAFETY: `prog` was created above; the options outlive the call.
        let rc = unsafe { compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let read = |size: Size, read: Read| -> Vec<u8> {
            let mut n = 0usize;
            // SAFETY: `prog` is live; `n` is an out-pointer, then a buffer of `n` bytes receives the data.
            unsafe {
                if size(prog, &mut n) != 0 {
                    return Vec::new();
                }
                let mut buf = vec![0u8; n];
                if read(prog, buf.as_mut_ptr() as *mut c_char) != 0 {
                    return Vec::new();
                }
                buf
            }
        };
        // hiprtc reports a front-end-only run as failed (HIPRTC_ERROR_COMPILATION: no code object came out) even
        // when the source is fine; there the log's diagnostics decide.
        let failed = match (self.kind, front_end_only, rc) {
            (_, _, 0) => false,
            (RtcKind::Hiprtc, true, _) => String::from_utf8_lossy(&read(log_size, log)).contains("error:"),
            _ => true,
        };
        let result = if failed {
            let text = read(log_size, log);
            Err(format!(
                "{} ({}) failed for {arch}: {}",
                self.prefix(),
                self.path,
                String::from_utf8_lossy(&text).trim_end_matches('\0').trim()
            ))
        } else if front_end_only {
            Ok(Vec::new())
        } else {
            Ok(read(code_size, code))
        };
        // SAFETY: `prog` is live and destroyed once.
        unsafe { destroy(&mut prog) };
        result
    }
}

#[cfg(test)]
mod tests {
    use super::Rtc;

    const GOOD: &str = "extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 2.0f; }";
    const BAD: &str = "extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = undeclared_thing; }";

    /// Both stages accept a good kernel and the front end alone refuses a bad one with the compiler's words. The
    /// compilers are required where CI checks GPU code (`KILN_CHECK_GPU_C`); elsewhere a missing one is a note.
    #[test]
    fn the_front_end_alone_passes_good_source_and_names_what_is_wrong_in_bad() {
        let required = std::env::var_os("KILN_CHECK_GPU_C").is_some();
        for (open, arch) in [(Rtc::nvrtc as fn() -> Result<Rtc, String>, "sm_90"), (Rtc::hiprtc, "gfx90a")] {
            let rtc = match open() {
                Ok(r) => r,
                Err(e) if !required => {
                    eprintln!("note: skipped for {arch}: {e}");
                    continue;
                }
                Err(e) => panic!("KILN_CHECK_GPU_C is set but {e}"),
            };
            rtc.check(GOOD, "good.cu", arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            let code = rtc.compile(GOOD, "good.cu", arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(!code.is_empty(), "{arch}: no code came out");
            let err = rtc.check(BAD, "bad.cu", arch).expect_err(arch);
            assert!(err.contains("undeclared_thing") && err.contains(arch), "{arch}: {err}");
        }
    }

    /// Four threads compiling distinct programs at once, through two `Rtc` values opened separately, all get
    /// their code. Without the hiprtc lock ROCm 5's comgr crashed the process (SIGABRT or SIGSEGV from a corrupted
    /// heap) in 3 of 12 runs on a 2-core host: a race, so a pass alone proves little, but a regression shows up
    /// within a few CI runs rather than as an unexplained crash elsewhere.
    #[test]
    fn both_compilers_serve_many_threads_at_once() {
        let required = std::env::var_os("KILN_CHECK_GPU_C").is_some();
        for (open, arch) in [(Rtc::nvrtc as fn() -> Result<Rtc, String>, "sm_90"), (Rtc::hiprtc, "gfx90a")] {
            let rtcs = match (open(), open()) {
                (Ok(a), Ok(b)) => [a, b],
                (Err(e), _) | (_, Err(e)) if !required => {
                    eprintln!("note: skipped for {arch}: {e}");
                    continue;
                }
                (Err(e), _) | (_, Err(e)) => panic!("KILN_CHECK_GPU_C is set but {e}"),
            };
            std::thread::scope(|s| {
                for t in 0..4 {
                    let rtc = &rtcs[t % 2];
                    s.spawn(move || {
                        for i in 0..3 {
                            let src = format!(
                                "extern \"C\" __global__ void k{t}_{i}(float* y) {{ y[threadIdx.x] = {t}.0f * {i}.0f + y[threadIdx.x]; }}"
                            );
                            let code = rtc.compile(&src, "many.cu", arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
                            assert!(!code.is_empty(), "{arch}: thread {t}, program {i}: no code came out");
                        }
                    });
                }
            });
        }
    }
}
