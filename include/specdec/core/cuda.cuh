// CUDA plumbing: the CudaExecutor, Status from CUDA errors, an owning device buffer, a query for
// whether a GPU is present (tests skip themselves without one), and launch_kernel with
// programmatic dependent launch (below).
// Kernels live in headers, so a kernel that is not a template is declared `static __global__`:
// every translation unit of a binary may include it (a plain one would be defined in each and
// fail to link).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
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

// Programmatic dependent launch (sm_90+). launch_kernel launches with the stream attribute that
// lets a kernel's blocks start while the kernel before it on the stream is still finishing, so
// its launch latency and the first loads of data that nothing on the stream writes (weights) hide
// behind the tail of the previous kernel; in a CUDA graph capture the edge is kept. The contract
// of every kernel launched through it: call await_prior_kernels() at the top, unconditionally
// (no early return before it), and before its first read of anything an earlier kernel wrote and
// its first global write (an earlier kernel may still read what it would overwrite); only reads
// of memory no kernel of the stream writes (weights) may precede it, and, in an op's second or
// later kernel, reads of the op's inputs (every block of the op's first kernel passed its wait,
// so the kernels that wrote the inputs were complete, before a later kernel of the op could
// start). The wait returns when the previous kernel has completed and its writes are visible,
// so the order of kernels on a stream stays what it was; a kernel launched without the
// attribute (cuBLAS, NCCL, <<<>>>) is waited for as always. The process-wide switch (on by
// default; set_programmatic_launch(false) for A/B timings) is read at launch: a captured graph
// keeps what it was captured with.
inline std::atomic<bool>& programmatic_launch_flag() {
  static std::atomic<bool> on{true};
  return on;
}
inline void set_programmatic_launch(bool on) { programmatic_launch_flag().store(on); }
// This thread's launches may also turn it off for a span (ProgrammaticLaunchScope): a caller
// that measured it slower for some shapes.
inline bool& programmatic_launch_this_thread() {
  thread_local bool on = true;
  return on;
}
inline bool programmatic_launch() {
  return programmatic_launch_flag().load() && programmatic_launch_this_thread();
}
// While alive, this thread's launch_kernel calls use programmatic dependent launch only if `on`
// (and the process-wide switch) says so; the previous setting comes back at its end.
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on) : saved_(programmatic_launch_this_thread()) {
    programmatic_launch_this_thread() = saved_ && on;
  }
  ~ProgrammaticLaunchScope() { programmatic_launch_this_thread() = saved_; }
  ProgrammaticLaunchScope(ProgrammaticLaunchScope const&) = delete;
  ProgrammaticLaunchScope& operator=(ProgrammaticLaunchScope const&) = delete;

 private:
  bool saved_;
};

// Waits for the kernels before this one on the stream (a no-op without the launch attribute or
// below sm_90), then lets the next kernel's blocks begin launching.
__device__ __forceinline__ void await_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with the first `count` of `attributes`; the
// launch's status names `name`.
template <class... Params, class... Args>
Status launch_with_attributes(char const* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t smem, cudaStream_t stream, cudaLaunchAttribute* attributes,
                              unsigned count, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return cuda_status(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

inline cudaLaunchAttribute programmatic_launch_attribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic dependent launch when it is
// on; the launch's status names `name`.
template <class... Params, class... Args>
Status launch_kernel(char const* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                     size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute = programmatic_launch_attribute();
  return launch_with_attributes(name, kernel, grid, block, smem, stream, &attribute,
                                programmatic_launch() ? 1u : 0u, std::forward<Args>(args)...);
}

// Whether a cluster launch may use programmatic dependent launch: kAwaits for a kernel that keeps
// launch_kernel's contract (await_prior_kernels() at its top), kInOrder for one that reads
// earlier kernels' output without waiting.
enum class ClusterLaunch { kInOrder, kAwaits };

// kernel<<<grid, block, smem, stream>>>(args...) with blocks in thread-block clusters of
// `cluster` along x (sm_90+; grid.x a multiple of it; 1: no cluster attribute, any device), and
// with programmatic dependent launch when it is on and `order` is kAwaits. Clusters beyond the
// portable 8 need the kernel's NonPortableClusterSizeAllowed attribute, which the caller sets.
// The launch's status names `name`.
template <class... Params, class... Args>
Status launch_cluster_kernel(char const* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem, cudaStream_t stream, int cluster, ClusterLaunch order,
                             Args&&... args) {
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count] = cudaLaunchAttribute{};
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(cluster);
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (order == ClusterLaunch::kAwaits && programmatic_launch()) {
    attributes[count++] = programmatic_launch_attribute();
  }
  return launch_with_attributes(name, kernel, grid, block, smem, stream, attributes, count,
                                std::forward<Args>(args)...);
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

  // upload and fill_bytes return when the device holds the bytes: cudaMemcpy from pageable memory
  // and cudaMemset may return before, and work on a non-blocking stream would not wait for them.
  Status upload(std::vector<T> const& host) {
    if (host.size() != count_) return Status::InvalidArgument("DeviceBuffer::upload: size mismatch");
    SPECDEC_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
                    "cudaMemcpy H2D"));
    return cuda_status(cudaDeviceSynchronize(), "DeviceBuffer::upload: cudaDeviceSynchronize");
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Fills every byte with `byte` (tests poison outputs with 0xff before a run).
  Status fill_bytes(int byte) {
    SPECDEC_RETURN_IF_ERROR(cuda_status(cudaMemset(ptr_, byte, count_ * sizeof(T)), "cudaMemset"));
    return cuda_status(cudaDeviceSynchronize(), "DeviceBuffer::fill_bytes: cudaDeviceSynchronize");
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace specdec

// Returns a kCudaError Status from the enclosing function when a CUDA call fails.
#define SPECDEC_CUDA_TRY(expr) SPECDEC_RETURN_IF_ERROR(::specdec::cuda_status((expr), #expr))

namespace specdec {

// An attribute of the current device, read from the driver once per device and attribute kind
// and then from a process-wide table (launchers ask on every launch; the values cannot change
// while the process runs). Racing first readers store the same value.
inline Status current_device_attribute(cudaDeviceAttr attr, int& value) {
  constexpr int kDevices = 64, kKinds = 2;
  int const kind = attr == cudaDevAttrMultiProcessorCount          ? 0
                   : attr == cudaDevAttrComputeCapabilityMajor ? 1
                                                                   : -1;
  int device = 0;
  SPECDEC_CUDA_TRY(cudaGetDevice(&device));
  static std::atomic<int> table[kDevices][kKinds] = {};  // 0: not read yet (both are >= 1)
  bool const cached = kind >= 0 && device >= 0 && device < kDevices;
  if (cached && (value = table[device][kind].load(std::memory_order_relaxed)) > 0) {
    return Status::Ok();
  }
  SPECDEC_CUDA_TRY(cudaDeviceGetAttribute(&value, attr, device));
  if (cached) table[device][kind].store(value, std::memory_order_relaxed);
  return Status::Ok();
}

// Whether the current device launches thread-block clusters (compute capability 9.0 and later).
inline Status current_device_has_clusters(bool& has_clusters) {
  int major = 0;
  SPECDEC_RETURN_IF_ERROR(current_device_attribute(cudaDevAttrComputeCapabilityMajor, major));
  has_clusters = major >= 9;
  return Status::Ok();
}

}  // namespace specdec
