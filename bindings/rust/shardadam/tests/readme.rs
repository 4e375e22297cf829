//! The README's "first step on the GPU from Rust" shows examples/gpu_step.rs as it is: the
//! example is the one place of that code (CTest builds and runs it), so the README's copy
//! must not drift from it.
use std::path::Path;

#[test]
fn the_readme_shows_the_gpu_example_as_it_is() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme_path = manifest.join("../../../README.md");
    let readme = std::fs::read_to_string(&readme_path)
        .unwrap_or_else(|e| panic!("{}: {}", readme_path.display(), e));
    let example = std::fs::read_to_string(manifest.join("examples/gpu_step.rs")).unwrap();
    let heading = "#### A first step on the GPU from Rust";
    let section = &readme[readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no heading {:?}", heading))..];
    let start = section
        .find("```rust\n")
        .expect("a ```rust block after the heading")
        + 8;
    let end = start + section[start..].find("\n```\n").expect("the block's end") + 1;
    let shown = &section[start..end];
    if shown != example {
        let line = shown
            .lines()
            .zip(example.lines())
            .position(|(a, b)| a != b)
            .map_or(shown.lines().count().min(example.lines().count()), |i| i)
            + 1;
        panic!(
            "README.md's block under {:?} differs from examples/gpu_step.rs from line {} on; \
             copy the file into it",
            heading, line
        );
    }
}
