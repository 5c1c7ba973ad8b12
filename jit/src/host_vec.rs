//! [`HostVec`]: the growable, 64-byte-aligned storage behind every host buffer.
//!
//! Why aligned: the generated kernels move whole 64-byte vectors (16 f32 lanes), and a large `Vec` from glibc's
//! malloc starts 16 bytes into an mmapped page, so every row of a tensor straddles cache lines: each vector load or
//! store spanning two lines costs about two, and a row-wise kernel peels a masked head and tail off every row. With
//! the buffers on 64-byte boundaries (as PyTorch's CPU allocator places them), a batch-1 MLP step's weight update
//! ran in 6.3 µs instead of 9.0 and its forward GEMV in 5.2 instead of 6.0 (`KILN_PROFILE=1 train_mlp --batch
//! 1`).
//!
//! The storage is `aligned_vec::AVec` (a well-kept crate, used by faer) rather than a hand-rolled allocation: a
//! `Vec<T>` cannot be given memory of a larger alignment than `T`'s (it frees with `T`'s layout, which the global
//! allocator contract forbids). This newtype adds what the rest of kiln uses a `Vec` for: building from iterators
//! and from a user's `Vec` (one copy: its memory has `T`'s alignment only), and handing a `Vec` back.

use aligned_vec::{AVec, ConstAlign};
use std::ops::{Deref, DerefMut};

/// The alignment of every host buffer, in bytes: one cache line, and one 512-bit vector.
pub const HOST_ALIGN: usize = 64;

/// Bytes from which a buffer asks for huge pages: two of them, so that at least one whole 2 MiB page lies inside.
pub const HUGE_PAGE_MIN: usize = 4 << 20;

