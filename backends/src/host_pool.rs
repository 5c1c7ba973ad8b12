//! A pool of freed host buffers, so a step that replays a plan reuses the memory the previous step released
//! instead of asking the allocator for fresh pages: a fresh 64 MiB allocation is mmapped and page-faults on first
//! write (tens of ms, more than the kernel that fills it). Buffers are keyed by dtype and exact capacity, which is
//! what a replayed plan asks for again. Small buffers (under `MIN_BYTES`) go back to malloc, which is fast for
//! them; the pool holds at most `MAX_BYTES` in total and drops what would exceed it.
//!
//! One uncontended lock per buffer allocated or freed, never per kernel.
//!
//! **Buffer profile.** A plan's first run still takes fresh memory, and its page faults are most of what a warm
//! process's first training step spends beyond a steady step (MLP batch 128: ~0.6 ms of a ~2.5 ms first step; 0.9
//! µs per 4 KiB page on this VM). So each compiled CPU plan records the poolable buffers live while it runs, its
//! inputs included ([`remember_plan_buffers`]: dtype, length and how many at once) in the kernel and tuning store,
//! as one small artifact that travels in bundles; [`warm_from_profile`] (called on bundle import) allocates them,
//! touches every page, and puts them in the pool, so the first step finds faulted-in memory. The profile is a hint:
//! a stale or missing one only costs the faults back; it is capped at `PROFILE_MAX_ENTRIES` sizes and the warm-up
//! at half the pool's limit.

use kiln_jit::{DType, HostBuffer, HostVec};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

const MIN_BYTES: usize = 64 << 10;
const MAX_BYTES: usize = 1 << 30;

