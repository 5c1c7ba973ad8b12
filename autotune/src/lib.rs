//! `kiln-autotune`: GEMM autotuning (search spaces, analytic cost model, timing harness, tuning records,
//! persistent store, bundles).
//!
//! Must not know: the user-facing `Tensor` API.
//!
//! Deliberately empty: the tuner arrives with the CPU JIT's GEMM seam (see DESIGN.md, "Autotuning"). The crate
//! exists now so the workspace layout is the one every later change fills in.
