# check_exports.cmake — the library exports only sa_* symbols, carries the soname of its
# major version and needs neither the CUDA runtime nor NCCL (the CUDA backend module does,
# and it exports its entry point only).
#
#   cmake -DLIB=/path/to/libshardadam.so [-DMODULE=/path/to/libshardadam-cuda.so] -P check_exports.cmake
#
# Uses binutils: `nm -D --defined-only` lists what the dynamic symbol table defines (the
# version script's anonymous node shows up as nothing; a leaked C++ symbol, a vendored
# library's entry point or a missing visibility attribute shows up by name), and
# `readelf -d` the SONAME.
cmake_minimum_required(VERSION 3.24)

if(NOT LIB)
  message(FATAL_ERROR "check_exports: pass -DLIB=<path to libshardadam.so>")
endif()
if(NOT EXISTS "${LIB}")
  message(FATAL_ERROR "check_exports: ${LIB} does not exist")
endif()

find_program(NM_EXECUTABLE NAMES nm REQUIRED)
find_program(READELF_EXECUTABLE NAMES readelf REQUIRED)

# ---- only sa_* is exported -------------------------------------------------------------
execute_process(
  COMMAND "${NM_EXECUTABLE}" -D --defined-only "${LIB}"
  OUTPUT_VARIABLE nm_out
  ERROR_VARIABLE nm_err
  RESULT_VARIABLE nm_rc)
if(NOT nm_rc EQUAL 0)
  message(FATAL_ERROR "check_exports: nm -D --defined-only ${LIB} failed (${nm_rc}): ${nm_err}")
endif()

string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported "")
set(foreign "")
foreach(line IN LISTS nm_lines)
  # "<address> <type> <name>" with the name possibly versioned ("name@@VERS").
  if(line MATCHES "^[0-9a-fA-F]+[ \t]+([A-Za-z])[ \t]+([^ \t@]+)")
    set(name "${CMAKE_MATCH_2}")
    list(APPEND exported "${name}")
    if(NOT name MATCHES "^sa_")
      list(APPEND foreign "${CMAKE_MATCH_1} ${name}")
    endif()
  endif()
endforeach()

list(LENGTH exported n_exported)
if(n_exported EQUAL 0)
  message(FATAL_ERROR "check_exports: ${LIB} exports no symbols at all; nm said:\n${nm_out}")
endif()
if(foreign)
  list(LENGTH foreign n_foreign)
  list(JOIN foreign "\n  " foreign_text)
  message(FATAL_ERROR
    "check_exports: ${LIB} exports ${n_foreign} symbol(s) that do not start with sa_:\n"
    "  ${foreign_text}\n"
    "Only the C ABI may leave the library: check src/shardadam.map and the visibility settings.")
endif()
foreach(required IN ITEMS sa_version sa_build_info sa_optimizer_create sa_optimizer_step)
  if(NOT required IN_LIST exported)
    message(FATAL_ERROR "check_exports: ${LIB} does not export ${required}")
  endif()
endforeach()

# ---- the soname carries the major version ----------------------------------------------
execute_process(
  COMMAND "${READELF_EXECUTABLE}" -d "${LIB}"
  OUTPUT_VARIABLE readelf_out
  ERROR_VARIABLE readelf_err
  RESULT_VARIABLE readelf_rc)
if(NOT readelf_rc EQUAL 0)
  message(FATAL_ERROR "check_exports: readelf -d ${LIB} failed (${readelf_rc}): ${readelf_err}")
endif()
if(NOT readelf_out MATCHES "\\(SONAME\\)[^\n]*\\[([^\n]*)\\]")
  message(FATAL_ERROR "check_exports: ${LIB} has no SONAME; readelf -d said:\n${readelf_out}")
endif()
set(soname "${CMAKE_MATCH_1}")
if(NOT soname STREQUAL "libshardadam.so.0")
  message(FATAL_ERROR "check_exports: the SONAME of ${LIB} is '${soname}', expected 'libshardadam.so.0'")
endif()

# Fails when `file` (its `readelf -d` output in `readelf_text`) NEEDs a library matching
# `pattern` at load time; `why` ends the message.
function(refuse_needed file readelf_text pattern why)
  string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]*\\]" needed "${readelf_text}")
  foreach(entry IN LISTS needed)
    if(entry MATCHES "${pattern}")
      message(FATAL_ERROR "check_exports: ${file} needs ${entry} at load time; ${why}")
    endif()
  endforeach()
endfunction()

# ---- no CUDA at load time: libshardadam-cuda.so carries it ---------------------------------
refuse_needed("${LIB}" "${readelf_out}" "libcuda|libcudart|libnccl|libnvrtc|libcublas"
  "CUDA belongs in the backend module (src/backends/cuda_module.hpp)")

if(MODULE)
  execute_process(COMMAND "${NM_EXECUTABLE}" -D --defined-only "${MODULE}"
    OUTPUT_VARIABLE module_nm RESULT_VARIABLE module_rc)
  if(NOT module_rc EQUAL 0)
    message(FATAL_ERROR "check_exports: nm -D --defined-only ${MODULE} failed (${module_rc})")
  endif()
  string(REGEX MATCHALL "[0-9a-fA-F]+[ \t]+[A-Za-z][ \t]+[^ \t\n@]+" module_syms "${module_nm}")
  list(LENGTH module_syms n_module)
  if(NOT n_module EQUAL 1 OR NOT module_nm MATCHES " T sa_cuda_module_v1")
    message(FATAL_ERROR "check_exports: ${MODULE} must export sa_cuda_module_v1 only; nm said:\n${module_nm}")
  endif()
  message(STATUS "check_exports: ${MODULE} exports sa_cuda_module_v1 only")
  # NCCL is loaded when a communicator needs it (src/comm/nccl_comm.cpp), so the module
  # loads on GPU machines without NCCL.
  execute_process(COMMAND "${READELF_EXECUTABLE}" -d "${MODULE}"
    OUTPUT_VARIABLE module_readelf RESULT_VARIABLE module_readelf_rc)
  if(NOT module_readelf_rc EQUAL 0)
    message(FATAL_ERROR "check_exports: readelf -d ${MODULE} failed (${module_readelf_rc})")
  endif()
  refuse_needed("${MODULE}" "${module_readelf}" "libnccl|libcudart"
    "NCCL is loaded on first use and cudart is linked statically")
  message(STATUS "check_exports: ${MODULE} needs neither libnccl nor libcudart at load time")
endif()

list(JOIN exported ", " exported_text)
message(STATUS "check_exports: ${n_exported} exported symbols, all sa_*; SONAME ${soname}")
message(STATUS "  ${exported_text}")
