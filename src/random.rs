//! Random-number generators (PyTorch's `torch.Generator`): a seed and an offset. Each `rand`/`randn` draw takes the
//! next `numel` counter values of its generator; the numbers come from Philox (see `kiln_jit::rng`), so a seed and
//! an offset give the same numbers on every backend and in every later version of kiln.
//!
//! - [`Generator`] is a handle: clones share one stream, as passing a `torch.Generator` around does. The `_with`
//!   functions take one (`Tensor::rand_with`, `randn_with`, `nn::functional::dropout_with`,
//!   `nn::Dropout::with_generator`, the `nn::init::*_with` functions).
//! - Everything else draws from the calling thread's default generator (`default_generator()`), which every thread
//!   starts at the same seed and offset 0. `manual_seed`, `rng_state` and `set_rng_state` act on it. Per thread,
//!   not per process, on purpose: a process-wide stream made one thread's draws shift another's, so two models
//!   trained on two threads (or two tests run in parallel) did not reproduce their own runs.
//!
//! A generator's state is two numbers ([`RngState`]); `save_generator` / `load_generator` keep it beside a
//! checkpoint, so dropout masks and random inits resume exactly where they were.

use kiln_jit::RngKey;
use parking_lot::Mutex;
use std::sync::Arc;

/// Seed of every thread's default generator until `manual_seed` is called, and of `Generator::default()`.
pub const DEFAULT_SEED: u64 = 0x6b69_6c6e; // "kiln"

/// A generator's position: its seed and how many numbers have been drawn since it was seeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RngState {
    pub seed: u64,
    pub offset: u64,
}

/// A random-number generator (`torch.Generator`). Cloning gives another handle on the same stream.
///
/// ```
/// # kiln::tune::set_cache_dir(None).ok(); // doc tests keep off the user's cache
/// # #[cfg(feature = "cpu")] {
/// use kiln::{DType, Device, Generator, Tensor};
/// let dev = Device::cpu();
/// let g = Generator::new(42);
/// let a = Tensor::randn_with([3], DType::F32, &dev, &g).to_vec::<f32>()?;
/// g.manual_seed(42); // rewinds the stream
/// let b = Tensor::randn_with([3], DType::F32, &dev, &g).to_vec::<f32>()?;
/// assert_eq!(a, b);
/// # }
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Generator {
    // A lock rather than two atomics: a draw reads the seed and advances the offset as one step, so a `manual_seed`
    // on another handle can never pair the new seed with the old offset.
    state: Arc<Mutex<RngState>>,
}

impl Default for Generator {
    /// A generator at `DEFAULT_SEED`, offset 0: the state every thread's default generator starts in.
    fn default() -> Generator {
        Generator::new(DEFAULT_SEED)
    }
}

impl Generator {
    /// A new stream with `seed`, at offset 0.
    pub fn new(seed: u64) -> Generator {
        Generator { state: Arc::new(Mutex::new(RngState { seed, offset: 0 })) }
    }

    /// Seeds the stream and rewinds it (`Generator.manual_seed`).
    pub fn manual_seed(&self, seed: u64) {
        *self.state.lock() = RngState { seed, offset: 0 };
    }

    /// The seed the stream was last set to (`Generator.initial_seed`).
    pub fn initial_seed(&self) -> u64 {
        self.state.lock().seed
    }

    /// Where the stream is now (`Generator.get_state`): save it with a checkpoint.
    pub fn state(&self) -> RngState {
        *self.state.lock()
    }

    /// Puts the stream back where `state` found it (`Generator.set_state`): the next draws repeat the ones that
    /// followed.
    pub fn set_state(&self, state: RngState) {
        *self.state.lock() = state;
    }

    /// Whether two handles share one stream.
    pub fn ptr_eq(&self, other: &Generator) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    /// The key for the next `n` random elements, advancing the stream past them.
    pub(crate) fn take(&self, n: usize) -> RngKey {
        let mut s = self.state.lock();
        let key = RngKey { seed: s.seed, offset: s.offset };
        s.offset = s.offset.wrapping_add(n as u64);
        key
    }
}

thread_local! {
    static DEFAULT: Generator = Generator::default();
}

/// The calling thread's default generator: what `rand`, `randn`, `dropout`, `Linear::new` and the `nn::init`
/// functions draw from when no generator is passed. The handle stays valid (and shared) after the thread ends.
pub fn default_generator() -> Generator {
    DEFAULT.with(Generator::clone)
}

/// Seeds the calling thread's default generator and rewinds it (`torch.manual_seed`, for this thread).
pub fn manual_seed(seed: u64) {
    default_generator().manual_seed(seed);
}

/// Where the calling thread's default generator is now (`torch.get_rng_state`, for this thread).
pub fn rng_state() -> RngState {
    default_generator().state()
}

/// Puts the calling thread's default generator back where `rng_state` found it.
pub fn set_rng_state(state: RngState) {
    default_generator().set_state(state);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_a_stream_and_new_generators_do_not() {
        let a = Generator::new(1);
        let b = a.clone();
        assert_eq!(a.take(10).offset, 0);
        assert_eq!(b.take(5).offset, 10);
        assert_eq!(a.state(), RngState { seed: 1, offset: 15 });
        assert!(a.ptr_eq(&b));
        let c = Generator::new(1);
        assert!(!a.ptr_eq(&c));
        assert_eq!(c.take(1).offset, 0);
    }

    #[test]
    fn each_thread_starts_its_default_generator_at_the_default_seed() {
        manual_seed(9);
        default_generator().take(100);
        let other = std::thread::spawn(|| {
            let before = rng_state();
            default_generator().take(7);
            (before, rng_state())
        })
        .join()
        .expect("the thread runs");
        assert_eq!(other, (RngState { seed: DEFAULT_SEED, offset: 0 }, RngState { seed: DEFAULT_SEED, offset: 7 }));
        assert_eq!(rng_state(), RngState { seed: 9, offset: 100 });
    }
}
