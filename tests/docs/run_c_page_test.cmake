# run_c_page_test.cmake — tests docs/c.md as written. MODE=page (the test docs_c_page):
# installs the shardadam build tree into a scratch prefix $P, takes the page's files and
# scripts out of it (doc_blocks: the blocks marked <!-- file: --> and <!-- run: -->), runs
# the page's find_package and pkg-config scripts in the project directory with P set, as
# a reader's shell would, and judges the program's output (c_page_check: a float64 AdamW
# step, and the page's "It prints:" block). Where the library has its CUDA backend, the
# page's CMakeLists.txt must also have built the GPU program. MODE=gpu (docs_c_page_gpu,
# after docs_c_page): runs the page's GPU script and judges its output the same way, or
# says SKIPPED and why (no CUDA device, or a library without CUDA).
#
#   cmake -DMODE=page|gpu -DSHARDADAM_BINARY_DIR=<build dir> -DPAGE=<docs/c.md>
#         -DDOC_BLOCKS=<doc_blocks> -DCHECK=<c_page_check> -DWORK_DIR=<scratch dir>
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

set(prefix "${WORK_DIR}/prefix")
set(project "${WORK_DIR}/project")
set(shims "${WORK_DIR}/bin")

load_cache("${SHARDADAM_BINARY_DIR}" READ_WITH_PREFIX SA_
  CMAKE_C_COMPILER CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE CMAKE_C_FLAGS CMAKE_CXX_FLAGS
  CMAKE_EXE_LINKER_FLAGS CMAKE_CUDA_COMPILER)
if(NOT SA_CMAKE_C_COMPILER)
  message(FATAL_ERROR "run_c_page_test: ${SHARDADAM_BINARY_DIR} is not a configured CMake build tree")
endif()
# The library has its CUDA backend when the build made the module.
file(GLOB cuda_module "${SHARDADAM_BINARY_DIR}/libshardadam-cuda.so*")

# Runs a script of the page (<name>.sh, in the project directory) as a reader's shell would,
# with $P the install; leaves its output in WORK_DIR/<name>.log and in `script_output`.
function(run_page_script name)
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
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E env ${env} sh -ex "${project}/${name}.sh"
    WORKING_DIRECTORY "${project}"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  file(WRITE "${WORK_DIR}/${name}.log" "${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run_c_page_test: docs/c.md's script '${name}' failed (${rc}):\n${out}")
  endif()
  message(STATUS "run_c_page_test: script '${name}': ok")
  set(script_output "${out}" PARENT_SCOPE)
endfunction()

# Judges the output of script <name> against the float64 step and the page.
function(check_output name)
  execute_process(
    COMMAND "${CHECK}" "${WORK_DIR}/${name}.log" "${project}/first_step.out"
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    file(READ "${WORK_DIR}/${name}.log" log)
    message(FATAL_ERROR "run_c_page_test: what docs/c.md's script '${name}' printed is wrong:\n"
      "${out}--- its output ---\n${log}")
  endif()
  message(STATUS "run_c_page_test: ${name}: ${out}")
endfunction()

if(MODE STREQUAL "page")
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${project}" "${shims}")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" --install "${SHARDADAM_BINARY_DIR}" --prefix "${prefix}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run_c_page_test: installing ${SHARDADAM_BINARY_DIR} failed:\n${out}")
  endif()
  execute_process(
    COMMAND "${DOC_BLOCKS}" "${PAGE}" "${project}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run_c_page_test: taking the blocks out of the page failed:\n${out}")
  endif()
  message(STATUS "${out}")
  foreach(file IN ITEMS CMakeLists.txt first_step.c first_step_gpu.cpp find_package.sh
                        pkg_config.sh gpu.sh first_step.out)
    if(NOT EXISTS "${project}/${file}")
      message(FATAL_ERROR "run_c_page_test: docs/c.md has no block marked for ${file}")
    endif()
  endforeach()
  # The page's `cc`: the build's C compiler, its flags, and warnings as errors.
  file(WRITE "${shims}/cc"
    "#!/bin/sh\nexec \"${SA_CMAKE_C_COMPILER}\" ${SA_CMAKE_C_FLAGS} -Wall -Wextra -Wpedantic -Werror \"$@\" ${SA_CMAKE_EXE_LINKER_FLAGS}\n")
  file(CHMOD "${shims}/cc" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE)

  run_page_script(find_package)
  check_output(find_package)
  if(cuda_module AND NOT EXISTS "${project}/build/first_step_gpu")
    message(FATAL_ERROR "run_c_page_test: the library has its CUDA backend, but the page's "
      "CMakeLists.txt did not build first_step_gpu (no CUDA toolkit found?):\n${script_output}")
  endif()
  run_page_script(pkg_config)
  check_output(pkg_config)
elseif(MODE STREQUAL "gpu")
  if(NOT cuda_module)
    message(STATUS "SKIPPED: the library was built without its CUDA backend")
    return()
  endif()
  if(NOT EXISTS "${project}/build/first_step_gpu")
    message(FATAL_ERROR "run_c_page_test: no ${project}/build/first_step_gpu: run docs_c_page first")
  endif()
  run_page_script(gpu)
  if(script_output MATCHES "SKIPPED[^\n]*")
    message(STATUS "${CMAKE_MATCH_0}")
    return()
  endif()
  check_output(gpu)
else()
  message(FATAL_ERROR "run_c_page_test: MODE is page or gpu, not '${MODE}'")
endif()
