//! Raw views of host buffers for generated code: the pointers kernels read and write through, and marking an
//! output's elements written once a plan's launches have stored them.

use kiln_jit::buffer::HostBuffer;
use kiln_jit::kernel::KernelIr;

/// Checks `inputs` against the buffers kernel `k` reads (count, dtype, at least the declared length): what a
/// kernel run outside a plan (a forced GEMM or elementwise kernel in a test) must hold before its pointers are used.
pub(crate) fn check_inputs(k: &KernelIr, inputs: &[&HostBuffer]) -> Result<(), String> {
    if inputs.len() != k.inputs.len() {
        return Err(format!("{} inputs given, the kernel reads {}", inputs.len(), k.inputs.len()));
    }
    for (b, p) in inputs.iter().zip(&k.inputs) {
        if b.dtype() != p.dtype || b.len() < p.len {
            return Err(format!("an input is {}[{}], the kernel wants {}[{}]", b.dtype(), b.len(), p.dtype, p.len));
        }
    }
    Ok(())
}

/// Marks `len` elements of an output written.
///
/// # Safety
/// The plan's launches must have written all `len` elements, each with a valid value of the element type.
pub(crate) unsafe fn finish_output(b: &mut HostBuffer, len: usize) {
    // SAFETY: the caller guarantees all `len` elements were written; capacity is `len` (output_with_capacity).
    unsafe {
        match b {
            HostBuffer::Bool(v) => v.set_len(len),
            HostBuffer::U8(v) => v.set_len(len),
            HostBuffer::U32(v) => v.set_len(len),
            HostBuffer::I32(v) => v.set_len(len),
            HostBuffer::I64(v) => v.set_len(len),
            HostBuffer::F16(v) => v.set_len(len),
            HostBuffer::BF16(v) => v.set_len(len),
            HostBuffer::F32(v) => v.set_len(len),
            HostBuffer::F64(v) => v.set_len(len),
        }
    }
}

/// A pointer kernels only read through.
pub(crate) fn read_ptr(b: &HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_ptr() as *mut u8,
        HostBuffer::U32(v) => v.as_ptr() as *mut u8,
        HostBuffer::I32(v) => v.as_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_ptr() as *mut u8,
        HostBuffer::F16(v) => v.as_ptr() as *mut u8,
        HostBuffer::BF16(v) => v.as_ptr() as *mut u8,
        HostBuffer::F32(v) => v.as_ptr() as *mut u8,
        HostBuffer::F64(v) => v.as_ptr() as *mut u8,
    }
}

/// A pointer kernels write through.
pub(crate) fn write_ptr(b: &mut HostBuffer) -> *mut u8 {
    match b {
        HostBuffer::Bool(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::U8(v) => v.as_mut_ptr(),
        HostBuffer::U32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::I32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::I64(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F16(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::BF16(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F32(v) => v.as_mut_ptr() as *mut u8,
        HostBuffer::F64(v) => v.as_mut_ptr() as *mut u8,
    }
}
