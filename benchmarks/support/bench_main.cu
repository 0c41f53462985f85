// Entry point of the op benchmarks: exits 0 with a note when there is no GPU.
#include <benchmark/benchmark.h>

#include <cstdio>

#include "specdec/core/cuda.cuh"

int main(int argc, char** argv) {
  if (!specdec::cuda_device_available()) {
    std::printf("no CUDA device: benchmarks not run\n");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
