//! The global random stream: `manual_seed` sets the seed and rewinds the counter; each `rand`/`randn` call takes
//! the next `numel` counter values. Numbers come from Philox (see `kiln_jit::rng`), so a seed gives the same
//! numbers on every backend and in every later version of kiln.
//!
//! `rng_state` / `set_rng_state` read and restore the stream's position (PyTorch's `get_rng_state` /
//! `set_rng_state`): a checkpoint that keeps it resumes dropout masks and random inits exactly where they were.
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

/// The generator's position: the seed and how many numbers have been drawn since it was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RngState {
    pub seed: u64,
    pub offset: u64,
}

/// Where the random stream is now (save it with a checkpoint).
pub fn rng_state() -> RngState {
    RngState { seed: SEED.load(Ordering::SeqCst), offset: OFFSET.load(Ordering::SeqCst) }
}

/// Puts the random stream back where `rng_state` found it: the next draws repeat the ones that followed.
pub fn set_rng_state(state: RngState) {
    SEED.store(state.seed, Ordering::SeqCst);
    OFFSET.store(state.offset, Ordering::SeqCst);
}

/// The key for the next `n` random elements.
pub(crate) fn take(n: usize) -> RngKey {
    let offset = OFFSET.fetch_add(n as u64, Ordering::SeqCst);
    RngKey { seed: SEED.load(Ordering::SeqCst), offset }
}
