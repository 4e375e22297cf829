# FindNCCL — locates NCCL (nccl.h and libnccl) and defines NCCL::NCCL.
#
# Looks beside the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS, CUDAToolkit_LIBRARY_DIR: call
# find_package(CUDAToolkit) first), under $NCCL_HOME, then in the system paths. Set
# NCCL_INCLUDE_DIR and NCCL_LIBRARY to choose one yourself. NCCL_VERSION is read from nccl.h.
include(FindPackageHandleStandardArgs)

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ENV NCCL_HOME
  PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR[ \t]+[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR[ \t]+[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH[ \t]+[0-9]+")
  string(REGEX MATCH "[0-9]+$" _nccl_major "${_nccl_major}")
  string(REGEX MATCH "[0-9]+$" _nccl_minor "${_nccl_minor}")
  string(REGEX MATCH "[0-9]+$" _nccl_patch "${_nccl_patch}")
  if(_nccl_major)
    set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
  endif()
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
