//! The CPU's row sort routine (`kiln_jit::kernel::sort`), in Rust: the pool splits the rows, and each row's
//! elements become order keys, unsigned integers whose order is the module doc's order of the values (floats
//! through their bits with `-0` made `+0` and every NaN above `+inf`; signed integers with the sign bit flipped; all
//! of it inverted for a descending sort), each paired with its index so that equal keys order by index: the stable
//! sort's result, the same on every run.
//!
//! Values of at most 32 bits (every dtype but f64 and i64) take a 32-bit key, packed with the index into one u64
//! (`key << 32 | index`) and sorted by an LSD radix sort over the key's four bytes (stable, so the indices, written
//! in order, stay in order within equal keys), or by `sort_unstable` for short rows, where the radix sort's passes
//! over its 256-entry counts cost more than comparing. f64 and i64 pair a 64-bit key with the index and compare.
//! Where fewer than all positions are kept (`topk`), `select_nth_unstable` first cuts the row to the kept ones,
//! which are then sorted: O(n + k log k) a row.
//!
//! A long row runs on one thread (a row of 32k f32 in about a tenth of a millisecond): splitting one row between
//! threads would need a merge pass, not worth it at the row lengths models sort (vocabularies, top-k candidates).

use super::pool;
use kiln_jit::kernel::sort::SortRows;
use kiln_jit::{DType, bf16, f16};

/// Rows at least this long (and kept whole) take the radix sort; shorter ones are compared.
const RADIX_MIN: usize = 256;

/// Raw buffer pointers shared with the pool threads for one launch.
struct Bufs {
    vals: *const u8,
    out: *mut u8,
}

// SAFETY: the values are only read; each pool task writes only its own rows of the output, and the launch returns
// before the buffers are used again.
unsafe impl Sync for Bufs {}