/// Asks Linux to back the 2 MiB-aligned pages inside `bytes` bytes at `ptr` with transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`), before anything touches them, where `bytes >= HUGE_PAGE_MIN`.
///
/// Why: a GEMM whose weight comes from memory packs it a block at a time, each block's rows a page apart, so with 4
/// KiB pages nearly every row it reads is a TLB miss (a two-level walk in a virtual machine). Distributions default
/// transparent huge pages to `madvise` (only regions that ask get them), and glibc's malloc does not ask. Measured
/// on the Xeon host, 2 threads, 64 x 4096 x 4096 f32 against weights cycled from memory: 10.8-10.9 ms with 4 KiB
/// pages, 10.0-10.1 with huge pages; 4-8 % on the bf16 rows of `bench_gemm` (docs/benchmarks.md). Advice only: where
/// the kernel has no transparent huge pages, or they are off, the call fails or does nothing, and the memory is
/// the same memory either way, so the result is ignored. `KILN_HUGE_PAGES=off` turns the advice off (a huge page's
/// first touch may wait on the kernel compacting memory where it is fragmented).
pub fn advise_huge_pages(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE_MIN && huge_pages_wanted() {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside one live allocation of `bytes` bytes at `ptr` (the caller's); the advice
            // changes how its pages are backed, never their contents or the mapping's permissions.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Backs the whole 2 MiB pages inside `bytes` bytes at `ptr`, memory already faulted in with 4 KiB pages, with
/// huge pages from a thread of its own (`madvise(MADV_HUGEPAGE)`, then `MADV_COLLAPSE`, Linux 6.1 on), where huge
/// pages are wanted. Why not [`advise_huge_pages`] before the first touch: a huge page's first touch may wait for
/// the kernel to compact memory (distributions default `defrag` to `madvise`: direct compaction for advised
/// regions), which a cold training step measured as 300 ms first steps in two runs of six against ~165 without;
/// collapsing later moves that wait off the run. Advice only, as there: nothing is read or written, a kernel
/// without the call refuses it, and a range unmapped meanwhile is refused too, so results are ignored.
pub fn collapse_huge_pages_later(ptr: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if huge_pages_wanted() {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            let job = move || {
                // SAFETY: advice on a range of addresses: it changes how pages are backed, never their contents or
                // the mapping's permissions, and the kernel refuses a range that is no longer mapped.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
                    libc::madvise(start as *mut libc::c_void, end - start, MADV_COLLAPSE);
                }
            };
            let _ = std::thread::Builder::new().name("kiln-huge-pages".into()).spawn(job);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// `MADV_COLLAPSE` (Linux 6.1, `include/uapi/asm-generic/mman-common.h`).
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

/// Whether [`advise_huge_pages`] advises: unless `KILN_HUGE_PAGES` is `off` (read once).
fn huge_pages_wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("KILN_HUGE_PAGES").map_or(true, |v| v != "off"))
}

/// A `Vec`-like buffer whose first element sits on a [`HOST_ALIGN`] boundary. Dereferences to a slice.
#[derive(PartialEq)]
pub struct HostVec<T>(AVec<T, ConstAlign<HOST_ALIGN>>);

impl<T> HostVec<T> {
    /// An empty buffer.
    pub fn new() -> HostVec<T> {
        HostVec(AVec::new(HOST_ALIGN))
    }

    /// An empty buffer with room for `capacity` elements; from [`HUGE_PAGE_MIN`] bytes on, backed by huge pages
    /// where the kernel gives them ([`advise_huge_pages`]).
    pub fn with_capacity(capacity: usize) -> HostVec<T> {
        let v: AVec<T, ConstAlign<HOST_ALIGN>> = AVec::with_capacity(HOST_ALIGN, capacity);
        advise_huge_pages(v.as_ptr().cast(), capacity.saturating_mul(std::mem::size_of::<T>()));
        HostVec(v)
    }

    /// As [`HostVec::with_capacity`] without the huge-page advice, for memory whose pages are collapsed into huge
    /// ones after they are faulted in ([`collapse_huge_pages_later`]).
    pub fn with_capacity_small_pages(capacity: usize) -> HostVec<T> {
        HostVec(AVec::with_capacity(HOST_ALIGN, capacity))
    }

    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    pub fn clear(&mut self) {
        self.0.clear()
    }

    pub fn push(&mut self, value: T) {
        self.0.push(value)
    }

    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len)
    }

    pub fn reserve(&mut self, additional: usize) {
        self.0.reserve(additional)
    }

    /// Sets the length without touching the elements, as `Vec::set_len`.
    ///
    /// # Safety
    /// `len <= capacity()`, and the elements `old_len..len` have been initialized.
    pub unsafe fn set_len(&mut self, len: usize) {
        // SAFETY: the caller's contract, exactly `AVec::set_len`'s.
        unsafe { self.0.set_len(len) }
    }

    /// The memory past the length, up to the capacity, as `Vec::spare_capacity_mut`.
    pub fn spare_capacity_mut(&mut self) -> &mut [std::mem::MaybeUninit<T>] {
        let (len, cap) = (self.0.len(), self.0.capacity());
        // SAFETY: the allocation holds `cap` elements from `as_mut_ptr()`, the first `len` initialized; the slice
        // covers `len..cap` as possibly uninitialized memory, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().add(len).cast(), cap - len) }
    }

    /// The elements, copied into a `Vec`.
    pub fn into_vec(self) -> Vec<T>
    where
        T: Copy,
    {
        self.0.to_vec()
    }
}

impl<T: Copy> HostVec<T> {
    /// A buffer holding a copy of `s` (one `memcpy`).
    pub fn from_slice(s: &[T]) -> HostVec<T> {
        let mut v = HostVec::with_capacity(s.len());
        v.extend_from_slice(s);
        v
    }

    /// `len` copies of `value`, as `vec![value; len]`.
    pub fn filled(len: usize, value: T) -> HostVec<T> {
        let mut v = HostVec::with_capacity(len);
        v.resize(len, value);
        v
    }

    /// Appends a copy of `s` (one `memcpy`).
    pub fn extend_from_slice(&mut self, s: &[T]) {
        self.0.extend_from_slice(s)
    }

    pub fn resize(&mut self, len: usize, value: T) {
        self.0.resize(len, value)
    }
}

/// One `memcpy` (the crate's own clone goes element by element).
impl<T: Copy> Clone for HostVec<T> {
    fn clone(&self) -> HostVec<T> {
        HostVec::from_slice(self)
    }
}

impl<T> Default for HostVec<T> {
    fn default() -> HostVec<T> {
        HostVec::new()
    }
}

