# FindNCCL: locates the NCCL header and library (CUDA toolkit install or system packages).
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported target NCCL::nccl.
# Hints: NCCL_ROOT, $ENV{NCCL_ROOT}, CUDAToolkit_ROOT, /usr/local/cuda.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_ROOT}
    $ENV{CUDA_HOME} /usr/local/cuda)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part} +([0-9]+)" _m "${_nccl_version_lines}")
    set(NCCL_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