#[derive(Default)]
struct Pool {
    free: HashMap<(DType, usize), Vec<HostBuffer>>,
    bytes: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// Buffers of at least `MIN_BYTES` that [`take`] could not find in the pool (fresh memory, page faults to come).
static FRESH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many poolable buffers [`take`] has allocated fresh (not found in the pool) in this process.
pub fn fresh_allocations() -> u64 {
    FRESH.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn capacity(b: &HostBuffer) -> usize {
    match b {
        HostBuffer::Bool(v) => v.capacity(),
        HostBuffer::U8(v) => v.capacity(),
        HostBuffer::U32(v) => v.capacity(),
        HostBuffer::I32(v) => v.capacity(),
        HostBuffer::I64(v) => v.capacity(),
        HostBuffer::F16(v) => v.capacity(),
        HostBuffer::BF16(v) => v.capacity(),
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
        HostBuffer::BF16(v) => v.clear(),
        HostBuffer::F32(v) => v.clear(),
        HostBuffer::F64(v) => v.clear(),
    }
}

/// An empty buffer (length 0) with capacity for exactly `len` elements of `dtype`, recycled when one is free.
pub fn take(dtype: DType, len: usize) -> HostBuffer {
    pooled(dtype, len).unwrap_or_else(|| fresh(dtype, len))
}

/// An empty `i64` buffer of capacity `words` for a plan's region of temps: recycled when one is free, else fresh and
/// not advised to huge pages before its first touch (`HostVec::with_capacity_small_pages`: the plan collapses them
/// later).
pub fn take_region(words: usize) -> HostBuffer {
    pooled(DType::I64, words).unwrap_or_else(|| HostBuffer::I64(HostVec::with_capacity_small_pages(words)))
}

/// A free pooled buffer of exactly `len` elements of `dtype`, or `None` (counted as a fresh allocation where the
/// size is one the pool keeps).
fn pooled(dtype: DType, len: usize) -> Option<HostBuffer> {
    let pooled_size = len * dtype.size_of() >= MIN_BYTES;
    if pooled_size
        && let Some(pool) = POOL.lock().as_mut()
        && let Some(b) = pool.free.get_mut(&(dtype, len)).and_then(Vec::pop)
    {
        pool.bytes -= len * dtype.size_of();
        return Some(b);
    }
    if pooled_size {
        FRESH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    None
}

fn fresh(dtype: DType, len: usize) -> HostBuffer {
    match dtype {
        DType::Bool => HostBuffer::Bool(HostVec::with_capacity(len)),
        DType::U8 => HostBuffer::U8(HostVec::with_capacity(len)),
        DType::U32 => HostBuffer::U32(HostVec::with_capacity(len)),
        DType::I32 => HostBuffer::I32(HostVec::with_capacity(len)),
        DType::I64 => HostBuffer::I64(HostVec::with_capacity(len)),
        DType::F16 => HostBuffer::F16(HostVec::with_capacity(len)),
        DType::BF16 => HostBuffer::BF16(HostVec::with_capacity(len)),
        DType::F32 => HostBuffer::F32(HostVec::with_capacity(len)),
        DType::F64 => HostBuffer::F64(HostVec::with_capacity(len)),
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

/// Store artifact name of the buffer profile.
pub const PROFILE_ARTIFACT: &str = "host-buffer-profile";
const PROFILE_MAX_ENTRIES: usize = 1024;

/// (dtype, length) -> most buffers of that size live during one plan run (its inputs, outputs and temps). `None`
/// until first read from the store.
type Profile = BTreeMap<(DType, usize), usize>;
static PROFILE: Mutex<Option<Profile>> = Mutex::new(None);

/// Notes the buffers live during one run of a newly compiled plan (`(dtype, len)` each; small ones are ignored):
/// what it takes from the pool, and its inputs. Counting the inputs matters for a training step: its outputs (the
/// new parameters) are taken while its inputs (the old ones, made by earlier plans from pool buffers of the same
/// sizes) are alive, so a warm process needs two buffers of each parameter's size, where the step itself takes
/// one (measured: ~400 page faults, ~0.5 ms, in the first step of a warm `train_mlp`-like process without it).
/// Writes the merged profile to the store when this plan adds a size or needs more of one.
pub fn remember_plan_buffers(buffers: impl Iterator<Item = (DType, usize)>) {
    let mut counts = Profile::new();
    for (d, n) in buffers {
        if n * d.size_of() >= MIN_BYTES {
            *counts.entry((d, n)).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return;
    }
    let store = kiln_autotune::Store::global();
    let mut guard = PROFILE.lock();
    let profile = guard.get_or_insert_with(|| read_profile(store));
    let mut changed = false;
    for (size, count) in counts {
        if profile.len() >= PROFILE_MAX_ENTRIES && !profile.contains_key(&size) {
            continue;
        }
        let known = profile.entry(size).or_default();
        if count > *known {
            *known = count;
            changed = true;
        }
    }
    if changed {
        // A failed write only loses the hint (the store reports cache trouble once on its own paths).
        let _ = store.put_artifact(PROFILE_ARTIFACT, encode(profile).as_bytes());
    }
}

/// Puts in the pool, ready for use, every buffer the store's profile lists (beyond what the pool holds already),
/// each page touched; at most half the pool's limit in all. Returns the bytes allocated.
pub fn warm_from_profile() -> usize {
    let profile = read_profile(kiln_autotune::Store::global());
    let mut budget = MAX_BYTES / 2;
    let mut allocated = 0;
    for (&(dtype, len), &count) in &profile {
        let bytes = len * dtype.size_of();
        let have = POOL.lock().as_ref().and_then(|p| p.free.get(&(dtype, len)).map(Vec::len)).unwrap_or(0);
        for _ in have..count {
            if bytes > budget {
                break;
            }
            budget -= bytes;
            allocated += bytes;
            let mut b = fresh(dtype, len);
            touch(&mut b);
            give(b);
        }
    }
    let mut guard = PROFILE.lock();
    let merged = guard.get_or_insert_with(Profile::new);
    for (size, count) in profile {
        let known = merged.entry(size).or_default();
        *known = (*known).max(count);
    }
    allocated
}

fn read_profile(store: &kiln_autotune::Store) -> Profile {
    store
        .get_artifact(PROFILE_ARTIFACT)
        .and_then(|b| String::from_utf8(b).ok())
        .map_or_else(Profile::new, |t| decode(&t))
}

/// One `dtype len count` line per size.
fn encode(p: &Profile) -> String {
    p.iter().map(|(&(d, n), c)| format!("{d} {n} {c}\n")).collect()
}

/// Lines that do not parse are skipped (the store checksums artifacts; this only guards against a format change),
/// as are sizes the pool would never hold; counts are capped at 64.
fn decode(text: &str) -> Profile {
    let mut p = Profile::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if let [d, n, c] = f[..]
            && let Some(d) = DType::ALL.into_iter().find(|t| t.name() == d)
            && let (Ok(n), Ok(c)) = (n.parse::<usize>(), c.parse::<usize>())
            && n.checked_mul(d.size_of()).is_some_and(|b| (MIN_BYTES..=MAX_BYTES).contains(&b))
            && p.len() < PROFILE_MAX_ENTRIES
        {
            p.insert((d, n), c.min(64));
        }
    }
    p
}

/// Writes every element of `b`'s spare capacity (zeros), so its pages are faulted in.
pub(crate) fn touch(b: &mut HostBuffer) {
    fn zero<T: Copy + Default>(v: &mut HostVec<T>) {
        v.spare_capacity_mut().fill(std::mem::MaybeUninit::new(T::default()));
    }
    match b {
        HostBuffer::Bool(v) => zero(v),
        HostBuffer::U8(v) => zero(v),
        HostBuffer::U32(v) => zero(v),
        HostBuffer::I32(v) => zero(v),
        HostBuffer::I64(v) => zero(v),
        HostBuffer::F16(v) => zero(v),
        HostBuffer::BF16(v) => zero(v),
        HostBuffer::F32(v) => zero(v),
        HostBuffer::F64(v) => zero(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_text_round_trips_and_skips_what_it_cannot_read() {
        let mut p = Profile::new();
        p.insert((DType::F32, 200_704), 1);
        p.insert((DType::I64, 16_384), 2);
        assert_eq!(decode(&encode(&p)), p);
        assert_eq!(encode(&p), "i64 16384 2\nf32 200704 1\n");
        let odd =
            "f32 100000 1\nbf16 5 1\nf32 x 1\nf64 70000\n\nu8 65536 1000\nf64 1000 1\nf32 4611686018427387904 1\n";
        let want: Profile = [((DType::F32, 100_000), 1), ((DType::U8, 65_536), 64)].into_iter().collect();
        assert_eq!(
            decode(odd),
            want,
            "unknown dtypes, malformed lines and impossible sizes are skipped; counts capped"
        );
    }

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
