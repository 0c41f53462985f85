// specdec umbrella for CUDA translation units: everything in specdec.hpp, with each op's front
// door gaining its CudaExecutor overload (the op headers include their kernels under nvcc), plus
// the CUDA plumbing (CudaExecutor, DeviceBuffer, cuda_status). The Kimi CUDA executor
// (model/kimi/forward_cuda.cuh, cuBLAS) is included on its own.
#pragma once

#include "specdec/core/cuda.cuh"
#include "specdec/specdec.hpp"
