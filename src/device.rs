//! Devices as the user names them, and the backend that serves each. A tensor lives on one device; moving it is a
//! call the user writes, and no op ever runs on a device other than its operands'.

use kiln_backends::Backend;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU: the default device, needing nothing installed.
    #[default]
    Cpu,
}

impl Device {
    pub fn cpu() -> Device {
        Device::Cpu
    }

    /// A stable code for signatures and cache keys.
    pub(crate) fn code(self) -> u64 {
        match self {
            Device::Cpu => 1,
        }
    }

    pub(crate) fn backend(self) -> &'static dyn Backend {
        match self {
            Device::Cpu => {
                static CPU: kiln_backends::cpu::CpuBackend = kiln_backends::cpu::CpuBackend;
                &CPU
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
