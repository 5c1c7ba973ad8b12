//! Devices as the user names them, and the backend that serves each. A tensor lives on one device; moving it is a
//! call the user writes (`Tensor::to_device`), and no op ever runs on a device other than its operands'.
//!
//! Each device is a cargo feature, both on by default, and either builds alone. `Device::cpu()` (feature `cpu`)
//! needs nothing installed. `Device::wgpu()` (feature `wgpu`) opens the process's wgpu device on first call and
//! returns an error naming what to install when there is no adapter. The `Wgpu` variant is only handed out by
//! `Device::wgpu()`, so a `Device` value always names a device that exists; a build without `cpu` has no `Cpu`
//! variant, and no default device.
//!
//! `Device::cuda(i)` (feature `cuda`, off by default) opens CUDA device `i` through the driver loaded at run time;
//! no driver, no such device or no NVRTC is an error that says what is missing. `Device::hip(i)` (feature `hip`,
//! off by default) does the same for AMD GPUs through the HIP runtime and hiprtc.
//!
//! This is the one place the crate names a device's module: to get its `Backend`, and what only that device can
//! say about itself (the wgpu adapter and its dtypes).

use kiln_backends::{Backend, BackendError};
use kiln_jit::DType;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "cpu", derive(Default))]
pub enum Device {
    /// The host CPU: the default device, needing nothing installed (cargo feature `cpu`).
    #[cfg(feature = "cpu")]
    #[default]
    Cpu,
    /// The wgpu device (WGSL compute shaders through Vulkan or GL): obtain it with `Device::wgpu()`.
    #[cfg(feature = "wgpu")]
    Wgpu(WgpuDevice),
    /// A CUDA GPU: obtain it with `Device::cuda(ordinal)`.
    #[cfg(feature = "cuda")]
    Cuda(CudaDevice),
    /// An AMD GPU through HIP: obtain it with `Device::hip(ordinal)`.
    #[cfg(feature = "hip")]
    Hip(HipDevice),
}

/// Proof that CUDA device `ordinal` was opened (only `Device::cuda` makes one).
#[cfg(feature = "cuda")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaDevice {
    ordinal: u16,
}

#[cfg(feature = "cuda")]
impl CudaDevice {
    /// The device's ordinal (what `Device::cuda` was given).
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
}

/// Proof that HIP device `ordinal` was opened (only `Device::hip` makes one).
#[cfg(feature = "hip")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipDevice {
    ordinal: u16,
}

#[cfg(feature = "hip")]
impl HipDevice {
    /// The device's ordinal (what `Device::hip` was given).
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
}

/// Proof that the wgpu device was opened (only `Device::wgpu()` makes one).
#[cfg(feature = "wgpu")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgpuDevice(());

impl Device {
    /// The host CPU (cargo feature `cpu`, on by default).
    #[cfg(feature = "cpu")]
    pub fn cpu() -> Device {
        Device::Cpu
    }

    /// The wgpu device, opening it on first call (Vulkan first, then GL; `WGPU_BACKEND` overrides). Without an
    /// adapter this is an error that says what to install (`mesa-vulkan-drivers libvulkan1` gives a CPU Vulkan
    /// device). Tensors of f64 or i64 cannot live there: WGSL has no 64-bit types; f16 only where the adapter
    /// has `SHADER_F16` (`supports` says).
    #[cfg(feature = "wgpu")]
    pub fn wgpu() -> crate::Result<Device> {
        kiln_backends::wgpu::backend()?;
        Ok(Device::Wgpu(WgpuDevice(())))
    }

