// Entry point of the CUDA test binary: exits 77 (ctest's "skipped") when there is no GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "specdec/core/cuda.cuh"

int main(int argc, char** argv) {
  if (!specdec::cuda_device_available()) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
