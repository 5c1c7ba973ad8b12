//! The HIP runtime, opened at run time: `libamdhip64` (ROCm 6's `.so.6`, ROCm 5's `.so.5`; `KILN_HIP_RUNTIME`
//! names a file), with the handful of entry points the HIP device calls, resolved once when it opens. Nothing is
//! linked at build time, and a machine without ROCm gets an error naming what to install.
//!
//! Signatures are hip_runtime_api.h's (ROCm 5.2 and 6.x agree on every one used here). The one version-dependent
//! piece is the device properties struct, whose layout ROCm 6 changed (`hipDeviceProp_tR0600`, behind its own
//! symbol): [`Runtime::arch`] reads the architecture name at the offset of the layout it asked for.

use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

pub(super) type Stream = *mut c_void;
pub(super) type Module = *mut c_void;
pub(super) type Function = *mut c_void;
pub(super) type DevicePtr = *mut c_void;
type Status = c_int;

/// `hipErrorNoDevice`: what `hipGetDeviceCount` says on a machine without a GPU.
const NO_DEVICE: Status = 100;

/// The offset of `gcnArchName` (a `char[256]`) in ROCm 5's `hipDeviceProp_t` (`hipGetDeviceProperties`, 792
/// bytes), read off Debian's ROCm 5.2 header with `offsetof` on x86-64 (`tests/hip_device.rs` checks it against the
/// header where one is installed).
pub const ARCH_OFFSET_R0000: usize = 396;
/// The same in ROCm 6's `hipDeviceProp_tR0600` (`hipGetDevicePropertiesR0600`, 1472 bytes), from ROCm 6's
/// hip_runtime_api.h compiled the same way (no ROCm 6 header here to check it against in CI).
pub const ARCH_OFFSET_R0600: usize = 1160;
/// Bytes handed to the properties call: more than either layout.
const PROPS_BYTES: usize = 4096;

