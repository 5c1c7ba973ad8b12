//! `einsum!` over typed operands (`kiln::Tensor2<R, C>` and friends): each `tests/ui/*.rs` must fail to compile with
//! the message in the `.stderr` beside it (regenerate with `TRYBUILD=overwrite` after a deliberate change, and read
//! the diff). The valid forms compile and run in `tests/macros.rs`. trybuild checks each case in a crate of its own,
//! with kiln (and this run's features) as its dependency, built once under `target/tests/trybuild`.

#[test]
fn size_mismatches_fail_to_compile_with_the_expected_message() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
