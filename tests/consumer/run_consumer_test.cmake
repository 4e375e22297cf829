# run_consumer_test.cmake — uses a shardadam install the way a user on another machine
# would. It installs a shardadam build tree into a scratch prefix, then moves the prefix
# somewhere else (an install must not depend on where it was made, nor on the build
# machine), checks that no installed file names the source, build, install or DLPack
# directory of the build, and builds and runs the consumer project against the moved
# prefix twice: (a) with find_package(shardadam), (b) with plain
# `cc main.c $(pkg-config --cflags --libs shardadam)`.
#
#   cmake -DSHARDADAM_SOURCE_DIR=<shardadam source dir> -DSHARDADAM_BINARY_DIR=<its build dir>
#         -DCONSUMER_SOURCE_DIR=<this dir> -DWORK_DIR=<scratch dir> -P run_consumer_test.cmake
#
# Each stage stops the test with the stage's name and its full output when it fails.
cmake_minimum_required(VERSION 3.24)

foreach(var IN ITEMS SHARDADAM_SOURCE_DIR SHARDADAM_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer_test: pass -D${var}=...")
  endif()
endforeach()

set(install_prefix "${WORK_DIR}/installed")
set(prefix "${WORK_DIR}/elsewhere/shardadam")  # where the install is moved; all later stages use it
set(consumer_build "${WORK_DIR}/build")
set(pkg_config_build "${WORK_DIR}/pkg-config")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/elsewhere" "${pkg_config_build}")

# Runs one stage; on failure prints its command and output and stops. Leaves the stage's
# standard output in stage_output.
function(run_stage name)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "run_consumer_test: stage '${name}' failed (${rc})\n"
      "command: ${command}\n--- stdout ---\n${out}\n--- stderr ---\n${err}")
  endif()
  message(STATUS "run_consumer_test: ${name}: ok")
  if(name MATCHES "^run " AND out)
    message(STATUS "${out}")
  endif()
  set(stage_output "${out}" PARENT_SCOPE)
endfunction()

# The consumer is built with the compilers and flags of the shardadam build, so a build
# with sanitizers (flags in the cache) gets a consumer with the same runtime.
load_cache("${SHARDADAM_BINARY_DIR}" READ_WITH_PREFIX SA_
  CMAKE_GENERATOR CMAKE_C_COMPILER CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE
  CMAKE_C_FLAGS CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS DLPack_INCLUDE_DIR)
if(NOT SA_CMAKE_GENERATOR)
  message(FATAL_ERROR "run_consumer_test: ${SHARDADAM_BINARY_DIR} is not a configured CMake build tree")
endif()
set(build_type "${SA_CMAKE_BUILD_TYPE}")
if(NOT build_type)
  set(build_type Release)
endif()
string(TOUPPER "${build_type}" build_type_upper)
load_cache("${SHARDADAM_BINARY_DIR}" READ_WITH_PREFIX SA_
  CMAKE_C_FLAGS_${build_type_upper} CMAKE_CXX_FLAGS_${build_type_upper})

# 1. install, then move the prefix: nothing of the install may point back at where it was.
run_stage(install
  "${CMAKE_COMMAND}" --install "${SHARDADAM_BINARY_DIR}" --prefix "${install_prefix}" --config "${build_type}")
file(RENAME "${install_prefix}" "${prefix}")
message(STATUS "run_consumer_test: moved the install to ${prefix}")

# 2. No installed file names a directory of the build machine. Binaries are searched too
# (a build RPATH left in them would be one), except where the build's own flags put source
# paths in them on purpose: debug info (-g) and sanitizer reports (-fsanitize).
set(build_dirs "${SHARDADAM_SOURCE_DIR}" "${SHARDADAM_BINARY_DIR}" "${install_prefix}")
if(SA_DLPack_INCLUDE_DIR AND NOT SA_DLPack_INCLUDE_DIR MATCHES "^/usr(/local)?/include/?$")
  list(APPEND build_dirs "${SA_DLPack_INCLUDE_DIR}")
endif()
set(build_flags "${SA_CMAKE_C_FLAGS} ${SA_CMAKE_CXX_FLAGS} ${SA_CMAKE_C_FLAGS_${build_type_upper}} ${SA_CMAKE_CXX_FLAGS_${build_type_upper}}")
set(check_binaries ON)
if(build_flags MATCHES "(^| )(-g[^ ]*|-fsanitize=[^ ]*)( |$)")
  set(check_binaries OFF)
  message(STATUS "run_consumer_test: binaries not searched for build paths (this build's flags "
                 "embed them: ${CMAKE_MATCH_2})")
