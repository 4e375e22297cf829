# FindDLPack — locates <dlpack/dlpack.h> of DLPack >= 1.0 and defines DLPack::DLPack.
#
# Debian's libdlpack-dev is 0.6 (no DLManagedTensorVersioned), so this also looks where
# Python packages ship a current header: the apache-tvm-ffi wheel (tvm_ffi/include), torch
# and cupy. Set DLPack_INCLUDE_DIR to point at a directory containing dlpack/dlpack.h to
# choose one yourself.
include(FindPackageHandleStandardArgs)

if(NOT DLPack_INCLUDE_DIR)
  set(_dlpack_hints "")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
      OUTPUT_VARIABLE _dlpack_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_dlpack_site)
      list(APPEND _dlpack_hints ${_dlpack_site}/tvm_ffi/include
           ${_dlpack_site}/tvm_ffi/3rdparty/dlpack/include ${_dlpack_site}/torch/include)
    endif()
  endif()
  # Candidates in order; keep the first whose version is >= 1.0 (a system 0.6 header
  # must not shadow a newer one from a wheel).
  foreach(_dir IN LISTS _dlpack_hints ITEMS /usr/local/include /usr/include)
    if(EXISTS "${_dir}/dlpack/dlpack.h")
      file(STRINGS "${_dir}/dlpack/dlpack.h" _major REGEX "^#define DLPACK_MAJOR_VERSION")
      string(REGEX MATCH "[0-9]+" _major "${_major}")
      if(_major AND _major GREATER_EQUAL 1)
        set(DLPack_INCLUDE_DIR "${_dir}" CACHE PATH "Directory holding dlpack/dlpack.h (>= 1.0)")
        break()
      endif()
    endif()
  endforeach()
endif()

# DLPack_HEADER is required too, so that a DLPack_INCLUDE_DIR without the header fails here
# and not at the first #include.
unset(DLPack_HEADER)
if(DLPack_INCLUDE_DIR AND EXISTS "${DLPack_INCLUDE_DIR}/dlpack/dlpack.h")
  set(DLPack_HEADER "${DLPack_INCLUDE_DIR}/dlpack/dlpack.h")
  file(STRINGS "${DLPack_HEADER}" _major REGEX "^#define DLPACK_MAJOR_VERSION")
  file(STRINGS "${DLPack_HEADER}" _minor REGEX "^#define DLPACK_MINOR_VERSION")
  string(REGEX MATCH "[0-9]+" _major "${_major}")
  string(REGEX MATCH "[0-9]+" _minor "${_minor}")
  set(DLPack_VERSION "${_major}.${_minor}")
endif()
set(_dlpack_given "")
if(DLPack_INCLUDE_DIR)
  set(_dlpack_given " (DLPack_INCLUDE_DIR is ${DLPack_INCLUDE_DIR})")
endif()

find_package_handle_standard_args(DLPack
  REQUIRED_VARS DLPack_INCLUDE_DIR DLPack_HEADER
  VERSION_VAR DLPack_VERSION
  REASON_FAILURE_MESSAGE "need <DLPack_INCLUDE_DIR>/dlpack/dlpack.h >= 1.0${_dlpack_given}: `pip install apache-tvm-ffi`, or set DLPack_INCLUDE_DIR to a directory holding dlpack/dlpack.h")

if(DLPack_FOUND AND NOT TARGET DLPack::DLPack)
  add_library(DLPack::DLPack INTERFACE IMPORTED)
  set_target_properties(DLPack::DLPack PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${DLPack_INCLUDE_DIR}")
endif()
