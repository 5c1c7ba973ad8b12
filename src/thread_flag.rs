//! A per-thread switch set for the length of one call: `no_grad` (gradient recording) and `tune_gemm`'s
//! suppression of persisted plans are both "off for this closure, back as it was afterwards, a panic included".

use std::cell::Cell;
use std::thread::LocalKey;

/// Runs `f` with `flag` set to `value` on this thread, and restores its previous value afterwards (also when `f`
/// panics), so nested calls compose.
pub(crate) fn with_flag<R>(flag: &'static LocalKey<Cell<bool>>, value: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(&'static LocalKey<Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(flag, flag.with(|c| c.replace(value)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static FLAG: Cell<bool> = const { Cell::new(true) };
    }

    #[test]
    fn the_flag_is_restored_after_nested_calls_and_a_panic() {
        with_flag(&FLAG, false, || {
            assert!(!FLAG.with(Cell::get));
            with_flag(&FLAG, true, || assert!(FLAG.with(Cell::get)));
            assert!(!FLAG.with(Cell::get));
        });
        assert!(FLAG.with(Cell::get));
        let caught = std::panic::catch_unwind(|| with_flag(&FLAG, false, || panic!("inside")));
        assert!(caught.is_err() && FLAG.with(Cell::get));
    }
}
