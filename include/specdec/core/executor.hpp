// Executors: where an op runs. Every op's front door has one overload per executor:
//   ops::tree_build(CpuExecutor{}, params)            -- the CPU reference, host pointers
//   ops::tree_build(CudaExecutor{stream}, params)     -- the CUDA kernel, device pointers
// CudaExecutor is defined in core/cuda.cuh and exists only in CUDA translation units.
#pragma once

namespace specdec {

// Runs an op's plain-loop reference on the calling thread; every pointer in the params is host memory.
struct CpuExecutor {};

}  // namespace specdec
