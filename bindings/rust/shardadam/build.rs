//! Gives this crate's tests and examples the rpath to libshardadam that shardadam-sys found
//! (its build script passes it on as `DEP_SHARDADAM_LINK_ARG`), so they run without
//! LD_LIBRARY_PATH: Cargo hands a build script's link arguments only to the binaries of its
//! own package.
use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_SHARDADAM_LINK_ARG");
    if let Ok(arg) = env::var("DEP_SHARDADAM_LINK_ARG") {
        println!("cargo:rustc-link-arg={}", arg);
    }
}