    /// CUDA device `ordinal` (feature `cuda`), opening it on first call: kernels compile with NVRTC for its exact
    /// architecture. Without an NVIDIA driver, without a device of that ordinal, or without NVRTC (`KILN_NVRTC`
    /// names the library; else `libnvrtc.so.13` or `.12` on the loader's path) this is an error that says what to
    /// install. Every dtype can live there.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize) -> crate::Result<Device> {
        let Ok(small) = u16::try_from(ordinal) else {
            return Err(crate::Error::UnknownDevice(format!("cuda:{ordinal}")));
        };
        kiln_backends::cuda::backend(ordinal)?;
        Ok(Device::Cuda(CudaDevice { ordinal: small }))
    }

    /// HIP device `ordinal` (feature `hip`): an AMD GPU, opened on first call through the HIP runtime
    /// (`libamdhip64`, `KILN_HIP_RUNTIME` names the file); kernels compile with hiprtc (`KILN_HIPRTC`) for the
    /// architecture the device reports (else `KILN_HIP_ARCH`). Without the runtime, without a device of that
    /// ordinal, or without hiprtc this is an error that says what to install. Every dtype can live there. Not yet
    /// run on AMD hardware: the README says what was checked.
    #[cfg(feature = "hip")]
    pub fn hip(ordinal: usize) -> crate::Result<Device> {
        let Ok(small) = u16::try_from(ordinal) else {
            return Err(crate::Error::UnknownDevice(format!("hip:{ordinal}")));
        };
        kiln_backends::hip::backend(ordinal)?;
        Ok(Device::Hip(HipDevice { ordinal: small }))
    }

    /// The adapter behind this device, in words (`"cpu"` for the CPU).
    pub fn describe(&self) -> String {
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => "cpu".into(),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => kiln_backends::wgpu::backend().map_or_else(|e| e.to_string(), |b| b.adapter()),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => {
                kiln_backends::cuda::backend(d.ordinal()).map_or_else(|e| e.to_string(), |b| b.describe())
            }
            #[cfg(feature = "hip")]
            Device::Hip(d) => kiln_backends::hip::backend(d.ordinal()).map_or_else(|e| e.to_string(), |b| b.describe()),
        }
    }

    /// Waits until everything submitted to this device has finished. Results never need it (reading a value
    /// waits for it); timing does, on a device whose queue runs ahead of the host.
    pub fn synchronize(&self) -> crate::Result<()> {
        Ok(self.backend()?.synchronize()?)
    }

    /// Whether tensors of `dtype` can live on this device.
    pub fn supports(&self, dtype: DType) -> bool {
        let _ = dtype; // every dtype, in a build with the CPU only
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => true,
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => kiln_backends::wgpu::backend().is_ok_and(|b| b.supports(dtype)),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => true,
            #[cfg(feature = "hip")]
            Device::Hip(_) => true,
        }
    }

    /// Whether the device runs the row sort routine (`kernel::sort`); elsewhere `Tensor::sort` composes a sorting
    /// network from the kernel IR's ops. Not the CPU in a process that also compiles its plans for a GPU ahead of
    /// time (`KILN_CUDA_ARCH`, `KILN_HIP_ARCH`): a GPU run records the network, whose kernels the GPUs' renderers
    /// have, where the CPU would record the routine, which they do not, so the CPU records the network too and its
    /// kernels are among those compiled ahead of time (a build machine's run is not a timed one).
    pub(crate) fn sorts_rows(&self) -> bool {
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => !kiln_backends::gpu_cache::precompiling(),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => false,
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => false,
            #[cfg(feature = "hip")]
            Device::Hip(_) => false,
        }
    }

    /// The integer dtype of indices computed inside composed ops (`eye`, `one_hot`): i64 as in PyTorch where the
    /// device has it, i32 elsewhere (the values are positions, far below 2^31).
    pub(crate) fn index_dtype(&self) -> DType {
        if self.supports(DType::I64) { DType::I64 } else { DType::I32 }
    }

    /// Why `dtype` cannot live here (`None` if it can).
    pub(crate) fn dtype_error(&self, dtype: DType) -> Option<String> {
        let _ = dtype;
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => None,
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => (!self.supports(dtype)).then(|| kiln_backends::wgpu::unsupported(dtype).to_string()),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => None,
            #[cfg(feature = "hip")]
            Device::Hip(_) => None,
        }
    }

    /// A stable code for signatures and cache keys.
    pub(crate) fn code(self) -> u64 {
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => 1,
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => 2,
            // 3, 3 + 2^8, ...: one code per GPU, so plans are not shared between two of them.
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => 3 | (u64::from(d.ordinal) << 8),
            #[cfg(feature = "hip")]
            Device::Hip(d) => 4 | (u64::from(d.ordinal) << 8),
        }
    }

    pub(crate) fn backend(self) -> Result<&'static dyn Backend, BackendError> {
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => Ok(kiln_backends::cpu::backend()),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => Ok(kiln_backends::wgpu::backend()?),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Ok(kiln_backends::cuda::backend(d.ordinal())?),
            #[cfg(feature = "hip")]
            Device::Hip(d) => Ok(kiln_backends::hip::backend(d.ordinal())?),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "cpu")]
            Device::Cpu => f.write_str("cpu"),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => f.write_str("wgpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => write!(f, "cuda:{}", d.ordinal),
            #[cfg(feature = "hip")]
            Device::Hip(d) => write!(f, "hip:{}", d.ordinal),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = crate::Error;

    /// `"cpu"`, `"wgpu"`, `"cuda"` / `"cuda:N"` or `"hip"` / `"hip:N"` (for command-line flags such as the examples' `--device`); a
    /// device this build does not have is unknown.
    fn from_str(s: &str) -> crate::Result<Device> {
        match s {
            #[cfg(feature = "cpu")]
            "cpu" => Ok(Device::cpu()),
            #[cfg(feature = "wgpu")]
            "wgpu" => Device::wgpu(),
            #[cfg(feature = "cuda")]
            "cuda" => Device::cuda(0),
            #[cfg(feature = "cuda")]
            other if other.strip_prefix("cuda:").is_some_and(|n| n.parse::<usize>().is_ok()) => {
                Device::cuda(other["cuda:".len()..].parse().unwrap_or(usize::MAX))
            }
            #[cfg(feature = "hip")]
            "hip" => Device::hip(0),
            #[cfg(feature = "hip")]
            other if other.strip_prefix("hip:").is_some_and(|n| n.parse::<usize>().is_ok()) => {
                Device::hip(other["hip:".len()..].parse().unwrap_or(usize::MAX))
            }
            other => Err(crate::Error::UnknownDevice(other.to_string())),
        }
    }
}
