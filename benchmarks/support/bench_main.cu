// Entry point of the op benchmarks: exits 0 with a note when there is no GPU (listing the
// benchmarks with --benchmark_list_tests works anywhere).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>

#include "specdec/core/cuda.cuh"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strstr(argv[i], "--benchmark_list_tests");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!listing && !specdec::cuda_device_available()) {
    std::printf("no CUDA device: benchmarks not run\n");
    return 0;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
