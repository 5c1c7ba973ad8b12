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
//! Where fewer than all positions are kept (`topk`), the row's keys are filtered against the worst of the best `k`
//! seen so far ([`kept_smallest`]): a block of the row is compared with that threshold in vector registers (f32
//! values as floats, with no key computed; other dtypes as keys) and only the few that pass are keyed, packed and
//! kept, cut back to `k` by `select_nth_unstable` whenever they fill a buffer, then the `k` are sorted. On a random
//! row of `n` the candidates number about `k ln(n / k)`, so the row costs one vectorized pass over its values (a
//! 32000-wide row of logits, top 50: ~400 candidates); the worst case (a row already in the kept order, every key a
//! candidate) stays O(n): a selection over `2k` candidates per `k` of them.
//!
//! A long row runs on one thread (a row of 32k f32 in about a tenth of a millisecond): splitting one row between
//! threads would need a merge pass, not worth it at the row lengths models sort (vocabularies, top-k candidates).

use super::pool;
use kiln_jit::kernel::sort::SortRows;
use kiln_jit::{DType, bf16, f16};
use std::ops::Range;

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
        let (mut keys, mut packed, mut scratch, mut pairs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in start..end {
            let at = r * s.n;
            let first = r * s.keep;
            if wide {
                pairs.clear();
                // SAFETY: the caller's contract; row `r` is `n` values, and this task owns its output row.
                unsafe {
                    pairs.extend(
                        (0..s.n).map(|i| (wide_key(s.dtype, bufs.vals, at + i) ^ flip(s.descending), i as u32)),
                    );
                    kept_sorted(&mut pairs, s.keep);
                    write(s, bufs.out, first, pairs[..s.keep].iter().map(|&(_, i)| i));
                }
                continue;
            }
            let f = flip(s.descending) as u32;
            if s.keep < s.n && s.dtype == DType::F32 {
                // A top k of f32 compares the floats themselves and keys only the few that pass.
                // SAFETY: as above.
                let row = unsafe { std::slice::from_raw_parts((bufs.vals as *const f32).add(at), s.n) };
                let below = |b: Range<usize>, t| f32_block_below(&row[b], t, s.descending);
                kept_smallest(s.n, s.keep, |i| f32_key(row[i]) ^ f, below, &mut packed);
            } else {
                // SAFETY: as above.
                unsafe { narrow_keys(s.dtype, bufs.vals, at, s.n, f, &mut keys) };
                if s.keep < s.n {
                    let below = |b: Range<usize>, t| mask(&keys[b], |k| k < t);
                    kept_smallest(s.n, s.keep, |i| keys[i], below, &mut packed);
                } else {
                    packed.clear();
                    packed.extend(keys.iter().enumerate().map(|(i, &k)| pack(k, i)));
                    if s.n >= RADIX_MIN {
                        radix_sort_high_half(&mut packed, &mut scratch);
                    } else {
                        packed.sort_unstable();
                    }
                }
            }
            // SAFETY: as above.
            unsafe { write(s, bufs.out, first, packed[..s.keep].iter().map(|&p| p as u32)) };
        }
    };
    pool::global().parallel_for_work(s.rows, s.work(), &call);
}

/// How many keys [`kept_smallest`] tests against its threshold at once: one vectorized comparison pass giving a bit
/// per key, then scalar work only for the keys that passed.
const FILTER_BLOCK: usize = 64;

