# run_rust_page_test.cmake — tests docs/rust.md as written (the test rust_docs_page):
# installs the shardadam build tree into a scratch prefix $P, takes the page's blocks out,
# runs its new_crate script (cargo new, cargo add --path "$CHECKOUT/...") in a scratch
# directory, puts the page's src/main.rs into the crate, runs its run script there
# (pkg-config through PKG_CONFIG_PATH, the rpath through RUSTFLAGS, cargo run), and judges
# what the program printed (first_step_check: a float64 AdamW step, and the page's
# "It prints:" block).
#
#   cmake -DSHARDADAM_SOURCE_DIR=<checkout> -DSHARDADAM_BINARY_DIR=<build dir>
#         -DPAGE=<docs/rust.md> -DDOC_BLOCKS=<doc_blocks> -DCHECK=<first_step_check>
#         -DCARGO=<cargo> -DWORK_DIR=<scratch dir> -P run_rust_page_test.cmake
#
# Cargo runs offline (the crates have no registry dependency) with its caches in WORK_DIR,
# and without the caller's variables that would find a library the page does not name.
cmake_minimum_required(VERSION 3.24)

foreach(var IN ITEMS SHARDADAM_SOURCE_DIR SHARDADAM_BINARY_DIR PAGE DOC_BLOCKS CHECK CARGO WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_rust_page_test: pass -D${var}=...")
  endif()
endforeach()
include("${CMAKE_CURRENT_LIST_DIR}/page_test.cmake")

set(prefix "${WORK_DIR}/prefix")
set(blocks "${WORK_DIR}/blocks")
set(crate "${WORK_DIR}/first_step")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

page_test_install("${prefix}")
page_test_extract("${blocks}" new_crate.sh src/main.rs run.sh first_step.out)

get_filename_component(cargo_dir "${CARGO}" DIRECTORY)
set(env
  --unset=PKG_CONFIG_PATH --unset=LD_LIBRARY_PATH --unset=SHARDADAM_LIB_DIR
  --unset=SHARDADAM_INCLUDE_DIR --unset=RUSTFLAGS --unset=CARGO_ENCODED_RUSTFLAGS
  --unset=CARGO_TARGET_DIR --unset=CARGO_BUILD_TARGET_DIR
  "P=${prefix}" "CHECKOUT=${SHARDADAM_SOURCE_DIR}"
  "PATH=${cargo_dir}:$ENV{PATH}"
  "CARGO_NET_OFFLINE=true")

page_test_run(new_crate "${blocks}/new_crate.sh" "${WORK_DIR}" ${env})
if(NOT EXISTS "${crate}/Cargo.toml")
  message(FATAL_ERROR "run_rust_page_test: the page's new_crate script made no ${crate}/Cargo.toml")
endif()
file(READ "${crate}/Cargo.toml" manifest)
if(NOT manifest MATCHES "\nshardadam = {[^\n]*path = ")
  message(FATAL_ERROR "run_rust_page_test: cargo add gave no path dependency on shardadam:\n${manifest}")
endif()
file(COPY_FILE "${blocks}/src/main.rs" "${crate}/src/main.rs")
page_test_run(run "${blocks}/run.sh" "${crate}" ${env})
page_test_check(run "${blocks}/first_step.out")
