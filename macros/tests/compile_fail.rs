//! The macros' compile-time errors, as the user sees them: each `tests/ui/*.rs` must fail to compile with the
//! message in the `.stderr` file beside it (regenerate with `TRYBUILD=overwrite` after a deliberate change, and
//! read the diff). The valid forms compile and run in the `kiln` crate's `tests/macros.rs`.

#[test]
fn misuse_fails_to_compile_with_the_expected_message() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