endif()
file(GLOB_RECURSE installed_files LIST_DIRECTORIES false "${prefix}/*")
set(leaks "")
set(searched 0)
foreach(file IN LISTS installed_files)
  if(IS_SYMLINK "${file}")
    continue()
  endif()
  file(READ "${file}" magic LIMIT 4 HEX)
  if(magic STREQUAL "7f454c46" AND NOT check_binaries)
    continue()
  endif()
  math(EXPR searched "${searched} + 1")
  foreach(dir IN LISTS build_dirs)
    string(REGEX REPLACE "([][+.*()^$?|])" "\\\\\\1" dir_regex "${dir}")
    file(STRINGS "${file}" hits REGEX "${dir_regex}")
    if(hits)
      list(GET hits 0 hit)
      file(RELATIVE_PATH shown "${prefix}" "${file}")
      string(APPEND leaks "\n  ${shown} names ${dir}: ${hit}")
    endif()
  endforeach()
endforeach()
if(leaks)
  message(FATAL_ERROR "run_consumer_test: installed files name directories of the build machine, "
    "so the install works only where it was made:${leaks}")
endif()
message(STATUS "run_consumer_test: no build path in the ${searched} installed files searched: ok")

# 3. (a) find_package: only CMAKE_PREFIX_PATH points at the install, as a user would set it.
run_stage("configure (find_package)"
  "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
  -G "${SA_CMAKE_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_BUILD_TYPE=${build_type}"
  "-DCMAKE_C_COMPILER=${SA_CMAKE_C_COMPILER}"
  "-DCMAKE_CXX_COMPILER=${SA_CMAKE_CXX_COMPILER}"
  "-DCMAKE_C_FLAGS=${SA_CMAKE_C_FLAGS}"
  "-DCMAKE_CXX_FLAGS=${SA_CMAKE_CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${SA_CMAKE_EXE_LINKER_FLAGS}")
# The consumer sets no DLPack_INCLUDE_DIR: it must get the dlpack.h installed with shardadam.
if(NOT stage_output MATCHES "consumer: dlpack/dlpack.h from ([^\n]*)")
  message(FATAL_ERROR "run_consumer_test: the consumer's configure did not say where dlpack.h is from:\n${stage_output}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL "${prefix}/include/shardadam")
  message(FATAL_ERROR "run_consumer_test: find_package(shardadam) gave the consumer dlpack.h from "
    "'${CMAKE_MATCH_1}', expected the installed copy in ${prefix}/include/shardadam")
endif()
run_stage("build (find_package)" "${CMAKE_COMMAND}" --build "${consumer_build}" --config "${build_type}")

# The executables find the installed library through their build RPATH (CMake adds the
# directory of an imported shared library outside the system paths).
foreach(program IN ITEMS consumer_c consumer_cpp)
  set(exe "${consumer_build}/${program}")
  if(NOT EXISTS "${exe}")
    file(GLOB exe "${consumer_build}/*/${program}")  # multi-config generators
  endif()
  if(NOT exe)
    message(FATAL_ERROR "run_consumer_test: the build produced no ${program}")
  endif()
  run_stage("run ${program}" "${exe}")
endforeach()

# 4. (b) pkg-config, through a shell as a user types it: PKG_CONFIG_PATH names the moved
# install, and the program finds the library through the rpath docs/build.md suggests.
find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf)
if(NOT PKG_CONFIG_EXECUTABLE)
  message(FATAL_ERROR "run_consumer_test: pkg-config not found (Debian: pkgconf), so the installed shardadam.pc cannot be checked")
endif()
file(GLOB_RECURSE pc_files "${prefix}/*/pkgconfig/shardadam.pc")
if(NOT pc_files)
  message(FATAL_ERROR "run_consumer_test: the install has no <libdir>/pkgconfig/shardadam.pc")
endif()
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir "${pc_file}" DIRECTORY)
set(pc_env "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pc_dir}" "PKG_CONFIG=${PKG_CONFIG_EXECUTABLE}")
run_stage("pkg-config libdir" ${pc_env} "${PKG_CONFIG_EXECUTABLE}" --variable=libdir shardadam)
string(STRIP "${stage_output}" pc_libdir)
run_stage("build (pkg-config)" ${pc_env} sh -c
  "\"${SA_CMAKE_C_COMPILER}\" ${SA_CMAKE_C_FLAGS} -std=c99 -Wall -Wextra -Wpedantic -Werror \
\"${CONSUMER_SOURCE_DIR}/main.c\" -o \"${pkg_config_build}/consumer_c_pkg_config\" \
$(\"$PKG_CONFIG\" --cflags --libs shardadam) -Wl,-rpath,\"${pc_libdir}\" ${SA_CMAKE_EXE_LINKER_FLAGS}")
run_stage("run consumer_c_pkg_config" "${pkg_config_build}/consumer_c_pkg_config")
