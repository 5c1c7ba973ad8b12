//! The CPU's scatter-sum routine (`kiln_jit::kernel::scatter`), in Rust: the pool splits the output rows, and each
//! chunk zeroes its rows, then walks every index in row order and adds the source rows (or elements) that land in
//! its range. A row add is a loop over contiguous memory that the compiler vectorizes. Each element's adds keep row
//! order on any thread count, so the result is the same bits as the reference and the other devices.
//!
//! Every chunk reads every index (4 or 8 bytes per source row, against the row's W values it may add): with a
//! chunk per thread that is a few passes over the indices, not one per output row.

use super::pool;
use super::routines::claim;
use kiln_jit::DType;
use kiln_jit::kernel::FAULT_WORDS;
use kiln_jit::kernel::fault::FAULT_SCATTER_INDEX;
use kiln_jit::kernel::scatter::ScatterRows;
use std::sync::atomic::AtomicI64;

/// Raw buffer pointers shared with the pool threads for one launch.
struct Bufs {
    index: *const u8,
    vals: *const u8,
    out: *mut u8,
}

// SAFETY: the indices and values are only read; each pool task writes only its own range of output rows, and the
// launch returns before the buffers are used again.
unsafe impl Sync for Bufs {}

/// Runs `s` with `ptrs` = the index buffer, the values, then the output (each sized as `s.kernel()` declares).
///
/// # Safety
/// Every pointer is valid for its buffer's length in its dtype, the output is not an input, and nothing else touches
/// the buffers while this runs.
pub(super) unsafe fn run(s: &ScatterRows, ptrs: &[*mut u8], fault: &[AtomicI64; FAULT_WORDS]) {
    let bufs = Bufs { index: ptrs[0], vals: ptrs[1], out: ptrs[2] };
    let call = |start: usize, end: usize| {
        // SAFETY: the caller's contract; this task writes output rows `start..end` only.
        unsafe {
            match (s.dtype, s.index) {
                (DType::F32, DType::I32) => rows::<f32, i32>(s, &bufs, start, end, fault),
                (DType::F32, DType::I64) => rows::<f32, i64>(s, &bufs, start, end, fault),
                (DType::F64, DType::I32) => rows::<f64, i32>(s, &bufs, start, end, fault),
                (DType::F64, DType::I64) => rows::<f64, i64>(s, &bufs, start, end, fault),
                (d, i) => {
                    unreachable!("the graph check keeps scatters to f32/f64 values and i32/i64 indices, not {d}/{i}")
                }
            }
        }
    };
    pool::global().parallel_for_work(s.positions, s.work(), &call);
}

/// Output rows `start..end` of the launch.
///
/// # Safety
/// As [`run`], with `T` the values' dtype and `I` the indices'.
unsafe fn rows<T, I>(s: &ScatterRows, bufs: &Bufs, start: usize, end: usize, fault: &[AtomicI64; FAULT_WORDS])
where
    T: Copy + Default + std::ops::AddAssign,
    I: Copy + Into<i64>,
{
    let (w, cols) = (s.width, s.index_cols());
    // SAFETY: (caller) the buffers hold these many elements of `I` and `T`; rows `start..end` of the output are
    // this task's alone.
    let (index, vals, out) = unsafe {
        (
            std::slice::from_raw_parts(bufs.index as *const I, s.rows * cols),
            std::slice::from_raw_parts(bufs.vals as *const T, s.rows * w),
            std::slice::from_raw_parts_mut((bufs.out as *mut T).add(start * w), (end - start) * w),
        )
    };
    out.fill(T::default());
    let range = start as i64..end as i64;
    for (t, src) in vals.chunks_exact(w.max(1)).enumerate().take(s.rows) {
        let at = &index[t * cols..(t + 1) * cols];
        if cols == 1 {
            let p: i64 = at[0].into();
            if range.contains(&p) {
                let row = &mut out[(p - start as i64) as usize * w..][..w];
                row.iter_mut().zip(src).for_each(|(o, &v)| *o += v);
            } else if start == 0 && !(0..s.positions as i64).contains(&p) {
                claim(fault, FAULT_SCATTER_INDEX, s.positions as i64, p);
            }
            continue;
        }
        for (c, (&i, &v)) in at.iter().zip(src).enumerate() {
            let p: i64 = i.into();
            if range.contains(&p) {
                out[(p - start as i64) as usize * w + c] += v;
            } else if start == 0 && !(0..s.positions as i64).contains(&p) {
                claim(fault, FAULT_SCATTER_INDEX, s.positions as i64, p);
            }
        }
    }
}
