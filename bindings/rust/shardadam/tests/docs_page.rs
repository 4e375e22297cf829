//! docs/rust.md quotes examples/gpu_step.rs, which CTest builds and runs
//! (`rust_binding_gpu_example`), in its `rust ignore` blocks (rustdoc does not compile
//! them: they need the example's `cudart` module). The quotes must not drift from the
//! file: each block is a run of the example's lines, as they are. (The page's other Rust
//! blocks, the CPU step and the float8 param, are doctests of the crate.)
use std::path::Path;

#[test]
fn the_rust_pages_gpu_excerpts_are_runs_of_lines_of_the_example() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page_path = manifest.join("../../../docs/rust.md");
    let page = std::fs::read_to_string(&page_path)
        .unwrap_or_else(|e| panic!("{}: {}", page_path.display(), e));
    let example = format!(
        "\n{}",
        std::fs::read_to_string(manifest.join("examples/gpu_step.rs")).unwrap()
    );
    let mut excerpts = 0;
    let mut lines = page.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line != "```rust ignore" {
            continue;
        }
        let mut block = String::from("\n");
        for (_, line) in lines
            .by_ref()
            .take_while(|(_, line)| !line.starts_with("```"))
        {
            block.push_str(line);
            block.push('\n');
        }
        assert!(block.len() > 1, "docs/rust.md:{}: an empty excerpt", n + 1);
        assert!(
            example.contains(&block),
            "docs/rust.md:{}: the excerpt is not a run of lines of examples/gpu_step.rs; copy \
             it from the file again:{}",
            n + 1,
            block
        );
        excerpts += 1;
    }
    assert!(excerpts > 0, "docs/rust.md has no ```rust ignore excerpt");
}
