// CUDA plumbing: the CudaExecutor, Status from CUDA errors, an owning device buffer, and a
// query for whether a GPU is present (tests skip themselves without one).
// Kernels live in headers, so a kernel that is not a template is declared `static __global__`:
// every translation unit of a binary may include it (a plain one would be defined in each and
// fail to link).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec {

// Runs an op's CUDA kernel on `stream`; every pointer in the params is device memory. Launches
// never synchronise the host, so a front door can be captured into a CUDA graph.
struct CudaExecutor {
  cudaStream_t stream = nullptr;
};

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::CudaError(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ")");
}

// Status of the most recent kernel launch on this thread.
inline Status cuda_launch_status(const char* kernel_name) {
  return cuda_status(cudaGetLastError(), kernel_name);
}

inline bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Owning, move-only device allocation of `count` elements of T (for tests, benchmarks, demos;
// the ops themselves never allocate).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0 && cudaMalloc(&ptr_, count_ * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      count_ = 0;
    }
  }
  // Allocates and copies `host`; on failure the buffer is empty (size() == 0).
  explicit DeviceBuffer(std::vector<T> const& host) : DeviceBuffer(host.size()) {
    if (!upload(host).ok()) *this = DeviceBuffer();
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  DeviceBuffer(DeviceBuffer const&) = delete;
  DeviceBuffer& operator=(DeviceBuffer const&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }

  T* data() const { return ptr_; }
  size_t size() const { return count_; }
  bool valid() const { return ptr_ != nullptr || count_ == 0; }

  Status upload(std::vector<T> const& host) {
    if (host.size() != count_) return Status::InvalidArgument("DeviceBuffer::upload: size mismatch");
    return cuda_status(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
                       "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Fills every byte with `byte` (tests poison outputs with 0xff before a run).
  Status fill_bytes(int byte) {
    return cuda_status(cudaMemset(ptr_, byte, count_ * sizeof(T)), "cudaMemset");
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace specdec

// Returns a kCudaError Status from the enclosing function when a CUDA call fails.
#define SPECDEC_CUDA_TRY(expr) SPECDEC_RETURN_IF_ERROR(::specdec::cuda_status((expr), #expr))
