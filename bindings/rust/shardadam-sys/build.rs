//! Links libshardadam and generates the C facts the declarations are tested against.
//!
//! Environment:
//! - `SHARDADAM_LIB_DIR`: the directory holding libshardadam.so (a CMake build directory
//!   or an install's lib/). Unset: the linker's default search path.
//! - `SHARDADAM_INCLUDE_DIR`: the directory holding shardadam/shardadam.h. Unset: this
//!   repository's include/.
//! - `DLPACK_INCLUDE_DIR`: a directory holding dlpack/dlpack.h >= 1.0, if the C compiler
//!   does not find one by itself.
//! - `CC`: the C compiler for the probe (default `cc`).
//!
//! The probe (probe/c_layout.c) is compiled with the C compiler through
//! std::process::Command (no `cc` crate: no registry is reachable) and its output, Rust
//! source listing struct sizes, offsets and constants, is written to $OUT_DIR/c_layout.rs.
//! When the probe cannot be built, the file records why and the layout test fails with that
//! message; building the crate itself does not need it.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for var in [
        "SHARDADAM_LIB_DIR",
        "SHARDADAM_INCLUDE_DIR",
        "DLPACK_INCLUDE_DIR",
        "CC",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=probe/c_layout.c");

    if let Some(dir) = env::var_os("SHARDADAM_LIB_DIR") {
        println!(
            "cargo:rustc-link-search=native={}",
            PathBuf::from(dir).display()
        );
    }
    println!("cargo:rustc-link-lib=dylib=shardadam");

    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let include = env::var_os("SHARDADAM_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../../include"));
    println!(
        "cargo:rerun-if-changed={}",
        include.join("shardadam/shardadam.h").display()
    );

    let facts = match probe(&manifest, &out_dir, &include) {
        Ok(source) => source + "pub const PROBE_ERROR: Option<&str> = None;\n",
        Err(why) => format!(
            "pub const C_INT_FACTS: &[(&str, i64)] = &[];\n\
             pub const C_FLOAT_FACTS: &[(&str, f64)] = &[];\n\
             pub const PROBE_ERROR: Option<&str> = Some({:?});\n",
            why
        ),
    };
    fs::write(out_dir.join("c_layout.rs"), facts).expect("write c_layout.rs");
}

/// Compiles and runs the probe; returns its output (Rust source) or why it failed.
fn probe(manifest: &Path, out_dir: &Path, include: &Path) -> Result<String, String> {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("c_layout_probe");
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"])
        .arg(format!("-I{}", include.display()));
    if let Some(dir) = env::var_os("DLPACK_INCLUDE_DIR") {
        cmd.arg(format!("-I{}", PathBuf::from(dir).display()));
    }
    cmd.arg(manifest.join("probe/c_layout.c"))
        .arg("-o")
        .arg(&exe);
    let built = cmd
        .output()
        .map_err(|e| format!("cannot run the C compiler `{}`: {}", cc, e))?;
    if !built.status.success() {
        return Err(format!(
            "the C probe did not compile (set SHARDADAM_INCLUDE_DIR / DLPACK_INCLUDE_DIR?): {}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let ran = Command::new(&exe)
        .output()
        .map_err(|e| format!("cannot run the C probe: {}", e))?;
    if !ran.status.success() {
        return Err("the C probe failed".to_string());
    }
    String::from_utf8(ran.stdout).map_err(|_| "the C probe printed non-UTF-8 text".to_string())
}
