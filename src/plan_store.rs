//! Persisted plans: every plan compiled for the CPU leaves its graph's signature in the tuning store, so that a
//! bundle carries the plans its model ran, and [`crate::tune::import_bundle`] compiles them before the first step.
//! A warm process's first step is then a plan-cache hit: it neither schedules nor looks up a kernel or a GEMM key
//! (~0.35 ms of a ~1.4 ms first step at batch 128, measured in `examples/bench_gemm.rs`).
//!
//! What is stored is the signature itself (`signature.rs`: the whole graph, a few hundred words), not the compiled
//! plan: compiling it again from a bundle's records and mapped kernels takes a fraction of a millisecond and no
//! tuning or code generation, and the plan's in-memory form (function pointers, pool handles) has no stable byte
//! form to keep. The artifact's name is a digest of the signature; the cache key of a rebuilt plan is the decoded
//! signature itself, so a digest collision can only lose a persisted plan, never return another graph's.
//!
//! Deliberately not done: plans of other devices (a wgpu plan is compiled against one adapter, and the store is
//! namespaced by the host CPU), rebuilding plans from the disk cache outside an import (a process compiles the
//! plans it meets; an import is the explicit "prepare to serve" step), and evicting plans that are no longer run.

use crate::device::Device;
use std::cell::Cell;

/// The layout of a plan artifact: this word, then the signature's words (little-endian u64).
const PLAN_FORMAT: u64 = 1;

thread_local! {
    /// Off while `tune::tune_gemm` realizes its synthetic graph: that plan is not a model's.
    static PERSIST: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` without persisting the plans it compiles.
pub(crate) fn without_persisting<R>(f: impl FnOnce() -> R) -> R {
    let before = PERSIST.with(|p| p.replace(false));
    let out = f();
    PERSIST.with(|p| p.set(before));
    out
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
        kiln_backends::cpu::cache_write_failed("a plan", &e);
    }
}

/// Compiles every CPU plan persisted in the store's memory (what an import just stored) that the plan cache does
/// not hold yet, and returns how many it compiled. One that cannot be read or compiled is skipped with a warning:
/// the first step that needs it compiles it as any new graph, so a bad entry costs time, never a wrong result.
pub(crate) fn build_persisted() -> usize {
    let mut built = 0;
    let store = kiln_autotune::Store::global();
    for (name, bytes) in store.artifacts_with_prefix(kiln_autotune::PLAN_ARTIFACT_PREFIX) {
        let words: Vec<u64> =
            bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let result = match words.split_first() {
            Some((&PLAN_FORMAT, signature)) if bytes.len() % 8 == 0 => {
                crate::signature::decode(signature).and_then(|(device, graph)| {
                    if device != Device::Cpu.code() {
                        return Ok(false);
                    }
                    crate::realize::prebuild(signature, &graph, Device::Cpu).map_err(|e| e.to_string())
                })
            }
            _ => Err(format!("not a plan of format {PLAN_FORMAT}")),
        };
        match result {
            Ok(true) => built += 1,
            Ok(false) => {}
            Err(reason) => eprintln!("kiln: not compiling persisted plan {name} ahead of use: {reason}"),
        }
    }
    built
}
