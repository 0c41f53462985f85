# FindSpecdecPcre2: PCRE2's 8-bit library, which the tokenizer (include/specdec/io/tokenizer.hpp)
# needs for its split pattern; optional: without it everything else builds. pkg-config's
# libpcre2-8 first, else pcre2.h and libpcre2-8 on the usual paths (hint: PCRE2_ROOT).
# Sets SpecdecPcre2_FOUND, SpecdecPcre2_VERSION and the imported target SpecdecPcre2::pcre2.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
endif()
if(PCRE2_FOUND)
  set(SpecdecPcre2_VERSION ${PCRE2_VERSION})
  set(_specdec_pcre2_found_by "pkg-config libpcre2-8")
else()
  find_path(PCRE2_INCLUDE_DIR pcre2.h HINTS ${PCRE2_ROOT} $ENV{PCRE2_ROOT} PATH_SUFFIXES include)
  find_library(PCRE2_LIBRARY NAMES pcre2-8 HINTS ${PCRE2_ROOT} $ENV{PCRE2_ROOT}
               PATH_SUFFIXES lib lib64)
  if(PCRE2_INCLUDE_DIR AND EXISTS "${PCRE2_INCLUDE_DIR}/pcre2.h")
    file(STRINGS "${PCRE2_INCLUDE_DIR}/pcre2.h" _pcre2_version_lines
         REGEX "#define PCRE2_(MAJOR|MINOR) ")
    string(REGEX MATCH "PCRE2_MAJOR +([0-9]+)" _m "${_pcre2_version_lines}")
    set(_pcre2_major "${CMAKE_MATCH_1}")
    string(REGEX MATCH "PCRE2_MINOR +([0-9]+)" _m "${_pcre2_version_lines}")
    set(SpecdecPcre2_VERSION "${_pcre2_major}.${CMAKE_MATCH_1}")
  endif()
  set(_specdec_pcre2_found_by "${PCRE2_LIBRARY}")
  mark_as_advanced(PCRE2_INCLUDE_DIR PCRE2_LIBRARY)
endif()

include(FindPackageHandleStandardArgs)
if(PCRE2_FOUND)
  find_package_handle_standard_args(SpecdecPcre2 REQUIRED_VARS PCRE2_LINK_LIBRARIES
                                    VERSION_VAR SpecdecPcre2_VERSION)
else()
  find_package_handle_standard_args(SpecdecPcre2 REQUIRED_VARS PCRE2_LIBRARY PCRE2_INCLUDE_DIR
                                    VERSION_VAR SpecdecPcre2_VERSION)
endif()

if(SpecdecPcre2_FOUND AND NOT TARGET SpecdecPcre2::pcre2)
  add_library(SpecdecPcre2::pcre2 INTERFACE IMPORTED)
  if(PCRE2_FOUND)
    target_link_libraries(SpecdecPcre2::pcre2 INTERFACE PkgConfig::PCRE2)
  else()
    target_link_libraries(SpecdecPcre2::pcre2 INTERFACE ${PCRE2_LIBRARY})
    target_include_directories(SpecdecPcre2::pcre2 INTERFACE ${PCRE2_INCLUDE_DIR})
  endif()
  target_compile_definitions(SpecdecPcre2::pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
endif()
