# Every public header compiles on its own: one generated translation unit per header, .hpp as
# C++ (host compiler), .cuh as CUDA. Built as part of `all`, so a header that is not
# self-contained breaks the build.
file(GLOB_RECURSE public_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include
     ${PROJECT_SOURCE_DIR}/include/specdec/*.hpp ${PROJECT_SOURCE_DIR}/include/specdec/*.cuh)
set(header_tus)
foreach(header ${public_headers})
  string(MAKE_C_IDENTIFIER ${header} id)
  if(header MATCHES "\\.cuh$")
    if(NOT SPECDEC_CUDA)
      continue()
    endif()
    set(tu ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cu)
  else()
    set(tu ${CMAKE_CURRENT_BINARY_DIR}/header_check/${id}.cpp)
  endif()
  file(CONFIGURE OUTPUT ${tu} CONTENT "#include \"${header}\"\n#include \"${header}\"  // include guard\n")
  list(APPEND header_tus ${tu})
endforeach()
add_library(specdec_header_check OBJECT ${header_tus})
target_link_libraries(specdec_header_check PRIVATE specdec::specdec)
target_compile_options(specdec_header_check PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror>)
