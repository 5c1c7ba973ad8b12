//! The README's quick start is `examples/quickstart.rs`, to the byte, and it runs as its comments say: the step's
//! plan compiles once and replays. One test in this binary, so no other test moves the process-wide counters.

// The quick start runs on the CPU (cargo feature `cpu`, the example's `required-features`).
#![cfg(feature = "cpu")]

mod test_cache;

mod quickstart {
    include!("../examples/quickstart.rs");

    pub fn run() -> kiln::Result<()> {
        main()
    }
}

#[test]
fn the_readme_quick_start_is_the_example_and_compiles_its_step_once() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    assert!(
        readme.contains(&format!("```rust\n{example}```\n")),
        "README.md's quick start must be examples/quickstart.rs exactly (copy the file into the README's rust block)"
    );
    let before = kiln::stats();
    quickstart::run().unwrap();
    let after = kiln::stats();
    assert_eq!(after.plan_misses - before.plan_misses, 2, "the data's plan and the step's plan");
    assert_eq!(after.plan_hits - before.plan_hits, 99, "the step replays in steps 2 to 100");
}
