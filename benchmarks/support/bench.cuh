// Benchmark harness for CUDA ops. `launch(i, stream)` enqueues one op on `stream` (i counts
// launches, to rotate input sets). The harness captures kLaunchesPerIteration back-to-back
// launches into a CUDA graph once, then times graph replays with CUDA events: manual time = GPU
// time per launch without the host's launch cost (how the engine runs a step), and Google
// Benchmark's repetitions give the median. Inputs are random (never zeros); callers rotate input
// sets larger than L2 where the data would otherwise stay cached.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace specdec::bench {

constexpr int kLaunchesPerIteration = 20;
// Wall time each repetition should last. Google Benchmark's minimum time counts manual time,
// here the time of one launch, a twentieth of a replay's: the minimum it gets is scaled to match.
constexpr double kRepetitionSeconds = 0.1;

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
    std::abort();
  }
}

// `bytes_per_launch` is the fewest bytes the op must move (inputs read once, outputs written once).
template <class Launch>
void time_launches(benchmark::State& state, double bytes_per_launch, Launch&& launch) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < 3; ++i) launch(i, stream);  // warm-up: module load, caches
  check_cuda(cudaStreamSynchronize(stream), "warm-up");

  cudaGraph_t graph;
  cudaGraphExec_t replay;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < kLaunchesPerIteration; ++i) launch(i, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
  check_cuda(cudaGraphInstantiate(&replay, graph, 0), "cudaGraphInstantiate");
  check_cuda(cudaGraphLaunch(replay, stream), "cudaGraphLaunch");
  check_cuda(cudaStreamSynchronize(stream), "graph warm-up");

  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  for (auto _ : state) {
    check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
    check_cuda(cudaGraphLaunch(replay, stream), "cudaGraphLaunch");
    check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms * 1e-3 / kLaunchesPerIteration);
  }
  check_cuda(cudaGetLastError(), "launch");
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes_per_launch, benchmark::Counter::kIsIterationInvariantRate);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(replay);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace specdec::bench

// Registers a CUDA benchmark: manual (event) time, 5 repetitions, median/mean/stddev reported.
#define SPECDEC_CUDA_BENCHMARK(fn)                                                   \
  BENCHMARK(fn)->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(5)      \
      ->ReportAggregatesOnly(true)                                                   \
      ->MinTime(specdec::bench::kRepetitionSeconds / specdec::bench::kLaunchesPerIteration)
