//! A pool of freed host buffers, so a step that replays a plan reuses the memory the previous step released
//! instead of asking the allocator for fresh pages: a fresh 64 MiB allocation is mmapped and page-faults on first
//! write (tens of ms, more than the kernel that fills it). Buffers are keyed by dtype and exact capacity, which is
//! what a replayed plan asks for again. Small buffers (under `MIN_BYTES`) go back to malloc, which is fast for
//! them; the pool holds at most `MAX_BYTES` in total and drops what would exceed it.
//!
//! One uncontended lock per buffer allocated or freed, never per kernel.

use kiln_jit::{DType, HostBuffer};
use parking_lot::Mutex;
use std::collections::HashMap;

const MIN_BYTES: usize = 64 << 10;
const MAX_BYTES: usize = 1 << 30;

#[derive(Default)]
struct Pool {
    free: HashMap<(DType, usize), Vec<HostBuffer>>,
    bytes: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn capacity(b: &HostBuffer) -> usize {
    match b {
        HostBuffer::Bool(v) => v.capacity(),
        HostBuffer::U8(v) => v.capacity(),
        HostBuffer::U32(v) => v.capacity(),
        HostBuffer::I32(v) => v.capacity(),
        HostBuffer::I64(v) => v.capacity(),
        HostBuffer::F16(v) => v.capacity(),
        HostBuffer::F32(v) => v.capacity(),
        HostBuffer::F64(v) => v.capacity(),
    }
}

fn clear(b: &mut HostBuffer) {
    match b {
        HostBuffer::Bool(v) => v.clear(),
        HostBuffer::U8(v) => v.clear(),
        HostBuffer::U32(v) => v.clear(),
        HostBuffer::I32(v) => v.clear(),
        HostBuffer::I64(v) => v.clear(),
        HostBuffer::F16(v) => v.clear(),
        HostBuffer::F32(v) => v.clear(),
        HostBuffer::F64(v) => v.clear(),
    }
}

/// An empty buffer (length 0) with capacity for exactly `len` elements of `dtype`, recycled when one is free.
pub fn take(dtype: DType, len: usize) -> HostBuffer {
    if len * dtype.size_of() >= MIN_BYTES
        && let Some(pool) = POOL.lock().as_mut()
        && let Some(b) = pool.free.get_mut(&(dtype, len)).and_then(Vec::pop)
    {
        pool.bytes -= len * dtype.size_of();
        return b;
    }
    match dtype {
        DType::Bool => HostBuffer::Bool(Vec::with_capacity(len)),
        DType::U8 => HostBuffer::U8(Vec::with_capacity(len)),
        DType::U32 => HostBuffer::U32(Vec::with_capacity(len)),
        DType::I32 => HostBuffer::I32(Vec::with_capacity(len)),
        DType::I64 => HostBuffer::I64(Vec::with_capacity(len)),
        DType::F16 => HostBuffer::F16(Vec::with_capacity(len)),
        DType::F32 => HostBuffer::F32(Vec::with_capacity(len)),
        DType::F64 => HostBuffer::F64(Vec::with_capacity(len)),
    }
}

/// Returns a buffer's memory to the pool (or to the allocator if it is small or the pool is full).
pub fn give(mut b: HostBuffer) {
    let (dtype, cap) = (b.dtype(), capacity(&b));
    let bytes = cap * dtype.size_of();
    if bytes < MIN_BYTES {
        return;
    }
    clear(&mut b);
    let mut guard = POOL.lock();
    let pool = guard.get_or_insert_with(Pool::default);
    if pool.bytes + bytes <= MAX_BYTES {
        pool.bytes += bytes;
        pool.free.entry((dtype, cap)).or_default().push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_large_buffer_is_reused() {
        let n = 1 << 20;
        let b = take(DType::F32, n);
        let HostBuffer::F32(v) = &b else { panic!("dtype") };
        let ptr = v.as_ptr();
        give(b);
        let again = take(DType::F32, n);
        let HostBuffer::F32(v) = &again else { panic!("dtype") };
        assert_eq!(v.as_ptr(), ptr);
        assert_eq!(v.len(), 0);
        assert_eq!(v.capacity(), n);
    }
}
