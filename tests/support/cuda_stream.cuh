// A CUDA stream owned by a test: created on construction (the test fails if it cannot be),
// destroyed on scope exit, so a failing REQUIRE never leaks it. Graph capture needs such a
// stream; the legacy default stream cannot be captured.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include "specdec/core/cuda.cuh"

namespace specdec::testing {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE(cudaStreamCreate(&s) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(Stream const&) = delete;
  Stream& operator=(Stream const&) = delete;
  CudaExecutor exec() const { return CudaExecutor{s}; }
};

}  // namespace specdec::testing
