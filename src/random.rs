//! The global random stream: `manual_seed` sets the seed and rewinds the counter; each `rand`/`randn` call takes
//! the next `numel` counter values. Numbers come from Philox (see `kiln_jit::rng`), so a seed gives the same
//! numbers on every backend and in every later version of kiln.
//!
//! Two atomics, not a lock, so drawing random numbers keeps op construction lock-free. A `manual_seed` racing a
//! `rand` on another thread may pair the new seed with the old offset; seeding is meant to happen before use.

use kiln_jit::RngKey;
use std::sync::atomic::{AtomicU64, Ordering};

/// Seed used until `manual_seed` is called.
const DEFAULT_SEED: u64 = 0x6b69_6c6e; // "kiln"

static SEED: AtomicU64 = AtomicU64::new(DEFAULT_SEED);
static OFFSET: AtomicU64 = AtomicU64::new(0);

/// Seeds the generator behind `rand`/`randn` and rewinds it.
pub fn manual_seed(seed: u64) {
    SEED.store(seed, Ordering::SeqCst);
    OFFSET.store(0, Ordering::SeqCst);
}

/// The key for the next `n` random elements.
pub(crate) fn take(n: usize) -> RngKey {
    let offset = OFFSET.fetch_add(n as u64, Ordering::SeqCst);
    RngKey { seed: SEED.load(Ordering::SeqCst), offset }
}