/// Runs `s` with `ptrs` = the values, then the output (each sized as `s.kernel()` declares).
///
/// # Safety
/// Every pointer is valid for its buffer's length in its dtype, the output is not an input, and nothing else touches
/// the buffers while this runs.
pub(super) unsafe fn run(s: &SortRows, ptrs: &[*mut u8]) {
    let bufs = Bufs { vals: ptrs[0], out: ptrs[1] };
    let wide = matches!(s.dtype, DType::F64 | DType::I64);
    let call = |start: usize, end: usize| {
        let bufs = &bufs; // the whole struct (Sync), not its pointer fields
        let (mut packed, mut scratch, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
        for r in start..end {
            let at = r * s.n;
            // SAFETY: the caller's contract; row `r` is `n` values, and this task owns its output row.
            unsafe {
                let first = r * s.keep;
                if wide {
                    pairs.clear();
                    pairs.extend(
                        (0..s.n).map(|i| (wide_key(s.dtype, bufs.vals, at + i) ^ flip(s.descending), i as u32)),
                    );
                    kept_sorted(&mut pairs, s.keep);
                    write(s, bufs.out, first, pairs[..s.keep].iter().map(|&(_, i)| i));
                } else {
                    let f = flip(s.descending) << 32;
                    packed.clear();
                    packed.extend(
                        (0..s.n).map(|i| ((narrow_key(s.dtype, bufs.vals, at + i) as u64) << 32 | i as u64) ^ f),
                    );
                    if s.keep == s.n && s.n >= RADIX_MIN {
                        radix_sort_high_half(&mut packed, &mut scratch);
                    } else {
                        kept_sorted(&mut packed, s.keep);
                    }
                    write(s, bufs.out, first, packed[..s.keep].iter().map(|&p| p as u32));
                }
            }
        }
    };
    pool::global().parallel_for_work(s.rows, s.work(), &call);
}

/// Sorts the `keep` smallest of `items` into `items[..keep]` (all of them when `keep` is their count).
fn kept_sorted<T: Ord>(items: &mut [T], keep: usize) {
    if keep == 0 {
        return;
    }
    if keep < items.len() {
        items.select_nth_unstable(keep - 1);
    }
    items[..keep].sort_unstable();
}

/// Sorts `items` by their high 32 bits, stably: four counting passes, a byte each, lowest first.
fn radix_sort_high_half(items: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    scratch.clear();
    scratch.resize(items.len(), 0);
    for shift in [32, 40, 48, 56] {
        let mut counts = [0usize; 256];
        for &x in items.iter() {
            counts[(x >> shift) as usize & 0xff] += 1;
        }
        // A byte every item shares moves nothing: skip the pass.
        if counts.contains(&items.len()) {
            continue;
        }
        let mut next = 0;
        for c in counts.iter_mut() {
            (*c, next) = (next, next + *c);
        }
        for &x in items.iter() {
            let b = (x >> shift) as usize & 0xff;
            scratch[counts[b]] = x;
            counts[b] += 1;
        }
        std::mem::swap(items, scratch);
    }
}

/// What a key is xor-ed with: all ones (reversing the order) for a descending sort.
fn flip(descending: bool) -> u64 {
    if descending { u64::MAX } else { 0 }
}

/// The 32-bit order key of element `i` of a buffer of `d` values (every dtype of at most 32 bits).
///
/// # Safety
/// `vals` holds at least `i + 1` values of `d`.
unsafe fn narrow_key(d: DType, vals: *const u8, i: usize) -> u32 {
    // SAFETY: the caller's contract.
    unsafe {
        match d {
            DType::F32 => f32_key(*(vals as *const f32).add(i)),
            // Exact in f32, so their f32 keys order them.
            DType::F16 => f32_key((*(vals as *const f16).add(i)).to_f32()),
            DType::BF16 => f32_key((*(vals as *const bf16).add(i)).to_f32()),
            DType::I32 => *(vals as *const i32).add(i) as u32 ^ 1 << 31,
            DType::U32 => *(vals as *const u32).add(i),
            DType::U8 | DType::Bool => *vals.add(i) as u32,
            DType::F64 | DType::I64 => unreachable!("64-bit values take wide_key"),
        }
    }
}

/// The 64-bit order key of element `i` of a buffer of f64 or i64 values.
///
/// # Safety
/// `vals` holds at least `i + 1` values of `d`.
unsafe fn wide_key(d: DType, vals: *const u8, i: usize) -> u64 {
    // SAFETY: the caller's contract.
    unsafe {
        match d {
            DType::F64 => f64_key(*(vals as *const f64).add(i)),
            DType::I64 => *(vals as *const i64).add(i) as u64 ^ 1 << 63,
            _ => unreachable!("narrow values take narrow_key"),
        }
    }
}

/// A float's key: its bits, negatives inverted and non-negatives offset above them, so unsigned order is numeric
/// order; `-0` is `+0`'s key and every NaN the largest key, above `+inf`'s.
fn f64_key(x: f64) -> u64 {
    if x.is_nan() {
        return u64::MAX;
    }
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 63 == 1 { !bits } else { bits | 1 << 63 }
}

/// [`f64_key`] in 32 bits, for f32.
fn f32_key(x: f32) -> u32 {
    if x.is_nan() {
        return u32::MAX;
    }
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    if bits >> 31 == 1 { !bits } else { bits | 1 << 31 }
}

/// Writes a row's kept indices from element `first` of the output, in `s.index`.
///
/// # Safety
/// `out` holds `first` plus as many indices as `order` yields, and nothing else writes them.
unsafe fn write(s: &SortRows, out: *mut u8, first: usize, order: impl Iterator<Item = u32>) {
    // SAFETY: the caller's contract.
    unsafe {
        match s.index {
            DType::I64 => write_as(out as *mut i64, first, order),
            DType::I32 => write_as(out as *mut i32, first, order),
            d => unreachable!("the graph check keeps sort results to i32 and i64, not {d}"),
        }
    }
}

/// [`write`] in index type `I`.
///
/// # Safety
/// As [`write`].
unsafe fn write_as<I: TryFrom<u32>>(out: *mut I, first: usize, order: impl Iterator<Item = u32>) {
    for (j, i) in order.enumerate() {
        // Indices are below the row length, which `Tensor::sort` keeps below 2^24.
        let Ok(i) = I::try_from(i) else { unreachable!("an index past the result dtype") };
        // SAFETY: the caller's contract.
        unsafe { *out.add(first + j) = i };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_keys_order_as_numbers_with_nan_last_and_zeros_equal() {
        let xs = [f64::NEG_INFINITY, -1e300, -1.0, -f64::MIN_POSITIVE / 2.0, 0.0, 5e-324, 1.0, f64::INFINITY];
        let keys: Vec<u64> = xs.iter().map(|&x| f64_key(x)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:x?}");
        assert_eq!(f64_key(-0.0), f64_key(0.0));
        assert_eq!(f64_key(f64::NAN), f64_key(-f64::NAN));
        assert!(f64_key(f64::NAN) > f64_key(f64::INFINITY));
        let xs = [f32::NEG_INFINITY, -1e30, -1.0, -1e-45, 0.0, 1e-45, 1.0, f32::INFINITY];
        let keys: Vec<u32> = xs.iter().map(|&x| f32_key(x)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:x?}");
        assert_eq!(f32_key(-0.0), f32_key(0.0));
        assert!(f32_key(-f32::NAN) > f32_key(f32::INFINITY));
    }

    #[test]
    fn the_radix_sort_orders_by_the_high_half_and_keeps_ties_in_order() {
        let mut state = 7u64;
        let mut items: Vec<u64> = (0..5000u64)
            .map(|i| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                // Few distinct keys, so long runs of ties; the low half is the position.
                ((state >> 40) % 300) << 32 | i
            })
            .collect();
        let mut want = items.clone();
        want.sort();
        radix_sort_high_half(&mut items, &mut Vec::new());
        assert_eq!(items, want);
    }

    #[test]
    fn kept_sorted_keeps_the_smallest_in_order() {
        let mut v = vec![9, 3, 7, 1, 8, 2];
        kept_sorted(&mut v, 3);
        assert_eq!(&v[..3], [1, 2, 3]);
        kept_sorted(&mut v, 0);
        kept_sorted(&mut v, 6);
        assert_eq!(v, [1, 2, 3, 7, 8, 9]);
    }
}