pub(super) struct Runtime {
    /// Where the library was opened from (for messages).
    pub(super) path: String,
    init: unsafe extern "C" fn(c_uint) -> Status,
    device_count: unsafe extern "C" fn(*mut c_int) -> Status,
    runtime_version: unsafe extern "C" fn(*mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    set_device: unsafe extern "C" fn(c_int) -> Status,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Status,
    /// `hipGetDevicePropertiesR0600` where the library has it (ROCm 6), else ROCm 5's `hipGetDeviceProperties`.
    properties: (unsafe extern "C" fn(*mut c_void, c_int) -> Status, usize),
    stream_create: unsafe extern "C" fn(*mut Stream) -> Status,
    stream_synchronize: unsafe extern "C" fn(Stream) -> Status,
    malloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> Status,
    htod: unsafe extern "C" fn(DevicePtr, *mut c_void, usize, Stream) -> Status,
    dtoh: unsafe extern "C" fn(*mut c_void, DevicePtr, usize, Stream) -> Status,
    dtod: unsafe extern "C" fn(DevicePtr, DevicePtr, usize, Stream) -> Status,
    module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> Status,
    module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> Status,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Status,
    /// Keeps the entry points above mapped.
    _lib: Library,
}

/// What to install when the runtime is missing.
pub const INSTALL_HINT: &str = "install ROCm (or Debian's libamdhip64-5 libamd-comgr2 libhiprtc-builtins5 \
                                rocm-device-libs), or name the library with KILN_HIP_RUNTIME";

impl Runtime {
    /// Opens the runtime and resolves every entry point; an error says what is missing.
    pub(super) fn open() -> Result<Runtime, String> {
        let names = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];
        let (lib, path) = crate::dynlib::open("KILN_HIP_RUNTIME", &names, "HIP runtime", INSTALL_HINT)?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each field's type is the symbol's C signature from hip_runtime_api.h.
                unsafe { crate::dynlib::sym(&lib, &path, $name) }
            };
        }
        let properties = match sym!("hipGetDevicePropertiesR0600") {
            Ok(f) => (f, ARCH_OFFSET_R0600),
            Err(_) => (sym!("hipGetDeviceProperties")?, ARCH_OFFSET_R0000),
        };
        Ok(Runtime {
            init: sym!("hipInit")?,
            device_count: sym!("hipGetDeviceCount")?,
            runtime_version: sym!("hipRuntimeGetVersion")?,
            error_string: sym!("hipGetErrorString")?,
            set_device: sym!("hipSetDevice")?,
            device_name: sym!("hipDeviceGetName")?,
            properties,
            stream_create: sym!("hipStreamCreate")?,
            stream_synchronize: sym!("hipStreamSynchronize")?,
            malloc: sym!("hipMalloc")?,
            htod: sym!("hipMemcpyHtoDAsync")?,
            dtoh: sym!("hipMemcpyDtoHAsync")?,
            dtod: sym!("hipMemcpyDtoDAsync")?,
            module_load_data: sym!("hipModuleLoadData")?,
            module_get_function: sym!("hipModuleGetFunction")?,
            launch: sym!("hipModuleLaunchKernel")?,
            path,
            _lib: lib,
        })
    }

    /// `Ok` for `hipSuccess`, else an error naming the call and the runtime's words for `status`.
    fn check(&self, status: Status, call: &str) -> Result<(), String> {
        crate::dynlib::check(status, call, self.error_string)
    }

    /// The runtime's version as `major.minor` (`hipRuntimeGetVersion`: major * 10^7 + minor * 10^5 + patch).
    pub(super) fn version(&self) -> String {
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { (self.runtime_version)(&mut v) } {
            0 => format!("{}.{}", v / 10_000_000, v / 100_000 % 100),
            _ => "unknown".into(),
        }
    }

    /// Starts the runtime and counts the GPUs it sees (0 where it reports none).
    pub(super) fn device_count(&self) -> Result<usize, String> {
        // SAFETY: hipInit takes flags (0) and may be called more than once. Its status is not checked on its own:
        // ROCm 5 reports a machine without GPUs as `hipErrorInvalidDevice` here, and the count below says the same
        // in plainer words.
        unsafe { (self.init)(0) };
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { (self.device_count)(&mut n) } {
            NO_DEVICE => Ok(0),
            status => self.check(status, "hipGetDeviceCount").map(|()| n.max(0) as usize),
        }
    }

    /// Makes `device` the calling thread's current device (the HIP runtime's state is per thread).
    pub(super) fn set_device(&self, device: usize) -> Result<(), String> {
        // SAFETY: plain call with an ordinal below the device count (checked when the device opened).
        self.check(unsafe { (self.set_device)(device as c_int) }, "hipSetDevice")
    }

    /// The device's marketing name.
    pub(super) fn name(&self, device: usize) -> Result<String, String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the runtime writes a NUL-terminated name into it.
        let status = unsafe { (self.device_name)(buf.as_mut_ptr(), buf.len() as c_int, device as c_int) };
        self.check(status, "hipDeviceGetName")?;
        buf[255] = 0;
        // SAFETY: NUL-terminated within the buffer (its last byte is 0).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// The device's architecture as hiprtc's `--offload-arch` takes it (`gfx90a:sramecc+:xnack-`); `None` when the
    /// properties do not hold one (the caller says to set `KILN_HIP_ARCH`).
    pub(super) fn arch(&self, device: usize) -> Result<Option<String>, String> {
        let mut props = vec![0u64; PROPS_BYTES / 8];
        let (get, offset) = self.properties;
        // SAFETY: the buffer is larger than either layout of the properties struct, zeroed, and 8-byte aligned
        // (u64s) as the struct's widest fields need.
        self.check(unsafe { get(props.as_mut_ptr().cast(), device as c_int) }, "hipGetDeviceProperties")?;
        let bytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let name = &bytes[offset..offset + 256];
        let end = name.iter().position(|&b| b == 0).unwrap_or(0);
        let text = std::str::from_utf8(&name[..end]).unwrap_or("");
        Ok(text.starts_with("gfx").then(|| text.to_string()))
    }

    pub(super) fn stream(&self) -> Result<Stream, String> {
        let mut s: Stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the stream is created on the current device.
        self.check(unsafe { (self.stream_create)(&mut s) }, "hipStreamCreate")?;
        Ok(s)
    }

    pub(super) fn synchronize(&self, stream: Stream) -> Result<(), String> {
        // SAFETY: a stream this runtime created, never destroyed (it lives as long as the device).
        self.check(unsafe { (self.stream_synchronize)(stream) }, "hipStreamSynchronize")
    }

    pub(super) fn malloc(&self, bytes: usize) -> Result<DevicePtr, String> {
        let mut p: DevicePtr = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        self.check(unsafe { (self.malloc)(&mut p, bytes) }, "hipMalloc")?;
        Ok(p)
    }

    /// Queues a copy of `src` to `dst` and waits for the stream: the host bytes need not outlive the call.
    ///
    /// # Safety
    /// `dst` is device memory of at least `src.len()` bytes.
    pub(super) unsafe fn write(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<(), String> {
        // SAFETY: the caller's contract for `dst`; `src` is read until the synchronize below returns.
        self.check(unsafe { (self.htod)(dst, src.as_ptr() as *mut c_void, src.len(), stream) }, "hipMemcpyHtoDAsync")?;
        self.synchronize(stream)
    }

    /// Copies `dst.len()` bytes from `src` after the stream's earlier work, and waits for it.
    ///
    /// # Safety
    /// `src` is device memory of at least `dst.len()` bytes.
    pub(super) unsafe fn read(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<(), String> {
        // SAFETY: the caller's contract for `src`; `dst` is written until the synchronize below returns.
        self.check(unsafe { (self.dtoh)(dst.as_mut_ptr().cast(), src, dst.len(), stream) }, "hipMemcpyDtoHAsync")?;
        self.synchronize(stream)
    }

    /// Queues a device-to-device copy of `bytes`.
    ///
    /// # Safety
    /// Both are device memory of at least `bytes` bytes.
    pub(super) unsafe fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), String> {
        // SAFETY: the caller's contract.
        self.check(unsafe { (self.dtod)(dst, src, bytes, stream) }, "hipMemcpyDtoDAsync")
    }

    /// Loads a code object and looks up kernel `name` in it (the module stays loaded for the process).
    pub(super) fn load(&self, code: &[u8], name: &str) -> Result<Function, String> {
        let cname = std::ffi::CString::new(name).map_err(|_| "a NUL byte in a kernel name".to_string())?;
        let mut module: Module = std::ptr::null_mut();
        // SAFETY: `code` is a whole code object hiprtc produced; the runtime copies what it keeps.
        self.check(unsafe { (self.module_load_data)(&mut module, code.as_ptr().cast()) }, "hipModuleLoadData")?;
        let mut f: Function = std::ptr::null_mut();
        // SAFETY: a module loaded above and a NUL-terminated name.
        self.check(unsafe { (self.module_get_function)(&mut f, module, cname.as_ptr()) }, "hipModuleGetFunction")?;
        Ok(f)
    }

    /// Queues `f` over `grid` blocks of `block` threads; `params` are its arguments' values (device addresses).
    ///
    /// # Safety
    /// `params` are exactly `f`'s parameters, each live device memory covering what the kernel indexes.
    pub(super) unsafe fn launch(
        &self,
        f: Function,
        grid: (u32, u32),
        block: u32,
        params: &[u64],
        stream: Stream,
    ) -> Result<(), String> {
        // The runtime reads each argument through a pointer to it.
        let mut ptrs: smallvec::SmallVec<[*mut c_void; 16]> =
            params.iter().map(|p| p as *const u64 as *mut c_void).collect();
        // SAFETY: the caller's contract; `ptrs` and `params` outlive the call, which copies the arguments.
        let status = unsafe {
            (self.launch)(f, grid.0, grid.1, 1, block, 1, 1, 0, stream, ptrs.as_mut_ptr(), std::ptr::null_mut())
        };
        self.check(status, "hipModuleLaunchKernel")
    }
}
