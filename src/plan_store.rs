//! Persisted plans: every plan compiled for the CPU leaves its graph's signature in the tuning store, so that a
//! bundle carries the plans its model ran, and [`crate::tune::import_bundle`] (or [`crate::tune::warm_from_cache`])
//! compiles them before the first step.
//! A warm process's first step is then a plan-cache hit: it neither schedules nor looks up a kernel or a GEMM key
//! (~0.35 ms of a ~1.4 ms first step at batch 128, measured in `examples/bench_gemm/main.rs`).
//!
//! What is stored is the signature itself (`signature.rs`: the whole graph, a few hundred words), not the compiled
//! plan: compiling it again from a bundle's records and mapped kernels takes a fraction of a millisecond and no
//! tuning or code generation, and the plan's in-memory form (function pointers, pool handles) has no stable byte
//! form to keep. The artifact's name is a digest of the signature; the cache key of a rebuilt plan is the decoded
//! signature itself, so a digest collision can only lose a persisted plan, never return another graph's.
//!
//! Deliberately not done: plans of other devices (a wgpu plan is compiled against one adapter, and the store is
//! namespaced by the host CPU), rebuilding plans unasked (a process compiles the plans it meets; an import or
//! `warm_from_cache` is the explicit "prepare to serve" step), and evicting plans that are no longer run.

use crate::device::Device;
use std::cell::Cell;

/// The layout of a plan artifact: this word, then the signature's words (little-endian u64).
const PLAN_FORMAT: u64 = 1;

thread_local! {
    /// Off while `tune::tune_gemm` realizes its synthetic graph: that plan is not a model's.
    static PERSIST: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` without persisting the plans it compiles (restored on the way out, a panic included).
pub(crate) fn without_persisting<R>(f: impl FnOnce() -> R) -> R {
    crate::thread_flag::with_flag(&PERSIST, false, f)
}

/// Keeps the signature of a plan just compiled for the CPU in the store (memory, and disk unless
/// `KILN_CACHE_DIR=off`), once.
pub(crate) fn remember(signature: &[u64]) {
    if !PERSIST.with(Cell::get) {
        return;
    }
    let mut bytes = Vec::with_capacity(8 * (signature.len() + 1));
    for w in std::iter::once(PLAN_FORMAT).chain(signature.iter().copied()) {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let name = format!("{}{}", kiln_autotune::PLAN_ARTIFACT_PREFIX, kiln_autotune::content_digest(&bytes));
    let store = kiln_autotune::Store::global();
    if store.get_artifact(&name).is_some_and(|b| b == bytes) {
        return;
    }
    if let Err(e) = store.put_artifact(&name, &bytes) {
        kiln_backends::runtime::cache_write_failed("a plan", &e);
    }
}

/// Compiles every CPU plan persisted in the store's memory (what an import just stored) that the plan cache does
/// not hold yet, and returns how many it compiled. One that cannot be read or compiled is skipped with a warning:
/// the first step that needs it compiles it as any new graph, so a bad entry costs time, never a wrong result.
pub(crate) fn build_persisted() -> usize {
    let mut built = 0;
    let store = kiln_autotune::Store::global();
    for (name, bytes) in store.artifacts_with_prefix(kiln_autotune::PLAN_ARTIFACT_PREFIX) {
        match build(&bytes) {
            Ok(true) => built += 1,
            Ok(false) => {}
            Err(reason) => eprintln!("kiln: not compiling persisted plan {name} ahead of use: {reason}"),
        }
    }
    built
}

/// Compiles the plan of one plan artifact unless it is cached already or not a CPU plan; `Ok(true)` if it did.
fn build(bytes: &[u8]) -> Result<bool, String> {
    if !bytes.len().is_multiple_of(8) {
        return Err("its length is not a whole number of words".into());
    }
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let Some((&PLAN_FORMAT, signature)) = words.split_first() else {
        return Err(format!("not a plan of format {PLAN_FORMAT}"));
    };
    let (device, graph) = crate::signature::decode(signature)?;
    if device != Device::Cpu.code() {
        return Ok(false);
    }
    crate::realize::prebuild(signature, &graph, Device::Cpu).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    #[test]
    fn a_remembered_plan_is_built_once_and_a_bad_one_is_refused() {
        let dev = Device::Cpu;
        // A graph no other test makes (the plan cache is process-wide).
        let x = Tensor::from_vec(vec![1.5f32; 7 * 13], [7, 13], &dev).unwrap();
        let y = (x.sin() * 3.25).sum([1], false);
        let (sig, _) = crate::realize::signature_and_graph(dev, &[&y]);
        let mut bytes: Vec<u8> = PLAN_FORMAT.to_le_bytes().to_vec();
        bytes.extend(sig.iter().flat_map(|w| w.to_le_bytes()));
        assert_eq!(build(&bytes), Ok(true), "compiled ahead of use");
        assert_eq!(build(&bytes), Ok(false), "already cached");
        let before = crate::stats();
        y.realize().unwrap();
        let after = crate::stats();
        assert_eq!((after.plan_misses - before.plan_misses, after.plan_hits - before.plan_hits), (0, 1));

        assert!(build(&bytes[..bytes.len() - 3]).is_err(), "a torn artifact");
        assert!(build(&bytes[..8 * 5]).is_err(), "a cut signature");
        assert!(build(&2u64.to_le_bytes()).is_err(), "another format");
        let mut other_device = bytes.clone();
        other_device[8..16].copy_from_slice(&99u64.to_le_bytes());
        assert_eq!(build(&other_device), Ok(false), "not a CPU plan: left alone");
    }
}