/// The `keep` smallest of `key(i) << 32 | i` over `i < n` (`0 < keep < n`), ascending, in `kept[..keep]`: the
/// smallest keys, ties in index order. `below(block, t)` gives the positions of `block` (at most 64) whose keys are
/// below `t` as a bit mask, reading the row in vector registers; `key` is asked only for those.
///
/// The first `keep` positions are candidates; a later position is one only if its key is below the threshold, the
/// largest key among the best `keep` candidates so far (an equal key loses the tie to the earlier index, so it can
/// never enter). The candidates are cut back to the best `keep` (which lowers the threshold) whenever they fill
/// `cap`.
fn kept_smallest(
    n: usize,
    keep: usize,
    key: impl Fn(usize) -> u32,
    below: impl Fn(Range<usize>, u32) -> u64,
    kept: &mut Vec<u64>,
) {
    debug_assert!(0 < keep && keep < n);
    // Small, so that the threshold tightens early: a stale one lets in every key below the worst of the first few.
    let cap = keep + keep.max(16);
    let cut = |kept: &mut Vec<u64>| {
        kept.select_nth_unstable(keep - 1);
        kept.truncate(keep);
        (kept[keep - 1] >> 32) as u32
    };
    kept.clear();
    kept.extend((0..keep).map(|i| pack(key(i), i)));
    let mut threshold = kept.iter().max().map_or(u32::MAX, |&p| (p >> 32) as u32);
    for start in (keep..n).step_by(FILTER_BLOCK) {
        let block = start..(start + FILTER_BLOCK).min(n);
        let mut passed = below(block, threshold);
        while passed != 0 {
            let i = start + passed.trailing_zeros() as usize;
            passed &= passed - 1;
            // The threshold may have dropped since the block was tested.
            let k = key(i);
            if k < threshold {
                kept.push(pack(k, i));
                if kept.len() == cap {
                    threshold = cut(kept);
                }
            }
        }
    }
    cut(kept);
    kept.sort_unstable();
}

/// Which of `xs` (a bit each) have f32 order keys below `t` once keys are xor-ed with [`flip`]`(descending)`: the
/// comparison [`kept_smallest`] asks of a block, made on the floats themselves (no key computed), so it is one or
/// two compares per element in vector registers. Exact, not a bound: a key's order is the numbers' order,
/// with `-0 == +0` as the float compare has it and NaN the largest key. `t` is a value's key, flipped (a threshold
/// is always the key of some element).
fn f32_block_below(xs: &[f32], t: u32, descending: bool) -> u64 {
    let t_key = t ^ flip(descending) as u32;
    if t_key == u32::MAX {
        // The threshold is NaN's key: below it (ascending) is every number; above it (descending) nothing.
        return if descending { 0 } else { mask(xs, |x| !x.is_nan()) };
    }
    // The number whose key `t_key` is (`f32_key` inverted; a zero's key gives +0).
    let bits = if t_key >> 31 == 1 { t_key ^ 1 << 31 } else { !t_key };
    let v = f32::from_bits(bits);
    // A key above `t_key` (descending): a larger number, or NaN; below it (ascending): a smaller number.
    if descending { f32_mask::<true>(xs, v) } else { f32_mask::<false>(xs, v) }
}

/// Bit `j` set where `xs[j] > v` or is NaN (`ABOVE`), or where `xs[j] < v`: four floats a compare and a
/// `movmskps` (SSE2, which every x86-64 core has), the few past a multiple of four one at a time.
fn f32_mask<const ABOVE: bool>(xs: &[f32], v: f32) -> u64 {
    use std::arch::x86_64::*;
    debug_assert!(xs.len() <= 64);
    let quads = xs.chunks_exact(4);
    let done = xs.len() - quads.remainder().len();
    let rest = quads.remainder();
    // (A full block has no rest, and a shift by 64 would overflow.)
    let mut m =
        if rest.is_empty() { 0 } else { mask(rest, |x| if ABOVE { x > v || x.is_nan() } else { x < v }) << done };
    // SAFETY: SSE2 is part of the x86-64 baseline; each load reads the four floats of one chunk.
    unsafe {
        let t = _mm_set1_ps(v);
        for (j, q) in quads.enumerate() {
            let x = _mm_loadu_ps(q.as_ptr());
            let pass = if ABOVE { _mm_or_ps(_mm_cmpgt_ps(x, t), _mm_cmpunord_ps(x, x)) } else { _mm_cmplt_ps(x, t) };
            m |= (_mm_movemask_ps(pass) as u64) << (4 * j);
        }
    }
    m
}

