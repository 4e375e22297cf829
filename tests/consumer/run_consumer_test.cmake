# run_consumer_test.cmake — installs a shardadam build tree into a scratch prefix, then
# configures, builds and runs the consumer project against it with find_package().
#
#   cmake -DSHARDADAM_BINARY_DIR=<shardadam build dir> -DCONSUMER_SOURCE_DIR=<this dir>
#         -DWORK_DIR=<scratch dir> -P run_consumer_test.cmake
#
# Each stage stops the test with the stage's name and its full output when it fails.
cmake_minimum_required(VERSION 3.24)

foreach(var IN ITEMS SHARDADAM_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer_test: pass -D${var}=...")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs one stage; on failure prints its command and output and stops.
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
endfunction()

# The consumer is built with the compilers and flags of the shardadam build, so a build
# with sanitizers (flags in the cache) gets a consumer with the same runtime.
load_cache("${SHARDADAM_BINARY_DIR}" READ_WITH_PREFIX SA_
  CMAKE_GENERATOR CMAKE_C_COMPILER CMAKE_CXX_COMPILER CMAKE_BUILD_TYPE
  CMAKE_C_FLAGS CMAKE_CXX_FLAGS CMAKE_EXE_LINKER_FLAGS)
if(NOT SA_CMAKE_GENERATOR)
  message(FATAL_ERROR "run_consumer_test: ${SHARDADAM_BINARY_DIR} is not a configured CMake build tree")
endif()
set(build_type "${SA_CMAKE_BUILD_TYPE}")
if(NOT build_type)
  set(build_type Release)
endif()

# 1. install
run_stage(install
  "${CMAKE_COMMAND}" --install "${SHARDADAM_BINARY_DIR}" --prefix "${prefix}" --config "${build_type}")
file(GLOB_RECURSE config_files "${prefix}/*/shardadam-config.cmake")
if(NOT config_files)
  message(FATAL_ERROR "run_consumer_test: the install into ${prefix} has no shardadam-config.cmake")
endif()

# 2. configure: only CMAKE_PREFIX_PATH points at the install, as a user would set it.
run_stage(configure
  "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
  -G "${SA_CMAKE_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_BUILD_TYPE=${build_type}"
  "-DCMAKE_C_COMPILER=${SA_CMAKE_C_COMPILER}"
  "-DCMAKE_CXX_COMPILER=${SA_CMAKE_CXX_COMPILER}"
  "-DCMAKE_C_FLAGS=${SA_CMAKE_C_FLAGS}"
  "-DCMAKE_CXX_FLAGS=${SA_CMAKE_CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${SA_CMAKE_EXE_LINKER_FLAGS}")

# 3. build
run_stage(build "${CMAKE_COMMAND}" --build "${consumer_build}" --config "${build_type}")

# 4. run: the executables find the installed library through their build RPATH (CMake
# adds the directory of an imported shared library outside the system paths).
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