impl<T> Deref for HostVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> DerefMut for HostVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for HostVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> FromIterator<T> for HostVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> HostVec<T> {
        let iter = iter.into_iter();
        let mut v = HostVec::with_capacity(iter.size_hint().0);
        v.extend(iter);
        v
    }
}

impl<T> Extend<T> for HostVec<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        let iter = iter.into_iter();
        self.0.reserve(iter.size_hint().0);
        for x in iter {
            self.0.push(x);
        }
    }
}

/// One copy: a `Vec`'s memory is only aligned for `T`.
impl<T: Copy> From<Vec<T>> for HostVec<T> {
    fn from(v: Vec<T>) -> HostVec<T> {
        HostVec::from_slice(&v)
    }
}

impl<T: Copy> From<&[T]> for HostVec<T> {
    fn from(s: &[T]) -> HostVec<T> {
        HostVec::from_slice(s)
    }
}

impl<T: Copy> From<HostVec<T>> for Vec<T> {
    fn from(v: HostVec<T>) -> Vec<T> {
        v.into_vec()
    }
}

impl<'a, T> IntoIterator for &'a HostVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut HostVec<T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_starts_on_a_cache_line() {
        for len in [0usize, 1, 3, 784, 200_704, 1 << 20] {
            let v: HostVec<f32> = (0..len).map(|i| i as f32).collect();
            assert_eq!(v.as_ptr() as usize % HOST_ALIGN, 0, "len {len}");
            assert_eq!(v.len(), len);
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
            let w = HostVec::<u8>::with_capacity(len + 5);
            assert_eq!(w.as_ptr() as usize % HOST_ALIGN, 0, "capacity {len}");
        }
        let filled = HostVec::filled(5, 7u8);
        assert_eq!((filled.as_ptr() as usize % HOST_ALIGN, &filled[..]), (0, &[7u8; 5][..]));
        let from_vec = HostVec::from(vec![1i64, 2, 3]);
        assert_eq!(from_vec.as_ptr() as usize % HOST_ALIGN, 0);
        assert_eq!(Vec::from(from_vec), vec![1, 2, 3]);
    }

    /// `AnonHugePages` of the mappings overlapping `bytes` bytes at `addr`, in KiB, from `/proc/self/smaps` (the
    /// advice splits a buffer's mapping where its huge pages start and end).
    #[cfg(target_os = "linux")]
    fn huge_kib_in(addr: usize, bytes: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let (mut inside, mut kib) = (false, 0);
        for line in smaps.lines() {
            let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
            let bounds = range
                .and_then(|(lo, hi)| Some((usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?)));
            if let Some((lo, hi)) = bounds {
                inside = lo < addr + bytes && addr < hi;
            } else if inside && let Some(k) = line.strip_prefix("AnonHugePages:") {
                kib += k.trim().trim_end_matches("kB").trim().parse::<usize>().unwrap_or(0);
            }
        }
        kib
    }

    /// A large buffer is backed by huge pages where the kernel hands them out on request (transparent huge pages
    /// in `madvise` or `always` mode, as Debian sets them); small ones are not asked for.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_ask_for_huge_pages() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if !(mode.contains("[madvise]") || mode.contains("[always]")) || !huge_pages_wanted() {
            eprintln!("transparent huge pages not given on request here ({}): not checked", mode.trim());
            return;
        }
        let big = HostVec::filled(16 << 20, 1.0f32);
        let huge = huge_kib_in(big.as_ptr() as usize, 64 << 20);
        // 64 MiB hold at least 30 whole 2 MiB pages; the kernel may fall back to small pages for some of them where
        // memory is fragmented, but without the advice (Debian's `madvise` mode) it gives none.
        assert!(huge >= 2048, "a 64 MiB buffer got {huge} KiB of huge pages");
        if mode.contains("[madvise]") {
            // (In `always` mode the kernel may give a small buffer huge pages unasked.)
            let small = HostVec::filled(HUGE_PAGE_MIN / 4 - 1, 1.0f32);
            let kib = huge_kib_in(small.as_ptr() as usize, HUGE_PAGE_MIN - 4);
            assert_eq!(kib, 0, "a buffer under {HUGE_PAGE_MIN} bytes is not advised");
        }
    }
}