/// Bit `j` set where `pass(xs[j])` (at most 64 elements), built without branches so that it compiles to vector
/// compares.
fn mask<T: Copy>(xs: &[T], pass: impl Fn(T) -> bool) -> u64 {
    debug_assert!(xs.len() <= 64);
    xs.iter().enumerate().fold(0, |m, (j, &x)| m | (pass(x) as u64) << j)
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

/// Sorts `items` by their high 32 bits, stably: one pass counting all four bytes of the key, then a scatter pass per
/// byte, lowest first (a byte every item shares is skipped). Counting the four bytes together reads the row once
/// instead of four times; the digits stay bytes, so a scatter's 256 destinations stay within L1.
fn radix_sort_high_half(items: &mut Vec<u64>, scratch: &mut Vec<u64>) {
    scratch.clear();
    scratch.resize(items.len(), 0);
    let mut counts = [[0u32; 256]; 4];
    for &x in items.iter() {
        let k = (x >> 32) as u32;
        for (b, c) in counts.iter_mut().enumerate() {
            c[(k >> (8 * b)) as usize & 0xff] += 1;
        }
    }
    for (b, c) in counts.iter_mut().enumerate() {
        // A byte every item shares moves nothing: skip the pass.
        if c.contains(&(items.len() as u32)) {
            continue;
        }
        let mut next = 0;
        for slot in c.iter_mut() {
            (*slot, next) = (next, next + *slot);
        }
        let shift = 32 + 8 * b;
        for &x in items.iter() {
            let d = (x >> shift) as usize & 0xff;
            scratch[c[d] as usize] = x;
            c[d] += 1;
        }
        std::mem::swap(items, scratch);
    }
}

/// A 32-bit key and its element's index as one u64 (`key << 32 | index`): ordered by key, then by index.
fn pack(key: u32, index: usize) -> u64 {
    (key as u64) << 32 | index as u64
}

/// What a key is xor-ed with: all ones (reversing the order) for a descending sort.
fn flip(descending: bool) -> u64 {
    if descending { u64::MAX } else { 0 }
}

/// The 32-bit order keys of `n` values of `d` (every dtype of at most 32 bits) from element `at` of `vals`, each
/// xor-ed with `flip`, into `keys` (cleared first). One loop per dtype, so each is a vector loop.
///
/// # Safety
/// `vals` holds at least `at + n` values of `d`.
unsafe fn narrow_keys(d: DType, vals: *const u8, at: usize, n: usize, flip: u32, keys: &mut Vec<u32>) {
    /// The row as a slice of `T`.
    ///
    /// # Safety
    /// As [`narrow_keys`], with `T` the Rust type of `d`.
    unsafe fn row<'a, T>(vals: *const u8, at: usize, n: usize) -> &'a [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts((vals as *const T).add(at), n) }
    }
    keys.clear();
    // SAFETY: the caller's contract, each dtype read as its Rust type.
    unsafe {
        match d {
            DType::F32 => keys.extend(row::<f32>(vals, at, n).iter().map(|&x| f32_key(x) ^ flip)),
            // Exact in f32, so their f32 keys order them.
            DType::F16 => keys.extend(row::<f16>(vals, at, n).iter().map(|x| f32_key(x.to_f32()) ^ flip)),
            DType::BF16 => keys.extend(row::<bf16>(vals, at, n).iter().map(|x| f32_key(x.to_f32()) ^ flip)),
            DType::I32 => keys.extend(row::<i32>(vals, at, n).iter().map(|&x| x as u32 ^ 1 << 31 ^ flip)),
            DType::U32 => keys.extend(row::<u32>(vals, at, n).iter().map(|&x| x ^ flip)),
            DType::U8 | DType::Bool => keys.extend(row::<u8>(vals, at, n).iter().map(|&x| x as u32 ^ flip)),
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
            _ => unreachable!("narrow values take narrow_keys"),
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
/// Written without early returns, as selects, so that a loop over a row vectorizes.
fn f32_key(x: f32) -> u32 {
    let bits = if x == 0.0 { 0 } else { x.to_bits() };
    // All ones for a negative (inverting it), else the sign bit (lifting it above every negative).
    let key = bits ^ ((bits as i32 >> 31) as u32 | 1 << 31);
    if x.is_nan() { u32::MAX } else { key }
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
        // Keys over all four bytes, with ties (a third of the items share one key).
        let mut items: Vec<u64> = (0..5000u64)
            .map(|i| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let k = if i % 3 == 0 { 0x00ab_1234 } else { (state >> 32) as u32 & 0xff00_ffff | 0x0033_0000 };
                pack(k, i as usize)
            })
            .collect();
        let mut want = items.clone();
        want.sort();
        radix_sort_high_half(&mut items, &mut Vec::new());
        assert_eq!(items, want);
    }

    /// The reference: every position packed, the `keep` smallest sorted.
    fn kept_by_sorting(keys: &[u32], keep: usize) -> Vec<u64> {
        let mut all: Vec<u64> = keys.iter().enumerate().map(|(i, &k)| pack(k, i)).collect();
        all.sort_unstable();
        all.truncate(keep);
        all
    }

    #[test]
    fn the_filtered_selection_keeps_what_sorting_keeps() {
        let mut state = 11u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        let n = 5000;
        let rows: Vec<(&str, Vec<u32>)> = vec![
            ("random", (0..n).map(|_| next()).collect()),
            ("few distinct keys (long ties)", (0..n).map(|_| next() % 7).collect()),
            ("descending: every key a candidate", (0..n as u32).rev().collect()),
            ("ascending: no key after the first block", (0..n as u32).collect()),
            ("all equal", vec![42; n]),
        ];
        let mut kept = Vec::new();
        for (what, keys) in &rows {
            for keep in [1, 2, 50, 63, 64, 65, 1500, n - 1] {
                let below = |b: Range<usize>, t| mask(&keys[b], |k| k < t);
                kept_smallest(n, keep, |i| keys[i], below, &mut kept);
                assert_eq!(kept, kept_by_sorting(keys, keep), "{what}, keep {keep}");
            }
        }
    }

    #[test]
    fn the_f32_block_test_is_the_key_comparison() {
        let xs = [f32::NEG_INFINITY, -3.0, -1e-45, -0.0, 0.0, 1e-45, 2.5, f32::MAX, f32::INFINITY, f32::NAN, -f32::NAN];
        // Thresholds are keys of values (the values' keys are not every u32: no key lies between +inf's and NaN's).
        let ts: Vec<u32> = xs.iter().chain(&[-f32::MAX, -1.0, 1.0, f32::MIN_POSITIVE]).map(|&x| f32_key(x)).collect();
        for descending in [false, true] {
            let f = flip(descending) as u32;
            for &t in &ts {
                let t = t ^ f;
                for x in xs {
                    let want = f32_key(x) ^ f < t;
                    assert_eq!(f32_block_below(&[x], t, descending), want as u64, "{x} against {t:#x}, {descending}");
                }
                // Whole blocks (the four-float compares) and a ragged one, each bit its own element's.
                let block: Vec<f32> = (0..64).map(|j| xs[(j * 7) % xs.len()]).collect();
                for len in [64, 61] {
                    let want = mask(&block[..len], |x| f32_key(x) ^ f < t);
                    assert_eq!(f32_block_below(&block[..len], t, descending), want, "{len} against {t:#x}");
                }
            }
        }
    }

    #[test]
    fn row_keys_are_the_scalar_keys_flipped() {
        let xs = [3.5f32, -0.0, 0.0, f32::NAN, -f32::INFINITY, -2.0, 1e-40];
        let mut keys = Vec::new();
        for flip in [0, u32::MAX] {
            // SAFETY: `xs` holds the 7 f32 read.
            unsafe { narrow_keys(DType::F32, xs.as_ptr() as *const u8, 0, xs.len(), flip, &mut keys) };
            let want: Vec<u32> = xs.iter().map(|&x| f32_key(x) ^ flip).collect();
            assert_eq!(keys, want);
        }
        let ints = [-3i32, 0, i32::MIN, i32::MAX, 7];
        // SAFETY: `ints` holds the 5 i32 read.
        unsafe { narrow_keys(DType::I32, ints.as_ptr() as *const u8, 1, 4, 0, &mut keys) };
        assert!(keys.windows(2).map(|w| w[0] < w[1]).eq([false, true, false]), "{keys:x?}");
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
