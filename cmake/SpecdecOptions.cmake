# Options and toolchain discovery. CUDA is on wherever nvcc is found; -DSPECDEC_ENABLE_CUDA=OFF
# forces a CPU-only build. NCCL is optional and found by cmake/FindNCCL.cmake.
include(GNUInstallDirs)
include(CheckLanguage)

option(SPECDEC_ENABLE_CUDA "Build CUDA kernels, tests and benchmarks when nvcc is found" ON)
option(SPECDEC_BUILD_TESTS "Build the test suite" ${PROJECT_IS_TOP_LEVEL})
option(SPECDEC_BUILD_EXAMPLES "Build the example binaries" ${PROJECT_IS_TOP_LEVEL})
option(SPECDEC_BUILD_BENCHMARKS "Build the Google Benchmark microbenchmarks" ${PROJECT_IS_TOP_LEVEL})

set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

set(SPECDEC_CUDA OFF)
if(SPECDEC_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # H100 / H200
    endif()
    enable_language(CUDA)
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      # CMake 3.25 predates nvcc 13 and does not know its C++20 dialect flag.
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(SPECDEC_CUDA ON)
    message(STATUS "specdec: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "specdec: nvcc not found; building the CPU path only")
  endif()
else()
  message(STATUS "specdec: CUDA disabled by SPECDEC_ENABLE_CUDA=OFF; building the CPU path only")
endif()

# JSON (safetensors headers, config.json, index files): Debian's nlohmann-json3-dev.
find_package(nlohmann_json 3.2 REQUIRED)
# Eigen: the CPU executor's matrix products (model/kimi/forward_cpu.hpp).
find_package(Eigen3 3.4 REQUIRED NO_MODULE)
# std::thread (the random-checkpoint writer generates tensors on every core).
find_package(Threads REQUIRED)

# NCCL: the GPUs' communicator (dist/nccl.cuh); without it, --tp-size > 1 runs on the CPU only.
set(SPECDEC_NCCL OFF)
if(SPECDEC_CUDA)
  find_package(NCCL)
  if(NCCL_FOUND)
    set(SPECDEC_NCCL ON)
    message(STATUS "specdec: NCCL ${NCCL_VERSION} at ${NCCL_LIBRARY}")
  else()
    message(STATUS "specdec: NCCL not found; tensor parallel on GPUs is not built (the CPU "
                   "communicator still is)")
  endif()
endif()

# PCRE2 (Debian's libpcre2-dev), optional: the tokenizer's split pattern. Found: the interface
# target specdec::tokenizer (specdec + PCRE2, SPECDEC_HAVE_PCRE2=1) for code that includes
# io/tokenizer.hpp, and its tests and benchmark; not found: those are not built.
find_package(SpecdecPcre2)
set(SPECDEC_HAVE_PCRE2 ${SpecdecPcre2_FOUND})
if(SPECDEC_HAVE_PCRE2)
  add_library(specdec_tokenizer INTERFACE)
  add_library(specdec::tokenizer ALIAS specdec_tokenizer)
  target_link_libraries(specdec_tokenizer INTERFACE specdec SpecdecPcre2::pcre2)
  target_compile_definitions(specdec_tokenizer INTERFACE SPECDEC_HAVE_PCRE2=1)
  message(STATUS "specdec: PCRE2 ${SpecdecPcre2_VERSION} (${_specdec_pcre2_found_by}); "
                 "the tokenizer (specdec::tokenizer) is built")
else()
  message(STATUS "specdec: PCRE2 not found (apt: libpcre2-dev); the tokenizer "
                 "(io/tokenizer.hpp), its tests and its benchmark are not built")
endif()
