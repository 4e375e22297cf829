# run_c_page_test.cmake — tests docs/c.md as written. MODE=page (the test docs_c_page):
# installs the shardadam build tree into a scratch prefix $P, takes the page's files and
# scripts out of it (the blocks marked <!-- file: --> and <!-- run: -->), runs the page's
# find_package and pkg-config scripts in the project directory with P set, as a reader's
# shell would, and judges the program's output (first_step_check: a float64 AdamW step,
# and the page's "It prints:" block). Where the library has its CUDA backend, the page's
# CMakeLists.txt must also have built the GPU program. MODE=gpu (docs_c_page_gpu, after
# docs_c_page): runs the page's GPU script and judges its output the same way, or says
# SKIPPED and why (no CUDA device, or a library without CUDA). MODE=program (docs_readme_c,
# docs_shard_files_page): a page's one C program the same way: its blocks PROGRAM.c, the
# script PROGRAM and the output PROGRAM, the script run in a project directory that holds a
# copy of the checkout's examples/ (as a script names them from the root of a clone), and
# the output judged as docs/c.md's.
#
#   cmake -DMODE=page|gpu|program -DSHARDADAM_BINARY_DIR=<build dir> -DPAGE=<docs/c.md>
#         -DDOC_BLOCKS=<doc_blocks> -DCHECK=<first_step_check> -DWORK_DIR=<scratch dir>
#         [-DSHARDADAM_SOURCE_DIR=<checkout> -DPROGRAM=<name>: MODE=program]
#         -P run_c_page_test.cmake
#
# The compilers and flags are the shardadam build's (a sanitizer build gets programs with
# the same runtime), with warnings as errors: for CMake through CC/CXX/CFLAGS/CXXFLAGS/
# LDFLAGS, for the page's `cc` through a `cc` first on PATH that adds them.
cmake_minimum_required(VERSION 3.24)

foreach(var IN ITEMS MODE SHARDADAM_BINARY_DIR PAGE DOC_BLOCKS CHECK WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_c_page_test: pass -D${var}=...")
  endif()
endforeach()
include("${CMAKE_CURRENT_LIST_DIR}/page_test.cmake")

set(prefix "${WORK_DIR}/prefix")
set(project "${WORK_DIR}/project")
set(shims "${WORK_DIR}/bin")

load_cache("${SHARDADAM_BINARY_DIR}" READ_WITH_PREFIX SA_
  CMAKE_C_COMPILER CMAKE_CXX_COMPILER CMAKE_C_FLAGS CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS
  CMAKE_CUDA_COMPILER)
if(NOT SA_CMAKE_C_COMPILER)
  message(FATAL_ERROR "run_c_page_test: ${SHARDADAM_BINARY_DIR} is not a configured CMake build tree")
endif()
# The library has its CUDA backend when the build made the module.
file(GLOB cuda_module "${SHARDADAM_BINARY_DIR}/libshardadam-cuda.so*")

# The environment of the page's scripts: $P, the build's compilers and flags, nothing of
# the caller's that would find a library the page does not name.
get_filename_component(cmake_dir "${CMAKE_COMMAND}" DIRECTORY)
set(strict "-Wall -Wextra -Wpedantic -Werror")
set(env
  --unset=PKG_CONFIG_PATH --unset=CMAKE_PREFIX_PATH --unset=LD_LIBRARY_PATH
  "P=${prefix}"
  "PATH=${shims}:${cmake_dir}:$ENV{PATH}"
  "CC=${SA_CMAKE_C_COMPILER}" "CXX=${SA_CMAKE_CXX_COMPILER}"
  "CFLAGS=${SA_CMAKE_C_FLAGS} ${strict}" "CXXFLAGS=${SA_CMAKE_CXX_FLAGS} ${strict}"
  "LDFLAGS=${SA_CMAKE_EXE_LINKER_FLAGS}")
if(SA_CMAKE_CUDA_COMPILER)
  # FindCUDAToolkit of the page's project finds the toolkit the library was built with.
  get_filename_component(toolkit "${SA_CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(toolkit "${toolkit}" DIRECTORY)
  list(APPEND env "CUDAToolkit_ROOT=${toolkit}")
endif()

# The page's `cc`: the build's C compiler, its flags, and warnings as errors.
function(write_cc_shim)
  file(WRITE "${shims}/cc"
    "#!/bin/sh\nexec \"${SA_CMAKE_C_COMPILER}\" ${SA_CMAKE_C_FLAGS} ${strict} \"$@\" ${SA_CMAKE_EXE_LINKER_FLAGS}\n")
  file(CHMOD "${shims}/cc" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE)
endfunction()

if(MODE STREQUAL "page")
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${shims}")
  page_test_install("${prefix}")
  page_test_extract("${project}" CMakeLists.txt first_step.c first_step_gpu.cpp
                    find_package.sh pkg_config.sh gpu.sh first_step.out)
  write_cc_shim()

  page_test_run(find_package "${project}/find_package.sh" "${project}" ${env})
  page_test_check(find_package "${project}/first_step.out")
  if(cuda_module AND NOT EXISTS "${project}/build/first_step_gpu")
    message(FATAL_ERROR "run_c_page_test: the library has its CUDA backend, but the page's "
      "CMakeLists.txt did not build first_step_gpu (no CUDA toolkit found?):\n${script_output}")
  endif()
  page_test_run(pkg_config "${project}/pkg_config.sh" "${project}" ${env})
  page_test_check(pkg_config "${project}/first_step.out")
elseif(MODE STREQUAL "program")
  if(NOT SHARDADAM_SOURCE_DIR OR NOT PROGRAM)
    message(FATAL_ERROR "run_c_page_test: MODE=program needs -DSHARDADAM_SOURCE_DIR=<checkout> -DPROGRAM=<name>")
  endif()
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${shims}")
  page_test_install("${prefix}")
  page_test_extract("${project}" ${PROGRAM}.c ${PROGRAM}.sh ${PROGRAM}.out)
  file(COPY "${SHARDADAM_SOURCE_DIR}/examples" DESTINATION "${project}")
  write_cc_shim()
  page_test_run(${PROGRAM} "${project}/${PROGRAM}.sh" "${project}" ${env})
  page_test_check(${PROGRAM} "${project}/${PROGRAM}.out")
elseif(MODE STREQUAL "gpu")
  if(NOT cuda_module)
    message(STATUS "SKIPPED: the library was built without its CUDA backend")
    return()
  endif()
  if(NOT EXISTS "${project}/build/first_step_gpu")
    message(FATAL_ERROR "run_c_page_test: no ${project}/build/first_step_gpu: run docs_c_page first")
  endif()
  page_test_run(gpu "${project}/gpu.sh" "${project}" ${env})
  if(script_output MATCHES "SKIPPED[^\n]*")
    message(STATUS "${CMAKE_MATCH_0}")
    return()
  endif()
  page_test_check(gpu "${project}/first_step.out")
else()
  message(FATAL_ERROR "run_c_page_test: MODE is page, gpu or program, not '${MODE}'")
endif()
