// The memory floor every op is compared against: device-to-device copy bandwidth on a buffer far
// larger than L2, counting bytes read plus bytes written.
#include "specdec/core/cuda.cuh"
#include "support/bench.cuh"

#include <vector>

namespace {

void BM_copy_floor(benchmark::State& state) {
  size_t const bytes = static_cast<size_t>(state.range(0)) << 20;
  specdec::DeviceBuffer<unsigned char> src(bytes), dst(bytes);
  specdec::bench::check_cuda(cudaMemset(src.data(), 0x5a, bytes), "cudaMemset");
  specdec::bench::time_launches(state, 2.0 * bytes, [&](int, cudaStream_t stream) {
    cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream);
  });
}
SPECDEC_CUDA_BENCHMARK(BM_copy_floor)->Arg(1024)->Arg(64);

}  // namespace
