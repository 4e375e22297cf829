//! Links libshardadam and generates the C facts the declarations are tested against.
//!
//! Where the library is:
//! - `SHARDADAM_LIB_DIR`, when set: the directory holding libshardadam.so (a CMake build
//!   directory or an install's lib/). The probe's headers are then `SHARDADAM_INCLUDE_DIR`
//!   (unset: this repository's include/) and `DLPACK_INCLUDE_DIR` (a directory holding
//!   dlpack/dlpack.h >= 1.0, if the C compiler does not find one by itself).
//! - otherwise pkg-config's `shardadam`: the shardadam.pc of an install
//!   (`<prefix>/lib/pkgconfig`) or of a build tree (`<build>/pkgconfig`), whose directory
//!   `PKG_CONFIG_PATH` names when it is not one pkg-config searches anyway. Its `libdir` is
//!   the library's directory and its `-I` directories (those of the installed shardadam.h
//!   and dlpack.h) the probe's, after `SHARDADAM_INCLUDE_DIR` and `DLPACK_INCLUDE_DIR` if
//!   set. `PKG_CONFIG` names the pkg-config program (default `pkg-config`).
//!
//! The library is found at run time through an rpath to that directory, so the tests and
//! examples run without LD_LIBRARY_PATH. Cargo hands a build script's link arguments to the
//! binaries of its own package only, so the argument is also passed on as `links` metadata:
//! a crate that depends on this one directly reads `DEP_SHARDADAM_LINK_ARG` (and the
//! directory, `DEP_SHARDADAM_LIBDIR`) in its build script and prints
//! `cargo:rustc-link-arg=<it>`, as the safe crate `shardadam` does for its tests and examples.
//!
//! The probe (probe/c_layout.c) is compiled with the C compiler `CC` (default `cc`) through
//! std::process::Command (no `cc` or `pkg-config` crate: no registry is reachable) and its
//! output, Rust source listing struct sizes, offsets and constants, is written to
//! $OUT_DIR/c_layout.rs. When the probe cannot be built, the file records why and the layout
//! test fails with that message; building the crate itself does not need it.
use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where libshardadam is, and the include directories that compile against its header.
struct Library {
    lib_dir: PathBuf,
    include_dirs: Vec<PathBuf>,
}

fn main() {
    for var in [
        "SHARDADAM_LIB_DIR",
        "SHARDADAM_INCLUDE_DIR",
        "DLPACK_INCLUDE_DIR",
        "CC",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=probe/c_layout.c");

    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let library = find_library(&manifest).unwrap_or_else(|why| {
        eprintln!("shardadam-sys: cannot find libshardadam: {}", why);
        std::process::exit(1);
    });

    println!(
        "cargo:rustc-link-search=native={}",
        library.lib_dir.display()
    );
    println!("cargo:rustc-link-lib=dylib=shardadam");
    println!("cargo:libdir={}", library.lib_dir.display());
    let unix = env::var("CARGO_CFG_TARGET_FAMILY").map_or(false, |families| {
        families.split(',').any(|family| family == "unix")
    });
    if unix {
        let rpath = format!("-Wl,-rpath,{}", library.lib_dir.display());
        println!("cargo:rustc-link-arg={}", rpath);
        println!("cargo:link_arg={}", rpath);
    }
    for dir in &library.include_dirs {
        let header = dir.join("shardadam/shardadam.h");
        if header.exists() {
            println!("cargo:rerun-if-changed={}", header.display());
        }
    }

    let facts = match probe(&manifest, &out_dir, &library.include_dirs) {
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

/// The library from SHARDADAM_LIB_DIR, else from pkg-config; or why neither gave one.
fn find_library(manifest: &Path) -> Result<Library, String> {
    let mut include_dirs: Vec<PathBuf> = ["SHARDADAM_INCLUDE_DIR", "DLPACK_INCLUDE_DIR"]
        .iter()
        .filter_map(env::var_os)
        .map(PathBuf::from)
        .collect();
    let (lib_dir, source) = if let Some(lib_dir) = env::var_os("SHARDADAM_LIB_DIR") {
        if env::var_os("SHARDADAM_INCLUDE_DIR").is_none() {
            include_dirs.insert(0, manifest.join("../../../include"));
        }
        (PathBuf::from(lib_dir), "SHARDADAM_LIB_DIR")
    } else {
        let lib_dir = pkg_config(&["--variable=libdir", "shardadam"])?;
        let cflags = pkg_config(&["--cflags-only-I", "shardadam"])?;
        include_dirs.extend(
            split_args(&cflags)
                .iter()
                .filter_map(|arg| arg.strip_prefix("-I"))
                .map(PathBuf::from),
        );
        (
            PathBuf::from(lib_dir.trim()),
            "the libdir of pkg-config's shardadam.pc",
        )
    };
    // Absolute and without `..`: the rpath must not depend on the directory a binary runs in.
    let lib_dir = fs::canonicalize(&lib_dir).map_err(|e| {
        format!(
            "the library directory `{}` ({}) cannot be opened: {}",
            lib_dir.display(),
            source,
            e
        )
    })?;
    Ok(Library {
        lib_dir,
        include_dirs,
    })
}

/// Runs pkg-config with `args`: its output, or why it failed and what to set instead.
fn pkg_config(args: &[&str]) -> Result<String, String> {
    let program = env::var_os("PKG_CONFIG").unwrap_or_else(|| OsString::from("pkg-config"));
    let command = format!(
        "{} --print-errors {}",
        program.to_string_lossy(),
        args.join(" ")
    );
    let out = Command::new(&program)
        .arg("--print-errors")
        .args(args)
        .output()
        .map_err(|e| {
            format!(
                "cannot run `{}` ({}); install pkg-config (Debian: pkgconf) or set \
                 SHARDADAM_LIB_DIR to the directory holding libshardadam.so",
                command, e
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}\nSet PKG_CONFIG_PATH to the directory holding shardadam.pc \
             (<prefix>/lib/pkgconfig of an install, <build>/pkgconfig of a build tree), or \
             SHARDADAM_LIB_DIR to the directory holding libshardadam.so",
            command,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("`{}` printed non-UTF-8 text", command))
}

/// Splits pkg-config's output into arguments as a shell would: at whitespace, where a
/// backslash escapes the next character (how pkg-config writes a path with a space).
fn split_args(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut arg = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            arg.extend(chars.next());
        } else if c.is_whitespace() {
            if !arg.is_empty() {
                args.push(std::mem::take(&mut arg));
            }
        } else {
            arg.push(c);
        }
    }
    if !arg.is_empty() {
        args.push(arg);
    }
    args
}

/// Compiles and runs the probe; returns its output (Rust source) or why it failed.
fn probe(manifest: &Path, out_dir: &Path, include_dirs: &[PathBuf]) -> Result<String, String> {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("c_layout_probe");
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]);
    for dir in include_dirs {
        cmd.arg(format!("-I{}", dir.display()));
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
